"""The proofs' worker processes: forked from the fork server (torch, diffusers and cache-dit imported once) or
started afresh, a worker reports the same way: its exit status, its stdout and stderr, a kill seen as one.
A fixture's check is always started afresh."""

from __future__ import annotations

import json
import os

import pytest

from integrate.verify import processes
from integrate.workers import worker_env


@pytest.fixture(params=["fork-server", "fresh"])
def env(request, monkeypatch):
    monkeypatch.setenv("INTEGRATE_FORK_SERVER", "1" if request.param == "fork-server" else "0")
    yield worker_env()
    processes.close_servers()


def _finish(proc) -> tuple[int, str, str]:
    proc.wait(timeout=120)
    return proc.returncode, processes.read(proc.out_file), processes.read(proc.err_file)


def test_a_worker_that_fails_reports_its_status_and_traceback(env, tmp_path):
    job = {"mode": "run", "kind": "baseline", "variants": [{"name": "baseline"}], "fixture": str(tmp_path / "no.py"),
           "out": str(tmp_path), "search_path": None, "threshold": 0.0}
    proc = processes.spawn(job, env)
    assert isinstance(proc, processes.Forked) == (os.environ["INTEGRATE_FORK_SERVER"] == "1")
    code, out, err = _finish(proc)
    assert code == 1 and out == ""
    assert "Traceback" in err and "no.py" in err


def test_a_worker_that_succeeds_writes_its_json_on_stdout(env, tmp_path):
    fixture = tmp_path / "verify_fixture.py"
    fixture.write_text("TRANSFORMER_MODULE = 'torch.nn'\nTRANSFORMER_CLASS = 'Identity'\nCONFIG = {}\nSTEPS = 1\n"
                       "SEED = 0\n\n\n"
                       "def inputs(step):\n    import torch\n    return {'input': torch.ones(2)}\n")
    proc = processes.spawn({"mode": "check", "fixture": str(fixture)}, env)
    assert not isinstance(proc, processes.Forked)
    code, out, err = _finish(proc)
    assert code == 0, err
    assert "error" in json.loads(out)  # the worker's own report, whatever it says of this stand-in model


def test_a_killed_worker_is_seen_as_killed(env, tmp_path):
    slow = tmp_path / "slow.py"
    slow.write_text("import time\n\ntime.sleep(120)\n")  # the worker is still loading it when it is killed
    job = {"mode": "run", "kind": "baseline", "variants": [{"name": "baseline"}], "fixture": str(slow),
           "out": str(tmp_path), "search_path": None, "threshold": 0.0}
    proc = processes.spawn(job, env)
    proc.kill()
    code, _, _ = _finish(proc)
    assert code == -9
