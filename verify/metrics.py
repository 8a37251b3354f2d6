"""PSNR and SSIM of a candidate output against its baseline, always both.

PSNR alone passes garbled images (a broken TP run can score 25+ dB); SSIM catches them. Both come from
torchmetrics. Videos (a folder of frames or an animated image) are compared frame by frame and the
minimum is reported, since one broken frame is a broken video. A side-by-side PNG (baseline |
candidate | difference heat map) is written for a person to look at.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from integrate.errors import InputError

from .records import FrameMetrics, MetricsReport, Scores

GARBLED_SSIM = 0.5  # below this the structure is gone, whatever PSNR says
GARBLED_PSNR = 25.0  # ... and a PSNR this high would otherwise look acceptable
THRESHOLDS = {"cache": (30.0, 0.90), "parallel": (35.0, 0.90)}  # the skill's bars: (PSNR dB, SSIM)
_IMAGES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
_ANIMATED = {".gif"}


@dataclass(frozen=True)
class FrameScore:
    index: int
    psnr: float
    ssim: float


def load_frames(path: Path) -> list:
    """RGB frames as float arrays in [0, 1]: one for an image, several for a folder of frames or a GIF."""
    import numpy as np
    from PIL import Image, ImageSequence, UnidentifiedImageError

    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    files: list[Path]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in _IMAGES)
        if not files:
            raise InputError(f"{path}: a folder with no image frames ({', '.join(sorted(_IMAGES))})")
    elif path.suffix.lower() in _IMAGES | _ANIMATED:
        files = [path]
    elif path.suffix.lower() in {".mp4", ".mov", ".webm", ".avi"}:
        raise InputError(f"{path}: compare videos as a folder of frames or a .gif (no video decoder is bundled)")
    else:
        raise InputError(f"{path}: not an image, a .gif or a folder of frames")
    frames = []
    for f in files:
        try:
            with Image.open(f) as img:
                for frame in ImageSequence.Iterator(img):
                    frames.append(np.asarray(frame.convert("RGB"), dtype=np.float32) / 255.0)
        except (UnidentifiedImageError, OSError) as exc:
            raise InputError(f"{f}: cannot read as an image ({exc.__class__.__name__})") from None
    return frames


def compare(a: Path, b: Path) -> dict:
    """Per-frame PSNR and SSIM of `b` against baseline `a`, the minimum over frames, and the verdicts."""
    try:
        import torch
        from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure
    except ImportError:
        raise InputError("metrics need torch and torchmetrics: pip install 'integrate[metrics]'") from None
    fa, fb = load_frames(a), load_frames(b)
    if len(fa) != len(fb):
        raise InputError(f"{a} has {len(fa)} frame(s), {b} has {len(fb)}: not the same output")
    scores = []
    for i, (x, y) in enumerate(zip(fa, fb)):
        if x.shape != y.shape:
            raise InputError(f"frame {i}: {a} is {x.shape[1]}x{x.shape[0]}, {b} is {y.shape[1]}x{y.shape[0]}")
        tx = torch.from_numpy(x).permute(2, 0, 1)[None]
        ty = torch.from_numpy(y).permute(2, 0, 1)[None]
        psnr = float(peak_signal_noise_ratio(ty, tx, data_range=1.0))
        ssim = float(structural_similarity_index_measure(ty, tx, data_range=1.0))
        scores.append(FrameScore(i, psnr, ssim))
    psnr = min(s.psnr for s in scores)
    ssim = min(s.ssim for s in scores)
    worst = min(scores, key=lambda s: (s.ssim, s.psnr))

    def finite(v: float) -> float | None:  # identical frames: PSNR is infinite, JSON has no infinity
        return None if v == float("inf") else round(v, 4)

    return {
        "kind": "image" if len(scores) == 1 else "video",
        "frames": len(scores),
        "psnr": finite(psnr),
        "ssim": round(ssim, 6),
        "worst_frame": worst.index,
        "per_frame": [{"frame": s.index, "psnr": finite(s.psnr), "ssim": round(s.ssim, 6)} for s in scores],
        "garbled": ssim < GARBLED_SSIM and psnr >= GARBLED_PSNR,
        "identical": psnr == float("inf"),
        "passes": {name: psnr > p and ssim > q for name, (p, q) in THRESHOLDS.items()},
    }


def side_by_side(a: Path, b: Path, frame: int, out: Path) -> Path:
    """baseline | candidate | |difference| as a heat map (black: equal, red to yellow to white: far)."""
    import numpy as np
    from PIL import Image

    x, y = load_frames(a)[frame], load_frames(b)[frame]
    diff = np.abs(x - y).mean(axis=2)
    scale = max(float(diff.max()), 1e-6)
    t = diff / scale
    heat = np.stack([np.clip(3 * t, 0, 1), np.clip(3 * t - 1, 0, 1), np.clip(3 * t - 2, 0, 1)], axis=2)
    strip = np.concatenate([x, y, heat], axis=1)
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((strip * 255).round().astype(np.uint8)).save(out)
    return out


def report(baseline: Path, candidate: Path, side: Path | None = None) -> MetricsReport:
    """`compare` as a record, with the side-by-side picture written (default: beside the candidate)."""
    scores = compare(baseline, candidate)
    default = (candidate.with_name(candidate.name + ".compare.png") if candidate.is_file()
               else candidate / "compare.png")
    picture = side_by_side(baseline, candidate, scores["worst_frame"], side or default)
    per_frame = tuple(FrameMetrics(**f) for f in scores.pop("per_frame"))
    return MetricsReport("1.0", Scores(**scores, per_frame=per_frame, side_by_side=str(picture)))
