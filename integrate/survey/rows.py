"""One file's rows, in a survey worker: the same gate, analysis and decisions as `plan --no-probe`, called
through `integrate.api` with one Workspace per worker (a file several rows read is parsed once)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from integrate import api
from integrate.errors import InputError
from integrate.gate.records import Fact, GateFlags, GateReport
from integrate.records import to_json

from .index import PipelineIndex, TrackingWorkspace, is_model
from .records import PipelineRef, RowCp, RowList, RowTp, Skipped, SurveyRow

NO_PIPELINE = "survey: no pipeline under the surveyed trees names this transformer in its __init__"


@dataclass(frozen=True)
class Task:
    """One source file whose ModelMixin classes become rows."""

    path: str
    origin: str  # "diffusers" or the --path it was found under


class Worker:
    def __init__(self, pipelines: list[str], model_dir: str) -> None:
        self.ws = TrackingWorkspace()
        self.index = PipelineIndex(pipelines)
        self.model_dir = model_dir

    def survey_file(self, task: Task) -> dict:
        """Rows for every ModelMixin class a file defines, with the files they read (for the cache), as JSON
        data: {rows, skipped, parsed, indexed, deps} and, where the file was read, what the result cache checks
        besides `deps` (absent, packages, listings: `integrate.cache.store`)."""
        ws = self.ws
        ws.touched.clear()
        rows: list[SurveyRow] = []
        skipped: list[Skipped] = []
        read: set[str] = set()
        try:
            src = ws.load(Path(task.path))
        except (InputError, RecursionError, MemoryError) as exc:
            try:
                text = Path(task.path).read_text(errors="replace")
            except OSError:
                text = ""
            if task.origin == "diffusers" or "ModelMixin" in text:
                why = one_line(exc) if isinstance(exc, InputError) else f"{type(exc).__name__}: could not read the file"
                rows.append(SurveyRow(None, task.path, None, status="error", error=why))
            else:
                skipped.append(Skipped(task.path, one_line(exc)))
            return _result(rows, skipped, [], [], [task.path])
        for name, node in src.classes.items():
            try:
                model = is_model(ws, src, node)
            except RecursionError:
                model = False
            if not model:
                continue
            row, looked_into = self.row(src, name, node)
            rows.append(row)
            read.update(looked_into)
        rows.sort(key=lambda r: r.line or 0)
        parsed = sorted(ws.touched)
        # besides the files this task parsed: what the worker's analyses read without parsing (cache-dit's
        # registries), looked for and did not find, found installed and listed (kept since the worker started)
        probes = ws.dependencies()
        unparsed = [p for p in probes["files"] if p not in ws.hashes]
        deps = sorted(set(parsed) | read | set(unparsed) | {str(Path(task.path).resolve())})
        return {**_result(rows, skipped, parsed, sorted(read), deps),
                **{k: probes[k] for k in ("absent", "packages", "listings")}}

    def row(self, src, name: str, cls) -> tuple[SurveyRow, list[str]]:
        """The row for one class, and the pipeline files its pipeline search looked into."""
        where = dict(transformer_class=name, file=str(src.path), line=src.line(cls))
        looked_into: list[str] = []
        refs: tuple[PipelineRef, ...] = ()
        chosen = None
        try:
            pipelines, looked_into = self.index.pipelines_for(name)
            refs = tuple(PipelineRef(p["class"], p["file"], p["line"]) for p in pipelines)
            chosen = choose(pipelines)
            plan = api.plan(self._gate(src, name, chosen), probe=False, ws=self.ws)
        except RecursionError:
            return SurveyRow(**where, status="error", error="RecursionError: the source nests too deeply to analyse",
                             pipelines=refs, analysed_pipeline=chosen["class"] if chosen else None), looked_into
        except Exception as exc:  # noqa: BLE001 - one row failing never stops the survey
            return SurveyRow(**where, status="error", error=one_line(exc), pipelines=refs,
                             analysed_pipeline=chosen["class"] if chosen else None), looked_into
        c, cp, tp = plan.cache, plan.parallelism.cp, plan.parallelism.tp
        return SurveyRow(
            **where, pipelines=refs, analysed_pipeline=chosen["class"] if chosen else None,
            already_supported=plan.already_supported,
            block_lists=tuple(RowList(b.attr, b.block_class, b.forward_pattern, b.confidence, b.check_forward_pattern)
                              for b in c.block_lists),
            not_blocks=tuple(b.attr for b in c.not_blocks),
            has_separate_cfg=c.has_separate_cfg if chosen else None,
            cfg_confidence=c.cfg_confidence if chosen else None,
            needs_patch_functor=c.needs_patch_functor, patch_functor_reasons=c.patch_functor_reasons,
            cp=RowCp(cp.approach, cp.shape, cp.confidence), tp=RowTp(tp.strategy, tp.confidence),
            unknowns=plan.unknowns), looked_into

    def _gate(self, src, name: str, pipeline: dict | None) -> GateFlags | GateReport:
        """The gate's flags path for a class with a pipeline; for one without, a gate report with no pipeline
        (the analysis then says why its CFG style is unknown)."""
        t_file = str(src.path)
        if pipeline is not None:
            return GateFlags(model_path=self.model_dir, pipeline_class=pipeline["class"], transformer_class=name,
                             pipeline_file=pipeline["file"], transformer_file=t_file)
        return GateReport(
            inputs={"model_path": Fact(self.model_dir, "survey: empty model directory"),
                    "pipeline_class": Fact(None, NO_PIPELINE), "transformer_class": Fact(name, "survey"),
                    "pipeline_file": Fact(None, NO_PIPELINE), "transformer_file": Fact(t_file, "survey"),
                    "config_file": Fact(None, "survey: the class defaults")},
            pipeline_entry="__call__", notes=(NO_PIPELINE,))


def choose(pipelines: list[dict]) -> dict | None:
    """The pipeline a row analyses: one that defines __call__, shortest name first (FluxPipeline)."""
    if not pipelines:
        return None
    return min(pipelines, key=lambda p: (not p["defines_call"], len(p["class"]), p["class"], p["file"]))


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, InputError) else text or "input error"


def _result(rows, skipped, parsed, indexed, deps) -> dict:
    return {"rows": to_json(rows), "skipped": to_json(skipped), "parsed": parsed, "indexed": indexed, "deps": deps}


# -- the process pool's worker state ------------------------------------------------------------------

_WORKER: Worker | None = None


def init_worker(pipelines: list[str], model_dir: str) -> None:
    global _WORKER
    _WORKER = Worker(pipelines, model_dir)


def survey_file(task: Task) -> dict:
    assert _WORKER is not None, "call init_worker first"
    return _WORKER.survey_file(task)
