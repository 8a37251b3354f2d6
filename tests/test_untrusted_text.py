"""Issue 33: text from a model folder, a model's source or a reviewer never runs. Each test is the attack itself, a
payload that would leave a marker file, carried through the commands a user runs; each failed on the main of
2026-12-04 (before these fixes)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

MOTIF = ROOT / "examples" / "motif-video"


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("INTEGRATE_CACHE_DIR", "")
    monkeypatch.setenv("INTEGRATE_APPROVAL_KEY", str(tmp_path / "approval.key"))
    monkeypatch.chdir(tmp_path)  # a payload writes its marker relative to here


def _calls(tree: ast.AST) -> set[str]:
    return {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            for n in ast.walk(tree) if isinstance(n, ast.Call)}


# -- 1. a docstring no text can close; the fixture's config written as literals -----------------------------------

FOLDERS = ['m"""""' + ";__import__('os').system('touch marker');{'''",  # the shape: five quotes, then code
           'm""""',  # four: the old escaper's last quote before the closing ones
           'm\\"""""; import os; os.system("touch marker") #']


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_fixture_written_for_any_folder_and_config_value_holds_data_only(tmp_path, folder):
    """The fixture module's text as verify writes it, for each shape (the next test runs one end to end)."""
    from integrate.verify.fixture import render

    note = "x''':0,#\"\"\"; __import__('os').system('touch marker')"
    text = render(transformer_class="M", transformer_module="m", config={"note": note}, changes={"n": (1, '""" x')},
                  slots=[], image_tokens=4, text_tokens=2, steps=1,
                  config_source=str(tmp_path / folder / "transformer" / "config.json"))
    tree = ast.parse(text)
    assert str(tmp_path / folder) in ast.get_docstring(tree, clean=False)
    config = next(n.value for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "CONFIG")
    assert ast.literal_eval(config) == {"note": note} and not {"system", "__import__"} & _calls(tree)


def test_a_model_folder_and_config_values_never_run_from_the_fixture(tmp_path):
    folder = FOLDERS[0]
    model = tmp_path / folder
    shutil.copytree(MOTIF, model)
    config = json.loads((model / "transformer" / "config.json").read_text())
    config["note"] = "x''':0,#\"\"\"; __import__('os').system('touch marker')"  # a value the fixture writes
    (model / "transformer" / "config.json").write_text(json.dumps(config))
    reviewer = 'R"""""; __import__("os").system("touch marker") #'
    for args in (["plan", str(model), "--out", "plan", "--no-probe"], ["approve", "plan", "--reviewer", reviewer],
                 ["generate", "plan", "--out", "out"]):
        result = run_cli(*args)
        assert result.returncode == 0, (args[0], result.stderr)
    result = run_cli("verify", "plan", "--generated", "out", "--fixture-only")
    assert result.returncode in (0, 1), result.stderr
    assert "no proof was run" in result.stdout and "\ncache:" not in result.stdout  # no rows for proofs not run
    fixture = (tmp_path / "out" / "verify_fixture.py").read_text()
    tree = ast.parse(fixture)
    doc = ast.get_docstring(tree, clean=False)
    assert str(model / "transformer" / "config.json") in doc  # the whole path stayed inside the docstring
    assert not {"system", "__import__"} & _calls(tree)
    for module in (tmp_path / "out").rglob("*.py"):
        assert not {"system", "__import__"} & _calls(ast.parse(module.read_text())), module
    # the fixture module itself, imported as the worker imports it
    subprocess.run([sys.executable, "-c", "import runpy; runpy.run_path('out/verify_fixture.py')"], cwd=tmp_path,
                   capture_output=True, timeout=120, check=False)
    assert not (tmp_path / "marker").exists(), "the payload ran"


# -- 2. a patched forward keeps its signature as data -------------------------------------------------------------

