"""The `integrate` command line: click options -> `integrate.api` (or the front ends built on it: `integrate.survey`,
`integrate.repair`) -> `integrate.render` (or JSON).

Exit codes: 0 success, 1 the analysed model fails a check, 2 the user's input is wrong (one line on
stderr, nothing written; with --json, an error that has details also prints them as JSON on stdout: a package the
model's import needs and does not find), 3 a bug in integrate.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from integrate import __version__, api
from integrate.errors import InputError
from integrate.records import to_json
from integrate.render import terminal


def _progress(message: str) -> None:
    if sys.stderr.isatty():
        click.echo(f"... {message}", err=True)


def gate_options(fn):
    """The gate flags, shared by every command that reads a model."""
    for name, help_text in reversed(
        [
            ("--model-path", ("Local model directory (model_index.json, transformer/config.json, or a config.json "
                              "naming the transformer class).")),
            ("--pipeline-class", "Pipeline class; `Class.method` or a function name for third-party loops."),
            ("--transformer-class", "Transformer class name."),
            ("--pipeline-file", "Source file that defines the pipeline class or function."),
            ("--transformer-file", "Source file that defines the transformer class."),
        ]
    ):
        fn = click.option(name, default=None, help=help_text)(fn)
    fn = click.option("--block-class", multiple=True, metavar="ATTR=[FILE.py:]Class",
                      help="The class the block list `self.ATTR` holds, where the code does not say (repeatable); "
                           "FILE.py:Class reads it from a source you have (a package that is not installed).")(fn)
    fn = click.option("--source-root", multiple=True, metavar="DIR",
                      help="A folder that holds the model's top-level package, where that is not the transformer "
                           "file's folder (what you would put on PYTHONPATH); workers import the model with it on "
                           "their path, and the plan records it for verify. Repeatable.")(fn)
    fn = click.option("--config", "config_file", default=None,
                      help="The transformer's config.json, read in place of the model folder's (then --model-path "
                           "is optional).")(fn)
    fn = click.option("--separate-cfg", type=click.Choice(["yes", "no"]), default=None,
                      help="With --no-pipeline: CFG runs as a second transformer call (yes) or batched (no).")(fn)
    fn = click.option("--no-pipeline", is_flag=True, default=False,
                      help="Integrate the transformer alone (no pipeline in the installed library); needs "
                           "--separate-cfg.")(fn)
    return fn


def _named(ctx, param, value):
    """An empty folder name would mean the working directory: refuse it."""
    if value is not None and not str(value).strip():
        raise click.BadParameter("must name a folder, not an empty string")
    return value


class _Group(click.Group):
    """Turns click's usage errors into one line and exit code 2, like every other bad input."""

    def main(self, args=None, prog_name=None, **extra):
        as_json = "--json" in (sys.argv[1:] if args is None else args)
        try:
            rv = super().main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.Abort:
            _fail("aborted", 2, prefix="integrate: ")
        except click.UsageError as exc:
            _fail(exc.format_message(), 2)
        except InputError as exc:
            if as_json and exc.details is not None:
                click.echo(json.dumps(exc.details, indent=2))
            _fail(str(exc), 2)
        except OSError as exc:  # the input or the output folder cannot be read or written
            where = f"{exc.filename}: " if exc.filename else ""
            _fail(f"{where}{exc.strerror or exc}", 2)
        except RecursionError:  # the guards bound real inputs' depth: deeper is the input's doing
            _fail("the input nests too deeply to read", 2)
        except Exception as exc:  # a bug in integrate, not the user's fault
            if os.environ.get("INTEGRATE_DEBUG"):
                raise
            _fail(f"{type(exc).__name__}: {exc} (set INTEGRATE_DEBUG=1 for the traceback)", 3,
                  prefix="integrate: internal error: ")
        sys.exit(rv or 0)


