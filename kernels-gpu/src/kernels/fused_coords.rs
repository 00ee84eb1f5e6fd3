//! All coordinate pulses in one launch (GROMACS's `fusedPulsesPackXAndSendKernel`, rewritten).
//!
//! Grid `(blocks_per_pulse, num_pulses)`, `blockIdx.y` = pulse. Pulse 0 packs everything at once;
//! a later pulse first packs its independent atoms (home atoms, index < `dep_offset`), waits for the
//! signals of every earlier pulse only if one of its atoms came from them, then packs the rest. The
//! last block of each pulse delivers it and then waits for this rank's own incoming pulse, so the
//! kernel's end means every halo coordinate has landed. The last pulse to be delivered advances
//! the rank's coordinate step counter and sends the coordinate credits.
//!
//! Each pulse takes its own path ([`PulseMeta::path`], block-uniform since a block serves one
//! pulse): direct stores into the peer's mapped memory, NVSHMEM put + signal where the peer is not
//! mapped, or bulk copies ([`bulk_pulse`], the TMA kernel's body; the launch then carries
//! [`crate::abi::TMA_SHARED_BYTES`] of dynamic shared memory). Pulses whose peers differ take
//! different paths in one launch.

use super::common::{Step, WaitSite, arrive_is_last_block, deliver, finish_coordinates, pack_subset, shift_of, wait_signal};
use super::timeline::Timeline;
use crate::abi::timeline::{self as tl_layout, coords as point, pulse_slot};
use super::fused_coords_tma::bulk_pulse;
use crate::abi::{
    Direction, HaloElement, PackMode, ProtocolState, PulseMeta, SignalMode, SignalSlot, WaitKind, WaitStatus,
    pulse_flags, signal_index,
};
use crate::device::{self, thread};

/// Waits, in thread 0 of the calling block, until `send_pe` has finished reading what this rank
/// sent it in pulse `pulse` during the previous coordinate launch: only when that launch was a
/// coordinate launch too (`step.repeat`) and the pulse needs it ([`pulse_flags::WAIT_COORD_CREDIT`];
/// otherwise the step's own signals already order it, docs/protocol.md). Block-uniform; ends with
/// a barrier when it waits.
///
/// # Safety
/// All threads of the block call it; `signals` this rank's slots; `status` valid.
#[inline(always)]
pub unsafe fn await_coord_credit(meta: &PulseMeta, pulse: u32, num_pulses: u32, signals: *mut u64, step: Step, timeout_ns: u64, status: *mut WaitStatus) {
    if !(step.repeat && meta.has(pulse_flags::WAIT_COORD_CREDIT)) {
        return;
    }
    if thread::thread_idx_x() == 0 {
        let site = WaitSite { pulse, kind: WaitKind::CoordCredit, peer: meta.send_pe };
        // SAFETY: own credit slot of this pulse.
        unsafe { wait_signal(signals.add(signal_index(SignalSlot::CoordCredit, pulse, num_pulses)), step.epoch - 1, timeout_ns, status, site) };
    }
    // SAFETY: block-uniform condition; orders thread 0's acquire before the block's stores.
    unsafe { device::sync_threads() };
}

