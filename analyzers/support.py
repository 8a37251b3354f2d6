"""What the installed cache-dit already registers, read statically from its sources.

Reported beside the analysis, clearly labelled; never used as the analysis.
"""

from __future__ import annotations

import functools
from pathlib import Path

import libcst as cst

from integrate.errors import InputError
from integrate.records import OMIT, Evidence
from integrate.resolve import Resolved, Workspace
from integrate.source import SourceFile, dotted
from integrate.syntax import find_all

from .builtins import This, adapter_configs, binding, qualified, verdict
from .records import BuiltinAnswer, CacheDefaults, SupportMatch, SupportNote, TransformerFacts


def registered_adapters(ws: Workspace) -> dict[str, str]:
    """{name prefix: file} for every `@BlockAdapterRegister.register("...")` in cache-dit."""
    try:
        found = ws.locate_class("cache_dit", "BlockAdapterRegister")
    except InputError:
        return {}
    out: dict[str, str] = {}
    for path in ws.listing(found.src.path.parent, "*.py"):
        src = ws.load(path, found.src.package_root)
        for fn in src.functions.values():
            for deco in fn.decorators:
                call = deco.decorator
                if not isinstance(call, cst.Call) or not call.args:
                    continue
                name = dotted(call.func) or ""
                owner, _, meth = name.rpartition(".")
                if meth != "register" or not owner:
                    continue
                target = ws.resolve(src, owner)
                if not (isinstance(target, Resolved) and target.name == "BlockAdapterRegister"):
                    continue
                arg = call.args[0].value
                supported = all(
                    not (a.keyword and a.keyword.value == "supported" and dotted(a.value) == "False")
                    for a in call.args
                )
                if isinstance(arg, cst.SimpleString) and supported:
                    out[arg.evaluated_value] = f"{path}:{src.line(fn)}"
                    _ACCEPTS[out[arg.evaluated_value]] = _accepted_classes(fn)
                    _READ[out[arg.evaluated_value]] = (src, fn)
    return out


_ACCEPTS: dict[str, tuple[str, ...] | None] = {}
_READ: dict[str, tuple[SourceFile, cst.FunctionDef]] = {}  # "file:line" -> the adapter function, as read


def registered_planners(ws: Workspace, package: str, register: str) -> dict[str, str]:
    """{name prefix: "file:line"} for every `@<register>.register("...")` class decorator in the folder that
    defines `register` (cache-dit's planners sit beside their registry), read statically; {} when not found.
    The folder's files are read with the standard `ast` (a tenth of a full syntax tree's time, every plan pays it)
    and a decorator counts where its name is `register` as imported or defined in that file."""
    return {key: where for key, (where, _) in planner_classes(ws, package, register).items()}


def planner_classes(ws: Workspace, package: str, register: str) -> dict[str, tuple[str, str]]:
    """{name prefix: ("file:line", planner class name)}, as `registered_planners` reads them."""
    try:
        found = ws.locate_class(package, register)
    except InputError:
        return {}
    files = []
    for path in ws.listing(found.src.path.parent, "*.py"):
        try:
            files.append((str(path), ws.read_bytes(path)))
        except OSError:
            continue
    return {key: (where, cls) for key, where, cls in _planner_table(tuple(files), register)}


@functools.lru_cache(maxsize=8)
def _planner_table(files: tuple[tuple[str, bytes], ...], register: str) -> tuple[tuple[str, str, str], ...]:
    """The table for the folder's files as read ((path, bytes), in order): kept per content, never per folder."""
    import ast

    out: dict[str, tuple[str, str]] = {}
    for path, data in files:
        try:
            tree = ast.parse(data.decode("utf-8", errors="replace"), filename=path)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        names = {a.asname or a.name for node in tree.body if isinstance(node, ast.ImportFrom)
                 for a in node.names if a.name == register}
        names |= {node.name for node in tree.body if isinstance(node, ast.ClassDef) and node.name == register}
        for node in ast.walk(tree) if names else ():
            if not isinstance(node, ast.ClassDef):
                continue
            for deco in node.decorator_list:
                if (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute) and deco.func.attr == "register"
                        and isinstance(deco.func.value, ast.Name) and deco.func.value.id in names and deco.args
                        and isinstance(deco.args[0], ast.Constant) and isinstance(deco.args[0].value, str)):
                    out.setdefault(deco.args[0].value, (f"{path}:{node.lineno}", node.name))
    return tuple((key, where, cls) for key, (where, cls) in out.items())