def _fail(message: str, code: int, prefix: str = "integrate: error: ") -> None:
    """One line on stderr: line breaks become spaces, other control characters are escaped."""
    text = " ".join(str(message).split("\n"))
    text = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
    click.echo(prefix + text[:2000], err=True)
    sys.exit(code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="integrate")
def main() -> None:
    """Integrate a diffusion-transformer model into cache-dit, one checked stage at a time.

    gate -> analyze -> plan -> approve -> generate -> verify. Every command runs the gate
    first. --json output follows the versioned schema in docs/schema.md.
    """
    from integrate import journal

    # the cache-dit tree Python imports may be a checkout a killed `generate --mode checkout` left half-applied:
    # every command reads it (its registries, or by running it), so it is rolled back first
    journal.settle(journal.installed_package())


def _emit(data: dict, as_json: bool, text) -> None:
    """JSON for agents, or the text `text()` renders for people."""
    click.echo(json.dumps(data, indent=2) if as_json else text())


@main.command()
@gate_options
@click.option("--json", "as_json", is_flag=True, help="Print the gate report as JSON.")
def gate(as_json: bool, **flags) -> int:
    """Check that the gate's facts are known and consistent; report where each came from."""
    from integrate.gate.records import GATE_SCHEMA_VERSION

    data = {"schema_version": GATE_SCHEMA_VERSION, "gate": to_json(api.gate(api.flags_for(**flags)))}
    _emit(data, as_json, lambda: "\n".join(terminal.gate(data["gate"])))
    return 0


@main.command()
@click.argument("target", required=False)
@gate_options
@click.option("--json", "as_json", is_flag=True, help="Print the analysis as JSON (schema: docs/schema.md).")
@click.option("--markdown", is_flag=True, help="Render the report as Markdown with evidence lines.")
@click.option("--no-cache", is_flag=True, help="Ignore and do not write the result cache.")
def analyze(target: str | None, as_json: bool, markdown: bool, no_cache: bool, **flags) -> int:
    """Static analysis of a model directory or a transformer source file (never imports it)."""
    data = api.analysis_json(api.flags_for(target, **flags), use_cache=not no_cache, progress=_progress)
    _emit(data, as_json, lambda: terminal.analysis(data, markdown=markdown))
    # no list the analysis established as blocks: nothing for the cache to wrap, the model fails the check
    return 0 if any(bl["is_blocks"] for bl in data["transformer"]["block_lists"]) else 1


@main.command()
@click.argument("target", required=False)
@gate_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=str), required=True, callback=_named,
              help="Folder to write PLAN.md and plan.json into (created if missing).")
@click.option("--json", "as_json", is_flag=True, help="Also print plan.json (schema: docs/schema.md).")
@click.option("--no-probe", is_flag=True, help="Skip the meta-device cross-check (no torch/diffusers import).")
@click.option("--trust-code", is_flag=True,
              help="Let the meta-device check build a model that is not part of an installed package (runs its code).")
def plan(target: str | None, out_dir: str, as_json: bool, no_probe: bool, trust_code: bool, **flags) -> int:
    """Decide CP / TP / TE-P / VAE-P with evidence; write PLAN.md for review and plan.json for agents."""
    out_dir = Path(out_dir)
    api.check_out_dir(out_dir)  # before the analysis, not after it
    record = api.plan(api.flags_for(target, **flags), probe=not no_probe, trust_code=trust_code, progress=_progress)
    api.write_plan(record, out_dir)
    data = to_json(record)
    _emit(data, as_json, lambda: terminal.plan(data, out_dir))
    # no block list to cache: the files are written (a reviewer reads why), and the model fails the check
    return 0 if record.cache.block_lists else 1


