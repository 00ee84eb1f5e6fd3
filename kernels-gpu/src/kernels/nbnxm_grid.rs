//! The cluster grid of one rank on the GPU: the host's `ClusterGrid::build`
//! (`host/md/src/nbnxm/grid.rs`) for any rank's local atoms (home atoms and halo zones, periodic
//! only along undecomposed dimensions), slot for slot and box for box, so that the GPU search
//! (`nbnxm_search`) can run on a grid that never left the GPU.
//!
//! The zones' column grids are one column array: zone `k` (in the table of zones with atoms, home
//! first) owns `columns_x * columns_y + 1` places from its `NbnxmZone::column_base` on, the last an
//! empty column that no atom bins into. One scan over the whole array then numbers superclusters
//! zone by zone, column by column (the host's order), and leaves each zone's column starts, its
//! end included, exactly where the search reads them (`column_start[column_base ..= column_base +
//! columns_x * columns_y]`). The host fills the zone table (extents, column shapes, bases) before
//! the passes; they add each zone's end.
//!
//! Five passes, each deterministic in what it produces (atomics only count, or claim places whose
//! order the next pass sorts away):
//! 1. `nbnxm_grid_bin`, one thread per atom: wrap into the box (optional, in place, the host's
//!    `wrap_position` in the same `f32` operations), check the coordinates are finite, find the
//!    column in its zone's grid (the host's `column_of`), count it;
//! 2. `nbnxm_grid_columns`, one block: the columns' atom starts and supercluster starts (exclusive
//!    scans of the counts and of `ceil(count / 64)`, `scan.rs`), the total, each zone's end;
//! 3. `nbnxm_grid_scatter`, one thread per atom: its key `(z, atom)` into its column's places;
//! 4. `nbnxm_grid_sort`, one block per column: each key to the place of its rank in the column
//!    (the number of keys below it; keys are distinct, so ranks are a permutation, and equal to
//!    the host's sort for any column length);
//! 5. `nbnxm_grid_fill`, one warp per supercluster (a chunk of 64 sorted keys): halves by rank in
//!    z (the chunk's order), quarters by rank of `(y, atom)` within the half, clusters by rank of
//!    `(x, atom)` within the quarter, exactly the host's sorts of each piece; slots, types,
//!    cluster boxes in slot order, the supercluster box in cluster order, and its zone.
//!
//! Arithmetic: plain `f32` operations (LLVM's NVPTX backend emits `div.rn`, `mul.rn`, `sub.rn`,
//! `add.rn`, which ptxas never contracts into an FMA; `tests/ptx_instructions.rs` pins it), `floor`
//! as `cvt.rmi`, the saturating conversion of Rust's `as i32` as `cvt.rzi.s32.f32`.

use super::scan::block_exclusive_scan;
use crate::abi::{
    Float3, NBNXM_CLUSTER_SIZE, NBNXM_CLUSTERS_PER_SUPER, NBNXM_FILLER, NBNXM_GRID_FILL_WARP_BYTES, NBNXM_GRID_FILL_WARPS, NBNXM_GRID_INFO_BAD_ATOM,
    NBNXM_GRID_INFO_MAX_TYPE, NBNXM_GRID_INFO_SUPERCLUSTERS, NBNXM_GRID_SCAN_THREADS, NBNXM_GRID_SORT_THREADS, NBNXM_SUPER_SIZE, NbnxmBox, NbnxmZone,
    nbnxm_cluster_atoms,
};
use crate::device::{self, math, shared, sync_threads, thread, warp};

const FULL: u32 = warp::FULL_MASK;
const SS: u32 = NBNXM_SUPER_SIZE;
const CL: u32 = NBNXM_CLUSTER_SIZE;
const SC: u32 = NBNXM_CLUSTERS_PER_SUPER;
/// Above every key of a finite coordinate: fills the places of a short chunk.
const PAD: u64 = u64::MAX;
/// `atom_column` of an atom with a non-finite coordinate (it is in no column).
const NO_COLUMN: u32 = u32::MAX;

// Halves of 32 keys are one per lane; quarters of 16, clusters of 8.
const _: () = assert!(NBNXM_SUPER_SIZE == 64 && NBNXM_CLUSTER_SIZE == 8 && NBNXM_CLUSTERS_PER_SUPER == 8);

