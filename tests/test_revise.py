"""`integrate revise`: a reviewer changes a decision without hand-editing plan.json; every change is checked
against the plan's types, recorded beside what the analysis said, rendered into PLAN.md, and voids the
approval. Real runs of the CLI on the shipped MotifVideo example."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLE, run_cli


@pytest.fixture
def planned(tmp_path):
    plan_dir = tmp_path / "plan"
    assert run_cli("plan", str(EXAMPLE), "--out", str(plan_dir), "--no-probe").returncode == 0
    assert run_cli("approve", str(plan_dir), "--reviewer", "Ada").returncode == 0
    return plan_dir


def _revise(plan_dir, *sets: str, why: str = "the loop batches CFG: line 912", reviewer: str = "Grace Hopper"):
    args = [a for s in sets for a in ("--set", s)]
    return run_cli("revise", str(plan_dir), *args, "--why", why, "--reviewer", reviewer, "--json")


def _refused(proc, needle: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_an_override_is_recorded_rendered_and_voids_the_approval(planned):
    before = json.loads((planned / "plan.json").read_text())
    analysed = before["cache"]["has_separate_cfg"]
    proc = _revise(planned, f"cache.has_separate_cfg={json.dumps(not analysed)}", "facts.attention.0.head_dim.1=64")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["revision"]
    assert report["changed"] and report["approval_voided"]
    plan = json.loads((planned / "plan.json").read_text())
    assert plan["schema_version"] == "1.21" and plan["cache"]["has_separate_cfg"] is (not analysed)
    assert plan["facts"]["attention"][0]["head_dim"][1] == 64
    override = {o["key"]: o for o in plan["overrides"]}["cache.has_separate_cfg"]
    assert override["analysis"] is analysed and override["value"] is (not analysed)
    assert override["by"] == "Grace Hopper" and override["why"].startswith("the loop batches CFG")
    md = (planned / "PLAN.md").read_text()
    assert "## Reviewer overrides" in md and "`cache.has_separate_cfg`" in md and "Grace Hopper" in md
    assert not (planned / "APPROVAL.json").exists()
    assert run_cli("approve", str(planned), "--check").returncode == 2


def test_the_revised_plan_is_what_generate_writes(planned, tmp_path):
    """A reviewer's CFG style reaches the adapter, labelled as theirs; overriding a ForwardPattern is a
    decision, not a change in the model's source, so generate's source check lets it through."""
    analysed = json.loads((planned / "plan.json").read_text())["cache"]["has_separate_cfg"]
    assert _revise(planned, f"cache.has_separate_cfg={json.dumps(not analysed)}",
                   "cache.block_lists.0.forward_pattern=Pattern_1").returncode == 0
    assert run_cli("approve", str(planned), "--reviewer", "Ada").returncode == 0
    out = tmp_path / "out"
    proc = run_cli("generate", str(planned), "--out", str(out))
    assert proc.returncode in (0, 1), proc.stderr
    adapter = (out / "integrate_motif_video" / "adapter.py").read_text()
    assert f"has_separate_cfg={not analysed}" in adapter and "the reviewer's override" in adapter
    assert "ForwardPattern.Pattern_1" in adapter


def test_setting_the_analysis_value_back_drops_the_override(planned):
    analysed = json.loads((planned / "plan.json").read_text())["cache"]["has_separate_cfg"]
    assert _revise(planned, f"cache.has_separate_cfg={json.dumps(not analysed)}").returncode == 0
    assert _revise(planned, f"cache.has_separate_cfg={json.dumps(analysed)}").returncode == 0
    plan = json.loads((planned / "plan.json").read_text())
    assert plan["overrides"] == [] and "Reviewer overrides" not in (planned / "PLAN.md").read_text()


@pytest.mark.parametrize(("assignment", "needle"), [
    ("cache.nope=1", "no field `nope`"),
    ("cache.has_separate_cfg=\"maybe\"", "expected bool"),
    ("facts.attention.99.head_dim=1", "is not an index of this list"),
    ("model.model_path=/elsewhere", "is not a decision a reviewer revises"),
    ("cache.has_separate_cfg", "expected KEY=VALUE"),
])
def test_a_key_or_value_the_plan_does_not_have_is_refused_and_nothing_is_written(planned, assignment, needle):
    files = {p.name: p.read_bytes() for p in planned.iterdir()}
    _refused(_revise(planned, assignment), needle)
    assert {p.name: p.read_bytes() for p in planned.iterdir()} == files


def test_an_override_needs_a_reason_and_a_name(planned):
    _refused(_revise(planned, "cache.has_separate_cfg=false", why="  "), "--why must not be empty")
    _refused(_revise(planned, "cache.has_separate_cfg=false", reviewer="a\x1bb"), "--reviewer must be one line")


def test_a_reviewers_words_cannot_break_out_of_plan_md(planned):
    """The reason is the reviewer's text: rendered as plain Markdown text, a value inside a code span that no
    backtick in it can close."""
    proc = _revise(planned, "cache.notes=[\"`x` **y**\"]", why="see [this](http://example.com) <b>now</b>")
    assert proc.returncode == 0, proc.stderr
    md = (planned / "PLAN.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("- `cache.notes`"))
    assert "\\[this\\]\\(http://example\\.com\\)" in line and "\\<b\\>" in line and "<b>" not in line
    assert '``["`x` **y**"]``' in line


def test_approving_a_hand_edited_plan_json_is_refused_and_points_at_revise(planned):
    path = planned / "plan.json"
    plan = json.loads(path.read_text())
    plan["cache"]["notes"] = ["edited by hand"]
    path.write_text(json.dumps(plan, indent=2) + "\n")
    _refused(run_cli("approve", str(planned), "--reviewer", "Ada"), "integrate revise")


def test_an_entry_is_unset_by_a_bracketed_key_and_recorded_as_removed(planned):
    """A CP hook key holds dots (`transformer_blocks.0`): it is written as a bracketed JSON string."""
    plan = json.loads((planned / "plan.json").read_text())
    hook = next(k for k in plan["parallelism"]["cp"]["plan"] if "." in k)
    param = next(iter(plan["parallelism"]["cp"]["plan"][hook]))
    key = f'parallelism.cp.plan[{json.dumps(hook)}].{param}'
    proc = run_cli("revise", str(planned), "--unset", key, "--why", "kept whole", "--reviewer", "Ada", "--json")
    assert proc.returncode == 0, proc.stderr
    revised = json.loads((planned / "plan.json").read_text())
    assert param not in revised["parallelism"]["cp"]["plan"][hook]
    (override,) = revised["overrides"]
    assert override["key"] == key and override["removed"] and override["value"] is None
    _refused(run_cli("revise", str(planned), "--unset", "cache.has_separate_cfg", "--why", "x", "--reviewer", "Ada"),
             "only an entry of a mapping")


def test_every_alternative_is_a_revision_that_fits_the_plan(tmp_path):
    """Alternatives are the revisions a reviewer (or repair) would make: on models outside the suite's examples
    each one, applied, is a plan of the right types, and differs from the plan as made."""
    from conftest import make_model_dir
    from integrate.decisions.alternatives import applied
    from integrate.decisions.revise import revise

    from integrate import api

    seen = set()
    plans = {}
    for pipeline, transformer in [("FluxPipeline", "FluxTransformer2DModel"),
                                  ("AceStepPipeline", "AceStepTransformer1DModel"),
                                  ("WanAnimatePipeline", "WanAnimateTransformer3DModel")]:
        model = make_model_dir(tmp_path / transformer, pipeline, transformer)
        plan = plans[transformer] = api.plan(api.flags_for(str(model)), probe=False)
        assert plan.alternatives, transformer
        for alt in plan.alternatives:
            assert alt.confidence != "high" and (alt.sets or alt.unsets)
            revised = revise(plan, applied(alt), "try it", "repair")
            assert revised != plan and len(revised.overrides) == len(alt.sets) + len(alt.unsets)
            seen.add(alt.decision)
    # Flux's root split has the first-block split beside it; AceStep's cross-attention text may stay whole;
    # WanAnimate's face encoder tokens may stay whole (its face adapter runs without CP)
    assert "CP split point" in seen and any(s.startswith("CP split of `encoder_hidden_states`") for s in seen), seen
    assert "CP split of `face_encoder`'s output" in seen, seen
    # repair tries first what bears on the first divergent module
    from integrate.repair import candidates

    wan = plans["WanAnimateTransformer3DModel"]
    first = wan.alternatives[candidates(list(wan.alternatives), "cp", "motion_encoder.conv.0")[0]]
    assert first.touches == ("motion_encoder",)
    assert candidates(list(wan.alternatives), "tp", "blocks.0.attn1.to_q") == [i for i, a in enumerate(wan.alternatives)
                                                             if a.decision.startswith("TP")]


def test_repair_reports_a_failing_proof_it_has_no_alternative_for_and_never_approves(planned, tmp_path):
    """A reviewer's wrong ForwardPattern makes the cache proof fail; MotifVideo's lists are read with high
    confidence, so no alternative is listed for them: repair says the proof failed, that nothing was left to
    try, exits 1, writes no proposal, and leaves the plan's approval as it was."""
    wrong = next(p for p in ("Pattern_1", "Pattern_0")
                 if p != json.loads((planned / "plan.json").read_text())["cache"]["block_lists"][0]["forward_pattern"])
    assert _revise(planned, f"cache.block_lists.0.forward_pattern={json.dumps(wrong)}").returncode == 0
    assert run_cli("approve", str(planned), "--reviewer", "Ada").returncode == 0
    out = tmp_path / "out"
    assert run_cli("generate", str(planned), "--out", str(out)).returncode in (0, 1)
    approval = (planned / "APPROVAL.json").read_bytes()
    proc = run_cli("repair", str(planned), "--generated", str(out), "--proof", "cache", "--json")
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)["repair"]
    assert "cache" in report["failing"] and report["proposal"] is None and report["files"] == []
    assert not (planned / "repair").exists() and (planned / "APPROVAL.json").read_bytes() == approval


