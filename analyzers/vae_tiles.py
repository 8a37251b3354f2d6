"""A VAE cache-dit does not register: where its `tiled_decode` is, and whether its tile loop has the shape a
generated VAE-P planner can deal to ranks; or a registered base whose planner answers for it.

The understood shape (everything read with libcst, nothing imported):

    rows = []
    for i in range(...):
        row = []
        for j in range(...):
            <one tile: reads no name it assigns before assigning it, writes nothing that outlives the tile>
            row.append(<expr>)
        rows.append(row)
    <code that reads `rows` (and no name the tile body assigned before assigning it again)>

Each iteration of the inner loop is then independent: a rank can skip the tiles it does not own and receive them
afterwards. Anything else is answered with the line the reading stopped at and why (a planner that silently decodes
every tile on every rank is never the answer).
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from integrate.errors import InputError
from integrate.records import Evidence
from integrate.resolve import External, Resolved, Workspace
from integrate.source import SourceFile, base_names, dotted, find_method

from .records import VaeReuse, VaeTiles
from .registries import MAX_DEPTH, ROOT_BASES, VAE_REGISTER, registrations

# methods a built-in planner replaces or calls on the VAE: a subclass overriding one is not the class it was written for
BUILTIN_METHODS = ("tiled_decode", "_decode", "decode", "tiled_encode", "_tiled_encode", "_encode", "encode",
                   "blend_v", "blend_h", "blend_t", "enable_tiling")
# methods that change the object they are called on (a call on a name from outside the tile outlives the tile)
MUTATORS = frozenset({"append", "extend", "insert", "pop", "update", "add", "setdefault", "clear", "remove",
                      "popitem", "discard", "sort", "reverse", "copy_", "add_", "mul_", "zero_", "fill_", "sub_",
                      "div_", "index_put_", "scatter_", "masked_fill_", "clamp_", "append_"})
_EXITS = (cst.Return, cst.Yield, cst.Await, cst.Global, cst.Nonlocal, cst.Del, cst.FunctionDef, cst.ClassDef,
          cst.NamedExpr)


class _NotUnderstood(Exception):
    def __init__(self, node: cst.CSTNode | None, why: str) -> None:
        super().__init__(why)
        self.node, self.why = node, why


# -- where the class and its tiled_decode are --------------------------------------------------------------------


def locate(ws: Workspace, library: str | None, cls: str) -> tuple[SourceFile, cst.ClassDef] | str:
    """The VAE class's source, found through the package model_index names (diffusers, or a repository's package on
    a source root); a note when it is not found."""
    if not library or not all(p.isidentifier() for p in library.split(".")) or not cls.isidentifier():
        return f"the VAE entry [{library!r}, {cls!r}] is not a package and a class name: its source is not read"
    try:
        found = ws.locate_class(library, cls)
    except InputError as exc:
        return f"the source of `{cls}` was not found: {exc}"
    if not isinstance(found.node, cst.ClassDef):
        return f"`{library}.{cls}` is not a class"
    return found.src, found.node


def _ancestors(ws: Workspace, src: SourceFile, node: cst.ClassDef) -> list[tuple[SourceFile, cst.ClassDef]]:
    """The class and its bases, depth first (the MRO for single inheritance); a base imported from an installed
    package (`from diffusers import AutoencoderKL`) is followed into that package's source."""
    out: list[tuple[SourceFile, cst.ClassDef]] = []
    stack = [(src, node)]
    while stack and len(out) < MAX_DEPTH:
        s, n = stack.pop(0)
        if n.name.value in ROOT_BASES or any(n is seen for _, seen in out):
            continue
        out.append((s, n))
        bases = []
        for b in base_names(n):
            found = ws.resolve(s, b)
            if isinstance(found, External) and found.qualname.split(".")[0] in ("diffusers",):
                try:
                    found = ws.locate_class("diffusers", found.qualname.rsplit(".", 1)[-1])
                except InputError:
                    continue
            if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
                bases.append((found.src, found.node))
        stack[:0] = bases
    return out


def _class_ev(src: SourceFile, node: cst.ClassDef, why: str) -> Evidence:
    return Evidence(str(src.path), src.line(node), why)


