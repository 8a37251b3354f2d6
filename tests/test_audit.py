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
    assert "adapter" not in json.loads(plain.stdout)["registered"]  # cache-dit's own stays in charge
    gen = run_cli("generate", str(plan_dir), "--out", str(tmp_path / "ours"), "--replace-builtin", "--json")
    assert json.loads(gen.stdout)["registered"]["adapter"] == "Bria"
    probe = subprocess.run(
        [os.sys.executable, "-c",
         "import integrate_bria\n"
         "from cache_dit.caching.block_adapters.block_registers import BlockAdapterRegister as R\n"
         "print(R._adapters['Bria'].__module__, next(iter(R._adapters)))"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path / "ours")}, timeout=300)
    assert probe.stdout.split() == ["integrate_bria.adapter", "Bria"], probe.stderr[-2000:]
    bad = run_cli("generate", str(plan_dir), "--mode", "checkout", "--cache-dit-src", str(tmp_path),
                  "--replace-builtin")
    assert bad.returncode == 2 and "--replace-builtin" in bad.stderr


def test_audit_finds_cache_dits_bria_pattern_and_says_how_to_reproduce(tmp_path):
    """cache-dit 1.5.3 registers Pattern_0 for Bria, whose blocks return (encoder_hidden_states,
    hidden_states): its own adapter breaks on the first block, ours (Pattern_1) passes."""
    env = {"INTEGRATE_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_cli("audit", "--only", "BriaTransformer2DModel", "--proof", "cache", "--json", env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["schema"] == "integrate.audit" and data["findings"] == 1
    row = data["rows"][0]
    assert row["status"] == "finding" and row["adapter"].split(":")[0].endswith(".py")
    cache = row["proofs"][0]
    assert cache["name"] == "cache" and cache["cache_dit"] in ("fail", "error") and cache["ours"] == "pass"
    assert cache["cache_dit_first_divergence"] == "transformer_blocks.0"
    assert row["our_patterns"]["transformer_blocks"] == "Pattern_1"
    assert any("transformer_bria.py:445: returns (encoder_hidden_states, hidden_states)" in e for e in row["evidence"])
    assert "--cache-dit-own --proof cache" in row["reproduce"]
    again = run_cli("audit", "--only", "BriaTransformer2DModel", "--proof", "cache", "--json", env=env)
    assert json.loads(again.stdout)["rows"][0]["cached"] is True  # the row was cached by its files
    bad = run_cli("audit", "--only", "NotAClass", env=env)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("fixture, proofs, status", [
    ("needs-edit", [("error", "error")], "no-fixture"),  # nothing ran: not a finding, whatever the proofs say
    ("derived", [("fail", "pass")], "finding"),
    ("derived", [("pass", "pass"), ("error", "pass")], "finding"),
    ("derived", [("fail", "fail")], "both-fail"),
    ("derived", [("pass", "error")], "ours-fails"),
    ("edited", [("pass", "pass"), ("skipped", "skipped")], "agree"),
])
def test_a_finding_needs_a_fixture_that_ran_and_our_proof_passing(fixture, proofs, status):
    from integrate.survey.audit import row_status
    from integrate.survey.records import AuditProof

    assert row_status(fixture, [AuditProof("cache", t, o) for t, o in proofs]) == status


def _fake_row(row, diffusers_version, work, proofs):
    """Stands in for a row's proofs (minutes each), in a pool process of its own."""
    from integrate.survey.records import AuditRow

    return AuditRow(row.transformer_class, row.analysed_pipeline, None, "agree", why=f"pid {os.getpid()}")


def test_audit_rows_run_in_a_process_pool_and_come_back_in_order(monkeypatch, survey):
    from integrate import api
    from integrate.survey import audit

    monkeypatch.setattr(audit, "audit_row", _fake_row)
    only = ("FluxTransformer2DModel", "WanTransformer3DModel", "QwenImageTransformer2DModel")
    lines: list[str] = []
    report = api.audit(only, proofs=("cache",), use_cache=False, jobs=2, progress=lines.append)
    assert sorted(r.transformer_class for r in report.rows) == sorted(only)
    # the survey's order (the session's survey, shared with test_survey)
    survey_order = [r["transformer_class"] for r in survey["data"]["rows"] if r["transformer_class"] in only]
    assert [r.transformer_class for r in report.rows] == survey_order  # whatever finished first
    assert all(r.why.startswith("pid ") and r.why != f"pid {os.getpid()}" for r in report.rows)  # in the pool
    assert "2 at a time" in lines[0] and sum(": agree" in line for line in lines) == 3
