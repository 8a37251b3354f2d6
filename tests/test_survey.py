"""`integrate survey`: every transformer class of the installed diffusers, each row from real analysis.

The full survey runs once for the module (it is the slow part); the other tests read its JSON.
"""

import importlib.util
import json
from pathlib import Path

import libcst as cst
import pytest
from conftest import ROOT, run_cli

FIXTURES = ROOT / "tests" / "fixtures"
DIFFUSERS = Path(importlib.util.find_spec("diffusers").submodule_search_locations[0]).resolve()
TRANSFORMERS = DIFFUSERS / "models" / "transformers"


def _top_classes(body):
    for stmt in body:
        if isinstance(stmt, cst.ClassDef):
            yield stmt
        elif isinstance(stmt, (cst.If, cst.Try)):
            yield from _top_classes(stmt.body.body)


def expected_classes() -> set[tuple[str, str]]:
    """(class, file) for every ModelMixin subclass in diffusers/models/transformers, computed here by
    name alone: a class whose base is named ModelMixin, or is a class (in those files or in
    models/modeling_utils.py) that is one, to a fixed point."""
    files = sorted(p for p in TRANSFORMERS.glob("*.py") if p.name != "__init__.py")
    classes = []  # (name, file, base last names)
    for path in [*files, DIFFUSERS / "models" / "modeling_utils.py"]:
        module = cst.parse_module(path.read_text())
        for node in _top_classes(module.body):
            bases = [module.code_for_node(a.value).rsplit(".", 1)[-1] for a in node.bases if a.keyword is None]
            classes.append((node.name.value, path, bases))
    models = {"ModelMixin"}
    grew = True
    while grew:
        grew = False
        for name, _, bases in classes:
            if name not in models and models & set(bases):
                models.add(name)
                grew = True
    return {(name, str(path)) for name, path, _ in classes if name in models and path.parent == TRANSFORMERS}


def rows_by_class(data: dict) -> dict[str, dict]:
    return {r["transformer_class"]: r for r in data["rows"]}


def test_schema_and_progress(survey):
    data = survey["data"]
    assert data["schema"] == "integrate.survey" and data["schema_version"] == "1.4"
    assert data["diffusers"]["version"] == "0.42.1"
    n = len([line for line in survey["cold"].stderr.splitlines() if line.startswith("[")])
    assert n == len(list(TRANSFORMERS.glob("*.py"))) - 1 + len(list(FIXTURES.rglob("*.py")))
    assert "FluxTransformer2DModel" in survey["cold"].stderr and "[1/" in survey["cold"].stderr
    for row in data["rows"]:
        assert row["status"] in ("ok", "error")
        assert row["status"] == "ok" or (row["error"] and "\n" not in row["error"])


def test_covers_every_transformer_class_in_diffusers(survey):
    got = {(r["transformer_class"], r["file"]) for r in survey["data"]["rows"]
           if Path(r["file"]).parent == TRANSFORMERS}
    expected = expected_classes()
    assert len(expected) > 60
    assert got == expected
    assert ("Transformer2DModel", str(TRANSFORMERS / "transformer_2d.py")) in got  # via LegacyModelMixin


def test_rows_come_from_analysis(survey):
    rows = rows_by_class(survey["data"])
    ok = [r for r in rows.values() if r["status"] == "ok"]
    assert len(ok) >= len(rows) - 3, [(r["transformer_class"], r["error"]) for r in rows.values() if r["error"]]
    flux = rows["FluxTransformer2DModel"]
    assert flux["status"] == "ok" and flux["line"] > 0
    assert flux["analysed_pipeline"] == "FluxPipeline"
    assert {"FluxPipeline", "FluxKontextPipeline"} <= {p["class"] for p in flux["pipelines"]}
    lists = {b["attr"]: b["forward_pattern"] for b in flux["block_lists"]}
    assert lists == {"transformer_blocks": "Pattern_1", "single_transformer_blocks": "Pattern_1"}
    assert flux["already_supported"]["registered"] is True
    assert flux["has_separate_cfg"] is False  # the true-CFG call is off by default
    assert flux["cp"]["approach"] == "hook" and flux["cp"]["shape"] and flux["tp"]["strategy"]

    motif = rows["MotifVideoTransformer3DModel"]
    assert motif["status"] == "ok"
    assert motif["already_supported"]["registered"] is False
    assert motif["analysed_pipeline"] == "MotifVideoPipeline"
    assert motif["block_lists"] and all(b["forward_pattern"] for b in motif["block_lists"])


