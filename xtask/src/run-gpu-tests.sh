#!/usr/bin/env bash
# Runs halo's GPU tests from this bundle: no Rust toolchain or network needed, only the NVIDIA driver.
#
#   run-gpu-tests.sh [--bin NAME]... [-- TEST-ARGS...]
#
# Without --bin: halo-downstream and every binary in tests/; with --bin, those (tests/NAME, or
# halo-downstream). TEST-ARGS go to every test binary (filters, --skip, --ignored, --nocapture).
#
# HALO_REQUIRE_GPUS=N says how many GPUs this machine was promised (default 1): a test that needs
# at most N GPUs fails when they are missing; one that needs more is listed at the end as
# "not run (needs G GPUs)". HALO_TEST_TIER=long also runs the long cases (the default tier lists
# them as "not run (long tier)"). Every binary is bounded by GPU_TEST_TIMEOUT_S seconds (default
# 1200), and with GPU_TEST_BUDGET_S the whole run by that many: each binary gets at most what is
# left of it (less 15 s for the summary), and a binary with less than 10 s left is not started but
# counted as failed ("the run's time budget ran out"), so the summary always comes. Output goes to the terminal and under $GPU_TEST_LOGS (default $OUT/tests, or
# ./gpu-logs/tests). The run ends with a summary (passed, failed by name, not run by reason and
# name) and the line `gpu-tests: N passed, M failed`; it exits 1 when anything failed.
#
# Every binary uses the kernels embedded in it: HALO_PTX_DIR is unset (ptx/ holds the same
# kernels, for `HALO_PTX_DIR=ptx ./halo ...` and for reading).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bins=()
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) [ $# -ge 2 ] || { echo "run-gpu-tests.sh: --bin needs a test name" >&2; exit 2; }; bins+=("$2"); shift 2 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
unset HALO_PTX_DIR
export HALO_REQUIRE_GPUS="${HALO_REQUIRE_GPUS:-1}"
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
# The tests that launch ranks (gpu_pes, gpu_multiprocess: halo launch -n 2 -- ...) run this
# bundle's halo; the UCX ones need ucx/ (--with-ucx).
export HALO_BIN="${HALO_BIN:-$here/halo}"
if [ -d "$here/ucx" ] && [ -z "${HALO_UCX_DIR:-}" ]; then export HALO_UCX_DIR="$here/ucx"; fi
limit="${GPU_TEST_TIMEOUT_S:-1200}"
deadline=""
[ -n "${GPU_TEST_BUDGET_S:-}" ] && deadline=$(( $(date +%s) + GPU_TEST_BUDGET_S ))
logs="${GPU_TEST_LOGS:-${OUT:-./gpu-logs}/tests}"
mkdir -p "$logs"
if [ ${#bins[@]} -eq 0 ]; then
    bins=(halo-downstream)
    for t in "$here"/tests/*; do bins+=("$(basename "$t")"); done
fi
echo "run-gpu-tests: HALO_REQUIRE_GPUS=$HALO_REQUIRE_GPUS HALO_TEST_TIER=${HALO_TEST_TIER:-default} ($(nvidia-smi -L 2>/dev/null | grep -c '^GPU') GPU(s) listed by nvidia-smi); logs in $logs"

passed=0; failed=0; skipped=0; ignored=0
failures=(); notrun=(); partial=(); ignores=(); times=()
# Reads one test binary's output (the harness's lines and the tests' own stderr lines in the order
# they came, one thread) and prints a line per test: P (passed), S (passed but said SKIPPED: it,
# or a part of it, did not run), F (failed), I (ignored), R (still running when the binary ended).
results() {
    awk 'function done(r) { if (cur != "") print r "\t" cur; cur = "" }
        {
            line = $0
            if (match(line, /^test .* \.\.\. /)) { done("R"); cur = substr(line, 6, RLENGTH - 10); said = 0; line = substr(line, RLENGTH + 1) }
            if (cur == "") next
            if (index(line, "SKIPPED (") == 1) said = 1
            else if (line == "ok") done(said ? "S" : "P")
            else if (line == "FAILED") done("F")
            else if (index(line, "ignored") == 1) { why = line; sub(/^ignored,? */, "", why); if (why != "") cur = cur " (" why ")"; done("I") }
        }
        END { done("R") }' "$1"
}
for name in "${bins[@]}"; do
    if [ "$name" = halo-downstream ]; then exe="$here/halo-downstream"; args=(); else exe="$here/tests/$name"; args=(--test-threads=1 "$@"); fi
    if [ ! -x "$exe" ]; then
        echo "== $name: not in this bundle"; failed=$((failed + 1)); failures+=("$name (no such binary)"); continue
    fi
    echo "== $name"
    out="$logs/$name.log"
    start=$(date +%s)
    this=$limit
    if [ -n "$deadline" ]; then
        left=$(( deadline - start - 15 ))
        if [ "$left" -lt 10 ]; then
            echo "not started: the run's time budget (GPU_TEST_BUDGET_S=$GPU_TEST_BUDGET_S) ran out"
            failed=$((failed + 1)); failures+=("$name (not started: the run's time budget ran out)"); continue
        fi
        [ "$left" -lt "$this" ] && this=$left
    fi
    # One thread, stdout and stderr into one file in the order they come: a SKIPPED line then sits
    # between its test's `test NAME ... ` and its result.
    timeout -k 10 "$this" "$exe" "${args[@]}" >"$out" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    cat "$out"
    times+=("$name ${took}s rc=$rc")
    if [ "$name" = halo-downstream ]; then
        if [ $rc -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("halo-downstream (rc=$rc)"); fi
    else
        why="rc=$rc"; { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && why="killed after ${this} s"
        n=0
        while IFS=$'\t' read -r r t; do
            [ -n "$r" ] || continue
            n=$((n + 1))
            case "$r" in
                P) passed=$((passed + 1)) ;;
                S) skipped=$((skipped + 1)); partial+=("$name::$t") ;;
                F) failed=$((failed + 1)); failures+=("$name::$t") ;;
                I) ignored=$((ignored + 1)); ignores+=("$name::$t") ;;
                R) failed=$((failed + 1)); failures+=("$name::$t ($why)") ;;
            esac
        done < <(results "$out")
        if [ $rc -ne 0 ] && ! results "$out" | grep -q $'^[FR]\t'; then
            # Crashed or refused its arguments before or between tests.
            failed=$((failed + 1)); failures+=("$name ($why)")
        fi
        if [ $rc -eq 0 ] && [ $n -eq 0 ]; then
            failed=$((failed + 1)); failures+=("$name (ran no test: does a filter match nothing?)")
        fi
    fi
    while IFS= read -r l; do notrun+=("$l"); done < <(grep -o 'SKIPPED ([^)]*) \[[^]]*\]' "$out" | sed -E 's/^SKIPPED \(([^)]*)\) \[(.*)\]$/\1|'"$name"': \2/')
