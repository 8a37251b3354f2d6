"""Reading the JSON files a user hands over (model_index.json, config.json): bounded and checked.

A file is refused (InputError: exit 2, one line) when it is too large, not UTF-8, not valid JSON, nested
deeper than any real configuration, or (for a model's config) holds a value no model has: a count past a
million layers, a number that is not finite, a list of more than 10,000 entries.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from integrate.errors import InputError

MAX_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 32
MAX_INT = 10**9  # any size in a model config (vocabulary, positions, channels) stays far below
MAX_COUNT = 10_000  # layers / blocks / depth: real models have at most a few hundred
MAX_ITEMS = 10_000  # entries of one list


def read(path: Path, what: str = "model metadata") -> dict[str, Any]:
    """A JSON object from `path`, with its depth checked."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise InputError(f"{path}: {size} bytes is too large to be {what}")
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number, nesting past the decoder's stack
        raise InputError(f"{path}: invalid JSON: {type(exc).__name__}: {str(exc)[:120]}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    _depth(path, data)
    return data


def _depth(path: Path, data: Any) -> None:
    stack = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InputError(f"{path}: nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def check_config(path: Path, data: dict[str, Any]) -> None:
    """A model config's values within what any model has (a count of a billion layers would hang the meta
    build; an infinite size would break arithmetic)."""
    stack: list[tuple[str, Any]] = list(data.items())
    while stack:
        key, value = stack.pop()
        if isinstance(value, bool) or value is None or isinstance(value, str):
            continue
        if isinstance(value, int):
            low = key.lower()
            bound = MAX_COUNT if any(w in low for w in ("layers", "blocks", "depth")) else MAX_INT
            if abs(value) > bound:
                raise InputError(f"{path}: {key} = {value} is out of range for a model (at most {bound})")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise InputError(f"{path}: {key} = {value} is not a finite number")
        elif isinstance(value, list):
            if len(value) > MAX_ITEMS:
                raise InputError(f"{path}: {key} holds {len(value)} entries (at most {MAX_ITEMS})")
            stack.extend((key, v) for v in value)
        elif isinstance(value, dict):
            stack.extend((f"{key}.{k}", v) for k, v in value.items())
