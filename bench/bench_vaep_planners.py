"""VAE-P planners for every diffusers VAE with a tiled_decode that the installed cache-dit does not register: per
class, the planner generate writes (or why none, with the line), and for each one written, a 2-process gloo run
against the one-process tiled decode (bench/_vaep_runner.py; tiny configs there): max abs diff, tiles per rank,
seconds.

    .venv/bin/python bench/bench_vaep_planners.py [--no-run] [Class ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _vaep_runner import CASES, run  # noqa: E402
from integrate.analyzers.encoders import vae_facts  # noqa: E402
from integrate.analyzers.registries import VAE_REGISTER, registrations  # noqa: E402
from integrate.templates import vae_planner  # noqa: E402

from integrate.resolve import Workspace  # noqa: E402


def classes(ws: Workspace) -> list[str]:
    """diffusers' VAE classes (models/autoencoders) whose source defines a `def tiled_decode`, read with libcst."""
    import libcst as cst

    root = ws.package_root("diffusers") / "diffusers" / "models" / "autoencoders"
    out = []
    for path in sorted(root.glob("*.py")):
        src = ws.load(path)
        out += [name for name, node in src.classes.items()
                if any(isinstance(f, cst.FunctionDef) and f.name.value == "tiled_decode" for f in node.body.body)]
    return out


def main(argv: list[str]) -> int:
    ws = Workspace()
    registry = registrations(ws, "autoencoders", VAE_REGISTER) or {}
    wanted = [a for a in argv if not a.startswith("--")] or [c for c in classes(ws) if c not in registry]
    generated = passed = 0
    for cls in wanted:
        facts = vae_facts(ws, None, {"vae": ["diffusers", cls]})
        made = vae_planner(ws, facts)
        if isinstance(made, str):
            print(f"{cls:34s} manual: {made}")
            continue
        generated += 1
        if "--no-run" in argv or cls not in CASES:
            print(f"{cls:34s} generated ({made[0]})" + ("" if cls in CASES else "; no tiny config to run it"))
            continue
        t = time.perf_counter()
        ranks = run(cls, made[1])
        errors = [r for r in ranks if "error" in r]
        if errors:
            print(f"{cls:34s} generated; run FAILED: {errors[0]['error'][-600:]}")
            continue
        diff = max(r["max_abs_diff"] for r in ranks)
        tiles = [r["counts"]["dealt"] for r in ranks]
        total = ranks[0]["counts"]["total"]
        ok = diff == 0.0 and all(n < total for n in tiles) and all(r["registered"] for r in ranks)
        passed += ok
        print(f"{cls:34s} generated; {'PASS' if ok else 'FAIL'}: max abs diff {diff:.3g}, tiles per rank {tiles} "
              f"of {total}, output {ranks[0]['shape']}, decode {max(r['seconds'] for r in ranks):.2f} s "
              f"(run {time.perf_counter() - t:.1f} s)")
    print(f"{generated} planners generated of {len(wanted)}; {passed} passed the 2-process check")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
