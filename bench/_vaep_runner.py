"""A small 2-process (gloo, CPU) check of a generated VAE-P planner against the one-process tiled decode.

`run(cls, planner_text)` writes the planner module to a temporary folder, starts `world` processes of this file
(`--worker`), each of which builds the tiny VAE (same seed), decodes a latent with the VAE's own tiled_decode (the
reference), applies the planner over the whole gloo group, decodes again and writes {max_abs_diff, counts, seconds}.
To be replaced by `verify --proof vaep`; kept small on purpose.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# tiny configurations: {class: (constructor kwargs, tile attributes set after enable_tiling, latent shape, kwargs)}
CASES: dict[str, tuple[dict, dict, tuple, dict]] = {
    "AutoencoderDC": (
        dict(in_channels=3, latent_channels=4, attention_head_dim=2, encoder_block_types="ResBlock",
             decoder_block_types="ResBlock", encoder_block_out_channels=(8, 8), decoder_block_out_channels=(8, 8),
             encoder_layers_per_block=(1, 1), decoder_layers_per_block=(1, 1), encoder_qkv_multiscales=((), ()),
             decoder_qkv_multiscales=((), ()), decoder_norm_types="rms_norm", decoder_act_fns="silu"),
        dict(tile_sample_min_height=8, tile_sample_min_width=8, tile_sample_stride_height=6,
             tile_sample_stride_width=6), (1, 4, 12, 12), {}),
    "AutoencoderKLHunyuanImage": (
        dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 32), layers_per_block=1,
             spatial_compression_ratio=2, sample_size=16),
        dict(tile_sample_min_size=8, tile_latent_min_size=4, tile_overlap_factor=0.25), (1, 4, 12, 12), {}),
    "AutoencoderKLKVAE": (
        dict(in_channels=3, channels=32, num_enc_blocks=1, num_dec_blocks=1, z_channels=4, ch_mult=(1, 2),
             sample_size=16),
        dict(tile_sample_min_size=8, tile_latent_min_size=4, tile_overlap_factor=0.25), (1, 4, 12, 12), {}),
    "AutoencoderKLCogVideoX": (
        dict(in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 2,
             up_block_types=("CogVideoXUpBlock3D",) * 2, block_out_channels=(8, 8), latent_channels=4,
             layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=2, sample_height=16,
             sample_width=16),
        dict(tile_sample_min_height=8, tile_sample_min_width=8, tile_latent_min_height=4, tile_latent_min_width=4,
             tile_overlap_factor_height=0.25, tile_overlap_factor_width=0.25), (1, 4, 2, 12, 12), {}),
    "AutoencoderKLHunyuanImageRefiner": (
        dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8), layers_per_block=1,
             spatial_compression_ratio=2, temporal_compression_ratio=2),
        dict(tile_sample_min_height=8, tile_sample_min_width=8, tile_overlap_factor=0.25), (1, 4, 2, 12, 12), {}),
    "AutoencoderKLHunyuanVideo15": (
        dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8), layers_per_block=1,
             spatial_compression_ratio=2, temporal_compression_ratio=2),
        dict(tile_sample_min_height=8, tile_sample_min_width=8, tile_latent_min_height=4, tile_latent_min_width=4,
             tile_overlap_factor=0.25), (1, 4, 2, 12, 12), {}),
    "AutoencoderKLLTXVideo": (
        dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8),
             decoder_block_out_channels=(8, 8), layers_per_block=(1, 1, 1), decoder_layers_per_block=(1, 1, 1),
             spatio_temporal_scaling=(True, False), decoder_spatio_temporal_scaling=(True, False),
             decoder_inject_noise=(False, False, False), downsample_type=("conv", "conv"),
             upsample_residual=(False, False), upsample_factor=(1, 1), patch_size=1, patch_size_t=1),
        dict(tile_sample_min_height=8, tile_sample_min_width=8, tile_sample_stride_height=6,
             tile_sample_stride_width=6), (1, 4, 2, 12, 12), {"temb": None}),
    "AutoencoderKLMochi": (
        dict(in_channels=15, out_channels=3, encoder_block_out_channels=(32, 32, 32, 32),
             decoder_block_out_channels=(32, 32, 32, 32), latent_channels=4, layers_per_block=(1, 1, 1, 1, 1),
             add_attention_block=(False, False, False, False, False), latents_mean=(0.0,) * 4,
             latents_std=(1.0,) * 4),
        dict(tile_sample_min_height=16, tile_sample_min_width=16, tile_sample_stride_height=12,
             tile_sample_stride_width=12), (1, 4, 2, 6, 6), {}),
    "AutoencoderKLMagvit": (
        dict(in_channels=3, latent_channels=4, out_channels=3, block_out_channels=[8, 8],
             down_block_types=["SpatialDownBlock3D", "SpatialTemporalDownBlock3D"],
             up_block_types=["SpatialUpBlock3D", "SpatialTemporalUpBlock3D"], layers_per_block=1,
             norm_num_groups=2),
        dict(tile_sample_min_height=8, tile_sample_min_width=8, tile_sample_stride_height=6,
             tile_sample_stride_width=6), (1, 4, 2, 12, 12), {}),
    "AutoencoderVidTok": (
        dict(in_channels=3, out_channels=3, ch=32, ch_mult=[1, 1, 1, 1], z_channels=4, num_res_blocks=1),
        dict(tile_sample_min_height=32, tile_sample_min_width=32, tile_latent_min_height=4, tile_latent_min_width=4,
             tile_overlap_factor_height=0.25, tile_overlap_factor_width=0.25), (1, 4, 2, 12, 12), {}),
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cls: str, planner_text: str, world: int = 2, timeout: float = 180) -> list[dict]:
    """Each rank's {rank, max_abs_diff, counts, seconds, registered} (or {rank, error})."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "vaep_planner_under_test.py").write_text(planner_text)
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port()), "WORLD_SIZE": str(world),
               "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")])}
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", cls, tmp], env={**env, "RANK": str(r)},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=timeout)[0])
            except subprocess.TimeoutExpired:
                p.kill()
                outs.append(p.communicate()[0] + "\n(timed out)")
        results = []
        for r, out in enumerate(outs):
            f = Path(tmp, f"rank{r}.json")
            results.append(json.loads(f.read_text()) if f.is_file() else {"rank": r, "error": out[-2000:]})
        return results


