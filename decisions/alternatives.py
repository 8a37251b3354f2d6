"""The other choices a decision below high confidence could have made, each as the revision that makes it.

An alternative is a set of `integrate revise` assignments (`sets`, `unsets`: dotted keys into plan.json), so a
reviewer can take one with a single command and `integrate repair` can try them one by one. Each says which
modules it acts on (`touches`, in the names verify's divergence tables use), so a failed proof's first
divergent module leads to the decisions that touch it. What is listed:

- ForwardPattern: every other pattern the block's signature and returns also bind to.
- CFG style: the other value, when the pipeline's loop was not read with high confidence.
- CP split point: a root split, or the first block's inputs instead (the chart run again without the root).
- CP streams: a stream split at every block (`<list>.*`: cross-attention text) left whole instead, and a side
  module's output split (a face or motion encoder) left whole.
- TP: a column-wise linear that is not part of an attention or FFN pair (modulation, a block input) with
  its output replicated instead of sharded, or kept whole.

Read from a run rather than the plan (offered by `integrate repair`):
- `observed_ranks`: a CP split that cache-dit skipped because the tensor it met had another rank than the plan
  expected ("Expected input tensor to have N dimensions, but got M"; a skipped split does nothing, so the proof
  ran with that tensor whole), at the rank the run met, along the axis as long as the sequence the run cut
  (where the run recorded the tensor's shape; else the planned axis counted from the front or from the back).
- `observed_lengths`: an input of the module where a proof first diverged (or of a module around it) that a rank
  still holds whole at the sequence's full length while the stream beside it was cut: split along that axis at
  the module's hook.
- `observed_whole`: the module where a proof first diverged, or one it runs inside (never a block, nor what holds
  the blocks), run whole: its inputs the run met cut are gathered first, its outputs cut again along the axis as
  long as the sequence (`parallelism.cp.run_whole`). The last resort: the module's work repeats on every rank.

Not listed yet: the CP gather module (the output chain has one candidate the analysis trusts), and TP
attention projections kept whole (the head count would be divided for a projection that is not sharded).
"""

from __future__ import annotations

from typing import Any

from integrate.analyzers.records import ParallelFacts

from integrate.records import to_json

from .records import Alternative, Gather, Plan, RunWhole, Split
from .revise import join_key

_HIGH = "high"


def alternatives(plan: Plan, facts: ParallelFacts | None) -> tuple[Alternative, ...]:
    return (*_patterns(plan), *_cfg(plan), *_cp_root(plan, facts), *_cp_streams(plan), *_cp_side_outputs(plan),
            *_tp(plan))


def _patterns(plan: Plan):
    for i, b in enumerate(plan.cache.block_lists):
        if b.confidence == _HIGH:
            continue
        for alt in b.alternatives:
            if alt != b.forward_pattern:
                yield Alternative(f"ForwardPattern of `{b.attr}`", str(b.forward_pattern), alt,
                                  {join_key(("cache", "block_lists", i, "forward_pattern")): alt}, (), b.confidence,
                                  (b.attr,), "the block's signature and returns bind to it as well")


def _cfg(plan: Plan):
    c = plan.cache
    if c.cfg_confidence == _HIGH:
        return
    for value in ((not c.has_separate_cfg,) if c.has_separate_cfg is not None else (True, False)):
        words = "separate calls per guidance condition" if value else "one batched call"
        yield Alternative("CFG style of the denoising loop", str(c.has_separate_cfg), words,
                          {"cache.has_separate_cfg": value}, (), c.cfg_confidence, (),
                          "the loop's CFG was not read with high confidence")


def _cp_root(plan: Plan, facts: ParallelFacts | None):
    cp = plan.parallelism.cp
    if facts is None or cp.approach != "hook" or cp.confidence == _HIGH or cp.shape != "root split":
        return
    from .cp import decide_cp

    other = decide_cp(facts, root=False)
    if other.approach != "hook" or other.plan == cp.plan:
        return
    yield Alternative("CP split point", "root split (forward's inputs)", "first-block split (the blocks' inputs)",
                      {"parallelism.cp.plan": to_json(other.plan), "parallelism.cp.shape": other.shape}, (),
                      cp.confidence, tuple(sorted(set(cp.plan) | set(other.plan))),
                      "split where the first block takes its inputs, should an op before it not act per token")


