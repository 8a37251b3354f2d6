"""Readable reports for people, rendered from the JSON form (so a cached result renders too)."""

from __future__ import annotations

import os


def _short(path: str | None) -> str:
    if not path:
        return "?"
    marker = os.sep + "site-packages" + os.sep
    return path.split(marker, 1)[1] if marker in path else os.path.relpath(path) if path.startswith(os.getcwd()) else path


def gate_text(gate: dict) -> list[str]:
    lines = ["Gate: all five facts known"]
    for name, fact in gate["inputs"].items():
        value = _short(fact["value"]) if name.endswith("_file") else fact["value"]
        lines.append(f"  {name:<18} {value}")
        lines.append(f"  {'':<18} from {fact['source']}")
    if gate.get("pipeline_entry") not in (None, "__call__"):
        lines.append(f"  denoising entry    {gate['pipeline_entry']}")
    lines += [f"  note: {n}" for n in gate.get("notes", [])]
    return lines


def analysis_text(data: dict, markdown: bool = False) -> str:
    t, p = data["transformer"], data["pipeline"]
    h = (lambda s: f"## {s}") if markdown else (lambda s: s.upper())
    lines = [h(f"Analysis of {t['class']}") if markdown else f"{t['class']}  ({_short(t['file'])}:{t['line']})", ""]
    lines += gate_text(data["gate"]) + [""]
    lines.append(h("Block lists"))
    for bl in t["block_lists"]:
        mark = {True: "BLOCKS", False: "not blocks", None: "unknown"}[bl["is_blocks"]]
        head = f"- {bl['attr']} [{bl['container']}] -> {mark}"
        if bl["is_blocks"]:
            head += f": {bl['block_class']} x {bl['length'] or '?'}"
            if bl["length_config_fields"]:
                head += f" (config: {', '.join(bl['length_config_fields'])})"
        lines.append(head)
        lines.append(f"    why: {bl['why']}")
        if bl["is_blocks"]:
            alt = f" (also binds: {', '.join(bl['alternatives'])})" if bl["alternatives"] else ""
            lines.append(f"    ForwardPattern: {bl['forward_pattern'] or 'unknown'}{alt}, confidence {bl['confidence']}")
            lines.append(f"    roles: {bl['roles']}; check_forward_pattern={bl['check_forward_pattern']}")
            fwd = bl["forward"]
            sig = ", ".join(
                ("*" if q["kind"] == "var_positional" else "**" if q["kind"] == "var_keyword" else "")
                + q["name"] + ("" if q["default"] is None else f"={q['default']}")
                for q in fwd["params"]
            )
            lines.append(f"    forward({sig})")
            lines.append(f"    returns {fwd['return_roles']}" + ("" if fwd["returns_agree"] else " (return sites disagree)"))
            cs = bl["call_site"]
            lines.append(f"    call site line {cs['line']}: pitfall A = {cs['keyword_positional_mismatch']}")
            for b in cs["bindings"]:
                state = "binds as is" if b["binds"] else (b["error"] or f"changes {', '.join(b['changed'])}")
                lines.append(f"      {b['pattern']}: {state}")
            for op in cs["loop_extra_ops"]:
                flag = "" if op["active_by_default"] else " [inactive by default]"
                lines.append(f"    loop body line {op['line']}: {op['kind']}{flag}: {op['code']}")
                lines.append(f"      {op['why']}")
            for ev in cs["in_place_input_mutation"]:
                lines.append(f"    pitfall C line {ev['line']}: {ev['why']}")
            for w in cs["walk"]:
                lines.append(f"    walk: {w}")
        for n in bl.get("notes", []):
            lines.append(f"    note: {n}")
        ev = bl["evidence"]
        if markdown and ev:
            lines += [f"    - `{_short(e['file'])}:{e['line']}` {e['why']}" for e in ev]
    lines.append("")
    lines.append(f"needs_patch_functor: {t['needs_patch_functor']}")
    lines += [f"  - {r}" for r in t["patch_functor_reasons"]]
    lines += [f"  unknown: {u}" for u in t["unknowns"]]
    lines.append("")
    lines.append(h("Pipeline"))
    lines.append(f"{p['class']}.{p['entry']} ({_short(p['file'])}): has_separate_cfg = {p['has_separate_cfg']}"
                 f" (confidence {p['confidence']})")
    lines += [f"  {_short(e['file'])}:{e['line']}  {e['why']}" for e in p["evidence"]]
    sup = data.get("already_supported") or {}
    if sup:
        lines.append("")
        lines.append(f"[{sup['label']}]")
        if sup["matches"]:
            for m in sup["matches"]:
                lines.append(f"  cache-dit already registers prefix {m['prefix']!r} ({_short(m['adapter'])})")
        else:
            lines.append("  no cache-dit adapter is registered for this pipeline or transformer")
    return "\n".join(lines)