def reuse(ws: Workspace, src: SourceFile, node: cst.ClassDef, registry: dict[str, Evidence] | None
          ) -> tuple[VaeReuse | None, str | None]:
    """(reuse, note): the first base cache-dit registers, when no class from `node` up to it overrides a method its
    planner replaces or calls; else a note naming the override."""
    if not registry:
        return None, None
    chain = _ancestors(ws, src, node)
    for k, (s, n) in enumerate(chain[1:], start=1):
        name = n.name.value
        if name not in registry:
            continue
        for s2, n2 in chain[:k]:
            for meth in BUILTIN_METHODS:
                m = find_method(n2, meth)
                if m is not None:
                    return None, (f"{node.name.value} derives from {name}, which cache-dit registers, but "
                                  f"{n2.name.value} overrides `{meth}` ({Path(s2.path).name}:{s2.line(m)}): that "
                                  "planner was not written for it")
        reg = registry[name]
        planner = _registered_class(ws, reg)
        if planner is None:
            return None, f"the planner registered for {name} at {reg.file}:{reg.line} was not found"
        steps = tuple(_class_ev(s2, n2, f"{n2.name.value}" + (f" derives from {chain[i + 1][1].name.value}"
                                                               if i < k else ", registered by cache-dit"))
                      for i, (s2, n2) in enumerate(chain[:k + 1]))
        return VaeReuse(name, planner[0], planner[1], (*steps, reg)), None
    return None, None


def _registered_class(ws: Workspace, reg: Evidence) -> tuple[str, str] | None:
    """(planner class, module) of the class decorated by the registration at `reg`."""
    root = ws.package_root("cache_dit")
    if root is None:
        return None
    try:
        src = ws.load(Path(reg.file), root)
    except InputError:
        return None
    for node in src.classes.values():
        if any(src.line(d.decorator) == reg.line for d in node.decorators) and src.dotted_name:
            return node.name.value, src.dotted_name
    return None


def tiled_decode(ws: Workspace, src: SourceFile, node: cst.ClassDef
                 ) -> tuple[SourceFile, cst.ClassDef, cst.FunctionDef] | None:
    """The `tiled_decode` the class runs: its own, else the first base's (depth first)."""
    for s, n in _ancestors(ws, src, node):
        fn = find_method(n, "tiled_decode")
        if fn is not None:
            return s, n, fn
    return None


# -- the tile loop ------------------------------------------------------------------------------------------------


def _bound(target: cst.BaseExpression) -> set[str]:
    """Names an assignment target binds (`a, (b, *c) = ...`); an attribute or subscript binds none."""
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        out: set[str] = set()
        for el in target.elements:
            out |= _bound(el.value)
        return out
    if isinstance(target, cst.StarredElement):
        return _bound(target.value)
    return set()


def _small_binds(small: cst.CSTNode) -> set[str]:
    if isinstance(small, cst.Assign):
        return set().union(*(_bound(t.target) for t in small.targets))
    if isinstance(small, (cst.AnnAssign, cst.AugAssign)):
        return _bound(small.target)
    return set()


def _all_bound(node: cst.CSTNode) -> set[str]:
    """Every name bound anywhere under `node` (assignments, loop targets, `with ... as`, imports)."""
    out: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        out |= _small_binds(n)
        if isinstance(n, cst.For):
            out |= _bound(n.target)
        elif isinstance(n, cst.WithItem) and n.asname is not None:
            out |= _bound(n.asname.name)
        elif isinstance(n, (cst.Import, cst.ImportFrom)) and not isinstance(n.names, cst.ImportStar):
            out |= {(a.asname.name.value if a.asname else dotted(a.name).split(".")[0]) for a in n.names
                    if not a.asname or isinstance(a.asname.name, cst.Name)}
        elif isinstance(n, cst.ExceptHandler) and n.name is not None:
            out |= _bound(n.name.name)
        stack.extend(_kids(n))
    return out


def _kids(node: cst.CSTNode) -> list[cst.CSTNode]:
    return list(node.children)


