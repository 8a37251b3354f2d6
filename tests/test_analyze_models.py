"""Specific findings on installed diffusers 0.42.1 sources, each one a behaviour the skill names."""

from conftest import block_list


def test_ltx2_keyword_call_is_pitfall_a(analysis):
    bl = block_list(analysis("LTX2Pipeline", "LTX2VideoTransformer3DModel"), "transformer_blocks")
    assert bl["forward_pattern"] == "Pattern_0"
    assert bl["roles"]["encoder_hidden_states"] == "audio_hidden_states"  # the second stream, by position
    assert bl["call_site"]["keyword_positional_mismatch"] is True
    p0 = next(b for b in bl["call_site"]["bindings"] if b["pattern"] == "Pattern_0")
    assert not p0["binds"] and "audio_hidden_states" in (p0["error"] or "") + " ".join(p0["changed"])
    assert bl["check_forward_pattern"] is False
    ops = bl["call_site"]["loop_extra_ops"]
    assert any(op["kind"] == "index_dependent" and op["active_by_default"] for op in ops)


def test_ernie_loop_body_is_pitfall_b_hoistable(analysis):
    data = analysis("ErnieImagePipeline", "ErnieImageTransformer2DModel")
    bl = block_list(data, "layers")
    ops = bl["call_site"]["loop_extra_ops"]
    assert [op["kind"] for op in ops] == ["hoistable"]
    assert ops[0]["code"].startswith("temb = [")
    assert data["transformer"]["needs_patch_functor"] is True
    # third-party-style names: `x` is the hidden stream, so cache-dit's name check must be off
    assert bl["roles"]["hidden_states"] == "x" and bl["check_forward_pattern"] is False


def test_flux_controlnet_injection_is_reported_but_inactive(analysis):
    bl = block_list(analysis("FluxPipeline", "FluxTransformer2DModel"), "transformer_blocks")
    ops = bl["call_site"]["loop_extra_ops"]
    assert ops and all(not op["active_by_default"] for op in ops)
    assert any(op["kind"] == "index_dependent" for op in ops)


def test_flux2_single_blocks_take_no_text_stream(analysis):
    bl = block_list(analysis("Flux2Pipeline", "Flux2Transformer2DModel"), "single_transformer_blocks")
    assert bl["forward_pattern"] == "Pattern_3"
    assert not bl["forward"]["returns_agree"]  # two return statements, chosen by split_hidden_states


def test_motif_video_decoder_split_needs_restructuring(analysis):
    data = analysis("MotifVideoPipeline", "MotifVideoTransformer3DModel")
    single = block_list(data, "single_transformer_blocks")
    walk = " ".join(single["call_site"]["walk"])
    assert "looped over 2 times" in walk and "slice" in walk and "len(single_transformer_blocks)" in walk
    # annotation `-> torch.Tensor` but two values returned: cache-dit's check would reject it
    assert single["forward"]["annotation_agrees"] is False and single["check_forward_pattern"] is False
    assert block_list(data, "transformer_blocks")["forward_pattern"] == "Pattern_0"
    assert data["pipeline"]["has_separate_cfg"] is True  # one call per guider condition
    assert data["already_supported"]["registered"] is False


def test_non_block_lists_are_reported_with_why(analysis):
    data = analysis("MotifVideoPipeline", "MotifVideoTransformer3DModel")
    others = [b for b in data["transformer"]["block_lists"] if not b["is_blocks"]]
    for b in others:
        assert b["why"]


def test_length_config_field(analysis):
    bl = block_list(analysis("FluxPipeline", "FluxTransformer2DModel"), "single_transformer_blocks")
    assert bl["length_config_fields"] == ["num_single_layers"]


def test_cogvideox_batched_cfg(analysis):
    p = analysis("CogVideoXPipeline", "CogVideoXTransformer3DModel")["pipeline"]
    assert p["has_separate_cfg"] is False and p["transformer_calls"] == 1


def test_flux_uncond_call_off_by_default(analysis):
    p = analysis("FluxPipeline", "FluxTransformer2DModel")["pipeline"]
    assert p["has_separate_cfg"] is False
    assert any("false with the defaults" in e["why"] for e in p["evidence"])


def test_statements_fed_by_index_dependent_ones_are_index_dependent_too(analysis):
    """Chroma: `start_idx = 3 * index_block` then `temb = pooled_temb[:, start_idx : start_idx + 3]`: both vary
    with the block, so neither may be hoisted out of the loop."""
    data = analysis("ChromaPipeline", "ChromaTransformer2DModel")
    ops = block_list(data, "single_transformer_blocks")["call_site"]["loop_extra_ops"]
    temb = next(op for op in ops if op["code"].startswith("temb = pooled_temb"))
    assert temb["kind"] == "index_dependent"


def test_a_second_transformer_in_the_loop_is_another_model_not_a_second_call(analysis):
    """Ideogram4's loop calls `self.transformer` for the conditional branch and `self.unconditional_transformer`
    for the other: each model runs once per step, so neither is a separate-CFG model, and the second one is
    named (cache-dit needs it as another BlockAdapter entry)."""
    p = analysis("Ideogram4Pipeline", "Ideogram4Transformer2DModel")["pipeline"]
    assert p["has_separate_cfg"] is False and p["transformer_calls"] == 1
    (other,) = p["other_models"]
    assert other["why"].startswith("`self.unconditional_transformer` is a second model") and other["line"] > 0


