"""One def-use index per function: which statement bound a name, and what fed it.

Every analyser asks the same two questions of a function body: "what was `x` last assigned before
line N?" and "which inputs (parameters, sub-module calls, attention attributes) reach `x`?". The index
answers both from one pass over the function, built the first time a function is asked about and kept
for as long as the function node lives (the same policy as `syntax.find_all`'s walk index).

A definition is one name bound by an assignment (`=`, annotated `=`) or a `for` target, in source order.
`statements(GROWS)` also lists each `xs.append(v)` / `xs.extend(v)` as a statement that feeds `xs` from `v`
(it binds nothing: no definition, and no step of `lineage`).
Nested functions, classes and lambdas are their own scopes and are not entered. What a definition holds:

- `value`: the expression this very name receives (`a` in `a, b = x, y` holds `x`); None when the
  statement unpacks something that is not a literal tuple (`a, b = f()`);
- `whole`: the statement's whole right-hand side (`f()` above), with `names` the flattened targets;
- `kind`: "assign", "annassign" or "for" (a `for` target is bound to its iterable).

`lineage(seed, initial)` propagates tags forward through the definitions: a definition's tags are what
`seed` says of its right-hand side plus the tags of every name that side reads, as they stand when the
statement runs. Querying `at(name, line)` gives the tags of the last definition strictly before `line`,
and `final(name)` those of the last definition; a name never defined gets `initial(name)`.

`reach(name, line)` walks the other way: from one use back through every definition that fed it.

libcst's ScopeProvider answers "which assignments can reach this name" too, but builds a metadata
wrapper (a deep copy of the module) and every scope of the file; the analysers need only one function's
straight-line order, and ask it thousands of times per model (docs/architecture.md has the measurement).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import libcst as cst

from integrate.source import SourceFile
from integrate.syntax import body_of, names_read, target_names, walk_statements

Kind = Literal["assign", "annassign", "for", "append"]
PLAIN: frozenset[Kind] = frozenset({"assign"})  # `=` alone
ASSIGNS: frozenset[Kind] = frozenset({"assign", "annassign"})
ALL: frozenset[Kind] = frozenset({"assign", "annassign", "for"})  # every kind that binds a name
GROWS: frozenset[Kind] = frozenset({"append"})  # `xs.append(v)`, `xs.extend(v)`: statements only
T = TypeVar("T")


@dataclass(frozen=True)
class Def:
    name: str
    line: int
    value: cst.BaseExpression | None  # what this name receives (None: unpacked from a non-literal)
    whole: cst.BaseExpression  # the statement's right-hand side (a `for` loop's iterable)
    names: tuple[str, ...]  # every name this target binds, flattened, in order
    unpacked: bool  # the target is a tuple or list
    kind: Kind
    node: cst.CSTNode  # the Assign / AnnAssign, or the For
    bound: tuple[str, ...]  # every name the statement binds (`a = b = f()`: a and b)


class DefUse:
    """The definitions of one function, in source order."""

    def __init__(self, src: SourceFile, fn: cst.FunctionDef | cst.BaseSuite | cst.CSTNode) -> None:
        """`fn`: a function, or any statement with a body (a loop's own body, without its `else`), or a block."""
        self.src = src
        self.defs: list[Def] = []
        self._by_name: dict[str, list[Def]] = {}
        self._statements: list[tuple[int, tuple[str, ...], cst.BaseExpression, cst.CSTNode, Kind]] = []
        stmts = list(fn.body) if isinstance(fn, cst.IndentedBlock) else body_of(fn)
        for stmt in walk_statements(stmts):
            line = src.line(stmt)
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Assign):
                        names = tuple(n for t in small.targets for n in target_names(t.target))
                        for t in small.targets:
                            self._bind(line, t.target, small.value, small.value, "assign", small, names)
                        self._statements.append((line, names, small.value, small, "assign"))
                    elif isinstance(small, cst.AnnAssign) and small.value is not None:
                        names = tuple(target_names(small.target))
                        self._bind(line, small.target, small.value, small.value, "annassign", small, names)
                        self._statements.append((line, names, small.value, small, "annassign"))
                    elif isinstance(small, cst.Expr) and (grown := _grown(small.value)) is not None:
                        self._statements.append((line, (grown[0],), grown[1], small, "append"))
            elif isinstance(stmt, cst.For):
                names = tuple(target_names(stmt.target))
                self._bind(line, stmt.target, None, stmt.iter, "for", stmt, names)
                self._statements.append((line, names, stmt.iter, stmt, "for"))

    def _bind(self, line: int, target: cst.BaseExpression, value, whole, kind: Kind, node, bound: tuple[str, ...],
              names=None) -> None:
        names = names if names is not None else tuple(target_names(target))
        if isinstance(target, cst.Name):
            d = Def(target.value, line, value if kind != "for" else whole, whole, names, False, kind, node, bound)
            self.defs.append(d)
            self._by_name.setdefault(d.name, []).append(d)
        elif isinstance(target, (cst.Tuple, cst.List)):
            elements = value.elements if isinstance(value, (cst.Tuple, cst.List)) else None
            for i, el in enumerate(target.elements):
                sub = elements[i].value if elements is not None and i < len(elements) else None
                starred = isinstance(el.value, cst.StarredElement)
                inner = el.value.value if starred else el.value
                if isinstance(inner, cst.Name):
                    held = None if kind == "for" or starred else sub
                    d = Def(inner.value, line, held, whole, names, True, kind, node, bound)
                    self.defs.append(d)
                    self._by_name.setdefault(d.name, []).append(d)
                else:
                    self._bind(line, inner, sub, whole, kind, node, bound, names)

    # -- questions -------------------------------------------------------------------------------

    def of(self, name: str, kinds: frozenset[Kind] = ALL) -> list[Def]:
        return [d for d in self._by_name.get(name, ()) if d.kind in kinds]

    def before(self, name: str, line: int, kinds: frozenset[Kind] = ASSIGNS) -> list[Def]:
        """Definitions of `name` on lines strictly before `line`, in source order."""
        return [d for d in self.of(name, kinds) if d.line < line]

    def last_before(self, name: str, line: int, kinds: frozenset[Kind] = ASSIGNS) -> Def | None:
        found = self.before(name, line, kinds)
        return found[-1] if found else None

    def reach(self, name: str, line: int, keep: Callable[[Def], bool] = lambda d: True,
              limit: int = 200) -> list[tuple[str, int, Def | None]]:
        """What fed `name` as the statement on `line` sees it, walked back: its last definition before that line
        (of any kind, among those `keep` accepts), then each name that definition's right-hand side reads, but
        `self`, as of the definition's line; depth first, names in sorted order. Each (name, line) comes once,
        with the definition found, or None where there is none (a parameter, a global, a name `keep` hides);
        the walk stops taking new pairs once it holds more than `limit`."""
        out: list[tuple[str, int, Def | None]] = []
        seen: set[tuple[str, int]] = set()
        stack = [(name, line)]
        while stack:
            n, before = stack.pop()
            if (n, before) in seen or len(seen) > limit:
                continue
            seen.add((n, before))
            found = [d for d in self.before(n, before, ALL) if keep(d)]
            d = found[-1] if found else None
            out.append((n, before, d))
            if d is not None:
                stack += [(r, d.line) for r in sorted(names_read(d.whole) - {"self"})]
        return out

    def statements(self, kinds: frozenset[Kind] = ALL) -> list[tuple[int, tuple[str, ...], cst.BaseExpression,
                                                                     cst.CSTNode]]:
        """(line, every name bound, right-hand side, node) once per statement, in source order."""
        return [(line, names, value, node) for line, names, value, node, kind in self._statements if kind in kinds]

    def lineage(self, seed: Callable[[cst.BaseExpression], Iterable[T]],
                initial: Callable[[str], Iterable[T]] = lambda name: (),
                reads: Callable[[cst.BaseExpression], Iterable[str]] = names_read) -> Lineage[T]:
        """Tags propagated forward through the assignments (see the module docstring); `reads` says which
        names an expression reads (`names_read` by default)."""
        return Lineage(self, seed, initial, reads)


