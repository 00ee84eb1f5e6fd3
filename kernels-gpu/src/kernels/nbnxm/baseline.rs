//! The first nbnxm kernels (see the parent module for the layout they share): per j-list word a
//! global load of the word, of the two j-atoms' slot indices, coordinates and types, and per
//! pair a global load of the LJ table entry. Kept to measure the [`super::tiled`] designs against.
//! Coordinates are read through `atom_index` from the exchange's array (home atoms, then each
//! pulse's halo), so no gather kernel runs before the forces and no scatter after them.

use super::{CL, FAR_I, FAR_J, FULL, MASK, Staged, add_energy, add_i_forces, add_j_forces, shift_vector};
use crate::abi::{
    Float3, NBNXM_CENTRAL_SHIFT, NBNXM_CLUSTERS_PER_SUPER, NBNXM_FILLER, NBNXM_MASK_BITS, NBNXM_SUPER_SIZE, NBNXM_WARPS_PER_BLOCK, NbnxmEntry,
};
use crate::device::{math, shared, thread, warp};

/// Stages the 64 i-atoms of supercluster `sci`, moved by `shift`, into this warp's slice of shared
/// memory: `[x, y, z, bits(type * ntypes)]` (the type row only when `TYPES`). Lane `l` writes
/// slots `l` and `l + 32`; the warp barrier at the end publishes them to every lane.
///
/// # Safety
/// All lanes of the warp call it together; the arrays cover the supercluster's slots; `staged`
/// is this warp's 64-entry slice.
#[inline(always)]
unsafe fn stage_i_atoms<const TYPES: bool>(
    x: *const Float3, atom_index: *const u32, atom_type: *const u32, ntypes: u32, sci: u32, shift: Float3, staged: *mut Staged,
    lane: u32,
) {
    let mut s = lane;
    while s < NBNXM_SUPER_SIZE {
        let slot = (sci * NBNXM_SUPER_SIZE + s) as usize;
        // SAFETY: the host sized atom_index / atom_type for every slot and every index is local.
        unsafe {
            let idx = *atom_index.add(slot);
            let row = if TYPES { *atom_type.add(slot) * ntypes } else { 0 };
            let v = if idx != NBNXM_FILLER {
                let p = *x.add(idx as usize);
                [p.x + shift.x, p.y + shift.y, p.z + shift.z, f32::from_bits(row)]
            } else {
                [FAR_I, FAR_I, FAR_I, f32::from_bits(row)]
            };
            *staged.add(s as usize) = Staged(v);
        }
        s += warp::WARP_SIZE;
    }
    // SAFETY: every lane reaches this call (the loop above has the same trip count on all lanes).
    unsafe { warp::sync_warp(FULL) };
}

/// Coordinates and local index of the j-atom in `slot` (a padding slot: far away, `NBNXM_FILLER`).
///
/// # Safety
/// `slot` is inside the arrays; non-filler indices are inside `x`.
#[inline(always)]
unsafe fn load_j(x: *const Float3, atom_index: *const u32, slot: u32) -> (Float3, u32) {
    // SAFETY: forwarded.
    unsafe {
        let idx = *atom_index.add(slot as usize);
        if idx != NBNXM_FILLER { (*x.add(idx as usize), idx) } else { (Float3::new(FAR_J, FAR_J, FAR_J), idx) }
    }
}

/// Squared distance and displacement `xj - xi`.
#[inline(always)]
fn displacement(xi: [f32; 4], xj: Float3) -> (Float3, f32) {
    let d = Float3::new(xj.x - xi[0], xj.y - xi[1], xj.z - xi[2]);
    (d, math::fma_f32(d.x, d.x, math::fma_f32(d.y, d.y, d.z * d.z)))
}

/// Constants of the pair interaction.
#[derive(Clone, Copy)]
struct Lj {
    /// `[6 c6, 12 c12]` per type pair (8-byte aligned: one 64-bit load per pair).
    table: *const u64,
    rc2: f32,
    /// `rc^-6` and `rc^-12`: the potential shift.
    sh6: f32,
    sh12: f32,
}

