"""`integrate survey`: one row per transformer class in the installed diffusers (and extra trees).

Every row comes from the same analysis `analyze` and `plan` run, never from a table of models:

- transformer classes: every top-level class in `diffusers/models/transformers/*.py` (and in each
  `.py` under a `--path` tree) whose bases lead to `ModelMixin`, read with libcst;
- pipelines: classes in `diffusers/pipelines/**/pipeline_*.py` (and `pipeline_*.py` under the
  `--path` trees) whose `__init__` names the transformer class (its annotations or code). This
  index is read with Python's `ast` (a syntax tree only, nothing imported): hundreds of
  pipeline files would otherwise be parsed by libcst just to be listed. The pipeline the row
  analyses (the shortest class name that defines `__call__`) is read with libcst like any other;
- analysis: the gate's flags path (`--pipeline-class/--transformer-class/--pipeline-file/
  --transformer-file` with an empty model directory), `analyze`, `parallel_facts` and
  `make_plan` without the meta-device probe. A transformer no pipeline uses is analysed
  without one (no CFG style);
- `already_supported`: the installed cache-dit's registry, exactly as `analyze` labels it.

Files are surveyed in a process pool; each worker keeps one Workspace, so a file that several
rows read (attention.py, cache-dit's registry) is parsed once per worker. Each file's rows are
stored in the content-keyed result cache (integrate/cache.py) with every file they read.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from integrate import __version__, cache
from integrate.errors import InputError
from integrate.resolve import External, Resolved, Unresolved, Workspace
from integrate.source import base_names

SCHEMA = "integrate.survey"
SCHEMA_VERSION = "1.1"
SUPPORT_LABEL = "cache-dit: registered in the installed cache-dit's adapter registry (read statically; a label, " \
                "not analysis)"
_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}
_CACHE_FORMAT = 2  # bump when a cached per-file result changes shape


# -- what to survey -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One source file whose ModelMixin classes become rows."""

    path: str
    origin: str  # "diffusers" or the --path it was found under


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


# -- worker state ---------------------------------------------------------------------------------


class _TrackingWorkspace(Workspace):
    """A Workspace shared by every row a worker surveys, noting the files each task reads."""

    def __init__(self) -> None:
        super().__init__()
        self.touched: dict[str, None] = {}

    def load(self, path: Path, package_root: Path | None = None):
        src = super().load(path, package_root)
        self.touched[str(src.path)] = None
        return src

    @property
    def files_read(self) -> list[str]:
        return list(self.touched)


