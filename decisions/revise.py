"""A reviewer's revision of a plan: `KEY=VALUE` assignments, checked against the plan's types, recorded beside
what the analysis said.

A key is the dotted path of a value in plan.json: `cache.has_separate_cfg`, `facts.attention.0.head_dim`,
`parallelism.tp.block_lists.0.layer_plan.attn.to_q`. Each step must name a field of the record it is in, an
index of a list that has it, or a key of a mapping (a new key may be added to a mapping, never to a record).
A value is read as JSON (`false`, `64`, `"colwise"`, `{"split_dim": 1, ...}`); text that is not JSON is the
string it spells. The revised plan is decoded as a whole, so a value of the wrong type is refused with the
path of the fault, and nothing is written.

Every override is kept in the plan (`Plan.overrides`): the key, the analysis's value, the reviewer's value,
who set it, why and when. Setting a key again keeps the analysis's value; setting it back to that value drops
the override. The phase checklist is made again from the revised plan. Rendering and writing the files, and
voiding the approval, are the caller's (`integrate.api.revise`).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from datetime import datetime, timezone
from typing import Any

from integrate.errors import InputError
from integrate.records import RecordError, from_json, to_json

from .phases import phases
from .records import Override, Plan

# what the reviewer may not change: what the plan is for and which tool wrote it (a new plan is `integrate plan`)
_FIXED = ("schema", "schema_version", "tool_version", "model", "overrides", "phases")


def parse_assignment(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` -> (key, value); the value read as JSON, or the text itself where it is not JSON."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise InputError(f"--set {text!r}: expected KEY=VALUE (KEY a dotted path into plan.json)")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def _arms(tp: Any) -> list[Any]:
    if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType")):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def _step(tp: Any, node: Any, part: str, where: str) -> tuple[Any, Any, bool]:
    """(the type at `part`, the value there or None, whether it may be created) inside `node` of type `tp`."""
    for arm in _arms(tp):
        if dataclasses.is_dataclass(arm) and isinstance(node, dict):
            hints = typing.get_type_hints(arm)
            if part not in hints:
                fields = ", ".join(f.name for f in dataclasses.fields(arm))
                raise InputError(f"{where}: no field `{part}` (fields: {fields})")
            return hints[part], node.get(part), False
        origin = typing.get_origin(arm)
        if origin is dict and isinstance(node, dict):
            return typing.get_args(arm)[1], node.get(part), True
        if origin is tuple and isinstance(node, list):
            args = typing.get_args(arm)
            if not part.isdigit() or int(part) >= len(node):
                raise InputError(f"{where}: `{part}` is not an index of this list (it has {len(node)} items)")
            item = args[0] if len(args) == 2 and args[1] is Ellipsis else args[int(part)]
            return item, node[int(part)], False
    raise InputError(f"{where} holds {type(node).__name__ if node is not None else 'null'}: "
                     f"it has no `{part}` to set")


def _set(data: dict, key: str, value: Any) -> Any:
    """Put `value` at `key` in `data` (a plan's JSON form); returns the value that was there (None if new)."""
    parts = key.split(".")
    if parts[0] in _FIXED:
        raise InputError(f"--set {key}: `{parts[0]}` is not a decision a reviewer revises (run `integrate plan` "
                         "for a different model)")
    tp, node = Plan, data
    for i, part in enumerate(parts):
        where = ".".join(parts[:i]) or "plan.json"
        child_tp, child, creatable = _step(tp, node, part, f"--set {key}: {where}")
        if i == len(parts) - 1:
            if child is None and not creatable and not (isinstance(node, dict) and part in node) \
                    and not isinstance(node, list):
                raise InputError(f"--set {key}: {where} has no `{part}`")
            old = node[int(part)] if isinstance(node, list) else node.get(part)
            if isinstance(node, list):
                node[int(part)] = value
            else:
                node[part] = value
            return old
        if child is None:
            raise InputError(f"--set {key}: {'.'.join(parts[:i + 1])} is null: set it whole")
        tp, node = child_tp, child
    raise AssertionError("unreachable")


def revise(plan: Plan, assignments: list[tuple[str, Any]], why: str, reviewer: str) -> Plan:
    """The plan with `assignments` applied and recorded as overrides; an InputError when a key is unknown or
    a value has the wrong type (the plan is then unchanged)."""
    why, reviewer = why.strip(), reviewer.strip()
    for label, text in (("--why", why), ("--reviewer", reviewer)):
        if not text:
            raise InputError(f"{label} must not be empty: an override says who set it and why")
        if any(not ch.isprintable() for ch in text) or len(text) > 500:
            raise InputError(f"{label} must be one line of printable text (at most 500 characters)")
    if not assignments:
        raise InputError("nothing to revise: give at least one --set KEY=VALUE")
    data = to_json(plan)
    recorded = {o.key: o for o in plan.overrides}
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for key, value in assignments:
        old = _set(data, key, value)
        analysis = recorded[key].analysis if key in recorded else old
        if value == analysis:
            recorded.pop(key, None)  # back to what the analysis said: no longer an override
        else:
            recorded[key] = Override(key=key, analysis=analysis, value=value, by=reviewer, why=why, at=now)
    data["overrides"] = [to_json(o) for o in recorded.values()]
    try:
        revised = from_json(Plan, data)
    except RecordError as exc:
        raise InputError(f"the revision does not fit the plan's types: {exc}") from None
    return dataclasses.replace(revised, phases=phases(revised))


def analysis_value(plan: Plan, key: str, current: Any) -> Any:
    """What the analysis said at `key`: the override's record of it, else the plan's value as it stands."""
    for o in plan.overrides:
        if o.key == key:
            return o.analysis
    return current
