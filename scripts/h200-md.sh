#!/usr/bin/env bash
# The mini-MD verification runs on the H200 machines (see docs/architecture.md): every GPU test from
# the bundle, `halo verify` in one process on one and two GPUs, and over NVSHMEM with one PE per GPU.
set -uo pipefail
B=${1:-target/bundle}
OUT=${OUT:-h200-logs}; mkdir -p "$OUT"
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
H=$B/halo
run() { echo; echo "=== $*"; ( time timeout 400 "$@" ) 2>&1 | tee -a "$OUT/md.log"; echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT/md.log"; }

run "$B/run-gpu-tests.sh"
for g in 1x1x1 2x1x1 2x2x1 2x2x2; do run $H verify --atoms 6000 --ranks $g --steps 100 --gpus 1; done
run $H verify --ranks 4x1x1 --atoms 3000 --steps 100 --gpus 1
run $H verify --atoms 45000 --ranks 2x2x2 --steps 100 --gpus 2
run $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 100
run $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 100 --force-put
run $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 100 --transport fused-tma
run $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 100 --transport per-pulse --force-put
run $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 100 --transport staged
run $H launch -n 2 -- verify --atoms 45000 --ranks 2x1x1 --steps 100