class _State:
    def __init__(self, pipelines: list[str], model_dir: str) -> None:
        self.ws = _TrackingWorkspace()
        self.pipeline_files = pipelines
        self.model_dir = model_dir
        self._texts: dict[str, str] | None = None
        self._index: dict[str, dict[str, tuple[int, frozenset[str], bool]] | None] = {}

    def texts(self) -> dict[str, str]:
        if self._texts is None:
            self._texts = {}
            for p in self.pipeline_files:
                try:
                    self._texts[p] = Path(p).read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue
        return self._texts

    def classes_in(self, path: str) -> dict[str, tuple[int, frozenset[str], bool]] | None:
        """{class: (line, names its __init__ uses, defines __call__)} of one pipeline file (ast)."""
        if path not in self._index:
            try:
                tree = ast.parse(self.texts()[path], filename=path)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                self._index[path] = None
                return None
            found = {}
            for node in _top_level(tree.body):
                if not isinstance(node, ast.ClassDef):
                    continue
                methods = {m.name: m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
                init = methods.get("__init__")
                names = frozenset()
                if init is not None:
                    names = frozenset(n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(init)
                                      if isinstance(n, (ast.Name, ast.Attribute)))
                found[node.name] = (node.lineno, names, "__call__" in methods)
            self._index[path] = found
        return self._index[path]

    def pipelines_for(self, name: str) -> tuple[list[dict], list[str]]:
        """Pipeline classes whose __init__ names `name`, and the files looked into."""
        word = re.compile(rf"\b{re.escape(name)}\b")
        out, read = [], []
        for path, text in self.texts().items():
            if name not in text or not word.search(text):
                continue
            read.append(path)
            for cls, (line, names, has_call) in (self.classes_in(path) or {}).items():
                if name in names:
                    out.append({"class": cls, "file": path, "line": line, "defines_call": has_call})
        return out, read


def _top_level(body):
    """Top-level statements, including those inside `if`/`try` blocks (as the libcst index does)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                yield from _top_level(block)


_STATE: _State | None = None


def _init_worker(pipelines: list[str], model_dir: str) -> None:
    global _STATE
    _STATE = _State(pipelines, model_dir)


# -- one file -------------------------------------------------------------------------------------


def _is_model(ws: Workspace, src, cls: cst.ClassDef, depth: int = 0) -> bool:
    """Do the class's bases lead to ModelMixin (through imports, within the analysed packages)?"""
    if depth > 8:
        return False
    for base in base_names(cls):
        if base.rsplit(".", 1)[-1] == "ModelMixin":
            return True
    for base in base_names(cls):
        found = ws.resolve(src, base)
        if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
            if _is_model(ws, found.src, found.node, depth + 1):
                return True
        elif isinstance(found, External) and found.qualname.startswith("diffusers."):
            try:  # a third-party class built on a diffusers model, e.g. `class My(FluxTransformer2DModel)`
                where = ws.locate_class("diffusers", found.qualname.rsplit(".", 1)[-1])
            except InputError:
                continue
            if isinstance(where.node, cst.ClassDef) and _is_model(ws, where.src, where.node, depth + 1):
                return True
        elif isinstance(found, Unresolved):
            continue
    return False


def _choose(pipelines: list[dict]) -> dict | None:
    """The pipeline a row analyses: one that defines __call__, shortest name first (FluxPipeline)."""
    if not pipelines:
        return None
    return min(pipelines, key=lambda p: (not p["defines_call"], len(p["class"]), p["class"], p["file"]))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, InputError) else text or "input error"


def _blank_row(name: str | None, path: str, line: int | None) -> dict:
    return {
        "transformer_class": name, "file": path, "line": line, "status": "ok", "error": None,
        "pipelines": [], "analysed_pipeline": None,
        "already_supported": None,
        "block_lists": [], "not_blocks": [],
        "has_separate_cfg": None, "cfg_confidence": None,
        "needs_patch_functor": None, "patch_functor_reasons": [],
        "cp": None, "tp": None,
        "unknowns": [],
    }


def _plan(state: _State, src, name: str, pipeline: dict | None):
    """Gate (flags path), analysis, parallel facts and decisions for one class, as `plan --no-probe`."""
    from integrate.analyzers import analyze, analyze_transformer
    from integrate.analyzers.structure import parallel_facts
    from integrate.analyzers.support import support_note
    from integrate.decisions import make_plan
    from integrate.gate import GateFlags, run_gate
    from integrate.records import SCHEMA_VERSION as RECORD_SCHEMA
    from integrate.records import Analysis, Evidence, Fact, GateReport, PipelineFacts

    ws = state.ws
    t_file = str(src.path)
    if pipeline is not None:
        flags = GateFlags(model_path=state.model_dir, pipeline_class=pipeline["class"], transformer_class=name,
                          pipeline_file=pipeline["file"], transformer_file=t_file)
        report = run_gate(flags, ws)
        analysis = analyze(report, ws)
    else:
        # No pipeline uses the class: the gate's pipeline facts stay empty and the CFG style unknown.
        why = "survey: no pipeline under the surveyed trees names this transformer in its __init__"
        report = GateReport(
            inputs={"model_path": Fact(state.model_dir, "survey: empty model directory"),
                    "pipeline_class": Fact(None, why), "transformer_class": Fact(name, "survey"),
                    "pipeline_file": Fact(None, why), "transformer_file": Fact(t_file, "survey")},
            pipeline_entry="__call__", notes=(why,))
        analysis = Analysis(
            schema_version=RECORD_SCHEMA, tool_version=__version__, gate=report,
            transformer=analyze_transformer(ws, src, src.classes[name]),
            pipeline=PipelineFacts(None, "__call__", None, None, "unknown", None,
                                   (Evidence(t_file, 0, why),)),
            already_supported=support_note(ws, None, name), files_read=())
    facts = parallel_facts(report, ws, analysis)
    return analysis, make_plan(analysis, facts)


