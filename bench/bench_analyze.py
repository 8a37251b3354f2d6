"""Speed of `integrate analyze`, printed as ratios (targets: cold <= 1.5x parse, warm <= 0.3 s).

cold  = gate + analysis in a fresh process-level workspace, without the result cache
parse = libcst.parse_module over exactly the files that analysis read
warm  = the whole `integrate analyze --json` command with the content-keyed cache filled

Usage: python bench/bench_analyze.py [MODEL_DIR ...]   (default: the shipped MotifVideo example)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parent.parent


def best(fn, repeat=5):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times)


def main() -> None:
    from integrate import api

    targets = sys.argv[1:] or [str(ROOT / "examples" / "motif-video")]
    cache = tempfile.mkdtemp()
    for target in targets:
        flags = api.flags_for(target)
        result = api.analysis_json(flags, use_cache=False)
        files = result["files_read"]
        texts = [Path(f).read_text() for f in files]
        cold, _ = best(lambda: api.analysis_json(flags, use_cache=False))
        parse, _ = best(lambda: [cst.parse_module(t) for t in texts])
        env = dict(os.environ, INTEGRATE_CACHE_DIR=cache)
        cmd = [sys.executable, "-m", "integrate.cli", "analyze", target, "--json"]
        subprocess.run(cmd, env=env, capture_output=True, check=True)  # fill the cache
        warm, _ = best(lambda: subprocess.run(cmd, env=env, capture_output=True, check=True))
        print(f"{Path(target).name}: files={len(files)} parse={parse:.3f}s cold={cold:.3f}s "
              f"cold/parse={cold / parse:.2f}x (target <= 1.5x)  warm_command={warm:.3f}s (target <= 0.3 s)")


if __name__ == "__main__":
    main()
