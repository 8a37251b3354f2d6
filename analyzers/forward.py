"""A block's forward: its signature, what it returns in order, and in-place input mutation.

Return order is traced through assignments: `e, h = x[:, :t], x[:, t:]` then `return e, h`
returns (encoder, hidden) whatever `x` was. A returned name that is a parameter carries that
parameter's role; another local is followed back to its last assignment.
"""

from __future__ import annotations

import libcst as cst

from integrate.defuse import DefUse, defuse
from integrate.records import Evidence
from integrate.resolve import Workspace
from integrate.source import SourceFile, dotted, find_method
from integrate.syntax import find_all, self_member, target_names, walk_statements

from .binding import BindError, CallArgs, bind
from .records import ForwardSummary, Param, ReturnSite

UNKNOWN = "?"


def signature(src: SourceFile, fn: cst.FunctionDef, drop_self: bool = True) -> tuple[Param, ...]:
    p = fn.params
    out: list[Param] = []

    def add(param: cst.Param, kind: str) -> None:
        default = src.code(param.default) if param.default is not None else None
        ann = src.code(param.annotation.annotation) if param.annotation is not None else None
        out.append(Param(param.name.value, kind, default, ann))

    for param in p.posonly_params:
        add(param, "positional_only")
    for param in p.params:
        add(param, "positional_or_keyword")
    if isinstance(p.star_arg, cst.Param):
        add(p.star_arg, "var_positional")
    for param in p.kwonly_params:
        add(param, "keyword_only")
    if p.star_kwarg is not None:
        add(p.star_kwarg, "var_keyword")
    if drop_self and out and out[0].name in ("self", "cls") and out[0].kind != "keyword_only":
        out = out[1:]
    return tuple(out)


_PASSTHROUGH_METHODS = {
    "to", "contiguous", "clone", "float", "half", "bfloat16", "type_as", "view", "reshape", "clip", "clamp",
    "squeeze", "unsqueeze", "flatten", "unflatten", "permute", "transpose", "detach", "chunk", "split",
}


def _trace(expr: cst.BaseExpression | None, params: set[str], assigns: DefUse, line: int, depth=0) -> str:
    if expr is None or depth > 12:
        return UNKNOWN
    if isinstance(expr, cst.Name):
        if expr.value in params:
            return expr.value
        found = assigns.last_before(expr.value, line)
        return _trace(found.value, params, assigns, line, depth + 1) if found else UNKNOWN
    if isinstance(expr, cst.Subscript):
        return _trace(expr.value, params, assigns, line, depth + 1)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        if expr.func.attr.value in _PASSTHROUGH_METHODS:
            return _trace(expr.func.value, params, assigns, line, depth + 1)
    if isinstance(expr, (cst.Call, cst.BinaryOperation)):
        roles = {r for r in (_trace_args(expr, params, assigns, line, depth)) if r != UNKNOWN}
        return roles.pop() if len(roles) == 1 else UNKNOWN
    return UNKNOWN


def _trace_args(expr, params, assigns, line, depth):
    if isinstance(expr, cst.BinaryOperation):
        return [_trace(expr.left, params, assigns, line, depth + 1),
                _trace(expr.right, params, assigns, line, depth + 1)]
    return [_trace(a.value, params, assigns, line, depth + 1) for a in expr.args]


def _tensor_count(ws: Workspace, src: SourceFile, ann: cst.BaseExpression) -> int:
    """How many `torch.Tensor` cache-dit's check would count in the return annotation."""
    future = "annotations" in src.imports and src.imports["annotations"].module == "__future__"
    count = 0
    for node in find_all(ann, (cst.Attribute, cst.Name), skip_functions=False):
        if isinstance(node, cst.Attribute) and dotted(node) == "torch.Tensor":
            count += 1
        elif not future and isinstance(node, cst.Name) and ws.qualname(src, node) == "torch.Tensor":
            count += 1
    return count


def return_guards(src: SourceFile, fn: cst.FunctionDef) -> dict[int, tuple[str, ...]]:
    """For each return statement (by node id): the `if` conditions that lead to it."""
    out: dict[int, tuple[str, ...]] = {}

    def always_returns(stmts) -> bool:
        return bool(stmts) and isinstance(stmts[-1], cst.SimpleStatementLine) and \
            any(isinstance(s, cst.Return) for s in stmts[-1].body)

    def walk(stmts, guards: tuple[str, ...]) -> None:
        for stmt in stmts:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Return):
                        out[id(small)] = guards
            elif isinstance(stmt, cst.If):
                test = src.code(stmt.test)
                walk(stmt.body.body, (*guards, test))
                if stmt.orelse is not None:
                    walk([stmt.orelse] if isinstance(stmt.orelse, cst.If) else stmt.orelse.body.body,
                         (*guards, f"not ({test})"))
                elif always_returns(stmt.body.body):
                    guards = (*guards, f"not ({test})")
            elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                continue
            elif hasattr(stmt, "body") and isinstance(getattr(stmt, "body"), cst.IndentedBlock):
                walk(stmt.body.body, guards)

    walk(fn.body.body, ())
    return out


