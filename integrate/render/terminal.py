"""Every command's output for a terminal, rendered from the JSON form of its record (`to_json`)."""

from __future__ import annotations

import os
from pathlib import Path


def _short(path: str | None) -> str:
    if not path:
        return "?"
    marker = os.sep + "site-packages" + os.sep
    if marker in path:
        return path.split(marker, 1)[1]
    return os.path.relpath(path) if path.startswith(os.getcwd()) else path


def gate(gate: dict) -> list[str]:
    lines = ["Gate: every fact known (a fact with no value is known to be absent)"]
    for name, fact in gate["inputs"].items():
        value = _short(fact["value"]) if name.endswith("_file") else fact["value"]
        if fact["value"] is None:  # --no-pipeline, no model folder, no config: known to be absent
            value = "none"
        lines.append(f"  {name:<18} {value}")
        lines.append(f"  {'':<18} from {fact['source']}")
    for attr, cls in gate.get("block_classes") or ():
        lines.append(f"  block class        self.{attr} holds {cls} (flag --block-class)")
    if gate.get("pipeline_entry") not in (None, "", "__call__"):
        lines.append(f"  denoising entry    {gate['pipeline_entry']}")
    lines += [f"  note: {n}" for n in gate.get("notes", [])]
    return lines


def analysis(data: dict, markdown: bool = False) -> str:
    t, p = data["transformer"], data["pipeline"]
    h = (lambda s: f"## {s}") if markdown else (lambda s: s.upper())
    lines = [h(f"Analysis of {t['class']}") if markdown else f"{t['class']}  ({_short(t['file'])}:{t['line']})", ""]
    lines += gate(data["gate"]) + [""]
    lines.append(h("Block lists"))
    if not t["block_lists"]:  # nothing found is not "nothing to cache": the unknowns below say why, if known
        lines.append("- none found" + ("; the unknowns below say what could not be read" if t["unknowns"] else ""))
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
            lines.append(f"    ForwardPattern: {bl['forward_pattern'] or 'unknown'}{alt}, "
                         f"confidence {bl['confidence']}")
            lines.append(f"    roles: {bl['roles']}; check_forward_pattern={bl['check_forward_pattern']}")
            fwd = bl["forward"]
            sig = ", ".join(
                ("*" if q["kind"] == "var_positional" else "**" if q["kind"] == "var_keyword" else "")
                + q["name"] + ("" if q["default"] is None else f"={q['default']}")
                for q in fwd["params"]
            )
            lines.append(f"    forward({sig})")
            lines.append(f"    returns {fwd['return_roles']}"
                         + ("" if fwd["returns_agree"] else " (return sites disagree)"))
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
    if not any(bl["is_blocks"] for bl in t["block_lists"]):
        found = (f"none of {t['class']}'s lists is established as blocks" if t["block_lists"] else
                 f"no module list was found in {t['class']}")
        lines.append(f"no block list: {found}, so the cache has nothing to wrap (exit 1)")
    lines.append("")
    decided = t["needs_patch_functor"] if t["block_lists"] else "not decided (no block list)"
    lines.append(f"needs_patch_functor: {decided}")
    lines += [f"  - {r}" for r in t["patch_functor_reasons"]]
    lines += [f"  unknown: {u}" for u in t["unknowns"]]
    lines.append("")
    lines.append(h("Pipeline"))
    entry = f"{p['class']}.{p['entry']}" if p["class"] else p["entry"]  # a function (a sampler) has no class
    lines.append(f"{entry} ({_short(p['file'])}): has_separate_cfg = {p['has_separate_cfg']}"
                 f" (confidence {p['confidence']})")
    lines += [f"  {_short(e['file'])}:{e['line']}  {e['why']}" for e in p["evidence"]]
    sup = data.get("already_supported") or {}
    if sup:
        lines.append("")
        lines.append(f"[{sup['label']}]")
        if sup["matches"]:
            for m in sup["matches"]:
                lines.append(f"  cache-dit registers the prefix {m['prefix']!r} ({_short(m['adapter'])})")
            if not sup["registered"]:  # as the JSON says: a prefix match is not support
                why = sup.get("prefix_only") or "its adapter does not accept this model"
                lines.append(f"  not supported by it: {why}")
        else:
            lines.append("  no cache-dit adapter is registered for this pipeline or transformer")
        for a in sup.get("answers") or ():  # each built-in that answers a looked-up name, with its verdict
            lines.append(f"  {'deferred to' if a['deferred'] else 'NOT deferred to'} ({a['confidence']}): {a['why']}")
    return "\n".join(lines)


