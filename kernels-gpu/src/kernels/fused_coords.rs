//! All coordinate pulses in one launch (GROMACS's `fusedPulsesPackXAndSendKernel`, rewritten).
//!
//! Grid `(blocks_per_pulse, num_pulses)`, `blockIdx.y` = pulse. The blocks of row `p` send pulse
//! `p`, arrive on the launch-wide counter (the last advances the rank's coordinate step counter),
//! then take in this rank's own incoming pulse `p`. The kernel's end means every halo coordinate
//! has landed in `x`. The coordinate credits of the previous launch go out first thing
//! ([`send_previous_credit`]): nothing at the end of a launch waits for its stores.
//!
//! Sending: pulse 0 packs everything at once; a later pulse first packs its independent atoms
//! (home atoms, index < `dep_offset`), then the atoms it forwards, which it takes as they arrive
//! ([`ll::received`]). Each pulse takes its own path ([`PulseMeta::path`], block-uniform since a
//! block serves one pulse):
//! - [`CoordPath::Store`], the peer mapped: every thread stores its atoms as low-latency words
//!   ([`crate::abi::ll`]) into the peer's receive slot. Nothing else: no election, no fence, no
//!   signal; the peer polls the words.
//! - [`CoordPath::Put`]: pack into the local staging slot; the last block puts it into the peer's
//!   `x` and signals.
//! - [`CoordPath::Bulk`]: bulk copies into the peer's `x` and a signal ([`bulk_pulse`], the TMA
//!   kernel's body; the launch then carries [`crate::abi::TMA_SHARED_BYTES`] of dynamic shared
//!   memory).
//!
//! Receiving ([`pulse_flags::RECV_X_LL`]): words are polled and unpacked into `x` by all blocks of
//! the row, each its share; a put or a bulk copy is awaited by one thread on the pulse's signal.
//! Pulses whose peers differ take different paths in one launch.

use super::common::{
    Step, WaitClock, WaitSite, arrive_is_last_block, arrive_launch, deliver, pack_subset, send_previous_credit, shift_of, shifted, timed_out,
    wait_signal, wait_signal_on,
};
use super::fused_coords_tma::bulk_pulse;
use super::ll;
use super::timeline::Timeline;
use crate::abi::timeline::{self as tl_layout, coords as point, pulse_slot};
use crate::abi::{
    CoordPath, Direction, HaloElement, PackMode, ProtocolState, PulseMeta, SignalMode, SignalSlot, WaitKind, WaitStatus, pulse_flags, signal_index,
};
use crate::device::{self, thread};

/// Waits, in thread 0 of the calling block, until `send_pe` has finished reading what this rank
/// sent it in pulse `pulse` `lag` coordinate launches ago: only when the previous launch was a
/// coordinate launch too (`step.repeat`) and the pulse needs it ([`pulse_flags::WAIT_COORD_CREDIT`];
/// otherwise the step's own signals already order it, docs/protocol.md). `lag` is 1 where the
/// pulse writes the peer's `x` itself, 2 where it writes one slot of a pair (low-latency words:
/// the slot of step `e` was last read in step `e - 2`). Block-uniform; ends with a barrier when it
/// waits.
///
/// # Safety
/// All threads of the block call it; `signals` this rank's slots; `status` valid.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn await_coord_credit(
    meta: &PulseMeta,
    pulse: u32,
    num_pulses: u32,
    signals: *mut u64,
    step: Step,
    lag: u64,
    timeout_ns: u64,
    status: *mut WaitStatus,
) {
    if !(step.repeat && meta.has(pulse_flags::WAIT_COORD_CREDIT)) {
        return;
    }
    if thread::thread_idx_x() == 0 {
        // SAFETY: forwarded.
        unsafe { wait_coord_credit(meta, pulse, num_pulses, signals, step, lag, timeout_ns, status) };
    }
    // SAFETY: block-uniform condition; orders thread 0's acquire before the block's stores.
    unsafe { device::sync_threads() };
}

/// [`await_coord_credit`] that tells every thread of the block whether the credit came: `false`
/// when thread 0's wait expired (or gave up on another waiter's timeout). The peer may then still
/// read the memory the pulse would write (its `x`, for the paths that store into it directly), so
/// the caller writes nothing there; the pulse's signal is withheld anyway
/// ([`super::common::coord_pulse_depends_on_waits`] holds when the credit is awaited), and the peer times out and
/// reports too, instead of forwarding this step's values as the last step's.
///
/// # Safety
/// As [`await_coord_credit`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn coord_credit_granted(
    meta: &PulseMeta,
    pulse: u32,
    num_pulses: u32,
    signals: *mut u64,
    step: Step,
    lag: u64,
    timeout_ns: u64,
    status: *mut WaitStatus,
) -> bool {
    if !(step.repeat && meta.has(pulse_flags::WAIT_COORD_CREDIT)) {
        return true;
    }
    let granted = thread::thread_idx_x() != 0
        // SAFETY: forwarded.
        || unsafe { wait_coord_credit(meta, pulse, num_pulses, signals, step, lag, timeout_ns, status) };
    // SAFETY: block-uniform condition; orders thread 0's acquire before the block's stores.
    !unsafe { device::sync_threads_or(!granted) }
}

