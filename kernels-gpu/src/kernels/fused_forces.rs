//! All force pulses in one launch (GROMACS's `fusedUnPackFRecvBufNvshmemKernel`, rewritten): the
//! reverse chain of the coordinate halo.
//!
//! For pulse `p`, this rank holds forces on the halo atoms it received in `p` (at `atom_offset`,
//! `recv_size` of them) and owes them to `recv_pe`; it is owed forces on the atoms it sent in `p`
//! (`send_size`, through `index_map`) by `send_pe`. Halo atoms of pulse `p` may have been
//! forwarded in any later pulse, so pulse `p`'s forces may leave only after every later pulse
//! has been accumulated here. The chain therefore starts at the last pulse:
//!
//! 1. block 0 of the last pulse sends the last pulse's halo forces at once;
//! 2. the blocks of pulse `p` wait for `send_pe`'s signal, then accumulate the received forces
//!    into `f` through the map (read straight from the peer's `f` on the direct path, from the
//!    local receive slot on the put path);
//! 3. the last block to finish pulse `p > 0` waits until every later pulse is finished too, then
//!    sends pulse `p - 1`.

use super::common::{DeviceElement, WaitSite, deliver, wait_local_counter, wait_signal};
use crate::abi::{PulseMeta, WaitKind, WaitStatus};
use crate::device::{self, thread};

/// Sends the halo forces of `meta`'s pulse (flat index `pulse`) to its `recv_pe`: on the direct
/// path only a signal (the peer reads our `f`), on the put path the forces themselves.
///
/// # Safety
/// All threads of the block call it together; pointers from the validated plan.
#[inline(always)]
unsafe fn send_halo_forces<T: DeviceElement>(meta: &PulseMeta, pulse: u32, num_pulses: u32, f: *mut T, signals: *mut u64, counter: u64) {
    let direct = meta.remote_f_signal != 0;
    // SAFETY: forwarded; recv_buf and the receive-F slot are symmetric on the put path.
    unsafe {
        let halo = f.add(meta.atom_offset as usize);
        deliver(meta.remote_f_signal as *mut u64, direct, meta.recv_buf as *mut T, halo, meta.recv_size,
            signals.add((num_pulses + pulse) as usize), counter, meta.recv_pe)
    }
}

/// `signals[num_pulses..2*num_pulses]` are this rank's receive-F slots. `done[0..num_pulses]`
/// count finished blocks per pulse; they are zeroed when the plan is installed and reach
/// `launch_seq * gridDim.x` during the `launch_seq`-th launch since then (1-based, wrapping).
///
/// # Safety
/// Metadata from a validated plan (direct: peers mapped; put: NVSHMEM, symmetric buffers).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn fused_forces<T: DeviceElement>(
    pulses: *const PulseMeta, num_pulses: u32, f: *mut T, signals: *mut u64, counter: u64,
    done: *mut u32, launch_seq: u32, timeout_ns: u64, status: *mut WaitStatus,
) {
    let pulse = thread::block_idx_y();
    if pulse >= num_pulses {
        return; // uniform per block
    }
    // SAFETY: `num_pulses` valid entries.
    let meta = unsafe { &*pulses.add(pulse as usize) };
    let last_pulse = num_pulses - 1;
    if pulse == last_pulse && thread::block_idx_x() == 0 {
        // SAFETY: all threads of this block.
        unsafe { send_halo_forces(meta, pulse, num_pulses, f, signals, counter) };
    }

    // Receive and accumulate this pulse's forces.
    if thread::thread_idx_x() == 0 {
        let site = WaitSite { pulse, kind: WaitKind::ForceSignal, peer: meta.send_pe };
        // SAFETY: own receive-F slot.
        unsafe { wait_signal(signals.add((num_pulses + pulse) as usize), counter, timeout_ns, status, site) };
    }
    // SAFETY: every thread reaches it; orders thread 0's acquire before the reads below.
    unsafe { device::sync_threads() };
    let src = if meta.remote_f_get != 0 { meta.remote_f_get } else { meta.recv_buf } as *const T;
    let map = meta.index_map as *const u32;
    let mut i = thread::index_1d();
    while i < meta.send_size {
        // SAFETY: src[0..send_size] (peer's f or local slot) and map targets in range of f.
        unsafe {
            let v = *src.add(i as usize);
            let t = f.add(*map.add(i as usize) as usize);
            if meta.accumulate != 0 {
                T::atomic_accumulate(t, v);
            } else {
                *t = v;
            }
        }
        i += thread::grid_stride_x();
    }

    // Count this block as done; the last block of a pulse > 0 forwards the chain.
    // SAFETY: every thread reaches the barriers.
    unsafe { device::sync_threads() };
    let target = launch_seq.wrapping_mul(thread::grid_dim_x());
    let mut last = false;
    if thread::thread_idx_x() == 0 {
        // SAFETY: `done` has `num_pulses` counters on this device.
        let old = unsafe { device::atomic_add_acq_rel_gpu_u32(done.add(pulse as usize), 1) };
        last = old.wrapping_add(1) == target;
        if last && pulse > 0 {
            for later in pulse + 1..num_pulses {
                // SAFETY: as above.
                unsafe { wait_local_counter(done.add(later as usize), target, timeout_ns, status, later) };
            }
        }
    }
    // SAFETY: every thread reaches it; thread 0's acquires are ordered before the send.
    if unsafe { device::sync_threads_or(last) } && pulse > 0 {
        // SAFETY: `pulse - 1` is a valid entry; all threads of this block.
        let previous = unsafe { &*pulses.add(pulse as usize - 1) };
        unsafe { send_halo_forces(previous, pulse - 1, num_pulses, f, signals, counter) };
    }
}
