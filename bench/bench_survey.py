"""Speed of `integrate survey`, printed as a ratio (target: cold <= 1.2x parse).

cold   = the whole `integrate survey --json` command with an empty result cache (a process pool
         over every core, default --jobs), as a person runs it
parse  = libcst.parse_module, in one process, over exactly the files that survey parsed with
         libcst (its `files_read`: transformer, block, attention, pipeline and cache-dit files)
warm   = the same command again with the cache it just filled
cpu    = user + system time of the cold command and its workers (all cores together)

The pipeline index (which pipeline names which transformer in its __init__) is read with `ast`,
not libcst; those files are not in the parse baseline, their `ast` time is in `cold`.

Usage: python bench/bench_survey.py [--repeat N] [--path DIR ...]   (repeat defaults to 3)
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import libcst as cst


def timed(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--path", action="append", default=[])
    args = parser.parse_args()
    extra = [a for p in args.path for a in ("--path", p)]
    cmd = [sys.executable, "-m", "integrate.cli", "survey", "--json", *extra]

    cpu = []

    def cold():
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        with tempfile.TemporaryDirectory() as cache:
            proc = subprocess.run(cmd, env=dict(os.environ, INTEGRATE_CACHE_DIR=cache), capture_output=True,
                                  text=True, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        return json.loads(proc.stdout)

    load = os.getloadavg()[0]
    # Cold runs and parse runs alternate, so other work on the machine slows both alike.
    cold_s, data = timed(cold, 1)
    files = data["files_read"]
    texts = [Path(f).read_text() for f in files]
    parse_s, _ = timed(lambda: [cst.parse_module(t) for t in texts], 1)
    for _ in range(args.repeat - 1):
        cold_s = min(cold_s, timed(cold, 1)[0])
        parse_s = min(parse_s, timed(lambda: [cst.parse_module(t) for t in texts], 1)[0])
    indexed = [Path(f).read_text() for f in data["pipeline_files_indexed"]]
    ast_s, _ = timed(lambda: [ast.parse(t) for t in indexed], args.repeat)
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, INTEGRATE_CACHE_DIR=cache)
        subprocess.run(cmd, env=env, capture_output=True, check=True)  # fill the cache
        warm_s, _ = timed(lambda: subprocess.run(cmd, env=env, capture_output=True, check=True), args.repeat)
    ratio = cold_s / parse_s
    rows, errors = len(data["rows"]), sum(r["status"] == "error" for r in data["rows"])
    size = sum(len(t) for t in texts) / 1e6
    verdict = "meets" if ratio <= 1.2 else "ABOVE"
    print(f"survey: rows={rows} errors={errors} jobs={os.cpu_count()} libcst_files={len(files)} ({size:.1f} MB) "
          f"parse={parse_s:.2f}s cold={cold_s:.2f}s cold/parse={ratio:.2f}x ({verdict} target <= 1.2x)  "
          f"warm_command={warm_s:.2f}s  (ast index of {len(indexed)} pipeline files: {ast_s:.2f}s, inside cold)")
    print(f"  cold CPU time, all processes: {min(cpu):.2f}s = {min(cpu) / parse_s:.2f}x parse; load average "
          f"{load:.2f} before the run (other work on the machine slows `cold`, which needs every core)")


if __name__ == "__main__":
    main()
