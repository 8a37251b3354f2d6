"""`integrate generate`: approved plan -> code that cache-dit's own registries resolve.

Plugins are imported in a subprocess (tests/_plugin_worker.py) that asks cache-dit's registries and
runs the generated planners on the model built on the meta device.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLE, ROOT, make_model_dir, run_cli
from planner_oracle import cache_dit_plans

WORKER = ROOT / "tests" / "_plugin_worker.py"


def _worker(job: dict) -> dict:
    proc = subprocess.run([sys.executable, str(WORKER)], input=json.dumps(job), capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _plan_approve_generate(model: Path, base: Path, *extra: str) -> tuple[Path, dict, subprocess.CompletedProcess]:
    plan_dir = base / "plan"
    proc = run_cli("plan", str(model), "--out", str(plan_dir), "--no-probe")
    assert proc.returncode == 0, proc.stderr
    assert run_cli("approve", str(plan_dir), "--reviewer", "Grace Hopper").returncode == 0
    gen = run_cli("generate", str(plan_dir), "--out", str(base / "out"), "--json", *extra)
    return plan_dir, json.loads((plan_dir / "plan.json").read_text()), gen


def _ruff(path: Path) -> subprocess.CompletedProcess:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    return subprocess.run([ruff, "check", "--isolated", str(path)], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def motif(tmp_path_factory):
    base = tmp_path_factory.mktemp("motif")
    plan_dir, plan, gen = _plan_approve_generate(EXAMPLE, base)
    assert gen.returncode == 0, gen.stderr
    return base / "out", plan, json.loads(gen.stdout)


def test_plugin_files_and_report(motif):
    out, plan, report = motif
    assert report["plugin"]["import_name"] == "integrate_motif_video"
    assert Path(report["plugin"]["path"]) == out.resolve()
    names = {Path(f).name for f in report["files"]}
    assert {"__init__.py", "adapter.py", "patch_functor.py", "cp_planner.py", "tp_planner.py", "example.py",
            "__main__.py", "test_matrix.sh", "te_text_encoder.py"} <= names
    assert report["manual"] == []
    assert report["registered"]["cp_planner"] == "MotifVideoTransformer3DModel"


def test_generated_code_passes_ruff_with_its_default_rules(motif):
    out, _, _ = motif
    proc = _ruff(out)
    assert proc.returncode == 0, proc.stdout


def test_motif_video_plugin_registers_and_resolves_through_cache_dit(motif):
    out, plan, report = motif
    cfg = json.loads((EXAMPLE / "transformer" / "config.json").read_text())
    got = _worker({"path": str(out), "import_name": "integrate_motif_video", "whole_package": True,
                   "transformer_class": "MotifVideoTransformer3DModel", "example": "motif_video",
                   "text_encoder": "T5Gemma2Encoder",
                   "config": {k: v for k, v in cfg.items() if not k.startswith("_")}})
    assert got["cp_planner"] == "MotifVideoContextParallelismPlanner"
    assert got["tp_planner"] == "MotifVideoTensorParallelismPlanner"
    assert got["te_planner"] == "T5Gemma2EncoderTensorParallelismPlanner"
    assert got["examples"] == ["motif_video"]
    # the PatchFunctor splits the decoder walk off `single_transformer_blocks` (40 = 36 + 4 decoder layers)
    assert got["adapter_blocks"] == [cfg["num_layers"], 36, 4]
    assert got["adapter_patterns"] == ["Pattern_0"] * 3 and got["has_separate_cfg"] is True
    assert got["cp"] == plan["parallelism"]["cp"]["plan"]
    assert "single_transformer_blocks_2.0" in got["cp_patched"]  # keys follow the blocks the functor moved
    for x in plan["parallelism"]["tp"]["block_lists"]:
        assert got["tp"][x["attr"]]["layer_plan"] == x["layer_plan"]
        assert got["tp"][x["attr"]]["shard_div_attr"] == x["shard_div_attr"]
    assert got["tp"]["single_transformer_blocks_2"]["count"] == 4  # the moved blocks are parallelised too


def test_patched_forward_is_the_models_own_with_only_the_walks_changed(motif):
    out, _, _ = motif
    text = (out / "integrate_motif_video" / "patch_functor.py").read_text()
    assert "for block in self.single_transformer_blocks:" in text
    assert "for block in self.single_transformer_blocks_2:" in text
    assert "single_transformer_blocks[" not in text.split("def patched_forward")[1]
    assert "self.norm_out(hidden_states, temb)" in text  # untouched model code


@pytest.mark.parametrize("pipeline,transformer", [
    ("NucleusMoEImagePipeline", "NucleusMoEImageTransformer2DModel"),
])
def test_other_unsupported_models_register_too(tmp_path, pipeline, transformer):
    model = make_model_dir(tmp_path / "m", pipeline, transformer)
    _, plan, gen = _plan_approve_generate(model, tmp_path)
    assert gen.returncode == 0, gen.stderr
    report = json.loads(gen.stdout)
    assert _ruff(tmp_path / "out").returncode == 0
    got = _worker({"path": str(tmp_path / "out"), "import_name": report["plugin"]["import_name"],
                   "whole_package": True, "transformer_class": transformer,
                   "example": plan["model"]["example_name"]})
    assert got["cp_planner"].endswith("ContextParallelismPlanner") and got["cp"] == plan["parallelism"]["cp"]["plan"]
    assert got["examples"] == [plan["model"]["example_name"]]


def test_a_model_the_templates_cannot_fully_handle_says_so_with_exit_1(tmp_path):
    """Latte walks two lists zipped together: no PatchFunctor is written; the reasons are listed as manual."""
    model = make_model_dir(tmp_path / "m", "LattePipeline", "LatteTransformer3DModel")
    _, _, gen = _plan_approve_generate(model, tmp_path)
    assert gen.returncode == 1
    report = json.loads(gen.stdout)
    assert any("walked together" in x for x in report["manual"])
    assert not (tmp_path / "out" / "integrate_latte" / "patch_functor.py").exists()


@pytest.mark.parametrize("pipeline,transformer", [
    ("FluxPipeline", "FluxTransformer2DModel"),
    ("WanPipeline", "WanTransformer3DModel"),
    ("HunyuanVideoPipeline", "HunyuanVideoTransformer3DModel"),
])
def test_supported_models_get_the_same_decisions_as_cache_dit(tmp_path, pipeline, transformer):
    """The generated planners, run on the meta-device model, plan what cache-dit's hand-written ones plan."""
    model = make_model_dir(tmp_path / "m", pipeline, transformer)
    _, plan, gen = _plan_approve_generate(model, tmp_path)
    report = json.loads(gen.stdout)
    got = _worker({"path": str(tmp_path / "out"), "import_name": report["plugin"]["import_name"],
                   "whole_package": False, "transformer_class": transformer})
    theirs = cache_dit_plans(transformer)
    ours = set(got["cp"])
    # Wan included: its processor runs cross-attention without CP, so the text stays whole, as in cache-dit's plan
    assert ours == set(theirs["cp"])
    for attr, expected in theirs["tp"].items():
        mine = got["tp"][attr]["layer_plan"]
        assert {k: v for k, v in mine.items() if k in expected["layer_plan"]} == expected["layer_plan"]
        assert got["tp"][attr]["shard_div_attr"] == expected["shard_div_attr"]


