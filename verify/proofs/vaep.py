"""VAE parallelism: the VAE the plan gives a planner to (cache-dit's, or the one generated from its tiled decode)
built tiny, a latent that tiles into more tiles than ranks, decoded by the planner over 2 gloo processes against the
1-process tiled decode; the untiled decode reported beside it by PSNR and SSIM (verify/components/vaep.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..records import ComponentProof

if TYPE_CHECKING:
    from integrate.decisions.records import Plan

NAME = "vaep"
ORDER = 55
KIND = "component"
RECORD = ComponentProof
REQUESTABLE = True
BY_DEFAULT = False  # a pipeline part, not the transformer: proved when asked (PLAN.md's phase 6 asks)
REPAIRS = ()
TITLE = "VAE data-parallel decode"
SUMMARY = "the VAE's VAE-P planner over 2 gloo processes against its 1-process tiled decode"


def _has_planner(vae) -> bool:
    """cache-dit registers one, or generate writes one (from the VAE's tiled decode, or its registered base's)."""
    return bool(vae.supported) or vae.planner in ("reuse", "generate", "reuse-base")


def parts(plan: Plan) -> list[dict]:
    vae = plan.vae
    return [{"component": vae.component, "library": vae.library, "cls": vae.cls}] if (
        vae is not None and vae.cls and _has_planner(vae)) else []


def not_planned(plan: Plan) -> str | None:
    if plan.vae is None:
        return "model_index.json names no VAE"
    if not parts(plan):
        return f"vae `{plan.vae.cls}`: {plan.vae.action}"
    return None


def engaged(report: dict, reports: list[dict]) -> tuple[bool, str]:
    total, per_rank = report.get("decoder_calls_1process", 0), report.get("decoder_calls_per_rank") or []
    if total <= len(per_rank):
        return False, f"the latent made {total} decoder call(s) for {len(per_rank)} ranks: tiling did not engage"
    if not per_rank or max(per_rank) >= total:
        return False, (f"a rank decoded every tile ({per_rank} decoder calls per rank, {total} in one process): "
                       "the tiles were not dealt out")
    if sum(per_rank) != total:
        return False, f"the ranks made {sum(per_rank)} decoder calls between them, one process {total}"
    return True, ""


def evidence(report: dict) -> dict:
    return {k: report[k] for k in ("latent", "output", "tiles", "decoder_calls_1process", "decoder_calls_per_rank",
                                   "mesh_on_cpu") if k in report}


def passed(report: dict) -> str:
    return (f"matches the 1-process tiled decode; {report['decoder_calls_1process']} decoder calls dealt "
            f"{report['decoder_calls_per_rank']} across the ranks")


def lines(record: dict) -> list[str]:
    out = []
    for r in record.get("runs", ()):
        out.append(f"{r['component']} `{r['class']}`: {r['status']}: {r.get('why', '')}")
        u = r.get("untiled")
        if u:
            out.append(f"  against the untiled decode (reported): PSNR {u.get('psnr')} dB, SSIM {u.get('ssim')}")
    return out


def details(record: dict) -> list[str]:
    return [f"{r['component']}: {r['status']}" for r in record.get("runs", ())]