def _row(state: _State, src, name: str, cls: cst.ClassDef) -> tuple[dict, list[str]]:
    """The row for one class, and the pipeline files its pipeline search looked into."""
    row = _blank_row(name, str(src.path), src.line(cls))
    looked_into: list[str] = []
    try:
        pipelines, looked_into = state.pipelines_for(name)
        row["pipelines"] = [{k: p[k] for k in ("class", "file", "line")} for p in pipelines]
        chosen = _choose(pipelines)
        row["analysed_pipeline"] = chosen["class"] if chosen else None
        analysis, plan = _plan(state, src, name, chosen)
    except RecursionError:
        row.update(status="error", error="RecursionError: the source nests too deeply to analyse")
        return row, looked_into
    except Exception as exc:  # noqa: BLE001 - one row failing never stops the survey
        row.update(status="error", error=_one_line(exc))
        return row, looked_into
    c = plan["cache"]
    row["already_supported"] = analysis.already_supported
    row["block_lists"] = [{k: b[k] for k in ("attr", "block_class", "forward_pattern", "confidence",
                                             "check_forward_pattern")} for b in c["block_lists"]]
    row["not_blocks"] = [b["attr"] for b in c["not_blocks"]]
    if chosen is not None:
        row["has_separate_cfg"] = c["has_separate_cfg"]
        row["cfg_confidence"] = c["cfg_confidence"]
    row["needs_patch_functor"] = c["needs_patch_functor"]
    row["patch_functor_reasons"] = c["patch_functor_reasons"]
    cp, tp = plan["parallelism"]["cp"], plan["parallelism"]["tp"]
    row["cp"] = {"approach": cp["approach"], "shape": cp["shape"], "confidence": cp["confidence"]}
    row["tp"] = {"strategy": tp["strategy"], "confidence": tp["confidence"]}
    row["unknowns"] = plan["unknowns"]
    return row, looked_into


def survey_file(task: Task) -> dict:
    """Rows for every ModelMixin class a file defines, with the files they read (for the cache)."""
    state = _STATE
    assert state is not None, "call _init_worker first"
    ws = state.ws
    ws.touched.clear()
    rows: list[dict] = []
    skipped: list[dict] = []
    read: set[str] = set()
    try:
        src = ws.load(Path(task.path))
    except (InputError, RecursionError, MemoryError) as exc:
        try:
            text = Path(task.path).read_text(errors="replace")
        except OSError:
            text = ""
        if task.origin == "diffusers" or "ModelMixin" in text:
            row = _blank_row(None, task.path, None)
            row.update(status="error", error=_one_line(exc) if isinstance(exc, InputError) else
                       f"{type(exc).__name__}: could not read the file")
            rows.append(row)
        else:
            skipped.append({"file": task.path, "why": _one_line(exc)})
        return {"rows": rows, "skipped": skipped, "parsed": [], "indexed": [], "deps": [task.path]}
    for name, node in src.classes.items():
        try:
            is_model = _is_model(ws, src, node)
        except RecursionError:
            is_model = False
        if not is_model:
            continue
        row, looked_into = _row(state, src, name, node)
        rows.append(row)
        read.update(looked_into)
    rows.sort(key=lambda r: r["line"] or 0)
    parsed = sorted(ws.touched)
    deps = sorted(set(parsed) | read | {str(Path(task.path).resolve())})
    return {"rows": rows, "skipped": skipped, "parsed": parsed, "indexed": sorted(read), "deps": deps}


def _run_local(task: Task) -> dict:
    return survey_file(task)


# -- the survey -----------------------------------------------------------------------------------


