"""cache-dit's built-in registrations answer a class name by prefix (its adapters skip their type check for a class
outside diffusers): a built-in is deferred to only where it was written for this very class (module and name) and
its block lists bind here.

The model is a research repository's own, named as cache-dit's built-ins are (written here, tiny): a diffusers
`ModelMixin` whose class is not diffusers' one, with a `DiffusionPipeline` of its own.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from conftest import analyse_source, source_flags

MODEL = '''
"""A research repository's own model, named as one of cache-dit's built-ins is (not diffusers' class)."""

import torch
from diffusers import ConfigMixin, DiffusionPipeline, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, hidden_states, temb):
        return hidden_states + self.proj(hidden_states) * temb


class {transformer}(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(self, dim: int = 8, num_layers: int = 2):
        super().__init__()
        self.time = nn.Linear(1, dim)
        self.layers = nn.ModuleList([Block(dim) for _ in range(num_layers)])
        self.out = nn.Linear(dim, dim)

    def forward(self, hidden_states, timestep):
        temb = self.time(timestep[:, None].float())[:, None]
        for block in self.layers:
            hidden_states = block(hidden_states, temb)
        return self.out(hidden_states)


class {pipeline}(DiffusionPipeline):
    def __init__(self, transformer):
        super().__init__()
        self.register_modules(transformer=transformer)

    @torch.no_grad()
    def __call__(self, latents, num_inference_steps: int = 2):
        for t in range(num_inference_steps):
            timestep = torch.full((latents.shape[0],), t)
            latents = latents - self.transformer(latents, timestep)
        return latents
'''

# (transformer, pipeline, the names cache-dit's own registrations answer them by: adapter, CP planner, TP planner)
CASES = {
    # the very name of diffusers' class: cache-dit 1.5.3's own adapter accepted it by name, and the plugin deferred
    "wan": ("WanTransformer3DModel", "WanPipeline", "Wan", "WanTransformer3D", "Wan"),
    # cache-dit registers its Flux CP planner under this exact class name: ours replaces that entry, first
    "flux": ("FluxTransformer2DModel", "FluxPipeline", "Flux", "FluxTransformer2DModel", "FluxTransformer"),
}


def _flags(folder: Path, case: str):
    transformer, pipeline = CASES[case][:2]
    text = textwrap.dedent(MODEL).format(transformer=transformer, pipeline=pipeline)
    return source_flags(folder, text, transformer, pipeline_class=pipeline, pipeline_file=str(folder / "model.py"))


def test_a_class_named_as_a_builtin_outside_diffusers_is_not_deferred_to(tmp_path):
    """The analysis says, labelled and with evidence, why each built-in that answers a looked-up name is not deferred
    to: cache-dit's Wan adapter and planners were written for diffusers' class, and this is `model.Wan...`."""
    transformer, pipeline, adapter_key, cp_key, tp_key = CASES["wan"]
    _flags(tmp_path, "wan")
    data = analyse_source(tmp_path, None, transformer, pipeline_class=pipeline,
                          pipeline_file=str(tmp_path / "model.py"))
    note = data["already_supported"]
    assert note["registered"] is False and note["deferred"] is False
    answers = {(a["kind"], a["name"]): a for a in note["answers"]}
    assert set(answers) == {("adapter", pipeline), ("adapter", transformer), ("cp", transformer), ("tp", transformer)}
    assert [answers[k]["key"] for k in sorted(answers)] == [adapter_key, adapter_key, cp_key, tp_key]
    for answer in answers.values():
        assert answer["deferred"] is False and answer["this"] == f"model.{transformer}", answer
        registration, this = answer["evidence"][:2]
        assert registration["file"].endswith((".py",)) and "cache_dit" in registration["file"] and registration["line"]
        assert this["file"] == str(tmp_path / "model.py")
        assert (tmp_path / "model.py").read_text().splitlines()[this["line"] - 1].startswith(f"class {transformer}(")
    adapter = answers[("adapter", pipeline)]
    assert "diffusers.WanTransformer3DModel" in adapter["written_for"] and adapter["confidence"] == "high"
    assert "'Wan' adapter (adapters.py:" in adapter["why"] and "answers WanPipeline by prefix but was written for " \
        "diffusers.WanTransformer3DModel" in adapter["why"] and "this is model.WanTransformer3DModel" in adapter["why"]
    assert "not deferred" in note["prefix_only"]
    # the planners assert no class: they follow cache-dit's adapter for the model, which was not written for this one
    assert "asserts no class" in answers[("tp", transformer)]["why"] and answers[("tp", transformer)]["confidence"] \
        == "medium"


def test_diffusers_own_class_defers_and_a_builtin_the_binding_rejects_does_not(analysis):
    """diffusers' own Flux: cache-dit's adapter was written for this very class (module and name) and its lists bind
    as the analysis reads them: deferred to. Bria: written for it too, but it wraps `transformer_blocks` with
    Pattern_0, where the blocks return (encoder, hidden): ours goes ahead. HunyuanVideo 1.5: cache-dit's
    `HunyuanVideo` CP planner answers it by prefix and asserts HunyuanVideoTransformer3DModel."""
    flux = analysis("FluxPipeline", "FluxTransformer2DModel")["already_supported"]
    assert flux["registered"] is True and flux["deferred"] is True
    (adapter,) = [a for a in flux["answers"] if a["kind"] == "adapter" and a["name"] == "FluxPipeline"]
    qual = "diffusers.models.transformers.transformer_flux.FluxTransformer2DModel"
    assert adapter["deferred"] is True and adapter["this"] == qual and qual in adapter["written_for"]
    assert adapter["confidence"] == "high" and "`transformer_blocks` with Pattern_1" in adapter["why"]
    assert all(a["deferred"] for a in flux["answers"])

    bria = analysis("BriaPipeline", "BriaTransformer2DModel")["already_supported"]
    assert bria["registered"] is True and bria["deferred"] is False
    (adapter,) = [a for a in bria["answers"] if a["kind"] == "adapter" and a["name"] == "BriaPipeline"]
    assert adapter["deferred"] is False and "written for this very class" in adapter["why"]
    assert "wraps `transformer_blocks` with Pattern_0, which does not bind here" in adapter["why"]
    assert any(e["file"].endswith("transformer_bria.py") for e in adapter["evidence"][2:])

    hv15 = analysis("HunyuanVideo15Pipeline", "HunyuanVideo15Transformer3DModel")["already_supported"]
    (cp,) = [a for a in hv15["answers"] if a["kind"] == "cp"]
    assert cp["key"] == "HunyuanVideo" and cp["deferred"] is False and cp["confidence"] == "high"
    assert cp["written_for"] == ["diffusers.models.transformers.transformer_hunyuan_video."
                                 "HunyuanVideoTransformer3DModel"]
    assert hv15["deferred"] is True  # its adapter is cache-dit's own, written for it
