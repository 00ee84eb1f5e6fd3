#!/usr/bin/env bash
# The nbnxm kernel designs (docs/nbnxm.md, "Kernels"): every design against the f64 references
# (forces, energy, inner lists; 6k and 45k atoms, 1 to 4 ranks, long and short entries, five
# types, edge inputs), then `kernel_times`, which ends with one table of every design's prune,
# forces and forces+energy times at 6k, 45k and 180k atoms on 1x1x1 and rank 0 of 2x1x1. One GPU.
source "$(dirname "$0")/h200-common.sh"
export HALO_REQUIRE_GPU=1
run 500 "$B/tests/gpu_nbnxm" --test-threads=1 --skip kernel_times
run 300 "$B/tests/gpu_nbnxm" --test-threads=1 --nocapture kernel_times
