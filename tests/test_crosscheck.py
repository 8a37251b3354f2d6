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


HIDDEN_LINEARS = '''
import torch.nn.functional as F
from torch import nn
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin


class HiddenAttention(nn.Module):
    """Its projections are made by setattr: the static read does not see them, the built block has them."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        for name in ("to_q", "to_k", "to_v", "to_out"):
            setattr(self, name, nn.Linear(dim, dim))

    def forward(self, x):
        b, n, d = x.shape
        q = self.to_q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k = self.to_k(x).view(b, n, self.heads, -1).transpose(1, 2)
        v = self.to_v(x).view(b, n, self.heads, -1).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v)
        return self.to_out(o.transpose(1, 2).reshape(b, n, d))


class Attention(nn.Module):
    """The same attention read statically, and one more Linear made by setattr."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(dim, dim)
        self.to_v = nn.Linear(dim, dim)
        self.to_out = nn.Linear(dim, dim)
        setattr(self, "gate", nn.Linear(dim, dim))

    def forward(self, x):
        b, n, d = x.shape
        q = self.to_q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k = self.to_k(x).view(b, n, self.heads, -1).transpose(1, 2)
        v = self.to_v(x).view(b, n, self.heads, -1).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v)
        return self.to_out(o.transpose(1, 2).reshape(b, n, d))


class HiddenBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attn = HiddenAttention(dim, heads)

    def forward(self, hidden_states, temb):
        return hidden_states + self.attn(hidden_states + temb)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attn = Attention(dim, heads)

    def forward(self, hidden_states, temb):
        return hidden_states + self.attn(hidden_states + temb)


class Model(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(self, dim: int = 32, heads: int = 4, num_layers: int = 2):
        super().__init__()
        self.hidden_blocks = nn.ModuleList([HiddenBlock(dim, heads) for _ in range(num_layers)])
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(num_layers)])
        self.proj_out = nn.Linear(dim, dim)

    def forward(self, hidden_states, temb):
        for block in self.hidden_blocks:
            hidden_states = block(hidden_states, temb)
        for block in self.blocks:
            hidden_states = block(hidden_states, temb)
        return self.proj_out(hidden_states)
'''


def test_linears_the_static_read_missed_lower_the_tp_confidence_with_evidence(tmp_path):
    """The meta-device build has Linears the static read missed. An empty layer plan (every projection missed:
    TP would shard nothing of the list, while dividing its head count) is never "high": low, with the missed
    Linears named and where the module that holds them is built. A layer plan that misses one Linear is at most
    medium. The plan made without the probe cannot know of them: an empty layer plan is low there too."""
    from conftest import source_flags

    flags = source_flags(tmp_path, HIDDEN_LINEARS)
    plan = api.plan(flags, probe=True, trust_code=True)
    check = plan.facts.crosscheck
    assert check.ok, check.error
    assert check.missed_linears == {"hidden_blocks": ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out"),
                                    "blocks": ("attn.gate",)}
    tp = {b.attr: b for b in plan.parallelism.tp.block_lists}
    hidden, seen = tp["hidden_blocks"], tp["blocks"]
    assert hidden.layer_plan == {} and hidden.confidence == "low"
    assert seen.layer_plan and "attn.gate" not in seen.layer_plan and seen.confidence == "medium"
    assert plan.parallelism.tp.confidence == "low"
    lines = (tmp_path / "model.py").read_text().splitlines()
    for b, missed in ((hidden, "attn.to_q"), (seen, "attn.gate")):
        (ev,) = [e for e in b.evidence if "static read missed" in e.why]
        assert missed in ev.why and "meta device" in ev.why
        assert ev.file == str((tmp_path / "model.py").resolve())
        assert lines[ev.line - 1].strip().startswith("self.attn = "), (ev, lines[ev.line - 1])
        assert any("static read missed" in n for n in b.notes)
    assert "the layer plan is empty" in next(e for e in hidden.evidence if "static read missed" in e.why).why
    # without the probe the missed Linears are not known: a layer plan that has entries stays high, an empty one
    # is low all the same (it would shard nothing)
    unprobed = {b.attr: b.confidence for b in api.plan(flags, probe=False).parallelism.tp.block_lists}
    assert unprobed == {"hidden_blocks": "low", "blocks": "high"}
