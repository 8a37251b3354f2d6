"""The files a plan is made from: what an approval binds and what the analysis cache is keyed on.

Every later command reads some of them again: `generate` parses the model's sources (the transformer's and the
pipeline's files, and every file their names were traced through), `verify` derives its fixture from the
transformer's config and builds the pipeline from `model_index.json` and its components' configs. A plan records
each of these files with its SHA-256 as the plan was made (`Plan.reads`); the approval binds them all, so an edit
to any of them afterwards voids it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from integrate.errors import InputError

# the metadata a model folder holds: the pipeline's index, then each component's config (`scheduler_config.json`,
# `preprocessor_config.json` and the like beside `config.json`)
_INDEX = "model_index.json"
_CONFIGS = ("config.json", "*_config.json")


def metadata_files(model_path: str | None, config_file: str | None = None) -> list[Path]:
    """The model folder's metadata files that exist (model_index.json, config.json at the top and in each component
    folder), and the config named with --config; sorted, each once."""
    found: list[Path] = []
    if model_path:
        root = Path(model_path)
        found += [p for p in (root / _INDEX, root / "config.json") if p.is_file()]
        for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ():
            for pattern in _CONFIGS:
                found += sorted(p for p in folder.glob(pattern) if p.is_file())
    if config_file:
        found.append(Path(config_file))
    return list(dict.fromkeys(p.resolve() for p in found))


MAX_OWN_SOURCES = 5000  # a research repository's own Python files; past this the model's folder is not a repository


def own_sources(paths) -> list[Path]:
    """Every Python file of the packages (or, outside a package, the folders) that hold `paths`, for files outside
    installed packages: the model's own code, which `verify` runs (with --trust-code) through imports the analysis
    never followed. Installed packages (diffusers) are bound by the files the analysis read."""
    from integrate.workers import installed

    roots = []
    for path in filter(None, paths):
        path = Path(path).resolve()
        if not path.is_file() or installed(path):
            continue
        root = path.parent
        while (root / "__init__.py").is_file() and (root.parent / "__init__.py").is_file():
            root = root.parent
        roots.append(root)
    found: list[Path] = []
    for root in dict.fromkeys(roots):
        for file in sorted(root.rglob("*.py")):
            if any(part.startswith(".") or part == "__pycache__" for part in file.relative_to(root).parts):
                continue
            found.append(file.resolve())
            if len(found) > MAX_OWN_SOURCES:
                raise InputError(f"{root} holds more than {MAX_OWN_SOURCES} Python files: point --transformer-file "
                                 "and --pipeline-file at the model's own package")
    return list(dict.fromkeys(found))


def sha256_of(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None


def hashed(paths) -> dict[str, str]:
    """{path: SHA-256} of each file, read now."""
    return {str(p): sha256_of(Path(p)) for p in paths}


def changed(expected: dict[str, str]) -> str | None:
    """The first file of `expected` whose bytes are no longer the ones recorded (or that is gone), or None."""
    for path, sha in expected.items():
        p = Path(path)
        if not p.is_file():
            return path
        if sha256_of(p) != sha:
            return path
    return None
