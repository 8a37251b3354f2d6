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


def _registered_as(node: cst.FunctionDef | cst.ClassDef, registry: str = REGISTRY) -> str | None:
    """The name a function or class is registered under by a `@<registry>.register("name")` decorator."""
    for dec in node.decorators:
        call = dec.decorator
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "register" \
                and cst.helpers.get_full_name_for_node(call.func.value) == registry and call.args \
                and not call.args[0].keyword and isinstance(call.args[0].value, cst.SimpleString):
            value = call.args[0].value.evaluated_value
            if isinstance(value, str):
                return value
    return None


def package_files(package, folder: str) -> list[str]:
    """The modules of `folder` in the cache_dit package directory `package`, relative to it (posix), sorted."""
    return sorted(str(f.relative_to(package).as_posix()) for f in (package / folder).glob("*.py"))


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
                       and (key := _registered_as(s)) is not None]
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
    func = next(s for s in module.body if isinstance(s, cst.FunctionDef) and _registered_as(s) == key)
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


# --- a built-in planner replaced by ours in its own module ------------------------------------------------------

PLANNERS = "distributed/transformers"
PLANNER_REGISTRIES = {"cp": "ContextParallelismPlannerRegister", "tp": "TensorParallelismPlannerRegister"}


@dataclass(frozen=True)
class PlannerRewrite:
    """Our proved planner (a checkout-mode module: imports, helpers, one decorated class) written over the
    built-in class cache-dit registers as `key`, in that class's own module."""

    kind: str  # "cp" | "tp"
    key: str  # the name the built-in class is registered under (cache-dit answered the lookup with it)
    text: str  # our planner module's text
    symbol: str  # our class in it


def _bound(stmt: cst.CSTNode) -> set[str]:
    from integrate.syntax import assigned_names

    return set(assigned_names(stmt))


def _is_import(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom))
                                                             for s in stmt.body)


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr) \
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))


def _module_name(node: cst.ImportFrom) -> str:
    dots = "." * len(node.relative)
    return dots + (cst.helpers.get_full_name_for_node(node.module) if node.module is not None else "")


def _import_sources(stmt: cst.SimpleStatementLine) -> dict[str, str]:
    """{bound name: "module:name"} of an import statement line (`import a.b` binds `a`)."""
    out: dict[str, str] = {}
    for small in stmt.body:
        if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            for alias in small.names:
                name = cst.helpers.get_full_name_for_node(alias.name)
                bound = alias.asname.name.value if alias.asname else name
                out[bound] = f"{_module_name(small)}:{name}"
        elif isinstance(small, cst.Import):
            for alias in small.names:
                name = cst.helpers.get_full_name_for_node(alias.name)
                bound = alias.asname.name.value if alias.asname else name.split(".")[0]
                out[bound] = f"import {name}" if alias.asname else f"import {name.split('.')[0]}"
    return out


