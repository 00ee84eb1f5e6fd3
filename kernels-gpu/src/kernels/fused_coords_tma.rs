//! All coordinate pulses in one launch, moved with Hopper's bulk copies (`cp.async.bulk`):
//! the blog's TMA variant, direct (load/store-reachable) peers only.
//!
//! Each warp gathers a chunk of [`TMA_CHUNK_BYTES`] (1.5 KB) into registers, then into its own
//! slice of shared memory, and its leader copies the chunk to the peer in one bulk operation. A
//! chunk's independent atoms are gathered first; only if the chunk holds dependent atoms does the
//! leader wait for earlier pulses. The leader waits for a bulk copy to have read its shared slice
//! only right before the slice is written again, so the next chunk's gathers overlap the copy.
//! Warps finish on their own; the warps of a block aggregate their arrival in shared memory and
//! the block's last warp arrives once on the pulse's counter, whose last arrival signals the peer.
//!
//! `cp.async.bulk` needs 16-byte-aligned addresses and sizes in multiples of 16 bytes. Atom `i`
//! lands at `remote_x + 12 i`, so the first `head` (< 4) atoms, until that address is 16-byte
//! aligned, and the tail after the last full chunk are stored by the lanes directly. The same holds
//! for every element type.
//!
//! The per-pulse body, [`bulk_pulse`], is also what the fused kernel runs for the pulses whose
//! path is [`crate::abi::CoordPath::Bulk`], so one launch can mix bulk copies with stores and puts.

use super::common::{
    Step, WaitClock, WaitSite, coord_pulse_depends_on_waits, finish_coordinates, send_previous_credit, shift_of, shifted, timed_out, wait_signal,
    wait_signal_on,
};
use super::ll;
use crate::abi::{
    Direction, HaloElement, ProtocolState, PulseMeta, SignalSlot, TMA_CHUNK_BYTES, WaitKind, WaitStatus, pulse_flags, signal_index, tma_chunk_atoms,
};
use crate::device::{self, bulk, shared, thread, warp};

/// Elements before the first 16-byte-aligned destination: the smallest `i` with
/// `(remote + i * size_of::<T>()) % 16 == 0` (`remote` is `T`-aligned, and every supported size
/// is a multiple of 4, so one exists below 16).
#[inline(always)]
fn alignment_head<T>(remote: u64) -> u32 {
    let size = size_of::<T>() as u64;
    let mut i = 0;
    while i < 16 && (remote + i * size) % 16 != 0 {
        i += 1;
    }
    i as u32
}

/// Arguments as [`fused_coords`](super::fused_coords::fused_coords); every pulse must be direct
/// (`remote_x != 0`). Dynamic shared memory: [`crate::abi::TMA_SHARED_BYTES`] (a chunk per warp,
/// then the block's arrival counter). `counters[p]` counts blocks here (it wraps back to 0 after
/// all blocks of the pulse arrived).
///
/// # Safety
/// Metadata from a validated plan with every peer mapped; the launch's dynamic shared memory as
/// above.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn fused_coords_tma<T: HaloElement>(
    pulses: *const PulseMeta,
    num_pulses: u32,
    x: *mut T,
    signals: *mut u64,
    state: *mut ProtocolState,
    counters: *mut u32,
    dep_offset: u32,
    timeout_ns: u64,
    status: *mut WaitStatus,
) {
    let pulse = thread::block_idx_y();
    if pulse >= num_pulses {
        return;
    }
    // SAFETY: `num_pulses` valid entries; this rank's state. No pulse puts (every peer is
    // mapped), so the kernel holds no NVSHMEM call.
    unsafe {
        let (meta, step) = (&*pulses.add(pulse as usize), Step::read(state, Direction::Coordinates));
        // Also sent at the end of the launch; this one serves a peer whose last launch was fused.
        send_previous_credit(meta, pulse, num_pulses, signals, step, Direction::Coordinates, false);
        bulk_pulse::<T, false>(pulses, num_pulses, pulse, meta, step, x, signals, state, counters, dep_offset, timeout_ns, status)
    }
}

