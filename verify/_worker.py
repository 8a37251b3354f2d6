"""One process of a proof (run by verify/run.py; never imported by it).

stdin: a job (JSON). `derive` builds the tiny model on the meta device and synthesises its inputs;
`run` builds it with seeded random weights and runs one proof: `baseline` (the plain model), `cache`,
or `parallel` (one rank of CP or TP over gloo; RANK / WORLD_SIZE / MASTER_* in the environment).
Outputs go to files under job["out"]; stdout carries one JSON object. An exception inside the model or
the integration is caught and reported with the module that raised it. A package the model's import needs and
does not find ends any mode with `{"missing": ...}` (integrate.missing) on stdout and exit status 1.
The import path (the model's package root, --source-root folders, PYTHONPATH) is set by integrate.workers
before this module runs, and the working directory is a scratch folder of this worker's own.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

from integrate.verify.engagement import Engagement
from integrate.verify.tensors import plain, randomize, tensors
from integrate.verify.tiny import build, model_config

sys.stdout, _REAL = sys.stderr, sys.stdout  # library chatter goes to stderr, the JSON to stdout
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
os.environ.setdefault("CACHE_DIT_LOG_LEVEL", "error")


class _Missing(Exception):
    """Importing the model needs a package that is not installed (`details`: integrate.missing.found)."""

    def __init__(self, details: dict) -> None:
        super().__init__(details["package"])
        self.details = details


def _load_class(module: str, name: str):
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        from integrate.missing import found

        details = found(exc, module)
        if details is None:
            raise
        raise _Missing(details) from exc
    return getattr(loaded, name)


# ---- derive --------------------------------------------------------------------------------------------


def derive(job: dict) -> dict:
    from integrate.verify.tiny import WIDTHS, fill_unset, object_defaults
    from integrate.verify.tiny import derive as tiny_derive

    cls = _load_class(job["transformer_module"], job["transformer_class"])
    config = job["config"] or object_defaults(cls)
    tiny = tiny_derive(cls, config)
    filled_notes: list[str] = []
    filled: dict = {}
    if tiny.error and not job["config"] and tiny.error.startswith("building"):
        # the class defaults leave fields unset that a real config gives: small stand-ins, said in the notes
        filled = fill_unset(config)
        retry = tiny_derive(cls, {**config, **filled}) if filled else tiny
        if retry.error:
            filled = {}
        if filled:
            config, tiny = {**config, **filled}, retry
            tiny.changes.update({k: (None, tiny.config[k]) for k in filled})
            filled_notes.append("the class defaults leave " + ", ".join(f"`{k}`" for k in filled) + " unset (a real "
                                "config gives them): the tiny config sets " + ", ".join(
                                    f"{k}={tiny.config[k]!r}" for k in filled))
        else:
            unset = [k for k, v in config.items() if v is None and any(
                w in k for w in ("channels", "patch", "dim", "size"))]
            if unset:
                tiny.error += (f" (the class defaults leave {', '.join(f'`{k}`' for k in unset[:4])} unset: the "
                               "transformer's config.json gives them: --model-path or --config)")
    switched: dict = {}
    if not tiny.error:
        # modules forward calls unguarded and the config leaves unbuilt: their switches on (said in the notes)
        config, tiny, switched = _switched_on(cls, config, tiny, filled_notes)
    if not tiny.error:
        # width tables a sub-module fills from its module's constants: small ones (said in the notes)
        config, tiny, tabled = _small_tables(cls, config, tiny, filled_notes)
        switched.update(tabled)
    filled_notes += tiny.notes
    out = {"changes": {k: list(v) for k, v in tiny.changes.items()}, "config": tiny.config,
           "parameters": tiny.parameters, "error": tiny.error}
    if filled_notes:
        out["notes"] = list(filled_notes)
    if tiny.error:
        out["slots"] = []
        return out

    def synthesised(config: dict) -> dict:
        return synthesize_with(cls, config, job)

    out.update(synthesised(tiny.config))
    tried = []
    if job.get("fixture_from"):
        taken = _from_test_file(cls, job, out)
        if taken.get("ok"):
            out.update(taken["derived"], check={"ok": True, "masks": None}, source="test-file", tried=tried)
            out.pop("notes", None)  # the test's own config: nothing was filled in
            return out
        tried.append(f"test-file: {taken['why']}")
    if job.get("pipeline"):
        # the pipeline's own components (its VAE's latent channels, a conditioner, the encoders' layers it
        # joins) may be sized to the transformer's input widths: when the tiny widths do not fit them, the
        # widths scaled down together and then the real ones are tried (each derived only when reached)
        def tier(widths: str, base: dict, extra: dict):
            t = tiny_derive(cls, base, widths=widths)
            t.changes.update({k: (None, t.config[k]) for k in filled} | switched | extra)
            if t.error or t.config in seen:
                return None
            seen.append(t.config)
            return t, {**out, "config": t.config, "parameters": t.parameters,
                       "changes": {k: list(v) for k, v in t.changes.items()}, **synthesised(t.config)}

        seen = [tiny.config]
        pending, later, extra, notes = [("tiny", tiny, out)], list(WIDTHS[1:]), {}, list(filled_notes)
        failures: list[str] = []
        while pending or later:
            if pending:
                widths, t, static = pending.pop(0)
            else:
                widths = later.pop(0)
                made = tier(widths, config, extra)
                if made is None:
                    continue
                t, static = made
            captured = _from_pipeline(cls, job, t.config, static)
            if captured.get("ok"):
                if widths != "tiny":
                    captured["derived"]["notes"].append(_WIDTH_NOTES[widths])
                captured["derived"]["notes"][:0] = notes
                out.update(static, **captured["derived"], check={"ok": True, "masks": None}, source="pipeline",
                           tried=[*tried, *failures])
                return out
            label = "pipeline" if widths == "tiny" else f"pipeline, {widths} input widths"
            if not failures or captured["why"] not in failures[0]:
                failures.append(f"{label}: {captured['why']}")
            channels = captured.get("channels")
            conv = captured.get("at_conv")
            if channels and (not job["config"] or conv) and "in_channels" not in extra:
                # the class defaults' `in_channels` is not what the pipeline's own components make (a VAE's latent
                # channels, a condition concatenated to the latent): a real config agrees with them; take theirs.
                # What reaches the input convolution (after forward's own joins) is made of the tiny widths, a real
                # config's too (AceStep's context and latent, each `audio_acoustic_hidden_dim` wide): taken as well
                extra = {"in_channels": (config.get("in_channels"), channels)}
                config = {**config, "in_channels": channels}
                whose = "the class defaults'" if not job["config"] else "the config's"
                at = f" at the tiny widths ({conv})" if conv else ""
                notes.append(f"{whose} in_channels {extra['in_channels'][0]} is not the {channels} channels the "
                             f"pipeline's components make of the latent{at}: the tiny config takes theirs")
                made = tier(widths, config, extra)
                if made is not None:
                    pending.insert(0, (widths, *made))
                continue
            if not captured["sized"]:  # other widths would not help
                break
        tried += failures
    out.update(source="static", tried=tried)
    if not any(s.get("error") for s in out["slots"]):
        out["check"] = _check_static(cls, job, out)
        tried += out["check"].pop("tried", [])
        _kept_mode(out)
        passed, asked = dict(job.get("passed", {})), set()
        for _ in range(REPAIRS):  # first, an input the plain model's KeyError names: passed
            if out["check"]["ok"] or (step := _adjusted(cls, out, out["check"]["error"], asked)) is None:
                break
            name, note = step
            passed.setdefault(name, None)
            asked.add(name)
            redone = synthesize_with(cls, out["config"], {**job, "passed": passed})
            slots = [{**s, **(out["adjusted"].get(s["name"]) or {})} for s in redone["slots"]]
            out.update(redone, slots=slots)
            out.setdefault("notes", []).append(note)
            out["check"] = _check_static(cls, job, out)
            tried += out["check"].pop("tried", [])
            _kept_mode(out)
        out.pop("adjusted", None)
        # then the documented form of the inputs the failure names (one search, two kinds of step)
        if not out["check"]["ok"] and job.get("shapes"):
            steps = _repair(cls, job, out)
            if steps:
                out.setdefault("notes", []).extend(steps)
    return out


REPAIRS = 6  # runs of the plain tiny model the repair search may take, after the first


def _kept_mode(out: dict) -> None:
    """Where the static check's search kept another value the model's own code allows (a mode string), the
    fixture takes it, with its note."""
    if out["check"].get("slots"):
        out["slots"] = out["check"].pop("slots")
        out["notes"] = [*out.get("notes", []), *out["check"].pop("notes")]


def _repair(cls, job: dict, out: dict) -> list[str]:
    """The bounded repair search: while the plain tiny model fails on the static fixture, read the failure (the
    inputs its message names in backticks, and those the statement of the model's own source that raised it
    reads: the `if` test of a `raise`, the call that failed), swap in the documented form of each of those
    inputs (inputs.documented) with every input documented over a dim of the same name, and run again; at most
    REPAIRS runs, each swap kept only where that failure is gone (another one, or none, follows). Each step is a
    note, and each swapped input's comment in the fixture says the step and its evidence. Where the failure names
    no input with a documented form, every documented form is tried once together."""
    import dataclasses

    import torch
    from integrate.verify.inputs import Slot, Synthesis, documented

    shapes = job.get("shapes") or {}
    try:
        with torch.device("meta"):
            model = build(cls, out["config"])
        made = Synthesis([Slot(**s) for s in out["slots"]])
        alternatives = {k: dataclasses.asdict(s) for k, s in documented(
            model, model_config(model, out["config"]), shapes, job.get("described") or {}, made).items()}
    except Exception as exc:  # noqa: BLE001 - no candidates: the static failure stands, said as it is
        return [f"repair search: no documented form of the inputs could be made ({type(exc).__name__}: {exc})"]
    failure = out["check"]["error"]
    steps: list[str] = []
    tried: list[set[str]] = []
    tried_all = False
    for k in range(1, REPAIRS + 1):
        current = {s["name"]: s for s in out["slots"]}
        names, evidence = _blamed(cls, failure, list(current))
        todo = [n for n in names if n in alternatives and current[n]["expr"] != alternatives[n]["expr"]]
        linked = {d for n in todo for d in shapes.get(n, ()) if not d.isdigit() and "batch" not in d.lower()}
        todo += [n for n, dims in shapes.items() if n in alternatives and n not in todo and linked & set(dims)
                 and current[n]["expr"] != alternatives[n]["expr"]]
        if (not todo or set(todo) in tried) and not tried_all:
            tried_all = True
            todo = [n for n in alternatives if n in current and current[n]["expr"] != alternatives[n]["expr"]]
            evidence = ("the inputs it names have no documented form left to try: all of them" if evidence else
                        "the failure names no input with a documented form: all of them")
        if not todo or set(todo) in tried:
            break
        tried.append(set(todo))
        said = f"{failure['type']}: {failure['message']}"
        note = (f"repair step {k}: the plain tiny model failed ({said[:200]}; {evidence}): "
                + ", ".join(f"`{n}` taken {alternatives[n]['why']}" for n in todo))
        slots = [{**s, **alternatives[s["name"]], "why": f"repair step {k}: {alternatives[s['name']]['why']}"}
                 if s["name"] in todo else s for s in out["slots"]]
        trial = {**out, "slots": slots}
        again = plain_forward(cls, _module_from_text(_render_check(job, trial)))
        if again is not None and all(again.get(key) == failure.get(key) for key in ("type", "message", "model_at")):
            steps.append(note + " - the same failure again: not kept")
            continue
        steps.append(note + (" - the model ran" if again is None else " - kept: that failure is gone"))
        out["slots"] = slots
        if again is None:
            out["check"] = {"ok": True, "masks": None}
            return steps
        failure = out["check"]["error"] = again
    return steps


def _blamed(cls, failure: dict, inputs: list[str]) -> tuple[list[str], str]:
    """(the inputs a failure names, the evidence): backticked names in its message, then the names the statement
    of the model's own source it raised at reads (for a `raise` under an `if`, the test too), read with libcst."""
    import libcst as cst

    from integrate.resolve import Workspace
    from integrate.syntax import find_all

    parts = (failure.get("message") or "").split("`")
    names = [p for p in parts[1::2] if p in inputs]
    evidence = "its message names " + ", ".join(f"`{n}`" for n in names) if names else ""
    at = failure.get("model_at")
    if not at:
        return names, evidence
    file, _, line = at.rpartition(":")
    try:
        src = Workspace().load(Path(file))
    except Exception:  # noqa: BLE001 - a file libcst cannot read names nothing
        return names, evidence
    line_no = int(line)
    best = None
    for node in find_all(src.module, (cst.SimpleStatementLine, cst.If), skip_functions=False):
        first = src.line(node.test) if isinstance(node, cst.If) else src.line(node)
        last = src.last_line(node.test) if isinstance(node, cst.If) else src.last_line(node)
        if first <= line_no <= last and (best is None or last - first < best[1] - best[0]):
            best = (first, last, node)
    read: list[cst.CSTNode] = []
    guard = None
    if best is not None:
        read.append(best[2])
        # a `raise` in an `if`'s body: the innermost such `if`'s condition says what the forward refuses
        if find_all(best[2], cst.Raise):
            for test in find_all(src.module, cst.If, skip_functions=False):
                start, end = src.line(test), src.last_line(test)
                if start <= line_no <= end and (guard is None or end - start < guard[1] - guard[0]):
                    guard = (start, end, test)
        if guard is not None:
            read.append(guard[2].test)
            condition = " ".join(src.code(guard[2].test).split())
            evidence = "; ".join(filter(None, [evidence, f"{Path(file).name}:{guard[0]} raises where "
                                               f"`{condition[:160]}`"]))
    found = [n.value for node in read for n in find_all(node, cst.Name) if n.value in inputs]
    # a local the raise's condition reads that the same function sets from inputs (`sequence_length =
    # position_ids.shape[0]`)
    local = {n.value for n in find_all(guard[2].test, cst.Name)} - set(inputs) if guard is not None else set()
    fns = [f for f in find_all(src.module, cst.FunctionDef, skip_functions=False)
           if src.line(f) <= line_no <= src.last_line(f)]
    for assign in find_all(fns[-1], cst.Assign) if fns and local else ():
        if (src.line(assign) < line_no and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
                and assign.targets[0].target.value in local):
            found += [n.value for n in find_all(assign.value, cst.Name) if n.value in inputs]
    more = [n for n in dict.fromkeys(found) if n not in names]
    if more:
        evidence = "; ".join(filter(None, [evidence, f"{Path(file).name}:{line_no} reads " + ", ".join(
            f"`{n}`" for n in more)]))
    return names + more, evidence