def _loads(node: cst.CSTNode) -> list[cst.Name]:
    """The names an expression or simple statement reads, in source order (assignment targets bind, except
    `x += y`, `x[i] = y` and `x.a = y`, which read x)."""
    out: list[cst.Name] = []

    def target(t: cst.CSTNode) -> None:
        if isinstance(t, (cst.Tuple, cst.List)):
            for el in t.elements:
                target(el.value)
        elif isinstance(t, cst.StarredElement):
            target(t.value)
        elif not isinstance(t, cst.Name):
            walk(t)

    def walk(n: cst.CSTNode) -> None:
        if isinstance(n, cst.Name):
            out.append(n)
        elif isinstance(n, cst.Attribute):
            walk(n.value)
        elif isinstance(n, cst.Arg):
            walk(n.value)
        elif isinstance(n, cst.Assign):
            walk(n.value)
            for t in n.targets:
                target(t.target)
        elif isinstance(n, cst.AnnAssign):
            if n.value is not None:
                walk(n.value)
            target(n.target)
        elif isinstance(n, cst.AugAssign):
            walk(n.target)
            walk(n.value)
        elif isinstance(n, cst.Lambda):
            params = {p.name.value for p in n.params.params}
            out.extend(x for x in _loads(n.body) if x.value not in params)
        else:
            for c in _kids(n):
                walk(c)

    walk(node)
    return out


def _unbound_read(stmts, watched: set[str], defined: set[str]) -> tuple[cst.CSTNode, str] | None:
    """The first read, in execution order, of a name in `watched` not certainly bound before it on every path
    (`defined`, updated in place): a name read before the code assigns it carries a value in from outside."""

    def check(node: cst.CSTNode, where: cst.CSTNode, bound: set[str]):
        for name in _loads(node):
            if name.value in watched and name.value not in bound:
                return where, name.value
        return None

    for stmt in stmts:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                hit = check(small, stmt, defined)
                if hit:
                    return hit
                defined |= _small_binds(small)
        elif isinstance(stmt, cst.For):
            hit = check(stmt.iter, stmt, defined) or _unbound_read(
                stmt.body.body, watched, defined | _bound(stmt.target))
            if hit:
                return hit
        elif isinstance(stmt, cst.While):
            hit = check(stmt.test, stmt, defined) or _unbound_read(stmt.body.body, watched, set(defined))
            if hit:
                return hit
        elif isinstance(stmt, cst.If):
            hit = check(stmt.test, stmt, defined)
            then, other = set(defined), set(defined)
            hit = hit or _unbound_read(stmt.body.body, watched, then)
            orelse = stmt.orelse
            if orelse is not None:
                hit = hit or _unbound_read([orelse] if isinstance(orelse, cst.If) else orelse.body.body, watched,
                                           other)
            if hit:
                return hit
            if orelse is not None:
                defined |= then & other
        elif isinstance(stmt, cst.With):
            for item in stmt.items:
                hit = check(item.item, stmt, defined)
                if hit:
                    return hit
                if item.asname is not None:
                    defined |= _bound(item.asname.name)
            hit = _unbound_read(stmt.body.body, watched, defined)
            if hit:
                return hit
        else:  # try, match, nested definitions: every name they read counts, and they bind nothing for certain
            hit = check(stmt, stmt, defined)
            if hit:
                return hit
    return None


def _range_for(node: cst.CSTNode) -> bool:
    return (isinstance(node, cst.For) and node.asynchronous is None and node.orelse is None
            and isinstance(node.target, cst.Name) and isinstance(node.iter, cst.Call)
            and dotted(node.iter.func) == "range")


def _empty_list(stmt: cst.CSTNode) -> str | None:
    """`name = []` -> name."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign):
        a = stmt.body[0]
        if (len(a.targets) == 1 and isinstance(a.targets[0].target, cst.Name) and isinstance(a.value, cst.List)
                and not a.value.elements):
            return a.targets[0].target.value
    return None


def _append(stmt: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """`name.append(expr)` -> (name, expr)."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr):
        call = stmt.body[0].value
        if (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "append"
                and isinstance(call.func.value, cst.Name) and len(call.args) == 1 and not call.args[0].star
                and call.args[0].keyword is None):
            return call.func.value.value, call.args[0].value
    return None


def _exits(stmts, in_loop: bool = False) -> cst.CSTNode | None:
    """A statement that leaves the tile body or changes scope (a break/continue of the tile loop itself, return,
    yield, await, global, del, a nested def)."""

    def scan(n: cst.CSTNode, depth: int) -> cst.CSTNode | None:
        if isinstance(n, _EXITS) or (isinstance(n, (cst.Break, cst.Continue)) and depth == 0):
            return n
        if isinstance(n, cst.Lambda):
            return None
        for c in _kids(n):
            hit = scan(c, depth + 1 if isinstance(n, (cst.For, cst.While)) and c is n.body else depth)
            if hit is not None:
                return hit
        return None

    for stmt in stmts:
        hit = scan(stmt, 1 if in_loop else 0)
        if hit is not None:
            return hit
    return None


