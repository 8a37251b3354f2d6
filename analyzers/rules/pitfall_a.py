"""Pitfall A: the block call does not reach the block unchanged through cache-dit's wrapper.

cache-dit replaces the list with one wrapper whose forward is `(hidden_states[, encoder_hidden_states],
*args, **kwargs)` and calls every block as `block(hidden_states[, encoder_hidden_states], *args, **kwargs)`.
The loop's call is bound twice, directly and through that wrapper (analyzers/binding.py simulates
Python's binding); when no pattern of the block's family binds both ways to the same arguments, the call
has to be rewritten (streams positionally, in the wrapper's order) in a patched forward.
"""

from __future__ import annotations

from ..fixes import StreamsPositional
from . import Example, Rule, register

_MODEL = '''
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, {params}):
        {first} = {first} + self.proj({last})
        return {ret}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])

    def forward(self, {params}):
        for block in self.blocks:
            {outs} = block({call})
        return {first}
'''


def _model(params: str, ret: str, outs: str, call: str) -> str:
    names = [p.strip() for p in params.split(",")]
    return _MODEL.format(params=params, first=names[0], last=names[-1], ret=ret, outs=outs, call=call)


@register
class PitfallA(Rule):
    code = "pitfall-a"
    scope = "block_list"
    order = 10
    summary = "the block call does not reach the block unchanged through cache-dit's wrapper"

    VALID = (
        # streams first and positional: the wrapper passes them on in the same slots
        Example(_model("hidden_states, encoder_hidden_states, temb", "hidden_states, encoder_hidden_states",
                       "hidden_states, encoder_hidden_states", "hidden_states, encoder_hidden_states, temb")),
        # keywords for the streams, under the names the wrapper uses: they land in the same parameters
        Example(_model("hidden_states, encoder_hidden_states, temb", "hidden_states, encoder_hidden_states",
                       "hidden_states, encoder_hidden_states",
                       "hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states, temb=temb")),
    )
    INVALID = (
        # third-party names passed by keyword: the wrapper's hidden_states slot receives nothing
        Example(_model("img, txt, vec", "img, txt", "img, txt", "img=img, txt=txt, vec=vec"), expect="pitfall A",
                fixed='''
                def patched_forward(self, img, txt, vec):
                    for block in self.blocks:
                        img, txt = block(img, txt, vec=vec)
                    return img
                '''),
        # the text stream passed by keyword behind a positional conditioning vector
        Example(_model("hidden_states, temb, encoder_hidden_states", "hidden_states, encoder_hidden_states",
                       "hidden_states, encoder_hidden_states",
                       "hidden_states, temb, encoder_hidden_states=encoder_hidden_states"),
                # and the block's own forward takes the text stream last: each block also gets a forward that takes
                # the streams first (the functor's `_streams_first`)
                fixed='''
                def patched_forward(self, hidden_states, temb, encoder_hidden_states):
                    for block in self.blocks:
                        hidden_states, encoder_hidden_states = block(hidden_states, encoder_hidden_states, temb=temb)
                    return hidden_states
                '''),
    )

    def check(self, ctx):
        if ctx.verdict is not None and ctx.verdict.mismatch:
            yield self.finding(ctx, "pitfall A: the call site does not reach the block unchanged through cache-dit's "
                                    "wrapper (call it positionally in a patched forward)",
                               line=ctx.src.line(ctx.loop.call))

    def fix(self, ctx, finding):
        return StreamsPositional(ctx.attr, finding.line)
