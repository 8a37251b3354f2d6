"""The proofs' fork server (run by verify/processes.py; never imported by it).

Every proof process would otherwise import torch, diffusers and cache-dit afresh (about 4 s of CPU each, most
of a tiny proof). This process imports them once, started like any worker (`python -I`, the explicit import
path, the memory cap), and forks one child per request; a child is a worker that finds them imported.
Nothing of the model's own code is imported here: each child imports it, as a spawned worker would.

Requests arrive on stdin, one JSON line each: {"module", "env", "cwd", "stdin", "stdout", "stderr", "rc"}: the
child runs `module` as __main__ in the scratch folder `cwd`, with those files as its standard streams, as a
spawned worker would. The reply,
on stdout, is the child's pid. When a child ends, its exit status (negative: the signal) is written to the `rc` file.
No threads: the loop waits on stdin and reaps children between requests, so a child is never forked while
another thread holds a lock. stdin closing ends the server once its children have ended.
"""

from __future__ import annotations

import json
import os
import runpy
import select
import sys
import traceback


def _preload() -> None:
    try:
        import cache_dit  # noqa: F401  (imports diffusers and transformers)
        import diffusers.models  # noqa: F401
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001 - a child imports what it needs and reports any failure itself
        pass


def _child(request: dict) -> None:
    """In the forked child: become the worker the request describes. Never returns."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])  # what the model writes to `./` lands in the child's scratch folder
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, fd)
            os.close(out)
        job = os.open(request["stdin"], os.O_RDONLY)
        os.dup2(job, 0)
        os.close(job)
        sys.stdin = open(0, closefd=False)
        sys.argv = [request["module"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1  # as Python's own exit
    except BaseException:  # noqa: BLE001 - reported on the child's stderr, like a spawned worker's traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _write_rc(path: str, status: int) -> None:
    code = os.waitstatus_to_exitcode(status)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(str(code))
    os.replace(tmp, path)


def main() -> None:
    _preload()
    children: dict[int, str] = {}
    pending = b""
    open_ = True
    while open_ or children:
        while children:  # reap what has ended
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid in children:
                _write_rc(children.pop(pid), status)
        if not open_:  # no more requests: wait for the children left
            pid, status = os.waitpid(-1, 0)
            if pid in children:
                _write_rc(children.pop(pid), status)
            continue
        ready, _, _ = select.select([0], [], [], 0.05)
        if not ready:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            open_ = False
            continue
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()  # nothing of the server's own output is left for a child to write again
            pid = os.fork()
            if pid == 0:
                _child(request)
            children[pid] = request["rc"]
            os.write(1, (json.dumps({"pid": pid}) + "\n").encode())


if __name__ == "__main__":
    main()
