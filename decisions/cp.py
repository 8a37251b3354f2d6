"""The context-parallelism chart, as code.

Hook-based first, a hybrid (hooks plus one minimal method patch) second, a rewrite of forward
never. The plan uses cache-dit's hook keys: `""` for forward's own inputs, `"<list>.0"` for the
first block, `"<list>.*"` for every block, a module path for an output-split or a gather.

The questions, in the order `decide_cp` asks them, each a function below answered from the facts with
evidence:
1. `_split_at_root`: can forward's inputs be split at the root? Only if every op between an input and
   the first block acts per token and nothing is derived from the local sequence length.
2. `_split_fresh_walk`: otherwise each walk that starts a fresh sequence is split at its first block.
3. `_split_positions`: position tables built by a sub-module from unsplit inputs get an output split;
   those built by a plain method or inline code are split at every block's input.
4. `_split_cross_attention_text` and `_split_side_modules`: text every block reads but does not return,
   and modules whose output the loop body joins into a split stream, are split too.
5. `_gather`: a list whose output is rebuilt before the next list gathers at its last block; the last
   list gathers at the last module applied before the output is reshaped (or at its last block when the
   sequence is sliced or joined first).
6. `_extras`: masks over the joint sequence must be reordered; head counts decide Ulysses-anything.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from integrate.analyzers.forward import is_length
from integrate.analyzers.records import BlockStructure, ListFlowFact, ParallelFacts, SequenceFact

from integrate.records import Evidence

from .records import (
    CpPlan,
    DiffusersPlan,
    Gather,
    Hook,
    HybridPatch,
    KernelMend,
    KvExpand,
    MaskMend,
    MaskReorder,
    MaskSite,
    RopeDriftFix,
    RunWhole,
    Split,
    UlyssesAnything,
)

STREAM = Split(split_dim=1, expected_dims=3, split_output=False)
MASK_ROWS = Split(split_dim=-1, expected_dims=None, split_output=False)  # a per-token mask: its last axis, the tokens
GATHER = Gather(gather_dim=1, expected_dims=3)
TABLE = Split(split_dim=0, expected_dims=2, split_output=False)  # an [S, D] table, e.g. one RoPE cos/sin
# one RoPE tensor of a ready-made pair whose layout nothing documents: the tokens sit second to last in each of the
# usual layouts ([S, D], [B, S, D], [B, H, S, D]); no rank is checked, since none is read
ROPE_ASSUMED = Split(split_dim=-2, expected_dims=None, split_output=False)
CP_SIZES = (2, 4, 8)
TEXT_STREAMS = ("encoder_hidden_states", "context", "txt", "y", "cond", "text_states", "prompt_embeds")
NO_HYBRID = HybridPatch(False, None, "every sequence tensor is reachable by a hook")


def _at(e: Evidence | None, file: str, line: int, why: str) -> Evidence:
    """`why` at `e`'s place, or at (file, line) when there is no `e`."""
    return Evidence(e.file, e.line, why) if e is not None else Evidence(file, line, why)


@dataclass
class _Chart:
    """The plan as the questions fill it in (hook keys keep the order they were added in)."""

    facts: ParallelFacts
    seq: SequenceFact
    plan: dict[str, Hook] = field(default_factory=dict)
    evidence: list[Evidence] = field(default_factory=list)
    risks: list[str] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)
    split_params: set[str] = field(default_factory=set)  # forward inputs split at the root
    root: bool = False
    root_walks: set[str] = field(default_factory=set)  # later walks whose fresh streams the root split covers
    # attention modules inside a block list kept out of CP (`<list>.*.<path>`), with the text they read kept whole
    local: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.unknowns = list(self.seq.unknowns)
        self.blocks = {b.attr: b for b in self.facts.blocks}

    def inputs(self, key: str) -> dict:
        return self.plan.setdefault(key, {})

    def why(self, e: Evidence | None, lf: ListFlowFact | None, why: str) -> None:
        self.evidence.append(_at(e, self.seq.file, lf.loop_line if lf else self.seq.forward_line, why))


def decide_cp(facts: ParallelFacts, *, root: bool = True) -> CpPlan:
    """The CP chart; `root=False` asks for the plan without a root split (the alternative a reviewer or
    `integrate repair` may try when the root split is not of high confidence)."""
    seq = facts.sequence
    if seq is None or not seq.lists:
        mask, rope, uaa, risks = _extras(facts, seq, {}, joint=False)
        return CpPlan("unknown", None, {}, "unknown", (), tuple(risks),
                      ("no block loop found in the transformer's forward: nothing to split",), mask, rope, uaa,
                      NO_HYBRID, None)
    c = _Chart(facts, seq)
    if root:
        _split_at_root(c)
    if not c.root:
        for b in seq.root_blockers:
            c.evidence.append(Evidence(b.file, b.line, f"no root split: {b.why}"))
    lists = [lf for lf in seq.lists if c.blocks.get(lf.attr) is None or c.blocks[lf.attr].built]
    for lf in seq.lists:
        if lf not in lists:
            c.why(None, lf, f"`{lf.attr}` is not built for this config: left out of the plan")
    per_module = {lf.attr for lf in lists if c.blocks.get(lf.attr) is not None and c.blocks[lf.attr].surgery}
    shape = "sub-module hooks" if per_module else "root split" if c.root else "first-block split"
    _split_lists(c, lists, per_module)
    _gather(c, lists, per_module)
    whole = _run_routers_whole(c, lists, per_module) | _run_regrouping_whole(c, lists)
    # a joint sequence: two streams in one block, or a text split at every block that the attention joins to
    # the block's own keys (NucleusMoE: image queries against [image; text] keys)
    joint = any(len(lf.streams) > 1 for lf in seq.lists) or bool(_joined_text(c, lists))
    mask, rope, uaa, extra_risks = _extras(facts, seq, c.plan, joint)
    confidence = "medium" if not c.unknowns else "low"
    if any(bi.producer_kind == "unknown" for lf in seq.lists for bi in lf.inputs if bi.role == "position"):
        confidence = "low"
    if c.root:
        c.risks += [f"{r.why} ({r.file.rsplit('/', 1)[-1]}:{r.line})" for r in seq.root_risks]
        if "return_dict" in seq.forward_params:
            c.risks.append("a root split hooks the transformer itself, and cache-dit's split hook raises on an output "
                           "that is no tensor or tuple: call it with `return_dict=False` (as diffusers' pipelines do)")
    evidence = list(dict.fromkeys(c.evidence))  # first occurrence of each (file, line, why)
    kept = frozenset(c.local)  # attention the planner keeps out of CP: nothing CP's attention refuses applies
    blocked, mends, sdpa, kv_expand = _attention_questions(c, lists, per_module, kept, evidence)
    if blocked:
        confidence = "low"
    local = tuple(dict.fromkeys(_local_attention(seq, shape) + tuple(c.local)))
    evidence += [dataclasses.replace(e, why=f"{e.why}, over tensors no hook splits: kept out of context "
                                              "parallelism (cache-dit gives the attention modules the parallel "
                                              "config)") for e in (seq.outside_attention[k] for k in local
                                                              if k in seq.outside_attention)]
    handed, hand_evidence, unsure = _hand_config(facts, lists, kept | frozenset(local))
    evidence += hand_evidence
    c.unknowns += unsure
    return CpPlan("hook", shape, c.plan, "low" if unsure else confidence, tuple(evidence),
                  tuple(c.risks + extra_risks), tuple(c.unknowns), mask, rope, uaa, NO_HYBRID, _compare(facts, c.plan),
                  _lengths(c), blocked, _ring_masks(facts, lists, kept), local_attention=local, kv_expand=kv_expand,
                  mask_mend=mends, sdpa_mend=sdpa, hand_config=handed, run_whole=whole)


def _split_lists(c: _Chart, lists: list[ListFlowFact], per_module: set[str]) -> None:
    """Each block list's inputs, in the chart's order: sub-module hooks for a list whose blocks need surgery, else
    its token inputs, a later walk's fresh streams, its positions, the text its cross-attention reads and the
    modules beside its blocks."""
    for i, lf in enumerate(lists):
        if lf.attr in per_module:
            _submodule_hooks(c, c.blocks[lf.attr], lf)
            continue
        _split_token_inputs(c, lf)
        _split_fresh_walk(c, i, lf)
        _split_positions(c, i, lf)
        _split_cross_attention_text(c, lf)
        _split_side_modules(c, lf)


