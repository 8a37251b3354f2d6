"""Every byte a user gets stays the same unless a change means it to (tests/snapshot.py explains the files)."""

import difflib

import pytest
from snapshot import MODELS, capture, stored


@pytest.mark.parametrize("name", sorted(MODELS))
def test_outputs_match_the_stored_snapshot(name, tmp_path, monkeypatch):
    monkeypatch.setenv("INTEGRATE_CACHE_DIR", "")
    got, want = capture(name, tmp_path), stored(name)
    assert sorted(got) == sorted(want), "a different set of files was written"
    for rel in want:
        if got[rel] != want[rel]:
            diff = "".join(list(difflib.unified_diff(want[rel].splitlines(True), got[rel].splitlines(True),
                                                     f"stored/{rel}", f"now/{rel}"))[:60])
            pytest.fail(f"{name}/{rel} differs from its snapshot (python tests/snapshot.py --update {name} if "
                        f"intended):\n{diff}")
