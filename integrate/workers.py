"""Starting the worker processes that import model code (the meta-device probe, the verify proofs).

Torch, diffusers and the model's own code are imported only in workers, never in the process that reads
sources. `worker_env` is the environment every worker starts with.
"""

from __future__ import annotations

import os
from pathlib import Path

# Quiet libraries in a worker unless the user says otherwise; it never needs the network.
_DEFAULTS = {
    "DIFFUSERS_VERBOSITY": "error",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "PYTHONWARNINGS": "ignore",
}


def worker_env(search_path: Path | None = None) -> dict[str, str]:
    """The environment for `python -m integrate...` workers: this very `integrate` package first on the
    path (installed or not), `search_path` (where a source checkout's package imports from) last."""
    env = dict(os.environ)
    for key, value in _DEFAULTS.items():
        env.setdefault(key, value)
    root = str(Path(__file__).resolve().parent.parent)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in parts:
        parts = [root, *parts]
    if search_path is not None and str(search_path) not in parts:
        parts.append(str(search_path))
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env
