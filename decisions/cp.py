"""The context-parallelism chart, as code.

Hook-based first, a hybrid (hooks plus one minimal method patch) second, a rewrite of forward
never. The plan uses cache-dit's hook keys: `""` for forward's own inputs, `"<list>.0"` for the
first block, `"<list>.*"` for every block, a module path for an output-split or a gather.

Order of questions, each answered from the facts with evidence:
1. Can forward's inputs be split at the root? Only if every op between an input and the first
   block acts per token and nothing is derived from the local sequence length.
2. Otherwise split each list that starts a fresh sequence at its first block.
3. Position tables built by a sub-module from unsplit inputs get an output split; those built by
   a plain method or inline code are split at every block's input.
4. Modules whose output the loop body joins into a split stream get an output split.
5. A list whose output is rebuilt before the next list gathers at its last block; the last list
   gathers at the last module applied before the output is reshaped (or at its last block when the
   sequence is sliced or joined first).
6. Masks over the joint sequence must be reordered; head counts decide Ulysses-anything.
"""

from __future__ import annotations

from typing import Any

from integrate.records import BlockStructure, Evidence, ParallelFacts, SequenceFact

STREAM = {"split_dim": 1, "expected_dims": 3, "split_output": False}
GATHER = {"gather_dim": 1, "expected_dims": 3}
CP_SIZES = (2, 4, 8)


def _ev(e: Evidence | None) -> dict | None:
    return None if e is None else {"file": e.file, "line": e.line, "why": e.why}


TEXT_STREAMS = ("encoder_hidden_states", "context", "txt", "y", "cond", "text_states", "prompt_embeds")


