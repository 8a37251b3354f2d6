"""Which of a class's methods run while its forward runs: cache-dit swaps a block list for its wrapper only for
the length of a forward call, so a walk over the list counts only where forward reaches it.

Reached: `forward`, and every method it names through `self` — called (`self._blocks(x)`), handed on
(`checkpoint(self._blocks, x)`), or read as a property (`self.dtype` where `dtype` is a `@property`) — then
what those reach, through the class's own methods. A forward chosen in `__init__`
(`self.forward = self._forward_cfg if cfg else self._forward_plain`) starts from each method assigned there.
Without a forward in the class (one it inherits), nothing is known: every method counts (None).
"""

from __future__ import annotations

import libcst as cst

from integrate.source import find_method, iter_methods
from integrate.syntax import find_all, self_attr


def forward_entries(cls: cst.ClassDef) -> list[str]:
    """The methods that serve as `forward`: the method itself and each one `__init__` assigns to
    `self.forward`."""
    out = ["forward"] if any(fn.name.value == "forward" for fn in iter_methods(cls)) else []  # its own def
    init = find_method(cls, "__init__")
    for assign in find_all(init.body, cst.Assign) if init is not None else ():
        if any(self_attr(t.target) == "forward" for t in assign.targets):
            out += [a for a in _self_names(assign.value) if a not in out and find_method(cls, a) is not None]
    return out


def reached_methods(cls: cst.ClassDef) -> frozenset[str] | None:
    """Names of the methods a forward call runs (None: the class has no forward of its own)."""
    methods = {fn.name.value: fn for fn in iter_methods(cls)}
    todo = forward_entries(cls)
    if not todo:
        return None
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in methods:
            continue
        seen.add(name)
        todo += [n for n in _self_names(methods[name].body) if n in methods and n not in seen]
    return frozenset(seen)


def _self_names(node: cst.CSTNode) -> list[str]:
    """Every `self.<name>` the node reads (calls, references and property reads alike)."""
    return [a for a in (self_attr(x) for x in find_all(node, cst.Attribute, skip_functions=False)) if a]
