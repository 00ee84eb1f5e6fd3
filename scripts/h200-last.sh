#!/usr/bin/env bash
# MD step timing over NVSHMEM, router re-check after the candidate fix, NVSHMEM heap error, info.
source "$(dirname "$0")/h200-common.sh"
run 200 $B/run-gpu-tests.sh
run 15 $H info
for T in fused fused-tma staged; do run 40 $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 200 --check-every 0 --transport $T; done
run 40 $H launch -n 2 -- verify --atoms 6000 --ranks 2x1x1 --steps 200 --check-every 0 --transport per-pulse --force-put
for T in fused; do run 60 $H launch -n 2 -- verify --atoms 45000 --ranks 2x1x1 --steps 50 --check-every 0 --transport $T; done
run 60 $H verify --atoms 6000 --ranks 2x2x2 --gpus 1 --steps 100 --check-every 0 --transport fused
NVSHMEM_SYMMETRIC_SIZE=16M run 40 $H launch -n 2 -- exchange-check --home-atoms 2000000 --steps 1 --transport fused
run 60 $H launch -n 2 -- calibrate --out "$OUT/calibration.json"
HALO_ROUTE_CALIBRATION="$OUT/calibration.json" run 15 $H route --size 12600 --among exchange
HALO_ROUTE_CALIBRATION="$OUT/calibration.json" HALO_ROUTE_DEBUG=1 run 30 $H launch -n 2 -- exchange-check --route --steps 20
HALO_FORCE_TRANSPORT=nccl run 20 $H launch -n 2 -- exchange-check --route --steps 20
