"""`verify --proof tep` and `--proof vaep`: a text encoder and a VAE built tiny from the installed transformers /
diffusers classes, proved through cache-dit 1.5.3's planners over 2 gloo processes; the judge calls a run that
agrees but shows no engagement `vacuous`; and a part from an untrusted package is refused as the attack it is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import EXAMPLE, plan_generate, run_cli
from integrate.verify import component
from integrate.verify.components import tep as tep_worker
from integrate.verify.components import vaep as vaep_worker
from integrate.verify.proofs import tep, vaep


def _model(base: Path, **parts: list[str]) -> Path:
    """The MotifVideo example's folder with model_index.json naming `parts` (component -> [library, class])."""
    model = base / "model"
    shutil.copytree(EXAMPLE, model)
    index = json.loads((model / "model_index.json").read_text())
    index.update(parts)
    (model / "model_index.json").write_text(json.dumps(index))
    return model


def test_tep_with_cache_dits_planner_and_vaep_with_a_generated_one_pass_and_show_what_they_engaged(tmp_path):
    # cache-dit registers T5EncoderModel's TE-P planner; AutoencoderDC's VAE-P planner is generate's, from its
    # tiled_decode (the six VAEs cache-dit registers: bench/bench_components.py --vaep)
    # text_encoder_2: the example's own T5Gemma2Encoder, whose planner generate writes from its HF layer plan and
    # whose class defaults build only as its composite config (T5Gemma2Config.encoder) fills them in
    model = _model(tmp_path, text_encoder=["transformers", "T5EncoderModel"], vae=["diffusers", "AutoencoderDC"],
                   text_encoder_2=["transformers", "T5Gemma2Encoder"])
    plan_dir, out = plan_generate(model, tmp_path)
    # a reviewer says the encoder has a layer plan: the proof would now run the class
    revised = run_cli("revise", str(plan_dir), "--set", 'text_encoders.0.tp_plan={"layers.*.q": "colwise"}',
                      "--why", "test", "--reviewer", "Ada Lovelace")
    assert revised.returncode == 0, revised.stderr
    assert run_cli("approve", str(plan_dir), "--reviewer", "Ada Lovelace").returncode == 0
    proc = run_cli("verify", str(plan_dir), "--generated", str(out), "--proof", "tep", "--proof", "vaep", "--json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["fixture"]["status"] == "skipped"  # no transformer fixture for parts of their own
    assert report["cache"]["status"] == "skipped"
    te, te2 = report["tep"]["runs"]
    assert te["status"] == "pass" and te["class"] == "T5EncoderModel"
    assert te2["status"] == "pass" and te2["planner"].startswith("integrate_motif_video.")
    assert te2["config_from"] == "class defaults, as T5Gemma2Config.encoder sets them" and te2["engaged"]["sharded"]
    assert te["planner"].endswith("T5EncoderTensorParallelismPlanner")
    shards = {s["name"]: s for s in te["engaged"]["shards"]}
    q = shards["encoder.block.0.layer.0.SelfAttention.q.weight"]
    assert q["local"][0] * 2 == q["full"][0]  # column-wise: half the rows on each rank
    (v,) = report["vaep"]["runs"]
    assert v["status"] == "pass" and v["planner"].startswith("integrate_motif_video.")  # the plugin's
    calls = v["engaged"]["decoder_calls_per_rank"]
    assert sum(calls) == v["engaged"]["decoder_calls_1process"] > 2 and max(calls) < sum(calls)
    assert v["figures"]["ok"] and v["seams"]["ok"] and v["seams"]["borders"]["rows"] > 0
    assert "psnr" in v["untiled"] and "ssim" in v["untiled"]  # reported beside the judged comparison


def test_an_agreeing_run_that_engaged_nothing_is_vacuous():
    job = {"component": "vae", "cls": "AutoencoderKL"}
    same = {"rank": 0, "figures": {"max_abs": 0.0, "cosine": 1.0, "rel_l2": 0.0, "ok": True}}
    every_rank_all = dict(same, decoder_calls_1process=9, decoder_calls_per_rank=[9, 9])
    run = component.judge_run(vaep, job, [every_rank_all, every_rank_all], [None, None])
    assert run.status == "vacuous" and "every tile" in run.why
    untiled = dict(same, decoder_calls_1process=1, decoder_calls_per_rank=[1, 0])
    assert component.judge_run(vaep, job, [untiled, untiled], [None, None]).status == "vacuous"
    nothing = dict(same, parameters=12, sharded=0, shards=[], hidden_states=3)
    run = component.judge_run(tep, {"component": "text_encoder", "cls": "T5EncoderModel"}, [nothing, nothing],
                              [None, None])
    assert run.status == "vacuous" and "sharded" in run.why
    assert component.verdict([run]).status == "vacuous"


def test_tiny_configs_keep_what_parallelism_needs():
    import transformers

    config, changes = tep_worker.shrink(transformers.Qwen2_5_VLConfig().to_dict())
    text = config["text_config"]
    assert text["num_key_value_heads"] == 2 and text["num_attention_heads"] % 2 == 0  # TP 2 divides both
    assert text["hidden_size"] // text["num_attention_heads"] == 128  # each head as wide as the real one
    assert len(text["layer_types"]) == text["num_hidden_layers"] == 2
    assert text["vocab_size"] == tep_worker.VOCAB
    config, _ = vaep_worker.shrink({"block_out_channels": [128, 256, 512, 512], "layers_per_block": 2,
                                    "latent_channels": 4, "norm_num_groups": 32})
    assert config["block_out_channels"] == [32, 64, 128, 128] and config["layers_per_block"] == 1


def test_a_flag_the_constructor_refuses_is_cleared_and_only_that_one():
    """T5GemmaEncoderModel raises in its constructor when `config.is_encoder_decoder` is set, which its config
    class defaults to: the tiny encoder clears that flag (read from the constructor's `if`), with the reason.
    T5EncoderModel's constructor refuses no flag."""
    import transformers

    cls = transformers.T5GemmaEncoderModel
    config, _ = tep_worker._config(cls, None)
    refused = tep_worker._refusals(cls, config)
    assert list(refused) == ["is_encoder_decoder"] and refused["is_encoder_decoder"][:2] == [True, False]
    assert "config.is_encoder_decoder" in refused["is_encoder_decoder"][2]
    config.is_encoder_decoder = False
    cls(config)  # builds once the flag is cleared
    assert tep_worker._refusals(transformers.T5EncoderModel, transformers.T5Config()) == {}


def test_a_part_from_an_untrusted_package_is_refused_before_it_runs(tmp_path):
    marker = tmp_path / "marker"
    evil = tmp_path / "evilpkg"
    evil.mkdir()
    (evil / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nclass Enc: pass\n")
    model = _model(tmp_path, text_encoder=["evilpkg", "Enc"])
    plan_dir, out = plan_generate(model, tmp_path)
    plan = json.loads((plan_dir / "plan.json").read_text())
    part = {"component": "text_encoder", "library": "evilpkg", "cls": "Enc"}
    try:
        component.job("tep", part, plan["model"]["model_path"], None, trust_code=False)
    except Exception as exc:
        assert "--trust-code" in str(exc)
    else:
        raise AssertionError("an untrusted library's class was accepted")
    # a reviewer says the encoder has a layer plan and asks for our planner: the proof would now run the class
    revised = run_cli("revise", str(plan_dir), "--set", 'text_encoders.0.tp_plan={"layers.*.q": "colwise"}',
                      "--set", "text_encoders.0.planner=generate", "--why", "test", "--reviewer", "Ada Lovelace")
    assert revised.returncode == 0, revised.stderr
    assert run_cli("approve", str(plan_dir), "--reviewer", "Ada Lovelace").returncode == 0
    proc = run_cli("verify", str(plan_dir), "--generated", str(out), "--proof", "tep",
                   env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 2 and "--trust-code" in proc.stderr and not marker.exists()


@pytest.mark.parametrize("cls, sharded", [
    # cache-dit 1.5.3's planner looks for a top-level `language_model`, which transformers 5 keeps under `model`;
    # ours must shard the language model's layers, not the vision tower's
    ("Mistral3ForConditionalGeneration", "model.language_model.layers.0.self_attn.q_proj.weight"),
    # cache-dit's planner feeds the whole `gate_up_proj` output to a row-wise `down_proj` that expects a shard; the HF
    # plan gathers the one and has the other split its input (`colwise_gather_output` / `rowwise_split_input`)
    ("GlmModel", "layers.0.mlp.down_proj.weight"),
])
def test_a_cache_dit_planner_that_does_not_fit_is_reported_and_ours_passes_once_the_plan_is_revised(
        tmp_path, cls, sharded):
    """cache-dit registers a TE-P planner under the class's own name that fails on the installed transformers: the
    proof fails with cache-dit's error and says how to revise the plan; revised, generate writes ours from the HF
    layer plan, registers it ahead of cache-dit's, and the proof passes with it engaged where it should be."""
    model = _model(tmp_path, text_encoder=["transformers", cls])
    plan_dir, out = plan_generate(model, tmp_path)
    plan = json.loads((plan_dir / "plan.json").read_text())
    (te,) = plan["text_encoders"]
    assert te["planner"] == "reuse" and te["registered_as"] == cls
    proc = run_cli("verify", str(plan_dir), "--generated", str(out), "--proof", "tep", "--json")
    report = json.loads(proc.stdout)
    (run,) = report["tep"]["runs"]
    if run["status"] == "pass":
        pytest.skip("the installed cache-dit's planner fits the installed transformers: nothing to revise")
    assert proc.returncode == 1 and run["planner"].startswith("cache_dit.")
    assert "text_encoders.0.planner=generate" in run["why"], run["why"]
    revised = run_cli("revise", str(plan_dir), "--set", "text_encoders.0.planner=generate", "--why",
                      "cache-dit's planner fails on this transformers", "--reviewer", "Ada Lovelace")
    assert revised.returncode == 0, revised.stderr
    assert run_cli("approve", str(plan_dir), "--reviewer", "Ada Lovelace").returncode == 0
    shutil.rmtree(out)
    made = run_cli("generate", str(plan_dir), "--out", str(out), "--json")
    assert made.returncode == 0, made.stderr
    assert any("moves it to the front" in n for n in json.loads(made.stdout)["notes"])
    proc = run_cli("verify", str(plan_dir), "--generated", str(out), "--proof", "tep", "--json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run,) = json.loads(proc.stdout)["tep"]["runs"]
    assert run["status"] == "pass" and run["planner"].startswith("integrate_motif_video.")
    names = {s["name"] for s in run["engaged"]["shards"]}
    assert sharded in names, names


def test_a_class_the_library_does_not_export_is_built_from_its_module_and_the_part_of_its_config_it_takes():
    """T5GemmaEncoder: not exported by transformers; its config class is the encoder-decoder composite, and it reads
    `hidden_size`, which only the composite's `encoder` part has."""
    from integrate.verify.components import common

    cls = common.load_class("transformers", "T5GemmaEncoder", "transformers.models.t5gemma.modeling_t5gemma")
    config, _ = tep_worker._config(cls, None)
    try:
        cls(config)
    except AttributeError as exc:
        key, sub_cls, raw, why = tep_worker._sub_config(cls, exc)
    else:
        raise AssertionError("the composite config built T5GemmaEncoder: nothing to show")
    assert key == "encoder" and "`hidden_size`" in why
    tiny, _ = tep_worker.shrink(raw)
    cls(sub_cls.from_dict(tiny))  # builds from that part


def test_a_module_path_outside_the_library_is_never_imported(tmp_path, monkeypatch):
    """The module a plan names for a class (plan.json is text a person may edit) is imported only where it lies
    inside the library model_index.json names: a payload module elsewhere never runs."""
    from integrate.verify.components import common

    marker = tmp_path / "marker"
    (tmp_path / "payload_te.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nclass X: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("payload_te", "transformers_payload_te", "transformers.models..x", "transformers.__import__('os')"):
        with pytest.raises(ValueError):
            common.load_class("transformers", "X", module)
    assert not marker.exists()
