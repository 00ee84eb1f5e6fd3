//! Pieces shared by the halo kernels: packing a slice of an index map, bounded signal waits,
//! last-block election, and the two ways of delivering a pulse (direct store or NVSHMEM put).

use crate::abi::{Float3, HaloElement, NVSHMEM_SIGNAL_SET, PackMode, PulseMeta, WaitKind, WaitStatus};
use crate::device::{self, nvshmem, thread};

/// An element type the halo kernels can move on the device: a [`HaloElement`] that can also be
/// accumulated atomically (the reverse exchange adds into targets several pulses may share).
pub trait DeviceElement: HaloElement {
    /// `*dst += v` with relaxed GPU-scope atomics, component by component.
    ///
    /// # Safety
    /// `dst` must be a valid, naturally aligned global address on this device.
    unsafe fn atomic_accumulate(dst: *mut Self, v: Self);
}

impl DeviceElement for Float3 {
    #[inline(always)]
    unsafe fn atomic_accumulate(dst: *mut Self, v: Self) {
        // SAFETY: the caller guarantees `dst`; each component is a valid f32 address.
        unsafe {
            device::atomic_add_relaxed_gpu_f32(&raw mut (*dst).x, v.x);
            device::atomic_add_relaxed_gpu_f32(&raw mut (*dst).y, v.y);
            device::atomic_add_relaxed_gpu_f32(&raw mut (*dst).z, v.z);
        }
    }
}

impl DeviceElement for f32 {
    #[inline(always)]
    unsafe fn atomic_accumulate(dst: *mut Self, v: Self) {
        // SAFETY: the caller guarantees `dst`.
        unsafe { device::atomic_add_relaxed_gpu_f32(dst, v) }
    }
}

impl DeviceElement for f64 {
    #[inline(always)]
    unsafe fn atomic_accumulate(dst: *mut Self, v: Self) {
        // SAFETY: the caller guarantees `dst`.
        unsafe { device::atomic_add_relaxed_gpu_f64(dst, v) }
    }
}

impl DeviceElement for [f32; 4] {
    #[inline(always)]
    unsafe fn atomic_accumulate(dst: *mut Self, v: Self) {
        let d = dst as *mut f32;
        // SAFETY: the caller guarantees `dst`; the four components are consecutive f32s.
        unsafe {
            for (k, c) in v.iter().enumerate() {
                device::atomic_add_relaxed_gpu_f32(d.add(k), *c);
            }
        }
    }
}

/// The periodic shift of a pulse, or `None` when it does not cross the boundary.
#[inline(always)]
pub fn shift_of(meta: &PulseMeta) -> Option<Float3> {
    (meta.use_shift != 0).then_some(meta.shift)
}

/// `x[atom] (+ shift)`. Without a shift the value is copied untouched (bit-exact, `-0.0` stays).
#[inline(always)]
pub fn shifted<T: HaloElement>(v: T, shift: Option<Float3>) -> T {
    match shift {
        Some(s) => v.shifted(s),
        None => v,
    }
}

/// Grid-stride gather over `map[0..n]`: `dest[i] = x[map[i]] (+ shift)` for every entry `mode`
/// selects against `threshold`; returns how many entries this thread skipped (deferred).
///
/// # Safety
/// `x`, `map[0..n]` and `dest[0..n]` valid; every `map[i]` in range of `x`; `dest` not aliasing
/// the selected sources.
#[inline(always)]
pub unsafe fn pack_subset<T: HaloElement>(
    x: *const T,
    map: *const u32,
    n: u32,
    dest: *mut T,
    shift: Option<Float3>,
    mode: PackMode,
    threshold: u32,
) -> u32 {
    let mut deferred = 0;
    let mut i = thread::index_1d();
    while i < n {
        // SAFETY: i < n and the caller's contract on map, x and dest.
        unsafe {
            let atom = *map.add(i as usize);
            if mode.selects(atom, threshold) {
                *dest.add(i as usize) = shifted(*x.add(atom as usize), shift);
            } else {
                deferred += 1;
            }
        }
        i += thread::grid_stride_x();
    }
    deferred
}

/// Where a wait came from, for the timeout report.
#[derive(Clone, Copy)]
pub struct WaitSite {
    pub pulse: u32,
    pub kind: WaitKind,
    pub peer: i32,
}

