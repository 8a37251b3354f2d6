"""The files a plan is made from: what an approval binds and what the analysis cache is keyed on.

Every later command reads some of them again: `generate` parses the model's sources (the transformer's and the
pipeline's files, and every file their names were traced through), `verify` derives its fixture from the
transformer's config and builds the pipeline from `model_index.json` and its components' configs. A plan records
each of these files with its SHA-256 as the plan was made (`Plan.reads`); the approval binds them all, so an edit
to any of them afterwards voids it.
"""

from __future__ import annotations

import hashlib
import os
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


def own_sources(paths, source_roots=()) -> list[Path]:
    """Every Python file of the packages that hold `paths` (for a file in no package: the Python files beside it;
    for a file under one of `source_roots`, the `--source-root` folders: its whole top-level package there), for
    files outside installed packages: the model's own code, which `verify` runs (with --trust-code) through
    imports the analysis never followed. Installed packages (diffusers) are bound by the files the analysis read.
    Hidden folders, `__pycache__` and virtual environments are not entered."""
    from integrate.workers import installed

    roots = sorted((Path(r).resolve() for r in source_roots), key=lambda r: len(r.parts), reverse=True)
    found: list[Path] = []
    for path in filter(None, paths):
        path = Path(path).resolve()
        if not path.is_file() or installed(path):
            continue
        under = next((r for r in roots if path.is_relative_to(r) and path.parent != r), None)
        if under is not None:  # the top-level package (a namespace package too) under its source root
            root = under / path.relative_to(under).parts[0]
        elif not (path.parent / "__init__.py").is_file():  # a loose file: its siblings are what it can import
            found += sorted(p.resolve() for p in path.parent.glob("*.py") if p.is_file())
            continue
        else:
            root = path.parent
            while (root.parent / "__init__.py").is_file():
                root = root.parent
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _NOT_SOURCES
                             and not (Path(folder) / d / "pyvenv.cfg").exists())
            found += [(Path(folder) / f).resolve() for f in sorted(files) if f.endswith(".py")]
            if len(found) > MAX_OWN_SOURCES:
                raise InputError(f"{root} holds more than {MAX_OWN_SOURCES} Python files: point --transformer-file "
                                 "and --pipeline-file at the model's own package")
    return list(dict.fromkeys(found))


_NOT_SOURCES = {"__pycache__", "node_modules", "site-packages"}


def installed_root(top: str) -> Path | None:
    """The folder that holds the installed top-level package or module `top` (found with `find_spec`, which for a
    top-level name reads the import path and imports nothing), or None where it is not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is not None and spec.submodule_search_locations:
        locations = list(spec.submodule_search_locations)
        return Path(locations[0]).parent if locations else None
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        return Path(spec.origin).parent
    return None


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
