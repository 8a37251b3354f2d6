"""Parallelism facts: block structure (attention, FFN, modulation, kernels) and sequence flow.

`parallel_facts(gate, ws, analysis)` gathers what the CP / TP / TE-P / VAE-P decisions read,
statically: the module tree of each block list's element 0 with sizes traced from the
transformer's config.json, the attention processors, the role of every Linear, kernels that are
unsafe under DTensor, how sequence tensors flow through forward, a `_cp_plan` declared by
diffusers, and the text encoders / VAE from model_index.json.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import libcst as cst
from integrate.gate.records import GateReport

from integrate import jsonfile
from integrate.defuse import defuse
from integrate.records import OMIT, Evidence
from integrate.resolve import Workspace
from integrate.source import SourceFile, dotted, find_method
from integrate.syntax import find_all, params_of, self_member, target_names

from .attention import processor_argument, processor_class, attention_facts, int_value, is_attention, is_kernel_call
from .bases import model_mixin
from .cfg import loop_model_calls
from .encoders import text_encoder_facts, vae_facts
from .forward import documented_entries, documented_ranks, documented_shapes
from .modules import Node, Tree, module_tree
from .ndim import last_assignment, ndim_of
from .records import (
    AttentionFact,
    BlockList,
    BlockStructure,
    LinearRole,
    MaskFact,
    ModuleFact,
    ParallelFacts,
    PositionLayout,
    SequenceFact,
    SubModuleCall,
    TransformerFacts,
)
from .sequence import mask_kind, sequence_facts
from .support import (cp_attention_classes, cp_local_backends, cp_refuses_gqa, ring_refuses_masks,
                      tp_requires_model_mixin)
from .values import evaluate, jsonable

_KERNEL_MODULES = ("flash_attn", "triton", "apex", "xformers", "liger_kernel", "flashinfer", "sageattention")


def load_config(config_file: str | None) -> dict[str, Any]:
    """The transformer's config (the gate's `config_file` fact) without its `_` keys; {} when there is none."""
    if not config_file:
        return {}
    path = Path(config_file)
    if not path.is_file():
        return {}
    data = jsonfile.read(path)
    jsonfile.check_config(path, data)
    return {k: v for k, v in data.items() if not k.startswith("_")}


def read_model_index(model_path: str | None) -> dict | None:
    if not model_path:
        return None
    path = Path(model_path) / "model_index.json"
    return jsonfile.read(path) if path.is_file() else None


def parallel_facts(gate: GateReport, ws: Workspace, transformer: TransformerFacts) -> ParallelFacts:
    t_src = ws.load(Path(gate.value("transformer_file")))
    cls = t_src.classes[gate.value("transformer_class")]
    model_path = gate.value("model_path")
    config = load_config(gate.value("config_file"))
    tree = module_tree(ws, t_src, cls, config)
    blocks = []
    for bl in transformer.block_lists:
        if bl.is_blocks:
            blocks += [block_structure(ws, tree, path, bl.block_class) for path in list_paths(tree, bl)]
    seq = sequence_facts(ws, t_src, cls, tree, transformer.block_lists)
    top = tuple(_module_fact(n, "") for p, n in tree.nodes.items() if p and "." not in p)
    cp_plan, cp_at = declared_cp_plan(ws, t_src, cls)
    index = read_model_index(model_path)
    ndims = {**documented_ndims(t_src, cls), **pipeline_arg_ndims(ws, gate)}
    mp = Path(model_path) if model_path else None
    is_model, model_why = model_mixin(ws, t_src, cls)
    return ParallelFacts(
        config={k: v for k, v in config.items() if jsonable(v) is not None},
        blocks=tuple(blocks),
        sequence=seq,
        top_modules=top,
        position_modules=_position_modules(ws, tree, seq),
        diffusers_cp_plan=cp_plan,
        diffusers_cp_plan_at=cp_at,
        pipeline_masks=pipeline_masks(ws, gate),
        pipeline_arg_ndims={k: v[0] for k, v in ndims.items()},
        pipeline_arg_ndims_at={k: v[1] for k, v in ndims.items()},
        text_encoders=text_encoder_facts(ws, mp, index),
        vae=vae_facts(ws, mp, index),
        ring_refuses_masks=ring_refuses_masks(ws),
        cp_refuses_gqa=cp_refuses_gqa(ws),
        cp_local_backends=cp_local_backends(ws),
        model_mixin=is_model,
        model_mixin_at=Evidence(str(t_src.path), t_src.line(cls), model_why),
        tp_requires_model_mixin=tp_requires_model_mixin(ws),
        cp_attention_classes=(cp_attention_classes(ws) or (None, None))[1],
        regrouping=_regrouping(ws, tree, t_src, cls, seq),
    )


def _regrouping(ws: Workspace, tree: Tree, src: SourceFile, cls: cst.ClassDef, seq: SequenceFact | None) -> tuple:
    """Attention modules beside the blocks (`self.face_adapter[i](hidden_states, motion_vec)` in a block loop's
    body) whose processor lays the stream's sequence axis out by a count read from the shape of another input: a
    per-frame regrouping (`B, T, N, C = encoder_hidden_states.shape; query.unflatten(1, (T, -1))`). On a rank's
    share of the sequence the groups no longer line up with the other input's frames. (the list, hook key, the
    module forward's parameter that takes the stream, evidence)."""
    fwd = find_method(cls, "forward")
    if fwd is None or seq is None:
        return ()
    out = []
    for lf in seq.lists:
        loop = next((x for x in find_all(fwd, cst.For) if src.line(x) == lf.loop_line), None)
        if loop is None:
            continue
        streams = set(lf.streams.values())
        for call in find_all(loop.body, cst.Call):
            indexed = isinstance(call.func, cst.Subscript)
            member = self_member(call.func.value if indexed else call.func)
            node = tree.nodes.get(f"{member}.0" if indexed else member or "")
            if member is None or member == lf.attr or node is None or node.cls_node is None \
                    or not is_attention(ws, node):
                continue
            module_fwd = find_method(node.cls_node[1], "forward")
            params = [p.name.value for p in params_of(module_fwd) if p.name.value != "self"] if module_fwd else []
            passed = [params[i] for i, a in enumerate(call.args) if a.keyword is None and i < len(params)
                      and isinstance(a.value, cst.Name) and a.value.value in streams]
            passed += [a.keyword.value for a in call.args if a.keyword is not None and isinstance(a.value, cst.Name)
                       and a.value.value in streams]
            at = _regrouped_at(ws, node) if len(passed) == 1 else None
            if at is not None:
                out.append((lf.attr, f"{member}.*" if indexed else member, passed[0], at))
    return tuple(out)