def _only(stmt: cst.SimpleStatementLine, names: set[str]) -> cst.SimpleStatementLine:
    """The import statement line narrowed to the aliases that bind `names`."""
    body = []
    for small in stmt.body:
        aliases = [a for a in small.names if (a.asname.name.value if a.asname else
                                              cst.helpers.get_full_name_for_node(a.name).split(".")[0]
                                              if isinstance(small, cst.Import) else
                                              cst.helpers.get_full_name_for_node(a.name)) in names]
        if aliases:
            aliases[-1] = aliases[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            body.append(small.with_changes(names=aliases, **({"lpar": None, "rpar": None}
                                                            if isinstance(small, cst.ImportFrom) and len(aliases) == 1
                                                            else {})))
    return stmt.with_changes(body=body)


def rewrite_planner(read: Callable[[str], str | None], files: list[str], rewrite: PlannerRewrite,
                    relative: Callable[[str, cst.Module], cst.Module],
                    formatted: Callable[[str, str], str]) -> Rewritten:
    """The new text of the module that defines the built-in planner class registered as `rewrite.key`: that class
    replaced where it stands by ours (the built-in's name and decorator kept, so its registration and every
    import of it stay), our helpers around it, our imports after its imports (relative, as cache-dit imports
    itself: `relative(relpath, module)`), each laid out by `formatted(relpath, text)` (the tree's yapf style)
    before being spliced in, so no line of the module outside the replaced class changes. A helper name the
    module already binds otherwise is refused (resolve by hand). `files`: the package's modules under
    distributed/transformers."""
    rel, module, old = _registered_planner(read, files, rewrite)
    ours = relative(rel, cst.parse_module(formatted(rel, rewrite.text)))
    body = [s for s in ours.body if not _is_docstring(s)]
    cls = next((s for s in body if isinstance(s, cst.ClassDef) and s.name.value == rewrite.symbol), None)
    if cls is None:
        raise InputError(f"our planner module defines no class {rewrite.symbol}")
    at = body.index(cls)
    before = [s for s in body[:at] if not _is_import(s)]
    after = [s for s in body[at + 1:] if not _is_import(s)]
    taken = {n for s in module.body if s is not old for n in _bound(s)}
    new_imports = _imports_to_add(rel, module, [s for s in body if _is_import(s)], taken)
    for stmt in before + after:
        clash = _bound(stmt) & taken
        if clash:
            raise InputError(f"{rel} already defines {', '.join(sorted(clash))}, which our planner defines too: "
                             "resolve by hand")
    renamed = cls.with_changes(name=old.name, decorators=old.decorators,
                               leading_lines=old.leading_lines)
    new_module = module.with_changes(body=_spliced(module, old, before, [renamed, *after], new_imports))
    wrapper = cst.metadata.MetadataWrapper(module, unsafe_skip_copy=True)
    line = wrapper.resolve(cst.metadata.PositionProvider)[old].start.line
    return Rewritten(rel, old.name.value, rewrite.key, line, ("class",), new_module.code)


def _registered_planner(read: Callable[[str], str | None], files: list[str],
                        rewrite: PlannerRewrite) -> tuple[str, cst.Module, cst.ClassDef]:
    """(relpath, module, class) of the one built-in planner class registered as `rewrite.key`; an InputError
    unless there is exactly one."""
    registry = PLANNER_REGISTRIES[rewrite.kind]
    found = []
    for rel in files:
        text = read(rel)
        if text is None or registry not in text:
            continue
        module = cst.parse_module(text)
        found += [(rel, module, s) for s in module.body
                  if isinstance(s, cst.ClassDef) and _registered_as(s, registry) == rewrite.key]
    if len(found) != 1:
        raise InputError(f"the checkout has {len(found)} classes registered with {registry} as '{rewrite.key}': "
                         "the fix needs exactly one to write over; resolve by hand")
    return found[0]


def _imports_to_add(rel: str, module: cst.Module, imports: list, taken: set[str]) -> list:
    """Our planner's imports of names the module does not import yet (each cut to those names); an InputError for
    a name the module binds to something else."""
    have: dict[str, str] = {}  # name -> where the module imports it from
    for stmt in module.body:
        if _is_import(stmt):
            have.update(_import_sources(stmt))
    new_imports = []
    for stmt in imports:
        wanted = _import_sources(stmt)
        # bound there already to something else; the same name imported from another path of one package
        # (`torch.distributed._tensor` / `torch.distributed.tensor`: Replicate) is taken to be the same object
        clash = {n for n, where in wanted.items() if n in taken and (
            n not in have or have[n].rpartition(":")[2] != where.rpartition(":")[2]
            or have[n].partition(".")[0] != where.partition(".")[0])}
        if clash:  # bound there already, to something else
            raise InputError(f"{rel} already binds {', '.join(sorted(clash))}, which our planner imports from "
                             f"{', '.join(sorted({wanted[n] for n in clash}))}: resolve by hand")
        missing = {n for n in wanted if n not in have}
        if missing:
            new_imports.append(_only(stmt, missing))
    return new_imports


def _spliced(module: cst.Module, old: cst.ClassDef, before: list, rest: list, new_imports: list) -> list[cst.CSTNode]:
    """The module's statements with `old` replaced by our helpers defined ahead of our class (`before`, two blank
    lines before each definition), then the class and what follows it (`rest`); our `import x` lines ahead of the
    module's first import and our `from x import y` lines after its last."""
    out: list[cst.CSTNode] = []
    first_import = min((i for i, s in enumerate(module.body) if _is_import(s)), default=-1)
    last_import = max((i for i, s in enumerate(module.body) if _is_import(s)), default=-1)
    plain = [s for s in new_imports if all(isinstance(x, cst.Import) for x in s.body)]  # `import inspect`
    new_imports = [s for s in new_imports if s not in plain]  # `from x import y`: after the module's own
    for i, stmt in enumerate(module.body):
        if i == first_import:  # standard-library style `import x` lines go first, as isort orders them
            out += [s.with_changes(leading_lines=[]) for s in plain]
        if stmt is old:
            out += [s.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]) if isinstance(
                s, (cst.FunctionDef, cst.ClassDef)) else s for s in before]
            out += rest
        else:
            out.append(stmt)
        if i == last_import:
            out += new_imports
    if last_import < 0:
        out = plain + new_imports + out
    return out


def registered_keys(read: Callable[[str], str | None], files: list[str], registry: str) -> set[str]:
    """Every name `registry.register("name")` decorates a function or class with, in `files` (read with libcst)."""
    keys: set[str] = set()
    for rel in files:
        text = read(rel)
        if text is None or registry not in text:
            continue
        keys |= {key for stmt in cst.parse_module(text).body if isinstance(stmt, (cst.FunctionDef, cst.ClassDef))
                 and (key := _registered_as(stmt, registry)) is not None}
    return keys


def also_answers(key: str, proved: str, classes: frozenset[str], keys: set[str]) -> list[str]:
    """The other installed transformer classes that `key` answers (it prefixes them, and no longer registered
    name does): a fix proved on `proved` alone would change them too, unproved."""
    return sorted(c for c in classes if c != proved and c.startswith(key)
                  and not any(len(k) > len(key) and c.startswith(k) for k in keys))
