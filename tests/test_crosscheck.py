"""The static module tree (sizes traced from the config) agrees with the model built on the meta device."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest
from conftest import make_model_dir
from integrate.decisions.crosscheck import compare, crosscheck
from integrate.decisions.probe import probe_transformer

from integrate import api
from integrate.resolve import Workspace

MODELS = [
    ("FluxPipeline", "FluxTransformer2DModel"),
    ("WanPipeline", "WanTransformer3DModel"),
    ("QwenImagePipeline", "QwenImageTransformer2DModel"),
    ("ZImagePipeline", "ZImageTransformer2DModel"),
    ("HunyuanVideoPipeline", "HunyuanVideoTransformer3DModel"),
    ("HeliosPipeline", "HeliosTransformer3DModel"),
]


def _facts(pipeline: str, transformer: str):
    d = make_model_dir(Path(tempfile.mkdtemp()) / pipeline, pipeline, transformer)
    ws = Workspace()
    analysis = api.analyze(api.flags_for(str(d)), parallel=True, ws=ws)
    return analysis.gate, ws, analysis.parallel


@pytest.mark.parametrize("pipeline,transformer", MODELS)
def test_static_structure_matches_the_meta_build(pipeline, transformer):
    report, ws, facts = _facts(pipeline, transformer)
    t_file = report.value("transformer_file")
    result = crosscheck(facts, t_file, transformer, ws.load(Path(t_file)).dotted_name, report.value("config_file"))
    assert result.ok, result.error
    assert result.checked >= 10
    assert result.disagreements == ()


def test_a_wrong_static_fact_is_reported_not_hidden():
    report, ws, facts = _facts("FluxPipeline", "FluxTransformer2DModel")
    probe = probe_transformer("diffusers", "FluxTransformer2DModel", None, [b.attr for b in facts.blocks])
    assert probe["ok"], probe.get("error")
    first = facts.blocks[0]
    wrong_attn = dataclasses.replace(first.attentions[0], heads=("heads", 7))
    wrong = dataclasses.replace(first, length=5, attentions=(wrong_attn,) + first.attentions[1:])
    result = compare(dataclasses.replace(facts, blocks=(wrong,) + facts.blocks[1:]), probe)
    assert any("static length 5, built 19" in d for d in result.disagreements)
    assert any("attn.heads`: static 7, built 24" in d for d in result.disagreements)


def test_probe_failure_is_reported_as_a_line(tmp_path):
    report, ws, facts = _facts("FluxPipeline", "FluxTransformer2DModel")
    bad = tmp_path / "model"
    (bad / "transformer").mkdir(parents=True)
    (bad / "transformer" / "config.json").write_text('{"num_layers": "many"}')
    result = crosscheck(facts, report.value("transformer_file"), "FluxTransformer2DModel", "diffusers",
                        str(bad / "transformer" / "config.json"))
    assert result.ok is False and "\n" not in result.error and "FluxTransformer2DModel" in result.error
