"""What generation produces: the modules and files an approved plan turns into, and the report of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from integrate.records import OMIT, Omit

GENERATE_SCHEMA_VERSION = "1.0"


@dataclass(frozen=True)
class Piece:
    """One generated module: its role, module name inside the plugin, the symbol it registers, its text."""

    role: str  # "adapter" | "patch_functor" | "cp_planner" | "tp_planner" | "te_planner" | "example"
    module: str  # plugin module name ("adapter", "cp_planner", "te_text_encoder", ...)
    symbol: str  # the registered function / class
    text: str


@dataclass(frozen=True)
class Generated:
    import_name: str
    pieces: tuple[Piece, ...]
    extra: dict[str, str]  # files that are not registered modules: {relative path: text}
    notes: tuple[str, ...]
    manual: tuple[str, ...]  # what the templates could not do (generate exits 1)
    registered: dict[str, str]  # role -> the name it is registered under


@dataclass(frozen=True)
class PluginInfo:
    import_name: str
    path: str
    launcher: str


@dataclass(frozen=True)
class GenerateReport:
    """`integrate generate --json`."""

    mode: str  # "plugin" | "checkout"
    plugin: PluginInfo | Omit = OMIT
    checkout: dict[str, Any] | Omit = OMIT  # {package, changed, unchanged, diff}
    files: tuple[str, ...] = ()
    schema_version: str = GENERATE_SCHEMA_VERSION
    registered: dict[str, str] | None = None
    notes: tuple[str, ...] = ()
    manual: tuple[str, ...] = ()
