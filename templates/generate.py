"""What `integrate generate` writes for an approved plan: a plugin package under `--out`, or the same code in a
cache-dit checkout (`checkout.py`) with its test, test_matrix.sh and PR.md under `--out`.

`integrate.api.generate` loads the approval and calls these in order: `Output.check`, `example_name`, then
`write_plugin`, or `built` and `write_checkout`. PR.md is the front end's to render (`integrate.render`, which no
stage imports): `write_checkout` is handed the renderer.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from integrate.analyzers.records import Analysis
from integrate.decisions.records import Approval, Plan

from integrate.errors import InputError
from integrate.records import to_json
from integrate.resolve import Workspace

from .records import Generated, GenerateReport, PluginInfo


@dataclass(frozen=True)
class Output:
    """Where and how `integrate generate` writes (its options)."""

    mode: str = "plugin"  # "plugin" | "checkout"
    out: Path | None = None
    cache_dit_src: Path | None = None
    dry_run: bool = False
    replace_builtin: bool = False
    verify_report: Path | None = None  # a saved `integrate verify --json`, for a checkout's PR.md

    def check(self) -> None:
        """An InputError for options that are missing or do not go with the mode."""
        if self.mode == "plugin" and self.out is None:
            raise InputError("--out DIR is required in plugin mode")
        if self.mode == "checkout" and self.cache_dit_src is None:
            raise InputError("--cache-dit-src PATH is required in checkout mode")
        if self.dry_run and self.mode != "checkout":
            raise InputError("--dry-run applies to --mode checkout")
        if self.verify_report is not None and self.mode != "checkout":
            raise InputError("--verify-report applies to --mode checkout (its results go into PR.md)")
        if self.replace_builtin and self.mode != "plugin":
            raise InputError("--replace-builtin applies to plugin mode (a checkout's own registrations are its code)")


def example_name(plan: Plan) -> str:
    """The example's name, which names the plugin package and its modules; an InputError where there is none."""
    from integrate.escape import ident

    name = plan.model.example_name
    if not name:
        raise InputError("the plan names no example (pipeline class unknown): cannot name the generated code")
    ident(name)
    return name


def analysis_for_plan(plan: Plan, ws: Workspace | None = None) -> tuple[Analysis, Workspace]:
    """Re-read the model the plan was made for; an InputError when its source no longer matches the plan."""
    from integrate.analyzers.analysis import analyze as analyze_gate
    from integrate.gate import run_gate

    ws = ws or Workspace()
    analysis = analyze_gate(run_gate(plan.gate_flags, ws), ws)
    left_out = {u.attr for u in plan.cache.uncached}  # block lists the plan decided not to cache
    now = [(b.attr, b.forward_pattern) for b in analysis.transformer.block_lists
           if b.is_blocks and b.attr not in left_out]
    planned = _analysed_lists(plan)
    if now != planned:
        raise InputError(f"the model's source changed since the plan was made (block lists {planned} -> {now}): "
                         "run `integrate plan` again and have it approved")
    return analysis, ws


def _analysed_lists(plan: Plan) -> list[tuple]:
    """(attr, ForwardPattern) of each cached list as the analysis made them: a reviewer's override of either
    is the reviewer's decision, not a change in the model's source."""
    from integrate.decisions.revise import analysis_value

    lists = analysis_value(plan, "cache.block_lists", [to_json(b) for b in plan.cache.block_lists])
    return [(analysis_value(plan, f"cache.block_lists.{i}.attr", b.get("attr")),
             analysis_value(plan, f"cache.block_lists.{i}.forward_pattern", b.get("forward_pattern")))
            for i, b in enumerate(lists) if isinstance(b, dict)]


def built(plan: Plan, approval: Approval, functor_module: str | None = None,
          import_name: str = "cache_dit.generate", *, replace_builtin: bool = False,
          checkout: bool = False) -> tuple[Generated, Analysis]:
    """(the generated pieces, the analysis) of an approved plan, every source it cites read from the bytes the
    reviewer approved (or refused). A checkout's PatchFunctor goes under cache_dit.caching.patch_functors."""
    from . import build

    analysis, ws = analysis_for_plan(plan, Workspace(expect=approval.sources, source_roots=plan.model.roots))
    src = ws.load(Path(plan.model.transformer_file))
    functor_module = functor_module or f"cache_dit.caching.patch_functors.functor_{plan.model.example_name}"
    return build(plan, approval, analysis, ws, src, src.classes[plan.model.transformer_class],
                 functor_module, import_name, replace_builtin, checkout=checkout), analysis


