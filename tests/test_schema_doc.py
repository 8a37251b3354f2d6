"""docs/schema.md documents every key the records put in JSON, and the versions they carry.

Each `--json` output comes from one record (`to_json`); every field of every record reachable from it
must be named in the output's section of docs/schema.md or in its shared "Records" section.
"""

from __future__ import annotations

import re
from dataclasses import fields

import pytest
from conftest import ROOT
from integrate.analyzers.records import ANALYSIS_SCHEMA_VERSION, Analysis
from integrate.decisions.records import PLAN_SCHEMA_VERSION, Approval, ApprovalStatus, Plan, Revision
from integrate.gate.records import GATE_SCHEMA_VERSION, GateReport
from integrate.templates.records import GENERATE_SCHEMA_VERSION, GenerateReport
from integrate.verify.proofs import BY_NAME
from integrate.verify.records import GPU_SCHEMA_VERSION, VERIFY_SCHEMA_VERSION, GpuReport, MetricsReport
from integrate.verify.report import VerifyReport

from integrate.missing import ERROR_SCHEMA_VERSION, MissingDependencyError
from integrate.records import json_name, record_types
from integrate.repair import REPAIR_SCHEMA_VERSION, RepairReport
from integrate.survey.records import AUDIT_SCHEMA_VERSION, SURVEY_SCHEMA_VERSION, AuditReport, RowVerify, SurveyReport

DOC = (ROOT / "docs" / "schema.md").read_text()
OUTPUTS = [  # (section heading starts with, root record, version it documents)
    ("## `integrate gate --json`", GateReport, GATE_SCHEMA_VERSION),
    ("## `integrate analyze --json`", Analysis, ANALYSIS_SCHEMA_VERSION),
    ("## `integrate plan --json`", Plan, PLAN_SCHEMA_VERSION),
    ("## `integrate generate --json`", GenerateReport, GENERATE_SCHEMA_VERSION),
    ("## `integrate verify --json`", VerifyReport, VERIFY_SCHEMA_VERSION),
    ("## `integrate verify --json`", GpuReport, GPU_SCHEMA_VERSION),
    ("## `integrate metrics --json`", MetricsReport, "1.0"),
    ("## `integrate survey --json`", SurveyReport, SURVEY_SCHEMA_VERSION),
    ("## `integrate audit --json`", AuditReport, AUDIT_SCHEMA_VERSION),
    ("## `integrate revise --json`", Revision, "1.0"),
    ("## `integrate repair --json`", RepairReport, REPAIR_SCHEMA_VERSION),
    ("## `integrate approve --json`", ApprovalStatus, "1.0"),
    ("## `integrate approve --json`", Approval, "1.0"),  # APPROVAL.json
    ("## Errors", MissingDependencyError, ERROR_SCHEMA_VERSION),
]


def _section(heading: str) -> str:
    start = DOC.index(heading)
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end if end != -1 else len(DOC)]


SHARED = _section("## Records")


def _documented_by_its_proof(record: type, key: str) -> bool:
    """A proof's key in the verify report (and a survey row's verify summary) is the registry's: its module's
    docstring documents it (docs/schema.md says so)."""
    return record in (VerifyReport, RowVerify) and key in BY_NAME and bool((BY_NAME[key].__doc__ or "").strip())


@pytest.mark.parametrize("heading,root,version", OUTPUTS, ids=[r.__name__ for _, r, _ in OUTPUTS])
def test_every_json_key_is_documented(heading, root, version):
    text = _section(heading) + SHARED
    missing = []
    for record in record_types(root):
        for f in fields(record):
            if f.metadata.get("json", True) and not re.search(rf"\b{re.escape(json_name(f))}\b", text) \
                    and not _documented_by_its_proof(record, json_name(f)):
                missing.append(f"{record.__name__}.{json_name(f)}")
    assert not missing, f"docs/schema.md ({heading}) does not name: {', '.join(missing)}"


@pytest.mark.parametrize("heading,root,version", OUTPUTS, ids=[r.__name__ for _, r, _ in OUTPUTS])
def test_the_documented_version_is_the_records_version(heading, root, version):
    assert f'"{version}"' in _section(heading), f"{heading} should document schema_version \"{version}\""
