"""Issue 33: text from a model folder, a model's source or a reviewer never runs. Each test is the attack itself, a
payload that would leave a marker file, carried through the commands a user runs; each failed on the main of
2026-12-04 (before these fixes)."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys

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
def test_a_model_folder_and_config_values_never_run_from_the_fixture(tmp_path, folder):
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
