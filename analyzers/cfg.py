"""CFG style of the denoising loop: separate cond/uncond transformer calls, or one batched call.

Counts transformer calls along one path through a step of the loop. A branch is followed
when its condition is known from the entry's numeric defaults (FluxPipeline's second call
runs only when `true_cfg_scale > 1`, and the default is 1.0, so the uncond call is off by
default); prompts and other inputs that default to None stay unknown, never assumed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import libcst as cst

from integrate.defuse import PLAIN, defuse
from integrate.records import Evidence
from integrate.resolve import Workspace
from integrate.source import SourceFile, dotted, find_method, iter_methods
from integrate.syntax import body_of, find_all, self_attr

from .records import PipelineFacts

MODEL_WORDS = ("transformer", "model", "dit", "denoiser", "unet", "net")
HELPER_DEPTH = 3  # functions followed from the step loop to the model call (sampler -> step -> model-mean -> model)
ENTRY_DEPTH = 3  # functions followed from the entry to the one holding the step loop (`__call__` -> `processing`)


@dataclass
class _Env:
    src: SourceFile
    params: dict[str, cst.BaseExpression]
    locals: dict[str, cst.BaseExpression]
    self_values: dict[str, cst.BaseExpression]
    properties: dict[str, cst.BaseExpression]
    # functions a step may call on its way to the model: the entry's nested defs, the module's functions and the
    # class's methods, by the name a call spells (`model_fn`, `self._step`)
    helpers: dict[str, cst.FunctionDef] = field(default_factory=dict)
    # a function the entry calls: the values its caller passes (parameter -> value; a passed parameter's default
    # no longer counts) and the `self.<x>` values the caller assigned (`self._guidance_scale = guidance_scale`)
    args: dict[str, object] = field(default_factory=dict)
    known: dict[str, object] = field(default_factory=dict)


def _literal(expr: cst.BaseExpression):
    if isinstance(expr, (cst.Integer, cst.Float)):
        return expr.evaluated_value
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        v = _literal(expr.expression)
        return -v if isinstance(v, (int, float)) else None
    if isinstance(expr, cst.Name) and expr.value in ("True", "False"):
        return expr.value == "True"
    return None


_OPS = {
    cst.GreaterThan: lambda a, b: a > b,
    cst.LessThan: lambda a, b: a < b,
    cst.GreaterThanEqual: lambda a, b: a >= b,
    cst.LessThanEqual: lambda a, b: a <= b,
    cst.Equal: lambda a, b: a == b,
    cst.NotEqual: lambda a, b: a != b,
}


def _eval(expr: cst.BaseExpression | None, env: _Env, depth: int = 0):
    """Three-valued: a Python value, or None for unknown."""
    if expr is None or depth > 10:
        return None
    lit = _literal(expr)
    if lit is not None:
        return lit
    if isinstance(expr, cst.Name):
        if expr.value in env.locals:
            return _eval(env.locals[expr.value], env, depth + 1)
        if expr.value in env.args:
            return env.args[expr.value]
        if expr.value in env.params:
            return _literal(env.params[expr.value])  # only numeric / bool defaults count
        return None
    if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1 and isinstance(expr.left, cst.Name):
        # `feature is not None` for an optional input that defaults to None: off by default.
        # Negative prompts are CFG's own inputs, supplied as data: unknown, never assumed.
        comp, name = expr.comparisons[0], expr.left.value
        default = env.params.get(name)
        if isinstance(default, cst.Name) and default.value == "None" and name not in env.locals and \
                isinstance(comp.comparator, cst.Name) and comp.comparator.value == "None" and \
                not any(w in name for w in ("negative", "neg_", "uncond")):
            if isinstance(comp.operator, cst.IsNot):
                return False
            if isinstance(comp.operator, cst.Is):
                return True
    if (attr := self_attr(expr)) is not None:
        if attr in env.properties:
            return _eval(env.properties[attr], env, depth + 1)
        if attr in env.self_values:
            return _eval(env.self_values[attr], env, depth + 1)
        return env.known.get(attr)
    if isinstance(expr, cst.IfExp):  # an undecided test: the value both arms agree on, if they do
        test = _eval(expr.test, env, depth + 1)
        if test is not None:
            return _eval(expr.body if test else expr.orelse, env, depth + 1)
        a, b = _eval(expr.body, env, depth + 1), _eval(expr.orelse, env, depth + 1)
        return a if a is not None and a == b else None
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        v = _eval(expr.expression, env, depth + 1)
        return None if v is None else not v
    if isinstance(expr, cst.BooleanOperation):
        a, b = _eval(expr.left, env, depth + 1), _eval(expr.right, env, depth + 1)
        if isinstance(expr.operator, cst.And):
            if a is False or b is False:
                return False
            return True if (a and b) else None
        if a is True or b is True:
            return True
        return False if (a is False and b is False) else None
    if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1:
        op = _OPS.get(type(expr.comparisons[0].operator))
        a, b = _eval(expr.left, env, depth + 1), _eval(expr.comparisons[0].comparator, env, depth + 1)
        if op and isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return op(a, b)
    return None


def _is_model(expr: cst.BaseExpression, aliases: set[str]) -> bool:
    """`self.transformer`, `self.transformer_2`, `model`, or a local alias of one of them (or its `.forward`)."""
    if isinstance(expr, cst.Attribute) and expr.attr.value == "forward":
        return _is_model(expr.value, aliases)
    if isinstance(expr, cst.Name):
        return expr.value in aliases or any(w in expr.value.lower() for w in MODEL_WORDS)
    attr = self_attr(expr)
    return attr is not None and any(w in attr.lower() for w in MODEL_WORDS)


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
    env, aliases = _env_of(src, cls, fn)
    env.helpers = _helpers(src, cls, fn)
    methods = {m.name.value: m for m in iter_methods(transformer[1])} if transformer is not None else {}
    stepped = [lp for lp in find_all(fn.body, cst.For) if _method_calls(lp.body, aliases, methods)]
    if stepped and not any(_reaches_model(lp.body, env, aliases) for lp in find_all(fn.body, cst.For)):
        return _guidance_method(src, cls_name, entry, stepped[0], aliases, methods, transformer)
    loops = [lp for lp in find_all(fn.body, cst.For) if _reaches_model(lp.body, env, aliases)]
    via: list[Evidence] = []
    if not loops:  # the entry hands the steps to a function of its own (`self.processing(...)`): read that one
        held = _step_holder(src, cls, fn, env, aliases)
        if held is None:
            return PipelineFacts(cls_name, entry, path, None, "unknown", 0,
                                 (Evidence(path, src.line(fn), f"no transformer call inside a loop in `{entry}`"),))
        fn, env, aliases, via = held
        loops = [lp for lp in find_all(fn.body, cst.For) if _reaches_model(lp.body, env, aliases)]
    # the step loop: the outermost loop over the schedule (`for i, t in enumerate(timesteps)`), else the outermost
    # loop that calls the transformer (find_all yields parents first). A loop around the step loop (AnyFlowFAR's
    # chunks of frames) is not a loop over guidance conditions.
    stepping = [lp for lp in loops if _over_schedule(lp.iter)]
    facts = _step_facts(src, cls_name, entry, fn, (stepping or loops)[0], env, aliases, transformer)
    return dataclasses.replace(facts, evidence=(*via, *facts.evidence)) if via else facts


def _step_holder(src: SourceFile, cls: cst.ClassDef | None, fn: cst.FunctionDef, env: _Env, aliases: set[str]):
    """The function `fn` calls, through at most ENTRY_DEPTH of its own functions (methods, the module's functions,
    nested defs; breadth first, each once), whose loop over the schedule calls the model: (that function, its env
    with the values the calls pass, its model aliases, the calls followed as evidence); None when there is none."""
    todo = [(fn, env, aliases, [])]
    seen = {id(fn)}
    for _ in range(ENTRY_DEPTH):
        later = []
        for caller, c_env, c_aliases, via in todo:
            for call in find_all(caller.body, cst.Call):
                name = dotted(call.func)
                helper = c_env.helpers.get(name or "")
                if helper is None or id(helper) in seen:
                    continue
                seen.add(id(helper))
                h_env, h_aliases = _called_env(src, cls, caller, c_env, c_aliases, call, helper)
                here = [*via, Evidence(str(src.path), src.line(call), f"`{caller.name.value}` calls `{name}(...)`")]
                if any(_over_schedule(lp.iter) and _reaches_model(lp.body, h_env, h_aliases)
                       for lp in find_all(helper.body, cst.For)):
                    values = ", ".join(f"`self.{a}` = {v!r}" for a, v in sorted(h_env.known.items()))[:200]
                    said = f" and those the caller sets ({values})" if values else ""
                    here[-1] = Evidence(here[-1].file, here[-1].line, f"{here[-1].why}, whose loop runs the steps; "
                                                                      f"read with the values this call passes{said}")
                    return helper, h_env, h_aliases, here
                later.append((helper, h_env, h_aliases, here))
        todo = later
    return None


def _called_env(src: SourceFile, cls: cst.ClassDef | None, caller: cst.FunctionDef, env: _Env, aliases: set[str],
                call: cst.Call, helper: cst.FunctionDef) -> tuple[_Env, set[str]]:
    """The env `_eval` reads in `helper` as `call` in `caller` runs it: the helper's own, with each parameter the
    call passes bound to the value it has in the caller (unknown where the caller's value is: the default no longer
    counts), a parameter handed a model as a model alias, and the `self.<x>` values the caller assigned."""
    h_env, h_aliases = _env_of(src, cls, helper)
    h_env.helpers = _helpers(src, cls, helper)
    h_env.known = {**env.known, **_assigned_self(src, caller, env)}
    params = [p.name.value for p in (*helper.params.posonly_params, *helper.params.params)]
    if params[:1] == ["self"] and (dotted(call.func) or "").startswith("self."):
        params = params[1:]
    kwonly = {p.name.value for p in helper.params.kwonly_params}
    for i, arg in enumerate(call.args):
        if arg.star:  # `*args` / `**kwargs`: which parameters they fill is not read; none keeps its default
            h_env.params.clear()
            break
        name = arg.keyword.value if arg.keyword is not None else (params[i] if i < len(params) else None)
        if name is None or (arg.keyword is not None and name not in params and name not in kwonly):
            continue
        h_env.params.pop(name, None)
        value = _eval(arg.value, env)
        if value is not None:
            h_env.args[name] = value
        if _is_model(arg.value, aliases):
            h_aliases.add(name)
    return h_env, h_aliases


def _assigned_self(src: SourceFile, fn: cst.FunctionDef, env: _Env) -> dict[str, object]:
    """{attr: value} for each `self.<attr>` every assignment in `fn` gives the same known value."""
    found: dict[str, list] = {}
    for _, _, value, node in defuse(src, fn).statements(PLAIN):
        for t in node.targets:
            if (attr := self_attr(t.target)) is not None:
                found.setdefault(attr, []).append(_eval(value, env))
    return {a: vs[0] for a, vs in found.items() if vs[0] is not None and all(v == vs[0] for v in vs)}


def _env_of(src: SourceFile, cls: cst.ClassDef | None, fn: cst.FunctionDef) -> tuple[_Env, set[str]]:
    """What `_eval` reads in `fn`: its parameters' defaults, each local's first `=` value, each `self.x = ...`
    and the class's one-return properties; and the locals bound to a model (`transformer = self.transformer`)."""
    params = {p.name.value: p.default for p in (*fn.params.params, *fn.params.kwonly_params) if p.default is not None}
    env = _Env(src, params, {}, {}, {})
    if cls is not None:
        for m in iter_methods(cls):
            if any(dotted(d.decorator) == "property" for d in m.decorators):
                rets = find_all(m.body, cst.Return)
                if len(rets) == 1 and rets[0].value is not None:
                    env.properties[m.name.value] = rets[0].value
    aliases: set[str] = set()
    for _, _, value, node in defuse(src, fn).statements(PLAIN):
        if len(node.targets) != 1:
            continue
        target = node.targets[0].target
        if isinstance(target, cst.Name):
            env.locals.setdefault(target.value, value)
            values = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
            if any(self_attr(v) and any(w in self_attr(v).lower() for w in MODEL_WORDS) for v in values):
                aliases.add(target.value)
        elif (attr := self_attr(target)) is not None:
            env.self_values.setdefault(attr, value)
    return env, aliases


