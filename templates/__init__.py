"""Templates: the approved plan rendered into cache-dit code (jinja2, one template per artifact).

`build(plan, approval, analysis, ws, ...)` returns a `Generated` record: the modules with their roles,
the other files, notes, and what is left to do by hand. One function per artifact below decides what
goes into it from the typed plan; the `.j2` template next to this module writes it (templates read the
plan's JSON form, the same data a reviewer reads in plan.json). `checkout.py` writes the same modules
into a cache-dit source tree with libcst codemods; `forward_patch.py` rewrites a model's forward for
the PatchFunctor.

What the PatchFunctor changes is what the findings' rules ask (each finding carries its rule's fix record,
analyzers/fixes.py); a finding whose record the rewrite did not apply goes to the hand-written part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import libcst as cst
from integrate.analyzers.fixes import Manual
from integrate.analyzers.records import Analysis, BuiltinAnswer, Finding
from integrate.decisions import patch_findings
from integrate.decisions.cp import TEXT_STREAMS
from integrate.decisions.encoders import shards_layers
from integrate.decisions.matrix import rows as matrix_rows
from integrate.decisions.records import Approval, Plan

from integrate import __version__, escape
from integrate.errors import InputError
from integrate.records import OMIT, to_json
from integrate.resolve import Workspace
from integrate.source import SourceFile, find_method
from integrate.syntax import body_of, params_of, walk_statements

from .forward_patch import ForwardPatch, import_block, patch_forward
from .records import Generated, Piece

# Every `{{ ... }}` goes through integrate.escape: `finalize` refuses a plain string, so each insertion
# names where its value lands (py, ident, dotted, text, sh); see that module.
_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(Path(__file__).parent)),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    finalize=escape.finalize,
)
_ENV.filters.update(escape.FILTERS)
_ENV.filters["basename"] = lambda p: escape.text(Path(str(p)).name)


def camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[_\W]+", name) if part)


def render(template: str, **ctx: Any) -> str:
    """A template of this folder rendered with the escaping environment (a `.py.j2` result is checked to parse)."""
    return _render(template, **ctx)


def _render(template: str, **ctx: Any) -> str:
    text = _ENV.get_template(template).render(version=escape.Code(__version__), **ctx)
    text = re.sub(r"\n{3,}(?=\S)", "\n\n\n", text).rstrip() + "\n"
    if template.endswith(".py.j2"):
        escape.check_python(text, template.removesuffix(".j2"))
    return text


@dataclass
class _Build:
    """What the artifact functions add up, frozen into `Generated` at the end."""

    plan: Plan
    approval: Approval
    analysis: Analysis
    ws: Workspace
    src: SourceFile
    cls: cst.ClassDef
    functor_module: str
    import_name: str
    replace_builtin: bool = False
    stubs: bool = True
    native: bool = False  # written into cache-dit's own tree: registered the way its own code is
    pieces: list[Piece] = field(default_factory=list)
    extra: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    manual: list[str] = field(default_factory=list)
    registered: dict[str, str] = field(default_factory=dict)
    patch: ForwardPatch | None = None
    functor: dict | None = None
    manual_patch: dict | None = None  # the hand-written part of the PatchFunctor, as a stub with its contract

    def __post_init__(self) -> None:
        self.data = to_json(self.plan)  # what the templates read
        self.m = self.plan.model
        self.name = self.m.example_name
        self.base = camel(self.name)
        support = self.plan.already_supported
        sha = self.approval.plan_sha256
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise escape.UnsafeValue(f"the approval's plan_sha256 {sha[:80]!r} is not a SHA-256")
        # cache-dit's own adapter is deferred to only where the plan says so: written for this very class, its
        # block lists binding here (a plan older than analyze 1.16 has no verdicts: its `registered` stands)
        deferred = bool(support and (support.deferred or (support.registered and not support.answers)))
        # --replace-builtin: written as for a model cache-dit does not support, and registered over its own
        self.common = {"m": self.data["model"], "plan_sha": escape.Code(sha[:12]),
                       "supported": deferred and not self.replace_builtin,
                       "replace": self.replace_builtin, "native": self.native}

    def builtin(self, kind: str, name: str) -> BuiltinAnswer | None:
        """The plan's verdict on the registration of cache-dit's own that answers a lookup of `name` by prefix (the
        support note, read statically): `kind` adapter (`name`: a class cache-dit looks the adapter up by), cp or
        tp (the transformer's class). None where none answers, and always in a checkout, where the import order
        puts ours first."""
        support = self.plan.already_supported
        if self.native or support is None:
            return None
        return next((a for a in support.answers if a.kind == kind and a.name == name), None)

    def piece(self, role: str, module: str, symbol: str, template: str, **ctx: Any) -> None:
        self.pieces.append(Piece(role, module, symbol, _render(template, **ctx, **self.common)))


def build(plan: Plan, approval: Approval, analysis: Analysis, ws: Workspace, src: SourceFile, cls: cst.ClassDef,
          functor_module: str, import_name: str, replace_builtin: bool = False, checkout: bool = False) -> Generated:
    """`checkout`: the modules go into a cache-dit tree (templates/checkout.py): registered with `register`
    decorators as cache-dit's own are, and the hand-written parts listed as manual only (a plugin gets them as
    stubs with their contracts)."""
    b = _Build(plan, approval, analysis, ws, src, cls, functor_module, import_name, replace_builtin,
               stubs=not checkout, native=checkout)
    _patch_functor(b)
    adapter = _adapter(b)
    cp_cls = _cp_planner(b)
    tp_cls = _tp_planner(b)
    te_modules = _encoders(b)
    _example(b)
    _package(b, adapter, cp_cls, tp_cls, te_modules)
    return Generated(import_name, tuple(b.pieces), b.extra, tuple(dict.fromkeys(b.notes)),
                     tuple(dict.fromkeys(b.manual)), b.registered)


# -- cache --------------------------------------------------------------------------------------------


def _patch_functor(b: _Build) -> None:
    if not b.plan.cache.needs_patch_functor:
        return
    findings = patch_findings(b.analysis.transformer, {cl.attr for cl in b.plan.cache.block_lists})
    patch = patch_forward(b.ws, b.src, b.cls, b.analysis.transformer.block_lists,
                          tuple(dict.fromkeys(f.fix for f in findings if f.fix is not None)))
    applied = {c.fix for c in patch.changes}
    left = [f for f in findings if f.fix not in applied]
    b.manual += [f"{f.attr}: {f.message}" for f in left] + list(patch.unhandled)
    if patch.changes:
        b.patch = patch
        b.functor = {"cls": f"{b.base}PatchFunctor", "module": b.functor_module,
                     "why": "; ".join(c.text for c in patch.changes)}
        b.piece("patch_functor", "patch_functor", b.functor["cls"], "patch_functor.py.j2", patch=patch,
                functor=b.functor, imports=functor_imports(patch),
                fwd_line=b.src.line(find_method(b.cls, "forward")),
                from_diffusers=(b.src.dotted_name or "").split(".")[0] == "diffusers")
    if left and b.stubs:
        _manual_patch(b, left)


def functor_imports(patch: ForwardPatch) -> escape.Code:
    """The import block of the PatchFunctor module: what the patched functions read, and what `_apply` uses."""
    extra = [("cache_dit.caching.patch_functors.functor_base", "PatchFunctor")]
    if patch.splits:
        extra.append(("torch", "nn"))
    if patch.per_block or patch.after_block:
        extra.append(("functools", None))
    if patch.model_defaults:
        extra.append(("inspect", None))
    return import_block(list(patch.imports) + extra)


def _manual_patch(b: _Build, left: list[Finding]) -> None:
    """The findings no rewrite answers, as a stub with its contract (`manual_patch.py`, the one file meant for
    hand edits): the adapter calls it, verify reports `needs-code` while it is a stub."""
    fwd = find_method(b.cls, "forward")
    here = Path(b.m.transformer_file).name
    findings = [{"attr": f.attr, "rule": f.rule, "message": f.message,
                 "manual": f.fix.why if isinstance(f.fix, Manual) else "",  # the rule's word on why no rewrite
                 "evidence": [{"where": f"{Path(e.file).name}:{e.line}", "why": e.why} for e in f.evidence]
                 or ([{"where": f"{here}:{f.line}", "why": f"`{_statement_at(b.src, fwd, f.line)}`"}]
                     if f.line else [])}
                for f in left]
    signature = "(" + ", ".join(" ".join(b.src.code(p.with_changes(comma=cst.MaybeSentinel.DEFAULT)).split())
                                for p in params_of(fwd)) + ")" if fwd else "(...)"
    b.manual_patch = {"module": f"{b.import_name}.{MANUAL_MODULE}", "func": "apply_manual"}
    b.piece(MANUAL_MODULE, MANUAL_MODULE, "apply_manual", "manual_patch.py.j2", findings=findings,
            functor=b.functor, signature=signature, fwd_line=b.src.line(fwd) if fwd is not None else 0,
            import_name=b.import_name)
    b.notes.append(f"{MANUAL_MODULE}.py is a stub with its contract: write apply_manual (verify says needs-code "
                   "until then)")


def _statement_at(src: SourceFile, fwd: cst.FunctionDef | None, line: int) -> str:
    """The first line of the innermost statement of `fwd` that holds `line` (what a finding points at)."""
    holding = [s for s in (walk_statements(body_of(fwd)) if fwd is not None else ())
               if src.line(s) <= line <= src.last_line(s)]
    if not holding:
        return f"line {line}"
    inner = max(reversed(holding), key=src.line)  # statements nest: the one starting last is the innermost
    bare = inner.with_changes(leading_lines=()) if hasattr(inner, "leading_lines") else inner
    return src.code(bare).splitlines()[0][:100]


STUB_MARK = "NEEDS_CODE"
MANUAL_MODULE = "manual_patch"  # the plugin module of the hand-written part (and its piece's role)


def is_stub(text: str) -> bool:
    """A hand-written part still as generated: its module still assigns `NEEDS_CODE` at the top level (read
    with libcst; a file that does not parse is not a stub, it is the user's)."""
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError:
        return False
    return any(isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == STUB_MARK
                                                     for t in small.targets)
               for stmt in module.body if isinstance(stmt, cst.SimpleStatementLine) for small in stmt.body)


