"""The tensor-parallelism chart, as code: a layer plan per block list.

Styles use cache-dit's torch ParallelStyles: "colwise" (ColwiseParallel), "rowwise"
(RowwiseParallel), "colwise(output=replicate)" and "rowwise(input=replicate)".

1. Kernels that assume whole tensors (flash_attn, triton, custom ops) are patched first.
2. A fused projection -> the replicate strategy for that attention (no `shard_div_attr`): split into
   equal Q/K/V parts, or into Q/K/V *and* MLP parts of different sizes (sharding that one would need its
   rows rearranged part by part, which the generated planner does not do: kept whole, said so).
3. GQA with KV heads that do not divide the TP size -> FFN-only (attention left whole).
4. Otherwise the standard plan: attention inputs column-wise, outputs row-wise, FFN up column-wise,
   down row-wise, modulation column-wise with a replicated output; divide the head count and every
   attribute that sizes a reshape of a sharded projection (per-head sizes excepted).
5. Linears the meta-device build has and the static read missed (the cross-check) are left whole by the plan:
   an empty layer plan is then low confidence (TP would shard nothing of the list), any other at most medium.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from integrate.analyzers.records import AttentionFact, BlockStructure, LinearRole, ParallelFacts

from integrate.records import Evidence

from .records import CrossCheck, Heads, TpList, TpPlan, TpReason

TP_SIZES = (2, 4, 8)
_PER_HEAD = ("head_dim", "dim_head", "head_size")
_MULTIPLIERS = ("factor", "mult", "ratio")


def decide_tp(facts: ParallelFacts, crosscheck: CrossCheck | None = None) -> TpPlan:
    missed = crosscheck.missed_linears if crosscheck is not None else {}
    lists = tuple(_plan_list(b, missed.get(b.attr, ())) for b in facts.blocks)
    strategy = sorted({x.strategy for x in lists})
    return TpPlan(
        block_lists=lists,
        strategy=strategy[0] if len(strategy) == 1 else "mixed" if strategy else "unknown",
        patch_kernels_first=tuple(e for b in facts.blocks for e in b.kernels),
        confidence=min((x.confidence for x in lists), key=_rank, default="unknown"),
        blocked_by=_not_a_model(facts),
    )


def _not_a_model(facts: ParallelFacts) -> tuple[Evidence, ...]:
    """cache-dit's TP entry asserts a diffusers ModelMixin (read from its source): a transformer whose bases were
    all traced and lead elsewhere (a plain `nn.Module`) cannot be handed to it. Unknown bases do not block: the
    plan stands, with its proof to tell."""
    required, at = facts.tp_requires_model_mixin, facts.model_mixin_at
    if required is None or facts.model_mixin is not False or at is None:
        return ()
    return (Evidence(at.file, at.line, f"the transformer is not a diffusers ModelMixin ({at.why}); "
                     f"{required.why} ({required.file.rsplit('/', 1)[-1]}:{required.line})"),)


def _rank(c: str) -> int:
    return {"unknown": 0, "low": 1, "medium": 2, "high": 3}.get(c, 0)


@dataclass
class _ListChart:
    """One block list's TP plan as its questions fill it in (layer plan keys keep the order they were added in)."""

    confidence: str
    strategy: str = "standard"
    layer_plan: dict[str, str] = field(default_factory=dict)
    shard: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # attention path -> its first query projection, where RoPE may need cutting
    rope: dict[str, str] = field(default_factory=dict)
    risks: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def unsure(self) -> None:
        """Something is not known statically: a high confidence becomes medium."""
        self.confidence = "medium" if self.confidence == "high" else self.confidence


