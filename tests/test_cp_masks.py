"""A processor that sizes its mask with the legacy `prepare_attention_mask(mask, key_length, batch)` sees the
local key length under CP and pads the mask to a wrong length; one that multiplies its output by a mask needs
the rank's rows there and every key's in the kernel. Where the kernel is a dispatcher the processor's module binds
as a global, the planner mends both (`cp.mask_mend`); elsewhere the plan refuses CP with the line, and no CP
planner is written (one that fails at run time is worse than none). Real diffusers 0.42.1 sources.

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


def test_cp_is_refused_where_the_processor_sizes_the_mask_for_the_local_keys_and_calls_the_kernel_directly(
        tmp_path):
    """PixArt's attn2 runs diffusers' legacy AttnProcessor2_0, which calls `F.scaled_dot_product_attention`
    itself: no dispatcher global the planner could wrap, so the legacy mask stays a refusal with the line."""
    cp = _cp(tmp_path, "PixArtSigmaPipeline", "PixArtTransformer2DModel")
    assert cp.blocked_by and cp.confidence == "low" and not cp.mask_mend
    hit = next(e for e in cp.blocked_by if "].attn2`" in e.why)
    assert "prepare_attention_mask" in hit.why and hit.line > 0 and hit.file.endswith(".py")


@pytest.mark.parametrize("pipeline,transformer,attentions", [
    ("LTXPipeline", "LTXVideoTransformer3DModel", {"attn1"}),  # a masked self-attention
    ("LTX2Pipeline", "LTX2VideoTransformer3DModel", {"attn1", "attn2", "audio_attn1", "audio_attn2",
                                                     "audio_to_video_attn", "video_to_audio_attn"}),
])
def test_a_legacy_mask_is_mended_where_the_kernel_is_a_dispatcher_global(tmp_path, pipeline, transformer,
                                                                         attentions):
    """The same legacy `prepare_attention_mask`, in processors that call the `dispatch_attention_fn` their module
    imports: the planner keeps a whole mask whole there and cuts its per-head rows at the wrapped dispatcher (what
    cache-dit's own LTX2 planner does by patching the processor), so CP is planned, not refused."""
    cp = _cp(tmp_path, pipeline, transformer)
    assert not any("prepare_attention_mask" in e.why for e in cp.blocked_by), [e.why for e in cp.blocked_by]
    (mend,) = cp.mask_mend
    assert mend.function == "dispatch_attention_fn" and mend.module.startswith("diffusers.models.transformers.")
    assert {p.rsplit(".", 1)[-1] for p in mend.prepared} == attentions and not mend.split
    assert all("prepare_attention_mask" in e.why and e.line > 0 for e in mend.at)


def test_a_mask_a_processor_applies_to_its_output_is_cut_with_the_tokens_and_gathered_at_the_kernel(tmp_path):
    """LongCatAudioDiT's processors give `attention_mask` to the kernel and then multiply the attention output by
    it (`hidden_states * attention_mask[:, :, None, None]`): the output rows are the rank's own queries, the
    kernel's keys are every rank's. The block input `mask` that reaches both is cut with the tokens at every block
    (its last axis) and the wrapped dispatcher gathers the keys' share back; the mask read by key only
    (`cond_mask`, the text's) is left whole. Its long skip (`hidden_states + residual`, the sequence from before
    the blocks) moves the gather to the last block. Before: refused, and with the refusal lifted the proof failed
    at that skip."""
    cp = _cp(tmp_path, "LongCatAudioDiTPipeline", "LongCatAudioDiTTransformer")
    assert not cp.blocked_by, [e.why for e in cp.blocked_by]
    (mend,) = cp.mask_mend
    assert mend.split == ("blocks.*:mask",) and not mend.prepared
    split = cp.plan["blocks.*"]["mask"]
    assert (split.split_dim, split.expected_dims) == (-1, None) and "cond_mask" not in cp.plan["blocks.*"]
    assert {e.why.split("`")[1] for e in mend.at} == {"blocks[i].self_attn", "blocks[i].cross_attn"}
    last = [k for k in cp.plan if k.startswith("blocks.") and k.split(".")[1].isdigit() and k != "blocks.0"]
    assert last and "proj_out" not in cp.plan
    assert any("long skip" in e.why and "residual" in e.why for e in cp.evidence)


def test_an_input_annotated_as_no_tensor_is_never_split(tmp_path):
    """SanaWMLTX2Refiner's `kv_cache: SanaWMRefinerKVCache | None` feeds `sink_rotary_emb`: it was split at the
    root as a position input, and cache-dit's split hook raised `Expected 5 arguments but got 0` on every call
    that leaves it out. Neither it nor the RoPE built from it alone is split now."""
    model = tmp_path / "m" / "transformer"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"_class_name": "SanaWMLTX2RefinerTransformer3DModel",
                                                    "_diffusers_version": "0.42.1"}))
    cp = api.plan(api.flags_for(str(tmp_path / "m"), no_pipeline=True, separate_cfg="no"), probe=False).parallelism.cp
    keys = {param for hooks in cp.plan.values() if isinstance(hooks, dict) for param in hooks}
    assert "kv_cache" not in keys and "sink_rotary_emb" not in keys and "hidden_states" in cp.plan[""]
    assert any("`kv_cache`" in e.why and "no tensor" in e.why for e in cp.evidence)


