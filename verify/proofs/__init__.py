"""The CPU proofs: every module in this folder is one proof, found when the package is imported.

A proof module declares what the rest of the tool reads about it:

- `NAME`: its key in the verify report, in a survey row's verify summary and as a `--proof` choice;
- `ORDER`: its place among the report's keys;
- `KIND`: how verify runs it —
  `"paired"`: over gloo processes of its own (2, or a variant's `world`), one set per configuration; it has
  `not_planned(plan)`, `variants(plan)` and `progress(variants)`, and `verify/paired.py` judges it against the
  1-process run; one that needs another tiny config declares `config(fixture_config)` (the keys it changes,
  key -> (fixture's, its own), or why it cannot): its variants and a 1-process run of its own use that config;
  `"single"`: one process beside the baseline, judged by its `judge`;
  `"derived"`: judged from another proof's process (`FROM` names that proof);
  `"meta"`: no fixture: the real config on the meta device (`job(plan)`, `judge(result, error)`);
  `"component"`: no fixture: a pipeline part other than the transformer (a text encoder, the VAE) built tiny from
  its config and run through its planner over gloo processes of its own (`verify/component.py`); it has
  `parts(plan)`, `not_planned(plan)`, `engaged(report, reports)`, `evidence(report)` and `passed(report)`;
- `RECORD`: the record it reports; `REQUESTABLE`: a `--proof` choice (run with no `--proof` too, unless it
  declares `BY_DEFAULT = False`);
- `REPAIRS`: the plan decisions `integrate repair` may change when it fails (the prefixes of
  `Alternative.decision`), `()` when repair cannot act on it;
- `TITLE` (how messages name it) and `SUMMARY` (one line for help texts);
- `lines(record)`: what the terminal shows of its JSON beyond what every proof shows (status, why, variants,
  first divergence), and `details(record)`: the same for PR.md's one-line summary.

The report, its text, PR.md, the survey's rows, the audit, repair and the CLI read this registry; adding a
proof is adding its module (and its test). Importing the registry is cheap: numpy and the judges' helpers are
imported when a proof is judged, since the CLI reads the registry at start-up.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

KINDS = ("paired", "single", "derived", "meta", "component")
_DECLARED = ("NAME", "ORDER", "KIND", "RECORD", "REQUESTABLE", "REPAIRS", "TITLE", "SUMMARY", "lines", "details")
_BY_KIND = {"paired": ("not_planned", "variants", "progress"), "single": ("judge",), "derived": ("FROM", "judge"),
            "meta": ("job", "judge"),
            "component": ("parts", "not_planned", "engaged", "evidence", "passed")}


def _load() -> tuple[ModuleType, ...]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        kind = getattr(module, "KIND", None)
        missing = [a for a in _DECLARED + _BY_KIND.get(kind, ()) if not hasattr(module, a)]
        if kind not in KINDS or missing:
            raise TypeError(f"verify proof {module.__name__}: KIND must be one of {', '.join(KINDS)} and it must "
                            f"declare {', '.join(missing) or 'KIND'}")
        found.append(module)
    found.sort(key=lambda m: m.ORDER)
    names = [m.NAME for m in found]
    if len(set(names)) != len(names):
        raise TypeError(f"verify proofs: a NAME is declared twice ({', '.join(names)})")
    return tuple(found)


ALL = _load()
BY_NAME = {p.NAME: p for p in ALL}
REPORTED = tuple(p.NAME for p in ALL)  # the report's keys, in order
CHOICES = tuple(p.NAME for p in ALL if p.REQUESTABLE)  # `verify --proof`
# `verify` with no --proof (`BY_DEFAULT = False`: only when asked)
DEFAULTS = tuple(p.NAME for p in ALL if p.REQUESTABLE and getattr(p, "BY_DEFAULT", True))
PAIRED = tuple(p for p in ALL if p.KIND == "paired")
REPAIRABLE = tuple(p.NAME for p in ALL if p.REPAIRS)  # `repair --proof`
# `audit --proof`: the proofs that run a model through an integration (cache-dit's own, or ours)
AUDITED = tuple(p.NAME for p in ALL if p.NAME in DEFAULTS and p.KIND in ("single", "paired"))

__all__ = ["ALL", "AUDITED", "BY_NAME", "CHOICES", "DEFAULTS", "KINDS", "PAIRED", "REPAIRABLE", "REPORTED"]
