"""A block whose forward hands the work to another method of its class (`return self._forward(...)`, and
`checkpoint(self._forward, ...)` on a branch), as research repositories write it (issue 36; measured on
Tencent/HunyuanDiT by bench/bench_thirdparty.py): what it returns is what that method returns, its parameters bound
to the call's arguments by Python's rules, and the evidence says which method and where."""

from __future__ import annotations

import textwrap

from conftest import analyse_source

_LOOP = '''

class Model(nn.Module):
    def __init__(self, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([Block(8) for _ in range(depth)])

    def forward(self, x, c, text_states):
        for block in self.blocks:
            x = block(x, c, text_states)
        return x
'''

_HEAD = '''
from torch import nn
from torch.utils import checkpoint

'''


def _analyse(tmp_path, block: str, loop: str = _LOOP) -> dict:
    return analyse_source(tmp_path, _HEAD + textwrap.dedent(block) + textwrap.dedent(loop))


def _line(tmp_path, needle: str) -> int:
    """The line of the written model.py that holds `needle` (the first)."""
    lines = (tmp_path / "model.py").read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if needle in text)


def _list(data: dict) -> dict:
    (bl,) = data["transformer"]["block_lists"]
    return bl


def _why(bl: dict) -> list[str]:
    return [e["why"] for e in bl["evidence"]]


DELEGATES = '''
class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.gradient_checkpointing = False

    def _forward(self, x, c=None, text_states=None, skip=None):
        x = x + self.proj(c)
        x = x + self.proj(text_states)
        return x

    def forward(self, x, c=None, text_states=None, skip=None):
        if self.gradient_checkpointing and self.training:
            return checkpoint.checkpoint(self._forward, x, c, text_states, skip, use_reentrant=False)
        return self._forward(x, c, text_states, skip)
'''


def test_a_forward_that_returns_another_methods_result_returns_what_that_method_returns(tmp_path):
    bl = _list(_analyse(tmp_path, DELEGATES))
    assert bl["is_blocks"] is True and bl["forward_pattern"] == "Pattern_3", bl
    assert bl["roles"] == {"hidden_states": "x", "encoder_hidden_states": "text_states"}, bl
    assert bl["check_forward_pattern"] is False  # `x` is not named hidden_states
    returns = bl["forward"]["returns"]
    assert [r["roles"] for r in returns] == [["x"], ["x"]] and bl["forward"]["return_roles"] == ["x"], returns
    # both returns are _forward's `return x`, one through the checkpoint wrapper
    assert {r["line"] for r in returns} == {_line(tmp_path, "return x")}, returns
    why = _why(bl)
    defined = _line(tmp_path, "def _forward")
    assert any("returns what `self._forward(...)` returns" in w and f"defined at line {defined}" in w
               and "`x` is `x`" in w for w in why), why
    assert any("`_forward` returns, run by `checkpoint.checkpoint(self._forward, ...)`" in w for w in why), why


SWAPPED = '''
class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def _run(self, e, h):
        h = h + self.proj(e)
        e = e + self.proj(h)
        return h, e

    def forward(self, hidden_states, encoder_hidden_states):
        return self._run(encoder_hidden_states, hidden_states)
'''

SWAPPED_LOOP = '''

class Model(nn.Module):
    def __init__(self, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([Block(8) for _ in range(depth)])

    def forward(self, hidden_states, encoder_hidden_states):
        for block in self.blocks:
            hidden_states, encoder_hidden_states = block(hidden_states, encoder_hidden_states)
        return hidden_states
'''


def test_the_methods_parameters_are_bound_to_the_calls_arguments(tmp_path):
    """`_run(e, h)` is given (encoder, hidden): its `return h, e` is (hidden, encoder) in forward's terms."""
    bl = _list(_analyse(tmp_path, SWAPPED, SWAPPED_LOOP))
    assert bl["forward"]["return_roles"] == ["hidden_states", "encoder_hidden_states"], bl["forward"]
    assert bl["forward_pattern"] == "Pattern_0" and bl["check_forward_pattern"] is True, bl
    assert any("its `h` is `hidden_states`, its `e` is `encoder_hidden_states`" in w for w in _why(bl)), _why(bl)


