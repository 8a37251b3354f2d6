"""Judging a proof run over 2 gloo processes (CP and TP): every variant's output against the 1-process run.

A variant passes when every output element is within `1e-5 + 1e-4 * max|reference|` of the baseline. An
error that is this machine's limit (a kernel with no CPU implementation, a library refusing CPU tensors)
is `skipped`, never a verdict on the integration.
"""

from __future__ import annotations

import dataclasses

from integrate.records import OMIT, Omit, from_json

from . import compare
from .locate import Baseline, worker_error
from .records import CpEngagement, Divergence, Engaged, InputShape, OutputShape, ParallelProof, Variant, WorkerError

UNEVEN = "must be divisible by mesh size"  # cache-dit's (and diffusers') even-split assertion
SHORT = "Cannot shard tensor of size"  # cache-dit's uneven split, on an axis shorter than the ranks


def _errors(reps: list) -> list[WorkerError]:
    errors = [worker_error(r["error"]) for r in reps if r is not None and "error" in r]
    # a rank that lost its peer ("connection closed") reports the consequence; the other, the cause
    errors.sort(key=lambda e: "closed by peer" in e.message or "Connection reset" in e.message)
    return errors


def _uneven(reps: list) -> WorkerError | None:
    """The even-split assertion, when that is what stopped the variant: the fixture's sequence does not
    divide by the number of ranks, a fact about the input rather than about the planner."""
    errors = _errors(reps)
    if errors and errors[0].type == "AssertionError" and UNEVEN in errors[0].message:
        return errors[0]
    return None


def too_short(err: WorkerError | None) -> bool:
    """Did cache-dit's uneven split meet an axis shorter than the ranks (the fixture's sequence, or whatever the
    plan splits, has fewer elements there than there are ranks)? No split of that axis can run on this input."""
    return err is not None and err.type == "AssertionError" and SHORT in err.message


def uneven_retries(variants: list[dict], runs: dict[str, tuple[list, list, list]]) -> list[dict]:
    """The Ulysses variants stopped by the even-split assertion, to run again with `ulysses_anything`
    (cache-dit's uneven split). Ring has no uneven mode and is not retried."""
    return [{**v, "name": f"{v['name']}+anything", "anything": True, "retry_of": v["name"]}
            for v in variants if v.get("ulysses") and not v.get("anything") and not v.get("ring")
            and _uneven(runs[v["name"]][0]) is not None]


def judge(base: Baseline, variants: list[dict], runs: dict[str, tuple[list, list, list]]) -> ParallelProof:
    rows: dict[str, Variant] = {}
    retried = {v["retry_of"]: v["name"] for v in variants if "retry_of" in v}
    for variant in variants:
        key = variant["name"]
        reps, arrays, tails = runs[key]
        uneven = _uneven(reps)
        if uneven is not None and (key in retried or variant.get("ring")):
            again = (f"proved again with ulysses_anything as `{retried[key]}`" if key in retried else
                     "ring attention has no uneven split in cache-dit")
            rows[key] = Variant("skipped", why=f"the fixture's sequence does not divide by 2 ({uneven.message}; "
                                               f"{uneven.module or uneven.stage}): {again}", error=uneven)
            continue
        if any(r is None for r in reps) and not any(r is not None and "error" in r for r in reps):
            rows[key] = Variant("error", why="; ".join(t for t in tails if t) or "a rank did not report",
                                first_divergence=None)
            continue
        errors = _errors(reps)
        err = errors[0] if errors else None
        if err is not None:
            why = f"{err.type} in {err.module or err.stage}: {err.message}"
            if too_short(err):
                why = (f"a planned split met an axis shorter than the ranks ({err.message}; {err.module or err.stage}):"
                       " either the fixture's sequence is that short (a longer one is needed to prove CP) or the "
                       "plan splits an axis that is not the sequence")
            cpu_only = _cpu_only(err)
            if cpu_only:  # a limit of this machine, not a verdict on the integration
                rows[key] = Variant("skipped", why=f"{cpu_only}: run this configuration on GPUs", error=err)
            else:
                good = [a for a, r in zip(arrays, reps) if r is not None and "error" not in r] or arrays[:1]
                rows[key] = Variant("error", error=err,
                                    first_divergence=_with_inputs(base, base.locate(good, key, err), reps),
                                    **_noted(reps, why), engaged=recorded(reps))
            continue
        shapes = {tuple(a[f"{key}/out"].shape) for a in arrays}
        if shapes != {tuple(base.out.shape)}:  # not gathered back whole: no element-wise comparison to make
            why = (f"the output's shape {sorted(shapes)[0]} is not the 1-process run's {tuple(base.out.shape)}: "
                   "the sequence was not put back whole")
            rows[key] = Variant("fail", first_divergence=_with_inputs(base, _located(base, arrays, key), reps),
                                **_noted(reps, why))
            continue
        f = [compare.figures(base.out, a[f"{key}/out"]) for a in arrays]
        worst = max(f, key=lambda x: x.max_abs).as_dict()
        engaged, short, said = engagement(variant, reps, base)
        if worst["ok"]:
            noted = _noted(reps, said, "agrees, but " if short is None else "")
            rows[key] = Variant(short or "pass", **worst, **noted, engaged=engaged)
        else:
            rows[key] = Variant("fail", **worst, first_divergence=_with_inputs(base, base.locate(arrays, key, None),
                                                                              reps), **_noted(
                reps, None, f"differs from the 1-process run (max-abs {worst['max_abs']:.3g}); "), engaged=engaged)
    statuses = [v.status for v in rows.values()]
    status = ("error" if "error" in statuses else "fail" if "fail" in statuses else
              "vacuous" if "vacuous" in statuses else "skipped" if all(x == "skipped" for x in statuses) else "pass")
    bad = next((v for v in rows.values() if v.status in ("fail", "error")), None) or \
        next((v for v in rows.values() if v.status == "vacuous"), None)
    if bad is not None:
        why = bad.why if isinstance(bad.why, str) else f"differs from the 1-process run (max-abs {bad.max_abs:.3g})"
        first = None if bad.first_divergence is OMIT else bad.first_divergence  # a vacuous or errored variant: none
        return ParallelProof(status, why=why, first_divergence=first, variants=rows)
    if status == "skipped":
        return ParallelProof(status, why=next(v.why for v in rows.values()), variants=rows)
    return ParallelProof(status, variants=rows)


