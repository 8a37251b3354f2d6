"""Where a transformer builds its ModuleLists, and what each one holds.

Handles `nn.ModuleList([Block(...) for _ in range(n)])`, a list filled by a loop of appends,
`nn.ModuleList()` followed by `.append`, conditional construction, helpers (a method or a
module-level function returning a list), ModuleDicts of lists and lists of lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst

from integrate.resolve import External, Resolved, Unresolved, Workspace
from integrate.source import SourceFile, base_names, dotted, find_method
from integrate.syntax import find_all, name_defaults, names_read, self_attr, walk_statements

from .values import comprehension_items, evaluate

MODULELIST = {"torch.nn.ModuleList", "torch.nn.modules.container.ModuleList"}
MODULEDICT = {"torch.nn.ModuleDict", "torch.nn.modules.container.ModuleDict"}


@dataclass(frozen=True)
class Element:
    name: str  # the callee as written
    target: Resolved | External | Unresolved


@dataclass(frozen=True)
class ListDef:
    attr: str
    container: str
    keys: tuple[str, ...]  # ModuleDict keys holding lists
    elements: tuple[Element, ...]
    length: str | None
    length_fields: tuple[str, ...]
    line: int
    conditional: bool
    src: SourceFile
    traced: str | None = None  # how an element's class was found other than by its name: a default, a flag


class _Builder:
    def __init__(self, ws: Workspace, src: SourceFile, cls: cst.ClassDef,
                 given: dict[str, str] | None = None) -> None:
        self.ws, self.src, self.cls = ws, src, cls
        self.given = given or {}
        init = find_method(cls, "__init__")
        self.init_params: set[str] = set()
        self.init_defaults: dict[str, str] = {}  # `block_cls=FooBlock`: a parameter whose default is a name
        if init is not None:
            p = init.params
            self.init_params = {x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params)}
            self.init_defaults = name_defaults(init)
        self.local_lists: dict[str, tuple[list, str | None]] = {}  # name -> (element calls, length)
        # name -> every expression `__init__` binds it to (`block = Block(...)` in a loop, then appended; one per
        # branch where it is bound in several)
        self.local_values: dict[str, list[cst.BaseExpression]] = {}
        self.names: dict[str, Any] = {}  # local names of __init__ the evaluator knows (`modes = ["image"]`)
        self.defs: dict[str, ListDef] = {}

    # -- classification of calls ---------------------------------------------------------

    def kind(self, call: cst.BaseExpression) -> str | None:
        if not isinstance(call, cst.Call):
            return None
        q = self.ws.qualname(self.src, call.func)
        name = dotted(call.func) or ""
        if q in MODULELIST or (q == name and name.endswith("ModuleList")):
            return "ModuleList"
        if q in MODULEDICT or (q == name and name.endswith("ModuleDict")):
            return "ModuleDict"
        return None

    def element(self, call: cst.Call) -> Element | None:
        name = dotted(call.func)
        if name is None:
            return None
        if name in self.init_defaults:  # `block_cls(...)`: the class the constructor's default names
            name = self.init_defaults[name]
        return Element(name, self.ws.resolve(self.src, name))

    # -- what a list expression holds ----------------------------------------------------

    def contents(self, expr: cst.BaseExpression | None, depth: int = 0):
        """(element calls, length expression, nested container, dict keys)."""
        if expr is None or depth > 6:
            return [], None, None, ()
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp)):
            calls, _, nested, keys = self.contents(expr.elt, depth + 1)
            return calls, self._range_len(expr.for_in.iter), nested, keys
        if isinstance(expr, (cst.List, cst.Tuple)):
            calls, nested = [], None
            for el in expr.elements:
                c, _, n, _ = self.contents(el.value, depth + 1)
                calls += c
                nested = nested or n
            return calls, str(len(expr.elements)), nested, ()
        if isinstance(expr, cst.IfExp):
            a = self.contents(expr.body, depth + 1)
            b = self.contents(expr.orelse, depth + 1)
            return a[0] + b[0], a[1] or b[1], a[2] or b[2], a[3] + b[3]
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
            a = self.contents(expr.left, depth + 1)
            b = self.contents(expr.right, depth + 1)
            length = f"{a[1]} + {b[1]}" if a[1] and b[1] else None
            return a[0] + b[0], length, a[2] or b[2], ()
        if isinstance(expr, cst.Name) and expr.value in self.local_lists:
            calls, length = self.local_lists[expr.value]
            return calls, length, None, ()
        if isinstance(expr, cst.Name) and expr.value in self.local_values:  # `blocks.append(block)`
            calls = [c for value in self.local_values[expr.value] for c in self.contents(value, depth + 1)[0]]
            return calls, None, None, ()
        kind = self.kind(expr)
        if kind == "ModuleList":
            arg = expr.args[0].value if expr.args else None
            calls, length, _, _ = self.contents(arg, depth + 1)
            return calls, length, "ModuleList", ()
        if kind == "ModuleDict":
            arg = expr.args[0].value if expr.args else None
            calls, keys = [], []
            if isinstance(arg, cst.Dict):
                for el in arg.elements:
                    if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString):
                        c, _, n, _ = self.contents(el.value, depth + 1)
                        if n == "ModuleList":
                            keys.append(el.key.evaluated_value)
                            calls += c
            elif isinstance(arg, cst.DictComp):  # `{name: nn.ModuleList([...]) for name in modes}`
                c, _, n, _ = self.contents(arg.value, depth + 1)
                if n == "ModuleList":
                    keys = [str(key) for key, _ in comprehension_items(arg, self.names) or ()]
                    calls += c if keys else []
            return calls, None, "ModuleDict", tuple(keys)
        if isinstance(expr, cst.Call):
            built = self._helper_list(expr, depth)
            if built is not None:  # `blocks.extend(self._make_blocks(n))`: what the helper's list holds
                return built
            el = self.element(expr)
            return ([el] if el else []), None, None, ()
        return [], None, None, ()

    def _range_len(self, it: cst.BaseExpression) -> str | None:
        if isinstance(it, cst.Call) and dotted(it.func) == "range" and it.args:
            args = it.args
            if len(args) == 1:
                return self.src.code(args[0].value)
            return f"{self.src.code(args[1].value)} - {self.src.code(args[0].value)}"
        return self.src.code(it)

    # -- walking __init__ and the helpers it calls -----------------------------------------

    def run(self, depth: int = 0) -> list[ListDef]:
        init = find_method(self.cls, "__init__")
        if init is not None:
            self._scan(init, conditional=False, depth=0)
        if depth < 4 and not self.defs and (init is None or _calls_super_init(init)):
            # no list of its own: the lists its base builds (a model subclassing another library's, whose `layers`
            # the parent makes)
            for base in base_names(self.cls):
                found = self.ws.resolve(self.src, base)
                if isinstance(found, External) and not found.qualname.startswith("torch."):
                    found = self.ws.follow(found)  # another library's model class: its source, read statically
                if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
                    inherited = _Builder(self.ws, found.src, found.node, self.given).run(depth + 1)
                    for d in inherited:
                        self.defs.setdefault(d.attr, d)
        return list(self.defs.values())

    def _scan(self, fn: cst.FunctionDef, conditional: bool, depth: int) -> None:
        self._scan_block(fn.body.body, conditional, depth, loop_len=None)

    def _scan_block(self, stmts, conditional: bool, depth: int, loop_len: str | None) -> None:
        for stmt in stmts:
            if isinstance(stmt, cst.If):
                self._scan_block(stmt.body.body, True, depth, loop_len)
                orelse = stmt.orelse
                while orelse is not None:
                    self._scan_block(orelse.body.body, True, depth, loop_len)
                    orelse = orelse.orelse if isinstance(orelse, cst.If) else None
            elif isinstance(stmt, cst.For):
                self._scan_block(stmt.body.body, conditional, depth, self._range_len(stmt.iter))
            elif isinstance(stmt, (cst.With, cst.Try)):
                self._scan_block(stmt.body.body, conditional, depth, loop_len)
            elif isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    self._small(stmt, small, conditional, depth, loop_len)

    def _small(self, stmt, small, conditional, depth, loop_len) -> None:
        if isinstance(small, (cst.Assign, cst.AnnAssign)):
            value = small.value
            targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
            for target in targets:
                attr = self_attr(target)
                if isinstance(target, cst.Name):
                    self.names[target.value] = evaluate(value, self.names)
                if isinstance(target, cst.Name) and isinstance(value, (cst.List, cst.ListComp)):
                    calls, length, _, _ = self.contents(value)
                    self.local_lists[target.value] = (calls, length)
                elif isinstance(target, cst.Name) and value is not None:
                    self.local_values.setdefault(target.value, []).append(value)
                elif attr is not None:
                    self._assign_attr(stmt, attr, value, conditional, depth)
        elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            call = small.value
            if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("append", "extend"):
                owner = call.func.value
                arg = call.args[0].value if call.args else None
                calls, length, _, _ = self.contents(arg)
                if call.func.attr.value == "append":
                    length = loop_len
                if isinstance(owner, cst.Name) and owner.value in self.local_lists:
                    prev, _ = self.local_lists[owner.value]
                    self.local_lists[owner.value] = (prev + calls, length)
                elif (attr := self_attr(owner)) in self.defs:
                    old = self.defs[attr]
                    self.defs[attr] = self._make(attr, old.container, old.keys, [*old.elements, *calls], length,
                                                 old.line, old.conditional or conditional)
            elif (m := self_attr(call.func)) is not None and depth < 3:
                helper = find_method(self.cls, m)
                if helper is not None:
                    self._scan(helper, conditional, depth + 1)

    def _assign_attr(self, stmt, attr: str, value, conditional: bool, depth: int) -> None:
        line = self.src.line(stmt)
        kind = self.kind(value)
        if kind is None and isinstance(value, cst.IfExp):
            kind = self.kind(value.body) or self.kind(value.orelse)
            conditional = True
        if kind is None and isinstance(value, cst.Call) and depth < 3:
            returned = self._helper_return(value)
            if returned is not None:
                value, kind = returned, self.kind(returned)
        if kind is None:
            return
        calls, length, nested, keys = self.contents(value)
        container = kind
        if kind == "ModuleList" and self._is_nested(value):
            container = "ModuleList of ModuleList"
        if kind == "ModuleDict":
            arg = value.args[0].value if isinstance(value, cst.Call) and value.args else None
            if not keys and not (isinstance(arg, cst.DictComp) and self.kind(arg.value) == "ModuleList"):
                return
            # a comprehension whose keys are not known statically keeps no elements: its lists are unknown
            container = "ModuleDict of ModuleList"
        old = self.defs.get(attr)
        if old is not None:  # assigned in two branches: merge
            calls = [*old.elements, *calls]
            conditional = True
        self.defs[attr] = self._make(attr, container, keys, calls, length, line, conditional)

    def _is_nested(self, value) -> bool:
        arg = value.args[0].value if isinstance(value, cst.Call) and value.args else None
        inner = arg.elt if isinstance(arg, (cst.ListComp, cst.GeneratorExp)) else None
        if isinstance(arg, (cst.List, cst.Tuple)) and arg.elements:
            inner = arg.elements[0].value
        return inner is not None and self.kind(inner) == "ModuleList"

    def _helper_return(self, call: cst.Call):
        name = dotted(call.func)
        fn = None
        if (m := self_attr(call.func)) is not None:
            fn = find_method(self.cls, m)
        elif name in self.src.functions:
            fn = self.src.functions[name]
        if fn is None:
            return None
        for stmt in walk_statements(fn.body.body):
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Return) and self.kind(small.value):
                        return small.value
        return None

    def _helper(self, call: cst.Call) -> cst.FunctionDef | None:
        """The method of this class, or the function of this module, that `call` calls (None: neither)."""
        if (m := self_attr(call.func)) is not None:
            return find_method(self.cls, m)
        name = dotted(call.func)
        return self.src.functions.get(name) if name else None

    def _helper_list(self, call: cst.Call, depth: int):
        """`contents` of the list a helper builds and returns (read with its own locals), or None when `call` is
        no helper of this class or module, or it returns no list."""
        fn = self._helper(call)
        if fn is None or depth > 4:
            return None
        inner = _Builder(self.ws, self.src, self.cls, self.given)
        inner.names = dict(self.names)
        inner._scan_block(fn.body.body, False, depth + 1, None)
        for stmt in walk_statements(fn.body.body):
            for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
                if isinstance(small, cst.Return) and small.value is not None and not self.kind(small.value):
                    found = inner.contents(small.value, depth + 1)
                    if found[0]:
                        return found
        return None

    def _make(self, attr, container, keys, calls, length, line, conditional) -> ListDef:
        fields = tuple(sorted(n for n in names_read_expr(self.src, length) if n in self.init_params)) if length else ()
        unique: dict[str, Element] = {}
        for c in calls:
            unique.setdefault(c.name, c)
        traced = None
        if attr in self.given:  # named with --block-class: the user's word over the trace
            given = self.given[attr]
            file, _, name = given.rpartition(":")
            if file:  # `path/to/file.py:Class`: read from a source the user has
                other = self.ws.load(Path(file))
                target = Resolved(other, name, other.classes[name], (str(other.path),))
            else:
                target = self.ws.resolve(self.src, name)
            unique = {name: Element(name, target)}
            traced = f"flag --block-class {attr}={given}"
        elif any(c.name in self.init_defaults.values() for c in unique.values()):
            traced = "the class a constructor parameter defaults to (" + ", ".join(
                f"`{k}={v}`" for k, v in self.init_defaults.items() if v in unique) + ")"
        return ListDef(attr, container, tuple(keys), tuple(unique.values()), length, fields, line, conditional,
                       self.src, traced)


def _calls_super_init(init: cst.FunctionDef) -> bool:
    """`super().__init__(...)` (or `Base.__init__(self, ...)`) in the constructor."""
    for call in find_all(init.body, cst.Call):
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "__init__"):
            continue
        if isinstance(func.value, cst.Call) and dotted(func.value.func) == "super" or isinstance(func.value, cst.Name):
            return True
    return False


def names_read_expr(src: SourceFile, code: str) -> set[str]:
    try:
        return names_read(cst.parse_expression(code))
    except cst.ParserSyntaxError:
        return set()


def find_module_lists(ws: Workspace, src: SourceFile, cls: cst.ClassDef,
                      given: dict[str, str] | None = None) -> list[ListDef]:
    """The ModuleLists `cls.__init__` builds; `given`: {list attribute: block class} named by the user
    (`--block-class`), used in place of the trace for those lists."""
    return _Builder(ws, src, cls, given).run()