def test_generate_refuses_an_unapproved_or_edited_plan(tmp_path):
    plan_dir = tmp_path / "plan"
    assert run_cli("plan", str(EXAMPLE), "--out", str(plan_dir), "--no-probe").returncode == 0
    proc = run_cli("generate", str(plan_dir), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "not approved" in proc.stderr
    assert run_cli("approve", str(plan_dir), "--reviewer", "x").returncode == 0
    data = json.loads((plan_dir / "plan.json").read_text())
    data["cache"]["has_separate_cfg"] = False
    (plan_dir / "plan.json").write_text(json.dumps(data))
    proc = run_cli("generate", str(plan_dir), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "changed after it was approved" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_checkout_mode_writes_into_a_cache_dit_tree_idempotently(motif, tmp_path):
    import cache_dit

    tree = tmp_path / "src" / "cache_dit"
    shutil.copytree(Path(cache_dit.__file__).parent, tree, ignore=shutil.ignore_patterns("__pycache__"))
    for name in (".style.yapf", "setup.cfg"):  # cache-dit's own format and lint settings, at the repository root
        shutil.copy(ROOT / "tests" / "fixtures" / "cache_dit_style" / name, tmp_path / name)
    # a plain folder: no hub id is known, so the checkout records no local path as the example's default
    plain_dir = tmp_path / "plain-plan"
    assert run_cli("plan", str(EXAMPLE), "--out", str(plain_dir), "--no-probe").returncode == 0
    assert run_cli("approve", str(plain_dir), "--reviewer", "x").returncode == 0
    plain = run_cli("generate", str(plain_dir), "--mode", "checkout", "--cache-dit-src", str(tmp_path), "--dry-run",
                    "--json")
    assert plain.returncode == 0, plain.stderr
    diff = json.loads(plain.stdout)["checkout"]["diff"]
    assert str(EXAMPLE.resolve()) not in diff and "_env_path_mapping" not in diff
    assert 'os.environ["MOTIF_VIDEO_DIR"]' in diff
    assert any("no hub id is known" in n for n in json.loads(plain.stdout)["notes"])
    # the same model as a hub download: its id is the default, in the example and in cache-dit's mapping
    snapshot = tmp_path / "hub" / "models--Motif-Technologies--Motif-Video-2B" / "snapshots" / "0123abc"
    shutil.copytree(EXAMPLE, snapshot)
    plan_dir = tmp_path / "plan"
    assert run_cli("plan", str(snapshot), "--out", str(plan_dir), "--no-probe").returncode == 0
    assert run_cli("approve", str(plan_dir), "--reviewer", "x").returncode == 0
    before = {p: p.read_bytes() for p in tree.rglob("*.py")}
    dry = run_cli("generate", str(plan_dir), "--mode", "checkout", "--cache-dit-src", str(tmp_path), "--dry-run")
    assert dry.returncode == 0 and "+++ b/caching/block_adapters/adapter_motif_video.py" in dry.stdout
    assert {p: p.read_bytes() for p in tree.rglob("*.py")} == before
    out = tmp_path / "out"
    first = run_cli("generate", str(plan_dir), "--mode", "checkout", "--cache-dit-src", str(tmp_path), "--out",
                    str(out), "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["checkout"]["changed"]
    assert '"MOTIF_VIDEO_DIR": "Motif-Technologies/Motif-Video-2B"' in (tree / "_utils" / "examples.py").read_text()
    example = (tree / "_utils" / "example_motif_video.py").read_text()
    assert 'DEFAULT_PATH = "Motif-Technologies/Motif-Video-2B"' in example and str(tmp_path) not in example
    # written as cache-dit's own code is: its yapf style and flake8 settings hold, registered by decorators,
    # imports relative within the package, the transformer's class checked as its own adapters check it
    new = [tree / rel for rel in json.loads(first.stdout)["checkout"]["changed"] if "adapter_" in rel or
           "motif_video" in rel]
    assert len(new) >= 5, new
    lint = subprocess.run([sys.executable, "-m", "flake8", f"--config={tmp_path / 'setup.cfg'}", *map(str, new)],
                          capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = subprocess.run([sys.executable, "-m", "yapf", f"--style={tmp_path / '.style.yapf'}", "--diff",
                          *map(str, new)], capture_output=True, text=True, check=False)
    assert fmt.returncode == 0 and not fmt.stdout, fmt.stdout[-2000:]
    adapter = (tree / "caching" / "block_adapters" / "adapter_motif_video.py").read_text()
    assert '\n@BlockAdapterRegister.register("MotifVideo")\ndef motif_video_adapter(pipe' in adapter
    assert "\n  _relaxed_assert(transformer, MotifVideoTransformer3DModel)\n" in adapter
    assert "from .block_adapters import BlockAdapter\n" in adapter and "import cache_dit" not in adapter
    planner = (tree / "distributed" / "transformers" / "motif_video.py").read_text()
    assert '@ContextParallelismPlannerRegister.register("MotifVideoTransformer3DModel")\nclass' in planner
    assert "_registry" not in adapter + planner and "@ExampleRegister.register(" in example
    second = run_cli("generate", str(plan_dir), "--mode", "checkout", "--cache-dit-src", str(tmp_path), "--json")
    report = json.loads(second.stdout)["checkout"]
    assert report["changed"] == [] and report["diff"] == ""
    # the test it writes in cache-dit's layout passes against the tree; beside it, a torch RMSNorm over all heads
    # is distributed by the planner's own norm, the one the CPU proof ran (cache-dit's Wan one asserts an accelerator)
    written = {Path(f).relative_to(out).as_posix() for f in json.loads(first.stdout)["files"]}
    assert written == {"PR.md", "test_matrix.sh", "tests/api/test_motif_video_registrations.py"}
    registrations = (out / "tests/api/test_motif_video_registrations.py").read_text()
    assert "._adapters" not in registrations and "_registry" not in registrations  # public API only
    pr = (out / "PR.md").read_text()
    assert "## CPU proofs" in pr and "Not attached" in pr and "python -P -m cache_dit.generate motif_video" in pr
    (out / "tests" / "api" / "test_norm.py").write_text(
        "import types, torch\n"
        "def test_norm():\n"
        "    import cache_dit.distributed.transformers.motif_video_tp as tp\n"
        "    group = types.SimpleNamespace(size=lambda: 2, rank=lambda: 1)\n"
        "    mesh = types.SimpleNamespace(get_group=lambda: group, size=lambda: 2, get_local_rank=lambda: 1)\n"
        "    holder = torch.nn.Module(); holder.norm = torch.nn.RMSNorm(8)\n"
        "    tp._distribute_norm(holder, 'norm', mesh)\n"
        "    assert type(holder.norm).__module__ == 'cache_dit.distributed.transformers.motif_video_tp'\n"
        "    assert holder.norm.weight.numel() == 4\n")
    probe = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out / "tests")],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path / "src")},
                           check=False, timeout=300, cwd=tmp_path)
    assert probe.returncode == 0, probe.stdout[-3000:] + probe.stderr[-2000:]
    assert "6 passed" in probe.stdout, probe.stdout[-2000:]


