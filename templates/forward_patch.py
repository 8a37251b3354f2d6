"""The PatchFunctor's patched `forward`, produced from the model's own source by a libcst rewrite.

The rules say what to change (their fix records, analyzers/fixes.py); this module only applies them, and
names in each `Change` the record it applied. What each record becomes:

* `SplitSlices` (a list walked in slices, `blocks[:n - k]`, then `blocks[-k:]`): each distinct slice
  becomes a list of its own (the first keeps the original name), and every walk iterates its list whole;
* `ReadRecordedBlock`: `self.blocks[k]` reads the block recorded before cache-dit wraps the list;
* `StreamsPositional` (pitfall A): the call passes the streams positionally, in the wrapper's order, and
  everything else by keyword; a block whose forward takes them after other parameters gets one that
  takes them first;
* `LoopBody` (pitfall B): loop-invariant statements hoisted above the loop, index-dependent ones run for
  each block in a hook;
* `OutOfPlace` (pitfall C): `x += y` on a stream of the block's forward becomes `x = x + y`.

Everything else in `forward` is the model's own code, byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import libcst as cst
from integrate.analyzers.fixes import (
    Fix,
    LoopBody,
    OutOfPlace,
    PerBlockKeywords,
    ReadRecordedBlock,
    SplitSlices,
    StreamsPositional,
)
from integrate.analyzers.records import BlockList

from integrate import escape
from integrate.escape import Code
from integrate.source import SourceFile, dotted, find_method
from integrate.syntax import BUILTINS, find_all, names_read, params_of, self_member

from . import signature


@dataclass(frozen=True)
class Split:
    """One walk over a slice of a block list, turned into a list of its own."""

    attr: str  # the original list attribute
    new_attr: str  # the list this walk iterates after the patch
    slice_code: Code  # the model's slice expression, with `self` spelled `transformer`
    guards: tuple[Code, ...]  # enclosing `if` conditions in forward, with `self` spelled `transformer`
    var: str  # the local name the PatchFunctor gives this part

    @property
    def condition(self) -> Code:
        """The guards as one condition (libcst wrote each from the model's own expression)."""
        return Code(" and ".join(self.guards))


@dataclass(frozen=True)
class Change:
    """One thing the rewrite changed, and the fix record it answers."""

    attr: str  # the block list
    text: str  # for the PatchFunctor's docstring and the report
    fix: Fix  # the record it applied (every finding that asked for it is answered)


@dataclass(frozen=True)
class _Hook:
    """What a hook on each block of a list needs: the values the patched forward records before the loop."""

    attr: str  # the block list
    func: str  # the generated hook function
    env_attr: str  # the transformer attribute the patched forward records the values in
    index_var: str  # the loop's index variable, bound to the block's index in the hook
    names: tuple[str, ...]  # the forward locals the statements read (recorded before the loop)


@dataclass(frozen=True)
class PerBlock(_Hook):
    """Pitfall B, a per-block argument: `mask_i = mask if self.kinds[i] == "sliding" else None`, passed to the
    block as `attention_mask=mask_i`. cache-dit's wrapper runs the loop body once, with index 0, and calls
    every block with those arguments; a forward pre-hook on each block computes the keyword again from the
    block's own index and the loop-invariant values the patched forward records before the loop."""

    keyword: str  # the block keyword the statement's value is passed as
    target: str  # the statement's target
    code: Code  # the model's own statement, `self` spelled `transformer`


@dataclass(frozen=True)
class AfterBlock(_Hook):
    """Pitfall B, statements after the block call that update its output by index (a face adapter every fifth
    block): a forward hook on each block runs them on that block's output. Removed from the patched loop."""

    stream: str  # the name the block call's output is assigned to, bound to the block's output in the hook
    code: Code  # the model's own statements, `self` spelled `transformer`, at column 0


@dataclass(frozen=True)
class BlockPatch:
    """Pitfall C: a block forward that writes into an input, rewritten to work out of place."""

    attr: str  # the block list
    func: str  # name of the patched function
    code: Code  # libcst's rewrite of the block's own forward
    wrapped: Code  # the patched function as the model decorates its forward (`a("x")(f)`), applied in `_apply`


@dataclass(frozen=True)
class StreamsFirst:
    """Pitfall A where the block's own forward does not take its two streams first (`forward(x, c, y)`):
    cache-dit's wrapper calls each block as `block(hidden, encoder, *args, **kwargs)`, so each block gets a
    forward that takes the streams first and passes every argument on by name."""

    attr: str  # the block list
    streams: tuple[str, ...]  # the block's parameters for the hidden and the encoder stream, in wrapper order
    others: tuple[str, ...]  # its other positional parameters, in their order


@dataclass(frozen=True)
class ForwardPatch:
    code: str  # the patched forward, as a module-level function named `patched_forward`
    splits: tuple[Split, ...] = ()
    changes: tuple[Change, ...] = ()  # what was changed, for comments and the report
    imports: tuple[tuple[str, str | None], ...] = ()  # (module, name) the function needs
    unhandled: tuple[str, ...] = ()
    forward_changed: bool = False  # the transformer's forward needs replacing (else only blocks are patched)
    blocks: tuple[BlockPatch, ...] = ()
    per_block: tuple[PerBlock, ...] = ()
    after_block: tuple[AfterBlock, ...] = ()
    streams_first: tuple[StreamsFirst, ...] = ()
    model_defaults: tuple[str, ...] = ()  # parameters whose default the patched functions read from the model's own
    wrapped: Code = Code("")  # `patched_forward` as the model decorates forward (`a("x")(patched_forward)`)

    @property
    def indexed(self) -> list[str]:
        """The lists whose blocks forward now reads from the ones recorded before cache-dit wraps them."""
        return [c.attr for c in self.changes if isinstance(c.fix, ReadRecordedBlock)]


class _SelfToTransformer(cst.CSTTransformer):
    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        return updated.with_changes(value="transformer") if updated.value == "self" else updated


def _as_transformer(src: SourceFile, node: cst.CSTNode) -> Code:
    return Code(cst.Module(body=[]).code_for_node(node.visit(_SelfToTransformer())))


def patch_forward(ws, src: SourceFile, cls: cst.ClassDef, block_lists: tuple[BlockList, ...],
                  fixes: tuple[Fix, ...]) -> ForwardPatch:
    """The changes `fixes` ask for (the rules' records, analyzers/fixes.py), applied to the model's forward and its
    blocks' forwards; each `Change` names the record it answers (a record no change names was not applied)."""
    fwd = find_method(cls, "forward")
    if fwd is None:
        return ForwardPatch("", unhandled=(f"{cls.name.value} defines no forward",))
    wanted = _Wanted(fixes)
    aliases = _aliases(fwd, {bl.attr for bl in block_lists if bl.is_blocks})
    splits, replace = _splits(src, fwd, aliases, wanted.split & {bl.attr for bl in block_lists if bl.is_blocks})
    changes = [Change(s.attr, f"`{s.slice_code}` is walked as `{s.new_attr}`", SplitSlices(s.attr)) for s in splits]
    per_block: list[PerBlock] = []
    rewriter = _Rewrite(src, replace, block_lists, aliases, changes, wanted, per_block, fwd)
    rewritten = fwd.visit(rewriter)
    rewritten = rewritten.visit(_DropUnusedAliases(aliases, rewritten))
    rewritten = rewritten.visit(_MarkUnusedUnpacked(rewritten))
    rewritten = rewritten.with_changes(name=cst.Name("patched_forward"))
    unhandled: list[str] = []
    model_defaults: list[str] = []
    data = signature.as_data(rewritten, "forward", f"{cls.name.value}.forward")
    if changes and data.function is None:  # nothing that needs forward replaced can be done
        unhandled.append(data.why)
        changes, splits, per_block, rewriter.after_block = [], [], [], []
    elif data.function is not None:
        rewritten = data.function
        model_defaults += data.from_model
    forward_changed = bool(changes)
    code = Code(cst.Module(body=[]).code_for_node(rewritten) if forward_changed else "")
    wrapped = data.wrapped if forward_changed else Code("")
    imports = _imports(ws, src, _with_decorators(rewritten, wrapped)) if forward_changed else []
    for item in [*per_block, *rewriter.after_block]:  # a hook runs the model's statements: the names they call
        holder = cst.FunctionDef(cst.Name("hook"), cst.Parameters(),  # come from the model's module
                                 cst.IndentedBlock(list(cst.parse_module(item.code).body)))
        imports += _imports(ws, src, holder)
    blocks = _block_patches(ws, block_lists, wanted.out_of_place, changes, unhandled, model_defaults, imports)
    reorders = _streams_first(block_lists, changes, unhandled)
    return ForwardPatch(code=code, splits=tuple(splits), changes=tuple(changes), imports=_sorted_imports(imports),
                        unhandled=tuple(unhandled), forward_changed=forward_changed, blocks=tuple(blocks),
                        per_block=tuple(per_block), after_block=tuple(rewriter.after_block),
                        streams_first=tuple(reorders), model_defaults=tuple(model_defaults), wrapped=wrapped)


class _Wanted:
    """The fix records, grouped by kind and keyed by block list, as the rewrite looks them up."""

    def __init__(self, fixes: tuple[Fix, ...]):
        self.split = {f.attr for f in fixes if isinstance(f, SplitSlices)}
        self.indexed = {f.attr for f in fixes if isinstance(f, ReadRecordedBlock)}
        self.positional = {f.attr: f for f in fixes if isinstance(f, StreamsPositional)}
        self.body = {f.attr: f for f in fixes if isinstance(f, LoopBody)}
        self.out_of_place = {f.attr: f for f in fixes if isinstance(f, OutOfPlace)}
        self.keywords = {f.attr: f for f in fixes if isinstance(f, PerBlockKeywords)}


def _splits(src: SourceFile, fwd: cst.FunctionDef, aliases: dict[str, str],
            attrs: set[str]) -> tuple[list[Split], list[tuple[cst.Subscript, str]]]:
    """Each distinct slice walked of the lists `attrs`, as a list of its own (the first keeps the list's name);
    and (the slice's node, the list it becomes) for the rewrite."""
    slices: dict[str, list[cst.Subscript]] = {}
    for loop in find_all(fwd, cst.For):
        sub = loop.iter
        if isinstance(sub, cst.Call) and dotted(sub.func) == "enumerate" and sub.args:
            sub = sub.args[0].value
        if isinstance(sub, cst.Subscript):
            attr = _list_attr(sub.value, aliases)
            if attr in attrs and not any(_same(sub, s) for s in slices.get(attr, [])):
                slices.setdefault(attr, []).append(sub)
    splits: list[Split] = []
    replace: list[tuple[cst.Subscript, str]] = []
    for attr, subs in slices.items():
        for i, sub in enumerate(subs):
            new_attr = attr if i == 0 else f"{attr}_{i + 1}"
            replace.append((sub, new_attr))
            guards = tuple(_as_transformer(src, g) for g in _guards(fwd, sub))
            rendered = Code(cst.Module(body=[]).code_for_node(_rebase(sub, aliases, attr).visit(_SelfToTransformer())))
            splits.append(Split(attr, new_attr, rendered, guards, f"part_{len(splits)}"))
    return splits, replace


def _block_patches(ws, block_lists, wanted: dict[str, OutOfPlace], changes: list[Change], unhandled: list[str],
                   model_defaults: list[str], imports: list) -> list[BlockPatch]:
    """Pitfall C: each block forward `wanted` names, rewritten out of place where every in-place write it lists
    is one the rewrite knows (`x += y`); `changes`, `unhandled`, `model_defaults` and `imports` grow."""
    blocks: list[BlockPatch] = []
    for bl in block_lists:
        fix = wanted.get(bl.attr)
        if fix is None or not (bl.is_blocks and bl.forward):
            continue
        b_src = ws.load(Path(bl.forward.file))
        b_cls = b_src.classes.get(bl.forward.cls)
        b_fwd = find_method(b_cls, "forward") if b_cls is not None else None
        if b_fwd is None:
            continue
        out_of_place = _OutOfPlace(b_src, set(bl.roles.values()), set(fix.lines))
        fixed = b_fwd.visit(out_of_place).with_changes(name=cst.Name(f"patched_{bl.attr}_forward"))
        if out_of_place.rewritten != set(fix.lines):
            continue  # a write the rewrite does not know (`.add_()`, `out=`): the finding stays manual
        data = signature.as_data(fixed, "forward", f"{bl.forward.cls}.forward")
        if data.function is None:
            unhandled.append(data.why)
            continue
        fixed = data.function
        model_defaults += data.from_model
        blocks.append(BlockPatch(bl.attr, f"patched_{bl.attr}_forward", Code(cst.Module(body=[]).code_for_node(fixed)),
                                 data.wrapped))
        imports += _imports(ws, b_src, _with_decorators(fixed, data.wrapped))
        changes.append(Change(bl.attr, f"`{bl.block_class}.forward` adds residuals out of place "
                                                    "instead of writing into its inputs (pitfall C)", fix))
    return blocks


def _streams_first(block_lists, changes: list[Change], unhandled: list[str]) -> list[StreamsFirst]:
    """Pitfall A, answered at the call: where the block's forward does not take the streams first, each block gets
    a forward that does (or, when no call can pass them first by name, the answer is withdrawn from `changes`)."""
    reorders = []
    for bl in block_lists:
        answer = next((c for c in changes if isinstance(c.fix, StreamsPositional) and c.attr == bl.attr), None)
        if answer is None or bl.forward is None:
            continue
        params = [p for p in bl.forward.params if p.name != "self"]
        streams = tuple(bl.roles[r] for r in ("hidden_states", "encoder_hidden_states") if r in bl.roles)
        positional = [p.name for p in params if p.kind in ("positional_only", "positional_or_keyword")]
        if tuple(positional[:len(streams)]) == streams:
            continue  # the wrapper's order is the block's own
        if any(p.kind in ("positional_only", "var_positional") for p in params):
            changes[:] = [c for c in changes if c is not answer]
            unhandled.append(f"{bl.attr}: `{bl.forward.cls}.forward` takes its streams after other parameters and "
                             "has positional-only or *args parameters: no call can pass them first by name")
            continue
        reorders.append(StreamsFirst(bl.attr, streams, tuple(n for n in positional if n not in streams)))
        changes.append(Change(bl.attr, f"`{bl.forward.cls}.forward` takes "
                              f"{', '.join(f'`{s}`' for s in streams)} among its parameters "
                              f"({', '.join(positional)}): each block is given a forward that takes them first, as "
                              "cache-dit's wrapper passes them, and passes every argument on by name", answer.fix))
    return reorders


class _OutOfPlace(cst.CSTTransformer):
    """`x += y` on a stream input at one of `lines` -> `x = x + y`: a new tensor, so cache-dit's saved input stays
    intact. `rewritten`: the lines it rewrote."""

    def __init__(self, src: SourceFile, streams: set[str], lines: set[int]):
        self.src, self.streams, self.lines = src, streams, lines
        self.rewritten: set[int] = set()

    def leave_AugAssign(self, original: cst.AugAssign, updated: cst.AugAssign):
        line = self.src.line(original)
        if isinstance(updated.target, cst.Name) and updated.target.value in self.streams and line in self.lines:
            op = getattr(cst, type(updated.operator).__name__.replace("Assign", ""), None)
            if op is not None:
                self.rewritten.add(line)
                return cst.Assign(targets=[cst.AssignTarget(updated.target)],
                                  value=cst.BinaryOperation(updated.target, op(), updated.value))
        return updated


def _aliases(fwd: cst.FunctionDef, attrs: set[str]) -> dict[str, str]:
    """`blocks = self.single_transformer_blocks` -> {"blocks": "single_transformer_blocks"}."""
    out = {}
    for assign in find_all(fwd, cst.Assign):
        target = assign.targets[0].target if len(assign.targets) == 1 else None
        attr = self_member(assign.value)
        if isinstance(target, cst.Name) and attr in attrs:
            out[target.value] = attr
    return out


def _list_attr(expr: cst.BaseExpression, aliases: dict[str, str]) -> str | None:
    return self_member(expr) or aliases.get(dotted(expr) or "")


def _rebase(sub: cst.Subscript, aliases: dict[str, str], attr: str) -> cst.Subscript:
    """Spell the list `blocks` (the PatchFunctor's local name for it) so the slice reads short."""

    class R(cst.CSTTransformer):
        def leave_Name(self, original: cst.Name, updated: cst.Name):
            return cst.Name("blocks") if aliases.get(updated.value) == attr else updated

        def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
            return cst.Name("blocks") if dotted(original) == f"self.{attr}" else updated

    return sub.visit(R())


def _same(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return a.deep_equals(b)


def _guards(fwd: cst.FunctionDef, target: cst.CSTNode) -> list[cst.BaseExpression]:
    """Conditions of the `if` statements enclosing `target` inside forward."""
    out: list[cst.BaseExpression] = []

    def walk(node: cst.CSTNode, stack: list[cst.BaseExpression]) -> bool:
        if node is target:
            out.extend(stack)
            return True
        from integrate.syntax import children

        for child in children(node):
            inner = stack + [node.test] if isinstance(node, cst.If) and child is node.body else stack
            if walk(child, inner):
                return True
        return False

    walk(fwd.body, [])
    return out


def _recorded(attr: str) -> cst.Subscript:
    """`self._integrate_blocks['<attr>']`: the blocks of list `attr` as the PatchFunctor recorded them before cache-dit
    wrapped the list."""
    return cst.Subscript(cst.Attribute(cst.Name("self"), cst.Name("_integrate_blocks")),
                         [cst.SubscriptElement(cst.Index(cst.SimpleString(repr(attr))))])


class _Rewrite(cst.CSTTransformer):
    """The forward's rewrite for the fixes `wanted` asks: slices walked as their own lists, `self.<list>[k]` read
    from the recorded blocks, the block call's streams positional, the loop body's statements hoisted or moved
    into per-block hooks. Each applied fix is appended to `changes`."""

    def __init__(self, src: SourceFile, replace: list[tuple[cst.Subscript, str]], block_lists, aliases, changes: list[Change],
                 wanted: _Wanted, per_block: list[PerBlock] | None = None, fwd: cst.FunctionDef | None = None):
        self.src, self.replace, self.aliases, self.changes, self.wanted = src, replace, aliases, changes, wanted
        self.per_block = per_block if per_block is not None else []
        self.fwd = fwd
        # the names forward binds (its parameters and assignments): what a hook may read from the recorded values
        self.locals = ({n.value for a in find_all(fwd.body, cst.Assign) for t in a.targets
                        for n in find_all(t.target, cst.Name)} | {p.name.value for p in params_of(fwd)}
                       if fwd is not None else set())
        self.indexed: set[str] = set()  # lists whose blocks forward reads by a constant index
        self.patterns = {bl.attr: bl.forward_pattern for bl in block_lists if bl.is_blocks}
        self.after_block: list[AfterBlock] = []
        # what cache-dit's wrapper takes apart from the call's keywords: both streams for Pattern_0-2, only
        # `hidden_states` for Pattern_3-5 (their wrapper passes every other argument on as the call gave it)
        self.streams = {bl.attr: {v for r, v in bl.roles.items()
                                  if r == "hidden_states" or bl.forward_pattern in ("Pattern_0", "Pattern_1", "Pattern_2")}
                        for bl in block_lists if bl.is_blocks}
        self.pitfall_a = {bl.attr: bl for bl in block_lists if bl.is_blocks and bl.attr in wanted.positional}

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript):
        split = next((new for sub, new in self.replace if original.deep_equals(sub)), None)
        if split is not None:  # a walk over a slice: it walks the list the slice became
            return cst.Attribute(cst.Name("self"), cst.Name(split))
        attr = self_member(original.value)
        index = original.slice[0].slice if len(original.slice) == 1 else None
        constant = isinstance(index, cst.Index) and (isinstance(index.value, cst.Integer) or (
            isinstance(index.value, cst.UnaryOperation) and isinstance(index.value.expression, cst.Integer)))
        if attr in self.wanted.indexed and constant and not any(self_member(sub.value) == attr for sub, _ in self.replace):
            # `self.layers[0]` outside the loop: once cache-dit holds the list in one wrapper that is the wrapper;
            # read the block the PatchFunctor recorded before the list was wrapped
            self.indexed.add(attr)
            return updated.with_changes(value=_recorded(attr))
        return updated

    def leave_CompFor(self, original: cst.CompFor, updated: cst.CompFor):
        attr = _list_attr(original.iter, self.aliases)
        if attr in self.wanted.indexed and attr in self.patterns:
            # `[b.attn.processor for b in self.blocks]`: once cache-dit holds the list in one wrapper, the
            # comprehension walks the wrapper; walk the blocks the PatchFunctor recorded before the list was wrapped
            self.indexed.add(attr)
            return updated.with_changes(iter=_recorded(attr))
        return updated

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        for attr in sorted(self.indexed):
            self.changes.append(Change(attr, f"`self.{attr}[k]` (or a comprehension over `self.{attr}`) in forward "
                                             "reads the blocks recorded before cache-dit wraps the list",
                                       ReadRecordedBlock(attr)))
        self.indexed = set()
        return updated

    def leave_For(self, original: cst.For, updated: cst.For):
        iterable = original.iter
        target = original.target  # the name each block is bound to: `block`, or `block` of `i, block`
        if isinstance(iterable, cst.Call) and dotted(iterable.func) == "enumerate" and iterable.args:
            iterable = iterable.args[0].value
            if isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2:
                target = target.elements[1].value
        if isinstance(iterable, cst.Subscript):
            iterable = iterable.value
        attr = _list_attr(iterable, self.aliases)
        if attr is None:
            return updated
        if attr in self.pitfall_a:
            positional = _Positional(self.pitfall_a[attr], target)
            updated = updated.visit(positional)
            if positional.rewritten:  # else the finding stays unanswered: written to the manual part, never claimed
                self.changes.append(Change(attr, f"the `{attr}` block call passes its streams "
                                                              "positionally (pitfall A)", self.wanted.positional[attr]))
        keywords = self._per_block_keywords(attr, original, target)
        result = self._loop_body(attr, original, updated)
        if not keywords:
            return result
        nodes = list(result.nodes) if isinstance(result, cst.FlattenSentinel) else [result]
        return cst.FlattenSentinel([*(_record(f) for f in keywords), *nodes])

    def _per_block_keywords(self, attr: str, loop: cst.For, block: cst.BaseExpression) -> list[PerBlock]:
        """The block call's keywords that read the loop index (`mask=masks[i]`), each computed again for every
        block by a pre-hook from its own index and the values forward holds before the loop; all of them or none
        (then the finding stays manual)."""
        fix = self.wanted.keywords.get(attr)
        found = self._index_dependent(attr, loop, need_body=False) if fix is not None else None
        if found is None or not isinstance(block, cst.Name):
            return []
        index_var = found[0]
        calls = [c for c in find_all(loop.body, cst.Call)
                 if isinstance(c.func, cst.Name) and c.func.value == block.value]
        args = {a.keyword.value: a.value for a in calls[0].args if isinstance(a.keyword, cst.Name)} if calls else {}
        assigned_in_loop = _assigned(loop.body)
        out = []
        for keyword in fix.keywords:
            value = args.get(keyword)
            reads = names_read(value) - {"self", index_var} if value is not None else set()
            code = Code(f"{keyword}_of_block = " + cst.Module(body=[]).code_for_node(value.visit(_SelfToTransformer()))
                        if value is not None else "")
            if value is None or reads & assigned_in_loop or not reads <= self.locals | BUILTINS or "\n" in code:
                return []
            out.append(PerBlock(attr, f"_per_block_{attr}_{keyword}", f"_integrate_{attr}_{keyword}_env", index_var,
                                tuple(sorted(reads & self.locals)), keyword, f"{keyword}_of_block", code))
        self.changes.append(Change(attr, "; ".join(f"`{f.keyword}` computed again for each block of `{attr}` from its "
                                                   "own index" for f in out) + " (a per-block argument)", fix))
        self.per_block += out
        return out

    def _loop_body(self, attr: str, original: cst.For, updated: cst.For):
        """The loop body's statements the LoopBody fix asks about: hoisted above the loop, or run for each block
        in hooks; all of them or none (then the finding stays manual)."""
        fix = self.wanted.body.get(attr)
        if fix is None:
            return updated
        hoisted = []
        if fix.hoist and len(updated.body.body) == len(original.body.body):  # the statements at the fix's lines
            body = []
            for stmt, orig in zip(updated.body.body, original.body.body):
                (hoisted if self.src.line(orig) in fix.hoist else body).append(stmt)
            if hoisted:
                updated = updated.with_changes(body=updated.body.with_changes(body=body))
        folds = self._per_block(attr, original)
        after, moved = self._after_block(attr, original)
        answered = len(hoisted) + len(folds) + moved
        if answered and answered == len(fix.hoist) + len(fix.by_index) + len(fix.others):  # all, or it stays manual
            said = [f"{len(hoisted)} loop-invariant statement(s) hoisted out of the `{attr}` loop"] if hoisted else []
            said += [f"`{f.target}` computed again for each block of `{attr}` from its own index "
                     f"(passed as `{f.keyword}`)" for f in folds]
            if after is not None:
                said.append(f"{moved} statement(s) after the `{attr}` block call run on each block's output, with "
                            "its own index")
                body = list(updated.body.body)[:len(updated.body.body) - moved]
                updated = updated.with_changes(body=updated.body.with_changes(body=body))
                self.after_block.append(after)
            self.changes.append(Change(attr, "; ".join(said) + " (pitfall B)", fix))
            self.per_block += folds
            record = [_record(f) for f in folds] + ([_record(after)] if after is not None else [])
            return cst.FlattenSentinel([*hoisted, *record, updated])
        if hoisted and not (fix.by_index or fix.others):
            self.changes.append(Change(attr, f"{len(hoisted)} loop-invariant statement(s) hoisted "
                                                          f"out of the `{attr}` loop (pitfall B)", fix))
            return cst.FlattenSentinel([*hoisted, updated])
        return updated

    def _index_dependent(self, attr: str, loop: cst.For,
                         need_body: bool = True) -> tuple[str, str | None, set[int]] | None:
        """(index variable, block variable, lines of the list's active index-dependent statements) of a loop
        `for i, block in enumerate(...)` that has such statements (`need_body=False`: any such loop, for a caller
        that needs only its index); None for any other loop."""
        if self.fwd is None or not (isinstance(loop.iter, cst.Call) and dotted(loop.iter.func) == "enumerate"
                                    and isinstance(loop.target, cst.Tuple) and len(loop.target.elements) == 2
                                    and isinstance(loop.target.elements[0].value, cst.Name)):
            return None
        fix = self.wanted.body.get(attr)
        wanted = set(fix.by_index) if fix is not None else set()
        if not wanted and need_body:
            return None
        block = loop.target.elements[1].value
        return loop.target.elements[0].value.value, block.value if isinstance(block, cst.Name) else None, wanted

    def _per_block(self, attr: str, loop: cst.For) -> list[PerBlock]:
        """The loop's index-dependent statements that are per-block arguments: `t = <expr>` at the top of the
        body, reading the index, `self` and values set before the loop, whose target only ever reaches the
        block as one keyword (`kw=t`) that is not a stream. [] unless every index-dependent statement is one."""
        found = self._index_dependent(attr, loop)
        if found is None:
            return []
        index_var, block_var, wanted = found
        assigned_in_loop = _assigned(loop.body)
        out = []
        for stmt in loop.body.body:
            if self.src.line(stmt) not in wanted:
                continue
            small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
            if not (isinstance(small, cst.Assign) and len(small.targets) == 1
                    and isinstance(small.targets[0].target, cst.Name)):
                continue
            target = small.targets[0].target.value
            keyword = self._only_keyword(loop, target, block_var)
            reads = names_read(small.value) - {"self", index_var}
            if keyword is None or keyword in self.streams.get(attr, set()) or reads & assigned_in_loop:
                continue
            names = tuple(sorted(reads & self.locals))
            bare = stmt.with_changes(leading_lines=[])  # the statement, not the comments above it
            code = Code(cst.Module(body=[]).code_for_node(bare.visit(_SelfToTransformer())).strip())
            if "\n" in code:
                continue  # the hook holds the statement on one line of its own
            out.append(PerBlock(attr, f"_per_block_{attr}_{target}", f"_integrate_{attr}_{target}_env", index_var,
                                names, keyword, target, code))
        return out

    def _after_block(self, attr: str, loop: cst.For) -> tuple[AfterBlock | None, int]:
        """The statements after the block call, when each is index-dependent and together they only update the
        stream the call returns (`if i % 5 == 0: h = self.adapter[i // 5](h, m) + h`): they become a forward hook
        on each block, run with its index on its output (a Pattern_2 or Pattern_3 block returns the stream alone).
        (the record, how many statements) or (None, 0)."""
        found = self._index_dependent(attr, loop)
        if found is None or found[1] is None or self.patterns.get(attr) not in ("Pattern_2", "Pattern_3"):
            return None, 0
        index_var, block_var, wanted = found
        body = list(loop.body.body)
        calls = [i for i, stmt in enumerate(body) if any(
            isinstance(c.func, cst.Name) and c.func.value == block_var for c in find_all(stmt, cst.Call))]
        if len(calls) != 1:
            return None, 0
        after = body[calls[0] + 1:]
        stream = self._call_target(body[calls[0]], block_var)
        if not after or stream is None or any(self.src.line(stmt) not in wanted for stmt in after):
            return None, 0
        written = set().union(*(_assigned(st) for st in after))
        if stream not in written or find_all(cst.Module(body=after), cst.AugAssign):
            return None, 0
        reads = set().union(*(names_read(st) for st in after)) - {"self", index_var, stream} - written
        if reads & _assigned(cst.Module(body=body[:calls[0] + 1])):
            return None, 0
        moved = cst.Module(body=[st.visit(_SelfToTransformer()) for st in after]).with_changes(header=[])
        first = moved.body[0].with_changes(leading_lines=[])  # the statements, not the comments above them
        moved = moved.with_changes(body=[first, *moved.body[1:]])
        return AfterBlock(attr, f"_after_block_{attr}", f"_integrate_{attr}_after_env", index_var,
                          tuple(sorted(reads & self.locals)), stream, Code(moved.code.rstrip())), len(after)

    @staticmethod
    def _call_target(stmt: cst.BaseStatement, block_var: str) -> str | None:
        """The one name every direct call of the block in `stmt` is assigned to (`h = block(...)`)."""
        targets = set()
        for assign in find_all(stmt, cst.Assign):
            if isinstance(assign.value, cst.Call) and (
                    (isinstance(assign.value.func, cst.Name) and assign.value.func.value == block_var)
                    or (dotted(assign.value.func) or "").endswith("_gradient_checkpointing_func")):
                if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
                    return None
                targets.add(assign.targets[0].target.value)
        return targets.pop() if len(targets) == 1 else None

    @staticmethod
    def _only_keyword(loop: cst.For, target: str, block_var: str | None) -> str | None:
        """The keyword `target` is passed as in the direct block call (`block(..., kw=target)`), when that is its
        only use in the loop besides its own assignment and the gradient-checkpointing call's positional copy."""
        keyword = None
        for call in find_all(loop.body, cst.Call):
            for arg in call.args:
                if target not in names_read(arg.value):
                    continue
                direct = isinstance(call.func, cst.Name) and call.func.value == block_var
                if direct and arg.keyword is not None and isinstance(arg.value, cst.Name):
                    if keyword not in (None, arg.keyword.value):
                        return None
                    keyword = arg.keyword.value
                elif not (dotted(call.func) or "").endswith("_gradient_checkpointing_func"):
                    return None
        return keyword


def _with_decorators(fn: cst.FunctionDef, wrapped: Code) -> cst.FunctionDef:
    """`fn` carrying the expression `_apply` wraps it in, so the names that expression reads are imported too."""
    return fn.with_changes(decorators=[cst.Decorator(cst.parse_expression(wrapped))]) if wrapped else fn


def _assigned(node: cst.CSTNode) -> set[str]:
    """The names `node`'s assignments bind."""
    return {n.value for a in find_all(node, cst.Assign) for t in a.targets for n in find_all(t.target, cst.Name)}


def _record(f: _Hook) -> cst.SimpleStatementLine:
    """`self.<env_attr> = {"name": name, ...}`: the loop-invariant values the per-block hook reads, recorded
    by the patched forward just before the loop."""
    value = cst.Dict([cst.DictElement(cst.SimpleString(repr(n)), cst.Name(n)) for n in f.names])
    target = cst.AssignTarget(cst.Attribute(cst.Name("self"), cst.Name(f.env_attr)))
    return cst.SimpleStatementLine([cst.Assign([target], value)])


class _MarkUnusedUnpacked(cst.CSTTransformer):
    """`B, C, H, W = x.shape` with C never read -> `B, _C, H, W = ...` (lint-clean; behaviour unchanged)."""

    def __init__(self, fn: cst.FunctionDef):
        stored = {id(n) for a in find_all(fn.body, cst.Assign) for t in a.targets
                  for n in find_all(t.target, cst.Name)}
        attrs = {id(a.attr) for a in find_all(fn.body, cst.Attribute)}
        self.read = {n.value for n in find_all(fn.body, cst.Name) if id(n) not in stored | attrs}

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        targets = []
        for t in updated.targets:
            if isinstance(t.target, cst.Tuple):
                elements = [el.with_changes(value=cst.Name("_" + el.value.value))
                            if isinstance(el.value, cst.Name) and el.value.value not in self.read
                            and not el.value.value.startswith("_") else el for el in t.target.elements]
                t = t.with_changes(target=t.target.with_changes(elements=elements))
            targets.append(t)
        return updated.with_changes(targets=targets)


class _DropUnusedAliases(cst.CSTTransformer):
    """`blocks = self.single_transformer_blocks` is dead once every walk names its own list: drop it."""

    def __init__(self, aliases: dict[str, str], fn: cst.FunctionDef):
        attrs = {id(a.attr) for a in find_all(fn.body, cst.Attribute)}
        reads: dict[str, int] = {}
        for n in find_all(fn.body, cst.Name):
            if id(n) not in attrs:
                reads[n.value] = reads.get(n.value, 0) + 1
        self.dead = {a for a in aliases if reads.get(a, 0) <= 1}

    def leave_SimpleStatementLine(self, original, updated):
        small = updated.body[0] if len(updated.body) == 1 else None
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name) \
                and small.targets[0].target.value in self.dead:
            return cst.RemoveFromParent()
        return updated


