"""`integrate audit`: every integration the installed cache-dit ships, proved side by side with ours.

For each transformer class whose cache-dit adapter accepts it (the survey's support note), with a config-only
model folder, through `integrate.api` in this process: the plan (no probe), an approval recorded as
automatic, `generate --replace-builtin` (ours registered over cache-dit's own), then the same CPU proofs
twice on the same fixture: once with cache-dit's own integration (`verify --cache-dit-own`: the plugin is
not imported) and once with ours. A proof cache-dit's integration fails while ours passes it is a finding,
printed with the shell lines that reproduce it from scratch; a row whose fixture the plain model does not
run on proves nothing either way (`no-fixture`), and one where both fail is left to a person (`both-fail`).

Rows are cached by the content of the model's source files, the installed cache-dit's and this tool's
version (the same result cache as the survey; `--no-cache` ignores it).
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from integrate import __version__, api, cache
from integrate.errors import InputError
from integrate.records import OMIT, from_json, to_json

from .records import AUDIT_SCHEMA, AUDIT_SCHEMA_VERSION, AuditProof, AuditReport, AuditRow, SurveyRow

REVIEWER = "integrate audit (automatic: a scratch plan to compare with cache-dit's own, not a human review)"
DEFAULT_PROOFS = ("cache", "cp", "tp")


def _model_dir(base: Path, row: SurveyRow, diffusers_version: str | None) -> Path:
    model = base / "model"
    model.mkdir(parents=True)
    index = {"_class_name": row.analysed_pipeline, "_diffusers_version": diffusers_version or "0",
             "transformer": ["diffusers", row.transformer_class]}
    (model / "model_index.json").write_text(json.dumps(index))
    return model


def reproduce(row: SurveyRow, diffusers_version: str | None, proofs: tuple[str, ...]) -> str:
    """Shell lines that show cache-dit's integration failing, from an empty folder (every value quoted)."""
    index = json.dumps({"_class_name": row.analysed_pipeline, "_diffusers_version": diffusers_version or "0",
                        "transformer": ["diffusers", row.transformer_class]})
    flags = " ".join(f"--proof {shlex.quote(p)}" for p in proofs)
    return "\n".join([
        "mkdir -p audit/model",
        f"printf '%s' {shlex.quote(index)} > audit/model/model_index.json",
        "integrate plan audit/model --out audit/plan --no-probe",
        "integrate approve audit/plan --reviewer \"$USER\"",
        "integrate generate audit/plan --out audit/out",
        f"integrate verify audit/plan --generated audit/out --cache-dit-own {flags}",
    ])


def audit_row(row: SurveyRow, diffusers_version: str | None, work: Path, proofs: tuple[str, ...]) -> AuditRow:
    started = time.monotonic()
    adapter = None
    support = row.already_supported
    if support is not None and support.matches:
        adapter = support.matches[0].adapter
    head = {"transformer_class": row.transformer_class, "pipeline": row.analysed_pipeline, "adapter": adapter}
    base = work / row.transformer_class
    step = "plan"
    try:
        model = _model_dir(base, row, diffusers_version)
        analysis = api.analyze(api.flags_for(str(model)))
        lists = [b for b in analysis.transformer.block_lists if b.is_blocks]
        head["our_patterns"] = {b.attr: b.forward_pattern or "unknown" for b in lists}
        head["evidence"] = tuple(f"{e.file}:{e.line}: {e.why}" for b in lists
                                 for e in ([e for e in b.evidence if e.why.startswith("returns")][:1]
                                           or list(b.evidence[:1])))
        api.write_plan(api.plan(api.flags_for(str(model)), probe=False), base / "plan")
        step = "approve"
        api.approve(base / "plan", REVIEWER)
        step = "generate"
        api.generate(base / "plan", out=base / "out", replace_builtin=True)
        step = "verify cache-dit's own"
        theirs = api.verify(base / "plan", base / "out", proofs=proofs, cache_dit_own=True)
        step = "verify ours"
        ours = api.verify(base / "plan", base / "out", proofs=proofs)
    except InputError as exc:
        return AuditRow(**head, status="error", why=f"{step}: {exc}", seconds=round(time.monotonic() - started, 1))
    except Exception as exc:  # noqa: BLE001 - one row failing never stops the audit
        return AuditRow(**head, status="error", why=f"{step}: {type(exc).__name__}: {exc}",
                        seconds=round(time.monotonic() - started, 1))
    out = []
    for name in proofs:
        t, o = getattr(theirs, name), getattr(ours, name)
        extra = {}
        for side, proof in (("cache_dit", t), ("ours", o)):
            if proof.why is not OMIT and proof.status != "pass":
                extra[f"{side}_why"] = proof.why
            if proof.first_divergence is not None:
                extra[f"{side}_first_divergence"] = proof.first_divergence.module
        out.append(AuditProof(name, t.status, o.status, **extra))
    bad = ("fail", "error")
    found = [p for p in out if p.cache_dit in bad and p.ours == "pass"]  # ours passes where cache-dit's fails
    extra = {"reproduce": reproduce(row, diffusers_version, tuple(p.name for p in found))} if found else {}
    status = row_status(theirs.fixture.status, out)
    if status == "no-fixture":
        extra["why"] = f"fixture: {theirs.fixture.errors[0]}" if theirs.fixture.errors else "no usable fixture"
    return AuditRow(**head, status=status, proofs=tuple(out), fixture=theirs.fixture.status,
                    seconds=round(time.monotonic() - started, 1), **extra)