def _switched_on(cls, config: dict, tiny, notes: list[str], rounds: int = 3):
    """(config, tiny, {key: (before, after)}) with the config switch set of each module forward calls outside
    any test and the tiny config leaves None (verify/switches.py); each set switch and each one no rule sets said
    in `notes`. A module switched on may call others: a few rounds."""
    import torch
    from integrate.verify.switches import switches

    said: set[str] = set()
    switched: dict = {}
    for _ in range(rounds):
        with torch.device("meta"):
            model = build(cls, tiny.config)
        found = [s for s in switches(model) if s.path not in said]
        said |= {s.path for s in found}
        notes += [s.why for s in found if s.param is None]
        wanted = {s.param: s for s in found if s.param is not None and config.get(s.param) != s.value}
        if not wanted:
            break
        given = {k: s.value for k, s in wanted.items()}
        more = {**switched, **{k: (config.get(k), v) for k, v in given.items()}}
        made = _rederived(cls, config, tiny, given, more)
        if isinstance(made, str):
            notes.append(f"switching on {', '.join(f'`{s.path}`' for s in wanted.values())} failed: {made}")
            break
        (config, tiny), switched = made, more
        notes += [s.why for s in wanted.values()]
    return config, tiny, switched


def _rederived(cls, config: dict, tiny, given: dict, changed: dict):
    """(config, tiny) derived again with `given` set over `config`: the earlier derivation's changes kept beside the
    new one's, and `changed` ({key: (before, after)}) recorded among them; the error where it fails."""
    from integrate.verify.tiny import derive as tiny_derive

    retry = tiny_derive(cls, {**config, **given})
    if retry.error:
        return retry.error
    retry.changes.update({k: v for k, v in tiny.changes.items() if k not in retry.changes} | changed)
    return {**config, **given}, retry


