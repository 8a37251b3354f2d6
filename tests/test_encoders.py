"""Text encoder / VAE facts, checked against the installed cache-dit and transformers sources.

Expected answers come from the installed files themselves, read here with the stdlib `ast`
(an independent reading, not the analyzer's libcst one), so a change in either package shows
up as a real difference rather than a stale constant.
"""

import ast
import json
from pathlib import Path

import pytest

from analyzers.encoders import text_encoder_facts, vae_facts
from integrate.resolve import Workspace

ROOT = Path(__file__).resolve().parent.parent
TE_REGISTER = "TextEncoderTensorParallelismPlannerRegister"
VAE_REGISTER = "AutoEncoderDataParallelismPlannerRegister"


@pytest.fixture(scope="module")
def ws():
    return Workspace()


def package_dir(ws, top: str) -> Path:
    root = ws.package_root(top)
    if root is None:
        pytest.skip(f"{top} is not installed")
    return root / top


def line_at(evidence_file: str, line: int) -> str:
    return Path(evidence_file).read_text(encoding="utf-8").splitlines()[line - 1]


def ast_registrations(folder: Path, register: str) -> list[str]:
    """Names registered with `@<register>.register("...")` on classes, read with ast."""
    names = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for deco in getattr(node, "decorator_list", []) if isinstance(node, ast.ClassDef) else []:
                if (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute) and deco.func.attr == "register"
                        and isinstance(deco.func.value, ast.Name) and deco.func.value.id == register):
                    names.append(deco.args[0].value)
    return names


def one(facts, component="text_encoder"):
    return next(f for f in facts if f.component == component)


def test_model_index_none(ws):
    assert text_encoder_facts(ws, None, None) == ()
    assert vae_facts(ws, None, None) is None


def test_null_entries_skipped(ws):
    index = {"text_encoder": [None, None], "text_encoder_2": ["transformers", "T5EncoderModel"],
             "tokenizer": ["transformers", "T5TokenizerFast"], "vae": [None, None]}
    assert [f.component for f in text_encoder_facts(ws, None, index)] == ["text_encoder_2"]
    assert vae_facts(ws, None, index) is None
    assert vae_facts(ws, None, {"text_encoder": ["transformers", "T5EncoderModel"]}) is None


def test_malformed_entry_reported_not_guessed(ws):
    (fact,) = text_encoder_facts(ws, None, {"text_encoder": ["transformers", None]})
    assert fact.cls is None and fact.supported is None and fact.tp_plan == {}
    assert "not [library, class]" in fact.notes[0]


def test_t5_encoder_supported(ws):
    folder = package_dir(ws, "cache_dit") / "distributed" / "text_encoders"
    (fact,) = text_encoder_facts(ws, None, {"text_encoder": ["transformers", "T5EncoderModel"]})
    assert fact.supported is True and fact.library == "transformers"
    file, line = fact.supported_by.rsplit(":", 1)
    assert Path(file).parent == folder
    assert f'{TE_REGISTER}.register("T5EncoderModel")' in line_at(file, int(line))
    assert fact.tp_plan == {} and fact.tp_plan_source is None  # read (a registration may not fit), and T5 has none


def test_te_prefix_rule_vae_exact_rule(ws):
    """TE-P matches a registered prefix (cache-dit's `startswith`); VAE-P only the exact name."""
    index = {"text_encoder": ["transformers", "T5EncoderModel"], "text_encoder_2": ["transformers", "T5EncoderModelX"]}
    exact, longer = text_encoder_facts(ws, None, index)
    assert longer.supported is True and longer.supported_by == exact.supported_by
    vae = vae_facts(ws, None, {"vae": ["diffusers", "AutoencoderKLWanVariant"]})
    assert vae.supported is False and vae.supported_by is None


def test_t5gemma2_encoder_plan_from_text_sub_config(ws):
    transformers_dir = package_dir(ws, "transformers")
    index = json.loads((ROOT / "examples" / "motif-video" / "model_index.json").read_text())
    (fact,) = text_encoder_facts(ws, None, index)
    assert (fact.component, fact.cls) == ("text_encoder", "T5Gemma2Encoder")
    registered = ast_registrations(package_dir(ws, "cache_dit") / "distributed" / "text_encoders", TE_REGISTER)
    assert not any("T5Gemma2Encoder".startswith(n) for n in registered)
    assert fact.supported is False
    assert fact.supported_by is None

    # the class really is defined where the evidence says
    defined = fact.evidence[0]
    assert line_at(defined.file, defined.line).startswith("class T5Gemma2Encoder(")

    # the plan is the dict literal at tp_plan_source in a transformers configuration file
    src = fact.tp_plan_source
    assert Path(src.file).is_relative_to(transformers_dir) and Path(src.file).name.startswith("configuration_")
    assert "base_model_tp_plan" in line_at(src.file, src.line)
    tree = ast.parse(Path(src.file).read_text(encoding="utf-8"))
    assign = next(n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.lineno == src.line)
    assert fact.tp_plan == ast.literal_eval(assign.value)
    assert {"colwise", "rowwise"} <= set(fact.tp_plan.values())

    # it came from a sub-config, and the note says which and where the keys apply
    assert any("sub-config `text_config`" in n and "`text_model.`" in n for n in fact.notes)