@main.command()
@click.argument("plan_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--reviewer", help="Who reviewed PLAN.md and approves it.")
@click.option("--check", is_flag=True, help="Only report whether the plan is approved (exit 2 if not).")
@click.option("--json", "as_json", is_flag=True, help="Print the approval record as JSON.")
def approve(plan_dir: Path, reviewer: str | None, check: bool, as_json: bool) -> int:
    """Record a reviewer's approval of plan.json (a later edit voids it); --check tests it."""
    if check:
        status = api.approval(plan_dir)
    elif not reviewer:
        raise InputError("--reviewer NAME is required to approve (or use --check)")
    else:
        status = api.approve(plan_dir, reviewer)
    data = {"schema_version": "1.0", "approval": to_json(status)}
    _emit(data, as_json, lambda: terminal.approval(data["approval"]))
    return 0


@main.command()
@click.argument("plan_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="A value to change: KEY a dotted path into plan.json (cache.has_separate_cfg, "
                   "facts.attention.0.head_dim.1; a part with a dot in brackets: "
                   "parallelism.cp.plan[\"blocks.*\"]), VALUE JSON or plain text. Repeatable.")
@click.option("--unset", "unsets", multiple=True, metavar="KEY",
              help="An entry to take out of a mapping (a CP split of a stream, a TP layer plan entry). Repeatable.")
@click.option("--why", required=True, help="Why the analysis's value is wrong (recorded with the override).")
@click.option("--reviewer", required=True, help="Who makes the change.")
@click.option("--json", "as_json", is_flag=True, help="Print what was revised as JSON.")
def revise(plan_dir: Path, assignments: tuple[str, ...], unsets: tuple[str, ...], why: str, reviewer: str,
           as_json: bool) -> int:
    """Change decisions of a plan: checked against the plan's types, recorded beside what the analysis said;
    PLAN.md is rendered again and the approval voided."""
    record = api.revise(plan_dir, list(assignments), unsets=list(unsets), why=why, reviewer=reviewer)
    data = {"schema_version": "1.0", "revision": to_json(record)}
    _emit(data, as_json, lambda: terminal.revised(data["revision"]))
    return 0


@main.command()
@click.argument("plan_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=str), callback=_named,
              help="Folder for the plugin package and the GPU test script (plugin mode: required); checkout "
                   "mode: PR.md, the cache-dit test and the GPU test script.")
@click.option("--mode", type=click.Choice(["plugin", "checkout"]), default="plugin", show_default=True,
              help="plugin: an importable package that registers into cache-dit; checkout: edit a cache-dit tree.")
@click.option("--cache-dit-src", type=click.Path(file_okay=False, path_type=Path),
              help="checkout mode: a cache-dit source tree (repository root, src/, or the package folder).")
@click.option("--dry-run", is_flag=True, help="checkout mode: print the unified diff, change nothing.")
@click.option("--replace-builtin", is_flag=True,
              help="plugin mode: register ours ahead of (and over) cache-dit's own integration of a model it "
                   "supports, so verify proves ours.")
@click.option("--verify-report", type=click.Path(dir_okay=False, path_type=Path),
              help="checkout mode: a saved `integrate verify --json` of the plugin from the same plan; its "
                   "results go into PR.md.")
@click.option("--json", "as_json", is_flag=True, help="Report what was written as JSON.")
def generate(plan_dir: Path, out_dir: str | None, mode: str, cache_dit_src: Path | None, dry_run: bool,
             replace_builtin: bool, verify_report: Path | None, as_json: bool) -> int:
    """Write the cache-dit code an approved plan calls for (refuses an unapproved or edited plan)."""
    out_dir = Path(out_dir) if out_dir is not None else None
    report = api.generate(plan_dir, out=out_dir, mode=mode, cache_dit_src=cache_dit_src, dry_run=dry_run,
                          replace_builtin=replace_builtin, verify_report=verify_report, progress=_progress)
    data = to_json(report)
    if dry_run and not as_json:
        click.echo(data["checkout"]["diff"], nl=False)
        return 0
    _emit(data, as_json, lambda: terminal.generate(data))
    return 1 if report.manual else 0


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
    report = api.metrics(baseline, candidate, side)
    scores = report.metrics
    psnr = float("inf") if scores.psnr is None else scores.psnr
    failed = (min_psnr is not None and psnr <= min_psnr) or (min_ssim is not None and scores.ssim <= min_ssim)
    data = to_json(report)
    _emit(data, as_json, lambda: terminal.metrics(data["metrics"]))
    return 1 if failed or scores.garbled else 0


def _proof_choices(which: str = "CHOICES") -> list[str]:
    """`--proof` choices from the proof registry: `CHOICES` (verify), `REPAIRABLE` (repair), `AUDITED` (audit)."""
    from integrate.verify import proofs

    return list(getattr(proofs, which))


@main.command()
@click.argument("plan_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--generated", "generated", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The folder `integrate generate --out` wrote the plugin into.")
@click.option("--proof", "proofs", multiple=True, type=click.Choice(_proof_choices()),
              help="Run only these CPU proofs (repeatable; default: all).")
@click.option("--fixture-from", "fixture_from", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A diffusers-style model test (get_init_dict / get_dummy_inputs) to take the fixture from "
                   "first; it is run, so it needs --trust-code.")
@click.option("--cache-dit-own", is_flag=True,
              help="Prove cache-dit's own integration of a model it supports: the generated plugin is not imported.")
@click.option("--fixture-only", is_flag=True,
              help="Derive (or check) the fixture and run the plain tiny model on it once; no proof.")
@click.option("--trust-code", is_flag=True, help="Allow running model code that is not part of an installed package.")
@click.option("--gpu", is_flag=True, help="Run the GPU matrix through cache-dit's generate CLI instead of the CPU proofs.")
@click.option("--print", "print_only", is_flag=True, help="With --gpu: print the matrix's commands, run nothing.")
@click.option("--out", "gpu_out", default=".tmp/verify-gpu", show_default=True,
              help="With --gpu: where the matrix writes its outputs.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schema: docs/schema.md).")
def verify(plan_dir: Path, generated: Path, proofs: tuple[str, ...], fixture_from: Path | None, cache_dit_own: bool,
           fixture_only: bool, trust_code: bool, gpu: bool, print_only: bool, gpu_out: str, as_json: bool) -> int:
    """Prove the generated integration on a CPU with a tiny random-weight model: cache on/off, CP and TP over
    2 gloo processes against the 1-process run; name the first divergent module when one fails."""
    if print_only and not gpu:
        raise InputError("--print goes with --gpu (it prints the GPU matrix)")
    if fixture_only and (proofs or gpu):
        raise InputError("--fixture-only runs no proof: leave out --proof and --gpu")
    if gpu:
        report = api.verify_gpu(plan_dir, generated, out=gpu_out, print_only=print_only, trust_code=trust_code,
                                progress=_progress)
        data = to_json(report)
        _emit(data, as_json, lambda: terminal.verify_gpu(data))
        return 1 if report.failed else 0
    report = api.verify(plan_dir, generated, proofs=proofs or None, trust_code=trust_code, fixture_only=fixture_only,
                        fixture_from=fixture_from, cache_dit_own=cache_dit_own, progress=_progress)
    data = to_json(report)
    _emit(data, as_json, lambda: terminal.verify(data))
    return 1 if report.failed else 0


@main.command()
@click.argument("plan_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--generated", "generated", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The folder `integrate generate --out` wrote (whose verify failed).")
@click.option("--proof", "proofs", multiple=True, type=click.Choice(_proof_choices("REPAIRABLE")),
              help=f"Only these proofs (default: {', '.join(_proof_choices('REPAIRABLE'))}). Repeatable.")
@click.option("--max-candidates", type=click.IntRange(min=1), default=8, show_default=True,
              help="At most this many alternatives tried (each one proof run).")
@click.option("--max-seconds", type=click.FloatRange(min=1), default=300, show_default=True,
              help="Stop trying candidates after this long.")
@click.option("--fixture-from", "fixture_from", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The model test verify took the fixture from (as for `integrate verify`); it is run, so it "
                   "needs --trust-code.")
@click.option("--trust-code", is_flag=True, help="Run a model that is not part of an installed package.")
@click.option("--json", "as_json", is_flag=True, help="Print the repair report as JSON (schema: docs/schema.md).")
def repair(plan_dir: Path, generated: Path, proofs: tuple[str, ...], max_candidates: int, max_seconds: float,
           fixture_from: Path | None, trust_code: bool, as_json: bool) -> int:
    """After a failed verify: try the plan's alternatives on the failing proof, one at a time, and propose the
    smallest revision that passes (never approved: take it with `integrate revise`)."""
    from integrate.repair import repair as run_repair

    report = run_repair(plan_dir, generated, proofs=proofs or tuple(_proof_choices("REPAIRABLE")),
                        max_candidates=max_candidates,
                        max_seconds=max_seconds, fixture_from=fixture_from, trust_code=trust_code,
                        progress=_progress)
    data = {"schema_version": report.schema_version, "repair": to_json(report)}
    _emit(data, as_json, lambda: terminal.repair(data["repair"]))
    return 1 if report.failed else 0


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
    if only and not verify:
        raise InputError("--only picks the rows to verify: use it with --verify")
    from integrate.survey import run_survey

    report = run_survey(list(paths), jobs=jobs, use_cache=not no_cache, verify_only=only if verify else None,
                        progress=lambda line: click.echo(line, err=True))
    data = to_json(report)
    _emit(data, as_json, lambda: terminal.survey(data))
    return 0


@main.command()
@click.option("--only", "only", multiple=True, metavar="CLASS", help="Only these transformer classes (repeatable).")
@click.option("--proof", "proofs", multiple=True, type=click.Choice(_proof_choices()),
              help="The proofs to run on both integrations (repeatable; default: cache, cp, tp).")
@click.option("--no-cache", is_flag=True, help="Ignore and do not write the result cache.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Rows proved at once, each in a process of its own (default: half the cores).")
@click.option("--fix", is_flag=True,
              help="With --only CLASS: write ours over cache-dit's integration where the audit finds it wrong, into "
                   "--cache-dit-src, with a regression test (fails before, passes after) and PR.md under --out.")
@click.option("--cache-dit-src", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="With --fix: the cache-dit source tree (repo root, its src/, or the cache_dit package).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="With --fix: where PR.md, fix.diff and the regression test are written.")
@click.option("--json", "as_json", is_flag=True, help="Print the audit as JSON (schema: docs/schema.md).")
def audit(only: tuple[str, ...], proofs: tuple[str, ...], no_cache: bool, jobs: int | None, fix: bool,
          cache_dit_src: Path | None, out_dir: Path | None, as_json: bool) -> int:
    """Prove every integration the installed cache-dit ships side by side with ours: the same CPU proofs on
    the same fixture. A proof cache-dit's own integration fails is a finding (exit 1), with the commands that
    reproduce it. With --fix (one class): the fix, written into a cache-dit checkout (exit 0 when written)."""
    from integrate.survey.audit import DEFAULT_PROOFS, run_audit

    if not fix and (cache_dit_src is not None or out_dir is not None):
        raise InputError("--cache-dit-src and --out go with --fix")
    if fix:
        if cache_dit_src is None or out_dir is None:
            raise InputError("--fix needs --cache-dit-src PATH (the checkout to fix) and --out DIR (PR.md, the test)")
        from integrate.survey.fix import run_fix

        result = run_fix(tuple(only), cache_dit_src, out_dir, tuple(proofs or DEFAULT_PROOFS),
                         lambda line: click.echo(line, err=True))
        data = to_json(result)
        _emit(data, as_json, lambda: terminal.audit_fix(data))
        return 1 if result.failed else 0
    report = run_audit(only, proofs or DEFAULT_PROOFS, use_cache=not no_cache, jobs=jobs,
                       progress=lambda line: click.echo(line, err=True))
    data = to_json(report)
    _emit(data, as_json, lambda: terminal.audit(data))
    return 1 if report.failed else 0


if __name__ == "__main__":  # pragma: no cover
    main()