/// One atom pair: if `on` and within the cutoff, adds the LJ force to `fi` (on the i-atom) and
/// `fj` (its reaction) and, with `ENERGY`, the shifted potential to `e`. Pairs that are off or
/// beyond the cutoff add exactly zero (selects, never a multiplication by a mask, so the
/// infinity of a zero distance cannot leak).
#[inline(always)]
fn lj_pair<const ENERGY: bool>(p: &Lj, xi: [f32; 4], xj: Float3, tj: u32, on: bool, fi: &mut Float3, fj: &mut Float3, e: &mut f32) {
    let (d, r2) = displacement(xi, xj);
    let within = on && r2 < p.rc2;
    let rinv2 = math::rcp_approx_f32(r2);
    let rinv6 = rinv2 * rinv2 * rinv2;
    // SAFETY: type rows and types are below ntypes (fillers have type 0), the table has ntypes²
    // entries of 8 bytes in an allocation aligned far beyond 8.
    let bits = unsafe { *p.table.add((xi[3].to_bits() + tj) as usize) };
    let c = [f32::from_bits(bits as u32), f32::from_bits((bits >> 32) as u32)];
    let fscal = math::fma_f32(c[1], rinv6, -c[0]) * (rinv6 * rinv2);
    let s = if within { fscal } else { 0.0 };
    *fi = Float3::new(math::fma_f32(-s, d.x, fi.x), math::fma_f32(-s, d.y, fi.y), math::fma_f32(-s, d.z, fi.z));
    *fj = Float3::new(math::fma_f32(s, d.x, fj.x), math::fma_f32(s, d.y, fj.y), math::fma_f32(s, d.z, fj.z));
    if ENERGY {
        let v = c[1] * (1.0 / 12.0) * (rinv6 * rinv6 - p.sh12) - c[0] * (1.0 / 6.0) * (rinv6 - p.sh6);
        *e += if within { v } else { 0.0 };
    }
}

/// The force kernel (see the module docs); `ENERGY` also sums the shifted potential.
///
/// # Safety
/// A list built by the host for these arrays: slots `sci * 64 ..` and `cj * 8 ..` inside
/// `atom_index` / `atom_type`, indices inside `x` and `f`, types below `ntypes`, `lj` holding
/// `ntypes²` entries; launched with [`NBNXM_WARPS_PER_BLOCK`] warps per block and
/// [`crate::abi::NBNXM_SHARED_BYTES`] of dynamic shared memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn forces<const ENERGY: bool>(
    x: *const Float3, atom_index: *const u32, atom_type: *const u32, entries: *const NbnxmEntry, n_entries: u32,
    j_list: *const u32, lj: *const [f32; 2], ntypes: u32, f: *mut Float3, energy: *mut f64, box_x: f32, box_y: f32,
    box_z: f32, rc2: f32, sh6: f32, sh12: f32,
) {
    let warp_in_block = warp::warp_id();
    let entry = thread::block_idx_x() * NBNXM_WARPS_PER_BLOCK + warp_in_block;
    if entry >= n_entries {
        return; // the whole warp: its entry index is warp-uniform
    }
    let lane = warp::lane_id();
    let (ti, tj) = (lane % CL, lane / CL);
    let p = Lj { table: lj as *const u64, rc2, sh6, sh12 };
    // SAFETY: the launch gives each warp NBNXM_SUPER_SIZE staged atoms; the host's list is valid.
    unsafe {
        let e = *entries.add(entry as usize);
        let staged = (shared::dynamic_shared_mem() as *mut Staged).add((warp_in_block * NBNXM_SUPER_SIZE) as usize);
        stage_i_atoms::<true>(x, atom_index, atom_type, ntypes, e.sci, shift_vector(e.shift, box_x, box_y, box_z), staged, lane);
        let central = e.shift == NBNXM_CENTRAL_SHIFT;
        let ci0 = e.sci * NBNXM_CLUSTERS_PER_SUPER;
        let mut fi = [Float3::default(); NBNXM_CLUSTERS_PER_SUPER as usize];
        let mut e_sum = 0.0f32;
        for w in e.j_start..e.j_end {
            let word = *j_list.add(w as usize);
            let mask = word & MASK;
            if mask == 0 {
                continue; // warp-uniform: every lane read the same word
            }
            let cj = word >> NBNXM_MASK_BITS;
            let (sa, sb) = (cj * CL + tj, cj * CL + tj + 4);
            let (xa, ia) = load_j(x, atom_index, sa);
            let (xb, ib) = load_j(x, atom_index, sb);
            let (ta, tb) = (*atom_type.add(sa as usize), *atom_type.add(sb as usize));
            let (mut fa, mut fb) = (Float3::default(), Float3::default());
            each_i_cluster!(K => {
                if mask & (1 << K) != 0 {
                    let xi = (*staged.add(K * CL as usize + ti as usize)).0;
                    // The self cluster pair: each atom pair once, ti < tj.
                    let diag = central && cj == ci0 + K as u32;
                    lj_pair::<ENERGY>(&p, xi, xa, ta, !diag || ti < tj, &mut fi[K], &mut fa, &mut e_sum);
                    lj_pair::<ENERGY>(&p, xi, xb, tb, !diag || ti < tj + 4, &mut fi[K], &mut fb, &mut e_sum);
                }
            });
            add_j_forces(f, ti, fa, fb, ia, ib);
        }
        add_i_forces(f, atom_index, e.sci, ti, tj, &fi);
        if ENERGY {
            add_energy(energy, e_sum);
        }
    }
}