def test_patch_functor_rewrites_pitfalls_a_and_c_and_keeps_the_numbers(tmp_path, monkeypatch):
    """Third-party fixture: keyword block call (A) and `x += ...` on a block input (C). The patched model gives
    the same output as the original, and no longer writes into the tensor a block received."""
    import importlib

    import torch

    bfl = ROOT / "tests" / "fixtures" / "bfl" / "model.py"
    plan_dir = tmp_path / "plan"
    proc = run_cli("plan", str(bfl), "--model-path", str(tmp_path), "--transformer-class", "Flux", "--pipeline-class",
                   "denoise", "--pipeline-file", str(bfl), "--out", str(plan_dir), "--no-probe")
    assert proc.returncode == 0, proc.stderr
    assert run_cli("approve", str(plan_dir), "--reviewer", "x").returncode == 0
    gen = run_cli("generate", str(plan_dir), "--out", str(tmp_path / "out"), "--json")
    text = (tmp_path / "out" / "integrate_denoise" / "patch_functor.py").read_text()
    assert "block(img, txt, vec=vec, pe=pe)" in text and "x = x + self.mlp(x)" in text
    assert _ruff(tmp_path / "out").returncode == 0
    assert not any("pitfall" in m for m in json.loads(gen.stdout)["manual"])

    monkeypatch.syspath_prepend(str(ROOT / "tests" / "fixtures"))
    monkeypatch.syspath_prepend(str(tmp_path / "out"))
    model_mod = importlib.import_module("bfl.model")
    functor_mod = importlib.import_module("integrate_denoise.patch_functor")
    torch.manual_seed(0)
    model = model_mod.Flux(2, 2)
    img, txt, vec, pe = torch.randn(1, 4, 8), torch.randn(1, 3, 8), torch.randn(1, 8), torch.randn(1, 7, 8)
    expected = model(img.clone(), txt.clone(), vec, pe)
    functor_mod.DenoisePatchFunctor()._apply(model)
    x = torch.randn(1, 7, 8)
    before = x.clone()
    model.single_blocks[0](x, vec=vec, pe=pe)
    assert torch.equal(x, before)  # out of place now
    assert torch.allclose(model(img.clone(), txt.clone(), vec, pe), expected)


