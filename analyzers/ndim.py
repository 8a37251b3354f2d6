"""How many dimensions a tensor has, read from the code that builds it (pipeline helpers included).

`ndim_of(ws, src, fn, expr)` follows names to their last assignment, `self.method(...)` calls to the
method's return (tuple returns by position), and counts dims through reshape / view / expand,
unsqueeze / squeeze / indexing, cat and a few constructors. Anything else is None: unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from integrate.defuse import ASSIGNS, defuse
from integrate.resolve import Resolved, Workspace
from integrate.source import SourceFile, base_names, dotted, find_method
from integrate.syntax import find_all, self_member

from .values import UNKNOWN, evaluate, is_known

MAX_DEPTH = 16
_SAME = {"to", "float", "half", "contiguous", "clone", "detach", "type", "type_as", "long", "int", "bool", "cpu",
         "cuda", "masked_fill", "flip", "roll", "cos", "sin", "exp", "sigmoid", "neg", "abs", "repeat_interleave"}
_SHAPE_ARGS = {"reshape", "view", "expand", "repeat"}
_CONSTRUCT = {"zeros", "ones", "randn", "rand", "empty", "full"}


def ndim_of(ws: Workspace, src: SourceFile, fn: cst.FunctionDef, expr: cst.BaseExpression,
            cls: cst.ClassDef | None = None, depth: int = 0, before: int | None = None) -> int | None:
    """The rank of `expr` as `fn` has it before line `before` (`cls`: the class whose methods `self.m(...)`
    names); None when the code does not say."""
    if depth > MAX_DEPTH:
        return None
    at = _At(ws, src, fn, cls, depth, before)
    if isinstance(expr, cst.Name):
        return _name_ndim(at, expr.value)
    if isinstance(expr, cst.Subscript):
        base = at.again(expr.value)
        added = sum(1 for el in expr.slice if isinstance(el.slice, cst.Index) and dotted(el.slice.value) == "None")
        return base - _dropped(expr) + added if base is not None else None
    if not isinstance(expr, cst.Call):
        return None
    func = expr.func
    name = dotted(func) or ""
    if isinstance(func, cst.Name) and ws is not None:  # a module-level helper: the return this call takes
        return _function_return(ws, src, expr, None, depth)
    if not isinstance(func, cst.Attribute):
        return None
    if name.startswith("torch.") and name.count(".") == 1:
        return _torch_ndim(at, func.attr.value, expr)
    if name.startswith("self.") and name.count(".") == 1 and cls is not None:
        return _method_return(ws, src, cls, func.attr.value, None, depth)
    return _method_ndim(at, func.attr.value, expr)


@dataclass(frozen=True)
class _At:
    """Where `ndim_of` reads: the function, its class, the recursion depth and the line it reads before."""

    ws: Workspace
    src: SourceFile
    fn: cst.FunctionDef
    cls: cst.ClassDef | None
    depth: int
    before: int | None

    def again(self, expr: cst.BaseExpression) -> int | None:
        """`ndim_of` one level deeper, before the same line."""
        return self.before_line(expr, self.before)

    def before_line(self, expr: cst.BaseExpression | None, before: int | None) -> int | None:
        """`ndim_of` one level deeper, before line `before`; None for no expression."""
        if expr is None:
            return None
        return ndim_of(self.ws, self.src, self.fn, expr, self.cls, self.depth + 1, before)


def _dropped(sub: cst.Subscript) -> int:
    """Axes an index drops: each plain index (`x[0]`), not a `None` (new axis), a slice or an ellipsis."""
    return sum(1 for el in sub.slice if isinstance(el.slice, cst.Index)
               and dotted(el.slice.value) != "None" and not isinstance(el.slice.value, cst.Ellipsis))


def _name_ndim(at: _At, name: str) -> int | None:
    """A local: the rank of its last assignment (an element of a tuple, for an unpacking)."""
    value, index, line = last_assignment(at.src, at.fn, name, at.before)
    if value is None:
        return None
    guard = _guarded_ndim(at.src, at.fn, name, line)
    if guard is not None and isinstance(value, cst.Subscript):
        return guard - _dropped(value)  # `if x.ndim == 3: x = x[0]`: 2-D whichever way the branch goes
    if index is not None:
        return _element(at.ws, at.src, at.fn, value, index, at.cls, at.depth, line)
    return at.before_line(value, line)


def _torch_ndim(at: _At, op: str, call: cst.Call) -> int | None:
    """`torch.<op>(...)`: cat keeps its first element's rank, stack adds one, the constructors count sizes."""
    plain = [a for a in call.args if a.keyword is None]
    if op in ("cat", "concat") and call.args:
        seq = call.args[0].value
        if isinstance(seq, cst.List | cst.Tuple) and seq.elements:
            return at.again(seq.elements[0].value)
        return None
    if op == "stack" and call.args:
        return _stack_ndim(at, call.args[0].value)
    if op in ("cartesian_prod", "outer"):
        return 2
    if op in ("arange", "linspace", "logspace"):
        return 1
    if op in _CONSTRUCT and plain and not any(a.star for a in plain):
        sizes = plain[:1] if op == "full" else plain
        first = sizes[0].value
        if len(sizes) == 1 and isinstance(first, cst.Name):  # `torch.randn(shape)`: the tuple it names
            first, _, _ = last_assignment(at.src, at.fn, first.value, at.before)
        if isinstance(first, cst.Tuple | cst.List):
            return len(first.elements)
        if len(sizes) == 1 and not isinstance(first, cst.Integer):
            return None  # one size that is not a literal: a shape or a count, the code does not say
        return len(plain) - (1 if op == "full" else 0)
    return None


