"""The model's code in the user's environment (issue 36, item 10): a missing package is named with the imports that
lead to it (exit 2, one line, details with --json); the user's PYTHONPATH and `--source-root` reach the workers'
import path and the plan records the roots for verify; every worker runs model code in a scratch folder, so a
model that writes `./marker` while it is imported or run leaves nothing in the user's folder."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import run_cli
from integrate.verify.gpu import Row, run_matrix

ACCELERATOR = "fused_attn_kernels_xyz"  # a package nobody installed

MODEL = '''
import torch
from torch import nn

from {layers} import Block


class Model(nn.Module):
    def __init__(self, dim=8, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([Block(dim) for _ in range(depth)])
        self.out = nn.Linear(dim, dim)

    def forward(self, hidden_states):
        for block in self.blocks:
            hidden_states = block(hidden_states)
        return self.out(hidden_states)
'''

LAYERS = '''
import torch
from torch import nn
{extra}

class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, hidden_states):
        return hidden_states + self.proj(hidden_states)
'''


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def _accelerated(root: Path) -> Path:
    """`dit_pkg/model.py` imports `.layers`, whose line 3 imports an accelerator package that is not installed."""
    _write(root / "dit_pkg" / "__init__.py", "")
    _write(root / "dit_pkg" / "layers.py", LAYERS.format(extra=f"import {ACCELERATOR}\n"))
    (root / "m").mkdir(exist_ok=True)
    return _write(root / "dit_pkg" / "model.py", MODEL.format(layers=".layers"))


def _namespaced(root: Path) -> tuple[Path, Path]:
    """A src layout whose top-level `acme` is a namespace package (no __init__.py) holding the package `dit`:
    `acme/dit/model.py` imports `acme.layers`, so its root is `src`, not the folder above `dit`. (src, model.py)"""
    src = root / "src"
    _write(src / "acme" / "dit" / "__init__.py", "")
    _write(src / "acme" / "layers.py", LAYERS.format(extra=""))
    (root / "m").mkdir(exist_ok=True)
    return src, _write(src / "acme" / "dit" / "model.py", MODEL.format(layers="acme.layers"))


def _gate(model: Path, root: Path, *extra: str) -> list[str]:
    return [str(model), "--model-path", str(root / "m"), "--transformer-class", "Model", "--no-pipeline",
            "--separate-cfg", "no", *extra]


def _one_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


# -- 1. a missing package, and the imports that lead to it ---------------------------------------------------------


def test_plan_names_the_missing_accelerator_and_the_imports_that_lead_to_it(tmp_path):
    """The model's module imports its layers, whose third line imports an accelerator package that is not
    installed: the line names that package and each hop (file:line imports module), exit 2, nothing written.
    (The probe used to load the file as a loose module after the import by name failed, and report the relative
    import that failed there: the model's own package, not the accelerator.)"""
    model = _accelerated(tmp_path)
    args = ["plan", *_gate(model, tmp_path, "--out", str(tmp_path / "plan"), "--trust-code")]
    line = _one_line(run_cli(*args))
    assert f"importing dit_pkg.model needs `{ACCELERATOR}`, which is not installed" in line, line
    assert f"dit_pkg/model.py:4 imports dit_pkg.layers, dit_pkg/layers.py:3 imports {ACCELERATOR}" in line, line
    assert "--no-probe" in line and not (tmp_path / "plan").exists()

    proc = run_cli(*args, "--json")
    assert _one_line(proc) == line
    data = json.loads(proc.stdout)
    assert data["kind"] == "missing-dependency" and line == f"integrate: error: {data['error']}"
    missing = data["missing_dependency"]
    assert missing["package"] == ACCELERATOR and missing["module"] == "dit_pkg.model"
    assert [(Path(h["file"]).name, h["line"], h["module"]) for h in missing["chain"]] == [
        ("model.py", 4, "dit_pkg.model"), ("layers.py", 3, "dit_pkg.layers")], missing["chain"]
    assert missing["chain"][-1]["code"] == f"import {ACCELERATOR}"


def test_verify_names_a_missing_package_with_exit_2(tmp_path):
    """verify's workers import the model too: the same line and exit 2 (it was a fixture `error`, exit 1, whose
    last traceback line named only the package)."""
    model = _accelerated(tmp_path)
    plan, out = tmp_path / "plan", tmp_path / "out"
    assert run_cli("plan", *_gate(model, tmp_path, "--out", str(plan), "--no-probe")).returncode == 0
    assert run_cli("approve", str(plan), "--reviewer", "Ada").returncode == 0
    assert run_cli("generate", str(plan), "--out", str(out)).returncode in (0, 1)
    proc = run_cli("verify", str(plan), "--generated", str(out), "--fixture-only", "--trust-code", "--json")
    line = _one_line(proc)
    assert f"dit_pkg/model.py:4 imports dit_pkg.layers, dit_pkg/layers.py:3 imports {ACCELERATOR}" in line, line
    assert json.loads(proc.stdout)["missing_dependency"]["package"] == ACCELERATOR


# -- 2. PYTHONPATH and --source-root --------------------------------------------------------------------------------


def test_the_models_own_package_off_the_path_names_the_source_root_to_pass(tmp_path):
    """Without its root on the path, the model's own top-level package is what is missing: the line says which
    `--source-root` puts it there. With it, the model builds on the meta device, its module is named from the root
    (`acme.dit.model`), the block class is traced through `acme.layers`, and the plan records the root (and
    binds every file of the package under it)."""
    src, model = _namespaced(tmp_path)
    _write(src / "acme" / "kernels" / "fused.py", "SCALE = 2\n")  # never read by the analysis: bound all the same
    line = _one_line(run_cli("plan", *_gate(model, tmp_path, "--out", str(tmp_path / "p"), "--trust-code")))
    assert "needs `acme`" in line and f"pass --source-root {src}" in line, line

    proc = run_cli("plan", *_gate(model, tmp_path, "--out", str(tmp_path / "p"), "--trust-code", "--json",
                                  "--source-root", str(src)))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["facts"]["crosscheck"]["ok"] is True, data["facts"]["crosscheck"]
    assert data["model"]["source_roots"] == [str(src)]
    assert str(src / "acme" / "kernels" / "fused.py") in data["reads"]  # the approval binds the root's package
    (bl,) = data["cache"]["block_lists"]
    assert bl["block_class"] == "Block"
    analysed = json.loads(run_cli("analyze", *_gate(model, tmp_path, "--json", "--no-cache", "--source-root",
                                                     str(src))).stdout)
    assert analysed["gate"]["source_roots"] == [str(src)]
    (bl,) = analysed["transformer"]["block_lists"]
    assert bl["is_blocks"] and bl["block_file"] == str(src / "acme" / "layers.py"), bl


def test_the_users_pythonpath_reaches_the_workers(tmp_path):
    """Workers start with `python -I`, which drops PYTHONPATH: its entries are passed to them explicitly."""
    src, model = _namespaced(tmp_path)
    args = ["plan", *_gate(model, tmp_path, "--out", str(tmp_path / "p"), "--trust-code", "--json")]
    proc = run_cli(*args, env={"PYTHONPATH": os.pathsep.join(["", str(src)])})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["facts"]["crosscheck"]["ok"] is True


def test_verify_runs_a_plan_made_with_a_source_root(tmp_path):
    """The plan records `--source-root`: verify's workers import the model from it with no flag of their own, and
    generate's launcher and the GPU matrix's setup put it on PYTHONPATH."""
    src, model = _namespaced(tmp_path)
    plan, out = tmp_path / "plan", tmp_path / "out"
    assert run_cli("plan", *_gate(model, tmp_path, "--out", str(plan), "--no-probe", "--source-root",
                                  str(src))).returncode == 0
    assert run_cli("approve", str(plan), "--reviewer", "Ada").returncode == 0
    gen = json.loads(run_cli("generate", str(plan), "--out", str(out), "--json").stdout)
    assert gen["plugin"]["launcher"].startswith(f"PYTHONPATH={out.resolve()}{os.pathsep}{src} "), gen["plugin"]
    proc = run_cli("verify", str(plan), "--generated", str(out), "--fixture-only", "--trust-code", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fixture"]["status"] == "derived"
    printed = json.loads(run_cli("verify", str(plan), "--generated", str(out), "--gpu", "--print", "--trust-code",
                                 "--json").stdout)
    assert f"export PYTHONPATH={out.resolve()}{os.pathsep}{src}${{PYTHONPATH" in printed["setup"][1], printed


# -- 3. model code runs in a scratch folder -------------------------------------------------------------------------

LITTERING = '''
import os

open("marker", "w").close()  # a model that writes into its working directory as it is imported
with open(os.environ["SEEN_CWD"], "a") as seen:
    seen.write(os.getcwd() + "\\n")
'''


def _littering(root: Path) -> Path:
    (root / "m").mkdir(parents=True, exist_ok=True)
    _write(root / "layers.py", LAYERS.format(extra=""))
    return _write(root / "model.py", LITTERING + MODEL.format(layers="layers"))


def _ran_elsewhere(user: Path, seen: Path, at_least: int) -> None:
    """The model ran (`seen` holds each worker's folder), never in `user`, and each folder is gone."""
    folders = seen.read_text().split()
    assert len(folders) >= at_least, folders
    assert not (user / "marker").exists(), "the model wrote into the user's folder"
    assert all(Path(f) != user and not Path(f).exists() for f in folders), folders


def test_the_probe_imports_the_model_in_a_scratch_folder(tmp_path):
    user, model = tmp_path / "user", _littering(tmp_path / "model")
    user.mkdir()
    seen = tmp_path / "seen"
    proc = run_cli("plan", *_gate(model, model.parent, "--out", "plan", "--trust-code", "--json"), cwd=user,
                   env={"SEEN_CWD": str(seen)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["facts"]["crosscheck"]["ok"] is True
    _ran_elsewhere(user, seen, 1)
    assert sorted(p.name for p in user.iterdir()) == ["plan"]


@pytest.mark.parametrize("fork", ["1", "0"], ids=["fork-server", "fresh"])
def test_verify_runs_the_model_in_scratch_folders(tmp_path, fork):
    """The fixture's derivation, the baseline and the cache proof each import and run the model: forked from the
    fork server (each child in a folder of its own) or started afresh."""
    user, model = tmp_path / "user", _littering(tmp_path / "model")
    user.mkdir()
    seen = tmp_path / "seen"
    env = {"SEEN_CWD": str(seen), "INTEGRATE_FORK_SERVER": fork}
    assert run_cli("plan", *_gate(model, model.parent, "--out", "plan", "--no-probe"), cwd=user,
                   env=env).returncode == 0
    assert run_cli("approve", "plan", "--reviewer", "Ada", cwd=user).returncode == 0
    assert run_cli("generate", "plan", "--out", "out", cwd=user).returncode in (0, 1)
    proc = run_cli("verify", "plan", "--generated", "out", "--trust-code", "--proof", "cache", "--json", cwd=user,
                   env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["cache"]["status"] == "pass"
    _ran_elsewhere(user, seen, 3)
    assert sorted(p.name for p in user.iterdir()) == ["out", "plan"]


def test_the_gpu_matrix_runs_the_example_in_its_output_folder(tmp_path):
    """The GPU matrix runs the generated example (the model's code): in the matrix's output folder, with each
    output path absolute, never in the user's folder. A stand-in example, so no GPU is needed."""
    plugin = tmp_path / "plugins" / "integrate_standin"
    _write(plugin / "__init__.py", "")
    _write(plugin / "__main__.py", '''
        import sys

        open("marker", "w").close()
        open(sys.argv[sys.argv.index("--save-path") + 1], "w").write("image")
        print("Inference Time: 1.5s")
    ''')
    user, out = tmp_path / "user", tmp_path / "user" / "gpu-out"
    out.mkdir(parents=True)
    venv = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{venv}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(plugin.parent)}
    cwd = os.getcwd()
    os.chdir(user)
    try:
        (result,) = run_matrix([Row("baseline", 1, (), str(out / "base.png"))], "integrate_standin", "standin", env,
                               lambda line: None, out)
    finally:
        os.chdir(cwd)
    assert result.status == "pass" and result.latency_s == 1.5, result
    assert (out / "marker").exists() and (out / "base.png").read_text() == "image"
    assert not (user / "marker").exists()
