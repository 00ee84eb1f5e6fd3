//! The plain building blocks of the staged path: gather into a send buffer, scatter out of a
//! receive buffer (store or accumulate), and the dependency-aware subset gather. The first three
//! are generic over the element type and exported per type from `mod.rs`.

use super::common::{DeviceElement, pack_subset as pack_selected, shifted};
use crate::abi::{Float3, HaloElement, PackMode};
use crate::device::{self, thread};

#[inline(always)]
fn optional_shift(sx: f32, sy: f32, sz: f32, use_shift: u32) -> Option<Float3> {
    (use_shift != 0).then_some(Float3::new(sx, sy, sz))
}

/// GROMACS's `packSendBufKernel`: `out[i] = x[map[i]]`, shifted by the box row `(sx, sy, sz)` when
/// `use_shift != 0` (coordinates only; other element types ignore the shift). Grid-stride.
///
/// # Safety
/// `map[0..n]` and `out[0..n]` valid, every `map[i]` in range of `x`.
#[inline(always)]
pub unsafe fn pack_coords<T: HaloElement>(x: *const T, map: *const u32, n: u32, out: *mut T, sx: f32, sy: f32, sz: f32, use_shift: u32) {
    let shift = optional_shift(sx, sy, sz, use_shift);
    let mut i = thread::index_1d();
    while i < n {
        // SAFETY: the caller's contract.
        unsafe { *out.add(i as usize) = shifted(*x.add(*map.add(i as usize) as usize), shift) };
        i += thread::grid_stride_x();
    }
}

/// GROMACS's `unpackRecvBufKernel<false>`: `dst[map[i]] = buf[i]`. Map targets must be distinct.
///
/// # Safety
/// `buf[0..n]`, `map[0..n]` valid, every `map[i]` in range of `dst`.
#[inline(always)]
pub unsafe fn unpack_store<T: HaloElement>(buf: *const T, map: *const u32, n: u32, dst: *mut T) {
    let mut i = thread::index_1d();
    while i < n {
        // SAFETY: the caller's contract.
        unsafe { *dst.add(*map.add(i as usize) as usize) = *buf.add(i as usize) };
        i += thread::grid_stride_x();
    }
}

/// GROMACS's `unpackRecvBufKernel<true>`: `dst[map[i]] += buf[i]`, atomically per component, so
/// repeated targets (and concurrent pulses) add up correctly.
///
/// # Safety
/// As [`unpack_store`].
#[inline(always)]
pub unsafe fn unpack_accumulate<T: DeviceElement>(buf: *const T, map: *const u32, n: u32, dst: *mut T) {
    let mut i = thread::index_1d();
    while i < n {
        // SAFETY: the caller's contract; atomics make concurrent updates of one element safe.
        unsafe { T::atomic_accumulate(dst.add(*map.add(i as usize) as usize), *buf.add(i as usize)) };
        i += thread::grid_stride_x();
    }
}

kernel! {
    /// The dependency-aware gather on its own, for testing and for the staged path: packs the map
    /// entries `mode` selects against `threshold` and adds the number skipped to `*deferred`.
    /// An unknown `mode` packs nothing and defers everything.
    fn pack_subset(
        x: *const Float3, map: *const u32, n: u32, out: *mut Float3,
        sx: f32, sy: f32, sz: f32, use_shift: u32,
        mode: u32, threshold: u32, deferred: *mut u32,
    ) {
        let shift = optional_shift(sx, sy, sz, use_shift);
        let skipped = match PackMode::from_u32(mode) {
            // SAFETY: the host guarantees the buffers as for pack_coords.
            Some(mode) => unsafe { pack_selected(x, map, n, out, shift, mode, threshold) },
            None => {
                let mut count = 0;
                let mut i = thread::index_1d();
                while i < n {
                    count += 1;
                    i += thread::grid_stride_x();
                }
                count
            }
        };
        if skipped > 0 {
            // SAFETY: `deferred` is a valid device counter; relaxed atomics, read after the launch.
            unsafe { device::atomic_add_relaxed_gpu_u32(deferred, skipped) };
        }
    }
}