def _run_routers_whole(c: _Chart, lists: list[ListFlowFact], per_module: set[str]) -> dict[str, RunWhole]:
    """An MoE layer in a block that routes by expert choice (each expert picks its tokens from the whole sequence,
    `BlockStructure.token_routing`) runs whole under CP: its stream inputs gathered along the axis the stream is cut
    on, its output cut again there. On a rank's share each expert would rank other tokens. Its work repeats on
    every rank (the cost, said in the risks); only where the block calls it with the stream and the stream's cut is
    read from the plan, else an unknown."""
    out: dict[str, RunWhole] = {}
    for lf in lists:
        block = c.blocks.get(lf.attr)
        if block is None or lf.attr in per_module:
            continue
        for path, e in block.token_routing:
            call = next((x for x in block.calls if x.path == path), None)
            names = [p for p, role in call.inputs.items() if role == "stream"] if call is not None else []
            cut = _stream_cut(c, lf)
            if not names or cut is None:
                c.unknowns.append(f"`{lf.attr}[i].{path}` picks tokens from the whole sequence ({e.why}, "
                                  f"{Path(e.file).name}:{e.line}), but its call with the stream or the stream's cut "
                                  "was not read: run it whole by hand")
                continue
            dim, dims = cut
            why = (f"`{lf.attr}[i].{path}`: {e.why}; on a rank's share it would pick among other tokens: run whole "
                   f"on every rank ({', '.join(f'`{n}`' for n in names)} gathered on dim {dim}, its output cut "
                   "again)")
            out[f"{lf.attr}.*.{path}"] = RunWhole({n: Gather(dim, dims) for n in names}, {"0": Split(dim, dims, True)},
                                                  why)
            c.evidence.append(Evidence(e.file, e.line, why))
            c.risks.append(f"`{lf.attr}[i].{path}` runs whole on every rank (expert-choice routing over the whole "
                           "sequence): its work repeats there, in every block where the module sits at that path")
    return out


def _run_regrouping_whole(c: _Chart, lists: list[ListFlowFact]) -> dict[str, RunWhole]:
    """An attention module the loop body calls beside the blocks with the stream, that lays the sequence out by a
    count read from another input's shape (`ParallelFacts.regrouping`: Wan Animate's face adapter groups the
    tokens per frame of the motion vector it attends to), runs whole under CP: the stream gathered before it, its
    output cut again. Its work repeats on every rank."""
    out: dict[str, RunWhole] = {}
    walked = {lf.attr: lf for lf in lists}
    for attr, key, param, e in c.facts.regrouping:
        cut = _stream_cut(c, walked[attr]) if attr in walked else None
        if cut is None:
            c.unknowns.append(f"`{key}` regroups the sequence ({e.why}, {Path(e.file).name}:{e.line}), but the "
                              "stream's cut was not read: run it whole by hand")
            continue
        dim, dims = cut
        why = (f"`{key}`: {e.why}; on a rank's share of the sequence the groups fall elsewhere: run whole on every "
               f"rank (`{param}` gathered on dim {dim}, its output cut again)")
        out[key] = RunWhole({param: Gather(dim, dims)}, {"0": Split(dim, dims, True)}, why)
        c.evidence.append(Evidence(e.file, e.line, why))
        c.risks.append(f"`{key}` runs whole on every rank (it regroups the sequence by another input's count): its "
                       "work repeats there")
    return out


def _stream_cut(c: _Chart, lf: ListFlowFact) -> tuple[int, int] | None:
    """(axis, rank) the plan cuts the list's stream at: its split at a block of the list or at the root, else the
    gather that puts it back together after the list."""
    roots = {c.seq.root_params.get(v) for v in lf.streams.values()}
    for key, spec in c.plan.items():
        if not isinstance(spec, dict):
            continue
        names = set(lf.streams) if key.startswith(lf.attr + ".") else roots if key == "" else set()
        for name in names & set(spec):
            split = spec[name]
            if isinstance(split, Split) and split.expected_dims is not None:
                return split.split_dim, split.expected_dims
    gathers = [spec for spec in c.plan.values() if isinstance(spec, Gather)]
    return (gathers[-1].gather_dim, gathers[-1].expected_dims) if gathers else None


# what each kind of attention CP's attention refuses adds to the plan's unknowns, in the order they are listed
_BLOCKED_UNKNOWNS = {
    "kernelless": "an attention module calls no attention kernel context parallelism reaches: see blocked_by",
    "fixed": "a processor fixes an attention backend that diffusers' dispatcher does not run as context-parallel "
             "attention: see blocked_by",
    "gqa": "a processor runs grouped-query attention, which cache-dit's context-parallel attention refuses through "
           "diffusers' dispatcher: see blocked_by",
    "direct": "an attention kernel is called directly, where cache-dit's context-parallel attention cannot reach it: "
              "see blocked_by",
    "legacy": "a processor sizes its mask for the key length it sees: see blocked_by",
    "after": "a processor applies a mask to its output per query, which under CP needs the local slice while the "
             "kernel needs the whole key mask: see blocked_by",
    "causal": "a processor runs causal attention, which cache-dit's context-parallel attention refuses: see "
              "blocked_by",
    "sliced": "a processor cuts query, key or value along the sequence before the attention kernel, at positions of "
              "the whole sequence: see blocked_by",
    "unread": "a block passes its sequence to a module of a class not read (handed to its constructor), which may "
              "attend without a kernel context parallelism reaches: see blocked_by",
}


def _attention_questions(c: _Chart, lists: list[ListFlowFact], per_module: set[str], kept: frozenset[str],
                         evidence: list[Evidence]) -> tuple:
    """The attention questions, for attention not `kept` out of CP: masks the planner mends, processors it routes
    through cache-dit's dispatcher or whose key/value heads it repeats (their evidence added to `evidence`), and
    what CP's attention refuses (each kind adds an unknown). Returns (blocked_by, mask mends, SDPA mends, KV
    expansions)."""
    facts, seq = c.facts, c.seq
    hooked = [lf for lf in lists if lf.attr not in per_module]
    mends, mended = _mend_masks(c, hooked, kept)
    evidence += [e for m in mends for e in m.at]
    legacy = _legacy_masks(facts, seq, lists, kept | mended)
    causal, after = _causal(facts, lists, kept), _masks_after(facts, lists, kept | mended)
    sdpa = _sdpa_mends(facts, hooked, kept)
    routed = frozenset(p for x in sdpa for p in x.attentions)
    direct, fixed = _direct_kernels(facts, lists, kept, routed), _local_backends(facts, lists, kept)
    for x in sdpa:
        evidence += [Evidence(e.file, e.line, f"{e.why}: under CP the planner routes it through cache-dit's "
                              f"dispatcher (it replaces `{x.alias}` in `{x.module}` with torch.nn.functional whose "
                              "`scaled_dot_product_attention` does so while those processors run)") for e in x.at]
    kernelless = _no_kernel(facts, hooked, kept)
    gqa, kv_expand = _gqa(facts, lists, kept)
    for x in kv_expand:
        evidence += [Evidence(e.file, e.line, f"{e.why}: under CP the planner repeats its key/value heads to the query "
                              f"heads' count and calls `{x.function}` with `enable_gqa=False` (the same attention; "
                              "cache-dit's context-parallel attention refuses GQA)") for e in x.at]
    walked = {lf.attr for lf in lists}
    unread = tuple(Evidence(e.file, e.line, f"`{b.attr}[i]`: {e.why}: whether it attends over the whole sequence "
                            "(through a kernel context parallelism reaches, or not) is unknown")
                   for b in facts.blocks if b.attr in walked for e in b.unread)
    sliced = tuple(e for b in facts.blocks if b.attr in walked for e in b.kernel_slices)
    found = {"kernelless": kernelless, "fixed": fixed, "gqa": gqa, "direct": direct, "legacy": legacy,
             "after": after, "causal": causal, "unread": unread, "sliced": sliced}
    c.unknowns += [why for kind, why in _BLOCKED_UNKNOWNS.items() if found[kind]]
    return legacy + causal + after + direct + gqa + fixed + kernelless + sliced + unread, mends, sdpa, kv_expand


def _hand_config(facts: ParallelFacts, lists: list[ListFlowFact], kept: frozenset[str]
                 ) -> tuple[tuple[str, ...], list[Evidence], list[str]]:
    """The attention modules of the walked lists whose processor cache-dit does not hand the parallel config
    (their class derives from none of the diffusers attention classes it lists: `cp_config_given` false): their
    processors would attend within the rank's own tokens, so the generated planner hands it to them. (paths, the
    evidence, an unknown for each module whose bases were not all traced.)"""
    walked = {lf.attr for lf in lists}
    handed, evidence, unsure = [], [], []
    listed = facts.cp_attention_classes
    for b in facts.blocks:
        for a in b.attentions:
            path = f"{a.block_list}.*.{a.path}"
            if a.block_list not in walked or a.processor is None or path in kept or path in handed:
                continue
            at = a.cp_config_at
            if a.cp_config_given is False and at is not None:
                handed.append(path)
                evidence.append(Evidence(at.file, at.line, f"`{a.block_list}[i].{a.path}` ({a.cls}: {at.why}) is no "
                                         "class cache-dit hands the parallel config"
                                         + (f" ({Path(listed.file).name}:{listed.line})" if listed else "")
                                         + ": the planner hands it to its processor"))
            elif a.cp_config_given is None and at is not None:
                unsure.append(f"whether cache-dit hands `{a.block_list}[i].{a.path}`'s processor the parallel config "
                              f"is unknown: {at.why} ({Path(at.file).name}:{at.line})")
    return tuple(handed), evidence, unsure