SIGNED = '''import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, hidden_states, temb):
        return hidden_states + self.proj(temb)


class Model(nn.Module):
    def __init__(self, num_layers: int = 2):
        super().__init__()
        self.scale = 2.0
        self.blocks = nn.ModuleList([Block() for _ in range(num_layers)])

    @{decorator}
    def forward(self, hidden_states: __import__("os").system("touch marker_annotation"), temb,
                scale=__import__("os").system("touch marker_default") or 3.0, *, flag: bool = True, eps=-1e-6,
                **kwargs: __import__("os").system("touch marker_kwargs")) -> __import__("os").system("touch marker_ret"):
        for i, block in enumerate(self.blocks):
            scaled = temb * self.scale  # loop-invariant: the PatchFunctor hoists it, so forward is rewritten
            hidden_states = block(hidden_states, scaled)
        return hidden_states * scale
'''


def _signed_plugin(tmp_path, decorator: str):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "model.py").write_text(SIGNED.replace("{decorator}", decorator))
    (tmp_path / "config.json").write_text('{"num_layers": 2}')
    for args in (["plan", "pkg/model.py", "--transformer-class", "Model", "--no-pipeline", "--separate-cfg", "no",
                  "--config", "config.json", "--out", "plan", "--no-probe"], ["approve", "plan", "--reviewer", "R"]):
        assert run_cli(*args).returncode == 0, args
    return run_cli("generate", "plan", "--out", "out")


def test_a_forward_signature_never_runs_on_plugin_import_and_its_defaults_are_the_models(tmp_path):
    """Defaults, annotations and the return annotation of forward are model expressions: the plugin keeps names and
    kinds, literal defaults as literals, and reads any other default from the model's own function at run time.
    A decorator that is a name called with literals (`torch.no_grad()`) is applied when the functor is."""
    _signed_plugin(tmp_path, "torch.no_grad()")
    functor = next((tmp_path / "out").glob("*/patch_functor.py")).read_text()
    assert "__import__" not in functor and 'torch.no_grad()(patched_forward)' in functor
    probe = """
import sys, os
sys.path[:0] = ["out", "."]
import integrate_model  # the plugin alone: nothing of the model's may run
assert not [f for f in os.listdir(".") if f.startswith("marker")], os.listdir(".")
from pkg.model import Model  # the model's own module evaluates its own signature (its markers)
import torch
from integrate_model.patch_functor import ModelPatchFunctor
torch.manual_seed(0)
model = Model()
x, t = torch.randn(1, 8), torch.randn(1, 8)
expected = model(x, t)
ModelPatchFunctor()._apply(model)
assert model.forward.__func__.__wrapped__.__name__ == "patched_forward"
got = model(x, t)  # scale: the model's own default (3.0), read at run time
assert torch.equal(got, expected), (got, expected)
assert not got.requires_grad  # torch.no_grad() applied by the functor
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


def test_a_decorator_that_is_an_expression_is_refused_with_why(tmp_path):
    result = _signed_plugin(tmp_path, '__import__("os").system("touch marker_decorator") or (lambda f: f)')
    assert result.returncode == 1, result.stderr  # the hoist is left to the hand-written part
    assert "decorator" in result.stdout and "copies no model expression" in result.stdout
    for module in (tmp_path / "out").rglob("*.py"):
        assert "__import__" not in module.read_text() or module.name == "manual_patch.py", module
    subprocess.run([sys.executable, "-c", "import sys; sys.path[:0] = ['out']; import integrate_model"],
                   cwd=tmp_path, capture_output=True, timeout=120, check=False)
    assert not list(tmp_path.glob("marker*"))


# -- 3. the approval binds every file a later command reads --------------------------------------------------------

PACKAGE = {
    "__init__.py": "",
    "util.py": "def twice(x):\n    return x * 2\n",
    "blocks.py": '''from torch import nn

from .util import twice


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, hidden_states, temb):
        return twice(hidden_states) + self.proj(temb)
''',
    "model.py": '''from torch import nn

from .blocks import Block


class Model(nn.Module):
    def __init__(self, num_layers: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(num_layers)])

    def forward(self, hidden_states, temb):
        for block in self.blocks:
            hidden_states = block(hidden_states, temb)
        return hidden_states
'''}


def test_an_edit_to_any_file_the_plan_was_made_from_voids_the_approval(tmp_path):
    """The block's own file and a helper it imports are read by generate (the analysis runs again) but cited by no
    evidence line; the config is read by verify's fixture. Each is bound: an edit to any voids the approval, and
    generate refuses before writing anything."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for name, text in PACKAGE.items():
        (pkg / name).write_text(text)
    (tmp_path / "config.json").write_text('{"num_layers": 2}')
    assert run_cli("plan", "pkg/model.py", "--transformer-class", "Model", "--no-pipeline", "--separate-cfg", "no",
                   "--config", "config.json", "--out", "plan", "--no-probe").returncode == 0
    reads = json.loads((tmp_path / "plan" / "plan.json").read_text())["reads"]
    targets = [pkg / "blocks.py", pkg / "util.py", tmp_path / "config.json"]
    assert all(str(t.resolve()) in reads for t in targets), sorted(reads)
    for target in targets:
        assert run_cli("approve", "plan", "--reviewer", "R").returncode == 0
        before = target.read_text()
        edited = before.replace("class Block", "@print\nclass Block") if target.name == "blocks.py" else \
            before.replace("2", "3")
        assert edited != before
        target.write_text(edited)
        check = run_cli("approve", "plan", "--check")
        assert check.returncode == 2 and f"{target.name}, which the plan was made from, changed" in check.stderr, \
            check.stderr
        gen = run_cli("generate", "plan", "--out", "out")
        assert gen.returncode == 2 and not (tmp_path / "out").exists(), gen.stderr
        again = run_cli("approve", "plan", "--reviewer", "R")  # a plan made from other bytes is not approved
        assert again.returncode == 2 and "changed after the plan was made" in again.stderr, again.stderr
        target.write_text(before)


