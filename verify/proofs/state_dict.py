"""State dict: importing the plugin changes no parameter, and a PatchFunctor only renames (moves blocks
between lists) without changing a tensor's shape or dtype. Judged from the cache proof's process."""

from __future__ import annotations

from ..records import StateDictProof

NAME = "state_dict"
ORDER = 10
KIND = "derived"
FROM = "cache"  # judged from the cache proof's process
RECORD = StateDictProof  # the record in the report
REQUESTABLE = False  # runs with the cache proof
REPAIRS = ()
TITLE = "state-dict"
SUMMARY = "the plugin's import and the PatchFunctor keep every parameter"


def lines(record: dict) -> list[str]:
    return []


def details(record: dict) -> list[str]:
    return []


def judge(base: dict, variant: dict) -> StateDictProof:
    """`base`: the plain model's {key: [shape, dtype]}; `variant`: the cache worker's report."""
    problems = []
    imported = variant.get("state_dict_import")
    if imported is not None and imported != base:
        problems.append(f"importing the plugin changes the state dict ({_diff(base, imported)})")
    patched = variant.get("state_dict_patched")
    renamed = note = None
    if patched is not None and patched != base:
        same_tensors = sorted(map(tuple, base.values())) == sorted(map(tuple, patched.values()))
        renamed = _diff(base, patched)
        if not same_tensors:
            problems.append(f"the PatchFunctor changes parameter shapes or dtypes ({_diff(base, patched)})")
        else:
            note = ("the PatchFunctor moves blocks between lists (keys renamed, tensors unchanged); checkpoints load "
                    "before cache-dit applies it")
    extra = {k: v for k, v in (("renamed_by_patch_functor", renamed), ("note", note)) if v is not None}
    if problems:
        return StateDictProof("fail", why="; ".join(problems), keys=len(base), **extra)
    return StateDictProof("pass", keys=len(base), **extra)


def _diff(a: dict, b: dict) -> str:
    gone, new = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    changed = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    parts = []
    if gone:
        parts.append(f"{len(gone)} keys gone, e.g. {gone[0]}")
    if new:
        parts.append(f"{len(new)} new, e.g. {new[0]}")
    if changed:
        parts.append(f"{len(changed)} changed, e.g. {changed[0]}: {a[changed[0]]} -> {b[changed[0]]}")
    return "; ".join(parts) or "same"
