"""Cross-check static facts against the real module tree, built on torch's meta device.

:func:`probe_transformer` builds the transformer class from its ``config.json`` with
``torch.device("meta")`` (no weights, no memory) in a worker subprocess
(:mod:`integrate.decisions._probe_worker`, run in a scratch folder of its own: see integrate.workers) and reports
its structure. This process never imports torch or diffusers; every failure comes back as
``{"ok": False, "error": "<one line>"}``, with ``"missing"`` (integrate.missing) where importing the model needs a
package that is not installed.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from integrate.workers import run_worker

WORKER = "integrate.decisions._probe_worker"
DEFAULT_TIMEOUT = 120.0

def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fail(error: str) -> dict:
    return {"ok": False, "error": _one_line(error)}


def probe_transformer(
    module: str,
    cls: str,
    config_path: Path | None,
    list_attrs: Sequence[str],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    file: Path | None = None,
    paths: Sequence[str] = (),
) -> dict:
    """Build ``module.cls`` from ``config_path`` on the meta device and describe it.

    ``module`` is the importable module defining the class (``"diffusers"`` or
    ``"diffusers.models.transformers.transformer_flux"``); with ``file`` (a loose ``.py`` file) the
    class is loaded from that file instead and ``module`` only names it. ``config_path`` is the
    transformer's ``config.json`` (keys starting with ``_`` dropped; ``None``: the class's defaults).
    ``list_attrs`` names the block lists to describe (dotted paths allowed; empty: every top-level
    ``nn.ModuleList``). ``paths`` go on the worker's import path (`integrate.workers.import_path`: the
    --source-root folders, the folder holding a source checkout's top-level package, the user's PYTHONPATH), so a
    model outside site-packages imports by its dotted name.

    Never raises for model problems. Failure: ``{"ok": False, "error": "<one line>"}``, and ``"missing"``
    (``{"module", "package", "chain", "via"?}``, integrate.missing) where a package the import needs is not
    installed. Success::

        {"ok": True, "class": "FluxTransformer2DModel", "module": "<defining module>",
         "lists": {attr: {"length": int, "block_classes": [unique class names, in order]}},
         "missing_lists": [requested attrs that are absent or not module lists],
         "blocks": {attr: {"<path inside element 0>": {"class": name, "linear": [in, out] | None}}},
         "int_attrs": {attr: {"<path inside element 0>": {"name": int, ...}}},
         "cp_plan": {key: {param: {"split_dim", "expected_dims", "split_output"}}
                          | {"gather_dim", "expected_dims"} | [...]} | None,
         "config": {key: int | float | str | bool},  # the built model's resolved config
         "unused_config_keys": [config.json keys that __init__ does not take],
         "num_parameters": int | None}

    Paths are ``named_modules()`` names relative to element 0 of the list (its root is ``""``).
    """
    if isinstance(list_attrs, str):
        list_attrs = [list_attrs]
    request = {
        "module": module,
        "cls": cls,
        "config_path": str(Path(config_path).resolve()) if config_path is not None else None,
        "list_attrs": [str(a) for a in list_attrs],
        "file": str(Path(file).resolve()) if file is not None else None,
    }
    try:
        proc = run_worker(WORKER, paths, check=False, input=json.dumps(request), capture_output=True, text=True,
                          timeout=timeout)
    except subprocess.TimeoutExpired:
        return _fail(f"probing {cls} timed out after {timeout:g}s")
    except OSError as exc:
        return _fail(f"cannot start the probe worker: {type(exc).__name__}: {exc}")

    result = _parse(proc.stdout)
    if result is None:
        return _fail(
            f"probe worker for {cls} returned no JSON (exit code {proc.returncode}){_stderr_tail(proc.stderr)}"
        )
    if "ok" not in result:
        return _fail(f"probe worker for {cls} returned an answer without 'ok'")
    if not result["ok"]:
        failed = _fail(str(result.get("error") or "probe failed"))
        if isinstance(result.get("missing"), dict):
            failed["missing"] = result["missing"]
        return failed
    return result


def _parse(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    return None


def _stderr_tail(stderr: str) -> str:
    lines = [line for line in (stderr or "").splitlines() if line.strip()]
    return f": {lines[-1].strip()}" if lines else ""
