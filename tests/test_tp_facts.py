"""TP facts read from real diffusers 0.42.1 sources, on models outside the supported set, each the class of a
rule: q/k norm names, projections in the two arms of an if / else, equal fused splits, a GLU's fused
up-projection (and the planner's row interleave that makes column-wise shards of it right)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from conftest import make_model_dir

from integrate import api


@functools.lru_cache(maxsize=None)
def _plan(pipeline: str, transformer: str):
    import tempfile

    model = make_model_dir(Path(tempfile.mkdtemp()) / "m", pipeline, transformer)
    return api.plan(api.flags_for(str(model)), probe=False)


def _attention(plan, path: str):
    return next(a for a in plan.facts.attention if a.path == path)


def test_prefix_named_qk_norms_are_found_and_measured_by_the_planner():
    """LongCatAudioDiT's attention names its norms `q_norm` / `k_norm` (over all heads: RMSNorm(inner_dim)),
    not `norm_q`: both are q/k norms, and the planner measures and distributes them."""
    from integrate.templates import distributed_norms

    plan = _plan("LongCatAudioDiTPipeline", "LongCatAudioDiTTransformer")
    assert set(_attention(plan, "self_attn").qk_norms) == {"q_norm", "k_norm"}
    assert "self_attn.q_norm" in distributed_norms(plan)["blocks"]


def test_a_projection_in_the_second_arm_of_an_if_is_still_an_input_projection():
    """StableAudio3's processor calls `to_qkv` in both arms of `if attn.use_differential: ... else: ...`, each arm
    with its own kernel call: it feeds the attention in both (it was read as an output projection, because the
    else arm comes after the first arm's kernel)."""
    a = _attention(_plan("StableAudio3Pipeline", "StableAudio3DiTModel"), "self_attn")
    assert a.in_projs == ("self_attn.to_qkv",) and a.out_projs == ("self_attn.to_out",)


@pytest.mark.parametrize("path,expected", [("self_attn", True), ("cross_attn", True)])
def test_a_chunk_into_any_number_of_parts_is_an_equal_split(path, expected):
    """`to_qkv(x).chunk(5)` (q1, q2, k1, k2, v of differential attention) is as equal as chunk(3): the fused
    projection gets a replicated output, and the head count is not divided."""
    plan = _plan("StableAudio3Pipeline", "StableAudio3DiTModel")
    a = _attention(plan, path)
    assert a.fused and a.fused_equal_split is expected
    tp = plan.parallelism.tp.block_lists[0]
    assert tp.layer_plan[f"{path}.{'to_qkv' if path == 'self_attn' else 'to_kv'}"] == "colwise(output=replicate)"


def test_unequal_splits_stay_unequal():
    import libcst as cst

    from integrate.analyzers.attention import equal_parts

    def equal(code: str) -> bool:
        call = cst.parse_expression(code)
        method = call.func.attr.value
        qual = "torch.split" if code.startswith("torch.split") else ""
        return equal_parts(call, method, qual)

    assert equal("qkv.chunk(3, dim=-1)") and equal("qkv.split(64, dim=-1)") and equal("torch.split(qkv, 64, -1)")
    assert not equal("qkv.split([3 * d, mlp], dim=-1)") and not equal("torch.split(qkv, [a, b], -1)")
    assert not equal("qkv.tensor_split(3)")


def test_a_glus_fused_up_projection_is_cut_into_parts_and_interleaved_before_sharding():
    """StableAudio3's feed-forward does `h, gate = self.proj_in(x).chunk(2)`: column-wise shards of `proj_in`
    would give rank 0 all of h and rank 1 all of gate. The fact records 2 parts; the generated planner
    interleaves the rows, so each rank's shard holds its slice of h and of gate."""
    import torch

    plan = _plan("StableAudio3Pipeline", "StableAudio3DiTModel")
    ff = next(r for r in plan.facts.linears["transformer_blocks"] if r.path == "ff.proj_in")
    assert ff.role == "ffn_in" and ff.parts == 2 and "transformer_stable_audio3.py:" in ff.why
    from integrate.templates import chunked_outputs

    (cut,) = chunked_outputs(plan)["transformer_blocks"].items()
    assert cut[0] == "ff.proj_in" and cut[1][0] == 2 and cut[1][2] is not None, cut  # [parts, cutter, class]

    import integrate.templates

    namespace: dict = {"torch": torch}
    text = Path(integrate.templates.__file__).with_name("tp_planner.py.j2").read_text()
    start = text.index("@torch.no_grad()\ndef _interleave_chunked_output")
    end = text.index("{% endif %}", start)
    exec(compile(text[start:end], "tp_planner.py.j2", "exec"), namespace)  # noqa: S102 - our own template
    inner, size = 4, 2
    linear = torch.nn.Linear(3, 2 * inner)
    x = torch.randn(5, 3)
    h, gate = linear(x).chunk(2, dim=-1)
    block = torch.nn.Module()
    block.proj = linear
    namespace["_interleave_chunked_output"](block, "proj", 2, size)
    out = linear(x)
    for rank in range(size):  # what a column-wise shard computes, then chunks
        local_h, local_gate = out[:, rank * inner:(rank + 1) * inner].chunk(2, dim=-1)
        assert torch.allclose(local_h, h[:, rank * 2:(rank + 1) * 2])
        assert torch.allclose(local_gate, gate[:, rank * 2:(rank + 1) * 2])
    namespace["_interleave_chunked_output"](block, "missing", 2, size)  # a block without it: left alone
    # built at another config, the module the plan saw cut the output is another class: nothing is reordered
    before = linear.weight.detach().clone()
    namespace["_interleave_chunked_output"](block, "proj", 2, size, "proj", "GEGLU")
    assert torch.equal(linear.weight, before)


def test_a_glu_read_at_one_config_is_not_reordered_at_another():
    """Latte's `activation_fn` defaults to "geglu" (GEGLU cuts `ff.net.0.proj`'s output in two), and its model
    test builds it with "gelu-approximate" (GELU: no cut). The plan, at the defaults, records the cut with the
    module and class that make it, so the generated planner reorders rows only where that module is a GEGLU."""
    plan = _plan("LattePipeline", "LatteTransformer3DModel")
    ff = next(r for r in plan.facts.linears["transformer_blocks"] if r.path == "ff.net.0.proj")
    assert ff.parts == 2 and ff.parts_by == ("ff.net.0", "GEGLU"), ff


def test_an_moe_router_is_kept_whole_and_a_shared_expert_is_an_ffn_of_its_own():
    """NucleusMoELayer holds a router Linear (`gate`: its output goes through sigmoid, then topk picks tokens
    per expert), experts as nn.Parameters, and a shared expert that is a FeedForward. The router stays whole on
    every rank (sharded, each rank would rank half the experts), the shared expert's down projection is
    row-wise (it was read as one more up projection of the whole layer, column-wise)."""
    plan = _plan("NucleusMoEImagePipeline", "NucleusMoEImageTransformer2DModel")
    tp = next(b for b in plan.parallelism.tp.block_lists if b.attr == "transformer_blocks")
    assert "img_mlp.gate" not in tp.layer_plan and tp.reasons.get("img_mlp.gate") is None
    assert any(n.startswith("`img_mlp.gate`: an MoE router, kept whole") and "sigmoid" in n for n in tp.notes)
    assert tp.layer_plan["img_mlp.shared_expert.net.0.proj"] == "colwise"
    assert tp.layer_plan["img_mlp.shared_expert.net.2"] == "rowwise"
    assert tp.layer_plan["img_mlp.net.2"] == "rowwise"  # the dense FFN of the blocks without experts


def test_a_tiny_width_that_rounds_a_layer_to_nothing_is_widened():
    """NucleusMoE sizes its dense FFN as `int(dim * mlp_ratio * 2 / 3) // 128 * 128`: 0 at the tiny width of 32,
    a layer that proves nothing and that TP cannot shard. The tiny config doubles the head dim until no layer is
    0 wide, and says so."""
    import inspect

    import diffusers

    from integrate.verify.tiny import HEAD_DIM, derive

    cls = diffusers.NucleusMoEImageTransformer2DModel
    config = {k: v.default for k, v in inspect.signature(cls.__init__).parameters.items()
              if k != "self" and v.default is not inspect.Parameter.empty}
    tiny = derive(cls, config)
    assert tiny.error is None and tiny.config["attention_head_dim"] == 2 * HEAD_DIM
    assert tiny.notes and "img_mlp.net.0.proj` is 0 wide" in tiny.notes[0]


def test_a_feed_forward_written_inline_in_the_block_is_a_column_row_pair():
    """MiniMaxMusic3's depth-decoder block computes `down_proj(silu(gate_proj(x)) * up_proj(x))` itself, after a
    residual add of its attention, whose own `to_out` hands back a whole tensor. The residual stream carrying the
    attention output does not make gate and up row-wise: they are column-wise, down (fed by both, called inside
    its argument) row-wise. Before, all three were row-wise and TP 2 failed at `layers.0.gate_proj`."""
    import json
    import tempfile

    model = Path(tempfile.mkdtemp()) / "m"
    (model / "transformer").mkdir(parents=True)
    (model / "transformer" / "config.json").write_text(json.dumps({"_class_name": "MiniMaxMusic3RVQDepthDecoder",
                                                                        "_diffusers_version": "0.42.1"}))
    plan = api.plan(api.flags_for(str(model), no_pipeline=True, separate_cfg=False), probe=False)
    tp = next(b for b in plan.parallelism.tp.block_lists if b.attr == "layers")
    assert {k: tp.layer_plan[k] for k in ("gate_proj", "up_proj", "down_proj", "attn.to_out")} == {
        "gate_proj": "colwise", "up_proj": "colwise", "down_proj": "rowwise", "attn.to_out": "rowwise"}
    assert "the down projection of a feed-forward written inline" in tp.reasons["down_proj"].why
    # WanVACE's proj_in / proj_out feed and leave the block's stream whole: replicated, not row-wise
    vace = next(b for b in _plan("WanVACEPipeline", "WanVACETransformer3DModel").parallelism.tp.block_lists
                if b.attr == "vace_blocks")
    assert vace.layer_plan["proj_in"] == vace.layer_plan["proj_out"] == "colwise(output=replicate)"


def test_a_glu_that_halves_its_input_by_slices_in_its_activation_module_is_cut_into_parts():
    """Flux2's feed-forward hands `linear_in`'s output to its SwiGLU module, which cuts it as `x[..., :half]` and
    `x[..., half:]` (no `chunk`): two equal parts, so the planner interleaves the rows before sharding (Flux3's
    copy of it failed TP 2 at `txt_mode_blocks.0.ff.act_fn.gate_fn` without it)."""
    plan = _plan("Flux2Pipeline", "Flux2Transformer2DModel")
    role = next(r for r in plan.facts.linears["transformer_blocks"] if r.path == "ff.linear_in")
    assert role.role == "ffn_in" and role.parts == 2 and "[..., :half]" in role.why


def test_rope_applied_before_the_heads_are_split_is_cut_with_them_and_the_tp_proof_passes(tmp_path):
    """SanaWM's LTX-2 refiner applies an interleaved RoPE to the whole query projection, before it is split into
    heads, and takes the (cos, sin) pair ready-made, as wide as the projection. With the projection sharded, each
    rank holds half its columns: the plan names the attention modules whose processor takes RoPE (`rope_shard`,
    with the projection it is measured by) and the planner cuts a RoPE that wide to the rank's columns; TP 2 then
    agrees with the 1-process run (it had failed in attn1 with 16 against 32). A RoPE as wide as a head (Flux)
    passes unchanged, and Flux's TP proof is unaffected (tests elsewhere)."""
    import json

    from conftest import run_cli

    from integrate.records import to_json

    folder = tmp_path / "m"
    (folder / "transformer").mkdir(parents=True)
    (folder / "transformer" / "config.json").write_text(json.dumps(
        {"_class_name": "SanaWMLTX2RefinerTransformer3DModel", "_diffusers_version": "0.42.1"}))
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    assert run_cli("plan", "--model-path", str(folder), "--no-pipeline", "--separate-cfg", "no", "--out",
                   str(plan_dir), "--no-probe").returncode == 0
    plan = json.loads((plan_dir / "plan.json").read_text())
    (tp,) = plan["parallelism"]["tp"]["block_lists"]
    assert tp["rope_shard"] and all(p == "to_q" for p in tp["rope_shard"].values()), tp["rope_shard"]
    assert run_cli("approve", str(plan_dir), "--reviewer", "Grace Hopper").returncode == 0
    assert run_cli("generate", str(plan_dir), "--out", str(out)).returncode in (0, 1)
    report = to_json(api.verify(plan_dir, out, proofs=("tp",)))
    assert report["tp"]["status"] == "pass", report["tp"]


def test_an_attention_fused_from_parts_of_different_sizes_is_kept_whole_not_sharded_wrongly():
    """Flux2's single blocks project Q/K/V and the MLP in one Linear (`to_qkv_mlp_proj`) and split its output into
    parts of different sizes (`torch.split(h, [3 * inner_dim, mlp_hidden_dim * factor])`). Sharding it column-wise
    would need its rows rearranged part by part, which the generated planner does not do: the TP proof failed
    (max-abs 2.19 from `single_transformer_blocks.0`). It is kept whole with a replicated output, its output
    projection takes a replicated input, no head count is divided, and a note says why; the double blocks keep
    their sharded plan."""
    plan = _plan("Flux2Pipeline", "Flux2Transformer2DModel")
    lists = {x.attr: x for x in plan.parallelism.tp.block_lists}
    single = lists["single_transformer_blocks"]
    assert single.layer_plan == {"attn.to_qkv_mlp_proj": "colwise(output=replicate)",
                                 "attn.to_out": "rowwise(input=replicate)"}
    assert "attn" not in single.shard_div_attr
    assert any("rearranged part by part" in n for n in single.notes)
    assert lists["transformer_blocks"].layer_plan["attn.to_q"] == "colwise"


def test_an_attention_whose_kv_heads_do_not_divide_as_built_stays_whole_at_run_time(tmp_path):
    """A diffusers model of our own (tests/fixtures/gqa `GqaModel`) planned at its defaults shards its attention
    (2 key/value heads divide by 2). Built with one key/value head (a checkpoint at another config; Cosmos3Omni's
    model test builds it so), cache-dit's `shard_div_attr` refused the count and the TP proof stopped with an
    error; the generated planner keeps that attention whole in such a block (its projections, sizes and norms
    left out), as the plan would have at that config, and TP 2 agrees with one process. With the attention whole
    this model's blocks hold nothing else to shard: the proof says so (`vacuous`, issue 34), never a pass."""
    import re

    from conftest import ROOT

    from integrate import api

    src = ROOT / "tests" / "fixtures" / "gqa" / "model.py"
    (tmp_path / "m").mkdir()
    flags = api.flags_for(None, model_path=str(tmp_path / "m"), transformer_class="GqaModel",
                          transformer_file=str(src), pipeline_class="sample", pipeline_file=str(src))
    plan = api.plan(flags, probe=False)
    (tp,) = plan.parallelism.tp.block_lists
    assert tp.layer_plan.get("attn.to_out") == "rowwise" and "kv_heads" in tp.shard_div_attr["attn"], tp
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    api.write_plan(plan, plan_dir)
    api.approve(plan_dir, "test")
    api.generate(plan_dir, out=out)
    assert api.verify(plan_dir, out, fixture_only=True, trust_code=True).fixture.status == "derived"
    fixture = out / "verify_fixture.py"
    text, n = re.subn(r'"kv_heads": \d+', '"kv_heads": 1', fixture.read_text())
    assert n == 1, "the fixture's config names the key/value heads"
    fixture.write_text(text)  # an edited fixture is used as it is
    report = api.verify(plan_dir, out, proofs=("tp",), trust_code=True)
    assert report.tp.status == "vacuous" and "nothing was sharded" in report.tp.why, report.tp
    assert all(v.max_abs is not None and v.ok for v in report.tp.variants.values()), report.tp  # no error


def test_a_block_that_splits_its_own_projection_by_a_width_it_holds_divides_that_width():
    """OvisImage's single block does `torch.split(self.proj_mlp(x), [self.mlp_hidden_dim] * 2, dim=-1)`: under a
    column-wise `proj_mlp` each rank holds half of each part, so its rows are interleaved and the block's
    `mlp_hidden_dim` is divided by the TP size (its own attribute: the path "" of the block itself)."""
    plan = _plan("OvisImagePipeline", "OvisImageTransformer2DModel")
    mlp = next(r for r in plan.facts.linears["single_transformer_blocks"] if r.path == "proj_mlp")
    assert (mlp.role, mlp.parts, mlp.parts_width) == ("block_in", 2, "mlp_hidden_dim")
    assert mlp.parts_by == ("", "OvisImageSingleTransformerBlock") and "transformer_ovis_image.py:249" in mlp.why
    single = next(b for b in plan.parallelism.tp.block_lists if b.attr == "single_transformer_blocks")
    assert single.layer_plan["proj_mlp"] == "colwise" and single.shard_div_attr[""] == ("mlp_hidden_dim",)
    # Flux's single block cuts nothing: its proj_mlp is one part, nothing of the block is divided
    flux = next(b for b in _plan("FluxPipeline", "FluxTransformer2DModel").parallelism.tp.block_lists
                if b.attr == "single_transformer_blocks")
    assert "" not in flux.shard_div_attr


@pytest.mark.parametrize("code, expected", [
    ("torch.split(self.proj(x), [self.w, self.w], dim=-1)", (2, "w")),
    ("self.proj(x).split([self.w, self.w, self.w], dim=-1)", (3, "w")),
    ("torch.split(self.proj(x), [self.w, self.v], dim=-1)", None),  # unequal
    ("torch.split(self.proj(x), [64, 64], dim=-1)", None),  # a literal width cannot follow a shard
    ("torch.split(self.proj(x), [self.w, self.w], dim=1)", None),  # not the last axis
])
def test_split_by_an_attribute_width(code, expected):
    import libcst as cst

    from integrate.analyzers.structure import split_by_width

    call = cst.parse_expression(code)
    got = split_by_width(None, call)
    assert (got[1:] if got else None) == expected


_PARAM_ONLY = '''
import torch
from torch import nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv_weight = nn.Parameter(torch.randn(3 * dim, dim))
        self.out_weight = nn.Parameter(torch.randn(dim, dim))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = F.linear(x, self.qkv_weight).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v)
        return F.linear(o.transpose(1, 2).reshape(b, s, d), self.out_weight)


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.attn = Attn(dim, heads)

    def forward(self, hidden_states):
        return hidden_states + self.attn(hidden_states)


class Model(nn.Module):
    def __init__(self, dim=32, heads=2, layers=2):
        super().__init__()
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])

    def forward(self, hidden_states):
        for block in self.blocks:
            hidden_states = block(hidden_states)
        return hidden_states
'''


def test_an_empty_layer_plan_is_never_high(tmp_path):
    """A block whose projections are bare weights (F.linear over nn.Parameters): the static read finds no Linear to
    shard, so a "standard" TP plan would divide head counts and shard nothing. Low, with why (it was "high")."""
    from conftest import source_flags

    (tl,) = api.plan(source_flags(tmp_path, _PARAM_ONLY), probe=False).parallelism.tp.block_lists
    assert tl.strategy == "standard" and tl.layer_plan == {} and tl.confidence == "low", tl
    assert any("layer plan of `blocks` is empty" in n for n in tl.notes), tl.notes
    assert any("layer plan of `blocks` is empty" in e.why for e in tl.evidence)
