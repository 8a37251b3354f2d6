"""From a model folder alone (#38): a transformer whose forward takes an object of the model's own (a KV cache it
fills) and a mode string, with no pipeline to capture from. WanAnimate2Transformer3DModel (diffusers 0.42.1) is
planned transformer-only; its fixture is synthesised from what the model says about itself.

Real runs: the installed diffusers class, a tiny random-weight model, workers.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from conftest import transformer_only, verify_json

CLASS = "WanAnimate2Transformer3DModel"


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> tuple[Path, Path]:
    """A config-only model folder naming the class, planned with --no-pipeline, approved and generated."""
    return transformer_only(CLASS, tmp_path_factory.mktemp("wan_animate2"))


def _line(text: str, name: str) -> str:
    return next(line.strip() for line in text.splitlines() if line.strip().startswith(f'"{name}": '))


def test_the_cache_object_is_built_through_its_own_constructor_and_the_plain_model_runs(planned):
    """`kv_cache: WanAnimate2KVCache` is built by its own constructor (`num_layers`: the config's field of that
    name), a fresh one per call; `kv_cache_mode` is the first value forward's membership test allows; `seq_len` is
    the latent's token count forward's raise demands; the list inputs are one tensor per sample; the condition
    shares the patch embedding's channels with the latent. The plain tiny model runs on it (it was needs-edit)."""
    plan_dir, out = planned
    rc, r = verify_json(plan_dir, out, "--fixture-only")
    fx = r["fixture"]
    assert rc == 0 and fx["status"] == "derived" and fx["source"] == "static", fx
    text = (out / "verify_fixture.py").read_text()
    cache = _line(text, "kv_cache")
    assert cache.startswith("\"kv_cache\": _own('diffusers.models.transformers.transformer_wan_animate_2', "
                            "'WanAnimate2KVCache', num_layers=_config('num_layers', 2)),"), cache
    assert "transformer_wan_animate_2.py:140" in cache and "`num_layers` is the config's field" in cache
    mode = _line(text, "kv_cache_mode")
    assert mode.startswith("\"kv_cache_mode\": 'extract',") and "transformer_wan_animate_2.py:825" in mode, mode
    seq = _line(text, "seq_len")
    assert seq.startswith('"seq_len": 32,') and "u.size(1) != seq_len" in seq, seq
    assert _line(text, "hidden_states").startswith("\"hidden_states\": _samples(_randn('hidden_states', 1, 16, ")
    assert _line(text, "condition_latents").startswith("\"condition_latents\": _samples(_randn('condition_latents', "
                                                       "1, 20, ")
    assert "its docstring says it is required under `kv_cache_mode=" in _line(text, "offset_grid_sizes")
    assert "`config.use_img_emb` builds and calls it" in _line(text, "encoder_hidden_states_image")


def test_the_cache_proof_passes_with_a_fresh_cache_object_per_call(planned):
    """The cache object carries state from one call to the next: each call of the fixture's `inputs` builds its
    own, so the cached run and the plain run never share one; the cache proof passes."""
    plan_dir, out = planned
    rc, r = verify_json(plan_dir, out, "--proof", "cache")
    assert r["cache"]["status"] == "pass", r["cache"]
    from integrate.verify.fixture import load

    fx = load(out / "verify_fixture.py")
    a, b = fx.inputs(0)["kv_cache"], fx.inputs(0)["kv_cache"]
    assert a is not b and type(a).__name__ == "WanAnimate2KVCache"
    assert len(a.layer_caches) == fx.CONFIG["num_layers"]


def test_a_constructor_argument_nothing_names_is_needs_edit_with_its_line():
    """Where neither the config nor the model's own code says what the constructor's argument is, the slot is
    an error naming the argument and the constructor's line, not a guess."""
    import torch
    from diffusers import WanAnimate2Transformer3DModel as cls

    from integrate.verify.inputs import mode_values, own_object
    from integrate.verify.tiny import derive

    tiny = derive(cls, {k: v.default for k, v in inspect.signature(cls.__init__).parameters.items()
                        if k != "self" and v.default is not inspect.Parameter.empty})
    with torch.device("meta"):
        model = cls.from_config(tiny.config)
    params = inspect.signature(cls.forward).parameters
    made = own_object(model, {"num_layers": 2}, params["kv_cache"])
    assert made.error is None and "num_layers=_config('num_layers', 2)" in made.expr
    slot = own_object(model, {}, params["kv_cache"])
    assert slot.expr is None and "its constructor (transformer_wan_animate_2.py:143) takes `num_layers`" in slot.error
    values, evidence = mode_values(model, params["kv_cache_mode"])
    assert values == ["extract", "cached"] and "membership test" in evidence
