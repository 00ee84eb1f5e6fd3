//! All force pulses in one launch (GROMACS's `fusedUnPackFRecvBufNvshmemKernel`, rewritten): the
//! reverse chain of the coordinate halo, with forces pushed to their owner.
//!
//! For pulse `p`, this rank holds forces on the halo atoms it received in `p` (at `atom_offset`,
//! `recv_size` of them) and owes them to `recv_pe`; it is owed forces on the atoms it sent in `p`
//! (`send_size`, through `index_map`) by `send_pe`. Halo atoms of pulse `p` may have been
//! forwarded in a later pulse, whose forces are added to them here, so pulse `p`'s forces may
//! leave only after every later pulse has been accumulated. The blocks of row `p` of the grid:
//!
//! 1. wait until every later pulse is accumulated (none for the last pulse), then push the halo
//!    forces of `p` into `recv_pe`'s receive slot for this step: as low-latency words
//!    ([`crate::abi::ll`]) when `recv_pe` is mapped, each thread its share, with no election and
//!    no signal; or staged locally, and the last block puts them with NVSHMEM and signals;
//! 2. take `send_pe`'s push from the local receive slot and accumulate it into `f` through the map
//!    (local reads only: nothing is fetched over NVLink): words are polled element by element as
//!    they arrive ([`pulse_flags::RECV_F_LL`]); a put is awaited on its signal first;
//! 3. rows after the first count themselves done (the chain: earlier pulses wait for that).
//!
//! Every block arrives on the launch-wide counter once it has pushed; the last advances the force
//! step counter. The force credits of the previous launch go out first thing
//! ([`send_previous_credit`]). Pulse 0's row resets the done counters once it is past its wait,
//! so the grid may change between launches.

use super::common::{
    DeviceElement, Step, WaitClock, WaitSite, arrive_is_last_block, arrive_launch, copy_words, put_and_signal, send_previous_credit, timed_out,
    wait_local_counter, wait_signal, wait_signal_on,
};
use super::ll;
use super::timeline::Timeline;
use crate::abi::timeline::{self as tl_layout, forces as point, pulse_slot};
use crate::abi::{Direction, ProtocolState, PulseMeta, SignalMode, SignalSlot, WaitKind, WaitStatus, pulse_flags, signal_index};
use crate::device::{self, thread};