def _small_tables(cls, config: dict, tiny, notes: list[str]):
    """(config, tiny, {key: (before, after)}) with each None width table that a sub-module fills from a module-level
    constant given small (verify/tables.py), each said in `notes`; unchanged where the smaller tables fail."""
    from integrate.verify.tables import defaulted_tables

    tables = defaulted_tables(cls, tiny.config)
    if not tables:
        return config, tiny, {}
    given = {t.key: t.value for t in tables}
    changed = {k: (config.get(k), v) for k, v in given.items()}
    made = _rederived(cls, config, tiny, given, changed)
    if isinstance(made, str):
        notes.append(f"smaller {', '.join(f'`{k}`' for k in given)} failed: {made}")
        return config, tiny, {}
    notes += [t.why for t in tables]
    return *made, changed


def synthesize_with(cls, config: dict, job: dict) -> dict:
    """Static synthesis on the meta-built model, as `derive` records it."""
    import dataclasses

    import torch
    from integrate.verify.inputs import synthesize

    with torch.device("meta"):
        model = build(cls, config)
    syn = synthesize(model, model_config(model, config), dict(job.get("passed", {})), job.get("shapes") or {})
    return {"slots": [dataclasses.asdict(s) for s in syn.slots], "image_tokens": syn.image_tokens,
            "text_tokens": syn.text_tokens}


def _adjusted(cls, out: dict, failure: dict | None, asked: set[str]) -> tuple[str, str] | None:
    """One step of the search: (the input to pass, the note) where the plain model's error names it, else None.
    `KeyError: 'token_type'` naming a forward input the fixture left at its default (forward reads it from a
    dict it builds, not from its argument) passes it; raised in an `nn.Embedding`, it is token ids below that
    embedding's vocabulary, one per latent token (set in `out["adjusted"]`). Each input is asked for once."""
    import ast

    import torch

    if not failure or failure.get("type") != "KeyError":
        return None
    try:
        key = ast.literal_eval(failure.get("message") or "")
    except (ValueError, SyntaxError):
        return None
    slot = next((s for s in out["slots"] if s["name"] == key), None) if isinstance(key, str) else None
    if slot is None or slot.get("expr") is not None or key in asked:
        return None
    where = f" in `{failure['module']}`" if failure.get("module") else ""
    note = (f"the plain tiny model raised KeyError: {key!r}{where}: forward reads its optional `{key}` (left at its "
            "default) from where it keeps its inputs, so it is passed")
    module = None
    if failure.get("module"):
        with torch.device("meta"):
            try:
                module = build(cls, out["config"]).get_submodule(failure["module"])
            except AttributeError:
                module = None
    adjusted = out.setdefault("adjusted", {})
    if isinstance(module, torch.nn.Embedding):
        tokens = out.get("image_tokens") or 16
        adjusted[key] = {"expr": f"torch.randint(0, {module.num_embeddings}, (1, {tokens}), generator=_gen({key!r}))",
                         "why": f"token ids below the {module.num_embeddings} of `{failure['module']}` (an Embedding, "
                                f"where the plain model asked for it: KeyError {key!r}), one per latent token",
                         "error": None}
        note += f", as token ids for that Embedding ({module.num_embeddings} ids)"
    return key, note


_WIDTH_NOTES = {
    "scaled": "the input and conditioning widths are the real config's scaled down together: the pipeline's "
              "components are sized to their ratios",
    "real": "the input and conditioning widths are the real config's: the pipeline's components are sized to them"}