def _stack_ndim(at: _At, seq: cst.BaseExpression) -> int | None:
    """`torch.stack(seq)`: one more than an element's rank (a list literal's first, or the first `seq.append(x)`)."""
    first, before = None, at.before
    if isinstance(seq, cst.List | cst.Tuple) and seq.elements:
        first = seq.elements[0].value
    elif isinstance(seq, cst.Name):  # a list built by `seq.append(x)`
        for call in find_all(at.fn, cst.Call):
            if (isinstance(call.func, cst.Attribute) and call.func.attr.value == "append"
                    and dotted(call.func.value) == seq.value and call.args):
                first, before = call.args[0].value, at.src.line(call) + 1
                break
    inner = at.before_line(first, before)
    return inner + 1 if inner is not None else None


def _method_ndim(at: _At, method: str, call: cst.Call) -> int | None:
    """`x.<method>(...)`: the rank of x through a same-rank op, reshape / view / expand / repeat's sizes, or
    unsqueeze / squeeze."""
    plain = [a for a in call.args if a.keyword is None]
    base = at.again(call.func.value)
    if method in _SAME:
        return base
    if method in _SHAPE_ARGS and plain and not any(a.star for a in plain):
        if method == "repeat" and base is not None and len(plain) < base:
            return base
        first = plain[0].value
        if len(plain) == 1 and isinstance(first, cst.Tuple | cst.List):
            return len(first.elements)
        return len(plain)
    if base is None:
        return None
    if method == "unsqueeze":
        return base + 1
    if method == "squeeze":
        return base - 1 if plain else None
    return None


def _guarded_ndim(src: SourceFile, fn: cst.FunctionDef, name: str, line: int) -> int | None:
    """N when the assignment at `line` sits under `if name.ndim == N` / `if len(name.shape) == N`."""
    for stmt in find_all(fn, cst.If):
        body = stmt.body.body
        if not body or not (src.line(body[0]) <= line <= src.line(body[-1])):
            continue
        test = stmt.test
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(
                test.comparisons[0].operator, cst.Equal) and isinstance(test.comparisons[0].comparator, cst.Integer):
            left = src.code(test.left).replace(" ", "")
            if left in (f"{name}.ndim", f"len({name}.shape)", f"{name}.dim()"):
                return int(test.comparisons[0].comparator.value)
    return None


def last_assignment(src: SourceFile, fn: cst.FunctionDef, name: str, before: int | None):
    """(value, tuple index or None, line) of the last assignment to `name` in fn before `before`."""
    found = [d for d in defuse(src, fn).of(name, ASSIGNS) if before is None or d.line < before]
    if not found:
        return None, None, None
    last = found[-1]
    return last.whole, (last.names.index(name) if last.unpacked else None), last.line


