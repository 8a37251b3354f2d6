"""The fixture file: an editable Python module holding the tiny config and the forward inputs.

`integrate verify` writes it beside the generated plugin (`Maker`). A checksum of its body is written into
it; when the text no longer matches, a person has edited it and the file is used as it stands.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import jinja2

from integrate import __version__, escape
from integrate.errors import InputError

from .records import FixtureReport

FILENAME = "verify_fixture.py"
_MARK = "# integrate-fixture sha256="


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def _split(text: str) -> tuple[str | None, str]:
    _, sep, rest = text.partition(_MARK)
    if not sep:
        return None, text
    sha, _, body = rest.partition("\n")
    return sha.strip(), body


# The fixture's expressions call only these (and torch's constructors below); anything else in a slot's
# expression is refused before the file is written.
_HELPERS = {"_randn", "_mask", "_grid_ids", "_rope_pair", "_gen", "_saved", "_config", "_own", "_samples", "step",
            "torch", "True", "False", "None"}
_TORCH = {"zeros", "ones", "full", "randint", "tensor", "arange", "long", "float32", "bool", "zeros_like", "ones_like"}
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), trim_blocks=True,
                          lstrip_blocks=True, keep_trailing_newline=True, finalize=escape.finalize)
_ENV.filters.update(escape.FILTERS)


def render(*, transformer_class: str, transformer_module: str, config: dict[str, Any], changes: dict,
           slots: list[dict[str, Any]], image_tokens: int | None, text_tokens: int, steps: int,
           config_source: str, problems: list[str] = (), notes: list[str] = ()) -> str:
    """The fixture module's text. Every value goes through integrate.escape; the config is written as a
    Python literal that must read back as itself, and each slot's expression may only call the fixture's
    own helpers. `notes`: what the derivation did and tried, each with its evidence, listed in the docstring."""
    errors = [*problems, *(f"{s['name']} ({s['error']})" for s in slots if s.get("error"))]
    try:
        config_text = escape.py_dict(config)
    except escape.UnsafeValue as exc:
        raise escape.UnsafeValue(f"the tiny config cannot be written as a Python literal ({exc})") from None
    slots = [{**s, "expr": _expression(s["expr"]) if s.get("expr") is not None else None} for s in slots]
    text = _ENV.get_template("fixture.j2").render(
        transformer_class=transformer_class, transformer_module=transformer_module,
        version=escape.Code(__version__), config=config_text, slots=slots, errors=errors,
        changes=", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items()) or "none",
        image_tokens=image_tokens, text_tokens=text_tokens, steps=steps, config_source=config_source,
        notes=list(notes), sha=escape.Code("SHA"))
    escape.check_python(text, FILENAME)
    _, body = _split(text)
    return text.replace(f"{_MARK}SHA", f"{_MARK}{_digest(body)}", 1)


def _failure(error: dict) -> str:
    where = f" in module `{error['module']}`" if error.get("module") else ""
    return f"{error.get('type', 'error')}: {error.get('message', '')}{where}"


def with_masks(slots: list[dict], dtype: str | None) -> list[dict]:
    """The slots with every synthesised mask cast to `dtype` (None: as synthesised)."""
    if not dtype:
        return slots
    if dtype not in ("bool", "float32"):
        raise escape.UnsafeValue(f"mask dtype {dtype!r}")
    out = []
    for x in slots:
        call = ast.parse(x["expr"], mode="eval").body if (x.get("expr") or "").startswith("_mask(") else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "_mask":
            call.keywords = [k for k in call.keywords if k.arg != "dtype"] + [
                ast.keyword("dtype", ast.Attribute(ast.Name("torch", ast.Load()), dtype, ast.Load()))]
            x = {**x, "expr": ast.unparse(call)}
        out.append(x)
    return out


def _expression(expr: str) -> escape.Code:
    """A slot's expression, refused unless it only calls the fixture's helpers and torch's constructors."""
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise escape.UnsafeValue(f"fixture expression {expr[:80]!r} does not parse") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in _HELPERS:
            raise escape.UnsafeValue(f"fixture expression {expr[:80]!r} reads {node.id!r}")
        if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id == "torch"
                                                    and node.attr in _TORCH):
            raise escape.UnsafeValue(f"fixture expression {expr[:80]!r} reaches {ast.unparse(node)!r}")
        if isinstance(node, ast.Dict) and not all(isinstance(k, ast.Constant) and isinstance(k.value, str)
                                                  for k in node.keys):  # a dict input of string keys (no `**`)
            raise escape.UnsafeValue(f"fixture expression {expr[:80]!r} holds a dict of other keys")
        if not isinstance(node, (ast.Expression, ast.Call, ast.Name, ast.Attribute, ast.Constant, ast.Tuple,
                                 ast.List, ast.Dict, ast.BinOp, ast.UnaryOp, ast.keyword, ast.Load, ast.operator,
                                 ast.unaryop)):
            raise escape.UnsafeValue(f"fixture expression {expr[:80]!r} holds a {type(node).__name__}")
    return escape.Code(expr)


