"""Whether a registration of cache-dit's own that answers a class name by prefix is deferred to.

cache-dit looks adapters and CP / TP planners up by the first registered name a class name starts with
(`BlockAdapterRegister.get_adapter`, `...PlannerRegister.get_planner`), and its adapters check the class they were
written for only where that class comes from diffusers (`_relaxed_assert` skips the check for any other module). So a
research repository's `WanModel`, or its own copy named `WanTransformer3DModel`, is handed cache-dit's Wan adapter
and planners as they are. A built-in is deferred to only where it was written for this very class (the same module
and name: what it asserts, read from its source) and, for an adapter, where its block lists and ForwardPatterns bind
here as the analysis reads this model (the block list's pattern or an alternative that binds as is, through the
call site's simulated binding); otherwise the plugin registers ours ahead of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from integrate.errors import InputError
from integrate.records import Evidence
from integrate.resolve import Workspace
from integrate.source import SourceFile, dotted
from integrate.syntax import find_all

from .records import BlockList, BuiltinAnswer, TransformerFacts


@dataclass(frozen=True)
class This:
    """The analysed transformer: its class name, qualified name (module.Class) and where it is defined; whether the
    plugin hands cache-dit our adapter (a loop that is no diffusers pipeline) or our planners (a plain torch module)
    rather than registering them under a name, which it then does not put ahead of anything either."""

    name: str
    qualname: str
    at: Evidence
    adapter_handed: bool = False
    planners_handed: bool = False


@dataclass(frozen=True)
class Config:
    """One `BlockAdapter(...)` a built-in adapter may return: (block list, the patterns it may get) pairs (None: not
    read), and whether it hands cache-dit a PatchFunctor, which rewrites the forward first so that the binding as read
    is not what runs ("yes", "no", or "maybe": chosen at run time, `X() if ... else None`)."""

    pairs: tuple[tuple[str, tuple[str, ...]], ...] | None
    functor: str
    line: int


def qualified(ws: Workspace, src: SourceFile, scope: cst.CSTNode | None, name: str, this: This) -> str:
    """`name` as `scope` (a function of `src`) or `src` itself imports it, qualified (`diffusers.WanTransformer3DModel`,
    as cache-dit's adapters import it), and followed to the module that defines it where it has the analysed class's
    name and comes from its package (only then can the two be one class; no other model file is read). The bare name
    where no import binds it."""
    module = None
    for imp in find_all(scope, cst.ImportFrom) if scope is not None else ():
        if imp.relative or imp.module is None or isinstance(imp.names, cst.ImportStar):
            continue
        for alias in imp.names:
            bound = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) \
                else dotted(alias.name)
            if bound == name and dotted(alias.name) == name:
                module = dotted(imp.module)
    if module is None and name in src.imports and src.imports[name].name == name \
            and not src.imports[name].module.startswith("."):
        module = src.imports[name].module
    if module is None:
        return name
    if name == this.name and module.split(".")[0] == this.qualname.split(".")[0]:
        try:
            found = ws.locate_class(module, name)
        except InputError:
            return f"{module}.{name}"
        if found.src.dotted_name:
            return f"{found.src.dotted_name}.{name}"
    return f"{module}.{name}"


def adapter_configs(src: SourceFile, fn: cst.FunctionDef) -> tuple[Config, ...]:
    """Every `BlockAdapter(...)` the adapter function builds, with `blocks=pipe.transformer.<list>` and
    `forward_pattern=ForwardPattern.<member>` read where written so (one or a list of each; a name the function
    assigns, `a if ... else b` included, stands for each value it may hold)."""
    assigned: dict[str, list[cst.BaseExpression]] = {}
    for a in find_all(fn, cst.Assign):
        for t in a.targets:
            if isinstance(t.target, cst.Name):
                assigned.setdefault(t.target.value, []).append(a.value)

    def options(value: cst.BaseExpression, depth: int = 0) -> list[cst.BaseExpression]:
        if isinstance(value, cst.IfExp):
            return options(value.body, depth) + options(value.orelse, depth)
        if isinstance(value, cst.Name) and value.value in assigned and depth < 3:
            return [o for v in assigned[value.value] for o in options(v, depth + 1)]
        return [value]

    out = []
    for call in find_all(fn, cst.Call):
        if (dotted(call.func) or "").rpartition(".")[2] != "BlockAdapter":
            continue
        kw = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        if "blocks" not in kw:
            continue
        given = [not (isinstance(o, cst.Name) and o.value == "None") for o in options(kw["patch_functor"])] \
            if "patch_functor" in kw else [False]
        functor = "yes" if all(given) else "no" if not any(given) else "maybe"
        out.append(Config(_pairs(kw["blocks"], kw.get("forward_pattern"), options), functor, src.line(call)))
    return tuple(out)


def _pairs(blocks: cst.BaseExpression, patterns: cst.BaseExpression | None,
           options) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    def items(value: cst.BaseExpression) -> list[cst.BaseExpression]:
        return [e.value for e in value.elements] if isinstance(value, (cst.List, cst.Tuple)) else [value]

    attrs = []
    for e in items(blocks):
        name = dotted(e) or ""
        if not name.startswith("pipe.transformer."):
            return None  # another model (`pipe.transformer_2`), or lists joined at run time
        attrs.append(name.removeprefix("pipe.transformer."))
    if patterns is None:
        return None
    members = []
    for e in items(patterns):
        each = []
        for o in options(e):
            head, _, member = (dotted(o) or "").rpartition(".")
            if not head.endswith("ForwardPattern") or not member.startswith("Pattern_"):
                return None  # built some other way: not read
            each.append(member)
        members.append(tuple(dict.fromkeys(each)))
    if len(members) == 1:
        members *= len(attrs)
    return tuple(zip(attrs, members)) if len(members) == len(attrs) else None


def _pair(bl: BlockList | None, attr: str, pattern: str) -> tuple[bool, str, Evidence] | None:
    """Does cache-dit's `pattern` on `attr` bind here: (verdict, why, our evidence), None where the analysis cannot
    tell (the list not found, its pattern unknown)."""
    if bl is None or bl.is_blocks is None:
        return None
    at = bl.evidence[0] if bl.evidence else Evidence(bl.block_file or "", 0, bl.why)
    if bl.is_blocks is False:
        return False, f"it wraps `{attr}`, which is no block list here ({bl.why})", at
    if bl.forward_pattern is None:
        return None
    site = bl.call_site
    binding = next((x for x in site.bindings if x.pattern == pattern), None) if site is not None else None
    read = f"the analysis reads {bl.forward_pattern}" + (f", also {', '.join(bl.alternatives)}"
                                                         if bl.alternatives else "")
    if pattern in (bl.forward_pattern, *bl.alternatives) and (binding is None or binding.binds):
        if site is not None and site.keyword_positional_mismatch:
            return False, (f"it wraps `{attr}` with {pattern} and no PatchFunctor, where no pattern binds the call "
                           f"site as is ({read}, reached through a PatchFunctor)"), at
        return True, f"`{attr}` with {pattern} ({read})", at
    if binding is not None and not binding.binds:
        return False, f"it wraps `{attr}` with {pattern}, which does not bind here: {binding.error} ({read})", at
    return False, f"it wraps `{attr}` with {pattern}, which does not bind here ({read})", at


def _pairs_verdict(bl: BlockList | None, attr: str, patterns: tuple[str, ...]) -> tuple[bool, str, Evidence] | None:
    """`_pair` over the patterns a list may get: binds where one of them does, rejected where each is."""
    verdicts = [_pair(bl, attr, p) for p in patterns]
    good = next((v for v in verdicts if v is not None and v[0]), None)
    if good is not None:
        return good
    if verdicts and all(v is not None for v in verdicts):
        return verdicts[0]
    return None


def binding(configs: tuple[Config, ...], facts: TransformerFacts | None) -> tuple[bool | None, str, Evidence | None]:
    """(True: one of the adapter's configurations binds here; False: every configuration was read, hands cache-dit no
    PatchFunctor, and has a list that does not bind; None: not judged), why, the evidence on our side."""
    if facts is None or not configs:
        return None, "its block lists were not read", None
    lists = {b.attr: b for b in facts.block_lists}
    rejected: list[tuple[str, Evidence]] = []
    unjudged = []
    for c in configs:
        if c.pairs is None or c.functor == "yes":
            unjudged.append("hands cache-dit a PatchFunctor" if c.pairs is not None else "is built at run time")
            continue
        verdicts = [_pairs_verdict(lists.get(attr), attr, patterns) for attr, patterns in c.pairs]
        bad = [v for v in verdicts if v is not None and not v[0]]
        if not bad and all(v is not None for v in verdicts):
            return True, "; ".join(v[1] for v in verdicts if v is not None), verdicts[0][2] if verdicts else None
        if bad and c.functor == "no":
            rejected.append((bad[0][1], bad[0][2]))
        else:
            unjudged.append("may hand cache-dit a PatchFunctor" if bad else "wraps a list the analysis did not judge")
    if rejected and not unjudged:
        return False, rejected[0][0], rejected[0][1]
    return None, f"its block lists were not judged (one of its configurations {unjudged[0] if unjudged else '?'})", None


def verdict(kind: str, name: str, key: str, where: str, written_for: tuple[str, ...], this: This,
            bound: tuple[bool | None, str, Evidence | None] | None = None, fallback: BuiltinAnswer | None = None,
            ) -> BuiltinAnswer:
    """The verdict on cache-dit's `key` registration (at `where`, "file:line") answering `name`: deferred to only where
    `written_for` holds this very class and, for an adapter, `bound` does not reject it. A planner that asserts no
    class (`written_for` empty) follows `fallback`, the verdict on cache-dit's adapter for this model, where there is
    one: written for this very class, the planner beside it is taken to be too."""
    file, _, line = where.rpartition(":")
    what = "adapter" if kind == "adapter" else f"{kind.upper()} planner"
    head = f"cache-dit's '{key}' {what} ({Path(file).name}:{line}) answers {name} by prefix"
    ours = "not deferred to, ours goes ahead of it"
    if this.adapter_handed and kind == "adapter":
        ours = ("not deferred to: ours is handed to cache-dit (`enable_cache(ADAPTER(model))`; the plugin registers no "
                "name for a loop that is no diffusers pipeline)")
    elif this.planners_handed and kind != "adapter":
        ours = ("not deferred to: ours is handed to cache-dit (a plain torch module: the plugin registers no planner "
                "under its class name)")
    evidence = [this.at]
    confidence = "high"
    if not written_for and fallback is not None:
        same = this.qualname in fallback.written_for
        confidence = "medium"
        why = (f"{head}; it asserts no class, and cache-dit's adapter for this model was written for "
               + (f"this very class, {this.qualname}: deferred to" if same else
                  f"{', '.join(fallback.written_for) or 'a class it does not name'}; this is {this.qualname}: {ours}"))
    elif not written_for:
        same, confidence = False, "medium"
        why = f"{head}, but asserts no class it was written for; this is {this.qualname}: {ours}"
    elif this.qualname not in written_for:
        same = False
        why = f"{head} but was written for {', '.join(written_for)}; this is {this.qualname}: {ours}"
    else:
        same = True
        why = f"{head} and was written for this very class, {this.qualname}"
        if bound is not None:
            ok, said, at = bound
            evidence += [at] if at is not None else []
            if ok is False:
                same, why = False, f"{why}, but the binding here rejects it: {said}: {ours}"
            elif ok is None:
                confidence, why = "medium", f"{why}; {said}: deferred to"
            else:
                why = f"{why}, and its block lists bind here: {said}: deferred to"
        else:
            why += ": deferred to"
    registration = Evidence(file, int(line) if line.isdigit() else 0, f"cache-dit registers its '{key}' {what} here")
    return BuiltinAnswer(kind, name, key, written_for, this.qualname, same, why, confidence,
                         (registration, *evidence))
