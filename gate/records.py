"""What the gate takes (its flags) and what it establishes (six facts, each with its source)."""

from __future__ import annotations

from dataclasses import dataclass

from integrate.records import OMIT, Omit

GATE_SCHEMA_VERSION = "1.4"
NO_PIPELINE_SOURCE = "flag --no-pipeline (a transformer-only integration)"
FACTS = ("model_path", "pipeline_class", "transformer_class", "pipeline_file", "transformer_file", "config_file")
# 1.3: `config_file`, the transformer's config (--config, the model folder's transformer/config.json, or a
# config.json at its root that names the class); None: the class defaults stand in
# 1.4: `source_roots`, each --source-root (absent when none was given)


@dataclass(frozen=True)
class GateFlags:
    """The gate flags as the user gave them (None: not given)."""

    model_path: str | None = None
    pipeline_class: str | None = None
    transformer_class: str | None = None
    pipeline_file: str | None = None
    transformer_file: str | None = None
    config_file: str | None = None  # --config: the transformer's config.json, wherever it is
    # transformer-only integration (no pipeline in the installed library): asked for explicitly, with the CFG
    # style declared, since there is no denoising loop to read it from
    no_pipeline: bool = False
    separate_cfg: bool | None = None
    # --block-class ATTR=Class: the class a block list holds, where the code does not say it (a class passed in
    # by the caller, built by another library's factory)
    block_classes: tuple[tuple[str, str], ...] = ()
    # --source-root DIR: a folder that holds the model's top-level package (a repository whose package root is not
    # the transformer file's folder); workers put it on their import path, the analysis names modules from it
    source_roots: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fact:
    """One gate fact: its value and where it came from (a flag, a metadata file, a lookup)."""

    value: str | None
    source: str


@dataclass(frozen=True)
class GateReport:
    inputs: dict[str, Fact]  # model_path, pipeline_class, transformer_class, pipeline_file, transformer_file, config_file
    pipeline_entry: str  # "__call__", a method name, or a module-level function name ("" with --no-pipeline)
    notes: tuple[str, ...] = ()
    separate_cfg: bool | None = None  # declared with --separate-cfg (only with --no-pipeline)
    block_classes: tuple[tuple[str, str], ...] = ()  # 1.3: --block-class, each list and the class it holds
    source_roots: tuple[str, ...] | Omit = OMIT  # 1.4: each --source-root, absolute (absent: none given)

    @property
    def roots(self) -> tuple[str, ...]:
        """The --source-root folders (none: ())."""
        return () if self.source_roots is OMIT else self.source_roots

    @property
    def no_pipeline(self) -> bool:
        return self.inputs["pipeline_class"].source == NO_PIPELINE_SOURCE

    def value(self, fact: str) -> str | None:
        if fact == "config_file" and fact not in self.inputs:  # a gate report from before 1.3: none recorded
            return None
        return self.inputs[fact].value

    @property
    def flags(self) -> GateFlags:
        """The facts as flags: the gate run again with these reaches the same model."""
        return GateFlags(**{f: self.value(f) for f in FACTS}, no_pipeline=self.no_pipeline,
                         separate_cfg=self.separate_cfg, block_classes=self.block_classes, source_roots=self.roots)
