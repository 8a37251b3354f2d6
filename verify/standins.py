"""Stand-in encoders, tokenizers and image processors for a pipeline built around a tiny transformer (runs in a
verify worker only).

A pipeline that cannot take prompt embeddings directly, or that encodes an input image before it calls the
transformer, needs its encoders. Their weights cannot be downloaded, and their real sizes would dwarf the
tiny transformer, so each is built from its own class with a small config and random weights:

- a `transformers` model (text or vision encoder): its config class's defaults, narrowed to the width the
  tiny transformer takes, a few layers, two heads, a small vocabulary; nested configs (`text_config`,
  `vision_config`) alike;
- a tokenizer: a word-level fast tokenizer over a small vocabulary, with a chat template that joins the
  messages' text (every prompt word it does not know is `<unk>`, which is all an encoder with random
  weights needs);
- an image processor: its class with default settings (no files needed);
- a multimodal processor, only for a pipeline whose constructor uses one (it is otherwise left out, as the
  captured call passes embeddings): a text-only object holding the stand-in tokenizer, with the calls pipelines
  make of a processor at construction (`apply_chat_template`, `.tokenizer`, tokenizing text); handed images, it
  refuses;
- a safety checker, for a pipeline that refuses to be built without one: a module that lets every prompt
  and every picture through (the captured run generates nothing to check: it stops at the transformer).

The inputs these make have the shapes the real ones have, not their values; the fixture's notes say which
components stood in.
"""

from __future__ import annotations

import inspect
from typing import Any

LAYERS = 4  # a pipeline may tap an encoder's hidden states a few layers from the top
VOCAB = 256
MAX_PARAMS = 20_000_000  # as for the tiny transformer
WIDTH = 32  # for an encoder whose output width the tiny transformer's inputs do not say
GENERIC_TEXT_ENCODER = "T5EncoderModel"  # for a text encoder typed only `PreTrainedModel`
_SPECIAL = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}
_CHAT = ("{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
         "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }} {% endif %}{% endfor %}"
         "{% endif %}{% endfor %}")

_WIDTH = ("hidden_size", "d_model", "n_embd", "embed_dim", "projection_dim", "text_embed_dim")
_LAYERS = ("num_hidden_layers", "num_layers", "n_layer", "num_decoder_layers", "encoder_layers", "decoder_layers")
_HEADS = ("num_attention_heads", "num_heads", "n_head", "encoder_attention_heads", "decoder_attention_heads")
_KV_HEADS = ("num_key_value_heads",)
_HEAD_DIM = ("head_dim", "d_kv")
_FF = ("intermediate_size", "d_ff", "ffn_dim", "n_inner", "encoder_ffn_dim", "decoder_ffn_dim")


class NoStandIn(Exception):
    pass


def is_transformers_model(cls: Any) -> bool:
    return isinstance(cls, type) and any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers")
                                         for c in cls.__mro__[1:])


def is_tokenizer(cls: Any, name: str) -> bool:
    """A text tokenizer: by its class where one is named (AceStep's `audio_tokenizer` is a model), else by
    the component's name."""
    if isinstance(cls, type):
        return cls.__name__ == "AutoTokenizer" or any(  # AutoTokenizer: a factory of tokenizers
            c.__name__ in ("PreTrainedTokenizerBase", "PreTrainedTokenizer", "PreTrainedTokenizerFast",
                           "TokenizersBackend", "PythonBackend") for c in cls.__mro__)
    return "tokenizer" in name


def is_image_processor(cls: Any) -> bool:
    return isinstance(cls, type) and any(c.__name__ in ("BaseImageProcessor", "ImageProcessingMixin")
                                         for c in cls.__mro__)


