//! The home atoms' migration on the GPU, first building block of a GPU redecomposition
//! (docs/nbnxm.md, "Search step cost"): the host's `Leaving::sort_out`
//! (`host/src/decomp/redecompose.rs`) for one rank's home atoms, as device passes.
//! `halo::decomp::GpuMigrate` drives it (for the MD step, inside `halo::decomp::GpuHome`), `tests/gpu_migrate.rs` checks it against the
//! host bit for bit.
//!
//! Each atom's position is wrapped into the box ([`super::nbnxm_grid::wrap`], the host's
//! `wrap_position` in the same `f32` operations: `div.rn`, `cvt.rmi`, `mul.rn`, `sub.rn`, `add.rn`,
//! pinned in `tests/ptx_instructions.rs`) and its owner found as the host's `CellEdges::rank_of`
//! finds it: per decomposed dimension the cell thresholds at or below the coordinate (`f32`
//! comparisons, the same thresholds), times the dimension's stride. Then a stable compaction:
//! 1. `migrate_count`, one thread per atom: the block's stayers and leavers (a ballot per warp,
//!    the warps' counts in shared memory); the lowest index of a non-finite atom (an atomic min);
//! 2. `migrate_scan`, one block: where each block's stayers and leavers start ([`scan_block_counts`]);
//! 3. `migrate_scatter`, the launch of pass 1: the same decisions again, each atom's rank among its
//!    block's atoms of its kind (warps before it, lanes before it: `popc(ballot & lanes below)`),
//!    and the atom written to its place. No atomics decide a place, so the order is the input's.

use super::nbnxm_grid::wrap;
use super::scan::scan_block_counts;
use crate::abi::{
    Float3, MIGRATE_INFO_BAD_ATOM, MIGRATE_INFO_LEAVERS, MIGRATE_INFO_STAYERS, MIGRATE_MAX_EDGES, MIGRATE_SCAN_THREADS, MIGRATE_THREADS,
    MigrateGeometry, MigrateLeaver,
};
use crate::device::{self, shared, sync_threads, thread, warp};

/// An atom kept by this rank.
const STAY: u32 = 0;
/// An atom owned by another rank now.
const LEAVE: u32 = 1;
/// A non-finite atom, or a thread past the last atom: written nowhere.
const NONE: u32 = 2;
const WARPS: u32 = MIGRATE_THREADS / 32;

/// Cells of dimension `d` at or below `v`: the thresholds `e` with `v >= e` (the host's
/// `edges.iter().filter(|&&e| x >= e).count()`).
///
/// # Safety
/// `g` valid.
#[inline(always)]
unsafe fn cells(g: *const MigrateGeometry, d: usize, v: f32) -> u32 {
    // SAFETY: `g` valid; `k` below MIGRATE_MAX_EDGES.
    unsafe {
        let n = ((*g).n_edges[d] as usize).min(MIGRATE_MAX_EDGES);
        let mut count = 0;
        for k in 0..n {
            count += (v >= (*g).edges[d][k]) as u32;
        }
        count
    }
}

/// Atom `i` wrapped, its owner and its kind ([`STAY`], [`LEAVE`] or [`NONE`]).
///
/// # Safety
/// `x` has `n` entries, `g` valid.
#[inline(always)]
unsafe fn sort_one(x: *const Float3, n: u32, g: *const MigrateGeometry, i: u32) -> (u32, Float3, u32) {
    if i >= n {
        return (NONE, Float3::default(), 0);
    }
    // SAFETY: `i < n`; `g` valid.
    unsafe {
        let p = *x.add(i as usize);
        if !(p.x.is_finite() && p.y.is_finite() && p.z.is_finite()) {
            return (NONE, Float3::default(), 0);
        }
        let b = (*g).box_size;
        let w = Float3::new(wrap(p.x, b[0]), wrap(p.y, b[1]), wrap(p.z, b[2]));
        let s = (*g).stride;
        let owner = s[0] * cells(g, 0, w.x) + s[1] * cells(g, 1, w.y) + s[2] * cells(g, 2, w.z);
        (if owner == (*g).rank { STAY } else { LEAVE }, w, owner)
    }
}

/// This thread's place among its block's atoms of its kind (the stayers before it for a stayer,
/// the leavers before it otherwise) and the block's `(stayers, leavers)`.
///
/// # Safety
/// Every thread of a block of [`MIGRATE_THREADS`] threads together (ballots, barriers), with
/// [`crate::abi::MIGRATE_SHARED_BYTES`] of dynamic shared memory.
#[inline(always)]
unsafe fn block_ranks(kind: u32) -> (u32, u32, u32) {
    let lane = warp::lane_id();
    let w = warp::warp_id();
    // SAFETY: every thread reaches the ballots and the barrier; shared indices below 2 WARPS.
    unsafe {
        let stay = warp::ballot(warp::FULL_MASK, kind == STAY);
        let leave = warp::ballot(warp::FULL_MASK, kind == LEAVE);
        let counts = shared::dynamic_shared_mem() as *mut u32;
        if lane == 0 {
            *counts.add(2 * w as usize) = stay.count_ones();
            *counts.add(2 * w as usize + 1) = leave.count_ones();
        }
        sync_threads();
        // This thread's kind: the stayers' counts at even places, the leavers' at odd ones.
        let (mine, odd) = if kind == STAY { (stay, 0) } else { (leave, 1) };
        let mut place = (mine & ((1u32 << lane) - 1)).count_ones();
        let (mut stayers, mut leavers) = (0, 0);
        for k in 0..WARPS {
            if k < w {
                place += *counts.add((2 * k + odd) as usize);
            }
            stayers += *counts.add(2 * k as usize);
            leavers += *counts.add(2 * k as usize + 1);
        }
        (place, stayers, leavers)
    }
}

