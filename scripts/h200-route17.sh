#!/usr/bin/env bash
# Issue 17, router side, on real GPUs (no driver wiring needed): NVML fabric discovery, routed
# exchanges in one process (no nvshmem-put candidates) and over two PEs (plans with levels,
# topology stamp and per-pulse paths), and config values that used to panic.
source "$(dirname "$0")/h200-common.sh"
# NVML fabric info per GPU ("route: GPU n (...): no NVLink fabric (state s, status t)" or a cluster/clique).
HALO_LOG=info run 300 $H route --size 16KiB
HALO_LOG=info run 300 $H launch -n 2 -- route --size 16KiB
# One process, two GPUs: planned among nvlink-store, nvlink-tma, staged only.
HALO_ROUTE_DEBUG=1 run 300 $H exchange-check --route --steps 20
# Forcing a put in one process is refused naming the override, before any GPU work.
HALO_FORCE_TRANSPORT=nvshmem-put run 300 $H exchange-check --route --steps 5
# Two PEs over NVSHMEM, symmetric plans, checked steps.
HALO_ROUTE_DEBUG=1 run 300 $H launch -n 2 -- exchange-check --route --steps 20
# Values that panicked before: now exit 1 with the variable named.
HALO_ROUTE_HALF_LIFE_S=1e300 run 60 $H route --synthetic --pes 4
HALO_ROUTE_W_LATENCY=inf run 60 $H route --synthetic --pes 4
