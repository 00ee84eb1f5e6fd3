//! The nbnxm force and prune kernels (see the parent module for the block and tile layout):
//! - a warp's share of the entry's j-list words is loaded 32 at a time, one per lane (lane `l` of
//!   warp `w` holds word `j_start + w + W (32 r + l)` in round `r`); a ballot of the words with a
//!   nonzero mask gives the j-clusters to visit, each broadcast from its lane with one shuffle, so
//!   the zero words a prune leaves cost nothing;
//! - the LJ table `[-6 c6, 12 c12]` per type pair sits in shared memory, read with one 8-byte
//!   shared load per pair at `row(type_i) + 8 type_j` bytes (both offsets precomputed: one add);
//! - the cutoff is folded into `1/r²` (zero beyond it: one compare and one select per pair, the
//!   force then vanishes by itself), and the self cluster pair, where only `ti < tj` counts, is a
//!   separate instantiation of the j-cluster body entered by a warp-uniform branch, so the common
//!   path has no per-pair exclusion test;
//! - per pair (SASS of the common path): 3 subtractions, `r²` (1 multiply, 2 FMAs), compare, a
//!   zero and a predicated `rcp`, `1/r⁶` and `1/r⁸` (3 multiplies), the table load and its
//!   address, the force scalar (1 FMA, 1 multiply) and 6 FMAs into the i- and j-forces: 23
//!   instructions, 17 of them FP32; per i-cluster one 16-byte shared load for two pairs;
//! - every kernel first waits for the kernel before it on its stream (`griddepcontrol.wait`), so
//!   the host may launch it to overlap that kernel's end (programmatic dependent launch).
//!
//! Designs (one instantiation each, the host picks one, `NbnxmKernel`):
//! - `_ind`: j-atoms through the slot index: `atom_index`, then `x` and the slot's type;
//! - `_pf`: the same with the next j-cluster's loads issued before the current one is computed
//!   (its indices and types before the i-cluster loop, its coordinates after it);
//! - `_pfw`: `_pf` whose warps add their i-forces and energy themselves, with no block barrier
//!   (its prune is `_pf`'s).

use super::{
    Block, CL, CLUSTERS, FAR_I, FAR_J, FULL, MASK, Staged, add_i_forces_and_energy, add_i_forces_and_energy_per_warp, add_j_forces, shift_vector,
};
use crate::abi::{Float3, NBNXM_CENTRAL_SHIFT, NBNXM_CLUSTERS_PER_SUPER, NBNXM_FILLER, NBNXM_MASK_BITS, NBNXM_SUPER_SIZE, NbnxmEntry};
use crate::device::{math, sync_threads, warp};

/// A j-cluster's first-stage loads for this lane: slot indices of atoms `tj` and `tj + 4` and
/// their types as byte offsets into a table row.
#[derive(Clone, Copy)]
struct JRef {
    ia: u32,
    ib: u32,
    wa: f32,
    wb: f32,
}

/// A j-cluster ready to compute: the two atoms `[x, y, z, bits(8 type)]` and their local indices.
#[derive(Clone, Copy)]
struct JAtoms {
    a: [f32; 4],
    b: [f32; 4],
    ia: u32,
    ib: u32,
}

/// Where the atoms come from: the exchange's coordinate array `x`, read through `atom_index`, and
/// the types from `atom_type` when `TYPES` (the prune needs none: the type offsets are then 0).
#[derive(Clone, Copy)]
struct Source<const TYPES: bool> {
    x: *const Float3,
    atom_index: *const u32,
    atom_type: *const u32,
}

impl<const TYPES: bool> Source<TYPES> {
    /// The loads that need nothing loaded before: slot indices and types.
    ///
    /// # Safety
    /// `cj`'s slots are inside the arrays.
    #[inline(always)]
    unsafe fn stage1(&self, cj: u32, tj: u32) -> JRef {
        let (sa, sb) = ((cj * CL + tj) as usize, (cj * CL + tj + 4) as usize);
        // SAFETY: the host's list only names clusters of this grid.
        unsafe {
            let off = |s: usize| if TYPES { f32::from_bits(*self.atom_type.add(s) * 8) } else { 0.0 };
            JRef { ia: *self.atom_index.add(sa), ib: *self.atom_index.add(sb), wa: off(sa), wb: off(sb) }
        }
    }

