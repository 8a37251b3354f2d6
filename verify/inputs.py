"""Forward inputs for a tiny model, synthesised from its forward signature, its config and its modules.

Each tensor argument is sized by the module that first consumes it: the forward's source (read with
libcst) names the call `self.<module>(..., arg, ...)`; the module, built on the meta device, says what
it takes (a Linear its in_features, a ConvNd its channels and kernel, a norm its width); a module made
of others is followed into its own forward with the argument it received. The number of dims comes
from what the pipeline passes, where the plan traced it. Image and text tokens get different lengths
(16 or 32 vs 6) so that a swapped pair of streams cannot hide behind equal shapes.

What cannot be sized this way is reported, never guessed: the fixture file is written with a
`raise` in its place for a person to fill in.
"""

from __future__ import annotations

import inspect
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst
from integrate.analyzers.forward import is_length
from integrate.analyzers.sequence_forward import is_position
from integrate.verify.tiny import TEXT_TOKENS

from integrate.defuse import PLAIN, defuse
from integrate.resolve import Workspace
from integrate.source import dotted, find_method
from integrate.syntax import find_all, self_member

TEXT_PADDING = 2  # masked-out text tokens at the end of the prompt
BATCH = 1
_TEXT_WORDS = ("encoder", "text", "txt", "context", "prompt", "caption", "cap_", "cond")
_SKIP = ("attention_kwargs", "joint_attention_kwargs", "cross_attention_kwargs", "controlnet", "cache", "lora")
_MISSING = object()
_NOT_ALIAS = ("shape", "size", "dtype", "device", "ndim", "dim")


@dataclass(frozen=True)
class Slot:
    """One forward argument: the Python expression that builds it (with `step` and `_randn` in scope)."""

    name: str
    expr: str | None  # None: leave the argument at its default
    why: str
    error: str | None = None  # set when no rule sized it: the fixture gets a `raise` here
    shape: tuple[int, ...] | None = None  # the tensor's shape, where the rule that made it knows it
    alternatives: tuple[str, ...] = ()  # other expressions the model's own code allows, tried in turn where `expr`
    # does not run (a mode string's other values): the bounded search in the worker's check


@dataclass
class Synthesis:
    slots: list[Slot] = field(default_factory=list)
    image_tokens: int | None = None
    text_tokens: int = TEXT_TOKENS

    @property
    def errors(self) -> list[str]:
        return [f"`{s.name}`: {s.error}" for s in self.slots if s.error]


# ---- which module consumes an argument (static) ------------------------------------------------------


def _names(node: cst.CSTNode) -> set[str]:
    out = set()
    for n in find_all(node, cst.Name):
        out.add(n.value)
    for a in find_all(node, cst.Attribute):  # `x.shape` is not x
        if a.attr.value in _NOT_ALIAS and isinstance(a.value, cst.Name):
            out.discard(a.value.value)
    return out


def _direct_names(node: cst.CSTNode) -> set[str]:
    """`_names`, less those only reached through a sub-module call nested in `node`: in
    `self.norm(self.in_layer(x))` the norm takes what `in_layer` made of x, not x."""
    if isinstance(node, cst.Call) and _module_path(node.func) is not None:
        return set()
    if isinstance(node, cst.Name):
        return {node.value}
    if isinstance(node, cst.Attribute) and node.attr.value in _NOT_ALIAS and isinstance(node.value, cst.Name):
        return set()  # `x.shape` is not x
    out: set[str] = set()
    for child in node.children:
        out |= _direct_names(child)
    return out


WORKSPACE = Workspace()  # shared by the fixture readers: each of the few files they read is parsed once


def class_node(cls) -> tuple[Any, cst.ClassDef] | None:
    try:
        path = Path(inspect.getsourcefile(cls) or "")
    except TypeError:
        return None
    if not path.is_file():
        return None
    src = WORKSPACE.load(path)
    node = src.classes.get(cls.__name__)
    return (src, node) if node is not None else None


def consumers(module, param: str):
    """(sub-module path, position or keyword it receives `param` at, source line) of each
    `self.<sub>(...)` call in `type(module).forward` whose arguments are derived from `param`, in order; a
    sub-module the config leaves as None is among them."""
    for klass in type(module).__mro__:
        found = class_node(klass) if "forward" in vars(klass) else None
        if found is None:
            continue
        src, node = found
        fn = find_method(node, "forward")
        if fn is None:
            return
        tracked = {param}
        for n in find_all(fn.body, (cst.Assign, cst.Call)):
            if isinstance(n, cst.Assign):
                call = n.value if isinstance(n.value, cst.Call) else None
                is_module_call = call is not None and self_member(call.func) is not None
                if not is_module_call and _names(n.value) & tracked:
                    for t in n.targets:
                        tracked |= {x.value for x in find_all(t.target, cst.Name)}
                    for comp in find_all(n.value, cst.CompFor):  # `[f(u) for u in hidden_states]`: u is it too
                        if _names(comp.iter) & tracked:
                            tracked |= {x.value for x in find_all(comp.target, cst.Name)}
                continue
            path = _module_path(n.func)
            if path is None:
                continue
            try:
                sub = module.get_submodule(path)
            except AttributeError:
                sub = None
                if "." in path or path.startswith("_") or getattr(module, path, _MISSING) is not None:
                    continue  # not a module (`self._gradient_checkpointing_func`), or not one by this name
                if _guarded_by(src, fn, n, path):
                    continue  # `if self.<path> is not None: ...`: forward goes on without it
                # `self.<path> = None` under this config: a consumer the model does not build
            if sub is module:
                continue
            position = 0
            for a in n.args:
                if a.star:
                    break
                if _direct_names(a.value) & tracked:
                    yield path, (a.keyword.value if a.keyword else position), src.line(n)
                    break
                if a.keyword is None:
                    position += 1
        return


def _guarded_by(src, fn: cst.FunctionDef, call: cst.Call, path: str) -> bool:
    """The call sits in the body of an `if` whose test reads `self.<path>`."""
    line = src.line(call)
    for test in find_all(fn, cst.If):
        reads = any(self_member(a) == path for a in find_all(test.test, cst.Attribute))
        if reads and src.line(test.body) <= line <= src.last_line(test.body):
            return True
    return False


def _module_path(func: cst.BaseExpression) -> str | None:
    """The sub-module a call in forward calls: `self.proj` -> "proj"; an entry of a ModuleDict or ModuleList
    picked by a constant, `self.x_embedders["image"]` / `self.blocks[0]` -> "x_embedders.image" / "blocks.0"."""
    path = self_member(func)
    if path is not None or not isinstance(func, cst.Subscript) or len(func.slice) != 1:
        return path
    base, index = self_member(func.value), func.slice[0].slice
    if base is None or not isinstance(index, cst.Index):
        return None
    key = index.value
    if isinstance(key, cst.SimpleString) and isinstance(key.evaluated_value, str):
        return f"{base}.{key.evaluated_value}"
    if isinstance(key, cst.Integer):
        return f"{base}.{key.evaluated_value}"
    return None


