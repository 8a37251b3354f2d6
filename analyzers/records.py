"""What the analysers establish: the records `integrate.analyzers.analyze` returns.

Cache facts (block lists, ForwardPattern, call-site pitfalls, CFG style) are what `integrate analyze`
prints; parallelism facts (attention, block structure, sequence flow, encoders) are gathered on top of
them when a plan is to be made (`analyze(..., parallel=True)`). Field order is the JSON key order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from integrate.gate.records import GateReport

from integrate.records import IN_PROCESS, OMIT, Confidence, Evidence, Omit

from .fixes import Fix

ANALYSIS_SCHEMA_VERSION = "1.19"


@dataclass(frozen=True)
class Finding:
    """What one detector (a rule in integrate/analyzers/rules/) found about a block list or the pipeline.

    `message` is the line a reader sees (in `patch_functor_reasons`, `call_site.walk` or the notes);
    `rule` is what code switches on."""

    rule: str  # the rule's code, e.g. "pitfall-a", "walk-slice"
    attr: str  # the block list it is about ("" for the pipeline)
    message: str
    patch: bool  # a PatchFunctor must handle it
    line: int = 0
    kind: str = ""  # what the rule saw, when it tells several things apart (list-use: "len", "sliced", "indexed")
    evidence: tuple[Evidence, ...] = ()
    confidence: Confidence = "high"  # "unknown": the rule cannot tell (and says so rather than guess)
    fix: Fix | None = field(default=None, metadata=IN_PROCESS)  # what the rule asks to be changed (rules.Rule.fix)


@dataclass(frozen=True)
class Param:
    name: str
    kind: Literal["positional_only", "positional_or_keyword", "var_positional", "keyword_only", "var_keyword"]
    default: str | None = None  # source text of the default, None when required
    annotation: str | None = None


@dataclass(frozen=True)
class ReturnSite:
    line: int
    values: tuple[str, ...]  # source text of each returned element, in order
    roles: tuple[str, ...]  # the input parameter each element carries, "?" when untraced
    guards: tuple[str, ...] = ()  # conditions under which this return runs ("not x" for else)


@dataclass(frozen=True)
class ForwardSummary:
    """A block's forward: signature and what it returns, in order."""

    cls: str
    file: str
    line: int
    params: tuple[Param, ...]
    returns: tuple[ReturnSite, ...]
    return_roles: tuple[str, ...] | None  # agreed order over all return sites; None if unknown
    returns_agree: bool
    annotation: str | None
    annotation_tensor_count: int | None  # what cache-dit's pattern check counts
    annotation_agrees: bool | None
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class ExtraOp:
    """A statement in a block loop's body other than the block call and trivial guards."""

    line: int
    code: str
    kind: Literal["hoistable", "index_dependent", "residual_injection", "other"]
    active_by_default: bool
    why: str


@dataclass(frozen=True)
class Binding:
    """Pitfall A: the call site bound to the block directly and through cache-dit's wrapper."""

    pattern: str
    binds: bool
    error: str | None
    changed: tuple[str, ...]  # block parameters that would receive another argument


@dataclass(frozen=True)
class CallSite:
    file: str
    line: int
    loop_line: int
    call: str
    stream_args: dict[str, str]  # block parameter -> loop-carried variable passed to it
    outputs: tuple[str, ...]  # assignment targets of the call, in order
    keyword_positional_mismatch: bool | None
    bindings: tuple[Binding, ...]
    loop_extra_ops: tuple[ExtraOp, ...]
    in_place_input_mutation: tuple[Evidence, ...]
    walk: tuple[str, ...]  # how the list is walked: slices, len(), several loops, ...


