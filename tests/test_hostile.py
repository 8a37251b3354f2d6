"""Hostile and broken input, as an attacker or a careless user would hand it over.

Every case runs the command a user would (in process, through the CLI), and must hold four promises:
the exit code is 0, 1 or 2 (never a crash); a refusal is one line on stderr; nothing is written outside
--out; and no payload runs (a payload here creates a marker file, so running it leaves a trace).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import plan_md_for

from integrate.cli import main

PAYLOADS = [
    '$(touch {marker})',
    '`touch {marker}`',
    'M"""\nimport os; os.system("touch {marker}")\n"""',
    "'; import os; os.system('touch {marker}') #",
    "__import__('os').system('touch {marker}')",
    "x\\N{{",
    "../../../../tmp/escape",
    "a\x00b",
    "line\nbreak\r\x1b[31m",
    "é" * 300,
]


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


def files_under(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*")}


def check(result, tmp_path: Path, before: set[str], allowed: tuple[Path, ...] = ()) -> None:
    """The four promises."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.stderr)
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    new = files_under(tmp_path) - before
    stray = [p for p in new if not any(Path(p).is_relative_to(a) for a in allowed)]
    assert not stray, f"written outside --out: {stray[:3]}"
    assert not (tmp_path / "marker").exists(), "a payload ran"


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("INTEGRATE_CACHE_DIR", "")
    monkeypatch.setenv("INTEGRATE_APPROVAL_KEY", str(tmp_path.parent / "approval.key"))


def model_dir(tmp_path: Path, index: str | None = None, config: str | None = None) -> Path:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    if index is not None:
        (d / "model_index.json").write_text(index)
    if config is not None:
        (d / "transformer").mkdir(exist_ok=True)
        (d / "transformer" / "config.json").write_text(config)
    return d


FLUX_INDEX = {"_class_name": "FluxPipeline", "_diffusers_version": "0.42.1",
              "transformer": ["diffusers", "FluxTransformer2DModel"]}


# -- model_index.json --------------------------------------------------------------------------------------------

INDEXES = [
    "", "{", "[]", "null", "1", '"x"', "{}", '{"_class_name": 5}', '{"_class_name": null}',
    '{"_class_name": ["a"]}', '{"transformer": "x"}', '{"transformer": ["a"]}', '{"transformer": [1, 2]}',
    '{"transformer": ["diffusers", "Nope"]}', '{"_class_name": "Nope", "_diffusers_version": "1"}',
    "[" * 5000 + "]" * 5000, '{"a": ' * 3000 + "1" + "}" * 3000, '{"n": ' + "9" * 5000 + "}",
    '{"x": NaN}', '{"x": Infinity}', "\xff\xfe", '{"_class_name": "FluxPipeline"}',
    json.dumps({**FLUX_INDEX, "transformer": ["this.x", "FluxTransformer2DModel"]}),
    json.dumps({**FLUX_INDEX, "transformer": ["../..", "FluxTransformer2DModel"]}),
    json.dumps({**FLUX_INDEX, "transformer": ["diffusers", "FluxTransformer2DModel\nX"]}),
    json.dumps({**FLUX_INDEX, "_class_name": "Flux.Pipe.Line"}),
    json.dumps({**FLUX_INDEX, "../../te": ["transformers", "T5EncoderModel"]}),
    json.dumps({**FLUX_INDEX, "text encoder": ["transformers", "T5EncoderModel"]}),
    json.dumps({**FLUX_INDEX, "text_encoder": ["transformers", "T5EncoderModel\"; import os"]}),
    json.dumps({**FLUX_INDEX, "vae": ["diffusers", "$(touch x)"]}),
] + [json.dumps({**FLUX_INDEX, "_class_name": p}) for p in PAYLOADS] \
  + [json.dumps({**FLUX_INDEX, "transformer": ["diffusers", p]}) for p in PAYLOADS] \
  + [json.dumps({**FLUX_INDEX, "transformer": [p, "FluxTransformer2DModel"]}) for p in PAYLOADS] \
  + [json.dumps({**FLUX_INDEX, p: ["transformers", "T5EncoderModel"]}) for p in PAYLOADS]


@pytest.mark.parametrize("text", INDEXES)
def test_model_index(tmp_path, text):
    d = model_dir(tmp_path, index=text.replace("{marker}", str(tmp_path / "marker")))
    before = files_under(tmp_path)
    check(cli("gate", "--model-path", str(d), "--json"), tmp_path, before)
    check(cli("plan", str(d), "--out", str(tmp_path / "out"), "--no-probe"), tmp_path, before, (tmp_path / "out",))


