//! The home atoms' first-pulse selection on the GPU, a building block of a GPU redecomposition
//! (docs/nbnxm.md, "Search step cost"): for each decomposed dimension, which of a rank's home
//! atoms pulse 0 along it sends, as the host's `select_for_pulse_into`
//! (`host/src/decomp/plan.rs`) decides for atoms that crossed nothing.
//! `halo::decomp::GpuSelect` drives it (for the MD step, inside `halo::decomp::GpuHome`), `tests/gpu_select.rs` checks it against the host
//! bit for bit.
//!
//! The test is the host's `sent` over `excess2`, operation for operation in `f64`: per decomposed
//! dimension `e` (ascending), `v = f64(w)` (exact), `x = max(max(lo - v, v - hi), 0)` with the
//! host's `max_or_second` (`if a > b { a } else { b }`), the term `x * x` (`mul.rn.f64`), the
//! terms added from `0.0` in order (`add.rn.f64`), and the atom sent when the sum is below `rc2`.
//! Plain Rust arithmetic, which the NVPTX backend emits unfused and ptxas never contracts (no
//! `fma`). What the backend makes of it, pinned in `tests/ptx_instructions.rs`, is the host's
//! result for every input: the larger difference is an ordered comparison and a select, as on the
//! host (NaN included); the larger of that and 0 is `max.f64` with 0, which gives what
//! `max_or_second(x, 0.0)` gives (0 for a NaN `x` too) but for the sign of a zero, which the
//! square erases; and the first term is not added to `0.0` (a square is never `-0.0`, so the sum
//! is the term). The host adds `0.0` to `v` for an atom that did not cross (`Frame::block`): that
//! too changes only the sign of a zero `v`, which the squared excess cannot see, so it is left
//! out. The positions are the wrapped home atoms' (finite), and the bounds and `rc2` finite.
//!
//! A stable compaction per slot (one slot per decomposed dimension), as `migrate.rs` does it:
//! 1. `select_count`, one thread per atom: the block's selected atoms per slot (a ballot per warp
//!    and slot, the warps' counts in shared memory);
//! 2. `select_scan`, one block: where each block's atoms of each slot start
//!    ([`scan_block_counts`]), the slots one after another in one output array;
//! 3. `select_scatter`, the launch of pass 1: the same decisions again, each atom's rank among its
//!    block's atoms of the slot (warps before it, lanes before it: `popc(ballot & lanes below)`),
//!    its index, id and position written to its place. No atomics decide a place, so each slot's
//!    indices ascend.

use super::scan::scan_block_counts;
use crate::abi::{Float3, SELECT_SCAN_THREADS, SELECT_SLOTS, SELECT_THREADS, SelectGeometry, SelectedAtom};
use crate::device::{shared, sync_threads, thread, warp};

const WARPS: u32 = SELECT_THREADS / 32;

/// Coordinate `k` of `p` (0 = x, 1 = y, else z), without indexing a copy on the stack.
#[inline(always)]
fn coord(p: Float3, k: u32) -> f32 {
    match k {
        0 => p.x,
        1 => p.y,
        _ => p.z,
    }
}

/// The host's `max_or_second`: `a` when `a > b`, else `b`.
#[inline(always)]
fn max_or_second(a: f64, b: f64) -> f64 {
    if a > b { a } else { b }
}

/// The host's `excess2`: the squared excess of `v` over `lo..hi` (0 inside).
#[inline(always)]
fn excess2(v: f64, lo: f64, hi: f64) -> f64 {
    let excess = max_or_second(max_or_second(lo - v, v - hi), 0.0);
    excess * excess
}

/// The slots that select atom `i` (bit `s`: slot `s`); none for a thread past the last atom.
///
/// # Safety
/// `x` has `n` entries, `g` valid.
#[inline(always)]
unsafe fn selected(x: *const Float3, n: u32, g: *const SelectGeometry, i: u32) -> u32 {
    if i >= n {
        return 0;
    }
    // SAFETY: `i < n`; `g` valid; the slot and dimension indices are below 3.
    unsafe {
        let p = *x.add(i as usize);
        let dims = (*g).n_dims.min(SELECT_SLOTS as u32);
        let mut v = [0.0f64; SELECT_SLOTS];
        for (e, v) in v.iter_mut().enumerate() {
            *v = f64::from(coord(p, (*g).dims[e]));
        }
        let mut bits = 0;
        for s in 0..SELECT_SLOTS {
            if (s as u32) < dims {
                // The host's `sent`: the terms summed from 0 in the order of the dimensions.
                let mut dist2 = 0.0;
                for (e, &v) in v.iter().enumerate() {
                    if (e as u32) < dims {
                        dist2 += excess2(v, (*g).lo[s][e], (*g).hi[s][e]);
                    }
                }
                bits |= u32::from(dist2 < (*g).rc2) << s;
            }
        }
        bits
    }
}

