"""One injection test per template input.

The inputs are found, not listed: every string value and every dict key of a real approved plan (MotifVideo's,
which has every artifact: PatchFunctor, CP, TP, text-encoder planners, example, test matrix) is, in turn,
replaced by one payload that tries every way out at once: a docstring's closing quotes, a line break, an
`os.system` call, a `\\N{` escape (which makes Python refuse the file) and a shell command substitution.
Values at list positions of the same kind count as one input (all of them are replaced together).

Whatever `generate` makes of it must hold: it refuses (exit 2, one line, nothing written) or every file it
wrote compiles, no `os.system` call appears in any module, the shell script's assignment of the model path
runs in bash without running the payload, and the marker the payload would create does not exist.
"""

from __future__ import annotations

import ast
import copy
import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import plan_md_for

from integrate.cli import main

ROOT = Path(__file__).resolve().parents[1]
MOTIF = ROOT / "examples" / "motif-video"
PAYLOAD = 'x\\N{"""\nimport os; os.system("touch {marker}")\n"""\n$(touch {marker})`touch {marker}`#'


def _inputs(data) -> list[tuple[str, tuple]]:
    """(kind, shape) for every string value and every dict key; a shape writes list positions as '#'."""
    found: dict[tuple[str, tuple], None] = {}

    def walk(node, shape: tuple) -> None:
        if isinstance(node, dict):
            if node:
                found[("key", shape)] = None
            for key, value in node.items():  # the plan's `reads` is keyed by file paths: one input for all
                walk(value, shape + ("*" if shape == ("reads",) else key,))
        elif isinstance(node, list):
            for value in node:
                walk(value, shape + ("#",))
        elif isinstance(node, str):
            found[("value", shape)] = None

    walk(data, ())
    skip = {("value", ("schema",)), ("value", ("schema_version",)), ("key", ())}  # checked before anything else
    return [i for i in found if i not in skip]


def _inject(node, shape: tuple, kind: str, payload: str):
    """A copy of `node` with every value (or the first key of every dict) at `shape` replaced."""
    if not shape:
        if kind == "key":
            if not isinstance(node, dict) or not node:
                return node
            first = next(iter(node))
            return {(payload if k == first else k): v for k, v in node.items()}
        return payload
    head, rest = shape[0], shape[1:]
    if head == "*":
        return {k: _inject(v, rest, kind, payload) for k, v in node.items()} if isinstance(node, dict) else node
    if head == "#":
        return [_inject(v, rest, kind, payload) for v in node] if isinstance(node, list) else node
    if not isinstance(node, dict):
        return node
    return {k: (_inject(v, rest, kind, payload) if k == head else v) for k, v in node.items()}


def _collect() -> list[tuple[str, tuple]]:
    """The inputs, read from the plan the snapshot test stores for MotifVideo (same tool, same model)."""
    return _inputs(json.loads((ROOT / "tests" / "snapshots" / "motif_video" / "plan.json").read_text()))


INPUTS = _collect()


@pytest.fixture(scope="module")
def motif_plan(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("motif")
    result = CliRunner().invoke(main, ["plan", str(MOTIF), "--out", str(tmp / "plan"), "--no-probe"])
    assert result.exit_code == 0, result.stderr
    return json.loads((tmp / "plan" / "plan.json").read_text()), (tmp / "plan" / "PLAN.md").read_text()


def test_every_input_of_the_real_plan_is_covered(motif_plan):
    assert set(_inputs(motif_plan[0])) == set(INPUTS)  # the stored snapshot and a fresh plan agree
    assert len(INPUTS) > 150


def _no_payload_in_python(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))  # compiles, or the test fails here
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "system":
            raise AssertionError(f"the payload became code in {path.name}:{node.lineno}")


def _no_payload_in_shell(script: Path, cwd: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True)
    assignments = [line for line in script.read_text().splitlines() if line.startswith("DEFAULT_MODEL=")]
    for line in assignments:  # the one line a user-controlled value reaches: run it for real
        subprocess.run(["bash", "-c", line], cwd=cwd, check=True)