@pytest.mark.parametrize("pipeline,transformer", [
    ("ChromaPipeline", "ChromaTransformer2DModel"),  # index-dependent loop body kept in the loop
    ("ErnieImagePipeline", "ErnieImageTransformer2DModel"),  # model code with unused unpacked names
    ("HiDreamImagePipeline", "HiDreamImageTransformer2DModel"),  # no ForwardPattern: no adapter written
    ("ZImagePipeline", "ZImageTransformer2DModel"),
    ("Flux2Pipeline", "Flux2Transformer2DModel"),
])
def test_generated_code_is_ruff_clean_across_models(tmp_path, pipeline, transformer):
    from integrate.decisions.records import Approval
    from integrate.templates import build
    from integrate.templates.generate import analysis_for_plan

    from integrate import api

    model = make_model_dir(tmp_path / "m", pipeline, transformer)
    plan = api.plan(api.flags_for(str(model)), probe=False)
    analysis, ws = analysis_for_plan(plan)
    src = ws.load(Path(plan.model.transformer_file))
    name = f"integrate_{plan.model.example_name}"
    gen = build(plan, Approval("t", "now", "0" * 64, "0" * 64, {}, "test"), analysis, ws, src,
                src.classes[plan.model.transformer_class],
                f"{name}.patch_functor", name)
    for rel, text in ({f"{name}/{p.module}.py": p.text for p in gen.pieces} | gen.extra).items():
        (tmp_path / "out" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "out" / rel).write_text(text)
    proc = _ruff(tmp_path / "out")
    assert proc.returncode == 0, proc.stdout
    if transformer == "HiDreamImageTransformer2DModel":
        assert not any(p.role == "adapter" for p in gen.pieces) and gen.manual


