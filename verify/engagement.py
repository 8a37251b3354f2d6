"""What a parallel variant shows of its plan having acted (run in the proof's worker process, never by verify).

A CP or TP run can agree with the 1-process run for the wrong reason: nothing was split or sharded. torch drops
a TP plan key that matches no module with a warning; a CP hook on a module that never runs does nothing; a split
of a tensor whose rank is not the plan's is skipped. So every parallel variant records, beside its numbers:

* TP: each parameter's shape on this rank against its full shape (a DTensor's local shard against its global
  shape, with its placements), and the plan keys torch could not resolve;
* CP: each split / gather hook the plan registered (cache-dit's and diffusers' hooks), whether it fired, and what
  each split made of the tensor it was given (its full and its local shape, along which dim).

`verify/proofs/parallel.py` judges it: a pass with nothing sharded or split is `vacuous`, and a plan key that
matches no module fails the proof.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

from integrate.verify.tiny import kind_of

# where context-parallel hooks live: cache-dit's own, and diffusers' (which cache-dit's runtime may use)
_HOOK_MODULES = ("cache_dit.distributed.core._context_parallel", "diffusers.hooks.context_parallel")
_REGISTRIES = ("cache_dit.distributed.core._hooks", "diffusers.hooks.hooks")
# where cache-dit looks a transformer's planners up by class name (a registered key the name starts with)
_PLANNER_REGISTERS = ("cache_dit.distributed.transformers.register",)
_UNRESOLVED = "could not be resolved"  # torch's warning for a TP plan key that matches no module
MAX_LISTED = 40  # parameters / splits listed per variant (the counts are always whole)


class Engagement:
    """One variant's evidence. `watch(names)` installs the spies (once per process) and makes this the variant they
    report to; `setup(...)` runs the integration's setup under them; `report()` is the JSON the worker writes."""

    current: Engagement | None = None

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self.planned: dict[str, set[str]] = {}  # module path -> hook kinds registered ("split", "gather")
        self.fired: dict[str, set[str]] = {}  # module path -> hook kinds that ran
        self.splits: list[dict] = []  # {module, dim, full, local}
        self.unresolved: list[str] = []
        self.params: list[dict] = []  # {name, full, local, placements}
        self.tp = False
        self.planners: list[dict] = []  # what cache-dit's planner registries answered: {kind, asked, ...}
        _install()
        Engagement.current = self

    @contextmanager
    def setup(self, model, tp: bool):
        """Around the integration's setup: the full shapes before, the TP plan keys torch could not resolve."""
        self.tp = tp
        full = {name: tuple(p.shape) for name, p in model.named_parameters()}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        messages = [str(w.message) for w in caught if _UNRESOLVED in str(w.message)]
        # a list of blocks of two kinds (dense and mixture-of-experts) gets one layer plan: a key another kind of
        # block lacks is skipped there and resolved in the others; only a key no module of the model answers counts
        paths = [name.split(".") for name, _ in model.named_modules()]
        self.unresolved = list(dict.fromkeys(m for m in messages if not _resolves(_key_of(m), paths)))
        if tp:
            self.params = _shards(model, full)

    def report(self) -> dict:
        out: dict = {"planners": self.planners} if self.planners else {}
        if self.tp:
            sharded = [p for p in self.params if p["local"] != p["full"] or any(
                x.startswith("Shard") for x in p.get("placements", ()))]
            kinds = {}  # one row per kind of parameter (`transformer_blocks.*.attn.to_q.weight`), as named first
            for p in sharded:
                kinds.setdefault(kind_of(p["name"]), p)
            out["tp"] = {"parameters": len(self.params), "sharded": len(sharded),
                         "shards": list(kinds.values())[:MAX_LISTED], "unresolved": self.unresolved}
        if self.planned:
            cut = [s for s in self.splits if s["local"] != s["full"]]
            out["cp"] = {"hooks": sum(len(k) for k in self.planned.values()),
                         "fired": sum(len(self.fired.get(m, ())) for m in self.planned),
                         "unfired": sorted(f"{m or '<root>'} ({kind})" for m, kinds in self.planned.items()
                                           for kind in sorted(kinds - self.fired.get(m, set()))),
                         "split": len(cut), "splits": (cut or self.splits)[:MAX_LISTED]}
        return out

    def _path(self, module) -> str:
        return self.names.get(id(module), f"<{type(module).__name__}>")


def _key_of(message: str) -> str | None:
    """The plan key torch's warning names (`Parallelize plan key 'a.b' could not be resolved: ...`)."""
    _, sep, rest = message.partition("key '")
    key, sep2, _ = rest.partition("' could not")
    return key if sep and sep2 else None


def _resolves(key: str | None, paths: list[list[str]]) -> bool:
    """Does `key` (torch's fnmatch tokens) name the tail of some module's path?"""
    from fnmatch import fnmatch

    if not key:
        return False
    tokens = key.split(".")
    return any(len(p) >= len(tokens) and all(fnmatch(a, b) for a, b in zip(p[-len(tokens):], tokens)) for p in paths)


