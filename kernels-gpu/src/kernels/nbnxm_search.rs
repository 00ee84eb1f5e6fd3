//! The cluster-pair search on the GPU: the host's search (`host/md/src/nbnxm/pairlist.rs`) with
//! one warp per (i-supercluster, shift) item instead of one host thread per block of
//! superclusters. Same rule, same `f32` arithmetic in the same order (plain `mul.rn`/`add.rn`,
//! which ptxas never contracts, `div.rn` for the column index), same order of the words, so the
//! GPU lists equal the host lists word for word.
//!
//! Two passes over the same items: `nbnxm_search_count` counts each item's words per list (the
//! layout turns the counts into offsets and entries), `nbnxm_search_write` writes them there. The
//! host launches them over an upper bound `n_super` of the grid's superclusters (it does not wait
//! for a GPU build to read its count back); each warp reads the grid's count from the device's
//! `info` word and an item beyond it counts nothing (its counts are 0) and writes nothing.
//!
//! Per item (uniform across the warp): for every zone whose clusters may pair with the
//! i-supercluster's zone (no common zone bit) and that has superclusters at or after it (half
//! list), the columns within `rlist` of the shifted supercluster box, and in each column the
//! superclusters whose z range comes within `rlist` (a binary search for the first, then in
//! z order until one starts beyond). The lanes take four j-superclusters at a time, one j-cluster
//! each (lane = 8 * group + kj); a lane's word is `cj << 8 | mask` where bit `k` says i-cluster
//! `k`'s shifted box is within `rlist` of the j-cluster's box (on the supercluster itself, only
//! `k < kj`, and `k == kj` for shifts at or above the central one). A ballot compacts the words in
//! lane order, which is the host's (j-supercluster, then j-cluster) order.

use crate::abi::{
    NBNXM_CENTRAL_SHIFT, NBNXM_CLUSTERS_PER_SUPER, NBNXM_GRID_INFO_SUPERCLUSTERS, NBNXM_MASK_BITS, NBNXM_SEARCH_WARPS_PER_BLOCK, NbnxmBox,
    NbnxmShift, NbnxmZone, nbnxm_search_superclusters,
};
use crate::device::{shared, thread, warp};

const FULL: u32 = warp::FULL_MASK;
const SC: u32 = NBNXM_CLUSTERS_PER_SUPER;
/// j-superclusters a warp looks at per round (8 lanes each, one per j-cluster).
const GROUPS: u32 = 32 / SC;

/// Squared distance between the closest points of two boxes (0 when they overlap, infinite when
/// either is empty): the host's `BBox::distance2`, term for term.
#[inline(always)]
fn distance2(a: &NbnxmBox, b: &NbnxmBox) -> f32 {
    let mut s = 0.0f32;
    let mut d = 0;
    while d < 3 {
        let g = (a.lo[d] - b.hi[d]).max(b.lo[d] - a.hi[d]).max(0.0);
        s += g * g;
        d += 1;
    }
    s
}

/// `b` moved by `v`.
#[inline(always)]
fn shifted(b: &NbnxmBox, v: [f32; 3]) -> NbnxmBox {
    NbnxmBox { lo: [b.lo[0] + v[0], b.lo[1] + v[1], b.lo[2] + v[2]], hi: [b.hi[0] + v[0], b.hi[1] + v[1], b.hi[2] + v[2]] }
}

/// Column index along `d` (0 = x, 1 = y) of coordinate `v`, clamped into the grid: the host's
/// `ZoneGrid::column_index` (`floor`, then clamp; truncation equals `floor` for `c >= 1`, and
/// every `c < 1` or NaN gives 0 there as here).
#[inline(always)]
fn column_index(z: &NbnxmZone, d: usize, v: f32) -> u32 {
    let c = (v - z.extent.lo[d]) / z.cell[d];
    if c < 1.0 { 0 } else { (c as u32).min(z.columns[d] - 1) }
}

/// Mask bits `k` the half list allows when the j-cluster `kj` is in the i-supercluster itself:
/// `k < kj`, and `k == kj` for shifts at or above the central one.
#[inline(always)]
fn same_super_mask(kj: u32, shift: u32) -> u32 {
    let below = (1u32 << kj) - 1;
    if shift >= NBNXM_CENTRAL_SHIFT { below | (1 << kj) } else { below }
}

