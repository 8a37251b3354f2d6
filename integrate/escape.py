"""The one way a value reaches generated code or a shell line.

Everything a template prints comes from the model (class names, module paths, source excerpts), the plan
(keys, values a reviewer may have edited) or the user (a reviewer's name, a folder): none of it may become
code. The templates' environment refuses to print a plain string (`finalize`): every `{{ ... }}` names the
context its value lands in, with one of these filters, and each filter either makes the value harmless
there or refuses it (`UnsafeValue`, an input error: exit 2, nothing written).

- `py`: a Python literal (str, int, float, bool, None, lists and dicts of them), checked by
  `ast.literal_eval` to read back as the value itself; `py_dict`: a dict so written, one entry per line;
- `ident`: one Python identifier (`str.isidentifier`, not a keyword); `dotted`: identifiers joined by dots;
- `text`: prose inside a docstring or a comment: one line (control characters and line breaks turned into
  spaces), every backslash doubled and every double quote escaped, so no quote in it is left unescaped and
  nothing in it can end a `\"\"\"` docstring, however many quotes it holds or wherever it stands;
- `sh`: one shell word (`shlex.quote`);
- `joined` and `wrapped`: several `text` values on one line, or one wrapped over several;
- `Code`: text integrate itself made as code from checked parts (an import block, libcst's rewrite of the
  model's own forward); `macro` marks what one of our template macros rendered, each of its insertions
  escaped in turn; `indented` shifts such `Code` right to nest it in a body, and refuses anything else.

Numbers and booleans print as they are. `check_python` compiles a generated module before it is written.
"""

from __future__ import annotations

import ast
import json
import keyword
import shlex
import textwrap
import unicodedata
from typing import Any

from integrate.errors import InputError

_SCALARS = (str, int, float, bool, type(None))


class Code(str):
    """Text that is code integrate wrote from checked parts: printed as it is."""


class UnsafeValue(InputError):
    """A value from the model, the plan or the user that cannot be written where a template needs it."""


def _quoted(value: Any) -> str:
    return json.dumps(value)[:80] if isinstance(value, str) else repr(value)[:80]


def py(value: Any) -> Code:
    """A Python literal for `value` (strings in double quotes), refused unless it reads back as `value`."""
    text = _literal(value)
    try:
        back = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise UnsafeValue(f"cannot write {_quoted(value)} as a Python literal") from None
    if _plain(back) != _plain(value):
        raise UnsafeValue(f"{_quoted(value)} does not read back as itself in Python")
    return Code(text)


