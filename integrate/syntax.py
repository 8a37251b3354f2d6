"""libcst helpers every stage shares: names read and written, statement walks, fast read-only tree search.

Nothing here knows about models; `integrate.defuse` builds the per-function def-use index on top of it.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections import OrderedDict
from collections.abc import Iterator

import libcst as cst

from integrate.source import dotted


BUILTINS = frozenset(dir(builtins))  # names Python binds in every module (`isinstance`, `len`, ...)

# attributes that describe a tensor without reading its values: `x.to(device=y.device)` takes no data from y
TENSOR_METADATA = frozenset({"device", "dtype", "shape", "ndim"})


def names_read(node: cst.CSTNode | None, *, data_only: bool = False, loads_only: bool = False) -> set[str]:
    """Names an expression or statement reads (`a.b` reads a; `f(k=v)` reads v, not k). `data_only`: leave out a
    name read only for its metadata (`y.device`, `y.dtype`, `y.shape`, `y.ndim`). `loads_only`: leave out the names
    an assignment or a `for` only binds (`x = y` reads y; `x[i] = y` reads x, i and y; `x += y` reads both)."""
    out: set[str] = set()
    stack = [node] if node is not None else []
    while stack:
        n = stack.pop()
        if loads_only and isinstance(n, (cst.AssignTarget, cst.AnnAssign, cst.For, cst.CompFor)):
            target = n.target
            stack.extend(c for c in children(n) if c is not target)
            stack.extend(_target_loads(target))
            continue
        if isinstance(n, cst.Name):
            out.add(n.value)
        elif isinstance(n, cst.Attribute):
            if not (data_only and n.attr.value in TENSOR_METADATA and isinstance(n.value, cst.Name)):
                stack.append(n.value)
        elif isinstance(n, cst.Arg):
            stack.append(n.value)
        elif not isinstance(n, cst.Lambda):
            stack.extend(children(n))
    return out


def _target_loads(target: cst.BaseExpression) -> list[cst.CSTNode]:
    """The parts of an assignment target that are read, not bound: a subscript's or attribute's base and index."""
    if isinstance(target, cst.Name):
        return []
    if isinstance(target, (cst.Tuple, cst.List)):
        return [part for el in target.elements for part in _target_loads(el.value)]
    if isinstance(target, cst.StarredElement):
        return _target_loads(target.value)
    return [target]


def target_names(target: cst.BaseExpression) -> list[str]:
    """Names bound by an assignment target, in order (`a, (b, c)` -> a, b, c)."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        out: list[str] = []
        for el in target.elements:
            out.extend(target_names(el.value))
        return out
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return []


