"""Transformer-only integration (`--no-pipeline --separate-cfg yes|no`): a model the installed diffusers has
no pipeline for. Without both flags the gate still refuses; with them the chain runs to a proof, the adapter
written for the transformer's class name (cache-dit looks a bare transformer up by it)."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

# diffusers 0.42.1 defines Flux3Transformer2DModel and no pipeline that names it
CLASS = "Flux3Transformer2DModel"


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "flux3"
    (folder / "transformer").mkdir(parents=True)
    (folder / "transformer" / "config.json").write_text(json.dumps({"_class_name": CLASS,
                                                                    "_diffusers_version": "0.42.1"}))
    return folder


@pytest.mark.parametrize("flags, says", [
    ((), "--no-pipeline --separate-cfg"),  # the refusal names the way out
    (("--no-pipeline",), "needs --separate-cfg"),
    (("--separate-cfg", "no"), "for --no-pipeline only"),
    (("--no-pipeline", "--separate-cfg", "no", "--pipeline-class", "FluxPipeline"), "contradict"),
])
def test_the_gate_refuses_a_transformer_alone_unless_asked_with_the_cfg_style_declared(model, flags, says):
    proc = run_cli("gate", "--model-path", str(model), *flags)
    assert proc.returncode == 2 and says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_transformer_only_plan_generates_and_proves_the_declared_cfg_style(model, tmp_path):
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    gate = run_cli("gate", "--model-path", str(model), "--no-pipeline", "--separate-cfg", "yes", "--json")
    assert gate.returncode == 0, gate.stderr
    facts = json.loads(gate.stdout)["gate"]
    assert facts["inputs"]["pipeline_class"]["value"] is None and facts["separate_cfg"] is True

    made = run_cli("plan", str(model), "--no-pipeline", "--separate-cfg", "yes", "--out", str(plan_dir),
                   "--no-probe")
    assert made.returncode == 0, made.stderr
    plan = json.loads((plan_dir / "plan.json").read_text())
    assert plan["model"]["no_pipeline"] is True and plan["model"]["example_name"] == "flux3"
    assert plan["cache"]["has_separate_cfg"] is True  # declared, not read: there is no loop to read
    assert "transformer-only" in (plan_dir / "PLAN.md").read_text()

    assert run_cli("approve", str(plan_dir), "--reviewer", "Ada").returncode == 0
    gen = run_cli("generate", str(plan_dir), "--out", str(out), "--json")
    report = json.loads(gen.stdout)
    # a bare transformer is looked up by its class name, which cache-dit's `Flux` answers first by prefix; that adapter
    # was written for FluxTransformer2DModel, not this class: the plugin registers ours and puts it ahead
    assert report["registered"]["adapter"] == CLASS
    assert any("'Flux' adapter (adapters.py:" in n and f"answers {CLASS} by prefix but was written for" in n
               and "ours goes ahead of it" in n for n in report["notes"]), report["notes"]
    assert "example" not in report["registered"] and not (out / "test_matrix.sh").exists()
    assert any("transformer-only" in n for n in report["notes"])

    proof = run_cli("verify", str(plan_dir), "--generated", str(out), "--proof", "cache", "--json")
    cache = json.loads(proof.stdout)["cache"]
    assert cache["status"] == "pass", cache
    assert cache["has_separate_cfg"] is True  # ours answered for the transformer alone (cache-dit's Flux says False)
