"""What a fixture feeds the model, as data (runs in a worker of its own: loading the fixture runs it).

`python -I -m integrate.verify.describe FIXTURE` prints one JSON object: the transformer's module and class, its
tiny config, the step count, and per input name one description that holds for every step:

- `{"tensor": {"shape", "dtype", "values"?, "per_step"?, "low"?, "high"?}}`: `values` (nested lists) where the tensor
  is small enough to write out (`SMALL`, `SMALL_FLOAT`), one per step under `per_step` where it changes between steps; a larger tensor is
  described by shape and dtype, with the range of one that holds integers (ids, positions: `low`, `high`) and
  whether it moves between steps;
- `{"value": ...}` for a JSON literal (None, a number, a string, a dict of those);
- `{"member": {"module", "class", "name"}}` for an enum member (a `str` or `int` one too: written back as the
  member, never as its value);
- `{"items": [...], "kind": "tuple"|"list"}` for a sequence of descriptions.

A value it cannot describe (an object of the model's own) is `{"opaque": "<type name>"}`: a test written from
the description says so rather than guessing it.
"""

from __future__ import annotations

import enum
import json
import sys

SMALL = 256  # elements: an integer or boolean tensor up to this size is written out exactly (ids, masks)
SMALL_FLOAT = 16  # a floating one (a timestep, a guidance scale); a larger one is seeded noise of its shape


def _same(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _json_literal(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return not isinstance(value, float) or value == value and abs(value) != float("inf")
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_literal(v) for k, v in value.items())
    return False


def describe_value(values: list):
    """One description of an input's value at every step (`values`: one per step)."""
    import torch

    first = values[0]
    if isinstance(first, torch.Tensor):
        t = first.detach().cpu()
        out = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
        moves = not all(_same(first, v) for v in values[1:])
        if t.numel() <= (SMALL_FLOAT if t.is_floating_point() or t.is_complex() else SMALL):
            if moves:
                out["per_step"] = [v.detach().cpu().tolist() for v in values]
            else:
                out["values"] = t.tolist()
        else:
            out["moves"] = moves
            integral = not t.is_complex() and t.numel() and (not t.is_floating_point() or bool((t == t.round()).all()))
            if integral and t.dtype != torch.bool:  # ids, positions: drawn from the same range, as integers
                out["low"], out["high"] = int(t.min()), int(t.max())
        return {"tensor": out}
    if isinstance(first, enum.Enum) and all(v is first for v in values[1:]):
        cls = type(first)  # asked before the literals: a str or int member would read as its value
        return {"member": {"module": cls.__module__, "class": cls.__qualname__, "name": first.name}}
    if isinstance(first, (tuple, list)) and all(isinstance(v, type(first)) and len(v) == len(first) for v in values):
        return {"kind": "tuple" if isinstance(first, tuple) else "list",
                "items": [describe_value([v[i] for v in values]) for i in range(len(first))]}
    if _json_literal(first) and all(_same(first, v) for v in values[1:]):
        return {"value": first}
    return {"opaque": type(first).__name__}


def describe(path: str) -> dict:
    from pathlib import Path

    from .fixture import load

    fx = load(Path(path))
    steps = [fx.inputs(step) for step in range(fx.STEPS)]
    names = list(steps[0])
    return {"module": fx.TRANSFORMER_MODULE, "cls": fx.TRANSFORMER_CLASS, "config": fx.CONFIG, "steps": fx.STEPS,
            "seed": getattr(fx, "SEED", 0),
            "inputs": {n: describe_value([s.get(n) for s in steps]) for n in names}}


if __name__ == "__main__":  # pragma: no cover - run as a worker
    print(json.dumps(describe(sys.argv[1])))
