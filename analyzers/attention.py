"""Attention facts for tensor and context parallelism, read from the processor's source.

For each attention module inside a block: which processor runs it, which projections it calls
before the attention kernel (sharded column-wise under TP) and after it (row-wise), whether one
projection's output is split into Q/K/V (fused), the integer attributes used to reshape or split
projected tensors (the `shard_div_attr` candidates), head counts (and GQA KV heads), and whether
the processor consumes an attention mask or rotary embedding. Helper functions the processor
calls with the attention module (`_get_qkv_projections(attn, ...)`) are followed one level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from integrate.defuse import ASSIGNS, DefUse, Lineage, defuse
from integrate.records import Evidence
from integrate.resolve import Resolved, Workspace
from integrate.source import SourceFile, base_names, dotted, find_method
from integrate.syntax import find_all, params_of, self_member

from .binding import BindError, CallArgs, bind
from .forward import signature
from .modules import Node, Tree, module_tree
from .records import AttentionFact
from .values import is_known

_RESHAPES = {"view", "reshape", "unflatten", "split", "split_with_sizes", "chunk", "rearrange", "unbind", "tensor_split"}
_SPLITS = {"chunk", "split", "split_with_sizes", "unbind", "tensor_split"}
_KERNEL_WORDS = ("attention", "sdpa", "flash_attn", "attn_func", "xformers")


def is_kernel_call(call: cst.Call) -> bool:
    """An attention kernel called as a function (`F.scaled_dot_product_attention`, `flash_attn_func`,
    `optimized_attention`): a plain or dotted name with a kernel word, taking at least query, key and value; a
    method of `self` is a module, not a kernel."""
    name = dotted(call.func) or ""
    return (bool(name) and not name.startswith("self.") and len(call.args) >= 3
            and any(w in name.rsplit(".", 1)[-1].lower() for w in _KERNEL_WORDS))


@dataclass
class _Reading:
    """What reading a processor's `__call__` (and the helpers it hands the attention module to) collects.

    Helpers add to the same lists as the processor, and a helper called after the kernel moves what it
    added to the row-wise side, so the reading needs one mutable place; the frozen `AttentionFact` is built
    from it once, when the reading is done."""

    path: str  # the attention module, relative to the block: "attn", "attn1", "self_attention"
    in_projs: list[str] = field(default_factory=list)  # module paths relative to the block
    out_projs: list[str] = field(default_factory=list)
    fused: dict[str, str] = field(default_factory=dict)  # projection path -> how its output is split
    unequal: set[str] = field(default_factory=set)  # fused projections split into parts of different sizes
    reshape_attrs: dict[str, int] = field(default_factory=dict)  # attention attribute -> line of first use
    kernel: tuple[str, int] | None = None  # (the kernel's name, line)
    mask_line: int | None = None
    prepared_line: int | None = None  # `<attn>.prepare_attention_mask(...)` in the processor
    causal_line: int | None = None  # a kernel call whose `is_causal` is not False
    gqa: tuple[int, str] | None = None  # (line, code) of a kernel call's `enable_gqa` other than False
    gqa_global: tuple[str, str] | None = None  # (module, name): that call's callee, a global of a known module
    kernel_global: tuple[str, str] | None = None  # (module, name): the first kernel call's callee, likewise
    sdpa_global: tuple[str, str] | None = None  # (module, alias): that callee is `<alias>.scaled_dot_product_attention`
    backend: tuple[int, str] | None = None  # (line, code) of a dispatcher call's `backend=` other than None
    mask_after: tuple[str, int] | None = None  # (mask parameter, line) read after the kernel, outside its call
    joins: tuple[int, bool, str] | None = None  # (line, text first, code): the processor joins its own and text keys
    # per dispatch_attention_fn call: does it run with CP when the module is given encoder_hidden_states
    cross_cp: list[tuple[bool | None, int]] = field(default_factory=list)
    rope_line: int | None = None
    unknowns: list[str] = field(default_factory=list)


def is_attention(ws: Workspace, node: Node) -> bool:
    """A module that runs attention: it sets a processor, or its class name says so and it projects."""
    if node.cls_node is None:
        return False
    src, cls = node.cls_node
    if processor_class(ws, src, cls) is not None:
        return True
    return "Attention" in cls.name.value or "Attn" in cls.name.value


def attention_facts(ws: Workspace, tree: Tree, node: Node, block_path: str, block_list: str) -> AttentionFact:
    """One attention module of `block_list`'s element 0 (at `block_path`), read from the processor it runs, or
    from its own forward when it installs none. What cannot be read is said in `unknowns`, not guessed."""
    src, cls = node.cls_node
    reading = _Reading(node.path[len(block_path) + 1:] if block_path else node.path)
    proc = processor_argument(ws, node) or processor_class(ws, src, cls)
    if proc is None:
        fn = find_method(cls, "forward")
        if fn is None:
            reading.unknowns.append(f"{cls.name.value}: no processor and no forward found")
            return _record(reading, node, block_list)
        _read_processor(ws, reading, tree, node, src, fn, "self")
        return _record(reading, node, block_list, qk_norms=_qk_norms(tree, node))
    p_src, p_cls = proc
    fn = find_method(p_cls, "__call__")
    if fn is None:
        reading.unknowns.append(f"processor {p_cls.name.value} has no __call__")
        return _record(reading, node, block_list, proc, ws=ws)
    params = [p.name.value for p in params_of(fn) if p.name.value != "self"]
    runs = Evidence(str(p_src.path), p_src.line(p_cls), f"{cls.name.value} runs {p_cls.name.value}")
    _adopt_processor_linears(ws, tree, node, p_src, p_cls)
    _read_processor(ws, reading, tree, node, p_src, fn, params[0] if params else "attn")
    fed_by = block_inputs_into(tree, block_path, node, reading.mask_after[0]) if reading.mask_after else ()
    return _record(reading, node, block_list, proc, (runs,), _qk_norms(tree, node), fed_by, ws=ws)


def block_inputs_into(tree: Tree, block_path: str, node: Node, param: str) -> tuple[str, ...]:
    """The block forward's parameters that reach the processor's `param` through the block's calls of the attention
    module at `node`: bound to that parameter of the module's forward by Python's rules (`analyzers.binding.bind`),
    or passed as that keyword into its `**kwargs` (diffusers' attention forwards hand their keywords on to the
    processor by name). () where the block or the module is not read."""
    block = tree.nodes.get(block_path)
    if block is None or block.cls_node is None or node.cls_node is None:
        return ()
    b_src, b_cls = block.cls_node
    fwd = find_method(b_cls, "forward")
    if fwd is None:
        return ()
    block_params = {p.name.value for p in params_of(fwd)} - {"self"}
    attention_fwd = find_method(node.cls_node[1], "forward")
    params = signature(node.cls_node[0], attention_fwd) if attention_fwd is not None else ()
    relative = node.path[len(block_path) + 1:] if block_path else node.path
    out: list[str] = []
    for call in find_all(fwd, cst.Call):
        if self_member(call.func) != relative:
            continue
        args = CallArgs.of(b_src, call)
        try:
            value = bind(args, params).get(param) if params else None
        except BindError:
            value = None
        if value is None or value.startswith("<"):  # not a parameter of the module's forward, or left at its default
            value = dict(args.keywords).get(param)
        if value is not None and not value.startswith("<"):
            out += sorted(_names(cst.parse_expression(value)) & block_params)
    return tuple(dict.fromkeys(out))


def _adopt_processor_linears(ws: Workspace, tree: Tree, node: Node, p_src: SourceFile, p_cls: cst.ClassDef) -> None:
    """A processor that owns projections (`self.to_q_ip = nn.Linear(...)`): put them in the tree under
    `<attention>.processor.`, so the processor's calls to them resolve like the attention module's own."""
    for path, n in module_tree(ws, p_src, p_cls).nodes.items():
        if n.kind == "linear":
            tree.nodes.setdefault(f"{node.path}.processor.{path}", n)


def _qk_norms(tree: Tree, node: Node) -> dict[str, Any]:
    """The attention module's own q/k norms (`norm_q`, `k_norm`, `norm_added_q`) -> the size they normalise (None: not read
    statically; the generated TP planner then measures the built module)."""
    out: dict[str, Any] = {}
    for path, n in tree.nodes.items():
        if path.startswith(node.path + ".") and "norm" in path.rsplit(".", 1)[-1] and n.kind != "unknown":
            short = path[len(node.path) + 1:]
            words = short.split("_")
            if short.count(".") == 0 and "norm" in words and ("q" in words or "k" in words):  # norm_q, q_norm,
                out[short] = n.shape[0] if n.shape else None                                 # norm_added_k

    return out


def _record(reading: _Reading, node: Node, block_list: str, proc: tuple[SourceFile, cst.ClassDef] | None = None,
            evidence: tuple[Evidence, ...] = (), qk_norms: dict[str, Any] | None = None,
            fed_by: tuple[str, ...] = (), ws: Workspace | None = None) -> AttentionFact:
    """The frozen record. Sizes become ints only where they are known statically (None otherwise); the
    fused parts are equal (Q/K/V) only when every fused projection is split in three, not QKV + MLP.
    Mask, rope and kernel lines are in the processor's file, or the module's own without a processor."""
    src, cls = node.cls_node
    where = str(proc[0].path) if proc is not None else str(src.path)
    heads, kv_heads, head_dim = _head_attrs(node)

    def pair(p):
        return None if p is None else (p[0], int_value(p[1]))

    equal = not reading.unequal
    processor = proc[1].name.value if proc is not None else None
    return AttentionFact(
        block_list=block_list, path=reading.path, cls=cls.name.value, processor=processor,
        processor_at=Evidence(where, proc[0].line(proc[1]), f"processor {processor}") if proc is not None else None,
        in_projs=tuple(reading.in_projs), out_projs=tuple(reading.out_projs), fused=dict(reading.fused),
        fused_equal_split=equal, reshape_attrs=dict(reading.reshape_attrs), heads=pair(heads),
        kv_heads=pair(kv_heads), head_dim=pair(head_dim),
        mask_at=Evidence(where, reading.mask_line, "the processor takes and uses an attention mask")
        if reading.mask_line else None,
        rope_at=Evidence(where, reading.rope_line, "the processor applies rotary embeddings")
        if reading.rope_line else None,
        kernel=Evidence(where, reading.kernel[1], f"attention kernel `{reading.kernel[0]}`")
        if reading.kernel else None,
        qk_norms={k: int_value(v) for k, v in (qk_norms or {}).items()},
        evidence=evidence, unknowns=tuple(reading.unknowns),
        mask_prepared_at=Evidence(where, reading.prepared_line, "the processor sizes the mask with "
                                  "`prepare_attention_mask` from the key length it sees and the full head count")
        if reading.prepared_line else None,
        cross_local_at=_cross_local(reading, where),
        causal_at=Evidence(where, reading.causal_line, "the attention kernel is called with `is_causal` set")
        if reading.causal_line else None,
        gqa_at=Evidence(where, reading.gqa[0], f"the attention kernel is called with `enable_gqa={reading.gqa[1][:60]}`")
        if reading.gqa else None,
        gqa_global=reading.gqa_global,
        mask_after_at=Evidence(where, reading.mask_after[1], f"the processor applies `{reading.mask_after[0]}` to "
                               "the attention output after the kernel, one row per query")
        if reading.mask_after else None,
        joins_at=Evidence(where, reading.joins[0], f"the processor joins its keys with the text's (`{reading.joins[2]}`), "
                          + ("text first" if reading.joins[1] else "text second"))
        if reading.joins else None,
        text_first=reading.joins[1] if reading.joins else None,
        kernel_name=reading.kernel[0] if reading.kernel else None,
        backend_at=Evidence(where, reading.backend[0], f"the attention kernel is called with "
                            f"`backend={reading.backend[1][:60]}`") if reading.backend else None,
        backend=_backend_member(reading.backend[1]) if reading.backend else None,
        kernel_global=reading.kernel_global,
        sdpa_global=reading.sdpa_global,
        mask_after_param=reading.mask_after[0] if reading.mask_after else None,
        mask_after_inputs=fed_by, **_config_given(ws, node, proc))


def _config_given(ws: Workspace | None, node: Node, proc) -> dict:
    """Does cache-dit hand this module's processor the parallel config under CP (its class is one of diffusers'
    attention classes cache-dit lists, bases traced): {cp_config_given, cp_config_at}; {} without a processor or
    where cache-dit's list was not found."""
    from .bases import diffusers_class
    from .support import cp_attention_classes

    listed = cp_attention_classes(ws) if ws is not None and proc is not None and node.cls_node is not None else None
    if listed is None:
        return {}
    src, cls = node.cls_node
    given, why = diffusers_class(ws, src, cls, listed[0])
    return {"cp_config_given": given, "cp_config_at": Evidence(str(src.path), src.line(cls), why)}


