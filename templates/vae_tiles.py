"""The generated VAE-P planner's `tiled_decode`: the VAE's own, rewritten by libcst with three named changes.

1. first statement (after the docstring): `<dealer> = _vaep_begin(self)`: the tile counter of this call starts at 0;
2. the row's loop body runs only for the tiles this rank owns (`if <dealer>.owns(): <body>; <row>.append(X)`, else
   `<row>.append(None)`); tile k of the call is owned by rank k % world size;
3. right after the tile loop: `<dealer>.gather(<rows>)` fills every `None` with the tile its owner decoded
   (broadcast over the VAE-P group), so the blending code after it runs unchanged on every rank.

Everything else is the model's code as libcst reprints it. The global names the function reads are imported from the
module that defines it (scope analysis: the names that resolve to that module's globals; builtins excepted).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from integrate.analyzers.records import VaeTiles
from libcst.metadata import BuiltinScope, GlobalScope, MetadataWrapper, ScopeProvider

from integrate import escape
from integrate.escape import Code, UnsafeValue
from integrate.source import SourceFile

# names the planner module defines or imports itself: a global of the VAE's module with one of these names
# would be shadowed (or shadow ours)
RESERVED = frozenset({"_vaep_begin", "_TileDealer", "parallelize_tiled_decode", "tile_counts", "types", "logging",
                      "torch", "dist", "init_device_mesh", "AutoEncoderDataParallelismPlanner",
                      "AutoEncoderDataParallelismPlannerRegister", "REGISTERED", "ANSWERED_BY", "TILED_DECODE_FROM"})


@dataclass(frozen=True)
class TiledDecode:
    code: Code  # the rewritten function, a module-level `def tiled_decode(self, ...)`
    imports: tuple[tuple[str, str | None], ...]  # (module, name) the function's global names come from
    changes: tuple[str, ...]  # what was changed, for the planner's docstring


def _fresh(fn: cst.FunctionDef, base: str) -> str:
    used = {n.value for n in _names(fn)}
    name, k = base, 1
    while name in used:
        name, k = f"{base}{k}", k + 1
    return name


def _names(node: cst.CSTNode):
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Name):
            yield n
        stack.extend(n.children)


def _stmt(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code)


class _Deal(cst.CSTTransformer):
    """Applies changes 2 and 3 to the outer tile loop (found by identity) of the function."""

    def __init__(self, outer: cst.For, dealer: str, row: str, rows: str) -> None:
        self.outer, self.dealer, self.row, self.rows = outer, dealer, row, rows
        self.done = 0

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        body = list(updated.body)
        for k, stmt in enumerate(original.body):
            if stmt is self.outer:
                body[k:k + 1] = [self._outer(body[k]), _stmt(f"{self.dealer}.gather({self.rows})\n")]
                self.done += 1
                return updated.with_changes(body=body)
        return updated

    def _outer(self, outer: cst.For) -> cst.For:
        stmts = list(outer.body.body)
        inner = stmts[-2]
        tile = list(inner.body.body)
        owned = cst.If(test=cst.parse_expression(f"{self.dealer}.owns()"),
                       body=cst.IndentedBlock(body=tile),
                       orelse=cst.Else(body=cst.IndentedBlock(body=[_stmt(f"{self.row}.append(None)\n")])))
        stmts[-2] = inner.with_changes(body=inner.body.with_changes(body=[owned]))
        return outer.with_changes(body=outer.body.with_changes(body=stmts))


def _outer_loop(src: SourceFile, fn: cst.FunctionDef, line: int) -> cst.For:
    for stmt in fn.body.body:
        if isinstance(stmt, cst.For) and src.line(stmt) == line:
            return stmt
    raise UnsafeValue(f"the tile loop at line {line} is not at the top level of tiled_decode: not rewritten")


def global_names(src: SourceFile, fn: cst.FunctionDef) -> tuple[set[str], set[str]]:
    """(names the function reads that resolve to its module's globals, names that resolve nowhere), by libcst's
    scope analysis of the module."""
    wrapper = MetadataWrapper(src.module, unsafe_skip_copy=True)
    scopes = wrapper.resolve(ScopeProvider)
    inside = {id(n) for n in _all(fn)}
    found, missing = set(), set()
    for scope in {s for s in scopes.values() if s is not None}:
        for access in scope.accesses:
            if id(access.node) not in inside:
                continue
            name = access.node.value if isinstance(access.node, cst.Name) else None
            if name is None:
                continue
            where = {type(a.scope) for a in access.referents}
            if not where:
                missing.add(name)
            elif GlobalScope in where:
                found.add(name)
            elif where <= {BuiltinScope}:
                continue
    return found, missing


def _all(node: cst.CSTNode):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children)


def rewrite(src: SourceFile, fn: cst.FunctionDef, tiles: VaeTiles) -> TiledDecode:
    """The dealt copy of `fn`; UnsafeValue where it cannot be written (the caller lists it as manual)."""
    if not (tiles.understood and tiles.loop and tiles.row and tiles.rows and src.dotted_name):
        raise UnsafeValue("the tile loop was not understood: no planner written")
    row, rows = escape.ident(tiles.row), escape.ident(tiles.rows)
    module = escape.dotted(src.dotted_name)
    params = list(fn.params.posonly_params) + list(fn.params.params)
    if not params:
        raise UnsafeValue("tiled_decode takes no `self`")
    me = escape.ident(params[0].name.value)
    outer = _outer_loop(src, fn, tiles.loop.line)
    dealer = _fresh(fn, "_vaep")
    found, missing = global_names(src, fn)
    if missing and not src.stars:
        raise UnsafeValue(f"tiled_decode reads {', '.join(sorted(missing))}, defined nowhere in {module}")
    imports: set[tuple[str, str | None]] = set()
    for name in sorted(found | (missing if src.stars else set())):
        escape.ident(name)
        imp = src.imports.get(name)
        pair = (imp.module, None) if imp is not None and imp.name is None and imp.module == name else (module, name)
        if name in RESERVED and pair != ("torch", None):
            raise UnsafeValue(f"tiled_decode reads the global `{name}`, a name the planner module defines itself")
        imports.add(pair)
    deal = _Deal(outer, dealer, row, rows)
    new = fn.visit(deal)
    if deal.done != 1:
        raise UnsafeValue("the tile loop was not found again in tiled_decode: not rewritten")
    body = list(new.body.body)
    first = 1 if body and _docstring(body[0]) else 0
    body.insert(first, _stmt(f"{dealer} = _vaep_begin({me})\n"))
    new = new.with_changes(body=new.body.with_changes(body=body), name=cst.Name("tiled_decode"),
                           leading_lines=[])
    code = cst.Module(body=[new]).code
    escape.check_python(code, "tiled_decode")
    cst.parse_module(code)  # the rendered function is libcst's own output: it parses again
    changes = (f"`{dealer} = _vaep_begin({me})` first: this call's tile counter starts at 0",
               f"the body of the row's loop runs for the tiles this rank owns; `{row}.append(None)` for the others",
               f"`{dealer}.gather({rows})` after the tile loop: each tile broadcast from its owner to every rank")
    return TiledDecode(Code(code), tuple(sorted(imports, key=lambda p: (p[0], p[1] or ""))), changes)


def _docstring(stmt: cst.CSTNode) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))
