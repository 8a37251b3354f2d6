"""CP chart rules on installed diffusers 0.42.1 sources: what each split is planned on, read from the code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_model_dir

from integrate import api


def _plan(tmp_path, pipeline: str, transformer: str):
    return api.plan(api.flags_for(str(make_model_dir(tmp_path / transformer, pipeline, transformer))), probe=False)


def test_a_side_module_is_traced_from_what_its_call_reads_and_its_rank_is_said(tmp_path):
    """WanAnimate's loop joins its face adapter's output into the stream; what feeds the adapter besides the
    stream comes from `face_encoder` and `motion_encoder`. `patch_embedding`, a Conv3d with a 5-D output, is the
    stream's own producer, reached before only through `face_adapter_output.to(device=hidden_states.device)`: it is
    no side module (a [B, S, D] split of it was one cache-dit skips). Modules whose output rank is not read keep
    the 3-D split, said so in the evidence."""
    plan = _plan(tmp_path, "WanAnimatePipeline", "WanAnimateTransformer3DModel")
    sides = {s.module: s.ndim for lf in plan.facts.sequence.lists for s in lf.side_modules}
    assert set(sides) == {"face_encoder", "motion_encoder"}, sides
    cp = plan.parallelism.cp
    assert "patch_embedding" not in cp.plan
    assumed = [e.why for e in cp.evidence if "assumed [B, S, D]" in e.why]
    assert assumed and all(sides[w.split("`")[-2].split(".")[0]] is None for w in assumed if "`" in w), assumed


def test_ring_is_not_planned_where_a_mask_reaches_attention(tmp_path):
    """Ideogram4 passes every block a block-diagonal segment mask, which its processor gives the kernel; the
    installed cache-dit's attention with log-sum-exp (ring attention's merge) raises on any mask. The plan
    says so with both lines, and verify runs no ring variant; Flux (no mask) keeps ring."""
    from integrate.verify.proofs import cp as cp_proof

    plan = _plan(tmp_path, "Ideogram4Pipeline", "Ideogram4Transformer2DModel")
    why = plan.parallelism.cp.ring_blocked_by
    assert [e.file.rsplit("/", 1)[-1] for e in why] == ["transformer_ideogram4.py", "native.py"], why
    assert "`layers[i].attention`" in why[0].why and "log-sum-exp" in why[1].why
    assert "ring2" not in [v["name"] for v in cp_proof.variants(plan)]
    flux = _plan(tmp_path, "FluxPipeline", "FluxTransformer2DModel")
    assert not flux.parallelism.cp.ring_blocked_by and "ring2" in [v["name"] for v in cp_proof.variants(flux)]


def test_a_tuple_built_inline_is_split_element_by_element(tmp_path):
    """Ideogram4 builds `image_rotary_emb = (cos, sin)` in forward and passes it to every block: no hook can
    split it where it is built, and cache-dit splits a tuple input with one spec per element (a single spec
    raised `object of type '_ContextParallelInput' has no len()`)."""
    cp = _plan(tmp_path, "Ideogram4Pipeline", "Ideogram4Transformer2DModel").parallelism.cp
    spec = cp.plan["layers.*"]["image_rotary_emb"]
    assert isinstance(spec, tuple) and len(spec) == 2 and all(s.split_dim == 1 and s.expected_dims == 3 for s in spec)
    assert any("a tuple of 2 tensors built inline" in e.why for e in cp.evidence)


def test_a_text_the_attention_joins_to_its_keys_gets_its_mask_permuted_and_the_proofs_pass(tmp_path):
    """NucleusMoE's image queries attend to `torch.cat([img_key, txt_key])`, the text split at every block, so
    under Ulysses the keys arrive as [img_0, txt_0, img_1, txt_1]; the joint mask travels in the
    `attention_kwargs` dict forward builds. The plan asks for the mask reorder (a joint sequence without two
    streams), the generated planner permutes the mask-named tensors of that dict, ring is not planned, and
    the TP proof passes on the pipeline's own inputs (the router kept whole, the FFN not 0 wide), with its
    mixture-of-experts blocks sharded too: the tiny config keeps every kind of block the full config builds (5
    layers: the first three and the last are dense). The experts choose their tokens over the whole sequence
    (expert-choice routing, capacity from its length), so a rank's half would choose others: the plan runs
    `img_mlp` whole under CP from the first verify (its `topk` line cited), and the CP proof passes (it had
    failed at `img_mlp.experts` until `integrate repair` proposed the same). With 2 dense layers only, as before,
    the proof had passed without ever reaching an expert."""
    import json

    from conftest import run_cli

    model = make_model_dir(tmp_path / "m", "NucleusMoEImagePipeline", "NucleusMoEImageTransformer2DModel")
    plan = _plan(tmp_path, "NucleusMoEImagePipeline", "NucleusMoEImageTransformer2DModel")
    cp = plan.parallelism.cp
    assert cp.mask_reorder.needed and cp.ring_blocked_by
    att = next(a for a in plan.facts.attention if a.block_list == "transformer_blocks")
    assert att.joins_at is not None and "torch.cat([img_key, txt_key]" in att.joins_at.why and att.text_first is False
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    assert run_cli("plan", str(model), "--out", str(plan_dir), "--no-probe").returncode == 0
    assert run_cli("approve", str(plan_dir), "--reviewer", "Ada").returncode == 0
    assert run_cli("generate", str(plan_dir), "--out", str(out)).returncode == 0
    planner = (out / "integrate_nucleus_moe_image" / "cp_planner.py").read_text()
    assert 'holder = bound.arguments.get("attention_kwargs")' in planner
    proc = run_cli("verify", str(plan_dir), "--generated", str(out), "--proof", "cp", "--proof", "tp", "--json")
    r = json.loads(proc.stdout)
    assert set(r["cp"]["variants"]) == {"ulysses2", "ulysses2+cache"}  # no ring: it takes no mask
    assert r["tp"]["status"] == "pass", r["tp"]
    shards = r["tp"]["variants"]["tp2"]["engaged"]["tp"]["shards"]
    assert any(".img_mlp.shared_expert." in s["name"] for s in shards)  # an expert block was built and sharded
    assert "topk" in cp.run_whole["transformer_blocks.*.img_mlp"].why
    assert r["cp"]["status"] == "pass", r["cp"]


def test_a_position_table_flattened_from_its_grid_is_split_on_dim_0_without_a_guessed_rank(tmp_path):
    """Kandinsky6 builds `visual_rope = self.visual_rope_embeddings(...).flatten(0, 2)`: a (frames, height, width)
    grid merged into dim 0, no batch axis, its rank not read statically. It is split on dim 0 at every block with
    no rank check (`expected_dims=None`: cache-dit then splits any rank), not as an assumed [B, S, D] on dim 1."""
    cp = _plan(tmp_path, "Kandinsky6TI2VAPipeline", "Kandinsky6Transformer3DModel").parallelism.cp
    spec = cp.plan["visual_transformer_blocks.*"]["vis_rope"]
    assert (spec.split_dim, spec.expected_dims, spec.split_output) == (0, None, False)
    assert any("merges its leading axes into dim 0" in e.why for e in cp.evidence)


def test_a_position_tuple_a_method_builds_is_split_per_element_and_a_two_stream_block_gathers_both(tmp_path):
    """HunyuanVideoFramepack builds its RoPE pair in `self._pack_history_states` (a method no hook can split)
    and its blocks take `freqs_cis: tuple[torch.Tensor, torch.Tensor]`: each [S, D] table gets its own spec
    (one stream spec on the tuple raised `'_ContextParallelInput' has no len()` in the CP proof). A direct
    kernel call elsewhere (SD3's processor calls F.scaled_dot_product_attention, with no mask passed to its
    blocks) is routed through cache-dit's dispatcher by the planner, with its line."""
    from integrate.decisions.cp import TABLE

    from integrate.decisions.cp import GATHER

    plan = _plan(tmp_path, "HunyuanVideoFramepackPipeline", "HunyuanVideoFramepackTransformer3DModel")
    assert plan.parallelism.cp.plan["transformer_blocks.*"]["freqs_cis"] == (TABLE, TABLE)
    # its single blocks return (hidden_states, encoder_hidden_states) and the output is sliced after them: the
    # gather on the last block takes one spec per returned stream
    assert plan.parallelism.cp.plan["single_transformer_blocks.39"] == (GATHER, GATHER)
    sd3 = _plan(tmp_path, "StableDiffusion3Pipeline", "SD3Transformer2DModel").parallelism.cp
    assert not sd3.blocked_by and sd3.sdpa_mend and sd3.sdpa_mend[0].attentions == ("transformer_blocks.*.attn",)
    assert "F.scaled_dot_product_attention" in sd3.sdpa_mend[0].at[0].why
    flux = _plan(tmp_path, "FluxPipeline", "FluxTransformer2DModel").parallelism.cp
    assert not flux.blocked_by  # its processor goes through dispatch_attention_fn


