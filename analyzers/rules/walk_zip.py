"""The list is walked together with another (`zip`): interleaved lists cannot be wrapped one at a time."""

from __future__ import annotations

from ..fixes import Manual
from . import Example, Rule, register
from .skeletons import transformer

INIT = ("self.blocks = nn.ModuleList([Block() for _ in range(layers)])\n"
        "self.gates = nn.ModuleList([nn.Linear(8, 8) for _ in range(layers)])")


@register
class WalkZip(Rule):
    code = "walk-zip"
    scope = "list"
    order = 80
    summary = "the list is walked together with another list"

    VALID = (Example(transformer(INIT, "for block in self.blocks:\n    hidden_states = block(hidden_states, temb)")),)
    INVALID = (
        Example(transformer(INIT, "for block, gate in zip(self.blocks, self.gates):\n"
                                  "    hidden_states = gate(block(hidden_states, temb))"), expect="self.gates", line=20),
    )

    def check(self, ctx):
        for lp in ctx.use.loops:
            if lp.zipped_with:
                yield self.finding(ctx, f"restructure: walked together with {', '.join(lp.zipped_with)} (line "
                                        f"{lp.line}); interleaved lists cannot be wrapped one at a time", line=lp.line)

    def fix(self, ctx, finding):
        return Manual("the two lists run interleaved, block by block: no order of wrapped lists reproduces "
                      "that, so the loop needs rethinking by hand")
