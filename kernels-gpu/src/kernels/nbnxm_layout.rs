//! The layout of the GPU search's two lists, on the GPU: from each (i-supercluster, shift) item's
//! word counts (`nbnxm_search_count`), where its words go (`offsets`, for `nbnxm_search_write`)
//! and its entries, exactly as the host lays out its lists (`host/md/src/nbnxm/gpu_search.rs`'s
//! `layout`, `pairlist::split_entries`): items in order, each item's words split evenly into
//! entries of at most `max_j` words ([`nbnxm_entry_split`]), so nothing per item crosses to the
//! host.
//!
//! Three passes, a scan across tiles of [`NBNXM_LAYOUT_TILE`] items (deterministic: no atomics):
//! 1. `nbnxm_layout_tiles`, one block per tile: the tile's words and entries per list (`u64`);
//! 2. `nbnxm_layout_scan`, one block: the tiles' starts (an exclusive scan of their sums, each
//!    thread a contiguous run of tiles) and the totals, which the host reads back;
//! 3. `nbnxm_layout_write`, one block per tile, once the host has made room for the totals: the
//!    tile's scan again, plus its start: each item's word offsets and entries.
//!
//! Each thread takes [`NBNXM_LAYOUT_ITEMS_PER_THREAD`] consecutive items, so a tile's scan is one
//! [`block_exclusive_scan`] of the threads' sums.

use super::scan::block_exclusive_scan;
use crate::abi::{
    NBNXM_LAYOUT_ITEMS_PER_THREAD, NBNXM_LAYOUT_SUMS, NBNXM_LAYOUT_THREADS, NBNXM_LAYOUT_TILE, NbnxmEntry, NbnxmShift, nbnxm_entry_split,
};
use crate::device::{self, shared, thread};

const T: u32 = NBNXM_LAYOUT_THREADS;
const K: u32 = NBNXM_LAYOUT_ITEMS_PER_THREAD;
const S: usize = NBNXM_LAYOUT_SUMS;

/// The first of this thread's items.
#[inline(always)]
fn first_item() -> u32 {
    thread::block_idx_x() * NBNXM_LAYOUT_TILE + thread::thread_idx_x() * K
}

/// This thread's items' sums (words of list 0 and 1, entries of list 0 and 1) scanned over the
/// block: the sums of the tile's items before this thread's, and the tile's sums.
///
/// # Safety
/// Every thread of a block of [`NBNXM_LAYOUT_THREADS`] threads with
/// [`crate::abi::NBNXM_LAYOUT_SHARED_BYTES`] of dynamic shared memory; `counts` has `2 n_items`
/// entries.
#[inline(always)]
unsafe fn tile_scan(counts: *const u32, n_items: u32, max_j: u32) -> ([u64; S], [u64; S]) {
    let first = first_item();
    let mut mine = [0u64; S];
    let mut k = 0;
    while k < K {
        let item = first + k;
        if item < n_items {
            // SAFETY: `item < n_items`.
            let (w0, w1) = unsafe { (*counts.add(2 * item as usize), *counts.add(2 * item as usize + 1)) };
            mine[0] += w0 as u64;
            mine[1] += w1 as u64;
            mine[2] += nbnxm_entry_split(w0, max_j)[0] as u64;
            mine[3] += nbnxm_entry_split(w1, max_j)[0] as u64;
        }
        k += 1;
    }
    // SAFETY: the block's dynamic shared memory holds `S T` running sums; every thread gets here.
    unsafe { block_exclusive_scan(mine, shared::dynamic_shared_mem() as *mut u64, thread::thread_idx_x(), T) }
}

/// Pass 1 (see [`crate::abi::NBNXM_LAYOUT_TILES`]).
///
/// # Safety
/// As [`tile_scan`], one block per tile; `tile_sums` has `S` entries per tile.
#[inline(always)]
unsafe fn tiles(counts: *const u32, n_items: u32, max_j: u32, tile_sums: *mut u64) {
    // SAFETY: forwarded; thread 0 writes its block's tile, inside `tile_sums`.
    unsafe {
        let (_, total) = tile_scan(counts, n_items, max_j);
        if thread::thread_idx_x() == 0 {
            let tile = thread::block_idx_x() as usize;
            let mut v = 0;
            while v < S {
                *tile_sums.add(S * tile + v) = total[v];
                v += 1;
            }
        }
    }
}

