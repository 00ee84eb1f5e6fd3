#!/usr/bin/env bash
# Every GPU test from the bundle, then halo verify with the cross-rank integrity check wired in.
set -uo pipefail
B=${1:-target/bundle}
OUT=${OUT:-h200-logs}; mkdir -p "$OUT"
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
H=$B/halo
run() { local t=$1; shift; echo; echo "=== $*"; ( time timeout "$t" "$@" ) 2>&1 | tee -a "$OUT/integrity.log"; echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT/integrity.log"; }
run 200 $B/run-gpu-tests.sh
run 60 $H verify --atoms 3000 --ranks 2x2x2 --gpus 1 --steps 20
run 60 $H launch -n 2 -- verify --atoms 3000 --ranks 2x1x1 --steps 20
run 60 $H demo