MAX_DELEGATION = 3  # methods followed from forward through `return self.<method>(...)`


def summarize_forward(ws: Workspace, src: SourceFile, cls: cst.ClassDef,
                      method: str = "forward") -> ForwardSummary | None:
    """`cls.<method>`'s signature and what each of its returns carries. A return that hands the work to another
    method of the class (`return self._forward(x, c)`, or that method and its arguments handed to a call that
    runs it, `checkpoint(self._forward, x, c)`) returns what that method returns, its parameters bound to this
    call's arguments; the evidence says which method and where."""
    read = _summarize(ws, src, cls, method, ())
    return read[0] if read is not None else None


def _summarize(ws: Workspace, src: SourceFile, cls: cst.ClassDef, method: str,
               through: tuple[str, ...]) -> tuple[ForwardSummary, list[Evidence]] | None:
    """The summary, and the evidence of the delegations it followed (`through`: the methods already being read,
    so a cycle stays unknown)."""
    fn = find_method(cls, method)
    if fn is None:
        return None
    params = signature(src, fn)
    names = {p.name for p in params}
    assigns = defuse(src, fn)
    sites: list[ReturnSite] = []
    said: list[Evidence] = []
    guards = return_guards(src, fn)
    for ret in find_all(fn.body, cst.Return):
        line = src.line(ret)
        value = ret.value
        if value is None:
            sites.append(ReturnSite(line, (), (), guards.get(id(ret), ())))
            continue
        delegated = _delegated(ws, src, cls, (*through, method), value, names, assigns, line)
        if delegated is not None:
            found, why = delegated
            sites += [ReturnSite(s.line, s.values, s.roles, (*guards.get(id(ret), ()), *s.guards)) for s in found]
            said += why
            continue
        elements = [e.value for e in value.elements] if isinstance(value, (cst.Tuple, cst.List)) else [value]
        if len(elements) == 1 and isinstance(value, cst.Name):
            # `return out` where `out = (a, b)`: look through the tuple.
            found = assigns.last_before(value.value, line)
            if found and isinstance(found.value, (cst.Tuple, cst.List)) and value.value not in names:
                elements = [e.value for e in found.value.elements]
        sites.append(
            ReturnSite(
                line,
                tuple(src.code(e) for e in elements),
                tuple(_trace(e, names, assigns, line) for e in elements),
                guards.get(id(ret), ()),
            )
        )
    orders = {s.roles for s in sites}
    agree = len(orders) <= 1
    roles = sites[0].roles if agree and sites and UNKNOWN not in sites[0].roles else None
    ann = fn.returns.annotation if fn.returns is not None else None
    count = _tensor_count(ws, src, ann) if ann is not None else None
    arity = len(roles) if roles is not None else (len(sites[0].values) if agree and sites else None)
    ann_agrees = None if not count or arity is None else count == arity
    evidence = [Evidence(str(src.path), src.line(fn), f"{cls.name.value}.{method} signature"), *said]
    for s in sites:
        evidence.append(Evidence(str(src.path), s.line, f"returns ({', '.join(s.values)}) -> roles {s.roles}"))
    if not agree:
        evidence.append(Evidence(str(src.path), sites[0].line, "return statements disagree on what they return"))
    if ann_agrees is False:
        evidence.append(
            Evidence(
                str(src.path),
                src.line(fn),
                f"return annotation counts {count} torch.Tensor but the body returns {arity} values",
            )
        )
    summary = ForwardSummary(
        cls=cls.name.value,
        file=str(src.path),
        line=src.line(fn),
        params=params,
        returns=tuple(sites),
        return_roles=roles,
        returns_agree=agree,
        annotation=src.code(ann) if ann is not None else None,
        annotation_tensor_count=count,
        annotation_agrees=ann_agrees,
        evidence=tuple(evidence),
    )
    return summary, said


