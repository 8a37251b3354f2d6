"""A block class from an optional package that is not installed (issue 36, item 4): the list is unknown, with the
import line, never "library modules, not blocks"; `--block-class ATTR=path/to/file.py:Class` points at a source
the user has, and the analysis goes on from it."""

from __future__ import annotations

import textwrap

from conftest import run_cli, source_flags

from integrate import api

MODEL = '''
from torch import nn
from fastdit_kernels.blocks import FusedBlock


class Model(nn.Module):
    def __init__(self, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([FusedBlock(8) for _ in range(depth)])

    def forward(self, x, c):
        for block in self.blocks:
            x = block(x, c)
        return x
'''

BLOCK = '''
from torch import nn


class FusedBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, hidden_states, cond):
        hidden_states = hidden_states + self.proj(cond)
        return hidden_states
'''


def _flags(tmp_path, *block_class):
    return source_flags(tmp_path, textwrap.dedent(MODEL), block_class=block_class)


def test_a_block_class_from_a_package_not_installed_is_unknown_with_its_import(tmp_path):
    (bl,) = api.analysis_json(_flags(tmp_path), use_cache=False)["transformer"]["block_lists"]
    assert bl["is_blocks"] is None and bl["confidence"] == "unknown", bl
    assert "fastdit_kernels.blocks" in bl["why"] and "not installed" in bl["why"] and "model.py:3" in bl["why"], bl
    assert "--block-class blocks=path/to/file.py:Class" in bl["why"]


def test_a_source_the_user_has_is_read_in_its_place(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "blocks.py").write_text(textwrap.dedent(BLOCK))
    flags = _flags(tmp_path, f"blocks={tmp_path / 'kernels' / 'blocks.py'}:FusedBlock")
    (bl,) = api.analysis_json(flags, use_cache=False)["transformer"]["block_lists"]
    assert bl["is_blocks"] and bl["block_class"] == "FusedBlock" and bl["forward_pattern"], bl
    assert bl["block_file"].endswith("kernels/blocks.py")


def test_a_wrong_source_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "model.py").write_text(textwrap.dedent(MODEL))
    for value, says in (("blocks=nowhere.py:FusedBlock", "no such file"),
                        (f"blocks={tmp_path / 'model.py'}:Absent", "defines no class `Absent`"),
                        ("blocks=notes.txt:X", "expected ATTR=Class or ATTR=path/to/file.py:Class")):
        proc = run_cli("analyze", str(tmp_path / "model.py"), "--model-path", str(tmp_path), "--transformer-class",
                       "Model", "--no-pipeline", "--separate-cfg", "no", "--block-class", value)
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