def assigned_names(stmt: cst.CSTNode) -> set[str]:
    """Names a statement binds in its own scope: assignments (`=`, `+=`, `:=`), `for` targets, `as` names
    (with, except, import), imports, and the names of functions and classes it defines (not their insides)."""
    out: set[str] = set()

    class V(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for t in node.targets:
                out.update(target_names(t.target))

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            out.update(target_names(node.target))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            out.update(target_names(node.target))

        def visit_For(self, node: cst.For) -> None:
            out.update(target_names(node.target))

        def visit_AsName(self, node: cst.AsName) -> None:
            out.update(target_names(node.name))

        def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
            out.update(target_names(node.target))

        def visit_Import(self, node: cst.Import) -> None:
            out.update((dotted(a.name) or "").split(".")[0] for a in node.names if a.asname is None)

        def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
            if not isinstance(node.names, cst.ImportStar):
                out.update(dotted(a.name) or "" for a in node.names if a.asname is None)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            out.add(node.name.value)
            return False

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            out.add(node.name.value)
            return False

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

    stmt.visit(V())
    out.discard("")
    return out


def body_of(node: cst.CSTNode) -> list[cst.BaseStatement]:
    body = getattr(node, "body", None)
    if isinstance(body, cst.IndentedBlock):
        return list(body.body)
    if isinstance(body, cst.SimpleStatementSuite):
        return [cst.SimpleStatementLine(body=body.body)]
    return []


def walk_statements(stmts, *, into_functions: bool = False) -> Iterator[cst.BaseStatement]:
    """Every statement, depth first, in source order (not into nested defs unless asked)."""
    for stmt in stmts:
        yield stmt
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and not into_functions:
            continue
        yield from walk_statements(body_of(stmt), into_functions=into_functions)
        if isinstance(stmt, cst.If):
            orelse = stmt.orelse
            while orelse is not None:
                yield from walk_statements(body_of(orelse), into_functions=into_functions)
                orelse = getattr(orelse, "orelse", None) if isinstance(orelse, cst.If) else None
        elif isinstance(stmt, (cst.For, cst.While)) and stmt.orelse is not None:
            yield from walk_statements(body_of(stmt.orelse), into_functions=into_functions)
        elif isinstance(stmt, cst.Try):
            for handler in stmt.handlers:
                yield from walk_statements(body_of(handler), into_functions=into_functions)
            for extra in (stmt.orelse, stmt.finalbody):
                if extra is not None:
                    yield from walk_statements(body_of(extra), into_functions=into_functions)


_FIELDS: dict[type, tuple[str, ...]] = {}
_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


def children(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Child nodes in source order, read from the dataclass fields.

    libcst's own visitors rebuild every node they pass; a read-only walk does not need that.
    """
    yield from _child_list(node)


# What a field value is, by its type: 1 a libcst node, 2 a tuple or list, 0 anything else.
# (isinstance against libcst's abstract node classes is slow; a type seen once is known.)
_KIND: dict[type, int] = {}


def _kind(t: type) -> int:
    k = _KIND.get(t)
    if k is None:
        k = _KIND[t] = 1 if issubclass(t, cst.CSTNode) else 2 if issubclass(t, (tuple, list)) else 0
    return k


def _child_list(node: cst.CSTNode) -> list[cst.CSTNode]:
    names = _FIELDS.get(type(node))
    if names is None:
        names = _FIELDS[type(node)] = tuple(f.name for f in dataclasses.fields(node))
    out = []
    kinds = _KIND
    for name in names:
        value = getattr(node, name)
        k = kinds.get(type(value))
        if k is None:
            k = _kind(type(value))
        if k == 1:
            out.append(value)
        elif k == 2:
            for item in value:
                ki = kinds.get(type(item))
                if ki is None:
                    ki = _kind(type(item))
                if ki == 1:
                    out.append(item)
    return out


def find_all(node: cst.CSTNode, kind, *, skip_functions: bool = True) -> list:
    """All descendants of a type (parents first), not into nested defs/lambdas/classes.

    The analysers ask the same node for different kinds many times (a pipeline's `__call__` is
    searched once per traced name), so each node's walk is kept: its nodes in order and by type.
    """
    _, order, by_type, kinds = _walk_index(node, skip_functions)
    types = kinds.get(kind)
    if types is None:
        types = kinds[kind] = tuple(t for t in by_type if issubclass(t, kind))
    if not types:
        return []
    if len(types) == 1:
        return list(by_type[types[0]])
    wanted = set(types)
    return [n for n in order if type(n) in wanted]


# (id(node), skip_functions) -> (node, nodes in order, {type: nodes in order}, {kind: types}).
# The entry holds the node itself, so an id is never reused while its entry lives; least
# recently used entries are dropped past _INDEX_SIZE, which bounds what the index keeps alive.
_INDEX: OrderedDict[tuple[int, bool], tuple] = OrderedDict()
_INDEX_SIZE = 1024
_SCOPE_TYPES: dict[type, bool] = {}


def _walk_index(node: cst.CSTNode, skip_functions: bool) -> tuple:
    key = (id(node), skip_functions)
    entry = _INDEX.get(key)
    if entry is not None and entry[0] is node:
        _INDEX.move_to_end(key)
        return entry
    order: list = []
    stack = [node]
    scopes = _SCOPE_TYPES
    while stack:
        n = stack.pop()
        order.append(n)
        if skip_functions and n is not node:
            scope = scopes.get(type(n))
            if scope is None:
                scope = scopes[type(n)] = issubclass(type(n), _SCOPES)
            if scope:
                continue
        kids = _child_list(n)
        kids.reverse()
        stack.extend(kids)
    by_type: dict[type, list] = {}
    for n in order:
        by_type.setdefault(type(n), []).append(n)
    entry = (node, order, by_type, {})
    _INDEX[key] = entry
    if len(_INDEX) > _INDEX_SIZE:
        _INDEX.popitem(last=False)
    return entry


def self_attr(expr: cst.BaseExpression | None) -> str | None:
    """`self.foo` -> "foo"."""
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self":
        return expr.attr.value
    return None


def self_member(expr: cst.BaseExpression | None) -> str | None:
    """`self.attn.to_q` -> "attn.to_q": the dotted path after `self.`; None for anything else."""
    name = dotted(expr) if expr is not None else None
    return name[len("self."):] if name is not None and name.startswith("self.") else None


def name_defaults(fn: cst.FunctionDef) -> dict[str, str]:
    """{parameter: its default as a dotted name} for each parameter whose default is a name other than None
    (`block_cls=JointBlock`): a class the function builds under the parameter's name unless told otherwise."""
    p = fn.params
    out = {}
    for param in (*p.posonly_params, *p.params, *p.kwonly_params):
        name = dotted(param.default) if param.default is not None else None
        if name not in (None, "None"):
            out[param.name.value] = name
    return out


def params_of(fn: cst.FunctionDef) -> list[cst.Param]:
    p = fn.params
    return [*p.posonly_params, *p.params, *p.kwonly_params] + (
        [p.star_arg] if isinstance(p.star_arg, cst.Param) else []
    ) + ([p.star_kwarg] if p.star_kwarg is not None else [])


def none_test(expr: cst.BaseExpression | None) -> tuple[str, bool] | None:
    """`x is None` -> ("x", True), `x is not None` -> ("x", False): a plain name tested against None; else None."""
    if not (isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1 and isinstance(expr.left, cst.Name)):
        return None
    comp = expr.comparisons[0]
    if not (isinstance(comp.comparator, cst.Name) and comp.comparator.value == "None"
            and isinstance(comp.operator, (cst.Is, cst.IsNot))):
        return None
    return expr.left.value, isinstance(comp.operator, cst.Is)
