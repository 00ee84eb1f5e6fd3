#!/usr/bin/env bash
# Runs one GPU suite of this bundle (the table is gpu-suites.txt beside this script):
#
#   gpu-suite.sh [SUITE] [--long] [--lines=A-B]  (SUITE defaults to `correctness`; `--list` lists them)
#
# --lines=A-B (or =N) runs only the suite's commands [A] to [B] (numbered as its log numbers them),
# to split a suite over several runs that each have a time limit.
# Every command is bounded by `timeout`; logs go to $OUT (or ./gpu-logs): SUITE.log starts with
# the machine block (GPUs, driver, CUDA, topology, MPS, library versions, the bundle's commit),
# then every command with its exit status and wall time, then a summary (passed, failed, not run
# and why) ending in `SUITE: N passed, M failed`. Exits 1 when any command failed.
# HALO_REQUIRE_GPUS=N (default 1) is the GPUs this machine was promised: a command that needs at
# most N fails when they are missing; one that needs more is "not run (needs G GPUs)".
# `ucx` lines that must pass need a GPU-CPU mapping for NVSHMEM's proxy atomics: without
# /dev/gdrdrv they are "not run" unless HALO_UCX_ATOMICS=1 says NVSHMEM 3.8+ and driver R610+ give one.
# --long also runs the table's long tier, sets HALO_TEST_TIER=long for the GPU tests (their long
# cases) and triples every command's time limit.
set -uo pipefail
first=1 last=1000000
B="$(cd "$(dirname "$0")" && pwd)"
TABLE="$B/gpu-suites.txt"
suite=correctness tier=default
for a in "$@"; do
    case "$a" in
        --long) tier=long ;;
        --list) awk '!/^#/ && NF { if (!seen[$1]++) print $1 }' "$TABLE"; exit 0 ;;
        --lines=*) r=${a#--lines=}; first=${r%%-*}; last=${r#*-}
                   if ! [[ "$first" =~ ^[0-9]+$ && "$last" =~ ^[0-9]+$ ]] || [ "$first" -gt "$last" ]; then
                       echo "gpu-suite.sh: --lines=$r: give A-B or N, the [n] numbers of the suite's commands" >&2; exit 2
                   fi ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        -*) echo "gpu-suite.sh: unknown option $a (use --long, --lines=A-B or --list)" >&2; exit 2 ;;
        *) suite=$a ;;
    esac
done
if ! awk -v s="$suite" '$1 == s { f = 1 } END { exit !f }' "$TABLE"; then
    echo "gpu-suite.sh: no suite \`$suite\`; the suites are: $(awk '!/^#/ && NF { if (!seen[$1]++) printf "%s ", $1 }' "$TABLE")" >&2
    exit 2
fi
# The words suite's timing-dependent tests need the GPU's own hardware queues, and a watchdog exit
# under MPS breaks the server for later clients: it runs without MPS.
# The daemon is matched by its program name (a command line that merely names it, such as the
# `echo quit | nvidia-cuda-mps-control` before this script, does not count), and given 5 s to end
# after a quit.
mps_running() { pgrep -f '^([^ ]*/)?nvidia-cuda-mps-control( |$)' >/dev/null 2>&1; }
if [ "$suite" = words ] && mps_running; then
    for _ in 1 2 3 4 5 6 7 8 9 10; do sleep 0.5; mps_running || break; done
    if mps_running; then
        echo "gpu-suite.sh: the words suite runs without CUDA MPS, which is running: quit it first (echo quit | nvidia-cuda-mps-control)" >&2
        exit 2
    fi
fi
OUT="${OUT:-./gpu-logs}"; mkdir -p "$OUT"; OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/$suite.log"
export OUT HALO_REQUIRE_GPUS="${HALO_REQUIRE_GPUS:-1}" NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
export HALO_BIN="$B/halo" GPU_TEST_LOGS="$OUT/tests-$suite"
unset HALO_PTX_DIR
[ "$tier" = long ] && export HALO_TEST_TIER=long
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$gpus" -ge 2 ]; then GPULIST=0,1; else GPULIST=0; fi
MPI="${HALO_MPI_DIR:-$B/mpi}"
U="${HALO_UCX_DIR:-$B/ucx}"