def _regrouped_at(ws: Workspace, node: Node) -> Evidence | None:
    """Where the processor `node` runs (else its forward) unflattens its query stream's dim 1 by a count read
    from another input's `.shape`."""
    proc = processor_argument(ws, node) or processor_class(ws, *node.cls_node)
    src, cls = proc if proc is not None else node.cls_node
    fn = find_method(cls, "__call__" if proc is not None else "forward")
    params = [p.name.value for p in params_of(fn) if p.name.value != "self"] if fn is not None else []
    if proc is not None:
        params = params[1:]  # the attention module itself
    if len(params) < 2:
        return None
    stream, others = params[0], set(params[1:])

    def tags(value: cst.BaseExpression) -> set[str]:
        shaped = {a.value.value for a in find_all(value, cst.Attribute)
                  if a.attr.value in ("shape", "size") and isinstance(a.value, cst.Name) and a.value.value in others}
        return {"count:" + n for n in shaped}

    flow = defuse(src, fn).lineage(seed=tags, initial=lambda n: {"stream"} if n == stream else ())
    for call in find_all(fn, cst.Call):
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "unflatten" and len(call.args) >= 2):
            continue
        dim = call.args[0].value
        line = src.line(call)
        if not (isinstance(dim, cst.Integer) and dim.value == "1") or "stream" not in flow.reads(call.func.value, line):
            continue
        counts = sorted(t.split(":", 1)[1] for t in flow.reads(call.args[1].value, line) | tags(call.args[1].value)
                        if t.startswith("count:"))
        if counts:
            return Evidence(str(src.path), line, f"{cls.name.value}: `{src.code(call)[:60]}` lays the sequence out by a "
                                                 f"count read from the shape of `{counts[0]}`")
    return None


# -- blocks ---------------------------------------------------------------------------------


def list_paths(tree: Tree, bl: BlockList) -> list[str]:
    """The module paths of the ModuleLists a block list stands for: its attribute, or for a ModuleDict of
    ModuleLists each entry the module tree built (`mode_blocks.image`, `mode_blocks.image_cond`)."""
    if bl.container != "ModuleDict of ModuleList":
        return [bl.attr]
    keyed = [p for p in tree.nodes if p.startswith(bl.attr + ".") and p.count(".") == bl.attr.count(".") + 1]
    return keyed or [bl.attr]


def block_structure(ws: Workspace, tree: Tree, attr: str, block_class: str | None) -> BlockStructure:
    container = tree.nodes.get(attr)
    root = f"{attr}.0"
    if root not in tree.nodes:
        keyed = [p for p in tree.nodes if p.startswith(attr + ".") and p.count(".") == 1]
        root = keyed[0] if keyed else root
    block = tree.nodes.get(root)
    length = int_value(container.length) if container is not None and container.length is not None else None
    if block is None or block.cls_node is None:
        why = (f"`{attr}` is not built for this config (its constructor branch is not taken)" if container is None
               else f"element 0 of `{attr}` could not be built statically")
        return BlockStructure(attr, block_class, length, (), (), (), (), (), unknowns=(why,),
                              built=container is not None)
    prefix = root + "."
    modules = tuple(_module_fact(n, root) for p, n in tree.nodes.items() if p.startswith(prefix))
    atts: list[AttentionFact] = []
    att_files: list[str] = []  # each attention class's source file: its imports may bring kernels too
    for path, node in list(tree.nodes.items()):
        if path.startswith(prefix) and node.kind == "module" and is_attention(ws, node):
            outer = next((i for i, a in enumerate(atts) if path.startswith(f"{root}.{a.path}.")), None)
            if outer is not None:
                # an attention nested in another one: it stands for the outer where the outer is only a wrapper
                # named like attention, with no processor and no kernel of its own (RFD4Proteina's `mhba` around
                # its `mhba.mha`, whose processor calls the dispatcher)
                if atts[outer].kernel is None and atts[outer].processor is None:
                    atts[outer] = attention_facts(ws, tree, node, root, attr)
                    att_files[outer] = str(node.cls_node[0].path)
                continue
            atts.append(attention_facts(ws, tree, node, root, attr))
            att_files.append(str(node.cls_node[0].path))
    roles = _linear_roles(ws, tree, block, root, atts)
    tables = tuple(p[len(prefix):] for p, n in tree.nodes.items() if p.startswith(prefix) and n.kind == "parameter")
    b_src, b_cls = block.cls_node
    kernels = _kernels(ws, [b_src] + [ws.load(Path(f)) for f in att_files])
    unknowns = [u for a in atts for u in a.unknowns]
    if not atts:
        unknowns.append(f"no attention module found in {b_cls.name.value}")
    routing = [(path, e) for path in sorted({r.path.rpartition(".")[0] for r in roles if r.role == "router"})
               if (e := _token_routing(tree.nodes.get(f"{root}.{path}"))) is not None]
    subs = [a.path for a in atts] + sorted({r.path.split(".")[0] for r in roles if r.role in ("ffn_in", "ffn_out")}
                                           | {path for path, _ in routing})
    surgery, calls = _block_surgery(ws, tree, block, root, subs)
    return BlockStructure(
        attr=attr, block_class=b_cls.name.value, length=length, modules=modules,
        attentions=tuple(atts), linears=roles, tables=tables, kernels=kernels,
        evidence=(Evidence(str(b_src.path), b_src.line(b_cls), f"element 0 of `{attr}`: {b_cls.name.value}"),),
        unknowns=tuple(unknowns), surgery=surgery, calls=calls, token_routing=tuple(routing),
        unread=_unread_calls(tree, block, root),
        kernel_slices=tuple(e for a in atts for e in _kernel_slices(ws, tree.nodes.get(f"{root}.{a.path}"), attr)))


def _kernel_slices(ws: Workspace, node: Node | None, attr: str) -> tuple[Evidence, ...]:
    """`dispatch_attention_fn(query[:, start:end], key[:, :end], ...)` in the processor an attention module runs:
    query, key or value cut along dim 1, the sequence axis of the [B, S, H, D] layout diffusers' dispatcher takes.
    Under Ulysses the dispatcher gathers the sequence inside the call, so before it each rank holds a share, and
    a slice by positions of the whole sequence picks other tokens there (or none)."""
    if node is None or node.cls_node is None:
        return ()
    proc = processor_argument(ws, node) or processor_class(ws, *node.cls_node)
    src, cls = proc if proc is not None else node.cls_node
    fn = find_method(cls, "__call__" if proc is not None else "forward")
    if fn is None:
        return ()
    out = []
    for call in find_all(fn, cst.Call):
        if (dotted(call.func) or "").rsplit(".", 1)[-1] != "dispatch_attention_fn":
            continue
        for arg in [a for a in call.args if a.keyword is None][:3]:
            value = arg.value
            if not (isinstance(value, cst.Subscript) and len(value.slice) >= 2):
                continue
            first, second = value.slice[0].slice, value.slice[1].slice
            whole = (isinstance(first, cst.Slice) and first.lower is None and first.upper is None
                     and first.step is None)
            if whole and isinstance(second, cst.Slice) and (second.lower is not None or second.upper is not None):
                out.append(Evidence(str(src.path), src.line(call),
                                    f"`{attr}[i]`: {cls.name.value} hands the attention kernel `{src.code(value)}`, "
                                    "cut along the sequence axis at positions of the whole sequence: under CP each "
                                    "rank holds a share of it there (Ulysses gathers inside the kernel call)"))
                break
    return tuple(dict.fromkeys(out))