    /// The loads that wait for [`Self::stage1`]: the coordinates behind the slot indices.
    ///
    /// # Safety
    /// Non-filler indices are inside the coordinate array.
    #[inline(always)]
    unsafe fn stage2(&self, r: JRef) -> JAtoms {
        // SAFETY: forwarded.
        let at = |i: u32, w: f32| unsafe {
            if i != NBNXM_FILLER {
                let p = *self.x.add(i as usize);
                [p.x, p.y, p.z, w]
            } else {
                [FAR_J, FAR_J, FAR_J, w]
            }
        };
        JAtoms { a: at(r.ia, r.wa), b: at(r.ib, r.wb), ia: r.ia, ib: r.ib }
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

    /// Stages the 64 i-atoms of the block's supercluster, moved by its shift, into shared memory:
    /// `[x, y, z, bits(row)]` with `row = 8 ntypes type` bytes (the type's table row; 0 without
    /// `TYPES`), padding at `FAR_I`; with `TYPES` also each slot's atom index (the force blocks
    /// add the i-forces through it). Thread `t` of the block writes slots `t, t + 32 W, ...`; the
    /// caller's block barrier publishes them.
    ///
    /// # Safety
    /// All threads of the block together; the supercluster's slots are inside the arrays; a force
    /// launch when `TYPES`.
    #[inline(always)]
    unsafe fn stage_i(&self, b: &Block, shift: Float3, ntypes: u32) {
        let mut s = b.tid;
        while s < NBNXM_SUPER_SIZE {
            let slot = (b.e.sci * NBNXM_SUPER_SIZE + s) as usize;
            // SAFETY: forwarded; s < 64, inside the staged atoms and slot indices.
            unsafe {
                let i = *self.atom_index.add(slot);
                let row = if TYPES { *self.atom_type.add(slot) * 8 * ntypes } else { 0 };
                let v = if i != NBNXM_FILLER {
                    let p = *self.x.add(i as usize);
                    [p.x + shift.x, p.y + shift.y, p.z + shift.z, f32::from_bits(row)]
                } else {
                    [FAR_I, FAR_I, FAR_I, f32::from_bits(row)]
                };
                *b.staged().add(s as usize) = Staged(v);
                if TYPES {
                    *b.slots().add(s as usize) = i;
                }
            }
            s += b.threads;
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
/// `staged` is the block's staged supercluster, published by a barrier.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn j_cluster<const ENERGY: bool, const DIAG: bool>(
    p: &Lj,
    staged: *const Staged,
    mask: u32,
    kj: u32,
    ti: u32,
    tj: u32,
    j: &JAtoms,
    fi: &mut [Float3; CLUSTERS],
    e: &mut f32,
) -> (Float3, Float3) {
    let (mut fa, mut fb) = (Float3::default(), Float3::default());
    each_i_cluster!(K => {
        if mask & (1 << K) != 0 {
            // SAFETY: 64 staged atoms.
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
/// `staged` is the block's staged supercluster, published by a barrier.
#[inline(always)]
unsafe fn hits<const DIAG: bool>(staged: *const Staged, mask: u32, kj: u32, ti: u32, tj: u32, j: &JAtoms, rlist2: f32) -> u32 {
    let r2 = |xi: [f32; 4], xj: [f32; 4]| {
        let (dx, dy, dz) = (xj[0] - xi[0], xj[1] - xi[1], xj[2] - xi[2]);
        math::fma_f32(dx, dx, math::fma_f32(dy, dy, dz * dz))
    };
    let mut bits = 0u32;
    each_i_cluster!(K => {
        if mask & (1 << K) != 0 {
            // SAFETY: 64 staged atoms.
            let xi = unsafe { (*staged.add(K * CL as usize + ti as usize)).0 };
            let own = DIAG && K as u32 == kj;
            let a = r2(xi, j.a) < rlist2 && !(own && ti >= tj);
            let b = r2(xi, j.b) < rlist2 && !(own && ti >= tj + 4);
            bits |= u32::from(a || b) << K;
        }
    });
    bits
}

/// Calls `round(w, word)` for this warp's share of the entry's words, 32 at a time: lane `l` gets
/// `w = j_start + warp + warps (32 r + l)` in round `r` and that word (0 when `w >= j_end`); the
/// rounds run while the warp has words left (none when the entry has at most `warp` words).
///
/// # Safety
/// All lanes of the warp together; `j_list[j_start..j_end]` is valid.
#[inline(always)]
unsafe fn for_each_round(j_list: *const u32, b: &Block, mut round: impl FnMut(u32, u32)) {
    let mut base = b.e.j_start + b.warp;
    while base < b.e.j_end {
        let w = base + b.lane * b.warps;
        // SAFETY: w < j_end is inside the list.
        let word = if w < b.e.j_end { unsafe { *j_list.add(w as usize) } } else { 0 };
        round(w, word);
        base += warp::WARP_SIZE * b.warps;
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

/// Copies the LJ table into the block's shared memory, negating the `6 c6` column; the caller's
/// block barrier publishes it. Every thread of the block calls it.
///
/// # Safety
/// A force launch for `ntypes` types; `lj` holds `ntypes²` entries.
#[inline(always)]
unsafe fn load_table(b: &Block, lj: *const [f32; 2], ntypes: u32) {
    // SAFETY: the launch reserves the table; k < ntypes².
    unsafe {
        let table = b.table();
        let mut k = b.tid;
        while k < ntypes * ntypes {
            let c = *lj.add(k as usize);
            *table.add(k as usize) = [-c[0], c[1]];
            k += b.threads;
        }
    }
}

/// Whether j-cluster `cj` is one of the entry's own i-clusters under no shift (the self cluster
/// pair lies among its pairs): warp-uniform.
#[inline(always)]
fn own_super(e: &NbnxmEntry, cj: u32) -> Option<u32> {
    let ci0 = e.sci * NBNXM_CLUSTERS_PER_SUPER;
    (e.shift == NBNXM_CENTRAL_SHIFT && cj >= ci0 && cj < ci0 + NBNXM_CLUSTERS_PER_SUPER).then(|| cj - ci0)
}

/// The force kernels (see the module docs); `ENERGY` also sums the shifted potential, `PER_WARP`
/// adds the i-forces and energy warp by warp ([`add_i_forces_and_energy_per_warp`]) instead of
/// once per block behind a barrier.
///
/// # Safety
/// A list built by the host for these arrays: slots `sci * 64 ..` and `cj * 8 ..` inside
/// `atom_index` / `atom_type`, indices inside `x` and `f`, types below `ntypes`, `lj` holding
/// `ntypes²` entries, `order` a permutation of `0..n_entries`; launched as
/// [`crate::abi::NBNXM_KERNELS`] says (one block per entry, a whole number of warps,
/// [`crate::abi::nbnxm_force_shared_bytes`]`(ntypes, warps)`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn forces<const ENERGY: bool, const PREFETCH: bool, const PER_WARP: bool>(
    x: *const Float3,
    atom_index: *const u32,
    atom_type: *const u32,
    entries: *const NbnxmEntry,
    order: *const u32,
    n_entries: u32,
    j_list: *const u32,
    lj: *const [f32; 2],
    ntypes: u32,
    f: *mut Float3,
    energy: *mut f64,
    box_x: f32,
    box_y: f32,
    box_z: f32,
    rc2: f32,
    sh6: f32,
    sh12: f32,
) {
    // Launched to overlap the kernel before it (the MD step's local stream): nothing is read or
    // written before that kernel is done.
    crate::device::wait_for_previous_kernel();
    // SAFETY: the host's contract (above) covers every access; the whole block leaves together
    // (block-uniform entry test) or reaches every barrier (the loops below are warp-uniform; with
    // `PER_WARP` the staging's is the only one).
    unsafe {
        let Some(b) = Block::of(entries, order, n_entries) else { return };
        let (ti, tj) = (b.lane % CL, b.lane / CL);
        let src = Source::<true> { x, atom_index, atom_type };
        load_table(&b, lj, ntypes);
        src.stage_i(&b, shift_vector(b.e.shift, box_x, box_y, box_z), ntypes);
        sync_threads();
        let staged = b.staged() as *const Staged;
        let p = Lj { table: b.table() as *const u8, rc2, sh6, sh12 };
        let mut fi = [Float3::default(); CLUSTERS];
        let mut e_sum = 0.0f32;
        // With PREFETCH: the j-cluster loaded ahead, and its atoms.
        let mut ahead: Option<(u32, JAtoms)> = None;
        for_each_round(j_list, &b, |_, mine| {
            visit_words(mine, |word, _, next| {
                let (cj, ncj, mask) = (word >> NBNXM_MASK_BITS, next >> NBNXM_MASK_BITS, word & MASK);
                let j = match ahead {
                    Some((c, j)) if PREFETCH && c == cj => j,
                    _ => src.load(cj, tj),
                };
                // The next j-cluster's first stage before this one's pairs, its second after them.
                let next_first = if PREFETCH { Some(src.stage1(ncj, tj)) } else { None };
                let (fa, fb) = match own_super(&b.e, cj) {
                    Some(kj) => j_cluster::<ENERGY, true>(&p, staged, mask, kj, ti, tj, &j, &mut fi, &mut e_sum),
                    None => j_cluster::<ENERGY, false>(&p, staged, mask, 0, ti, tj, &j, &mut fi, &mut e_sum),
                };
                ahead = next_first.map(|r| (ncj, src.stage2(r)));
                add_j_forces(f, ti, fa, fb, j.ia, j.ib);
            });
        });
        if PER_WARP {
            add_i_forces_and_energy_per_warp::<ENERGY>(&b, f, energy, ti, tj, &fi, e_sum);
        } else {
            add_i_forces_and_energy::<ENERGY>(&b, ntypes, f, energy, ti, tj, &fi, e_sum);
        }
    }
}

/// The prune kernels: `j_inner[w]` = `j_outer[w]` with mask bit `k` kept only if some atom pair of
/// i-cluster `k` and the j-cluster (on the self cluster pair only `ti < tj`) is closer than
/// `sqrt(rlist2)`. Each lane sets bit `k` for its pairs, one `redux.sync.or` per j-cluster gives
/// the warp's mask, and the lane that loaded the word stores it (one store instruction per round).
///
/// # Safety
/// As [`forces`] without types and table, launched with [`crate::abi::NBNXM_PRUNE_SHARED_BYTES`] of
/// dynamic shared memory; `j_inner` has as many words as `j_outer`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn prune<const PREFETCH: bool>(
    x: *const Float3,
    atom_index: *const u32,
    entries: *const NbnxmEntry,
    order: *const u32,
    n_entries: u32,
    j_outer: *const u32,
    j_inner: *mut u32,
    box_x: f32,
    box_y: f32,
    box_z: f32,
    rlist2: f32,
) {
    // As in `forces`.
    crate::device::wait_for_previous_kernel();
    // SAFETY: as in `forces`; the one barrier is reached by every thread of a block that has an entry.
    unsafe {
        let Some(b) = Block::of(entries, order, n_entries) else { return };
        let (ti, tj) = (b.lane % CL, b.lane / CL);
        let src = Source::<false> { x, atom_index, atom_type: core::ptr::null() };
        src.stage_i(&b, shift_vector(b.e.shift, box_x, box_y, box_z), 0);
        sync_threads();
        let staged = b.staged() as *const Staged;
        let mut ahead: Option<(u32, JAtoms)> = None;
        for_each_round(j_outer, &b, |w, mine| {
            let mut kept_mine = 0u32;
            visit_words(mine, |word, from, next| {
                let (cj, ncj, mask) = (word >> NBNXM_MASK_BITS, next >> NBNXM_MASK_BITS, word & MASK);
                let j = match ahead {
                    Some((c, j)) if PREFETCH && c == cj => j,
                    _ => src.load(cj, tj),
                };
                let next_first = if PREFETCH { Some(src.stage1(ncj, tj)) } else { None };
                let bits = match own_super(&b.e, cj) {
                    Some(kj) => hits::<true>(staged, mask, kj, ti, tj, &j, rlist2),
                    None => hits::<false>(staged, mask, 0, ti, tj, &j, rlist2),
                };
                ahead = next_first.map(|r| (ncj, src.stage2(r)));
                let kept = warp::reduce_or_u32(FULL, bits);
                if b.lane == from {
                    kept_mine = kept;
                }
            });
            if w < b.e.j_end {
                *j_inner.add(w as usize) = (mine & !MASK) | kept_mine;
            }
        });
    }
}

/// Declares one force / force+energy kernel pair.
macro_rules! nbnxm_force_kernels {
    ($forces:ident, $energy:ident, prefetch: $pf:literal, per_warp: $pw:literal, $what:literal) => {
        kernel! {
            #[doc = concat!("Forces of a cluster-pair list, ", $what, ". See [`crate::abi::NBNXM_KERNELS`].")]
            fn $forces(
                x: *const Float3, atom_index: *const u32, atom_type: *const u32, entries: *const NbnxmEntry, order: *const u32,
                n_entries: u32, j_list: *const u32, lj: *const [f32; 2], ntypes: u32, f: *mut Float3, energy: *mut f64,
                box_x: f32, box_y: f32, box_z: f32, rc2: f32, sh6: f32, sh12: f32,
            ) {
                // SAFETY: forwarded; the host's contract is on `forces`.
                unsafe {
                    forces::<false, $pf, $pw>(x, atom_index, atom_type, entries, order, n_entries, j_list, lj, ntypes, f, energy, box_x, box_y, box_z, rc2, sh6, sh12)
                }
            }
        }
        kernel! {
            #[doc = concat!("Forces and energy of a cluster-pair list, ", $what, ". See [`crate::abi::NBNXM_KERNELS`].")]
            fn $energy(
                x: *const Float3, atom_index: *const u32, atom_type: *const u32, entries: *const NbnxmEntry, order: *const u32,
                n_entries: u32, j_list: *const u32, lj: *const [f32; 2], ntypes: u32, f: *mut Float3, energy: *mut f64,
                box_x: f32, box_y: f32, box_z: f32, rc2: f32, sh6: f32, sh12: f32,
            ) {
                // SAFETY: forwarded.
                unsafe {
                    forces::<true, $pf, $pw>(x, atom_index, atom_type, entries, order, n_entries, j_list, lj, ntypes, f, energy, box_x, box_y, box_z, rc2, sh6, sh12)
                }
            }
        }
    };
}

/// Declares one prune kernel.
macro_rules! nbnxm_prune_kernel {
    ($prune:ident, prefetch: $pf:literal, $what:literal) => {
        kernel! {
            #[doc = concat!("The inner list, ", $what, ". See [`crate::abi::NBNXM_KERNELS`].")]
            fn $prune(
                x: *const Float3, atom_index: *const u32, entries: *const NbnxmEntry, order: *const u32, n_entries: u32,
                j_outer: *const u32, j_inner: *mut u32, box_x: f32, box_y: f32, box_z: f32, rlist2: f32,
            ) {
                // SAFETY: forwarded.
                unsafe { prune::<$pf>(x, atom_index, entries, order, n_entries, j_outer, j_inner, box_x, box_y, box_z, rlist2) }
            }
        }
    };
}

nbnxm_force_kernels!(nbnxm_forces_ind, nbnxm_forces_energy_ind, prefetch: false, per_warp: false, "j-atoms through the slot index");
nbnxm_prune_kernel!(nbnxm_prune_ind, prefetch: false, "j-atoms through the slot index");
nbnxm_force_kernels!(nbnxm_forces_pf, nbnxm_forces_energy_pf, prefetch: true, per_warp: false, "j-atoms through the slot index, prefetched");
nbnxm_prune_kernel!(nbnxm_prune_pf, prefetch: true, "j-atoms through the slot index, prefetched");
nbnxm_force_kernels!(
    nbnxm_forces_pfw,
    nbnxm_forces_energy_pfw,
    prefetch: true,
    per_warp: true,
    "j-atoms through the slot index, prefetched, i-forces added warp by warp"
);