log() { echo "$*" | tee -a "$LOG"; }

machine_block() {
    echo "# gpu-suite $suite (tier $tier), $(date -u +%Y-%m-%dT%H:%M:%SZ), host $(hostname)"
    echo "# bundle commit: $(cat "$B/COMMIT" 2>/dev/null || echo unknown)"
    echo "# HALO_REQUIRE_GPUS=$HALO_REQUIRE_GPUS, $gpus GPU(s) listed by nvidia-smi"
    nvidia-smi --query-gpu=index,name,memory.total,compute_mode,clocks.max.sm,pcie.link.gen.max --format=csv,noheader 2>&1 | sed 's/^/# gpu: /'
    nvidia-smi -q 2>/dev/null | grep -E '^(Driver Version|CUDA Version)' | sed 's/  */ /g; s/^/# /'
    nvidia-smi topo -m 2>/dev/null | sed -n '1,/^$/p' | grep -v '^$' | sed 's/^/# topo: /'
    if mps_running; then echo "# MPS: running"; else echo "# MPS: not running (PEs sharing a GPU are time-sliced)"; fi
    echo "# host: $(uname -sr), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
    "$B/halo" info 2>&1 | grep -iE 'nvshmem|nccl|cuda|driver|version' | head -8 | sed 's/^/# info: /'
    [ -d "$U" ] && echo "# UCX: $U" || echo "# UCX: none in this bundle (--with-ucx)"
    [ -x "$MPI/mpich/bin/mpiexec" ] && echo "# MPICH: $MPI/mpich" || echo "# MPICH: none in this bundle (--mpi)"
}

# Functions the table calls (`call NAME ARGS`): checks that are more than one command.

# SIGKILL of one rank mid-run: the launcher must end by itself, non-zero, and leave no rank.
sigkill_one_rank() {
    local k="$OUT/sigkill.log" victim left
    timeout 60 "$B/halo" launch -n 2 --gpus "$GPULIST" -- exchange-check --steps 1000000 --transport fused >"$k" 2>&1 &
    local job=$!
    sleep 6
    victim=$(pgrep -f 'exchange-check --steps 1000000' | tail -1)
    [ -n "$victim" ] || { echo "no rank to kill (did the run start?)"; tail -20 "$k"; wait "$job"; return 1; }
    echo "killing pid $victim"; kill -9 "$victim"
    wait "$job"; local rc=$?
    tail -5 "$k"
    left=$(pgrep -f 'exchange-check --steps 1000000' | wc -l)
    echo "launcher rc=$rc, ranks left: $left"
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$left" -eq 0 ]
}

# A heap too small is refused with a size to set; that size must then work.
heap_size_the_message_suggests() {
    local h="$OUT/heap-too-small.log" size
    NVSHMEM_SYMMETRIC_SIZE=1M timeout -k 10 60 "$B/halo" launch -n 2 --gpus "$GPULIST" -- exchange-check --grid 2x1x1 --transport fused --steps 10 --home-atoms 200000 >"$h" 2>&1
    echo "too small: rc=$?"; grep -i -m3 'symmetric' "$h"
    size=$(grep -o 'for example NVSHMEM_SYMMETRIC_SIZE=[0-9]*[MG]' "$h" | head -1 | cut -d= -f2)
    [ -n "$size" ] || { echo "the refusal suggests no NVSHMEM_SYMMETRIC_SIZE"; tail -20 "$h"; return 1; }
    echo "suggested NVSHMEM_SYMMETRIC_SIZE=$size"
    NVSHMEM_SYMMETRIC_SIZE=$size timeout -k 10 50 "$B/halo" launch -n 2 --gpus "$GPULIST" -- exchange-check --grid 2x1x1 --transport fused --steps 10 --home-atoms 200000
}

