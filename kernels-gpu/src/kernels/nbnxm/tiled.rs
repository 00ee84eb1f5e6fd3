//! The nbnxm kernels written for the FP32 units (see the parent module for the tile layout):
//! - an entry's j-list words are loaded 32 at a time, one per lane, in one coalesced load; a
//!   ballot of the words with a nonzero mask gives the j-clusters to visit, each broadcast from
//!   its lane with one shuffle, so the zero words a prune leaves cost nothing;
//! - the LJ table `[-6 c6, 12 c12]` per type pair sits in shared memory, read with one 8-byte
//!   shared load per pair at `row(type_i) + 8 type_j` bytes (both offsets precomputed: one add);
//! - the cutoff is folded into `1/r²` (zero beyond it: one compare and one select per pair, the
//!   force then vanishes by itself), and the self cluster pair, where only `ti < tj` counts, is a
//!   separate instantiation of the j-cluster body entered by a warp-uniform branch, so the common
//!   path has no per-pair exclusion test;
//! - per pair (SASS of the common path): 3 subtractions, `r²` (1 multiply, 2 FMAs), compare, a
//!   zero and a predicated `rcp`, `1/r⁶` and `1/r⁸` (3 multiplies), the table load and its
//!   address, the force scalar (1 FMA, 1 multiply) and 6 FMAs into the i- and j-forces: 23
//!   instructions, 17 of them FP32; per i-cluster one 16-byte shared load for two pairs.
//!
//! Variants (one instantiation each, the host picks one, `NbnxmKernel`):
//! - `_ind`: j-atoms through the slot index: `atom_index`, then `x` and the slot's type;
//! - `_pf`: the same with the next j-cluster's loads issued before the current one is computed
//!   (its indices and types before the i-cluster loop, its coordinates after it);
//! - `_xq`: j-atoms (and i-atoms) from a cluster-ordered `[x, y, z, bits(8 type)]` copy that
//!   [`nbnxm_gather_xq`] refreshes before each use: two 16-byte loads per lane and j-cluster,
//!   prefetched one j-cluster ahead; the slot index only for the force atomics.

use super::{CL, FAR_I, FAR_J, FULL, MASK, Staged, add_energy, add_i_forces, add_j_forces, shift_vector};
use crate::abi::{
    Float3, NBNXM_CENTRAL_SHIFT, NBNXM_CLUSTERS_PER_SUPER, NBNXM_FILLER, NBNXM_MASK_BITS, NBNXM_SHARED_BYTES, NBNXM_SUPER_SIZE,
    NBNXM_WARPS_PER_BLOCK, NbnxmEntry,
};
use crate::device::{math, shared, sync_threads, thread, warp};

/// One slot of the cluster-ordered copy: `[x, y, z, bits(8 type)]` (padding: `FAR_J`, type 0).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Xq([f32; 4]);

const CLUSTERS: usize = NBNXM_CLUSTERS_PER_SUPER as usize;

/// A j-cluster's first-stage loads for this lane: slot indices of atoms `tj` and `tj + 4`, and
/// either their types as byte offsets into a table row in `[3]` (`_ind`, `_pf`) or their whole
/// slots (`_xq`).
#[derive(Clone, Copy)]
struct JRef {
    ia: u32,
    ib: u32,
    a: [f32; 4],
    b: [f32; 4],
}

/// A j-cluster ready to compute: the two atoms `[x, y, z, bits(8 type)]` and their local indices.
#[derive(Clone, Copy)]
struct JAtoms {
    a: [f32; 4],
    b: [f32; 4],
    ia: u32,
    ib: u32,
}

/// Where the atoms come from: `XQ` reads the cluster-ordered copy `src` (as `*const Xq`),
/// otherwise `src` is the exchange's `Float3` array, read through `atom_index`, and the types
/// from `atom_type` when `TYPES` (the prune needs none: the type offsets are then 0).
#[derive(Clone, Copy)]
struct Source<const XQ: bool, const TYPES: bool> {
    src: *const u8,
    atom_index: *const u32,
    atom_type: *const u32,
}

