"""Fixture inputs captured from the model's own pipeline (runs in a verify worker only: it imports and runs
the pipeline's code).

The pipeline is built around the tiny transformer, with its scheduler and VAE made from their configs (the
model folder's, else the class defaults; the VAE on the meta device, since `output_type="latent"` never
decodes). Random prompt embeddings go in as `prompt_embeds` (pooled ones and masks where `__call__` takes
them), so no text encoder runs; a pipeline that takes none encodes a fixed prompt with a stand-in encoder
(`standins.py`), and tokenizers and image processors always stand in. It is called for a few steps at a
small size, guidance off, and a forward pre-hook records the transformer's calls: exactly the inputs the
pipeline makes.

`capture(...)` returns the recorded calls (and whether a stand-in text encoder made them), or raises
`NotCaptured` saying why not (the caller falls back to the next fixture source).
"""

from __future__ import annotations

import enum
import importlib
import inspect
import types
from pathlib import Path
from typing import Any

import libcst as cst
from integrate.verify.tiny import (  # even, and never the image token count (16 per frame below)
    TEXT_TOKENS,
    build,
    object_defaults,
)

PROMPT = "a small test prompt"  # what a stand-in text encoder encodes, where the pipeline takes no embeddings
_TEXT_INPUT = ("encoder_hidden", "text", "prompt", "context", "caption", "cap_")  # a transformer's text input
_GRID = 4  # latent tokens per side after patching
_MAX_GRID = 32  # the largest tried when a pipeline refuses the small sizes (its own minimum)
MIN_TOKENS = 4  # latent tokens a captured call must carry: 2 per rank of a 2-process CP proof
# The schedule is long and only its first calls are recorded: neighbouring steps then differ as they do in a
# real run, little, which is what a cache's residual threshold is made for.
CAPTURE_SCHEDULE = 500


class NotCaptured(Exception):
    """Why the pipeline gave no inputs. `sized`: it failed inside its own call, where other widths of the tiny
    transformer may fare better (a missing class or a component that cannot be built would not)."""

    def __init__(self, why: str, sized: bool = False) -> None:
        super().__init__(why)
        self.sized = sized


class _Enough(Exception):
    """Raised from the hook once enough calls are recorded: the pipeline need not finish."""


def _classes_of(annotation: Any, module) -> list[type]:
    """The classes an annotation names, in its order: one, or each member of a union (`A | B`,
    `Optional[A]`); the pipeline's authors list the usual one first."""
    import typing

    if isinstance(annotation, str):
        annotation = getattr(module, annotation.split("[")[0].strip(), None)
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return [annotation]
    return [a for a in typing.get_args(annotation) if isinstance(a, type) and a is not type(None)]


_NOT_BUILT = ("text_encoder", "tokenizer", "image_encoder", "feature_extractor", "processor", "image_processor",
              "audio_encoder", "vision", "safety_checker")


# Base classes a pipeline may be typed with; when model_index.json names no class, the fixture uses a
# stand-in (reported in the fixture's notes): the inputs it makes have the right shapes, which is what a
# fixture needs, though not the trained model's schedule.
_ABSTRACT = {"SchedulerMixin": "scheduler", "KarrasDiffusionSchedulers": "scheduler", "BaseGuidance": "guider"}
_STAND_INS = {"scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
              "guider": ("diffusers", "ClassifierFreeGuidance")}


def _candidates(name: str, param: inspect.Parameter, module, components: dict) -> list[type]:
    """The classes a component may be built as: the one model_index.json names, else its annotation's."""
    if name in components:
        library, class_name = components[name]
        try:
            return [getattr(importlib.import_module(library), class_name)]
        except (ImportError, AttributeError):
            pass
    return _classes_of(param.annotation, module)


def _encoders(name: str, cls: type | None, widths: dict, needs_text: bool, notes: list[str]):
    """(True, the stand-in) for a tokenizer, an image processor, an image encoder, and a text encoder when the
    call needs one (`needs_text`: the pipeline takes no prompt embeddings); (True, None) for an encoder or
    processor that is left out; (False, None) for any other component."""
    from . import standins

    if standins.is_tokenizer(cls, name):
        notes.append(f"`{name}`: a word-level tokenizer over {standins.VOCAB} placeholder words (a stand-in)")
        return True, standins.tokenizer()
    if standins.is_image_processor(cls):
        try:
            built = standins.image_processor(cls)
        except standins.NoStandIn as exc:
            notes.append(f"`{name}`: {exc}; passed None")
            return True, None
        notes.append(f"`{name}`: {cls.__name__} with its default settings (a stand-in)")
        return True, built
    text = "text_encoder" in name
    image = any(w in name for w in ("image_encoder", "vision"))
    if not (text or image) or text and not needs_text:
        return any(word in name for word in _NOT_BUILT), None
    if text and isinstance(cls, type) and cls.__name__ == "PreTrainedModel" and cls.__module__.startswith("transformers"):
        # typed only as a `transformers` model of some kind, and model_index.json names none: an encoder-only
        # stand-in (input ids and a mask in, hidden states out), said in the notes
        import transformers

        notes.append(f"`{name}`: typed PreTrainedModel and model_index.json names no class: "
                     f"{standins.GENERIC_TEXT_ENCODER} stands in")
        cls = getattr(transformers, standins.GENERIC_TEXT_ENCODER)
    if not standins.is_transformers_model(cls):
        if text:
            typed = cls.__name__ if isinstance(cls, type) else "nothing buildable"
            raise NotCaptured(f"the pipeline takes no prompt embeddings and its `{name}` is typed {typed}, which "
                              "names no model class to stand in (model_index.json names none)")
        return True, None
    second = text and name != "text_encoder" and widths.get("pooled")  # text_encoder_2: the pooled one
    width = widths["pooled"] if second else widths.get("image" if image else "text") or standins.WIDTH
    try:
        built = standins.encoder(cls, width)
    except standins.NoStandIn as exc:
        if text:
            raise NotCaptured(f"a stand-in for the pipeline's `{name}`: {exc}") from None
        notes.append(f"`{name}`: {exc}; passed None")
        return True, None
    notes.append(f"`{name}`: {cls.__name__}, {standins.LAYERS} layers {width} wide with random weights (a stand-in)")
    return True, built


