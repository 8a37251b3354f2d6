"""`integrate verify`: the CPU proofs pass for generated integrations, and planted bugs are caught and located.

Every run here is real: a tiny random-weight model built from the installed diffusers 0.42.1 sources,
the plugin `integrate generate` wrote, cache-dit 1.5.3, and 2 gloo processes for CP and TP.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import EXAMPLE, computed_once, make_model_dir, plan_generate, run_cli

PLUGIN = "integrate_motif_video"


def _verify(plan_dir: Path, out: Path, *proofs: str) -> tuple[int, dict]:
    args = ["verify", str(plan_dir), "--generated", str(out), "--json"]
    for p in proofs:
        args += ["--proof", p]
    proc = run_cli(*args)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def motif(tmp_path_factory):
    def make(base: Path) -> list:
        plan_dir, out = plan_generate(EXAMPLE, base)
        rc, report = _verify(plan_dir, out)
        return [str(plan_dir), str(out), rc, report]

    plan_dir, out, rc, report = computed_once(tmp_path_factory, "verify-motif", make)
    return Path(plan_dir), Path(out), rc, report


def _planted(motif, tmp_path, edit: tuple[str, str, str]) -> Path:
    """A copy of the generated plugin with one bug planted: (file, text, replacement)."""
    _, out, _, _ = motif
    bad = tmp_path / "out"
    shutil.copytree(out, bad)
    path = bad / PLUGIN / edit[0]
    text = path.read_text()
    assert edit[1] in text, f"the text to plant the bug in is not in {edit[0]}"
    path.write_text(text.replace(edit[1], edit[2]))
    return bad


def test_motif_video_generated_integration_passes_every_cpu_proof(motif):
    _, out, rc, r = motif
    assert rc == 0, json.dumps({k: r[k] for k in ("cache", "cp", "tp", "state_dict")}, indent=1)[:3000]
    assert r["schema"] == "integrate.verify" and r["schema_version"] == "1.9"
    fx = r["fixture"]
    assert fx["status"] == "derived" and fx["parameters"] < 1_000_000
    assert fx["image_tokens"] != fx["text_tokens"]  # swapped streams cannot hide behind equal shapes
    fixture_text = (out / "verify_fixture.py").read_text()
    assert "encoder_attention_mask" in fixture_text  # the mask the CP reorder is about is exercised
    # cache: three lists (the PatchFunctor's decoder cut included), contracts observed, caching off is exact
    cache = r["cache"]
    assert cache["block_counts"][1:] == [2, 2] and cache["has_separate_cfg"] is True
    assert [p["status"] for p in cache["patterns"]][:2] == ["pass", "pass"]
    assert cache["patched_forward"]["bitwise"] and cache["caching_off"]["bitwise"]
    on = cache["caching_on"]
    assert on["cached_steps"] and on["finite"] and on["warmup_bitwise"] and on["max_rel_l2"] < 0.5
    # the PatchFunctor renames keys but keeps every tensor; importing the plugin changes nothing
    assert r["state_dict"]["status"] == "pass" and "renamed_by_patch_functor" in r["state_dict"]
    for proof, variants in (("cp", ("ulysses2", "ulysses2+cache")), ("tp", ("tp2", "tp2+cache"))):
        assert r[proof]["status"] == "pass" and r[proof]["first_divergence"] is None
        for v in variants:
            assert "skipped_splits" not in r[proof]["variants"][v]  # every planned split happened
            assert r[proof]["variants"][v]["max_abs"] < 1e-5
            assert r[proof]["variants"][v]["cosine"] > 0.999999
            engaged = r[proof]["variants"][v]["engaged"][proof]  # and the plan acted: shards, splits
            assert (engaged["sharded"] if proof == "tp" else engaged["split"]) > 0, engaged


def test_hybrid_ulysses_x_tp_passes_with_both_engaged_on_a_config_with_heads_to_cut_twice(motif):
    """`--proof hybrid`: Ulysses 2 x TP 2 over 4 gloo processes, with and without the cache, against the plain model
    run on the same config: the fixture's, with twice the heads of half the head dim (TP 2 then Ulysses 2 cut the
    heads; the fixture's 2 heads cut once only). Both CP and TP acted in each run."""
    plan_dir, out, _, _ = motif
    rc, r = _verify(plan_dir, out, "hybrid")
    h = r["hybrid"]
    assert rc == 0 and h["status"] == "pass", json.dumps(h, indent=1)[:3000]
    assert r["cp"]["status"] == "skipped"  # only the proof asked for ran
    assert h["config"] == {"num_attention_heads": [2, 4], "attention_head_dim": [16, 8],
                           "rope_axes_dim": [[2, 6, 8], [2, 2, 4]]}
    assert sorted(h["variants"]) == ["ulysses2xtp2", "ulysses2xtp2+cache"]
    for v in h["variants"].values():
        assert v["status"] == "pass" and v["max_abs"] < 1e-5
        assert v["engaged"]["tp"]["sharded"] > 0 and v["engaged"]["cp"]["split"] > 0, v["engaged"]