def plan(data: dict, out_dir) -> str:
    cp, tp = data["parallelism"]["cp"], data["parallelism"]["tp"]
    lines = [f"plan written to {out_dir}/PLAN.md and plan.json",
             f"  CP: {cp['approach']}, {cp['shape']}: " + ", ".join(cp["plan"]),
             f"  TP: {tp['strategy']}: " + ", ".join(f"{x['attr']} ({x['strategy']})" for x in tp["block_lists"])]
    if not data["cache"]["block_lists"]:
        lines.append("  no block list: the cache has nothing to wrap, no BlockAdapter can be written (exit 1)"
                     + "".join(f"; `{b['attr']}`: {b['why']}" for b in data["cache"]["not_blocks"][:3]))
    if tp.get("blocked_by"):
        lines.append(f"  TP not planned: {tp['blocked_by'][0]['why']}")
    if data["unknowns"]:
        lines.append(f"  {len(data['unknowns'])} open question(s): see PLAN.md")
    lines.append(f"next: review PLAN.md, then `integrate approve {out_dir} --reviewer <name>`")
    return "\n".join(lines)


def revised(data: dict) -> str:
    import json

    where = data["plan_dir"]
    if not data["changed"]:
        lines = [f"nothing changed: {where}/plan.json already says that"]
    else:
        lines = [f"plan revised: {where}/plan.json and PLAN.md rendered again"
                 + ("; its approval is void" if data["approval_voided"] else "")]
    for o in data["overrides"]:
        lines.append(f"  override {o['key']}: analysis {json.dumps(o['analysis'])} -> {json.dumps(o['value'])} "
                     f"(by {o['by']}: {o['why']})")
    if data["changed"]:
        lines.append(f"next: review PLAN.md, then `integrate approve {where} --reviewer <name>`")
    return "\n".join(lines)


def repair(data: dict) -> str:
    if not data["failing"]:
        return "nothing to repair: cache, cp and tp pass as generated"
    lines = ["failing: " + ", ".join(f"{p} (first divergence: {m or 'not named'})" for p, m in data["failing"].items())]
    for t in data["trials"]:
        where = f", diverged at {t['diverged_at']}" if t.get("diverged_at") else ""
        on = f" (on top of candidate(s) {', '.join(str(i) for i in t['on'])})" if t.get("on") else ""
        lines.append(f"  tried {t['proof']} [{t['alternative']}]{on}: {t['decision']} -> {t['instead']}: "
                     f"{t['status']}{where}"
                     + (f" ({t['why']})" if t.get("why") else "") + f" [{t['seconds']} s]")
    if data.get("stopped"):
        lines.append(f"  stopped: {data['stopped']}")
    p = data["proposal"]
    if p is None:
        lines.append("no alternative made the failing proof pass: the plan needs a person (see the trials above)")
    else:
        lines += [f"proposed (not approved): {', '.join(data['files'])}"]
        lines += [f"  gives up: {c}" for c in p.get("costs", ())]
        lines.append(f"take it with: {p['command']}")
    return "\n".join(lines)


def approval(data: dict) -> str:
    return (f"approved by {data.get('reviewer')} at {data.get('approved_at')} (plan.json sha256 "
            f"{data.get('plan_sha256', '')[:12]}...)")


def generate(data: dict) -> str:
    if data["mode"] == "checkout":
        changed = data.get("checkout", {}).get("changed", [])
        lines = [f"checkout: {len(changed)} file(s) changed in {data.get('checkout', {}).get('package')}"]
        lines += [f"  wrote {f}" for f in data["files"]]
    else:
        lines = [f"plugin: {len(data['files'])} file(s)"]
    lines += [f"  registered {k}: {v}" for k, v in data["registered"].items()]
    lines += [f"  note: {n}" for n in data["notes"]] + [f"  MANUAL: {x}" for x in data["manual"]]
    return "\n".join(lines)


def metrics(scores: dict) -> str:
    psnr = float("inf") if scores["psnr"] is None else scores["psnr"]
    return (f"PSNR {'inf (identical)' if scores['psnr'] is None else f'{psnr:.2f} dB'}, SSIM {scores['ssim']:.4f}"
            + (f" (minimum over {scores['frames']} frames, worst frame {scores['worst_frame']})"
               if scores["frames"] > 1 else "")
            + ("  GARBLED: PSNR looks fine but the structure is gone (SSIM < 0.5)" if scores["garbled"] else "")
            + f"\nside by side: {scores['side_by_side']}")


