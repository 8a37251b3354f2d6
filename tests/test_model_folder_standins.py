"""From a model folder alone (issue #38): a config-only model folder of an installed diffusers 0.42.1 transformer,
planned, approved, generated and verified with no hand edit. The fixture's config switches on the modules forward
calls, and the pipeline's components and stand-in encoders are sized from the shrunk transformer.

Real runs: the installed pipelines and transformers, tiny random-weight models, workers.
"""

from __future__ import annotations


import pytest
from conftest import make_model_dir, plan_generate, verify_json


def _proved(plan_dir, out, proof: str) -> dict:
    """verify's report of one proof on the fixture derived from the model folder (derived first where a test run
    alone has not derived it yet)."""
    if not (out / "verify_fixture.pt").is_file():
        verify_json(plan_dir, out, "--fixture-only")
    return verify_json(plan_dir, out, "--proof", proof)[1]


@pytest.fixture(scope="module")
def framepack(tmp_path_factory):
    base = tmp_path_factory.mktemp("framepack")
    model = make_model_dir(base / "m", "HunyuanVideoFramepackPipeline", "HunyuanVideoFramepackTransformer3DModel")
    return plan_generate(model, base)


@pytest.fixture(scope="module")
def acestep(tmp_path_factory):
    base = tmp_path_factory.mktemp("acestep")
    model = make_model_dir(base / "m", "AceStepPipeline", "AceStepTransformer1DModel")
    return plan_generate(model, base)


def test_a_module_forward_calls_outside_any_test_is_switched_on_by_the_line_that_builds_it():
    """The class defaults leave `image_projection` and `clean_x_embedder` None (`X(...) if has_image_proj else
    None`; `if has_clean_x_embedder: self.clean_x_embedder = ...`) while forward calls both unconditionally."""
    import torch
    from diffusers import HunyuanVideoFramepackTransformer3DModel as cls
    from integrate.verify.switches import switches
    from integrate.verify.tiny import object_defaults

    with torch.device("meta"):
        model = cls.from_config(object_defaults(cls))
    found = {s.path: s for s in switches(model)}
    assert set(found) == {"image_projection", "clean_x_embedder"}, found
    assert found["image_projection"].param == "has_image_proj" and found["image_projection"].value is True
    assert found["clean_x_embedder"].param == "has_clean_x_embedder" and found["clean_x_embedder"].value is True
    why = found["image_projection"].why
    assert "transformer_hunyuan_video_framepack.py:" in why and "`has_image_proj`" in why, why
    with torch.device("meta"):  # switched on, nothing is left unbuilt
        model = cls.from_config({**object_defaults(cls), "has_image_proj": True, "has_clean_x_embedder": True})
    assert switches(model) == []


def test_framepack_from_its_model_folder_switches_on_what_its_pipeline_feeds_and_the_plain_model_runs(framepack):
    plan_dir, out = framepack
    rc, r = verify_json(plan_dir, out, "--fixture-only")
    fx = r["fixture"]
    assert rc == 0 and fx["status"] == "derived" and fx["source"] == "pipeline", fx
    assert fx["changes"]["has_image_proj"] == [False, True] and fx["changes"]["has_clean_x_embedder"] == [False, True]
    assert any(n.startswith("forward calls `self.image_projection` (transformer_hunyuan_video_framepack.py:")
               for n in fx["notes"]), fx["notes"]
    text = (out / "verify_fixture.py").read_text()
    assert "_saved(step, 'image_embeds')" in text
    # each step is in the fixture file itself, with its evidence
    head = text.partition('"""\n# integrate-fixture')[0]
    assert "How it was derived (each step with its evidence):" in head
    assert "only when `has_image_proj` (transformer_hunyuan_video_framepack.py:" in " ".join(head.split()), head


def test_framepack_cp_proof_passes_on_the_derived_fixture(framepack):
    plan_dir, out = framepack
    r = _proved(plan_dir, out, "cp")
    assert r["fixture"]["status"] == "derived" and r["cp"]["status"] == "pass", r["cp"]


def test_acestep_from_its_model_folder_sizes_its_components_from_the_shrunk_transformer(acestep):
    """AceStep's pipeline encodes prompts through a condition encoder built to the transformer's real width (hidden
    size 2048, text width 1024) and joins a context to the latent in forward: the condition encoder is shrunk as the
    transformer was, the stand-in text encoder rebuilt to the width the condition encoder takes (read from the
    error), and in_channels taken from what reaches the input convolution."""
    plan_dir, out = acestep
    rc, r = verify_json(plan_dir, out, "--fixture-only")
    fx = r["fixture"]
    assert rc == 0 and fx["status"] == "derived" and fx["source"] == "pipeline", fx
    assert fx["changes"]["in_channels"] == [192, 3 * fx["changes"]["audio_acoustic_hidden_dim"][1]], fx["changes"]
    notes = fx["notes"]
    assert any(n.startswith("`condition_encoder`: AceStepConditionEncoder's defaults share the transformer's")
               and "hidden_size 2048 -> 64" in n for n in notes), notes
    assert any(n.startswith("`text_encoder`: the stand-in rebuilt 32 wide") and "mat1 and mat2" in n
               for n in notes), notes
    assert any("in_channels=192" in t and "96" in t for t in fx["tried"]), fx["tried"]


def test_acestep_cache_proof_passes_on_the_derived_fixture(acestep):
    plan_dir, out = acestep
    r = _proved(plan_dir, out, "cache")
    assert r["fixture"]["status"] == "derived" and r["cache"]["status"] == "pass", r["cache"]
