"""Text encoders and VAE named in model_index.json: does the installed cache-dit parallelise
them (TE-P / VAE-P), and, for an unsupported transformers text encoder, the tensor-parallel
plan transformers itself declares (`base_model_tp_plan` on the model's configuration class).

Everything is read from source with libcst; nothing is imported. A registration counts when
its decorator is in cache-dit's source; whether that module imports at run time (cache-dit
skips planners whose imports fail) is not checked.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from integrate import jsonfile
from integrate.errors import InputError
from integrate.records import Evidence
from integrate.resolve import Resolved, Workspace
from integrate.source import SourceFile, base_names, dotted, find_method
from integrate.syntax import body_of, find_all, self_attr

from .records import TextEncoderFacts, VaeFacts
from .registries import MAX_DEPTH, ROOT_BASES, TE_REGISTER, VAE_REGISTER, registrations
from .vae_tiles import vae_tiles

Class = tuple[SourceFile, cst.ClassDef]


def _support(registry: dict[str, Evidence] | None, cls: str, prefix: bool):
    """(supported, supported_by, evidence, notes, the registered name that answers `cls` or None) under cache-dit's
    matching rule: the first registered name equal to the class name or, with `prefix`, one it starts with."""
    if registry is None:
        return None, None, (), ("cache-dit is not installed: support unknown",), None
    matches = [(name, ev) for name, ev in registry.items() if (cls.startswith(name) if prefix else cls == name)]
    if not matches:
        rule = "registered name prefixing the class name" if prefix else "registered name equal to the class name"
        return False, None, (), (f"none of cache-dit's {len(registry)} registrations is a {rule} {cls}",), None
    many = ", ".join(f"{ev.file}:{ev.line}" for _, ev in matches)
    notes = (f"several registrations match {cls}; cache-dit takes the first registered: {many}",)
    (name, first), evidence = matches[0], tuple(ev for _, ev in matches)
    return True, f"{first.file}:{first.line}", evidence, notes if len(matches) > 1 else (), name


def _module_of(ws: Workspace, evidence: tuple[Evidence, ...], cls: str) -> str | None:
    """The dotted module of the transformers file the evidence says defines `cls`."""
    root = ws.package_root("transformers")
    where = next((e for e in evidence if e.why == f"transformers defines {cls}"), None)
    if root is None or where is None:
        return None
    try:
        rel = Path(where.file).resolve().relative_to(Path(root).resolve())
    except ValueError:
        return None
    return ".".join(rel.with_suffix("").parts)


# -- transformers: class -> configuration class -> base_model_tp_plan ------------------------


def _class_assigns(node: cst.ClassDef):
    """(name, value, annotation, statement) for each simple assignment in a class body."""
    for stmt in body_of(node):
        for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Assign) and isinstance(small.targets[0].target, cst.Name):
                yield small.targets[0].target.value, small.value, None, stmt
            elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                yield small.target.value, small.value, small.annotation.annotation, stmt


def _ancestors(ws: Workspace, src: SourceFile, node: cst.ClassDef) -> list[Class]:
    """The class and its bases, depth first (the MRO for single inheritance), to the root bases."""
    out: list[Class] = []
    stack: list[Class] = [(src, node)]
    while stack and len(out) < MAX_DEPTH:
        s, n = stack.pop(0)
        if n.name.value in ROOT_BASES or any(n is seen for _, seen in out):
            continue
        out.append((s, n))
        bases = [ws.resolve(s, b) for b in base_names(n)]
        stack[:0] = [(b.src, b.node) for b in bases if isinstance(b, Resolved) and isinstance(b.node, cst.ClassDef)]
    return out


def _class_named(ws: Workspace, src: SourceFile, expr: cst.BaseExpression | None) -> Class | None:
    name = expr.evaluated_value if isinstance(expr, cst.SimpleString) else dotted(expr)
    found = ws.resolve(src, name) if isinstance(name, str) and name != "None" else None
    return (found.src, found.node) if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef) else None


def _config_class(ws: Workspace, src: SourceFile, node: cst.ClassDef) -> tuple[Class, Evidence] | None:
    """transformers' rule: own `config_class`, own `config:` annotation, then the same inherited."""
    refs = [(s, n, ref) for s, n in _ancestors(ws, src, node) for ref in _class_assigns(n)]
    refs = [r for r in refs if r[2][0] in ("config_class", "config")]
    for s, n, (name, value, annotation, stmt) in sorted(refs, key=lambda r: (r[1] is not node, r[2][0] == "config")):
        found = _class_named(ws, s, value if name == "config_class" else annotation)
        if found is not None:
            why = f"{n.name.value}: {s.code(stmt)} (config class of {node.name.value})"
            return found, Evidence(str(s.path), s.line(stmt), why)
    return None


