"""PLAN.md from plan.json's data, with a jinja2 template (PLAN.md.j2 beside this module)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(Path(__file__).parent)),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=False,
)
_ENV.filters["basename"] = lambda p: Path(str(p)).name if p else "?"
_MD_PUNCTUATION = set("\\`*_{}[]()<>#+-.!|~")


def code_span(value: Any) -> str:
    """`value` (as JSON unless it is text) in an inline code span no backtick inside it can close."""
    import json

    text = value if isinstance(value, str) else json.dumps(value)
    text = " ".join(text.split())  # one line
    run = longest = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_text(value: Any) -> str:
    """A reviewer's words as plain Markdown text: one line, every Markdown punctuation mark escaped."""
    text = " ".join(str(value).split())
    return "".join(f"\\{ch}" if ch in _MD_PUNCTUATION else ch for ch in text)


def revise_words(folder: str, sets: dict[str, Any], unsets, why: str) -> str:
    """An `integrate revise` command line: `folder` as given (a shell word already, or a placeholder), every
    other argument one shell word."""
    import json

    from integrate.escape import sh

    words = ["integrate", "revise", folder]
    for key, value in sets.items():
        words += ["--set", str(sh(f"{key}={json.dumps(value, separators=(',', ':'))}"))]
    for key in unsets:
        words += ["--unset", str(sh(key))]
    return " ".join(words + ["--why", str(sh(why)), "--reviewer", "<name>"])


def revise_command(alt: dict[str, Any], index: int) -> str:
    """The `integrate revise` command that takes an alternative (a pointer into plan.json when it is long)."""
    command = revise_words("<this folder>", alt["sets"], alt["unsets"], f"alternative {index}: {alt['instead']}")
    return command if len(command) <= 240 else f"see `alternatives[{index}]` in plan.json (its sets and unsets)"


_ENV.filters["code"] = code_span
_ENV.filters["revise_command"] = revise_command
_ENV.filters["md_text"] = md_text


def cp_code(plan: dict[str, Any]) -> str:
    """The CP hook plan written the way a cache-dit planner spells it."""
    lines = ["_cp_plan = {"]
    def gather(g) -> str:
        return "None" if g is None else f"_ContextParallelOutput(gather_dim={g['gather_dim']}, " \
                                        f"expected_dims={g['expected_dims']})"

    for key, value in plan.items():
        if isinstance(value, list):  # one gather per output of a module that returns a tuple
            lines.append(f"    {key!r}: ({', '.join(gather(g) for g in value)}),")
            continue
        if "gather_dim" in value:
            lines.append(f"    {key!r}: {gather(value)},")
            continue
        lines.append(f"    {key!r}: {{")
        for param, spec in value.items():
            k = int(param) if param.isdigit() else param
            specs = spec if isinstance(spec, list) else [spec]
            text = ", ".join(f"_ContextParallelInput(split_dim={s['split_dim']}, expected_dims={s['expected_dims']}, "
                             f"split_output={s['split_output']})" for s in specs)
            lines.append(f"        {k!r}: {'[' + text + ']' if isinstance(spec, list) else text},")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines)


def plan_markdown(plan: dict[str, Any]) -> str:
    """PLAN.md for plan.json's data (`to_json(plan)`)."""
    cp = plan["parallelism"]["cp"]
    return _ENV.get_template("PLAN.md.j2").render(plan=plan, m=plan["model"], cp=cp, tp=plan["parallelism"]["tp"],
                                                  cp_code=cp_code(cp.get("plan", {})))
