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
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("plan.json", json.dumps(data, indent=2) + "\n"), ("PLAN.md", markdown)):
        tmp = out_dir / (name + ".tmp")
        tmp.write_text(text)
        tmp.replace(out_dir / name)
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


if __name__ == "__main__":  # pragma: no cover
    main()
