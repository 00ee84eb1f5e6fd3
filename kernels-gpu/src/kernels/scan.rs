//! The block-wide exclusive scan the one-block passes share (the cluster grid's column starts,
//! the search lists' layout): every thread brings `N` values, and gets the sums of the values of
//! the threads before it and the block's totals. Hillis–Steele in shared memory: `log2(threads)`
//! rounds, each reading the partial sum `off` threads back. Deterministic (no atomics), so the
//! passes built on it give the same result on every run.

use crate::device::sync_threads;
use core::ops::{Add, Sub};

/// Exclusive prefix sums over the block's threads of `N` values each (`exclusive[v]`: value `v`
/// of the threads `0..tid`), and the block's totals (the same for every thread). Value `v` of
/// thread `t` sits at `scratch[v threads + t]` during the call. Ends with a barrier, so the
/// caller may reuse `scratch` right after.
///
/// # Safety
/// Called by every thread of a block of `threads` threads (`blockDim.x`), in uniform control
/// flow (it has barriers); `scratch` is `N threads` elements of shared memory that nothing else
/// touches during the call. The sums must not overflow `T`.
#[inline(always)]
pub(crate) unsafe fn block_exclusive_scan<T, const N: usize>(mine: [T; N], scratch: *mut T, tid: u32, threads: u32) -> ([T; N], [T; N])
where
    T: Copy + Default + Add<Output = T> + Sub<Output = T>,
{
    let at = |v: usize, t: u32| v * threads as usize + t as usize;
    // SAFETY: every index is below `N threads`; the barriers, which every thread reaches (the
    // loop bounds are uniform), order each round's reads before its writes and after the last's.
    unsafe {
        let mut v = 0;
        while v < N {
            *scratch.add(at(v, tid)) = mine[v];
            v += 1;
        }
        sync_threads();
        let mut off = 1;
        while off < threads {
            let mut back = [T::default(); N];
            if tid >= off {
                let mut v = 0;
                while v < N {
                    back[v] = *scratch.add(at(v, tid - off));
                    v += 1;
                }
            }
            sync_threads();
            let mut v = 0;
            while v < N {
                *scratch.add(at(v, tid)) = *scratch.add(at(v, tid)) + back[v];
                v += 1;
            }
            sync_threads();
            off *= 2;
        }
        let mut exclusive = [T::default(); N];
        let mut total = [T::default(); N];
        let mut v = 0;
        while v < N {
            exclusive[v] = *scratch.add(at(v, tid)) - mine[v];
            total[v] = *scratch.add(at(v, threads - 1));
            v += 1;
        }
        sync_threads();
        (exclusive, total)
    }
}

/// Where each of `n_blocks` blocks' `K` counts start (block `b`'s count `k` at `counts[K b + k]`),
/// in place, scanned by one block of `threads` threads: each thread takes a contiguous run of
/// blocks, sums it, [`block_exclusive_scan`] gives the run's starts, and the run is written back
/// as running sums from them, plus `base(totals)[k]` for count `k` (0 when the counts' outputs
/// are separate arrays; the totals of the counts before `k` when they share one). Returns the
/// totals. The compactions' second passes (`migrate.rs`, `select.rs`) are this.
///
/// # Safety
/// As [`block_exclusive_scan`] (every thread of the block, `scratch` `K threads` words);
/// `counts` has `K n_blocks` entries, which no other block touches; the sums (with the bases)
/// must not overflow `u32`.
#[inline(always)]
pub(crate) unsafe fn scan_block_counts<const K: usize>(
    counts: *mut u32,
    n_blocks: u32,
    scratch: *mut u32,
    tid: u32,
    threads: u32,
    base: impl Fn(&[u32; K]) -> [u32; K],
) -> [u32; K] {
    let per = n_blocks.div_ceil(threads);
    let b0 = (tid * per).min(n_blocks) as usize;
    let b1 = (b0 + per as usize).min(n_blocks as usize);
    // SAFETY: blocks `b0..b1` are this thread's alone (each read before it is overwritten); every
    // thread reaches the scan. Indexed `while` loops, as in `block_exclusive_scan`: iterators over
    // the arrays would put them on the stack.
    unsafe {
        let mut run = [0u32; K];
        for b in b0..b1 {
            let mut k = 0;
            while k < K {
                run[k] += *counts.add(K * b + k);
                k += 1;
            }
        }
        let (mut start, total) = block_exclusive_scan(run, scratch, tid, threads);
        let add = base(&total);
        let mut k = 0;
        while k < K {
            start[k] += add[k];
            k += 1;
        }
        for b in b0..b1 {
            let mut k = 0;
            while k < K {
                let c = *counts.add(K * b + k);
                *counts.add(K * b + k) = start[k];
                start[k] += c;
                k += 1;
            }
        }
        total
    }
}
