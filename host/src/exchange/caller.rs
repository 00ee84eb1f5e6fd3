//! Memory the caller owns: a simulation code that already holds its coordinates and forces on the
//! GPU hands them to the exchange instead of copying them into buffers of halo's.
//!
//! [`CallerSlice`] is a device address range the exchange reads and writes but never allocates or
//! frees; [`CallerBuffers`] is one rank's pair of them. Build with
//! [`LocalRanks::with_buffers`](super::LocalRanks::with_buffers) (every rank in this process) or
//! [`PeExchange::with_buffers`](super::PeExchange::with_buffers) (this process is one PE); halo
//! then allocates only its protocol state (signals, receive slots, index maps), on NVSHMEM's
//! symmetric heap where peers must reach it. Run on the caller's streams with
//! [`Exchange::use_streams`](super::Exchange::use_streams).
//!
//! The layout is the one [`RankHalo`](super::RankHalo) describes: home atoms first, then every
//! pulse's received atoms at its `atom_offset` (GROMACS's local atom order, home then halo).

use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaContext, DeviceMemory};
use bytemuck::Pod;
use cudarc::driver::sys;
use std::marker::PhantomData;
use std::sync::Arc;

/// `len` elements of `T` at device address `ptr`, owned by the caller: the exchange reads and
/// writes them and never frees them.
pub struct CallerSlice<T: Pod> {
    ptr: u64,
    len: usize,
    ctx: Arc<CudaContext>,
    _marker: PhantomData<T>,
}

// SAFETY: a plain device address; the caller's contract (`from_raw`) keeps it valid, and access
// goes through the driver, which is thread-safe.
unsafe impl<T: Pod> Send for CallerSlice<T> {}
// SAFETY: as above; `&CallerSlice` only hands out the address.
unsafe impl<T: Pod> Sync for CallerSlice<T> {}

impl<T: Pod> CallerSlice<T> {
    /// The caller's `len` elements of `T` at `ptr` on `ctx`'s GPU.
    ///
    /// Checked here: `ptr` is not null and aligned for `T`, and, as far as the driver can tell
    /// (`cuPointerGetAttribute`), it is device memory of `ctx`'s GPU whose allocation holds all
    /// `len` elements from `ptr` (a pointer the driver does not know, such as host memory, is
    /// refused; managed memory is accepted).
    ///
    /// # Safety
    /// The `len * size_of::<T>()` bytes at `ptr` must stay allocated, and must not be freed or
    /// reused for anything else, for as long as any exchange built with this slice exists (the
    /// exchange writes into them from kernels the caller does not see). The caller orders its own
    /// reads and writes of them with the exchange's work (the same stream, or events).
    pub unsafe fn from_raw(ctx: &Arc<CudaContext>, ptr: u64, len: usize) -> Result<Self> {
        check_address::<T>(ptr)?;
        let bytes = len.checked_mul(size_of::<T>()).filter(|b| ptr.checked_add(*b as u64).is_some()).ok_or_else(|| {
            HaloError::InvalidInput(format!("a caller buffer of {len} elements at {ptr:#x} does not fit the address space; pass its real length"))
        })?;
        ctx.bind_to_thread().during("binding the context")?;
        let facts = PointerFacts::query(ptr)?;
        check_facts(ptr, bytes, ctx.ordinal(), &facts)?;
        Ok(Self { ptr, len, ctx: ctx.clone(), _marker: PhantomData })
    }
}

impl<T: Pod> std::fmt::Debug for CallerSlice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CallerSlice({:#x}, {} x {} bytes, GPU {})", self.ptr, self.len, size_of::<T>(), self.ctx.ordinal())
    }
}

impl<T: Pod> DeviceMemory<T> for CallerSlice<T> {
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

/// One rank's coordinates `x` and forces `f`, owned by the caller (each at least the rank's
/// `total_atoms` long).
#[derive(Debug)]
pub struct CallerBuffers<T: Pod> {
    /// Coordinates: home atoms, then every received pulse.
    pub x: CallerSlice<T>,
    /// Forces, the same layout.
    pub f: CallerSlice<T>,
}

impl<T: Pod> CallerBuffers<T> {
    /// The caller's coordinates at `x` and forces at `f`, `len` elements each, on `ctx`'s GPU:
    /// [`CallerSlice::from_raw`] for both, an error naming the array it refuses.
    ///
    /// # Safety
    /// As [`CallerSlice::from_raw`], for both arrays.
    pub unsafe fn from_raw(ctx: &Arc<CudaContext>, x: u64, f: u64, len: usize) -> Result<Self> {
        let named = |name: &str, e: HaloError| match e {
            HaloError::InvalidInput(why) => HaloError::InvalidInput(format!("`{name}`: {why}")),
            other => other,
        };
        // SAFETY: the caller's contract, for each array.
        let (x, f) = unsafe {
            (CallerSlice::from_raw(ctx, x, len).map_err(|e| named("x", e))?, CallerSlice::from_raw(ctx, f, len).map_err(|e| named("f", e))?)
        };
        Ok(Self { x, f })
    }

