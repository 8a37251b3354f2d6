"""`integrate metrics`: PSNR and SSIM together, per frame for videos, garbled outputs flagged."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_cli
from PIL import Image

RNG = np.random.default_rng(0)


def _save(path, array):
    Image.fromarray(np.clip(array, 0, 255).astype(np.uint8)).save(path)
    return path


@pytest.fixture
def images(tmp_path):
    base = RNG.random((48, 64, 3)) * 255
    smooth = np.full((48, 64, 3), 128.0)
    return {
        "base": _save(tmp_path / "base.png", base),
        "close": _save(tmp_path / "close.png", base + RNG.integers(-2, 3, base.shape)),
        "flat": _save(tmp_path / "flat.png", smooth),
        # small-amplitude noise on a flat image: a PSNR that looks fine, structure gone
        "garbled": _save(tmp_path / "garbled.png", smooth + RNG.integers(-15, 16, smooth.shape)),
        "small": _save(tmp_path / "small.png", base[:32]),
    }


def _metrics(*args):
    proc = run_cli("metrics", *map(str, args), "--json")
    return proc, (json.loads(proc.stdout)["metrics"] if proc.returncode in (0, 1) else None)


def test_identical_outputs(images):
    proc, m = _metrics(images["base"], images["base"])
    assert proc.returncode == 0 and m["identical"] and m["psnr"] is None and m["ssim"] == pytest.approx(1.0)


def test_close_output_passes_the_parallel_bar(images):
    proc, m = _metrics(images["base"], images["close"])
    assert proc.returncode == 0
    assert m["psnr"] > 35 and m["ssim"] > 0.9 and m["passes"] == {"cache": True, "parallel": True}
    strip = Image.open(m["side_by_side"])
    assert strip.size == (64 * 3, 48)


def test_garbled_is_flagged_even_when_psnr_looks_fine(images):
    proc, m = _metrics(images["flat"], images["garbled"])
    assert m["psnr"] > 25 and m["ssim"] < 0.5
    assert m["garbled"] and proc.returncode == 1


def test_video_reports_the_worst_frame(tmp_path, images):
    base = tmp_path / "base_frames"
    cand = tmp_path / "cand_frames"
    base.mkdir()
    cand.mkdir()
    frames = [RNG.random((32, 32, 3)) * 255 for _ in range(3)]
    for i, f in enumerate(frames):
        _save(base / f"{i:03d}.png", f)
        _save(cand / f"{i:03d}.png", f + (RNG.integers(-40, 41, f.shape) if i == 1 else 0))
    proc, m = _metrics(base, cand)
    assert m["kind"] == "video" and m["frames"] == 3 and m["worst_frame"] == 1
    assert m["per_frame"][0]["psnr"] is None  # untouched frames are identical
    assert m["ssim"] == min(f["ssim"] for f in m["per_frame"])


def test_thresholds_set_the_exit_code(images):
    assert run_cli("metrics", str(images["base"]), str(images["close"]), "--min-psnr", "60").returncode == 1
    assert run_cli("metrics", str(images["base"]), str(images["close"]), "--min-ssim", "0.5").returncode == 0


@pytest.mark.parametrize("which,needle", [("small", "is 64x48"), ("missing", "no such file"), ("mp4", "folder of frames")])
def test_bad_input_is_one_line_and_exit_2(tmp_path, images, which, needle):
    other = {"small": images["small"], "missing": tmp_path / "nope.png", "mp4": tmp_path / "x.mp4"}[which]
    if which == "mp4":
        other.write_bytes(b"\x00")
    proc = run_cli("metrics", str(images["base"]), str(other))
    assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