def _cp_streams(plan: Plan):
    cp = plan.parallelism.cp
    if cp.approach != "hook" or cp.confidence == _HIGH:
        return
    for hook, value in cp.plan.items():
        if not hook.endswith(".*") or not isinstance(value, dict):  # the streams split at every block's input
            continue  # (not the start, nor a sub-module's query stream, gathered after it: that split stays)
        for param in value:
            if param.isdigit():  # an output split: the sequence the module makes, not an input stream
                continue
            yield Alternative(f"CP split of `{param}` at `{hook}`", "split", "whole on every rank",
                              {}, (join_key(("parallelism", "cp", "plan", hook, param)),), cp.confidence, (hook,),
                              "a stream that only attention without CP consumes must stay whole")


def _cp_side_outputs(plan: Plan):
    """A side module's output split (a face or motion encoder whose tokens a later module reads): whole instead.
    Block hooks, the root and position modules (RoPE, whose split follows the latent's) are not offered."""
    cp = plan.parallelism.cp
    if cp.approach != "hook" or cp.confidence == _HIGH:
        return
    lists = {b.attr for b in plan.parallelism.tp.block_lists} | {b.attr for b in plan.cache.block_lists}
    for hook, value in cp.plan.items():
        if (not hook or hook.split(".")[0] in lists or hook in plan.facts.position_modules
                or not isinstance(value, dict) or not value or not all(k.isdigit() for k in value)):
            continue
        yield Alternative(f"CP split of `{hook}`'s output", "split", "whole on every rank", {},
                          (join_key(("parallelism", "cp", "plan", hook)),), cp.confidence, (hook,),
                          "a module that reads these tokens may run without context parallelism")


def _tp(plan: Plan):
    for i, b in enumerate(plan.parallelism.tp.block_lists):
        if b.confidence == _HIGH:
            continue
        for path, style in b.layer_plan.items():
            role = b.reasons[path].role if path in b.reasons else ""
            where = (f"{b.attr}.*.{path}",)
            k = join_key(("parallelism", "tp", "block_lists", i, "layer_plan", path))
            if style == "colwise" and role in ("modulation", "block_in"):  # attention / FFN pairs stay sharded
                yield Alternative(f"TP of `{b.attr}.*.{path}`", style, "colwise(output=replicate)",
                                  {k: "colwise(output=replicate)"}, (), b.confidence, where,
                                  "its output is read whole (shift / scale / gate chunks, a reshape by full width)")
            if role in ("modulation", "ffn_in", "block_in") and style != "rowwise" and not _pairs(b, path):
                yield Alternative(f"TP of `{b.attr}.*.{path}`", style, "kept whole (replicated)", {}, (k,),
                                  b.confidence, where, "a linear that is cheap to replicate and hard to shard")


def _pairs(b, path: str) -> bool:
    """Does a row-wise linear take this one's sharded output (an FFN's up and down): then it cannot be whole
    alone."""
    reason = b.reasons.get(path)
    ffn = reason is not None and reason.role == "ffn_in"
    return ffn and any(b.reasons[p].role == "ffn_out" for p in b.layer_plan if p in b.reasons)


def applied(alt: Alternative) -> list[tuple[str, Any]]:
    """The alternative's assignments, for `revise`: (key, value) for each set, (key, UNSET) for each unset."""
    from .revise import UNSET

    return [*alt.sets.items(), *((k, UNSET) for k in alt.unsets)]


Shapes = dict[str, dict[str, tuple[tuple[int, ...] | None, tuple[int, ...]]]]  # module -> input -> (whole, rank)


