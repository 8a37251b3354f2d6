"""CP chart rules on installed diffusers 0.42.1 sources: what each split is planned on, read from the code."""

from __future__ import annotations

from conftest import make_model_dir

from integrate import api


def _plan(tmp_path, pipeline: str, transformer: str):
    return api.plan(api.flags_for(str(make_model_dir(tmp_path / transformer, pipeline, transformer))), probe=False)


def test_a_side_module_whose_output_is_not_3d_gets_no_split_and_an_unknown(tmp_path):
    """WanAnimate's loop joins its face adapter's output into the stream, and what feeds it reaches back to
    `patch_embedding`, a Conv3d: its output is 5-D, so a [B, S, D] split of it is one cache-dit skips with a
    warning. The plan leaves it out and says why; modules whose rank is not read keep the 3-D split, said so."""
    plan = _plan(tmp_path, "WanAnimatePipeline", "WanAnimateTransformer3DModel")
    sides = {s.module: s.ndim for lf in plan.facts.sequence.lists for s in lf.side_modules}
    assert sides["patch_embedding"] == 5
    cp = plan.parallelism.cp
    assert "patch_embedding" not in cp.plan
    assert any(u.startswith("`patch_embedding`'s output is 5-D") for u in cp.unknowns)
    assert cp.confidence == "low"
    assumed = [e.why for e in cp.evidence if "assumed [B, S, D]" in e.why]
    assert assumed and all(sides[w.split("`")[-2].split(".")[0]] is None for w in assumed if "`" in w), assumed

