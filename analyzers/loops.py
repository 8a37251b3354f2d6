"""How the transformer's forward walks each block list: loops, the block call, the loop body.

Once cache-dit swaps a list for a one-element list holding its wrapper, the loop body runs
once. Anything the body does besides calling the block (pitfall B), slices and `len()` of
the list, several loops over it and lists held in containers all change meaning then.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from integrate.defuse import PLAIN, defuse
from integrate.source import SourceFile, dotted, find_method, iter_methods
from integrate.syntax import (BUILTINS, assigned_names, body_of, find_all, names_read, self_attr, target_names,
                              walk_statements)

from integrate.records import Evidence

from .reach import Defaults, reached_methods
from .records import ExtraOp

CHECKPOINT_FUNCS = ("_gradient_checkpointing_func", "checkpoint", "gradient_checkpointing_func")


@dataclass
class Loop:
    method: str
    node: cst.For
    line: int
    iter_code: str
    block_var: str | None
    index_var: str | None
    sliced: bool
    keys: tuple[str, ...]  # ModuleDict keys looped over
    zipped_with: tuple[str, ...]
    call: cst.Call | None = None
    call_skip: int = 0  # 1 when the block is passed to a checkpoint function
    call_stmt: cst.CSTNode | None = None
    outputs: tuple[str, ...] = ()
    arms: frozenset[tuple[int, str]] = frozenset()  # (id of an enclosing `if`, "body" | "else") it sits in
    indexed: str | None = None  # `x = out[0]` after `out = block(...)`: the code that picks the stream
    picked: int | None = None  # the constant index `indexed` reads (0: the stream is the output's first item)
    opaque: tuple[int, str] | None = None  # (line, why): the block is handed to a helper that could not be read
    off: Evidence | None = None  # why the walk does not run with the constructor's defaults (reach.Defaults)

    def excludes(self, other: Loop) -> bool:
        """The two loops sit in different arms of one `if` / `else`: a call runs at most one of them."""
        return any((node, "else" if arm == "body" else "body") in other.arms for node, arm in self.arms)


def walks_per_call(loops: list[Loop]) -> list[Loop]:
    """The most loops one call can run: the largest set of them no two of which exclude each other (an
    `if gradient_checkpointing: for ...  else: for ...` pair is one walk per call, not two)."""
    import itertools

    for size in range(len(loops), 1, -1):
        for group in itertools.combinations(loops, size):
            if not any(a.excludes(b) for a, b in itertools.combinations(group, 2)):
                return list(group)
    return loops[:1]


def _arms(fn: cst.FunctionDef) -> dict[int, frozenset[tuple[int, str]]]:
    """{id of each `for` in fn: the `if` arms it sits in}."""
    out: dict[int, set[tuple[int, str]]] = {}
    for branch in find_all(fn.body, cst.If):
        for arm, part in (("body", branch.body), ("else", branch.orelse)):
            if part is None:
                continue
            for loop in find_all(part, cst.For):
                out.setdefault(id(loop), set()).add((id(branch), arm))
    return {k: frozenset(v) for k, v in out.items()}


@dataclass
class ListUse:
    loops: list[Loop] = field(default_factory=list)
    # reads outside a loop header: (line, "len" | "sliced" | "indexed", what, in words)
    notes: list[tuple[int, str, str]] = field(default_factory=list)
    off: dict[int, Evidence] = field(default_factory=dict)  # {line of a note: why it does not run by default}
    defaults: Defaults | None = None  # what the constructor's defaults switch off in the class's methods


def _refers(expr: cst.BaseExpression, attr: str, aliases: set[str]) -> tuple[bool, bool, tuple[str, ...]]:
    """(refers to the list, through a slice, ModuleDict keys)."""
    sliced, keys = False, ()
    while isinstance(expr, cst.Subscript):
        sub = expr.slice[0].slice if expr.slice else None
        if isinstance(sub, cst.Slice):
            sliced = True
        elif isinstance(sub, cst.Index) and isinstance(sub.value, cst.SimpleString):
            keys = (*keys, sub.value.evaluated_value)
        expr = expr.value
    if self_attr(expr) == attr or (isinstance(expr, cst.Name) and expr.value in aliases):
        return True, sliced, keys
    return False, False, ()


def _list_aliases(src: SourceFile, fn: cst.FunctionDef, attrs: list[str]) -> dict[str, set[str]]:
    """For each list attribute, the local names `fn` binds to the whole list (`blocks = self.blocks`; a slice
    `self.blocks[1:]` is no alias)."""
    aliases: dict[str, set[str]] = {a: set() for a in attrs}
    for _, names, value, _ in defuse(src, fn).statements(PLAIN):
        for attr in attrs:
            refers, sliced, _ = _refers(value, attr, set())
            if refers and not sliced:
                aliases[attr].update(names)
    return aliases


def _unwrap_iter(it: cst.BaseExpression):
    """enumerate(x) / zip(a, b) / reversed(x) -> (iterables, enumerated)."""
    name = dotted(it.func) if isinstance(it, cst.Call) else None
    if name in ("enumerate", "reversed") and it.args:
        inner, enum = _unwrap_iter(it.args[0].value)
        return inner, enum or name == "enumerate"
    if name == "zip":
        return [a.value for a in it.args], False
    return [it], False


def find_list_uses(src: SourceFile, cls: cst.ClassDef, attrs: list[str], ws=None,
                   config: dict | None = None) -> dict[str, ListUse]:
    """Every walk over and read of each list in the class's methods. `ws` (a Workspace): to read a helper the
    block is handed to that another file defines (`auto_grad_checkpoint(block, x)`); `config`: the model's config,
    the constructor arguments that decide which code its flags switch off (reach.Defaults)."""
    helpers = _Helpers(ws, src, cls)
    defaults = Defaults(ws, src, cls, config)
    uses = {a: ListUse(defaults=defaults) for a in attrs}
    reached = reached_methods(cls)  # a walk forward never runs happens while the list is whole: not a use
    for fn in iter_methods(cls):
        if fn.name.value == "__init__" or (reached is not None and fn.name.value not in reached):
            continue
        before = {a: (len(u.loops), len(u.notes)) for a, u in uses.items()}
        _uses_in(src, fn, attrs, uses, helpers)
        for attr, use in uses.items():  # code the constructor's defaults switch off runs no walk and no read
            for loop in use.loops[before[attr][0]:]:
                loop.off = defaults.off(loop.method, loop.line)
            for line, _, _ in use.notes[before[attr][1]:]:
                if (why := defaults.off(fn.name.value, line)) is not None:
                    use.off[line] = why
    return uses


def _uses_in(src: SourceFile, fn: cst.FunctionDef, attrs: list[str], uses: dict[str, ListUse], helpers) -> None:
    """The walks over and reads of each list in one method, added to `uses`."""
    aliases = _list_aliases(src, fn, attrs)
    in_loop_iter: set[int] = set()
    arms = _arms(fn)
    for loop in find_all(fn.body, cst.For):
        iterables, enumerated = _unwrap_iter(loop.iter)
        for attr in attrs:
            hits = [(_refers(x, attr, aliases[attr]), x) for x in iterables]
            hit = next(((r, x) for r, x in hits if r[0]), None)
            if hit is None:
                continue
            (_, sliced, keys), expr = hit
            for n in find_all(loop.iter, (cst.Attribute, cst.Name, cst.Subscript), skip_functions=False):
                in_loop_iter.add(id(n))
            others = tuple(src.code(x) for r, x in hits if not r[0])
            found = _make_loop(src, fn, loop, attr, iterables, expr, enumerated, sliced, keys, others, helpers)
            found.arms = arms.get(id(loop), frozenset())
            uses[attr].loops.append(found)
    # a comprehension over the list that reads its blocks' attributes (`[b.attn.processor for b in
    # self.blocks]`): once cached, it walks the one wrapper, which has none of them
    for comp in find_all(fn.body, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
        head = comp.for_in
        for attr in attrs:
            if not _refers(head.iter, attr, aliases[attr])[0]:
                continue
            for n in find_all(head.iter, (cst.Attribute, cst.Name, cst.Subscript), skip_functions=False):
                in_loop_iter.add(id(n))
            names = set(target_names(head.target))
            body = comp.key if isinstance(comp, cst.DictComp) else comp.elt
            reads = [a for a in find_all(body, cst.Attribute, skip_functions=False)
                     if isinstance(a.value, cst.Name) and a.value.value in names]
            if reads:
                uses[attr].notes.append((src.line(comp), "comprehension",
                                         f"`{src.code(comp)[:80]}` (reads `{src.code(reads[0])}` of each "
                                         f"block) in {fn.name.value}"))
    # len(list), list[i] outside loop headers; a length only tested for emptiness (`if len(self.blocks) > 0`)
    # is the same for the wrapper cache-dit leaves there (one element for a list that had some)
    emptiness = _emptiness_tests(fn)
    for call in find_all(fn.body, cst.Call):
        if dotted(call.func) == "len" and call.args and id(call) not in emptiness:
            for attr in attrs:
                if _refers(call.args[0].value, attr, aliases[attr])[0]:
                    uses[attr].notes.append((src.line(call), "len", f"`{src.code(call)}` in {fn.name.value}"))
    for sub in find_all(fn.body, cst.Subscript):
        if id(sub) in in_loop_iter:
            continue
        for attr in attrs:
            refers, sliced, keys = _refers(sub, attr, aliases[attr])
            base = sub.value
            if refers and not keys and (self_attr(base) == attr or isinstance(base, cst.Name)):
                what = "sliced" if sliced else "indexed"
                uses[attr].notes.append((src.line(sub), what, f"{what} as `{src.code(sub)}` in {fn.name.value}"))


def _is_len(node) -> bool:
    return isinstance(node, cst.Call) and dotted(node.func) == "len" and bool(node.args)


def _emptiness_tests(fn: cst.FunctionDef) -> set[int]:
    """ids of the `len(x)` calls `fn` uses only to ask whether x is empty: `len(x) > 0`, `len(x) != 0`,
    `len(x) >= 1`, `0 < len(x)`, `if len(x):`, `not len(x)`, `bool(len(x))`."""
    out: set[int] = set()
    nonempty = {(cst.GreaterThan, 0), (cst.NotEqual, 0), (cst.GreaterThanEqual, 1), (cst.Equal, 0)}
    flipped = {(cst.LessThan, 0), (cst.NotEqual, 0), (cst.LessThanEqual, 1), (cst.Equal, 0)}
    for cmp in find_all(fn.body, cst.Comparison):
        if len(cmp.comparisons) != 1:
            continue
        op, right = cmp.comparisons[0].operator, cmp.comparisons[0].comparator
        if _is_len(cmp.left) and isinstance(right, cst.Integer) and (type(op), int(right.value)) in nonempty:
            out.add(id(cmp.left))
        elif _is_len(right) and isinstance(cmp.left, cst.Integer) and (type(op), int(cmp.left.value)) in flipped:
            out.add(id(right))
    for node in find_all(fn.body, (cst.If, cst.While, cst.IfExp)):
        if _is_len(node.test):
            out.add(id(node.test))
    for op in find_all(fn.body, cst.UnaryOperation):
        if isinstance(op.operator, cst.Not) and _is_len(op.expression):
            out.add(id(op.expression))
    for call in find_all(fn.body, cst.Call):
        if dotted(call.func) == "bool" and len(call.args) == 1 and _is_len(call.args[0].value):
            out.add(id(call.args[0].value))
    return out


def _make_loop(src, fn, loop, attr, iterables, expr, enumerated, sliced, keys, others, helpers=None) -> Loop:
    target = loop.target
    index_var = block_var = None
    if enumerated and isinstance(target, cst.Tuple) and len(target.elements) == 2:
        index_var = target_names(target.elements[0].value)[0] if target_names(target.elements[0].value) else None
        target = target.elements[1].value
    if isinstance(target, cst.Tuple) and len(iterables) > 1:
        pos = next(i for i, x in enumerate(iterables) if x is expr)
        target = target.elements[pos].value if pos < len(target.elements) else target
    if isinstance(target, cst.Name):
        block_var = target.value
    found = Loop(fn.name.value, loop, src.line(loop), src.code(loop.iter), block_var, index_var, sliced, keys, others)
    if block_var is not None:
        _find_call(src, found, helpers)
    return found


class _Helpers:
    """Whether a function the block is handed to (`ckpt(block, x, c)`) calls it with the rest of its arguments
    at inference, as a checkpoint helper does: read from its body (this module's functions, the class's methods,
    a function imported from a file the Workspace reaches)."""

    def __init__(self, ws, src: SourceFile, cls: cst.ClassDef) -> None:
        self.ws, self.src, self.cls = ws, src, cls

    def passes_through(self, name: str) -> bool | None:
        """True: a function that calls its first argument with the rest; False: it does not, or the name is no
        function of the code (a builtin such as `isinstance`, a local, a sub-module's method); None: a function
        of the code (the module's, the class's, one imported) whose body cannot be read."""
        head = name.split(".")[0]
        if head in BUILTINS and head not in self.src.imports and head not in self.src.functions:
            return False
        if head == "self":
            fn = find_method(self.cls, name[5:]) if name.count(".") == 1 else None
            return _calls_first_with_rest(fn) if fn is not None else False
        if name in self.src.functions:
            return _calls_first_with_rest(self.src.functions[name])
        if head not in self.src.imports:
            return False
        found = self.ws.resolve(self.src, name) if self.ws is not None else None
        fn = getattr(found, "node", None)
        return _calls_first_with_rest(fn) if isinstance(fn, cst.FunctionDef) else None


def _calls_first_with_rest(fn: cst.FunctionDef) -> bool:
    """`def ckpt(module, *args, **kwargs)` whose body calls `module(*args, **kwargs)` or hands module on to a
    checkpoint function."""
    p = fn.params
    positional = [x.name.value for x in (*p.posonly_params, *p.params)]
    if positional[:1] == ["self"]:
        positional = positional[1:]
    if not positional:
        return False
    first = positional[0]
    star = p.star_arg.name.value if isinstance(p.star_arg, cst.Param) else None
    for call in find_all(fn.body, cst.Call):
        args = call.args
        if isinstance(call.func, cst.Name) and call.func.value == first:
            if star is None or any(a.star == "*" and isinstance(a.value, cst.Name) and a.value.value == star
                                   for a in args):
                return True
        name = (dotted(call.func) or "").split(".")[-1]
        if name in CHECKPOINT_FUNCS and args and isinstance(args[0].value, cst.Name) and args[0].value.value == first:
            return True
    return False


def _find_call(src: SourceFile, loop: Loop, helpers: _Helpers | None = None) -> None:
    """The block call in the body: prefer `block(...)` over `checkpoint(block, ...)` or a helper of the
    repository's own that calls the block with the rest of its arguments; a helper whose body cannot be read is
    recorded as opaque (the walk's verdict is then unknown, never "not looped over")."""
    direct, ckpt = [], []
    for call in find_all(loop.node.body, cst.Call):
        if isinstance(call.func, cst.Name) and call.func.value == loop.block_var:
            direct.append(call)
            continue
        name = dotted(call.func) or ""
        first = call.args[0].value if call.args else None
        if not (isinstance(first, cst.Name) and first.value == loop.block_var and first is not None):
            continue
        through = True if name.split(".")[-1] in CHECKPOINT_FUNCS else (
            helpers.passes_through(name) if helpers is not None and name else None)
        if through:
            ckpt.append(call)
        elif through is None and loop.opaque is None:
            loop.opaque = (src.line(call), f"the block is handed to `{name or src.code(call.func)}`, whose body "
                                           "could not be read: whether it calls the block is unknown")
    chosen = direct[0] if direct else (ckpt[0] if ckpt else None)
    if chosen is None:
        return
    loop.call, loop.call_skip = chosen, 0 if direct else 1
    calls = {id(c) for c in (*direct, *ckpt)}
    for stmt in body_of(loop.node):
        if any(id(c) in calls for c in find_all(stmt, cst.Call)):
            loop.call_stmt = loop.call_stmt or stmt
    # outputs: the assignment whose value holds the chosen call
    body = defuse(src, loop.node).statements(PLAIN)
    for _, names, value, node in body:
        if isinstance(value, cst.Subscript) and value.value is chosen:  # `y = block(y, ...)[0]`: the stream is
            loop.indexed = " ".join(src.code(node).split())  # picked out of the block's output at the call
            loop.picked = _constant_index(value)
            loop.outputs = names if loop.picked == 0 else ()
            return
        if any(c is chosen for c in find_all(value, cst.Call)):
            loop.outputs = names
            break
    if len(loop.outputs) == 1:  # `layer_outputs = layer(h, ...)` then `h = layer_outputs[0]`
        for _, names, value, node in body:
            if isinstance(value, cst.Subscript) and isinstance(value.value, cst.Name) \
                    and value.value.value == loop.outputs[0]:
                loop.indexed = src.code(node).strip()
                loop.picked = _constant_index(value)
                if loop.picked == 0:  # the stream is what `[0]` picks: read as the call's output
                    loop.outputs = names
                break


def _constant_index(sub: cst.Subscript) -> int | None:
    """`out[0]` -> 0; anything but one constant integer index -> None."""
    if len(sub.slice) == 1 and isinstance(sub.slice[0].slice, cst.Index):
        value = sub.slice[0].slice.value
        if isinstance(value, cst.Integer):
            return int(value.value)
    return None


def classify_body(src: SourceFile, loop: Loop, optional_inputs: set[str],
                  defaults: Defaults | None = None) -> tuple[ExtraOp, ...]:
    """Every statement of the loop body besides the block call and trivial guards (pitfall B reads them); one the
    constructor's defaults switch off (`defaults`) is listed, inactive."""
    if loop.call is None:
        return ()
    ops: list[ExtraOp] = []
    calls = set()
    for stmt in body_of(loop.node):
        if any(c is loop.call for c in find_all(stmt, cst.Call)):
            calls.add(id(stmt))
    varying = {loop.index_var, loop.block_var, *loop.outputs} - {None}
    counters = {n for s in find_all(loop.node.body, cst.AugAssign) for n in target_names(s.target)}
    derived: set[str] = set()
    after_call = False
    spread = _spread_only(loop)
    carried = _loop_carried(loop, varying)
    for stmt in body_of(loop.node):
        if id(stmt) in calls or (loop.call_stmt is not None and stmt is loop.call_stmt):
            after_call = True
            continue
        if _trivial(stmt) or (not after_call and assigned_names(stmt) and assigned_names(stmt) <= spread):
            continue  # `args = (x, c, y)` spread into the block call is the call's own argument list
        reads, writes = names_read(stmt), assigned_names(stmt)
        code = src.code(stmt)
        first_line = code.splitlines()[0] + (" ..." if "\n" in code else "")
        guard = _optional_guard(stmt, optional_inputs)
        off = _off(src, loop, stmt, defaults) if guard is None else None
        active = guard is None and off is None
        if (loop.index_var and loop.index_var in reads) or (reads & counters) or (reads & derived):
            kind, why = "index_dependent", "uses the loop index; the wrapper runs the body once, with index 0"
        elif after_call and writes & set(loop.outputs):
            kind, why = "residual_injection", "changes a block output between blocks; skipped once the list is wrapped"
        elif not reads & (varying | carried):
            kind, why = "hoistable", "reads nothing that changes between blocks; can move above the loop"
        else:
            kind, why = "other", "runs once per block on loop-carried values; the wrapper runs it once"
        if guard is not None:
            why += f"; only runs when `{guard}` is given (default None)"
        if off is not None:
            why += f"; {off.why} at line {off.line}"
        if kind == "index_dependent":
            derived |= writes  # `start = 3 * i` makes `x[:, start:]` index-dependent too
        if kind != "hoistable":
            varying |= writes
        ops.append(ExtraOp(src.line(stmt), first_line, kind, active, why))
    return tuple(ops)


def _off(src: SourceFile, loop: Loop, stmt: cst.CSTNode, defaults: Defaults | None) -> Evidence | None:
    """Why the statement of the loop body does not run with the constructor's defaults: an `if` (without `else`)
    whose test they make false (None: it may run)."""
    if defaults is None or not isinstance(stmt, cst.If) or stmt.orelse is not None or not body_of(stmt):
        return None
    return defaults.off(loop.method, src.line(body_of(stmt)[0]))


def _loop_carried(loop: Loop, varying: set[str]) -> set[str]:
    """Names whose value can differ from one block to the next besides `varying`: what a statement of the body writes
    when it reads a varying name, a name it writes itself (`temb = temb * self.scale` compounds once per block; moved
    above the loop it would run once) or a name a later statement writes (the next block sees that value), to a fixed
    point."""
    stmts = [(names_read(s, loads_only=True), assigned_names(s)) for s in body_of(loop.node)]
    later = [set().union(set(), *(w for _, w in stmts[i:])) for i in range(len(stmts))]
    out = set(varying)
    changed = True
    while changed:
        changed = False
        for (reads, writes), after in zip(stmts, later):
            if writes - out and reads & (out | after):
                out |= writes
                changed = True
    return out - varying


def _spread_only(loop: Loop) -> set[str]:
    """Names the loop body builds once as a literal argument list and reads only as `*name` in calls (the block
    call and its checkpointed twin): `args = (x, c, y)` then `block(*args)`."""
    from .binding import spread_literals

    body = loop.node.body
    allowed = {id(a.value) for c in find_all(body, cst.Call) for a in c.args
               if a.star == "*" and isinstance(a.value, cst.Name)}
    allowed |= {id(t.target) for n in find_all(body, cst.Assign) for t in n.targets if isinstance(t.target, cst.Name)}
    names = find_all(body, cst.Name)
    return {name for name in spread_literals(body)
            if all(id(n) in allowed for n in names if n.value == name)}


def _trivial(stmt: cst.CSTNode) -> bool:
    if isinstance(stmt, cst.SimpleStatementLine):
        return all(
            isinstance(s, (cst.Pass, cst.Continue))
            or (isinstance(s, cst.Expr) and isinstance(s.value, (cst.SimpleString, cst.ConcatenatedString)))
            for s in stmt.body
        )
    if isinstance(stmt, cst.If) and stmt.orelse is None:
        # `if self.interrupt: continue`
        return all(isinstance(s, cst.SimpleStatementLine) and _trivial(s) for s in body_of(stmt))
    return False


def optional_guard_at(src: SourceFile, fn: cst.FunctionDef, line: int, optional_inputs: set[str]) -> str | None:
    """The optional forward input (default None) whose `if x is not None:` encloses the statement at `line` of
    `fn`, if any: that statement does not run on a default call."""
    for stmt in walk_statements(body_of(fn)):
        guard = _optional_guard(stmt, optional_inputs)
        if guard is None:
            continue
        if src.line(stmt) < line <= src.last_line(stmt):
            return guard
    return None


def _optional_guard(stmt: cst.CSTNode, optional_inputs: set[str]) -> str | None:
    """`if x is not None:` where x is a forward input that defaults to None."""
    if not isinstance(stmt, cst.If) or stmt.orelse is not None:
        return None
    test = stmt.test
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        test = test.left
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        comp = test.comparisons[0]
        if isinstance(comp.operator, cst.IsNot) and isinstance(comp.comparator, cst.Name) and \
                comp.comparator.value == "None" and isinstance(test.left, cst.Name) and \
                test.left.value in optional_inputs:
            return test.left.value
        # `kv_cache_mode == "extract"`: an input that defaults to None never equals a literal
        if isinstance(comp.operator, cst.Equal) and isinstance(test.left, cst.Name) and \
                test.left.value in optional_inputs and isinstance(comp.comparator, (cst.SimpleString, cst.Integer,
                                                                                    cst.Float)):
            return test.left.value
    if isinstance(test, cst.Name) and test.value in optional_inputs:
        return test.value
    return None