def _callee_param(sub, at: int | str) -> str | None:
    if isinstance(at, str):
        return at
    params = [p for p in inspect.signature(sub.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return params[at].name if at < len(params) else None


def intake(module, param: str, depth: int = 0) -> tuple[str, dict[str, Any], str] | None:
    """What the first consumer of `param` takes: (kind, facts, path) with kind linear / conv / norm /
    embedding, found by following composite modules into their forward."""
    from torch import nn

    if depth > 4:
        return None
    for path, at, _line in consumers(module, param):  # a consumer without weights (RoPE) says nothing
        try:
            sub = module.get_submodule(path)
        except AttributeError:  # consumers() yields such a path only for `self.<path> = None`
            return "absent", {}, path
        leaf = _leaf_intake(sub)
        if leaf is not None:
            return leaf[0], leaf[1], path
        if isinstance(sub, nn.Sequential) and len(sub):
            leaf = _leaf_intake(sub[0])
            if leaf:
                return leaf[0], leaf[1], f"{path}.0"
        inner = _callee_param(sub, at)
        found = intake(sub, inner, depth + 1) if inner else None
        if found is not None:
            return found[0], found[1], f"{path}.{found[2]}"
    return None


def _leaf_intake(m) -> tuple[str, dict[str, Any]] | None:
    from torch import nn

    if isinstance(m, nn.Linear):
        return "linear", {"width": m.in_features}
    if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return "conv", {"width": m.in_channels, "kernel": list(m.kernel_size), "stride": list(m.stride)}
    if isinstance(m, nn.Embedding):
        return "embedding", {"vocab": m.num_embeddings}
    if isinstance(m, (nn.LayerNorm, nn.GroupNorm)) or type(m).__name__.endswith(("RMSNorm", "LayerNorm")):
        weight = getattr(m, "weight", None)
        shape = getattr(m, "normalized_shape", None)
        width = shape[-1] if shape else (weight.shape[-1] if weight is not None else None)
        return ("norm", {"width": int(width)}) if width else None
    return None


# ---- the synthesis ------------------------------------------------------------------------------------


def _shape(*dims: int) -> str:
    return ", ".join(str(d) for d in dims)


def _axes(config: dict[str, Any]) -> int:
    for k, v in config.items():
        if "axes" in k and isinstance(v, (list, tuple)) and v and all(isinstance(x, int) for x in v):
            return len(v)
    return 3


def _patch(config: dict[str, Any]) -> tuple[int, int]:
    p = config.get("patch_size")
    p = p[-1] if isinstance(p, (list, tuple)) else p
    pt = config.get("patch_size_t")
    return int(p or 1), int(pt or 1)


def synthesize(model, config: dict[str, Any], passed: dict[str, int | None],
               shapes: dict[str, list[str]] | None = None) -> Synthesis:
    """Inputs for `model` (built on meta is enough). `passed`: keyword -> dims of the tensors the
    pipeline passes to the transformer (None when the dims were not traced); `shapes`: keyword -> the dims,
    by name, the forward's docstring documents (a tensor of more than 3 dims is shaped by them where every
    name is a batch, a sequence length or a config field)."""
    shapes = shapes or {}
    sig = inspect.signature(type(model).forward)
    params = [p for p in sig.parameters.values() if p.name != "self" and p.kind not in (p.VAR_POSITIONAL,
                                                                                           p.VAR_KEYWORD)]
    out = Synthesis()
    latent = params[0].name if params else None
    grid: tuple[int, ...] | None = None  # latent (frames, height, width) in tokens

    def needed(p) -> bool:
        return p.default is inspect.Parameter.empty or p.name in passed

    # the latent first: its token count is what ids, shapes and 2-D timesteps follow
    for p in params:
        name = p.name
        if name == latent:
            slot, grid = _latent(model, config, name, passed.get(name) or _unpacked_rank(model, name),
                                 shapes.get(name))
            out.slots.append(slot)
            if grid:
                n = 1
                for g in grid:
                    n *= g
                out.image_tokens = n
    s_img, s_txt = out.image_tokens or 16, TEXT_TOKENS
    joint = _joint_with_latent(model, config, params, latent, out.slots[0] if out.slots else None)
    if joint:
        out.slots[0] = joint.pop(latent)
    packed = _packed(latent, shapes)
    docs = _doc_entries(model)
    modes = {}  # mode parameter -> the value the fixture passes first
    named = _latent_axes(shapes.get(latent or ""), out.slots[0].shape if out.slots else None)
    for p in params:
        name, low, heads = p.name, p.name.lower(), annotation_heads(p.annotation)
        if name == latent:
            continue
        s_txt = s_img if name in packed else TEXT_TOKENS  # documented over the latent's own sequence
        required = p.default is inspect.Parameter.empty
        if name in joint:
            out.slots.append(joint[name])
        elif name == "return_dict":
            out.slots.append(Slot(name, "False", "the output as a tuple"))
        elif (kept := _typed_default(model, p, passed)) is not None:
            out.slots.append(Slot(name, None, kept))
        elif (_is_mapping(p.annotation) and needed(p) and not any(w in low for w in _SKIP)
              and (keys := _read_keys(model, name, {s.name: s.expr for s in out.slots if s.expr}))):
            entries = ", ".join(f"{k!r}: {expr}" for k, expr, _ in keys)
            out.slots.append(Slot(name, f"{{{entries}}}", "a dict of the keys forward reads from it: " + "; ".join(
                why for _, _, why in keys)))
        elif _is_mapping(p.annotation):
            out.slots.append(Slot(name, None, "annotated as a dict: left at its default") if p.default is not
                             inspect.Parameter.empty else Slot(name, None, "", "a dict input the fixture cannot build"))
        elif _state_object(p) and p.default is inspect.Parameter.empty:
            out.slots.append(own_object(model, config, p))
        elif p.default is inspect.Parameter.empty and (mode := mode_values(model, p)) is not None:
            values, evidence = mode
            modes[name] = values[0]
            out.slots.append(Slot(name, repr(values[0]), f"{values[0]!r}, the first of {tuple(values)!r}: {evidence}; "
                                  "each is tried in that order until the plain model runs",
                                  alternatives=tuple(repr(v) for v in values[1:])))
        elif required and heads == {"int"} and (checked := _checked_against_tokens(model, latent, name)):
            out.slots.append(Slot(name, str(s_img), f"the latent's {s_img} tokens per sample: forward raises unless "
                                  f"they are equal ({checked})"))
        elif not required and p.default is None and (under := _required_under(docs.get(name, ""), modes)):
            if "grid" in low and "Tensor" in str(p.annotation):
                value = list(grid or (1, 4, 4))
                out.slots.append(Slot(name, f"torch.tensor([{value!r}] * {BATCH})", f"the latent grid in tokens, one "
                                      f"row per sample: its docstring says it is required under {under}"))
            else:
                out.slots.append(Slot(name, None, "", f"its docstring says it is required under {under}; no rule "
                                                      "here makes it (write it by hand)"))
        elif not required and p.default is None and "Tensor" in str(p.annotation) and (
                called := _called_unguarded(model, name)):
            slot = _documented(name, shapes.get(name), config, s_txt, s_img) or _tensor(
                model, name, passed.get(name), s_txt, s_img)
            out.slots.append(slot if slot.error else Slot(name, slot.expr, f"{slot.why}: optional, but {called}",
                                                          shape=slot.shape))
        elif any(w in low for w in _SKIP) and p.default is inspect.Parameter.empty:
            # required, yet no input a fixture can make: leaving it out would only move the failure into the call
            word = next(w for w in _SKIP if w in low)
            typed = f", typed `{_type_name(p.annotation)}`" if p.annotation is not inspect.Parameter.empty else ""
            what = f"a setting of the model's own {word} machinery{typed}, whose value no rule here picks"
            out.slots.append(Slot(name, None, "", f"required and {what}: the fixture cannot make it (write it by "
                                                   "hand, or the model needs a step this fixture cannot take)"))
        elif any(w in low for w in _SKIP) or not needed(p):
            out.slots.append(Slot(name, None, "optional and not passed by the pipeline: left at its default"))
        elif heads and heads <= _PLAIN and "bool" in heads:
            out.slots.append(Slot(name, None if p.default is not inspect.Parameter.empty else "False",
                                  "a flag: left at its default" if p.default is not inspect.Parameter.empty
                                  else "a flag with no default: False"))
        elif ((shape := _over_latent_axes(shapes.get(name), named)) is not None and "Tensor" in str(p.annotation)
              and (kind := _axes_kind(low, p.default is inspect.Parameter.empty))):
            # documented over the latent's own axes by name (`timestep: (B, 1, T)` beside a `(B, C, T, H, W)` latent)
            expr = {"timestep": _time(shape),
                    "mask": f"torch.ones({_shape(*shape)})"}.get(kind, f"_randn({name!r}, {_shape(*shape)})")
            what = {"timestep": "diffusion time", "mask": "every entry kept"}.get(kind, "random")
            out.slots.append(Slot(name, expr, f"{what}, of shape ({', '.join(shapes[name])}) as the forward's "
                                  f"docstring documents it, each axis sized as the latent's of that name", shape=shape))
        elif _is_time(low):
            dims = passed.get(name) or 1
            shape = (BATCH,) if dims == 1 else (BATCH, s_img)
            out.slots.append(Slot(name, _time(shape),
                                  f"diffusion time, {dims}-D as the pipeline passes it"))
        elif "shape" in low:
            lists = _list_depth(p.annotation)
            value = repr(tuple(grid or (1, 4, 4)))
            for _ in range(max(lists - 1, 0)):  # `list[list[tuple]]`: one list of grids per sample
                value = f"[{value}]"
            out.slots.append(Slot(name, f"[{value}] * {BATCH}", "latent grid in tokens"
                                  + (f", nested as the annotation says ({lists} lists)" if lists > 1 else "")))
        elif "seq_len" in low:
            out.slots.append(Slot(name, f"[{s_txt}] * {BATCH}", "text length"))
        elif "int" in heads and (size := _grid_int(name, grid, config, params, s_img)):
            out.slots.append(Slot(name, str(size[0]), size[1]))
        elif heads and heads <= _PLAIN and p.default is not inspect.Parameter.empty:
            out.slots.append(Slot(name, None, f"a plain value ({' | '.join(sorted(heads))}) no rule sizes: left at its "
                                  "default"))
        elif "guidance" in low:
            if config.get("guidance_embeds") is False and p.default is not inspect.Parameter.empty:
                out.slots.append(Slot(name, None, "config has guidance_embeds=False"))
            else:
                out.slots.append(Slot(name, f"torch.full(({BATCH},), 3.5)", "guidance scale"))
        elif "mask" in low:
            text = s_txt if any(w in low for w in _TEXT_WORDS) or "mask" == low else s_img
            out.slots.append(Slot(name, f"_mask({BATCH}, {text}, pad={TEXT_PADDING})",
                                  f"{TEXT_PADDING} of {text} tokens masked out (one at the end, one early)"))
        elif low.endswith("_ids") and not is_position(name) and _per_token(shapes.get(name)):
            n = s_txt if any(w in low for w in _TEXT_WORDS) and name not in packed else s_img
            out.slots.append(Slot(name, f"torch.zeros({BATCH}, {n}, dtype=torch.long)",
                                  f"one id per token, all 0 (a single segment), shaped ({', '.join(shapes[name])}) as "
                                  "the forward's docstring documents it"))
        elif low.endswith("_ids") or low in ("ids", "pos", "positions"):
            text = any(w in low for w in _TEXT_WORDS)
            n, axes = (s_txt if text else s_img), _axes(config)
            dims = passed.get(name) or 2
            lead = "" if dims == 2 else f"{BATCH}, "
            expr = (f"torch.zeros({lead}{n}, {axes})" if text else
                    f"_grid_ids({grid or (1, 4, 4)!r}, {axes}" + (")" if dims == 2 else f", batch={BATCH})"))
            out.slots.append(Slot(name, expr, f"position ids of the {'text' if text else 'image'} tokens"))
        elif (roles := _compared_constants(model, name)) and (_per_token(shapes.get(name)) or passed.get(name) == 2):
            n = s_img if name in packed or not any(w in low for w in _TEXT_WORDS) else s_txt
            runs = [roles[i * len(roles) // n] for i in range(n)]  # each value over a run of tokens, in order
            out.slots.append(Slot(name, f"torch.tensor([{runs!r}] * {BATCH})",
                                  f"one of {roles} per token (forward compares `{name}` with those constants), "
                                  "each over a run of tokens"))
        elif (p.default is inspect.Parameter.empty and _tensor_pair(p.annotation) and is_position(name)
              and (inner := _inner_width(config))):
            # a required `video_rotary_emb: tuple[torch.Tensor, torch.Tensor]`, built outside the forward: (cos, sin)
            # over the latent's tokens, as wide as the attention's heads together
            out.slots.append(Slot(name, f"_rope_pair({name!r}, {BATCH}, {s_img}, {inner})",
                                  f"a (cos, sin) RoPE pair, [{BATCH}, {s_img}, {inner}] each (heads x head dim): the "
                                  "forward takes it ready-made as a tuple of two tensors (layout assumed)"))
        else:
            slot = _documented(name, shapes.get(name), config, s_txt, s_img) or _tensor(
                model, name, passed.get(name), s_txt, s_img)
            if slot.error and p.default is not inspect.Parameter.empty:  # the forward runs without it
                slot = Slot(name, None, f"left at its default {p.default!r}: the pipeline passes it, but {slot.error}")
            out.slots.append(slot)
    for i, slot in enumerate(out.slots):  # `list[torch.Tensor]`: one tensor per sample, without the batch axis
        p = sig.parameters.get(slot.name)
        if p is not None and slot.expr and slot.expr.startswith("_randn(") and _tensor_list(p.annotation):
            out.slots[i] = Slot(slot.name, f"_samples({slot.expr})", f"{slot.why}; a list of one tensor per sample "
                                "(without the batch axis), as its annotation `list[torch.Tensor]` says",
                                shape=slot.shape)
    return out


def _tensor_list(annotation) -> bool:
    """`list[torch.Tensor]` (or that or None)."""
    import typing

    import torch

    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else \
        (annotation,)
    return any(typing.get_origin(a) is list and typing.get_args(a) == (torch.Tensor,) for a in options)


def _joint_with_latent(model, config: dict[str, Any], params, latent: str | None, slot: Slot | None) -> dict[str, Slot]:
    """{name: slot} for the latent and each required tensor input its consumer takes with it (`torch.cat([u, v],
    dim=0)` of the latent and a condition, then the patch embedding: both sized by one Conv): the latent keeps
    the channels the model predicts back (the config's `out_channels` / `out_dim`), the others share the rest of
    the consumer's. {} where no other input reaches the latent's consumer, or the config names no such width."""
    if latent is None or slot is None or not slot.shape or slot.expr is None:
        return {}
    taken = intake(model, latent)
    if taken is None or taken[0] != "conv":
        return {}
    width, path = taken[1]["width"], taken[2]
    others = [p.name for p in params if p.name != latent and p.default is inspect.Parameter.empty
              and "Tensor" in str(p.annotation) and (got := intake(model, p.name)) is not None and got[2] == path]
    field_ = next((k for k in ("out_channels", "out_dim") if isinstance(config.get(k), int)), None)
    if not others or field_ is None or not 0 < config[field_] < width or (width - config[field_]) % len(others):
        return {}
    own, rest = config[field_], (width - config[field_]) // len(others)
    out = {}
    for name, channels in ((latent, own), *((o, rest) for o in others)):
        shape = (slot.shape[0], channels, *slot.shape[2:])
        step = ", step=step" if name == latent else ""
        out[name] = Slot(name, f"_randn({name!r}, {_shape(*shape)}{step})",
                         f"`{path}` takes {width} channels of {' and '.join(f'`{n}`' for n in (latent, *others))} "
                         f"together: the latent {own} (the config's `{field_}`, what the model predicts of it), "
                         f"{'this input' if name != latent else 'each other'} {rest}", shape=shape)
    return out


def _doc_entries(model) -> dict[str, str]:
    """{parameter: its entry's text} in forward's docstring (`name (`type`): text` and the lines below it), the
    docstring read with libcst."""
    _, fn = forward_of(model)
    doc = fn.get_docstring() if fn is not None else None
    out: dict[str, str] = {}
    current = None
    for line in (doc or "").splitlines():
        head = line.strip().split(" ", 1)[0]
        if head.isidentifier() and line.strip().startswith(f"{head} (") and line.strip().endswith(":"):
            current = head
            out[current] = ""
        elif current is not None:
            if not line.strip() and out[current]:
                current = None
            else:
                out[current] += " " + line.strip()
    return out


def _required_under(text: str, modes: dict[str, str]) -> str | None:
    """`Required under `mode="value"`` in a docstring entry, where the fixture passes that mode that value: the
    clause as written; None otherwise."""
    for mode, value in modes.items():
        clause = f'`{mode}="{value}"`'
        if f"Required under {clause}" in " ".join(text.split()):
            return clause
    return None


def _derived_from(fn: cst.FunctionDef, param: str) -> set[str]:
    """The names forward binds from `param` (assignments whose value reads it, comprehension targets over it),
    in order of the source, read with libcst."""
    tracked = {param}
    for n in find_all(fn.body, (cst.Assign, cst.CompFor)):
        if isinstance(n, cst.Assign) and _names(n.value) & tracked:
            for t in n.targets:
                tracked |= {x.value for x in find_all(t.target, cst.Name)}
        elif isinstance(n, cst.CompFor) and _names(n.iter) & tracked:
            tracked |= {x.value for x in find_all(n.target, cst.Name)}
    return tracked


def _checked_against_tokens(model, latent: str | None, param: str) -> str | None:
    """Where forward raises unless `param` equals a size of the latent's tokens (`if any(u.size(1) != seq_len for u
    in hidden_states): raise ValueError(...)`, hidden_states being the patch-embedded latent): the file:line; None
    otherwise."""
    src, fn = forward_of(model)
    if fn is None or latent is None:
        return None
    tracked = _derived_from(fn, latent)
    for test in find_all(fn, cst.If):
        if not find_all(test.body, cst.Raise):
            continue
        inner = set(tracked)
        for comp in find_all(test.test, cst.CompFor):
            if _names(comp.iter) & inner:
                inner |= {x.value for x in find_all(comp.target, cst.Name)}
        for comp in find_all(test.test, cst.Comparison):
            if len(comp.comparisons) != 1 or not isinstance(comp.comparisons[0].operator, cst.NotEqual):
                continue
            sides = (comp.left, comp.comparisons[0].comparator)
            if not any(isinstance(x, cst.Name) and x.value == param for x in sides):
                continue
            other = next(x for x in sides if not (isinstance(x, cst.Name) and x.value == param))
            sized = (isinstance(other, cst.Call) and isinstance(other.func, cst.Attribute)
                     and other.func.attr.value == "size") or (isinstance(other, cst.Subscript) and isinstance(
                         other.value, cst.Attribute) and other.value.attr.value == "shape")
            base = other.func.value if isinstance(other, cst.Call) else getattr(other, "value", None)
            base = getattr(base, "value", None) if isinstance(other, cst.Subscript) else base
            if sized and isinstance(base, cst.Name) and base.value in inner:
                return f"`{src.code(comp)}`, {src.path.name}:{src.line(test)}"
    return None


def _called_unguarded(model, param: str) -> str | None:
    """Why an optional tensor input must be given: forward calls a sub-module the config built (a weight of its
    own first: a Linear, a Conv, a norm, an Embedding) on the input itself, under no test of the input (`self.img_emb(x)
    if self.config.use_img_emb else None`: a config switch, not `x is not None`); None otherwise."""
    src, fn = forward_of(model)
    if fn is None:
        return None
    for call in find_all(fn.body, cst.Call):
        path = _module_path(call.func)
        if path is None or not any(isinstance(a.value, cst.Name) and a.value.value == param for a in call.args):
            continue
        try:
            sub = model.get_submodule(path)
        except AttributeError:
            return None
        line = src.line(call)
        tests = [t.test for t in (*find_all(fn, cst.If), *find_all(fn, cst.IfExp))
                 if src.line(t) <= line <= src.last_line(t)]
        if any(param in _names(t) for t in tests):
            return None
        taken = intake(model, param)
        if taken is None or taken[0] not in ("linear", "conv", "norm", "embedding") or sub is model:
            return None
        read = {self_member(a) for t in tests for a in find_all(t, cst.Attribute)} - {None}
        switches = sorted(w for w in read if not any(o.startswith(w + ".") for o in read))
        said = f" (`{'`, `'.join(switches)}` builds and calls it)" if switches else ""
        return f"forward calls `{path}` on it with no test of it ({src.path.name}:{line}){said}"
    return None


_NEUTRAL = {cst.BitAnd: True, cst.Multiply: True, cst.BitOr: False, cst.Add: False}  # x op value == x


def _read_keys(model, param: str, made: dict[str, str]) -> list[tuple[str, str, str]]:
    """The string keys forward subscripts on a dict input (`param`, or a dict it builds with `**param` in it and
    does not set that key in itself), each with the expression that makes it and why, read with libcst. A key is
    made only where forward combines it (`&`, `|`, `*`, `+`) with a value that comes from another input the fixture
    makes (`mask & ~features["k"].bool()`, `mask = padding_mask.bool()`): of that input's shape, and the value that
    leaves the other side as it is (False under `~` or beside `|` / `+`, True beside `&` / `*`), a bool where forward
    reads it `.bool()`. Empty where a key is read any other way (a fixture would guess it)."""
    src, fn = forward_of(model)
    if fn is None:
        return []
    holders, own = {param}, set()
    values: dict[str, cst.BaseExpression] = {}
    for a in find_all(fn.body, cst.Assign):
        for t in a.targets:
            if isinstance(t.target, cst.Name):
                values.setdefault(t.target.value, a.value)
        if isinstance(a.value, cst.Dict) and any(isinstance(e, cst.StarredDictElement) and param in _names(e.value)
                                                 for e in a.value.elements):
            holders |= {t.target.value for t in a.targets if isinstance(t.target, cst.Name)}
            own |= {e.key.evaluated_value for e in a.value.elements
                    if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)}

    def source(expr: cst.BaseExpression, depth: int = 0) -> str | None:
        """The input another value comes from: a forward parameter the fixture makes, through plain assignments."""
        for n in sorted(_names(expr) - holders):
            if n in made:
                return n
            if n in values and depth < 4 and (found := source(values[n], depth + 1)):
                return found
        return None

    def key_of(sub: cst.Subscript) -> str | None:
        if dotted(sub.value) not in holders or len(sub.slice) != 1 or not isinstance(sub.slice[0].slice, cst.Index):
            return None
        key = sub.slice[0].slice.value
        return key.evaluated_value if isinstance(key, cst.SimpleString) else None

    out: dict[str, tuple[str, str, str]] = {}
    for op in find_all(fn.body, cst.BinaryOperation):
        neutral = _NEUTRAL.get(type(op.operator))
        if neutral is None:
            continue
        for side, other in ((op.left, op.right), (op.right, op.left)):
            inverted = isinstance(side, cst.UnaryOperation) and isinstance(side.operator, cst.BitInvert)
            inner = side.expression if inverted else side
            as_bool = (isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute)
                       and inner.func.attr.value == "bool" and not inner.args)
            sub = inner.func.value if as_bool else inner
            key = key_of(sub) if isinstance(sub, cst.Subscript) else None
            if key is None or key in own or key in out or (partner := source(other)) is None:
                continue
            value = (not neutral) if inverted else neutral
            dtype = ", dtype=torch.bool" if as_bool else ""
            expr = f"torch.{'ones' if value else 'zeros'}_like({made[partner]}{dtype})"
            out[key] = (key, expr, f"`{key}` (line {src.line(op)}: `{src.code(op)[:60]}`) is as `{partner}`, all "
                                   f"{value}: the side it meets is left as it is")
    return list(out.values())


def _typed_default(model, p: inspect.Parameter, passed: dict[str, int | None]) -> str | None:
    """Why `p` is left at its default, where that default's type is the input's: an enum member, a string or a bool
    (never a tensor, a number or a list, whatever the parameter's name says: `timestep_mode="linear"` is no diffusion
    time); None, on a parameter with no annotation, where nothing says a tensor goes there instead (no dims traced
    from the pipeline's argument, not a mask, no sub-module of the model's forward taking it). None when the rules
    by name and annotation decide (an annotation names the type: `num_frames: int | None = None` is sized)."""
    import enum

    d = p.default
    if isinstance(d, enum.Enum):
        return f"its default is the enum member {type(d).__name__}.{d.name}: left at it (never made a tensor)"
    if isinstance(d, (bool, str)):
        kind = "a bool" if isinstance(d, bool) else "a string"
        return f"its default is {kind} ({d!r}): left at it (never made a tensor, a number or a list)"
    if (d is None and p.annotation is inspect.Parameter.empty and passed.get(p.name) is None
            and "mask" not in p.name.lower() and next(consumers(model, p.name), None) is None):
        return ("its default is None and nothing says a tensor goes there (no annotation, no dims traced from the "
                "pipeline's argument, no sub-module taking it): left at None")
    return None


def _is_time(low: str) -> bool:
    """An input named as diffusion time (`timestep`, `t`, `sigma`), its name lower-cased."""
    return "timestep" in low or low in ("t", "sigma", "sigmas")


def _time(shape: tuple) -> str:
    """Diffusion time of `shape`, moving a little each step as it does while denoising."""
    return f"torch.full(({_shape(*shape)},), 0.5 - 0.002 * step)"


def _axes_kind(low: str, required: bool) -> str | None:
    """How an input documented over the latent's axes is filled: a timestep as diffusion time, a mask with every
    entry kept, any other required tensor random; None for an optional one of another kind (left to the rules
    that follow, which leave such an input at its default rather than switch on a path the pipeline chose)."""
    if _is_time(low):
        return "timestep"
    if "mask" in low:
        return "mask"
    return "tensor" if required else None


def _latent_axes(documented: list[str] | None, shape: tuple[int, ...] | None) -> dict[str, int]:
    """{axis name as the docstring writes it: size} for the latent as made (`(B, C, T, H, W)` -> {"T": 2, ...}),
    where the docstring documents as many axes as it has; {} otherwise."""
    if not documented or not shape or len(documented) != len(shape):
        return {}
    return {d: n for d, n in zip(documented, shape) if not d.isdigit()}


def _over_latent_axes(dims: list[str] | None, named: dict[str, int]) -> tuple[int, ...] | None:
    """The shape of an input documented over the latent's grid axes: each dim a number or an axis the latent's
    documentation names, at least one of them a grid axis (not its first, the batch, nor a sequence length:
    a per-frame `(B, 1, T)`). None otherwise, and for a single dim: the other rules size those, and inputs over
    the latent's sequence length (packed text, segment ids)."""
    if not dims or len(dims) < 2 or not named:
        return None
    first = next(iter(named))
    if not any(d in named and d != first and not is_length(d) for d in dims):
        return None
    if not all(d.isdigit() or d in named for d in dims):
        return None
    return tuple(int(d) if d.isdigit() else named[d] for d in dims)


def _tensor_pair(annotation) -> bool:
    """`tuple[torch.Tensor, torch.Tensor]` (or that or None)."""
    import typing

    import torch

    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else \
        (annotation,)
    return any(typing.get_origin(a) is tuple and typing.get_args(a) == (torch.Tensor, torch.Tensor) for a in options)


def _inner_width(config: dict[str, Any]) -> int | None:
    """Heads x head dim, from the config's own fields; None where it names neither."""
    heads, dim = config.get("num_attention_heads"), config.get("attention_head_dim")
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (heads, dim))
    return heads * dim if ok else None


def _state_object(p: inspect.Parameter) -> bool:
    """Annotated with a class of the model's own library that is neither a tensor nor a module nor a plain
    value (`kv_cache: WanAnimate2KVCache`): state the model reads or fills, which no rule here makes."""
    a = p.annotation
    if a is inspect.Parameter.empty or not isinstance(a, type) or a.__module__ in ("builtins", "typing") or \
            a.__module__.startswith(("torch", "numpy")):
        return False
    import torch

    return not issubclass(a, (torch.Tensor, torch.nn.Module))


def _type_name(annotation) -> str:
    return getattr(annotation, "__name__", None) or str(annotation)


# ---- an object of the model's own, built through its constructor -------------------------------------


def own_object(model, config: dict[str, Any], p: inspect.Parameter) -> Slot:
    """A required input typed with a class of the model's own library (state it reads or fills: `kv_cache:
    WanAnimate2KVCache`), built through that class's own constructor, a fresh one each call (the object carries
    state from one call to the next: each run and each rank gets its own). The class is found with libcst from
    the annotation forward's signature writes, through the model file's imports; each required argument of its
    `__init__` is the tiny config's field of that name, else what the model's own code passes where it builds
    one (`Cls(self.config.num_layers)`, `Cls(len(self.blocks))`). Where an argument has neither, the slot's
    error names it and the constructor's line."""
    name = p.name
    src, fn = forward_of(model)
    param = next((q for q in _all_params(fn) if q.name.value == name), None) if fn is not None else None
    typed = _type_name(p.annotation)
    ref = _class_ref(param.annotation.annotation) if param is not None and param.annotation is not None else None
    found = WORKSPACE.resolve(src, ref) if ref else None
    if found is not None and not hasattr(found, "node") and hasattr(found, "qualname"):
        found = WORKSPACE.follow(found)  # a class another installed module defines
    node = getattr(found, "node", None)
    if not isinstance(node, cst.ClassDef):
        return Slot(name, None, "", f"required and typed `{typed}`, an object of the model's own: its class was not "
                                    "found in the source (write it by hand)")
    at = f"{found.src.path.name}:{found.src.line(node)}"
    module = found.src.dotted_name or getattr(p.annotation, "__module__", None)
    init = find_method(node, "__init__")
    if init is None and any(dotted(b.value) not in ("object", None) for b in node.bases):
        return Slot(name, None, "", f"required and typed `{typed}` ({at}): its constructor is inherited, not "
                                    "read here (write it by hand)")
    required = [q for q in _all_params(init)[1:] if q.default is None] if init is not None else []
    args, said = [], []
    for q in required:
        arg = q.name.value
        got = _own_argument(model, config, node.name.value, init, arg)
        if got is None:
            where = f"{found.src.path.name}:{found.src.line(init)}"
            return Slot(name, None, "", f"required and typed `{typed}`, an object of the model's own; its constructor "
                                        f"({where}) takes `{arg}`, which no config field names and the model's code "
                                        "never passes where it builds one (write it by hand)")
        args.append(f"{arg}={got[0]}")
        said.append(got[1])
    expr = f"_own({module!r}, {node.name.value!r}{''.join(', ' + a for a in args)})"
    why = (f"a fresh `{node.name.value}` each call, built through its own constructor ({at})"
           + (": " + "; ".join(said) if said else ", which takes no argument"))
    return Slot(name, expr, why)


def _all_params(fn: cst.FunctionDef | None) -> list[cst.Param]:
    if fn is None:
        return []
    ps = fn.params
    return [*ps.posonly_params, *ps.params, *ps.kwonly_params]


def _class_ref(node: cst.BaseExpression) -> str | None:
    """The dotted name of the class an annotation names: `Cls`, `mod.Cls`, `Cls | None`, `Optional[Cls]`,
    `"Cls"`; None for anything else."""
    if isinstance(node, cst.SimpleString) and isinstance(node.evaluated_value, str):
        try:
            node = cst.parse_expression(node.evaluated_value)
        except (cst.ParserSyntaxError, RecursionError):
            return None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitOr):
        members = [m for m in (node.left, node.right) if dotted(m) != "None"]
        return _class_ref(members[0]) if len(members) == 1 else None
    if isinstance(node, cst.Subscript) and dotted(node.value) in ("Optional", "typing.Optional") and \
            len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
        return _class_ref(node.slice[0].slice.value)
    return dotted(node)