def test_repair_refuses_an_unapproved_plan(planned, tmp_path):
    assert _revise(planned, "cache.notes=[\"unapproved now\"]").returncode == 0
    _refused(run_cli("repair", str(planned), "--generated", str(tmp_path)), "is not approved")


def test_a_key_has_one_spelling_and_free_form_data_takes_any_key(planned):
    """`cache.has_separate_cfg` and `cache["has_separate_cfg"]` are one override; inside the config (free-form
    data) a nested key is reached like any other."""
    analysed = json.loads((planned / "plan.json").read_text())["cache"]["has_separate_cfg"]
    assert _revise(planned, f"cache.has_separate_cfg={json.dumps(not analysed)}").returncode == 0
    assert _revise(planned, f'cache["has_separate_cfg"]={json.dumps(not analysed)}').returncode == 0
    assert _revise(planned, "facts.config.num_layers=3").returncode == 0
    plan = json.loads((planned / "plan.json").read_text())
    assert [o["key"] for o in plan["overrides"]] == ["cache.has_separate_cfg", "facts.config.num_layers"]
    assert plan["facts"]["config"]["num_layers"] == 3


def test_a_repair_trial_reads_the_kept_baseline_and_runs_only_the_variants_named(tmp_path):
    """`integrate repair` verifies once, keeping the plain model's run, then runs each candidate's failing variants
    only: a trial costs the variants that failed instead of the baseline plus every variant again. The kept run
    is read back, not redone (its files stay as the first verify wrote them)."""
    from integrate import api
    from integrate.records import to_json

    model = tmp_path / "m" / "transformer"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"_class_name": "Flux3Transformer2DModel",
                                                    "_diffusers_version": "0.42.1"}))
    plan_dir, out, kept = tmp_path / "plan", tmp_path / "out", tmp_path / "baseline"
    api.write_plan(api.plan(api.flags_for(str(tmp_path / "m"), no_pipeline=True, separate_cfg="no"), probe=False),
                   plan_dir)
    api.approve(plan_dir, "test")
    api.generate(plan_dir, out=out)
    first = to_json(api.verify(plan_dir, out, proofs=("cp",), baseline=kept))["cp"]
    assert {"ulysses2", "ulysses2+cache"} <= set(first["variants"]) and (kept / "rank0.npz").is_file()
    stamp = (kept / "rank0.npz").stat().st_mtime_ns
    again = to_json(api.verify(plan_dir, out, proofs=("cp",), baseline=kept, variants=("ulysses2",)))["cp"]
    assert set(again["variants"]) == {"ulysses2"} and again["status"] == "pass", again
    assert (kept / "rank0.npz").stat().st_mtime_ns == stamp
    # the rest of a proof once a trial passed its failing variant; fail-fast runs the rest when the first passes
    rest = to_json(api.verify(plan_dir, out, proofs=("cp",), baseline=kept, skip=("ulysses2",)))["cp"]
    assert set(rest["variants"]) == set(first["variants"]) - {"ulysses2"}, rest
    fast = to_json(api.verify(plan_dir, out, proofs=("cp",), baseline=kept, fail_fast=True))["cp"]
    assert set(fast["variants"]) == set(first["variants"]) and fast["status"] == "pass", fast


