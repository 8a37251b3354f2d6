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
    fence = "`" * (_longest_backtick_run(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _longest_backtick_run(text: str) -> int:
    """The most backticks in a row in `text`: a code span or fence one longer than that cannot be closed by it."""
    run = longest = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return longest


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
_ENV.filters["where"] = lambda e: f"{Path(str(e['file'])).name}:{e['line']}" if e.get("line") else \
    Path(str(e["file"])).name  # a line of 0 is no line: not written

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


def _proof_detail(module, proof: dict[str, Any]) -> str:
    """One line of what a proof measured, from its verify record (`module`: the proof's, in the registry)."""
    parts = []
    if proof.get("why"):
        parts.append(str(proof["why"]))
    variants = proof.get("variants") if isinstance(proof.get("variants"), dict) else {}
    for variant, v in variants.items():
        if isinstance(v, dict):  # a variant that stopped has no figure: none is written (never "None")
            figure = v.get("max_abs")
            parts.append(f"{variant}: {v.get('status')}" + (f" (max abs {figure:.3g})"
                                                             if isinstance(figure, (int, float)) else ""))
    parts += module.details(proof)
    divergence = proof.get("first_divergence")
    if isinstance(divergence, dict) and divergence.get("module"):
        parts.append(f"first divergence: {divergence['module']}")
    return "; ".join(parts) or "-"


def proof_rows(report: dict[str, Any]) -> dict[str, Any]:
    """What PR.md shows of a `verify --json` report."""
    from integrate.verify.proofs import ALL

    fixture = report.get("fixture") if isinstance(report.get("fixture"), dict) else {}
    rows = [{"name": p.NAME, "status": report[p.NAME].get("status"), "detail": _proof_detail(p, report[p.NAME])}
            for p in ALL if isinstance(report.get(p.NAME), dict)]
    source = f"fixture {fixture.get('status') or 'unknown'}" + (
        f", inputs from {fixture['source']}" if fixture.get("source") else "")
    return {"rows": rows, "seconds": report.get("seconds"), "fixture_source": source}


def pr_markdown(*, plan: dict[str, Any], approval: dict[str, Any], registered: dict[str, str], files: list[str],
                lists: list[dict[str, Any]], proofs: dict[str, Any] | None, matrix: str, test_path: str,
                manual: list[str]) -> str:
    """PR.md of a checkout: what it adds, the evidence, the CPU proofs (when a verify report is given) and the
    GPU matrix to run."""
    return _ENV.get_template("PR.md.j2").render(
        plan=plan, m=plan["model"], cp=plan["parallelism"]["cp"], tp=plan["parallelism"]["tp"],
        tool_version=plan["tool_version"], approval=approval, registered=registered, files=files, lists=lists,
        proofs=proofs, matrix=matrix if matrix.endswith("\n") else matrix + "\n", fence="`" * max(3, _longest_backtick_run(matrix) + 1),
        test_path=test_path, manual=manual)


def fix_markdown(report: dict[str, Any]) -> str:
    """PR.md of `integrate audit --fix`: the finding, the change, the regression test before and after."""
    longest = max([_longest_backtick_run(x) for x in (report.get("diff", ""), report["audit"].get("reproduce", ""),
                                                        *(r.get("tail", "") for r in report.get("runs", [])))] or [0])
    evidence = []  # "path:line: why", shown with the file's name only (no path of this machine)
    for e in report["audit"].get("evidence", []):
        where, sep, why = e.partition(": ")
        evidence.append(f"{Path(where).name}{sep}{why}")
    return _ENV.get_template("FIX.md.j2").render(r=report, fence="`" * max(3, longest + 1), evidence=evidence)
