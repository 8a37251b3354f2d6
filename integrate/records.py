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
    if isinstance(record, (str, int, float, type(None))):
        return record
    if isinstance(record, (list, tuple)):
        return [to_json(x) for x in record]
    if isinstance(record, dict):
        return {k: to_json(v) for k, v in record.items()}
    names = _JSON_FIELDS.get(type(record))
    if names is None:
        if not (is_dataclass(record) and not isinstance(record, type)):
            return record
        names = _JSON_FIELDS[type(record)] = tuple((f.name, json_name(f)) for f in fields(record)
                                                   if f.metadata.get("json", True))
    out = {}
    for name, key in names:
        value = getattr(record, name)
        if value is not OMIT:
            out[key] = to_json(value)
    return out


_JSON_FIELDS: dict[type, tuple[tuple[str, str], ...]] = {}


# -- from JSON ---------------------------------------------------------------------------------------

_HINTS: dict[type, dict[str, Any]] = {}
_DECODERS: dict[Any, Any] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def from_json(tp: Any, data: Any, where: str = "$") -> Any:
    """`data` decoded as `tp` (a record class or a typing form), checked on the way."""
    return _decoder(tp)(data, where)


def _decoder(tp: Any):
    """A function (data, where) -> value for `tp`, built once per type."""
    found = _DECODERS.get(tp)
    if found is None:
        found = _DECODERS[tp] = _build(tp)
    return found


def _build(tp: Any):  # noqa: C901 - one branch per typing form
    origin = typing.get_origin(tp)
    if tp is Any:
        return lambda data, where: data
    if tp is type(None) or tp is None:
        def none(data, where):
            if data is not None:
                raise RecordError(f"{where}: expected null, got {_kind(data)}")
            return None
        return none
    if origin in (typing.Union, types.UnionType):
        members = [m for m in typing.get_args(tp) if m is not Omit]
        nullable = type(None) in members
        decoders = [(m, _decoder(m)) for m in members if m is not type(None)]

        def union(data, where):
            if data is None and nullable:
                return None
            errors = []
            for _, decode in decoders:
                try:
                    return decode(data, where)
                except RecordError as exc:
                    errors.append(str(exc))
            raise RecordError(errors[0] if len(errors) == 1 else f"{where}: matches none of {_names(members)}")
        return union
    if origin is Literal:
        allowed = typing.get_args(tp)

        def literal(data, where):
            if data not in allowed:
                raise RecordError(f"{where}: {data!r} is not one of {', '.join(repr(a) for a in allowed)}")
            return data
        return literal
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            item = _decoder(args[0])

            def many(data, where):
                if not isinstance(data, list):
                    raise RecordError(f"{where}: expected a list, got {_kind(data)}")
                return tuple(item(x, f"{where}[{i}]") for i, x in enumerate(data))
            return many
        items = [_decoder(a) for a in args]

        def fixed(data, where):
            if not isinstance(data, list):
                raise RecordError(f"{where}: expected a list, got {_kind(data)}")
            if len(items) != len(data):
                raise RecordError(f"{where}: expected {len(items)} items, got {len(data)}")
            return tuple(d(x, f"{where}[{i}]") for i, (d, x) in enumerate(zip(items, data)))
        return fixed
    if origin is list:
        (arg,) = typing.get_args(tp) or (Any,)
        item = _decoder(arg)

        def listed(data, where):
            if not isinstance(data, list):
                raise RecordError(f"{where}: expected a list, got {_kind(data)}")
            return [item(x, f"{where}[{i}]") for i, x in enumerate(data)]
        return listed
    if origin is dict or tp is dict:
        key_t, value_t = typing.get_args(tp) or (str, Any)
        key, value = _decoder(key_t), _decoder(value_t)

        def mapping(data, where):
            if not isinstance(data, dict):
                raise RecordError(f"{where}: expected an object, got {_kind(data)}")
            return {key(k, where): value(v, f"{where}[{k!r}]") for k, v in data.items()}
        return mapping
    if is_dataclass(tp):
        return _record_decoder(tp)
    if tp is float:
        def number(data, where):
            if isinstance(data, bool) or not isinstance(data, (int, float)):
                raise RecordError(f"{where}: expected a number, got {_kind(data)}")
            return data
        return number
    if tp in (int, str, bool):
        def scalar(data, where):
            if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
                raise RecordError(f"{where}: expected {tp.__name__}, got {_kind(data)}")
            return data
        return scalar
    raise TypeError(f"cannot decode type {tp!r}")


def _record_decoder(cls: type):
    hints = _hints(cls)
    known = {json_name(f): f for f in fields(cls) if f.metadata.get("json", True)}
    required = {key for key, f in known.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    decoders: dict[str, tuple[str, Any]] = {}

    def record(data, where):
        if not isinstance(data, dict):
            raise RecordError(f"{where}: expected an object ({cls.__name__}), got {_kind(data)}")
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise RecordError(f"{where}: unknown key {unknown[0]!r} for {cls.__name__}")
        missing = sorted(required - set(data))
        if missing:
            raise RecordError(f"{where}: missing key {missing[0]!r} ({cls.__name__})")
        if not decoders:  # built on first use: a record may refer to itself through its fields
            decoders.update({key: (f.name, _decoder(hints[f.name])) for key, f in known.items()})
        return cls(**{decoders[key][0]: decoders[key][1](value, f"{where}.{key}") for key, value in data.items()})
    return record


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
