"""`integrate repair`: after a failed verify, try the plan's alternatives one at a time and propose the smallest
revision that makes the failing proof pass. It never approves the plan: the proposal is written beside it
(`repair/proposal.json` and `repair/PLAN.md.diff`), and a person takes it with `integrate revise`.

1. Verify the generated code as it stands (the proofs repair can act on: cache, cp, tp; `--proof` picks) and
   read each failing proof's first divergent module.
2. Rank the plan's alternatives (`plan.alternatives`): those of the failing proof's kind whose modules
   (`touches`) hold or lie inside the divergent module first, then the rest of that kind.
3. For each candidate, in a scratch folder: the plan revised with it, approved as an automatic trial (never
   the user's plan), generated, and only the failing proof run again: its first failing variant only, against
   the plain model's run kept from step 1 (same fixture, so it is not run again). A candidate that passes it has
   the proof's every variant run once more; the first that passes that too is the proposal for that proof
   (every candidate is one decision, so the first to pass is a smallest revision).
4. Within `max_candidates` trials and `max_seconds`; what was tried and where each candidate diverged is
   reported either way.

Not done: pairs of alternatives (a proof that needs two decisions changed at once), and a combined re-check
when several proofs each found their own revision (the proposal lists each; verify after taking them).
"""

from __future__ import annotations

import difflib
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from integrate import api
from integrate.errors import InputError
from integrate.records import OMIT, Omit, to_json

REPAIR_SCHEMA_VERSION = "1.0"
REPAIRABLE = ("cache", "cp", "tp")
TRIAL_REVIEWER = "integrate repair (automatic: a trial of a candidate revision, not a human review)"
_KIND = {"cache": ("ForwardPattern", "CFG"), "cp": ("CP",), "tp": ("TP",)}


@dataclass(frozen=True)
class Trial:
    proof: str
    alternative: int  # its index in plan.json's `alternatives`
    decision: str
    instead: str
    status: str  # the proof's status with the alternative taken ("pass", "fail", "error", "skipped")
    diverged_at: str | None  # the first divergent module, where it still failed
    why: str | Omit = OMIT  # what stopped the trial before the proof ran (generate refused, ...)
    seconds: float = 0.0


@dataclass(frozen=True)
class Proposal:
    sets: dict[str, Any]
    unsets: tuple[str, ...]
    alternatives: tuple[int, ...]  # the alternatives it takes
    command: str  # the `integrate revise` command that takes it (shell words quoted)


@dataclass(frozen=True)
class RepairReport:
    schema_version: str
    plan_dir: str
    failing: dict[str, str | None]  # proof -> its first divergent module before repair (null: none named)
    trials: tuple[Trial, ...]
    proposal: Proposal | None  # null when nothing failed or no candidate passed
    files: tuple[str, ...]  # what was written beside the plan (proposal.json, PLAN.md.diff)
    stopped: str | Omit = OMIT  # why the search stopped before every candidate was tried
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        """A proof failed and no candidate made it pass (`integrate repair` exits 1)."""
        return bool(self.failing) and self.proposal is None


def _matches(touch: str, module: str | None) -> bool:
    """Does an alternative acting on `touch` (`blocks.*.attn.to_q`, "" for the root) bear on `module`?"""
    if module is None:
        return False
    if touch == "":
        return True
    a, b = touch.split("."), module.split(".")
    n = min(len(a), len(b))
    return all(x == y or x == "*" and y.isdigit() for x, y in zip(a[:n], b[:n]))


def candidates(plan, proof: str, module: str | None) -> list[int]:
    """Indices of the plan's alternatives for a failing `proof`, those that bear on `module` first."""
    kind = [i for i, a in enumerate(plan.alternatives) if a.decision.startswith(_KIND[proof])]
    near = [i for i in kind if any(_matches(t, module) for t in plan.alternatives[i].touches)]
    return near + [i for i in kind if i not in near]