/// Thread 0's wait for the credit of `pulse` ([`await_coord_credit`]): `false` when it expired.
///
/// # Safety
/// `signals` this rank's slots; `status` valid.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn wait_coord_credit(
    meta: &PulseMeta,
    pulse: u32,
    num_pulses: u32,
    signals: *mut u64,
    step: Step,
    lag: u64,
    timeout_ns: u64,
    status: *mut WaitStatus,
) -> bool {
    let site = WaitSite { pulse, kind: WaitKind::CoordCredit, peer: meta.send_pe };
    // SAFETY: own credit slot of this pulse.
    unsafe {
        wait_signal(signals.add(signal_index(SignalSlot::CoordCredit, pulse, num_pulses)), step.epoch.saturating_sub(lag), timeout_ns, status, site)
    }
}

/// Waits, in thread 0 of the calling block, for the signals of the pulses before `pulse` that do
/// not arrive as low-latency words (puts and bulk copies land in `x` behind a signal); the words
/// are polled atom by atom instead ([`ll::received`]). Then a block barrier.
///
/// # Safety
/// All threads of the block call it; `pulses[0..pulse]` and `signals` valid; `status` valid.
#[inline(always)]
unsafe fn await_signalled_earlier(
    pulses: *const PulseMeta,
    pulse: u32,
    num_pulses: u32,
    signals: *mut u64,
    step: Step,
    timeout_ns: u64,
    status: *mut WaitStatus,
) {
    if thread::thread_idx_x() == 0 {
        // One wait for all of them: one deadline.
        let mut clock = WaitClock::new();
        for earlier in 0..pulse {
            // SAFETY: own receive-X slots, `num_pulses` of them.
            let meta_e = unsafe { &*pulses.add(earlier as usize) };
            if !ll::arrives_as_words(meta_e) {
                let site = WaitSite { pulse: earlier, kind: WaitKind::CoordSignal, peer: meta_e.recv_pe };
                // SAFETY: own receive-X slot of pulse `earlier`.
                unsafe {
                    wait_signal_on(
                        &mut clock,
                        signals.add(signal_index(SignalSlot::CoordData, earlier, num_pulses)),
                        step.epoch,
                        timeout_ns,
                        status,
                        site,
                    )
                };
            }
        }
    }
    // SAFETY: every thread reaches it; orders thread 0's acquires before the block's reads of `x`.
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
/// pulse's path is bulk, the launch's dynamic shared memory as [`bulk_pulse`] needs; the grid's
/// height is `num_pulses` (the launch-wide arrival counts `gridDim.x * num_pulses` blocks).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn fused_coords<T: HaloElement, L: Timeline>(
    pulses: *const PulseMeta,
    num_pulses: u32,
    x: *mut T,
    signals: *mut u64,
    state: *mut ProtocolState,
    counters: *mut u32,
    dep_offset: u32,
    timeout_ns: u64,
    status: *mut WaitStatus,
    tl: L,
) {
    // Launched to overlap the previous kernel: nothing it writes (the step counters, `x`, `f`)
    // is read before it has completed. Then the next kernel may start its blocks (this kernel's
    // blocks are all resident by the time every one of them has got here).
    device::wait_for_previous_kernel();
    device::allow_next_kernel();
    let entered = tl.now();
    let pulse = thread::block_idx_y();
    if pulse >= num_pulses {
        return; // uniform per block: no barrier is skipped by part of a block
    }
    // SAFETY: the host passes `num_pulses` valid entries and this rank's state.
    let (meta, step) = unsafe { (&*pulses.add(pulse as usize), Step::read(state, Direction::Coordinates)) };
    let tl = tl.entered(step.epoch, entered);
    // SAFETY: the pulse's peer as installed; this rank's slots.
    unsafe { send_previous_credit(meta, pulse, num_pulses, signals, step, Direction::Coordinates, true) };
    if meta.bulk() {
        // Block-uniform (one pulse per block).
        // SAFETY: every thread of the block; the peer is mapped (`bulk()` checked it) and the host
        // launched with the bulk path's shared memory.
        unsafe { bulk_pulse::<T, true>(pulses, num_pulses, pulse, meta, step, x, signals, state, counters, dep_offset, timeout_ns, status) };
    } else {
        // SAFETY: forwarded; every thread of the block.
        unsafe { send_pulse(pulses, num_pulses, pulse, meta, step, x, signals, counters, dep_offset, timeout_ns, status, tl) };
    }
    // Sent: every block arrives (the last records the launch) while the pulses travel.
    // SAFETY: every thread of every block (`num_pulses` rows of `gridDim.x`) arrives once.
    unsafe { arrive_launch(state, step, Direction::Coordinates, thread::grid_dim_x() * num_pulses) };
    // SAFETY: forwarded; every thread of the block.
    unsafe { receive_pulse(pulse, num_pulses, meta, step, x, signals, timeout_ns, status, tl) };
    tl.mark0(Some(tl_layout::END));
}