def recorded(reps: list) -> Engaged | Omit:
    """What rank 0 (or the first rank that reported) recorded of the plan having acted, also where it then raised
    (the planner lookups it made stay evidence of what cache-dit handed it)."""
    rank = next((r for r in reps if r is not None), None) or {}
    raw = rank.get("engaged")
    return from_json(Engaged, raw) if isinstance(raw, dict) and raw else OMIT


def engagement(variant: dict, reps: list, base: Baseline | None = None) -> tuple[Engaged | Omit, str | None,
                                                                             str | None]:
    """(what rank 0 recorded of the plan having acted, the status that overrides a numeric pass, why): a TP plan key
    that matches no module fails; nothing sharded (TP) or split (CP) is `vacuous`; planned CP hooks that never fired
    are said, and leave a pass a pass. A CP planner may split inside a forward it replaces, with no hook (cache-dit's
    Krea2): then modules whose tensor inputs on the rank are shaped otherwise than in the 1-process run are the
    evidence that the sequence was cut."""
    engaged = recorded(reps)
    if engaged is OMIT:
        return OMIT, None, None
    if (variant.get("ulysses") or variant.get("ring")) and base is not None and \
            (engaged.cp is OMIT or not engaged.cp.split):
        engaged = _with_local_inputs(engaged, reps, base)
    status, why = None, []
    tp, cp = engaged.tp, engaged.cp
    if variant.get("tp"):
        if tp is OMIT:
            status, why = "vacuous", ["no TP evidence was recorded"]
        elif tp.unresolved:
            status = "fail"
            why.append(f"the TP plan names {len(tp.unresolved)} key(s) that match no module, which torch skipped: "
                       f"{tp.unresolved[0]}")
        elif not tp.sharded:
            status = "vacuous"
            why.append(f"nothing was sharded: each of the {tp.parameters} parameters keeps its full shape on every "
                       "rank")
    if variant.get("ulysses") or variant.get("ring"):
        local = cp.local_inputs if cp is not OMIT and cp.local_inputs is not OMIT else 0
        if cp is OMIT:
            status, why = status or "vacuous", [*why, "no context-parallel hook was registered"]
        elif not cp.split and not local:
            status = status or "vacuous"
            why.append(f"no tensor was split: {cp.hooks} hook(s) registered, {cp.fired} fired, and every module's "
                       "inputs are shaped as in the 1-process run")
        elif not cp.split:
            why.append(f"no hook split a tensor ({cp.hooks} registered), but {local} module(s) ran on inputs cut "
                       f"otherwise (the planner's own forward), first {cp.first_local}")
        if cp is not OMIT and cp.unfired:
            why.append(f"{len(cp.unfired)} planned hook(s) never fired, first {cp.unfired[0]}")
    return engaged, status, "; ".join(why) or None


