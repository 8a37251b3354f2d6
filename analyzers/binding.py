"""Pitfall A, judged exactly: bind a call site to a block directly and through cache-dit's wrapper.

cache-dit swaps a block list for a one-element list holding a wrapper whose forward is
`(hidden_states, encoder_hidden_states, *args, **kwargs)` for Patterns 0-2 and
`(hidden_states, *args, **kwargs)` for 3-5; the wrapper calls each block as
`block(hidden_states[, encoder_hidden_states], *args, **kwargs)`. The loop body's call now
reaches the block through that second binding. A call that fails to bind, or a block
parameter that receives another argument than before, is pitfall A.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from integrate.source import SourceFile

from .records import Binding, Param

HIDDEN_ONLY = ("Pattern_3", "Pattern_4", "Pattern_5")
WITH_ENCODER = ("Pattern_0", "Pattern_1", "Pattern_2")


class BindError(Exception):
    pass


@dataclass(frozen=True)
class CallArgs:
    positional: tuple[str, ...]
    keywords: tuple[tuple[str, str], ...]
    opaque: bool = False  # *args / **kwargs at the call site: contents unknown

    @classmethod
    def of(cls, src: SourceFile, call: cst.Call, skip: int = 0, scope: cst.CSTNode | None = None) -> CallArgs:
        """The call's arguments as source text. `*name`, where `scope` (the loop body) builds `name` once as a
        tuple or list literal (`args = (x, c, y)`; `block(*args)`), is read as those elements; any other
        spread leaves the call opaque."""
        spreads = spread_literals(scope) if scope is not None else {}
        pos, kw, opaque = [], [], False
        for i, arg in enumerate(call.args):
            if i < skip:
                continue
            if arg.star == "*" and isinstance(arg.value, cst.Name) and arg.value.value in spreads:
                pos += [src.code(e) for e in spreads[arg.value.value]]
            elif arg.star:
                opaque = True
            elif arg.keyword is not None:
                kw.append((arg.keyword.value, src.code(arg.value)))
            else:
                pos.append(src.code(arg.value))
        return cls(tuple(pos), tuple(kw), opaque)


def spread_literals(scope: cst.CSTNode) -> dict[str, tuple[cst.BaseExpression, ...]]:
    """{name: elements} for each name `scope` assigns exactly once, and to a tuple or list literal with no
    starred element: what `*name` spreads into a call there."""
    from integrate.syntax import find_all, target_names

    seen: dict[str, list] = {}
    for node in find_all(scope, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        for t in targets:
            for name in target_names(t):
                seen.setdefault(name, []).append(node.value if isinstance(t, cst.Name)
                                                 and isinstance(node, cst.Assign) else None)
    out = {}
    for name, values in seen.items():
        value = values[0] if len(values) == 1 else None
        if isinstance(value, (cst.Tuple, cst.List)) and all(isinstance(e, cst.Element) for e in value.elements):
            out[name] = tuple(e.value for e in value.elements)
    return out


def bind(args: CallArgs, params: tuple[Param, ...]) -> dict[str, str]:
    """Python's binding rules, on source text: parameter -> argument (or its default)."""
    out: dict[str, str] = {}
    positional = [p for p in params if p.kind in ("positional_only", "positional_or_keyword")]
    var_pos = next((p for p in params if p.kind == "var_positional"), None)
    var_kw = next((p for p in params if p.kind == "var_keyword"), None)
    extra_pos: list[str] = []
    for i, value in enumerate(args.positional):
        if i < len(positional):
            out[positional[i].name] = value
        elif var_pos is not None:
            extra_pos.append(value)
        else:
            raise BindError(f"takes {len(positional)} positional arguments but {len(args.positional)} were given")
    extra_kw: list[str] = []
    by_name = {p.name: p for p in params if p.kind in ("positional_or_keyword", "keyword_only")}
    for name, value in args.keywords:
        if name in by_name:
            if name in out:
                raise BindError(f"got multiple values for argument '{name}'")
            out[name] = value
        elif var_kw is not None:
            extra_kw.append(f"{name}={value}")
        else:
            raise BindError(f"got an unexpected keyword argument '{name}'")
    for p in params:
        if p.name in out or p.kind in ("var_positional", "var_keyword"):
            continue
        if p.default is not None:
            out[p.name] = f"<default {p.default}>"
        elif not args.opaque:
            raise BindError(f"missing a required argument: '{p.name}'")
        else:
            out[p.name] = "<from *args/**kwargs>"
    if var_pos is not None:
        out["*" + var_pos.name] = ", ".join(extra_pos)
    if var_kw is not None:
        out["**" + var_kw.name] = ", ".join(sorted(extra_kw))
    return out


def _wrapper_params(pattern: str) -> tuple[Param, ...]:
    names = ["hidden_states"] + (["encoder_hidden_states"] if pattern in WITH_ENCODER else [])
    return tuple(Param(n, "positional_or_keyword") for n in names) + (
        Param("args", "var_positional"),
        Param("kwargs", "var_keyword"),
    )


def through_wrapper(args: CallArgs, block: tuple[Param, ...], pattern: str, encoder: str | None = None) -> Binding:
    """Bind `args` directly and through cache-dit's wrapper for `pattern`; compare."""
    try:
        direct = bind(args, block)
    except BindError as exc:
        return Binding(pattern, False, f"the original call does not bind: {exc}", ())
    wrapper = _wrapper_params(pattern)
    try:
        outer = _bind_wrapper(args, wrapper)
    except BindError as exc:
        return Binding(pattern, False, f"cache-dit's wrapper {exc}", ())
    try:
        via = bind(outer, block)
    except BindError as exc:
        return Binding(pattern, False, f"block {exc} when called by the wrapper", ())
    changed = tuple(sorted(k for k in direct if via.get(k) != direct[k]))
    if pattern in WITH_ENCODER and encoder is not None and not changed and outer.positional[1] != direct.get(encoder):
        # Binds unchanged by position, but the wrapper would treat another argument as the
        # encoder stream.
        return Binding(pattern, False, f"the wrapper's encoder_hidden_states slot would hold "
                                       f"`{outer.positional[1]}`, not `{encoder}`", ())
    return Binding(pattern, not changed, None, changed)


def _bind_wrapper(args: CallArgs, wrapper: tuple[Param, ...]) -> CallArgs:
    """The call the wrapper makes: block(hidden_states[, encoder_hidden_states], *args, **kwargs)."""
    named = [p.name for p in wrapper if p.kind == "positional_or_keyword"]
    slots: dict[str, str] = {}
    for name, value in zip(named, args.positional):
        slots[name] = value
    rest_pos = list(args.positional[len(named):])
    rest_kw = []
    for name, value in args.keywords:
        if name in named:
            if name in slots:
                raise BindError(f"got multiple values for argument '{name}'")
            slots[name] = value
        else:
            rest_kw.append((name, value))
    missing = [n for n in named if n not in slots]
    if missing and not args.opaque:
        raise BindError(f"is missing a required argument: '{missing[0]}'")
    return CallArgs(tuple(slots.get(n, "<missing>") for n in named) + tuple(rest_pos), tuple(rest_kw), args.opaque)