def _module_global(src: SourceFile, name: str) -> tuple[str, str] | None:
    """(module, name) when the callee `name` is a bare name the file binds at module level (an import or a def) and
    the file's import name is known: code that replaces the module's global then changes what the call reaches.
    None for an attribute (`F.scaled_dot_product_attention`), a local, or a file outside a known package."""
    if "." in name or not name or src.dotted_name is None:
        return None
    return (src.dotted_name, name) if name in src.imports or name in src.functions else None


_FUNCTIONAL = "torch.nn.functional"


def _sdpa_global(src: SourceFile, name: str) -> tuple[str, str] | None:
    """(module, alias) when the callee `name` is torch's `scaled_dot_product_attention` reached through a module-level
    alias of torch.nn.functional (`import torch.nn.functional as F` or `from torch.nn import functional as F`) and the
    file's import name is known: code that replaces that global in the module then changes what the call reaches,
    and nothing else the module does (every other attribute passes through). None otherwise."""
    alias, _, attr = name.partition(".")
    found = src.imports.get(alias) if attr == "scaled_dot_product_attention" else None
    if found is None or src.dotted_name is None:
        return None
    target = found.module if found.name is None else f"{found.module}.{found.name}"
    return (src.dotted_name, alias) if target == _FUNCTIONAL else None


