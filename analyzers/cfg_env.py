"""What the names of a function hold as the CFG reader reads it (analyzers/cfg.py): its env, a three-valued
evaluator over it, and the functions its calls reach.

`value_of(expr, env)` is a Python value or None (unknown). It reads literals, the parameters' numeric defaults,
each local's first `=` value, `self.<x>` (the function's own assignments, the class's one-return properties, or
what the caller set), the arguments a caller passed (`Env.args`), comparisons, `not` / `and` / `or`, an
`a if cond else b` whose arms agree, a dict built by `dict(k=v, **d)` or `{...}` and a key read from it, and a
call of a repository function that returns a function it defines (a closure factory, `k_model =
fm_wrapper(transformer)`), whose value is a `Func`.

`callee_of(call, env)` says which function of the repository a call runs: a function of the module, a method
through `self.`, a nested def, a function imported from another module of the repository (`Workspace.resolve`;
installed libraries are not followed), or the method of a class the same expression constructs
(`Sampler(model, extra_args=...).sample(...)`, read with the `self.<x>` its `__init__` sets from that call).
`called_env` is the env a call gives the function it runs: each argument bound to its value in the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from integrate.defuse import PLAIN, defuse
from integrate.resolve import Resolved, Workspace
from integrate.source import SourceFile, dotted, find_method, iter_methods
from integrate.syntax import find_all, self_attr

MODEL_WORDS = ("transformer", "model", "dit", "denoiser", "unet", "net")


@dataclass
class Env:
    src: SourceFile
    params: dict[str, cst.BaseExpression]
    locals: dict[str, cst.BaseExpression]
    self_values: dict[str, cst.BaseExpression]
    properties: dict[str, cst.BaseExpression]
    # functions a step may call on its way to the model: the entry's nested defs, the module's functions and the
    # class's methods, by the name a call spells (`model_fn`, `self._step`)
    helpers: dict[str, cst.FunctionDef] = field(default_factory=dict)
    # a function the entry calls: the values its caller passes (parameter -> value; a passed parameter's default
    # no longer counts) and the `self.<x>` values the caller assigned (`self._guidance_scale = guidance_scale`)
    args: dict[str, object] = field(default_factory=dict)
    known: dict[str, object] = field(default_factory=dict)
    cls: cst.ClassDef | None = None  # the class whose method this is
    ws: Workspace | None = None  # to follow a call into another module of the repository


@dataclass(frozen=True, eq=False)
class Func:
    """A function value: `fn`, defined inside the repository function `factory` and returned by it, with the env
    of the factory's call (its free names) and the parameters of that call that hold a model."""

    src: SourceFile
    fn: cst.FunctionDef
    factory: str
    env: Env
    aliases: frozenset[str]


def _literal(expr: cst.BaseExpression):
    if isinstance(expr, (cst.Integer, cst.Float)):
        return expr.evaluated_value
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        v = _literal(expr.expression)
        return -v if isinstance(v, (int, float)) else None
    if isinstance(expr, cst.Name) and expr.value in ("True", "False"):
        return expr.value == "True"
    return None


_OPS = {
    cst.GreaterThan: lambda a, b: a > b,
    cst.LessThan: lambda a, b: a < b,
    cst.GreaterThanEqual: lambda a, b: a >= b,
    cst.LessThanEqual: lambda a, b: a <= b,
    cst.Equal: lambda a, b: a == b,
    cst.NotEqual: lambda a, b: a != b,
}