def test_a_processor_that_builds_no_legacy_mask_is_not_refused(tmp_path):
    assert not _cp(tmp_path, "FluxPipeline", "FluxTransformer2DModel").blocked_by


def test_generate_writes_no_cp_planner_and_verify_says_why(tmp_path):
    model = make_model_dir(tmp_path / "m", "HunyuanDiTPipeline", "HunyuanDiT2DModel")
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


def test_the_cp_proof_passes_with_a_legacy_text_mask_mended_and_fails_without_it(tmp_path):
    """SanaWMLTX2Refiner (no pipeline: planned transformer-only) splits its text at every block and its cross-
    attention sizes the text mask with `prepare_attention_mask`. Its derived fixture masks 2 of 6 text tokens. With
    the mask kept whole and its head rows cut at the wrapped dispatcher, Ulysses agrees with the 1-process run; with
    the `prepare_attention_mask` wrapper made a no-op, the mask is padded to the wrong length and the proof fails at
    the first cross-attention, which is what the refusal had guarded against."""
    from integrate.records import to_json

    model = tmp_path / "m" / "transformer"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"_class_name": "SanaWMLTX2RefinerTransformer3DModel",
                                                    "_diffusers_version": "0.42.1"}))
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    api.write_plan(api.plan(api.flags_for(str(tmp_path / "m"), no_pipeline=True, separate_cfg="no"), probe=False),
                   plan_dir)
    api.approve(plan_dir, "test")
    api.generate(plan_dir, out=out)
    planner = next(out.glob("integrate_*/cp_planner.py"))
    assert "MASK_PREPARED = " in planner.read_text() and "MASK_MEND = " in planner.read_text()
    report = to_json(api.verify(plan_dir, out, proofs=("cp",)))
    assert "_mask(" in (out / "verify_fixture.py").read_text()
    assert report["cp"]["status"] == "pass", report["cp"]
    assert report["cp"]["variants"]["ulysses2"]["status"] == "pass"

    text = planner.read_text()
    planner.write_text(text.replace("target_length = attention_mask.shape[-1]", "pass"))
    broken = to_json(api.verify(plan_dir, out, proofs=("cp",)))["cp"]
    assert broken["status"] in ("fail", "error"), broken
    assert broken["variants"]["ulysses2"]["first_divergence"]["module"].endswith(".attn2"), broken


