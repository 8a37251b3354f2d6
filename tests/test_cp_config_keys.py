"""A generated CP planner's hook keys name modules of the transformer it runs on, whatever its config.

The plan is made from the full config (StableAudio3's `transformer_blocks` has 24 blocks, so its last block
is `transformer_blocks.23`); the planner runs on any config of the class, the tiny one of verify included. Real
runs: the installed diffusers 0.42.1, the generated plugin imported in a fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import EXAMPLE, run_cli

PROBE = """
import inspect, json, sys, torch, diffusers
import {package}
from cache_dit.distributed.transformers.register import ContextParallelismPlannerRegister as R
from integrate.verify.tiny import derive
cls = getattr(diffusers, {cls!r})
with torch.device("meta"):
    defaults = {{k: v.default for k, v in inspect.signature(cls.__init__).parameters.items()
                if k != "self" and v.default is not inspect.Parameter.empty}}
    model = cls.from_config(derive(cls, defaults).config)
plan = R.get_planner(model)()._apply(transformer=model)
missing = []
for key in plan:
    try:
        key and model.get_submodule(key.replace(".*", ".0"))
    except AttributeError:
        missing.append(key)
print(json.dumps({{"keys": list(plan), "missing": missing}}))
"""


def _keys(tmp_path, model_args: list[str], cls: str) -> dict:
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    assert run_cli("plan", *model_args, "--out", str(plan_dir), "--no-probe").returncode == 0
    assert run_cli("approve", str(plan_dir), "--reviewer", "Ada").returncode == 0
    assert run_cli("generate", str(plan_dir), "--out", str(out)).returncode in (0, 1)
    lengths = json.loads((plan_dir / "plan.json").read_text())["parallelism"]["cp"]["lengths"]
    package = next(p.name for p in out.iterdir() if p.name.startswith("integrate_"))
    probe = subprocess.run([sys.executable, "-c", PROBE.format(package=package, cls=cls)], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(out)}, timeout=300)
    assert probe.returncode == 0, probe.stderr[-2000:]
    return {"lengths": lengths, **json.loads(probe.stdout.strip().splitlines()[-1])}


def test_a_last_block_key_follows_the_config_the_planner_runs_on(tmp_path):
    model = tmp_path / "stable_audio3"
    (model / "transformer").mkdir(parents=True)
    (model / "transformer" / "config.json").write_text(json.dumps({"_class_name": "StableAudio3DiTModel",
                                                                   "_diffusers_version": "0.42.1"}))
    got = _keys(tmp_path, [str(model), "--no-pipeline", "--separate-cfg", "no"], "StableAudio3DiTModel")
    assert got["lengths"]["transformer_blocks"] == 24  # the plan's index came from the full config
    assert not got["missing"], got
    last = [k for k in got["keys"] if k.startswith("transformer_blocks.") and k.split(".")[1].isdigit()]
    assert last and all(k != "transformer_blocks.23" for k in last), got  # moved to the tiny model's last block


def test_keys_of_blocks_the_patch_functor_moves_still_resolve(tmp_path):
    got = _keys(tmp_path, [str(EXAMPLE)], "MotifVideoTransformer3DModel")
    assert not got["missing"], got