impl<const XQ: bool, const TYPES: bool> Source<XQ, TYPES> {
    /// The loads that need nothing loaded before: slot indices and types, or the whole slots.
    ///
    /// # Safety
    /// `cj`'s slots are inside the arrays.
    #[inline(always)]
    unsafe fn stage1(&self, cj: u32, tj: u32) -> JRef {
        let (sa, sb) = ((cj * CL + tj) as usize, (cj * CL + tj + 4) as usize);
        // SAFETY: the host's list only names clusters of this grid.
        unsafe {
            let (ia, ib) = (*self.atom_index.add(sa), *self.atom_index.add(sb));
            if XQ {
                let q = self.src as *const Xq;
                JRef { ia, ib, a: (*q.add(sa)).0, b: (*q.add(sb)).0 }
            } else {
                let off = |s: usize| if TYPES { f32::from_bits(*self.atom_type.add(s) * 8) } else { 0.0 };
                JRef { ia, ib, a: [0.0, 0.0, 0.0, off(sa)], b: [0.0, 0.0, 0.0, off(sb)] }
            }
        }
    }

    /// The loads that wait for [`Self::stage1`]: the coordinates behind the slot indices.
    ///
    /// # Safety
    /// Non-filler indices are inside the coordinate array.
    #[inline(always)]
    unsafe fn stage2(&self, r: JRef) -> JAtoms {
        if XQ {
            return JAtoms { a: r.a, b: r.b, ia: r.ia, ib: r.ib };
        }
        let x = self.src as *const Float3;
        // SAFETY: forwarded.
        let at = |i: u32, w: f32| unsafe {
            if i != NBNXM_FILLER {
                let p = *x.add(i as usize);
                [p.x, p.y, p.z, w]
            } else {
                [FAR_J, FAR_J, FAR_J, w]
            }
        };
        JAtoms { a: at(r.ia, r.a[3]), b: at(r.ib, r.b[3]), ia: r.ia, ib: r.ib }
    }

    /// Both stages at once.
    ///
    /// # Safety
    /// As both stages.
    #[inline(always)]
    unsafe fn load(&self, cj: u32, tj: u32) -> JAtoms {
        // SAFETY: forwarded.
        unsafe { self.stage2(self.stage1(cj, tj)) }
    }

    /// Stages the 64 i-atoms of supercluster `sci`, moved by `shift`, into this warp's `staged`
    /// slice: `[x, y, z, bits(row)]` with `row = 8 ntypes type` bytes (the type's table row);
    /// padding at `FAR_I`. Lane `l` writes slots `l` and `l + 32`; a warp barrier publishes them.
    ///
    /// # Safety
    /// All lanes together; the supercluster's slots are inside the arrays.
    #[inline(always)]
    unsafe fn stage_i(&self, sci: u32, shift: Float3, ntypes: u32, staged: *mut Staged, lane: u32) {
        for s in [lane, lane + warp::WARP_SIZE] {
            // SAFETY: forwarded.
            let p = unsafe { self.single(sci * NBNXM_SUPER_SIZE + s) };
            let row = f32::from_bits(p[3].to_bits() * ntypes);
            let v = if p[0] != FAR_J { [p[0] + shift.x, p[1] + shift.y, p[2] + shift.z, row] } else { [FAR_I, FAR_I, FAR_I, row] };
            // SAFETY: s < 64, the warp's slice.
            unsafe { *staged.add(s as usize) = Staged(v) };
        }
        // SAFETY: every lane reaches this call.
        unsafe { warp::sync_warp(FULL) };
    }

    /// One slot, `[x, y, z, bits(8 type)]` (padding: `FAR_J`).
    ///
    /// # Safety
    /// `slot` is inside the arrays.
    #[inline(always)]
    unsafe fn single(&self, slot: u32) -> [f32; 4] {
        // SAFETY: forwarded.
        unsafe {
            if XQ {
                return (*(self.src as *const Xq).add(slot as usize)).0;
            }
            let i = *self.atom_index.add(slot as usize);
            let w = if TYPES { f32::from_bits(*self.atom_type.add(slot as usize) * 8) } else { 0.0 };
            if i != NBNXM_FILLER {
                let p = *(self.src as *const Float3).add(i as usize);
                [p.x, p.y, p.z, w]
            } else {
                [FAR_J, FAR_J, FAR_J, w]
            }
        }
    }
}