def _component(name: str, param: inspect.Parameter, cls: type | None, configs: dict, notes: list[str],
               device: str = "meta", widths: dict | None = None, needs_text: bool = False):
    """A component built from its config (the model folder's, else the class defaults): modules on `device`
    (meta first: a VAE is never run with `output_type="latent"`; the CPU, random weights, when the pipeline
    uses one before the transformer), the rest (schedulers, guiders) on the CPU with guidance off; encoders,
    tokenizers and processors as `_encoders` says (text encoders left out where embeddings go in)."""
    import torch

    if param.default is not inspect.Parameter.empty and getattr(cls, "__module__", "builtins") == "builtins":
        return param.default  # a setting (`patch_size: int = 2`), not a component: its own default
    handled, built = _encoders(name, cls, widths or {}, needs_text, notes)
    if handled:
        return built
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and cls.__name__ in _ABSTRACT:
        # an enum of the classes it may be (`KarrasDiffusionSchedulers`): its first member that is a class
        library = importlib.import_module("diffusers")
        member = next((c for c in (getattr(library, m.name, None) for m in cls) if isinstance(c, type)), None)
        if member is not None:
            notes.append(f"`{name}`: {member.__name__}, the first of {cls.__name__} (model_index.json names none)")
            cls = member
    if cls is not None and inspect.isabstract(cls) or cls is not None and cls.__name__ in _ABSTRACT:
        stand_in = _STAND_INS.get(_ABSTRACT.get(cls.__name__, ""))
        if stand_in is None:
            raise NotCaptured(f"the pipeline's `{name}` is typed {cls.__name__} and model_index.json names no class")
        library, class_name = stand_in
        notes.append(f"`{name}`: {class_name}, a stand-in (model_index.json names none; the pipeline's type is "
                     f"{cls.__name__})")
        cls = getattr(importlib.import_module(library), class_name)
    if cls is None:
        if param.default is not inspect.Parameter.empty:
            return param.default
        raise NotCaptured(f"the pipeline's `{name}` has no class to build (model_index.json and its annotation "
                          "name none)")
    config = dict(configs.get(name) or {})
    missing = required_arguments(cls, config)
    if isinstance(missing, str) and not issubclass(cls, torch.nn.Module):  # a model is passed None where it fails
        raise NotCaptured(f"building the pipeline's `{name}` ({cls.__name__}): {missing}")
    for key, (value, why) in (missing.items() if isinstance(missing, dict) else ()):
        config[key] = value
        notes.append(f"`{name}`: {cls.__name__}'s required `{key}` = {value!r} ({why})")
    try:
        if issubclass(cls, torch.nn.Module):
            if device != "meta":  # run on the CPU: narrower channels first (the full widths may not fit)
                narrowed = _narrowed(cls, config, notes, name)
                if narrowed is not None:
                    return narrowed
            with torch.device(device):
                return build(cls, config)
        if "guidance_scale" in inspect.signature(cls.__init__).parameters:
            config["guidance_scale"] = 1.0
        return build(cls, config)
    except Exception as exc:  # noqa: BLE001 - the component's own constructor: report, fall back
        why = f"building the pipeline's `{name}` ({cls.__name__}) failed: {type(exc).__name__}: " \
              f"{(str(exc).splitlines() or [''])[0][:200]}"
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):  # a model the call may never run
            notes.append(f"{why}; passed None")
            return None
        raise NotCaptured(why) from None


