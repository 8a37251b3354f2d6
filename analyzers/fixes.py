"""What a rule asks to be changed for one of its findings: frozen, data-only records.

A rule's `fix(ctx, finding)` returns one of these; generate hands the records to the PatchFunctor's
rewrite (templates/forward_patch.py), which applies each one it can and says which it applied. A finding
whose record was not applied, or whose rule answers `Manual`, is left to the hand-written part. Lists are
named by their attribute on the transformer, statements by their line in the model's source (as the
analysis read them), never by their text.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SplitSlices:
    """Each distinct slice of list `attr` that forward walks becomes a list of its own, walked whole (this
    answers the slice walks, the several walks they make, and `len()` / slices of the list outside a loop)."""

    attr: str


@dataclass(frozen=True)
class ReadRecordedBlock:
    """`self.<attr>[k]` outside the loop reads the block the PatchFunctor recorded before the list was wrapped."""

    attr: str


@dataclass(frozen=True)
class StreamsPositional:
    """The block call of list `attr` at `line` passes the streams positionally, in the order cache-dit's wrapper
    passes them, and everything else by keyword (a block whose forward takes its streams after other parameters
    is given a forward that takes them first)."""

    attr: str
    line: int


@dataclass(frozen=True)
class LoopBody:
    """The statements of list `attr`'s loop body besides the block call, by line: `hoist` move above the loop;
    `by_index` (they read the loop index) run for each block with its own index, in a hook; `others` have no
    rewrite. Applied only when every statement is answered."""

    attr: str
    hoist: tuple[int, ...]
    by_index: tuple[int, ...]
    others: tuple[int, ...]


@dataclass(frozen=True)
class OutOfPlace:
    """The forward of list `attr`'s block writes into its stream inputs in place at `lines` (of the block's
    file): it is rewritten to compute a new tensor instead."""

    attr: str
    lines: tuple[int, ...]


@dataclass(frozen=True)
class PerBlockKeywords:
    """The block call of list `attr` at `line` passes `keywords` whose values differ per block (they read the loop
    index): a forward pre-hook on each block computes each again from that block's own index, from the values
    forward holds before the loop."""

    attr: str
    line: int
    keywords: tuple[str, ...]


@dataclass(frozen=True)
class Manual:
    """No rewrite answers the finding: it is written by hand, because `why`."""

    why: str


Fix = SplitSlices | ReadRecordedBlock | StreamsPositional | LoopBody | OutOfPlace | PerBlockKeywords | Manual
