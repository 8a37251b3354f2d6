"""The verify report: the run's head, then one key per proof in the registry's order (`proofs/`).

Its fields are the registry's, so a new proof module is a new key with no edit here; the record is an
ordinary frozen dataclass (`to_json`, `from_json` and the schema check read it like any other).
"""

from __future__ import annotations

from dataclasses import field, make_dataclass

from . import proofs
from .records import FixtureReport, PluginRef, VerifyModel

BAD = ("fail", "error", "needs-code", "vacuous")  # a proof that failed, stopped, waits on a stub or proved nothing


def _failed(self) -> bool:
    """A proof that ran failed, erred, proved nothing (vacuous), or waits on a stub (`integrate verify` exits 1)."""
    return self.fixture.status in ("needs-edit", "error") or any(
        getattr(self, name).status in BAD for name in proofs.REPORTED)


VerifyReport = make_dataclass(
    "VerifyReport",
    [("schema", str), ("schema_version", str), ("model", VerifyModel), ("plugin", PluginRef),
     ("fixture", FixtureReport), *((p.NAME, p.RECORD) for p in proofs.ALL), ("seconds", float, field(default=0.0))],
    frozen=True, namespace={"__module__": __name__, "failed": property(_failed),
                            "__doc__": "What `integrate verify` reports: one record per proof."})

__all__ = ["BAD", "VerifyReport"]
