"""plan -> approve -> generate -> verify over every transformer in the installed diffusers that the installed
cache-dit does not register: the models `integrate` exists for.

    python bench/bench_unsupported.py [--fixture-only] [--only CLASS ...] [--tests DIR] [--separate-cfg yes|no]
                                      [--registered] [--hybrid] [--json]

Each model gets a config-only model directory (its class defaults stand in for a real config), then the
same steps `integrate survey --verify` runs, one model after another; a model no pipeline uses is planned
transformer-only (`--no-pipeline`, with `--separate-cfg` as given here: no by default). Prints, per model, the fixture's
status and source and each proof's status; then the pass counts (with how many were skipped, needs-code,
failed or errored beside them), and the median and maximum time per model. That model-folder-only run is the
headline: it is what a user with a model folder gets.
`--tests DIR` (a checkout's tests/models/transformers) runs each model a second time with the diffusers test file
that imports its class (`verify --fixture-from`, which runs that file) and prints, beside the headline, per model what
the test file changes and why the folder's run did not get there, then the same counts with --tests. It needs
the checkout's whole `tests/` folder (the files import `..testing_utils`) and `pip install -e ".[bench]"` (they
import accelerate); where a file cannot be imported the fixture comes from the other sources (the row's fixture
source says which).
`--registered` runs the models cache-dit does register instead (our own integration of each, as `audit` makes
it), for the fixture target on supported models.
`--hybrid` then runs `verify --proof hybrid` (Ulysses 2 x TP 2 over 4 gloo processes) on each model whose CP and TP
both pass, and prints how many of those pass it, each proof's time and the peak memory of its worker processes
together (the sum of their proportional set sizes, sampled every 0.1 s).
A benchmark, not a test: it takes minutes (about half a minute per model on 2 cores, a few seconds each with
--fixture-only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from integrate import api
from integrate.records import to_json
from integrate.survey import run_survey
from integrate.survey.verify import verify_row


def unsupported_rows(only: list[str], registered: bool = False):
    """The survey's rows cache-dit does not register (`registered`: those it does, with a pipeline)."""
    report = run_survey([], progress=lambda line: None)
    rows = [r for r in report.rows if r.status == "ok" and r.transformer_class
            and bool(r.already_supported and r.already_supported.registered) == registered
            and (r.analysed_pipeline or not registered)]
    if only:
        rows = [r for r in rows if r.transformer_class in only]
    return report, rows


def test_files(folder: Path, classes: set[str]) -> dict[str, Path]:
    """{class: the test file that imports it}, the imports read with libcst (the files are never run here)."""
    import libcst as cst

    found: dict[str, Path] = {}
    for path in sorted(folder.glob("test_models_*.py")):
        try:
            module = cst.parse_module(path.read_text())
        except (cst.ParserSyntaxError, UnicodeDecodeError):
            continue
        names = {a.evaluated_name for stmt in module.body if isinstance(stmt, cst.SimpleStatementLine)
                 for small in stmt.body if isinstance(small, cst.ImportFrom) and not isinstance(small.names,
                                                                                                cst.ImportStar)
                 for a in small.names}
        for cls in sorted(names & classes):
            found.setdefault(cls, path)
    return found


def _pss(root: int) -> int:
    """The proportional set size, in bytes, of every process under `root`, not `root` itself (forked workers share
    pages)."""
    import os

    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            total += sum(int(line.split()[1]) * 1024 for line in open(f"/proc/{pid}/smaps_rollup")
                         if line.startswith("Pss:"))
        except (OSError, ValueError):
            continue
    return total


