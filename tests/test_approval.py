"""An approval binds everything generate reads: plan.json, PLAN.md, the cited sources, signed with the user's key."""

import hashlib
import json
import shutil

import pytest
from conftest import ROOT, run_cli

BFL = ROOT / "tests" / "fixtures" / "bfl"


@pytest.fixture
def approved(tmp_path):
    """A third-party model copied into tmp (so its source can be edited), planned and approved."""
    model = tmp_path / "bfl"
    shutil.copytree(BFL, model)
    (tmp_path / "empty").mkdir()
    plan_dir = tmp_path / "plan"
    flags = ["--model-path", str(tmp_path / "empty"), "--transformer-class", "Flux", "--pipeline-class", "denoise",
             "--pipeline-file", str(model / "model.py")]
    proc = run_cli("plan", str(model / "model.py"), *flags, "--out", str(plan_dir), "--no-probe")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("approve", str(plan_dir), "--reviewer", "Ada", "--json")
    assert proc.returncode == 0, proc.stderr
    return plan_dir, model


def _refused(proc, needle):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_the_approval_records_the_plan_its_markdown_and_every_cited_source(approved):
    plan_dir, model = approved
    record = json.loads((plan_dir / "APPROVAL.json").read_text())
    assert record["plan_sha256"] == hashlib.sha256((plan_dir / "plan.json").read_bytes()).hexdigest()
    assert record["plan_md_sha256"] == hashlib.sha256((plan_dir / "PLAN.md").read_bytes()).hexdigest()
    assert str(model / "model.py") in record["sources"] and str(model / "layers.py") in record["sources"]
    assert record["tool_version"] and len(record["signature"]) == 64
    assert run_cli("approve", str(plan_dir), "--check").returncode == 0


def test_an_edited_plan_md_voids_it(approved):
    plan_dir, _ = approved
    (plan_dir / "PLAN.md").write_text((plan_dir / "PLAN.md").read_text() + "\nextra\n")
    _refused(run_cli("approve", str(plan_dir), "--check"), "PLAN.md changed after it was approved")


def test_a_forged_approval_is_refused(approved):
    plan_dir, _ = approved
    data = json.loads((plan_dir / "plan.json").read_text())
    data["parallelism"]["tp"]["strategy"] = "edited"
    (plan_dir / "plan.json").write_text(json.dumps(data))
    record = json.loads((plan_dir / "APPROVAL.json").read_text())
    record["plan_sha256"] = hashlib.sha256((plan_dir / "plan.json").read_bytes()).hexdigest()  # the forger's hash
    (plan_dir / "APPROVAL.json").write_text(json.dumps(record))
    _refused(run_cli("generate", str(plan_dir), "--out", str(plan_dir.parent / "out")), "not signed")
    assert not (plan_dir.parent / "out").exists()


def test_a_symlinked_plan_is_refused(approved, tmp_path):
    plan_dir, _ = approved
    elsewhere = tmp_path / "elsewhere.json"
    shutil.move(plan_dir / "plan.json", elsewhere)
    (plan_dir / "plan.json").symlink_to(elsewhere)
    _refused(run_cli("approve", str(plan_dir), "--check"), "symbolic link")


def test_a_source_edited_after_approval_stops_generate(approved):
    plan_dir, model = approved
    layers = model / "layers.py"
    layers.write_text(layers.read_text() + "\n# a change nobody reviewed\n")
    out = plan_dir.parent / "out"
    _refused(run_cli("generate", str(plan_dir), "--out", str(out)), "which the plan was made from, changed after")
    assert not out.exists()


def test_an_approval_record_of_the_wrong_shape_is_not_an_approval(approved):
    plan_dir, _ = approved
    (plan_dir / "APPROVAL.json").write_text("[1, 2]")
    _refused(run_cli("approve", str(plan_dir), "--check"), "not an approval record")