def _cross_local(reading: _Reading, where: str) -> Evidence | None:
    """Where the processor runs cross-attention without context parallelism (every dispatch call does), else
    None (it runs with CP, or it was not read)."""
    if reading.cross_cp and all(cp is False for cp, _ in reading.cross_cp):
        line = reading.cross_cp[-1][1]
        return Evidence(where, line, "given encoder_hidden_states, the processor calls dispatch_attention_fn with "
                                     "no parallel config: cross-attention runs on each rank's own queries against "
                                     "the whole text")
    return None


def _head_attrs(node: Node) -> tuple[tuple[str, Any] | None, tuple[str, Any] | None, tuple[str, Any] | None]:
    """(heads, kv_heads, head_dim) as (attribute, value), read from the attention module's attributes."""
    heads = kv_heads = head_dim = None
    for name in ("head_dim", "dim_head", "attention_head_dim", "head_size"):
        if name in node.attrs:
            head_dim = (name, node.attrs[name])
            break
    for name, value in node.attrs.items():
        low = name.lower()
        if "head" not in low:
            continue
        if low.startswith("sliceable"):
            continue
        if "dim" in low or "size" in low:
            head_dim = head_dim or (name, value)
        elif "kv" in low or "key_value" in low:
            kv_heads = (name, value)
        elif heads is None:
            heads = (name, value)
    return heads, kv_heads, head_dim