def observed_ranks(plan: Plan, skipped: list[tuple[str, int, int]], shapes: Shapes | None = None
                   ) -> tuple[Alternative, ...]:
    """Alternatives for the CP splits a run saw cache-dit skip: `skipped` holds (module the run was in, rank the
    plan expected, rank the tensor had). Each split planned at a hook that bears on that module (the root's only
    on "forward's inputs") with the expected rank gets the run's rank. Its axis: where the tensor, as the run
    recorded it there (`shapes`), is as long as the sequence the run cut; unrecorded, the planned axis counted
    from the front and, if another, from the back (features last)."""
    cp = plan.parallelism.cp
    full = _full_length(plan, shapes or {})
    out: dict[str, Alternative] = {}
    for module, expected, got in dict.fromkeys(skipped):
        for hook, value in cp.plan.items():
            root = module == "forward's inputs"
            if (hook == "") != root or not root and not _bears(hook, module) or not isinstance(value, dict):
                continue
            for param, split in value.items():
                if not isinstance(split, Split) or split.expected_dims != expected:
                    continue
                key = join_key(("parallelism", "cp", "plan", hook, param))
                what = f"output {param}" if param.isdigit() else f"`{param}`"
                whole = ((shapes or {}).get(module, {}).get(param) or (None,))[0]
                if whole is not None and len(whole) != got:  # recorded at another rank: not the skipped one
                    continue
                if whole is not None and full is not None:
                    dims = tuple(d for d, n in enumerate(whole) if n == full)
                else:
                    dims = (split.split_dim, split.split_dim + got - expected)
                for dim in dict.fromkeys(dims):
                    if not 0 <= dim < got or f"{key}={dim}" in out:
                        continue
                    out[f"{key}={dim}"] = Alternative(
                        f"CP split of {what} at `{hook or 'forward'}`", f"dim {split.split_dim} of {expected}",
                        f"dim {dim} of {got} (the rank the run met)",
                        {key: to_json(Split(dim, got, split.split_output))}, (), "low", (hook,),
                        f"cache-dit skipped this split in `{module}`: it expected {expected} dimensions and met "
                        f"{got}, so the tensor stayed whole", "skipped-split")
    return tuple(out.values())


def _full_length(plan: Plan, shapes: Shapes) -> int | None:
    """The sequence's whole length, where the inputs cut at these modules were all cut along axes of one length:
    those a rank already received shorter (cut before the module; one length there is the answer), else those a
    hook bearing on the module cuts as it is called (a split whose rank is the tensor's: the run records a
    module's inputs before its hooks)."""
    cut = {w[d] for inputs in shapes.values() for w, r in inputs.values() if w is not None and len(w) == len(r)
           for d in range(len(w)) if w[d] > r[d] > 0 and w[d] % r[d] == 0}
    if len(cut) == 1:  # seen cut by the run: that length, over one the hooks would cut (a text stream's)
        return next(iter(cut))
    for module, inputs in shapes.items():
        for hook, value in plan.parallelism.cp.plan.items():
            if not _bears(hook, module) or not isinstance(value, dict):
                continue
            for name, split in value.items():
                whole = inputs.get(name, (None, ()))[0]
                if isinstance(split, Split) and whole is not None and split.expected_dims == len(whole) \
                        and split.split_dim < len(whole):
                    cut.add(whole[split.split_dim])
    return next(iter(cut)) if len(cut) == 1 else None


def _bears(hook: str, module: str) -> bool:
    """Is `module` (`blocks.0`) the hook's module, or one of its blocks (`blocks.*`)?"""
    a, b = hook.split("."), module.split(".")
    return len(a) == len(b) and all(x == y or x == "*" and y.isdigit() for x, y in zip(a, b))


def observed_lengths(plan: Plan, shapes: Shapes) -> tuple[Alternative, ...]:
    """Alternatives for the module where a CP proof first diverged and the modules it runs in, from their tensor
    inputs' shapes (`shapes`: module -> input -> (shape in the 1-process run, shape on a rank)): the inputs the
    plan cut give the sequence's full length; an input not planned at any hook that bears on its module, whole
    on the rank and as long as that along an axis, is offered split there, at every block of its list."""
    full = _full_length(plan, shapes)
    if full is None:  # no stream cut here, or several lengths: nothing tells which axis is the sequence
        return ()
    out = []
    for module, inputs in shapes.items():
        hook = ".".join("*" if part.isdigit() else part for part in module.split("."))
        planned = {p for h, v in plan.parallelism.cp.plan.items() if _bears(h, module) and isinstance(v, dict)
                   for p in v}
        for name, (whole, rank) in inputs.items():
            if not name.isidentifier() or name in planned or whole != rank:
                continue
            for dim in (d for d, n in enumerate(rank) if n == full):
                split = to_json(Split(dim, len(rank), False))
                out.append(Alternative(
                    f"CP split of `{name}` at `{hook}`", "whole on every rank", f"split dim {dim} of {len(rank)}",
                    {join_key(("parallelism", "cp", "plan", hook, name)): split}
                    if hook in plan.parallelism.cp.plan else  # a hook the plan lacks is set whole
                    {join_key(("parallelism", "cp", "plan", hook)): {name: split}}, (),
                    "low", (hook,), f"`{module}` diverged with `{name}` whole on each rank at the sequence's full "
                    f"length {full} (shape {list(rank)}) while the inputs beside it were cut", "full-length"))
    return tuple(out)


