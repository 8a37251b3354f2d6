"""`integrate audit`: every integration the installed cache-dit ships, proved side by side with ours.

For each transformer class whose cache-dit adapter accepts it (the survey's support note), with a config-only
model folder, through `integrate.api` in this process: the plan (no probe), then `api.automatic_chain`: an approval
recorded as automatic, `generate --replace-builtin` (ours registered over cache-dit's own), then the same CPU proofs
twice on the same fixture: once with cache-dit's own integration (`verify --cache-dit-own`: the plugin is
not imported) and once with ours. Each proof gets one label (`proof_label`): a proof cache-dit's integration
fails while ours passes is a finding, printed with the shell lines that reproduce it from scratch; a proof
cache-dit has no planner of its own for is `cache-dit-lacks` (a missing feature, not a defect); a side that did
not run the proof to a verdict leaves it `unproved`; a row whose fixture the plain model does not run on proves
nothing either way (`no-fixture`); both failing is left to a person (`both-fail`). What cache-dit's registry
answered is read from the run itself (verify records each planner lookup), never guessed from names.

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
from integrate.verify.proofs import AUDITED, BY_NAME

from .records import AUDIT_SCHEMA, AUDIT_SCHEMA_VERSION, PROOF_LABELS, AuditProof, AuditReport, AuditRow, SurveyRow

DEFAULT_PROOFS = AUDITED  # every proof that runs the model through an integration


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


def audit_row(row: SurveyRow, diffusers_version: str | None, work: Path, proofs: tuple[str, ...],
              classes: frozenset[str] = frozenset()) -> AuditRow:
    started = time.monotonic()
    adapter = None
    support = row.already_supported
    if support is not None and support.matches:
        adapter = support.matches[0].adapter
    head = {"transformer_class": row.transformer_class, "pipeline": row.analysed_pipeline, "adapter": adapter}
    base = work / row.transformer_class
    steps = ["plan"]
    try:
        model = _model_dir(base, row, diffusers_version)
        analysis = api.analyze(api.flags_for(str(model)))
        lists = [b for b in analysis.transformer.block_lists if b.is_blocks]
        head["our_patterns"] = {b.attr: b.forward_pattern or "unknown" for b in lists}
        head["evidence"] = tuple(f"{e.file}:{e.line}: {e.why}" for b in lists
                                 for e in ([e for e in b.evidence if e.why.startswith("returns")][:1]
                                           or list(b.evidence[:1])))
        api.write_plan(api.plan(api.flags_for(str(model)), probe=False), base / "plan")
        reports = api.automatic_chain(base / "plan", base / "out", command="integrate audit",
                                      why="a scratch plan to compare with cache-dit's own", step=steps.append,
                                      generate_options={"replace_builtin": True},
                                      verifies={"verify cache-dit's own": {"proofs": proofs, "cache_dit_own": True},
                                                "verify ours": {"proofs": proofs}})
        theirs, ours = reports["verify cache-dit's own"], reports["verify ours"]
    except InputError as exc:
        return AuditRow(**head, status="error", why=f"{steps[-1]}: {exc}",
                        seconds=round(time.monotonic() - started, 1))
    except Exception as exc:  # noqa: BLE001 - one row failing never stops the audit
        return AuditRow(**head, status="error", why=f"{steps[-1]}: {type(exc).__name__}: {exc}",
                        seconds=round(time.monotonic() - started, 1))
    fixture = theirs.fixture.status
    out = []
    for name in proofs:
        t, o = getattr(theirs, name), getattr(ours, name)
        extra = {}
        for side, proof in (("cache_dit", t), ("ours", o)):
            if proof.why is not OMIT and proof.status != "pass":
                extra[f"{side}_why"] = proof.why
            if proof.first_divergence not in (None, OMIT):  # a proof that located no module has none
                extra[f"{side}_first_divergence"] = proof.first_divergence.module
        registers, lacks = registration(name, t, classes)
        if registers is not OMIT:
            extra["cache_dit_registers"] = registers
        label, why = proof_label(fixture, t.status, o.status, lacks)
        if why:
            extra["label_why"] = why
        out.append(AuditProof(name, t.status, o.status, label, **extra))
    found = [p for p in out if p.status == "finding"]
    extra = {"reproduce": reproduce(row, diffusers_version, tuple(p.name for p in found))} if found else {}
    status = row_status(out)
    if status == "no-fixture":
        extra["why"] = f"fixture: {theirs.fixture.errors[0]}" if theirs.fixture.errors else "no usable fixture"
    return AuditRow(**head, status=status, proofs=tuple(out), fixture=fixture,
                    seconds=round(time.monotonic() - started, 1), **extra)


BAD = ("fail", "error", "vacuous")  # a proof that proved nothing (`vacuous`: nothing sharded or split) failed


def proof_label(fixture: str, theirs: str, ours: str, lacks: str | None) -> tuple[str, str | None]:
    """One proof's label and, where the two statuses do not say it, why. Each label means one thing:

    * `no-fixture`: the plain model did not run on the fixture; nothing was proved on either side;
    * `cache-dit-lacks`: cache-dit has no integration of its own for this proof (its registry answers nothing for
      the class, or hands out by name prefix a planner that asserts other classes) and ours passes;
    * `unproved`: a side did not run the proof to a verdict (`skipped` on this machine, `needs-code`);
    * `finding`: cache-dit's integration fails the proof (or proves nothing) and ours passes it;
    * `both-fail` / `ours-fails` / `agree`: as said (a pass is a pass with engagement: see `vacuous`).
    """
    if fixture not in ("derived", "edited"):
        return "no-fixture", None
    if lacks is not None:
        if ours in BAD:
            return "ours-fails", lacks
        return ("cache-dit-lacks", lacks) if ours == "pass" else ("unproved", f"{lacks}; ours: {ours}")
    if theirs not in ("pass", *BAD) or ours not in ("pass", *BAD):
        return "unproved", f"cache-dit's: {theirs}, ours: {ours} (a proof not run to a verdict proves nothing)"
    if theirs in BAD:
        return ("finding" if ours == "pass" else "both-fail"), None
    return ("ours-fails" if ours in BAD else "agree"), None


def registration(name: str, proof, classes: frozenset[str] = frozenset()) -> tuple[str | None | object, str | None]:
    """(cache-dit's planner that answered, as "key -> file:line", or None when its registry has none; OMIT when
    the run recorded no lookup or the proof has no planner), and why cache-dit lacks an integration of its own
    for this proof (None when it has one): its registry has none, or the planner that answered was handed out by a
    name prefix that belongs to another model: it asserts other transformer classes, or the prefix is another
    transformer class of the installed diffusers with something between (`HunyuanVideo` + `15` +
    `Transformer3DModel`: HunyuanVideoTransformer3DModel's prefix, not HunyuanVideo15's). `classes`: the transformer
    classes of the installed diffusers."""
    from integrate.analyzers.support import planner_accepts

    if BY_NAME[name].KIND != "paired" or proof.variants is OMIT:
        return OMIT, None
    lookups = [x for v in proof.variants.values() if v.engaged is not OMIT and v.engaged.planners is not OMIT
               for x in v.engaged.planners if x.kind == name]
    if not lookups:
        return OMIT, None
    first, title = lookups[0], BY_NAME[name].TITLE
    if not first.found:
        return None, f"cache-dit registers no {title} planner for {first.asked} ({first.why})"
    file = first.file if first.file is not OMIT else ""
    at = f"{Path(file).name}:{first.line}" if file and first.line is not OMIT else "?"
    where = f"{first.key} -> {at}"
    accepts = planner_accepts(Path(file), first.planner.rpartition(".")[2]) if file and first.planner else None
    if accepts and first.asked not in accepts[0]:
        return where, (f"cache-dit hands out its {title} planner {first.planner.rpartition('.')[2]} for the "
                       f"name prefix '{first.key}', but it is written for {', '.join(accepts[0])} (it asserts so at "
                       f"{Path(file).name}:{accepts[1]})")
    owner = prefix_owner(first.key, first.asked, classes) if isinstance(first.key, str) else None
    if owner is not None:
        return where, (f"cache-dit hands out its {title} planner {first.planner.rpartition('.')[2]} for the "
                       f"name prefix '{first.key}', which is {owner}'s: it registers none for {first.asked} itself")
    return where, None


def prefix_owner(key: str, asked: str, classes: frozenset[str]) -> str | None:
    """Another transformer class whose name is `key` followed by the tail of `asked`'s name, where `asked` has more
    in between (`HunyuanVideo` | `15` | `Transformer3DModel`): the model the prefix was registered for."""
    if not asked.startswith(key) or asked == key:
        return None
    rest = asked[len(key):]
    owners = sorted(c for c in classes if c != asked and c.startswith(key) and len(c) > len(key)
                    and rest.endswith(c[len(key):]) and len(c[len(key):]) < len(rest))
    return owners[0] if owners else None


def row_status(proofs: list[AuditProof]) -> str:
    """A row's status: the most telling of its proofs' labels (a finding first, agreement last)."""
    labels = {p.status for p in proofs}
    return next((x for x in PROOF_LABELS if x in labels), "unproved")


def tally(rows: list[AuditRow], proofs: tuple[str, ...]) -> tuple[dict, dict]:
    """Per proof, how many rows carry each label, and the side-by-side figure over the same proofs: the rows where
    both integrations ran the proof to a verdict (cache-dit registering one of its own), and how many each passed."""
    labels: dict[str, dict[str, int]] = {n: {} for n in proofs}
    compared = {n: {"compared": 0, "cache_dit": 0, "ours": 0} for n in proofs}
    for r in rows:
        for p in r.proofs:
            if p.name not in labels:
                continue
            labels[p.name][p.status] = labels[p.name].get(p.status, 0) + 1
            if p.status in ("finding", "both-fail", "agree") or (p.status == "ours-fails" and p.cache_dit == "pass"):
                c = compared[p.name]
                c["compared"] += 1
                c["cache_dit"] += p.cache_dit == "pass"
                c["ours"] += p.ours == "pass"
    return labels, compared


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
    from . import class_names, run_survey

    # quiet: a bad --only is one line, nothing before it; with --only, only the files defining those classes
    survey = run_survey([], classes=tuple(only) or None, progress=lambda line: None)
    # every class the installed diffusers' transformer files define (whose prefix a planner was registered under)

    classes = class_names(use_cache)
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
                                          "cache_dit": survey.cache_dit.version, "tool": __version__,
                                          "schema": AUDIT_SCHEMA_VERSION})
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
                done(i, audit_row(rows[i], survey.diffusers.version, Path(tmp), proofs, classes))
        else:  # each row in a process of its own: its proofs start their own workers
            with ProcessPoolExecutor(max_workers=min(jobs, len(todo))) as pool:
                futures = {pool.submit(audit_row, rows[i], survey.diffusers.version, Path(tmp), proofs, classes): i
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
    labels, compared = tally(out, tuple(proofs))
    return AuditReport(AUDIT_SCHEMA, AUDIT_SCHEMA_VERSION, __version__, survey.cache_dit, survey.diffusers,
                       tuple(proofs), tuple(out), sum(r.status == "finding" for r in out), labels, compared)
