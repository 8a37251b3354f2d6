"""Every example of every registered rule, as a test (the harness is `integrate.analyzers.examples.check_example`,
and tests/rule_fixes.py for the fixes).

INVALID examples must fire (a finding the rule is sure of, whose message holds the example's `expect`),
VALID examples must stay silent, UNKNOWN examples must say "cannot tell" rather than guess. An INVALID example
that carries `fixed` must be answered by its rule's fix, applied by the real rewrite: the code comes out as
`fixed` says, compiles, and the patched model computes what the model does; one that carries `line` instead
must be found at that line and left to the manual part, with the rule's reason where the rule has no rewrite.
"""

import pytest
import torch
from integrate.analyzers import rules as package
from integrate.analyzers.analysis import analyze_transformer
from integrate.analyzers.examples import check_example
from integrate.analyzers.fixes import Manual
from integrate.analyzers.rules import RULES
from rule_fixes import apply_fix, normalised

from integrate.resolve import Workspace

CASES = [(rule, kind, i, ex) for rule in RULES for kind in ("VALID", "INVALID", "UNKNOWN")
         for i, ex in enumerate(getattr(rule, kind))]


@pytest.mark.parametrize("rule,kind,i,example", CASES, ids=[f"{r.code}-{k}-{i}" for r, k, i, _ in CASES])
def test_rule_example(rule, kind, i, example):
    found = check_example(rule, example)
    if kind == "VALID":
        assert found == [], f"{rule.code} fired on a VALID example: {[f.message for f in found]}"
    elif kind == "INVALID":
        sure = [f for f in found if f.confidence != "unknown"]
        assert sure, f"{rule.code} stayed silent on an INVALID example"
        if example.expect:
            assert any(example.expect in f.message for f in sure), [f.message for f in sure]
    else:
        assert found and all(f.confidence == "unknown" for f in found), [(f.message, f.confidence) for f in found]


def test_every_rule_has_examples_both_ways():
    for rule in RULES:
        assert rule.VALID and (rule.INVALID or rule.UNKNOWN), f"{rule.code} needs examples it must and must not fire on"
        assert rule.code and rule.summary and rule.scope in ("list", "block_list", "pipeline")


def test_codes_are_unique_and_order_is_stable():
    codes = [r.code for r in RULES]
    assert len(codes) == len(set(codes))
    block = [r.code for r in RULES if r.scope == "block_list"]
    assert block[:3] == ["pitfall-a", "pitfall-b", "pitfall-c"]  # the order reasons are reported in


FIXES = [(rule, i, ex) for rule in RULES for i, ex in enumerate(rule.INVALID)]


@pytest.mark.parametrize("rule,i,example", FIXES, ids=[f"{r.code}-{i}" for r, i, _ in FIXES])
def test_invalid_example_fix(rule, i, example, tmp_path):
    if example.fixed is None:
        assert example.line is not None, f"{rule.code}: an INVALID example carries its fix (`fixed`) or its `line`"
        found = check_example(rule, example)
        assert any(f.line == example.line for f in found), [(f.line, f.message) for f in found]
        manual = [f.fix for f in found if isinstance(f.fix, Manual)]
        assert all(m.why for m in manual), f"{rule.code}: a rule with no rewrite says why"
        if len(manual) < len(found):  # a rewrite exists, and declines this example: it stays manual
            assert not apply_fix(rule, example, tmp_path).applied
        return
    fixed = apply_fix(rule, example, tmp_path)
    assert fixed.applied, [f.fix for f in fixed.findings]
    assert normalised(fixed.code) == normalised(example.fixed)
    compile(fixed.code, f"<{rule.code} fixed>", "exec")
    want, got = fixed.outputs()
    torch.testing.assert_close(got, want)


def test_a_finding_no_patch_answers_is_said_in_the_list_notes(monkeypatch, tmp_path):
    """A block-list finding with patch=False is no reason for a PatchFunctor, and does not vanish either: the
    list's notes say it."""
    class Remark(package.Rule):
        code, scope, order, summary = "remark", "block_list", 99, "a remark on every chain"

        def check(self, ctx):
            yield self.finding(ctx, "remark: a chain of blocks", patch=False)

    monkeypatch.setattr(package, "RULES", [*RULES, Remark])
    path = tmp_path / "model.py"
    block_rule = next(r for r in RULES if r.scope == "block_list")
    path.write_text(block_rule.VALID[0].code.lstrip())
    ws = Workspace()
    src = ws.load(path)
    facts = analyze_transformer(ws, src, src.classes["Model"])
    chain = next(bl for bl in facts.block_lists if bl.is_blocks)
    assert "remark: a chain of blocks" in chain.notes
    assert not any("remark" in r for r in facts.patch_functor_reasons)
    assert [f.fix for f in facts.findings if f.rule == "remark"] == [Manual("no rewrite is written for `remark`")]
