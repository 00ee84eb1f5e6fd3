//! The home check's facts of a rank's home ids on the GPU (kernel `home_id_facts`,
//! `kernels-gpu/src/kernels/home_ids.rs`): what [`HomeIdFacts::of`] finds of them, made where they
//! are. A redecomposition on the GPU ([`super::GpuHome`]) runs it over the merged home ids and
//! reads the parts back with the rest of its read-back, so that the host's home check adds up 128
//! parts instead of passing over every id.

use super::gpu_parts::{HomeIdFactsKernel, WarpParts};
use super::home_check::{HomeIdFacts, fold_id_facts};
use crate::error::Result;
use crate::gpu::{CudaStream, DeviceMemory, KernelModule};

/// The device parts of one rank's home id facts (one per warp of the launch; kernel
/// `home_id_facts`).
pub type GpuIdFacts = WarpParts<HomeIdFactsKernel>;

impl GpuIdFacts {
    /// The facts of `ids[..n]`, synchronously (enqueued on `stream`, waited for).
    pub fn run(&self, module: &KernelModule, stream: &CudaStream, ids: &dyn DeviceMemory<u32>, n: usize) -> Result<HomeIdFacts> {
        Ok(fold_id_facts(&self.run_parts(module, stream, ids, n)?, n))
    }
}