def row_status(fixture: str, proofs: list[AuditProof]) -> str:
    """A row's verdict. Without a fixture the plain model ran on, nothing was proved on either side: the fixture
    is the problem, not an integration (`no-fixture`). A finding is a proof cache-dit's integration fails while
    ours passes; both failing is left to a person (the integrations, the fixture or the proof). A proof that proved
    nothing (`vacuous`: nothing sharded or split) counts as failed on either side."""
    bad = ("fail", "error", "vacuous")
    if fixture not in ("derived", "edited"):
        return "no-fixture"
    if any(p.cache_dit in bad and p.ours == "pass" for p in proofs):
        return "finding"
    if any(p.cache_dit in bad and p.ours in bad for p in proofs):
        return "both-fail"
    if any(p.ours in bad for p in proofs):
        return "ours-fails"
    return "agree"


def default_jobs() -> int:
    """Rows audited at once: half the cores (each row's CP and TP proofs run two processes at a time)."""
    return max(1, (os.cpu_count() or 1) // 2)


def run_audit(only: tuple[str, ...] = (), proofs: tuple[str, ...] = DEFAULT_PROOFS, use_cache: bool = True,
              progress: Callable[[str], None] | None = None, jobs: int | None = None) -> AuditReport:
    from integrate.verify.proofs import CHOICES

    bad = [p for p in proofs if p not in CHOICES]
    if bad:
        raise InputError(f"--proof {bad[0]}: not a proof (choose from {', '.join(CHOICES)})")
    progress = progress or (lambda line: None)
    # quiet: a bad --only is one line, nothing before it; with --only, only the files defining those classes
    survey = api.survey(classes=tuple(only) or None, progress=lambda line: None)
    rows = [r for r in survey.rows if r.status == "ok" and r.transformer_class and r.already_supported
            and r.already_supported.registered]
    if only:
        missing = sorted(set(only) - {r.transformer_class for r in rows})
        if missing:
            raise InputError(f"--only {missing[0]}: not a transformer class the installed cache-dit registers")
        rows = [r for r in rows if r.transformer_class in only]
    jobs = max(1, jobs or default_jobs())
    progress(f"auditing {len(rows)} integration(s) cache-dit {survey.cache_dit.version} registers"
             + (f", {jobs} at a time" if jobs > 1 else ""))
    results: dict[int, AuditRow] = {}
    todo: list[int] = []
    keys, deps = {}, {}
    for i, row in enumerate(rows):
        keys[i] = cache.key_for("audit", {"file": row.file, "class": row.transformer_class,
                                          "pipeline": row.analysed_pipeline, "proofs": list(proofs),
                                          "cache_dit": survey.cache_dit.version, "tool": __version__})
        deps[i] = [row.file, *(p.file for p in row.pipelines if p.cls == row.analysed_pipeline)]
        if row.already_supported and row.already_supported.matches:
            deps[i].append(row.already_supported.matches[0].adapter.rpartition(":")[0])
        hit = cache.load(keys[i]) if use_cache else None
        if hit is not None:
            results[i] = from_json(AuditRow, {**hit, "cached": True})
            progress(f"audit [{len(results)}/{len(rows)}] {row.transformer_class} (cached)")
        else:
            todo.append(i)

    def done(i: int, result: AuditRow) -> None:
        if result.status != "error" and use_cache:
            cache.store(keys[i], to_json(result), deps[i])
        results[i] = result
        progress(f"audit [{len(results)}/{len(rows)}] {rows[i].transformer_class}: {result.status}")

    with tempfile.TemporaryDirectory(prefix="integrate-audit-") as tmp:
        if jobs == 1 or len(todo) <= 1:
            for i in todo:
                progress(f"audit {rows[i].transformer_class} ...")
                done(i, audit_row(rows[i], survey.diffusers.version, Path(tmp), proofs))
        else:  # each row in a process of its own: its proofs start their own workers
            with ProcessPoolExecutor(max_workers=min(jobs, len(todo))) as pool:
                futures = {pool.submit(audit_row, rows[i], survey.diffusers.version, Path(tmp), proofs): i
                           for i in todo}
                for fut in as_completed(futures):
                    i = futures[fut]
                    try:
                        result = fut.result()
                    except Exception as exc:  # noqa: BLE001 - a pool process died (memory, a signal)
                        result = AuditRow(transformer_class=rows[i].transformer_class,
                                          pipeline=rows[i].analysed_pipeline, adapter=None, status="error",
                                          why=f"the audit process failed: {type(exc).__name__}: {exc}")
                    done(i, result)
    out = [results[i] for i in range(len(rows))]
    return AuditReport(AUDIT_SCHEMA, AUDIT_SCHEMA_VERSION, __version__, survey.cache_dit, survey.diffusers,
                       tuple(proofs), tuple(out), sum(r.status == "finding" for r in out))
