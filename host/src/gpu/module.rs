//! The loaded kernel module: the cubin when it was built for this GPU, the PTX (JIT-compiled by
//! the driver) for a newer GPU, and a clear error for an older one or a stale build.

use crate::artifacts::KernelArtifacts;
use crate::error::{CudaContextExt, HaloError, Result};
use cudarc::driver::{CudaContext, CudaStream, result, sys};
use kernels_gpu::abi;
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchShape {
    /// Blocks along x and y.
    pub grid: (u32, u32),
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
}

impl LaunchShape {
    /// A 1-D grid-stride launch for `n` items: enough blocks of [`abi::BLOCK_SIZE`] threads to cover
    /// `n` (at least one block), capped at `max_blocks`.
    pub fn for_items(n: usize, max_blocks: u32) -> Self {
        let blocks = n.div_ceil(abi::BLOCK_SIZE as usize).clamp(1, max_blocks as usize) as u32;
        Self { grid: (blocks, 1), block: abi::BLOCK_SIZE, shared_bytes: 0 }
    }
}

/// A loaded halo module and its kernel handles.
pub struct KernelModule {
    module: sys::CUmodule,
    functions: HashMap<&'static str, sys::CUfunction>,
    ctx: Arc<CudaContext>,
    path: PathBuf,
    nvshmem: Option<Arc<crate::nvshmem::Nvshmem>>,
}

// SAFETY: module and function handles are plain driver handles usable from any thread once the
// context is bound; the driver API is thread-safe.
unsafe impl Send for KernelModule {}
// SAFETY: as above; launches only read the handles.
unsafe impl Sync for KernelModule {}

impl KernelModule {
    /// Loads the module for `ctx`'s GPU from `artifacts`, and checks its ABI version global.
    pub fn load(ctx: &Arc<CudaContext>, artifacts: &KernelArtifacts) -> Result<Self> {
        let device_arch = super::arch_of(ctx)?;
        let (image, path) = match check_arch(&device_arch, &artifacts.manifest.arch, &artifacts.ptx_location(), ctx.ordinal())? {
            ModuleChoice::Cubin => (artifacts.cubin()?, artifacts.cubin_location()),
            ModuleChoice::Ptx => (artifacts.ptx()?, artifacts.ptx_location()),
        };
        let mut image = image.into_owned();
        if path.extension().is_some_and(|e| e == "ptx") {
            image.push(0); // the driver reads PTX as a C string
        }
        ctx.bind_to_thread().during("binding the context")?;
        // SAFETY: `image` is a complete cubin or NUL-terminated PTX and outlives the call.
        let module = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }.during(format!("loading {}", path.display()))?;
        let mut this = Self { module, functions: HashMap::new(), ctx: ctx.clone(), path, nvshmem: None };
        this.check_abi_version()?;
        for &name in abi::KERNEL_ENTRIES {
            let c_name = CString::new(name).expect("entry names have no NUL");
            // SAFETY: the module is loaded; the name is a C string.
            let f = unsafe { result::module::get_function(module, c_name) }
                .map_err(|_| HaloError::StalePtx { path: this.path.clone(), detail: format!("kernel {name} is missing") })?;
            this.functions.insert(name, f);
        }
        Ok(this)
    }

    fn check_abi_version(&self) -> Result<()> {
        let name = CString::new(abi::ABI_VERSION_SYMBOL).expect("no NUL");
        // SAFETY: module loaded; the global is a u32.
        let found = unsafe { result::module::get_global(self.module, name) }
            .ok()
            .map(|(ptr, _)| {
                let mut v = [0u32; 1];
                // SAFETY: `ptr` is the 4-byte global.
                unsafe { result::memcpy_dtoh_sync(&mut v, ptr) }.map(|_| v[0])
            })
            .transpose()
            .during("reading the module's ABI version")?;
        match found {
            Some(v) if v == abi::ABI_VERSION => Ok(()),
            Some(v) => Err(HaloError::StalePtx { path: self.path.clone(), detail: format!("module ABI {v}, halo ABI {}", abi::ABI_VERSION) }),
            None => Err(HaloError::StalePtx { path: self.path.clone(), detail: format!("no {} global", abi::ABI_VERSION_SYMBOL) }),
        }
    }

    /// Where the module was loaded from: a file, or `embedded:<name>` for the library's own kernels.
    pub fn path(&self) -> &PathBuf {
        &self.path
    }

    /// The context the module lives in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The raw module handle (for `nvshmemx_cumodule_init`).
    pub fn raw(&self) -> sys::CUmodule {
        self.module
    }

    /// Records the NVSHMEM PE this module is registered with (set by
    /// [`crate::nvshmem::Nvshmem::register_module`]); the registration is finalised before unload.
    pub fn set_nvshmem(&mut self, nvshmem: Option<Arc<crate::nvshmem::Nvshmem>>) {
        self.nvshmem = nvshmem;
    }

    /// Whether the module was registered with NVSHMEM (its NVSHMEM device calls are usable).
    pub fn nvshmem_registered(&self) -> bool {
        self.nvshmem.is_some()
    }

    /// The handle of kernel `name`, one of [`abi::KERNEL_ENTRIES`].
    pub fn function(&self, name: &str) -> Result<sys::CUfunction> {
        self.functions.get(name).copied().ok_or_else(|| HaloError::InvalidInput(format!("no kernel named {name}")))
    }

    /// Launches kernel `name` on `stream`.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number, order and type (each a pointer to the
    /// value), and every device pointer among them must be valid for what the kernel does with it
    /// until the launch completes.
    pub unsafe fn launch(&self, name: &str, shape: LaunchShape, stream: &CudaStream, args: &mut [*mut c_void]) -> Result<()> {
        let f = self.function(name)?;
        // SAFETY: forwarded to the caller's contract.
        unsafe { result::launch_kernel(f, (shape.grid.0, shape.grid.1, 1), (shape.block, 1, 1), shape.shared_bytes, stream.cu_stream(), args) }
            .during_with(|| format!("launching {name} {shape:?}"))
    }

    /// Launches kernel `name` on `stream` so that it may overlap the end of the kernel before it on
    /// the stream (programmatic dependent launch, `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`):
    /// its blocks may become resident once that kernel allows it (`griddepcontrol.launch_dependents`
    /// in every block) instead of after it has ended and flushed, which hides most of the gap
    /// between two kernels. Inside a stream capture the dependency becomes a programmatic graph edge.
    ///
    /// # Safety
    /// As [`Self::launch`]; and the kernel runs `griddepcontrol.wait`
    /// (`kernels_gpu::device::wait_for_previous_kernel`) before it touches memory that an earlier
    /// kernel on the stream writes.
    pub unsafe fn launch_overlapping(&self, name: &str, shape: LaunchShape, stream: &CudaStream, args: &mut [*mut c_void]) -> Result<()> {
        let f = self.function(name)?;
        // SAFETY: a zeroed attribute value is valid; the one field set is the one the id names.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: shape.grid.0,
            gridDimY: shape.grid.1,
            gridDimZ: 1,
            blockDimX: shape.block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shape.shared_bytes,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `config` and `attr` outlive the call; `f` and the arguments as the caller guarantees.
        unsafe { sys::cuLaunchKernelEx(&config, f, args.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .during_with(|| format!("launching {name} {shape:?} to overlap the previous kernel"))
    }

    /// How many blocks of `block` threads with `shared_bytes` of dynamic shared memory of kernel
    /// `name` fit on one multiprocessor at once.
    pub fn max_blocks_per_sm(&self, name: &str, block: u32, shared_bytes: u32) -> Result<u32> {
        let f = self.function(name)?;
        // SAFETY: a valid function handle.
        let n =
            unsafe { result::occupancy::max_active_block_per_multiprocessor(f, block as i32, shared_bytes as usize) }.during("querying occupancy")?;
        Ok(n as u32)
    }
}

impl Drop for KernelModule {
    fn drop(&mut self) {
        if crate::gpu::stuck::context_stuck(&self.ctx) {
            // A kernel of this module never ends: unloading (and NVSHMEM's teardown) would wait for
            // it. The module, and the NVSHMEM it is registered with, stay until the process ends.
            std::mem::forget(self.nvshmem.take());
            return;
        }
        self.ctx.record_err(self.ctx.bind_to_thread());
        if let Some(nvshmem) = self.nvshmem.take() {
            nvshmem.finalize_module(self.module);
        }
        // SAFETY: loaded once, unloaded once, after NVSHMEM let go of it.
        self.ctx.record_err(unsafe { result::module::unload(self.module) });
    }
}

/// Which file of a kernel build a GPU loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleChoice {
    /// The GPU is the architecture the kernels were built for: its cubin, no JIT.
    Cubin,
    /// The GPU is newer: the driver JIT-compiles the PTX (PTX is forward compatible).
    Ptx,
}

