//! The launch order of an nbnxm list on the GPU: which entry each block of the force and prune
//! kernels runs (`order[b]`). A launch's blocks start in block order, so long entries at the end
//! of the list leave a tail of a few busy multiprocessors; the order puts the longest first. It is
//! the stable sort of the entries by length, longest first (equal lengths keep the list's order),
//! exactly the host's `entry_order` (`host/md/src/nbnxm/order.rs`): a counting sort on the key
//! [`nbnxm_order_key`] (`max_j - length`, `max_j + 1` keys), deterministic, no atomics.
//!
//! Three passes over tiles of [`NBNXM_ORDER_TILE`] entries, one thread per entry:
//! 1. `nbnxm_order_tiles`, one block per tile: the tile's entries per key;
//! 2. `nbnxm_order_scan`, one block: the exclusive scan of those counts, key by key and, within a
//!    key, tile by tile: where each tile's entries of each key start in the order;
//! 3. `nbnxm_order_write`, one block per tile: each entry's rank among its tile's entries of the
//!    same key, and `order[start + rank] = entry`.
//!
//! A rank within a tile, in entry order, without atomics: in each warp (32 consecutive entries)
//! `match.any` gives the lanes of the same key and the population count of those below a lane its
//! rank in the warp; the warp's lowest lane of each key writes the warp's count of that key to
//! shared memory, and a scan over the warps (one thread per key) turns the counts into the entries
//! of that key in the warps before. Pass 1 keeps the scan's totals, pass 3 the per-warp starts.

use super::scan::block_exclusive_scan;
use crate::abi::{NBNXM_ORDER_KEYS, NBNXM_ORDER_MAX_J, NBNXM_ORDER_SCAN_THREADS, NBNXM_ORDER_TILE, NBNXM_ORDER_WARPS, NbnxmEntry, nbnxm_order_key};
use crate::device::{shared, sync_threads, thread, warp};

/// The key of a thread without an entry (past the last of the list): no count, no place.
const NONE: u32 = u32::MAX;
const KEYS: u32 = NBNXM_ORDER_KEYS;

/// This thread's entry (`tile * NBNXM_ORDER_TILE + thread`) and its key, [`NONE`] past the last.
///
/// # Safety
/// `entries` holds `n_entries`; a block of [`NBNXM_ORDER_TILE`] threads.
#[inline(always)]
unsafe fn entry_key(entries: *const NbnxmEntry, n_entries: u32, max_j: u32) -> (u32, u32) {
    let entry = thread::block_idx_x() * NBNXM_ORDER_TILE + thread::thread_idx_x();
    if entry >= n_entries {
        return (entry, NONE);
    }
    // SAFETY: entry < n_entries.
    let e = unsafe { *entries.add(entry as usize) };
    (entry, nbnxm_order_key(e.j_end.wrapping_sub(e.j_start), max_j))
}

/// `max_j` as the passes use it: at most [`NBNXM_ORDER_MAX_J`] (the shared counts have room for
/// no more keys).
#[inline(always)]
fn bounded(max_j: u32) -> u32 {
    max_j.min(NBNXM_ORDER_MAX_J)
}

/// The tile's ranks: this thread's rank among its warp's entries of its `key` (lanes below it),
/// and, in shared memory at `[warp KEYS + k]`, the tile's entries of key `k` in the warps before
/// `warp`; thread `k <= max_j` also gets the tile's total of key `k` (the others 0).
///
/// # Safety
/// Every thread of a block of [`NBNXM_ORDER_TILE`] threads together (barriers), with
/// [`crate::abi::NBNXM_ORDER_SHARED_BYTES`] of dynamic shared memory; `key` is [`NONE`] or at
/// most `max_j <= NBNXM_ORDER_MAX_J`.
#[inline(always)]
unsafe fn tile_ranks(key: u32, max_j: u32) -> (u32, u32) {
    let tid = thread::thread_idx_x();
    let lane = warp::lane_id();
    // SAFETY: every index is below `WARPS KEYS` (warp < WARPS, key <= max_j < KEYS); the barriers,
    // which every thread reaches, order the zeroing, the warps' counts and the scan.
    unsafe {
        let counts = shared::dynamic_shared_mem() as *mut u32;
        let mut i = tid;
        while i < NBNXM_ORDER_WARPS * KEYS {
            *counts.add(i as usize) = 0;
            i += NBNXM_ORDER_TILE;
        }
        sync_threads();
        let peers = warp::match_any_u32(warp::FULL_MASK, key);
        let below = peers & ((1u32 << lane) - 1);
        if key != NONE && below == 0 {
            *counts.add((warp::warp_id() * KEYS + key) as usize) = peers.count_ones();
        }
        sync_threads();
        let mut total = 0;
        if tid <= max_j {
            for w in 0..NBNXM_ORDER_WARPS {
                let at = counts.add((w * KEYS + tid) as usize);
                let c = *at;
                *at = total;
                total += c;
            }
        }
        sync_threads();
        (below.count_ones(), total)
    }
}