def _from_pipeline(cls, job: dict, config: dict, static: dict) -> dict:
    """{"ok": True, "derived": ...} when the pipeline's own calls, saved beside the fixture, make the plain
    tiny model run; else {"ok": False, "why": ...}.

    Where a stand-in text encoder makes the embeddings, its width is the transformer's text width, unless the
    pipeline joins several of the encoder's layers into one embedding: then a half, a third or a quarter of
    it is tried in turn, and the first the plain model runs on is kept (said in the notes)."""
    import torch
    from integrate.verify.capture import NotCaptured, capture, image_tokens, text_tokens

    path = Path(job["capture_path"])
    first = None
    for share in (1, 2, 3, 4):
        torch.manual_seed(0)
        model = build(cls, config).eval()
        randomize(model, 0)
        notes: list[str] = []
        try:
            calls, stood_in = capture(cls, model, job["pipeline"], config, static["slots"], job.get("steps", 1),
                                      notes, text_share=share, changes=static.get("changes"))
        except NotCaptured as exc:
            return {"ok": False, "why": first or str(exc), "sized": bool(first) or exc.sized}
        del model
        slots = [{"name": k, "expr": f"_saved(step, {k!r})", "why": "what the pipeline passed"} for k in calls[0]]
        derived = {"slots": slots, "image_tokens": image_tokens(calls[0], config),
                   "text_tokens": text_tokens(calls[0]), "notes": notes}
        # the prompt masks we pass are a tokenizer's (integers); a pipeline's own encoding may cast them (to bool,
        # or to the embeddings' dtype): where the model refuses integer masks, bool and then float are tried
        for dtype in (None, torch.bool, torch.float32):
            cast = calls if dtype is None else _masks_as(calls, dtype)
            if cast is None:
                break
            torch.save(cast, path)
            failure = plain_forward(cls, _module_from_text(_render_check(job, {**static, **derived}),
                                                           path.with_suffix(".py")))
            if failure is None:
                if dtype is not None:
                    notes.append("the model refuses the captured integer masks (ours are a tokenizer's): passed as "
                                 f"{str(dtype).removeprefix('torch.')}, as a pipeline's own prompt encoding may "
                                 "cast them")
                break
        latent = calls[0].get("hidden_states")
        if failure is not None and isinstance(latent, torch.Tensor) and latent.ndim in (4, 5) and isinstance(
                config.get("in_channels"), int) and latent.shape[1] != config["in_channels"]:
            path.unlink()
            return {"ok": False, "sized": True, "channels": int(latent.shape[1]),
                    "why": f"the pipeline made a latent of {latent.shape[1]} channels; the tiny model takes "
                           f"in_channels={config['in_channels']}: {failure['type']}: {failure['message']}"}
        made = _conv_channels(failure, config)
        if made is not None:  # a latent joined in forward with what the pipeline makes beside it (AceStep's context)
            path.unlink()
            return {"ok": False, "sized": True, "channels": made, "at_conv": failure["message"][:160],
                    "why": f"the tiny model's input convolution takes in_channels={config['in_channels']}; what the "
                           f"pipeline made reaches it with {made}: {failure['type']}: {failure['message']}"}
        if failure is None:
            if share > 1:
                notes.append(f"the stand-in text encoder is 1/{share} of the transformer's text width: the pipeline "
                             f"joins {share} of its layers")
            return {"ok": True, "derived": derived}
        path.unlink()
        at = f" (at {Path(failure['at']).name})" if failure.get("at") else ""
        first = first or (f"the plain tiny model does not run on the captured inputs: {failure['type']}: "
                          f"{failure['message']}{at}")
        if not stood_in:  # the embeddings' width is not a stand-in's to vary
            break
    return {"ok": False, "why": first, "sized": True}


def _conv_channels(failure: dict | None, config: dict) -> int | None:
    """The channels a convolution was handed, where it refused them for taking the config's `in_channels`
    (`expected input[1, 96, 1292] to have 192 channels, but got 96 channels instead`); else None."""
    import re

    found = re.search(r"to have (\d+) channels, but got (\d+) channels", (failure or {}).get("message", ""))
    if found is None or int(found.group(1)) != config.get("in_channels"):
        return None
    return int(found.group(2))


def _masks_as(calls: list[dict], dtype) -> list[dict] | None:
    """The calls with every integer tensor named `*mask*` cast to `dtype`; None when there is none."""
    import torch

    def cast(name, value):
        if "mask" in name and isinstance(value, torch.Tensor) and not value.is_floating_point() \
                and value.dtype != torch.bool:
            return value.to(dtype)
        return value

    out = [{k: cast(k, v) for k, v in call.items()} for call in calls]
    changed = any(out[i][k] is not v for i, call in enumerate(calls) for k, v in call.items())
    return out if changed else None