@dataclass(frozen=True)
class BlockList:
    attr: str
    container: str  # "ModuleList", "ModuleDict[...] of ModuleList", "ModuleList of ModuleList"
    is_blocks: bool | None  # None: cannot tell
    why: str
    block_class: str | None
    block_classes: tuple[str, ...]
    block_file: str | None
    length: str | None  # expression that sets the length
    length_config_fields: tuple[str, ...]
    forward_pattern: str | None
    alternatives: tuple[str, ...]  # other patterns that also bind as is
    confidence: Confidence
    check_forward_pattern: bool | None
    roles: dict[str, str]  # "hidden_states"/"encoder_hidden_states" -> the block's parameter
    forward: ForwardSummary | None
    call_site: CallSite | None
    evidence: tuple[Evidence, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class TransformerFacts:
    cls: str
    file: str
    line: int
    block_lists: tuple[BlockList, ...]
    needs_patch_functor: bool
    patch_functor_reasons: tuple[str, ...]  # the `patch` findings, as "<list>: <message>"
    unknowns: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = field(default=(), metadata=IN_PROCESS)  # typed, for code to switch on


@dataclass(frozen=True)
class CallInput:
    """One named parameter of the pipeline's entry (1.3)."""

    name: str
    kind: Literal["image", "video", "audio", "prompt", "value"]  # read from its name and annotation
    required: bool  # no default
    default: str | None  # the default's source text (None when required)
    line: int  # the entry's line


@dataclass(frozen=True)
class PipelineFacts:
    cls: str | None
    entry: str
    file: str | None
    has_separate_cfg: bool | None
    confidence: Confidence
    transformer_calls: int | None
    evidence: tuple[Evidence, ...]
    findings: tuple[Finding, ...] = field(default=(), metadata=IN_PROCESS)  # the pipeline rules' findings
    # 1.2: other models the denoising loop calls beside the transformer (Ideogram4's unconditional_transformer)
    other_models: tuple[Evidence, ...] = ()
    call_inputs: tuple[CallInput, ...] = ()  # 1.3: the entry's parameters, as its signature declares them
    # 1.7: the attribute the pipeline holds the transformer as (`transformer`, a sampler's `model`), read from its
    # `__init__`; None: not read (the adapter then keeps diffusers' `pipe.transformer`, said in its notes)
    transformer_attr: str | None = None
    transformer_attr_at: Evidence | None = None
    # 1.12: is the loop a diffusers pipeline (its class traced to DiffusionPipeline; a function is not; None: a base
    # not traced), and where: one that is not gets a transformer-only adapter, registered under no name
    diffusers_pipeline: bool | None = None
    diffusers_pipeline_at: Evidence | None = None


@dataclass(frozen=True)
class ModuleFact:
    """One sub-module of a block, read from `__init__` (sizes traced from config.json where possible)."""

    path: str  # relative to the block: "attn.to_q", "ff.net.2"
    cls: str
    kind: Literal["linear", "container", "module", "library", "parameter", "unknown"]
    shape: tuple[int | None, int | None] | None  # Linear (in, out) or a norm's (size, None)
    conditional: bool
    file: str
    line: int


@dataclass(frozen=True)
class AttentionFact:
    block_list: str = field(kw_only=True)  # the block list whose element 0 holds it
    path: str  # relative to the block
    cls: str
    processor: str | None
    processor_at: Evidence | None
    in_projs: tuple[str, ...]  # called before the attention kernel
    out_projs: tuple[str, ...]  # called after it
    fused: dict[str, str]  # projection -> how its output is split into several tensors
    fused_equal_split: bool  # every fused projection is split into equal parts (QKV), not QKV+MLP
    reshape_attrs: dict[str, int]  # attention attribute used in a reshape/split -> line
    heads: tuple[str, int | None] | None  # (attribute, value)
    kv_heads: tuple[str, int | None] | None
    head_dim: tuple[str, int | None] | None
    mask_at: Evidence | None  # the processor takes and uses an attention mask
    rope_at: Evidence | None
    kernel: Evidence | None  # the attention kernel call
    qk_norms: dict[str, int | None]  # q/k norm -> normalised size
    evidence: tuple[Evidence, ...] = ()
    unknowns: tuple[str, ...] = ()
    # 1.2: the processor sizes the mask with the attention module's legacy `prepare_attention_mask`, from the
    # (local, under CP) key length and the full head count
    mask_prepared_at: Evidence | None = None
    # 1.2: the processor runs cross-attention without CP (dispatch_attention_fn gets no parallel config then)
    cross_local_at: Evidence | None = None
    causal_at: Evidence | None = None  # 1.3: the kernel is called with `is_causal` other than False
    # 1.4: a mask the processor applies to the attention output after the kernel (per query)
    mask_after_at: Evidence | None = None
    # 1.4: where the processor joins its own keys (or queries) with the text's into one sequence, and in which
    # order (None: not read)
    joins_at: Evidence | None = None
    text_first: bool | None = None
    kernel_name: str | None = None  # 1.5: the kernel call's callee as written (`F.scaled_dot_product_attention`)
    gqa_at: Evidence | None = None  # 1.6: the kernel is called with `enable_gqa` other than False
    # 1.7: the dispatcher is called with a fixed `backend=` (its line), and the backend's member name where it is
    # written `AttentionBackendName.<member>` (None: not read)
    backend_at: Evidence | None = None
    backend: str | None = None
    # 1.9: the `enable_gqa` kernel call's callee as (module, global name), where it is a bare name the processor's
    # file binds at module level (an import or a def) and the file's import name is known; None otherwise
    gqa_global: tuple[str, str] | None = None
    # 1.10: the first kernel call's callee as (module, global name), read as `gqa_global` is (None otherwise): the
    # global a generated planner wraps to mend masks at the kernel under CP
    kernel_global: tuple[str, str] | None = None
    # 1.10: the processor parameter `mask_after_at` names, and the block forward's parameters that reach it through
    # the block's calls of this attention module (keyword, or position of the module's forward); () when not read
    mask_after_param: str | None = None
    mask_after_inputs: tuple[str, ...] = ()
    # 1.11: that first kernel is torch's `scaled_dot_product_attention` reached as an attribute of a module-level
    # alias of torch.nn.functional: (module, alias), the global a generated planner replaces so that, under CP, the
    # call goes through cache-dit's dispatcher (None otherwise)
    sdpa_global: tuple[str, str] | None = None
    # 1.13: with a processor, does the installed cache-dit hand it the parallel config under CP (the module's class
    # derives from one of the diffusers attention classes cache-dit lists; None: a base not traced), and where (the
    # class line; why names the chain or the base that is not one)
    cp_config_given: bool | None = None
    cp_config_at: Evidence | None = None


@dataclass(frozen=True)
class LinearRole:
    path: str
    role: Literal["attention_in", "attention_out", "ffn_in", "ffn_out", "modulation", "block_in", "block_out",
                  "router", "inline_attention", "unknown"]  # router (1.4): an MoE router, kept whole;
    # inline_attention (1.8): a projection of an attention kernel the block calls itself, with no attention module
    why: str
    fused_out_down: bool = False  # its input joins attention output and another projection's output
    feeds_rowwise: bool = False  # 1.2 (block_in): its output reaches a block-level row-wise Linear
    parts: int | Omit = OMIT  # 1.3 (ffn_in), only when set: its output is cut into this many equal parts (a GLU)
    # 1.12: [path in the block, class] of the module that cuts it: another config may build another class there
    # (Latte's `activation_fn`: GEGLU cuts, GELU does not), and the generated planner checks before reordering
    parts_by: tuple[str, str] | Omit = OMIT
    # 1.15 (with parts): the attribute of the cutting module that holds each part's width (`mlp_hidden_dim` of
    # `torch.split(x, [self.mlp_hidden_dim] * 2, dim=-1)`): the planner divides it by the TP size
    parts_width: str | Omit = OMIT


@dataclass(frozen=True)
class SubModuleCall:
    """A call the block's forward makes to one of its attention / FFN sub-modules."""

    path: str
    inputs: dict[str, str]  # the sub-module's parameter -> "stream" | "position" | "other"
    at: Evidence
    # 1.9: the sub-module's parameter -> the block forward's parameters its argument's value is derived from
    sources: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # 1.9: the sub-module's parameter -> the block forward's parameter passed to it as is (a bare name), where one is
    passes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BlockStructure:
    """What TP needs to know about one block list's element 0."""

    attr: str
    block_class: str | None
    length: int | None
    modules: tuple[ModuleFact, ...]
    attentions: tuple[AttentionFact, ...]
    linears: tuple[LinearRole, ...]
    tables: tuple[str, ...]  # nn.Parameter modulation tables (kept replicated)
    kernels: tuple[Evidence, ...]  # fused / env-gated kernels in the block's sources
    evidence: tuple[Evidence, ...] = ()
    unknowns: tuple[str, ...] = ()
    built: bool = True  # element 0 exists for this config (False: a branch not taken, e.g. an optional list)
    surgery: tuple[Evidence, ...] = ()  # the block splits/slices its stream by a length from a non-tensor input
    calls: tuple[SubModuleCall, ...] = ()
    # sub-modules (paths in the block) whose forward picks tokens from the whole sequence it is given: an MoE layer
    # routing by expert choice (`topk` with a `k` computed from its input's length), with the line
    token_routing: tuple[tuple[str, Evidence], ...] = ()
    # calls the block's forward makes with its stream to a sub-module of a class the analysis cannot read (one
    # built from a class handed to the constructor, `self.attn = attn_cls(...)`), with the call's line
    unread: tuple[Evidence, ...] = ()
    # dispatcher calls in an attention's processor that take query, key or value sliced along the sequence axis
    # (`query[:, start:end]`): positions of the whole sequence, which under CP each rank holds only a share of
    kernel_slices: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class BlockInputFact:
    param: str
    arg: str
    role: Literal["stream", "position", "mask", "other"]
    producer_kind: str  # "param", "module", "method", "function", "expression", "unknown"
    producer: str | None
    producer_at: Evidence | None
    producer_outputs: int | None
    in_loop: bool
    from_params: tuple[str, ...]
    local_length: tuple[Evidence, ...]
    token_params: tuple[str, ...] = ()  # forward parameters whose dim 1 (a per-token axis) feeds it
    # 1.4: built as `x.flatten(0, k)` in forward: its leading (grid) axes merged, the sequence at dim 0
    leading_flatten: bool = False
    annotation: str | None = None  # 1.5: the block forward's annotation of `param` (`tuple[torch.Tensor, ...]`)
    # 1.6: for a tuple built inline (`(cos, sin)`), each element's rank as read from the code that builds it
    producer_ndims: tuple[int | None, ...] = ()
    # 1.6: a mask-named input that is one value per token, never an attention mask (split with the tokens)
    per_token: Evidence | None = None
    # 1.8: the block (or a module it hands the input to) indexes it by another input (`freqs[positions]`): a
    # lookup table every rank needs whole, never cut with the tokens
    table: Evidence | None = None
    # 1.8: the input's rank read from the code that builds it (`torch.arange(n)`: 1), None when not read
    ndim: int | None = None


@dataclass(frozen=True)
class SideModule:
    module: str
    indexed: bool  # called as `self.<module>[i](...)`: one per block
    at: Evidence
    ndim: int | None = None  # 1.4: how many dims its output has, read statically (None: not read)


@dataclass(frozen=True)
class MaskFact:
    name: str  # the variable, parameter or dict key
    where: Literal["forward", "pipeline"]
    layout: str | None  # "1-D key mask [B, 1, 1, S]", "2-D mask [B, 1, S, S]", None when not read
    at: Evidence


@dataclass(frozen=True)
class ListFlowFact:
    attr: str
    loop_line: int
    streams: dict[str, str]  # block parameter -> loop variable
    inputs: tuple[BlockInputFact, ...]
    fresh: bool  # its streams are not the previous list's outputs (per token)
    after: str | None
    mixed_after: bool
    mixing: tuple[Evidence, ...]
    side_modules: tuple[SideModule, ...] = ()  # modules whose output the loop body joins into a stream
    fresh_streams: tuple[str, ...] = ()  # block parameters whose stream is not split yet (to split here)
    offset: int | None = 0  # first block index this walk visits (a walk over `lst[-k:]` starts at n - k)
    last: int | None = None  # last block index it visits (None: not known statically)
    # 1.11: for a walk after the first whose streams are fresh: each fresh stream's forward input, where every op
    # from that input to the walk acts per token (the root check the first walk gets, in SequenceFact), and
    # why a root split could not reach it
    root_params: dict[str, str] = field(default_factory=dict)
    root_blockers: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class SequenceFact:
    file: str
    forward_line: int
    forward_params: tuple[str, ...]
    lists: tuple[ListFlowFact, ...]
    root_blockers: tuple[Evidence, ...]
    root_params: dict[str, str]  # loop variable -> forward parameter
    root_risks: tuple[Evidence, ...]  # per-token inputs built from a local length under a root split
    gather: str | None
    gather_at: Evidence | None
    gather_blocked: tuple[Evidence, ...]  # the sequence is cut by a global length before any output module
    gather_blocked_unless_root: tuple[Evidence, ...]  # cut by lengths read before the loop: fine after a root split
    masks: tuple[MaskFact, ...]
    batch_dropped: dict[str, Evidence] = field(default_factory=dict)  # `if ids.ndim == 3: ids = ids[0]`
    annotations: dict[str, str] = field(default_factory=dict)  # forward parameter -> its annotation
    unknowns: tuple[str, ...] = ()
    # 1.5: forward parameter -> the dims its docstring documents (`token_tags` of shape `(seq_len,)`)
    documented: dict[str, tuple[str, ...]] = field(default_factory=dict)
    gather_reads: tuple[str, ...] = ()  # 1.5: the names the gather module's call reads (the stream among them)
    # 1.6: attention modules outside every walked block list and loop side module (`perceiver.layers.*.
    # cross_attention`: list indices as `*`), each with where it is built: they attend over whole tensors
    outside_attention: dict[str, Evidence] = field(default_factory=dict)
    # 1.11: forward inputs whose default is None: a call may leave them out, and cache-dit's split hook raises on
    # an input it cannot find among the call's arguments
    optional: tuple[str, ...] = ()


@dataclass(frozen=True)
class TextEncoderFacts:
    """One text encoder named in model_index.json and what TE-P needs to know about it."""

    component: str  # the model_index key: "text_encoder", "text_encoder_2", ...
    cls: str | None  # class name from model_index.json
    library: str | None  # "transformers", "diffusers", ...
    supported: bool | None  # the installed cache-dit registers a TE-P planner for it (None: cache-dit not found)
    supported_by: str | None  # "file:line" of that registration
    tp_plan: dict[str, str]  # HF `base_model_tp_plan` (module pattern -> "colwise"/"rowwise"/...), {} when none
    tp_plan_source: Evidence | None  # where tp_plan was read
    evidence: tuple[Evidence, ...] = ()
    notes: tuple[str, ...] = ()
    # 1.19: the registered name cache-dit answers the class with (the class's own name, or a shorter one it starts
    # with: a registration written for another class); None where none answers. tp_plan is now read for every
    # transformers encoder, registered or not, so a planner can be written from it where cache-dit's does not fit
    registered_as: str | None = None
    module: str | None = None  # 1.19: the transformers module that defines the class (not every class is exported)


@dataclass(frozen=True)
class VaeTiles:
    """1.18: the VAE's `tiled_decode` (own or inherited) and whether its tile loop has the shape a generated VAE-P
    planner deals to ranks (analyzers/vae_tiles.py): `rows = []`; `for i in range(..)`: `row = []`; `for j in
    range(..)`: <one tile, no state carried to the next>; `row.append(X)`; `rows.append(row)`."""

    source: Evidence | None  # `def tiled_decode` (why: the class it is defined on); None: the class has none
    loop: Evidence | None  # the outer tile loop when understood, else the line the reading stopped at, and why
    understood: bool
    module: str | None  # dotted module the function is defined in (the planner imports its global names from it)
    row: str | None  # the inner list (`row`) and the list of rows (`rows`) when understood
    rows: str | None
    confidence: Confidence = "high"


@dataclass(frozen=True)
class VaeReuse:
    """1.18: the VAE subclasses a VAE cache-dit registers, and overrides none of the methods that planner replaces or
    calls: that planner, registered under the subclass's exact name."""

    base: str  # the registered class name
    planner: str  # cache-dit's planner class registered for it
    module: str  # the cache-dit module that defines the planner
    chain: tuple[Evidence, ...]  # the class, each base between, the base; and the registration


@dataclass(frozen=True)
class VaeFacts:
    component: str  # "vae"
    cls: str | None
    library: str | None
    supported: bool | None  # the installed cache-dit registers a VAE-P planner for it
    supported_by: str | None
    evidence: tuple[Evidence, ...] = ()
    notes: tuple[str, ...] = ()
    tiles: VaeTiles | None = None  # 1.18: read when no planner is registered for the class (None: not read)
    reuse: VaeReuse | None = None  # 1.18: a registered base's planner answers for it


@dataclass(frozen=True)
class PositionLayout:
    """What a position module (RoPE, position embedding) returns, read from its last reshape."""

    outputs: int | None  # tensors in the returned tuple
    split_dim: int
    expected_dims: int | None  # 1.6: None when the layout is not read (the split then checks no rank)
    confidence: str
    why: str


@dataclass(frozen=True)
class ParallelFacts:
    """Everything the CP / TP / TE-P / VAE-P decisions read, gathered statically."""

    config: dict[str, Any]  # transformer config.json values used to size modules
    blocks: tuple[BlockStructure, ...]
    sequence: SequenceFact | None
    top_modules: tuple[ModuleFact, ...]  # the transformer's own direct sub-modules
    position_modules: dict[str, PositionLayout]  # module -> how many tensors it returns and their layout
    diffusers_cp_plan: dict[str, Any] | None  # `_cp_plan` declared on the class, read statically
    diffusers_cp_plan_at: Evidence | None
    pipeline_masks: tuple[MaskFact, ...]
    # transformer keyword argument -> dims of what the pipeline passes (1.3: else the forward's docstring's shape)
    pipeline_arg_ndims: dict[str, int]
    pipeline_arg_ndims_at: dict[str, Evidence]
    text_encoders: tuple[TextEncoderFacts, ...]
    vae: VaeFacts | None
    # 1.4: where the installed cache-dit's attention with log-sum-exp (what ring attention runs) refuses any
    # attention mask; None when that check was not found in its source
    ring_refuses_masks: Evidence | None = None
    # 1.6: where the installed cache-dit's context-parallel attention refuses `enable_gqa` without a GQA strategy
    cp_refuses_gqa: Evidence | None = None
    # 1.7: diffusers' attention backends registered without context-parallel support, read from the installed
    # diffusers' dispatcher: {AttentionBackendName member: its registration}
    cp_local_backends: dict[str, Evidence] = field(default_factory=dict)
    # 1.12: is the transformer class a diffusers ModelMixin, its bases traced (None: a base is not traced), and
    # where that was read (the class line; why names the chain or the base)
    model_mixin: bool | None = None
    model_mixin_at: Evidence | None = None
    # 1.12: where the installed cache-dit's tensor parallelism asserts a ModelMixin; None when not found there
    tp_requires_model_mixin: Evidence | None = None
    # 1.13: where the installed cache-dit lists the diffusers attention classes whose processors it hands the
    # parallel config (why names them); None when not found there
    cp_attention_classes: Evidence | None = None
    # attention modules a block loop's body calls beside the blocks with the stream, whose processor lays the
    # sequence out by a count read from the shape of another input (`query.unflatten(1, (T, -1))`, `T` the frames
    # of the tensor it attends to): (the block list whose loop calls it, hook key, the module forward's parameter
    # the stream is passed as, the line)
    regrouping: tuple[tuple[str, str, str, Evidence], ...] = ()


@dataclass(frozen=True)
class SupportMatch:
    cls: str  # the pipeline or transformer class that matched
    prefix: str  # cache-dit's registered name prefix
    adapter: str  # "file:line" of its adapter
    accepts: tuple[str, ...]  # transformer classes that adapter asserts ((): it asserts none)


@dataclass(frozen=True)
class BuiltinAnswer:
    """A class name one of cache-dit's own registrations answers by name prefix (1.16; cache-dit looks adapters and
    planners up by the first registered name a class name starts with, and its adapters skip their type check for a
    class outside diffusers), and whether it is deferred to: only where it was written for this very class (the same
    module and name) and, for an adapter, where its block lists bind here as the analysis reads them."""

    kind: Literal["adapter", "cp", "tp"]
    name: str  # the class name cache-dit looks up (a diffusers pipeline's, or the transformer's)
    key: str  # cache-dit's registered name that answers it first
    written_for: tuple[str, ...]  # the classes it was written for, qualified as it names them ((): not read)
    this: str  # the analysed transformer class, qualified (module.Class)
    deferred: bool  # false: the plugin registers ours ahead of it
    why: str  # the verdict, labelled
    confidence: Confidence
    evidence: tuple[Evidence, ...]  # the registration first (file, line), then this class, then the binding


@dataclass(frozen=True)
class SupportNote:
    """What the installed cache-dit already registers: reported beside the analysis, never used as it."""

    label: str
    cache_dit_found: bool
    registered: bool  # 1.16: an adapter cache-dit registers was written for this very class (module and name)
    matches: tuple[SupportMatch, ...]
    prefix_only: str | Omit = OMIT  # why a prefix match is not deferred to (the verdict of `answers`)
    # "cp" / "tp" -> the planner name cache-dit registers that answers a lookup of the transformer class first,
    # "'key' (file:line)"
    planners: dict[str, str] | Omit = OMIT
    # 1.16: cache-dit's own adapter is deferred to: `registered`, and its block lists bind here (no binding of the
    # analysis rejects them); the plugin then registers no adapter of its own
    deferred: bool = False
    answers: tuple[BuiltinAnswer, ...] = ()  # 1.16: each name a built-in registration answers, with its verdict
    # 1.16: where cache-dit turns separate CFG on for the pipeline by its class name (a prefix in its list), whatever
    # the adapter says; generate says to set `enable_separate_cfg=False` where the pipeline batches CFG
    separate_cfg_by_name: Evidence | Omit = OMIT


@dataclass(frozen=True)
class CacheDefaults:
    """cache-dit's default cache config, read from its source: a cached list shorter than either count stops
    the cache at start (cache-dit asserts `Fn_compute_blocks <= len(blocks)`, and the same of Bn)."""

    fn_compute_blocks: int
    bn_compute_blocks: int
    evidence: Evidence


@dataclass(frozen=True)
class Analysis:
    schema_version: str
    tool_version: str
    gate: GateReport
    transformer: TransformerFacts
    pipeline: PipelineFacts
    already_supported: SupportNote | None
    files_read: tuple[str, ...] = ()
    cache_defaults: CacheDefaults | None = None  # 1.2; None: cache-dit's config class was not found
    # gathered for `plan` (analyze(..., parallel=True)); the plan's `facts` carry what the decisions read
    parallel: ParallelFacts | None = field(default=None, metadata=IN_PROCESS)