def _adapter(b: _Build) -> dict:
    """The BlockAdapter: its block lists, the class names cache-dit looks it up by, where the pipeline holds the
    transformer, the CFG style and why; written as the `adapter` piece where a block list has a ForwardPattern."""
    cache = b.plan.cache
    blocks = _adapter_blocks(b)
    p_cls = (b.m.pipeline_class or "").split(".")[0]
    p_src = b.ws.load(Path(b.m.pipeline_file)) if b.m.pipeline_file and not b.m.no_pipeline else None
    is_class = p_src is not None and p_cls in p_src.classes and "." not in (b.m.pipeline_class or "")
    # not a diffusers pipeline (the analysis's verdict: a sampler function, a reference repository's own class):
    # cache-dit cannot be handed it, and a registry entry under its short names (`Flux`, `Sampler`) would lose to
    # a built-in one or claim other models; the adapter is transformer-only, given to `enable_cache` by the caller
    third_party = not b.m.no_pipeline and getattr(b.analysis.pipeline, "diffusers_pipeline", None) is False
    # transformer-only: cache-dit looks the adapter up by the transformer's class name
    prefix = b.m.transformer_class if b.m.no_pipeline else p_cls.removesuffix("Pipeline")
    cfg_why = _cfg_why(b)
    # cache-dit looks a transformer alone (`enable_cache(transformer)`, verify's proofs) up by its own class name:
    # where that does not start with the pipeline's prefix (Kandinsky6TI2VAPipeline, Kandinsky6Transformer3DModel),
    # the adapter is registered under both (only for a pipeline class: a third-party loop's short class names,
    # `Flux`, would claim other models)
    also = b.m.transformer_class if is_class and not third_party and \
        not b.m.transformer_class.startswith(prefix) else None
    holder, holder_at = _holder(b, is_class)
    adapter = {
        "holder": holder,
        "holder_at": holder_at,
        "prefix": None if third_party else prefix, "also": also, "func": f"{b.name}_adapter", "blocks": blocks,
        # the class name cache-dit looks the adapter up by (a pipeline's, or the transformer's alone)
        "lookup": b.m.transformer_class if b.m.no_pipeline else p_cls,
        "third_party": third_party,
        "has_separate_cfg": bool(cache.has_separate_cfg), "cfg_why": cfg_why,
        "check_forward_pattern": all(x.check_forward_pattern for x in cache.block_lists),
        "check_why": "cache-dit's name/annotation check cannot read these blocks (see the plan's cache section)",
        # cache-dit's own adapters check the class they were written for (`_relaxed_assert`); only where the
        # transformer's module has an import name
        "assert_module": b.src.dotted_name,
    }
    adapter["keys"] = _adapter_keys(b, adapter)
    adapter["ahead"] = any(k["ahead"] for k in adapter["keys"])
    adapter["cfg_by_name"] = _cfg_by_name(b, third_party)
    if blocks:
        b.piece("adapter", "adapter", adapter["func"], "adapter.py.j2", adapter=adapter, functor=b.functor,
                manual_patch=b.manual_patch,
                imports=import_block(_adapter_imports(b, third_party), (b.import_name,)))
        _adapter_registered(b, adapter)
    return adapter


