"""The gate: six facts, each from a flag or read deterministically from the model directory.

It never guesses and never searches the disk: a class is located only through the installed
package that the model's own metadata names, by following that package's imports.
"""

from __future__ import annotations

import json
import keyword
from pathlib import Path

import libcst as cst

from integrate import jsonfile
from integrate.errors import InputError
from integrate.records import OMIT
from integrate.resolve import Workspace
from integrate.source import base_names, find_method

from .records import FACTS, NO_PIPELINE_SOURCE, Fact, GateFlags, GateReport

FLAGS = {
    "model_path": "--model-path",
    "pipeline_class": "--pipeline-class",
    "transformer_class": "--transformer-class",
    "pipeline_file": "--pipeline-file",
    "transformer_file": "--transformer-file",
    "config_file": "--config",
}
NO_MODEL_PATH = ("not given: --config names the transformer's config; with no model folder the text encoders, "
                 "the VAE and the scheduler are not read, and no pipeline is built for the fixture")
NO_CONFIG = "none found: the transformer's class defaults stand in for its config"
def _read_json(path: Path) -> dict:
    return jsonfile.read(path)


def _class_entry(value, where: str) -> tuple[str | None, str]:
    """model_index.json lists components as [library, class]."""
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, (str, type(None))) for v in value):
        return value[0], value[1]
    raise InputError(f"{where}: expected [library, class], got {json.dumps(value)[:80]}")


def _is_name(text: str) -> bool:
    return text.isidentifier() and not keyword.iskeyword(text)


def _split_entry(pipeline_class: str) -> tuple[str, str]:
    """`Pipeline` -> (Pipeline, __call__); `WanT2V.generate` -> (WanT2V, generate)."""
    cls, dot, method = pipeline_class.partition(".")
    if not _is_name(cls) or (dot and not _is_name(method)):  # `P.` names no method
        raise InputError(f"--pipeline-class {pipeline_class!r}: expected Class, Class.method or a function name")
    return cls, method or "__call__"


def _no_pipeline(flags: GateFlags, facts: dict[str, Fact]) -> None:
    """`--no-pipeline`: the pipeline facts are known to be absent, and the CFG style must be declared."""
    if flags.separate_cfg is not None and not flags.no_pipeline:
        raise InputError("--separate-cfg is for --no-pipeline only: with a pipeline, its denoising loop decides")
    if not flags.no_pipeline:
        return
    given = [FLAGS[n] for n in ("pipeline_class", "pipeline_file") if getattr(flags, n)]
    if given:
        raise InputError(f"--no-pipeline and {' and '.join(given)} contradict each other: drop one")
    if flags.separate_cfg is None:
        raise InputError("--no-pipeline needs --separate-cfg yes|no: with no denoising loop to read, say "
                         "whether CFG runs as a second transformer call (yes) or batched in one (no)")
    for name in ("pipeline_class", "pipeline_file"):
        facts[name] = Fact(None, NO_PIPELINE_SOURCE)


