"""Checkout mode: generated modules and registry lines written into a copy of the installed cache-dit 1.5.3."""

import base64
import difflib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import libcst as cst
import pytest
from integrate.templates import checkout
from integrate.templates.checkout import (
    GENERATED_MARKER,
    Artifact,
    Registration,
    apply_checkout,
    find_package,
    plan_checkout,
)

from integrate.errors import InputError

INSTALLED = Path(importlib.util.find_spec("cache_dit").origin).parent  # located without importing torch
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")

ADAPTER = '''\
from ..forward_pattern import ForwardPattern
from .block_adapters import BlockAdapter
from .block_registers import BlockAdapterRegister


@BlockAdapterRegister.register("TinyTest")
def tiny_test_adapter(pipe, **kwargs) -> BlockAdapter:
  return BlockAdapter(
    pipe=pipe,
    transformer=pipe.transformer,
    blocks=pipe.transformer.transformer_blocks,
    forward_pattern=ForwardPattern.Pattern_0,
    **kwargs,
  )
'''

PLANNERS = '''\
from typing import Optional

import torch

from ..config import ParallelismConfig
from .register import (
  ContextParallelismPlanner,
  ContextParallelismPlannerRegister,
  TensorParallelismPlanner,
  TensorParallelismPlannerRegister,
)


@ContextParallelismPlannerRegister.register("TinyTestTransformer")
class TinyTestContextParallelismPlanner(ContextParallelismPlanner):

  def _apply(
    self,
    transformer: Optional[torch.nn.Module] = None,
    parallelism_config: Optional[ParallelismConfig] = None,
    **kwargs,
  ):
    return {}


@TensorParallelismPlannerRegister.register("TinyTestTransformer")
class TinyTestTensorParallelismPlanner(TensorParallelismPlanner):

  def _apply(self, transformer, parallelism_config, **kwargs):
    return transformer, []


# A second name for the column-limit test.
TinyTestWithAVeryLongNameForTheColumnLimitContextParallelismPlanner = TinyTestContextParallelismPlanner
'''

TEXT_ENCODER = '''\
from .register import TextEncoderTensorParallelismPlanner, TextEncoderTensorParallelismPlannerRegister


@TextEncoderTensorParallelismPlannerRegister.register("TinyTestEncoder")
class TinyTestEncoderTensorParallelismPlanner(TextEncoderTensorParallelismPlanner):

  def _apply(self, text_encoder, parallelism_config, **kwargs):
    return text_encoder, []
'''

AUTOENCODER = '''\
from .register import AutoEncoderDataParallelismPlanner, AutoEncoderDataParallelismPlannerRegister


@AutoEncoderDataParallelismPlannerRegister.register("AutoencoderKLTinyTest")
class AutoencoderKLTinyTestDataParallelismPlanner(AutoEncoderDataParallelismPlanner):

  def _apply(self, auto_encoder, parallelism_config, **kwargs):
    return auto_encoder
'''

EXAMPLE = '''\
import argparse

from .examples import _path
from .registers import Example, ExampleInitConfig, ExampleInputData, ExampleRegister, ExampleType


@ExampleRegister.register("tiny_test", default="tiny-org/TinyTest")
def tiny_test_example(args: argparse.Namespace, **kwargs) -> Example:
  return Example(
    args=args,
    init_config=ExampleInitConfig(
      task_type=ExampleType.T2I,
      model_name_or_path=_path("tiny-org/TinyTest", args=args),
    ),
    input_data=ExampleInputData(prompt="a tiny test"),
  )
'''

ARTIFACTS = [
    Artifact("caching/block_adapters/adapter_tiny_test.py", ADAPTER),
    Artifact("distributed/transformers/tiny_test.py", PLANNERS),
    Artifact("distributed/text_encoders/tiny_test_encoder.py", TEXT_ENCODER),
    Artifact("distributed/autoencoders/autoencoder_kl_tiny_test.py", AUTOENCODER),
    Artifact("_utils/example_tiny_test.py", EXAMPLE),
]
REGISTRATIONS = [
    Registration("adapter", ".adapter_tiny_test", "tiny_test_adapter"),
    Registration("cp_planner", ".tiny_test", "TinyTestContextParallelismPlanner"),
    Registration("tp_planner", ".tiny_test", "TinyTestTensorParallelismPlanner"),
    Registration("te_planner", ".tiny_test_encoder", "TinyTestEncoderTensorParallelismPlanner"),
    Registration("vae_planner", ".autoencoder_kl_tiny_test", "AutoencoderKLTinyTestDataParallelismPlanner"),
    Registration("example", ".example_tiny_test", "tiny_test_example"),
    Registration("env_path", "", "TINY_TEST_DIR", "tiny-org/TinyTest"),
]
REGISTRY_FILES = [
    "caching/block_adapters/__init__.py",
    "distributed/transformers/planners.py",
    "distributed/text_encoders/planners.py",
    "distributed/autoencoders/planners.py",
    "_utils/__init__.py",
    "_utils/examples.py",
]
ALL_FILES = [a.relpath for a in ARTIFACTS] + REGISTRY_FILES


