"""From a model folder alone (#38): inputs derived from what the model and its pipeline say about themselves.

Real runs: the installed diffusers 0.42.1 pipelines, transformers and schedulers, tiny random-weight models, workers.
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import make_model_dir, plan_generate, run_cli


def _verify(plan_dir: Path, out: Path, *flags: str) -> tuple[int, dict]:
    proc = run_cli("verify", str(plan_dir), "--generated", str(out), "--json", *flags)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def test_a_latent_unpacked_into_a_sequence_of_patches_is_shaped_as_forward_unpacks_it(tmp_path):
    """JoyImageEditPlus unpacks `batch_size, max_num_patches, channels, pt, ph, pw = hidden_states.shape`: one
    axis more than its Conv3d patch embedding takes. The latent is made 6-D, a sequence of kernel-sized patches
    (the static fixture had made it 5-D and the plain model refused it), the line is the evidence, and the plain
    tiny model and the cache proof run on it."""
    model = make_model_dir(tmp_path / "m", "JoyImageEditPlusPipeline", "JoyImageEditPlusTransformer3DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    rc, r = _verify(plan_dir, out, "--proof", "cache")
    fx = r["fixture"]
    assert fx["status"] == "derived", fx
    text = (out / "verify_fixture.py").read_text()
    latent = next(line for line in text.splitlines() if line.strip().startswith('"hidden_states":'))
    assert "_randn('hidden_states', 1, 16, 16, 1, 2, 2" in latent, latent
    assert "max_num_patches" in latent and "line 466" in latent, latent
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
    _, r = _verify(plan_dir, out, "--fixture-only")
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
