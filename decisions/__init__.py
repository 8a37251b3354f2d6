"""Decisions: the skill's charts as code, and the integration plan a reviewer approves.

`make_plan(analysis, crosscheck)` reads the analysis record (cache facts and parallelism facts) and the
meta-device check, and returns the typed `Plan` (`records.py`; `plan.json` is its JSON form, documented
in docs/schema.md). Nothing here reads source code: every verdict cites the evidence the analysers
recorded. One module per chart: `cp.py`, `tp.py`, `encoders.py` (TE-P, VAE-P), `phases.py` (the
phase 0-7 checklist); `crosscheck.py` and `probe.py` build the model on the meta device to check the facts.
"""

from __future__ import annotations

import dataclasses
import re

from integrate.analyzers.records import Analysis, PipelineFacts

from integrate import __version__
from integrate.records import Evidence

from .alternatives import alternatives
from .cp import decide_cp, with_cache
from .encoders import decide_tep, decide_vaep
from .phases import phases
from .records import (
    PLAN_SCHEMA,
    PLAN_SCHEMA_VERSION,
    CacheList,
    CachePlan,
    CrossCheck,
    ExampleInput,
    ExamplePlan,
    NotBlocks,
    Parallelism,
    Plan,
    PlanFacts,
    PlanModel,
)
from .tp import decide_tp

__all__ = ["example_name", "make_plan"]


# What a transformer class name ends with after the model's own name (for a transformer-only plan's name)
_MODEL_SUFFIX = re.compile(r"(?:Transformer\d*[A-Z]?(?:Model)?|DiTModel|DiT|Model)$")


def example_name(pipeline_class: str | None, transformer_class: str | None = None) -> str | None:
    """`MotifVideoPipeline` -> `motif_video` (the name to register in cache-dit's examples); without a
    pipeline, the transformer's name less its suffix: `Flux3Transformer2DModel` -> `flux3`."""
    if not pipeline_class and transformer_class:
        base = _MODEL_SUFFIX.sub("", transformer_class) or transformer_class
        return example_name(base)
    if not pipeline_class:
        return None
    base = pipeline_class.split(".")[0]
    base = base[: -len("Pipeline")] if base.endswith("Pipeline") and base != "Pipeline" else base
    words: list[str] = []
    for word in re.findall(r"[A-Z]+[0-9]*(?![a-z])|[A-Z][a-z0-9]*|[a-z0-9]+", base):
        if len(word) == 1 and word.isupper() and words:
            words[-1] += word  # "MoE": one word, not "mo_e"
        else:
            words.append(word)
    return "_".join(w.lower() for w in words) or None


def make_plan(analysis: Analysis, crosscheck: CrossCheck) -> Plan:
    """The plan for an analysis made with `parallel=True`."""
    gate, facts, t = analysis.gate, analysis.parallel, analysis.transformer
    name = example_name(gate.value("pipeline_class"), gate.value("transformer_class") if gate.no_pipeline else None)
    cached, uncached, cache_notes = _long_enough([bl for bl in t.block_lists if bl.is_blocks], analysis)
    cache = CachePlan(
        block_lists=tuple(CacheList(bl.attr, bl.block_class, bl.forward_pattern, bl.alternatives, bl.confidence,
                                    bl.check_forward_pattern, bl.roles)
                          for bl in cached),
        not_blocks=tuple(NotBlocks(bl.attr, bl.why) for bl in t.block_lists if not bl.is_blocks),
        uncached=uncached,
        notes=cache_notes + tuple(f"{e.why} ({e.file.rsplit('/', 1)[-1]}:{e.line}); not generated"
                                  for e in analysis.pipeline.other_models),
        needs_patch_functor=bool(patch_reasons(t, cached)),
        patch_functor_reasons=patch_reasons(t, cached),
        has_separate_cfg=analysis.pipeline.has_separate_cfg,
        cfg_confidence=analysis.pipeline.confidence,
    )
    cp = with_cache(decide_cp(facts), {bl.attr for bl in cached})
    model = PlanModel(
        model_path=gate.value("model_path"),
        pipeline_class=gate.value("pipeline_class"),
        transformer_class=gate.value("transformer_class"),
        pipeline_file=gate.value("pipeline_file"),
        transformer_file=gate.value("transformer_file"),
        example_name=name,
        env_var=f"{name.upper()}_DIR" if name else None,
        example_type_guess=_example_type(gate.value("pipeline_class")),
        no_pipeline=gate.no_pipeline,
        config_file=gate.value("config_file"),
        source_roots=gate.source_roots,
    )
    plan = Plan(
        schema=PLAN_SCHEMA,
        schema_version=PLAN_SCHEMA_VERSION,
        tool_version=__version__,
        model=model,
        cache=cache,
        parallelism=Parallelism(cp=cp, tp=decide_tp(facts, crosscheck)),
        text_encoders=decide_tep(facts),
        vae=decide_vaep(facts),
        already_supported=analysis.already_supported,
        facts=PlanFacts(
            config=facts.config,
            attention=tuple(a for b in facts.blocks for a in b.attentions),
            linears={b.attr: b.linears for b in facts.blocks},
            sequence=facts.sequence,
            position_modules=facts.position_modules,
            crosscheck=crosscheck,
            model_mixin=facts.model_mixin,
            model_mixin_at=facts.model_mixin_at,
            diffusers_pipeline=None if gate.no_pipeline else analysis.pipeline.diffusers_pipeline,
            diffusers_pipeline_at=None if gate.no_pipeline else analysis.pipeline.diffusers_pipeline_at,
        ),
        unknowns=tuple(sorted(set(t.unknowns) | set(cp.unknowns) | {u for b in facts.blocks for u in b.unknowns})),
        example=None if gate.no_pipeline else decide_example(analysis.pipeline, model.example_type_guess, name),
    )
    plan = dataclasses.replace(plan, phases=phases(plan))
    return dataclasses.replace(plan, alternatives=alternatives(plan, facts))


