"""The pipeline as functions over typed records: what the CLI, the survey, verify and tests call.

    gate -> analyze -> plan -> (a reviewer revises and approves) -> generate -> verify

Each function takes the previous stage's record (or the gate's flags) and returns its own record; the
JSON a command prints is `integrate.records.to_json` of that record. Nothing here prints: `progress`
callbacks report long work, and `integrate.render` turns records into text for people.

A `Workspace` parses each source file once; pass one to several calls (the survey does) to share it.

Imports go one way: the front ends that drive the pipeline many times over (`integrate.survey`: survey, audit and
`audit --fix`; `integrate.repair`) are built on these functions and import this module; this module imports none of
them, and `integrate.cli` calls them directly. tests/test_layout.py fails on any import cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from integrate.errors import InputError
from integrate.gate.records import FACTS, GateFlags, GateReport
from integrate.records import to_json

# Each function imports the stages it runs: a warm `integrate analyze` (answered from the result cache)
# must not pay for importing libcst, jinja2 and numpy it never uses.

if TYPE_CHECKING:
    from integrate.analyzers.records import Analysis
    from integrate.decisions.records import ApprovalStatus, Plan, Revision
    from integrate.resolve import Workspace

Progress = Callable[[str], None]


def _quiet(message: str) -> None:
    pass


def flags_for(target: str | None = None, *, no_pipeline: bool = False, separate_cfg: str | bool | None = None,
              block_class: tuple[str, ...] = (), source_root: tuple[str, ...] = (), **flags: str | None) -> GateFlags:
    """The gate flags, with a positional TARGET (a model folder or a transformer source file) folded in;
    `separate_cfg` as the CLI spells it ("yes" / "no") or a bool; `block_class` as `ATTR=Class` strings;
    `source_root` as folders (made absolute here: the gate checks them)."""
    values: dict = {k: flags.get(k) for k in FACTS}
    for root in source_root:
        if not str(root).strip():  # would mean the working directory
            raise InputError("--source-root must name a folder, not an empty string")
    values["source_roots"] = tuple(str(Path(r).absolute()) for r in source_root)
    values["no_pipeline"] = bool(no_pipeline)
    pairs = []
    for item in block_class:
        attr, sep, cls = item.partition("=")
        if not sep:
            raise InputError(f"--block-class {item}: expected ATTR=Class or ATTR=path/to/file.py:Class")
        file, colon, name = cls.strip().rpartition(":")
        if colon and file:  # a source file: absolute, so the plan reads the same file from anywhere
            cls = f"{Path(file).resolve()}:{name}"
        pairs.append((attr.strip(), cls.strip()))
    values["block_classes"] = tuple(pairs)
    values["separate_cfg"] = {"yes": True, "no": False}.get(separate_cfg, separate_cfg)  # type: ignore[arg-type]
    if target is not None:
        path = Path(target)
        if not path.exists():
            raise InputError(f"{target}: no such file or directory")
        key = "model_path" if path.is_dir() else "transformer_file"
        other = values.get(key)
        if other and Path(other).resolve() != path.resolve():
            raise InputError(f"{target} and --{key.replace('_', '-')} {other} name different {key.split('_')[0]}s")
        values[key] = str(path)
    return GateFlags(**values)


def gate(flags: GateFlags, ws: Workspace | None = None) -> GateReport:
    """The five facts, each with where it came from; an InputError when one cannot be established."""
    from integrate.gate import run_gate
    from integrate.resolve import Workspace

    return run_gate(flags, ws or Workspace())


def analyze(model: GateFlags | GateReport, *, parallel: bool = False, ws: Workspace | None = None,
            progress: Progress = _quiet) -> Analysis:
    """The static analysis (never imports the analysed code); `parallel` adds what the plan needs."""
    from integrate.analyzers.analysis import analyze as analyze_gate
    from integrate.gate import run_gate
    from integrate.resolve import Workspace

    ws = ws or Workspace()
    if isinstance(model, GateFlags):
        progress("gate: locating classes and source files")
        model = run_gate(model, ws)
    else:  # a gate report: its source roots name the modules as the gate did
        ws.use_source_roots(model.roots)
    progress("analyzing transformer and pipeline sources" + (", attention, blocks and sequence flow"
                                                             if parallel else ""))
    return analyze_gate(model, ws, parallel=parallel)


def analysis_json(flags: GateFlags, *, use_cache: bool = True, progress: Progress = _quiet) -> dict:
    """`analyze`'s JSON form through the content-keyed result cache (a warm run parses nothing)."""
    from integrate import cache

    request = {k: (str(Path(v).resolve()) if v and k.endswith(("_path", "_file")) else v)
               for k, v in flags.__dict__.items()}
    key = cache.key_for("analyze", request)
    if use_cache:
        hit = cache.load(key)
        if hit is not None:
            return hit
    from integrate.gate import run_gate
    from integrate.resolve import Workspace

    ws = Workspace()
    progress("gate: locating classes and source files")
    report = run_gate(flags, ws)
    result = to_json(analyze(report, ws=ws, progress=progress))
    if use_cache:
        # the entry answers while everything the analysis read is as it was: each source as it was parsed, the
        # files and folders read besides, the paths looked for and not found, the model folder's metadata
        read = ws.dependencies()
        files, absent = read["files"], list(read["absent"])
        model = report.value("model_path")
        metadata = [Path(model) / m for m in ("model_index.json", "transformer/config.json", "config.json")
                    ] if model else []
        for meta in [*metadata, *([Path(report.value("config_file"))] if report.value("config_file") else [])]:
            digest = cache.digest(str(meta))
            if digest is None:
                absent.append(str(meta))
            else:
                files.setdefault(str(meta), digest)
        cache.store(key, result, files, absent=absent, packages=read["packages"], listings=read["listings"])
    return result


