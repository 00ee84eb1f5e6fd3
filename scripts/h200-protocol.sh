#!/usr/bin/env bash
# Protocol v4 (issue 15, device side of issue 19) on two H200s: the GPU tests of the new protocol,
# exchange checks of every path and signalling mode, then the timings behind the targets
# (signal one-way <= 1.25 us; fused coordinates <= 6.0 us from 6k to 180k atoms; forces <= coords
# + 1 us; X+F <= 12 us at 45k; graph replay of X+F <= 10 us at 45k). Logs and JSON under $OUT.
source "$(dirname "$0")/h200-common.sh"
export HALO_PTX_DIR=$B/ptx HALO_REQUIRE_GPU=1
T=$B/tests/gpu_exchange
# 1. Correctness first (each must print "test result: ok").
run 120 $T --test-threads=1 a_fast_neighbour_one_step_ahead_does_not_strand_a_late_rank
run 180 $T --test-threads=1 one_direction_loops_with_changing_data_end_right
run 60  $T --test-threads=1 changing_the_grid_between_steps_keeps_the_force_chain_in_step
run 120 $T --test-threads=1 a_captured_step_replays_a_thousand_times_without_resets
run 300 $T --test-threads=1
# Every path between two PEs: direct, forced put with each signalling mode (fenced-put through the
# P2P transport here: the fence is a membar.sys and the 8-byte put a store), and the bench's graphs.
run 90 $H launch -n 2 -- exchange-check --grid 2x1x1 --transport fused,fused-tma,per-pulse-direct --steps 20000 --check-every 500
for M in put-signal fenced-put; do
  HALO_PUT_SIGNAL=$M run 90 $H launch -n 2 -- exchange-check --grid 2x1x1 --pulses 2 --transport fused,per-pulse --force-put --steps 5000 --check-every 100
done
run 90 $H exchange-check --grid 2x2x2 --transport fused,fused-tma,per-pulse-direct --steps 20000 --check-every 500 --home-atoms 1500
run 120 $H launch -n 2 -- verify --ranks 2x1x1 --atoms 45000 --steps 200
# 2. The targets. One process (two GPUs), then two PEs; the floor line gives the signal one-way time.
A="bench --ranks 2x1x1 --transport fused,fused-tma --atoms 6000,45000,180000 --repeats 7 --warmup 2 --steps 200 --graph --quiet"
run 200 $H $A --json "$OUT/protocol-1proc.json"
run 240 $H launch -n 2 -- $A --json "$OUT/protocol-pe.json"
for f in protocol-1proc protocol-pe; do
  echo "== $f: signal one-way (us)"; grep -o '"one_way_latency_us":{[^}]*}' "$OUT/$f.json"
  echo "== $f: rows (variant, atoms, coords/forces/step medians in us)"
  grep -o '"atoms":[0-9]*,"variant":"[^"]*"\|"coords_us":{"median":[0-9.]*\|"forces_us":{"median":[0-9.]*\|"step_us":{"median":[0-9.]*' "$OUT/$f.json" | paste - - - - -
done