GUARDED = '''
class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def _run(self, h, enc=None):
        h = h + self.proj(h)
        if enc is None:
            return h
        return h, enc + self.proj(enc)

    def forward(self, hidden_states, encoder_hidden_states=None):
        return self._run(hidden_states, encoder_hidden_states)
'''


HIDDEN_LOOP = '''

class Model(nn.Module):
    def __init__(self, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([Block(8) for _ in range(depth)])

    def forward(self, hidden_states):
        for block in self.blocks:
            hidden_states = block(hidden_states)
        return hidden_states
'''


def test_the_methods_guards_are_read_in_the_callers_terms(tmp_path):
    """`if enc is None: return h` is `encoder_hidden_states is None` at the call, which leaves the encoder at its
    default None: only `return h` can run, so the block returns the hidden stream alone."""
    bl = _list(_analyse(tmp_path, GUARDED, HIDDEN_LOOP))
    guards = [r["guards"] for r in bl["forward"]["returns"]]
    assert guards == [["encoder_hidden_states is None"], ["not (encoder_hidden_states is None)"]], guards
    assert bl["forward_pattern"] == "Pattern_3" and bl["roles"]["hidden_states"] == "hidden_states", bl
    assert any("1 of 2 return statements cannot run" in n for n in bl["notes"]), bl["notes"]


CYCLE = '''
class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def _again(self, x, c=None, text_states=None):
        return self.forward(x, c, text_states)

    def forward(self, x, c=None, text_states=None):
        return self._again(x, c, text_states)
'''


def test_methods_that_hand_the_work_to_each_other_stay_unknown(tmp_path):
    bl = _list(_analyse(tmp_path, CYCLE))
    assert bl["forward_pattern"] is None and bl["confidence"] == "unknown", bl
    assert bl["forward"]["return_roles"] is None


UNBOUND = '''
class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def _forward(self, x):
        return x

    def forward(self, x, c=None, text_states=None):
        return self._forward(x, c)
'''


def test_a_call_that_does_not_bind_to_the_method_is_unknown_with_why(tmp_path):
    bl = _list(_analyse(tmp_path, UNBOUND))
    assert bl["forward_pattern"] is None and bl["forward"]["return_roles"] is None, bl
    assert any("does not bind to _forward" in w and "positional" in w for w in _why(bl)), _why(bl)


IN_PLACE = '''
class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def _forward(self, h, c=None, t=None):
        h += self.proj(c)
        return h

    def forward(self, x, c=None, text_states=None):
        return self._forward(x, c, text_states)
'''


def test_an_in_place_write_in_the_method_it_hands_its_input_to_is_pitfall_c(tmp_path):
    data = _analyse(tmp_path, IN_PLACE)
    reasons = data["transformer"]["patch_functor_reasons"]
    assert any(r.startswith("blocks: pitfall C") for r in reasons), reasons
    bl = _list(data)
    handed = _line(tmp_path, "return self._forward(x, c, text_states)")
    assert any(f"writes into input `x` in place (in `_forward`, handed it at line {handed})" in w
               for w in _why(bl)), _why(bl)


NAMED = '''
class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, {params}):
        return x + self.proj(x)
'''

NAMED_LOOP = '''

class Model(nn.Module):
    def __init__(self, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([Block(8) for _ in range(depth)])

    def forward(self, x, a, b):
        for block in self.blocks:
            x = block(x, a, b)
        return x
'''


def test_a_text_stream_named_in_two_parts_is_the_encoder(tmp_path):
    """`text_states` (a text word and a stream word) takes the encoder role; `text_mask` is not a stream; a name
    of the lexicon itself (`context`) comes first."""
    def roles(params: str, folder: str) -> dict:
        (tmp_path / folder).mkdir()
        return _list(_analyse(tmp_path / folder, NAMED.format(params=params), NAMED_LOOP))["roles"]

    assert roles("text_mask=None, text_states=None", "a") == {"hidden_states": "x",
                                                               "encoder_hidden_states": "text_states"}
    assert roles("text_mask=None, img_states=None", "b") == {"hidden_states": "x"}
    assert roles("text_states=None, context=None", "c") == {"hidden_states": "x", "encoder_hidden_states": "context"}
