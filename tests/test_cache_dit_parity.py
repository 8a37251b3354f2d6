"""The analysis agrees with cache-dit 1.5.3's own registered adapters on diffusers 0.42.1.

The expected answers come from calling cache-dit's registry (tests/oracle.py), not from a
table here. Where cache-dit wraps a subset of the block lists we find (refiner lists), the
lists it wraps must be found as blocks with the same pattern.
"""

import pytest
from conftest import block_list
from oracle import cache_dit_answer

MODELS = [
    ("FluxPipeline", "FluxTransformer2DModel"),
    ("Flux2Pipeline", "Flux2Transformer2DModel"),
    ("WanPipeline", "WanTransformer3DModel"),
    ("QwenImagePipeline", "QwenImageTransformer2DModel"),
    ("HunyuanVideoPipeline", "HunyuanVideoTransformer3DModel"),
    ("CogVideoXPipeline", "CogVideoXTransformer3DModel"),
    ("PixArtSigmaPipeline", "PixArtTransformer2DModel"),
    ("LTX2Pipeline", "LTX2VideoTransformer3DModel"),
    ("ErnieImagePipeline", "ErnieImageTransformer2DModel"),
    ("MochiPipeline", "MochiTransformer3DModel"),
    ("StableDiffusion3Pipeline", "SD3Transformer2DModel"),
    ("SanaPipeline", "SanaTransformer2DModel"),
    ("ZImagePipeline", "ZImageTransformer2DModel"),
    ("ChromaPipeline", "ChromaTransformer2DModel"),
    ("CogView4Pipeline", "CogView4Transformer2DModel"),
    ("Lumina2Pipeline", "Lumina2Transformer2DModel"),
    ("AuraFlowPipeline", "AuraFlowTransformer2DModel"),
    ("HunyuanImagePipeline", "HunyuanImageTransformer2DModel"),
    ("SkyReelsV2Pipeline", "SkyReelsV2Transformer3DModel"),
    ("AllegroPipeline", "AllegroTransformer3DModel"),
    ("LTXPipeline", "LTXVideoTransformer3DModel"),
    ("EasyAnimatePipeline", "EasyAnimateTransformer3DModel"),
    ("OvisImagePipeline", "OvisImageTransformer2DModel"),
    ("LongCatImagePipeline", "LongCatImageTransformer2DModel"),
    ("GlmImagePipeline", "GlmImageTransformer2DModel"),
    ("HeliosPipeline", "HeliosTransformer3DModel"),
    ("ChronoEditPipeline", "ChronoEditTransformer3DModel"),
    ("PRXPipeline", "PRXTransformer2DModel"),
    ("OmniGenPipeline", "OmniGenTransformer2DModel"),
    ("HunyuanVideo15Pipeline", "HunyuanVideo15Transformer3DModel"),
    ("Krea2Pipeline", "Krea2Transformer2DModel"),
    ("Kandinsky5T2VPipeline", "Kandinsky5Transformer3DModel"),
    # Known disagreements, kept visible (see the issue notes):
    # two returns, `(hidden_states, hs_proj)` only when the block built `after_proj`, which it does not
    ("CosmosTextToWorldPipeline", "CosmosTransformer3DModel"),
    pytest.param("BriaPipeline", "BriaTransformer2DModel",
                 marks=pytest.mark.xfail(reason="we read (encoder, hidden) returns; cache-dit registers Pattern_0",
                                         strict=True)),
    pytest.param("HiDreamImagePipeline", "HiDreamImageTransformer2DModel",
                 marks=pytest.mark.xfail(reason="HiDream wraps blocks in a holder module; not traced yet", strict=True)),
]


@pytest.mark.parametrize("pipeline,transformer", MODELS)
def test_block_lists_and_patterns_match_cache_dit(analysis, pipeline, transformer):
    expected = cache_dit_answer(pipeline, transformer)
    assert expected is not None, f"cache-dit registers no adapter for {pipeline}"
    data = analysis(pipeline, transformer)
    for attr, pattern in zip(expected["blocks"], expected["patterns"]):
        bl = block_list(data, attr)
        assert bl["is_blocks"] is True, (attr, bl["why"])
        # Where two patterns both bind unchanged (Pattern_2 / Pattern_3 for a block that returns
        # only the hidden stream), cache-dit's choice must be one of the valid ones we report.
        assert pattern == bl["forward_pattern"] or pattern in bl["alternatives"], (attr, bl["forward_pattern"],
                                                                                   bl["alternatives"], bl["notes"])
        assert bl["evidence"], "every verdict carries evidence"


# LTX2 is left out: it runs three calls a step by default, which cache-dit's two-way split cannot describe
# (test_analyze_models: unknown, with the reason); cache-dit's shared LTX adapter leaves it False
CFG_MODELS = [m for m in MODELS if not hasattr(m, "marks") and m != ("LTX2Pipeline", "LTX2VideoTransformer3DModel")]


@pytest.mark.parametrize("pipeline,transformer", CFG_MODELS)
def test_separate_cfg_matches_cache_dit(analysis, pipeline, transformer):
    expected = cache_dit_answer(pipeline, transformer)
    data = analysis(pipeline, transformer)
    assert data["pipeline"]["has_separate_cfg"] is expected["has_separate_cfg"], data["pipeline"]["evidence"]