def _cfg_by_name(b: _Build, third_party: bool) -> str | None:
    """What to say where cache-dit turns separate CFG on for this pipeline by its class name while ours says it
    batches CFG (a built-in prefix in its list, which no registration of ours overrides); None otherwise."""
    support = b.plan.already_supported
    said = support.separate_cfg_by_name if support is not None else OMIT
    if said is OMIT or third_party or b.common["supported"] or b.plan.cache.has_separate_cfg is not False:
        return None
    return (f"{said.why} ({Path(said.file).name}:{said.line}): this pipeline batches CFG, so pass "
            "enable_separate_cfg=False in the cache config (DBCacheConfig(enable_separate_cfg=False))")


def _adapter_keys(b: _Build, adapter: dict) -> list[dict]:
    """The names the plugin registers the adapter under: the pipeline's prefix and the transformer's own class name
    where that prefix does not cover it, each with the plan's verdict where a built-in of cache-dit's answers it
    (`ahead`: why ours goes ahead of it). A name a built-in answers is registered as the full class name looked up,
    never a shorter prefix: put first in the registry, a prefix would answer for cache-dit's other models. The
    transformer looked up alone (`enable_cache(transformer)`, verify's proofs) gets its own name where a built-in
    answers it and no name of ours ahead covers it."""
    named = [(adapter["prefix"], adapter["lookup"], False), (adapter["also"], adapter["also"], True)]
    keys = [{"name": n, "lookup": lookup, "also": also, "ahead": None} for n, lookup, also in named if n]
    if adapter["third_party"] or b.common["supported"] or b.native or b.replace_builtin:
        return keys
    for key in keys:
        answer = b.builtin("adapter", key["lookup"])
        if answer is not None:
            key.update(name=key["lookup"], ahead=answer.why)
    alone = b.m.transformer_class
    answer = b.builtin("adapter", alone)
    if answer is not None and not any(alone.startswith(k["name"]) for k in keys if k["ahead"]):
        keys = [k for k in keys if k["name"] != alone] + [{"name": alone, "lookup": alone, "also": True,
                                                           "ahead": answer.why}]
    return keys


def _adapter_blocks(b: _Build) -> list[dict]:
    """The adapter's block lists: each cached list, then the second walks the PatchFunctor splits off it; lists
    without a ForwardPattern, and a second model in the denoising loop, are left to hand work."""
    blocks = []
    for bl in b.plan.cache.block_lists:
        blocks.append({"attr": bl.attr, "pattern": bl.forward_pattern, "note": ""})
        for s in b.patch.splits if b.patch is not None else ():
            if s.attr == bl.attr and s.new_attr != bl.attr:
                blocks.append({"attr": s.new_attr, "pattern": bl.forward_pattern,
                               "note": f"a second walk over `{bl.attr}`, split off by the PatchFunctor"})
    if any(x["pattern"] is None for x in blocks):
        b.manual.append("a block list has no ForwardPattern in the plan: the adapter cannot be written for it")
        blocks = [x for x in blocks if x["pattern"] is not None]
    if not blocks:
        b.manual.append("no block list with a ForwardPattern: no BlockAdapter written")
    b.manual += [f"a second model in the denoising loop: {e.why} ({Path(e.file).name}:{e.line})"
                 for e in b.analysis.pipeline.other_models]
    return blocks


def _cfg_why(b: _Build) -> str:
    """Why the adapter's has_separate_cfg says what it says: a reviewer's override, the pipeline's loop as read, or
    the CFG style declared for a transformer alone; unknown is left to a reviewer, never guessed."""
    cache = b.plan.cache
    style = "calls the transformer separately for CFG" if cache.has_separate_cfg else "batches CFG in one call"
    if any(o.key == "cache.has_separate_cfg" for o in b.plan.overrides):
        return f"the reviewer's override: the caller {style}"
    if cache.has_separate_cfg is None:
        b.manual.append("has_separate_cfg is unknown: the adapter keeps cache-dit's default (False) until a reviewer "
                        "sets it (`integrate revise <plan> --set cache.has_separate_cfg=true|false --why ...`)")
        return ("unknown (see the plan's cache section): cache-dit's default False stands until a reviewer sets "
                "cache.has_separate_cfg with integrate revise")
    if b.m.no_pipeline:
        return f"declared with --separate-cfg {'yes' if cache.has_separate_cfg else 'no'}: the caller {style}"
    return f"the pipeline's denoising loop {style} (confidence {cache.cfg_confidence})"


def _holder(b: _Build, is_class: bool) -> tuple[str | None, str]:
    """(the pipeline's attribute that holds the transformer, where its __init__ sets it) where that is not
    `transformer`, diffusers' convention; else (None, ""). A transformer looked up alone comes in cache-dit's
    stand-in pipeline, which holds it as `transformer`."""
    pipe_facts = b.analysis.pipeline
    holder = pipe_facts.transformer_attr if pipe_facts is not None else None
    if holder is None and is_class:  # a sampler function holds nothing: the transformer is looked up alone
        b.notes.append(f"where {b.m.pipeline_class} holds the transformer is not read from its __init__: the adapter "
                       "reads `pipe.transformer`, diffusers' convention")
    if holder in (None, "transformer"):
        return None, ""
    at = pipe_facts.transformer_attr_at
    return holder, f"{Path(at.file).name}:{at.line}" if at is not None else ""


def _adapter_imports(b: _Build, third_party: bool) -> list[tuple[str, str | None]]:
    """What the adapter module imports: cache-dit's BlockAdapter and ForwardPattern, its registry where the plugin
    registers the adapter, and the PatchFunctor or hand-written patch it hands over."""
    imports = [("cache_dit.caching.block_adapters.block_adapters", "BlockAdapter"),
               ("cache_dit.caching.forward_pattern", "ForwardPattern")]
    if third_party:
        imports.append(("torch", None))
    elif not b.common["supported"]:  # registered only when cache-dit's own adapter does not accept the model
        imports.append(("cache_dit.caching.block_adapters.block_registers", "BlockAdapterRegister"))
        if not b.native and not b.replace_builtin:  # says so where a built-in name answers first
            imports.append(("logging", None))
    if b.functor:
        imports.append((b.functor["module"], b.functor["cls"]))
    if b.manual_patch:
        imports.append((b.manual_patch["module"], b.manual_patch["func"]))
    return imports


def _adapter_registered(b: _Build, adapter: dict) -> None:
    """The names the plugin registers the adapter under (`_adapter_keys`), with a note for every one it puts ahead of
    a built-in, and for a model the plugin registers nothing for (a third-party loop, a model whose own adapter in
    cache-dit is deferred to)."""
    if adapter["third_party"]:
        b.notes.append(f"{b.m.pipeline_class} is not a diffusers pipeline: the adapter is transformer-only and "
                       f"registered nowhere; hand it to cache-dit yourself: "
                       f"`cache_dit.enable_cache({adapter['func']}(model), ...)`")
        return
    if b.common["supported"]:
        b.notes.append(f"cache-dit's own adapter was written for {b.m.transformer_class}, this very class, and its "
                       "block lists bind here: the plugin registers no adapter over it, and its planners only where "
                       "cache-dit has none written for it")
        return
    for key in adapter["keys"]:
        if key["ahead"]:
            b.notes.append(f"{key['ahead']} (the plugin registers it as {key['name']} through cache-dit's public "
                           "API, then moves it to the front of the registry's table, BlockAdapterRegister._adapters, "
                           "where the public API cannot put it)")
    if adapter["keys"]:
        b.registered["adapter"] = ", ".join(k["name"] for k in adapter["keys"])
    if adapter["cfg_by_name"]:
        b.notes.append(adapter["cfg_by_name"])


