"""VAE-P on a tiny VAE: its config shrunk (every channel list 32 wide, one layer per block), seeded weights, a latent
of 9 x 9 (and 2 frames where the VAE is a video one) with the tiles made 4 latent pixels wide at a stride of 3, so
the decode really tiles (9 tiles for 2 ranks). Decoded three ways: untiled and tiled in one process, then through the
planner cache-dit finds for the class (the plugin's or its own) across the job's gloo processes. The planner's decode
must match the 1-process tiled one (fp tolerance, along the tile borders too), and each rank must have decoded only
its share of the tiles; the untiled decode is compared by PSNR and SSIM and reported (blending changes pixels)."""

from __future__ import annotations

import time
from typing import Any

from . import common

WIDTH = 32  # the narrowest channel count: divisible by any group norm's groups a VAE hard-codes (32)
LATENT = 12  # latent pixels each way: tiles start at 0, 4, 8 (the last 4 wide)
TILE, STRIDE = 6, 4  # latent pixels: 3 x 3 = 9 tiles
FRAMES = 2  # latent frames of a video VAE
_SKIP = ("in_channels", "out_channels", "latent_channels")
_BASE = ("base_dim", "base_channels")  # a base width the levels multiply


def shrink(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list]]:
    """A tiny copy of a diffusers VAE config; (config, {key: [before, after]}): one layer (residual block) per level,
    and every channel count (the lists and a base width) divided by one power of two, the largest that keeps the
    narrowest at WIDTH or more, so the ratios between levels (a decoder that halves its channels as it upsamples)
    and between the encoder's and decoder's lists survive."""
    out = {k: v for k, v in config.items() if not k.startswith("_")}
    changes: dict[str, list] = {}

    def put(key: str, value: Any) -> None:
        if out.get(key) != value:
            changes[key] = [config.get(key), value]
            out[key] = value

    def is_ints(v) -> bool:
        return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(x, int) and not isinstance(x, bool)
                                                                for x in v)

    widths = {k: list(v) for k, v in out.items() if "channels" in k and k not in _SKIP and is_ints(v)}
    widths.update({k: [v] for k, v in out.items() if k in _BASE and isinstance(v, int) and not isinstance(v, bool)})
    values = [x for v in widths.values() for x in v if x > 0]
    divisor = 1
    while values and all(x % (divisor * 2) == 0 and x // (divisor * 2) >= WIDTH for x in values):
        divisor *= 2
    for k, v in widths.items():
        scaled = [x // divisor for x in v]
        put(k, scaled[0] if k in _BASE else type(config[k])(scaled) if isinstance(config[k], tuple) else scaled)
    for k, v in out.items():
        if isinstance(v, bool):
            continue
        if ("layers_per_block" in k or "num_res_blocks" in k) and isinstance(v, int):
            put(k, min(v, 1))
        elif ("layers_per_block" in k or "num_res_blocks" in k) and is_ints(v):
            put(k, [min(x, 1) for x in v])
        elif k == "norm_num_groups" and isinstance(v, int) and any(x % v for x in values if divisor > 1):
            put(k, 8)
    return out, changes


def _defaults(cls) -> dict[str, Any]:
    """The constructor's defaults (what a diffusers model records as its config when given none)."""
    import inspect

    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if name != "self" and p.default is not inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _latent_channels(config: dict[str, Any]) -> int:
    for key in ("latent_channels", "z_dim", "latent_dim", "z_channels"):
        if isinstance(config.get(key), int):
            return config[key]
    return 4


def _sample(out):
    return out.sample if hasattr(out, "sample") else out[0]


def _set_tiles(vae, ratio: int) -> dict[str, Any]:
    """The tile sizes the VAE's tiled decode reads, made small (latent tile TILE, stride STRIDE); {attr: value}."""
    values = {}
    for attr in list(vars(vae)):
        if not attr.startswith("tile_") or "frames" in attr or "num_" in attr:
            continue
        if attr.startswith("tile_sample_min"):
            values[attr] = TILE * ratio
        elif attr.startswith("tile_sample_stride"):
            values[attr] = STRIDE * ratio
        elif attr.startswith("tile_latent_min"):
            values[attr] = TILE
        elif attr.startswith("tile_latent_stride"):
            values[attr] = STRIDE
        elif attr.startswith("tile_overlap_factor"):
            values[attr] = 1 - STRIDE / TILE
    for attr, value in values.items():
        setattr(vae, attr, value)
    return values


def _keep_tiles(vae, values: dict[str, Any]) -> None:
    """A planner's `enable_tiling()` may put the default tile sizes back: ours are set again after it."""
    original = vae.enable_tiling

    def enable_tiling(*args, **kwargs):
        result = original(*args, **kwargs)
        for attr, value in values.items():
            setattr(vae, attr, value)
        return result

    vae.enable_tiling = enable_tiling


class _Calls:
    """Calls of the VAE's decoder (a tile, or a frame of one)."""

    def __init__(self, vae) -> None:
        self.count = 0
        self.handle = vae.decoder.register_forward_pre_hook(self._hook) if hasattr(vae, "decoder") else None

    def _hook(self, module, args):
        self.count += 1

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


def _scores(ref, got) -> dict:
    """PSNR and SSIM of `got` against `ref` over their frames (the minimum), over the reference's value range."""
    import torch
    from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

    def frames(x):
        return x.permute(0, 2, 1, 3, 4).reshape(-1, x.shape[1], *x.shape[-2:]) if x.dim() == 5 else x

    a, b = frames(ref), frames(got)
    lo, hi = float(a.min()), float(a.max())
    span = max(hi - lo, 1e-6)
    a, b = (a - lo) / span, ((b - lo) / span).clamp(-1, 2)
    psnr = [float(peak_signal_noise_ratio(b[i:i + 1], a[i:i + 1], data_range=1.0)) for i in range(a.shape[0])]
    ssim = [float(structural_similarity_index_measure(b[i:i + 1], a[i:i + 1], data_range=1.0))
            for i in range(a.shape[0])]
    worst = min(psnr)
    return {"psnr": None if worst == float("inf") else round(worst, 3), "ssim": round(min(ssim), 5),
            "frames": a.shape[0], "value_range": [round(lo, 4), round(hi, 4)], "data_range": "the reference's",
            "note": "reported, not judged: blending overlapping tiles changes pixels", **(
                {} if torch.isfinite(b).all() else {"finite": False})}


def _seams(tiled, got, untiled, stride: int) -> dict:
    """The largest differences on the rows and columns where tiles meet (multiples of the stride, +-1), against the
    1-process tiled decode (must be within tolerance) and against the untiled one (reported)."""
    from integrate.verify.compare import figures

    h, w = tiled.shape[-2:]
    rows = sorted({r for k in range(stride, h, stride) for r in (k - 1, k) if 0 <= r < h})
    cols = sorted({c for k in range(stride, w, stride) for c in (k - 1, k) if 0 <= c < w})

    def band(x):
        return x[..., rows, :].flatten(), x[..., :, cols].flatten()

    import torch

    t, g = band(tiled), band(got)
    f = figures(torch.cat(t).numpy(), torch.cat(g).numpy())
    out = {"borders": {"rows": len(rows), "cols": len(cols), "stride_px": stride}, "ok": f.ok,
           "max_abs": round(f.max_abs, 9)}
    if not f.ok:
        out["why"] = f"max |diff| {f.max_abs:.3g} on the tile borders"
    if untiled is not None:  # reported: how far the blend at the borders is from the untiled decode, and elsewhere
        inside = (untiled - got).abs()
        mask = torch.ones(h, w, dtype=torch.bool)
        mask[rows, :] = False
        mask[:, cols] = False
        out["vs_untiled_on_borders"] = round(float((torch.cat(band(untiled)) - torch.cat(g)).abs().max()), 6)
        out["vs_untiled_inside"] = round(float(inside[..., mask].max()) if mask.any() else 0.0, 6)
    return out


def run(job: dict) -> None:
    import torch
    from integrate.verify.compare import figures

    started = time.monotonic()
    rank, world = common.init()
    report: dict[str, Any] = {"rank": rank, "world": world, "component": job["component"], "cls": job["cls"]}
    stage = "build the tiny VAE"
    try:
        cls = common.load_class(job["library"], job["cls"])
        config, changes = shrink(dict(job.get("config") or {}) or _defaults(cls))
        report["config_from"] = "model folder" if job.get("config") else "class defaults"
        report["changes"] = changes
        vae = cls.from_config(config).eval()
        common.seeded(vae)
        stage = "decode untiled in one process"
        g = torch.Generator().manual_seed(2)
        channels = _latent_channels(dict(vae.config))
        untiled = latent = None
        for shape in ((1, channels, LATENT, LATENT), (1, channels, FRAMES, LATENT, LATENT)):
            latent = torch.randn(shape, generator=g)
            try:
                with torch.no_grad():
                    untiled = _sample(vae.decode(latent)).float()
                break
            except Exception:  # a video VAE given an image latent: the 5-D latent next
                if len(shape) == 5:
                    raise
        ratio = untiled.shape[-1] // latent.shape[-1]
        report["latent"], report["output"], report["ratio"] = list(latent.shape), list(untiled.shape), ratio
        stage = "decode tiled in one process"
        calls = _Calls(vae)
        vae.enable_tiling()
        tiles = _set_tiles(vae, ratio)
        report["tiles"] = tiles
        if not tiles:
            raise ValueError("the VAE has no tile_* sizes to make small: its tiled decode is not one verify knows")
        with torch.no_grad():
            tiled = _sample(vae.decode(latent)).float()
        report["decoder_calls_1process"] = calls.take()
        stage = "import the plugin"
        common.import_plugin(job)
        report["mesh_on_cpu"] = common.cpu_mesh()
        stage = "apply the VAE-P planner"
        from cache_dit import ParallelismConfig
        from cache_dit.distributed.autoencoders import parallelize_autoencoder
        from cache_dit.distributed.autoencoders.dispatch import _ensure_auto_encoder_dp_planners_activated
        from cache_dit.distributed.autoencoders.register import AutoEncoderDataParallelismPlannerRegister

        _ensure_auto_encoder_dp_planners_activated()
        planner = AutoEncoderDataParallelismPlannerRegister.get_planner(vae)
        report["planner"] = f"{planner.__module__}.{planner.__qualname__}"
        _keep_tiles(vae, tiles)
        vae = parallelize_autoencoder(vae, ParallelismConfig(tp_size=world))
        stage = "decode across ranks"
        with torch.no_grad():
            got = _sample(vae.decode(latent)).float()
        report["decoder_calls"] = calls.take()
        report["decoder_calls_per_rank"] = _gathered(report["decoder_calls"], world)
        if got.shape != tiled.shape:
            raise ValueError(f"the planner's decode is {list(got.shape)}, the 1-process tiled one {list(tiled.shape)}")
        f = figures(tiled.numpy(), got.numpy())
        report["figures"] = f.as_dict()
        stage = "compare with the untiled decode"
        if untiled.shape == got.shape:
            report["untiled"] = _scores(untiled, got)
        else:  # (LTX-2's untiled decode of this latent is larger than its tiled one)
            report["untiled"] = {"shape": list(untiled.shape), "tiled_shape": list(got.shape),
                                 "note": "the untiled decode is shaped otherwise: not compared"}
            untiled = None
        report["seams"] = _seams(tiled, got, untiled, STRIDE * ratio)
    except Exception as exc:  # located and reported, never a crash of verify
        report["error"] = common.error(stage, exc)
    report["seconds"] = round(time.monotonic() - started, 2)
    common.finish(job["out"], rank, report)


def _gathered(value: int, world: int) -> list[int]:
    import torch
    import torch.distributed as dist

    out = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(out, torch.tensor([value], dtype=torch.int64))
    return [int(t) for t in out]