def run_survey(paths: list[str], jobs: int | None = None, use_cache: bool = True, progress=None) -> dict:
    """Survey the installed diffusers plus `paths`; returns the `integrate.survey` JSON data."""
    tasks, pipelines = collect(paths)
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
            _init_worker(pipelines, model_dir)
            for i in todo:
                results[i] = _run_local(tasks[i])
                _store(use_cache, keys[i], results[i])
                report(i, results[i], False)
        elif todo:
            with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), initializer=_init_worker,
                                     initargs=(pipelines, model_dir)) as pool:
                futures = {pool.submit(survey_file, tasks[i]): i for i in todo}
                for fut in as_completed(futures):
                    i = futures[fut]
                    try:
                        results[i] = fut.result()
                    except Exception as exc:  # noqa: BLE001 - a worker died (memory, a signal): its rows fail
                        row = _blank_row(None, tasks[i].path, None)
                        row.update(status="error", error=f"worker failed: {_one_line(exc)}")
                        results[i] = {"rows": [row], "skipped": [], "parsed": [], "indexed": [], "deps": []}
                    else:
                        _store(use_cache, keys[i], results[i])
                    report(i, results[i], False)
    rows = [r for i in range(len(tasks)) for r in results[i]["rows"]]
    skipped = [s for i in range(len(tasks)) for s in results[i]["skipped"]]
    parsed = sorted({f for i in range(len(tasks)) for f in results[i]["parsed"]})
    indexed = sorted({f for i in range(len(tasks)) for f in results[i]["indexed"]})
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "diffusers": {"version": _version("diffusers"), "path": str(diffusers_root())},
        "cache_dit": {"version": _version("cache-dit"), "label": SUPPORT_LABEL},
        "paths": [str(Path(p).resolve()) for p in paths],
        "rows": rows,
        "skipped": skipped,
        "files_read": parsed,
        "pipeline_files_indexed": indexed,
    }


def _where(task: Task) -> str:
    path = Path(task.path)
    if task.origin != "diffusers" and Path(task.origin).is_dir():
        return str(path.relative_to(task.origin))
    return path.name


def _store(use_cache: bool, key: str, result: dict) -> None:
    if use_cache and result["deps"]:
        cache.store(key, result, result["deps"])


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


# -- text -----------------------------------------------------------------------------------------


def _short(path: str, data: dict) -> str:
    p = Path(path)
    for root in (Path(data["diffusers"]["path"]), Path.cwd()):
        try:
            return str(p.relative_to(root))
        except ValueError:
            continue
    return str(p)


def survey_text(data: dict) -> str:
    header = ["transformer", "file:line", "pipeline(s)", "cache-dit*", "block lists: pattern", "separate CFG",
              "PatchFunctor", "CP", "TP"]
    table = [header]
    for r in data["rows"]:
        where = f"{_short(r['file'], data)}:{r['line'] or '?'}"
        pipes = r["pipelines"]
        shown = r["analysed_pipeline"] or (pipes[0]["class"] if pipes else "-")
        pipe = shown + (f" +{len(pipes) - 1}" if len(pipes) > 1 else "") if pipes else "-"
        sup = r["already_supported"]
        supported = "?" if sup is None else ("yes" if sup.get("registered") else "no")
        if r["status"] == "error":
            table.append([r["transformer_class"] or "?", where, pipe, supported, f"error: {r['error']}"])
            continue
        lists = ", ".join(f"{b['attr']}: {(b['forward_pattern'] or '?').replace('Pattern_', 'P')}"
                          for b in r["block_lists"]) or "none found"
        cfg = {True: "yes", False: "no", None: "?" if r["analysed_pipeline"] else "-"}[r["has_separate_cfg"]]
        pf = {True: "needed", False: "no", None: "?"}[r["needs_patch_functor"]]
        cp = r["cp"] or {}
        cp_text = f"{cp.get('approach')}, {cp.get('shape')}" if cp.get("shape") else str(cp.get("approach"))
        table.append([r["transformer_class"], where, pipe, supported, lists, cfg, pf, cp_text,
                      str((r["tp"] or {}).get("strategy"))])
    widths = [max((len(row[i]) for row in table if i < len(row) - 1), default=0) for i in range(len(header))]
    lines = []
    for row in table:
        cells = [c.ljust(widths[i]) if i < len(row) - 1 else c for i, c in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    errors = sum(r["status"] == "error" for r in data["rows"])
    lines.append("")
    lines.append(f"{len(data['rows'])} transformer class(es), {errors} error(s); diffusers "
                 f"{data['diffusers']['version']}, cache-dit {data['cache_dit']['version']}")
    lines.append(f"* {SUPPORT_LABEL}")
    for s in data["skipped"]:
        lines.append(f"skipped {s['file']}: {s['why']}")
    return "\n".join(lines)
