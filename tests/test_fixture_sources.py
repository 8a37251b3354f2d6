"""Where a fixture's inputs come from, and the promise that a fixture called derived has run the plain model.

Real runs: the installed diffusers 0.42.1 pipelines and transformers, tiny random-weight models, workers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import EXAMPLE, make_model_dir, plan_generate, run_cli, transformer_only, verify_json

from integrate.verify.proofs import full_size


@pytest.fixture(scope="module")
def motif(tmp_path_factory):
    return plan_generate(EXAMPLE, tmp_path_factory.mktemp("motif"))


def test_the_inputs_are_what_the_models_own_pipeline_passes(motif):
    plan_dir, out = motif
    rc, r = verify_json(plan_dir, out, "--fixture-only")
    fx = r["fixture"]
    assert rc == 0 and fx["status"] == "derived" and fx["source"] == "pipeline", fx
    # model_index.json names the scheduler and the guider: they are built as named, not stood in for; the
    # tokenizer it names has no files here, so a stand-in is (and is said to be)
    notes = fx.get("notes", [])
    assert not any(n.startswith(("`scheduler`", "`guider`")) for n in notes), notes
    assert any(n.startswith("`tokenizer`: a word-level tokenizer") for n in notes), notes
    assert (out / "verify_fixture.pt").is_file()
    text = (out / "verify_fixture.py").read_text()
    assert "_saved(step, 'encoder_attention_mask')" in text and ": _fill_in(" not in text
    assert isinstance(fx["image_tokens"], int) and fx["image_tokens"] != fx["text_tokens"]
    assert all(r[p]["status"] == "skipped" for p in ("cache", "cp", "tp", "full_size"))


def test_a_component_the_model_folder_does_not_name_is_a_reported_stand_in(tmp_path):
    model = make_model_dir(tmp_path / "m", "MotifVideoPipeline", "MotifVideoTransformer3DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    rc, r = verify_json(plan_dir, out, "--fixture-only")
    fx = r["fixture"]
    assert rc == 0 and fx["source"] == "pipeline"
    assert any("scheduler" in n and "stand-in" in n for n in fx["notes"]), fx["notes"]


def test_an_edit_the_plain_model_rejects_is_needs_edit_and_names_the_module(motif, tmp_path):
    plan_dir, out = motif
    edited = tmp_path / "out"
    shutil.copytree(out, edited)
    path = edited / "verify_fixture.py"
    text = path.read_text()
    assert "\"hidden_states\": _saved(step, 'hidden_states')," in text
    path.write_text(text.replace("\"hidden_states\": _saved(step, 'hidden_states'),",
                                 "\"hidden_states\": _saved(step, 'hidden_states')[:, :5],"))
    rc, r = verify_json(plan_dir, edited, "--fixture-only")
    fx = r["fixture"]
    assert rc == 1 and fx["status"] == "needs-edit"
    assert "does not run on it" in fx["errors"][0] and "in module `" in fx["errors"][0], fx["errors"]


def test_a_fixture_is_not_derived_unless_the_plain_model_ran_on_it(tmp_path):
    """AceStep planned alone (no pipeline to capture from): the statically synthesised inputs do not fit the context
    its forward joins to the latent before the input convolution: needs-edit, with the exception, in the report and
    in the fixture file. (From its model folder, with its pipeline, it derives: tests/test_model_folder_standins.py.)"""
    rc, fx, out = _transformer_only(tmp_path, "AceStepTransformer1DModel")
    assert rc == 1 and fx["status"] == "needs-edit" and fx["source"] == "static", fx
    assert "the plain tiny model does not run on it" in fx["errors"][0]
    assert "the plain tiny model does not run on it" in (out / "verify_fixture.py").read_text()


# -- full size ------------------------------------------------------------------------------------------------


def test_full_size_passes_where_the_real_lists_and_heads_fit(motif):
    plan_dir, out = motif
    rc, r = verify_json(plan_dir, out, "--proof", "full_size")
    fs = r["full_size"]
    assert rc == 0 and fs["status"] == "pass", fs
    assert {x["attr"]: x["blocks"] for x in fs["lists"]} == {"transformer_blocks": 20, "single_transformer_blocks": 40}
    assert all(x["fn_compute_blocks"] >= 1 for x in fs["lists"])
    assert fs["heads"] and all(h["value"] == 24 and all(h["divides"].values()) for h in fs["heads"])
    assert fs["not_checked"]


def test_lists_shorter_than_cache_dits_defaults_are_left_uncached_and_full_size_agrees(tmp_path):
    """Lumina2: its two refiner lists have 2 blocks each at full size; cache-dit asserts Fn_compute_blocks
    (8 by default, read from its source) <= a cached list's length when the cache starts, which no tiny model
    can show. The plan leaves them out (as cache-dit's own Lumina adapter does) and says why; the full-size
    proof then passes on what is cached."""
    model = make_model_dir(tmp_path / "m", "Lumina2Pipeline", "Lumina2Transformer2DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    cache = json.loads((plan_dir / "plan.json").read_text())["cache"]
    assert [b["attr"] for b in cache["block_lists"]] == ["layers"]
    assert {u["attr"] for u in cache["uncached"]} == {"noise_refiner", "context_refiner"}
    assert all("Fn_compute_blocks 8" in u["why"] and "cache_config.py:" in u["why"] for u in cache["uncached"])
    assert "is not cached" in (plan_dir / "PLAN.md").read_text()
    rc, r = verify_json(plan_dir, out, "--proof", "full_size")
    fs = r["full_size"]
    assert rc == 0 and fs["status"] == "pass" and [x["attr"] for x in fs["lists"]] == ["layers"], fs


def test_full_size_judges_heads_by_the_least_size_and_reports_the_rest():
    result = {"fn": 8, "bn": 0, "lists": {"blocks": 12},
              "heads": [{"block_list": "blocks", "module": "attn", "attr": "heads", "value": 12},
                        {"block_list": "blocks", "module": "attn", "attr": "kv_heads", "value": 3}]}
    proof = full_size.judge(result, None)
    assert proof.status == "fail" and "kv_heads` = 3 does not divide by 2" in proof.why
    twelve = proof.heads[0].divides
    assert twelve["tp4"] and not twelve["tp8"] and twelve["ulysses2"]
    assert full_size.judge({"fn": 8, "bn": 0, "lists": {"blocks": 7}, "heads": []}, None).status == "fail"
    assert full_size.judge(None, "boom").status == "error"


# -- a diffusers-style model test -----------------------------------------------------------------------------

MODEL_TESTS = Path(__file__).parent / "fixtures" / "modeltest"


def test_a_model_test_file_comes_first_and_keeps_two_blocks_per_list(motif, tmp_path):
    plan_dir, out = motif
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    (copy / "verify_fixture.py").unlink(missing_ok=True)
    test_file = MODEL_TESTS / "test_models_transformer_motif_video.py"
    rc, r = verify_json(plan_dir, copy, "--fixture-from", str(test_file), "--trust-code", "--proof", "cache")
    fx = r["fixture"]
    assert fx["status"] == "derived" and fx["source"] == "test-file" and fx["tried"] == [], fx
    assert fx["changes"] == {"num_layers": [1, 2]}  # the authors' config, a one-block list made two
    assert fx["text_tokens"] == 10 and fx["image_tokens"] == 2 * 4 * 4
    text = (copy / "verify_fixture.py").read_text()
    assert "from the model test test_models_transformer_motif_video.py" in text
    # the test leaves `return_dict` at True; the fixture asks for a tuple, as pipelines do (a root split hook
    # raises on a `Transformer2DModelOutput`)
    assert "the output as a tuple, as pipelines ask" in text
    assert rc == 0 and r["cache"]["status"] == "pass", r["cache"].get("why")


def test_a_model_test_runs_only_when_trusted_and_only_for_its_own_class(motif, tmp_path):
    plan_dir, out = motif
    proc = run_cli("verify", str(plan_dir), "--generated", str(out), "--fixture-only", "--fixture-from",
                   str(MODEL_TESTS / "test_models_transformer_motif_video.py"))
    assert proc.returncode == 2 and "--trust-code" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    (copy / "verify_fixture.py").unlink(missing_ok=True)
    rc, r = verify_json(plan_dir, copy, "--fixture-only", "--trust-code", "--fixture-from",
                    str(MODEL_TESTS / "test_models_transformer_other.py"))
    fx = r["fixture"]
    assert fx["source"] != "test-file" and "tests FluxTransformer2DModel, not MotifVideo" in fx["tried"][0]


def test_a_union_typed_component_is_tried_member_by_member_until_the_pipeline_runs(tmp_path):
    """SanaVideoPipeline types its VAE `AutoencoderDC | AutoencoderKLLTX2Video | AutoencoderKLWan` and
    model_index.json names none: the first members do not take the pipeline to its transformer, a later one
    does, and the note says which (resolution binning is off, so the small size stays small)."""
    model = make_model_dir(tmp_path / "m", "SanaVideoPipeline", "SanaVideoTransformer3DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    rc, r = verify_json(plan_dir, out, "--fixture-only")
    fx = r["fixture"]
    assert rc == 0 and fx["status"] == "derived" and fx["source"] == "pipeline", fx
    assert any(n.startswith("`vae`: ") and "union" in n for n in fx["notes"]), fx["notes"]


def test_static_inputs_follow_module_dict_entries_and_nested_shape_annotations():
    """Static synthesis reads what the forward says: `self.x_embedders["image"](hidden_states)` is the module
    that sizes the latent (Flux3), and `img_shapes: list[list[tuple[int, int, int]]]` gets one list of grids
    per sample (QwenImage21)."""
    import diffusers

    def slots(cls):
        return _static_slots(cls, {})[1]

    flux3 = slots(diffusers.Flux3Transformer2DModel)["hidden_states"]
    assert "x_embedders.image" in flux3.why and flux3.error is None
    shapes = slots(diffusers.QwenImage21Transformer2DModel)["img_shapes"]
    assert shapes.expr.startswith("[[(") and shapes.expr.endswith("]] * 1")


def _derived_from_pipeline(tmp_path, pipeline: str, transformer: str) -> dict:
    model = make_model_dir(tmp_path / "m", pipeline, transformer)
    plan_dir, out = plan_generate(model, tmp_path)
    rc, r = verify_json(plan_dir, out, "--fixture-only")
    fx = r["fixture"]
    assert rc == 0 and fx["status"] == "derived" and fx["source"] == "pipeline", fx
    return fx


def test_a_pipeline_that_takes_no_prompt_embeddings_gets_a_stand_in_text_encoder(tmp_path):
    """LongCatAudioDiTPipeline encodes its prompt itself (UMT5): the encoder is its own class, narrowed to the
    width the tiny transformer takes, and the tokenizer a word-level stand-in; both are said."""
    fx = _derived_from_pipeline(tmp_path, "LongCatAudioDiTPipeline", "LongCatAudioDiTTransformer")
    assert any(n.startswith("`text_encoder`: UMT5EncoderModel") and "stand-in" in n for n in fx["notes"]), fx
    assert any(n.startswith("`tokenizer`: ") for n in fx["notes"])


def test_a_processor_the_pipelines_constructor_uses_stands_in_and_its_own_kv_cache_is_off(tmp_path):
    """QwenImage21Pipeline reads its system prompt's token count through `processor.apply_chat_template` in
    `__init__` (the processor had been left out as None, so the pipeline was never built), and it hands the
    transformer a prefix KV cache object unless `use_kv_cache=False`: the processor is a text-only stand-in,
    the cache is turned off, both are said, and the fixture comes from the pipeline."""
    fx = _derived_from_pipeline(tmp_path, "QwenImage21Pipeline", "QwenImage21Transformer2DModel")
    assert any(n.startswith("`processor`: a text-only stand-in for Qwen3VLProcessor") for n in fx["notes"]), fx
    assert any(n.startswith("`use_kv_cache`: False") for n in fx["notes"]), fx["notes"]


def test_input_widths_the_pipeline_joins_are_scaled_together(tmp_path):
    """BriaFiboPipeline joins two of its text encoder's layers into one embedding: with every input width made
    the same, nothing fits; scaled together (the real ratio of 2 kept), with the encoder half the text width,
    the plain model runs, and the notes say both."""
    fx = _derived_from_pipeline(tmp_path, "BriaFiboPipeline", "BriaFiboTransformer2DModel")
    assert fx["tried"] and fx["tried"][0].startswith("pipeline: the plain tiny model does not run"), fx["tried"]
    assert any("scaled down together" in n for n in fx["notes"]) and any("1/2" in n for n in fx["notes"]), fx
    joint, text = fx["changes"]["joint_attention_dim"][1], fx["changes"]["text_encoder_dim"][1]
    assert joint == 2 * text


def test_widths_a_pipeline_component_is_built_to_are_kept(tmp_path):
    """StableAudio3Pipeline builds its duration embedder from its own defaults (768 wide) and joins it to the
    prompt embeddings: the conditioning widths stay the real ones, the model's own width still shrinks."""
    fx = _derived_from_pipeline(tmp_path, "StableAudio3Pipeline", "StableAudio3DiTModel")
    assert any("the real config's: the pipeline's components are sized to them" in n for n in fx["notes"]), fx
    assert "cond_token_dim" not in fx["changes"] and fx["changes"]["embed_dim"][1] < 1536


def test_a_model_nobody_integrated_passes_tp_on_the_pipelines_own_inputs(tmp_path):
    """LongCatAudioDiT end to end: fixture from its pipeline (a stand-in UMT5 encodes the prompt), its
    `q_norm` / `k_norm` over all heads distributed by the generated planner, and TP 2 agreeing with the
    1-process run."""
    model = make_model_dir(tmp_path / "m", "LongCatAudioDiTPipeline", "LongCatAudioDiTTransformer")
    plan_dir, out = plan_generate(model, tmp_path)
    rc, r = verify_json(plan_dir, out, "--proof", "tp")
    assert r["fixture"]["source"] == "pipeline" and r["tp"]["status"] == "pass", r["tp"]


# Each row: a model whose pipeline stopped before its transformer (or whose plain model refused the captured
# inputs) until a rule of capture or of the tiny config covered its case; the note the rule writes is the
# evidence that it, and not luck, made the fixture run.
CAPTURE_RULES = [
    # the class defaults leave in_channels / patch_size None; a second text encoder's embeddings
    # (`prompt_embeds_2`) sized from the module the transformer feeds its second text input to
    ("HunyuanDiTPipeline", "HunyuanDiT2DModel", "the class defaults leave `in_channels`, `patch_size` unset"),
    # `prompt_embeds: list[torch.FloatTensor]`, and guidance on at any scale: the pipeline asks for negatives
    ("ZImagePipeline", "ZImageTransformer2DModel", "stopped without negative embeddings"),
    # the model refuses a tokenizer's integer mask; the pipeline's own encoding would have cast it
    ("ChromaPipeline", "ChromaTransformer2DModel", "refuses the captured integer masks"),
    # `KarrasDiffusionSchedulers`: an enum of scheduler classes, its first member; `class_labels` required
    ("DiTPipeline", "DiTTransformer2DModel", "DDIMScheduler, the first of KarrasDiffusionSchedulers"),
    # the VAE built from its defaults makes 4 latent channels; the class defaults say 16: theirs is taken
    ("PRXPipeline", "PRXTransformer2DModel", "the tiny config takes theirs"),
]


@pytest.mark.parametrize(("pipeline", "transformer", "note"), CAPTURE_RULES,
                         ids=[row[1] for row in CAPTURE_RULES])
def test_capture_rules_that_take_a_pipeline_to_its_transformer(tmp_path, pipeline, transformer, note):
    fx = _derived_from_pipeline(tmp_path, pipeline, transformer)
    assert any(note in n for n in fx.get("notes", [])), fx.get("notes")


def test_a_derived_fixture_is_reused_only_while_its_job_and_sources_are_unchanged(motif):
    """A second verify reuses the fixture derived from the same job: the record beside it (a report edited here
    comes back as it is) names the model's source files with their hashes, which are part of the job's key; a
    record whose key is not the job's is ignored and the fixture derived anew."""
    import hashlib

    plan_dir, out = motif
    rc, first = verify_json(plan_dir, out, "--fixture-only")
    meta_path = out / "verify_fixture.json"
    meta = json.loads(meta_path.read_text())
    transformer = json.loads((plan_dir / "plan.json").read_text())["model"]["transformer_file"]
    assert meta["sources"][transformer] == hashlib.sha256(Path(transformer).read_bytes()).hexdigest()
    meta_path.write_text(json.dumps({**meta, "report": {**meta["report"], "notes": ["from the record"]}}))
    rc, again = verify_json(plan_dir, out, "--fixture-only")
    assert rc == 0 and again["fixture"]["notes"] == ["from the record"]  # reused
    meta_path.write_text(json.dumps({**meta, "job": "0" * 64, "report": {**meta["report"], "notes": ["stale"]}}))
    rc, fresh = verify_json(plan_dir, out, "--fixture-only")
    assert rc == 0 and fresh["fixture"] == first["fixture"]  # derived anew


def test_a_packed_sequence_is_synthesised_as_the_docstring_and_the_comparisons_say(tmp_path):
    """Ideogram4 packs text and image tokens into one sequence: its docstring documents both over
    `sequence_length`, `segment_ids` as `(batch_size, sequence_length)`, and forward compares `indicator` with
    two module constants; its interleaved RoPE reads 3 x `mrope_section` of the head's frequencies. Static
    synthesis follows each (one length, one segment of zeros, the constants in runs, the sections scaled with
    the head) and the plain tiny model runs; its own pipeline cannot (a vision-language encoder)."""
    model = make_model_dir(tmp_path / "m", "Ideogram4Pipeline", "Ideogram4Transformer2DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    rc, r = verify_json(plan_dir, out, "--fixture-only")
    fx = r["fixture"]
    assert rc == 0 and fx["status"] == "derived" and fx["source"] == "static", fx
    assert fx["tried"] and fx["tried"][0].startswith("pipeline: "), fx["tried"]
    head = fx["changes"]["attention_head_dim"][1]
    assert all(3 * s <= head // 2 for s in fx["changes"]["mrope_section"][1])
    text = (out / "verify_fixture.py").read_text()
    assert "\"segment_ids\": torch.zeros(1, 16, dtype=torch.long)" in text
    assert "_randn('encoder_hidden_states', 1, 16, " in text  # the latent's 16 tokens, not a text length
    assert "\"indicator\": torch.tensor([[3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2]] * 1)" in text


def _static_slots(cls, passed: dict):
    """(tiny config, {name: Slot}) of static synthesis for a diffusers class, built on the meta device, with
    the forward docstring's documented dims and `passed` as what the pipeline passes."""
    import inspect

    import torch

    from integrate.analyzers.structure import documented_dims
    from integrate.resolve import Workspace
    from integrate.verify.inputs import synthesize
    from integrate.verify.tiny import derive

    tiny = derive(cls, {k: v.default for k, v in inspect.signature(cls.__init__).parameters.items()
                        if k != "self" and v.default is not inspect.Parameter.empty})
    with torch.device("meta"):
        model = cls.from_config(tiny.config)
    src = Workspace().load(Path(inspect.getsourcefile(cls)))
    shapes = {k: list(d) for k, d in documented_dims(src, src.classes[cls.__name__]).items()}
    return dict(model.config), {s.name: s for s in synthesize(model, dict(model.config), passed, shapes).slots}


def test_static_inputs_read_docstring_arithmetic_channels_last_latents_guards_and_dict_annotations():
    """What the static rules read beyond names (each on a diffusers model nobody has integrated):
    `encoder_hidden_states` documented as `(batch_size, 1 + len(injection_layer_ids), text_len, cap_feat_dim)`
    gets its dims from the config (BriaFibo2); an optional list input no rule sizes is left at its default; a
    5-D latent documented `(batch_size, num_frames, height, width, 2 * in_visual_dim + 1)` with no `in_channels`
    is channels last, with the channels its projection takes per patch, on the grid forward's
    `if height % FRACTAL_BLOCK_SIZE ...: raise` accepts (Kandinsky6SR); a parameter annotated as a dict is
    never a tensor (SanaWM's `data_info`)."""
    import diffusers

    from integrate.verify.inputs import config_size

    config, fibo = _static_slots(diffusers.BriaFibo2Transformer2DModel, {"hidden_states": 4, "context_latents": None})
    bundles = 1 + len(config["injection_layer_ids"])
    assert f"_randn('encoder_hidden_states', 1, {bundles}, " in fibo["encoder_hidden_states"].expr
    assert fibo["context_latents"].expr is None and fibo["context_latents"].error is None
    assert config_size("2 * in_visual_dim + 1", {"in_visual_dim": 4}) == 9
    assert config_size("1 + len(ids)", {"ids": [0, 1]}) == 3 and config_size("text_len", {}) is None

    config, sr = _static_slots(diffusers.Kandinsky6SRTransformer3DModel, {"hidden_states": 5})
    channels = 2 * config["in_visual_dim"] + 1
    assert sr["hidden_states"].expr == f"_randn('hidden_states', 1, 2, 8, 8, {channels}, step=step)", sr["hidden_states"]
    assert "channels last" in sr["hidden_states"].why and "8x8 token grid" in sr["hidden_states"].why

    _, wm = _static_slots(diffusers.SanaWMTransformer3DModel, {})
    assert wm["data_info"].expr is None and "dict" in wm["data_info"].why


def test_static_inputs_follow_annotations_grid_ints_frame_axes_and_modules_the_config_leaves_out():
    """LTX2 takes packed tokens plus `num_frames`/`height`/`width` ints (the grid's extent) and
    `audio_num_frames` (the audio stream's tokens); its `isolate_modalities: bool` and
    `spatio_temporal_guidance_blocks: list[int] | None` are not tensors. ConsisID's 5-D latent goes frame by
    frame through a Conv2d: a frame axis before the channels, as documented. ChronoEdit's image embedder is
    None under a text-only config, so `encoder_hidden_states_image` is left out; PixArt's caption projection is
    None too, but forward guards it (`if self.caption_projection is not None`), so its text input is built."""
    import diffusers

    passed = dict.fromkeys(("hidden_states", "num_frames", "height", "width", "audio_num_frames",
                            "isolate_modalities", "spatio_temporal_guidance_blocks", "use_cross_timestep"))
    _, ltx2 = _static_slots(diffusers.LTX2VideoTransformer3DModel, passed)
    assert (ltx2["num_frames"].expr, ltx2["height"].expr, ltx2["width"].expr) == ("1", "4", "4")
    assert ltx2["audio_num_frames"].expr == "16" and "audio_hidden_states" in ltx2["audio_num_frames"].why
    for flag in ("isolate_modalities", "spatio_temporal_guidance_blocks", "use_cross_timestep"):
        assert ltx2[flag].expr is None and ltx2[flag].error is None, ltx2[flag]

    _, consis = _static_slots(diffusers.ConsisIDTransformer3DModel, {"hidden_states": 5})
    assert consis["hidden_states"].expr.startswith("_randn('hidden_states', 1, 2, "), consis["hidden_states"]

    _, chrono = _static_slots(diffusers.ChronoEditTransformer3DModel, {"encoder_hidden_states_image": 3})
    assert chrono["encoder_hidden_states_image"].expr is None
    assert "image_embedder" in chrono["encoder_hidden_states_image"].why
    _, pixart = _static_slots(diffusers.PixArtTransformer2DModel, {"encoder_hidden_states": 3})
    assert pixart["encoder_hidden_states"].expr.startswith("_randn('encoder_hidden_states', 1, 6, ")


def test_arguments_the_pipeline_passes_by_position_count_as_passed(tmp_path):
    """StableAudio's pipeline calls `self.transformer(latent_model_input, t.unsqueeze(0), ...)`: the second
    positional argument is forward's `timestep`, so the fixture must build it (it had been left at None)."""
    import diffusers

    from integrate.analyzers.structure import pipeline_call_keywords
    from integrate.gate import run_gate
    from integrate.gate.records import GateFlags
    from integrate.resolve import Workspace

    root = Path(diffusers.__file__).parent
    (tmp_path / "m").mkdir()
    flags = GateFlags(model_path=str(tmp_path / "m"), pipeline_class="StableAudioPipeline",
                      pipeline_file=str(root / "pipelines/stable_audio/pipeline_stable_audio.py"),
                      transformer_class="StableAudioDiTModel",
                      transformer_file=str(root / "models/transformers/stable_audio_transformer.py"))
    ws = Workspace()
    keywords = pipeline_call_keywords(ws, run_gate(flags, ws))
    assert keywords[:2] == ["hidden_states", "timestep"], keywords


def _transformer_only(tmp_path, transformer: str) -> tuple[int, dict, Path]:
    """A transformer diffusers 0.42.1 has no pipeline for, planned alone: verify --fixture-only's exit code,
    fixture report and the folder generate wrote."""
    plan_dir, out = transformer_only(transformer, tmp_path)
    rc, r = verify_json(plan_dir, out, "--fixture-only")
    return rc, r["fixture"], out


def test_a_required_rope_pair_is_made_as_cos_and_sin_over_the_latent_tokens(tmp_path):
    """SanaWMLTX2Refiner's forward requires `video_rotary_emb: tuple[torch.Tensor, torch.Tensor]`, which its
    refiner loop builds outside the model: the fixture makes a (cos, sin) pair over the latent's tokens, heads x
    head dim wide, and says the layout is assumed; the plain model runs on it (it had been one pooled vector)."""
    rc, fx, out = _transformer_only(tmp_path, "SanaWMLTX2RefinerTransformer3DModel")
    assert rc == 0 and fx["status"] == "derived", fx
    text = (out / "verify_fixture.py").read_text()
    assert "\"video_rotary_emb\": _rope_pair('video_rotary_emb', 1, " in text and "(layout assumed)" in text


def test_a_required_state_object_is_built_through_its_own_constructor(tmp_path):
    """WanAnimate2's forward requires `kv_cache: WanAnimate2KVCache` (filled by a reference pass, read by the
    denoising pass) and `kv_cache_mode: str`: the cache is built through its own constructor, the mode is a value
    forward's check allows (tests/test_model_folder_cacheobj.py has the rest), instead of leaving them out and
    reporting the call's `missing 2 required positional arguments`."""
    rc, fx, out = _transformer_only(tmp_path, "WanAnimate2Transformer3DModel")
    assert rc == 0 and fx["status"] == "derived", fx
    text = (out / "verify_fixture.py").read_text()
    assert "\"kv_cache\": _own(" in text and "\"kv_cache_mode\": 'extract'," in text


def test_inputs_documented_over_the_latents_grid_axes_are_shaped_by_them(tmp_path):
    """SanaWM's pipeline needs camera poses the fixture cannot make, so its fixture is synthesised; its forward
    documents the latent as ``(B, C, T, H, W)`` and `timestep` as ``(B, 1, T)`` per frame, `frame_valid_mask` as
    ``(B, 1, T, 1, 1)``: each axis is sized as the latent's of that name, and the plain tiny model runs (a 1-D
    timestep had failed in its first block). Inputs over the latent's sequence length are left to their rules."""
    model = make_model_dir(tmp_path / "m", "SanaWMPipeline", "SanaWMTransformer3DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    rc, r = verify_json(plan_dir, out, "--fixture-only")
    fx = r["fixture"]
    assert rc == 0 and fx["status"] == "derived" and fx["source"] == "static", fx
    assert "c2w" in fx["tried"][0], fx["tried"]
    text = (out / "verify_fixture.py").read_text()
    latent = next(line for line in text.splitlines() if line.strip().startswith('"hidden_states": _randn('))
    frames = int(latent.split("_randn('hidden_states', ")[1].split(",")[2])
    assert f'"timestep": torch.full((1, 1, {frames},), 0.5 - 0.002 * step)' in text
    assert f'"frame_valid_mask": torch.ones(1, 1, {frames}, 1, 1)' in text


def test_a_latent_too_small_to_split_over_the_cp_ranks_is_captured_again_larger(tmp_path):
    """LTXPipeline's VAE compresses 32 pixels into a token, more than the 8 the capture assumes: at 32x32 its latent
    is one token, which no 2-process CP proof can split. The capture calls it again at twice the size, says so, and
    the fixture carries at least 2 tokens per rank."""
    model = make_model_dir(tmp_path / "m", "LTXPipeline", "LTXVideoTransformer3DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    rc, r = verify_json(plan_dir, out, "--fixture-only")
    fx = r["fixture"]
    assert rc == 0 and fx["source"] == "pipeline" and fx["image_tokens"] >= 4, fx
    assert any("gave a latent of 1 token(s)" in n and "twice the size" in n for n in fx["notes"]), fx["notes"]