def processor_argument(ws: Workspace, node: Node):
    """`Attention(..., processor=SomeProcessor())` in the block's __init__, or the processor passed by position
    where the attention class's __init__ names that position `processor`."""
    if node.call is None:
        return None
    c_src, call = node.call
    init = find_method(node.cls_node[1], "__init__") if node.cls_node is not None else None
    names = [p.name.value for p in (*init.params.posonly_params, *init.params.params)][1:] if init is not None else []
    for i, arg in enumerate(call.args):
        named = arg.keyword.value if arg.keyword is not None else names[i] if arg.star == "" and i < len(names) \
            else None
        if named == "processor" and isinstance(arg.value, cst.Call):
            found = ws.resolve(c_src, dotted(arg.value.func) or "")
            if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
                return found.src, found.node
    return None


def processor_class(ws: Workspace, src: SourceFile, cls: cst.ClassDef, depth: int = 0):
    """The processor class an attention module installs by default, if any."""
    for stmt in cls.body.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign) and any(
                        isinstance(t.target, cst.Name) and t.target.value == "_default_processor_cls"
                        for t in small.targets):
                    found = ws.resolve(src, dotted(small.value) or "")
                    if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
                        return found.src, found.node
    init = find_method(cls, "__init__")
    if init is not None:
        for call in find_all(init, cst.Call):
            name = dotted(call.func) or ""
            if name.endswith("Processor") or "Processor" in name.rsplit(".", 1)[-1]:
                found = ws.resolve(src, name)
                if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
                    return found.src, found.node
    if depth < 4:
        for base in base_names(cls):
            found = ws.resolve(src, base)
            if isinstance(found, Resolved) and isinstance(found.node, cst.ClassDef):
                got = processor_class(ws, found.src, found.node, depth + 1)
                if got is not None:
                    return got
    return None


def _read_processor(ws: Workspace, reading: _Reading, tree: Tree, node: Node, src: SourceFile,
                    fn: cst.FunctionDef, owner: str, depth: int = 0) -> None:
    """Collect projection calls, reshapes, the kernel call, mask and rope use in `fn`."""
    modules = {p[len(node.path) + 1:]: n for p, n in tree.nodes.items() if p.startswith(node.path + ".")}
    calls = sorted(find_all(fn, cst.Call), key=lambda c: src.line(c))
    index = defuse(src, fn)
    # local -> the attention attributes (`attn.heads`, ...) its value is computed from
    aliases = index.lineage(seed=lambda value: _attn_attrs(value, owner) - set(modules), reads=_names)
    called = {p.split(".")[0] for p in (_projection(c, owner, modules) for c in calls) if p} | {
        c.func.attr.value for c in calls if isinstance(c.func, cst.Attribute) and dotted(c.func.value) == owner}
    kernel_lines, inside_kernel = _read_kernels(reading, src, calls, owner)
    proc = _Processor(ws, reading, tree, node, src, fn, owner, depth, modules, index, aliases, frozenset(called),
                      tuple(kernel_lines), frozenset(inside_kernel), _callers_of_params(fn))
    for call in calls:
        line = src.line(call)
        if (isinstance(call.func, cst.Attribute) and call.func.attr.value == "prepare_attention_mask"
                and dotted(call.func.value) == owner and reading.prepared_line is None):
            reading.prepared_line = line
        _note_projections(proc, call, line)
        _note_reshape(proc, call, line)
        if depth < 2 and call.args and any(isinstance(a.value, cst.Name) and a.value.value == owner for a in call.args):
            _follow_helper(proc, call, line)
    if depth == 0:
        _read_params(reading, src, fn, calls, kernel_lines)
        if reading.kernel is None:
            _split_by_flow(reading, src, fn, calls, owner, modules, index)


