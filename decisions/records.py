"""The plan: what the decisions stage produces and every later stage reads (plan.json, docs/schema.md).

Field order is the JSON key order. Loading plan.json (`Plan.load`) checks every value against these
types, so a hand-edited plan with a wrong type or a missing key is refused with the path of the fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from integrate.analyzers.records import (
    AttentionFact,
    LinearRole,
    PositionLayout,
    SequenceFact,
    SupportNote,
    TextEncoderFacts,
    VaeFacts,
)
from integrate.gate.records import GateFlags

from integrate.records import OMIT, Confidence, Evidence, Omit

PLAN_SCHEMA = "integrate.plan"
PLAN_SCHEMA_VERSION = "1.21"


@dataclass(frozen=True)
class PlanModel:
    model_path: str | None
    pipeline_class: str | None
    transformer_class: str | None
    pipeline_file: str | None
    transformer_file: str | None
    example_name: str | None
    env_var: str | None
    example_type_guess: str
    no_pipeline: bool = False  # a transformer-only integration (--no-pipeline): no pipeline was read
    config_file: str | None = None  # 1.6: the transformer's config the gate found (None: the class defaults)
    # 1.17: each --source-root the plan was made with (absent: none): verify's workers and the generated launcher
    # put them on the import path
    source_roots: tuple[str, ...] | Omit = OMIT

    @property
    def roots(self) -> tuple[str, ...]:
        """The --source-root folders (none: ())."""
        return () if self.source_roots is OMIT else self.source_roots


# -- cache -----------------------------------------------------------------------------------------

# the ForwardPatterns cache-dit defines (`cache_dit.caching.forward_pattern.ForwardPattern`)
PatternName = Literal["Pattern_0", "Pattern_1", "Pattern_2", "Pattern_3", "Pattern_4", "Pattern_5"]


@dataclass(frozen=True)
class CacheList:
    attr: str
    block_class: str | None
    forward_pattern: PatternName | None
    alternatives: tuple[str, ...]
    confidence: Confidence
    check_forward_pattern: bool | None
    roles: dict[str, str]


@dataclass(frozen=True)
class NotBlocks:
    attr: str
    why: str


@dataclass(frozen=True)
class CachePlan:
    block_lists: tuple[CacheList, ...]
    not_blocks: tuple[NotBlocks, ...]
    needs_patch_functor: bool
    patch_functor_reasons: tuple[str, ...]
    has_separate_cfg: bool | None
    cfg_confidence: Confidence
    # 1.2: block lists left out of the adapter (shorter than cache-dit's default Fn / Bn compute blocks)
    uncached: tuple[NotBlocks, ...] = ()
    notes: tuple[str, ...] = ()  # 1.2: what the cache config must change for the lists as planned


# -- context parallelism ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    """cache-dit's `_ContextParallelInput`: cut a tensor along `split_dim`."""

    split_dim: int
    expected_dims: int | None  # None (1.5): the rank was not read, so no rank check (cache-dit splits any rank)
    split_output: bool


@dataclass(frozen=True)
class Gather:
    """cache-dit's `_ContextParallelOutput`: put the sequence back together along `gather_dim`."""

    gather_dim: int
    expected_dims: int


# A hook key's value: a gather (1.6: one per output of a module that returns a tuple, null for an output left
# as it is), or {parameter name or output index: a split (one per tuple element)}.
Hook = Gather | tuple[Gather | None, ...] | dict[str, Split | tuple[Split, ...]]


@dataclass(frozen=True)
class MaskSite:
    name: str
    built_in: str
    layout: str | None
    file: str
    line: int
    why: str


@dataclass(frozen=True)
class MaskReorder:
    needed: bool
    kind: str | None
    where: tuple[MaskSite, ...]
    why: str
    mechanism: str | Omit = OMIT  # present when needed


@dataclass(frozen=True)
class KvExpand:
    """1.10: a dispatcher that processors call with `enable_gqa` (grouped-query attention), reached as a global of
    `module`. cache-dit's context-parallel attention refuses GQA, so the generated planner wraps that global: under
    CP a call gets its key/value heads repeated to the query heads' count and `enable_gqa=False`, the same
    attention (query head h reads key/value head h // group). Without a parallel config the call is unchanged."""

    module: str
    function: str
    at: tuple[Evidence, ...]  # the processors' calls that pass `enable_gqa`