def copy_package(dst: Path) -> Path:
    shutil.copytree(INSTALLED, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


@pytest.fixture
def pkg(tmp_path) -> Path:
    """A fresh copy of the installed cache_dit package, at tmp_path/site/cache_dit."""
    return copy_package(tmp_path / "site" / "cache_dit")


def snapshot(root: Path) -> dict:
    """Every file under root: bytes, mode and mtime."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            st = path.stat()
            out[path.relative_to(root).as_posix()] = (path.read_bytes(), st.st_mode, st.st_mtime_ns)
    return out


def contents(snap: dict) -> dict:
    return {rel: (data, mode) for rel, (data, mode, _) in snap.items()}


def function_body(text: str, name: str) -> list[str]:
    """The source of each top-level statement in function `name`."""
    module = cst.parse_module(text)
    func = next(s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == name)
    return [module.code_for_node(s) for s in func.body.body]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([RUFF, "check", "--isolated", "--no-cache", *args], check=False, capture_output=True, text=True)


def ruff_findings(path: Path) -> Counter:
    out = ruff("--select", "F,E9", "--output-format", "json", str(path))
    return Counter((d["code"], d["message"]) for d in json.loads(out.stdout))


# --- writing --------------------------------------------------------------------------------------------------


def test_apply_writes_artifacts_and_registrations(pkg):
    result = apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)
    assert result["package"] == str(pkg.resolve())
    assert result["changed"] == ALL_FILES and result["unchanged"] == []

    for artifact in ARTIFACTS:
        assert (pkg / artifact.relpath).read_text() == f"{GENERATED_MARKER}\n{artifact.text}"
    for rel in ALL_FILES:
        text = (pkg / rel).read_text()
        cst.parse_module(text)
        compile(text, rel, "exec")

    text = (pkg / "caching/block_adapters/__init__.py").read_text()
    assert text.endswith('anyflow_adapter = _safe_import(".adapters", "anyflow_adapter")\n'
                         'tiny_test_adapter = _safe_import(".adapter_tiny_test", "tiny_test_adapter")\n')

    text = (pkg / "distributed/transformers/planners.py").read_text()
    assert function_body(text, "_activate_cp_planners")[-1] == (
        "\n"  # a blank line after the `if _nunchaku_available:` block it follows
        "TinyTestContextParallelismPlanner = _safe_import(  # noqa: F841\n"
        '  ".tiny_test", "TinyTestContextParallelismPlanner", ImportErrorContextParallelismPlanner)\n')
    assert ('  TinyTestContextParallelismPlanner = _safe_import(  # noqa: F841\n'
            '    ".tiny_test", "TinyTestContextParallelismPlanner", ImportErrorContextParallelismPlanner)\n'
            '\n\ndef _activate_tp_planners():') in text
    assert text.endswith(
        '    ".anyflow", "AnyFlowTensorParallelismPlanner", ImportErrorTensorParallelismPlanner)\n'
        '  TinyTestTensorParallelismPlanner = _safe_import(  # noqa: F841\n'
        '    ".tiny_test", "TinyTestTensorParallelismPlanner", ImportErrorTensorParallelismPlanner)\n')

    text = (pkg / "distributed/text_encoders/planners.py").read_text()
    assert function_body(text, "_activate_text_encoder_tp_planners")[-1] == (
        "TinyTestEncoderTensorParallelismPlanner = _safe_import(  # noqa: F841\n"
        '  ".tiny_test_encoder", "TinyTestEncoderTensorParallelismPlanner")\n')
    text = (pkg / "distributed/autoencoders/planners.py").read_text()
    assert ('  AutoencoderKLTinyTestDataParallelismPlanner = _safe_import(  # noqa: F841\n'
            '    ".autoencoder_kl_tiny_test", "AutoencoderKLTinyTestDataParallelismPlanner")\n'
            '\n\n__all__') in text

    text = (pkg / "_utils/__init__.py").read_text()
    assert text.endswith('tiny_test_example = _safe_import(".example_tiny_test", "tiny_test_example")\n')
    text = (pkg / "_utils/examples.py").read_text()
    assert ('  "ANY_FLOW_FAR_DIR": "nvidia/AnyFlow-FAR-Wan2.1-1.3B-Diffusers",\n'
            '  "TINY_TEST_DIR": "tiny-org/TinyTest",\n'
            '}\n_path_env_mapping') in text

    # Only lines were added: every line of each registry file is still there, in order.
    for rel in REGISTRY_FILES:
        before = (INSTALLED / rel).read_text().splitlines()
        after = (pkg / rel).read_text().splitlines()
        ops = difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
        assert {op for op, *_ in ops} == {"equal", "insert"}, rel


@pytest.mark.skipif(RUFF is None, reason="ruff is not installed")
def test_ruff_passes_on_the_artifacts_and_adds_nothing_to_the_registries(pkg):
    apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)
    out = ruff("--select", "F,E9", *(str(pkg / a.relpath) for a in ARTIFACTS))
    assert out.returncode == 0, out.stdout + out.stderr
    for rel in REGISTRY_FILES:
        assert ruff_findings(pkg / rel) == ruff_findings(INSTALLED / rel), rel


BROKEN_EXAMPLE = '''\
from diffusers import NoSuchPipeline  # what a newer diffusers might have

from .registers import ExampleRegister


@ExampleRegister.register("broken_test", default="tiny-org/Broken")
def broken_test_example(args, **kwargs):
  return NoSuchPipeline
'''


# A model whose names a built-in registration's prefix covers: cache-dit's `Flux` adapter and `FluxTransformer`
# TP planner would answer for it unless its registration lines go ahead of theirs.
SHADOWED_ADAPTER = ADAPTER.replace("TinyTest", "FluxTiny").replace("tiny_test", "flux_tiny")
SHADOWED_PLANNER = '''\
from .register import TensorParallelismPlanner, TensorParallelismPlannerRegister


@TensorParallelismPlannerRegister.register("FluxTransformerTiny")
class FluxTinyTensorParallelismPlanner(TensorParallelismPlanner):

  def _apply(self, transformer, parallelism_config, **kwargs):
    return transformer, []
'''
SHADOWED = ([Artifact("caching/block_adapters/adapter_flux_tiny.py", SHADOWED_ADAPTER),
             Artifact("distributed/transformers/flux_tiny_tp.py", SHADOWED_PLANNER)],
            [Registration("adapter", ".adapter_flux_tiny", "flux_tiny_adapter"),
             Registration("tp_planner", ".flux_tiny_tp", "FluxTinyTensorParallelismPlanner")])


def test_a_registration_a_built_in_prefix_would_shadow_goes_ahead_of_it(pkg):
    """The line goes just before the first registration whose module registers a prefix of its name (read from
    that module's `register` calls); one no built-in prefix covers goes last, as before."""
    changes = {c.relpath: c.new_text for c in plan_checkout(pkg, [*ARTIFACTS, *SHADOWED[0]],
                                                            [*REGISTRATIONS, *SHADOWED[1]])}
    lines = changes["caching/block_adapters/__init__.py"].splitlines()
    ours = lines.index('flux_tiny_adapter = _safe_import(".adapter_flux_tiny", "flux_tiny_adapter")')
    assert lines[ours + 1] == 'flux_adapter = _safe_import(".adapters", "flux_adapter")'
    assert lines[-1] == 'tiny_test_adapter = _safe_import(".adapter_tiny_test", "tiny_test_adapter")'
    planners = changes["distributed/transformers/planners.py"]
    for function in ("_activate_tp_planners", "_activate_cp_planners"):  # flux.py registers CP and TP planners
        body = function_body(planners, function)
        ours = next(i for i, s in enumerate(body) if '".flux_tiny_tp"' in s)
        assert '".flux"' in body[ours + 1], function  # the module that registers `FluxTransformer`
    assert '".tiny_test"' in function_body(planners, "_activate_tp_planners")[-1]


def test_checked_out_package_registers_everything(pkg):
    """Import the copy (not the installed cache-dit) and find each new registration; then run the generate CLI.

    A second example module that cannot be imported only loses its own example, as a built-in one would.
    """
    script = f'''
import json, os, sys
import cache_dit
assert cache_dit.__file__.startswith({str(pkg)!r}), cache_dit.__file__
import cache_dit.caching.block_adapters as adapters
from cache_dit.caching.block_adapters import BlockAdapterRegister
from cache_dit.distributed.transformers.planners import _activate_cp_planners, _activate_tp_planners
from cache_dit.distributed.transformers.register import (
    ContextParallelismPlannerRegister, TensorParallelismPlannerRegister)
from cache_dit.distributed.text_encoders.planners import _activate_text_encoder_tp_planners
from cache_dit.distributed.text_encoders.register import TextEncoderTensorParallelismPlannerRegister
from cache_dit.distributed.autoencoders.planners import _activate_auto_encoder_dp_planners
from cache_dit.distributed.autoencoders.register import AutoEncoderDataParallelismPlannerRegister
_activate_cp_planners()
_activate_tp_planners()
_activate_text_encoder_tp_planners()
_activate_auto_encoder_dp_planners()
import cache_dit._utils as utils
from cache_dit._utils.examples import _path
from cache_dit._utils.registers import ExampleRegister
result = {{
    "adapter_names": BlockAdapterRegister.supported_pipelines()[1],
    "adapter": adapters.tiny_test_adapter.__module__,
    "shadowed": next(n for n in BlockAdapterRegister._adapters if "FluxTinyPipeline".startswith(n)),
    "shadowed_tp": TensorParallelismPlannerRegister.get_planner("FluxTransformerTiny2DModel").__name__,
    "cp": ContextParallelismPlannerRegister.get_planner("TinyTestTransformer2DModel").__name__,
    "tp": TensorParallelismPlannerRegister.get_planner("TinyTestTransformer2DModel").__name__,
    "te": TextEncoderTensorParallelismPlannerRegister.get_planner("TinyTestEncoderModel").__name__,
    "vae": AutoEncoderDataParallelismPlannerRegister.get_planner("AutoencoderKLTinyTest").__name__,
    "example": utils.tiny_test_example.__module__,
    "broken": utils.broken_test_example.__name__,
    "examples": ExampleRegister.list_examples(),
    "default": ExampleRegister.get_default("tiny_test"),
    "path": _path("tiny-org/TinyTest"),
}}
print("RESULT " + json.dumps(result), flush=True)
sys.argv = ["cache-dit-generate", "list"]
from cache_dit.generate import main
main()
'''
    apply_checkout(pkg, [*ARTIFACTS, *SHADOWED[0], Artifact("_utils/example_broken_test.py", BROKEN_EXAMPLE)],
                   [*REGISTRATIONS, *SHADOWED[1], Registration("example", ".example_broken_test", "broken_test_example")])
    env = {**os.environ, "PYTHONPATH": str(pkg.parent), "TINY_TEST_DIR": "/models/tiny-test",
           "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, cwd=pkg.parent, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert "TinyTest" in result["adapter_names"]
    assert result["adapter"] == "cache_dit.caching.block_adapters.adapter_tiny_test"
    assert result["shadowed"] == "FluxTiny" and result["shadowed_tp"] == "FluxTinyTensorParallelismPlanner"
    assert result["cp"] == "TinyTestContextParallelismPlanner"
    assert result["tp"] == "TinyTestTensorParallelismPlanner"
    assert result["te"] == "TinyTestEncoderTensorParallelismPlanner"
    assert result["vae"] == "AutoencoderKLTinyTestDataParallelismPlanner"
    assert result["example"] == "cache_dit._utils.example_tiny_test"
    assert "tiny_test" in result["examples"] and "flux" in result["examples"]
    assert result["broken"] == "import_error_example" and "broken_test" not in result["examples"]
    assert result["default"] == "tiny-org/TinyTest"
    assert result["path"] == "/models/tiny-test"  # the env_path entry maps the default id to TINY_TEST_DIR
    listing = out.stdout + out.stderr
    assert "tiny_test" in listing and "tiny-org/TinyTest" in listing


# --- idempotence, dry run ---------------------------------------------------------------------------------------


def test_second_run_changes_nothing(pkg):
    apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)
    before = snapshot(pkg)
    result = apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)
    assert result["changed"] == [] and result["diff"] == ""
    assert result["unchanged"] == ALL_FILES
    assert snapshot(pkg) == before
    assert all(not c.changed for c in plan_checkout(pkg, ARTIFACTS, REGISTRATIONS))


def test_builtin_registrations_are_already_there(pkg):
    builtins = [Registration("adapter", ".adapters", "flux_adapter"),
                Registration("cp_planner", ".flux", "FluxContextParallelismPlanner"),
                Registration("tp_planner", ".flux", "FluxTensorParallelismPlanner"),
                Registration("te_planner", ".t5_encoder", "T5EncoderTensorParallelismPlanner"),
                Registration("vae_planner", ".autoencoder_kl", "AutoencoderKLDataParallelismPlanner"),
                Registration("example", ".examples", "flux_example"),
                Registration("env_path", "", "FLUX_DIR", "black-forest-labs/FLUX.1-dev")]
    before = snapshot(pkg)
    result = apply_checkout(pkg, [], builtins)
    assert result["changed"] == [] and result["diff"] == "" and len(result["unchanged"]) == 6
    assert snapshot(pkg) == before


def test_registrations_repeated_in_one_run_are_added_once(pkg):
    apply_checkout(pkg, ARTIFACTS, REGISTRATIONS + REGISTRATIONS)
    text = (pkg / "distributed/transformers/planners.py").read_text()
    assert text.count("TinyTestContextParallelismPlanner = _safe_import(") == 1
    assert (pkg / "_utils/examples.py").read_text().count('"TINY_TEST_DIR"') == 1


def test_dry_run_returns_the_diff_and_writes_nothing(pkg):
    before = snapshot(pkg)
    result = apply_checkout(pkg, ARTIFACTS, REGISTRATIONS, dry_run=True)
    assert snapshot(pkg) == before
    assert result["changed"] == ALL_FILES
    diff = result["diff"]
    assert "--- /dev/null\n+++ b/caching/block_adapters/adapter_tiny_test.py\n" in diff
    assert f"+{GENERATED_MARKER}\n" in diff
    assert "--- a/distributed/transformers/planners.py\n+++ b/distributed/transformers/planners.py\n" in diff
    assert '+tiny_test_adapter = _safe_import(".adapter_tiny_test", "tiny_test_adapter")\n' in diff
    assert '+  "TINY_TEST_DIR": "tiny-org/TinyTest",\n' in diff
    assert apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)["diff"] == diff


