#!/usr/bin/env bash
# Issue 18 on two H200s: faults end cleanly and say why. Jitter on rings of 3 and 4 ranks (X only,
# F only, full steps; one process and 4 PEs; 100,000 steps, checked every 1,000), NVSHMEM's heap too
# small, the GPU out of memory, a PE killed in the middle of a fused step (halo launch, mpiexec),
# and a 20,000-step MD soak. One log per fault under $OUT: jitter-*.log, fault-*.log, soak-*.log,
# each with `start`/`end` epoch times, the exit status and the wall time, and for a kill the time
# from the kill to the end of the job (kill_to_end_s). Expected GPU time: about 6 minutes
# (tests 15 s; jitter in one process 6 x ~5 s; 4 PEs 3 x <= 60 s, fewer steps if time-slicing two
# PEs per GPU is slow, said in the log; memory 6 x ~6 s; kills 4 x ~10 s; soak < 2 min).
# Usage: bash scripts/h200-faults.sh target/bundle   (mpiexec on PATH, or MPIEXEC=/path/to/mpiexec)
source "$(dirname "$0")/h200-common.sh"
export HALO_PTX_DIR=$B/ptx HALO_REQUIRE_GPU=1
MPIEXEC=${MPIEXEC:-mpiexec}
# The longest a 4-PE jitter run may take; longer runs get fewer steps (said in the log).
PE_BUDGET_S=${PE_BUDGET_S:-60}
now() { date +%s.%N; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }

# timed NAME SECONDS CMD...: runs CMD bounded by SECONDS into $OUT/NAME.log with start and end
# times, rc and wall_s; when a rank killed itself (HALO_FAULT), also kill_at and kill_to_end_s.
timed() {
  local name=$1 t=$2; shift 2
  local log="$OUT/$name.log" start end rc kill_at
  start=$(now)
  { echo "=== $*"; echo "start $start"; } | tee "$log"
  timeout -k 5 "$t" "$@" 2>&1 | tee -a "$log"; rc=${PIPESTATUS[0]}
  end=$(now)
  echo "end $end rc=$rc wall_s=$(sub "$end" "$start")" | tee -a "$log"
  kill_at=$(grep -o 'kills itself with SIGKILL .* (at [0-9.]* s since the epoch)' "$log" | head -1 | sed 's/.*(at \([0-9.]*\) s.*/\1/')
  if [ -n "$kill_at" ]; then echo "kill_at $kill_at kill_to_end_s=$(sub "$end" "$kill_at")" | tee -a "$log"; fi
}

# 0. The GPU tests of this issue (delay kernel, jittered rings in one process, memory checks).
timed fault-gpu-tests 300 $B/tests/gpu_faults --test-threads=1

