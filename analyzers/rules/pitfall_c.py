"""Pitfall C: the block writes into one of its stream inputs in place.

cache-dit keeps the tensors a block received to compute residuals; `hidden_states += ...`, an in-place
method (`.add_()`), `out=` or `inplace=True` on a stream input makes that residual zero or NaN, so nothing
is ever cached. The forward reader (`in_place_input_mutations`) finds every in-place write into an input
or a view of one; the rule fires on the streams only (other inputs are noted, not patched).
"""

from __future__ import annotations

from ..fixes import OutOfPlace
from . import Example, Rule, register

_MODEL = '''
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, hidden_states, temb):
        {body}
        return hidden_states


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])

    def forward(self, hidden_states, temb):
        for block in self.blocks:
            hidden_states = block(hidden_states, temb)
        return hidden_states
'''


@register
class PitfallC(Rule):
    code = "pitfall-c"
    scope = "block_list"
    order = 30
    summary = "the block writes into a stream input in place"

    VALID = (
        Example(_MODEL.format(body="hidden_states = hidden_states + self.proj(temb)")),
        # in place, but on an input that is not a stream: noted, not patched
        Example(_MODEL.format(body="temb.mul_(2)\n        hidden_states = hidden_states + self.proj(temb)")),
    )
    INVALID = (
        Example(_MODEL.format(body="hidden_states += self.proj(temb)"), expect="in place", fixed='''
                def patched_blocks_forward(self, hidden_states, temb):
                    hidden_states = hidden_states + self.proj(temb)
                    return hidden_states
                '''),
        # in-place methods and writes through a view: no rewrite knows their out-of-place form
        Example(_MODEL.format(body="hidden_states.add_(self.proj(temb))"), line=10),
        Example(_MODEL.format(body="view = hidden_states.view(-1)\n        view[0] = 0.0"), line=11),
    )

    def check(self, ctx):
        streams = ctx.streams
        hits = tuple(ev for name, ev in ctx.mutations if name in streams)
        if hits:
            yield self.finding(ctx, "pitfall C: the block writes into an input tensor in place", line=hits[0].line,
                               evidence=hits)

    def fix(self, ctx, finding):
        return OutOfPlace(ctx.attr, tuple(ev.line for ev in finding.evidence))