# -- parallelism ------------------------------------------------------------------------------------


def _planner_ahead(b: _Build, kind: str) -> str | None:
    """Why ours goes ahead of the CP / TP planner of cache-dit's that answers the transformer's class name by prefix
    (the plan's verdict: not written for this very class); None where none answers or it is deferred to."""
    answer = b.builtin(kind, b.m.transformer_class)
    return answer.why if answer is not None and not answer.deferred else None


def _planner_registered(b: _Build, kind: str, cls: str, hand_over: str) -> bool:
    """Record a CP / TP planner as registered under the transformer's class name: where no name of cache-dit's
    answers for it, or ahead of the built-in that does but was not written for this class (a note says why). A
    built-in written for this very class stays in charge (a note says so, and how to hand ours over)."""
    answer = b.builtin(kind, b.m.transformer_class)
    if answer is None or not answer.deferred:
        b.registered[f"{kind}_planner"] = b.m.transformer_class
        if answer is not None:
            table = "_cp_planner_registry" if kind == "cp" else "_tp_planner_registry"
            register = "ContextParallelismPlannerRegister" if kind == "cp" else "TensorParallelismPlannerRegister"
            b.notes.append(f"{answer.why} (the plugin registers {cls} as {b.m.transformer_class} through cache-dit's "
                           f"public API, then moves it to the front of the registry's table, {register}.{table}, "
                           "where the public API cannot put it)")
        return True
    where = answer.evidence[0] if answer.evidence else None
    at = f" ({Path(where.file).name}:{where.line})" if where is not None else ""
    b.notes.append(f"cache-dit's {kind.upper()} planner registered as '{answer.key}'{at} answers "
                   f"{b.m.transformer_class}: it stays in charge, and {cls} is not registered"
                   + ("" if b.common["supported"] else f" (it was written for this very class); {hand_over}"))
    return False


def _cp_planner(b: _Build) -> str | None:
    cp = b.plan.parallelism.cp
    if not cp.plan:
        return None
    if cp.blocked_by:  # a planner that fails at run time is worse than none: cache-dit then says CP is unsupported
        b.manual += [f"CP not written: {e.why} ({Path(e.file).name}:{e.line})" for e in cp.blocked_by]
        return None
    cp_cls = f"{b.base}ContextParallelismPlanner"
    mask = _mask_context(b.plan) if cp.mask_reorder.needed else None
    if cp.mask_reorder.needed and mask is None:
        b.manual.append("the mask reorder needs a joint (two-stream) block list: none found")
    evidence = [f"{e.why} ({Path(e.file).name}:{e.line})" for e in cp.evidence][:12]
    # a plain torch module (bases traced, no ModelMixin): cache-dit is handed the plan, not asked to look it up
    unregistered = b.plan.facts.model_mixin is False
    imports = [("cache_dit.distributed.core", "_ContextParallelInput"),
               ("cache_dit.distributed.core", "_ContextParallelOutput"),
               ("cache_dit.distributed.transformers.register", "ContextParallelismPlanner")]
    if not unregistered:
        imports.append(("cache_dit.distributed.transformers.register", "ContextParallelismPlannerRegister"))
        if not b.native and (not b.common["supported"] or _planner_ahead(b, "cp")):  # the warning where a name of
            imports.append(("logging", None))  # cache-dit's answers first
    if mask:
        imports += [("inspect", None), ("torch", None), ("torch.distributed as dist", None)]
    if cp.run_whole:
        imports += [("inspect", None), ("torch", None), ("torch.distributed as dist", None)]
    if cp.sdpa_mend:
        imports += [("contextvars", None), ("importlib", None), ("types", None),
                    ("cache_dit.attention", "_dispatch_attention_fn")]
    if cp.kv_expand or cp.mask_mend:
        imports += [("functools", None), ("importlib", None), ("inspect", None)]
    if cp.mask_mend:
        imports += [("torch", None), ("torch.distributed as dist", None)]
    moved = _patched_keys(b.plan, b.patch)
    if moved:
        imports.append((b.functor_module, "walk_starts"))
    data = b.data["parallelism"]["cp"]
    b.piece("cp_planner", "cp_planner", cp_cls, "cp_planner.py.j2", cp=data, plan=data["plan"], mask=mask,
            evidence=evidence, patched_keys=moved, parts=_parts(b.patch), lengths=_rebased(cp, moved),
            imports=import_block(imports, (b.import_name,)), cp_prefix=b.m.transformer_class, cp_cls=cp_cls,
            cp_ahead=_planner_ahead(b, "cp"),
            unregistered=unregistered, local_attention=list(cp.local_attention), run_whole=_run_whole(cp),
            hand_config=[escape.module_path(x) for x in cp.hand_config],
            kv_expand=[(str(escape.dotted(x.module)), str(escape.ident(x.function))) for x in cp.kv_expand],
            mask_mend=[(str(escape.dotted(x.module)), str(escape.ident(x.function))) for x in cp.mask_mend],
            mask_prepared=[p for x in cp.mask_mend for p in x.prepared],
            sdpa_mend=[(str(escape.dotted(x.module)), str(escape.ident(x.alias)), list(x.attentions))
                       for x in cp.sdpa_mend],
            module_dicts=[str(escape.ident(bl.attr)) for bl in b.analysis.transformer.block_lists
                          if bl.container == "ModuleDict of ModuleList"
                          and any(k.startswith(bl.attr + ".") for k in cp.plan)])
    if unregistered:
        b.notes.append(f"{b.m.transformer_class} is no diffusers model: the CP planner is registered nowhere (a "
                       "short class name would answer for cache-dit's own models by prefix); hand its plan over: "
                       f"`config.cp_plan = {cp_cls}().apply(transformer=model, parallelism_config=config)`")
    elif not _planner_registered(b, "cp", cp_cls, "hand its plan over: `config.cp_plan = "
                                 f"{cp_cls}().apply(transformer=model, parallelism_config=config)`"):
        pass
    if cp.rope_drift_fix.needed:
        b.manual.append("RoPE drift fix: positions are computed from a local length after a root split")
    if any("{" in k for k in cp.plan):
        b.manual.append("a CP hook key has an index not known statically: " + ", ".join(k for k in cp.plan if "{" in k))
    return cp_cls


