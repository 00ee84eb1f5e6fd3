//! Typed launchers for the gather/scatter kernels.
//!
//! The safe functions check what the kernels cannot (buffer lengths, every map index in range, via
//! [`IndexMap`], which knows its largest index) and then launch; the halo exchange drives the
//! fused kernels itself, through [`KernelModule::launch`], with pointers from a validated plan.

use crate::error::{HaloError, Result};
use crate::gpu::{CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape};
use cudarc::driver::CudaContext;
use kernels_gpu::abi::{self, Float3, PackMode};
use std::sync::Arc;

/// Upper bound on blocks of a grid-stride gather/scatter launch: enough to fill an H200
/// (132 SMs x 4 blocks of 512 threads) several times over.
pub const MAX_GATHER_BLOCKS: u32 = 132 * 4 * 4;

/// Builds the `void*` argument array `cuLaunchKernel` wants from local variables.
#[macro_export]
macro_rules! kernel_args {
    ($($arg:ident),* $(,)?) => {
        [$( (&raw mut $arg) as *mut ::std::ffi::c_void ),*]
    };
}

/// A device index map whose largest entry is known, so launches can prove every gather and
/// scatter stays inside its array.
pub struct IndexMap {
    buf: DeviceBuffer<u32>,
    max_index: Option<u32>,
}

impl IndexMap {
    /// Uploads `indices`.
    pub fn new(ctx: &Arc<CudaContext>, indices: &[u32]) -> Result<Self> {
        Ok(Self { buf: DeviceBuffer::from_host(ctx, indices)?, max_index: indices.iter().copied().max() })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True for an empty map.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The device buffer.
    pub fn buffer(&self) -> &DeviceBuffer<u32> {
        &self.buf
    }

    fn check_fits(&self, what: &str, array_len: usize) -> Result<()> {
        match self.max_index {
            Some(m) if m as usize >= array_len => {
                Err(HaloError::InvalidInput(format!("{what}: index map entry {m} is out of range of an array of {array_len} atoms")))
            }
            _ => Ok(()),
        }
    }
}

fn check_len(what: &str, needed: usize, have: usize) -> Result<()> {
    if have < needed {
        return Err(HaloError::InvalidInput(format!("{what}: buffer of {have} elements, {needed} needed")));
    }
    Ok(())
}

fn u32_len(what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| HaloError::InvalidInput(format!("{what}: {n} entries exceed the 32-bit index range")))
}

/// `out[i] = x[map[i]] (+ shift)` for every map entry (GROMACS's `packSendBufKernel`).
pub fn pack_coords(
    module: &KernelModule,
    stream: &CudaStream,
    x: &impl DeviceMemory<Float3>,
    map: &IndexMap,
    out: &impl DeviceMemory<Float3>,
    shift: Option<Float3>,
) -> Result<()> {
    map.check_fits("pack_coords", x.len())?;
    check_len("pack_coords output", map.len(), out.len())?;
    let (mut xp, mut mp, mut n, mut op) = (x.device_ptr(), map.buf.device_ptr(), u32_len("pack_coords", map.len())?, out.device_ptr());
    let s = shift.unwrap_or_default();
    let (mut sx, mut sy, mut sz, mut use_shift) = (s.x, s.y, s.z, shift.is_some() as u32);
    let mut args = kernel_args![xp, mp, n, op, sx, sy, sz, use_shift];
    // SAFETY: arguments match `pack_coords`; lengths and the map range were checked above.
    unsafe { module.launch(abi::PACK_COORDS, LaunchShape::for_items(n as usize, MAX_GATHER_BLOCKS), stream, &mut args) }
}

/// Scatters `buf[i]` to `dst[map[i]]`: stored (targets must be distinct) or accumulated atomically.
pub fn unpack(
    module: &KernelModule,
    stream: &CudaStream,
    buf: &impl DeviceMemory<Float3>,
    map: &IndexMap,
    dst: &impl DeviceMemory<Float3>,
    accumulate: bool,
) -> Result<()> {
    map.check_fits("unpack", dst.len())?;
    check_len("unpack input", map.len(), buf.len())?;
    let (mut bp, mut mp, mut n, mut dp) = (buf.device_ptr(), map.buf.device_ptr(), u32_len("unpack", map.len())?, dst.device_ptr());
    let mut args = kernel_args![bp, mp, n, dp];
    let name = if accumulate { abi::UNPACK_ACCUMULATE } else { abi::UNPACK_STORE };
    // SAFETY: arguments match both unpack kernels; ranges checked above.
    unsafe { module.launch(name, LaunchShape::for_items(n as usize, MAX_GATHER_BLOCKS), stream, &mut args) }
}

/// Packs the entries `mode` selects against `threshold`, adding the number of skipped entries to
/// `deferred[0]`.
#[allow(clippy::too_many_arguments)]
pub fn pack_subset(
    module: &KernelModule,
    stream: &CudaStream,
    x: &impl DeviceMemory<Float3>,
    map: &IndexMap,
    out: &impl DeviceMemory<Float3>,
    shift: Option<Float3>,
    mode: PackMode,
    threshold: u32,
    deferred: &impl DeviceMemory<u32>,
) -> Result<()> {
    map.check_fits("pack_subset", x.len())?;
    check_len("pack_subset output", map.len(), out.len())?;
    check_len("pack_subset counter", 1, deferred.len())?;
    let (mut xp, mut mp, mut n, mut op) = (x.device_ptr(), map.buf.device_ptr(), u32_len("pack_subset", map.len())?, out.device_ptr());
    let s = shift.unwrap_or_default();
    let (mut sx, mut sy, mut sz, mut use_shift) = (s.x, s.y, s.z, shift.is_some() as u32);
    let (mut mode, mut threshold, mut dp) = (mode as u32, threshold, deferred.device_ptr());
    let mut args = kernel_args![xp, mp, n, op, sx, sy, sz, use_shift, mode, threshold, dp];
    // SAFETY: arguments match `pack_subset`; ranges checked above.
    unsafe { module.launch(abi::PACK_SUBSET, LaunchShape::for_items(n as usize, MAX_GATHER_BLOCKS), stream, &mut args) }
}

/// A scratch counter for [`pack_subset`].
pub fn counter(ctx: &Arc<CudaContext>) -> Result<DeviceBuffer<u32>> {
    DeviceBuffer::zeroed(ctx, 1)
}

/// Holds `stream` for `ns` nanoseconds on the GPU (`spin_delay`, one thread): the GPU half of the
/// exchange's jitter. `ns` is capped at [`JITTER_MAX_US`](crate::desc::JITTER_MAX_US),
/// the longest jitter accepted, so the kernel is bounded whatever the caller passes.
pub fn spin_delay(module: &KernelModule, stream: &CudaStream, ns: u64) -> Result<()> {
    let mut ns = ns.min(u64::from(crate::desc::JITTER_MAX_US) * 1000);
    let mut args = kernel_args![ns];
    let shape = LaunchShape { grid: (1, 1), block: 1, shared_bytes: 0 };
    // SAFETY: `spin_delay(ns: u64)` takes one value and touches no memory.
    unsafe { module.launch(abi::SPIN_DELAY, shape, stream, &mut args) }
}