def source_roots(given: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Each `--source-root DIR`, checked to be a folder, absolute and resolved, each once."""
    out: list[str] = []
    for root in given:
        path = Path(root)
        if not str(root).strip():
            raise InputError("--source-root must name a folder, not an empty string")
        if not path.exists():
            raise InputError(f"--source-root {root}: no such folder")
        if not path.is_dir():
            raise InputError(f"--source-root {root}: not a folder (the folder that holds the model's top-level "
                             "package)")
        if str(path.resolve()) not in out:
            out.append(str(path.resolve()))
    return tuple(out)


def run_gate(flags: GateFlags, workspace: Workspace) -> GateReport:
    facts: dict[str, Fact] = {}
    notes: list[str] = []
    roots = source_roots(flags.source_roots)
    workspace.use_source_roots(roots)  # before any file is read: a module's name comes from the folder it is under

    for name in FACTS:
        value = getattr(flags, name)
        if value and name != "config_file":  # read (and its class checked) below
            facts[name] = Fact(value, f"flag {FLAGS[name]}")
    _no_pipeline(flags, facts)

    if flags.config_file:
        _read_config(Path(flags.config_file), facts, "flag --config", f"--config {Path(flags.config_file).name}",
                     notes)
    model_dir = Path(flags.model_path) if flags.model_path else None
    library = {"pipeline": None, "transformer": None}
    if model_dir is None and flags.config_file:
        facts["model_path"] = Fact(None, NO_MODEL_PATH)
    if model_dir is not None:
        if not model_dir.exists():
            raise InputError(f"{model_dir}: no such directory")
        if not model_dir.is_dir():
            raise InputError(f"{model_dir}: the model path must be a directory (model_index.json, transformer/)")
        facts["model_path"] = Fact(str(model_dir.resolve()), "flag --model-path")
        _read_model_dir(model_dir, facts, library, notes)

    facts.setdefault("config_file", Fact(None, NO_CONFIG))
    # Files can be located from the class names through the library the metadata names.
    for kind in ("pipeline", "transformer"):
        cls_fact, file_fact = facts.get(f"{kind}_class"), facts.get(f"{kind}_file")
        if cls_fact and file_fact is None and library[kind]:
            cls_name = _split_entry(cls_fact.value)[0] if kind == "pipeline" else cls_fact.value
            found = workspace.locate_class(library[kind], cls_name)
            root = found.src.package_root
            via = " -> ".join(str(Path(p).relative_to(root)) if root else p for p in found.chain)
            facts[f"{kind}_file"] = Fact(str(found.src.path), f"located in installed `{library[kind]}` via {via}")
    missing = [n for n in FACTS if n not in facts]
    if missing:
        needed = ", ".join(f"{n.replace('_', ' ')} ({FLAGS[n]})" for n in missing)
        only = ("; a transformer with no pipeline: --no-pipeline --separate-cfg yes|no"
                if set(missing) <= {"pipeline_class", "pipeline_file"} else "")
        raise InputError(f"the gate needs: {needed}{only}")

    entry = _check_classes(facts, workspace)
    _check_block_classes(flags.block_classes, facts, workspace)
    if flags.no_pipeline:
        notes.append("transformer-only (--no-pipeline): no pipeline loop is read; CFG declared "
                     f"{'separate' if flags.separate_cfg else 'batched'} with --separate-cfg")
    return GateReport(inputs={n: facts[n] for n in FACTS}, pipeline_entry=entry, notes=tuple(notes),
                      separate_cfg=flags.separate_cfg if flags.no_pipeline else None,
                      block_classes=tuple(flags.block_classes), source_roots=roots or OMIT)


def _read_config(path: Path, facts: dict[str, Fact], source: str, label: str, notes: list[str],
                 config: dict | None = None) -> tuple[dict, bool]:
    """The transformer's config at `path` (`config`: already read from it), checked as data, and whether it is the
    one the gate takes: the first read is (its `_class_name` must agree with the class); a later one is not, and
    `notes` say which was read."""
    if config is None:
        _regular_or_absent(path)
        if not path.is_file():
            raise InputError(f"{path}: no such file (--config names the transformer's config.json)")
        config = _read_json(path)
    jsonfile.check_config(path, config)
    cls = config.get("_class_name")
    if cls is not None and not isinstance(cls, str):
        raise InputError(f"{path}: _class_name must be a string")
    here = str(path.resolve())
    taken = facts.setdefault("config_file", Fact(here, source))
    if taken.value != here:
        notes.append(f"--config {taken.value} is read, not {path}")
        return config, False
    if cls:
        _agree(facts, "transformer_class", cls, f"{label}:_class_name")
    return config, True


MAX_COMPONENTS = 64  # entries of model_index.json besides its `_` keys: real pipelines have a dozen at most


def _regular_or_absent(path: Path) -> None:
    """A metadata file is a regular file or absent: a folder, a FIFO or a device in its place is refused, never
    read as absent (or, for a FIFO, waited on)."""
    if (path.exists() or path.is_symlink()) and not path.is_file():
        raise InputError(f"{path}: not a regular file")


def _read_model_dir(model_dir: Path, facts: dict[str, Fact], library: dict, notes: list[str]) -> None:
    index_path = model_dir / "model_index.json"
    config_path = model_dir / "transformer" / "config.json"
    root_config = model_dir / "config.json"
    for meta in (index_path, config_path, root_config):
        _regular_or_absent(meta)
    if not index_path.is_file() and not config_path.is_file() and root_config.is_file():
        # a reference repository's checkpoint: the transformer's config at the folder's root, naming its class
        config = _read_json(root_config)
        if isinstance(config.get("_class_name"), str):
            _, taken = _read_config(root_config, facts, "config.json at the model folder's root (it names the "
                                    "transformer class)", "config.json", notes, config)
            if taken and "_diffusers_version" in config:
                library["transformer"] = "diffusers"
            return
        notes.append(f"{root_config} does not name a transformer class (`_class_name`): not read as its config")
    if not index_path.is_file() and not config_path.is_file():
        if not all(k in facts for k in ("pipeline_class", "transformer_class", "pipeline_file", "transformer_file")):
            only = (" (with --no-pipeline: --transformer-class and --transformer-file)"
                    if facts.get("pipeline_class", Fact(None, "")).source == NO_PIPELINE_SOURCE else "")
            raise InputError(
                f"{model_dir}: no model metadata (model_index.json, transformer/config.json, or a config.json "
                "naming the class); pass --pipeline-class, --transformer-class, --pipeline-file and "
                "--transformer-file" + only
            )
        notes.append(f"{model_dir} has no model_index.json: every class and file came from flags")
        return

    if index_path.is_file():
        index = _read_json(index_path)
        components = [k for k in index if not k.startswith("_")]
        if len(components) > MAX_COMPONENTS:
            raise InputError(f"{index_path}: {len(components)} components; a pipeline has at most a few dozen (limit "
                             f"{MAX_COMPONENTS})")
        odd = next((k for k in index if not k.isidentifier()), None)
        if odd is not None:  # component names become module and folder names
            raise InputError(f"{index_path}: component {odd[:80]!r} is not a name (letters, digits, underscores)")
        pipe_cls = index.get("_class_name")
        if pipe_cls is not None and not isinstance(pipe_cls, str):
            raise InputError(f"{index_path}: _class_name must be a string")
        if pipe_cls and facts.get("pipeline_class", Fact(None, "")).source == NO_PIPELINE_SOURCE:
            notes.append(f"{index_path.name} names {pipe_cls[:80]!r}; not read (--no-pipeline)")
        elif pipe_cls:
            _agree(facts, "pipeline_class", pipe_cls, f"{index_path.name}:_class_name", compare=_split_entry)
            library["pipeline"] = "diffusers" if "_diffusers_version" in index else None
        if "transformer" in index:
            lib, cls = _class_entry(index["transformer"], f"{index_path.name}:transformer")
            if cls:
                _agree(facts, "transformer_class", cls, f"{index_path.name}:transformer")
                library["transformer"] = lib
        if library["pipeline"] is None and pipe_cls:
            notes.append(f"{index_path.name} has no _diffusers_version: the pipeline file must come from a flag")

    if config_path.is_file():
        config, taken = _read_config(config_path, facts, "the model folder's transformer/config.json",
                                     "transformer/config.json", notes)
        if taken and config.get("_class_name") and library["transformer"] is None and "_diffusers_version" in config:
            library["transformer"] = "diffusers"


def _agree(facts: dict[str, Fact], name: str, value: str, source: str, compare=None) -> None:
    """Record a fact from the model's files; a flag that says otherwise is an error."""
    have = facts.get(name)
    if have is None:
        facts[name] = Fact(value, source)
        return
    ours = compare(have.value)[0] if compare else have.value
    if ours != value:
        raise InputError(f"{have.source} says {have.value!r} but {source} says {value!r}")


def _check_classes(facts: dict[str, Fact], workspace: Workspace) -> str:
    """Both classes must be defined by their files; returns the pipeline's entry point."""
    t_src = workspace.load(Path(facts["transformer_file"].value))
    t_cls = facts["transformer_class"].value
    if t_cls not in t_src.classes:
        if t_cls in t_src.imports:
            found = workspace.resolve(t_src, t_cls)
            where = getattr(found, "src", None)
            if where is not None:
                raise InputError(f"{t_src.path} imports {t_cls} from {where.path}; pass that file as "
                                 "--transformer-file")
            raise InputError(f"{t_src.path} imports {t_cls} but it cannot be traced: {found.reason if hasattr(found, 'reason') else found}")
        raise InputError(f"{t_src.path} does not define class {t_cls}; it defines: {_listing(t_src.classes)}")

    if facts["pipeline_file"].source == NO_PIPELINE_SOURCE:
        return ""
    p_src = workspace.load(Path(facts["pipeline_file"].value))
    p_name = facts["pipeline_class"].value
    cls, method = _split_entry(p_name)
    if cls in p_src.functions and "." not in p_name:
        return cls  # a denoising function, e.g. `denoise`
    if cls not in p_src.classes:
        raise InputError(
            f"{p_src.path} does not define {cls}; classes: {_listing(p_src.classes)}; "
            f"functions: {_listing(p_src.functions)}"
        )
    if find_method(p_src.classes[cls], method) is None and not _inherits_method(workspace, p_src, cls, method):
        methods = [f.name.value for f in p_src.classes[cls].body.body if hasattr(f, "name")]
        raise InputError(f"{cls} in {p_src.path.name} has no method {method}; it has: {', '.join(methods) or 'none'}")
    return method


def _check_block_classes(given: tuple[tuple[str, str], ...], facts: dict[str, Fact], workspace: Workspace) -> None:
    """Each `--block-class ATTR=Class`: a list attribute name and a class the transformer's file defines or
    imports (traced like any name it reads); `ATTR=path/to/file.py:Class`: a class that file defines (a source
    the user has, for a package that is not installed)."""
    t_src = workspace.load(Path(facts["transformer_file"].value))
    seen = set()
    for attr, value in given:
        file, _, cls = value.rpartition(":")
        if not attr.isidentifier() or not all(part.isidentifier() for part in cls.split(".")) or \
                (file and ("." in cls or not file.endswith(".py"))):
            raise InputError(f"--block-class {attr}={value}: expected ATTR=Class or ATTR=path/to/file.py:Class")
        if attr in seen:
            raise InputError(f"--block-class names `{attr}` twice")
        seen.add(attr)
        if file:
            if not Path(file).is_file():
                raise InputError(f"--block-class {attr}={value}: no such file {file}")
            if cls not in workspace.load(Path(file)).classes:
                raise InputError(f"--block-class {attr}={value}: {Path(file).name} defines no class `{cls}`")
            continue
        found = workspace.resolve(t_src, cls)
        if not isinstance(getattr(found, "node", None), cst.ClassDef):
            raise InputError(f"--block-class {attr}={cls}: {t_src.path.name} neither defines nor imports a class "
                             f"`{cls}` that can be traced (a source you have: {attr}=path/to/file.py:{cls})")


def _inherits_method(workspace: Workspace, src, cls: str, method: str, depth: int = 0) -> bool:
    if depth > 8:
        return False
    for base in base_names(src.classes[cls]):
        found = workspace.resolve(src, base)
        node = getattr(found, "node", None)
        if node is not None and hasattr(node, "bases"):
            if find_method(node, method) is not None:
                return True
            if _inherits_method(workspace, found.src, found.name, method, depth + 1):
                return True
    return False


def _listing(names) -> str:
    names = sorted(names)
    if not names:
        return "none"
    return ", ".join(names[:12]) + (f" (+{len(names) - 12} more)" if len(names) > 12 else "")
