"""Cache: the generated adapter (and PatchFunctor) through cache-dit, in one process.

- each list's first block returns its streams in the order its ForwardPattern says (shapes tell them apart);
- the patched forward, and caching registered but off, are bit-identical to the plain model;
- caching on caches steps, with finite residual diffs, and each call stays within a few times the step's
  own move of the plain model (a cached step reuses the last step's residual: its error is of that order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..records import CacheProof, CachingOn, PatternCheck, PerBlockHooks, StateDictProof
from . import state_dict

if TYPE_CHECKING:
    import numpy as np

    from ..locate import Baseline

# numpy (compare, locate) is imported when a proof is judged: the CLI reads this registry at start-up

NAME = "cache"
ORDER = 20
KIND = "single"
RECORD = CacheProof  # the record in the report
REQUESTABLE = True
REPAIRS = ("ForwardPattern", "CFG")  # the plan decisions a repair may try another answer for
TITLE = "cache"
SUMMARY = "block contracts observed, caching off bit-identical, caching on really caching"
THRESHOLD = 0.8  # permissive: tiny random models change a lot between steps
CACHED_SLACK, CACHED_FLOOR = 3.0, 0.02  # a cached step may be off by a few times the step's own move
STEPS = 4


def judge(base: Baseline, rep: dict | None, arrays: dict, tail: str | None) -> dict:
    """{proof: record} of this process: the cache proof's, and the state-dict proof's judged from it."""
    sd, cache = _judged(base, rep, arrays, tail)
    return {state_dict.NAME: sd, NAME: cache}


def _judged(base: Baseline, rep: dict | None, arrays: dict, tail: str | None) -> tuple[StateDictProof, CacheProof]:
    import numpy as np

    from .. import compare
    from ..locate import compared, worker_error

    if rep is None:
        err = worker_error({"stage": "start", "module": None, "type": "NoReport", "message": tail or ""})
        return (StateDictProof("error", why=tail), CacheProof("error", why=tail, error=err))
    v = rep["variants"]["cache"]
    sd = state_dict.judge(base.report.get("state_dict", {}), v)
    if "error" in v and "patterns" not in v:
        err = worker_error(v["error"])
        return sd, CacheProof("error", why=f"{err.type}: {err.message}", error=err,
                              first_divergence=base.locate([arrays], "cache", err))
    fields: dict = {"block_counts": v.get("block_counts"), "has_separate_cfg": v.get("has_separate_cfg"),
                    "patterns": tuple(pattern_check(p) for p in v.get("patterns", []))}
    problems = [f"list {p.list}: {p.why}" for p in fields["patterns"] if p.status == "fail"]
    hooks = v.get("per_block") or {}
    if hooks.get("hooks"):
        fields["per_block"] = PerBlockHooks(hooks["hooks"], hooks["fired"], tuple(hooks["varying"]))
    if "cache/patched" in arrays:
        fields["patched_forward"] = compared(compare.figures(base.out, arrays["cache/patched"], rtol=0, atol=0))
    if "error" in v:
        err = worker_error(v["error"])
        place = err.module or (f"cache-dit's code after `{err.after}`" if err.after else err.stage)
        return sd, CacheProof("error", why=f"{err.type} in {place}: {err.message}", error=err,
                              first_divergence=base.locate([arrays], "cache", err), **fields)
    calls = v.get("calls_per_step", 1)
    ref = base.reference(STEPS, calls)
    off = compare.figures(ref, arrays["cache/out"], rtol=0, atol=0)
    fields["caching_off"] = compared(off)
    if off.max_abs != 0 and "cache/contiguous" in arrays:
        # the plain model with its block outputs made contiguous, as cache-dit's wrapper makes them: where the
        # cached model matches that bit for bit, the difference is that copy's float rounding
        contiguous = np.repeat(arrays["cache/contiguous"], calls, axis=0)[: STEPS * calls]
        if compare.figures(contiguous, arrays["cache/out"], rtol=0, atol=0).max_abs == 0:
            fields["caching_off_reference"] = "contiguous"
            ref = contiguous
            off = compare.figures(ref, arrays["cache/out"], rtol=0, atol=0)
    if off.max_abs != 0:
        problems.append(f"with caching off the output differs from the plain model (max-abs {off.max_abs:.3g})")
    fields["caching_on"], more = _caching_on(base, ref, v.get("stats", {}), arrays.get("cache/cached"), calls)
    problems += more
    if problems:
        return sd, CacheProof("fail", why="; ".join(problems), first_divergence=base.locate([arrays], "cache", None),
                              **fields)
    unproved = _per_block_unproved(fields.get("per_block"))
    if unproved:
        return sd, CacheProof("vacuous", why=unproved, **fields)
    return sd, CacheProof("pass", **fields)


def _per_block_unproved(hooks: PerBlockHooks | None) -> str | None:
    """Why the PatchFunctor's per-block hooks proved nothing (None: they ran, and some block got its own value)."""
    if hooks is None:
        return None
    if not hooks.fired:
        return (f"the PatchFunctor's {hooks.hooks} per-block hook(s) never ran: the per-block argument fix was not "
                "exercised")
    if not hooks.varying:
        return (f"the PatchFunctor's per-block hooks ran {hooks.fired} times, but every block received the same "
                "keyword values: the fixture's inputs never make the per-block argument differ (give it a value "
                "that does, in verify_fixture.py)")
    return None