def test_repair_reads_candidates_from_the_run_and_builds_on_one_that_answers_its_evidence(tmp_path):
    """QwenImage21 (installed diffusers, its pipeline's fixture): the plan splits its RoPE table as a [B, S, D]
    stream, but the table is [S, D]; cache-dit skips the split ("expected 3 dimensions, got 2") and the CP proof
    fails in the first block. Repair reads that warning and the shapes the run recorded: it offers the table
    split at dim 0 of 2 (where it is as long as the cut sequence; not dim 1), finds the skip gone with it (a
    step), and from that run offers the per-token `target_token_mask` the block still holds whole, on top of the
    step. (The proof still fails after: its attention slices block-causal segments of the local sequence, which
    is why the plan itself refuses CP there, `blocked_by` citing `query[:, start:end]`; the refusal is lifted here
    to drive repair through a failing proof.)"""
    import dataclasses

    from integrate import api
    from integrate.records import to_json
    from integrate.repair import repair

    model = tmp_path / "m"
    model.mkdir()
    (model / "model_index.json").write_text(json.dumps({
        "_class_name": "QwenImage21Pipeline", "_diffusers_version": "0.42.1",
        "transformer": ["diffusers", "QwenImage21Transformer2DModel"]}))
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    plan = api.plan(api.flags_for(str(model)), probe=False)
    cp = plan.parallelism.cp
    assert any("query[:, start:end]" in e.why for e in cp.blocked_by), cp.blocked_by
    plan = dataclasses.replace(plan, parallelism=dataclasses.replace(
        plan.parallelism, cp=dataclasses.replace(cp, blocked_by=())))
    api.write_plan(plan, plan_dir)
    api.approve(plan_dir, "test")
    api.generate(plan_dir, out=out)
    report = to_json(repair(plan_dir, out, proofs=("cp",), max_candidates=4))
    observed = {(a["decision"], a["instead"]) for a in report["observed"]}
    table = ("CP split of `rotary_emb` at `transformer_blocks.*`", "dim 0 of 2 (the rank the run met)")
    assert table in observed and (table[0], "dim 1 of 2 (the rank the run met)") not in observed, observed
    first = report["trials"][0]
    assert (first["decision"], first["instead"]) == table and first["on"] == [], report["trials"]
    on_step = [t for t in report["trials"] if t["on"] == [first["alternative"]]]
    assert any(t["decision"] == "CP split of `target_token_mask` at `transformer_blocks.*`" for t in on_step), \
        report["trials"]
    assert report["proposal"] is None and not (plan_dir / "repair").exists()


