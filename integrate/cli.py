"""The `integrate` command line.

Exit codes: 0 success, 1 the analysed model fails a check, 2 the user's input is wrong.
Bad input prints one line on stderr; nothing is written.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from integrate import __version__
from integrate.errors import InputError

SCHEMA_DOC = "docs/schema.md"


def _progress(message: str) -> None:
    if sys.stderr.isatty():
        click.echo(f"... {message}", err=True)


def gate_options(fn):
    """The five gate flags, shared by every command."""
    for name, help_text in reversed(
        [
            ("--model-path", "Local model directory (model_index.json, transformer/config.json)."),
            ("--pipeline-class", "Pipeline class; `Class.method` or a function name for third-party loops."),
            ("--transformer-class", "Transformer class name."),
            ("--pipeline-file", "Source file that defines the pipeline class or function."),
            ("--transformer-file", "Source file that defines the transformer class."),
        ]
    ):
        fn = click.option(name, default=None, help=help_text)(fn)
    return fn


def _flags(kwargs: dict, target: str | None = None):
    from integrate.gate import GateFlags

    flags = {k: kwargs.get(k) for k in ("model_path", "pipeline_class", "transformer_class", "pipeline_file",
                                         "transformer_file")}
    if target is not None:
        path = Path(target)
        if not path.exists():
            raise InputError(f"{target}: no such file or directory")
        key = "model_path" if path.is_dir() else "transformer_file"
        other = flags.get(key)
        if other and Path(other).resolve() != path.resolve():
            raise InputError(f"{target} and --{key.replace('_', '-')} {other} name different {key.split('_')[0]}s")
        flags[key] = str(path)
    return GateFlags(**flags)


class _Group(click.Group):
    """Turns click's usage errors into one line and exit code 2, like every other bad input."""

    def main(self, args=None, prog_name=None, **extra):
        try:
            rv = super().main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("integrate: aborted", err=True)
            sys.exit(2)
        except click.UsageError as exc:
            click.echo(f"integrate: error: {exc.format_message()}", err=True)
            sys.exit(2)
        except InputError as exc:
            click.echo(f"integrate: error: {exc}", err=True)
            sys.exit(2)
        except Exception as exc:  # a bug in integrate, not the user's fault
            if os.environ.get("INTEGRATE_DEBUG"):
                raise
            click.echo(f"integrate: internal error: {type(exc).__name__}: {exc} (set INTEGRATE_DEBUG=1 for "
                       "the traceback)", err=True)
            sys.exit(3)
        sys.exit(rv or 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="integrate")
def main() -> None:
    """Integrate a diffusion-transformer model into cache-dit, one checked stage at a time.

    gate -> analyze -> plan -> approve -> generate -> verify. Every command runs the gate
    first. --json output follows the versioned schema in docs/schema.md.
    """


def _emit(data: dict, as_json: bool, text: str) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(text)


@main.command()
@gate_options
@click.option("--json", "as_json", is_flag=True, help="Print the gate report as JSON.")
def gate(as_json: bool, **kwargs) -> int:
    """Check that the five facts are known and consistent; report where each came from."""
    from integrate.gate import run_gate
    from integrate.records import SCHEMA_VERSION, to_json
    from integrate.render import gate_text
    from integrate.resolve import Workspace

    report = run_gate(_flags(kwargs), Workspace())
    data = {"schema_version": SCHEMA_VERSION, "gate": to_json(report)}
    _emit(data, as_json, "\n".join(gate_text(data["gate"])))
    return 0


def run_analysis(flags, use_cache: bool = True) -> dict:
    """Gate + analysis as JSON data, through the content-keyed cache."""
    from integrate import cache

    request = {k: (str(Path(v).resolve()) if v and k.endswith(("_path", "_file")) else v)
               for k, v in flags.__dict__.items()}
    key = cache.key_for("analyze", request)
    if use_cache:
        hit = cache.load(key)
        if hit is not None:
            return hit
    from integrate.analyzers import analyze
    from integrate.gate import run_gate
    from integrate.records import to_json
    from integrate.resolve import Workspace

    ws = Workspace()
    _progress("gate: locating classes and source files")
    report = run_gate(flags, ws)
    _progress("analyzing transformer and pipeline sources")
    result = to_json(analyze(report, ws))
    deps = list(result["files_read"])
    model = report.value("model_path")
    for meta in ("model_index.json", "transformer/config.json"):
        if model and (Path(model) / meta).is_file():
            deps.append(str(Path(model) / meta))
    if use_cache:
        cache.store(key, result, deps)
    return result