def required_arguments(cls, config: dict) -> dict[str, tuple[Any, str]] | str:
    """Values for the arguments `cls.__init__` requires (no default) that `config` lacks, each with its evidence,
    read with libcst from the constructor's own body and signature: the first literal of a membership test whose
    failure raises (`if schedule_mode not in {"log", "power"}: raise ...` -> "log"), else the plain value of its
    annotation (`float` 1.0, `int` 1, `bool` False). A reason string where an argument has neither (the constructor
    says nothing a value could be picked by)."""
    from integrate.source import find_method
    from integrate.syntax import find_all

    from .inputs import annotation_heads, class_node

    try:
        params = [p for n, p in inspect.signature(cls.__init__).parameters.items() if n != "self"
                  and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.default is p.empty and n not in config]
    except (TypeError, ValueError):
        return {}
    if not params:
        return {}
    owner = next((k for k in cls.__mro__ if "__init__" in vars(k)), cls)
    found = class_node(owner)
    fn = find_method(found[1], "__init__") if found is not None else None
    tests: dict[str, tuple[Any, int]] = {}
    for test in find_all(fn, cst.If) if fn is not None else ():
        if not find_all(test.body, cst.Raise) or not isinstance(test.test, cst.Comparison):
            continue
        left, comps = test.test.left, test.test.comparisons
        if not (isinstance(left, cst.Name) and len(comps) == 1 and isinstance(comps[0].operator, cst.NotIn)
                and isinstance(comps[0].comparator, (cst.Set, cst.Tuple, cst.List))):
            continue
        literals = [e.value.evaluated_value for e in comps[0].comparator.elements
                    if isinstance(e.value, (cst.SimpleString, cst.Integer, cst.Float))]
        if literals:
            tests.setdefault(left.value, (literals[0], found[0].line(test)))
    plain = {"float": 1.0, "int": 1, "bool": False}
    out: dict[str, tuple[Any, str]] = {}
    for p in params:
        where = f"{Path(found[0].path).name}:{tests[p.name][1]}" if p.name in tests else ""
        heads = annotation_heads(p.annotation) - {"None"}
        if p.name in tests:
            out[p.name] = (tests[p.name][0], f"the first value the constructor accepts: it raises on any other "
                                             f"({where})")
        elif len(heads) == 1 and (head := next(iter(heads))) in plain:
            out[p.name] = (plain[head], f"annotated `{head}`, and the constructor tests no value of it")
        else:
            return (f"its required `{p.name}` is neither tested against literals nor annotated a plain number or "
                    f"flag in {cls.__name__}.__init__: no value can be picked")
    return out


def _narrowed(cls, config: dict, notes: list[str], name: str):
    """`cls` built on the CPU from its config (or its defaults) with narrower channels, or None when that is
    not a change or its constructor refuses it."""
    from .standins import narrow_channels

    full = config or object_defaults(cls)
    narrow = narrow_channels(full)
    if narrow == full or not hasattr(cls, "from_config"):
        return None
    try:
        built = cls.from_config(narrow)
    except Exception:  # noqa: BLE001 - the component's own constructor on narrower channels: use the full one
        return None
    changed = ", ".join(f"{k} {full[k]} -> {narrow[k]}" for k in narrow if narrow[k] != full.get(k))
    notes.append(f"`{name}`: {cls.__name__} with narrower channels ({changed})")
    return built


_MODEL_WIDTHS = ("hidden_size", "inner_dim", "dim", "model_dim", "d_model")
_SHARED_WIDTHS = (*_MODEL_WIDTHS, "intermediate_size", "head_dim", "attention_head_dim", "num_attention_heads",
                  "num_key_value_heads")


def _sized_like(cls, given: dict | None, changes: dict, notes: list[str], name: str) -> dict | None:
    """A config for a pipeline module whose config (the model folder's, else its class defaults) shares the
    transformer's real width (same key, same value: a condition encoder built to feed it): that config shrunk as
    the transformer's was (verify/tiny.py), with each shared key at the transformer's tiny value; None when it
    shares none or its constructor refuses the result."""
    import torch
    from integrate.verify.tiny import tiny_config

    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module) and hasattr(cls, "from_config")):
        return None
    defaults = {k: v for k, v in (given or object_defaults(cls)).items() if not k.startswith("_")}
    shared = {k: after for k, (before, after) in changes.items() if k in _SHARED_WIDTHS and k in defaults
              and isinstance(before, int) and not isinstance(before, bool) and defaults[k] == before}
    if not any(k in _MODEL_WIDTHS for k in shared):  # the model's own width among them: not a head dim alone (Sana's
        return None                                   # VAE shares its transformer's)
    config = {**tiny_config(defaults).config, **shared}
    try:
        with torch.device("meta"):
            build(cls, config)
    except Exception:  # noqa: BLE001 - the component's own constructor on the shrunk config: its defaults then
        return None
    changed = ", ".join(f"{k} {defaults[k]} -> {config[k]}" for k in config if config[k] != defaults.get(k))
    whose = "config" if given else "defaults"
    notes.append(f"`{name}`: {cls.__name__}'s {whose} share the transformer's {', '.join(sorted(shared))}: shrunk as "
                 f"the transformer was ({changed})")
    return config


def _on_cpu(pipe_cls):
    """The pipeline class, with its execution device fixed to the CPU (a meta VAE would otherwise be asked)."""
    import torch

    cpu = property(lambda self: torch.device("cpu"))
    return type(pipe_cls.__name__, (pipe_cls,), {"_execution_device": cpu, "device": cpu,
                                                 "__module__": pipe_cls.__module__})


