"""The rule examples' harness: one example of a rule through the same analysis a model gets.

It lives beside the analysis, not in the rules package, because it runs the analysis (which runs the rules):
the rules package imports nothing that imports it back. tests/test_rules.py turns every example of every
registered rule into a test with `check_example`.
"""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path

import libcst as cst

from integrate.resolve import Workspace
from integrate.source import find_method

from .analysis import analyze_transformer
from .blocks import find_module_lists
from .cfg import analyze_pipeline
from .forward import signature
from .loops import find_list_uses
from .records import Finding
from .rules import Example, ListContext, PipelineContext, Rule


def check_example(rule: type[Rule], example: Example) -> list[Finding]:
    """The findings `rule` reports on `example` (written to a scratch module and analysed statically). A
    block-list rule's example must hold a chain of blocks (ValueError otherwise: the example is broken)."""
    with tempfile.TemporaryDirectory(prefix="integrate-rule-") as tmp:
        path = Path(tmp) / "example.py"
        path.write_text(textwrap.dedent(example.code).lstrip())
        ws = Workspace()
        src = ws.load(path)
        if rule.scope == "pipeline":
            name = example.cls or next((n for n, c in src.classes.items() if _defines(c, "__call__")), None)
            entry = "__call__" if name is not None else next(iter(src.functions))
            facts = analyze_pipeline(ws, src, name, entry)
            return list(rule().report(PipelineContext(ws, src, entry, facts)))
        name = example.cls or next(n for n, c in src.classes.items() if "ModuleList" in src.code(c))
        cls = src.classes[name]
        if rule.scope == "list":  # every list, chained or not (a list that is no chain reports it as a note)
            lists = find_module_lists(ws, src, cls)
            uses = find_list_uses(src, cls, [d.attr for d in lists])
            forward = find_method(cls, "forward")
            optional = frozenset(p.name for p in signature(src, forward) if p.default == "None") if forward else frozenset()
            return [f for d in lists
                    for f in rule().report(ListContext(ws, src, d.attr, d, uses[d.attr], optional_inputs=optional))]
        facts = analyze_transformer(ws, src, cls)
        if not any(bl.is_blocks for bl in facts.block_lists):  # else a silent rule would prove nothing
            raise ValueError(f"{rule.code} example: no chain of blocks found in `{name}`")
        return [f for f in facts.findings if f.rule == rule.code]


def _defines(cls: cst.ClassDef, method: str) -> bool:
    return any(isinstance(s, cst.FunctionDef) and s.name.value == method for s in cls.body.body)