@dataclass(frozen=True)
class MaskMend:
    """1.11: a dispatcher that processors call with a mask cache-dit's hooks alone cannot serve under CP, reached as a
    global of `module`; the generated planner wraps it. Under Ulysses the kernel sees every key and the rank's share
    of the heads, so at the kernel a mask over the rank's own keys is gathered from every rank (in rank order, the
    order the all-to-all gives the keys) and a mask with one row per head is cut to the rank's heads.

    `prepared`: attention modules (`<list>.*.<path>`) whose processor sizes a whole mask with the legacy
    `prepare_attention_mask` from the local key length: their `prepare_attention_mask` keeps a mask that covers
    every rank's keys as it is instead of padding it. `split`: block inputs (`<list>.*:<param>`) a processor also
    applies to its output, one row per query: cut with the tokens at every block, and gathered again at the kernel.
    Without a parallel config every call is unchanged."""

    module: str
    function: str
    prepared: tuple[str, ...]
    split: tuple[str, ...]
    at: tuple[Evidence, ...]


@dataclass(frozen=True)
class KernelMend:
    """1.12: processors that call torch's `scaled_dot_product_attention` through `alias`, a module-level alias of
    torch.nn.functional in `module`, which no hook reaches. The generated planner replaces that global with one
    whose `scaled_dot_product_attention`, while one of `attentions`' processors runs with a parallel config, calls
    cache-dit's dispatcher instead (the same attention: heads moved behind the sequence and back), and is torch's
    own everywhere else. A mask reaching such a call under CP is not fitted: the call raises rather than guess."""

    module: str
    alias: str
    attentions: tuple[str, ...]  # `<list>.*.<path>`
    at: tuple[Evidence, ...]


@dataclass(frozen=True)
class RopeDriftFix:
    needed: bool
    evidence: tuple[Evidence, ...]
    why: str


@dataclass(frozen=True)
class UlyssesAnything:
    needed: bool
    why: tuple[str, ...]
    note: str | None


@dataclass(frozen=True)
class HybridPatch:
    needed: bool
    method: str | None
    why: str


@dataclass(frozen=True)
class DiffusersPlan:
    """A `_cp_plan` diffusers declares on the class, compared with ours."""

    plan: dict[str, Any]
    at: Evidence | None
    same_keys: bool
    only_ours: tuple[str, ...]
    only_diffusers: tuple[str, ...]
    note: str


@dataclass(frozen=True)
class RunWhole:
    """1.14: a module context parallelism leaves alone: its inputs cut along the sequence are put back together
    before it runs (`gather`: parameter name -> the axis), it runs on whole tensors on every rank with the
    attention inside it kept out of CP, and the outputs the rest of the model reads cut are cut again as the
    stream was (`split`: output index, "0" for a lone tensor -> the axis). Correct where the module mixes tokens
    in a way CP cannot split (per-frame regrouping, a recurrence along the sequence); its work then repeats on
    every rank. Offered by `integrate repair` from a failed run's shapes, not by the chart."""

    gather: dict[str, Gather]
    split: dict[str, Split]
    why: str


@dataclass(frozen=True)
class CpPlan:
    approach: str
    shape: str | None
    plan: dict[str, Hook]
    confidence: Confidence
    evidence: tuple[Evidence, ...]
    risks: tuple[str, ...]
    unknowns: tuple[str, ...]
    mask_reorder: MaskReorder
    rope_drift_fix: RopeDriftFix
    ulysses_anything: dict[str, UlyssesAnything]
    hybrid_patch: HybridPatch
    diffusers_plan: DiffusersPlan | None
    # 1.2: the length, at the config the plan was made for, of each block list a hook key indexes: the planner
    # re-bases an index counted from the list's end (its last block) to the model it runs on
    lengths: dict[str, int] = field(default_factory=dict)
    # 1.2: what the generated planner cannot handle, with where: no CP planner is written while it is non-empty
    blocked_by: tuple[Evidence, ...] = ()
    # 1.5: why ring attention is not planned (a mask reaches attention and cache-dit's ring takes none): the
    # processors' lines and cache-dit's own check; empty when ring may run
    ring_blocked_by: tuple[Evidence, ...] = ()
    # 1.7: with caching on as well, the fewest `Bn_compute_blocks` this plan runs with: 1 when a gather sits on
    # the last block of a cached list (cache-dit takes a middle block's residual against the rank's chunk)
    cache_bn_min: int = 0
    # 1.7: attention modules no split sequence reaches (a text perceiver beside the blocks), module paths with `*`
    # for list indices: the planner keeps them out of context parallelism (cache-dit hands every attention
    # module the parallel config, and these attend over whole tensors)
    local_attention: tuple[str, ...] = ()
    # 1.10: dispatchers whose `enable_gqa` calls the planner turns into plain attention over repeated key/value heads
    kv_expand: tuple[KvExpand, ...] = ()
    # 1.11: dispatchers the planner wraps so masks fit the keys and heads each rank's kernel sees under Ulysses
    mask_mend: tuple[MaskMend, ...] = ()
    sdpa_mend: tuple[KernelMend, ...] = ()  # 1.12
    run_whole: dict[str, RunWhole] = field(default_factory=dict)  # 1.14: module path (`*` for list indices)
    # 1.14: attention modules whose processor cache-dit never hands the parallel config (their class is none of the
    # diffusers attention classes it lists): the planner hands it over, `<list>.*.<path>`
    hand_config: tuple[str, ...] = ()


