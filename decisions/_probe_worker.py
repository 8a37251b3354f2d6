"""Worker for :mod:`integrate.decisions.probe`: build a transformer on torch's meta device and describe it.

Run as ``python -m integrate.decisions._probe_worker`` with one JSON request on stdin::

    {"module": "diffusers", "cls": "FluxTransformer2DModel", "config_path": "/path/config.json" | null,
     "list_attrs": ["transformer_blocks", ...], "file": "/path/model.py" | null}

Writes exactly one JSON object to stdout and nothing else: everything the imported libraries print
(warnings, logging, stray ``print`` calls, even at the file-descriptor level) goes to stderr. The
answer is ``{"ok": false, "error": "<one line>"}`` for every failure; see :func:`integrate.decisions.probe.probe_transformer`
for the success schema.

Only this process imports torch and the model code; the caller stays free of both.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

ERROR_LIMIT = 400  # characters of one error line


class ProbeError(Exception):
    """A failure with a message already fit for the caller; `missing`: a package the model's import needs and
    does not find, with the imports that lead to it (integrate.missing)."""

    def __init__(self, message: str, missing: dict | None = None) -> None:
        super().__init__(message)
        self.missing = missing


def one_line(text: str, limit: int = ERROR_LIMIT) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_exc(exc: BaseException) -> str:
    msg = one_line(str(exc))
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


# --------------------------------------------------------------------------- loading


def import_torch():
    try:
        import torch
    except ImportError as exc:
        raise ProbeError("torch not installed") from exc
    except Exception as exc:  # a broken install raises anything
        raise ProbeError(f"importing torch failed: {describe_exc(exc)}") from exc
    return torch


def load_module(module: str | None, file: str | None):
    if file:
        path = Path(file)
        if not path.is_file():
            raise ProbeError(f"model file {file} does not exist")
        name = module or path.stem
        if "." in name or name in sys.modules or importlib.util.find_spec(name) is not None:
            name = f"_integrate_probe_{path.stem}"  # never shadow an importable module (e.g. "diffusers")
        # Sibling imports of a loose model file (``from helpers import x``) resolve from its folder.
        sys.path.insert(0, str(path.parent))
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ProbeError(f"cannot load {file} as a Python module")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod  # dataclasses and pickling look the module up while it executes
            spec.loader.exec_module(mod)
        except ProbeError:
            raise
        except (Exception, SystemExit) as exc:
            sys.modules.pop(name, None)
            raise _import_failure(file, exc) from exc
        return mod
    if not module:
        raise ProbeError("request names neither a module nor a file")
    try:
        return importlib.import_module(module)
    except (Exception, SystemExit) as exc:
        raise _import_failure(module, exc) from exc


def _import_failure(what: str, exc: BaseException) -> ProbeError:
    from integrate.missing import found

    missing = found(exc, what)
    if isinstance(exc, ModuleNotFoundError) and exc.name in ("diffusers", "transformers", "torch"):
        return ProbeError(f"{exc.name} not installed (importing {what})", missing)
    return ProbeError(f"importing {what} failed: {describe_exc(exc)}", missing)


def resolve_class(mod, module: str | None, cls: str, torch):
    label = module or getattr(mod, "__name__", "?")
    obj: Any = mod
    try:
        for part in cls.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ProbeError(f"{label} has no class {cls}") from None
    except (Exception, SystemExit) as exc:  # lazy modules import on attribute access
        raise ProbeError(f"loading {cls} from {label} failed: {describe_exc(exc)}") from exc
    if not isinstance(obj, type):
        raise ProbeError(f"{label}.{cls} is not a class")
    if not issubclass(obj, torch.nn.Module):
        raise ProbeError(f"{label}.{cls} is not a torch.nn.Module")
    return obj


def read_config(config_path: str | None) -> dict | None:
    if config_path is None:
        return None
    try:
        raw = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProbeError(f"cannot read config {config_path}: {describe_exc(exc)}") from exc
    except ValueError as exc:
        raise ProbeError(f"config {config_path} is not valid JSON: {one_line(str(exc))}") from exc
    if not isinstance(raw, dict):
        raise ProbeError(f"config {config_path} is not a JSON object")
    return {k: v for k, v in raw.items() if not str(k).startswith("_")}


def build(cls, config: dict | None, torch):
    try:
        with torch.device("meta"):
            if config is None:
                return cls()
            from_config = getattr(cls, "from_config", None)
            if callable(from_config) and hasattr(cls, "config_name"):  # diffusers ConfigMixin
                return from_config(config)
            return cls(**config)
    except (Exception, SystemExit) as exc:
        raise ProbeError(f"building {cls.__name__} on meta failed: {describe_exc(exc)}") from exc


# --------------------------------------------------------------------------- describing


def find_lists(model, list_attrs: list[str], torch) -> tuple[dict[str, list], list[str]]:
    """Resolve each requested attribute (dotted paths allowed) to a list of modules.

    With no attributes requested, every top-level ``nn.ModuleList`` child is taken.
    """
    nn = torch.nn
    found: dict[str, list] = {}
    missing: list[str] = []
    if not list_attrs:
        for name, child in model.named_children():
            if isinstance(child, nn.ModuleList):
                found[name] = list(child)
        return found, missing
    for attr in list_attrs:
        obj: Any = model
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            missing.append(attr)
            continue
        module_list = isinstance(obj, (nn.ModuleList, nn.Sequential))
        plain_list = isinstance(obj, (list, tuple)) and all(isinstance(m, nn.Module) for m in obj)
        if module_list or plain_list:
            found[attr] = list(obj)
        else:
            missing.append(attr)
    return found, missing


def unique_in_order(items) -> list:
    seen: dict = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)


def describe_block(block, torch) -> tuple[dict, dict]:
    linear_cls = torch.nn.Linear
    modules: dict[str, dict] = {}
    ints: dict[str, dict] = {}
    for name, sub in block.named_modules():
        linear = [sub.in_features, sub.out_features] if isinstance(sub, linear_cls) else None
        modules[name] = {"class": type(sub).__name__, "linear": linear}
        found = {k: v for k, v in vars(sub).items() if not k.startswith("_") and k != "training" and type(v) is int}
        if found:
            ints[name] = found
    return modules, ints


def normalise_cp(value: Any) -> Any:
    """``_cp_plan`` values (ContextParallelInput / ContextParallelOutput and containers) as JSON."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {str(k): normalise_cp(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalise_cp(v) for v in value]
    if hasattr(value, "split_dim"):
        return {
            "split_dim": _jsonable(getattr(value, "split_dim", None)),
            "expected_dims": _jsonable(getattr(value, "expected_dims", None)),
            "split_output": _jsonable(getattr(value, "split_output", False)),
        }
    if hasattr(value, "gather_dim"):
        return {
            "gather_dim": _jsonable(getattr(value, "gather_dim", None)),
            "expected_dims": _jsonable(getattr(value, "expected_dims", None)),
        }
    return _jsonable(value)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return repr(value)


