//! The mini-MD step's integrator: leapfrog on the home atoms, and the same update that also sums
//! the kinetic energy for the energy steps (the pair forces are the nbnxm kernels'). The update
//! is the last reader of a step's home forces, so it clears them for the next step: the step
//! needs no memset of its own (and no gap before its first force kernel). It runs after the
//! force halo, the last reader of the halo atoms' forces on transports where only this rank's own
//! stream-ordered work reads them, so the same launch can clear those too (a second range).

use crate::abi::Float3;
use crate::device::{self, thread, warp};

/// `|v|²`.
#[inline(always)]
fn norm2(v: Float3) -> f32 {
    v.x * v.x + v.y * v.y + v.z * v.z
}

/// Leapfrog for the first `n` (home) atoms: `v += f / m * dt; x += v * dt; f = 0`, and `f = 0` for
/// the `clear_n` forces from `clear_from` on (the halo atoms' forces). One index space of
/// `n + clear_n` items, grid-strided: item `i < n` updates atom `i` exactly as without the second
/// range, item `n + k` zeroes `f[clear_from + k]`. With `ENERGY`, also adds the kinetic energy at
/// the force's time, the average of the two half-step kinetic energies
/// `(m |v_old|² / 2 + m |v_new|² / 2) / 2` (GROMACS's leapfrog average), of the `n` atoms to
/// `*kinetic`: summed per thread and warp in `f32`, one `f64` atomic per warp.
///
/// # Safety
/// `x`, `v`, `f`, `inv_mass` hold at least `n` elements and `f` also `clear_from + clear_n`;
/// `n + clear_n` fits in `u32`; the two force ranges do not overlap; `kinetic` is a valid `f64`
/// when `ENERGY`; nothing else reads or writes those forces while the kernel runs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn leapfrog_impl<const ENERGY: bool>(
    x: *mut Float3,
    v: *mut Float3,
    f: *mut Float3,
    inv_mass: *const f32,
    n: u32,
    dt: f32,
    clear_from: u32,
    clear_n: u32,
    kinetic: *mut f64,
) {
    // Launched to overlap the force kernel before it: nothing is read or written before that
    // kernel is done.
    device::wait_for_previous_kernel();
    let items = n + clear_n;
    let mut i = thread::index_1d();
    let mut ke = 0.0f32;
    while i < items {
        if i >= n {
            // SAFETY: `clear_from + (i - n) < clear_from + clear_n`, inside `f` per the contract.
            unsafe { *f.add(clear_from as usize + (i - n) as usize) = Float3::new(0.0, 0.0, 0.0) };
        } else {
            // SAFETY: the host sizes x, v, f and inv_mass for n home atoms.
            unsafe {
                let im = *inv_mass.add(i as usize);
                let a = im * dt;
                let fi = *f.add(i as usize);
                *f.add(i as usize) = Float3::new(0.0, 0.0, 0.0);
                let vi = *v.add(i as usize);
                let vn = Float3::new(vi.x + fi.x * a, vi.y + fi.y * a, vi.z + fi.z * a);
                *v.add(i as usize) = vn;
                let xi = *x.add(i as usize);
                *x.add(i as usize) = Float3::new(xi.x + vn.x * dt, xi.y + vn.y * dt, xi.z + vn.z * dt);
                if ENERGY {
                    ke += 0.25 * (norm2(vi) + norm2(vn)) / im;
                }
            }
        }
        i += thread::grid_stride_x();
    }
    if ENERGY {
        // Every lane of every warp gets here (the loop above has no early return), so the
        // full-mask shuffles are safe; lanes past `n` (clearing, or idle) contribute 0. Written
        // out: a loop over an array of offsets lands in local memory.
        // SAFETY: all lanes together; `kinetic` valid per the contract.
        unsafe {
            ke += warp::shfl_xor_f32(warp::FULL_MASK, ke, 16);
            ke += warp::shfl_xor_f32(warp::FULL_MASK, ke, 8);
            ke += warp::shfl_xor_f32(warp::FULL_MASK, ke, 4);
            ke += warp::shfl_xor_f32(warp::FULL_MASK, ke, 2);
            ke += warp::shfl_xor_f32(warp::FULL_MASK, ke, 1);
            if warp::lane_id() == 0 && ke != 0.0 {
                device::atomic_add_relaxed_gpu_f64(kinetic, f64::from(ke));
            }
        }
    }
}

kernel! {
    /// Leapfrog: `v += f / m * dt; x += v * dt; f = 0` for the first `n` (home) atoms, and `f = 0`
    /// for the `clear_n` forces from `clear_from` on. See [`crate::abi::LEAPFROG`].
    fn leapfrog(x: *mut Float3, v: *mut Float3, f: *mut Float3, inv_mass: *const f32, n: u32, dt: f32, clear_from: u32, clear_n: u32) {
        // SAFETY: forwarded; `kinetic` is not touched without ENERGY.
        unsafe { leapfrog_impl::<false>(x, v, f, inv_mass, n, dt, clear_from, clear_n, core::ptr::null_mut()) }
    }
}

kernel! {
    /// [`leapfrog`] that also adds the kinetic energy of the `n` atoms at the force's time to
    /// `*kinetic` (kJ/mol). See [`crate::abi::LEAPFROG_ENERGY`].
    fn leapfrog_energy(x: *mut Float3, v: *mut Float3, f: *mut Float3, inv_mass: *const f32, n: u32, dt: f32, clear_from: u32, clear_n: u32, kinetic: *mut f64) {
        // SAFETY: forwarded.
        unsafe { leapfrog_impl::<true>(x, v, f, inv_mass, n, dt, clear_from, clear_n, kinetic) }
    }
}

/// `out[i] = table[index[i]]` for the first `n` items, `missing` for an index at or past `len`
/// (grid-stride): the table is read only below `len`, however large an index.
///
/// # Safety
/// `index` and `out` hold at least `n` elements, `table` at least `len`.
#[inline(always)]
unsafe fn gather_bounded<T: Copy>(index: *const u32, n: u32, table: *const T, len: u32, out: *mut T, missing: T) {
    let mut i = thread::index_1d();
    while i < n {
        // SAFETY: the caller's sizes; the table is read only below `len`.
        unsafe {
            let k = *index.add(i as usize);
            *out.add(i as usize) = if k < len { *table.add(k as usize) } else { missing };
        }
        i += thread::grid_stride_x();
    }
}

kernel! {
    /// `inv_mass[i] = inv_by_type[types[i]]` for the first `n` (home) atoms, NaN for a type at or
    /// past `ntypes`. See [`crate::abi::INVERSE_MASSES`].
    fn inverse_masses(types: *const u32, n: u32, inv_by_type: *const f32, ntypes: u32, inv_mass: *mut f32) {
        // SAFETY: the host sizes `types` and `inv_mass` for `n` atoms and `inv_by_type` for
        // `ntypes` types.
        unsafe { gather_bounded(types, n, inv_by_type, ntypes, inv_mass, f32::NAN) }
    }
}

kernel! {
    /// `types[i] = by_id[ids[i]]` for the first `n` (home) atoms, `u32::MAX` for an id at or past
    /// `atoms`. See [`crate::abi::TYPES_BY_ID`].
    fn types_by_id(ids: *const u32, n: u32, by_id: *const u32, atoms: u32, types: *mut u32) {
        // SAFETY: the host sizes `ids` and `types` for `n` atoms and `by_id` for `atoms` atoms.
        unsafe { gather_bounded(ids, n, by_id, atoms, types, u32::MAX) }
    }
}