    /// Refuses buffers that cannot hold `rank`'s layout of `total_atoms`, that live on another GPU
    /// than the rank's (`ordinal`), or that overlap (the exchange writes both).
    pub(crate) fn check(&self, rank: usize, total_atoms: usize, ordinal: usize) -> Result<()> {
        for (name, s) in [("x", &self.x), ("f", &self.f)] {
            if s.len < total_atoms {
                return Err(HaloError::InvalidInput(format!(
                    "rank {rank}: the caller's `{name}` holds {} elements but the halo plan needs {total_atoms} (home atoms plus every received atom); \
                     allocate at least that many",
                    s.len
                )));
            }
            if s.ctx.ordinal() != ordinal {
                return Err(HaloError::InvalidInput(format!(
                    "rank {rank}: the caller's `{name}` is on GPU {} but the rank runs on GPU {ordinal}; allocate it on the rank's GPU",
                    s.ctx.ordinal()
                )));
            }
        }
        let bytes = |s: &CallerSlice<T>| (s.len * size_of::<T>()) as u64;
        if self.x.ptr < self.f.ptr + bytes(&self.f) && self.f.ptr < self.x.ptr + bytes(&self.x) {
            return Err(HaloError::InvalidInput(format!(
                "rank {rank}: the caller's `x` ({:#x}, {} bytes) and `f` ({:#x}, {} bytes) overlap; give them separate memory",
                self.x.ptr,
                bytes(&self.x),
                self.f.ptr,
                bytes(&self.f)
            )));
        }
        Ok(())
    }
}

/// Null and misaligned addresses, refused before the driver is asked anything.
fn check_address<T>(ptr: u64) -> Result<()> {
    if ptr == 0 {
        return Err(HaloError::InvalidInput("a caller buffer's device pointer is null; pass the address of its element 0".into()));
    }
    if !ptr.is_multiple_of(align_of::<T>() as u64) {
        return Err(HaloError::InvalidInput(format!(
            "a caller buffer's device pointer {ptr:#x} is not aligned to {} bytes, the alignment of its {}-byte elements",
            align_of::<T>(),
            size_of::<T>()
        )));
    }
    Ok(())
}

/// What the driver knows about an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PointerFacts {
    /// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` (`None` when the driver does not know the address).
    memory_type: Option<u32>,
    /// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
    ordinal: i32,
    /// `CU_POINTER_ATTRIBUTE_IS_MANAGED`.
    managed: bool,
    /// The allocation holding the address: its start and size (`RANGE_START_ADDR`, `RANGE_SIZE`).
    range: Option<(u64, u64)>,
}

impl PointerFacts {
    fn query(ptr: u64) -> Result<Self> {
        fn attr<V: Default>(a: sys::CUpointer_attribute, ptr: u64) -> std::result::Result<V, sys::CUresult> {
            let mut v = V::default();
            // SAFETY: `v` has the size the attribute writes (u32 for the type, i32 for the ordinal,
            // u64 for addresses and sizes, u32 for the managed flag).
            let rc = unsafe { sys::cuPointerGetAttribute((&mut v as *mut V).cast(), a, ptr) };
            if rc == sys::CUresult::CUDA_SUCCESS { Ok(v) } else { Err(rc) }
        }
        use sys::CUpointer_attribute as A;
        let memory_type = match attr::<u32>(A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr) {
            Ok(t) => Some(t),
            Err(sys::CUresult::CUDA_ERROR_INVALID_VALUE) => None, // not an address the driver knows
            Err(e) => {
                return Err(HaloError::Cuda {
                    what: format!("asking the driver about the caller's pointer {ptr:#x}"),
                    source: cudarc::driver::DriverError(e),
                });
            }
        };
        if memory_type.is_none() {
            return Ok(Self { memory_type, ordinal: -1, managed: false, range: None });
        }
        let ordinal = attr::<i32>(A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr).unwrap_or(-1);
        let managed = attr::<u32>(A::CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr).is_ok_and(|m| m != 0);
        let range = match (attr::<u64>(A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr), attr::<u64>(A::CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr)) {
            (Ok(start), Ok(size)) => Some((start, size)),
            _ => None, // e.g. memory the driver maps but does not range-track (some imports)
        };
        Ok(Self { memory_type, ordinal, managed, range })
    }
}