def decide_cp(facts: ParallelFacts) -> dict[str, Any]:
    seq = facts.sequence
    out: dict[str, Any] = {"approach": "unknown", "shape": None, "plan": {}, "confidence": "unknown",
                           "evidence": [], "risks": [], "unknowns": []}
    if seq is None or not seq.lists:
        out["unknowns"].append("no block loop found in the transformer's forward: nothing to split")
        out.update(_extras(facts, seq, {}, joint=False, hybrid=[]))
        out["diffusers_plan"] = None
        return out
    blocks = {b.attr: b for b in facts.blocks}
    plan: dict[str, Any] = {}
    evidence: list[dict] = []
    risks: list[str] = []
    unknowns: list[str] = list(seq.unknowns)
    first = seq.lists[0]
    root = not seq.root_blockers and first.fresh
    split_params: set[str] = set()
    if root:
        inputs: dict[str, Any] = {}
        for var in first.streams.values():
            param = seq.root_params.get(var)
            if param is None:
                root = False
                break
            inputs[param] = dict(STREAM)
            split_params.add(param)
        if root:
            for bi in first.inputs:
                if bi.role == "position" and bi.producer_kind in ("module", "expression") and not bi.local_length:
                    for p in bi.from_params:
                        if p not in inputs:
                            dropped = seq.batch_dropped.get(p)
                            passed = facts.pipeline_arg_ndims.get(p)
                            two_d = passed == 2 if passed is not None else dropped is not None
                            inputs[p] = {"split_dim": 0 if two_d else 1, "expected_dims": 2 if two_d else 3,
                                         "split_output": False}
                            split_params.add(p)
                            if passed is not None:
                                at = facts.pipeline_arg_ndims_at[p]
                                where, layout = at, f"[{'S, n' if two_d else 'B, S, n'}]: {at.why}"
                            else:
                                where = dropped
                                layout = (f"[S, n] after {dropped.why} (the pipeline's layout was not read)"
                                          if dropped else "[B, S, n] (assumed; confirm in verify)")
                            evidence.append({"file": where.file if where else seq.file,
                                             "line": where.line if where else seq.forward_line,
                                             "why": f"`{p}` feeds the positions of `{bi.param}`: split it with the "
                                                    f"tokens, as {layout}"})
            plan[""] = inputs
            evidence.append({"file": seq.file, "line": seq.forward_line,
                             "why": "every op between forward's inputs and the first block acts per token: split at "
                                    "the root"})
    shape = "root split" if root else "first-block split"
    if not root:
        for b in seq.root_blockers:
            evidence.append({**_ev(b), "why": f"no root split: {b.why}"})
    hybrid: list[dict] = []
    lists = [lf for lf in seq.lists if blocks.get(lf.attr) is None or blocks[lf.attr].built]
    for lf in seq.lists:
        if lf not in lists:
            evidence.append({"file": seq.file, "line": lf.loop_line,
                             "why": f"`{lf.attr}` is not built for this config: left out of the plan"})
    per_module = {lf.attr for lf in lists if blocks.get(lf.attr) is not None and blocks[lf.attr].surgery}
    for i, lf in enumerate(lists):
        if lf.attr in per_module:
            shape = "sub-module hooks"
            _submodule_hooks(plan, blocks[lf.attr], evidence, unknowns)
            continue
        for bi in lf.inputs:
            for p in bi.token_params:
                if p not in split_params and bi.role != "stream":
                    plan.setdefault("", {})[p] = {"split_dim": 1, "expected_dims": 2, "split_output": False}
                    split_params.add(p)
                    evidence.append({**(_ev(bi.producer_at) or {"file": seq.file, "line": lf.loop_line}),
                                     "why": f"`{bi.param}` is built from `{p}`, whose dim 1 is read as a token axis "
                                            f"(per-token conditioning): split `{p}` at the root when it is 2-D"})
        if lf.fresh and not (root and i == 0):
            start = lf.offset if lf.offset is not None else "{start}"
            fresh = [p for p in lf.streams if p in lf.fresh_streams] or list(lf.streams)
            plan.setdefault(f"{lf.attr}.{start}", {}).update({p: dict(STREAM) for p in fresh})
            if lf.offset is None:
                unknowns.append(f"the first block index of the walk over `{lf.attr}` (line {lf.loop_line}) is not "
                                "known statically")
            if i > 0:
                evidence.append({"file": seq.file, "line": lf.loop_line,
                                 "why": f"the walk over `{lf.attr}` at line {lf.loop_line} gets "
                                        f"{', '.join(f'`{p}`' for p in fresh)} not yet split: split at block {start}"})
        for bi in lf.inputs:
            if bi.role != "position":
                continue
            covered = root and bool(set(bi.from_params) & split_params) and not bi.local_length
            if covered or (bi.producer_kind == "param" and bi.arg in split_params):
                continue
            if root and i == 0 and bi.producer_kind == "param":
                note = seq.annotations.get(bi.arg, "")
                spec = ([{"split_dim": 0, "expected_dims": 2, "split_output": False} for _ in range(2)]
                        if "tuple" in note.lower() else dict(STREAM))
                plan[""][bi.arg] = spec
                split_params.add(bi.arg)
                evidence.append({"file": seq.file, "line": seq.forward_line,
                                 "why": f"`{bi.arg}` arrives ready-made from the caller: cut it with the tokens at the "
                                        "root (its layout is assumed; confirm in verify)"})
                unknowns.append(f"layout of the position input `{bi.arg}` (which dim is the sequence)")
                continue
            if bi.producer_kind == "module" and not bi.in_loop:
                layout = facts.position_modules.get(bi.producer or "", {})
                n = layout.get("outputs") or 1
                entry = {"split_dim": layout.get("split_dim", 0), "expected_dims": layout.get("expected_dims", 2),
                         "split_output": True}
                plan.setdefault(bi.producer, {str(k): dict(entry) for k in range(n)})
                evidence.append({**(_ev(bi.producer_at) or {"file": seq.file, "line": lf.loop_line}),
                                 "why": f"`{bi.param}` is built by `self.{bi.producer}` on the full sequence: split "
                                        f"its output ({layout.get('why', 'layout not read')})"})
            elif bi.producer_kind == "param" and not root:
                note = seq.annotations.get(bi.arg, "")
                if "tuple" in note.lower():
                    spec: Any = [{"split_dim": 0, "expected_dims": 2, "split_output": False} for _ in range(2)]
                    why = f"a tuple ({note}) of [S, D] tables: split each element (layout assumed; confirm in verify)"
                else:
                    spec, why = dict(STREAM), "split at every block's input"
                plan.setdefault(f"{lf.attr}.*", {})[bi.param] = spec
                evidence.append({"file": seq.file, "line": seq.forward_line,
                                 "why": f"`{bi.param}` arrives ready-made from the pipeline as `{bi.arg}` and is "
                                        f"passed to every block: {why}"})
            else:
                plan.setdefault(f"{lf.attr}.*", {})[bi.param] = dict(STREAM)
                evidence.append({**(_ev(bi.producer_at) or {"file": seq.file, "line": lf.loop_line}),
                                 "why": f"`{bi.param}` comes from {bi.producer_kind} `{bi.producer}`, which no hook "
                                        "can split: split it at every block's input"})
                risks.append(f"`{bi.param}` ({lf.attr}): split at each block; if it is a nested tuple, hooks cannot "
                             f"split it and `{bi.producer}` needs a minimal patch instead")
        for bi in lf.inputs:
            # a text sequence every block reads but does not return: cross-attention keys and values. Ulysses
            # gathers K/V across ranks, so each rank must hold its own part: split it at every block
            if bi.role != "other" or bi.param not in TEXT_STREAMS or (bi.arg in split_params and bi.producer_kind
                                                                     == "param"):
                continue
            plan.setdefault(f"{lf.attr}.*", {})[bi.param] = dict(STREAM)
            evidence.append({**(_ev(bi.producer_at) or {"file": seq.file, "line": lf.loop_line}),
                             "why": f"`{bi.param}` is read by every block of `{lf.attr}` and not returned "
                                    "(cross-attention text): split it at every block's input, so the all-to-all "
                                    "gathers whole keys and values"})
        for side in lf.side_modules:
            key = f"{side.module}.*" if side.indexed else side.module
            plan.setdefault(key, {"0": {"split_dim": 1, "expected_dims": 3, "split_output": True}})
            evidence.append({**_ev(side.at), "why": f"{side.at.why}: split `{key}`'s output to the local sequence"})
    for i, lf in enumerate(lists[:-1]):
        if lf.attr in per_module:
            continue
        if lf.mixed_after:
            key = f"{lf.attr}.{lf.last}" if lf.last is not None else _last_block(lf.attr, blocks.get(lf.attr), facts)
            plan[key] = dict(GATHER)
            for m in lf.mixing or ():
                evidence.append({**_ev(m), "why": f"gather `{lf.attr}` at its last block: {m.why}"})
            if "{" in key:
                unknowns.append(f"the length of `{lf.attr}` is not known statically: fill in the last index")
    last = lists[-1] if lists else seq.lists[-1]
    blocked = list(seq.gather_blocked) + ([] if root else list(seq.gather_blocked_unless_root))
    if last.attr in per_module:
        pass  # every block already gathers around its sub-modules
    elif seq.gather and not blocked:
        plan[seq.gather] = dict(GATHER)
        evidence.append({**(_ev(seq.gather_at) or {"file": seq.file, "line": 0}),
                         "why": f"`self.{seq.gather}` is the last module applied to the sequence before it is "
                                "reshaped: gather its output"})
    else:
        key = f"{last.attr}.{last.last}" if last.last is not None else _last_block(last.attr, blocks.get(last.attr),
                                                                                      facts)
        plan[key] = dict(GATHER)
        for b in blocked:
            evidence.append({**_ev(b), "why": f"gather at the last block: {b.why}"})
        if not seq.gather and not blocked:
            unknowns.append("no output module found after the last block: gathering the last block's output")
    joint = any(len(lf.streams) > 1 for lf in seq.lists)
    extras = _extras(facts, seq, plan, joint, hybrid)
    approach = "hybrid" if extras["hybrid_patch"]["needed"] else "hook"
    confidence = "medium" if not unknowns else "low"
    if any(bi.producer_kind == "unknown" for lf in seq.lists for bi in lf.inputs if bi.role == "position"):
        confidence = "low"
    if root:
        risks += [f"{r.why} ({r.file.rsplit('/', 1)[-1]}:{r.line})" for r in seq.root_risks]
    seen: set = set()
    evidence = [e for e in evidence if not ((e["file"], e["line"], e["why"]) in seen
                                            or seen.add((e["file"], e["line"], e["why"])))]
    out.update(approach=approach, shape=shape, plan=plan, confidence=confidence, evidence=evidence,
               risks=risks + extras.pop("risks"), unknowns=unknowns, **extras)
    out["diffusers_plan"] = _compare(facts, plan)
    return out