@main.command()
@click.argument("target", required=False)
@gate_options
@click.option("--json", "as_json", is_flag=True, help="Print the analysis as JSON (schema: docs/schema.md).")
@click.option("--markdown", is_flag=True, help="Render the report as Markdown with evidence lines.")
@click.option("--no-cache", is_flag=True, help="Ignore and do not write the result cache.")
def analyze(target: str | None, as_json: bool, markdown: bool, no_cache: bool, **kwargs) -> int:
    """Static analysis of a model directory or a transformer source file (never imports it)."""
    from integrate.render import analysis_text

    data = run_analysis(_flags(kwargs, target), use_cache=not no_cache)
    text = analysis_text(data, markdown=markdown) if not as_json else ""
    _emit(data, as_json, text)
    return 0


def build_plan(flags, probe: bool = True) -> dict:
    """Gate, analysis, parallelism facts, meta-device cross-check and decisions: the plan as JSON data."""
    import dataclasses

    from integrate.analyzers import analyze
    from integrate.analyzers.structure import parallel_facts
    from integrate.decisions import make_plan
    from integrate.gate import run_gate
    from integrate.resolve import Workspace

    ws = Workspace()
    _progress("gate: locating classes and source files")
    report = run_gate(flags, ws)
    _progress("analyzing transformer and pipeline sources")
    analysis = analyze(report, ws)
    _progress("reading attention, block structure and sequence flow")
    facts = parallel_facts(report, ws, analysis)
    if probe:
        from integrate.crosscheck import crosscheck

        _progress("cross-checking on the meta device (builds the model without weights)")
        t_file = report.value("transformer_file")
        t_src = ws.load(Path(t_file))
        check = crosscheck(facts, t_file, report.value("transformer_class"), t_src.dotted_name,
                           report.value("model_path"), package_root=t_src.package_root)
    else:
        check = {"ok": None, "error": "skipped (--no-probe)", "disagreements": [], "checked": 0}
    facts = dataclasses.replace(facts, crosscheck=check)
    _progress("deciding CP / TP / TE-P / VAE-P and writing the plan")
    return make_plan(analysis, facts)


@main.command()
@click.argument("target", required=False)
@gate_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Folder to write PLAN.md and plan.json into (created if missing).")
@click.option("--json", "as_json", is_flag=True, help="Also print plan.json (schema: docs/schema.md).")
@click.option("--no-probe", is_flag=True, help="Skip the meta-device cross-check (no torch/diffusers import).")
def plan(target: str | None, out_dir: Path, as_json: bool, no_probe: bool, **kwargs) -> int:
    """Decide CP / TP / TE-P / VAE-P with evidence; write PLAN.md for review and plan.json for agents."""
    from integrate.decisions import render_markdown

    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir} exists and is not a folder")
    data = build_plan(_flags(kwargs, target), probe=not no_probe)
    markdown = render_markdown(data)
    _write_tree(out_dir, {"plan.json": json.dumps(data, indent=2) + "\n", "PLAN.md": markdown})
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        cp, tp = data["parallelism"]["cp"], data["parallelism"]["tp"]
        click.echo(f"plan written to {out_dir}/PLAN.md and plan.json")
        click.echo(f"  CP: {cp['approach']}, {cp['shape']}: " + ", ".join(cp["plan"]))
        click.echo(f"  TP: {tp['strategy']}: " + ", ".join(f"{x['attr']} ({x['strategy']})" for x in tp["block_lists"]))
        if data["unknowns"]:
            click.echo(f"  {len(data['unknowns'])} open question(s): see PLAN.md")
        click.echo(f"next: review PLAN.md, then `integrate approve {out_dir} --reviewer <name>`")
    return 0


@main.command()
@click.argument("plan_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--reviewer", help="Who reviewed PLAN.md and approves it.")
@click.option("--check", is_flag=True, help="Only report whether the plan is approved (exit 2 if not).")
@click.option("--json", "as_json", is_flag=True, help="Print the approval record as JSON.")
def approve(plan_dir: Path, reviewer: str | None, check: bool, as_json: bool) -> int:
    """Record a reviewer's approval of plan.json (a later edit voids it); --check tests it."""
    from integrate.approval import approval_status, require_approved
    from integrate.approval import approve as record_approval

    if check:
        require_approved(plan_dir)
        data = approval_status(plan_dir)
    else:
        if not reviewer:
            raise InputError("--reviewer NAME is required to approve (or use --check)")
        data = {**record_approval(plan_dir, reviewer), "approved": True}
    _emit({"schema_version": "1.0", "approval": data}, as_json,
          f"approved by {data.get('reviewer')} at {data.get('approved_at')} (plan.json sha256 "
          f"{data.get('plan_sha256', '')[:12]}...)")
    return 0