def test_plan_checkout_computes_texts_in_memory(pkg):
    before = snapshot(pkg)
    changes = plan_checkout(pkg, ARTIFACTS, REGISTRATIONS)
    assert snapshot(pkg) == before
    assert [c.relpath for c in changes] == ALL_FILES
    by_rel = {c.relpath: c for c in changes}
    new = by_rel["distributed/transformers/tiny_test.py"]
    assert new.old_text is None and new.new_text.startswith(GENERATED_MARKER + "\n") and new.changed
    edit = by_rel["_utils/__init__.py"]
    assert edit.path == pkg.resolve() / "_utils/__init__.py"
    assert edit.old_text == (INSTALLED / "_utils/__init__.py").read_text() != edit.new_text


# --- atomicity --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["_stage_file", "_commit_file"])
@pytest.mark.parametrize("fail_at", [2, len(ALL_FILES)])
@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), RuntimeError("boom")])
def test_failure_midway_leaves_the_tree_as_it_was(pkg, monkeypatch, stage, fail_at, error):
    (pkg / "_utils/__init__.py").chmod(0o640)  # modes come back too
    before = snapshot(pkg)
    real = getattr(checkout, stage)
    calls = []

    def flaky(*args):
        calls.append(args)
        if len(calls) == fail_at:
            raise error
        return real(*args)

    monkeypatch.setattr(checkout, stage, flaky)
    expected = InputError if isinstance(error, OSError) else RuntimeError
    with pytest.raises(expected) as info:
        apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)
    if expected is InputError:
        assert "left as it was" in str(info.value) and "\n" not in str(info.value)
    assert len(calls) == fail_at
    assert contents(snapshot(pkg)) == contents(before)  # same files (no new or temporary ones), same bytes
    monkeypatch.setattr(checkout, stage, real)
    assert apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)["changed"] == ALL_FILES


