"""How sequence tensors flow through the transformer's forward: the facts context parallelism needs.

For each chained block list (in forward order): which block inputs are streams, positions
(RoPE / position embeddings) or masks, and what produced each one: a forward parameter, a
sub-module (hookable), a plain method or function, or an inline expression; whether the ops
between a forward parameter and the first block are per-token (so a split at the root commutes
with them); where a value is derived from the *local* length of a sequence tensor (`.shape`,
`len`, a helper that reads `.shape`) and would drift under a root split; whether one list's
output is mixed (concatenated, rebuilt by a method) before the next list; and the module calls
after the last list up to the first reshape (the gather candidate).

`sequence_facts` reads the walks in order over one `Forward` (`sequence_forward.py`: forward's parameters,
its block loops and def-use index; who produced a value): `Walker` reads each walk (`sequence_walks.py`: its
inputs and what they derive from, how it continues the walk before it, its side modules), then `RootSplit`
and `Gather` (`sequence_split.py`) say what a split at forward's inputs and a gather after the last walk meet.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from integrate.records import Evidence
from integrate.resolve import Workspace
from integrate.source import SourceFile, dotted, find_method
from integrate.syntax import body_of, find_all, names_read, params_of, self_member, target_names, walk_statements

from .forward import documented_shapes
from .loops import Loop, find_list_uses
from .modules import Tree
from .records import BlockList, ListFlowFact, MaskFact, SequenceFact
from .sequence_forward import Forward
from .sequence_split import Gather, RootSplit, dedupe
from .sequence_walks import Walk, Walker
from .values import evaluate

def _guarded_off(fwd: cst.FunctionDef, loop: cst.For, tree: Tree) -> bool:
    """True when the walk sits under an `if` this config decides against (`if self.num_decoder_layers > 0:`
    with 0 decoder layers): the model never takes it, so it needs no split and no list of its own."""
    root = tree.nodes.get("")
    attrs = dict(root.attrs) if root is not None else {}
    for node in find_all(fwd.body, cst.If):
        test = evaluate(node.test, {}, attrs)
        if not isinstance(test, bool):
            continue
        if any(f is loop for f in find_all(node.body, cst.For)) and test is False:
            return True
        if node.orelse is not None and test is True and any(f is loop for f in find_all(node.orelse, cst.For)):
            return True
    return False


def sequence_facts(ws: Workspace, src: SourceFile, cls: cst.ClassDef, tree: Tree,
                   block_lists: tuple[BlockList, ...]) -> SequenceFact | None:
    """The walks over chained block lists in forward order, then what a split at the root and a gather after
    the last walk would meet. None when the class has no forward."""
    fwd = find_method(cls, "forward")
    if fwd is None:
        return None
    loops, every = _block_loops(src, cls, fwd, tree, block_lists)
    params = [p.name.value for p in params_of(fwd) if p.name.value != "self"]
    flow = Forward(ws, src, cls, fwd, tree, params, every)
    walker, root = Walker(flow), RootSplit(flow)
    walks: list[Walk] = []
    for bl, lp in loops:
        walks.append(walker.walk(bl, lp, walks))
    file = str(src.path)
    if not walks:
        return SequenceFact(file, src.line(fwd), tuple(params), (), (), {}, (), None, None, (), (), (),
                            unknowns=("no block list is called in a loop in forward",))
    blockers, origins, risks = root.root_check(walks[0])
    for i, w in enumerate(walks[1:], 1):  # a later walk on streams of its own: could the root split them too?
        if w.fresh_streams:
            fresh = dataclasses.replace(w, streams={p: v for p, v in w.streams.items() if p in w.fresh_streams})
            later_blockers, later_origins, later_risks = root.root_check(fresh)
            walks[i] = dataclasses.replace(w, root_params=later_origins, root_blockers=tuple(later_blockers))
            risks += later_risks if not later_blockers else []
    gather, blocked, blocked_unless_root, cut_risks = Gather(flow).gather(
        walks[-1], {v for w in walks for v in w.streams.values()})
    return SequenceFact(
        file=file, forward_line=src.line(fwd), forward_params=tuple(params), lists=_list_records(walks),
        root_blockers=tuple(blockers), root_params=origins, root_risks=tuple(dedupe(risks + cut_risks)),
        gather=gather.name if gather else None,
        gather_at=Evidence(file, gather.line, gather.code[:80]) if gather and gather.line else None,
        gather_blocked=tuple(blocked), gather_blocked_unless_root=tuple(blocked_unless_root),
        masks=tuple(_masks(flow)), batch_dropped=_batch_dropped(flow),
        optional=tuple(name for name, default in flow.defaults.items() if default == "None"),
        annotations={p.name.value: src.code(p.annotation.annotation) for p in params_of(fwd)
                     if p.annotation is not None},
        documented={k: dims for k, (dims, _) in documented_shapes(src, fwd).items()},
        gather_reads=tuple(gather.args) if gather else (),
        outside_attention=_outside_attention(ws, src, fwd, tree, walks))


def _outside_attention(ws: Workspace, src: SourceFile, fwd: cst.FunctionDef, tree: Tree,
                       walks: list[Walk]) -> dict[str, Evidence]:
    """The attention modules no split sequence reaches: not inside a walked list, not a side module its loop
    body joins in, not called in a loop body, nor called while the streams are split (between the first walk
    and the last) on a stream. cache-dit hands every attention module the parallel config, so these would run
    context-parallel attention over tensors no hook split. Index segments become `*` (elements built alike)."""
    from .attention import is_attention

    inside = {w.attr for w in walks} | {s.module for w in walks for s in w.side_modules}
    streams = {v for w in walks for v in w.streams.values()}
    first, last = min(w.loop.line for w in walks), max(w.loop_end for w in walks)
    for call in find_all(fwd, cst.Call):
        func = call.func.value if isinstance(call.func, cst.Subscript) else call.func
        member = self_member(func)
        if member is None:
            continue
        line = src.line(call)
        in_loop = any(w.loop.line <= line <= w.loop_end for w in walks)
        if in_loop or (first <= line <= last and names_read(call) & streams):
            inside.add(member.split(".")[0])
    out: dict[str, Evidence] = {}
    for path, node in tree.nodes.items():
        if not path or any(path == p or path.startswith(p + ".") for p in inside) or not is_attention(ws, node):
            continue
        if any(path.startswith(q + ".") for q in out):
            continue  # an attention module inside one already listed
        key = ".".join("*" if part.isdigit() else part for part in path.split("."))
        out.setdefault(key, Evidence(node.file, node.line, f"`{key}` ({node.cls.rsplit('.', 1)[-1]}) attends outside "
                                                           "every walked block list"))
    return out


def _block_loops(src: SourceFile, cls: cst.ClassDef, fwd: cst.FunctionDef, tree: Tree,
                 block_lists: tuple[BlockList, ...]) -> tuple[list[tuple[BlockList, Loop]], list[Loop]]:
    """The walks to read, in source order: every direct walk over a chained list in forward (a list walked in
    slices has several), but none under a branch this config never takes. And every loop in forward that
    calls a list, taken or not: statements inside any of them are per block, not before or after the blocks."""
    chained = [bl for bl in block_lists if bl.is_blocks and bl.call_site is not None]
    uses = find_list_uses(src, cls, [bl.attr for bl in chained])
    walks: list[tuple[BlockList, Loop]] = []
    every: list[Loop] = []
    for bl in chained:
        in_fwd = [lp for lp in uses[bl.attr].loops if lp.call is not None and lp.method == "forward"]
        every += in_fwd
        direct = [lp for lp in in_fwd if lp.call_skip == 0] or in_fwd[:1]
        walks += [(bl, lp) for lp in direct if not _guarded_off(fwd, lp.node, tree)]
    walks.sort(key=lambda p: p[1].line)
    return walks, every


def _list_records(walks: list[Walk]) -> tuple[ListFlowFact, ...]:
    """Each walk's record: where its output is rebuilt is what reading the walk after it found."""
    after = [w.rebuilt_before for w in walks[1:]] + [()]
    return tuple(w.record(rebuilt) for w, rebuilt in zip(walks, after))


