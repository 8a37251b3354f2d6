"""Text-encoder tensor parallelism: each text encoder the plan gives a planner to (cache-dit's, or the one generated
from its Hugging Face layer plan) built tiny, token ids in, over 2 gloo processes against its 1-process run
(verify/components/tep.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from integrate.decisions.encoders import has_tep_planner, shards_layers

from ..records import ComponentProof

if TYPE_CHECKING:
    from integrate.decisions.records import Plan

NAME = "tep"
ORDER = 50
KIND = "component"
RECORD = ComponentProof
REQUESTABLE = True
BY_DEFAULT = False  # a pipeline part, not the transformer: proved when asked (PLAN.md's phase 5 asks)
REPAIRS = ()
TITLE = "text-encoder TP"
SUMMARY = "each text encoder's TE-P planner over 2 gloo processes against its 1-process run"


def parts(plan: Plan) -> list[dict]:
    """The text encoders a TE-P planner exists for: cache-dit's, or ours (written from the HF layer plan)."""
    return [{"component": te.component, "library": te.library, "cls": te.cls, "module": te.module,
             "hint": _hint(i, te)} for i, te in enumerate(plan.text_encoders) if te.cls and has_tep_planner(te)]


def _hint(index: int, te) -> str | None:
    """What a failure of cache-dit's planner leaves the user, where the HF config declares a layer plan: revising the
    plan to write ours from it (registered ahead of cache-dit's)."""
    if te.planner != "reuse" or not shards_layers(te.tp_plan) or te.tp_plan_source is None:
        return None
    return (f"cache-dit's planner does not fit this class here; ours can be written from the HF layer plan "
            f"({Path(te.tp_plan_source.file).name}:{te.tp_plan_source.line}): integrate revise PLAN_DIR --set "
            f"text_encoders.{index}.planner=generate --why '...', then approve and generate again")


def not_planned(plan: Plan) -> str | None:
    if not plan.text_encoders:
        return "model_index.json names no text encoder"
    if not parts(plan):
        return "no text encoder has a TE-P planner: " + "; ".join(
            f"{te.component} `{te.cls}`: {te.action}" for te in plan.text_encoders)
    return None


def engaged(report: dict, reports: list[dict]) -> tuple[bool, str]:
    if report.get("sharded"):
        return True, ""
    return False, f"no parameter of the encoder was sharded by {report.get('planner', 'the planner')}"


def evidence(report: dict) -> dict:
    return {k: report[k] for k in ("parameters", "sharded", "shards", "mesh_on_cpu") if k in report}


def passed(report: dict) -> str:
    return (f"{report['hidden_states']} hidden state(s) match the 1-process run; {report['sharded']} of "
            f"{report['parameters']} parameters sharded")


def lines(record: dict) -> list[str]:
    return [f"{r['component']} `{r['class']}`: {r['status']}: {r.get('why', '')}" for r in record.get("runs", ())]


def details(record: dict) -> list[str]:
    return [f"{r['component']}: {r['status']}" for r in record.get("runs", ())]
