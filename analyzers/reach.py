"""Which of a class's methods run while its forward runs: cache-dit swaps a block list for its wrapper only for
the length of a forward call, so a walk over the list counts only where forward reaches it.

Reached: `forward`, and every method it names through `self` — called (`self._blocks(x)`), handed on
(`checkpoint(self._blocks, x)`), or read as a property (`self.dtype` where `dtype` is a `@property`) — then
what those reach, through the class's own methods. A forward chosen in `__init__`
(`self.forward = self._forward_cfg if cfg else self._forward_plain`) starts from each method assigned there.
Without a forward in the class (one it inherits), nothing is known: every method counts (None).

`Defaults` says which code of those methods the constructor's defaults switch off: a branch under
`if self.enable_teacache:` where the class's one assignment of the flag is `self.enable_teacache = False` at
the top of `__init__` (or a constructor parameter, read from the model's config where it has it, else from
its literal default), and a local read from such a flag (`on = getattr(self, "on", False)`). A flag any
method of the class or of a repository base assigns again may be flipped: the code it guards is reached.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from integrate.defuse import defuse
from integrate.records import Evidence
from integrate.resolve import Resolved
from integrate.source import SourceFile, base_names, dotted, find_method, iter_methods
from integrate.syntax import body_of, find_all, names_read, params_of, self_attr, target_names

from .values import UNKNOWN, evaluate, is_known


def forward_entries(cls: cst.ClassDef) -> list[str]:
    """The methods that serve as `forward`: the method itself and each one `__init__` assigns to
    `self.forward`."""
    out = ["forward"] if any(fn.name.value == "forward" for fn in iter_methods(cls)) else []  # its own def
    init = find_method(cls, "__init__")
    for assign in find_all(init.body, cst.Assign) if init is not None else ():
        if any(self_attr(t.target) == "forward" for t in assign.targets):
            out += [a for a in _self_names(assign.value) if a not in out and find_method(cls, a) is not None]
    return out


def reached_methods(cls: cst.ClassDef) -> frozenset[str] | None:
    """Names of the methods a forward call runs (None: the class has no forward of its own)."""
    methods = {fn.name.value: fn for fn in iter_methods(cls)}
    todo = forward_entries(cls)
    if not todo:
        return None
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in methods:
            continue
        seen.add(name)
        todo += [n for n in _self_names(methods[name].body) if n in methods and n not in seen]
    return frozenset(seen)


def _self_names(node: cst.CSTNode) -> list[str]:
    """Every `self.<name>` the node reads (calls, references and property reads alike)."""
    return [a for a in (self_attr(x) for x in find_all(node, cst.Attribute, skip_functions=False)) if a]


# -- what the constructor's defaults leave switched off ------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """`self.<attr>` as the constructor leaves it: its one assignment in the class, at the top of `__init__`, to a
    literal or to a parameter with a literal default."""

    value: object
    file: str
    line: int
    said: str  # "`self.enable_teacache = False` at :388"


class Defaults:
    """Which code of a class's methods cannot run with the values its constructor's defaults give its flags: a
    branch guarded by `self.<attr>` (or a local read from it) whose guard those values make false. A flag any
    method of the class or of its bases in the repository assigns again is not one (it may be flipped): code it
    guards counts as reached. The bases are read only when a guard is decided; library bases (torch, diffusers
    installed) are not followed."""

    def __init__(self, ws, src: SourceFile, cls: cst.ClassDef, config: dict | None = None) -> None:
        """`config`: the model's config (its keys are constructor arguments), {} or None where there is none."""
        self.ws, self.src, self.cls = ws, src, cls
        sites, self.opaque = _self_assignments([(src, cls)])
        self.assigned = frozenset(sites)
        flags = {a: _flag(s, config or {}) for a, s in sites.items()}
        self.flags = {} if self.opaque else {a: f for a, f in flags.items() if f is not None}
        self._methods = {fn.name.value: fn for fn in iter_methods(cls)}
        self._inherited: tuple[frozenset[str], bool] | None = None

    def off(self, method: str, line: int) -> Evidence | None:
        """Why the statement on `line` of `method` does not run with the constructor's defaults (None: it may)."""
        fn = self._methods.get(method)
        if fn is None or self.opaque:
            return None
        env, said, deps = self._locals(fn)
        attrs = {a: f.value for a, f in self.flags.items()}
        for test, want in _conditions(self.src, body_of(fn), line):
            if any((dotted(a) or "").startswith(("config.", "self.config.")) for a in find_all(test, cst.Attribute)):
                continue  # a config field, not a local of the same name
            got = evaluate(test, env, attrs)
            if not is_known(got) or bool(got) == want:
                continue
            flags = [a for a in _self_reads(test) if a in self.flags]
            local = [n for n in sorted(names_read(test)) if n in said]
            if not self._kept({*flags, *(a for n in local for a in deps[n])}):
                return None  # a base of the class assigns it too: it may be flipped
            reads = [self.flags[a].said for a in flags] + [said[n] for n in local]
            return Evidence(str(self.src.path), self.src.line(test),
                            f"off by default: {'; '.join(reads)} (`{self.src.code(test)}` is {bool(got)})")
        return None

    def _kept(self, attrs: set[str]) -> bool:
        """No method of a base of the class in the repository assigns any of `attrs` (the bases are read the first
        time this is asked)."""
        if self._inherited is None:
            sites, opaque = _self_assignments(_repository_bases(self.ws, self.src, self.cls))
            self._inherited = (frozenset(sites), opaque)
        assigned, opaque = self._inherited
        return not opaque and not attrs & assigned

    def _locals(self, fn: cst.FunctionDef) -> tuple[dict[str, object], dict[str, str], dict[str, set[str]]]:
        """{local: value} for the names `fn` binds once, by a plain assignment, to a value the flags decide
        (`on = getattr(self, "on", False)`), what each one's value rests on, and the attributes it reads."""
        index = defuse(self.src, fn)
        params = {p.name.value for p in params_of(fn)}
        rebound = {n for node in find_all(fn.body, (cst.AugAssign, cst.NamedExpr)) for n in target_names(node.target)}
        env: dict[str, object] = {}
        said: dict[str, str] = {}
        deps: dict[str, set[str]] = {}
        attrs = {a: f.value for a, f in self.flags.items()}
        for d in index.defs:
            n = d.name
            if n in params or n in rebound or d.kind != "assign" or d.unpacked or len(index.of(n)) != 1:
                continue
            value, why, used = self._getattr(d.value)
            if value is UNKNOWN:
                value = evaluate(d.value, env, attrs)
                flags = [a for a in _self_reads(d.value) if a in self.flags]
                local = [r for r in sorted(names_read(d.value)) if r in said]
                why = "; ".join([self.flags[a].said for a in flags] + [said[r] for r in local])
                used = {*flags, *(a for r in local for a in deps[r])}
            if is_known(value) and why:
                env[n], deps[n] = value, used
                said[n] = f"`{' '.join(self.src.code(d.node).split())}` at :{d.line}, {why}"
        return env, said, deps

    def _getattr(self, expr: cst.BaseExpression | None) -> tuple[object, str, set[str]]:
        """`getattr(self, "name", default)`: the flag's value, or the default where no method of the class or of
        its bases in the repository assigns `self.name`; with why, and the attribute read."""
        if not (isinstance(expr, cst.Call) and dotted(expr.func) == "getattr" and len(expr.args) == 3
                and dotted(expr.args[0].value) == "self" and isinstance(expr.args[1].value, cst.SimpleString)):
            return UNKNOWN, "", set()
        name = expr.args[1].value.evaluated_value
        if name in self.flags:
            return self.flags[name].value, self.flags[name].said, {name}
        if name in self.assigned:
            return UNKNOWN, "", set()
        value = evaluate(expr.args[2].value, {}, {})
        return value, f"no method of the class or of its bases in the repository assigns `self.{name}`", {name}