def _batch_dropped(f: Forward) -> dict[str, Evidence]:
    """Parameters forward reduces to 2-D by dropping a batch axis (`if ids.ndim == 3: ids = ids[0]`)."""
    out: dict[str, Evidence] = {}
    for stmt in walk_statements(body_of(f.fwd)):
        if not isinstance(stmt, cst.If):
            continue
        test = f.src.code(stmt.test).replace(" ", "")
        for small in (s for line in body_of(stmt) if isinstance(line, cst.SimpleStatementLine) for s in line.body):
            if not (isinstance(small, cst.Assign) and isinstance(small.value, cst.Subscript)):
                continue
            base = small.value.value
            names = [n for t in small.targets for n in target_names(t.target)]
            if (isinstance(base, cst.Name) and base.value in f.params and names == [base.value]
                    and (f"{base.value}.ndim==3" in test or f"len({base.value}.shape)==3" in test)):
                out[base.value] = Evidence(str(f.src.path), f.src.line(stmt),
                                           f"`{f.src.code(stmt.test)}` drops the batch axis of `{base.value}`")
    return out


def _masks(f: Forward) -> list[MaskFact]:
    """Masks forward takes or builds, with their layout where the expression that builds one says."""
    out = []
    path = str(f.src.path)
    for p in f.params:
        if "mask" in p.lower():
            out.append(MaskFact(p, "forward", None, Evidence(path, f.src.line(f.fwd),
                                                             f"forward takes `{p}`")))
    for ln, names, value, _ in f.assigns:
        for n in names:
            if "mask" in n.lower() and len(names) == 1:
                out.append(MaskFact(n, "forward", mask_kind(value),
                                    Evidence(path, ln, f"`{n} = {f.src.code(value)[:60]}`")))
    return out