@dataclass(frozen=True)
class _Processor:
    """One processor function being read (or a helper it hands the attention module to), with what the
    passes over its calls share: its sub-modules, def-use index, and the lines of its kernel calls."""

    ws: Workspace
    reading: _Reading
    tree: Tree
    node: Node
    src: SourceFile
    fn: cst.FunctionDef
    owner: str  # the name the attention module has here (`attn`, `self`)
    depth: int
    modules: dict[str, Node]  # sub-modules by their path under the attention module
    index: DefUse
    aliases: Lineage  # local -> the attention attributes its value is computed from
    called: frozenset[str]  # sub-modules and methods of the attention module that `fn` calls
    kernel_lines: tuple[int, ...]  # every kernel call: a projection is an input to the next one after it
    inside_kernel: frozenset[int]  # calls in a kernel call's arguments (`sdpa(heads(self.q), ...)`): its inputs
    nested: dict[str, set[int]]  # nested functions that call a parameter of theirs (`_callers_of_params`)

    @property
    def kernel_line(self) -> int | None:
        return self.kernel_lines[0] if self.kernel_lines else None


def _read_kernels(reading: _Reading, src: SourceFile, calls: list[cst.Call], owner: str) -> tuple[list[int], set[int]]:
    """The kernel calls (what the first one is and how it is reached; causal, GQA and backend arguments of any),
    and dispatch_attention_fn's cross-attention CP arguments: every kernel call's line, and the calls inside a
    kernel call's arguments."""
    kernel_lines: list[int] = []
    inside_kernel: set[int] = set()
    for call in calls:
        name = dotted(call.func) or ""
        last = name.rsplit(".", 1)[-1].lower()
        # a kernel takes at least query, key and value: `_get_current_attention_backend(self)` is not one
        if any(w in last for w in _KERNEL_WORDS) and not name.startswith(owner + ".") and len(call.args) >= 3:
            inside_kernel.update(id(c) for a in call.args for c in find_all(a.value, cst.Call))
            causal = next((a.value for a in call.args if a.keyword and a.keyword.value == "is_causal"), None)
            if causal is not None and not (isinstance(causal, cst.Name) and causal.value in ("False", "None")) \
                    and reading.causal_line is None:
                reading.causal_line = src.line(call)
            gqa = next((a.value for a in call.args if a.keyword and a.keyword.value == "enable_gqa"), None)
            if gqa is not None and not (isinstance(gqa, cst.Name) and gqa.value in ("False", "None")) \
                    and reading.gqa is None:
                reading.gqa = (src.line(call), src.code(gqa))
                reading.gqa_global = _module_global(src, name)
            backend = next((a.value for a in call.args if a.keyword and a.keyword.value == "backend"), None)
            if backend is not None and not (isinstance(backend, cst.Name) and backend.value == "None") \
                    and reading.backend is None:
                reading.backend = (src.line(call), src.code(backend))
            if not kernel_lines:
                reading.kernel = (name, src.line(call))
                reading.kernel_global = _module_global(src, name)
                reading.sdpa_global = _sdpa_global(src, name)
            kernel_lines.append(src.line(call))
        if last == "dispatch_attention_fn":
            reading.cross_cp.append((_cross_cp(call), src.line(call)))
    return kernel_lines, inside_kernel


def _note_projections(proc: _Processor, call: cst.Call, line: int) -> None:
    """A linear projection the call makes (or hands to a helper): an input projection before a kernel call (the
    arms of an if / else each call one) or inside its arguments, else an output projection."""
    reading, modules, owner = proc.reading, proc.modules, proc.owner
    proj = _projection(call, owner, modules)
    projs = [proj] if proj is not None and call.func is not None and _is_direct(call, owner) else []
    projs += _passed_projections(call, owner, modules, proc.nested)
    for proj in projs:
        if modules.get(proj) is not None and modules[proj].kind == "linear":
            side = reading.in_projs if proc.kernel_line is None or any(k > line for k in proc.kernel_lines) \
                or id(call) in proc.inside_kernel else reading.out_projs
            full = f"{reading.path}.{proj}"
            if full not in side:
                side.append(full)