def _from_test_file(cls, job: dict, static: dict) -> dict:
    """{"ok": True, "derived": ...} when the test file's config and inputs (saved beside the fixture) make
    the plain model run; else {"ok": False, "why": ...}."""
    import inspect

    import torch
    from integrate.verify.capture import image_tokens, storable
    from integrate.verify.testfile import NotFromTestFile, load, steps_of

    try:
        config, changes, inputs = load(job["fixture_from"], cls)
        with torch.device("meta"):
            build(cls, config)
    except NotFromTestFile as exc:
        return {"ok": False, "why": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the model's constructor on the test's config
        return {"ok": False, "why": f"building {cls.__name__} from the test's config failed: {type(exc).__name__}: "
                                    f"{(str(exc).splitlines() or [''])[0][:200]}"}
    params = [p for p in inspect.signature(cls.forward).parameters if p != "self"]
    main = "hidden_states" if "hidden_states" in inputs else (params[0] if params else "")
    calls = steps_of(inputs, main, job.get("steps", 1))
    bad = [k for k, v in inputs.items() if not storable(v)]
    if bad:
        return {"ok": False, "why": f"the test's input `{bad[0]}` is not a tensor or a plain value"}
    path = Path(job["capture_path"])
    torch.save(calls, path)
    text_len = next((int(v.shape[1]) for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.ndim == 3
                     and k != main and any(w in k for w in ("encoder", "text", "context", "prompt"))), 0)
    slots = [{"name": k, "expr": f"_saved(step, {k!r})", "why": "the model test's dummy input"} for k in calls[0]]
    if "return_dict" in params and "return_dict" not in calls[0]:
        # as a pipeline calls the transformer (and as the static fixture does): cache-dit's split hook on the root
        # module raises on an output that is no tensor or tuple (a `Transformer2DModelOutput`)
        slots.append({"name": "return_dict", "expr": "False", "why": "the output as a tuple, as pipelines ask"})
    derived = {"config": config, "changes": changes, "parameters": None, "slots": slots,
               "image_tokens": image_tokens(calls[0], config), "text_tokens": text_len}
    failure = plain_forward(cls, _module_from_text(_render_check(job, {**static, **derived}), path.with_suffix(".py")))
    if failure is not None:
        path.unlink()
        return {"ok": False, "why": f"the plain model does not run on the test's config and inputs: "
                                    f"{failure['type']}: {failure['message']}"}
    with torch.device("meta"):
        derived["parameters"] = sum(p.numel() for p in build(cls, config).parameters())
    return {"ok": True, "derived": derived}


def _render_check(job: dict, derived: dict, masks: str | None = None) -> str:
    from integrate.verify.fixture import render, with_masks

    return render(transformer_class=job["transformer_class"], transformer_module=job["transformer_module"],
                  config=derived["config"], changes=derived["changes"], slots=with_masks(derived["slots"], masks),
                  image_tokens=derived.get("image_tokens"), text_tokens=derived.get("text_tokens", 0),
                  steps=job.get("steps", 1), config_source="check")


def _check_static(cls, job: dict, derived: dict) -> dict:
    """Run the plain tiny model once on the fixture as it would be written: {"ok": True, "masks": dtype} for the
    first mask dtype it accepts (as synthesised, then bool, then float32), else the first failure.

    A bounded search over what the model's own code allows: where a slot has alternatives (a mode string's other
    values, in the order forward lists them), each is tried in its place in turn, one slot at a time, when the
    fixture as synthesised does not run; the first the plain model runs on is kept, with a note that says which
    and what the model raised on the one before ("slots" and "notes" in the answer)."""
    slots = derived["slots"]
    variants: list[tuple[dict | None, str | None, list]] = [(None, None, slots)]
    for i, s in enumerate(slots):
        for alt in s.get("alternatives") or ():
            variants.append((s, alt, [*slots[:i], {**s, "expr": alt, "alternatives": []}, *slots[i + 1:]]))
    first, later = None, []
    for slot, alt, tried in variants:
        got = _check_masks(cls, job, {**derived, "slots": tried})
        if got["ok"]:
            if slot is not None:
                f = first or {}
                got.update(slots=tried, notes=[
                    f"`{slot['name']}`: {alt}, the next value the model's own code allows: the plain model does not "
                    f"run on {slot['expr']} ({f.get('type')}: {f.get('message')}{_where(f)})"])
            return got
        if first is None:
            first = got["error"]
            later += got["tried"]
        elif (got["error"]["type"], got["error"]["message"]) != (first["type"], first["message"]):
            later.append(f"static, `{slot['name']}` = {alt}: {got['error']['type']}: {got['error']['message']}"
                         f"{_where(got['error'])}")
    return {"ok": False, "error": first, "tried": later}


def _where(failure: dict) -> str:
    return f" at {Path(failure['at']).name}" if failure.get("at") else ""


def _check_masks(cls, job: dict, derived: dict) -> dict:
    """`_check_static` for the slots as they are: each mask dtype in turn."""
    has_masks = any((s.get("expr") or "").startswith("_mask(") for s in derived["slots"])
    first, later = None, []
    for dtype in (None, "bool", "float32") if has_masks else (None,):
        failure = plain_forward(cls, _module_from_text(_render_check(job, derived, dtype)))
        if failure is None:
            return {"ok": True, "masks": dtype}
        if first is None:
            first = failure
        elif (failure["type"], failure["message"]) != (first["type"], first["message"]):
            # a cast mask got further: what stops it there is the next thing to fix by hand
            later.append(f"static, masks as {dtype}: {failure['type']}: {failure['message']}")
    return {"ok": False, "error": first, "tried": later}


def _module_from_text(text: str, path: Path | None = None):
    import types

    module = types.ModuleType("integrate_verify_fixture")
    module.__file__ = str(path) if path else "verify_fixture.py"
    exec(compile(text, "verify_fixture.py", "exec"), module.__dict__)  # noqa: S102 - our own rendered fixture
    return module


def plain_forward(cls, fx) -> dict | None:
    """The plain tiny model (seeded random weights) run once on step 0 of the fixture: None when it runs
    and its output is finite, else what went wrong and in which module."""
    import torch

    torch.manual_seed(fx.SEED)
    recorder = None
    try:
        model = build(cls, fx.CONFIG).eval()
        randomize(model, fx.SEED)
        recorder = Recorder({id(m): n for n, m in model.named_modules()})
        recorder.attach(model)
        with torch.no_grad():
            result = model(**fx.inputs(0))
        outs = tensors(result)
        if not outs:
            return {"type": "NoOutput", "message": "the forward returned no tensor", "module": None}
        if not all(torch.isfinite(plain(t)).all() for t in outs[:1]):
            return {"type": "NonFinite", "message": "the output holds NaN or inf", "module": None}
        return None
    except Exception as exc:  # the model's own code rejected the fixture: say where
        frames = traceback.extract_tb(exc.__traceback__)
        frame = frames[-1]
        own = _own_files(cls)  # the innermost frame in the model's own source: what the repair search reads
        mine = next((f for f in reversed(frames) if os.path.realpath(f.filename) in own), None)
        return {"type": type(exc).__name__, "message": (str(exc).splitlines() or [""])[0][:300],
                "module": recorder.stack[-1] if recorder and recorder.stack else None,
                "after": recorder.last if recorder else None, "at": f"{frame.filename}:{frame.lineno}",
                **({"model_at": f"{mine.filename}:{mine.lineno}"} if mine else {})}
    finally:
        for h in recorder.handles if recorder else ():
            h.remove()


def _own_files(cls) -> set[str]:
    """The source file of the model's class (its own module)."""
    import inspect

    try:
        return {os.path.realpath(inspect.getsourcefile(cls) or "")}
    except TypeError:
        return set()


# ---- full size -----------------------------------------------------------------------------------------


def full_size(job: dict) -> dict:
    """The real config on the meta device: each cached list's length, each named head count, and cache-dit's
    default Fn / Bn compute blocks."""
    import torch
    from integrate.verify.tiny import object_defaults

    try:
        from cache_dit.caching.cache_contexts.cache_config import BasicCacheConfig

        defaults = BasicCacheConfig()
        fn, bn = int(defaults.Fn_compute_blocks), int(defaults.Bn_compute_blocks)
    except Exception as exc:  # noqa: BLE001 - an older or newer cache-dit without this class
        return {"error": f"cache-dit's default cache config was not found: {type(exc).__name__}: {exc}"}
    cls = _load_class(job["transformer_module"], job["transformer_class"])
    config = job["config"] or object_defaults(cls)
    try:
        with torch.device("meta"):
            model = build(cls, config)
    except Exception as exc:  # noqa: BLE001 - the model's constructor on its own config
        return {"error": f"building {cls.__name__} from its config on the meta device failed: "
                         f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"}

    def find(path: str):
        obj = model
        for part in path.split("."):
            obj = obj[int(part)] if part.isdigit() and hasattr(obj, "__getitem__") else getattr(obj, part, None)
            if obj is None:
                return None
        return obj

    lists = {}
    for attr in job["lists"]:
        found = find(attr)
        lists[attr] = len(found) if isinstance(found, torch.nn.ModuleList) else None
    heads = []
    for h in job["heads"]:
        value = find(f"{h['block_list']}.0.{h['module']}.{h['attr']}")
        heads.append({**h, "value": value if isinstance(value, int) and not isinstance(value, bool) else None})
    return {"fn": fn, "bn": bn, "lists": lists, "heads": heads}


# ---- run -----------------------------------------------------------------------------------------------


class Recorder:
    """Forward hooks on the original modules, under their original paths: the first output of each
    module in the recorded call, the shapes of its tensor inputs (by parameter name), the order modules finished
    in, and the module an exception left."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names, self.stack, self.order = names, [], []
        self.last: str | None = None  # the module that finished last
        self.acts: dict[str, object] = {}
        self.inputs: dict[str, dict[str, list[int]]] = {}
        self.outputs: dict[str, list[list[int] | None]] = {}
        self.active = False
        self.handles = []

    def attach(self, model) -> None:
        for module in model.modules():
            path = self.names.get(id(module))
            if path is None or path == "":
                continue
            self.handles.append(module.register_forward_pre_hook(self._pre(path), with_kwargs=True))
            self.handles.append(module.register_forward_hook(self._post(path)))

    def _pre(self, path):
        def hook(module, args, kwargs):
            self.stack.append(path)
            if self.active and path not in self.inputs:
                self.inputs[path] = _input_shapes(module, args, kwargs)
        return hook

    def _post(self, path):
        def hook(module, args, output):
            if self.stack and self.stack[-1] == path:
                self.stack.pop()
            self.last = path
            if self.active and path not in self.outputs:
                self.outputs[path] = _output_shapes(output)
            if self.active and path not in self.acts:
                ts = tensors(output)
                if ts:
                    self.order.append(path)
                    self.acts[path] = [plain(t).numpy() for t in ts]
        return hook


def _input_shapes(module, args, kwargs) -> dict[str, list[int]]:
    """{parameter name (its position where the signature does not bind): shape} of a call's tensor inputs."""
    import inspect

    import torch

    signature = None
    try:  # the class's own forward: an instance's may be a wrapper taking (*args, **kwargs)
        signature = inspect.signature(type(module).forward)
        bound = dict(signature.bind_partial(module, *args, **kwargs).arguments)
        bound.pop(next(iter(signature.parameters)), None)  # self
    except (TypeError, ValueError, StopIteration):
        bound = {**{str(i): a for i, a in enumerate(args)}, **kwargs}
    for name, value in list(bound.items()):  # what a `**kwargs` parameter gathered, by its own names
        if isinstance(value, dict) and signature is not None and signature.parameters.get(name) is not None \
                and signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            bound.update(bound.pop(name))
    return {name: list(value.shape) for name, value in bound.items() if isinstance(value, torch.Tensor)}


def _output_shapes(output) -> list[list[int] | None]:
    """The shape of each element a call returned, by its index as a hook sees it (a lone tensor is element 0;
    null for an element that is no tensor); empty for any other kind of output (a dataclass, a dict)."""
    import torch

    if isinstance(output, torch.Tensor):
        return [list(output.shape)]
    if isinstance(output, (tuple, list)):
        return [list(v.shape) if isinstance(v, torch.Tensor) else None for v in output]
    return []


class _SkippedSplits:
    """cache-dit's (and diffusers') warning that a planned split met a tensor of another rank and did nothing
    ("split will be skipped"), caught per variant with the module that was running: a silent no-op of the
    plan made visible. Their once-per-process memory is cleared so each variant reports its own."""

    LOGGERS = ("cache_dit.distributed.core._context_parallel", "diffusers.hooks.context_parallel")

    def __init__(self, recorder: Recorder) -> None:
        import logging

        self.recorder, self.seen = recorder, []
        try:
            from cache_dit import logger as cache_dit_logger

            getattr(cache_dit_logger, "_warning_once_messages", set()).clear()
        except ImportError:
            pass
        outer = self

        class _Handler(logging.Handler):
            def emit(self, record):
                message = record.getMessage()
                if "split will be skipped" in message:
                    where = outer.recorder.stack[-1] if outer.recorder.stack else "forward's inputs"
                    outer.seen.append(f"{where}: {message}")

        self.handler = _Handler(level=logging.WARNING)
        self.levels = {}
        for name in self.LOGGERS:  # the worker quiets both to errors; their own handlers stay at that level
            log = logging.getLogger(name)
            self.levels[name] = log.level
            log.setLevel(min(log.level or logging.WARNING, logging.WARNING))
            log.addHandler(self.handler)

    def close(self) -> None:
        import logging

        for name in self.LOGGERS:
            log = logging.getLogger(name)
            log.removeHandler(self.handler)
            log.setLevel(self.levels[name])


def _signature(model) -> dict:
    return {k: [list(v.shape), str(v.dtype)] for k, v in model.state_dict().items()}


def _pattern_hooks(adapter) -> tuple[list, list]:
    """Hooks on the first block of every list the adapter wraps: what goes in and what comes out."""
    seen: list[dict] = []
    handles = []
    blocks = adapter.blocks if isinstance(adapter.blocks, list) else [adapter.blocks]
    patterns = adapter.forward_pattern if isinstance(adapter.forward_pattern, list) else [adapter.forward_pattern]
    for i, (blist, pattern) in enumerate(zip(blocks, patterns)):
        if not len(blist):
            continue
        rec = {"list": i, "pattern": pattern.name, "in": None, "out": None}
        seen.append(rec)

        def pre(module, args, kwargs, rec=rec):
            if rec["in"] is None:
                h = args[0] if args else kwargs.get("hidden_states")
                e = args[1] if len(args) > 1 else kwargs.get("encoder_hidden_states")
                rec["in"] = [list(h.shape) if h is not None else None,
                             list(e.shape) if hasattr(e, "shape") else None]

        def post(module, args, kwargs, output, rec=rec):
            if rec["out"] is None:
                outs = output if isinstance(output, (tuple, list)) else (output,)
                rec["out"] = [list(o.shape) if hasattr(o, "shape") else None for o in outs]

        handles.append(blist[0].register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(blist[0].register_forward_hook(post, with_kwargs=True))
    return seen, handles


def _cpu_mesh() -> None:
    """cache-dit builds the TP mesh on `torch.accelerator`'s device, None on a CPU-only machine. A hybrid (CP and TP
    together) takes the TP mesh cache-dit cut from its (ring, ulysses, tp) mesh, built on
    `torch._C._get_accelerator()`: the CPU here, so gloo runs it as it is."""
    import torch
    from cache_dit.distributed.transformers.register import TensorParallelismPlanner
    from torch.distributed.device_mesh import init_device_mesh

    if torch.accelerator.current_accelerator() is not None:
        return
    original = TensorParallelismPlanner.mesh

    def mesh(self, parallelism_config, **kwargs):
        if parallelism_config.hybrid_enabled():
            return original(self, parallelism_config, **kwargs)
        return init_device_mesh(device_type="cpu", mesh_shape=[parallelism_config.tp_size])

    TensorParallelismPlanner.mesh = mesh


def _cache_config(threshold: float, steps: int, warmup: int, bn: int = 0):
    from cache_dit import DBCacheConfig

    return DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=bn, residual_diff_threshold=threshold,
                         max_warmup_steps=warmup, warmup_interval=1, max_cached_steps=-1,
                         max_continuous_cached_steps=-1, num_inference_steps=steps)


def _stats(model) -> dict:
    import cache_dit

    cached, diffs = [], []
    for s in cache_dit.summary(model, details=False, logging=False) or []:
        cached += list(s.cached_steps or []) + list(s.cfg_cached_steps or [])
        diffs += [float(v) for v in (s.residual_diffs or {}).values()]
        diffs += [float(v) for v in (s.cfg_residual_diffs or {}).values()]
    return {"cached_steps": sorted(set(cached)), "residual_diffs": diffs,
            "finite": all(math.isfinite(d) for d in diffs)}


def run(job: dict) -> dict:
    import numpy as np
    import torch
    from integrate.verify.fixture import load

    torch.set_num_threads(1)
    fx = load(Path(job["fixture"]))
    cls = _load_class(fx.TRANSFORMER_MODULE, fx.TRANSFORMER_CLASS)
    out_dir = Path(job["out"])
    rank = int(os.environ.get("RANK", "0"))
    report: dict = {"rank": rank, "variants": {}}
    if job.get("plugin"):
        sys.path.insert(0, job["plugin"]["path"])
    kind = job["kind"]
    if kind == "parallel":
        from datetime import timedelta

        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=timedelta(seconds=job.get("timeout", 120)))
        _uneven_all_gather(dist)
    arrays: dict[str, np.ndarray] = {}
    for variant in job["variants"]:
        key = variant["name"]
        rec = report["variants"][key] = {}
        torch.manual_seed(fx.SEED)
        # a proof whose variants need another tiny config (hybrid: more heads) names the keys it changes, and its
        # own 1-process baseline is run on the same
        model = build(cls, {**fx.CONFIG, **variant.get("config", {})}).eval()
        randomize(model, fx.SEED)
        names = {id(m): n for n, m in model.named_modules()}
        recorder = Recorder(names)
        skipped = _SkippedSplits(recorder) if kind == "parallel" else None
        engaged = Engagement(names) if kind == "parallel" else None
        calls = 1
        stage = "import the plugin"
        try:
            if kind == "baseline":
                rec["state_dict"] = _signature(model)
            if job.get("plugin"):
                plugin = importlib.import_module(job["plugin"]["import_name"])
                _Plugin.read(plugin)
                rec["state_dict_import"] = _signature(model)
            stage = "set up the integration"
            if kind == "cache":
                calls = _setup_cache(model, rec, fx, recorder, arrays, key)
            elif kind == "parallel":
                with engaged.setup(model, tp=bool(variant.get("tp"))):
                    _setup_parallel(model, variant, fx)
            recorder.attach(model)
            stage = "run the model"
            outs = []
            with torch.no_grad():
                for step in range(fx.STEPS):
                    for c in range(calls):
                        recorder.active = step == 0 and c == 0
                        result = model(**fx.inputs(step))
                        recorder.active = False
                        outs.append(plain(tensors(result)[0]).numpy())
            arrays[f"{key}/out"] = np.stack(outs)
            rec["calls_per_step"] = calls
            if kind == "cache":
                stage = "run with caching on"
                arrays[f"{key}/cached"], rec["stats"] = _cached(model, fx, calls, job["threshold"])
        except Exception as exc:  # located, reported, never a crash of verify
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            rec["error"] = {"stage": stage, "module": recorder.stack[-1] if recorder.stack else None,
                            "after": recorder.last, "at": f"{frame.filename}:{frame.lineno}",
                            "type": type(exc).__name__, "message": str(exc).splitlines()[0][:300] if str(exc) else "",
                            "trace": traceback.format_exc().splitlines()[-6:]}
        rec["order"] = recorder.order
        rec["input_shapes"] = recorder.inputs
        rec["output_shapes"] = recorder.outputs
        if engaged is not None:
            rec["engaged"] = engaged.report()
        if skipped is not None:
            skipped.close()
            if skipped.seen:
                rec["skipped_splits"] = list(dict.fromkeys(skipped.seen))
        for path, ts in recorder.acts.items():
            for i, t in enumerate(ts):
                arrays[f"{key}/act/{path}#{i}"] = t
        for h in recorder.handles:
            h.remove()
        if "error" in rec and kind == "parallel":
            break  # the other rank may be waiting in a collective: no later variant can line up
    np.savez(out_dir / f"rank{rank}.npz", **arrays)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))
    if kind == "parallel":
        # every collective is done and the files are written: wait for the peer, then leave without
        # tearing the process groups down one by one (that can wait on groups the meshes created)
        import torch.distributed as dist

        if not any("error" in r for r in report["variants"].values()):
            dist.barrier()
        sys.stderr.flush()
        os._exit(0)
    return report


