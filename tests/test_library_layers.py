"""A transformer whose layers an installed library builds, the library exporting its classes lazily (its
`__init__` re-exports whole modules under `if TYPE_CHECKING:`, as transformers does): the base class is followed
through those star imports to the file that defines it (issue 36, item 8; the real case is OmniGen on
transformers' Phi3Model, measured by bench/bench_thirdparty.py)."""

from __future__ import annotations

import sys
import textwrap

import pytest
from conftest import analyse_source

FILES = {
    "lazylib/__init__.py": '''
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from .models import *
        else:
            import sys
            sys.modules[__name__] = None  # never imported by the analysis
    ''',
    "lazylib/models/__init__.py": '''
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from .alpha import *
            from .beta import *
    ''',
    "lazylib/models/alpha/__init__.py": "from .modeling_alpha import *\n",
    "lazylib/models/alpha/modeling_alpha.py": "class AlphaModel:\n    pass\n",
    "lazylib/models/beta/__init__.py": "from .configuration_beta import *\nfrom .modeling_beta import *\n",
    "lazylib/models/beta/configuration_beta.py": "class BetaConfig:\n    pass\n",
    "lazylib/models/beta/modeling_beta.py": '''
        from torch import nn


        class BetaLayer(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.proj = nn.Linear(dim, dim)

            def forward(self, hidden_states, mask=None):
                hidden_states = hidden_states + self.proj(hidden_states)
                return hidden_states


        class BetaModel(nn.Module):
            def __init__(self, dim=8, depth=2):
                super().__init__()
                self.layers = nn.ModuleList([BetaLayer(dim) for _ in range(depth)])
    ''',
}

MODEL = '''
from lazylib import BetaModel


class Wrapped(BetaModel):
    def forward(self, hidden_states, mask=None):
        for layer in self.layers:
            hidden_states = layer(hidden_states, mask=mask)
        return hidden_states
'''


@pytest.fixture
def lazylib(tmp_path, monkeypatch):
    for rel, text in FILES.items():
        path = tmp_path / "site" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield tmp_path
    sys.modules.pop("lazylib", None)


def test_layers_built_by_a_lazily_exporting_library_are_found(lazylib):
    data = analyse_source(lazylib, MODEL, "Wrapped")
    (bl,) = [b for b in data["transformer"]["block_lists"] if b["attr"] == "layers"]
    assert bl["is_blocks"] and bl["block_class"] == "BetaLayer", bl
    assert bl["block_file"].endswith("modeling_beta.py") and bl["forward_pattern"] == "Pattern_3", bl


def test_the_library_is_read_never_imported(lazylib):
    sys.modules.pop("lazylib", None)
    analyse_source(lazylib, MODEL, "Wrapped")
    assert "lazylib" not in sys.modules