/// Pass 1 (see [`crate::abi::MIGRATE_COUNT`]).
///
/// # Safety
/// As [`block_ranks`]; `x` has `n` entries, `g` valid, `block_counts` `2 gridDim.x`, `info`
/// [`crate::abi::MIGRATE_INFO_WORDS`].
#[inline(always)]
unsafe fn count(x: *const Float3, n: u32, g: *const MigrateGeometry, block_counts: *mut u32, info: *mut u32) {
    let i = thread::index_1d();
    // SAFETY: the contract; thread 0 writes its own block's two counts.
    unsafe {
        let (kind, _, _) = sort_one(x, n, g, i);
        if kind == NONE && i < n {
            device::atomic_min_relaxed_gpu_u32(info.add(MIGRATE_INFO_BAD_ATOM), i);
        }
        let (_, stayers, leavers) = block_ranks(kind);
        if thread::thread_idx_x() == 0 {
            let b = 2 * thread::block_idx_x() as usize;
            *block_counts.add(b) = stayers;
            *block_counts.add(b + 1) = leavers;
        }
    }
}

/// Pass 2 (see [`crate::abi::MIGRATE_SCAN`]): each thread a contiguous run of blocks
/// ([`scan_block_counts`]; the stayers and the leavers go to separate arrays, so both start at 0).
///
/// # Safety
/// One block of [`MIGRATE_SCAN_THREADS`] threads with [`crate::abi::MIGRATE_SCAN_SHARED_BYTES`];
/// `counts` has `2 n_blocks` entries, `info` [`crate::abi::MIGRATE_INFO_WORDS`].
#[inline(always)]
unsafe fn scan(counts: *mut u32, n_blocks: u32, info: *mut u32) {
    let tid = thread::thread_idx_x();
    // SAFETY: the contract; every thread reaches the scan.
    unsafe {
        let total = scan_block_counts::<2>(counts, n_blocks, shared::dynamic_shared_mem() as *mut u32, tid, MIGRATE_SCAN_THREADS, |_| [0; 2]);
        if tid == 0 {
            *info.add(MIGRATE_INFO_STAYERS) = total[0];
            *info.add(MIGRATE_INFO_LEAVERS) = total[1];
        }
    }
}

/// Pass 3 (see [`crate::abi::MIGRATE_SCATTER`]).
///
/// # Safety
/// As [`count`] (same launch), after pass 2 (`starts`); `v` and `ids` have `n` entries, the
/// outputs room for the stayers and the leavers, none aliasing an input.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scatter(
    x: *const Float3,
    v: *const Float3,
    ids: *const u32,
    n: u32,
    g: *const MigrateGeometry,
    starts: *const u32,
    x_out: *mut Float3,
    v_out: *mut Float3,
    ids_out: *mut u32,
    leavers: *mut MigrateLeaver,
) {
    let i = thread::index_1d();
    // SAFETY: the starts are an exclusive scan of every block's counts, so each atom's place is
    // its own and inside the outputs; `i < n` wherever an input is read.
    unsafe {
        let (kind, w, owner) = sort_one(x, n, g, i);
        let (place, _, _) = block_ranks(kind);
        let b = 2 * thread::block_idx_x() as usize;
        if kind == STAY {
            let at = (*starts.add(b) + place) as usize;
            *x_out.add(at) = w;
            *v_out.add(at) = *v.add(i as usize);
            *ids_out.add(at) = *ids.add(i as usize);
        } else if kind == LEAVE {
            let at = (*starts.add(b + 1) + place) as usize;
            // Field by field: a whole-struct store goes through a stack copy of the velocity.
            let (d, vi) = (leavers.add(at), *v.add(i as usize));
            (*d).id = *ids.add(i as usize);
            (*d).x = w;
            (*d).v = Float3::new(vi.x, vi.y, vi.z);
            (*d).owner = owner;
        }
    }
}

kernel! {
    /// The migration's first pass. See [`crate::abi::MIGRATE_COUNT`].
    fn migrate_count(x: *const Float3, n: u32, geo: *const MigrateGeometry, block_counts: *mut u32, info: *mut u32) {
        // SAFETY: forwarded; the host's contract is on `count`.
        unsafe { count(x, n, geo, block_counts, info) }
    }
}

kernel! {
    /// The migration's second pass. See [`crate::abi::MIGRATE_SCAN`].
    fn migrate_scan(block_counts: *mut u32, n_blocks: u32, info: *mut u32) {
        // SAFETY: forwarded.
        unsafe { scan(block_counts, n_blocks, info) }
    }
}

kernel! {
    /// The migration's last pass. See [`crate::abi::MIGRATE_SCATTER`].
    fn migrate_scatter(
        x: *const Float3, v: *const Float3, ids: *const u32, n: u32, geo: *const MigrateGeometry, block_starts: *const u32,
        x_out: *mut Float3, v_out: *mut Float3, ids_out: *mut u32, leavers: *mut MigrateLeaver,
    ) {
        // SAFETY: forwarded.
        unsafe { scatter(x, v, ids, n, geo, block_starts, x_out, v_out, ids_out, leavers) }
    }
}
