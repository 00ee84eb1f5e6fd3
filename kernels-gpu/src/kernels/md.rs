//! The mini-MD step's integrator: leapfrog on the home atoms, and the same update that also sums
//! the kinetic energy for the energy steps (the pair forces are the nbnxm kernels'). The update
//! is the last reader of a step's home forces, so it clears them for the next step: the step
//! needs no memset of its own (and no gap before its first force kernel).

use crate::abi::Float3;
use crate::device::{self, thread, warp};

/// `|v|²`.
#[inline(always)]
fn norm2(v: Float3) -> f32 {
    v.x * v.x + v.y * v.y + v.z * v.z
}

/// Leapfrog for the first `n` (home) atoms: `v += f / m * dt; x += v * dt; f = 0`. With `ENERGY`, also
/// adds the kinetic energy at the force's time, the average of the two half-step kinetic energies
/// `(m |v_old|² / 2 + m |v_new|² / 2) / 2` (GROMACS's leapfrog average), to `*kinetic`: summed per
/// thread and warp in `f32`, one `f64` atomic per warp.
///
/// # Safety
/// `x`, `v`, `f`, `inv_mass` hold at least `n` elements; `kinetic` is a valid `f64` when `ENERGY`;
/// nothing else reads or writes the first `n` forces while the kernel runs.
#[inline(always)]
unsafe fn leapfrog_impl<const ENERGY: bool>(x: *mut Float3, v: *mut Float3, f: *mut Float3, inv_mass: *const f32, n: u32, dt: f32, kinetic: *mut f64) {
    let mut i = thread::index_1d();
    let mut ke = 0.0f32;
    while i < n {
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
        i += thread::grid_stride_x();
    }
    if ENERGY {
        // Every lane of every warp gets here (the loop above has no early return), so the
        // full-mask shuffles are safe; lanes past `n` contribute 0. Written out: a loop over an
        // array of offsets lands in local memory.
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
    /// Leapfrog: `v += f / m * dt; x += v * dt; f = 0` for the first `n` (home) atoms.
    fn leapfrog(x: *mut Float3, v: *mut Float3, f: *mut Float3, inv_mass: *const f32, n: u32, dt: f32) {
        // SAFETY: forwarded; `kinetic` is not touched without ENERGY.
        unsafe { leapfrog_impl::<false>(x, v, f, inv_mass, n, dt, core::ptr::null_mut()) }
    }
}

kernel! {
    /// [`leapfrog`] that also adds the kinetic energy of the `n` atoms at the force's time to
    /// `*kinetic` (kJ/mol). See [`crate::abi::LEAPFROG_ENERGY`].
    fn leapfrog_energy(x: *mut Float3, v: *mut Float3, f: *mut Float3, inv_mass: *const f32, n: u32, dt: f32, kinetic: *mut f64) {
        // SAFETY: forwarded.
        unsafe { leapfrog_impl::<true>(x, v, f, inv_mass, n, dt, kinetic) }
    }
}