def _local_attention(seq: SequenceFact, shape: str) -> tuple[str, ...]:
    """The attention modules the planner keeps out of CP: those the sequence analysis found outside every split
    walk. Not under a root split, where forward's own inputs are split before any of them runs."""
    if shape == "root split":
        return ()
    return tuple(sorted(seq.outside_attention))


def _joined_text(c: _Chart, lists: list[ListFlowFact]) -> list[str]:
    """The walked lists whose text is split at every block and whose attention joins it to the block's own
    keys: under Ulysses those keys arrive as [own_0, text_0, own_1, text_1, ...], not in the mask's order."""
    out = []
    for lf in lists:
        split_text = any(p in TEXT_STREAMS for p in c.plan.get(f"{lf.attr}.*", {}))
        block = c.blocks.get(lf.attr)
        if split_text and block is not None and any(a.joins_at is not None for a in block.attentions):
            out.append(lf.attr)
    return out


def _mend_masks(c: _Chart, lists: list[ListFlowFact],
                local: frozenset[str]) -> tuple[tuple[MaskMend, ...], frozenset[str]]:
    """The masks the planner mends at the kernel (`MaskMend`, one per dispatcher global) and the attention modules
    (`<list>.*.<path>`) mended so, which the mask refusals then leave alone.

    Two cases, each only for a processor whose kernel is a dispatcher the processor's module binds as a global
    (something the planner can wrap), in a walked list read hook by hook:
    - the processor sizes the mask with the legacy `prepare_attention_mask(mask, key_length, batch)`: given the
      local key length, it would pad a whole mask; its `prepare_attention_mask` keeps such a mask whole, and at the
      kernel the mask's per-head rows are cut to the rank's heads;
    - the processor multiplies its output by a mask, one row per query, that the block gets as an input: that input
      is cut with the tokens at every block (the rows are then the rank's own queries), and at the kernel the
      rank's share of the keys' mask is gathered from every rank. Only where the list's own stream is split, and
      the block inputs that reach the mask were read."""
    per_global: dict[tuple[str, str], tuple[list[str], list[str], list[Evidence]]] = {}
    mended: set[str] = set()
    by_attr = {lf.attr: lf for lf in lists}
    for a in facts_attention(c.facts, local):
        lf = by_attr.get(a.block_list)
        at = f"{a.block_list}.*.{a.path}"
        if lf is None or a.kernel_global is None or a.kernel_global[1] not in _DISPATCH:
            continue
        prepared, split, why = [], [], []
        if a.mask_prepared_at is not None:
            prepared.append(at)
            why.append(Evidence(a.mask_prepared_at.file, a.mask_prepared_at.line,
                                f"`{a.block_list}[i].{a.path}` ({a.processor or a.cls}): {a.mask_prepared_at.why}; "
                                "under CP its `prepare_attention_mask` keeps a mask over every rank's keys whole, and "
                                f"the wrapped `{a.kernel_global[1]}` cuts its per-head rows to the rank's heads"))
        if a.mask_after_at is not None:
            inputs = {bi.param: bi for bi in lf.inputs}
            fed = [p for p in a.mask_after_inputs if p in inputs and inputs[p].role in ("mask", "other")]
            if not fed or not _stream_split(c, lf):
                continue  # not read, or nothing to cut it with: the refusal stands
            for p in fed:
                split.append(f"{lf.attr}.*:{p}")
                spec = c.inputs(f"{lf.attr}.*")
                spec.setdefault(p, MASK_ROWS)
            why.append(Evidence(a.mask_after_at.file, a.mask_after_at.line,
                                f"`{a.block_list}[i].{a.path}` ({a.processor or a.cls}): {a.mask_after_at.why}; "
                                f"{', '.join(f'`{p}`' for p in fed)} is cut with the tokens at every block (its last "
                                f"axis), and the wrapped `{a.kernel_global[1]}` gathers the keys' mask from every "
                                "rank"))
        if not why:
            continue
        mended.add(at)
        entry = per_global.setdefault(tuple(a.kernel_global), ([], [], []))
        entry[0].extend(prepared)
        entry[1].extend(split)
        entry[2].extend(why)
    mends = tuple(MaskMend(m, f, tuple(dict.fromkeys(pr)), tuple(dict.fromkeys(sp)), tuple(dict.fromkeys(w)))
                  for (m, f), (pr, sp, w) in sorted(per_global.items()))
    return mends, frozenset(mended)


def _stream_split(c: _Chart, lf: ListFlowFact) -> bool:
    """Whether the plan splits the list's own stream: at the root (its streams come from forward inputs split there),
    at one of its blocks, or in an earlier walk it continues."""
    if not lf.fresh or (c.root and any(c.seq.root_params.get(v) in c.split_params for v in lf.streams.values())):
        return True
    return any(key.startswith(lf.attr + ".") and isinstance(spec, dict) and set(spec) & set(lf.streams)
               for key, spec in c.plan.items())


def _legacy_masks(facts: ParallelFacts, seq: SequenceFact, lists: list[ListFlowFact],
                  local: frozenset[str] = frozenset()) -> tuple[Evidence, ...]:
    """Attentions in a walked list whose processor takes a mask and sizes it with the legacy
    `prepare_attention_mask(mask, key_length, batch)`: under CP the key length it sees is the local one and
    the heads are still all of them, so the mask is padded to a wrong length (diffusers pads by the target
    length) and shaped for heads the rank does not hold. Handling it means patching the processor; the plan
    refuses it with the line instead of writing a planner that fails at run time."""
    if not seq.masks:
        return ()  # no mask reaches the blocks
    walked = {lf.attr for lf in lists}
    out = []
    for a in facts_attention(facts, local):  # one run outside CP over a whole text sees the whole key length
        if a.block_list in walked and a.mask_at is not None and a.mask_prepared_at is not None:
            at = a.mask_prepared_at
            out.append(Evidence(at.file, at.line, f"`{a.block_list}[i].{a.path}` ({a.processor or a.cls}): "
                                                  f"{at.why}; under CP that is the local length, and the mask "
                                                  "comes out padded to the wrong length"))
    return tuple(dict.fromkeys(out))


def _masks_after(facts: ParallelFacts, lists: list[ListFlowFact],
                 local: frozenset[str] = frozenset()) -> tuple[Evidence, ...]:
    """Attentions in a walked list that multiply their output by a mask after the kernel, in a walk that passes
    its blocks a mask. Under CP the rows of that output are the rank's own queries, so the mask must be the
    local slice, while a mask given to the kernel must cover every key (Ulysses gathers the sequence, ring
    passes the keys round): the hooks split a tensor or leave it whole, never both. It takes a processor patch
    (slice the mask by rank for the output), so the plan refuses it with the line."""
    masked = _masked_lists(facts, lists, in_kwargs=False)
    return tuple(dict.fromkeys(
        Evidence(a.mask_after_at.file, a.mask_after_at.line,
                 f"`{a.block_list}[i].{a.path}` ({a.processor or a.cls}): {a.mask_after_at.why}; under CP those "
                 "rows are the rank's own queries, so the mask would have to be sliced per rank there and whole "
                 "in the kernel")
        for a in facts_attention(facts, local) if a.block_list in masked and a.mask_after_at is not None))


def _masked_lists(facts: ParallelFacts, lists: list[ListFlowFact], *, in_kwargs: bool) -> set[str]:
    """The walked lists whose blocks are passed a mask: as a mask argument, or (`in_kwargs`) inside a keyword dict
    forward builds while it builds masks (NucleusMoE hands `attention_mask` over in `attention_kwargs`)."""
    seq_masks = in_kwargs and bool(facts.sequence and facts.sequence.masks)
    return {lf.attr for lf in lists if any(
        (bi.role == "mask" and not bi.arg.startswith("<default")) or
        (seq_masks and "kwargs" in bi.param and bi.producer_kind == "expression") for bi in lf.inputs)}


def _ring_masks(facts: ParallelFacts, lists: list[ListFlowFact],
                local: frozenset[str] = frozenset()) -> tuple[Evidence, ...]:
    """Why ring attention cannot run: attentions in a walked list that take a mask, in a walk that passes its
    blocks one, while the installed cache-dit's attention with log-sum-exp (ring's merge) refuses any mask.
    Ulysses is unaffected (it runs the plain kernel on whole sequences)."""
    refusal = facts.ring_refuses_masks
    masked = _masked_lists(facts, lists, in_kwargs=True)
    hits = [Evidence(a.mask_at.file, a.mask_at.line, f"`{a.block_list}[i].{a.path}` ({a.processor or a.cls}): "
                     f"{a.mask_at.why}, which ring attention cannot take")
            for a in facts_attention(facts, local) if a.block_list in masked and a.mask_at is not None]
    if refusal is None or not hits:
        return ()
    return tuple(dict.fromkeys(hits)) + (refusal,)


