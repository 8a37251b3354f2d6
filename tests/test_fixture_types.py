"""A fixture input keeps the type its parameter's default has (issue 36, item 11.5): a forward parameter whose
default is an enum member, a string, a bool or None is never made a tensor, a number or a list because of its
name (`timestep_mode` read as diffusion time, `mask_kind` as a mask, `use_mask_shape` as a latent grid).

Real runs: a tiny model whose forward refuses any other type, its denoising function passing each of them, planned,
generated and verified (`--fixture-only`: the plain tiny model must run on the fixture); and the description of a
fixture's inputs that `audit --fix` writes regression tests from, read back into Python."""

from __future__ import annotations

import enum
import http
import json
import textwrap

from conftest import run_cli

MODEL = '''
import enum

from torch import nn
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin


class Mode(enum.Enum):
    T2V = "t2v"
    I2V = "i2v"


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.context = nn.Linear(dim, dim)

    def forward(self, hidden_states, encoder_hidden_states, temb):
        hidden_states = hidden_states + self.proj(hidden_states) * temb[:, None]
        encoder_hidden_states = encoder_hidden_states + self.context(encoder_hidden_states)
        return hidden_states, encoder_hidden_states


class Model(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(self, in_channels: int = 16, dim: int = 32, text_dim: int = 24, num_layers: int = 2):
        super().__init__()
        self.x_embedder = nn.Linear(in_channels, dim)
        self.context_embedder = nn.Linear(text_dim, dim)
        self.time_embed = nn.Linear(1, dim)
        self.blocks = nn.ModuleList([Block(dim) for _ in range(num_layers)])
        self.proj_out = nn.Linear(dim, in_channels)

    def forward(self, hidden_states, timestep, encoder_hidden_states, timestep_mode: str = "linear",
                guidance_mode="cfg", mask_kind=Mode.T2V, use_mask_shape=True, seq_len_hint=None,
                return_dict=True):
        if not (timestep_mode == "linear" and guidance_mode == "cfg" and mask_kind is Mode.T2V
                and use_mask_shape is True and seq_len_hint is None):
            raise TypeError(f"coerced: {type(timestep_mode)}, {type(guidance_mode)}, {type(mask_kind)}, "
                            f"{type(use_mask_shape)}, {type(seq_len_hint)}")
        hidden_states = self.x_embedder(hidden_states)
        encoder_hidden_states = self.context_embedder(encoder_hidden_states)
        temb = self.time_embed(timestep[:, None].float())
        for block in self.blocks:
            hidden_states, encoder_hidden_states = block(hidden_states, encoder_hidden_states, temb)
        out = self.proj_out(hidden_states)
        return (out,) if not return_dict else {"sample": out}


def denoise(transformer, latents, prompt_embeds, timesteps):
    for t in timesteps:
        noise = transformer(hidden_states=latents, timestep=t.expand(latents.shape[0]),
                            encoder_hidden_states=prompt_embeds, timestep_mode="linear", guidance_mode="cfg",
                            mask_kind=Mode.T2V, use_mask_shape=True, seq_len_hint=None, return_dict=False)[0]
        latents = latents - 0.1 * noise
    return latents
'''
TYPED = ("timestep_mode", "guidance_mode", "mask_kind", "use_mask_shape", "seq_len_hint")


def test_an_enum_a_string_a_bool_or_none_default_keeps_its_type_and_the_plain_model_runs(tmp_path):
    model = tmp_path / "model.py"
    model.write_text(textwrap.dedent(MODEL))
    (tmp_path / "m").mkdir()
    plan_dir, out = tmp_path / "plan", tmp_path / "out"
    proc = run_cli("plan", str(model), "--model-path", str(tmp_path / "m"), "--transformer-class", "Model",
                   "--pipeline-class", "denoise", "--pipeline-file", str(model), "--out", str(plan_dir), "--no-probe")
    assert proc.returncode == 0, proc.stderr
    assert run_cli("approve", str(plan_dir), "--reviewer", "Ada").returncode == 0
    assert run_cli("generate", str(plan_dir), "--out", str(out)).returncode in (0, 1)
    proc = run_cli("verify", str(plan_dir), "--generated", str(out), "--fixture-only", "--trust-code", "--json")
    fx = json.loads(proc.stdout)["fixture"]
    assert fx["status"] == "derived", fx
    assert proc.returncode == 0, proc.stderr[-2000:]
    inputs = (out / "verify_fixture.py").read_text().partition("def inputs(step):")[2]
    for name in TYPED:  # left at the default: the forward gets the type it declared by it
        assert f'"{name}"' not in inputs, inputs


class Quality(enum.Enum):
    HIGH = "high"


def test_a_described_input_is_written_back_as_the_same_type(monkeypatch):
    """`audit --fix` writes a fixture's inputs from their description: an enum member (a plain one, an IntEnum, a
    StrEnum) comes back as that member, not as its value; a string, a bool and None as themselves."""
    import sys

    from integrate.templates.regression import cache_test
    from integrate.verify.describe import describe_value

    monkeypatch.setitem(sys.modules, __name__, sys.modules[__name__])  # the enum's module, importable by name
    values = {"quality": Quality.HIGH, "status": http.HTTPStatus.OK, "method": http.HTTPMethod.GET,
              "mode": "linear", "flag": True, "off": False, "hint": None}
    description = {"module": "diffusers", "cls": "FluxTransformer2DModel", "config": {}, "steps": 2,
                   "inputs": {name: describe_value([v, v]) for name, v in values.items()}}
    description = json.loads(json.dumps(description))  # as the describing worker hands it over
    _, text = cache_test(description, name="typed", lookup="Flux", key="Flux", where="x.py:1", finding="f",
                         threshold=0.1, slack=3.0, floor=0.02)
    namespace: dict = {}
    exec(compile(text, "test_typed_cache_regression.py", "exec"), namespace)  # noqa: S102 - the test we wrote
    written = namespace["_inputs"](0)
    for name, value in values.items():
        back = written[name]
        assert back is value or (type(back) is type(value) and back == value), (name, description["inputs"][name])