def _framewise(tmp_path):
    """The plan for tests/fixtures/framewise (a diffusers model of our own whose side adapter regroups the
    sequence by frame, as WanAnimate's face adapter does)."""
    from conftest import ROOT

    from integrate import api

    src = ROOT / "tests" / "fixtures" / "framewise" / "model.py"
    (tmp_path / "m").mkdir(exist_ok=True)
    flags = api.flags_for(None, model_path=str(tmp_path / "m"), transformer_class="FramewiseModel",
                          transformer_file=str(src), pipeline_class="sample", pipeline_file=str(src))
    return api.plan(flags, probe=False)


def test_repair_runs_a_module_that_regroups_the_sequence_by_frame_whole(tmp_path):
    """The adapter groups the tokens it is handed into the frames of a stream every rank holds: on a rank's share
    of the sequence its groups are not frames, and the CP proof diverges inside it. No split is right there; the
    run's shapes (its `hidden_states` and `frame_states` cut, its output as long as the cut sequence) lead repair
    to run it whole, which passes. The proposal says what that costs and is not approved. (The fixture runs
    because its 5-D latent's rank is read from `batch, channels, frames, height, width = hidden_states.shape`;
    CP is planned because the processors passed by position are read.) The plan runs it whole from the start
    now (its processor unflattens the sequence by the frames of `frame_states`, read statically); that entry is
    taken out here, to drive repair from a plan without it."""
    import dataclasses

    from integrate import api
    from integrate.records import to_json
    from integrate.repair import repair

    plan = _framewise(tmp_path)
    cp = plan.parallelism.cp
    assert "adapters.*" in cp.run_whole and "unflatten" in cp.run_whole["adapters.*"].why, cp.run_whole
    plan = dataclasses.replace(plan, parallelism=dataclasses.replace(
        plan.parallelism, cp=dataclasses.replace(cp, run_whole={})))
    processors = {(a.block_list, a.processor) for a in plan.facts.attention}
    assert processors == {("blocks", "SelfAttnProcessor")}, processors
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    api.write_plan(plan, plan_dir)
    api.approve(plan_dir, "test")
    approval = (plan_dir / "APPROVAL.json").read_bytes()
    api.generate(plan_dir, out=out)
    report = to_json(repair(plan_dir, out, proofs=("cp",), trust_code=True))
    assert report["failing"] == {"cp": "adapters.0.attn.to_out"}, report["failing"]
    (trial,) = report["trials"]
    assert (trial["decision"], trial["status"], trial["on"]) == ("CP of `adapters.*`", "pass", []), trial
    proposal = report["proposal"]
    whole = proposal["sets"]['parallelism.cp.run_whole["adapters.*"]']
    assert whole["gather"] == {"hidden_states": {"gather_dim": 1, "expected_dims": 3},
                               "frame_states": {"gather_dim": 1, "expected_dims": 4}}, whole
    assert whole["split"] == {"0": {"split_dim": 1, "expected_dims": 3, "split_output": True}}, whole
    assert len(proposal["costs"]) == 1 and "work repeats on every rank" in proposal["costs"][0]
    # the first verify stopped at the first variant that failed; the trial ran that one, then every other one
    failing = to_json(api.verify(plan_dir, out, proofs=("cp",), trust_code=True, fail_fast=True))["cp"]
    assert failing["status"] == "fail" and list(failing["variants"]) == ["ulysses2"], failing["variants"]
    assert "Run whole, outside CP" in (plan_dir / "repair" / "PLAN.md.diff").read_text()
    assert (plan_dir / "APPROVAL.json").read_bytes() == approval  # never approved by repair