def value_of(expr: cst.BaseExpression | None, env: Env, depth: int = 0):
    """Three-valued: a Python value, or None for unknown."""
    if expr is None or depth > 10:
        return None
    lit = _literal(expr)
    if lit is not None:
        return lit
    if isinstance(expr, cst.Name):
        if expr.value in env.locals:
            return value_of(env.locals[expr.value], env, depth + 1)
        if expr.value in env.args:
            return env.args[expr.value]
        if expr.value in env.params:
            return _literal(env.params[expr.value])  # only numeric / bool defaults count
        return None
    if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1 and isinstance(expr.left, cst.Name):
        # `feature is not None` for an optional input that defaults to None: off by default.
        # Negative prompts are CFG's own inputs, supplied as data: unknown, never assumed.
        comp, name = expr.comparisons[0], expr.left.value
        default = env.params.get(name)
        if isinstance(default, cst.Name) and default.value == "None" and name not in env.locals and \
                isinstance(comp.comparator, cst.Name) and comp.comparator.value == "None" and \
                not any(w in name for w in ("negative", "neg_", "uncond")):
            if isinstance(comp.operator, cst.IsNot):
                return False
            if isinstance(comp.operator, cst.Is):
                return True
    if (attr := self_attr(expr)) is not None:
        if attr in env.properties:
            return value_of(env.properties[attr], env, depth + 1)
        if attr in env.self_values:
            return value_of(env.self_values[attr], env, depth + 1)
        return env.known.get(attr)
    return _compound(expr, env, depth)


def _compound(expr: cst.BaseExpression, env: Env, depth: int):
    """`value_of` for an expression made of others: a choice, a logical or comparison operator, a dict, a key of
    one, a closure factory's call."""
    if isinstance(expr, cst.IfExp):  # an undecided test: the value both arms agree on, if they do
        test = value_of(expr.test, env, depth + 1)
        if test is not None:
            return value_of(expr.body if test else expr.orelse, env, depth + 1)
        a, b = value_of(expr.body, env, depth + 1), value_of(expr.orelse, env, depth + 1)
        return a if a is not None and a == b else None
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        v = value_of(expr.expression, env, depth + 1)
        return None if v is None else not v
    if isinstance(expr, cst.BooleanOperation):
        a, b = value_of(expr.left, env, depth + 1), value_of(expr.right, env, depth + 1)
        if isinstance(expr.operator, cst.And):
            if a is False or b is False:
                return False
            return True if (a and b) else None
        if a is True or b is True:
            return True
        return False if (a is False and b is False) else None
    if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1:
        op = _OPS.get(type(expr.comparisons[0].operator))
        a, b = value_of(expr.left, env, depth + 1), value_of(expr.comparisons[0].comparator, env, depth + 1)
        if op and isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return op(a, b)
        return None
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        base = value_of(expr.value, env, depth + 1)
        key = expr.slice[0].slice.value
        key = key.evaluated_value if isinstance(key, cst.SimpleString) else _literal(key)
        return base.get(key) if isinstance(base, dict) and key is not None else None
    if isinstance(expr, cst.Dict) or (isinstance(expr, cst.Call) and dotted(expr.func) == "dict"
                                      and "dict" not in env.helpers and "dict" not in env.src.imports):
        return _dict(expr, env, depth)
    if isinstance(expr, cst.Call):
        return _factory_call(expr, env)
    return None


def _dict(expr: cst.Dict | cst.Call, env: Env, depth: int) -> dict | None:
    """The keys a `{...}` or `dict(...)` holds whose values are known (None for the others); a `**d` whose keys
    are unknown drops what came before it (it may replace any of them)."""
    out: dict = {}
    if isinstance(expr, cst.Call):
        if any(a.star == "*" or (a.keyword is None and not a.star) for a in expr.args):
            return None  # `dict(pairs)`: not read
        items = [(a.keyword.value if a.keyword is not None else None, a.value) for a in expr.args]
    else:
        items = []
        for el in expr.elements:
            if isinstance(el, cst.StarredDictElement):
                items.append((None, el.value))
            elif isinstance(el.key, cst.SimpleString):
                items.append((el.key.evaluated_value, el.value))
            else:
                return None
    for key, value in items:
        if key is None:  # `**d`
            spread = value_of(value, env, depth + 1)
            out = {**out, **spread} if isinstance(spread, dict) else {}
        else:
            out[key] = value_of(value, env, depth + 1)
    return out


