"""Width tables a sub-module fills from its module's constants (verify/tables.py): the tiny config gives them small.

Real input: the installed diffusers 0.42.1 WanAnimate transformer, whose `motion_encoder_channel_sizes` is None by
default and whose motion encoder then takes 512-wide convolutions from a module-level dict. Hand-written modules
check what the rule must leave alone.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_wan_animate_motion_encoder_table_is_given_small_with_its_evidence():
    import torch
    from diffusers import WanAnimateTransformer3DModel as cls
    from diffusers.models.transformers import transformer_wan_animate as mod
    from integrate.verify.tables import defaulted_tables
    from integrate.verify.tiny import WIDE, object_defaults, tiny_config

    config = tiny_config(object_defaults(cls)).config
    found = defaulted_tables(cls, config)
    assert [t.key for t in found] == ["motion_encoder_channel_sizes"], found
    table = found[0].value
    real = mod.WAN_ANIMATE_MOTION_ENCODER_CHANNEL_SIZES
    assert list(table) == list(real)  # every resolution is still there
    assert all(v == min(real[k], WIDE) for k, v in table.items())
    why = found[0].why
    assert "WanAnimateMotionEncoder" in why and "WAN_ANIMATE_MOTION_ENCODER_CHANNEL_SIZES" in why, why
    assert why.count("transformer_wan_animate.py:") == 2, why  # the hand-over and the fill, each with its line
    with torch.device("meta"):
        full = cls.from_config(config)
        small = cls.from_config({**config, "motion_encoder_channel_sizes": table})
    assert _params(small.motion_encoder) * 50 < _params(full.motion_encoder)
    # given, the table is the config's: nothing to fill
    assert defaulted_tables(cls, {**config, "motion_encoder_channel_sizes": table}) == []


def _module(tmp_path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("table, expected", [
    ("{'a': 512, 'b': 16}", {"a": 32, "b": 16}),  # a dict of widths: capped, keys kept
    ("[256, 128, 8]", [32, 32, 8]),  # a list of widths
    ("{'a': 'gelu'}", None),  # not widths: left alone
    ("[16, 8]", None),  # already small: nothing to change
])
def test_a_hand_written_sub_module_table(tmp_path, table, expected):
    name = f"tables_{abs(hash(table))}"
    mod = _module(tmp_path, name, f"""
        import torch.nn as nn

        TABLE = {table}

        class Sub(nn.Module):
            def __init__(self, channels=None):
                super().__init__()
                if channels is None:
                    channels = TABLE
                self.channels = channels

        class Model(nn.Module):
            def __init__(self, sub_channels=None, other_dim=None):
                super().__init__()
                self.sub = Sub(channels=sub_channels)
                self.other_dim = other_dim
    """)
    from integrate.verify.tables import defaulted_tables

    found = defaulted_tables(mod.Model, {"sub_channels": None, "other_dim": None})
    if expected is None:
        assert found == []
    else:
        assert [(t.key, t.value) for t in found] == [("sub_channels", expected)]
        assert f"{name}.py:" in found[0].why


def test_a_table_the_sub_module_fills_from_an_expression_is_not_guessed(tmp_path):
    mod = _module(tmp_path, "tables_expr", """
        import torch.nn as nn

        class Sub(nn.Module):
            def __init__(self, channels=None):
                super().__init__()
                if channels is None:
                    channels = [512] * 4
                self.channels = channels

        class Model(nn.Module):
            def __init__(self, sub_channels=None):
                super().__init__()
                self.sub = Sub(channels=sub_channels)
    """)
    from integrate.verify.tables import defaulted_tables

    assert defaulted_tables(mod.Model, {"sub_channels": None}) == []
