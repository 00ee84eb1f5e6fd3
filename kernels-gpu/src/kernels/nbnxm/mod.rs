//! Cluster-pair non-bonded kernels, after GROMACS's nbnxm GPU layout: atoms sit in clusters of 8
//! slots, an i-entry pairs an i-supercluster (8 clusters, 64 slots) under one periodic shift with a
//! list of j-clusters, and a mask word per j-cluster says which of the 8 i-clusters interact with it.
//!
//! One block per i-entry, `W` warps (chosen at launch), block `b` running entry `order[b]` (the
//! host's launch order, longest entries first: blocks start in block order, and long entries
//! started last would leave a tail of busy multiprocessors): the entry's 64 i-atoms, shifted once, are
//! staged in shared memory by the whole block, and warp `w` walks the entry's j-list words
//! `w, w + W, w + 2W, ...` (interleaved: neighbouring words, whose masks and distances are alike,
//! go to different warps). With one warp per entry a warp walks up to 32 words one after the other,
//! each behind two dependent global loads, and a list of ~1,600 entries leaves ~12 warps per
//! multiprocessor to hide that latency; `W` warps per entry give `W` times the warps, each with a
//! `W`-th of the chain.
//!
//! Inside a warp, lane `l` is the tile position `(ti, tj) = (l % 8, l / 8)`: it owns i-atom `ti` of
//! every i-cluster and j-atoms `tj` and `tj + 4` of the current j-cluster, so a masked-in
//! (i-cluster, j-cluster) pair costs each lane two atom pairs.
//! - The force on each lane's 8 i-atoms stays in registers for the whole walk. At the end each
//!   warp reduces it over its 4 j-lanes (butterfly shuffles) into its partials in shared memory,
//!   and after a block barrier one thread per i-atom and component sums the `W` warps' partials
//!   and adds the sum with one atomic (an i-supercluster appears in several entries: one per
//!   shift, and long lists are split). The energy goes the same way: one `f64` atomic per block.
//!   (Design `pfw` skips the partials and the barrier: each warp adds its sums itself,
//!   [`add_i_forces_and_energy_per_warp`].)
//! - The j-forces of one j-cluster are reduced over the 8 i-lanes with 9 butterfly shuffles (the
//!   first step also splits the two j-atoms between even and odd lanes) and added with one atomic
//!   per atom and component, by 24 lanes in one instruction. No atomic per pair.
//!
//! Padding slots (`atom_index == NBNXM_FILLER`) take far-away coordinates (i and j fillers far from
//! each other too), so they fail the distance test like any pair beyond the cutoff. The self
//! cluster pair (same cluster, no shift) counts atom pairs `ti < tj` only. Everything else (the
//! half list, which rank owns a pair, the zones) was decided by the host when it built the list.
//!
//! The kernels themselves, and the designs (`_ind`, `_pf`, `_pfw`), are in [`tiled`].

use crate::abi::{
    Float3, NBNXM_CLUSTER_SIZE, NBNXM_CLUSTERS_PER_SUPER, NBNXM_FILLER, NBNXM_MASK_BITS, NBNXM_PARTIAL_FLOATS, NBNXM_PARTIAL_STRIDE,
    NBNXM_SUPER_SIZE, NBNXM_TABLE_OFFSET, NbnxmEntry, nbnxm_partials_offset,
};
use crate::device::{self, shared, sync_threads, thread, warp};

/// Where an i padding slot sits: beyond any cutoff from every real atom and from `FAR_J`.
const FAR_I: f32 = 1.0e5;
/// Where a j padding slot sits.
const FAR_J: f32 = -1.0e5;
const FULL: u32 = warp::FULL_MASK;
const MASK: u32 = (1 << NBNXM_MASK_BITS) - 1;
const CL: u32 = NBNXM_CLUSTER_SIZE;
const CLUSTERS: usize = NBNXM_CLUSTERS_PER_SUPER as usize;

// The unrolled loops below are written for 8 clusters of 8 atoms.
const _: () = assert!(NBNXM_CLUSTERS_PER_SUPER == 8 && NBNXM_CLUSTER_SIZE == 8);

/// Runs `$body` once for each i-cluster `$k` of a supercluster, with `$k` a constant, so arrays
/// indexed by it are promoted to registers (a loop would leave that to the unroller's mood).
macro_rules! each_i_cluster {
    ($k:ident => $body:block) => {{
        {
            const $k: usize = 0;
            $body
        }
        {
            const $k: usize = 1;
            $body
        }
        {
            const $k: usize = 2;
            $body
        }
        {
            const $k: usize = 3;
            $body
        }
        {
            const $k: usize = 4;
            $body
        }
        {
            const $k: usize = 5;
            $body
        }
        {
            const $k: usize = 6;
            $body
        }
        {
            const $k: usize = 7;
            $body
        }
    }};
}

