"""Fixture config and inputs from a diffusers-style model test (runs in a verify worker only: it imports and
runs the test file, which needs `--trust-code`).

diffusers' `tests/models/transformers/test_models_transformer_*.py` give nearly every transformer a tiny
config and forward inputs written by the model's authors: a class with `get_init_dict()` and
`get_dummy_inputs()` (or, in older files, `prepare_init_args_and_inputs_for_common()` returning both). The
file is imported as a module of its own package (the folders above it that hold an `__init__.py`), so its
relative imports work as they do under pytest.

The config is used as written, except that a layer count of 1 becomes 2: a cached list needs two blocks
for the cache proof to have a block to cache. The inputs are repeated for each step with the latent moved
a little, as it moves while denoising.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

from .tiny import is_layers


class NotFromTestFile(Exception):
    pass


def module_of(path: Path) -> tuple[str, Path]:
    """(dotted module name, folder to put on sys.path) for a file inside a package tree."""
    path = path.resolve()
    parts = [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts), folder


def _tester(module):
    """The first class (in file order) that can say both the init dict and the dummy inputs."""
    classes = [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__]
    classes.sort(key=lambda c: inspect.getsourcelines(c)[1])
    for c in classes:
        if hasattr(c, "get_init_dict") and hasattr(c, "get_dummy_inputs"):
            return c, "split"
    for c in classes:
        if hasattr(c, "prepare_init_args_and_inputs_for_common"):
            return c, "common"
    return None, None


def _instance(cls):
    try:
        return cls()
    except TypeError:
        return cls("__init__")  # a unittest.TestCase wants a method name; any existing one will do


def load(path: str, model_cls) -> tuple[dict, dict, dict]:
    """(config, changes {key: [before, after]}, forward inputs) from the test file at `path`."""
    import torch

    name, root = module_of(Path(path))
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - the test file's own imports
        raise NotFromTestFile(f"importing {path} as {name} failed: {type(exc).__name__}: "
                              f"{(str(exc).splitlines() or [''])[0][:200]}") from None
    cls, style = _tester(module)
    if cls is None:
        raise NotFromTestFile(f"{path} has no class with get_init_dict() and get_dummy_inputs()")
    try:
        tester = _instance(cls)
        if style == "split":
            init, inputs = dict(tester.get_init_dict()), dict(tester.get_dummy_inputs())
        else:
            init, inputs = (dict(x) for x in tester.prepare_init_args_and_inputs_for_common())
    except Exception as exc:  # noqa: BLE001 - the test class's own code
        raise NotFromTestFile(f"{cls.__name__} did not give its config and inputs: {type(exc).__name__}: "
                              f"{(str(exc).splitlines() or [''])[0][:200]}") from None
    model_class = getattr(tester, "model_class", None)
    if isinstance(model_class, type) and model_class.__name__ != model_cls.__name__:
        raise NotFromTestFile(f"{cls.__name__} tests {model_class.__name__}, not {model_cls.__name__}")
    config, changes = {}, {}
    for key, value in init.items():
        if isinstance(value, tuple):
            value = list(value)
        if is_layers(key) and value == 1:
            changes[key] = [1, 2]
            value = 2
        config[key] = value
    inputs = {k: v.detach().to("cpu") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return config, changes, inputs


def steps_of(inputs: dict, main: str, steps: int) -> list[dict]:
    """The inputs once per step, the latent (`main`) moved by 0.2% of fresh noise each step."""
    import torch

    out = []
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        call = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
        latent = call.get(main)
        if isinstance(latent, torch.Tensor) and latent.is_floating_point() and step:
            call[main] = latent + 0.002 * step * torch.randn(latent.shape, generator=g, dtype=latent.dtype)
        out.append(call)
    return out
