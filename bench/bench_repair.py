"""How long one `integrate repair` run takes, against the 5-minute target (issue: plan revisions and repair).

    python bench/bench_repair.py [--only CLASS ...] [--proof cp|tp|cache] [--max-candidates N] [--json]

For each model (default: the transformers in the installed diffusers that cache-dit does not register and whose
fixture runs; pass --only to pick), a config-only model folder is planned, approved as a scratch plan,
generated and repaired (the proofs given, cp and tp by default). Prints per model whether a proof failed,
how many candidates were tried, whether one passed, the seconds taken and the ratio to 300 s. A benchmark, not a
test: minutes per model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from integrate import api
from integrate.records import to_json

TARGET_S = 300.0
REVIEWER = "bench_repair (automatic: a scratch plan, not a human review)"


def _model_dir(base: Path, pipeline: str, transformer: str) -> Path:
    base.mkdir(parents=True)
    index = {"_class_name": pipeline, "_diffusers_version": "0", "transformer": ["diffusers", transformer]}
    (base / "model_index.json").write_text(json.dumps(index))
    return base


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=[], metavar="CLASS")
    ap.add_argument("--proof", nargs="*", default=["cp", "tp"], choices=["cache", "cp", "tp"])
    ap.add_argument("--max-candidates", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report = api.survey(progress=lambda line: None)
    rows = [r for r in report.rows if r.status == "ok" and r.transformer_class and r.analysed_pipeline
            and not (r.already_supported and r.already_supported.registered)
            and (not args.only or r.transformer_class in args.only)]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-repair-") as tmp:
        for i, row in enumerate(rows, 1):
            print(f"[{i}/{len(rows)}] {row.transformer_class}", file=sys.stderr, flush=True)
            base = Path(tmp) / row.transformer_class
            model = _model_dir(base / "model", row.analysed_pipeline, row.transformer_class)
            started = time.monotonic()
            try:
                api.write_plan(api.plan(api.flags_for(str(model)), probe=False), base / "plan")
                api.approve(base / "plan", REVIEWER)
                api.generate(base / "plan", out=base / "out")
                r = api.repair(base / "plan", base / "out", proofs=tuple(args.proof),
                               max_candidates=args.max_candidates)
            except Exception as exc:  # noqa: BLE001 - one model failing never stops the benchmark
                results.append({"class": row.transformer_class, "error": f"{type(exc).__name__}: {exc}"[:200],
                                "seconds": round(time.monotonic() - started, 1)})
                continue
            data = to_json(r)
            results.append({"class": row.transformer_class, "failing": data["failing"],
                            "tried": len(data["trials"]), "repaired": data["proposal"] is not None,
                            "repair_seconds": data["seconds"], "seconds": round(time.monotonic() - started, 1)})
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            if "error" in r:
                print(f"{r['class']:<40} error: {r['error']}")
                continue
            print(f"{r['class']:<40} failing {','.join(r['failing']) or '-':<8} tried {r['tried']:<2} "
                  f"repaired {'yes' if r['repaired'] else 'no ':<3}  {r['repair_seconds']} s "
                  f"(ratio to {TARGET_S:g} s: {r['repair_seconds'] / TARGET_S:.2f})")
    ran = [r for r in results if "error" not in r]
    failing = [r for r in ran if r["failing"]]
    print(f"\n{len(failing)} of {len(ran)} models failed a proof; repair made {sum(r['repaired'] for r in failing)} "
          f"pass; slowest repair {max((r['repair_seconds'] for r in ran), default=0):.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