def _own_argument(model, config: dict[str, Any], cls_name: str, init: cst.FunctionDef,
                  arg: str) -> tuple[str, str] | None:
    """(the fixture expression, why) for the constructor argument `arg`: the tiny config's field of that name,
    else the argument the model's own source passes where it builds the class (a config field read through
    `self.config.<f>` / `config.<f>`, `len(self.<module list>)`, an int literal); None when neither says."""
    value = config.get(arg)
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        return f"_config({arg!r}, {value!r})", f"`{arg}` is the config's field of that name ({value!r})"
    names = [q.name.value for q in _all_params(init)[1:]]
    found = class_node(type(model))
    if found is None:
        return None
    src = found[0]
    for call in find_all(src.module, cst.Call, skip_functions=False):
        if (dotted(call.func) or "").rpartition(".")[2] != cls_name:
            continue
        position, given = 0, None
        for a in call.args:
            if a.star:
                break
            if a.keyword is not None:
                if a.keyword.value == arg:
                    given = a.value
                    break
                continue
            if position < len(names) and names[position] == arg:
                given = a.value
                break
            position += 1
        if given is None:
            continue
        line = f"{src.path.name}:{src.line(call)}"
        field_ = dotted(given) or ""
        head, _, last = field_.rpartition(".")
        if head in ("self.config", "config") and isinstance(config.get(last), (int, float, str)):
            return (f"_config({last!r}, {config[last]!r})",
                    f"`{arg}`: the model builds one with its config's `{last}` ({line})")
        if isinstance(given, cst.Integer):
            return str(int(given.value)), f"`{arg}`: the model builds one with {given.value} ({line})"
        if (isinstance(given, cst.Call) and dotted(given.func) == "len" and len(given.args) == 1
                and (member := self_member(given.args[0].value))):
            try:
                n = len(model.get_submodule(member))
            except (AttributeError, TypeError):
                continue
            return str(n), f"`{arg}`: the model builds one with `len(self.{member})`, {n} in the tiny model ({line})"
    return None


