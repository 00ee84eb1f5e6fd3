//! Support for GPU tests: find a GPU or say loudly why the test cannot run.
//!
//! Without a GPU a test prints `SKIPPED (no GPU): <reason>` and passes, so CI machines without
//! GPUs stay green; with `HALO_REQUIRE_GPU=1` (set by the bundle's `run-gpu-tests.sh`) the same
//! situation fails the test instead, so a GPU run can never report a skipped check as a pass.
//! A GPU whose driver is loaded but fails to initialise ([`gpu::GpuStatus::DriverFailed`]) fails
//! the test whatever the setting: that machine is broken, not GPU-less.

use crate::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use crate::gpu::{self, CudaContext, KernelModule};
use std::sync::Arc;

/// A GPU, its context and the loaded halo module.
pub struct GpuFixture {
    /// GPU 0's context.
    pub ctx: Arc<CudaContext>,
    /// The kernels.
    pub module: KernelModule,
}

/// Whether a missing GPU must fail the test (`HALO_REQUIRE_GPU=1`).
pub fn gpu_required() -> bool {
    std::env::var("HALO_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The number of GPUs, or `None` (after printing why, or panicking under `HALO_REQUIRE_GPU=1`)
/// when there are fewer than `min`.
pub fn gpus_or_skip(test: &str, min: usize) -> Option<usize> {
    let reason = match gpu::gpu_status() {
        gpu::GpuStatus::Present(n) if n >= min => return Some(n),
        gpu::GpuStatus::Present(n) => format!("{min} GPUs needed, {n} present"),
        gpu::GpuStatus::Absent(r) => r,
        gpu::GpuStatus::DriverFailed(r) => panic!("{test}: a GPU is present but unusable: {r}"),
    };
    if gpu_required() {
        panic!("{test}: HALO_REQUIRE_GPU=1 but {reason}");
    }
    // Written to the stderr handle directly: the test harness captures `eprintln!` of passing
    // tests, and a skip must stay visible in CI logs.
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED (no GPU) {test}: {reason}");
    None
}

/// GPU 0 with the kernels loaded, or `None` as [`gpus_or_skip`]. Panics if a GPU is present but
/// the kernels cannot be loaded: that is a failure, not a reason to skip.
pub fn gpu_or_skip(test: &str) -> Option<GpuFixture> {
    gpus_or_skip(test, 1)?;
    let ctx = gpu::open_device(0).unwrap_or_else(|e| panic!("{test}: {e}"));
    let artifacts = KernelArtifacts::locate(DEFAULT_ARCH).unwrap_or_else(|e| panic!("{test}: {e}"));
    let module = KernelModule::load(&ctx, &artifacts).unwrap_or_else(|e| panic!("{test}: {e}"));
    Some(GpuFixture { ctx, module })
}