kernel! {
    /// Forces of a cluster-pair list (no energy). See [`crate::abi::NBNXM_FORCES`].
    fn nbnxm_forces(
        x: *const Float3, atom_index: *const u32, atom_type: *const u32, entries: *const NbnxmEntry, n_entries: u32,
        j_list: *const u32, lj: *const [f32; 2], ntypes: u32, f: *mut Float3, energy: *mut f64,
        box_x: f32, box_y: f32, box_z: f32, rc2: f32, sh6: f32, sh12: f32,
    ) {
        // SAFETY: forwarded; the host's contract is on `forces`.
        unsafe { forces::<false>(x, atom_index, atom_type, entries, n_entries, j_list, lj, ntypes, f, energy, box_x, box_y, box_z, rc2, sh6, sh12) }
    }
}

kernel! {
    /// Forces and energy of a cluster-pair list. See [`crate::abi::NBNXM_FORCES_ENERGY`].
    fn nbnxm_forces_energy(
        x: *const Float3, atom_index: *const u32, atom_type: *const u32, entries: *const NbnxmEntry, n_entries: u32,
        j_list: *const u32, lj: *const [f32; 2], ntypes: u32, f: *mut Float3, energy: *mut f64,
        box_x: f32, box_y: f32, box_z: f32, rc2: f32, sh6: f32, sh12: f32,
    ) {
        // SAFETY: forwarded.
        unsafe { forces::<true>(x, atom_index, atom_type, entries, n_entries, j_list, lj, ntypes, f, energy, box_x, box_y, box_z, rc2, sh6, sh12) }
    }
}

kernel! {
    /// The inner list: `j_inner[w]` = `j_outer[w]` with mask bit `k` kept only if some atom pair of
    /// i-cluster `k` and the j-cluster (with the entry's shift; on the self cluster pair only
    /// `ti < tj`) is closer than `sqrt(rlist2)` now. Same warp layout and launch as the forces.
    ///
    /// # Safety
    /// As the force kernel; `j_inner` has as many words as `j_outer`.
    fn nbnxm_prune(
        x: *const Float3, atom_index: *const u32, entries: *const NbnxmEntry, n_entries: u32,
        j_outer: *const u32, j_inner: *mut u32, box_x: f32, box_y: f32, box_z: f32, rlist2: f32,
    ) {
        let warp_in_block = warp::warp_id();
        let entry = thread::block_idx_x() * NBNXM_WARPS_PER_BLOCK + warp_in_block;
        if entry >= n_entries {
            return;
        }
        let lane = warp::lane_id();
        let (ti, tj) = (lane % CL, lane / CL);
        // SAFETY: as in `forces`.
        unsafe {
            let e = *entries.add(entry as usize);
            let staged = (shared::dynamic_shared_mem() as *mut Staged).add((warp_in_block * NBNXM_SUPER_SIZE) as usize);
            stage_i_atoms::<false>(x, atom_index, core::ptr::null(), 0, e.sci, shift_vector(e.shift, box_x, box_y, box_z), staged, lane);
            let central = e.shift == NBNXM_CENTRAL_SHIFT;
            let ci0 = e.sci * NBNXM_CLUSTERS_PER_SUPER;
            for w in e.j_start..e.j_end {
                let word = *j_outer.add(w as usize);
                let mask = word & MASK;
                let cj = word >> NBNXM_MASK_BITS;
                let mut kept = 0u32;
                if mask != 0 {
                    let (xa, _) = load_j(x, atom_index, cj * CL + tj);
                    let (xb, _) = load_j(x, atom_index, cj * CL + tj + 4);
                    each_i_cluster!(K => {
                        if mask & (1 << K) != 0 {
                            let xi = (*staged.add(K * CL as usize + ti as usize)).0;
                            let diag = central && cj == ci0 + K as u32;
                            let hit_a = (!diag || ti < tj) && displacement(xi, xa).1 < rlist2;
                            let hit_b = (!diag || ti < tj + 4) && displacement(xi, xb).1 < rlist2;
                            // Warp-uniform branch: every lane votes.
                            if warp::warp_vote_any(FULL, hit_a || hit_b) {
                                kept |= 1 << K;
                            }
                        }
                    });
                }
                if lane == 0 {
                    *j_inner.add(w as usize) = (word & !MASK) | kept;
                }
            }
        }
    }
}