def _unread_calls(tree: Tree, block: Node, root: str) -> tuple[Evidence, ...]:
    """The block forward's calls, with its stream (its first input), to a child module the tree holds as `unknown`:
    built from a class handed to the constructor, whose forward the analysis never reads."""
    prefix = root + "."
    unread = {p[len(prefix):]: n for p, n in tree.nodes.items()
              if p.startswith(prefix) and p.count(".") == prefix.count(".") and n.kind == "unknown"}
    src, cls = block.cls_node
    fwd = find_method(cls, "forward") if unread else None
    if fwd is None:
        return ()
    names = [p.name.value for p in params_of(fwd) if p.name.value != "self"]
    if not names:
        return ()
    derived = defuse(src, fwd).lineage(seed=lambda value: (), initial=lambda n: {n} if n == names[0] else ())
    out = []
    for call in find_all(fwd, cst.Call):
        sub = self_member(call.func)
        line = src.line(call)
        if sub in unread and any(names[0] in derived.reads(a.value, line) for a in call.args):
            n = unread[sub]
            out.append(Evidence(str(src.path), line, f"`self.{sub}(...)` takes the sequence, and `self.{sub}` is built "
                                                     f"from `{n.cls}` (a class handed to the constructor, "
                                                     f"{Path(n.file).name}:{n.line}), whose forward is not read"))
    return tuple(dict.fromkeys(out))


def _token_routing(node: Node | None) -> Evidence | None:
    """Where an MoE layer's forward picks tokens from the whole sequence: a `topk` whose `k` is computed from the
    length of the tensor it is given (`bs, slen, dim = x.shape; capacity = ceil(factor * slen / experts)`: expert-choice
    routing, each expert taking its top tokens of the sequence). On a rank's share of the sequence each expert would
    pick among other tokens, and as many again per rank. None where no such call is read (token-choice routing ranks
    the experts of each token, which a share of the sequence leaves as it is)."""
    if node is None or node.cls_node is None:
        return None
    src, cls = node.cls_node
    fwd = find_method(cls, "forward")
    params = [p.name.value for p in params_of(fwd) if p.name.value != "self"] if fwd is not None else []
    if not params:
        return None
    stream = params[0]

    def length_of_stream(value: cst.BaseExpression) -> set[str]:
        """{"length"} where `value` reads the size of the stream: `x.shape`, `x.size(...)`."""
        for a in find_all(value, cst.Attribute):
            if a.attr.value in ("shape", "size") and isinstance(a.value, cst.Name) and a.value.value == stream:
                return {"length"}
        return set()

    lengths = defuse(src, fwd).lineage(seed=length_of_stream)
    for call in find_all(fwd, cst.Call):
        if (dotted(call.func) or "").rsplit(".", 1)[-1] != "topk":
            continue
        method = isinstance(call.func, cst.Attribute) and not (dotted(call.func) or "").startswith("torch.")
        positional = [a for a in call.args if a.keyword is None]
        k = next((a for a in call.args if a.keyword is not None and a.keyword.value == "k"),
                 positional[0 if method else 1] if len(positional) > (0 if method else 1) else None)
        line = src.line(call)
        if k is not None and (length_of_stream(k.value) or "length" in lengths.reads(k.value, line)):
            return Evidence(str(src.path), line, f"{cls.name.value}: `{src.code(call)[:60]}` takes `k` from the "
                                                 f"length of `{stream}`: each expert picks its tokens from the whole "
                                                 "sequence (expert-choice routing)")
    return None


_LAYOUTS = ("unflatten", "view", "reshape")  # tensor methods that lay a sequence out by sizes


def _block_surgery(ws: Workspace, tree: Tree, block: Node, root: str, subs: list[str]):
    """Does the block cut its stream by a length from a non-tensor input (a global count)? And its sub-module calls."""
    src, cls = block.cls_node
    fwd = find_method(cls, "forward")
    if fwd is None:
        return (), ()
    params = params_of(fwd)
    names = [p.name.value for p in params if p.name.value != "self"]
    ints = {p.name.value for p in params if p.annotation is not None and "int" in src.code(p.annotation.annotation)
            and "Tensor" not in src.code(p.annotation.annotation)}
    stream = names[0] if names else None
    positions = {n for n in names if any(w in n.lower() for w in ("rotary", "rope", "freqs", "pos_emb"))}
    # which of forward's parameters reach each local (a parameter reaches itself)
    derived = defuse(src, fwd).lineage(seed=lambda value: (), initial=lambda n: {n} if n in names else ())
    path = str(src.path)
    surgery: list[Evidence] = []
    for call in find_all(fwd, cst.Call):
        name = dotted(call.func) or ""
        if name in ("torch.split", "torch.tensor_split") or (isinstance(call.func, cst.Attribute)
                                                              and call.func.attr.value in ("split", "split_with_sizes")):
            reads: set[str] = set()
            for a in call.args[1:] if name.startswith("torch.") else call.args:
                reads |= derived.reads(a.value)
            hit = sorted(reads & ints)
            if hit:
                surgery.append(Evidence(path, src.line(call), f"`{src.code(call)[:70]}` cuts the sequence by "
                                        f"`{hit[0]}`, a length passed in as a number: wrong on a local chunk"))
        elif isinstance(call.func, cst.Attribute) and call.func.attr.value in _LAYOUTS and stream is not None \
                and stream in derived.reads(call.func.value):
            # `x.unflatten(1, (frames, height, width))`: the tokens laid out on a grid whose sizes come in as numbers
            # (a convolution over it follows); on a local chunk the sizes no longer multiply up to its length
            sizes = call.args[1:] if call.func.attr.value == "unflatten" else call.args
            hit = sorted({r for a in sizes for r in derived.reads(a.value)} & ints)
            if hit:
                surgery.append(Evidence(path, src.line(call), f"`{src.code(call)[:70]}` lays the sequence out by "
                                        f"`{hit[0]}`, a size passed in as a number: wrong on a local chunk"))
    calls: list = []
    for call in find_all(fwd, cst.Call):
        sub = self_member(call.func)
        if sub not in subs:
            continue
        node = tree.nodes.get(f"{root}.{sub}")
        target = None
        if node is not None and node.cls_node is not None:
            n_src, n_cls = node.cls_node
            target = find_method(n_cls, "forward")
        sub_params = [p.name.value for p in params_of(target) if p.name.value != "self"] if target else []
        inputs: dict[str, str] = {}
        sources: dict[str, tuple[str, ...]] = {}
        passes: dict[str, str] = {}
        positional = [a for a in call.args if a.keyword is None]
        bound = list(zip(sub_params, positional)) + [(a.keyword.value, a) for a in call.args if a.keyword is not None]
        for pname, arg in bound:
            reads = derived.reads(arg.value)
            role = "stream" if stream in reads else "position" if reads & positions else "other"
            inputs[pname] = role
            sources[pname] = tuple(sorted(reads & set(names)))
            if isinstance(arg.value, cst.Name) and arg.value.value in names:
                passes[pname] = arg.value.value
        calls.append(SubModuleCall(sub, inputs, Evidence(path, src.line(call), f"`self.{sub}(...)`"), sources,
                                   passes))
    return tuple(surgery), tuple(calls)


def _module_fact(n: Node, root: str) -> ModuleFact:
    rel = n.path[len(root) + 1:] if root else n.path
    shape = None
    if n.shape is not None:
        shape = (jsonable(n.shape[0]) if isinstance(jsonable(n.shape[0]), int) else None,
                 jsonable(n.shape[1]) if isinstance(jsonable(n.shape[1]), int) else None)
    return ModuleFact(rel, n.cls, n.kind, shape, n.conditional, n.file, n.line)