def test_a_direct_sdpa_call_through_an_alias_of_torch_functional_is_routed_not_refused(tmp_path):
    """CogVideoX's processor calls `F.scaled_dot_product_attention` itself, where no hook reaches; cache-dit's own
    planner rewrites the processor by hand to call its dispatcher. The plan finds the alias (`F`, bound to
    torch.nn.functional in diffusers' attention_processor.py) and routes the call instead of refusing CP. A
    processor whose walk is passed a mask keeps the refusal (the routed call fits no mask): Lumina2's; a legacy
    `prepare_attention_mask` keeps its own (PixArt)."""
    cp = _cp(tmp_path, "CogVideoXPipeline", "CogVideoXTransformer3DModel")
    assert not cp.blocked_by, [e.why for e in cp.blocked_by]
    (mend,) = cp.sdpa_mend
    assert (mend.module, mend.alias, mend.attentions) == ("diffusers.models.attention_processor", "F",
                                                          ("transformer_blocks.*.attn1",))
    assert mend.at[0].file.endswith("attention_processor.py") and mend.at[0].line > 0
    lumina = _cp(tmp_path, "Lumina2Pipeline", "Lumina2Transformer2DModel")
    assert any("calls `F.scaled_dot_product_attention` directly" in e.why for e in lumina.blocked_by)
    assert not any(p.startswith("layers.") for x in lumina.sdpa_mend for p in x.attentions)
    pixart = _cp(tmp_path, "PixArtSigmaPipeline", "PixArtTransformer2DModel")
    assert any("prepare_attention_mask" in e.why for e in pixart.blocked_by)


def test_the_cp_proof_passes_with_the_sdpa_call_routed_and_fails_without_it(tmp_path):
    """DiT's blocks run diffusers' AttnProcessor2_0, whose kernel is `F.scaled_dot_product_attention`. Our planner
    replaces cache-dit's own (which rewrites that processor by hand). Routed, the Ulysses run agrees with the
    1-process run; with the routing switched off each rank attends within its own half of the tokens and the
    proof fails at the first attention."""
    from integrate.records import to_json

    model = make_model_dir(tmp_path / "dit", "DiTPipeline", "DiTTransformer2DModel")
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    api.write_plan(api.plan(api.flags_for(str(model)), probe=False), plan_dir)
    api.approve(plan_dir, "test")
    api.generate(plan_dir, out=out, replace_builtin=True)
    planner = next(out.glob("integrate_*/cp_planner.py"))
    assert "SDPA_MEND = " in planner.read_text()
    report = to_json(api.verify(plan_dir, out, proofs=("cp",)))["cp"]
    assert report["variants"]["ulysses2"]["status"] == "pass", report
    planner.write_text(planner.read_text().replace("        _mend_sdpa(transformer, SDPA_MEND)\n", ""))
    broken = to_json(api.verify(plan_dir, out, proofs=("cp",)))["cp"]
    assert broken["variants"]["ulysses2"]["status"] in ("fail", "error"), broken
    assert ".attn1" in broken["variants"]["ulysses2"]["first_divergence"]["module"], broken


def test_an_attention_module_whose_own_forward_calls_sdpa_is_not_routed(tmp_path):
    """A reference model's attention module calls `F.scaled_dot_product_attention` in its own forward, with no
    processor: cache-dit hands its parallel config to processors only, so nothing could switch the routed call on,
    and each rank would attend within its shard. The plan keeps the refusal, with the line."""
    from conftest import ROOT, run_cli

    src = ROOT / "tests" / "fixtures" / "ropetable" / "model.py"
    out = run_cli("plan", str(src), "--model-path", str(tmp_path), "--transformer-class", "TableDiT",
                  "--pipeline-class", "sample", "--pipeline-file", str(src), "--out", str(tmp_path / "plan"),
                  "--no-probe", "--json")
    assert out.returncode == 0, out.stderr
    cp = json.loads(out.stdout)["parallelism"]["cp"]
    assert cp["sdpa_mend"] == []
    assert any("calls `F.scaled_dot_product_attention` directly" in e["why"] for e in cp["blocked_by"])
