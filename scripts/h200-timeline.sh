#!/usr/bin/env bash
# Issue 15: where the microseconds of the fused halo go. The stamped kernels' GPU tests (they must
# exchange exactly like the plain ones), then `halo timeline` at 45k atoms on 2x1x1 in one process
# and over two PEs: per phase (X, F, X+F; launched and replayed as graphs) and rank, the median /
# mean / p90 of every interval between %globaltimer stamps, the GPU gap between kernels and the
# host's launch calls, with the timer's resolution first. Bounded: at most 58 s in all (about 25 s
# expected). Logs and the raw stamps (JSON) under $OUT.
source "$(dirname "$0")/h200-common.sh"
export HALO_PTX_DIR=$B/ptx HALO_REQUIRE_GPU=1
run 15 $B/tests/gpu_exchange --test-threads=1 --nocapture timeline::
A="timeline --ranks 2x1x1 --atoms 45000 --steps 400 --warmup 50"
run 18 $H $A --json "$OUT/timeline-1proc.json"
run 25 $H launch -n 2 -- $A --json "$OUT/timeline-pe.json"
