"""The baseline every proof is judged against, and finding where a run first parts from it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from integrate.records import OMIT

from . import compare
from .processes import activations
from .records import Compared, Divergence, LayerRow, WorkerError


@dataclass
class Baseline:
    """The plain model's run: its report (module order, state dict), outputs and activations."""

    report: dict  # the worker's `baseline` variant
    arrays: dict[str, np.ndarray]
    streams: tuple[int, int] | None  # (text tokens, image tokens) of a joint sequence, to line shards up

    @property
    def out(self) -> np.ndarray:
        return self.arrays["baseline/out"]

    def reference(self, steps: int, calls: int) -> np.ndarray:
        """The baseline output as a run with `calls` transformer calls per step would see it."""
        return np.repeat(self.out, calls, axis=0)[: steps * calls]

    def locate(self, arrays_per_rank: list[dict[str, np.ndarray]], variant: str,
               error: WorkerError | None) -> Divergence | None:
        """The first module whose output differs (or raised), with the per-layer table; None when all agree."""
        div = compare.divergence(activations(self.arrays, "baseline"), self.report["order"],
                                 [activations(a, variant) for a in arrays_per_rank], self.streams)
        if div["first"] is None and error is None:
            return None
        first = div["first"]
        module = first["module"] if first else None
        raised = OMIT
        if error is not None and module is None:
            module = error.module or error.after
            if not error.module and error.after:
                raised = f"outside the model's modules ({error.at}), right after `{error.after}` returned"
            elif error.module:
                raised = f"inside `{error.module}` ({error.at})"
        return Divergence(module, tuple(LayerRow(**row) for row in div["table"]), div["compared"],
                          div["not_comparable"], max_abs=first["max_abs"] if first else OMIT,
                          cosine=first["cosine"] if first else OMIT,
                          error=error if error is not None else OMIT, raised=raised)


def worker_error(data: dict | None) -> WorkerError | None:
    if data is None:
        return None
    return WorkerError(data["stage"], data.get("module"), data.get("after"), data.get("at") or "", data["type"],
                       data["message"], tuple(data.get("trace") or ()))


def compared(f: compare.Figures) -> Compared:
    d = f.as_dict()
    return Compared(f.max_abs == 0, d["max_abs"], d["cosine"], d["rel_l2"], d["ok"])
