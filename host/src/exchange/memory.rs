//! Where a rank's exchange buffers live: ordinary device memory when all ranks share one process,
//! NVSHMEM's symmetric heap when they are separate processes (PEs).

use crate::error::Result;
use crate::gpu::{CudaContext, DeviceBuffer, DeviceMemory};
use bytemuck::Pod;
use std::sync::Arc;

/// Which allocator the exchange buffers come from.
#[derive(Clone)]
pub enum MemoryKind {
    /// `cuMemAlloc`: peers in this process reach it by its address.
    Plain,
}

/// A buffer from either allocator.
pub enum Mem<T: Pod> {
    /// Ordinary device memory.
    Plain(DeviceBuffer<T>),
}

impl<T: Pod> Mem<T> {
    /// Allocates `len` elements (collectively, for symmetric memory).
    pub fn new(kind: &MemoryKind, ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        match kind {
            MemoryKind::Plain => Ok(Self::Plain(DeviceBuffer::uninit(ctx, len)?)),
        }
    }
}

impl<T: Pod> DeviceMemory<T> for Mem<T> {
    fn device_ptr(&self) -> u64 {
        match self {
            Self::Plain(b) => b.device_ptr(),
        }
    }
    fn len(&self) -> usize {
        match self {
            Self::Plain(b) => b.len(),
        }
    }
    fn context(&self) -> &Arc<CudaContext> {
        match self {
            Self::Plain(b) => b.context(),
        }
    }
}
