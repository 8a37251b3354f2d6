"""Width tables a sub-module fills in itself (read with libcst; the model's module is already imported in a verify
worker).

A config key left None may not mean "absent": the transformer hands it to a sub-module's constructor, which fills
it from a module-level table of real widths (`channels=motion_encoder_channel_sizes`, then in that class's
`__init__`: `if channels is None: channels = MOTION_ENCODER_CHANNEL_SIZES`, a dict of 512-wide convolutions). The
tiny config would keep those full widths, and the tiny model would spend minutes in them. The rule:

- the key names a width table (`channel`, `dim` or `width` in it) and is None in the config;
- `__init__` hands it, as a bare name, to a constructor's keyword;
- that class's `__init__` replaces the parameter, when None, by a module-level name whose value is a dict or list
  of integers;

then the tiny config gives that table with each width at most `WIDE` (keys and order unchanged, so a resolution
table still finds every resolution). Each change comes with its evidence (both lines).
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst

from integrate.source import find_method
from integrate.syntax import find_all, none_test, params_of

_TABLE_WORDS = ("channel", "dim", "width")


@dataclass(frozen=True)
class Table:
    key: str  # the config key
    value: Any  # the small table the tiny config gives it
    why: str  # evidence, with file:line


def defaulted_tables(cls, config: dict[str, Any]) -> list[Table]:
    """The width table of each None key of `config` that a sub-module fills from a module-level constant."""
    from integrate.verify.inputs import class_node

    unset = [k for k, v in config.items() if v is None and any(w in k for w in _TABLE_WORDS)]
    if not unset:
        return []
    found = next((class_node(k) for k in cls.__mro__ if "__init__" in vars(k) and class_node(k)), None)
    init = find_method(found[1], "__init__") if found else None
    if init is None:
        return []
    src = found[0]
    names = vars(sys.modules.get(cls.__module__)) if cls.__module__ in sys.modules else {}
    out = []
    for key in unset:
        handed = _handed(init, key)
        if handed is None:
            continue
        call, param = handed
        sub = names.get(call.func.value) if isinstance(call.func, cst.Name) else None
        table = _filled_from(sub, param) if inspect.isclass(sub) else None
        if table is None:
            continue
        const, value, at = table
        small = _small(value)
        if small is None or small == value:
            continue
        out.append(Table(key, small, f"`{key}` is None; __init__ hands it to `{call.func.value}` "
                         f"({Path(src.path).name}:{src.line(call)}), which fills `{param}` from the module's "
                         f"`{const}` ({at}), widths up to {_widest(value)}: the tiny config gives that table with "
                         f"each width at most {_cap()}"))
    return out


def _handed(init: cst.FunctionDef, key: str) -> tuple[cst.Call, str] | None:
    """(the constructor call, its parameter) where `__init__` passes the bare name `key` as a keyword."""
    for call in find_all(init, cst.Call):
        for arg in call.args:
            if (arg.keyword is not None and isinstance(arg.value, cst.Name) and arg.value.value == key
                    and isinstance(call.func, cst.Name)):
                return call, arg.keyword.value
    return None


def _filled_from(sub: type, param: str) -> tuple[str, Any, str] | None:
    """(constant's name, its value, "file:line") where `sub.__init__` has `if <param> is None: <param> = CONST`
    with CONST a module-level name of `sub`'s module."""
    from integrate.verify.inputs import class_node

    found = class_node(sub)
    init = find_method(found[1], "__init__") if found else None
    if init is None or param not in {p.name.value for p in params_of(init)}:
        return None
    src = found[0]
    for test in find_all(init, cst.If):
        if none_test(test.test) != (param, True):  # `if <param> is None:`
            continue
        body = test.body.body if isinstance(test.body, cst.IndentedBlock) else []
        for stmt in body:
            for small in getattr(stmt, "body", ()):
                if (isinstance(small, cst.Assign) and len(small.targets) == 1
                        and isinstance(small.targets[0].target, cst.Name) and small.targets[0].target.value == param
                        and isinstance(small.value, cst.Name)):
                    const = small.value.value
                    module = sys.modules.get(sub.__module__)
                    if module is not None and hasattr(module, const):
                        return const, getattr(module, const), f"{Path(src.path).name}:{src.line(small)}"
    return None


def _cap() -> int:
    from integrate.verify.tiny import WIDE

    return WIDE


def _is_width(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _small(value: Any) -> Any:
    """The table with each width capped; None for a value that is not a table of widths."""
    cap = _cap()
    if isinstance(value, dict) and value and all(_is_width(v) for v in value.values()):
        return {k: min(v, cap) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and value and all(_is_width(v) for v in value):
        return [min(v, cap) for v in value]
    return None


def _widest(value: Any) -> int:
    return max(value.values() if isinstance(value, dict) else value)
