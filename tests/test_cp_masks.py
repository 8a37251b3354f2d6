"""A processor that sizes its mask with the legacy `prepare_attention_mask(mask, key_length, batch)` sees the
local key length under CP and pads the mask to a wrong length: the plan refuses CP there with the line,
and no CP planner is written (one that fails at run time is worse than none). Real diffusers 0.42.1 sources.

cache-dit 1.5.3 patches that very method by hand in its own CP planners for PixArt, LTX, LTX2, CogVideoX and
DiT; the plan finds the same places from the processors' code.
"""

from __future__ import annotations

import json

import pytest
from conftest import make_model_dir, run_cli

from integrate import api


def _cp(tmp_path, pipeline: str, transformer: str):
    model = make_model_dir(tmp_path / transformer, pipeline, transformer)
    return api.plan(api.flags_for(str(model)), probe=False).parallelism.cp


@pytest.mark.parametrize("pipeline,transformer,attention", [
    ("LTXPipeline", "LTXVideoTransformer3DModel", "attn1"),  # a masked self-attention
    ("PixArtSigmaPipeline", "PixArtTransformer2DModel", "attn2"),  # cache-dit patches the method for it
])
def test_cp_is_refused_where_the_processor_sizes_the_mask_for_the_local_keys(tmp_path, pipeline, transformer,
                                                                               attention):
    cp = _cp(tmp_path, pipeline, transformer)
    assert cp.blocked_by and cp.confidence == "low"
    hit = next(e for e in cp.blocked_by if f"].{attention}`" in e.why)
    assert "prepare_attention_mask" in hit.why and hit.line > 0 and hit.file.endswith(".py")


def test_a_processor_that_builds_no_legacy_mask_is_not_refused(tmp_path):
    assert not _cp(tmp_path, "FluxPipeline", "FluxTransformer2DModel").blocked_by


def test_generate_writes_no_cp_planner_and_verify_says_why(tmp_path):
    model = make_model_dir(tmp_path / "m", "LTXPipeline", "LTXVideoTransformer3DModel")
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    assert run_cli("plan", str(model), "--out", str(plan_dir), "--no-probe").returncode == 0
    assert run_cli("approve", str(plan_dir), "--reviewer", "Ada").returncode == 0
    gen = run_cli("generate", str(plan_dir), "--out", str(out), "--json")
    report = json.loads(gen.stdout)
    assert gen.returncode == 1 and "cp_planner" not in report["registered"]
    assert any(m.startswith("CP not written: ") and "prepare_attention_mask" in m for m in report["manual"])
    proof = run_cli("verify", str(plan_dir), "--generated", str(out), "--proof", "cp", "--json")
    cp = json.loads(proof.stdout)["cp"]
    assert cp["status"] == "skipped" and cp["why"].startswith("the plan writes no CP planner: "), cp


def test_cp_is_refused_where_the_kernel_runs_causal_attention(tmp_path):
    """MiniMaxMusic3's depth decoder calls `dispatch_attention_fn(..., is_causal=True)`; cache-dit's templated
    context-parallel attention raises on causal attention, so CP is refused with the line. A kernel called
    with `is_causal=False` (ZImage) is not."""
    model = tmp_path / "m" / "transformer"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"_class_name": "MiniMaxMusic3RVQDepthDecoder",
                                                    "_diffusers_version": "0.42.1"}))
    flags = api.flags_for(str(tmp_path / "m"), no_pipeline=True, separate_cfg=False)
    cp = api.plan(flags, probe=False).parallelism.cp
    hit = next(e for e in cp.blocked_by if "is_causal" in e.why)
    assert hit.file.endswith("minimax_music3_rvq_depth_decoder.py") and hit.line > 0 and cp.confidence == "low"
    assert not any("is_causal" in e.why for e in _cp(tmp_path, "ZImagePipeline", "ZImageTransformer2DModel").blocked_by)


def test_cp_is_refused_where_a_processor_multiplies_its_output_by_the_mask(tmp_path):
    """LongCatAudioDiT's processors give `attention_mask` to the kernel and then multiply the attention output by
    a mask (`hidden_states * attention_mask[:, :, None, None]`), and its walk passes the blocks that mask. Under
    CP those output rows are the rank's own queries while the kernel's key mask covers every key: no hook can
    split one tensor and leave it whole. Before this rule the CP proof failed at `blocks.0.self_attn`."""
    cp = _cp(tmp_path, "LongCatAudioDiTPipeline", "LongCatAudioDiTTransformer")
    assert cp.confidence == "low"
    hits = {e.why.split("`")[1]: e for e in cp.blocked_by if "after the kernel" in e.why}
    assert set(hits) == {"blocks[i].self_attn", "blocks[i].cross_attn"}, [e.why for e in cp.blocked_by]
    assert "`attention_mask`" in hits["blocks[i].self_attn"].why
    assert "`post_attention_mask`" in hits["blocks[i].cross_attn"].why
    assert all(e.file.endswith("transformer_longcat_audio_dit.py") and e.line > 0 for e in hits.values())


@pytest.mark.parametrize("pipeline,transformer", [
    ("MotifVideoPipeline", "MotifVideoTransformer3DModel"),  # the mask goes to the kernel only
    ("AceStepPipeline", "AceStepTransformer1DModel"),  # the mask is read after `_get_current_attention_backend`
])
def test_a_mask_read_only_before_the_kernel_is_not_refused(tmp_path, pipeline, transformer):
    """`_get_current_attention_backend(self)` has "attention" in its name but takes no query, key and value: it
    is not the kernel, so the mask checks after it are before the kernel (AceStep's `dispatch_attention_fn`)."""
    cp = _cp(tmp_path, pipeline, transformer)
    assert not any("after the kernel" in e.why for e in cp.blocked_by), [e.why for e in cp.blocked_by]
    if transformer.startswith("AceStep"):
        plan = api.plan(api.flags_for(str(make_model_dir(tmp_path / "a", pipeline, transformer))), probe=False)
        kernels = {a.kernel.why for a in plan.facts.attention if a.kernel is not None}
        assert kernels == {"attention kernel `dispatch_attention_fn`"}, kernels