def _run_whole(cp) -> dict:
    """RUN_WHOLE for the planner: {path: ({input name: (axis, rank)}, {output index: (axis, rank)})}; names are
    checked as identifiers (they are keys the hook binds by)."""
    for path, w in cp.run_whole.items():
        escape.module_path(path)
        if not all(index.isdigit() for index in w.split):
            raise escape.UnsafeValue(f"run_whole[{path!r}]: an output index is not a number")
    return {path: ({str(escape.ident(name)): (g.gather_dim, g.expected_dims) for name, g in w.gather.items()},
                   {int(index): (s.split_dim, s.expected_dims) for index, s in w.split.items()})
            for path, w in cp.run_whole.items()}


def _tp_planner(b: _Build) -> str | None:
    tp = b.plan.parallelism.tp
    if not tp.block_lists:
        return None
    if tp.blocked_by:  # cache-dit would refuse the model before any planner ran
        e = tp.blocked_by[0]
        # a fact of cache-dit, not a part left to write: said, and verify reports TP skipped for it
        b.notes.append(f"TP not written: {e.why} ({Path(e.file).name}:{e.line})")
        return None
    tp_cls = f"{b.base}TensorParallelismPlanner"
    rearrange, norms, chunked = _joined_inputs(b.plan), distributed_norms(b.plan), chunked_outputs(b.plan)
    scan = any(x.shard_div_attr for x in tp.block_lists)  # attention modules whose q/k norms are measured
    rope = {x.attr: dict(x.rope_shard) for x in tp.block_lists if x.rope_shard}
    imports = [("logging", None)] + ([("torch", None)] if rearrange or scan or chunked or rope else [])
    if rope:
        imports.append(("inspect", None))
    imports += [("cache_dit.distributed.utils", "shard_div_attr"),
                ("cache_dit.distributed.transformers.register", "TensorParallelismPlanner"),
                ("cache_dit.distributed.transformers.register", "TensorParallelismPlannerRegister"),
                ("torch.distributed.tensor", "Replicate")] + [
                ("torch.distributed.tensor.parallel", n) for n in
                ("ColwiseParallel", "RowwiseParallel", "parallelize_module")]
    b.piece("tp_planner", "tp_planner", tp_cls, "tp_planner.py.j2", tp=b.data["parallelism"]["tp"],
            imports=import_block(imports), parts=_parts(b.patch), rearrange=rearrange, norms=norms, scan=scan,
            chunked=chunked, rope=rope,
            tp_prefix=b.m.transformer_class, tp_cls=tp_cls, tp_ahead=_planner_ahead(b, "tp"))
    _planner_registered(b, "tp", tp_cls, "cache-dit's TP takes planners from its registry only: write it into a "
                        "checkout (--mode checkout); verify hands it over to prove it")
    for k in tp.patch_kernels_first:
        b.notes.append(f"check before TP: {k.why} ({Path(k.file).name}:{k.line})")
    for x in tp.block_lists:
        if x.strategy == "fused-weight rearrangement" and not rearrange.get(x.attr):
            b.manual.append(f"`{x.attr}`: a fused QKV+MLP projection needs its rows reordered before "
                            "sharding; the template rearranges joined inputs of row-wise Linears only")
    return tp_cls


def _encoders(b: _Build) -> list[str]:
    """TE-P planners written from a text encoder's HF layer plan; VAE-P noted (not generated)."""
    te_modules = []
    for te, data in zip(b.plan.text_encoders, b.data["text_encoders"]):
        if te.planner == "generate" and shards_layers(te.tp_plan):
            te_cls = f"{camel(te.cls)}TensorParallelismPlanner"
            ahead = _te_ahead(te)
            if ahead and b.native and te.registered_as == te.cls:
                b.manual.append(f"{te.component} `{te.cls}`: the plan asks for our TE-P planner, and cache-dit "
                                f"registers its own under this very name ({te.supported_by}); a checkout cannot "
                                "register the name twice: take cache-dit's registration out by hand, or use a plugin")
                continue
            module = escape.ident(f"te_{te.component}")
            source = te.tp_plan_source
            imports = [("logging", None)] * (not b.native) + [
                       ("cache_dit.distributed.text_encoders.register", n) for n in
                       ("TextEncoderTensorParallelismPlanner", "TextEncoderTensorParallelismPlannerRegister")] + [
                       ("torch.distributed.tensor", "Replicate")] + [
                       ("torch.distributed.tensor.parallel", n) for n in
                       ("ColwiseParallel", "RowwiseParallel", "parallelize_module")]
            b.piece("te_planner", module, te_cls, "te_planner.py.j2", imports=import_block(imports),
                    te={**data, "source": f"{Path(source.file).name}:{source.line}"},
                    plans=_te_layer_plans(te.tp_plan), te_cls=te_cls, te_ahead=None if b.native else ahead)
            b.registered[f"te_planner:{te.component}"] = te.cls  # ahead of any registration that answers te.cls
            if ahead:
                b.notes.append(f"{te.component} `{te.cls}`: {ahead} (the plugin registers {te_cls} as {te.cls}, then "
                               "moves it to the front of TextEncoderTensorParallelismPlannerRegister."
                               "_text_encoder_tp_planner_registry, where the public API cannot put it)")
            te_modules.append(module)
        elif te.planner == "reuse":
            b.notes.append(f"{te.component} `{te.cls}`: TE-P already supported by cache-dit")
        else:
            b.manual.append(f"{te.component} `{te.cls}`: no TE-P planner and no HF layer plan to write one from"
                            + (f" (its plan shards no layer: {', '.join(te.tp_plan)})" if te.tp_plan else ""))
    vae = b.plan.vae
    if vae and vae.supported:
        b.notes.append(f"VAE `{vae.cls}`: VAE-P already supported by cache-dit")
    elif vae and vae.supported is False:
        written = _vae_planner(b, vae)
        if written:
            b.notes.append(f"VAE `{vae.cls}`: {written}")
    return te_modules


def _vae_planner(b: _Build, vae) -> str | None:
    """A VAE-P planner for a VAE cache-dit does not register (see `vae_planner`): what it wrote, or None (then
    manual, with the line and why)."""
    made = vae_planner(b.ws, vae, native=b.native, plan_sha=b.common["plan_sha"])
    if isinstance(made, str):
        b.manual.append(f"VAE-P for `{vae.cls}`: no planner generated: {made}")
        return None
    planner_cls, text, said = made
    b.pieces.append(Piece("vae_planner", "vae_planner", planner_cls, text))
    b.registered["vae_planner"] = vae.cls
    return said


