"""TE-P and VAE-P proofs over the parts the installed diffusers pipelines name: per class, the planner that answers
(cache-dit's, the one `generate` writes, or none, and why), the proof's status, its seconds and the peak memory of its
processes.

    python bench/bench_components.py [--tep] [--vaep] [--only CLASS ...] [--json FILE]

Each class is proved as a user would prove it: a model folder (the MotifVideo example's transformer, whose
model_index.json names the class as its text encoder or VAE), `plan --no-probe`, `approve`, `generate`, then
`verify --proof tep` (or `vaep`). Class defaults give the configs (no weights, no config.json). Where cache-dit's TE-P
planner fails and the failure says the plan can be revised to write ours from the HF layer plan, the bench does so
(`revise --set text_encoders.0.planner=generate`) and proves again: both results are printed. Prints ratios against
the issue's targets: every proof <= 60 s, peak memory <= 2 GB.
"""

from __future__ import annotations

import argparse
import inspect
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "motif-video"
TARGET_S, TARGET_GB = 60.0, 2.0


def pipeline_parts() -> dict[str, set[str]]:
    """{"text_encoder": classes, "vae": classes} the `__init__` of every installed diffusers pipeline annotates."""
    import warnings

    import diffusers

    warnings.filterwarnings("ignore")
    found: dict[str, set[str]] = {"text_encoder": set(), "vae": set()}
    for name in dir(diffusers):
        if "Pipeline" not in name:
            continue
        try:
            cls = getattr(diffusers, name)
            params = inspect.signature(cls.__init__).parameters.values()
        except Exception:  # a pipeline whose optional dependency is missing
            continue
        for p in params:
            key = "text_encoder" if p.name.startswith("text_encoder") else "vae" if p.name == "vae" else None
            if key is None:
                continue
            for arg in typing.get_args(p.annotation) or (p.annotation,):
                cname = arg if isinstance(arg, str) else getattr(arg, "__name__", None)
                if cname and cname[:1].isupper() and not cname.endswith("PreTrainedModel") and cname != "NoneType":
                    found[key].add(cname.split(".")[-1].split(" ")[0])
    return found


def _library(cls: str) -> str | None:
    import diffusers
    import transformers

    for lib in (transformers, diffusers):
        try:
            if inspect.isclass(getattr(lib, cls, None)):
                return lib.__name__
        except Exception:
            continue
    return None


def prove(kind: str, cls: str, library: str, work: Path) -> dict:
    model = work / "model"
    shutil.copytree(EXAMPLE, model)
    index = json.loads((model / "model_index.json").read_text())
    index.pop("guider", None)
    index["text_encoder" if kind == "tep" else "vae"] = [library, cls]
    (model / "model_index.json").write_text(json.dumps(index))
    exe = [sys.executable, "-m", "integrate.cli"]

    def step(*args) -> subprocess.CompletedProcess:
        return subprocess.run([*exe, *args], capture_output=True, text=True, cwd=work)

    step.work = work

    step("plan", "model", "--out", "plan", "--no-probe")
    row = _proved(kind, cls, step)
    if kind == "tep" and row["status"] != "pass" and "integrate revise" in row.get("why", ""):
        # cache-dit's planner does not fit: the plan revised as the failure says, ours written from the HF plan
        step("revise", "plan", "--set", "text_encoders.0.planner=generate", "--why", "bench: cache-dit's failed",
             "--reviewer", "bench")
        ours = _proved(kind, cls, step)
        row.update(cache_dit={k: row[k] for k in ("status", "why", "planner")}, revised=True,
                   **{k: ours[k] for k in ("status", "why", "planner", "seconds", "peak_gb") if k in ours})
    return row


def _proved(kind: str, cls: str, step) -> dict:
    """approve, generate and verify the plan as it stands: the proof's row."""
    step("approve", "plan", "--reviewer", "bench")
    shutil.rmtree(step.work / "out", ignore_errors=True)
    step("generate", "plan", "--out", "out")
    started = time.monotonic()
    done = step("verify", "plan", "--generated", "out", "--proof", kind, "--json")
    seconds = time.monotonic() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    try:
        record = json.loads(done.stdout)[kind]
    except (ValueError, KeyError):
        return {"class": cls, "status": "error", "why": (done.stderr.strip().splitlines() or ["no output"])[-1],
                "seconds": round(seconds, 1)}
    run = (record.get("runs") or [{}])[0]
    return {"class": cls, "status": record["status"], "why": record.get("why", ""),
            "planner": run.get("planner", ""), "seconds": round(seconds, 1),
            "peak_gb": round(peak / 2**20, 2)}  # the largest process so far (ru_maxrss)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tep", action="store_true")
    ap.add_argument("--vaep", action="store_true")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    kinds = [k for k, on in (("tep", args.tep), ("vaep", args.vaep)) if on] or ["tep", "vaep"]
    parts = pipeline_parts()
    rows = []
    for kind in kinds:
        classes = sorted(parts["text_encoder" if kind == "tep" else "vae"])
        for cls in classes:
            if args.only and cls not in args.only:
                continue
            library = _library(cls)
            if library is None:
                rows.append({"kind": kind, "class": cls, "status": "skipped", "why": "not importable here"})
                continue
            with tempfile.TemporaryDirectory(prefix="bench-components-") as tmp:
                row = {"kind": kind, **prove(kind, cls, library, Path(tmp))}
            rows.append(row)
            print(f"{kind:5} {cls:42} {row['status']:8} {row.get('seconds', 0):6.1f} s "
                  f"{row.get('peak_gb', 0):5.2f} GB  {row.get('planner', '').split('.')[-1]:44} "
                  f"{row.get('why', '')[:160]}", flush=True)
            if row.get("revised"):
                print(f"      cache-dit's planner: {row['cache_dit']['status']}: {row['cache_dit']['why'][:200]}",
                      flush=True)
    for kind in kinds:
        mine = [r for r in rows if r["kind"] == kind]
        ran = [r for r in mine if r["status"] not in ("skipped",)]
        passed = [r for r in ran if r["status"] == "pass"]
        slowest = max((r.get("seconds", 0) for r in passed), default=0)
        heaviest = max((r.get("peak_gb", 0) for r in passed), default=0)
        revised = [r for r in mine if r.get("revised")]
        if revised:
            print(f"{kind}: cache-dit's planner failed on {len(revised)} ({', '.join(r['class'] for r in revised)}); "
                  f"with the plan revised to write ours from the HF layer plan, "
                  f"{sum(r['status'] == 'pass' for r in revised)} of them pass")
        print(f"{kind}: {len(passed)} pass of {len(ran)} proved ({len(mine)} classes, "
              f"{len(mine) - len(ran)} with no planner); slowest pass {slowest:.1f} s "
              f"(ratio to {TARGET_S:.0f} s: {slowest / TARGET_S:.2f}); peak memory of a process {heaviest:.2f} GB "
              f"(ratio to {TARGET_GB:.0f} GB: {heaviest / TARGET_GB:.2f})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