/// Sends pulse `pulse` by stores of low-latency words or by a put (see the module).
///
/// # Safety
/// All threads of the block; as [`fused_coords`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn send_pulse<T: HaloElement, L: Timeline>(
    pulses: *const PulseMeta,
    num_pulses: u32,
    pulse: u32,
    meta: &PulseMeta,
    step: Step,
    x: *mut T,
    signals: *mut u64,
    counters: *mut u32,
    dep_offset: u32,
    timeout_ns: u64,
    status: *mut WaitStatus,
    tl: L,
) {
    let words = CoordPath::from_u32(meta.path) == CoordPath::Store && meta.remote_x_slots != 0;
    // SAFETY: all threads of the block.
    unsafe { await_coord_credit(meta, pulse, num_pulses, signals, step, if words { 2 } else { 1 }, timeout_ns, status) };
    tl.mark0(pulse_slot(pulse, point::CREDIT));
    let map = meta.index_map as *const u32;
    let shift = shift_of(meta);
    let (parity, flag) = (step.parity(), ll::flag_of(step));

    if words {
        let dest = ll::slot(meta.remote_x_slots, parity, meta.recv_slot_bytes);
        // Pass 1: everything for pulse 0, independent atoms for the others.
        let mut i = thread::index_1d();
        while i < meta.send_size {
            // SAFETY: i < send_size; map entries index `x`; the peer's slot holds send_size elements.
            unsafe {
                let atom = *map.add(i as usize);
                if pulse == 0 || atom < dep_offset {
                    ll::store(dest, i, shifted(*x.add(atom as usize), shift), flag);
                }
            }
            i += thread::grid_stride_x();
        }
        tl.mark0(pulse_slot(pulse, point::PACKED));
        if pulse == 0 {
            tl.mark0(pulse_slot(pulse, point::DELIVERED));
            return;
        }
        // Pass 2: the forwarded atoms, each as soon as it has arrived. Puts and bulk copies
        // among the earlier pulses are awaited by signal first (a block-uniform condition).
        // SAFETY: `pulses[0..pulse]` valid.
        if !unsafe { ll::all_arrive_as_words(pulses, pulse) } {
            // SAFETY: all threads of the block.
            unsafe { await_signalled_earlier(pulses, pulse, num_pulses, signals, step, timeout_ns, status) };
        }
        tl.mark0(pulse_slot(pulse, point::DEPS));
        // SAFETY: the peer's slot holds send_size elements.
        unsafe { each_forwarded(pulses, pulse, meta, x, dep_offset, step, timeout_ns, status, |i, v| ll::store(dest, i, v, flag)) };
        tl.mark0(pulse_slot(pulse, point::DELIVERED));
        return;
    }

    // The put path: pack into this step's staging slot, the last block puts it.
    let dest = (meta.x_stage + parity * meta.slot_bytes as u64) as *mut T;
    let first_mode = if pulse == 0 { PackMode::All } else { PackMode::BelowThreshold };
    // SAFETY: buffers from the validated plan.
    let deferred = unsafe { pack_subset(x, map, meta.send_size, dest, shift, first_mode, dep_offset) };
    // Blocks holding forwarded atoms take them as they arrive (a block-uniform vote, so the
    // barriers inside are uniform too).
    // SAFETY: every thread of the block reaches this barrier.
    let any_deferred = unsafe { device::sync_threads_or(deferred > 0) };
    tl.mark0(pulse_slot(pulse, point::PACKED));
    if any_deferred {
        // SAFETY: all threads of the block.
        unsafe { await_signalled_earlier(pulses, pulse, num_pulses, signals, step, timeout_ns, status) };
        tl.mark0(pulse_slot(pulse, point::DEPS));
        // SAFETY: the staging slot holds send_size elements.
        unsafe { each_forwarded(pulses, pulse, meta, x, dep_offset, step, timeout_ns, status, |i, v| *dest.add(i as usize) = v) };
    }
    // SAFETY: all threads of the block call it.
    if unsafe { arrive_is_last_block(counters.add(pulse as usize)) } {
        tl.mark0(pulse_slot(pulse, point::ELECTED));
        // A wait timed out, of this launch (the arrivals ordered every block's waits before this:
        // the staged values may be stale or missing) or of an earlier one the host has not reset
        // (the waits that ordered this put after the peer's reads of the last step are gone): no
        // put and no signal, for every pulse, pulse 0 included, and the peer times out too.
        // Thread 0 decides for the block (the put is collective).
        // SAFETY: every thread of the last block reaches the barrier; `status` valid.
        if unsafe { device::sync_threads_or(thread::thread_idx_x() == 0 && timed_out(status)) } {
            return;
        }
        let own_slot = unsafe { signals.add(signal_index(SignalSlot::CoordData, pulse, num_pulses)) };
        // SAFETY: all threads of the last block; plan pointers validated by the host.
        unsafe {
            deliver(
                meta.remote_x_signal as *mut u64,
                false,
                x.add(meta.peer_atom_offset as usize),
                dest,
                meta.send_size,
                own_slot,
                step.epoch,
                meta.send_pe,
                SignalMode::from_u32(meta.signal_mode),
            )
        };
        tl.mark0(pulse_slot(pulse, point::DELIVERED));
    }
}

