"""Whether a class is a diffusers model (its bases traced, statically, to `ModelMixin`) or a diffusers pipeline
(to `DiffusionPipeline`).

True when some chain of bases reaches a class of that name; False when every base was traced and none does (a
plain `torch.nn.Module`, a `transformers` model, a plain class); None when a base could not be traced and no
other reaches it: unknown, never a guess.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from integrate.errors import InputError
from integrate.records import Evidence
from integrate.resolve import External, Resolved, Workspace
from integrate.source import SourceFile, base_names, dotted
from integrate.syntax import find_all

_DEPTH = 8


def model_mixin(ws: Workspace, src: SourceFile, cls: cst.ClassDef) -> tuple[bool | None, str]:
    """(answer, why) for `cls`; the why names the chain, the base that is not a model, or the untraced base."""
    return _trace(ws, src, cls, _named("ModelMixin"), "ModelMixin", 0, (cls.name.value,))


def diffusion_pipeline(ws: Workspace, src: SourceFile, cls: cst.ClassDef) -> tuple[bool | None, str]:
    """(answer, why): is `cls` a diffusers pipeline (a `DiffusionPipeline`)?"""
    return _trace(ws, src, cls, _named("DiffusionPipeline"), "DiffusionPipeline", 0, (cls.name.value,))


def diffusers_class(ws: Workspace, src: SourceFile, cls: cst.ClassDef, names: tuple[str, ...]
                    ) -> tuple[bool | None, str]:
    """(answer, why): does `cls` derive from one of diffusers' own classes named `names` (cache-dit's attention
    classes)? A base of that name counts only where it is diffusers' (imported from it, or defined in the installed
    diffusers): a project's own `Attention` is followed into its bases instead."""
    root = ws.package_root("diffusers")

    def diffusers_own(path) -> bool:
        return root is not None and Path(path).resolve().is_relative_to(Path(root).resolve())

    def hit(base: str, resolve) -> bool:
        if base.rsplit(".", 1)[-1] not in names:
            return False
        found = resolve()
        if isinstance(found, External):
            return found.qualname.split(".")[0] == "diffusers"
        return isinstance(found, Resolved) and diffusers_own(found.src.path)

    if cls.name.value in names and diffusers_own(src.path):  # one of them itself (diffusers' `Attention`)
        return True, f"{cls.name.value} is diffusers' own"
    return _trace(ws, src, cls, hit, " / ".join(names), 0, (cls.name.value,))


def delegated_forward(ws: Workspace, src: SourceFile, cls: cst.ClassDef, forward: cst.FunctionDef) -> Evidence | None:
    """Where `forward` hands the call on to a base class's forward (`super().forward(**kwargs)`,
    `Base.forward(self, ...)`) and a base it may reach has no source here (a package that is not installed, or a
    name that does not resolve): that call's line, naming the base, where it is imported and what was found. Its
    block lists and the walk over them cannot be read then. None: no such call, or every base is read."""
    bases = base_names(cls)
    calls = [c for c in find_all(forward.body, cst.Call) if isinstance(c.func, cst.Attribute)
             and c.func.attr.value == "forward" and (
                 (isinstance(c.func.value, cst.Call) and dotted(c.func.value.func) == "super")
                 or dotted(c.func.value) in bases)]
    if not calls:
        return None
    for base in bases:
        found = ws.resolve(src, base)
        if isinstance(found, Resolved):
            continue
        if isinstance(found, External):
            path, said = ws.locate(found.qualname)
            if path is not None:
                continue
            said = f"`{found.qualname.rpartition('.')[0]}`, which {said}"
        else:
            said = f"a name that does not resolve ({found.reason})"
        imp = src.imports.get(base.split(".")[0])
        where = f", imported at {src.path.name}:{src.line(imp.node)}" if imp is not None else ""
        call = " ".join(src.code(calls[0]).split())[:60]
        return Evidence(str(src.path), src.line(calls[0]),
                        f"`{cls.name.value}.forward` hands the call on to `{call}`, into its base `{base}` from "
                        f"{said}{where}: the block lists and the walk over them there cannot be read")
    return None


def _named(target: str):
    return lambda base, resolve: base.rsplit(".", 1)[-1] == target


def _trace(ws: Workspace, src: SourceFile, cls: cst.ClassDef, hit, target: str, depth: int,
           chain: tuple[str, ...]) -> tuple[bool | None, str]:
    """`hit(base as written, a function resolving it)` says whether a base is the target (`target`, in words)."""
    if depth > _DEPTH:
        return None, f"bases deeper than {_DEPTH} classes: {' -> '.join(chain)}"
    unknown: str | None = None
    others: list[str] = []
    for base in base_names(cls):
        if hit(base, lambda base=base: ws.resolve(src, base)):  # (resolved only where the name alone cannot tell)
            return True, " -> ".join((*chain, base.rsplit(".", 1)[-1]))
        found = ws.resolve(src, base)
        answer: bool | None
        if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
            answer, why = _trace(ws, found.src, found.node, hit, target, depth + 1, (*chain, found.node.name.value))
        elif isinstance(found, External) and found.qualname.split(".")[0] == "diffusers":
            try:  # a class built on a diffusers class, e.g. `class My(FluxTransformer2DModel)`
                where = ws.locate_class("diffusers", found.qualname.rsplit(".", 1)[-1])
            except InputError:
                where = None
            if where is not None and isinstance(where.node, cst.ClassDef):
                answer, why = _trace(ws, where.src, where.node, hit, target, depth + 1,
                                     (*chain, where.node.name.value))
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