def vae_planner(ws: Workspace, vae, native: bool = False, plan_sha: str = "") -> tuple[str, str, str] | str:
    """(planner class, module text, what it is) of the VAE-P planner for `vae` (a VaeFacts / VaePlan of a VAE cache-dit
    does not register): the registered base's planner under the VAE's exact name, or one dealing the tiles of its own
    tiled_decode (templates/vae_tiles.py); else why none is written, with the line."""
    from .vae_tiles import rewrite

    tiles, reuse, cls = vae.tiles, vae.reuse, escape.ident(vae.cls)
    planner_cls = f"{camel(cls)}DataParallelismPlanner"
    register = ("cache_dit.distributed.autoencoders.register", "AutoEncoderDataParallelismPlannerRegister")
    common = {"vae": {"class": cls}, "native": native, "plan_sha": escape.Code(escape.text(plan_sha))}
    if reuse is not None:
        if planner_cls == reuse.planner:
            planner_cls = f"{camel(cls)}SubclassDataParallelismPlanner"
        imports = [("logging", None)] * (not native) + [register, (escape.dotted(reuse.module), reuse.planner)]
        text = _render("vae_planner.py.j2", imports=import_block(imports), reuse=to_json(reuse),
                       planner_cls=planner_cls, base_cls=reuse.planner, source="", changes=[],
                       tiled_decode=escape.Code(""), **common)
        return planner_cls, text, f"VAE-P planner: cache-dit's {reuse.planner} (written for {reuse.base}) " \
                                  f"registered under {cls}"
    if tiles is None or not tiles.understood or tiles.source is None or tiles.loop is None:
        e = tiles.loop if tiles is not None else None
        return f"{e.why} ({Path(e.file).name}:{e.line})" if e else "; ".join(vae.notes[-1:]) or "no tiled_decode read"
    where = f"{Path(tiles.source.file).name}:{tiles.source.line}"
    try:
        src = ws.load(Path(tiles.source.file))
        fn = next((f for c in src.classes.values() for f in body_of(c)
                   if isinstance(f, cst.FunctionDef) and f.name.value == "tiled_decode"
                   and src.line(f) == tiles.source.line), None)
        if fn is None:
            raise escape.UnsafeValue(f"no tiled_decode at {where} any more")
        dealt = rewrite(src, fn, tiles)
    except (escape.UnsafeValue, InputError) as exc:
        return f"{exc} ({where})"
    imports = [("logging", None)] * (not native) + [
        ("types", None), ("torch", None), register,
        ("cache_dit.distributed.autoencoders.register", "AutoEncoderDataParallelismPlanner"),
        ("torch.distributed", "init_device_mesh"), *dealt.imports]
    text = _render("vae_planner.py.j2", imports=import_block(imports), reuse=None, planner_cls=planner_cls,
                   base_cls="AutoEncoderDataParallelismPlanner", source=f"{tiles.source.why}, {where}",
                   changes=list(dealt.changes), tiled_decode=dealt.code, **common)
    return planner_cls, text, (f"VAE-P planner written from {tiles.source.why} ({Path(tiles.loop.file).name}:"
                               f"{tiles.loop.line}): tiles dealt to ranks round robin, gathered before the blend")


# -- CLI example, launcher, test matrix, the package --------------------------------------------------


def _example(b: _Build) -> None:
    m = b.m
    if m.no_pipeline:
        b.notes.append("no CLI example and no GPU test matrix: a transformer-only integration (--no-pipeline) has "
                       "no pipeline for cache-dit's generate CLI to load; drive the transformer with "
                       "cache_dit.enable_cache(transformer) (the adapter is registered under its class name)")
        return
    pipeline_cls = m.pipeline_class.split(".")[0]
    p_src = b.ws.load(Path(m.pipeline_file)) if m.pipeline_file else None
    if p_src is not None and pipeline_cls in p_src.classes and p_src.dotted_name:
        ex = b.plan.example
        inputs = list(b.plan.example_inputs)
        for i in inputs:
            escape.ident(i.name)
        imports = [("argparse", None), ("os", None), (p_src.dotted_name, pipeline_cls)] + [
            ("cache_dit._utils.registers", n) for n in
            ("Example", "ExampleInitConfig", "ExampleInputData", "ExampleRegister", "ExampleType")]
        if inputs:
            imports.insert(0, ("ast", None))
        # a folder of this machine means nothing on another (a plugin is shared, a checkout merged): the default is
        # the hub id the folder is a snapshot of, else none and the variable must be set
        default = hub_id(m.model_path)
        if default is None:
            b.notes.append(f"no hub id is known for {m.model_path or 'the model'}: the example has no default "
                           f"model and reads ${m.env_var} (export {m.env_var}=<the model folder>)"
                           + ("; _env_path_mapping is left unchanged" if not b.stubs else ""))
        b.piece("example", "example", f"{b.name}_example", "example.py.j2", imports=import_block(imports),
                default_path=default, task_type=m.example_type_guess, pipeline_cls=pipeline_cls,
                example_func=f"{b.name}_example",
                prompt=ex is None or ex.prompt, inputs=inputs,
                input_table={i.name: (i.flag, i.kind) for i in inputs})
        b.registered["example"] = b.name
        if inputs:
            b.notes.append(f"the example needs {', '.join(i.flag + ' PATH' for i in inputs)}: {pipeline_cls}.__call__ "
                           f"requires {', '.join(f'`{i.name}`' for i in inputs)} (the GPU matrix reads them from "
                           f"{', '.join('$' + i.env_var for i in inputs)})")
    else:
        b.notes.append(f"no CLI example: `{pipeline_cls}` is not a pipeline class cache-dit's generate CLI can "
                       "load (drive the model with cache_dit.enable_cache directly)")


def _package(b: _Build, adapter: dict, cp_cls: str | None, tp_cls: str | None, te_modules: list[str]) -> None:
    plan, import_name = b.plan, b.import_name
    task = b.m.example_type_guess
    if not b.m.no_pipeline:  # the matrix runs the example through cache-dit's generate CLI
        b.extra["test_matrix.sh"] = _render(
            "test_matrix.sh.j2", import_name=import_name, rows=matrix_rows(plan),
            ext="mp4" if "V" in (task or "") else "png",
            inputs=list(plan.example_inputs) if "example" in b.registered else [],
            default_model=hub_id(b.m.model_path), **b.common)
    contents = [f"{p.role}: `{p.symbol}` ({p.module}.py)" for p in b.pieces]
    modules = sorted(["_activate"] + [p.module for p in b.pieces])
    activate = [("cache_dit.distributed.transformers.planners", "_activate_cp_planners"),
                ("cache_dit.distributed.transformers.planners", "_activate_tp_planners")]
    if te_modules:
        activate.append(("cache_dit.distributed.text_encoders.planners", "_activate_text_encoder_tp_planners"))
    vae = "vae_planner" in b.registered
    if vae:
        activate.append(("cache_dit.distributed.autoencoders.planners", "_activate_auto_encoder_dp_planners"))
    b.extra[f"{import_name}/_activate.py"] = _render("activate.py.j2", te_modules=te_modules, vae=vae,
                                                     imports=import_block(activate), **b.common)
    b.extra[f"{import_name}/__init__.py"] = _render(
        "plugin_init.py.j2", contents=contents, package_imports=_package_imports(modules), approval=b.approval,
        modules=modules, import_name=import_name, adapter=adapter, cp_cls=cp_cls, cp_module="cp_planner",
        cp_unregistered=b.plan.facts.model_mixin is False,
        tp_cls=tp_cls, tp_module="tp_planner", te_modules=te_modules, **b.common)
    inputs = list(b.plan.example_inputs) if "example" in b.registered else []
    launcher = import_block([("cache_dit._utils", "entrypoint")] + (
        [("sys", None), (f"{import_name}.example", "take_inputs")] if inputs else [(import_name, None)]),
        (import_name,))
    b.extra[f"{import_name}/__main__.py"] = _render("launcher.py.j2", import_name=import_name, imports=launcher,
                                                    inputs=inputs, **b.common)