def _causal(facts: ParallelFacts, lists: list[ListFlowFact],
            local: frozenset[str] = frozenset()) -> tuple[Evidence, ...]:
    """Attentions in a walked list whose kernel call passes `is_causal` (other than False): cache-dit's
    templated context-parallel attention raises on causal attention, so CP is refused with the line."""
    walked = {lf.attr for lf in lists}
    return tuple(dict.fromkeys(
        Evidence(a.causal_at.file, a.causal_at.line,
                 f"`{a.block_list}[i].{a.path}` ({a.processor or a.cls}): {a.causal_at.why}; cache-dit's "
                 "context-parallel attention does not run causal attention")
        for a in facts_attention(facts, local) if a.block_list in walked and a.causal_at is not None))


_DISPATCH = ("dispatch_attention_fn", "_dispatch_attention_fn")  # diffusers' and cache-dit's dispatchers


def _direct_kernels(facts: ParallelFacts, lists: list[ListFlowFact], local: frozenset[str] = frozenset(),
                    mended: frozenset[str] = frozenset()) -> tuple[Evidence, ...]:
    """Attentions in a walked list whose kernel is a plain call (`F.scaled_dot_product_attention`, a repository's
    own `attention(q, k, v)`), not diffusers' `dispatch_attention_fn`: context parallelism reaches attention only
    through a dispatcher given the module's parallel config, so with the sequence split each rank would attend
    within its own shard. The processor must be patched to call cache-dit's dispatcher (as cache-dit does for
    CogVideoX), which no hook does."""
    walked = {lf.attr for lf in lists}
    out = []
    for a in facts_attention(facts, local):
        name = a.kernel_name
        if a.block_list not in walked or a.kernel is None or not name or name.rsplit(".", 1)[-1] in _DISPATCH:
            continue
        if f"{a.block_list}.*.{a.path}" in mended:  # routed through the dispatcher (`_sdpa_mends`)
            continue
        out.append(Evidence(a.kernel.file, a.kernel.line,
                            f"`{a.block_list}[i].{a.path}` ({a.processor or a.cls}) calls `{name}` directly: "
                            "cache-dit's context-parallel attention is reached only through a dispatcher given the "
                            "parallel config; patch the processor to call cache-dit's `_dispatch_attention_fn`"))
    return tuple(dict.fromkeys(out))


def _sdpa_mends(facts: ParallelFacts, lists: list[ListFlowFact],
                local: frozenset[str] = frozenset()) -> tuple[KernelMend, ...]:
    """The direct kernel calls a generated planner can route through cache-dit's dispatcher: torch's
    `scaled_dot_product_attention` reached as `<alias>.scaled_dot_product_attention` of a module-level alias of
    torch.nn.functional (CogVideoX's, DiT's, CogView's processors), one record per (module, alias). Not where the
    processor takes a mask in a walk whose blocks are passed one (the routed call does not fit a mask to the
    rank's keys), nor where no processor makes the call (an attention module's own forward: cache-dit gives its
    parallel config to processors only): those stay refusals."""
    walked = {lf.attr for lf in lists}
    masked = _masked_lists(facts, lists, in_kwargs=True)
    found: dict[tuple[str, str], tuple[list[str], list[Evidence]]] = {}
    for a in facts_attention(facts, local):
        if a.block_list not in walked or a.kernel is None or a.sdpa_global is None:
            continue
        if a.processor is None or (a.mask_at is not None and a.block_list in masked):
            # the routing keys on a processor's call (cache-dit hands its parallel config to processors): a module
            # whose own forward calls the kernel has none; nor can it fit a mask
            continue
        paths, at = found.setdefault(a.sdpa_global, ([], []))
        paths.append(f"{a.block_list}.*.{a.path}")
        at.append(Evidence(a.kernel.file, a.kernel.line, f"`{a.block_list}[i].{a.path}` ({a.processor}) "
                                                         f"calls `{a.kernel_name}` directly"))
    return tuple(KernelMend(module, alias, tuple(dict.fromkeys(paths)), tuple(dict.fromkeys(at)))
                 for (module, alias), (paths, at) in found.items())


def _no_kernel(facts: ParallelFacts, lists: list[ListFlowFact],
               local: frozenset[str] = frozenset()) -> tuple[Evidence, ...]:
    """Attentions in a walked list whose processor (or forward) calls no attention kernel the analysis read: linear
    attention (`relu(q) @ (relu(k)^T v)` over every token) or a kernel not found. Context parallelism reaches
    attention only through the dispatcher, so on a split sequence such a module would attend within the rank's
    shard: refused with its processor's line (unknown, never planned as if it were reached)."""
    walked = {lf.attr for lf in lists}
    out = []
    for b in facts.blocks:
        for a in b.attentions:
            if a.block_list not in walked or a.kernel is not None or f"{a.block_list}.*.{a.path}" in local:
                continue
            where = _attention_at(b, a)
            out.append(Evidence(where.file if where else (facts.sequence.file if facts.sequence else ""),
                                where.line if where else 0,
                                f"`{a.block_list}[i].{a.path}` ({a.processor or a.cls}) calls no attention kernel that "
                                "context parallelism reaches (linear attention, or one not read): on a split sequence "
                                "it would attend within the rank's own tokens"))
    return tuple(dict.fromkeys(out))


def _attention_at(block: BlockStructure, a) -> Evidence | None:
    """Where to point at attention module `a`: its processor, else its own first evidence, else its block's."""
    return a.processor_at or (a.evidence or block.evidence or (None,))[0]


def _local_backends(facts: ParallelFacts, lists: list[ListFlowFact],
                    local: frozenset[str] = frozenset()) -> tuple[Evidence, ...]:
    """Attentions in a walked list whose dispatcher call fixes a backend (`backend=AttentionBackendName.FLEX`)
    that the installed diffusers registers without context-parallel support: given the parallel config, the
    dispatcher still runs that backend on the rank's own shard (Kandinsky 6 SR's NABLA block mask, which flex
    alone takes, built from the local queries and keys). Refused with the processor's line, then the
    registration's; the way on is a processor patch onto a backend that runs under CP, which no hook does."""
    walked = {lf.attr for lf in lists}
    out = []
    for a in facts_attention(facts, local):
        registered = facts.cp_local_backends.get(a.backend or "")
        if a.block_list not in walked or a.backend_at is None or registered is None:
            continue
        out += [Evidence(a.backend_at.file, a.backend_at.line,
                         f"`{a.block_list}[i].{a.path}` ({a.processor or a.cls}): {a.backend_at.why}"), registered]
    return tuple(dict.fromkeys(out))


def _gqa(facts: ParallelFacts, lists: list[ListFlowFact],
         local: frozenset[str] = frozenset()) -> tuple[tuple[Evidence, ...], tuple[KvExpand, ...]]:
    """Attentions in a walked list whose kernel call passes `enable_gqa` while their key/value heads are fewer
    than (or not read as equal to) their query heads, where the installed cache-dit's context-parallel attention
    raises on GQA without a `cp_gqa_strategy`, which diffusers' `dispatch_attention_fn` cannot pass on.

    Where that call reaches a dispatcher through a global of a known module, the planner can wrap the global
    (`KvExpand`): returned second, one per (module, dispatcher). The rest are refused with the processor's line,
    then cache-dit's: returned first."""
    refusal = facts.cp_refuses_gqa
    if refusal is None:
        return (), ()
    walked = {lf.attr for lf in lists}
    out: list[Evidence] = []
    expand: dict[tuple[str, str], list[Evidence]] = {}
    for a in facts_attention(facts, local):
        if a.block_list not in walked or a.gqa_at is None:
            continue
        heads, kv = (a.heads or (None, None))[1], (a.kv_heads or (None, None))[1]
        if isinstance(heads, int) and isinstance(kv, int) and heads == kv:
            continue  # as many key/value heads as query heads: the flag is False at this config
        said = f"{heads} query heads, {kv} key/value heads" if isinstance(heads, int) and isinstance(kv, int) else \
            "key/value heads not read as equal to the query heads"
        e = Evidence(a.gqa_at.file, a.gqa_at.line, f"`{a.block_list}[i].{a.path}` ({a.processor or a.cls}): "
                                                   f"{a.gqa_at.why} ({said})")
        if a.gqa_global is not None and a.gqa_global[1] in _DISPATCH:
            expand.setdefault(tuple(a.gqa_global), []).append(e)
        else:
            out.append(e)
    if out:
        out.append(refusal)
    kv = tuple(KvExpand(m, f, tuple(dict.fromkeys(at))) for (m, f), at in sorted(expand.items()))
    return tuple(dict.fromkeys(out)), kv


