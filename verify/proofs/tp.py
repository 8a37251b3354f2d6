"""Tensor parallelism: 2 gloo processes with the device mesh on "cpu", with and without the cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..planned import not_written
from ..records import ParallelProof

if TYPE_CHECKING:
    from integrate.decisions.records import Plan

NAME = "tp"
ORDER = 40
KIND = "paired"
RECORD = ParallelProof  # the record in the report
REQUESTABLE = True
REPAIRS = ("TP",)  # the plan decisions a repair may try another answer for
TITLE = "tensor-parallel"
SUMMARY = "TP over 2 gloo processes against the 1-process run"


def not_planned(plan: Plan) -> str | None:
    """Why the generated plugin has no TP planner to prove (None: it has one)."""
    tp = plan.parallelism.tp
    if tp.blocked_by:
        return not_written("TP", tp.blocked_by)
    return None if tp.block_lists else "the plan has no TP block lists"


def variants(plan: Plan) -> list[dict]:
    return [{"name": "tp2", "tp": 2}, {"name": "tp2+cache", "tp": 2, "cache": True}]


def progress(variants: list[dict]) -> str:
    return "tp: 2 gloo processes, device mesh on cpu"


def lines(record: dict) -> list[str]:
    return []  # its variants and what each engaged are shown as every paired proof's


def details(record: dict) -> list[str]:
    return []
