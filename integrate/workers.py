"""Starting the worker processes that import model code (the meta-device probe, the verify proofs).

Torch, diffusers and the model's own code are imported only in workers, never in the process that reads
sources, and a worker starts isolated: `python -I` (no working directory on the path, no PYTHON* variables,
no user site), with its import path given explicitly: this `integrate` package and, for a model in a
source checkout, the folder that holds it. A `torch.py` lying in the working directory is never imported.
"""

from __future__ import annotations

import json
import os
import site
import sys
import sysconfig
from pathlib import Path

# Quiet libraries in a worker unless the user says otherwise; it never needs the network.
_DEFAULTS = {
    "DIFFUSERS_VERBOSITY": "error",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
}
# A worker's address space is capped (GiB, `INTEGRATE_WORKER_MEMORY_GB`; 0: no cap): a model or pipeline
# that asks for far more than a tiny fixture needs fails in its own allocation, reported like any other
# failure, instead of taking the machine's memory. A worker holding a tiny model maps about 1 GiB.
MEMORY_GB = 6
# Runs first in every worker: caps its memory, puts the given folders on the path, silences warnings, runs
# the module.
_BOOT = ("import json, os, runpy, sys, warnings\n"
         "try:\n"
         "    import resource\n"
         f"    cap = int(float(os.environ.get('INTEGRATE_WORKER_MEMORY_GB', '{MEMORY_GB}')) * 2 ** 30)\n"
         "    cap and resource.setrlimit(resource.RLIMIT_AS, (cap, cap))\n"
         "except (ImportError, ValueError, OSError):\n"
         "    pass\n"
         "sys.path[:0] = json.loads(sys.argv[1]); warnings.simplefilter('ignore'); sys.argv = sys.argv[2:]; "
         "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


def worker_env() -> dict[str, str]:
    """The environment a worker starts with (PYTHON* variables are ignored under -I anyway)."""
    env = dict(os.environ)
    for key, value in _DEFAULTS.items():
        env.setdefault(key, value)
    return env


def worker_command(module: str, search_path: Path | str | None = None, *args: str) -> list[str]:
    """`python -I` running `module` as __main__, with this package (and `search_path`, where a source
    checkout's package imports from) on its path."""
    paths = [str(Path(__file__).resolve().parent.parent)]
    if search_path is not None:
        paths.append(str(search_path))
    return [sys.executable, "-I", "-c", _BOOT, json.dumps(paths), module, *args]


def python_command(code: str) -> list[str]:
    """`python -I -c code`: a one-liner that must not see the working directory either."""
    return [sys.executable, "-I", "-c", code]


def installed(path: Path) -> bool:
    """Is `path` inside an installed package (site-packages), rather than a source checkout? Code outside
    installed packages runs only when the user passes --trust-code."""
    roots = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages(),
                                         sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]}
    path = path.resolve()
    return any(path.is_relative_to(r) for r in roots)
