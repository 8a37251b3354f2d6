"""`integrate audit --only X --fix`: our integration written over cache-dit's own where the audit finds it wrong,
on a copy of the installed cache-dit 1.5.3 (its real adapters.py), with a regression test that fails on the old
code and passes on the new, both checked here again outside the tool."""

from __future__ import annotations

import difflib
import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import importlib.util

import libcst as cst
import pytest

from conftest import run_cli
from integrate.errors import InputError
from integrate.templates.builtin import AdapterRewrite, rewrite_adapter

INSTALLED = Path(importlib.util.find_spec("cache_dit").origin).parent  # found, not imported (see conftest)


def _read(package: Path):
    return lambda rel: (package / rel).read_text() if (package / rel).is_file() else None


def _changed_lines(old: str, new: str) -> list[str]:
    return [x for x in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
            if x[:1] in "+-" and not x.startswith(("+++", "---"))]


def test_rewrite_touches_only_the_keywords_that_differ_in_the_built_in_that_answers():
    bria = AdapterRewrite(("BriaPipeline", "BriaTransformer2DModel"), ("transformer_blocks", "single_transformer_blocks"),
                          ("Pattern_1", "Pattern_1"), has_separate_cfg=False, check_forward_pattern=True)
    done = rewrite_adapter(_read(INSTALLED), bria)
    old = (INSTALLED / done.relpath).read_text()
    # 'BriaFibo' is registered ahead of 'Bria' in the same file: the lookup takes the one cache-dit answers with
    assert (done.relpath, done.function, done.key, done.changed) == \
        ("caching/block_adapters/adapters.py", "bria_adapter", "Bria", ("forward_pattern",))
    assert old.splitlines()[done.line - 2].strip() == '@BlockAdapterRegister.register("Bria")'
    assert _changed_lines(old, done.text) == ["-      ForwardPattern.Pattern_0,", "-      ForwardPattern.Pattern_0,",
                                              "+      ForwardPattern.Pattern_1,", "+      ForwardPattern.Pattern_1,"]
    # what the integration already says is not rewritten: nothing changes
    same = AdapterRewrite(bria.lookup, bria.blocks, ("Pattern_0", "Pattern_0"), False, True)
    assert rewrite_adapter(_read(INSTALLED), same).changed == () and \
        rewrite_adapter(_read(INSTALLED), same).text == old
    # a list dropped, CFG called separately, the pattern check off: keywords rewritten, added and kept in place
    other = AdapterRewrite(("BriaPipeline",), ("transformer_blocks",), ("Pattern_3",), True, False)
    done = rewrite_adapter(_read(INSTALLED), other)
    assert set(done.changed) == {"blocks", "forward_pattern", "has_separate_cfg", "check_forward_pattern"}
    func = next(s for s in cst.parse_module(done.text).body
                if isinstance(s, cst.FunctionDef) and s.name.value == "bria_adapter")
    code = cst.Module([]).code_for_node(func)
    assert "single_transformer_blocks" not in code and "has_separate_cfg=True" in code and \
        "check_forward_pattern=False" in code and code.rstrip().splitlines()[-2].strip() == "**kwargs,"
    assert "_relaxed_assert(pipe.transformer, BriaTransformer2DModel)" in code  # its class check is kept


def test_rewrite_refuses_what_it_cannot_write_in_place(tmp_path):
    with pytest.raises(InputError, match="no built-in adapter of the checkout answers"):
        rewrite_adapter(_read(INSTALLED), AdapterRewrite(("NoSuchPipeline",), ("blocks",), ("Pattern_0",), False, True))
    with pytest.raises(InputError, match="not a block list attribute path"):
        rewrite_adapter(_read(INSTALLED), AdapterRewrite(("BriaPipeline",), ("x; import os",), ("Pattern_1",),
                                                         False, True))
    with pytest.raises(InputError, match="not a ForwardPattern member"):
        rewrite_adapter(_read(INSTALLED), AdapterRewrite(("BriaPipeline",), ("transformer_blocks",),
                                                         ("Pattern_1()",), False, True))


