"""Bad input: one clear line on stderr, exit 2, no traceback, nothing written. Each case runs the real entry
point, `python -m integrate.cli`, in a process of its own: what a user's shell sees."""

import functools
import json

import pytest
from conftest import EXAMPLE, ROOT
from conftest import run_cli as _in_process_or_not

run_cli = functools.partial(_in_process_or_not, process=True)


def assert_bad(out, *needles):
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_path():
    assert_bad(run_cli("analyze", "/nonexistent/model"), "no such file")


def test_missing_facts_list_flags(tmp_path):
    src = ROOT / "tests" / "fixtures" / "bfl" / "model.py"
    assert_bad(run_cli("analyze", str(src)), "--model-path", "--pipeline-class", "--transformer-class",
               "--pipeline-file")


def test_directory_without_metadata(tmp_path):
    assert_bad(run_cli("analyze", str(tmp_path)), "no model metadata")


def test_huge_directory_is_not_walked(tmp_path):
    for i in range(3000):
        (tmp_path / f"shard-{i}.bin").write_bytes(b"")
    assert_bad(run_cli("analyze", str(tmp_path)), "no model metadata")


def test_invalid_json(tmp_path):
    (tmp_path / "model_index.json").write_text("{not json")
    assert_bad(run_cli("analyze", str(tmp_path)), "invalid JSON")


def test_unknown_class(model_dir):
    assert_bad(run_cli("analyze", str(model_dir("NoSuchPipeline", "NoSuchTransformer"))), "not exported")


def test_flag_contradicts_config():
    assert_bad(run_cli("analyze", str(EXAMPLE), "--transformer-class", "FluxTransformer2DModel"),
               "FluxTransformer2DModel", "MotifVideoTransformer3DModel")


def test_class_absent_from_given_file(tmp_path):
    src = ROOT / "tests" / "fixtures" / "bfl" / "layers.py"
    assert_bad(run_cli("analyze", str(src), "--model-path", str(tmp_path), "--transformer-class", "Flux",
                       "--pipeline-class", "denoise", "--pipeline-file", str(src)),
               "does not define class Flux", "DoubleStreamBlock")


@pytest.mark.parametrize("content", [b"def broken(:\n", b"\x00\x01\x02binary", "caf\xe9".encode("latin-1")])
def test_unreadable_source(tmp_path, content):
    src = tmp_path / "model.py"
    src.write_bytes(content)
    assert_bad(run_cli("analyze", str(src), "--model-path", str(tmp_path), "--transformer-class", "M",
                       "--pipeline-class", "P", "--pipeline-file", str(src)), str(src))


def test_circular_imports(tmp_path):
    cycle = ROOT / "tests" / "fixtures" / "cycle"
    index = {"_class_name": "P", "_diffusers_version": "0", "transformer": ["diffusers", "Model"]}
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    out = run_cli("analyze", str(cycle / "a.py"), "--model-path", str(tmp_path), "--pipeline-class", "P",
                  "--pipeline-file", str(cycle / "a.py"))
    assert_bad(out, "circular import", "a.py", "b.py")


def test_usage_error_is_one_line():
    assert_bad(run_cli("analyze", "--no-such-flag"), "no-such-flag")


def test_gate_report_shows_sources():
    out = run_cli("gate", "--model-path", str(EXAMPLE), "--json")
    assert out.returncode == 0, out.stderr
    inputs = json.loads(out.stdout)["gate"]["inputs"]
    assert inputs["pipeline_class"] == {"value": "MotifVideoPipeline", "source": "model_index.json:_class_name"}
    assert inputs["transformer_file"]["source"].startswith("located in installed `diffusers`")
    assert inputs["model_path"]["source"] == "flag --model-path"


@pytest.mark.parametrize("flag,needle", [
    ("refiner", "expected ATTR=Class"),
    ("refiner=Missing", "neither defines nor imports"),
    ("nope=RefinerBlock", "builds no ModuleList `self.nope`"),
    ("refiner=1x", "expected ATTR=Class"),
])
def test_a_bad_block_class_flag_is_one_line(flag, needle):
    src = ROOT / "tests" / "fixtures" / "blockcls" / "model.py"
    assert_bad(run_cli("analyze", str(src), "--model-path", str(src.parent / "ckpt"), "--pipeline-class", "sample",
                       "--pipeline-file", str(src), "--block-class", flag, "--no-cache"), needle)


def test_a_config_flag_that_names_no_file_or_another_class_is_one_line(tmp_path):
    src = ROOT / "tests" / "fixtures" / "blockcls" / "model.py"
    flags = ("--pipeline-class", "sample", "--pipeline-file", str(src), "--transformer-file", str(src))
    assert_bad(run_cli("gate", "--config", str(tmp_path / "none.json"), *flags), "no such file")
    other = tmp_path / "other.json"
    other.write_text('{"_class_name": "Other"}')
    assert_bad(run_cli("gate", "--config", str(other), "--transformer-class", "Model", *flags), "Other")


@pytest.mark.parametrize("root,needle", [
    ("nowhere", "--source-root {tmp}/nowhere: no such folder"),
    ("file.txt", "--source-root {tmp}/file.txt: not a folder"),
    ("", "--source-root must name a folder"),
])
def test_a_bad_source_root_is_one_line(tmp_path, root, needle):
    (tmp_path / "file.txt").write_text("")
    value = str(tmp_path / root) if root else ""
    for command in ("gate", "analyze"):
        assert_bad(run_cli(command, "--model-path", str(EXAMPLE), "--source-root", value),
                   needle.format(tmp=tmp_path))


def test_a_pythonpath_entry_that_is_no_folder_is_one_line_before_model_code_runs(tmp_path):
    """Workers get the user's PYTHONPATH explicitly (they start with -I): an entry that is no folder is refused
    when a worker would import the model, and nothing is written."""
    model = tmp_path / "model.py"
    model.write_text("import torch\nfrom torch import nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
                     "        return x\n")
    (tmp_path / "m").mkdir()
    out = run_cli("plan", str(model), "--model-path", str(tmp_path / "m"), "--transformer-class", "Model",
                  "--no-pipeline", "--separate-cfg", "no", "--out", str(tmp_path / "plan"), "--trust-code",
                  env={"PYTHONPATH": str(tmp_path / "gone")})
    assert_bad(out, f"PYTHONPATH entry {tmp_path / 'gone'}: no such folder")
    assert not (tmp_path / "plan").exists()
