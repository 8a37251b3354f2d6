"""The analysis of one model: the readers and rules of this package, run in order.

`analyze(gate, workspace)` turns the gate's five facts into an `Analysis` record: the transformer's
block lists with their ForwardPattern, the findings of the detectors in `rules/` (call-site pitfalls,
walks a wrapper breaks) with their evidence, and the pipeline's CFG style. With `parallel=True` it also
gathers what the CP / TP / TE-P / VAE-P decisions read (`structure.parallel_facts`).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import libcst as cst
from integrate.gate.records import GateReport

from integrate import __version__
from integrate.errors import InputError
from integrate.records import Evidence
from integrate.resolve import External, Resolved, Workspace
from integrate.source import SourceFile, assigned_forward, base_names, find_method

from . import rules
from .bases import delegated_forward, diffusion_pipeline, model_mixin
from .binding import CallArgs, bind
from .blocks import ListDef, find_module_lists
from .builtins import This
from .call import call_inputs
from .cfg import analyze_pipeline
from .forward import in_place_input_mutations, signature, summarize_forward
from .holder import held_as
from .library_block import library_block
from .loops import ListUse, find_list_uses
from .modules import module_tree
from .patterns import decide, stream_params
from .records import (
    ANALYSIS_SCHEMA_VERSION,
    Analysis,
    BlockList,
    CallSite,
    Finding,
    PipelineFacts,
    TransformerFacts,
)
from .rules.pitfall_c import PitfallC
from .structure import load_config, parallel_facts
from .support import cache_defaults, support_note

__all__ = ["analyze", "analyze_transformer"]


def analyze(gate: GateReport, ws: Workspace, *, parallel: bool = False) -> Analysis:
    """The analysis of the model the gate established; `parallel` adds the parallelism facts."""
    t_src = ws.load(Path(gate.value("transformer_file")))
    t_name = gate.value("transformer_class")
    transformer = analyze_transformer(ws, t_src, t_src.classes[t_name], dict(gate.block_classes),
                                      load_config(gate.value("config_file")))
    pipeline = _pipeline(ws, gate)
    support = support_note(ws, gate.value("pipeline_class"), t_name, _this(ws, t_src, t_name, pipeline), transformer,
                           pipeline.diffusers_pipeline)
    defaults = cache_defaults(ws)
    files = tuple(ws.files_read)
    return Analysis(
        schema_version=ANALYSIS_SCHEMA_VERSION,
        tool_version=__version__,
        gate=gate,
        transformer=transformer,
        pipeline=pipeline,
        already_supported=support,
        files_read=files,
        cache_defaults=defaults,
        parallel=parallel_facts(gate, ws, transformer) if parallel else None,
    )


def _this(ws: Workspace, t_src: SourceFile, t_name: str, pipeline: PipelineFacts) -> This:
    """The analysed transformer as cache-dit's built-ins are judged against it (analyzers/builtins.py)."""
    qualname = f"{t_src.dotted_name or t_src.path.stem}.{t_name}"
    cls = t_src.classes[t_name]
    return This(t_name, qualname, Evidence(str(t_src.path), t_src.line(cls), f"this is {qualname}"),
                adapter_handed=pipeline.diffusers_pipeline is False,
                planners_handed=model_mixin(ws, t_src, cls)[0] is False)


def _self_values(tree, attr: str) -> dict[str, object]:
    """What the first block of `attr` holds in its own attributes, as its return guards read them: a
    sub-module it builds is there (True), an attribute `__init__` leaves None is None. Others are not given."""
    first = tree.nodes.get(f"{attr}.0")
    if first is None:
        return {}
    out: dict[str, object] = {k: None for k, v in first.attrs.items() if v is None}
    for path in tree.nodes:
        if path.startswith(f"{attr}.0.") and "." not in path[len(attr) + 3:]:
            out[path[len(attr) + 3:]] = True
    return out