def test_two_calls_of_one_model_chosen_per_step_are_still_separate_cfg(analysis):
    """Wan 2.2 picks `current_model` (transformer or transformer_2) per step and calls it for cond and uncond:
    two calls of one model, whichever it is."""
    p = analysis("WanPipeline", "WanTransformer3DModel")["pipeline"]
    assert p["has_separate_cfg"] is True and not p["other_models"]


def test_a_loop_around_the_step_loop_is_not_one_call_per_guidance_condition(analysis):
    """AnyFlowFAR denoises chunk by chunk: `for chunk_idx in ...: for i, t in enumerate(tqdm(timesteps)):`.
    The step loop is the one over the schedule; inside it one call on `torch.cat([chunk_latents] * 2)`:
    batched CFG, not separate forwards."""
    p = analysis("AnyFlowFARPipeline", "AnyFlowFARTransformer3DModel")["pipeline"]
    assert p["has_separate_cfg"] is False and p["transformer_calls"] == 1
    assert "timesteps" in p["evidence"][0]["why"] and "doubled for CFG" in p["evidence"][-1]["why"]


def test_a_block_called_with_a_literal_argument_list_spread_into_it_is_read(analysis):
    """Kandinsky6: `args = (visual_embed, audio_embed, ...)`, then `visual_embed, audio_embed = block(*args)`
    (or its checkpointed twin). The spread list is the call's arguments: a chain of blocks with a pattern,
    and the `args = ...` statement is part of the call, not a loop-body statement the wrapper would skip."""
    data = analysis("Kandinsky6TI2VAPipeline", "Kandinsky6Transformer3DModel")
    bl = block_list(data, "visual_transformer_blocks")
    assert bl["is_blocks"] is True and bl["forward_pattern"] == "Pattern_0", bl["why"]
    assert not data["transformer"]["needs_patch_functor"], data["transformer"]["patch_functor_reasons"]


def test_a_list_length_read_only_under_an_optional_input_needs_no_patch_functor(analysis):
    """Flux and QwenImage read `len(self.transformer_blocks)` only inside `if controlnet_block_samples is not
    None:` (an input that defaults to None): a default call never runs it, so it asks for no PatchFunctor, as
    pitfall B treats its guarded statements. SD3 reads it the same way beside an index-dependent statement
    that does run, which still asks for one."""
    for pipeline, transformer in (("FluxPipeline", "FluxTransformer2DModel"),
                                  ("QwenImagePipeline", "QwenImageTransformer2DModel")):
        t = analysis(pipeline, transformer)["transformer"]
        assert t["needs_patch_functor"] is False, t["patch_functor_reasons"]
    sd3 = analysis("StableDiffusion3Pipeline", "SD3Transformer2DModel")["transformer"]
    assert sd3["needs_patch_functor"] is True
    assert not any("len(" in r for r in sd3["patch_functor_reasons"]), sd3["patch_functor_reasons"]


def test_three_calls_a_step_leave_the_cfg_style_unknown(analysis):
    """LTX2's step runs its batched CFG call, then a spatio-temporal and a modality guidance pass, both on with
    the defaults (stg_scale 1.0 > 0, modality_scale 3.0 > 1): three calls, which cache-dit's two-way
    has_separate_cfg cannot describe. The answer is unknown, low, with the reason, not True."""
    p = analysis("LTX2Pipeline", "LTX2VideoTransformer3DModel")["pipeline"]
    assert p["has_separate_cfg"] is None and p["confidence"] == "low", p["evidence"][-1]
    assert p["evidence"][-1]["why"].startswith("3 transformer calls run in one step with the defaults")


def test_a_return_guarded_by_a_sub_module_the_block_does_not_build_cannot_run(analysis):
    """CosmosTransformerBlock returns `(hidden_states, hs_proj)` under `if self.after_proj is not None:` and
    `hidden_states` otherwise; the transformer builds its blocks without `after_proj`, so `__init__` leaves it
    None and only the second return runs: Pattern_2, as cache-dit registers it."""
    bl = block_list(analysis("CosmosTextToWorldPipeline", "CosmosTransformer3DModel"), "transformer_blocks")
    assert bl["forward_pattern"] == "Pattern_2" and bl["confidence"] == "high", bl["notes"]
    assert any("1 of 2 return statements cannot run" in n for n in bl["notes"]), bl["notes"]


def test_a_length_read_under_an_input_compared_with_a_literal_needs_no_patch_functor(analysis):
    """Flux2 reads `len(self.transformer_blocks)` only under `if kv_cache_mode == "extract" and ...:`, and
    `kv_cache_mode` defaults to None, which never equals a literal: inactive on a default call."""
    t = analysis("Flux2Pipeline", "Flux2Transformer2DModel")["transformer"]
    assert t["needs_patch_functor"] is False, t["patch_functor_reasons"]