def facts_attention(facts: ParallelFacts, local: frozenset[str] = frozenset()) -> list:
    """The blocks' attention modules, less those at `local` (`<list>.*.<path>`: kept out of CP by the planner,
    so nothing CP's attention refuses applies to them)."""
    return [a for b in facts.blocks for a in b.attentions if f"{a.block_list}.*.{a.path}" not in local]


def _lengths(c: _Chart) -> dict[str, int]:
    """{list: its length} for each block list a hook key indexes past its first block (`blocks.39`): an index
    read from the config the plan was made for is not an index on another config of the same class."""
    out: dict[str, int] = {}
    for key in c.plan:
        for attr, block in c.blocks.items():
            index = key[len(attr) + 1:].split(".", 1)[0] if key.startswith(attr + ".") else ""
            if index.isdigit() and index != "0" and isinstance(block.length, int):  # every config has block 0
                out[attr] = block.length
    return out


# 1. the root ------------------------------------------------------------------------------------------


def _split_at_root(c: _Chart) -> None:
    """Split forward's inputs when every op between them and the first walk acts per token; then the same for
    each later walk on streams of its own (Flux3's image blocks after its text blocks) whose streams pass the
    same check, so no hook has to reach into that walk."""
    seq = c.seq
    first = seq.lists[0]
    c.root = not seq.root_blockers and first.fresh
    if not c.root:
        return
    inputs: dict = {}
    if not _root_inputs(c, first, first.streams.values(), seq.root_params, inputs):
        c.root = False  # the streams already split stay in split_params, as the later questions expect
        return
    c.plan[""] = inputs
    c.why(None, None, "every op between forward's inputs and the first block acts per token: split at the root")
    for lf in seq.lists[1:]:
        fresh = [v for p, v in lf.streams.items() if p in lf.fresh_streams]
        if not lf.fresh or lf.root_blockers or not all(v in lf.root_params for v in fresh):
            continue
        added: dict = {}
        if any(lf.root_params[v] in seq.optional for v in fresh):
            # `if image_cond_hidden_states is not None:`: a root hook on an input the call may leave out raises
            c.why(None, lf, f"the walk over `{lf.attr}` at line {lf.loop_line} takes "
                            f"{', '.join(f'`{lf.root_params[v]}`' for v in fresh)} from forward, which a call may "
                            "leave out (default None): split at the walk's first block, not at the root")
            continue
        if _root_inputs(c, lf, fresh, lf.root_params, added):
            inputs.update(added)
            c.root_walks.add(lf.attr)
            c.why(None, lf, f"the walk over `{lf.attr}` at line {lf.loop_line} takes "
                            f"{', '.join(f'`{v}`' for v in fresh)} fresh from forward's inputs through per-token ops "
                            "only: split those inputs at the root too")


def _root_inputs(c: _Chart, lf: ListFlowFact, streams, origins: dict[str, str], inputs: dict) -> bool:
    """Fill `inputs` with the root splits of a walk's `streams` (through `origins`, loop variable -> forward input)
    and of the forward inputs its positions are built from; False when a stream has no forward input."""
    for var in streams:
        param = origins.get(var)
        if param is None:
            return False
        inputs[param] = STREAM
        c.split_params.add(param)
    for bi in lf.inputs:
        if bi.role == "position" and bi.producer_kind in ("module", "expression") and not bi.local_length:
            for p in bi.from_params:
                if p in inputs or p in c.split_params:
                    continue
                if not _tensor_param(c, p):
                    c.why(None, None, f"`{p}` feeds the positions of `{bi.param}` but is annotated "
                                      f"`{c.seq.annotations[p]}`, no tensor: not split (cache-dit's split hook "
                                      "raises on an input a call leaves out)")
                    continue
                inputs[p] = _position_param_split(c, bi.param, p)
                c.split_params.add(p)
    return True


def _tensor_param(c: _Chart, p: str) -> bool:
    """Whether forward input `p` may be a tensor to split: unannotated, or annotated with a tensor type somewhere in
    it (`torch.Tensor | None`, `tuple[torch.Tensor, ...]`). An input annotated only with other types (a cache
    object of the model's own, `str`, `int`) is no sequence."""
    note = c.seq.annotations.get(p)
    return note is None or "tensor" in note.lower()


def _position_param_split(c: _Chart, block_param: str, p: str) -> Split:
    """A forward input that feeds the positions of the first blocks: split with the tokens, in its layout."""
    seq = c.seq
    dropped = seq.batch_dropped.get(p)
    passed = c.facts.pipeline_arg_ndims.get(p)
    two_d = passed == 2 if passed is not None else dropped is not None
    if passed == 1:  # one position per token (`torch.arange(n)`): dim 0 is the only one
        at = c.facts.pipeline_arg_ndims_at[p]
        c.why(at, None, f"`{p}` feeds the positions of `{block_param}`: split it with the tokens, as [S]: {at.why}")
        return Split(split_dim=0, expected_dims=1, split_output=False)
    if passed is not None:
        at = c.facts.pipeline_arg_ndims_at[p]
        where, layout = at, f"[{'S, n' if two_d else 'B, S, n'}]: {at.why}"
    else:
        where = dropped
        layout = (f"[S, n] after {dropped.why} (the pipeline's layout was not read)"
                  if dropped else "[B, S, n] (assumed; confirm in verify)")
    c.why(where, None, f"`{p}` feeds the positions of `{block_param}`: split it with the tokens, as {layout}")
    return Split(split_dim=0 if two_d else 1, expected_dims=2 if two_d else 3, split_output=False)


def _split_token_inputs(c: _Chart, lf: ListFlowFact) -> None:
    """Per-token conditioning: a block input built from a forward input whose dim 1 is read as tokens; and one
    built inline from forward inputs documented one value per row of the sequence (`token_tags` of shape
    `(seq_len,)`: MiniMaxH3's AdaLN row indices), split at every block's input on dim 0."""
    for bi in lf.inputs:
        rows = _per_row(c.seq, bi)
        if rows and bi.role == "other" and bi.producer_kind in ("expression", "param"):
            c.inputs(f"{lf.attr}.*")[bi.param] = Split(split_dim=0, expected_dims=1, split_output=False)
            c.why(bi.producer_at, lf, f"`{bi.param}` is built from {', '.join(f'`{r}`' for r in rows)}, documented "
                                      "one value per row of the sequence: split it on dim 0 at every block's input")
    for bi in lf.inputs:
        if bi.per_token is not None and not bi.in_loop:
            # `noise_mask = torch.zeros(batch, hidden_states.shape[1])`: a [B, S] value per token of the stream
            c.inputs(f"{lf.attr}.*")[bi.param] = Split(split_dim=1, expected_dims=2, split_output=False)
            c.why(bi.per_token, lf, f"`{bi.param}`: {bi.per_token.why}: split it on dim 1 at every block's input")
    fed = {p for bi in lf.inputs if bi.role == "stream" for p in bi.from_params}  # split at the block already
    for bi in lf.inputs:
        for p in bi.token_params:
            if p in c.split_params or bi.role == "stream" or p in fed:
                continue
            rank = _param_rank(c, p)
            if rank is not None and rank != 2:
                c.why(bi.producer_at, lf, f"`{bi.param}` is built from `{p}`, whose dim 1 is read as a token axis, "
                                          f"but `{p}` is {rank}-D as passed or documented, not a [B, S] per-token "
                                          "tensor: not split at the root")
                continue
            c.inputs("")[p] = Split(split_dim=1, expected_dims=2, split_output=False)
            c.split_params.add(p)
            c.why(bi.producer_at, lf, f"`{bi.param}` is built from `{p}`, whose dim 1 is read as a token axis "
                                      f"(per-token conditioning): split `{p}` at the root when it is 2-D")


def _param_rank(c: _Chart, param: str) -> int | None:
    """A forward input's rank: what the pipeline passes, else as many dims as forward's docstring documents."""
    passed = c.facts.pipeline_arg_ndims.get(param)
    if passed is not None:
        return passed
    dims = c.seq.documented.get(param)
    return len(dims) if dims else None


def _per_row(seq: SequenceFact, bi) -> list[str]:
    """The forward inputs `bi` is built from, when each is documented one value per row; [] when any of them is
    not (or it is built from none)."""
    rows = list(bi.from_params)
    return rows if rows and all(_one_per_row(seq, p) for p in rows) else []


def _one_per_row(seq: SequenceFact, param: str) -> bool:
    """Forward's docstring documents `param` 1-D over the sequence: `(seq_len,)`, `(sequence_length,)`."""
    dims = seq.documented.get(param)
    return bool(dims) and len(dims) == 1 and is_length(dims[0])


# 2. fresh walks -----------------------------------------------------------------------------------------