def test_missing_anchor_writes_nothing(pkg):
    planners = pkg / "distributed/transformers/planners.py"
    planners.write_text(planners.read_text().replace("def _activate_cp_planners():", "def activate_cp():"))
    before = snapshot(pkg)
    with pytest.raises(InputError, match="_activate_cp_planners"):
        apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)
    assert snapshot(pkg) == before


@pytest.mark.parametrize("rel, old, new, needle", [
    ("distributed/text_encoders/planners.py", "def _activate_text_encoder_tp_planners():", "def activate():",
     "_activate_text_encoder_tp_planners"),
    ("distributed/autoencoders/planners.py", "def _activate_auto_encoder_dp_planners():", "def activate():",
     "_activate_auto_encoder_dp_planners"),
    ("_utils/examples.py", "_env_path_mapping = {", "_env_paths = {", "_env_path_mapping"),
    ("caching/block_adapters/__init__.py", "def _safe_import(", "def _safe_import_v2(", "_safe_import"),
    ("distributed/transformers/planners.py", "class_name: str, fallback_cls):", "class_name: str):",
     "takes 2 arguments"),
    ("_utils/__init__.py", "\nflux_example = _safe_import", "\nflux_example = importlib.import_module", None),
])
def test_other_cache_dit_layouts_are_refused(pkg, rel, old, new, needle):
    path = pkg / rel
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new) if needle else "\n".join(
        line for line in text.splitlines() if "= _safe_import(" not in line) + "\n")
    before = snapshot(pkg)
    with pytest.raises(InputError) as info:
        apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)
    assert rel in str(info.value) and (needle or "_safe_import") in str(info.value)
    assert snapshot(pkg) == before