def test_the_example_calls_the_pipeline_as_its_signature_says(tmp_path):
    """WanAnimatePipeline requires `image`, `pose_video` and `face_video`: they become flags of the example (its
    launcher takes them off the command line before cache-dit's parser), `$<EXAMPLE>_<NAME>` in the GPU
    matrix, and an example run without them stops with one line naming the flag. Sizes and steps stay at the
    pipeline's defaults (Ideogram4's 48-entry guidance schedule must match its default 48 steps)."""
    model = make_model_dir(tmp_path / "m", "WanAnimatePipeline", "WanAnimateTransformer3DModel")
    _, plan, gen = _plan_approve_generate(model, tmp_path)
    assert gen.returncode in (0, 1), gen.stderr
    ex = plan["example"]
    assert [(i["name"], i["kind"], i["flag"]) for i in ex["inputs"]] == [
        ("image", "image", "--image"), ("pose_video", "video", "--pose-video"), ("face_video", "video", "--face-video")]
    assert all(i["evidence"]["file"].endswith("pipeline_wan_animate.py") for i in ex["inputs"])
    out = tmp_path / "out"
    assert _ruff(out).returncode == 0, _ruff(out).stdout
    matrix = (out / "test_matrix.sh").read_text()
    assert '--pose-video "$WAN_ANIMATE_POSE_VIDEO"' in matrix and ": \"${WAN_ANIMATE_FACE_VIDEO:?" in matrix
    assert subprocess.run(["bash", "-n", str(out / "test_matrix.sh")], check=False).returncode == 0
    code = ("import sys; from integrate_wan_animate import example as e; "
            "print(e.take_inputs(['wan_animate', '--image', 'a.png', '--cache'])); e._inputs()")
    proc = subprocess.run([sys.executable, "-c", code], cwd=out, capture_output=True, text=True, check=False)
    assert "['wan_animate', '--cache']" in proc.stdout
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
        "wan_animate needs --pose-video PATH, --face-video PATH: WanAnimatePipeline.__call__ requires "
        "`pose_video` (video), `face_video` (video)")
    text = (out / "integrate_wan_animate" / "example.py").read_text()
    assert "num_inference_steps=" not in text and "height=" not in text

    ideogram = make_model_dir(tmp_path / "i" / "m", "Ideogram4Pipeline", "Ideogram4Transformer2DModel")
    _, plan, _ = _plan_approve_generate(ideogram, tmp_path / "i")
    assert plan["example"]["inputs"] == [] and plan["example"]["defaults"]["num_inference_steps"] == "48"
    assert "num_inference_steps=" not in (tmp_path / "i" / "out" / "integrate_ideogram4" / "example.py").read_text()


