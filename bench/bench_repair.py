"""How long one `integrate repair` run takes, against the 5-minute target, and how many failing proofs it mends
(issue: plan revisions and repair).

    python bench/bench_repair.py [--only CLASS ...] [--tests DIR] [--separate-cfg yes|no] [--proof cp|tp|cache]
                                 [--max-candidates N] [--json]

The models and their fixtures are bench_unsupported's (the transformers in the installed diffusers that cache-dit
does not register; `--tests`: each model's diffusers test file supplies the fixture where it can, as there): each
is planned, approved as a scratch plan, generated (bench_unsupported's `verify_row` with the fixture only), and
repaired (the proofs given, cp and tp by default). A model whose fixture does not run is left out. Prints per model
whether a proof failed, how many candidates were tried, whether one passed and what it gives up (a module run
whole under CP), the seconds taken and the ratio to 300 s. A benchmark, not a test: minutes per model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench_unsupported import test_files, unsupported_rows

from integrate.records import to_json
from integrate.repair import repair
from integrate.survey.verify import verify_row

TARGET_S = 300.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=[], metavar="CLASS")
    ap.add_argument("--proof", nargs="*", default=["cp", "tp"], choices=["cache", "cp", "tp"])
    ap.add_argument("--max-candidates", type=int, default=8)
    ap.add_argument("--separate-cfg", choices=["yes", "no"], default="no",
                    help="the CFG style declared for models no pipeline uses (planned with --no-pipeline)")
    ap.add_argument("--tests", type=Path, metavar="DIR",
                    help="a checkout's tests/models/transformers: the fixture from each model's test file")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report, rows = unsupported_rows(args.only)
    tests = test_files(args.tests, {r.transformer_class for r in rows}) if args.tests else {}
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-repair-") as tmp:
        for i, row in enumerate(rows, 1):
            print(f"[{i}/{len(rows)}] {row.transformer_class}", file=sys.stderr, flush=True)
            base, given = Path(tmp) / row.transformer_class, tests.get(row.transformer_class)
            started = time.monotonic()
            made = verify_row(row, report.diffusers.version, Path(tmp), fixture_only=True, fixture_from=given,
                              separate_cfg=args.separate_cfg == "yes")
            if made.fixture not in ("derived", "edited"):
                results.append({"class": row.transformer_class, "left_out": f"fixture {made.fixture}: "
                                f"{to_json(made).get('why', '')}"[:200]})
                continue
            try:
                r = repair(base / "plan", base / "out", proofs=tuple(args.proof), max_candidates=args.max_candidates,
                           trust_code=given is not None, fixture_from=given)
            except Exception as exc:  # noqa: BLE001 - one model failing never stops the benchmark
                results.append({"class": row.transformer_class, "error": f"{type(exc).__name__}: {exc}"[:200],
                                "seconds": round(time.monotonic() - started, 1)})
                continue
            data = to_json(r)
            proposal = data["proposal"] or {}
            results.append({"class": row.transformer_class, "failing": data["failing"],
                            "tried": len(data["trials"]), "repaired": data["proposal"] is not None,
                            "costs": proposal.get("costs", []), "repair_seconds": data["seconds"],
                            "seconds": round(time.monotonic() - started, 1)})
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            if "error" in r or "left_out" in r:
                print(f"{r['class']:<40} {'error: ' + r['error'] if 'error' in r else 'left out: ' + r['left_out']}")
                continue
            print(f"{r['class']:<40} failing {','.join(r['failing']) or '-':<8} tried {r['tried']:<2} "
                  f"repaired {'yes' if r['repaired'] else 'no ':<3}  {r['repair_seconds']} s "
                  f"(ratio to {TARGET_S:g} s: {r['repair_seconds'] / TARGET_S:.2f})")
            for cost in r["costs"]:
                print(f"    gives up: {cost}")
    ran = [r for r in results if "failing" in r]
    failing = [r for r in ran if r["failing"]]
    whole = sum(bool(r["costs"]) for r in failing if r["repaired"])
    print(f"\n{len(failing)} of {len(ran)} models failed a proof; repair made {sum(r['repaired'] for r in failing)} "
          f"pass ({whole} of them by running a module whole under CP); slowest repair "
          f"{max((r['repair_seconds'] for r in ran), default=0):.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
