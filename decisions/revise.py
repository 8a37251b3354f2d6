"""A reviewer's revision of a plan: `KEY=VALUE` assignments, checked against the plan's types, recorded beside
what the analysis said.

A key is the dotted path of a value in plan.json, spelled as plan.json spells it: `cache.has_separate_cfg`,
`facts.attention.0.head_dim`, `parallelism.tp.block_lists.0.layer_plan["attn.to_q"]`, `text_encoders.0.class`.
Each step must name a field of the record it is in (by its JSON name), an index of a list that has it, or a key
of a mapping (a new key may be added to a mapping, never to a record).
A part that holds a dot is written as a bracketed JSON string: `parallelism.cp.plan["blocks.*"].txt`. A value
is read as JSON (`false`, `64`, `"colwise"`, `{"split_dim": 1, ...}`); text that is not JSON is the string it
spells. `UNSET` as a value (`--unset KEY`) takes an entry out of a mapping (a stream left whole, a linear
left unsharded). The revised plan is decoded as a whole, so a value of the wrong type is refused with the
path of the fault, and nothing is written.

Every override is kept in the plan (`Plan.overrides`): the key, the analysis's value, the reviewer's value,
who set it, why and when. Setting a key again keeps the analysis's value; setting it back to that value drops
the override. The phase checklist is made again from the revised plan. Rendering and writing the files, and
voiding the approval, are the caller's (`integrate.api.revise`).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from datetime import datetime, timezone
from typing import Any

from integrate.errors import InputError
from integrate.records import RecordError, from_json, json_name, to_json

from .phases import phases
from .records import Override, Plan

# what the reviewer may not change: what the plan is for, which tool wrote it and the files it was made from (an
# approval binds them): a new plan is `integrate plan`; and what is made from the rest (overrides, the checklist,
# the alternatives)
FIXED = ("schema", "schema_version", "tool_version", "model", "reads", "overrides", "phases", "alternatives")


class _Unset:
    """The value of an `--unset KEY` assignment: the key is taken out of its mapping."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


def split_key(key: str) -> list[str]:
    """`parallelism.cp.plan["blocks.*"].encoder_hidden_states` -> its parts; a bracketed part is a JSON string
    (for a part that holds a dot)."""
    parts, i = [], 0
    while i < len(key):
        if key[i] == "[":
            end = key.find("]", i)
            while end != -1:
                try:
                    part = json.loads(key[i + 1:end])
                    break
                except ValueError:
                    end = key.find("]", end + 1)
            if end == -1 or not isinstance(part, str):
                raise InputError(f"key {key!r}: a bracketed part must be a JSON string, as in [\"blocks.*\"]")
            parts.append(part)
            i = end + 1
            if i < len(key) and key[i] == ".":
                i += 1
            continue
        end = min((j for j in (key.find(".", i), key.find("[", i)) if j != -1), default=len(key))
        if end == i:
            raise InputError(f"key {key!r} has an empty part")
        parts.append(key[i:end])
        i = end + 1 if end < len(key) and key[end] == "." else end
    if not parts:
        raise InputError("an empty key")
    return parts


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
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def join_key(parts: list[str | int] | tuple[str | int, ...]) -> str:
    """The one spelling of a key: dotted, a part that holds a dot or a bracket written `["..."]`."""
    out = ""
    for p in parts:
        text = str(p)
        if any(ch in text for ch in ".[]") or not text:
            out += f"[{json.dumps(text)}]"
        else:
            out += ("." if out else "") + text
    return out


def _step(tp: Any, node: Any, part: str, where: str) -> tuple[Any, Any, bool]:
    """(the type at `part`, the value there or None, whether it may be created) inside `node` of type `tp`."""
    if tp is Any and isinstance(node, dict):  # inside free-form data (a config): any key
        return Any, node.get(part), True
    if tp is Any and isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return Any, node[int(part)], False
    arms = _arms(tp)
    for arm in arms:
        if dataclasses.is_dataclass(arm) and isinstance(node, dict):
            hints = typing.get_type_hints(arm)
            # plan.json's keys: a field's JSON name (`class` for `cls`), never one kept out of the JSON
            names = {json_name(f): f.name for f in dataclasses.fields(arm) if f.metadata.get("json", True)}
            if len(arms) > 1 and not set(node) <= set(names):
                continue  # a union (`Gather | dict[...]`): this value is not that record
            if part not in names:
                raise InputError(f"{where}: no field `{part}` (fields: {', '.join(names)})")
            return hints[names[part]], node.get(part), False
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
    parts = split_key(key)
    if parts[0] in FIXED:
        raise InputError(f"{key}: `{parts[0]}` is not a decision a reviewer revises (run `integrate plan` "
                         "for a different model)")
    tp, node = Plan, data
    for i, part in enumerate(parts):
        where = ".".join(parts[:i]) or "plan.json"
        child_tp, child, creatable = _step(tp, node, part, f"{key}: {where}")
        if i == len(parts) - 1:
            if child is None and not creatable and not (isinstance(node, dict) and part in node) \
                    and not isinstance(node, list):
                raise InputError(f"{key}: {where} has no `{part}`")
            old = node[int(part)] if isinstance(node, list) else node.get(part)
            if value is UNSET:
                if not creatable or part not in node:
                    raise InputError(f"{key}: only an entry of a mapping can be taken out "
                                     f"({where} has {'no such entry' if creatable else 'a fixed field here'})")
                del node[part]
            elif isinstance(node, list):
                node[int(part)] = value
            else:
                node[part] = value
            return old
        if child is None:
            raise InputError(f"{key}: {'.'.join(parts[:i + 1])} is null: set it whole")
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
        raise InputError("nothing to revise: give at least one --set KEY=VALUE or --unset KEY")
    data = to_json(plan)
    recorded = {o.key: o for o in plan.overrides}
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for key, value in assignments:
        key = join_key(split_key(key))  # `a.b` and `a["b"]` are one key
        old = _set(data, key, value)
        analysis = recorded[key].analysis if key in recorded else old
        if value is not UNSET and value == analysis:
            recorded.pop(key, None)  # back to what the analysis said: no longer an override
        else:
            removed = value is UNSET
            recorded[key] = Override(key=key, analysis=analysis, value=None if removed else value, by=reviewer,
                                     why=why, at=now, removed=removed)
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