def test_an_adapter_is_found_by_the_transformer_alone_where_the_pipeline_prefix_does_not_cover_it(tmp_path):
    """Kandinsky6TI2VAPipeline / Kandinsky6Transformer3DModel: registered under the pipeline's prefix only, a
    transformer looked up alone (enable_cache(transformer), verify's proofs) found no adapter."""
    model = make_model_dir(tmp_path / "m", "Kandinsky6TI2VAPipeline", "Kandinsky6Transformer3DModel")
    _, _, gen = _plan_approve_generate(model, tmp_path)
    assert json.loads(gen.stdout)["registered"]["adapter"] == "Kandinsky6TI2VA, Kandinsky6Transformer3DModel"
    code = ("import integrate_kandinsky6_ti2_va\n"
            "from cache_dit.caching.block_adapters.block_registers import BlockAdapterRegister as R\n"
            "names = R.supported_pipelines()[1]\n"  # cache-dit's lookup: the first name a class starts with
            "first = [next(n for n in names if c.startswith(n)) for c in "
            "('Kandinsky6TI2VAPipeline', 'Kandinsky6Transformer3DModel')]\n"
            "print(sorted(first), R._adapters['Kandinsky6TI2VA'] is R._adapters["
            "'Kandinsky6Transformer3DModel'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path / "out",
                          timeout=300, check=False)
    assert proc.stdout.split("\n")[0] == "['Kandinsky6TI2VA', 'Kandinsky6Transformer3DModel'] True", proc.stderr[-2000:]


