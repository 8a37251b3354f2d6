"""Compare the static facts with the model built from config.json on the meta device.

The probe (integrate.decisions.probe) builds the transformer without weights in a subprocess and reports its
real module tree, list lengths, Linear shapes and integer attributes. Each static fact that the build
can confirm is compared; a disagreement is reported, never hidden, and the static plan is not
silently replaced by the build's numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from integrate.analyzers.records import Analysis, ParallelFacts

from integrate.missing import MissingDependency
from integrate.resolve import Workspace
from integrate.workers import import_path, installed

from .probe import probe_transformer
from .records import CrossCheck

SKIPPED = CrossCheck(None, "skipped (--no-probe)", (), 0)
_INSTEAD = "or plan without building the model: --no-probe"


def check_on_meta(analysis: Analysis, ws: Workspace, trust_code: bool = False) -> CrossCheck:
    """The analysis's parallelism facts against the transformer built from its config on the meta device.
    Building runs the model's code: a transformer outside installed packages is built only with
    `trust_code` (otherwise the check says it was skipped, and why). Importing it in a worker needs packages this
    environment may not have: a missing one is a MissingDependency (exit 2), never a finding about the model."""
    gate = analysis.gate
    t_file = gate.value("transformer_file")
    if not trust_code and not installed(Path(t_file)):
        return CrossCheck(None, f"skipped: {t_file} is not part of an installed package and building it would run "
                                "its code (pass --trust-code to build it on the meta device)", (), 0)
    t_src = ws.load(Path(t_file))
    paths = import_path(None if installed(t_src.path) else t_src.package_root, gate.roots)
    return crosscheck(analysis.parallel, t_file, gate.value("transformer_class"), t_src.dotted_name,
                      gate.value("config_file"), paths=paths)


def crosscheck(facts: ParallelFacts, transformer_file: str, transformer_class: str, dotted_module: str | None,
               config_file: str | None, timeout: float = 180, paths: tuple[str, ...] = ()) -> CrossCheck:
    """The probe's build against the static facts. `paths`: the workers' import path (integrate.workers.import_path).
    A package the model's import needs and does not find raises MissingDependency: the package, and the imports
    from the model's module that lead to it."""
    config = Path(config_file) if config_file else None
    if config is not None and not config.is_file():
        config = None
    lists = [b.attr for b in facts.blocks]
    result = first = None
    if dotted_module:
        result = probe_transformer(dotted_module, transformer_class, config, lists, timeout=timeout, paths=paths)
        missing = result.get("missing")
        if missing and not _own(missing["package"], dotted_module):
            raise MissingDependency(missing, paths, transformer_file, _INSTEAD)
        if not result.get("ok") and str(result.get("error", "")).startswith("importing"):
            # not importable by name (the model's own package is not where its name says): load the file itself
            result, first = None, result
    if result is None:
        result = probe_transformer("", transformer_class, config, lists, timeout=timeout, file=Path(transformer_file),
                                   paths=paths)
        if result.get("missing"):
            raise MissingDependency(result["missing"], paths, transformer_file, _INSTEAD)
    if not result.get("ok"):
        # loading a package's module as a loose file fails on its relative imports: the import by name says why
        stuck = first is not None and str(result.get("error", "")).startswith("importing")
        error = (first if stuck else result).get("error", "probe failed")
        return CrossCheck(False, error, (), 0)
    return compare(facts, result)


def _own(package: str, module: str) -> bool:
    """Is the missing `package` the model's module itself, or a package above it (its own package off the path)?"""
    return module == package or module.startswith(f"{package}.")


def compare(facts: ParallelFacts, probe: dict[str, Any]) -> CrossCheck:
    out: list[str] = []
    checked = 0
    missed: dict[str, tuple[str, ...]] = {}
    for b in facts.blocks:
        built = probe.get("lists", {}).get(b.attr)
        if not b.built:
            checked += 1
            if built is not None:
                out.append(f"`{b.attr}`: read as not built for this config, but the built model has it")
            continue
        if built is None:
            out.append(f"`{b.attr}`: the built model has no such module list")
            continue
        if b.length is not None:
            checked += 1
            if b.length != built.get("length"):
                out.append(f"`{b.attr}`: static length {b.length}, built {built.get('length')}")
        modules = probe.get("blocks", {}).get(b.attr, {})
        for m in b.modules:
            if m.kind != "linear":
                continue
            real = modules.get(m.path)
            if real is None:
                if not m.conditional:
                    out.append(f"`{b.attr}.0.{m.path}`: read statically as a Linear, absent from the built block")
                continue
            checked += 1
            shape = real.get("linear")
            if shape is None:
                out.append(f"`{b.attr}.0.{m.path}`: static Linear, built as {real.get('class')}")
            elif m.shape and all(x is not None for x in m.shape) and list(m.shape) != list(shape):
                out.append(f"`{b.attr}.0.{m.path}`: static shape {list(m.shape)}, built {shape}")
        static_linears = {m.path for m in b.modules if m.kind == "linear"}
        for path, real in modules.items():
            if real.get("linear") is not None and path not in static_linears and not path.startswith(
                    tuple(f"{a.path}.processor" for a in b.attentions)):
                out.append(f"`{b.attr}.0.{path}`: a Linear in the built block that the static read missed")
                missed[b.attr] = (*missed.get(b.attr, ()), path)
        ints = probe.get("int_attrs", {}).get(b.attr, {})
        for a in b.attentions:
            for pair in (a.heads, a.kv_heads, a.head_dim):
                if not pair:
                    continue
                real = ints.get(a.path, {}).get(pair[0])
                if real is None:
                    continue
                checked += 1
                if pair[1] is None:
                    out.append(f"`{b.attr}.0.{a.path}.{pair[0]}`: not computed statically, built {real}")
                elif pair[1] != real:
                    out.append(f"`{b.attr}.0.{a.path}.{pair[0]}`: static {pair[1]}, built {real}")
    return CrossCheck(True, None, tuple(out), checked, built_cp_plan=probe.get("cp_plan"), missed_linears=missed)