/// Constants of the pair interaction.
#[derive(Clone, Copy)]
struct Lj {
    /// The shared-memory table: `[-6 c6, 12 c12]` at byte `row(type_i) + 8 type_j`.
    table: *const u8,
    rc2: f32,
    /// `rc^-6` and `rc^-12`: the potential shift.
    sh6: f32,
    sh12: f32,
}

/// One atom pair. Beyond the cutoff, or `excluded` (only looked at when `EXCL`), it adds exactly
/// zero: `1/r²` is selected to zero, so the force scalar is `(12 c12 · 0 - 6 c6) · 0`; the
/// energy is selected separately.
#[inline(always)]
fn pair<const ENERGY: bool, const EXCL: bool>(p: &Lj, xi: [f32; 4], xj: [f32; 4], excluded: bool, fi: &mut Float3, fj: &mut Float3, e: &mut f32) {
    let (dx, dy, dz) = (xj[0] - xi[0], xj[1] - xi[1], xj[2] - xi[2]);
    let r2 = math::fma_f32(dx, dx, math::fma_f32(dy, dy, dz * dz));
    let within = r2 < p.rc2 && !(EXCL && excluded);
    let rinv2 = if within { math::rcp_approx_f32(r2) } else { 0.0 };
    let rinv6 = rinv2 * rinv2 * rinv2;
    // SAFETY: row offsets come from types below ntypes (padding: type 0) and the table holds
    // ntypes² 8-byte entries at an 8-byte-aligned shared address.
    // One 8-byte load (a `[f32; 2]` would be read as two 4-byte ones).
    let bits = unsafe { *(p.table.add((xi[3].to_bits() + xj[3].to_bits()) as usize) as *const u64) };
    let c = [f32::from_bits(bits as u32), f32::from_bits((bits >> 32) as u32)];
    let s = math::fma_f32(c[1], rinv6, c[0]) * (rinv6 * rinv2);
    *fi = Float3::new(math::fma_f32(-s, dx, fi.x), math::fma_f32(-s, dy, fi.y), math::fma_f32(-s, dz, fi.z));
    *fj = Float3::new(math::fma_f32(s, dx, fj.x), math::fma_f32(s, dy, fj.y), math::fma_f32(s, dz, fj.z));
    if ENERGY {
        let v = c[1] * (1.0 / 12.0) * (rinv6 * rinv6 - p.sh12) + c[0] * (1.0 / 6.0) * (rinv6 - p.sh6);
        *e += if within { v } else { 0.0 };
    }
}

/// The pairs of one j-cluster with the masked-in i-clusters; returns the forces on the lane's two
/// j-atoms. `DIAG`: the j-cluster is i-cluster `kj` of this supercluster under no shift, whose
/// atom pairs count only for `ti < tj`.
///
/// # Safety
/// `staged` is the warp's staged supercluster.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn j_cluster<const ENERGY: bool, const DIAG: bool>(
    p: &Lj, staged: *const Staged, mask: u32, kj: u32, ti: u32, tj: u32, j: &JAtoms, fi: &mut [Float3; CLUSTERS], e: &mut f32,
) -> (Float3, Float3) {
    let (mut fa, mut fb) = (Float3::default(), Float3::default());
    each_i_cluster!(K => {
        if mask & (1 << K) != 0 {
            // SAFETY: 64 staged atoms per warp.
            let xi = unsafe { (*staged.add(K * CL as usize + ti as usize)).0 };
            let own = DIAG && K as u32 == kj;
            pair::<ENERGY, DIAG>(p, xi, j.a, own && ti >= tj, &mut fi[K], &mut fa, e);
            pair::<ENERGY, DIAG>(p, xi, j.b, own && ti >= tj + 4, &mut fi[K], &mut fb, e);
        }
    });
    (fa, fb)
}

