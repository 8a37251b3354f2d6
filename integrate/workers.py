"""Starting the worker processes that import model code (the meta-device probe, the verify proofs).

Torch, diffusers and the model's own code are imported only in workers, never in the process that reads
sources, and a worker starts isolated: `python -I` (no working directory on the path, no PYTHON* variables,
no user site), with its import path given explicitly (`import_path`): this `integrate` package, each
`--source-root` folder, the folder that holds a source checkout's top-level package, and the user's PYTHONPATH
entries (which `-I` would drop). A `torch.py` lying in the working directory is never imported.

Every worker runs in a scratch folder of its own (`run_worker`, `start_worker`): a model whose code writes
`./results` while it is imported or run writes it there, never into the user's folder; the folder is removed
when the worker is done with.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import weakref
import zipfile
from collections.abc import Sequence
from pathlib import Path

from integrate.errors import InputError

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


def _folder(entry: str | Path, label: str, out: list[str], zip_ok: bool = False) -> None:
    """`entry` made absolute and added to `out` (once); an InputError naming `label` where it is no folder."""
    path = Path(entry).absolute()
    if not path.exists():
        raise InputError(f"{label} {entry}: no such folder")
    if not path.is_dir() and not (zip_ok and path.is_file() and zipfile.is_zipfile(path)):
        raise InputError(f"{label} {entry}: not a folder")
    if str(path) not in out:
        out.append(str(path))


def model_roots(package_root: Path | str | None = None, source_roots: Sequence[str] = (),
                source: str = "--source-root") -> tuple[str, ...]:
    """Where the model's own code imports from: each of `source_roots` (`--source-root`, as the plan records
    them; `source` says where they came from in a message), then `package_root` (the folder holding a source
    checkout's top-level package). Each must be a folder: one that is not is an InputError naming it."""
    out: list[str] = []
    for root in source_roots:
        _folder(root, source, out)
    if package_root is not None:
        _folder(package_root, "the model's package root", out)
    return tuple(out)


def user_path() -> tuple[str, ...]:
    """The user's PYTHONPATH entries, made absolute (workers start with -I, which drops PYTHONPATH: they get them
    explicitly). Each must be a folder or a zip archive (an InputError otherwise). An empty entry (Python reads it
    as the working directory) is left out: the working directory is never on a worker's path."""
    out: list[str] = []
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry:
            _folder(entry, "PYTHONPATH entry", out, zip_ok=True)
    return tuple(out)


def import_path(package_root: Path | str | None = None, source_roots: Sequence[str] = (),
                source: str = "--source-root") -> tuple[str, ...]:
    """The folders a worker that imports the model puts on its path (after this package's), in order: the model's
    roots (`model_roots`: --source-root folders, a source checkout's package root), then the user's PYTHONPATH
    (`user_path`)."""
    roots = model_roots(package_root, source_roots, source)
    return roots + tuple(p for p in user_path() if p not in roots)


def worker_command(module: str, paths: Sequence[str] = (), *args: str) -> list[str]:
    """`python -I` running `module` as __main__, with this package and `paths` (`import_path`: where the model
    imports from) on its path."""
    return [sys.executable, "-I", "-c", _BOOT, json.dumps([str(Path(__file__).resolve().parent.parent), *paths]),
            module, *args]


def run_worker(module: str, paths: Sequence[str] = (), *args: str, env: dict | None = None,
               **options) -> subprocess.CompletedProcess:
    """`subprocess.run` of `worker_command(module, paths, *args)` in a scratch folder of its own (removed once it
    has ended), with `worker_env()` unless `env` is given; `options` go to subprocess.run."""
    with tempfile.TemporaryDirectory(prefix="integrate-worker-") as cwd:
        return subprocess.run(worker_command(module, paths, *args), cwd=cwd,
                              env=worker_env() if env is None else env, **options)


def start_worker(module: str, paths: Sequence[str] = (), *args: str, **options) -> subprocess.Popen:
    """`subprocess.Popen` of `worker_command(module, paths, *args)` in a scratch folder of its own, removed when
    the handle is collected (or at exit); `options` go to Popen."""
    cwd = scratch_folder()
    proc = subprocess.Popen(worker_command(module, paths, *args), cwd=cwd, **options)
    weakref.finalize(proc, shutil.rmtree, cwd, True)
    return proc


def scratch_folder(parent: Path | str | None = None) -> str:
    """A fresh empty folder for a worker to run in (under `parent`, or the system's temporary folder)."""
    return tempfile.mkdtemp(prefix="integrate-worker-", dir=parent)


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
