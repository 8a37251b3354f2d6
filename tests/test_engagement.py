"""Issue 34: a parallel proof shows that what it proves engaged. Our own diffusers model (tests/fixtures/gqa GqaModel)
is proved as generated (pass, with the shards and splits recorded), then with planners planted in the plugin that
act on nothing: an empty TP layer plan and a CP plan whose split never cuts are `vacuous`, a TP plan key that
matches no module fails. Each plant's outputs agree with the 1-process run exactly: only the evidence tells."""

from __future__ import annotations

import re
from contextlib import contextmanager

import pytest
from conftest import ROOT

from integrate import api
from integrate.records import to_json

SRC = ROOT / "tests" / "fixtures" / "gqa" / "model.py"


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    base = tmp_path_factory.mktemp("engagement")
    (base / "m").mkdir()
    flags = api.flags_for(None, model_path=str(base / "m"), transformer_class="GqaModel", transformer_file=str(SRC),
                          pipeline_class="sample", pipeline_file=str(SRC))
    api.write_plan(api.plan(flags, probe=False), base / "plan")
    api.approve(base / "plan", "test")
    api.generate(base / "plan", out=base / "out")
    return base / "plan", base / "out"


def _verify(plan_dir, out, proof: str) -> dict:
    """One variant of the proof (`tp2`, `ulysses2`), against the plain model's run kept beside the plugin."""
    variant = {"tp": "tp2", "cp": "ulysses2"}[proof]
    return to_json(api.verify(plan_dir, out, proofs=(proof,), trust_code=True, variants=(variant,),
                              baseline=out.parent / "baseline"))[proof]


@contextmanager
def _planted(out, name: str, old: str, new: str):
    """The plugin's `name` with `old` (a regular expression) replaced by `new`, put back afterwards."""
    path = next(out.glob(f"*/{name}"))
    text = path.read_text()
    planted, n = re.subn(old, new, text, count=1, flags=re.DOTALL)
    assert n == 1, old
    path.write_text(planted)
    try:
        yield
    finally:
        path.write_text(text)


TP_PLANS = r"LAYER_PLANS = \{.*?\n\}\nSHARD_DIV_ATTR = \{.*?\n\}"
CP_PLAN = r"        plan = \{.*?\n        \}\n"


def test_a_proof_as_generated_records_what_it_sharded_and_split(generated):
    plan_dir, out = generated
    tp = _verify(plan_dir, out, "tp")
    assert tp["status"] == "pass", tp
    engaged = next(iter(tp["variants"].values()))["engaged"]["tp"]
    assert engaged["sharded"] >= 4 and not engaged["unresolved"]
    shard = next(s for s in engaged["shards"] if s["name"].endswith("attn.to_q.weight"))
    assert shard["local"][0] * 2 == shard["full"][0]  # colwise: half the rows on each of 2 ranks
    cp = _verify(plan_dir, out, "cp")
    assert cp["status"] == "pass", cp
    engaged = next(iter(cp["variants"].values()))["engaged"]["cp"]
    assert engaged["split"] >= 1 and engaged["fired"] == engaged["hooks"] and not engaged["unfired"]
    split = engaged["splits"][0]
    assert split["local"][split["dim"]] * 2 == split["full"][split["dim"]]  # half the sequence on each rank


def test_an_empty_tp_plan_is_vacuous_and_a_key_that_matches_nothing_fails(generated):
    plan_dir, out = generated
    with _planted(out, "tp_planner.py", TP_PLANS, "LAYER_PLANS = {}\nSHARD_DIV_ATTR = {}"):
        tp = _verify(plan_dir, out, "tp")
    assert tp["status"] == "vacuous" and "nothing was sharded" in tp["why"], tp
    assert all(v["max_abs"] == 0 for v in tp["variants"].values())  # bit-identical: only the evidence tells
    # nothing diverged: the proof's first divergence is null, as for any proof (the survey and the audit read it;
    # a vacuous variant has none of its own, which once left the proof's absent and stopped `survey --verify`)
    assert tp["first_divergence"] is None, tp
    with _planted(out, "tp_planner.py", TP_PLANS,
                  'LAYER_PLANS = {"blocks": {"attn.nope": "colwise"}}\nSHARD_DIV_ATTR = {"blocks": {}}'):
        tp = _verify(plan_dir, out, "tp")
    assert tp["status"] == "fail" and "match no module" in tp["why"], tp


