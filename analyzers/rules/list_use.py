"""The list is read outside a loop header (`len(self.blocks)`, `self.blocks[0]`, `self.blocks[-2:]`, a
comprehension reading each block's attributes, `[b.attn.processor for b in self.blocks]`).

cache-dit swaps the list for a one-element list holding its wrapper, so such a read evaluates differently
(a length of 1, the wrapper instead of the first block) once the model is cached.
"""

from __future__ import annotations

import libcst as cst

from integrate.source import SourceFile, find_method

from ..fixes import Manual, ReadRecordedBlock, SplitSlices
from ..loops import optional_guard_at
from . import Example, Rule, register
from .skeletons import transformer

INIT = "self.blocks = nn.ModuleList([Block() for _ in range(layers)])"
LOOP = "for block in self.blocks:\n    hidden_states = block(hidden_states, temb)"


@register
class ListUse(Rule):
    code = "list-use"
    scope = "list"
    order = 90
    summary = "the list's length or elements are read outside the loop header"

    VALID = (Example(transformer(INIT, LOOP)),
             # a comprehension that calls nothing on the blocks' attributes: it only counts them (`len` is its
             # own finding), here it reads the loop variable of another list
             Example(transformer(INIT, "sizes = [s.shape for s in (hidden_states, temb)]\n" + LOOP)),
             # inactive on a default call (`extra` defaults to None): a note, not a change to make
             Example(transformer(INIT, "if extra is not None:\n    temb = temb * len(self.blocks)\n" + LOOP,
                                 params="hidden_states, temb, extra=None")),
             # only asks whether the list is empty: the wrapper of a list that had blocks is one element, not none
             Example(transformer(INIT, "if len(self.blocks) > 0:\n    " + LOOP.replace("\n", "\n    "))),
             Example(transformer(INIT, "if not len(self.blocks):\n    return hidden_states\n" + LOOP)))
    INVALID = (
        # answered only where the list's slice walks become lists of their own (this list is walked whole)
        Example(transformer(INIT, "temb = temb * len(self.blocks)\n" + LOOP), expect="`len(self.blocks)`", line=19),
        Example(transformer(INIT, "first = self.blocks[0]\nhidden_states = first(hidden_states, temb)\n" + LOOP),
                expect="indexed as `self.blocks[0]`", fixed='''
                def patched_forward(self, hidden_states, temb):
                    first = self._integrate_blocks['blocks'][0]
                    hidden_states = first(hidden_states, temb)
                    for block in self.blocks:
                        hidden_states = block(hidden_states, temb)
                    return hidden_states
                '''),
        # QwenImage21 picks its mask by the processors its blocks hold (`[block.attn.processor for block in ...]`):
        # the wrapper holds none of the blocks' attributes; the comprehension walks the blocks recorded before the
        # list was wrapped
        Example(transformer(INIT, "scale = sum(block.proj.out_features for block in self.blocks)\n"
                                  "temb = temb / scale\n" + LOOP),
                expect="reads `block.proj` of each block", fixed='''
                def patched_forward(self, hidden_states, temb):
                    scale = sum(block.proj.out_features for block in self._integrate_blocks['blocks'])
                    temb = temb / scale
                    for block in self.blocks:
                        hidden_states = block(hidden_states, temb)
                    return hidden_states
                '''),
    )

    def check(self, ctx):
        for line, kind, what in ctx.use.notes:
            fwd = _forward_around(ctx.src, line)
            guard = optional_guard_at(ctx.src, fwd, line, set(ctx.optional_inputs)) if fwd is not None else None
            if guard is not None:  # inactive on a default call (like pitfall B's guarded statements): silent
                continue
            off = ctx.use.off.get(line)
            if off is not None:  # the constructor's defaults switch it off: a note, nothing to patch
                yield self.finding(ctx, f"if switched on: {what} (line {line}) would evaluate differently once the "
                                        f"list holds one wrapper; {off.why} at line {off.line}", patch=False,
                                   line=line, kind=kind, evidence=(off,), confidence="low")
                continue
            yield self.finding(ctx, f"restructure: {what} (line {line}) evaluates differently once the list holds one "
                                    "wrapper", line=line, kind=kind)

    def fix(self, ctx, finding):
        if finding.kind in ("len", "sliced"):  # answered when the list's slice walks become lists of their own
            return SplitSlices(ctx.attr)
        if finding.kind in ("indexed", "comprehension"):  # the comprehension walks the blocks recorded before
            return ReadRecordedBlock(ctx.attr)  # the list was wrapped: the same blocks cache-dit's wrapper runs
        return Manual("each block's attributes are read where cache-dit's wrapper stands in for the blocks; what "
                      "the model does with them is its own")


def _forward_around(src: SourceFile, line: int) -> cst.FunctionDef | None:
    """The `forward` of a class in `src` whose body holds `line`."""
    for cls in src.classes.values():
        fwd = find_method(cls, "forward")
        if fwd is not None and src.line(fwd) <= line <= src.last_line(fwd):
            return fwd
    return None