def verify(report: dict) -> str:
    from integrate.verify.proofs import ALL
    from integrate.verify.records import NOT_REQUESTED

    fx = report["fixture"]
    source = f", inputs from {fx['source']}" if fx.get("source") else ""
    lines = [f"fixture: {fx['status']} ({fx['path']}{source})"]
    lines += [f"  {e}" if fx.get("status") == "skipped" else f"  cannot derive {e}" for e in fx.get("errors", [])]
    lines += [f"  tried {t}" for t in fx.get("tried", [])]
    lines += [f"  note: {n}" for n in fx.get("notes", [])]
    ran = [proof for proof in ALL if not (report[proof.NAME]["status"] == "skipped"
                                          and report[proof.NAME].get("why") == NOT_REQUESTED)]
    if not ran:
        lines.append("no proof was run (none was asked for)")
    for proof in ran:
        r = report[proof.NAME]
        head = f"{proof.NAME}: {r['status'].upper()}"
        if r.get("why"):
            head += f" - {r['why']}"
        lines.append(head)
        for vname, vr in (r.get("variants") or {}).items():
            fig = f" max-abs {vr['max_abs']:.3g}, cosine {vr['cosine']:.6f}" if "max_abs" in vr else ""
            lines.append(f"  {vname}: {vr['status']}{fig}" + (f" - {vr['why']}" if vr.get("why") else ""))
            lines += [f"    {line}" for line in _engaged(vr.get("engaged") or {})]
        lines += proof.lines(r)  # what only this proof records
        first = r.get("first_divergence")
        if first:
            where = first.get("module") or "unknown module"
            raised = f" ({first['error']['type']} raised {first.get('raised', '')})" if first.get("error") else ""
            lines.append(f"  first divergence: {where}{raised}")
            if first.get("table"):
                lines.append(layer_table(first["table"]))
    lines.append(f"{report.get('seconds', 0)} s")
    return "\n".join(lines)


def layer_table(table: list[dict]) -> str:
    """Per-layer parity around the first divergent module."""
    if not table:
        return ""
    width = max(len(r["module"]) for r in table)
    lines = [f"    {'module':<{width}}  {'max-abs':>10}  {'cosine':>9}"]
    for r in table:
        mark = "" if r["ok"] else "  <- differs"
        lines.append(f"    {r['module']:<{width}}  {r['max_abs']:>10.3g}  {r['cosine']:>9.6f}{mark}")
    return "\n".join(lines)


def _engaged(e: dict) -> list[str]:
    """What a parallel variant recorded of its plan having acted, one line per kind."""
    out = []
    if "tp" in e:
        t = e["tp"]
        first = t["shards"][0] if t["shards"] else None
        out.append(f"TP: {t['sharded']} of {t['parameters']} parameters sharded" + (
            f" (e.g. {first['name']} {first['full']} -> {first['local']})" if first else "") + (
            f"; {len(t['unresolved'])} plan key(s) matched no module" if t["unresolved"] else ""))
    if "cp" in e:
        c = e["cp"]
        first = next((x for x in c["splits"] if x["full"] != x["local"]), None)
        out.append(f"CP: {c['fired']} of {c['hooks']} hooks fired, {c['split']} tensor(s) split" + (
            f" (e.g. {first['module'] or '<root>'} dim {first['dim']}: {first['full']} -> {first['local']})"
            if first else ""))
    return out


def verify_gpu(data: dict) -> str:
    if "results" in data:
        return data["table"]
    if data.get("status") == "skipped":
        return data["why"] + "\n(print the commands with --gpu --print and run them where GPUs are)"
    return "\n".join(data["setup"] + data["commands"])


def _short_survey(path: str, data: dict) -> str:
    p = Path(path)
    for root in (Path(data["diffusers"]["path"]), Path.cwd()):
        try:
            return str(p.relative_to(root))
        except ValueError:
            continue
    return str(p)


