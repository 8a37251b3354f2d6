"""Records are the data contract: what a stage builds in process is exactly what its JSON reads back as."""

import dataclasses

import pytest
from conftest import EXAMPLE, make_model_dir
from integrate.decisions.records import Plan

from integrate import api
from integrate.errors import InputError
from integrate.records import OMIT, RecordError, from_json, to_json


@pytest.mark.parametrize("pipeline,transformer", [
    ("FluxPipeline", "FluxTransformer2DModel"),
    ("QwenImagePipeline", "QwenImageTransformer2DModel"),
    ("SanaVideoPipeline", "SanaVideoTransformer3DModel"),
    ("HunyuanVideoPipeline", "HunyuanVideoTransformer3DModel"),
])
def test_a_plan_reads_back_from_its_json_as_the_same_record(tmp_path, pipeline, transformer):
    plan = api.plan(api.flags_for(str(make_model_dir(tmp_path, pipeline, transformer))), probe=False)
    again = from_json(Plan, to_json(plan))
    assert again == plan  # every field holds the record type its annotation names, not a look-alike dict
    assert to_json(again) == to_json(plan)


def test_the_shipped_example_round_trips_too():
    plan = api.plan(api.flags_for(str(EXAMPLE)), probe=False)
    assert from_json(Plan, to_json(plan)) == plan


def test_wrong_types_and_unknown_keys_name_the_path():
    plan = to_json(api.plan(api.flags_for(str(EXAMPLE)), probe=False))
    plan["parallelism"]["cp"]["plan"]["rope"]["0"]["split_dim"] = "one"
    with pytest.raises(RecordError, match=r"\$\.parallelism\.cp\.plan\['rope'\]"):
        from_json(Plan, plan)
    plan = to_json(api.plan(api.flags_for(str(EXAMPLE)), probe=False))
    plan["cache"]["surprise"] = 1
    with pytest.raises(RecordError, match="unknown key 'surprise'"):
        from_json(Plan, plan)
    del plan["cache"]["surprise"], plan["model"]
    with pytest.raises(InputError, match="missing key 'model'"):
        from_json(Plan, plan)


def test_an_optional_key_is_absent_not_null():
    plan = api.plan(api.flags_for(str(EXAMPLE)), probe=False)
    reorder = plan.parallelism.cp.mask_reorder
    assert reorder.needed and "mechanism" in to_json(reorder)
    quiet = dataclasses.replace(reorder, needed=False, mechanism=OMIT)
    assert "mechanism" not in to_json(quiet)
    assert from_json(type(reorder), to_json(quiet)).mechanism is OMIT
