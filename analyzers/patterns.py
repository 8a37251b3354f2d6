"""ForwardPattern 0-5 for one block list, from the call site and the block's forward.

| pattern | block takes encoder stream | returns |
|---|---|---|
| 0 | yes | (hidden, encoder) |
| 1 | yes | (encoder, hidden) |
| 2 | yes | hidden |
| 3 | no  | hidden |
| 4 | no  | (hidden, encoder) |
| 5 | no  | (encoder, hidden) |

The streams are the loop-carried variables (assigned from the block's output and passed
back in). With two streams, the "encoder" slot is the second one whatever its name (LTX2's
audio stream travels there). Roles are named, not guessed: canonical diffusers names, then a
small lexicon for third-party code (`img`/`txt`, `x`/`context`; an encoder also as a text word
joined to a stream word, `text_states`), and otherwise call order, with the confidence lowered
to say so.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from .binding import HIDDEN_ONLY, CallArgs, bind, through_wrapper
from .records import Binding, ForwardSummary

HIDDEN_NAMES = ("hidden_states", "x", "img", "image", "latents", "latent", "hidden", "h", "sample", "visual_embed",
                "video", "unified", "vision")
ENCODER_NAMES = ("encoder_hidden_states", "context", "txt", "text", "encoder", "cond", "context_states",
                 "text_embed", "y", "audio_hidden_states", "audio")
# a name of two parts, what the stream is of and that it is a stream (`text_states`, `txt_tokens`,
# `context_embeds`): an encoder name after the lexicon's own
_TEXT_WORDS = ("encoder", "context", "text", "txt", "prompt", "caption")
_STREAM_WORDS = ("hidden_states", "states", "hidden", "embeds", "embed", "embedding", "embeddings", "emb", "tokens",
                 "feats", "features")


@dataclass(frozen=True)
class PatternVerdict:
    pattern: str | None
    alternatives: tuple[str, ...]
    confidence: str
    roles: dict[str, str]  # "hidden_states" / "encoder_hidden_states" -> block parameter
    check_forward_pattern: bool | None
    bindings: tuple[Binding, ...]
    mismatch: bool | None
    why: tuple[str, ...]


def _rank(name: str, lexicon: tuple[str, ...]) -> int:
    return lexicon.index(name) if name in lexicon else len(lexicon)


def _encoder_rank(name: str) -> int | None:
    """Where `name` stands among encoder names: the lexicon's order, then a compound of a text word and a stream
    word (`text_states`) after every lexicon name; None: not an encoder name."""
    if name in ENCODER_NAMES:
        return ENCODER_NAMES.index(name)
    head, _, rest = name.partition("_")
    if head in _TEXT_WORDS and rest in _STREAM_WORDS:
        return len(ENCODER_NAMES) + _TEXT_WORDS.index(head)
    return None


def stream_params(direct: dict[str, str], outputs: tuple[str, ...]) -> list[str]:
    """Block parameters that receive a loop-carried variable, in parameter order."""
    carried = set(outputs)
    return [p for p, value in direct.items() if value in carried and not p.startswith("*")]


def decide(fwd: ForwardSummary, args: CallArgs, outputs: tuple[str, ...],
           self_values: dict[str, object] | None = None) -> PatternVerdict:
    """`self_values`: what the block holds in the attributes its return guards read (`self.after_proj is not
    None`), from the module tree; unknown where not given."""
    why: list[str] = []
    try:
        direct = bind(args, fwd.params)
    except Exception as exc:  # the original call does not bind: nothing to decide from
        return PatternVerdict(None, (), "unknown", {}, None, (), None, (f"call site does not bind: {exc}",))
    streams = stream_params(direct, outputs)
    if not streams:
        why.append("no loop-carried variable reaches the block: the call's output is not fed back")
        return PatternVerdict(None, (), "unknown", {}, None, (), None, tuple(why))
    if len(streams) > 2:
        why.append(f"{len(streams)} loop-carried streams ({', '.join(streams)}); cache-dit carries at most two")
        return PatternVerdict(None, (), "unknown", {}, None, (), None, tuple(why))
    hidden, encoder, encoder_is_stream, confidence = _streams(streams, [p.name for p in fwd.params], why)
    roles = {"hidden_states": hidden}
    if encoder:
        roles["encoder_hidden_states"] = encoder

    ret = fwd.return_roles
    if ret is None:
        ret = _reachable_roles(fwd, direct, why, self_values or {})
    if ret is None:
        why.append("what the block returns could not be traced to its inputs")
        return PatternVerdict(None, (), "unknown", roles, None, (), None, tuple(why))
    family = _FAMILIES.get(tuple("H" if r == hidden else "E" if r == encoder else "?" for r in ret))
    if family is None:
        why.append(f"returns {ret}: not the hidden stream alone nor a (hidden, encoder) pair")
        return PatternVerdict(None, (), "unknown", roles, None, (), None, tuple(why))

    bindings = tuple(through_wrapper(args, fwd.params, p, encoder=encoder) for p in family)
    encoder_value = direct.get(encoder) if encoder else None
    encoder_given = encoder_value is not None and encoder_value not in ("None",) and not encoder_value.startswith("<")
    valid = []
    for b in bindings:
        if not b.binds:
            continue
        if b.pattern in HIDDEN_ONLY and encoder_is_stream and len(ret) == 2:
            # P4/P5 pass the encoder stream through **kwargs unchanged: every block would
            # see the first block's encoder input, not the previous block's output.
            why.append(f"{b.pattern} binds, but would feed every block the first encoder input")
            continue
        valid.append(b.pattern)
    if not valid:
        chosen = family[0] if (encoder_given or encoder_is_stream) else family[1]
        why.append(f"no pattern binds as is; {chosen} is the block's contract, reached through a PatchFunctor")
    else:
        chosen = _preferred(valid, encoder, encoder_value, encoder_given or encoder_is_stream, why)
    alternatives = tuple(p for p in valid if p != chosen)
    if encoder and chosen in HIDDEN_ONLY and not encoder_is_stream and encoder_value in ("None", "<default None>"):
        del roles["encoder_hidden_states"]  # a parameter given None carries no stream
        why.append(f"`{encoder}` is {'passed as None' if encoder_value == 'None' else 'left at its default None'}: "
                   "it carries no stream, so it takes no role")

    check = _check_ok(fwd, chosen, roles, why)
    if check is False:
        confidence = "medium" if confidence == "high" else confidence
    return PatternVerdict(chosen, alternatives, confidence, roles, check, bindings, not valid, tuple(why))


# the patterns a block's returns allow: (with the encoder stream, hidden only), by return slots
_FAMILIES = {("H", "E"): ("Pattern_0", "Pattern_4"), ("E", "H"): ("Pattern_1", "Pattern_5"),
             ("H",): ("Pattern_2", "Pattern_3")}


def _streams(streams: list[str], named: list[str], why: list[str]) -> tuple[str, str | None, bool, str]:
    """(hidden, encoder, whether the encoder is a loop-carried stream, confidence) from one or two streams: of
    two, the one named most like a hidden state; of one, the encoder is the parameter named most like one."""
    if len(streams) == 2:
        a, b = streams
        hidden, encoder = (a, b) if _rank(a, HIDDEN_NAMES) <= _rank(b, HIDDEN_NAMES) else (b, a)
        if _rank(hidden, HIDDEN_NAMES) == len(HIDDEN_NAMES):
            why.append(f"stream names `{a}`/`{b}` are not known names: the first in call order is taken as hidden")
            return a, b, True, "medium"
        return hidden, encoder, True, "high"
    hidden = streams[0]
    candidates = [p for p in named if p != hidden and _encoder_rank(p) is not None]
    return hidden, (min(candidates, key=_encoder_rank) if candidates else None), False, "high"


def _preferred(valid: list[str], encoder: str | None, encoder_value: str | None, text_reaches: bool,
               why: list[str]) -> str:
    """Of the patterns that bind: one with the encoder stream when text reaches the block, else a hidden-only
    one (saying why where both bind)."""
    with_enc = [p for p in valid if p not in HIDDEN_ONLY]
    hidden_only = [p for p in valid if p in HIDDEN_ONLY]
    if with_enc and text_reaches:
        return with_enc[0]
    if hidden_only:
        if with_enc:
            why.append(
                f"`{encoder}` is passed as {encoder_value or 'nothing'}: no text stream reaches the block, "
                "so the hidden-only pattern is preferred"
            )
        return hidden_only[0]
    return with_enc[0]


def _arg_value(text: str | None):
    if text is None:
        return None
    if text.startswith("<default ") and text.endswith(">"):
        text = text[len("<default "):-1]
    return {"None": None, "True": True, "False": False}.get(text, ...)


def _guard_value(expr: cst.BaseExpression, direct: dict[str, str], selfs: dict[str, object] | None = None):
    """Evaluate a return guard with the call's arguments and what the block holds (`selfs`, by attribute);
    ... (Ellipsis) means unknown."""
    selfs = selfs or {}
    if isinstance(expr, cst.Name):
        return _arg_value(direct.get(expr.value)) if expr.value in direct else ...
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self":
        return selfs.get(expr.attr.value, ...)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        v = _guard_value(expr.expression, direct, selfs)
        return ... if v is ... else not v
    if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1:
        comp = expr.comparisons[0]
        if isinstance(comp.comparator, cst.Name) and comp.comparator.value == "None":
            v = _guard_value(expr.left, direct, selfs)
            if v is ...:
                return ...
            return (v is None) if isinstance(comp.operator, cst.Is) else (v is not None) if \
                isinstance(comp.operator, cst.IsNot) else ...
    if isinstance(expr, cst.BooleanOperation):
        a, b = _guard_value(expr.left, direct, selfs), _guard_value(expr.right, direct, selfs)
        if isinstance(expr.operator, cst.And):
            return False if (a is False or b is False) else (... if ... in (a, b) else bool(a and b))
        return True if (a is True or b is True) else (... if ... in (a, b) else bool(a or b))
    return ...


def _reachable_roles(fwd: ForwardSummary, direct: dict[str, str], why: list[str], selfs: dict[str, object]):
    """Return sites disagree: keep those whose guards can hold for this call's arguments and what the block
    holds."""
    live = []
    for site in fwd.returns:
        values = []
        for g in site.guards:
            try:
                values.append(_guard_value(cst.parse_expression(g), direct, selfs))
            except cst.ParserSyntaxError:
                values.append(...)
        if all(v is not False for v in values):
            live.append(site)
    orders = {s.roles for s in live}
    if len(orders) == 1 and live and "?" not in live[0].roles:
        dead = len(fwd.returns) - len(live)
        why.append(f"{dead} of {len(fwd.returns)} return statements cannot run for this call's arguments; "
                   f"the block returns {live[0].roles} here")
        return live[0].roles
    return None


def _check_ok(fwd: ForwardSummary, pattern: str, roles: dict[str, str], why: list[str]) -> bool:
    """Would cache-dit's own check_forward_pattern accept this block honestly?"""
    names = {p.name for p in fwd.params}
    if roles.get("hidden_states") != "hidden_states":
        why.append(
            f"the hidden stream is `{roles.get('hidden_states')}`, not `hidden_states`: cache-dit's pattern check "
            "looks for that name, so set check_forward_pattern=False; the tensors travel by position"
        )
        return False
    if pattern not in HIDDEN_ONLY:
        enc = roles.get("encoder_hidden_states")
        if enc != "encoder_hidden_states":
            extra = " (a parameter with that name exists but carries something else)" if \
                "encoder_hidden_states" in names else ""
            why.append(
                f"the encoder slot is `{enc}`{extra}: set check_forward_pattern=False; the tensors travel by position"
            )
            return False
    if fwd.annotation_agrees is False:
        why.append(
            f"the return annotation `{fwd.annotation}` counts {fwd.annotation_tensor_count} torch.Tensor but the "
            "body returns a different number: cache-dit's check compares the two and would reject the block; "
            "set check_forward_pattern=False"
        )
        return False
    return True


__all__ = ["PatternVerdict", "decide", "stream_params"]