def _with_local_inputs(engaged: Engaged, reps: list, base: Baseline) -> Engaged:
    """`engaged` with the modules whose tensor inputs on rank 0 differ in shape from the 1-process run's (the same
    parameter of the same module), counted, and the first of them said."""
    rank = next((r for r in reps if r is not None), None) or {}
    here, whole = rank.get("input_shapes") or {}, base.report.get("input_shapes") or {}
    differ = []
    for path, shapes in here.items():
        for name, shape in shapes.items():
            full = (whole.get(path) or {}).get(name)
            if full is not None and list(full) != list(shape):
                differ.append(f"{path}.{name} {tuple(full)} -> {tuple(shape)}")
                break
    if not differ:
        return engaged
    cp = engaged.cp if engaged.cp is not OMIT else CpEngagement(0, 0, (), 0, ())
    return dataclasses.replace(engaged, cp=dataclasses.replace(cp, local_inputs=len(differ), first_local=differ[0]))


def _with_inputs(base: Baseline, div: Divergence | None, reps: list) -> Divergence | None:
    """The divergence with the tensor inputs of its module and the modules around it, and what they returned, as
    the 1-process run and rank 0 had them."""
    rank = next((r for r in reps if r is not None), None)
    if div is None or div.module is None or rank is None:
        return div
    parts = div.module.split(".")
    here, whole = rank.get("input_shapes") or {}, base.report.get("input_shapes") or {}
    made, ran = rank.get("output_shapes") or {}, base.report.get("output_shapes") or {}
    found, returned = {}, {}
    for n in range(len(parts), 0, -1):
        path = ".".join(parts[:n])
        if here.get(path):
            w = whole.get(path) or {}
            found[path] = {name: InputShape(tuple(w[name]) if name in w else None, tuple(shape))
                           for name, shape in here[path].items()}
        w, r = ran.get(path) or [], made.get(path) or []
        if w or r:
            returned[path] = tuple(OutputShape(_shape(w, i), _shape(r, i)) for i in range(max(len(w), len(r))))
    if not found and not returned:
        return div
    return dataclasses.replace(div, **({"inputs": found} if found else {}), **({"outputs": returned}
                                                                              if returned else {}))


def _shape(shapes: list, index: int) -> tuple[int, ...] | None:
    return tuple(shapes[index]) if index < len(shapes) and shapes[index] is not None else None


def _located(base: Baseline, arrays: list, key: str):
    """The first divergent module, where the per-layer outputs can be compared at all (None otherwise)."""
    try:
        return base.locate(arrays, key, None)
    except ValueError:  # shapes no reassembly explains
        return None


def _noted(reps: list, why: str | None, lead: str = "") -> dict:
    """A variant's `why` (and `skipped_splits`), with the planned splits cache-dit skipped on either rank (a rank
    not the split's `expected_dims`) said after it: `why` alone when none was skipped, nothing when there is no
    `why` either; `lead` opens the sentence of a variant with no `why` of its own (a pass, a numeric fail)."""
    noops = tuple(dict.fromkeys(x for r in reps if r is not None for x in r.get("skipped_splits", ())))
    if not noops:
        return {"why": why} if why is not None else {}
    said = f"cache-dit skipped {len(noops)} planned split(s), first {noops[0]}"
    return {"skipped_splits": noops, "why": f"{why}; {said}" if why is not None else f"{lead}{said}"}


def _cpu_only(err: WorkerError) -> str | None:
    """Why an error is the CPU's, not the integration's: a kernel with no CPU implementation, or a
    library's own assertion that refuses CPU tensors."""
    if err.type == "NotImplementedError" and "'CPU' backend" in err.message:
        return "the attention kernel has no CPU implementation in this torch"
    last = " ".join(err.trace[-4:])
    if err.type == "AssertionError" and "cpu" in last and "site-packages" in (err.at or ""):
        return f"library code refuses CPU tensors ({err.at})"
    if err.type == "RuntimeError" and "ProcessGroupGloo::allgather: invalid tensor size" in err.message:
        # cache-dit's uneven gather (ulysses_anything) hands all_gather shards of different lengths, which gloo
        # refuses and NCCL takes
        return "gloo's all_gather takes equal shards only, and this sequence is split unevenly (ulysses_anything)"
    return None


def with_stub(proof: ParallelProof, waiting: list[dict], why: str | None) -> ParallelProof:
    """The variants that go through the adapter, not run while its hand-written part is a stub, added as
    `needs-code`: the proof is then `needs-code` unless a variant that ran failed."""
    if not waiting or why is None:
        return proof
    rows = dict(proof.variants) if isinstance(proof.variants, dict) else {}
    rows.update({v["name"]: Variant("needs-code", why=why) for v in waiting})
    if proof.status in ("fail", "error"):
        return ParallelProof(proof.status, why=proof.why, first_divergence=proof.first_divergence, variants=rows)
    return ParallelProof("needs-code", why=why, variants=rows)
