"""cache-dit's text-encoder and VAE planner registries as its source declares them (`@<Register>.register("Name")`),
read with libcst, and the limits the encoder analysers share. A registration counts when its decorator is in cache-dit's
source; whether that module imports at run time is not checked."""

from __future__ import annotations

import libcst as cst

from integrate.errors import InputError
from integrate.records import Evidence
from integrate.resolve import Resolved, Workspace
from integrate.source import SourceFile, dotted

TE_REGISTER = "TextEncoderTensorParallelismPlannerRegister"
VAE_REGISTER = "AutoEncoderDataParallelismPlannerRegister"
ROOT_BASES = {"PreTrainedModel", "PreTrainedConfig", "PretrainedConfig"}  # hold only `None` defaults
MAX_DEPTH = 12

Class = tuple[SourceFile, cst.ClassDef]


def registrations(ws: Workspace, folder: str, register: str) -> dict[str, Evidence] | None:
    """{name: where} for each `@<register>.register("Name")` on a class in
    cache_dit/distributed/<folder>/*.py, in file order; None when cache-dit is not installed."""
    root = ws.package_root("cache_dit")
    if root is None:
        return None
    out: dict[str, Evidence] = {}
    for path in sorted((root / "cache_dit" / "distributed" / folder).glob("*.py")):
        try:
            src = ws.load(path, root)
        except InputError:
            continue
        for node in src.classes.values():
            for call in (d.decorator for d in node.decorators if isinstance(d.decorator, cst.Call)):
                owner, _, meth = (dotted(call.func) or "").rpartition(".")
                if meth != "register" or not call.args or not isinstance(call.args[0].value, cst.SimpleString):
                    continue
                target = ws.resolve(src, owner)
                if isinstance(target, Resolved) and target.name == register:
                    name = call.args[0].value.evaluated_value
                    out.setdefault(name, Evidence(str(path), src.line(call), f"@{register}.register({name!r})"))
    return out
