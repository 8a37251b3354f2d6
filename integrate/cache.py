"""A result cache keyed by the content of every file an analysis read (and by integrate's own sources).

An entry stores the JSON result and what it was read from: the SHA-256 of each file (`deps`), the paths looked
for and not found (`absent`: a module an import names, an `__init__.py`), the folders installed packages were
found in (`packages`, None where not installed) and the folders listed (`listings`). A lookup checks each again
and uses the entry only if all of them are as they were: an edited file, a module created since, a package
installed since or a file added to a listed folder is a miss. Entries are written to a temporary file and
renamed into place, so two runs sharing the cache never see a half-written entry.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path

from integrate import __version__


def cache_dir() -> Path | None:
    value = os.environ.get("INTEGRATE_CACHE_DIR")
    if value == "":
        return None  # INTEGRATE_CACHE_DIR= (empty) turns the cache off
    if value:
        return Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "integrate"


def digest(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


_TOOL_PACKAGES = ("integrate", "integrate.gate", "integrate.analyzers", "integrate.decisions", "integrate.templates",
                  "integrate.verify")


@functools.lru_cache(maxsize=1)
def tool_digest() -> str:
    """SHA-256 of integrate's own sources (every .py and .j2 of its packages, found without importing them): part
    of every key, so a result computed by other code (a checkout between two commits, a version not yet bumped)
    is never served as this code's."""
    h = hashlib.sha256(__version__.encode())
    for name in _TOOL_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            root = Path(location)
            for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".j2") and "__pycache__" not in
                               p.parts):
                h.update(f"{name}/{path.relative_to(root).as_posix()}\0".encode())
                try:
                    h.update(path.read_bytes())
                except OSError:
                    h.update(b"unreadable")
    return h.hexdigest()


def key_for(kind: str, request: dict) -> str:
    blob = json.dumps({"kind": kind, "tool": __version__, "code": tool_digest(), "request": request}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def load(key: str) -> dict | None:
    root = cache_dir()
    if root is None:
        return None
    try:
        entry = json.loads((root / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    deps = entry.get("deps", {})
    if not deps or any(digest(p) != h for p, h in deps.items()) or not _still(entry):
        return None
    return entry.get("result")


def _still(entry: dict) -> bool:
    """Whether what an entry found absent, installed where, and listed is as it was."""
    from integrate.inputs import installed_root

    if any(os.path.isfile(p) for p in entry.get("absent", ())):
        return False
    for top, where in entry.get("packages", {}).items():
        now = installed_root(top)
        if (str(now) if now is not None else None) != where:
            return False
    for folder, pattern, names in entry.get("listings", ()):
        if sorted(p.name for p in Path(folder).glob(pattern) if p.is_file()) != names:
            return False
    return True


def store(key: str, result: dict, files: list[str] | dict[str, str], *, absent: list[str] = (),
          packages: dict[str, str | None] | None = None, listings: list = ()) -> None:
    """Keep `result` under `key`, valid while each of `files` has the bytes it has now (a list: hashed now; a
    mapping: {path: SHA-256 of the bytes the result was made from}, so a file edited while it was made is a
    miss), each `absent` path is still not a file, each of `packages` is installed where it was (or still not
    at all: None) and each listing ([folder, pattern, [names]]) finds the same files."""
    root = cache_dir()
    if root is None:
        return
    deps = dict(files) if isinstance(files, dict) else {p: digest(p) for p in files}
    if any(h is None for h in deps.values()):
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump({"deps": deps, "absent": list(absent), "packages": packages or {},
                       "listings": [list(x) for x in listings], "result": result}, fh)
        os.replace(tmp, root / f"{key}.json")
    except OSError:
        pass  # a cache that cannot be written is only a slower run
