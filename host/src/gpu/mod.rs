//! GPU plumbing over cudarc: the driver (loaded at run time), device memory, the kernel module
//! and launches. cudarc's safe layer provides contexts, streams and events; halo keeps its own
//! thin typed buffers and module so that NVSHMEM's symmetric memory and `nvshmemx_cumodule_init`
//! (which need raw handles) fit in beside ordinary allocations.

mod memory;
mod module;
pub mod wait;

pub use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
pub use memory::{DeviceBuffer, DeviceMemory};
pub use module::{KernelModule, LaunchShape};

use crate::error::{CudaContextExt, HaloError, Result};
use std::sync::Arc;

/// Why no GPU can be used here, or `None` when at least one is present.
pub fn gpu_unavailable_reason() -> Option<String> {
    // SAFETY: only probes for the library; nothing is called through it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Some("the CUDA driver library (libcuda.so) is not installed on this machine".into());
    }
    match cudarc::driver::result::init().and_then(|_| cudarc::driver::result::device::get_count()) {
        Ok(0) => Some("the CUDA driver found no GPU".into()),
        Ok(_) => None,
        Err(e) => Some(format!("the CUDA driver failed to initialise: {e}")),
    }
}

/// Number of visible GPUs (0 without a driver).
pub fn device_count() -> usize {
    if gpu_unavailable_reason().is_some() {
        return 0;
    }
    cudarc::driver::result::device::get_count().map(|n| n as usize).unwrap_or(0)
}

/// Opens GPU `ordinal` (its primary context, current on this thread) with cudarc's automatic
/// cross-stream event tracking switched off: halo orders its streams itself, with events and
/// device signals, and hidden syncs would hide bugs and cost time.
pub fn open_device(ordinal: usize) -> Result<Arc<CudaContext>> {
    if let Some(reason) = gpu_unavailable_reason() {
        return Err(HaloError::NoGpu(reason));
    }
    let ctx = CudaContext::new(ordinal).during(format!("opening GPU {ordinal}"))?;
    // SAFETY: called before any buffer or stream of this context exists.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

/// `sm_XY` for a context's device.
pub fn arch_of(ctx: &CudaContext) -> Result<String> {
    let (major, minor) = ctx.compute_capability().during("reading the compute capability")?;
    Ok(format!("sm_{major}{minor}"))
}
