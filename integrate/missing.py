"""A model that cannot be imported because a package is missing: which package, and the imports that lead to it.

`found(exc, module)` runs in the worker whose import of the model failed: for a ModuleNotFoundError it returns the
missing package (`exc.name`) and the chain of imports from the model's module down to it, one hop per frame of the
failed import that lies in the user's own source files (not Python's, not an installed package's, not integrate's),
outermost first: `wan/__init__.py:1` imports `wan.configs`, `wan/configs/__init__.py:7` imports ..., and the last
hop's line imports the missing package. Where the import that failed is an installed package's, `via` names its
file and line.

`MissingDependency` (an InputError: exit 2) turns that into one line for the person; `--json` prints its record
(`MissingDependencyError`, docs/schema.md "Errors") on stdout beside it. A missing package the user has as a folder
above the model's file is the model's own package off the import path: the line says which `--source-root` puts it
there.
"""

from __future__ import annotations

import linecache
import site
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from integrate.errors import InputError
from integrate.records import OMIT, Omit, from_json, to_json

ERROR_SCHEMA_VERSION = "1.0"
_MAX_HOPS = 24  # a chain longer than this keeps its first and last hops
_SEARCH_UP = 12  # folders above the model's file searched for a missing package of its own


@dataclass(frozen=True)
class ImportHop:
    """One frame of the failed import in the user's own source: its line imports the next hop's module."""

    file: str
    line: int
    module: str  # the module that line belongs to (`wan.configs`)
    code: str  # the line's text
    function: str | Omit = OMIT  # the function it is in, where it is not the module's own top level


@dataclass(frozen=True)
class InstalledFrame:
    """Where an installed package, imported from the user's code, imports the missing package."""

    file: str
    line: int
    module: str  # the installed module the user's last hop imports


@dataclass(frozen=True)
class MissingPackage:
    module: str  # the module the worker imported (the model's)
    package: str  # the module Python did not find (ModuleNotFoundError.name)
    chain: tuple[ImportHop, ...]  # outermost first
    via: InstalledFrame | Omit = OMIT
    source_root: str | Omit = OMIT  # the folder holding `package`, where it is the model's own code off the path


@dataclass(frozen=True)
class MissingDependencyError:
    """What `--json` prints (stdout) when a command stops for a missing package (exit 2)."""

    schema_version: str
    error: str  # the one line printed on stderr
    kind: str  # "missing-dependency"
    missing_dependency: MissingPackage


def _installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = [paths[k] for k in ("purelib", "platlib") if k in paths]
    return [Path(r).resolve() for r in [*roots, *site.getsitepackages(), site.getusersitepackages()] if r]


def _foreign_roots() -> list[Path]:
    """Where code that is not the user's lives: Python's library, installed packages, integrate itself."""
    paths = sysconfig.get_paths()
    roots = [paths[k] for k in ("stdlib", "platstdlib") if k in paths]
    for name, mod in list(sys.modules.items()):
        if name == "integrate" or name.startswith("integrate.") or name == "__main__":
            where = getattr(mod, "__file__", None)
            if where:
                roots.append(str(Path(where).parent))
    return [Path(r).resolve() for r in roots if r] + _installed_roots()


def _under(file: str, roots: list[Path]) -> bool:
    path = Path(file).resolve()
    return any(path.is_relative_to(r) for r in roots)


def found(exc: BaseException, module: str) -> dict | None:
    """In the worker: the JSON of the `MissingPackage` a failed import of `module` raised (None: not a missing
    package)."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    foreign, installed = _foreign_roots(), _installed_roots()
    chain: list[dict] = []
    via = None
    tb = exc.__traceback__
    while tb is not None:
        file, line = tb.tb_frame.f_code.co_filename, tb.tb_lineno
        real = not file.startswith("<") and Path(file).is_file()
        here = {"file": str(Path(file).resolve()) if real else file, "line": line,
                "module": str(tb.tb_frame.f_globals.get("__name__", ""))}
        if real and not _under(file, foreign):
            hop = {**here, "code": linecache.getline(file, line).strip()[:200]}
            if tb.tb_frame.f_code.co_name != "<module>":
                hop["function"] = tb.tb_frame.f_code.co_name
            chain.append(hop)
            via = None
        elif real and chain and _under(file, installed):
            # the innermost installed frame below the user's last one, named by the first (what the user imported)
            via = {**here, "module": via["module"]} if via else here
        tb = tb.tb_next
    if len(chain) > _MAX_HOPS:
        chain = chain[: _MAX_HOPS // 2] + chain[-_MAX_HOPS // 2:]
    out = {"module": module, "package": exc.name, "chain": chain}
    if via is not None:
        out["via"] = via
    return out


class MissingDependency(InputError):
    """Importing the model needs a package that is not installed where the workers run (exit 2). `record`: the
    package, the chain of imports from the model's module to it, and the `--source-root` that would put it on the
    path where it is the model's own package; `details`, what `--json` prints."""

    def __init__(self, details: dict, roots: Sequence[str] = (), model_file: str | None = None,
                 instead: str = "") -> None:
        record = from_json(MissingPackage, details, "$.missing")  # a worker's answer, checked
        hint = own_package(record.package, [h.file for h in record.chain] + [model_file or ""], roots)
        if hint is not None:
            record = replace(record, source_root=hint)
        self.record = record
        text = message(record, roots) + (f", {instead}" if instead else "")
        super().__init__(text)
        self.details = to_json(MissingDependencyError(ERROR_SCHEMA_VERSION, text, "missing-dependency", record))


def own_package(package: str, files: Sequence[str], roots: Sequence[str]) -> str | None:
    """The folder to pass as `--source-root` where `package` is a folder (or a .py file) above one of `files` that
    is not on the import path (`roots`): the model's own package, not a missing dependency. None otherwise."""
    top = package.split(".")[0]
    on_path = {str(Path(r).resolve()) for r in roots}
    for file in files:
        if not file:
            continue
        folder = Path(file).resolve().parent
        for _ in range(_SEARCH_UP):
            if (folder / top).is_dir() or (folder / f"{top}.py").is_file():
                return None if str(folder) in on_path else str(folder)
            if folder.parent == folder:
                break
            folder = folder.parent
    return None


def _short(file: str, roots: Sequence[str]) -> str:
    """`file` relative to the deepest of `roots` that holds it (absolute otherwise)."""
    path = Path(file)
    best = None
    for r in roots:
        if path.is_relative_to(r) and (best is None or len(Path(r).parts) > len(best.parts)):
            best = Path(r)
    return str(path.relative_to(best)) if best is not None else file


def message(record: MissingPackage, roots: Sequence[str] = ()) -> str:
    """One line: the missing package, then each hop `file:line imports <next module>` from the model's module."""
    package, chain, via = record.package, record.chain, record.via
    hops = []
    for i, hop in enumerate(chain):
        target = chain[i + 1].module if i + 1 < len(chain) else via.module if via is not OMIT else package
        inside = f" (in {hop.function})" if hop.function is not OMIT else ""
        hops.append(f"{_short(hop.file, roots)}:{hop.line}{inside} imports {target}")
    if via is not OMIT:
        hops.append(f"{via.file}:{via.line} (installed) imports {package}")
    text = f"importing {record.module} needs `{package}`, which is not installed where the model's code runs"
    if hops:
        text += ": " + ", ".join(hops)
    if record.source_root is not OMIT:
        return (f"{text}; `{package.split('.')[0]}` is a folder in {record.source_root}, not on the import path: "
                f"pass --source-root {record.source_root}")
    return f"{text}; install it in this environment (or put the folder that holds it on PYTHONPATH)"