def answered_by(name: str, registered: dict[str, str]) -> str | None:
    """A registered name that answers a lookup of `name` (one `name` starts with), which a registration added later
    through cache-dit's public API cannot go ahead of; None when none does."""
    return next((key for key in registered if name.startswith(key)), None)


def _accepted_classes(fn: cst.FunctionDef) -> tuple[str, ...] | None:
    """The transformer classes an adapter asserts it accepts (`_relaxed_assert(pipe.transformer, (A, B))`,
    cache-dit's own convention); None when it asserts nothing."""
    from integrate.syntax import find_all

    assigned: dict[str, list[cst.BaseExpression]] = {}
    for a in find_all(fn, (cst.Assign, cst.AugAssign)):
        for t in (a.targets if isinstance(a, cst.Assign) else [a]):
            if isinstance(t.target, cst.Name):
                assigned.setdefault(t.target.value, []).append(a.value)

    def classes(value: cst.BaseExpression, seen: frozenset[str] = frozenset()) -> list[str] | None:
        if isinstance(value, (cst.Tuple, cst.List)):
            found = [classes(e.value, seen) for e in value.elements]
            return None if any(f is None for f in found) else [n for f in found for n in f]
        if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add):
            # `supported = supported + (B,)`: what each side holds
            found = [classes(value.left, seen), classes(value.right, seen)]
            return None if any(f is None for f in found) else [n for f in found for n in f]
        if isinstance(value, cst.Name) and value.value == "None":
            return []
        if isinstance(value, cst.Name) and value.value in seen:
            return []  # its other assignments are read where the name is first met
        if isinstance(value, cst.Name) and value.value in assigned and len(seen) < 3:
            found = [classes(v, seen | {value.value}) for v in assigned[value.value]]
            if any(f is None for f in found):
                return None
            return [n for f in found for n in f] or [value.value]  # `X = None` fallbacks keep the class
        if isinstance(value, (cst.Name, cst.Attribute)):
            return [(dotted(value) or "").rpartition(".")[2]]
        return None  # built some other way: not read

    names: list[str] = []
    for call in find_all(fn, cst.Call):
        if (dotted(call.func) or "").rpartition(".")[2] != "_relaxed_assert" or len(call.args) < 2:
            continue
        found = classes(call.args[1].value)
        if found is None:
            return None  # nothing is refused on account of what was not read
        names += found
    return tuple(dict.fromkeys(n for n in names if n)) or None


def support_note(ws: Workspace, pipeline_class: str | None, transformer_class: str | None, this: This | None = None,
                 facts: TransformerFacts | None = None, pipeline_is_diffusers: bool | None = None) -> SupportNote:
    """What the installed cache-dit registers for the model, and (with `this`, the analysed class) a verdict on each
    of its registrations that answers a name cache-dit looks up here (analyzers/builtins.py): the pipeline's class
    (unless it is no diffusers pipeline, which cache-dit never looks up), the transformer's, for its CP / TP planners
    the transformer's."""
    adapters = registered_adapters(ws)
    matches = []
    for candidate in (pipeline_class, transformer_class):
        if not candidate:
            continue
        for prefix, where in adapters.items():
            if candidate.split(".")[0].startswith(prefix):
                matches.append(SupportMatch(candidate, prefix, where, tuple(_ACCEPTS.get(where) or ())))
    answers = _adapter_answers(ws, adapters, pipeline_class, transformer_class, this, facts, pipeline_is_diffusers)
    planners = {}
    for kind, register in (("cp", "ContextParallelismPlannerRegister"), ("tp", "TensorParallelismPlannerRegister")):
        table = planner_classes(ws, "cache_dit.distributed.transformers.register", register)
        key = answered_by(transformer_class, table) if transformer_class else None
        if key is None:
            continue
        where, planner = table[key]
        file, _, line = where.rpartition(":")
        planners[kind] = f"'{key}' ({Path(file).name}:{line})"
        if this is not None:
            fallback = next((a for a in answers if this.qualname in a.written_for), answers[0] if answers else None)
            answers.append(verdict(kind, transformer_class, key, where,
                                   _planner_written_for(ws, Path(file), planner, this), this, fallback=fallback))
    adapter_answers = [a for a in answers if a.kind == "adapter"]
    if this is not None:  # the class itself, by module and name
        registered = any(this.qualname in a.written_for for a in adapter_answers)
    else:  # no class to compare: what the prefix matches' adapters assert, by name
        registered = bool(matches) and not (bool(transformer_class) and any(
            m.accepts and transformer_class not in m.accepts for m in matches))
    deferred = bool(adapter_answers) and all(a.deferred for a in adapter_answers)
    refused = next((a.why for a in adapter_answers if not a.deferred), None)
    cfg = separate_cfg_by_name(ws, pipeline_class) if pipeline_is_diffusers is not False else None
    return SupportNote("reported beside the analysis: the installed cache-dit's own adapter registry",
                       bool(adapters), registered, tuple(matches), refused or OMIT, planners if planners else OMIT,
                       deferred, tuple(answers), cfg or OMIT)