def _note_reshape(proc: _Processor, call: cst.Call, line: int) -> None:
    """A reshape, split or einops call: the attention attributes sizing it, and the fused projection a split
    cuts into parts (equal or not)."""
    reading, modules, owner, src = proc.reading, proc.modules, proc.owner, proc.src
    method = call.func.attr.value if isinstance(call.func, cst.Attribute) else dotted(call.func) or ""
    method = method.rsplit(".", 1)[-1]
    qualified = proc.ws.qualname(src, call.func) or dotted(call.func) or ""
    einops_parts = einops_split(call, qualified)
    if not (method in _RESHAPES or (dotted(call.func) or "").startswith(("torch.split", "torch.chunk", "einops."))):
        return
    used = set()
    for arg in call.args:
        used |= _attn_attrs(arg.value, owner) - set(modules)
        used |= proc.aliases.reads(arg.value, line + 1)
    attrs = proc.node.attrs
    sizes = {a for a in used & set(attrs) - proc.called if not is_known(attrs[a]) or (
        isinstance(attrs[a], int) and not isinstance(attrs[a], bool))}
    for attr in sorted(sizes):
        reading.reshape_attrs.setdefault(attr, line)
    if not (method in _SPLITS or (dotted(call.func) or "") in ("torch.split", "torch.chunk") or einops_parts):
        return
    qual = dotted(call.func) or ""
    if qual.startswith(("torch.", "einops.")) or not isinstance(call.func, cst.Attribute):
        target = call.args[0].value if call.args else None
    else:
        target = call.func.value
    src_proj = _projection(target, owner, modules) if target is not None else None
    if src_proj is None and isinstance(target, cst.Name):  # the projection the local last held
        held = [d for d in proc.index.of(target.value, ASSIGNS) if not d.unpacked and d.line <= line]
        src_proj = _projection(held[-1].whole, owner, modules) if held else None
    if src_proj is not None and modules.get(src_proj) is not None and modules[src_proj].kind == "linear":
        reading.fused.setdefault(f"{reading.path}.{src_proj}", f"`{src.code(call)[:80]}` (line {line})")
        if not (einops_parts or equal_parts(call, method, qual)):
            reading.unequal.add(f"{reading.path}.{src_proj}")


def _follow_helper(proc: _Processor, call: cst.Call, line: int) -> None:
    """A module-level helper called with the attention module: read one level into it. Input projections it
    makes after the last kernel call here are output projections."""
    name = dotted(call.func) or ""
    found = proc.ws.resolve(proc.src, name) if name and "." not in name else None
    if not (isinstance(found, Resolved) and isinstance(found.node, cst.FunctionDef)):
        return
    idx = next(i for i, a in enumerate(call.args) if isinstance(a.value, cst.Name) and a.value.value == proc.owner)
    h_params = [p.name.value for p in params_of(found.node)]
    if idx < len(h_params):
        reading = proc.reading
        before = len(reading.in_projs)
        _read_processor(proc.ws, reading, proc.tree, proc.node, found.src, found.node, h_params[idx], proc.depth + 1)
        if proc.kernel_line is not None and not any(k > line for k in proc.kernel_lines):
            moved = reading.in_projs[before:]
            del reading.in_projs[before:]
            reading.out_projs.extend(moved)


def _read_params(reading: _Reading, src: SourceFile, fn: cst.FunctionDef, calls: list[cst.Call],
                 kernel_lines: list[int]) -> None:
    """The processor's own parameters: a mask it passes on, rotary embeddings it reads, a mask applied after the
    kernel; and the text joined into the sequence."""
    params = [p.name.value for p in params_of(fn)]
    for p in params:
        used = any(isinstance(n, cst.Name) and n.value == p for c in calls for a in c.args for n in [a.value])
        low = p.lower()
        if "mask" in low and used:
            reading.mask_line = src.line(fn)
        if any(w in low for w in ("rotary", "rope", "freqs", "pos_emb")) and _reads(fn, p):
            reading.rope_line = src.line(fn)
    reading.mask_after = _mask_after_kernel(src, fn, params, calls, kernel_lines)
    reading.joins = _joined_keys(src, calls)
    if reading.kernel is None:
        reading.unknowns.append(f"no attention kernel call found in {dotted(fn.name)}")


_TEXT_SIDE = ("encoder", "added", "context", "txt", "text")