def test_a_module_is_offered_whole_only_where_the_run_met_it_cut_and_never_a_block(tmp_path):
    """`observed_whole` reads the shapes a failing run recorded: what a rank held cut is gathered, an input it
    held whole is not; the output is cut again along the axis the rank's own output was shorter on, or, where
    the rank's call raised, the axis of the input shaped like it. A block (the cached lists') or a module the
    plan already hooks is never run whole, nor one with nothing cut, nor one whose output axis is ambiguous."""
    from integrate.decisions.alternatives import observed_whole

    plan = _framewise(tmp_path)
    cut = {"hidden_states": ((1, 32, 32), (1, 16, 32)), "frame_states": ((1, 2, 1, 32), (1, 2, 1, 32))}
    returned = {"adapters.0": (((1, 32, 32), (1, 16, 32)),)}
    (alt,) = observed_whole(plan, {"adapters.0": cut}, returned)
    (key, value), = alt.sets.items()
    assert key == 'parallelism.cp.run_whole["adapters.*"]' and alt.touches == ("adapters.*",)
    assert value["gather"] == {"hidden_states": {"gather_dim": 1, "expected_dims": 3}}
    assert value["split"] == {"0": {"split_dim": 1, "expected_dims": 3, "split_output": True}}
    raised = {"adapters.0": (((1, 32, 32), None),)}  # the rank's call raised: the axis of the like-shaped input
    assert observed_whole(plan, {"adapters.0": cut}, raised)[0].sets == alt.sets
    assert observed_whole(plan, {"blocks.1": cut}, {"blocks.1": returned["adapters.0"]}) == ()  # a block
    assert observed_whole(plan, {"blocks.0.attn": cut}, {"blocks.0.attn": returned["adapters.0"]})  # inside one
    whole = {"hidden_states": ((1, 32, 32), (1, 32, 32))}
    assert observed_whole(plan, {"adapters.0": whole}, returned) == ()  # nothing cut: nothing to gather
    ambiguous = {"adapters.0": (((2, 32, 32), None),)}  # 32 long on two axes and shaped like no input
    assert observed_whole(plan, {"adapters.0": cut}, ambiguous) == ()


