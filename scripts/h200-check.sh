#!/usr/bin/env bash
# The checks run on the lent H200 machines (no Rust there): GPU tests from the bundle, the exchange
# in one process and over NVSHMEM on two GPUs, failure handling. Logs go to $OUT (or ./h200-logs).
# Usage: scripts/h200-check.sh [bundle-dir]
source "$(dirname "$0")/h200-common.sh"

run 300 "$B/run-gpu-tests.sh"
run 300 $H exchange-check --grid 2x2x2 --pulses 2 --steps 100
run 300 $H launch -n 2 -- info
run 300 $H launch -n 2 -- exchange-check --grid 2x1x1 --pulses 1 --steps 500
run 300 $H launch -n 2 -- exchange-check --grid 2x1x1 --pulses 2 --steps 200
run 300 $H launch -n 2 -- exchange-check --grid 2x1x1 --pulses 2 --steps 200 --force-put
run 300 $H launch -n 2 -- exchange-check --grid 2x1x1 --steps 3 --transport fused --inject-skip-rank 1 --wait-timeout-ms 1000
echo; echo "=== SIGKILL of one rank mid-run"
( time timeout 60 $H launch -n 2 -- exchange-check --steps 1000000 --transport fused ) > "$OUT/kill.log" 2>&1 &
sleep 6; victim=$(pgrep -f 'exchange-check --steps 1000000' | tail -1); echo "killing pid $victim"; kill -9 "$victim"; wait
tail -5 "$OUT/kill.log"; echo "orphans: $(pgrep -f 'exchange-check --steps 1000000' | wc -l)"
