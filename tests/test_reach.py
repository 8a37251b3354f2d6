"""Only code that runs while the list is wrapped counts (issue 36, item 6): a walk over the blocks in a method
forward never reaches (a parameter count, a helper for training) is no pitfall; one forward reaches is. The real
case is HunyuanVideo's `params_count` (bench/bench_thirdparty.py)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest
from conftest import analyse_source

from integrate.analyzers.reach import forward_entries, reached_methods

CLASS = '''
class Model(nn.Module):
    def __init__(self, cfg=False):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.forward = self._with_cfg if cfg else self._plain

    @property
    def width(self):
        return self._count()

    def _count(self):
        return len(self.blocks)

    def _with_cfg(self, x):
        return self._run(x) * self.width

    def _plain(self, x):
        return checkpoint(self._run, x)

    def _run(self, x):
        for block in self.blocks:
            x = block(x)
        return x

    def params_count(self):
        return sum(p.numel() for block in self.blocks for p in block.parameters())
'''


def test_reached_methods_follow_calls_hand_offs_properties_and_a_forward_set_in_init():
    cls = cst.parse_module(CLASS).body[0]
    assert forward_entries(cls) == ["_with_cfg", "_plain"]
    assert reached_methods(cls) == {"_with_cfg", "_plain", "_run", "width", "_count"}


def test_a_class_without_a_forward_of_its_own_is_unknown():
    assert reached_methods(cst.parse_module("class M(Base):\n    def f(self):\n        pass\n").body[0]) is None


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


class Model(nn.Module):
    def __init__(self, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(depth)])

    def forward(self, x, c):
        {forward}
        for block in self.blocks:
            x = block(x, c)
        return x

    def params_count(self):
        return sum(sum(p.numel() for p in block.proj.parameters()) for block in self.blocks) + len(self.blocks)
'''


@pytest.mark.parametrize("forward,flagged", [("pass", False), ("n = self.params_count()", True)])
def test_a_walk_counts_only_where_forward_reaches_it(tmp_path, forward, flagged):
    t = analyse_source(tmp_path, textwrap.dedent(MODEL).replace("{forward}", forward))["transformer"]
    reasons = " ".join(t["patch_functor_reasons"])
    assert ("restructure" in reasons) is flagged, reasons
    assert t["needs_patch_functor"] is flagged