def _pipeline(ws: Workspace, gate: GateReport) -> PipelineFacts:
    """The CFG reader's facts on the denoising entry, and the pipeline rules' findings on them."""
    p_file = gate.value("pipeline_file")
    if not p_file:  # a gate without a pipeline (the survey's transformer-only rows): its source says why
        why = gate.inputs["pipeline_file"].source
        if gate.separate_cfg is not None:  # --no-pipeline: the user declared it; nothing was read
            why = (f"declared with --separate-cfg {'yes' if gate.separate_cfg else 'no'}: no pipeline loop to read "
                   "(--no-pipeline)")
            return PipelineFacts(None, gate.pipeline_entry, None, gate.separate_cfg, "medium", None,
                                 (Evidence(gate.value("transformer_file") or "", 0, why),))
        return PipelineFacts(None, gate.pipeline_entry, None, None, "unknown", None,
                             (Evidence(gate.value("transformer_file") or "", 0, why),))
    p_src = ws.load(Path(p_file))
    p_cls = (gate.value("pipeline_class") or "").split(".")[0]
    cls = p_src.classes.get(p_cls)
    t_src = ws.load(Path(gate.value("transformer_file")))
    t_cls = t_src.classes.get(gate.value("transformer_class"))
    facts = analyze_pipeline(ws, p_src, p_cls if cls is not None else None, gate.pipeline_entry,
                             (t_src, t_cls) if t_cls is not None else None)
    found = rules.run("pipeline", rules.PipelineContext(ws, p_src, gate.pipeline_entry, facts))
    entry = find_method(cls, gate.pipeline_entry) if cls is not None else p_src.functions.get(gate.pipeline_entry)
    held = held_as(ws, p_src, p_cls if cls is not None else None, gate.value("transformer_class"))
    if cls is not None:
        is_pipeline, why = diffusion_pipeline(ws, p_src, cls)
        pipeline_at = Evidence(str(p_src.path), p_src.line(cls), why)
    else:  # a sampler function: no pipeline object at all
        is_pipeline = False
        pipeline_at = Evidence(str(p_src.path), p_src.line(entry) if entry is not None else 0,
                               f"`{gate.pipeline_entry}` is a function, not a pipeline class")
    return dataclasses.replace(facts, findings=tuple(found), call_inputs=call_inputs(p_src, entry),
                               transformer_attr=held[0] if held else None,
                               transformer_attr_at=held[1] if held else None,
                               diffusers_pipeline=is_pipeline, diffusers_pipeline_at=pipeline_at)


def analyze_transformer(ws: Workspace, src: SourceFile, cls: cst.ClassDef, given: dict[str, str] | None = None,
                        config: dict | None = None) -> TransformerFacts:
    """The transformer's block lists and their verdicts; `given`: block classes the user named per list; `config`:
    the model's config (the constructor arguments that decide which code the model's flags switch off)."""
    lists = find_module_lists(ws, src, cls, given)
    unknown = sorted(set(given or {}) - {d.attr for d in lists})
    if unknown:
        raise InputError(f"--block-class {unknown[0]}=...: {cls.name.value} builds no ModuleList `self.{unknown[0]}`;"
                         f" it builds: {', '.join(d.attr for d in lists) or 'none'}")
    uses = find_list_uses(src, cls, [d.attr for d in lists], ws, config)
    forward = find_method(cls, "forward")
    chosen = assigned_forward(cls) if forward is not None and forward.name.value != "forward" else None
    said = (Evidence(str(src.path), src.line(chosen[1]), f"forward is `{chosen[0].name.value}`: {chosen[2]}"),) \
        if chosen is not None else ()
    optional = frozenset()
    if forward is not None:
        optional = frozenset(p.name for p in signature(src, forward) if p.default == "None")
    tree = functools.cache(lambda: module_tree(ws, src, cls))  # built only when a block's returns disagree
    results = [_block_list(ws, src, d, uses[d.attr], optional, tree, said) for d in lists]
    findings: list[Finding] = []
    unknowns: list[str] = []
    for bl, found in results:
        if bl.is_blocks is None:
            unknowns.append(f"{bl.attr}: {bl.why}")
        if bl.is_blocks:
            findings += found
    if forward is None:
        unknowns.append(f"{cls.name.value} defines no forward of its own")
    handed = delegated_forward(ws, src, cls, forward) if forward is not None else None
    if handed is not None:  # the walk over the blocks may be in a base class nobody here can read
        unknowns.append(f"block lists: {handed.why} ({Path(handed.file).name}:{handed.line})")
    reasons = tuple(f"{f.attr}: {f.message}" for f in findings if f.patch)
    return TransformerFacts(
        cls=cls.name.value,
        file=str(src.path),
        line=src.line(cls),
        block_lists=tuple(bl for bl, _ in results),
        needs_patch_functor=bool(reasons),
        patch_functor_reasons=reasons,
        unknowns=tuple(unknowns),
        findings=tuple(findings),
    )


