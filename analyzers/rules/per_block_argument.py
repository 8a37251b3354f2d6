"""A block call argument that differs per block: `mask=masks[i]`, `skip=i in self.skip_layers`,
`checkpoint=i < n_ckpt`, or the value a per-block list zipped with the blocks gives each turn.

cache-dit's wrapper is called once per step in place of the loop: the call's arguments are evaluated once,
with the loop's first values, and every block receives block 0's. Nothing fails: the other blocks silently get
the wrong mask, skip flag or per-layer input. The streams themselves are the wrapper's to carry and are not
counted; statements before the call that read the index are pitfall B's.

The fix (`PerBlockKeywords`): for keywords of an `enumerate` walk, a forward pre-hook on each block computes the
keyword's expression again with that block's index, from the values forward holds before the loop (the patched
forward records them), as pitfall B's per-block statements are. A positional argument or a value zipped with the
blocks stays manual, with why.
"""

from __future__ import annotations

import libcst as cst

from integrate.syntax import names_read, target_names

from ..fixes import Manual, PerBlockKeywords
from . import Example, Rule, register

_MODEL = '''
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, hidden_states, temb, scale=1.0):
        hidden_states = hidden_states + self.proj(temb) * scale
        return hidden_states


class Model(nn.Module):
    def __init__(self, layers=4):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(layers)])
        self.scales = [1.0 + k for k in range(layers)]

    def forward(self, hidden_states, temb, scales=None):
        {loop}
            {call}
        return hidden_states
'''


def _model(loop: str, call: str) -> str:
    return _MODEL.format(loop=loop, call=call)


ENUMERATE = "for i, block in enumerate(self.blocks):"


@register
class PerBlockArgument(Rule):
    code = "per-block-argument"
    scope = "block_list"
    order = 45
    summary = "a block call argument differs per block; cache-dit's wrapper passes block 0's to every block"

    VALID = (
        # the index is read only for a stream, which the wrapper carries block to block
        Example(_model("for block in self.blocks:", "hidden_states = block(hidden_states, temb, scale=2.0)")),
        Example(_model(ENUMERATE, "hidden_states = block(hidden_states, temb)")),
    )
    INVALID = (
        # a keyword of an enumerate walk: each block's pre-hook computes `self.scales[i]` with its own index (the
        # patched forward records what the hook reads: nothing here besides the transformer)
        Example(_model(ENUMERATE, "hidden_states = block(hidden_states, temb, scale=self.scales[i])"),
                expect="`scale=self.scales[i]`", fixed='''
                def patched_forward(self, hidden_states, temb, scales=None):
                    self._integrate_blocks_scale_env = {}
                    for i, block in enumerate(self.blocks):
                        hidden_states = block(hidden_states, temb, scale=self.scales[i])
                    return hidden_states
                '''),
        # ... and from a value forward holds: recorded before the loop, indexed in the hook
        Example(_model(ENUMERATE, "hidden_states = block(hidden_states, temb, scale=scales[i] if scales else 1.0)"),
                expect="`scale=scales[i] if scales else 1.0`", fixed='''
                def patched_forward(self, hidden_states, temb, scales=None):
                    self._integrate_blocks_scale_env = {'scales': scales}
                    for i, block in enumerate(self.blocks):
                        hidden_states = block(hidden_states, temb, scale=scales[i] if scales else 1.0)
                    return hidden_states
                '''),
        Example(_model("for block, s in zip(self.blocks, self.scales):",
                       "hidden_states = block(hidden_states, temb, scale=s)"),
                expect="`scale=s`", line=22),
        Example(_model(ENUMERATE, "hidden_states = block(hidden_states, temb, 0.5 if i % 2 else 1.0)"),
                expect="`0.5 if i % 2 else 1.0`", line=22),
    )

    def check(self, ctx):
        loop = ctx.loop
        if loop is None or loop.call is None:
            return
        varying = {loop.index_var} - {None}
        if loop.zipped_with:  # `for block, m in zip(self.blocks, masks)`: m is the per-block value
            varying |= set(target_names(loop.node.target)) - {loop.block_var, loop.index_var}
        if not varying:
            return
        streams = set(ctx.streams)
        args = loop.call.args[loop.call_skip:]
        for pos, arg in enumerate(args):
            keyword = arg.keyword.value if isinstance(arg.keyword, cst.Name) else None
            if keyword in streams or (keyword is None and not arg.star and pos < len(streams)):
                continue  # a stream: the wrapper's to carry
            read = names_read(arg.value) & varying
            if read:
                code = ctx.src.code(arg).rstrip(",").strip()
                yield self.finding(ctx, f"per-block argument `{code}` reads `{sorted(read)[0]}`: cache-dit's wrapper "
                                        "evaluates the call once, so block 0's value reaches every block",
                                   line=ctx.src.line(loop.call), kind=f"per_block_argument:{keyword or ''}")

    def fix(self, ctx, finding):
        """Keywords of an `enumerate` walk: a per-block pre-hook for each; a positional argument or a value zipped
        with the blocks has no rewrite."""
        found = list(self.check(ctx))
        keywords = tuple(f.kind.partition(":")[2] for f in found)
        if ctx.loop.zipped_with or not all(keywords) or ctx.loop.index_var is None:
            return Manual("each block must receive its own value: a positional argument, or a value zipped with the "
                          "blocks, has no per-block hook written for it")
        return PerBlockKeywords(ctx.attr, finding.line, keywords)