/// The search of one item by one warp; with `WRITE` the words go to `out[kind][offset[kind] ..]`,
/// else the counts to `counts[2 item + kind]`.
///
/// # Safety
/// `n_super * n_shifts` fits a `u32`; `info` has [`crate::abi::NBNXM_GRID_INFO_WORDS`] words, and
/// with `g` = [`nbnxm_search_superclusters`]`(n_super, info[NBNXM_GRID_INFO_SUPERCLUSTERS])` a
/// complete grid of `g` superclusters: `super_bbox` has `g` boxes, `cluster_bbox` `8 g`,
/// `super_zone` `g` zones, `zones` `n_zones` grids whose `column_start` ranges are inside it and
/// index superclusters below `g`, `shifts` `n_shifts` entries; `counts` (count pass) or `offsets`
/// (write pass) has `2 n_super n_shifts` entries and the lists room for every word; launched
/// with [`NBNXM_SEARCH_WARPS_PER_BLOCK`] warps per block and
/// [`crate::abi::NBNXM_SEARCH_SHARED_BYTES`] of dynamic shared memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn search<const WRITE: bool>(
    super_bbox: *const NbnxmBox,
    cluster_bbox: *const NbnxmBox,
    super_zone: *const u32,
    zones: *const NbnxmZone,
    n_zones: u32,
    column_start: *const u32,
    shifts: *const NbnxmShift,
    n_shifts: u32,
    n_super: u32,
    info: *const u32,
    rl: f32,
    rl2: f32,
    counts_or_offsets: *mut u32,
    out_local: *mut u32,
    out_nonlocal: *mut u32,
) {
    let warp_in_block = warp::warp_id();
    let item = thread::block_idx_x() * NBNXM_SEARCH_WARPS_PER_BLOCK + warp_in_block;
    if item >= n_super * n_shifts {
        return; // the whole warp: the item is warp-uniform
    }
    let lane = warp::lane_id();
    let n_shifts = n_shifts.max(1); // not 0 here (else no item passed the check): no division trap
    let (sci, s) = (item / n_shifts, item % n_shifts);
    // SAFETY: every index below is inside the arrays by the host's contract.
    unsafe {
        // Beyond the grid's own count: no word (warp-uniform, like the item).
        if sci >= nbnxm_search_superclusters(n_super, *info.add(NBNXM_GRID_INFO_SUPERCLUSTERS)) {
            if !WRITE && lane == 0 {
                *counts_or_offsets.add(2 * item as usize) = 0;
                *counts_or_offsets.add(2 * item as usize + 1) = 0;
            }
            return;
        }
        let sh = *shifts.add(s as usize);
        let zi = *super_zone.add(sci as usize);
        let bi = shifted(&*super_bbox.add(sci as usize), sh.v);
        // The 8 shifted i-cluster boxes, shared by the warp's lanes.
        let iboxes = (shared::dynamic_shared_mem() as *mut NbnxmBox).add((warp_in_block * SC) as usize);
        if lane < SC {
            *iboxes.add(lane as usize) = shifted(&*cluster_bbox.add((sci * SC + lane) as usize), sh.v);
        }
        // SAFETY: every lane reaches this (no lane returned after the item check).
        warp::sync_warp(FULL);
        let (group, kj) = (lane / SC, lane % SC);
        // Words found per list (home–home, with halo clusters), and where the next one goes.
        // Scalars, not arrays indexed by the list: those would live in local memory.
        let (mut n_local, mut n_nonlocal) = (0u32, 0u32);
        let (mut at_local, mut at_nonlocal) =
            if WRITE { (*counts_or_offsets.add(2 * item as usize), *counts_or_offsets.add(2 * item as usize + 1)) } else { (0, 0) };
        for zidx in 0..n_zones {
            let zg = *zones.add(zidx as usize);
            if zg.zone & zi != 0 || zg.sc_end <= sci {
                continue;
            }
            let e = &zg.extent;
            let mut outside = false;
            let mut d = 0;
            while d < 3 {
                outside |= bi.lo[d] - rl > e.hi[d] || bi.hi[d] + rl < e.lo[d];
                d += 1;
            }
            if outside {
                continue;
            }
            let nonlocal = zi != 0 || zg.zone != 0;
            let (cx0, cx1) = (column_index(&zg, 0, bi.lo[0] - rl), column_index(&zg, 0, bi.hi[0] + rl));
            let (cy0, cy1) = (column_index(&zg, 1, bi.lo[1] - rl), column_index(&zg, 1, bi.hi[1] + rl));
            let (zmin, zmax) = (bi.lo[2] - rl, bi.hi[2] + rl);
            for cy in cy0..=cy1 {
                for cx in cx0..=cx1 {
                    let c = (zg.column_base + cx + zg.columns[0] * cy) as usize;
                    let (a, b) = (*column_start.add(c), *column_start.add(c + 1));
                    // First supercluster whose top reaches zmin (tops ascend within a column).
                    let (mut lo, mut hi) = (a, b);
                    while lo < hi {
                        let mid = lo + (hi - lo) / 2;
                        if (*super_bbox.add(mid as usize)).hi[2] < zmin {
                            lo = mid + 1;
                        } else {
                            hi = mid;
                        }
                    }
                    let mut base = lo.max(sci);
                    while base < b {
                        let scj = base + group;
                        // Bottoms ascend too: once one starts beyond zmax, so do all after it.
                        let in_range = scj < b && (*super_bbox.add(scj as usize)).lo[2] <= zmax;
                        let mut word = 0u32;
                        if in_range {
                            let sb = &*super_bbox.add(scj as usize);
                            let cj = scj * SC + kj;
                            let cb = &*cluster_bbox.add(cj as usize);
                            if distance2(&bi, sb) < rl2 && distance2(&bi, cb) < rl2 {
                                let mut mask = 0u32;
                                let mut k = 0;
                                while k < SC {
                                    if distance2(&*iboxes.add(k as usize), cb) < rl2 {
                                        mask |= 1 << k;
                                    }
                                    k += 1;
                                }
                                if scj == sci {
                                    mask &= same_super_mask(kj, sh.index);
                                }
                                if mask != 0 {
                                    word = (cj << NBNXM_MASK_BITS) | mask;
                                }
                            }
                        }
                        // SAFETY: every lane runs every round of this loop (its bounds are uniform).
                        let found = warp::ballot(FULL, word != 0);
                        let before = (found & ((1u32 << lane) - 1)).count_ones();
                        if nonlocal {
                            if WRITE && word != 0 {
                                *out_nonlocal.add((at_nonlocal + before) as usize) = word;
                            }
                            n_nonlocal += found.count_ones();
                            at_nonlocal += found.count_ones();
                        } else {
                            if WRITE && word != 0 {
                                *out_local.add((at_local + before) as usize) = word;
                            }
                            n_local += found.count_ones();
                            at_local += found.count_ones();
                        }
                        // SAFETY: as above.
                        if warp::ballot(FULL, in_range) != FULL {
                            break;
                        }
                        base += GROUPS;
                    }
                }
            }
        }
        if !WRITE && lane == 0 {
            *counts_or_offsets.add(2 * item as usize) = n_local;
            *counts_or_offsets.add(2 * item as usize + 1) = n_nonlocal;
        }
    }
}

