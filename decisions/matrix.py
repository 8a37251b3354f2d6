"""The GPU matrix a plan calls for: one list of rows, read by everything that shows or runs it.

`test_matrix.sh` (templates), PR.md (which embeds that script) and `integrate verify --gpu [--print]` (verify/gpu.py)
all take their rows from `rows(plan)`, so the three list the same configurations. A row is there only where what
it exercises exists: a CP row where a CP planner is written (or cache-dit's own answers for a model it supports), a
TP row likewise, TE-P where a text encoder has a planner (written or cache-dit's), VAE-P where cache-dit has one, ring
attention only where no mask must be reordered and nothing blocks it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .encoders import has_tep_planner
from .records import Plan


@dataclass(frozen=True)
class MatrixRow:
    name: str  # "ulysses2+cache"
    gpus: int  # processes (cache-dit takes the parallel degrees from their count)
    args: tuple[str, ...]  # cache-dit's generate CLI flags
    stem: str  # the output file's name without its extension
    why: str = ""  # a comment the script prints above the row, where one is owed

    @property
    def baseline(self) -> bool:
        return self.name == "baseline"

    @property
    def cached(self) -> bool:
        return "--cache" in self.args


def _planner_exists(plan: Plan, kind: str) -> bool:
    """A `kind` ("cp" / "tp") planner for the model: one the plan writes, or cache-dit's own that answers for it and
    is deferred to (the plan's support note: written for this very class; a plan older than analyze 1.16 has no
    verdicts, and a planner cache-dit registers for a model it supports stands)."""
    decision = plan.parallelism.cp if kind == "cp" else plan.parallelism.tp
    # a planner the plan decides but generate does not write (`blocked_by`: a person must act first) has no row
    written = bool(decision.plan if kind == "cp" else decision.block_lists) and not decision.blocked_by
    support = plan.already_supported
    if support is not None and support.answers:
        return written or any(a.kind == kind and a.deferred for a in support.answers)
    own = support is not None and support.registered and isinstance(support.planners, dict) and kind in support.planners
    return written or own


def rows(plan: Plan) -> tuple[MatrixRow, ...]:
    """Baseline and cache always; Ulysses 2 (with the cache too), ring 2, TP 2, TP + TE-P, TP + VAE-P and Ulysses 2 x
    TP 2 (with the cache too) where the plan has what they exercise."""
    cp = plan.parallelism.cp
    uaa = ("--ulysses-anything",) if any(v.needed for v in cp.ulysses_anything.values()) else ()
    out = [MatrixRow("baseline", 1, (), "base"), MatrixRow("cache", 1, ("--cache", "--summary"), "cache")]
    cp_rows, tp_rows = _planner_exists(plan, "cp"), _planner_exists(plan, "tp")
    bn_all = ("--Bn", str(int(cp.cache_bn_min))) if cp.cache_bn_min else ()
    if cp_rows:
        out.append(MatrixRow("ulysses2", 2, ("--parallel", "ulysses", *uaa), "ulysses2"))
        bn = ("--Bn", str(int(cp.cache_bn_min))) if cp.cache_bn_min else ()
        out.append(MatrixRow("ulysses2+cache", 2, ("--parallel", "ulysses", *uaa, "--cache", *bn), "ulysses2_cache",
                             "the plan gathers on a cached list's last block: with the cache on, that block must be "
                             "among the last Bn" if bn else ""))
        if not cp.mask_reorder.needed and not cp.ring_blocked_by:
            out.append(MatrixRow("ring2", 2, ("--parallel", "ring"), "ring2"))
    if tp_rows:
        out.append(MatrixRow("tp2", 2, ("--parallel", "tp"), "tp2"))
        if any(has_tep_planner(te) for te in plan.text_encoders):
            out.append(MatrixRow("tp2+te-p", 2, ("--parallel", "tp", "--parallel-text"), "tp2_tep",
                                 "--parallel-text and --parallel-vae act only beside a --parallel type"))
        if plan.vae is not None and (plan.vae.supported or plan.vae.planner in ("generate", "reuse-base")):
            out.append(MatrixRow("tp2+vae-p", 2, ("--parallel", "tp", "--parallel-vae"), "tp2_vaep"))
    if cp_rows and tp_rows:
        out.append(MatrixRow("ulysses2+tp2", 4, ("--parallel", "ulysses_tp", *uaa), "ulysses2_tp2",
                             "cache-dit takes the degrees from the process count: Ulysses 2 x TP 2 needs 4 processes"))
        out.append(MatrixRow("ulysses2+tp2+cache", 4, ("--parallel", "ulysses_tp", *uaa, "--cache", *bn_all),
                             "ulysses2_tp2_cache", "the hybrid with the cache on, as verify --proof hybrid proves it"))
    return tuple(out)
