#!/usr/bin/env bash
# Router on real GPUs: discovery, calibration, routed exchange, forced transports.
source "$(dirname "$0")/h200-common.sh"
run 300 $H route
run 300 $H launch -n 2 -- route
run 300 $H launch -n 2 -- calibrate --out "$OUT/calibration.json"
for s in 64 16KiB 4MiB; do HALO_ROUTE_CALIBRATION="$OUT/calibration.json" run 300 $H route --size $s; done
HALO_ROUTE_CALIBRATION="$OUT/calibration.json" HALO_ROUTE_DEBUG=1 run 300 $H launch -n 2 -- exchange-check --route --steps 20
for T in nvlink-store nvlink-tma nvshmem-put staged; do HALO_FORCE_TRANSPORT=$T run 300 $H launch -n 2 -- exchange-check --route --steps 20; done
