"""How sequence tensors flow through the transformer's forward: the facts context parallelism needs.

For each chained block list (in forward order): which block inputs are streams, positions
(RoPE / position embeddings) or masks, and what produced each one: a forward parameter, a
sub-module (hookable), a plain method or function, or an inline expression; whether the ops
between a forward parameter and the first block are per-token (so a split at the root commutes
with them); where a value is derived from the *local* length of a sequence tensor (`.shape`,
`len`, a helper that reads `.shape`) and would drift under a root split; whether one list's
output is mixed (concatenated, rebuilt by a method) before the next list; and the module calls
after the last list up to the first reshape (the gather candidate).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from integrate.defuse import defuse
from integrate.records import Evidence
from integrate.resolve import Resolved, Workspace
from integrate.source import SourceFile, dotted, find_method, iter_methods
from integrate.syntax import body_of, find_all, names_read, params_of, self_member, target_names, walk_statements

from .binding import CallArgs, bind
from .loops import Loop, find_list_uses
from .modules import Tree
from .patterns import stream_params
from .records import BlockList
from .values import evaluate, is_known

POSITION_WORDS = ("rotary", "rope", "freqs", "pos_emb", "pos_embed", "position", "pe")
_PASSTHROUGH = {"to", "type_as", "float", "half", "bfloat16", "contiguous", "clone", "detach"}
_TOKENWISE_LIBRARY = {"Linear", "LayerNorm", "RMSNorm", "SiLU", "GELU", "ReLU", "Tanh", "Mish", "Dropout",
                      "Identity", "ModuleList", "Sequential", "LazyLinear", "Sigmoid"}
_RESHAPE = {"reshape", "view", "permute", "unflatten", "flatten", "transpose", "unbind", "split", "chunk",
            "squeeze", "unsqueeze"}


@dataclass
class Producer:
    kind: str  # "param" | "module" | "method" | "function" | "expression" | "list_output" | "unknown"
    name: str | None
    line: int | None
    code: str = ""
    args: list[str] = field(default_factory=list)  # names read by the producing expression
    outputs: int | None = None  # tensors it returns when it returns a tuple (None: one value / unknown)


@dataclass
class BlockInput:
    param: str
    arg: str
    role: str  # "stream" | "position" | "mask" | "other"
    producer: Producer
    in_loop: bool = False  # produced in the loop body (per block)
    params: set[str] = field(default_factory=set)  # forward parameters it derives from
    local_length: list[Evidence] = field(default_factory=list)  # reads of a sequence tensor's length
    token_params: set[str] = field(default_factory=set)  # forward params whose dim 1 (a token axis) is read


@dataclass
class ListFlow:
    attr: str
    loop_line: int
    loop_end: int
    streams: dict[str, str]  # block param -> loop variable
    inputs: list[BlockInput]
    fresh: bool  # its streams do not come (per token) from an earlier list's output
    after: str | None  # the earlier list whose outputs it continues
    mixed_after: bool = False  # its outputs are rebuilt / concatenated before the next list
    mixing: list[Evidence] = field(default_factory=list)
    side_modules: list[tuple[str, bool, Evidence]] = field(default_factory=list)  # (module, indexed, where)
    fresh_streams: set[str] = field(default_factory=set)  # block params whose stream is not already split
    offset: int | None = 0  # index of the first block this walk visits (a slice `lst[-k:]` starts at n - k)
    last: int | None = None  # index of the last block it visits


@dataclass
class SequenceFacts:
    file: str
    forward_line: int
    forward_params: list[str]
    lists: list[ListFlow]
    root_blockers: list[Evidence]  # why a split at the root would not commute with the preprocessing
    root_params: dict[str, str]  # loop variable -> forward parameter it comes from per token
    root_risks: list[Evidence]  # per-token inputs built from a local length under a root split
    gather: Producer | None  # the last module applied to the stream before reshape/return
    gather_blocked: list[Evidence]  # sequence mixing after the last list, before any module
    gather_blocked_unless_root: list[Evidence]  # cuts by lengths read before the loop
    mask_inputs: list[tuple[str, str | None, Evidence]]  # (name, layout, where)
    batch_dropped: dict[str, Evidence] = field(default_factory=dict)  # param -> `if p.ndim == 3: p = p[0]`
    annotations: dict[str, str] = field(default_factory=dict)  # forward param -> annotation text
    evidence: list[Evidence] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)


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
                   block_lists: tuple[BlockList, ...]) -> SequenceFacts | None:
    fwd = find_method(cls, "forward")
    if fwd is None:
        return None
    chained = [bl for bl in block_lists if bl.is_blocks and bl.call_site is not None]
    uses = find_list_uses(src, cls, [bl.attr for bl in chained])
    loops: list[tuple[BlockList, Loop]] = []
    spans: dict[str, tuple[int, int]] = {}
    all_loops: dict[str, list[Loop]] = {}
    for bl in chained:
        in_fwd = [lp for lp in uses[bl.attr].loops if lp.call is not None and lp.method == "forward"]
        if not in_fwd:
            continue
        all_loops[bl.attr] = in_fwd
        direct = [lp for lp in in_fwd if lp.call_skip == 0] or in_fwd[:1]
        for lp in direct:  # every walk over the list (a list may be walked in slices)
            if not _guarded_off(fwd, lp.node, tree):
                loops.append((bl, lp))
        spans[bl.attr] = (min(x.line for x in in_fwd), 0)
    loops.sort(key=lambda p: p[1].line)
    params = [p.name.value for p in params_of(fwd) if p.name.value != "self"]
    flow = _Flow(ws, src, cls, fwd, tree, params)
    flow.lists = facts_lists = []
    for attr, in_fwd in all_loops.items():
        spans[attr] = (spans[attr][0], max(flow.end_line(x.node) for x in in_fwd))
    flow.loop_spans = [(x.line, flow.end_line(x.node)) for v in all_loops.values() for x in v]
    facts = SequenceFacts(str(src.path), src.line(fwd), params, [], [], {}, [], None, [], [], [])
    prev: ListFlow | None = None
    for bl, lp in loops:
        end = flow.end_line(lp.node)
        args = CallArgs.of(src, lp.call, skip=lp.call_skip)
        try:
            bound = bind(args, bl.forward.params) if bl.forward else {}
        except Exception:
            bound = {}
        streams = {p: bound[p] for p in stream_params(bound, lp.outputs)} or dict(bl.call_site.stream_args)
        inputs = []
        for param, arg in bound.items():
            if arg in ("None", "True", "False") or param in ("self",):
                continue
            role = "stream" if param in streams else "mask" if "mask" in param.lower() else (
                "position" if is_position(param) or is_position(arg) else "other")
            producer, in_loop = flow.producer_of(arg, lp)
            bi = BlockInput(param, arg, role, producer, in_loop)
            bi.params, bi.local_length = flow.derivation(arg, lp.line)
            bi.token_params = flow.token_params(arg, lp.line)
            if role == "other" and producer.kind == "module" and is_position(producer.name or ""):
                bi.role = "position"
            inputs.append(bi)
        fresh_params, after = set(streams), None
        if prev is not None:
            fresh_params, after, mixing = flow.continues(prev, streams, lp)
            if fresh_params:
                prev.mixed_after = prev.mixed_after or bool(mixing)
                prev.mixing = prev.mixing or mixing
        lf = ListFlow(bl.attr, lp.line, end, streams, inputs, bool(fresh_params), after)
        lf.fresh_streams = set(fresh_params)
        lf.offset, lf.last = flow.slice_span(lp, bl.attr)
        facts_lists.append(lf)
        split_before = {v for earlier in facts.lists for v in earlier.streams.values()}
        lf.side_modules = flow.side_modules(lp, set(streams.values()) | split_before)
        facts.lists.append(lf)
        prev = lf
    if not facts.lists:
        facts.unknowns.append("no block list is called in a loop in forward")
        return facts
    first = facts.lists[0]
    facts.root_blockers, facts.root_params = flow.root_check(first, loops[0][1])
    facts.root_risks = _dedupe(flow.root_risks)
    facts.gather, facts.gather_blocked = flow.gather(facts.lists[-1], loops[-1][1])
    facts.gather_blocked_unless_root = flow.blocked_unless_root
    facts.root_risks = _dedupe(flow.root_risks)
    facts.mask_inputs = flow.masks()
    facts.batch_dropped = flow.batch_dropped()
    facts.annotations = {p.name.value: src.code(p.annotation.annotation) for p in params_of(fwd)
                         if p.annotation is not None}
    return facts


class _Flow:
    def __init__(self, ws, src: SourceFile, cls: cst.ClassDef, fwd: cst.FunctionDef, tree: Tree, params: list[str]):
        self.ws, self.src, self.cls, self.fwd, self.tree, self.params = ws, src, cls, fwd, tree, params
        self.methods = {fn.name.value for fn in iter_methods(cls)}
        self.loop_spans: list[tuple[int, int]] = []
        self.root_risks: list[Evidence] = []
        self.blocked_unless_root: list[Evidence] = []
        self.defaults = {p.name.value: (src.code(p.default) if p.default is not None else None) for p in params_of(fwd)}
        # every binding in forward, a `for` target bound to its iterable: (line, names, value, node)
        self.assigns = [(line, list(names), value, node) for line, names, value, node in defuse(src, fwd).statements()]

    def end_line(self, node: cst.CSTNode) -> int:
        return max([self.src.line(node)] + [self.src.line(s) for s in walk_statements(body_of(node))
                                            if not isinstance(s, cst.IndentedBlock)])

    # -- producers ----------------------------------------------------------------------

    def in_loop(self, line: int) -> bool:
        return any(a <= line <= b for a, b in self.loop_spans)

    def defs_before(self, name: str, line: int, lo: int = 0) -> list[tuple[int, list[str], cst.BaseExpression]]:
        """Assignments to `name` in [lo, line); outside block loops unless the range is inside one."""
        inside = lo > 0 and self.in_loop(lo)
        return [(ln, names, value) for ln, names, value, _ in self.assigns
                if name in names and lo <= ln < line and (inside or not self.in_loop(ln))]

    def producer_of(self, arg: str, loop: Loop) -> tuple[Producer, bool]:
        if arg in self.params and not self.defs_before(arg, loop.line):
            return Producer("param", arg, None), False
        in_body = self.defs_before(arg, self.end_line(loop.node) + 1, lo=loop.line + 1)
        if in_body:
            ln, names, value = in_body[-1]
            return self.classify(value, ln, names, arg), True
        defs = self.defs_before(arg, loop.line)
        if not defs:
            return Producer("unknown", arg, None), False
        ln, names, value = defs[-1]
        return self.classify(value, ln, names, arg), False

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
        return Producer("expression", target, line, code, reads, outputs)

    def derivation(self, arg: str, line: int, depth: int = 0) -> tuple[set[str], list[Evidence]]:
        """Forward parameters `arg` derives from, and reads of a sequence length on the way."""
        params: set[str] = set()
        lengths: list[Evidence] = []
        seen: set[tuple[str, int]] = set()
        stack = [(arg, line)]
        while stack:
            name, before = stack.pop()
            if (name, before) in seen or len(seen) > 200:
                continue
            seen.add((name, before))
            defs = self.defs_before(name, before)
            if not defs:
                if name in self.params:
                    params.add(name)
                continue
            ln, _, value = defs[-1]
            lengths += self.length_reads(value, ln)
            for n in names_read(value) - {"self"}:
                stack.append((n, ln))
        return params, lengths

    def token_params(self, arg: str, line: int) -> set[str]:
        """Forward parameters `arg` derives from whose `.shape[1]` is read on the way (a per-token axis)."""
        out: set[str] = set()
        seen: set[tuple[str, int]] = set()
        stack = [(arg, line)]
        while stack and len(seen) < 200:
            name, before = stack.pop()
            if (name, before) in seen:
                continue
            seen.add((name, before))
            defs = self.defs_before(name, before)
            if not defs:
                continue
            ln, _, value = defs[-1]
            for n in names_read(value) - {"self"}:
                stack.append((n, ln))
        for ln, _, value, node in self.assigns:
            if ln >= line or self.in_loop(ln):
                continue
            for sub in find_all(value, cst.Subscript):
                base = sub.value
                if (isinstance(base, cst.Attribute) and base.attr.value == "shape" and isinstance(base.value, cst.Name)
                        and base.value.value in self.params and len(sub.slice) == 1
                        and isinstance(sub.slice[0].slice, cst.Index)
                        and isinstance(sub.slice[0].slice.value, cst.Integer) and sub.slice[0].slice.value.value == "1"
                        and any(n == base.value.value for n, _ in seen)):
                    if not self.defs_before(base.value.value, ln):
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
                out.append(Evidence(str(self.src.path), line, f"reads the length of `{attr.value.value}` "
                                    f"(`{self.src.code(value)[:70]}`)"))
        for call in find_all(value, cst.Call):
            name = dotted(call.func) or ""
            if name == "len" and call.args and isinstance(call.args[0].value, cst.Name):
                out.append(Evidence(str(self.src.path), line, f"`{self.src.code(call)}`"))
            elif name and "." not in name and name not in ("len", "int", "max", "min"):
                found = self.ws.resolve(self.src, name)
                if isinstance(found, Resolved) and isinstance(found.node, cst.FunctionDef):
                    reads = [a for a in find_all(found.node.body, cst.Attribute) if a.attr.value == "shape"]
                    if reads:
                        out.append(Evidence(str(self.src.path), line, f"`{name}(...)` reads `.shape` of its "
                                            f"arguments ({found.src.path.name}:{found.src.line(reads[0])})"))
        return out

    # -- root split ---------------------------------------------------------------------

    def root_check(self, first: ListFlow, loop: Loop) -> tuple[list[Evidence], dict[str, str]]:
        """Why splitting forward's own inputs would not commute with what runs before the first block."""
        blockers: list[Evidence] = []
        origins: dict[str, str] = {}
        path = str(self.src.path)
        for var in first.streams.values():
            chain_ok, origin, why = self.tokenwise_chain(var, loop.line)
            if origin:
                origins[var] = origin
            if not chain_ok:
                blockers += why
        for bi in first.inputs:
            if bi.role == "other" and bi.local_length:
                for ev in bi.local_length:
                    self.root_risks.append(Evidence(ev.file, ev.line, f"`{bi.param}` {ev.why}: under a root split it "
                                                    "is built for the local chunk; wrong if it marks absolute spans"))
            if bi.role in ("position", "mask"):
                if bi.local_length:
                    for ev in bi.local_length:
                        blockers.append(Evidence(ev.file, ev.line, f"`{bi.param}` {ev.why}: computed from the local "
                                                 "length after a root split (position drift)"))
                if bi.role == "position" and bi.producer.kind == "module":
                    streams_in = [a for a in bi.producer.args if a in set(first.streams.values())]
                    if streams_in:
                        blockers.append(Evidence(path, bi.producer.line or 0, f"`self.{bi.producer.name}` takes the "
                                                 f"sequence tensor `{streams_in[0]}` and derives positions from it"))
        for line, names, value, _ in self.assigns:
            if line >= loop.line:
                continue
            for attr in find_all(value, cst.Attribute):
                if attr.attr.value == "shape" and isinstance(attr.value, cst.Name) and attr.value.value in origins.values():
                    if len(names) >= 4:
                        blockers.append(Evidence(path, line, f"`{', '.join(names)} = {attr.value.value}.shape`: the "
                                                 "input is a spatial latent, not a [B, S, D] sequence"))
        return _dedupe(blockers), origins

    def tokenwise_chain(self, var: str, before: int) -> tuple[bool, str | None, list[Evidence]]:
        """Follow `var` back to a forward parameter; every step must be a per-token op."""
        path = str(self.src.path)
        name, line = var, before
        for _ in range(20):
            defs = self.defs_before(name, line)
            if not defs:
                return (name in self.params), (name if name in self.params else None), (
                    [] if name in self.params else [Evidence(path, before, f"`{var}` has no traceable origin")])
            ln, names, value = defs[-1]
            p = self.classify(value, ln, names, name)
            if p.kind == "module":
                ok, why = self.tokenwise_module(p.name)
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
                                                  f"`{self.src.code(value)[:60]}`")]
            srcs = [a for a in p.args if a in self.params or self.defs_before(a, ln)]
            seq = [a for a in srcs if a == name] or srcs[:1]
            if not seq:
                return False, None, [Evidence(path, ln, f"`{var}` does not come from a forward input")]
            name, line = seq[0], ln
        return False, None, [Evidence(path, before, f"`{var}`: derivation too long to follow")]

    def tokenwise_module(self, attr: str) -> tuple[bool, str]:
        node = self.tree.nodes.get(attr)
        if node is None:
            return False, "unknown module"
        short = node.cls.rsplit(".", 1)[-1]
        if node.kind == "linear":
            return True, "Linear"
        if node.kind == "library":
            return short in _TOKENWISE_LIBRARY, short
        subs = [n for p, n in self.tree.nodes.items() if p.startswith(attr + ".")]
        for n in subs:
            s = n.cls.rsplit(".", 1)[-1]
            if n.kind == "library" and s not in _TOKENWISE_LIBRARY:
                return False, f"{short} holds {s}"
            if n.kind == "module" and ("Attention" in s or "Attn" in s or "Conv" in s):
                return False, f"{short} holds {s}"
        if not subs and "Norm" not in short:
            return False, f"{short} (no sub-modules to judge)"
        return True, short

    # -- between lists --------------------------------------------------------------------

    def continues(self, prev: ListFlow, streams: dict[str, str], loop: Loop) -> tuple[set[str], str | None, list]:
        """Block params of this walk whose streams do not come (per token) from split streams of earlier walks."""
        outputs = {v for lf in self.lists for v in lf.streams.values()}
        path = str(self.src.path)
        mixing: list[Evidence] = []
        fresh: set[str] = set()
        for param, var in streams.items():
            name, line = var, loop.line
            for _ in range(10):
                defs = [d for d in self.defs_before(name, line) if d[0] > prev.loop_end and not self.in_loop(d[0])]
                if not defs:
                    break
                ln, names, value = defs[-1]
                p = self.classify(value, ln, names, name)
                if p.kind == "module" and self.tokenwise_module(p.name)[0]:
                    cands = [a for a in p.args if a in outputs or self.defs_before(a, ln)]
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
                mixing.append(Evidence(path, ln, f"`{self.src.code(value)[:70]}` rebuilds the sequence between "
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
        node = self.tree.nodes.get(attr)
        length = node.length if node is not None else None
        n = length if isinstance(length, int) and is_known(length) else None
        if not loop.sliced:
            return 0, (n - 1 if n else None)
        if n is None:
            return None, None
        root = self.tree.nodes.get("")
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

    # -- after the last list ------------------------------------------------------------

    def gather(self, last: ListFlow, loop: Loop) -> tuple[Producer | None, list[Evidence]]:
        stream = next(iter(last.streams.values()), None)
        hidden = last.streams.get("hidden_states", stream)
        streams = {v for lf in self.lists for v in lf.streams.values()}
        path = str(self.src.path)
        current = {hidden} if hidden else set()
        candidate: Producer | None = None
        blocked: list[Evidence] = []
        returns = [(self.src.line(r), ["<return>"], r.value, r) for r in find_all(self.fwd.body, cst.Return)
                   if r.value is not None]
        for ln, names, value, _ in sorted(self.assigns + returns, key=lambda a: a[0]):
            if ln <= last.loop_end or self.in_loop(ln) or not (names_read(value) & current):
                continue
            if names == ["<return>"]:
                inner = _unwrap(value)
                if isinstance(inner, cst.Call) and self_member(inner.func) is not None:
                    p = self.classify(inner, ln, names, "<return>")
                    if p.kind == "module":
                        candidate = p
                break
            p = self.classify(value, ln, names, names[0] if names else "")
            if p.kind == "module":
                candidate = p
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
                current |= set(names)  # element-wise modulation: h * (1 + scale) + shift
                continue
            if method in ("cat", "concat", "split", "chunk") or isinstance(call, cst.Subscript) or any(
                    dotted(c.func) in ("torch.cat", "torch.concat") for c in find_all(call, cst.Call)):
                kind = self.cut_kind(value, last, ln, streams)
                if kind != "local":
                    ev = Evidence(path, ln, f"`{self.src.code(value)[:70]}` slices or joins the sequence after the "
                                  f"last block ({kind})")
                    (blocked if kind == "global" else self.blocked_unless_root).append(ev)
                current |= set(names)
                continue
            break
        return candidate, blocked

    def cut_kind(self, value, last: ListFlow, line: int, streams: set[str]) -> str:
        """A slice/join after the blocks: "local" (lengths read from split tensors after the loop or joins of
        split streams), "lengths read before the loop" (local only under a root split), or "global"."""
        joined = _joined(value)
        if joined and all(j in streams for j in joined):
            return "local"
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
            return "local"
        kinds = set()
        for name in bounds:
            defs = self.defs_before(name, line)
            if not defs:
                default = self.defaults.get(name)
                if default in ("0", "None"):
                    self.root_risks.append(Evidence(str(self.src.path), line, f"the output is cut by `{name}` "
                                                    f"(default {default}): with a non-zero value the cut lands in "
                                                    "the wrong place on a local chunk"))
                    continue
                kinds.add("global")
                continue
            ln, _, v = defs[-1]
            reads = [a for a in find_all(v, cst.Attribute) if a.attr.value == "shape" and isinstance(a.value, cst.Name)
                     and (a.value.value in streams or a.value.value in self.params)]
            if not reads:
                kinds.add("global")
            elif ln > last.loop_end:
                kinds.add("local")
            else:
                kinds.add("lengths read before the loop")
        if "global" in kinds:
            return "global"
        return "lengths read before the loop" if "lengths read before the loop" in kinds else "local"

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
            if member in self.tree.nodes and names_read(call) & current:
                return Producer("module", member, line, self.src.code(value), sorted(names_read(call) - {"self"}))
        return None

    def side_modules(self, loop: Loop, streams: set[str]) -> list[tuple[str, bool, Evidence]]:
        """Modules whose output the loop body joins into a stream (`cat([enc, proj_i(...)])`)."""
        path = str(self.src.path)
        body_assigns = [(ln, names, value) for ln, names, value, _ in self.assigns
                        if loop.line < ln <= self.end_line(loop.node)]
        side: set[str] = set()
        for ln, names, value in body_assigns:
            if set(names) & streams and (loop.block_var or "") not in names_read(value):
                side |= names_read(value) - streams - {"self", loop.index_var or "", loop.block_var or ""}
        for ln, names, value in body_assigns:  # one step back inside the body: `cur = layers[i]`
            if set(names) & side:
                side |= names_read(value) - streams - {"self", loop.index_var or ""}
        closure = set(side)
        found: list[tuple[str, bool, Evidence]] = []
        for _ in range(6):
            grew = False
            for stmt in walk_statements(body_of(self.fwd)):
                line = self.src.line(stmt)
                if line >= loop.line or self.in_loop(line):
                    continue
                if isinstance(stmt, cst.SimpleStatementLine):
                    for small in stmt.body:
                        targets, value = _targets_value(small)
                        if value is None or not (targets & closure):
                            continue
                        new = names_read(value) - {"self"} - closure
                        if new:
                            closure |= new
                            grew = True
                        for call in find_all(value, cst.Call):
                            func = call.func
                            indexed = isinstance(func, cst.Subscript)
                            member = self_member(func.value if indexed else func)
                            if member in self.tree.nodes:
                                entry = (member, indexed, Evidence(path, line, f"`{self.src.code(small)[:70]}` feeds "
                                                                     "a tensor the loop body joins into a stream"))
                                if all(e[0] != entry[0] for e in found):
                                    found.append(entry)
            if not grew:
                break
        return found

    def batch_dropped(self) -> dict[str, Evidence]:
        """Parameters forward reduces to 2-D by dropping a batch axis (`if ids.ndim == 3: ids = ids[0]`)."""
        out: dict[str, Evidence] = {}
        for stmt in walk_statements(body_of(self.fwd)):
            if not isinstance(stmt, cst.If):
                continue
            test = self.src.code(stmt.test).replace(" ", "")
            for small in (s for line in body_of(stmt) if isinstance(line, cst.SimpleStatementLine) for s in line.body):
                if not (isinstance(small, cst.Assign) and isinstance(small.value, cst.Subscript)):
                    continue
                base = small.value.value
                names = [n for t in small.targets for n in target_names(t.target)]
                if (isinstance(base, cst.Name) and base.value in self.params and names == [base.value]
                        and (f"{base.value}.ndim==3" in test or f"len({base.value}.shape)==3" in test)):
                    out[base.value] = Evidence(str(self.src.path), self.src.line(stmt),
                                               f"`{self.src.code(stmt.test)}` drops the batch axis of `{base.value}`")
        return out

    def masks(self) -> list[tuple[str, str | None, Evidence]]:
        out = []
        path = str(self.src.path)
        for p in self.params:
            if "mask" in p.lower():
                out.append((p, None, Evidence(path, self.src.line(self.fwd), f"forward takes `{p}`")))
        for ln, names, value, _ in self.assigns:
            for n in names:
                if "mask" in n.lower() and len(names) == 1:
                    out.append((n, mask_kind(value), Evidence(path, ln, f"`{n} = {self.src.code(value)[:60]}`")))
        return out


def _joined(value: cst.BaseExpression) -> list[str]:
    """`torch.cat([a, b], dim=1)` -> ["a", "b"] when every element is a plain name."""
    if isinstance(value, cst.Call) and (dotted(value.func) or "") in ("torch.cat", "torch.concat") and value.args:
        seq = value.args[0].value
        if isinstance(seq, cst.List | cst.Tuple) and all(isinstance(e.value, cst.Name) for e in seq.elements):
            return [e.value.value for e in seq.elements]
    return []


def _targets_value(small: cst.CSTNode) -> tuple[set[str], cst.BaseExpression | None]:
    """Names a small statement defines and the value it reads; `xs.append(v)` defines xs from v."""
    if isinstance(small, cst.Assign):
        return {n for t in small.targets for n in target_names(t.target)}, small.value
    if isinstance(small, cst.AnnAssign):
        return set(target_names(small.target)), small.value
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        func = small.value.func
        if isinstance(func, cst.Attribute) and func.attr.value in ("append", "extend") and isinstance(
                func.value, cst.Name) and small.value.args:
            return {func.value.value}, small.value.args[0].value
    return set(), None


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
