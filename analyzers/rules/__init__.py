"""Detectors as rules: one file per detector, each with examples that must fire and examples that must not.

A rule is a small class registered with `@register`: its `code`, the `scope` it runs in ("block_list":
once per chain of blocks the analysis found; "list": once per list whose block class resolved, chained
or not; "pipeline": once per denoising entry), an `order` (the position of its findings in the report),
`check(ctx)`, which yields `Finding`s, and `fix(ctx, finding)`, which says what to change: a frozen record
of analyzers/fixes.py that the PatchFunctor's rewrite applies, or `Manual(why)` where no rewrite answers it
(`run` attaches each finding's fix to it). The facts a rule reads come from its context (`ctx.verdict`,
`ctx.extra_ops`, ...), computed by the readers in `integrate.analyzers` and shared by every rule, the way
Fixit rules read libcst metadata providers.

Every rule carries `VALID` examples (sources it must stay silent on), `INVALID` examples (sources it must
fire on) and, where the honest answer can be "cannot tell", `UNKNOWN` examples (it must report a finding
of confidence "unknown"). An INVALID example carries `fixed`, the code as the rule's fix writes it, or,
where no rewrite answers it, the `line` its finding points at. The harness that runs an example through
the same analysis a model gets is `integrate.analyzers.examples.check_example` (outside this package: it
runs the analysis, which runs the rules); tests/rule_fixes.py applies a fix through the real rewrite;
tests/test_rules.py turns every example of every registered rule into a test.

Adding a detector is adding one file to this folder: the package imports every module in it.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import ClassVar, Literal

from integrate.records import Evidence
from integrate.resolve import Workspace
from integrate.source import SourceFile

from ..blocks import ListDef
from ..fixes import Fix, Manual
from ..loops import ListUse, Loop, classify_body
from ..patterns import PatternVerdict
from ..records import ExtraOp, Finding, ForwardSummary, PipelineFacts

Scope = Literal["list", "block_list", "pipeline"]


@dataclass(frozen=True)
class Example:
    """A small module for a rule to read. `cls` names the class to analyse (the transformer, or the
    pipeline for pipeline rules; default: the first class that builds a ModuleList, or defines `__call__`).
    For an INVALID example: `expect` is a phrase the finding's message must contain; `fixed` is what the rule's
    fix makes of the code (the patched forward, then any patched block forward, as generate writes them); where
    no rewrite answers the example, `line` is the line of the code the finding must point at."""

    code: str
    cls: str | None = None
    expect: str | None = None
    fixed: str | None = None
    line: int | None = None


@dataclass
class ListContext:
    """One block list of the transformer, with the facts the readers established about it."""

    ws: Workspace
    src: SourceFile  # the transformer's source
    attr: str
    definition: ListDef  # how `__init__` builds it
    use: ListUse  # every walk over it in the transformer's methods, and every other read
    loop: Loop | None = None  # the walk whose block call the analysis read (chains only)
    forward: ForwardSummary | None = None  # the block's forward
    verdict: PatternVerdict | None = None  # the ForwardPattern decision, with the wrapper bindings
    mutations: tuple[tuple[str, Evidence], ...] = ()  # (input, where) the block's forward writes in place
    optional_inputs: frozenset[str] = frozenset()  # transformer forward inputs that default to None

    @cached_property
    def extra_ops(self) -> tuple[ExtraOp, ...]:
        """Every statement of the walk's body besides the block call (classified by the loop reader)."""
        if self.loop is None:
            return ()
        return classify_body(self.src, self.loop, set(self.optional_inputs), self.use.defaults)

    @property
    def streams(self) -> set[str]:
        """The block parameters that carry the streams (hidden, encoder)."""
        return set(self.verdict.roles.values()) if self.verdict is not None else set()


@dataclass
class PipelineContext:
    """The denoising entry (a pipeline method or a function) and the CFG reader's verdict on it."""

    ws: Workspace
    src: SourceFile
    entry: str
    facts: PipelineFacts


class Rule:
    code: ClassVar[str]
    scope: ClassVar[Scope]
    order: ClassVar[int]  # findings of a list are reported in this order
    summary: ClassVar[str]
    VALID: ClassVar[tuple[Example, ...]] = ()
    INVALID: ClassVar[tuple[Example, ...]] = ()
    UNKNOWN: ClassVar[tuple[Example, ...]] = ()

    def check(self, ctx) -> Iterator[Finding]:
        raise NotImplementedError

    def fix(self, ctx, finding: Finding) -> Fix:
        """What to change for `finding`, as a record of analyzers/fixes.py; a rule with no rewrite says why."""
        return Manual(f"no rewrite is written for `{self.code}`")

    def report(self, ctx) -> Iterator[Finding]:
        """The findings of `check`, each carrying the rule's fix."""
        for found in self.check(ctx):
            yield dataclasses.replace(found, fix=self.fix(ctx, found))

    def finding(self, ctx, message: str, *, patch: bool = True, line: int = 0, kind: str = "",
                evidence: tuple[Evidence, ...] = (), confidence: str = "high") -> Finding:
        attr = getattr(ctx, "attr", "")
        return Finding(self.code, attr, message, patch, line, kind, evidence, confidence)


RULES: list[type[Rule]] = []


def register(rule: type[Rule]) -> type[Rule]:
    """Class decorator: add a rule to the registry (kept sorted by scope, then order)."""
    if any(r.code == rule.code for r in RULES):
        raise ValueError(f"rule {rule.code!r} is registered twice")
    RULES.append(rule)
    RULES.sort(key=lambda r: (r.scope, r.order, r.code))
    return rule


def rules(scope: Scope) -> list[Rule]:
    return [r() for r in RULES if r.scope == scope]


def run(scope: Scope, ctx) -> list[Finding]:
    """Every finding of the registered rules of `scope`, in their order."""
    return [f for rule in rules(scope) for f in rule.report(ctx)]


def _load_all() -> None:
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{__name__}.{info.name}")


_load_all()

__all__ = ["RULES", "Example", "ListContext", "PipelineContext", "Rule", "register", "rules", "run"]