/// This thread's place among its block's atoms of each slot (counting those before it) and the
/// block's count per slot.
///
/// # Safety
/// Every thread of a block of [`SELECT_THREADS`] threads together (ballots, barriers), with
/// [`crate::abi::SELECT_SHARED_BYTES`] of dynamic shared memory.
#[inline(always)]
unsafe fn block_ranks(bits: u32) -> ([u32; SELECT_SLOTS], [u32; SELECT_SLOTS]) {
    let lane = warp::lane_id();
    let w = warp::warp_id();
    const S: usize = SELECT_SLOTS;
    // SAFETY: every thread reaches the ballots and the barrier; shared indices below S WARPS.
    unsafe {
        let counts = shared::dynamic_shared_mem() as *mut u32;
        let mut ballots = [0u32; S];
        for (s, b) in ballots.iter_mut().enumerate() {
            *b = warp::ballot(warp::FULL_MASK, (bits >> s) & 1 != 0);
            if lane == 0 {
                *counts.add(S * w as usize + s) = b.count_ones();
            }
        }
        sync_threads();
        let below = (1u32 << lane) - 1;
        let mut place = ballots.map(|b| (b & below).count_ones());
        let mut total = [0u32; S];
        for k in 0..WARPS as usize {
            for s in 0..S {
                let c = *counts.add(S * k + s);
                if (k as u32) < w {
                    place[s] += c;
                }
                total[s] += c;
            }
        }
        (place, total)
    }
}

/// Pass 1 (see [`crate::abi::SELECT_COUNT`]).
///
/// # Safety
/// As [`block_ranks`]; `x` has `n` entries, `g` valid, `block_counts` `SELECT_SLOTS gridDim.x`.
#[inline(always)]
unsafe fn count(x: *const Float3, n: u32, g: *const SelectGeometry, block_counts: *mut u32) {
    let i = thread::index_1d();
    // SAFETY: the contract; thread 0 writes its own block's counts.
    unsafe {
        let (_, total) = block_ranks(selected(x, n, g, i));
        if thread::thread_idx_x() == 0 {
            let b = SELECT_SLOTS * thread::block_idx_x() as usize;
            for (s, &t) in total.iter().enumerate() {
                *block_counts.add(b + s) = t;
            }
        }
    }
}

/// Pass 2 (see [`crate::abi::SELECT_SCAN`]): the slots one after another in the outputs.
///
/// # Safety
/// One block of [`SELECT_SCAN_THREADS`] threads with [`crate::abi::SELECT_SCAN_SHARED_BYTES`];
/// `counts` has `SELECT_SLOTS n_blocks` entries, `info` [`crate::abi::SELECT_INFO_WORDS`].
#[inline(always)]
unsafe fn scan(counts: *mut u32, n_blocks: u32, info: *mut u32) {
    let tid = thread::thread_idx_x();
    // Slot `s` starts after the atoms of the slots below it.
    let after_lower = |t: &[u32; SELECT_SLOTS]| {
        let mut base = [0u32; SELECT_SLOTS];
        for s in 1..SELECT_SLOTS {
            base[s] = base[s - 1] + t[s - 1];
        }
        base
    };
    // SAFETY: the contract; every thread reaches the scan.
    unsafe {
        let scratch = shared::dynamic_shared_mem() as *mut u32;
        let total = scan_block_counts::<SELECT_SLOTS>(counts, n_blocks, scratch, tid, SELECT_SCAN_THREADS, after_lower);
        if tid == 0 {
            for (s, &t) in total.iter().enumerate() {
                *info.add(s) = t;
            }
        }
    }
}

/// Pass 3 (see [`crate::abi::SELECT_SCATTER`]).
///
/// # Safety
/// As [`count`] (same launch), after pass 2 (`starts`); `ids` has `n` entries, `map` and `atoms`
/// room for every slot's selected atoms, neither aliasing an input.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scatter(x: *const Float3, ids: *const u32, n: u32, g: *const SelectGeometry, starts: *const u32, map: *mut u32, atoms: *mut SelectedAtom) {
    let i = thread::index_1d();
    // SAFETY: the starts are an exclusive scan of every block's counts, the slots one after
    // another, so each atom's place in a slot is its own and inside the outputs; `i < n` wherever
    // an input is read (a thread past the last atom selects nothing).
    unsafe {
        let bits = selected(x, n, g, i);
        let (place, _) = block_ranks(bits);
        if bits == 0 {
            return;
        }
        let (p, id) = (*x.add(i as usize), *ids.add(i as usize));
        let b = SELECT_SLOTS * thread::block_idx_x() as usize;
        for (s, &place) in place.iter().enumerate() {
            if (bits >> s) & 1 != 0 {
                let at = (*starts.add(b + s) + place) as usize;
                *map.add(at) = i;
                // Field by field: a whole-struct store goes through a stack copy.
                let d = atoms.add(at);
                (*d).id = id;
                (*d).x = Float3::new(p.x, p.y, p.z);
            }
        }
    }
}

kernel! {
    /// The selection's first pass. See [`crate::abi::SELECT_COUNT`].
    fn select_count(x: *const Float3, n: u32, geo: *const SelectGeometry, block_counts: *mut u32) {
        // SAFETY: forwarded; the host's contract is on `count`.
        unsafe { count(x, n, geo, block_counts) }
    }
}

kernel! {
    /// The selection's second pass. See [`crate::abi::SELECT_SCAN`].
    fn select_scan(block_counts: *mut u32, n_blocks: u32, info: *mut u32) {
        // SAFETY: forwarded.
        unsafe { scan(block_counts, n_blocks, info) }
    }
}

kernel! {
    /// The selection's last pass. See [`crate::abi::SELECT_SCATTER`].
    fn select_scatter(
        x: *const Float3, ids: *const u32, n: u32, geo: *const SelectGeometry, block_starts: *const u32, map: *mut u32,
        atoms: *mut SelectedAtom,
    ) {
        // SAFETY: forwarded.
        unsafe { scatter(x, ids, n, geo, block_starts, map, atoms) }
    }
}
