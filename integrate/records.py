"""Frozen, JSON-serialisable records: the only way data passes from one stage to the next.

Each stage owns the records it produces (`integrate.gate.GateReport`, `integrate.analyzers.records`,
`integrate.decisions.records`, `integrate.templates.records`, `integrate.verify.records`,
`integrate.survey.SurveyRow`); this module holds what they share: `Evidence`, and the two functions
that turn a record tree into JSON data and back.

- `to_json(record)`: plain JSON data. A field named `cls` is `class` in JSON (other keywords are named
  with `metadata={"name": "in"}`); a field whose value is
  `OMIT` is left out (an optional key, e.g. a mask reorder's `mechanism` exists only when one is needed);
  a field declared with `metadata=IN_PROCESS` is never serialised (typed data whose readable form is in
  another field).
- `from_json(Type, data)`: the record back, every value checked against the field's type; a wrong type,
  an unknown key or a missing required key raises `RecordError` (an `InputError`: exit code 2) naming
  the path (`$.parallelism.cp.plan["proj_out"]`).

The JSON forms are the documented schema (docs/schema.md; tests/test_schema_doc.py keeps the two in step).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Literal

from integrate.errors import InputError

Confidence = Literal["high", "medium", "low", "unknown"]
IN_PROCESS = {"json": False}
_RENAMES = {"cls": "class"}


class Omit:
    """The value of an optional JSON key that is absent."""

    _instance: Omit | None = None

    def __new__(cls) -> Omit:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "OMIT"

    def __bool__(self) -> bool:
        raise TypeError("OMIT has no truth value; compare with `is OMIT`")


OMIT: Any = Omit()


class RecordError(InputError):
    """JSON data that does not match a record's types."""


@dataclass(frozen=True)
class Evidence:
    file: str
    line: int
    why: str


def json_name(f: dataclasses.Field) -> str:
    """The field's JSON key: `metadata={"name": ...}` when the key is a Python keyword, else its name."""
    return f.metadata.get("name") or _RENAMES.get(f.name, f.name)


def to_json(record: Any) -> Any:
    """Plain JSON data for a record tree (dataclasses, tuples, lists, dicts, scalars)."""
    if is_dataclass(record) and not isinstance(record, type):
        out = {}
        for f in fields(record):
            if not f.metadata.get("json", True):
                continue
            value = getattr(record, f.name)
            if value is OMIT:
                continue
            out[json_name(f)] = to_json(value)
        return out
    if isinstance(record, (list, tuple)):
        return [to_json(x) for x in record]
    if isinstance(record, dict):
        return {k: to_json(v) for k, v in record.items()}
    return record


# -- from JSON ---------------------------------------------------------------------------------------

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def from_json(tp: Any, data: Any, where: str = "$") -> Any:
    """`data` decoded as `tp` (a record class or a typing form), checked on the way."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return data
    if tp is type(None) or tp is None:
        if data is not None:
            raise RecordError(f"{where}: expected null, got {_kind(data)}")
        return None
    if origin in (typing.Union, types.UnionType):
        members = [m for m in typing.get_args(tp) if m is not Omit]
        if data is None and type(None) in members:
            return None
        errors = []
        for member in members:
            if member is type(None):
                continue
            try:
                return from_json(member, data, where)
            except RecordError as exc:
                errors.append(str(exc))
        raise RecordError(errors[0] if len(errors) == 1 else f"{where}: matches none of {_names(members)}")
    if origin is Literal:
        if data not in typing.get_args(tp):
            allowed = ", ".join(repr(a) for a in typing.get_args(tp))
            raise RecordError(f"{where}: {data!r} is not one of {allowed}")
        return data
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(data, list):
            raise RecordError(f"{where}: expected a list, got {_kind(data)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_json(args[0], x, f"{where}[{i}]") for i, x in enumerate(data))
        if len(args) != len(data):
            raise RecordError(f"{where}: expected {len(args)} items, got {len(data)}")
        return tuple(from_json(a, x, f"{where}[{i}]") for i, (a, x) in enumerate(zip(args, data)))
    if origin is list:
        (arg,) = typing.get_args(tp) or (Any,)
        if not isinstance(data, list):
            raise RecordError(f"{where}: expected a list, got {_kind(data)}")
        return [from_json(arg, x, f"{where}[{i}]") for i, x in enumerate(data)]
    if origin is dict or tp is dict:
        key_t, value_t = typing.get_args(tp) or (str, Any)
        if not isinstance(data, dict):
            raise RecordError(f"{where}: expected an object, got {_kind(data)}")
        return {from_json(key_t, k, where): from_json(value_t, v, f"{where}[{k!r}]") for k, v in data.items()}
    if is_dataclass(tp):
        return _record(tp, data, where)
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise RecordError(f"{where}: expected a number, got {_kind(data)}")
        return data
    if tp in (int, str, bool):
        if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
            raise RecordError(f"{where}: expected {tp.__name__}, got {_kind(data)}")
        return data
    raise TypeError(f"{where}: cannot decode type {tp!r}")


def _record(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise RecordError(f"{where}: expected an object ({cls.__name__}), got {_kind(data)}")
    hints = _hints(cls)
    known = {json_name(f): f for f in fields(cls) if f.metadata.get("json", True)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise RecordError(f"{where}: unknown key {unknown[0]!r} for {cls.__name__}")
    values = {}
    for key, f in known.items():
        if key not in data:
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                continue
            raise RecordError(f"{where}: missing key {key!r} ({cls.__name__})")
        values[f.name] = from_json(hints[f.name], data[key], f"{where}.{key}")
    return cls(**values)


def _kind(data: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(data), type(data).__name__)


def _names(members) -> str:
    return ", ".join(getattr(m, "__name__", str(m)) for m in members)


def record_types(root: type) -> list[type]:
    """Every record class reachable from `root` through its fields' types (for the schema check)."""
    seen: list[type] = []

    def visit(tp: Any) -> None:
        for arg in typing.get_args(tp):
            visit(arg)
        if is_dataclass(tp) and isinstance(tp, type) and tp not in seen:
            seen.append(tp)
            for f in fields(tp):
                if f.metadata.get("json", True):
                    visit(_hints(tp)[f.name])

    visit(root)
    return seen