def py_dict(value: Any, indent: int = 4) -> Code:
    """A dict as a Python literal with one entry per line (a config a person reads and edits): each key and value
    written by `py`, and the whole read back and compared once more."""
    if not isinstance(value, dict):
        raise UnsafeValue(f"a {type(value).__name__} is not a dict")
    if not value:
        return Code("{}")
    pad = " " * indent
    text = "{\n" + "".join(f"{pad}{py(k)}: {py(v)},\n" for k, v in value.items()) + "}"
    try:
        same = _plain(ast.literal_eval(text)) == _plain(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        same = False
    if not same:
        raise UnsafeValue("a dict that does not read back as itself in Python")
    return Code(text)


def _literal(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise UnsafeValue(f"{value!r} has no Python literal")
        return repr(float(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        if not all(isinstance(k, _SCALARS) for k in value):
            raise UnsafeValue("a dict key that is not a plain value")
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    raise UnsafeValue(f"a {type(value).__name__} is not a plain value")


def _string(value: str) -> str:
    """A double-quoted Python string literal: backslash and quote escaped, every character Python would not print
    as itself (line breaks, NUL, lone surrogates) as its code point's escape, the rest as it is. (JSON's escapes
    are not Python's for characters past U+FFFF: JSON writes a surrogate pair, which Python reads as two.)"""
    out = []
    for ch in value:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _plain(value: Any) -> Any:
    """Tuples as lists, so a tuple and the list literal it is written as compare equal."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def pykey(value: Any) -> Code:
    """A key of a planner's dict: a string of ASCII digits is an output's index and is written as that number,
    anything else as `py` writes it."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return py(int(value))
    return py(value)


def ident(value: Any) -> Code:
    """One identifier that Python reads back as itself: it folds identifiers to NFKC form, so `ｅｖａｌ` or `ﬁle`
    would name another name (`eval`, `file`) than the one checked."""
    if not isinstance(value, str) or not value.isidentifier() or keyword.iskeyword(value) \
            or unicodedata.normalize("NFKC", value) != value:
        raise UnsafeValue(f"{_quoted(value)} is not a Python identifier")
    return Code(value)


def dotted(value: Any) -> Code:
    """`a.b.c`, each part an identifier (a module path, an attribute path)."""
    if not isinstance(value, str) or not value:
        raise UnsafeValue(f"{_quoted(value)} is not a dotted Python name")
    for part in value.split("."):
        ident(part)
    return Code(value)


def module_path(value: Any) -> str:
    """A path to submodules as hooks name them (`blocks.*.attn`, `face_adapter.0`): each part an identifier, a list
    index or `*`. Checked, then written as data (through `py`), never as code."""
    if not isinstance(value, str) or not value:
        raise UnsafeValue(f"{_quoted(value)} is not a module path")
    for part in value.split("."):
        if part != "*" and not part.isdigit():
            ident(part)
    return value


def text(value: Any) -> Code:
    """`value` as prose safe inside a docstring or a comment, on one line."""
    if not isinstance(value, _SCALARS):
        raise UnsafeValue(f"a {type(value).__name__} is not text")
    line = "".join(ch if ch.isprintable() else " " for ch in str(value))
    # correct by construction: after doubling every backslash, a backslash in the output escapes exactly the
    # character after it; every quote is then given one, so no quote is left that could close the docstring
    return Code(line.replace("\\", "\\\\").replace('"', '\\"'))


def sh(value: Any) -> Code:
    """One shell word."""
    if not isinstance(value, (str, int)) or isinstance(value, bool) or "\x00" in str(value):
        raise UnsafeValue(f"{_quoted(value)} is not a shell word")  # (no shell word can hold a NUL)
    return Code(shlex.quote(str(value)))


def joined(values: Any, sep: str) -> Code:
    """Several values as prose, each escaped as `text`."""
    return Code(sep.join(text(v) for v in values))


def wrapped(value: Any, width: int, indent: str) -> Code:
    """`text`, wrapped at spaces to `width` columns, continuation lines indented."""
    wrapper = textwrap.TextWrapper(width=width, expand_tabs=False, replace_whitespace=False,
                                   break_long_words=False, break_on_hyphens=False)
    return Code(("\n" + indent).join(wrapper.wrap(text(value))))


def macro(value: Any) -> Code:
    """What one of integrate's own template macros rendered (each of its insertions escaped in turn)."""
    return Code(value)


def finalize(value: Any) -> Any:
    """jinja2's hook for every `{{ ... }}`: only escaped text, numbers and booleans get through."""
    if isinstance(value, Code):
        return value
    if isinstance(value, (bool, int, float)) and not isinstance(value, str):
        return value
    raise UnsafeValue(f"a template printed {_quoted(value)} without saying where it lands (py, ident, dotted, "
                      "text, sh): a bug in the template")


def check_python(code: str, name: str) -> None:
    """Refuse a generated module that does not compile (it would fail every import of the plugin)."""
    try:
        compile(code, name, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        raise UnsafeValue(f"the generated {name} does not compile ({type(exc).__name__}: {exc}): refusing to "
                          "write it") from None


def indented(code: Any, width: int) -> Code:
    """`Code` (and only `Code`) shifted right by `width` spaces, for a body the template nests in a function."""
    if not isinstance(code, Code):
        raise UnsafeValue(f"only code integrate wrote can be indented into a generated body, not {_quoted(code)}")
    return Code(textwrap.indent(code, " " * width))


FILTERS = {"py": py, "py_dict": py_dict, "pykey": pykey, "ident": ident, "dotted": dotted, "text": text, "sh": sh, "joined": joined, "wrapped": wrapped,
           "macro": macro, "indented": indented}
