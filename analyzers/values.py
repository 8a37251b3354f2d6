"""A small evaluator for the constant arithmetic that sizes modules in `__init__` methods.

`num_attention_heads * attention_head_dim`, `out_dim // dim_head if out_dim is not None else
heads`, `int(dim * mlp_ratio)`: expressions like these decide head counts and projection shapes.
`evaluate(expr, env)` computes them from the values bound in `env` (constructor arguments traced
from config.json) and returns UNKNOWN for anything it cannot compute, never a guess.
"""

from __future__ import annotations

import operator
from typing import Any

import libcst as cst

from integrate.source import dotted


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"

    def __bool__(self) -> bool:  # pragma: no cover - guard against accidental truth tests
        raise TypeError("UNKNOWN has no truth value; use is_known()")


UNKNOWN: Any = _Unknown()


def is_known(value: Any) -> bool:
    return value is not UNKNOWN


_BINARY = {
    cst.Add: operator.add,
    cst.Subtract: operator.sub,
    cst.Multiply: operator.mul,
    cst.FloorDivide: operator.floordiv,
    cst.Divide: operator.truediv,
    cst.Modulo: operator.mod,
    cst.Power: operator.pow,
}
_COMPARE = {
    cst.Equal: operator.eq,
    cst.NotEqual: operator.ne,
    cst.LessThan: operator.lt,
    cst.LessThanEqual: operator.le,
    cst.GreaterThan: operator.gt,
    cst.GreaterThanEqual: operator.ge,
    cst.Is: operator.is_,
    cst.IsNot: operator.is_not,
    cst.In: lambda a, b: a in b,
    cst.NotIn: lambda a, b: a not in b,
}
_CALLS = {"int": int, "float": float, "max": max, "min": min, "len": len, "round": round, "bool": bool, "abs": abs,
          "list": list, "tuple": tuple, "sorted": sorted}
_DICT_VIEWS = {"keys": lambda d: list(d.keys()), "values": lambda d: list(d.values()), "items": lambda d: list(d.items())}
_SCALARS = (int, float, bool, str, type(None))


def evaluate(expr: cst.BaseExpression | None, env: dict[str, Any], attrs: dict[str, Any] | None = None) -> Any:
    """Value of `expr` given local names `env` and `self.<attr>` values `attrs`; UNKNOWN otherwise."""
    if expr is None:
        return UNKNOWN
    try:
        return _eval(expr, env, attrs or {})
    except (ArithmeticError, TypeError, ValueError, IndexError, KeyError, OverflowError):
        return UNKNOWN


def _eval(e: cst.BaseExpression, env: dict[str, Any], attrs: dict[str, Any]) -> Any:
    """One node's value, by its type (`_EVAL`); UNKNOWN for a kind of node it does not compute."""
    handler = _EVAL.get(type(e))
    return handler(e, env, attrs) if handler is not None else UNKNOWN


def _literal(e: cst.Integer | cst.Float | cst.SimpleString, env: dict[str, Any], attrs: dict[str, Any]) -> Any:
    return e.evaluated_value


def _name(e: cst.Name, env: dict[str, Any], attrs: dict[str, Any]) -> Any:
    if e.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[e.value]
    return env.get(e.value, UNKNOWN)


def _attribute(e: cst.Attribute, env: dict[str, Any], attrs: dict[str, Any]) -> Any:
    if isinstance(e.value, cst.Name) and e.value.value == "self":
        return attrs.get(e.attr.value, UNKNOWN)
    name = dotted(e)
    if name and name.startswith(("config.", "self.config.")):  # register_to_config: the __init__ argument
        return env.get(name.rsplit(".", 1)[1], UNKNOWN)
    return UNKNOWN


def _binary(e: cst.BinaryOperation, env: dict[str, Any], attrs: dict[str, Any]) -> Any:
    op = _BINARY.get(type(e.operator))
    left, right = _eval(e.left, env, attrs), _eval(e.right, env, attrs)
    if op is None or not (is_known(left) and is_known(right)):
        return UNKNOWN
    return op(left, right)


def _unary(e: cst.UnaryOperation, env: dict[str, Any], attrs: dict[str, Any]) -> Any:
    val = _eval(e.expression, env, attrs)
    if not is_known(val):
        return UNKNOWN
    if isinstance(e.operator, cst.Not):
        return not val
    if isinstance(e.operator, cst.Minus):
        return -val
    return val


def _boolean(e: cst.BooleanOperation, env: dict[str, Any], attrs: dict[str, Any]) -> Any:
    left = _eval(e.left, env, attrs)
    if not is_known(left):
        return UNKNOWN
    if isinstance(e.operator, cst.And):
        return _eval(e.right, env, attrs) if left else left
    return left if left else _eval(e.right, env, attrs)