def _outside_writes(stmts, local: set[str]) -> cst.CSTNode | None:
    """A write the tile body makes to something it did not create (`self.x = ..`, `buf[k] = ..`, `out.append(..)`):
    a rank that skips the tile would not make it."""
    for stmt in stmts:
        stack: list[cst.CSTNode] = [stmt]
        while stack:
            n = stack.pop()
            targets: list[cst.BaseExpression] = []
            if isinstance(n, cst.Assign):
                targets = [t.target for t in n.targets]
            elif isinstance(n, (cst.AugAssign, cst.AnnAssign)):
                targets = [n.target]
            for t in targets:
                for el in _flat(t):
                    root = _root(el)
                    if isinstance(el, (cst.Attribute, cst.Subscript)) and root not in local:
                        return n
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in MUTATORS:
                if _root(n.func.value) not in local:
                    return n
            stack.extend(_kids(n))
    return None


def _flat(t: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(t, (cst.Tuple, cst.List)):
        return [x for el in t.elements for x in _flat(el.value)]
    if isinstance(t, cst.StarredElement):
        return _flat(t.value)
    return [t]


def _root(expr: cst.BaseExpression) -> str | None:
    while isinstance(expr, (cst.Attribute, cst.Subscript)):
        expr = expr.value
    return expr.value if isinstance(expr, cst.Name) else None


def _mentions(node: cst.CSTNode, names: set[str]) -> cst.Name | None:
    return next((n for n in _loads(node) if n.value in names), None)


def tile_loop(fn: cst.FunctionDef) -> tuple[cst.For, str, str]:
    """(outer loop, row, rows) of the understood shape; raises _NotUnderstood with the node and why."""
    body = list(fn.body.body) if isinstance(fn.body, cst.IndentedBlock) else []
    if fn.asynchronous is not None:
        raise _NotUnderstood(fn, "tiled_decode is a coroutine")
    loops = [s for s in body if isinstance(s, (cst.For, cst.While))]
    if not loops:
        raise _NotUnderstood(fn, "tiled_decode has no loop over tiles at its top level")
    errors: list[_NotUnderstood] = []
    for outer in loops:
        try:
            return (outer, *_check(body, outer))
        except _NotUnderstood as exc:
            errors.append(exc)
    raise errors[0]


def _check(body: list, outer: cst.CSTNode) -> tuple[str, str]:
    if not _range_for(outer):
        raise _NotUnderstood(outer, "the tile loop is not `for <name> in range(...)` (without else)")
    stmts = list(outer.body.body)
    row = _empty_list(stmts[0]) if stmts else None
    last = _append(stmts[-1]) if stmts else None
    if row is None or last is None or last[1].__class__ is not cst.Name or last[1].value != row:
        raise _NotUnderstood(outer, "the tile loop's body is not `<row> = []` ... `<rows>.append(<row>)`")
    rows = last[0]
    inner = [s for s in stmts[1:-1] if isinstance(s, (cst.For, cst.While))]
    if len(inner) != 1 or not _range_for(inner[0]):
        raise _NotUnderstood(outer, "the tile loop's body holds not exactly one `for <name> in range(...)` loop "
                                    "over a row's tiles")
    inner_for = inner[0]
    k = stmts.index(inner_for)
    if k != len(stmts) - 2:
        raise _NotUnderstood(stmts[k + 1], "statements follow the row's loop before `<rows>.append(<row>)`")
    for s in stmts[1:k]:
        hit = _mentions(s, {row, rows})
        if hit is not None or _exits([s], in_loop=True) is not None:
            raise _NotUnderstood(s, f"a statement before the row's loop reads `{row}`/`{rows}` or leaves the loop")
    k0 = body.index(outer)
    init = [i for i, s in enumerate(body[:k0]) if _empty_list(s) == rows]
    if not init:
        raise _NotUnderstood(outer, f"`{rows} = []` is not assigned before the tile loop in tiled_decode")
    for s in body[init[-1] + 1:k0]:
        if _mentions(s, {rows}) is not None:
            raise _NotUnderstood(s, f"`{rows}` is used between `{rows} = []` and the tile loop")
    tile = list(inner_for.body.body)
    end = _append(tile[-1]) if tile else None
    if end is None or end[0] != row:
        raise _NotUnderstood(inner_for, f"the row's loop does not end with `{row}.append(<tile>)`")
    tile_body = tile[:-1]
    bad = _exits(tile_body)
    if bad is not None:
        raise _NotUnderstood(bad, "the tile body leaves the loop or changes scope (break, continue, return, yield, "
                                  "await, global, del, a nested def): its iterations are not independent")
    hit = _mentions(cst.IndentedBlock(body=tile), {rows}) or _mentions(cst.IndentedBlock(body=tile_body), {row}) \
        or _mentions(end[1], {row})
    if hit is not None:
        raise _NotUnderstood(hit, f"the tile body reads `{hit.value}`: a tile depends on the tiles before it")
    local = _all_bound(cst.IndentedBlock(body=tile_body))
    carried = _unbound_read(tile_body, local, set()) or _unbound_read(tile[-1:], local, _certain(tile_body))
    if carried is not None:
        raise _NotUnderstood(carried[0], f"the tile body reads `{carried[1]}` before assigning it: a value carried "
                                         "from one tile to the next")
    write = _outside_writes(tile_body, local)
    if write is not None:
        raise _NotUnderstood(write, "the tile body writes to something it did not create: a rank that skips the "
                                    "tile would not make that write")
    after = _unbound_read(body[k0 + 1:], local - {inner_for.target.value, outer.target.value}, set())
    if after is not None:
        raise _NotUnderstood(after[0], f"after the tile loop, `{after[1]}` is read, last assigned in the tile body: "
                                       "only the owner of the last tile has it")
    return row, rows


def _certain(stmts) -> set[str]:
    """Names certainly bound after running `stmts` (what `_unbound_read` leaves in `defined`)."""
    defined: set[str] = set()
    _unbound_read(stmts, set(), defined)
    return defined


def tile_facts(ws: Workspace, src: SourceFile, node: cst.ClassDef) -> VaeTiles:
    found = tiled_decode(ws, src, node)
    if found is None:
        ev = _class_ev(src, node, f"{node.name.value} and its bases define no `tiled_decode`")
        return VaeTiles(None, ev, False, None, None, None)
    s, owner, fn = found
    own = owner is node
    where = Evidence(str(s.path), s.line(fn), f"{owner.name.value}.tiled_decode"
                     + ("" if own else f" (inherited by {node.name.value})"))
    names = {n.value for n in _loads(fn)}
    hostile = sorted(n for n in names if n == "super" or n == "__class__")
    try:
        if hostile:
            raise _NotUnderstood(fn, f"tiled_decode reads `{hostile[0]}`, which means nothing outside its class")
        mangled = next((a for a in _attrs(fn) if a.startswith("__") and not a.endswith("__")), None)
        if mangled is not None:
            raise _NotUnderstood(fn, f"tiled_decode reads the private attribute `{mangled}`, whose name Python "
                                     "mangles inside its class only")
        outer, row, rows = tile_loop(fn)
    except _NotUnderstood as exc:
        node_ = exc.node if exc.node is not None else fn
        code = " ".join(s.code(node_).split())
        shown = f" (`{code[:77]}...`)" if len(code) > 80 else f" (`{code}`)"
        why = exc.why + (shown if not isinstance(node_, (cst.FunctionDef, cst.For, cst.While)) else "")
        return VaeTiles(where, Evidence(str(s.path), s.line(node_), why), False, s.dotted_name, None, None)
    why = (f"tile loop `for {outer.target.value}` over rows of `for` tiles, each appended to `{row}`, rows to "
           f"`{rows}`: every tile is decoded independently")
    return VaeTiles(where, Evidence(str(s.path), s.line(outer), why), True, s.dotted_name, row, rows)


def _attrs(fn: cst.FunctionDef) -> list[str]:
    out, stack = [], [fn]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Attribute):
            out.append(n.attr.value)
        stack.extend(_kids(n))
    return out


def vae_tiles(ws: Workspace, library: str | None, cls: str) -> tuple[VaeTiles | None, VaeReuse | None, tuple]:
    """(tiles, reuse, notes) for a VAE class no planner is registered for."""
    found = locate(ws, library, cls)
    if isinstance(found, str):
        return None, None, (found,)
    src, node = found
    used, note = reuse(ws, src, node, registrations(ws, "autoencoders", VAE_REGISTER))
    if used is not None:
        return None, used, ()
    return tile_facts(ws, src, node), None, (note,) if note else ()
