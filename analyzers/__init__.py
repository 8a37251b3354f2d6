"""Static analysers (libcst). They read source text and never import the analysed code.

`analyze(gate, workspace)` turns the gate's five facts into an `Analysis` record: the
transformer's block lists with their ForwardPattern, call-site pitfalls and evidence, and
the pipeline's CFG style.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from integrate import __version__
from integrate.records import SCHEMA_VERSION, Analysis, BlockList, CallSite, Evidence, GateReport, TransformerFacts
from integrate.resolve import External, Resolved, Workspace
from integrate.source import SourceFile, base_names, find_method

from .binding import CallArgs, bind
from .blocks import ListDef, find_module_lists
from .cfg import analyze_pipeline
from .forward import in_place_input_mutations, signature, summarize_forward
from .loops import ListUse, classify_body, find_list_uses
from .patterns import decide, stream_params
from .support import support_note

__all__ = ["analyze"]


def analyze(gate: GateReport, ws: Workspace) -> Analysis:
    t_src = ws.load(Path(gate.value("transformer_file")))
    t_name = gate.value("transformer_class")
    transformer = analyze_transformer(ws, t_src, t_src.classes[t_name])
    p_src = ws.load(Path(gate.value("pipeline_file")))
    p_cls = gate.value("pipeline_class").split(".")[0]
    pipeline = analyze_pipeline(ws, p_src, p_cls if p_cls in p_src.classes else None, gate.pipeline_entry)
    support = support_note(ws, gate.value("pipeline_class"), t_name)
    return Analysis(
        schema_version=SCHEMA_VERSION,
        tool_version=__version__,
        gate=gate,
        transformer=transformer,
        pipeline=pipeline,
        already_supported=support,
        files_read=tuple(ws.files_read),
    )


def analyze_transformer(ws: Workspace, src: SourceFile, cls: cst.ClassDef) -> TransformerFacts:
    lists = find_module_lists(ws, src, cls)
    uses = find_list_uses(src, cls, [d.attr for d in lists])
    forward = find_method(cls, "forward")
    optional = set()
    if forward is not None:
        optional = {p.name for p in signature(src, forward) if p.default == "None"}
    results = [_block_list(ws, src, d, uses[d.attr], optional) for d in lists]
    reasons: list[str] = []
    unknowns: list[str] = []
    for bl in results:
        if bl.is_blocks is None:
            unknowns.append(f"{bl.attr}: {bl.why}")
        if not bl.is_blocks:
            continue
        reasons += [f"{bl.attr}: {n}" for n in _patch_reasons(bl)]
    if forward is None:
        unknowns.append(f"{cls.name.value} defines no forward of its own")
    return TransformerFacts(
        cls=cls.name.value,
        file=str(src.path),
        line=src.line(cls),
        block_lists=tuple(results),
        needs_patch_functor=bool(reasons),
        patch_functor_reasons=tuple(reasons),
        unknowns=tuple(unknowns),
    )


def _patch_reasons(bl: BlockList) -> list[str]:
    cs = bl.call_site
    out: list[str] = []
    if cs is None:
        return out
    if cs.keyword_positional_mismatch:
        out.append("pitfall A: the call site does not reach the block unchanged through cache-dit's wrapper "
                   "(call it positionally in a patched forward)")
    active = [op for op in cs.loop_extra_ops if op.active_by_default]
    if active:
        kinds = sorted({op.kind for op in active})
        out.append(f"pitfall B: {len(active)} statement(s) in the loop body besides the block call ({', '.join(kinds)})")
    if cs.in_place_input_mutation:
        out.append("pitfall C: the block writes into an input tensor in place")
    out += [w for w in cs.walk if w.startswith("restructure:")]
    return out


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


def _block_list(ws: Workspace, src: SourceFile, d: ListDef, use: ListUse, optional: set[str]) -> BlockList:
    path = str(src.path)
    evidence = [Evidence(path, d.line, f"`self.{d.attr}` = {d.container}" + (" (conditional)" if d.conditional else ""))]
    names = tuple(e.name for e in d.elements)
    externals = [e for e in d.elements if isinstance(e.target, External)]
    resolved = [(e, _resolve_block(ws, e.target)) for e in d.elements]
    first = next(((e, r) for e, r in resolved if r is not None), None)
    base = dict(attr=d.attr, container=d.container, block_classes=names, length=d.length,
                length_config_fields=d.length_fields)

    def verdict(is_blocks, why, **kw):
        fields = dict(block_class=names[0] if names else None, block_file=None, forward_pattern=None, alternatives=(),
                      confidence="unknown" if is_blocks is None else "high", check_forward_pattern=None, roles={},
                      forward=None, call_site=None, evidence=tuple(evidence), notes=())
        fields.update(kw)
        return BlockList(is_blocks=is_blocks, why=why, **base, **fields)

    if not d.elements:
        return verdict(None, "its elements could not be traced to a class")
    if externals and first is None:
        kinds = ", ".join(sorted({e.target.qualname for e in externals}))
        return verdict(False, f"holds library modules ({kinds}): projections, embedders or norms, not blocks")
    if first is None:
        reasons = "; ".join(getattr(e.target, "reason", "unresolved") for e in d.elements)
        return verdict(None, f"block class not traced: {reasons}")
    loops = [lp for lp in use.loops if lp.call is not None]
    walk = _walk_notes(d, use)
    b_src, b_cls = first[1]
    o_src, o_cls = _forward_owner(ws, b_src, b_cls)
    summary = summarize_forward(ws, o_src, o_cls)
    if not loops:
        where = "; ".join(w for _, w in use.notes) or "never looped over in the transformer's methods"
        return verdict(False, f"not iterated as a chain of blocks ({where})", block_file=str(b_src.path),
                       forward=summary, notes=tuple(walk))
    loop = loops[0]
    evidence.append(Evidence(path, loop.line, f"looped in {loop.method}: `for ... in {loop.iter_code}`"))
    if summary is None:
        return verdict(None, f"{o_cls.name.value} has no forward to read", block_file=str(b_src.path))
    args = CallArgs.of(src, loop.call, skip=loop.call_skip)
    call_code = src.code(loop.call)
    evidence.append(Evidence(path, src.line(loop.call), f"block call `{call_code.splitlines()[0]}...`"
                             if "\n" in call_code else f"block call `{call_code}`"))
    try:
        direct = bind(args, summary.params)
    except Exception:
        direct = {}
    streams = stream_params(direct, loop.outputs)
    if not streams:
        return verdict(False, "called in a loop, but its output does not feed the next call: not a block chain",
                       block_file=str(b_src.path), forward=summary, notes=tuple(walk))
    pv = decide(summary, args, loop.outputs)
    classify_body(src, loop, optional)
    mutations = in_place_input_mutations(o_src, o_cls)
    stream_roles = set(pv.roles.values())
    pitfall_c = tuple(m for m in mutations if any(f"`{r}`" in m.why for r in stream_roles))
    notes = list(pv.why) + [f"{m.why} (line {m.line}); not a stream input" for m in mutations if m not in pitfall_c]
    if len(names) > 1:
        notes.append(f"holds several block classes: {', '.join(names)}")
    evidence += list(summary.evidence)
    evidence += [Evidence(path, src.line(loop.call), w) for w in pv.why]
    evidence += list(pitfall_c)
    call_site = CallSite(
        file=path,
        line=src.line(loop.call),
        loop_line=loop.line,
        call=call_code,
        stream_args={p: direct[p] for p in streams},
        outputs=loop.outputs,
        keyword_positional_mismatch=pv.mismatch,
        bindings=pv.bindings,
        loop_extra_ops=tuple(loop.extra_ops),
        in_place_input_mutation=pitfall_c,
        walk=tuple(walk),
    )
    confidence = pv.confidence
    if len(names) > 1 and confidence == "high":
        confidence = "medium"
    return verdict(True, "a chain of blocks: each call's output feeds the next",
                   block_class=first[0].name, block_file=str(b_src.path), forward_pattern=pv.pattern,
                   alternatives=pv.alternatives, confidence=confidence if pv.pattern else "unknown",
                   check_forward_pattern=pv.check_forward_pattern, roles=pv.roles, forward=summary,
                   call_site=call_site, evidence=tuple(evidence), notes=tuple(notes))


def _walk_notes(d: ListDef, use: ListUse) -> list[str]:
    notes: list[str] = []
    loops = use.loops
    if d.container == "ModuleDict of ModuleList":
        notes.append(f"restructure: blocks live in a ModuleDict under keys {list(d.keys)}; cache-dit wraps a "
                     "ModuleList attribute, so expose each list (or merge them) in a PatchFunctor")
    if d.container == "ModuleList of ModuleList":
        notes.append("restructure: a ModuleList of ModuleLists; cache-dit wraps one flat list of blocks")
    if len(loops) > 1:
        lines = ", ".join(str(lp.line) for lp in loops)
        notes.append(f"restructure: looped over {len(loops)} times (lines {lines}); once wrapped, every loop runs "
                     "the whole cached chain")
    for lp in loops:
        if lp.sliced:
            notes.append(f"restructure: loop over a slice `{lp.iter_code}` (line {lp.line}); the wrapped list has "
                         "one element, so the slice selects the wrapper or nothing")
        if lp.zipped_with:
            notes.append(f"restructure: walked together with {', '.join(lp.zipped_with)} (line {lp.line}); "
                         "interleaved lists cannot be wrapped one at a time")
    for line, what in use.notes:
        notes.append(f"restructure: {what} (line {line}) evaluates differently once the list holds one wrapper")
    return notes