def _plan_list(b: BlockStructure, missed: tuple[str, ...] = ()) -> TpList:
    """One block list's TP plan: each attention sharded by heads (or kept whole), then the block's other Linears by
    their role; `missed`: Linears of the built block the static read did not see (the cross-check)."""
    c = _ListChart("high" if b.attentions else "low")
    gqa_blocked = [a for a in b.attentions if _kv_indivisible(a, 2)]
    if gqa_blocked:
        c.strategy = "ffn-only"
    for a in b.attentions:
        if a in gqa_blocked:
            c.notes.append(f"`{a.path}` left whole: {a.kv_heads[0]}={a.kv_heads[1]} KV heads do not divide TP 2 "
                           "(a replicate plan is correct but usually slower on long sequences: benchmark before using)")
        elif a.fused:
            _replicated_attention(c, a)
        else:
            _sharded_attention(c, a)
    roles = {r.path: r for r in b.linears}
    modules = {m.path: m for m in b.modules}
    for path, r in roles.items():
        if path not in c.layer_plan and r.role not in ("attention_in", "attention_out"):
            _plan_linear(c, path, r)
            where = modules.get(path)
            c.evidence.append(Evidence(where.file if where else "", where.line if where else 0,
                                       f"`{path}` {r.role}: {r.why}"))
    reasons: dict[str, TpReason] = {}
    for path in c.layer_plan:
        r, where = roles.get(path), modules.get(path)
        reasons[path] = TpReason(r.role if r else "processor-owned", r.why if r else "",
                                 where.file if where else "", where.line if where else 0)
    for t in b.tables:
        c.notes.append(f"`{t}` is an nn.Parameter (a modulation table, expert weights): kept whole on every rank")
    if b.kernels:
        c.risks.append("fused or env-gated kernels in the block sources: patch them to plain PyTorch ops before "
                       "parallelize_module (see patch_kernels_first)")
    if b.unknowns:
        c.confidence = "low"
    if missed:
        _missed_linears(c, b, missed)
    elif not c.layer_plan and c.strategy == "standard" and c.confidence in ("high", "medium"):
        # nothing of the block is planned: TP would divide its head counts and shard no Linear (a proof is vacuous)
        why = (f"the layer plan of `{b.attr}` is empty: the static read found no Linear of the block to shard, so TP "
               "would divide head counts and shard nothing; name the block's projections with `integrate revise` "
               "(or plan with the probe, which builds block 0 and lists its Linears)")
        c.confidence = "low"
        c.notes.append(why)
        first = b.evidence[0] if b.evidence else (Evidence(b.modules[0].file, b.modules[0].line, "") if b.modules
                                                    else Evidence("", 0, ""))
        c.evidence.append(Evidence(first.file, first.line, why))
    return TpList(
        attr=b.attr,
        block_class=b.block_class,
        layer_plan=c.layer_plan,
        reasons=reasons,
        shard_div_attr=c.shard,
        strategy=c.strategy,
        confidence=c.confidence,
        risks=tuple(c.risks),
        notes=tuple(c.notes + list(b.unknowns)),
        evidence=tuple(c.evidence),
        heads={a.path: Heads(a.heads, a.kv_heads, a.head_dim) for a in b.attentions},
        rope_shard=c.rope,
    )


def _missed_linears(c: _ListChart, b: BlockStructure, missed: tuple[str, ...]) -> None:
    """Linears the model built on the meta device has in block 0 and the static read missed: the layer plan leaves
    them whole. With nothing else planned, TP would shard nothing of the list (while its head counts are divided):
    low; otherwise the plan is incomplete: at most medium. The evidence points where the module that holds the
    first of them is built."""
    names = ", ".join(f"`{p}`" for p in missed[:6]) + (f" (+{len(missed) - 6} more)" if len(missed) > 6 else "")
    empty = not c.layer_plan
    why = (f"the model built on the meta device has Linears in `{b.attr}.0` that the static read missed: {names}; "
           + ("the layer plan is empty, so TP would shard nothing of this list: add their styles with `integrate "
              "revise` or leave the list to run whole" if empty else
              "the layer plan leaves them whole: check that none of them needs sharding with the ones planned"))
    if empty:
        c.confidence = "low" if c.confidence != "unknown" else c.confidence
    else:
        c.unsure()
    holders = {m.path: m for m in b.modules}
    owner = next((holders[p] for p in _prefixes(missed[0]) if p in holders), None)
    where = (Evidence(owner.file, owner.line, why) if owner is not None else
             Evidence(b.evidence[0].file, b.evidence[0].line, why) if b.evidence else
             Evidence(b.modules[0].file, b.modules[0].line, why) if b.modules else Evidence("", 0, why))
    c.evidence.append(where)
    c.notes.append(why)


def _prefixes(path: str) -> list[str]:
    """`a.b.c` -> ["a.b", "a"]: the modules that hold it, innermost first."""
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def _replicated_attention(c: _ListChart, a: AttentionFact) -> None:
    """An attention with a fused projection, kept whole: sharding one fused from parts of different sizes (Q/K/V
    and MLP rows) would need its rows rearranged part by part, which the generated planner does not do, and one fused
    from equal parts is split by the processor, which must see whole Q/K/V. Its projections run column- then row-wise
    with replicated outputs and inputs, the head count undivided."""
    c.strategy = "replicate" if c.strategy == "standard" else c.strategy
    for p in a.in_projs:
        c.layer_plan[p] = "colwise(output=replicate)"
    for p in a.out_projs:
        c.layer_plan[p] = "rowwise(input=replicate)"
    for p, how in a.fused.items():
        why = ("is split into equal parts by" if a.fused_equal_split else
               "packs parts of different sizes (Q/K/V and MLP rows), split by")
        c.evidence.append(Evidence(a.processor_at.file if a.processor_at else a.kernel.file if a.kernel else "",
                                   a.processor_at.line if a.processor_at else 0,
                                   f"`{p}` {why} {how}: shard it with a replicated output so the processor "
                                   f"sees whole {'Q/K/V' if a.fused_equal_split else 'parts'}; do not divide "
                                   "the head count"))
        if not a.fused_equal_split:
            c.notes.append(f"`{p}`: sharding it would need its rows rearranged part by part (parts of "
                           "different sizes), which the generated planner does not do: kept whole")


