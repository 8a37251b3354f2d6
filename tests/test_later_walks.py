"""Block lists kept per kind in a ModuleDict built by a comprehension, walked one after another: the lists are
found under the keys the comprehension iterates (a name bound in `__init__` to literals, `list(d.keys())`),
each entry is planned at its own module path, a later walk on streams of its own is split at the root with
the first one when only per-token ops lie between, and a position module also called on inputs the root
splits gets no output hook. Rule tests on a model of our own (tests/fixtures/modewalks) and on the installed
diffusers 0.42.1 Flux3 (whose CP proof this makes pass: before, its image stream was never split)."""

from __future__ import annotations

import json

import libcst as cst
from conftest import ROOT, run_cli
from integrate.analyzers.values import UNKNOWN, comprehension_items, evaluate

from integrate import api

SRC = ROOT / "tests" / "fixtures" / "modewalks" / "model.py"


def _expr(code: str):
    return cst.parse_expression(code)


def test_the_evaluator_reads_dict_literals_their_views_and_a_comprehension_s_keys():
    env = {"in_channels": 8}
    assert evaluate(_expr('list({"image": in_channels, "ref": unknown}.keys())'), env) == ["image", "ref"]
    assert evaluate(_expr('{"image": in_channels}["image"]'), env) == 8
    assert evaluate(_expr('{"ref": unknown}["ref"]'), env) is UNKNOWN  # a value may stay unknown, never guessed
    assert evaluate(_expr("{name: 1}"), env) is UNKNOWN  # a key that is not known makes the dict unknown
    comp = _expr('{k: v * 2 for k, v in {"a": 1, "b": in_channels}.items()}')
    assert [(key, bound["v"]) for key, bound in comprehension_items(comp, env)] == [("a", 1), ("b", 8)]
    assert comprehension_items(_expr("{k: 1 for k in kinds}"), env) is None  # `kinds` not known: None
    assert comprehension_items(_expr('{k: 1 for k in ["a"] if k}'), env) is None  # a filter: not evaluated


def _plan(tmp_path, source: str):
    path = tmp_path / "model.py"
    path.write_text(source)
    (tmp_path / "m").mkdir(exist_ok=True)
    out = run_cli("plan", str(path), "--model-path", str(tmp_path / "m"), "--transformer-class", "KindsModel",
                  "--no-pipeline", "--separate-cfg", "no", "--out", str(tmp_path / "plan"), "--no-probe", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_later_walk_on_its_own_stream_is_split_at_the_root_and_an_optional_one_at_its_first_block(tmp_path):
    data = _plan(tmp_path, SRC.read_text())
    cp = data["parallelism"]["cp"]
    why = [e["why"] for e in cp["evidence"]]
    # the text walk comes first; the image walk's stream and positions are cut at the root with it
    assert set(cp["plan"][""]) == {"encoder_hidden_states", "txt_ids", "hidden_states", "img_ids"}
    assert any(w.startswith("the walk over `kind_blocks.image`") and "split those inputs at the root" in w
               for w in why), why
    # the reference walk runs only when the caller passes its tokens: a root hook would raise without them
    assert cp["plan"]["kind_blocks.ref.0"] == {"hidden_states": {"split_dim": 1, "expected_dims": 3,
                                                                 "split_output": False}}
    assert any("`ref_hidden_states`" in w and "default None" in w for w in why), why
    # `pos_embed` also builds the text's and the image's positions from ids the root splits: no output hook
    assert "pos_embed" not in cp["plan"]
    # ... so the reference walk's positions are cut at its blocks, in the module's layout (a pair, positions first)
    assert [e["split_dim"] for e in cp["plan"]["kind_blocks.ref.*"]["rope"]] == [0, 0]
    assert any("whose output hook would also cut its calls on inputs the root already splits" in w for w in why)
    assert not cp["blocked_by"] and "proj_out" in cp["plan"]
    lists = {b["attr"]: b for b in data["parallelism"]["tp"]["block_lists"]}
    assert {"kind_blocks.image", "kind_blocks.ref", "text_blocks"} <= set(lists)  # each entry gets its TP plan


def test_a_later_walk_behind_an_op_that_mixes_tokens_keeps_its_split_at_its_first_block(tmp_path):
    source = SRC.read_text().replace(
        'hidden_states = self.embedders["image"](hidden_states)',
        'hidden_states = self.mixer(self.embedders["image"](hidden_states).transpose(1, 2)).transpose(1, 2)').replace(
        "        self.text_embedder = nn.Linear(text_dim, dim)",
        "        self.text_embedder = nn.Linear(text_dim, dim)\n        self.mixer = nn.Conv1d(dim, dim, 3, padding=1)")
    cp = _plan(tmp_path, source)["parallelism"]["cp"]
    assert "hidden_states" not in cp["plan"][""] and "img_ids" not in cp["plan"][""]
    assert "hidden_states" in cp["plan"]["kind_blocks.image.0"]


def test_a_comprehension_over_keys_not_known_statically_is_an_unknown_list(tmp_path):
    source = SRC.read_text().replace("for name in kinds}", "for name in self.kinds_from_config()}")
    data = _plan(tmp_path, source)
    unknowns = " ".join(data["unknowns"])
    assert "kind_blocks: a ModuleDict of ModuleLists built by a comprehension whose keys are not known" in unknowns
    assert "kind_blocks" not in {b["attr"] for b in data["cache"]["block_lists"]}


def test_flux3_mode_lists_are_planned_per_entry_and_its_cp_proof_passes(tmp_path):
    """Flux3 keeps its image-mode blocks in `mode_blocks = nn.ModuleDict({name: nn.ModuleList(...) for name in
    modes})`. Unread, the plan gathered after the text blocks and split the image stream at the joint blocks
    (error at transformer_flux3.py:275). Read: 5-block entries stay out of the cache (shorter than
    Fn_compute_blocks) with no PatchFunctor, the image stream and ids are split at the root, and Ulysses 2
    agrees with the 1-process run."""
    from integrate.records import to_json

    model = tmp_path / "m" / "transformer"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"_class_name": "Flux3Transformer2DModel",
                                                    "_diffusers_version": "0.42.1"}))
    plan = api.plan(api.flags_for(str(tmp_path / "m"), no_pipeline=True, separate_cfg="no"), probe=False)
    assert {u.attr for u in plan.cache.uncached} == {"mode_blocks", "txt_mode_blocks"}
    assert not plan.cache.needs_patch_functor
    root = plan.parallelism.cp.plan[""]
    assert {"hidden_states", "img_ids", "encoder_hidden_states", "txt_ids"} <= set(root)
    assert "pos_embed" not in plan.parallelism.cp.plan
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    api.write_plan(plan, plan_dir)
    api.approve(plan_dir, "test")
    api.generate(plan_dir, out=out)
    report = to_json(api.verify(plan_dir, out, proofs=("cp",)))["cp"]
    assert report["variants"]["ulysses2"]["status"] == "pass", report