# -- transformer/config.json ---------------------------------------------------------------------------------------

FUSED = Path(__file__).parent / "fixtures" / "fused" / "model.py"
CONFIGS = [
    "{", "[]", '{"depth": 1000000000}', '{"depth": -1}', '{"depth": "many"}', '{"depth": 2.5}', '{"depth": null}',
    '{"heads": 0}', '{"dim": 0}', '{"heads": true}', '{"dim": 1e308}', '{"x": NaN}', '{"x": -Infinity}',
    '{"rope": [' + ", ".join(["1"] * 20000) + "]}", '{"a": ' * 40 + "1" + "}" * 40, '{"n": ' + "9" * 5000 + "}",
    '{"_class_name": 5}', '{"_class_name": "Other"}', '{"dim": 96, "heads": 7, "kv_heads": 5}',
    '{"dim": -96, "heads": 6}', '{"dim": 96, "heads": 6, "kv_heads": 0}', '{"dim": [96], "heads": {"a": 1}}',
] + [json.dumps({"dim": p}) for p in PAYLOADS] + [json.dumps({p: 1}) for p in PAYLOADS]


@pytest.mark.parametrize("text", CONFIGS)
def test_transformer_config(tmp_path, text):
    """The config of a small model of our own (tests/fixtures/fused): every value reaches the analysis."""
    d = model_dir(tmp_path, config=text.replace("{marker}", str(tmp_path / "marker")))
    flags = ["--model-path", str(d), "--transformer-class", "TinyDiT", "--pipeline-class", "denoise",
             "--pipeline-file", str(FUSED)]
    before = files_under(tmp_path)  # plan runs the gate and the whole analysis (analyze's path is a part of it)
    check(cli("plan", str(FUSED), *flags, "--out", str(tmp_path / "out"), "--no-probe"), tmp_path, before,
          (tmp_path / "out",))


def test_a_real_model_config_out_of_range_is_refused_before_any_work(tmp_path):
    d = model_dir(tmp_path, index=json.dumps(FLUX_INDEX), config='{"num_layers": 1000000000}')
    result = cli("plan", str(d), "--out", str(tmp_path / "out"), "--no-probe")
    assert result.exit_code == 2 and "out of range" in result.stderr and not (tmp_path / "out").exists()


# -- model sources -------------------------------------------------------------------------------------------------

_BLOCK = "from torch import nn\nclass B(nn.Module):\n    def forward(self, x, c):\n        return x, c\n"
SOURCES = [
    "x=" + "(" * 1500 + "1" + ")" * 1500, "x = a" + " and a" * 10000, "x = " + "[" * 5000 + "]" * 5000,
    "x = a" + " + a" * 10000, "x = " + "not " * 5000 + "a", "x = a" + ".b" * 5000, "x = f" + "()" * 5000,
    "x = " + "-" * 5000 + "a", "x = " + "lambda: " * 1000 + "1", "def f(:\n", "class M(nn.Module:\n",
    "\x00\x01\x02", "\xff\xfe\xfd", "x = 1\n" * 2, "if 1:\n" + "".join(" " * i + "if 1:\n" for i in range(1, 120)),
    _BLOCK + "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.blocks = nn.ModuleList([B() for _ in range(2)])\n"
             "    def forward(self, x, c):\n        '''\\N'''\n        s = r\"\\N{\"\n"
             "        for b in self.blocks:\n            x, c = b(x, c)\n        return x\n",
    _BLOCK + "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.blocks = nn.ModuleList([B() for _ in range(2)])\n"
             "    def forward(self, x, c):\n        for b in self.blocks[:int('\"\"\"' == 'x')]:\n"
             "            x, c = b(x, c)\n        return x\n",
    "class M:\n    pass\n", "M = 1\n", "import this\nclass M:\n    pass\n",
]


@pytest.mark.parametrize("i", range(len(SOURCES)))
def test_model_source(tmp_path, i):
    src = tmp_path / "model.py"
    src.write_text(SOURCES[i], encoding="utf-8", errors="surrogateescape")
    before = files_under(tmp_path)
    flags = ["--model-path", str(model_dir(tmp_path)), "--transformer-class", "M", "--pipeline-class", "f",
             "--pipeline-file", str(src)]
    before = files_under(tmp_path)
    check(cli("analyze", str(src), *flags, "--json", "--no-cache"), tmp_path, before)
    check(cli("plan", str(src), *flags, "--out", str(tmp_path / "out"), "--no-probe"), tmp_path, before,
          (tmp_path / "out",))


