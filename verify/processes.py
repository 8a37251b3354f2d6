"""The worker processes a proof runs in (`python -m integrate.verify._worker`), and what they leave behind.

Each worker reads a job (JSON) on stdin and writes `rank<N>.json` (its report) and `rank<N>.npz` (outputs
and every module's activations) into the job's folder. Worker stdout and stderr go to files: a pipe nobody
reads until the end can fill and stall a gloo pair.
"""

from __future__ import annotations

import json
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from integrate.workers import worker_command

WORKER = "integrate.verify._worker"
PROCESS_TIMEOUT = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(job: dict, env: dict, search_path: str | None = None) -> subprocess.Popen:
    """A worker (`python -I`, see integrate.workers) running `job`; `search_path` is where a source
    checkout's model imports from."""
    out = tempfile.TemporaryFile(mode="w+")
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(worker_command(WORKER, search_path), stdin=subprocess.PIPE, stdout=out, stderr=err,
                            text=True, env=env)
    proc.out_file, proc.err_file = out, err
    proc.stdin.write(json.dumps(job))
    proc.stdin.close()
    return proc


def read(f) -> str:
    f.seek(0)
    text = f.read()
    f.close()
    return text


def wait(procs: list[subprocess.Popen], grace: float = 15.0) -> list[str | None]:
    """Wait for all; once one has finished and the rest have not within `grace` seconds (a peer stuck in
    a collective after a failure), kill them. Returns the stderr tail of each failed process."""
    start, first_done = time.monotonic(), None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if first_done is None and any(p.poll() is not None for p in procs):
            first_done = now
        if (first_done is not None and now - first_done > grace) or now - start > PROCESS_TIMEOUT:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    tails = []
    for p in procs:
        read(p.out_file)
        err = read(p.err_file)
        tails.append(None if p.returncode == 0 else ("\n".join(err.strip().splitlines()[-5:]) or
                                                     f"killed (exit {p.returncode})"))
    return tails


def load_rank(out: Path, rank: int) -> tuple[dict | None, dict[str, np.ndarray]]:
    js, npz = out / f"rank{rank}.json", out / f"rank{rank}.npz"
    if not js.is_file():
        return None, {}
    with np.load(npz) as data:
        arrays = {k: data[k] for k in data.files}
    return json.loads(js.read_text()), arrays


def activations(arrays: dict[str, np.ndarray], variant: str) -> dict[str, list[np.ndarray]]:
    """{module path: its outputs in call order} of one variant."""
    prefix = f"{variant}/act/"
    out: dict[str, list[np.ndarray]] = {}
    for key in sorted((k for k in arrays if k.startswith(prefix)), key=lambda k: int(k.rsplit("#", 1)[1])):
        out.setdefault(key[len(prefix):].rsplit("#", 1)[0], []).append(arrays[key])
    return out
