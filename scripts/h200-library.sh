#!/usr/bin/env bash
# The library split (issue 16) on the H200s: the downstream fixture (a crate outside the workspace,
# plain `cargo build`) runs an exchange from the kernels embedded in the library with no
# environment variable; then every GPU test, and each per-step driver now written once over
# exchange::Exchange, in one process and over NVSHMEM (exchange-check, verify, bench, calibrate),
# and stencil3d's ranks started by `halo launch --exe`. About 5 minutes.
source "$(dirname "$0")/h200-common.sh"
unset HALO_PTX_DIR
HALO_REQUIRE_GPU=1 run 60 env -u HALO_PTX_DIR $B/halo-downstream
run 300 $B/run-gpu-tests.sh
run 60 $H info
run 120 $H exchange-check --grid 2x2x2 --pulses 2 --steps 50
run 120 $H launch -n 2 -- exchange-check --grid 2x1x1 --pulses 2 --steps 100
run 120 $H launch -n 2 -- exchange-check --grid 2x1x1 --steps 100 --force-put
run 60 $H launch -n 2 -- exchange-check --grid 2x1x1 --steps 3 --transport fused --inject-skip-rank 1 --wait-timeout-ms 1000
run 120 $H verify --atoms 6000 --ranks 2x2x2 --gpus 1 --steps 30
run 120 $H verify --atoms 6000 --ranks 2x1x1 --gpus 2 --steps 30 --transport staged
run 120 $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 30
run 120 $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 30 --transport per-pulse --force-put
run 120 $H bench --ranks 2x1x1 --atoms 6000 --repeats 2 --warmup 1 --steps 20 --graph --quiet
run 120 $H launch -n 2 -- bench --ranks 2x1x1 --atoms 6000 --repeats 2 --warmup 1 --steps 20 --graph --quiet
run 120 $H calibrate --sizes 1024,262144 --repeats 5 --warmup 2 --out "$OUT/calibration-local.json"
run 120 $H launch -n 2 -- calibrate --sizes 1024,262144 --repeats 5 --warmup 2 --out "$OUT/calibration-pe.json"
run 60 $H launch -n 2 --exe $B/stencil3d -- --grid 64x64x64 --ranks 2x1x1 --iterations 50 --transport fused,per-pulse,staged