/// Pass 1 (see [`crate::abi::NBNXM_ORDER_TILES`]).
///
/// # Safety
/// As [`tile_ranks`], one block per tile (`gridDim.x` tiles); `entries` holds `n_entries`,
/// `tile_counts` has `(max_j + 1) gridDim.x` entries.
#[inline(always)]
unsafe fn tiles(entries: *const NbnxmEntry, n_entries: u32, max_j: u32, tile_counts: *mut u32) {
    let max_j = bounded(max_j);
    // SAFETY: forwarded; thread k <= max_j writes key k of its tile, inside `tile_counts`.
    unsafe {
        let (_, key) = entry_key(entries, n_entries, max_j);
        let (_, total) = tile_ranks(key, max_j);
        let tid = thread::thread_idx_x();
        if tid <= max_j {
            *tile_counts.add((tid * thread::grid_dim_x() + thread::block_idx_x()) as usize) = total;
        }
    }
}

/// Pass 2 (see [`crate::abi::NBNXM_ORDER_SCAN`]): each thread a contiguous run of counts.
///
/// # Safety
/// One block of [`NBNXM_ORDER_SCAN_THREADS`] threads with
/// [`crate::abi::NBNXM_ORDER_SCAN_SHARED_BYTES`]; `counts` has `n` entries whose sum fits a `u32`.
#[inline(always)]
unsafe fn scan(counts: *mut u32, n: u32) {
    const T: u32 = NBNXM_ORDER_SCAN_THREADS;
    let tid = thread::thread_idx_x();
    let per = n.div_ceil(T);
    let c0 = (tid * per).min(n) as usize;
    let c1 = (c0 + per as usize).min(n as usize);
    // SAFETY: indices inside `counts` (counts `c0..c1` are this thread's alone, each read before it
    // is overwritten); every thread reaches the scan.
    unsafe {
        let mut run = 0u32;
        for c in c0..c1 {
            run += *counts.add(c);
        }
        let ([mut at], _) = block_exclusive_scan([run], shared::dynamic_shared_mem() as *mut u32, tid, T);
        for c in c0..c1 {
            let count = *counts.add(c);
            *counts.add(c) = at;
            at += count;
        }
    }
}

/// Pass 3 (see [`crate::abi::NBNXM_ORDER_WRITE`]).
///
/// # Safety
/// As [`tiles`], after pass 2 on the same entries and `max_j` (`tile_starts`); `order` has
/// `n_entries` entries.
#[inline(always)]
unsafe fn write(entries: *const NbnxmEntry, n_entries: u32, max_j: u32, tile_starts: *const u32, order: *mut u32) {
    let max_j = bounded(max_j);
    // SAFETY: the starts are an exclusive scan of every tile's counts, so start + warps before +
    // rank is below n_entries and each entry gets its own place; shared indices as in `tile_ranks`.
    unsafe {
        let (entry, key) = entry_key(entries, n_entries, max_j);
        let (rank, _) = tile_ranks(key, max_j);
        if key != NONE {
            let start = *tile_starts.add((key * thread::grid_dim_x() + thread::block_idx_x()) as usize);
            let before = *(shared::dynamic_shared_mem() as *const u32).add((warp::warp_id() * KEYS + key) as usize);
            *order.add((start + before + rank) as usize) = entry;
        }
    }
}

kernel! {
    /// The order's first pass. See [`crate::abi::NBNXM_ORDER_TILES`].
    fn nbnxm_order_tiles(entries: *const NbnxmEntry, n_entries: u32, max_j: u32, tile_counts: *mut u32) {
        // SAFETY: forwarded; the host's contract is on `tiles`.
        unsafe { tiles(entries, n_entries, max_j, tile_counts) }
    }
}

kernel! {
    /// The order's second pass. See [`crate::abi::NBNXM_ORDER_SCAN`].
    fn nbnxm_order_scan(tile_counts: *mut u32, n: u32) {
        // SAFETY: forwarded.
        unsafe { scan(tile_counts, n) }
    }
}

kernel! {
    /// The order's third pass. See [`crate::abi::NBNXM_ORDER_WRITE`].
    fn nbnxm_order_write(entries: *const NbnxmEntry, n_entries: u32, max_j: u32, tile_starts: *const u32, order: *mut u32) {
        // SAFETY: forwarded.
        unsafe { write(entries, n_entries, max_j, tile_starts, order) }
    }
}