def test_an_index_built_from_inputs_documented_one_per_row_is_split_on_dim_0(tmp_path):
    """MiniMaxH3 packs video, audio and text rows into one sequence and gives every block
    `adaln_indices = timestep_indices * K + token_tags`, both documented `(seq_len,)`: one value per row, so it
    is split with the rows (dim 0) at every block's input. Left whole, the CP proof failed at the first block
    (9 rows against 18 indices)."""
    import json

    from integrate.decisions.records import Split

    model = tmp_path / "m"
    (model / "transformer").mkdir(parents=True)
    (model / "transformer" / "config.json").write_text(json.dumps(
        {"_class_name": "MiniMaxH3Transformer3DModel", "_diffusers_version": "0.42.1"}))
    plan = api.plan(api.flags_for(str(model), no_pipeline=True, separate_cfg=False), probe=False)
    cp = plan.parallelism.cp
    assert cp.plan["transformer_blocks.*"]["adaln_indices"] == Split(0, 1, False)
    assert any("documented one value per row" in e.why for e in cp.evidence)
    # `self.norm_out(hidden_states, temb, timestep_indices)` needs every row's index: gather before it
    assert "norm_out" not in cp.plan and any("`self.norm_out` also takes `timestep_indices`" in e.why
                                             for e in cp.evidence)


