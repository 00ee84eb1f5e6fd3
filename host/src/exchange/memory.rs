//! Where a rank's exchange buffers live: ordinary device memory when all ranks share one process,
//! NVSHMEM's symmetric heap when they are separate processes (PEs).

use crate::error::Result;
use crate::gpu::{CudaContext, DeviceBuffer, DeviceMemory};
use crate::nvshmem::{Nvshmem, SymmetricBuffer};
use bytemuck::Pod;
use std::sync::Arc;

/// Which allocator the exchange buffers come from.
#[derive(Clone)]
pub enum MemoryKind {
    /// `cuMemAlloc`: peers in this process reach it by its address.
    Plain,
    /// NVSHMEM's symmetric heap: the same offset on every PE (allocation is collective).
    Symmetric(Arc<Nvshmem>),
}

/// A buffer from either allocator.
pub enum Mem<T: Pod> {
    /// Ordinary device memory.
    Plain(DeviceBuffer<T>),
    /// Symmetric memory.
    Symmetric(SymmetricBuffer<T>),
}

impl<T: Pod> Mem<T> {
    /// Allocates `len` elements (collectively, for symmetric memory).
    pub fn new(kind: &MemoryKind, ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        match kind {
            MemoryKind::Plain => Ok(Self::Plain(DeviceBuffer::uninit(ctx, len)?)),
            MemoryKind::Symmetric(nvshmem) => Ok(Self::Symmetric(nvshmem.alloc(len)?)),
        }
    }
}

impl<T: Pod> DeviceMemory<T> for Mem<T> {
    fn device_ptr(&self) -> u64 {
        match self {
            Self::Plain(b) => b.device_ptr(),
            Self::Symmetric(b) => b.device_ptr(),
        }
    }
    fn len(&self) -> usize {
        match self {
            Self::Plain(b) => b.len(),
            Self::Symmetric(b) => b.len(),
        }
    }
    fn context(&self) -> &Arc<CudaContext> {
        match self {
            Self::Plain(b) => b.context(),
            Self::Symmetric(b) => b.context(),
        }
    }
}
