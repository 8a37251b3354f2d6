"""The module tree a class builds in `__init__`, read statically, with sizes traced from config.

`module_tree(ws, src, cls, args)` walks `self.<name> = <Class>(...)` assignments, ModuleList /
Sequential / ModuleDict literals, `.append(...)` calls and branches, and descends into every
class it can resolve inside the analysed package. Constructor arguments are evaluated with
`values.evaluate`, so with config.json values bound at the top, `heads`, `inner_dim` and each
Linear's (in, out) come out as numbers; what cannot be computed stays UNKNOWN. A branch whose
condition is unknown contributes its modules marked `conditional`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from integrate.resolve import External, Resolved, Workspace
from integrate.source import SourceFile, base_names, dotted, find_method
from integrate.syntax import name_defaults

from .values import UNKNOWN, comprehension_items, evaluate, is_known

MAX_DEPTH = 7
_CONTAINERS = {"ModuleList", "Sequential", "ModuleDict", "ParameterList"}
_LINEAR = {"Linear", "LazyLinear"}


@dataclass
class Node:
    """One module in the tree. `path` is relative to the root class ("attn.to_out.0")."""

    path: str
    cls: str  # qualified name for library classes ("torch.nn.Linear"), class name otherwise
    kind: str  # "linear" | "container" | "module" | "library" | "unknown"
    file: str
    line: int
    conditional: bool = False
    shape: tuple[Any, Any] | None = None  # Linear (in_features, out_features), UNKNOWN where not computed
    attrs: dict[str, Any] = field(default_factory=dict)  # self.<x> values set in __init__ (known or UNKNOWN)
    attr_exprs: dict[str, str] = field(default_factory=dict)  # self.<x> = <source text>
    params: dict[str, Any] = field(default_factory=dict)  # the constructor's bound arguments
    length: Any = None  # for containers built from `for _ in range(n)`: n
    cls_node: tuple[SourceFile, cst.ClassDef] | None = None
    call: tuple[SourceFile, cst.Call] | None = None  # the constructor call that built it


@dataclass
class _Module:
    """A module-valued local (`act_fn = GELU(...)`) waiting to be attached."""

    call: cst.Call
    src: SourceFile
    env: dict[str, Any]
    attrs: dict[str, Any]


@dataclass
class _ModuleList:
    """A local list of modules (`blocks = []; blocks.append(Block(...))`)."""

    items: list[_Module]


class Tree:
    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}

    def add(self, node: Node) -> Node:
        old = self.nodes.get(node.path)
        if old is not None and old.kind != "unknown" and node.conditional:
            return old  # an unconditional definition wins over a conditional alternative
        self.nodes[node.path] = node
        return node

    def linears(self, under: str = "") -> list[Node]:
        prefix = f"{under}." if under else ""
        return [n for p, n in self.nodes.items() if n.kind == "linear" and (not under or p.startswith(prefix))]

    def children(self, path: str) -> list[Node]:
        prefix = f"{path}." if path else ""
        depth = prefix.count(".")
        return [n for p, n in self.nodes.items() if p.startswith(prefix) and p.count(".") == depth and p != path]


def bind_call(ws: Workspace, call: cst.Call, src: SourceFile, env: dict, attrs: dict,
              init: cst.FunctionDef | None) -> dict[str, Any]:
    """Constructor parameter -> value for `call` against `init`'s signature (defaults filled in)."""
    if init is None:
        return {}
    params = [p for p in init.params.posonly_params] + list(init.params.params)
    params = [p for p in params if p.name.value != "self"]
    kwonly = list(init.params.kwonly_params)
    bound: dict[str, Any] = {}
    positional = [a for a in call.args if a.keyword is None and not a.star]
    for p, a in zip(params, positional):
        bound[p.name.value] = evaluate(a.value, env, attrs)
    for a in call.args:
        if a.keyword is not None:
            bound[a.keyword.value] = evaluate(a.value, env, attrs)
        elif a.star == "**":
            value = evaluate(a.value, env, attrs)
            if isinstance(value, dict):
                bound.update(value)
    for p in params + kwonly:
        if p.name.value not in bound:
            bound[p.name.value] = evaluate(p.default, {}, {}) if p.default is not None else UNKNOWN
    return bound


def module_tree(ws: Workspace, src: SourceFile, cls: cst.ClassDef, args: dict[str, Any] | None = None) -> Tree:
    """The modules `cls.__init__` builds, for constructor arguments `args` (e.g. config.json)."""
    tree = Tree()
    root = Node("", cls.name.value, "module", str(src.path), src.line(cls), cls_node=(src, cls))
    tree.add(root)
    _walk_class(ws, tree, root, src, cls, dict(args or {}), depth=0)
    return tree


