//! Typed device memory. Any `bytemuck::Pod` type can live on the device, including the ABI types
//! of `kernels-gpu` (which cudarc's `DeviceRepr` cannot be implemented for from here).

use crate::error::{CudaContextExt, HaloError, Result};
use bytemuck::Pod;
use cudarc::driver::{CudaContext, CudaStream, result, sys};
use std::marker::PhantomData;
use std::sync::Arc;

/// Copies between host and any device allocation of `T`s: plain buffers here, NVSHMEM symmetric
/// buffers elsewhere. Synchronous copies are for set-up and checks, never for a timestep.
pub trait DeviceMemory<T: Pod> {
    /// The device address (`CUdeviceptr`) of element 0.
    fn device_ptr(&self) -> u64;
    /// Number of elements.
    fn len(&self) -> usize;
    /// The context that owns the memory.
    fn context(&self) -> &Arc<CudaContext>;

    /// True when the buffer holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The address of element `i` (no bounds check: for kernel arguments).
    fn device_ptr_at(&self, i: usize) -> u64 {
        self.device_ptr() + (i * size_of::<T>()) as u64
    }

    /// Copies `data` into elements `0..data.len()`, synchronously: the copy has landed when this
    /// returns, so work on any stream launched afterwards reads it. (It runs in the legacy default
    /// stream's order, after earlier work of the context's blocking streams, and waits for it.)
    fn copy_from_host(&self, data: &[T]) -> Result<()> {
        if data.len() > self.len() {
            return Err(HaloError::InvalidInput(format!("copy of {} elements into a buffer of {}", data.len(), self.len())));
        }
        if data.is_empty() {
            return Ok(());
        }
        self.context().bind_to_thread().during("binding the context")?;
        // SAFETY: the range is inside the allocation (checked above); `data` outlives the copy,
        // which has run when the wait below returns.
        unsafe { result::memcpy_htod_async(self.device_ptr(), bytemuck::cast_slice::<T, u8>(data), result::stream::null()) }
            .during("copying to the GPU")?;
        wait_for_default_stream("copying to the GPU")
    }