def mode_values(model, p: inspect.Parameter) -> tuple[list[str], str] | None:
    """(the string values a mode parameter takes, the evidence): a `Literal[...]` annotation's values; else, for a
    parameter annotated `str` (or not at all), the values forward compares it with, read with libcst: a
    membership test first (`if mode not in ("extract", "cached"): raise`: the values it allows, in its order),
    then `mode == "..."` in source order. None where there are none."""
    import typing

    if typing.get_origin(p.annotation) is typing.Literal:
        values = [v for v in typing.get_args(p.annotation) if isinstance(v, str)]
        return (values, "the values its `Literal` annotation allows") if values else None
    heads = annotation_heads(p.annotation)
    if heads and not heads <= {"str", "None"}:
        return None
    src, fn = forward_of(model)
    if fn is None:
        return None
    allowed: list[str] = []
    compared: list[str] = []
    line = None
    for comp in find_all(fn, cst.Comparison):
        if not (isinstance(comp.left, cst.Name) and comp.left.value == p.name) or len(comp.comparisons) != 1:
            continue
        target = comp.comparisons[0]
        if isinstance(target.operator, (cst.In, cst.NotIn)) and isinstance(target.comparator, (cst.Tuple, cst.List,
                                                                                                cst.Set)):
            strings = [e.value.evaluated_value for e in target.comparator.elements
                       if isinstance(e.value, cst.SimpleString) and isinstance(e.value.evaluated_value, str)]
            if strings and not allowed:
                allowed, line = strings, line or src.line(comp)
        elif isinstance(target.operator, (cst.Equal, cst.NotEqual)) and isinstance(target.comparator, cst.SimpleString):
            value = target.comparator.evaluated_value
            if isinstance(value, str) and value not in compared:
                compared.append(value)
                line = line or src.line(comp)
    values = allowed + [v for v in compared if v not in allowed]
    if not values:
        return None
    what = "the values forward's membership test allows" if allowed else "the values forward compares it with"
    return values, f"{what} ({src.path.name}:{line})"