def _find_init(ws: Workspace, src: SourceFile, cls: cst.ClassDef, depth: int = 0):
    init = find_method(cls, "__init__")
    if init is not None or depth > 5:
        return src, cls, init
    for base in base_names(cls):
        found = ws.resolve(src, base)
        if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
            return _find_init(ws, found.src, found.node, depth + 1)
    return src, cls, None


def _walk_class(ws: Workspace, tree: Tree, node: Node, src: SourceFile, cls: cst.ClassDef,
                args: dict[str, Any], depth: int) -> None:
    i_src, _, init = _find_init(ws, src, cls)
    if init is None:
        return
    env = dict(args)
    params = [p.name.value for p in (*init.params.params, *init.params.kwonly_params)]
    for p in (*init.params.params, *init.params.kwonly_params):
        name = p.name.value
        if name != "self" and name not in env:
            env[name] = evaluate(p.default, {}, {}) if p.default is not None else UNKNOWN
    node.params = {k: v for k, v in env.items() if k in params and k != "self"}
    # `block_cls=JointBlock`: a parameter, not given, that defaults to a name is that class where it is called
    classes = {k: v for k, v in name_defaults(init).items() if k not in args}
    _Walker(ws, tree, node, i_src, env, depth, classes).block(init.body.body, conditional=False)