def _transformer_only(tmp_path, transformer: str):
    folder = tmp_path / transformer / "transformer"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"_class_name": transformer, "_diffusers_version": "0.42.1"}))
    flags = api.flags_for(str(folder.parent), no_pipeline=True, separate_cfg=False)
    return api.plan(flags, probe=False)


@pytest.mark.parametrize("transformer, cut, line", [
    # `self.proj_out(hidden_states[:, 1:])`: the timestep token forward prepended, dropped inside the call
    ("MiniMaxMusic3Transformer1DModel", "hidden_states[:, 1:]", "inside the output module's call"),
    # `x = x[:, self.config.num_memory_tokens :]` on a line of its own, a config attribute as the bound
    ("StableAudio3DiTModel", "x[:, self.config.num_memory_tokens :]", "after the last block"),
])
def test_a_cut_at_a_fixed_position_after_the_blocks_moves_the_gather_to_the_last_block(tmp_path, transformer, cut,
                                                                                       line):
    """A slice of the sequence by a fixed position (the first token, the memory tokens) done on a rank's chunk
    drops that rank's own first tokens: rank 1 lost one of its image tokens and the output came back one short
    (23 of 24). The gather moves to the last block, before the cut, and with it the cached CP run needs the last
    block among the last `Bn` (a gathered output minus the chunk the rank started with)."""
    cp = _transformer_only(tmp_path, transformer).parallelism.cp
    gathers = [k for k, v in cp.plan.items() if not isinstance(v, dict)]
    assert len(gathers) == 1 and gathers[0].startswith("transformer_blocks.") and "proj_out" not in cp.plan
    why = [e.why for e in cp.evidence if e.why.startswith("gather at the last block")]
    assert any(f"`{cut}`" in w and line in w and "(global)" in w for w in why), why
    assert cp.cache_bn_min == 1 and any("`Bn_compute_blocks >= 1`" in r and gathers[0] in r for r in cp.risks)


def test_an_output_module_called_on_the_whole_stream_keeps_its_gather_and_the_cache_keeps_bn_0(tmp_path):
    """Flux's `self.proj_out(hidden_states)` takes the stream as it comes out of the norm: the gather stays on
    `proj_out`, outside every cached list, and nothing is asked of `Bn_compute_blocks`."""
    cp = _plan(tmp_path, "FluxPipeline", "FluxTransformer2DModel").parallelism.cp
    assert "proj_out" in cp.plan and cp.cache_bn_min == 0
    assert not any("Bn_compute_blocks" in r for r in cp.risks)