class Lineage(Generic[T]):
    """Tags propagated forward through a function's assignments (see the module docstring)."""

    def __init__(self, index: DefUse, seed, initial, reads) -> None:
        self._initial, self._reads = initial, reads
        self._history: dict[str, list[tuple[int, frozenset]]] = {}
        current: dict[str, frozenset] = {}
        for line, names, value, node in sorted(index.statements(ASSIGNS), key=lambda s: s[0]):
            got = set(seed(value))
            for n in reads(value):
                got |= current[n] if n in current else set(initial(n))
            tags = frozenset(got)
            for n in names:
                current[n] = tags
                self._history.setdefault(n, []).append((line, tags))

    def at(self, name: str, line: int) -> frozenset:
        """Tags of `name` as the statement on `line` sees them (the last definition on an earlier line)."""
        earlier = [tags for ln, tags in self._history.get(name, ()) if ln < line]
        return earlier[-1] if earlier else frozenset(self._initial(name))

    def final(self, name: str) -> frozenset:
        history = self._history.get(name)
        return history[-1][1] if history else frozenset(self._initial(name))

    def reads(self, expr: cst.BaseExpression, line: int | None = None) -> frozenset:
        """Union of the tags of every name `expr` reads (as of `line`, or final)."""
        out: set = set()
        for n in self._reads(expr):
            out |= self.at(n, line) if line is not None else self.final(n)
        return frozenset(out)


def _grown(call: cst.BaseExpression) -> tuple[str, cst.BaseExpression] | None:
    """`xs.append(v)` / `xs.extend(v)` -> ("xs", v)."""
    if not (isinstance(call, cst.Call) and call.args and isinstance(call.func, cst.Attribute)):
        return None
    func = call.func
    if func.attr.value in ("append", "extend") and isinstance(func.value, cst.Name):
        return func.value.value, call.args[0].value
    return None


# One index per function node, kept while the node lives (least recently used dropped past the bound).
_INDEX: OrderedDict[int, tuple[cst.CSTNode, DefUse]] = OrderedDict()
_INDEX_SIZE = 512


def defuse(src: SourceFile, fn: cst.FunctionDef | cst.For) -> DefUse:
    """The def-use index of `fn`, a function or a loop's body (built once, then shared by every analyser that
    asks)."""
    entry = _INDEX.get(id(fn))
    if entry is not None and entry[0] is fn and entry[1].src is src:
        _INDEX.move_to_end(id(fn))
        return entry[1]
    index = DefUse(src, fn)
    _INDEX[id(fn)] = (fn, index)
    if len(_INDEX) > _INDEX_SIZE:
        _INDEX.popitem(last=False)
    return index


__all__ = ["ALL", "ASSIGNS", "GROWS", "PLAIN", "Def", "DefUse", "Lineage", "defuse"]
