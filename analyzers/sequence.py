"""How sequence tensors flow through the transformer's forward: the facts context parallelism needs.

For each chained block list (in forward order): which block inputs are streams, positions
(RoPE / position embeddings) or masks, and what produced each one: a forward parameter, a
sub-module (hookable), a plain method or function, or an inline expression; whether the ops
between a forward parameter and the first block are per-token (so a split at the root commutes
with them); where a value is derived from the *local* length of a sequence tensor (`.shape`,
`len`, a helper that reads `.shape`) and would drift under a root split; whether one list's
output is mixed (concatenated, rebuilt by a method) before the next list; and the module calls
after the last list up to the first reshape (the gather candidate).

`sequence_facts` reads the walks in order and asks one reader per concern, each over the same
`_Forward` (forward's parameters, its block loops and its def-use index; who produced a value):
`_Walker` (one walk: its inputs, how it continues the walk before it, the blocks it visits),
`_Derivation` (the forward parameters and sequence lengths an input derives from), `_SideModules`
(modules the loop body joins into a stream), `_RootSplit` (whether a split at forward's inputs
commutes with what runs before the first block) and `_Gather` (the module to gather behind).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from integrate.defuse import ALL, ASSIGNS, GROWS, Def, defuse
from integrate.records import Evidence
from integrate.resolve import Resolved, Workspace
from integrate.source import SourceFile, dotted, find_method, iter_methods
from integrate.syntax import body_of, find_all, names_read, params_of, self_member, target_names, walk_statements

from .binding import BindError, CallArgs, bind
from .forward import documented_shapes, signature
from .loops import Loop, find_list_uses
from .modules import Tree
from .patterns import stream_params
from .records import BlockInputFact, BlockList, ListFlowFact, MaskFact, SequenceFact, SideModule
from .values import evaluate, is_known

POSITION_WORDS = ("rotary", "rope", "freqs", "pos_emb", "pos_embed", "position", "pe")
_PASSTHROUGH = {"to", "type_as", "float", "half", "bfloat16", "contiguous", "clone", "detach"}
_TOKENWISE_LIBRARY = {"Linear", "LayerNorm", "RMSNorm", "SiLU", "GELU", "ReLU", "Tanh", "Mish", "Dropout",
                      "Identity", "ModuleList", "Sequential", "LazyLinear", "Sigmoid"}
_CONV_NDIM = {"Conv1d": 3, "Conv2d": 4, "Conv3d": 5, "ConvTranspose1d": 3, "ConvTranspose2d": 4, "ConvTranspose3d": 5}
_RESHAPE = {"reshape", "view", "permute", "unflatten", "flatten", "transpose", "unbind", "split", "chunk",
            "squeeze", "unsqueeze"}


@dataclass(frozen=True)
class Producer:
    """What produced a value forward reads: the checks judge its kind and the names it was built from."""

    kind: str  # "param" | "module" | "method" | "function" | "expression" | "list_output" | "unknown"
    name: str | None
    line: int | None
    code: str = ""
    args: list[str] = field(default_factory=list)  # names read by the producing expression
    outputs: int | None = None  # tensors it returns when it returns a tuple (None: one value / unknown)
    leading: bool = False  # the value is `x.flatten(0, k)`: leading (grid) axes merged into dim 0
    ndims: tuple[int | None, ...] = ()  # each element's rank, for a tuple built inline


@dataclass(frozen=True)
class _Walk:
    """One walk over a block list, as it is read in forward order.

    It holds its ListFlowFact's fields but the two the NEXT walk decides (whether this walk's output is
    rebuilt before it: `mixed_after`, `mixing`), and what the checks after the walks read that the record
    does not keep: the loop, where its body ends, and each input's producer."""

    attr: str
    loop: Loop
    loop_end: int  # last line of the loop body
    streams: dict[str, str]  # block param -> loop variable
    inputs: tuple[BlockInputFact, ...]
    producers: tuple[Producer, ...]  # what produced each input, in the same order
    fresh_streams: frozenset[str]  # block params whose stream is not already split by an earlier walk
    after: str | None  # the earlier list whose outputs it continues
    rebuilt_before: tuple[Evidence, ...]  # where the sequence is rebuilt between the previous walk and this one
    side_modules: tuple[SideModule, ...]
    offset: int | None  # index of the first block this walk visits (a slice `lst[-k:]` starts at n - k)
    last: int | None  # index of the last block it visits
    root_params: dict[str, str] = field(default_factory=dict)  # a later fresh walk's root check
    root_blockers: tuple[Evidence, ...] = ()

    def record(self, rebuilt_after: tuple[Evidence, ...]) -> ListFlowFact:
        """The frozen record, once the next walk (if any) has said where this one's output is rebuilt."""
        return ListFlowFact(self.attr, self.loop.line, dict(self.streams), self.inputs, bool(self.fresh_streams),
                            self.after, bool(rebuilt_after), rebuilt_after, self.side_modules,
                            tuple(sorted(self.fresh_streams)), self.offset, self.last, dict(self.root_params),
                            self.root_blockers)


def is_position(name: str) -> bool:
    low = name.lower()
    parts = low.replace(".", "_").split("_")
    return any(w in low for w in POSITION_WORDS if len(w) > 2) or "pe" in parts


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
    flow = _Forward(ws, src, cls, fwd, tree, params, every)
    walker, root = _Walker(flow), _RootSplit(flow)
    walks: list[_Walk] = []
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
    gather, blocked, blocked_unless_root, cut_risks = _Gather(flow).gather(
        walks[-1], {v for w in walks for v in w.streams.values()})
    return SequenceFact(
        file=file, forward_line=src.line(fwd), forward_params=tuple(params), lists=_list_records(walks),
        root_blockers=tuple(blockers), root_params=origins, root_risks=tuple(_dedupe(risks + cut_risks)),
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
                       walks: list[_Walk]) -> dict[str, Evidence]:
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


