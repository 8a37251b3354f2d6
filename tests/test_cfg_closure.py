"""CFG read through a closure factory and a sampler in other modules (issue 36): the entry wraps the transformer
with a function imported from another module of the repository, which returns an inner def that calls it once or
twice by a guidance scale it reads from its keyword arguments; the step loop is in a sampler class of a third
module, constructed and run in one expression by an imported function. The repository is laid out as folders
without `__init__.py`, imported from its root. The real case is FramePack's `sample_hunyuan` -> `fm_wrapper`,
`sample_unipc` -> `FlowMatchUniPC(...).sample` (bench/corpus.json)."""

from __future__ import annotations

import textwrap

import pytest
from conftest import analyse_source

MODEL = '''
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, c):
        return x + self.proj(c)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])

    def forward(self, x, c):
        for block in self.blocks:
            x = block(x, c)
        return x
'''

ENTRY = '''
import torch

from kit.guide.wrap import make_denoiser
from kit.solvers.euler import run_euler


def sample(transformer, latents, sigmas, cond, uncond, cfg{default}):
    denoiser = make_denoiser(transformer)
    extra = dict(cfg_scale=cfg, positive=dict(c=cond), negative=dict(c=uncond))
    return run_euler(denoiser, latents, sigmas, extra_args=extra)
'''

WRAP = '''
import torch


def make_denoiser(transformer, scale=1000.0):
    def denoise(x, sigma, **extra_args):
        cfg_scale = extra_args["cfg_scale"]
        positive = transformer(x, sigma * scale, **extra_args["positive"])
        if cfg_scale == 1.0:
            negative = torch.zeros_like(positive)
        else:
            negative = transformer(x, sigma * scale, **extra_args["negative"])
        return negative + cfg_scale * (positive - negative)

    return denoise
'''

SOLVER = '''
class Euler:
    def __init__(self, model, extra_args):
        self.model = model
        self.extra_args = extra_args

    def model_fn(self, x, sigma):
        return self.model(x, sigma, **self.extra_args)

    def sample(self, x, sigmas):
        for i in range(len(sigmas) - 1):
            x = x + (sigmas[i + 1] - sigmas[i]) * self.model_fn(x, sigmas[i])
        return x


def run_euler(model, x, sigmas, extra_args=None):
    return Euler(model, extra_args=extra_args).sample(x, sigmas)
'''


def line_of(text: str, part: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if part in line)


def _repository(tmp_path, default: str, without: str = ""):
    for rel, text in (("kit/pipelines/sampling.py", ENTRY.format(default=default)), ("kit/guide/wrap.py", WRAP),
                      ("kit/solvers/euler.py", SOLVER), ("kit/models/model.py", MODEL)):
        if rel == without:
            continue
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text))
    return analyse_source(tmp_path / "kit" / "models", None, "Net", pipeline_class="sample",
                          pipeline_file=str(tmp_path / "kit" / "pipelines" / "sampling.py"))["pipeline"]


@pytest.mark.parametrize("default,separate,calls", [("=1.0", False, 1), ("=4.0", True, 2)])
def test_the_calls_the_closure_makes_at_the_entrys_default(tmp_path, default, separate, calls):
    p = _repository(tmp_path, default)
    assert p["has_separate_cfg"] is separate and p["transformer_calls"] == calls, p
    assert p["confidence"] == "medium", p  # read through two other modules
    why = [(e["file"].rsplit("/", 2)[-2:], e["line"], e["why"]) for e in p["evidence"]]
    assert why[0] == (["pipelines", "sampling.py"], line_of(ENTRY, "return run_euler"),
                      "`sample` calls `run_euler(...)`"), why
    assert why[1][0] == ["solvers", "euler.py"] and why[1][2].startswith(
        "`run_euler` calls `Euler(...).sample(...)`, whose loop runs the steps"), why
    assert "`self.model` = `denoise` from `make_denoiser(...)`" in why[1][2], why
    closure = next(w for w in why if w[0] == ["guide", "wrap.py"] and "the function" in w[2])
    first, second = line_of(WRAP, "positive = transformer"), line_of(WRAP, "negative = transformer")
    said = (f"`self.model` is `denoise`, the function `make_denoiser(...)` returns: it calls the model at :{first}, "
            f":{second}, {calls} time(s) along one path with the values passed here")
    assert closure[2] == said, closure


def test_a_scale_the_entry_does_not_give_leaves_both_calls_possible(tmp_path):
    p = _repository(tmp_path, "")
    assert p["has_separate_cfg"] is True and p["transformer_calls"] == 2, p  # as for any undecided branch


def test_without_the_repository_layout_the_sampler_is_not_followed(tmp_path):
    """The sampler module is missing: the import is not the repository's, nothing is guessed."""
    p = _repository(tmp_path, "=1.0", without="kit/solvers/euler.py")
    assert p["has_separate_cfg"] is None and p["confidence"] == "unknown", p