# --- existing files ---------------------------------------------------------------------------------------------


def test_someone_elses_file_is_never_overwritten(pkg):
    path = pkg / "distributed/transformers/tiny_test.py"
    path.write_text("# my own planner, work in progress\nX = 1\n")
    before = snapshot(pkg)
    with pytest.raises(InputError) as info:
        apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    assert snapshot(pkg) == before


def test_a_file_with_exactly_the_artifact_text_is_left_alone(pkg):
    path = pkg / "distributed/transformers/tiny_test.py"
    path.write_text(PLANNERS)  # written by hand, without the marker
    result = apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)
    assert "distributed/transformers/tiny_test.py" in result["unchanged"]
    assert path.read_text() == PLANNERS


def test_our_own_generated_file_is_replaced(pkg):
    apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)
    changed = ADAPTER.replace("forward_pattern=ForwardPattern.Pattern_0", "forward_pattern=ForwardPattern.Pattern_1")
    artifacts = [Artifact(ARTIFACTS[0].relpath, changed), *ARTIFACTS[1:]]
    result = apply_checkout(pkg, artifacts, REGISTRATIONS)
    assert result["changed"] == [ARTIFACTS[0].relpath]
    assert "-    forward_pattern=ForwardPattern.Pattern_0,\n+    forward_pattern=ForwardPattern.Pattern_1,\n" in (
        result["diff"])
    assert (pkg / ARTIFACTS[0].relpath).read_text() == f"{GENERATED_MARKER}\n{changed}"


