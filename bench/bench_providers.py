"""What libcst's metadata providers would cost the analysis, against what it uses instead (printed as ratios).

The analysers need three things libcst can provide: start lines (PositionProvider), "which assignment fed
this name" (ScopeProvider's accesses and assignments), and qualified names of imported classes
(QualifiedNameProvider). They use instead: one regeneration pass for lines (`SourceFile.line`), the
def-use index (`integrate.defuse`) and the import table (`Workspace.qualname`). This times each on the
same files, as multiples of libcst's own parse of those files.

Usage: python bench/bench_providers.py [FILE.py ...]   (default: the five largest diffusers transformer files)
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider, ScopeProvider


def best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def files() -> list[Path]:
    if sys.argv[1:]:
        return [Path(p) for p in sys.argv[1:]]
    from integrate.resolve import Workspace

    root = Workspace().package_root("diffusers") / "diffusers" / "models" / "transformers"
    return sorted(root.glob("transformer_*.py"), key=lambda p: -p.stat().st_size)[:5]


def main() -> None:
    from integrate.defuse import DefUse
    from integrate.source import parse_source
    from integrate.syntax import find_all

    paths = files()
    texts = [p.read_text() for p in paths]
    parse = best(lambda: [cst.parse_module(t) for t in texts])

    def ours():
        for p, t in zip(paths, texts):
            src = parse_source(p, t)
            src.line(src.module)  # the line table
            for fn in find_all(src.module, cst.FunctionDef, skip_functions=False):
                DefUse(src, fn)

    def providers(*kinds):
        def run():
            for t in texts:
                MetadataWrapper(cst.parse_module(t)).resolve_many(kinds)
        return run

    rows = [("parse (libcst)", parse),
            ("ours: parse + lines + def-use of every function", best(ours)),
            ("parse + PositionProvider", best(providers(PositionProvider))),
            ("parse + ScopeProvider", best(providers(ScopeProvider))),
            ("parse + Scope + QualifiedName", best(providers(ScopeProvider, QualifiedNameProvider))),
            ("parse + Position + Scope + QualifiedName",
             best(providers(PositionProvider, ScopeProvider, QualifiedNameProvider)))]
    size = sum(len(t) for t in texts) / 1e6
    print(f"{len(paths)} files, {size:.2f} MB: {', '.join(p.name for p in paths)}")
    for name, seconds in rows:
        print(f"  {name:<45} {seconds:7.3f} s  {seconds / parse:5.2f}x parse")
    print(f"  median parse per file: {statistics.median(best(lambda t=t: cst.parse_module(t), 1) for t in texts):.3f} s")


if __name__ == "__main__":
    main()
