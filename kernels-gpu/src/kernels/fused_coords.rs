//! All coordinate pulses in one launch (GROMACS's `fusedPulsesPackXAndSendKernel`, rewritten).
//!
//! Grid `(blocks_per_pulse, num_pulses)`, `blockIdx.y` = pulse. Pulse 0 packs everything at once;
//! a later pulse first packs its independent atoms (home atoms, index < `dep_offset`), waits for the
//! signals of every earlier pulse only if one of its atoms came from them, then packs the rest. The
//! last block of each pulse delivers it and then waits for this rank's own incoming pulse, so the
//! kernel's end means every halo coordinate has landed.

use super::common::{WaitSite, arrive_is_last_block, deliver, pack_subset, shift_of, wait_signal};
use crate::abi::{HaloElement, PackMode, PulseMeta, WaitKind, WaitStatus};
use crate::device::{self, thread};

/// `signals[0..num_pulses]` are this rank's receive-X slots; `block_counters[0..num_pulses]` are
/// zeroed device counters (they wrap back to 0 each launch). `counter` is this step's signal
/// value, fresh every step on every rank. `x` and `signals` symmetric on the put path.
///
/// # Safety
/// Metadata from a validated plan (see `pulse_exchange` for the two paths' requirements).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn fused_coords<T: HaloElement>(
        pulses: *const PulseMeta, num_pulses: u32, x: *mut T, signals: *mut u64, counter: u64,
        block_counters: *mut u32, dep_offset: u32, timeout_ns: u64, status: *mut WaitStatus,
    ) {
        let pulse = thread::block_idx_y();
        if pulse >= num_pulses {
            return; // uniform per block: no barrier is skipped by part of a block
        }
        // SAFETY: the host passes `num_pulses` valid entries.
        let meta = unsafe { &*pulses.add(pulse as usize) };
        let direct = meta.remote_x != 0;
        let dest = if direct { meta.remote_x } else { meta.send_buf } as *mut T;
        let map = meta.index_map as *const u32;
        let shift = shift_of(meta);

        // Pass 1: everything for pulse 0, independent atoms for the others.
        let first_mode = if pulse == 0 { PackMode::All } else { PackMode::BelowThreshold };
        // SAFETY: buffers from the validated plan.
        let deferred = unsafe { pack_subset(x, map, meta.send_size, dest, shift, first_mode, dep_offset) };

        // Pass 2, only in blocks that hold dependent atoms: wait for the earlier pulses that
        // delivered them, then pack them. The vote is block-uniform, so the barriers inside are too.
        // SAFETY: every thread of the block reaches this barrier.
        if unsafe { device::sync_threads_or(deferred > 0) } {
            if thread::thread_idx_x() == 0 {
                for earlier in 0..pulse {
                    // SAFETY: own receive-X slots, `num_pulses` of them.
                    let meta_e = unsafe { &*pulses.add(earlier as usize) };
                    let site = WaitSite { pulse: earlier, kind: WaitKind::CoordSignal, peer: meta_e.recv_pe };
                    unsafe { wait_signal(signals.add(earlier as usize), counter, timeout_ns, status, site) };
                }
            }
            // SAFETY: block-uniform branch; thread 0's acquire is ordered before the others' reads.
            unsafe { device::sync_threads() };
            unsafe { pack_subset(x, map, meta.send_size, dest, shift, PackMode::AtOrAboveThreshold, dep_offset) };
        }

        // SAFETY: all threads of the block call it.
        if unsafe { arrive_is_last_block(block_counters.add(pulse as usize)) } {
            let own_slot = unsafe { signals.add(pulse as usize) };
            // SAFETY: all threads of the last block; plan pointers validated by the host.
            unsafe {
                deliver(meta.remote_x_signal as *mut u64, direct, x.add(meta.peer_atom_offset as usize), dest,
                    meta.send_size, own_slot, counter, meta.send_pe)
            };
            if thread::thread_idx_x() == 0 {
                let site = WaitSite { pulse, kind: WaitKind::CoordSignal, peer: meta.recv_pe };
                // SAFETY: own receive-X slot.
                unsafe { wait_signal(own_slot, counter, timeout_ns, status, site) };
            }
        }
    }
