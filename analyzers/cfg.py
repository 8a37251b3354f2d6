"""CFG style of the denoising loop: separate cond/uncond transformer calls, or one batched call.

Counts transformer calls along one path through a step of the loop. A branch is followed
when its condition is known from the entry's numeric defaults (FluxPipeline's second call
runs only when `true_cfg_scale > 1`, and the default is 1.0, so the uncond call is off by
default); prompts and other inputs that default to None stay unknown, never assumed.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from integrate.records import Evidence
from integrate.resolve import Workspace
from integrate.source import SourceFile, dotted, find_method, iter_methods
from integrate.syntax import body_of, find_all, self_attr

from .cfg_callers import passed_callable
from .cfg_env import MODEL_WORDS, Env, Func, assigned_self, called_env, callee_of, env_of, helpers_of, is_model, \
    value_of
from .records import PipelineFacts

HELPER_DEPTH = 3  # functions followed from the step loop to the model call (sampler -> step -> model-mean -> model)
ENTRY_DEPTH = 3  # functions followed from the entry to the one holding the step loop (`__call__` -> `processing`)


def analyze_pipeline(ws: Workspace, src: SourceFile, cls_name: str | None, entry: str,
                     transformer: tuple[SourceFile, cst.ClassDef] | None = None) -> PipelineFacts:
    """`transformer`: the transformer's source and class, to read a guidance step that is one of its methods
    (`model.forward_with_cfg(...)`)."""
    path = str(src.path)
    cls = src.classes.get(cls_name) if cls_name else None
    fn = find_method(cls, entry) if cls is not None else src.functions.get(entry)
    if fn is None:
        return PipelineFacts(cls_name, entry, path, None, "unknown", None,
                             (Evidence(path, 0, f"entry `{entry}` not defined here (inherited?): CFG style unknown"),))
    if transformer is not None and cls is transformer[1] and entry not in ("forward", "__call__"):
        # the transformer's own guidance method given as the entry (Lumina's `NextDiT.forward_with_cfg`, which a
        # sampler calls once per step): decided from its body, as when a loop calls it
        return _guidance_read(src, cls_name, entry, fn, transformer,
                              [Evidence(path, src.line(fn), f"`{cls_name}.{entry}` is the transformer's own method, "
                                                            "called once per step")])
    env, aliases = env_of(src, cls, fn)
    env.helpers = helpers_of(src, cls, fn)
    methods = {m.name.value: m for m in iter_methods(transformer[1])} if transformer is not None else {}
    stepped = [lp for lp in find_all(fn.body, cst.For) if _method_calls(lp.body, aliases, methods)]
    if stepped and not any(_reaches_model(lp.body, env, aliases) for lp in find_all(fn.body, cst.For)):
        return _guidance_method(src, cls_name, entry, stepped[0], aliases, methods, transformer)
    loops = [lp for lp in find_all(fn.body, cst.For) if _reaches_model(lp.body, env, aliases)]
    via: list[Evidence] = []
    if not loops:  # the entry hands the steps to a function of its own (`self.processing(...)`): read that one
        env.ws = ws  # followed into the repository's other modules from here on
        held = _step_holder(fn, env, aliases)
        if held is None:
            return _passed(ws, src, cls_name, entry, fn) or PipelineFacts(
                cls_name, entry, path, None, "unknown", 0, (_no_model_call(src, fn, entry),))
        fn, env, aliases, via = held
        loops = [lp for lp in find_all(fn.body, cst.For) if _reaches_model(lp.body, env, aliases)]
    # the step loop: the outermost loop over the schedule (`for i, t in enumerate(timesteps)`), else the outermost
    # loop that calls the transformer (find_all yields parents first). A loop around the step loop (AnyFlowFAR's
    # chunks of frames) is not a loop over guidance conditions.
    stepping = [lp for lp in loops if _over_schedule(lp.iter)]
    facts = _step_facts(env.src, cls_name, entry, fn, (stepping or loops)[0], env, aliases, transformer)
    if not via:
        return facts
    # read through another module of the repository: one step of inference more than a loop in the entry's file
    confidence = "medium" if env.src is not src and facts.confidence == "high" else facts.confidence
    return dataclasses.replace(facts, file=path, confidence=confidence, evidence=(*via, *facts.evidence))


def _step_holder(fn: cst.FunctionDef, env: Env, aliases: set[str]):
    """The function `fn` calls, through at most ENTRY_DEPTH functions of the repository (`cfg_env.callee_of`:
    methods, the module's functions, nested defs, functions imported from its other modules, the method of a class
    the call constructs; breadth first, each once), whose loop over the schedule calls the model: (that function,
    its env with the values the calls pass, its model aliases, the calls followed as evidence); None when there is
    none."""
    todo = [(fn, env, aliases, [])]
    seen = {id(fn)}
    for _ in range(ENTRY_DEPTH):
        later = []
        for caller, c_env, c_aliases, via in todo:
            for call in find_all(caller.body, cst.Call):
                found = callee_of(call, c_env)
                if found is None or id(found[2]) in seen:
                    continue
                h_src, h_cls, helper, instance = found
                seen.add(id(helper))
                own = {**c_env.known, **assigned_self(c_env.src, caller, c_env)} if instance is None else instance
                h_env, h_aliases = called_env(h_src, h_cls, helper, c_env, c_aliases, call, own)
                made = call.func.value if isinstance(call.func, cst.Attribute) else None
                name = dotted(call.func) or (f"{dotted(made.func)}(...).{call.func.attr.value}"
                                             if isinstance(made, cst.Call) else _code(c_env.src, call.func))
                here = [*via, Evidence(str(c_env.src.path), c_env.src.line(call),
                                       f"`{caller.name.value}` calls `{name}(...)`")]
                if any(_over_schedule(lp.iter) and _reaches_model(lp.body, h_env, h_aliases)
                       for lp in find_all(helper.body, cst.For)):
                    values = ", ".join(f"`self.{a}` = {_shown(v)}" for a, v in sorted(h_env.known.items()))[:240]
                    said = f" and the `self.<x>` it holds ({values})" if values else ""
                    here[-1] = Evidence(here[-1].file, here[-1].line, f"{here[-1].why}, whose loop runs the steps; "
                                                                      f"read with the values this call passes{said}")
                    return helper, h_env, h_aliases, here
                later.append((helper, h_env, h_aliases, here))
        todo = later
    return None


def _code(src: SourceFile, node: cst.CSTNode) -> str:
    return " ".join(src.code(node).split())[:60]


def _shown(value) -> str:
    """A value as evidence says it: a function value by the factory that made it, a dict by its keys."""
    if isinstance(value, Func):
        return f"`{value.fn.name.value}` from `{value.factory}(...)`"
    if isinstance(value, dict):  # a key whose value is not known reads `?`
        return "{" + ", ".join(f"{k!r}: {'?' if v is None else _shown(v)}" for k, v in list(value.items())[:6]) + "}"
    return repr(value)


def _step_facts(src: SourceFile, cls_name: str | None, entry: str, fn: cst.FunctionDef, loop: cst.For, env: Env,
                aliases: set[str], transformer: tuple[SourceFile, cst.ClassDef] | None) -> PipelineFacts:
    """The CFG style read from the step loop: how many transformer calls one step runs with the defaults."""
    path = str(src.path)
    evidence = [Evidence(path, src.line(loop), f"denoising loop `for {src.code(loop.target)} in "
                                               f"{src.code(loop.iter)}`")]
    calls = _reached_calls(loop.body, env, aliases)
    for call in calls:
        evidence.append(Evidence(path, src.line(call), f"transformer call `{dotted(call.func)}(...)`"))
    for ctx in find_all(loop.body, cst.Call):
        if isinstance(ctx.func, cst.Attribute) and ctx.func.attr.value == "cache_context" and ctx.args:
            evidence.append(Evidence(path, src.line(ctx), f"`{src.code(ctx)}`"))

    # each model's calls are counted on their own: a second transformer (Ideogram4's
    # `self.unconditional_transformer`) is another model, not a second call of this one
    models = list(dict.fromkeys(_callee(c) for c in calls))
    counted = [(_path_calls(body_of(loop), env, aliases, src, m), m) for m in models]
    (count, repeated, notes), chosen = max(counted, key=lambda x: (bool(x[0][1]), x[0][0]))
    mine = [c for c in calls if _callee(c) == chosen]
    others = tuple(Evidence(path, next(src.line(c) for c in calls if _callee(c) == m),
                            f"`{m}` is a second model called in the loop, not a second call of the transformer: "
                            "cache-dit needs it as another BlockAdapter entry")
                   for m in models
                   if m.startswith("self.") and m != "self.transformer" and "self.transformer" in models)
    evidence += others
    evidence += list(dict.fromkeys(notes))  # each note once
    if repeated:
        evidence.append(Evidence(path, repeated, "transformer called inside an inner loop (one call per guidance "
                                                 "condition): separate forwards per step"))
        return PipelineFacts(cls_name, entry, path, True, "medium", len(mine), tuple(evidence), other_models=others)
    if count >= 3:
        # LTX2 by default: the batched CFG call, then a spatio-temporal and a modality guidance pass. cache-dit's
        # has_separate_cfg splits a step's calls in two (cond / uncond); neither answer describes three
        why = (f"{count} transformer calls run in one step with the defaults: cache-dit's has_separate_cfg "
               "tells apart exactly two (cond / uncond), so neither True nor False describes this loop")
        evidence.append(Evidence(path, src.line(loop), why))
        return PipelineFacts(cls_name, entry, path, None, "low", count, tuple(evidence), other_models=others)
    if count >= 2:
        why = f"{count} transformer calls can run in one step: cond and uncond are separate forwards"
        evidence.append(Evidence(path, src.line(loop), why))
        return PipelineFacts(cls_name, entry, path, True, "high", count, tuple(evidence), other_models=others)
    return _one_call(src, cls_name, entry, fn, loop, count, mine, evidence, others, transformer)


def _one_call(src: SourceFile, cls_name: str | None, entry: str, fn: cst.FunctionDef, loop: cst.For, count: int,
              mine: list[cst.Call], evidence: list[Evidence], others: tuple[Evidence, ...],
              transformer: tuple[SourceFile, cst.ClassDef] | None) -> PipelineFacts:
    """At most one call per step with the defaults: batched CFG, unless the called model is a parameter of the
    entry that a guidance wrapper in this file could stand for."""
    path = str(src.path)
    why = "one transformer call per step"
    if len(mine) > count:
        why += f" by default ({len(mine) - count} more only run when their condition holds)"
    batched = [c for c in find_all(loop.body, cst.Call) if dotted(c.func) == "torch.cat" and c.args and
               isinstance(c.args[0].value, (cst.List, cst.BinaryOperation))]
    if batched:
        why += "; the batch is doubled for CFG (`torch.cat`)"
    evidence.append(Evidence(path, src.line(loop), why))
    confidence = "high" if count == 1 else "medium"
    bare = sorted({c.func.value for c in mine if isinstance(c.func, cst.Name) and c.func.value in _params(fn)})
    if bare:  # `model(x, sigma)`: whatever the caller passes; a guidance wrapper would run the transformer twice
        wrappers = _guidance_wrappers(src, transformer[1] if transformer else None)
        if wrappers:
            name, line = wrappers[0]
            evidence.append(Evidence(path, line, f"`{bare[0]}` is a parameter of `{entry}` and `{name}` here wraps a "
                                                 "model for guidance: which one the loop is given is not in the code"))
            return PipelineFacts(cls_name, entry, path, None, "unknown", count, tuple(evidence), other_models=others)
        evidence.append(Evidence(path, src.line(fn), f"`{bare[0]}` is a parameter of `{entry}`: read as the "
                                                     "transformer itself (a guidance wrapper passed there would "
                                                     "run it once per condition)"))
        confidence = "medium"
    return PipelineFacts(cls_name, entry, path, False, confidence, count, tuple(evidence), other_models=others)


def _passed(ws: Workspace, src: SourceFile, cls_name: str | None, entry: str,
            fn: cst.FunctionDef) -> PipelineFacts | None:
    """The step loop calls a callable the entry is given (`func(z, t)`): where its callers in the repository all
    pass the same guidance method of a model (analyzers/cfg_callers.py), the CFG style that method runs; else None."""
    at = _called_parameter(fn)
    found = passed_callable(ws, src, cls_name, entry, fn, at[1].func.value) if at is not None else None
    if found is None:
        return None
    (loop, called), (t_src, t_cls, method, evidence) = at, found
    path = str(src.path)
    head = [Evidence(path, src.line(loop), f"denoising loop `for {src.code(loop.target)} in {src.code(loop.iter)}`"),
            Evidence(path, src.line(called), f"the step calls `{called.func.value}`, a parameter of `{entry}`, "
                                             "once; read at its callers")]
    return _guidance_read(src, cls_name, entry, method, (t_src, t_cls), [*head, *evidence])


def _called_parameter(fn: cst.FunctionDef) -> tuple[cst.For, cst.Call] | None:
    """(the first loop of `fn` that calls one of its parameters, that call): `pred = func(z, t)`."""
    params = _params(fn)
    for loop in find_all(fn.body, cst.For):
        called = next((c for c in find_all(loop.body, cst.Call)
                       if isinstance(c.func, cst.Name) and c.func.value in params), None)
        if called is not None:
            return loop, called
    return None


def _no_model_call(src: SourceFile, fn: cst.FunctionDef, entry: str) -> Evidence:
    """Why no loop of the entry was found to call the model: one calls a callable the entry is given (`func(z, t)`,
    a parameter: which model or guidance wrapper stands behind it is the caller's choice), or none calls anything
    that reaches a model."""
    at = _called_parameter(fn)
    if at is not None:
        called = at[1]
        return Evidence(str(src.path), src.line(called),
                        f"the step loop calls `{called.func.value}`, a parameter of `{entry}`: which model (or "
                        "guidance wrapper) it stands for is its caller's choice, not in this function; CFG style "
                        "unknown")
    return Evidence(str(src.path), src.line(fn), f"no transformer call inside a loop in `{entry}`")


def _params(fn: cst.FunctionDef) -> set[str]:
    p = fn.params
    return {x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params)}


def _method_calls(node: cst.CSTNode, aliases: set[str], methods: dict) -> list[cst.Call]:
    """`model.forward_with_cfg(...)`: calls of one of the transformer's own methods (not forward) on a model."""
    return [c for c in find_all(node, cst.Call) if isinstance(c.func, cst.Attribute)
            and c.func.attr.value in methods and c.func.attr.value not in ("forward", "__call__")
            and is_model(c.func.value, aliases)]


def _guidance_method(src: SourceFile, cls_name, entry: str, loop: cst.For, aliases: set[str], methods: dict,
                     transformer: tuple[SourceFile, cst.ClassDef]) -> PipelineFacts:
    """The step calls a method of the transformer that runs the guidance (DiT's `forward_with_cfg`): decided from
    that method's body, which calls `self.forward` / `self(...)` on a doubled batch (False) or once per
    condition (True)."""
    path = str(src.path)
    call = _method_calls(loop.body, aliases, methods)[0]
    evidence = [Evidence(path, src.line(loop),
                         f"denoising loop `for {src.code(loop.target)} in {src.code(loop.iter)}`"),
                Evidence(path, src.line(call),
                         f"the step calls `{dotted(call.func)}(...)`, a method of the transformer")]
    return _guidance_read(src, cls_name, entry, methods[call.func.attr.value], transformer, evidence)


def _guidance_read(src: SourceFile, cls_name, entry: str, method: cst.FunctionDef,
                   transformer: tuple[SourceFile, cst.ClassDef], evidence: list[Evidence]) -> PipelineFacts:
    """The CFG style a transformer's guidance method runs: forward once on a doubled batch (False), once per
    condition (True), else unknown. Calls are counted along one path with the method's defaults (Lumina's
    `forward_with_cfg` calls forward in each arm of an `if`: once per step)."""
    path = str(src.path)
    t_src, t_cls = transformer
    at = Evidence(str(t_src.path), t_src.line(method), "")
    inner = [c for c in find_all(method.body, cst.Call) if dotted(c.func) in ("self", "self.forward")]
    env, _ = env_of(t_src, t_cls, method)
    count, repeated, _ = _path_calls(body_of(method), env, {"self"}, t_src, callee="self")
    doubled = [c for c in find_all(method.body, cst.Call) if dotted(c.func) == "torch.cat" and c.args
               and _doubles(c.args[0].value)]
    where = f"`{t_cls.name.value}.{method.name.value}`"
    if count == 1 and doubled:
        evidence.append(Evidence(at.file, t_src.line(doubled[0]), f"{where} runs forward once on a batch doubled with "
                                                                  "`torch.cat`: cond and uncond are one batched call"))
        return PipelineFacts(cls_name, entry, path, False, "medium", 1, tuple(evidence))
    if repeated:
        evidence.append(Evidence(at.file, repeated, f"{where} runs forward inside a loop, once per guidance "
                                                    "condition: cond and uncond are separate forwards"))
        return PipelineFacts(cls_name, entry, path, True, "medium", count, tuple(evidence))
    if count >= 2:
        evidence.append(Evidence(at.file, t_src.line(inner[1]), f"{where} runs forward {count} times: cond and "
                                                                "uncond are separate forwards"))
        return PipelineFacts(cls_name, entry, path, True, "medium", count, tuple(evidence))
    evidence.append(Evidence(at.file, at.line, f"{where} calls forward {len(inner)} time(s) with no doubled batch "
                                               "read: CFG style unknown"))
    return PipelineFacts(cls_name, entry, path, None, "unknown", len(inner), tuple(evidence))


def _doubles(seq: cst.BaseExpression) -> bool:
    """`[x, x]` (the same expression twice) or `[x] * 2`."""
    if isinstance(seq, (cst.List, cst.Tuple)) and len(seq.elements) == 2:
        a, b = (cst.Module([]).code_for_node(e.value) for e in seq.elements)
        return a == b
    return (isinstance(seq, cst.BinaryOperation) and isinstance(seq.operator, cst.Multiply)
            and isinstance(seq.right, cst.Integer) and seq.right.value == "2")


def _guidance_wrappers(src: SourceFile, transformer: cst.ClassDef | None) -> list[tuple[str, int]]:
    """Classes of `src` (not the transformer) whose forward calls a model they hold (`self.inner_model(...)`) on a
    doubled batch or once per condition: CFG wrappers, [(name, line)]."""
    out = []
    for name, cls in src.classes.items():
        if transformer is not None and name == transformer.name.value:
            continue
        fwd = find_method(cls, "forward") or find_method(cls, "__call__")
        if fwd is None:
            continue
        held = [c for c in find_all(fwd.body, cst.Call) if (a := self_attr(c.func)) is not None
                and any(w in a.lower() for w in MODEL_WORDS)]
        doubled = [c for c in find_all(fwd.body, cst.Call) if dotted(c.func) == "torch.cat" and c.args
                   and _doubles(c.args[0].value)]
        if (held and doubled) or len(held) >= 2:
            out.append((name, src.line(cls)))
    return out


def _over_schedule(iterable: cst.BaseExpression) -> bool:
    """Does the loop iterate the scheduler's steps: a name or attribute `timesteps` / `sigmas` in its iterable?"""
    names = [n.value for n in find_all(iterable, cst.Name)] + [a.attr.value for a in find_all(iterable, cst.Attribute)]
    return any("timestep" in n.lower() or "sigma" in n.lower() for n in names)


def _model_calls(node: cst.CSTNode, aliases: set[str], callee: str | None = None,
                 helpers: dict | None = None) -> list[cst.Call]:
    """Transformer calls under node (`callee`: only those of that one model, by `_callee`); a call of one of
    `helpers` (a function the source defines, `model_fn`) is the function's, never a model's."""
    return [c for c in find_all(node, cst.Call) if is_model(c.func, aliases)
            and not (helpers and dotted(c.func) in helpers) and (callee is None or _callee(c) == callee)]


def _helper_calls(stmt: cst.CSTNode, env: Env) -> list[cst.FunctionDef]:
    """The helpers `stmt` calls (each once per call)."""
    return [env.helpers[name] for c in find_all(stmt, cst.Call) if (name := dotted(c.func)) in env.helpers]


def _reached_calls(node: cst.CSTNode, env: Env, aliases: set[str], depth: int = 0,
                   seen: frozenset = frozenset()) -> list[cst.Call]:
    """The model calls `node` runs, its own and those of the helpers it calls (HELPER_DEPTH deep, cycle-safe)."""
    out = _model_calls(node, aliases, helpers=env.helpers)
    for h in _helper_calls(node, env) if depth < HELPER_DEPTH else ():
        if id(h) not in seen:
            out += [c for c in _reached_calls(h.body, env, aliases, depth + 1, seen | {id(h)}) if c not in out]
    return out


def loop_model_calls(src: SourceFile, cls: cst.ClassDef | None, fn: cst.FunctionDef) -> list[cst.Call]:
    """The model calls the loops of `fn` run, in source order: their own and those of the helpers they call
    (the sampler's `pred = model(img=img, ...)`), found as the CFG reader finds them."""
    env, aliases = env_of(src, cls, fn)
    env.helpers = helpers_of(src, cls, fn)
    out: list[cst.Call] = []
    for loop in find_all(fn.body, cst.For):
        out += [c for c in _reached_calls(loop.body, env, aliases) if c not in out]
    return out


def _reaches_model(node: cst.CSTNode, env: Env, aliases: set[str]) -> bool:
    """Does `node` call the model, directly or through helpers (`_reached_calls`)?"""
    return bool(_reached_calls(node, env, aliases))


def _callee(call: cst.Call) -> str:
    """Which model a call runs: `self.transformer(...)` and `self.transformer.forward(...)` -> "self.transformer";
    a local alias is its own name (it may hold either of two models, as Wan 2.2's `current_model` does)."""
    name = dotted(call.func) or ""
    return name[: -len(".forward")] if name.endswith(".forward") else name


def _path_calls(stmts, env: Env, aliases: set[str], src: SourceFile, callee: str | None = None, depth: int = 0):
    """(max calls along one path, line of a call inside an inner loop or 0, notes as evidence); `callee`: count
    only the calls of that model."""
    total, repeated, notes = 0, 0, []
    for stmt in stmts:
        if isinstance(stmt, cst.If):
            verdict = value_of(stmt.test, env)
            a = _path_calls(body_of(stmt), env, aliases, src, callee, depth)
            orelse = [stmt.orelse] if isinstance(stmt.orelse, cst.If) else body_of(stmt.orelse)  # `elif`: an `if`
            b = _path_calls(orelse, env, aliases, src, callee, depth) if stmt.orelse is not None else (0, 0, [])
            notes += a[2] + b[2]
            if verdict is False and a[0]:
                notes.append(Evidence(str(src.path), src.line(stmt), f"`if {src.code(stmt.test)}` is false with "
                                                                     f"the defaults: {a[0]} call(s) there are off by "
                                                                     "default"))
                pick = b
            elif verdict is True:
                if b[0] and env.args:  # read with a caller's values (a followed call): say what they turn off
                    notes.append(Evidence(str(src.path), src.line(stmt), f"`if {src.code(stmt.test)}` is true with the "
                                                                         f"defaults: {b[0]} call(s) after it are off"))
                pick = a
            else:
                pick = a if a[0] >= b[0] else b
            total += pick[0]
            repeated = repeated or pick[1]
        elif isinstance(stmt, (cst.For, cst.While)):
            inner = _model_calls(stmt.body, aliases, callee, env.helpers)
            if inner:
                repeated = repeated or src.line(inner[0])
                total += len(inner)
        elif isinstance(stmt, (cst.With, cst.Try)):
            a = _path_calls(body_of(stmt), env, aliases, src, callee, depth)
            total, repeated, notes = total + a[0], repeated or a[1], notes + a[2]
        elif isinstance(stmt, cst.FunctionDef):
            continue  # a nested def runs where it is called
        else:
            for call in _model_calls(stmt, aliases, callee, env.helpers):
                a = _through_function(call, env, depth)
                total, repeated, notes = total + a[0], repeated or a[1], notes + a[2]
            for helper in _helper_calls(stmt, env) if depth < HELPER_DEPTH else ():
                a = _path_calls(body_of(helper), env, aliases, src, callee, depth + 1)  # the step calls the model
                if a[0]:  # through a function of its own (`pred = model_fn(z=z, ...)`)
                    notes.append(Evidence(str(src.path), src.line(helper),
                                          f"the step reaches the model through `{helper.name.value}`"))
                total, repeated, notes = total + a[0], repeated or a[1], notes + a[2]
    return total, repeated, notes


def _through_function(call: cst.Call, env: Env, depth: int) -> tuple[int, int, list[Evidence]]:
    """What one call of the model runs: one forward, or, where what it calls is a function value
    (`self.model` holding the `k_model` that `fm_wrapper(transformer)` returned), the model calls along one path
    of that function, read with the values the call passes it."""
    func = value_of(call.func, env)
    if not isinstance(func, Func) or depth > HELPER_DEPTH:
        return 1, 0, []
    f_env, f_aliases = called_env(func.src, None, func.fn, env, set(), call, known={}, base=func.env)
    count, repeated, notes = _path_calls(body_of(func.fn), f_env, f_aliases | func.aliases, func.src, None,
                                         depth + 1)
    lines = ", ".join(f":{func.src.line(c)}" for c in _model_calls(func.fn.body, f_aliases | func.aliases))
    why = (f"`{dotted(call.func)}` is `{func.fn.name.value}`, the function `{func.factory}(...)` returns: it calls "
           f"the model at {lines or 'no line read'}, {count} time(s) along one path with the values passed here")
    return count, repeated, [*notes, Evidence(str(func.src.path), func.src.line(func.fn), why)]


__all__ = ["analyze_pipeline"]
