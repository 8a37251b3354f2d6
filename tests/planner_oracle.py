"""Ground truth for CP/TP plans, taken from cache-dit's own registered planners.

cache-dit registers context-parallel planners with ``ContextParallelismPlannerRegister.register(prefix)``
and tensor-parallel planners with ``TensorParallelismPlannerRegister.register(prefix)``. This module runs
those planners (in a subprocess: several monkeypatch diffusers classes globally) on a transformer built
on the meta device and reports what they plan, normalised to plain JSON:

    {
      "cp": {key: {str(param): {"split_dim", "expected_dims", "split_output"}}
                  | {"gather_dim", "expected_dims"} | [ ... ]} | None,
      "cp_error": "ValueError: ..." | None,
      "tp": {list_attr: {"layer_plan": {module_path: style},
                         "shard_div_attr": {attn_relpath: [attr, ...]}}} | None,
      "tp_error": "ValueError: ..." | None,
      # informational
      "construct": "default" | "config" | "tiny", "cp_planner": str, "tp_planner": str,
      "tp_blocks": {list_attr: {"count": blocks parallelised, "uniform": all like the first}},
      "tp_unresolved": {list_attr: [layer_plan keys that match no submodule, which torch skips]},
    }

TP styles: "colwise", "rowwise", "colwise(output=replicate)", "rowwise(input=replicate)"; other layout
choices are spelled the same way (e.g. "colwise(input=shard(1))"); any other ParallelStyle is named by
its class. The TP layer plan and ``shard_div_attr`` calls are those of the first block of each list.

Results are memoised per (class, config) for the life of the process; ``cache_dit_plans_many`` fills the
memo for several classes with one worker process.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().with_name("_planner_oracle_worker.py")
TIMEOUT_S = 900

_RESULTS: dict[str, dict] = {}


def _key(transformer_class: str, config: dict | None) -> str:
    return json.dumps([transformer_class, config or None], sort_keys=True)


def _job(key: str) -> dict:
    transformer_class, config = json.loads(key)
    return {"transformer_class": transformer_class, "config": config}


def _crash(message: str) -> dict:
    return {"cp": None, "cp_error": message, "tp": None, "tp_error": message}


def _run_worker(jobs: list[dict]) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, str(WORKER)],
        check=False,
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=TIMEOUT_S,
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()
        raise RuntimeError(f"planner oracle worker exited {proc.returncode}: {tail[-1] if tail else ''}")
    results = json.loads(proc.stdout)
    if not isinstance(results, list) or len(results) != len(jobs):
        raise RuntimeError("planner oracle worker returned a malformed answer")
    return results


def _fill(keys: list[str]) -> None:
    missing = [k for k in dict.fromkeys(keys) if k not in _RESULTS]
    if not missing:
        return
    try:
        results = _run_worker([_job(k) for k in missing])
    except Exception as batch_exc:  # noqa: BLE001 - one model took the whole worker down: isolate it
        if len(missing) == 1:
            _RESULTS[missing[0]] = _crash(f"WorkerCrash: {batch_exc}")
            return
        for k in missing:
            try:
                _RESULTS[k] = _run_worker([_job(k)])[0]
            except Exception as exc:  # noqa: BLE001 - recorded as the model's error
                _RESULTS[k] = _crash(f"WorkerCrash: {exc}")
        return
    for k, result in zip(missing, results):
        _RESULTS[k] = result


def cache_dit_plans(transformer_class: str, config: dict | None = None) -> dict:
    """cache-dit's CP and TP plans for ``diffusers.<transformer_class>`` (built from ``config``, or
    with its default init arguments when ``config`` is None)."""
    key = _key(transformer_class, config)
    _fill([key])
    return copy.deepcopy(_RESULTS[key])


def cache_dit_plans_many(names: list[str], configs: dict[str, dict] | None = None) -> dict[str, dict]:
    """``cache_dit_plans`` for several classes, with a single worker process for all those not yet
    memoised. ``configs`` optionally maps a class name to the config to build it from."""
    configs = configs or {}
    keys = {name: _key(name, configs.get(name)) for name in names}
    _fill(list(keys.values()))
    return {name: copy.deepcopy(_RESULTS[key]) for name, key in keys.items()}


def cache_clear() -> None:
    _RESULTS.clear()


if __name__ == "__main__":
    print(json.dumps(cache_dit_plans_many(sys.argv[1:]), indent=2, sort_keys=True))
