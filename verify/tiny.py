"""A tiny config of a transformer, derived from its real one, for proofs on a CPU.

Structure is what the proofs check, so the tiny model keeps it: every block list keeps at least two
blocks and the order of the list lengths (a decoder tail stays shorter than the list it is cut
from), the GQA ratio is kept with every head count even (so CP 2 and TP 2 divide it), RoPE axis
splits keep summing to the head dim (each axis even), the head dim (16) keeps a factor of three the real
one has (24), and the wide dims shrink together. A Linear width the model derives from them (a feed-forward
`int(dim * 8 / 3)`) keeps the division by 4 the full config's has, with a larger head dim where needed. The result
is sized on the meta device before anything is allocated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HEAD_DIM = 16
TEXT_TOKENS = 6  # the tiny text input's length (even, and never an image token count)
WIDE = 32  # text / pooled / feature dims
MAX_PARAMS = 20_000_000
_HEAD_DIM_KEYS = ("attention_head_dim", "head_dim", "dim_head", "d_kv")
_HIDDEN_KEYS = ("hidden_size", "inner_dim", "dim", "model_dim", "d_model")
_FF_KEYS = ("intermediate_size", "d_ff")  # feed-forward widths not named `*_dim`
_ENCODER_SIZE = 64  # pixels per side of an image a sub-encoder takes
_TOKENS = 1024  # a vocabulary larger than this is cut to it, unless the config names a token id beyond it
_MODEL_WIDTH_KEYS = ("embed_dim", "model_dim", "inner_dim", "hidden_dim", "d_model")
_TEXT_LENGTH_KEYS = ("max_text_seq_length", "text_seq_len", "max_text_len", "max_text_length")
_KEEP = ("channels", "patch", "sample_size", "max_seq", "axes_lens", "seq_len", "theta", "num_frames")


@dataclass
class Tiny:
    config: dict[str, Any]
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # key -> (before, after)
    parameters: int | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)  # what the derivation had to do, in words
    head: int = HEAD_DIM  # the head dim the tiny widths were derived from


def is_layers(key: str) -> bool:
    """A config key that counts stacked blocks: `num_layers`, `num_single_layers`, `depth`, `num_blocks`,
    `num_visual_blocks` (Kandinsky's), ... A count that is not a stack (`motion_blocks`, a per-block period such as
    `inject_face_latents_blocks`) does not start with `num_` and is left alone."""
    return (key == "num_layers" or key.endswith("_layers") or key.startswith("depth")
            or (key.startswith("num_") and key.endswith("_blocks")))


WIDTHS = ("tiny", "scaled", "real")


def tiny_config(config: dict[str, Any], widths: str = "tiny", head: int = HEAD_DIM) -> Tiny:
    """Shrink `config` (keys starting with "_" dropped) keeping the structure the proofs need.

    `widths` says what becomes of the input, conditioning and embedding widths (`text_dim`, `in_visual_dim`,
    `cond_token_dim`, ...): "tiny" makes each WIDE; "scaled" divides them all by one power of two, so a width
    that is twice another stays twice it (a pipeline that joins two encoder layers into one embedding);
    "real" leaves them as they are, for a pipeline whose own components (a VAE's latent channels, a
    conditioner's output) are sized to match them."""
    cfg = {k: v for k, v in config.items() if not k.startswith("_")}
    out = dict(cfg)
    changes: dict[str, tuple[Any, Any]] = {}

    def put(key: str, value: Any) -> None:
        if cfg.get(key) != value:
            changes[key] = (cfg.get(key), value)
        out[key] = value

    # layer counts: 2, 3, 4, ... by rank of the original counts, so their order survives
    layers = {k: v for k, v in cfg.items() if is_layers(k) and isinstance(v, int) and not isinstance(v, bool)}
    ranks = {v: i for i, v in enumerate(sorted({v for v in layers.values() if v > 0}))}
    for k, v in layers.items():
        if v > 0:
            put(k, min(v, 2 + ranks[v]))
    # heads: keep the query / KV ratio, every count even
    heads = {k: v for k, v in cfg.items() if k.endswith("heads") and isinstance(v, int) and v > 0}
    kv = {k: v for k, v in heads.items() if "kv" in k or "key_value" in k}
    q = {k: v for k, v in heads.items() if k not in kv}
    ratio = max((max(q.values()) // v for v in kv.values() if v and max(q.values()) % v == 0), default=1) if q else 1
    for k in kv:
        put(k, 2)
    for k in q:
        put(k, 2 * ratio)
    # head dim (named, or hidden size / heads) and the RoPE axes that must sum to it
    old_head = next((cfg[k] for k in _HEAD_DIM_KEYS if isinstance(cfg.get(k), int)), None)
    hidden_key = next((k for k in _HIDDEN_KEYS if isinstance(cfg.get(k), int) and cfg[k] >= 64), None)
    if old_head is None and hidden_key and q and cfg[hidden_key] % max(q.values()) == 0:
        old_head = cfg[hidden_key] // max(q.values())
    if old_head is None and hidden_key and not q:  # heads implied: the RoPE axes span one head
        axes = [v for k, v in cfg.items() if "axes" in k and isinstance(v, (list, tuple)) and v
                and all(isinstance(x, int) for x in v)]
        if axes and cfg[hidden_key] % sum(axes[0]) == 0:
            old_head = sum(axes[0])
    # a head dim the model splits in three (3-D RoPE over frames, height and width; a size embedding a third of
    # the width) keeps its factor of three
    head_dim = head * 3 // 2 if old_head and old_head % 3 == 0 else head
    for k, v in cfg.items():
        if (("head_dim" in k or k.endswith("dim_head") or k == "d_kv") and isinstance(v, int)
                and not isinstance(v, bool)):
            put(k, head_dim)
    for k, v in _head_lists(cfg, old_head, head_dim).items():
        put(k, v)
    # a RoPE width inside a head, a part of the real head: scaled with the head, so the rotated channels stay inside
    # the tiny head
    for k, v in (rope_widths(cfg, old_head, head_dim, even=True) if old_head else {}).items():
        if k not in changes:
            put(k, v)
    # a block interval or index (`inject_..._blocks`: every n-th block) stays within the shrunk lists
    tiny_layers = min((out[k] for k in layers if out[k] > 0), default=None)
    for k, v in cfg.items():
        if (tiny_layers and k not in layers and ("block" in k or "layer" in k) and isinstance(v, int)
                and not isinstance(v, bool) and 1 < v <= max(layers.values()) and v > tiny_layers):
            put(k, tiny_layers)
        elif (tiny_layers and k not in layers and ("block" in k or "layer" in k) and isinstance(v, (list, tuple))
              and v and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < max(layers.values())
                            for x in v) and max(v) >= tiny_layers):  # block indices: those the tiny lists have
            put(k, sorted({x for x in v if x < tiny_layers}) or [0])
    # a text length the model is built for (a positional table over text + image, a learned padding per
    # token): the length of the tiny text input, which the fixture and the pipeline capture both make
    for k, v in cfg.items():
        if (k.startswith("text_len") or k in _TEXT_LENGTH_KEYS) and isinstance(v, int) and not isinstance(v, bool):
            put(k, TEXT_TOKENS)
    tiny_heads = max([out[k] for k in q] or [2])
    for k in _HIDDEN_KEYS:
        if isinstance(cfg.get(k), int) and cfg[k] >= 64:
            put(k, tiny_heads * head_dim)
    # wide dims: the model's own width and its feed-forward width; then the input, conditioning and embedding
    # widths, as `widths` says
    inputs: dict[str, int] = {}
    real_width = old_head * max(q.values()) if old_head and q else None
    for k, v in cfg.items():
        if k in changes or any(w in k for w in _KEEP) or not isinstance(v, int) or isinstance(v, bool):
            continue
        dim = k.endswith("_dim") or ("_dim_" in k and not k.endswith("_head"))  # cross_attention_dim_t5
        if dim and real_width and v == real_width:  # the model's own width under another name: it stays equal
            put(k, tiny_heads * head_dim)
        elif dim and v >= 64 and widths != "tiny" and k not in _MODEL_WIDTH_KEYS and not any(
                w in k for w in ("ff", "mlp", "hidden")):
            inputs[k] = v
        elif dim and v >= 64:
            put(k, 4 * tiny_heads * head_dim if "ff" in k or "mlp" in k else WIDE)
        elif k.endswith("encoder_size") and v > _ENCODER_SIZE and v & (v - 1) == 0:  # a sub-encoder's input
            put(k, _ENCODER_SIZE)  # resolution (`motion_encoder_size`: the face crops the pipeline makes)
        elif (k in _FF_KEYS or k.endswith("_intermediate_size")) and v >= 64:
            put(k, 4 * tiny_heads * head_dim)
        elif k == "vocab_size" and v > _TOKENS and not any(
                (k2.endswith("_id") or k2.endswith("_ids")) and isinstance(v2, int) and v2 >= _TOKENS
                for k2, v2 in cfg.items()):
            put(k, _TOKENS)
        elif k == "multiple_of" and v > 16:
            put(k, 16)
    if widths == "scaled" and inputs:  # one power-of-two divisor for all: their ratios survive
        divisor = 2 ** max(0, (min(inputs.values()) // WIDE).bit_length() - 1)
        for k, v in inputs.items():
            if v % divisor == 0:
                put(k, v // divisor)
    return Tiny(out, changes)


def _head_lists(cfg: dict[str, Any], old_head: int | None, head_dim: int) -> dict[str, list[int]]:
    """{key: the list re-split} for each list of `cfg` that is cut from a head of `old_head`: RoPE axes that sum
    to it (each even), sections of half a head, sections indexing into a head some other way."""
    out: dict[str, list[int]] = {}
    if not old_head:
        return out
    for k, v in cfg.items():
        if isinstance(v, (list, tuple)) and v and all(isinstance(x, int) for x in v) and sum(v) == old_head:
            out[k] = _split_even(list(v), head_dim)
        elif (isinstance(v, (list, tuple)) and len(v) > 1 and all(isinstance(x, int) for x in v)
              and sum(v) * 2 == old_head):  # sections of half a head (multimodal RoPE over cos / sin halves)
            out[k] = _split_even(list(v), head_dim // 2)
        elif (isinstance(v, (list, tuple)) and len(v) > 1 and all(isinstance(x, int) and x > 0 for x in v)
              and sum(v) < old_head and "section" in k):  # axes_dim sum to the head: above
            # sections indexing into a head some other way (Ideogram4's interleaved RoPE reads 3 * section of
            # the head_dim / 2 frequencies): scaled with the head, so every index stays inside it
            out[k] = [max(1, x * head_dim // old_head) for x in v]
    return out


HYBRID_HEADS = 2  # what `more_heads` multiplies the head counts by: TP 2 then Ulysses 2 cut a tiny model's 2 heads


def more_heads(config: dict[str, Any], factor: int = HYBRID_HEADS) -> dict[str, tuple[Any, Any]] | str:
    """{key: (fixture's, new)}: a tiny config with `factor` times the heads (query and KV alike, so a GQA ratio
    stays) of a head dim `factor` times smaller, the RoPE axes re-split to it and a RoPE width inside a head shrunk
    with it (`rope_freq_dim`, `rotary_dim`); the model's widths, its Linear
    shapes and so every input stay as they are. Hybrid parallelism cuts the heads twice (TP 2, then Ulysses 2 of
    each rank's share) and the tiny model's 2 heads cut once only. A string: why no such config is made."""
    def number(key: str) -> int | None:
        v = config.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    heads = {k: v for k, v in config.items() if k.endswith("heads") and number(k)}
    q = [v for k, v in heads.items() if "kv" not in k and "key_value" not in k] or list(heads.values())
    # the model's width: a hidden size's name, or the heads' own (`dit_heads` beside `dit_dim`)
    widths = (*_HIDDEN_KEYS, *_MODEL_WIDTH_KEYS, *(f"{k[:-len('heads')]}dim" for k in heads))
    hidden = next((number(k) for k in widths if number(k)), None)
    old_head = next((number(k) for k in _HEAD_DIM_KEYS if number(k)), None)
    if old_head is None and hidden and q and hidden % max(q) == 0:
        old_head = hidden // max(q)
    if not heads:  # heads implied, the RoPE axes spanning one (Kandinsky6: model_dim / sum(axes_dims) heads)
        axes = [v for k, v in config.items() if "axes" in k and isinstance(v, (list, tuple)) and v
                and all(isinstance(x, int) for x in v)]
        if not (hidden and axes and hidden % sum(axes[0]) == 0):
            return "the fixture's config names no head count to raise, nor RoPE axes that span one head"
        old_head = sum(axes[0])
    if not old_head or old_head % (2 * factor):
        return f"the fixture's head dim ({old_head}) does not divide into {factor} even parts"
    head_dim = old_head // factor
    new: dict[str, Any] = {k: v * factor for k, v in heads.items()}
    for k, v in config.items():
        if (("head_dim" in k or k.endswith("dim_head") or k == "d_kv") and isinstance(v, int)
                and not isinstance(v, bool) and v == old_head):
            new[k] = head_dim
    for k, v in _head_lists(config, old_head, head_dim).items():
        if sum(v) not in (head_dim, head_dim // 2) and "section" not in k:
            return f"`{k}` {config[k]} cannot be re-split to a head dim of {head_dim}"
        new[k] = v
    # a RoPE width inside a head shrinks with the head, so the rotated channels stay inside it
    for k, v in rope_widths(config, old_head, head_dim).items():
        new.setdefault(k, v)
    return {k: (config[k], v) for k, v in new.items() if config[k] != v}


def rope_widths(config: dict[str, Any], old_head: int, head_dim: int, even: bool = False) -> dict[str, int]:
    """{key: width} of each RoPE width inside a head (`rotary_dim`: the leading channels of each head that rotate;
    `rope_freq_dim`: frequencies per axis), scaled from a head of `old_head` to one of `head_dim` channels: a count of
    channels kept even (at least 2), a count of frequencies down to 1 (kept even too with `even`, as the tiny
    config's derivation has always made it)."""
    out = {}
    for k, v in config.items():
        if (("rope" in k or "rotary" in k) and "dim" in k and isinstance(v, int) and not isinstance(v, bool)
                and 0 < v < old_head):
            scaled = v * head_dim // old_head
            out[k] = max(1, scaled) if "freq" in k and not even else max(2, scaled // 2 * 2)
    return out


def fill_unset(config: dict[str, Any]) -> dict[str, Any]:
    """{key: value} for the fields a class's defaults leave None where the model cannot be built without them
    (a real config always gives them): small values of the kind the name says, for a tiny model only. The
    caller says which were filled; the full-size check never uses them."""
    heads = max((v for k, v in config.items() if k.endswith("heads") and "kv" not in k and isinstance(v, int)),
                default=None)
    filled: dict[str, Any] = {}
    groups = config.get("norm_num_groups")  # a GroupNorm over the input channels needs them divisible
    channels = groups if isinstance(groups, int) and not isinstance(groups, bool) and groups > 4 else 4
    for k, v in config.items():
        if v is not None:
            continue
        if k == "in_channels":
            filled[k] = channels
        elif k == "out_channels":
            filled[k] = config.get("in_channels") if isinstance(config.get("in_channels"), int) else channels
        elif k.startswith("patch_size"):
            filled[k] = 1 if k.endswith("_t") else 2
        elif k.endswith("kv_heads") and heads:
            filled[k] = heads  # no grouping: as many KV heads as query heads
        elif k.startswith("axes_dim"):
            filled[k] = [HEAD_DIM // 2] * 2  # two axes over one head; re-split to the tiny head dim below
        elif (k.endswith("_dim") or "_dim_" in k or k in ("caption_channels", "text_channels")) and not any(
                w in k for w in ("multiplier", "ratio")):
            filled[k] = WIDE
    if "out_channels" in filled and "in_channels" in filled:
        filled["out_channels"] = filled["in_channels"]
    return filled


def _split_even(parts: list[int], total: int) -> list[int]:
    """Scale `parts` to sum to `total`, each part even and at least 2."""
    scaled = [max(2, round(p * total / sum(parts) / 2) * 2) for p in parts]
    i = 0
    while sum(scaled) != total and i < 100:
        j = scaled.index(max(scaled)) if sum(scaled) > total else scaled.index(min(scaled))
        scaled[j] += -2 if sum(scaled) > total else 2
        i += 1
    return scaled


def size_on_meta(cls, config: dict[str, Any]) -> int:
    """Parameter count of `cls` built from `config` on the meta device (nothing allocated)."""
    return _on_meta(cls, config)[0]


def config_object(cls) -> tuple[str, type] | None:
    """(parameter, dataclass) where `cls.__init__` takes its whole config as one dataclass (a reference repository's
    `def __init__(self, params: FluxParams)`): the one parameter without a default, annotated with a dataclass.
    The config is then that dataclass's fields, flat, so the tiny derivation shrinks them as it does any config."""
    import dataclasses
    import inspect
    import typing

    if hasattr(cls, "from_config"):
        return None
    try:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        hints = typing.get_type_hints(cls.__init__)
    except (TypeError, ValueError, NameError):  # an annotation that does not resolve: no config object
        return None
    required = [p for p in params if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if len(required) != 1:
        return None
    kind = hints.get(required[0].name)
    return (required[0].name, kind) if isinstance(kind, type) and dataclasses.is_dataclass(kind) else None


def object_defaults(cls) -> dict[str, Any]:
    """The config a class's own defaults give: its constructor's keyword defaults, or, where it takes a config
    dataclass, that dataclass's fields (None where a field has no default)."""
    import dataclasses
    import inspect

    held = config_object(cls)
    if held is None:
        return {k: v.default for k, v in inspect.signature(cls.__init__).parameters.items()
                if k != "self" and v.default is not inspect.Parameter.empty}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(held[1]):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = None
    return out


def build(cls, config: dict[str, Any]):
    """`cls` made from `config`: diffusers' `from_config`, or, for a model of another library's or a plain
    `nn.Module` (a reference repository's), its constructor with the config's fields as keywords, or with them
    made into the config dataclass the constructor takes."""
    if hasattr(cls, "from_config"):
        return cls.from_config(config)
    held = config_object(cls)
    if held is not None and held[0] not in config:
        return cls(**{held[0]: held[1](**config)})
    return cls(**config)


def model_config(model, given: dict[str, Any]) -> dict[str, Any]:
    """The config a built model records (diffusers' `model.config`), else the one it was built from."""
    recorded = getattr(model, "config", None)
    return dict(recorded) if recorded is not None and hasattr(recorded, "keys") else dict(given)


def _on_meta(cls, config: dict[str, Any]) -> tuple[int, str | None]:
    """(parameter count, the first layer with a weight 0 wide) of `cls` built from `config` on the meta device."""
    import torch

    with torch.device("meta"):
        model = build(cls, config)
    empty = next((name for name, m in model.named_modules() if isinstance(getattr(m, "weight", None), torch.Tensor)
                  and m.weight.dim() >= 2 and 0 in m.weight.shape), None)
    return sum(p.numel() for p in model.parameters()), empty


def kind_of(path: str) -> str:
    """A module or parameter path with its list indices written `*` (`blocks.3.attn` -> `blocks.*.attn`)."""
    return ".".join("*" if part.isdigit() else part for part in path.split("."))


def linear_widths(cls, config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """{module kind (list indices `*`): (in, out) features} of every `nn.Linear` of `cls` built from `config` on the
    meta device (the first of each kind)."""
    import torch

    with torch.device("meta"):
        model = build(cls, config)
    out: dict[str, tuple[int, int]] = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            out.setdefault(kind_of(name), (m.in_features, m.out_features))
    return out


DIVISOR = 4  # what a width is cut by: TP 2, a gated FFN's two halves each cut by TP 2, Ulysses 2 x TP 2
MIN_CUT = 16  # the narrowest width looked at (the tiny model's own width is 32)


def _uncut(width: int) -> bool:
    """A width DIVISOR does not divide, wide enough to be looked at (one as small as a head count, a per-head gate
    over 2 tiny heads, divides as the tiny heads do)."""
    return bool(width % DIVISOR) and width >= MIN_CUT


def lost_divisibility(cls, config: dict[str, Any], tiny: Tiny) -> list[str]:
    """The Linear widths the tiny config makes indivisible by DIVISOR where the full config's are divisible (a
    feed-forward width derived in the model, `int(dim * 8 / 3)`: 10240 at full size, 85 tiny), as
    "kind: full -> tiny". Built on the meta device; the full config only where the tiny one has such a width."""
    try:
        small = linear_widths(cls, tiny.config)
    except Exception:  # noqa: BLE001 - nothing to compare
        return []
    odd = {k: w for k, w in small.items() if _uncut(w[0]) or _uncut(w[1])}
    if not odd:
        return []
    try:
        full = linear_widths(cls, {k: v for k, v in config.items() if not k.startswith("_")})
    except Exception:  # noqa: BLE001 - the full config does not build here: nothing to compare
        return []
    lost = []
    for k, (i, o) in odd.items():
        if k in full and ((_uncut(i) and not full[k][0] % DIVISOR) or (_uncut(o) and not full[k][1] % DIVISOR)):
            lost.append(f"{k}: {full[k][0]}x{full[k][1]} -> {i}x{o}")
    return lost


def module_kinds(cls, config: dict[str, Any]) -> set[str]:
    """Every module path of `cls` built from `config` on the meta device, list indices written `*`
    (`transformer_blocks.*.img_mlp.shared_expert`): the kinds of module the config builds."""
    import torch

    with torch.device("meta"):
        model = build(cls, config)
    return {kind_of(name) for name, _ in model.named_modules()}


MAX_TINY_LAYERS = 8  # a block kind the full config builds only from some index on is looked for up to this many


def _every_kind(cls, config: dict[str, Any], tiny: Tiny, widths: str, head: int) -> Tiny:
    """`tiny` with its layer counts raised (up to the original's, at most MAX_TINY_LAYERS, keeping an even count
    even) until it builds every
    kind of module the full config does: a list whose blocks differ by index (NucleusMoE's first three and last
    blocks dense, the rest mixture-of-experts) shrunk to 2 would build one kind only, and no proof would reach the
    other (a TP plan's keys for it would match no module). Said in `notes`; what stays missing, too."""
    shrunk = {k: v for k, (v, _) in tiny.changes.items() if is_layers(k) and isinstance(v, int) and v > 0}
    if not shrunk:
        return tiny
    # the kinds the most layers this looks for would build: tiny widths, so cheap to build (the full config's
    # dozens of wide layers on the meta device are not)
    most = {k: min(v, MAX_TINY_LAYERS) for k, v in shrunk.items()}
    try:
        full = module_kinds(cls, {**tiny.config, **most})
    except Exception:  # noqa: BLE001 - that count does not build: nothing to compare
        return tiny
    missing = full - module_kinds(cls, tiny.config)
    if not missing:
        return tiny
    grown = tiny
    while missing:
        # one more block pair at a time where the original count is even: a model that pairs its blocks (U-Net
        # style skips from the first half into the second) breaks on an odd count
        more = {k: min(v, grown.config[k] + (2 if v % 2 == 0 else 1), MAX_TINY_LAYERS) for k, v in shrunk.items()}
        if all(more[k] == grown.config[k] for k in more):
            break
        config_more = {**config, **more}
        grown = tiny_config(config_more, widths, head)
        grown.config.update(more)
        grown.changes.update({k: (config.get(k), v) for k, v in more.items() if config.get(k) != v})
        try:
            missing = full - module_kinds(cls, grown.config)
        except Exception:  # noqa: BLE001 - a count the model refuses: keep the last that built
            break
    if grown is tiny:
        tiny.notes.append(f"the tiny config builds no {min(missing)} (the full config does): not proved")
        return tiny
    grown.notes = [*tiny.notes, "layer counts " + ", ".join(f"{k} {grown.config[k]}" for k in shrunk)
                   + " so that every kind of block the full config builds is built"
                   + (f"; still missing {min(missing)}" if missing else "")]
    return grown


def _keep_divisible(cls, config: dict[str, Any], tiny: Tiny, widths: str, head: int, max_params: int) -> Tiny:
    """`tiny`, or the first config with a larger head dim whose Linear widths keep every divisibility by DIVISOR
    the full config's have: a width a proof cannot cut evenly at tiny size (and can at full size) would fail the
    proof for the fixture's sake, not the integration's. Said in `notes`; a loss no head dim mends, too."""
    lost = lost_divisibility(cls, config, tiny)
    tiny.head = head
    if not lost:
        return tiny
    for bigger in (3 * head // 2, 2 * head, 3 * head, 4 * head):
        other = tiny_config(config, widths, bigger)
        try:
            other.parameters, empty = _on_meta(cls, other.config)
        except Exception:  # noqa: BLE001 - the model refuses that width
            continue
        if empty is None and other.parameters <= max_params and not lost_divisibility(cls, config, other):
            other.head = bigger
            other.notes = [*tiny.notes, f"a head dim of {bigger}: with {head}, {lost[0]} would not divide by "
                                        f"{DIVISOR} as the full config's does"]
            return other
    tiny.notes.append(f"{lost[0]} does not divide by {DIVISOR} as the full config's does, at any tiny head dim "
                      "tried: a parallel proof may fail on that width for the fixture's sake")
    return tiny


def derive(cls, config: dict[str, Any], max_params: int = MAX_PARAMS, widths: str = "tiny") -> Tiny:
    """The tiny config, checked by building it on the meta device; `error` says what failed. A layer the tiny
    width makes 0 wide (a width rounded down to a multiple of 128, NucleusMoE's FFN) proves nothing and cannot
    be sharded: the head dim doubles until none is (said in `notes`)."""
    notes: list[str] = []
    for head in (HEAD_DIM, 2 * HEAD_DIM, 4 * HEAD_DIM):
        tiny = tiny_config(config, widths, head)
        try:
            tiny.parameters, empty = _on_meta(cls, tiny.config)
        except Exception as exc:  # the model's own constructor rejected the shrunk config
            tiny.error = (f"building {cls.__name__} from the tiny config failed: {type(exc).__name__}: "
                          f"{exc}").splitlines()[0]
            return tiny
        if empty is None or head == 4 * HEAD_DIM:
            break
        notes.append(f"with a head dim of {head}, `{empty}` is 0 wide (a width rounded down to a multiple): the "
                     f"tiny config doubles the head dim")
    tiny.notes = notes
    if empty is None:
        tiny = _keep_divisible(cls, config, tiny, widths, head, max_params)
        tiny = _every_kind(cls, config, tiny, widths, tiny.head)
        tiny.parameters, empty = _on_meta(cls, tiny.config)
    if empty is not None:
        tiny.error = f"`{empty}` is 0 wide even with a head dim of {4 * HEAD_DIM}"
    elif tiny.parameters > max_params:
        tiny.error = f"the tiny config still has {tiny.parameters:,} parameters (budget {max_params:,})"
    return tiny