def _linear_roles(ws: Workspace, tree: Tree, block: Node, root: str, atts: list[AttentionFact]) -> tuple:
    """Every Linear in element 0: attention in/out, FFN in/out, modulation, or a block-level projection."""
    prefix = root + "."
    roles: dict[str, LinearRole] = {}
    for a in atts:
        where = ("the attention kernel" if a.kernel is not None else
                 "the attention computed from q, k and v (no kernel call: its input derives from theirs)")
        for p in a.in_projs:
            roles[p] = LinearRole(p, "attention_in", f"{a.processor or a.cls} calls it before {where}")
        for p in a.out_projs:
            roles[p] = LinearRole(p, "attention_out", f"{a.processor or a.cls} calls it after {where}")
    att_paths = [a.path for a in atts]
    linears = [(p[len(prefix):], n) for p, n in tree.nodes.items() if p.startswith(prefix) and n.kind == "linear"]
    children = [p[len(prefix):] for p in tree.nodes if p.startswith(prefix) and p.count(".") == prefix.count(".")]
    for child in children:
        if child in att_paths:
            continue
        node = tree.nodes[prefix + child]
        inner = [rel for rel, _ in linears if rel.startswith(child + ".")]
        if node.kind == "module" and _is_norm_or_mod(child, node):
            for rel in inner:
                roles.setdefault(rel, LinearRole(rel, "modulation", f"inside {node.cls} `{child}`: its output is "
                                                 "shift/scale/gate, needed whole on every rank"))
        elif node.kind in ("module", "container") and len(inner) >= 2:
            if _is_modulation_name(child):
                for rel in inner:
                    roles.setdefault(rel, LinearRole(rel, "modulation", f"`{child}` produces modulation"))
                continue
            # an MoE layer: a router Linear (its scores pick tokens per expert) and a shared expert that is an
            # FFN of its own, beside the experts: each part gets its own roles
            for rel, why in _routers(node, child, inner).items():
                roles.setdefault(rel, LinearRole(rel, "router", f"{node.cls} `{child}`: {why}"))
            inner = [rel for rel in inner if rel not in roles]
            for sub in _nested_ffns(tree, prefix, child, inner):
                sub_inner = [rel for rel in inner if rel.startswith(sub + ".")]
                _ffn_roles(tree, prefix, roles, tree.nodes[prefix + sub], sub, sub_inner)
                inner = [rel for rel in inner if rel not in sub_inner]
            if len(inner) >= 2:
                _ffn_roles(tree, prefix, roles, node, child, inner)
        elif len(inner) == 1 and _is_modulation_name(child):
            roles.setdefault(inner[0], LinearRole(inner[0], "modulation", f"`{child}` produces modulation"))
    loose = [rel for rel, _ in linears if rel not in roles and "." not in rel]
    if loose:
        # an attention with an output projection of its own hands back a whole (row-wise reduced) tensor; one
        # without (Flux's single blocks) hands back its heads, sharded under TP, to the block's own Linears
        sharded = [a.path for a in atts if not a.out_projs]
        for rel, role in _block_dataflow(block, loose, sharded).items():
            roles[rel] = role
    for rel, _ in linears:
        roles.setdefault(rel, LinearRole(rel, "unknown", "not reached by any rule"))
    return tuple(roles[rel] for rel, _ in linears if rel in roles)


def _forward(node: Node | None) -> tuple[SourceFile, cst.FunctionDef] | None:
    """(source, forward) of the class a module node was built from; None when its class or forward is not read."""
    if node is None or node.cls_node is None:
        return None
    src, cls = node.cls_node
    fwd = find_method(cls, "forward")
    return (src, fwd) if fwd is not None else None


def _chunked(tree: Tree, prefix: str, rel: str) -> tuple[int, str, str] | None:
    """(n, where, the cutting module's path under `prefix`) when the module holding the Linear at `rel`, or the
    activation module it hands the output to, cuts that Linear's output into n equal parts in its forward
    (`h, gate = self.proj(x).chunk(2, dim=-1)`: a GLU's fused up-projection); None otherwise."""
    owner_rel, _, leaf = rel.rpartition(".")
    found = _forward(tree.nodes.get(prefix + owner_rel) if owner_rel else None)
    if found is None:
        return None
    src, fwd = found

    def mine(value: cst.BaseExpression) -> set[str]:
        return {"out"} if any(self_member(c.func) == leaf for c in find_all(value, cst.Call)) else set()

    fed = defuse(src, fwd).lineage(seed=mine)

    def carries(value: cst.BaseExpression, line: int) -> bool:
        return bool(mine(value) or fed.reads(value, line))

    found = _cut(src, fwd, carries)
    if found is not None and len(found) == 2:  # a width read from an attribute is not followed inside an FFN
        return (*found, owner_rel)
    # the activation module it hands the output to cuts it (Flux2 / Flux3's SwiGLU: `x[..., :half]`, `x[..., half:]`)
    for call in find_all(fwd, cst.Call):
        sub = self_member(call.func)
        if sub is None or sub == leaf or not call.args or not carries(call.args[0].value, src.line(call)):
            continue
        inner = _forward(tree.nodes.get(prefix + (f"{owner_rel}.{sub}" if owner_rel else sub)))
        if inner is None:
            continue
        i_src, i_fwd = inner
        names = [p.name.value for p in params_of(i_fwd) if p.name.value != "self"]
        if names:
            got = _cut(i_src, i_fwd, lambda value, line, first=names[0]: first in {n.value for n in find_all(
                value, cst.Name)} and isinstance(value, cst.Name))
            if got is not None:
                return (*got, f"{owner_rel}.{sub}" if owner_rel else sub)
    return None


def split_by_width(src: SourceFile, call: cst.Call) -> tuple[cst.BaseExpression, int, str] | None:
    """(the tensor, n, the attribute each part's width is read from) of `torch.split(x, [self.w, self.w], dim=-1)`
    or `x.split([self.w, self.w], dim=-1)`: n equal parts of the last axis whose width is an attribute of the
    module (`mlp_hidden_dim`), which a sharded projection needs divided; None for anything else (literal widths
    cannot follow a shard)."""
    name = dotted(call.func)
    args = [a for a in call.args if a.keyword is None]
    dims = [a.value for a in call.args if a.keyword is not None and a.keyword.value == "dim"]
    if name in ("torch.split", "torch.functional.split") and len(args) >= 2:
        tensor, sizes = args[0].value, args[1].value
        dims += [a.value for a in args[2:3]]
    elif isinstance(call.func, cst.Attribute) and call.func.attr.value == "split" and args and name not in (
            "torch.split", "torch.functional.split"):
        tensor, sizes = call.func.value, args[0].value
        dims += [a.value for a in args[1:2]]
    else:
        return None
    if not (isinstance(sizes, (cst.List, cst.Tuple)) and len(sizes.elements) > 1 and len(dims) == 1):
        return None
    dim = dims[0]
    if not (isinstance(dim, cst.UnaryOperation) and isinstance(dim.operator, cst.Minus)
            and isinstance(dim.expression, cst.Integer) and dim.expression.value == "1"):
        return None
    widths = {self_member(e.value) for e in sizes.elements}
    if len(widths) != 1 or None in widths:
        return None
    return tensor, len(sizes.elements), widths.pop()