def _resolve_block(ws: Workspace, el_target) -> tuple[SourceFile, cst.ClassDef] | None:
    if isinstance(el_target, Resolved) and isinstance(el_target.node, cst.ClassDef):
        return el_target.src, el_target.node
    return None


def _forward_owner(ws: Workspace, src: SourceFile, cls: cst.ClassDef, depth: int = 0):
    """The class (itself or a base) that defines forward."""
    if find_method(cls, "forward") is not None or depth > 6:
        return src, cls
    for base in base_names(cls):
        found = ws.resolve(src, base)
        if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
            return _forward_owner(ws, found.src, found.node, depth + 1)
    return src, cls


def _call_site(ctx: rules.ListContext, found: list[Finding], call_code: str, stream_args: dict[str, str],
               walk: tuple[str, ...]) -> tuple[CallSite, list[str], list[Evidence]]:
    """The chain's call site as the block-list rules found it, the list's notes (the verdict's reasons, in-place
    writes into inputs that are not streams, findings no patch answers), and the evidence it adds (the block's
    forward, the verdict's reasons at the call, pitfall C's writes)."""
    pitfall_c = next((f.evidence for f in found if f.rule == PitfallC.code), ())
    notes = list(ctx.verdict.why) + [f"{m.why} (line {m.line}); not a stream input" for _, m in ctx.mutations
                                     if m not in pitfall_c]
    notes += [f.message for f in found if not f.patch]  # a finding no patch answers is still said
    loop, pv, path = ctx.loop, ctx.verdict, str(ctx.src.path)
    line = ctx.src.line(loop.call)
    call_site = CallSite(
        file=path,
        line=line,
        loop_line=loop.line,
        call=call_code,
        stream_args=stream_args,
        outputs=loop.outputs,
        keyword_positional_mismatch=pv.mismatch,
        bindings=pv.bindings,
        loop_extra_ops=ctx.extra_ops,
        in_place_input_mutation=pitfall_c,
        walk=walk,
    )
    return call_site, notes, [*ctx.forward.evidence, *(Evidence(path, line, w) for w in pv.why), *pitfall_c]
def _verdict(d: ListDef, is_blocks: bool | None, why: str, **kw) -> BlockList:
    """The record on list `d`: `kw` over the defaults (the first element's class, unknown confidence when
    `is_blocks` is, no pattern, no call site)."""
    names = tuple(e.name for e in d.elements)
    fields = dict(block_class=names[0] if names else None, block_file=None, forward_pattern=None, alternatives=(),
                  confidence="unknown" if is_blocks is None else "high", check_forward_pattern=None, roles={},
                  forward=None, call_site=None, evidence=(), notes=())
    fields.update(kw)
    return BlockList(is_blocks=is_blocks, why=why, attr=d.attr, container=d.container, block_classes=names,
                     length=d.length, length_config_fields=d.length_fields, **fields)


