"""Where a pipeline holds its transformer: the attribute the adapter reads it from (`pipe.transformer`).

Read from the pipeline class's own `__init__`, statically:

* `self.register_modules(transformer=transformer, ...)` (diffusers): the keyword whose value is the parameter
  annotated with the transformer class, else the `transformer` keyword itself;
* `self.model = model` (a reference repository's sampler class): an attribute assigned the parameter annotated
  with the transformer class, or an instance of it built in place (`TinyDiT(...)`, `TinyDiT.from_pretrained(...)`).

A class without an `__init__` of its own is read through its base. Nothing found (an unannotated parameter under
another name, a base that is not source): None, and the caller keeps diffusers' convention, said as unknown,
never as read.
"""

from __future__ import annotations

import libcst as cst

from integrate.records import Evidence
from integrate.resolve import Resolved, Workspace
from integrate.source import SourceFile, base_names, dotted, find_method
from integrate.syntax import find_all, params_of, self_attr


def held_as(ws: Workspace, src: SourceFile, cls_name: str | None, transformer_class: str,
            depth: int = 0) -> tuple[str, Evidence] | None:
    """(attribute, where) of the transformer on an instance of the pipeline class `cls_name`, or None. A class
    without an `__init__` of its own is read through the first base that resolves to source."""
    cls = src.classes.get(cls_name) if cls_name else None
    init = find_method(cls, "__init__") if cls is not None else None
    if init is None:
        for base in base_names(cls) if cls is not None and depth < 6 else ():
            found = ws.resolve(src, base)
            if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
                return held_as(ws, found.src, found.node.name.value, transformer_class, depth + 1)
        return None
    typed = {p.name.value for p in params_of(init)
             if p.annotation is not None and _names_class(p.annotation.annotation, transformer_class)}
    for call in find_all(init.body, cst.Call):
        if self_attr(call.func) != "register_modules":
            continue
        for arg in call.args:
            value = arg.value
            if arg.keyword is not None and isinstance(value, cst.Name) and (
                    value.value in typed or (not typed and arg.keyword.value == "transformer")):
                return arg.keyword.value, Evidence(str(src.path), src.line(call), f"`{cls_name}.__init__` registers "
                                                   f"the transformer as `{arg.keyword.value}`")
    for assign in find_all(init.body, cst.Assign):
        for target in assign.targets:
            attr = self_attr(target.target)
            if attr is None:
                continue
            value = assign.value
            built = isinstance(value, cst.Call) and (
                _names_class(value.func, transformer_class) or (isinstance(value.func, cst.Attribute)
                                                                 and _names_class(value.func.value, transformer_class)))
            if (isinstance(value, cst.Name) and value.value in typed) or built:
                return attr, Evidence(str(src.path), src.line(assign), f"`{cls_name}.__init__` holds the transformer "
                                      f"as `self.{attr}`")
    return None


def _names_class(expr: cst.BaseExpression, cls: str) -> bool:
    """`TinyDiT`, `models.TinyDiT`, `TinyDiT | None`, `Optional[TinyDiT]`, `"TinyDiT"`: names the class `cls`."""
    for node in [expr, *find_all(expr, cst.Name), *find_all(expr, cst.Attribute), *find_all(expr, cst.SimpleString)]:
        name = node.evaluated_value if isinstance(node, cst.SimpleString) else dotted(node)
        if isinstance(name, str) and name.rsplit(".", 1)[-1] == cls:
            return True
    return False