def test_a_change_no_rewrite_answers_becomes_a_stub_with_its_contract_and_a_filled_one_is_kept(tmp_path):
    """BriaFibo picks each block's text-encoder layer by the block's index and joins it into the text before the
    call, a chain of index-dependent statements (pitfall B) no rewrite answers: generate writes
    `manual_patch.py`, the one file meant for hand edits, with the finding's line and statement and the
    forward's signature; the adapter calls it. A filled-in version (no NEEDS_CODE) survives the next generate;
    the stub itself is written again."""
    model = make_model_dir(tmp_path / "m", "BriaFiboPipeline", "BriaFiboTransformer2DModel")
    plan_dir, _, gen = _plan_approve_generate(model, tmp_path)
    report = json.loads(gen.stdout)
    assert gen.returncode == 1 and any("pitfall B" in m for m in report["manual"])  # still listed as manual
    plugin = tmp_path / "out" / "integrate_bria_fibo"
    stub = (plugin / "manual_patch.py").read_text()
    assert "NEEDS_CODE = True" in stub and "def apply_manual(transformer):" in stub
    assert "`current_text_encoder_layer = text_encoder_layers[block_id]`" in stub  # a statement to move
    assert "BriaFiboTransformer2DModel.forward(self, hidden_states: torch.Tensor," in stub
    assert "from integrate_bria_fibo.manual_patch import apply_manual" in (plugin / "adapter.py").read_text()
    assert _ruff(plugin).returncode == 0
    from integrate.templates import is_stub

    assert is_stub(stub) and not is_stub(stub.replace("NEEDS_CODE = True\n", ""))
    mine = stub.replace("NEEDS_CODE = True\n", "").replace("    raise NotImplementedError(", "    return transformer\n    (")
    (plugin / "manual_patch.py").write_text(mine)
    again = run_cli("generate", str(plan_dir), "--out", str(tmp_path / "out"), "--json")
    assert (plugin / "manual_patch.py").read_text() == mine
    assert any("kept as you wrote it" in n for n in json.loads(again.stdout)["notes"])
    (plugin / "manual_patch.py").write_text(stub.replace("Contract", "Contract (read)"))  # still a stub
    run_cli("generate", str(plan_dir), "--out", str(tmp_path / "out"))
    assert (plugin / "manual_patch.py").read_text() == stub


def test_the_gpu_matrix_lists_the_same_rows_in_the_script_pr_and_verify_and_none_for_a_missing_planner(tmp_path):
    """test_matrix.sh, `verify --gpu --print` (and PR.md, which embeds the script) take their rows from one list
    (decisions/matrix.py); a plan with no CP planner and none of cache-dit's has no CP row."""
    import dataclasses
    import shlex

    from integrate.decisions.matrix import rows

    model = make_model_dir(tmp_path / "m", "SanaVideoPipeline", "SanaVideoTransformer3DModel")
    plan_dir, _, gen = _plan_approve_generate(model, tmp_path)
    assert gen.returncode == 0, gen.stderr
    script = [shlex.split(line) for line in (tmp_path / "out" / "test_matrix.sh").read_text().splitlines()
              if line.startswith("run ")]
    printed = run_cli("verify", str(plan_dir), "--generated", str(tmp_path / "out"), "--gpu", "--print")
    commands = [shlex.split(line) for line in printed.stdout.splitlines() if line.startswith(("python ", "torchrun "))]

    def row(words):  # (processes, the flags before the output file, the output file's name)
        n = int(words[1]) if words[0] == "run" else (1 if words[0] == "python" else int(words[1].split("=")[1]))
        flags = words[2:] if words[0] == "run" else words[words.index("sana_video") + 1:]
        cut = flags.index("--save-path")
        return n, flags[:cut], Path(flags[cut + 1]).name

    assert [row(w) for w in script] == [row(w) for w in commands] and len(script) >= 6
    from integrate.decisions.records import Plan
    from integrate.records import from_json

    plan = from_json(Plan, json.loads((plan_dir / "plan.json").read_text()))
    names = [r.name for r in rows(plan)]
    assert "ulysses2" in names and "tp2" in names
    bare = dataclasses.replace(plan, parallelism=dataclasses.replace(
        plan.parallelism, cp=dataclasses.replace(plan.parallelism.cp, plan={}),
        tp=dataclasses.replace(plan.parallelism.tp, block_lists=())))
    assert [r.name for r in rows(bare)] == ["baseline", "cache"]  # no planner written, none of cache-dit's
    # a CP plan that a person must act on first (`blocked_by`): generate writes no CP planner, so no CP row either
    from integrate.records import Evidence

    blocked = dataclasses.replace(plan, parallelism=dataclasses.replace(plan.parallelism, cp=dataclasses.replace(
        plan.parallelism.cp, blocked_by=(Evidence("x.py", 1, "calls the kernel directly"),))))
    assert not {"ulysses2", "ulysses2+cache", "ring2", "ulysses2+tp2"} & {r.name for r in rows(blocked)}
