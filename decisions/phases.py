"""The phase 0-7 checklist, filled in with this model's names, decisions and test commands."""

from __future__ import annotations

from .encoders import has_tep_planner
from .records import Phase, Plan

PSNR_CACHE, PSNR_PARALLEL, SSIM_MIN = 30, 35, 0.90


def phases(plan: Plan) -> tuple[Phase, ...]:
    """The integration's phases, prerequisites to CP + TP together: what each one does for this plan and the commands
    that check it."""
    m = plan.model
    name = m.example_name or "<example_name>"
    env = m.env_var or "<MODEL>_DIR"
    tmp = f".tmp/{name}"
    # The plugin's launcher runs cache-dit's generate CLI with the generated registrations loaded;
    # in a cache-dit checkout the same commands work with `cache_dit.generate` instead.
    launcher = f"integrate_{name}"
    ex = plan.example
    given = "".join(f' {i.flag} "${i.env_var}"' for i in plan.example_inputs)
    gen = f"python3 -m {launcher} {name}{given}"
    run2 = f"torchrun --nproc_per_node=2 -m {launcher} {name}{given}"
    metrics = "cache-dit-metrics psnr ssim -i1 {base} -i2 {other}"
    cache = plan.cache

    def check(other: str, psnr: int) -> str:
        return metrics.format(base=f"{tmp}/base.png", other=f"{tmp}/{other}") + f"   # PSNR > {psnr}, SSIM > {SSIM_MIN}"

    uaa = [s for s, v in plan.parallelism.cp.ulysses_anything.items() if v.needed]
    steps = _parallel_steps(plan, uaa)
    rows = [
        {"id": 0, "title": "Prerequisites", "steps": _prerequisites(plan, env, launcher), "commands": []},
        {"id": 1, "title": "Cache (BlockAdapter)", "steps": [
            "Write the BlockAdapter" + (" and a PatchFunctor: " + "; ".join(cache.patch_functor_reasons)
                                        if cache.needs_patch_functor else " (no PatchFunctor needed)"),
            f"has_separate_cfg={cache.has_separate_cfg}",
        ], "commands": [
            f"{gen} --save-path {tmp}/base.png",
            f"{gen} --cache --summary --save-path {tmp}/cache.png",
            check("cache.png", PSNR_CACHE),
        ]},
        {"id": 2, "title": "CLI example", "steps": [
            f"Register example `{name}` ({m.example_type_guess}, confirm) with env var {env}",
            *_example_steps(ex),
        ], "commands": [f"python3 -m {launcher} list | grep {name}"]},
        {"id": 3, "title": "Context parallelism", "steps": steps["cp"], "commands": [
            f"{run2} --parallel ulysses --save-path {tmp}/cp_ulysses2.png",
            check("cp_ulysses2.png", PSNR_PARALLEL),
        ] + ([f"{run2} --parallel ulysses --ulysses-anything --save-path {tmp}/cp_uaa2.png"] if uaa else [])},
        {"id": 4, "title": "Tensor parallelism", "steps": steps["tp"], "commands": [
            f"{run2} --parallel tp --save-path {tmp}/tp2.png",
            check("tp2.png", PSNR_PARALLEL),
        ]},
        {"id": 5, "title": "Text-encoder parallelism", "steps": steps["tep"], "commands": [
            f"{run2} --parallel tp --parallel-text --save-path {tmp}/tp2_tep2.png",
            check("tp2_tep2.png", PSNR_PARALLEL),
        ]},
        {"id": 6, "title": "VAE parallelism", "steps": steps["vae"], "commands": [
            # --parallel-vae acts only beside a --parallel type
            f"{run2} --parallel tp --parallel-vae --save-path {tmp}/tp2_vaep2.png",
            check("tp2_vaep2.png", PSNR_PARALLEL),
        ]},
        {"id": 7, "title": "Final: CP + TP together, results table", "steps": [
            "Record latency, PSNR, SSIM and memory for every configuration; look at one output of each",
            "CPU proof first: `integrate verify <PLAN_DIR> --generated <OUT>` (every default proof), then "
            "`--proof hybrid` (Ulysses 2 x TP 2 over 4 gloo processes); GPU rows: add `--gpu`",
        ], "commands": [
            # the degrees come from the process count: Ulysses 2 x TP 2 is 4 processes
            f"{run2.replace('--nproc_per_node=2', '--nproc_per_node=4')} --parallel ulysses_tp "
            f"--save-path {tmp}/ulysses2_tp2.png",
            check("ulysses2_tp2.png", PSNR_PARALLEL),
            f"{run2.replace('--nproc_per_node=2', '--nproc_per_node=4')} --parallel ulysses_tp --cache "
            f"--save-path {tmp}/ulysses2_tp2_cache.png",
            check("ulysses2_tp2_cache.png", PSNR_CACHE),
        ]},
    ]
    return tuple(Phase(r["id"], r["title"], tuple(r["steps"]), tuple(r["commands"])) for r in rows)