mod tiled;

/// One staged i-atom: `[x, y, z, bits(type row)]`, 16-byte aligned so it moves in one vector
/// access.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Staged([f32; 4]);

/// This thread's place in the launch: the block's entry, the thread, its warp and lane.
#[derive(Clone, Copy)]
struct Block {
    e: NbnxmEntry,
    /// Thread in the block, and threads of the block (`32 W`).
    tid: u32,
    threads: u32,
    /// Warp in the block, and warps of the block (`W`).
    warp: u32,
    warps: u32,
    lane: u32,
}

impl Block {
    /// The block's entry (`entries[order[blockIdx.x]]`); `None`, for the whole block, past the
    /// last one.
    ///
    /// # Safety
    /// `entries` and `order` hold `n_entries`, every `order` value below `n_entries`.
    #[inline(always)]
    unsafe fn of(entries: *const NbnxmEntry, order: *const u32, n_entries: u32) -> Option<Self> {
        let block = thread::block_idx_x();
        if block >= n_entries {
            return None;
        }
        let (tid, threads) = (thread::thread_idx_x(), thread::block_dim_x());
        // SAFETY: block < n_entries, and the order's values index the entries.
        let e = unsafe { *entries.add(*order.add(block as usize) as usize) };
        Some(Self { e, tid, threads, warp: warp::warp_id(), warps: threads / warp::WARP_SIZE, lane: warp::lane_id() })
    }

    /// The staged i-atoms (every block's shared memory starts with them).
    ///
    /// # Safety
    /// Launched with at least [`crate::abi::NBNXM_STAGED_BYTES`] of dynamic shared memory.
    #[inline(always)]
    unsafe fn staged(&self) -> *mut Staged {
        // SAFETY: forwarded.
        unsafe { shared::dynamic_shared_mem() as *mut Staged }
    }

    /// The atom index of each staged slot (force blocks only), after the staged atoms.
    ///
    /// # Safety
    /// A force launch ([`crate::abi::nbnxm_force_shared_bytes`]).
    #[inline(always)]
    unsafe fn slots(&self) -> *mut u32 {
        // SAFETY: forwarded.
        unsafe { self.staged().add(NBNXM_SUPER_SIZE as usize) as *mut u32 }
    }

    /// The LJ table of a force block.
    ///
    /// # Safety
    /// A force launch.
    #[inline(always)]
    unsafe fn table(&self) -> *mut [f32; 2] {
        // SAFETY: forwarded.
        unsafe { (shared::dynamic_shared_mem() as *mut u8).add(NBNXM_TABLE_OFFSET as usize) as *mut [f32; 2] }
    }

    /// The partial i-forces and energy of warp `w` of a force block for `ntypes` atom types.
    ///
    /// # Safety
    /// A force launch for `ntypes` types; `w < self.warps`.
    #[inline(always)]
    unsafe fn partials(&self, ntypes: u32, w: u32) -> *mut f32 {
        // SAFETY: forwarded.
        unsafe {
            ((shared::dynamic_shared_mem() as *mut u8).add(nbnxm_partials_offset(ntypes) as usize) as *mut f32)
                .add((w * NBNXM_PARTIAL_FLOATS) as usize)
        }
    }
}

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
    unsafe { Float3::new(v.x + warp::shfl_xor_f32(FULL, v.x, m), v.y + warp::shfl_xor_f32(FULL, v.y, m), v.z + warp::shfl_xor_f32(FULL, v.z, m)) }
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

/// `e` summed over the warp (5 butterfly steps), on every lane. Written out: a loop over an array
/// of offsets is not unrolled and lands in local memory.
///
/// # Safety
/// All lanes together.
#[inline(always)]
unsafe fn warp_sum(mut e: f32) -> f32 {
    // SAFETY: forwarded to the caller.
    unsafe {
        e += warp::shfl_xor_f32(FULL, e, 16);
        e += warp::shfl_xor_f32(FULL, e, 8);
        e += warp::shfl_xor_f32(FULL, e, 4);
        e += warp::shfl_xor_f32(FULL, e, 2);
        e += warp::shfl_xor_f32(FULL, e, 1);
    }
    e
}