def _list_records(walks: list[_Walk]) -> tuple[ListFlowFact, ...]:
    """Each walk's record: where its output is rebuilt is what reading the walk after it found."""
    after = [w.rebuilt_before for w in walks[1:]] + [()]
    return tuple(w.record(rebuilt) for w, rebuilt in zip(walks, after))


class _Forward:
    """The forward being read: its parameters, the loops in it that call a block list (their bodies run per
    block), its def-use index statement by statement, and who produced a value it hands on."""

    def __init__(self, ws, src: SourceFile, cls: cst.ClassDef, fwd: cst.FunctionDef, tree: Tree, params: list[str],
                 loops: list[Loop]):
        self.ws, self.src, self.cls, self.fwd, self.tree, self.params = ws, src, cls, fwd, tree, params
        self.methods = {fn.name.value for fn in iter_methods(cls)}
        self.loop_spans = [(lp.line, self.end_line(lp.node)) for lp in loops]
        self.defaults = {p.name.value: (src.code(p.default) if p.default is not None else None) for p in params_of(fwd)}
        self.index = defuse(src, fwd)
        # every binding in forward, a `for` target bound to its iterable: (line, names, value, node)
        self.assigns = [(line, list(names), value, node) for line, names, value, node in self.index.statements()]

    def end_line(self, node: cst.CSTNode) -> int:
        return max([self.src.line(node)] + [self.src.line(s) for s in walk_statements(body_of(node))
                                            if not isinstance(s, cst.IndentedBlock)])

    def in_loop(self, line: int) -> bool:
        return any(a <= line <= b for a, b in self.loop_spans)

    def defs_before(self, name: str, line: int, lo: int = 0) -> list[Def]:
        """Definitions of `name` in [lo, line) (a `for` target's is its iterable), in order; outside block loops
        unless the range is inside one."""
        inside = lo > 0 and self.in_loop(lo)
        return [d for d in self.index.before(name, line, ALL) if lo <= d.line and (inside or not self.in_loop(d.line))]

    def reach(self, name: str, line: int):
        """What fed `name` at `line`, walked back through forward's definitions outside the block loops."""
        return self.index.reach(name, line, keep=lambda d: not self.in_loop(d.line))

    def producer_of(self, arg: str, loop: Loop) -> tuple[Producer, bool]:
        if arg in self.params and not self.defs_before(arg, loop.line):
            return Producer("param", arg, None), False
        in_body = self.defs_before(arg, self.end_line(loop.node) + 1, lo=loop.line + 1)
        if in_body:
            return self.classify(in_body[-1].whole, in_body[-1].line, list(in_body[-1].bound), arg), True
        defs = self.defs_before(arg, loop.line)
        if not defs:
            return Producer("unknown", arg, None), False
        return self.classify(defs[-1].whole, defs[-1].line, list(defs[-1].bound), arg), False

    def classify(self, value: cst.BaseExpression, line: int, names: list[str], target: str) -> Producer:
        code = self.src.code(value)
        reads = sorted(names_read(value) - {"self"})
        call = _unwrap(value)
        if isinstance(value, cst.IfExp):
            call = _unwrap(value.body)
        outputs = len(names) if len(names) > 1 else None
        if isinstance(call, cst.Call):
            func = call.func
            if isinstance(func, cst.Subscript):
                func = func.value
            member = self_member(func)
            name = dotted(func) or ""
            if member is not None:
                attr = member.split(".")[0]
                if attr in self.tree.nodes:
                    return Producer("module", attr, line, code, reads, outputs)
                if attr in self.methods:
                    return Producer("method", attr, line, code, reads, outputs)
            elif name and "." not in name:
                return Producer("function", name, line, code, reads, outputs)
        ndims: tuple[int | None, ...] = ()
        if isinstance(call, cst.Tuple) and all(isinstance(e, cst.Element) for e in call.elements):
            outputs = len(call.elements)  # `image_rotary_emb = (cos, sin)`: a tuple of tensors, one spec each
            from .ndim import ndim_of

            ndims = tuple(ndim_of(self.ws, self.src, self.fwd, e.value, self.cls, before=line) for e in call.elements)
        leading = (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                   and call.func.attr.value == "flatten" and bool(call.args) and call.args[0].keyword is None
                   and isinstance(call.args[0].value, cst.Integer) and call.args[0].value.value == "0")
        return Producer("expression", target, line, code, reads, outputs, leading, ndims)

    def rank_of(self, arg: str, line: int) -> int | None:
        """The rank of a plain name passed to the blocks, read from the code that builds it."""
        if not arg.isidentifier():
            return None
        from .ndim import ndim_of

        try:
            return ndim_of(self.ws, self.src, self.fwd, cst.Name(arg), self.cls, before=line)
        except (RecursionError, ValueError):
            return None


