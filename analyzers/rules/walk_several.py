"""The list is walked by more than one loop: once wrapped, every loop runs the whole cached chain."""

from __future__ import annotations

from ..fixes import SplitSlices
from ..loops import walks_per_call
from . import Example, Rule, register
from .skeletons import transformer

ONE = "for block in self.blocks:\n    hidden_states = block(hidden_states, temb)"
# the training branch and the inference branch each walk the list: one walk per call
EITHER = ("if self.gradient_checkpointing:\n    for block in self.blocks:\n"
          "        hidden_states = self._gradient_checkpointing_func(block, hidden_states, temb)\n"
          "else:\n    for block in self.blocks:\n        hidden_states = block(hidden_states, temb)")


@register
class WalkSeveral(Rule):
    code = "walk-several"
    scope = "list"
    order = 60
    summary = "the list is walked by several loops"

    VALID = (Example(transformer("self.blocks = nn.ModuleList([Block() for _ in range(layers)])", ONE)),
             Example(transformer("self.blocks = nn.ModuleList([Block() for _ in range(layers)])", EITHER)),
             # a loop over the blocks that calls none of them (weights set up in __init__) is no walk
             Example(transformer("self.blocks = nn.ModuleList([Block() for _ in range(layers)])\n"
                                 "for block in self.blocks:\n    nn.init.zeros_(block.proj.weight)", ONE)),
             # two entries of one ModuleDict, each walked once: two lists, not one list walked twice
             Example(transformer('self.blocks = nn.ModuleDict({kind: nn.ModuleList([Block() for _ in range(layers)])'
                                 ' for kind in ("image", "ref")})',
                                 'for block in self.blocks["image"]:\n    hidden_states = block(hidden_states, temb)\n'
                                 'for block in self.blocks["ref"]:\n    hidden_states = block(hidden_states, temb)')))
    INVALID = (
        # whole walks: no slice to give each its own list, so they stay manual
        Example(transformer("self.blocks = nn.ModuleList([Block() for _ in range(layers)])", ONE + "\n" + ONE),
                expect="looped over 2 times", line=19),
        Example(transformer("self.blocks = nn.ModuleList([Block() for _ in range(layers)])", EITHER + "\n" + ONE),
                expect="looped over 2 times", line=20),  # either branch, then a second walk after it
    )

    def check(self, ctx):
        # loops in exclusive branches: one of them runs per call; a loop that never calls a block (weights
        # initialised in `_initialize_weights`) runs no chain; loops over different entries of a ModuleDict
        # (`self.blocks["image"]`, `self.blocks["ref"]`) walk different lists
        calling = [lp for lp in ctx.use.loops if lp.call is not None]
        for keys in dict.fromkeys(lp.keys for lp in calling):
            loops = walks_per_call([lp for lp in calling if lp.keys == keys])
            if len(loops) > 1:
                lines = ", ".join(str(lp.line) for lp in loops)
                yield self.finding(ctx, f"restructure: looped over {len(loops)} times (lines {lines}); once wrapped, "
                                        "every loop runs the whole cached chain", line=loops[0].line)

    def fix(self, ctx, finding):
        return SplitSlices(ctx.attr)
