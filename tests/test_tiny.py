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
    for k, v in tiny.changes.items():
        if isinstance(v[0], (list, tuple)) and "layer" not in k and "block" not in k:
            # RoPE axes: even, summing to the head dim (or half of it, for sections of a cos / sin half)
            assert sum(v[1]) in (HEAD_DIM, HEAD_DIM // 2) and all(x % 2 == 0 for x in v[1])
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