def _repository_bases(ws, src: SourceFile, cls: cst.ClassDef, depth: int = 0) -> list[tuple[SourceFile, cst.ClassDef]]:
    """The class's bases the Workspace reads from the repository (not followed into installed libraries)."""
    out: list[tuple[SourceFile, cst.ClassDef]] = []
    if ws is None or depth > 6:
        return out
    for base in base_names(cls):
        found = ws.resolve(src, base)
        if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef) and found.node is not cls:
            out += [(found.src, found.node), *_repository_bases(ws, found.src, found.node, depth + 1)]
    return out


def _self_assignments(classes) -> tuple[dict[str, list], bool]:
    """{attr: [(src, method, statement, value)]} for every `self.<attr> = ...` (also `+=`, annotated, unpacked,
    `setattr(self, "attr", v)`) in the classes' methods, nested functions included; and whether one of them sets
    an attribute whose name is not written out (`setattr(self, name, v)`: then no flag is known)."""
    sites: dict[str, list] = {}
    opaque = False
    for src, cls in classes:
        for fn in iter_methods(cls):
            top = {id(s) for s in body_of(fn)} if fn.name.value == "__init__" else set()
            for node in find_all(fn.body, (cst.Assign, cst.AnnAssign, cst.AugAssign), skip_functions=False):
                targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
                simple = isinstance(node, (cst.Assign, cst.AnnAssign)) and len(targets) == 1
                for t in targets:
                    for part in _flattened(t):
                        if (attr := self_attr(part)) is not None:
                            value = node.value if simple and part is t else None
                            sites.setdefault(attr, []).append((src, fn, node, value, top))
            for call in find_all(fn.body, cst.Call, skip_functions=False):
                if dotted(call.func) == "setattr" and call.args and dotted(call.args[0].value) == "self":
                    name = call.args[1].value if len(call.args) > 1 else None
                    if isinstance(name, cst.SimpleString):
                        sites.setdefault(name.evaluated_value, []).append((src, fn, call, None, set()))
                    else:
                        opaque = True
    return sites, opaque