def _submodule_hooks(plan: dict, block: BlockStructure, evidence: list, unknowns: list) -> None:
    """Split and gather around every attention / FFN call: the block itself needs the full sequence."""
    for e in block.surgery:
        evidence.append({**_ev(e), "why": f"sub-module hooks for `{block.attr}`: {e.why}"})
    seen: list[str] = []
    for call in block.calls:
        if call.path in seen:
            continue
        seen.append(call.path)
        inputs = {p: dict(STREAM) for p, role in call.inputs.items() if role in ("stream", "position")}
        if inputs:
            plan[f"{block.attr}.*.{call.path}"] = inputs
    n = block.length
    if not isinstance(n, int):
        unknowns.append(f"the length of `{block.attr}` is not known statically: one gather per block and sub-module")
        for path in seen:
            plan[f"{block.attr}.{{i}}.{path}"] = dict(GATHER)
        return
    for path in seen:
        for i in range(n):
            plan[f"{block.attr}.{i}.{path}"] = dict(GATHER)
    evidence.append({"file": block.evidence[0].file if block.evidence else "", "line": 0,
                     "why": f"gather after each of {', '.join(seen)} in all {n} blocks (extra communication: the cost "
                            "of an in-block sequence cut)"})


def _last_block(attr: str, block: BlockStructure | None, facts: ParallelFacts) -> str:
    length = block.length if block is not None else None
    return f"{attr}.{length - 1}" if isinstance(length, int) and length > 0 else f"{attr}.{{n-1}}"


