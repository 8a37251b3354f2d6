"""Every `path: symbol` the skill and the references cite as an enforcer exists in the tree.

The references map each rule of cache-dit's skill to the code that enforces it; a citation that no
longer resolves (a file moved, a function renamed) would send a reader to nothing. Read with libcst.
"""

from __future__ import annotations

import re

import libcst as cst
import pytest
from conftest import ROOT

DOCS = sorted([*(ROOT / "references").glob("*.md"), ROOT / "skill" / "SKILL.md", ROOT / "README.md",
               ROOT / "docs" / "walkthrough-motif-video.md"])
OURS = "integrate|gate|analyzers|decisions|templates|verify|tests|bench|docs|skill|references|examples"
CITATION = re.compile(rf"`((?:{OURS})/(?:[a-z_]+/)*[a-zA-Z_.]+\.(?:py|j2|sh|md))(?::\s*([A-Za-z_][\w.]*))?`")


def _citations():
    for doc in DOCS:
        for m in CITATION.finditer(doc.read_text()):
            yield doc.relative_to(ROOT).as_posix(), m.group(1), m.group(2) or ""


def _defined(path, name: str) -> bool:
    module = cst.parse_module(path.read_text())
    head, _, rest = name.partition(".")
    for stmt in module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and stmt.name.value == head:
            if not rest:
                return True
            return isinstance(stmt, cst.ClassDef) and any(
                isinstance(s, cst.FunctionDef) and s.name.value == rest for s in stmt.body.body)
        if isinstance(stmt, cst.SimpleStatementLine) and not rest:
            for small in stmt.body:
                targets = small.targets if isinstance(small, cst.Assign) else [small] if isinstance(
                    small, cst.AnnAssign) else []
                if any(isinstance(t.target, cst.Name) and t.target.value == head for t in targets):
                    return True
    return False


CASES = sorted(set(_citations()))


@pytest.mark.parametrize("doc,path,symbol", CASES, ids=[f"{d}:{p}:{s}" for d, p, s in CASES])
def test_citation_resolves(doc, path, symbol):
    target = ROOT / path
    assert target.is_file(), f"{doc} cites {path}, which does not exist"
    if symbol and target.suffix == ".py":
        assert _defined(target, symbol), f"{doc} cites {path}: {symbol}, which {path} does not define"


def test_the_docs_cite_something():
    assert len(CASES) > 100