def _uneven_all_gather(dist) -> None:
    """`all_gather` into outputs of different sizes, which gloo refuses and NCCL accepts: cache-dit's
    Ulysses-anything gathers one shard per rank, of the rank's own length. Each rank's shard is padded to
    the largest output, gathered evenly, and each output keeps its own leading slice, so every rank ends
    with exactly the tensors NCCL would give it. Even gathers go straight through."""
    even = dist.all_gather

    def all_gather(tensor_list, tensor, group=None, async_op=False):
        shapes = {tuple(t.shape) for t in tensor_list} | {tuple(tensor.shape)}
        if len(shapes) == 1 or async_op:
            return even(tensor_list, tensor, group=group, async_op=async_op)
        big = [max(s[d] for s in shapes) for d in range(tensor.dim())]
        padded = tensor.new_zeros(big)
        padded[tuple(slice(0, n) for n in tensor.shape)] = tensor
        slots = [tensor.new_empty(big) for _ in tensor_list]
        even(slots, padded.contiguous(), group=group)
        for out, got in zip(tensor_list, slots):
            out.copy_(got[tuple(slice(0, n) for n in out.shape)])
        return None

    dist.all_gather = all_gather  # the module attribute cache-dit's `dist.all_gather(...)` looks up


class _Plugin:
    """What this worker hands cache-dit itself, read from the imported plugin: what it could not register through
    cache-dit's public API (a transformer-only adapter for a model no diffusers pipeline runs; an adapter or planner
    whose name a registration of cache-dit's answers first; a CP planner for a plain torch module). None where the
    plugin registers it (or defers to cache-dit's own)."""

    adapter = None
    cp_planner = None
    tp_planner = None

    @classmethod
    def read(cls, plugin) -> None:
        cls.adapter = None
        if getattr(plugin, "ADAPTER_REGISTERED", True) is False and getattr(plugin, "ADAPTER", None) is not None:
            fn = plugin.ADAPTER
            if getattr(plugin, "ADAPTER_TRANSFORMER_ONLY", False):
                cls.adapter = fn
            else:  # a pipeline's adapter, given the transformer in cache-dit's stand-in pipeline
                from cache_dit.caching import FakeDiffusionPipeline

                cls.adapter = lambda model: fn(FakeDiffusionPipeline(model))
        cls.cp_planner = plugin.CP_PLANNER if getattr(plugin, "CP_PLANNER_REGISTERED", True) is False else None
        cls.tp_planner = plugin.TP_PLANNER if getattr(plugin, "TP_PLANNER_REGISTERED", True) is False else None


