"""Whether a class is a diffusers model (its bases traced, statically, to `ModelMixin`) or a diffusers pipeline
(to `DiffusionPipeline`).

True when some chain of bases reaches a class of that name; False when every base was traced and none does (a
plain `torch.nn.Module`, a `transformers` model, a plain class); None when a base could not be traced and no
other reaches it: unknown, never a guess.
"""

from __future__ import annotations

import libcst as cst

from integrate.errors import InputError
from integrate.resolve import External, Resolved, Workspace
from integrate.source import SourceFile, base_names

_DEPTH = 8


def model_mixin(ws: Workspace, src: SourceFile, cls: cst.ClassDef) -> tuple[bool | None, str]:
    """(answer, why) for `cls`; the why names the chain, the base that is not a model, or the untraced base."""
    return _trace(ws, src, cls, "ModelMixin", 0, (cls.name.value,))


def diffusion_pipeline(ws: Workspace, src: SourceFile, cls: cst.ClassDef) -> tuple[bool | None, str]:
    """(answer, why): is `cls` a diffusers pipeline (a `DiffusionPipeline`)?"""
    return _trace(ws, src, cls, "DiffusionPipeline", 0, (cls.name.value,))


def _trace(ws: Workspace, src: SourceFile, cls: cst.ClassDef, target: str, depth: int,
           chain: tuple[str, ...]) -> tuple[bool | None, str]:
    if depth > _DEPTH:
        return None, f"bases deeper than {_DEPTH} classes: {' -> '.join(chain)}"
    unknown: str | None = None
    others: list[str] = []
    for base in base_names(cls):
        if base.rsplit(".", 1)[-1] == target:
            return True, " -> ".join((*chain, target))
        found = ws.resolve(src, base)
        answer: bool | None
        if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
            answer, why = _trace(ws, found.src, found.node, target, depth + 1, (*chain, found.node.name.value))
        elif isinstance(found, External) and found.qualname.split(".")[0] == "diffusers":
            try:  # a class built on a diffusers class, e.g. `class My(FluxTransformer2DModel)`
                where = ws.locate_class("diffusers", found.qualname.rsplit(".", 1)[-1])
            except InputError:
                where = None
            if where is not None and isinstance(where.node, cst.ClassDef):
                answer, why = _trace(ws, where.src, where.node, target, depth + 1, (*chain, where.node.name.value))
            else:
                answer, why = None, f"`{base}` is not found in the installed diffusers"
        elif isinstance(found, External):  # torch, transformers, ...: another package's class is no diffusers model
            answer, why = False, f"`{base}` is {found.qualname}, not a diffusers {target}"
        else:
            answer, why = None, f"base `{base}` of {chain[-1]} is not traced"
        if answer:
            return True, why
        if answer is None and unknown is None:
            unknown = why
        others.append(why)
    if unknown is not None:
        return None, unknown
    return False, "; ".join(others) or f"{' -> '.join(chain)}: no base leads to {target}"