def test_a_run_whole_path_that_is_not_a_module_path_is_refused_at_generate(planned, tmp_path):
    """A reviewer's `run_whole` key reaches the generated planner only as a module path (identifiers, list
    indices, `*`); anything else is refused with one line and exit 2, nothing written."""
    value = {"gather": {"hidden_states": {"gather_dim": 1, "expected_dims": 3}},
             "split": {"0": {"split_dim": 1, "expected_dims": 3, "split_output": True}}, "why": "test"}
    assert _revise(planned, f'parallelism.cp.run_whole["blocks.*.attn; import os"]={json.dumps(value)}'
                   ).returncode == 0
    assert run_cli("approve", str(planned), "--reviewer", "Ada").returncode == 0
    out = tmp_path / "out"
    _refused(run_cli("generate", str(planned), "--out", str(out)), "is not a Python identifier")
    assert not out.exists()


def _leaves(node, parts=()):
    """(parts, value) for every value plan.json shows: each key of a record or mapping, each list item."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*parts, k), v
            yield from _leaves(v, (*parts, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*parts, str(i)), v
            yield from _leaves(v, (*parts, str(i)))


def test_every_key_plan_json_shows_is_revisable_or_refused_as_not_a_decision(planned):
    """Each key as plan.json spells it (a field whose JSON name is a Python keyword, `class`, included) is a key
    `revise` takes: set to the value it holds, the plan is unchanged; the keys that say what the plan is for and
    what made it are refused as not a reviewer's decision, with one line and exit 2."""
    from integrate.decisions.approval import load_plan
    from integrate.decisions.revise import FIXED, join_key, revise

    from integrate.errors import InputError

    plan = load_plan(planned)
    data = json.loads((planned / "plan.json").read_text())
    seen: dict[tuple, tuple] = {}
    for parts, value in _leaves(data):  # one key of each shape: list indices and mapping keys alike
        shape = tuple("*" if p.isdigit() else p for p in parts[:3]) + (parts[-1] if len(parts) > 3 else "",)
        seen.setdefault(shape, (parts, value))
    assert any(parts[-1] == "class" for parts, _ in seen.values())  # already_supported.matches.0.class
    for parts, value in seen.values():
        key = join_key(parts)
        if parts[0] in FIXED:
            with pytest.raises(InputError, match="not a decision a reviewer revises"):
                revise(plan, [(key, value)], "same value", "Ada")
        else:
            assert revise(plan, [(key, value)], "same value", "Ada") == plan, key


def _generated(planned, tmp_path, *sets: str, unsets: tuple[str, ...] = ()) -> tuple[dict, object]:
    """Revise, approve and generate: the revised plan.json and generate's run."""
    args = [a for s in sets for a in ("--set", s)] + [a for u in unsets for a in ("--unset", u)]
    proc = run_cli("revise", str(planned), *args, "--why", "reviewed", "--reviewer", "Ada", "--json")
    assert proc.returncode == 0, proc.stderr
    assert run_cli("approve", str(planned), "--reviewer", "Ada").returncode == 0
    out = tmp_path / "out"
    gen = run_cli("generate", str(planned), "--out", str(out), "--json")
    assert gen.returncode in (0, 1) and json.loads(gen.stdout)["files"], gen.stderr  # 1: parts left to hand work
    return json.loads((planned / "plan.json").read_text()), out


