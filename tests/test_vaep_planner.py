"""VAE-P planners generated for VAEs cache-dit does not register (issue 37 item 3): which diffusers VAEs get one
(read from the installed sources), which are manual and at which line, a registered base's planner reused by a
subclass, hostile source that cannot inject code (the 2-process run is the vaep proof's:
tests/test_component_proofs.py).
"""

import sys
import types
from pathlib import Path

import libcst as cst
import pytest
from integrate.templates import vae_planner

from analyzers.encoders import vae_facts
from decisions.encoders import decide_vaep
from integrate import escape
from integrate.resolve import Workspace

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ws():
    if Workspace().package_root("diffusers") is None or Workspace().package_root("cache_dit") is None:
        pytest.skip("diffusers and cache-dit are needed")
    return Workspace()


def plan(ws, cls, library="diffusers"):
    return decide_vaep(types.SimpleNamespace(vae=vae_facts(ws, None, {"vae": [library, cls]})))


def line_text(e) -> str:
    return Path(e.file).read_text(encoding="utf-8").splitlines()[e.line - 1].strip()


@pytest.mark.parametrize("cls", ["AutoencoderDC", "AutoencoderKLCogVideoX"])
def test_generated_for_the_understood_tile_loop(ws, cls):
    p = plan(ws, cls)
    assert p.supported is False and p.planner == "generate" and p.tiles.understood
    assert line_text(p.tiles.source).startswith("def tiled_decode(")
    assert line_text(p.tiles.loop).startswith("for i in range(") and (p.tiles.row, p.tiles.rows) == ("row", "rows")
    name, text, _ = vae_planner(ws, p, plan_sha="0" * 12)
    escape.check_python(text, "vae_planner.py")
    module = cst.parse_module(text)
    assert name == f"{cls}DataParallelismPlanner" and f'register("{cls}")' in text
    fn = next(s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == "tiled_decode")
    code = module.code_for_node(fn)
    assert "_vaep = _vaep_begin(self)" in code and "if _vaep.owns():" in code and "row.append(None)" in code
    assert "_vaep.gather(rows)" in code


@pytest.mark.parametrize("cls, at, why", [
    ("AutoencoderKLAllegro", "for i in range(output_num_frames):", "`<row> = []`"),
    ("AutoencoderKLQwenImage21", "self._conv_idx = [0]", "writes to something it did not create"),
])
def test_manual_with_the_line(ws, cls, at, why):
    p = plan(ws, cls)
    assert p.planner == "manual" and not p.tiles.understood
    assert line_text(p.tiles.loop) == at and why in p.tiles.loop.why
    assert f":{p.tiles.loop.line})" in p.action and p.action.startswith("manual:")
    said = vae_planner(ws, p)
    assert isinstance(said, str) and f":{p.tiles.loop.line}" in said


def test_registered_vae_is_not_rewritten(ws):
    p = plan(ws, "AutoencoderKL")
    assert p.supported and p.planner == "reuse" and p.tiles is None


def _package(tmp_path, name, body) -> Workspace:
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body)
    return Workspace(source_roots=(str(tmp_path),))


def test_subclass_reuses_the_registered_base_planner(ws, tmp_path):
    w = _package(tmp_path, "myvae", "from diffusers import AutoencoderKL\n\n\nclass MyKL(AutoencoderKL):\n"
                                    "    scale = 2\n\n\nclass MyKL2(MyKL):\n    pass\n")
    p = plan(w, "MyKL2", "myvae")
    assert p.planner == "reuse-base" and p.reuse.base == "AutoencoderKL"
    assert [e.why.split()[0] for e in p.reuse.chain[:3]] == ["MyKL2", "MyKL", "AutoencoderKL,"]
    name, text, _ = vae_planner(w, p)
    assert f"class MyKL2DataParallelismPlanner({p.reuse.planner}):" in text and 'register("MyKL2")' in text
    escape.check_python(text, "vae_planner.py")


def test_subclass_overriding_tiled_decode_is_read_itself(ws, tmp_path):
    w = _package(tmp_path, "myvae2", "from diffusers import AutoencoderKL\n\n\nclass MyKL(AutoencoderKL):\n"
                                     "    def tiled_decode(self, z):\n        return z\n")
    p = plan(w, "MyKL", "myvae2")
    assert p.reuse is None and p.planner == "manual" and "overrides `tiled_decode`" in " ".join(p.notes)
    assert "no loop over tiles" in p.tiles.loop.why


HOSTILE = '''
import torch

MARKER = {marker!r}


class HostileVae(torch.nn.Module):
    def tiled_decode(self, z):
        """\\"\\"\\" ; open(MARKER, "w") ; \\"\\"\\"
        """
        note = '""")\\nopen(MARKER, "w")\\n#'
        rows = []
        for i in range(0, z.shape[2], 2):
            row = []
            for j in range(0, z.shape[3], 2):
                tile = z[:, :, i:i + 2, j:j + 2]  # ; open(MARKER, "w")
                row.append(tile * len(note))
            rows.append(row)
        return torch.cat([torch.cat(r, dim=3) for r in rows], dim=2)
'''


def test_hostile_source_cannot_inject(ws, tmp_path, monkeypatch):
    marker = tmp_path / "injected"
    w = _package(tmp_path, "hostilevae", HOSTILE.format(marker=str(marker)))
    p = plan(w, "HostileVae", "hostilevae")
    assert p.planner == "generate", p.action
    name, text, _ = vae_planner(w, p)
    assert 'from hostilevae import' not in text or "MARKER" not in text.split("def tiled_decode")[0]
    with pytest.raises(escape.UnsafeValue):  # a class name that is code is refused, not written
        vae_planner(w, types.SimpleNamespace(cls='HostileVae"); open("m", "w")  #', tiles=p.tiles, reuse=None))
    hostile_index = plan(w, 'HostileVae(); open("m", "w")', "hostilevae")
    assert hostile_index.planner == "manual" and hostile_index.tiles is None
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = types.ModuleType("hostile_planner")
    exec(compile(text, "hostile_planner.py", "exec"), mod.__dict__)  # runs every module-level statement
    assert not marker.exists()
    sys.modules.pop("hostilevae", None)


# the 2-process run of a generated planner is verify's VAE-P proof: tests/test_component_proofs.py (AutoencoderDC)