def mask_kind(value: cst.BaseExpression) -> str | None:
    """Layout of an attention mask from the expression that builds it: an outer product is 2-D."""
    for binop in find_all(value, cst.BinaryOperation):
        if isinstance(binop.operator, cst.MatrixMultiply):
            return "2-D mask [B, 1, S, S]"
        if isinstance(binop.operator, cst.Multiply | cst.BitAnd) and all(
                _expands(x) for x in (binop.left, binop.right)):
            return "2-D mask [B, 1, S, S]"
    for call in find_all(value, cst.Call):
        if (dotted(call.func) or "").endswith(("bmm", "matmul", "outer", "einsum")):
            return "2-D mask [B, 1, S, S]"
    for sub in find_all(value, cst.Subscript):
        nones = sum(1 for el in sub.slice if isinstance(el.slice, cst.Index) and dotted(el.slice.value) == "None")
        if nones >= 2:
            return "1-D key mask [B, 1, 1, S]"
    unsq = [c for c in find_all(value, cst.Call) if isinstance(c.func, cst.Attribute) and c.func.attr.value == "unsqueeze"]
    if unsq:
        return "1-D key mask [B, 1, 1, S]" if len(unsq) >= 2 else "1-D key mask [B, 1, S]"
    return None


def _expands(x: cst.BaseExpression) -> bool:
    """`m[:, None, :]` or `m.unsqueeze(1)`: a mask given a new axis (one side of an outer product)."""
    if isinstance(x, cst.Subscript):
        return any(isinstance(el.slice, cst.Index) and dotted(el.slice.value) == "None" for el in x.slice)
    return isinstance(x, cst.Call) and isinstance(x.func, cst.Attribute) and x.func.attr.value == "unsqueeze"
