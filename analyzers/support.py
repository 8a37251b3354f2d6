"""What the installed cache-dit already registers, read statically from its sources.

Reported beside the analysis, clearly labelled; never used as the analysis.
"""

from __future__ import annotations

import libcst as cst

from integrate.errors import InputError
from integrate.resolve import Resolved, Workspace
from integrate.source import dotted


def registered_adapters(ws: Workspace) -> dict[str, str]:
    """{name prefix: file} for every `@BlockAdapterRegister.register("...")` in cache-dit."""
    try:
        found = ws.locate_class("cache_dit", "BlockAdapterRegister")
    except InputError:
        return {}
    out: dict[str, str] = {}
    for path in sorted(found.src.path.parent.glob("*.py")):
        src = ws.load(path, found.src.package_root)
        for fn in src.functions.values():
            for deco in fn.decorators:
                call = deco.decorator
                if not isinstance(call, cst.Call) or not call.args:
                    continue
                name = dotted(call.func) or ""
                owner, _, meth = name.rpartition(".")
                if meth != "register" or not owner:
                    continue
                target = ws.resolve(src, owner)
                if not (isinstance(target, Resolved) and target.name == "BlockAdapterRegister"):
                    continue
                arg = call.args[0].value
                supported = all(
                    not (a.keyword and a.keyword.value == "supported" and dotted(a.value) == "False")
                    for a in call.args
                )
                if isinstance(arg, cst.SimpleString) and supported:
                    out[arg.evaluated_value] = f"{path}:{src.line(fn)}"
    return out


def support_note(ws: Workspace, pipeline_class: str | None, transformer_class: str | None) -> dict:
    adapters = registered_adapters(ws)
    matches = []
    for candidate in (pipeline_class, transformer_class):
        if not candidate:
            continue
        for prefix, where in adapters.items():
            if candidate.split(".")[0].startswith(prefix):
                matches.append({"class": candidate, "prefix": prefix, "adapter": where})
    return {
        "label": "reported beside the analysis: the installed cache-dit's own adapter registry",
        "cache_dit_found": bool(adapters),
        "registered": bool(matches),
        "matches": matches,
    }
