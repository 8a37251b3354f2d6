"""Where the sequence is split and gathered: whether splitting forward's own inputs commutes with what runs
before the first block (`RootSplit`), and the module after the last walk to gather behind, with the cuts of the
sequence on the way to it (`Gather`)."""

from __future__ import annotations


import libcst as cst

from integrate.records import Evidence
from integrate.source import dotted
from integrate.syntax import find_all, names_read, self_member

from .sequence_forward import PASSTHROUGH, Forward, Producer, cat_names, tokenwise_module, unwrap
from .sequence_walks import Walk

_RESHAPE = {"reshape", "view", "permute", "unflatten", "flatten", "transpose", "unbind", "split", "chunk",
            "squeeze", "unsqueeze"}


class RootSplit:
    """Whether splitting forward's own inputs commutes with what runs before the first block."""

    def __init__(self, f: Forward):
        self.f = f

    def root_check(self, first: Walk) -> tuple[list[Evidence], dict[str, str], list[Evidence]]:
        """Why splitting forward's own inputs would not commute with what runs before the first block; the
        forward parameter each stream of the first walk comes from; and the per-token inputs built from a
        local length (risks, not blockers: wrong only if they mark absolute spans)."""
        blockers: list[Evidence] = []
        origins: dict[str, str] = {}
        risks: list[Evidence] = []
        path = str(self.f.src.path)
        loop = first.loop
        for var in first.streams.values():
            chain_ok, origin, why = self.tokenwise_chain(var, loop.line)
            if origin:
                origins[var] = origin
            if not chain_ok:
                blockers += why
        for bi, producer in zip(first.inputs, first.producers):
            if bi.role == "other" and bi.local_length:
                for ev in bi.local_length:
                    risks.append(Evidence(ev.file, ev.line, f"`{bi.param}` {ev.why}: under a root split it "
                                                    "is built for the local chunk; wrong if it marks absolute spans"))
            if bi.role in ("position", "mask"):
                if bi.local_length:
                    for ev in bi.local_length:
                        blockers.append(Evidence(ev.file, ev.line, f"`{bi.param}` {ev.why}: computed from the local "
                                                 "length after a root split (position drift)"))
                if bi.role == "position" and producer.kind == "module":
                    streams_in = [a for a in producer.args if a in set(first.streams.values())]
                    if streams_in:
                        blockers.append(Evidence(path, producer.line or 0, f"`self.{producer.name}` takes the "
                                                 f"sequence tensor `{streams_in[0]}` and derives positions from it"))
        for line, names, value, _ in self.f.assigns:
            if line >= loop.line:
                continue
            for attr in find_all(value, cst.Attribute):
                if attr.attr.value == "shape" and isinstance(attr.value, cst.Name) and attr.value.value in origins.values():
                    if len(names) >= 4:
                        blockers.append(Evidence(path, line, f"`{', '.join(names)} = {attr.value.value}.shape`: the "
                                                 "input is a spatial latent, not a [B, S, D] sequence"))
        return dedupe(blockers), origins, risks

    def tokenwise_chain(self, var: str, before: int) -> tuple[bool, str | None, list[Evidence]]:
        """Follow `var` back to a forward parameter; every step must be a per-token op."""
        path = str(self.f.src.path)
        name, line = var, before
        for _ in range(20):
            defs = self.f.defs_before(name, line)
            if not defs:
                return (name in self.f.params), (name if name in self.f.params else None), (
                    [] if name in self.f.params else [Evidence(path, before, f"`{var}` has no traceable origin")])
            ln, names, value = defs[-1].line, list(defs[-1].bound), defs[-1].whole
            p = self.f.classify(value, ln, names, name)
            if p.kind == "module":
                ok, why = tokenwise_module(self.f.tree, p.name)
                if not ok:
                    return False, None, [Evidence(path, ln, f"`{var}` comes from `self.{p.name}` ({why}), which does "
                                                  "not act per token")]
            elif p.kind in ("method", "function"):
                return False, None, [Evidence(path, ln, f"`{var}` is built by `{p.name}(...)`: not a per-token op "
                                              "a root split can pass through")]
            elif not isinstance(unwrap(value), cst.Name):  # a plain alias passes the tokens through
                call = unwrap(value)
                if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                        and call.func.attr.value in PASSTHROUGH):
                    return False, None, [Evidence(path, ln, f"`{var}` is reshaped or combined by "
                                                  f"`{self.f.src.code(value)[:60]}`")]
            srcs = [a for a in p.args if a in self.f.params or self.f.defs_before(a, ln)]
            seq = [a for a in srcs if a == name] or srcs[:1]
            if not seq:
                return False, None, [Evidence(path, ln, f"`{var}` does not come from a forward input")]
            name, line = seq[0], ln
        return False, None, [Evidence(path, before, f"`{var}`: derivation too long to follow")]