class _Walker:
    def __init__(self, ws: Workspace, tree: Tree, node: Node, src: SourceFile, env: dict, depth: int,
                 classes: dict[str, str] | None = None) -> None:
        self.ws, self.tree, self.node, self.src, self.env, self.depth = ws, tree, node, src, env, depth
        self.classes = classes or {}

    # -- statements ---------------------------------------------------------------------

    def block(self, stmts, conditional: bool) -> None:
        for stmt in stmts:
            self.statement(stmt, conditional)

    def statement(self, stmt: cst.CSTNode, conditional: bool) -> None:
        if isinstance(stmt, cst.If):
            self._if(stmt, conditional)
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                self.small(small, conditional)
        elif isinstance(stmt, cst.With | cst.Try):
            self.block(stmt.body.body, conditional)
        elif isinstance(stmt, cst.For):
            self._for(stmt)

    def _if(self, stmt: cst.If, conditional: bool) -> None:
        test = evaluate(stmt.test, self.env, self.node.attrs)
        if is_known(test):
            if test:
                self.block(stmt.body.body, conditional)
            elif isinstance(stmt.orelse, cst.If):
                self._if(stmt.orelse, conditional)
            elif stmt.orelse is not None:
                self.block(stmt.orelse.body.body, conditional)
            return
        self.block(stmt.body.body, True)
        if isinstance(stmt.orelse, cst.If):
            self._if(stmt.orelse, True)
        elif stmt.orelse is not None:
            self.block(stmt.orelse.body.body, True)

    def _for(self, stmt: cst.For) -> None:
        """`for ...: self.x.append(Block(...))` adds element 0 of a list built in a loop."""
        for inner in stmt.body.body:
            self.statement(inner, conditional=True)

    def small(self, small: cst.BaseSmallStatement, conditional: bool) -> None:
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            self.assign(small.targets[0].target, small.value, small, conditional)
        elif isinstance(small, cst.AnnAssign) and small.value is not None:
            self.assign(small.target, small.value, small, conditional)
        elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            self._call_stmt(small.value, conditional)

    def assign(self, target: cst.BaseExpression, value: cst.BaseExpression, stmt, conditional: bool) -> None:
        if isinstance(target, cst.Attribute) and dotted(target.value) == "self":
            name = target.attr.value
            if not self._attach(name, value, conditional, stmt):
                self.node.attrs[name] = evaluate(value, self.env, self.node.attrs)
                self.node.attr_exprs[name] = self.src.code(value)
        elif isinstance(target, cst.Name):
            if isinstance(value, cst.List) and not value.elements:
                self.env[target.value] = _ModuleList([])  # `blocks = []`, filled by appends
            elif isinstance(value, cst.Call) and self._class_of(value) is not None:
                self.env[target.value] = _Module(value, self.src, dict(self.env), dict(self.node.attrs))
            else:
                self.env[target.value] = evaluate(value, self.env, self.node.attrs)

    def _call_stmt(self, call: cst.Call, conditional: bool) -> None:
        """`self.net.append(Module(...))` / `self.add_module("name", Module(...))`."""
        name = dotted(call.func) or ""
        parts = name.split(".")
        if len(parts) == 2 and parts[1] == "append" and isinstance(self.env.get(parts[0]), _ModuleList) and call.args:
            arg = call.args[0].value
            if isinstance(arg, cst.Call) and self._class_of(arg) is not None:
                self.env[parts[0]].items.append(_Module(arg, self.src, dict(self.env), dict(self.node.attrs)))
            elif isinstance(arg, cst.Name) and isinstance(self.env.get(arg.value), _Module):
                self.env[parts[0]].items.append(self.env[arg.value])
            return
        if len(parts) == 3 and parts[0] == "self" and parts[2] in ("append", "extend") and call.args:
            parent = self.tree.nodes.get(self._path(parts[1]))
            if parent is None or parent.kind != "container":
                return
            index = len(self.tree.children(parent.path))
            arg = call.args[0].value
            if parts[2] == "extend" and isinstance(arg, cst.List | cst.Tuple):
                for el in arg.elements:
                    self._attach_value(f"{parent.path}.{index}", el.value, conditional, call)
                    index += 1
            elif parts[2] == "append":
                self._attach_value(f"{parent.path}.{index}", arg, conditional, call)

    # -- module values ------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return f"{self.node.path}.{name}" if self.node.path else name

    def _class_of(self, call: cst.Call):
        name = dotted(call.func)
        if not name:
            return None
        found = self.ws.resolve(self.src, self.classes.get(name, name))
        if isinstance(found, External):
            return found
        if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
            return found
        return None

    def _attach(self, name: str, value: cst.BaseExpression, conditional: bool, stmt) -> bool:
        return self._attach_value(self._path(name), value, conditional, stmt)

    def _attach_value(self, path: str, value: cst.BaseExpression, conditional: bool, stmt) -> bool:
        if isinstance(value, cst.Name) and isinstance(self.env.get(value.value), _Module):
            held: _Module = self.env[value.value]
            saved = self.src, self.env
            self.src, self.env = held.src, held.env
            try:
                return self._attach_value(path, held.call, conditional, stmt)
            finally:
                self.src, self.env = saved
        if not isinstance(value, cst.Call):
            return False
        found = self._class_of(value)
        line = self.src.line(stmt)
        if found is None:
            name = dotted(value.func) or ""
            if isinstance(value.func, cst.Name) and name in self.node.params and not is_known(self.env.get(name)):
                # `self.attn = attn_cls(...)`: a class handed to the constructor, not known here: a module of a
                # class the analysis cannot read (kind "unknown"), so a reader can tell it is there
                self.tree.add(Node(path, name, "unknown", str(self.src.path), line, conditional))
                return True
            if "." not in name or name.rsplit(".", 1)[1] not in _LINEAR:
                return False
            # `operations.Linear(...)`, a layer namespace handed to the constructor (ComfyUI's `ops`): a Linear
            # by its name, since the namespace's value is not in the code
            node = Node(path, name, "linear", str(self.src.path), line, conditional)
            node.shape = self._linear_shape(value)
            self.tree.add(node)
            return True
        if isinstance(found, External):
            short = found.qualname.rsplit(".", 1)[-1]
            if not found.qualname.startswith("torch"):
                self.tree.add(Node(path, found.qualname, "library", str(self.src.path), line, conditional))
                return True
            if short in _CONTAINERS:
                self._container(path, short, found.qualname, value, conditional, line)
                return True
            if short == "Parameter":
                self.tree.add(Node(path, found.qualname, "parameter", str(self.src.path), line, conditional))
                return True
            if not found.qualname.startswith(("torch.nn.", "nn.")):
                return False  # torch.zeros(...), torch.Size(...): a value, not a module
            kind = "linear" if short in _LINEAR else "library"
            node = Node(path, found.qualname, kind, str(self.src.path), line, conditional)
            if kind == "linear":
                node.shape = self._linear_shape(value)
            elif value.args and value.args[0].keyword is None:  # norms: the normalised size
                node.shape = (evaluate(value.args[0].value, self.env, self.node.attrs), None)
            self.tree.add(node)
            return True
        return self._internal(path, found, value, conditional, line)

    def _linear_shape(self, call: cst.Call) -> tuple[Any, Any]:
        """(in_features, out_features) of a Linear's constructor call, by position or keyword."""
        pos = [a for a in call.args if a.keyword is None]
        kw = {a.keyword.value: a for a in call.args if a.keyword is not None}

        def get(i, k):
            return kw[k].value if k in kw else pos[i].value if len(pos) > i else None

        return (evaluate(get(0, "in_features"), self.env, self.node.attrs),
                evaluate(get(1, "out_features"), self.env, self.node.attrs))

    def _internal(self, path: str, found: Resolved, call: cst.Call, conditional: bool, line: int) -> bool:
        cls = found.node
        if _is_linear_subclass(self.ws, found):
            node = Node(path, cls.name.value, "linear", str(self.src.path), line, conditional)
            node.shape = (evaluate(call.args[0].value, self.env, self.node.attrs) if call.args else UNKNOWN,
                          evaluate(call.args[1].value, self.env, self.node.attrs) if len(call.args) > 1 else UNKNOWN)
            self.tree.add(node)
            return True
        node = self.tree.add(Node(path, cls.name.value, "module", str(self.src.path), line, conditional,
                                  cls_node=(found.src, cls), call=(self.src, call)))
        if self.depth < MAX_DEPTH and node.cls_node is not None and node.path == path:
            i_src, _, init = _find_init(self.ws, found.src, cls)
            bound = bind_call(self.ws, call, self.src, self.env, self.node.attrs, init)
            _walk_class(self.ws, self.tree, node, found.src, cls, bound, self.depth + 1)
        return True

    def _container(self, path: str, short: str, qual: str, call: cst.Call, conditional: bool, line: int) -> None:
        node = self.tree.add(Node(path, qual, "container", str(self.src.path), line, conditional))
        if not call.args:
            return
        arg = call.args[0].value
        if short == "ModuleDict" and isinstance(arg, cst.Dict):
            for el in arg.elements:
                if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString):
                    self._attach_value(f"{path}.{el.key.evaluated_value}", el.value, conditional, call)
            return
        if short == "ModuleDict" and isinstance(arg, cst.DictComp):  # `{name: Block() for name in modes}`
            saved = self.env
            for key, bound in comprehension_items(arg, self.env, self.node.attrs) or ():
                self.env = bound
                try:
                    self._attach_value(f"{path}.{key}", arg.value, conditional, call)
                finally:
                    self.env = saved
            return
        if short == "Sequential":
            for i, a in enumerate(call.args):
                self._attach_value(f"{path}.{i}", a.value, conditional, call)
            return
        if isinstance(arg, cst.Name) and isinstance(self.env.get(arg.value), _ModuleList):
            for i, held in enumerate(self.env[arg.value].items[:1]):  # element 0 describes the list
                saved = self.src, self.env
                self.src, self.env = held.src, held.env
                try:
                    self._attach_value(f"{path}.{i}", held.call, conditional, call)
                finally:
                    self.src, self.env = saved
            return
        if isinstance(arg, cst.List | cst.Tuple):
            for i, el in enumerate(arg.elements):
                self._attach_value(f"{path}.{i}", el.value, conditional, call)
        elif isinstance(arg, cst.ListComp | cst.GeneratorExp):
            comp = arg.for_in
            node.length = _range_length(comp.iter, self.env, self.node.attrs)
            saved = dict(self.env)
            for name in _target_names(comp.target):
                self.env[name] = 0 if is_known(node.length) else UNKNOWN
            self._attach_value(f"{path}.0", arg.elt, conditional, call)
            self.env = saved


def _target_names(target) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, cst.Tuple):
        return [n for el in target.elements for n in _target_names(el.value)]
    return []


def _range_length(it: cst.BaseExpression, env, attrs) -> Any:
    if isinstance(it, cst.Call) and dotted(it.func) == "range" and len(it.args) == 1:
        return evaluate(it.args[0].value, env, attrs)
    return UNKNOWN


def _is_linear_subclass(ws: Workspace, found: Resolved, depth: int = 0) -> bool:
    """A Linear: a class whose bases reach torch's Linear, or torch's Linear itself where torch's own source is
    read (a block class another library defines, `nn.TransformerEncoderLayer`, builds its `Linear` by name)."""
    if depth > 4 or not isinstance(found.node, cst.ClassDef):
        return False
    if found.name in _LINEAR and (found.src.dotted_name or "").startswith("torch.nn."):
        return True
    for base in base_names(found.node):
        target = ws.resolve(found.src, base)
        if isinstance(target, External) and target.qualname.rsplit(".", 1)[-1] in _LINEAR:
            return True
        if isinstance(target, Resolved) and _is_linear_subclass(ws, target, depth + 1):
            return True
    return False
