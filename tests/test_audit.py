"""`integrate audit`, `generate --replace-builtin` and `verify --cache-dit-own`: cache-dit's own integrations
proved side by side with ours, on the installed diffusers 0.42.1 and cache-dit 1.5.3 (real runs, workers)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import make_model_dir, run_cli


def test_replace_builtin_registers_ours_over_cache_dits_own_and_refuses_checkout_mode(tmp_path):
    model = make_model_dir(tmp_path / "m", "BriaPipeline", "BriaTransformer2DModel")
    plan_dir = tmp_path / "plan"
    assert run_cli("plan", str(model), "--out", str(plan_dir), "--no-probe").returncode == 0
    assert run_cli("approve", str(plan_dir), "--reviewer", "Ada").returncode == 0
    plain = run_cli("generate", str(plan_dir), "--out", str(tmp_path / "plain"), "--json")
    # cache-dit's own adapter was written for this class, but wraps its blocks with Pattern_0, which the binding here
    # rejects (they return (encoder, hidden)): the plugin puts ours ahead of it, under the full class names
    assert json.loads(plain.stdout)["registered"]["adapter"] == "BriaPipeline, BriaTransformer2DModel"
    gen = run_cli("generate", str(plan_dir), "--out", str(tmp_path / "ours"), "--replace-builtin", "--json")
    assert json.loads(gen.stdout)["registered"]["adapter"] == "Bria"
    probe = subprocess.run(
        [os.sys.executable, "-c",
         "import cache_dit.caching.block_adapters\n"
         "from cache_dit.caching.block_adapters.block_registers import BlockAdapterRegister as R\n"
         "before = R.supported_pipelines()[1]\n"
         "import integrate_bria\n"
         "print(R._adapters['Bria'].__module__, R.supported_pipelines()[1] == before)"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path / "ours")}, timeout=300)
    # ours replaced cache-dit's entry under its own name, where it stands: the lookup order is cache-dit's
    assert probe.stdout.split() == ["integrate_bria.adapter", "True"], probe.stderr[-2000:]
    bad = run_cli("generate", str(plan_dir), "--mode", "checkout", "--cache-dit-src", str(tmp_path),
                  "--replace-builtin")
    assert bad.returncode == 2 and "--replace-builtin" in bad.stderr


def test_audit_finds_cache_dits_bria_pattern_and_says_how_to_reproduce(tmp_path):
    """cache-dit 1.5.3 registers Pattern_0 for Bria, whose blocks return (encoder_hidden_states,
    hidden_states): its own adapter breaks on the first block, ours (Pattern_1) passes. It registers no TP
    planner for Bria: that proof is a feature cache-dit lacks, read from what its registry answered in the run."""
    env = {"INTEGRATE_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_cli("audit", "--only", "BriaTransformer2DModel", "--proof", "cache", "--proof", "tp", "--json",
                   env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["schema"] == "integrate.audit" and data["findings"] == 1
    row = data["rows"][0]
    assert row["status"] == "finding" and row["adapter"].split(":")[0].endswith(".py")
    cache, tp = row["proofs"]
    assert cache["name"] == "cache" and cache["cache_dit"] in ("fail", "error") and cache["ours"] == "pass"
    assert cache["status"] == "finding"
    assert tp["status"] == "cache-dit-lacks" and tp["ours"] == "pass" and tp["cache_dit_registers"] is None
    assert "registers no tensor-parallel planner for BriaTransformer2DModel" in tp["label_why"]
    assert data["labels"] == {"cache": {"finding": 1}, "tp": {"cache-dit-lacks": 1}}
    assert data["compared"]["tp"]["compared"] == 0 and data["compared"]["cache"] == {"compared": 1, "cache_dit": 0,
                                                                                      "ours": 1}
    assert cache["cache_dit_first_divergence"] == "transformer_blocks.0"
    assert row["our_patterns"]["transformer_blocks"] == "Pattern_1"
    assert any("transformer_bria.py:445: returns (encoder_hidden_states, hidden_states)" in e for e in row["evidence"])
    assert "--cache-dit-own --proof cache" in row["reproduce"]
    again = run_cli("audit", "--only", "BriaTransformer2DModel", "--proof", "cache", "--proof", "tp", "--json",
                    env=env)
    assert json.loads(again.stdout)["rows"][0]["cached"] is True  # the row was cached by its files
    bad = run_cli("audit", "--only", "NotAClass", env=env)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


LACKS = "cache-dit registers no tensor-parallel planner for X"


@pytest.mark.parametrize("fixture, theirs, ours, lacks, label", [
    ("needs-edit", "error", "error", None, "no-fixture"),  # nothing ran: not a finding, whatever the proofs say
    ("derived", "fail", "pass", None, "finding"),
    ("derived", "vacuous", "pass", None, "finding"),  # cache-dit's proved nothing: it failed
    ("derived", "error", "pass", LACKS, "cache-dit-lacks"),  # a missing feature, announced: not a defect
    ("derived", "error", "error", LACKS, "ours-fails"),
    ("derived", "error", "skipped", LACKS, "unproved"),
    ("derived", "fail", "fail", None, "both-fail"),
    ("derived", "pass", "error", None, "ours-fails"),
    ("derived", "pass", "vacuous", None, "ours-fails"),
    ("edited", "pass", "pass", None, "agree"),
    ("derived", "pass", "needs-code", None, "unproved"),  # one side proved nothing: never agree
    ("derived", "skipped", "pass", None, "unproved"),
])
def test_each_proof_gets_one_label_that_means_one_thing(fixture, theirs, ours, lacks, label):
    from integrate.survey.audit import proof_label

    assert proof_label(fixture, theirs, ours, lacks)[0] == label


def test_a_rows_status_is_its_most_telling_proof_and_the_figure_counts_the_same_proofs():
    from integrate.survey.audit import row_status, tally
    from integrate.survey.records import AuditProof, AuditRow

    a = [AuditProof("cache", "pass", "pass", "agree"), AuditProof("tp", "error", "pass", "cache-dit-lacks")]
    b = [AuditProof("cache", "fail", "pass", "finding"), AuditProof("tp", "pass", "needs-code", "unproved")]
    assert row_status(a) == "cache-dit-lacks" and row_status(b) == "finding"
    labels, compared = tally([AuditRow("A", None, None, "x", tuple(a)), AuditRow("B", None, None, "x", tuple(b))],
                             ("cache", "tp"))
    assert labels == {"cache": {"agree": 1, "finding": 1}, "tp": {"cache-dit-lacks": 1, "unproved": 1}}
    # the tp rows are not compared: cache-dit has none on A, ours proved nothing on B
    assert compared == {"cache": {"compared": 2, "cache_dit": 1, "ours": 2}, "tp": {"compared": 0, "cache_dit": 0,
                                                                                      "ours": 0}}


def test_a_planner_cache_dit_hands_out_by_prefix_for_other_models_is_read_from_its_asserts():
    """cache-dit's lookup gives HunyuanVideo15Transformer3DModel the planner registered as 'HunyuanVideo', whose
    `_apply` asserts HunyuanVideoTransformer3DModel; a planner that asserts blocks, not the transformer, claims
    nothing (read from the installed cache-dit 1.5.3)."""
    from pathlib import Path

    import cache_dit
    from integrate.analyzers.support import planner_accepts

    root = Path(cache_dit.__file__).parent / "distributed" / "transformers"
    names, line = planner_accepts(root / "hunyuan.py", "HunyuanVideoContextParallelismPlanner")
    assert names == ("HunyuanVideoTransformer3DModel",) and line > 0
    assert planner_accepts(root / "qwen_image.py", "QwenImageTensorParallelismPlanner") is None  # asserts blocks
    assert planner_accepts(root / "hunyuan.py", "NoSuchPlanner") is None

    from integrate.verify.records import Engaged, ParallelProof, PlannerLookup, Variant

    from integrate.survey.audit import registration

    def proof(asked):
        lookup = PlannerLookup("cp", asked, True, planner="cache_dit.x.HunyuanVideoContextParallelismPlanner",
                               key="HunyuanVideo", file=str(root / "hunyuan.py"), line=265)
        return ParallelProof("error", variants={"ulysses2": Variant("error", engaged=Engaged(planners=(lookup,)))})

    where, lacks = registration("cp", proof("HunyuanVideo15Transformer3DModel"))
    assert where == "HunyuanVideo -> hunyuan.py:265" and "written for HunyuanVideoTransformer3DModel" in lacks
    assert registration("cp", proof("HunyuanVideoTransformer3DModel")) == (where, None)  # its own model


def _fake_row(row, diffusers_version, work, proofs, classes=frozenset()):
    """Stands in for a row's proofs (minutes each), in a pool process of its own."""
    from integrate.survey.records import AuditRow

    return AuditRow(row.transformer_class, row.analysed_pipeline, None, "agree", why=f"pid {os.getpid()}")