def _shards(model, full: dict[str, tuple]) -> list[dict]:
    out = []
    for name, p in model.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        row = {"name": name, "full": list(full.get(name, tuple(p.shape))), "local": list(local.shape)}
        if hasattr(p, "placements"):
            row["placements"] = [str(x) for x in p.placements]
            row["full"] = list(p.shape)  # a DTensor's shape is the global one
        out.append(row)
    return out


_INSTALLED: set[str] = set()


def _first_import(names):
    """Each module of `names` that imports and has not been handed out before in this process."""
    import importlib

    for name in names:
        if name in _INSTALLED:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        _INSTALLED.add(name)
        yield module


def _install() -> None:
    """Wrap the hook classes' methods once per process; each call reports to `Engagement.current`."""
    for module in _first_import(_HOOK_MODULES):
        for cls in vars(module).values():
            if not isinstance(cls, type):
                continue
            if cls.__name__.endswith("SplitHook"):
                _wrap(cls, "pre_forward", "split")
                _wrap(cls, "post_forward", "split")  # an output split (`split_output`) is made after forward
                if hasattr(cls, "_prepare_cp_input"):
                    _wrap_prepare(cls)
            elif cls.__name__.endswith("GatherHook"):
                _wrap(cls, "post_forward", "gather")
    for module in _first_import(_REGISTRIES):
        registry = getattr(module, "HookRegistry", None)
        if registry is not None and "register_hook" in vars(registry):
            _wrap_register(registry)
    for module in _first_import(_PLANNER_REGISTERS):
        for name, kind in (("ContextParallelismPlannerRegister", "cp"), ("TensorParallelismPlannerRegister", "tp")):
            register = getattr(module, name, None)
            if register is not None and "get_planner" in vars(register):
                _wrap_lookup(register, kind)


_CURRENT_MODULE: list = []


def _wrap(cls, method: str, kind: str) -> None:
    original = getattr(cls, method)

    def spy(self, module, *args, **kwargs):
        e = Engagement.current
        if e is not None:
            e.fired.setdefault(e._path(module), set()).add(kind)
        _CURRENT_MODULE.append(module)
        try:
            return original(self, module, *args, **kwargs)
        finally:
            _CURRENT_MODULE.pop()

    setattr(cls, method, spy)


def _wrap_prepare(cls) -> None:
    original = cls._prepare_cp_input

    def spy(self, tensor, cp_input):
        result = original(self, tensor, cp_input)
        e = Engagement.current
        if e is not None and len(e.splits) < 4 * MAX_LISTED:
            module = e._path(_CURRENT_MODULE[-1]) if _CURRENT_MODULE else "?"
            e.splits.append({"module": module, "dim": getattr(cp_input, "split_dim", None),
                             "full": list(tensor.shape), "local": list(result.shape)})
        return result

    cls._prepare_cp_input = spy


def _wrap_register(registry) -> None:
    original = registry.register_hook

    def spy(self, hook, name):
        e = Engagement.current
        if e is not None and isinstance(name, str) and name.startswith(("cp_input", "cp_output")):
            kind = "split" if type(hook).__name__.endswith("SplitHook") else "gather"
            e.planned.setdefault(e._path(self._module_ref), set()).add(kind)
        return original(self, hook, name)

    registry.register_hook = spy


def _wrap_lookup(register, kind: str) -> None:
    """Record what the registry answers for each lookup: the planner class, the key it is registered under and
    where it is defined, or the registry's refusal (it registers nothing the class name starts with)."""
    original = register.get_planner  # bound to the register class

    def spy(cls, transformer, *args, **kwargs):
        asked = transformer if isinstance(transformer, str) else type(transformer).__name__
        e = Engagement.current
        try:
            found = original(transformer, *args, **kwargs)
        except Exception as exc:
            if e is not None:
                e.planners.append({"kind": kind, "asked": asked, "found": False,
                                   "why": f"{type(exc).__name__}: {str(exc)[:200]}"})
            raise
        if e is not None:
            e.planners.append({"kind": kind, "asked": asked, "found": True, **_where(cls, found, asked)})
        return found

    register.get_planner = classmethod(spy)


def _where(register, planner, asked: str) -> dict:
    """The planner's dotted name, the registry key that answered (the first the name starts with, as cache-dit's
    lookup walks them) and the file and line of its class."""
    import inspect

    keys = [k for table in vars(register).values() if isinstance(table, dict)
            for k, v in table.items() if v is planner and isinstance(k, str) and asked.startswith(k)]
    out = {"planner": f"{planner.__module__}.{planner.__qualname__}", "key": keys[0] if keys else None}
    try:
        out["file"] = inspect.getsourcefile(planner) or ""
        out["line"] = inspect.getsourcelines(planner)[1]
    except (OSError, TypeError):
        pass
    return out