def _split_fresh_walk(c: _Chart, i: int, lf: ListFlowFact) -> None:
    if not lf.fresh or (c.root and i == 0) or lf.attr in c.root_walks:
        return
    start = lf.offset if lf.offset is not None else "{start}"
    fresh = [p for p in lf.streams if p in lf.fresh_streams] or list(lf.streams)
    c.inputs(f"{lf.attr}.{start}").update({p: STREAM for p in fresh})
    if lf.offset is None:
        c.unknowns.append(f"the first block index of the walk over `{lf.attr}` (line {lf.loop_line}) is not "
                          "known statically")
    if i > 0:
        c.why(None, lf, f"the walk over `{lf.attr}` at line {lf.loop_line} gets "
                        f"{', '.join(f'`{p}`' for p in fresh)} not yet split: split at block {start}")


# 3. positions -------------------------------------------------------------------------------------------


def _split_positions(c: _Chart, i: int, lf: ListFlowFact) -> None:
    """The position inputs of the `i`th list's blocks: each one kept whole, cut as it is, left to the root split, or
    split where it is made."""
    for bi in lf.inputs:
        if bi.role == "position" and not _position_answered(c, lf, bi):
            _split_position(c, i, lf, bi)


def _position_answered(c: _Chart, lf: ListFlowFact, bi) -> bool:
    """The questions that do not ask where a position input is made: a table looked up by position stays whole, a
    1-D input is cut at dim 0, one built from no tensor is not split, one the root split covers needs nothing."""
    if bi.table is not None:  # `freqs[positions]`: every rank looks its own positions up in the whole table
        c.evidence.append(Evidence(bi.table.file, bi.table.line, f"`{bi.param}` stays whole for `{lf.attr}`: "
                                                                 f"{bi.table.why}"))
        return True
    if bi.ndim == 1 and not bi.producer_outputs:
        # one position per token and nothing else (`torch.arange(n)`): cut dim 0, the only one it has
        c.inputs(f"{lf.attr}.*")[bi.param] = Split(split_dim=0, expected_dims=1, split_output=False)
        c.why(bi.producer_at, lf, f"`{bi.param}` is 1-D, one entry per token (its rank read from the code "
                                  "that builds it): split dim 0 at every block's input")
        return True
    if bi.from_params and not any(_tensor_param(c, p) for p in bi.from_params):
        c.why(bi.producer_at, lf, f"`{bi.param}` is built from {', '.join(f'`{p}`' for p in bi.from_params)} only, "
                                  "annotated as no tensor (state of the model's own): not split")
        return True
    covered = c.root and bool(set(bi.from_params) & c.split_params) and not bi.local_length
    return covered or (bi.producer_kind == "param" and bi.arg in c.split_params)


def _split_position(c: _Chart, i: int, lf: ListFlowFact, bi) -> None:
    """A position input split by where it is made: a forward input at the root, a module's output where it is built,
    a pipeline input or a table built inline at every block, a tuple element by element."""
    seq = c.seq
    if c.root and i == 0 and bi.producer_kind == "param":
        note = seq.annotations.get(bi.arg, "")
        c.plan[""][bi.arg] = (ROPE_ASSUMED, ROPE_ASSUMED) if "tuple" in note.lower() else STREAM
        c.split_params.add(bi.arg)
        c.why(None, None, f"`{bi.arg}` arrives ready-made from the caller: cut it with the tokens at the root "
                          "(its layout is assumed; confirm in verify)")
        c.unknowns.append(f"layout of the position input `{bi.arg}` (which dim is the sequence)")
    elif bi.producer_kind == "module" and not bi.in_loop and not _called_on_split(c, bi):
        layout = c.facts.position_modules.get(bi.producer or "")
        n = (layout.outputs if layout else None) or 1
        entry = Split(split_dim=layout.split_dim if layout else 0,
                      expected_dims=layout.expected_dims if layout else None, split_output=True)
        if bi.producer not in c.plan:
            c.plan[bi.producer] = {str(k): entry for k in range(n)}
        c.why(bi.producer_at, lf, f"`{bi.param}` is built by `self.{bi.producer}` on the full sequence: split "
                                  f"its output ({layout.why if layout else 'layout not read'})")
    elif bi.producer_kind == "param" and not c.root:
        note = seq.annotations.get(bi.arg, "")
        if "tuple" in note.lower():
            spec: Split | tuple[Split, ...] = (TABLE, TABLE)
            why = f"a tuple ({note}) of [S, D] tables: split each element (layout assumed; confirm in verify)"
        else:
            spec, why = STREAM, "split at every block's input"
        c.inputs(f"{lf.attr}.*")[bi.param] = spec
        c.why(None, None, f"`{bi.param}` arrives ready-made from the pipeline as `{bi.arg}` and is passed to "
                          f"every block: {why}")
    elif bi.producer_kind == "expression" and bi.leading_flatten:
        # `rope.flatten(0, 2)`: a table over the (frames, height, width) grid, no batch axis: the sequence is
        # dim 0, and the rank was not read, so no rank check (a guessed one cache-dit would skip silently)
        c.inputs(f"{lf.attr}.*")[bi.param] = Split(split_dim=0, expected_dims=None, split_output=False)
        c.why(bi.producer_at, lf, f"`{bi.param}` merges its leading axes into dim 0 (`{bi.producer_at.why if bi.producer_at else ''}`): "
                                  "split dim 0 at every block's input, with no rank check (its rank is not read)")
    elif bi.producer_kind == "expression" and bi.producer_outputs:
        # cache-dit splits a tuple input element by element, with one spec per element (a single spec on a
        # tuple raises `object of type '_ContextParallelInput' has no len()`)
        ranks = bi.producer_ndims or (None,) * bi.producer_outputs
        c.inputs(f"{lf.attr}.*")[bi.param] = tuple(TABLE if r == 2 else STREAM for r in ranks)
        read = all(r in (2, 3) for r in ranks)
        c.why(bi.producer_at, lf, f"`{bi.param}` is a tuple of {bi.producer_outputs} tensors built inline, which "
                                  "no hook can split where it is built: split each element at every block's "
                                  "input (" + (", ".join("[S, D]" if r == 2 else "[B, S, D]" for r in ranks)
                                               + ", ranks read from the code that builds them)" if read else
                                               "as [B, S, D]; assumed, confirm in verify)"))
    elif bi.producer_kind == "module" and not bi.in_loop and (layout := c.facts.position_modules.get(bi.producer)):
        # its output hook is withheld (`_called_on_split`): the same cut, in the module's layout, at the blocks
        entry = Split(split_dim=layout.split_dim, expected_dims=layout.expected_dims, split_output=False)
        n = layout.outputs or 1
        c.inputs(f"{lf.attr}.*")[bi.param] = tuple(entry for _ in range(n)) if n > 1 else entry
        c.why(bi.producer_at, lf, f"`{bi.param}` comes from module `{bi.producer}`, {_unhooked(c, bi)}: split "
                                  f"{'each of its ' + str(n) + ' outputs' if n > 1 else 'it'} at every block's "
                                  f"input as the module's output would have been ({layout.why})")
    elif (n := _tuple_members(bi.annotation)) and bi.role == "position":
        # the block takes a tuple of tables (`freqs_cis: tuple[torch.Tensor, torch.Tensor]`): one spec each
        c.inputs(f"{lf.attr}.*")[bi.param] = tuple(TABLE for _ in range(n))
        c.why(bi.producer_at, lf, f"`{bi.param}` comes from {bi.producer_kind} `{bi.producer}`, {_unhooked(c, bi)}"
                                  f", and the block takes it as `{bi.annotation}`: split each of its {n} "
                                  "[S, D] tables at every block's input (layout assumed; confirm in verify)")
    else:
        c.inputs(f"{lf.attr}.*")[bi.param] = STREAM
        c.why(bi.producer_at, lf, f"`{bi.param}` comes from {bi.producer_kind} `{bi.producer}`, {_unhooked(c, bi)}"
                                  ": split it at every block's input")
        c.risks.append(f"`{bi.param}` ({lf.attr}): split at each block; if it is a nested tuple, hooks cannot "
                       f"split it and `{bi.producer}` needs a minimal patch instead")


def _unhooked(c: _Chart, bi) -> str:
    """Why the producer of a position input gets no output hook, in words."""
    if bi.producer_kind == "module" and _called_on_split(c, bi):
        return "whose output hook would also cut its calls on inputs the root already splits"
    return "which no hook can split"


def _called_on_split(c: _Chart, bi) -> bool:
    """Whether the module that builds position input `bi` is also called, for another walk, on forward inputs
    the root already splits (Flux3's `pos_embed` on the text, image and reference ids): a hook on its output
    would cut those calls' local outputs again."""
    return any(other.producer == bi.producer and other.producer_kind == "module" and other is not bi
               and set(other.from_params) & c.split_params
               for lf in c.seq.lists for other in lf.inputs if other.role == "position")


