"""The callable a step loop is handed: read at its callers (libcst, static).

A sampler's step loop may call a parameter (`pred = func(z, t, **model_kwargs)` in OmniGen's scheduler): which model
or guidance method stands behind it is its caller's choice. This module finds that choice where the repository makes
it plainly, and never guesses past it:

1. the callers: in the files beside the entry's (its package folder), a call of the entry: `x(...)` for a class's
   `__call__` where `x = Cls(...)` in the same function, `Cls(...)(...)`, `x.method(...)`, or a module function by
   name;
2. the argument bound to the parameter (by keyword or by position);
3. its value in the caller: a local assigned once, or in the two arms of an `if` whose test the caller's parameter
   defaults decide (`if separate_cfg_infer:` with `separate_cfg_infer: bool = True`);
4. that value, `self.<attr>.<method>`: `<attr>` set in the caller's `__init__` from a parameter annotated with a
   class of the repository, and `<method>` defined on that class.

Anything else (several callers that disagree, a value built at run time, an annotation that does not resolve) is
None: the CFG style stays unknown, with the entry's own evidence.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from integrate.errors import InputError
from integrate.records import Evidence
from integrate.resolve import Resolved, Workspace
from integrate.source import SourceFile, default_truth, dotted, find_method, iter_methods
from integrate.syntax import body_of, find_all, params_of, self_attr

MAX_FILES = 60  # files beside the entry read for callers


def passed_callable(ws: Workspace, src: SourceFile, cls_name: str | None, entry: str, fn: cst.FunctionDef,
                    param: str) -> tuple[SourceFile, cst.ClassDef, cst.FunctionDef, list[Evidence]] | None:
    """(the source, class and method the callers pass as `param`, the evidence) where every caller found agrees."""
    names = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]
    if names[:1] == ["self"]:
        names = names[1:]
    if param not in names:
        return None
    index = names.index(param)
    found = []
    for caller_src, caller_cls, caller, call in _callers(ws, src, cls_name, entry):
        arg = _argument(call, param, index)
        if arg is None:
            continue
        value, evidence = _value(caller_src, caller, arg)
        target = _method_of(ws, caller_src, caller_cls, value) if value is not None else None
        if target is None:
            return None  # a caller whose choice is not read: no answer rather than a partial one
        owner = f"{caller_cls.name.value}." if caller_cls is not None else ""
        shown = " ".join(caller_src.code(call.func).split())[:60]
        where = Evidence(str(caller_src.path), caller_src.line(call),
                         f"`{owner}{caller.name.value}` calls `{shown}(...)` (`{cls_name + '.' if cls_name else ''}"
                         f"{entry}`) with `{param}` = `{caller_src.code(arg)}`")
        found.append((*target, [where, *evidence, target[3]]))
    if not found or len({id(f[2]) for f in found}) != 1:
        return None
    t_src, t_cls, method, _, evidence = found[0]
    return t_src, t_cls, method, evidence


def _callers(ws: Workspace, src: SourceFile, cls_name: str | None, entry: str):
    """(source, class or None, function, call) of each call of the entry in the files beside it."""
    folder = Path(src.path).parent
    for path in sorted(folder.glob("*.py"))[:MAX_FILES]:
        try:
            other = ws.load(path)
        except (InputError, OSError, UnicodeDecodeError):
            continue
        functions = [(None, f) for f in other.functions.values()]
        functions += [(c, m) for c in other.classes.values() for m in iter_methods(c)]
        for cls, fn in functions:
            made = _instances(fn, cls_name) if cls_name else set()
            for call in find_all(fn.body, cst.Call):
                if _calls_entry(call, cls_name, entry, made):
                    yield other, cls, fn, call


def _instances(fn: cst.FunctionDef, cls_name: str) -> set[str]:
    """Locals of `fn` assigned an instance of `cls_name` (`scheduler = OmniGenScheduler(num_steps=...)`)."""
    out = set()
    for assign in find_all(fn.body, cst.Assign):
        value = assign.value
        if (isinstance(value, cst.Call) and (dotted(value.func) or "").split(".")[-1] == cls_name
                and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)):
            out.add(assign.targets[0].target.value)
    return out


def _calls_entry(call: cst.Call, cls_name: str | None, entry: str, made: set[str]) -> bool:
    func = call.func
    if cls_name is None:
        return isinstance(func, cst.Name) and func.value == entry
    if entry == "__call__":
        if isinstance(func, cst.Name):
            return func.value in made
        return isinstance(func, cst.Call) and (dotted(func.func) or "").split(".")[-1] == cls_name
    return (isinstance(func, cst.Attribute) and func.attr.value == entry and isinstance(func.value, cst.Name)
            and func.value.value in made)


def _argument(call: cst.Call, param: str, index: int) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == param:
            return arg.value
    positional = [a for a in call.args if a.keyword is None and a.star == ""]
    return positional[index].value if index < len(positional) else None


def _value(src: SourceFile, fn: cst.FunctionDef, arg: cst.BaseExpression):
    """(the expression `arg` stands for in `fn` with its parameter defaults, evidence); (None, []) where not read."""
    if not isinstance(arg, cst.Name):
        return arg, []
    name = arg.value
    defaults = {p.name.value: p.default for p in params_of(fn) if p.default is not None}
    chosen, evidence = None, []
    for stmt in body_of(fn):
        if isinstance(stmt, cst.If) and _assigns(stmt, name):
            truth = default_truth(stmt.test, defaults)
            if truth is None:
                return None, []
            arm = body_of(stmt) if truth else (body_of(stmt.orelse) if isinstance(stmt.orelse, cst.Else) else [])
            value = next((v for s in arm for v in _assigned(s, name)), None)
            if value is None:
                return None, []
            param = next((n.value for n in find_all(stmt.test, cst.Name) if n.value in defaults), "?")
            chosen = value
            evidence = [Evidence(str(src.path), src.line(stmt),
                                 f"`if {src.code(stmt.test)}` is {truth} with the default `{param}` = "
                                 f"`{src.code(defaults[param])}`: `{name}` = `{src.code(value)}`")]
        else:
            for value in _assigned(stmt, name):
                chosen, evidence = value, [Evidence(str(src.path), src.line(stmt),
                                                    f"`{name}` = `{src.code(value)}`")]
    return chosen, evidence


def _assigns(stmt: cst.If, name: str) -> bool:
    return any(_assigned(s, name) for s in find_all(stmt, cst.SimpleStatementLine))


def _assigned(stmt: cst.CSTNode, name: str) -> list[cst.BaseExpression]:
    out = []
    for small in getattr(stmt, "body", ()) if isinstance(stmt, cst.SimpleStatementLine) else ():
        if (isinstance(small, cst.Assign) and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name) and small.targets[0].target.value == name):
            out.append(small.value)
    return out


def _method_of(ws: Workspace, src: SourceFile, cls: cst.ClassDef | None, value: cst.BaseExpression):
    """(source, class, method, evidence) of `self.<attr>.<method>` where `<attr>` is set in `cls.__init__` from a
    parameter annotated with a class of the repository."""
    if cls is None or not isinstance(value, cst.Attribute):
        return None
    attr = self_attr(value.value)
    init = find_method(cls, "__init__")
    if attr is None or init is None:
        return None
    params = {p.name.value: p for p in params_of(init)}
    for assign in find_all(init.body, cst.Assign):
        if (len(assign.targets) == 1 and self_attr(assign.targets[0].target) == attr
                and isinstance(assign.value, cst.Name) and assign.value.value in params):
            param = params[assign.value.value]
            kind = dotted(param.annotation.annotation) if param.annotation is not None else None
            found = ws.resolve(src, kind) if kind else None
            if not (isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef)):
                return None
            method = find_method(found.node, value.attr.value)
            if method is None:
                return None
            why = (f"`self.{attr}` is the `{assign.value.value}: {kind}` of `{cls.name.value}.__init__`, whose "
                   f"`{value.attr.value}` is defined at {Path(found.src.path).name}:{found.src.line(method)}")
            return found.src, found.node, method, Evidence(str(src.path), src.line(assign), why)
    return None
