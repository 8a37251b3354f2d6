"""Recording a reviewer's approval of a plan, and refusing what nobody approved.

`integrate approve PLAN_DIR --reviewer NAME` writes APPROVAL.json next to plan.json. It binds everything
a later command reads: the SHA-256 of plan.json's bytes and of PLAN.md's (what the reviewer read), the SHA-256 of
every file the plan was made from (`Plan.reads`: each source the analysis parsed, the model folder's
`model_index.json` and component configs, the --config file; and every source the plan cites), the reviewer
and the tool version, all signed with HMAC-SHA256 under a key of this user's
(`~/.config/integrate/approval.key`, or the file `$INTEGRATE_APPROVAL_KEY` names; made on first use,
readable by its owner only). Editing any of them voids the approval; so does rewriting APPROVAL.json
without the key. (Whoever can read the key can still sign: it keeps an edit from passing unnoticed, it is
not a defence against the key's owner.)

`require_approved` is what every later command calls first (and `approve --check`): it reads plan.json once,
checks the bytes it read, checks every bound file again, and parses those same bytes; the source hashes it returns
are checked once more as `generate` and `verify` parse each file (`Workspace(expect=...)`, which refuses a source
the approval does not bind). Symlinks in place of plan.json, PLAN.md or APPROVAL.json are refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from datetime import datetime, timezone
from pathlib import Path

from integrate import __version__
from integrate.errors import InputError
from integrate.inputs import changed
from integrate.records import RecordError, from_json, to_json

from .records import PLAN_SCHEMA, Approval, ApprovalStatus, Plan

PLAN_FILE = "plan.json"
PLAN_MD = "PLAN.md"
APPROVAL_FILE = "APPROVAL.json"
MAX_PLAN_BYTES = 16 * 1024 * 1024


def _read(plan_dir: Path, name: str, *, required: bool = True) -> bytes | None:
    """A file's bytes, refusing a symlink (the approval binds this folder's files, not another's)."""
    path = plan_dir / name
    try:
        info = path.lstat()
    except FileNotFoundError:
        if required:
            hint = f": write one with `integrate plan <model> --out {plan_dir}`" if name != APPROVAL_FILE else ""
            raise InputError(f"{plan_dir} holds no {name}{hint}") from None
        return None
    if stat.S_ISLNK(info.st_mode):
        raise InputError(f"{path} is a symbolic link: an approval binds the plan folder's own files")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{path} is not a regular file")
    if info.st_size > MAX_PLAN_BYTES:
        raise InputError(f"{path}: {info.st_size} bytes is too large for a plan")
    return path.read_bytes()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _parse(data: bytes, path: Path) -> Plan:
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"cannot read {path}: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(raw, dict) or raw.get("schema") != PLAN_SCHEMA:
        raise InputError(f"{path} is not an integrate plan")
    try:
        return from_json(Plan, raw)
    except RecordError as exc:
        raise InputError(f"{path}: {exc}") from None


def load_plan(plan_dir: Path) -> Plan:
    """plan.json as a `Plan`, every value checked against its type (a wrong one is an InputError: exit 2)."""
    return _parse(_read(plan_dir, PLAN_FILE), plan_dir / PLAN_FILE)


