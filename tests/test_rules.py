"""Every example of every registered rule, as a test (the harness is `integrate.analyzers.examples.check_example`).

INVALID examples must fire (a finding the rule is sure of, whose message holds the example's `expect`),
VALID examples must stay silent, UNKNOWN examples must say "cannot tell" rather than guess.
"""

import pytest
from integrate.analyzers.examples import check_example
from integrate.analyzers.rules import RULES

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
