"""Block lists as research repositories build them: a variable bound to a constructor then appended, a list
extended from a helper's, a class chosen per index. Each must be traced to its block class (issue 36, item 1;
measured on real repositories by bench/bench_thirdparty.py)."""

from __future__ import annotations

import textwrap

import pytest
from conftest import analyse_source

_BLOCKS = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim, last=False):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, c):
        x = x + self.proj(c)
        return x


class Other(Block):
    pass
'''

_FORWARD = '''
    def forward(self, x, c):
        for block in self.blocks:
            x = block(x, c)
        return x
'''

CASES = {
    "bound then appended": ('''
class Model(nn.Module):
    def __init__(self, dim=8, depth=4):
        super().__init__()
        blocks = []
        for i in range(depth):
            last = i == depth - 1
            block = Block(
                dim,
                last=last,
            )
            blocks.append(block)
        self.blocks = nn.ModuleList(blocks)
''', {"Block"}),
    "extended from a helper": ('''
class Model(nn.Module):
    def __init__(self, dim=8, depth=4):
        super().__init__()
        self.blocks = nn.ModuleList()
        self.blocks.extend(self._make(dim, depth))

    def _make(self, dim, depth):
        out = []
        for _ in range(depth):
            out.append(Block(dim))
        return out
''', {"Block"}),
    "a module function's list": ('''
def make_blocks(dim, depth):
    return [Block(dim) for _ in range(depth)]


class Model(nn.Module):
    def __init__(self, dim=8, depth=4):
        super().__init__()
        blocks = make_blocks(dim, depth)
        self.blocks = nn.ModuleList(blocks)
''', {"Block"}),
    "a class per index": ('''
class Model(nn.Module):
    def __init__(self, dim=8, depth=4):
        super().__init__()
        layers = []
        for i in range(depth):
            layer = Block(dim) if i % 2 else Other(dim)
            layers.append(layer)
        self.blocks = nn.ModuleList(layers)
''', {"Block", "Other"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_list_is_traced_to_its_block_class(case, tmp_path):
    body, classes = CASES[case]
    data = analyse_source(tmp_path, _BLOCKS + textwrap.dedent(body) + _FORWARD)
    (bl,) = [b for b in data["transformer"]["block_lists"] if b["attr"] == "blocks"]
    assert bl["is_blocks"], bl
    assert bl["block_class"] in classes, bl
    assert bl["forward_pattern"] == "Pattern_3", bl


def test_an_output_indexed_at_the_call_is_a_chain_that_needs_a_patch_functor(tmp_path):
    """`y = block(y, ...)[0]` (diffusers' T5FilmDecoder, traced since its list is built by appends): the stream `[0]`
    picks gives the pattern; cache-dit's wrapper returns the stream itself, which `[0]` would then slice, so the
    indexed-output rule asks for a PatchFunctor (by hand). Any other index is no pattern at all."""
    body = CASES["bound then appended"][0]
    text = _BLOCKS + textwrap.dedent(body) + _FORWARD.replace("x = block(x, c)", "x = block(x, c)[0]")
    data = analyse_source(tmp_path, text)["transformer"]
    (bl,) = data["block_lists"]
    assert bl["is_blocks"] is True and bl["forward_pattern"] == "Pattern_3", bl
    assert any("`x = block(x, c)[0]`" in r and "PatchFunctor" in r for r in data["patch_functor_reasons"]), data
    text = _BLOCKS + textwrap.dedent(body) + _FORWARD.replace("x = block(x, c)", "x = block(x, c)[1]")
    (bl,) = analyse_source(tmp_path, text)["transformer"]["block_lists"]
    assert bl["is_blocks"] is None and bl["forward_pattern"] is None and "`x = block(x, c)[1]`" in bl["why"], bl
