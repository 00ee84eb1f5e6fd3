//! GPU plumbing over cudarc: the driver (loaded at run time), device memory, the kernel module
//! and launches. cudarc's safe layer provides contexts, streams and events; halo keeps its own
//! thin typed buffers and module so that NVSHMEM's symmetric memory and `nvshmemx_cumodule_init`
//! (which need raw handles) fit in beside ordinary allocations.

mod memory;
mod module;
mod staging;
pub(crate) mod stuck;
pub mod wait;

pub use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
pub use memory::{DeviceBuffer, DeviceMemory};
pub use module::{KernelModule, LaunchShape};
pub use staging::{StagedPart, Staging, grown_capacity};

use crate::error::{CudaContextExt, HaloError, Result};
use std::sync::Arc;

/// The caller's CUDA stream `raw` (a `CUstream`, the same handle as the runtime's `cudaStream_t`)
/// as a stream halo can enqueue on (hand it to an exchange's `use_streams`). Halo never destroys
/// it. A stream of another context than `ctx` (another GPU, or a context the caller created
/// itself) is refused: halo's kernels are loaded in `ctx`, the device's primary context, which is
/// the one the CUDA runtime uses.
///
/// # Safety
/// `raw` must be a valid stream, or null for the context's legacy default stream, and must stay
/// valid while the returned stream, or anything holding it (an exchange), is used.
pub unsafe fn borrow_stream(ctx: &Arc<CudaContext>, raw: cudarc::driver::sys::CUstream) -> Result<Arc<CudaStream>> {
    use cudarc::driver::sys;
    if !raw.is_null() {
        let mut owner: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: a query on a valid stream (the caller's contract) into a local.
        let rc = unsafe { sys::cuStreamGetCtx(raw, &mut owner) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            return Err(HaloError::Cuda {
                what: "asking the driver which context owns the caller's stream".into(),
                source: cudarc::driver::DriverError(rc),
            });
        }
        if owner != ctx.cu_ctx() {
            return Err(HaloError::InvalidInput(format!(
                "the stream given for GPU {} belongs to another CUDA context (another GPU, or a context of the caller's own): \
                 create it while GPU {} is current (cudaSetDevice), in its primary context",
                ctx.ordinal(),
                ctx.ordinal()
            )));
        }
    }
    // SAFETY: the caller's contract, as cudarc's.
    Ok(unsafe { ctx.wrap_borrowed_stream(raw) })
}

/// What this machine offers: GPUs, none, or GPUs the driver cannot bring up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuStatus {
    /// The driver works and sees this many GPUs (at least one).
    Present(usize),
    /// No usable GPU and nothing suggesting one: no driver library, its stub, no device, or no
    /// NVIDIA kernel driver. Tests skip (loudly) on this.
    Absent(String),
    /// An NVIDIA kernel driver is loaded (so a GPU is there) but the CUDA driver failed to
    /// initialise or to count the devices: a broken machine, never a reason to skip a test.
    DriverFailed(String),
}

/// Classifies what the driver reported. Pure, so every case is tested without a GPU:
/// `library` is whether libcuda could be found, `init` and `count` are `cuInit`'s and
/// `cuDeviceGetCount`'s outcomes (`count` is only looked at after a successful init), and
/// `kernel_driver` whether the NVIDIA kernel driver is loaded (`/proc/driver/nvidia` or
/// `/dev/nvidiactl` exists).
pub fn classify(
    library: bool,
    init: std::result::Result<(), cudarc::driver::sys::CUresult>,
    count: std::result::Result<i32, cudarc::driver::sys::CUresult>,
    kernel_driver: bool,
) -> GpuStatus {
    use cudarc::driver::sys::CUresult;
    if !library {
        return GpuStatus::Absent("the CUDA driver library (libcuda.so) is not installed on this machine".into());
    }
    match init {
        Err(CUresult::CUDA_ERROR_NO_DEVICE) => GpuStatus::Absent("the CUDA driver found no GPU".into()),
        Err(CUresult::CUDA_ERROR_STUB_LIBRARY) => GpuStatus::Absent("libcuda.so is the CUDA toolkit's stub, not a driver".into()),
        Err(e) if kernel_driver => GpuStatus::DriverFailed(format!(
            "the NVIDIA kernel driver is loaded but the CUDA driver failed to initialise ({e:?}): check the driver installation (nvidia-smi)"
        )),
        Err(e) => GpuStatus::Absent(format!("no NVIDIA kernel driver is loaded (cuInit: {e:?})")),
        Ok(()) => match count {
            Ok(n) if n > 0 => GpuStatus::Present(n as usize),
            Ok(_) | Err(CUresult::CUDA_ERROR_NO_DEVICE) => GpuStatus::Absent("the CUDA driver found no GPU".into()),
            Err(e) => GpuStatus::DriverFailed(format!("the CUDA driver initialised but could not count the GPUs ({e:?})")),
        },
    }
}

