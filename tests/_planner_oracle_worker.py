"""Subprocess worker for ``tests/planner_oracle.py``.

Reads a JSON list of jobs ``[{"transformer_class": str, "config": dict | null}, ...]`` on stdin,
builds each transformer on the meta device, runs cache-dit's own registered CP and TP planners on it
(recording, not parallelising) and prints one JSON list of results on stdout, in job order.

It runs in its own process because several planners monkeypatch diffusers classes globally.
Only the JSON goes to stdout: everything else (cache-dit's logger, warnings) is sent to stderr.
"""

from __future__ import annotations

import os
import sys

# Keep fd 1 for the JSON answer; send everything else that writes to stdout to stderr.
_JSON_OUT = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr

import dataclasses
import json
import traceback
from types import SimpleNamespace

# Tiny configs tried only when a class cannot be built with its default init arguments.
TINY_CONFIGS: dict[str, dict] = {}


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    first = lines[0].strip() if lines else ""
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text[:400]


# --------------------------------------------------------------------------- construction


def _build(transformer_class: str, config: dict | None):
    import diffusers
    import torch

    cls = getattr(diffusers, transformer_class)
    with torch.device("meta"):
        if config:
            return cls.from_config(config)
        return cls()


def _build_with_fallback(transformer_class: str, config: dict | None):
    """Returns (model, how) with how in {"config", "default", "tiny"}; raises on failure."""
    if config:
        return _build(transformer_class, config), "config"
    try:
        return _build(transformer_class, None), "default"
    except Exception:
        tiny = TINY_CONFIGS.get(transformer_class)
        if tiny is None:
            raise
        return _build(transformer_class, tiny), "tiny"


# --------------------------------------------------------------------------- parallelism configs


def _cp_config():
    try:
        from cache_dit.distributed.config import ParallelismConfig

        return ParallelismConfig(ulysses_size=2)
    except Exception:  # noqa: BLE001 - no usable config class: fall back to a stub
        return _stub(ulysses_size=2, ring_size=None, tp_size=None)


def _tp_config():
    try:
        from cache_dit.distributed.config import ParallelismConfig

        return ParallelismConfig(tp_size=2)
    except Exception:  # noqa: BLE001 - no usable config class: fall back to a stub
        return _stub(ulysses_size=None, ring_size=None, tp_size=2)


def _stub(ulysses_size, ring_size, tp_size):
    def _gt1(v):
        return v is not None and v > 1

    ns = SimpleNamespace(
        ulysses_size=ulysses_size,
        ring_size=ring_size,
        tp_size=tp_size,
        ulysses_async=False,
        ulysses_anything=False,
        ulysses_float8=False,
        ring_rotate_method="p2p",
        ring_convert_to_fp32=True,
        attention_backend=None,
        extra_parallel_kwargs={},
        extra_parallel_modules=[],
        cp_plan=None,
        backend=None,
        _has_controlnet=False,
        _has_text_encoder=False,
        _has_auto_encoder=False,
        _tp_mesh=None,
        _cp_mesh=None,
        _cp_rank=0,
        _cp_world_size=max(ulysses_size or 1, ring_size or 1),
        _device=None,
    )
    ns.cp_enabled = lambda: _gt1(ulysses_size) or _gt1(ring_size)
    ns.usp_enabled = lambda: _gt1(ulysses_size) and _gt1(ring_size)
    ns.tp_enabled = lambda: _gt1(tp_size)
    ns.hybrid_enabled = lambda: ns.cp_enabled() and ns.tp_enabled()
    ns.strify = lambda *a, **k: "stub"
    return ns


# --------------------------------------------------------------------------- registries


_ACTIVATED = False


def _registries():
    from cache_dit.distributed.transformers import planners
    from cache_dit.distributed.transformers.register import (
        ContextParallelismPlannerRegister,
        TensorParallelismPlannerRegister,
    )

    global _ACTIVATED
    if not _ACTIVATED:
        # Both, unconditionally: several planner modules register a CP and a TP planner, so after
        # the CP activation the TP registry is no longer empty, and cache-dit's own
        # ``_ensure_tp_planners_activated`` (which checks for an empty registry) would skip the
        # TP-only modules (ltx2_video, kandinsky5, mochi, ...). Importing twice is a no-op.
        planners._activate_cp_planners()
        planners._activate_tp_planners()
        _ACTIVATED = True
    return ContextParallelismPlannerRegister, TensorParallelismPlannerRegister


# --------------------------------------------------------------------------- CP


