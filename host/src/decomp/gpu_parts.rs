//! Facts of a device array made per warp on the GPU and folded on the host: one fixed launch
//! writes one part per warp of it, the parts come back with a search's read-back (a few KiB), and
//! the host folds them instead of passing over the array. [`WarpParts`] holds the parts and
//! launches one such kernel ([`PartsKernel`]); the extent of positions ([`super::GpuExtent`]) and
//! the home ids' facts ([`super::GpuIdFacts`]) are the two.

use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape};
use bytemuck::Pod;
use cudarc::driver::CudaContext;
use std::marker::PhantomData;
use std::sync::Arc;

mod sealed {
    pub trait Sealed {}
}

/// A kernel `name(input, n, parts)` of a fixed shape that writes every one of its [`Self::PARTS`]
/// parts (one per warp of the launch) from `input[..n]`, and reads nothing else. Sealed: its
/// arguments are those [`WarpParts::enqueue`] passes, which only the kernels named here take.
pub trait PartsKernel: sealed::Sealed {
    /// The elements of the array the kernel reads.
    type Input: Pod;
    /// One warp's part.
    type Part: Pod;
    /// The kernel's entry point.
    const KERNEL: &'static str;
    /// Blocks of the launch.
    const BLOCKS: u32;
    /// Threads per block (whole warps).
    const THREADS: u32;
    /// Parts the launch writes: one per warp.
    const PARTS: usize = (Self::BLOCKS * Self::THREADS / 32) as usize;
    /// What the kernel finds, for errors and waits ("the extent", "the home id facts").
    const WHAT: &'static str;
    /// What the input holds ("positions", "ids").
    const ITEMS: &'static str;
}

/// The device parts of one [`PartsKernel`] launch, kept between launches.
pub struct WarpParts<K: PartsKernel> {
    parts: DeviceBuffer<K::Part>,
    _kernel: PhantomData<K>,
}

impl<K: PartsKernel> WarpParts<K> {
    /// Room for one launch's parts on `ctx`'s GPU.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        Ok(Self { parts: DeviceBuffer::uninit(ctx, K::PARTS)?, _kernel: PhantomData })
    }

    /// Enqueues the kernel over `input[..n]` on `stream` (every part written).
    pub fn enqueue(&self, module: &KernelModule, stream: &CudaStream, input: &dyn DeviceMemory<K::Input>, n: usize) -> Result<()> {
        let n32 = u32::try_from(n)
            .ok()
            .filter(|_| n <= input.len())
            .ok_or_else(|| HaloError::InvalidInput(format!("{} of {n} {} of an array of {}", K::WHAT, K::ITEMS, input.len())))?;
        let shape = LaunchShape { grid: (K::BLOCKS, 1), block: K::THREADS, shared_bytes: 0 };
        let (mut inp, mut np, mut parts) = (input.device_ptr(), n32, self.parts.device_ptr());
        // SAFETY: the arguments are those every `PartsKernel` takes (sealed: only the kernels of
        // this module); `input` holds `n` elements (checked), the parts one per warp of the launch
        // (`K::PARTS`); both outlive the launch (the caller's `input` by its stream order, ours by
        // `self`).
        unsafe { module.launch(K::KERNEL, shape, stream, &mut crate::kernel_args![inp, np, parts]) }
    }

    /// Enqueues the copy of the parts into `out` ([`PartsKernel::PARTS`] of them) on `stream`.
    ///
    /// # Safety
    /// `out` must stay valid, and be neither read nor written, until `stream` has run the copy.
    pub unsafe fn enqueue_read(&self, out: &mut [K::Part], stream: &CudaStream) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { self.parts.enqueue_read(0, out, stream) }
    }

    /// The parts of the kernel over `input[..n]`, synchronously (enqueued on `stream`, waited for).
    pub(crate) fn run_parts(&self, module: &KernelModule, stream: &CudaStream, input: &dyn DeviceMemory<K::Input>, n: usize) -> Result<Vec<K::Part>> {
        self.enqueue(module, stream, input, n)?;
        stream.synchronize().during_with(|| format!("waiting for {} on the GPU", K::WHAT))?;
        self.parts.to_host()
    }
}

/// Kernel `position_extent` (`kernels-gpu/src/kernels/extent.rs`): each warp's lowest and highest
/// coordinate per dimension and whether one is NaN.
pub struct PositionExtent;

impl sealed::Sealed for PositionExtent {}

impl PartsKernel for PositionExtent {
    type Input = kernels_gpu::abi::Float3;
    type Part = kernels_gpu::abi::ExtentPart;
    const KERNEL: &'static str = kernels_gpu::abi::POSITION_EXTENT;
    const BLOCKS: u32 = kernels_gpu::abi::EXTENT_BLOCKS;
    const THREADS: u32 = kernels_gpu::abi::EXTENT_THREADS;
    const WHAT: &'static str = "the extent";
    const ITEMS: &'static str = "positions";
}

/// Kernel `home_id_facts` (`kernels-gpu/src/kernels/home_ids.rs`): each warp's sums of the
/// scrambled ids and their squares and whether an id is not above the one before it.
pub struct HomeIdFactsKernel;

impl sealed::Sealed for HomeIdFactsKernel {}

impl PartsKernel for HomeIdFactsKernel {
    type Input = u32;
    type Part = kernels_gpu::abi::IdFactsPart;
    const KERNEL: &'static str = kernels_gpu::abi::HOME_ID_FACTS;
    const BLOCKS: u32 = kernels_gpu::abi::ID_FACTS_BLOCKS;
    const THREADS: u32 = kernels_gpu::abi::ID_FACTS_THREADS;
    const WHAT: &'static str = "the home id facts";
    const ITEMS: &'static str = "ids";
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels_gpu::abi::{EXTENT_PARTS, ID_FACTS_PARTS};

    #[test]
    fn each_kernels_parts_are_one_per_warp_of_its_abi_launch() {
        // The abi's counts, which the kernels write, against the holder's room.
        assert_eq!(PositionExtent::PARTS, EXTENT_PARTS);
        assert_eq!(HomeIdFactsKernel::PARTS, ID_FACTS_PARTS);
        assert_eq!(PositionExtent::THREADS % 32, 0);
        assert_eq!(HomeIdFactsKernel::THREADS % 32, 0);
    }
}
