"""Pitfall B: statements in the block loop's body besides the block call.

Once cache-dit wraps the list, the loop runs once: a statement that ran once per block now runs once.
The loop reader (analyzers/loops.py `classify_body`) sorts each statement: hoistable (reads nothing that
changes between blocks), index-dependent, a residual injected between blocks, or other. Statements that
run only when an optional input is given (`if controlnet_residuals is not None:`) are inactive by default
and do not fire the rule; they are listed in the call site all the same.
"""

from __future__ import annotations

from ..fixes import LoopBody
from . import Example, Rule, register

_MODEL = '''
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, hidden_states, temb):
        return hidden_states + self.proj(temb)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 2.0
        self.blocks = nn.ModuleList([Block() for _ in range(2)])

    def forward(self, hidden_states, temb, residuals=None):
        for i, block in enumerate(self.blocks):
{body}
        return hidden_states
'''


def _model(*lines: str) -> str:
    return _MODEL.format(body="\n".join(" " * 12 + line for line in lines))


@register
class PitfallB(Rule):
    code = "pitfall-b"
    scope = "block_list"
    order = 20
    summary = "the block loop's body does more than call the block"

    VALID = (
        Example(_model("hidden_states = block(hidden_states, temb)")),
        # runs only when an optional input (default None) is given: inactive by default
        Example(_model("hidden_states = block(hidden_states, temb)",
                       "if residuals is not None:",
                       "    hidden_states = hidden_states + residuals[i]")),
    )
    INVALID = (
        # reads nothing that changes between blocks: hoistable
        Example(_model("scaled = temb * self.scale", "hidden_states = block(hidden_states, scaled)"),
                expect="hoistable", fixed='''
                def patched_forward(self, hidden_states, temb, residuals=None):
                    scaled = temb * self.scale
                    for i, block in enumerate(self.blocks):
                        hidden_states = block(hidden_states, scaled)
                    return hidden_states
                '''),
        # compounds once per block (it reads what it writes): the wrapper runs it once, and it cannot be hoisted
        Example(_model("temb = temb * self.scale", "hidden_states = block(hidden_states, temb)"),
                expect="(other)", line=21),
        # uses the loop index: the wrapper runs the body once, with index 0
        Example(_model("hidden_states = block(hidden_states, temb)", "hidden_states = hidden_states * (i + 1)"),
                expect="index_dependent", line=22),  # the block returns no stream a hook could update
    )

    def check(self, ctx):
        active = [op for op in ctx.extra_ops if op.active_by_default]
        if active:
            kinds = sorted({op.kind for op in active})
            yield self.finding(ctx, f"pitfall B: {len(active)} statement(s) in the loop body besides the block call "
                                    f"({', '.join(kinds)})", line=active[0].line)

    def fix(self, ctx, finding):
        active = [op for op in ctx.extra_ops if op.active_by_default]
        return LoopBody(ctx.attr, hoist=tuple(op.line for op in active if op.kind == "hoistable"),
                        by_index=tuple(op.line for op in active if op.kind == "index_dependent"),
                        others=tuple(op.line for op in active if op.kind not in ("hoistable", "index_dependent")))