def _step_facts(src: SourceFile, cls_name: str | None, entry: str, fn: cst.FunctionDef, loop: cst.For, env: _Env,
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
    evidence += [Evidence(path, line, why) for line, why in dict.fromkeys(notes)]  # each note once
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


def _params(fn: cst.FunctionDef) -> set[str]:
    p = fn.params
    return {x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params)}


def _method_calls(node: cst.CSTNode, aliases: set[str], methods: dict) -> list[cst.Call]:
    """`model.forward_with_cfg(...)`: calls of one of the transformer's own methods (not forward) on a model."""
    return [c for c in find_all(node, cst.Call) if isinstance(c.func, cst.Attribute)
            and c.func.attr.value in methods and c.func.attr.value not in ("forward", "__call__")
            and _is_model(c.func.value, aliases)]


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
    env, _ = _env_of(t_src, t_cls, method)
    count = _path_calls(body_of(method), env, {"self"}, t_src, callee="self")[0]
    doubled = [c for c in find_all(method.body, cst.Call) if dotted(c.func) == "torch.cat" and c.args
               and _doubles(c.args[0].value)]
    where = f"`{t_cls.name.value}.{method.name.value}`"
    if count == 1 and doubled:
        evidence.append(Evidence(at.file, t_src.line(doubled[0]), f"{where} runs forward once on a batch doubled with "
                                                                  "`torch.cat`: cond and uncond are one batched call"))
        return PipelineFacts(cls_name, entry, path, False, "medium", 1, tuple(evidence))
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
    return [c for c in find_all(node, cst.Call) if _is_model(c.func, aliases)
            and not (helpers and dotted(c.func) in helpers) and (callee is None or _callee(c) == callee)]


