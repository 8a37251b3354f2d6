"""Import a generated plugin and ask cache-dit's own registries about it (run as a subprocess).

stdin: {"path", "import_name", "transformer_class", "config", "whole_package"}. With whole_package
the package is imported (its registrations and cache-dit's built-ins load); without it only the
planner modules are loaded, so a model cache-dit already supports can be compared planner to planner.
stdout: one JSON object.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

sys.stdout, _REAL = sys.stderr, sys.stdout  # keep library chatter off the JSON channel


def _plan_json(plan: dict) -> dict:
    out = {}
    for key, value in plan.items():
        if hasattr(value, "gather_dim"):
            out[key] = {"gather_dim": value.gather_dim, "expected_dims": value.expected_dims}
            continue
        inner = {}
        for param, spec in value.items():
            specs = spec if isinstance(spec, list) else [spec]
            rows = [{"split_dim": s.split_dim, "expected_dims": s.expected_dims, "split_output": s.split_output}
                    for s in specs]
            inner[str(param)] = rows if isinstance(spec, list) else rows[0]
        out[key] = inner
    return out


class _Group:
    def size(self):
        return 2

    def rank(self):
        return 0


class _Mesh:
    def size(self):
        return 2

    def get_group(self):
        return _Group()

    def get_local_rank(self):
        return 0


def _style(style) -> str:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if isinstance(style, ColwiseParallel):
        return "colwise(output=replicate)" if isinstance(style.output_layouts[0], Replicate) else "colwise"
    if isinstance(style, RowwiseParallel):
        return "rowwise(input=replicate)" if isinstance(style.input_layouts[0], Replicate) else "rowwise"
    return type(style).__name__


def _tp(tp_module, planner_cls, model) -> dict:
    names = {id(m): n for n, m in model.named_modules()}
    first: dict[str, dict] = {}

    def record(module=None, device_mesh=None, parallelize_plan=None, **kwargs):
        path = names[id(module)]
        attr = path.rsplit(".", 1)[0]
        first.setdefault(attr, {"layer_plan": {k: _style(v) for k, v in parallelize_plan.items()},
                                "shard_div_attr": {}, "block": path, "count": 0})
        first[attr]["count"] += 1
        return module

    divs: list[tuple[str, str]] = []

    def div(obj, attr, size, **kwargs):
        divs.append((names.get(id(obj), "?"), attr))
        setattr(obj, attr, getattr(obj, attr) // size)

    tp_module.parallelize_module, tp_module.shard_div_attr = record, div
    planner = planner_cls()
    planner.mesh = lambda **kwargs: _Mesh()
    planner._apply(transformer=model, parallelism_config=None)
    for attr, rec in first.items():
        for path, name in divs:
            if path.startswith(rec["block"] + "."):
                rec["shard_div_attr"].setdefault(path[len(rec["block"]) + 1:], [])
                if name not in rec["shard_div_attr"][path[len(rec["block"]) + 1:]]:
                    rec["shard_div_attr"][path[len(rec["block"]) + 1:]].append(name)
    return {attr: {"layer_plan": r["layer_plan"], "shard_div_attr": r["shard_div_attr"], "count": r["count"]}
            for attr, r in first.items()}


def main() -> None:
    job = json.loads(sys.stdin.read())
    sys.path.insert(0, job["path"])
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    import diffusers
    import torch

    name = job["import_name"]
    out: dict = {}
    config = job.get("config") or {}

    def build():
        with torch.device("meta"):
            cls = getattr(diffusers, job["transformer_class"])
            return cls.from_config(config) if config else cls()

    if job.get("whole_package"):
        importlib.import_module(name)
        from cache_dit._utils.registers import ExampleRegister
        from cache_dit.caching.block_adapters.block_registers import BlockAdapterRegister
        from cache_dit.distributed.transformers.register import (
            ContextParallelismPlannerRegister,
            TensorParallelismPlannerRegister,
        )

        model = build()
        out["cp_planner"] = ContextParallelismPlannerRegister.get_planner(model).__name__
        out["tp_planner"] = TensorParallelismPlannerRegister.get_planner(model).__name__
        out["examples"] = [e for e in ExampleRegister.list_examples() if e == job["example"]]
        cp_cls = ContextParallelismPlannerRegister.get_planner(model)
        out["cp"] = _plan_json(cp_cls()._apply(transformer=model, parallelism_config=None))
        adapter = BlockAdapterRegister.get_adapter(model)
        out["adapter_blocks"] = [len(b) for b in adapter.blocks]
        out["adapter_patterns"] = [p.name for p in adapter.forward_pattern]
        out["has_separate_cfg"] = adapter.has_separate_cfg
        out["cp_patched"] = _plan_json(cp_cls()._apply(transformer=model, parallelism_config=None))
        tp_module = sys.modules[TensorParallelismPlannerRegister.get_planner(model).__module__]
        out["tp"] = _tp(tp_module, TensorParallelismPlannerRegister.get_planner(model), model)
        if job.get("text_encoder"):
            from cache_dit.distributed.text_encoders.register import TextEncoderTensorParallelismPlannerRegister

            out["te_planner"] = TextEncoderTensorParallelismPlannerRegister.get_planner(job["text_encoder"]).__name__
    else:
        cp_module = importlib.import_module(f"{name}.cp_planner")
        tp_module = importlib.import_module(f"{name}.tp_planner")
        cp_cls = next(v for k, v in vars(cp_module).items() if k.endswith("ContextParallelismPlanner") and k[0] != "_"
                      and v.__module__ == cp_module.__name__)
        tp_cls = next(v for k, v in vars(tp_module).items() if k.endswith("TensorParallelismPlanner") and k[0] != "_"
                      and v.__module__ == tp_module.__name__)
        out["cp"] = _plan_json(cp_cls()._apply(transformer=build(), parallelism_config=None))
        out["tp"] = _tp(tp_module, tp_cls, build())
    _REAL.write(json.dumps(out))


if __name__ == "__main__":
    main()
