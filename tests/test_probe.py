"""integrate.probe: build transformers on the meta device in a worker and report their real structure."""

import json
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from integrate.decisions import probe
from integrate.decisions.probe import probe_transformer

ROOT = Path(__file__).resolve().parent.parent
MOTIF_CONFIG = ROOT / "examples" / "motif-video" / "transformer" / "config.json"

needs_diffusers = pytest.mark.skipif(
    find_spec("torch") is None or find_spec("diffusers") is None, reason="needs torch and diffusers"
)
needs_torch = pytest.mark.skipif(find_spec("torch") is None, reason="needs torch")

FLUX_SMALL = {
    "_class_name": "FluxTransformer2DModel",
    "_diffusers_version": "0.42.1",
    "num_layers": 2,
    "num_single_layers": 3,
    "attention_head_dim": 16,
    "num_attention_heads": 4,
    "joint_attention_dim": 32,
    "pooled_projection_dim": 32,
    "in_channels": 16,
    "axes_dims_rope": [4, 6, 6],
}


def write_config(path: Path, config: dict) -> Path:
    path.write_text(json.dumps(config))
    return path


def assert_one_line_error(result: dict, *extra: str) -> str:
    assert result["ok"] is False
    assert set(result) == {"ok", "error", *extra}
    error = result["error"]
    assert isinstance(error, str) and error
    assert "\n" not in error
    assert "Traceback" not in error
    return error


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("flux") / "config.json", FLUX_SMALL)
    return probe_transformer(
        "diffusers", "FluxTransformer2DModel", config, ["transformer_blocks", "single_transformer_blocks"]
    )


def test_probe_module_does_not_import_torch():
    code = "import sys, integrate.decisions.probe; assert 'torch' not in sys.modules and 'diffusers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


@needs_diffusers
def test_flux_lists(flux):
    assert flux["ok"] is True, flux
    assert flux["class"] == "FluxTransformer2DModel"
    assert flux["lists"]["transformer_blocks"] == {"length": 2, "block_classes": ["FluxTransformerBlock"]}
    assert flux["lists"]["single_transformer_blocks"] == {
        "length": 3,
        "block_classes": ["FluxSingleTransformerBlock"],
    }
    assert flux["missing_lists"] == []


@needs_diffusers
def test_flux_block_modules(flux):
    dual = flux["blocks"]["transformer_blocks"]
    assert dual[""] == {"class": "FluxTransformerBlock", "linear": None}
    assert dual["attn.to_q"] == {"class": "Linear", "linear": [64, 64]}
    assert dual["attn.to_out.0"]["linear"] == [64, 64]
    assert dual["ff.net.0.proj"]["linear"] == [64, 256]
    assert dual["attn"]["linear"] is None
    single = flux["blocks"]["single_transformer_blocks"]
    assert single["proj_out"]["linear"] == [64 + 256, 64]


@needs_diffusers
def test_flux_int_attrs(flux):
    attn = flux["int_attrs"]["transformer_blocks"]["attn"]
    assert attn["heads"] == 4
    assert attn["inner_dim"] == 64
    assert flux["int_attrs"]["transformer_blocks"]["attn.to_q"] == {"in_features": 64, "out_features": 64}
    for attrs in flux["int_attrs"]["transformer_blocks"].values():
        assert attrs, "only submodules with integer attributes are listed"
        assert all(type(v) is int and not k.startswith("_") and k != "training" for k, v in attrs.items())
    assert flux["int_attrs"]["single_transformer_blocks"]["attn"]["heads"] == 4


@needs_diffusers
def test_flux_cp_plan_and_config(flux):
    # diffusers 0.42.1 defines FluxTransformer2DModel._cp_plan (transformer_flux.py).
    plan = flux["cp_plan"]
    assert plan[""]["hidden_states"] == {"split_dim": 1, "expected_dims": 3, "split_output": False}
    assert plan[""]["img_ids"]["split_dim"] == 0
    assert plan["proj_out"] == {"gather_dim": 1, "expected_dims": 3}
    assert flux["config"]["num_layers"] == 2
    assert flux["config"]["num_attention_heads"] == 4
    assert flux["config"]["guidance_embeds"] is False  # a default filled in by the class
    assert "axes_dims_rope" not in flux["config"]  # lists are not scalar config values
    assert not any(k.startswith("_") for k in flux["config"])
    assert flux["unused_config_keys"] == []
    json.dumps(flux)