/// Bit `k` set when one of this lane's two pairs with i-cluster `k` (masked in) is closer than
/// `sqrt(rlist2)`; `DIAG` as in [`j_cluster`].
///
/// # Safety
/// `staged` is the warp's staged supercluster.
#[inline(always)]
unsafe fn hits<const DIAG: bool>(staged: *const Staged, mask: u32, kj: u32, ti: u32, tj: u32, j: &JAtoms, rlist2: f32) -> u32 {
    let r2 = |xi: [f32; 4], xj: [f32; 4]| {
        let (dx, dy, dz) = (xj[0] - xi[0], xj[1] - xi[1], xj[2] - xi[2]);
        math::fma_f32(dx, dx, math::fma_f32(dy, dy, dz * dz))
    };
    let mut bits = 0u32;
    each_i_cluster!(K => {
        if mask & (1 << K) != 0 {
            // SAFETY: 64 staged atoms per warp.
            let xi = unsafe { (*staged.add(K * CL as usize + ti as usize)).0 };
            let own = DIAG && K as u32 == kj;
            let a = r2(xi, j.a) < rlist2 && !(own && ti >= tj);
            let b = r2(xi, j.b) < rlist2 && !(own && ti >= tj + 4);
            bits |= u32::from(a || b) << K;
        }
    });
    bits
}

/// The warp's entry and its staging slice; `None` past the last entry.
///
/// # Safety
/// `entries` holds `n_entries`; launched with [`NBNXM_WARPS_PER_BLOCK`] warps per block and at
/// least [`NBNXM_SHARED_BYTES`] of dynamic shared memory.
#[inline(always)]
unsafe fn entry_of(entries: *const NbnxmEntry, n_entries: u32) -> Option<(NbnxmEntry, *mut Staged)> {
    let warp_in_block = warp::warp_id();
    let entry = thread::block_idx_x() * NBNXM_WARPS_PER_BLOCK + warp_in_block;
    if entry >= n_entries {
        return None; // the whole warp: its entry index is warp-uniform
    }
    // SAFETY: the launch gives each warp NBNXM_SUPER_SIZE staged atoms; entry < n_entries.
    unsafe {
        let staged = (shared::dynamic_shared_mem() as *mut Staged).add((warp_in_block * NBNXM_SUPER_SIZE) as usize);
        Some((*entries.add(entry as usize), staged))
    }
}

/// Calls `round(w, word)` for the words of `j_list[start..end]`, 32 at a time: lane `l` gets
/// `w = base + l` and that word (0 when `w >= end`), loaded in one coalesced load.
///
/// # Safety
/// All lanes together; `j_list[start..end]` is valid.
#[inline(always)]
unsafe fn for_each_round(j_list: *const u32, start: u32, end: u32, lane: u32, mut round: impl FnMut(u32, u32)) {
    let mut base = start;
    while base < end {
        let w = base + lane;
        // SAFETY: w < end is inside the list.
        let word = if w < end { unsafe { *j_list.add(w as usize) } } else { 0 };
        round(w, word);
        base += warp::WARP_SIZE;
    }
}

/// Calls `visit(word, lane, next)` for each word of one round (lane `l` holds `mine`) whose mask
/// is nonzero, in lane order, on every lane: the word broadcast from the lane that holds it, and
/// the next such word of the round (the word itself for the last one), so that its loads can
/// start early. A ballot finds the words; one shuffle broadcasts each.
///
/// # Safety
/// All lanes together (the loop is warp-uniform).
#[inline(always)]
unsafe fn visit_words(mine: u32, mut visit: impl FnMut(u32, u32, u32)) {
    // SAFETY: every lane runs the ballot and the shuffles.
    unsafe {
        let mut todo = warp::ballot(FULL, mine & MASK != 0);
        if todo == 0 {
            return;
        }
        let mut src = todo.trailing_zeros();
        todo &= todo - 1;
        let mut word = warp::shfl_idx_u32(FULL, mine, src);
        loop {
            let next_src = if todo != 0 { todo.trailing_zeros() } else { src };
            let next = warp::shfl_idx_u32(FULL, mine, next_src);
            visit(word, src, next);
            if todo == 0 {
                return;
            }
            todo &= todo - 1;
            (src, word) = (next_src, next);
        }
    }
}

