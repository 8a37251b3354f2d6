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

Not listed yet: the CP gather module (the output chain has one candidate the analysis trusts), and TP
attention projections kept whole (the head count would be divided for a projection that is not sharded).
"""

from __future__ import annotations

from typing import Any

from integrate.analyzers.records import ParallelFacts

from integrate.records import to_json

from .records import Alternative, Plan
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
