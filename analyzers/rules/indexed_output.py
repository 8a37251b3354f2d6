"""The call site picks the stream out of the block's output by index: `h = block(h, ...)[0]`, or
`out = layer(h, ...)` then `h = out[0]` (a `transformers` decoder layer that returns a tuple).

The list is a chain of blocks all the same, and its ForwardPattern is read from the stream `[0]` picks. But
cache-dit's wrapper stands in for the whole loop and hands back the stream itself (a tensor for a hidden-only
pattern): `[0]` would then index the batch, and a block that returns a tuple of another length than the pattern
says trips the wrapper's unpacking. So the PatchFunctor must make the call site take the wrapper's output as the
stream (and the block give back what the pattern says); what else the loop read from the output (a KV cache, an
attention map) is the model's to decide, by hand.
"""

from __future__ import annotations

from ..fixes import Manual
from . import Example, Rule, register
from .skeletons import transformer

INIT = "self.blocks = nn.ModuleList([Block() for _ in range(layers)])"


@register
class IndexedOutput(Rule):
    code = "indexed-output"
    scope = "block_list"
    order = 35
    summary = "the call site picks the stream out of the block's output by index"

    VALID = (Example(transformer(INIT, "for block in self.blocks:\n    hidden_states = block(hidden_states, temb)")),)
    INVALID = (
        Example(transformer(INIT, "for block in self.blocks:\n    hidden_states = block(hidden_states, temb)[0]"),
                expect="`hidden_states = block(hidden_states, temb)[0]`", line=20),
        Example(transformer(INIT, "for block in self.blocks:\n    out = block(hidden_states, temb)\n"
                                  "    hidden_states = out[0]"), expect="`hidden_states = out[0]`", line=20),
    )

    def check(self, ctx):
        loop = ctx.loop
        if loop is None or loop.call is None or loop.indexed is None or loop.picked != 0:
            return
        yield self.finding(ctx, f"the call site picks the stream out of the block's output (`{loop.indexed}`): "
                                "cache-dit's wrapper returns the stream itself, so the PatchFunctor must take the "
                                "wrapper's output as the stream", line=ctx.src.line(loop.call))

    def fix(self, ctx, finding):
        return Manual("what else the loop reads from the block's output (a cache, attention weights) and what the "
                      "block returns under the wrapper are the model's to decide")