def _delegated(ws: Workspace, src: SourceFile, cls: cst.ClassDef, through: tuple[str, ...],
               value: cst.BaseExpression, names: set[str], assigns: DefUse,
               line: int) -> tuple[list[ReturnSite], list[Evidence]] | None:
    """The return sites of `return <value>` when `value` calls another method of `cls` (`self.<m>(args)`), or
    hands one with its arguments to a call that runs it (`wrapper(self.<m>, args)`): `m`'s own returns, each
    role mapped back through the argument bound to it (a parameter left at its default carries no input: `?`),
    and its guards rewritten the same way. None: not such a return (or `m` is being read already, or is past
    MAX_DELEGATION). A call whose arguments do not bind to `m` returns one unknown site, saying why."""
    found = _delegation(src, cls, value, through)
    if found is None:
        return None
    method, params, wrapper, arg_of = found
    how = (f"`{method}` returns, run by `{src.code(wrapper)}(self.{method}, ...)` (a call handed the method and its "
           "arguments)" if wrapper is not None else f"`self.{method}(...)` returns")
    path = str(src.path)
    if isinstance(arg_of, BindError):
        return ([ReturnSite(line, (src.code(value),), (UNKNOWN,))],
                [Evidence(path, line, f"returns what {how}, but the call does not bind to {method}: {arg_of}")])
    read = _summarize(ws, src, cls, method, through)
    if read is None:
        return None
    inner, nested = read
    defaults = {p.name: p.default for p in params if p.default is not None}

    def role(r: str) -> str:
        node = arg_of.get(r)
        return _trace(node, names, assigns, line) if node is not None else UNKNOWN

    def guard(text: str) -> str:
        try:
            expr = cst.parse_expression(text)
        except cst.ParserSyntaxError:
            return text
        swap = {p: (node if node is not None else _default_expr(defaults.get(p))) for p, node in arg_of.items()
                if not p.startswith("*")}
        return cst.Module([]).code_for_node(expr.visit(_Rename(swap)))

    found = [ReturnSite(s.line, s.values, tuple(role(r) for r in s.roles), tuple(guard(g) for g in s.guards))
             for s in inner.returns]
    carried = dict.fromkeys(r for site in inner.returns for r in site.roles if r != UNKNOWN)
    bindings = ", ".join(f"its `{r}` is `{src.code(arg_of[r])}`" if arg_of.get(r) is not None else
                         f"its `{r}` is left at its default" for r in carried)
    why = [Evidence(path, line, f"returns what {how}; {method} is defined at line {inner.line}, its parameters "
                                f"bound to this call's arguments: {bindings or 'it returns no input'}"), *nested]
    return found, why


def _delegation(src: SourceFile, cls: cst.ClassDef, value: cst.BaseExpression, through: tuple[str, ...]):
    """(method, its parameters, the wrapper or None, {parameter: the argument bound to it, None where left at its
    default} or the BindError) when `value` calls another method of `cls`, `self.<m>(args)`, or hands one with
    its arguments to a call that runs it, `wrapper(self.<m>, args)`; None otherwise, or when `m` is in
    `through` (being read already) or `through` is past MAX_DELEGATION. Of a wrapper's keywords, one the method
    does not take is the wrapper's own (`use_reentrant=False`)."""
    if not isinstance(value, cst.Call):
        return None
    method, args, wrapper = self_member(value.func), list(value.args), None
    if method is None and args and args[0].keyword is None and not args[0].star:
        method, args, wrapper = self_member(args[0].value), args[1:], value.func
    fn = find_method(cls, method) if method is not None else None
    if fn is None or method in through or len(through) > MAX_DELEGATION:
        return None
    params = signature(src, fn)
    if wrapper is not None:
        takes = {p.name for p in params if p.kind in ("positional_or_keyword", "keyword_only")}
        any_kw = any(p.kind == "var_keyword" for p in params)
        args = [a for a in args if a.keyword is None or a.keyword.value in takes or any_kw]
    nodes = {f"@{i}": a.value for i, a in enumerate(args)}
    call = CallArgs(tuple(f"@{i}" for i, a in enumerate(args) if a.keyword is None and not a.star),
                    tuple((a.keyword.value, f"@{i}") for i, a in enumerate(args) if a.keyword is not None),
                    opaque=any(a.star for a in args))
    try:
        bound = bind(call, params)
    except BindError as exc:
        return method, params, wrapper, exc
    return method, params, wrapper, {p: nodes.get(key) for p, key in bound.items()}


def _default_expr(default: str | None) -> cst.BaseExpression | None:
    try:
        return cst.parse_expression(default) if default is not None else None
    except cst.ParserSyntaxError:
        return None