def _widths(slots: list[dict]) -> dict[str, int]:
    """The widths the tiny transformer takes for its text, pooled text and image-embedding inputs (keys
    "text", "text_2" for a second text input, "pooled", "image"; a width not read is absent), read from the static synthesis's `_randn(...)`
    shapes (our own expressions)."""
    import ast

    text = pooled = image = None
    texts: list[int] = []
    for s in slots:
        try:
            call = ast.parse(s.get("expr") or "", mode="eval").body
        except SyntaxError:
            continue
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "_randn"):
            continue
        dims = [a.value for a in call.args[1:] if isinstance(a, ast.Constant) and isinstance(a.value, int)]
        name = s["name"]
        if "pool" in name and dims:
            pooled = dims[-1]
        elif "image" in name and len(dims) >= 3:
            image = image or dims[-1]
        elif any(w in name for w in _TEXT_INPUT) and len(dims) >= 3 \
                and TEXT_TOKENS in dims[1:-1]:
            texts.append(dims)
    text, second = ([t[-1] for t in texts] + [None, None])[:2]
    found = {k: v for k, v in (("text", text), ("text_2", second), ("pooled", pooled), ("image", image))
             if v is not None}
    if texts and len(texts[0]) > 3:  # per-layer embeddings, [B, S, layers, D], as the docstring documents
        found["text_dims"] = texts[0][1:-1]
    return found


def _second_text_width(model) -> int | None:
    """The width of the transformer's second text input (`encoder_hidden_states_2`, `..._t5`), read from the
    module its forward feeds it to; None when there is none or it is not read."""
    from integrate.verify.inputs import intake

    names = [p for p in inspect.signature(type(model).forward).parameters
             if any(w in p for w in _TEXT_INPUT) and not any(w in p for w in ("mask", "ids", "pool", "len", "kwargs"))]
    for name in names[1:]:
        taken = intake(model, name)
        if taken is not None and taken[0] in ("linear", "norm"):
            return int(taken[1]["width"])
    return None


def _size(pipe, config: dict, grid: int = _GRID) -> dict[str, int]:
    patch = config.get("patch_size") or 1
    patch = max(patch) if isinstance(patch, (list, tuple)) else int(patch)
    spatial = getattr(pipe, "vae_scale_factor_spatial", None) or getattr(pipe, "vae_scale_factor", None) or 8
    spatial = int(spatial) if isinstance(spatial, (int, float)) else 8
    side = spatial * patch * grid
    size = {"height": side, "width": side}
    temporal = getattr(pipe, "vae_scale_factor_temporal", None)
    size["num_frames"] = int(temporal) + 1 if isinstance(temporal, (int, float)) else 5
    return size


