"""A per-block argument of the block call (issue 36, item 5): `skip=i in self.skip_layers` is evaluated once by
cache-dit's wrapper; the PatchFunctor's per-block pre-hook gives each block its own value. Proved with the cache
proof on a fixture whose input makes the value differ per block (a skipped layer), and shown to fail without it."""

from __future__ import annotations

import textwrap

from conftest import source_flags

from integrate import api

MODEL = '''
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, c, skip=False):
        if skip:
            return x
        x = x + self.proj(c)
        return x


class Model(nn.Module):
    def __init__(self, depth=2, skip_layers=()):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(depth)])
        self.skip_layers = skip_layers

    def forward(self, x, c):
        for i, block in enumerate(self.blocks):
            x = block(x, c, skip=i in self.skip_layers)
        return x
'''


def _fixture(out, skip=True):
    """The derived fixture, given what a user would: tensor inputs, and (`skip`) a skipped layer."""
    path = out / "verify_fixture.py"
    text = path.read_text()
    head, _, _ = text.partition("def inputs(step):")
    head = head.replace('"depth": 2,\n    "skip_layers": [],', '"depth": 3,\n    "skip_layers": [1],' if skip
                        else '"depth": 3,\n    "skip_layers": [],')
    assert '"depth": 3' in head
    path.write_text(head + 'def inputs(step):\n'
                           '    return {"x": _randn("x", 1, 16, 8, step=step), "c": _randn("c", 1, 16, 8)}\n')


def test_each_block_gets_its_own_value_and_the_cache_proof_shows_it(tmp_path):
    flags = source_flags(tmp_path, textwrap.dedent(MODEL))
    plan = api.plan(flags, probe=False, trust_code=True)
    assert any("per-block argument `skip=i in self.skip_layers`" in r for r in plan.cache.patch_functor_reasons)
    api.write_plan(plan, tmp_path / "plan")
    api.approve(tmp_path / "plan", "test")
    report = api.generate(tmp_path / "plan", out=tmp_path / "out")
    assert not any("per-block" in m for m in report.manual), report.manual
    functor = next((tmp_path / "out").glob("*/patch_functor.py"))
    assert 'kwargs["skip"] = skip_of_block' in functor.read_text()
    api.verify(tmp_path / "plan", tmp_path / "out", fixture_only=True, trust_code=True)  # writes the fixture file
    _fixture(tmp_path / "out")
    proof = api.verify(tmp_path / "plan", tmp_path / "out", proofs=("cache",), trust_code=True).cache
    assert proof.status == "pass" and proof.caching_off.bitwise, proof
    # the proof shows the fix acted: a hook per block, run, and `skip` reaching the blocks with two values
    assert proof.per_block.hooks == 3 and proof.per_block.fired and proof.per_block.varying == ("0:skip",), proof
    # the same proof with the hook's assignment taken out: block 0's value reaches every block
    functor.write_text(functor.read_text().replace('kwargs["skip"] = skip_of_block', "pass"))
    proof = api.verify(tmp_path / "plan", tmp_path / "out", proofs=("cache",), trust_code=True).cache
    assert proof.status == "fail" and not proof.caching_off.bitwise, proof


def test_a_fixture_that_never_makes_the_argument_differ_proves_nothing(tmp_path):
    """A fixture that skips no layer: every block gets skip=False, with or without the fix, so
    the cache proof cannot tell them apart: vacuous, with why, never a pass."""
    flags = source_flags(tmp_path, textwrap.dedent(MODEL))
    api.write_plan(api.plan(flags, probe=False, trust_code=True), tmp_path / "plan")
    api.approve(tmp_path / "plan", "test")
    api.generate(tmp_path / "plan", out=tmp_path / "out")
    api.verify(tmp_path / "plan", tmp_path / "out", fixture_only=True, trust_code=True)
    _fixture(tmp_path / "out", skip=False)
    proof = api.verify(tmp_path / "plan", tmp_path / "out", proofs=("cache",), trust_code=True).cache
    assert proof.status == "vacuous" and "every block received the same keyword values" in proof.why, proof
    assert proof.per_block.fired and proof.per_block.varying == ()