def plan(model: GateFlags | GateReport, *, probe: bool = True, trust_code: bool = False,
         ws: Workspace | None = None, progress: Progress = _quiet) -> Plan:
    """Gate, analysis with the parallelism facts, the meta-device check (`probe`; it builds a model outside
    installed packages only with `trust_code`), and the decisions."""
    from integrate.decisions import make_plan
    from integrate.decisions.crosscheck import SKIPPED, check_on_meta
    from integrate.resolve import Workspace

    ws = ws or Workspace()
    analysis = analyze(model, parallel=True, ws=ws, progress=progress)
    if probe:
        progress("cross-checking on the meta device (builds the model without weights)")
        check = check_on_meta(analysis, ws, trust_code=trust_code)
    else:
        check = SKIPPED
    progress("deciding CP / TP / TE-P / VAE-P")
    made = make_plan(analysis, check)
    return dataclasses.replace(made, reads=files_bound(ws, made))


def files_bound(ws: Workspace, plan: Plan) -> dict[str, str]:
    """Every file later commands read for this plan, with its SHA-256: the sources `ws` parsed (as parsed), the rest
    of a third-party model's own package (verify runs it) and the model folder's metadata (as they are now)."""
    from integrate.inputs import hashed, metadata_files, own_sources

    parsed = ws.hashes
    own = [p for p in own_sources([plan.model.transformer_file, plan.model.pipeline_file], plan.model.roots)
           if str(p) not in parsed]
    return {**parsed, **hashed([*own, *metadata_files(plan.model.model_path, plan.model.config_file)])}


def write_plan(plan: Plan, out_dir: Path) -> list[str]:
    """PLAN.md (for a reviewer) and plan.json (for agents), both or neither."""
    import json

    from integrate.files import write_tree
    from integrate.render.markdown import plan_markdown

    check_out_dir(out_dir)
    data = to_json(plan)
    return write_tree(out_dir, {"plan.json": json.dumps(data, indent=2) + "\n", "PLAN.md": plan_markdown(data)})