def _sharded_attention(c: _ListChart, a: AttentionFact) -> None:
    """An attention sharded by heads: its input projections column-wise, its output ones row-wise, the attributes
    that hold its head count divided, a RoPE as wide as the whole projection cut to the rank's columns; what may not
    divide is a risk."""
    for p in a.in_projs:
        c.layer_plan[p] = "colwise"
    for p in a.out_projs:
        c.layer_plan[p] = "rowwise"
    attrs = _shard_div_attrs(a)
    if attrs:
        c.shard[a.path] = tuple(attrs)
        if a.rope_at is not None and a.in_projs and a.processor is None:
            # the cut wraps the processor's call: with none, an entry would be a no-op in the planner
            c.notes.append(f"`{a.path}` applies RoPE with no processor ({a.rope_at.why}): a RoPE as wide as the "
                           "whole projection is not cut to the rank's columns")
        elif a.rope_at is not None and a.in_projs:
            c.rope[a.path] = a.in_projs[0].removeprefix(a.path + ".")  # relative to the attention module
            c.evidence.append(Evidence(a.rope_at.file, a.rope_at.line,
                                       f"`{a.path}`: {a.rope_at.why}; a RoPE tensor as wide as `{a.in_projs[0]}`'s "
                                       "whole output (applied before the heads are split) is cut to the rank's "
                                       "columns, one as wide as a head is left as it is (checked at run time)"))
    for norm, size in a.qk_norms.items():
        head = a.head_dim[1] if a.head_dim else None
        if size is not None and head is not None and size != head:
            c.risks.append(f"`{a.path}.{norm}` normalises {size} features (all heads) while the projection is "
                           f"sharded: replace it with a distributed RMSNorm (all-reduce the mean square)")
    for size in TP_SIZES:
        if a.heads and a.heads[1] is not None and a.heads[1] % size:
            c.risks.append(f"`{a.path}`: {a.heads[0]}={a.heads[1]} is not divisible by TP {size}")
        if a.kv_heads and a.kv_heads[1] is not None and a.kv_heads[1] % size and size != 2:
            c.risks.append(f"`{a.path}`: {a.kv_heads[0]}={a.kv_heads[1]} KV heads are not divisible by TP {size}")
    if a.heads is None or a.heads[1] is None:
        c.unsure()
        c.notes.append(f"`{a.path}`: head count not known statically")


def _plan_linear(c: _ListChart, path: str, r: LinearRole) -> None:
    """A Linear of the block outside its attentions, by its role: what feeds a row-wise Linear is column-wise, what
    others read whole is replicated, the block's outputs are row-wise; a router and an unknown role stay whole."""
    if r.role == "ffn_in" or (r.role == "block_in" and r.feeds_rowwise):
        c.layer_plan[path] = "colwise"
        if r.role == "block_in" and isinstance(r.parts_width, str) and isinstance(r.parts_by, tuple):
            # the block cuts its output by a width it holds: each rank's shard holds 1/size of each part
            owner = r.parts_by[0]
            c.shard[owner] = tuple(dict.fromkeys((*c.shard.get(owner, ()), r.parts_width)))
    elif r.role == "block_in":
        # its output goes on to something other than a row-wise Linear (an attention's own projections, a
        # chunk into shift / scale / gate): every rank needs it whole
        c.layer_plan[path] = "colwise(output=replicate)"
    elif r.role == "ffn_out" or r.role == "block_out":
        c.layer_plan[path] = "rowwise"
        if r.fused_out_down:
            c.strategy = "fused-weight rearrangement"
            c.risks.append(f"`{path}`: {r.why}; reorder its input rows so each rank's slice pairs its attention "
                           "heads with its MLP slice before sharding")
    elif r.role == "modulation":
        c.layer_plan[path] = "colwise(output=replicate)"
    elif r.role == "router":
        c.notes.append(f"`{path}`: an MoE router, kept whole ({r.why})")
    elif r.role == "inline_attention":
        # sharding it would need the head count the block reshapes with divided, and the block is no
        # attention module the plan divides attributes of: every rank computes the whole attention
        c.layer_plan[path] = "colwise(output=replicate)"
        c.notes.append(f"`{path}`: {r.why}; kept whole (its heads are not sharded)")
    else:
        c.notes.append(f"`{path}`: role unknown, left whole")
        c.unsure()


def _kv_indivisible(a: AttentionFact, size: int) -> bool:
    if not a.kv_heads or a.kv_heads[1] is None or not a.heads or a.heads[1] is None:
        return False
    return a.kv_heads[1] < a.heads[1] and a.kv_heads[1] % size != 0


def _shard_div_attrs(a: AttentionFact) -> list[str]:
    """The head count, KV heads, and every other attribute that sizes a reshape of a sharded projection."""
    out: list[str] = []
    if a.heads:
        out.append(a.heads[0])
    if a.kv_heads:
        out.append(a.kv_heads[0])
    for attr in a.reshape_attrs:
        low = attr.lower()
        if attr in out or any(w in low for w in _PER_HEAD) or any(w in low for w in _MULTIPLIERS):
            continue
        out.append(attr)
    return out
