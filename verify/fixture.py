"""The fixture file: an editable Python module holding the tiny config and the forward inputs.

`integrate verify` writes it beside the generated plugin. A checksum of its body is written into it;
when the text no longer matches, a person has edited it and the file is used as it stands.
"""

from __future__ import annotations

import hashlib
import importlib.util
import pprint
from pathlib import Path
from typing import Any

import jinja2

from integrate import __version__
from integrate.errors import InputError

FILENAME = "verify_fixture.py"
_MARK = "# integrate-fixture sha256="


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def _split(text: str) -> tuple[str | None, str]:
    _, sep, rest = text.partition(_MARK)
    if not sep:
        return None, text
    sha, _, body = rest.partition("\n")
    return sha.strip(), body


def render(*, transformer_class: str, transformer_module: str, config: dict[str, Any], changes: dict,
           slots: list[dict[str, Any]], image_tokens: int | None, text_tokens: int, steps: int,
           config_source: str, problems: list[str] = ()) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    errors = [*problems, *(f"{s['name']} ({s['error']})" for s in slots if s.get("error"))]
    text = env.get_template("fixture.j2").render(
        transformer_class=transformer_class, transformer_module=transformer_module, version=__version__,
        config=pprint.pformat(config, indent=4, width=100, sort_dicts=False), slots=slots, errors=errors,
        changes=", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items()) or "none",
        image_tokens=image_tokens, text_tokens=text_tokens, steps=steps, config_source=config_source,
        sha="SHA")
    _, body = _split(text)
    return text.replace(f"{_MARK}SHA", f"{_MARK}{_digest(body)}", 1)


def edited(path: Path) -> bool:
    """True when the file exists and its text is not what integrate wrote."""
    if not path.is_file():
        return False
    sha, body = _split(path.read_text())
    return sha is None or sha != _digest(body)


def load(path: Path):
    """Import the fixture module; a broken one is the user's input error."""
    spec = importlib.util.spec_from_file_location("integrate_verify_fixture", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the file is the user's (or ours, edited): say what is wrong with it
        raise InputError(f"{path}: the fixture does not load: {type(exc).__name__}: {exc}") from None
    for name in ("CONFIG", "inputs", "TRANSFORMER_CLASS", "STEPS"):
        if not hasattr(module, name):
            raise InputError(f"{path}: the fixture has no `{name}`")
    return module
