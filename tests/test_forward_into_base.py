"""A forward that hands the call on to a base class this machine cannot read (issue 36): no block list and no
unknown was a silent empty answer. `super().forward(**kwargs)` into a base from a package that is not installed
leaves the block lists unknown, with that line and the base's import; the plan says no block list was found and
decides no PatchFunctor. A folder of the repository named like the package (on the import path) is not taken for
it. The real case is CogVideo's SAT `DiffusionTransformer(BaseModel)`, `super().forward(**kwargs)` at
dit_video_concat.py:898 into SwissArmyTransformer's `sat.model.base_model`, beside the repository's own `sat/`
folder (bench/corpus.json)."""

from __future__ import annotations

import importlib
import textwrap

import pytest
from conftest import analyse_source, source_flags

MODEL = '''
import torch
from torch import nn
from fardit.model.base import BaseModel
{more_imports}


class Local(nn.Module):
    def forward(self, x):
        return x


class Model({base}):
    def __init__(self, hidden=8):
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x, **kwargs):
        kwargs["images"] = self.proj(x)
        output = {call}
        return output
'''

def model(base="BaseModel", call="super().forward(**kwargs)[0]", more_imports=""):
    return textwrap.dedent(MODEL).format(base=base, call=call, more_imports=more_imports)


@pytest.mark.parametrize("call", ["super().forward(**kwargs)", "BaseModel.forward(self, **kwargs)"])
def test_a_forward_handed_to_a_base_nobody_can_read_leaves_the_block_lists_unknown(tmp_path, call):
    source = model(call=call + "[0]")
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "output = " in text)
    t = analyse_source(tmp_path, source)["transformer"]
    assert t["block_lists"] == [], t["block_lists"]
    (unknown,) = t["unknowns"]
    assert unknown.startswith(f"block lists: `Model.forward` hands the call on to `{call}`, into its base `BaseModel` "
                              "from `fardit.model.base`, which is not installed here, imported at model.py:4"), unknown
    assert unknown.endswith(f"(model.py:{line})"), unknown


@pytest.mark.parametrize("base,call", [("Local", "super().forward(x)"), ("nn.Module", "self.proj(x)"),
                                       ("BaseModel", "self.proj(x)")])
def test_a_base_that_is_read_or_not_called_is_no_unknown(tmp_path, base, call):
    t = analyse_source(tmp_path, model(base=base, call=call))["transformer"]
    assert t["unknowns"] == [], t["unknowns"]


def test_the_plan_says_no_block_list_was_found_and_decides_no_patch_functor(tmp_path):
    from integrate import api

    api.write_plan(api.plan(source_flags(tmp_path, model()), probe=False), tmp_path / "plan")
    text = (tmp_path / "plan" / "PLAN.md").read_text()
    assert "- **No block list to cache**: the analysis could not tell where the blocks are" in text, text
    assert "- PatchFunctor: not decided (no block list)" in text, text
    assert "hands the call on to `super().forward(**kwargs)`" in text.split("## 1. Cache")[0], text


def test_a_repository_folder_named_like_the_package_is_not_the_package(tmp_path, monkeypatch):
    (tmp_path / "repo" / "fardit").mkdir(parents=True)  # the repository's own `fardit/`: no model/base.py
    (tmp_path / "repo" / "fardit" / "train.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "repo"))
    importlib.invalidate_caches()
    (tmp_path / "m1").mkdir()
    t = analyse_source(tmp_path / "m1", model())["transformer"]
    (unknown,) = t["unknowns"]
    assert (f"which is not installed here: `fardit` resolves to {tmp_path / 'repo' / 'fardit'}, which holds no "
            "fardit/model/base.py (a folder of the same name, not that package)") in unknown, unknown
    # the same for a block class imported from it
    blocks = model(call="self.blocks[0](x)", more_imports="from fardit.blocks import Block").replace(
        "self.proj = nn.Linear(hidden, hidden)", "self.proj = nn.Linear(hidden, hidden)\n"
        "        self.blocks = nn.ModuleList([Block() for _ in range(2)])").replace(
        "        output = self.blocks[0](x)", "        for block in self.blocks:\n            x = block(x)\n"
        "        output = x")
    (tmp_path / "m2").mkdir()
    (bl,) = analyse_source(tmp_path / "m2", blocks)["transformer"]["block_lists"]
    assert bl["is_blocks"] is None and "`fardit` resolves to" in bl["why"] and "not that package" in bl["why"], bl