/// Loads the LJ table into the block's shared memory after the staging slices, negating the
/// `6 c6` column, and returns it. Every thread of the block calls it (a block barrier).
///
/// # Safety
/// Launched with [`crate::abi::nbnxm_tiled_shared_bytes`]`(ntypes)` of dynamic shared memory;
/// `lj` holds `ntypes²` entries.
#[inline(always)]
unsafe fn load_table(lj: *const [f32; 2], ntypes: u32) -> *const u8 {
    // SAFETY: the launch reserves the table after the staging slices; all threads reach the barrier.
    unsafe {
        let table = (shared::dynamic_shared_mem() as *mut u8).add(NBNXM_SHARED_BYTES as usize) as *mut [f32; 2];
        let mut k = thread::thread_idx_x();
        while k < ntypes * ntypes {
            let c = *lj.add(k as usize);
            *table.add(k as usize) = [-c[0], c[1]];
            k += thread::block_dim_x();
        }
        sync_threads();
        table as *const u8
    }
}

/// Whether j-cluster `cj` is one of the entry's own i-clusters under no shift (the self cluster
/// pair lies among its pairs): warp-uniform.
#[inline(always)]
fn own_super(e: &NbnxmEntry, cj: u32) -> Option<u32> {
    let ci0 = e.sci * NBNXM_CLUSTERS_PER_SUPER;
    (e.shift == NBNXM_CENTRAL_SHIFT && cj >= ci0 && cj < ci0 + NBNXM_CLUSTERS_PER_SUPER).then(|| cj - ci0)
}

/// The force kernels (see the module docs); `ENERGY` also sums the shifted potential.
///
/// # Safety
/// A list built by the host for these arrays: slots `sci * 64 ..` and `cj * 8 ..` inside
/// `atom_index` / `atom_type` (and the copy when `XQ`), indices inside `x` and `f`, types below
/// `ntypes`, `lj` holding `ntypes²` entries; launched with [`NBNXM_WARPS_PER_BLOCK`] warps per block
/// and [`crate::abi::nbnxm_tiled_shared_bytes`]`(ntypes)` of dynamic shared memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn forces<const ENERGY: bool, const XQ: bool, const PREFETCH: bool>(
    x: *const u8, atom_index: *const u32, atom_type: *const u32, entries: *const NbnxmEntry, n_entries: u32, j_list: *const u32,
    lj: *const [f32; 2], ntypes: u32, f: *mut Float3, energy: *mut f64, box_x: f32, box_y: f32, box_z: f32, rc2: f32, sh6: f32,
    sh12: f32,
) {
    // SAFETY: the host's contract (above) covers every access; the barrier in load_table is
    // reached by every thread of the block before any warp leaves.
    unsafe {
        let table = load_table(lj, ntypes);
        let Some((e, staged)) = entry_of(entries, n_entries) else { return };
        let lane = warp::lane_id();
        let (ti, tj) = (lane % CL, lane / CL);
        let src = Source::<XQ, true> { src: x, atom_index, atom_type };
        src.stage_i(e.sci, shift_vector(e.shift, box_x, box_y, box_z), ntypes, staged, lane);
        let p = Lj { table, rc2, sh6, sh12 };
        let mut fi = [Float3::default(); CLUSTERS];
        let mut e_sum = 0.0f32;
        // With PREFETCH: the j-cluster loaded ahead, and its atoms.
        let mut ahead: Option<(u32, JAtoms)> = None;
        for_each_round(j_list, e.j_start, e.j_end, lane, |_, mine| {
            visit_words(mine, |word, _, next| {
                let (cj, ncj, mask) = (word >> NBNXM_MASK_BITS, next >> NBNXM_MASK_BITS, word & MASK);
                let j = match ahead {
                    Some((c, j)) if PREFETCH && c == cj => j,
                    _ => src.load(cj, tj),
                };
                // The next j-cluster's first stage before this one's pairs, its second after them.
                let next_first = if PREFETCH { Some(src.stage1(ncj, tj)) } else { None };
                let (fa, fb) = match own_super(&e, cj) {
                    Some(kj) => j_cluster::<ENERGY, true>(&p, staged, mask, kj, ti, tj, &j, &mut fi, &mut e_sum),
                    None => j_cluster::<ENERGY, false>(&p, staged, mask, 0, ti, tj, &j, &mut fi, &mut e_sum),
                };
                ahead = next_first.map(|r| (ncj, src.stage2(r)));
                add_j_forces(f, ti, fa, fb, j.ia, j.ib);
            });
        });
        add_i_forces(f, atom_index, e.sci, ti, tj, &fi);
        if ENERGY {
            add_energy(energy, e_sum);
        }
    }
}