def test_audit_rows_run_in_a_process_pool_and_come_back_in_order(monkeypatch, survey):
    from integrate.survey import audit

    monkeypatch.setattr(audit, "audit_row", _fake_row)
    only = ("FluxTransformer2DModel", "WanTransformer3DModel", "QwenImageTransformer2DModel")
    lines: list[str] = []
    report = audit.run_audit(only, ("cache",), use_cache=False, jobs=2, progress=lines.append)
    assert sorted(r.transformer_class for r in report.rows) == sorted(only)
    # the survey's order (the session's survey, shared with test_survey)
    survey_order = [r["transformer_class"] for r in survey["data"]["rows"] if r["transformer_class"] in only]
    assert [r.transformer_class for r in report.rows] == survey_order  # whatever finished first
    assert all(r.why.startswith("pid ") and r.why != f"pid {os.getpid()}" for r in report.rows)  # in the pool
    assert "2 at a time" in lines[0] and sum(": agree" in line for line in lines) == 3


def test_a_planner_key_that_is_another_models_prefix_is_not_this_models_integration():
    """cache-dit's TP planner registered as 'HunyuanVideo' answers HunyuanVideo15Transformer3DModel by prefix; the
    installed diffusers defines HunyuanVideoTransformer3DModel, whose prefix it is. SkyReelsV2's own key is its own."""
    from integrate.survey import class_names
    from integrate.survey.audit import prefix_owner

    names = class_names()
    assert "HunyuanVideoTransformer3DModel" in names and "SkyReelsV2Transformer3DModel" in names
    assert prefix_owner("HunyuanVideo", "HunyuanVideo15Transformer3DModel", names) == "HunyuanVideoTransformer3DModel"
    assert prefix_owner("SkyReelsV2", "SkyReelsV2Transformer3DModel", names) is None
    assert prefix_owner("QwenImageTransformer2DModel", "QwenImageTransformer2DModel", names) is None


