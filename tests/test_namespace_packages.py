"""A repository whose package folders have no __init__.py (PEP 420 namespace packages) and imports itself
absolutely: `from mypkg.models.block import Block` in mypkg/models/model.py is a file of the repository, resolved
from the folder above `mypkg/`, never reported as a library that is not installed (issue 36; measured on
rhymes-ai/Allegro by bench/bench_thirdparty.py). The search is bounded to the file's own folders: a folder named
like the import elsewhere on disk is not taken for it."""

from __future__ import annotations

import textwrap
from pathlib import Path

from conftest import analyse_source

from integrate.resolve import External, Resolved, Workspace

MODEL = '''
from torch import nn
from mypkg.models.block import Block


class Model(nn.Module):
    def __init__(self, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([Block(8) for _ in range(depth)])

    def forward(self, x, c):
        for block in self.blocks:
            x = block(x, c)
        return x
'''

BLOCK = '''
from torch import nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, hidden_states, cond):
        hidden_states = hidden_states + self.proj(cond)
        return hidden_states
'''


def _layout(base: Path, init: tuple[str, ...] = ()) -> Path:
    """base/mypkg/models/{model.py, block.py}; `init`: the folders (relative to base) given an __init__.py."""
    models = base / "mypkg" / "models"
    models.mkdir(parents=True)
    (models / "block.py").write_text(textwrap.dedent(BLOCK))
    for folder in init:
        (base / folder / "__init__.py").write_text("")
    return models


def test_an_absolute_import_through_namespace_folders_is_read_from_the_repository(tmp_path):
    models = _layout(tmp_path / "repo")
    (bl,) = analyse_source(models, textwrap.dedent(MODEL))["transformer"]["block_lists"]
    assert bl["is_blocks"] is True and bl["block_class"] == "Block", bl
    assert bl["block_file"] == str((models / "block.py").resolve()), bl
    assert bl["forward_pattern"] and bl["roles"]["hidden_states"] == "hidden_states", bl
    assert "not installed" not in bl["why"]


def test_the_namespace_root_names_the_modules(tmp_path):
    """The file's import name is read from the root its imports resolve from, so generated code and the verify
    worker import `mypkg.models.model` from the repository's folder, as the repository itself does."""
    models = _layout(tmp_path / "repo")
    (models / "model.py").write_text(textwrap.dedent(MODEL))
    ws = Workspace()
    src = ws.load(models / "model.py")
    assert src.package_root == (tmp_path / "repo").resolve()
    assert src.dotted_name == "mypkg.models.model"
    found = ws.resolve(src, "Block")
    assert isinstance(found, Resolved) and found.src.path == (models / "block.py").resolve()
    assert found.src.dotted_name == "mypkg.models.block"


def test_a_regular_package_inside_a_namespace_folder(tmp_path):
    """mypkg/ has no __init__.py, mypkg/models/ has one: the regular package's root is mypkg/, and the import
    of `mypkg.models.block` still resolves from the folder above it."""
    models = _layout(tmp_path / "repo", init=("mypkg/models",))
    (bl,) = analyse_source(models, textwrap.dedent(MODEL))["transformer"]["block_lists"]
    assert bl["is_blocks"] is True and bl["block_file"] == str((models / "block.py").resolve()), bl


def test_a_folder_of_that_name_outside_the_files_own_folders_is_not_taken(tmp_path):
    """`mypkg/` beside the repository (not one of the model file's folders) is not the import's package: the
    block stays a library that is not installed here, unknown, with its import line."""
    _layout(tmp_path / "elsewhere")
    app = tmp_path / "repo" / "app"
    app.mkdir(parents=True)
    (bl,) = analyse_source(app, textwrap.dedent(MODEL))["transformer"]["block_lists"]
    assert bl["is_blocks"] is None and bl["confidence"] == "unknown", bl
    assert "mypkg.models.block" in bl["why"] and "not installed" in bl["why"] and "model.py:3" in bl["why"], bl
    ws = Workspace()
    src = ws.load(app / "model.py")
    assert src.package_root is None
    assert isinstance(ws.resolve(src, "Block"), External)


def test_an_installed_library_is_not_resolved_by_the_walk(tmp_path):
    """`import torch` in a repository one of whose folders is named `torch` but holds no such module is still
    the installed torch (external)."""
    models = tmp_path / "repo" / "torch" / "models"
    models.mkdir(parents=True)
    (models / "model.py").write_text("from torch.nn import Linear\n")
    ws = Workspace()
    src = ws.load(models / "model.py")
    assert src.package_root is None
    assert isinstance(ws.resolve(src, "Linear"), External)


def test_the_generated_launcher_imports_from_the_namespace_root(tmp_path):
    """generate's launcher puts the folder the repository imports itself from on PYTHONPATH (the folder above
    `mypkg/`), not the transformer file's own folder, from which `mypkg.models...` cannot be imported."""
    from conftest import source_flags

    from integrate import api

    models = _layout(tmp_path / "repo")
    api.write_plan(api.plan(source_flags(models, textwrap.dedent(MODEL)), probe=False), tmp_path / "plan")
    api.approve(tmp_path / "plan", "test")
    report = api.generate(tmp_path / "plan", out=tmp_path / "out")
    launcher = report.plugin.launcher
    path = launcher.split("PYTHONPATH=")[1].split()[0].split(":")
    assert str((tmp_path / "repo").resolve()) in path and str(models.resolve()) not in path, launcher