def _flattened(target: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [p for el in target.elements for p in _flattened(el.value)]
    if isinstance(target, cst.StarredElement):
        return _flattened(target.value)
    return [target]


def _flag(sites: list, config: dict) -> Flag | None:
    """The flag an attribute is, when its one assignment is a statement at the top of `__init__` whose value the
    constructor's arguments give: a literal, or a parameter, read from the model's config where it holds that
    parameter, else from the parameter's literal default."""
    if len(sites) != 1:
        return None
    src, fn, node, value, top = sites[0]
    if fn.name.value != "__init__" or value is None:
        return None
    stmt = next((s for s in body_of(fn) if id(s) in top and any(x is node for x in find_all(s, type(node)))), None)
    if not isinstance(stmt, cst.SimpleStatementLine):
        return None
    params = {p.name.value: p for p in params_of(fn) if p.name.value != "self"}
    args = {n: config[n] if n in config else (evaluate(p.default, {}, {}) if p.default is not None else UNKNOWN)
            for n, p in params.items()}
    got = evaluate(value, args, {})
    if not is_known(got) or not isinstance(got, (bool, int, float, str, type(None))):
        return None
    said = f"`{' '.join(src.code(node).split())}` at :{src.line(node)}"
    for n in sorted(names_read(value) & set(params)):
        said += f", `{n}: {config[n]!r}` in the model's config" if n in config else \
            f", `{n}={src.code(params[n].default)}` by default"
    return Flag(got, str(src.path), src.line(node), said)


def _self_reads(expr: cst.BaseExpression) -> list[str]:
    return [a for a in (self_attr(x) for x in find_all(expr, cst.Attribute, skip_functions=False)) if a]


def _conditions(src: SourceFile, stmts, line: int) -> list[tuple[cst.BaseExpression, bool]]:
    """(test, the truth it must have) for every `if` / `elif` / `else` arm the statement on `line` sits in,
    outermost first."""
    for stmt in stmts:
        if not src.line(stmt) <= line <= src.last_line(stmt) or isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(stmt, cst.If):
            return _arm(src, stmt, line)
        suites = [stmt, getattr(stmt, "orelse", None), getattr(stmt, "finalbody", None), *getattr(stmt, "handlers", ())]
        for suite in suites:
            inner = _conditions(src, body_of(suite), line) if suite is not None else []
            if inner or _holds(src, suite, line):
                return inner
        return []
    return []


def _arm(src: SourceFile, stmt: cst.If, line: int) -> list[tuple[cst.BaseExpression, bool]]:
    """The tests of an `if` / `elif` chain that decide whether `line`, inside it, runs."""
    before: list[tuple[cst.BaseExpression, bool]] = []
    node: cst.If | cst.Else | None = stmt
    while node is not None:
        if isinstance(node, cst.Else):
            return before + _conditions(src, body_of(node), line)
        if _holds(src, node, line):
            return [*before, (node.test, True), *_conditions(src, body_of(node), line)]
        if src.line(node) == line:
            return before  # the `if` / `elif` line itself: its test runs when the arms before it fail
        before.append((node.test, False))
        node = node.orelse
    return []


def _holds(src: SourceFile, suite, line: int) -> bool:
    """Whether `line` is inside the statements of `suite`'s body."""
    body = body_of(suite) if suite is not None else []
    return bool(body) and src.line(body[0]) <= line <= src.last_line(body[-1])