def test_an_uneven_sequence_is_proved_with_ulysses_anything_over_gloo(tmp_path):
    """MiniMaxMusic3's blocks see 25 tokens (24 frames and a timestep token): Ulysses 2 refuses the odd length,
    and the proof runs again with cache-dit's Ulysses-anything, whose gathers give each rank its own length
    (gloo has no uneven all_gather; verify's worker pads each shard to the longest and trims it back, what NCCL
    gives). With the gather on the last block, before the `[:, 1:]` cut, and the cache run at `Bn_compute_blocks`
    1, every Ulysses variant agrees with the 1-process run."""
    from integrate.records import to_json

    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    api.write_plan(_transformer_only(tmp_path, "MiniMaxMusic3Transformer1DModel"), plan_dir)
    api.approve(plan_dir, "test")
    api.generate(plan_dir, out=out)
    test_file = Path(__file__).parent / "fixtures" / "modeltest" / "test_models_transformer_minimax_music3.py"
    report = to_json(api.verify(plan_dir, out, proofs=("cp",), fixture_from=test_file, trust_code=True))
    variants = report["cp"]["variants"]
    assert variants["ulysses2"]["status"] == "skipped" and "does not divide by 2" in variants["ulysses2"]["why"]
    assert variants["ulysses2+anything"]["status"] == "pass", variants["ulysses2+anything"]
    assert variants["ulysses2+cache+anything"]["status"] == "pass", variants["ulysses2+cache+anything"]
    assert report["cp"]["status"] == "pass"


ROOT = Path(__file__).resolve().parents[1]


