"""TE-P and VAE-P: reuse what the installed cache-dit registers, otherwise say what to add."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from integrate.analyzers.records import ParallelFacts

from .records import TextEncoderPlan, VaePlan


def decide_tep(facts: ParallelFacts) -> tuple[TextEncoderPlan, ...]:
    """Whose TE-P planner each text encoder gets. cache-dit registers planners under class names and answers a class
    with the first registered name it starts with: a registration of the class's own name is reused; one of a
    shorter name was written for another class (`T5GemmaEncoder` answering `T5GemmaEncoderModel`), so where the HF
    config declares a layer plan ours is written from it and registered ahead; else the registered one is reused,
    with that said."""
    out = []
    for te in facts.text_encoders:
        other = te.supported and te.registered_as not in (None, te.cls)
        if te.supported and not (other and shards_layers(te.tp_plan)):
            planner = "reuse"
            action = "reuse: cache-dit already registers a TE-P planner; test with --parallel-text"
            if other:
                action += (f" (registered as '{te.registered_as}', written for another class, at {te.supported_by}: "
                           "no HF layer plan to write ours from; the tep proof shows whether it fits)")
        elif te.supported is None:
            planner, action = "unknown", "unknown: cache-dit is not installed where the analysis ran"
        elif shards_layers(te.tp_plan):
            planner = "generate"
            action = ("add a TE-P planner: shard the encoder layers as the HF config's base_model_tp_plan says "
                      "(module pattern -> colwise / rowwise)")
            if other:
                action += (f"; cache-dit's registration '{te.registered_as}' ({te.supported_by}) answers {te.cls} "
                           "only by prefix, written for another class: ours is registered ahead of it")
        elif te.tp_plan:
            named = ", ".join(f"{k}: {v}" for k, v in te.tp_plan.items())
            planner = "manual"
            action = (f"add a TE-P planner by hand: the HF config's base_model_tp_plan shards no layer ({named}), "
                      "or skip TE-P if the encoder is small")
        else:
            planner = "manual"
            action = "add a TE-P planner by hand (no base_model_tp_plan found), or skip TE-P if the encoder is small"
        out.append(TextEncoderPlan(**_fields(te), action=action, planner=planner))
    return tuple(out)


def shards_layers(tp_plan: dict[str, str]) -> bool:
    """Does an HF layer plan shard a layer of a list (`layers.*.self_attn.q_proj: colwise`)? A plan naming only the
    embedding (`embed_tokens: embedding_rowwise`, Qwen3-VL's text config) gives a planner nothing to apply."""
    return any(".*." in key and style in SHARDING_STYLES for key, style in tp_plan.items())


# the HF layer-plan styles a generated TE-P planner applies (templates/te_planner.py.j2); any other stays whole
SHARDING_STYLES = ("colwise", "rowwise", "colwise_gather_output", "rowwise_split_input")


def has_tep_planner(te) -> bool:
    """cache-dit's TE-P planner is reused for the encoder, or generate writes one from its HF layer plan (the plan's
    verdict, or a reviewer's revision of it)."""
    return te.planner == "reuse" or (te.planner == "generate" and shards_layers(te.tp_plan))


def decide_vaep(facts: ParallelFacts) -> VaePlan | None:
    vae = facts.vae
    if vae is None:
        return None
    tiles, reuse = vae.tiles, vae.reuse
    if vae.supported:
        planner, action = "reuse", "reuse: cache-dit already registers a VAE-P planner; test with --parallel-vae"
    elif vae.supported is None:
        planner, action = "unknown", "unknown: cache-dit is not installed where the analysis ran"
    elif reuse is not None:
        reg = reuse.chain[-1]
        planner = "reuse-base"
        action = (f"reuse-base: {vae.cls} derives from {reuse.base} and overrides none of the methods its planner "
                  f"replaces or calls; {reuse.planner} ({Path(reg.file).name}:{reg.line}) registered under "
                  f"{vae.cls}; test with --parallel-vae")
    elif tiles is not None and tiles.understood and tiles.loop is not None:
        planner = "generate"
        action = (f"generate: a VAE-P planner from {tiles.source.why} ({Path(tiles.loop.file).name}:"
                  f"{tiles.loop.line}): the tile loop's iterations dealt to ranks round robin, the tiles gathered "
                  "to every rank before the blend; test with --parallel-vae")
    elif tiles is not None and tiles.loop is not None:
        planner = "manual"
        action = (f"manual: no VAE-P planner generated: {tiles.loop.why} ({Path(tiles.loop.file).name}:"
                  f"{tiles.loop.line}); write one by hand (references/vaep.md), or skip VAE-P")
    else:
        planner = "manual"
        why = "; ".join(vae.notes[-1:]) or "its tiled_decode was not read"
        action = f"manual: no VAE-P planner generated: {why}; write one by hand (references/vaep.md), or skip VAE-P"
    return VaePlan(**_fields(vae), action=action, planner=planner)


def _fields(record) -> dict:
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