def _element(ws, src, fn, value, index, cls, depth, line):
    if isinstance(value, cst.Tuple) and index < len(value.elements):
        return ndim_of(ws, src, fn, value.elements[index].value, cls, depth + 1, line)
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and ws is not None:
        return _function_return(ws, src, value, index, depth)  # `cos, sin = helper(...)`
    if isinstance(value, cst.Call) and cls is not None:
        name = dotted(value.func) or ""
        if name.startswith("self.") and name.count(".") == 1:
            return _method_return(ws, src, cls, self_member(value.func), index, depth)
    return None


def _function_return(ws: Workspace, src: SourceFile, call: cst.Call, index: int | None, depth: int) -> int | None:
    """The rank of what the module-level function `call` names returns (element `index` of a tuple return): the
    return its literal flags take (`get_1d_rotary_pos_embed(..., use_real=True, repeat_interleave_real=False)`
    takes the `elif use_real:` branch's pair), else its last."""
    found = ws.resolve(src, call.func.value)
    if not (isinstance(found, Resolved) and isinstance(found.node, cst.FunctionDef)):
        return None
    return _rank_returned(ws, found.src, found.node, None, _returns_taken(found.node, call), index, depth)


def _rank_returned(ws: Workspace, src: SourceFile, fn: cst.FunctionDef, cls: cst.ClassDef | None,
                   returns: list[cst.Return], index: int | None, depth: int) -> int | None:
    """The rank of the last of `returns` (of its element `index`, for a tuple return), read in `fn`."""
    if not returns:
        return None
    value = returns[-1].value
    if index is not None:
        if not isinstance(value, cst.Tuple) or index >= len(value.elements):
            return None
        value = value.elements[index].value
    return ndim_of(ws, src, fn, value, cls, depth + 1, src.line(returns[-1]) + 1)


def _returns_taken(fn: cst.FunctionDef, call: cst.Call) -> list[cst.Return]:
    """The returns of `fn` a call can reach: an `if` whose test the call's literal arguments (and the literal
    defaults of the rest) decide follows that branch alone; any other `if` both. A call with no literal flags
    reaches every return."""
    params = list(fn.params.params) + list(fn.params.kwonly_params)
    env: dict = {p.name.value: evaluate(p.default, {}) if p.default is not None else UNKNOWN for p in params}
    positional = list(fn.params.params)
    for i, arg in enumerate(a for a in call.args if a.keyword is None and not a.star):
        if i < len(positional):
            env[positional[i].name.value] = evaluate(arg.value, {})
    for arg in call.args:
        if arg.keyword is not None:
            env[arg.keyword.value] = evaluate(arg.value, {})
    out: list[cst.Return] = []

    def walk(body) -> None:
        for stmt in body:
            if isinstance(stmt, cst.If):
                test = evaluate(stmt.test, env)
                if not is_known(test) or test:
                    walk(stmt.body.body)
                if (not is_known(test) or not test) and stmt.orelse is not None:
                    walk([stmt.orelse] if isinstance(stmt.orelse, cst.If) else stmt.orelse.body.body)
                continue
            out.extend(r for r in find_all(stmt, cst.Return) if r.value is not None)

    walk(fn.body.body)
    return out


def _method_return(ws: Workspace, src: SourceFile, cls: cst.ClassDef, method: str, index: int | None, depth: int):
    found = _find_method(ws, src, cls, method)
    if found is None:
        return None
    m_src, m_cls, fn = found
    return _rank_returned(ws, m_src, fn, m_cls, [r for r in find_all(fn, cst.Return) if r.value is not None], index,
                          depth)


def _find_method(ws: Workspace, src: SourceFile, cls: cst.ClassDef, name: str, depth: int = 0):
    fn = find_method(cls, name)
    if fn is not None:
        return src, cls, fn
    if depth > 4:
        return None
    for base in base_names(cls):
        found = ws.resolve(src, base)
        if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
            got = _find_method(ws, found.src, found.node, name, depth + 1)
            if got is not None:
                return got
    return None
