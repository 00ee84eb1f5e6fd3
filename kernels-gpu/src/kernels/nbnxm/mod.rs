//! Cluster-pair non-bonded kernels, after GROMACS's nbnxm GPU layout: atoms sit in clusters of 8
//! slots, an i-entry pairs an i-supercluster (8 clusters, 64 slots) under one periodic shift with a
//! list of j-clusters, and a mask word per j-cluster says which of the 8 i-clusters interact with it.
//!
//! One warp per i-entry. Lane `l` is the tile position `(ti, tj) = (l % 8, l / 8)`: it owns i-atom
//! `ti` of every i-cluster and j-atoms `tj` and `tj + 4` of the current j-cluster, so a masked-in
//! (i-cluster, j-cluster) pair costs each lane two atom pairs.
//! - The 64 i-atoms, shifted once per entry, wait in shared memory (16 bytes each: x, y, z and the
//!   atom's row of the LJ table); the force on each lane's 8 i-atoms stays in registers for the
//!   whole j-list and is reduced over the 4 j-lanes and added (atomically: other warps add to the
//!   same atoms) once per entry.
//! - The j-forces of one j-cluster are reduced over the 8 i-lanes with 9 butterfly shuffles (the
//!   first step also splits the two j-atoms between even and odd lanes) and added with one atomic
//!   per atom and component, by 24 lanes in one instruction. No atomic per pair.
//!
//! Padding slots (`atom_index == NBNXM_FILLER`) take far-away coordinates (i and j fillers far from
//! each other too), so they fail the distance test like any pair beyond the cutoff. The self
//! cluster pair (same cluster, no shift) counts atom pairs `ti < tj` only. Everything else (the
//! half list, which rank owns a pair, the zones) was decided by the host when it built the list.
//!
//! Two designs share these helpers, so that both can be timed in one GPU run
//! (`tests/gpu_nbnxm.rs`, `kernel_times`): [`baseline`] (the first version: a global load per j-list
//! word and per pair for the LJ table) and [`tiled`] (j-list words loaded 32 at a time and skipped
//! by a ballot, the LJ table in shared memory, the cutoff folded into `1/r²`, the self cluster pair
//! on its own path), the latter reading atoms through the slot index or from a cluster-ordered copy.

use crate::abi::{Float3, NBNXM_CLUSTER_SIZE, NBNXM_CLUSTERS_PER_SUPER, NBNXM_FILLER, NBNXM_MASK_BITS, NBNXM_SUPER_SIZE};
use crate::device::{self, warp};

/// Where an i padding slot sits: beyond any cutoff from every real atom and from `FAR_J`.
const FAR_I: f32 = 1.0e5;
/// Where a j padding slot sits.
const FAR_J: f32 = -1.0e5;
const FULL: u32 = warp::FULL_MASK;
const MASK: u32 = (1 << NBNXM_MASK_BITS) - 1;
const CL: u32 = NBNXM_CLUSTER_SIZE;

// The unrolled loops below are written for 8 clusters of 8 atoms.
const _: () = assert!(NBNXM_CLUSTERS_PER_SUPER == 8 && NBNXM_CLUSTER_SIZE == 8);

/// Runs `$body` once for each i-cluster `$k` of a supercluster, with `$k` a constant, so arrays
/// indexed by it are promoted to registers (a loop would leave that to the unroller's mood).
macro_rules! each_i_cluster {
    ($k:ident => $body:block) => {{
        { const $k: usize = 0; $body }
        { const $k: usize = 1; $body }
        { const $k: usize = 2; $body }
        { const $k: usize = 3; $body }
        { const $k: usize = 4; $body }
        { const $k: usize = 5; $body }
        { const $k: usize = 6; $body }
        { const $k: usize = 7; $body }
    }};
}

mod baseline;
mod tiled;

/// One staged i-atom: `[x, y, z, bits(type row)]`, 16-byte aligned so it moves in one vector
/// access.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Staged([f32; 4]);

/// The periodic shift of shift index `s` (see [`crate::abi::NBNXM_CENTRAL_SHIFT`]).
#[inline(always)]
fn shift_vector(s: u32, bx: f32, by: f32, bz: f32) -> Float3 {
    let unit = |v: u32| v as f32 - 1.0;
    Float3::new(unit(s % 3) * bx, unit((s / 3) % 3) * by, unit(s / 9) * bz)
}

