"""The CPU proofs, one module each, and their registry (its order is the report's).

- `state_dict`: the plugin's import and the PatchFunctor keep every parameter (judged from the cache run)
- `cache`: block contracts observed, caching off bit-identical, caching on really caching
- `cp`, `tp`: over 2 gloo processes, each configuration (`variants(plan)`) against the 1-process run
- `full_size`: the real config on the meta device (cached list lengths, head divisibility); no fixture

Each module has NAME (its key in the report), REQUESTABLE (a `--proof` choice) and SUMMARY; a paired
proof (its own pair of processes) also has `variants(plan)` and `progress(variants)`, and is judged by
`parallel.judge`. A new proof is a module here plus its place in ALL.
"""

from __future__ import annotations

from . import cache, cp, full_size, state_dict, tp

ALL = (state_dict, cache, cp, tp, full_size)
REPORTED = tuple(p.NAME for p in ALL)
CHOICES = tuple(p.NAME for p in ALL if p.REQUESTABLE)
PAIRED = tuple(p for p in ALL if hasattr(p, "variants"))

__all__ = ["ALL", "CHOICES", "PAIRED", "REPORTED"]