/// One coordinate pulse moved with bulk copies, by every thread of the block (the block serves
/// pulse `pulse`, `meta` its entry, `step` the launch's step read from `state`): the body of
/// [`fused_coords_tma`], and of [`fused_coords`](super::fused_coords::fused_coords) for pulses whose
/// path is [`crate::abi::CoordPath::Bulk`] (`FUSED`). In the fused kernel it sends and signals
/// only (the caller receives and arrives), and forwarded atoms of earlier pulses that came as
/// low-latency words are polled from their slots; in the TMA kernel every pulse lands in `x`
/// behind a signal, and the pulse's last block arrives (credits by stores: that kernel holds no
/// NVSHMEM call) and waits for the own incoming pulse.
///
/// # Safety
/// All threads of the block call it (block-uniform); `meta.remote_x` mapped; the launch has
/// [`crate::abi::TMA_SHARED_BYTES`] of dynamic shared memory; the other arguments as
/// [`fused_coords_tma`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn bulk_pulse<T: HaloElement, const FUSED: bool>(
    pulses: *const PulseMeta,
    num_pulses: u32,
    pulse: u32,
    meta: &PulseMeta,
    step: Step,
    x: *mut T,
    signals: *mut u64,
    state: *mut ProtocolState,
    counters: *mut u32,
    dep_offset: u32,
    timeout_ns: u64,
    status: *mut WaitStatus,
) {
    // Elements per lane and chunk as a constant, so the lane's values stay in registers.
    // SAFETY: forwarded; exactly one arm survives monomorphisation.
    unsafe {
        match size_of::<T>() {
            4 => chunked::<T, 12, FUSED>(pulses, num_pulses, pulse, meta, step, x, signals, state, counters, dep_offset, timeout_ns, status),
            8 => chunked::<T, 6, FUSED>(pulses, num_pulses, pulse, meta, step, x, signals, state, counters, dep_offset, timeout_ns, status),
            12 => chunked::<T, 4, FUSED>(pulses, num_pulses, pulse, meta, step, x, signals, state, counters, dep_offset, timeout_ns, status),
            _ => chunked::<T, 3, FUSED>(pulses, num_pulses, pulse, meta, step, x, signals, state, counters, dep_offset, timeout_ns, status),
        }
    }
}

/// Where a block's arrival count starts in a launch that began after a timeout: far past the
/// `warps_per_block - 1` its last warp must see, so the block never counts as arrived.
const STALE_ARRIVALS: u32 = u32::MAX / 2;

