"""Frozen, JSON-serialisable records passed from one stage to the next.

Every stage reads the records of earlier stages and never imports a later stage. The JSON
form of these records is the documented schema (docs/schema.md); bump SCHEMA_VERSION on any
change to field names or meanings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, Literal

SCHEMA_VERSION = "1.0"

Confidence = Literal["high", "medium", "low", "unknown"]


@dataclass(frozen=True)
class Evidence:
    file: str
    line: int
    why: str


@dataclass(frozen=True)
class Fact:
    """One gate fact: its value and where it came from (a flag, a metadata file, a lookup)."""

    value: str | None
    source: str


@dataclass(frozen=True)
class GateReport:
    inputs: dict[str, Fact]  # model_path, pipeline_class, transformer_class, pipeline_file, transformer_file
    pipeline_entry: str  # "__call__", a method name, or a module-level function name
    notes: tuple[str, ...] = ()

    def value(self, fact: str) -> str | None:
        return self.inputs[fact].value


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
    patch_functor_reasons: tuple[str, ...]
    unknowns: tuple[str, ...] = ()


@dataclass(frozen=True)
class PipelineFacts:
    cls: str | None
    entry: str
    file: str | None
    has_separate_cfg: bool | None
    confidence: Confidence
    transformer_calls: int | None
    evidence: tuple[Evidence, ...]


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


@dataclass(frozen=True)
class VaeFacts:
    component: str  # "vae"
    cls: str | None
    library: str | None
    supported: bool | None  # the installed cache-dit registers a VAE-P planner for it
    supported_by: str | None
    evidence: tuple[Evidence, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Analysis:
    schema_version: str
    tool_version: str
    gate: GateReport
    transformer: TransformerFacts
    pipeline: PipelineFacts
    already_supported: dict[str, Any] = field(default_factory=dict)
    files_read: tuple[str, ...] = ()


_RENAMES = {"cls": "class"}


def to_json(record: Any) -> Any:
    """Plain JSON data for a record tree (dataclasses, tuples, dicts)."""
    if is_dataclass(record):
        return {_RENAMES.get(f.name, f.name): to_json(getattr(record, f.name)) for f in fields(record)}
    if isinstance(record, (list, tuple)):
        return [to_json(x) for x in record]
    if isinstance(record, dict):
        return {k: to_json(v) for k, v in record.items()}
    return record


__all__ = [name for name in dir() if not name.startswith("_")] + ["asdict"]