@pytest.mark.parametrize("kind,shape", INPUTS, ids=[f"{k}:{'.'.join(map(str, s))}" for k, s in INPUTS])
def test_a_hostile_plan_input_never_becomes_code(tmp_path, motif_plan, monkeypatch, kind, shape):
    marker = tmp_path / "marker"
    monkeypatch.chdir(tmp_path)
    data = _inject(copy.deepcopy(motif_plan[0]), shape, kind, PAYLOAD.replace("{marker}", str(marker)))
    plan_dir = tmp_path / "plan"
    plan_dir.mkdir()
    (plan_dir / "plan.json").write_text(json.dumps(data, indent=2))
    (plan_dir / "PLAN.md").write_text(plan_md_for(data, motif_plan[1]))  # as `integrate revise` would render it
    runner = CliRunner()
    approved = runner.invoke(main, ["approve", str(plan_dir), "--reviewer", "R"])
    assert approved.exit_code in (0, 2), approved.stderr
    if approved.exit_code == 2:
        assert len(approved.stderr.strip().splitlines()) == 1
        return
    out = tmp_path / "out"
    result = runner.invoke(main, ["generate", str(plan_dir), "--out", str(out)])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 1, 2), result.stderr
    if result.exit_code == 2:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert not out.exists(), "a refused generate wrote files"
    else:
        for module in out.rglob("*.py"):
            _no_payload_in_python(module)
        for script in out.rglob("*.sh"):
            _no_payload_in_shell(script, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) in (["plan"], ["out", "plan"]), "a file outside --out"
    assert not marker.exists(), "the payload ran"


# -- the model directory's own path, through every command that writes or prints it ----------------------------


def test_a_hostile_model_path_reaches_no_code_and_no_shell(tmp_path, monkeypatch):
    """The issue's first reproduction: a model folder whose name closes a docstring and substitutes a shell
    command. plan, approve, generate, the CPU fixture verify writes and the GPU commands it prints all carry
    the path, and none of them runs it."""
    import shutil

    marker = tmp_path / "marker"
    model = tmp_path / f'm"""$(touch {marker.name})`touch {marker.name}`;touch {marker.name}'
    shutil.copytree(MOTIF, model)
    monkeypatch.chdir(tmp_path)  # the payloads write `marker` relative to here
    runner = CliRunner()
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    for args in (["plan", str(model), "--out", str(plan_dir), "--no-probe"], ["approve", str(plan_dir), "--reviewer",
                 "R"], ["generate", str(plan_dir), "--out", str(out)]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, (args[0], result.stderr)
    for module in out.rglob("*.py"):
        _no_payload_in_python(module)
    for script in out.rglob("*.sh"):
        _no_payload_in_shell(script, tmp_path)
    printed = runner.invoke(main, ["verify", str(plan_dir), "--generated", str(out), "--gpu", "--print"])
    assert printed.exit_code == 0, printed.stderr
    for line in printed.stdout.splitlines():
        if line.startswith("export "):
            subprocess.run(["bash", "-c", line], cwd=tmp_path, check=True)  # an assignment: harmless unless unquoted
        elif line.strip() and not line.startswith("#"):
            subprocess.run(["bash", "-n", "-c", line], cwd=tmp_path, check=True)
    fixture = runner.invoke(main, ["verify", str(plan_dir), "--generated", str(out), "--proof", "cache"])
    assert fixture.exit_code in (0, 1), fixture.stderr
    _no_payload_in_python(out / "verify_fixture.py")
    assert not marker.exists(), "the payload ran"


@pytest.mark.parametrize("field", ["registered_as", "supported_by"])
def test_a_hostile_registration_that_our_te_planner_goes_ahead_of_never_becomes_code(tmp_path, motif_plan,
                                                                                       monkeypatch, field):
    """The registration of cache-dit's a generated TE-P planner is registered ahead of reaches the planner's comment
    and generate's notes (MotifVideo's own plan has none: its encoder is answered by no registration, so the sweep
    above never sees these fields set)."""
    marker = tmp_path / "marker"
    monkeypatch.chdir(tmp_path)
    data = copy.deepcopy(motif_plan[0])
    te = data["text_encoders"][0]
    te.update(supported=True, registered_as="T5Gemma", supported_by="gemma.py:1", planner="generate")
    te[field] = PAYLOAD.replace("{marker}", str(marker))
    plan_dir = tmp_path / "plan"
    plan_dir.mkdir()
    (plan_dir / "plan.json").write_text(json.dumps(data, indent=2))
    (plan_dir / "PLAN.md").write_text(plan_md_for(data, motif_plan[1]))
    runner = CliRunner()
    assert runner.invoke(main, ["approve", str(plan_dir), "--reviewer", "R"]).exit_code == 0
    out = tmp_path / "out"
    result = runner.invoke(main, ["generate", str(plan_dir), "--out", str(out), "--json"])
    assert result.exit_code in (0, 1), result.stderr
    planner = next(out.rglob("te_text_encoder.py"))
    assert "_register_ahead" in planner.read_text()  # the path under test was taken
    for module in out.rglob("*.py"):
        _no_payload_in_python(module)
    assert not marker.exists(), "the payload ran"