def _compared_constants(model, param: str) -> list[int]:
    """The int values forward compares `param` with (`indicator == LLM_TOKEN_INDICATOR`), read with libcst; a
    name is looked up in the model's own module. [] when it is compared with nothing of the kind."""
    _, fn = forward_of(model)
    if fn is None:
        return []
    out: list[int] = []
    for comp in find_all(fn, cst.Comparison):
        if not (isinstance(comp.left, cst.Name) and comp.left.value == param) or len(comp.comparisons) != 1:
            continue
        target = comp.comparisons[0]
        if not isinstance(target.operator, cst.Equal):
            continue
        got = _int_constant(model, target.comparator)
        if got is not None and got not in out:
            out.append(got)
    return out


def _unpacked_rank(model, param: str) -> int | None:
    """How many dims forward says `param` has where the pipeline's call was not traced: the names its shape is
    unpacked into (`batch, channels, frames, height, width = hidden_states.shape`), read with libcst; None when
    forward unpacks it no such way, or two ways."""
    found = _unpacked(model, param)
    return len(found[0]) if found else None


def _unpacked(model, param: str) -> tuple[tuple[str, ...], int] | None:
    """The names forward unpacks `param.shape` into, in order (`_` for a target that is not a plain name), and the
    line; None when forward unpacks it no such way, or two ways of different ranks."""
    src, fn = forward_of(model)
    found: dict[int, tuple[tuple[str, ...], int]] = {}
    for _, _, value, node in defuse(src, fn).statements(PLAIN) if fn is not None else ():
        target, *more = node.targets
        if (not more and isinstance(target.target, cst.Tuple) and isinstance(value, cst.Attribute)
                and value.attr.value == "shape" and isinstance(value.value, cst.Name) and value.value.value == param
                and not any(isinstance(e, cst.StarredElement) for e in target.target.elements)):
            names = tuple(e.value.value if isinstance(e.value, cst.Name) else "_" for e in target.target.elements)
            found.setdefault(len(names), (names, src.line(node)))
    return next(iter(found.values())) if len(found) == 1 else None


