"""Writing our cache integration over one of cache-dit's built-in adapters, in place (`integrate audit --fix`).

A built-in adapter is a module-level function of `cache_dit/caching/block_adapters/` decorated with
`@BlockAdapterRegister.register("Key")` that ends in `return BlockAdapter(...)`. The fix a maintainer would merge
changes only what is wrong: the function keeps its name, its decorator (so its place in the registry, which
cache-dit searches in order for the first name that prefixes a class name), its imports and its
`_relaxed_assert`; in its returned `BlockAdapter(...)` call only the keyword arguments whose values differ from
our proved integration are rewritten (`forward_pattern`, `blocks`, `has_separate_cfg`, `check_forward_pattern`),
element by element where a list keeps its length, so the diff is the few lines that change.

Which function: the modules `caching/block_adapters/__init__.py` imports with `_safe_import(".module", ...)`, read
in that order, each module's register decorators in file order: the first key that prefixes the looked-up class
name (the pipeline's, or the transformer's) is the one cache-dit answers with. That key's function must be there
once and end in the call; anything else is refused with one line (resolve by hand). Every read and write is
libcst's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst
import libcst.helpers
import libcst.metadata

from integrate.errors import InputError

ADAPTERS = "caching/block_adapters"
REGISTRY = "BlockAdapterRegister"
PATTERN_ENUM = "ForwardPattern"


@dataclass(frozen=True)
class AdapterRewrite:
    """Our proved cache integration, to be written over the built-in adapter cache-dit answers `lookup` with."""

    lookup: tuple[str, ...]  # the class names cache-dit looks the adapter up by (pipeline, transformer): one answer
    blocks: tuple[str, ...]  # attribute path of each cached list on the transformer
    patterns: tuple[str, ...]  # ForwardPattern member of each list
    has_separate_cfg: bool
    check_forward_pattern: bool


@dataclass(frozen=True)
class Rewritten:
    relpath: str  # relative to the cache_dit package
    function: str
    key: str
    line: int  # the function's `def` line in the old text
    changed: tuple[str, ...]  # the keyword arguments rewritten
    text: str


def _code(node: cst.CSTNode) -> str:
    return "".join(cst.Module([]).code_for_node(node).split())


def _registered_key(func: cst.FunctionDef) -> str | None:
    for dec in func.decorators:
        call = dec.decorator
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "register" \
                and cst.helpers.get_full_name_for_node(call.func.value) == REGISTRY and call.args \
                and not call.args[0].keyword and isinstance(call.args[0].value, cst.SimpleString):
            value = call.args[0].value.evaluated_value
            if isinstance(value, str):
                return value
    return None


def _modules(init: str) -> list[str]:
    """The sibling modules `__init__.py` imports with `_safe_import(".module", ...)`, in order, once each."""
    seen: list[str] = []
    for stmt in cst.parse_module(init).body:
        if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign):
            call = stmt.body[0].value
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == "_safe_import" \
                    and call.args and isinstance(call.args[0].value, cst.SimpleString):
                name = call.args[0].value.evaluated_value
                if isinstance(name, str) and name.startswith(".") and name[1:].isidentifier() and name not in seen:
                    seen.append(name)
    return [n[1:] for n in seen]


def _answering(read: Callable[[str], str | None], lookup: tuple[str, ...]) -> tuple[str, str, cst.Module]:
    """(module relpath, key, parsed module) of the built-in adapter cache-dit answers each of `lookup` with."""
    init = read(f"{ADAPTERS}/__init__.py")
    if init is None:
        raise InputError(f"{ADAPTERS}/__init__.py is missing from the checkout")
    registered: list[tuple[str, str]] = []  # (key, module relpath) in registry order
    parsed: dict[str, cst.Module] = {}
    for mod in _modules(init):
        rel = f"{ADAPTERS}/{mod}.py"
        text = read(rel)
        if text is None:
            continue
        parsed[rel] = cst.parse_module(text)
        registered += [(key, rel) for s in parsed[rel].body if isinstance(s, cst.FunctionDef)
                       and (key := _registered_key(s)) is not None]
    answers = {next(((k, r) for k, r in registered if name.startswith(k)), None) for name in lookup}
    if None in answers:
        raise InputError(f"no built-in adapter of the checkout answers {' / '.join(lookup)}: nothing to write over "
                         "in place (generate --mode checkout adds a new one)")
    if len(answers) != 1:
        raise InputError(f"the checkout answers {' and '.join(lookup)} with different built-in adapters "
                         f"({', '.join(sorted(k for k, _ in answers))}): resolve by hand")
    key, rel = answers.pop()
    if sum(k == key for k, _ in registered) != 1:
        raise InputError(f"the built-in adapter key '{key}' is registered more than once: resolve by hand")
    return rel, key, parsed[rel]


def _returned_call(func: cst.FunctionDef) -> cst.Call | None:
    body = func.body.body if isinstance(func.body, cst.IndentedBlock) else ()
    last = body[-1] if body else None
    if isinstance(last, cst.SimpleStatementLine) and len(last.body) == 1 and isinstance(last.body[0], cst.Return):
        value = last.body[0].value
        if isinstance(value, cst.Call) and cst.helpers.get_full_name_for_node(value.func) == "BlockAdapter":
            return value
    return None


def _with_values(old: cst.BaseExpression, new: list[str]) -> cst.BaseExpression:
    """`old` (a list, or one expression) holding `new`'s expressions: an element whose text is the same is kept as
    written, a list keeps its layout where its length stays."""
    if not isinstance(old, (cst.List, cst.Tuple)):
        if len(new) == 1:
            return old if _code(old) == "".join(new[0].split()) else cst.parse_expression(new[0])
        return cst.parse_expression("[" + ", ".join(new) + "]")
    elements = list(old.elements)
    if len(elements) == len(new):
        return old.with_changes(elements=[
            e if _code(e.value) == "".join(v.split()) else e.with_changes(value=cst.parse_expression(v))
            for e, v in zip(elements, new)])
    template = elements[0] if elements else cst.Element(cst.Name("x"))
    last = elements[-1] if elements else template
    out = [template.with_changes(value=cst.parse_expression(v)) for v in new]
    if out:
        out[-1] = out[-1].with_changes(comma=last.comma)
    return old.with_changes(elements=out)


def _keyword(call: cst.Call, name: str) -> cst.Arg | None:
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


class _Call(cst.CSTTransformer):
    def __init__(self, target: cst.Call, values: dict[str, str | list[str] | None]) -> None:
        self.target = target
        self.values = values
        self.changed: list[str] = []

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if original is not self.target:
            return updated
        args = list(updated.args)
        for name, value in self.values.items():
            arg = _keyword(updated, name)
            if value is None:  # cache-dit's default stands: the keyword goes where it was written
                if arg is not None:
                    args.remove(arg)
                    self.changed.append(name)
                continue
            if arg is not None:
                new = _with_values(arg.value, value if isinstance(value, list) else [value])
                if not new.deep_equals(arg.value):
                    args[args.index(arg)] = arg.with_changes(value=new)
                    self.changed.append(name)
                continue
            plain = [a for a in args if a.keyword is not None]  # added after the last keyword, laid out as it is
            at = args.index(plain[-1]) + 1 if plain else len(args)
            like = plain[-1] if plain else None
            expr = cst.parse_expression(value if isinstance(value, str) else "[" + ", ".join(value) + "]")
            new_arg = like.with_changes(keyword=cst.Name(name), value=expr) if like is not None else \
                cst.Arg(keyword=cst.Name(name), value=expr, equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
            args.insert(at, new_arg)
            self.changed.append(name)
        return updated.with_changes(args=args)


def rewrite_adapter(read: Callable[[str], str | None], rewrite: AdapterRewrite) -> Rewritten:
    """The new text of the module that defines the built-in adapter answering `rewrite.lookup`, with our lists,
    patterns and CFG style written into its returned `BlockAdapter(...)` call; `read(relpath)` gives a file of the
    package (None: absent)."""
    if len(rewrite.blocks) != len(rewrite.patterns) or not rewrite.blocks:
        raise InputError("the fix names no cached block list (or a list without its ForwardPattern)")
    rel, key, module = _answering(read, rewrite.lookup)
    func = next(s for s in module.body if isinstance(s, cst.FunctionDef) and _registered_key(s) == key)
    call = _returned_call(func)
    if call is None:
        raise InputError(f"{rel}: {func.name.value}() (registered as '{key}') does not end in `return "
                         "BlockAdapter(...)`: the fix cannot be written in place; resolve by hand")
    transformer = _keyword(call, "transformer")
    if transformer is None:
        raise InputError(f"{rel}: {func.name.value}() passes no transformer= to BlockAdapter: resolve by hand")
    base = cst.Module([]).code_for_node(transformer.value)
    for attr in rewrite.blocks:
        if not all(part.isidentifier() for part in attr.split(".")):
            raise InputError(f"not a block list attribute path: {attr!r}")
    for pattern in rewrite.patterns:
        if not pattern.isidentifier():
            raise InputError(f"not a ForwardPattern member: {pattern!r}")
    values: dict[str, str | list[str] | None] = {
        "blocks": [f"{base}.{attr}" for attr in rewrite.blocks],
        "forward_pattern": [f"{PATTERN_ENUM}.{p}" for p in rewrite.patterns],
        "has_separate_cfg": "True" if rewrite.has_separate_cfg else None,
        "check_forward_pattern": None if rewrite.check_forward_pattern else "False",
    }
    if rewrite.check_forward_pattern and _keyword(call, "check_forward_pattern") is not None:
        values["check_forward_pattern"] = "True"  # written out where the built-in writes it out
    if not rewrite.has_separate_cfg and _keyword(call, "has_separate_cfg") is not None:
        values["has_separate_cfg"] = "False"
    if _keyword(call, "blocks") is None or _keyword(call, "forward_pattern") is None:
        raise InputError(f"{rel}: {func.name.value}() passes no blocks= or forward_pattern=: resolve by hand")
    editor = _Call(call, values)
    new_func = func.visit(editor)
    new_module = module.with_changes(body=[new_func if s is func else s for s in module.body])
    wrapper = cst.metadata.MetadataWrapper(module, unsafe_skip_copy=True)
    line = wrapper.resolve(cst.metadata.PositionProvider)[func].start.line
    return Rewritten(rel, func.name.value, key, line, tuple(editor.changed), new_module.code)
