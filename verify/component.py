"""The component proofs' parent side (TE-P, VAE-P): which parts of the pipeline a proof runs, their processes, and
the verdict. Each part runs in `WORLD` gloo processes of its own (verify/components/ is their code); a part's 1-process
reference is computed on every rank before its planner is applied, so no baseline process is needed.

A part's config comes from the model folder (`<component>/config.json`), else from its class's defaults; the
worker shrinks it. A class from a package that is not installed is model code: it runs only with --trust-code.
"""

from __future__ import annotations

import json
from pathlib import Path

from integrate.errors import InputError

from . import processes
from .records import ComponentProof, ComponentRun, Figures, WorkerError

WORLD = 2
TRUSTED = ("transformers", "diffusers")  # libraries whose classes run without --trust-code (installed packages)


def config_of(model_path: str | None, component: str) -> dict | None:
    """`<model>/<component>/config.json` as a dict, or None where the folder has none (the class defaults serve)."""
    if not model_path:
        return None
    path = Path(model_path) / component / "config.json"
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not a JSON config ({exc.__class__.__name__})") from None
    if not isinstance(value, dict):
        raise InputError(f"{path}: not a JSON object")
    return value


def job(proof: str, part: dict, model_path: str | None, plugin: dict | None, trust_code: bool) -> dict:
    library = part["library"] or ""
    if library not in TRUSTED and not trust_code:
        raise InputError(f"{part['component']}: `{part['cls']}` comes from `{library}`, not an installed library "
                         "verify trusts: the proof would run it; pass --trust-code if you trust that code")
    return {"mode": "component", "proof": proof, "component": part["component"], "library": library,
            "cls": part["cls"], "module": part.get("module"), "config": config_of(model_path, part["component"]),
            "plugin": plugin, "hint": part.get("hint")}


def run(proof, parts: list[dict], model_path: str | None, plugin: dict | None, trust_code: bool, env: dict,
        paths, work: Path, progress) -> ComponentProof:
    """Every part's processes, one part after another, and the proof's verdict."""
    jobs = [job(proof.NAME, part, model_path, plugin, trust_code) for part in parts]
    runs = []
    for i, j in enumerate(jobs):
        progress(f"{proof.NAME}: {j['component']} `{j['cls']}` over {WORLD} gloo processes")
        out = work / f"{proof.NAME}-{i}"
        out.mkdir(parents=True, exist_ok=True)
        j = dict(j, out=str(out.absolute()))
        port = processes.free_port()
        procs = [processes.spawn(j, dict(env, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(WORLD),
                                         MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)), paths, fork=True)
                 for r in range(WORLD)]
        tails = processes.wait(procs)
        reports = []
        for r in range(WORLD):
            f = out / f"rank{r}.json"
            reports.append(json.loads(f.read_text()) if f.is_file() else None)
        runs.append(judge_run(proof, j, reports, tails))
    return verdict(runs)


def judge_run(proof, job: dict, reports: list[dict | None], tails: list) -> ComponentRun:
    head = {"component": job["component"], "cls": job["cls"]}
    rep = reports[0]
    if rep is None:
        tail = next((t for t in tails if t), None) or "no report"
        return ComponentRun(**head, status="error", why=f"rank 0 wrote no report: {tail.strip()[-300:]}")
    fields = {k: rep[k] for k in ("planner", "config_from", "world", "seconds") if k in rep}
    if "error" in rep:
        e = rep["error"]
        hint = f" ({job['hint']})" if job.get("hint") and e["stage"] != "build the tiny text encoder" else ""
        return ComponentRun(**head, **fields, status="error", why=f"{e['stage']}: {e['type']}: {e['message']}{hint}",
                            error=WorkerError(**{**e, "trace": tuple(e.get("trace", ()))}))
    other = next((r for r in reports[1:] if r is None or "error" in r), "none")
    if other != "none":
        why = "a rank wrote no report" if other is None else f"rank {other['rank']}: {other['error']['message']}"
        return ComponentRun(**head, **fields, status="error", why=why)
    figures = Figures(**rep["figures"])
    engaged, why_not = proof.engaged(rep, reports)
    extra = {k: rep[k] for k in ("untiled", "seams") if k in rep}
    fd = rep.get("first_divergence")
    if not figures.ok:
        where = f" (first divergent module: {fd['module']})" if fd and fd.get("module") else ""
        status, why = "fail", f"max |diff| {figures.max_abs:.3g} against the 1-process run{where}"
    elif not engaged:
        status, why = "vacuous", f"the outputs agree, but {why_not}"
    elif extra.get("seams") and not extra["seams"].get("ok", True):
        status, why = "fail", f"the tile borders differ: {extra['seams'].get('why')}"
    else:
        status, why = "pass", proof.passed(rep)
    if status != "pass" and job.get("hint"):
        why += f" ({job['hint']})"
    return ComponentRun(**head, **fields, status=status, why=why, figures=figures, engaged=proof.evidence(rep),
                        **({"first_divergence": fd} if fd else {}), **extra)


def verdict(runs: list[ComponentRun]) -> ComponentProof:
    """The proof's status: the worst of its parts' (error, fail, vacuous, then pass)."""
    order = ("error", "fail", "vacuous", "pass")
    worst = min(runs, key=lambda r: order.index(r.status) if r.status in order else 0)
    bad = [r for r in runs if r.status != "pass"]
    why = "; ".join(f"{r.component} `{r.cls}`: {r.why}" for r in (bad or runs))
    return ComponentProof(status=worst.status, why=why, runs=tuple(runs))