def _tuple_members(annotation: str | None) -> int:
    """`tuple[torch.Tensor, torch.Tensor] | None` -> 2: the members of a fixed-length tuple annotation, read with
    libcst (0 for anything else, `tuple[torch.Tensor, ...]` included)."""
    if not annotation:
        return 0
    try:
        node = cst.parse_expression(annotation)
    except (cst.ParserSyntaxError, RecursionError):
        return 0
    while isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitOr):
        node = node.left if not (isinstance(node.left, cst.Name) and node.left.value == "None") else node.right
    if not (isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and node.value.value in ("tuple", "Tuple")):
        return 0
    items = [el.slice.value for el in node.slice if isinstance(el.slice, cst.Index)]
    if any(isinstance(i, cst.Ellipsis) for i in items):
        return 0
    return len(items) if len(items) >= 2 else 0


# 4. cross-attention text and side modules -----------------------------------------------------------


def _split_cross_attention_text(c: _Chart, lf: ListFlowFact) -> None:
    """A text sequence every block reads but does not return: cross-attention keys and values. Ulysses
    gathers K/V across ranks, so each rank must hold its own part: split it at every block. It stays whole
    where no attention that reads it runs with CP (`_local_cross_attention`)."""
    block = c.blocks.get(lf.attr)
    atts = [a for a in block.attentions] if block is not None else []
    local = [a.cross_local_at for a in atts if a.cross_local_at is not None]
    for bi in lf.inputs:
        if bi.role != "other" or bi.param not in TEXT_STREAMS or (bi.arg in c.split_params
                                                                 and bi.producer_kind == "param"):
            continue
        if local and len(local) == len(atts):
            # every attention of the block runs cross-attention on the rank's own queries against the whole
            # text: a split text would give each rank half the keys
            e = local[0]
            c.evidence.append(Evidence(e.file, e.line, f"`{bi.param}` stays whole for `{lf.attr}`: {e.why}"))
            continue
        made_local = _local_cross_attention(block, bi.param)
        if made_local:
            for a in made_local:
                c.local.append(f"{lf.attr}.*.{a.path}")
                e = a.mask_prepared_at
                c.evidence.append(Evidence(e.file, e.line, f"`{lf.attr}[i].{a.path}` ({a.processor or a.cls}) "
                                           f"reads `{bi.param}` as its keys and values and {e.why}: it runs outside "
                                           f"CP on the rank's own queries, and `{bi.param}` stays whole, so the key "
                                           "length it sizes the mask for is the whole text's (each rank projects "
                                           "the whole text)"))
            continue
        c.inputs(f"{lf.attr}.*")[bi.param] = STREAM
        c.why(bi.producer_at, lf, f"`{bi.param}` is read by every block of `{lf.attr}` and not returned "
                                  "(cross-attention text): split it at every block's input, so the all-to-all "
                                  "gathers whole keys and values")


def _local_cross_attention(block: BlockStructure | None, text: str) -> list:
    """The attentions to run outside CP so that the block's `text` can stay whole, or [] to split it as usual.

    Taken only to lift a refusal: some attention that reads `text` sizes its mask from the key length it sees
    (the legacy `prepare_attention_mask`, wrong on a split text). Kept out of CP, each rank's queries attend over
    the whole text, as in one process: exact for cross-attention. It holds only when every call of the block
    that reads `text` is read (`sources`) and every attention among them either runs cross-attention without
    CP already or is made local here; a call of an attention module not read at all leaves the text split.
    A call reads the text when an argument other than its query stream is derived from it (the stream argument's
    lineage is read without order, so it takes in whatever a later line adds to the stream: a cross-attention's
    output, per query). Only an attention passed the text as is becomes local: one passed `text if flag else
    None` (diffusers' `only_cross_attention`) may run self-attention, which outside CP would attend within the
    rank's shard. An attention that joins the text to its own keys is never made local."""
    if block is None or not block.attentions:
        return []
    by_path = {a.path: a for a in block.attentions}
    readers = [call for call in block.calls
               if any(text in src for p, src in call.sources.items() if call.inputs.get(p) != "stream")]
    attention_readers = [by_path[call.path] for call in readers if call.path in by_path]
    if any(a.path not in {call.path for call in block.calls} for a in block.attentions):
        return []  # an attention the block calls in a way not read: whether it reads the text is not known
    as_is = {call.path for call in readers if text in call.passes.values()}  # `encoder_hidden_states=text`
    legacy = [a for a in attention_readers if a.mask_prepared_at is not None and a.cross_local_at is None
              and a.joins_at is None and a.path in as_is]
    if not legacy or any(a.cross_local_at is None and a not in legacy for a in attention_readers):
        return []
    return list({a.path: a for a in legacy}.values())


def _split_side_modules(c: _Chart, lf: ListFlowFact) -> None:
    """Split each side module's output to the local sequence, as a [B, S, D] tensor: only where its output
    is read as 3-D (or not read at all, said so). A split whose `expected_dims` is not the output's rank
    is one cache-dit skips with a warning, so another rank gets no split and an unknown instead."""
    for side in lf.side_modules:
        key = f"{side.module}.*" if side.indexed else side.module
        if side.ndim is not None and side.ndim != 3:
            c.unknowns.append(f"`{key}`'s output is {side.ndim}-D (read statically, "
                              f"{side.at.file.rsplit('/', 1)[-1]}:{side.at.line}): which dim is its sequence is not "
                              "read, so no split is planned (a 3-D split of it is one cache-dit skips)")
            continue
        if key not in c.plan:
            c.plan[key] = {"0": Split(split_dim=1, expected_dims=3, split_output=True)}
        how = "" if side.ndim == 3 else " (its rank is not read statically: assumed [B, S, D])"
        c.evidence.append(Evidence(side.at.file, side.at.line,
                                   f"{side.at.why}: split `{key}`'s output to the local sequence{how}"))


def _submodule_hooks(c: _Chart, block: BlockStructure, lf: ListFlowFact) -> None:
    """Split and gather around every attention / FFN call: the block itself needs the full sequence.

    A call's stream is split there, and the positions it takes with it, in the layout their module returns
    (`_position_spec`). An attention that calls no kernel CP reaches (linear attention) is left whole. A masked
    attention that reads text as its keys and values (a cross-attention) runs outside CP on the rank's split
    queries: its keys, values and mask stay whole, as the mask was made for (under CP a whole text would be
    gathered rank by rank, and the mask no longer fits the keys). Only where the text is passed as is: one passed
    `text if flag else None` may be self-attention, which must run with CP."""
    for e in block.surgery:
        c.evidence.append(Evidence(e.file, e.line, f"sub-module hooks for `{block.attr}`: {e.why}"))
    by_path = {a.path: a for a in block.attentions}
    seen: list[str] = []  # the calls whose stream is split, each gathered after
    for call in block.calls:
        if call.path in seen:
            continue
        inputs = {p: STREAM for p, role in call.inputs.items() if role == "stream"}
        if not inputs:
            continue  # nothing of the sequence is split for it: nothing to gather after it
        for p, role in call.inputs.items():
            if role == "position":
                spec = _position_spec(c, lf, call.sources.get(p, ()))
                if spec is not None:
                    inputs[p] = spec
        a = by_path.get(call.path)
        if a is not None and a.kernel is None:
            where = _attention_at(block, a)
            c.evidence.append(Evidence(where.file if where else c.seq.file, where.line if where else 0,
                                       f"`{block.attr}[i].{call.path}` "
                                       f"({a.processor or a.cls}) calls no attention kernel context parallelism "
                                       "reaches (linear attention sums over every token): it runs whole on every "
                                       "rank"))
            c.risks.append(f"`{block.attr}[i].{call.path}` runs whole on every rank (no attention kernel read in it; "
                           "splitting linear attention takes a patch that sums its key-value products over the "
                           "ranks): only the other sub-modules' sequence is split, so expect little speedup")
            c.unknowns.append(f"`{block.attr}[i].{call.path}`: no attention kernel read, run whole on every rank")
            continue
        seen.append(call.path)
        c.plan[f"{block.attr}.*.{call.path}"] = inputs
        text = sorted({s for p, s in call.passes.items() if call.inputs.get(p) != "stream" and s in TEXT_STREAMS})
        if a is not None and text and (a.mask_at or a.mask_prepared_at) and a.joins_at is None:
            c.local.append(f"{block.attr}.*.{call.path}")
            at = a.mask_prepared_at or a.mask_at
            c.evidence.append(Evidence(at.file, at.line, f"`{block.attr}[i].{call.path}` ({a.processor or a.cls}) "
                                       f"reads `{text[0]}` as its keys and values, with a mask: it runs outside CP "
                                       "on the rank's split queries over the whole text and mask"))
    n = block.length
    if not isinstance(n, int):
        c.unknowns.append(f"the length of `{block.attr}` is not known statically: one gather per block and "
                          "sub-module")
        for path in seen:
            c.plan[f"{block.attr}.{{i}}.{path}"] = GATHER
        return
    for path in seen:
        for i in range(n):
            c.plan[f"{block.attr}.{i}.{path}"] = GATHER
    c.evidence.append(Evidence(block.evidence[0].file if block.evidence else "", 0,
                               f"gather after each of {', '.join(seen)} in all {n} blocks (extra communication: the "
                               "cost of an in-block sequence cut)"))


