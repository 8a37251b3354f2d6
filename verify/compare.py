"""Numbers for the proofs: how far one run is from another, and where two runs first part ways.

A module's output in a parallel run may be a shard of the single-process one: split along the
sequence (CP: rank 0 holds the first half of each stream) or along the last dim (a column-wise TP
Linear). Shards are put back together before comparing; a joint sequence is put back stream by stream
([text_0, image_0, text_1, image_1] -> [text, image]). What cannot be lined up is listed as not
comparable, never counted as a match.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

ATOL = 1e-5
RTOL = 1e-4  # of the largest magnitude in the reference
TABLE_ROWS = 40


@dataclass(frozen=True)
class Figures:
    max_abs: float
    cosine: float
    rel_l2: float
    ok: bool

    def as_dict(self) -> dict:
        return {k: (round(v, 9) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def figures(ref: np.ndarray, got: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> Figures:
    ref64, got64 = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    diff = np.abs(ref64 - got64)
    finite = bool(np.isfinite(got64).all())
    max_abs = float(diff.max()) if diff.size else 0.0
    norm = float(np.linalg.norm(ref64) * np.linalg.norm(got64))
    cosine = float(ref64 @ got64 / norm) if norm > 0 else (1.0 if max_abs == 0 else 0.0)
    rel = float(np.linalg.norm(ref64 - got64) / max(np.linalg.norm(ref64), 1e-30))
    scale = float(np.abs(ref64).max()) if ref64.size else 0.0
    ok = finite and max_abs <= atol + rtol * scale
    return Figures(max_abs if finite else float("inf"), cosine if finite else 0.0, rel if finite else float("inf"),
                   ok)


def _candidates(ref_shape: tuple, shards: list[np.ndarray], streams: tuple[int, int] | None):
    """Ways to line the shards up with a reference of `ref_shape`."""
    first = shards[0]
    if first.shape == ref_shape:
        yield "replicated", first
    if len(shards) < 2 or any(s.shape != first.shape for s in shards):
        return
    world = len(shards)
    for d in range(first.ndim):
        if first.shape[d] * world != ref_shape[d] or first.shape[:d] + first.shape[d + 1:] != \
                ref_shape[:d] + ref_shape[d + 1:]:
            continue
        yield f"concat dim {d}", np.concatenate(shards, axis=d)
        if streams is None:
            continue
        for a, b in (streams, streams[::-1]):
            if a + b == ref_shape[d] and a % world == 0 and b % world == 0:
                la, lb = a // world, b // world
                def take(s, lo, hi, d=d):
                    return np.take(s, range(lo, hi), axis=d)
                parts = [take(s, 0, la) for s in shards] + [take(s, la, la + lb) for s in shards]
                yield f"joint dim {d}", np.concatenate(parts, axis=d)


def line_up(ref: np.ndarray, shards: list[np.ndarray], streams=None) -> tuple[str, Figures] | None:
    best = None
    for how, arr in _candidates(tuple(ref.shape), shards, streams):
        f = figures(ref, arr)
        if best is None or f.max_abs < best[1].max_abs:
            best = (how, f)
    return best


def divergence(base: dict[str, list[np.ndarray]], order: list[str], ranks: list[dict[str, list[np.ndarray]]],
               streams: tuple[int, int] | None = None) -> dict:
    """Module by module in the order the reference run finished them: the first that differs, and a
    per-layer table (top-level modules and blocks, plus the insides of the first divergent block)."""
    rows, first, incomparable = [], None, 0
    for path in order:
        if not all(path in r for r in ranks):
            continue
        worst = None
        for i, ref in enumerate(base[path]):
            shards = [r[path][i] for r in ranks if i < len(r[path])]
            if len(shards) != len(ranks):
                continue
            got = line_up(ref, shards, streams)
            if got is None:
                continue
            if worst is None or got[1].max_abs > worst[1].max_abs:
                worst = got
        if worst is None:
            incomparable += 1
            continue
        row = {"module": path, "how": worst[0], **worst[1].as_dict()}
        rows.append(row)
        if first is None and not worst[1].ok:
            first = row
    table = _table(rows, first)
    return {"first": first, "table": table, "compared": len(rows), "not_comparable": incomparable}


def _block_of(path: str) -> str:
    parts = path.split(".")
    for i in range(len(parts) - 1):
        if parts[i + 1].isdigit():
            return ".".join(parts[: i + 2])
    return parts[0]


def _table(rows: list[dict], first: dict | None) -> list[dict]:
    inside = _block_of(first["module"]) if first else None
    keep = [r for r in rows if _block_of(r["module"]) == r["module"]
            or (inside and r["module"].startswith(inside + "."))]
    if first is not None and len(keep) > TABLE_ROWS:
        at = next(i for i, r in enumerate(keep) if r["module"] == first["module"])
        keep = keep[max(0, at - TABLE_ROWS // 2): at + TABLE_ROWS // 2]
    return keep[:TABLE_ROWS]