class _Derivation:
    """Where a value forward hands the blocks comes from: the forward parameters it is built from and the
    sequence lengths read on the way (each would drift once the sequence is split)."""

    def __init__(self, f: _Forward):
        self.f = f

    def derivation(self, arg: str, line: int) -> tuple[set[str], list[Evidence]]:
        """Forward parameters `arg` derives from, and reads of a sequence length on the way."""
        params: set[str] = set()
        lengths: list[Evidence] = []
        for name, _, found in self.f.reach(arg, line):
            if found is not None:
                lengths += self.length_reads(found.whole, found.line)
            elif name in self.f.params:
                params.add(name)
        return params, lengths

    def token_params(self, arg: str, line: int) -> set[str]:
        """Forward parameters `arg` derives from whose `.shape[1]` is read on the way (a per-token axis)."""
        out: set[str] = set()
        fed = {name for name, _, _ in self.f.reach(arg, line)}
        for ln, _, value, node in self.f.assigns:
            if ln >= line or self.f.in_loop(ln):
                continue
            for sub in find_all(value, cst.Subscript):
                base = sub.value
                if (isinstance(base, cst.Attribute) and base.attr.value == "shape" and isinstance(base.value, cst.Name)
                        and base.value.value in self.f.params and len(sub.slice) == 1
                        and isinstance(sub.slice[0].slice, cst.Index)
                        and isinstance(sub.slice[0].slice.value, cst.Integer) and sub.slice[0].slice.value.value == "1"
                        and base.value.value in fed):
                    if not self.f.defs_before(base.value.value, ln):
                        out.add(base.value.value)
        return out

    def length_reads(self, value: cst.BaseExpression, line: int) -> list[Evidence]:
        """`x.shape`, `x.size(..)`, `len(x)` on a tensor-valued name, or a helper that reads `.shape`."""
        out = []
        batch_only = set()
        for sub in find_all(value, cst.Subscript):
            if (isinstance(sub.value, cst.Attribute) and sub.value.attr.value == "shape" and len(sub.slice) == 1
                    and isinstance(sub.slice[0].slice, cst.Index) and isinstance(sub.slice[0].slice.value, cst.Integer)
                    and sub.slice[0].slice.value.value == "0"):
                batch_only.add(id(sub.value))
        for call in find_all(value, cst.Call):
            if (isinstance(call.func, cst.Attribute) and call.func.attr.value == "size" and call.args
                    and isinstance(call.args[0].value, cst.Integer) and call.args[0].value.value == "0"):
                batch_only.add(id(call.func))
        for attr in find_all(value, cst.Attribute):
            if attr.attr.value in ("shape", "size") and isinstance(attr.value, cst.Name) and id(attr) not in batch_only:
                out.append(Evidence(str(self.f.src.path), line, f"reads the length of `{attr.value.value}` "
                                    f"(`{self.f.src.code(value)[:70]}`)"))
        for call in find_all(value, cst.Call):
            name = dotted(call.func) or ""
            if name == "len" and call.args and isinstance(call.args[0].value, cst.Name):
                out.append(Evidence(str(self.f.src.path), line, f"`{self.f.src.code(call)}`"))
            elif name and "." not in name and name not in ("len", "int", "max", "min"):
                found = self.f.ws.resolve(self.f.src, name)
                if isinstance(found, Resolved) and isinstance(found.node, cst.FunctionDef):
                    reads = [a for a in find_all(found.node.body, cst.Attribute) if a.attr.value == "shape"]
                    if reads:
                        out.append(Evidence(str(self.f.src.path), line, f"`{name}(...)` reads `.shape` of its "
                                            f"arguments ({found.src.path.name}:{found.src.line(reads[0])})"))
        return out

    def per_token_mask(self, bl: BlockList, fact: BlockInputFact, streams: dict[str, str],
                       loop: Loop) -> Evidence | None:
        """A mask-named block input that is one value per token, not an attention mask: forward builds it as
        `torch.zeros(batch, <stream>.shape[1])` (the stream's length as its last dim) and the block never hands
        it to a call as a `*mask*` keyword (BriaFibo2's `noise_mask`, which picks each token's modulation)."""
        defs = self.f.defs_before(fact.arg, loop.line)
        call = _unwrap(defs[-1].whole) if defs else None
        if not (isinstance(call, cst.Call) and dotted(call.func) in ("torch.zeros", "torch.ones", "torch.full",
                                                                       "torch.empty")):
            return None
        sizes = [a.value for a in call.args if a.keyword is None]
        if dotted(call.func) == "torch.full":
            sizes = sizes[:1]
            sizes = list(sizes[0].elements) if sizes and isinstance(sizes[0], cst.Tuple | cst.List) else []
            sizes = [e.value for e in sizes]
        last = sizes[-1] if len(sizes) == 2 else None
        length = (isinstance(last, cst.Subscript) and isinstance(last.value, cst.Attribute)
                  and last.value.attr.value == "shape" and dotted(last.value.value) in set(streams.values())
                  and self.f.src.code(last.slice[0].slice).strip() == "1")
        if not length or _hands_to_mask(self.f.ws, bl, fact.param) is not False:
            return None
        return Evidence(str(self.f.src.path), defs[-1].line, f"`{fact.arg}` is built one value per token of "
                        f"`{dotted(last.value.value)}` (`{self.f.src.code(call)[:60]}`) and the block uses it as such, "
                        "never as an attention mask")