def _factory_call(call: cst.Call, env: Env) -> Func | None:
    """`fm_wrapper(transformer)`: a function of the repository whose one `return` hands back a function it
    defines: that function, with the call's env as its free names."""
    found = callee_of(call, env)
    if found is None or found[1] is not None:  # a method: not a factory
        return None
    src, _, fn, _ = found
    returns = find_all(fn.body, cst.Return)
    inner = {d.name.value: d for d in fn.body.body if isinstance(d, cst.FunctionDef)}
    if len(returns) != 1 or not isinstance(returns[0].value, cst.Name) or returns[0].value.value not in inner:
        return None
    f_env, aliases = called_env(src, None, fn, env, set(), call, known={})
    return Func(src, inner[returns[0].value.value], fn.name.value, f_env, frozenset(aliases))


def is_model(expr: cst.BaseExpression, aliases: set[str]) -> bool:
    """`self.transformer`, `self.transformer_2`, `model`, or a local alias of one of them (or its `.forward`)."""
    if isinstance(expr, cst.Attribute) and expr.attr.value == "forward":
        return is_model(expr.value, aliases)
    if isinstance(expr, cst.Name):
        return expr.value in aliases or any(w in expr.value.lower() for w in MODEL_WORDS)
    attr = self_attr(expr)
    return attr is not None and any(w in attr.lower() for w in MODEL_WORDS)


def env_of(src: SourceFile, cls: cst.ClassDef | None, fn: cst.FunctionDef) -> tuple[Env, set[str]]:
    """What `value_of` reads in `fn`: its parameters' defaults, each local's first `=` value, each `self.x = ...`
    and the class's one-return properties; and the locals bound to a model (`transformer = self.transformer`)."""
    params = {p.name.value: p.default for p in (*fn.params.params, *fn.params.kwonly_params) if p.default is not None}
    env = Env(src, params, {}, {}, {}, cls=cls)
    if cls is not None:
        for m in iter_methods(cls):
            if any(dotted(d.decorator) == "property" for d in m.decorators):
                rets = find_all(m.body, cst.Return)
                if len(rets) == 1 and rets[0].value is not None:
                    env.properties[m.name.value] = rets[0].value
    aliases: set[str] = set()
    for _, _, value, node in defuse(src, fn).statements(PLAIN):
        if len(node.targets) != 1:
            continue
        target = node.targets[0].target
        if isinstance(target, cst.Name):
            env.locals.setdefault(target.value, value)
            values = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
            if any(self_attr(v) and any(w in self_attr(v).lower() for w in MODEL_WORDS) for v in values):
                aliases.add(target.value)
        elif (attr := self_attr(target)) is not None:
            env.self_values.setdefault(attr, value)
    return env, aliases


def helpers_of(src: SourceFile, cls: cst.ClassDef | None, fn: cst.FunctionDef) -> dict[str, cst.FunctionDef]:
    """The functions a step can call by name: the entry's nested defs, the module's functions, `self.<method>`."""
    out: dict[str, cst.FunctionDef] = dict(src.functions)
    out.update({f"self.{m.name.value}": m for m in iter_methods(cls)} if cls is not None else {})
    out.update({d.name.value: d for d in find_all(fn.body, cst.FunctionDef, skip_functions=False)})
    return out


def callee_of(call: cst.Call, env: Env):
    """The function of the repository `call` runs: (its source, its class or None, the function, the `self.<x>`
    values its instance holds or None where that is the caller's own `self`); None where it is none of the
    repository's (a library's, a builtin, a value's method)."""
    name = dotted(call.func) or ""
    if name in env.helpers:
        cls = env.cls if name.startswith("self.") else None
        return env.src, cls, env.helpers[name], None
    found = _resolved(env, name) if name and "." not in name else None
    if isinstance(found, Resolved) and isinstance(found.node, cst.FunctionDef):
        return found.src, None, found.node, None
    made = call.func.value if isinstance(call.func, cst.Attribute) else None
    if isinstance(made, cst.Call) and (cls_name := dotted(made.func)):  # `Sampler(model, ...).sample(...)`
        found = _resolved(env, cls_name)
        if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
            method = find_method(found.node, call.func.attr.value)
            if method is not None:
                return found.src, found.node, method, _constructed(found.src, found.node, made, env)
    return None


