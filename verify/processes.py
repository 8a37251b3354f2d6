"""The worker processes a proof runs in (`python -m integrate.verify._worker`), and what they leave behind.

Each worker reads a job (JSON) on stdin and writes `rank<N>.json` (its report) and `rank<N>.npz` (outputs
and every module's activations) into the job's folder. Worker stdout and stderr go to files: a pipe nobody
reads until the end can fill and stall a gloo pair. Every worker runs in a scratch folder of its own (what the
model's code writes to `./` lands there and is removed with it), with the import path `integrate.workers.import_path`
gives; one that could not import the model for a missing package makes `finish` (and `wait`) raise
MissingDependency.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from integrate.missing import MissingDependency
from integrate.workers import scratch_folder, start_worker

WORKER = "integrate.verify._worker"
ZYGOTE = "integrate.verify._zygote"
PROCESS_TIMEOUT = 300
# what differs between the processes of one proof pair; the server starts without them
_PER_RANK = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(job: dict, env: dict, paths: Sequence[str] = (), *, fork: bool = False):
    """A worker running `job`. A proof run, and any job asked to `fork` (a fixture's derivation when proofs
    follow), is forked from the fork server (see verify/_zygote.py), which has torch, diffusers and cache-dit
    imported already; anything else, and everything where there is no fork (or with `INTEGRATE_FORK_SERVER=0`),
    is started afresh (`python -I`, see integrate.workers). `paths` are where the model imports from
    (`integrate.workers.import_path`). Either way the handle has Popen's poll / wait / kill / returncode, the
    `out_file` / `err_file` it wrote and the `paths` it ran with; it runs in a scratch folder of its own."""
    # a fixture alone (--fixture-only) is started afresh: it imports less than the server preloads (no cache-dit)
    server = _server(env, tuple(paths)) if fork or job.get("mode") == "run" else None
    if server is not None:
        forked = server.spawn(job, env)
        if forked is not None:
            forked.paths = tuple(paths)
            return forked
    out = tempfile.TemporaryFile(mode="w+")
    err = tempfile.TemporaryFile(mode="w+")
    proc = start_worker(WORKER, paths, stdin=subprocess.PIPE, stdout=out, stderr=err, text=True, env=env)
    proc.out_file, proc.err_file, proc.paths = out, err, tuple(paths)
    proc.stdin.write(json.dumps(job))
    proc.stdin.close()
    return proc


def read(f) -> str:
    f.seek(0)
    text = f.read()
    f.close()
    return text


def finish(proc) -> tuple[str, str]:
    """The stdout and stderr of a worker that has ended. A worker that could not import the model because a
    package is missing raises MissingDependency (exit 2): nothing it would have proved can be, in this
    environment."""
    out, err = read(proc.out_file), read(proc.err_file)
    _raise_missing(proc, out)
    return out, err


def _raise_missing(proc, out: str) -> None:
    if proc.returncode == 0 or '"missing"' not in out:
        return
    try:
        answer = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return
    if isinstance(answer, dict) and isinstance(answer.get("missing"), dict):
        raise MissingDependency(answer["missing"], getattr(proc, "paths", ()))


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
    tails, missing = [], None
    for p in procs:
        try:
            _, err = finish(p)
        except MissingDependency as exc:  # every file read and closed first
            missing, err = missing or exc, ""
        tails.append(None if p.returncode == 0 else ("\n".join(err.strip().splitlines()[-5:]) or
                                                     f"killed (exit {p.returncode})"))
    if missing is not None:
        raise missing
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


# -- the fork server ------------------------------------------------------------------------------------


class Forked:
    """A worker forked by the fork server: not this process's child, so its exit status comes from the file
    the server writes when it reaps it. Its scratch folder (`cwd`) goes with the handle."""

    def __init__(self, pid: int, rc: Path, out_file, err_file, cwd: str) -> None:
        self.pid, self._rc, self.out_file, self.err_file = pid, rc, out_file, err_file
        self.returncode: int | None = None
        self.paths: tuple[str, ...] = ()
        weakref.finalize(self, shutil.rmtree, cwd, True)

    def poll(self) -> int | None:
        if self.returncode is None and self._rc.is_file():
            self.returncode = int(self._rc.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        start = time.monotonic()
        while self.poll() is None:
            if timeout is not None and time.monotonic() - start > timeout:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.02)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class _Server:
    def __init__(self, env: dict, paths: tuple[str, ...]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="integrate-fork-"))
        self.count = 0
        self.proc = start_worker(ZYGOTE, paths, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, env=env)

    def spawn(self, job: dict, env: dict) -> Forked | None:
        """The forked worker, or None when the server is gone (the caller then starts one afresh). The child runs
        in a scratch folder of its own (`cwd` of the request), removed with its handle."""
        self.count += 1
        paths = {k: self.dir / f"{self.count}.{k}" for k in ("stdin", "stdout", "stderr", "rc")}
        for k in ("stdout", "stderr"):
            paths[k].touch(mode=0o600)
        paths["stdin"].write_text(json.dumps(job))
        cwd = scratch_folder(self.dir)
        request = {"module": WORKER, "env": env, "cwd": cwd, **{k: str(p) for k, p in paths.items()}}
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline()
            pid = json.loads(reply)["pid"]
        except (OSError, ValueError, KeyError):
            shutil.rmtree(cwd, ignore_errors=True)
            return None
        return Forked(pid, paths["rc"], open(paths["stdout"]), open(paths["stderr"]), cwd)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=PROCESS_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


_SERVERS: dict[tuple, _Server] = {}


def _server(env: dict, paths: tuple[str, ...]) -> _Server | None:
    if not hasattr(os, "fork") or env.get("INTEGRATE_FORK_SERVER", os.environ.get("INTEGRATE_FORK_SERVER")) == "0":
        return None
    base = {k: v for k, v in env.items() if k not in _PER_RANK}
    key = (paths, tuple(sorted(base.items())))
    server = _SERVERS.get(key)
    if server is None or server.proc.poll() is not None:
        close_servers()  # one at a time: each holds torch, diffusers and cache-dit in memory
        server = _SERVERS[key] = _Server(base, paths)
    return server


def close_servers() -> None:
    """End the fork servers this process started (each once its children have ended). A server outlives the
    verify that started it, so the next verify in this process (audit's two per row, repair's candidates,
    `survey --verify`'s rows) forks from it too; it ends with the process, or when one for another environment
    or import path is needed."""
    while _SERVERS:
        _SERVERS.popitem()[1].close()


atexit.register(close_servers)
