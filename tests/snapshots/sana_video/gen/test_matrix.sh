#!/usr/bin/env bash
# GPU test matrix for sana_video (SanaVideoPipeline), from the approved plan.
# Each configuration is compared with the 1-GPU baseline by PSNR and SSIM; cache needs PSNR > 30,
# parallel configurations PSNR > 35; SSIM > 0.90 for all. Run from a machine with 2 GPUs.
set -euo pipefail
# no hub id is known for the model (a folder of the machine the plan was made on means nothing elsewhere)
: "${SANA_VIDEO_DIR:?set SANA_VIDEO_DIR to the model folder}"
export SANA_VIDEO_DIR
# `python -m` puts the folder it is run from first on sys.path, so a cache_dit.py (or torch.py) there would be
# imported in place of the real package: -P and PYTHONSAFEPATH (for torchrun's workers) keep it off, and the
# folder holding this script (and the plugin) goes on PYTHONPATH instead.
export PYTHONSAFEPATH=1
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-.tmp/sana_video}"
mkdir -p "$OUT"
INPUTS=()
# one process, or N under torchrun (cache-dit takes the parallel degrees from the process count)
run() {
    local n=$1
    shift
    if [ "$n" -eq 1 ]; then
        python -P -m integrate_sana_video sana_video "${INPUTS[@]}" "$@"
    else
        torchrun --nproc_per_node="$n" -m integrate_sana_video sana_video "${INPUTS[@]}" "$@"
    fi
}
check() { cache-dit-metrics psnr ssim -i1 "$OUT/base.mp4" -i2 "$OUT/$1"; }

# the rows `integrate verify --gpu --print` lists, and PR.md (decisions/matrix.py)
run 1 --track-memory --save-path "$OUT/base.mp4"
run 1 --cache --summary --track-memory --save-path "$OUT/cache.mp4" && check cache.mp4
run 2 --parallel ulysses --ulysses-anything --track-memory --save-path "$OUT/ulysses2.mp4" && check ulysses2.mp4
run 2 --parallel ulysses --ulysses-anything --cache --track-memory --save-path "$OUT/ulysses2_cache.mp4" && check ulysses2_cache.mp4
run 2 --parallel ring --track-memory --save-path "$OUT/ring2.mp4" && check ring2.mp4
run 2 --parallel tp --track-memory --save-path "$OUT/tp2.mp4" && check tp2.mp4
# cache-dit takes the degrees from the process count: Ulysses 2 x TP 2 needs 4 processes
run 4 --parallel ulysses_tp --ulysses-anything --track-memory --save-path "$OUT/ulysses2_tp2.mp4" && check ulysses2_tp2.mp4
# the hybrid with the cache on, as verify --proof hybrid proves it
run 4 --parallel ulysses_tp --ulysses-anything --cache --track-memory --save-path "$OUT/ulysses2_tp2_cache.mp4" && check ulysses2_tp2_cache.mp4
