"""Writing a set of files into a folder: all of them or none."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


def write_tree(root: Path, files: dict[str, str]) -> list[str]:
    """Write every file or none: stage them beside the target, then move them into place. Returns the
    written paths, resolved."""
    root.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".integrate-", dir=root))
    try:
        for rel, text in files.items():
            path = stage / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        for rel in files:
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            (stage / rel).replace(target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return [str((root / rel).resolve()) for rel in files]
