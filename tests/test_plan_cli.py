"""`integrate plan` and `integrate approve` as a user runs them: files written, JSON keys, approval life cycle."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLE, run_cli


@pytest.fixture(scope="module")
def motif_plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "motif"
    proc = run_cli("plan", str(EXAMPLE), "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout)


def test_plan_writes_markdown_and_json_with_the_documented_keys(motif_plan):
    out, data = motif_plan
    assert json.loads((out / "plan.json").read_text()) == data
    assert data["schema"] == "integrate.plan" and data["schema_version"] == "1.21"
    cp = data["parallelism"]["cp"]
    for key in ("plan", "mask_reorder", "rope_drift_fix", "ulysses_anything", "hybrid_patch"):
        assert key in cp
    for spec in cp["plan"].values():
        entries = [spec] if "gather_dim" in spec else list(spec.values())
        for e in entries:
            assert set(e) in ({"gather_dim", "expected_dims"}, {"split_dim", "expected_dims", "split_output"})
    for x in data["parallelism"]["tp"]["block_lists"]:
        assert {"attr", "layer_plan", "shard_div_attr", "strategy"} <= set(x)
    assert data["text_encoders"][0]["class"] == "T5Gemma2Encoder"
    assert data["vae"]["class"] == "AutoencoderKLWan"
    assert [p["id"] for p in data["phases"]] == list(range(8))
    md = (out / "PLAN.md").read_text()
    for heading in ("## 1. Cache", "## 2. Context parallelism", "## 3. Tensor parallelism", "## 4. Text encoders",
                    "## 5. VAE", "## 7. Checklist"):
        assert heading in md
    assert "torchrun --nproc_per_node=2 -m integrate_motif_video motif_video --parallel ulysses" in md
    assert "MOTIF_VIDEO_DIR" in md


def test_motif_video_decisions_rest_on_its_source(motif_plan):
    """MotifVideo (not supported by cache-dit 1.5.3): each decision is traceable to the installed source."""
    _, data = motif_plan
    cp = data["parallelism"]["cp"]
    assert cp["shape"] == "first-block split"
    assert "transformer_blocks.0" in cp["plan"] and "proj_out" in cp["plan"]
    assert cp["plan"]["rope"]["0"]["split_output"] is True
    # the decoder walks the last num_decoder_layers=4 of 40 single blocks with a copy of the embedded input taken
    # before any split: that stream is split again at block 36; its encoder input is already split
    assert set(cp["plan"]["single_transformer_blocks.36"]) == {"hidden_states"}
    assert cp["mask_reorder"]["needed"] and cp["mask_reorder"]["kind"] == "1-D"
    for e in cp["evidence"]:
        if e["line"]:
            lines = open(e["file"]).read().splitlines()
            assert 0 < e["line"] <= len(lines)
    tp = {x["attr"]: x for x in data["parallelism"]["tp"]["block_lists"]}
    assert tp["single_transformer_blocks"]["strategy"] == "fused-weight rearrangement"
    assert tp["transformer_blocks"]["shard_div_attr"] == {"attn": ["heads"]}
    te = data["text_encoders"][0]
    assert te["supported"] is False and te["tp_plan"]


def test_plan_cross_checks_the_static_facts_on_the_meta_device(motif_plan):
    _, data = motif_plan
    check = data["facts"]["crosscheck"]
    assert check["ok"] is True, check
    assert check["checked"] > 20
    assert check["disagreements"] == []


def test_approval_life_cycle(motif_plan, tmp_path):
    src, _ = motif_plan
    plan_dir = tmp_path / "p"
    plan_dir.mkdir()
    (plan_dir / "plan.json").write_text((src / "plan.json").read_text())
    (plan_dir / "PLAN.md").write_text((src / "PLAN.md").read_text())
    check = run_cli("approve", str(plan_dir), "--check")
    assert check.returncode == 2 and "not approved" in check.stderr and len(check.stderr.strip().splitlines()) == 1
    ok = run_cli("approve", str(plan_dir), "--reviewer", "Ada Lovelace", "--json")
    assert ok.returncode == 0, ok.stderr
    record = json.loads(ok.stdout)["approval"]
    assert record["reviewer"] == "Ada Lovelace" and len(record["plan_sha256"]) == 64
    assert run_cli("approve", str(plan_dir), "--check").returncode == 0
    data = json.loads((plan_dir / "plan.json").read_text())
    data["parallelism"]["tp"]["strategy"] = "edited"
    (plan_dir / "plan.json").write_text(json.dumps(data))
    again = run_cli("approve", str(plan_dir), "--check")
    assert again.returncode == 2 and "changed after it was approved" in again.stderr


@pytest.mark.parametrize("args,needle", [
    (["approve", "{tmp}", "--reviewer", "x"], "holds no plan.json"),
    (["approve", "{tmp}/plan", "--reviewer", " "], "must name a person"),
    (["approve", "{tmp}/plan"], "--reviewer NAME is required"),
    (["plan", "{tmp}/nowhere", "--out", "{tmp}/o"], "no such file"),
    (["plan", str(EXAMPLE), "--out", "{tmp}/file.txt"], "is a file"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "plan").mkdir()
    (tmp_path / "plan" / "plan.json").write_text(json.dumps({"schema": "integrate.plan"}))
    proc = run_cli(*[a.format(tmp=tmp_path) for a in args])
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_not_an_integrate_plan_is_refused(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps({"hello": 1}))
    proc = run_cli("approve", str(tmp_path), "--reviewer", "x")
    assert proc.returncode == 2 and "not an integrate plan" in proc.stderr


NO_BLOCK_LIST = '''
from torch import nn


class Model(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.projections = nn.ModuleList([nn.Linear(dim, dim) for _ in range(3)])

    def forward(self, x):
        for proj in self.projections:
            x = x + proj(x)
        return x
'''


def test_a_model_with_no_block_list_fails_the_check_in_analyze_and_plan(tmp_path):
    """Its only ModuleList holds Linears, not blocks: there is nothing for the cache to wrap, so the model fails
    the check: analyze and plan exit 1 (not 0: nothing is integrated; not 2: the input is well formed), and still
    say what they found: the analysis is printed, PLAN.md and plan.json are written."""
    (tmp_path / "model.py").write_text(NO_BLOCK_LIST)
    (tmp_path / "m").mkdir()
    flags = ["--model-path", str(tmp_path / "m"), "--transformer-class", "Model", "--no-pipeline",
             "--separate-cfg", "no"]
    proc = run_cli("analyze", str(tmp_path / "model.py"), *flags, "--json")
    assert proc.returncode == 1, proc.stderr
    (bl,) = json.loads(proc.stdout)["transformer"]["block_lists"]
    assert bl["attr"] == "projections" and bl["is_blocks"] is False
    text = run_cli("analyze", str(tmp_path / "model.py"), *flags)
    assert text.returncode == 1 and "no block list" in text.stdout, text.stdout
    out = tmp_path / "plan"
    proc = run_cli("plan", str(tmp_path / "model.py"), *flags, "--out", str(out), "--no-probe")
    assert proc.returncode == 1, proc.stderr
    assert "no block list" in proc.stdout, proc.stdout
    plan = json.loads((out / "plan.json").read_text())
    assert plan["cache"]["block_lists"] == [] and [b["attr"] for b in plan["cache"]["not_blocks"]] == ["projections"]
    assert (out / "PLAN.md").is_file()


def test_a_model_with_a_block_list_passes_analyze_and_plan(motif_plan):
    _, data = motif_plan  # made with exit 0 by the fixture
    assert data["cache"]["block_lists"]
    assert run_cli("analyze", str(EXAMPLE), "--json").returncode == 0
