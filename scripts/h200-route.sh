#!/usr/bin/env bash
# Router on real GPUs: discovery, calibration, routed exchange, forced transports.
set -uo pipefail
B=${1:-target/bundle}
OUT=${OUT:-h200-logs}; mkdir -p "$OUT"
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
H=$B/halo
run() { echo; echo "=== $*"; ( time timeout 300 "$@" ) 2>&1 | tee -a "$OUT/route.log"; echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT/route.log"; }
run $H route
run $H launch -n 2 -- route
run $H launch -n 2 -- calibrate --out "$OUT/calibration.json"
for s in 64 16KiB 4MiB; do HALO_ROUTE_CALIBRATION="$OUT/calibration.json" run $H route --size $s; done
HALO_ROUTE_CALIBRATION="$OUT/calibration.json" HALO_ROUTE_DEBUG=1 run $H launch -n 2 -- exchange-check --route --steps 20
for T in nvlink-store nvlink-tma nvshmem-put staged; do HALO_FORCE_TRANSPORT=$T run $H launch -n 2 -- exchange-check --route --steps 20; done
