"""CFG read at the callers of a sampler whose step loop calls a callable it is given (`func(z, t, **kwargs)`): the
pipeline picks a guidance method of its model by a flag's default (`if separate_cfg_infer: func =
self.model.forward_with_separate_cfg`), and that method runs forward once per condition in a loop, or once on a
doubled batch. The real case is OmniGen's `OmniGenScheduler.__call__` (../shared/thirdparty/corpus.json, judged by
bench/bench_thirdparty.py); these are its shape in a few lines, each variant a valid or an invalid example."""

from __future__ import annotations

import textwrap

import pytest
from conftest import analyse_source

TRANSFORMER = '''
from torch import nn


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return x + self.proj(x)


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer() for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
'''

GENERATOR = '''
import torch
from torch import nn

from .model import Backbone


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.llm = Backbone()

    def forward(self, x, t, cond):
        return self.llm(x + cond)

    def forward_with_cfg(self, x, t, cond, scale):
        out = self.forward(torch.cat([x, x]), t, cond)
        c, u = out.chunk(2)
        return u + scale * (c - u)

    def forward_with_separate_cfg(self, x, t, cond, scale):
        outs = []
        for i in range(len(cond)):
            outs.append(self.forward(x, t, cond[i]))
        return outs[1] + scale * (outs[0] - outs[1])
'''

SCHEDULER = '''
class Scheduler:
    def __init__(self, num_steps=10):
        self.num_steps = num_steps

    def __call__(self, z, func, model_kwargs):
        timesteps = [i / self.num_steps for i in range(self.num_steps)]
        for i in range(self.num_steps):
            pred = func(z, timesteps[i], **model_kwargs)
            z = z + pred
        return z
'''

PIPELINE = '''
from .generator import Generator
from .scheduler import Scheduler


class Pipeline:
    def __init__(self, model: Generator):
        self.model = model

    def __call__(self, z, cond, scale=3.0, separate_cfg_infer{default}):
        if separate_cfg_infer:
            func = self.model.forward_with_separate_cfg
        else:
            func = self.model.forward_with_cfg
        scheduler = Scheduler(num_steps=4)
        return scheduler(z, func, dict(cond=cond, scale=scale))
'''


def _analysed(tmp_path, default: str, extra: str = "") -> dict:
    pkg = tmp_path / "gen"
    pkg.mkdir()
    for name, text in (("__init__.py", ""), ("model.py", TRANSFORMER), ("generator.py", GENERATOR),
                       ("scheduler.py", SCHEDULER), ("pipeline.py", PIPELINE.format(default=default) + extra)):
        (pkg / name).write_text(textwrap.dedent(text))
    return analyse_source(pkg, None, "Backbone", pipeline_class="Scheduler.__call__",
                          pipeline_file=str(pkg / "scheduler.py"))["pipeline"]


@pytest.mark.parametrize("default, separate, method", [
    (": bool = True", True, "forward_with_separate_cfg"),  # once per condition, in a loop
    ("=False", False, "forward_with_cfg"),  # once, on a batch doubled with torch.cat
])
def test_the_method_the_caller_passes_by_its_default_decides(tmp_path, default, separate, method):
    p = _analysed(tmp_path, default)
    assert p["has_separate_cfg"] is separate and p["confidence"] == "medium", p
    why = [(e["file"].rsplit("/", 1)[-1], e["why"]) for e in p["evidence"]]
    assert why[1] == ("scheduler.py", "the step calls `func`, a parameter of `__call__`, once; read at its callers")
    assert why[2][0] == "pipeline.py" and "`Pipeline.__call__` calls `scheduler(...)`" in why[2][1], why
    assert f"`func` = `self.model.{method}`" in why[3][1] and "default `separate_cfg_infer`" in why[3][1], why
    assert "`self.model` is the `model: Generator`" in why[4][1], why
    assert why[-1][0] == "generator.py" and f"`Generator.{method}`" in why[-1][1], why


def test_a_flag_without_a_default_leaves_the_style_unknown(tmp_path):
    p = _analysed(tmp_path, "")
    assert p["has_separate_cfg"] is None and p["confidence"] == "unknown", p
    assert "a parameter of `__call__`" in p["evidence"][0]["why"], p


def test_a_caller_whose_choice_is_not_read_leaves_the_style_unknown(tmp_path):
    """A second caller hands the sampler a method of a parameter, not of a model its class holds: no answer rather
    than one from the first caller alone."""
    other = '''

def batched(model: Generator, z, cond):
    return Scheduler()(z, model.forward_with_cfg, dict(cond=cond, scale=1.0))
'''
    p = _analysed(tmp_path, "=True", other)
    assert p["has_separate_cfg"] is None and p["confidence"] == "unknown", p