kernel! {
    /// The search's first pass. See [`crate::abi::NBNXM_SEARCH_COUNT`].
    fn nbnxm_search_count(
        super_bbox: *const NbnxmBox, cluster_bbox: *const NbnxmBox, super_zone: *const u32, zones: *const NbnxmZone, n_zones: u32,
        column_start: *const u32, shifts: *const NbnxmShift, n_shifts: u32, n_super: u32, info: *const u32, rl: f32, rl2: f32,
        counts: *mut u32,
    ) {
        // SAFETY: forwarded; the host's contract is on `search`.
        unsafe {
            search::<false>(super_bbox, cluster_bbox, super_zone, zones, n_zones, column_start, shifts, n_shifts, n_super, info, rl, rl2,
                counts, core::ptr::null_mut(), core::ptr::null_mut())
        }
    }
}

kernel! {
    /// The search's second pass. See [`crate::abi::NBNXM_SEARCH_WRITE`].
    fn nbnxm_search_write(
        super_bbox: *const NbnxmBox, cluster_bbox: *const NbnxmBox, super_zone: *const u32, zones: *const NbnxmZone, n_zones: u32,
        column_start: *const u32, shifts: *const NbnxmShift, n_shifts: u32, n_super: u32, info: *const u32, rl: f32, rl2: f32,
        offsets: *mut u32, j_local: *mut u32, j_nonlocal: *mut u32,
    ) {
        // SAFETY: forwarded.
        unsafe {
            search::<true>(super_bbox, cluster_bbox, super_zone, zones, n_zones, column_start, shifts, n_shifts, n_super, info, rl, rl2,
                offsets, j_local, j_nonlocal)
        }
    }
}