/// The host's sort key `(v, atom)` (`grid.rs`'s `key`): ascending keys order by `f32::total_cmp`
/// of the coordinate, then by atom.
#[inline(always)]
fn key(v: f32, atom: u32) -> u64 {
    let b = v.to_bits();
    let ordered = if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 };
    ((ordered as u64) << 32) | atom as u64
}

/// One coordinate wrapped into `[0, l)`: the host's `wrap_position` per dimension, operation for
/// operation. The home atoms' migration (`migrate.rs`) wraps with it too.
#[inline(always)]
pub(super) fn wrap(x: f32, l: f32) -> f32 {
    if x >= 0.0 && x < l {
        return x;
    }
    let mut v = x - l * math::floor_f32(x / l);
    if v >= l {
        v -= l;
    }
    if v < 0.0 {
        v += l;
    }
    if v >= 0.0 && v < l { v } else { 0.0 }
}

/// The host's `column_of`: `(v - lo) / cell`, the saturating conversion (NaN and everything below
/// 1 to at most 0), clamped into the grid.
#[inline(always)]
fn column_of(v: f32, lo: f32, cell: f32, columns: u32) -> u32 {
    let c = (v - lo) / cell;
    ((c as i32).max(0) as u32).min(columns - 1)
}

/// Pass 1 (see [`crate::abi::NBNXM_GRID_BIN`]).
///
/// # Safety
/// `x`, `atom_column`, `types` and (unless null) `zone_ids` have `n` entries; `zones` has an
/// entry for every zone of `zone_mask` (ascending), cells positive, at least one column each way,
/// every atom's zone in the mask; `counts` covers every zone's columns (zeroed), `info`
/// [`crate::abi::NBNXM_GRID_INFO_WORDS`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn bin(
    x: *mut Float3,
    n: u32,
    b: [f32; 3],
    wrap_in_place: bool,
    zone_ids: *const u8,
    zone_mask: u32,
    zones: *const NbnxmZone,
    atom_column: *mut u32,
    counts: *mut u32,
    info: *mut u32,
    types: *const u32,
) {
    let i = thread::index_1d();
    if i >= n {
        return;
    }
    // SAFETY: `i < n`; the other indices are inside their arrays by the contract.
    unsafe {
        let p = *x.add(i as usize);
        if !(p.x.is_finite() && p.y.is_finite() && p.z.is_finite()) {
            device::atomic_min_relaxed_gpu_u32(info.add(NBNXM_GRID_INFO_BAD_ATOM), i);
            *atom_column.add(i as usize) = NO_COLUMN;
            return;
        }
        let inside = p.x >= 0.0 && p.x < b[0] && p.y >= 0.0 && p.y < b[1] && p.z >= 0.0 && p.z < b[2];
        let w = if wrap_in_place && !inside {
            let w = Float3::new(wrap(p.x, b[0]), wrap(p.y, b[1]), wrap(p.z, b[2]));
            *x.add(i as usize) = w;
            w
        } else {
            p
        };
        // The atom's zone's entry: the zones with atoms below it come first.
        let z = if zone_ids.is_null() { 0 } else { *zone_ids.add(i as usize) as u32 };
        let g = &*zones.add((zone_mask & ((1u32 << z) - 1)).count_ones() as usize);
        let (lo, cell, columns) = (g.extent.lo, g.cell, g.columns);
        let c = g.column_base + column_of(w.x, lo[0], cell[0], columns[0]) + columns[0] * column_of(w.y, lo[1], cell[1], columns[1]);
        *atom_column.add(i as usize) = c;
        device::atomic_add_relaxed_gpu_u32(counts.add(c as usize), 1);
        device::atomic_max_relaxed_gpu_u32(info.add(NBNXM_GRID_INFO_MAX_TYPE), *types.add(i as usize));
    }
}

