"""A ModuleList of ModuleLists: cache-dit wraps one flat list of blocks."""

from __future__ import annotations

from ..fixes import Manual
from . import Example, Rule, register
from .skeletons import transformer


@register
class WalkNested(Rule):
    code = "walk-nested"
    scope = "list"
    order = 50
    summary = "the blocks live in a ModuleList of ModuleLists"

    VALID = (Example(transformer("self.blocks = nn.ModuleList([Block() for _ in range(layers)])",
                                 "for block in self.blocks:\n    hidden_states = block(hidden_states, temb)")),)
    INVALID = (Example(transformer(
        "self.stages = nn.ModuleList([nn.ModuleList([Block() for _ in range(2)]) for _ in range(layers)])",
        "for stage in self.stages:\n    for block in stage:\n        hidden_states = block(hidden_states, temb)"),
        expect="ModuleLists", line=16),)

    def check(self, ctx):
        if ctx.definition.container == "ModuleList of ModuleList":
            yield self.finding(ctx, "restructure: a ModuleList of ModuleLists; cache-dit wraps one flat list of blocks",
                               line=ctx.definition.line)

    def fix(self, ctx, finding):
        return Manual("cache-dit wraps one flat list: flattening a ModuleList of ModuleLists changes the "
                      "model's structure (and its checkpoint keys), not its forward")
