"""`integrate repair`: after a failed verify, try the plan's alternatives one at a time and propose the smallest
revision that makes the failing proof pass. It never approves the plan: the proposal is written beside it
(`repair/proposal.json` and `repair/PLAN.md.diff`), and a person takes it with `integrate revise`.

1. Verify the generated code as it stands (the proofs repair can act on: cache, cp, tp; `--proof` picks) and
   read each failing proof's first divergent module.
2. Rank the candidates: first those the run itself points at, the ones that bear on the divergent module first
   (a CP split cache-dit skipped because the tensor had another rank, offered at that rank; an input still whole
   at the cut sequence's full length, offered split; last, the divergent module or one it runs in run whole:
   `decisions.alternatives.observed_ranks`, `observed_lengths`, `observed_whole`), then the plan's alternatives
   (`plan.alternatives`) of the failing proof's kind whose modules (`touches`) hold or lie inside the divergent
   module, then the rest of that kind. A candidate read from the run whose own run loses that evidence and fails
   no sooner is a step: the search goes on from its run, on top of it (`Trial.on`).
3. For each candidate, in a scratch folder: the plan revised with it, approved as an automatic trial (never
   the user's plan), generated, and only the failing proof run again (`api.automatic_chain`): its first failing
   variant only, against the plain model's run kept from step 1 (same fixture, so it is not run again). A
   candidate that passes it has the proof's every variant run once more; the first that passes that too (every
   variant that ran passed: those waiting on the hand-written cache part or skipped on this machine do not count)
   is the proposal for that proof (every candidate is one decision, so the first to pass is a smallest revision).
   What it gives up is said (`Proposal.costs`: a module run whole repeats its work on every rank).
4. Within `max_candidates` trials and `max_seconds`; what was tried and where each candidate diverged is
   reported either way.

Not done: pairs of the plan's alternatives (steps are taken only on candidates read from the run), and a
combined re-check
when several proofs each found their own revision (the proposal lists each; verify after taking them).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from integrate import api
from integrate.decisions.alternatives import observed_lengths, observed_ranks, observed_whole
from integrate.decisions.approval import load_plan
from integrate.decisions.records import Alternative
from integrate.errors import InputError
from integrate.records import OMIT, Omit, to_json
from integrate.verify.proofs import BY_NAME, REPAIRABLE

REPAIR_SCHEMA_VERSION = "1.2"
COMMAND = "integrate repair"
TRIAL = "a trial of a candidate revision"  # why a scratch plan is revised and approved without a person


@dataclass(frozen=True)
class Trial:
    proof: str
    alternative: int  # its index in plan.json's `alternatives`, then (1.1) in the report's `observed`
    decision: str
    instead: str
    status: str  # the proof's status with the alternative taken ("pass", "fail", "error", "skipped")
    on: tuple[int, ...]  # 1.1: the steps it was tried on top of (candidates read from the run that answered
    # the evidence they came from; indexed as `alternative`)
    diverged_at: str | None  # the first divergent module, where it still failed
    why: str | Omit = OMIT  # what stopped the trial before the proof ran (generate refused, ...)
    seconds: float = 0.0


@dataclass(frozen=True)
class Proposal:
    sets: dict[str, Any]
    unsets: tuple[str, ...]
    alternatives: tuple[int, ...]  # the alternatives it takes (indexed as a trial's `alternative`)
    command: str  # the `integrate revise` command that takes it (shell words quoted)
    # 1.2: what the revision gives up to pass, in words (a module run whole under CP repeats its work on every rank)
    costs: tuple[str, ...] = ()


@dataclass(frozen=True)
class RepairReport:
    schema_version: str
    plan_dir: str
    failing: dict[str, str | None]  # proof -> its first divergent module before repair (null: none named)
    observed: tuple[Alternative, ...]  # 1.1: candidates read from the failing run, not from the plan
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


def candidates(pool: list[Alternative], proof: str, module: str | None, first: Sequence[int] = ()) -> list[int]:
    """Indices into `pool` for a failing `proof`: those at `first` (read from the run; those that bear on `module`
    before the others), then those that bear on `module`, then the rest of the proof's kind."""
    kind = [i for i, a in enumerate(pool) if a.decision.startswith(BY_NAME[proof].REPAIRS) and i not in first]
    near = [i for i in kind if any(_matches(t, module) for t in pool[i].touches)]
    read = [i for i in first if pool[i].decision.startswith(BY_NAME[proof].REPAIRS)]
    bearing = [i for i in read if any(_matches(t, module) for t in pool[i].touches)]
    return bearing + [i for i in read if i not in bearing] + near + [i for i in kind if i not in near]


