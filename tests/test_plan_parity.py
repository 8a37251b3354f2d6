"""CP and TP plans agree with cache-dit 1.5.3's own planners on diffusers 0.42.1.

Expected answers come from running cache-dit's registered planners on the model built on the meta
device (tests/planner_oracle.py), never from a table here. The plan under test is produced the way a
user gets it: a config-only model directory through the gate, the analysis and the decisions.
Where we deliberately differ, the test says why and checks the reason from the source facts.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from conftest import computed_once, make_model_dir
from planner_oracle import cache_dit_plans_many

CP_AGREE = [
    ("FluxPipeline", "FluxTransformer2DModel"),
    ("Flux2Pipeline", "Flux2Transformer2DModel"),
    ("QwenImagePipeline", "QwenImageTransformer2DModel"),
    ("BriaFiboPipeline", "BriaFiboTransformer2DModel"),
    ("HunyuanVideoPipeline", "HunyuanVideoTransformer3DModel"),
    ("HeliosPipeline", "HeliosTransformer3DModel"),
    ("ZImagePipeline", "ZImageTransformer2DModel"),
    ("ChromaPipeline", "ChromaTransformer2DModel"),
    ("CogVideoXPipeline", "CogVideoXTransformer3DModel"),
    ("HunyuanImagePipeline", "HunyuanImageTransformer2DModel"),
    ("LongCatImagePipeline", "LongCatImageTransformer2DModel"),
    ("OvisImagePipeline", "OvisImageTransformer2DModel"),
    ("PixArtSigmaPipeline", "PixArtTransformer2DModel"),  # cross-attention text split at every block
    # Wan's processor runs cross-attention without CP (dispatch_attention_fn gets no parallel config when given
    # encoder_hidden_states): the text stays whole, as in cache-dit's plan
    ("WanPipeline", "WanTransformer3DModel"),
]
# Same split points, output splits and gather as cache-dit's, their other differences tested elsewhere (TP below).
# Their pipelines pass a 1-D timestep, not the [B, S] per-token tensor Wan's passes: no root split of it.
CP_SAME_SHAPE = [
    ("SkyReelsV2Pipeline", "SkyReelsV2Transformer3DModel"),
    ("ChronoEditPipeline", "ChronoEditTransformer3DModel"),
]
# Plans that differ from cache-dit's, each for a stated reason (kept visible, strict).
CP_DIFFER = [
    pytest.param("LTX2Pipeline", "LTX2VideoTransformer3DModel", marks=pytest.mark.xfail(
        strict=True, reason="forward adds absolute keyframe position embeddings before the blocks, so we do not "
                            "split at the root; and the audio output gather is not found")),
    pytest.param("CogView4Pipeline", "CogView4Transformer2DModel", marks=pytest.mark.xfail(
        strict=True, reason="cache-dit splits the RoPE input at every block, we split the rope module's output")),
    pytest.param("Kandinsky5T2VPipeline", "Kandinsky5Transformer3DModel", marks=pytest.mark.xfail(
        strict=True, reason="we also split the text blocks; cache-dit runs them whole on every rank")),
]
TP_MODELS = [m for m in CP_AGREE] + [
    ("WanPipeline", "WanTransformer3DModel"),
    ("LTX2Pipeline", "LTX2VideoTransformer3DModel"),
    ("ChronoEditPipeline", "ChronoEditTransformer3DModel"),
    ("CogView4Pipeline", "CogView4Transformer2DModel"),
    ("Kandinsky5T2VPipeline", "Kandinsky5Transformer3DModel"),
    ("ErnieImagePipeline", "ErnieImageTransformer2DModel"),
    ("Krea2Pipeline", "Krea2Transformer2DModel"),
    ("MochiPipeline", "MochiTransformer3DModel"),
    ("Lumina2Pipeline", "Lumina2Transformer2DModel"),
]
ALL = sorted({t for _, t in CP_AGREE + TP_MODELS} | {"SkyReelsV2Transformer3DModel"})


@pytest.fixture(scope="session")
def oracle(tmp_path_factory):
    try:
        import einops  # noqa: F401  (cache-dit's planner modules import it)
    except ImportError:
        pytest.skip("einops is not installed: cache-dit's planners cannot load")
    return computed_once(tmp_path_factory, "parity-oracle", lambda folder: cache_dit_plans_many(ALL))


@pytest.fixture(scope="session")
def plan():
    from integrate import api
    from integrate.records import to_json

    memo: dict = {}
    tmp = Path(tempfile.mkdtemp())

    def get(pipeline: str, transformer: str) -> dict:
        if transformer not in memo:
            d = make_model_dir(tmp / pipeline, pipeline, transformer)
            memo[transformer] = to_json(api.plan(api.flags_for(str(d)), probe=False))
        return memo[transformer]

    return get


def cp_shape(cp_plan: dict) -> dict[str, set[str]]:
    """Split keys, output-split keys and gather keys of a CP plan."""
    out = {"split": set(), "output_split": set(), "gather": set()}
    for key, value in (cp_plan or {}).items():
        if isinstance(value, list) or "gather_dim" in value:
            out["gather"].add(key)
        elif any(isinstance(v, dict) and v.get("split_output") for v in value.values()):
            out["output_split"].add(key)
        else:
            out["split"].add(key)
    return out


@pytest.mark.parametrize("pipeline,transformer", CP_AGREE + CP_SAME_SHAPE + CP_DIFFER)
def test_cp_split_point_output_splits_and_gather_match_cache_dit(oracle, plan, pipeline, transformer):
    expected = oracle[transformer]
    assert expected["cp_error"] is None, expected["cp_error"]
    ours = plan(pipeline, transformer)["parallelism"]["cp"]["plan"]
    assert cp_shape(ours) == cp_shape(expected["cp"])


@pytest.mark.parametrize("pipeline,transformer", CP_AGREE)
def test_cp_split_parameters_match_cache_dit(oracle, plan, pipeline, transformer):
    """Which inputs are split, and along which dim, for every split key both plans have."""
    expected = oracle[transformer]["cp"]
    ours = plan(pipeline, transformer)["parallelism"]["cp"]["plan"]
    for key in cp_shape(ours)["split"] & cp_shape(expected)["split"]:
        assert set(ours[key]) == set(expected[key]), key
        for param, split in ours[key].items():
            theirs = expected[key][param]
            if isinstance(theirs, list):  # a tuple input: one spec per element
                assert [s["split_dim"] for s in split] == [s["split_dim"] for s in theirs], (key, param)
            else:
                assert split["split_dim"] == theirs["split_dim"], (key, param)


def _tp_lists(plan_data: dict) -> dict[str, dict]:
    return {x["attr"]: x for x in plan_data["parallelism"]["tp"]["block_lists"]}


# deliberate differences, each with its own test below: (transformer, list)
_TP_DIFFERS = {("Flux2Transformer2DModel", "single_transformer_blocks")}


@pytest.mark.parametrize("pipeline,transformer", TP_MODELS)
def test_tp_layer_plans_match_cache_dit(oracle, plan, pipeline, transformer):
    expected = oracle[transformer]
    assert expected["tp_error"] is None, expected["tp_error"]
    ours = _tp_lists(plan(pipeline, transformer))
    for attr, theirs in expected["tp"].items():
        if (transformer, attr) in _TP_DIFFERS:
            continue
        assert attr in ours, f"cache-dit parallelises `{attr}`; we planned {sorted(ours)}"
        mine = ours[attr]["layer_plan"]
        extra = {k: v for k, v in mine.items() if k not in theirs["layer_plan"]}
        # The one deliberate addition: modulation Linears sharded with a replicated output, which the skill's
        # TP chart asks for and some cache-dit planners leave whole.
        assert all(v == "colwise(output=replicate)" for v in extra.values()), extra
        assert {k: v for k, v in mine.items() if k in theirs["layer_plan"]} == theirs["layer_plan"]


@pytest.mark.parametrize("pipeline,transformer", [m for m in TP_MODELS if m[1] != "QwenImageTransformer2DModel"])
def test_tp_shard_div_attr_matches_cache_dit(oracle, plan, pipeline, transformer):
    ours = _tp_lists(plan(pipeline, transformer))
    for attr, theirs in oracle[transformer]["tp"].items():
        if (transformer, attr) in _TP_DIFFERS:
            continue
        mine = ours[attr]["shard_div_attr"]
        for path, attrs in theirs["shard_div_attr"].items():
            if path == "":  # an attribute of the block itself (Ovis' fused single block): not read yet
                continue
            assert mine.get(path) == attrs, (attr, path)


def test_flux2s_fused_qkv_mlp_projection_is_kept_whole_where_cache_dit_rearranges_it(oracle, plan):
    """Deliberate difference: cache-dit's Flux2 planner shards the single blocks' `to_qkv_mlp_proj` after
    rearranging its rows part by part in its own code; our generated planner does not rearrange parts of different
    sizes, so it keeps that attention whole (replicated), which is correct, where sharding it plainly was not."""
    theirs = oracle["Flux2Transformer2DModel"]["tp"]["single_transformer_blocks"]["layer_plan"]
    assert theirs["attn.to_qkv_mlp_proj"] == "colwise"
    ours = _tp_lists(plan("Flux2Pipeline", "Flux2Transformer2DModel"))["single_transformer_blocks"]
    assert ours["layer_plan"]["attn.to_qkv_mlp_proj"] == "colwise(output=replicate)"
    assert "attn" not in ours["shard_div_attr"]


def test_qwen_divides_inner_dim_because_its_processor_derives_head_dim_from_it(plan):
    """Deliberate difference: Qwen's processor computes `head_dim = attn.inner_dim // attn.heads`, so dividing
    `heads` alone would double head_dim on a sharded projection; we divide both (cache-dit 1.5.3 divides heads)."""
    data = plan("QwenImagePipeline", "QwenImageTransformer2DModel")
    assert _tp_lists(data)["transformer_blocks"]["shard_div_attr"] == {"attn": ["heads", "inner_dim"]}
    attention = next(a for a in data["facts"]["attention"] if a["block_list"] == "transformer_blocks")
    line = attention["reshape_attrs"]["inner_dim"]
    text = Path(attention["processor_at"]["file"]).read_text().splitlines()
    assert "attn.inner_dim // attn.heads" in text[line - 1] or "attn.inner_dim // attn.heads" in "".join(
        text[line - 3:line])


def test_skyreels_plan_targets_modules_that_exist(oracle, plan):
    """cache-dit's SkyReels TP plan names `attn.*`, which the block does not have (torch skips them); ours
    names the real `attn1` / `attn2` projections, confirmed by the static module tree."""
    data = plan("SkyReelsV2Pipeline", "SkyReelsV2Transformer3DModel")
    assert oracle["SkyReelsV2Transformer3DModel"]["tp_unresolved"]["blocks"]
    mine = _tp_lists(data)["blocks"]["layer_plan"]
    assert mine["attn1.to_q"] == "colwise" and mine["attn2.to_out.0"] == "rowwise"
    assert not any(k.startswith("attn.") for k in mine)


def test_named_decisions_with_evidence(plan):
    """The plan says why: mask reorder, sub-module hooks, output splits, fused weights — each with a line."""
    hv = plan("HunyuanVideoPipeline", "HunyuanVideoTransformer3DModel")["parallelism"]["cp"]
    assert hv["mask_reorder"]["needed"] and hv["mask_reorder"]["kind"] == "1-D"
    assert "pre-hook" in hv["mask_reorder"]["mechanism"] and not hv["hybrid_patch"]["needed"]  # hooks, no patch
    helios = plan("HeliosPipeline", "HeliosTransformer3DModel")["parallelism"]["cp"]
    assert helios["shape"] == "sub-module hooks"
    assert any("original_context_length" in e["why"] for e in helios["evidence"])
    wan = plan("WanPipeline", "WanTransformer3DModel")["parallelism"]
    assert wan["cp"]["plan"]["rope"]["0"] == {"split_dim": 1, "expected_dims": 4, "split_output": True}
    assert any("norm_q" in r and "distributed RMSNorm" in r for r in _tp_lists({"parallelism": wan})["blocks"]["risks"])
    flux = _tp_lists(plan("FluxPipeline", "FluxTransformer2DModel"))
    assert flux["single_transformer_blocks"]["strategy"] == "fused-weight rearrangement"
    for data in (hv, helios):
        for e in data["evidence"]:
            assert e["file"] and e["line"] >= 0 and e["why"]


def test_a_block_level_linear_is_column_sharded_only_into_a_row_wise_one(plan):
    """A block-level Linear cut column-wise hands each rank a slice of its features; that is right only when a
    row-wise Linear consumes it (Flux's `proj_mlp` into `proj_out`). NucleusMoE's `encoder_proj` feeds the
    attention's own `add_k_proj` / `add_v_proj`, which take whole features: its output is replicated."""
    nucleus = _tp_lists(plan("NucleusMoEImagePipeline", "NucleusMoEImageTransformer2DModel"))["transformer_blocks"]
    assert nucleus["layer_plan"]["encoder_proj"] == "colwise(output=replicate)"
    flux = _tp_lists(plan("FluxPipeline", "FluxTransformer2DModel"))["single_transformer_blocks"]
    assert flux["layer_plan"]["proj_mlp"] == "colwise" and flux["layer_plan"]["proj_out"] == "rowwise"
