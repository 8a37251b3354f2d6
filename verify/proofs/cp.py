"""Context parallelism: Ulysses over 2 gloo processes, with and without the cache, ring where no mask is
reordered (its CPU kernel may be missing: then `skipped`), Ulysses-anything when the plan calls for it (or
again with it, by `parallel.uneven_retries`, when the fixture's sequence does not divide by 2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..planned import not_written
from ..records import ParallelProof

if TYPE_CHECKING:
    from integrate.decisions.records import Plan

NAME = "cp"
ORDER = 30
KIND = "paired"
RECORD = ParallelProof  # the record in the report
REQUESTABLE = True
REPAIRS = ("CP",)  # the plan decisions a repair may try another answer for
TITLE = "context-parallel"
SUMMARY = "Ulysses (and ring) over 2 gloo processes against the 1-process run"


def not_planned(plan: Plan) -> str | None:
    """Why the generated plugin has no CP planner to prove (None: it has one)."""
    cp = plan.parallelism.cp
    if cp.blocked_by:
        return not_written("CP", cp.blocked_by)
    if not cp.plan:
        return "the plan has no CP hooks"
    return None


def variants(plan: Plan) -> list[dict]:
    cp = plan.parallelism.cp
    two = cp.ulysses_anything.get("2")
    anything = bool(two and two.needed)
    out = [{"name": "ulysses2", "ulysses": 2, "anything": anything},
           {"name": "ulysses2+cache", "ulysses": 2, "anything": anything, "cache": True, "bn": cp.cache_bn_min}]
    if not cp.mask_reorder.needed and not cp.ring_blocked_by:  # ring takes no mask in cache-dit
        out.append({"name": "ring2", "ring": 2})
    return out


def progress(variants: list[dict]) -> str:
    return "cp: Ulysses over 2 gloo processes" + (", then ring" if any("ring" in v for v in variants) else "")


def lines(record: dict) -> list[str]:
    return []  # its variants and what each engaged are shown as every paired proof's


def details(record: dict) -> list[str]:
    return []