def test_skyreels_tp_cache_dits_planner_shards_nothing_and_ours_is_handed_over_and_engaged(tmp_path):
    """cache-dit 1.5.3's SkyReelsV2 TP planner names `attn.*` modules on blocks that have `attn1` / `attn2`: torch
    skips the keys, nothing is sharded, the output matches the 1-process run, and the proof fails on the unresolved
    keys. Ours cannot be registered over cache-dit's through its public API (its `SkyReelsV2` answers first): the
    plugin says so, and verify hands our planner over, recorded as handed, with shards on record."""
    from integrate import api
    from integrate.records import to_json

    model = make_model_dir(tmp_path / "m", "SkyReelsV2Pipeline", "SkyReelsV2Transformer3DModel")
    api.write_plan(api.plan(api.flags_for(str(model)), probe=False), tmp_path / "plan")
    api.approve(tmp_path / "plan", "test")
    gen = api.generate(tmp_path / "plan", out=tmp_path / "out", replace_builtin=True)
    assert "tp_planner" not in gen.registered and any("'SkyReelsV2'" in n for n in gen.notes)
    theirs = to_json(api.verify(tmp_path / "plan", tmp_path / "out", proofs=("tp",), cache_dit_own=True))["tp"]
    assert theirs["status"] == "fail" and "match no module" in theirs["why"]
    ours = to_json(api.verify(tmp_path / "plan", tmp_path / "out", proofs=("tp",)))["tp"]
    assert ours["status"] == "pass", ours.get("why")
    engaged = next(iter(ours["variants"].values()))["engaged"]
    lookup = next(x for x in engaged["planners"] if x["kind"] == "tp")
    assert lookup["handed"] is True and lookup["planner"].startswith("integrate_sky_reels_v2.tp_planner.")
    assert engaged["tp"]["sharded"] > 0 and not engaged["tp"]["unresolved"]