def _cut(src: SourceFile, fwd: cst.FunctionDef, carries) -> tuple[int, str] | tuple[int, str, str] | None:
    """(n, where) for the first cut of a tensor `carries(value, line)` accepts into n equal parts: `x.chunk(n)`
    with n > 1, or its two halves by slices of the last axis (`x[..., :half]` and `x[..., half:]`); (n, where, the
    module attribute holding each part's width) for `torch.split(x, [self.w, self.w], dim=-1)`."""
    for call in find_all(fwd, cst.Call):
        split = split_by_width(src, call)
        if split is not None and carries(split[0], src.line(call)):
            code = " ".join(src.code(call).split())
            return split[1], f"`{code[:60]}`, {Path(src.path).name}:{src.line(call)}", split[2]
    for call in find_all(fwd, cst.Call):
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "chunk" and call.args):
            continue
        target, line = call.func.value, src.line(call)
        if not carries(target, line):
            continue
        n = call.args[0].value
        if isinstance(n, cst.Integer) and int(n.value) > 1:
            return int(n.value), f"`{src.code(call)[:60]}`, {Path(src.path).name}:{line}"
    halves: dict[str, set[str]] = {}
    for sub in find_all(fwd, cst.Subscript):
        line = src.line(sub)
        if not carries(sub.value, line) or len(sub.slice) != 2:
            continue
        first, last = sub.slice[0].slice, sub.slice[1].slice
        if not (isinstance(first, cst.Index) and isinstance(first.value, cst.Ellipsis) and isinstance(last, cst.Slice)):
            continue
        if last.lower is None and last.upper is not None and last.step is None:
            halves.setdefault(src.code(last.upper), set()).add("low")
        elif last.upper is None and last.lower is not None and last.step is None:
            halves.setdefault(src.code(last.lower), set()).add("high")
        for bound, sides in halves.items():
            if sides == {"low", "high"}:
                return 2, f"`{src.code(sub.value)}[..., :{bound}]` and `[..., {bound}:]`, {Path(src.path).name}:{line}"
    return None


def _ffn_roles(tree: Tree, prefix: str, roles: dict, node: Node, child: str, inner: list[str]) -> None:
    """One FFN: its down projection, and every other Linear in it projecting up."""
    down, why = _ffn_down(node, child, inner)
    for rel in inner:
        if rel != down:
            parts = _chunked(tree, prefix, rel)
            cutter = tree.nodes.get(prefix + parts[2]) if parts else None
            roles.setdefault(rel, LinearRole(
                rel, "ffn_in", f"{node.cls} `{child}`: projects up" + (
                    f"; its output is cut into {parts[0]} equal parts ({parts[1]})" if parts else ""),
                parts=parts[0] if parts else OMIT,
                parts_by=(parts[2], cutter.cls.rpartition(".")[2]) if cutter is not None else OMIT))
    roles.setdefault(down, LinearRole(down, "ffn_out", f"{node.cls} `{child}`: projects back down ({why})"))


def _nested_ffns(tree: Tree, prefix: str, child: str, inner: list[str]) -> list[str]:
    """Sub-modules of `child` (not containers) that hold two or more of its Linears and leave others outside
    them: an FFN of their own (an MoE layer's shared expert), outermost first."""
    found: list[str] = []
    for path, n in tree.nodes.items():
        rel = path[len(prefix):] if path.startswith(prefix) else None
        if rel is None or not rel.startswith(child + ".") or n.kind != "module":
            continue
        held = [r for r in inner if r.startswith(rel + ".")]
        if len(held) >= 2 and len(held) < len(inner) and not any(rel.startswith(f + ".") for f in found):
            found.append(rel)
    return found


_ROUTING = ("topk", "softmax", "sigmoid", "argmax", "argsort")


def _routers(node: Node, child: str, inner: list[str]) -> dict[str, str]:
    """{Linear: why} for the direct Linears of `child` whose output its forward ranks or normalises into
    routing scores (`topk`, `softmax`, ...): an MoE router, which every rank needs whole."""
    direct = {rel[len(child) + 1:]: rel for rel in inner if rel.count(".") == child.count(".") + 1}
    if node.cls_node is None or not direct:
        return {}
    src, cls = node.cls_node
    fwd = find_method(cls, "forward")
    if fwd is None:
        return {}
    fed = defuse(src, fwd).lineage(seed=lambda value: {m for c in find_all(value, cst.Call)
                                                       if (m := self_member(c.func)) in direct})
    out: dict[str, str] = {}
    for call in find_all(fwd, cst.Call):
        name = (dotted(call.func) or "").rsplit(".", 1)[-1]
        if name not in _ROUTING:
            continue
        line = src.line(call)
        reads = set()
        for a in call.args:
            reads |= fed.reads(a.value, line)
        if isinstance(call.func, cst.Attribute):
            reads |= fed.reads(call.func.value, line)
        for member in sorted(reads & set(direct)):
            out.setdefault(direct[member], f"a router: `{name}` ranks its output (line {line}), so every rank "
                                           "needs its scores whole")
    return out


def _ffn_down(node: Node, child: str, inner: list[str]) -> tuple[str, str]:
    """The FFN's down projection: the Linear whose input holds another Linear's output in forward."""
    direct = {rel[len(child) + 1:]: rel for rel in inner if rel.count(".") == child.count(".") + 1}
    if node.cls_node is not None and len(direct) >= 2:
        src, cls = node.cls_node
        fwd = find_method(cls, "forward")
        if fwd is not None:
            def projections(value: cst.BaseExpression) -> set[str]:
                return {m for c in find_all(value, cst.Call) if (m := self_member(c.func)) in direct}

            fed = defuse(src, fwd).lineage(seed=projections)
            for call in find_all(fwd, cst.Call):
                name = self_member(call.func)
                if name not in direct:
                    continue
                line = src.line(call)
                inside = {self_member(c.func) for a in call.args for c in find_all(a.value, cst.Call)}
                for a in call.args:
                    inside |= fed.reads(a.value, line)
                if inside & (set(direct) - {name}):
                    return direct[name], f"`self.{name}` takes the other projections' output (line {src.line(call)})"
    return inner[-1], "last Linear registered"


def _is_modulation_name(name: str) -> bool:
    low = name.lower()
    return "mod" in low.split("_") or low.endswith("_mod") or "adaln" in low or "modulation" in low


def _is_norm_or_mod(name: str, node: Node) -> bool:
    return "Norm" in node.cls or _is_modulation_name(name)