# The benchmark targets from bench CSVs (columns: 1 atoms, 2 variant, 5 coords median, 11 step
# median, last: check): fused X+F >= 2.0x direct-copy and >= 2.5x staged at 6k and 45k atoms,
# fused at least as fast as nccl at every size; every row's check must say ok.
bench_targets() {
    local bad=0 f
    for f in "$@"; do
        f="$OUT/$f.csv"; [ -f "$f" ] || { echo "missing $f"; bad=1; continue; }
        echo "== targets, $f"
        awk -F, 'NR > 1 && $11 != "" { step[$1 "," $2] = $11; coords[$1 "," $2] = $5; sizes[$1] = 1 }
          END { for (a in sizes) { f = step[a ",fused"]; if (f == "") continue
            line = sprintf("%7d atoms: fused %.1f us (coords %.1f)", a, f, coords[a ",fused"])
            if (step[a ",direct-copy"] != "") { r = step[a ",direct-copy"] / f; line = line sprintf(", direct-copy %.2fx", r); if (a + 0 <= 45000) line = line (r >= 2.0 ? " (met)" : " (MISSED)") }
            if (step[a ",staged"] != "") { r = step[a ",staged"] / f; line = line sprintf(", staged %.2fx", r); if (a + 0 <= 45000) line = line (r >= 2.5 ? " (met)" : " (MISSED)") }
            if (step[a ",nccl"] != "") { r = step[a ",nccl"] / f; line = line sprintf(", nccl %.2fx", r) (r >= 1.0 ? " (met)" : " (MISSED)") }
            print line } }' "$f" | sort -n
        echo "== checks, $f"
        awk -F, 'NR > 1 { print $1, $2, $NF; if ($NF !~ /^ok/) bad = 1 } END { exit bad }' "$f" || bad=1
    done
    return $bad
}

