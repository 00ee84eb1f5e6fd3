#!/usr/bin/env bash
# The nbnxm kernels (docs/nbnxm.md, "Kernels"): both designs (ind, pf) with 1, 2, 3, 4, 8, 16 and
# the rule's warps per list entry against the f64 references (forces, energy, inner lists; 6k and
# 45k atoms, 1 to 4 ranks, entries of 1 to 100 words, five types, edge inputs), then
# `kernel_times`: a table of prune, forces and forces+energy times per design and warp count at
# 6k, 45k and 180k atoms on 1x1x1 and rank 0 of 2x1x1 (back to back and per launch), and per list
# the fastest design and warp count beside the host rule's. One GPU.
source "$(dirname "$0")/h200-common.sh"
export HALO_REQUIRE_GPU=1
run 500 "$B/tests/gpu_nbnxm" --test-threads=1 --skip kernel_times
run 300 "$B/tests/gpu_nbnxm" --test-threads=1 --nocapture kernel_times
