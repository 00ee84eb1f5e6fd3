#!/usr/bin/env bash
# Issue 13's two-GPU targets in one device call (under 600 s on a pair of H200s): what `md2` measures
# first, without its long correctness tail. Two verify runs (one PE per GPU, 45k atoms 2x1x1 with the
# GPU redecomposition; one process, 6k atoms 2x2x2 on both GPUs), then `halo md-bench` for the
# targets: 45k atoms on 2 GPUs, one PE per GPU, fused beside the host-orchestrated baselines (the
# issue's `md-45k-2gpu.json`), 6k and 180k the same way, and 6k/45k/180k on one GPU. Every step is
# counted (searches included), median of 5 repeats of 1000 steps after 200. Logs and JSON under $OUT.
source "$(dirname "$0")/h200-common.sh"
export HALO_PTX_DIR=$B/ptx HALO_REQUIRE_GPU=1
BASE=staged
if $H md-bench --help 2>/dev/null | grep -q direct-copy; then BASE=staged,direct-copy; fi
echo "baselines: $BASE"
run 120 $H launch -n 2 -- verify --atoms 45000 --ranks 2x1x1 --steps 200 --nstlist 50 --check-every 10
run 90 $H verify --atoms 6000 --ranks 2x2x2 --steps 100 --nstlist 50 --check-every 10
M="md-bench --steps 1000 --repeats 5 --warmup 200"
run 120 $H launch -n 2 -- $M --atoms 45000 --transport fused,$BASE --graph --json "$OUT/md-45k-2gpu.json"
run 150 $H launch -n 2 -- $M --atoms 6000,180000 --transport fused,$BASE --graph --json "$OUT/md-2gpu-pe.json"
run 100 $H $M --gpus 1 --atoms 6000,45000,180000 --transport fused --graph --json "$OUT/md-1gpu.json"
for f in md-45k-2gpu md-2gpu-pe md-1gpu; do
  echo "== $f: transport, atoms, step_us_median, ns_per_day, search_share, graph"
  grep -o '"transport": "[^"]*"\|"atoms": [0-9]*\|"step_us_median": [0-9.e+-]*\|"ns_per_day": [0-9.e+-]*\|"search_share": [0-9.e+-]*\|"graph": [a-z]*' "$OUT/$f.json" | paste - - - - - -
done
