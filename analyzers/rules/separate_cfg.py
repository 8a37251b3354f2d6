"""CFG style: does one denoising step call the transformer separately for the conditional and the
unconditional branch (cache-dit's `has_separate_cfg=True`), or once on a doubled batch?

The CFG reader (analyzers/cfg.py) counts transformer calls along one path through a step of the loop,
following a branch only when the entry's numeric defaults decide it; a call inside an inner loop (one per
guidance condition) counts as separate. Undecidable branches (a prompt that defaults to None) are never
assumed: the answer is then unknown. So is a step that runs three or more calls with the defaults: cache-dit
tells apart exactly two.
"""

from __future__ import annotations

from ..fixes import Manual
from . import Example, Rule, register

_PIPELINE = '''
import torch


class Pipeline:
    def __call__(self, latents, prompt_embeds, negative_prompt_embeds=None, guidance_scale=5.0, steps=4):
        for t in range(steps):
{body}
        return latents
'''


def _pipeline(*lines: str) -> str:
    return _PIPELINE.format(body="\n".join(" " * 12 + line for line in lines))


@register
class SeparateCfg(Rule):
    code = "separate-cfg"
    scope = "pipeline"
    order = 10
    summary = "the transformer runs separately for the conditional and unconditional branch"

    VALID = (
        # one call on a doubled batch
        Example(_pipeline("latent_model_input = torch.cat([latents] * 2)",
                          "noise = self.transformer(latent_model_input, prompt_embeds)",
                          "latents = latents - noise")),
        # the second call only runs when guidance_scale > 1, and the default is 1.0
        Example(_pipeline("noise = self.transformer(latents, prompt_embeds)",
                          "if self.true_cfg > 1:",
                          "    uncond = self.transformer(latents, negative_prompt_embeds)",
                          "latents = latents - noise").replace("guidance_scale=5.0", "guidance_scale=1.0")
                .replace("self.true_cfg", "guidance_scale")),
    )
    INVALID = (
        Example(_pipeline("cond = self.transformer(latents, prompt_embeds)",
                          "uncond = self.transformer(latents, negative_prompt_embeds)",
                          "latents = latents - (uncond + guidance_scale * (cond - uncond))"),
                expect="2 transformer calls", line=6),
        # one call per guidance condition, in an inner loop
        Example(_pipeline("outs = []",
                          "for embeds in (prompt_embeds, negative_prompt_embeds):",
                          "    outs.append(self.transformer(latents, embeds))",
                          "latents = latents - outs[0]"), expect="inner loop", line=9),
    )
    UNKNOWN = (
        # no transformer call in a loop at all: nothing to count
        Example(_pipeline("latents = latents * 0.5")),
        # a batched CFG call and two more guidance passes on by default (LTX2): three calls a step, which
        # cache-dit's two-way split cannot describe either way
        Example(_pipeline("noise = self.transformer(torch.cat([latents] * 2), prompt_embeds)",
                          "if guidance_scale > 0.0:",
                          "    skip = self.transformer(latents, prompt_embeds)",
                          "if guidance_scale > 1.0:",
                          "    alone = self.transformer(latents, prompt_embeds)",
                          "latents = latents - noise - skip - alone")),
    )

    def check(self, ctx):
        facts = ctx.facts
        why = facts.evidence[-1].why if facts.evidence else ""
        line = facts.evidence[-1].line if facts.evidence else 0
        if facts.has_separate_cfg is None:
            yield self.finding(ctx, f"CFG style unknown: {why}", patch=False, line=line, confidence="unknown")
        elif facts.has_separate_cfg:
            yield self.finding(ctx, f"separate CFG: {why}", patch=False, line=line, confidence=facts.confidence)

    def fix(self, ctx, finding):
        # not the PatchFunctor's (patch=False): the adapter's `has_separate_cfg`, read by the same CFG reader, says it
        return Manual("nothing in forward changes: the adapter's has_separate_cfg carries it (a reviewer sets it "
                      "where it is unknown)")
