#!/usr/bin/env bash
# Benchmarks, soak runs and the router on two H200s, each command bounded by a timeout, in order of
# importance. Logs under $OUT.
source "$(dirname "$0")/h200-common.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpus.txt" 2>&1
run 60 $H bench-kernels --json "$OUT/kernels.json"
run 130 $H launch -n 2 -- bench --ranks 2x1x1 --atoms 6000,45000,180000,1500000 --repeats 5 --warmup 2 --steps 100 --graph --json "$OUT/bench-pe.json" --csv "$OUT/bench-pe.csv" --plot "$OUT/bench-pe.png"
run 70 $H launch -n 2 -- exchange-check --grid 2x1x1 --transport fused --steps 100000 --check-every 1000
run 70 $H exchange-check --grid 2x2x2 --transport fused --steps 100000 --check-every 1000 --home-atoms 1500
run 100 $H bench --ranks 2x2x2 --gpus 1 --atoms 6000,45000 --repeats 5 --warmup 2 --steps 100 --graph --json "$OUT/bench-2x2x2.json"
run 20 $H route
run 30 $H launch -n 2 -- calibrate --out "$OUT/calibration.json"
HALO_ROUTE_CALIBRATION="$OUT/calibration.json" run 15 $H route --size 64
HALO_ROUTE_CALIBRATION="$OUT/calibration.json" run 15 $H route --size 4MiB
HALO_ROUTE_CALIBRATION="$OUT/calibration.json" HALO_ROUTE_DEBUG=1 run 30 $H launch -n 2 -- exchange-check --route --steps 20
for T in nvlink-tma nvshmem-put staged; do HALO_FORCE_TRANSPORT=$T run 20 $H launch -n 2 -- exchange-check --route --steps 20; done