def capture(cls, model, pipeline: dict, tiny_config: dict, slots: list[dict], steps: int,
            notes: list[str], text_share: int = 1, changes: dict | None = None) -> tuple[list[dict], bool]:
    """The transformer's keyword inputs for its first `steps` calls by the pipeline (a list of dicts), and
    whether a stand-in text encoder made the embeddings (`text_share`: it is that fraction of the
    transformer's text width); what stood in for a component the model folder does not name is added to
    `notes`.

    A union-typed component (`AutoencoderDC | AutoencoderKLWan`) is tried member by member, in order, until
    the pipeline both builds and reaches its transformer; the first failure is what is reported."""
    try:
        module = importlib.import_module(pipeline["module"])
        pipe_cls = getattr(module, pipeline["class"])
    except Exception as exc:  # noqa: BLE001 - the pipeline module's own imports
        raise NotCaptured(f"importing {pipeline['module']}.{pipeline['class']} failed: {type(exc).__name__}: "
                          f"{_line(exc)}") from None
    if not isinstance(pipe_cls, type) or not hasattr(pipe_cls, "__call__"):
        raise NotCaptured(f"{pipeline['class']} is not a pipeline class")
    init = [(n, p) for n, p in list(inspect.signature(pipe_cls.__init__).parameters.items())[1:]
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if "transformer" not in dict(init):
        raise NotCaptured(f"{pipe_cls.__name__}.__init__ takes no `transformer`")
    options = {n: _candidates(n, p, module, pipeline.get("components", {})) for n, p in init if n != "transformer"}
    first: NotCaptured | None = None
    for choice in _choices(options):
        tried: list[str] = []
        by_prompt = False
        while True:
            try:
                calls = _run(pipe_cls, model, init, choice, pipeline.get("configs", {}), tiny_config, slots, steps,
                             tried, text_share, changes, by_prompt)
            except _ByPrompt as exc:  # once: the pipeline iterates its prompt beside the embeddings we pass
                tried = [str(exc)]
                by_prompt = True
                continue
            except NotCaptured as exc:
                first = first or exc
                calls = None
            break
        if calls is None:
            continue
        notes += [n for n in tried if n not in notes]
        notes += [f"`{n}`: {c.__name__}, the member of its annotation's union the pipeline runs with"
                  for n, c in choice.items() if c is not None and options[n] and c is not options[n][0]]
        return calls, by_prompt or _needs_text(pipe_cls, init)
    raise first or NotCaptured(f"building {pipe_cls.__name__} failed")


def _needs_text(pipe_cls, init) -> bool:
    """Does the pipeline encode prompts itself: a text encoder among its components, and no `prompt_embeds` its
    call takes instead?"""
    return "prompt_embeds" not in inspect.signature(pipe_cls.__call__).parameters and any(
        "text_encoder" in n for n, _ in init)


def _built(pipe_cls, kwargs: dict, classes: dict, notes: list[str]):
    """The pipeline built from `kwargs`. Left out (None) until its constructor shows it needs one: a safety
    checker it refuses to be built without, and a multimodal processor its `__init__` uses (each then a stand-in,
    said in the notes)."""
    from . import standins

    try:
        return _on_cpu(pipe_cls)(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the pipeline's constructor without a component it needs
        message = _line(exc)
        if kwargs.get("safety_checker", False) is None and "safety" in message.lower():
            kwargs["safety_checker"] = standins.safety_checker()
            notes.append(f"`safety_checker`: a stand-in that lets everything through ({pipe_cls.__name__} is not "
                         f"built without one: {message[:80]})")
            return _built(pipe_cls, kwargs, classes, notes)
        missing = [n for n, v in kwargs.items() if v is None and standins.is_processor(classes.get(n), n)]
        if isinstance(exc, AttributeError) and "'NoneType'" in message and missing:
            for name in missing:
                of = getattr(classes.get(name), "__name__", name)
                kwargs[name] = standins.TextOnlyProcessor(of)
                notes.append(f"`{name}`: a text-only stand-in for {of} holding the stand-in tokenizer (its "
                             f"constructor uses it: {message[:80]})")
            return _built(pipe_cls, kwargs, classes, notes)
        raise


def _line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0][:200]


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or "allocate memory" in str(exc)


def _raised_in(exc: BaseException, pipe_cls) -> bool:
    """Did the pipeline's own module raise `exc` (its input checks), rather than a component it called?"""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    try:
        own = inspect.getsourcefile(pipe_cls)
    except TypeError:
        return False
    return bool(frames and own and Path(frames[-1].filename).resolve() == Path(own).resolve())


def _where(exc: BaseException) -> str:
    """` (at file:line)`: the innermost frame of the raise, where it reads better than the message alone."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


class _ByPrompt(Exception):
    """The pipeline iterates its `prompt` even where embeddings are passed: call it with a prompt instead."""


def _failing_statement(exc: BaseException) -> tuple[cst.BaseStatement | cst.BaseSmallStatement, str] | None:
    """The innermost statement of the raise's own line, read with libcst, and `file:line`."""
    import traceback

    from integrate.syntax import find_all

    from .inputs import WORKSPACE

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames or not Path(frames[-1].filename).is_file():
        return None
    path, line = Path(frames[-1].filename), frames[-1].lineno
    src = WORKSPACE.load(path)
    found = [n for n in find_all(src.module, cst.SimpleStatementLine, skip_functions=False)
             if src.line(n) <= line <= src.last_line(n)]
    return (found[-1], f"{path.name}:{line}") if found else None


def _run(pipe_cls, model, init, choice: dict, configs: dict, tiny_config: dict, slots: list[dict], steps: int,
         notes: list[str], text_share: int = 1, changes: dict | None = None, by_prompt: bool = False) -> list[dict]:
    """Build the pipeline with one choice of component classes, call it, and record the transformer's calls.
    `by_prompt`: call it with a prompt its text encoder (a stand-in) encodes, where it takes embeddings as well."""
    import torch

    from integrate.syntax import find_all, self_member

    from . import standins

    params = inspect.signature(pipe_cls.__call__).parameters
    widths = _widths(slots)
    if text_share > 1 and widths.get("text"):
        widths["text"] //= text_share
    needs_text = by_prompt or _needs_text(pipe_cls, init)
    # a second transformer of the same class (Wan's `transformer_2`) is built from the tiny config as well
    configs = {**configs, **{n: tiny_config for n, _ in init if n != "transformer" and choice.get(n) is type(model)}}
    # a module built to the transformer's real width: shrunk with it
    configs.update({n: sized for n, _ in init if n != "transformer" and choice.get(n) is not type(model)
                    and (sized := _sized_like(choice.get(n), configs.get(n), changes or {}, notes, n)) is not None})
    try:
        kwargs = {n: model if n == "transformer" else _component(n, p, choice.get(n), configs, notes,
                                                                 widths=widths, needs_text=needs_text)
                  for n, p in init}
        pipe = _built(pipe_cls, kwargs, {n: choice.get(n) for n, _ in init}, notes)
    except NotCaptured:
        raise
    except Exception as exc:  # noqa: BLE001 - the pipeline's constructor, without encoders
        raise NotCaptured(f"building {pipe_cls.__name__} without text encoders failed: {type(exc).__name__}: "
                          f"{_line(exc)}") from None
    g = torch.Generator().manual_seed(0)
    call: dict[str, Any] = {"num_inference_steps": CAPTURE_SCHEDULE, "output_type": "latent",
                            "generator": torch.Generator().manual_seed(0)}
    text, pooled = widths.get("text"), widths.get("pooled")
    if "prompt_embeds" in params and not by_prompt:
        if text is None:
            raise NotCaptured("the width of the transformer's text input is not known")
        call["prompt_embeds"] = torch.randn(1, *widths.get("text_dims", [TEXT_TOKENS]), text, generator=g)
        if _a_list(params["prompt_embeds"].annotation):  # one [tokens, width] tensor per prompt
            call["prompt_embeds"] = list(call["prompt_embeds"].unbind(0))
    elif needs_text:
        call["prompt"] = PROMPT  # encoded by the stand-in text encoder
        if "max_sequence_length" in params:
            call["max_sequence_length"] = TEXT_TOKENS
    else:
        notes.append(f"{pipe_cls.__name__} has no text encoder: called without prompt embeddings")
    for name in params:  # a second text encoder's embeddings (`prompt_embeds_2`): the second text input's width
        if name.startswith("prompt_embeds_") and "mask" not in name and "prompt_embeds" in call:
            if widths.get("text_2") is None:
                widths["text_2"] = _second_text_width(model)
            if widths.get("text_2") is None and widths.get("text"):
                # no module of the built model takes a second text input at this config: any width passes
                widths["text_2"] = widths["text"]
                notes.append(f"`{name}`: no module of the tiny model reads it; made {widths['text']} wide as the first")
            if widths.get("text_2") is None:
                raise NotCaptured(f"the pipeline takes `{name}` and the transformer's second text width is not known")
            call[name] = torch.randn(1, TEXT_TOKENS, widths["text_2"], generator=g)
    if "pooled_prompt_embeds" in params:
        if pooled is None:
            raise NotCaptured("the pipeline takes `pooled_prompt_embeds` and the pooled width is not known")
        call["pooled_prompt_embeds"] = torch.randn(1, pooled, generator=g)
    for name in params:
        if "prompt" in name and "mask" in name and not name.startswith("negative"):
            call[name] = _padded_mask()
    if "guidance_scale" in params:
        call["guidance_scale"] = 1.0
    if "use_resolution_binning" in params:  # binning would move the small size to a trained aspect-ratio bin
        call["use_resolution_binning"] = False
    for name, p in params.items():
        # a cache of the pipeline's own (`use_kv_cache=True`: a prefix KV cache object handed to the
        # transformer) is no input a fixture can store, and block caching is what the integration adds: off
        if "cache" in name and p.default is True:
            call[name] = False
            notes.append(f"`{name}`: False (the pipeline's own cache; a fixture stores tensors and plain values)")
    calls: list[dict] = []
    forward = inspect.signature(type(model).forward)

    def hook(module, args, kw):
        bound = forward.bind_partial(module, *args, **kw).arguments
        bound.pop("self", None)
        calls.append({k: _detached(v) for k, v in bound.items()})
        if len(calls) >= steps:
            raise _Enough

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    grid, on_cpu, resized = _GRID, False, set()

    def too_small(size: dict) -> bool:
        """A latent too small to split over the ranks of a CP proof (each needs 2 tokens of its own): the calls are
        dropped and the size doubled (the pipeline's VAE compresses more than assumed: LTX-Video, 32 pixels a
        token). False when it is large enough, its size is not read, or no larger size is tried."""
        nonlocal grid
        tokens = image_tokens(calls[0], tiny_config) if calls else None
        if tokens is None or tokens >= MIN_TOKENS or grid >= _MAX_GRID:
            return False
        notes.append(f"{pipe_cls.__name__} at {size['width']}x{size['height']} gave a latent of {tokens} token(s), "
                     f"fewer than {MIN_TOKENS} (2 per rank of a 2-process CP proof): called at twice the size")
        calls.clear()
        grid *= 2
        return True

    try:
        while True:
            size = _size(pipe, tiny_config, grid)
            sized = {**call, **{k: v for k, v in size.items() if k in params}}
            sized.update(_required(pipe_cls.__name__, params, sized, size, []))
            try:
                with torch.no_grad():
                    pipe(**sized)
            except _Enough:
                pass
            except Exception as exc:  # noqa: BLE001 - the pipeline's own code on a tiny model
                if calls:  # it failed after calling the transformer (decoding the latent): the calls stand
                    if too_small(size):
                        continue
                    break
                if "meta" in _line(exc) and not on_cpu:
                    # the pipeline runs a component (the VAE, encoding an input image) before the transformer:
                    # build its modules on the CPU with random weights and call it again
                    _to_cpu(pipe, init, configs, notes)
                    on_cpu = True
                    continue
                if _rewidened(pipe, init, exc, resized, notes):
                    continue
                if isinstance(exc, ValueError) and "guidance_scale" in str(exc) and "guidance_scale" in call \
                        and _raised_in(exc, pipe_cls):
                    # the pipeline guides by a schedule of its own and refuses a scale beside it: its default
                    notes.append(f"{pipe_cls.__name__} refused guidance_scale=1.0 ({_line(exc)[:100]}): left at "
                                 "its default")
                    del call["guidance_scale"]
                    continue
                if isinstance(exc, ValueError) and "num_inference_steps" in str(exc) \
                        and call.get("num_inference_steps") == CAPTURE_SCHEDULE and _raised_in(exc, pipe_cls):
                    # a schedule of the pipeline's own is sized to its default step count
                    notes.append(f"{pipe_cls.__name__} refused {CAPTURE_SCHEDULE} steps ({_line(exc)[:100]}): "
                                 "called with its default step count")
                    del call["num_inference_steps"]
                    continue
                failing = _failing_statement(exc) if isinstance(exc, TypeError) and "'NoneType'" in str(exc) \
                    and _raised_in(exc, pipe_cls) else None
                read = {n.value for n in find_all(failing[0], cst.Name)} if failing else set()
                if failing and "not iterable" in str(exc) and "prompt_embeds" in call and "prompt" in read \
                        and "prompt" in params \
                        and not by_prompt and any("text_encoder" in n for n, _ in init):
                    raise _ByPrompt(f"{pipe_cls.__name__} iterates its `prompt` even beside prompt embeddings "
                                    f"({type(exc).__name__}: {_line(exc)} at {failing[1]}): called with a prompt, "
                                    "encoded by a stand-in text encoder")
                called = [self_member(c.func) for c in find_all(failing[0], cst.Call)] if failing else []
                left_out = [n for n in called if n and getattr(pipe, n, False) is None
                            and standins.is_processor(choice.get(n), n)]
                if "not callable" in str(exc) and left_out:
                    # a multimodal processor the call tokenizes its prompt with (no images): the text-only stand-in
                    of = getattr(choice.get(left_out[0]), "__name__", left_out[0])
                    setattr(pipe, left_out[0], standins.TextOnlyProcessor(of))
                    notes.append(f"`{left_out[0]}`: a text-only stand-in for {of} holding the stand-in tokenizer "
                                 f"(the call tokenizes its prompt with it: {failing[1]})")
                    continue
                if ("negative_" in str(exc) or "NoneType" in str(exc)) and _add_negatives(call, params, g):
                    # the pipeline asks for negative embeddings beside ours, or encodes a negative prompt with
                    # the text encoder it was built without (its guidance is on at any scale): random ones
                    notes.append(f"{pipe_cls.__name__} stopped without negative embeddings ({_line(exc)[:100]}): "
                                 "random ones of the same shapes are passed")
                    continue
                if isinstance(exc, (ValueError, ZeroDivisionError)) and grid < _MAX_GRID and _raised_in(exc, pipe_cls):
                    # the pipeline's own checks refused the size (a minimum, a multiple): the next larger one
                    notes.append(f"{pipe_cls.__name__} refused {size['width']}x{size['height']} "
                                 f"({_line(exc)[:120]}); called at twice the size")
                    grid *= 2
                    continue
                raise NotCaptured(f"{pipe_cls.__name__}(...) failed before calling the transformer: "
                                  f"{type(exc).__name__}: {_line(exc)}{_where(exc)}",
                                  sized=not _out_of_memory(exc)) from None
            if too_small(size):
                continue
            break
    finally:
        handle.remove()
    _required(pipe_cls.__name__, params, {**call, **size}, size, notes)  # what was made up, said once
    if not calls:
        raise NotCaptured(f"{pipe_cls.__name__}(...) never called the transformer")
    for i, c in enumerate(calls):
        bad = [k for k, v in c.items() if not storable(v)]
        if bad:
            raise NotCaptured(f"the transformer's input `{bad[0]}` (call {i}) is not a tensor or a plain value")
    return calls


def _rewidened(pipe, init, exc: BaseException, resized: set, notes: list[str]) -> bool:
    """A stand-in text encoder rebuilt to the width the module that takes its output expects, read from the error
    that module raised (`mat1 and mat2 shapes cannot be multiplied (47x64 and 1024x2048)`: a Linear of another
    pipeline component, 1024 in, was handed the encoder's 64-wide states). False when the error is not that, the
    width handed in is no stand-in encoder's, or that encoder was rebuilt once already."""
    import re

    from . import standins

    found = re.search(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)", str(exc))
    if not isinstance(exc, RuntimeError) or found is None:
        return False
    given, wanted = int(found.group(2)), int(found.group(3))
    for name, _ in init:
        current = getattr(pipe, name, None)
        config = getattr(current, "config", None)
        if ("text_encoder" not in name or name in resized or not standins.is_transformers_model(type(current))
                or getattr(config, "hidden_size", getattr(config, "d_model", None)) != given):
            continue
        try:
            built = standins.encoder(type(current), wanted)
        except standins.NoStandIn:
            return False
        resized.add(name)
        setattr(pipe, name, built)
        notes.append(f"`{name}`: the stand-in rebuilt {wanted} wide: the module that takes its {given}-wide output "
                     f"expects {wanted} (`{_line(exc)[:100]}`{_where(exc)})")
        return True
    return False


def _a_list(annotation) -> bool:
    """Is a parameter typed a list (`list[torch.FloatTensor] | None`), and not a tensor as well?"""
    import typing

    members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
        else (annotation,)
    members = [m for m in members if m is not type(None)]
    return bool(members) and all(typing.get_origin(m) is list for m in members)


def _add_negatives(call: dict, params, g) -> bool:
    """Add the `negative_` twin of each embedding and mask in `call` that `__call__` takes; False when none was
    missing."""
    import torch

    added = False
    for name in list(call):
        twin, value = f"negative_{name}", call[name]
        if twin not in params or twin in call:
            continue
        if isinstance(value, torch.Tensor):
            call[twin] = value.clone() if "mask" in name else torch.randn(value.shape, generator=g)
        elif isinstance(value, list) and value and all(isinstance(v, torch.Tensor) for v in value):
            call[twin] = [torch.randn(v.shape, generator=g) for v in value]
        else:
            continue
        added = True
    return added


def _choices(options: dict[str, list[type]], limit: int = 6):
    """Component class choices to build a pipeline with: every first class, then each alternative of a union
    in turn (at most `limit` sets)."""
    first = {n: (c[0] if c else None) for n, c in options.items()}
    yield first
    tried = 1
    for name, classes in options.items():
        for alt in classes[1:]:
            if tried >= limit:
                return
            tried += 1
            yield {**first, name: alt}


def _to_cpu(pipe, init, configs: dict, notes: list[str]) -> None:
    """Rebuild the pipeline's meta-device modules (never the transformer) on the CPU, with random weights."""
    import torch

    for name, param in init:
        current = getattr(pipe, name, None)
        if name == "transformer" or not isinstance(current, torch.nn.Module):
            continue
        if not any(p.is_meta for p in current.parameters()):
            continue
        why: list[str] = []
        built = _component(name, param, type(current), configs, why, device="cpu")
        if not isinstance(built, torch.nn.Module):
            raise NotCaptured(f"the pipeline runs its `{name}` before the transformer, and building it on the CPU "
                              f"failed: {why[-1] if why else 'nothing was built'}")
        notes += why
        setattr(pipe, name, built.eval())
        notes.append(f"`{name}`: {type(current).__name__} built on the CPU with random weights (the pipeline runs "
                     "it before the transformer)")


def _picture(size: dict[str, int], seed: int = 0):
    """A deterministic noise picture of the call's size (what an image argument of a pipeline takes)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size["height"], size["width"], 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


def _required(pipe_name: str, params, call: dict, size: dict[str, int], notes: list[str]) -> dict:
    """Arguments `__call__` requires that the call does not yet have: pictures for images, lists of them for
    videos, None for a prompt (its embeddings go in instead); anything else cannot be made up."""
    out: dict[str, Any] = {}
    for name, p in params.items():
        if name == "self" or name in call or p.default is not p.empty or p.kind in (p.VAR_POSITIONAL,
                                                                                     p.VAR_KEYWORD):
            continue
        if "video" in name:
            out[name] = [_picture(size, i) for i in range(size.get("num_frames", 5))]
            notes.append(f"`{name}`: {len(out[name])} noise frames of {size['width']}x{size['height']} (required)")
        elif "image" in name:
            out[name] = _picture(size)
            notes.append(f"`{name}`: a noise picture of {size['width']}x{size['height']} (required)")
        elif "prompt" in name:
            out[name] = None
        elif "label" in name:  # class-conditional models (`class_labels`): the first class
            out[name] = [0]
            notes.append(f"`{name}`: [0], the first class (required)")
        else:
            raise NotCaptured(f"{pipe_name}.__call__ requires `{name}`, and no rule makes one")
    return out


def _padded_mask():
    """The prompt mask the static fixture uses too: padding at the end and one masked token early on, so a
    mask left in the wrong order under Ulysses shows (inputs.TEXT_PADDING tokens of padding)."""
    import torch
    from integrate.verify.inputs import TEXT_PADDING

    mask = torch.ones(1, TEXT_TOKENS, dtype=torch.long)
    mask[:, TEXT_TOKENS - TEXT_PADDING + 1:] = 0
    mask[:, 1] = 0
    return mask


def _detached(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def storable(value) -> bool:
    """What torch.load(weights_only=True) reads back: tensors, plain values, and lists / tuples / dicts. An enum member
    is not (a `str` or `int` one included: it would be saved as its class, which that load refuses)."""
    import enum

    import torch

    if isinstance(value, enum.Enum):
        return False
    if isinstance(value, (torch.Tensor, bool, int, float, str, type(None))):
        return True
    if isinstance(value, (list, tuple)):
        return all(storable(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and storable(v) for k, v in value.items())
    return False


def text_tokens(call: dict) -> int:
    """Text tokens of a captured call: the length of its 3-D text input, else the prompt length we make."""
    import torch

    for name, value in call.items():
        if isinstance(value, torch.Tensor) and value.ndim == 3 and name != "hidden_states" and any(
                w in name for w in _TEXT_INPUT):
            return int(value.shape[1])
    return TEXT_TOKENS


def image_tokens(call: dict, config: dict) -> int | None:
    """Image tokens the transformer makes of the captured latent: a packed [B, S, D] latent has S; a
    [B, C, H, W] or [B, C, F, H, W] one is cut into patches of the config's `patch_size` (`patch_size_t` in
    time). None when the latent or its patching is not known."""
    import math

    import torch

    latent = call.get("hidden_states")
    if not isinstance(latent, torch.Tensor):
        return None
    if latent.ndim == 3:
        return int(latent.shape[1])
    patch = config.get("patch_size")
    if isinstance(patch, (list, tuple)) and len(patch) == latent.ndim - 2:
        patches = [int(p) for p in patch]
    elif isinstance(patch, int) and latent.ndim in (4, 5):
        patches = [int(config.get("patch_size_t") or 1)] * (latent.ndim - 4) + [patch, patch]
    else:
        return None
    dims = list(latent.shape[2:])
    if any(d % p for d, p in zip(dims, patches)):
        return None
    return math.prod(d // p for d, p in zip(dims, patches))