class _Rename(cst.CSTTransformer):
    """A guard of the delegated method in the caller's terms: each of its parameters replaced by the argument
    (or default) bound to it; a parameter with neither is left as written. Attribute names and keywords are
    names of their own, never replaced."""

    def __init__(self, swap: dict[str, cst.BaseExpression | None]) -> None:
        super().__init__()
        self.swap = swap

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        new = self.swap.get(original.value)
        if new is None:
            return updated
        if isinstance(new, (cst.Name, cst.Attribute)) or new.lpar:
            return new
        return new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


# -- pitfall C: a block mutates one of its input tensors in place ----------------------------

_VIEW_METHODS = {
    "view", "reshape", "transpose", "permute", "unflatten", "flatten", "squeeze", "unsqueeze", "expand",
    "narrow", "detach", "t", "view_as", "expand_as", "unbind", "chunk", "split", "as_strided", "select",
}
_NOT_INPLACE = {"requires_grad_", "zero_grad_", "_"}


def in_place_input_mutations(src: SourceFile, cls: cst.ClassDef,
                             method: str = "forward") -> list[tuple[str, Evidence]]:
    """(input, where) for each statement that writes into a tensor the block received (or a view of it).

    cache-dit keeps references to block inputs to compute residuals; writing into them in
    place makes the residual difference zero or NaN, so nothing is ever cached.
    """
    fn = find_method(cls, method)
    if fn is None:
        return []
    params = [p.name for p in signature(src, fn) if p.kind not in ("var_positional", "var_keyword")]
    return _mutations(src, cls, fn, {p: p for p in params}, (method,), "")


def _mutations(src: SourceFile, cls: cst.ClassDef, fn: cst.FunctionDef, aliases: dict[str, str],
               through: tuple[str, ...], where: str) -> list[tuple[str, Evidence]]:
    """`in_place_input_mutations` of `fn`, whose locals in `aliases` (local -> the block's input) alias inputs; a
    method of the class it hands inputs to (`self._forward(x, c)`, see `_delegation`) is read with its parameters
    aliasing what they were given (`where`: how it was reached, said in the evidence)."""
    found: list[tuple[str, Evidence]] = []

    def aliased(expr: cst.BaseExpression | None) -> str | None:
        while expr is not None:
            if isinstance(expr, cst.Name):
                return aliases.get(expr.value)
            if isinstance(expr, cst.Subscript):
                expr = expr.value
            elif (
                isinstance(expr, cst.Call)
                and isinstance(expr.func, cst.Attribute)
                and expr.func.attr.value in _VIEW_METHODS
            ):
                expr = expr.func.value
            elif isinstance(expr, cst.Attribute) and expr.attr.value == "T":
                expr = expr.value
            else:
                return None
        return None

    def note(stmt, input_name: str, what: str) -> None:
        found.append((input_name, Evidence(str(src.path), src.line(stmt),
                                           f"{what} writes into input `{input_name}` in place{where}")))

    for stmt in walk_statements(fn.body.body):
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.AugAssign):
                src_name = aliased(small.target)
                if src_name:
                    note(stmt, src_name, f"`{src.code(small)}`")
            elif isinstance(small, cst.Assign):
                for t in small.targets:
                    if isinstance(t.target, cst.Subscript) and (name := aliased(t.target)):
                        note(stmt, name, f"item assignment `{src.code(t.target)} = ...`")
                # rebinding: a name now aliases an input only if the value is a view of one
                view_of = aliased(small.value)
                for t in small.targets:
                    for name in target_names(t.target):
                        if view_of and isinstance(t.target, cst.Name):
                            aliases[name] = view_of
                        else:
                            aliases.pop(name, None)
            for call in find_all(small, cst.Call):
                func = call.func
                delegated = _delegation(src, cls, call, through)
                if delegated is not None and isinstance(delegated[3], dict):
                    method, _, _, arg_of = delegated
                    passed = {p: a for p, node in arg_of.items() if node is not None and (a := aliased(node))}
                    inner = find_method(cls, method)
                    if passed and inner is not None:
                        found += _mutations(src, cls, inner, passed, (*through, method),
                                            f" (in `{method}`, handed it at line {src.line(stmt)})")
                if isinstance(func, cst.Attribute):
                    meth = func.attr.value
                    if meth.endswith("_") and not meth.endswith("__") and meth not in _NOT_INPLACE:
                        if name := aliased(func.value):
                            note(stmt, name, f"in-place method `.{meth}()`")
                for arg in call.args:
                    kw = arg.keyword.value if arg.keyword is not None else None
                    if kw == "out" and (name := aliased(arg.value)):
                        note(stmt, name, f"`out=` of `{dotted(func) or 'a call'}`")
                    if kw == "inplace" and isinstance(arg.value, cst.Name) and arg.value.value == "True":
                        targets = [aliased(a.value) for a in call.args if a.keyword is None]
                        for name in filter(None, targets):
                            note(stmt, name, f"`{dotted(func) or 'a call'}(..., inplace=True)`")
    return found