def _helpers(src: SourceFile, cls: cst.ClassDef | None, fn: cst.FunctionDef) -> dict[str, cst.FunctionDef]:
    """The functions a step can call by name: the entry's nested defs, the module's functions, `self.<method>`."""
    out: dict[str, cst.FunctionDef] = dict(src.functions)
    out.update({f"self.{m.name.value}": m for m in iter_methods(cls)} if cls is not None else {})
    out.update({d.name.value: d for d in find_all(fn.body, cst.FunctionDef, skip_functions=False)})
    return out


def _helper_calls(stmt: cst.CSTNode, env: _Env) -> list[cst.FunctionDef]:
    """The helpers `stmt` calls (each once per call)."""
    return [env.helpers[name] for c in find_all(stmt, cst.Call) if (name := dotted(c.func)) in env.helpers]


def _reached_calls(node: cst.CSTNode, env: _Env, aliases: set[str], depth: int = 0,
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
    env, aliases = _env_of(src, cls, fn)
    env.helpers = _helpers(src, cls, fn)
    out: list[cst.Call] = []
    for loop in find_all(fn.body, cst.For):
        out += [c for c in _reached_calls(loop.body, env, aliases) if c not in out]
    return out


def _reaches_model(node: cst.CSTNode, env: _Env, aliases: set[str]) -> bool:
    """Does `node` call the model, directly or through helpers (`_reached_calls`)?"""
    return bool(_reached_calls(node, env, aliases))


def _callee(call: cst.Call) -> str:
    """Which model a call runs: `self.transformer(...)` and `self.transformer.forward(...)` -> "self.transformer";
    a local alias is its own name (it may hold either of two models, as Wan 2.2's `current_model` does)."""
    name = dotted(call.func) or ""
    return name[: -len(".forward")] if name.endswith(".forward") else name


def _path_calls(stmts, env: _Env, aliases: set[str], src: SourceFile, callee: str | None = None, depth: int = 0):
    """(max calls along one path, line of a call inside an inner loop or 0, notes); `callee`: count only the
    calls of that model."""
    total, repeated, notes = 0, 0, []
    for stmt in stmts:
        if isinstance(stmt, cst.If):
            verdict = _eval(stmt.test, env)
            a = _path_calls(body_of(stmt), env, aliases, src, callee, depth)
            orelse = [stmt.orelse] if isinstance(stmt.orelse, cst.If) else body_of(stmt.orelse)  # `elif`: an `if`
            b = _path_calls(orelse, env, aliases, src, callee, depth) if stmt.orelse is not None else (0, 0, [])
            notes += a[2] + b[2]
            if verdict is False and a[0]:
                notes.append((src.line(stmt), f"`if {src.code(stmt.test)}` is false with the defaults: "
                                              f"{a[0]} call(s) there are off by default"))
                pick = b
            elif verdict is True:
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
            total += len(_model_calls(stmt, aliases, callee, env.helpers))
            for helper in _helper_calls(stmt, env) if depth < HELPER_DEPTH else ():
                a = _path_calls(body_of(helper), env, aliases, src, callee, depth + 1)  # the step calls the model
                if a[0]:  # through a function of its own (`pred = model_fn(z=z, ...)`)
                    notes.append((src.line(helper), f"the step reaches the model through `{helper.name.value}`"))
                total, repeated, notes = total + a[0], repeated or a[1], notes + a[2]
    return total, repeated, notes


__all__ = ["analyze_pipeline"]
