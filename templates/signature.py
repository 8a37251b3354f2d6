"""A rewritten function's signature, kept as data: the model's source never runs when the plugin is imported.

`def` evaluates its defaults, its decorators and (without `from __future__ import annotations`) its annotations
when the module defining it is imported. A PatchFunctor's `patched_forward` is the model's own forward rewritten,
so a signature copied verbatim would run the model's expressions on `import <plugin>`. What is kept instead:

* each parameter's name and kind (positional-only, positional, `*args`, keyword-only, `**kwargs`);
* a default that is a plain literal (a number, a string, True, False, None) written through `escape.py`; any other
  default becomes the sentinel `MODEL_DEFAULT`, and the body starts by reading the real default, at run time, from
  the model's own function object (`inspect.signature(type(self).forward)`): the value the model's module made
  when it was imported, never its expression evaluated here;
* no decorator on the `def`: a decorator that is a dotted name, or a call of one with literal arguments
  (`apply_lora_scale("attention_kwargs")`, `torch.no_grad()`), is rebuilt from those parts and applied when the
  PatchFunctor is applied to a model (`wrapped`), not on import; any other decorator makes the rewrite refuse, with
  why (the function cannot be replaced without it);
* no annotations at all (they change nothing at run time).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from integrate import escape
from integrate.source import dotted
from integrate.syntax import names_read

SENTINEL = "MODEL_DEFAULT"  # the generated module's sentinel object (patch_functor.py.j2)
READER = "model_default"  # the generated function that reads a default from the model's own function


@dataclass(frozen=True)
class DataSignature:
    function: cst.FunctionDef | None  # None: refused (`why` says why)
    from_model: tuple[str, ...] = ()  # parameters whose default is read from the model's function at run time
    why: str = ""
    wrapped: escape.Code = escape.Code("")  # the function as the model decorates it (`a("x")(f)`), for `_apply`


_NOT_LITERAL = object()
_TIGHT = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def literal(node: cst.BaseExpression):
    """The value of a plain literal (`1`, `-1e-6`, `"x"`, `True`, `None`); `_NOT_LITERAL` for anything else."""
    if isinstance(node, (cst.Integer, cst.Float)):
        return node.evaluated_value
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else _NOT_LITERAL  # a bytes literal is no plain value
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[node.value]
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) \
            and isinstance(node.expression, (cst.Integer, cst.Float)):
        return -node.expression.evaluated_value
    return _NOT_LITERAL


def _written(value) -> cst.BaseExpression:
    return cst.parse_expression(escape.py(value))


def as_data(fn: cst.FunctionDef, method: str, label: str) -> DataSignature:
    """`fn` with its signature reduced to data (see the module's docstring). `method` names the model's function the
    defaults are read from at run time (`forward`), on the class of the function's first parameter; `label` names
    the model's function in a refusal (`Model.forward`)."""
    p = fn.params
    first = (*p.posonly_params, *p.params)
    if not first:
        return DataSignature(None, why=f"`{label}` takes no `self` to read the model's defaults from")
    own = first[0].name.value
    taken = {SENTINEL, READER} & (names_read(fn) | {x.name.value for x in _all_params(p)})
    if taken:
        return DataSignature(None, why=f"`{label}` uses the name(s) {sorted(taken)} the rewrite needs")
    from_model: list[str] = []

    def param(x: cst.Param) -> cst.Param:
        default = x.default
        if default is not None:
            value = literal(default)
            if value is _NOT_LITERAL:
                from_model.append(x.name.value)
                default = cst.Name(SENTINEL)
            else:
                default = _written(value)
        return x.with_changes(annotation=None, default=default, equal=_TIGHT if default is not None else x.equal)

    params = p.with_changes(posonly_params=[param(x) for x in p.posonly_params],
                            params=[param(x) for x in p.params],
                            star_arg=param(p.star_arg) if isinstance(p.star_arg, cst.Param) else p.star_arg,
                            kwonly_params=[param(x) for x in p.kwonly_params],
                            star_kwarg=param(p.star_kwarg) if p.star_kwarg is not None else None)
    wrapped: cst.BaseExpression = cst.Name(fn.name.value)
    for d in reversed(fn.decorators):  # `@a @b def f` is a(b(f))
        rebuilt = _decorator(d.decorator)
        if rebuilt is None:
            shown = " ".join(cst.Module(body=[]).code_for_node(d.decorator).split())[:80]
            return DataSignature(None, why=f"`{label}` has the decorator `@{shown}`, which is not a name or a call of "
                                           "one with literal arguments: integrate copies no model expression into "
                                           "generated code, and the function cannot be replaced without it")
        wrapped = cst.Call(func=rebuilt, args=[cst.Arg(wrapped)])
    body = fn.body
    if from_model:
        reads = [cst.parse_statement(f"if {escape.ident(name)} is {SENTINEL}:\n    {escape.ident(name)} = "
                                     f"{READER}({escape.ident(own)}, {escape.py(method)}, {escape.py(name)})\n")
                 for name in from_model]
        statements = list(body.body)
        at = 1 if statements and _is_docstring(statements[0]) else 0
        body = body.with_changes(body=[*statements[:at], *reads, *statements[at:]])
    return DataSignature(fn.with_changes(params=params, returns=None, decorators=[], body=body), tuple(from_model),
                         wrapped=escape.Code(cst.Module(body=[]).code_for_node(wrapped)))


def _all_params(p: cst.Parameters) -> list[cst.Param]:
    return [*p.posonly_params, *p.params, *p.kwonly_params,
            *([p.star_arg] if isinstance(p.star_arg, cst.Param) else []),
            *([p.star_kwarg] if p.star_kwarg is not None else [])]


def _decorator(expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """A decorator rebuilt from checked parts: its dotted name, and each argument's literal value (None: refused)."""
    call = expr if isinstance(expr, cst.Call) else None
    name = dotted(call.func if call is not None else expr)
    if not name:
        return None
    head = cst.parse_expression(escape.dotted(name))
    if call is None:
        return head
    args = []
    for arg in call.args:
        value = literal(arg.value)
        if arg.star or value is _NOT_LITERAL:
            return None
        keyword = cst.Name(escape.ident(arg.keyword.value)) if arg.keyword is not None else None
        args.append(cst.Arg(value=_written(value), keyword=keyword,
                            equal=_TIGHT if keyword is not None else cst.MaybeSentinel.DEFAULT))
    return cst.Call(func=head, args=args)


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr) \
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