def test_a_source_over_the_size_limit_is_refused_up_front(tmp_path):
    src = tmp_path / "big.py"
    src.write_text("x = 1\n" * 400_000)  # 2.4 MB
    result = cli("analyze", str(src), "--model-path", str(model_dir(tmp_path)), "--transformer-class", "M",
                 "--pipeline-class", "f", "--pipeline-file", str(src))
    assert result.exit_code == 2 and "too large" in result.stderr and "refused before parsing" in result.stderr


# -- flags and paths -----------------------------------------------------------------------------------------------

FLAGS = [
    ["gate"], ["gate", "--model-path", "/nonexistent"], ["gate", "--model-path", "/etc/passwd"],
    ["gate", "--model-path", "x" * 5000], ["gate", "--transformer-file", "/dev/null", "--pipeline-file", "/dev/null",
                                          "--transformer-class", "A", "--pipeline-class", "B", "--model-path", "/"],
    ["analyze", "/nonexistent"], ["analyze", "/proc/self/status", "--model-path", "/", "--transformer-class", "A",
                                  "--pipeline-class", "B", "--pipeline-file", "/proc/self/status"],
    ["plan", "{model}", "--out", ""], ["plan", "{model}", "--out", "/proc/integrate-test"],
    ["plan", "{model}", "--out", "/etc/passwd/sub"], ["plan", "{model}", "--out", "{tmp}/" + "d" * 300],
    ["approve", "{tmp}"], ["approve", "{tmp}", "--reviewer", "x"], ["approve", "/nonexistent", "--check"],
    ["generate", "{tmp}", "--out", "{tmp}/out"], ["generate", "/nonexistent", "--out", "{tmp}/out"],
    ["verify", "{tmp}", "--generated", "{tmp}"], ["verify", "{tmp}", "--generated", "{tmp}", "--print"],
    ["metrics", "/nonexistent", "/nonexistent"], ["metrics", "/etc/passwd", "/etc/passwd"],
    ["survey", "--path", "/nonexistent"], ["survey", "--jobs", "0"], ["survey", "--only", "X"],
    ["nonsense"], ["plan"], ["generate", "{tmp}", "--mode", "weird"], ["analyze", "--json", "--markdown", "/x"],
] + [["gate", "--pipeline-class", p, "--transformer-class", "A", "--pipeline-file", "/dev/null",
      "--transformer-file", "/dev/null", "--model-path", "/"] for p in PAYLOADS] \
  + [["gate", "--transformer-class", p, "--pipeline-class", "A", "--pipeline-file", "/dev/null",
      "--transformer-file", "/dev/null", "--model-path", "/"] for p in PAYLOADS] \
  + [["analyze", "{model}", "--transformer-class", p] for p in PAYLOADS] \
  + [["plan", "{model}", "--out", "{tmp}/" + p.replace("{marker}", "marker").replace("\x00", "").replace("/", "_")[:100],
      "--no-probe"] for p in PAYLOADS]


@pytest.mark.parametrize("args", FLAGS)
def test_flags(tmp_path, args, monkeypatch):
    model = model_dir(tmp_path, index=json.dumps(FLUX_INDEX))
    marker = str(tmp_path / "marker")
    args = [a.replace("{tmp}", str(tmp_path)).replace("{model}", str(model)).replace("{marker}", marker) for a in args]
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # a write into the working directory would show there
    before = files_under(tmp_path)
    out = next((Path(args[i + 1]) for i, a in enumerate(args[:-1]) if a == "--out"), None)
    result = cli(*args)
    allowed = (out,) if out is not None and str(out) and out.is_relative_to(tmp_path) else ()
    check(result, tmp_path, before, allowed)


# -- plans a reviewer approved, written by someone else -----------------------------------------------------------

