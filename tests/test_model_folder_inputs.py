"""From a model folder alone (#38): inputs derived from what the model and its pipeline say about themselves.

Real runs: the installed diffusers 0.42.1 pipelines, transformers and schedulers, tiny random-weight models, workers.
"""

from __future__ import annotations


from conftest import make_model_dir, plan_generate, verify_json


def _static(cls, passed: dict) -> dict:
    """{name: Slot} of static synthesis for a diffusers class's tiny config, built on the meta device, with
    `passed` as what the pipeline passes."""
    import inspect

    import torch
    from integrate.verify.inputs import synthesize
    from integrate.verify.tiny import build, derive

    tiny = derive(cls, {k: v.default for k, v in inspect.signature(cls.__init__).parameters.items()
                        if k != "self" and v.default is not inspect.Parameter.empty})
    with torch.device("meta"):
        model = build(cls, tiny.config)
    return {s.name: s for s in synthesize(model, dict(model.config), passed, {}).slots}


def test_a_latent_unpacked_into_a_sequence_of_patches_is_shaped_as_forward_unpacks_it():
    """JoyImageEditPlus unpacks `batch_size, max_num_patches, channels, pt, ph, pw = hidden_states.shape`: one
    axis more than its Conv3d patch embedding (stride = kernel) takes. Static synthesis makes the latent 6-D, a
    sequence of kernel-sized patches (it had made it 5-D, which the plain model refused), cites the line, and the
    grid it gives `shape_list` counts as many tokens as there are patches."""
    from diffusers import JoyImageEditPlusTransformer3DModel

    slots = _static(JoyImageEditPlusTransformer3DModel, {"shape_list": None})
    latent = slots["hidden_states"]
    assert latent.shape == (1, 16, 16, 1, 2, 2) and latent.error is None, latent
    assert "max_num_patches" in latent.why and "line 466" in latent.why, latent.why
    assert slots["shape_list"].expr == "[[(1, 4, 4)]] * 1", slots["shape_list"]


def test_a_pipeline_that_iterates_its_prompt_beside_embeddings_is_called_with_a_prompt(tmp_path):
    """JoyImageEditPlusPipeline iterates `prompt` (line 587) even where `prompt_embeds` are passed, and refuses
    both together: it is called with a prompt instead, its Qwen3-VL text encoder a stand-in, and the processor it
    tokenizes the prompt with (line 245, left out as None) the text-only stand-in; each step noted. Its latent is
    the 6-D sequence of patches static synthesis makes too, and the cache proof passes on its inputs."""
    import torch

    model = make_model_dir(tmp_path / "m", "JoyImageEditPlusPipeline", "JoyImageEditPlusTransformer3DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    _, r = verify_json(plan_dir, out, "--proof", "cache")
    fx = r["fixture"]
    assert fx["status"] == "derived" and fx["source"] == "pipeline", fx
    assert any("iterates its `prompt`" in n and "pipeline_joyimage_edit_plus.py:587" in n for n in fx["notes"]), fx
    assert any(n.startswith("`processor`: a text-only stand-in for Qwen3VLProcessor") and ":245" in n
               for n in fx["notes"]), fx["notes"]
    calls = torch.load(out / "verify_fixture.pt", weights_only=True)
    assert tuple(calls[0]["hidden_states"].shape) == (1, 16, 16, 1, 2, 2)
    assert r["cache"]["status"] == "pass", r["cache"]


def test_a_components_required_constructor_arguments_are_read_from_its_body_and_signature():
    """RFD4ProteinaScheduler requires four arguments and has no defaults for them: the two its constructor tests
    against a set of literals (raising otherwise) get the first literal, the two annotated `float` get 1.0, and the
    scheduler builds with them, each with its evidence; a class with defaults for everything needs none."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.schedulers.scheduling_rfd4_proteina import RFD4ProteinaScheduler
    from integrate.verify.capture import required_arguments

    got = required_arguments(RFD4ProteinaScheduler, {})
    assert {k: v for k, (v, _) in got.items()} == {"schedule_mode": "log", "noise_mode": "1/t", "tsr_k": 1.0,
                                                   "tsr_sigma": 1.0}
    assert "scheduling_rfd4_proteina.py:119" in got["schedule_mode"][1]
    assert "annotated `float`" in got["tsr_k"][1]
    RFD4ProteinaScheduler.from_config({k: v for k, (v, _) in got.items()})
    assert required_arguments(RFD4ProteinaScheduler, {"schedule_mode": "power", "noise_mode": "tan", "tsr_k": 2.0,
                                                      "tsr_sigma": 3.0}) == {}
    assert required_arguments(FlowMatchEulerDiscreteScheduler, {}) == {}


def test_dict_keys_forward_reads_and_an_input_the_models_error_names_are_made_and_noted(tmp_path):
    """RFD4Proteina reads `is_in_context_conditioning` and `supports_local_latent` from the dict it builds with
    `**(conditioning or {})`, each beside a mask made of `padding_mask` (`mask & ~features[...].bool()`): both are
    made of its shape, with the value that leaves that mask as it is, the line cited. The plain model then raises
    `KeyError: 'token_type'` in an Embedding: the search passes its optional `token_type` as ids below that
    embedding's vocabulary and notes the step. Its scheduler is built with its four required arguments, so the
    pipeline gets further (its VAE is what stops it). What stops the plain model next is said, not guessed."""
    model = make_model_dir(tmp_path / "m", "RFD4ProteinaPipeline", "RFD4ProteinaTransformer")
    plan_dir, out = plan_generate(model, tmp_path)
    _, r = verify_json(plan_dir, out, "--fixture-only")
    fx = r["fixture"]
    text = (out / "verify_fixture.py").read_text()
    cond = next(line for line in text.splitlines() if line.strip().startswith('"conditioning":'))
    assert "'is_in_context_conditioning': torch.zeros_like(_mask(1, 16, pad=2), dtype=torch.bool)" in cond, cond
    assert "'supports_local_latent': torch.ones_like(_mask(1, 16, pad=2), dtype=torch.bool)" in cond, cond
    assert "line 1110" in cond
    token = next(line for line in text.splitlines() if line.strip().startswith('"token_type":'))
    assert "torch.randint(0, 7, (1, 16)" in token and "KeyError 'token_type'" in token, token
    assert any("KeyError: 'token_type'" in n for n in fx["notes"]), fx
    assert not any("RFD4ProteinaScheduler" in t for t in fx["tried"]), fx["tried"]
    assert fx["status"] == "needs-edit" and "hbond" in fx["errors"][0], fx