    /// Copies the whole buffer back, synchronously.
    fn to_host(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len()];
        if out.is_empty() {
            return Ok(out);
        }
        self.context().bind_to_thread().during("binding the context")?;
        // SAFETY: `out` has exactly the buffer's size.
        unsafe { result::memcpy_dtoh_sync(bytemuck::cast_slice_mut::<T, u8>(&mut out), self.device_ptr()) }.during("copying from the GPU")?;
        Ok(out)
    }

    /// Elements `start..start + len`, copied back in `stream`'s order; waits for `stream` (all
    /// work enqueued on it so far). For small read-backs of counts and flags.
    fn read_range(&self, start: usize, len: usize, stream: &CudaStream) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); len];
        // SAFETY: `out` lives until the stream is synchronised below.
        unsafe { self.enqueue_read(start, &mut out, stream) }?;
        stream.synchronize().during("waiting for a read-back from the GPU")?;
        Ok(out)
    }

    /// Enqueues the copy of elements `start..start + out.len()` into `out` in `stream`'s order,
    /// without waiting (`out` may be page-locked memory, for a copy that overlaps nothing of the
    /// host's). An error, before anything is enqueued, when the range is outside the buffer.
    ///
    /// # Safety
    /// `out` must stay alive and untouched until `stream` has been synchronised.
    unsafe fn enqueue_read(&self, start: usize, out: &mut [T], stream: &CudaStream) -> Result<()> {
        let len = out.len();
        if start.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(HaloError::InvalidInput(format!("reading {start}..{} of a buffer of {}", start.saturating_add(len), self.len())));
        }
        if len > 0 {
            stream.context().bind_to_thread().during("binding the context")?;
            // SAFETY: the range is inside the allocation (checked above); `out` has exactly its
            // size and outlives the copy (the caller's contract).
            unsafe { result::memcpy_dtoh_async(out, self.device_ptr_at(start), stream.cu_stream()) }.during("copying from the GPU")?;
        }
        Ok(())
    }

    /// Sets every byte to `byte`, synchronously (0xFF poisons floats to NaN, `u64`s to `u64::MAX`):
    /// filled when this returns, as [`DeviceMemory::copy_from_host`] says.
    fn fill_bytes(&self, byte: u8) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        self.fill_bytes_queued(byte)?;
        wait_for_default_stream("filling device memory")
    }

    /// Enqueues the fill of every byte with `byte` on the legacy default stream and returns before
    /// it has run: for a caller that then waits for that stream with a bound of its own (the
    /// protocol reset after a failure, where the GPU may hold work that never ends and an
    /// unbounded wait would hang instead of returning an error). Otherwise use
    /// [`DeviceMemory::fill_bytes`].
    fn fill_bytes_queued(&self, byte: u8) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        self.context().bind_to_thread().during("binding the context")?;
        // SAFETY: the whole allocation; the caller waits for the legacy stream before the buffer
        // is read or freed.
        unsafe { result::memset_d8_async(self.device_ptr(), byte, self.len() * size_of::<T>(), result::stream::null()) }
            .during("filling device memory")
    }

    /// Zeroes elements `start..start + len` on `stream`, in stream order.
    fn zero_range_async(&self, start: usize, len: usize, stream: &CudaStream) -> Result<()> {
        if start + len > self.len() {
            return Err(HaloError::InvalidInput(format!("zeroing {start}..{} of a buffer of {}", start + len, self.len())));
        }
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the range is inside the allocation (checked above); stream discipline as below.
        unsafe { result::memset_d8_async(self.device_ptr_at(start), 0, len * size_of::<T>(), stream.cu_stream()) }.during("zeroing device memory")
    }

    /// Enqueues on `stream` the copy of elements `0..n` of `src` into elements `0..n` of this
    /// memory (device to device, in `stream`'s order; no host wait). Both must be of `stream`'s
    /// context and hold at least `n` elements (checked, before anything is enqueued). Ordering is
    /// the caller's: work on `stream` after this sees the copy, work on other streams needs an
    /// event recorded after it; `src` must not be written, and neither freed, until it has run.
    fn copy_prefix_from_async(&self, src: &dyn DeviceMemory<T>, n: usize, stream: &CudaStream) -> Result<()> {
        prefix_copy_fits(n, src.len(), self.len())?;
        if n == 0 {
            return Ok(());
        }
        let ctx = stream.context();
        if ctx.cu_ctx() != self.context().cu_ctx() || ctx.cu_ctx() != src.context().cu_ctx() {
            return Err(HaloError::InvalidInput(format!(
                "device copy from GPU {}'s memory into GPU {}'s on a stream of GPU {}",
                src.context().ordinal(),
                self.context().ordinal(),
                ctx.ordinal()
            )));
        }
        ctx.bind_to_thread().during("binding the context")?;
        // SAFETY: both ranges are inside their allocations (checked above) and of the stream's
        // context; the copy runs in `stream`'s order, and by this method's contract neither buffer
        // is freed before it has run.
        unsafe { result::memcpy_dtod_async(self.device_ptr(), src.device_ptr(), n * size_of::<T>(), stream.cu_stream()) }.during("copying on the GPU")
    }

    /// Sets every byte to `byte` on `stream`, in stream order.
    fn fill_bytes_async(&self, byte: u8, stream: &CudaStream) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        // SAFETY: the whole allocation; the buffer outlives the queued operation by the caller's
        // stream discipline (buffers are dropped only after their streams are synchronised).
        unsafe { result::memset_d8_async(self.device_ptr(), byte, self.len() * size_of::<T>(), stream.cu_stream()) }.during("filling device memory")
    }
}