# The C API's per-step cost over the Rust API's on the C++ example's halo, from gpu_capi's log (the
# two APIs in alternating blocks on the same buffers and streams; the test fails only beyond 1.25,
# so that a noisy machine does not fail it; this line holds the target, C/Rust <= 1.05). Beside it,
# for the record, the example program's own median at 45,000 atoms (an earlier line of the suite,
# another process) over the test's Rust median.
capi_ratio() {
    local f="$GPU_TEST_LOGS/gpu_capi.log" r rust cpp
    r=$(grep -o 'C/Rust [0-9.]*' "$f" 2>/dev/null | tail -n 1 | cut -d' ' -f2)
    [ -n "$r" ] || { echo "no C/Rust line in $f (did \`tests gpu_capi\` run in this suite?)"; return 1; }
    rust=$(grep -o 'Rust API median [0-9.]*' "$f" | tail -n 1 | awk '{ print $4 }')
    cpp=$(grep 'capi-cpp: PASS: 2 ranks in one process.* 45000 home atoms' "$LOG" | grep -o 'median [0-9.]*' | tail -n 1 | cut -d' ' -f2)
    [ -n "$cpp" ] && [ -n "$rust" ] &&
        awk -v c="$cpp" -v r="$rust" 'BEGIN { printf "examples/capi-cpp (its own process) %.2f us / Rust API %.2f us: %.3f\n", c, r, c / r }'
    # Between 2 PEs (gpu_capi_pes, if it ran): each PE's ratio; the target holds them on a pair of
    # GPUs, and on one GPU (PEs sharing it) they are shown for the record.
    local pes=$(grep -o 'C API between PEs: PE [0-9]* of 2 on GPU [0-9]*.*C/Rust [0-9.]*' "$GPU_TEST_LOGS/gpu_capi_pes.log" 2>/dev/null | sort -u)
    local pe_bad=0
    if [ -n "$pes" ]; then
        while read -r line; do
            local pr=${line##*C/Rust }
            if [ "$gpus" -ge 2 ]; then
                awk -v r="$pr" -v l="${line%%, the halo*}" 'BEGIN { printf "%s: C/Rust %.3f (target <= 1.05): %s\n", l, r, (r <= 1.05 ? "met" : "MISSED"); exit !(r <= 1.05) }' || pe_bad=1
            else
                echo "${line%%, the halo*}: C/Rust $pr (two PEs sharing one GPU: for the record; the target holds on a pair of GPUs)"
            fi
        done <<<"$pes"
    fi
    awk -v r="$r" 'BEGIN { printf "C API step / Rust API step, same process, same buffers and streams: %.3f (target <= 1.05): %s\n", r, (r <= 1.05 ? "met" : "MISSED"); exit !(r <= 1.05) }' && [ "$pe_bad" -eq 0 ]
}

# The MD rows of md-bench JSON files: transport, atoms, step median, ns/day, search share, graph,
# checked. A file whose command did not run here (its GPUs are missing) is said and left out; none
# at all fails.
md_rows() {
    local f shown=0
    for f in "$@"; do
        if [ ! -f "$OUT/$f.json" ]; then echo "== $f: not written here (its command did not run)"; continue; fi
        echo "== $f: transport, atoms, step_us_median, ns_per_day, search_share, graph, checked"
        grep -o '"transport": "[^"]*"\|"atoms": [0-9]*\|"step_us_median": [0-9.e+-]*\|"ns_per_day": [0-9.e+-]*\|"search_share": [0-9.e+-]*\|"graph": [a-z]*\|"checked": [a-z]*' "$OUT/$f.json" | paste - - - - - - - || return 1
        shown=$((shown + 1))
    done
    [ "$shown" -gt 0 ]
}

machine_block | tee "$LOG"
passed=0; failed=0
failures=(); notrun=()
n=0
while read -r s t secs need expect rest; do
    [ "$s" = "$suite" ] || continue
    n=$((n + 1))
    { [ "$n" -ge "$first" ] && [ "$n" -le "$last" ]; } || { notrun+=("outside --lines=$first-$last|[$n] $rest"); continue; }
    [ "$t" = default ] || [ "$tier" = long ] || { notrun+=("long tier (--long)|[$n] $rest"); continue; }
    [ "$tier" = long ] && secs=$((secs * 3))
    rest=${rest//@OUT/$OUT}; rest=${rest//@B/$B}; rest=${rest//@GPUS/$GPULIST}
    read -r -a words <<<"$rest"
    envs=()
    while [ ${#words[@]} -gt 0 ] && [[ ${words[0]} =~ ^[A-Z_][A-Z0-9_]*= ]]; do envs+=("${words[0]}"); words=("${words[@]:1}"); done
    what=${words[0]}; args=("${words[@]:1}")
    if [ "$gpus" -lt "$need" ]; then
        if [ "$need" -le "$HALO_REQUIRE_GPUS" ]; then
            log ""; log "=== [$n] $rest"; log "FAILED: needs $need GPUs, $gpus present, HALO_REQUIRE_GPUS=$HALO_REQUIRE_GPUS promised them"
            failed=$((failed + 1)); failures+=("[$n] $rest (needs $need GPUs, $gpus present)"); continue
        fi
        notrun+=("needs $need GPU(s)|[$n] $rest"); continue
    fi
    case "$what" in
        tests) bins=(); while [ ${#args[@]} -gt 0 ] && [ "${args[0]}" != -- ]; do [ "${args[0]}" = all ] || bins+=(--bin "${args[0]}"); args=("${args[@]:1}"); done
               cmd=("$B/run-gpu-tests.sh" "${bins[@]}" "${args[@]}")
               [ -n "${GPU_TEST_TIMEOUT_S:-}" ] || envs+=("GPU_TEST_TIMEOUT_S=$((secs > 40 ? secs - 20 : secs))")
               # The line's binaries share its limit: the runner stops starting them when it runs
               # out, and its summary (which says so) survives.
               envs+=("GPU_TEST_BUDGET_S=$((secs > 40 ? secs - 10 : secs))") ;;
        halo|stencil3d|halo-downstream) cmd=("$B/$what" "${args[@]}") ;;
        capi-cpp) cmd=("$B/capi/capi-cpp" "${args[@]}") ;;
        mpich) [ -x "$MPI/mpich/bin/mpiexec" ] || { notrun+=("no MPICH in the bundle (cargo xtask bundle --mpi)|[$n] $rest"); continue; }
               cmd=("$MPI/mpich/bin/mpiexec" "${args[@]}") ;;
        ompi) [ -x "$MPI/openmpi/bin/mpirun" ] || { notrun+=("no Open MPI in the bundle (cargo xtask bundle --mpi)|[$n] $rest"); continue; }
              o="$(cd "$MPI/openmpi" && pwd)"
              envs+=("OPAL_PREFIX=$o" "LD_LIBRARY_PATH=$o/lib:${LD_LIBRARY_PATH:-}" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
              cmd=("$o/bin/mpirun" --bind-to none -x NVSHMEM_DISABLE_NVLS -x NCCL_NVLS_ENABLE "${args[@]}") ;;
        ucx) [ -d "$U" ] || { notrun+=("no UCX in the bundle (cargo xtask bundle --with-ucx)|[$n] $rest"); continue; }
             # NVSHMEM's proxy needs a GPU-CPU mapping for UCX's atomics (GDRCopy's gdrdrv, or
             # NVSHMEM 3.8+ with driver R610+, which HALO_UCX_ATOMICS=1 vouches for); without one
             # only the lines that must fail can run.
             if [ "$expect" != nz ] && [ ! -e /dev/gdrdrv ] && [ "${HALO_UCX_ATOMICS:-0}" != 1 ]; then
                 notrun+=("UCX without a GPU-CPU mapping for NVSHMEM's proxy atomics (no /dev/gdrdrv; HALO_UCX_ATOMICS=1 where NVSHMEM 3.8+ and driver R610+ give one)|[$n] $rest"); continue
             fi
             envs+=("LD_LIBRARY_PATH=$U/libucx/lib:$U/libucx_cu13.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "UCX_MODULE_DIR=$U/libucx/lib/ucx"
                    NVSHMEM_REMOTE_TRANSPORT=ucx NVSHMEM_DISABLE_P2P=1 UCX_TLS=tcp,cuda_copy,self UCX_NET_DEVICES=lo)
             cmd=("$B/${args[0]}" "${args[@]:1}") ;;
        call) cmd=() ;;
        *) log "gpu-suites.txt: unknown command \`$what\` in: $rest"; failed=$((failed + 1)); failures+=("[$n] $rest (unknown command)"); continue ;;
    esac
    log ""; log "=== [$n] $rest"
    start=$(date +%s.%N)
    if [ "$what" = call ]; then
        ( [ ${#envs[@]} -eq 0 ] || export "${envs[@]}"; "${args[0]}" "${args[@]:1}" ) </dev/null 2>&1 | tee -a "$LOG"; rc=${PIPESTATUS[0]}
    else
        timeout -k 10 "$secs" env "${envs[@]}" "${cmd[@]}" </dev/null 2>&1 | tee -a "$LOG"; rc=${PIPESTATUS[0]}
    fi
    wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    # `timeout` ends a command that ran out its time with 124 (137 after the -k grace). A command's
    # own 137 (`halo launch` when a rank was SIGKILLed: 128 + 9, the shell's convention) within its
    # time is its answer, not a timeout; so the limit's end decides, not the code alone.
    timed_out=$({ [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && awk -v w="$wall" -v s="$secs" 'BEGIN { exit !(w >= s - 0.5) }' && echo 1)
    if [ "$expect" = nz ]; then ok=$([ "$rc" -ne 0 ] && [ -z "$timed_out" ] && echo 1); else ok=$([ "$rc" -eq "$expect" ] && echo 1); fi
    if [ -n "$ok" ]; then
        log "rc=$rc (expected $expect) wall_s=$wall: passed"; passed=$((passed + 1))
    else
        why="rc=$rc, expected $expect"; [ -n "$timed_out" ] && why="killed after $secs s"
        log "rc=$rc (expected $expect) wall_s=$wall: FAILED"; failed=$((failed + 1)); failures+=("[$n] $rest ($why)")
    fi
done <"$TABLE"

{
    echo; echo "== summary: suite $suite, tier $tier"
    echo "passed: $passed"
    echo "failed: $failed"
    for f in "${failures[@]}"; do echo "  FAILED $f"; done
    if [ ${#notrun[@]} -gt 0 ]; then
        printf '%s\n' "${notrun[@]}" | awk -F'|' '{ if (!($1 in seen)) { order[++k] = $1; seen[$1] = 1 } items[$1] = items[$1] "  " $2 "\n" }
            END { for (i = 1; i <= k; i++) printf "not run: %s:\n%s", order[i], items[order[i]] }'
    fi
    echo "$suite: $passed passed, $failed failed"
} | tee -a "$LOG"
[ "$failed" -eq 0 ]