def _norm_cp(value):
    if value is None:
        return None
    if hasattr(value, "split_dim"):
        return {
            "split_dim": value.split_dim,
            "expected_dims": getattr(value, "expected_dims", None),
            "split_output": getattr(value, "split_output", False),
        }
    if hasattr(value, "gather_dim"):
        return {"gather_dim": value.gather_dim, "expected_dims": getattr(value, "expected_dims", None)}
    if isinstance(value, dict):
        return {str(k): _norm_cp(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_norm_cp(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__class__": type(value).__name__, **dataclasses.asdict(value)}
    if isinstance(value, (int, float, str, bool)):
        return value
    return repr(value)


def _run_cp(transformer_class: str, config: dict | None, out: dict) -> None:
    cp_reg, _ = _registries()
    model, how = _build_with_fallback(transformer_class, config)
    out["construct"] = how
    planner_cls = cp_reg.get_planner(model)
    out["cp_planner"] = planner_cls.__name__
    plan = planner_cls()._apply(transformer=model, parallelism_config=_cp_config())
    out["cp"] = _norm_cp(plan)


# --------------------------------------------------------------------------- TP


class _FakeGroup:
    def size(self) -> int:
        return 2

    def rank(self) -> int:
        return 0


class _FakeMesh:
    ndim = 1
    device_type = "cpu"
    mesh_dim_names = ("tp",)

    def size(self, dim: int | None = None) -> int:
        return 2

    def get_group(self, *args, **kwargs) -> _FakeGroup:
        return _FakeGroup()

    def get_local_rank(self, *args, **kwargs) -> int:
        return 0

    def get_rank(self) -> int:
        return 0


def _fmt_placement(placements) -> str:
    if isinstance(placements, (list, tuple)):
        return ",".join(_fmt_placement(p) for p in placements)
    name = type(placements).__name__
    if name == "Replicate":
        return "replicate"
    if name == "Shard":
        return f"shard({placements.dim})"
    if name == "Partial":
        return "partial"
    return repr(placements)


def _style_name(style) -> str:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if type(style) is ColwiseParallel:
        base, default_in, default_out = "colwise", (Replicate(),), (Shard(-1),)
    elif type(style) is RowwiseParallel:
        base, default_in, default_out = "rowwise", (Shard(-1),), (Replicate(),)
    else:
        return type(style).__name__
    extras = []
    inp = tuple(getattr(style, "input_layouts", default_in))
    outp = tuple(getattr(style, "output_layouts", default_out))
    if inp != default_in:
        extras.append(f"input={_fmt_placement(inp)}")
    if outp != default_out:
        extras.append(f"output={_fmt_placement(outp)}")
    if getattr(style, "use_local_output", True) is False:
        extras.append("use_local_output=False")
    return f"{base}({', '.join(extras)})" if extras else base


def _split_block(path: str) -> tuple[str, str] | None:
    """ "transformer_blocks.3.attn" -> ("transformer_blocks", "transformer_blocks.3")."""
    parts = path.split(".") if path else []
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i]), ".".join(parts[: i + 1])
    return None


def _run_tp(transformer_class: str, config: dict | None, out: dict) -> None:
    import torch

    _, tp_reg = _registries()
    model, how = _build_with_fallback(transformer_class, config)
    out.setdefault("construct", how)
    planner_cls = tp_reg.get_planner(model)
    out["tp_planner"] = planner_cls.__name__
    planner = planner_cls()
    fake_mesh = _FakeMesh()
    planner.mesh = lambda *args, **kwargs: fake_mesh

    names = {id(m): name for name, m in model.named_modules()}

    def path_of(obj) -> str | None:
        if id(obj) in names:
            return names[id(obj)]
        # Not a module: look for it as an attribute of a module (e.g. an attention processor).
        for mod_name, mod in model.named_modules():
            for attr, val in vars(mod).items():
                if val is obj and not attr.startswith("_"):
                    return f"{mod_name}.{attr}" if mod_name else attr
        return None

    events: list[tuple] = []

    def rec_parallelize_module(module=None, device_mesh=None, parallelize_plan=None, *args, **kwargs):
        if isinstance(parallelize_plan, dict):
            plan = {str(k): _style_name(v) for k, v in parallelize_plan.items()}
        elif parallelize_plan is None:
            plan = {}
        else:
            plan = {"": _style_name(parallelize_plan)}
        unresolved = [k for k in plan if not _resolves(module, k)]
        events.append(("plan", names.get(id(module)), type(module).__name__, (plan, unresolved)))
        return module

    def rec_shard_div_attr(obj, attr, tp_size, *args, **kwargs):
        events.append(("div", path_of(obj), type(obj).__name__, attr))
        return orig_shard_div_attr(obj, attr, tp_size, *args, **kwargs)

    from cache_dit.distributed import utils as cd_utils

    orig_shard_div_attr = cd_utils.shard_div_attr
    patched: list[tuple] = []
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith("cache_dit.distributed"):
            continue
        for attr, repl in (("parallelize_module", rec_parallelize_module), ("shard_div_attr", rec_shard_div_attr)):
            if attr in vars(mod) and mod is not cd_utils:
                patched.append((mod, attr, vars(mod)[attr]))
                setattr(mod, attr, repl)
    # Some planners move a block to the accelerator and back around a weight rearrangement
    # (Flux2: ``block.to(current_platform.device_type)``); on meta that cannot copy, and the
    # device has no bearing on the plan, so ``Module.to`` is a no-op for meta modules here.
    orig_to = torch.nn.Module.to

    def meta_safe_to(self, *args, **kwargs):
        if any(p.is_meta for p in self.parameters()):
            return self
        return orig_to(self, *args, **kwargs)

    torch.nn.Module.to = meta_safe_to
    try:
        with torch.device("meta"):
            planner._apply(transformer=model, parallelism_config=_tp_config())
    finally:
        torch.nn.Module.to = orig_to
        for mod, attr, orig in reversed(patched):
            setattr(mod, attr, orig)

    # Per block: its layer plan, the keys torch would skip, and its shard_div_attr calls.
    blocks: dict[str, dict[str, dict]] = {}  # list attr -> block path -> record (in call order)
    for kind, path, cls_name, payload in events:
        split = _split_block(path) if path is not None else None
        if split is None:
            list_attr = block = path if path is not None else f"<{cls_name}>"
        else:
            list_attr, block = split
        rec = blocks.setdefault(list_attr, {}).setdefault(
            block, {"layer_plan": {}, "shard_div_attr": {}, "unresolved": []}
        )
        if kind == "plan":
            plan, unresolved = payload
            rec["layer_plan"].update(plan)
            rec["unresolved"].extend(k for k in unresolved if k not in rec["unresolved"])
        else:
            if path is None:
                rel = f"<{cls_name}>"
            elif path == block:
                rel = ""
            elif path.startswith(block + "."):
                rel = path[len(block) + 1 :]
            else:
                rel = path
            attrs = rec["shard_div_attr"].setdefault(rel, [])
            if payload not in attrs:
                attrs.append(payload)

    result: dict[str, dict] = {}
    unresolved_keys: dict[str, list[str]] = {}
    summary: dict[str, dict] = {}
    for list_attr, per_block in blocks.items():
        records = list(per_block.values())
        first = records[0]
        result[list_attr] = {"layer_plan": first["layer_plan"], "shard_div_attr": first["shard_div_attr"]}
        if first["unresolved"]:
            unresolved_keys[list_attr] = first["unresolved"]
        summary[list_attr] = {"count": len(records), "uniform": all(r == first for r in records)}
    out["tp"] = result
    out["tp_unresolved"] = unresolved_keys
    out["tp_blocks"] = summary


def _resolves(module, key: str) -> bool:
    """Whether torch's ``parallelize_module`` would find ``key`` under ``module`` (it warns and skips
    a key whose path matches no submodule; tokens are fnmatch patterns)."""
    from fnmatch import fnmatch

    if key == "":
        return True
    current = [module]
    for token in key.split("."):
        current = [child for m in current for name, child in m.named_children() if fnmatch(name, token)]
        if not current:
            return False
    return True


# --------------------------------------------------------------------------- main


def run_job(job: dict) -> dict:
    transformer_class = job["transformer_class"]
    config = job.get("config")
    out: dict = {"cp": None, "cp_error": None, "tp": None, "tp_error": None}
    for half, fn in (("cp", _run_cp), ("tp", _run_tp)):
        try:
            fn(transformer_class, config, out)
        except Exception as exc:  # noqa: BLE001 - report, never crash
            out[half] = None
            out[f"{half}_error"] = _one_line(exc)
            if os.environ.get("PLANNER_ORACLE_DEBUG"):
                traceback.print_exc()
    return out


def main() -> int:
    jobs = json.loads(sys.stdin.read() or "[]")
    results = [run_job(job) for job in jobs]
    _JSON_OUT.write(json.dumps(results, sort_keys=True))
    _JSON_OUT.write("\n")
    _JSON_OUT.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