def check_out_dir(out_dir: Path) -> None:
    """Refuse an output folder that cannot be one, before any work is done for it."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir} exists and is not a folder")
    ancestor = out_dir.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(f"--out {out_dir}: {ancestor} is not a folder")


def approve(plan_dir: Path, reviewer: str) -> ApprovalStatus:
    """Record `reviewer`'s approval of plan.json as it stands; refused when PLAN.md does not show it (plan.json
    edited by hand: the reviewer would approve what they did not read)."""
    from integrate.decisions.approval import PLAN_FILE, PLAN_MD, check_reviewer, load_plan
    from integrate.decisions.approval import approve as record_approval
    from integrate.decisions.records import ApprovalStatus

    check_reviewer(reviewer)
    shown = (plan_dir / PLAN_MD).read_text() if (plan_dir / PLAN_MD).is_file() else None
    rendered = _shown(to_json(load_plan(plan_dir)), plan_dir)
    if shown is not None and shown != rendered:
        raise InputError(f"{plan_dir / PLAN_MD} does not show {plan_dir / PLAN_FILE} as it stands (was plan.json "
                         f"edited by hand?): change a decision with `integrate revise {plan_dir} --set KEY=VALUE "
                         "--why TEXT --reviewer NAME`, which renders both, then review PLAN.md")
    a = record_approval(plan_dir, reviewer)
    return ApprovalStatus(reviewer=a.reviewer, approved_at=a.approved_at, plan_sha256=a.plan_sha256, approved=True)


def _shown(data: dict, plan_dir: Path) -> str:
    """PLAN.md for a plan's data; an InputError where values no plan of ours holds keep it from rendering."""
    from integrate.render.markdown import plan_markdown

    try:
        return plan_markdown(data)
    except Exception as exc:  # noqa: BLE001 - a hand-edited plan.json (a layer plan entry without a reason)
        raise InputError(f"{plan_dir}/plan.json cannot be shown as PLAN.md ({type(exc).__name__}: "
                         f"{str(exc)[:120]}): was it edited by hand? Make the plan again or use `integrate revise`"
                         ) from None


def revise(plan_dir: Path, assignments: list[str], *, why: str, reviewer: str, unsets: list[str] = ()) -> Revision:
    """Apply a reviewer's `KEY=VALUE` assignments to plan.json, record each beside what the analysis said, render
    PLAN.md again, write both (or neither) and void the approval."""
    import json

    from integrate.decisions.approval import APPROVAL_FILE, load_plan
    from integrate.decisions.records import Revision
    from integrate.decisions.revise import UNSET, parse_assignment
    from integrate.decisions.revise import revise as apply_revision
    from integrate.files import write_tree

    before = load_plan(plan_dir)
    changes = [parse_assignment(a) for a in assignments] + [(k.strip(), UNSET) for k in unsets]
    revised = apply_revision(before, changes, why, reviewer)
    if revised == before:  # every value set is what the plan already says: nothing to write or to void
        return Revision(str(plan_dir), changed=False, approval_voided=False, overrides=revised.overrides)
    data = to_json(revised)
    write_tree(plan_dir, {"plan.json": json.dumps(data, indent=2) + "\n", "PLAN.md": _shown(data, plan_dir)})
    approval = plan_dir / APPROVAL_FILE
    voided = approval.is_file()
    approval.unlink(missing_ok=True)  # what was approved is not this plan
    return Revision(str(plan_dir), changed=True, approval_voided=voided, overrides=revised.overrides)


def approval(plan_dir: Path) -> ApprovalStatus:
    """The plan's approval as it stands; an InputError when it is not approved."""
    from integrate.decisions.approval import approval_status, require_approved

    require_approved(plan_dir)
    return approval_status(plan_dir)


def generate(plan_dir: Path, *, out: Path | None = None, mode: str = "plugin", cache_dit_src: Path | None = None,
             dry_run: bool = False, replace_builtin: bool = False, verify_report: Path | None = None,
             progress: Progress = _quiet):
    """Write the code the approved plan calls for (`integrate.templates.generate`); returns the `GenerateReport`
    (its `manual` lists what the templates could not write)."""
    from integrate.decisions.approval import require_approved
    from integrate.render.markdown import pr_markdown
    from integrate.templates.generate import Output, built, example_name, write_checkout, write_plugin

    plan_rec, approval_rec = require_approved(plan_dir)
    output = Output(mode, out, cache_dit_src, dry_run, replace_builtin, verify_report)
    output.check()
    example_name(plan_rec)
    progress("re-reading the model sources the plan was made from")
    if mode == "plugin":
        return write_plugin(plan_rec, approval_rec, output)
    gen, analysis = built(plan_rec, approval_rec, checkout=True)
    proofs = _proofs_for_pr(verify_report, plan_rec) if verify_report is not None else None
    return write_checkout(plan_rec, approval_rec, output, gen, analysis,
                          lambda **parts: pr_markdown(plan=to_json(plan_rec), approval=to_json(approval_rec),
                                                      proofs=proofs, **parts))


