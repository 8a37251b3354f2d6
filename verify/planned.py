"""What a plan leaves a parallel proof to prove: the line of the plan that keeps a planner from being written."""

from __future__ import annotations


def not_written(kind: str, blocked) -> str | None:
    """Why the plan writes no `kind` (CP / TP) planner, from its first `blocked_by` line (None: none)."""
    if not blocked:
        return None
    e = blocked[0]
    return f"the plan writes no {kind} planner: {e.why} ({e.file.rsplit('/', 1)[-1]}:{e.line})"