def tokenizer():
    """A word-level fast tokenizer: the special tokens, then placeholder words; any other word is `<unk>`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(_SPECIAL.values()) + [f"t{i}" for i in range(VOCAB - len(_SPECIAL))]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=_SPECIAL["unk"]))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=512,
                                  **{f"{k}_token": v for k, v in _SPECIAL.items()})
    tok.chat_template = _CHAT
    return tok


def _narrow(config, width: int) -> dict[str, Any]:
    """The config's fields, narrowed: `width` wide, LAYERS layers, two heads, a small vocabulary."""
    from transformers import PretrainedConfig

    data = config.to_dict()
    out: dict[str, Any] = {}
    layers = next((data[k] for k in _LAYERS if isinstance(data.get(k), int)), None)
    for key, value in data.items():
        if isinstance(value, bool) or key.startswith("_"):
            out[key] = value
            continue
        sub = getattr(config, key, None)
        if isinstance(sub, PretrainedConfig):
            out[key] = type(sub)(**_narrow(sub, width))
        elif key in _WIDTH and isinstance(value, int):
            out[key] = width
        elif key in _LAYERS and isinstance(value, int):
            out[key] = min(value, LAYERS)
        elif key in _HEADS and isinstance(value, int):
            out[key] = 2
        elif key in _KV_HEADS and isinstance(value, int):
            out[key] = 1 if value < next((data[k] for k in _HEADS if isinstance(data.get(k), int)), value) else 2
        elif key in _HEAD_DIM and isinstance(value, int):
            out[key] = width // 2
        elif key in _FF and isinstance(value, int):
            out[key] = 2 * width
        elif key == "vocab_size" and isinstance(value, int):
            out[key] = VOCAB
        elif key.endswith("_token_id") and isinstance(value, int):
            out[key] = {"pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3}.get(key, 1)
        elif (isinstance(value, list) and layers and len(value) == layers
              and key not in ("architectures",)):  # one entry per layer (`layer_types`, `no_rope_layers`)
            out[key] = value[:LAYERS]
        else:
            out[key] = value
    return out


def encoder(cls, width: int):
    """`cls` (a `transformers` model class) built from its config class's defaults, narrowed to `width`, on the
    CPU with random weights."""
    import torch

    config_class = getattr(cls, "config_class", None)
    if config_class is None or inspect.isabstract(config_class) or config_class.__name__ == "PretrainedConfig":
        raise NoStandIn(f"{cls.__name__} names no config class to build it from")
    try:
        config = config_class(**_narrow(config_class(), width))
        with torch.device("meta"):
            size = sum(p.numel() for p in cls(config).parameters())
        if size > MAX_PARAMS:
            raise NoStandIn(f"{cls.__name__} {width} wide would have {size:,} parameters (budget {MAX_PARAMS:,})")
        model = cls(config)
    except NoStandIn:
        raise
    except Exception as exc:  # noqa: BLE001 - the encoder's own constructor on a narrowed config
        raise NoStandIn(f"{cls.__name__} from a narrowed {config_class.__name__} failed: {type(exc).__name__}: "
                        f"{(str(exc).splitlines() or [''])[0][:160]}") from None
    return model.eval()


def is_processor(cls: Any, name: str) -> bool:
    """A multimodal processor (`transformers`' ProcessorMixin: a tokenizer with an image or audio processor)."""
    if isinstance(cls, type):
        return any(c.__name__ == "ProcessorMixin" for c in cls.__mro__)
    return name == "processor" or name.endswith("_processor") and "image" not in name


class TextOnlyProcessor:
    """Stands in for a multimodal processor a pipeline uses while it is built (QwenImage21 reads its system
    prompt's length through `apply_chat_template` in `__init__`): text goes through the stand-in tokenizer, images
    are refused, since the captured call passes embeddings and never reaches the processor for them."""

    def __init__(self, of: str) -> None:
        self.of = of
        self.tokenizer = tokenizer()
        self.chat_template = self.tokenizer.chat_template

    def apply_chat_template(self, conversation, tokenize: bool = False, return_dict: bool = False, **kwargs):
        """As a processor's: the rendered text, or its tokens as a batch of one (a processor tokenizes through
        its own call, which always batches)."""
        text = self.tokenizer.apply_chat_template(conversation, tokenize=False)
        if not tokenize:
            return text
        out = self(text=[text], return_tensors=kwargs.get("return_tensors"))
        return out if return_dict else out["input_ids"]

    def __call__(self, text=None, images=None, videos=None, audio=None, **kwargs):
        if images is not None or videos is not None or audio is not None:
            raise NoStandIn(f"the text-only stand-in for {self.of} takes no images, videos or audio")
        kwargs = {k: v for k, v in kwargs.items() if k in ("padding", "truncation", "max_length", "return_tensors")}
        return self.tokenizer(text, **kwargs)

    def batch_decode(self, *args, **kwargs):
        return self.tokenizer.batch_decode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        return self.tokenizer.decode(*args, **kwargs)


def image_processor(cls):
    try:
        return cls()
    except Exception as exc:  # noqa: BLE001 - the processor's own constructor with its defaults
        raise NoStandIn(f"{cls.__name__}() failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}") \
            from None


def narrow_channels(config: dict[str, Any]) -> dict[str, Any]:
    """A pipeline component's config (a VAE, an upscaler) with its channel widths cut: every entry of a
    `*block_out_channels` list, and a `base_dim`, above 32 divided by 16 (32 at least: group norms of 32
    groups still divide it). What the transformer sees stays as it is: the latent channels, the scale
    factors, the layer structure."""
    out = dict(config)
    for key, value in config.items():
        if key.endswith("block_out_channels") and isinstance(value, (list, tuple)) and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            out[key] = [v if v <= 32 else max(32, v // 16) for v in value]
        elif key in ("base_dim", "decoder_base_dim") and isinstance(value, int) and value > 32:
            out[key] = 32
    return out


def safety_checker():
    """A safety checker that lets everything through, with the methods pipelines call on one."""
    import torch

    class PassThroughSafetyChecker(torch.nn.Module):
        def check_text_safety(self, prompt) -> bool:
            return True

        def check_video_safety(self, frames):
            return frames

        def forward(self, images, *args, **kwargs):
            return images, [False] * (len(images) if hasattr(images, "__len__") else 1)

    return PassThroughSafetyChecker()