def _proofs_for_pr(path: Path, plan) -> dict:
    """What PR.md shows of a saved `integrate verify --json` report, which must be of the plan's model."""
    from integrate.jsonfile import read
    from integrate.render.markdown import proof_rows
    from integrate.verify.records import VERIFY_SCHEMA, VERIFY_SCHEMA_VERSION

    report = read(path, "verify report")
    if report.get("schema") != VERIFY_SCHEMA or str(report.get("schema_version", "")).split(".")[0] != \
            VERIFY_SCHEMA_VERSION.split(".")[0]:
        raise InputError(f"{path}: not the JSON of `integrate verify --json` (schema {VERIFY_SCHEMA} "
                         f"{VERIFY_SCHEMA_VERSION})")
    model = report.get("model") if isinstance(report.get("model"), dict) else {}
    if model.get("transformer_class") != plan.model.transformer_class:
        raise InputError(f"{path}: a verify report of {str(model.get('transformer_class'))[:80]!r}, not of "
                         f"{plan.model.transformer_class}")
    return proof_rows(report)


def verify(plan_dir: Path, generated: Path, *, proofs: tuple[str, ...] | None = None, trust_code: bool = False,
           fixture_only: bool = False, fixture_from: Path | None = None, cache_dit_own: bool = False,
           progress: Progress = _quiet, baseline: Path | None = None, variants: tuple[str, ...] | None = None,
           skip: tuple[str, ...] = (), fail_fast: bool = False):
    """The CPU proofs of a generated plugin (a `VerifyReport`); `fixture_only`: the fixture and one plain run
    on it, no proof; `fixture_from`: a diffusers-style model test to take the config and inputs from first.
    For repeated verifies of one fixture (`integrate repair`): `baseline`, a folder where the plain model's run is
    kept by the first and read back by the later ones; `variants`, the only parallel variants to run; `skip`,
    variants not to run (one a trial already passed); `fail_fast`, a parallel proof's first variant alone, the
    rest only when it passes."""
    from integrate.verify.run import Verifier

    return Verifier(plan_dir, generated, trust_code=trust_code, proofs=proofs, fixture_only=fixture_only,
                    fixture_from=fixture_from, cache_dit_own=cache_dit_own, progress=progress, baseline=baseline,
                    variants=variants, skip=skip, fail_fast=fail_fast).run()


def automatic_reviewer(command: str, why: str) -> str:
    """The reviewer an automatic approval (or revision) is recorded under: the command that made it and why, never
    taken for a person's review."""
    return f"{command} (automatic: {why}, not a human review)"


def automatic_chain(plan_dir: Path, out: Path, *, command: str, why: str, generate_options: dict | None = None,
                    verifies: dict[str, dict] | None = None, step: Progress = _quiet) -> dict:
    """A scratch plan the tool made for itself, proved without a person: approved as automatic (`command` and `why`
    name who and what for), generated into `out` (`generate_options`: generate's keyword arguments; parts left to
    hand work are still verified), then verified once per entry of `verifies` (a step name -> verify's keyword
    arguments; default one plain `verify`). `step` hears each step's name before it runs ("approve", "generate",
    then the names in `verifies`): where the chain stopped, for the caller's message. Returns each verify report
    under its step name. Used by `integrate survey --verify`, `integrate audit` (and `--fix`) and `integrate
    repair`'s trials."""
    step("approve")
    approve(plan_dir, automatic_reviewer(command, why))
    step("generate")
    generate(plan_dir, out=out, **(generate_options or {}))
    reports = {}
    for name, options in (verifies or {"verify": {}}).items():
        step(name)
        reports[name] = verify(plan_dir, out, **options)
    return reports


def verify_gpu(plan_dir: Path, generated: Path, *, out: str, print_only: bool, trust_code: bool = False,
               progress: Progress = _quiet):
    """The GPU matrix (a `GpuReport`): its commands (`print_only`), or their results where CUDA GPUs are."""
    from integrate.verify.gpu import run_or_print

    return run_or_print(plan_dir, generated, out=out, print_only=print_only, trust_code=trust_code,
                        progress=progress)


def metrics(baseline: Path, candidate: Path, side_by_side: Path | None = None):
    """PSNR and SSIM of `candidate` against `baseline`, and a side-by-side picture (a `MetricsReport`)."""
    from integrate.verify.metrics import report

    return report(baseline, candidate, side_by_side)
