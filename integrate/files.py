"""Writing a set of files into a folder: all of them or none, and none outside it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path, PurePosixPath

from integrate.errors import InputError


def inside(root: Path, rel: str) -> Path:
    """`root / rel`, refused unless it stays inside `root` once every symlink on the way is resolved."""
    pure = PurePosixPath(rel)
    if not rel or pure.is_absolute() or any(part in ("..", "") for part in pure.parts) or "\\" in rel \
            or any(not ch.isprintable() for ch in rel):
        raise InputError(f"refusing to write {rel[:80]!r}: not a plain path inside {root}")
    target = (root / rel).resolve()
    if not target.is_relative_to(root.resolve()):
        raise InputError(f"refusing to write {rel[:80]!r}: it resolves outside {root}")
    return target


def write_tree(root: Path, files: dict[str, str]) -> list[str]:
    """Write every file or none: check every path stays under `root`, stage the files beside the target,
    then move them into place. Returns the written paths, resolved."""
    root.mkdir(parents=True, exist_ok=True)
    targets = {rel: inside(root, rel) for rel in files}
    stage = Path(tempfile.mkdtemp(prefix=".integrate-", dir=root))
    try:
        for rel, text in files.items():
            path = stage / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        for rel, target in targets.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            (stage / rel).replace(target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return [str(target) for target in targets.values()]