def _pytest(test: Path, package_parent: Path | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    if package_parent is not None:
        env["PYTHONPATH"] = str(package_parent)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    code = ("import sys, cache_dit, pytest; print('FROM', cache_dit.__file__, flush=True); "
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--rootdir', '.', sys.argv[1]]))")
    return subprocess.run([sys.executable, "-P", "-c", code, str(test)], cwd=test.parent, env=env,
                          capture_output=True, text=True, timeout=600)


def test_fix_bria_writes_a_fix_whose_regression_test_fails_before_and_passes_after(tmp_path):
    tree = tmp_path / "cache-dit" / "src" / "cache_dit"
    shutil.copytree(INSTALLED, tree, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"INTEGRATE_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_cli("audit", "--only", "BriaTransformer2DModel", "--proof", "cache", "--fix", "--cache-dit-src",
                   str(tmp_path / "cache-dit"), "--out", str(tmp_path / "out"), "--json", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["schema"] == "integrate.audit-fix" and data["status"] == "fixed"
    assert [(r["proof"], r["tree"], r["status"]) for r in data["runs"]] == [("cache", "before", "fail"),
                                                                          ("cache", "after", "pass")]
    assert data["changed"] == ["caching/block_adapters/adapters.py"]
    # the checkout: only adapters.py changed, and only Bria's two patterns in it; no __pycache__ left behind
    cmp = filecmp.dircmp(INSTALLED, tree, ignore=["__pycache__"])
    assert cmp.diff_files == [] and not cmp.left_only and not cmp.right_only
    assert not list(tree.rglob("__pycache__"))
    old = (INSTALLED / "caching/block_adapters/adapters.py").read_text()
    new = (tree / "caching/block_adapters/adapters.py").read_text()
    assert len(_changed_lines(old, new)) == 4 and "Pattern_1" in "".join(_changed_lines(old, new))
    # the regression test, run here outside the tool: fails on the installed (old) cache-dit, passes on the fix
    test = tmp_path / "out" / "tests" / "api" / "test_bria_cache_regression.py"
    assert data["tests"] == ["tests/api/test_bria_cache_regression.py"] and test.is_file()
    before, after = _pytest(test, None), _pytest(test, tree.parent)
    assert f"FROM {INSTALLED}" in before.stdout and before.returncode == 1 and "RuntimeError" in before.stdout
    assert f"FROM {tree}" in after.stdout and after.returncode == 0, after.stdout[-3000:]
    assert "integrate" not in test.read_text().split('"""', 2)[2]  # the test needs cache-dit and diffusers only
    pr = (tmp_path / "out" / "PR.md").read_text()
    assert "transformer_blocks.0" in pr and "| before | **fail** |" in pr and "| after | **pass** |" in pr
    assert "ForwardPattern.Pattern_1" in pr and str(tmp_path) not in pr and "/site-packages/" not in pr
    assert (tmp_path / "out" / "fix.diff").read_text() == data["diff"]
    # again on the fixed tree: the test no longer fails before, so nothing is written (exit 1, tree as it is)
    again = run_cli("audit", "--only", "BriaTransformer2DModel", "--proof", "cache", "--fix", "--cache-dit-src",
                    str(tree), "--out", str(tmp_path / "out2"), "--json", env=env)
    assert again.returncode == 1
    redo = json.loads(again.stdout)
    assert redo["status"] == "not-fixed" and any("does not show the defect" in m for m in redo["manual"])
    assert (tree / "caching/block_adapters/adapters.py").read_text() == new and not (tmp_path / "out2").exists()


@pytest.mark.parametrize("args, message", [
    (("--fix",), "--fix needs --cache-dit-src"),
    (("--fix", "--cache-dit-src", "SRC", "--out", "OUT"), "--fix writes one fix"),
    (("--only", "BriaTransformer2DModel", "--only", "FluxTransformer2DModel", "--fix", "--cache-dit-src", "SRC",
      "--out", "OUT"), "--fix writes one fix"),
    (("--only", "BriaTransformer2DModel", "--fix", "--cache-dit-src", "NOTREE", "--out", "OUT"),
     "no such directory"),
    (("--only", "BriaTransformer2DModel", "--out", "OUT"), "go with --fix"),
])
def test_fix_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    (tmp_path / "SRC").mkdir()
    shutil.copytree(INSTALLED, tmp_path / "SRC" / "cache_dit", ignore=shutil.ignore_patterns("__pycache__"))
    args = [str(tmp_path / a) if a in ("SRC", "OUT", "NOTREE") else a for a in args]
    proc = run_cli("audit", *args)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "OUT").exists()


def test_fix_a_tp_finding_replaces_the_built_in_planner_class_in_its_module(tmp_path):
    """cache-dit 1.5.3's SkyReelsV2 TP planner names `attn.*` modules the blocks do not have: nothing is sharded.
    The fix writes ours over that class where it stands (same name, same decorator: planners.py untouched); its
    regression test (2 gloo processes, this machine's CPU) fails on the old tree (nothing sharded) and passes on
    the new; run here again outside the tool."""
    tree = tmp_path / "cache_dit"
    shutil.copytree(INSTALLED, tree, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"INTEGRATE_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_cli("audit", "--only", "SkyReelsV2Transformer3DModel", "--proof", "tp", "--fix", "--cache-dit-src",
                   str(tree), "--out", str(tmp_path / "out"), "--json", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["status"] == "fixed" and data["changed"] == ["distributed/transformers/skyreels.py"]
    (w,) = data["rewritten"]
    assert (w["function"], w["key"], w["changed"]) == ("SkyReelsV2TensorParallelismPlanner", "SkyReelsV2", ["class"])
    new = (tree / "distributed/transformers/skyreels.py").read_text()
    module = cst.parse_module(new)
    (cls,) = [s for s in module.body if isinstance(s, cst.ClassDef) and s.name.value == w["function"]]
    assert cst.Module([]).code_for_node(cls.decorators[0].decorator) == \
        'TensorParallelismPlannerRegister.register("SkyReelsV2")'
    assert '"attn1.to_q": "colwise"' in new and "SkyReelsV2ContextParallelismPlanner" in new  # CP planner kept
    assert (tree / "distributed/transformers/planners.py").read_text() == \
        (INSTALLED / "distributed/transformers/planners.py").read_text()
    (test,) = data["tests"]
    path = tmp_path / "out" / test
    before, after = _pytest(path, None), _pytest(path, tree.parent)
    assert before.returncode == 1 and "no parameter was sharded" in before.stdout
    assert after.returncode == 0, after.stdout[-3000:]


def test_a_registration_that_answers_other_installed_models_is_not_written_over():
    """cache-dit registers its AnyFlow TP planner as 'AnyFlow', which also answers AnyFlowFARTransformer3DModel
    (no longer name is registered for it): a planner proved on AnyFlowTransformer3DModel alone would change FAR
    unproved. 'SkyReelsV2' answers no other installed model."""
    from integrate.survey import model_class_names
    from integrate.templates.builtin import PLANNER_REGISTRIES, PLANNERS, also_answers, package_files, registered_keys

    keys = registered_keys(_read(INSTALLED), package_files(INSTALLED, PLANNERS), PLANNER_REGISTRIES["tp"])
    models = model_class_names()
    assert also_answers("AnyFlow", "AnyFlowTransformer3DModel", models, keys) == ["AnyFlowFARTransformer3DModel"]
    assert also_answers("SkyReelsV2", "SkyReelsV2Transformer3DModel", models, keys) == []
    assert "AnyFlowTransformerBlock" not in models  # a block is no model: only ModelMixin classes count