def _extras(facts: ParallelFacts, seq: SequenceFact | None, plan: dict, joint: bool, hybrid: list) -> dict:
    risks: list[str] = []
    # masks
    masks = list(seq.masks if seq else ()) + list(facts.pipeline_masks)
    proc_masks = [a for b in facts.blocks for a in b.attentions if a.mask_at is not None]
    layouts = [m.layout for m in masks if m.layout]
    kind = "2-D" if any(lay.startswith("2-D") for lay in layouts) else ("1-D" if layouts else None)
    needed = bool(masks) and joint and bool(proc_masks)
    mask = {"needed": needed, "kind": kind if needed else None,
            "where": [{"name": m.name, "built_in": m.where, "layout": m.layout, **_ev(m.at)} for m in masks],
            "why": ("a mask over the joint (text + image) sequence reaches attention: Ulysses reorders the sequence "
                    "as [text_0, img_0, text_1, img_1, ...], so the mask must be permuted to match "
                    + ("(key dim only)" if kind == "1-D" else "(query and key dims)" if kind == "2-D" else
                       "(layout not read statically: dump it on the first step)"))
            if needed else ("no mask reaches a joint attention" if masks else "no attention mask found")}
    if needed:
        mask["mechanism"] = ("a pre-hook on every block that takes the mask, installed after cache-dit's split "
                             "hooks: it permutes the mask into all-to-all order from each rank's local lengths "
                             "(no change to forward)")
        risks.append("silent corruption if the mask is not reordered: a garbled top-left corner, PSNR stuck ~28-30")
    # rope drift
    drift = []
    if seq is not None and "" in plan:
        for lf in seq.lists:
            for bi in lf.inputs:
                if bi.role == "position" and bi.local_length:
                    drift.extend(_ev(e) for e in bi.local_length)
    rope = {"needed": bool(drift), "evidence": drift,
            "why": "positions are derived from the local sequence length after a root split: compute them on the "
                   "global length and slice per rank" if drift else
                   ("no position input is derived from a local length under this plan" if "" in plan else
                    "the split happens after positions are built (not at the root): no drift")}
    # ulysses anything
    heads = [(b.attr, a.path, a.heads, a.kv_heads) for b in facts.blocks for a in b.attentions]
    uaa: dict[str, Any] = {}
    for size in CP_SIZES:
        why = []
        for attr, path, h, kv in heads:
            if h and h[1] is not None and h[1] % size:
                why.append(f"{attr}.{path}: {h[0]}={h[1]} not divisible by {size}")
            if kv and kv[1] is not None and kv[1] % size:
                why.append(f"{attr}.{path}: {kv[0]}={kv[1]} not divisible by {size}")
        unknown = any(h is None or h[1] is None for _, _, h, _ in heads)
        uaa[str(size)] = {"needed": bool(why), "why": why or (["head count not known statically"] if unknown else []),
                          "note": "also use --ulysses-anything when the text length is not a multiple of the CP size"
                          if joint else None}
    hp = {"needed": bool(hybrid), "method": hybrid[0]["method"] if hybrid else None,
          "why": hybrid[0]["why"] if hybrid else "every sequence tensor is reachable by a hook"}
    return {"mask_reorder": mask, "rope_drift_fix": rope, "ulysses_anything": uaa, "hybrid_patch": hp, "risks": risks}


def _compare(facts: ParallelFacts, plan: dict) -> dict | None:
    declared = facts.diffusers_cp_plan
    if declared is None:
        return None
    ours, theirs = set(plan), set(declared)
    return {"plan": declared, "at": _ev(facts.diffusers_cp_plan_at),
            "same_keys": ours == theirs, "only_ours": sorted(ours - theirs), "only_diffusers": sorted(theirs - ours),
            "note": "diffusers declares its own plan; where the keys agree, reuse it"}
