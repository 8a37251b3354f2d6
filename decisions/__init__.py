"""Decisions: the skill's charts as code, and the integration plan a reviewer approves.

`make_plan(analysis, facts)` reads the analysis record (cache facts) and the parallelism facts
and returns the plan as plain JSON data (`plan.json`, schema in docs/schema.md); `render_markdown`
turns it into PLAN.md. Nothing here reads source code: every verdict cites the evidence the
analyzers recorded.
"""

from __future__ import annotations

import re
from typing import Any

from integrate import __version__
from integrate.records import Analysis, ParallelFacts, to_json

from .cp import decide_cp
from .encoders import decide_tep, decide_vaep
from .phases import phases
from .render import render_markdown
from .tp import decide_tp

PLAN_SCHEMA_VERSION = "1.1"

__all__ = ["make_plan", "render_markdown", "PLAN_SCHEMA_VERSION"]


def example_name(pipeline_class: str | None) -> str | None:
    """`MotifVideoPipeline` -> `motif_video` (the name to register in cache-dit's examples)."""
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


def make_plan(analysis: Analysis, facts: ParallelFacts) -> dict[str, Any]:
    gate = analysis.gate
    name = example_name(gate.value("pipeline_class"))
    t = analysis.transformer
    cache = {
        "block_lists": [
            {"attr": bl.attr, "block_class": bl.block_class, "forward_pattern": bl.forward_pattern,
             "alternatives": list(bl.alternatives), "confidence": bl.confidence,
             "check_forward_pattern": bl.check_forward_pattern, "roles": bl.roles}
            for bl in t.block_lists if bl.is_blocks
        ],
        "not_blocks": [{"attr": bl.attr, "why": bl.why} for bl in t.block_lists if not bl.is_blocks],
        "needs_patch_functor": t.needs_patch_functor,
        "patch_functor_reasons": list(t.patch_functor_reasons),
        "has_separate_cfg": analysis.pipeline.has_separate_cfg,
        "cfg_confidence": analysis.pipeline.confidence,
    }
    cp = decide_cp(facts)
    tp = decide_tp(facts)
    tep = decide_tep(facts)
    vaep = decide_vaep(facts)
    plan = {
        "schema": "integrate.plan",
        "schema_version": PLAN_SCHEMA_VERSION,
        "tool_version": __version__,
        "model": {
            "model_path": gate.value("model_path"),
            "pipeline_class": gate.value("pipeline_class"),
            "transformer_class": gate.value("transformer_class"),
            "pipeline_file": gate.value("pipeline_file"),
            "transformer_file": gate.value("transformer_file"),
            "example_name": name,
            "env_var": f"{name.upper()}_DIR" if name else None,
            "example_type_guess": _example_type(gate.value("pipeline_class")),
        },
        "cache": cache,
        "parallelism": {"cp": cp, "tp": tp},
        "text_encoders": tep,
        "vae": vaep,
        "already_supported": analysis.already_supported,
        "facts": {
            "config": facts.config,
            "attention": [
                {"block_list": b.attr, **to_json(a)} for b in facts.blocks for a in b.attentions
            ],
            "linears": {b.attr: [to_json(r) for r in b.linears] for b in facts.blocks},
            "sequence": to_json(facts.sequence),
            "position_modules": facts.position_modules,
            "crosscheck": facts.crosscheck,
        },
        "unknowns": sorted(set(t.unknowns) | set(cp.get("unknowns", [])) | {
            u for b in facts.blocks for u in b.unknowns}),
    }
    plan["phases"] = phases(plan)
    return plan


def _example_type(pipeline_class: str | None) -> str:
    name = (pipeline_class or "").lower()
    if "video" in name or "wan" in name:
        return "I2V" if "image2video" in name or "i2v" in name else "T2V"
    if "edit" in name or "img2img" in name or "kontext" in name:
        return "IE2I"
    return "T2I"
