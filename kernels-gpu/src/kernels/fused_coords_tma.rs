//! All coordinate pulses in one launch, moved with Hopper's bulk copies (`cp.async.bulk`):
//! the blog's TMA variant, direct (load/store-reachable) peers only.
//!
//! Each warp packs chunks of [`TMA_CHUNK_ATOMS`] atoms into its own slice of shared memory and its
//! leader copies the chunk to the peer in one bulk operation. A chunk's independent atoms are
//! packed first; only if the chunk holds dependent atoms does the leader wait for earlier pulses.
//! There is no block-wide barrier: warps finish on their own and the last warp of the pulse (by an
//! acq-rel counter) signals the peer.
//!
//! `cp.async.bulk` needs 16-byte-aligned addresses and sizes in multiples of 16 bytes. Atom `i`
//! lands at `remote_x + 12 i`, so the first `head` (< 4) atoms, until that address is 16-byte
//! aligned, and the tail after the last full chunk are stored by the lanes directly. The same holds
//! for every element type; chunks are `TMA_CHUNK_ATOMS` elements (a multiple of 16 bytes for sizes
//! 4, 8, 12 and 16).

use super::common::{WaitSite, shift_of, shifted, wait_signal};
use crate::abi::{HaloElement, PulseMeta, TMA_CHUNK_ATOMS, WaitKind, WaitStatus};
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
/// (`remote_x != 0`). Dynamic shared memory: `TMA_CHUNK_ATOMS * size_of::<T>()` bytes per warp.
/// `block_counters[p]` counts warps here (it wraps after all warps of the pulse arrived).
///
/// # Safety
/// Metadata from a validated plan with every peer mapped; the launch's dynamic shared memory as
/// above.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn fused_coords_tma<T: HaloElement>(
    pulses: *const PulseMeta, num_pulses: u32, x: *mut T, signals: *mut u64, counter: u64,
    block_counters: *mut u32, dep_offset: u32, timeout_ns: u64, status: *mut WaitStatus,
) {
    let pulse = thread::block_idx_y();
    if pulse >= num_pulses {
        return;
    }
    // SAFETY: `num_pulses` valid entries.
    let meta = unsafe { &*pulses.add(pulse as usize) };
    let dest = meta.remote_x as *mut T;
    let map = meta.index_map as *const u32;
    let shift = shift_of(meta);
    let n = meta.send_size;
    let lane = warp::lane_id();
    let warps_per_block = thread::block_dim_x() / warp::WARP_SIZE;
    let warp_in_block = warp::warp_id();
    let global_warp = thread::block_idx_x() * warps_per_block + warp_in_block;
    let total_warps = thread::grid_dim_x() * warps_per_block;

    // SAFETY: the launch gives each warp TMA_CHUNK_ATOMS atoms of shared memory; only this
    // warp touches its slice, ordered by sync_warp.
    let staging = unsafe {
        (shared::dynamic_shared_mem() as *mut T).add((warp_in_block * TMA_CHUNK_ATOMS) as usize)
    };
    // Atoms before the first 16-byte-aligned destination address.
    let head = alignment_head::<T>(meta.remote_x).min(n);
    let full_chunks = (n - head) / TMA_CHUNK_ATOMS;
    // Work items: 0 = head, 1..=full_chunks = bulk chunks, full_chunks + 1 = tail.
    let items = full_chunks + 2;
    let mut waited = false;
    let mut item = global_warp;
    while item < items {
        let (start, len, use_bulk) = if item == 0 {
            (0, head, false)
        } else if item <= full_chunks {
            (head + (item - 1) * TMA_CHUNK_ATOMS, TMA_CHUNK_ATOMS, true)
        } else {
            let start = head + full_chunks * TMA_CHUNK_ATOMS;
            (start, n - start, false)
        };
        let i = start + lane;
        let valid = lane < len;
        // SAFETY: i < n when valid; the map and x come from the validated plan.
        let atom = if valid { unsafe { *map.add(i as usize) } } else { 0 };
        let dependent = valid && pulse > 0 && atom >= dep_offset;
        let out = if use_bulk { unsafe { staging.add(lane as usize) } } else { unsafe { dest.add(i as usize) } };
        if valid && !dependent {
            // SAFETY: `out` is this lane's staging slot or destination atom.
            unsafe { *out = shifted(*x.add(atom as usize), shift) };
        }
        // SAFETY: the loop is warp-uniform (`item` depends only on the warp), all lanes vote.
        if unsafe { warp::warp_vote_any(warp::FULL_MASK, dependent) } {
            if !waited && lane == 0 {
                for earlier in 0..pulse {
                    // SAFETY: own receive-X slots.
                    let meta_e = unsafe { &*pulses.add(earlier as usize) };
                    let site = WaitSite { pulse: earlier, kind: WaitKind::CoordSignal, peer: meta_e.recv_pe };
                    unsafe { wait_signal(signals.add(earlier as usize), counter, timeout_ns, status, site) };
                }
            }
            waited = true;
            // SAFETY: all lanes; orders the leader's acquire before the dependent reads.
            unsafe { warp::sync_warp(warp::FULL_MASK) };
            if dependent {
                // SAFETY: as above.
                unsafe { *out = shifted(*x.add(atom as usize), shift) };
            }
        }
        if use_bulk {
            // Each writer hands its shared-memory stores to the async proxy, then the leader copies.
            bulk::fence_proxy_async_shared_cta();
            // SAFETY: all lanes.
            unsafe { warp::sync_warp(warp::FULL_MASK) };
            if lane == 0 {
                // SAFETY: 16-byte aligned by construction of `head`; a multiple of 16 bytes; the slice is
                // not rewritten before wait_group_read_all below.
                unsafe {
                    let window = shared::to_shared_window(staging as *const u8);
                    bulk::copy_shared_to_global(dest.add(start as usize) as *mut u8, window, TMA_CHUNK_ATOMS * size_of::<T>() as u32);
                }
                bulk::commit_group();
                bulk::wait_group_read_all();
            }
            // SAFETY: all lanes; no lane rewrites the slice before the source was read.
            unsafe { warp::sync_warp(warp::FULL_MASK) };
        }
        item += total_warps;
    }

    // The lanes' direct stores are ordered before the leader; it waits for its copies to
    // complete, then the warp arrives on the pulse counter.
    // SAFETY: all lanes.
    unsafe { warp::sync_warp(warp::FULL_MASK) };
    let mut last = false;
    if lane == 0 {
        bulk::wait_group_all();
        let limit = total_warps - 1;
        // SAFETY: `block_counters` has `num_pulses` zeroed counters on this device.
        last = unsafe { device::atomic_inc_acq_rel_gpu(block_counters.add(pulse as usize), limit) } == limit;
    }
    if last {
        // SAFETY: mapped peer slot; release.sys publishes what this warp observed via acq_rel.
        unsafe { device::store_release_sys_u64(meta.remote_x_signal as *mut u64, counter) };
        let site = WaitSite { pulse, kind: WaitKind::CoordSignal, peer: meta.recv_pe };
        // SAFETY: own receive-X slot.
        unsafe { wait_signal(signals.add(pulse as usize), counter, timeout_ns, status, site) };
    }
}
