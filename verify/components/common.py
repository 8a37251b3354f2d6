"""What the component proofs share: the process group, the class and the plugin, seeded weights every rank holds,
module outputs recorded in call order, and the first module whose output parts from the 1-process run."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any

from integrate.verify.compare import figures
from integrate.verify.tensors import plain, randomize, tensors


def init() -> tuple[int, int]:
    """(rank, world) of this job's gloo group, started from the launcher's environment."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    return dist.get_rank(), dist.get_world_size()


def load_class(library: str, name: str, module: str | None = None):
    """`name` from the package model_index.json names (`transformers`, `diffusers`, or a module path); where that
    package does not export it (transformers' `T5GemmaEncoder`), from `module`, the library's own module the analysis
    found it defined in (a dotted name inside `library`, nothing else)."""
    top = importlib.import_module(library)
    if hasattr(top, name) or not module:
        return getattr(top, name)
    if not (module.startswith(library + ".") and all(part.isidentifier() for part in module.split("."))):
        raise ValueError(f"{module!r} is not a module of {library}")
    return getattr(importlib.import_module(module), name)


def import_plugin(job: dict) -> None:
    """The generated plugin, imported as the user's script would: it registers its planners."""
    plugin = job.get("plugin")
    if plugin:
        sys.path.insert(0, plugin["path"])
        importlib.import_module(plugin["import_name"])


def cpu_mesh() -> bool:
    """cache-dit's text-encoder and VAE planners build their mesh on `torch.accelerator`'s device, None on a CPU-only
    machine: there the mesh is built on "cpu" (gloo). True when that was needed."""
    import torch
    from cache_dit.distributed.autoencoders.register import AutoEncoderDataParallelismPlanner
    from cache_dit.distributed.text_encoders.register import TextEncoderTensorParallelismPlanner
    from torch.distributed.device_mesh import init_device_mesh

    if torch.accelerator.current_accelerator() is not None:
        return False

    def te_mesh(self, parallelism_config, **kwargs):
        return init_device_mesh(device_type="cpu", mesh_shape=[parallelism_config.text_encoder_world_size])

    def vae_mesh(self, parallelism_config, **kwargs):
        return init_device_mesh(device_type="cpu", mesh_shape=[parallelism_config.auto_encoder_world_size])

    TextEncoderTensorParallelismPlanner.mesh = te_mesh
    AutoEncoderDataParallelismPlanner.mesh = vae_mesh
    return True


def seeded(model, seed: int = 0) -> None:
    """Seeded weights (integrate.verify.tensors.randomize), then rank 0's copy on every rank."""
    import torch
    import torch.distributed as dist

    randomize(model, seed)
    if dist.is_initialized():
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                if t.is_floating_point() or t.dtype in (torch.int64, torch.int32):
                    dist.broadcast(t.data, src=0)


class Outputs:
    """Forward hooks on every named module: the first tensor each returned, in the order modules finished."""

    def __init__(self, model) -> None:
        self.seen: list[tuple[str, Any]] = []
        self.handles = [m.register_forward_hook(self._hook(name)) for name, m in model.named_modules() if name]

    def _hook(self, name: str):
        def hook(module, args, output):
            ts = tensors(output)
            if ts:
                self.seen.append((name, plain(ts[0]).numpy()))
        return hook

    def take(self) -> list[tuple[str, Any]]:
        seen, self.seen = self.seen, []
        return seen

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def first_divergence(ref: list[tuple[str, Any]], got: list[tuple[str, Any]]) -> dict:
    """The first module (in the 1-process run's order) whose output differs; modules whose output is shaped otherwise
    on the rank (a column-wise shard) are counted as not comparable, never as a match."""
    by_name: dict[str, Any] = {}
    for name, value in got:
        by_name.setdefault(name, value)
    compared = not_comparable = 0
    done: set[str] = set()
    for name, value in ref:
        if name in done:
            continue
        done.add(name)
        other = by_name.get(name)
        if other is None or other.shape != value.shape:
            not_comparable += 1
            continue
        compared += 1
        f = figures(value, other)
        if not f.ok:
            return {"module": name, "max_abs": round(f.max_abs, 9), "cosine": round(f.cosine, 9),
                    "compared": compared, "not_comparable": not_comparable}
    return {"module": None, "compared": compared, "not_comparable": not_comparable}


def error(stage: str, exc: BaseException) -> dict:
    """An exception as the report carries it: where, what, the last lines of its trace."""
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    return {"stage": stage, "module": None, "after": None,
            "at": f"{frame.filename}:{frame.lineno}" if frame else "?", "type": type(exc).__name__,
            "message": (str(exc).splitlines() or [""])[0][:300],
            "trace": traceback.format_exception(exc)[-6:]}


def finish(out: str, rank: int, report: dict) -> None:
    """Write this rank's report, wait for the peers, and leave without tearing the groups down one by one."""
    import json

    import torch.distributed as dist

    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    if "error" not in report and dist.is_initialized():
        dist.barrier()
    sys.stderr.flush()
    os._exit(0)