def _library_first(ws: Workspace, d: ListDef, use: ListUse):
    """(first, evidence, unread) for a list none of whose elements the repository defines, when it is called in a
    loop: `first` is (element, (its source, its class)) for the first element an installed library defines that is
    a transformer block (`library_block`), else None; `evidence` says what each class read is; `unread` says why
    the list is unknown when a class of an installed library could not be read (None: every class was read, or
    the list is not called in a loop: it is judged as library modules, or not installed)."""
    if not any(lp.call is not None for lp in use.loops):
        return None, [], None
    read: list[Evidence] = []
    for e in d.elements:
        if not isinstance(e.target, External) or ws.locate(e.target.qualname)[0] is None:
            continue  # not installed (or a folder of the same name stands in its place): `_untraced` says which
        found, why = library_block(ws, e.target)
        if found is not None:
            return (e, (found.src, found.node)), [why], None
        if why is None:
            imp = d.src.imports.get(e.name.split(".")[0])
            where = f" (imported at {d.src.path.name}:{d.src.line(imp.node)})" if imp is not None else ""
            return None, read, (f"block class `{e.name}` is `{e.target.qualname}`, whose source the installed "
                                f"library does not show where it is imported from{where}: a transformer block or "
                                f"a layer, unknown; name a source with --block-class {d.attr}=path/to/file.py:Class")
        read.append(why)
    return None, read, None


def _untraced(ws: Workspace, d: ListDef) -> tuple[bool | None, str]:
    """(is_blocks, why) for a list none of whose elements resolves to a block class."""
    externals = [e for e in d.elements if isinstance(e.target, External)]
    if not d.elements and d.container == "ModuleDict of ModuleList":
        return None, "a ModuleDict of ModuleLists built by a comprehension whose keys are not known statically"
    if not d.elements:
        return None, "its elements could not be traced to a class"
    absent = [(e, said) for e in externals for path, said in [ws.locate(e.target.qualname)] if path is None]
    if absent:  # an optional library that is not installed: its classes cannot be read, whatever they are
        e, said = absent[0]
        imp = d.src.imports.get(e.name.split(".")[0])
        where = f" (imported at {d.src.path.name}:{d.src.line(imp.node)})" if imp is not None else ""
        return None, (f"block class `{e.name}` comes from `{e.target.qualname.rpartition('.')[0]}`, which {said}"
                      f"{where}: it cannot be read; name a source you have with --block-class "
                      f"{d.attr}=path/to/file.py:Class")
    if externals:
        kinds = ", ".join(sorted({e.target.qualname for e in externals}))
        return False, f"holds library modules ({kinds}): projections, embedders or norms, not blocks"
    reasons = "; ".join(getattr(e.target, "reason", "unresolved") for e in d.elements)
    return None, f"block class not traced: {reasons}"


