"""A regression test in cache-dit's `tests/` layout for a cache finding of `integrate audit` (`audit --fix`).

The test rebuilds the audit's tiny fixture inside cache-dit's own test suite, without integrate: the transformer
from its tiny config with seeded random weights, and its inputs from `integrate.verify.describe`'s description
(small integer tensors and small floats written out exactly, larger tensors as seeded noise of the same shape,
integer-valued ones drawn from the same range). It asserts what the audit's cache proof asserts, in cache-dit's
public API: the run does not fail, some step is cached, the warm-up step equals the plain model's, and each step
stays within a few times its own move of the plain model. Every value is written through `integrate.escape`.
"""

from __future__ import annotations

from integrate import escape
from integrate.errors import InputError

_DTYPES = {"float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
           "complex64"}


def _expr(name: str, d: dict) -> str:
    """A Python expression (of `step`) for one described input."""
    if "value" in d:
        return escape.py(d["value"])
    if "member" in d:  # an enum member: the member itself (`_member`, in _regression_model.j2), not its value
        m = d["member"]
        return f"_member({escape.py(str(m['module']))}, {escape.py(str(m['class']))}, {escape.py(str(m['name']))})"
    if "items" in d:
        parts = [_expr(f"{name}/{i}", item) for i, item in enumerate(d["items"])]
        return f"[{', '.join(parts)}]" if d.get("kind") == "list" else f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    if "tensor" not in d:
        raise InputError(f"input {name!r}: a {d.get('opaque', 'value')} the test cannot write; write that input by hand")
    t = d["tensor"]
    dtype = t["dtype"]
    if dtype not in _DTYPES:
        raise InputError(f"input {name!r}: dtype {dtype!r} is not one the test writes")
    shape = [int(n) for n in t["shape"]]
    dims = ", ".join(str(n) for n in shape)
    if "values" in t:
        return f"torch.tensor({escape.py(t['values'])}, dtype=torch.{dtype})"
    if "per_step" in t:
        return f"torch.tensor({escape.py(t['per_step'])}[step], dtype=torch.{dtype})"
    if dtype == "bool":
        return f"_randint({escape.py(name)}, 0, 1{', ' if dims else ''}{dims}).bool()"
    if "low" in t:
        return (f"_randint({escape.py(name)}, {int(t['low'])}, {int(t['high'])}{', ' if dims else ''}{dims})"
                f".to(torch.{dtype})")
    step = ", step=step" if t.get("moves") else ""
    return f"_randn({escape.py(name)}{', ' if dims else ''}{dims}{step}).to(torch.{dtype})"


def _inputs(description: dict) -> list[tuple[str, escape.Code]]:
    """(name, expression of `step`) for each described input, as `_inputs(step)` in the test returns them."""
    return [(n, escape.Code(_expr(n, d))) for n, d in description["inputs"].items()]


def _members(description: dict) -> bool:
    """Whether an input holds an enum member (the test then defines `_member`)."""
    def has(d: dict) -> bool:
        return "member" in d or any(has(item) for item in d.get("items", ()))
    return any(has(d) for d in description["inputs"].values())


def cache_test(description: dict, *, name: str, lookup: str, key: str, where: str, finding: str, threshold: float,
               slack: float, floor: float) -> tuple[str, str]:
    """(path in cache-dit's repository, text) of the regression test for a cache finding."""
    from . import render

    escape.ident(name)
    path = f"tests/api/test_{name}_cache_regression.py"
    inputs = _inputs(description)
    how = (f"cache-dit's adapter registered as '{key}' ({where}) is looked up for {description['cls']}; caching is "
           f"enabled with a permissive threshold after one warm-up step, and the model runs {int(description['steps'])} "
           "steps: the run must not fail, some step must be cached, the warm-up step must equal the plain model's, "
           "and each cached step stay within a few times the step's own move of the plain model (a cached step "
           "reuses the last step's residual). Random weights: no download.")
    text = render("regression_test.py.j2", how=how, name=name, lookup=lookup, cls=description["cls"],
                   module=description["module"], config=escape.py_dict(description["config"]),
                   steps=int(description["steps"]), threshold=escape.py(float(threshold)), inputs=inputs,
                   key=key, where=where, finding=finding, slack=escape.py(float(slack)),
                   floor=escape.py(float(floor)), members=_members(description))
    return path, text


def tp_test(description: dict, *, name: str, lookup: str, key: str, where: str, finding: str) -> tuple[str, str]:
    """(path in cache-dit's repository, text) of the regression test for a TP finding: 2 gloo processes on a CPU,
    cache-dit's TP on the tiny model against its 1-process output, and some parameter really sharded."""
    from . import render

    escape.ident(name)
    path = f"tests/parallelism/test_{name}_tp_regression.py"
    inputs = _inputs(description)
    how = (f"cache-dit's tensor-parallel planner registered as '{key}' ({where}) is looked up for "
           f"{description['cls']} and applied over 2 gloo processes (the test runs itself as each rank); each "
           "rank's output must match the 1-process run, and some parameter must be sharded (local shape smaller "
           "than the full one), else tensor parallelism did not engage. Random weights and biases: no download.")
    text = render("regression_tp_test.py.j2", how=how, name=name, lookup=lookup, cls=description["cls"],
                  module=description["module"], config=escape.py_dict(description["config"]), inputs=inputs,
                  finding=finding, members=_members(description))
    return path, text