_RANKS = re.compile(r"have (\d+) dimensions, but got (\d+) dimensions")


def _skipped(result) -> list[tuple[str, int, int]]:
    """(module, rank planned, rank met) for each split cache-dit said it skipped in a proof's variants (verify
    keeps its warning as "<module>: Expected input tensor to have N dimensions, but got M ...")."""
    out = []
    variants = getattr(result, "variants", None)
    for v in variants.values() if isinstance(variants, dict) else ():
        lines = getattr(v, "skipped_splits", None)
        for line in lines if isinstance(lines, tuple | list) else ():
            module, _, message = line.partition(": ")
            found = _RANKS.search(message)
            if found:
                out.append((module, int(found[1]), int(found[2])))
    return out


def _merged(pool: list[Alternative], indices: list[int]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The sets and unsets of the alternatives at `indices`, together."""
    sets: dict[str, Any] = {}
    unsets: list[str] = []
    for i in indices:
        sets.update(pool[i].sets)
        unsets += pool[i].unsets
    return sets, tuple(unsets)


def _scratch_plan(plan_dir: Path, into: Path, indices: list[int], pool: list[Alternative]) -> Path:
    """A copy of the plan folder with the alternatives at `indices` taken (plan.json and PLAN.md only)."""
    into.mkdir(parents=True)
    for name in ("plan.json", "PLAN.md"):
        shutil.copy2(plan_dir / name, into / name)
    sets, unsets = _merged(pool, indices)
    api.revise(into, [f"{k}={json.dumps(v)}" for k, v in sets.items()], unsets=list(unsets),
               why="integrate repair: a candidate", reviewer=api.automatic_reviewer(COMMAND, TRIAL))
    return into


def repair(plan_dir: Path, generated: Path, *, proofs: tuple[str, ...] = REPAIRABLE, max_candidates: int = 8,
           max_seconds: float = 300.0, trust_code: bool = False, fixture_from: Path | None = None,
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
        # a parallel proof's first variant alone, the rest only if it passes: the search needs the first that
        # fails, and a proposal is checked on every variant before it is made
        before = api.verify(plan_dir, generated, proofs=proofs, trust_code=trust_code, progress=progress,
                            baseline=baseline, fixture_from=fixture_from, fail_fast=True)
        if before.fixture.status in ("needs-edit", "error"):
            raise InputError(f"the fixture does not run ({before.fixture.status}): repair needs the plain model to "
                             "run on it first (see `integrate verify --fixture-only`)")
        failing = {p: (getattr(before, p).first_divergence.module if getattr(before, p).first_divergence else None)
                   for p in proofs if getattr(before, p).status in ("fail", "error")}
        trials: list[Trial] = []
        passing: dict[str, list[int]] = {}
        stopped: str | Omit = OMIT
        pool = list(plan.alternatives)
        for proof, module in failing.items():
            result, steps, current = getattr(before, proof), [], plan
            failed = _failed_variants(result)
            tried: set[tuple[int, ...]] = set()
            while stopped is OMIT and proof not in passing:
                fresh = _observed(pool, current, proof, result)
                order = [i for i in candidates(pool, proof, module, fresh) if (*steps, i) not in tried
                         and i not in steps]
                if not order:
                    break
                advanced = False
                for i in order:
                    if len(trials) >= max_candidates:
                        stopped = f"--max-candidates {max_candidates} reached"
                        break
                    # a trial takes about as long as the longest so far: one that would end past the limit is
                    # not started
                    longest = max((x.seconds for x in trials), default=0.0)
                    if time.monotonic() - started + longest > max_seconds:
                        stopped = f"--max-seconds {max_seconds:g} reached (or would be by the next trial)"
                        break
                    alt, taking = pool[i], [*steps, i]
                    tried.add(tuple(taking))
                    on = f" (on {len(steps)} step(s) taken)" if steps else ""
                    progress(f"[{len(trials) + 1}/{max_candidates}] {proof}: {alt.decision} -> {alt.instead}{on}")
                    trial, got = _trial(plan_dir, generated, work / f"t{len(trials)}", pool, proof, taking, trust_code,
                                        baseline, failed, progress, fixture_from)
                    trials.append(trial)
                    if _proved(got) and failed:  # the variant that failed passes: now every other one
                        progress(f"[{len(trials)}/{max_candidates}] {proof}: every other variant with it")
                        rest, others = _trial(plan_dir, generated, work / f"t{len(trials)}-all", pool, proof, taking,
                                              trust_code, baseline, None, progress, fixture_from, skip=failed)
                        if others is None or isinstance(others.variants, dict) and others.variants:
                            # (none left to run: the one that passed was all there is)
                            trial, got = dataclasses.replace(rest, seconds=round(rest.seconds + trial.seconds, 1)), \
                                others
                        trials[-1] = trial
                    if _proved(got):
                        passing[proof] = taking
                        break
                    if i in fresh and got is not None and _answered(alt, result, got):
                        # read from the run and the evidence it answered is gone: a step; search on from it
                        progress(f"  a step: {alt.decision} -> {alt.instead} (the run's evidence for it is gone)")
                        steps, result = taking, got
                        module = got.first_divergence.module if got.first_divergence else module
                        current = load_plan(work / f"t{len(trials) - 1}" / "plan")
                        failed = _failed_variants(result) or failed
                        advanced = True
                        break
                if not advanced:
                    break
        observed = tuple(pool[len(plan.alternatives):])
        proposal, files = None, ()
        if passing:
            from integrate.escape import sh
            from integrate.render.markdown import revise_words

            indices = sorted({i for taken in passing.values() for i in taken})
            sets, unsets = _merged(pool, indices)
            proposal = Proposal(sets, unsets, tuple(indices), revise_words(
                str(sh(str(plan_dir))), sets, unsets, "integrate repair: the failing proof passes with it"),
                _costs([pool[i] for i in indices]))
            revised = _scratch_plan(plan_dir, work / "proposal", indices, pool)
            diff = "".join(difflib.unified_diff((plan_dir / "PLAN.md").read_text().splitlines(keepends=True),
                                                (revised / "PLAN.md").read_text().splitlines(keepends=True),
                                                "PLAN.md", "PLAN.md (proposed)"))
            named = (str(plan_dir / "repair" / "proposal.json"), str(plan_dir / "repair" / "PLAN.md.diff"))
            report = RepairReport(REPAIR_SCHEMA_VERSION, str(plan_dir), failing, observed, tuple(trials), proposal,
                                  named, stopped, round(time.monotonic() - started, 1))
            files = tuple(write_tree(plan_dir / "repair", {
                "proposal.json": json.dumps(to_json(report), indent=2) + "\n", "PLAN.md.diff": diff}))
    return RepairReport(REPAIR_SCHEMA_VERSION, str(plan_dir), failing, observed, tuple(trials), proposal, files,
                        stopped, round(time.monotonic() - started, 1))


def _costs(taken: list[Alternative]) -> tuple[str, ...]:
    """What a revision gives up: each module its alternatives run whole under CP (its work repeats on every rank)."""
    return tuple(f"`{m}` runs whole under CP: its inputs are gathered and its work repeats on every rank"
                 for alt in taken if alt.read_from == "run-whole" for m in alt.touches)


def _adopt_fixture(generated: Path, out: Path) -> None:
    """The fixture verify derived for the generated code, put in the trial's output folder before its code is
    generated there: the candidate's code differs, its model does not, so verify reuses it (it checks the derive job
    and the files' hashes, and derives anew when they differ)."""
    from integrate.verify.fixture import FILENAME

    out.mkdir(parents=True, exist_ok=True)
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


def _observed(pool: list[Alternative], plan, proof: str, result) -> list[int]:
    """Add to `pool` the candidates a failed CP run points at (splits cache-dit skipped for another rank; inputs of
    the divergent module still at the sequence's full length); returns the indices of those it holds."""
    if proof != "cp":
        return []
    div = result.first_divergence
    inputs = div.inputs if div is not None and isinstance(div.inputs, dict) else {}
    shapes = {m: {k: (v.whole, v.rank) for k, v in ins.items()} for m, ins in inputs.items()}
    outputs = div.outputs if div is not None and isinstance(div.outputs, dict) else {}
    returns = {m: tuple((v.whole, v.rank) for v in outs) for m, outs in outputs.items()}
    found = [*observed_ranks(plan, _skipped(result), shapes), *observed_lengths(plan, shapes),
             *observed_whole(plan, shapes, returns)]
    known = {(a.decision, a.instead, json.dumps(a.sets, sort_keys=True)): i for i, a in enumerate(pool)}
    at = []
    for alt in found:
        key = (alt.decision, alt.instead, json.dumps(alt.sets, sort_keys=True))
        if key not in known:
            known[key] = len(pool)
            pool.append(alt)
        at.append(known[key])
    return at


def _proved(result) -> bool:
    """Did the proof pass: every variant that ran passed. Variants that wait on the plugin's hand-written part
    (`needs-code`: the adapter's stub, which no plan revision writes) or were skipped (this machine cannot run
    them) do not count against it."""
    if result is None or result.status not in ("pass", "needs-code"):
        return False
    variants = result.variants if isinstance(getattr(result, "variants", None), dict) else {}
    ran = [v.status for v in variants.values() if v.status not in ("needs-code", "skipped")]
    return result.status == "pass" or bool(ran) and all(s == "pass" for s in ran)


def _answered(alt: Alternative, before, after) -> bool:
    """Did the run with `alt` taken lose the evidence `alt` was read from: fewer skipped splits (a rank), or the
    proof no longer first diverging in the same module with the same error (a full-length input)?"""
    if not _not_worse(before, after):
        return False
    if alt.read_from == "skipped-split":
        return len(_skipped(after)) < len(_skipped(before))
    a, b = before.first_divergence, after.first_divergence
    if a is None or b is None:
        return b is None
    same_error = (a.error.message if a.error else None) == (b.error.message if b.error else None)
    return a.module != b.module or not same_error


def _not_worse(before, after) -> bool:
    """A run that fails no sooner: not an error where there was a numeric difference, nor a first divergence in a
    module that ran before the one where it diverged (the earlier run's table lists the modules in order)."""
    severity = {"error": 0, "fail": 1}
    if severity.get(after.status, 2) < severity.get(before.status, 2):
        return False
    a, b = before.first_divergence, after.first_divergence
    if a is None or b is None or a.module is None or b.module is None or after.status != before.status:
        return True
    order = [row.module for row in a.table]
    return not (b.module in order and a.module in order and order.index(b.module) < order.index(a.module))


def _trial(plan_dir: Path, generated: Path, work: Path, pool: list[Alternative], proof: str, taking: list[int],
           trust_code: bool, baseline: Path | None = None, variants: tuple[str, ...] | None = None,
           progress: Callable[[str], None] = lambda line: None, fixture_from: Path | None = None,
           skip: tuple[str, ...] = ()):
    """Revise a scratch copy with the alternatives `taking` (the steps taken, then the candidate), approve it as a
    trial, generate, and run `proof` alone (only `variants` of it where named, none of `skip`, against the plain
    model's run kept in `baseline`). Returns the trial and the proof's result (None where it did not run)."""
    index = taking[-1]
    alt = pool[index]
    t0 = time.monotonic()
    base = {"proof": proof, "alternative": index, "decision": alt.decision, "instead": alt.instead,
            "on": tuple(taking[:-1])}
    try:
        scratch = _scratch_plan(plan_dir, work / "plan", taking, pool)
        _adopt_fixture(generated, work / "out")
        report = api.automatic_chain(scratch, work / "out", command=COMMAND, why=TRIAL, verifies={"verify": {
            "proofs": (proof,), "trust_code": trust_code, "baseline": baseline, "variants": variants, "skip": skip,
            "fixture_from": fixture_from, "progress": lambda line: progress(f"  {line}")}})["verify"]
    except InputError as exc:
        return Trial(**base, status="error", diverged_at=None, why=str(exc)[:300],
                     seconds=round(time.monotonic() - t0, 1)), None
    result = getattr(report, proof)
    where = result.first_divergence.module if result.first_divergence else None
    return Trial(**base, status=result.status, diverged_at=where, seconds=round(time.monotonic() - t0, 1)), result
