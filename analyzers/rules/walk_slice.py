"""A loop over a slice of the list: the wrapped list has one element, so the slice selects it or nothing."""

from __future__ import annotations

from ..fixes import SplitSlices
from . import Example, Rule, register
from .skeletons import transformer

INIT = "self.blocks = nn.ModuleList([Block() for _ in range(layers)])"
# the walk iterates its own list, which the PatchFunctor cuts from the original with the model's slice
WHOLE = '''
def patched_forward(self, hidden_states, temb):
    for block in self.blocks:
        hidden_states = block(hidden_states, temb)
    return hidden_states
'''


@register
class WalkSlice(Rule):
    code = "walk-slice"
    scope = "list"
    order = 70
    summary = "the list is walked through a slice"

    VALID = (Example(transformer(INIT, "for block in self.blocks:\n    hidden_states = block(hidden_states, temb)")),)
    INVALID = (
        Example(transformer(INIT, "for block in self.blocks[:2]:\n    hidden_states = block(hidden_states, temb)"),
                expect="loop over a slice `self.blocks[:2]`", fixed=WHOLE),
        # through a local name: the walk names its own list, and the name goes
        Example(transformer(INIT, "blocks = self.blocks\nfor block in blocks[-2:]:\n"
                                  "    hidden_states = block(hidden_states, temb)"), fixed=WHOLE),
    )

    def check(self, ctx):
        for lp in ctx.use.loops:
            if lp.sliced:
                yield self.finding(ctx, f"restructure: loop over a slice `{lp.iter_code}` (line {lp.line}); the wrapped "
                                        "list has one element, so the slice selects the wrapper or nothing",
                                   line=lp.line)

    def fix(self, ctx, finding):
        return SplitSlices(ctx.attr)