def write_plugin(plan: Plan, approval: Approval, output: Output) -> GenerateReport:
    """The plugin package `integrate_<example>` under `output.out`, written whole or not at all; a hand-written part
    the user has filled in (no NEEDS_CODE left) is theirs and never written over."""
    from integrate.files import write_tree

    from . import MANUAL_MODULE, is_stub

    name, out = plan.model.example_name, output.out
    import_name = f"integrate_{name}"
    gen, _ = built(plan, approval, f"{import_name}.patch_functor", import_name, replace_builtin=output.replace_builtin)
    files = {f"{import_name}/{p.module}.py": p.text for p in gen.pieces} | gen.extra
    notes = list(gen.notes)
    for p in gen.pieces:
        mine = out / import_name / f"{p.module}.py"
        if p.role == MANUAL_MODULE and mine.is_file() and not is_stub(mine.read_text()):
            del files[f"{import_name}/{p.module}.py"]
            notes = [n for n in notes if not n.startswith(f"{p.module}.py is a stub")]
            notes.append(f"{p.module}.py is filled in (no NEEDS_CODE): kept as you wrote it")
    written = write_tree(out, files, whole=import_name)  # the package: absent or complete, never half
    where = str(out.resolve())
    path = os.pathsep.join([where, *_model_roots(plan)])  # the plugin, and where the model's code imports from
    launcher = f"PYTHONPATH={shlex.quote(path)} python -P -m {import_name} {name}"
    return GenerateReport("plugin", plugin=PluginInfo(import_name, where, launcher), files=tuple(written),
                          registered=gen.registered, notes=tuple(notes), manual=gen.manual)


def _model_roots(plan: Plan) -> list[str]:
    """Where the model's own code imports from, for the launcher: the plan's --source-root folders and a source
    checkout's package root (the example imports the pipeline's module by name)."""
    from integrate.workers import installed

    roots = list(plan.model.roots)
    t_file = Path(plan.model.transformer_file or "")
    if t_file.is_file() and not installed(t_file):
        # the package root the analysis named the module from (a namespace package's too, read from the file's own
        # imports), else a loose file's folder
        root = str(Workspace(source_roots=roots).load(t_file).package_root or t_file.resolve().parent)
        roots += [root] if root not in roots else []
    return roots


def write_checkout(plan: Plan, approval: Approval, output: Output, gen: Generated, analysis: Analysis,
                   pr_text: Callable[..., str]) -> GenerateReport:
    """`gen` (built for a checkout) written into the cache-dit tree at `output.cache_dit_src` (all files or none);
    with `output.out`, cache-dit's test of it, test_matrix.sh and PR.md there too (`pr_text` renders PR.md from the
    registrations, the checkout's files, the cached lists, the matrix, the test's path and what is left by hand)."""
    from integrate.files import write_tree

    from . import checkout_layout, checkout_test
    from .checkout import apply_checkout, formatted, yapf_style

    artifacts, registrations = checkout_layout(gen, plan)
    result = apply_checkout(output.cache_dit_src, artifacts, registrations, dry_run=output.dry_run)
    written, notes = [], list(gen.notes)
    if output.out is not None and not output.dry_run:
        test_rel, test_text = checkout_test(gen, plan, approval, artifacts)
        test_text = formatted(test_text, yapf_style(Path(result["package"])), test_rel)
        cached = {x.attr for x in plan.cache.block_lists}
        pr = pr_text(registered=gen.registered, files=[*result["changed"], *result["unchanged"]],
                     lists=[to_json(b) for b in analysis.transformer.block_lists if b.attr in cached],
                     matrix=gen.extra["test_matrix.sh"], test_path=test_rel, manual=list(gen.manual))
        written = write_tree(output.out, {"test_matrix.sh": gen.extra["test_matrix.sh"], "PR.md": pr,
                                          test_rel: test_text})
    elif not output.dry_run:
        notes.append("PR.md, the cache-dit test and test_matrix.sh are written with --out DIR")
    return GenerateReport("checkout", checkout=result, files=tuple(written), registered=gen.registered,
                          notes=tuple(notes), manual=gen.manual)