# the call's sizes and steps: the example leaves them at the pipeline's defaults (its checks tie them to others)
_DEFAULTED = ("height", "width", "num_frames", "num_inference_steps", "guidance_scale")


def decide_example(pipeline: PipelineFacts, type_guess: str, name: str | None) -> ExamplePlan | None:
    """The example's call, from the entry's signature: a prompt where it takes one, each parameter it
    requires from a flag (prompts aside), the rest at the pipeline's defaults."""
    params = {p.name: p for p in pipeline.call_inputs}
    if not params or pipeline.file is None:
        return None
    where = Evidence(pipeline.file, next(iter(params.values())).line,
                     f"{pipeline.cls or pipeline.entry}.{pipeline.entry} signature")
    prefix = f"{name.upper()}_" if name else ""
    inputs = tuple(ExampleInput(p.name, p.kind, "--" + p.name.replace("_", "-"), f"{prefix}{p.name.upper()}",
                                Evidence(pipeline.file, p.line, f"`{p.name}` has no default: the call needs it"))
                   for p in pipeline.call_inputs if p.required and p.kind != "prompt")
    return ExamplePlan(prompt="prompt" in params, inputs=inputs,
                       defaults={k: params[k].default for k in _DEFAULTED if k in params and not params[k].required},
                       type_guess=type_guess, evidence=where)


def _long_enough(lists: list, analysis: Analysis) -> tuple[list, tuple[NotBlocks, ...], tuple[str, ...]]:
    """(the block lists the adapter caches, those it leaves out, notes). cache-dit asserts that a cached list
    has at least `Fn_compute_blocks` and `Bn_compute_blocks` blocks when the cache starts; with its defaults,
    a shorter list (Lumina2's 2-block refiners beside its 26 layers) is left out and runs uncached. When
    every list is that short, all stay and the note says the cache config must lower the counts."""
    d, facts = analysis.cache_defaults, analysis.parallel
    lengths = _list_lengths(lists, facts)
    if d is None:
        return lists, (), ()
    need = max(d.fn_compute_blocks, d.bn_compute_blocks)
    short = [bl for bl in lists if isinstance(lengths.get(bl.attr), int) and lengths[bl.attr] < need]
    where = f"{d.evidence.file.rsplit('/', 1)[-1]}:{d.evidence.line}"
    if not short:
        return lists, (), ()
    if len(short) == len(lists):
        return lists, (), (f"every cached list is shorter than cache-dit's default Fn_compute_blocks "
                           f"{d.fn_compute_blocks} / Bn_compute_blocks {d.bn_compute_blocks} ({where}): run with a "
                           f"cache config whose counts fit ({', '.join(f'{bl.attr}: {lengths[bl.attr]}' for bl in lists)})",)
    return ([bl for bl in lists if bl not in short],
            tuple(NotBlocks(bl.attr, _short_why(lengths[bl.attr], d, where)) for bl in short), ())


def patch_findings(t, cached: set[str]) -> list:
    """The findings a PatchFunctor answers, on the lists the adapter caches (`cached`: their attributes; a list
    left out runs as the model wrote it)."""
    return [f for f in t.findings if f.patch and f.attr in cached]


def patch_reasons(t, cached: list) -> tuple[str, ...]:
    """The PatchFunctor's reasons, as the plan states them."""
    return tuple(f"{f.attr}: {f.message}" for f in patch_findings(t, {bl.attr for bl in cached}))


def _list_lengths(lists: list, facts) -> dict[str, int | None]:
    """{list attribute: its length}; for a ModuleDict of ModuleLists the longest entry's (each entry is a list
    of its own: `mode_blocks.image`, `mode_blocks.image_cond`), None where any entry's length is not known."""
    if facts is None:
        return {}
    out: dict[str, int | None] = {}
    for bl in lists:
        found = [b.length for b in facts.blocks if b.attr == bl.attr or b.attr.startswith(bl.attr + ".")]
        out[bl.attr] = max(found) if found and all(isinstance(n, int) for n in found) else None
    return out


def _short_why(n: int, d, where: str) -> str:
    return (f"{n} blocks, fewer than cache-dit's default Fn_compute_blocks {d.fn_compute_blocks} / Bn_compute_blocks "
            f"{d.bn_compute_blocks} ({where}): cache-dit asserts a cached list has at least that many, so it is "
            "left out of the adapter and runs uncached")


def _example_type(pipeline_class: str | None) -> str:
    name = (pipeline_class or "").lower()
    if "video" in name or "wan" in name:
        return "I2V" if "image2video" in name or "i2v" in name else "T2V"
    if "edit" in name or "img2img" in name or "kontext" in name:
        return "IE2I"
    return "T2I"