def _sources(paths: list[str | None]) -> dict[str, str | None]:
    """{file: its SHA-256} of the files a fixture is derived from (the transformer's and pipeline's sources, a
    model test given with --fixture-from)."""
    return {p: _sha_or_none(Path(p)) for p in paths if p}


def _job_key(job: dict, sources: dict[str, str | None]) -> str:
    """What a derived fixture is a function of: the derive job (model, config, pipeline, the inputs the plan
    traced), the versions that run it, integrate's own code, and the bytes of its `sources`: an edit to any
    derives it anew."""
    import importlib.metadata as md

    from integrate.cache import tool_digest

    versions = {}
    for dist in ("torch", "diffusers", "transformers"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    body = {k: v for k, v in job.items() if k != "capture_path"} | {"versions": versions, "tool": __version__,
                                                                    "code": tool_digest(), "sources": sources}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _remember(path: Path, key: str, sources: dict[str, str | None], report: FixtureReport) -> None:
    """Beside a derived fixture: the job it was derived from and its report, for `_reused`."""
    from integrate.records import to_json

    if report.status not in ("derived", "needs-edit"):
        return
    data = {"job": key, "sources": sources, "fixture_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "capture_sha256": _sha_or_none(path.with_suffix(".pt")), "report": to_json(report)}
    path.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")


def _sha_or_none(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _reused(path: Path, key: str) -> FixtureReport | None:
    """The report of a fixture derived from the same job, when its files are exactly as derived; else None."""
    from integrate.records import RecordError, from_json

    meta = path.with_suffix(".json")
    try:
        data = json.loads(meta.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("job") != key or not path.is_file():
        return None
    if data.get("fixture_sha256") != hashlib.sha256(path.read_bytes()).hexdigest():
        return None
    if data.get("capture_sha256") != _sha_or_none(path.with_suffix(".pt")):
        return None
    try:
        report = from_json(FixtureReport, data.get("report"))
    except RecordError:
        return None
    return dataclasses.replace(report, path=str(path))  # the files may have been copied here from elsewhere


def edited(path: Path) -> bool:
    """True when the file exists and its text is not what integrate wrote."""
    if not path.is_file():
        return False
    sha, body = _split(path.read_text())
    return sha is None or sha != _digest(body)


def check(path: Path) -> None:
    """A fixture a person edited, checked without running it (it runs only in the workers): it must parse
    and define CONFIG, inputs, TRANSFORMER_CLASS and STEPS."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise InputError(f"{path}: the fixture does not parse: {type(exc).__name__}: {exc}") from None
    defined = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
               if isinstance(t, ast.Name)} | {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    for name in ("CONFIG", "inputs", "TRANSFORMER_CLASS", "STEPS"):
        if name not in defined:
            raise InputError(f"{path}: the fixture has no `{name}`")


def constant(path: Path, name: str) -> Any:
    """The literal value a fixture assigns to `name` at top level (None when it is not a literal)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except (ValueError, SyntaxError, RecursionError, MemoryError):
                return None
    return None


def load(path: Path):
    """Import the fixture module (in a worker only: it runs the file); a broken one is the user's input
    error."""
    spec = importlib.util.spec_from_file_location("integrate_verify_fixture", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the file is the user's (or ours, edited): say what is wrong with it
        raise InputError(f"{path}: the fixture does not load: {type(exc).__name__}: {exc}") from None
    for name in ("CONFIG", "inputs", "TRANSFORMER_CLASS", "STEPS"):
        if not hasattr(module, name):
            raise InputError(f"{path}: the fixture has no `{name}`")
    return module


class Maker:
    """Derives the fixture for a plan (in a worker: the tiny model is built on the meta device there), writes
    it, and rewrites its masks when the plain model wants another dtype."""

    def __init__(self, plan, ws, path: Path, module: str, paths: tuple[str, ...], env: dict, *, steps: int,
                 progress, fixture_from: Path | None = None, fork: bool = False) -> None:
        self.fixture_from = fixture_from
        self.fork = fork  # proofs follow: their fork server is started now and the fixture's workers forked too
        # `paths`: where the workers import the model from (integrate.workers.import_path)
        self.plan, self.ws, self.path, self.module, self.paths, self.env = plan, ws, path, module, paths, env
        self.steps, self.progress = steps, progress
        self._derived: tuple[dict, str] | None = None
        self._report: FixtureReport | None = None

    def passed(self) -> dict[str, int | None]:
        """What the pipeline passes the transformer: keyword -> dims (None: not read)."""
        from integrate.analyzers.structure import (documented_ndims, joined_id_ndims, pipeline_arg_ndims,
                                                   pipeline_call_keywords)
        from integrate.gate import run_gate

        gate = run_gate(self.plan.gate_flags, self.ws)
        t_src = self.ws.load(Path(gate.value("transformer_file")))
        t_cls = t_src.classes[gate.value("transformer_class")]
        read = {**joined_id_ndims(t_src, t_cls), **documented_ndims(t_src, t_cls), **pipeline_arg_ndims(self.ws, gate)}
        ndims = {k: v[0] for k, v in read.items()}
        passed = {k: ndims.get(k) for k in pipeline_call_keywords(self.ws, gate)}
        # masks the forward takes: pipelines often pass them through `**kwargs`, and they are what a CP
        # mask reorder is about, so the fixture always has them
        seq = self.plan.facts.sequence
        for mask in seq.masks if seq else ():
            if mask.name in seq.forward_params:
                passed.setdefault(mask.name, None)
        return passed

    def shapes(self) -> dict[str, list[str]]:
        """The dims, by name, of each input the transformer's forward docstring documents a shape for."""
        from integrate.analyzers.structure import documented_dims

        m = self.plan.model
        t_src = self.ws.load(Path(m.transformer_file))
        cls = t_src.classes.get(m.transformer_class)
        return {k: list(v) for k, v in documented_dims(t_src, cls).items()} if cls is not None else {}

    def described(self) -> dict[str, list]:
        """{input: [what the transformer's forward docstring says of it, file:line]}: the values an input takes
        (`0` video, `1` text) and what it indexes, for the worker's rules."""
        from integrate.analyzers.structure import documented_text

        m = self.plan.model
        t_src = self.ws.load(Path(m.transformer_file))
        cls = t_src.classes.get(m.transformer_class)
        return {k: [text, f"{Path(t_src.path).name}:{line}"] for k, (text, line) in
                documented_text(t_src, cls).items()} if cls is not None else {}

    def pipeline(self) -> dict | None:
        """What the worker needs to build the model's own pipeline: its module and class, the components
        model_index.json names and the scheduler's and VAE's configs (read and checked here, as data). None
        when the loop is not a pipeline class (a function, or a method of a third-party class)."""
        from integrate.analyzers.structure import read_model_index
        from integrate.jsonfile import check_config, read

        m = self.plan.model
        if not m.pipeline_class or "." in m.pipeline_class or not m.pipeline_file:
            return None
        src = self.ws.load(Path(m.pipeline_file))
        if m.pipeline_class not in src.classes or not src.dotted_name:
            return None
        index = read_model_index(m.model_path) or {}
        components = {k: v for k, v in index.items() if not k.startswith("_") and isinstance(v, list) and len(v) == 2
                      and all(isinstance(x, str) for x in v) and k.isidentifier()}
        configs = {}
        for name, file in (("scheduler", "scheduler_config.json"), ("vae", "config.json")):
            p = Path(m.model_path or "") / name / file
            if m.model_path and p.is_file():
                data = read(p)
                check_config(p, data)
                configs[name] = {k: v for k, v in data.items() if not k.startswith("_")}
        return {"module": src.dotted_name, "class": m.pipeline_class, "components": components, "configs": configs}

    def ensure(self) -> FixtureReport:
        """The fixture as it stands when a person edited it; otherwise derived and written anew."""
        from .processes import finish, spawn

        path = self.path
        if edited(path):
            check(path)  # a broken edit is the user's input error: say so now
            self._report = FixtureReport(str(path), "edited")
            return self._report
        m = self.plan.model
        config, literal = self.real_config()
        saved = path.with_suffix(".pt")
        job = {"mode": "derive", "transformer_module": self.module, "transformer_class": m.transformer_class,
               "config": config, "passed": self.passed(), "shapes": self.shapes(),
               "described": self.described(),
               "steps": self.steps,
               "pipeline": self.pipeline(), "capture_path": str(saved.absolute()),
               "fixture_from": str(self.fixture_from.resolve()) if self.fixture_from else None}
        sources = _sources([m.transformer_file, m.pipeline_file, job["fixture_from"]])
        key = _job_key({**job, "paths": list(self.paths)}, sources)  # derived where the model imported from
        again = _reused(path, key)
        if again is not None:  # derived before from the very same job, and untouched since
            self.progress("the tiny fixture derived before from the same model and sources: reused")
            self._report = again
            return again
        self.progress("deriving the tiny fixture")
        saved.unlink(missing_ok=True)  # a capture from an earlier run is not this fixture's
        proc = spawn(job, self.env, self.paths, fork=self.fork)
        proc.wait()
        out, err = finish(proc)
        if proc.returncode != 0 or not out.strip():
            tail = (err.strip().splitlines() or ["no output"])[-1]
            return FixtureReport(str(path), "error", (f"deriving the fixture failed: {tail}",))
        d = json.loads(out)
        source = m.config_file if m.config_file and config else "the class defaults"
        if literal is not None:
            ev = literal.evidence
            source = f"{ev.file}:{ev.line} ({ev.why}; the model folder gives no config)"
        if d.get("source") == "test-file":
            source = f"the model test {self.fixture_from.name}"
        self._derived = (d, source)
        errors = tuple(f"`{s['name']}`: {s['error']}" for s in d["slots"] if s.get("error"))
        ran = d.get("check") or {}
        masks = ran.get("masks") if ran.get("ok") else None
        if not errors and not d.get("error") and not ran.get("ok"):
            errors = (f"the plain tiny model does not run on it: {_failure(ran.get('error') or {})}",)
        self._write(d, source, masks, errors)
        origin = {"source": d.get("source", "static"), "tried": tuple(d.get("tried", ())),
                  **({"notes": tuple(d["notes"])} if d.get("notes") else {})}
        if d.get("error"):
            self._report = FixtureReport(str(path), "needs-edit", (f"CONFIG: {d['error']}",),
                                         parameters=d["parameters"], changes=d["changes"], **origin)
        else:
            self._report = FixtureReport(str(path), "needs-edit" if errors else "derived", errors,
                                         parameters=d["parameters"], changes=dict(d["changes"]),
                                         image_tokens=d["image_tokens"], text_tokens=d["text_tokens"],
                                         **origin, **({"masks": masks} if masks else {}))
        _remember(path, key, sources, self._report)
        return self._report

    def real_config(self):
        """(the transformer's full-size config, the repository literal it came from or None): the model folder's
        config; where there is none and the transformer takes a config dataclass, the first complete literal of it
        the model's own repository writes (`FluxParams(...)` in its table of released sizes)."""
        from integrate.analyzers.config_object import config_literal
        from integrate.analyzers.structure import load_config

        from integrate.workers import installed

        m = self.plan.model
        config = load_config(m.config_file)
        src = self.ws.load(Path(m.transformer_file))
        if config or installed(src.path) or src.package_root is None:  # a repository's own code only
            return config, None
        cls = src.classes.get(m.transformer_class)
        literal = config_literal(self.ws, src, cls, src.package_root) if cls is not None else None
        return (dict(literal.values), literal) if literal is not None else ({}, None)

    def _write(self, d: dict, source: str, mask_dtype: str | None = None, problems: tuple[str, ...] = ()) -> None:
        slots = with_masks(d["slots"], mask_dtype)
        text = render(transformer_class=self.plan.model.transformer_class, transformer_module=self.module,
                      config=d["config"], changes=d["changes"], slots=slots, image_tokens=d.get("image_tokens"),
                      text_tokens=d.get("text_tokens", 0), steps=self.steps, config_source=source,
                      problems=[d["error"]] if d.get("error") else list(problems),
                      notes=[*d.get("notes", ()), *(f"tried {t}" for t in d.get("tried", ()))])
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)

    def check_edited(self) -> FixtureReport:
        """An edited fixture, run once with the plain model (in a worker: running it runs the file)."""
        from .processes import finish, spawn

        proc = spawn({"mode": "check", "fixture": str(self.path.absolute())}, self.env, self.paths, fork=self.fork)
        proc.wait()
        out, err = finish(proc)
        if proc.returncode != 0 or not out.strip():
            tail = (err.strip().splitlines() or ["no output"])[-1]
            return FixtureReport(str(self.path), "needs-edit", (f"the fixture does not load: {tail}",))
        error = json.loads(out).get("error")
        if error:
            return FixtureReport(str(self.path), "needs-edit",
                                 (f"the plain tiny model does not run on it: {_failure(error)}",))
        return self._report

    def streams(self) -> tuple[int, int] | None:
        """(text tokens, image tokens) of the fixture, to line up shards of a joint sequence."""
        img, txt = constant(self.path, "IMAGE_TOKENS"), constant(self.path, "TEXT_TOKENS")
        return (txt, img) if isinstance(img, int) and isinstance(txt, int) and img and txt else None
