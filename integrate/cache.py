"""A result cache keyed by the content of every file an analysis read (and by integrate's own sources).

An entry stores the JSON result and the SHA-256 of each file it depends on; a lookup
re-hashes those files and uses the entry only if all of them are unchanged. Entries are
written to a temporary file and renamed into place, so two runs sharing the cache never see
a half-written entry.
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


def _digest(path: str) -> str | None:
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
    if not deps or any(_digest(p) != h for p, h in deps.items()):
        return None
    return entry.get("result")


def store(key: str, result: dict, files: list[str]) -> None:
    root = cache_dir()
    if root is None:
        return
    deps = {p: _digest(p) for p in files}
    if any(h is None for h in deps.values()):
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump({"deps": deps, "result": result}, fh)
        os.replace(tmp, root / f"{key}.json")
    except OSError:
        pass  # a cache that cannot be written is only a slower run
