#!/usr/bin/env bash
# Device call 1: the new tests of the checks issue, demo, negative control, dead proxy; then the correctness suite.
set -uo pipefail
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
T0=$(date +%s)
tar -xJf target/bundle.tar.xz -C /tmp && B=/tmp/bundle
cd $B
nvidia-cuda-mps-control -d && echo "MPS started"
trap 'echo quit | nvidia-cuda-mps-control; echo MPS stopped' EXIT
L=$OUT/run1.log
r() { local t=$1; shift; echo; echo "=== [$(( $(date +%s) - T0 ))s] $*"; ( time timeout "$t" "$@" ) 2>&1; echo "rc=$?"; } 
{
nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader
r 120 env HALO_REQUIRE_GPUS=1 ./tests/gpu_exchange empty_reverse_pulse fused_kernels_without_overlap_exchange_alike timed_out_word word_timeout_reports_step one_deadline_per_wait --test-threads=1
r 150 env HALO_REQUIRE_GPUS=1 ./tests/gpu_md negative_control:: --test-threads=1 --nocapture
r 60 ./halo exchange-check --grid 2x2x1 --transport fused --steps 3 --fault corrupt-atom:rank=3,pulse=0
r 60 ./halo verify --ranks 2x2x1 --steps 3 --fault drop-atom:rank=2,pulse=1
r 60 ./halo demo
r 60 env HALO_REQUIRE_GPUS=1 ./tests/gpu_pes a_proxy_that_dies_in_init --test-threads=1 --nocapture
r 150 env HALO_REQUIRE_GPUS=1 ./tests/gpu_multiprocess cli_checks:: md_bench_rows_are_checked the_md_step_over_two_pes the_bench_pe_runner --test-threads=1
} 2>&1 | tee $L
left=$(( 560 - ($(date +%s) - T0) ))
echo "=== correctness suite with ${left}s left" | tee -a $L
[ $left -gt 60 ] && HALO_REQUIRE_GPUS=1 timeout $left ./gpu-suite.sh correctness 2>&1 | tail -80 | tee $OUT/suite-tail.log
ls $OUT
