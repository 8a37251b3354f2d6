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

PLAN_FILE = "plan.json"
APPROVAL_FILE = "APPROVAL.json"


def plan_hash(plan_dir: Path) -> str:
    path = plan_dir / PLAN_FILE
    if not path.is_file():
        raise InputError(f"{plan_dir} holds no {PLAN_FILE}: write one with `integrate plan <model> --out {plan_dir}`")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_plan(plan_dir: Path) -> dict:
    plan_hash(plan_dir)  # a clear message when plan.json is missing
    try:
        data = json.loads((plan_dir / PLAN_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {plan_dir / PLAN_FILE}: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != "integrate.plan":
        raise InputError(f"{plan_dir / PLAN_FILE} is not an integrate plan")
    return data


def approve(plan_dir: Path, reviewer: str) -> dict:
    reviewer = reviewer.strip()
    if not reviewer:
        raise InputError("--reviewer must name a person")
    load_plan(plan_dir)
    record = {
        "reviewer": reviewer,
        "approved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "plan_sha256": plan_hash(plan_dir),
    }
    tmp = plan_dir / (APPROVAL_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(plan_dir / APPROVAL_FILE)
    return record


def approval_status(plan_dir: Path) -> dict:
    """{"approved": bool, "why": str, ...the approval record}."""
    current = plan_hash(plan_dir)
    path = plan_dir / APPROVAL_FILE
    if not path.is_file():
        return {"approved": False, "why": "no approval recorded", "plan_sha256": current}
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"approved": False, "why": f"{APPROVAL_FILE} is unreadable", "plan_sha256": current}
    if record.get("plan_sha256") != current:
        return {**record, "approved": False, "why": "plan.json changed after it was approved",
                "plan_sha256_now": current}
    return {**record, "approved": True, "why": f"approved by {record.get('reviewer')}"}


def require_approved(plan_dir: Path) -> dict:
    """The plan, if a reviewer approved exactly this plan.json; otherwise an InputError (exit 2)."""
    status = approval_status(plan_dir)
    if not status["approved"]:
        raise InputError(f"plan in {plan_dir} is not approved ({status['why']}): "
                         f"run `integrate approve {plan_dir} --reviewer <name>` after reviewing PLAN.md")
    return load_plan(plan_dir)