Returns = dict[str, tuple[tuple[tuple[int, ...] | None, tuple[int, ...] | None], ...]]  # module -> (whole, rank)


def observed_whole(plan: Plan, shapes: Shapes, returns: Returns) -> tuple[Alternative, ...]:
    """Alternatives that run one module whole, for the module where a CP proof first diverged and each module it
    runs in (`shapes`: their inputs, `returns`: what they returned, each in the 1-process run and on a rank),
    outermost first. A module qualifies when the run met some of its inputs cut along exactly one axis (those are
    gathered), it is no block, holds none and has no hook of the plan on it, and each output it returned is either
    as long as a cut input along exactly one axis (cut again there) or along none (left whole: every rank computes
    the same). Its attention runs without CP (the generated planner pins its processors)."""
    lists = {b.attr for b in plan.parallelism.tp.block_lists} | {b.attr for b in plan.cache.block_lists}
    cp = plan.parallelism.cp
    out = []
    for module in reversed(list(shapes)):  # `shapes` runs innermost first
        parts = module.split(".")
        if not module or any(_holds_blocks(module, attr) for attr in lists) or any(_bears(h, module) for h in cp.plan):
            continue
        gather: dict[str, Gather] = {}
        for name, (whole, rank) in shapes[module].items():
            axes = [d for d in range(len(rank)) if whole is not None and len(whole) == len(rank) and whole[d] > rank[d]]
            if name.isidentifier() and len(axes) == 1:
                gather[name] = Gather(axes[0], len(rank))
        if not gather:
            continue
        full = {shapes[module][name][0][g.gather_dim] for name, g in gather.items()}
        split: dict[str, Split] = {}
        for index, (whole, rank) in enumerate(returns.get(module, ())):
            if whole is None:
                continue
            like = [g.gather_dim for name, g in gather.items() if shapes[module][name][0] == whole]
            if rank is not None and len(rank) == len(whole):
                axes = [d for d in range(len(whole)) if whole[d] > rank[d]]
            elif like:  # the rank's call raised: the axis of a cut input shaped as this output
                axes = like[:1]
            else:  # or the axis as long as a sequence the run cut
                axes = [d for d in range(len(whole)) if whole[d] in full]
            if len(axes) > 1:
                split = {}
                break
            if axes:
                split[str(index)] = Split(axes[0], len(whole), True)
        if not split:  # nothing returned along the sequence (or an axis not told apart): not this module
            continue
        hook = ".".join("*" if part.isdigit() else part for part in parts)
        why = (f"`{module}` diverged under CP with {', '.join(f'`{n}`' for n in gather)} cut: run whole on every "
               "rank, its work repeats there")
        out.append(Alternative(
            f"CP of `{hook}`", "runs on the rank's share of the sequence",
            "runs whole (inputs gathered, outputs cut again)",
            {join_key(("parallelism", "cp", "run_whole", hook)): to_json(RunWhole(gather, split, why))}, (),
            "low", (hook,), why, "run-whole"))
    return tuple(out)


def _holds_blocks(module: str, attr: str) -> bool:
    """Is `module` a block of the list at `attr` (`blocks.3`), the list itself, or a module the list lies in?"""
    return attr == module or attr.startswith(module + ".") or (
        module.startswith(attr + ".") and module[len(attr) + 1:].isdigit())
