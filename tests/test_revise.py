"""`integrate revise`: a reviewer changes a decision without hand-editing plan.json; every change is checked
against the plan's types, recorded beside what the analysis said, rendered into PLAN.md, and voids the
approval. Real runs of the CLI on the shipped MotifVideo example."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLE, run_cli


@pytest.fixture
def planned(tmp_path):
    plan_dir = tmp_path / "plan"
    assert run_cli("plan", str(EXAMPLE), "--out", str(plan_dir), "--no-probe").returncode == 0
    assert run_cli("approve", str(plan_dir), "--reviewer", "Ada").returncode == 0
    return plan_dir


def _revise(plan_dir, *sets: str, why: str = "the loop batches CFG: line 912", reviewer: str = "Grace Hopper"):
    args = [a for s in sets for a in ("--set", s)]
    return run_cli("revise", str(plan_dir), *args, "--why", why, "--reviewer", reviewer, "--json")


def _refused(proc, needle: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_an_override_is_recorded_rendered_and_voids_the_approval(planned):
    before = json.loads((planned / "plan.json").read_text())
    analysed = before["cache"]["has_separate_cfg"]
    proc = _revise(planned, f"cache.has_separate_cfg={json.dumps(not analysed)}", "facts.attention.0.head_dim.1=64")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["revision"]
    assert report["changed"] and report["approval_voided"]
    plan = json.loads((planned / "plan.json").read_text())
    assert plan["schema_version"] == "1.4" and plan["cache"]["has_separate_cfg"] is (not analysed)
    assert plan["facts"]["attention"][0]["head_dim"][1] == 64
    override = {o["key"]: o for o in plan["overrides"]}["cache.has_separate_cfg"]
    assert override["analysis"] is analysed and override["value"] is (not analysed)
    assert override["by"] == "Grace Hopper" and override["why"].startswith("the loop batches CFG")
    md = (planned / "PLAN.md").read_text()
    assert "## Reviewer overrides" in md and "`cache.has_separate_cfg`" in md and "Grace Hopper" in md
    assert not (planned / "APPROVAL.json").exists()
    assert run_cli("approve", str(planned), "--check").returncode == 2


def test_the_revised_plan_is_what_generate_writes(planned, tmp_path):
    """A reviewer's CFG style reaches the adapter, labelled as theirs; overriding a ForwardPattern is a
    decision, not a change in the model's source, so generate's source check lets it through."""
    analysed = json.loads((planned / "plan.json").read_text())["cache"]["has_separate_cfg"]
    assert _revise(planned, f"cache.has_separate_cfg={json.dumps(not analysed)}",
                   "cache.block_lists.0.forward_pattern=Pattern_1").returncode == 0
    assert run_cli("approve", str(planned), "--reviewer", "Ada").returncode == 0
    out = tmp_path / "out"
    proc = run_cli("generate", str(planned), "--out", str(out))
    assert proc.returncode in (0, 1), proc.stderr
    adapter = (out / "integrate_motif_video" / "adapter.py").read_text()
    assert f"has_separate_cfg={not analysed}" in adapter and "the reviewer's override" in adapter
    assert "ForwardPattern.Pattern_1" in adapter


def test_setting_the_analysis_value_back_drops_the_override(planned):
    analysed = json.loads((planned / "plan.json").read_text())["cache"]["has_separate_cfg"]
    assert _revise(planned, f"cache.has_separate_cfg={json.dumps(not analysed)}").returncode == 0
    assert _revise(planned, f"cache.has_separate_cfg={json.dumps(analysed)}").returncode == 0
    plan = json.loads((planned / "plan.json").read_text())
    assert plan["overrides"] == [] and "Reviewer overrides" not in (planned / "PLAN.md").read_text()


@pytest.mark.parametrize(("assignment", "needle"), [
    ("cache.nope=1", "no field `nope`"),
    ("cache.has_separate_cfg=\"maybe\"", "expected bool"),
    ("facts.attention.99.head_dim=1", "is not an index of this list"),
    ("model.model_path=/elsewhere", "is not a decision a reviewer revises"),
    ("cache.has_separate_cfg", "expected KEY=VALUE"),
])
def test_a_key_or_value_the_plan_does_not_have_is_refused_and_nothing_is_written(planned, assignment, needle):
    files = {p.name: p.read_bytes() for p in planned.iterdir()}
    _refused(_revise(planned, assignment), needle)
    assert {p.name: p.read_bytes() for p in planned.iterdir()} == files


def test_an_override_needs_a_reason_and_a_name(planned):
    _refused(_revise(planned, "cache.has_separate_cfg=false", why="  "), "--why must not be empty")
    _refused(_revise(planned, "cache.has_separate_cfg=false", reviewer="a\x1bb"), "--reviewer must be one line")


def test_a_reviewers_words_cannot_break_out_of_plan_md(planned):
    """The reason is the reviewer's text: rendered as plain Markdown text, a value inside a code span that no
    backtick in it can close."""
    proc = _revise(planned, "cache.notes=[\"`x` **y**\"]", why="see [this](http://example.com) <b>now</b>")
    assert proc.returncode == 0, proc.stderr
    md = (planned / "PLAN.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("- `cache.notes`"))
    assert "\\[this\\]\\(http://example\\.com\\)" in line and "\\<b\\>" in line and "<b>" not in line
    assert '``["`x` **y**"]``' in line


def test_approving_a_hand_edited_plan_json_is_refused_and_points_at_revise(planned):
    path = planned / "plan.json"
    plan = json.loads(path.read_text())
    plan["cache"]["notes"] = ["edited by hand"]
    path.write_text(json.dumps(plan, indent=2) + "\n")
    _refused(run_cli("approve", str(planned), "--reviewer", "Ada"), "integrate revise")
