import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from filelock import FileLock

# cache-dit reads this when it is first imported (its ENV): set before any test module can import it, so the
# registry oracle (tests/oracle.py) sees the two Flux lists as cache-dit registers them, whatever imports first
os.environ.setdefault("CACHE_DIT_FLUX_ENABLE_DUMMY_BLOCKS", "0")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "motif-video"
# Each pipeline stage installs as a subpackage of `integrate` from its own top-level folder (pyproject's
# package-dir): an environment installed from another checkout would import some stages from there.
STAGES = ("integrate", "integrate.gate", "integrate.analyzers", "integrate.decisions", "integrate.templates",
          "integrate.verify")


def stages_outside(root: Path) -> list[str]:
    """"stage -> folder" for every stage of integrate imported from outside `root` (found, parents imported)."""
    import importlib.util

    out = []
    for name in STAGES:
        spec = importlib.util.find_spec(name)
        where = Path(next(iter(spec.submodule_search_locations or [spec.origin or ""]))).resolve() if spec else None
        if where is None or not where.is_relative_to(root.resolve()):
            out.append(f"{name} -> {where}")
    return out


def pytest_configure(config):
    """The session stops at start where a stage would be imported from another checkout than this one: its tests
    would pass while never running this tree's code (install this checkout: `pip install -e .` in it)."""
    outside = stages_outside(ROOT)
    if outside:
        raise pytest.UsageError(f"integrate is not installed from this checkout ({ROOT}): {'; '.join(outside)}. "
                                "Run `pip install -e .` here, in an environment of its own")


def make_model_dir(base: Path, pipeline: str, transformer: str, library: str = "diffusers") -> Path:
    """A config-only model directory, as a user's download would have it (no weights)."""
    base.mkdir(parents=True, exist_ok=True)
    index = {"_class_name": pipeline, "_diffusers_version": "0.42.1", "transformer": [library, transformer]}
    (base / "model_index.json").write_text(json.dumps(index))
    return base


# commands that run a process pool of their own: forking a pytest worker (it has threads) is not safe
_POOLED = ("survey", "audit")


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None,
            process: bool = False) -> subprocess.CompletedProcess:
    """`integrate ARGS`: exit code, stdout and stderr. In this process through click's test runner (the same
    command group, its error handling and exit codes; the parse cache of this worker is reused), or as
    `python -m integrate.cli` where the process is part of what is tested: `process=True`, a working directory
    (`cwd`), or a command that starts a process pool."""
    overrides = {"INTEGRATE_CACHE_DIR": os.environ.get("INTEGRATE_CACHE_DIR", ""), **(env or {})}
    if process or cwd is not None or (args and args[0] in _POOLED):
        return subprocess.run(
            [sys.executable, "-m", "integrate.cli", *args],
            check=False, capture_output=True, text=True, cwd=cwd or ROOT, env={**os.environ, **overrides},
            timeout=300,
        )
    from click.testing import CliRunner

    from integrate.cli import main

    result = CliRunner().invoke(main, list(args), env=overrides, catch_exceptions=False)
    return subprocess.CompletedProcess(["integrate", *args], result.exit_code, result.stdout, result.stderr)


def plan_generate(model: Path, base: Path, *plan_flags: str) -> tuple[Path, Path]:
    """`plan --no-probe [plan_flags]`, `approve` and `generate` of a model folder into `base`: (plan dir, generated
    folder). generate may exit 1 (parts listed as manual): the plugin is written all the same."""
    plan_dir, out = base / "plan", base / "out"
    planned = run_cli("plan", str(model), "--out", str(plan_dir), "--no-probe", *plan_flags)
    assert planned.returncode == 0, planned.stderr
    assert run_cli("approve", str(plan_dir), "--reviewer", "Ada Lovelace").returncode == 0
    gen = run_cli("generate", str(plan_dir), "--out", str(out))
    assert gen.returncode in (0, 1), gen.stderr
    return plan_dir, out


def transformer_only(cls: str, base: Path) -> tuple[Path, Path]:
    """A config-only model folder naming a transformer class and nothing else (`transformer/config.json`), planned
    alone (`--no-pipeline --separate-cfg no`), approved and generated into `base`: (plan dir, generated folder)."""
    folder = base / "m"
    (folder / "transformer").mkdir(parents=True)
    (folder / "transformer" / "config.json").write_text(json.dumps({"_class_name": cls,
                                                                    "_diffusers_version": "0.42.1"}))
    return plan_generate(folder, base, "--no-pipeline", "--separate-cfg", "no")


