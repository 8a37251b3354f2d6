"""The forward a sequence reading is about (`Forward`): its parameters, the loops in it that call a block list,
its def-use index seen statement by statement, and who produced a value it hands the blocks (`Producer`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from integrate.defuse import ALL, Def, defuse
from integrate.source import SourceFile, dotted, iter_methods
from integrate.syntax import body_of, names_read, params_of, self_member, walk_statements

from .loops import Loop
from .modules import Tree

POSITION_WORDS = ("rotary", "rope", "freqs", "pos_emb", "pos_embed", "position", "pe")
PASSTHROUGH = {"to", "type_as", "float", "half", "bfloat16", "contiguous", "clone", "detach"}
TOKENWISE_LIBRARY = {"Linear", "LayerNorm", "RMSNorm", "SiLU", "GELU", "ReLU", "Tanh", "Mish", "Dropout",
                     "Identity", "ModuleList", "Sequential", "LazyLinear", "Sigmoid"}


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


def is_position(name: str) -> bool:
    low = name.lower()
    parts = low.replace(".", "_").split("_")
    return any(w in low for w in POSITION_WORDS if len(w) > 2) or "pe" in parts


class Forward:
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
        """The last line of a compound statement's body (a loop's, here)."""
        return max([self.src.line(node)] + [self.src.line(s) for s in walk_statements(body_of(node))
                                            if not isinstance(s, cst.IndentedBlock)])

    def in_loop(self, line: int) -> bool:
        """Whether `line` runs once per block: inside a loop that calls a block list."""
        return any(a <= line <= b for a, b in self.loop_spans)

    def defs_before(self, name: str, line: int, lo: int = 0) -> list[Def]:
        """Definitions of `name` in [lo, line) (a `for` target's is its iterable), in order; outside block loops
        unless the range is inside one."""
        inside = lo > 0 and self.in_loop(lo)
        return [d for d in self.index.before(name, line, ALL) if lo <= d.line and (inside or not self.in_loop(d.line))]

    def reach(self, name: str, line: int) -> list[tuple[str, int, Def | None]]:
        """What fed `name` at `line`, walked back through forward's definitions outside the block loops."""
        return self.index.reach(name, line, keep=lambda d: not self.in_loop(d.line))

    def producer_of(self, arg: str, loop: Loop) -> tuple[Producer, bool]:
        """What produced `arg` as the block call in `loop` receives it, and whether the loop body made it."""
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
        """The producer of `target`, bound with `names` to `value` on `line`: a sub-module, a method, a function or
        an inline expression (a tuple built inline gives each element's rank)."""
        code = self.src.code(value)
        reads = sorted(names_read(value) - {"self"})
        call = unwrap(value)
        if isinstance(value, cst.IfExp):
            call = unwrap(value.body)
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


def tokenwise_module(tree: Tree, attr: str) -> tuple[bool, str]:
    node = tree.nodes.get(attr)
    if node is None:
        return False, "unknown module"
    short = node.cls.rsplit(".", 1)[-1]
    if node.kind == "linear":
        return True, "Linear"
    if node.kind == "library":
        return short in TOKENWISE_LIBRARY, short
    subs = [n for p, n in tree.nodes.items() if p.startswith(attr + ".")]
    for n in subs:
        s = n.cls.rsplit(".", 1)[-1]
        if n.kind == "library" and s not in TOKENWISE_LIBRARY:
            return False, f"{short} holds {s}"
        if n.kind == "module" and ("Attention" in s or "Attn" in s or "Conv" in s):
            return False, f"{short} holds {s}"
    if not subs and "Norm" not in short:
        return False, f"{short} (no sub-modules to judge)"
    return True, short


def unwrap(value: cst.BaseExpression) -> cst.BaseExpression:
    """`self.x(h).to(dtype)` -> `self.x(h)`."""
    while (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
           and value.func.attr.value in PASSTHROUGH and isinstance(value.func.value, cst.Call)):
        value = value.func.value
    return value


def cat_names(value: cst.BaseExpression) -> list[str]:
    """`torch.cat([a, b], dim=1)` -> ["a", "b"] when every element is a plain name."""
    if isinstance(value, cst.Call) and (dotted(value.func) or "") in ("torch.cat", "torch.concat") and value.args:
        seq = value.args[0].value
        if isinstance(seq, cst.List | cst.Tuple) and all(isinstance(e.value, cst.Name) for e in seq.elements):
            return [e.value.value for e in seq.elements]
    return []
