#!/usr/bin/env bash
# Issue 17, the rest: routed paths by default, per-pulse paths inside one fused launch, agreed
# failover with an injected failure, and real process managers (MPICH's Hydra mpiexec with
# NVSHMEM's PMI bootstrap, Open MPI's mpirun with its MPI bootstrap).
# Build: cargo xtask bundle --mpi   (carries mpi/mpich and mpi/openmpi in the bundle; or carry
# target/mpi and set HALO_MPI_DIR=target/mpi). Run: bash scripts/h200-route2.sh target/bundle
source "$(dirname "$0")/h200-common.sh"
MPI=${HALO_MPI_DIR:-$B/mpi}
MPICH=$MPI/mpich/bin/mpiexec
OMPI=$(cd "$MPI/openmpi" 2>/dev/null && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI is relocated: its prefix, and its libmpi.so.40 for NVSHMEM's MPI bootstrap plugin. Ranks
# on this node inherit mpirun's environment (HALO_INJECT_FAILURE, NVSHMEM_DISABLE_NVLS included).
OMPIRUN=(env "OPAL_PREFIX=$OMPI" "LD_LIBRARY_PATH=$OMPI/lib:${LD_LIBRARY_PATH:-}" "$OMPI/bin/mpirun" --bind-to none
    -x NVSHMEM_DISABLE_NVLS -x NCCL_NVLS_ENABLE)

# 1. One fused launch mixing bulk copies, stores (and the router's plans) per pulse, checked
#    against the CPU reference: three tests, "ok" each.
HALO_REQUIRE_GPU=1 run 600 $B/tests/gpu_exchange --test-threads=1 pulses_of_one_rank_take_different_paths mixed_paths_for_every_element_type routed_plans_mix_paths_per_pulse

# 2. Routed by default, one process and two PEs: every run prints one `route: PE n: ...` line per
#    rank (transport, path, level, size, topology hash); bench writes them to the JSON's "routes".
run 300 $H exchange-check --steps 20
run 300 $H verify --ranks 2x1x1 --steps 20
run 600 $H bench --atoms 6000,180000 --repeats 5 --warmup 2 --steps 100 --quiet --json "$OUT/route2-bench-1proc.json"
run 300 $H launch -n 2 -- exchange-check --steps 20
run 300 $H launch -n 2 -- verify --ranks 2x1x1 --steps 20
run 600 $H launch -n 2 -- bench --atoms 6000,180000 --repeats 5 --warmup 2 --steps 100 --quiet --json "$OUT/route2-bench-2pe.json"

# 3. Injected failure, one-sided (PE 0 only, step 3): PE 0 skips its launch, PE 1's wait times
#    out; at the safe point both agree, pair 0-1 moves nvlink-store -> nvlink-tma on BOTH PEs,
#    steps 3.. run again and every step is checked. Expected on each rank:
#      route: PE r: ...=nvlink-store (direct-store, nvlink, ...)
#      route: safe point after step 3: 2 failure report(s) agreed, pairs switched: 0-1 nvlink-store -> nvlink-tma; rebuilding ...
#      route: PE r: ...=nvlink-tma (bulk-copy, nvlink, ..., failure epoch 1) ...
#      fused -> fused-tma: 20 steps (xf) in … s (… µs per step, checks included), 20 checked, OK on this PE (...), 1 re-run(s) after agreed failures
HALO_INJECT_FAILURE=nvlink-store:3@0 run 300 $H launch -n 2 -- exchange-check --steps 20 --wait-timeout-ms 500
# The MD step: the failure at step 12 rolls both PEs back to step 10 (the last search step with
# --nstlist 10), resets and drops the exchange, builds one on the agreed paths and runs 10..29 again
# (`1 stretch(es) of steps ran again`, `integrity: 30 checked steps`); the GPU test
# gpu_pes::the_md_step_fails_over_by_rolling_back_to_the_last_search_step checks the same.
HALO_INJECT_FAILURE=nvlink-store:12@0 run 300 $H launch -n 2 -- verify --ranks 2x1x1 --atoms 3000 --steps 30 --nstlist 10 --wait-timeout-ms 500
# Ranks of one process (every rank skips step 3): both ends of each pair move together.
HALO_INJECT_FAILURE=nvlink-store:3 run 300 $H exchange-check --steps 20 --wait-timeout-ms 500
# A safe point every 5 steps (fast path between them): the failure at step 7 re-runs steps 5..9.
HALO_INJECT_FAILURE=nvlink-store:7@1 run 300 $H launch -n 2 -- exchange-check --steps 20 --check-every 5 --safe-point-every 5 --wait-timeout-ms 500

# 4. MPICH's Hydra mpiexec: PMI bootstrap ("started by PMI (MPICH Hydra)"), routes printed, the
#    router's facts gathered through NVSHMEM after init; the same injected failure.
run 300 $MPICH -n 2 $H verify --ranks 2x1x1 --steps 20
run 300 $MPICH -n 2 $H exchange-check --steps 20
HALO_INJECT_FAILURE=nvlink-store:3@0 run 300 $MPICH -n 2 $H exchange-check --steps 20 --wait-timeout-ms 500
run 120 $MPICH -n 2 $H route --gather

# 5. Open MPI's mpirun: MPI bootstrap ("started by Open MPI"), bench with routes in its JSON.
run 600 "${OMPIRUN[@]}" -n 2 $H bench --atoms 6000,180000 --repeats 5 --warmup 2 --steps 100 --quiet --json "$OUT/route2-bench-ompi.json"
run 300 "${OMPIRUN[@]}" -n 2 $H verify --ranks 2x1x1 --steps 20
HALO_INJECT_FAILURE=nvlink-store:3@0 run 300 "${OMPIRUN[@]}" -n 2 $H exchange-check --steps 20 --wait-timeout-ms 500
grep -h '"transport"' "$OUT"/route2-bench-*.json | sort | uniq -c | tee -a "$OUT/$LOG"