def separate_cfg_by_name(ws: Workspace, pipeline_class: str | None) -> Evidence | None:
    """Where the installed cache-dit turns separate CFG on for a pipeline by its class name: a prefix of it in
    `BlockAdapterRegister._predefined_adapters_has_separate_cfg` (a list of strings in the class body), which
    cache-dit consults where the adapter says False and the cache config leaves `enable_separate_cfg` unset. None
    where no listed name prefixes `pipeline_class`, or the list is not found."""
    if not pipeline_class or "." in pipeline_class:
        return None
    try:
        found = ws.locate_class("cache_dit", "BlockAdapterRegister")
    except InputError:
        return None
    for stmt in found.node.body.body if isinstance(found.node, cst.ClassDef) else ():
        for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
            if not (isinstance(small, (cst.Assign, cst.AnnAssign)) and isinstance(small.value, cst.List)):
                continue
            targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
            if not any(isinstance(t, cst.Name) and t.value == "_predefined_adapters_has_separate_cfg" for t in targets):
                continue
            for element in small.value.elements:
                name = element.value.evaluated_value if isinstance(element.value, cst.SimpleString) else None
                if isinstance(name, str) and name and pipeline_class.startswith(name):
                    return Evidence(str(found.src.path), found.src.line(element),
                                    f"cache-dit turns separate CFG on for a pipeline whose class name starts with "
                                    f"'{name}' (BlockAdapterRegister._predefined_adapters_has_separate_cfg) where the "
                                    "adapter says False and the cache config leaves enable_separate_cfg unset")
    return None


def _adapter_answers(ws: Workspace, adapters: dict[str, str], pipeline_class: str | None,
                     transformer_class: str | None, this: This | None, facts: TransformerFacts | None,
                     pipeline_is_diffusers: bool | None) -> list[BuiltinAnswer]:
    """The verdict on each adapter cache-dit answers a looked-up name with (the first registered prefix of it)."""
    if this is None:
        return []
    names = [transformer_class] if transformer_class else []
    if pipeline_class and pipeline_is_diffusers is not False and "." not in pipeline_class:
        names.insert(0, pipeline_class)
    out = []
    for name in dict.fromkeys(names):
        key = answered_by(name, adapters)
        if key is None:
            continue
        where = adapters[key]
        src, fn = _READ[where]
        written_for = tuple(dict.fromkeys(qualified(ws, src, fn, n, this) for n in _ACCEPTS.get(where) or ()))
        out.append(verdict("adapter", name, key, where, written_for, this,
                           bound=binding(adapter_configs(src, fn), facts)))
    return out


def _planner_written_for(ws: Workspace, path: Path, planner: str, this: This) -> tuple[str, ...]:
    """The classes a cache-dit planner asserts its transformer is (`planner_accepts`), qualified by its module's
    imports; () where it asserts none."""
    accepts = planner_accepts(path, planner)
    if accepts is None:
        return ()
    src = ws.load(path)
    return tuple(dict.fromkeys(qualified(ws, src, src.classes.get(planner), n, this) for n in accepts[0]))