def _plan(ws: Workspace, src: SourceFile, node: cst.ClassDef) -> tuple[dict[str, str], Evidence | None, tuple]:
    """`base_model_tp_plan` of a configuration class (own or inherited): plan, where, notes."""
    for s, n in _ancestors(ws, src, node):
        for name, value, _, stmt in _class_assigns(n):
            if name != "base_model_tp_plan" or value is None:
                continue
            where = Evidence(str(s.path), s.line(stmt), f"{n.name.value}.base_model_tp_plan")
            if not isinstance(value, cst.Dict):
                return {}, where, (f"{n.name.value}.base_model_tp_plan is `{s.code(value)}`, not a dict literal",)
            plan, skipped = {}, []
            for el in value.elements:
                k, v = (el.key, el.value) if isinstance(el, cst.DictElement) else (None, None)
                if isinstance(k, cst.SimpleString) and isinstance(v, cst.SimpleString):
                    plan[k.evaluated_value] = v.evaluated_value
                else:
                    skipped.append(s.code(el))
            return plan, where, (f"entries that are not string literals were left out: {skipped}",) if skipped else ()
    return {}, None, ()


def _sub_configs(ws: Workspace, src: SourceFile, node: cst.ClassDef) -> list[tuple[str, Class]]:
    """(key, class) for each entry of `sub_configs_defaults` / `sub_configs` that resolves."""
    for s, n in _ancestors(ws, src, node):
        for name, value, _, _ in _class_assigns(n):
            if name not in ("sub_configs_defaults", "sub_configs") or not isinstance(value, cst.Dict):
                continue
            out = []
            for el in value.elements:
                ref, model_type = el.value, None
                if isinstance(ref, cst.Call):  # SubConfigSpec(config_class=X, model_type="mistral", ...)
                    kw = {a.keyword.value: a.value for a in ref.args if a.keyword}
                    ref = kw.get("config_class")
                    model_type = kw["model_type"].evaluated_value if isinstance(
                        kw.get("model_type"), cst.SimpleString) else None
                found = _class_named(ws, s, ref)
                if model_type and (found is None or found[1].name.value == "AutoConfig"):
                    found = _config_of_type(ws, model_type)  # AutoConfig by model type: that type's own class
                if found is not None and isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString):
                    out.append((el.key.evaluated_value, found))
            return out
    return []


def _config_of_type(ws: Workspace, model_type: str) -> Class | None:
    """The configuration class transformers registers for `model_type`: the class in
    `models/<type>/configuration_<type>.py` whose `model_type` is that string."""
    root = ws.package_root("transformers")
    name = model_type.replace("-", "_")
    if root is None or not name.isidentifier():
        return None
    path = root / "transformers" / "models" / name / f"configuration_{name}.py"
    if not path.is_file():
        return None
    try:
        src = ws.load(path, root)
    except InputError:
        return None
    for node in src.classes.values():
        for key, value, _, _ in _class_assigns(node):
            if key == "model_type" and isinstance(value, cst.SimpleString) and value.evaluated_value == model_type:
                return src, node
    return None


def _sub_config_plans(ws: Workspace, src: SourceFile, node: cst.ClassDef) -> list:
    """(key path, class name, plan, where, notes) for sub-configs with a plan, breadth first."""
    found, queue, seen = [], list(_sub_configs(ws, src, node)), {id(node)}
    while queue:
        key, (s, n) = queue.pop(0)
        if id(n) in seen or key.count(".") > 3:
            continue
        seen.add(id(n))
        plan, where, notes = _plan(ws, s, n)
        if plan:
            found.append((key, n.name.value, plan, where, notes))
        else:
            queue.extend((f"{key}.{k}", c) for k, c in _sub_configs(ws, s, n))
    return found


def _built_from(node: cst.ClassDef, key: str) -> str | None:
    """`self.<attr> = ...config.<key>...` in the model's __init__: the attribute built from a sub-config."""
    init = find_method(node, "__init__")
    for assign in find_all(init, cst.Assign) if init is not None else ():
        attr = self_attr(assign.targets[0].target)
        value = assign.value
        # the sub-config itself handed to a constructor (`AutoModel.from_config(config.text_config)`), not one of its
        # fields (`nn.Linear(config.text_config.hidden_size, ...)`)
        if attr and isinstance(value, cst.Call) and any(dotted(a.value) == f"config.{key}" for a in value.args):
            return attr
    return None


def _find_model_class(ws: Workspace, root: Path, cls: str, model_type: str | None) -> Class | None:
    models = root / "transformers" / "models"
    first = sorted((models / model_type.replace("-", "_")).glob("modeling_*.py")) if model_type else []
    for path in [*first, *sorted(models.glob("*/modeling_*.py"))]:
        try:
            if f"class {cls}(" not in path.read_text(encoding="utf-8"):  # locates the file; libcst confirms
                continue
            src = ws.load(path, root)
        except (OSError, UnicodeDecodeError, InputError):
            continue
        if cls in src.classes:
            return src, src.classes[cls]
    return None


