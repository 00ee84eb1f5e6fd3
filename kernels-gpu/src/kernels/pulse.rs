//! The seed's first design: one kernel per coordinate pulse that packs, meets at a device-wide
//! barrier, delivers the pulse to its peer and waits for its own incoming pulse before it ends.
//! Launched pulse after pulse in stream order, so later pulses see earlier pulses' atoms without
//! any dependency wait inside the kernel.

use super::common::{
    Step, WaitSite, arrive_is_last_block, deliver, finish_coordinates, pack_subset, send_previous_credit, shift_of, timed_out, wait_signal,
};
use super::fused_coords::coord_credit_granted;
use crate::abi::{Direction, HaloElement, PackMode, ProtocolState, PulseMeta, SignalMode, SignalSlot, WaitKind, WaitStatus, signal_index};
use crate::device::{self, thread};

/// Pulse `pulse` (of `num_pulses`) of the forward (coordinate) halo. `direct`: pack straight into
/// the peer's array (`remote_x`, reachable by stores over NVLink or on the same GPU), then one
/// `st.release.sys` of the step counter into the peer's slot. Otherwise pack into this step's
/// staging slot and the last block puts it into the peer's `x` at `peer_atom_offset`, signalled as
/// `signal_mode` says. The kernel ends once this rank's own slot holds the step counter, i.e. its
/// incoming halo has landed. The step counter comes from `state`; the last block of each pulse's
/// launch arrives on the launch-wide counter, so the launch of the last pulse advances it and
/// sends the coordinate credits (the earlier pulses' launches finished before it, in stream
/// order). `counters[pulse]` is zero at launch start and wraps back to 0 by itself.
///
/// # Safety
/// Metadata from a validated plan; direct: peer addresses mapped; put: NVSHMEM initialised and
/// the module registered, `x` and `signals` symmetric.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn pulse_exchange<T: HaloElement>(
    pulses: *const PulseMeta,
    pulse: u32,
    num_pulses: u32,
    x: *mut T,
    signals: *mut u64,
    state: *mut ProtocolState,
    counters: *mut u32,
    timeout_ns: u64,
    status: *mut WaitStatus,
    direct: bool,
) {
    // SAFETY: the host passes a valid metadata array with `num_pulses > pulse` entries and this rank's state.
    let (meta, step) = unsafe { (&*pulses.add(pulse as usize), Step::read(state, Direction::Coordinates)) };
    // Also sent at the end of the step; this one serves a peer whose last launch was fused.
    // SAFETY: the pulse's peer as installed (mapped when `direct`).
    unsafe { send_previous_credit(meta, pulse, num_pulses, signals, step, Direction::Coordinates, !direct) };
    // A credit that did not come leaves the peer's memory alone (it may still read it); the
    // signal is then withheld below.
    // SAFETY: all threads of the block.
    let granted = unsafe { coord_credit_granted(meta, pulse, num_pulses, signals, step, 1, timeout_ns, status) };
    let dest = if direct { meta.remote_x } else { meta.x_stage + step.parity() * meta.slot_bytes as u64 } as *mut T;
    let map = meta.index_map as *const u32;
    // Nor does a launch after a timeout write into the peer's `x` ([`timed_out`]); the put path
    // packs into this rank's own staging slot, whose put the signal's check below withholds.
    // SAFETY: `status` valid.
    if granted && !(direct && unsafe { timed_out(status) }) {
        // SAFETY: map/x/dest valid per the plan the host validated.
        unsafe { pack_subset(x, map, meta.send_size, dest, shift_of(meta), PackMode::All, 0) };
    }
    // SAFETY: all threads call it; `counters[pulse]` is this pulse's zeroed device counter.
    if unsafe { arrive_is_last_block(counters.add(pulse as usize)) } {
        let own_slot = unsafe { signals.add(signal_index(SignalSlot::CoordData, pulse, num_pulses)) };
        // A wait timed out, in an earlier pulse (forwarded atoms in `x` may be stale), the credit's,
        // or an earlier launch's (the blocks wrote nothing into the peer's `x`): no signal vouches
        // for the pulse, and the peer times out too. Thread 0 decides for the block (the put is
        // collective); the arrivals ordered every block's look at the flag before this one.
        // SAFETY: every thread of the last block reaches the barrier; `status` valid.
        let failed = unsafe { device::sync_threads_or(thread::thread_idx_x() == 0 && timed_out(status)) };
        if !failed {
            // SAFETY: all threads of the last block call it; pointers from the validated plan.
            unsafe {
                deliver(
                    meta.remote_x_signal as *mut u64,
                    direct,
                    x.add(meta.peer_atom_offset as usize),
                    dest,
                    meta.send_size,
                    own_slot,
                    step.epoch,
                    meta.send_pe,
                    SignalMode::from_u32(meta.signal_mode),
                )
            };
        }
        if thread::thread_idx_x() == 0 {
            let site = WaitSite { pulse, kind: WaitKind::CoordSignal, peer: meta.recv_pe };
            // SAFETY: state on this device; own_slot is this rank's receive-X slot for the pulse.
            unsafe {
                finish_coordinates(pulses, num_pulses, signals, state, step, !direct);
                wait_signal(own_slot, step.epoch, timeout_ns, status, site);
            }
        }
    }
}