class _SideModules:
    """The modules a walk's loop body joins into a stream, and the rank of what each returns."""

    def __init__(self, f: _Forward):
        self.f = f

    def side_modules(self, loop: Loop, streams: set[str]) -> list[SideModule]:
        """Modules whose output the loop body joins into a stream (`cat([enc, proj_i(...)])`)."""
        path = str(self.f.src.path)
        body_assigns = [(ln, names, value) for ln, names, value, _ in self.f.assigns
                        if loop.line < ln <= self.f.end_line(loop.node)]
        side: set[str] = set()
        for ln, names, value in body_assigns:
            if set(names) & streams and (loop.block_var or "") not in names_read(value):
                side |= names_read(value) - streams - {"self", loop.index_var or "", loop.block_var or ""}
        for ln, names, value in body_assigns:  # one step back inside the body: `cur = layers[i]`
            if set(names) & side:
                side |= names_read(value) - streams - {"self", loop.index_var or ""}
        closure = set(side)
        found: list[SideModule] = []
        for _ in range(6):
            grew = False
            # every `=` and `xs.append(v)` before the loop, outside block loops, that feeds the closure
            for line, names, value, small in self.f.index.statements(ASSIGNS | GROWS):
                if line >= loop.line or self.f.in_loop(line) or not (set(names) & closure):
                    continue
                # what flows into a side module's input: not a name read for its device or dtype, and
                # not a stream itself (already split; its own producers are no side modules)
                new = names_read(value, data_only=True) - {"self"} - closure - streams
                if new:
                    closure |= new
                    grew = True
                for call in find_all(value, cst.Call):
                    func = call.func
                    indexed = isinstance(func, cst.Subscript)
                    member = self_member(func.value if indexed else func)
                    if member in self.f.tree.nodes:
                        entry = SideModule(member, indexed, Evidence(
                            path, line, f"`{self.f.src.code(small)[:70]}` feeds a tensor the loop body joins "
                            "into a stream"), self.output_ndim(f"{member}.0" if indexed else member, call, line))
                        if all(e.module != entry.module for e in found):
                            found.append(entry)
            if not grew:
                break
        return found

    def output_ndim(self, member: str, call: cst.Call, line: int) -> int | None:
        """How many dims `self.<member>(...)` returns, read statically: a convolution's `N + 2`, a per-token
        library layer's input rank, a custom module's last return in its forward (an argument returned as it
        came counts as the call's argument). None: not read."""
        from .ndim import ndim_of

        node = self.f.tree.nodes.get(member)
        if node is None:
            return None
        short = node.cls.rsplit(".", 1)[-1]
        first = call.args[0].value if call.args and call.args[0].keyword is None else None
        arg_ndim = (lambda: ndim_of(self.f.ws, self.f.src, self.f.fwd, first, self.f.cls, before=line)
                    if first is not None else None)
        if short in _CONV_NDIM:
            return _CONV_NDIM[short]
        if node.kind == "linear" or (node.kind == "library" and short in _TOKENWISE_LIBRARY):
            return arg_ndim()
        if node.kind != "module" or node.cls_node is None:
            return None
        m_src, m_cls = node.cls_node
        fwd = find_method(m_cls, "forward")
        returns = [r for r in find_all(fwd, cst.Return) if r.value is not None] if fwd is not None else []
        if not returns:
            return None
        value = returns[-1].value
        params = [p.name.value for p in params_of(fwd) if p.name.value != "self"]
        if isinstance(value, cst.Name) and params and value.value == params[0] and not [
                d for d in defuse(m_src, fwd).statements(ASSIGNS) if value.value in d[1]]:
            return arg_ndim()  # returned as it came
        return ndim_of(self.f.ws, m_src, fwd, value, m_cls, before=m_src.line(returns[-1]) + 1)