/// The rule for a caller's pointer: device (or managed) memory of GPU `ordinal` with `bytes`
/// bytes from `ptr` inside its allocation. Pure, so every case is tested without a GPU.
fn check_facts(ptr: u64, bytes: usize, ordinal: usize, facts: &PointerFacts) -> Result<()> {
    const DEVICE: u32 = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
    match facts.memory_type {
        None => {
            return Err(HaloError::InvalidInput(format!(
                "the caller's pointer {ptr:#x} is not memory the CUDA driver knows (host memory, or freed); pass device memory (cudaMalloc, cuMemAlloc)"
            )));
        }
        Some(t) if t != DEVICE && !facts.managed => {
            return Err(HaloError::InvalidInput(format!(
                "the caller's pointer {ptr:#x} is not device memory (CUDA memory type {t}); pass device memory (cudaMalloc, cuMemAlloc) or managed memory"
            )));
        }
        Some(_) => {}
    }
    if !facts.managed && facts.ordinal >= 0 && facts.ordinal as usize != ordinal {
        return Err(HaloError::InvalidInput(format!(
            "the caller's pointer {ptr:#x} is memory of GPU {} but the exchange runs on GPU {ordinal}; allocate it on that GPU",
            facts.ordinal
        )));
    }
    if let Some((start, size)) = facts.range {
        let end = start.saturating_add(size);
        if ptr.saturating_add(bytes as u64) > end {
            return Err(HaloError::InvalidInput(format!(
                "the caller's buffer at {ptr:#x} is said to hold {bytes} bytes but its allocation ends {} bytes after it; pass the length it really has",
                end.saturating_sub(ptr)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels_gpu::abi::Float3;

    const DEVICE: u32 = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
    const HOST: u32 = sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32;

    fn device(ordinal: i32, range: Option<(u64, u64)>) -> PointerFacts {
        PointerFacts { memory_type: Some(DEVICE), ordinal, managed: false, range }
    }

    #[test]
    fn null_and_misaligned_pointers_are_refused_before_the_driver() {
        let e = check_address::<Float3>(0).unwrap_err().to_string();
        assert!(e.contains("null"), "{e}");
        let e = check_address::<Float3>(0x1002).unwrap_err().to_string();
        assert!(e.contains("0x1002") && e.contains("aligned to 4 bytes"), "{e}");
        assert!(check_address::<Float3>(0x1004).is_ok());
        assert!(check_address::<f64>(0x1004).is_err(), "f64 needs 8-byte alignment");
    }

    #[test]
    fn device_memory_of_the_right_gpu_and_length_is_accepted() {
        assert!(check_facts(0x1000, 1200, 0, &device(0, Some((0x1000, 1200)))).is_ok());
        assert!(check_facts(0x1100, 100, 0, &device(0, Some((0x1000, 512)))).is_ok(), "a slice inside an allocation");
        assert!(check_facts(0x1000, 1200, 0, &device(0, None)).is_ok(), "no range known: the length is the caller's word");
    }

    #[test]
    fn unknown_host_foreign_and_short_memory_is_refused_naming_the_fix() {
        let unknown = PointerFacts { memory_type: None, ordinal: -1, managed: false, range: None };
        let e = check_facts(0x1000, 12, 0, &unknown).unwrap_err().to_string();
        assert!(e.contains("not memory the CUDA driver knows") && e.contains("cudaMalloc"), "{e}");
        let host = PointerFacts { memory_type: Some(HOST), ordinal: -1, managed: false, range: None };
        let e = check_facts(0x1000, 12, 0, &host).unwrap_err().to_string();
        assert!(e.contains("not device memory"), "{e}");
        let e = check_facts(0x1000, 12, 0, &device(1, None)).unwrap_err().to_string();
        assert!(e.contains("GPU 1") && e.contains("runs on GPU 0"), "{e}");
        let e = check_facts(0x1100, 1200, 0, &device(0, Some((0x1000, 1024)))).unwrap_err().to_string();
        assert!(e.contains("1200 bytes") && e.contains("ends 768 bytes after it"), "{e}");
    }

    #[test]
    fn managed_memory_is_accepted_on_any_gpu() {
        let managed = PointerFacts { memory_type: Some(HOST), ordinal: 3, managed: true, range: Some((0x1000, 4096)) };
        assert!(check_facts(0x1000, 4096, 0, &managed).is_ok());
    }
}