def _tensor(out):
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, tuple):
        return out[0]
    return out.sample


def _worker(cls: str, folder: str) -> None:
    import importlib

    import diffusers
    import torch
    import torch.distributed as dist
    from cache_dit.distributed.autoencoders.register import AutoEncoderDataParallelismPlannerRegister as Register

    rank = int(os.environ["RANK"])
    config, tiling, shape, kwargs = CASES[cls]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    vae = getattr(diffusers, cls)(**config).eval()
    vae.enable_tiling()
    for k, v in tiling.items():
        setattr(vae, k, v)
    z = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = _tensor(vae.tiled_decode(z, **kwargs))
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    try:
        mod = importlib.import_module("vaep_planner_under_test")
        registered = Register.get_planner(vae).__module__ == mod.__name__
        mod.parallelize_tiled_decode(vae, dist.group.WORLD)
        for k, v in tiling.items():  # enable_tiling may have reset them
            setattr(vae, k, v)
        t = time.perf_counter()
        with torch.no_grad():
            out = _tensor(vae.tiled_decode(z, **kwargs))
        seconds = time.perf_counter() - t
        result = {"rank": rank, "max_abs_diff": float((out - ref).abs().max()), "shape": list(out.shape),
                  "counts": mod.tile_counts(vae), "seconds": round(seconds, 3), "registered": registered}
    finally:
        dist.destroy_process_group()
    Path(folder, f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker(sys.argv[2], sys.argv[3])