def _adapter_for(model):
    """The plugin's transformer-only adapter applied to `model`, else the one cache-dit's registry looks up."""
    from cache_dit.caching.block_adapters.block_registers import BlockAdapterRegister

    if _Plugin.adapter is not None:
        return _Plugin.adapter(model)
    adapter = BlockAdapterRegister.get_adapter(model)
    if adapter is None:
        raise LookupError(f"no BlockAdapter is registered for {type(model).__name__}")
    return adapter


def _setup_cache(model, rec: dict, fx, recorder, arrays, key) -> int:
    """The adapter (and its PatchFunctor) applied, block contracts observed on a plain forward, then
    caching enabled with a threshold of 0 (nothing cached). Returns the calls per step (2 with CFG)."""
    import cache_dit
    import numpy as np
    import torch

    adapter = _adapter_for(model)
    rec["state_dict_patched"] = _signature(model)
    rec["has_separate_cfg"] = bool(adapter.has_separate_cfg)
    rec["per_block"] = _PerBlockSpy(_lists(adapter)).record  # filled in as the hooks fire, in every run below
    seen, handles = _pattern_hooks(adapter)
    views = []  # does a cached list's last block return a tensor that is not contiguous (a transposed view)?
    handles += [blocks[-1].register_forward_hook(
        lambda module, args, out: views.append(any(not o.is_contiguous() for o in tensors(out))))
        for blocks in _lists(adapter) if len(blocks)]
    outs = []
    with torch.no_grad():
        for step in range(fx.STEPS):
            outs.append(plain(tensors(model(**fx.inputs(step)))[0]).numpy())
    for h in handles:
        h.remove()
    arrays[f"{key}/patched"] = np.stack(outs)
    if any(views):  # else making them contiguous changes nothing: the run would repeat the one above
        arrays[f"{key}/contiguous"] = _contiguous_run(model, adapter, fx)
    rec["patterns"] = seen
    rec["block_counts"] = [len(b) for b in _lists(adapter)]
    calls = 2 if adapter.has_separate_cfg else 1
    # a transformer-only adapter is handed over as it is (no registry has it); else cache-dit looks it up
    target = _adapter_for(model) if _Plugin.adapter is not None else model
    cache_dit.enable_cache(target, cache_config=_cache_config(0.0, fx.STEPS, fx.STEPS))
    return calls