def _merged(plan, indices: list[int]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The sets and unsets of the alternatives at `indices`, together."""
    sets: dict[str, Any] = {}
    unsets: list[str] = []
    for i in indices:
        sets.update(plan.alternatives[i].sets)
        unsets += plan.alternatives[i].unsets
    return sets, tuple(unsets)


def _scratch_plan(plan_dir: Path, into: Path, indices: list[int], plan) -> Path:
    """A copy of the plan folder with the alternatives at `indices` taken (plan.json and PLAN.md only)."""
    into.mkdir(parents=True)
    for name in ("plan.json", "PLAN.md"):
        shutil.copy2(plan_dir / name, into / name)
    sets, unsets = _merged(plan, indices)
    api.revise(into, [f"{k}={json.dumps(v)}" for k, v in sets.items()], unsets=list(unsets),
               why="integrate repair: a candidate", reviewer=TRIAL_REVIEWER)
    return into


def repair(plan_dir: Path, generated: Path, *, proofs: tuple[str, ...] = REPAIRABLE, max_candidates: int = 8,
           max_seconds: float = 300.0, trust_code: bool = False,
           progress: Callable[[str], None] = lambda line: None) -> RepairReport:
    from integrate.decisions.approval import require_approved
    from integrate.files import write_tree

    started = time.monotonic()
    plan, _ = require_approved(plan_dir)  # repair starts from what a reviewer approved
    if not generated.is_dir():
        raise InputError(f"--generated {generated}: no such folder (run `integrate generate` first)")
    proofs = tuple(p for p in REPAIRABLE if p in proofs)
    if not proofs:
        raise InputError(f"repair acts on the proofs {', '.join(REPAIRABLE)}")
    with tempfile.TemporaryDirectory(prefix="integrate-repair-") as tmp:
        work = Path(tmp)
        baseline = work / "baseline"  # the plain model's run, kept by this verify for every trial's
        progress(f"verifying the generated code as it stands ({', '.join(proofs)})")
        before = api.verify(plan_dir, generated, proofs=proofs, trust_code=trust_code, progress=progress,
                            baseline=baseline)
        if before.fixture.status in ("needs-edit", "error"):
            raise InputError(f"the fixture does not run ({before.fixture.status}): repair needs the plain model to "
                             "run on it first (see `integrate verify --fixture-only`)")
        failing = {p: (getattr(before, p).first_divergence.module if getattr(before, p).first_divergence else None)
                   for p in proofs if getattr(before, p).status in ("fail", "error")}
        trials: list[Trial] = []
        passing: dict[str, int] = {}
        stopped: str | Omit = OMIT
        for proof, module in failing.items():
            failed = _failed_variants(getattr(before, proof))
            for i in candidates(plan, proof, module):
                if len(trials) >= max_candidates:
                    stopped = f"--max-candidates {max_candidates} reached"
                    break
                if time.monotonic() - started > max_seconds:
                    stopped = f"--max-seconds {max_seconds:g} reached"
                    break
                alt = plan.alternatives[i]
                progress(f"[{len(trials) + 1}/{max_candidates}] {proof}: {alt.decision} -> {alt.instead}")
                trials.append(_trial(plan_dir, generated, work / f"t{len(trials)}", plan, proof, i, trust_code,
                                     baseline, failed, progress))
                if trials[-1].status == "pass" and failed:  # the variants that failed pass: now all of them
                    progress(f"[{len(trials)}/{max_candidates}] {proof}: every variant with it")
                    trials[-1] = _trial(plan_dir, generated, work / f"t{len(trials)}-all", plan, proof, i, trust_code,
                                        baseline, None, progress)
                if trials[-1].status == "pass":
                    passing[proof] = i
                    break
            if stopped is not OMIT:
                break
        proposal, files = None, ()
        if passing:
            from integrate.escape import sh
            from integrate.render.markdown import revise_words

            indices = sorted(set(passing.values()))
            sets, unsets = _merged(plan, indices)
            proposal = Proposal(sets, unsets, tuple(indices), revise_words(
                str(sh(str(plan_dir))), sets, unsets, "integrate repair: the failing proof passes with it"))
            revised = _scratch_plan(plan_dir, work / "proposal", indices, plan)
            diff = "".join(difflib.unified_diff((plan_dir / "PLAN.md").read_text().splitlines(keepends=True),
                                                (revised / "PLAN.md").read_text().splitlines(keepends=True),
                                                "PLAN.md", "PLAN.md (proposed)"))
            named = (str(plan_dir / "repair" / "proposal.json"), str(plan_dir / "repair" / "PLAN.md.diff"))
            report = RepairReport(REPAIR_SCHEMA_VERSION, str(plan_dir), failing, tuple(trials), proposal, named,
                                  stopped, round(time.monotonic() - started, 1))
            files = tuple(write_tree(plan_dir / "repair", {
                "proposal.json": json.dumps(to_json(report), indent=2) + "\n", "PLAN.md.diff": diff}))
    return RepairReport(REPAIR_SCHEMA_VERSION, str(plan_dir), failing, tuple(trials), proposal, files, stopped,
                        round(time.monotonic() - started, 1))


def _adopt_fixture(generated: Path, out: Path) -> None:
    """The fixture verify derived for the generated code: the candidate's code differs, its model does not, so
    verify reuses it (it checks the derive job and the files' hashes, and derives anew when they differ)."""
    from integrate.verify.fixture import FILENAME

    for suffix in (".py", ".pt", ".json"):
        source = (generated / FILENAME).with_suffix(suffix)
        if source.is_file():
            shutil.copy2(source, (out / FILENAME).with_suffix(suffix))


def _failed_variants(result) -> tuple[str, ...] | None:
    """The first of a parallel proof's variants that failed or stopped with an error (the plain one before its
    cached twin, which fails with it): a candidate is tried on it alone, and the one that passes it on every
    variant. None (run them all) for a proof without variants (cache) or where none is named."""
    variants = getattr(result, "variants", None)
    if not isinstance(variants, dict):
        return None
    names = tuple(name for name, v in variants.items() if getattr(v, "status", None) in ("fail", "error"))
    return names[:1] or None


def _trial(plan_dir: Path, generated: Path, work: Path, plan, proof: str, index: int, trust_code: bool,
           baseline: Path | None = None, variants: tuple[str, ...] | None = None,
           progress: Callable[[str], None] = lambda line: None) -> Trial:
    """Revise a scratch copy with one alternative, approve it as a trial, generate, and run `proof` alone (only
    `variants` of it where named, against the plain model's run kept in `baseline`)."""
    alt = plan.alternatives[index]
    t0 = time.monotonic()
    base = dict(proof=proof, alternative=index, decision=alt.decision, instead=alt.instead)
    try:
        scratch = _scratch_plan(plan_dir, work / "plan", [index], plan)
        api.approve(scratch, TRIAL_REVIEWER)
        api.generate(scratch, out=work / "out")
        _adopt_fixture(generated, work / "out")
        report = api.verify(scratch, work / "out", proofs=(proof,), trust_code=trust_code, baseline=baseline,
                            variants=variants, progress=lambda line: progress(f"  {line}"))
    except InputError as exc:
        return Trial(**base, status="error", diverged_at=None, why=str(exc)[:300],
                     seconds=round(time.monotonic() - t0, 1))
    result = getattr(report, proof)
    where = result.first_divergence.module if result.first_divergence else None
    return Trial(**base, status=result.status, diverged_at=where, seconds=round(time.monotonic() - t0, 1))
