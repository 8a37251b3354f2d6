"""Full size, on the meta device: the real config (the model folder's, else the class defaults) built with no
memory, then what no tiny model can show:

- every cached block list is at least as long as cache-dit's default `Fn_compute_blocks` and
  `Bn_compute_blocks` (cache-dit asserts both when the cache starts; the defaults are read from the installed
  cache-dit's config class);
- each head count the TP plan divides (`shard_div_attr`) and each attention's head count, divided by TP and
  Ulysses sizes 2, 4 and 8.

Fails when a cached list is too short or a head count does not divide by 2 (the least any TP or Ulysses run
needs); sizes 4 and 8 are reported for the GPU matrix. Sequence lengths depend on the resolution a user
picks and are not checked here (`not_checked` says so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..records import FullSizeHeads, FullSizeList, FullSizeProof

if TYPE_CHECKING:
    from integrate.decisions.records import Plan

NAME = "full_size"
ORDER = 50
KIND = "meta"
RECORD = FullSizeProof
REQUESTABLE = True
REPAIRS = ()
TITLE = "full-size"
SUMMARY = "the real config on the meta device: cached list lengths vs cache-dit's defaults, head divisibility"
SIZES = (2, 4, 8)


def job(plan: Plan) -> dict:
    """What the worker measures: the cached lists, and the head attributes per block list."""
    heads: list[dict] = []
    for bl in plan.parallelism.tp.block_lists if plan.parallelism.tp else ():
        for module, attrs in (bl.shard_div_attr or {}).items():
            for attr in attrs:
                heads.append({"block_list": bl.attr, "module": module, "attr": attr})
        for module, h in (bl.heads or {}).items():
            for pair in (h.heads, h.kv_heads):
                if pair and pair[0] and not any(x["block_list"] == bl.attr and x["module"] == module
                                                and x["attr"] == pair[0] for x in heads):
                    heads.append({"block_list": bl.attr, "module": module, "attr": pair[0]})
    return {"mode": "full_size", "lists": [b.attr for b in plan.cache.block_lists], "heads": heads}


def judge(result: dict | None, error: str | None) -> FullSizeProof:
    if result is None:
        return FullSizeProof("error", why=error or "the full-size worker reported nothing")
    if result.get("error"):
        return FullSizeProof("error", why=result["error"])
    fn, bn = result["fn"], result["bn"]
    lists = []
    for attr, n in result["lists"].items():
        if n is None:
            lists.append(FullSizeList(attr, None, fn, bn, False, why="not a block list on the real model"))
            continue
        short = [f"{name} {v}" for name, v in (("Fn_compute_blocks", fn), ("Bn_compute_blocks", bn)) if v > n]
        lists.append(FullSizeList(attr, n, fn, bn, not short, **(
            {"why": f"{n} blocks < cache-dit's default {' and '.join(short)}: cache-dit's assert stops the "
                    "cache at start; the adapter must not list it, or the cache config must lower the counts"}
            if short else {})))
    heads = []
    for h in result["heads"]:
        value = h["value"]
        divides = {f"{kind}{n}": isinstance(value, int) and value % n == 0 for kind in ("tp", "ulysses") for n in SIZES}
        heads.append(FullSizeHeads(h["block_list"], h["module"], h["attr"], value, divides))
    problems = [f"list `{x.attr}`: {x.why}" for x in lists if not x.ok]
    problems += [f"`{h.block_list}[0].{h.module}.{h.attr}` = {h.value} does not divide by 2" for h in heads
                 if not h.divides["tp2"]]
    not_checked = ("sequence lengths per CP size: they depend on the resolution and frame count a run uses",)
    if problems:
        return FullSizeProof("fail", why="; ".join(problems), lists=tuple(lists), heads=tuple(heads),
                             not_checked=not_checked)
    return FullSizeProof("pass", lists=tuple(lists), heads=tuple(heads), not_checked=not_checked)


def lines(record: dict) -> list[str]:
    """The terminal's lines on each cached list's length and each head count's divisibility."""
    out = [f"  list {x['attr']}: {x['blocks']} blocks (cache-dit defaults Fn {x['fn_compute_blocks']}, "
           f"Bn {x['bn_compute_blocks']}): {'ok' if x['ok'] else 'too short'}" for x in record.get("lists", [])]
    for h in record.get("heads", []):
        no = [k for k, ok in h["divides"].items() if not ok]
        out.append(f"  {h['block_list']}[0].{h['module']}.{h['attr']} = {h['value']}: "
                   + (f"does not divide for {', '.join(no)}" if no else "divides for TP and Ulysses 2, 4, 8"))
    return out


def details(record: dict) -> list[str]:
    return []