class Gather:
    """After the last walk: the module to gather behind, and the cuts of the sequence on the way to it."""

    def __init__(self, f: Forward):
        self.f = f

    def gather(self, last: Walk, streams: set[str]) -> tuple[Producer | None, list[Evidence], list[Evidence],
                                                               list[Evidence]]:
        """After the last walk (`streams`: those of every walk): the last module applied to the stream before a
        reshape or the return (the gather candidate); the cuts of the sequence by a global length before it;
        the cuts by lengths read before the loop (fine after a root split); and cuts by a parameter whose
        default hides them (root risks)."""
        stream = next(iter(last.streams.values()), None)
        hidden = last.streams.get("hidden_states", stream)
        path = str(self.f.src.path)
        current = {hidden} if hidden else set()
        candidate: Producer | None = None
        blocked: list[Evidence] = []
        blocked_unless_root: list[Evidence] = []
        risks: list[Evidence] = []
        returns = [(self.f.src.line(r), ["<return>"], r.value, r) for r in find_all(self.f.fwd.body, cst.Return)
                   if r.value is not None]
        for ln, names, value, _ in sorted(self.f.assigns + returns, key=lambda a: a[0]):
            if ln <= last.loop_end or self.f.in_loop(ln) or not (names_read(value) & current):
                continue
            if names == ["<return>"]:
                inner = unwrap(value)
                if isinstance(inner, cst.Call) and self_member(inner.func) is not None:
                    p = self.f.classify(inner, ln, names, "<return>")
                    if p.kind == "module":
                        candidate = p
                        for kind, ev in self._cut_into(inner, current, last, ln, streams):
                            (blocked if kind == "global" else blocked_unless_root).append(ev)
                break
            p = self.f.classify(value, ln, names, names[0] if names else "")
            if p.kind == "module":
                candidate = p
                for kind, ev in self._cut_into(value, current, last, ln, streams):
                    (blocked if kind == "global" else blocked_unless_root).append(ev)
                current = set(names)
                continue
            inner = self._module_inside(value, current, ln, names)
            if inner is not None:
                candidate = inner
                current = set(names)
                continue
            call = unwrap(value)
            if isinstance(call, cst.Name):
                current |= set(names)  # `hidden_states = decoder_hidden_states`
                continue
            method = call.func.attr.value if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) else ""
            if isinstance(call, cst.Call) and method in PASSTHROUGH:
                current |= set(names)
                continue
            if isinstance(call, cst.BinaryOperation | cst.UnaryOperation) and not any(
                    isinstance(c.func, cst.Attribute) and c.func.attr.value in _RESHAPE | {"cat"}
                    for c in find_all(call, cst.Call)):
                for name in self.snapshots(call, current, streams, last, ln):
                    blocked_unless_root.append(Evidence(path, ln, f"`{self.f.src.code(value)[:70]}` joins the stream "
                                                        f"with `{name}`, the sequence as it was before the blocks "
                                                        "(a long skip): whole unless split at the root"))
                current |= set(names)  # element-wise modulation: h * (1 + scale) + shift
                continue
            if method in ("cat", "concat", "split", "chunk") or isinstance(call, cst.Subscript) or any(
                    dotted(c.func) in ("torch.cat", "torch.concat") for c in find_all(call, cst.Call)):
                kind, cut_risks = self.cut_kind(value, last, ln, streams)
                risks += cut_risks
                if kind != "local":
                    ev = Evidence(path, ln, f"`{self.f.src.code(value)[:70]}` slices or joins the sequence after the "
                                  f"last block ({kind})")
                    (blocked if kind == "global" else blocked_unless_root).append(ev)
                current |= set(names)
                continue
            break
        return candidate, blocked, blocked_unless_root, risks

    def snapshots(self, op: cst.CSTNode, current: set[str], streams: set[str], last: Walk, line: int) -> list[str]:
        """The names `op` reads (besides the stream it carries) that hold the sequence as it was before the last
        walk: bound before that walk's loop to a stream, as is or through a pass-through method
        (`residual = hidden_states`, `skip = x.clone() if long_skip else None`). Element-wise with the stream, they
        must be as long."""
        out = []
        for name in sorted(names_read(op) - current - {"self"}):
            defs = self.f.defs_before(name, line)
            if not defs or defs[-1].line >= last.loop.line:
                continue
            value = unwrap(defs[-1].whole)
            arms = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]  # `x.clone() if s else None`
            for arm in arms:
                while isinstance(arm, cst.Call) and isinstance(arm.func, cst.Attribute) \
                        and arm.func.attr.value in PASSTHROUGH:
                    arm = arm.func.value
                if isinstance(arm, cst.Name) and arm.value in streams:
                    out.append(name)
                    break
        return out

    def cut_kind(self, value, last: Walk, line: int, streams: set[str]) -> tuple[str, list[Evidence]]:
        """A slice/join after the blocks: "local" (lengths read from split tensors after the loop or joins of
        split streams), "lengths read before the loop" (local only under a root split), or "global"; and the
        root risks it shows (a cut by a parameter whose default, 0 or None, makes it a no-op)."""
        risks: list[Evidence] = []
        joined = cat_names(value)
        if joined and all(j in streams for j in joined):
            return "local", risks
        bounds: set[str] = set()
        for sub in find_all(value, cst.Subscript):
            for el in sub.slice:
                bounds |= names_read(el.slice)
        for call in find_all(value, cst.Call):
            for a in call.args[1:]:
                bounds |= names_read(a.value)
        bounds -= streams | {"self"}
        attrs_shape = [a for a in find_all(value, cst.Attribute) if a.attr.value == "shape"
                       and isinstance(a.value, cst.Name) and a.value.value in streams]
        if not bounds and attrs_shape:
            return "local", risks
        if not bounds and any(_cuts_sequence(sub) for sub in find_all(value, cst.Subscript)
                              if isinstance(sub.value, cst.Name) and sub.value.value in streams):
            return "global", risks  # `h[:, 1:]`: a fixed position of the whole sequence, not of a rank's chunk
        kinds = set()
        for name in bounds:
            defs = self.f.defs_before(name, line)
            if not defs:
                default = self.f.defaults.get(name)
                if default in ("0", "None"):
                    risks.append(Evidence(str(self.f.src.path), line, f"the output is cut by `{name}` "
                                                    f"(default {default}): with a non-zero value the cut lands in "
                                                    "the wrong place on a local chunk"))
                    continue
                kinds.add("global")
                continue
            ln, v = defs[-1].line, defs[-1].whole
            reads = [a for a in find_all(v, cst.Attribute) if a.attr.value == "shape" and isinstance(a.value, cst.Name)
                     and (a.value.value in streams or a.value.value in self.f.params)]
            if not reads:
                kinds.add("global")
            elif ln > last.loop_end:
                kinds.add("local")
            else:
                kinds.add("lengths read before the loop")
        if "global" in kinds:
            return "global", risks
        return ("lengths read before the loop" if "lengths read before the loop" in kinds else "local"), risks

    def _cut_into(self, call, current: set[str], last: Walk, line: int,
                  streams: set[str]) -> list[tuple[str, Evidence]]:
        """The cuts of the sequence inside the gather candidate's own arguments (`self.proj_out(h[:, 1:])`): made
        on a rank's chunk before the module, they are blocked exactly as a cut on a line of their own."""
        out: list[tuple[str, Evidence]] = []
        for sub in find_all(call, cst.Subscript):
            if isinstance(sub.value, cst.Name) and sub.value.value in current and _cuts_sequence(sub):
                kind, _ = self.cut_kind(sub, last, line, streams | current)
                if kind != "local":
                    out.append((kind, Evidence(str(self.f.src.path), line, f"`{self.f.src.code(sub)[:70]}` slices the "
                                               f"sequence after the last block, inside the output module's call ({kind})")))
        return out

    def _module_inside(self, value, current: set[str], line: int, names: list[str]) -> Producer | None:
        """`(self.norm_out(h.float()) * (1 + scale) + shift).type_as(h)`: an element-wise wrap of one module."""
        core = value
        while isinstance(core, cst.Call) and isinstance(core.func, cst.Attribute) and core.func.attr.value in PASSTHROUGH:
            core = core.func.value
        while isinstance(core, cst.Call) and isinstance(core.func, cst.Attribute) and core.func.attr.value in PASSTHROUGH:
            core = core.func.value
        if not isinstance(core, cst.BinaryOperation):
            return None
        for call in find_all(core, cst.Call):
            member = self_member(call.func)
            if member in self.f.tree.nodes and names_read(call) & current:
                return Producer("module", member, line, self.f.src.code(value), sorted(names_read(call) - {"self"}))
        return None


def _cuts_sequence(sub: cst.Subscript) -> bool:
    """Whether a subscript of a [B, S, D] stream cuts its sequence axis (dim 1): `h[:, 1:]`, `h[:, 0]`, `h[:, :n]`;
    `h[..., :c]` and `h[:, :, :c]` cut the channels, `h[0]` the batch. An element after an ellipsis counts from the
    end and is not read as the sequence."""
    elements = list(sub.slice)
    if len(elements) < 2 or any(isinstance(e.slice, cst.Index) and isinstance(e.slice.value, cst.Ellipsis)
                                for e in elements[:2]):
        return False
    second = elements[1].slice
    full = isinstance(second, cst.Slice) and second.lower is None and second.upper is None and second.step is None
    return not full and not (isinstance(second, cst.Index) and dotted(second.value) == "None")


def dedupe(evs: list[Evidence]) -> list[Evidence]:
    """Each (line, why) once, the first kept, in order."""
    seen, out = set(), []
    for e in evs:
        if (e.line, e.why) not in seen:
            seen.add((e.line, e.why))
            out.append(e)
    return out
