"""CFG read where the entry hands the steps to a function of its own (issue 36): `__call__` stores its guidance
scales on `self` and calls `self._denoise(...)`, whose loop over the schedule calls `self._predict(...)`, which
calls the transformer. The step loop is found through the entry's calls (breadth first, ENTRY_DEPTH deep, each
function once) and its branches are decided with the entry's values: the parameters' defaults, passed on as
arguments or through `self.<x>` and the properties that read them. The real case is OmniGen2's
`OmniGen2Pipeline.__call__` -> `processing` -> `predict` (bench/corpus.json)."""

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

PIPELINE = '''
import torch


class Pipe:
    @property
    def text_scale(self):
        return self._text_scale

    @property
    def image_scale(self):
        return self._image_scale

    def __call__(self, prompt=None, steps=28, text_scale={text}, image_scale={image}, window=(0.0, 1.0)):
        self._text_scale = text_scale
        self._image_scale = image_scale
        self._window = window
        latents = self._prepare(steps)
        return {call}

    def _prepare(self, steps):
        return torch.zeros(steps)

    def _denoise(self, latents, timesteps, cond, uncond):
        for i, t in enumerate(timesteps):
            pred = self._predict(latents, t, cond)
            text = self.text_scale if self._window[0] <= i / len(timesteps) <= self._window[1] else 1.0
            image = self.image_scale if self._window[0] <= i / len(timesteps) <= self._window[1] else 1.0
            if text > 1.0 and image > 1.0:
                ref = self._predict(latents, t, uncond)
                bare = self._predict(latents, t, None)
                pred = bare + image * (ref - bare) + text * (pred - ref)
            elif text > 1.0:
                bare = self._predict(latents, t, uncond)
                pred = bare + text * (pred - bare)
            latents = latents - pred
        return latents

    def _predict(self, latents, t, cond):
        return self.transformer(latents, t, cond)
'''

CALL = "self._denoise(latents, torch.arange(steps), prompt, None)"


def _pipeline(tmp_path, text="4.0", image="1.0", call=CALL, more=""):
    source = textwrap.dedent(PIPELINE).format(text=text, image=image, call=call) + textwrap.indent(
        textwrap.dedent(more), "    ")  # more methods of the pipeline
    (tmp_path / "pipe.py").write_text(source)
    return analyse_source(tmp_path, textwrap.dedent(MODEL), "Net", pipeline_class="Pipe.__call__",
                          pipeline_file=str(tmp_path / "pipe.py"))["pipeline"]


@pytest.mark.parametrize("text,image,separate,calls", [("4.0", "1.0", True, 2),   # cond, then uncond
                                                       ("1.0", "1.0", False, 1),  # no guidance by default
                                                       ("4.0", "2.0", None, 3)])  # cond, ref and uncond
def test_the_step_loop_one_helper_away_is_read_with_the_entrys_defaults(tmp_path, text, image, separate, calls):
    p = _pipeline(tmp_path, text, image)
    assert p["has_separate_cfg"] is separate and p["transformer_calls"] == calls, p
    first = p["evidence"][0]["why"]
    assert first.startswith("`__call__` calls `self._denoise(...)`, whose loop runs the steps"), first
    assert f"`self._text_scale` = {float(text)!r}" in first, first


def test_a_value_the_entry_passes_as_an_argument_decides_the_branch(tmp_path):
    call = "self._run(latents, torch.arange(steps), prompt, text_scale)"
    more = '''
    def _run(self, latents, timesteps, cond, scale):
        for t in timesteps:
            pred = self._predict(latents, t, cond)
            if scale > 1.0:
                pred = pred + scale * (pred - self._predict(latents, t, None))
            latents = latents - pred
        return latents
    '''
    assert _pipeline(tmp_path, "4.0", call=call, more=more)["has_separate_cfg"] is True
    (tmp_path / "off").mkdir()
    assert _pipeline(tmp_path / "off", "1.0", call=call, more=more)["has_separate_cfg"] is False


def test_a_loop_not_over_the_schedule_is_not_the_step_loop(tmp_path):
    call = "self._encode(latents, prompt)"
    more = '''
    def _encode(self, latents, prompts):
        for p in prompts:
            latents = self.transformer(latents, p)
        return latents
    '''
    p = _pipeline(tmp_path, call=call, more=more)
    assert p["has_separate_cfg"] is None and p["confidence"] == "unknown", p
    assert p["evidence"][0]["why"] == "no transformer call inside a loop in `__call__`", p["evidence"]


def test_helpers_that_call_each_other_end(tmp_path):
    call = "self._a(latents)"
    more = '''
    def _a(self, latents):
        return self._b(latents)

    def _b(self, latents):
        return self._a(latents)
    '''
    p = _pipeline(tmp_path, call=call, more=more)
    assert p["has_separate_cfg"] is None and p["confidence"] == "unknown", p


def test_a_step_loop_deeper_than_the_bound_is_unknown(tmp_path):
    call = "self._d1(latents, torch.arange(steps), prompt, None)"
    more = "".join(f'''
    def _d{i}(self, latents, timesteps, cond, uncond):
        return self._d{i + 1}(latents, timesteps, cond, uncond)
    ''' for i in range(1, 4)) + '''
    def _d4(self, latents, timesteps, cond, uncond):
        return self._denoise(latents, timesteps, cond, uncond)
    '''
    p = _pipeline(tmp_path, call=call, more=more)
    assert p["has_separate_cfg"] is None and p["confidence"] == "unknown", p


def test_a_step_loop_that_calls_a_callable_it_is_given_says_so(tmp_path):
    """A sampler whose loop calls `func`, a parameter (OmniGen's scheduler: `pred, cache = func(z, t, ...)`): which
    model or guidance wrapper the caller passes is not in the function, so the CFG style is unknown, and the
    evidence points at that call, not at a loop with no model call."""
    sampler = '''
    import torch


    class Sampler:
        def __call__(self, z, func, model_kwargs, steps=4):
            for i in range(steps):
                t = torch.zeros(len(z)) + i
                pred = func(z, t, **model_kwargs)
                z = z + pred
            return z
    '''
    (tmp_path / "sampler.py").write_text(textwrap.dedent(sampler))
    p = analyse_source(tmp_path, textwrap.dedent(MODEL), "Net", pipeline_class="Sampler.__call__",
                       pipeline_file=str(tmp_path / "sampler.py"))["pipeline"]
    assert p["has_separate_cfg"] is None and p["confidence"] == "unknown", p
    (ev,) = p["evidence"]
    assert ev["line"] == 9 and "`func`, a parameter of `__call__`" in ev["why"], ev