def _position_spec(c: _Chart, lf: ListFlowFact, sources: tuple[str, ...]) -> Hook | None:
    """How to split, at a sub-module's call, positions the block takes as `sources`: in the layout of the module
    that builds them (one spec per returned tensor), None for a lookup table every rank reads whole, else as a
    [B, S, D] stream (assumed, as a block input of unknown layout is)."""
    bis = [bi for bi in lf.inputs if bi.param in sources and bi.role == "position"]
    if len(bis) != 1:
        return STREAM
    bi = bis[0]
    if bi.table is not None:
        return None
    layout = c.facts.position_modules.get(bi.producer or "") if bi.producer_kind == "module" else None
    if layout is None:
        return STREAM
    one = Split(split_dim=layout.split_dim, expected_dims=layout.expected_dims, split_output=False)
    return tuple(one for _ in range(layout.outputs)) if layout.outputs and layout.outputs > 1 else one


# 5. gathers ---------------------------------------------------------------------------------------------


def _gather(c: _Chart, lists: list[ListFlowFact], per_module: set[str]) -> None:
    seq = c.seq
    for lf in lists[:-1]:
        if lf.attr in per_module or not lf.mixed_after:
            continue
        key = f"{lf.attr}.{lf.last}" if lf.last is not None else _last_block(lf.attr, c.blocks.get(lf.attr))
        c.plan[key] = _block_gather(lf)
        for m in lf.mixing or ():
            c.evidence.append(Evidence(m.file, m.line, f"gather `{lf.attr}` at its last block: {m.why}"))
        if "{" in key:
            c.unknowns.append(f"the length of `{lf.attr}` is not known statically: fill in the last index")
    last = lists[-1] if lists else seq.lists[-1]
    blocked = list(seq.gather_blocked) + ([] if c.root else list(seq.gather_blocked_unless_root))
    rows = [r for r in seq.gather_reads if _one_per_row(seq, r)]
    if seq.gather and rows:  # `self.norm_out(hidden, temb, timestep_indices)`: the module needs every row's index
        blocked.append(_at(seq.gather_at, seq.file, 0, f"`self.{seq.gather}` also takes {', '.join(f'`{r}`' for r in rows)}"
                                                       ", one value per row of the whole sequence: gather before it"))
    if last.attr in per_module:
        return  # every block already gathers around its sub-modules
    if seq.gather and not blocked:
        c.plan[seq.gather] = GATHER
        c.evidence.append(_at(seq.gather_at, seq.file, 0, f"`self.{seq.gather}` is the last module applied to the "
                                                          "sequence before it is reshaped: gather its output"))
        return
    key = f"{last.attr}.{last.last}" if last.last is not None else _last_block(last.attr, c.blocks.get(last.attr))
    c.plan[key] = _block_gather(last)
    for b in blocked:
        c.evidence.append(Evidence(b.file, b.line, f"gather at the last block: {b.why}"))
    if not seq.gather and not blocked:
        c.unknowns.append("no output module found after the last block: gathering the last block's output")


def with_cache(cp: CpPlan, cached: set[str]) -> CpPlan:
    """The plan beside caching: a gather on the last block of a list the adapter caches puts the whole sequence
    out of that block, and cache-dit's cached blocks take the residual of their middle blocks (those between
    the first `Fn_compute_blocks` and the last `Bn_compute_blocks`) against the chunk the rank started with;
    the last block must then be one of the last `Bn` (`Bn_compute_blocks >= 1`), computed after the residual."""
    keys = [k for k, hook in cp.plan.items() if not isinstance(hook, dict) and k.rpartition(".")[0] in cached
            and (k.rpartition(".")[2].isdigit() or k.rpartition(".")[2] == "{n-1}")]
    if not keys:
        return cp
    risk = (f"with caching on as well, run with `Bn_compute_blocks >= 1` (`--Bn 1`): the gather on "
            f"{', '.join(f'`{k}`' for k in keys)} hands the whole sequence out of a cached list's last block, and "
            "cache-dit subtracts the rank's chunk from a middle block's output (its `call_Mn_blocks` residual)")
    return dataclasses.replace(cp, cache_bn_min=1, risks=cp.risks + (risk,))


def _block_gather(lf: ListFlowFact) -> Gather | tuple[Gather, ...]:
    """The gather on a block's output: one per stream a block that returns several gives back (cache-dit's gather
    hook checks the count: a single spec on a 2-tuple raises `Expected output to have 1 elements`); every stream
    of the walk was split, so each is gathered."""
    return GATHER if len(lf.streams) <= 1 else tuple(GATHER for _ in lf.streams)


def _last_block(attr: str, block: BlockStructure | None) -> str:
    length = block.length if block is not None else None
    return f"{attr}.{length - 1}" if isinstance(length, int) and length > 0 else f"{attr}.{{n-1}}"


# 6. masks, position drift, head counts ----------------------------------------------------------------


def _extras(facts: ParallelFacts, seq: SequenceFact | None, plan: dict, joint: bool):
    """(mask reorder, RoPE drift fix, Ulysses-anything per CP size, risks)."""
    risks: list[str] = []
    masks = list(seq.masks if seq else ()) + list(facts.pipeline_masks)
    proc_masks = [a for b in facts.blocks for a in b.attentions if a.mask_at is not None]
    layouts = [m.layout for m in masks if m.layout]
    kind = "2-D" if any(lay.startswith("2-D") for lay in layouts) else ("1-D" if layouts else None)
    needed = bool(masks) and joint and bool(proc_masks)
    where = tuple(MaskSite(m.name, m.where, m.layout, m.at.file, m.at.line, m.at.why) for m in masks)
    if needed:
        why = ("a mask over the joint (text + image) sequence reaches attention: Ulysses reorders the sequence as "
               "[text_0, img_0, text_1, img_1, ...], so the mask must be permuted to match "
               + ("(key dim only)" if kind == "1-D" else "(query and key dims)" if kind == "2-D" else
                  "(layout not read statically: dump it on the first step)"))
        mask = MaskReorder(True, kind, where, why,
                           mechanism="a pre-hook on every block that takes the mask, installed after cache-dit's "
                                     "split hooks: it permutes the mask into all-to-all order from each rank's local "
                                     "lengths (no change to forward)")
        risks.append("silent corruption if the mask is not reordered: a garbled top-left corner, PSNR stuck ~28-30")
    else:
        mask = MaskReorder(False, None, where, "no mask reaches a joint attention" if masks else
                           "no attention mask found")
    drift: list[Evidence] = []
    if seq is not None and "" in plan:
        drift = [e for lf in seq.lists for bi in lf.inputs if bi.role == "position" and bi.local_length
                 for e in bi.local_length]
    rope = RopeDriftFix(bool(drift), tuple(drift),
                        "positions are derived from the local sequence length after a root split: compute them on "
                        "the global length and slice per rank" if drift else
                        ("no position input is derived from a local length under this plan" if "" in plan else
                         "the split happens after positions are built (not at the root): no drift"))
    heads = [(b.attr, a.path, a.heads, a.kv_heads) for b in facts.blocks for a in b.attentions]
    unknown = any(h is None or h[1] is None for _, _, h, _ in heads)
    uaa: dict[str, UlyssesAnything] = {}
    for size in CP_SIZES:
        why = []
        for attr, path, h, kv in heads:
            if h and h[1] is not None and h[1] % size:
                why.append(f"{attr}.{path}: {h[0]}={h[1]} not divisible by {size}")
            if kv and kv[1] is not None and kv[1] % size:
                why.append(f"{attr}.{path}: {kv[0]}={kv[1]} not divisible by {size}")
        uaa[str(size)] = UlyssesAnything(
            bool(why), tuple(why or (["head count not known statically"] if unknown else [])),
            "also use --ulysses-anything when the text length is not a multiple of the CP size" if joint else None)
    return mask, rope, uaa, risks


def _compare(facts: ParallelFacts, plan: dict) -> DiffusersPlan | None:
    declared = facts.diffusers_cp_plan
    if declared is None:
        return None
    ours, theirs = set(plan), set(declared)
    return DiffusersPlan(declared, facts.diffusers_cp_plan_at, ours == theirs, tuple(sorted(ours - theirs)),
                         tuple(sorted(theirs - ours)), "diffusers declares its own plan; where the keys agree, reuse it")