def _caching_on(base: Baseline, ref: np.ndarray, stats: dict, cached: np.ndarray | None,
                calls: int) -> tuple[CachingOn, list[str]]:
    import numpy as np

    from .. import compare

    problems: list[str] = []
    on: dict = {"threshold": THRESHOLD, "cached_steps": tuple(stats.get("cached_steps", [])),
                "residual_diffs": tuple(round(d, 6) for d in stats.get("residual_diffs", [])),
                "finite": stats.get("finite", True)}
    if cached is not None:
        warm = compare.figures(ref[:calls], cached[:calls], rtol=0, atol=0)
        on["warmup_bitwise"] = warm.max_abs == 0
        if warm.max_abs != 0:
            problems.append("a warm-up step with caching on differs from the plain model")
        rels = [compare.figures(ref[i], cached[i]).rel_l2 for i in range(len(ref))]
        # how far the plain model's output moves from one step to the next: a cached step reuses the last
        # step's residual, so its error is of that order; a wrong residual is far beyond it
        out = base.out
        moves = [0.0] + [compare.figures(out[s - 1], out[s]).rel_l2 for s in range(1, len(out))]
        allowed = [CACHED_SLACK * moves[i // calls] + CACHED_FLOOR for i in range(len(ref))]
        on["rel_l2_per_call"] = tuple(round(r, 6) for r in rels)
        on["step_move_rel_l2"] = tuple(round(m, 6) for m in moves)
        on["max_rel_l2"] = round(max(rels), 6)
        on["finite_output"] = bool(np.isfinite(cached).all())
        worst = max(range(len(rels)), key=lambda i: rels[i] - allowed[i])
        if not on["finite_output"] or not on["finite"]:
            problems.append("non-finite values with caching on (an in-place write into a block input?)")
        elif rels[worst] > allowed[worst]:
            problems.append(f"with caching on, call {worst} is {rels[worst]:.3f} (relative L2) from the plain model, "
                            f"beyond {allowed[worst]:.3f} ({CACHED_SLACK:g} x the step's own move + "
                            f"{CACHED_FLOOR:g}): the cached residual is wrong")
    if not on["cached_steps"]:
        problems.append(f"no step was cached at threshold {THRESHOLD}: the cache is not engaged")
    return CachingOn(**on), problems


def pattern_check(p: dict) -> PatternCheck:
    """Does the first block of a list return its streams in the order the declared pattern says?"""
    from cache_dit.caching.forward_pattern import ForwardPattern

    pattern = ForwardPattern[p["pattern"]]
    seen_in, seen_out = p.get("in"), p.get("out")

    def check(status: str, why: str) -> PatternCheck:
        return PatternCheck(p["list"], p["pattern"], seen_in, seen_out, status, why)

    if seen_in is None or seen_out is None:
        return check("unknown", "the first block was not called")
    shapes = {"hidden_states": seen_in[0], "encoder_hidden_states": seen_in[1]}
    if shapes["hidden_states"] == shapes["encoder_hidden_states"]:
        return check("unknown", "both streams have the same shape: order not observable")
    if len(seen_out) < len(pattern.Out):
        return check("fail", f"{p['pattern']} returns {len(pattern.Out)} tensors, the block returned {len(seen_out)}")
    for i, name in enumerate(pattern.Out):
        want = shapes.get(name)
        if want is not None and seen_out[i] != want:
            other = next((n for n, s in shapes.items() if s == seen_out[i]), "neither stream")
            return check("fail", f"{p['pattern']} says output {i} is `{name}` {want}, the block returned "
                                 f"{seen_out[i]} (`{other}`)")
    return check("pass", "outputs come back in the declared order (shapes differ)")


def lines(record: dict) -> list[str]:
    """The terminal's lines on caching off and on, and each list's observed contract."""
    if "caching_on" not in record:
        return []
    on = record["caching_on"]
    out = [f"  caching off: {'bit-identical' if record['caching_off']['bitwise'] else 'differs'}; caching on: "
           f"steps {on['cached_steps']} cached, max relative drift {on.get('max_rel_l2')}"]
    out += [f"  list {p['list']} {p['pattern']}: {p['status']} ({p['why']})" for p in record.get("patterns", [])]
    hooks = record.get("per_block")
    if hooks:
        out.append(f"  per-block hooks: {hooks['hooks']} registered, ran {hooks['fired']} times; values differing "
                   f"per block: {', '.join(hooks['varying']) or 'none'}")
    return out


def details(record: dict) -> list[str]:
    """PR.md's figures of caching on: steps cached, the largest relative drift."""
    on = record.get("caching_on") if isinstance(record.get("caching_on"), dict) else {}
    return [f"{label} {on[key]:.3g}" if isinstance(on.get(key), float) else f"{label} {on[key]}"
            for key, label in (("cached_steps", "cached steps"), ("max_rel_l2", "max rel L2"))
            if on.get(key) is not None]
