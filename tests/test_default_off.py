"""Code the constructor's defaults switch off is not a pitfall (issue 36, item 6 continued): a read of the list or
a statement of the loop body under `if self.<flag>:` whose only assignment in the class is a constant at the top of
`__init__` (or a constructor parameter, read from the model's config where it has it, else from its default) does
not run by default. It stays a low-confidence note that says why; a flag a method of the class or of a base in the
repository assigns again may be flipped, and counts as reached. The real case is OmniGen2's
`if self.enable_teacache: ... self.layers[0].norm1(...)` (bench/corpus.json)."""

from __future__ import annotations

import json
import textwrap

import libcst as cst
import pytest
from conftest import analyse_source, block_list

from integrate.source import parse_source

MODEL = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 8)

    def forward(self, hidden_states, temb):
        return hidden_states + self.proj(self.norm(hidden_states) + temb)


class Base(nn.Module):
    def switch(self):
        {base}


class Model(Base):
    def __init__(self, depth=2, use_cache={default}):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(depth)])
        self.enable_cache = {init}
        self.state = {{}}

    def forward(self, hidden_states, temb):
        if self.enable_cache:
            probe = self.blocks[0].norm(hidden_states)
            temb = temb + probe.mean()
        for i, block in enumerate(self.blocks):
            hidden_states = block(hidden_states, temb)
        return hidden_states
{more}
'''



def line_of(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


def model(init="False", default="False", base="pass", more=""):
    return textwrap.dedent(MODEL).format(init=init, default=default, base=base, more=more)


INIT_LINE, READ_LINE = line_of(model(), "self.enable_cache = "), line_of(model(), "self.blocks[0]")


def reasons(t):
    return " ".join(t["patch_functor_reasons"])


@pytest.mark.parametrize("init,default", [("False", "False"), ("use_cache", "False"), ("use_cache", "None")])
def test_a_read_under_a_flag_off_by_default_is_a_note_not_a_pitfall(tmp_path, init, default):
    t = analyse_source(tmp_path, model(init=init, default=default))["transformer"]
    assert t["patch_functor_reasons"] == [] and t["needs_patch_functor"] is False, t["patch_functor_reasons"]
    (note,) = [n for n in block_list({"transformer": t}, "blocks")["notes"] if "self.blocks[0]" in n]
    assert note.startswith("if switched on: indexed as `self.blocks[0]`") and f"(line {READ_LINE})" in note, note
    assert f"off by default: `self.enable_cache = {init}` at :{INIT_LINE}" in note, note
    if init == "use_cache":
        assert f"`use_cache={default}` by default" in note, note


@pytest.mark.parametrize("case", ["flag on by default", "the class flips it", "a base in the repository flips it",
                                  "assigned twice", "the model's config turns it on"])
def test_a_flag_that_may_be_on_leaves_the_read_a_pitfall(tmp_path, case):
    kw = {"flag on by default": dict(init="True"),
          "the class flips it": dict(more="\n    def turn_on(self):\n        self.enable_cache = True\n"),
          "a base in the repository flips it": dict(base="self.enable_cache = True"),
          "assigned twice": dict(more="\n    def reset(self):\n        self.enable_cache = False\n"),
          "the model's config turns it on": dict(init="use_cache")}[case]
    source = model(**kw)
    if case == "the model's config turns it on":
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text(json.dumps({"_class_name": "Model", "use_cache": True}))
    t = analyse_source(tmp_path, source)["transformer"]
    assert f"indexed as `self.blocks[0]` in forward (line {READ_LINE})" in reasons(t), t["patch_functor_reasons"]
    assert t["needs_patch_functor"] is True


def test_a_config_that_leaves_the_flag_off_is_said(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"_class_name": "Model", "use_cache": False}))
    t = analyse_source(tmp_path, model(init="use_cache", default="True"))["transformer"]
    assert t["patch_functor_reasons"] == [], t["patch_functor_reasons"]
    notes = block_list({"transformer": t}, "blocks")["notes"]
    assert any("`use_cache: False` in the model's config" in n for n in notes), notes


LOOPS = '''
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, hidden_states, temb):
        return hidden_states + self.proj(temb)


class Model(nn.Module):
    def __init__(self, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(depth)])
        self.fast = False
        self.current = {}

    def forward(self, hidden_states, temb):
        tracing = getattr(self, "tracing", False)
        if self.fast:
            for block in self.blocks:
                hidden_states = block(temb, hidden_states)
        else:
            for i, block in enumerate(self.blocks):
                if tracing:
                    self.current["layer"] = i
                hidden_states = block(hidden_states, temb)
        return hidden_states
'''


def test_the_walk_the_defaults_run_is_read_and_a_switched_off_statement_is_inactive(tmp_path):
    source = textwrap.dedent(LOOPS)
    bl = block_list(analyse_source(tmp_path, source), "blocks")
    plain, fast = line_of(source, "in enumerate(self.blocks)"), line_of(source, "for block in self.blocks")
    assert bl["call_site"]["loop_line"] == plain and bl["call_site"]["call"] == "block(hidden_states, temb)", bl
    flag = line_of(source, "self.fast = False")
    assert any(e["line"] == fast and f"the walk at line {fast} is off by default: `self.fast = False` at :{flag}"
               in e["why"] for e in bl["evidence"]), bl["evidence"]
    (op,) = bl["call_site"]["loop_extra_ops"]
    assert op["line"] == line_of(source, "if tracing:") and op["kind"] == "index_dependent", op
    assert op["active_by_default"] is False, op
    assert "no method of the class or of its bases in the repository assigns `self.tracing`" in op["why"], op


def test_a_local_read_from_a_flag_the_class_sets_is_reached(tmp_path):
    source = textwrap.dedent(LOOPS) + "\n    def trace(self):\n        self.tracing = True\n"
    data = analyse_source(tmp_path, source)
    (op,) = block_list(data, "blocks")["call_site"]["loop_extra_ops"]
    assert op["active_by_default"] is True, op
    assert "pitfall B" in reasons(data["transformer"])


ARMS = '''
class M:
    def __init__(self, mode="plain", n=0):
        self.mode = mode
        self.n = n
        self.other = object()

    def f(self, x):
        if self.mode == "fast":
            a = 1
        elif self.n > 0:
            b = 2
        else:
            c = 3
        if self.other:
            d = 4
        with x:
            if not self.n:
                e = 5
'''


@pytest.mark.parametrize("stmt,off", [("a = 1", 'self.mode == "fast"'), ("b = 2", "self.n > 0"), ("c = 3", None),
                                      ("d = 4", None), ("e = 5", None)])
def test_each_arm_of_an_if_elif_else_chain_is_judged_by_the_tests_before_it(tmp_path, stmt, off):
    from integrate.analyzers.reach import Defaults

    src = parse_source(tmp_path / "m.py", ARMS)
    cls = next(n for n in src.module.body if isinstance(n, cst.ClassDef))
    found = Defaults(None, src, cls).off("f", line_of(ARMS, stmt))
    if off is None:
        assert found is None, found
    else:
        assert found is not None and f"`{off}` is False" in found.why, found