def test_the_fixture_is_an_editable_file_and_an_edit_is_used(motif, tmp_path):
    plan_dir, out, _, _ = motif
    edited = tmp_path / "out"
    shutil.copytree(out, edited)
    fx = edited / "verify_fixture.py"
    fx.write_text(fx.read_text().replace("STEPS = 4", "STEPS = 3"))
    rc, r = _verify(plan_dir, edited, "cache")
    assert r["fixture"]["status"] == "edited"
    assert "STEPS = 3" in fx.read_text()  # kept as the user left it
    assert rc == 0 and len(r["cache"]["caching_on"]["rel_l2_per_call"]) == 3 * 2  # 3 steps, CFG: 2 calls each


def test_planted_swapped_forward_pattern_is_caught(motif, tmp_path):
    plan_dir, _, _, _ = motif
    bad = _planted(motif, tmp_path, ("adapter.py", "(transformer.transformer_blocks, ForwardPattern.Pattern_0)",
                                      "(transformer.transformer_blocks, ForwardPattern.Pattern_1)"))
    rc, r = _verify(plan_dir, bad, "cache")
    assert rc == 1 and r["cache"]["status"] in ("fail", "error")
    assert any(p["status"] == "fail" and "Pattern_1" in p["why"] for p in r["cache"]["patterns"])
    where = r["cache"]["first_divergence"]["module"]
    assert where.startswith("transformer_blocks."), where


def test_planted_missing_shard_div_attr_is_caught_and_located(motif, tmp_path):
    plan_dir, _, _, _ = motif
    bad = _planted(motif, tmp_path, ("tp_planner.py", "shard_div_attr(", "(lambda *a, **k: None)("))
    rc, r = _verify(plan_dir, bad, "tp")
    assert rc == 1 and r["tp"]["status"] in ("fail", "error")
    where = r["tp"]["first_divergence"]["module"]
    assert ".attn" in where, where  # the attention that reshapes with the undivided head count


def test_planted_missing_mask_permutation_is_caught_at_the_first_attention(motif, tmp_path):
    plan_dir, _, _, _ = motif
    bad = _planted(motif, tmp_path, ("cp_planner.py", "        _reorder_mask_under_ulysses(transformer)\n",
                                     "        pass\n"))
    rc, r = _verify(plan_dir, bad, "cp")
    assert rc == 1 and r["cp"]["status"] == "fail"
    first = r["cp"]["first_divergence"]
    assert first["module"] == "transformer_blocks.0.attn.to_out.0"
    rows = {row["module"]: row for row in first["table"]}
    assert rows["transformer_blocks.0.attn.to_q"]["ok"] and not rows[first["module"]]["ok"]


def test_an_odd_sequence_is_proved_with_cache_dits_uneven_split(motif, tmp_path):
    """A text of 5 tokens does not divide over 2 ranks: cache-dit's even split asserts, which says nothing
    about the planner; the proof says so and runs the same variants again with ulysses_anything."""
    plan_dir, out, _, _ = motif
    odd = tmp_path / "out"
    shutil.copytree(out, odd)
    fx = odd / "verify_fixture.py"
    text = fx.read_text()
    for name in ("encoder_hidden_states", "encoder_attention_mask"):
        whole = f"_saved(step, '{name}'),"
        assert whole in text
        text = text.replace(whole, f"_saved(step, '{name}')[:, :5],")
    fx.write_text(text)
    rc, r = _verify(plan_dir, odd, "cp")
    cp = r["cp"]["variants"]
    assert rc == 0 and r["cp"]["status"] == "pass", r["cp"]
    for name in ("ulysses2", "ulysses2+cache"):
        assert cp[name]["status"] == "skipped" and "does not divide by 2" in cp[name]["why"]
        assert cp[name]["error"]["type"] == "AssertionError"
        assert cp[f"{name}+anything"]["status"] == "pass" and cp[f"{name}+anything"]["max_abs"] < 1e-5