/// Decides what GPU `ordinal` of architecture `device_arch` (e.g. `sm_90`) loads from kernels
/// built for `built_arch`: the cubin on an exact match, the PTX on a newer GPU, and
/// [`HaloError::WrongArch`] (naming `ptx_path` and the rebuild command) on an older GPU, which
/// cannot run code for a later architecture. Pure, so every case is tested without a GPU.
pub fn check_arch(device_arch: &str, built_arch: &str, ptx_path: &Path, ordinal: usize) -> Result<ModuleChoice> {
    let (device_sm, built_sm) = (sm_number(device_arch), sm_number(built_arch));
    if device_sm < built_sm {
        return Err(HaloError::WrongArch { path: ptx_path.to_path_buf(), built: built_arch.to_string(), device: device_arch.to_string(), ordinal });
    }
    Ok(if device_sm == built_sm { ModuleChoice::Cubin } else { ModuleChoice::Ptx })
}

/// `sm_90` -> 90 (0 when unparsable, which makes any device "newer").
fn sm_number(arch: &str) -> u32 {
    arch.trim_start_matches("sm_").trim_end_matches('a').parse().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptx() -> PathBuf {
        PathBuf::from("/k/halo_kernels.sm_90.ptx")
    }

    #[test]
    fn check_arch_same_gpu_loads_the_cubin() {
        assert_eq!(check_arch("sm_90", "sm_90", &ptx(), 0).ok(), Some(ModuleChoice::Cubin));
        // The arch-specific suffix does not change the generation.
        assert_eq!(check_arch("sm_90", "sm_90a", &ptx(), 0).ok(), Some(ModuleChoice::Cubin));
    }

    #[test]
    fn check_arch_newer_gpu_jit_compiles_the_ptx() {
        assert_eq!(check_arch("sm_100", "sm_90", &ptx(), 0).ok(), Some(ModuleChoice::Ptx));
        assert_eq!(check_arch("sm_120", "sm_80", &ptx(), 3).ok(), Some(ModuleChoice::Ptx));
    }

    #[test]
    fn check_arch_older_gpu_is_refused_with_the_rebuild_command() {
        let err = check_arch("sm_80", "sm_90", &ptx(), 2).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("built for sm_90"), "{err}");
        assert!(err.contains("GPU 2 is sm_80"), "{err}");
        assert!(err.contains("cargo xtask build-ptx --arch sm_80"), "{err}");
        assert!(err.contains("/k/halo_kernels.sm_90.ptx"), "{err}");
        assert!(matches!(check_arch("sm_86", "sm_90", &ptx(), 0), Err(HaloError::WrongArch { .. })));
    }
}