def test_marker_is_not_doubled(pkg):
    text = f"{GENERATED_MARKER} from plan motif-video\n{ADAPTER}"
    apply_checkout(pkg, [Artifact(ARTIFACTS[0].relpath, text)], [])
    assert (pkg / ARTIFACTS[0].relpath).read_text() == text


# --- layout and style -------------------------------------------------------------------------------------------


def test_long_registration_is_split_one_argument_a_line(pkg):
    name = "TinyTestWithAVeryLongNameForTheColumnLimitContextParallelismPlanner"
    apply_checkout(pkg, ARTIFACTS[1:2], [Registration("cp_planner", ".tiny_test", name)])
    text = (pkg / "distributed/transformers/planners.py").read_text()
    assert (f"  {name} = _safe_import(  # noqa: F841\n"
            '    ".tiny_test",\n'
            f'    "{name}",\n'
            "    ImportErrorContextParallelismPlanner,\n"
            "  )\n") in text
    assert max(map(len, text.splitlines())) <= checkout.LINE_LIMIT


def test_indentation_is_copied_from_the_neighbours(pkg):
    path = pkg / "distributed/text_encoders/planners.py"
    path.write_text('''\
import importlib


def _safe_import(module_name, class_name):
    return getattr(importlib.import_module(module_name, package=__package__), class_name)


def _activate_text_encoder_tp_planners():
    """Four spaces here."""
    T5EncoderTensorParallelismPlanner = _safe_import(  # noqa: F841
            ".t5_encoder", "T5EncoderTensorParallelismPlanner")
''')
    apply_checkout(pkg, ARTIFACTS[2:3], [REGISTRATIONS[3]])
    assert path.read_text().endswith(
        '        ".t5_encoder", "T5EncoderTensorParallelismPlanner")\n'
        '    TinyTestEncoderTensorParallelismPlanner = _safe_import(  # noqa: F841\n'
        '            ".tiny_test_encoder", "TinyTestEncoderTensorParallelismPlanner")\n')


# --- finding the package ----------------------------------------------------------------------------------------


def test_repo_layout_is_accepted(tmp_path):
    root = tmp_path / "cache-dit"
    package = copy_package(root / "src" / "cache_dit")
    assert find_package(root) == find_package(root / "src") == find_package(package) == package.resolve()
    result = apply_checkout(root, ARTIFACTS, REGISTRATIONS)
    assert result["package"] == str(package.resolve()) and result["changed"] == ALL_FILES
    assert (package / "caching/block_adapters/adapter_tiny_test.py").is_file()


def test_not_a_cache_dit_tree(tmp_path):
    with pytest.raises(InputError, match="no such directory"):
        find_package(tmp_path / "missing")
    (tmp_path / "caching/block_adapters").mkdir(parents=True)
    (tmp_path / "caching/block_adapters/__init__.py").write_text("")
    with pytest.raises(InputError, match="not a cache-dit source tree"):
        apply_checkout(tmp_path, ARTIFACTS, REGISTRATIONS)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "caching", "caching/block_adapters", "caching/block_adapters/__init__.py"]


# --- bad input --------------------------------------------------------------------------------------------------


