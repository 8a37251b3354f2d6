"""Snapshots of what a user gets: analyze JSON, plan.json, PLAN.md and every generated file, for a few models.

Each snapshot runs the commands a user runs (`analyze --json`, `plan --no-probe`, `approve`, `generate`)
through the CLI and stores their outputs under tests/snapshots/<name>/, with the machine-specific parts
replaced by placeholders (the installed packages' folder, this checkout, the scratch folder, the plan's
SHA-256 prefix, the tool version). tests/test_snapshots.py compares a fresh run with the stored files:
a restructuring of the code must leave every byte the same.

Regenerate after an intended change of output (then read the diff before committing it):

    python tests/snapshot.py --update [NAME ...]
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "tests" / "snapshots"
APPROVED_AT = "2026-01-01T00:00:00+00:00"

# name -> (how the model is given, gate flags). "diffusers:Pipeline:Transformer" makes a config-only
# model directory; a path is used as is.
MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    # the shipped example: a PatchFunctor splitting walks, a mask reorder, a TE-P planner
    "motif_video": (str(ROOT / "examples" / "motif-video"), ()),
    # supported by cache-dit: root split, gather at proj_out, modulation sharded with a replicated output
    "flux": ("diffusers:FluxPipeline:FluxTransformer2DModel", ()),
    # first-block split with an output split of the position module
    "qwen_image": ("diffusers:QwenImagePipeline:QwenImageTransformer2DModel", ()),
    # a prefix that cache-dit's adapter refuses; cross-attention text split at every block
    "sana_video": ("diffusers:SanaVideoPipeline:SanaVideoTransformer3DModel", ()),
    # third-party code: roles from names, pitfalls A and C, a function as the denoising loop
    "bfl": ("<empty>", ("--transformer-class", "Flux", "--pipeline-class", "denoise",
                        "--pipeline-file", str(ROOT / "tests" / "fixtures" / "bfl" / "model.py"),
                        "--transformer-file", str(ROOT / "tests" / "fixtures" / "bfl" / "model.py"))),
}


def _cli(*args: str) -> tuple[int, str]:
    from integrate.cli import main

    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout


def _model(spec: str, work: Path) -> str:
    if spec == "<empty>":
        (work / "model").mkdir(parents=True, exist_ok=True)
        return str(work / "model")
    if spec.startswith("diffusers:"):
        _, pipeline, transformer = spec.split(":")
        model = work / "model"
        model.mkdir(parents=True, exist_ok=True)
        index = {"_class_name": pipeline, "_diffusers_version": "0.42.1", "transformer": ["diffusers", transformer]}
        (model / "model_index.json").write_text(json.dumps(index))
        return str(model)
    return spec


def capture(name: str, work: Path) -> dict[str, str]:
    """{relative path: normalised text} of every output for one model."""
    from integrate import __version__

    spec, flags = MODELS[name]
    model = _model(spec, work)
    out: dict[str, str] = {}
    code, text = _cli("analyze", model, *flags, "--json", "--no-cache")
    out["analyze.json"] = f"exit {code}\n{text}"
    plan_dir = work / "plan"
    code, text = _cli("plan", model, *flags, "--out", str(plan_dir), "--no-probe")
    out["plan.txt"] = f"exit {code}\n{text}"
    for f in ("plan.json", "PLAN.md"):
        out[f] = (plan_dir / f).read_text()
    _cli("approve", str(plan_dir), "--reviewer", "snapshot")
    approved_at = json.loads((plan_dir / "APPROVAL.json").read_text())["approved_at"]
    gen = work / "gen"
    code, text = _cli("generate", str(plan_dir), "--out", str(gen))
    out["generate.txt"] = f"exit {code}\n{text}"
    for path in sorted(gen.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            out["gen/" + path.relative_to(gen).as_posix()] = path.read_text()
    sha = hashlib.sha256((plan_dir / "plan.json").read_bytes()).hexdigest()
    return {k: _normalise(v, work, sha, __version__).replace(approved_at, APPROVED_AT) for k, v in out.items()}


def _normalise(text: str, work: Path, sha: str, version: str) -> str:
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    for path, mark in ((work.resolve(), "<work>"), (work, "<work>"), (site, "<site-packages>"), (ROOT, "<repo>")):
        text = text.replace(str(path), mark)
    text = text.replace(sha[:12], "<plan-sha>")
    return text.replace(f'"tool_version": "{version}"', '"tool_version": "<version>"').replace(
        f"integrate {version}", "integrate <version>")


def stored(name: str) -> dict[str, str]:
    base = STORE / name
    return {p.relative_to(base).as_posix(): p.read_text() for p in sorted(base.rglob("*")) if p.is_file()}


def update(names: list[str]) -> None:
    for name in names or list(MODELS):
        with tempfile.TemporaryDirectory(prefix="integrate-snapshot-") as tmp:
            files = capture(name, Path(tmp))
        base = STORE / name
        shutil.rmtree(base, ignore_errors=True)
        for rel, text in files.items():
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_text(text)
        print(f"{name}: {len(files)} files")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--update"]:
        sys.exit(__doc__)
    update(sys.argv[2:])