class _Positional(cst.CSTTransformer):
    """`block(hidden_states=h, encoder_hidden_states=e, temb=t)` -> `block(h, e, temb=t)` (wrapper order)."""

    def __init__(self, bl: BlockList, target: cst.BaseExpression):
        self.block_var = target.value if isinstance(target, cst.Name) else None
        params = [p.name for p in bl.forward.params] if bl.forward else []
        roles = bl.roles
        self.order = [roles[r] for r in ("hidden_states", "encoder_hidden_states") if r in roles]
        self.params = params
        self.rewritten = 0  # block calls rewritten

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if not (isinstance(original.func, cst.Name) and original.func.value == self.block_var):
            return updated
        positional = [a for a in updated.args if a.keyword is None and not a.star]
        by_name: dict[str, cst.Arg] = {}
        for i, a in enumerate(positional):
            if i < len(self.params):
                by_name[self.params[i]] = a
        for a in updated.args:
            if a.keyword is not None:
                by_name[a.keyword.value] = a
        if not all(p in by_name for p in self.order):
            return updated
        # cache-dit's wrapper calls `block(hidden_states, encoder_hidden_states, *args, **kwargs)`: a keyword of the
        # block named like one of the wrapper's own parameters but meaning another stream (LTX-2's
        # `encoder_hidden_states`, third after `audio_hidden_states`) would meet that parameter twice, so every
        # argument up to it goes positionally, in the block's own order
        order = list(self.order)  # this call's: the streams, then any argument up to a clashing name
        clash = [p for p in ("hidden_states", "encoder_hidden_states") if p in by_name and p not in order]
        if clash:
            if self.params[:len(order)] != order or any(p not in self.params for p in clash):
                return updated
            order = self.params[:max(self.params.index(p) for p in clash) + 1]
            if not all(p in by_name for p in order):
                return updated
        # each argument keeps its own layout (comma, line break); only its keyword comes or goes
        args = [by_name[p].with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT) for p in order]
        tight = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
        args += [a if a.keyword is not None else a.with_changes(keyword=cst.Name(p), equal=tight)
                 for p, a in by_name.items() if p not in order]
        args += [a for a in updated.args if a.star]
        if args and updated.args:  # the last argument ends the call as the original's last one did
            args[-1] = args[-1].with_changes(comma=updated.args[-1].comma)
            args[:-1] = [a if a.comma is not cst.MaybeSentinel.DEFAULT else a.with_changes(comma=cst.Comma(
                whitespace_after=cst.SimpleWhitespace(" "))) for a in args[:-1]]
        self.rewritten += 1
        return updated.with_changes(args=args)