def _analysis_for_plan(plan: dict):
    """Re-read the model the plan was made for; refuse when its source no longer matches the plan."""
    from integrate.analyzers import analyze
    from integrate.gate import GateFlags, run_gate
    from integrate.resolve import Workspace

    m = plan["model"]
    ws = Workspace()
    report = run_gate(GateFlags.of_plan(m), ws)
    analysis = analyze(report, ws)
    now = [(b.attr, b.forward_pattern) for b in analysis.transformer.block_lists if b.is_blocks]
    planned = [(b["attr"], b["forward_pattern"]) for b in plan["cache"]["block_lists"]]
    if now != planned:
        raise InputError(f"the model's source changed since the plan was made (block lists {planned} -> {now}): "
                         "run `integrate plan` again and have it approved")
    src = ws.load(Path(m["transformer_file"]))
    return analysis, ws, src, src.classes[m["transformer_class"]]


@main.command()
@click.argument("plan_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the plugin package and the GPU test script (plugin mode: required).")
@click.option("--mode", type=click.Choice(["plugin", "checkout"]), default="plugin", show_default=True,
              help="plugin: an importable package that registers into cache-dit; checkout: edit a cache-dit tree.")
@click.option("--cache-dit-src", type=click.Path(file_okay=False, path_type=Path),
              help="checkout mode: a cache-dit source tree (repository root, src/, or the package folder).")
@click.option("--dry-run", is_flag=True, help="checkout mode: print the unified diff, change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Report what was written as JSON.")
def generate(plan_dir: Path, out_dir: Path | None, mode: str, cache_dit_src: Path | None, dry_run: bool,
             as_json: bool) -> int:
    """Write the cache-dit code an approved plan calls for (refuses an unapproved or edited plan)."""
    from integrate.approval import approval_status, require_approved

    plan = require_approved(plan_dir)
    approval = approval_status(plan_dir)
    if mode == "plugin" and out_dir is None:
        raise InputError("--out DIR is required in plugin mode")
    if mode == "checkout" and cache_dit_src is None:
        raise InputError("--cache-dit-src PATH is required in checkout mode")
    if dry_run and mode != "checkout":
        raise InputError("--dry-run applies to --mode checkout")
    if not plan["model"].get("example_name"):
        raise InputError("the plan names no example (pipeline class unknown): cannot name the generated code")
    from integrate.templates import build

    _progress("re-reading the model sources the plan was made from")
    analysis, ws, src, cls = _analysis_for_plan(plan)
    name = plan["model"]["example_name"]
    if mode == "plugin":
        import_name = f"integrate_{name}"
        gen = build(plan, approval, analysis, ws, src, cls, f"{import_name}.patch_functor", import_name)
        files = {f"{import_name}/{p.module}.py": p.text for p in gen.pieces} | gen.extra
        written = _write_tree(out_dir, files)
        data = {"mode": "plugin", "plugin": {"import_name": import_name, "path": str(out_dir.resolve()),
                                             "launcher": f"python -m {import_name} {name}"},
                "files": written}
    else:
        from integrate.checkout import apply_checkout
        from integrate.templates import checkout_layout

        gen = build(plan, approval, analysis, ws, src, cls, f"cache_dit.caching.patch_functors.functor_{name}",
                    "cache_dit.generate")
        artifacts, registrations = checkout_layout(gen, plan)
        result = apply_checkout(cache_dit_src, artifacts, registrations, dry_run=dry_run)
        written = []
        if out_dir is not None and not dry_run:
            written = _write_tree(out_dir, {"test_matrix.sh": gen.extra["test_matrix.sh"]})
        data = {"mode": "checkout", "checkout": result, "files": written}
        if dry_run and not as_json:
            click.echo(result["diff"], nl=False)
            return 0
    data.update(schema_version="1.0", registered=gen.registered, notes=gen.notes, manual=gen.manual)
    lines = [f"{data['mode']}: {len(data['files']) or len(data.get('checkout', {}).get('changed', []))} file(s)"]
    lines += [f"  registered {k}: {v}" for k, v in gen.registered.items()]
    lines += [f"  note: {n}" for n in gen.notes] + [f"  MANUAL: {x}" for x in gen.manual]
    _emit(data, as_json, "\n".join(lines))
    return 1 if gen.manual else 0