/// Pass 2 of a pulse after the first: for every map entry `i` of this thread that forwards an atom
/// received in an earlier pulse (index at or above `dep_offset`), `put(i, value)` with the value
/// taken as it arrives ([`ll::received`]) and the pulse's shift added; nothing for an atom that did
/// not arrive in time (a timeout, reported in `status`), so no zero or stale value goes on as the
/// step's. One wait per thread: all its atoms against one deadline. Puts and bulk copies among the
/// earlier pulses must have been awaited ([`await_signalled_earlier`]).
///
/// # Safety
/// As [`fused_coords`]; `put` may write entry `i` of the pulse's destination.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn each_forwarded<T: HaloElement>(
    pulses: *const PulseMeta,
    pulse: u32,
    meta: &PulseMeta,
    x: *const T,
    dep_offset: u32,
    step: Step,
    timeout_ns: u64,
    status: *mut WaitStatus,
    mut put: impl FnMut(u32, T),
) {
    let (map, shift) = (meta.index_map as *const u32, shift_of(meta));
    let mut clock = WaitClock::new();
    let mut i = thread::index_1d();
    while i < meta.send_size {
        // SAFETY: i < send_size; a forwarded atom was received in an earlier pulse.
        unsafe {
            let atom = *map.add(i as usize);
            if atom >= dep_offset
                && let Some(v) = ll::received(pulses, pulse, atom, x, step, &mut clock, timeout_ns, status)
            {
                put(i, shifted(v, shift));
            }
        }
        i += thread::grid_stride_x();
    }
}

/// Takes in this rank's own incoming pulse `pulse`: polls and unpacks its low-latency words into
/// `x` (each block of the row its share, each thread its elements against one deadline; an element
/// that did not come in time is left as it was, the host discards the step), or waits (block 0,
/// thread 0) for the signal behind a put or a bulk copy.
///
/// # Safety
/// All threads of the block; as [`fused_coords`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn receive_pulse<T: HaloElement, L: Timeline>(
    pulse: u32,
    num_pulses: u32,
    meta: &PulseMeta,
    step: Step,
    x: *mut T,
    signals: *mut u64,
    timeout_ns: u64,
    status: *mut WaitStatus,
    tl: L,
) {
    let site = WaitSite { pulse, kind: WaitKind::CoordSignal, peer: meta.recv_pe };
    if ll::arrives_as_words(meta) {
        let src = ll::slot(meta.x_recv_slots, step.parity(), meta.recv_slot_bytes);
        let dst = meta.atom_offset as usize;
        let mut clock = WaitClock::new();
        let mut i = thread::index_1d();
        while i < meta.recv_size {
            // SAFETY: the own receive slot holds recv_size elements; the pulse's range lies in `x`.
            unsafe {
                if let Some(v) = ll::load(src, i, step.epoch, &mut clock, timeout_ns, status, site) {
                    *x.add(dst + i as usize) = v;
                }
            }
            i += thread::grid_stride_x();
        }
        tl.mark0(pulse_slot(pulse, point::RECEIVED));
    } else if thread::block_idx_x() == 0 && thread::thread_idx_x() == 0 {
        // SAFETY: own receive-X slot of this pulse.
        unsafe { wait_signal(signals.add(signal_index(SignalSlot::CoordData, pulse, num_pulses)), step.epoch, timeout_ns, status, site) };
        tl.mark(pulse_slot(pulse, point::RECEIVED));
    }
}