def _model_type(model_path: Path | None, component: str) -> str | None:
    config = model_path / component / "config.json" if model_path is not None and component.isidentifier() else None
    try:
        data = jsonfile.read(config) if config is not None and config.is_file() else {}
    except InputError:
        return None  # an unreadable encoder config only costs the model-type hint
    return data["model_type"] if isinstance(data.get("model_type"), str) else None


def tp_plan(ws: Workspace, cls: str, model_path: Path | None, component: str):
    """(plan, source, evidence, notes) for a transformers class."""
    root = ws.package_root("transformers")
    found = _find_model_class(ws, root, cls, _model_type(model_path, component)) if root is not None else None
    if found is None:
        where = "transformers is not installed" if root is None else f"no transformers modeling file defines {cls}"
        return {}, None, (), (f"{where}: no tp plan found",)
    src, node = found
    evidence: tuple[Evidence, ...] = (Evidence(str(src.path), src.line(node), f"transformers defines {cls}"),)
    config = _config_class(ws, src, node)
    if config is None:
        return {}, None, evidence, (f"the configuration class of {cls} could not be traced: no tp plan found",)
    (csrc, cnode), config_ev = config
    evidence, conf = (*evidence, config_ev), cnode.name.value
    plan, where, notes = _plan(ws, csrc, cnode)
    if plan:
        return plan, where, evidence, notes
    subs = _sub_config_plans(ws, csrc, cnode)
    if not subs:
        return {}, None, evidence, (*notes, f"no base_model_tp_plan found on {conf} or its sub-configs")
    key, sub, plan, where, sub_notes = subs[0]
    attr = _built_from(node, key) if "." not in key else None
    under = f"; {cls}.__init__ builds `self.{attr}` from it, so the keys apply under `{attr}.`" if attr else ""
    said = f"{conf} has no base_model_tp_plan; this is the plan of its sub-config `{key}` ({sub}), relative to"
    notes = (*notes, *sub_notes, f"{said} the sub-model built from that config{under}")
    if len(subs) > 1:
        others = ", ".join(f"`{k}` ({c}) at {w.file}:{w.line}" for k, c, _, w, _ in subs[1:])
        notes = (*notes, f"other sub-configs of {conf} have their own plan, not merged here: {others}")
    return plan, where, evidence, notes


# -- public ------------------------------------------------------------------------------------


def _entry(value) -> tuple[str, str] | None | str:
    """(library, class); None for a null entry; a note for anything else."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(v is None for v in value):
        return None
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return value[0], value[1]
    return f"model_index entry is not [library, class]: {value!r}"


def text_encoder_facts(ws: Workspace, model_path: Path | None, model_index: dict | None) -> tuple[TextEncoderFacts, ...]:
    if model_index is None:
        return ()
    registry = registrations(ws, "text_encoders", TE_REGISTER)
    out = []
    for component, value in model_index.items():
        entry = _entry(value) if component.startswith("text_encoder") else None
        if isinstance(entry, str):
            out.append(TextEncoderFacts(component, None, None, None, None, {}, None, notes=(entry,)))
        elif entry is not None:
            library, cls = entry
            supported, by, evidence, notes, answering = _support(registry, cls, prefix=True)
            plan, source, module = {}, None, None
            if library == "transformers":  # read where cache-dit registers one too: it may not fit this class
                plan, source, more, plan_notes = tp_plan(ws, cls, model_path, component)
                evidence, notes = (*evidence, *more), (*notes, *plan_notes)
                module = _module_of(ws, more, cls)
            out.append(TextEncoderFacts(component, cls, library, supported, by, plan, source, evidence, notes,
                                        registered_as=answering, module=module))
    return tuple(out)


def vae_facts(ws: Workspace, model_path: Path | None, model_index: dict | None) -> VaeFacts | None:
    entry = _entry(model_index["vae"]) if model_index is not None and "vae" in model_index else None
    if entry is None:
        return None
    if isinstance(entry, str):
        return VaeFacts("vae", None, None, None, None, notes=(entry,))
    supported, by, evidence, notes, _ = _support(registrations(ws, "autoencoders", VAE_REGISTER), entry[1],
                                                 prefix=False)
    tiles = reuse = None
    if supported is False:  # what a planner written for it would deal to ranks (1.18)
        tiles, reuse, more = vae_tiles(ws, entry[0], entry[1])
        notes = (*notes, *more)
    return VaeFacts("vae", entry[1], entry[0], supported, by, evidence, notes, tiles, reuse)