/// Waits until the legacy default stream of the current context has run what was enqueued on it.
/// The driver's "synchronous" memset and host-to-device copy are not that: `cuMemsetD8` returns
/// before the fill has run, and `cuMemcpyHtoD` from pageable memory may return before the data
/// reach the device; neither orders anything before later work on a non-blocking stream (every
/// stream halo makes is one). A check that poisons a buffer and then launches on such a stream
/// could see the fill land after its kernel.
fn wait_for_default_stream(what: &str) -> Result<()> {
    // SAFETY: the null stream of the context bound to this thread by the caller.
    unsafe { result::stream::synchronize(result::stream::null()) }.during(what)
}

/// An error unless a copy of the first `n` elements fits a source of `src` and a destination of
/// `dst` elements ([`DeviceMemory::copy_prefix_from_async`]).
fn prefix_copy_fits(n: usize, src: usize, dst: usize) -> Result<()> {
    if n > src || n > dst {
        return Err(HaloError::InvalidInput(format!("device copy of {n} elements from a buffer of {src} into one of {dst}")));
    }
    Ok(())
}

/// An ordinary device allocation of `len` elements of `T` (`cuMemAlloc`), freed on drop.
pub struct DeviceBuffer<T: Pod> {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Arc<CudaContext>,
    _marker: PhantomData<T>,
}

// SAFETY: the buffer is a plain device address owned by this value; access goes through the
// driver, which is thread-safe.
unsafe impl<T: Pod> Send for DeviceBuffer<T> {}
// SAFETY: as above; `&DeviceBuffer` only hands out the address and synchronous copies.
unsafe impl<T: Pod> Sync for DeviceBuffer<T> {}

impl<T: Pod> DeviceBuffer<T> {
    /// Allocates `len` elements, contents undefined (at least one byte is allocated, so the
    /// address is valid even for `len == 0`).
    pub fn uninit(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        ctx.bind_to_thread().during("binding the context")?;
        let bytes = (len * size_of::<T>()).max(1);
        // SAFETY: a fresh allocation.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(|source| {
            if source.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                let free = ctx.mem_get_info().map(|(free, _)| free).unwrap_or(0);
                HaloError::InvalidInput(format!(
                    "GPU {} is out of memory: asked for {} MiB, {} MiB free; use fewer atoms or ranks per GPU",
                    ctx.ordinal(),
                    bytes >> 20,
                    free >> 20
                ))
            } else {
                HaloError::Cuda { what: format!("allocating {bytes} bytes"), source }
            }
        })?;
        Ok(Self { ptr, len, ctx: ctx.clone(), _marker: PhantomData })
    }

    /// Allocates and zeroes `len` elements.
    pub fn zeroed(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        let b = Self::uninit(ctx, len)?;
        b.fill_bytes(0)?;
        Ok(b)
    }

    /// Allocates a copy of `data`.
    pub fn from_host(ctx: &Arc<CudaContext>, data: &[T]) -> Result<Self> {
        let b = Self::uninit(ctx, data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }
}

impl<T: Pod> DeviceMemory<T> for DeviceBuffer<T> {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl<T: Pod> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if crate::gpu::stuck::context_stuck(&self.ctx) {
            return; // freeing waits for the device, whose stuck kernel never ends: leaked instead
        }
        // Errors cannot propagate from drop; cudarc records them on the context instead.
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: allocated by malloc_sync and freed once.
        self.ctx.record_err(unsafe { result::free_sync(self.ptr) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_copy_must_fit_both_buffers() {
        assert!(prefix_copy_fits(0, 0, 0).is_ok());
        assert!(prefix_copy_fits(22_500, 22_500, 30_000).is_ok());
        assert!(prefix_copy_fits(22_500, 45_000, 22_500).is_ok());
        let e = prefix_copy_fits(22_501, 22_500, 30_000).unwrap_err().to_string();
        assert!(e.contains("22501 elements from a buffer of 22500 into one of 30000"), "{e}");
        assert!(prefix_copy_fits(7, 8, 6).is_err(), "the destination is too short");
    }
}