/// Adds a force block's i-forces (each lane's `fi[k]`: i-atom `ti` of i-cluster `k`) and, with
/// `ENERGY`, its energy (each lane's `e`):
/// 1. each warp sums `fi` over its 4 j-lanes (2 butterfly steps) and j-lane `c < 3` writes
///    component `c` of its 8 atoms into the warp's partials; lane 0 writes the warp's energy
///    (5 butterfly steps);
/// 2. a block barrier;
/// 3. thread `t < 192` sums component `t / 64` of slot `t % 64` over the warps and adds it with one
///    atomic (not for padding slots, nor a zero sum); thread 0 adds the energy (one `f64` atomic).
///
/// # Safety
/// Every thread of the block together (a block barrier), after the slots were staged and behind a
/// barrier; a force launch for `ntypes` types; `energy` a valid `f64` when `ENERGY`; the slots'
/// atoms inside `f`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn add_i_forces_and_energy<const ENERGY: bool>(
    b: &Block,
    ntypes: u32,
    f: *mut Float3,
    energy: *mut f64,
    ti: u32,
    tj: u32,
    fi: &[Float3; CLUSTERS],
    e: f32,
) {
    // SAFETY: all threads run the shuffles and the barrier; shared accesses stay in the block's
    // partials (w < warps) and staged slots; the caller covers `f` and `energy`.
    unsafe {
        let mine = b.partials(ntypes, b.warp);
        each_i_cluster!(K => {
            let v = butterfly(butterfly(fi[K], 8), 16);
            if tj < 3 {
                *mine.add((tj * NBNXM_PARTIAL_STRIDE + K as u32 * CL + ti) as usize) = pick(tj, v.x, v.y, v.z);
            }
        });
        if ENERGY {
            let e = warp_sum(e);
            if b.lane == 0 {
                *mine.add(3 * NBNXM_PARTIAL_STRIDE as usize) = e;
            }
        }
        sync_threads();
        let slots = b.slots();
        let mut t = b.tid;
        while t < 3 * NBNXM_SUPER_SIZE {
            let (c, s) = (t / NBNXM_SUPER_SIZE, t % NBNXM_SUPER_SIZE);
            let idx = *slots.add(s as usize);
            if idx != NBNXM_FILLER {
                let at = c * NBNXM_PARTIAL_STRIDE + s;
                let mut sum = 0.0f32;
                for w in 0..b.warps {
                    sum += *b.partials(ntypes, w).add(at as usize);
                }
                if sum != 0.0 {
                    add_component(f, idx, c, sum);
                }
            }
            t += b.threads;
        }
        if ENERGY && b.tid == 0 {
            let mut sum = 0.0f64;
            for w in 0..b.warps {
                sum += f64::from(*b.partials(ntypes, w).add(3 * NBNXM_PARTIAL_STRIDE as usize));
            }
            device::atomic_add_relaxed_gpu_f64(energy, sum);
        }
    }
}

/// [`add_i_forces_and_energy`] warp by warp, with no block barrier (design `pfw`): each warp sums
/// `fi` over its 4 j-lanes (2 butterfly steps, as there), then j-lane `c < 3` adds component `c`
/// of its i-atom of every i-cluster with one atomic each (not for padding slots, nor a zero sum),
/// and lane 0 adds the warp's energy (5 butterfly steps, one `f64` atomic). A warp that runs out
/// of j-list words first leaves at once instead of waiting at a barrier for its block's slowest
/// warp; the price is `W` times the i-force and energy atomics of the block.
///
/// # Safety
/// All lanes of the warp together (no block barrier: the warps need not arrive together), after
/// the slots were staged and published by the block's barrier; a force launch; `energy` a valid
/// `f64` when `ENERGY`; the slots' atoms inside `f`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn add_i_forces_and_energy_per_warp<const ENERGY: bool>(
    b: &Block,
    f: *mut Float3,
    energy: *mut f64,
    ti: u32,
    tj: u32,
    fi: &[Float3; CLUSTERS],
    e: f32,
) {
    // SAFETY: all lanes run the shuffles; the staged slots are read only (published by the
    // staging's barrier); the caller covers `f` and `energy`.
    unsafe {
        let slots = b.slots();
        each_i_cluster!(K => {
            let v = butterfly(butterfly(fi[K], 8), 16);
            if tj < 3 {
                let idx = *slots.add(K * CL as usize + ti as usize);
                let c = pick(tj, v.x, v.y, v.z);
                if idx != NBNXM_FILLER && c != 0.0 {
                    add_component(f, idx, tj, c);
                }
            }
        });
        if ENERGY {
            let e = warp_sum(e);
            if b.lane == 0 {
                device::atomic_add_relaxed_gpu_f64(energy, f64::from(e));
            }
        }
    }
}