def _fixture_plan(tmp_path, name: str, cls: str) -> dict:
    from conftest import run_cli

    src = ROOT / "tests" / "fixtures" / name / "model.py"
    out = run_cli("plan", str(src), "--model-path", str(tmp_path), "--transformer-class", cls, "--pipeline-class",
                  "sample", "--pipeline-file", str(src), "--out", str(tmp_path / cls), "--no-probe", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_grouped_query_attention_through_a_dispatcher_global_is_planned_with_repeated_kv_heads(tmp_path):
    """AceStep's processor calls `dispatch_attention_fn(..., enable_gqa=attn.heads != attn.kv_heads)` with fewer
    key/value heads than query heads; the installed cache-dit's context-parallel attention raises on GQA unless
    the call names a `cp_gqa_strategy`, which diffusers' dispatcher does not pass on. The callee is a global the
    processor's module imports, so the plan wraps it (`kv_expand`: the module and the name, with the processors'
    lines) instead of refusing CP; Flux (no GQA) gets none."""
    cp = _plan(tmp_path, "AceStepPipeline", "AceStepTransformer1DModel").parallelism.cp
    assert not cp.blocked_by and cp.approach == "hook"
    (x,) = cp.kv_expand
    assert (x.module, x.function) == ("diffusers.models.transformers.ace_step_transformer", "dispatch_attention_fn")
    assert x.at and all(e.file.endswith("ace_step_transformer.py") and "(16 query heads, 8 key/value heads)" in e.why
                        for e in x.at)
    assert any("repeats its key/value heads" in e.why for e in cp.evidence)
    assert not _plan(tmp_path, "FluxPipeline", "FluxTransformer2DModel").parallelism.cp.kv_expand


def test_grouped_query_attention_through_a_module_attribute_is_refused_with_both_lines(tmp_path):
    """The same call written `attention_dispatch.dispatch_attention_fn(...)` reaches the dispatcher through
    another module's attribute, which no wrapper of this module's globals changes: CP is refused with the
    processor's line and cache-dit's. The fixture's other class, importing the dispatcher, is planned."""
    refused = _fixture_plan(tmp_path, "gqa", "AttrGqaDiT")["parallelism"]["cp"]
    assert not refused["kv_expand"]
    assert refused["blocked_by"][-1]["file"].endswith("register.py")
    assert "`enable_gqa=True` (4 query heads, 2 key/value heads)" in refused["blocked_by"][0]["why"]
    planned = _fixture_plan(tmp_path, "gqa", "GqaDiT")["parallelism"]["cp"]
    assert not planned["blocked_by"]
    assert [(x["module"], x["function"]) for x in planned["kv_expand"]] == [("gqa.model", "dispatch_attention_fn")]


def test_the_cp_proof_passes_with_grouped_query_attention_over_repeated_kv_heads(tmp_path):
    """AceStep's tiny model from its diffusers test (4 query heads, 2 key/value heads): with the dispatcher
    wrapped, every Ulysses variant agrees with the 1-process run (it had raised inside cache-dit)."""
    from integrate.records import to_json

    model = make_model_dir(tmp_path / "m", "AceStepPipeline", "AceStepTransformer1DModel")
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    api.write_plan(api.plan(api.flags_for(str(model)), probe=False), plan_dir)
    api.approve(plan_dir, "test")
    api.generate(plan_dir, out=out)
    assert "KV_EXPAND = " in (out / "integrate_ace_step" / "cp_planner.py").read_text()
    test_file = Path(__file__).parent / "fixtures" / "modeltest" / "test_models_transformer_ace_step.py"
    report = to_json(api.verify(plan_dir, out, proofs=("cp",), fixture_from=test_file, trust_code=True))
    assert report["cp"]["status"] == "pass", report["cp"]
    assert report["cp"]["variants"]["ulysses2"]["status"] == "pass"


def test_an_attention_with_no_kernel_cp_reaches_refuses_a_walk_split(tmp_path):
    """A linear attention (`relu(q) @ (relu(k)^T v)`, summed over every token) calls no kernel context
    parallelism reaches: on a split walk each rank would attend within its own tokens. The plan refuses it with
    the processor's line, never plans it as if it were reached."""
    cp = _fixture_plan(tmp_path, "linearattn", "LinearDiT")["parallelism"]["cp"]
    (hit,) = cp["blocked_by"]
    assert hit["file"].endswith("linearattn/model.py") and "calls no attention kernel" in hit["why"]
    assert cp["confidence"] == "low"


def test_a_block_that_lays_its_stream_on_a_grid_gets_sub_module_hooks_and_linear_attention_runs_whole(tmp_path):
    """SanaVideo's block unflattens its stream to `(frames, height, width)`, sizes passed in as numbers, for a
    convolution: on a local chunk they no longer multiply up, so only its attention calls are split and gathered.
    Its self-attention is linear (no kernel CP reaches): it runs whole on every rank, said as a risk. Its
    cross-attention sizes its text mask from the key length it sees; passed the text as is, it runs outside CP on
    the rank's split queries, with the text and mask whole (no refusal, no text split). A split gathered after its
    sub-module is offered no "whole" alternative (its gather would then join copies)."""
    plan = _plan(tmp_path, "SanaVideoPipeline", "SanaVideoTransformer3DModel")
    cp = plan.parallelism.cp
    assert not [a for a in plan.alternatives if "transformer_blocks.*.attn2" in a.touches]
    assert cp.shape == "sub-module hooks" and not cp.blocked_by
    assert any("lays the sequence out by `frames`" in e.why for e in cp.evidence)
    assert "transformer_blocks.*.attn1" not in cp.plan and "transformer_blocks.*.attn2" in cp.plan
    assert cp.local_attention == ("transformer_blocks.*.attn2",)
    assert not any("encoder_hidden_states" in hooks for hooks in cp.plan.values() if isinstance(hooks, dict))
    assert any("`transformer_blocks[i].attn1` runs whole on every rank" in r for r in cp.risks)


def test_a_masked_cross_attention_passed_the_text_as_is_runs_outside_cp_and_the_text_stays_whole(tmp_path):
    """StableAudio DiT's attn2 reads `encoder_hidden_states` as its keys and values and sizes the mask from the key
    length it sees: it is kept out of CP and the text is no longer split at every block (its attn1, a masked
    self-attention, still refuses CP). PixArt's attn1 is passed `encoder_hidden_states if
    self.only_cross_attention else None`: it may be self-attention, so it is never made local."""
    cp = _plan(tmp_path, "StableAudioPipeline", "StableAudioDiTModel").parallelism.cp
    assert "transformer_blocks.*.attn2" in cp.local_attention
    assert "encoder_hidden_states" not in cp.plan.get("transformer_blocks.*", {})
    assert [e for e in cp.blocked_by if "].attn1`" in e.why] and not [e for e in cp.blocked_by if "].attn2`" in e.why]
    pixart = _plan(tmp_path, "PixArtSigmaPipeline", "PixArtTransformer2DModel").parallelism.cp
    assert "transformer_blocks.*.attn1" not in pixart.local_attention


def test_a_processor_that_fixes_a_backend_diffusers_runs_without_cp_refuses_cp_with_both_lines(tmp_path):
    """Kandinsky 6 SR's processor calls `dispatch_attention_fn(..., backend=AttentionBackendName.FLEX)` (its
    NABLA block mask, built from the rank's own queries and keys, only flex takes); the installed diffusers
    registers FLEX without context-parallel support, so given the parallel config the dispatcher still attends
    within each rank's shard. CP is refused with the processor's line and the registration's. Kandinsky 6, whose
    processor leaves the backend to the dispatcher, is not."""
    from integrate.analyzers.support import cp_local_backends
    from integrate.resolve import Workspace

    local = cp_local_backends(Workspace())  # read from the installed diffusers' registrations
    assert "FLEX" in local and "FLASH" not in local and "NATIVE" not in local
    assert local["FLEX"].file.endswith("attention_dispatch.py")
    cp = _plan(tmp_path, "Kandinsky6SRPipeline", "Kandinsky6SRTransformer3DModel").parallelism.cp
    fixed = [e for e in cp.blocked_by if "backend=AttentionBackendName.FLEX" in e.why]
    assert fixed and fixed[0].file.endswith("transformer_kandinsky6_sr.py")
    assert local["FLEX"] in cp.blocked_by
    assert not any("backend=" in e.why for e in _plan(tmp_path, "Kandinsky6TI2VAPipeline", "Kandinsky6Transformer3DModel")
                   .parallelism.cp.blocked_by)


def test_an_inline_tuple_of_tables_a_helper_builds_is_split_on_dim_0(tmp_path):
    """AceStep builds `position_embeddings = (cos, sin)` from a module-level helper that returns
    `get_1d_rotary_pos_embed(..., use_real=True, repeat_interleave_real=False)`'s pair: the branch those flags
    take returns `torch.cat([freqs.cos(), freqs.cos()], dim=-1)` of a `torch.outer`, [S, D]. Each element is split
    on dim 0 as a 2-D table (as [B, S, D] on dim 1, cache-dit skipped both splits: expected 3 dims, got 2)."""
    cp = _plan(tmp_path, "AceStepPipeline", "AceStepTransformer1DModel").parallelism.cp
    spec = cp.plan["layers.*"]["position_embeddings"]
    assert isinstance(spec, tuple) and [(s.split_dim, s.expected_dims) for s in spec] == [(0, 2), (0, 2)]
    assert any("[S, D], [S, D], ranks read from the code" in e.why for e in cp.evidence)


def test_a_block_parameter_the_call_leaves_at_its_default_gets_no_split(tmp_path):
    """BriaFibo2's noise refiner calls its blocks without `encoder_hidden_states` (left at None), while its main
    blocks pass the text: the text is split at every main block only (a split planned on the refiner made
    cache-dit's hook look the absent argument up: IndexError in `noise_refiner.0`)."""
    cp = _plan(tmp_path, "BriaFibo2Pipeline", "BriaFibo2Transformer2DModel").parallelism.cp
    assert "encoder_hidden_states" in cp.plan["layers.*"]
    assert "encoder_hidden_states" not in cp.plan.get("noise_refiner.*", {})


def test_attention_outside_every_split_walk_is_kept_out_of_cp_by_the_planner(tmp_path):
    """BriaFibo2's perceiver turns the text into gist tokens with its own attention modules, outside every
    walked block list and on tensors no hook splits; cache-dit hands every attention module the parallel
    config, so under Ulysses the perceiver's cross-attention ran context-parallel over whole tensors (a mask
    of 12 against 6 keys). The plan lists them, the generated planner gives their processors a parallel
    config that stays None, and WanAnimate's face adapter, called inside the block loop on the split stream,
    is not listed."""
    import importlib.util

    import torch

    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    plan = _plan(tmp_path, "BriaFibo2Pipeline", "BriaFibo2Transformer2DModel")
    cp = plan.parallelism.cp
    assert cp.local_attention == ("perceiver.layers.*.cross_attention", "perceiver.layers.*.self_attention")
    assert any("kept out of context parallelism" in e.why and "perceiver" in e.why for e in cp.evidence)
    api.write_plan(plan, plan_dir)
    api.approve(plan_dir, "test")
    api.generate(plan_dir, out=out)
    planner = next(out.glob("*/cp_planner.py"))
    spec = importlib.util.spec_from_file_location("generated_cp_planner", planner)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    class Processor:
        _parallel_config = None

    class Attention(torch.nn.Module):
        def __init__(self, processor):
            super().__init__()
            self.processor = processor

    shared = Processor()
    model = torch.nn.Module()
    model.perceiver = torch.nn.Module()
    model.perceiver.layers = torch.nn.ModuleList([torch.nn.Module() for _ in range(2)])
    for layer in model.perceiver.layers:
        layer.cross_attention, layer.self_attention = Attention(shared), Attention(shared)
    model.block_attention = Attention(shared)
    module._keep_local(model, module.LOCAL_ATTENTION)
    for layer in model.perceiver.layers:
        for attention in (layer.cross_attention, layer.self_attention):
            attention.processor._parallel_config = "cp config"
            assert attention.processor._parallel_config is None and isinstance(attention.processor, Processor)
    model.block_attention.processor._parallel_config = "cp config"  # the shared object itself still takes CP
    assert model.block_attention.processor._parallel_config == "cp config"
    wan = _plan(tmp_path, "WanAnimatePipeline", "WanAnimateTransformer3DModel").parallelism.cp
    assert not any(p.startswith("face_adapter") for p in wan.local_attention)


def test_a_mask_named_input_built_one_value_per_token_is_split_with_the_tokens(tmp_path):
    """BriaFibo2's `noise_mask = torch.zeros(batch_size, hidden_states.shape[1])` marks which tokens are noisy;
    its blocks pick each token's modulation with it and never pass it as an attention mask, so under CP each
    rank needs its own tokens' rows (whole, it broadcast 272 rows against a chunk of 136). It is split on dim 1
    at every block; `attn_mask`, handed to the attention, stays a mask."""
    plan = _plan(tmp_path, "BriaFibo2Pipeline", "BriaFibo2Transformer2DModel")
    spec = plan.parallelism.cp.plan["layers.*"]["noise_mask"]
    assert (spec.split_dim, spec.expected_dims) == (1, 2)
    inputs = {bi.param: bi for lf in plan.facts.sequence.lists if lf.attr == "layers" for bi in lf.inputs}
    assert inputs["noise_mask"].role == "other" and inputs["noise_mask"].per_token is not None
    assert inputs["attn_mask"].role == "mask" and inputs["attn_mask"].per_token is None


def test_a_forward_input_is_split_at_the_root_as_per_token_conditioning_only_when_it_is_2d(tmp_path):
    """Kandinsky6 reads `audio_hidden_states.shape[1]` for its audio RoPE and builds its text branches from
    `encoder_hidden_states`; both are documented 3-D sequences, and the audio one already reaches the fused
    blocks as a stream split at block 0. Splitting them at the root as 2-D per-token tensors was a split
    cache-dit skipped (expected 2 dims, got 3) and, where it ran, a second split of the audio stream. Wan's
    pipeline passes a 2-D per-token `timestep`: that one is still split at the root."""
    k6 = _plan(tmp_path, "Kandinsky6TI2VAPipeline", "Kandinsky6Transformer3DModel").parallelism.cp
    assert not k6.plan.get("")
    assert any("`encoder_hidden_states` is 3-D as passed or documented" in e.why for e in k6.evidence)
    assert not any("split `audio_hidden_states` at the root" in e.why for e in k6.evidence)
    wan = _plan(tmp_path, "WanPipeline", "WanTransformer3DModel").parallelism.cp
    assert (wan.plan[""]["timestep"].split_dim, wan.plan[""]["timestep"].expected_dims) == (1, 2)


def test_a_position_module_whose_layout_is_not_read_is_split_on_dim_0_without_a_rank_check(tmp_path):
    """Kandinsky6's audio RoPE returns `rope.view(*rope.shape[:-1], 2, 2).unsqueeze(-4)`, [S, 1, D/2, 2, 2],
    a layout the last-reshape reader does not read. A guessed rank of 2 made cache-dit skip the split (expected
    2 dims, got 5) and the whole table met a split stream in the audio self-attention. Positions first, no rank
    check: the CP proof then passes on the pipeline's inputs. A layout that is read keeps its rank (Wan's
    `reshape(1, f * h * w, 1, -1)`: dim 1 of 4)."""
    k6 = _plan(tmp_path, "Kandinsky6TI2VAPipeline", "Kandinsky6Transformer3DModel")
    assert "audio_rope_embeddings" in k6.facts.position_modules
    spec = k6.parallelism.cp.plan["audio_rope_embeddings"]["0"]
    assert (spec.split_dim, spec.expected_dims, spec.split_output) == (0, None, True)
    wan = _plan(tmp_path, "WanPipeline", "WanTransformer3DModel").parallelism.cp.plan["rope"]["0"]
    assert (wan.split_dim, wan.expected_dims) == (1, 4)


def test_a_side_module_is_traced_through_data_not_through_a_device_or_dtype_read(tmp_path):
    """ConsisID's loop joins `perceiver_cross_attention[i](valid_face_emb, hidden_states)` into the stream, and
    `valid_face_emb` comes from `id_cond.to(device=hidden_states.device, dtype=hidden_states.dtype)`: reading
    `hidden_states.device` takes no data from the stream, yet the trace followed it back to the stream's own
    producers (`patch_embed`, `embedding_dropout`) and split their outputs on top of the split at block 0 (the
    CP proof failed in the final reshape). The stream's producers are no side modules: only the face extractor is."""
    cp = _plan(tmp_path, "ConsisIDPipeline", "ConsisIDTransformer3DModel").parallelism.cp
    assert "patch_embed" not in cp.plan and "embedding_dropout" not in cp.plan
    assert set(cp.plan["transformer_blocks.0"]) == {"hidden_states", "encoder_hidden_states"}


def test_attention_cache_dit_gives_no_parallel_config_gets_it_from_the_planner(tmp_path):
    """tests/fixtures/gqa's `GqaModel` runs its attention through a processor in a plain `nn.Module` (no diffusers
    attention class): cache-dit never sets that processor's parallel config, so under Ulysses each rank attended
    within its own tokens and the CP proof diverged at `blocks.0.attn`. The plan names the module (`hand_config`,
    with the class chain and cache-dit's list as evidence), the planner hands the config over, and CP agrees with
    one process. diffusers' own models are untouched (their classes derive from the listed ones)."""
    from conftest import ROOT

    from integrate import api

    src = ROOT / "tests" / "fixtures" / "gqa" / "model.py"
    (tmp_path / "m").mkdir()
    flags = api.flags_for(None, model_path=str(tmp_path / "m"), transformer_class="GqaModel",
                          transformer_file=str(src), pipeline_class="sample", pipeline_file=str(src))
    plan = api.plan(flags, probe=False)
    cp = plan.parallelism.cp
    assert cp.hand_config == ("blocks.*.attn",), cp.hand_config
    assert any("no class cache-dit hands the parallel config" in e.why and "torch.nn.Module" in e.why
               for e in cp.evidence), cp.evidence
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    api.write_plan(plan, plan_dir)
    api.approve(plan_dir, "test")
    api.generate(plan_dir, out=out)
    report = api.verify(plan_dir, out, proofs=("cp",), trust_code=True)
    assert report.cp.status == "pass" and report.cp.variants["ulysses2"].status == "pass", report.cp


def test_a_split_axis_shorter_than_the_ranks_is_said_as_such(tmp_path):
    """A fixture whose sequence is one token long (diffusers' TransformerTemporal test passes one frame): cache-dit's
    uneven split refuses an axis shorter than the ranks. verify says what that means, both ways it can arise (the
    fixture too short to prove CP, or a plan that splits an axis that is not the sequence), not only the assertion."""
    import re

    from conftest import ROOT

    from integrate import api

    src = ROOT / "tests" / "fixtures" / "gqa" / "model.py"
    (tmp_path / "m").mkdir()
    flags = api.flags_for(None, model_path=str(tmp_path / "m"), transformer_class="GqaModel",
                          transformer_file=str(src), pipeline_class="sample", pipeline_file=str(src))
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    api.write_plan(api.plan(flags, probe=False), plan_dir)
    api.approve(plan_dir, "test")
    api.generate(plan_dir, out=out)
    assert api.verify(plan_dir, out, fixture_only=True, trust_code=True).fixture.status == "derived"
    fixture = out / "verify_fixture.py"
    text, n = re.subn(r"_randn\('hidden_states', 1, \d+, ", "_randn('hidden_states', 1, 1, ", fixture.read_text())
    assert n == 1, "the fixture builds `hidden_states` as [1, S, D]"
    fixture.write_text(text)  # an edited fixture is used as it is
    cp = api.verify(plan_dir, out, proofs=("cp",), trust_code=True).cp
    assert cp.status == "error" and "shorter than the ranks" in cp.why and "not the sequence" in cp.why, cp.why
