"""TE-P on a tiny text encoder: its config shrunk (every nested model config too, heads kept even so TP 2 divides
them), seeded weights, token ids in; the 1-process run, then the planner cache-dit finds for the class (the plugin's
or its own) over the job's gloo processes, and every hidden state compared. The report says which planner answered,
which parameters were sharded and their local shapes (rank 0), and the first module whose output parts."""

from __future__ import annotations

import time
from typing import Any

from . import common

TOKENS = 12  # token ids per prompt
MAX_SHARDS = 24  # sharded parameters listed in the report (one per kind: list indices aside)


VOCAB = 1024
POSITIONS = 512
_LAYERS = ("num_hidden_layers", "num_layers", "num_decoder_layers", "depth")
_WIDTH = ("hidden_size", "d_model")
_FF = ("intermediate_size", "d_ff")
_Q_HEADS = ("num_attention_heads", "num_heads")


def shrink(config: dict[str, Any], outer: dict[str, int] | None = None) -> tuple[dict[str, Any], dict[str, list]]:
    """A tiny copy of a transformers config; (config, {dotted key: [before, after]}).

    Two layers; 2 KV heads and the query heads at the real GQA ratio up to 2 (so TP 2 divides both); each head
    as wide as the real one (what a head's width fixes, RoPE sections a model reads with defaults of its own,
    stays true); the width that many heads make and twice it for the feed-forward; a 1024-token vocabulary
    (token ids beyond it moved inside); nested model configs (`text_config`, `vision_config`, ...) the same way,
    a width of theirs equal to the outer model's width kept equal to it."""
    out = {k: v for k, v in config.items() if k not in ("torch_dtype", "dtype")}  # the proof runs in float32
    changes: dict[str, list] = {}

    def put(key: str, value: Any) -> None:
        if out.get(key) != value:
            changes[key] = [config.get(key), value]
        out[key] = value

    def ints(keys) -> dict[str, int]:
        return {k: config[k] for k in keys if isinstance(config.get(k), int) and not isinstance(config[k], bool)}

    layers = ints(_LAYERS)
    for k, v in layers.items():
        put(k, min(v, 2))
    q, kv = ints(_Q_HEADS), ints(("num_key_value_heads",))
    head = _head_dim(config)
    width = next(iter(ints(_WIDTH).items()), None)
    if q:
        q_key, q_real = next(iter(q.items()))
        kv_real = kv.get("num_key_value_heads", q_real)
        ratio = max(1, min(2, q_real // max(1, kv_real)))
        put(q_key, 2 * ratio)
        if kv:
            put("num_key_value_heads", 2)
        if width and head:
            put(width[0], 2 * ratio * head)
    for k, v in ints(_FF).items():
        base = out[width[0]] if width else v
        put(k, min(v, 2 * base))
    if isinstance(config.get("vocab_size"), int) and config["vocab_size"] > VOCAB:
        put("vocab_size", VOCAB)
        for k, v in config.items():  # ids the model looks up (padding, special tokens): inside the vocabulary
            if (k.endswith("_token_id") or k.endswith("_token_index")) and isinstance(v, int) and v >= VOCAB:
                put(k, VOCAB - 1 - len([c for c in changes if c.endswith(("_token_id", "_token_index"))]))
    if isinstance(config.get("max_position_embeddings"), int) and config["max_position_embeddings"] > POSITIONS:
        put("max_position_embeddings", POSITIONS)
    real_layers = max(layers.values(), default=None)
    for k, v in config.items():
        if not isinstance(v, list) or not real_layers:
            continue
        if len(v) == real_layers and k.startswith("layer_"):  # one entry per layer (`layer_types`)
            put(k, v[:min(real_layers, 2)])
        elif v and all(isinstance(x, int) and not isinstance(x, bool) for x in v) and max(v) >= 2 and (
                "index" in k or "block" in k):  # layer indices (`fullatt_block_indexes`): those two layers have
            put(k, sorted({x for x in v if x < 2}) or [0])
    for k, v in config.items():  # per-layer settings keyed by layer index (Gemma 4's `per_layer_config`)
        if real_layers and isinstance(v, dict) and v and not _is_model_config(v) and all(
                str(x).isdigit() for x in v):
            put(k, {x: y for x, y in v.items() if int(x) < 2})
    if outer and width:
        for k, v in ints(config).items():  # a nested config's output width sized to the outer model's
            if k != width[0] and v == outer["real"]:
                put(k, outer["tiny"])
    inner_outer = {"real": width[1], "tiny": out[width[0]]} if width else None
    for key, value in config.items():
        if isinstance(value, dict) and _is_model_config(value):
            inner, more = shrink(value, inner_outer)
            out[key] = inner
            changes.update({f"{key}.{k}": v for k, v in more.items()})
    return out, changes


def _head_dim(config: dict[str, Any]) -> int | None:
    for key in ("head_dim", "d_kv", "attention_head_dim"):
        if isinstance(config.get(key), int) and config[key] > 0:
            return config[key]
    width = config.get("hidden_size", config.get("d_model"))
    heads = config.get("num_attention_heads", config.get("num_heads"))
    if isinstance(width, int) and isinstance(heads, int) and heads > 0 and width % heads == 0:
        return width // heads
    return None


def _is_model_config(value: dict) -> bool:
    return any(k in value for k in ("hidden_size", "d_model", "num_attention_heads", "num_heads"))


def _composed(cfg_cls) -> tuple[str, dict] | None:
    """("Composite.attr", the config) where a configuration class of the same transformers module holds one of
    `cfg_cls` among its defaults: the sub-config as the whole model's config fills it in (T5Gemma2Config sets its
    encoder's `dropout_rate`, which T5Gemma2EncoderConfig's own defaults leave out)."""
    import inspect
    import sys

    module = sys.modules.get(cfg_cls.__module__)
    for name, other in sorted(vars(module).items()) if module else ():
        if not inspect.isclass(other) or other is cfg_cls or not hasattr(other, "to_dict") or \
                other.__module__ != cfg_cls.__module__:
            continue
        try:
            held = vars(other())
        except Exception:  # a config class whose defaults do not construct
            continue
        for attr, value in held.items():
            if isinstance(value, cfg_cls):
                return f"{name}.{attr}", value.to_dict()
    return None


def _sub_config(cls, exc: Exception) -> tuple[str, type, dict, str] | None:
    """(key, config class, its defaults as the composite fills them, why) where building `cls` from its config class
    failed on a field that class lacks (`AttributeError: 'T5GemmaConfig' object has no attribute 'hidden_size'`) and
    one of its `sub_configs` has it: the one whose key the class's name holds (`encoder` in T5GemmaEncoder), else
    the only one that has it."""
    cfg_cls = cls.config_class
    field = getattr(exc, "name", None)
    if not isinstance(exc, AttributeError) or not isinstance(field, str) or not isinstance(
            getattr(cfg_cls, "sub_configs", None), dict):
        return None
    try:
        whole = cfg_cls()
    except Exception:  # defaults that do not construct
        return None
    held = [(k, getattr(whole, k, None)) for k in cfg_cls.sub_configs]
    held = [(k, v) for k, v in held if hasattr(v, "to_dict") and hasattr(v, field)]
    named = [(k, v) for k, v in held if k.lower() in cls.__name__.lower()]
    chosen = named[0] if len(named) == 1 else held[0] if len(held) == 1 else None
    if chosen is None:
        return None
    key, value = chosen
    why = (f"class defaults of {cfg_cls.__name__}'s `{key}` ({type(value).__name__}): {cls.__name__} reads "
           f"`{field}`, which {cfg_cls.__name__} lacks")
    return key, type(value), value.to_dict(), why


def _refusals(cls, config) -> dict[str, list]:
    """{flag: [value, the value the constructor accepts, why]} for each `if config.<flag>: raise ...` (or
    `if not config.<flag>: ...`) in `cls.__init__` that the config's boolean `flag` trips: T5GemmaEncoderModel
    refuses the `is_encoder_decoder=True` its config class defaults to (a real encoder-only checkpoint says False).
    Read from the constructor's source with libcst; only boolean flags, and only a test that is the flag alone."""
    import inspect
    import textwrap

    import libcst as cst

    from integrate.syntax import find_all

    try:
        init = cst.parse_module(textwrap.dedent(inspect.getsource(cls.__init__)))
    except (OSError, TypeError, cst.ParserSyntaxError):
        return {}
    found: dict[str, list] = {}
    for branch in find_all(init.body[0], cst.If):
        if not any(isinstance(s, cst.SimpleStatementLine) and any(isinstance(x, cst.Raise) for x in s.body)
                   for s in branch.body.body):
            continue
        test, negated = branch.test, False
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, negated = test.expression, True
        if not (isinstance(test, cst.Attribute) and isinstance(test.value, cst.Name) and test.value.value == "config"):
            continue
        flag = test.attr.value
        value = getattr(config, flag, None)
        if isinstance(value, bool) and value != negated:
            found[flag] = [value, not value, f"{cls.__name__}.__init__ raises when `{init.code_for_node(branch.test)}`"]
    return found


def _config(cls, given: dict | None, raw: dict | None = None, cfg_cls: type | None = None):
    """(the tiny config object, its changes) from `given`, else `raw`, else `cfg_cls`'s defaults (the class's own
    config class unless another is named)."""
    cfg_cls = cfg_cls or cls.config_class
    raw = raw or (dict(given) if given else cfg_cls().to_dict())
    tiny, changes = shrink(raw)
    config = cfg_cls.from_dict(tiny)
    if hasattr(config, "_attn_implementation"):
        config._attn_implementation = "eager"
    return config, changes


def _inputs(model, config) -> dict:
    import torch

    vocab = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", 100)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, min(int(vocab), 1000), (1, TOKENS), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _hidden(out) -> list:
    """The hidden states a pipeline reads (every layer's, where the encoder returns them), else all tensors."""
    states = getattr(out, "hidden_states", None)
    if states:
        return [common.plain(t) for t in states]
    return [common.plain(t) for t in common.tensors(out)]


def _shards(model) -> tuple[int, int, list[dict]]:
    """(parameters, sharded, one sharded parameter of each kind with its full and local shape)."""
    from integrate.verify.tiny import kind_of

    total, sharded, seen, listed = 0, 0, set(), []
    for name, p in model.named_parameters():
        total += 1
        local = getattr(p, "to_local", None)
        if local is None:
            continue
        shape_local = tuple(local().shape)
        if shape_local == tuple(p.shape):
            continue
        sharded += 1
        kind = kind_of(name)
        if kind not in seen and len(listed) < MAX_SHARDS:
            seen.add(kind)
            listed.append({"name": name, "full": list(p.shape), "local": list(shape_local),
                           "placements": [str(x) for x in p.placements]})
    return total, sharded, listed


def run(job: dict) -> None:
    import torch
    from integrate.verify.compare import figures

    started = time.monotonic()
    rank, world = common.init()
    report: dict[str, Any] = {"rank": rank, "world": world, "component": job["component"], "cls": job["cls"]}
    stage = "build the tiny text encoder"
    try:
        cls = common.load_class(job["library"], job["cls"], job.get("module"))
        config, changes = _config(cls, job.get("config"))
        report["config_from"] = "model folder" if job.get("config") else "class defaults"
        try:
            model = cls(config).eval()
        except Exception as exc:
            refused = {} if job.get("config") else _refusals(cls, config)
            composed = None if job.get("config") or refused else _composed(cls.config_class)
            part = None if job.get("config") or refused or composed else _sub_config(cls, exc)
            if refused:
                # the class defaults set a flag the constructor refuses (a real config of this class clears it)
                for flag, (_, accepted, _) in refused.items():
                    setattr(config, flag, accepted)
                changes.update(refused)
                report["config_from"] = "class defaults, with the flags the constructor refuses cleared"
            elif composed is not None:
                # the class's own defaults leave out what its composite model's config fills in: built from that
                config, changes = _config(cls, None, composed[1])
                report["config_from"] = f"class defaults, as {composed[0]} sets them"
            elif part is not None:
                # the class takes one part of its config class, a composite (T5GemmaEncoder: T5GemmaConfig's
                # `encoder`): built from that part as the composite's defaults fill it in
                _, sub_cls, raw, why = part
                config, changes = _config(cls, None, raw, sub_cls)
                report["config_from"] = why
            else:
                raise
            model = cls(config).eval()
        report["changes"] = changes
        common.seeded(model)
        inputs = _inputs(model, config)
        outputs = common.Outputs(model)
        stage = "run the plain text encoder"
        with torch.no_grad():
            ref = _hidden(model(**inputs, output_hidden_states=True))
        ref_modules = outputs.take()
        stage = "import the plugin"
        common.import_plugin(job)
        report["mesh_on_cpu"] = common.cpu_mesh()
        stage = "apply the TE-P planner"
        from cache_dit import ParallelismConfig
        from cache_dit.distributed.text_encoders import parallelize_text_encoder
        from cache_dit.distributed.text_encoders.dispatch import _ensure_text_encoder_tp_planners_activated
        from cache_dit.distributed.text_encoders.register import TextEncoderTensorParallelismPlannerRegister

        _ensure_text_encoder_tp_planners_activated()
        planner = TextEncoderTensorParallelismPlannerRegister.get_planner(model)
        report["planner"] = f"{planner.__module__}.{planner.__qualname__}"
        model = parallelize_text_encoder(model, ParallelismConfig(tp_size=world))
        report["parameters"], report["sharded"], report["shards"] = _shards(model)
        stage = "run the text encoder across ranks"
        with torch.no_grad():
            got = _hidden(model(**inputs, output_hidden_states=True))
        got_modules = outputs.take()
        outputs.close()
        if len(got) != len(ref) or any(a.shape != b.shape for a, b in zip(ref, got)):
            report["outputs"] = {"ref": [list(t.shape) for t in ref], "got": [list(t.shape) for t in got]}
            raise ValueError("the encoder returned other hidden states across ranks than in one process")
        figs = [figures(a.numpy(), b.numpy()) for a, b in zip(ref, got)]
        worst = next((f for f in figs if not f.ok), max(figs, key=lambda f: f.max_abs))
        report["figures"] = worst.as_dict()
        report["hidden_states"] = len(ref)
        if not worst.ok:
            report["first_divergence"] = common.first_divergence(ref_modules, got_modules)
    except Exception as exc:  # located and reported, never a crash of verify
        report["error"] = common.error(stage, exc)
    report["seconds"] = round(time.monotonic() - started, 2)
    common.finish(job["out"], rank, report)
