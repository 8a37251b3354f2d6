"""Hybrid parallelism, the skill's last parallel phase: Ulysses 2 x TP 2 over 4 gloo processes, with and without the
cache, against the 1-process run. Each of CP and TP must have acted in the same run (a tensor split and a parameter
sharded), or the variant is `vacuous`. Four processes on a tiny model: run when asked (`--proof hybrid`), as the
phase follows CP and TP each passing on their own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..records import ParallelProof
from ..tiny import more_heads
from . import cp, tp

if TYPE_CHECKING:
    from integrate.decisions.records import Plan

NAME = "hybrid"
ORDER = 45
KIND = "paired"
RECORD = ParallelProof  # the record in the report
REQUESTABLE = True
BY_DEFAULT = False  # four processes: proved when asked, after CP and TP pass on their own
REPAIRS = ()  # its decisions are CP's and TP's: repair those proofs
TITLE = "hybrid (Ulysses x TP)"
SUMMARY = "Ulysses 2 x TP 2 over 4 gloo processes against the 1-process run"
WORLD = 4


def not_planned(plan: Plan) -> str | None:
    """Why there is no hybrid to prove: the plugin lacks the CP or the TP planner."""
    missing = [f"{name.upper()}: {why}" for name, why in (("cp", cp.not_planned(plan)), ("tp", tp.not_planned(plan)))
               if why]
    return "; ".join(missing) or None


def config(fixture_config: dict) -> dict | str:
    """The tiny config's changes this proof runs on (and its own 1-process run too): twice the heads of half the
    head dim, so that TP 2 then Ulysses 2 each cut them (the fixture's 2 heads cut once only); the widths, and so
    the inputs, stay. A string: why the fixture gives no such config."""
    return more_heads(fixture_config)


def variants(plan: Plan) -> list[dict]:
    c = plan.parallelism.cp
    two = c.ulysses_anything.get("2")
    anything = bool(two and two.needed)
    both = {"ulysses": 2, "tp": 2, "anything": anything, "world": WORLD}
    return [{"name": "ulysses2xtp2", **both}, {"name": "ulysses2xtp2+cache", **both, "cache": True,
                                               "bn": c.cache_bn_min}]


def progress(variants: list[dict]) -> str:
    return f"hybrid: Ulysses 2 x TP 2 over {WORLD} gloo processes, device mesh on cpu"


def lines(record: dict) -> list[str]:
    return []  # its variants and what each engaged are shown as every paired proof's


def details(record: dict) -> list[str]:
    return []