@main.command()
@click.argument("baseline", type=click.Path(path_type=Path))
@click.argument("candidate", type=click.Path(path_type=Path))
@click.option("--side-by-side", "side", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write baseline | candidate | difference (default: <candidate>.compare.png).")
@click.option("--min-psnr", type=float, help="Exit 1 when the (minimum) PSNR is at or below this.")
@click.option("--min-ssim", type=float, help="Exit 1 when the (minimum) SSIM is at or below this.")
@click.option("--json", "as_json", is_flag=True, help="Print the scores as JSON.")
def metrics(baseline: Path, candidate: Path, side: Path | None, min_psnr: float | None, min_ssim: float | None,
            as_json: bool) -> int:
    """PSNR and SSIM of CANDIDATE against BASELINE (images, GIFs or folders of frames; per frame, minimum)."""
    from integrate.verify.metrics import compare, side_by_side

    scores = compare(baseline, candidate)
    default = candidate.with_name(candidate.name + ".compare.png") if candidate.is_file() else candidate / "compare.png"
    scores["side_by_side"] = str(side_by_side(baseline, candidate, scores["worst_frame"], side or default))
    psnr = float("inf") if scores["psnr"] is None else scores["psnr"]
    failed = (min_psnr is not None and psnr <= min_psnr) or (min_ssim is not None and scores["ssim"] <= min_ssim)
    text = (f"PSNR {'inf (identical)' if scores['psnr'] is None else f'{psnr:.2f} dB'}, SSIM {scores['ssim']:.4f}"
            + (f" (minimum over {scores['frames']} frames, worst frame {scores['worst_frame']})"
               if scores["frames"] > 1 else "")
            + ("  GARBLED: PSNR looks fine but the structure is gone (SSIM < 0.5)" if scores["garbled"] else "")
            + f"\nside by side: {scores['side_by_side']}")
    _emit({"schema_version": "1.0", "metrics": scores}, as_json, text)
    return 1 if failed or scores["garbled"] else 0


@main.command()
@click.argument("plan_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--generated", "generated", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The folder `integrate generate --out` wrote the plugin into.")
@click.option("--proof", "proofs", multiple=True, type=click.Choice(["cache", "cp", "tp"]),
              help="Run only these CPU proofs (repeatable; default: all three).")
@click.option("--trust-code", is_flag=True, help="Allow running model code that is not part of an installed package.")
@click.option("--gpu", is_flag=True, help="Run the GPU matrix through cache-dit's generate CLI instead of the CPU proofs.")
@click.option("--print", "print_only", is_flag=True, help="With --gpu: print the matrix's commands, run nothing.")
@click.option("--out", "gpu_out", default=".tmp/verify-gpu", show_default=True,
              help="With --gpu: where the matrix writes its outputs.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schema: docs/schema.md).")
def verify(plan_dir: Path, generated: Path, proofs: tuple[str, ...], trust_code: bool, gpu: bool, print_only: bool,
           gpu_out: str, as_json: bool) -> int:
    """Prove the generated integration on a CPU with a tiny random-weight model: cache on/off, CP and TP over
    2 gloo processes against the 1-process run; name the first divergent module when one fails."""
    from integrate.verify.run import PROOFS, Verifier, exit_code

    if print_only and not gpu:
        raise InputError("--print goes with --gpu (it prints the GPU matrix)")
    v = Verifier(plan_dir, generated, trust_code=trust_code, proofs=proofs or PROOFS, progress=_progress)
    if gpu:
        return _verify_gpu(v, gpu_out, print_only, as_json)
    report = v.run()
    _emit(report, as_json, _verify_text(report))
    return exit_code(report)


def _verify_gpu(v, out: str, print_only: bool, as_json: bool) -> int:
    from integrate.verify import gpu

    m = v.plan["model"]
    rows = gpu.matrix(v.plan, out)
    commands = [r.command(v.import_name, m["example_name"]) for r in rows]
    setup = [f"export PYTHONPATH={v.generated.resolve()}${{PYTHONPATH:+:$PYTHONPATH}}",
             f"export {m['env_var']}={m['model_path']}", f"mkdir -p {out}"]
    data = {"schema": "integrate.verify.gpu", "schema_version": "1.0", "setup": setup, "commands": commands}
    if print_only:
        _emit(data, as_json, "\n".join(setup + commands))
        return 0
    count = gpu.gpu_count()
    if count < 1:
        data.update(status="skipped", why="no CUDA GPU on this machine: nothing was run, no figures reported")
        _emit(data, as_json, data["why"] + "\n(print the commands with --gpu --print and run them where GPUs are)")
        return 1
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(v.generated.resolve()), os.environ.get("PYTHONPATH", "")]),
               **{m["env_var"]: m["model_path"]})
    Path(out).mkdir(parents=True, exist_ok=True)
    runnable = [r for r in rows if r.gpus <= count]
    results = gpu.run_matrix(runnable, v.import_name, m["example_name"], env, _progress)
    results += [{"name": r.name, "command": r.command(v.import_name, m["example_name"]), "status": "skipped",
                 "why": f"needs {r.gpus} GPUs, {count} present", "latency_s": None, "peak_memory_gib": None}
                for r in rows if r.gpus > count]
    data.update(results=results, table=gpu.results_table(results))
    _emit(data, as_json, data["table"])
    return 1 if any(r["status"] in ("fail", "error") for r in results) else 0


