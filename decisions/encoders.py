"""TE-P and VAE-P: reuse what the installed cache-dit registers, otherwise say what to add."""

from __future__ import annotations

import dataclasses

from integrate.analyzers.records import ParallelFacts

from .records import TextEncoderPlan, VaePlan


def decide_tep(facts: ParallelFacts) -> tuple[TextEncoderPlan, ...]:
    out = []
    for te in facts.text_encoders:
        if te.supported:
            action = "reuse: cache-dit already registers a TE-P planner; test with --parallel-text"
        elif te.supported is None:
            action = "unknown: cache-dit is not installed where the analysis ran"
        elif te.tp_plan:
            action = ("add a TE-P planner: shard the encoder layers as the HF config's base_model_tp_plan says "
                      "(module pattern -> colwise / rowwise)")
        else:
            action = "add a TE-P planner by hand (no base_model_tp_plan found), or skip TE-P if the encoder is small"
        out.append(TextEncoderPlan(**_fields(te), action=action))
    return tuple(out)


def decide_vaep(facts: ParallelFacts) -> VaePlan | None:
    vae = facts.vae
    if vae is None:
        return None
    if vae.supported:
        action = "reuse: cache-dit already registers a VAE-P planner; test with --parallel-vae"
    elif vae.supported is None:
        action = "unknown: cache-dit is not installed where the analysis ran"
    else:
        action = "add a VAE-P planner (tiled decode across ranks), or skip VAE-P if decoding is not a bottleneck"
    return VaePlan(**_fields(vae), action=action)


def _fields(record) -> dict:
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