/// Pass 2 (see [`crate::abi::NBNXM_GRID_COLUMNS`]): each thread takes a contiguous run of columns,
/// the block scans the runs' sums ([`block_exclusive_scan`]), each thread writes its run; after a
/// barrier, thread `k` reads zone `k`'s end from the starts.
///
/// # Safety
/// One block of [`NBNXM_GRID_SCAN_THREADS`] threads with `8 NBNXM_GRID_SCAN_THREADS` bytes of
/// dynamic shared memory; `counts` and `cursor` have `n_columns` entries, `atom_start` and
/// `column_start` `n_columns + 1`, `info` [`crate::abi::NBNXM_GRID_INFO_WORDS`]; `zones` has
/// `n_zones <= NBNXM_GRID_SCAN_THREADS` entries, each zone's columns and its empty last column
/// inside the `n_columns`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn columns(
    counts: *const u32,
    n_columns: u32,
    atom_start: *mut u32,
    cursor: *mut u32,
    column_start: *mut u32,
    zones: *mut NbnxmZone,
    n_zones: u32,
    info: *mut u32,
) {
    const T: u32 = NBNXM_GRID_SCAN_THREADS;
    let tid = thread::thread_idx_x();
    let per = n_columns.div_ceil(T);
    let c0 = (tid * per).min(n_columns);
    let c1 = (c0 + per).min(n_columns);
    // SAFETY: every index is inside its array by the contract; every thread reaches the scan and
    // the barrier (no thread returns early), the scan's shared sums are the block's dynamic shared
    // memory, and the barrier orders the block's writes of the starts before the zones' reads.
    unsafe {
        let (mut atoms, mut supers) = (0u32, 0u32);
        for c in c0..c1 {
            let m = *counts.add(c as usize);
            atoms += m;
            supers += m.div_ceil(SS);
        }
        let ([mut at, mut sc], [total_atoms, total]) = block_exclusive_scan([atoms, supers], shared::dynamic_shared_mem() as *mut u32, tid, T);
        for c in c0..c1 {
            let m = *counts.add(c as usize);
            *atom_start.add(c as usize) = at;
            *cursor.add(c as usize) = at;
            *column_start.add(c as usize) = sc;
            at += m;
            sc += m.div_ceil(SS);
        }
        if tid == T - 1 {
            *atom_start.add(n_columns as usize) = total_atoms;
            *column_start.add(n_columns as usize) = total;
            *info.add(NBNXM_GRID_INFO_SUPERCLUSTERS) = total;
        }
        sync_threads();
        if tid < n_zones {
            // The zone's last, empty column starts where its superclusters end.
            let z = zones.add(tid as usize);
            let end = (*z).column_base + (*z).columns[0] * (*z).columns[1];
            (*z).sc_end = *column_start.add(end as usize);
        }
    }
}

/// Pass 3 (see [`crate::abi::NBNXM_GRID_SCATTER`]).
///
/// # Safety
/// `x` and `atom_column` have `n` entries (from pass 1), `cursor` the column starts (pass 2),
/// `keys` `n` places.
#[inline(always)]
unsafe fn scatter(x: *const Float3, n: u32, atom_column: *const u32, cursor: *mut u32, keys: *mut u64) {
    let i = thread::index_1d();
    if i >= n {
        return;
    }
    // SAFETY: `i < n`; a column's cursor stays inside its places (pass 1 counted each atom once).
    unsafe {
        let c = *atom_column.add(i as usize);
        if c == NO_COLUMN {
            return;
        }
        let at = device::atomic_fetch_add_relaxed_gpu_u32(cursor.add(c as usize), 1);
        *keys.add(at as usize) = key((*x.add(i as usize)).z, i);
    }
}

/// Pass 4 (see [`crate::abi::NBNXM_GRID_SORT`]): rounds of one key per thread; each round walks
/// the column's keys in tiles through shared memory and counts those below the thread's key.
///
/// # Safety
/// One block per column (`grid.x = n_columns`) of [`NBNXM_GRID_SORT_THREADS`] threads with
/// [`crate::abi::NBNXM_GRID_SORT_SHARED_BYTES`]; `atom_start` from pass 2, `keys` from pass 3
/// (distinct keys), `sorted` as many places.
#[inline(always)]
unsafe fn sort(atom_start: *const u32, keys: *const u64, sorted: *mut u64) {
    const T: u32 = NBNXM_GRID_SORT_THREADS;
    let c = thread::block_idx_x() as usize;
    let tid = thread::thread_idx_x();
    // SAFETY: indices inside the column's places; the loops' bounds are uniform over the block, so
    // every thread reaches every barrier.
    unsafe {
        let (a, m) = (*atom_start.add(c), *atom_start.add(c + 1) - *atom_start.add(c));
        let col = keys.add(a as usize);
        let tile = shared::dynamic_shared_mem() as *mut u64;
        let mut base = 0;
        while base < m {
            let i = base + tid;
            let mine = if i < m { *col.add(i as usize) } else { PAD };
            let mut rank = 0u32;
            let mut t0 = 0;
            while t0 < m {
                let j = t0 + tid;
                *tile.add(tid as usize) = if j < m { *col.add(j as usize) } else { PAD };
                sync_threads();
                let len = (m - t0).min(T);
                for k in 0..len {
                    rank += (*tile.add(k as usize) < mine) as u32;
                }
                sync_threads();
                t0 += T;
            }
            if i < m {
                *sorted.add((a + rank) as usize) = mine;
            }
            base += T;
        }
    }
}