TP = "parallelism.tp.block_lists.0"


@pytest.mark.parametrize("case", [
    "a record's value", "a mapping's value", "a new mapping entry", "a mapping entry unset", "its reason unset",
    "a record in a mapping", "a list item", "a whole list", "free-form data", "a keyword-named field",
])
def test_each_kind_of_key_is_revised_through_to_generate(planned, tmp_path, case):
    """One key of each kind plan.json has, revised with the value shape docs/schema.md gives it: revise, approve and
    generate all go through, and the generated code carries the revision. A layer plan entry the reviewer adds has
    no reason from the analysis (`reasons` is the analysis's): PLAN.md says it is the reviewer's."""
    plan = json.loads((planned / "plan.json").read_text())
    hook = next(k for k in plan["parallelism"]["cp"]["plan"] if k.endswith(".0"))
    sets, unsets = {
        "a record's value": ([f"cache.has_separate_cfg={json.dumps(not plan['cache']['has_separate_cfg'])}"], ()),
        "a mapping's value": ([f'{TP}.layer_plan["attn.to_q"]="colwise(output=replicate)"'], ()),
        "a new mapping entry": ([f'{TP}.layer_plan["proj_new"]="colwise"'], ()),
        "a mapping entry unset": ([], (f'{TP}.layer_plan["ff.net.2"]',)),
        "its reason unset": ([], (f'{TP}.reasons["attn.to_q"]',)),
        "a record in a mapping": ([f'parallelism.cp.plan[{json.dumps(hook)}].hidden_states='
                                   '{"split_dim": 1, "expected_dims": null, "split_output": false}'], ()),
        "a list item": (["facts.attention.0.head_dim.1=64"], ()),
        "a whole list": (['cache.notes=["run with Fn_compute_blocks=1"]'], ()),
        "free-form data": (["facts.config.num_layers=3"], ()),
        "a keyword-named field": ([f"text_encoders.0.class={json.dumps('T5EncoderModel')}"], ()),
    }[case]
    revised, out = _generated(planned, tmp_path, *sets, unsets=unsets)
    from integrate.decisions.revise import join_key, split_key

    keys = [s.partition("=")[0] for s in sets] + list(unsets)
    assert [o["key"] for o in revised["overrides"]] == [join_key(split_key(k)) for k in keys]
    md = (planned / "PLAN.md").read_text()
    planner = (out / "integrate_motif_video" / "tp_planner.py").read_text()
    if case == "a mapping's value":
        assert '"attn.to_q": "colwise(output=replicate)"' in planner.replace("'", '"'), planner
    if case == "a new mapping entry":
        assert '"proj_new": "colwise"' in planner.replace("'", '"'), planner
        assert "| `proj_new` | colwise | set by the reviewer" in md, md
    if case == "a mapping entry unset":
        assert '"ff.net.2"' not in planner.replace("'", '"')
    if case == "its reason unset":
        assert "| `attn.to_q` | colwise | set by the reviewer" in md
    if case == "a keyword-named field":
        assert revised["text_encoders"][0]["class"] == "T5EncoderModel" and "`T5EncoderModel`" in md
    if case == "a record in a mapping":
        assert revised["parallelism"]["cp"]["plan"][hook]["hidden_states"]["expected_dims"] is None


@pytest.mark.parametrize(("assignment", "needle"), [
    (f'{TP}.layer_plan["attn.to_q"]="bogus"', "'bogus' is not one of 'colwise'"),
    ("cache.block_lists.0.forward_pattern=Pattern_9", "'Pattern_9' is not one of 'Pattern_0'"),
])
def test_a_value_outside_its_documented_shape_is_refused_before_generate_writes_it(planned, assignment, needle):
    """A style the TP planner has no ParallelStyle for, a ForwardPattern cache-dit does not define: refused by
    revise (exit 2, nothing written), not written into code that fails when it runs."""
    before = (planned / "plan.json").read_bytes()
    _refused(_revise(planned, assignment), needle)
    assert (planned / "plan.json").read_bytes() == before