# -- what the planners need from the plan and the patch -----------------------------------------------


def _parts(patch: ForwardPatch | None) -> dict[str, list[str]]:
    """{list: [lists the PatchFunctor splits off it]}: planners must cover those blocks too."""
    out: dict[str, list[str]] = {}
    for split in patch.splits if patch else ():
        if split.new_attr != split.attr:
            out.setdefault(split.attr, []).append(split.new_attr)
    return out


def _rebased(cp, moved: dict) -> dict[str, int]:
    """The planned lengths of the lists whose hook keys the planner re-bases at run time (those the
    PatchFunctor moves are placed by `_moved_keys` instead)."""
    keys = [k for k in cp.plan if k not in moved]
    return {attr: n for attr, n in cp.lengths.items() if any(k.startswith(attr + ".") for k in keys)}


def _patched_keys(plan: Plan, patch: ForwardPatch | None) -> dict[str, tuple[str, int]]:
    """CP keys naming a block the PatchFunctor moves: `blocks.36` -> (`blocks_2`, 0)."""
    if not patch or not patch.splits:
        return {}
    walks: dict[str, list[tuple[int, int]]] = {}
    for lf in plan.facts.sequence.lists if plan.facts.sequence else ():
        if lf.offset is not None and lf.last is not None:
            walks.setdefault(lf.attr, [])
            if (lf.offset, lf.last) not in walks[lf.attr]:
                walks[lf.attr].append((lf.offset, lf.last))
    names: dict[str, list[str]] = {}
    for split in patch.splits:
        names.setdefault(split.attr, []).append(split.new_attr)
    out: dict[str, tuple[str, int]] = {}
    for key in plan.parallelism.cp.plan:
        attr, _, rest = key.rpartition(".")
        if not rest.isdigit() or attr not in names:
            continue
        index = int(rest)
        for (first, last), new in zip(sorted(walks.get(attr, [])), names[attr]):
            if first <= index <= last and new != attr:
                out[key] = (new, index - first)
    return out


def _mask_context(plan: Plan) -> dict | None:
    cp = plan.parallelism.cp
    seq = plan.facts.sequence
    lists = [lf for lf in (seq.lists if seq else ()) if len(lf.streams) > 1
             and any(i.role == "mask" for i in lf.inputs)]
    in_dict = False
    if lists:
        first = lists[0]
        mask_param = next(i.param for i in first.inputs if i.role == "mask")
        text = None  # the cache plan's encoder stream, below
    else:
        # a text split at every block that the attention joins to the block's own keys, the mask passed as
        # itself or inside a keyword dict forward builds (NucleusMoE's attention_kwargs)
        lists = [lf for lf in (seq.lists if seq else ()) if any(
            a.block_list == lf.attr and a.joins_at is not None for a in plan.facts.attention)
            and any(p in cp.plan.get(f"{lf.attr}.*", {}) for p in TEXT_STREAMS)]
        if not lists:
            return None
        first = lists[0]
        texts = [p for p in cp.plan[f"{first.attr}.*"] if p in TEXT_STREAMS]
        holder = next((i.param for i in first.inputs if i.role == "mask"), None)
        if holder is None:
            holder = next((i.param for i in first.inputs if "kwargs" in i.param and i.producer_kind == "expression"),
                          None)
            in_dict = holder is not None
        if holder is None:
            return None
        mask_param, text = holder, texts[0]
    roles = next((b.roles for b in plan.cache.block_lists if b.attr == first.attr), {})
    text = text or roles.get("encoder_hidden_states", "encoder_hidden_states")
    image = roles.get("hidden_states", "hidden_states")
    image_first = _image_first(plan, first.attr)
    return {
        "param": mask_param,
        "in_dict": in_dict,
        "first": image if image_first else text,
        "second": text if image_first else image,
        "order_why": ("the attention processor concatenates image before text" if image_first else
                      "the attention processor concatenates text before image" if image_first is False else
                      "the processor's concatenation order was not read: text first assumed"),
        "lists": sorted({lf.attr for lf in lists}),
        "kind": cp.mask_reorder.kind or "1-D",
        "why": cp.mask_reorder.why,
    }


def _image_first(plan: Plan, attr: str) -> bool | None:
    """Whether the attention processor of `attr`'s blocks joins the image stream before the text stream (the
    analysis' `joins_at`: the first `torch.cat([...])` of a query / key and the text's); None: not read."""
    att = next((a for a in plan.facts.attention if a.block_list == attr and a.joins_at is not None), None)
    return None if att is None else not att.text_first


def chunked_outputs(plan: Plan) -> dict[str, dict[str, list]]:
    """{list: {column-wise Linear whose output is cut into n equal parts: [n, the cutting module's path, its
    class]}} (a GLU's fused up-projection; path and class null where not read)."""
    out: dict[str, dict[str, list]] = {}
    for x in plan.parallelism.tp.block_lists:
        for r in plan.facts.linears.get(x.attr, ()):
            if isinstance(r.parts, int) and x.layer_plan.get(r.path) == "colwise":
                by = r.parts_by if isinstance(r.parts_by, tuple) else (None, None)
                out.setdefault(x.attr, {})[r.path] = [r.parts, *by]
    return out


def _joined_inputs(plan: Plan) -> dict[str, dict[str, str]]:
    """{list: {row-wise Linear fed by [attention | mlp]: the column-wise Linear whose width is the first part}}."""
    out: dict[str, dict[str, str]] = {}
    for attr, roles in plan.facts.linears.items():
        joined = [r for r in roles if r.fused_out_down]
        if not joined:
            continue
        attn = next((a for a in plan.facts.attention if a.block_list == attr), None)
        first = attn.in_projs[0] if attn and attn.in_projs else None
        if first:
            out[attr] = {r.path: first for r in joined}
    return out