def documented_ranks(src: SourceFile, fn: cst.FunctionDef) -> dict[str, tuple[int, int, str]]:
    """{parameter: (rank, line, shape text)} from the function's docstring, where it documents a tensor's shape
    the diffusers way: ``txt_ids (`torch.Tensor` of shape `(text_seq_len, 4)`):``. A parameter documented
    otherwise is absent (unknown, not guessed)."""
    return {k: (len(dims), line, f"({', '.join(dims)})") for k, (dims, line) in documented_shapes(src, fn).items()}


def is_length(dim: str) -> bool:
    """A documented dim that names a sequence length (`seq_len`, `sequence_length`, `num_video_tokens`)."""
    low = dim.lower()
    return "seq" in low or low.endswith(("_len", "_length", "tokens"))


def documented_shapes(src: SourceFile, fn: cst.FunctionDef) -> dict[str, tuple[tuple[str, ...], int]]:
    """{parameter: (the documented dims as written, line)}: `encoder_hidden_states` documented of shape
    `(batch_size, text_seq_len, num_text_layers, text_hidden_dim)` gives those four names.

    Two ways of writing it are read: diffusers' ``name (`torch.Tensor` of shape `(a, b)`):`` and the reST
    literal of a Google-style entry, ``name: ``(B, 1, T)`` per-frame timesteps``: the entry's first literal, its
    continuation lines included (``shaped\n ``(B, 1, T, 1, 1)``, ``(B, T)`` or ...``), where it is a shape (one
    that starts ``True`` is not)."""
    doc = fn.get_docstring(clean=False)
    if not doc:
        return {}
    params = {p.name for p in signature(src, fn)}
    first = src.line(fn.body.body[0]) if fn.body.body else src.line(fn)
    out: dict[str, tuple[tuple[str, ...], int]] = {}
    for name, text, offset in _doc_entries(doc, params):
        if name in out:
            continue
        if "of shape `(" in text:
            shape = text.split("of shape `(", 1)[1].split(")`", 1)[0]
        elif text.partition("``")[2].startswith("("):  # the entry's first literal is a shape
            shape = text.split("``(", 1)[1].split(")``", 1)[0]
        else:
            continue
        depth, parts, current = 0, [], ""
        for ch in shape + ",":
            depth += 1 if ch in "([" else -1 if ch in ")]" else 0
            if ch == "," and depth == 0:
                parts, current = parts + [current] if current.strip() else parts, ""
            else:
                current += ch
        if parts:  # `(batch_size,)` is one dim
            out[name] = (tuple(p.strip() for p in parts), first + offset)
    return out


def documented_entries(src: SourceFile, fn: cst.FunctionDef) -> dict[str, tuple[str, int]]:
    """{parameter: (its docstring entry's text, the entry's line)}: what the forward's docstring says of each
    input it documents (`token_tags (...)`: "its modality: `0` video, `1` text, `2` audio")."""
    doc = fn.get_docstring(clean=False)
    if not doc:
        return {}
    first = src.line(fn.body.body[0]) if fn.body.body else src.line(fn)
    out: dict[str, tuple[str, int]] = {}
    for name, text, offset in _doc_entries(doc, {p.name for p in signature(src, fn)}):
        out.setdefault(name, (text, first + offset))
    return out


def _doc_entries(doc: str, params: set[str]):
    """(parameter, its entry's text, the entry's first line offset) for each docstring entry that names a
    parameter: a line `name (...)` or `name: ...`, with the lines indented deeper below it."""
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        raw = lines[i]
        line = raw.strip()
        n = 0
        while n < len(line) and (line[n].isalnum() or line[n] == "_"):
            n += 1
        name = line[:n]
        if name not in params or not line[n:].startswith((" (", ":")):
            i += 1
            continue
        indent = len(raw) - len(raw.lstrip())
        text, j = line[len(name):], i + 1
        while j < len(lines) and lines[j].strip() and len(lines[j]) - len(lines[j].lstrip()) > indent:
            text += " " + lines[j].strip()
            j += 1
        yield name, text, i
        i = j
