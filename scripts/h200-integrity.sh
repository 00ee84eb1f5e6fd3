#!/usr/bin/env bash
# Every GPU test from the bundle, then halo verify with the cross-rank integrity check wired in.
source "$(dirname "$0")/h200-common.sh"
run 200 $B/run-gpu-tests.sh
run 60 $H verify --atoms 3000 --ranks 2x2x2 --gpus 1 --steps 20
run 60 $H launch -n 2 -- verify --atoms 3000 --ranks 2x1x1 --steps 20
run 60 $H demo