class _Walker:
    """Reads one walk over a block list: its streams, each block input with its producer and derivation,
    how it continues the walk before it, the blocks it visits and the side modules its body joins in."""

    def __init__(self, f: _Forward):
        self.f, self.lengths, self.sides = f, _Derivation(f), _SideModules(f)

    def walk(self, bl: BlockList, loop: Loop, earlier: list[_Walk]) -> _Walk:
        """One walk over `bl`: the streams it carries, each block input and what produced it, whether it
        continues the walk before it (`earlier`: the walks read so far) and the modules its body joins in."""
        end = self.f.end_line(loop.node)
        path = ".".join((bl.attr, *loop.keys))  # `self.mode_blocks["image"]`: the ModuleList at `mode_blocks.image`
        args = CallArgs.of(self.f.src, loop.call, skip=loop.call_skip, scope=loop.node.body)
        try:
            bound = bind(args, bl.forward.params) if bl.forward else {}
        except Exception:
            bound = {}
        streams = {p: bound[p] for p in stream_params(bound, loop.outputs)} or dict(bl.call_site.stream_args)
        annotated = {q.name: q.annotation for q in bl.forward.params} if bl.forward else {}
        # a parameter the call leaves at its default (`<default None>`) is no input: a hook planned on it would
        # look it up among arguments the call never passes (cache-dit's split hook raised IndexError)
        inputs = [self.block_input(param, arg, streams, loop, annotated.get(param), bl, path) for param, arg in bound.items()
                  if arg not in ("None", "True", "False") and not arg.startswith("<default ") and param != "self"]
        inputs = [self.unmasked(bl, f, p, streams, loop) if f.role == "mask" else (f, p) for f, p in inputs]
        split_before = {v for w in earlier for v in w.streams.values()}
        fresh, after, rebuilt = set(streams), None, []
        if earlier:
            fresh, after, rebuilt = self.continues(earlier[-1], streams, loop, split_before)
        offset, last = self.slice_span(loop, path)
        sides = self.sides.side_modules(loop, set(streams.values()) | split_before)
        return _Walk(path, loop, end, streams, tuple(f for f, _ in inputs), tuple(p for _, p in inputs),
                     frozenset(fresh), after, tuple(rebuilt), tuple(sides), offset, last)

    def block_input(self, param: str, arg: str, streams: dict[str, str], loop: Loop,
                    annotation: str | None = None, bl: BlockList | None = None,
                    path: str | None = None) -> tuple[BlockInputFact, Producer]:
        """The block parameter `param`, passed `arg`: its role, what produced it, the forward parameters it
        derives from and the sequence lengths read on the way. A module named like a position producer makes
        an otherwise unrecognised input a position. `path`: the walked list's module path (`bl.attr`, or a
        ModuleDict entry under it)."""
        role = "stream" if param in streams else "mask" if "mask" in param.lower() else (
            "position" if is_position(param) or is_position(arg) else "other")
        producer, in_loop = self.f.producer_of(arg, loop)
        params, lengths = self.lengths.derivation(arg, loop.line)
        tokens = self.lengths.token_params(arg, loop.line)
        if role == "other" and producer.kind == "module" and is_position(producer.name or ""):
            role = "position"
        at = Evidence(str(self.f.src.path), producer.line, producer.code[:80]) if producer.line else None
        table = None if role == "stream" or bl is None else indexed_by_position(self.f.tree, f"{path or bl.attr}.0", param)
        fact = BlockInputFact(param=param, arg=arg, role=role, producer_kind=producer.kind, producer=producer.name,
                              producer_at=at, producer_outputs=producer.outputs, producer_ndims=producer.ndims,
                              in_loop=in_loop,
                              leading_flatten=producer.leading,
                              from_params=tuple(sorted(params)), local_length=tuple(lengths),
                              token_params=tuple(sorted(tokens)), annotation=annotation, table=table,
                              ndim=self.f.rank_of(arg, loop.line) if role != "stream" else None)
        return fact, producer

    def unmasked(self, bl: BlockList, fact: BlockInputFact, producer: Producer, streams: dict[str, str],
                 loop: Loop) -> tuple[BlockInputFact, Producer]:
        """A mask-named input read as one value per token is no mask: role "other", with why."""
        per_token = self.lengths.per_token_mask(bl, fact, streams, loop)
        return (dataclasses.replace(fact, role="other", per_token=per_token) if per_token else fact), producer

    def continues(self, prev: _Walk, streams: dict[str, str], loop: Loop,
                  outputs: set[str]) -> tuple[set[str], str | None, list]:
        """Block params of this walk whose streams do not come (per token) from split streams of earlier walks
        (`outputs`: the streams of every earlier walk), and where the sequence is rebuilt since `prev`."""
        path = str(self.f.src.path)
        mixing: list[Evidence] = []
        fresh: set[str] = set()
        for param, var in streams.items():
            name, line = var, loop.line
            for _ in range(10):
                defs = [d for d in self.f.defs_before(name, line) if d.line > prev.loop_end]
                if not defs:
                    break
                ln, names, value = defs[-1].line, list(defs[-1].bound), defs[-1].whole
                p = self.f.classify(value, ln, names, name)
                if p.kind == "module" and _tokenwise_module(self.f.tree, p.name)[0]:
                    cands = [a for a in p.args if a in outputs or self.f.defs_before(a, ln)]
                    if not cands:
                        break
                    name, line = cands[0], ln
                    continue
                if isinstance(value, cst.Name):
                    name, line = value.value, ln  # a plain alias
                    continue
                joined = _joined(value)
                if joined and all(j in outputs for j in joined):
                    name, line = joined[-1], ln  # cat of already split streams: stays local
                    continue
                mixing.append(Evidence(path, ln, f"`{self.f.src.code(value)[:70]}` rebuilds the sequence between "
                                       f"`{prev.attr}` and the next list"))
                name = None
                break
            if name is None or name not in outputs:
                fresh.add(param)
        if fresh:
            return fresh, None, mixing
        return set(), prev.attr, []

    def slice_span(self, loop: Loop, attr: str) -> tuple[int | None, int | None]:
        """(first, last) block index a walk visits: `lst[-k:]` -> (n - k, n - 1); (0, n - 1) when not sliced."""
        node = self.f.tree.nodes.get(attr)
        length = node.length if node is not None else None
        n = length if isinstance(length, int) and is_known(length) else None
        if not loop.sliced:
            return 0, (n - 1 if n else None)
        if n is None:
            return None, None
        root = self.f.tree.nodes.get("")
        attrs = dict(root.attrs) if root is not None else {}
        attrs[attr] = [0] * n
        env = {name: [0] * n for name in names_read(loop.node.iter)}
        for sub in find_all(loop.node.iter, cst.Subscript):
            sl = sub.slice[0].slice if len(sub.slice) == 1 else None
            if isinstance(sl, cst.Slice):
                bounds = []
                for bound, default in ((sl.lower, 0), (sl.upper, n)):
                    value = default if bound is None else evaluate(bound, env, attrs)
                    if not (isinstance(value, int) and is_known(value)):
                        return None, None
                    bounds.append(value + n if value < 0 else value)
                return bounds[0], bounds[1] - 1
        return None, None


