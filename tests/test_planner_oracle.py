"""The planner oracle reports what cache-dit's own registered CP/TP planners plan."""

from __future__ import annotations

import planner_oracle
import pytest
from planner_oracle import cache_dit_plans, cache_dit_plans_many

pytest.importorskip("cache_dit")
pytest.importorskip("diffusers")
# cache-dit's planner modules import einops (its `parallelism` extra); without it no planner registers.
pytest.importorskip("einops", reason="cache-dit's planners need einops (cache-dit[parallelism])")

MODELS = {
    "Flux": "FluxTransformer2DModel",
    "Flux2": "Flux2Transformer2DModel",
    "QwenImage": "QwenImageTransformer2DModel",
    "Wan": "WanTransformer3DModel",
    "HunyuanVideo": "HunyuanVideoTransformer3DModel",
    "BriaFibo": "BriaFiboTransformer2DModel",
    "Helios": "HeliosTransformer3DModel",
    "ZImage": "ZImageTransformer2DModel",
    "CogVideoX": "CogVideoXTransformer3DModel",
    "PixArt": "PixArtTransformer2DModel",
    "LTX2": "LTX2VideoTransformer3DModel",
    "ErnieImage": "ErnieImageTransformer2DModel",
    "Chroma": "ChromaTransformer2DModel",
    "SkyReelsV2": "SkyReelsV2Transformer3DModel",
    "HunyuanImage": "HunyuanImageTransformer2DModel",
    "LongCatImage": "LongCatImageTransformer2DModel",
    "OvisImage": "OvisImageTransformer2DModel",
    "Kandinsky5": "Kandinsky5Transformer3DModel",
    "Mochi": "MochiTransformer3DModel",
    "ChronoEdit": "ChronoEditTransformer3DModel",
    "CogView4": "CogView4Transformer2DModel",
    "Krea2": "Krea2Transformer2DModel",
}

# What cache-dit 1.5.3 itself lacks: Mochi has a TP planner but no CP planner.
EXPECTED_FAILURES = {("MochiTransformer3DModel", "cp")}


@pytest.fixture(scope="module")
def batch():
    return cache_dit_plans_many(list(MODELS.values()))


def test_flux_cp(batch):
    cp = batch["FluxTransformer2DModel"]["cp"]
    assert cp[""]["hidden_states"] == {"split_dim": 1, "expected_dims": 3, "split_output": False}
    assert cp["proj_out"] == {"gather_dim": 1, "expected_dims": 3}


def test_flux_tp(batch):
    result = batch["FluxTransformer2DModel"]
    assert result["tp_error"] is None
    tp = result["tp"]
    double = tp["transformer_blocks"]
    assert double["layer_plan"]["attn.to_q"] == "colwise"
    assert double["layer_plan"]["attn.to_out.0"] == "rowwise"
    assert double["layer_plan"]["norm1.linear"] == "colwise(output=replicate)"
    assert double["shard_div_attr"] == {"attn": ["heads"]}
    single = tp["single_transformer_blocks"]
    assert single["layer_plan"]["proj_out"] == "rowwise"
    assert single["shard_div_attr"] == {"attn": ["heads"]}


def test_qwen_image_cp(batch):
    cp = batch["QwenImageTransformer2DModel"]["cp"]
    assert "transformer_blocks.0" in cp
    assert cp["transformer_blocks.0"]["hidden_states"]["split_dim"] == 1
    assert cp["pos_embed"]
    assert all(entry["split_output"] is True for entry in cp["pos_embed"].values())


def test_wan_cp(batch):
    cp = batch["WanTransformer3DModel"]["cp"]
    assert "rope" in cp and "blocks.0" in cp
    assert all(entry["split_output"] is True for entry in cp["rope"].values())


def test_batch_success_list(batch):
    failures = set()
    for name, result in batch.items():
        assert set(result) >= {"cp", "cp_error", "tp", "tp_error"}
        for half in ("cp", "tp"):
            if result[f"{half}_error"] is not None:
                assert result[half] is None
                assert "\n" not in result[f"{half}_error"]
                failures.add((name, half))
            else:
                assert result[half] is not None
    assert failures == EXPECTED_FAILURES
    assert batch["MochiTransformer3DModel"]["cp_error"].startswith("ValueError: No planner registered")
    # Mochi's missing CP planner does not cost its TP half.
    assert batch["MochiTransformer3DModel"]["tp"]["transformer_blocks"]["layer_plan"]


def test_tp_planners_resolve_for_tp_only_modules(batch):
    # ltx2_video, kandinsky5 and mochi register TP planners only; they must still be found after the
    # CP activation filled the TP registry with the planners that share a module with a CP planner.
    assert batch["LTX2VideoTransformer3DModel"]["tp_planner"] == "LTX2VideoTensorParallelismPlanner"
    assert batch["Kandinsky5Transformer3DModel"]["tp_planner"] == "Kandinsky5TensorParallelismPlanner"


def test_single_call_uses_the_memo(batch, monkeypatch):
    def boom(jobs):
        raise AssertionError("worker should not run for a memoised class")

    monkeypatch.setattr(planner_oracle, "_run_worker", boom)
    assert cache_dit_plans("FluxTransformer2DModel") == batch["FluxTransformer2DModel"]
    # Results are copies: a caller's edits do not reach the memo.
    cache_dit_plans("FluxTransformer2DModel")["cp"].clear()
    assert cache_dit_plans("FluxTransformer2DModel")["cp"]


def test_unknown_class_reports_one_line_errors():
    result = cache_dit_plans("NoSuchTransformer2DModel")
    assert result["cp"] is None and result["tp"] is None
    assert result["cp_error"].startswith("AttributeError")
    assert "\n" not in result["cp_error"] and "\n" not in result["tp_error"]


def test_monkeypatching_planners_stay_in_the_worker(batch):
    # HunyuanVideo's CP planner replaces the class's forward; that happens in the worker only.
    import diffusers

    forward = diffusers.HunyuanVideoTransformer3DModel.forward
    assert forward.__module__.startswith("diffusers.")


def test_tp_block_summary(batch):
    flux = batch["FluxTransformer2DModel"]
    assert flux["tp_blocks"] == {
        "transformer_blocks": {"count": 19, "uniform": True},
        "single_transformer_blocks": {"count": 38, "uniform": True},
    }
    assert flux["tp_unresolved"] == {}
    # Mochi's planner skips the last (context pre-only) block.
    assert batch["MochiTransformer3DModel"]["tp_blocks"]["transformer_blocks"]["count"] == 47


def test_unresolved_tp_keys_are_reported(batch):
    # cache-dit's SkyReelsV2 planner names attn.* but the block has attn1/attn2: torch skips those keys.
    sky = batch["SkyReelsV2Transformer3DModel"]
    assert sky["tp_unresolved"]["blocks"] == ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0"]


def test_config_is_used():
    result = cache_dit_plans("FluxTransformer2DModel", {"num_layers": 1, "num_single_layers": 2})
    assert result["construct"] == "config"
    assert result["tp_blocks"]["transformer_blocks"]["count"] == 1
    assert result["tp_blocks"]["single_transformer_blocks"]["count"] == 2