def _prerequisites(plan: Plan, env: str, launcher: str) -> list[str]:
    """Phase 0: the model files, the sources read, the block lists, the approval and the generated code."""
    m = plan.model
    lists = ", ".join(f"`{b.attr}` ({b.forward_pattern})" for b in plan.cache.block_lists) or "none found"
    return [
        (f"Model files at `{m.model_path}`; export {env}={m.model_path}" if m.model_path else
         f"No model folder was given (the config came from --config): the GPU runs need the weights; export "
         f"{env} to their folder"),
        f"Sources read: `{m.pipeline_class}` ({m.pipeline_file}), `{m.transformer_class}` "
        f"({m.transformer_file})",
        f"Block lists: {lists}",
        "Plan reviewed and approved: integrate approve <PLAN_DIR> --reviewer <name>",
        f"Code generated: integrate generate <PLAN_DIR> --out <OUT> (plugin `{launcher}`; in a cache-dit "
        "checkout, --mode checkout and `cache_dit.generate` in the commands below)",
    ]


def _parallel_steps(plan: Plan, uaa: list[str]) -> dict[str, list[str]]:
    """The steps of phases 3 to 6 (keys cp, tp, tep, vae) from the plan's decisions; `uaa`: the CP sizes that need
    Ulysses-anything."""
    cp, tp, vae = plan.parallelism.cp, plan.parallelism.tp, plan.vae
    cp_steps = [f"CP shape: {cp.shape} ({cp.approach}); hook keys: " + ", ".join(f"`{k}`" for k in cp.plan)]
    if cp.mask_reorder.needed:
        cp_steps.append(f"Mask reorder ({cp.mask_reorder.kind}): block pre-hooks permute the mask into Ulysses order")
    if cp.rope_drift_fix.needed:
        cp_steps.append("RoPE drift fix: compute positions on the global length, slice per rank")
    if uaa:
        cp_steps.append(f"Ulysses-anything needed for CP sizes {', '.join(uaa)}")
    tp_steps = [f"`{x.attr}`: {x.strategy}; shard_div_attr {_shard_text(x.shard_div_attr)}" for x in tp.block_lists]
    if tp.patch_kernels_first:
        tp_steps.insert(0, "Patch fused / env-gated kernels to PyTorch ops before parallelize_module")
    tep = [f"{t.component} `{t.cls}`: {t.action}" for t in plan.text_encoders] or [
        "no text encoder in model_index.json"]
    vae_steps = [f"`{vae.cls}`: {vae.action}"] if vae else ["no VAE in model_index.json"]
    # each phase's CPU proof before its GPU rows (the component proofs are run only when asked for by name)
    return {"cp": cp_steps + [_proof("cp")], "tp": tp_steps + [_proof("tp")],
            "tep": tep + ([_proof("tep")] if any(has_tep_planner(t) for t in plan.text_encoders) else []),
            "vae": vae_steps + ([_proof("vaep")] if vae and (vae.supported or vae.planner in ("generate", "reuse-base"))
                                else [])}


def _proof(name: str) -> str:
    return f"CPU proof first: `integrate verify <PLAN_DIR> --generated <OUT> --proof {name}`"


def _shard_text(shard: dict[str, tuple[str, ...]]) -> str:
    """As plan.json reads: `{'attn': ['heads']}`, or `none`."""
    return str({k: list(v) for k, v in shard.items()}) if shard else "none"


def _example_steps(ex) -> list[str]:
    if ex is None:
        return []
    steps = [f"Sizes and steps at the pipeline's own defaults ({', '.join(f'{k}={v}' for k, v in ex.defaults.items())})"
             if ex.defaults else "The call passes no sizes or steps: the pipeline's defaults apply"]
    steps += [f"Give {i.flag} PATH (${i.env_var} in the GPU matrix): the pipeline requires `{i.name}` ({i.kind})"
              for i in ex.inputs]
    return steps