/// `signals` are this rank's slots ([`SignalSlot`] order), `state` its protocol state (the step
/// counter is read there). `counters[n..2n]` count push arrivals per pulse (zero at launch start,
/// wrapping back to 0 by themselves); `counters[2n..3n]` count blocks done per pulse (zero at
/// launch start, reset by pulse 0's row). `tl` stamps the timeline probe's points
/// ([`super::timeline`]; the exchange's kernel passes `Off`, which stamps nothing).
///
/// # Safety
/// Metadata from a validated plan (direct: peers mapped; put: NVSHMEM, symmetric buffers).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn fused_forces<T: DeviceElement, L: Timeline>(
    pulses: *const PulseMeta,
    num_pulses: u32,
    f: *mut T,
    signals: *mut u64,
    state: *mut ProtocolState,
    counters: *mut u32,
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
        return; // uniform per block
    }
    // SAFETY: `num_pulses` valid entries; this rank's state.
    let (meta, step) = unsafe { (&*pulses.add(pulse as usize), Step::read(state, Direction::Forces)) };
    let tl = tl.entered(step.epoch, entered);
    let tid0 = thread::thread_idx_x() == 0;
    // Whether an earlier launch's wait timed out (see the push below), loaded beside the state.
    // SAFETY: `status` valid.
    let stale = tid0 && unsafe { timed_out(status) };
    // SAFETY: the pulse's peer as installed; this rank's slots.
    unsafe { send_previous_credit(meta, pulse, num_pulses, signals, step, Direction::Forces, true) };
    let n = num_pulses as usize;
    // SAFETY: `counters` holds `3 * num_pulses` counters on this device.
    let (push_counters, done) = unsafe { (counters.add(n), counters.add(2 * n)) };
    let (parity, flag) = (step.parity(), ll::flag_of(step));
    let words = meta.remote_recv_slots != 0;

    // 1. Push: once every later pulse is accumulated (and, in a force-only loop where the pulse
    //    needs it, once recv_pe has accumulated the push that last used the slot: the previous
    //    one for a put into the pair's slot, the one before for words, which alternate slots),
    //    copy the halo forces out.
    //    A block of a later pulse whose receive timed out does not count itself done (step 3), so
    //    the wait for that pulse fails too (at once: the timeout flag is set), and then this
    //    pulse's halo forces, which miss its contributions, go nowhere: recv_pe's wait times out
    //    and reports too instead of taking them as the step's. The same when a wait of an earlier
    //    launch timed out (a coordinate halo this step's forces were computed from, say): thread
    //    0 looked at the flag as the launch started (`stale`, [`timed_out`]), beside its other
    //    loads, and the barrier tells the block.
    let mut waited = true;
    if tid0 {
        // One wait (the credit, then every later pulse): one deadline.
        let mut clock = WaitClock::new();
        if step.repeat && meta.has(pulse_flags::WAIT_FORCE_CREDIT) {
            let site = WaitSite { pulse, kind: WaitKind::ForceCredit, peer: meta.recv_pe };
            let lag = if words { 2 } else { 1 };
            // SAFETY: own credit slot of this pulse.
            waited &= unsafe {
                wait_signal_on(
                    &mut clock,
                    signals.add(signal_index(SignalSlot::ForceCredit, pulse, num_pulses)),
                    step.epoch.saturating_sub(lag),
                    timeout_ns,
                    status,
                    site,
                )
            };
        }
        for later in pulse + 1..num_pulses {
            // SAFETY: done counters on this device.
            waited &= unsafe { wait_local_counter(&mut clock, done.add(later as usize), thread::grid_dim_x(), timeout_ns, status, later) };
        }
    }
    // SAFETY: every thread reaches it; orders thread 0's acquires before the block's reads of f.
    let failed = unsafe { device::sync_threads_or(!waited || stale) };
    tl.mark0(pulse_slot(pulse, point::CHAIN));
    // Pulse 0's row waited for every other row: once all its blocks are past that wait, no block
    // reads a done counter any more, and the last of them resets them for the next launch (which
    // reads them after the kernel boundary; the grid may change in between). Its own counter
    // wraps to 0 by itself. A single pulse uses none.
    if pulse == 0 && num_pulses > 1 && tid0 {
        // SAFETY: done counters on this device; every wait on them happened before this arrival
        // (rows p >= 1 waited on later rows before they pushed and counted themselves done).
        unsafe {
            let limit = thread::grid_dim_x() - 1;
            if device::atomic_inc_acq_rel_gpu(done, limit) == limit {
                for q in 1..n {
                    *done.add(q) = 0;
                }
            }
        }
    }
    let halo = meta.atom_offset as usize;
    if words {
        let dest = ll::slot(meta.remote_recv_slots, parity, meta.recv_slot_bytes);
        let mut i = thread::index_1d();
        while i < meta.recv_size && !failed {
            // SAFETY: the halo range lies in f; the peer's slot holds recv_size elements.
            unsafe { ll::store(dest, i, *f.add(halo + i as usize), flag) };
            i += thread::grid_stride_x();
        }
        // Words need no signal: the push is delivered once stored.
        tl.mark0(pulse_slot(pulse, point::PUSHED));
        tl.mark0(pulse_slot(pulse, point::SIGNALLED));
    } else {
        let bytes = meta.recv_size * size_of::<T>() as u32;
        let stage = meta.f_stage + parity * meta.slot_bytes as u64;
        // SAFETY: the halo range lies in f; the staging slot holds a pulse; both 16-byte aligned
        // (checked by the host).
        unsafe { copy_words(stage as *mut u8, f.add(halo) as *const u8, bytes, thread::index_1d(), thread::grid_stride_x()) };
        // SAFETY: all threads of the block.
        if unsafe { arrive_is_last_block(push_counters.add(pulse as usize)) } {
            tl.mark0(pulse_slot(pulse, point::PUSHED));
            tl.keep0(pulse_slot(pulse, point::ELECTED_ENTRY), entered);
            // Nothing goes out when a block of the row saw its waits fail: a later pulse or the
            // credit timed out (every block's wait was ordered before this by the arrivals, and
            // its failure set the timeout flag; thread 0 decides for the collective put).
            // SAFETY: every thread of the last block reaches the barrier; `status` valid.
            if !unsafe { device::sync_threads_or(tid0 && timed_out(status)) } {
                // SAFETY: all threads of the last block; receive slots and signals are symmetric.
                unsafe {
                    let slot = signals.add(signal_index(SignalSlot::ForceData, pulse, num_pulses));
                    put_and_signal(
                        ll::slot(meta.recv_slots, parity, meta.recv_slot_bytes) as *mut u8,
                        stage as *const u8,
                        bytes as usize,
                        slot,
                        step.epoch,
                        meta.recv_pe,
                        SignalMode::from_u32(meta.signal_mode),
                    )
                };
            }
            tl.mark0(pulse_slot(pulse, point::SIGNALLED));
        }
    }

    // Pushed: every block arrives (the last records the launch) while the push travels.
    // SAFETY: every thread of every block (`num_pulses` rows of `gridDim.x`) arrives once.
    unsafe { arrive_launch(state, step, Direction::Forces, thread::grid_dim_x() * num_pulses) };

    // 2. Receive: accumulate send_pe's push from the local slot into f.
    // Locals: the atomics below may alias anything, so fields read through `meta` would be reloaded.
    let (map, count) = (meta.index_map as *const u32, meta.send_size);
    let src = ll::slot(meta.recv_slots, parity, meta.recv_slot_bytes);
    let site = WaitSite { pulse, kind: WaitKind::ForceSignal, peer: meta.send_pe };
    let mut received = true;
    if meta.has(pulse_flags::RECV_F_LL) {
        // One wait per thread: all its elements against one deadline. An element that did not
        // come in time (a timeout, reported) adds nothing; the host discards the step, and the
        // block does not count itself done (step 3), so the pulses it feeds push nothing.
        let mut clock = WaitClock::new();
        let mut i = thread::index_1d();
        while i < count {
            // SAFETY: the local slot holds `count` elements as words; map targets are in range of f.
            unsafe {
                match ll::load(src, i, step.epoch, &mut clock, timeout_ns, status, site) {
                    Some(v) => T::atomic_accumulate(f.add(*map.add(i as usize) as usize), v),
                    None => received = false,
                }
            }
            i += thread::grid_stride_x();
        }
        tl.mark0(pulse_slot(pulse, point::RECEIVED));
    } else {
        if tid0 {
            // SAFETY: own receive-F slot.
            received =
                unsafe { wait_signal(signals.add(signal_index(SignalSlot::ForceData, pulse, num_pulses)), step.epoch, timeout_ns, status, site) };
            tl.mark(pulse_slot(pulse, point::RECEIVED));
        }
        // SAFETY: every thread reaches it (block-uniform branch); orders thread 0's acquire before the reads below.
        unsafe { device::sync_threads() };
        let src = src as *const T;
        let mut i = thread::index_1d();
        while i < count {
            // SAFETY: src[0..count] is the local slot, map targets are in range of f.
            unsafe { T::atomic_accumulate(f.add(*map.add(i as usize) as usize), *src.add(i as usize)) };
            i += thread::grid_stride_x();
        }
    }

    // 3. Done: rows after the first count themselves, so that earlier pulses may push (the
    //    reverse chain); the block's atomics come before thread 0's release. A block in which
    //    a wait timed out does not: its forces are incomplete, and the earlier pulses' wait for
    //    it fails (the timeout flag is set) instead of pushing them on.
    // SAFETY: every thread reaches the barrier (the condition is block-uniform).
    let incomplete = unsafe { device::sync_threads_or(!received) };
    tl.mark0(pulse_slot(pulse, point::ACCUMULATED));
    if pulse > 0 && tid0 && !incomplete {
        // SAFETY: done counters on this device.
        let old = unsafe { device::atomic_add_acq_rel_gpu_u32(done.add(pulse as usize), 1) };
        if old + 1 == thread::grid_dim_x() {
            tl.mark(pulse_slot(pulse, point::ROW_DONE));
        }
    }
    tl.mark0(Some(tl_layout::END));
}