class _RootSplit:
    """Whether splitting forward's own inputs commutes with what runs before the first block."""

    def __init__(self, f: _Forward):
        self.f = f

    def root_check(self, first: _Walk) -> tuple[list[Evidence], dict[str, str], list[Evidence]]:
        """Why splitting forward's own inputs would not commute with what runs before the first block; the
        forward parameter each stream of the first walk comes from; and the per-token inputs built from a
        local length (risks, not blockers: wrong only if they mark absolute spans)."""
        blockers: list[Evidence] = []
        origins: dict[str, str] = {}
        risks: list[Evidence] = []
        path = str(self.f.src.path)
        loop = first.loop
        for var in first.streams.values():
            chain_ok, origin, why = self.tokenwise_chain(var, loop.line)
            if origin:
                origins[var] = origin
            if not chain_ok:
                blockers += why
        for bi, producer in zip(first.inputs, first.producers):
            if bi.role == "other" and bi.local_length:
                for ev in bi.local_length:
                    risks.append(Evidence(ev.file, ev.line, f"`{bi.param}` {ev.why}: under a root split it "
                                                    "is built for the local chunk; wrong if it marks absolute spans"))
            if bi.role in ("position", "mask"):
                if bi.local_length:
                    for ev in bi.local_length:
                        blockers.append(Evidence(ev.file, ev.line, f"`{bi.param}` {ev.why}: computed from the local "
                                                 "length after a root split (position drift)"))
                if bi.role == "position" and producer.kind == "module":
                    streams_in = [a for a in producer.args if a in set(first.streams.values())]
                    if streams_in:
                        blockers.append(Evidence(path, producer.line or 0, f"`self.{producer.name}` takes the "
                                                 f"sequence tensor `{streams_in[0]}` and derives positions from it"))
        for line, names, value, _ in self.f.assigns:
            if line >= loop.line:
                continue
            for attr in find_all(value, cst.Attribute):
                if attr.attr.value == "shape" and isinstance(attr.value, cst.Name) and attr.value.value in origins.values():
                    if len(names) >= 4:
                        blockers.append(Evidence(path, line, f"`{', '.join(names)} = {attr.value.value}.shape`: the "
                                                 "input is a spatial latent, not a [B, S, D] sequence"))
        return _dedupe(blockers), origins, risks

    def tokenwise_chain(self, var: str, before: int) -> tuple[bool, str | None, list[Evidence]]:
        """Follow `var` back to a forward parameter; every step must be a per-token op."""
        path = str(self.f.src.path)
        name, line = var, before
        for _ in range(20):
            defs = self.f.defs_before(name, line)
            if not defs:
                return (name in self.f.params), (name if name in self.f.params else None), (
                    [] if name in self.f.params else [Evidence(path, before, f"`{var}` has no traceable origin")])
            ln, names, value = defs[-1].line, list(defs[-1].bound), defs[-1].whole
            p = self.f.classify(value, ln, names, name)
            if p.kind == "module":
                ok, why = _tokenwise_module(self.f.tree, p.name)
                if not ok:
                    return False, None, [Evidence(path, ln, f"`{var}` comes from `self.{p.name}` ({why}), which does "
                                                  "not act per token")]
            elif p.kind in ("method", "function"):
                return False, None, [Evidence(path, ln, f"`{var}` is built by `{p.name}(...)`: not a per-token op "
                                              "a root split can pass through")]
            elif not isinstance(_unwrap(value), cst.Name):  # a plain alias passes the tokens through
                call = _unwrap(value)
                if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                        and call.func.attr.value in _PASSTHROUGH):
                    return False, None, [Evidence(path, ln, f"`{var}` is reshaped or combined by "
                                                  f"`{self.f.src.code(value)[:60]}`")]
            srcs = [a for a in p.args if a in self.f.params or self.f.defs_before(a, ln)]
            seq = [a for a in srcs if a == name] or srcs[:1]
            if not seq:
                return False, None, [Evidence(path, ln, f"`{var}` does not come from a forward input")]
            name, line = seq[0], ln
        return False, None, [Evidence(path, before, f"`{var}`: derivation too long to follow")]