def _imports(ws, src: SourceFile, fwd: cst.FunctionDef) -> list[tuple[str, str | None]]:
    """(module, name) for every module-level name the forward reads (name None: `import module`)."""
    own = {p.name.value for p in params_of(fwd)}
    used = names_read(fwd) - own - {"self"}
    module = src.dotted_name
    out: set[tuple[str, str | None]] = set()
    for name in sorted(used):
        imp = src.imports.get(name)
        if imp is not None and imp.name is None:
            out.add((imp.module, None) if imp.module == name else (f"{imp.module} as {name}", None))
        elif imp is not None:
            qual = ws.qualname(src, cst.Name(name)) or ""
            owner, _, attr = qual.rpartition(".")
            if owner and attr == name:
                out.add((owner, name))
            elif module:
                out.add((module, name))
        elif (name in src.classes or name in src.functions or name in src.assigns) and module:
            out.add((module, name))
    return list(_sorted_imports(out))


def _sorted_imports(pairs) -> tuple[tuple[str, str | None], ...]:
    """(module, name) pairs, each once, sorted: `import torch` (name None) beside `from torch import Tensor`."""
    return tuple(sorted(set(pairs), key=lambda pair: (pair[0], pair[1] or "")))


def import_block(pairs, local: tuple[str, ...] = ()) -> Code:
    """Import statements grouped the way isort (and ruff's I001) expects: stdlib, then third party;
    plain imports before from-imports; modules and names sorted; one statement per module. Every module
    and name is checked to be a dotted name / identifier first (`import x.y as z` allowed)."""
    import sys

    groups: dict[int, dict[str, set[str] | None]] = {0: {}, 1: {}, 2: {}}
    for module, name in pairs:
        path, _, alias = module.partition(" as ")
        escape.dotted(path)
        if alias:
            escape.ident(alias)
        if name is not None:
            escape.ident(name)
        top = module.split(".")[0].split(" ")[0]
        bucket = groups[0 if top in sys.stdlib_module_names else 2 if top in local else 1]
        if name is None:
            bucket.setdefault(f"import {module}", None)
        else:
            bucket.setdefault(f"from {module} import", set()).add(name)
    blocks = []
    for section in (0, 1, 2):
        bucket = groups[section]
        plain = sorted(k for k, v in bucket.items() if v is None)
        froms = sorted((k for k, v in bucket.items() if v is not None), key=lambda k: k.split(" ")[1])
        lines = plain + [_from_line(k, sorted(bucket[k])) for k in froms]
        if lines:
            blocks.append("\n".join(lines))
    return Code("\n\n".join(blocks))


def _from_line(head: str, names: list[str], width: int = 88) -> str:
    line = f"{head} {', '.join(names)}"
    if len(line) <= width:
        return line
    return head + " (\n" + "".join(f"    {n},\n" for n in names) + ")"
