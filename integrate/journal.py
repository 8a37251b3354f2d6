"""The journal that keeps a cache-dit tree whole while `generate --mode checkout` writes into it.

A checkout writes each new file to a temporary sibling, then writes the journal (every file's old bytes and which
temporary file replaces it), then renames the temporary files into place and removes the journal. A run killed
anywhere leaves either no change or the journal, which `recover` rolls back. Every command that reads a cache-dit
tree settles its journal first (`settle`): the tree is untouched or complete as soon as a command next touches it.

A journal is data someone may have planted in the tree. Every entry is checked before any is acted on: its file a
module of the package that stays inside it with every symlink resolved, its temporary file the sibling name
integrate gives one, its backup base64, its mode permission bits. Anything else refuses the whole journal.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import uuid
from pathlib import Path, PurePosixPath

from integrate.errors import InputError
from integrate.files import fault, inside

JOURNAL = ".integrate-journal.json"
TEMP_MARK = ".integrate-"  # a temporary sibling: `.<name>.integrate-<12 hex>.tmp`


def relpath(value: object) -> str:
    """A module path relative to the cache_dit package (`caching/x.py`), in posix form; refused otherwise."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"artifact path {value!r} must be a non-empty path relative to the cache_dit package")
    path = PurePosixPath(value)
    if path.is_absolute() or any(part in ("..", "") for part in path.parts) or "\\" in value:
        raise InputError(f"artifact path {value!r} must stay inside the cache_dit package")
    if path.suffix != ".py":
        raise InputError(f"artifact path {value!r} must name a .py module")
    return path.as_posix()


def write_temp(path: Path, data: bytes, mode: int | None) -> Path:
    """`data` in a new temporary sibling of `path` (mode `mode`, or the umask's default for new files)."""
    tmp = path.with_name(f".{path.name}{TEMP_MARK}{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def restore_file(path: Path, data: bytes, mode: int | None) -> None:
    tmp = write_temp(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write(package: Path, entries: list[dict]) -> None:
    """The journal (`entries`: {path, tmp, backup (bytes or None), mode}), written whole and synced."""
    data = [{**e, "backup": None if e["backup"] is None else base64.b64encode(e["backup"]).decode("ascii")}
            for e in entries]
    fault("journal")
    tmp = write_temp(package / JOURNAL, json.dumps({"entries": data}).encode("utf-8"), None)
    fault("journal-rename")
    os.replace(tmp, package / JOURNAL)
    sync_dir(package)


def sync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def pending(package: Path) -> bool:
    return (package / JOURNAL).exists() or (package / JOURNAL).is_symlink()


def recover(package: Path) -> list[str]:
    """Roll back a checkout a killed run left half-applied (its journal), and remove temporary files any run left
    behind. Returns the files restored. Safe to run again if it is itself interrupted."""
    restored = []
    journal = package / JOURNAL
    if journal.is_symlink() or (journal.exists() and not journal.is_file()):
        raise InputError(f"{journal} is not a plain file (integrate never writes one so): nothing was restored; "
                         "remove it by hand")
    if journal.is_file():
        try:
            entries = _entries(package, json.loads(journal.read_text()))
        except (OSError, ValueError, RecursionError, InputError) as exc:
            raise InputError(f"{journal} is not a journal integrate wrote ({str(exc)[:160]}): nothing was restored; "
                             "restore the tree from version control and delete it") from None
        for path, tmp, backup, mode, rel in reversed(entries):
            if backup is None:
                path.unlink(missing_ok=True)
            else:
                restore_file(path, backup, mode)
            tmp.unlink(missing_ok=True)
            restored.append(rel)
        journal.unlink()
        sync_dir(package)
    for leftover in package.rglob(f".*{TEMP_MARK}*.tmp"):  # (rglob does not enter symlinked folders)
        leftover.unlink(missing_ok=True)
    return restored


def _entries(package: Path, data) -> list[tuple[Path, Path, bytes | None, int | None, str]]:
    """(file, its temporary sibling, the bytes to restore or None, its mode, its path as written) of each entry,
    every one checked before any is acted on."""
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise InputError("no list of entries")
    out = []
    for entry in data["entries"]:
        if not isinstance(entry, dict):
            raise InputError("an entry that is not an object")
        rel = relpath(entry.get("path"))
        path = inside(package, rel)
        if (package / rel).is_symlink() or (path.exists() and not path.is_file()):
            raise InputError(f"{rel} is not a plain file")
        tmp = entry.get("tmp")
        stem, _, tail = tmp.partition(TEMP_MARK) if isinstance(tmp, str) else ("", "", "")
        token = tail.removesuffix(".tmp")
        if stem != f".{path.name}" or not tail.endswith(".tmp") or len(token) != 12 \
                or not all(c in "0123456789abcdef" for c in token):
            raise InputError(f"temporary file {str(tmp)[:80]!r} is not the one integrate gives {rel}")
        backup, mode = entry.get("backup"), entry.get("mode")
        if backup is not None and not isinstance(backup, str):
            raise InputError(f"the backup of {rel} is not text")
        if mode is not None and (not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777):
            raise InputError(f"the mode of {rel} is not permission bits")
        try:
            old = base64.b64decode(backup, validate=True) if backup is not None else None
        except ValueError:
            raise InputError(f"the backup of {rel} is not base64") from None
        out.append((path, path.parent / tmp, old, mode, rel))
    return out


def installed_package() -> Path | None:
    """The folder of the cache_dit package Python would import (found, not imported), or None."""
    try:
        spec = importlib.util.find_spec("cache_dit")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]).resolve() if locations else None


def settle(package: Path | None) -> list[str]:
    """Before a command reads a cache-dit tree: roll back a checkout a killed run left in it (the files restored)."""
    if package is None or not pending(package):
        return []
    return recover(package)