def hybrid(work: Path, row, fixture_from: Path | None) -> dict:
    """`verify --proof hybrid` on the row's plan and plugin as verify_row left them: status, why, seconds and the
    peak memory (GiB) of its workers together (the fork server and the ranks; this process, which holds the survey,
    is left out: `integrate verify`'s own process is about 0.4 GB)."""
    import os
    import threading

    base = work / row.transformer_class
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            peak[0] = max(peak[0], _pss(os.getpid()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        report = to_json(api.verify(base / "plan", base / "out", proofs=("hybrid",), fixture_from=fixture_from,
                                    trust_code=fixture_from is not None))["hybrid"]
    except Exception as exc:  # noqa: BLE001 - one row failing never stops the benchmark
        report = {"status": "error", "why": f"{type(exc).__name__}: {exc}"}
    finally:
        done.set()
        sampler.join()
    engaged = [v["engaged"] for v in (report.get("variants") or {}).values() if v.get("engaged")]  # those that ran
    return {"status": report["status"], "why": report.get("why", ""), "config": report.get("config"),
            "both_engaged": bool(engaged) and all(e.get("tp", {}).get("sharded") and (
                e.get("cp", {}).get("split") or e.get("cp", {}).get("local_inputs")) for e in engaged),
            "seconds": round(time.monotonic() - started, 1), "peak_gib": round(peak[0] / 2**30, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture-only", action="store_true", help="derive the fixture and run the plain model only")
    ap.add_argument("--only", nargs="*", default=[], metavar="CLASS")
    ap.add_argument("--registered", action="store_true",
                    help="the models cache-dit does register instead (our integration, generated as for any model)")
    ap.add_argument("--hybrid", action="store_true",
                    help="then `verify --proof hybrid` on each model whose CP and TP both pass")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--separate-cfg", choices=["yes", "no"], default="no",
                    help="the CFG style declared for models no pipeline uses (planned with --no-pipeline)")
    ap.add_argument("--tests", type=Path, metavar="DIR",
                    help="a checkout's tests/models/transformers: each model's test file is tried first "
                         "(--fixture-from; it is run)")
    args = ap.parse_args()
    report, rows = unsupported_rows(args.only, args.registered)
    tests = test_files(args.tests, {r.transformer_class for r in rows}) if args.tests else {}
    folder: list[dict] = []
    beside: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-unsupported-") as tmp:
        for i, row in enumerate(rows, 1):
            print(f"[{i}/{len(rows)}] {row.transformer_class}", file=sys.stderr, flush=True)
            folder.append(one(row, report, Path(tmp) / "folder", None, args))
            test_file = tests.get(row.transformer_class)
            if test_file is not None:
                print(f"[{i}/{len(rows)}] {row.transformer_class} with {test_file.name}", file=sys.stderr, flush=True)
                beside[row.transformer_class] = one(row, report, Path(tmp) / "tests", test_file, args)
    if args.json:
        print(json.dumps({"model_folder": folder, "tests": beside if args.tests else None}, indent=2, default=str))
        return 0
    print("== model folder only (config-only folder, no hand edit): the headline ==")
    for r in folder:
        show(r, args.fixture_only)
    summary(folder, args, "model folder only")
    if args.tests:
        print(f"\n== with --tests {args.tests} beside it: per model, what the test file changes ==")
        for r in folder:
            print(f"{r['class']:<40} {difference(r, beside.get(r['class']), args.fixture_only)}")
        summary([beside.get(r["class"], r) for r in folder], args,
                f"with --tests (the model folder's result where no test file imports the class: "
                f"{sum(r['class'] not in beside for r in folder)})")
    return 0


def one(row, report, work: Path, fixture_from: Path | None, args) -> dict:
    """plan -> approve -> generate -> verify of one row (and the hybrid proof, where CP and TP pass)."""
    started = time.monotonic()
    v = verify_row(row, report.diffusers.version, work, fixture_only=args.fixture_only, fixture_from=fixture_from,
                   separate_cfg=args.separate_cfg == "yes")
    data = to_json(v)
    out = {"class": row.transformer_class, "status": v.status, "why": data.get("why", ""),
           "fixture": data.get("fixture"), "fixture_source": data.get("fixture_source"),
           **{p: data.get(p) for p in PROOFS}, "seconds": round(time.monotonic() - started, 1)}
    if args.hybrid and data.get("cp") == data.get("tp") == "pass":
        out["hybrid"] = hybrid(work, row, fixture_from)
    return out


PROOFS = ("cache", "cp", "tp")


def show(r: dict, fixture_only: bool) -> None:
    proofs = "" if fixture_only else "".join(f"  {p} {r[p]}" for p in PROOFS)
    print(f"{r['class']:<40} {r['status']:<8} fixture {r['fixture']} ({r['fixture_source']}){proofs}  {r['seconds']} s")
    if r["why"]:
        print(f"    {r['why'][:200]}")
    if "hybrid" in r:
        h = r["hybrid"]
        print(f"    hybrid {h['status']} (both engaged: {h['both_engaged']}) {h['seconds']} s, "
              f"peak {h['peak_gib']} GiB" + (f": {h['why'][:200]}" if h["why"] else ""))


def difference(folder: dict, tests: dict | None, fixture_only: bool) -> str:
    """What the test file changes for one model, in words: the fields that differ, and why the folder's run did
    not get there (its own reason), or that both agree."""
    if tests is None:
        return "no test file imports the class: the model folder's result stands"
    keys = ("fixture",) + (() if fixture_only else PROOFS)
    changed = [f"{k} {folder[k]} -> {tests[k]}" for k in keys if folder[k] != tests[k]]
    sources = f"fixture from {folder['fixture_source']} / {tests['fixture_source']}"
    if not changed:
        return f"same ({sources}; {folder['seconds']} s / {tests['seconds']} s)"
    why = f"; the folder's run: {folder['why'][:160]}" if folder["why"] else ""
    return f"{', '.join(changed)} ({sources}){why}"


def summary(results: list[dict], args, label: str) -> None:
    ran = [r for r in results if r["fixture"] in ("derived", "edited")]
    times = [r["seconds"] for r in results] or [0.0]
    which = "registered" if args.registered else "not registered"
    print(f"\n[{label}] {len(results)} models {which} by cache-dit; the plain model ran on the fixture of "
          f"{len(ran)}")
    for source in sorted({str(r["fixture_source"]) for r in ran}):
        print(f"  fixture from {source}: {sum(str(r['fixture_source']) == source for r in ran)}")
    if not args.fixture_only:
        for proof in PROOFS:
            counts = {s: sum(r[proof] == s for r in results)
                      for s in ("pass", "skipped", "needs-code", "fail", "error")}
            rest = ", ".join(f"{n} {s}" for s, n in counts.items() if n and s != "pass")
            print(f"  {proof}: {counts['pass']} pass" + (f" ({rest})" if rest else ""))
    tried = [r["hybrid"] for r in results if "hybrid" in r]
    if args.hybrid and tried:
        counts = {s: sum(h["status"] == s for h in tried) for s in ("pass", "skipped", "vacuous", "fail", "error")}
        rest = ", ".join(f"{n} {s}" for s, n in counts.items() if n and s != "pass")
        print(f"  hybrid: {counts['pass']} pass of {len(tried)} with CP and TP both passing" + (f" ({rest})" if rest
              else "") + f"; per proof median {statistics.median(h['seconds'] for h in tried):.1f} s, max "
              f"{max(h['seconds'] for h in tried):.1f} s; peak {max(h['peak_gib'] for h in tried):.2f} GiB")
    slowest = max(results, key=lambda r: r["seconds"]) if results else None
    print(f"  time per model (model folder to the last proof): median {statistics.median(times):.1f} s, max "
          f"{max(times):.1f} s" + (f" ({slowest['class']})" if slowest else ""))


if __name__ == "__main__":
    sys.exit(main())