def test_an_artifact_may_import_a_submodule_and_another_artifact(pkg):
    text = "from .. import forward_pattern\nfrom .adapter_tiny_test import tiny_test_adapter\n"
    changes = plan_checkout(pkg, [*ARTIFACTS, Artifact("caching/block_adapters/adapter_x.py", text)], [])
    assert any(c.relpath == "caching/block_adapters/adapter_x.py" for c in changes)


@pytest.mark.parametrize("artifacts, registrations, needle", [
    ([], [Registration("cp_planner", ".no_such_module", "X")], "distributed/transformers/no_such_module.py"),
    (ARTIFACTS, [Registration("cp_planner", ".tiny_test", "Missing")], "defines no top-level Missing"),
    (ARTIFACTS, [Registration("adapter", "adapter_tiny_test", "tiny_test_adapter")], "must be relative"),
    (ARTIFACTS, [Registration("adapter", "...adapter_tiny_test", "tiny_test_adapter")], "not found"),
    (ARTIFACTS, [Registration("plugin", ".adapter_tiny_test", "tiny_test_adapter")], "is not one of"),
    (ARTIFACTS, [Registration("adapter", ".adapter_tiny_test", "tiny-test")], "identifier"),
    (ARTIFACTS, [Registration("adapter", ".adapter_tiny_test", "tiny_test_adapter", "x")], "only for env_path"),
    (ARTIFACTS, [Registration("env_path", "", "TINY_TEST_DIR")], "value"),
    (ARTIFACTS, [Registration("env_path", "", "TINY_TEST_DIR", "a\nb")], "value"),
    (ARTIFACTS, [Registration("env_path", "", "FLUX_DIR", "someone/else")], "already maps FLUX_DIR"),
    (ARTIFACTS, [Registration("adapter", ".adapter_tiny_test", "BlockAdapter")], "BlockAdapter is already defined"),
    ([Artifact("caching/block_adapters/adapters_v2.py", "def flux_adapter(pipe, **kwargs):\n  return None\n")],
     [Registration("adapter", ".adapters_v2", "flux_adapter")], "flux_adapter is already defined"),
    ([Artifact("../evil.py", "X = 1\n")], [], "inside the cache_dit package"),
    # an artifact's relative imports are checked against the tree (and the checkout's other artifacts)
    ([Artifact("caching/block_adapters/adapter_x.py", "from .block_adapters import NoSuchThing\n")], [],
     "block_adapters.py defines no NoSuchThing"),
    ([Artifact("caching/block_adapters/adapter_x.py", "from ..no_such_module import X\n")], [],
     "imports from ..no_such_module: no such module"),
    ([Artifact("caching/block_adapters/adapter_x.py", "def f():\n  from ...... import X\n")], [],
     "climbs out of the cache_dit package"),
    ([Artifact("/etc/evil.py", "X = 1\n")], [], "inside the cache_dit package"),
    ([Artifact("caching/notes.txt", "hello\n")], [], ".py"),
    ([Artifact("no_such_dir/x.py", "X = 1\n")], [], "does not exist"),
    ([Artifact("caching/broken.py", "def broken(:\n")], [], "does not parse"),
    ([ARTIFACTS[0], ARTIFACTS[0]], [], "listed twice"),
])
def test_bad_input_is_refused_and_nothing_written(pkg, artifacts, registrations, needle):
    before = snapshot(pkg)
    with pytest.raises(InputError) as info:
        apply_checkout(pkg, artifacts, registrations)
    message = str(info.value)
    assert needle in message and "\n" not in message, message
    assert snapshot(pkg) == before


# --- killed half-way ---------------------------------------------------------------------------------------------

# the fault points of one run: a stage per file, the journal's write and rename, a replace per file, the
# journal's removal
FAULTS = 2 * len(ALL_FILES) + 3


