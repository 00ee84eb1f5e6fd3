#!/usr/bin/env bash
# Issue 13: search threads on the H200 host now that they come from one pool per MD run (started once,
# kept warm between phases and searches, buffers reused) instead of threads spawned for every phase.
# The same md-bench as docs/results/md-bench-search-threads.log (1 thread: 91.6 us, 4: 110.6, 8: 118.1
# before the pool), one PE per GPU, 45,000 atoms, fused; then the host search path on 1 and 16 threads.
# Compare "step us" and "ms/search" per thread count: a count above 1 earns the default
# (search::DEFAULT_SEARCH_THREADS) only if its step time is lower than 1 thread's.
source "$(dirname "$0")/h200-common.sh"
export HALO_PTX_DIR=$B/ptx HALO_REQUIRE_GPU=1
for n in 1 2 4 8 16; do
  run 300 $H launch -n 2 -- md-bench --steps 500 --repeats 3 --warmup 100 --atoms 45000 --transport fused --search-threads $n
done
run 300 $H launch -n 2 -- md-bench --steps 500 --repeats 3 --warmup 100 --atoms 45000 --transport fused --host-search --search-threads 1
run 300 $H launch -n 2 -- md-bench --steps 500 --repeats 3 --warmup 100 --atoms 45000 --transport fused --host-search --search-threads 8
