#!/usr/bin/env bash
# GPU test matrix for flux (FluxPipeline), from the approved plan.
# Each configuration is compared with the 1-GPU baseline by PSNR and SSIM; cache needs PSNR > 30,
# parallel configurations PSNR > 35; SSIM > 0.90 for all. Run from a machine with 2 GPUs.
set -euo pipefail
DEFAULT_MODEL=<work>/model
export FLUX_DIR="${FLUX_DIR:-$DEFAULT_MODEL}"
# `python -m` puts the folder it is run from first on sys.path, so a cache_dit.py (or torch.py) there would be
# imported in place of the real package: -P and PYTHONSAFEPATH (for torchrun's workers) keep it off, and the
# folder holding this script (and the plugin) goes on PYTHONPATH instead.
export PYTHONSAFEPATH=1
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-.tmp/flux}"
mkdir -p "$OUT"
run1() { python -P -m integrate_flux flux "$@"; }
run2() { torchrun --nproc_per_node=2 -m integrate_flux flux "$@"; }
check() { cache-dit-metrics psnr ssim -i1 "$OUT/base.png" -i2 "$OUT/$1"; }

run1 --save-path "$OUT/base.png"
run1 --cache --summary --save-path "$OUT/cache.png" && check cache.png
run2 --parallel ulysses --save-path "$OUT/cp2.png" && check cp2.png
run2 --parallel ulysses --cache --save-path "$OUT/cp2_cache.png" && check cp2_cache.png
run2 --parallel ring --save-path "$OUT/ring2.png" && check ring2.png
run2 --parallel tp --save-path "$OUT/tp2.png" && check tp2.png
# cache-dit takes the degrees from the process count: Ulysses 2 x TP 2 needs 4 processes
torchrun --nproc_per_node=4 -m integrate_flux flux --parallel ulysses_tp --save-path "$OUT/ulysses2_tp2.png" && check ulysses2_tp2.png
