//! The home check's facts of a rank's home ids on the GPU (kernel `home_id_facts`,
//! `kernels-gpu/src/kernels/home_ids.rs`): what [`HomeIdFacts::of`] finds of them, made where they
//! are. A redecomposition on the GPU ([`super::GpuHome`]) runs it over the merged home ids and
//! reads the parts back with the rest of its read-back, so that the host's home check adds up 128
//! parts instead of passing over every id.

use super::home_check::{HomeIdFacts, fold_id_facts};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape};
use cudarc::driver::CudaContext;
use kernels_gpu::abi::{self, ID_FACTS_PARTS, IdFactsPart};
use std::sync::Arc;

/// The device parts of one rank's home id facts (one per warp of the launch).
pub struct GpuIdFacts {
    parts: DeviceBuffer<IdFactsPart>,
}

impl GpuIdFacts {
    /// Room for one set of facts on `ctx`'s GPU.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        Ok(Self { parts: DeviceBuffer::uninit(ctx, ID_FACTS_PARTS)? })
    }

    /// Enqueues the facts of `ids[..n]` on `stream` (every part written).
    pub fn enqueue(&self, module: &KernelModule, stream: &CudaStream, ids: &dyn DeviceMemory<u32>, n: usize) -> Result<()> {
        let n32 = u32::try_from(n)
            .ok()
            .filter(|_| n <= ids.len())
            .ok_or_else(|| HaloError::InvalidInput(format!("the home id facts of {n} ids of an array of {}", ids.len())))?;
        let shape = LaunchShape { grid: (abi::ID_FACTS_BLOCKS, 1), block: abi::ID_FACTS_THREADS, shared_bytes: 0 };
        let (mut idp, mut np, mut parts) = (ids.device_ptr(), n32, self.parts.device_ptr());
        // SAFETY: the arguments match `home_id_facts`'s; `ids` holds `n` ids (checked), the parts
        // one per warp of the launch (`ID_FACTS_PARTS`); both outlive the launch (the caller's
        // `ids` by its stream order, ours by `self`).
        unsafe { module.launch(abi::HOME_ID_FACTS, shape, stream, &mut crate::kernel_args![idp, np, parts]) }
    }

    /// Enqueues the copy of the parts into `out` ([`ID_FACTS_PARTS`] of them) on `stream`.
    ///
    /// # Safety
    /// `out` must stay valid, and be neither read nor written, until `stream` has run the copy.
    pub unsafe fn enqueue_read(&self, out: &mut [IdFactsPart], stream: &CudaStream) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.parts.enqueue_read(0, out, stream) }
    }

    /// The facts of `ids[..n]`, synchronously (enqueued on `stream`, waited for).
    pub fn run(&self, module: &KernelModule, stream: &CudaStream, ids: &dyn DeviceMemory<u32>, n: usize) -> Result<HomeIdFacts> {
        self.enqueue(module, stream, ids, n)?;
        stream.synchronize().during("waiting for the GPU home id facts")?;
        Ok(fold_id_facts(&self.parts.to_host()?, n))
    }
}