def _joined_keys(src: SourceFile, calls: list[cst.Call]) -> tuple[int, bool, str] | None:
    """The first `torch.cat([a, b], ...)` of two query / key names where one is the text's (`encoder`, `added`,
    `txt`, ...): the processor joins the block's own sequence and the text into one (line, text first, code)."""
    for call in calls:
        if dotted(call.func) not in ("torch.cat", "torch.concat") or not call.args:
            continue
        seq = call.args[0].value
        if not isinstance(seq, (cst.List, cst.Tuple)) or len(seq.elements) != 2:
            continue
        names = [dotted(e.value) or "" for e in seq.elements]
        if not any("query" in n or "key" in n for n in names):
            continue
        first_text, second_text = (any(w in n for w in _TEXT_SIDE) for n in names)
        if first_text != second_text:
            return src.line(call), first_text, src.code(call)[:80]
    return None


def _mask_after_kernel(src: SourceFile, fn: cst.FunctionDef, params: list[str], calls: list[cst.Call],
                       kernel_lines: list[int]) -> tuple[str, int] | None:
    """A mask parameter read after the first kernel call, outside any kernel call's arguments: the processor
    applies it to the attention output, one row per query (`out * attention_mask[:, :, None, None]`)."""
    if not kernel_lines:
        return None
    first = min(kernel_lines)
    inside = {id(n) for c in calls if src.line(c) in kernel_lines for n in find_all(c, cst.Name)}
    for n in sorted(find_all(fn, cst.Name), key=src.line):
        if n.value in params and "mask" in n.value.lower() and src.line(n) > first and id(n) not in inside:
            return n.value, src.line(n)
    return None


def einops_split(call: cst.Call, qual: str) -> int | None:
    """`rearrange(qkv, "B L (K H D) -> K B H L D", K=3, ...)`: einops cuts a fused projection into K equal
    parts when an axis of a group on the input side, sized by an int keyword, stands alone on the output side.
    The number of parts, or None for any other call. (The pattern is einops' language, read as text.)"""
    if not (qual.startswith("einops") and qual.endswith("rearrange")) or len(call.args) < 2:
        return None
    pattern = call.args[1].value
    if not isinstance(pattern, cst.SimpleString) or not isinstance(pattern.evaluated_value, str):
        return None
    left, arrow, right = pattern.evaluated_value.partition("->")
    if not arrow:
        return None
    sizes = {a.keyword.value: int(a.value.value) for a in call.args
             if a.keyword is not None and isinstance(a.value, cst.Integer)}
    standalone, depth = [], 0
    for token in right.replace("(", " ( ").replace(")", " ) ").split():
        depth += 1 if token == "(" else -1 if token == ")" else 0
        if depth == 0 and token not in ("(", ")"):
            standalone.append(token)
    groups = [g.split(")")[0].split() for g in left.split("(")[1:]]
    for group in groups:
        for axis in group:
            if sizes.get(axis, 0) >= 2 and axis in standalone:
                return sizes[axis]
    return None


def equal_parts(call: cst.Call, method: str, qual: str) -> bool:
    """Does this split cut its tensor into parts of one size? `chunk(n)`, `unbind`, `split(size)` with one size
    (not a list of sizes), `unflatten`: yes; `split([a, b])`, `tensor_split`, an einops pattern: not known to."""
    if method in ("chunk", "unbind", "unflatten"):
        return True
    if method == "split" and not qual.startswith("einops."):
        sizes = call.args[1].value if qual == "torch.split" and len(call.args) > 1 else (
            call.args[0].value if call.args and qual != "torch.split" else None)
        return sizes is not None and not isinstance(sizes, (cst.List, cst.Tuple))
    return False


def _cross_cp(call: cst.Call) -> bool | None:
    """Whether a `dispatch_attention_fn(...)` call runs context-parallel for cross-attention: False when its
    `parallel_config` is absent, `None`, or `X if encoder_hidden_states is None else None`; True for any other
    plain value (`self._parallel_config`); None when it cannot be read."""
    arg = next((a.value for a in call.args if a.keyword and a.keyword.value == "parallel_config"), None)
    if arg is None or (isinstance(arg, cst.Name) and arg.value == "None"):
        return False
    if isinstance(arg, cst.IfExp):
        test = arg.test
        on_cross = arg.orelse if (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
                                  and isinstance(test.comparisons[0].operator, cst.Is)
                                  and "encoder" in (dotted(test.left) or "")) else None
        if on_cross is None:
            return None
        return not (isinstance(on_cross, cst.Name) and on_cross.value == "None")
    return True if isinstance(arg, (cst.Attribute, cst.Name)) else None