def forward_of(model):
    """(source, forward's FunctionDef) of the model's class, read with libcst; (None, None) when not found."""
    found = class_node(type(model))
    fn = find_method(found[1], "forward") if found is not None else None
    return (found[0], fn) if fn is not None else (None, None)


def _int_constant(model, node: cst.BaseExpression) -> int | None:
    """An int literal, or a name bound to an int in the model's own module (`FRACTAL_BLOCK_SIZE`)."""
    import sys

    if isinstance(node, cst.Integer):
        return int(node.value)
    got = getattr(sys.modules.get(type(model).__module__), node.value, None) if isinstance(node, cst.Name) else None
    return got if isinstance(got, int) and not isinstance(got, bool) else None


def _packed(latent: str | None, shapes: dict[str, list[str]]) -> set[str]:
    """Inputs the forward's docstring documents over the latent's own sequence dim (both `(batch_size,
    sequence_length, ...)`): text packed into one sequence with the image tokens, so of the latent's length."""
    dims = shapes.get(latent or "")
    if not dims or len(dims) < 2 or not is_length(dims[1]):
        return set()
    return {name for name, d in shapes.items() if name != latent and len(d) >= 2 and d[1] == dims[1]}


def _per_token(dims: list[str] | None) -> bool:
    """Documented as `(batch_size, <a length>)`: one value per token."""
    return bool(dims) and len(dims) == 2 and "batch" in dims[0].lower() and is_length(dims[1])


def _documented(name: str, dims: list[str] | None, config: dict[str, Any], s_txt: int, s_img: int) -> Slot | None:
    """A tensor of more than three dims shaped as the docstring names them, or None where a name is not one of
    a batch, a sequence length or a config field (the other rules then size it)."""
    if not dims or len(dims) <= 3:
        return None
    text = any(w in name.lower() for w in _TEXT_WORDS)
    sizes = []
    for d in dims:
        low = d.lower()
        if low.isdigit():
            sizes.append(int(low))
        elif "batch" in low:
            sizes.append(BATCH)
        elif is_length(d):
            sizes.append(s_txt if text or "text" in low else s_img)
        elif (size := config_size(d, config)) is not None:
            sizes.append(size)
        else:
            return None
    return Slot(name, f"_randn({name!r}, {_shape(*sizes)})", f"of shape ({', '.join(dims)}) as the forward's "
                f"docstring documents it, each from the config")


def config_size(text: str, config: dict[str, Any]) -> int | None:
    """A dim the docstring writes as arithmetic over config fields (`2 * in_visual_dim + 1`,
    `1 + len(injection_layer_ids)`), read with libcst and evaluated: ints, config ints, `len()` of a config
    list, + - * //. None for anything else."""
    try:
        node = cst.parse_expression(text)
    except (cst.ParserSyntaxError, RecursionError):
        return None

    def value(n) -> int | None:
        if isinstance(n, cst.Integer):
            return int(n.value)
        if isinstance(n, cst.Name):
            v = config.get(n.value)
            return v if isinstance(v, int) and not isinstance(v, bool) else None
        if (isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == "len" and len(n.args) == 1
                and isinstance(n.args[0].value, cst.Name)):
            v = config.get(n.args[0].value.value)
            return len(v) if isinstance(v, (list, tuple)) else None
        if isinstance(n, cst.BinaryOperation):
            a, b = value(n.left), value(n.right)
            if a is None or b is None:
                return None
            if isinstance(n.operator, cst.Add):
                return a + b
            if isinstance(n.operator, cst.Subtract):
                return a - b
            if isinstance(n.operator, cst.Multiply):
                return a * b
            if isinstance(n.operator, cst.FloorDivide) and b:
                return a // b
        return None

    got = value(node)
    return got if got is not None and 0 < got <= 1 << 16 else None


_PLAIN = {"bool", "int", "str", "list", "List", "tuple", "Tuple", "Sequence", "None"}  # annotations of non-tensors
_GRID_AXES = {"num_frames": 0, "frames": 0, "latent_num_frames": 0, "num_latent_frames": 0, "height": 1,
              "latent_height": 1, "width": 2, "latent_width": 2}


def _grid_int(name: str, grid, config, params, tokens: int) -> tuple[int, str] | None:
    """An int input that sizes the latent's grid (`num_frames`, `height`, `width` beside packed tokens:
    LTX2): the latent grid's extent in latent pixels (tokens x patch). `<stream>_num_frames` beside a
    `<stream>_hidden_states` is that stream's token count."""
    low = name.lower()
    axis = _GRID_AXES.get(low)
    if axis is not None:
        p, pt = _patch(config)
        extent = tuple(grid or (1, 4, 4))[axis] * (pt if axis == 0 else p)
        return extent, f"the latent grid's {('frame count', 'height', 'width')[axis]} in latent pixels"
    stream, _, rest = low.partition("_")
    if rest in ("num_frames", "frames") and any(q.name == f"{stream}_hidden_states" for q in params):
        return tokens, f"the token count of `{stream}_hidden_states`"
    return None