class _PerBlockSpy:
    """The PatchFunctor's per-block pre-hooks (a keyword that differs per block, computed again from each block's
    index), watched: how many there are, how often they ran, and which keywords reached the blocks of one list with
    more than one value. A hook that never ran, or keywords every block got alike, proves nothing of the fix."""

    def __init__(self, lists: list) -> None:
        import functools

        self.record: dict = {"hooks": 0, "fired": 0, "varying": []}
        self.values: dict[tuple[int, str], set] = {}
        for li, blocks in enumerate(lists):
            for bi, block in enumerate(blocks):
                for hid, hook in list(block._forward_pre_hooks.items()):
                    if isinstance(hook, functools.partial) and \
                            getattr(hook.func, "__module__", "").rpartition(".")[2] == "patch_functor":
                        block._forward_pre_hooks[hid] = self._spy(hook, li)
                        self.record["hooks"] += 1

    def _spy(self, hook, li: int):
        def spy(module, args, kwargs):
            result = hook(module, args, kwargs)
            self.record["fired"] += 1
            given = result[1] if isinstance(result, tuple) and len(result) == 2 else kwargs
            for key, value in given.items():
                self.values.setdefault((li, key), set()).add(_digest(value))
            self.record["varying"] = sorted({f"{i}:{k}" for (i, k), seen in self.values.items() if len(seen) > 1})
            return result
        return spy


def _digest(value) -> str:
    """A value, told apart from another: a tensor by its shape, dtype and bytes, anything else by its repr."""
    import zlib

    import torch

    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        return f"{tuple(data.shape)}{data.dtype}{zlib.crc32(data.view(-1).view(torch.uint8).numpy().tobytes())}"
    return repr(value)[:200]


def _lists(adapter) -> list:
    """The block lists a BlockAdapter caches."""
    return adapter.blocks if isinstance(adapter.blocks, list) else [adapter.blocks]


def _contiguous_run(model, adapter, fx):
    """The plain (patched) model once more, with the output of each cached list's last block made contiguous, as
    cache-dit's wrapper returns it: a block that returns a transposed view then leads the modules after the list
    down another summation order, a difference of float rounding that is cache-dit's copy, not the integration's."""
    import numpy as np
    import torch

    def contiguous(module, args, out):
        if torch.is_tensor(out):
            return out.contiguous()
        if isinstance(out, tuple):
            return tuple(o.contiguous() if torch.is_tensor(o) else o for o in out)
        return out

    handles = [blocks[-1].register_forward_hook(contiguous) for blocks in _lists(adapter) if len(blocks)]
    outs = []
    try:
        with torch.no_grad():
            for step in range(fx.STEPS):
                outs.append(plain(tensors(model(**fx.inputs(step)))[0]).numpy())
    finally:
        for h in handles:
            h.remove()
    return np.stack(outs)


def _cached(model, fx, calls: int, threshold: float):
    """Caching on: the permissive threshold after one warm-up step; the outputs and cache-dit's stats."""
    import cache_dit
    import numpy as np
    import torch

    cache_dit.refresh_context(model, cache_config=_cache_config(threshold, fx.STEPS, 1))
    outs = []
    with torch.no_grad():
        for step in range(fx.STEPS):
            for _ in range(calls):
                outs.append(plain(tensors(model(**fx.inputs(step)))[0]).numpy())
    return np.stack(outs), _stats(model)


def _setup_parallel(model, variant: dict, fx) -> None:
    import cache_dit
    from cache_dit import ParallelismConfig

    cfg = {}
    if variant.get("ulysses"):
        cfg["ulysses_size"] = variant["ulysses"]
    if variant.get("ring"):
        cfg["ring_size"] = variant["ring"]
    if variant.get("tp"):
        cfg["tp_size"] = variant["tp"]
        _cpu_mesh()
    if variant.get("anything"):
        cfg["ulysses_anything"] = True
    pc = ParallelismConfig(**cfg)
    if _Plugin.cp_planner is not None and (variant.get("ulysses") or variant.get("ring")):  # as the plugin says to
        pc.cp_plan = _Plugin.cp_planner().apply(transformer=model, parallelism_config=pc)
    with _tp_handed(_Plugin.tp_planner if variant.get("tp") else None):
        if variant.get("cache"):
            # through the adapter: cache-dit's transformer-only path cannot add parallelism after caching
            adapter = _adapter_for(model)
            # `bn`: the plan's `cache_bn_min` (a gather on a cached list's last block keeps that block among the last)
            config = _cache_config(0.0, fx.STEPS, fx.STEPS, variant.get("bn", 0))
            cache_dit.enable_cache(adapter, cache_config=config, parallelism_config=pc)
        else:
            cache_dit.enable_cache(model, parallelism_config=pc)


@contextmanager
def _tp_handed(planner):
    """cache-dit's TP takes a planner from its registry only: where the plugin could not register its own (a name
    cache-dit registered answers first), the proof hands it over by answering the lookup with it for the setup's
    length (this harness only; the plugin itself never touches the registry). The lookup is recorded as handed."""
    if planner is None:
        yield
        return
    from cache_dit.distributed.transformers.register import TensorParallelismPlannerRegister as register

    original = vars(register)["get_planner"]

    def handed(cls, transformer, *args, **kwargs):
        e = Engagement.current
        if e is not None:
            e.planners.append({"kind": "tp", "asked": transformer if isinstance(transformer, str) else
                               type(transformer).__name__, "found": True, "handed": True,
                               "planner": f"{planner.__module__}.{planner.__qualname__}"})
        return planner

    register.get_planner = classmethod(handed)
    try:
        yield
    finally:
        register.get_planner = original


def main() -> None:
    job = json.loads(sys.stdin.read())
    try:
        result = _dispatch(job)
    except _Missing as exc:
        _REAL.write(json.dumps({"missing": exc.details}))
        _REAL.flush()
        sys.exit(1)
    _REAL.write(json.dumps(result))
    _REAL.flush()


def _dispatch(job: dict) -> dict:
    if job.get("src"):
        sys.path.insert(0, job["src"])
    mode = job["mode"]
    if mode == "derive":
        result = derive(job)
    elif mode == "full_size":
        result = full_size(job)
    elif mode == "check":  # a fixture file as it stands (a person's edit): does the plain model run on it?
        from integrate.verify.fixture import load

        fx = load(Path(job["fixture"]))
        result = {"error": plain_forward(_load_class(fx.TRANSFORMER_MODULE, fx.TRANSFORMER_CLASS), fx)}
    elif mode == "component":  # a text encoder's or a VAE's proof (verify/components/): it reports through its files
        if job["proof"] not in ("tep", "vaep"):  # the modules of verify/components/
            raise ValueError(f"no component proof {job['proof']!r}")
        importlib.import_module(f"integrate.verify.components.{job['proof']}").run(job)
        result = {"ok": True}
    else:
        result = {"ok": bool(run(job))}  # a run reports through its files
    return result


if __name__ == "__main__":
    main()
