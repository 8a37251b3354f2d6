"""Small readers, each with examples that must hold and examples that must stay unknown."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from integrate.analyzers.ndim import ndim_of
from integrate.analyzers.sequence import mask_kind
from integrate.analyzers.values import UNKNOWN, evaluate

from integrate.resolve import Workspace
from integrate.source import parse_source

ENV = {"heads": 24, "dim_head": 128, "out_dim": None, "mlp_ratio": 4.0, "dim": 3072, "act": "gelu"}


@pytest.mark.parametrize("expr,expected", [
    ("dim_head * heads", 3072),
    ("out_dim // dim_head if out_dim is not None else heads", 24),
    ("int(dim * mlp_ratio)", 12288),
    ("heads if act == 'gelu' else 0", 24),
    ("not (out_dim is None)", False),
    ("[heads, dim_head][1]", 128),
    ("max(heads, 8) // 2", 12),
])
def test_evaluates_constant_arithmetic(expr, expected):
    assert evaluate(cst.parse_expression(expr), ENV) == expected


@pytest.mark.parametrize("expr", [
    "unknown_name * 2",  # never guessed
    "torch.zeros(3)",  # not arithmetic
    "heads // 0",  # an error is unknown, not a crash
    "self.x + 1",  # attribute not bound
    "f(heads)",
])
def test_stays_unknown(expr):
    assert evaluate(cst.parse_expression(expr), ENV) is UNKNOWN


def _fn(code: str):
    src = parse_source(Path("/tmp/snippet.py"), code)
    return src, src.functions["f"]


@pytest.mark.parametrize("body,expected", [
    ("ids = torch.zeros(h, w, 3)\n    ids = ids.reshape(h * w, 3)\n    return ids", 2),
    ("ids = torch.cartesian_prod(a, b)\n    ids = ids.unsqueeze(0).expand(n, -1, -1)\n    return ids", 3),
    ("x = torch.cat([torch.ones(2, 3), y], dim=0)\n    return x", 2),
    ("x = torch.zeros(1, 2, 3)\n    if x.ndim == 3:\n        x = x[0]\n    return x", 2),
    ("x = torch.zeros(4, 5)[:, None, None, :]\n    return x", 4),
    ("xs = []\n    xs.append(torch.zeros(2, 2))\n    return torch.stack(xs)", 3),
    ("shape = (n, 4, h, w)\n    return torch.randn(shape)", 4),  # the tuple the one size names
    ("return torch.full((h, w), 0.5)", 2),
    ("return torch.zeros(8)", 1),
])
def test_ndim_follows_the_code(body, expected):
    src, fn = _fn(f"import torch\ndef f(h, w, a, b, n, y):\n    {body}\n")
    ret = fn.body.body[-1].body[0].value
    assert ndim_of(Workspace(), src, fn, ret) == expected


@pytest.mark.parametrize("body", [
    "return y",  # a parameter: its dims are not in the code
    "x = y.flatten(1)\n    return x",
    "x = some_helper(y)\n    return x",
    "return torch.randn(y)",  # one size that is a parameter: a shape tuple or a count (randn_tensor's `shape`)
    "return torch.full(y, 0.0)",
])
def test_ndim_unknown_when_the_code_does_not_say(body):
    src, fn = _fn(f"import torch\ndef f(y):\n    {body}\n")
    ret = fn.body.body[-1].body[0].value
    assert ndim_of(Workspace(), src, fn, ret) is None


@pytest.mark.parametrize("expr,kind", [
    ("mask[:, None, None, :]", "1-D key mask [B, 1, 1, S]"),
    ("mask.unsqueeze(1).unsqueeze(1)", "1-D key mask [B, 1, 1, S]"),
    ("mask.unsqueeze(1)", "1-D key mask [B, 1, S]"),
    ("mask.unsqueeze(1) * mask.unsqueeze(2)", "2-D mask [B, 1, S, S]"),
    ("torch.bmm(m.unsqueeze(2), m.unsqueeze(1))", "2-D mask [B, 1, S, S]"),
    ("m[:, :, None].float() @ m[:, None, :].float()", "2-D mask [B, 1, S, S]"),
    ("mask[:, None, None, :] * mask[:, None, :, None]", "2-D mask [B, 1, S, S]"),
])
def test_mask_layout(expr, kind):
    assert mask_kind(cst.parse_expression(expr)) == kind


def test_mask_layout_unknown_for_a_plain_value():
    assert mask_kind(cst.parse_expression("prompt_attention_mask.to(device)")) is None


SPREAD = '''
def call(self, latents, t, emb, mask, extra):
    model_kwargs = {"mask": mask, "data_info": {"hw": 1}, **extra}
    model_kwargs["pose"] = latents
    model_kwargs.update(face=latents)
    other = dict(ignored=1)
    return self.transformer(latents, t, emb, return_dict=False, **model_kwargs)
'''


def test_keywords_spread_from_a_dict_the_entry_builds_are_read():
    from integrate.analyzers.structure import spread_keys

    fn = parse_source(Path("spread.py"), SPREAD).module.body[0]
    assert spread_keys(fn, "model_kwargs") == ["mask", "data_info", "pose", "face"]
    assert spread_keys(fn, "other") == ["ignored"] and spread_keys(fn, "extra") == []  # a parameter: unknown


DOCUMENTED = '''
def forward(self, hidden_states, txt_ids, mask=None, scale=1.0):
    """Run it.

    Args:
        hidden_states (`torch.Tensor` of shape `(batch_size, image_seq_len, in_channels)`):
            The latent.
        txt_ids (`torch.Tensor` of shape `(text_seq_len, 4)`):
            Position ids.
        mask (`torch.Tensor`, *optional*):
            Without a shape: unknown.
        other (`torch.Tensor` of shape `(a, b)`): not a parameter.
    """
'''


def test_ranks_a_forward_docstring_documents_the_diffusers_way_are_read():
    from integrate.analyzers.forward import documented_ranks

    src = parse_source(Path("doc.py"), DOCUMENTED)
    ranks = documented_ranks(src, src.module.body[0])
    assert {k: v[0] for k, v in ranks.items()} == {"hidden_states": 3, "txt_ids": 2}
    assert ranks["txt_ids"][2] == "(text_seq_len, 4)" and ranks["txt_ids"][1] > ranks["hidden_states"][1]


def test_a_literal_argument_list_spread_into_a_call_is_read_and_any_other_spread_stays_opaque():
    import libcst as cst

    from integrate.analyzers.binding import CallArgs, spread_literals

    body = cst.parse_module("args = (x, c, y)\nagain = [x]\nagain = [y]\nout = block(*args, *again, k=1)\n")
    call = body.body[-1].body[0].value
    src = parse_source(Path("spread.py"), body.code)
    assert set(spread_literals(body)) == {"args"}  # `again` is assigned twice: not known
    got = CallArgs.of(src, call, scope=body)
    assert got.positional == ("x", "c", "y") and got.keywords == (("k", "1"),) and got.opaque


def test_a_one_dim_shape_with_a_trailing_comma_is_one_dim():
    from integrate.analyzers.forward import documented_ranks

    text = 'def forward(self, timestep, ids):\n    """\n    timestep (`torch.Tensor` of shape `(batch_size,)`):\n' \
           '    ids (`torch.Tensor` of shape `(S, f(a, b))`):\n    """\n'
    src = parse_source(Path("one.py"), text)
    assert {k: v[0] for k, v in documented_ranks(src, src.module.body[0]).items()} == {"timestep": 1, "ids": 2}


RST_DOCUMENTED = '''
def forward(self, hidden_states, timestep, encoder_hidden_states, frame_valid_mask=None, return_dict=True):
    """Run the model.

    Args:
        hidden_states: ``(B, C, T, H, W)`` latents.
        timestep: ``(B, 1, T)`` per-frame diffusion timesteps (one per frame).
        encoder_hidden_states (`torch.Tensor` of shape
            `(batch_size, text_seq_len, dim)`):
            The text, its shape on the entry's second line.
        frame_valid_mask: Optional per-frame validity mask, shaped
            ``(B, 1, T, 1, 1)`` or ``(B, T)``.
        return_dict: If ``True`` (default), returns an output object; otherwise ``(sample,)``.
    """
'''


def test_shapes_written_as_rest_literals_and_on_continuation_lines_are_read():
    """A Google-style entry `name: ``(B, 1, T)`` ...` gives its first literal where it is a shape (SanaWM's forward);
    an entry's continuation lines are part of it (a shape on the line after `name (`torch.Tensor` of shape`); a
    first literal that is not a shape (``True``) gives nothing, and a parenthesis in the prose is not an entry."""
    from integrate.analyzers.forward import documented_shapes

    src = parse_source(Path("rst.py"), RST_DOCUMENTED)
    got = {k: v[0] for k, v in documented_shapes(src, src.module.body[0]).items()}
    assert got == {"hidden_states": ("B", "C", "T", "H", "W"), "timestep": ("B", "1", "T"),
                   "encoder_hidden_states": ("batch_size", "text_seq_len", "dim"),
                   "frame_valid_mask": ("B", "1", "T", "1", "1")}, got
