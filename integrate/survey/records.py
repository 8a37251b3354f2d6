"""One survey row per transformer class, and the survey report (`integrate survey --json`)."""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass

from integrate.analyzers.records import SupportNote
from integrate.records import OMIT, Confidence, Omit
from integrate.verify.proofs import REPORTED

SURVEY_SCHEMA = "integrate.survey"
SURVEY_SCHEMA_VERSION = "1.4"
SUPPORT_LABEL = "cache-dit: registered in the installed cache-dit's adapter registry (read statically; a label, " \
                "not analysis)"


@dataclass(frozen=True)
class PipelineRef:
    cls: str
    file: str
    line: int


@dataclass(frozen=True)
class RowList:
    attr: str
    block_class: str | None
    forward_pattern: str | None
    confidence: Confidence
    check_forward_pattern: bool | None


@dataclass(frozen=True)
class RowCp:
    approach: str
    shape: str | None
    confidence: Confidence


@dataclass(frozen=True)
class RowTp:
    strategy: str
    confidence: Confidence


# A row's verify summary: its status and why, each proof's status (one key per proof in the verify registry, in
# its order), then the fixture, where its inputs came from, each failed proof's first divergent module, the time.
RowVerify = make_dataclass("RowVerify", [
    ("status", str),  # "pass" | "fail" | "error" | "skipped"
    ("why", str | Omit, field(default=OMIT)),
    *((name, str | Omit, field(default=OMIT)) for name in REPORTED),
    ("fixture", str | Omit, field(default=OMIT)),
    ("fixture_source", str | Omit, field(default=OMIT)),  # where the fixture's inputs came from (fixture.source)
    ("first_divergence", dict[str, str | None] | Omit, field(default=OMIT)),  # proof -> module
    ("seconds", float | Omit, field(default=OMIT)),
], frozen=True, namespace={"__module__": __name__})


@dataclass(frozen=True)
class SurveyRow:
    transformer_class: str | None  # None only when the file itself could not be read
    file: str
    line: int | None
    status: str = "ok"  # "ok" | "error"
    error: str | None = None
    pipelines: tuple[PipelineRef, ...] = ()
    analysed_pipeline: str | None = None
    already_supported: SupportNote | None = None
    block_lists: tuple[RowList, ...] = ()
    not_blocks: tuple[str, ...] = ()
    has_separate_cfg: bool | None = None
    cfg_confidence: Confidence | None = None
    needs_patch_functor: bool | None = None
    patch_functor_reasons: tuple[str, ...] = ()
    cp: RowCp | None = None
    tp: RowTp | None = None
    unknowns: tuple[str, ...] = ()
    verify: RowVerify | Omit = OMIT


@dataclass(frozen=True)
class Skipped:
    file: str
    why: str


@dataclass(frozen=True)
class Package:
    version: str | None
    path: str | Omit = OMIT
    label: str | Omit = OMIT


@dataclass(frozen=True)
class SurveyReport:
    schema: str
    schema_version: str
    tool_version: str
    diffusers: Package
    cache_dit: Package
    paths: tuple[str, ...]
    rows: tuple[SurveyRow, ...]
    skipped: tuple[Skipped, ...]
    files_read: tuple[str, ...]
    pipeline_files_indexed: tuple[str, ...]


# -- integrate audit -----------------------------------------------------------------------------------------

AUDIT_SCHEMA = "integrate.audit"
AUDIT_SCHEMA_VERSION = "1.2"

# one proof's label (1.2: per proof, each meaning one thing); a row's status is its most telling proof's label
PROOF_LABELS = ("finding", "ours-fails", "both-fail", "cache-dit-lacks", "unproved", "agree", "no-fixture")


@dataclass(frozen=True)
class AuditProof:
    """One proof, run on cache-dit's own integration and on ours (same fixture, same plain model)."""

    name: str
    cache_dit: str  # "pass" | "fail" | "error" | "skipped" | "vacuous" | "needs-code"
    ours: str
    status: str = "unproved"  # one of PROOF_LABELS (1.2)
    label_why: str | Omit = OMIT  # why this label, where the two statuses alone do not say it (1.2)
    cache_dit_registers: str | None | Omit = OMIT  # cache-dit's planner that answered ("key -> file:line"), or
    #                                                None: its registry has none for the class (1.2; CP and TP)
    cache_dit_why: str | Omit = OMIT
    ours_why: str | Omit = OMIT
    cache_dit_first_divergence: str | None | Omit = OMIT  # the module, when a proof failed there
    ours_first_divergence: str | None | Omit = OMIT


@dataclass(frozen=True)
class AuditRow:
    transformer_class: str
    pipeline: str | None
    adapter: str | None  # cache-dit's registration ("file:line") that answers for the class
    status: str  # the most telling of its proofs' labels (PROOF_LABELS, in that order), or "error"
    proofs: tuple[AuditProof, ...] = ()
    fixture: str | Omit = OMIT
    why: str | Omit = OMIT
    reproduce: str | Omit = OMIT  # shell lines that show a finding from scratch
    our_patterns: dict[str, str] = field(default_factory=dict)  # cached list -> the ForwardPattern we decided
    evidence: tuple[str, ...] = ()  # "file:line: why" behind our patterns (the blocks' returns)
    seconds: float | Omit = OMIT
    cached: bool = False


@dataclass(frozen=True)
class AuditReport:
    schema: str
    schema_version: str
    tool_version: str
    cache_dit: Package
    diffusers: Package
    proofs: tuple[str, ...]
    rows: tuple[AuditRow, ...]
    findings: int  # rows with a finding (exit 1)
    labels: dict[str, dict[str, int]] = field(default_factory=dict)  # proof -> label -> how many rows (1.2)
    # proof -> {"compared": rows where both sides ran the proof to a verdict, "cache_dit": passes among
    # them, "ours": passes among them}: the side-by-side figure over the same proofs (1.2)
    compared: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.findings > 0


FIX_SCHEMA = "integrate.audit-fix"
FIX_SCHEMA_VERSION = "1.0"


@dataclass(frozen=True)
class TestRun:
    """The regression test run against one cache-dit tree."""

    proof: str  # the finding's proof: "cache" | "tp"
    tree: str  # "before": the checkout as it was; "after": a copy with the fix written in
    status: str  # "pass" | "fail"
    tail: str = ""  # the end of pytest's output


@dataclass(frozen=True)
class FixReport:
    """`integrate audit --only X --fix`: our integration written over cache-dit's where the audit found it wrong."""

    schema: str
    schema_version: str
    tool_version: str
    transformer_class: str
    # "fixed": every finding's regression test fails before and passes after, all written; "partly-fixed": some were
    # (written), the rest are under `manual`; "not-fixed": none (nothing written); "nothing-to-fix"
    status: str
    audit: AuditRow
    package: str  # the checkout's cache_dit directory
    rewritten: tuple[dict, ...] = ()  # {"file", "function", "key", "line", "changed"} per built-in rewritten
    tests: tuple[str, ...] = ()  # the regression tests written, in cache-dit's tests/ layout, under --out
    runs: tuple[TestRun, ...] = ()  # each finding's test, before and after
    files: tuple[str, ...] = ()  # written under --out
    changed: tuple[str, ...] = ()  # files of the checkout written (relative to its cache_dit directory)
    diff: str = ""
    manual: tuple[str, ...] = ()  # findings no fix was written for, and why
    why: str | Omit = OMIT

    @property
    def failed(self) -> bool:
        return self.status == "not-fixed"
