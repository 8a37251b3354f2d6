"""A reference repository whose transformer takes its config as one dataclass and whose sizes live in its own code
(tests/fixtures/specs, shaped after black-forest-labs/flux): from an empty model folder to a passing cache proof,
with no edit of the model's source."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

SPECS = ROOT / "tests" / "fixtures" / "specs"
FLUX = "diffusers/models/transformers/transformer_flux.py"


@pytest.fixture
def repo(tmp_path):
    """The fixture package copied out as a repository (`repo/specs/...`), with an empty model folder beside it."""
    shutil.copytree(SPECS, tmp_path / "repo" / "specs", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "model").mkdir()
    return tmp_path


def _flags(base: Path):
    from integrate import api

    src = base / "repo" / "specs"
    return api.flags_for(str(src / "model.py"), model_path=str(base / "model"), transformer_class="Net",
                         pipeline_class="denoise", pipeline_file=str(src / "sampling.py"))


def _transformer(base: Path):
    from integrate.resolve import Workspace

    ws = Workspace()
    src = ws.load(base / "repo" / "specs" / "model.py")
    return ws, src, src.classes["Net"]


def test_the_repository_literal_is_the_config(repo):
    from integrate.analyzers.config_object import config_literal

    ws, src, cls = _transformer(repo)
    found = config_literal(ws, src, cls, repo / "repo")
    assert (found.param, found.dataclass) == ("params", "NetParams")
    # the first complete literal in path order: util.py's base spec (load()'s `NetParams(**...)` is not one)
    assert found.values == {"in_channels": 16, "hidden_size": 256, "num_heads": 8, "depth": 6, "context_in_dim": 64,
                            "axes_dim": [8, 12, 12], "guidance_embed": True}
    assert Path(found.evidence.file).name == "util.py" and found.found == 2
    line = (repo / "repo" / "specs" / "util.py").read_text().splitlines()[found.evidence.line - 1]
    assert "NetParams(in_channels=16" in line


def test_no_config_dataclass_no_literal(repo):
    """A constructor of plain keywords (the BFL-style fixture's Flux) takes no config object."""
    from integrate.analyzers.config_object import config_dataclass
    from integrate.resolve import Workspace

    ws = Workspace()
    src = ws.load(ROOT / "tests" / "fixtures" / "bfl" / "model.py")
    assert config_dataclass(ws, src, src.classes["Flux"]) is None


def test_ids_joined_along_a_dim_give_their_rank(repo):
    import diffusers
    from integrate.analyzers.structure import joined_id_ndims
    from integrate.resolve import Workspace

    _, src, cls = _transformer(repo)
    got = joined_id_ndims(src, cls)
    assert {k: v[0] for k, v in got.items()} == {"txt_ids": 3, "img_ids": 3}
    assert "along dim 1" in got["img_ids"][1].why
    flux = Workspace().load(Path(diffusers.__file__).parent / FLUX.partition("/")[2])  # dim=0: one row per token
    assert {k: v[0] for k, v in joined_id_ndims(flux, flux.classes["FluxTransformer2DModel"]).items()} == {
        "txt_ids": 2, "img_ids": 2}


def test_a_sampler_calls_the_model_by_its_own_name(repo):
    from integrate.analyzers.structure import pipeline_call_keywords
    from integrate.gate import run_gate
    from integrate.resolve import Workspace

    ws = Workspace()
    keys = pipeline_call_keywords(ws, run_gate(_flags(repo), ws))
    assert keys == ["img", "img_ids", "txt", "txt_ids", "timesteps", "guidance"]


def test_empty_model_folder_to_a_passing_cache_proof(repo):
    """gate -> plan -> approve -> generate -> verify --proof cache, as a user runs them; the model's source is
    never edited (its bytes are the same after)."""
    src = repo / "repo" / "specs"
    before = {p.name: p.read_bytes() for p in src.glob("*.py")}
    gate = ["--model-path", str(repo / "model"), "--transformer-class", "Net", "--pipeline-class", "denoise",
            "--pipeline-file", str(src / "sampling.py")]
    plan, gen = repo / "plan", repo / "gen"
    out = run_cli("plan", str(src / "model.py"), *gate, "--out", str(plan))
    assert out.returncode == 0, out.stderr
    assert run_cli("approve", str(plan), "--reviewer", "test").returncode == 0
    out = run_cli("generate", str(plan), "--out", str(gen))
    # exit 1: the CP planner's last-block key needs the depth, which only the config object knows (said, manual)
    assert out.returncode == 1 and "MANUAL: a CP hook key" in out.stdout, out.stdout + out.stderr
    assert list(gen.glob("*/adapter.py")), "the cache integration is written"
    # printing the GPU matrix runs nothing of the model's: no --trust-code asked; running it (no GPU here) does ask
    printed = run_cli("verify", str(plan), "--generated", str(gen), "--gpu", "--print")
    assert printed.returncode == 0 and "--cache" in printed.stdout, printed.stdout + printed.stderr
    assert run_cli("verify", str(plan), "--generated", str(gen), "--gpu").returncode == 2
    out = run_cli("verify", str(plan), "--generated", str(gen), "--proof", "cache", "--trust-code", "--json",
                  process=True)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["fixture"]["status"] == "derived"
    cache = report["cache"]
    assert cache["status"] == "pass" and cache["caching_on"]["cached_steps"], cache
    fixture = (gen / "verify_fixture.py").read_text()
    assert "util.py:" in fixture.split("\n", 4)[2]  # derived from the repository's own spec, said so
    assert '"guidance": torch.full' in fixture and "_grid_ids((1, 4, 4), 3, batch=1)" in fixture
    assert before == {p.name: p.read_bytes() for p in src.glob("*.py")}
