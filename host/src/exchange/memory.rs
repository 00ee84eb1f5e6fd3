//! Where a rank's exchange buffers live: ordinary device memory when all ranks share one process,
//! NVSHMEM's symmetric heap when they are separate processes (PEs), or the caller's own memory
//! ([`super::caller`]) for the coordinates and forces of a code that owns them.

use super::caller::CallerSlice;
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

/// A buffer from either allocator, or the caller's.
pub enum Mem<T: Pod> {
    /// Ordinary device memory.
    Plain(DeviceBuffer<T>),
    /// Symmetric memory.
    Symmetric(SymmetricBuffer<T>),
    /// The caller's memory: never allocated or freed here.
    Caller(CallerSlice<T>),
}

impl<T: Pod> Mem<T> {
    /// Allocates `len` elements (collectively, for symmetric memory). A symmetric buffer is first
    /// charged against `NVSHMEM_SYMMETRIC_SIZE` ([`super::heap`]): every PE allocates the same
    /// sequence, so a buffer that does not fit is refused on every PE alike, before NVSHMEM's
    /// collective allocation.
    pub fn new(kind: &MemoryKind, ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        let bytes = (len * size_of::<T>()) as u64;
        ALLOCATED_ON_THIS_THREAD.with(|a| a.set(a.get() + bytes));
        match kind {
            MemoryKind::Plain => Ok(Self::Plain(DeviceBuffer::uninit(ctx, len)?)),
            MemoryKind::Symmetric(nvshmem) => {
                super::heap::charge_symmetric(bytes)?;
                match nvshmem.alloc(len) {
                    Ok(b) => Ok(Self::Symmetric(b)),
                    Err(e) => {
                        super::heap::release_symmetric(bytes);
                        Err(e)
                    }
                }
            }
        }
    }
}

impl<T: Pod> Drop for Mem<T> {
    fn drop(&mut self) {
        if let Self::Symmetric(b) = self {
            super::heap::release_symmetric((b.len() * size_of::<T>()) as u64);
        }
    }
}

std::thread_local! {
    static ALLOCATED_ON_THIS_THREAD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Bytes of exchange buffers ([`Mem`], either kind) this thread has allocated so far: lets a test
/// hold [`super::heap::Footprint`] to what an exchange really allocates.
#[doc(hidden)]
pub fn allocated_on_this_thread() -> u64 {
    ALLOCATED_ON_THIS_THREAD.with(std::cell::Cell::get)
}

impl<T: Pod> DeviceMemory<T> for Mem<T> {
    fn device_ptr(&self) -> u64 {
        match self {
            Self::Plain(b) => b.device_ptr(),
            Self::Symmetric(b) => b.device_ptr(),
            Self::Caller(b) => b.device_ptr(),
        }
    }
    fn len(&self) -> usize {
        match self {
            Self::Plain(b) => b.len(),
            Self::Symmetric(b) => b.len(),
            Self::Caller(b) => b.len(),
        }
    }
    fn context(&self) -> &Arc<CudaContext> {
        match self {
            Self::Plain(b) => b.context(),
            Self::Symmetric(b) => b.context(),
            Self::Caller(b) => b.context(),
        }
    }
}