def cache_defaults(ws: Workspace) -> CacheDefaults | None:
    """`Fn_compute_blocks` / `Bn_compute_blocks` defaults of cache-dit's `BasicCacheConfig`, read from the
    installed source (class-level `name: int = value`); None when the class or either default is not found."""
    from integrate.records import Evidence

    try:
        found = ws.locate_class("cache_dit", "BasicCacheConfig")
    except InputError:
        return None
    node, src = found.node, found.src
    values: dict[str, tuple[int, int]] = {}
    for stmt in node.body.body if isinstance(node, cst.ClassDef) else ():
        for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
            if (isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name)
                    and isinstance(small.value, cst.Integer)):
                values[small.target.value] = (int(small.value.evaluated_value), src.line(small))
    fn, bn = values.get("Fn_compute_blocks"), values.get("Bn_compute_blocks")
    if fn is None or bn is None:
        return None
    return CacheDefaults(fn[0], bn[0], Evidence(str(src.path), fn[1], f"cache-dit's default cache config: "
                                                                       f"Fn_compute_blocks={fn[0]}, "
                                                                       f"Bn_compute_blocks={bn[0]}"))


def ring_refuses_masks(ws: Workspace) -> Evidence | None:
    """Where cache-dit's native attention, asked for its log-sum-exp (ring attention merges partial results
    with it), raises on any `attn_mask`: an `if return_lse:` holding `if attn_mask is not None: raise`, read
    from the installed source. None when the module or the check is not there (another cache-dit)."""
    from integrate.records import Evidence

    src = _cache_dit_module(ws, "cache_dit.attention.backends.native")
    for fn in src.functions.values() if src is not None else ():
        for outer in find_all(fn, cst.If):
            if dotted(outer.test) != "return_lse":
                continue
            inner = _raising_if(outer.body, "attn_mask")
            if inner is not None:
                return Evidence(str(src.path), src.line(inner), "cache-dit's attention with log-sum-exp, which "
                                "ring attention runs, raises on any attention mask")
    return None


def cp_refuses_gqa(ws: Workspace) -> Evidence | None:
    """Where the installed cache-dit's templated context-parallel attention raises on `enable_gqa` when the call
    names no GQA strategy: an `if` testing `enable_gqa` whose body raises, read from its source. None when the
    module or the check is not there (a cache-dit that runs GQA under CP as it is)."""
    from integrate.records import Evidence

    src = _cache_dit_module(ws, "cache_dit.attention.backends.register")
    for fn in src.functions.values() if src is not None else ():
        branch = _raising_if(fn, "enable_gqa")
        if branch is not None:
            return Evidence(str(src.path), src.line(branch), "cache-dit's context-parallel attention raises on "
                            "`enable_gqa` unless the call names a GQA strategy (`cp_gqa_strategy`)")
    return None


def tp_requires_model_mixin(ws: Workspace) -> Evidence | None:
    """Where the installed cache-dit's tensor-parallel entry asserts that the transformer is a diffusers
    `ModelMixin` (`assert isinstance(transformer, ModelMixin)`, the class alone, not in a tuple with
    `torch.nn.Module`), read from its source: a plain torch module is refused there. None when not found (a
    cache-dit that takes any module)."""
    from integrate.records import Evidence

    src = _cache_dit_module(ws, "cache_dit.distributed.transformers.dispatch")
    for name, fn in src.functions.items() if src is not None else ():
        if "tensor" not in name and not name.endswith("_tp"):
            continue
        for check in find_all(fn, cst.Assert):
            test = check.test
            if (isinstance(test, cst.Call) and dotted(test.func) == "isinstance" and len(test.args) == 2
                    and (dotted(test.args[1].value) or "").rpartition(".")[2] == "ModelMixin"):
                return Evidence(str(src.path), src.line(check), "cache-dit's tensor parallelism asserts that the "
                                "transformer is a diffusers ModelMixin: a plain torch module is refused")
    return None


