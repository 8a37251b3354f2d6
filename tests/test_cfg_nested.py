"""CFG read through the calls a research sampler makes (issue 36, item 7): the step loop calls a function of its
own that calls the model, possibly through further helpers; the entry may be the transformer's own guidance method.
The real cases are Mochi's `sample_model` (a nested `model_fn`) and Lumina-Image 2.0's `NextDiT.forward_with_cfg`
(bench/bench_thirdparty.py)."""

from __future__ import annotations

import textwrap

import pytest
from conftest import analyse_source

MODEL = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, c):
        x = x + self.proj(c)
        return x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])

    def forward(self, x, c):
        for block in self.blocks:
            x = block(x, c)
        return x

    def forward_with_cfg(self, x, c, scale, trunc=100):
        half = x[: len(x) // 2]
        if c[0] < trunc:
            both = torch.cat([half, half], dim=0)
            out = self.forward(both, c)
            cond, uncond = out.chunk(2)
            eps = uncond + scale * (cond - uncond)
        else:
            eps = self.forward(half, c)
        return torch.cat([eps, eps], dim=0)
'''

SAMPLERS = {
    # a nested function of the sampler calls the model once per condition unless the batch was prepared
    "nested, separate": ('''
def sample(dit, z, steps, conditioning):
    batched = conditioning.get("batched")

    def model_fn(z, t):
        if batched:
            out = dit(z, t)
            cond, uncond = out.chunk(2)
        else:
            cond = dit(z, t)
            uncond = dit(z, t * 0)
        return uncond + 4.0 * (cond - uncond)

    for i in range(steps):
        pred = model_fn(z, i)
        z = z + pred
    return z
''', "sample", True),
    # sampler -> step -> model mean -> model, on a doubled batch
    "three calls deep, batched": ('''
def model_mean(net, z, t):
    out = net(torch.cat([z, z]), t)
    cond, uncond = out.chunk(2)
    return uncond + 4.0 * (cond - uncond)


def step(net, z, t):
    return z + model_mean(net, z, t)


def sample(net, z, timesteps):
    for t in timesteps:
        z = step(net, z, t)
    return z
''', "sample", False),
}


def _analyse(tmp_path, sampler: str, entry: str):
    (tmp_path / "sampling.py").write_text("import torch\n\n" + textwrap.dedent(sampler))
    return analyse_source(tmp_path, textwrap.dedent(MODEL), "Net", pipeline_class=entry,
                          pipeline_file=str(tmp_path / "sampling.py"))["pipeline"]


@pytest.mark.parametrize("case", list(SAMPLERS))
def test_the_model_call_is_found_through_the_samplers_functions(tmp_path, case):
    sampler, entry, separate = SAMPLERS[case]
    p = _analyse(tmp_path, sampler, entry)
    assert p["has_separate_cfg"] is separate, p


def test_the_transformers_own_guidance_method_as_the_entry(tmp_path):
    p = analyse_source(tmp_path, textwrap.dedent(MODEL), "Net", pipeline_class="Net.forward_with_cfg",
                       pipeline_file=str(tmp_path / "model.py"))["pipeline"]
    assert p["has_separate_cfg"] is False, p  # forward once per path, on a doubled batch
    assert any("doubled" in e["why"] for e in p["evidence"]), p["evidence"]