def test_a_cp_plan_that_splits_nothing_is_vacuous(generated):
    plan_dir, out = generated
    never = '        plan = {"": {"hidden_states": _ContextParallelInput(split_dim=1, expected_dims=7)}}\n'
    with _planted(out, "cp_planner.py", CP_PLAN, never):
        cp = _verify(plan_dir, out, "cp")
    assert cp["status"] == "vacuous" and "no tensor was split" in cp["why"], cp
    with _planted(out, "cp_planner.py", CP_PLAN, "        plan = {}\n"):
        cp = _verify(plan_dir, out, "cp")
    assert cp["status"] == "vacuous" and "no context-parallel hook" in cp["why"], cp


def test_a_cp_planner_that_cuts_inside_its_own_forward_is_engaged_by_the_shapes_its_modules_saw():
    """cache-dit's Krea2 planner registers no hook: it replaces the transformer's forward and cuts the sequence
    there. With no split hook, modules whose inputs on the rank are shaped otherwise than in the 1-process run are
    the evidence; where every module saw the 1-process shapes, the pass is vacuous."""
    from integrate.verify.locate import Baseline
    from integrate.verify.paired import engagement

    base = Baseline({"input_shapes": {"blocks.0": {"hidden_states": [1, 64, 32]}}}, {}, None)
    variant = {"name": "ulysses2", "ulysses": 2}
    cut = [{"engaged": {"planners": [{"kind": "cp", "asked": "M", "found": True}]},
            "input_shapes": {"blocks.0": {"hidden_states": [1, 32, 32]}}}]
    engaged, status, why = engagement(variant, cut, base)
    assert status is None and engaged.cp.local_inputs == 1 and "blocks.0.hidden_states" in engaged.cp.first_local
    assert "no hook split a tensor" in why
    whole = [{**cut[0], "input_shapes": {"blocks.0": {"hidden_states": [1, 64, 32]}}}]
    assert engagement(variant, whole, base)[1] == "vacuous"


def test_a_hybrid_variant_where_cp_or_tp_did_not_act_is_vacuous_though_its_outputs_agree():
    """Ulysses x TP proves both or nothing: the outputs of all 4 ranks agree with the 1-process run, yet a run where
    the TP plan sharded nothing, or no CP hook split a tensor, is `vacuous`; both acting is a pass."""
    import numpy as np
    from integrate.verify.locate import Baseline
    from integrate.verify.paired import judge

    out = np.ones((4, 1, 8, 4), dtype=np.float32)
    base = Baseline({"order": [], "input_shapes": {}}, {"baseline/out": out}, None)
    variant = {"name": "ulysses2xtp2", "ulysses": 2, "tp": 2, "world": 4}
    tp = {"parameters": 10, "sharded": 6, "shards": [], "unresolved": []}
    cp = {"hooks": 2, "fired": 2, "unfired": [], "split": 3,
          "splits": [{"module": "", "dim": 1, "full": [1, 8, 4], "local": [1, 4, 4]}]}

    def judged(engaged: dict):
        reps = [{"engaged": engaged, "input_shapes": {}} for _ in range(4)]
        return judge(base, [variant], {"ulysses2xtp2": (reps, [{"ulysses2xtp2/out": out}] * 4, [""] * 4)})

    assert judged({"tp": tp, "cp": cp}).status == "pass"
    no_tp = judged({"tp": {**tp, "sharded": 0}, "cp": cp})
    assert no_tp.status == "vacuous" and "nothing was sharded" in no_tp.why
    no_cp = judged({"tp": tp})
    assert no_cp.status == "vacuous" and "no context-parallel hook" in no_cp.why
    whole = judged({"tp": tp, "cp": {**cp, "split": 0}})
    assert whole.status == "vacuous" and "no tensor was split" in whole.why