def _block_dataflow(block: Node, loose: list[str], att_paths: list[str]) -> dict[str, LinearRole]:
    """Block-level Linears: fed by the output of an attention that has no output projection (`att_paths`: its
    heads, sharded under TP) -> row-wise; fed only by other block-level Linears (an inline feed-forward's down
    projection, `down(silu(gate(x)) * up(x))`) -> row-wise, those feeding it column-wise; otherwise
    column-wise with a replicated output."""
    src, cls = block.cls_node
    fwd = find_method(cls, "forward")
    out: dict[str, LinearRole] = {}
    if fwd is None:
        return out
    def tags_of(value: cst.BaseExpression) -> set[str]:
        """`self.attn(...)` -> attn:attn, `self.proj_mlp(...)` -> linear:proj_mlp."""
        tags = set()
        for call in find_all(value, cst.Call):
            name = self_member(call.func)
            if name in att_paths:
                tags.add(f"attn:{name}")
            if name in loose:
                tags.add(f"linear:{name}")
        return tags

    index = defuse(src, fwd)
    origin = index.lineage(seed=tags_of)  # local -> {"attn:<path>", "linear:<path>"}
    inline = _inline_attention(src, fwd, loose)  # {linear: why}: projections of a kernel called inline
    paired: set[str] = set()
    for call in find_all(fwd, cst.Call):
        rel = self_member(call.func)
        if rel not in loose:
            continue
        tags: set[str] = set()
        nested: set[str] = set()  # loose Linears called inside the argument itself
        for arg in call.args:
            tags |= origin.reads(arg.value)
            for inner in find_all(arg.value, cst.Call):
                if (iname := self_member(inner.func)) in att_paths:
                    tags.add(f"attn:{iname}")
                elif iname in loose and iname != rel:  # `self.down(silu(self.gate(x)) * self.up(x))`
                    nested.add(iname)
        att = sorted(t for t in tags if t.startswith("attn:"))
        lin = sorted(t[7:] for t in tags if t.startswith("linear:") and t[7:] != rel)
        line = src.line(call)
        if rel in inline:
            out.setdefault(rel, LinearRole(rel, "inline_attention", inline[rel]))
            continue
        if att:
            why = f"its input carries the attention output (line {line})"
            if lin:
                why += f" joined with `{', '.join(lin)}` output: one weight serves two projections"
            out[rel] = LinearRole(rel, "block_out", why, fused_out_down=bool(lin))
        elif nested:  # only a direct call counts: by lineage, every later Linear reads the earlier ones
            out[rel] = LinearRole(rel, "block_out", f"its input is `{', '.join(sorted(nested))}` output (line {line}): "
                                                    "the down projection of a feed-forward written inline")
        else:
            # its output cut into equal parts by the block itself (`torch.split(self.proj_mlp(x), [self.w] * 2)`)
            cut = _cut(src, fwd, lambda value, at, rel=rel: any(self_member(c.func) == rel for c in find_all(
                value, cst.Call)) or f"linear:{rel}" in origin.reads(value, at))
            extra = {}
            if cut is not None:
                extra = {"parts": cut[0], "parts_by": ("", block.cls.rpartition(".")[2])}
                if len(cut) > 2:
                    extra["parts_width"] = cut[2]
            out.setdefault(rel, LinearRole(rel, "block_in", f"applied to the block input (line {line})" + (
                f"; its output is cut into {cut[0]} equal parts ({cut[1]})" if cut else ""), **extra))
        for fed in (lin if att else sorted(nested)):  # a projection feeding a row-wise one: a column/row pair
            paired.add(fed)
    return {k: dataclasses.replace(r, feeds_rowwise=True) if r.role == "block_in" and k in paired else r
            for k, r in out.items()}


_RESHAPES = frozenset({"view", "reshape", "transpose", "permute", "contiguous", "flatten", "unflatten", "squeeze",
                       "unsqueeze", "to", "type_as", "float", "half", "bfloat16"})