class _Gather:
    """After the last walk: the module to gather behind, and the cuts of the sequence on the way to it."""

    def __init__(self, f: _Forward):
        self.f = f

    def gather(self, last: _Walk, streams: set[str]) -> tuple[Producer | None, list[Evidence], list[Evidence],
                                                               list[Evidence]]:
        """After the last walk (`streams`: those of every walk): the last module applied to the stream before a
        reshape or the return (the gather candidate); the cuts of the sequence by a global length before it;
        the cuts by lengths read before the loop (fine after a root split); and cuts by a parameter whose
        default hides them (root risks)."""
        stream = next(iter(last.streams.values()), None)
        hidden = last.streams.get("hidden_states", stream)
        path = str(self.f.src.path)
        current = {hidden} if hidden else set()
        candidate: Producer | None = None
        blocked: list[Evidence] = []
        blocked_unless_root: list[Evidence] = []
        risks: list[Evidence] = []
        returns = [(self.f.src.line(r), ["<return>"], r.value, r) for r in find_all(self.f.fwd.body, cst.Return)
                   if r.value is not None]
        for ln, names, value, _ in sorted(self.f.assigns + returns, key=lambda a: a[0]):
            if ln <= last.loop_end or self.f.in_loop(ln) or not (names_read(value) & current):
                continue
            if names == ["<return>"]:
                inner = _unwrap(value)
                if isinstance(inner, cst.Call) and self_member(inner.func) is not None:
                    p = self.f.classify(inner, ln, names, "<return>")
                    if p.kind == "module":
                        candidate = p
                        for kind, ev in self._cut_into(inner, current, last, ln, streams):
                            (blocked if kind == "global" else blocked_unless_root).append(ev)
                break
            p = self.f.classify(value, ln, names, names[0] if names else "")
            if p.kind == "module":
                candidate = p
                for kind, ev in self._cut_into(value, current, last, ln, streams):
                    (blocked if kind == "global" else blocked_unless_root).append(ev)
                current = set(names)
                continue
            inner = self._module_inside(value, current, ln, names)
            if inner is not None:
                candidate = inner
                current = set(names)
                continue
            call = _unwrap(value)
            if isinstance(call, cst.Name):
                current |= set(names)  # `hidden_states = decoder_hidden_states`
                continue
            method = call.func.attr.value if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) else ""
            if isinstance(call, cst.Call) and method in _PASSTHROUGH:
                current |= set(names)
                continue
            if isinstance(call, cst.BinaryOperation | cst.UnaryOperation) and not any(
                    isinstance(c.func, cst.Attribute) and c.func.attr.value in _RESHAPE | {"cat"}
                    for c in find_all(call, cst.Call)):
                for name in self.snapshots(call, current, streams, last, ln):
                    blocked_unless_root.append(Evidence(path, ln, f"`{self.f.src.code(value)[:70]}` joins the stream "
                                                        f"with `{name}`, the sequence as it was before the blocks "
                                                        "(a long skip): whole unless split at the root"))
                current |= set(names)  # element-wise modulation: h * (1 + scale) + shift
                continue
            if method in ("cat", "concat", "split", "chunk") or isinstance(call, cst.Subscript) or any(
                    dotted(c.func) in ("torch.cat", "torch.concat") for c in find_all(call, cst.Call)):
                kind, cut_risks = self.cut_kind(value, last, ln, streams)
                risks += cut_risks
                if kind != "local":
                    ev = Evidence(path, ln, f"`{self.f.src.code(value)[:70]}` slices or joins the sequence after the "
                                  f"last block ({kind})")
                    (blocked if kind == "global" else blocked_unless_root).append(ev)
                current |= set(names)
                continue
            break
        return candidate, blocked, blocked_unless_root, risks

    def snapshots(self, op: cst.CSTNode, current: set[str], streams: set[str], last: _Walk, line: int) -> list[str]:
        """The names `op` reads (besides the stream it carries) that hold the sequence as it was before the last
        walk: bound before that walk's loop to a stream, as is or through a pass-through method
        (`residual = hidden_states`, `skip = x.clone() if long_skip else None`). Element-wise with the stream, they
        must be as long."""
        out = []
        for name in sorted(names_read(op) - current - {"self"}):
            defs = self.f.defs_before(name, line)
            if not defs or defs[-1].line >= last.loop.line:
                continue
            value = _unwrap(defs[-1].whole)
            arms = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]  # `x.clone() if s else None`
            for arm in arms:
                while isinstance(arm, cst.Call) and isinstance(arm.func, cst.Attribute) \
                        and arm.func.attr.value in _PASSTHROUGH:
                    arm = arm.func.value
                if isinstance(arm, cst.Name) and arm.value in streams:
                    out.append(name)
                    break
        return out

    def cut_kind(self, value, last: _Walk, line: int, streams: set[str]) -> tuple[str, list[Evidence]]:
        """A slice/join after the blocks: "local" (lengths read from split tensors after the loop or joins of
        split streams), "lengths read before the loop" (local only under a root split), or "global"; and the
        root risks it shows (a cut by a parameter whose default, 0 or None, makes it a no-op)."""
        risks: list[Evidence] = []
        joined = _joined(value)
        if joined and all(j in streams for j in joined):
            return "local", risks
        bounds: set[str] = set()
        for sub in find_all(value, cst.Subscript):
            for el in sub.slice:
                bounds |= names_read(el.slice)
        for call in find_all(value, cst.Call):
            for a in call.args[1:]:
                bounds |= names_read(a.value)
        bounds -= streams | {"self"}
        attrs_shape = [a for a in find_all(value, cst.Attribute) if a.attr.value == "shape"
                       and isinstance(a.value, cst.Name) and a.value.value in streams]
        if not bounds and attrs_shape:
            return "local", risks
        if not bounds and any(_cuts_sequence(sub) for sub in find_all(value, cst.Subscript)
                              if isinstance(sub.value, cst.Name) and sub.value.value in streams):
            return "global", risks  # `h[:, 1:]`: a fixed position of the whole sequence, not of a rank's chunk
        kinds = set()
        for name in bounds:
            defs = self.f.defs_before(name, line)
            if not defs:
                default = self.f.defaults.get(name)
                if default in ("0", "None"):
                    risks.append(Evidence(str(self.f.src.path), line, f"the output is cut by `{name}` "
                                                    f"(default {default}): with a non-zero value the cut lands in "
                                                    "the wrong place on a local chunk"))
                    continue
                kinds.add("global")
                continue
            ln, v = defs[-1].line, defs[-1].whole
            reads = [a for a in find_all(v, cst.Attribute) if a.attr.value == "shape" and isinstance(a.value, cst.Name)
                     and (a.value.value in streams or a.value.value in self.f.params)]
            if not reads:
                kinds.add("global")
            elif ln > last.loop_end:
                kinds.add("local")
            else:
                kinds.add("lengths read before the loop")
        if "global" in kinds:
            return "global", risks
        return ("lengths read before the loop" if "lengths read before the loop" in kinds else "local"), risks

    def _cut_into(self, call, current: set[str], last: _Walk, line: int,
                  streams: set[str]) -> list[tuple[str, Evidence]]:
        """The cuts of the sequence inside the gather candidate's own arguments (`self.proj_out(h[:, 1:])`): made
        on a rank's chunk before the module, they are blocked exactly as a cut on a line of their own."""
        out: list[tuple[str, Evidence]] = []
        for sub in find_all(call, cst.Subscript):
            if isinstance(sub.value, cst.Name) and sub.value.value in current and _cuts_sequence(sub):
                kind, _ = self.cut_kind(sub, last, line, streams | current)
                if kind != "local":
                    out.append((kind, Evidence(str(self.f.src.path), line, f"`{self.f.src.code(sub)[:70]}` slices the "
                                               f"sequence after the last block, inside the output module's call ({kind})")))
        return out

    def _module_inside(self, value, current: set[str], line: int, names: list[str]) -> Producer | None:
        """`(self.norm_out(h.float()) * (1 + scale) + shift).type_as(h)`: an element-wise wrap of one module."""
        core = value
        while isinstance(core, cst.Call) and isinstance(core.func, cst.Attribute) and core.func.attr.value in _PASSTHROUGH:
            core = core.func.value
        while isinstance(core, cst.Call) and isinstance(core.func, cst.Attribute) and core.func.attr.value in _PASSTHROUGH:
            core = core.func.value
        if not isinstance(core, cst.BinaryOperation):
            return None
        for call in find_all(core, cst.Call):
            member = self_member(call.func)
            if member in self.f.tree.nodes and names_read(call) & current:
                return Producer("module", member, line, self.f.src.code(value), sorted(names_read(call) - {"self"}))
        return None