def test_a_hand_written_part_left_as_a_stub_is_needs_code_never_a_pass(motif, tmp_path):
    """While the plugin's `manual_patch.py` still assigns NEEDS_CODE, the proofs that go through the adapter
    (the cache proof and the `+cache` variants) are `needs-code` and verify exits 1; the others still run.
    Filled in (the marker gone), the same plugin is proved as usual."""
    plan_dir, out, _, _ = motif
    mine = tmp_path / "out"
    shutil.copytree(out, mine)
    stub = mine / PLUGIN / "manual_patch.py"
    stub.write_text("NEEDS_CODE = True\n\n\ndef apply_manual(transformer):\n    raise NotImplementedError\n")
    rc, r = _verify(plan_dir, mine, "cache", "tp")
    assert rc == 1 and r["cache"]["status"] == "needs-code" and "manual_patch.py is a stub" in r["cache"]["why"]
    assert r["tp"]["status"] == "needs-code"
    assert r["tp"]["variants"]["tp2"]["status"] == "pass" and r["tp"]["variants"]["tp2+cache"]["status"] == "needs-code"
    stub.write_text("def apply_manual(transformer):\n    return transformer\n")
    rc, r = _verify(plan_dir, mine, "cache")
    assert rc == 0 and r["cache"]["status"] == "pass"


def test_a_planned_split_cache_dit_skips_is_named_not_silent(motif, tmp_path):
    """A split whose `expected_dims` is not its tensor's rank is one cache-dit skips with a warning and no
    error: the CP proof names it (module and cache-dit's words) in the variant, whatever the numbers say."""
    plan_dir, _, _, _ = motif
    rope = ("cp_planner.py", "0: _ContextParallelInput(split_dim=0, expected_dims=None, split_output=True)",
            "0: _ContextParallelInput(split_dim=0, expected_dims=3, split_output=True)")
    bad = _planted(motif, tmp_path, rope)
    rc, r = _verify(plan_dir, bad, "cp")
    v = r["cp"]["variants"]["ulysses2"]
    assert rc == 1 and v["status"] in ("fail", "error")
    assert v["skipped_splits"] == ["rope: Expected input tensor to have 3 dimensions, but got 2 dimensions; split "
                                   "will be skipped."], v
    assert "cache-dit skipped 1 planned split(s)" in v["why"]
    assert "skipped_splits" not in r["cp"]["variants"].get("ulysses2+cache", {}) or \
        r["cp"]["variants"]["ulysses2+cache"]["skipped_splits"] == v["skipped_splits"]


def test_planted_in_place_residual_on_a_block_input_is_caught(motif, tmp_path):
    plan_dir, _, _, _ = motif
    # every dual-stream block writes its result into the tensor it was given (`hidden_states += ...`)
    plant = ("patch_functor.py", "        transformer._is_patched = True\n", """\
        for block in transformer.transformer_blocks:
            def in_place(hidden_states, encoder_hidden_states, *args, _forward=block.forward, **kwargs):
                out_h, out_e = _forward(hidden_states, encoder_hidden_states, *args, **kwargs)
                hidden_states += out_h - hidden_states
                return hidden_states, out_e
            block.forward = in_place
        transformer._is_patched = True
""")
    bad = _planted(motif, tmp_path, plant)
    rc, r = _verify(plan_dir, bad, "cache")
    assert rc == 1 and r["cache"]["status"] == "fail", r["cache"].get("why")
    assert "caching on" in r["cache"]["why"]