@needs_diffusers
def test_motif_video_real_config():
    config = json.loads(MOTIF_CONFIG.read_text())
    result = probe_transformer(
        "diffusers.models.transformers.transformer_motif_video",
        "MotifVideoTransformer3DModel",
        MOTIF_CONFIG,
        ["transformer_blocks", "single_transformer_blocks"],
    )
    assert result["ok"] is True, result
    assert result["lists"]["transformer_blocks"]["length"] == config["num_layers"]
    assert result["lists"]["single_transformer_blocks"]["length"] == config["num_single_layers"]
    assert result["lists"]["transformer_blocks"]["block_classes"] == ["MotifVideoTransformerBlock"]
    assert result["lists"]["single_transformer_blocks"]["block_classes"] == ["MotifVideoSingleTransformerBlock"]
    attn = result["int_attrs"]["transformer_blocks"]["attn"]
    assert attn["heads"] == config["num_attention_heads"]
    assert attn["inner_dim"] == config["num_attention_heads"] * config["attention_head_dim"]
    assert result["cp_plan"] is None  # no _cp_plan on this class in diffusers 0.42.1
    assert result["config"]["num_decoder_layers"] == config["num_decoder_layers"]


@needs_diffusers
def test_no_list_attrs_finds_top_level_module_lists(tmp_path):
    config = write_config(tmp_path / "config.json", FLUX_SMALL)
    result = probe_transformer("diffusers", "FluxTransformer2DModel", config, [])
    assert result["ok"] is True, result
    assert {"transformer_blocks", "single_transformer_blocks"} <= set(result["lists"])


@needs_diffusers
def test_unused_config_keys_are_reported(tmp_path):
    config = write_config(tmp_path / "config.json", {**FLUX_SMALL, "num_layer": 7})
    result = probe_transformer("diffusers", "FluxTransformer2DModel", config, ["transformer_blocks"])
    assert result["ok"] is True, result
    assert result["unused_config_keys"] == ["num_layer"]
    assert result["lists"]["transformer_blocks"]["length"] == 2


@needs_diffusers
def test_unknown_class(tmp_path):
    config = write_config(tmp_path / "config.json", FLUX_SMALL)
    error = assert_one_line_error(probe_transformer("diffusers", "NoSuchTransformer3DModel", config, []))
    assert "NoSuchTransformer3DModel" in error


@needs_diffusers
def test_bad_config_value_type(tmp_path):
    config = write_config(tmp_path / "config.json", {**FLUX_SMALL, "num_layers": "two"})
    error = assert_one_line_error(probe_transformer("diffusers", "FluxTransformer2DModel", config, []))
    assert error.startswith("building FluxTransformer2DModel on meta failed: TypeError")


@needs_torch
def test_missing_module():
    result = probe_transformer("no_such_models_pkg.transformer", "X", None, [])
    error = assert_one_line_error(result, "missing")
    assert "no_such_models_pkg" in error
    assert result["missing"] == {"module": "no_such_models_pkg.transformer", "package": "no_such_models_pkg",
                                 "chain": []}


def _accelerated_package(root: Path) -> Path:
    """A model package whose module imports a helper that imports an accelerator package nobody installed."""
    pkg = root / "dit_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text("import torch\nfrom torch import nn\n\nfrom .attention import attend\n\n\n"
                                  "class Model(nn.Module):\n    pass\n")
    (pkg / "attention.py").write_text("import math\n\nimport fused_attn_kernels_xyz  # the accelerator\n\n\n"
                                      "def attend(q, k, v):\n    return q\n")
    return pkg


@needs_torch
def test_a_missing_accelerator_is_named_with_the_imports_that_lead_to_it(tmp_path):
    """The package Python did not find, not the model's own: and the chain model.py:4 -> attention.py:3, each hop
    with its file, line, module and code (what `plan` and `verify` turn into their one line)."""
    _accelerated_package(tmp_path)
    result = probe_transformer("dit_pkg.model", "Model", None, [], paths=(str(tmp_path),))
    assert_one_line_error(result, "missing")
    missing = result["missing"]
    assert missing["module"] == "dit_pkg.model" and missing["package"] == "fused_attn_kernels_xyz", missing
    hops = [(Path(h["file"]).name, h["line"], h["module"]) for h in missing["chain"]]
    assert hops == [("model.py", 4, "dit_pkg.model"), ("attention.py", 3, "dit_pkg.attention")], hops
    assert missing["chain"][-1]["code"] == "import fused_attn_kernels_xyz  # the accelerator"


@needs_torch
def test_missing_and_invalid_config(tmp_path):
    error = assert_one_line_error(probe_transformer("torch.nn", "Identity", tmp_path / "absent.json", []))
    assert "absent.json" in error
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    assert_one_line_error(probe_transformer("torch.nn", "Identity", bad, []))


@needs_torch
def test_not_a_module_class():
    error = assert_one_line_error(probe_transformer("json", "JSONDecoder", None, []))
    assert "not a torch.nn.Module" in error