def annotation_heads(annotation) -> set[str]:
    """The heads of an annotation's members, by name: `dict[str, Any] | None` -> {"dict", "None"},
    `Optional[int]` -> {"int", "None"}. A string annotation is read with libcst; a typing object by its
    origin (`dict`, `collections.abc.Mapping` -> "Mapping")."""
    import types
    import typing

    if isinstance(annotation, str):
        try:
            members = [cst.parse_expression(annotation)]
        except (cst.ParserSyntaxError, RecursionError):
            return set()
        heads = set()
        while members:
            n = members.pop()
            if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.BitOr):
                members += [n.left, n.right]
            elif isinstance(n, cst.Subscript) and dotted(n.value) in ("Optional", "typing.Optional", "Union",
                                                                       "typing.Union"):
                members += [el.slice.value for el in n.slice if isinstance(el.slice, cst.Index)]
            else:
                head = dotted(n.value if isinstance(n, cst.Subscript) else n) or ""
                heads.add(head.rpartition(".")[2])
        return heads
    if annotation is inspect.Parameter.empty:
        return set()
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(annotation_heads(a) for a in typing.get_args(annotation)))
    kind = origin or annotation
    return {"None" if kind is type(None) else getattr(kind, "__name__", str(kind))}


def _is_mapping(annotation) -> bool:
    """The annotation is a dict (`dict`, `Optional[dict]`, `dict[str, Any] | None`, a Mapping)."""
    return bool(annotation_heads(annotation) & {"dict", "Dict", "Mapping"})


def _list_depth(annotation) -> int:
    """How many lists an annotation nests before its items: `list[list[tuple[int, int, int]]]` -> 2;
    1 when it says nothing (a plain or missing annotation). A string annotation is read with libcst."""
    import typing

    if isinstance(annotation, str):
        try:
            node = cst.parse_expression(annotation)
        except (cst.ParserSyntaxError, RecursionError):
            return 1
        depth = 0
        while isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and \
                node.value.value in ("list", "List", "Sequence") and len(node.slice) == 1 and \
                isinstance(node.slice[0].slice, cst.Index):
            depth, node = depth + 1, node.slice[0].slice.value
        return depth or 1
    depth = 0
    while typing.get_origin(annotation) is list:
        depth, annotation = depth + 1, (typing.get_args(annotation) or (None,))[0]
    if depth == 0 and typing.get_args(annotation):  # `X | None`: the first member
        first = next((a for a in typing.get_args(annotation) if a is not type(None)), None)
        return _list_depth(first) if first is not None and first is not annotation else 1
    return depth or 1