def _verify_text(report: dict) -> str:
    from integrate.verify.compare import format_table

    fx = report["fixture"]
    lines = [f"fixture: {fx['status']} ({fx['path']})"]
    lines += [f"  cannot derive {e}" for e in fx.get("errors", [])]
    for name in ("state_dict", "cache", "cp", "tp"):
        r = report[name]
        head = f"{name}: {r['status'].upper()}"
        if r.get("why"):
            head += f" - {r['why']}"
        lines.append(head)
        for vname, vr in (r.get("variants") or {}).items():
            fig = f" max-abs {vr['max_abs']:.3g}, cosine {vr['cosine']:.6f}" if "max_abs" in vr else ""
            lines.append(f"  {vname}: {vr['status']}{fig}" + (f" - {vr['why']}" if vr.get("why") else ""))
        if name == "cache" and "caching_on" in r:
            on = r["caching_on"]
            lines.append(f"  caching off: {'bit-identical' if r['caching_off']['bitwise'] else 'differs'}; caching on: "
                         f"steps {on['cached_steps']} cached, max relative drift {on.get('max_rel_l2')}")
            lines += [f"  list {p['list']} {p['pattern']}: {p['status']} ({p['why']})" for p in r.get("patterns", [])]
        first = r.get("first_divergence")
        if first:
            where = first.get("module") or "unknown module"
            lines.append(f"  first divergence: {where}" + (f" ({first['error']['type']} raised {first.get('raised', '')})"
                                                           if first.get("error") else ""))
            if first.get("table"):
                lines.append(format_table(first["table"]))
    lines.append(f"{report.get('seconds', 0)} s")
    return "\n".join(lines)


def _write_tree(root: Path, files: dict[str, str]) -> list[str]:
    """Write every file or none: stage them beside the target, then move them into place."""
    import shutil
    import tempfile

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


@main.command()
@click.option("--path", "paths", multiple=True, metavar="DIR",
              help="Also survey every ModelMixin class under DIR (and its pipeline_*.py files). Repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Print the survey as JSON (schema: docs/schema.md).")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Worker processes (default: every CPU core).")
@click.option("--no-cache", is_flag=True, help="Ignore and do not write the result cache.")
@click.option("--verify", is_flag=True,
              help="Also run the CPU proof (plan, automatic scratch approval, generate, verify) for each row.")
@click.option("--only", "only", multiple=True, metavar="CLASS", help="With --verify: only these transformer classes.")
def survey(paths: tuple[str, ...], as_json: bool, jobs: int | None, no_cache: bool, verify: bool,
           only: tuple[str, ...]) -> int:
    """One row per transformer class in the installed diffusers: pipelines, cache-dit support, block
    lists and ForwardPatterns, CFG style, PatchFunctor, CP and TP (static analysis, never imports)."""
    from integrate.survey import run_survey, survey_text

    if only and not verify:
        raise InputError("--only picks the rows to verify: use it with --verify")
    data = run_survey(list(paths), jobs=jobs, use_cache=not no_cache,
                      progress=lambda line: click.echo(line, err=True))
    if only and not {r["transformer_class"] for r in data["rows"]} >= set(only):
        missing = sorted(set(only) - {r["transformer_class"] for r in data["rows"]})
        raise InputError(f"--only names no surveyed transformer class: {', '.join(missing)}")
    text = ""
    if verify:
        from integrate.verify.survey import verify_rows

        verify_rows(data, only, progress=lambda line: click.echo(line, err=True))
        if not as_json:
            text = "\n".join(f"verify {r['transformer_class']}: " + ", ".join(
                f"{k} {v}" for k, v in r["verify"].items() if k in ("status", "fixture", "state_dict", "cache", "cp",
                                                                  "tp", "why"))
                for r in data["rows"] if "verify" in r)
    _emit(data, as_json, (survey_text(data) + ("\n" + text if text else "")) if not as_json else "")
    return 0


if __name__ == "__main__":  # pragma: no cover
    main()
