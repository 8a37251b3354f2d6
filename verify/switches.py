"""Config switches that build the modules forward calls (read with libcst; the model is built on the meta device in
a verify worker).

A transformer may build a sub-module only under a config switch (`self.image_projection = Proj(...) if
has_image_proj else None`, or `self.x = None` then `if flag: self.x = X(...)`) while its forward calls it outside
any test (`self.image_projection(image_embeds)`): the class defaults leave it None, and the plain model
cannot run, whatever inputs it gets. The switch is found in `__init__` and set:

- a parameter tested for truth (`if has_image_proj`): True;
- a parameter tested `is not None` and handed to the module's constructor as a width (`*_dim`, `*_size`,
  `*_channels`): the tiny conditioning width;
- anything else (a comparison with a value, an expression): not set; the line is reported.

Each change comes with its evidence (the unguarded call's line in forward, the switch's line in `__init__`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst

from integrate.source import find_method
from integrate.syntax import find_all, none_test, self_member

_WIDTH_WORDS = ("dim", "size", "channels")


@dataclass(frozen=True)
class Switch:
    path: str  # the sub-module forward calls (`image_projection`)
    param: str | None  # the __init__ parameter that decides whether it is built; None: not found
    value: Any  # what the tiny config sets it to (when param is set and `why` says how)
    why: str  # evidence, with file:line


def unbuilt_calls(model) -> list[tuple[str, str]]:
    """(sub-module path, "file:line") of each `self.<path>(...)` forward calls outside every `if` (it runs
    whatever the inputs), where the built model has `self.<path>` None."""
    from integrate.verify.inputs import forward_of

    src, fn = forward_of(model)
    if fn is None:
        return []
    out: list[tuple[str, str]] = []
    for call in find_all(fn, cst.Call):
        path = self_member(call.func)
        if path is None or "." in path or path.startswith("_") or path in (p for p, _ in out):
            continue
        if not hasattr(model, path) or getattr(model, path) is not None:
            continue
        line = src.line(call)
        if any(src.line(t) <= line <= src.last_line(t) for t in find_all(fn, (cst.If, cst.IfExp))):
            continue  # a call under a test: forward may never make it (`if guidance is not None: ...`)
        out.append((path, f"{Path(src.path).name}:{src.line(call)}"))
    return out


def switches(model) -> list[Switch]:
    """The switch for each module forward calls unguarded that the config leaves unbuilt (`unbuilt_calls`)."""
    from integrate.verify.inputs import class_node

    calls = unbuilt_calls(model)
    if not calls:
        return []
    found = next((class_node(k) for k in type(model).__mro__ if "__init__" in vars(k) and class_node(k)), None)
    init = find_method(found[1], "__init__") if found else None
    if init is None:
        return [Switch(path, None, None, f"forward calls `self.{path}` ({at}), None under this config; its "
                       "class's __init__ is not found") for path, at in calls]
    src = found[0]
    params = {p.name.value: p for p in (*init.params.posonly_params, *init.params.params, *init.params.kwonly_params)}
    return [_switch(src, init, params, path, at) for path, at in calls]


def _switch(src, init: cst.FunctionDef, params: dict, path: str, at: str) -> Switch:
    where = Path(src.path).name
    said = f"forward calls `self.{path}` ({at}) outside any test; under this config it is None"
    built = _built_under(src, init, path)
    if built is None:
        return Switch(path, None, None, f"{said}, and no switch that builds it is found in __init__")
    test, ctor, line = built
    shown = src.code(test)
    if isinstance(test, cst.Name) and test.value in params:
        return Switch(path, test.value, True, f"{said}; __init__ builds it only when `{shown}` ({where}:{line}): "
                      f"{test.value}=True")
    tested = none_test(test)
    if tested is not None and tested[0] in params and not tested[1]:  # `if <param> is not None`
        name = tested[0]
        handed = ctor is not None and any(isinstance(a.value, cst.Name) and a.value.value == name for a in ctor.args)
        if handed and any(w in name for w in _WIDTH_WORDS):
            from integrate.verify.tiny import WIDE

            return Switch(path, name, WIDE, f"{said}; __init__ builds it only when `{shown}` ({where}:{line}), with "
                          f"`{name}` its width: {name}={WIDE}, the tiny conditioning width")
    return Switch(path, None, None, f"{said}; __init__ builds it under `{shown}` ({where}:{line}), which no rule "
                  "sets")


def _built_under(src, init: cst.FunctionDef, path: str):
    """(the test under which __init__ assigns a module to `self.<path>`, the constructor call, its line): an
    `X(...) if test else None`, or an assignment in the body of `if test:`; None when neither is found."""
    for assign in find_all(init, cst.Assign):
        if not any(self_member(t.target) == path for t in assign.targets):
            continue
        value = assign.value
        if isinstance(value, cst.IfExp) and isinstance(value.orelse, cst.Name) and value.orelse.value == "None":
            return value.test, value.body if isinstance(value.body, cst.Call) else None, src.line(assign)
        if isinstance(value, cst.Call):
            line = src.line(assign)
            around = [t for t in find_all(init, cst.If) if src.line(t.body) <= line <= src.last_line(t.body)]
            if around:
                inner = max(around, key=src.line)
                return inner.test, value, src.line(inner)
    return None
