"""`forward` chosen at construction (issue 36, item 3): `self.forward = self._a if flag else self._b` in
`__init__`. The analysis follows the branch the constructor's defaults take, reads that method as forward and says
which and why; a condition the defaults do not decide leaves forward unknown."""

from __future__ import annotations

import textwrap

import pytest
from conftest import analyse_source

MODEL = '''
from torch import nn

DEFAULT_MODE = "fast"


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, c):
        x = x + self.proj(c)
        return x


class Model(nn.Module):
    def __init__(self, depth=2, {param}):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(depth)])
        self.forward = {choice}

    def _chained(self, x, c):
        for block in self.blocks:
            x = block(x, c)
        return x

    def _reference(self, x, c):
        return x
'''

CASES = {
    "flag off by default": ("use_reference=False", "self._reference if use_reference else self._chained", True),
    "a mode string": ('mode="fast"', 'self._chained if mode == "fast" else self._reference', True),
    "no condition": ("unused=None", "self._chained", True),
    # a default the analysis does not evaluate (a module constant): unknown, never a guess
    "the defaults do not decide": ("mode=DEFAULT_MODE", "self._chained if mode else self._reference", False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_assigned_in_init(tmp_path, case):
    param, choice, found = CASES[case]
    text = textwrap.dedent(MODEL).replace("{param}", param).replace("{choice}", choice)
    t = analyse_source(tmp_path, text)["transformer"]
    (bl,) = t["block_lists"]
    if found:
        assert bl["is_blocks"] and bl["forward_pattern"] == "Pattern_3", bl
        assert any(e["why"].startswith("forward is `_chained`") for e in bl["evidence"]), bl["evidence"]
        assert not any("defines no forward" in u for u in t["unknowns"]), t["unknowns"]
    else:
        assert any("defines no forward" in u for u in t["unknowns"]), t["unknowns"]