def _batch_dropped(f: _Forward) -> dict[str, Evidence]:
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


def _masks(f: _Forward) -> list[MaskFact]:
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


def _tokenwise_module(tree: Tree, attr: str) -> tuple[bool, str]:
    node = tree.nodes.get(attr)
    if node is None:
        return False, "unknown module"
    short = node.cls.rsplit(".", 1)[-1]
    if node.kind == "linear":
        return True, "Linear"
    if node.kind == "library":
        return short in _TOKENWISE_LIBRARY, short
    subs = [n for p, n in tree.nodes.items() if p.startswith(attr + ".")]
    for n in subs:
        s = n.cls.rsplit(".", 1)[-1]
        if n.kind == "library" and s not in _TOKENWISE_LIBRARY:
            return False, f"{short} holds {s}"
        if n.kind == "module" and ("Attention" in s or "Attn" in s or "Conv" in s):
            return False, f"{short} holds {s}"
    if not subs and "Norm" not in short:
        return False, f"{short} (no sub-modules to judge)"
    return True, short


def _cuts_sequence(sub: cst.Subscript) -> bool:
    """Whether a subscript of a [B, S, D] stream cuts its sequence axis (dim 1): `h[:, 1:]`, `h[:, 0]`, `h[:, :n]`;
    `h[..., :c]` and `h[:, :, :c]` cut the channels, `h[0]` the batch. An element after an ellipsis counts from the
    end and is not read as the sequence."""
    elements = list(sub.slice)
    if len(elements) < 2 or any(isinstance(e.slice, cst.Index) and isinstance(e.slice.value, cst.Ellipsis)
                                for e in elements[:2]):
        return False
    second = elements[1].slice
    full = isinstance(second, cst.Slice) and second.lower is None and second.upper is None and second.step is None
    return not full and not (isinstance(second, cst.Index) and dotted(second.value) == "None")


def indexed_by_position(tree: Tree, path: str, param: str, depth: int = 0) -> Evidence | None:
    """Where the module at `path` (a block) indexes its input `param` by a tensor, `param[positions]`, in its own
    forward or in a submodule's it hands `param` to (bound by keyword or position): a lookup table, read
    statically. None where nothing indexes it so (a slice `param[:n]` is no lookup)."""
    node = tree.nodes.get(path)
    if node is None or node.cls_node is None or depth > 4:
        return None
    src, cls = node.cls_node
    fwd = find_method(cls, "forward")
    if fwd is None:
        return None
    for sub in find_all(fwd, cst.Subscript):
        if not (isinstance(sub.value, cst.Name) and sub.value.value == param and len(sub.slice) == 1):
            continue
        index = sub.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.Name | cst.Attribute | cst.Call):
            return Evidence(str(src.path), src.line(sub), f"`{src.code(sub)[:60]}`: `{param}` is looked up by "
                                                          "position, a table, not one row per token")
    for call in find_all(fwd, cst.Call):
        member = self_member(call.func)
        if member is None or f"{path}.{member}" not in tree.nodes:
            continue
        child = tree.nodes[f"{path}.{member}"]
        child_fwd = find_method(child.cls_node[1], "forward") if child.cls_node else None
        if child_fwd is None:
            continue
        try:  # Python's own binding rules: by keyword, by position, keyword-only parameters too
            bound = bind(CallArgs.of(src, call), signature(child.cls_node[0], child_fwd))
        except BindError:
            continue
        for target, value in bound.items():
            if value == param and not target.startswith("*"):
                found = indexed_by_position(tree, f"{path}.{member}", target, depth + 1)
                if found is not None:
                    return found
    return None


def _hands_to_mask(ws: Workspace, bl: BlockList, param: str) -> bool | None:
    """Whether the block's forward passes `param` to a call as a `*mask*` keyword or positionally to one of its
    attention modules' calls (an attention mask); None when the block's forward is not read."""
    if not bl.block_file or not bl.block_class:
        return None
    try:
        src = ws.load(Path(bl.block_file))
    except (OSError, ValueError):
        return None
    cls = src.classes.get(bl.block_class)
    fwd = find_method(cls, "forward") if cls is not None else None
    if fwd is None:
        return None
    for call in find_all(fwd, cst.Call):
        for arg in call.args:
            if param not in names_read(arg.value):
                continue
            if arg.keyword is not None and "mask" in arg.keyword.value.lower():
                return True
            member = self_member(call.func) or ""
            if arg.keyword is None and ("attn" in member.lower() or "attention" in member.lower()):
                return True
    return False


def _joined(value: cst.BaseExpression) -> list[str]:
    """`torch.cat([a, b], dim=1)` -> ["a", "b"] when every element is a plain name."""
    if isinstance(value, cst.Call) and (dotted(value.func) or "") in ("torch.cat", "torch.concat") and value.args:
        seq = value.args[0].value
        if isinstance(seq, cst.List | cst.Tuple) and all(isinstance(e.value, cst.Name) for e in seq.elements):
            return [e.value.value for e in seq.elements]
    return []


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


def _unwrap(value: cst.BaseExpression) -> cst.BaseExpression:
    """`self.x(h).to(dtype)` -> `self.x(h)`."""
    while (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
           and value.func.attr.value in _PASSTHROUGH and isinstance(value.func.value, cst.Call)):
        value = value.func.value
    return value


def _dedupe(evs: list[Evidence]) -> list[Evidence]:
    seen, out = set(), []
    for e in evs:
        if (e.line, e.why) not in seen:
            seen.add((e.line, e.why))
            out.append(e)
    return out