def test_a_model_folders_metadata_is_bound(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(MOTIF, model)
    assert run_cli("plan", str(model), "--out", "plan", "--no-probe").returncode == 0
    for meta in (model / "model_index.json", model / "transformer" / "config.json"):
        assert run_cli("approve", "plan", "--reviewer", "R").returncode == 0
        before = meta.read_text()
        meta.write_text(before.rstrip()[:-1] + ', "_edited": 1}')
        check = run_cli("approve", "plan", "--check")
        assert check.returncode == 2 and f"{meta.name}, which the plan was made from, changed" in check.stderr
        meta.write_text(before)


# -- 5. a plugin folder is absent or complete, whenever a run is killed ---------------------------------------------


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts} if folder.is_dir() else {}


def test_a_plugin_killed_at_any_write_is_absent_or_complete(tmp_path):
    from integrate import api

    model = tmp_path / "model"
    shutil.copytree(MOTIF, model)
    api.write_plan(api.plan(api.flags_for(str(model)), probe=False), tmp_path / "plan")
    api.approve(tmp_path / "plan", "R")
    out = tmp_path / "out"
    api.generate(tmp_path / "plan", out=out)
    package = next(p for p in out.iterdir() if p.is_dir() and not p.name.startswith("."))
    new = _tree(package)
    for path in package.glob("*.py"):  # an older generation, so old and new differ in every file
        path.write_text(path.read_text() + "# older\n")
    old = _tree(package)
    step = 0
    while True:
        step += 1
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            try:
                os.environ["INTEGRATE_CHECKOUT_FAULT"] = str(step)
                api.generate(tmp_path / "plan", out=out)
            finally:
                os._exit(0)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        now = _tree(package)
        assert now in ({}, old, new), f"killed at step {step}: the plugin folder is half written"
        if code == 0:
            break
        assert code == 137
        if now == new:  # the next run starts from the new generation: make it old again
            for path in package.glob("*.py"):
                path.write_text(path.read_text() + "# older\n")
            old = _tree(package)
    assert step > 5 and _tree(package) == new
    assert not [p for p in out.iterdir() if p.name.startswith(".integrate-")]  # the next run cleared the stages