def scalar_config(model, config: dict | None) -> dict:
    source = getattr(model, "config", None)
    if not isinstance(source, dict):  # diffusers' FrozenDict is a dict; anything else: the file's keys
        source = config or {}
    return {
        str(k): v for k, v in source.items() if not str(k).startswith("_") and isinstance(v, (bool, int, float, str))
    }


def unused_config_keys(cls, config: dict | None) -> list[str]:
    """Keys of config.json that ``__init__`` does not take (diffusers logs and drops them)."""
    if not config:
        return []
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []  # takes anything: cannot tell
    return sorted(str(k) for k in config if k not in params)


def probe(request: dict) -> dict:
    if not isinstance(request, dict):
        raise ProbeError("request is not a JSON object")
    cls_name = request.get("cls")
    if not cls_name or not isinstance(cls_name, str):
        raise ProbeError("request has no class name")
    module = request.get("module") or None
    file = request.get("file") or None
    list_attrs = [str(a) for a in request.get("list_attrs") or []]

    torch = import_torch()
    config = read_config(request.get("config_path"))
    mod = load_module(module, file)
    cls = resolve_class(mod, module, cls_name, torch)
    model = build(cls, config, torch)

    lists, missing = find_lists(model, list_attrs, torch)
    out_lists: dict[str, dict] = {}
    blocks: dict[str, dict] = {}
    int_attrs: dict[str, dict] = {}
    for attr, elements in lists.items():
        out_lists[attr] = {
            "length": len(elements),
            "block_classes": unique_in_order(type(e).__name__ for e in elements),
        }
        if elements:
            blocks[attr], int_attrs[attr] = describe_block(elements[0], torch)
        else:
            blocks[attr], int_attrs[attr] = {}, {}

    try:
        num_parameters = sum(p.numel() for p in model.parameters())
    except (RuntimeError, TypeError, AttributeError, ValueError):
        num_parameters = None

    return {
        "ok": True,
        "class": cls.__name__,
        "module": cls.__module__,
        "lists": out_lists,
        "missing_lists": missing,
        "blocks": blocks,
        "int_attrs": int_attrs,
        "cp_plan": normalise_cp(getattr(cls, "_cp_plan", None)),
        "config": scalar_config(model, config),
        "unused_config_keys": unused_config_keys(cls, config),
        "num_parameters": num_parameters,
    }


def main() -> int:
    # Keep the real stdout for the answer alone; anything written to fd 1 from here on lands on stderr.
    sys.stdout.flush()
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        try:
            request = json.loads(sys.stdin.read() or "null")
        except ValueError as exc:
            raise ProbeError(f"request is not valid JSON: {one_line(str(exc))}") from exc
        result = probe(request)
    except ProbeError as exc:
        result = {"ok": False, "error": one_line(str(exc))}
        if exc.missing is not None:
            result["missing"] = exc.missing
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a bug here or an odd model: one line, no traceback
        result = {"ok": False, "error": f"probe worker failed: {describe_exc(exc)}"}
    try:
        text = json.dumps(result)
    except (TypeError, ValueError) as exc:
        text = json.dumps({"ok": False, "error": f"probe result is not JSON-serialisable: {describe_exc(exc)}"})
    with os.fdopen(answer_fd, "w", encoding="utf-8") as out:
        out.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
