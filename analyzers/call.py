"""What the pipeline's entry takes: its parameters, read from the signature (libcst, nothing imported).

The generated example calls the pipeline the way its own signature says: the parameters it requires (no
default) become inputs the example must be given, each with a kind (an image, a video, audio, a prompt, or
a plain value) read from the name and annotation; everything else keeps the pipeline's own default, which
its own checks accept (a `guidance_schedule` whose length must equal the default `num_inference_steps`).
"""

from __future__ import annotations

import libcst as cst

from integrate.source import SourceFile
from integrate.syntax import find_all

from .forward import signature
from .records import CallInput

_KINDS = (("video", "video"), ("audio", "audio"), ("image", "image"), ("img", "image"), ("prompt", "prompt"))


_PLAIN = {"int", "float", "bool", "str", "None", "Optional", "Union", "list", "List", "tuple", "Tuple", "dict", "Dict"}


def _kind(name: str, annotation: str | None) -> str:
    """A prompt by its name; an annotation of plain types only (`int | None`, `list[float]`) is a value whatever
    else the name says (`num_videos_per_prompt`); otherwise the name and annotation's words."""
    words = name.split("_")
    if "prompt" in words and words[0] != "num":  # prompt, prompt_2, negative_prompt; not num_images_per_prompt
        return "prompt"
    if annotation:
        try:
            words = {n.value for n in find_all(cst.parse_expression(annotation), cst.Name)}
        except (cst.ParserSyntaxError, RecursionError):
            words = set()
        if words and words <= _PLAIN:
            return "value"
    text = f"{name} {annotation or ''}".lower()
    return next((kind for word, kind in _KINDS if word in text), "value")


def call_inputs(src: SourceFile, entry: cst.FunctionDef | None) -> tuple[CallInput, ...]:
    """Every named parameter of the entry (`*args` / `**kwargs` left out), in order."""
    if entry is None:
        return ()
    line = src.line(entry)
    return tuple(CallInput(p.name, _kind(p.name, p.annotation), p.default is None, p.default, line)
                 for p in signature(src, entry) if p.kind not in ("var_positional", "var_keyword"))