/// Pass 2 (see [`crate::abi::NBNXM_LAYOUT_SCAN`]): each thread a contiguous run of tiles.
///
/// # Safety
/// One block of [`NBNXM_LAYOUT_THREADS`] threads with [`crate::abi::NBNXM_LAYOUT_SHARED_BYTES`];
/// `tile_sums` has `S n_tiles` entries (pass 1's), `totals` `S`.
#[inline(always)]
unsafe fn scan(tile_sums: *mut u64, n_tiles: u32, totals: *mut u64) {
    let tid = thread::thread_idx_x();
    let per = n_tiles.div_ceil(T);
    let t0 = (tid * per).min(n_tiles) as usize;
    let t1 = (t0 + per as usize).min(n_tiles as usize);
    // SAFETY: indices inside `tile_sums` (tiles `t0..t1` are this thread's alone, each read before
    // it is overwritten); every thread reaches the scan.
    unsafe {
        let mut run = [0u64; S];
        for t in t0..t1 {
            let mut v = 0;
            while v < S {
                run[v] += *tile_sums.add(S * t + v);
                v += 1;
            }
        }
        let (mut at, total) = block_exclusive_scan(run, shared::dynamic_shared_mem() as *mut u64, tid, T);
        for t in t0..t1 {
            let mut v = 0;
            while v < S {
                let sum = *tile_sums.add(S * t + v);
                *tile_sums.add(S * t + v) = at[v];
                at[v] += sum;
                v += 1;
            }
        }
        if tid == 0 {
            let mut v = 0;
            while v < S {
                *totals.add(v) = total[v];
                v += 1;
            }
        }
    }
}

/// One item's `count` words of one list: their first word `word` to `*offset`, and its entries
/// (evenly split, as the host splits them) to `entries[0 ..]`.
///
/// # Safety
/// `offset` is valid, `entries` has room for [`nbnxm_entry_split`]`(count, max_j)[0]` entries and
/// is 16-byte aligned; `word + count` fits a `u32`.
#[inline(always)]
unsafe fn write_item(count: u32, word: u32, max_j: u32, sci: u32, shift: u32, offset: *mut u32, entries: *mut NbnxmEntry) {
    let [n, size] = nbnxm_entry_split(count, max_j);
    // SAFETY: by the contract.
    unsafe {
        *offset = word;
        for j in 0..n {
            let start = j * size;
            let end = start + size.min(count - start);
            // One 16-byte store per entry.
            device::store_global_v4_b32(entries.add(j as usize) as *mut [u32; 4], [sci, shift, word + start, word + end]);
        }
    }
}

/// Pass 3 (see [`crate::abi::NBNXM_LAYOUT_WRITE`]).
///
/// # Safety
/// As [`tile_scan`], one block per tile, after pass 2 on the same counts (`tile_starts`), with
/// totals below `2^32`; `shifts` has `n_shifts >= 1` entries, `offsets` `2 n_items`, each entry
/// array room for its list's total entries.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn write(
    counts: *const u32,
    n_items: u32,
    max_j: u32,
    shifts: *const NbnxmShift,
    n_shifts: u32,
    tile_starts: *const u64,
    offsets: *mut u32,
    entries_local: *mut NbnxmEntry,
    entries_nonlocal: *mut NbnxmEntry,
) {
    // SAFETY: every index is inside its array by the contract (the totals bound every start, and
    // they fit a `u32`); every thread reaches the scan before any returns.
    unsafe {
        let (before, _) = tile_scan(counts, n_items, max_j);
        let tile = S * thread::block_idx_x() as usize;
        let mut at = [0u32; S];
        let mut v = 0;
        while v < S {
            at[v] = (*tile_starts.add(tile + v) + before[v]) as u32;
            v += 1;
        }
        let n_shifts = n_shifts.max(1);
        let first = first_item();
        let mut k = 0;
        while k < K && first + k < n_items {
            let item = first + k;
            let (w0, w1) = (*counts.add(2 * item as usize), *counts.add(2 * item as usize + 1));
            let (sci, shift) = (item / n_shifts, (*shifts.add((item % n_shifts) as usize)).index);
            write_item(w0, at[0], max_j, sci, shift, offsets.add(2 * item as usize), entries_local.add(at[2] as usize));
            write_item(w1, at[1], max_j, sci, shift, offsets.add(2 * item as usize + 1), entries_nonlocal.add(at[3] as usize));
            at[0] += w0;
            at[1] += w1;
            at[2] += nbnxm_entry_split(w0, max_j)[0];
            at[3] += nbnxm_entry_split(w1, max_j)[0];
            k += 1;
        }
    }
}

kernel! {
    /// The layout's first pass. See [`crate::abi::NBNXM_LAYOUT_TILES`].
    fn nbnxm_layout_tiles(counts: *const u32, n_items: u32, max_j: u32, tile_sums: *mut u64) {
        // SAFETY: forwarded; the host's contract is on `tiles`.
        unsafe { tiles(counts, n_items, max_j, tile_sums) }
    }
}

kernel! {
    /// The layout's second pass. See [`crate::abi::NBNXM_LAYOUT_SCAN`].
    fn nbnxm_layout_scan(tile_sums: *mut u64, n_tiles: u32, totals: *mut u64) {
        // SAFETY: forwarded.
        unsafe { scan(tile_sums, n_tiles, totals) }
    }
}

kernel! {
    /// The layout's third pass. See [`crate::abi::NBNXM_LAYOUT_WRITE`].
    fn nbnxm_layout_write(
        counts: *const u32, n_items: u32, max_j: u32, shifts: *const NbnxmShift, n_shifts: u32, tile_starts: *const u64, offsets: *mut u32,
        entries_local: *mut NbnxmEntry, entries_nonlocal: *mut NbnxmEntry,
    ) {
        // SAFETY: forwarded.
        unsafe { write(counts, n_items, max_j, shifts, n_shifts, tile_starts, offsets, entries_local, entries_nonlocal) }
    }
}
