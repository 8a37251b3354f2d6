"""`integrate survey`: one row per transformer class in the installed diffusers (and extra trees).

Every row comes from the same analysis `analyze` and `plan` run, never from a table of models:

- transformer classes: every top-level class in `diffusers/models/transformers/*.py` (and in each
  `.py` under a `--path` tree) whose bases lead to `ModelMixin`, read with libcst;
- pipelines: classes in `diffusers/pipelines/**/pipeline_*.py` (and `pipeline_*.py` under the
  `--path` trees) whose `__init__` names the transformer class (its annotations or code). This
  index is read with Python's `ast` (a syntax tree only, nothing imported): hundreds of
  pipeline files would otherwise be parsed by libcst just to be listed. The pipeline the row
  analyses (the shortest class name that defines `__call__`) is read with libcst like any other;
- analysis: `integrate.api.plan` without the meta-device probe, gated by flags (`--pipeline-class/
  --transformer-class/--pipeline-file/--transformer-file` with an empty model directory). A
  transformer no pipeline uses is analysed without one (no CFG style);
- `already_supported`: the installed cache-dit's registry, exactly as `analyze` labels it.

Files are surveyed in a process pool (`rows.py`); each worker keeps one Workspace, so a file that
several rows read (attention.py, cache-dit's registry) is parsed once per worker. Each file's rows are
stored in the content-keyed result cache (integrate/cache.py) with every file they read. `verify.py`
adds each row's CPU proof (`--verify`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from integrate import __version__, cache
from integrate.errors import InputError
from integrate.records import from_json, to_json
from integrate.resolve import Workspace

from .records import SUPPORT_LABEL, SURVEY_SCHEMA, SURVEY_SCHEMA_VERSION, Package, Skipped, SurveyReport, SurveyRow
from .rows import Task, init_worker, one_line, survey_file

_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}
_CACHE_FORMAT = 4  # bump when a cached per-file result changes shape


# -- what to survey -----------------------------------------------------------------------------


def diffusers_root() -> Path:
    """The installed diffusers package folder (found with find_spec, not imported)."""
    root = Workspace().package_root("diffusers")
    pkg = (root / "diffusers").resolve() if root is not None else None
    if pkg is None or not (pkg / "models" / "transformers").is_dir():
        raise InputError("the installed diffusers was not found (needs diffusers/models/transformers)")
    return pkg


def _py_files(base: Path, pattern: str) -> list[Path]:
    if base.is_file():
        return [base] if base.suffix == ".py" and base.match(pattern) else []
    out = []
    for path in sorted(base.rglob(pattern)):
        rel = path.relative_to(base).parts[:-1]
        if any(p.startswith(".") or p in _SKIP_DIRS for p in rel) or not path.is_file():
            continue
        out.append(path)
    return out


def collect(paths: list[str]) -> tuple[list[Task], list[str]]:
    """(files to survey, pipeline files to index); bad --path values are input errors."""
    extra = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise InputError(f"--path {p}: no such file or directory")
        if not (path.is_dir() or (path.is_file() and path.suffix == ".py")):
            raise InputError(f"--path {p}: expected a directory or a .py file")
        extra.append(path.resolve())
    pkg = diffusers_root()
    tasks = [Task(str(f), "diffusers") for f in sorted((pkg / "models" / "transformers").glob("*.py"))
             if f.name != "__init__.py"]
    pipelines = [str(f) for f in _py_files(pkg / "pipelines", "pipeline_*.py")]
    seen = {t.path for t in tasks}
    for base in extra:
        for f in _py_files(base, "*.py"):
            if str(f) not in seen:
                seen.add(str(f))
                tasks.append(Task(str(f), str(base)))
        pipelines += [str(f) for f in _py_files(base, "pipeline_*.py") if str(f) not in pipelines]
    return tasks, pipelines


def _pipelines_digest(pipelines: list[str]) -> str:
    """One hash over every pipeline file: a row's pipeline list depends on all of them."""
    h = hashlib.sha256()
    for p in pipelines:
        h.update(p.encode() + b"\0")
        try:
            h.update(hashlib.sha256(Path(p).read_bytes()).digest())
        except OSError:
            h.update(b"unreadable")
    return h.hexdigest()


# -- the survey -------------------------------------------------------------------------------------


