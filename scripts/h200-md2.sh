#!/usr/bin/env bash
# Issue 13 on two H200s: the MD step on the nbnxm kernels. Correctness first (GPU tests, `halo verify`
# on 1-D, 2-D and 3-D grids with one and two pulses at 6k and 45k atoms, in one process and one PE
# per GPU, the NVE drift beside one rank), then `halo md-bench` for the targets (45k atoms: <= 60 us
# per step with fused on 2 GPUs, one PE per GPU; <= 100 us on 1 GPU; fused >= 1.3x the best
# host-orchestrated baseline's ns/day at 45k on 2 GPUs and >= 1.5x at 6k; 6k/45k/180k on 1 and 2
# GPUs). Logs and JSON under $OUT (copy $OUT/md-*.json to docs/results/). Every command is bounded.
source "$(dirname "$0")/h200-common.sh"
export HALO_PTX_DIR=$B/ptx HALO_REQUIRE_GPU=1
T=$B/tests
# The host-orchestrated baselines this build has (direct-copy once the baselines issue is merged).
BASE=staged
if $H md-bench --help 2>/dev/null | grep -q direct-copy; then BASE=staged,direct-copy; fi
echo "baselines: $BASE"

# 1. GPU tests (each must end with "test result: ok"; a SKIPPED line is a failure here).
run 300 $T/gpu_nbnxm --test-threads=1
run 600 $T/gpu_md --test-threads=1
run 120 $T/gpu_exchange --test-threads=1 replanning_between_steps_keeps_the_protocol_in_step

# 2. halo verify in one process on both GPUs: coordinates bit-exact, forces and energy within 1e-4 of
#    the undecomposed CPU reference ("N steps checked", never "not checked"); nstlist 50 so that a
#    second search replans the exchange inside the run. 4x1x1 at 6k and 8x1x1 at 45k have two pulses.
for g in 1x1x1 2x1x1 2x2x1 2x2x2 4x1x1; do
  run 240 $H verify --atoms 6000 --ranks $g --steps 100 --nstlist 50
done
for g in 1x1x1 2x1x1 2x2x1 2x2x2 8x1x1; do
  run 300 $H verify --atoms 45000 --ranks $g --steps 100 --nstlist 50 --check-every 10
done
run 240 $H verify --atoms 6000 --ranks 2x2x2 --steps 60 --nstlist 30 --transport staged
run 240 $H verify --atoms 6000 --ranks 2x2x2 --steps 60 --nstlist 30 --host-search
run 240 $H verify --atoms 6000 --ranks 2x2x2 --steps 100 --nstlist 25 --check-every 7 --graph

# 3. One PE per GPU (and 2 or 4 PEs per GPU for the 2-D and 3-D grids).
for a in 6000 45000; do
  run 300 $H launch -n 2 -- verify --atoms $a --ranks 2x1x1 --steps 100 --nstlist 50 --check-every 5
done
run 240 $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 60 --nstlist 30 --transport staged
run 240 $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 60 --nstlist 30 --transport fused-tma
run 240 $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 60 --nstlist 30 --transport per-pulse --force-put
run 240 $H launch -n 2 -- verify --atoms 45000 --ranks 2x1x1 --steps 100 --nstlist 25 --check-every 7 --graph
run 300 $H launch -n 4 --gpus 0,1 -- verify --atoms 6000 --ranks 2x2x1 --steps 60 --nstlist 30 --check-every 5
run 300 $H launch -n 4 --gpus 0,1 -- verify --atoms 6000 --ranks 4x1x1 --steps 60 --nstlist 30 --check-every 5
run 300 $H launch -n 8 --gpus 0,1 -- verify --atoms 45000 --ranks 2x2x2 --steps 40 --nstlist 20 --check-every 10

# 4. NVE drift: 10,000 steps, energies every 100, decomposed beside one rank (printed by PE 0:
#    "drift ... kJ/mol/ns per atom" twice; a few 1e-3 or less is good, GROMACS's default tolerance
#    allows 5).
run 300 $H launch -n 2 -- verify --atoms 45000 --ranks 2x1x1 --steps 100 --check-every 25 --nve-steps 10000 --energy-every 100
run 300 $H verify --atoms 6000 --ranks 2x2x2 --steps 100 --check-every 25 --nve-steps 10000 --energy-every 100

# 5. The targets. Every step counted (searches included), median of 5 repeats of 1000 steps;
#    GPU-initiated transports also with their steps replayed as CUDA graphs (`fused+graph`: plain and
#    prune steps, every step md-bench runs after a search).
M="md-bench --steps 1000 --repeats 5 --warmup 200"
run 400 $H launch -n 2 -- $M --atoms 45000 --transport fused,$BASE --graph --json "$OUT/md-45k-2gpu.json"
run 400 $H launch -n 2 -- $M --atoms 6000,180000 --transport fused,$BASE --graph --json "$OUT/md-2gpu-pe.json"
run 400 $H $M --gpus 1 --atoms 6000,45000,180000 --transport fused --graph --json "$OUT/md-1gpu.json"
run 400 $H $M --gpus 2 --atoms 6000,45000,180000 --transport fused,$BASE --graph --json "$OUT/md-2gpu-1proc.json"
# One rank with the grid sorted on the host at every search (gather, plan, grid, upload), beside the
# default search on the GPU alone, to show what that saves.
run 300 $H $M --gpus 1 --atoms 45000 --transport fused --host-grid --json "$OUT/md-1gpu-host-grid.json"
# Two PEs gathering the whole system and sorting the grids on the host at every search, beside the
# default (each PE plans from its own atoms, the GPU sorts the grids).
run 300 $H launch -n 2 -- $M --atoms 6000,45000 --transport fused --host-grid --json "$OUT/md-2gpu-host-grid.json"
# The same step with the lists searched on host threads, to show what the GPU search saves.
run 300 $H launch -n 2 -- $M --atoms 45000 --transport fused --host-search --json "$OUT/md-45k-2gpu-host-search.json"
# nstlist 50 beside 100 (shorter lists and halo, twice the searches).
run 300 $H launch -n 2 -- $M --atoms 45000 --transport fused --nstlist 50 --json "$OUT/md-45k-2gpu-nstlist50.json"
for f in md-45k-2gpu md-2gpu-pe md-1gpu md-1gpu-host-grid md-2gpu-host-grid md-2gpu-1proc md-45k-2gpu-host-search md-45k-2gpu-nstlist50; do
  echo "== $f: transport, atoms, step_us_median, ns_per_day, search_share, graph"
  grep -o '"transport": "[^"]*"\|"atoms": [0-9]*\|"step_us_median": [0-9.e+-]*\|"ns_per_day": [0-9.e+-]*\|"search_share": [0-9.e+-]*\|"graph": [a-z]*' "$OUT/$f.json" | paste - - - - - -
done