def _chain_base(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`self.q(h).view(b, s, n, -1).transpose(1, 2)` -> `self.q(h)`: the value under a chain of reshapes."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _RESHAPES:
        expr = expr.func.value
    return expr


def _inline_attention(src: SourceFile, fwd: cst.FunctionDef, loose: list[str]) -> dict[str, str]:
    """The block's own Linears around an attention kernel it calls inline (`F.scaled_dot_product_attention(q,
    k, v)`, no attention module): those whose output reaches the kernel's arguments and the one reading its
    output, each through a chain of reshapes only (a residual sum joins other values and ends the chain).
    {linear: why}; empty where the block calls no kernel."""
    def source(expr: cst.BaseExpression, before: int, depth: int = 0) -> cst.BaseExpression | None:
        """Through names and reshapes to the call that made `expr` (a name unpacked from a tuple ends it)."""
        expr = _chain_base(expr)
        if isinstance(expr, cst.Name) and depth < 8:
            value, element, line = last_assignment(src, fwd, expr.value, before)
            return source(value, line, depth + 1) if value is not None and element is None else None
        return expr if isinstance(expr, cst.Call) else None

    out: dict[str, str] = {}
    for call in find_all(fwd, cst.Call):
        if not is_kernel_call(call):
            continue
        line, kernel = src.line(call), dotted(call.func) or "the kernel"
        for arg in call.args[:3]:
            made = source(arg.value, line + 1)
            member = self_member(made.func) if made is not None else None
            if member in loose:
                out.setdefault(member, f"its output is an input of `{kernel}` (line {line}), an attention the block "
                                       "calls inline, with no attention module")
        for other in find_all(fwd, cst.Call):
            member = self_member(other.func)
            if member not in loose or member in out or not other.args or src.line(other) < line:
                continue
            made = source(other.args[0].value, src.line(other) + 1)
            if made is not None and is_kernel_call(made):
                out[member] = (f"its input is the output of `{kernel}` (line {line}): the output projection of an "
                               "attention the block calls inline")
    return out


def _kernels(ws: Workspace, srcs: list[SourceFile]) -> tuple[Evidence, ...]:
    out: list[Evidence] = []
    seen = set()
    for src in srcs:
        if src.path in seen:
            continue
        seen.add(src.path)
        top_level = {id(stmt) for stmt in src.module.body}
        for stmt in find_all(src.module, cst.SimpleStatementLine, skip_functions=False):
            for small in stmt.body:
                if isinstance(small, cst.Import):
                    modules = [dotted(a.name) or "" for a in small.names]
                elif isinstance(small, cst.ImportFrom) and small.module is not None:
                    modules = [dotted(small.module) or ""]
                else:
                    continue
                hits = [m for m in modules if m.split(".")[0] in _KERNEL_MODULES]
                if hits:
                    guarded = "" if id(stmt) in top_level else " (a guarded import: used only when enabled)"
                    out.append(Evidence(str(src.path), src.line(stmt), f"imports `{hits[0]}`: kernels that assume "
                                        f"whole tensors, unsafe under DTensor{guarded}"))
        for call in find_all(src.module, cst.Call, skip_functions=False):
            name = dotted(call.func) or ""
            if name in ("os.getenv", "os.environ.get"):
                out.append(Evidence(str(src.path), src.line(call), f"`{src.code(call)[:60]}`: an env-gated path"))
            elif name.startswith("torch.ops."):
                out.append(Evidence(str(src.path), src.line(call), f"custom op `{name}`"))
    return tuple(out)


# -- sequence ---------------------------------------------------------------------------------


def _position_modules(ws: Workspace, tree: Tree, seq: SequenceFact | None) -> dict[str, PositionLayout]:
    """For each module that produces a position input: how many tensors it returns and their layout."""
    out: dict[str, PositionLayout] = {}
    if seq is None:
        return out
    for lf in seq.lists:
        for bi in lf.inputs:
            if bi.role != "position" or bi.producer_kind != "module" or bi.producer in out:
                continue
            out[bi.producer] = _layout(tree.nodes.get(bi.producer))
    return out


def _layout(node: Node | None) -> PositionLayout:
    """Count returned tensors and read their last reshape: `x.reshape(1, f * h * w, 1, -1)` -> dims 4, split 1."""
    # a table over positions puts them first; its rank is not read, so the split checks none (a guessed rank of 2
    # made cache-dit skip Kandinsky6's [S, 1, D/2, 2, 2] audio RoPE, leaving it whole beside a split stream)
    unread = PositionLayout(None, 0, None, "low", "layout not read; assumed positions first, split dim 0 with no "
                                                  "rank check")
    found = _forward(node)
    if found is None:
        return unread
    src, fwd = found
    returns = find_all(fwd, cst.Return)
    if not returns or returns[-1].value is None:
        return unread
    value = returns[-1].value
    names = [el.value for el in value.elements] if isinstance(value, cst.Tuple) else [value]
    outputs = len(names)
    first = names[0]
    shaped = None
    if isinstance(first, cst.Name):
        for assign in find_all(fwd, cst.Assign):
            if any(first.value in target_names(t.target) for t in assign.targets):
                shaped = assign.value
    elif isinstance(first, cst.Call):
        shaped = first
    if isinstance(shaped, cst.Call) and isinstance(shaped.func, cst.Attribute) and shaped.func.attr.value in (
            "reshape", "view"):
        args = [a.value for a in shaped.args]
        dims = len(args)
        split = next((i for i, a in enumerate(args) if not (isinstance(a, cst.Integer) and a.value == "1")
                      and not (isinstance(a, cst.UnaryOperation))), 0)
        return PositionLayout(outputs, split, dims, "medium",
                              f"`{src.code(shaped)[:70]}` ({src.path.name}:{src.line(shaped)})")
    return dataclasses.replace(unread, outputs=outputs)


# -- masks the pipeline hands to the transformer ----------------------------------------------


def _pipeline_entry(ws: Workspace, gate: GateReport):
    """(source, pipeline class or None, entry function or None) of the gate's pipeline."""
    p_file = gate.value("pipeline_file")
    if not p_file:
        return None, None, None
    src = ws.load(Path(p_file))
    cls = src.classes.get((gate.value("pipeline_class") or "").split(".")[0])
    entry = find_method(cls, gate.pipeline_entry) if cls is not None else None
    return src, cls, entry or src.functions.get(gate.pipeline_entry)


def pipeline_masks(ws: Workspace, gate: GateReport) -> tuple[MaskFact, ...]:
    """`kwargs["attention_mask"] = ...`, `{"attention_mask": ...}` and `*_mask=` keywords in the pipeline entry."""
    src, _, entry = _pipeline_entry(ws, gate)
    if entry is None:
        return ()
    path = str(src.path)
    out: list[MaskFact] = []
    values: dict[str, cst.BaseExpression] = {}
    for assign in find_all(entry, cst.Assign):
        for t in assign.targets:
            if isinstance(t.target, cst.Name):
                values[t.target.value] = assign.value
            elif isinstance(t.target, cst.Subscript) and len(t.target.slice) == 1:
                key = t.target.slice[0].slice
                if isinstance(key, cst.Index) and isinstance(key.value, cst.SimpleString) and "mask" in (
                        key.value.evaluated_value or ""):
                    name = key.value.evaluated_value
                    layout = mask_kind(assign.value) or _layout_of_name(assign.value, values)
                    out.append(MaskFact(f"{src.code(t.target.value)}[{name!r}]", "pipeline", layout,
                                        Evidence(path, src.line(assign), f"`{src.code(assign)[:80]}`")))
    for d in find_all(entry, cst.Dict):
        for el in d.elements:
            if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString) and "mask" in (
                    el.key.evaluated_value or ""):
                out.append(MaskFact(el.key.evaluated_value, "pipeline", mask_kind(el.value),
                                    Evidence(path, src.line(d), f"`{src.code(d)[:80]}`")))
    for call in find_all(entry, cst.Call):
        name = dotted(call.func) or ""
        if name.startswith("self.transformer") or name == "transformer":
            for a in call.args:
                if a.keyword is not None and "mask" in a.keyword.value:
                    layout = mask_kind(a.value) or _layout_of_name(a.value, values)
                    out.append(MaskFact(a.keyword.value, "pipeline", layout,
                                        Evidence(path, src.line(call), f"the transformer call passes "
                                                 f"`{a.keyword.value}={src.code(a.value)[:50]}`")))
    return tuple(out)


def _transformer_calls(entry: cst.FunctionDef) -> list[cst.Call]:
    """The entry's calls of the transformer by a diffusers pipeline's names for it (`self.transformer*(...)`, a
    local `transformer(...)`)."""
    return [c for c in find_all(entry, cst.Call)
            if (dotted(c.func) or "").startswith("self.transformer") or dotted(c.func) == "transformer"]


def pipeline_call_keywords(ws: Workspace, gate: GateReport) -> list[str]:
    """Keywords the pipeline's entry passes to the transformer, in the order first seen: those written out,
    and the string keys of a dict it spreads into the call (`**model_kwargs`, where the entry builds that
    dict as a literal or with `dict(...)`, or sets its keys one by one)."""
    src, cls, entry = _pipeline_entry(ws, gate)
    out: list[str] = []
    positional = None
    calls = _transformer_calls(entry) if entry is not None else []
    if entry is not None and not calls:  # a sampler's own name for the model (`model(img=img, ...)`)
        calls = loop_model_calls(src, cls, entry)
    for call in calls:
        for i, a in enumerate(call.args):
            if a.keyword is None and not a.star:  # passed by position: the forward's parameter there
                positional = _forward_positions(ws, gate) if positional is None else positional
                keys = positional[i:i + 1]
            else:
                keys = [a.keyword.value] if a.keyword is not None else (
                    spread_keys(entry, a.value.value) if a.star == "**" and isinstance(a.value, cst.Name) else [])
            out += [k for k in keys if k not in out]
    return out


def _forward_positions(ws: Workspace, gate: GateReport) -> list[str]:
    """The names of the transformer forward's positional parameters, in order ([] where forward is not
    defined on the class itself)."""
    src = ws.load(Path(gate.value("transformer_file")))
    cls = src.classes.get(gate.value("transformer_class"))
    fwd = find_method(cls, "forward") if cls is not None else None
    if fwd is None:
        return []
    return [p.name.value for p in (*fwd.params.posonly_params, *fwd.params.params)][1:]


