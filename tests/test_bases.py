"""Whether a transformer is a diffusers ModelMixin (its bases traced statically), and what cache-dit's TP asks."""

import textwrap
from pathlib import Path

import pytest

from integrate.analyzers.bases import model_mixin
from integrate.analyzers.support import tp_requires_model_mixin
from integrate.resolve import Workspace


def _answer(tmp_path: Path, code: str, cls: str = "Model"):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(code))
    ws = Workspace()
    src = ws.load(path)
    return model_mixin(ws, src, src.classes[cls])


@pytest.mark.parametrize("code, expected, said", [
    ("from torch import nn\nclass Model(nn.Module): pass\n", False, "torch.nn.Module"),
    ("from transformers import Qwen2Model\nclass Model(Qwen2Model): pass\n", False, "Qwen2Model"),
    # through a class of the same file, to diffusers' own mixin
    ("from diffusers.models.modeling_utils import ModelMixin\nfrom torch import nn\n"
     "class Base(ModelMixin): pass\nclass Model(nn.Module, Base): pass\n", True, "Model -> Base -> ModelMixin"),
    # built on an installed diffusers model, followed into diffusers' source
    ("from diffusers import FluxTransformer2DModel\nclass Model(FluxTransformer2DModel): pass\n", True,
     "FluxTransformer2DModel"),
    # a base that cannot be traced leaves the answer unknown, never "not a model"
    ("from torch import nn\nfrom .missing import Base\nclass Model(nn.Module, Base): pass\n", None, "Base"),
])
def test_bases_are_traced_to_model_mixin_or_left_unknown(tmp_path, code, expected, said):
    answer, why = _answer(tmp_path, code)
    assert answer is expected and said in why, (answer, why)


def test_cache_dits_tensor_parallel_entry_is_read_from_its_source():
    at = tp_requires_model_mixin(Workspace())
    assert at is not None and at.file.endswith("dispatch.py"), at
    line = Path(at.file).read_text().splitlines()[at.line - 1:at.line + 1]
    assert any("ModelMixin" in x for x in line) and "assert" in line[0], line


@pytest.mark.parametrize("code, expected, said", [
    # diffusers' own attention classes, by import: a mixin cache-dit lists
    ("from diffusers.models.attention import AttentionModuleMixin\nfrom torch import nn\n"
     "class Attn(nn.Module, AttentionModuleMixin): pass\n", True, "Attn -> AttentionModuleMixin"),
    ("from diffusers.models.attention_processor import Attention\nclass Attn(Attention): pass\n", True,
     "Attn -> Attention"),
    # a project's own class named as one of them is not diffusers': followed into its bases, to torch
    ("from torch import nn\nclass Attention(nn.Module): pass\nclass Attn(Attention): pass\n", False,
     "torch.nn.Module"),
    ("from torch import nn\nclass Attn(nn.Module): pass\n", False, "torch.nn.Module"),
    ("from torch import nn\nfrom .missing import Base\nclass Attn(nn.Module, Base): pass\n", None, "Base"),
])
def test_attention_classes_are_traced_to_the_diffusers_classes_cache_dit_lists(tmp_path, code, expected, said):
    """cache-dit hands the parallel config only to processors of modules of diffusers' attention classes, which it
    lists in its source (read there, not assumed); a class is traced to one of them by its bases."""
    from integrate.analyzers.bases import diffusers_class
    from integrate.analyzers.support import cp_attention_classes

    ws = Workspace()
    names, at = cp_attention_classes(ws)
    assert {"Attention", "AttentionModuleMixin"} <= set(names) and at.file.endswith("_diffusers_bridge.py"), at
    path = tmp_path / "attn.py"
    path.write_text(code)
    src = ws.load(path)
    answer, why = diffusers_class(ws, src, src.classes["Attn"], names)
    assert answer is expected and said in why, (answer, why)