PLAN_EDITS = [
    ("model.example_name", "../../escape"), ("model.example_name", "x; import os"), ("model.example_name", "class"),
    ("model.example_name", "a" * 500), ("model.env_var", "X; touch {marker}"), ("model.env_var", "$(touch {marker})"),
    ("model.model_path", "$(touch {marker})"), ("model.model_path", '"; touch {marker}; "'),
    ("model.transformer_class", 'M"""\nimport os; os.system("touch {marker}")\n"""'),
    ("model.pipeline_class", 'P"""\nimport os\n"""'), ("model.example_type_guess", "T2I; import os"),
    ("cache.block_lists.0.attr", "blocks; import os"), ("cache.block_lists.0.forward_pattern", "Pattern_0; import os"),
    ("cache.block_lists.0.forward_pattern", 0), ("cache.has_separate_cfg", "yes"),
    ("parallelism.cp.plan.proj_out.gather_dim", "1; import os"), ("parallelism.cp.plan.proj_out.gather_dim", 1.5),
    ("parallelism.tp.block_lists.0.layer_plan", {"a\"; import os; \"": "colwise"}),
    ("parallelism.tp.block_lists.0.attr", "x\n  import os"), ("parallelism.cp.evidence.0.why", '"""\nimport os\n"""'),
    ("facts.sequence", 7), ("schema_version", None), ("unknowns", "not a list"),
]


def _set(data: dict, path: str, value):
    keys = path.split(".")
    for key in keys[:-1]:
        data = data[int(key)] if isinstance(data, list) else data[key]
    if isinstance(data, list):
        data[int(keys[-1])] = value
    else:
        data[keys[-1]] = value


@pytest.fixture(scope="module")
def flux_plan(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flux")
    model = tmp / "model"
    model.mkdir()
    (model / "model_index.json").write_text(json.dumps(FLUX_INDEX))
    result = CliRunner().invoke(main, ["plan", str(model), "--out", str(tmp / "plan"), "--no-probe"])
    assert result.exit_code == 0, result.stderr
    return json.loads((tmp / "plan" / "plan.json").read_text()), (tmp / "plan" / "PLAN.md").read_text()


@pytest.mark.parametrize("path,value", PLAN_EDITS)
def test_an_approved_plan_with_hostile_values(tmp_path, flux_plan, path, value):
    data, md = json.loads(json.dumps(flux_plan[0])), flux_plan[1]
    marker = str(tmp_path / "marker")
    _set(data, path, json.loads(json.dumps(value).replace("{marker}", marker)))
    plan_dir = tmp_path / "plan"
    plan_dir.mkdir()
    (plan_dir / "plan.json").write_text(json.dumps(data, indent=2))
    # PLAN.md as `integrate revise` would render it for these values, so approve accepts them and generate
    # meets them (a PLAN.md that does not show plan.json is refused before generate could)
    (plan_dir / "PLAN.md").write_text(plan_md_for(data, md))
    before = files_under(tmp_path)
    approve = cli("approve", str(plan_dir), "--reviewer", "R")
    check(approve, tmp_path, before, (plan_dir,))
    out = tmp_path / "out"
    gen = cli("generate", str(plan_dir), "--out", str(out))
    check(gen, tmp_path, before, (plan_dir, out))
    if gen.exit_code in (0, 1):
        _import_plugin(out, tmp_path)


def _import_plugin(out: Path, tmp_path: Path) -> None:
    """What a user's `import` would run, checked without running it: every generated module compiles and no
    `os.system` call (the payloads' code) appears in it; every script passes `bash -n`."""
    import subprocess

    from test_injection import _no_payload_in_python

    for module in out.rglob("*.py"):
        _no_payload_in_python(module)
    for script in out.glob("*.sh"):
        subprocess.run(["bash", "-n", str(script)], check=True)
    assert not (tmp_path / "marker").exists()


# -- the reviewer --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reviewer", PAYLOADS)
def test_a_reviewer_name_never_becomes_code(tmp_path, flux_plan, reviewer):
    plan_dir = tmp_path / "plan"
    plan_dir.mkdir()
    (plan_dir / "plan.json").write_text(json.dumps(flux_plan[0], indent=2))
    (plan_dir / "PLAN.md").write_text(flux_plan[1])
    before = files_under(tmp_path)
    approve = cli("approve", str(plan_dir), "--reviewer", reviewer.replace("{marker}", str(tmp_path / "marker")))
    check(approve, tmp_path, before, (plan_dir,))
    if approve.exit_code == 0:
        gen = cli("generate", str(plan_dir), "--out", str(tmp_path / "out"))
        check(gen, tmp_path, before, (plan_dir, tmp_path / "out"))
        _import_plugin(tmp_path / "out", tmp_path)


def test_the_suite_is_large_enough():
    from test_injection import INPUTS

    cases = len(INDEXES) + len(CONFIGS) + len(SOURCES) + len(FLAGS) + len(PLAN_EDITS) + len(PAYLOADS) + len(INPUTS)
    assert cases >= 300, cases  # test cases, each running one to three commands
    assert os.environ.get("INTEGRATE_CACHE_DIR") == ""