def survey(data: dict) -> str:
    header = ["transformer", "file:line", "pipeline(s)", "cache-dit*", "block lists: pattern", "separate CFG",
              "PatchFunctor", "CP", "TP"]
    table = [header]
    for r in data["rows"]:
        where = f"{_short_survey(r['file'], data)}:{r['line'] or '?'}"
        pipes = r["pipelines"]
        shown = r["analysed_pipeline"] or (pipes[0]["class"] if pipes else "-")
        pipe = shown + (f" +{len(pipes) - 1}" if len(pipes) > 1 else "") if pipes else "-"
        sup = r["already_supported"]
        supported = "?" if sup is None else ("yes" if sup.get("registered") else "no")
        if r["status"] == "error":
            table.append([r["transformer_class"] or "?", where, pipe, supported, f"error: {r['error']}"])
            continue
        lists = ", ".join(f"{b['attr']}: {(b['forward_pattern'] or '?').replace('Pattern_', 'P')}"
                          for b in r["block_lists"]) or "none found"
        cfg = {True: "yes", False: "no", None: "?" if r["analysed_pipeline"] else "-"}[r["has_separate_cfg"]]
        pf = {True: "needed", False: "no", None: "?"}[r["needs_patch_functor"]]
        cp = r["cp"] or {}
        cp_text = f"{cp.get('approach')}, {cp.get('shape')}" if cp.get("shape") else str(cp.get("approach"))
        table.append([r["transformer_class"], where, pipe, supported, lists, cfg, pf, cp_text,
                      str((r["tp"] or {}).get("strategy"))])
    widths = [max((len(row[i]) for row in table if i < len(row) - 1), default=0) for i in range(len(header))]
    lines = []
    for row in table:
        cells = [c.ljust(widths[i]) if i < len(row) - 1 else c for i, c in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    errors = sum(r["status"] == "error" for r in data["rows"])
    lines.append("")
    lines.append(f"{len(data['rows'])} transformer class(es), {errors} error(s); diffusers "
                 f"{data['diffusers']['version']}, cache-dit {data['cache_dit']['version']}")
    lines.append(f"* {data['cache_dit']['label']}")
    for s in data["skipped"]:
        lines.append(f"skipped {s['file']}: {s['why']}")
    from integrate.verify.proofs import REPORTED

    shown = ("status", "fixture", *REPORTED, "why")
    lines += [f"verify {r['transformer_class']}: " + ", ".join(f"{k} {v}" for k, v in r["verify"].items() if k in shown)
              for r in data["rows"] if "verify" in r]
    return "\n".join(lines)


def audit(data: dict) -> str:
    """One line per class: each proof's label with cache-dit's / ours; findings with their reproduction; the
    labels counted per proof and the side-by-side figure over the same proofs."""
    lines = [f"cache-dit {data['cache_dit']['version']} vs integrate {data['tool_version']} "
             f"(proofs: {', '.join(data['proofs'])}; each cell: label (cache-dit's / ours))"]
    for r in data["rows"]:
        cells = "  ".join(f"{p['name']} {p.get('status', '?')} ({p['cache_dit']}/{p['ours']})" for p in r["proofs"])
        lines.append(f"{r['transformer_class']:<40} {r['status']:<15} {cells}" + (" (cached)" if r.get("cached")
                                                                                    else ""))
        if r.get("why"):
            lines.append(f"    {r['why']}")
        for p in r["proofs"]:
            if p.get("label_why"):
                lines.append(f"    {p['name']} {p['status']}: {p['label_why']}")
            if p["cache_dit"] in ("fail", "error", "vacuous") and p.get("status") != "cache-dit-lacks":
                where = p.get("cache_dit_first_divergence")
                lines.append(f"    cache-dit's {p['name']}: {p.get('cache_dit_why', '')}"
                             + (f" (first divergent module: {where})" if where else ""))
            if p["ours"] in ("fail", "error", "vacuous"):
                where = p.get("ours_first_divergence")
                lines.append(f"    ours {p['name']}: {p.get('ours_why', '')}"
                             + (f" (first divergent module: {where})" if where else ""))
        if r.get("status") == "finding":
            lines += [f"    ours: {k} {v}" for k, v in r.get("our_patterns", {}).items()]
            lines += [f"    evidence: {e}" for e in r.get("evidence", [])]
        if r.get("reproduce"):
            lines += ["    reproduce:"] + [f"      {x}" for x in r["reproduce"].splitlines()]
    for name, counts in data.get("labels", {}).items():
        lines.append(f"{name}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))
    for name, c in data.get("compared", {}).items():
        if c["compared"]:
            lines.append(f"{name}, where both integrations ran it to a verdict ({c['compared']} row(s)): cache-dit's "
                         f"passes {c['cache_dit']}, ours {c['ours']}")
    lines.append(f"{data['findings']} row(s) with a finding in {len(data['rows'])} integration(s)")
    return "\n".join(lines)


def audit_fix(data: dict) -> str:
    """What `audit --fix` did: the finding, the built-in rewritten, the regression test before and after."""
    lines = [f"{data['transformer_class']}: {data['status']}" + (f" ({data['why']})" if data.get("why") else "")]
    for p in data["audit"].get("proofs", []):
        lines.append(f"  {p['name']}: {p.get('status', '?')} (cache-dit's {p['cache_dit']}, ours {p['ours']})")
    for w in data.get("rewritten", []):
        lines.append(f"  rewritten: cache_dit/{w['file']}:{w['line']} {w['function']} (registered as '{w['key']}'): "
                     + ", ".join(w["changed"]))
    for run in data.get("runs", []):
        lines.append(f"  {run['proof']} regression test, {run['tree']}: {run['status']}")
    lines += [f"  changed in the checkout: cache_dit/{c}" for c in data.get("changed", [])]
    lines += [f"  wrote {f}" for f in data.get("files", [])]
    lines += [f"  manual: {m}" for m in data.get("manual", [])]
    return "\n".join(lines)