def cited_sources(plan: Plan) -> list[str]:
    """Every source file the plan cites that exists: the model's files and each evidence's file."""
    found: dict[str, None] = {}

    def walk(value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key in ("file", "pipeline_file", "transformer_file") and isinstance(item, str) and item:
                    found.setdefault(item)
                else:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(to_json(plan))
    return [p for p in found if p.endswith(".py") and Path(p).is_file()]


def _hash_sources(paths: list[str]) -> dict[str, str]:
    out = {}
    for p in paths:
        try:
            out[p] = _sha(Path(p).read_bytes())
        except OSError as exc:
            raise InputError(f"cannot read {p}, which the plan cites: {exc.strerror}") from None
    return out


# -- the signing key ----------------------------------------------------------------------------------


def _key_path() -> Path:
    named = os.environ.get("INTEGRATE_APPROVAL_KEY")
    if named:
        return Path(named)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "integrate" / "approval.key"


def _key(create: bool) -> bytes | None:
    path = _key_path()
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        if not create:
            return None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the approval key {path}: {exc}") from None
    # written whole under a private name, then linked into place: a process reading the key never sees it
    # half-written, and of two processes making it at once the first link wins and both use that key
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
        os.link(tmp, path)
    except FileExistsError:  # another approval made it meanwhile: use that one
        pass
    except OSError as exc:
        raise InputError(f"cannot create the approval key {path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return bytes.fromhex(path.read_text().strip())


def _signature(record: Approval, key: bytes) -> str:
    body = json.dumps({k: v for k, v in to_json(record).items() if k != "signature"}, sort_keys=True)
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


# -- approving and checking ---------------------------------------------------------------------------


def check_reviewer(reviewer: str) -> str:
    """The reviewer's name, stripped; an InputError when it is not one line of printable text."""
    reviewer = reviewer.strip()
    if not reviewer:
        raise InputError("--reviewer must name a person")
    if any(not ch.isprintable() for ch in reviewer) or len(reviewer) > 200:
        raise InputError("--reviewer must be one line of printable text (at most 200 characters)")
    return reviewer


def bound_files(plan: Plan) -> dict[str, str]:
    """What an approval of `plan` binds: every file the plan was made from, with the SHA-256 it had then, and every
    source the plan cites; an InputError when one of them has changed since (the plan is not of these files)."""
    stale = changed(plan.reads)
    if stale is not None:
        raise InputError(f"{stale} changed after the plan was made: make the plan again (integrate plan) and review "
                         "that")
    return {**plan.reads, **_hash_sources([p for p in cited_sources(plan) if p not in plan.reads])}


def approve(plan_dir: Path, reviewer: str) -> Approval:
    reviewer = check_reviewer(reviewer)
    data = _read(plan_dir, PLAN_FILE)
    plan = _parse(data, plan_dir / PLAN_FILE)
    md = _read(plan_dir, PLAN_MD)
    record = Approval(reviewer, datetime.now(timezone.utc).isoformat(timespec="seconds"), _sha(data), _sha(md),
                      bound_files(plan), __version__)
    record = Approval(**{**record.__dict__, "signature": _signature(record, _key(create=True))})
    tmp = plan_dir / (APPROVAL_FILE + ".tmp")
    tmp.write_text(json.dumps(to_json(record), indent=2) + "\n")
    tmp.replace(plan_dir / APPROVAL_FILE)
    return record


def _status(plan_dir: Path) -> tuple[ApprovalStatus, bytes, Approval | None]:
    """(status, the plan.json bytes read, the approval record when it holds)."""
    data = _read(plan_dir, PLAN_FILE)
    current = _sha(data)
    raw = _read(plan_dir, APPROVAL_FILE, required=False)
    if raw is None:
        return ApprovalStatus(approved=False, why="no approval recorded", plan_sha256=current), data, None
    try:
        record = from_json(Approval, json.loads(raw))
    except (ValueError, RecursionError, InputError):
        return ApprovalStatus(approved=False, why=f"{APPROVAL_FILE} is not an approval record",
                              plan_sha256=current), data, None
    seen = dict(reviewer=record.reviewer, approved_at=record.approved_at, plan_sha256=record.plan_sha256)
    key = _key(create=False)
    if key is None or not hmac.compare_digest(record.signature, _signature(record, key)):
        return ApprovalStatus(**seen, approved=False, why=f"{APPROVAL_FILE} is not signed with this user's approval "
                              f"key ({_key_path()})"), data, None
    if record.plan_sha256 != current:
        return ApprovalStatus(**seen, approved=False, why="plan.json changed after it was approved",
                              plan_sha256_now=current), data, None
    md = _read(plan_dir, PLAN_MD, required=False)
    if md is None or _sha(md) != record.plan_md_sha256:
        return ApprovalStatus(**seen, approved=False, why="PLAN.md changed after it was approved"), data, None
    stale = changed(record.sources)
    if stale is not None:
        return ApprovalStatus(**seen, approved=False, why=f"{stale}, which the plan was made from, changed after it "
                              "was approved"), data, None
    return ApprovalStatus(**seen, approved=True, why=f"approved by {record.reviewer}"), data, record


def approval_status(plan_dir: Path) -> ApprovalStatus:
    return _status(plan_dir)[0]


def require_approved(plan_dir: Path) -> tuple[Plan, Approval]:
    """The plan and its approval, if a reviewer approved exactly these bytes; otherwise an InputError (exit 2).
    The plan is parsed from the very bytes whose hash was checked."""
    status, data, record = _status(plan_dir)
    if not status.approved:
        raise InputError(f"plan in {plan_dir} is not approved ({status.why}): "
                         f"run `integrate approve {plan_dir} --reviewer <name>` after reviewing PLAN.md")
    return _parse(data, plan_dir / PLAN_FILE), record