def _split_by_flow(reading: _Reading, src: SourceFile, fn: cst.FunctionDef, calls: list, owner: str,
                   modules: dict, index) -> None:
    """With no kernel call to split at (linear attention computed with matmuls), a projection whose input
    derives from another projection's output comes after the attention: an output projection."""
    def projections(value: cst.BaseExpression) -> set[str]:
        return {p for p in (_projection(c, owner, modules) for c in find_all(value, cst.Call)) if p}

    flow = index.lineage(seed=projections, reads=_names)
    for call in calls:
        proj = _projection(call, owner, modules)
        full = f"{reading.path}.{proj}" if proj else None
        if full not in reading.in_projs or not _is_direct(call, owner):
            continue
        line = src.line(call)
        fed = set()
        for arg in call.args:
            fed |= set(flow.reads(arg.value, line + 1)) | projections(arg.value)
        if fed - {proj}:
            reading.in_projs.remove(full)
            reading.out_projs.append(full)


def _reads(fn: cst.FunctionDef, name: str) -> bool:
    return any(n.value == name for n in find_all(fn.body, cst.Name))


def _names(expr: cst.BaseExpression) -> set[str]:
    return {n.value for n in find_all(expr, cst.Name)}


def _attn_attrs(expr: cst.BaseExpression | None, owner: str) -> set[str]:
    """`attn.heads` read anywhere in expr -> {"heads"} (module calls excluded by the caller)."""
    if expr is None:
        return set()
    out = set()
    for a in find_all(expr, cst.Attribute):
        if isinstance(a.value, cst.Name) and a.value.value == owner:
            out.add(a.attr.value)
    return out


def _callers_of_params(fn: cst.FunctionDef) -> dict[str, set[int]]:
    """{name: positions} of the functions nested in `fn` that call a parameter of theirs: `def heads(proj):
    return proj(x)...` gives {"heads": {0}}, so `heads(self.q)` is a call of `self.q`."""
    out: dict[str, set[int]] = {}
    for inner in find_all(fn.body, cst.FunctionDef):
        names = [p.name.value for p in params_of(inner)]
        called = {c.func.value for c in find_all(inner.body, cst.Call) if isinstance(c.func, cst.Name)}
        positions = {i for i, n in enumerate(names) if n in called}
        if positions:
            out[inner.name.value] = positions
    return out


def _passed_projections(call: cst.Call, owner: str, modules: dict[str, Node], nested: dict[str, set[int]]
                        ) -> list[str]:
    """The attention's own modules a call hands to a nested function that calls them (`heads(self.q)`)."""
    if not isinstance(call.func, cst.Name) or call.func.value not in nested:
        return []
    out = []
    for i, arg in enumerate(a for a in call.args if a.keyword is None and not a.star):
        name = dotted(arg.value) or ""
        if i in nested[call.func.value] and name.startswith(owner + ".") and name[len(owner) + 1:] in modules:
            out.append(name[len(owner) + 1:])
    return out


def _is_direct(call: cst.Call, owner: str) -> bool:
    f = call.func
    if isinstance(f, cst.Subscript):
        f = f.value
    return isinstance(f, cst.Attribute) and (dotted(f.value) == owner or (
        isinstance(f.value, cst.Attribute) and dotted(f.value.value) == owner))


def _projection(expr: cst.BaseExpression | None, owner: str, modules: dict[str, Node]) -> str | None:
    """`attn.to_q(x)` -> "to_q"; `attn.to_out[0](x)` -> "to_out.0"; `attn.to_qkv(x).chunk(3)` -> "to_qkv"."""
    if not isinstance(expr, cst.Call):
        return None
    f = expr.func
    if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Call) and f.attr.value in _RESHAPES | {"contiguous"}:
        return _projection(f.value, owner, modules)
    index = None
    if isinstance(f, cst.Subscript) and len(f.slice) == 1 and isinstance(f.slice[0].slice, cst.Index):
        idx = f.slice[0].slice.value
        index = idx.value if isinstance(idx, cst.Integer) else None
        f = f.value
    name = dotted(f) or ""
    if name.startswith(owner + "."):
        path = name[len(owner) + 1:]
    elif self_member(f) is not None and owner != "self":
        path = "processor." + self_member(f)  # a projection the processor owns
    else:
        return None
    if index is not None:
        path = f"{path}.{index}"
    return path if path in modules else None


def int_value(value: Any) -> int | None:
    return value if is_known(value) and isinstance(value, int) and not isinstance(value, bool) else None


def _backend_member(code: str) -> str | None:
    """`AttentionBackendName.FLEX` -> "FLEX"; None for any other spelling (a variable, a string: not read)."""
    head, _, member = code.rpartition(".")
    return member if head.endswith("AttentionBackendName") and member.isidentifier() else None