def verify_json(plan_dir: Path, out: Path, *flags: str) -> tuple[int, dict]:
    """`integrate verify --json [flags]` of a generated plugin: (exit code, report); 0 or 1, never a crash."""
    proc = run_cli("verify", str(plan_dir), "--generated", str(out), "--json", *flags)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def computed_once(factory, name: str, make):
    """`make(folder)`, a JSON-able result, computed once per test session even across xdist workers: the
    first worker to ask runs it under a file lock in the session's shared temp folder, the others read what
    it wrote (an expensive module fixture is otherwise built again by every worker that runs one of its
    tests)."""
    base = factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    done = shared / f"{name}.json"
    with FileLock(str(shared / f"{name}.lock")):
        if done.is_file():
            return json.loads(done.read_text())
        folder = shared / name
        folder.mkdir(exist_ok=True)
        result = make(folder)
        done.write_text(json.dumps(result))
        return result


def completed(proc: subprocess.CompletedProcess) -> dict:
    """A finished CLI run as JSON, for `computed_once`."""
    return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


@pytest.fixture
def model_dir(tmp_path):
    def make(pipeline: str, transformer: str) -> Path:
        return make_model_dir(tmp_path / pipeline, pipeline, transformer)

    return make


def source_flags(folder: Path, text: str | None, cls: str = "Model", **flags):
    """Gate flags for a model source of a test written as `folder`/model.py (None: already there), with an empty
    model folder beside it: transformer-only with batched CFG unless `flags` name a pipeline."""
    from integrate import api

    if text is not None:
        (folder / "model.py").write_text(text)
    (folder / "m").mkdir(exist_ok=True)
    if "pipeline_class" not in flags:
        flags = {"no_pipeline": True, "separate_cfg": False, **flags}
    return api.flags_for(str(folder / "model.py"), model_path=str(folder / "m"), transformer_class=cls, **flags)


def analyse_source(folder: Path, text: str | None, cls: str = "Model", **flags) -> dict:
    """The analysis JSON of `source_flags`' model (no result cache)."""
    from integrate import api

    return api.analysis_json(source_flags(folder, text, cls, **flags), use_cache=False)


@pytest.fixture(scope="session")
def analysis():
    """Analysis JSON of an installed diffusers model, memoised for the session."""
    import tempfile

    from integrate import api

    memo: dict = {}
    tmp = Path(tempfile.mkdtemp())

    def get(pipeline: str, transformer: str) -> dict:
        if (pipeline, transformer) not in memo:
            d = make_model_dir(tmp / pipeline, pipeline, transformer)
            memo[(pipeline, transformer)] = api.analysis_json(api.flags_for(str(d)), use_cache=False)
        return memo[(pipeline, transformer)]

    return get


def block_list(data: dict, attr: str) -> dict:
    return next(b for b in data["transformer"]["block_lists"] if b["attr"] == attr)


def plan_md_for(data: dict, fallback: str) -> str:
    """PLAN.md rendered from plan.json's `data`, as `integrate revise` writes it (what approve compares with),
    or `fallback` where the values keep it from rendering (approve then refuses with exit 2)."""
    from integrate.render.markdown import plan_markdown

    try:
        return plan_markdown(data)
    except Exception:  # noqa: BLE001 - a value the template cannot show
        return fallback


@pytest.fixture(scope="session")
def survey(tmp_path_factory):
    """One cold survey (diffusers + tests/fixtures) and one warm rerun on the cache it filled."""
    def make(folder: Path) -> dict:
        cache = str(folder / "cache")
        env = {"INTEGRATE_CACHE_DIR": cache}
        t = time.perf_counter()
        cold = run_cli("survey", "--json", "--path", str(ROOT / "tests" / "fixtures"), env=env)
        cold_s = time.perf_counter() - t
        assert cold.returncode == 0, cold.stderr
        t = time.perf_counter()
        warm = run_cli("survey", "--json", "--path", str(ROOT / "tests" / "fixtures"), env=env)
        warm_s = time.perf_counter() - t
        assert warm.returncode == 0, warm.stderr
        return {"cold": completed(cold), "warm": completed(warm), "cold_s": cold_s, "warm_s": warm_s,
                "cache": cache}

    got = computed_once(tmp_path_factory, "survey", make)
    return {**got, "cold": SimpleNamespace(**got["cold"]), "warm": SimpleNamespace(**got["warm"]),
            "data": json.loads(got["cold"]["stdout"])}
