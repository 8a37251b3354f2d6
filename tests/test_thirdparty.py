"""Code never seen before, with third-party names: gate by flags, roles mapped, pitfalls found."""

import json

from conftest import ROOT, run_cli

BFL = ROOT / "tests" / "fixtures" / "bfl" / "model.py"


def _bfl(tmp_path, *extra):
    return run_cli("analyze", str(BFL), "--model-path", str(tmp_path), "--transformer-class", "Flux",
                   "--pipeline-class", "denoise", "--pipeline-file", str(BFL), "--json", *extra)


def test_bfl_style_model(tmp_path):
    out = _bfl(tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    lists = {b["attr"]: b for b in data["transformer"]["block_lists"]}
    double, single = lists["double_blocks"], lists["single_blocks"]
    # block class resolved through `from .layers import ...`
    assert double["block_class"] == "DoubleStreamBlock" and double["block_file"].endswith("layers.py")
    assert double["roles"] == {"hidden_states": "img", "encoder_hidden_states": "txt"}
    assert double["forward_pattern"] == "Pattern_0"
    assert double["check_forward_pattern"] is False  # cache-dit's check looks for hidden_states by name
    assert double["call_site"]["keyword_positional_mismatch"] is True  # block(img=img, txt=txt, ...)
    # a list filled by a loop of appends
    assert single["block_class"] == "SingleStreamBlock" and single["length_config_fields"] == ["depth_single"]
    assert single["forward_pattern"] == "Pattern_3"
    assert single["call_site"]["in_place_input_mutation"], "x += ... on the input is pitfall C"
    assert lists["projections"]["is_blocks"] is False and "torch.nn.Linear" in lists["projections"]["why"]
    assert data["gate"]["pipeline_entry"] == "denoise"
    assert data["pipeline"]["has_separate_cfg"] is False
    reasons = " ".join(data["transformer"]["patch_functor_reasons"])
    assert "pitfall A" in reasons and "pitfall C" in reasons


def test_static_means_static(tmp_path):
    marker = tmp_path / "marker"
    src = ROOT / "tests" / "fixtures" / "sidefx" / "model.py"
    out = run_cli("analyze", str(src), "--model-path", str(tmp_path), "--transformer-class", "Model",
                  "--pipeline-class", "Pipeline", "--pipeline-file", str(src), "--json",
                  env={"SIDEFX_MARKER": str(marker)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["transformer"]["block_lists"][0]["forward_pattern"] == "Pattern_0"
    assert not marker.exists(), "the analysed module was imported"


def test_bfl_style_plan_is_honest_about_what_it_cannot_see(tmp_path):
    out = tmp_path / "plan"
    proc = run_cli("plan", str(BFL), "--model-path", str(tmp_path), "--transformer-class", "Flux",
                   "--pipeline-class", "denoise", "--pipeline-file", str(BFL), "--out", str(out), "--json",
                   "--trust-code")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    cp = data["parallelism"]["cp"]
    assert cp["shape"] == "root split"
    assert set(cp["plan"][""]) == {"img", "txt", "pe"}  # pe arrives ready-made: cut with the tokens
    assert any("`pe`" in u for u in data["unknowns"])  # ... but its layout is not in the code
    assert any("no attention module" in u for u in data["unknowns"])
    check = data["facts"]["crosscheck"]  # imported from the source checkout; no config.json to build from
    assert check["ok"] is False and "Flux" in check["error"] and "\n" not in check["error"]


FUSED = ROOT / "tests" / "fixtures" / "fused" / "model.py"


def test_fused_qkv_is_replicated_and_indivisible_kv_heads_leave_attention_whole(tmp_path):
    """Own fixture: fused QKV chunked in three (-> replicate, no shard_div_attr) and 3 KV heads (-> FFN-only)."""
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps({"dim": 96, "heads": 6, "kv_heads": 3}))
    proc = run_cli("plan", str(FUSED), "--model-path", str(tmp_path), "--transformer-class", "TinyDiT",
                   "--pipeline-class", "denoise", "--pipeline-file", str(FUSED), "--out", str(tmp_path / "p"), "--json",
                   "--trust-code")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    tp = {x["attr"]: x for x in data["parallelism"]["tp"]["block_lists"]}
    joint, single = tp["blocks"], tp["single_blocks"]
    assert joint["strategy"] == "replicate" and joint["shard_div_attr"] == {}
    assert joint["layer_plan"]["attn.img_qkv"] == "colwise(output=replicate)"
    assert joint["layer_plan"]["attn.txt_out"] == "rowwise(input=replicate)"
    assert joint["layer_plan"]["img_ff.down"] == "rowwise"
    assert single["strategy"] == "ffn-only"
    assert not any(k.startswith("attn.") for k in single["layer_plan"])
    assert single["heads"]["attn"]["kv_heads"] == ["kv_heads", 3]  # traced from config.json
    cp = data["parallelism"]["cp"]
    assert cp["shape"] == "root split" and "proj_out" in cp["plan"]
    assert cp["ulysses_anything"]["2"]["needed"]  # 3 KV heads do not divide CP 2 either
    check = data["facts"]["crosscheck"]  # built from the source checkout on the meta device
    assert check["ok"] is True and check["disagreements"] == [] and check["checked"] > 10


def test_plan_runs_no_model_code_outside_installed_packages_without_trust(tmp_path):
    """The meta-device check imports the model: for a source checkout it needs --trust-code."""
    marker = tmp_path / "marker"
    src = ROOT / "tests" / "fixtures" / "sidefx" / "model.py"
    args = ["plan", str(src), "--model-path", str(tmp_path), "--transformer-class", "Model", "--pipeline-class",
            "Pipeline", "--pipeline-file", str(src), "--out", str(tmp_path / "plan"), "--json"]
    proc = run_cli(*args, env={"SIDEFX_MARKER": str(marker)})
    assert proc.returncode == 0, proc.stderr
    check = json.loads(proc.stdout)["facts"]["crosscheck"]
    assert check["ok"] is None and "--trust-code" in check["error"] and "installed package" in check["error"]
    assert not marker.exists(), "the model's module was imported without --trust-code"
    proc = run_cli(*args, "--trust-code", env={"SIDEFX_MARKER": str(marker)})
    assert proc.returncode == 0 and marker.exists()  # with trust, the probe did build it


def test_a_torch_py_in_the_working_directory_is_never_imported(tmp_path):
    """Workers start with `python -I`: the working directory is not on their path."""
    marker = tmp_path / "ran"
    (tmp_path / "torch.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    model = tmp_path / "m"
    model.mkdir()
    (model / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline", "_diffusers_version": "0.42.1",
                                                       "transformer": ["diffusers", "FluxTransformer2DModel"]}))
    proc = run_cli("plan", str(model), "--out", str(tmp_path / "plan"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), "a torch.py in the working directory ran in a worker"


def test_generate_writes_a_patch_functor_for_a_module_that_imports_torch_both_ways(tmp_path):
    """The model's module has `import torch` and `from torch import Tensor, nn`, and its forward needs a
    PatchFunctor (the block is called by keyword, in another order than its signature): sorting the imports
    the rewrite needs compared `None` with a name and generate exited 3. Now the functor imports both (its
    forward reads `Tensor` in its body: annotations are not copied, issue 33)."""
    src = ROOT / "tests" / "fixtures" / "torchimports" / "model.py"
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    planned = run_cli("plan", str(src), "--model-path", str(tmp_path), "--transformer-class", "Model",
                      "--pipeline-class", "sample", "--pipeline-file", str(src), "--out", str(plan_dir), "--no-probe")
    assert planned.returncode == 0, planned.stderr
    assert run_cli("approve", str(plan_dir), "--reviewer", "Ada").returncode == 0
    gen = run_cli("generate", str(plan_dir), "--out", str(out), "--json")
    assert gen.returncode == 0, gen.stderr
    functor = next(out.glob("*/patch_functor.py")).read_text()
    assert "\nimport torch\n" in functor and "\nfrom torch import Tensor\n" in functor


def test_the_terminal_report_says_what_the_json_says_for_a_sampler_function(tmp_path):
    """A sampler function has no class: the report names the function, not `None.denoise`; and a cache-dit
    prefix whose adapter was written for another class (the JSON's `registered: false`) is not reported as support,
    with the verdict on it."""
    out = _bfl(tmp_path)
    data = json.loads(out.stdout)
    assert data["already_supported"]["registered"] is False
    text = run_cli("analyze", str(BFL), "--model-path", str(tmp_path), "--transformer-class", "Flux",
                   "--pipeline-class", "denoise", "--pipeline-file", str(BFL)).stdout
    assert "None.denoise" not in text and "\ndenoise (" in text
    assert "already registers" not in text
    assert "not supported by it: cache-dit's 'Flux' adapter (adapters.py:41) answers Flux by prefix but was written " \
        "for diffusers.FluxTransformer2DModel" in text
    assert "NOT deferred to (high): cache-dit's 'Flux' adapter" in text  # the verdict, as the JSON's `answers` says


BLOCKCLS = ROOT / "tests" / "fixtures" / "blockcls"


def _blockcls(*extra):
    src = BLOCKCLS / "model.py"
    return run_cli("analyze", str(src), "--pipeline-class", "sample", "--pipeline-file", str(src), "--no-cache",
                   "--json", *extra)


def test_a_block_class_given_as_a_constructor_default_is_traced_and_a_root_config_is_read():
    """`block_cls=JointBlock` in the constructor's signature: the list holds JointBlock (said in the
    evidence). The checkpoint folder has only a root-level config.json naming the class: the gate reads it as
    the transformer's config and takes the class from it; the untraceable factory list stays unknown."""
    out = _blockcls("--model-path", str(BLOCKCLS / "ckpt"))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    facts = data["gate"]["inputs"]
    assert facts["config_file"]["value"].endswith("ckpt/config.json")
    assert "root" in facts["config_file"]["source"] and facts["transformer_class"]["value"] == "Model"
    lists = {b["attr"]: b for b in data["transformer"]["block_lists"]}
    assert lists["blocks"]["block_class"] == "JointBlock" and lists["blocks"]["forward_pattern"]
    assert any("block_cls=JointBlock" in e["why"] for e in lists["blocks"]["evidence"])
    assert lists["refiner"]["is_blocks"] is None and "not traced" in lists["refiner"]["why"]


def test_block_class_flag_names_a_list_the_code_cannot_trace():
    out = _blockcls("--model-path", str(BLOCKCLS / "ckpt"), "--block-class", "refiner=RefinerBlock")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    refiner = {b["attr"]: b for b in data["transformer"]["block_lists"]}["refiner"]
    assert refiner["block_class"] == "RefinerBlock" and refiner["is_blocks"] is True
    assert refiner["forward_pattern"] == "Pattern_3"
    assert any("flag --block-class refiner=RefinerBlock" in e["why"] for e in refiner["evidence"])
    assert data["gate"]["block_classes"] == [["refiner", "RefinerBlock"]]


def test_config_flag_makes_the_model_path_optional_and_the_plan_uses_its_sizes(tmp_path):
    """--config alone: no model folder. The plan says so, reads the checkpoint's 12 heads (the constructor
    says 16) and records the config it used."""
    src = BLOCKCLS / "model.py"
    out = run_cli("plan", str(src), "--config", str(BLOCKCLS / "ckpt" / "config.json"), "--pipeline-class",
                  "sample", "--pipeline-file", str(src), "--out", str(tmp_path / "plan"), "--no-probe", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["model"]["model_path"] is None and plan["model"]["config_file"].endswith("config.json")
    md = (tmp_path / "plan" / "PLAN.md").read_text()
    assert "Model path | none: the config came from `--config`" in md
    gate = json.loads(run_cli("gate", "--transformer-file", str(src), "--config",
                              str(BLOCKCLS / "ckpt" / "config.json"), "--pipeline-class", "sample",
                              "--pipeline-file", str(src), "--json").stdout)["gate"]
    assert gate["inputs"]["model_path"]["value"] is None and "--config" in gate["inputs"]["model_path"]["source"]


CFGSTYLES = ROOT / "tests" / "fixtures" / "cfgstyles" / "model.py"


def _cfg_of(tmp_path, entry: str) -> dict:
    out = run_cli("analyze", str(CFGSTYLES), "--model-path", str(tmp_path), "--transformer-class", "DiT",
                  "--pipeline-class", entry, "--pipeline-file", str(CFGSTYLES), "--no-cache", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["pipeline"]


def test_a_guidance_step_that_is_a_method_of_the_model_is_read_from_its_body(tmp_path):
    p = _cfg_of(tmp_path, "sample")
    assert p["has_separate_cfg"] is False and p["confidence"] == "medium"
    assert any("DiT.forward_with_cfg" in e["why"] and "doubled" in e["why"] for e in p["evidence"])


def test_a_sampler_given_any_model_beside_a_guidance_wrapper_is_unknown(tmp_path):
    p = _cfg_of(tmp_path, "sample_wrapped")
    assert p["has_separate_cfg"] is None and p["confidence"] == "unknown"
    assert any("CFGDenoiser" in e["why"] for e in p["evidence"])


def test_a_block_list_built_by_an_installed_base_class_is_found_and_an_indexed_output_needs_a_patch(tmp_path):
    """The transformer subclasses transformers' Qwen2Model: its `layers` come from the base's constructor
    (read from the installed source, never imported). The call site reads `layer_outputs[0]`: the pattern is read
    from the stream `[0]` picks, and the indexed-output rule asks for a PatchFunctor (the wrapper hands back the
    stream itself), with the line; never a pattern that binds as is."""
    src = ROOT / "tests" / "fixtures" / "hflayers" / "model.py"
    out = run_cli("analyze", str(src), "--model-path", str(tmp_path), "--transformer-class", "Dit",
                  "--pipeline-class", "sample", "--pipeline-file", str(src), "--no-cache", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)["transformer"]
    layers = {b["attr"]: b for b in data["block_lists"]}["layers"]
    assert layers["block_class"] == "Qwen2DecoderLayer" and layers["block_file"].endswith("modeling_qwen2.py")
    assert layers["is_blocks"] is True and layers["forward_pattern"] == "Pattern_3"
    assert layers["roles"] == {"hidden_states": "hidden_states"}
    assert any(r.startswith("layers: the call site picks the stream") and "`h = layer_outputs[0]`" in r
               for r in data["patch_functor_reasons"]), data["patch_functor_reasons"]


def test_namespace_linears_einops_fused_qkv_and_a_plain_attention_function(tmp_path):
    """`operations.Linear` is a Linear by its name (the layer plan had been empty while heads were divided);
    the einops cut of `qkv` into K=3 parts is a fused QKV, so attention stays whole and no head count is
    divided; the attention is `optimized_attention(q, k, v, ...)`, a plain call cache-dit's context-parallel
    attention cannot reach, so CP is refused with the line instead of a hook plan that splits the sequence."""
    src = ROOT / "tests" / "fixtures" / "comfyops" / "model.py"
    out = run_cli("plan", str(src), "--model-path", str(tmp_path), "--transformer-class", "Model",
                  "--pipeline-class", "sample", "--pipeline-file", str(src), "--out", str(tmp_path / "plan"),
                  "--no-probe", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    blocks = plan["parallelism"]["tp"]["block_lists"][0]
    assert blocks["layer_plan"]["attn.qkv"] == "colwise(output=replicate)", blocks["layer_plan"]
    assert blocks["layer_plan"]["attn.proj"] == "rowwise(input=replicate)"
    assert not blocks["shard_div_attr"], blocks["shard_div_attr"]
    blocked = plan["parallelism"]["cp"]["blocked_by"]
    assert blocked and "optimized_attention" in blocked[0]["why"] and blocked[0]["line"] == 24


def test_a_sampler_that_holds_its_model_as_self_model_gets_an_adapter_that_reads_it_there(tmp_path):
    """A reference repository's sampler class keeps the model as `self.model` (no `transformer` attribute):
    the analysis reads that from its `__init__` (`self.model = model`, the parameter annotated `TinyDiT`) and
    the adapter, transformer-only as the sampler is no diffusers pipeline, takes the transformer from there or
    is given it. A subclass that inherits `__init__` is read through its base. A diffusers
    pipeline's `register_modules(transformer=...)` reads as `transformer`."""
    import subprocess
    import sys

    src = ROOT / "tests" / "fixtures" / "heldas" / "sampler.py"
    plan = tmp_path / "plan"
    (tmp_path / "m").mkdir()
    assert run_cli("plan", str(src), "--model-path", str(tmp_path / "m"), "--transformer-class", "TinyDiT",
                   "--pipeline-class", "Sampler", "--pipeline-file", str(src), "--out", str(plan),
                   "--no-probe").returncode == 0
    analysis = json.loads(run_cli("analyze", str(src), "--model-path", str(tmp_path / "m"), "--transformer-class",
                                  "TinyDiT", "--pipeline-class", "Sampler", "--pipeline-file", str(src),
                                  "--json").stdout)
    assert analysis["pipeline"]["transformer_attr"] == "model"
    assert analysis["pipeline"]["diffusers_pipeline"] is False  # Sampler's bases lead to no DiffusionPipeline
    assert analysis["pipeline"]["transformer_attr_at"]["line"] == 36  # `self.model = model`
    inherited = json.loads(run_cli("analyze", str(src), "--model-path", str(tmp_path / "m"), "--transformer-class",
                                   "TinyDiT", "--pipeline-class", "FastSampler", "--pipeline-file", str(src),
                                   "--json").stdout)["pipeline"]  # its __init__ is Sampler's
    assert inherited["transformer_attr"] == "model" and inherited["transformer_attr_at"]["line"] == 36
    # the reviewer reads that verdict in PLAN.md, with its reason and how to hand the adapter over
    said = [line for line in (plan / "PLAN.md").read_text().splitlines() if line.startswith("- Adapter:")]
    assert len(said) == 1 and "transformer-only" in said[0] and "ADAPTER(model)" in said[0] \
        and analysis["pipeline"]["diffusers_pipeline_at"]["why"] in said[0], said
    assert run_cli("approve", str(plan), "--reviewer", "x").returncode == 0
    assert run_cli("generate", str(plan), "--out", str(tmp_path / "out")).returncode == 0
    assert "pipe if isinstance(pipe, torch.nn.Module) else pipe.model" in \
        (tmp_path / "out" / "integrate_sampler" / "adapter.py").read_text()
    # Sampler is no diffusers pipeline: the adapter is transformer-only, registered under no name
    code = ("import sampler\n"
            "from cache_dit.caching.block_adapters.block_registers import BlockAdapterRegister\n"
            "from integrate_sampler import ADAPTER\n"
            "s = sampler.Sampler(sampler.TinyDiT())\n"
            "print(ADAPTER(s).transformer is s.model)\n"
            "alone = sampler.TinyDiT()\n"
            "print(ADAPTER(alone).transformer is alone and BlockAdapterRegister.get_adapter(alone) is None)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": f"{tmp_path / 'out'}:{src.parent}", "PATH": "/usr/bin:/bin"})
    said = [line for line in proc.stdout.splitlines() if line in ("True", "False")]  # cache-dit logs there too
    assert said == ["True", "True"], proc.stderr[-2000:]
    flux = tmp_path / "flux"
    flux.mkdir()
    (flux / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline", "_diffusers_version": "0.42.1",
                                                       "transformer": ["diffusers", "FluxTransformer2DModel"]}))
    pipe = json.loads(run_cli("analyze", str(flux), "--json").stdout)["pipeline"]
    assert pipe["transformer_attr"] == "transformer"
    assert pipe["diffusers_pipeline"] is True and "DiffusionPipeline" in pipe["diffusers_pipeline_at"]["why"]
    assert "registers the transformer as `transformer`" in pipe["transformer_attr_at"]["why"]


def test_a_text_stream_passed_third_is_reordered_and_the_cached_model_agrees(tmp_path):
    """`block(x, c, y)` returns `(x, y)`: the list is Pattern_0 with `y` as the encoder stream. cache-dit's wrapper
    passes a block its streams first, so the generated PatchFunctor calls `block(x, y, c=c)` and gives each block a
    forward that takes them first; run through cache-dit with the cache on, the first (computed) step matches the
    plain model, which it cannot when `c` is bound as the encoder stream."""
    import subprocess
    import sys

    src = ROOT / "tests" / "fixtures" / "thirdstream" / "model.py"
    flags = ["--model-path", str(tmp_path), "--transformer-class", "JointDiT", "--pipeline-class", "sample",
             "--pipeline-file", str(src)]
    blocks = json.loads(run_cli("analyze", str(src), *flags, "--json").stdout)["transformer"]["block_lists"][0]
    assert blocks["forward_pattern"] == "Pattern_0"
    assert blocks["roles"] == {"hidden_states": "x", "encoder_hidden_states": "y"}
    plan = tmp_path / "plan"
    assert run_cli("plan", str(src), *flags, "--out", str(plan), "--no-probe").returncode == 0
    assert run_cli("approve", str(plan), "--reviewer", "x").returncode == 0
    gen = run_cli("generate", str(plan), "--out", str(tmp_path / "out"), "--json")
    assert gen.returncode == 0, gen.stderr
    functor = (tmp_path / "out" / "integrate_sample" / "patch_functor.py").read_text()
    assert "x, y = block(x, y, c=c)" in functor and '_streams_first(block, ["x", "y"], ["c"])' in functor
    code = ("import torch, cache_dit, model\n"
            "from cache_dit import DBCacheConfig\n"
            "from cache_dit.caching.block_adapters import FakeDiffusionPipeline\n"
            "from integrate_sample.adapter import sample_adapter\n"
            "torch.manual_seed(0)\n"
            "dit = model.JointDiT().eval()\n"
            "x, t, y = torch.randn(1, 6, 8), torch.ones(1), torch.randn(1, 4, 12)\n"
            "with torch.no_grad():\n"
            "    plain = dit(x, t, y)\n"
            "    cache_dit.enable_cache(sample_adapter(FakeDiffusionPipeline(dit)),\n"
            "                           cache_config=DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0))\n"
            "    cached = dit(x, t, y)\n"
            "print('MAXDIFF', float((plain - cached).abs().max()))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
                          env={"PYTHONPATH": f"{tmp_path / 'out'}:{src.parent}", "PATH": "/usr/bin:/bin"})
    line = next((x for x in proc.stdout.splitlines() if x.startswith("MAXDIFF ")), None)
    assert line is not None, proc.stderr[-3000:]
    assert float(line.split()[1]) < 1e-5, line


def test_projections_handed_to_a_nested_function_are_the_attentions_inputs(tmp_path):
    """`def heads(proj): return proj(x)...` inside the attention's forward, called as the SDPA's arguments
    (`sdpa(heads(self.q), heads(self.k), heads(self.v))`): q/k/v feed the kernel and are sharded column-wise,
    `o` after it row-wise, so dividing `num_heads` matches what each rank computes (they were left whole while
    the head count was divided: a shape error at the reshape)."""
    src = ROOT / "tests" / "fixtures" / "nestedqkv" / "model.py"
    plan = tmp_path / "plan"
    assert run_cli("plan", str(src), "--model-path", str(tmp_path), "--transformer-class", "DiT", "--pipeline-class",
                   "sample", "--pipeline-file", str(src), "--out", str(plan), "--no-probe").returncode == 0
    data = json.loads((plan / "plan.json").read_text())
    attn = next(a for a in data["facts"]["attention"] if a["path"] == "attn")
    assert attn["in_projs"] == ["attn.q", "attn.k", "attn.v"] and attn["out_projs"] == ["attn.o"]
    tp = data["parallelism"]["tp"]["block_lists"][0]
    assert {k: tp["layer_plan"][k] for k in ("attn.q", "attn.k", "attn.v", "attn.o")} == {
        "attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.o": "rowwise"}
    assert tp["shard_div_attr"] == {"attn": ["num_heads"]}


def test_a_rope_table_looked_up_by_position_stays_whole_and_the_positions_are_cut_as_1d(tmp_path):
    """A reference model's RoPE table (`self.freqs_table`, [max_len, D/2]) is handed to every block and looked
    up there, `freqs[positions]`, inside the attention: it is no per-token input, so every rank keeps it whole
    (it had been split at each block as a [B, S, D] stream), while `positions`, `torch.arange(S)`, is cut on
    the one dim it has (it had been given a 3-D split, which cache-dit skips with a warning)."""
    src = ROOT / "tests" / "fixtures" / "ropetable" / "model.py"
    plan = tmp_path / "plan"
    out = run_cli("plan", str(src), "--model-path", str(tmp_path), "--transformer-class", "TableDiT",
                  "--pipeline-class", "sample", "--pipeline-file", str(src), "--out", str(plan), "--no-probe", "--json")
    assert out.returncode == 0, out.stderr
    cp = json.loads(out.stdout)["parallelism"]["cp"]
    per_block = cp["plan"]["blocks.*"]
    assert "freqs" not in per_block, per_block
    assert per_block["positions"] == {"split_dim": 0, "expected_dims": 1, "split_output": False}
    whole = [e for e in cp["evidence"] if e["why"].startswith("`freqs` stays whole")]
    assert whole and whole[0]["line"] == 27 and "freqs[positions]" in whole[0]["why"], cp["evidence"]


def test_a_slice_of_a_table_is_no_lookup(tmp_path):
    """`freqs[: x.shape[1]]` takes the first rows in token order: one row per token, which is cut with the
    tokens; only an index by a tensor (`freqs[positions]`) makes a table."""
    from integrate.analyzers.modules import module_tree
    from integrate.analyzers.sequence_walks import indexed_by_position

    from integrate.resolve import Workspace

    text = (ROOT / "tests" / "fixtures" / "ropetable" / "model.py").read_text()
    sliced = tmp_path / "sliced.py"
    sliced.write_text(text.replace("f = freqs[positions]", "f = freqs[: x.shape[1]]"))
    for path, expected in ((ROOT / "tests" / "fixtures" / "ropetable" / "model.py", True), (sliced, False)):
        ws = Workspace()
        src = ws.load(path)
        tree = module_tree(ws, src, src.classes["TableDiT"])
        assert (indexed_by_position(tree, "blocks.0", "freqs") is not None) == expected, path


def test_an_attention_the_block_calls_inline_has_its_projections_named_and_kept_whole(tmp_path):
    """A block with no attention module: `q`, `k`, `v` feed `F.scaled_dot_product_attention` and `o` reads its
    output, through reshapes. Each is an `inline_attention` projection, said with the kernel's line, and kept
    whole: the plan divides no head count of a block. `o` had been read as "applied to the block input"; the
    feed-forward beside it keeps its column/row pair."""
    src = ROOT / "tests" / "fixtures" / "inlineattn" / "model.py"
    out = run_cli("plan", str(src), "--model-path", str(tmp_path), "--transformer-class", "InlineDiT",
                  "--pipeline-class", "sample", "--pipeline-file", str(src), "--out", str(tmp_path / "plan"),
                  "--no-probe", "--json")
    assert out.returncode == 0, out.stderr
    tp = json.loads(out.stdout)["parallelism"]["tp"]["block_lists"][0]
    roles = {k: r["role"] for k, r in tp["reasons"].items()}
    assert roles == {"q": "inline_attention", "k": "inline_attention", "v": "inline_attention",
                     "o": "inline_attention", "fc1": "block_in", "fc2": "block_out"}, roles
    assert "output of `F.scaled_dot_product_attention` (line 25)" in tp["reasons"]["o"]["why"]
    assert all(tp["layer_plan"][p] == "colwise(output=replicate)" for p in "qkvo")
    assert (tp["layer_plan"]["fc1"], tp["layer_plan"]["fc2"]) == ("colwise", "rowwise")
    assert not tp["shard_div_attr"]


def test_a_plain_nn_module_gets_a_fixture_the_plain_model_runs_on(tmp_path):
    """A reference repository's model is a plain `nn.Module` with no `from_config`: verify builds it with its
    constructor and the config's fields, derives the fixture and runs the plain model on it."""
    src = ROOT / "tests" / "fixtures" / "ropetable" / "model.py"
    plan, out = tmp_path / "plan", tmp_path / "out"
    assert run_cli("plan", str(src), "--model-path", str(tmp_path), "--transformer-class", "TableDiT",
                   "--pipeline-class", "sample", "--pipeline-file", str(src), "--out", str(plan),
                   "--no-probe").returncode == 0
    assert run_cli("approve", str(plan), "--reviewer", "Ada").returncode == 0
    assert run_cli("generate", str(plan), "--out", str(out)).returncode in (0, 1)
    proc = run_cli("verify", str(plan), "--generated", str(out), "--fixture-only", "--trust-code", "--json")
    fx = json.loads(proc.stdout)["fixture"]
    assert proc.returncode == 0 and fx["status"] == "derived" and fx["parameters"] > 0, fx


def test_a_sampler_function_registers_the_adapter_under_the_transformer_and_tp_is_refused_for_a_plain_module(
        tmp_path):
    """A sampler that is a function is no diffusers pipeline: the adapter is transformer-only and registered
    under no name (it was registered under the function's name, where nothing looked it up; a short class name
    would lose to a built-in prefix); verify's cache proof hands it to cache-dit as the plugin exports it.
    cache-dit's TP asserts a diffusers ModelMixin (read from its source): a plain `nn.Module` gets no TP
    planner, with both lines as evidence, and verify says TP is skipped for that reason."""
    src = ROOT / "tests" / "fixtures" / "ropetable" / "model.py"
    plan, out = tmp_path / "plan", tmp_path / "out"
    assert run_cli("plan", str(src), "--model-path", str(tmp_path), "--transformer-class", "TableDiT",
                   "--pipeline-class", "sample", "--pipeline-file", str(src), "--out", str(plan),
                   "--no-probe").returncode == 0
    tp = json.loads((plan / "plan.json").read_text())["parallelism"]["tp"]
    (why,) = [e["why"] for e in tp["blocked_by"]]
    assert "torch.nn.Module" in why and "ModelMixin" in why and "dispatch.py:" in why, why
    assert "No TP planner is written" in (plan / "PLAN.md").read_text()
    assert run_cli("approve", str(plan), "--reviewer", "Ada").returncode == 0
    proc = run_cli("generate", str(plan), "--out", str(out), "--json")
    gen = json.loads(proc.stdout or "null") or proc.stderr
    assert gen["registered"] == {} and any("transformer-only" in n for n in gen["notes"]), gen
    assert not (out / "integrate_sample" / "tp_planner.py").exists()
    proc = run_cli("verify", str(plan), "--generated", str(out), "--trust-code", "--proof", "cache", "--proof", "tp",
                   "--json")
    report = json.loads(proc.stdout)
    assert report["cache"]["status"] == "pass", report["cache"]
    assert report["tp"]["status"] == "skipped" and "ModelMixin" in report["tp"]["why"], report["tp"]


def test_a_plain_module_under_a_sampler_class_is_proved_with_nothing_registered(tmp_path):
    """A reference repository's sampler class and plain `nn.Module` (tests/fixtures/heldas): no registry entry
    is made under their short names (cache-dit looks adapters and planners up by name prefix, so `TinyDiT` or
    `Flux` would answer for other models). The plugin exports the transformer-only adapter and the CP planner
    marked registered nowhere; verify hands both to cache-dit as the plugin says to, and cache and CP pass."""
    src = ROOT / "tests" / "fixtures" / "heldas" / "sampler.py"
    plan, out = tmp_path / "plan", tmp_path / "out"
    (tmp_path / "m").mkdir()
    assert run_cli("plan", str(src), "--model-path", str(tmp_path / "m"), "--transformer-class", "TinyDiT",
                   "--pipeline-class", "Sampler", "--pipeline-file", str(src), "--out", str(plan),
                   "--no-probe").returncode == 0
    assert json.loads((plan / "plan.json").read_text())["facts"]["model_mixin"] is False
    assert run_cli("approve", str(plan), "--reviewer", "Ada").returncode == 0
    gen = json.loads(run_cli("generate", str(plan), "--out", str(out), "--json").stdout)
    assert gen["registered"] == {}, gen["registered"]
    init = (out / "integrate_sampler" / "__init__.py").read_text()
    assert "ADAPTER = adapter.sampler_adapter" in init and "CP_PLANNER_REGISTERED = False" in init
    assert "Register.register" not in (out / "integrate_sampler" / "cp_planner.py").read_text()
    proc = run_cli("verify", str(plan), "--generated", str(out), "--trust-code", "--proof", "cache", "--proof", "cp",
                   "--json")
    report = json.loads(proc.stdout)
    assert report["cache"]["status"] == "pass" and report["cp"]["status"] == "pass", (report["cache"], report["cp"])
