"""A block list whose class an installed library defines (issue 36; measured on Vchitect/Latte, whose
`transformer_blocks` hold diffusers' `BasicTransformerBlock`, by bench/bench_thirdparty.py): the class is read from
the library's source and judged as the repository's own blocks are when it is a transformer block (it builds an
attention module and a feed-forward); a Linear, an attention module alone, a norm stay library modules, with the
reading as evidence; a class whose source cannot be read is unknown, never "not blocks". And a block parameter the
call gives a literal None carries no stream, so it takes no role (Latte's temporal blocks)."""

from __future__ import annotations

import textwrap

from conftest import analyse_source

HEAD = '''
import torch
from torch import nn
from diffusers.models.attention import BasicTransformerBlock
from diffusers.models.attention_processor import Attention
'''

MODEL = '''

class Model(nn.Module):
    def __init__(self, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([{element} for _ in range(depth)])

    def forward(self, hidden_states, encoder_hidden_states, timestep):
        for block in self.blocks:
            hidden_states = block({call})
        return hidden_states
'''


def _list(tmp_path, element: str, call: str = "hidden_states") -> dict:
    text = HEAD + textwrap.dedent(MODEL).format(element=element, call=call)
    (bl,) = analyse_source(tmp_path, text)["transformer"]["block_lists"]
    return bl


def _why(bl: dict) -> list[str]:
    return [e["why"] for e in bl["evidence"]]


def test_a_transformer_block_an_installed_library_defines_is_analysed_as_a_block(tmp_path):
    bl = _list(tmp_path, "BasicTransformerBlock(64, 2, 32, cross_attention_dim=64)",
               "hidden_states, None, encoder_hidden_states")
    assert bl["is_blocks"] is True and bl["block_class"] == "BasicTransformerBlock", bl
    assert bl["block_file"].endswith("diffusers/models/attention.py"), bl["block_file"]
    assert bl["forward_pattern"] and bl["roles"] == {"hidden_states": "hidden_states",
                                                     "encoder_hidden_states": "encoder_hidden_states"}, bl
    said = next(w for w in _why(bl) if "read from the installed library's source" in w)
    assert "diffusers.models.attention.BasicTransformerBlock" in said and "`attn1`" in said and "`ff`" in said
    assert said.endswith("a transformer block")


def test_torchs_own_transformer_layer_is_a_block_too(tmp_path):
    bl = _list(tmp_path, "nn.TransformerEncoderLayer(64, 2)")
    assert bl["is_blocks"] is True and bl["block_class"] == "nn.TransformerEncoderLayer", bl
    assert any("builds attention (`self_attn`) and a feed-forward (`linear1`, `linear2`)" in w for w in _why(bl))


def test_layers_of_a_library_stay_library_modules_with_what_was_read(tmp_path):
    for i, (element, qualname) in enumerate([("nn.Linear(64, 64)", "torch.nn.Linear"),
                                             ("nn.LayerNorm(64)", "torch.nn.LayerNorm"),
                                             ("Attention(64)", "diffusers.models.attention_processor.Attention")]):
        folder = tmp_path / str(i)
        folder.mkdir()
        bl = _list(folder, element)
        assert bl["is_blocks"] is False and "library modules" in bl["why"] and qualname in bl["why"], bl
        assert any(qualname in w and w.endswith("a layer, not a transformer block") for w in _why(bl)), _why(bl)


def test_a_library_class_whose_source_cannot_be_read_is_unknown(tmp_path):
    text = (HEAD + "from diffusers.models.attention import NoSuchBlock\n"
            + textwrap.dedent(MODEL).format(element="NoSuchBlock(64)", call="hidden_states"))
    (bl,) = analyse_source(tmp_path, text)["transformer"]["block_lists"]
    assert bl["is_blocks"] is None and bl["confidence"] == "unknown", bl
    assert "diffusers.models.attention.NoSuchBlock" in bl["why"] and "model.py:6" in bl["why"], bl
    assert "--block-class blocks=path/to/file.py:Class" in bl["why"]


def test_a_list_of_library_blocks_never_looped_is_not_read(tmp_path):
    text = HEAD + textwrap.dedent('''

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = nn.ModuleList([BasicTransformerBlock(64, 2, 32) for _ in range(2)])

            def forward(self, hidden_states):
                return self.blocks[0](hidden_states)
        ''')
    (bl,) = analyse_source(tmp_path, text)["transformer"]["block_lists"]
    assert bl["is_blocks"] is False, bl
    assert not any("read from the installed library's source" in w for w in _why(bl))


OWN_BLOCK = '''

class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, hidden_states, encoder_hidden_states=None, timestep=None):
        return hidden_states + self.proj(hidden_states)
'''


def test_a_parameter_the_call_gives_none_takes_no_role(tmp_path):
    """`block(hidden_states, None, timestep)`: `encoder_hidden_states` carries no stream, so it has no role; given
    the text, it is the encoder."""
    given_none = tmp_path / "none"
    given_text = tmp_path / "text"
    for folder in (given_none, given_text):
        folder.mkdir()
    bl = _list_own(given_none, "hidden_states, None, timestep")
    assert bl["forward_pattern"] == "Pattern_3" and bl["roles"] == {"hidden_states": "hidden_states"}, bl
    assert any("`encoder_hidden_states` is passed as None: it carries no stream" in n for n in bl["notes"]), bl
    bl = _list_own(given_text, "hidden_states, encoder_hidden_states, timestep")
    assert bl["roles"] == {"hidden_states": "hidden_states", "encoder_hidden_states": "encoder_hidden_states"}, bl


def _list_own(folder, call: str) -> dict:
    text = HEAD + textwrap.dedent(OWN_BLOCK) + textwrap.dedent(MODEL).format(element="Block(64)", call=call)
    (bl,) = analyse_source(folder, text)["transformer"]["block_lists"]
    return bl
