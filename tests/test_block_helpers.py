"""Blocks called through a helper that receives the block (issue 36, item 2): a repository's own checkpoint helper
is read and, where it calls the block with the rest of its arguments, bound as a direct call; one whose body cannot
be read leaves the list unknown with its line, never "not looped over"."""

from __future__ import annotations

import textwrap

import pytest
from conftest import analyse_source

HEAD = '''
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
{imports}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, c):
        x = x + self.proj(c)
        return x

{helper}

class Model(nn.Module):
    def __init__(self, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(depth)])
        self.ckpt = False

    def forward(self, x, c):
        for block in self.blocks:
            x = {call}
        return x
'''

OWN = '''
def auto_grad_checkpoint(module, *args, **kwargs):
    if getattr(module, "grad_checkpointing", False):
        return checkpoint(module, *args, use_reentrant=False, **kwargs)
    return module(*args, **kwargs)
'''

CASES = {
    "torch's checkpoint": ("", "", "checkpoint(block, x, c)", True),
    "the repository's own helper": ("", OWN, "auto_grad_checkpoint(block, x, c)", True),
    "a method of the model": ("", "", "self._run(block, x, c)", True),
    "a helper from an uninstalled package": ("from fastlayers import fused_run", "", "fused_run(block, x, c)", None),
}

METHOD = '''
    def _run(self, module, *args):
        if self.ckpt:
            return checkpoint(module, *args)
        return module(*args)
'''


@pytest.mark.parametrize("case", list(CASES))
def test_a_block_handed_to_a_helper(tmp_path, case):
    imports, helper, call, chained = CASES[case]
    text = textwrap.dedent(HEAD).format(imports=imports, helper=helper, call=call)
    if "self._run" in call:
        text += METHOD
    (bl,) = analyse_source(tmp_path, text)["transformer"]["block_lists"]
    assert bl["is_blocks"] is chained, bl
    if chained:
        assert bl["forward_pattern"] == "Pattern_3", bl
    else:
        assert "fused_run" in bl["why"] and "unknown" in bl["why"] and bl["confidence"] == "unknown", bl
        assert any(e["line"] == text.splitlines().index("            x = fused_run(block, x, c)") + 1
                   for e in bl["evidence"]), bl["evidence"]