# -- tensor parallelism ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TpReason:
    role: str
    why: str
    file: str
    line: int


@dataclass(frozen=True)
class Heads:
    heads: tuple[str, int | None] | None
    kv_heads: tuple[str, int | None] | None
    head_dim: tuple[str, int | None] | None


# the styles the generated TP planner has a ParallelStyle for
TpStyle = Literal["colwise", "rowwise", "colwise(output=replicate)", "rowwise(input=replicate)"]


@dataclass(frozen=True)
class TpList:
    attr: str
    block_class: str | None
    layer_plan: dict[str, TpStyle]
    reasons: dict[str, TpReason]
    shard_div_attr: dict[str, tuple[str, ...]]
    strategy: str
    confidence: Confidence
    risks: tuple[str, ...]
    notes: tuple[str, ...]
    evidence: tuple[Evidence, ...]
    heads: dict[str, Heads]
    # 1.10: attention path -> its first query projection, for attention whose processor takes RoPE and whose heads
    # are sharded: the planner cuts a RoPE tensor as wide as the whole projection (one applied before the heads
    # are split, LTX-2's interleaved kind) to the rank's columns, checked by shape at run time
    rope_shard: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TpPlan:
    block_lists: tuple[TpList, ...]
    strategy: str
    patch_kernels_first: tuple[Evidence, ...]
    confidence: Confidence
    # 1.13: why cache-dit's tensor parallelism cannot take this transformer at all (no TP planner is written)
    blocked_by: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class Parallelism:
    cp: CpPlan
    tp: TpPlan


# -- encoders, VAE -------------------------------------------------------------------------------


TePlanner = Literal["reuse", "generate", "manual", "unknown"]


@dataclass(frozen=True)
class TextEncoderPlan(TextEncoderFacts):
    action: str = field(kw_only=True)
    # 1.21: "reuse" (cache-dit's registered planner), "generate" (ours, written from the HF layer plan, registered
    # ahead of any name of cache-dit's that answers the class), "manual" (why in action), "unknown". A reviewer may
    # revise "reuse" to "generate" where cache-dit's planner does not fit the installed class (the tep proof says)
    planner: TePlanner = field(default="manual", kw_only=True)


@dataclass(frozen=True)
class VaePlan(VaeFacts):
    action: str = field(kw_only=True)
    # 1.20: "reuse" (cache-dit's own planner), "generate" (written from tiled_decode), "reuse-base" (a registered
    # base's planner under this class's name), "manual" (why in action, with the line), "unknown"
    planner: str = field(default="manual", kw_only=True)


# -- facts the decisions read, and the meta-device check -------------------------------------------


@dataclass(frozen=True)
class CrossCheck:
    ok: bool | None
    error: str | None
    disagreements: tuple[str, ...]
    checked: int
    built_cp_plan: dict[str, Any] | None | Omit = OMIT
    # 1.17: {block list: paths in its block 0} of the Linears the built block has and the static read missed (the
    # TP layer plan leaves them whole, and its confidence says so)
    missed_linears: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class PlanFacts:
    config: dict[str, Any]
    attention: tuple[AttentionFact, ...]
    linears: dict[str, tuple[LinearRole, ...]]
    sequence: SequenceFact | None
    position_modules: dict[str, PositionLayout]
    crosscheck: CrossCheck
    # 1.13: is the transformer a diffusers ModelMixin (bases traced; null: a base not traced), and the why
    model_mixin: bool | None = None
    model_mixin_at: Evidence | None = None
    # 1.14: is the denoising loop a diffusers pipeline (bases traced; null: not traced, or no loop is planned), and
    # the why: where it is not, the adapter is transformer-only and registered nowhere
    diffusers_pipeline: bool | None = None
    diffusers_pipeline_at: Evidence | None = None


@dataclass(frozen=True)
class Phase:
    id: int
    title: str
    steps: tuple[str, ...]
    commands: tuple[str, ...]


@dataclass(frozen=True)
class ExampleInput:
    """A parameter the pipeline's entry requires: the example takes it from a flag of its own (1.3)."""

    name: str
    kind: str  # "image" | "video" | "audio" | "value" (a Python literal)
    flag: str  # the example's flag: "--pose-video"
    env_var: str  # where the GPU matrix takes the flag's value from: "POSE_VIDEO"
    evidence: Evidence