def cp_attention_classes(ws: Workspace) -> tuple[tuple[str, ...], Evidence] | None:
    """The diffusers classes whose modules' processors the installed cache-dit hands the parallel config when it
    enables context parallelism (it sets `processor._parallel_config` only on modules of these classes), read from
    the function that lists them (`get_diffusers_attention_classes`: the names it imports from diffusers), with
    where. None when not found."""
    from integrate.records import Evidence

    src = _cache_dit_module(ws, "cache_dit.distributed.core._diffusers_bridge")
    for name, fn in src.functions.items() if src is not None else ():
        if not name.endswith("attention_classes"):
            continue
        names = tuple(dict.fromkeys(
            a.name.value for imp in find_all(fn, cst.ImportFrom) if imp.module is not None
            and (dotted(imp.module) or "").split(".")[0] == "diffusers" and not isinstance(imp.names, cst.ImportStar)
            for a in imp.names if isinstance(a.name, cst.Name)))
        if names:
            return names, Evidence(str(src.path), src.line(fn), "cache-dit hands the parallel config only to the "
                                   f"processors of modules of diffusers' {', '.join(names)}")
    return None


def cp_local_backends(ws: Workspace) -> dict[str, Evidence]:
    """diffusers' attention backends that its dispatcher registers without context-parallel support: each
    `@_AttentionBackendRegistry.register(AttentionBackendName.<member>, ...)` not given
    `supports_context_parallel=True`, read from the installed diffusers' `attention_dispatch.py`. A processor
    that fixes one of them (`backend=AttentionBackendName.FLEX`) is not run as context-parallel attention by
    diffusers' dispatcher. {} when the module or its registrations are not found."""
    from integrate.records import Evidence

    root = ws.package_root("diffusers")
    path = ws.module_file(root, "diffusers.models.attention_dispatch") if root is not None else None
    src = ws.load(path) if path is not None else None
    out: dict[str, Evidence] = {}
    for fn in src.functions.values() if src is not None else ():
        for dec in fn.decorators:
            call = dec.decorator
            if not (isinstance(call, cst.Call) and (dotted(call.func) or "").endswith("Registry.register")
                    and call.args and call.args[0].keyword is None):
                continue
            head, _, member = (dotted(call.args[0].value) or "").rpartition(".")
            cp = next((a.value for a in call.args if a.keyword and a.keyword.value == "supports_context_parallel"),
                      None)
            if head.endswith("AttentionBackendName") and member and not (isinstance(cp, cst.Name)
                                                                           and cp.value == "True"):
                out[member] = Evidence(str(src.path), src.line(dec), f"diffusers registers its `{member}` attention "
                                       "backend without context-parallel support")
    return out


def _cache_dit_module(ws: Workspace, module: str):
    """The installed cache-dit's source of `module`, or None."""
    root = ws.package_root("cache_dit")
    path = ws.module_file(root, module) if root is not None else None
    return ws.load(path) if path is not None else None


def _raising_if(node: cst.CSTNode, name: str) -> cst.If | None:
    """The first `if` under `node` whose test reads `name` and whose body raises."""
    for branch in find_all(node, cst.If):
        if name in {n.value for n in find_all(branch.test, cst.Name)} and find_all(branch.body, cst.Raise):
            return branch
    return None


def planner_accepts(path: Path, class_name: str) -> tuple[tuple[str, ...], int] | None:
    """The transformer classes a cache-dit planner class insists on (`assert isinstance(transformer, (A, B))` in
    its methods), with the first such line: a planner cache-dit's registry hands out by name prefix may have been
    written for other models than the one asking. None when the file or class is not found, or the planner
    asserts no class (then nothing is claimed either way)."""
    from integrate.source import parse_source, read_text

    try:
        src = parse_source(path, read_text(path))
    except (OSError, InputError, cst.ParserSyntaxError):
        return None
    cls = src.classes.get(class_name)
    if cls is None:
        return None
    names: list[str] = []
    first = 0
    for fn in find_all(cls, cst.FunctionDef):
        params = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params)]
        model = "transformer" if "transformer" in params else None  # cache-dit's planners name it so
        for check in find_all(fn, cst.Assert) if model else ():
            for call in [check.test, *find_all(check.test, cst.Call)]:
                if not (isinstance(call, cst.Call) and dotted(call.func) == "isinstance" and len(call.args) == 2
                        and dotted(call.args[0].value) == model):
                    continue
                kinds = call.args[1].value
                elements = [e.value for e in kinds.elements] if isinstance(kinds, cst.Tuple) else [kinds]
                found = [(dotted(e) or "").rpartition(".")[2] for e in elements]
                if all(found):
                    names += found
                    first = first or src.line(check)
    return (tuple(dict.fromkeys(names)), first) if names else None