# 1. Jitter: up to 30 us before about half of every rank's launches, host and GPU (HALO_JITTER_US
# semantics, seeded). Fused kernels: monotonic waits and credits are what the jitter tests.
J="exchange-check --transport fused --check-every 1000 --home-atoms 1500"
for n in 3 4; do
  for ph in x f xf; do
    timed jitter-1proc-ring$n-$ph 120 $H $J --grid ${n}x1x1 --phase $ph --steps 100000 --jitter-us 30:$((n * 10 + ${#ph})):both
  done
done
# 4 PEs on 2 GPUs (3 PEs cannot start with NVSHMEM 3.4.5). Two PEs share each GPU and only
# time-slice, so a probe first measures the step rate and the run gets as many of the 100,000 steps
# as fit in $PE_BUDGET_S.
timed jitter-pe4-probe 120 $H launch -n 4 --gpus 0,1 -- $J --grid 4x1x1 --phase xf --steps 2000 --jitter-us 30:40:both
us=$(grep -o '([0-9.]* µs per step' "$OUT/jitter-pe4-probe.log" | head -1 | tr -d '(' | cut -d' ' -f1)
steps=100000
if [ -n "$us" ]; then
  fit=$(awk -v us="$us" -v b="$PE_BUDGET_S" 'BEGIN { n = int(b * 1e6 / us / 1000) * 1000; print (n < 100000 ? n : 100000) }')
  [ "$fit" -lt 1000 ] && fit=1000
  steps=$fit
fi
echo "4 PEs: $us us per step in the probe -> $steps steps per phase (budget ${PE_BUDGET_S} s)" | tee -a "$OUT/jitter-pe4-probe.log"
for ph in x f xf; do
  timed jitter-pe4-$ph $((PE_BUDGET_S + 60)) $H launch -n 4 --gpus 0,1 -- $J --grid 4x1x1 --phase $ph --steps $steps --jitter-us 30:$((40 + ${#ph})):both
done

# 2. Memory. Each must end non-zero within seconds, every PE with the same message naming the need
# and the fix; none may hang.
M="exchange-check --grid 2x1x1 --transport fused --steps 10"
NVSHMEM_SYMMETRIC_SIZE=1M timed fault-heap-too-small 60 $H launch -n 2 -- $M --home-atoms 200000
NVSHMEM_DISABLE_CUDA_VMM=1 NVSHMEM_SYMMETRIC_SIZE=1M timed fault-heap-too-small-static 60 $H launch -n 2 -- $M --home-atoms 200000
# The size the message suggests must then work.
S=$(grep -o 'for example NVSHMEM_SYMMETRIC_SIZE=[0-9]*[MG]' "$OUT/fault-heap-too-small.log" | head -1 | cut -d= -f2)
NVSHMEM_SYMMETRIC_SIZE=${S:-missing} timed fault-heap-raised 60 $H launch -n 2 -- $M --home-atoms 200000
# What NVSHMEM itself makes of NVSHMEM_SYMMETRIC_SIZE=1M with a static heap (its INFO lines).
NVSHMEM_DEBUG=INFO NVSHMEM_DEBUG_SUBSYS=ALL NVSHMEM_DISABLE_CUDA_VMM=1 NVSHMEM_SYMMETRIC_SIZE=1M \
  timed fault-heap-probe 60 bash -c "$H launch -n 2 -- $M --home-atoms 2000 2>&1 | grep -i -E 'heap|SYMMETRIC_SIZE|granularity|OK on|error' | head -40"
# GPU 1 nearly full (rank 1 holds all but 256 MiB): both PEs refuse before allocating.
HALO_TEST_RESERVE_GIB=200:1 timed fault-device-oom-pe 60 $H launch -n 2 -- $M --home-atoms 2000000
# One process, both GPUs nearly full.
HALO_TEST_RESERVE_GIB=200 timed fault-device-oom-1proc 60 $H $M --home-atoms 10000000

# 3. A PE killed right after enqueueing a step's coordinate halo. The others must end within 10 s
# (kill_to_end_s) and the output must name the dead rank.
K="exchange-check --transport fused --steps 100000 --check-every 1000 --wait-timeout-ms 2000"
HALO_FAULT=kill@20000:1 timed fault-kill-launch-2pe 60 $H launch -n 2 -- $K --grid 2x1x1
HALO_FAULT=kill@2000:2 timed fault-kill-launch-4pe 90 $H launch -n 4 --gpus 0,1 -- $K --grid 4x1x1
if command -v "$MPIEXEC" >/dev/null; then
  # Hydra's default: it kills the job when a rank dies, and says which.
  HALO_FAULT=kill@20000:1 timed fault-kill-mpiexec 60 "$MPIEXEC" -n 2 $H $K --grid 2x1x1
  # Without Hydra's clean-up the survivor's own bounded wait must name the dead rank.
  HALO_FAULT=kill@20000:1 timed fault-kill-mpiexec-survivor 60 "$MPIEXEC" -disable-auto-cleanup -n 2 $H $K --grid 2x1x1
else
  echo "NOT RUN: $MPIEXEC is not on PATH (set MPIEXEC); the mpiexec rows stay open" | tee "$OUT/fault-kill-mpiexec.log"
fi

# 4. MD soak: 45,000 atoms over 2 GPUs, re-decomposed every nstlist steps (verify's default and
# its pair-list buffer, which go together), checked (references and cross-rank checksums) every
# 1,000 steps.
timed soak-md-2pe 300 $H launch -n 2 -- verify --ranks 2x1x1 --atoms 45000 --steps 20000 --check-every 1000

# Summary: what proves each row (docs/reliability.md, "Faults tried on the H200s").
echo; echo "=== summary"
for f in "$OUT"/jitter-*.log "$OUT"/fault-*.log "$OUT"/soak-*.log; do
  printf '%-40s %s %s\n' "$(basename "$f")" "$(grep -o 'rc=[0-9]* wall_s=[0-9.]*' "$f" | tail -1)" "$(grep -o 'kill_to_end_s=[0-9.]*' "$f" | tail -1)"
done | tee -a "$OUT/faults-summary.log"
grep -h -E "steps \((x|f|xf)\) in .* OK on|jitter applied" "$OUT"/jitter-*.log | tee -a "$OUT/faults-summary.log"
grep -h -E "symmetric heap|out of memory|cannot build|allocates it|kills itself|was killed|BAD TERMINATION|KILLED BY|timed out|integrity:|drift" \
  "$OUT"/fault-*.log "$OUT"/soak-*.log | sort | uniq | head -60 | tee -a "$OUT/faults-summary.log"
grep -q -i drift "$OUT/soak-md-2pe.log" || echo "soak: no energy drift reported (needs the MD step's energy reporting)" | tee -a "$OUT/faults-summary.log"
