"""Templates: the approved plan rendered into cache-dit code (jinja2, one template per artifact).

`build(plan, approval, analysis, src, cls)` returns the generated files as `Artifact`s with their
roles; `plugin_files` lays them out as an importable plugin package, and `checkout_artifacts` as
modules of a cache-dit source tree with their registrations. Code never lives in Python strings
here: every file comes from a `.j2` template next to this module, fed with data from the plan.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import libcst as cst

from integrate import __version__
from integrate.records import Analysis
from integrate.source import SourceFile, dotted, find_method

from .forward_patch import ForwardPatch, import_block, patch_forward

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(Path(__file__).parent)),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
_ENV.filters["basename"] = lambda p: Path(str(p)).name
_ENV.filters["pykey"] = lambda k: k if k.isdigit() else json.dumps(k)


@dataclass(frozen=True)
class Piece:
    """One generated module: its role, module name inside the plugin, and text."""

    role: str  # "adapter" | "patch_functor" | "cp_planner" | "tp_planner" | "te_planner" | "example"
    module: str  # plugin module name ("adapter", "cp_planner", ...)
    symbol: str  # the registered function / class
    text: str


@dataclass
class Generated:
    import_name: str
    pieces: list[Piece] = field(default_factory=list)
    extra: dict[str, str] = field(default_factory=dict)  # non-module files: {relative path: text}
    notes: list[str] = field(default_factory=list)
    manual: list[str] = field(default_factory=list)  # what the templates could not do
    registered: dict[str, str] = field(default_factory=dict)  # role -> registry name


def camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[_\W]+", name) if part)


def _render(template: str, **ctx: Any) -> str:
    text = _ENV.get_template(template).render(version=__version__, **ctx)
    return re.sub(r"\n{3,}(?=\S)", "\n\n\n", text).rstrip() + "\n"


def build(plan: dict, approval: dict, analysis: Analysis, ws, src: SourceFile, cls: cst.ClassDef,
          functor_module: str, import_name: str) -> Generated:
    m = plan["model"]
    name = m["example_name"]
    base = camel(name)
    sha = approval.get("plan_sha256", "")
    common = {"m": m, "plan_sha": sha, "supported": bool((plan.get("already_supported") or {}).get("registered"))}
    gen = Generated(import_name=import_name)

    # -- cache ---------------------------------------------------------------------------
    patch: ForwardPatch | None = None
    functor = None
    if plan["cache"]["needs_patch_functor"]:
        patch = patch_forward(ws, src, cls, analysis.transformer.block_lists)
        for i, split in enumerate(patch.splits):
            split.var = f"part_{i}"
        handled = _handled(plan["cache"]["patch_functor_reasons"], patch)
        gen.manual += [r for r in plan["cache"]["patch_functor_reasons"] if r not in handled]
        if patch.changes:
            functor = {"cls": f"{base}PatchFunctor", "module": functor_module, "why": "; ".join(patch.changes)}
            fwd = find_method(cls, "forward")
            extra = [("cache_dit.caching.patch_functors.functor_base", "PatchFunctor")]
            if patch.splits:
                extra.append(("torch", "nn"))
            gen.pieces.append(Piece("patch_functor", "patch_functor", functor["cls"], _render(
                "patch_functor.py.j2", patch=patch, functor=functor, imports=import_block(patch.imports + extra),
                fwd_line=src.line(fwd), **common)))
        else:
            patch = None
    blocks = []
    for b in plan["cache"]["block_lists"]:
        blocks.append({"attr": b["attr"], "pattern": b["forward_pattern"], "note": ""})
        if patch is not None:
            for s in patch.splits:
                if s.attr == b["attr"] and s.new_attr != b["attr"]:
                    blocks.append({"attr": s.new_attr, "pattern": b["forward_pattern"],
                                   "note": f"a second walk over `{b['attr']}`, split off by the PatchFunctor"})
    if any(b["pattern"] is None for b in blocks):
        gen.manual.append("a block list has no ForwardPattern in the plan: the adapter cannot be written for it")
        blocks = [b for b in blocks if b["pattern"] is not None]
    if not blocks:
        gen.manual.append("no block list with a ForwardPattern: no BlockAdapter written")
    prefix = m["pipeline_class"].split(".")[0]
    prefix = prefix[: -len("Pipeline")] if prefix.endswith("Pipeline") else prefix
    check = all(b.get("check_forward_pattern") for b in plan["cache"]["block_lists"])
    adapter = {
        "prefix": prefix, "func": f"{name}_adapter", "blocks": blocks,
        "has_separate_cfg": bool(plan["cache"]["has_separate_cfg"]),
        "cfg_why": f"the pipeline's denoising loop {'calls the transformer separately for CFG' if plan['cache']['has_separate_cfg'] else 'batches CFG in one call'} (confidence {plan['cache']['cfg_confidence']})",
        "check_forward_pattern": check,
        "check_why": "cache-dit's name/annotation check cannot read these blocks (see the plan's cache section)",
    }
    adapter_imports = [("cache_dit.caching.block_adapters.block_adapters", "BlockAdapter"),
                       ("cache_dit.caching.forward_pattern", "ForwardPattern")]
    if not common["supported"]:  # registered only when cache-dit's own adapter does not accept the model
        adapter_imports.append(("cache_dit.caching.block_adapters.block_registers", "BlockAdapterRegister"))
    if functor:
        adapter_imports.append((functor["module"], functor["cls"]))
    if blocks:
        gen.pieces.append(Piece("adapter", "adapter", adapter["func"], _render(
            "adapter.py.j2", adapter=adapter, functor=functor, imports=import_block(adapter_imports, (import_name,)),
            **common)))
        if common["supported"]:
            gen.notes.append(f"cache-dit's own adapter accepts {m['transformer_class']}: the plugin registers no "
                             "adapter over it, and its planners only where cache-dit has none")
        else:
            gen.registered["adapter"] = prefix

    # -- context parallelism ---------------------------------------------------------------
    cp = plan["parallelism"]["cp"]
    cp_cls = None
    if cp.get("plan"):
        cp_cls = f"{base}ContextParallelismPlanner"
        mask = _mask_context(plan) if cp["mask_reorder"]["needed"] else None
        if cp["mask_reorder"]["needed"] and mask is None:
            gen.manual.append("the mask reorder needs a joint (two-stream) block list: none found")
        evidence = [f"{e['why']} ({Path(e['file']).name}:{e['line']})" for e in cp["evidence"]][:12]
        cp_imports = [("cache_dit.distributed.core", "_ContextParallelInput"),
                      ("cache_dit.distributed.core", "_ContextParallelOutput"),
                      ("cache_dit.distributed.transformers.register", "ContextParallelismPlanner"),
                      ("cache_dit.distributed.transformers.register", "ContextParallelismPlannerRegister")]
        if mask:
            cp_imports += [("inspect", None), ("torch", None), ("torch.distributed as dist", None)]
        moved = _patched_keys(plan, patch)
        if moved:
            cp_imports.append((functor_module, "walk_starts"))
        gen.pieces.append(Piece("cp_planner", "cp_planner", cp_cls, _render(
            "cp_planner.py.j2", cp=cp, plan=cp["plan"], mask=mask, evidence=evidence,
            patched_keys=moved, parts=_parts(patch),
            imports=import_block(cp_imports, (import_name,)),
            cp_prefix=m["transformer_class"], cp_cls=cp_cls, **common)))
        gen.registered["cp_planner"] = m["transformer_class"]
        if cp.get("rope_drift_fix", {}).get("needed"):
            gen.manual.append("RoPE drift fix: positions are computed from a local length after a root split")
        if any("{" in k for k in cp["plan"]):
            gen.manual.append("a CP hook key has an index not known statically: " +
                              ", ".join(k for k in cp["plan"] if "{" in k))

    # -- tensor parallelism ----------------------------------------------------------------
    tp = plan["parallelism"]["tp"]
    tp_cls = None
    if tp.get("block_lists"):
        tp_cls = f"{base}TensorParallelismPlanner"
        rearrange, norms = _joined_inputs(plan), _distributed_norms(plan)
        tp_imports = [("torch", None)] if rearrange or norms else []
        tp_imports += [("cache_dit.distributed.utils", "shard_div_attr"),
                      ("cache_dit.distributed.transformers.register", "TensorParallelismPlanner"),
                      ("cache_dit.distributed.transformers.register", "TensorParallelismPlannerRegister"),
                      ("torch.distributed.tensor", "Replicate")] + [
                      ("torch.distributed.tensor.parallel", n) for n in
                      ("ColwiseParallel", "RowwiseParallel", "parallelize_module")]
        gen.pieces.append(Piece("tp_planner", "tp_planner", tp_cls, _render(
            "tp_planner.py.j2", tp=tp, imports=import_block(tp_imports), parts=_parts(patch), rearrange=rearrange,
            norms=norms,
            tp_prefix=m["transformer_class"], tp_cls=tp_cls, **common)))
        gen.registered["tp_planner"] = m["transformer_class"]
        for k in tp.get("patch_kernels_first", []):
            gen.notes.append(f"check before TP: {k['why']} ({Path(k['file']).name}:{k['line']})")
        for x in tp["block_lists"]:
            if x["strategy"] == "fused-weight rearrangement" and not _joined_inputs(plan).get(x["attr"]):
                gen.manual.append(f"`{x['attr']}`: a fused QKV+MLP projection needs its rows reordered before "
                                  "sharding; the template rearranges joined inputs of row-wise Linears only")

    # -- text encoders, VAE ----------------------------------------------------------------
    te_modules = []
    for te in plan["text_encoders"]:
        if te["supported"] is False and te["tp_plan"]:
            te_cls = f"{camel(te['class'])}TensorParallelismPlanner"
            module = f"te_{te['component']}"
            plans = _te_layer_plans(te["tp_plan"])
            source = te["tp_plan_source"]
            te_imports = [("cache_dit.distributed.text_encoders.register", n) for n in
                          ("TextEncoderTensorParallelismPlanner", "TextEncoderTensorParallelismPlannerRegister")] + [
                          ("torch.distributed.tensor.parallel", n) for n in
                          ("ColwiseParallel", "RowwiseParallel", "parallelize_module")]
            gen.pieces.append(Piece("te_planner", module, te_cls, _render(
                "te_planner.py.j2", imports=import_block(te_imports), te={**te, "source": f"{Path(source['file']).name}:{source['line']}"},
                plans=plans, te_cls=te_cls, **common)))
            gen.registered[f"te_planner:{te['component']}"] = te["class"]
            te_modules.append(module)
        elif te["supported"]:
            gen.notes.append(f"{te['component']} `{te['class']}`: TE-P already supported by cache-dit")
        else:
            gen.manual.append(f"{te['component']} `{te['class']}`: no TE-P planner and no HF layer plan to write "
                              "one from")
    vae = plan.get("vae")
    if vae:
        gen.notes.append(f"VAE `{vae['class']}`: " + ("VAE-P already supported by cache-dit" if vae["supported"]
                                                    else "no VAE-P planner (not generated: tiling is model-specific)"))
        if vae["supported"] is False:
            gen.manual.append(f"VAE-P for `{vae['class']}`: not generated")

    # -- CLI example, launcher, test matrix ------------------------------------------------
    task = m["example_type_guess"]
    pipeline_cls = m["pipeline_class"].split(".")[0]
    p_src = ws.load(Path(m["pipeline_file"])) if m.get("pipeline_file") else None
    if p_src is not None and pipeline_cls in p_src.classes and p_src.dotted_name:
        example_imports = [("argparse", None), ("os", None), (p_src.dotted_name, pipeline_cls)] + [
            ("cache_dit._utils.registers", n) for n in
            ("Example", "ExampleInitConfig", "ExampleInputData", "ExampleRegister", "ExampleType")]
        gen.pieces.append(Piece("example", "example", f"{name}_example", _render(
            "example.py.j2", imports=import_block(example_imports), task_type=task, pipeline_cls=pipeline_cls,
            example_func=f"{name}_example", **common)))
        gen.registered["example"] = name
    else:
        gen.notes.append(f"no CLI example: `{pipeline_cls}` is not a pipeline class cache-dit's generate CLI can "
                         "load (drive the model with cache_dit.enable_cache directly)")
    uaa = any(v.get("needed") for v in cp.get("ulysses_anything", {}).values())
    gen.extra["test_matrix.sh"] = _render(
        "test_matrix.sh.j2", import_name=import_name, uaa=uaa, tep=bool(plan["text_encoders"]),
        ring=not plan["parallelism"]["cp"].get("mask_reorder", {}).get("needed"),
        vaep=bool(vae and vae["supported"]), ext="mp4" if task in ("T2V", "I2V") else "png", **common)
    contents = [f"{p.role}: `{p.symbol}` ({p.module}.py)" for p in gen.pieces]
    modules = sorted(["_activate"] + [p.module for p in gen.pieces])
    activate = [("cache_dit.distributed.transformers.planners", "_activate_cp_planners"),
                ("cache_dit.distributed.transformers.planners", "_activate_tp_planners")]
    if te_modules:
        activate.append(("cache_dit.distributed.text_encoders.planners", "_activate_text_encoder_tp_planners"))
    gen.extra[f"{import_name}/_activate.py"] = _render("activate.py.j2", te_modules=te_modules,
                                                       imports=import_block(activate), **common)
    gen.extra[f"{import_name}/__init__.py"] = _render(
        "plugin_init.py.j2", contents=contents, package_imports=_package_imports(modules), approval=approval, modules=modules, import_name=import_name,
        adapter=adapter, cp_cls=cp_cls, cp_module="cp_planner", tp_cls=tp_cls, tp_module="tp_planner",
        te_modules=te_modules, **common)
    launcher = import_block([("cache_dit._utils", "entrypoint"), (import_name, None)], (import_name,))
    gen.extra[f"{import_name}/__main__.py"] = _render("launcher.py.j2", import_name=import_name, imports=launcher,
                                                      **common)
    gen.notes = list(dict.fromkeys(gen.notes))
    gen.manual = list(dict.fromkeys(gen.manual))
    return gen


def _handled(reasons: list[str], patch: ForwardPatch) -> list[str]:
    """Reasons the forward rewrite took care of: slice walks (and what follows from them), pitfalls A and B."""
    out = []
    sliced = {s.attr for s in patch.splits}
    for r in reasons:
        attr = r.split(":", 1)[0]
        if attr in sliced and ("slice" in r or "looped over" in r or "len(" in r):
            out.append(r)
        elif "pitfall A" in r and any("pitfall A" in c for c in patch.changes):
            out.append(r)
        elif "pitfall B" in r and any("pitfall B" in c for c in patch.changes):
            out.append(r)
        elif "pitfall C" in r and any(b.attr == attr for b in patch.blocks):
            out.append(r)
    return out


def _parts(patch: ForwardPatch | None) -> dict[str, list[str]]:
    """{list: [lists the PatchFunctor splits off it]}: planners must cover those blocks too."""
    out: dict[str, list[str]] = {}
    for split in patch.splits if patch else []:
        if split.new_attr != split.attr:
            out.setdefault(split.attr, []).append(split.new_attr)
    return out


def _patched_keys(plan: dict, patch: ForwardPatch | None) -> dict[str, tuple[str, int]]:
    """CP keys naming a block the PatchFunctor moves: `blocks.36` -> (`blocks_2`, 0)."""
    if not patch or not patch.splits:
        return {}
    walks: dict[str, list[tuple[int, int]]] = {}
    for lf in (plan["facts"]["sequence"] or {}).get("lists", []):
        if lf.get("offset") is not None and lf.get("last") is not None:
            walks.setdefault(lf["attr"], [])
            if (lf["offset"], lf["last"]) not in walks[lf["attr"]]:
                walks[lf["attr"]].append((lf["offset"], lf["last"]))
    names: dict[str, list[str]] = {}
    for split in patch.splits:
        names.setdefault(split.attr, []).append(split.new_attr)
    out: dict[str, str] = {}
    for key in plan["parallelism"]["cp"]["plan"]:
        attr, _, rest = key.rpartition(".")
        if not rest.isdigit() or attr not in names:
            continue
        index = int(rest)
        for (first, last), new in zip(sorted(walks.get(attr, [])), names[attr]):
            if first <= index <= last and new != attr:
                out[key] = (new, index - first)
    return out


def _mask_context(plan: dict) -> dict | None:
    cp = plan["parallelism"]["cp"]
    seq = plan["facts"]["sequence"] or {}
    lists = [lf for lf in seq.get("lists", []) if len(lf["streams"]) > 1
             and any(i["role"] == "mask" for i in lf["inputs"])]
    if not lists:
        return None
    first = lists[0]
    mask_param = next(i["param"] for i in first["inputs"] if i["role"] == "mask")
    roles = next((b["roles"] for b in plan["cache"]["block_lists"] if b["attr"] == first["attr"]), {})
    lists_attrs = sorted({lf["attr"] for lf in lists})
    text, image = roles.get("encoder_hidden_states", "encoder_hidden_states"), roles.get("hidden_states", "hidden_states")
    image_first = _image_first(plan, first["attr"])
    return {
        "param": mask_param,
        "first": image if image_first else text,
        "second": text if image_first else image,
        "order_why": ("the attention processor concatenates image before text" if image_first else
                      "the attention processor concatenates text before image" if image_first is False else
                      "the processor's concatenation order was not read: text first assumed"),
        "lists": lists_attrs,
        "kind": cp["mask_reorder"]["kind"] or "1-D",
        "why": cp["mask_reorder"]["why"],
    }


def _image_first(plan: dict, attr: str) -> bool | None:
    """Whether the attention processor of `attr`'s blocks joins the image stream before the text stream:
    the first `torch.cat([...])` of two names in its __call__ where one name is a text-side projection."""
    from integrate.resolve import Workspace

    att = next((a for a in plan["facts"].get("attention", []) if a.get("block_list") == attr and a.get("processor_at")),
               None)
    if att is None:
        return None
    src = Workspace().load(Path(att["processor_at"]["file"]))
    cls = src.classes.get(att["processor"] or "")
    fn = find_method(cls, "__call__") if cls is not None else None
    if fn is None:
        return None
    text_words = ("encoder", "added", "context", "txt", "text")
    for call in _calls(fn):
        if dotted(call.func) not in ("torch.cat", "torch.concat") or not call.args:
            continue
        seq = call.args[0].value
        if not isinstance(seq, (cst.List, cst.Tuple)) or len(seq.elements) != 2:
            continue
        names = [dotted(e.value) or "" for e in seq.elements]
        if not any("query" in n or "key" in n for n in names):
            continue
        first_text, second_text = (any(w in n for w in text_words) for n in names)
        if first_text != second_text:
            return second_text
    return None


def _calls(node: cst.CSTNode) -> list[cst.Call]:
    found: list[cst.Call] = []

    class V(cst.CSTVisitor):
        def visit_Call(self, n: cst.Call) -> None:
            found.append(n)

    node.visit(V())
    return found


def _joined_inputs(plan: dict) -> dict[str, dict[str, str]]:
    """{list: {row-wise Linear fed by [attention | mlp]: the column-wise Linear whose width is the first part}}."""
    out: dict[str, dict[str, str]] = {}
    for attr, roles in plan["facts"]["linears"].items():
        joined = [r for r in roles if r.get("fused_out_down")]
        if not joined:
            continue
        attn = next((a for a in plan["facts"]["attention"] if a["block_list"] == attr), None)
        first = attn["in_projs"][0] if attn and attn["in_projs"] else None
        if first:
            out[attr] = {r["path"]: first for r in joined}
    return out


def _distributed_norms(plan: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for a in plan["facts"]["attention"]:
        head = a["head_dim"][1] if a.get("head_dim") else None
        for norm, size in (a.get("qk_norms") or {}).items():
            if size is not None and head is not None and size != head:
                out.setdefault(a["block_list"], []).append(f"{a['path']}.{norm}")
    return out


def _te_layer_plans(tp_plan: dict[str, str]) -> dict[str, dict[str, str]]:
    """`layers.*.self_attn.q_proj: colwise` -> {"layers": {"self_attn.q_proj": "colwise"}}."""
    out: dict[str, dict[str, str]] = {}
    for key, style in tp_plan.items():
        prefix, sep, rest = key.partition(".*.")
        if sep:
            out.setdefault(prefix, {})[rest] = style
    return out


def checkout_layout(gen: Generated, plan: dict):
    """Where each generated module goes in a cache-dit tree, and the registration it needs."""
    from integrate.checkout import Artifact, Registration

    name = plan["model"]["example_name"]
    places = {
        "adapter": (f"caching/block_adapters/adapter_{name}.py", "adapter", f".adapter_{name}"),
        "patch_functor": (f"caching/patch_functors/functor_{name}.py", None, None),
        "cp_planner": (f"distributed/transformers/{name}.py", "cp_planner", f".{name}"),
        "tp_planner": (f"distributed/transformers/{name}_tp.py", "tp_planner", f".{name}_tp"),
        "example": (f"_utils/example_{name}.py", "example", f".example_{name}"),
    }
    artifacts, registrations = [], []
    for piece in gen.pieces:
        if piece.role == "te_planner":
            rel, kind, module = (f"distributed/text_encoders/{piece.module}_{name}.py", "te_planner",
                                 f".{piece.module}_{name}")
        else:
            rel, kind, module = places[piece.role]
        artifacts.append(Artifact(rel, "# Generated by integrate\n" + piece.text))
        if kind:
            registrations.append(Registration(kind, module, piece.symbol))
    m = plan["model"]
    registrations.append(Registration("env_path", "", m["env_var"], m["model_path"]))
    return artifacts, registrations


def _package_imports(modules: list[str]) -> str:
    line = f"from . import {', '.join(modules)}  # noqa: F401"
    if len(line) <= 88:
        return line
    return "from . import (  # noqa: F401\n" + "".join(f"    {m},\n" for m in modules) + ")"