/// [`bulk_pulse`] for `K = TMA_CHUNK_BYTES / 32 / size_of::<T>()` elements per lane and chunk.
///
/// # Safety
/// As [`bulk_pulse`]; `K * 32 * size_of::<T>() == TMA_CHUNK_BYTES`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn chunked<T: HaloElement, const K: usize, const FUSED: bool>(
    pulses: *const PulseMeta,
    num_pulses: u32,
    pulse: u32,
    meta: &PulseMeta,
    step: Step,
    x: *mut T,
    signals: *mut u64,
    state: *mut ProtocolState,
    counters: *mut u32,
    dep_offset: u32,
    timeout_ns: u64,
    status: *mut WaitStatus,
) {
    let dest = meta.remote_x as *mut T;
    let map = meta.index_map as *const u32;
    let shift = shift_of(meta);
    let n = meta.send_size;
    let lane = warp::lane_id();
    let warps_per_block = thread::block_dim_x() / warp::WARP_SIZE;
    let warp_in_block = warp::warp_id();
    let global_warp = thread::block_idx_x() * warps_per_block + warp_in_block;
    let total_warps = thread::grid_dim_x() * warps_per_block;
    let chunk_atoms = tma_chunk_atoms(size_of::<T>() as u32);
    debug_assert!(K as u32 * warp::WARP_SIZE == chunk_atoms);

    // SAFETY: the launch gives each warp TMA_CHUNK_BYTES of shared memory and the block 16 bytes
    // after them; only this warp touches its slice (ordered by sync_warp), the counter is atomic.
    let (staging, block_arrivals) = unsafe {
        let base = shared::dynamic_shared_mem() as *mut u8;
        (base.add((warp_in_block * TMA_CHUNK_BYTES) as usize) as *mut T, base.add((warps_per_block * TMA_CHUNK_BYTES) as usize) as *mut u32)
    };
    let mut granted = true;
    if thread::thread_idx_x() == 0 {
        // A launch after a timeout ([`timed_out`]) writes nothing into the peer's `x` and signals
        // nothing: its blocks copy nothing, and each starts its arrival count past any count its
        // warps reach, so it never counts as arrived and the pulse's last arrival, which signals,
        // never happens (the host's reset, which a timeout needs anyway, zeroes the pulse counter
        // such a launch leaves behind). Looked at here, where the value dies at once, it leaves the
        // rest of the kernel's code as it was (the fused kernel's words path included).
        // SAFETY: `status` valid; this block's counter, written before the barrier below.
        unsafe {
            let stale = timed_out(status);
            *block_arrivals = if stale { STALE_ARRIVALS } else { 0 };
            granted = !stale;
        }
        if granted && step.repeat && meta.has(pulse_flags::WAIT_COORD_CREDIT) {
            let site = WaitSite { pulse, kind: WaitKind::CoordCredit, peer: meta.send_pe };
            // SAFETY: own credit slot of this pulse.
            granted = unsafe {
                wait_signal(signals.add(signal_index(SignalSlot::CoordCredit, pulse, num_pulses)), step.epoch - 1, timeout_ns, status, site)
            };
        }
    }
    // SAFETY: every thread reaches it (nothing above returns): the counter is initialised and the
    // credit acquired before any warp writes. A credit that did not come, or a timeout before this
    // launch, leaves the peer's `x` alone (it may still read it): no warp copies, and the signal is
    // withheld below.
    let refused = unsafe { device::sync_threads_or(!granted) };

    // Atoms before the first 16-byte-aligned destination address.
    let head = alignment_head::<T>(meta.remote_x).min(n);
    let full_chunks = (n - head) / chunk_atoms;
    // Work items: 0 = head, 1..=full_chunks = bulk chunks, full_chunks + 1 = tail (none when refused).
    let items = if refused { 0 } else { full_chunks + 2 };
    let mut waited = false;
    let mut clock = WaitClock::new();
    let mut copying = false;
    let mut values = [T::default(); K];
    let mut item = global_warp;
    while item < items {
        let (start, len, use_bulk) = if item == 0 {
            (0, head, false)
        } else if item <= full_chunks {
            (head + (item - 1) * chunk_atoms, chunk_atoms, true)
        } else {
            let start = head + full_chunks * chunk_atoms;
            (start, n - start, false)
        };
        // Gather the independent atoms into registers; remember the dependent ones.
        let mut dependent = 0u32;
        for j in 0..K {
            let l = j as u32 * warp::WARP_SIZE + lane;
            if l < len {
                // SAFETY: start + l < n; the map and x come from the validated plan.
                let atom = unsafe { *map.add((start + l) as usize) };
                if pulse > 0 && atom >= dep_offset {
                    dependent |= 1 << j;
                } else {
                    values[j] = shifted(unsafe { *x.add(atom as usize) }, shift);
                }
            }
        }
        // SAFETY: the loop is warp-uniform (`item` depends only on the warp), all lanes vote.
        if unsafe { warp::warp_vote_any(warp::FULL_MASK, dependent != 0) } {
            if !waited && lane == 0 {
                for earlier in 0..pulse {
                    // SAFETY: own receive-X slots.
                    let meta_e = unsafe { &*pulses.add(earlier as usize) };
                    // In the fused kernel, pulses that arrive as low-latency words are polled atom
                    // by atom below instead.
                    if FUSED && ll::arrives_as_words(meta_e) {
                        continue;
                    }
                    let site = WaitSite { pulse: earlier, kind: WaitKind::CoordSignal, peer: meta_e.recv_pe };
                    // SAFETY: own receive-X slot of pulse `earlier`; the thread's one clock (its words below use it too).
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
            waited = true;
            // SAFETY: all lanes; orders the leader's acquire before the dependent reads.
            unsafe { warp::sync_warp(warp::FULL_MASK) };
            for j in 0..K {
                if dependent & (1 << j) != 0 {
                    // SAFETY: as above; a forwarded atom was received in an earlier pulse.
                    values[j] = unsafe {
                        let atom = *map.add((start + j as u32 * warp::WARP_SIZE + lane) as usize);
                        // An atom that did not come in time (a timeout, reported) goes out as 0:
                        // the pulse's signal is then withheld (below), so the peer never takes it.
                        let v = if FUSED {
                            ll::received(pulses, pulse, atom, x, step, &mut clock, timeout_ns, status).unwrap_or_default()
                        } else {
                            *x.add(atom as usize)
                        };
                        shifted(v, shift)
                    };
                }
            }
        }
        if use_bulk {
            // The previous chunk's copy must have read the slice before it is overwritten.
            if copying && lane == 0 {
                bulk::wait_group_read_all();
            }
            // SAFETY: all lanes; no lane writes the slice before the leader's wait.
            unsafe { warp::sync_warp(warp::FULL_MASK) };
            for (j, value) in values.iter().enumerate() {
                // SAFETY: a full chunk: every lane's items are valid and inside the slice.
                unsafe { *staging.add(j * warp::WARP_SIZE as usize + lane as usize) = *value };
            }
            // Each writer hands its shared-memory stores to the async proxy, then the leader copies.
            bulk::fence_proxy_async_shared_cta();
            // SAFETY: all lanes.
            unsafe { warp::sync_warp(warp::FULL_MASK) };
            if lane == 0 {
                // SAFETY: 16-byte aligned by construction of `head`; TMA_CHUNK_BYTES bytes; the slice
                // is not rewritten before wait_group_read_all above.
                unsafe {
                    let window = shared::to_shared_window(staging as *const u8);
                    bulk::copy_shared_to_global(dest.add(start as usize) as *mut u8, window, TMA_CHUNK_BYTES);
                }
                bulk::commit_group();
            }
            copying = true;
        } else {
            for (j, value) in values.iter().enumerate() {
                let l = j as u32 * warp::WARP_SIZE + lane;
                if l < len {
                    // SAFETY: start + l < n, inside the peer's receive range.
                    unsafe { *dest.add((start + l) as usize) = *value };
                }
            }
        }
        item += total_warps;
    }

    // The lanes' direct stores are ordered before the leader; it waits for its copies to be
    // performed, then the warp arrives on the block's counter (CTA scope), and the block's last
    // warp on the pulse's counter (GPU scope): releases all the way, so the pulse's last arrival
    // sees every store of every warp.
    // SAFETY: all lanes.
    unsafe { warp::sync_warp(warp::FULL_MASK) };
    if lane == 0 {
        bulk::wait_group_all();
        // SAFETY: this block's shared counter; `counters` has `num_pulses` zeroed counters here.
        let last = unsafe {
            let old = device::atomic_add_acq_rel_cta_shared_u32(shared::to_shared_window(block_arrivals as *const u8), 1);
            let limit = thread::grid_dim_x() - 1;
            old == warps_per_block - 1 && device::atomic_inc_acq_rel_gpu(counters.add(pulse as usize), limit) == limit
        };
        if last {
            // No signal vouches for the pulse when a wait of this launch timed out (the arrivals
            // ordered every warp's waits before this): a forwarded value may be 0 or stale. The
            // peer's wait then times out and reports too. (A launch that started after a timeout
            // never gets here: see the arrival count above.)
            // SAFETY: mapped peer slot; release.sys publishes what this thread observed; `status` valid.
            unsafe {
                if !(coord_pulse_depends_on_waits(pulse, meta, step) && timed_out(status)) {
                    device::store_release_sys_u64(meta.remote_x_signal as *mut u64, step.epoch);
                }
            }
            // The fused kernel receives and arrives after this for every block; the TMA kernel's
            // pulse ends here, overlapping its arrival with the hop.
            if !FUSED {
                let site = WaitSite { pulse, kind: WaitKind::CoordSignal, peer: meta.recv_pe };
                // SAFETY: state on this device; own receive-X slot. No pulse of this kernel puts.
                unsafe {
                    finish_coordinates(pulses, num_pulses, signals, state, step, false);
                    wait_signal(signals.add(signal_index(SignalSlot::CoordData, pulse, num_pulses)), step.epoch, timeout_ns, status, site);
                }
            }
        }
    }
}