def spread_keys(fn: cst.FunctionDef, name: str) -> list[str]:
    """The string keys `fn` gives the dict `name`: `name = {"k": ...}` / `dict(k=...)`, `name["k"] = ...`,
    `name.update(k=...)` (a key spread from another dict, `**other`, is not followed)."""
    keys: list[str] = []

    def literal(value: cst.BaseExpression) -> list[str]:
        if isinstance(value, cst.Dict):
            return [e.key.evaluated_value for e in value.elements if isinstance(e, cst.DictElement)
                    and isinstance(e.key, cst.SimpleString) and isinstance(e.key.evaluated_value, str)]
        if isinstance(value, cst.Call) and dotted(value.func) == "dict":
            return [a.keyword.value for a in value.args if a.keyword is not None]
        return []

    for node in find_all(fn.body, (cst.Assign, cst.Call)):
        if isinstance(node, cst.Assign):
            for t in node.targets:
                if isinstance(t.target, cst.Name) and t.target.value == name:
                    keys += literal(node.value)
                elif (isinstance(t.target, cst.Subscript) and isinstance(t.target.value, cst.Name)
                      and t.target.value.value == name and len(t.target.slice) == 1
                      and isinstance(t.target.slice[0].slice, cst.Index)
                      and isinstance(t.target.slice[0].slice.value, cst.SimpleString)):
                    key = t.target.slice[0].slice.value.evaluated_value
                    keys += [key] if isinstance(key, str) else []
        elif dotted(node.func) == f"{name}.update":
            keys += [a.keyword.value for a in node.args if a.keyword is not None]
            keys += [k for a in node.args if a.keyword is None for k in literal(a.value)]
    return list(dict.fromkeys(keys))


def documented_ndims(src: SourceFile, cls: cst.ClassDef) -> dict[str, tuple[int, Evidence]]:
    """Dims of each tensor the transformer's forward docstring documents a shape for (a pipeline's own call,
    where it was read, says more and wins)."""
    fwd = find_method(cls, "forward")
    return {k: (rank, Evidence(str(src.path), line, f"the forward's docstring documents `{k}` of shape {shape}"))
            for k, (rank, line, shape) in (documented_ranks(src, fwd) if fwd is not None else {}).items()}


def joined_id_ndims(src: SourceFile, cls: cst.ClassDef) -> dict[str, tuple[int, Evidence]]:
    """Dims of the position ids the forward joins along a literal dim (`torch.cat((txt_ids, img_ids), dim=1)`):
    ids are (..., sequence, axes), so ids joined along dim k have k + 2 dims (2: one row per token, 3: batched)."""
    fwd = find_method(cls, "forward")
    if fwd is None:
        return {}
    params = {p.name.value for p in params_of(fwd)}
    out: dict[str, tuple[int, Evidence]] = {}
    for call in find_all(fwd.body, cst.Call):
        if dotted(call.func) not in ("torch.cat", "torch.concat", "torch.concatenate") or not call.args:
            continue
        seq = call.args[0].value
        dim = next((a.value for a in call.args[1:] if a.keyword is None or a.keyword.value == "dim"), None)
        if not isinstance(seq, (cst.Tuple, cst.List)) or not isinstance(dim, cst.Integer):
            continue
        names = [e.value.value for e in seq.elements if isinstance(e.value, cst.Name)]
        joined = [n for n in names if n in params and n.lower().endswith("ids")]
        if len(joined) >= 2:
            why = (f"the forward joins {', '.join(f'`{n}`' for n in joined)} along dim {dim.value}: position ids are "
                   f"(..., sequence, axes), so each has {int(dim.value) + 2} dims")
            for n in joined:
                out.setdefault(n, (int(dim.value) + 2, Evidence(str(src.path), src.line(call), why)))
    return out


def documented_dims(src: SourceFile, cls: cst.ClassDef) -> dict[str, tuple[str, ...]]:
    """The dims, by name as written, of each tensor the transformer's forward docstring documents a shape for."""
    fwd = find_method(cls, "forward")
    return {k: dims for k, (dims, _) in (documented_shapes(src, fwd) if fwd is not None else {}).items()}


def documented_text(src: SourceFile, cls: cst.ClassDef) -> dict[str, tuple[str, int]]:
    """{input: (what the transformer's forward docstring says of it, the line)}."""
    fwd = find_method(cls, "forward")
    return documented_entries(src, fwd) if fwd is not None else {}


def pipeline_arg_ndims(ws: Workspace, gate: GateReport) -> dict[str, tuple[int, Evidence]]:
    """Dims of each tensor the pipeline passes to the transformer by keyword, where the code says."""
    src, cls, entry = _pipeline_entry(ws, gate)
    if entry is None:
        return {}
    out: dict[str, tuple[int, Evidence]] = {}
    for call in _transformer_calls(entry):
        for a in call.args:
            if a.keyword is None or a.keyword.value in out:
                continue
            n = ndim_of(ws, src, entry, a.value, cls, before=src.line(call))
            if n is not None:
                out[a.keyword.value] = (n, Evidence(str(src.path), src.line(call), f"the pipeline passes "
                                                    f"`{a.keyword.value}={src.code(a.value)[:40]}` as a {n}-D tensor"))
    return out


def _layout_of_name(value: cst.BaseExpression, values: dict[str, cst.BaseExpression]):
    if isinstance(value, cst.Name) and value.value in values:
        return mask_kind(values[value.value])
    return None


# -- a `_cp_plan` declared in diffusers ------------------------------------------------------


def declared_cp_plan(ws: Workspace, src: SourceFile, cls: cst.ClassDef) -> tuple[dict | None, Evidence | None]:
    for stmt in cls.body.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else (
                [small.target] if isinstance(small, cst.AnnAssign) else [])
            if any(isinstance(t, cst.Name) and t.value == "_cp_plan" for t in targets) and small.value is not None:
                plan = _plan_value(small.value)
                return plan, Evidence(str(src.path), src.line(stmt), "diffusers declares `_cp_plan` on the class")
    return None, None


def _plan_value(value: cst.BaseExpression) -> dict | None:
    if not isinstance(value, cst.Dict):
        return None
    plan: dict[str, Any] = {}
    for el in value.elements:
        if not isinstance(el, cst.DictElement) or not isinstance(el.key, cst.SimpleString):
            return None
        key = el.key.evaluated_value
        if isinstance(el.value, cst.Dict):
            inner = {}
            for sub in el.value.elements:
                if not isinstance(sub, cst.DictElement):
                    continue
                k = evaluate(sub.key, {})
                inner[str(jsonable(k))] = _hook(sub.value)
            plan[key] = inner
        else:
            plan[key] = _hook(el.value)
    return plan


def _hook(value: cst.BaseExpression) -> dict[str, Any] | None:
    if isinstance(value, cst.List | cst.Tuple):
        return [_hook(e.value) for e in value.elements]  # type: ignore[return-value]
    if not isinstance(value, cst.Call):
        return None
    name = (dotted(value.func) or "").rsplit(".", 1)[-1]
    fields = ("split_dim", "expected_dims", "split_output") if "Input" in name else ("gather_dim", "expected_dims")
    out: dict[str, Any] = {}
    pos = [a for a in value.args if a.keyword is None]
    for i, a in enumerate(pos[: len(fields)]):
        out[fields[i]] = jsonable(evaluate(a.value, {}))
    for a in value.args:
        if a.keyword is not None:
            out[a.keyword.value] = jsonable(evaluate(a.value, {}))
    if "Input" in name:
        out.setdefault("split_output", False)
    return out


__all__ = ["parallel_facts", "block_structure", "declared_cp_plan", "load_config", "read_model_index",
           "documented_ndims", "joined_id_ndims", "documented_dims", "pipeline_arg_ndims", "pipeline_call_keywords", "pipeline_masks"]