def run_survey(paths: list[str], jobs: int | None = None, use_cache: bool = True,
               verify_only: tuple[str, ...] | None = None, progress=None,
               classes: tuple[str, ...] | None = None) -> SurveyReport:
    """Survey the installed diffusers plus `paths`. `verify_only` (class names; empty: every row) adds each
    row's CPU proof. `classes` (class names) surveys only the files that define one of them at top level."""
    tasks, pipelines = collect(paths)
    if classes:
        tasks = _defining(tasks, set(classes), use_cache)
    jobs = max(1, jobs or os.cpu_count() or 1)
    digest = _pipelines_digest(pipelines)
    results: dict[int, dict] = {}
    keys = {}
    done = 0
    total = len(tasks)

    def report(i: int, result: dict, cached: bool) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            names = [r["transformer_class"] or "error" for r in result["rows"]]
            label = ", ".join(names) if names else f"{_where(tasks[i])}: no ModelMixin class"
            progress(f"[{done}/{total}] {label}" + (" (cached)" if cached else ""))

    for i, task in enumerate(tasks):
        keys[i] = cache.key_for("survey", {"file": task.path, "origin": task.origin, "pipelines": digest,
                                           "format": _CACHE_FORMAT})
        hit = cache.load(keys[i]) if use_cache else None
        if hit is not None:
            results[i] = hit
            report(i, hit, True)
    todo = [i for i in range(len(tasks)) if i not in results]
    # Largest files first: they take longest, and the pool stays busy to the end.
    todo.sort(key=lambda i: -_size(tasks[i].path))
    with tempfile.TemporaryDirectory(prefix="integrate-survey-") as model_dir:
        if todo and (jobs == 1 or len(todo) == 1):
            init_worker(pipelines, model_dir)
            for i in todo:
                results[i] = survey_file(tasks[i])
                _store(use_cache, keys[i], results[i])
                report(i, results[i], False)
        elif todo:
            with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), initializer=init_worker,
                                     initargs=(pipelines, model_dir)) as pool:
                futures = {pool.submit(survey_file, tasks[i]): i for i in todo}
                for fut in as_completed(futures):
                    i = futures[fut]
                    try:
                        results[i] = fut.result()
                    except Exception as exc:  # noqa: BLE001 - a worker died (memory, a signal): its rows fail
                        row = SurveyRow(None, tasks[i].path, None, status="error",
                                        error=f"worker failed: {one_line(exc)}")
                        results[i] = {"rows": [to_json(row)], "skipped": [], "parsed": [], "indexed": [], "deps": []}
                    else:
                        _store(use_cache, keys[i], results[i])
                    report(i, results[i], False)
    rows = tuple(from_json(SurveyRow, r) for i in range(len(tasks)) for r in results[i]["rows"])
    skipped = tuple(from_json(Skipped, s) for i in range(len(tasks)) for s in results[i]["skipped"])
    parsed = sorted({f for i in range(len(tasks)) for f in results[i]["parsed"]})
    indexed = sorted({f for i in range(len(tasks)) for f in results[i]["indexed"]})
    out = SurveyReport(
        schema=SURVEY_SCHEMA, schema_version=SURVEY_SCHEMA_VERSION, tool_version=__version__,
        diffusers=Package(_version("diffusers"), path=str(diffusers_root())),
        cache_dit=Package(_version("cache-dit"), label=SUPPORT_LABEL),
        paths=tuple(str(Path(p).resolve()) for p in paths), rows=rows, skipped=skipped, files_read=tuple(parsed),
        pipeline_files_indexed=tuple(indexed))
    if verify_only is not None:
        from .verify import verify_rows

        missing = sorted(set(verify_only) - {r.transformer_class for r in rows})
        if missing:
            raise InputError(f"--only names no surveyed transformer class: {', '.join(missing)}")
        out = verify_rows(out, verify_only, progress or (lambda line: None))
    return out


def class_names(use_cache: bool = True) -> frozenset[str]:
    """Every class the surveyed files of the installed diffusers define at top level (a parse, cached by content)."""
    tasks, _ = collect([])
    names: set[str] = set()
    _defining(tasks, set(), use_cache, names)
    return frozenset(names)


def model_class_names(use_cache: bool = True) -> frozenset[str]:
    """The model classes (ModelMixin subclasses, as the survey tells them) the surveyed files of the installed
    diffusers define at top level (a parse, cached by content)."""
    from .index import is_model

    ws = Workspace()
    names: set[str] = set()
    for task in collect([])[0]:
        key = cache.key_for("top-level model classes", {"file": task.path})
        hit = cache.load(key) if use_cache else None
        if hit is None:
            try:
                src = ws.load(Path(task.path))
            except (InputError, RecursionError, MemoryError):
                continue
            hit = {"classes": sorted(n for n, c in src.classes.items() if is_model(ws, src, c))}
            if use_cache:
                cache.store(key, hit, [task.path])
        names.update(hit["classes"])
    return frozenset(names)


def _defining(tasks: list[Task], classes: set[str], use_cache: bool = True, seen: set[str] | None = None) -> list[Task]:
    """The tasks whose file defines one of `classes` at top level (a parse, none of the analysis; the names
    each file defines are kept in the result cache by its content, so a second `--only` parses nothing). `seen`
    collects every name found."""
    ws = Workspace()
    keep = []
    for task in tasks:
        key = cache.key_for("top-level classes", {"file": task.path})
        hit = cache.load(key) if use_cache else None
        if hit is not None:
            names = hit["classes"]
        else:
            try:
                names = sorted(ws.load(Path(task.path)).classes)
            except (InputError, RecursionError, MemoryError):
                continue
            if use_cache:
                cache.store(key, {"classes": names}, [task.path])
        if seen is not None:
            seen.update(names)
        if classes & set(names):
            keep.append(task)
    return keep


def _where(task: Task) -> str:
    path = Path(task.path)
    if task.origin != "diffusers" and Path(task.origin).is_dir():
        return str(path.relative_to(task.origin))
    return path.name


def _store(use_cache: bool, key: str, result: dict) -> None:
    if use_cache and result["deps"]:
        cache.store(key, result, result["deps"], absent=result.get("absent", ()), packages=result.get("packages"),
                    listings=result.get("listings", ()))


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None
