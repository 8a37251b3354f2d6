"""How long `integrate verify` takes on the shipped MotifVideo example, and its peak memory.

Targets (issue 5): at most 60 s per model on 2 cores, at most 2 GB peak memory. Prints the ratios
to those targets (below 1.0 meets them); the numbers come from this machine, whatever they are.

    python bench/bench_verify.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S, TARGET_GB = 60.0, 2.0


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "integrate.cli", *args], capture_output=True, text=True, check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="work here instead of a temporary folder")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-verify-"))
    plan, out = base / "plan", base / "out"
    for step in (["plan", str(ROOT / "examples" / "motif-video"), "--out", str(plan), "--no-probe"],
                 ["approve", str(plan), "--reviewer", "bench"], ["generate", str(plan), "--out", str(out)]):
        done = _cli(*step)
        if done.returncode not in (0, 1):
            sys.exit(f"{step[0]} failed: {done.stderr.strip().splitlines()[-1:]}")
    (out / "verify_fixture.py").unlink(missing_ok=True)  # derive it: part of a first run
    start = time.perf_counter()
    done = _cli("verify", str(plan), "--generated", str(out), "--json")
    seconds = time.perf_counter() - start
    # the largest resident set of any process verify started (each proof runs in its own)
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 / 1024
    report = json.loads(done.stdout)
    print(f"verify MotifVideo (exit {done.returncode}): "
          + ", ".join(f"{k} {report[k]['status']}" for k in ("state_dict", "cache", "cp", "tp")))
    print(f"wall time     {seconds:6.1f} s   ratio to {TARGET_S:.0f} s target: {seconds / TARGET_S:.2f}")
    # at most two proof processes run at once (the gloo pairs), so the machine's peak is at most twice that
    print(f"peak process  {peak_gb:6.2f} GB  (two at once: {2 * peak_gb:.2f} GB)  ratio of that to the "
          f"{TARGET_GB:.0f} GB target: {2 * peak_gb / TARGET_GB:.2f}")


if __name__ == "__main__":
    main()