def _block_list(ws: Workspace, src: SourceFile, d: ListDef, use: ListUse, optional: frozenset[str], tree=None,
                said: tuple[Evidence, ...] = ()) -> tuple[BlockList, list[Finding]]:
    """The verdict on one list, and the findings of the rules on it (block-list rules, then list rules).
    `tree`: the transformer's module tree, built on demand (what the block's `self.<x>` guards read); `said`:
    evidence every list carries (which method serves as forward, where `__init__` chooses it)."""
    path = str(src.path)
    evidence = [Evidence(path, d.line,
                         f"`self.{d.attr}` = {d.container}" + (" (conditional)" if d.conditional else ""))]
    evidence += said
    if d.traced:
        evidence.append(Evidence(path, d.line, f"block class {', '.join(e.name for e in d.elements)} from {d.traced}"))
    names = tuple(e.name for e in d.elements)
    resolved = [(e, _resolve_block(ws, e.target)) for e in d.elements]
    first = next(((e, r) for e, r in resolved if r is not None), None)

    def verdict(is_blocks, why, **kw):  # the evidence gathered so far, unless given
        return _verdict(d, is_blocks, why, **{"evidence": tuple(evidence), **kw})

    if first is None:
        first, read, unread = _library_first(ws, d, use)
        evidence += read
        if first is None and unread is not None:
            return verdict(None, unread), []
        if first is None:
            return verdict(*_untraced(ws, d)), []
    ctx = rules.ListContext(ws, src, d.attr, d, use, optional_inputs=optional)
    walk = rules.run("list", ctx)
    walk_text = tuple(f.message for f in walk)
    loops = [lp for lp in use.loops if lp.call is not None]
    b_src, b_cls = first[1]
    o_src, o_cls = _forward_owner(ws, b_src, b_cls)
    summary = summarize_forward(ws, o_src, o_cls)
    opaque = next((lp.opaque for lp in use.loops if lp.opaque is not None), None)
    if not loops and opaque is not None:  # walked, the block handed to a helper nobody can read: unknown
        evidence.append(Evidence(path, opaque[0], opaque[1]))
        return verdict(None, opaque[1], block_file=str(b_src.path), forward=summary, notes=walk_text), walk
    if not loops:
        where = "; ".join(w for _, _, w in use.notes) or "never looped over in the transformer's methods"
        return verdict(False, f"not iterated as a chain of blocks ({where})", block_file=str(b_src.path),
                       forward=summary, notes=walk_text), walk
    loop = next((lp for lp in loops if lp.off is None), loops[0])  # the walk the constructor's defaults run
    evidence.append(Evidence(path, loop.line, f"looped in {loop.method}: `for ... in {loop.iter_code}`"))
    evidence += [Evidence(path, lp.line, f"the walk at line {lp.line} is {lp.off.why} at line {lp.off.line}")
                 for lp in loops if lp.off is not None]
    if summary is None:
        return verdict(None, f"{o_cls.name.value} has no forward to read", block_file=str(b_src.path)), walk
    args = CallArgs.of(src, loop.call, skip=loop.call_skip, scope=loop.node.body)
    call_code = src.code(loop.call)
    evidence.append(Evidence(path, src.line(loop.call), f"block call `{call_code.splitlines()[0]}...`"
                             if "\n" in call_code else f"block call `{call_code}`"))
    try:
        direct = bind(args, summary.params)
    except Exception:
        direct = {}
    streams = stream_params(direct, loop.outputs)
    if not streams and loop.indexed:
        return verdict(None, f"the call site picks the stream out of the block's output (`{loop.indexed}`): no "
                             "ForwardPattern binds a return read that way; a PatchFunctor that returns the stream "
                             "itself is needed, or name the pattern by hand", block_file=str(b_src.path),
                       forward=summary, notes=walk_text), walk
    if not streams:
        return verdict(False, "called in a loop, but its output does not feed the next call: not a block chain",
                       block_file=str(b_src.path), forward=summary, notes=walk_text), walk
    selfs = _self_values(tree(), d.attr) if tree is not None and not summary.returns_agree else None
    pv = decide(summary, args, loop.outputs, selfs)
    ctx.loop, ctx.forward, ctx.verdict = loop, summary, pv
    ctx.mutations = tuple(in_place_input_mutations(o_src, o_cls))
    found = rules.run("block_list", ctx)
    call_site, notes, more = _call_site(ctx, found, call_code, {p: direct[p] for p in streams}, walk_text)
    notes += [f.message for f in walk if not f.patch]  # a read the constructor's defaults switch off is still said
    if len(names) > 1:
        notes.append(f"holds several block classes: {', '.join(names)}")
    evidence += more
    confidence = "medium" if len(names) > 1 and pv.confidence == "high" else pv.confidence
    return verdict(True, "a chain of blocks: each call's output feeds the next",
                   block_class=first[0].name, block_file=str(b_src.path), forward_pattern=pv.pattern,
                   alternatives=pv.alternatives, confidence=confidence if pv.pattern else "unknown",
                   check_forward_pattern=pv.check_forward_pattern, roles=pv.roles, forward=summary,
                   call_site=call_site, evidence=tuple(evidence), notes=tuple(notes)), found + walk
