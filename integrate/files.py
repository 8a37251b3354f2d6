"""Writing a set of files into a folder: all of them or none, and none outside it."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from integrate.errors import InputError

STAGE_PREFIX = ".integrate-"  # folders write_tree stages in (and moves a replaced folder to), inside `root`


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


def fault(step: str) -> None:
    """A test seam: with INTEGRATE_CHECKOUT_FAULT=<n>, the n-th write or rename step (of a checkout's journal, or of
    a folder written whole) ends the process as a kill -9 would; the tests run it at every step."""
    at = os.environ.get("INTEGRATE_CHECKOUT_FAULT")
    if at is None:
        return
    _FAULTS[0] += 1
    if _FAULTS[0] == int(at):
        os._exit(137)


_FAULTS = [0]


def write_tree(root: Path, files: dict[str, str], whole: str | None = None) -> list[str]:
    """Write every file or none: check every path stays under `root`, stage the files beside the target,
    then move them into place. Returns the written paths, resolved.

    `whole` names a folder of `root` written as one (a plugin package): it is staged complete, with what the folder
    holds now and `files` do not replace, and swapped in by renames, so a run killed at any point leaves the folder
    as it was, absent, or complete, never part old and part new. The stage folders a killed run left are removed by
    the next run."""
    root.mkdir(parents=True, exist_ok=True)
    _clear_stages(root)
    targets = {rel: inside(root, rel) for rel in files}
    folder = inside(root, whole) if whole else None
    stage = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=root))
    try:
        if folder is not None and folder.is_dir():  # what the folder holds now, as the base of the new one
            shutil.copytree(folder, stage / whole, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        for rel, text in files.items():
            path = stage / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            fault("stage")
            path.write_text(text)
        if folder is not None:
            old = stage / f"{STAGE_PREFIX}old"
            if folder.exists():
                fault("move-old")
                folder.replace(old)
            fault("move-new")
            (stage / whole).replace(folder)
        for rel, target in targets.items():
            if folder is not None and target.is_relative_to(folder):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            fault("replace")
            (stage / rel).replace(target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return [str(target) for target in targets.values()]


def _clear_stages(root: Path) -> None:
    """Remove the stage folders of earlier runs killed before they could (ours by name, never a symlink)."""
    for leftover in root.glob(f"{STAGE_PREFIX}*"):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