done

echo
echo "== summary"
for t in "${times[@]}"; do echo "  $t"; done
echo "passed: $passed"
echo "failed: $failed"
for f in "${failures[@]}"; do echo "  FAILED $f"; done
echo "skipped (passed what ran, but said SKIPPED: the test or a part of it did not run): $skipped"
for t in "${partial[@]}"; do echo "  $t"; done
if [ ${#notrun[@]} -gt 0 ]; then
    printf '%s\n' "${notrun[@]}" | sort -t'|' -k1,1 -s | awk -F'|' '{ if ($1 != last) { print "not run: " $1 ":"; last = $1 } print "  " $2 }'
fi
if [ $ignored -gt 0 ]; then
    echo "ignored (benchmarks and blocked tests: run with --ignored): $ignored"
    for t in "${ignores[@]}"; do echo "  $t"; done
fi
# What each test cost (its GPU fixture writes `TIME [test]: S s` when it ends): the ten slowest,
# by which the suites' default and long tiers are chosen.
slowest=$(cat "$logs"/*.log 2>/dev/null | grep -o 'TIME \[[^]]*\]: [0-9.]* s' | sed -E 's/^TIME \[(.*)\]: ([0-9.]+) s$/\2 \1/' | sort -rn | head -n 10)
if [ -n "$slowest" ]; then
    echo "slowest GPU tests (seconds, from their fixtures):"
    printf '%s\n' "$slowest" | sed 's/^/  /'
fi
echo "gpu-tests: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