/// The prune kernels: `j_inner[w]` = `j_outer[w]` with mask bit `k` kept only if some atom pair of
/// i-cluster `k` and the j-cluster (on the self cluster pair only `ti < tj`) is closer than
/// `sqrt(rlist2)`. Each lane sets bit `k` for its pairs, one `redux.sync.or` per j-cluster gives
/// the warp's mask, and the lane that loaded the word stores it (one coalesced store per 32 words).
///
/// # Safety
/// As [`forces`] without types and table ([`NBNXM_SHARED_BYTES`] of dynamic shared memory);
/// `j_inner` has as many words as `j_outer`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn prune<const XQ: bool, const PREFETCH: bool>(
    x: *const u8, atom_index: *const u32, entries: *const NbnxmEntry, n_entries: u32, j_outer: *const u32, j_inner: *mut u32, box_x: f32,
    box_y: f32, box_z: f32, rlist2: f32,
) {
    // SAFETY: as in `forces`; no block barrier here, so a warp may leave early.
    unsafe {
        let Some((e, staged)) = entry_of(entries, n_entries) else { return };
        let lane = warp::lane_id();
        let (ti, tj) = (lane % CL, lane / CL);
        let src = Source::<XQ, false> { src: x, atom_index, atom_type: core::ptr::null() };
        src.stage_i(e.sci, shift_vector(e.shift, box_x, box_y, box_z), 0, staged, lane);
        let mut ahead: Option<(u32, JAtoms)> = None;
        for_each_round(j_outer, e.j_start, e.j_end, lane, |w, mine| {
            let mut kept_mine = 0u32;
            visit_words(mine, |word, from, next| {
                let (cj, ncj, mask) = (word >> NBNXM_MASK_BITS, next >> NBNXM_MASK_BITS, word & MASK);
                let j = match ahead {
                    Some((c, j)) if PREFETCH && c == cj => j,
                    _ => src.load(cj, tj),
                };
                let next_first = if PREFETCH { Some(src.stage1(ncj, tj)) } else { None };
                let bits = match own_super(&e, cj) {
                    Some(kj) => hits::<true>(staged, mask, kj, ti, tj, &j, rlist2),
                    None => hits::<false>(staged, mask, 0, ti, tj, &j, rlist2),
                };
                ahead = next_first.map(|r| (ncj, src.stage2(r)));
                let kept = warp::reduce_or_u32(FULL, bits);
                if lane == from {
                    kept_mine = kept;
                }
            });
            if w < e.j_end {
                *j_inner.add(w as usize) = (mine & !MASK) | kept_mine;
            }
        });
    }
}