def test_krea2_cp_cache_dits_planner_cuts_in_its_own_forward_and_counts_as_engaged(tmp_path):
    """cache-dit 1.5.3's Krea2 CP planner returns an empty hook plan and replaces the transformer's forward, which
    cuts the sequence itself: no hook fires, and the blocks' inputs on the rank are shorter than in the 1-process
    run. That is engagement (a pass), not `vacuous` (which the hook spies alone had said)."""
    from integrate import api
    from integrate.records import to_json

    model = make_model_dir(tmp_path / "m", "Krea2Pipeline", "Krea2Transformer2DModel")
    api.write_plan(api.plan(api.flags_for(str(model)), probe=False), tmp_path / "plan")
    api.approve(tmp_path / "plan", "test")
    api.generate(tmp_path / "plan", out=tmp_path / "out", replace_builtin=True)
    theirs = to_json(api.verify(tmp_path / "plan", tmp_path / "out", proofs=("cp",), cache_dit_own=True))["cp"]
    assert theirs["status"] == "pass", theirs.get("why")
    cp = next(iter(theirs["variants"].values()))["engaged"]["cp"]
    assert cp["hooks"] == 0 and cp["split"] == 0 and cp["local_inputs"] > 0


def test_ltx2_cache_finding_cache_dits_functor_lacks_the_pipelines_sigma_ours_passes(tmp_path):
    """LTX2Pipeline (diffusers 0.42.1) passes `sigma=` to the transformer; cache-dit 1.5.3's LTX2PatchFunctor
    replaces the forward with one that lacks it. Ours: the block call under `enumerate(...)` is made positional,
    up to `encoder_hidden_states`, which cache-dit's wrapper would otherwise receive twice (its own parameter of
    that name holds LTX-2's audio stream)."""
    import libcst as cst

    env = {"INTEGRATE_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_cli("audit", "--only", "LTX2VideoTransformer3DModel", "--proof", "cache", "--json", env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    (cache,) = json.loads(proc.stdout)["rows"][0]["proofs"]
    assert cache["status"] == "finding" and cache["ours"] == "pass"
    assert "unexpected keyword argument 'sigma'" in cache["cache_dit_why"]
    model = make_model_dir(tmp_path / "m", "LTX2Pipeline", "LTX2VideoTransformer3DModel")
    assert run_cli("plan", str(model), "--out", str(tmp_path / "plan"), "--no-probe").returncode == 0
    assert run_cli("approve", str(tmp_path / "plan"), "--reviewer", "Ada").returncode == 0
    # exit 1: its CFG style is left to a reviewer (manual), which does not touch the functor
    assert run_cli("generate", str(tmp_path / "plan"), "--out", str(tmp_path / "out"), "--replace-builtin",
                   env=env).returncode in (0, 1)
    module = cst.parse_module((tmp_path / "out" / "integrate_ltx2" / "patch_functor.py").read_text())
    calls = [c for c in _calls(module) if isinstance(c.func, cst.Name) and c.func.value == "block"]
    assert len(calls) == 1
    positional = [cst.Module([]).code_for_node(a.value) for a in calls[0].args if a.keyword is None]
    keywords = {a.keyword.value for a in calls[0].args if a.keyword is not None}
    assert positional == ["hidden_states", "audio_hidden_states", "encoder_hidden_states"]
    assert "encoder_hidden_states" not in keywords and "perturbation_mask" in keywords


def _calls(module):
    import libcst as cst

    found = []

    class Calls(cst.CSTVisitor):
        def visit_Call(self, node):
            found.append(node)

    module.visit(Calls())
    return found


def test_ovis_tp_finding_the_swiglu_weight_is_reordered_but_not_its_bias(tmp_path):
    """cache-dit 1.5.3's OvisImage planner interleaves the SwiGLU up-projection's weight rows for column-wise
    sharding but not its bias: with the fixture's non-zero biases its TP run differs from the 1-process one at
    that projection. Ours interleaves both, and divides the single block's `mlp_hidden_dim` it splits by."""
    env = {"INTEGRATE_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_cli("audit", "--only", "OvisImageTransformer2DModel", "--proof", "tp", "--json", env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    (tp,) = json.loads(proc.stdout)["rows"][0]["proofs"]
    assert (tp["status"], tp["cache_dit"], tp["ours"]) == ("finding", "fail", "pass")
    assert tp["cache_dit_first_divergence"] == "transformer_blocks.0.ff.net.0.proj"
