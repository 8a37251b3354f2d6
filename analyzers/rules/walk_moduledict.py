"""Blocks held in a ModuleDict of ModuleLists: cache-dit wraps a ModuleList attribute of the transformer."""

from __future__ import annotations

from ..fixes import Manual
from . import Example, Rule, register
from .skeletons import transformer


@register
class WalkModuleDict(Rule):
    code = "walk-moduledict"
    scope = "list"
    order = 40
    summary = "the blocks live in a ModuleDict of ModuleLists"

    VALID = (Example(transformer("self.blocks = nn.ModuleList([Block() for _ in range(layers)])",
                                 "for block in self.blocks:\n    hidden_states = block(hidden_states, temb)")),)
    INVALID = (Example(transformer(
        'self.blocks = nn.ModuleDict({"image": nn.ModuleList([Block() for _ in range(layers)])})',
        'for block in self.blocks["image"]:\n    hidden_states = block(hidden_states, temb)'), expect="ModuleDict",
        line=16),
        # built by a comprehension over names the evaluator knows: the same lists, keyed by those names
        Example(transformer(
            'kinds = list({"image": 4, "ref": 8}.keys())\n'
            'self.blocks = nn.ModuleDict({k: nn.ModuleList([Block() for _ in range(layers)]) for k in kinds})',
            'for block in self.blocks["image"]:\n    hidden_states = block(hidden_states, temb)'),
            expect="keys ['image', 'ref']", line=17),)

    def check(self, ctx):
        d = ctx.definition
        if d.container == "ModuleDict of ModuleList":
            yield self.finding(ctx, f"restructure: blocks live in a ModuleDict under keys {list(d.keys)}; cache-dit "
                                    "wraps a ModuleList attribute, so expose each list (or merge them) in a "
                                    "PatchFunctor", line=d.line)

    def fix(self, ctx, finding):
        return Manual("cache-dit wraps a ModuleList attribute: exposing the ModuleDict's lists as attributes of "
                      "their own changes the model's structure, not its forward")