def distributed_norms(plan: Plan) -> dict[str, list[str]]:
    """q/k norms that normalise over more than one head, or may (a size or head dim not read statically):
    the planner measures each on the built module before sharding and distributes those over all heads."""
    out: dict[str, list[str]] = {}
    for a in plan.facts.attention:
        head = a.head_dim[1] if a.head_dim else None
        for norm, size in (a.qk_norms or {}).items():
            if size is None or head is None or size != head:
                out.setdefault(a.block_list, []).append(f"{a.path}.{norm}")
    return out


def _te_ahead(te) -> str | None:
    """Why our TE-P planner goes ahead of the registration of cache-dit's that answers the encoder's class; None
    where none answers."""
    if te.registered_as is None:
        return None
    if te.registered_as != te.cls:
        return (f"cache-dit's TE-P planner registered as '{te.registered_as}' ({te.supported_by}) answers {te.cls} "
                "only by prefix: it was written for another class")
    return (f"the plan asks for ours instead of cache-dit's TE-P planner registered as '{te.registered_as}' "
            f"({te.supported_by})")


def _te_layer_plans(tp_plan: dict[str, str]) -> dict[str, dict[str, str]]:
    """`layers.*.self_attn.q_proj: colwise` -> {"layers": {"self_attn.q_proj": "colwise"}}."""
    out: dict[str, dict[str, str]] = {}
    for key, style in tp_plan.items():
        prefix, sep, rest = key.partition(".*.")
        if sep:
            out.setdefault(prefix, {})[rest] = style
    return out


def checkout_layout(gen: Generated, plan: Plan):
    """Where each generated module goes in a cache-dit tree, and the registration it needs."""
    from .checkout import Artifact, Registration

    name = plan.model.example_name
    places = {
        "adapter": (f"caching/block_adapters/adapter_{name}.py", "adapter", f".adapter_{name}"),
        "patch_functor": (f"caching/patch_functors/functor_{name}.py", None, None),
        "cp_planner": (f"distributed/transformers/{name}.py", "cp_planner", f".{name}"),
        "tp_planner": (f"distributed/transformers/{name}_tp.py", "tp_planner", f".{name}_tp"),
        "example": (f"_utils/example_{name}.py", "example", f".example_{name}"),
    }
    artifacts, registrations = [], []
    for piece in gen.pieces:
        if piece.role == "vae_planner":
            rel, kind, module = (f"distributed/autoencoders/vae_{name}.py", "vae_planner", f".vae_{name}")
        elif piece.role == "te_planner":
            rel, kind, module = (f"distributed/text_encoders/{piece.module}_{name}.py", "te_planner",
                                 f".{piece.module}_{name}")
        else:
            rel, kind, module = places[piece.role]
        artifacts.append(Artifact(rel, "# Generated by integrate\n" + piece.text))
        if kind:
            registrations.append(Registration(kind, module, piece.symbol))
    m = plan.model
    default = hub_id(m.model_path)  # a local folder is no default in cache-dit's tree (see _example)
    if default is not None:
        registrations.append(Registration("env_path", "", m.env_var, default))
    return artifacts, registrations


# How a test finds each planner kind's registry: (activation module, function, register module, class)
_ACTIVATION = {
    "cp_planner": ("cache_dit.distributed.transformers.planners", "_activate_cp_planners",
                   "cache_dit.distributed.transformers.register", "ContextParallelismPlannerRegister"),
    "tp_planner": ("cache_dit.distributed.transformers.planners", "_activate_tp_planners",
                   "cache_dit.distributed.transformers.register", "TensorParallelismPlannerRegister"),
    "te_planner": ("cache_dit.distributed.text_encoders.planners", "_activate_text_encoder_tp_planners",
                   "cache_dit.distributed.text_encoders.register", "TextEncoderTensorParallelismPlannerRegister"),
    "vae_planner": ("cache_dit.distributed.autoencoders.planners", "_activate_auto_encoder_dp_planners",
                    "cache_dit.distributed.autoencoders.register", "AutoEncoderDataParallelismPlannerRegister"),
}


def checkout_test(gen: Generated, plan: Plan, approval: Approval, artifacts) -> tuple[str, str]:
    """(path in cache-dit's repository, text) of a pytest module in cache-dit's tests layout (tests/api/) that
    checks each registration of the checkout is the one cache-dit looks up for the model."""
    m = plan.model
    name = m.example_name
    path = f"tests/api/test_{name}_registrations.py"
    modules = {a.relpath: "cache_dit." + a.relpath.removesuffix(".py").replace("/", ".") for a in artifacts}
    by_role = {}
    for piece, artifact in zip(gen.pieces, artifacts):
        by_role.setdefault(piece.role, []).append((piece, modules[artifact.relpath]))
    adapter = None
    if "adapter" in gen.registered and "adapter" in by_role:
        pipeline = (m.pipeline_class or "").split(".")[0]
        keys = gen.registered["adapter"].split(", ")  # the name, and the transformer's own class name where also
        names = [m.transformer_class] if m.no_pipeline or not pipeline else [pipeline]
        if len(keys) > 1:
            names.append(m.transformer_class)
        adapter = {"pairs": list(dict.fromkeys(zip(names, keys))), "module": by_role["adapter"][0][1]}
    planners = []
    for kind, (act_mod, act, reg_mod, reg) in _ACTIVATION.items():
        for piece, module in by_role.get(kind, []):
            component = piece.module.removeprefix("te_")  # a TE-P planner's module is te_<component>
            looked_up = gen.registered.get(f"te_planner:{component}") if kind == "te_planner" else \
                gen.registered.get(kind)
            if looked_up:
                planners.append({"kind": kind if kind != "te_planner" else f"te_planner_{component}",
                                 "activate_module": act_mod, "activate": act, "register_module": reg_mod,
                                 "register": reg, "looked_up": looked_up, "module": module})
    example = name if "example" in gen.registered else None
    text = _render("cache_dit_test.py.j2", model=escape.Code(escape.text(m.pipeline_class or m.transformer_class)),
                   name=name, path=path, adapter=adapter, planners=planners, example=example,
                   plan_sha=escape.text(approval.plan_sha256[:12]))
    return path, text


def hub_id(model_path: str | None) -> str | None:
    """The Hugging Face Hub id a model folder is a snapshot of, read from the hub cache's layout
    (`.../models--Org--Name/snapshots/<revision>`): "Org/Name"; None for any other folder (not guessed)."""
    for part in reversed(Path(model_path).parts if model_path else ()):
        org, sep, name = part.removeprefix("models--").partition("--")
        if part.startswith("models--") and sep and org and name and "--" not in name:
            return f"{org}/{name}"
    return None


def _package_imports(modules: list[str]) -> escape.Code:
    modules = [escape.ident(m) for m in modules]
    line = f"from . import {', '.join(modules)}  # noqa: F401"
    if len(line) <= 88:
        return escape.Code(line)
    return escape.Code("from . import (  # noqa: F401\n" + "".join(f"    {m},\n" for m in modules) + ")")
