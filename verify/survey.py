"""`integrate survey --verify`: the CPU proof for survey rows, one model after another.

Each row's class gets a config-only model directory, then `plan --no-probe`, an approval recorded as
automatic (the survey's own scratch plan, never a human review), `generate` and `verify`, each as the
command a user would run. Rows of classes outside the installed diffusers, or without a pipeline, are
skipped with the reason. A verify run takes about half a minute on 2 cores; `--only` picks rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REVIEWER = "integrate survey --verify (automatic: a scratch plan for the survey, not a human review)"
PROOFS = ("state_dict", "cache", "cp", "tp")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "integrate.cli", *args], capture_output=True, text=True,
                          check=False)


def _last_line(proc: subprocess.CompletedProcess) -> str:
    return (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]


def verify_row(row: dict, diffusers_version: str | None, work: Path) -> dict:
    """The verify summary for one survey row: each proof's status, or why the row was not verified."""
    pipe = row.get("analysed_pipeline")
    if row["status"] != "ok":
        return {"status": "skipped", "why": "the row's analysis failed"}
    if not pipe:
        return {"status": "skipped", "why": "no pipeline uses the class: nothing to build a plan for"}
    if "site-packages" not in row["file"] and "dist-packages" not in row["file"]:
        return {"status": "skipped", "why": "not an installed package's class (run verify --trust-code yourself)"}
    base = work / row["transformer_class"]
    model = base / "model"
    model.mkdir(parents=True)
    index = {"_class_name": pipe, "_diffusers_version": diffusers_version or "0", "transformer":
             ["diffusers", row["transformer_class"]]}
    (model / "model_index.json").write_text(json.dumps(index))
    steps = [("plan", [str(model), "--out", str(base / "plan"), "--no-probe"]),
             ("approve", [str(base / "plan"), "--reviewer", REVIEWER]),
             ("generate", [str(base / "plan"), "--out", str(base / "out")])]
    for name, args in steps:
        done = _cli(name, *args)
        if done.returncode == 2 or (done.returncode == 1 and name != "generate"):
            return {"status": "error", "why": f"{name}: {_last_line(done)}"}
    done = _cli("verify", str(base / "plan"), "--generated", str(base / "out"), "--json")
    try:
        report = json.loads(done.stdout)
    except ValueError:
        return {"status": "error", "why": f"verify: {_last_line(done)}"}
    out = {k: report[k]["status"] for k in PROOFS}
    out["fixture"] = report["fixture"]["status"]
    firsts = {k: report[k]["first_divergence"]["module"] for k in PROOFS if report[k].get("first_divergence")}
    if firsts:
        out["first_divergence"] = firsts
    out["status"] = "pass" if done.returncode == 0 else "fail"
    out["seconds"] = report.get("seconds")
    return out


def verify_rows(data: dict, only: tuple[str, ...], progress: Callable[[str], None]) -> None:
    """Add `verify` to each row of a survey (in place); rows not in `only` (when given) are left out."""
    rows = [r for r in data["rows"] if not only or r["transformer_class"] in only]
    with tempfile.TemporaryDirectory(prefix="integrate-survey-verify-") as tmp:
        for i, row in enumerate(rows, 1):
            progress(f"verify [{i}/{len(rows)}] {row['transformer_class']}")
            row["verify"] = verify_row(row, data["diffusers"]["version"], Path(tmp))
