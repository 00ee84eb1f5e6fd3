#!/usr/bin/env bash
# examples/stencil3d on the H200s: GPU test, one process (1 and 2 GPUs), and one PE per GPU (started
# by `halo launch --exe`). Every binary uses the kernels embedded in it (no HALO_PTX_DIR).
source "$(dirname "$0")/h200-common.sh"
unset HALO_PTX_DIR
S=$B/stencil3d
run 120 $B/tests/stencil3d_gpu --test-threads=1
run 60 $S --grid 64x64x64 --ranks 2x2x2 --iterations 100 --gpus 1
run 60 $S --grid 128x128x128 --ranks 2x2x2 --iterations 100 --gpus 2
run 60 $H launch -n 2 --exe $S -- --grid 128x128x128 --ranks 2x1x1 --iterations 100 --transport fused,per-pulse,per-pulse-direct,fused-tma,staged
