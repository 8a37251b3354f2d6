"""One walk over a block list as forward reads it (`Walker` makes the `Walk`): the streams it carries, each
block input with its producer, the forward parameters and sequence lengths it derives from (`Derivation`), how
it continues the walk before it, and the modules its body joins into a stream (`SideModules`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from integrate.defuse import ASSIGNS, GROWS, defuse
from integrate.records import Evidence
from integrate.resolve import Resolved, Workspace
from integrate.source import dotted, find_method
from integrate.syntax import find_all, names_read, params_of, self_member

from .binding import BindError, CallArgs, bind
from .forward import signature
from .loops import Loop
from .modules import Tree
from .patterns import stream_params
from .records import BlockInputFact, BlockList, ListFlowFact, SideModule
from .sequence_forward import TOKENWISE_LIBRARY, Forward, Producer, cat_names, is_position, tokenwise_module, unwrap
from .values import evaluate, is_known

_CONV_NDIM = {"Conv1d": 3, "Conv2d": 4, "Conv3d": 5, "ConvTranspose1d": 3, "ConvTranspose2d": 4, "ConvTranspose3d": 5}


@dataclass(frozen=True)
class Walk:
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


class Derivation:
    """Where a value forward hands the blocks comes from: the forward parameters it is built from and the
    sequence lengths read on the way (each would drift once the sequence is split)."""

    def __init__(self, f: Forward):
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
        call = unwrap(defs[-1].whole) if defs else None
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


class SideModules:
    """The modules a walk's loop body joins into a stream, and the rank of what each returns."""

    def __init__(self, f: Forward):
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
        if node.kind == "linear" or (node.kind == "library" and short in TOKENWISE_LIBRARY):
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


class Walker:
    """Reads one walk over a block list: its streams, each block input with its producer and derivation,
    how it continues the walk before it, the blocks it visits and the side modules its body joins in."""

    def __init__(self, f: Forward):
        self.f, self.lengths, self.sides = f, Derivation(f), SideModules(f)

    def walk(self, bl: BlockList, loop: Loop, earlier: list[Walk]) -> Walk:
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
        return Walk(path, loop, end, streams, tuple(f for f, _ in inputs), tuple(p for _, p in inputs),
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

    def continues(self, prev: Walk, streams: dict[str, str], loop: Loop,
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
                if p.kind == "module" and tokenwise_module(self.f.tree, p.name)[0]:
                    cands = [a for a in p.args if a in outputs or self.f.defs_before(a, ln)]
                    if not cands:
                        break
                    name, line = cands[0], ln
                    continue
                if isinstance(value, cst.Name):
                    name, line = value.value, ln  # a plain alias
                    continue
                joined = cat_names(value)
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