def _latent(model, config, name: str, dims: int | None,
            documented: list[str] | None = None) -> tuple[Slot, tuple[int, ...] | None]:
    taken = intake(model, name)
    p, pt = _patch(config)
    if taken is None:
        return Slot(name, None, "", f"no module consuming `{name}` was found in forward"), None
    kind, facts, path = taken
    if kind == "absent":
        return Slot(name, None, "", f"its consumer `{path}` is None under this config (not built)"), None
    if kind == "conv":
        k = facts["kernel"]
        spatial = [2 * k[0], 4 * k[1], 4 * k[2]] if len(k) == 3 else [4 * x for x in k]
        grid = tuple(s // st for s, st in zip(spatial, facts["stride"]))
        why = f"`{path}` is a Conv{len(k)}d taking {facts['width']} channels, kernel {k}"
        if len(k) == 2 and (len(documented) if documented else dims) == 5:
            # a video whose frames the 2-D patch embedding takes one by one (CogVideoX-style): a frame axis,
            # before the channels unless the docstring puts it after
            after = bool(documented) and "channel" in documented[1].lower()
            shape = (BATCH, facts["width"], 2, *spatial) if after else (BATCH, 2, facts["width"], *spatial)
            return Slot(name, f"_randn({name!r}, {_shape(*shape)}, step=step)",
                        f"{why}, frame by frame: 2 frames, {'after' if after else 'before'} the channels",
                        shape=shape), (2, *grid)
        patches = _patch_sequence(model, name, len(k), facts)
        if patches is not None:
            return patches
        shape = (BATCH, facts["width"], *spatial)
        return Slot(name, f"_randn({name!r}, {_shape(*shape)}, step=step)", why, shape=shape), grid
    if kind in ("linear", "norm") and (dims or 3) == 3:
        return Slot(name, f"_randn({name!r}, {_shape(BATCH, 16, facts['width'])}, step=step)",
                    f"`{path}` takes width {facts['width']} (16 packed tokens)", shape=(BATCH, 16, facts["width"])), \
            (1, 4, 4)
    if kind == "linear" and dims in (4, 5):
        per_patch = p * p * (pt if dims == 5 else 1)
        channels, why = config.get("in_channels"), "`in_channels`"
        if not isinstance(channels, int) and facts["width"] % per_patch == 0:
            # no channel count in config: one patch of channels is what the projection takes
            channels, why = facts["width"] // per_patch, f"{facts['width']} / patch volume {per_patch}"
        if not isinstance(channels, int):
            return Slot(name, None, "", f"a {dims}-D latent patchified in forward, but no `in_channels` in config "
                        f"and `{path}`'s width {facts['width']} is not a whole number of patches"), None
        side, guard = _grid_side(model)
        spatial = ([2 * pt] if dims == 5 else []) + [side * p, side * p]
        grid = tuple([2] if dims == 5 else [1]) + (side, side)
        last = _channels_last(documented, dims)
        shape = (BATCH, *spatial, channels) if last else (BATCH, channels, *spatial)
        why = (f"patchified in forward (patch {p}), then `{path}`; {channels} channels ({why})"
               + (", channels last as the forward's docstring documents it" if last else "")
               + (f"; a {side}x{side} token grid: forward refuses other sizes (line {guard})" if guard else ""))
        return Slot(name, f"_randn({name!r}, {_shape(*shape)}, step=step)", why, shape=shape), grid
    return Slot(name, None, "", f"`{path}` ({kind}) does not say how to shape a {dims}-D latent"), None


def _patch_sequence(model, name: str, spatial: int, facts: dict[str, Any]) -> tuple[Slot, tuple[int, ...]] | None:
    """A latent that is already a sequence of patches: forward unpacks its shape into one name more than its
    patch embedding (a ConvNd whose stride is its kernel) takes, the channels third (`batch_size, max_num_patches,
    channels, pt, ph, pw = hidden_states.shape`): the second axis is the patches, and each patch is one kernel,
    which the conv makes one token of. 16 patches (a 1x4x4 grid); None where forward does not say so."""
    found = _unpacked(model, name)
    kernel, stride = list(facts["kernel"]), list(facts["stride"])
    if found is None or len(found[0]) != spatial + 3 or kernel != stride:
        return None
    names, line = found
    if "channel" not in names[2].lower():
        return None
    grid = (1, 4, 4)
    shape = (BATCH, grid[0] * grid[1] * grid[2], facts["width"], *kernel)
    why = (f"forward unpacks `{name}.shape` into {len(names)} names (line {line}: {', '.join(names)}): one axis "
           f"more than its patch embedding (a Conv{spatial}d, kernel {kernel} = stride) takes, before the "
           f"{facts['width']} channels: `{names[1]}` is a sequence of patches, each one kernel the conv makes one "
           f"token of; {shape[1]} patches")
    return Slot(name, f"_randn({name!r}, {_shape(*shape)}, step=step)", why, shape=shape), grid


def _grid_side(model) -> tuple[int, int | None]:
    """The latent grid's side in tokens: 4, or the smallest multiple of 4 that every `x % N` in a test of
    forward's that raises is 0 for (a sparse attention's block size: `if height % 8: raise ...`), with the
    line of the first such test. N is an int literal or a module-level int; sides above 16 are not taken."""
    import math

    src, fn = forward_of(model)
    if fn is None:
        return 4, None
    side, line = 4, None
    for test in find_all(fn, cst.If):
        if not find_all(test.body, cst.Raise):
            continue
        for op in find_all(test.test, cst.BinaryOperation):
            if not isinstance(op.operator, cst.Modulo):
                continue
            n = _int_constant(model, op.right)
            if n is not None and 0 < n and math.lcm(side, n) <= 16:
                side = math.lcm(side, n)
                line = line or src.line(test)
    return side, line


def _channels_last(documented: list[str] | None, dims: int) -> bool:
    """The docstring documents the latent as `(batch, frames/height, ..., channels)`: its second dim is a
    frame count or a height, not the channels."""
    if not documented or len(documented) != dims:
        return False
    second = documented[1].lower()
    return any(w in second for w in ("frame", "height", "duration", "time")) and "channel" not in second


def _tensor(model, name: str, dims: int | None, s_txt: int, s_img: int) -> Slot:
    taken = intake(model, name)
    if taken is None:
        return Slot(name, None, "", "no rule for it and no module consuming it was found in forward")
    kind, facts, path = taken
    if kind == "absent":
        return Slot(name, None, "", f"its consumer `{path}` is None under this config (not built)")
    if kind == "embedding":
        return Slot(name, f"torch.randint(0, {facts['vocab']}, ({BATCH}, {s_txt}), generator=_gen({name!r}))",
                    f"token ids for `{path}`")
    width = facts["width"]
    text = any(w in name.lower() for w in _TEXT_WORDS)
    if dims == 2 or (dims is None and any(w in name.lower() for w in ("pooled", "vector", "vec", "y"))):
        return Slot(name, f"_randn({name!r}, {BATCH}, {width})", f"pooled vector for `{path}` (width {width})")
    n = s_txt if text else s_img
    return Slot(name, f"_randn({name!r}, {BATCH}, {n}, {width})",
                f"{'text' if text else 'image'} tokens for `{path}` (width {width})")


# ---- inputs as the forward's docstring documents them (the repair search's candidates) -------------------

_FRESH = 8  # tokens of a stream no other input sizes: neither the image's 16 nor the text's 6


def _is_index(name: str) -> bool:
    return name.lower().endswith(("indices", "_index", "_idx"))


def tag_values(text: str) -> list[tuple[int, str]]:
    """(value, the word after it) for each backticked int the docstring entry lists: "its modality: `0` video,
    `1` text" -> [(0, "video"), (1, "text")]."""
    parts = text.split("`")
    out = []
    for i in range(1, len(parts) - 1, 2):
        value, after = parts[i].strip(), parts[i + 1].strip(" ,:;.").split()
        if value.isdigit() and after:
            out.append((int(value), after[0].strip(",.;:").lower()))
    return out


def documented(model, config: dict[str, Any], shapes: dict[str, list[str]], described: dict[str, list],
               current: Synthesis) -> dict[str, Slot]:
    """Each input the forward's docstring documents a shape for, made as documented where that differs from
    `current`: one size per dim name across the inputs (`(batch, in_channels, length)` beside `(batch, length,
    condition_dim)`: one `length`), a config field's dims from the config (the docstring's `in_channels` over the
    width the first consumer takes of a concatenation), a batch as 1, the latent's other dims as made. Integer
    inputs follow what their entry says: `<x>_indices` beside an input `<x>` index its entries; the other
    `*_indices` are positions in one packed sequence (each stream's rows in turn), whose length, a dim no data
    input sizes, is their sum; a per-row input whose entry lists values (`0` video, `1` text) takes, on each row,
    the value of the stream whose `<word>_indices` holds it. The repair search swaps these in for the inputs a
    failure names; {} where nothing is documented."""
    if not shapes:
        return {}
    sig = inspect.signature(type(model).forward)
    params = [p.name for p in sig.parameters.values() if p.name != "self" and p.kind not in (
        p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    made = {s.name: s for s in current.slots}
    where = {k: (v[1] if isinstance(v, (list, tuple)) and len(v) > 1 else "the forward's docstring")
             for k, v in described.items()}
    bound: dict[str, int] = {}
    latent = params[0] if params else None

    def size(d: str, name: str) -> int | None:
        low = d.lower()
        if low.isdigit():
            return int(low)
        if "batch" in low or low in ("b", "bs"):
            return BATCH
        if d in bound:
            return bound[d]
        return config_size(d, config)

    # the latent's named dims: as made, but a config field's from the config
    lat = made.get(latent or "")
    dims = shapes.get(latent or "")
    if lat is not None and lat.shape and dims and len(dims) == len(lat.shape):
        for d, n in zip(dims, lat.shape):
            bound.setdefault(d, size(d, latent) or n)
    out: dict[str, Slot] = {}
    data = [n for n in params if shapes.get(n) and len(shapes[n]) >= 2 and not _is_index(n)
            and not (n.lower().endswith("_ids") or is_position(n))]
    for name in data:  # data tensors bind the stream lengths
        dims = shapes[name]
        sizes = []
        for i, d in enumerate(dims):
            n = size(d, name)
            if n is None and i == len(dims) - 1 and i > 0:
                taken = intake(model, name)
                n = taken[1].get("width") if taken and taken[0] in ("linear", "norm", "conv") else None
            if n is None and (0 < i < len(dims) - 1 or is_length(d)):  # a stream's length no input sized yet
                text = any(w in (name + d).lower() for w in _TEXT_WORDS)
                n = TEXT_TOKENS if text else _FRESH
            if n is None:
                break
            bound.setdefault(d, n)
            sizes.append(n)
        if len(sizes) != len(dims):
            continue
        shape = tuple(sizes)
        if made.get(name) is not None and made[name].shape == shape:
            continue
        step = ", step=step" if name == latent else ""
        expr = _time(shape) if _is_time(name.lower()) else f"_randn({name!r}, {_shape(*shape)}{step})"
        out[name] = Slot(name, expr, f"of shape ({', '.join(dims)}) = ({_shape(*shape)}) as the forward's docstring "
                         f"documents it ({where.get(name)}), each dim named alike sized alike", shape=shape)
    # integer inputs: indices into another input, positions in a packed sequence, per-row values
    one_d = {n: shapes[n][0] for n in params if shapes.get(n) and len(shapes[n]) == 1}
    packed = [n for n in one_d if _is_index(n) and n.lower().rpartition("_")[0] not in params]
    for n in packed:
        bound.setdefault(one_d[n], TEXT_TOKENS if any(w in n.lower() for w in _TEXT_WORDS) else _FRESH)
    unbound = {d for n, dims in shapes.items() for d in dims if size(d, n) is None and is_length(d)}
    seq = unbound.pop() if len(packed) >= 2 and len(unbound) == 1 else None
    offsets, total = {}, 0
    if seq is not None:
        for n in packed:
            offsets[n], total = total, total + bound[one_d[n]]
        bound[seq] = total
    for n in params:
        dims = shapes.get(n)
        if not dims or n in out or n in data:
            continue
        low = n.lower()
        sizes = [size(d, n) for d in dims]
        if None in sizes:
            continue
        shape = tuple(sizes)
        written = ", ".join(dims) + ("," if len(dims) == 1 else "")
        doc = f"({written}) as the forward's docstring documents it ({where.get(n)})"
        if n in offsets:
            out[n] = Slot(n, f"torch.arange({offsets[n]}, {offsets[n] + shape[0]})",
                          f"the positions of its {shape[0]} rows in the packed sequence of {total} ({seq} = the "
                          f"rows of {', '.join(f'`{p}`' for p in packed)} together, each stream's in turn), {doc}",
                          shape=shape)
        elif _is_index(n) and len(shape) == 1 and (of := low.rpartition("_")[0]) in params:
            count = (shapes.get(of) and size(shapes[of][0], of)) or 1
            out[n] = Slot(n, f"torch.arange({shape[0]}) % {count}",
                          f"an index into `{of}`'s {count} entries for each of its {shape[0]} rows, {doc}",
                          shape=shape)
        elif len(shape) == 1 and seq is not None and dims[0] == seq and (
                tags := tag_values((described.get(n) or [""])[0])):
            per_row = [0] * total
            named = []
            for value, word in tags:
                stream = next((p for p in packed if p.lower().startswith(word)), None)
                if stream is not None:
                    named.append(f"`{value}` on `{stream}`'s rows")
                    for i in range(offsets[stream], offsets[stream] + bound[one_d[stream]]):
                        per_row[i] = value
            out[n] = Slot(n, f"torch.tensor({per_row!r})",
                          f"one of the values its entry lists per row ({'; '.join(named) or 'the first'}), {doc}",
                          shape=shape)
        elif (low.endswith("_ids") or is_position(n)) and len(shape) in (2, 3) and shape[-1] <= 4:
            lead = "" if len(shape) == 2 else f", batch={shape[0]}"
            out[n] = Slot(n, f"_grid_ids((1, 1, {shape[-2]}), {shape[-1]}{lead})",
                          f"positions of its {shape[-2]} rows along the last of {shape[-1]} axes, {doc}",
                          shape=shape)
        elif _is_time(low) and made.get(n) is not None and made[n].shape not in (None, shape):
            out[n] = Slot(n, _time(shape), f"diffusion time, {doc}", shape=shape)
    return out
