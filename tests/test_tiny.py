"""Tiny configs keep the structure the proofs check and are small, sized on the meta device."""

from __future__ import annotations

import inspect
import itertools
import json

import pytest
from conftest import EXAMPLE
from integrate.verify.tiny import HEAD_DIM, MAX_PARAMS, derive

MODELS = ["FluxTransformer2DModel", "Flux2Transformer2DModel", "WanTransformer3DModel", "QwenImageTransformer2DModel",
          "HunyuanVideoTransformer3DModel", "Lumina2Transformer2DModel", "ZImageTransformer2DModel",
          "HeliosTransformer3DModel", "BriaFiboTransformer2DModel", "NucleusMoEImageTransformer2DModel",
          "CogVideoXTransformer3DModel", "LTX2VideoTransformer3DModel", "ChromaTransformer2DModel"]


def _defaults(cls) -> dict:
    return {k: v.default for k, v in inspect.signature(cls.__init__).parameters.items()
            if k != "self" and v.default is not inspect.Parameter.empty}


def _check(cls, original: dict):
    tiny = derive(cls, original)
    assert tiny.error is None, tiny.error
    assert tiny.parameters < MAX_PARAMS
    cfg = tiny.config
    layers = [k for k in original if k in tiny.changes and ("layers" in k or k.startswith("depth"))
              and isinstance(cfg[k], int)]  # counts, not lists of block indices
    for k in layers:
        assert cfg[k] >= 2
    for a, b in itertools.combinations(layers, 2):  # order of the list lengths survives
        assert (original[a] < original[b]) == (cfg[a] < cfg[b])
    heads = {k: v for k, v in cfg.items() if k.endswith("heads") and isinstance(v, int)}
    assert all(v % 2 == 0 for v in heads.values()), heads
    kv = [k for k in heads if "kv" in k]
    for k in kv:  # grouped-query ratio kept
        q = next(h for h in heads if h not in kv)
        assert original[q] // original[k] == cfg[q] // cfg[k]
    q_heads = max((v for k, v in heads.items() if k not in kv), default=None)
    head = next((cfg[k] for k in ("attention_head_dim", "head_dim", "d_kv") if isinstance(cfg.get(k), int)), None) or next(
        (cfg[k] // q_heads for k in ("hidden_size", "dim", "inner_dim") if isinstance(cfg.get(k), int) and q_heads),
        None)
    widened = any("0 wide" in n for n in tiny.notes)  # a layer the tiny width rounds to nothing: head dim doubled
    base = head // 2 if widened else head
    assert base in (HEAD_DIM, HEAD_DIM * 3 // 2, HEAD_DIM * 2), head  # 24 where the real head dim divides by 3
    assert widened or head in (HEAD_DIM, HEAD_DIM * 3 // 2), head
    for k, v in tiny.changes.items():
        if isinstance(v[0], (list, tuple)) and "layer" not in k and "block" not in k:
            # RoPE axes: even, summing to the head dim (or half of it, for sections of a cos / sin half)
            assert sum(v[1]) in (head, head // 2) and all(x % 2 == 0 for x in v[1])
    return tiny


def test_block_indices_and_intervals_stay_within_the_shrunk_lists():
    """Config fields that point into a block list (`vace_layers`: which blocks take the control input;
    `inject_face_latents_blocks`: every n-th block) must still point at blocks the tiny model has."""
    import diffusers

    vace = _check(diffusers.WanVACETransformer3DModel, _defaults(diffusers.WanVACETransformer3DModel))
    assert all(0 <= i < vace.config["num_layers"] for i in vace.config["vace_layers"]) and vace.config["vace_layers"]
    animate = _check(diffusers.WanAnimateTransformer3DModel, _defaults(diffusers.WanAnimateTransformer3DModel))
    every = animate.config["inject_face_latents_blocks"]
    assert animate.config["num_layers"] // every >= 1  # at least one face adapter block


@pytest.mark.parametrize("name", MODELS)
def test_tiny_configs_of_diffusers_models(name):
    import diffusers

    cls = getattr(diffusers, name)
    _check(cls, _defaults(cls))


def test_motif_video_from_its_config_json():
    import diffusers

    config = json.loads((EXAMPLE / "transformer" / "config.json").read_text())
    tiny = _check(diffusers.MotifVideoTransformer3DModel, config)
    # the decoder tail stays shorter than the single-stream list it is cut from, leaving >= 2 encoder blocks
    assert tiny.config["num_single_layers"] - tiny.config["num_decoder_layers"] >= 2
    assert tiny.parameters < 1_000_000


def test_t5_style_names_feed_forward_widths_and_large_vocabularies_shrink_too():
    """`d_model` / `d_kv` / `d_ff` (T5FilmDecoder), `intermediate_size` and a 151,936-token vocabulary
    (Cosmos3Omni) are widths like any other: both build within the budget."""
    import diffusers

    t5 = _check(diffusers.T5FilmDecoder, _defaults(diffusers.T5FilmDecoder))
    assert t5.config["d_kv"] == HEAD_DIM and t5.config["d_model"] == 2 * HEAD_DIM and t5.config["d_ff"] < 2048
    cosmos = _check(diffusers.Cosmos3OmniTransformer, _defaults(diffusers.Cosmos3OmniTransformer))
    assert cosmos.config["intermediate_size"] < 12288 and cosmos.config["vocab_size"] == 1024


def test_a_vocabulary_a_token_id_points_beyond_is_kept():
    from integrate.verify.tiny import tiny_config

    cut = tiny_config({"hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 50000})
    kept = tiny_config({"hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 50000, "image_token_id": 32000})
    assert cut.config["vocab_size"] == 1024 and kept.config["vocab_size"] == 50000


def test_input_widths_are_made_tiny_scaled_together_or_kept_real():
    """BriaFibo's pipeline joins two text-encoder layers into one embedding (`joint_attention_dim` is twice
    `text_encoder_dim`): "scaled" keeps that ratio. StableAudio3's pipeline builds a duration embedder 768
    wide: "real" keeps `global_cond_dim`, while the model's own width (`embed_dim`) still shrinks."""
    import diffusers

    from integrate.verify.tiny import WIDE

    fibo = _defaults(diffusers.BriaFiboTransformer2DModel)
    tiny = derive(diffusers.BriaFiboTransformer2DModel, fibo)
    assert tiny.config["joint_attention_dim"] == tiny.config["text_encoder_dim"] == WIDE
    scaled = derive(diffusers.BriaFiboTransformer2DModel, fibo, widths="scaled")
    assert scaled.error is None
    assert scaled.config["joint_attention_dim"] == 2 * scaled.config["text_encoder_dim"] < 2048
    audio = _defaults(diffusers.StableAudio3DiTModel)
    real = derive(diffusers.StableAudio3DiTModel, audio, widths="real")
    assert real.error is None and real.config["global_cond_dim"] == audio["global_cond_dim"] == 768
    assert real.config["embed_dim"] < audio["embed_dim"] and real.parameters < MAX_PARAMS


def test_a_head_dim_that_divides_by_three_keeps_that_factor():
    """Allegro's 3-D RoPE splits each head in three (each part even); PixArt embeds the resolution in a third
    of its width. A tiny head dim of 16 breaks both; 24 keeps the factor the real 96 and 72 have."""
    from integrate.verify.tiny import tiny_config

    three = tiny_config({"num_attention_heads": 16, "attention_head_dim": 72})
    plain = tiny_config({"num_attention_heads": 24, "attention_head_dim": 128})
    assert three.config["attention_head_dim"] == 24 and (three.config["attention_head_dim"] // 3) % 2 == 0
    assert plain.config["attention_head_dim"] == HEAD_DIM


def test_a_width_equal_to_the_models_own_stays_equal_to_it():
    """PixArt's `cross_attention_dim` (1152) is its inner width (16 heads x 72): without a caption projection
    the blocks take the text at that width, so the tiny one must be the tiny inner width, not a text width."""
    import diffusers

    tiny = derive(diffusers.PixArtTransformer2DModel, _defaults(diffusers.PixArtTransformer2DModel))
    c = tiny.config
    assert tiny.error is None and c["cross_attention_dim"] == c["num_attention_heads"] * c["attention_head_dim"]


def test_a_text_length_the_model_is_built_for_is_the_tiny_text_length():
    """CogVideoX builds its positional table for `max_text_seq_length` text tokens plus the image; HunyuanDiT
    learns a padding per token of `text_len` + `text_len_t5`: the fixture's text is TEXT_TOKENS long, so those
    fields are too. A gist length that only bounds another (`gist_max_text_len`) is not one of them."""
    from integrate.verify.tiny import TEXT_TOKENS, tiny_config

    tiny = tiny_config({"max_text_seq_length": 226, "text_len": 77, "text_len_t5": 256, "gist_max_text_len": 512})
    assert tiny.config["max_text_seq_length"] == tiny.config["text_len"] == tiny.config["text_len_t5"] == TEXT_TOKENS
    assert tiny.config["gist_max_text_len"] == 512


def test_fields_the_class_defaults_leave_unset_get_small_values_of_their_kind():
    """EasyAnimate's defaults leave `in_channels`, `out_channels`, `patch_size` and `text_embed_dim_t5` None
    (its real configs give them); LuminaNext leaves `num_kv_heads` None. Filled, both build; a field that is
    None by design and not a size is left alone."""
    import diffusers

    from integrate.verify.tiny import WIDE, fill_unset

    ea = _defaults(diffusers.EasyAnimateTransformer3DModel)
    filled = fill_unset(ea)
    assert filled == {"in_channels": 4, "out_channels": 4, "patch_size": 2, "text_embed_dim_t5": WIDE}
    assert derive(diffusers.EasyAnimateTransformer3DModel, {**ea, **filled}).error is None
    assert derive(diffusers.EasyAnimateTransformer3DModel, ea).error is not None
    lumina = _defaults(diffusers.LuminaNextDiT2DModel)
    assert fill_unset(lumina) == {"num_kv_heads": lumina["num_attention_heads"]}
    assert derive(diffusers.LuminaNextDiT2DModel, {**lumina, **fill_unset(lumina)}).error is None


def test_filled_input_channels_divide_by_the_group_norms_groups():
    """TransformerTemporalModel and DreamLite normalise their input channels with GroupNorm(norm_num_groups=32):
    four filled-in channels would not build; as many as the groups do."""
    import diffusers

    from integrate.verify.tiny import fill_unset

    for cls in (diffusers.TransformerTemporalModel, diffusers.DreamLiteTransformer2DModel):
        defaults = _defaults(cls)
        filled = fill_unset(defaults)
        assert filled["in_channels"] % defaults["norm_num_groups"] == 0
        assert derive(cls, {**defaults, **filled}).error is None


def test_a_tiny_width_keeps_the_divisibility_the_full_config_has():
    """ZImage's feed-forward width is derived in the model (`int(dim / 3 * 8)`): 10240 at full size, 85 from a tiny
    width of 32, which no TP proof cuts evenly. The derivation takes a larger head dim where that keeps every
    width's division by 4 (a width as narrow as a head count aside); where none does (Mochi's text FFN, sized from
    the tiny text width), it says so."""
    import inspect

    import diffusers

    from integrate.verify.tiny import lost_divisibility, derive

    def defaults(cls):
        return {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                if k != "self" and p.default is not inspect.Parameter.empty}

    zimage = diffusers.ZImageTransformer2DModel
    tiny = derive(zimage, defaults(zimage))
    assert tiny.error is None and tiny.head > 16 and not lost_divisibility(zimage, defaults(zimage), tiny)
    assert any("would not divide by 4 as the full config's does" in n for n in tiny.notes)
    mochi = diffusers.MochiTransformer3DModel
    said = derive(mochi, defaults(mochi)).notes
    assert any("at any tiny head dim tried" in n for n in said)


def test_block_stacks_named_num_x_blocks_shrink_in_their_order():
    """Kandinsky 6 counts its blocks as `num_visual_blocks` / `num_text_blocks` (60 and 4 by default): both
    shrink and keep their order. Wan-Animate's `inject_face_latents_blocks` (one adapter every k blocks) is not
    a stack count and is not read as one."""
    import diffusers
    from integrate.verify.tiny import is_layers

    original = _defaults(diffusers.Kandinsky6Transformer3DModel)
    tiny = derive(diffusers.Kandinsky6Transformer3DModel, original)
    assert tiny.error is None, tiny.error
    cfg = tiny.config
    assert 2 <= cfg["num_text_blocks"] < cfg["num_visual_blocks"] < original["num_visual_blocks"]
    assert not is_layers("inject_face_latents_blocks") and not is_layers("motion_blocks")


def test_hybrid_heads_shrink_a_rope_width_inside_the_head_with_it():
    """MiniMaxH3 rotates 2 * 3 * rope_freq_dim channels of each head (its docstring; `_apply_rotary_emb` slices them).
    Hybrid's config halves the head dim, so a frequency count halves with it (down to 1) and the rotation still fits
    the head; a channel count (`rotary_dim`) halves and stays even."""
    import torch
    from diffusers import MiniMaxH3Transformer3DModel as cls
    from diffusers.models.transformers import transformer_minimax_h3 as mod
    from integrate.verify.tiny import more_heads, object_defaults, tiny_config

    config = tiny_config(object_defaults(cls)).config
    changes = more_heads(config)
    head = changes["attention_head_dim"][1]
    freq = changes["rope_freq_dim"][1]
    assert changes["rope_freq_dim"][0] > freq >= 1
    rope = mod.MiniMaxH3RotaryPosEmbed(rope_freq_dim=freq)
    cos, sin = rope(torch.zeros(5, 3, dtype=torch.long))
    x = torch.randn(1, 5, changes["num_attention_heads"][1], head)
    assert mod._apply_rotary_emb(x, cos, sin).shape == x.shape  # the rotated channels fit the narrower head
    changed = more_heads({"num_attention_heads": 2, "attention_head_dim": 16, "rotary_dim": 8})
    assert changed["rotary_dim"] == (8, 4)
