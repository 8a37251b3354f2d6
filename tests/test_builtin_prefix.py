"""cache-dit's built-in registrations answer a class name by prefix (its adapters skip their type check for a class
outside diffusers): a built-in is deferred to only where it was written for this very class (module and name) and
its block lists bind here; otherwise the plugin puts ours ahead of it, and cache-dit's registry then answers ours.

The model is a research repository's own, named as cache-dit's built-ins are (written here, tiny): a diffusers
`ModelMixin` whose class is not diffusers' one, with a `DiffusionPipeline` of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
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
    by_name = note["separate_cfg_by_name"]
    assert by_name["file"].endswith("block_registers.py") and "'Wan'" in by_name["why"]
    # the planners assert no class: they follow cache-dit's adapter for the model, which was not written for this one
    assert "asserts no class" in answers[("tp", transformer)]["why"] and answers[("tp", transformer)]["confidence"] \
        == "medium"


def _probe(out: Path, src: Path, import_name: str, transformer: str, pipeline: str) -> dict:
    """Import the plugin with cache-dit in a fresh process and ask cache-dit's registries what answers."""
    code = textwrap.dedent(f"""
        import importlib, json, sys
        import model
        from cache_dit.caching.block_adapters.block_registers import BlockAdapterRegister as R
        from cache_dit.distributed.transformers.register import ContextParallelismPlannerRegister as C
        from cache_dit.distributed.transformers.register import TensorParallelismPlannerRegister as T
        import cache_dit.distributed.transformers.dispatch as dispatch
        dispatch._ensure_cp_planners_activated(); dispatch._ensure_tp_planners_activated()
        before = [list(R._adapters), list(C._cp_planner_registry), list(T._tp_planner_registry)]
        plugin = importlib.import_module({import_name!r})
        t = model.{transformer}()
        pipe = model.{pipeline}(t)

        def wraps(adapter):
            blocks = adapter.blocks if isinstance(adapter.blocks, list) else [adapter.blocks]
            return any(b is t.layers for b in blocks)

        first = lambda table, name: next(k for k in table if name.startswith(k))
        ours = ({pipeline!r}, {transformer!r})
        after = [list(R._adapters), list(C._cp_planner_registry), list(T._tp_planner_registry)]
        import cache_dit
        cfg = cache_dit.DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0)  # enable_separate_cfg left unset
        cache_dit.enable_cache(model.{pipeline}(model.{transformer}()), cache_config=cfg)
        print("JSON" + json.dumps({{
            "separate_cfg": cfg.enable_separate_cfg,
            "pipe": wraps(R.get_adapter(pipe)), "alone": wraps(R.get_adapter(t)),
            "cp": C.get_planner(t) is plugin.CP_PLANNER, "tp": T.get_planner(t) is plugin.TP_PLANNER,
            "flags": [plugin.ADAPTER_REGISTERED, plugin.CP_PLANNER_REGISTERED, plugin.TP_PLANNER_REGISTERED],
            "ahead_of": [plugin.adapter.AHEAD_OF, plugin.cp_planner.AHEAD_OF, plugin.tp_planner.AHEAD_OF],
            # ours first; every other entry kept, in its own order
            "first": [a[:2] for a in after],
            # (the plugin's `_activate` may add built-ins cache-dit had not loaded yet: at the end)
            "others_kept": [[k for k in a if k in b and k not in ours] == [k for k in b if k not in ours]
                            for a, b in zip(after, before)],
            "diffusers_names": [first(R._adapters, "WanImageToVideoPipeline"),
                                first(C._cp_planner_registry, "WanVACETransformer3DModel"),
                                first(T._tp_planner_registry, "WanAnimateTransformer3DModel")],
        }}))
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": f"{out}:{src}", "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    said = [line for line in proc.stdout.splitlines() if line.startswith("JSON")]
    assert said, proc.stderr[-3000:]
    return json.loads(said[-1][4:])


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_plugin_puts_ours_ahead_and_cache_dits_registry_answers_it(tmp_path, case):
    """Generated and imported with cache-dit, the plugin's adapter answers the pipeline and the transformer looked up
    alone, and its CP / TP planners answer the transformer: cache-dit's built-in Wan adapter, which reads
    `transformer.blocks`, would fail on this model. Only the names of ours answer differently."""
    from integrate import api

    transformer, pipeline, adapter_key, cp_key, tp_key = CASES[case]
    flags = _flags(tmp_path, case)
    api.write_plan(api.plan(flags, probe=False), tmp_path / "plan")
    api.approve(tmp_path / "plan", "test")
    gen = api.generate(tmp_path / "plan", out=tmp_path / "out")
    assert gen.registered["adapter"] == f"{pipeline}, {transformer}", gen.registered  # full names, never a prefix
    assert gen.registered["cp_planner"] == gen.registered["tp_planner"] == transformer
    ahead = [n for n in gen.notes if "ours goes ahead of it" in n]
    assert len(ahead) == 4 and all("moves it to the front of the registry's table" in n for n in ahead), gen.notes
    text = (tmp_path / "out" / gen.plugin.import_name / "adapter.py").read_text()
    said = " ".join(line.strip().removeprefix("# ") for line in text.splitlines() if line.startswith("# "))
    assert f"written for diffusers.{transformer}" in said and f"this is model.{transformer}" in said
    assert "the private write" in said

    got = _probe(tmp_path / "out", tmp_path, gen.plugin.import_name, transformer, pipeline)
    assert got["pipe"] and got["alone"] and got["cp"] and got["tp"], got
    assert got["flags"] == [True, True, True]
    assert got["ahead_of"] == [{pipeline: adapter_key, transformer: adapter_key}, {transformer: cp_key},
                               {transformer: tp_key}]
    assert got["first"][0] == [transformer, pipeline] and [f[0] for f in got["first"][1:]] == [transformer] * 2
    assert got["others_kept"] == [True, True, True]
    assert got["diffusers_names"] == ["Wan", "WanVACETransformer3D", "Wan"]  # cache-dit's own, as before
    # cache-dit turns separate CFG on for a pipeline named `Wan...` whatever our adapter says (a prefix list, not a
    # registry ours can go ahead in): generate says to set it, where the pipeline batches CFG
    cfg_note = [n for n in gen.notes if "enable_separate_cfg=False" in n]
    assert got["separate_cfg"] is (case == "wan") and len(cfg_note) == (case == "wan"), (got, gen.notes)
    assert case != "wan" or "'Wan' (BlockAdapterRegister._predefined_adapters_has_separate_cfg)" in cfg_note[0]


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


def test_where_cache_dits_table_cannot_be_reordered_ours_is_not_registered_and_the_import_says_so(tmp_path):
    """The one private write is guarded: where `BlockAdapterRegister._adapters` is not the dict the plugin knows (a
    read-only mapping here, as another cache-dit might keep), nothing is forced in: the adapter is not registered,
    `ADAPTER_REGISTERED` is false and the import warns, naming the built-in that answers and how to hand ours over."""
    from integrate import api

    transformer, pipeline = CASES["wan"][:2]
    api.write_plan(api.plan(_flags(tmp_path, "wan"), probe=False), tmp_path / "plan")
    api.approve(tmp_path / "plan", "test")
    gen = api.generate(tmp_path / "plan", out=tmp_path / "out")
    code = textwrap.dedent(f"""
        import json, types
        from cache_dit.caching.block_adapters.block_registers import BlockAdapterRegister as R
        R._adapters = types.MappingProxyType(dict(R._adapters))
        import {gen.plugin.import_name} as plugin
        print("JSON" + json.dumps([plugin.ADAPTER_REGISTERED, plugin.adapter.ANSWERED_BY, plugin.adapter.AHEAD_OF,
                                   next(k for k in R._adapters if {pipeline!r}.startswith(k))]))
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": f"{tmp_path / 'out'}:{tmp_path}", "PATH": "/usr/bin:/bin",
                               "CUDA_VISIBLE_DEVICES": ""})
    said = [line for line in proc.stdout.splitlines() if line.startswith("JSON")]
    assert said, proc.stderr[-3000:]
    assert json.loads(said[-1][4:]) == [False, {pipeline: "Wan", transformer: "Wan"}, {}, "Wan"]
    assert "so wan_adapter is not registered: hand it over" in proc.stderr