@pytest.mark.parametrize("model_type", ["t5gemma2", "t5gemma2_encoder", "clip"])
def test_config_json_model_type_is_a_hint_only(ws, tmp_path, model_type):
    (tmp_path / "text_encoder").mkdir()
    (tmp_path / "text_encoder" / "config.json").write_text(json.dumps({"model_type": model_type}))
    index = {"text_encoder": ["transformers", "T5Gemma2Encoder"]}
    (with_dir,) = text_encoder_facts(ws, tmp_path, index)
    (without,) = text_encoder_facts(ws, None, index)
    assert with_dir.tp_plan == without.tp_plan != {}
    assert with_dir.tp_plan_source == without.tp_plan_source


def test_clip_text_model(ws):
    clip_config = package_dir(ws, "transformers") / "models" / "clip" / "configuration_clip.py"
    registered = ast_registrations(package_dir(ws, "cache_dit") / "distributed" / "text_encoders", TE_REGISTER)
    (fact,) = text_encoder_facts(ws, None, {"text_encoder": ["transformers", "CLIPTextModel"]})
    assert fact.supported is any("CLIPTextModel".startswith(n) for n in registered)
    if fact.supported:
        return
    has_plan = any(isinstance(n, ast.ClassDef) and n.name == "CLIPTextConfig"
                   and any(isinstance(s, ast.Assign) and getattr(s.targets[0], "id", "") == "base_model_tp_plan"
                           for s in n.body)
                   for n in ast.walk(ast.parse(clip_config.read_text(encoding="utf-8"))))
    assert bool(fact.tp_plan) is has_plan
    if not has_plan:
        assert fact.tp_plan_source is None
        assert any("no base_model_tp_plan found on CLIPTextConfig" in n for n in fact.notes)
        assert any(line_at(e.file, e.line).strip() == "config: CLIPTextConfig" for e in fact.evidence)


def test_unknown_text_encoder_and_other_library(ws):
    index = {"text_encoder": ["transformers", "NoSuchTextModel"], "text_encoder_2": ["diffusers", "NoSuchModel"]}
    facts = text_encoder_facts(ws, None, index)
    missing, other = one(facts), one(facts, "text_encoder_2")
    assert missing.supported is False and missing.tp_plan == {} and missing.tp_plan_source is None
    assert any("no transformers modeling file defines NoSuchTextModel" in n for n in missing.notes)
    assert other.supported is False and other.tp_plan == {} and other.evidence == ()


def test_vae_wan_supported(ws):
    folder = package_dir(ws, "cache_dit") / "distributed" / "autoencoders"
    index = json.loads((ROOT / "examples" / "motif-video" / "model_index.json").read_text())
    vae = vae_facts(ws, None, index)
    assert (vae.component, vae.cls, vae.library, vae.supported) == ("vae", "AutoencoderKLWan", "diffusers", True)
    file, line = vae.supported_by.rsplit(":", 1)
    assert Path(file).parent == folder
    assert f'{VAE_REGISTER}.register("AutoencoderKLWan")' in line_at(file, int(line))
    assert "AutoencoderKLWan" in ast_registrations(folder, VAE_REGISTER)


def test_vae_unknown(ws):
    vae = vae_facts(ws, None, {"vae": ["diffusers", "AutoencoderKLMadeUp"]})
    assert vae.supported is False and vae.supported_by is None and vae.evidence == ()
    assert vae.notes


def test_cache_dit_missing_is_unknown():
    class NoCacheDit(Workspace):
        def package_root(self, top):
            return None if top == "cache_dit" else super().package_root(top)

    ws = NoCacheDit()
    index = {"text_encoder": ["transformers", "T5EncoderModel"], "vae": ["diffusers", "AutoencoderKLWan"]}
    (te,) = text_encoder_facts(ws, None, index)
    assert te.supported is None and te.supported_by is None
    assert te.evidence[0].why == "transformers defines T5EncoderModel"  # the plan is still looked up
    vae = vae_facts(ws, None, index)
    assert vae.supported is None and "not installed" in vae.notes[0]


