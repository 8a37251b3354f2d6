"""A transformer that takes its whole config as one dataclass (`def __init__(self, params: FluxParams)`), and the
config its own repository writes for it.

A reference repository often has no config.json: its released sizes are literals in its code
(`FluxParams(in_channels=64, hidden_size=3072, ...)` in a table of model specs). When the model folder gives no
config, the tiny fixture starts from the first such literal whose every keyword is a constant: a real size the
authors ship, shrunk as any config is. Read with libcst, never imported; `None` when the class takes no config
dataclass or no literal is found (the fixture then starts from the dataclass's defaults, and says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst
from integrate.records import Evidence
from integrate.resolve import Resolved, Workspace
from integrate.source import SourceFile, dotted, find_method
from integrate.syntax import find_all

from .values import UNKNOWN, evaluate, jsonable

MAX_FILES = 2000  # .py files read under the source root at most (a repository, not a site-packages)


@dataclass(frozen=True)
class ConfigLiteral:
    param: str  # the constructor's parameter that takes the config
    dataclass: str  # its class
    values: dict[str, Any]  # the literal's keywords, as JSON data
    evidence: Evidence  # where the literal is
    found: int  # how many complete literals the repository has (the first is taken)


def config_dataclass(ws: Workspace, src: SourceFile, cls: cst.ClassDef) -> tuple[str, str] | None:
    """(parameter, dataclass name) where the constructor's one parameter without a default is annotated with a
    class the source defines or imports and decorates with `@dataclass`."""
    init = find_method(cls, "__init__")
    if init is None:
        return None
    params = [*init.params.posonly_params, *init.params.params, *init.params.kwonly_params][1:]
    required = [p for p in params if p.default is None]
    if len(required) != 1 or required[0].annotation is None:
        return None
    name = dotted(required[0].annotation.annotation)
    if not name:
        return None
    found = ws.resolve(src, name)
    node = found.node if isinstance(found, Resolved) else None
    if not isinstance(node, cst.ClassDef) or not any(
            (dotted(d.decorator.func) if isinstance(d.decorator, cst.Call) else dotted(d.decorator))
            in ("dataclass", "dataclasses.dataclass") for d in node.decorators):
        return None
    return required[0].name.value, node.name.value


def _complete(call: cst.Call) -> dict[str, Any] | None:
    """The keywords of `call` as JSON data, where every argument is a keyword with a constant value."""
    out: dict[str, Any] = {}
    for arg in call.args:
        if arg.keyword is None or arg.star:
            return None
        value = evaluate(arg.value, {})
        if value is UNKNOWN or (value is not None and jsonable(value) is None):
            return None
        out[arg.keyword.value] = jsonable(value) if value is not None else None
    return out or None


def config_literal(ws: Workspace, src: SourceFile, cls: cst.ClassDef, root: Path) -> ConfigLiteral | None:
    """The first complete literal of the transformer's config dataclass in the .py files under `root` (sorted by
    path; the transformer's own file first)."""
    held = config_dataclass(ws, src, cls)
    if held is None:
        return None
    param, name = held
    files = sorted(root.rglob("*.py"))[:MAX_FILES]
    files.sort(key=lambda f: f.resolve() != src.path.resolve())
    first: tuple[Path, int, dict] | None = None
    count = 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if name not in text:  # a file that never spells the name holds no call of it; only parsed files are read
            continue
        try:
            module = cst.parse_module(text)
        except cst.ParserSyntaxError:
            continue
        wrapper = cst.metadata.MetadataWrapper(module, unsafe_skip_copy=True)
        lines = wrapper.resolve(cst.metadata.PositionProvider)
        for call in find_all(wrapper.module, cst.Call, skip_functions=False):
            if (dotted(call.func) or "").rpartition(".")[2] != name:
                continue
            values = _complete(call)
            if values is None:
                continue
            count += 1
            if first is None:
                first = (path, lines[call].start.line, values)
    if first is None:
        return None
    path, line, values = first
    why = (f"`{name}(...)` with every field a constant: the config the repository writes for `{cls.name.value}`"
           + (f" (the first of {count})" if count > 1 else ""))
    return ConfigLiteral(param, name, values, Evidence(str(path), line, why), count)
