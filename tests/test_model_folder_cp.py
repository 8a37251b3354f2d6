"""Context parallelism of a config-only model folder, decided from what the model's own code says: the installed
diffusers 0.42.1 classes, planned (`--no-probe`), generated and proved on tiny random-weight models.

- an MoE layer that routes by expert choice (each expert takes its top tokens of the whole sequence) runs whole
  under CP, its inputs gathered and its output cut again (NucleusMoE): the CP proof passes;
- a block that hands its sequence to a module built from a class given to its constructor (SANA-WM's
  `self.attn = attn_cls(...)`) is not planned for CP: the proof is skipped with that line;
- a processor that cuts query, key or value along the sequence before the kernel (QwenImage 2.1's prefix segments)
  is not planned for CP either, and the comprehension its forward runs over the blocks walks the blocks recorded
  before cache-dit wraps the list: the cache proof passes with no hand edit.
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import make_model_dir, plan_generate, verify_json


def _cp(plan_dir: Path) -> dict:
    return json.loads((plan_dir / "plan.json").read_text())["parallelism"]["cp"]


def test_an_expert_choice_moe_layer_runs_whole_under_cp_and_the_proof_passes(tmp_path):
    model = make_model_dir(tmp_path / "m", "NucleusMoEImagePipeline", "NucleusMoEImageTransformer2DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    cp = _cp(plan_dir)
    whole = cp["run_whole"]["transformer_blocks.*.img_mlp"]
    assert set(whole["gather"]) == {"hidden_states", "hidden_states_unmodulated"}, whole
    assert whole["split"] == {"0": {"split_dim": 1, "expected_dims": 3, "split_output": True}}
    assert "topk" in whole["why"] and "expert-choice" in whole["why"], whole["why"]
    assert any("transformer_nucleusmoe_image.py" in e["file"] and "expert-choice" in e["why"]
               for e in cp["evidence"]), cp["evidence"]
    assert not cp["blocked_by"]
    assert "RUN_WHOLE" in (out / "integrate_nucleus_moe_image" / "cp_planner.py").read_text()
    _, r = verify_json(plan_dir, out, "--proof", "cp")
    assert r["fixture"]["status"] == "derived", r["fixture"]
    assert r["cp"]["status"] == "pass", r["cp"]


def test_a_block_module_built_from_a_class_given_to_the_constructor_blocks_cp_with_its_line(tmp_path):
    model = make_model_dir(tmp_path / "m", "SanaWMPipeline", "SanaWMTransformer3DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    cp = _cp(plan_dir)
    blocked = [e for e in cp["blocked_by"] if "`self.attn(...)` takes the sequence" in e["why"]]
    assert blocked and "attn_cls" in blocked[0]["why"] and blocked[0]["file"].endswith("transformer_sana_wm.py")
    assert cp["confidence"] == "low"
    _, r = verify_json(plan_dir, out, "--proof", "cp")
    assert r["cp"]["status"] == "skipped" and "attn_cls" in r["cp"]["why"], r["cp"]


def test_a_processor_that_cuts_the_sequence_before_the_kernel_blocks_cp_and_the_cache_needs_no_edit(tmp_path):
    model = make_model_dir(tmp_path / "m", "QwenImage21Pipeline", "QwenImage21Transformer2DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    cp = _cp(plan_dir)
    assert any("query[:, start:end]" in e["why"] for e in cp["blocked_by"]), cp["blocked_by"]
    plugin = out / "integrate_qwen_image21"
    assert "_integrate_blocks['transformer_blocks']" in (plugin / "patch_functor.py").read_text()
    stub = plugin / "manual_patch.py"
    assert not stub.exists() or "NEEDS_CODE = True" not in stub.read_text()
    _, r = verify_json(plan_dir, out, "--proof", "cache")
    assert r["fixture"]["status"] == "derived", r["fixture"]
    assert r["cache"]["status"] == "pass", r["cache"]


def test_an_attention_beside_the_blocks_that_regroups_the_sequence_per_frame_runs_whole_under_cp(tmp_path):
    """Wan Animate's face adapter, called in the block loop's body with the stream, groups the query's tokens per
    frame of the motion vector it attends to (`B, T, N, C = encoder_hidden_states.shape`, `query.unflatten(1, (T,
    -1))`): on a rank's share the groups fall on other frames. The plan runs it whole from the first verify (the
    CP proof had diverged there until `integrate repair` found the same run-whole proposal, ~205 s later). Plan
    only: the proof itself runs minutes on this model (its motion encoder's convolutions)."""
    from integrate import api

    model = make_model_dir(tmp_path / "m", "WanAnimatePipeline", "WanAnimateTransformer3DModel")
    plan = api.plan(api.flags_for(str(model)), probe=False)
    whole = plan.parallelism.cp.run_whole["face_adapter.*"]
    assert set(whole.gather) == {"hidden_states"} and whole.gather["hidden_states"].gather_dim == 1
    assert whole.split["0"].split_dim == 1 and "query.unflatten(1, (T, -1))" in whole.why, whole
    assert "encoder_hidden_states" in whole.why
    assert any("transformer_wan_animate.py" in e.file and "query.unflatten" in e.why
               for e in plan.parallelism.cp.evidence)