def test_path_adds_rows_with_their_pipeline(survey):
    rows = rows_by_class(survey["data"])
    tiny = rows["TinySurveyTransformer"]
    assert tiny["file"] == str(FIXTURES / "survey" / "transformer_tiny.py")
    assert [p["class"] for p in tiny["pipelines"]] == ["TinySurveyPipeline"]
    assert tiny["block_lists"][0]["forward_pattern"] == "Pattern_0"
    assert tiny["has_separate_cfg"] is True  # cond and uncond transformer calls in each step
    assert tiny["already_supported"]["registered"] is False
    assert "TinySurveyTransformerV2" in rows  # a subclass of a ModelMixin class
    # of the other fixtures only gqa and framewise hold a ModelMixin (`GqaModel`, `FramewiseModel`); their
    # nn.Module models give no rows
    assert {Path(r["file"]).parent.name for r in rows.values() if str(FIXTURES) in r["file"]} == {
        "survey", "gqa", "framewise"}
    assert {c for c, r in rows.items() if Path(r["file"]).parent.name == "gqa"} == {"GqaModel"}
    assert {c for c, r in rows.items() if Path(r["file"]).parent.name == "framewise"} == {"FramewiseModel"}


def test_second_run_uses_the_cache(survey):
    warm = survey["warm"]
    progress = [line for line in warm.stderr.splitlines() if line.startswith("[")]
    assert progress and all(line.endswith("(cached)") for line in progress)
    assert json.loads(warm.stdout)["rows"] == survey["data"]["rows"]
    assert survey["warm_s"] < survey["cold_s"] / 3


def test_a_cached_result_of_other_code_is_not_served(tmp_path, monkeypatch):
    """integrate's own sources are part of every cache key: an entry stored by other code (a checkout between
    two commits, where the version string is the same) is a miss, and the same code finds its own entry."""
    from integrate import cache

    monkeypatch.setenv("INTEGRATE_CACHE_DIR", str(tmp_path / "cache"))
    dep = tmp_path / "model.py"
    dep.write_text("x = 1\n")
    cache.store(cache.key_for("survey", {"file": str(dep)}), {"rows": []}, [str(dep)])
    assert cache.load(cache.key_for("survey", {"file": str(dep)})) == {"rows": []}
    monkeypatch.setattr(cache, "tool_digest", lambda: "other code")
    assert cache.load(cache.key_for("survey", {"file": str(dep)})) is None


def test_table_output(survey):
    out = run_cli("survey", "--path", str(FIXTURES), env={"INTEGRATE_CACHE_DIR": survey["cache"]})  # warm
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:2] == ["transformer", "file:line"]
    flux = next(line for line in lines if line.startswith("FluxTransformer2DModel "))
    assert "transformer_blocks: P1" in flux and "FluxPipeline +" in flux
    assert any(line.startswith("* cache-dit") for line in lines)


def test_verify_runs_the_proof_for_the_rows_asked(survey):
    """`survey --verify --only` proves the rows asked (the survey itself read from the warm cache)."""
    proc = run_cli("survey", "--verify", "--only", "WanTransformer3DModel", "--json", "--path", str(FIXTURES),
                   env={"INTEGRATE_CACHE_DIR": survey["cache"]})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [r for r in json.loads(proc.stdout)["rows"] if "verify" in r]
    assert [r["transformer_class"] for r in rows] == ["WanTransformer3DModel"]
    v = rows[0]["verify"]
    assert v["fixture"] == "derived" and v["cache"] == "pass" and v["cp"] == "pass"
    assert v["tp"] == "skipped"  # cache-dit's Wan TP norm refuses CPU tensors: said, not faked


@pytest.mark.parametrize("args", [["--path", "/no/such/dir"], ["--path", str(ROOT / "README.md")],
                                  ["--jobs", "0"], ["--only", "FluxTransformer2DModel"]])
def test_bad_input_exits_2(args):
    out = run_cli("survey", *args)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert out.stdout == ""


def test_a_failing_row_is_an_error_row_not_a_crash(tmp_path):
    from integrate.survey import rows as survey_rows

    bad = tmp_path / "broken.py"
    bad.write_text("from diffusers import ModelMixin\nclass Broken(ModelMixin:\n    pass\n")
    odd = tmp_path / "odd.py"  # a class whose transformer file the gate cannot read back
    odd.write_text("from diffusers import ModelMixin\n\nclass Odd(ModelMixin):\n    forward = None\n")
    survey_rows.init_worker([], str(tmp_path))
    broken = survey_rows.survey_file(survey_rows.Task(str(bad), str(tmp_path)))
    assert [r["status"] for r in broken["rows"]] == ["error"]
    assert "syntax error" in broken["rows"][0]["error"] and "\n" not in broken["rows"][0]["error"]
    rows = survey_rows.survey_file(survey_rows.Task(str(odd), str(tmp_path)))["rows"]
    assert [r["transformer_class"] for r in rows] == ["Odd"] and rows[0]["status"] in ("ok", "error")