@dataclass(frozen=True)
class ExamplePlan:
    """How the generated example calls the pipeline (1.3): a prompt where the entry takes one, each required
    parameter from a flag, everything else at the pipeline's own defaults (which its checks accept)."""

    prompt: bool
    inputs: tuple[ExampleInput, ...]
    defaults: dict[str, str]  # sizes and steps the example leaves at the signature's defaults (source text)
    type_guess: str  # the task type cache-dit's example registry asks for: a guess from the class name
    evidence: Evidence | None


@dataclass(frozen=True)
class Alternative:
    """Another choice a decision below high confidence could have made (1.4), as the revision that makes it."""

    decision: str  # what is decided: "ForwardPattern of `transformer_blocks`"
    now: str  # the plan's choice, in words
    instead: str  # this alternative, in words
    sets: dict[str, Any]  # `integrate revise --set` assignments: plan.json key -> value
    unsets: tuple[str, ...]  # `--unset` keys (a mapping entry removed: a stream left whole, a linear unsharded)
    confidence: Confidence  # the decision's, as planned
    touches: tuple[str, ...]  # the modules it acts on, as verify's divergence tables name them ("" = the root)
    why: str
    # 1.14: where a candidate `integrate repair` read from a failing run came from: "skipped-split" (a split cache-dit
    # skipped for another rank), "full-length" (an input whole at the cut sequence's length), "run-whole" (the
    # divergent module run whole); null for the plan's own alternatives
    read_from: str | None = None


@dataclass(frozen=True)
class Override:
    """A reviewer's revision of one value (1.4, `integrate revise`): what the analysis said and what was set."""

    key: str  # the value's dotted path in plan.json: "cache.has_separate_cfg"
    analysis: Any  # what the analysis decided there (null where the key was new)
    value: Any  # what the reviewer set
    by: str
    why: str
    at: str  # when, ISO 8601 UTC
    removed: bool = False  # the key was taken out of its mapping (`--unset`); `value` is then null


@dataclass(frozen=True)
class Revision:
    """What `integrate revise` did (its --json, docs/schema.md)."""

    plan_dir: str
    changed: bool  # False: every value set was what the plan already said (nothing written)
    approval_voided: bool  # an approval was recorded and is void now
    overrides: tuple[Override, ...]  # every override the plan now holds


@dataclass(frozen=True)
class Plan:
    schema: str
    schema_version: str
    tool_version: str
    model: PlanModel
    cache: CachePlan
    parallelism: Parallelism
    text_encoders: tuple[TextEncoderPlan, ...]
    vae: VaePlan | None
    already_supported: SupportNote | None
    facts: PlanFacts
    unknowns: tuple[str, ...]
    phases: tuple[Phase, ...] = ()
    example: ExamplePlan | None = None  # 1.3: None without a pipeline (no example is generated)
    overrides: tuple[Override, ...] = ()  # 1.4: the reviewer's revisions, each beside what the analysis said
    alternatives: tuple[Alternative, ...] = ()  # 1.4: other choices of the decisions below high confidence
    # 1.15: every file a later command reads (the sources the analysis parsed, the model folder's metadata) with its
    # SHA-256 as the plan was made: the approval binds them all
    reads: dict[str, str] = field(default_factory=dict)

    @property
    def example_inputs(self) -> tuple[ExampleInput, ...]:
        """What the pipeline requires beyond a prompt, each a flag of the example (none without an example)."""
        return self.example.inputs if self.example is not None else ()

    @property
    def gate_flags(self) -> GateFlags:
        """The gate's flags the plan was made from, to run the gate again on the same model."""
        m = self.model
        return GateFlags(m.model_path, m.pipeline_class, m.transformer_class, m.pipeline_file, m.transformer_file,
                         m.config_file, no_pipeline=m.no_pipeline,
                         separate_cfg=self.cache.has_separate_cfg if m.no_pipeline else None,
                         source_roots=m.roots)


# -- approval ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Approval:
    """APPROVAL.json: who approved which plan.json and PLAN.md, made from which sources, when; signed."""

    reviewer: str
    approved_at: str
    plan_sha256: str
    plan_md_sha256: str
    sources: dict[str, str]  # every file the plan was made from (`Plan.reads`) -> its SHA-256 when it was approved
    tool_version: str
    signature: str = ""  # HMAC-SHA256 of the fields above under this user's approval key


@dataclass(frozen=True, kw_only=True)
class ApprovalStatus:
    """Whether plan.json is approved as it stands (`integrate approve --json`)."""

    reviewer: str | Omit = OMIT
    approved_at: str | Omit = OMIT
    plan_sha256: str | Omit = OMIT  # what was approved (or, with no approval, the plan as it stands)
    approved: bool
    why: str | Omit = OMIT
    plan_sha256_now: str | Omit = OMIT  # the plan as it stands, when it changed after approval