def _killed_run(pkg: Path, fault: int) -> int:
    """apply_checkout in a forked copy of this process with the fault planted at step `fault`: its exit code."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.environ["INTEGRATE_CHECKOUT_FAULT"] = str(fault)
            apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.parametrize("fault", range(1, FAULTS + 1))
def test_a_run_killed_at_any_write_or_rename_is_rolled_back_by_the_next(pkg, fault):
    before = contents(snapshot(pkg))
    assert _killed_run(pkg, fault) == 137  # ended where the fault was planted, as a kill -9 would end it
    after_kill = contents(snapshot(pkg))
    checkout.recover(pkg)  # what the next run does first
    recovered = contents(snapshot(pkg))
    assert recovered == before, f"fault {fault}: the tree is neither as before nor complete"
    assert not list(pkg.rglob(".*.integrate-*.tmp")) and not (pkg / checkout.JOURNAL).exists()
    if fault <= len(ALL_FILES) + 2:
        assert all(after_kill[rel] == before[rel] for rel in before)  # before the journal: nothing touched yet
    # and the next real run completes the checkout
    result = apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)
    assert result["changed"] == ALL_FILES


def test_a_run_that_was_not_killed_leaves_no_journal(pkg):
    apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)
    assert not (pkg / checkout.JOURNAL).exists() and not list(pkg.rglob(".*.integrate-*.tmp"))


@pytest.mark.parametrize("path, expected", [
    ("/home/me/.cache/huggingface/hub/models--black-forest-labs--FLUX.1-dev/snapshots/0a1b", "black-forest-labs/FLUX.1-dev"),
    ("/data/models--Org--Name", "Org/Name"),
    ("/data/motif-video", None),  # a plain folder: no id is guessed
    ("/data/models--OnlyOne", None),
    ("/data/models--a--b--c/snapshots/x", None),  # ambiguous: `--` inside a part of the id
    (None, None),
])
def test_a_hub_id_is_read_from_the_hub_caches_layout_only(path, expected):
    from integrate.templates import hub_id

    assert hub_id(path) == expected


# --- a journal or a tree planted by someone else (issue 33.4, 33.5) -----------------------------------------------


def _plant(pkg: Path, entries: list[dict]) -> None:
    (pkg / checkout.JOURNAL).write_text(json.dumps({"entries": entries}))


@pytest.mark.parametrize("entry", [
    {"path": "caching/__init__.py", "tmp": "../../../victim.txt", "backup": None, "mode": None},
    {"path": "../victim.py", "tmp": ".victim.py.integrate-0123456789ab.tmp", "backup": None, "mode": None},
    {"path": "caching/__init__.py", "tmp": "/abs/victim.txt", "backup": None, "mode": None},
    {"path": "caching/__init__.py", "tmp": ".__init__.py.integrate-0123456789ab.tmp", "backup": 5, "mode": None},
    {"path": "caching/__init__.py", "tmp": ".__init__.py.integrate-0123456789ab.tmp", "backup": None, "mode": "x"},
])
def test_a_planted_journal_is_refused_whole_and_touches_nothing(pkg, tmp_path, entry):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "site" / "victim.py").write_text("keep me too")
    before = contents(snapshot(pkg))
    _plant(pkg, [entry])
    with pytest.raises(InputError, match="not a journal integrate wrote"):
        checkout.recover(pkg)
    assert victim.read_text() == "keep me" and (tmp_path / "site" / "victim.py").read_text() == "keep me too"
    assert {k: v for k, v in contents(snapshot(pkg)).items() if k != checkout.JOURNAL} == before


def test_a_journal_cannot_write_through_a_symlinked_folder(pkg, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (pkg / "evil").symlink_to(outside, target_is_directory=True)
    payload = base64.b64encode(b"import os; os.system('touch marker')\n").decode()
    _plant(pkg, [{"path": "evil/x.py", "tmp": ".x.py.integrate-0123456789ab.tmp", "backup": payload, "mode": 0o644}])
    with pytest.raises(InputError, match="resolves outside"):
        checkout.recover(pkg)
    assert not list(outside.iterdir())


def test_a_checkout_never_writes_through_a_symlinked_folder(pkg, tmp_path):
    moved = tmp_path / "elsewhere"
    shutil.move(pkg / "distributed" / "text_encoders", moved)
    (pkg / "distributed" / "text_encoders").symlink_to(moved, target_is_directory=True)
    before = contents(snapshot(moved))
    with pytest.raises(InputError, match="resolves outside"):
        apply_checkout(pkg, ARTIFACTS, REGISTRATIONS)
    assert contents(snapshot(moved)) == before


def test_a_dry_run_refuses_a_half_applied_tree(pkg):
    assert _killed_run(pkg, len(ALL_FILES) + 4) == 137  # killed between renames: the journal is there
    with pytest.raises(InputError, match="half-applied"):
        apply_checkout(pkg, ARTIFACTS, REGISTRATIONS, dry_run=True)


def test_any_command_rolls_back_the_installed_tree_a_killed_checkout_left(pkg, tmp_path):
    """The cache-dit Python imports (here: PYTHONPATH puts the copy first) is settled before any command reads it."""
    before = contents(snapshot(pkg))
    assert _killed_run(pkg, len(ALL_FILES) + 5) == 137
    assert contents(snapshot(pkg)) != before  # half-applied
    done = subprocess.run([sys.executable, "-m", "integrate.cli", "gate", "--model-path", str(tmp_path / "none")],
                          env={**os.environ, "PYTHONPATH": str(pkg.parent)}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2, done.stderr  # the gate refuses the missing folder, after the tree was settled
    assert contents(snapshot(pkg)) == before