/// `f[idx].component += v` (component 0, 1, 2 = x, y, z), relaxed atomic.
///
/// # Safety
/// `idx` is a local atom of `f`; `component < 3`.
#[inline(always)]
unsafe fn add_component(f: *mut Float3, idx: u32, component: u32, v: f32) {
    // SAFETY: forwarded.
    unsafe { device::atomic_add_relaxed_gpu_f32((f.add(idx as usize) as *mut f32).add(component as usize), v) };
}

/// `[a, b, c][i]` without a local-memory array.
#[inline(always)]
fn pick(i: u32, a: f32, b: f32, c: f32) -> f32 {
    if i == 0 {
        a
    } else if i == 1 {
        b
    } else {
        c
    }
}

/// `v` plus lane `lane ^ m`'s `v`: one butterfly step of a warp reduction.
///
/// # Safety
/// All lanes together.
#[inline(always)]
unsafe fn butterfly(v: Float3, m: u32) -> Float3 {
    // SAFETY: forwarded to the caller.
    unsafe {
        Float3::new(v.x + warp::shfl_xor_f32(FULL, v.x, m), v.y + warp::shfl_xor_f32(FULL, v.y, m), v.z + warp::shfl_xor_f32(FULL, v.z, m))
    }
}

/// Reduces the forces on this lane's two j-atoms over the 8 i-lanes and adds them to `f`: the
/// first butterfly step leaves atom `tj` on even lanes and atom `tj + 4` on odd ones (each lane
/// sends the atom it gives up), the next two finish both sums, and lane `ti` then adds component
/// `ti / 2` of its atom (lanes 6 and 7 of each group add nothing).
///
/// # Safety
/// All lanes together; `ia`, `ib` are local atoms of `f` or `NBNXM_FILLER`.
#[inline(always)]
unsafe fn add_j_forces(f: *mut Float3, ti: u32, fa: Float3, fb: Float3, ia: u32, ib: u32) {
    let odd = ti & 1 != 0;
    let (keep, send) = if odd { (fb, fa) } else { (fa, fb) };
    // SAFETY: all lanes execute these shuffles (no divergent path reaches here).
    unsafe {
        let v = Float3::new(
            keep.x + warp::shfl_xor_f32(FULL, send.x, 1),
            keep.y + warp::shfl_xor_f32(FULL, send.y, 1),
            keep.z + warp::shfl_xor_f32(FULL, send.z, 1),
        );
        let Float3 { x, y, z } = butterfly(butterfly(v, 2), 4);
        let component = ti >> 1;
        let idx = if odd { ib } else { ia };
        if component < 3 && idx != NBNXM_FILLER {
            add_component(f, idx, component, pick(component, x, y, z));
        }
    }
}

/// Adds the i-forces of an entry: each lane's `fi[k]` (i-atom `ti` of i-cluster `k`, from its
/// j-atoms) summed over the 4 j-lanes; j-lane `c < 3` adds component `c`.
///
/// # Safety
/// All lanes together; the supercluster's slots are inside `atom_index`, whose atoms are in `f`.
#[inline(always)]
unsafe fn add_i_forces(f: *mut Float3, atom_index: *const u32, sci: u32, ti: u32, tj: u32, fi: &[Float3; NBNXM_CLUSTERS_PER_SUPER as usize]) {
    // SAFETY: all lanes run the shuffles; the host's contract covers the slots.
    unsafe {
        each_i_cluster!(K => {
            let v = butterfly(butterfly(fi[K], 8), 16);
            if tj < 3 {
                let idx = *atom_index.add((sci * NBNXM_SUPER_SIZE + K as u32 * CL + ti) as usize);
                if idx != NBNXM_FILLER {
                    add_component(f, idx, tj, pick(tj, v.x, v.y, v.z));
                }
            }
        });
    }
}

/// Sums every lane's `e` over the warp and lane 0 adds it to `*energy`: one atomic per warp.
///
/// # Safety
/// All lanes together; `energy` is a valid 8-byte-aligned global `f64`.
#[inline(always)]
unsafe fn add_energy(energy: *mut f64, mut e: f32) {
    // SAFETY: all lanes run the shuffles; the caller guarantees `energy`.
    unsafe {
        // Written out: a loop over an array of offsets is not unrolled and lands in local memory.
        e += warp::shfl_xor_f32(FULL, e, 16);
        e += warp::shfl_xor_f32(FULL, e, 8);
        e += warp::shfl_xor_f32(FULL, e, 4);
        e += warp::shfl_xor_f32(FULL, e, 2);
        e += warp::shfl_xor_f32(FULL, e, 1);
        if warp::lane_id() == 0 {
            device::atomic_add_relaxed_gpu_f64(energy, f64::from(e));
        }
    }
}