# -- 6. the prescribed launch never imports a cache_dit.py from the folder it is run from ------------------------


def test_the_prescribed_command_ignores_a_cache_dit_py_in_the_working_directory(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(MOTIF, model)
    for args in (["plan", str(model), "--out", "plan", "--no-probe"], ["approve", "plan", "--reviewer", "R"]):
        assert run_cli(*args).returncode == 0
    gen = json.loads(run_cli("generate", "plan", "--out", "out", "--json").stdout)
    command = gen["plugin"]["launcher"]
    assert " -P -m " in command
    work = tmp_path / "work"
    work.mkdir()
    (work / "cache_dit.py").write_text("open('marker', 'w').close()\nraise SystemExit(7)\n")
    venv = str(Path(sys.executable).parent)
    done = subprocess.run(["bash", "-c", f"{command} --help"], cwd=work, capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "PATH": f"{venv}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (work / "marker").exists()
    matrix = (tmp_path / "out" / "test_matrix.sh").read_text()
    assert "        python -P -m integrate_motif_video " in matrix and "export PYTHONSAFEPATH=1" in matrix


# -- 7. smaller promises ------------------------------------------------------------------------------------------


def test_a_trailing_dot_names_no_method(tmp_path):
    result = run_cli("gate", "--model-path", str(MOTIF), "--pipeline-class", "MotifVideoPipeline.")
    assert result.returncode == 2 and "expected Class, Class.method" in result.stderr


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_config_that_is_not_a_regular_file_is_refused_not_taken_as_absent(tmp_path, kind):
    model = tmp_path / "model"
    (model / "transformer").mkdir(parents=True)
    shutil.copy(MOTIF / "model_index.json", model)
    config = model / "transformer" / "config.json"
    config.mkdir() if kind == "folder" else os.mkfifo(config)
    result = run_cli("plan", str(model), "--out", "plan", "--no-probe")
    assert result.returncode == 2 and "not a regular file" in result.stderr and not (tmp_path / "plan").exists()


def test_a_model_index_with_thousands_of_components_is_refused_up_front(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(MOTIF, model)
    index = json.loads((model / "model_index.json").read_text())
    index.update({f"text_encoder_{i}": ["transformers", "T5EncoderModel"] for i in range(2000)})
    (model / "model_index.json").write_text(json.dumps(index))
    result = run_cli("plan", str(model), "--out", "plan", "--no-probe")
    assert result.returncode == 2 and "components" in result.stderr


def test_a_plan_from_a_config_alone_generates_a_matrix_that_asks_for_the_model(tmp_path):
    import diffusers

    root = Path(diffusers.__file__).parent
    (tmp_path / "cfg.json").write_text('{"_class_name": "FluxTransformer2DModel", "num_layers": 2}')
    assert run_cli("plan", "--config", "cfg.json", "--pipeline-class", "FluxPipeline", "--transformer-class",
                   "FluxTransformer2DModel", "--pipeline-file", str(root / "pipelines" / "flux" / "pipeline_flux.py"),
                   "--transformer-file", str(root / "models" / "transformers" / "transformer_flux.py"), "--out", "plan",
                   "--no-probe").returncode == 0
    assert run_cli("approve", "plan", "--reviewer", "R").returncode == 0
    gen = run_cli("generate", "plan", "--out", "out")
    assert gen.returncode in (0, 1), gen.stderr
    script = tmp_path / "out" / "test_matrix.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, check=False,
                          env={k: v for k, v in os.environ.items() if k != "FLUX_DIR"})
    assert done.returncode != 0 and "set FLUX_DIR to the model folder" in done.stderr