def test_a_model_cache_dit_supports_passes_with_its_own_integration(tmp_path):
    model = make_model_dir(tmp_path / "flux", "FluxPipeline", "FluxTransformer2DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    rc, r = _verify(plan_dir, out)
    assert r["cache"]["status"] == "pass" and r["tp"]["status"] == "pass", r
    assert r["cache"]["patterns"][0]["pattern"] == "Pattern_1" and r["cache"]["patterns"][0]["status"] == "pass"
    assert r["cp"]["variants"]["ulysses2"]["status"] == "pass"
    ring = r["cp"]["variants"].get("ring2")
    assert ring is None or ring["status"] in ("pass", "skipped")  # no ring kernel on CPU: said, not faked
    assert rc == 0


def test_bad_input_is_one_line_and_exit_2(motif, tmp_path):
    plan_dir, out, _, _ = motif
    for args in (["verify", str(tmp_path / "nowhere"), "--generated", str(out)],
                 ["verify", str(plan_dir), "--generated", str(tmp_path / "empty")],
                 ["verify", str(plan_dir), "--generated", str(out), "--print"]):
        proc = run_cli(*args)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr


def test_gpu_matrix_is_printed_and_no_figure_is_pretended_without_a_gpu(motif):
    plan_dir, out, _, _ = motif
    proc = run_cli("verify", str(plan_dir), "--generated", str(out), "--gpu", "--print", "--json")
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    cmds = data["commands"]
    assert any("--parallel ulysses " in c for c in cmds) and any("--parallel tp --parallel-vae" in c for c in cmds)
    assert any(c.startswith("torchrun --nproc_per_node=4") and "ulysses_tp" in c for c in cmds)
    assert all("--track-memory" in c for c in cmds)
    import torch

    if not torch.cuda.is_available():
        run = run_cli("verify", str(plan_dir), "--generated", str(out), "--gpu", "--json")
        assert run.returncode == 1
        assert json.loads(run.stdout)["status"] == "skipped" and "results" not in json.loads(run.stdout)


def test_motif_video_end_to_end_from_gate_to_the_gpu_commands(motif):
    """gate -> analyze -> plan -> approve -> generate -> verify (module fixture) -> the GPU commands to run next."""
    plan_dir, out, rc, report = motif
    gate = run_cli("gate", "--model-path", str(EXAMPLE), "--json")
    assert gate.returncode == 0
    inputs = json.loads(gate.stdout)["gate"]["inputs"]
    assert inputs["transformer_class"]["value"] == "MotifVideoTransformer3DModel"
    analyzed = json.loads(run_cli("analyze", str(EXAMPLE), "--json").stdout)
    assert analyzed["already_supported"]["registered"] is False  # cache-dit 1.5.3 has no MotifVideo adapter
    assert rc == 0 and all(report[k]["status"] == "pass" for k in ("state_dict", "cache", "cp", "tp"))
    printed = run_cli("verify", str(plan_dir), "--generated", str(out), "--gpu", "--print")
    assert printed.returncode == 0
    assert f"export PYTHONPATH={out.resolve()}" in printed.stdout
    assert "python -P -m integrate_motif_video motif_video --track-memory" in printed.stdout


def test_a_checkouts_pr_description_carries_the_saved_cpu_proofs(motif, tmp_path):
    """`generate --mode checkout --verify-report` puts the proofs of the plugin from the same plan into PR.md;
    a report of another model, or of something else, is refused with one line."""
    import cache_dit

    plan_dir, _, _, report = motif
    shutil.copytree(Path(cache_dit.__file__).parent, tmp_path / "src" / "cache_dit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    saved = tmp_path / "verify.json"
    saved.write_text(json.dumps(report))
    args = ["generate", str(plan_dir), "--mode", "checkout", "--cache-dit-src", str(tmp_path), "--out",
            str(tmp_path / "pr")]
    proc = run_cli(*args, "--verify-report", str(saved))
    assert proc.returncode == 0, proc.stderr
    pr = (tmp_path / "pr" / "PR.md").read_text()
    for proof in ("state\\_dict", "cache", "cp", "tp"):
        assert f"| {proof} | pass |" in pr, pr
    assert "ulysses2: pass (max abs" in pr.replace("\\", "")
    assert "None" not in pr and ":0`" not in pr  # no hole where a value or a line is missing
    # a report with a variant that stopped (no figure) and no timing still leaves no hole
    stopped = json.loads(json.dumps(report))
    stopped.pop("seconds", None)
    first = next(iter(stopped["tp"]["variants"]))
    stopped["tp"]["variants"][first] = {"status": "error", "why": "stopped"}
    saved.write_text(json.dumps(stopped))
    assert run_cli(*args, "--verify-report", str(saved)).returncode == 0
    pr = (tmp_path / "pr" / "PR.md").read_text()
    assert f"{first}: error" in pr.replace("\\", "") and "None" not in pr
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**report, "model": {**report["model"], "transformer_class": "FluxTransformer2DModel"}}))
    for bad, needle in ((other, "not of MotifVideoTransformer3DModel"), (plan_dir / "plan.json", "not the JSON of")):
        proc = run_cli(*args, "--verify-report", str(bad))
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_cache_proof_uses_the_plugin_where_a_built_in_prefix_would_answer(tmp_path):
    """SanaVideo: cache-dit's `Sana` adapter matches the name by prefix but accepts only SanaTransformer2DModel."""
    model = make_model_dir(tmp_path / "m", "SanaVideoPipeline", "SanaVideoTransformer3DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    _, r = _verify(plan_dir, out, "cache")
    assert r["cache"]["status"] == "pass", r["cache"].get("why")
    assert r["cache"]["caching_on"]["cached_steps"] and r["cache"]["caching_off"]["bitwise"]


def test_a_walk_the_config_never_takes_is_not_planned_and_the_plugin_still_works(tmp_path):
    """MotifVideo from its class defaults has no decoder layers: the guarded second walk is left out."""
    model = make_model_dir(tmp_path / "m", "MotifVideoPipeline", "MotifVideoTransformer3DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    plan = json.loads((plan_dir / "plan.json").read_text())
    assert not any(k.startswith("single_transformer_blocks.") for k in plan["parallelism"]["cp"]["plan"])
    rc, r = _verify(plan_dir, out, "cache", "cp")
    assert rc == 0, {k: r[k].get("why") for k in ("cache", "cp")}
    assert r["cache"]["block_counts"] == [2, 3]  # the empty decoder cut is not handed to cache-dit


def test_linear_attention_and_a_q_norm_over_all_heads_shard_correctly(tmp_path):
    """SanaVideo's self-attention is linear (matmuls, no kernel call): `to_out` is placed after it by data flow
    (its input derives from q, k and v), so it is row-wise; and its `norm_q` / `norm_k` normalise over all
    heads, which no static read of `Attention.__init__` can size: the planner measures the built module."""
    model = make_model_dir(tmp_path / "m", "SanaVideoPipeline", "SanaVideoTransformer3DModel")
    plan_dir, out = plan_generate(model, tmp_path)
    tp = json.loads((plan_dir / "plan.json").read_text())["parallelism"]["tp"]["block_lists"][0]
    assert tp["layer_plan"]["attn1.to_out.0"] == "rowwise"
    assert "no kernel call" in tp["reasons"]["attn1.to_out.0"]["why"]
    rc, r = _verify(plan_dir, out, "tp")
    assert rc == 0 and r["tp"]["status"] == "pass", r["tp"].get("why")


def test_an_uneven_gather_gloo_refuses_is_skipped_as_this_machines_limit_not_passed():
    """cache-dit's ulysses_anything gathers shards of different lengths with all_gather, which gloo refuses
    ("ProcessGroupGloo::allgather: invalid tensor size") and NCCL takes: on this machine that variant is
    skipped with the reason (a GPU run proves it), never an error charged to the planner, never a pass."""
    from integrate.verify.paired import judge

    error = {"stage": "run the model", "module": "proj_out", "at": "distributed_c10d.py:1", "type": "RuntimeError",
             "message": "ProcessGroupGloo::allgather: invalid tensor size at index 1 (expected (1, 12, 8), got "
                        "(1, 11, 8))"}
    proof = judge(None, [{"name": "ulysses2+anything", "ulysses": 2, "anything": True}],
                  {"ulysses2+anything": ([{"error": error}, {"error": error}], [], ["", ""])})
    row = proof.variants["ulysses2+anything"]
    assert proof.status == "skipped" and row.status == "skipped"
    assert "gloo" in row.why and "GPUs" in row.why