MODEL_FILE = """
import torch
from torch import nn

print("noise on stdout at import time")

try:
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput
except ImportError:  # plain stand-ins with the same fields
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class ContextParallelInput:
        split_dim: int
        expected_dims: int = None
        split_output: bool = False

    @dataclass(frozen=True)
    class ContextParallelOutput:
        gather_dim: int
        expected_dims: int = None


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.flag = True
        self._private = 3
        self.qkv = nn.Linear(dim, 3 * dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))


class OtherBlock(Block):
    pass


class TinyModel(nn.Module):
    _cp_plan = {
        "": {"hidden_states": ContextParallelInput(split_dim=1, expected_dims=3)},
        "rope": {
            0: ContextParallelInput(split_dim=0, expected_dims=2, split_output=True),
            1: [ContextParallelInput(split_dim=0, expected_dims=2, split_output=True)],
        },
        "proj_out": [ContextParallelOutput(gather_dim=1, expected_dims=3), ContextParallelOutput(gather_dim=2)],
    }

    def __init__(self, dim=8, heads=2, depth=3):
        super().__init__()
        print("noise on stdout while building")
        self.blocks = nn.ModuleList([Block(dim, heads)] + [OtherBlock(dim, heads) for _ in range(depth - 1)])
        self.empty = nn.ModuleList()
        self.proj_out = nn.Linear(dim, dim)
        assert self.proj_out.weight.device.type == "meta"
"""


@needs_torch
def test_loose_model_file_plain_module(tmp_path):
    model_file = tmp_path / "tiny_model.py"
    model_file.write_text(MODEL_FILE)
    config = write_config(tmp_path / "config.json", {"_class_name": "TinyModel", "dim": 16, "depth": 4})
    result = probe_transformer(
        "tiny_model", "TinyModel", config, ["blocks", "empty", "proj_out", "absent"], file=model_file
    )
    assert result["ok"] is True, result
    assert result["lists"]["blocks"] == {"length": 4, "block_classes": ["Block", "OtherBlock"]}
    assert result["lists"]["empty"] == {"length": 0, "block_classes": []}
    assert result["missing_lists"] == ["proj_out", "absent"]
    block = result["blocks"]["blocks"]
    assert block["qkv"] == {"class": "Linear", "linear": [16, 48]}
    assert block["mlp.0"]["linear"] == [16, 64]
    assert block["mlp.1"] == {"class": "GELU", "linear": None}
    assert result["int_attrs"]["blocks"][""] == {"heads": 2}  # no bools, no _private, no training
    assert "mlp.1" not in result["int_attrs"]["blocks"]
    assert result["config"] == {"dim": 16, "depth": 4}
    assert result["cp_plan"] == {
        "": {"hidden_states": {"split_dim": 1, "expected_dims": 3, "split_output": False}},
        "rope": {
            "0": {"split_dim": 0, "expected_dims": 2, "split_output": True},
            "1": [{"split_dim": 0, "expected_dims": 2, "split_output": True}],
        },
        "proj_out": [{"gather_dim": 1, "expected_dims": 3}, {"gather_dim": 2, "expected_dims": None}],
    }


@needs_torch
def test_loose_model_file_defaults_and_errors(tmp_path):
    model_file = tmp_path / "tiny_model.py"
    model_file.write_text(MODEL_FILE)
    result = probe_transformer("tiny_model", "TinyModel", None, ["blocks"], file=model_file)
    assert result["ok"] is True, result
    assert result["lists"]["blocks"]["length"] == 3
    assert result["cp_plan"] is not None

    broken = tmp_path / "broken_model.py"
    broken.write_text("import torch\nraise RuntimeError('model file\\nis broken')\n")
    error = assert_one_line_error(probe_transformer("broken_model", "X", None, [], file=broken))
    assert "RuntimeError: model file is broken" in error

    error = assert_one_line_error(probe_transformer("tiny_model", "Nope", None, [], file=model_file))
    assert "Nope" in error

    # A module name that is importable ("json") does not get shadowed by the loose file.
    result = probe_transformer("json", "TinyModel", None, ["blocks"], file=model_file)
    assert result["ok"] is True, result
    assert result["module"].startswith("_integrate_probe_")


def test_torch_missing(tmp_path, monkeypatch):
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('simulated: no torch here')\n")
    assert "torch" not in assert_one_line_error(probe_transformer("diffusers", "NoSuchClass", None, []))
    error = assert_one_line_error(probe_transformer("diffusers", "FluxTransformer2DModel", None, [],
                                                    paths=(str(fake.parent),)))
    assert error == "torch not installed"


def test_worker_without_json(tmp_path, monkeypatch):
    (tmp_path / "chatty_worker.py").write_text("import sys\nprint('not json')\nsys.exit(3)\n")
    monkeypatch.setattr(probe, "WORKER", "chatty_worker")
    error = assert_one_line_error(probe_transformer("diffusers", "FluxTransformer2DModel", None, [],
                                                    paths=(str(tmp_path),)))
    assert "no JSON" in error and "exit code 3" in error


def test_timeout():
    error = assert_one_line_error(probe_transformer("diffusers", "FluxTransformer2DModel", None, [], timeout=0.001))
    assert "timed out" in error