/// Declares one force / force+energy / prune kernel triple of the tiled design.
macro_rules! tiled_kernels {
    ($forces:ident, $energy:ident, $prune:ident, xq: $xq:literal, prefetch: $pf:literal, $what:literal) => {
        kernel! {
            #[doc = concat!("Forces of a cluster-pair list, ", $what, ". See [`crate::abi::NBNXM_FORCES`] (same arguments).")]
            fn $forces(
                x: *const u8, atom_index: *const u32, atom_type: *const u32, entries: *const NbnxmEntry, n_entries: u32,
                j_list: *const u32, lj: *const [f32; 2], ntypes: u32, f: *mut Float3, energy: *mut f64,
                box_x: f32, box_y: f32, box_z: f32, rc2: f32, sh6: f32, sh12: f32,
            ) {
                // SAFETY: forwarded; the host's contract is on `forces`.
                unsafe {
                    forces::<false, $xq, $pf>(x, atom_index, atom_type, entries, n_entries, j_list, lj, ntypes, f, energy, box_x, box_y, box_z, rc2, sh6, sh12)
                }
            }
        }
        kernel! {
            #[doc = concat!("Forces and energy of a cluster-pair list, ", $what, ". See [`crate::abi::NBNXM_FORCES_ENERGY`].")]
            fn $energy(
                x: *const u8, atom_index: *const u32, atom_type: *const u32, entries: *const NbnxmEntry, n_entries: u32,
                j_list: *const u32, lj: *const [f32; 2], ntypes: u32, f: *mut Float3, energy: *mut f64,
                box_x: f32, box_y: f32, box_z: f32, rc2: f32, sh6: f32, sh12: f32,
            ) {
                // SAFETY: forwarded.
                unsafe {
                    forces::<true, $xq, $pf>(x, atom_index, atom_type, entries, n_entries, j_list, lj, ntypes, f, energy, box_x, box_y, box_z, rc2, sh6, sh12)
                }
            }
        }
        kernel! {
            #[doc = concat!("The inner list, ", $what, ". See [`crate::abi::NBNXM_PRUNE`] (same arguments).")]
            fn $prune(
                x: *const u8, atom_index: *const u32, entries: *const NbnxmEntry, n_entries: u32,
                j_outer: *const u32, j_inner: *mut u32, box_x: f32, box_y: f32, box_z: f32, rlist2: f32,
            ) {
                // SAFETY: forwarded.
                unsafe { prune::<$xq, $pf>(x, atom_index, entries, n_entries, j_outer, j_inner, box_x, box_y, box_z, rlist2) }
            }
        }
    };
}

tiled_kernels!(nbnxm_forces_ind, nbnxm_forces_energy_ind, nbnxm_prune_ind, xq: false, prefetch: false, "j-atoms through the slot index");
tiled_kernels!(nbnxm_forces_pf, nbnxm_forces_energy_pf, nbnxm_prune_pf, xq: false, prefetch: true, "j-atoms through the slot index, prefetched");
tiled_kernels!(nbnxm_forces_xq, nbnxm_forces_energy_xq, nbnxm_prune_xq, xq: true, prefetch: true, "atoms from the cluster-ordered copy, prefetched");

kernel! {
    /// The cluster-ordered copy for the `_xq` kernels: `xq[s] = [x, y, z, bits(8 type)]` of the
    /// atom in slot `s` for `s` in `first .. first + n` (padding: far away, type 0). One thread per
    /// slot, grid-stride. See [`crate::abi::NBNXM_GATHER_XQ`].
    ///
    /// # Safety
    /// `atom_index`, `atom_type` and `xq` cover the slots; non-filler indices are inside `x`; `xq`
    /// is 16-byte aligned.
    fn nbnxm_gather_xq(x: *const Float3, atom_index: *const u32, atom_type: *const u32, first: u32, n: u32, xq: *mut [f32; 4]) {
        let mut i = thread::index_1d();
        while i < n {
            let s = (first + i) as usize;
            // SAFETY: the host's contract.
            unsafe {
                let idx = *atom_index.add(s);
                let w = f32::from_bits(*atom_type.add(s) * 8);
                let v = if idx != NBNXM_FILLER {
                    let p = *x.add(idx as usize);
                    [p.x, p.y, p.z, w]
                } else {
                    [FAR_J, FAR_J, FAR_J, f32::from_bits(0)]
                };
                *(xq as *mut Xq).add(s) = Xq(v);
            }
            i += thread::grid_stride_x();
        }
    }
}