def _comparison(e: cst.Comparison, env: dict[str, Any], attrs: dict[str, Any]) -> Any:
    left = _eval(e.left, env, attrs)
    for target in e.comparisons:
        right = _eval(target.comparator, env, attrs)
        op = _COMPARE.get(type(target.operator))
        if op is None or not (is_known(left) and is_known(right)):
            return UNKNOWN
        if not op(left, right):
            return False
        left = right
    return True


def _if_exp(e: cst.IfExp, env: dict[str, Any], attrs: dict[str, Any]) -> Any:
    test = _eval(e.test, env, attrs)
    if not is_known(test):
        return UNKNOWN
    return _eval(e.body if test else e.orelse, env, attrs)


def _sequence(e: cst.List | cst.Tuple, env: dict[str, Any], attrs: dict[str, Any]) -> Any:
    items = [_eval(el.value, env, attrs) for el in e.elements if isinstance(el, cst.Element)]
    if len(items) != len(e.elements) or not all(is_known(i) for i in items):
        return UNKNOWN
    return list(items) if isinstance(e, cst.List) else tuple(items)


def _subscript(e: cst.Subscript, env: dict[str, Any], attrs: dict[str, Any]) -> Any:
    """`x[i]` of a known list, tuple or dict (no slices)."""
    if len(e.slice) != 1 or not isinstance(e.slice[0].slice, cst.Index):
        return UNKNOWN
    base = _eval(e.value, env, attrs)
    index = _eval(e.slice[0].slice.value, env, attrs)
    if is_known(base) and is_known(index) and isinstance(base, list | tuple | dict):
        return base[index]
    return UNKNOWN


def _dict(e: cst.Dict, env: dict[str, Any], attrs: dict[str, Any]) -> Any:
    """Keys must be known; a value may stay UNKNOWN (`{"image": in_channels}`)."""
    out = {}
    for el in e.elements:
        key = _eval(el.key, env, attrs) if isinstance(el, cst.DictElement) else UNKNOWN
        if not is_known(key) or not isinstance(key, _SCALARS):
            return UNKNOWN
        out[key] = _eval(el.value, env, attrs)
    return out


def _call(e: cst.Call, env: dict[str, Any], attrs: dict[str, Any]) -> Any:
    """A dict view (`d.keys()`) of a known dict, or a builtin in `_CALLS` on known positional arguments."""
    if isinstance(e.func, cst.Attribute) and e.func.attr.value in _DICT_VIEWS:
        base = _eval(e.func.value, env, attrs)
        if e.args or not isinstance(base, dict):
            return UNKNOWN
        return _DICT_VIEWS[e.func.attr.value](base)
    fn = _CALLS.get(dotted(e.func) or "")
    if fn is None or any(a.keyword or a.star for a in e.args):
        return UNKNOWN
    args = [_eval(a.value, env, attrs) for a in e.args]
    if not all(is_known(a) for a in args):
        return UNKNOWN
    return fn(*args)


_EVAL = {cst.Integer: _literal, cst.Float: _literal, cst.SimpleString: _literal, cst.Name: _name,
         cst.Attribute: _attribute, cst.BinaryOperation: _binary, cst.UnaryOperation: _unary,
         cst.BooleanOperation: _boolean, cst.Comparison: _comparison, cst.IfExp: _if_exp, cst.List: _sequence,
         cst.Tuple: _sequence, cst.Subscript: _subscript, cst.Dict: _dict, cst.Call: _call}


def comprehension_items(comp: cst.DictComp, env: dict[str, Any],
                        attrs: dict[str, Any] | None = None) -> list[tuple[Any, dict[str, Any]]] | None:
    """`{key: value for target in iterable}` with a single `for` and no `if`: each known key with the names
    its value is evaluated under (`env` plus the target bound to that item); None when the iterable or a key
    is not known."""
    if comp.for_in.inner_for_in is not None or comp.for_in.ifs:
        return None
    items = evaluate(comp.for_in.iter, env, attrs)
    if not is_known(items) or not isinstance(items, list | tuple | dict):
        return None
    out = []
    for item in items:
        bound = dict(env)
        if not _bind_target(comp.for_in.target, item, bound):
            return None
        key = evaluate(comp.key, bound, attrs)
        if not is_known(key) or not isinstance(key, _SCALARS):
            return None
        out.append((key, bound))
    return out


def _bind_target(target: cst.BaseExpression, item: Any, env: dict[str, Any]) -> bool:
    if isinstance(target, cst.Name):
        env[target.value] = item
        return True
    if isinstance(target, cst.Tuple | cst.List) and isinstance(item, list | tuple) and len(item) == len(target.elements):
        return all(_bind_target(el.value, v, env) for el, v in zip(target.elements, item))
    return False


def jsonable(value: Any) -> Any:
    """A known scalar (or list of scalars) as JSON data; None for UNKNOWN and anything else."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, _SCALARS) for v in value):
        return list(value)
    return None
