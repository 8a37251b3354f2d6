"""The list is walked by more than one loop: once wrapped, every loop runs the whole cached chain."""

from __future__ import annotations

from . import Example, Rule, register
from .skeletons import transformer

ONE = "for block in self.blocks:\n    hidden_states = block(hidden_states, temb)"


@register
class WalkSeveral(Rule):
    code = "walk-several"
    scope = "list"
    order = 60
    summary = "the list is walked by several loops"

    VALID = (Example(transformer("self.blocks = nn.ModuleList([Block() for _ in range(layers)])", ONE)),)
    INVALID = (
        Example(transformer("self.blocks = nn.ModuleList([Block() for _ in range(layers)])", ONE + "\n" + ONE),
                expect="looped over 2 times"),
    )

    def check(self, ctx):
        loops = ctx.use.loops
        if len(loops) > 1:
            lines = ", ".join(str(lp.line) for lp in loops)
            yield self.finding(ctx, f"restructure: looped over {len(loops)} times (lines {lines}); once wrapped, every "
                                    "loop runs the whole cached chain", line=loops[0].line)
