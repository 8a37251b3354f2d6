"""The PatchFunctor's answers to loop bodies cache-dit's one-wrapper list changes, proved by the cache proof on
installed diffusers 0.42.1 models: a per-block argument computed from the loop index, and a block read by a
constant index in forward."""

from __future__ import annotations

from pathlib import Path

from conftest import make_model_dir

from integrate import api
from integrate.records import to_json

MODEL_TESTS = Path(__file__).parent / "fixtures" / "modeltest"


def _generated(tmp_path, pipeline: str, transformer: str):
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    api.write_plan(api.plan(api.flags_for(str(make_model_dir(tmp_path / "model", pipeline, transformer))),
                            probe=False), plan_dir)
    api.approve(plan_dir, "test")
    return plan_dir, out, api.generate(plan_dir, out=out)


def test_a_per_block_mask_and_an_indexed_first_block_are_answered_and_the_cache_proof_passes(tmp_path):
    """AceStep's loop computes `layer_attn_mask = sliding_attn_mask if self.layer_types[i] == "sliding_attention"
    else None` and passes it as `attention_mask=`; cache-dit runs that body once (index 0) and gives every block
    the sliding mask. Before the loop forward reads `self.layers[0].self_attn.processor`, which is the wrapper
    once cached. The PatchFunctor records the loop-invariant mask before the loop and re-computes each block's
    keyword in a forward pre-hook, and reads the first block from a dict kept before wrapping: no manual part is
    left, and with our model test (one sliding layer, one full) the cache proof passes."""
    plan_dir, out, generated = _generated(tmp_path, "AceStepPipeline", "AceStepTransformer1DModel")
    assert not any("pitfall B" in m or "self.layers[0]" in m for m in generated.manual), generated.manual
    functor = next(out.glob("*/patch_functor.py")).read_text()
    assert "register_forward_pre_hook" in functor and "self._integrate_blocks['layers'][0]" in functor
    assert not list(out.glob("*/manual_patch.py"))
    report = to_json(api.verify(plan_dir, out, proofs=("cache",), trust_code=True,
                                fixture_from=MODEL_TESTS / "test_models_transformer_ace_step.py"))
    assert report["cache"]["status"] == "pass", report["cache"]


def test_a_per_block_text_passed_as_the_encoder_keyword_of_a_pattern_3_list_is_answered(tmp_path):
    """BriaFibo2's main blocks get `encoder_hidden_states=text`, with `text` a bundle of the text picked by the
    loop index (`encoder_hidden_states[:, bundle_index[layer_id]] if layer_id in bundle_index else None`). Under
    Pattern_3 cache-dit's wrapper takes only `hidden_states` apart and passes that keyword on as given, so a
    pre-hook can put each block's own bundle back: answered, where a Pattern_0-2 encoder stream would not be."""
    _, out, generated = _generated(tmp_path, "BriaFibo2Pipeline", "BriaFibo2Transformer2DModel")
    assert not any("pitfall B" in m for m in generated.manual), generated.manual
    functor = next(out.glob("*/patch_functor.py")).read_text()
    assert 'kwargs["encoder_hidden_states"] = text' in functor and 'bundle_index = env["bundle_index"]' in functor


def test_statements_after_the_block_call_become_a_hook_on_each_blocks_output(tmp_path):
    """WanAnimate's loop runs its face adapter after every `inject_face_latents_blocks`-th block
    (`if block_idx % N == 0: hidden_states = self.face_adapter[block_idx // N](hidden_states, motion_vec) +
    hidden_states`); cache-dit's wrapper would run that once, after all the blocks. The statements leave the
    patched loop and become a forward hook on each block (a Pattern_2 block returns the stream alone), reading
    `motion_vec` recorded before the loop: nothing is left manual. (Its cache proof, which passes, derives its
    fixture from the pipeline in minutes: it is run by `bench/bench_unsupported.py`, not here.)"""
    _, out, generated = _generated(tmp_path, "WanAnimatePipeline", "WanAnimateTransformer3DModel")
    assert not any("pitfall B" in m for m in generated.manual), generated.manual
    functor = next(out.glob("*/patch_functor.py")).read_text()
    assert "register_forward_hook" in functor and 'motion_vec = env["motion_vec"]' in functor
    loop = functor.split("for block_idx, block in enumerate(self.blocks):")[1].split("# 6.")[0]
    assert "face_adapter" not in loop  # gone from the patched loop: the hook runs it