def _resolved(env: Env, name: str):
    if name in env.src.classes:
        return Resolved(env.src, name, env.src.classes[name], ())
    if env.ws is None or name.split(".")[0] not in env.src.imports:
        return None
    return env.ws.resolve(env.src, name)


def _constructed(src: SourceFile, cls: cst.ClassDef, call: cst.Call, env: Env) -> dict[str, object]:
    """The `self.<x>` values `cls.__init__` sets when `call` (in `env`) constructs it."""
    init = find_method(cls, "__init__")
    if init is None:
        return {}
    i_env, _ = called_env(src, cls, init, env, set(), call, known={})
    return assigned_self(src, init, i_env)


def called_env(src: SourceFile, cls: cst.ClassDef | None, helper: cst.FunctionDef, env: Env, aliases: set[str],
               call: cst.Call, known: dict[str, object] | None = None,
               base: Env | None = None) -> tuple[Env, set[str]]:
    """The env `value_of` reads in `helper` (of `src`, a method of `cls` or not) as `call` in the caller's `env`
    runs it: the helper's own, with each parameter the call passes bound to the value it has in the caller (unknown
    where the caller's value is: the default no longer counts; a `**d` of a known dict fills the parameters it
    names and the helper's `**kwargs`), a parameter handed a model as a model alias, and `known`, the `self.<x>`
    values its instance holds. `base`: the env of a function value's factory, whose names the helper also reads."""
    h_env, h_aliases = env_of(src, cls, helper)
    h_env.helpers, h_env.ws, h_env.known = helpers_of(src, cls, helper), env.ws, dict(known or {})
    if base is not None:  # a function value: its factory's names, under its own
        h_env.params = {**base.params, **h_env.params}
        h_env.locals = {**base.locals, **h_env.locals}
        h_env.args = dict(base.args)
    params = [p.name.value for p in (*helper.params.posonly_params, *helper.params.params)]
    if params[:1] == ["self"] and (cls is not None or (dotted(call.func) or "").startswith("self.")):
        params = params[1:]
    named = set(params) | {p.name.value for p in helper.params.kwonly_params}
    rest = helper.params.star_kwarg.name.value if helper.params.star_kwarg is not None else None
    extra: dict | None = {}
    for i, arg in enumerate(call.args):
        if arg.star == "*" or (arg.star == "**" and not isinstance(value_of(arg.value, env), dict)):
            h_env.params.clear()  # which parameters they fill is not read: none keeps its default
            extra = None
            continue
        pairs = value_of(arg.value, env).items() if arg.star else [
            (arg.keyword.value if arg.keyword is not None else (params[i] if i < len(params) else None),
             value_of(arg.value, env))]
        for name, value in pairs:
            if name is not None and name not in named and extra is not None:
                extra[name] = value
            if name is None or name not in named:
                continue
            h_env.params.pop(name, None)
            h_env.args.pop(name, None)
            if value is not None:
                h_env.args[name] = value
            if not arg.star and is_model(arg.value, aliases):
                h_aliases.add(name)
    if rest is not None and extra is not None:
        h_env.args[rest] = extra
    return h_env, h_aliases


def assigned_self(src: SourceFile, fn: cst.FunctionDef, env: Env) -> dict[str, object]:
    """{attr: value} for each `self.<attr>` every assignment in `fn` gives the same known value."""
    found: dict[str, list] = {}
    for _, _, value, node in defuse(src, fn).statements(PLAIN):
        for t in node.targets:
            if (attr := self_attr(t.target)) is not None:
                found.setdefault(attr, []).append(value_of(value, env))
    return {a: vs[0] for a, vs in found.items() if vs[0] is not None and all(v == vs[0] for v in vs)}