/// Whether the CUDA driver library (`libcuda.so`) can be loaded, asked once per process: cudarc's
/// probe opens and closes the library, after a search over up to 17 names, every time it is
/// asked, which a call made at every step (the C API's) must not pay.
pub fn driver_library_present() -> bool {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: only probes for the library; nothing is called through it.
    *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() })
}

/// What this machine offers (see [`classify`]).
pub fn gpu_status() -> GpuStatus {
    if !driver_library_present() {
        return classify(false, Ok(()), Ok(0), false);
    }
    let init = cudarc::driver::result::init().map_err(|e| e.0);
    let count = if init.is_ok() { cudarc::driver::result::device::get_count().map_err(|e| e.0) } else { Ok(0) };
    let kernel_driver = std::path::Path::new("/proc/driver/nvidia").exists() || std::path::Path::new("/dev/nvidiactl").exists();
    classify(true, init, count, kernel_driver)
}

/// Why no GPU can be used here, or `None` when at least one is present.
pub fn gpu_unavailable_reason() -> Option<String> {
    match gpu_status() {
        GpuStatus::Present(_) => None,
        GpuStatus::Absent(why) | GpuStatus::DriverFailed(why) => Some(why),
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
    let count = device_count();
    if ordinal >= count {
        return Err(HaloError::InvalidInput(missing_gpu_message(ordinal, count, std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref())));
    }
    let ctx = CudaContext::new(ordinal).during(format!("opening GPU {ordinal}"))?;
    // SAFETY: called before any buffer or stream of this context exists.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

/// Why GPU `ordinal` cannot be opened when only `count` are visible, and how to fit the ranks on
/// them: `halo launch -n N` gives PE `r` GPU `r` unless `--gpus` lists the GPUs to share.
fn missing_gpu_message(ordinal: usize, count: usize, visible: Option<&str>) -> String {
    let shown = visible.map_or_else(String::new, |v| format!(" (CUDA_VISIBLE_DEVICES={v})"));
    let list = (0..count).map(|g| g.to_string()).collect::<Vec<_>>().join(",");
    format!(
        "GPU {ordinal} does not exist: {count} GPU(s) are visible here{shown}. Run at most {count} PE(s) per node, or let \
         several PEs share the GPUs with `halo launch -n N --gpus {list} -- …` (PEs that share a GPU time-slice it; \
         docs/running.md says what that costs), or pick the GPU with {}",
        crate::launch::env::ENV_DEVICE
    )
}

/// `sm_XY` for a context's device.
pub fn arch_of(ctx: &CudaContext) -> Result<String> {
    let (major, minor) = ctx.compute_capability().during("reading the compute capability")?;
    Ok(format!("sm_{major}{minor}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_gpu_is_named_with_the_ways_to_fit_the_ranks() {
        let m = missing_gpu_message(2, 2, Some("0,1"));
        assert!(m.starts_with("GPU 2 does not exist: 2 GPU(s) are visible here (CUDA_VISIBLE_DEVICES=0,1)"), "{m}");
        assert!(m.contains("--gpus 0,1") && m.contains("HALO_DEVICE"), "{m}");
        assert!(!missing_gpu_message(1, 1, None).contains("CUDA_VISIBLE_DEVICES"));
    }
    use cudarc::driver::sys::CUresult;

    #[test]
    fn a_broken_driver_is_told_apart_from_a_missing_gpu() {
        let absent = |s: GpuStatus| matches!(s, GpuStatus::Absent(_));
        assert!(absent(classify(false, Ok(()), Ok(2), true)), "no libcuda");
        assert!(absent(classify(true, Err(CUresult::CUDA_ERROR_NO_DEVICE), Ok(0), true)), "no device");
        assert!(absent(classify(true, Err(CUresult::CUDA_ERROR_STUB_LIBRARY), Ok(0), false)), "the toolkit's stub");
        assert!(absent(classify(true, Err(CUresult::CUDA_ERROR_UNKNOWN), Ok(0), false)), "no kernel driver, so no GPU");
        assert!(absent(classify(true, Ok(()), Ok(0), true)), "zero devices");
        assert_eq!(classify(true, Ok(()), Ok(2), true), GpuStatus::Present(2));
        // A GPU is there (the kernel driver is loaded) but CUDA cannot use it: a failure.
        for e in [CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, CUresult::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, CUresult::CUDA_ERROR_UNKNOWN] {
            match classify(true, Err(e), Ok(0), true) {
                GpuStatus::DriverFailed(why) => assert!(why.contains("failed to initialise") && why.contains(&format!("{e:?}")), "{why}"),
                other => panic!("{e:?}: {other:?}"),
            }
        }
        assert!(matches!(classify(true, Ok(()), Err(CUresult::CUDA_ERROR_UNKNOWN), true), GpuStatus::DriverFailed(_)));
    }
}