/// Spin until `*slot == expected` (a signal SET by a peer to this step's counter), then acquire.
/// Bounded: after `timeout_ns` of `%globaltimer`, or as soon as another waiter has already timed
/// out, it records the failure in `status` (first reporter wins) and returns `false`, so the kernel
/// ends instead of hanging. Callers carry on to their barriers either way; the host discards the
/// step's data when `status.timed_out` is set.
///
/// # Safety
/// `slot` valid and 8-byte aligned (local or a peer's); `status` valid. One thread per wait.
#[inline(always)]
pub unsafe fn wait_signal(slot: *const u64, expected: u64, timeout_ns: u64, status: *mut WaitStatus, site: WaitSite) -> bool {
    let start = device::global_timer_ns();
    loop {
        // SAFETY: the caller guarantees `slot`.
        let seen = unsafe { device::load_relaxed_sys_u64(slot) };
        if seen == expected {
            device::fence_acq_rel_sys();
            return true;
        }
        let waited = device::global_timer_ns().wrapping_sub(start);
        // SAFETY: `status` valid; a volatile read sees another waiter's report.
        let other_failed = unsafe { core::ptr::read_volatile(&(*status).timed_out) } != 0;
        if waited > timeout_ns || other_failed {
            // SAFETY: `status` valid.
            unsafe { report_timeout(status, site, expected, seen, waited) };
            return false;
        }
    }
}

/// Spin until the u32 counter at `ptr` equals `expected` (blocks of this launch), acquire at GPU
/// scope, bounded like [`wait_signal`].
///
/// # Safety
/// `ptr` valid and on this device; `status` valid.
#[inline(always)]
pub unsafe fn wait_local_counter(ptr: *const u32, expected: u32, timeout_ns: u64, status: *mut WaitStatus, pulse: u32) -> bool {
    let start = device::global_timer_ns();
    loop {
        // SAFETY: the caller guarantees `ptr`.
        let seen = unsafe { device::load_acquire_gpu_u32(ptr) };
        if seen == expected {
            return true;
        }
        let waited = device::global_timer_ns().wrapping_sub(start);
        // SAFETY: `status` valid.
        let other_failed = unsafe { core::ptr::read_volatile(&(*status).timed_out) } != 0;
        if waited > timeout_ns || other_failed {
            let site = WaitSite { pulse, kind: WaitKind::LocalBlocks, peer: -1 };
            // SAFETY: `status` valid.
            unsafe { report_timeout(status, site, expected as u64, seen as u64, waited) };
            return false;
        }
    }
}

/// Claims `status` (0 -> 1) and fills in the details; later reporters leave it alone.
///
/// # Safety
/// `status` valid.
unsafe fn report_timeout(status: *mut WaitStatus, site: WaitSite, expected: u64, seen: u64, waited: u64) {
    // SAFETY: `status` valid; the CAS makes exactly one thread the writer.
    unsafe {
        if device::atomic_cas_relaxed_gpu_u32(&raw mut (*status).timed_out, 0, 1) == 0 {
            (*status).pulse = site.pulse;
            (*status).kind = site.kind as u32;
            (*status).peer = site.peer;
            (*status).expected = expected;
            (*status).seen = seen;
            (*status).waited_ns = waited;
        }
    }
}

/// Device-wide arrival: thread 0 of each block increments `counter` (acq-rel, wrapping after
/// `gridDim.x` arrivals); returns, to every thread of the block, whether this block arrived last
/// and so sees all the other blocks' writes.
///
/// # Safety
/// All threads of the block call it together (it contains block barriers); `counter` valid, on
/// this device, 0 when the launch starts (it wraps back to 0 by itself).
#[inline(always)]
pub unsafe fn arrive_is_last_block(counter: *mut u32) -> bool {
    // SAFETY: all threads call this; the barrier orders the block's writes before thread 0's release.
    unsafe {
        device::sync_threads();
        let mut last = false;
        if thread::thread_idx_x() == 0 {
            let limit = thread::grid_dim_x() - 1;
            last = device::atomic_inc_acq_rel_gpu(counter, limit) == limit;
        }
        device::sync_threads_or(last)
    }
}

/// Delivers a packed pulse once all its data is written: on the direct path one `st.release.sys`
/// of `counter` into the peer's slot (thread 0); on the put path every thread of the block calls
/// `putmem_signal_nbi_block` from the local `src` into the symmetric `dest_symmetric` on `pe`.
///
/// # Safety
/// All threads of the block call it together. Direct path: `remote_signal` mapped and valid. Put
/// path: NVSHMEM initialised and this module registered; `dest_symmetric`, `src[0..n]` and
/// `signal_symmetric` symmetric addresses valid on `pe`.
#[inline(always)]
pub unsafe fn deliver<T: HaloElement>(
    remote_signal: *mut u64,
    direct: bool,
    dest_symmetric: *mut T,
    src: *const T,
    n: u32,
    signal_symmetric: *mut u64,
    counter: u64,
    pe: i32,
) {
    if direct {
        if thread::thread_idx_x() == 0 {
            // SAFETY: caller's contract; the block's writes were published to thread 0 by the
            // election (acq-rel) and a barrier, and release.sys is cumulative.
            unsafe { device::store_release_sys_u64(remote_signal, counter) };
        }
    } else {
        // SAFETY: caller's contract; `n` elements of `T`.
        unsafe {
            nvshmem::nvshmemx_putmem_signal_nbi_block(
                dest_symmetric.cast(),
                src.cast(),
                n as usize * size_of::<T>(),
                signal_symmetric,
                counter,
                NVSHMEM_SIGNAL_SET,
                pe,
            )
        };
    }
}
