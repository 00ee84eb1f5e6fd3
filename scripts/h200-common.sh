# Sourced by the scripts/h200-*.sh suites: the bundle, the log folder, the site's environment, and
# `run SECONDS CMD...`, which prints the command, bounds it with a timeout, and appends its output
# and exit status to $OUT/$LOG.
set -uo pipefail
B=${1:-target/bundle}
OUT=${OUT:-h200-logs}; mkdir -p "$OUT"
LOG=${LOG:-$(basename "$0" .sh).log}
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0   # NVLink multicast stays off on shared machines
H=$B/halo
run() {
    local t=$1; shift
    echo; echo "=== $*"
    ( time timeout "$t" "$@" ) 2>&1 | tee -a "$OUT/$LOG"
    echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT/$LOG"
}
