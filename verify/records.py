"""What `integrate verify` reports (docs/schema.md, `integrate.verify` 1.0): one record per proof.

Keys that a proof only has in some outcomes (an error, a variant that did not run) are optional: their
value is OMIT and they are left out of the JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from integrate.records import OMIT, Omit

NOT_REQUESTED = "not requested"  # the `why` of a proof this run was not asked for
VERIFY_SCHEMA = "integrate.verify"
VERIFY_SCHEMA_VERSION = "1.9"
GPU_SCHEMA = "integrate.verify.gpu"
GPU_SCHEMA_VERSION = "1.0"

# needs-code (1.2): a hand-written part is a stub; vacuous (1.6): the outputs agree, but nothing was sharded or split
Status = Literal["pass", "fail", "skipped", "error", "needs-code", "vacuous"]


@dataclass(frozen=True)
class WorkerError:
    """An exception inside the model or the integration, caught in a worker and located."""

    stage: str  # what the worker was doing: "import the plugin", "set up the integration", "run the model", ...
    module: str | None  # the module whose forward raised (its path in the plain model)
    after: str | None  # the last module that returned before it
    at: str  # "file:line" of the raise
    type: str
    message: str
    trace: tuple[str, ...] = ()


@dataclass(frozen=True)
class LayerRow:
    module: str
    how: str  # how the shards were put back together: "whole", "sequence", "streams", "last dim", ...
    max_abs: float
    cosine: float
    rel_l2: float
    ok: bool


@dataclass(frozen=True)
class InputShape:
    """A tensor input's shape in the 1-process run (`whole`: null where that run did not record it) and on a
    rank: a sequence cut by the plan is shorter on the rank; one the plan left whole is not."""

    whole: tuple[int, ...] | None
    rank: tuple[int, ...]


@dataclass(frozen=True)
class OutputShape:
    """1.5: the shape of one element a module returned (index as a hook sees it), in the 1-process run and on a
    rank; null where that run did not return it (the rank's call raised) or it is no tensor."""

    whole: tuple[int, ...] | None
    rank: tuple[int, ...] | None


@dataclass(frozen=True)
class Divergence:
    """The first module whose output differs from the 1-process run, with the per-layer table around it."""

    module: str | None
    table: tuple[LayerRow, ...]
    compared: int
    not_comparable: int
    max_abs: float | Omit = OMIT
    cosine: float | Omit = OMIT
    error: WorkerError | Omit = OMIT
    raised: str | Omit = OMIT  # where it was raised, in words
    # a parallel proof's: the tensor inputs of the divergent module and of each module it runs inside, their
    # shapes in the 1-process run and on rank 0 ({module: {parameter: shapes}}, innermost first)
    inputs: dict[str, dict[str, InputShape]] | Omit = OMIT
    # 1.5: what the same modules returned, element by element ({module: [shapes]}); a module whose output is no
    # tensor nor a tuple of them is left out
    outputs: dict[str, tuple[OutputShape, ...]] | Omit = OMIT


@dataclass(frozen=True)
class Figures:
    max_abs: float
    cosine: float
    rel_l2: float
    ok: bool


@dataclass(frozen=True)
class Compared:
    """An output compared bit for bit (`bitwise`) with the plain model's, and its figures."""

    bitwise: bool
    max_abs: float
    cosine: float
    rel_l2: float
    ok: bool


@dataclass(frozen=True)
class PatternCheck:
    """Does a list's first block return its streams in the order its ForwardPattern says?"""

    list: str
    pattern: str
    seen_in: list[Any] | None = field(metadata={"name": "in"})  # the input shapes (hidden, encoder)
    seen_out: list[Any] | None = field(metadata={"name": "out"})  # the output shapes, in order
    status: Literal["pass", "fail", "unknown"]
    why: str


@dataclass(frozen=True)
class CachingOn:
    threshold: float
    cached_steps: tuple[int, ...]
    residual_diffs: tuple[float, ...]
    finite: bool
    warmup_bitwise: bool | Omit = OMIT
    rel_l2_per_call: tuple[float, ...] | Omit = OMIT
    step_move_rel_l2: tuple[float, ...] | Omit = OMIT
    max_rel_l2: float | Omit = OMIT
    finite_output: bool | Omit = OMIT


@dataclass(frozen=True)
class PerBlockHooks:
    """The PatchFunctor's per-block pre-hooks in the cache proof: registered, runs, and the keywords (`list:key`)
    that reached one list's blocks with more than one value."""

    hooks: int
    fired: int
    varying: tuple[str, ...]


@dataclass(frozen=True)
class TpShard:
    name: str  # a parameter
    full: tuple[int, ...]
    local: tuple[int, ...]  # its shape on this rank
    placements: tuple[str, ...] | Omit = OMIT  # a DTensor's (`Shard(dim=0)`, `Replicate()`)


@dataclass(frozen=True)
class TpEngagement:
    """Rank 0's parameters after the TP setup: how many, how many hold a shard, and the plan keys torch could not
    resolve to a module (it skips them with a warning)."""

    parameters: int
    sharded: int
    shards: tuple[TpShard, ...]  # one sharded parameter of each kind (list indices aside), at most 40
    unresolved: tuple[str, ...]


@dataclass(frozen=True)
class CpSplit:
    module: str  # the module whose hook split the tensor
    dim: int | None
    full: tuple[int, ...]
    local: tuple[int, ...]  # this rank's part


@dataclass(frozen=True)
class CpEngagement:
    """Rank 0's context-parallel hooks: how many the plan registered, how many fired, which never did, and what
    the splits made of their tensors (the local sequence per rank)."""

    hooks: int
    fired: int
    unfired: tuple[str, ...]
    split: int  # tensors a split hook cut
    splits: tuple[CpSplit, ...]  # those (or, where none was cut, what the hooks were given), at most 40
    # 1.7, where no hook cut a tensor: modules whose tensor inputs on the rank are shaped otherwise than in the
    # 1-process run (a planner that cuts inside a forward it replaces), and the first as "path.param full -> local"
    local_inputs: int | Omit = OMIT
    first_local: str | Omit = OMIT


@dataclass(frozen=True)
class PlannerLookup:
    """What cache-dit's CP or TP planner registry answered when the run asked it for the transformer's planner."""

    kind: Literal["cp", "tp"]
    asked: str  # the class name looked up
    found: bool
    planner: str | Omit = OMIT  # its dotted class name
    key: str | None | Omit = OMIT  # the registered name prefix that answered
    file: str | Omit = OMIT
    line: int | Omit = OMIT
    why: str | Omit = OMIT  # the registry's refusal, when it found none
    handed: bool | Omit = OMIT  # verify answered the lookup with the plugin's planner (the plugin could not register it)


@dataclass(frozen=True)
class Engaged:
    tp: TpEngagement | Omit = OMIT
    cp: CpEngagement | Omit = OMIT
    planners: tuple[PlannerLookup, ...] | Omit = OMIT  # 1.7: cache-dit's planner lookups during the setup


@dataclass(frozen=True)
class Variant:
    """One configuration of a parallel proof (`ulysses2`, `ring2`, `tp2+cache`, ...)."""

    status: Status
    why: str | Omit = OMIT
    max_abs: float | Omit = OMIT
    cosine: float | Omit = OMIT
    rel_l2: float | Omit = OMIT
    ok: bool | Omit = OMIT
    error: WorkerError | Omit = OMIT
    first_divergence: Divergence | None | Omit = OMIT
    # 1.2: planned splits cache-dit skipped (the tensor's rank was not the split's `expected_dims`), each
    # "<module running>: <its warning>"
    skipped_splits: tuple[str, ...] | Omit = OMIT
    engaged: Engaged | Omit = OMIT  # 1.6: what rank 0 shows of the plan having acted


@dataclass(frozen=True)
class StateDictProof:
    status: Status
    why: str | Omit = OMIT
    first_divergence: Divergence | None = None
    keys: int | Omit = OMIT
    renamed_by_patch_functor: str | Omit = OMIT
    note: str | Omit = OMIT


@dataclass(frozen=True)
class CacheProof:
    status: Status
    why: str | Omit = OMIT
    first_divergence: Divergence | None = None
    error: WorkerError | Omit = OMIT
    block_counts: dict[str, int] | None | Omit = OMIT
    has_separate_cfg: bool | None | Omit = OMIT
    patterns: tuple[PatternCheck, ...] | Omit = OMIT
    patched_forward: Compared | Omit = OMIT
    caching_off: Compared | Omit = OMIT
    caching_on: CachingOn | Omit = OMIT
    # 1.3: "contiguous" when caching off matches, bit for bit, the plain model with its block outputs made
    # contiguous as cache-dit's wrapper makes them (and not the plain model itself: float rounding of that copy)
    caching_off_reference: str | Omit = OMIT
    # 1.8: the PatchFunctor's per-block hooks, where it has any: a pass needs them run with per-block values
    per_block: PerBlockHooks | Omit = OMIT


@dataclass(frozen=True)
class ParallelProof:
    status: Status
    why: str | Omit = OMIT
    first_divergence: Divergence | None = None
    variants: dict[str, Variant] | Omit = OMIT
    # 1.9: the fixture config keys a proof ran on changed, key -> [fixture's, its own] (hybrid: twice the heads, of
    # half the head dim); its 1-process run is the plain model on the same config
    config: dict[str, Any] | Omit = OMIT


@dataclass(frozen=True)
class ComponentRun:
    """1.9: one pipeline part (a text encoder, the VAE) built tiny from its config and run through its cache-dit
    planner across `world` gloo processes, against its own 1-process run (computed on each rank before the planner
    was applied). `engaged` is what shows the planner acted (TE-P: sharded parameters with their local shapes; VAE-P:
    the tiles each rank decoded); without it the run is `vacuous`."""

    component: str  # the model_index key: "text_encoder_2", "vae"
    cls: str
    status: Status
    why: str | Omit = OMIT
    planner: str | Omit = OMIT  # the planner class cache-dit's registry answered with (dotted)
    config_from: str | Omit = OMIT  # "model folder" or "class defaults"
    world: int | Omit = OMIT
    figures: Figures | Omit = OMIT  # the planner's output against the 1-process run (the worst one)
    engaged: dict[str, Any] | Omit = OMIT
    first_divergence: dict[str, Any] | Omit = OMIT  # {module (None: none found), compared, not_comparable, ...}
    # VAE-P: the planner's (tiled) decode against the untiled one, PSNR and SSIM over the frames, reported only
    # (blending overlapping tiles changes pixels); and the largest difference on the tile borders
    untiled: dict[str, Any] | Omit = OMIT
    seams: dict[str, Any] | Omit = OMIT
    error: WorkerError | Omit = OMIT
    seconds: float | Omit = OMIT


@dataclass(frozen=True)
class ComponentProof:
    """1.9: a TE-P or VAE-P proof: one run per part the plan gives a planner to."""

    status: Status
    why: str | Omit = OMIT
    first_divergence: Divergence | None = None  # always None: each part's own is in its run
    runs: tuple[ComponentRun, ...] | Omit = OMIT


@dataclass(frozen=True)
class FixtureReport:
    path: str
    # skipped (1.9): only component proofs (TE-P, VAE-P) were asked for, which build parts of their own
    status: Literal["derived", "edited", "needs-edit", "error", "skipped"]
    errors: tuple[str, ...] = ()
    parameters: int | None | Omit = OMIT
    changes: dict[str, Any] | Omit = OMIT  # config key -> [before, after]
    image_tokens: int | None | Omit = OMIT
    text_tokens: int | Omit = OMIT
    masks: str | Omit = OMIT  # the dtype the plain model wanted its masks in, when not the default
    source: str | Omit = OMIT  # where the inputs came from: "test-file", "pipeline" or "static"
    tried: tuple[str, ...] | Omit = OMIT  # sources tried before it, each with why it was not used
    notes: tuple[str, ...] | Omit = OMIT  # what stood in for a part the model folder does not name


@dataclass(frozen=True)
class FullSizeList:
    """A cached block list of the real model, against the cache config cache-dit uses by default."""

    attr: str
    blocks: int | None  # None: the list was not found on the model
    fn_compute_blocks: int
    bn_compute_blocks: int
    ok: bool
    why: str | Omit = OMIT


@dataclass(frozen=True)
class FullSizeHeads:
    """A head count of the real model (element 0 of a block list), and the parallel sizes it divides by."""

    block_list: str
    module: str
    attr: str
    value: int | None
    divides: dict[str, bool]  # "tp2" ... "ulysses8" -> heads % size == 0


@dataclass(frozen=True)
class FullSizeProof:
    status: Status
    why: str | Omit = OMIT
    first_divergence: Divergence | None = None  # always None: nothing runs, the sizes are compared
    lists: tuple[FullSizeList, ...] = ()
    heads: tuple[FullSizeHeads, ...] = ()
    not_checked: tuple[str, ...] = ()


@dataclass(frozen=True)
class VerifyModel:
    transformer_class: str | None
    pipeline_class: str | None


@dataclass(frozen=True)
class PluginRef:
    path: str
    import_name: str


# -- the GPU matrix -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuResult:
    name: str
    command: str
    status: Literal["pass", "fail", "error", "skipped"]
    latency_s: float | None
    peak_memory_gib: float | None
    exit: int | Omit = OMIT
    psnr: float | None | Omit = OMIT
    ssim: float | Omit = OMIT
    garbled: bool | Omit = OMIT
    why: str | Omit = OMIT


@dataclass(frozen=True)
class GpuReport:
    schema: str
    schema_version: str
    setup: tuple[str, ...]
    commands: tuple[str, ...]
    status: str | Omit = OMIT  # "skipped" when no CUDA GPU is present
    why: str | Omit = OMIT
    results: tuple[GpuResult, ...] | Omit = OMIT
    table: str | Omit = OMIT  # the results as a Markdown table

    @property
    def failed(self) -> bool:
        if self.results is OMIT:
            return self.status is not OMIT and self.status == "skipped"
        return any(r.status in ("fail", "error") for r in self.results)


# -- metrics --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrameMetrics:
    frame: int
    psnr: float | None
    ssim: float


@dataclass(frozen=True)
class Scores:
    kind: Literal["image", "video"]
    frames: int
    psnr: float | None  # minimum over frames, dB; None: identical (infinite)
    ssim: float  # minimum over frames
    worst_frame: int
    per_frame: tuple[FrameMetrics, ...]
    garbled: bool  # PSNR >= 25 but SSIM < 0.5
    identical: bool
    passes: dict[str, bool]
    side_by_side: str | Omit = OMIT


@dataclass(frozen=True)
class MetricsReport:
    schema_version: str
    metrics: Scores
