"""The analysis result cache (`integrate analyze`, INTEGRATE_CACHE_DIR) answers only while everything the analysis
read is as it was: every file it opened (the transformer's and the pipeline's, every module it traced names
through, a --block-class source, cache-dit's registries), every path it looked for and did not find (a module a
later edit creates, a package installed since) and every folder it listed. Each test is the attack: analyse with
the cache on, change what the analysis read so the verdict changes, analyse again: the new verdict, never the
stored one."""

from __future__ import annotations

import importlib
import io
import json
import textwrap
from pathlib import Path

import pytest
from conftest import EXAMPLE, ROOT, source_flags

from integrate import api, cache

MODEL = '''
from torch import nn
{imports}


class Model(nn.Module):
    def __init__(self, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([Block(8) for _ in range(depth)])

    def forward(self, hidden_states, encoder_hidden_states, temb):
        for block in self.blocks:
            hidden_states, encoder_hidden_states = block(hidden_states, encoder_hidden_states, temb)
        return hidden_states
'''

BLOCK = '''
from torch import nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, hidden_states, encoder_hidden_states, temb):
        hidden_states = hidden_states + self.proj(hidden_states)
        encoder_hidden_states = encoder_hidden_states + self.proj(encoder_hidden_states)
        return {returned}
'''
IN_ORDER, SWAPPED = "hidden_states, encoder_hidden_states", "encoder_hidden_states, hidden_states"


@pytest.fixture
def cached(tmp_path, monkeypatch):
    """The result cache on, in a folder of this test's own."""
    monkeypatch.setenv("INTEGRATE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _blocks(flags) -> dict:
    (bl,) = api.analysis_json(flags)["transformer"]["block_lists"]
    return bl


def _package(root: Path, imports: str) -> Path:
    """A model repository as a package: pkg/model.py importing its block class as `imports` says."""
    pkg = root / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text(textwrap.dedent(MODEL.format(imports=imports)))
    return pkg


def test_an_edit_to_the_module_the_block_class_is_imported_from_is_a_new_verdict(tmp_path, cached):
    pkg = _package(tmp_path, "from .blocks import Block")
    (pkg / "blocks.py").write_text(textwrap.dedent(BLOCK.format(returned=IN_ORDER)))
    flags = source_flags(pkg, None)
    assert _blocks(flags)["forward_pattern"] == "Pattern_0"
    (pkg / "blocks.py").write_text(textwrap.dedent(BLOCK.format(returned=SWAPPED)))
    assert _blocks(flags)["forward_pattern"] == "Pattern_1"


def test_an_edit_to_a_block_class_source_named_on_the_command_line_is_a_new_verdict(tmp_path, cached):
    source = tmp_path / "kernels" / "blocks.py"
    source.parent.mkdir()
    source.write_text(textwrap.dedent(BLOCK.format(returned=IN_ORDER)))
    model = textwrap.dedent(MODEL.format(imports="from fastdit_kernels.blocks import Block"))
    flags = source_flags(tmp_path, model, block_class=(f"blocks={source}:Block",))
    assert _blocks(flags)["forward_pattern"] == "Pattern_0"
    source.write_text(textwrap.dedent(BLOCK.format(returned=SWAPPED)))
    assert _blocks(flags)["forward_pattern"] == "Pattern_1"


def test_a_module_that_was_missing_is_read_once_it_exists(tmp_path, cached):
    """The first analysis looked for pkg/blocks.py and did not find it: that absence is part of what it read."""
    pkg = _package(tmp_path, "from .blocks import Block")
    flags = source_flags(pkg, None)
    first = _blocks(flags)
    assert first["confidence"] == "unknown" and "blocks" in first["why"], first
    (pkg / "blocks.py").write_text(textwrap.dedent(BLOCK.format(returned=SWAPPED)))
    second = _blocks(flags)
    assert second["is_blocks"] and second["forward_pattern"] == "Pattern_1", second


def test_a_package_installed_after_the_first_analysis_is_read(tmp_path, cached, monkeypatch):
    """`fastdit_kernels` is not installed: the list is unknown. Installed (put on the import path), the same
    command answers what an analysis without the cache answers."""
    model = textwrap.dedent(MODEL.format(imports="from fastdit_kernels.blocks import Block"))
    flags = source_flags(tmp_path, model)
    first = _blocks(flags)
    assert first["confidence"] == "unknown" and "not installed" in first["why"], first
    site = tmp_path / "site"
    (site / "fastdit_kernels").mkdir(parents=True)
    (site / "fastdit_kernels" / "__init__.py").write_text("")
    (site / "fastdit_kernels" / "blocks.py").write_text(textwrap.dedent(BLOCK.format(returned=IN_ORDER)))
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    second = _blocks(flags)
    assert "not installed" not in second["why"], second
    (fresh,) = api.analysis_json(flags, use_cache=False)["transformer"]["block_lists"]
    assert second == fresh


def test_every_file_the_analysis_opens_is_a_dependency_of_its_cache_entry(cached, monkeypatch):
    """A cold analysis of the shipped example, with every file it opens recorded: each source and metadata file
    among them is one the cache entry checks before it answers."""
    opened: set[str] = set()
    real_open = io.open

    def recording_open(file, *args, **kwargs):
        if isinstance(file, (str, Path)):
            opened.add(str(Path(file).resolve()))
        return real_open(file, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(io, "open", recording_open)
        m.setattr("builtins.open", recording_open)
        api.analysis_json(api.flags_for(str(EXAMPLE)))
    (entry,) = [json.loads(p.read_text()) for p in cached.glob("*.json")]
    own = [ROOT / stage for stage in ("integrate", "gate", "analyzers", "decisions", "templates", "verify")]
    read = {p for p in opened if p.endswith((".py", ".json")) and Path(p).parent != cached.resolve()
            and not any(Path(p).is_relative_to(folder) for folder in own)}
    checked = set(entry["deps"]) | set(entry["absent"])  # a file looked for and not there: its absence
    assert read and read <= checked, sorted(read - checked)[:5]
    assert cache.load(next(iter(cached.glob("*.json"))).stem) is not None  # and the entry answers a warm run