def test_all_evidence_points_at_real_lines(ws):
    index = {"text_encoder": ["transformers", "T5Gemma2Encoder"], "text_encoder_2": ["transformers", "T5EncoderModel"],
             "text_encoder_3": ["transformers", "CLIPTextModel"], "vae": ["diffusers", "AutoencoderKLWan"]}
    facts = [*text_encoder_facts(ws, None, index), vae_facts(ws, None, index)]
    evidence = [e for f in facts for e in f.evidence] + [f.tp_plan_source for f in facts[:3] if f.tp_plan_source]
    assert evidence
    for e in evidence:
        assert e.line > 0 and line_at(e.file, e.line).strip() and e.why


def test_an_hf_plan_that_shards_no_layer_gives_no_generated_te_planner(ws):
    """Qwen3-VL's text config declares only `embed_tokens: embedding_rowwise`: a planner written from it would shard
    nothing (verify --proof tep said `vacuous`), so the plan asks for one by hand and no TE-P proof or GPU row
    follows."""
    from decisions.encoders import decide_tep, has_tep_planner, shards_layers

    facts = text_encoder_facts(ws, None, {"text_encoder": ["transformers", "Qwen3VLModel"]})
    (te,) = facts
    if te.supported is not False or not te.tp_plan:
        pytest.skip("the installed packages register Qwen3VLModel or declare no plan for it")
    cfg = ast.parse(Path(te.tp_plan_source.file).read_text(encoding="utf-8"))
    declared = next(ast.literal_eval(n.value) for n in ast.walk(cfg) if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", None) == "base_model_tp_plan" for t in n.targets)
                    and n.lineno == te.tp_plan_source.line)
    assert te.tp_plan == declared and not shards_layers(declared)
    (decided,) = decide_tep(type("F", (), {"text_encoders": facts})())
    assert "by hand" in decided.action and "shards no layer" in decided.action and not has_tep_planner(decided)


def _declared_plan(te) -> dict:
    """The `base_model_tp_plan` dict literal at the fact's tp_plan_source, read with ast."""
    cfg = ast.parse(Path(te.tp_plan_source.file).read_text(encoding="utf-8"))
    return next(ast.literal_eval(n.value) for n in ast.walk(cfg) if isinstance(n, (ast.Assign, ast.AnnAssign))
                and n.lineno == te.tp_plan_source.line)


def test_a_registration_that_answers_only_by_prefix_gets_ours_from_the_hf_plan(ws):
    """cache-dit registers `T5GemmaEncoder`, a class of its own, and answers `T5GemmaEncoderModel` with it because the
    name starts with it; that planner asserts the other class. The plan writes ours from the HF layer plan (the
    composite config's encoder sub-config) and registers it ahead."""
    from decisions.encoders import decide_tep, has_tep_planner

    registered = ast_registrations(package_dir(ws, "cache_dit") / "distributed" / "text_encoders", TE_REGISTER)
    facts = text_encoder_facts(ws, None, {"text_encoder": ["transformers", "T5GemmaEncoderModel"]})
    (te,) = facts
    answering = next((n for n in registered if "T5GemmaEncoderModel".startswith(n)), None)
    if answering is None or answering == "T5GemmaEncoderModel":
        pytest.skip("the installed cache-dit registers no shorter name answering T5GemmaEncoderModel")
    assert te.supported is True and te.registered_as == answering
    assert te.tp_plan == _declared_plan(te) and te.tp_plan
    assert te.module == "transformers.models.t5gemma.modeling_t5gemma"
    (decided,) = decide_tep(type("F", (), {"text_encoders": facts})())
    assert decided.planner == "generate" and has_tep_planner(decided)
    assert f"'{answering}'" in decided.action and "only by prefix" in decided.action


def test_an_exact_registration_is_reused_and_the_hf_plan_is_still_read(ws):
    """Mistral3ForConditionalGeneration: cache-dit registers this very name (reused); its HF layer plan sits on the
    text sub-config, which the composite names as `AutoConfig` of model type "mistral": followed to MistralConfig."""
    from decisions.encoders import decide_tep

    facts = text_encoder_facts(ws, None, {"text_encoder": ["transformers", "Mistral3ForConditionalGeneration"]})
    (te,) = facts
    if te.registered_as != "Mistral3ForConditionalGeneration":
        pytest.skip("the installed cache-dit does not register Mistral3ForConditionalGeneration")
    assert Path(te.tp_plan_source.file).parent.name == "mistral"  # MistralConfig, through the model type
    assert te.tp_plan == _declared_plan(te)
    assert any("sub-config `text_config` (MistralConfig)" in n for n in te.notes)
    # the sub-config's plan applies to the model built from it, not to a head sized from one of its fields
    assert not any("lm_head" in n for n in te.notes), te.notes
    (decided,) = decide_tep(type("F", (), {"text_encoders": facts})())
    assert decided.planner == "reuse"
