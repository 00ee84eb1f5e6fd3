#!/usr/bin/env bash
# Issue 20 (several PEs per GPU, bounded start-up, clean phases) and issue 19 (the put path through
# NVSHMEM's proxy and UCX transport, emulated on one node; no hang when that transport fails).
# Needs 2 GPUs and a bundle built with `cargo xtask bundle --with-ucx` (its ucx/ folder, or
# HALO_UCX_DIR). Every command is bounded; logs and JSON go to $OUT. Budget: about 12 minutes.
#
#   bash scripts/h200-pes.sh target/bundle
#
# Part 1 is pass/fail (the GPU tests); parts 2-4 are the measurements behind docs/running.md.
source "$(dirname "$0")/h200-common.sh"
U=${HALO_UCX_DIR:-$B/ucx}
# The emulated network (the same variables as halo::launch::ucx::emulated_network_env).
UCX=(env "LD_LIBRARY_PATH=$U/libucx/lib:$U/libucx_cu13.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "UCX_MODULE_DIR=$U/libucx/lib/ucx"
     NVSHMEM_REMOTE_TRANSPORT=ucx NVSHMEM_DISABLE_P2P=1 UCX_TLS=tcp,cuda_copy,self UCX_NET_DEVICES=lo)
nvidia-smi --query-gpu=index,name,compute_mode --format=csv | tee -a "$OUT/$LOG"
# PEs that share a GPU run concurrently under MPS, time-sliced without it.
(pgrep -l nvidia-cuda-mps || echo "no MPS daemon: PEs sharing a GPU are time-sliced") | tee -a "$OUT/$LOG"

# 1. Pass/fail: the GPU tests of both issues (each prints its runs' wall times).
#    gpu_pes: 3 PEs refused; 4 PEs with the issue's commands; rings of 4 and 8 PEs with one and two
#    pulses (exchange-check 2000 steps, bench X-only/F-only/full 2000 steps each); UCX
#    exchange-check, verify 2x1x1/4x1x1/2x2x1 and bench with fenced puts; the dying proxy.
HALO_REQUIRE_GPU=1 HALO_BIN=$H HALO_UCX_DIR=$U run 1500 $B/tests/gpu_pes --test-threads=1
HALO_REQUIRE_GPU=1 run 300 $B/tests/gpu_exchange --test-threads=1 stale_larger_signals a_missing_signal

# 1b. Several PEs per GPU without halo launch (issue 20): MPICH's mpiexec (PMI bootstrap), 4 ranks on
#    2 GPUs, routed paths. No rendezvous here, so the router's facts, plans and safe points are
#    gathered by NVSHMEM host puts and a barrier: every PE prints "host data gathered by NVSHMEM
#    puts and a barrier (several PEs per GPU)" and "... 4 checked, OK on this PE"; rc=0.
#    Needs MPICH in the bundle (`cargo xtask bundle --mpi`) or HALO_MPI_DIR.
MPICH=${HALO_MPI_DIR:-$B/mpi}/mpich/bin/mpiexec
if [ -x "$MPICH" ]; then
    CUDA_VISIBLE_DEVICES=0,1 HALO_PES_PER_GPU=2 run 300 $MPICH -n 4 $H exchange-check --grid 4x1x1 --steps 200 --check-every 50 --transport fused
else
    echo "SKIPPED 1b: no MPICH mpiexec at $MPICH (cargo xtask bundle --mpi)" | tee -a "$OUT/$LOG"
fi

# 2. Bounded start-up: 3 PEs on 2 GPUs are refused at once (rc=1, with counts that work); forced,
#    NVSHMEM's init hangs and every rank's watchdog ends it after HALO_STARTUP_TIMEOUT_S (rc=86,
#    "rank N of 3 (GPU g): `NVSHMEM init` did not finish within 20.0 s", likely cause and fix).
run 30 $H launch -n 3 --gpus 0,1 -- exchange-check --grid 3x1x1 --steps 20
HALO_STARTUP_TIMEOUT_S=20 run 60 $H launch -n 3 --gpus 0,1 --allow-uneven-gpus -- exchange-check --grid 3x1x1 --steps 20

# 3. What several PEs per GPU cost (docs/running.md "Several PEs per GPU"): the same 45k-atom
#    system, fused, on 2 GPUs with 1, 2 and 4 PEs per GPU, and the issue's bench command as given.
A="bench --transport fused --atoms 45000 --steps 500 --repeats 5 --warmup 1 --quiet"
run 120 $H launch -n 2 -- $A --ranks 2x1x1 --json "$OUT/pes-1-per-gpu.json"
run 180 $H launch -n 4 --gpus 0,1 -- $A --ranks 4x1x1 --json "$OUT/pes-2-per-gpu.json"
run 240 $H launch -n 8 --gpus 0,1 -- $A --ranks 8x1x1 --json "$OUT/pes-4-per-gpu.json"
run 600 $H launch -n 4 --gpus 0,1 -- bench --ranks 4x1x1 --transport fused,per-pulse-direct --atoms 6000,45000 --steps 2000 --wait-timeout-ms 3000 --quiet

# 4. The put path through NVSHMEM's proxy and UCX (fenced-put signalling, chosen automatically)
#    next to NVLink: the same bench with and without the emulated network.
run 120 "${UCX[@]}" $H launch -n 2 -- exchange-check --grid 2x1x1 --steps 10 --transport fused,per-pulse
run 180 "${UCX[@]}" $H launch -n 4 --gpus 0,1 -- exchange-check --grid 4x1x1 --pulses 2 --steps 100 --check-every 10 --transport fused,per-pulse
run 120 "${UCX[@]}" $H launch -n 2 -- verify --ranks 2x1x1 --steps 50
run 180 "${UCX[@]}" $H launch -n 4 --gpus 0,1 -- verify --ranks 4x1x1 --steps 50
run 180 "${UCX[@]}" $H launch -n 4 --gpus 0,1 -- verify --ranks 2x2x1 --steps 50
P="bench --ranks 2x1x1 --transport fused,per-pulse --atoms 6000,45000,180000 --steps 200 --repeats 5 --warmup 1 --quiet"
run 180 "${UCX[@]}" $H launch -n 2 -- $P --json "$OUT/ucx-proxy.json"
run 120 $H launch -n 2 -- $P --json "$OUT/nvlink.json"

# 5. A dying proxy: put-signal needs a remote atomic that UCX without GDRCopy cannot do; NVSHMEM's
#    proxy aborts. The run must end by itself, non-zero, within 10 s of the first failure message,
#    with halo's own message (a device wait that expired, or "nothing moved ... stuck").
#    (`time` prints the whole run's wall time; gpu_pes measures from the first failure line.)
HALO_PUT_SIGNAL=put-signal run 60 "${UCX[@]}" $H launch -n 2 -- exchange-check --grid 2x1x1 --steps 10 --transport fused --wait-timeout-ms 1000