/// `signals` are this rank's slots ([`SignalSlot`] order); `state` its protocol state (the step
/// counter is read there, not passed); `counters[0..num_pulses]` the coordinate block counters
/// (zero at launch start; they wrap back to 0 by themselves). `x` and `signals` symmetric on the
/// put path. `tl` stamps the timeline probe's points ([`super::timeline`]; the exchange's kernel
/// passes `Off`, which stamps nothing).
///
/// # Safety
/// Metadata from a validated plan (see `pulse_exchange` for the two paths' requirements); when a
/// pulse's path is bulk, the launch's dynamic shared memory as [`bulk_pulse`] needs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn fused_coords<T: HaloElement, L: Timeline>(
    pulses: *const PulseMeta, num_pulses: u32, x: *mut T, signals: *mut u64, state: *mut ProtocolState,
    counters: *mut u32, dep_offset: u32, timeout_ns: u64, status: *mut WaitStatus, tl: L,
) {
    let entered = tl.now();
    let pulse = thread::block_idx_y();
    if pulse >= num_pulses {
        return; // uniform per block: no barrier is skipped by part of a block
    }
    // SAFETY: the host passes `num_pulses` valid entries and this rank's state.
    let (meta, step) = unsafe { (&*pulses.add(pulse as usize), Step::read(state, Direction::Coordinates)) };
    let tl = tl.entered(step.epoch, entered);
    if meta.bulk() {
        // Block-uniform (one pulse per block). Credits of the launch may go by NVSHMEM: other
        // pulses of it may put.
        // SAFETY: every thread of the block; the peer is mapped (`bulk()` checked it) and the host
        // launched with the bulk path's shared memory.
        unsafe { bulk_pulse::<T, true>(pulses, num_pulses, pulse, meta, step, x, signals, state, counters, dep_offset, timeout_ns, status) };
        return;
    }
    // SAFETY: all threads of the block.
    unsafe { await_coord_credit(meta, pulse, num_pulses, signals, step, timeout_ns, status) };
    tl.mark0(pulse_slot(pulse, point::CREDIT));
    let direct = meta.remote_x != 0;
    let dest = if direct { meta.remote_x } else { meta.x_stage + step.parity() * meta.slot_bytes as u64 } as *mut T;
    let map = meta.index_map as *const u32;
    let shift = shift_of(meta);

    // Pass 1: everything for pulse 0, independent atoms for the others.
    let first_mode = if pulse == 0 { PackMode::All } else { PackMode::BelowThreshold };
    // SAFETY: buffers from the validated plan.
    let deferred = unsafe { pack_subset(x, map, meta.send_size, dest, shift, first_mode, dep_offset) };

    // Pass 2, only in blocks that hold dependent atoms: wait for the earlier pulses that
    // delivered them, then pack them. The vote is block-uniform, so the barriers inside are too.
    // SAFETY: every thread of the block reaches this barrier.
    let any_deferred = unsafe { device::sync_threads_or(deferred > 0) };
    tl.mark0(pulse_slot(pulse, point::PACKED));
    if any_deferred {
        if thread::thread_idx_x() == 0 {
            for earlier in 0..pulse {
                // SAFETY: own receive-X slots, `num_pulses` of them.
                let meta_e = unsafe { &*pulses.add(earlier as usize) };
                let site = WaitSite { pulse: earlier, kind: WaitKind::CoordSignal, peer: meta_e.recv_pe };
                unsafe { wait_signal(signals.add(signal_index(SignalSlot::CoordData, earlier, num_pulses)), step.epoch, timeout_ns, status, site) };
            }
            tl.mark(pulse_slot(pulse, point::DEPS));
        }
        // SAFETY: block-uniform branch; thread 0's acquire is ordered before the others' reads.
        unsafe { device::sync_threads() };
        unsafe { pack_subset(x, map, meta.send_size, dest, shift, PackMode::AtOrAboveThreshold, dep_offset) };
    }

    // SAFETY: all threads of the block call it.
    if unsafe { arrive_is_last_block(counters.add(pulse as usize)) } {
        tl.mark0(pulse_slot(pulse, point::ELECTED));
        tl.keep0(pulse_slot(pulse, point::ELECTED_ENTRY), entered);
        let own_slot = unsafe { signals.add(signal_index(SignalSlot::CoordData, pulse, num_pulses)) };
        // SAFETY: all threads of the last block; plan pointers validated by the host.
        unsafe {
            deliver(meta.remote_x_signal as *mut u64, direct, x.add(meta.peer_atom_offset as usize), dest,
                meta.send_size, own_slot, step.epoch, meta.send_pe, SignalMode::from_u32(meta.signal_mode))
        };
        tl.mark0(pulse_slot(pulse, point::DELIVERED));
        if thread::thread_idx_x() == 0 {
            let site = WaitSite { pulse, kind: WaitKind::CoordSignal, peer: meta.recv_pe };
            // SAFETY: the launch-wide arrival (state on this device), overlapping the hop; then
            // this rank's own receive-X slot.
            unsafe {
                finish_coordinates(pulses, num_pulses, signals, state, step, true);
                wait_signal(own_slot, step.epoch, timeout_ns, status, site);
            }
            tl.mark(pulse_slot(pulse, point::RECEIVED));
        }
    }
    tl.mark0(Some(tl_layout::END));
}
