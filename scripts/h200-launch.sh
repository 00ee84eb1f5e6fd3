#!/usr/bin/env bash
# Why an empty launch measured 5.1 us between PEs and 3.6 us in one process (issue 15): the floor's
# T_launch (GPU time per back-to-back empty launch) and the host time per launch call, in one
# process, between two PEs with NVSHMEM's proxy thread off (the new default under `halo launch`),
# with it on, and with it on but the launching thread left where it was. Logs and JSON under $OUT;
# the summary at the end prints each run's launch_us and launch_host_us.
source "$(dirname "$0")/h200-common.sh"
A="bench --ranks 2x1x1 --transport fused --atoms 6000 --repeats 7 --warmup 1 --steps 100 --quiet"
run 90 $H $A --json "$OUT/launch-1proc.json"
run 120 $H launch -n 2 -- $A --json "$OUT/launch-pe-proxy-off.json"
NVSHMEM_DISABLE_LOCAL_ONLY_PROXY=0 run 120 $H launch -n 2 -- $A --json "$OUT/launch-pe-proxy-on.json"
NVSHMEM_DISABLE_LOCAL_ONLY_PROXY=0 HALO_PIN_LAUNCHER=0 run 120 $H launch -n 2 -- $A --json "$OUT/launch-pe-proxy-on-unpinned.json"
# Where the threads of a PE run (proxy thread pinned? on the launcher's core?), from NVSHMEM's own log.
NVSHMEM_DISABLE_LOCAL_ONLY_PROXY=0 NVSHMEM_DEBUG=INFO RUST_LOG=info run 60 $H launch -n 2 -- exchange-check --grid 2x1x1 --steps 10 2>&1 | grep -iE "proxy|affinity|launching thread" | head -20
for f in launch-1proc launch-pe-proxy-off launch-pe-proxy-on launch-pe-proxy-on-unpinned; do
  echo "== $f"; grep -o '"launch_us":{[^}]*}\|"launch_host_us":{[^}]*}' "$OUT/$f.json"
done
