#!/usr/bin/env bash
# The mini-MD verification runs on the H200 machines (see docs/architecture.md): every GPU test from
# the bundle, `halo verify` in one process on one and two GPUs, and over NVSHMEM with one PE per GPU.
source "$(dirname "$0")/h200-common.sh"

run 400 "$B/run-gpu-tests.sh"
for g in 1x1x1 2x1x1 2x2x1 2x2x2; do run 400 $H verify --atoms 6000 --ranks $g --steps 100 --gpus 1; done
run 400 $H verify --ranks 4x1x1 --atoms 3000 --steps 100 --gpus 1
run 400 $H verify --atoms 45000 --ranks 2x2x2 --steps 100 --gpus 2
run 400 $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 100
run 400 $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 100 --force-put
run 400 $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 100 --transport fused-tma
run 400 $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 100 --transport per-pulse --force-put
run 400 $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 100 --transport staged
run 400 $H launch -n 2 -- verify --atoms 45000 --ranks 2x1x1 --steps 100
