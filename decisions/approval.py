"""Recording a reviewer's approval of a plan, and refusing plans nobody approved.

`integrate approve PLAN_DIR --reviewer NAME` writes APPROVAL.json next to plan.json: who, when, and
the SHA-256 of plan.json's bytes. Editing plan.json afterwards changes the hash, so the plan is
unapproved again; `require_approved` is what every later command calls first.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

from integrate.errors import InputError
from integrate.records import RecordError, from_json, to_json

from .records import PLAN_SCHEMA, Approval, ApprovalStatus, Plan

PLAN_FILE = "plan.json"
APPROVAL_FILE = "APPROVAL.json"


def plan_hash(plan_dir: Path) -> str:
    path = plan_dir / PLAN_FILE
    if not path.is_file():
        raise InputError(f"{plan_dir} holds no {PLAN_FILE}: write one with `integrate plan <model> --out {plan_dir}`")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_plan(plan_dir: Path) -> Plan:
    """plan.json as a `Plan`, every value checked against its type (a wrong one is an InputError: exit 2)."""
    plan_hash(plan_dir)  # a clear message when plan.json is missing
    path = plan_dir / PLAN_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA:
        raise InputError(f"{path} is not an integrate plan")
    try:
        return from_json(Plan, data)
    except RecordError as exc:
        raise InputError(f"{path}: {exc}") from None


def approve(plan_dir: Path, reviewer: str) -> Approval:
    reviewer = reviewer.strip()
    if not reviewer:
        raise InputError("--reviewer must name a person")
    load_plan(plan_dir)
    record = Approval(reviewer, datetime.now(timezone.utc).isoformat(timespec="seconds"), plan_hash(plan_dir))
    tmp = plan_dir / (APPROVAL_FILE + ".tmp")
    tmp.write_text(json.dumps(to_json(record), indent=2) + "\n")
    tmp.replace(plan_dir / APPROVAL_FILE)
    return record


def approval_status(plan_dir: Path) -> ApprovalStatus:
    current = plan_hash(plan_dir)
    path = plan_dir / APPROVAL_FILE
    if not path.is_file():
        return ApprovalStatus(approved=False, why="no approval recorded", plan_sha256=current)
    try:
        record = from_json(Approval, json.loads(path.read_text()))
    except (OSError, ValueError):
        return ApprovalStatus(approved=False, why=f"{APPROVAL_FILE} is unreadable", plan_sha256=current)
    except InputError:
        return ApprovalStatus(approved=False, why=f"{APPROVAL_FILE} is not an approval record", plan_sha256=current)
    if record.plan_sha256 != current:
        return ApprovalStatus(reviewer=record.reviewer, approved_at=record.approved_at, plan_sha256=record.plan_sha256,
                              approved=False, why="plan.json changed after it was approved", plan_sha256_now=current)
    return ApprovalStatus(reviewer=record.reviewer, approved_at=record.approved_at, plan_sha256=record.plan_sha256,
                          approved=True, why=f"approved by {record.reviewer}")


def require_approved(plan_dir: Path) -> tuple[Plan, Approval]:
    """The plan and its approval, if a reviewer approved exactly this plan.json; otherwise an InputError
    (exit 2)."""
    status = approval_status(plan_dir)
    if not status.approved:
        raise InputError(f"plan in {plan_dir} is not approved ({status.why}): "
                         f"run `integrate approve {plan_dir} --reviewer <name>` after reviewing PLAN.md")
    return load_plan(plan_dir), Approval(status.reviewer, status.approved_at, status.plan_sha256)