/// Pass 5 (see [`crate::abi::NBNXM_GRID_FILL`]). Lane `l` holds chunk keys `l` (half 0) and
/// `l + 32` (half 1).
///
/// # Safety
/// [`NBNXM_GRID_FILL_WARPS`] warps per block and [`crate::abi::NBNXM_GRID_FILL_SHARED_BYTES`];
/// inputs from passes 1-4 (`column_start` has `n_columns + 1` entries, `info`'s supercluster
/// count; empty columns own no supercluster), `types` and (unless null) `zone_ids` one per atom;
/// the outputs room for every supercluster.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn fill(
    x: *const Float3,
    types: *const u32,
    zone_ids: *const u8,
    sorted: *const u64,
    atom_start: *const u32,
    column_start: *const u32,
    n_columns: u32,
    info: *const u32,
    atom_index: *mut u32,
    atom_type: *mut u32,
    cluster_bbox: *mut NbnxmBox,
    super_bbox: *mut NbnxmBox,
    super_zone: *mut u32,
) {
    let w = warp::warp_id();
    let lane = warp::lane_id();
    let s = thread::block_idx_x() * NBNXM_GRID_FILL_WARPS + w;
    // SAFETY: indices inside the arrays by the contract; this warp's shared region is its own, its
    // accesses ordered by `sync_warp`, which every lane reaches (the return is warp-uniform).
    unsafe {
        if s >= *info.add(NBNXM_GRID_INFO_SUPERCLUSTERS) {
            return;
        }
        // The column holding `s`: the last whose first supercluster is at or below it.
        let (mut lo, mut hi) = (0u32, n_columns);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if *column_start.add(mid as usize) <= s {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let first = *atom_start.add(lo as usize) + SS * (s - *column_start.add(lo as usize));
        let len = (*atom_start.add(lo as usize + 1) - first).min(SS);
        let region = (shared::dynamic_shared_mem() as *mut u8).add((w * NBNXM_GRID_FILL_WARP_BYTES) as usize);
        let ky = region as *mut u64;
        let kx = ky.add(SS as usize);
        let upper = kx.add(SS as usize) as *mut u32;
        let pos = upper.add(SS as usize) as *mut [f32; 3];
        let boxes = pos.add(SS as usize) as *mut NbnxmBox;
        let mut atom = [0u32; 2];
        let mut p = [[0.0f32; 3]; 2];
        for h in 0..2 {
            let t = lane + 32 * h as u32;
            if t < len {
                let a = *sorted.add((first + t) as usize) as u32;
                let q = *x.add(a as usize);
                atom[h] = a;
                p[h] = [q.x, q.y, q.z];
                *ky.add(t as usize) = key(q.y, a);
                *kx.add(t as usize) = key(q.x, a);
            } else {
                *ky.add(t as usize) = PAD;
                *kx.add(t as usize) = PAD;
            }
        }
        warp::sync_warp(FULL);
        // Quarter: the 16 lowest `(y, atom)` of the half are quarter 0.
        let mut yh = [0u32; 2];
        for (h, y) in yh.iter_mut().enumerate() {
            let t = lane as usize + 32 * h;
            let mine = *ky.add(t);
            let mut rank = 0u32;
            for u in 32 * h..32 * h + 32 {
                rank += (*ky.add(u) < mine) as u32;
            }
            *y = (rank >= 16) as u32;
            *upper.add(t) = *y;
        }
        warp::sync_warp(FULL);
        for h in 0..2 {
            let t = lane + 32 * h as u32;
            let out = (s * SS) as usize;
            if t < len {
                // Cluster: rank of `(x, atom)` within the quarter (padding keys are never below).
                let mine = *kx.add(t as usize);
                let mut rank = 0u32;
                for u in 32 * h..32 * h + 32 {
                    rank += (*upper.add(u) == yh[h] && *kx.add(u) < mine) as u32;
                }
                let xh = (rank >= CL) as u32;
                let slot = (4 * h as u32 + 2 * yh[h] + xh) * CL + rank - CL * xh;
                *atom_index.add(out + slot as usize) = atom[h];
                *atom_type.add(out + slot as usize) = *types.add(atom[h] as usize);
                *pos.add(slot as usize) = p[h];
            }
            // Slot `t` of the supercluster is padding when its cluster has fewer atoms.
            if t % CL >= nbnxm_cluster_atoms(t / CL, len) {
                *atom_index.add(out + t as usize) = NBNXM_FILLER;
                *atom_type.add(out + t as usize) = 0;
            }
        }
        warp::sync_warp(FULL);
        if lane < SC {
            // Cluster boxes, atoms in slot order (the host's order); empty: lo +inf, hi -inf.
            let mut bx = NbnxmBox { lo: [f32::INFINITY; 3], hi: [f32::NEG_INFINITY; 3] };
            for j in 0..nbnxm_cluster_atoms(lane, len) {
                let q = *pos.add((lane * CL + j) as usize);
                for d in 0..3 {
                    bx.lo[d] = bx.lo[d].min(q[d]);
                    bx.hi[d] = bx.hi[d].max(q[d]);
                }
            }
            *cluster_bbox.add((s * SC + lane) as usize) = bx;
            *boxes.add(lane as usize) = bx;
        }
        warp::sync_warp(FULL);
        if lane == 0 {
            let mut sb = NbnxmBox { lo: [f32::INFINITY; 3], hi: [f32::NEG_INFINITY; 3] };
            for k in 0..SC as usize {
                let b = *boxes.add(k);
                for d in 0..3 {
                    sb.lo[d] = sb.lo[d].min(b.lo[d]);
                    sb.hi[d] = sb.hi[d].max(b.hi[d]);
                }
            }
            *super_bbox.add(s as usize) = sb;
            // Lane 0 holds the chunk's first atom (a supercluster has at least one).
            *super_zone.add(s as usize) = if zone_ids.is_null() { 0 } else { *zone_ids.add(atom[0] as usize) as u32 };
        }
    }
}

kernel! {
    /// The grid's pass 1. See [`crate::abi::NBNXM_GRID_BIN`].
    fn nbnxm_grid_bin(
        x: *mut Float3, n: u32, box_x: f32, box_y: f32, box_z: f32, wrap: u32, zone_ids: *const u8, zone_mask: u32, zones: *const NbnxmZone,
        atom_column: *mut u32, counts: *mut u32, info: *mut u32, types: *const u32,
    ) {
        // SAFETY: forwarded; the host's contract is on `bin`.
        unsafe { bin(x, n, [box_x, box_y, box_z], wrap != 0, zone_ids, zone_mask, zones, atom_column, counts, info, types) }
    }
}

kernel! {
    /// The grid's pass 2. See [`crate::abi::NBNXM_GRID_COLUMNS`].
    fn nbnxm_grid_columns(
        counts: *const u32, n_columns: u32, atom_start: *mut u32, cursor: *mut u32, column_start: *mut u32, zones: *mut NbnxmZone, n_zones: u32,
        info: *mut u32,
    ) {
        // SAFETY: forwarded.
        unsafe { columns(counts, n_columns, atom_start, cursor, column_start, zones, n_zones, info) }
    }
}

kernel! {
    /// The grid's pass 3. See [`crate::abi::NBNXM_GRID_SCATTER`].
    fn nbnxm_grid_scatter(x: *const Float3, n: u32, atom_column: *const u32, cursor: *mut u32, keys: *mut u64) {
        // SAFETY: forwarded.
        unsafe { scatter(x, n, atom_column, cursor, keys) }
    }
}

kernel! {
    /// The grid's pass 4. See [`crate::abi::NBNXM_GRID_SORT`].
    fn nbnxm_grid_sort(atom_start: *const u32, keys: *const u64, sorted: *mut u64) {
        // SAFETY: forwarded.
        unsafe { sort(atom_start, keys, sorted) }
    }
}

kernel! {
    /// The grid's pass 5. See [`crate::abi::NBNXM_GRID_FILL`].
    fn nbnxm_grid_fill(
        x: *const Float3, types: *const u32, zone_ids: *const u8, sorted: *const u64, atom_start: *const u32, column_start: *const u32,
        n_columns: u32, info: *const u32, atom_index: *mut u32, atom_type: *mut u32, cluster_bbox: *mut NbnxmBox, super_bbox: *mut NbnxmBox,
        super_zone: *mut u32,
    ) {
        // SAFETY: forwarded.
        unsafe {
            fill(x, types, zone_ids, sorted, atom_start, column_start, n_columns, info, atom_index, atom_type, cluster_bbox, super_bbox, super_zone)
        }
    }
}
