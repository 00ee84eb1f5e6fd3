//! The mini-MD step's own kernels: Lennard-Jones pair forces from a pair list, and the leapfrog
//! update. They are what the halo exchange overlaps with; their accuracy is checked against the
//! undecomposed CPU forces (host `md_reference`).

use crate::abi::Float3;
use crate::device::{self, thread};

/// `d - l * rint(d / l)`: the minimum image of a displacement (identity when `|d| < l / 2`).
#[inline(always)]
fn min_image(d: f32, l: f32) -> f32 {
    d - l * round_half_even(d / l)
}

/// Nearest integer for `|v| < 2^22`, without libm: adding and subtracting 1.5 * 2^23 makes the
/// FPU round (to nearest even) at the units digit.
#[inline(always)]
fn round_half_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

kernel! {
    /// Pair forces for the rows `0..rows` of a CSR pair list (row `i`: pairs `(i, cols[k])` for
    /// `k in row_start[i]..row_start[i+1]`, each pair once). One thread per row accumulates the
    /// force on `i` in registers and adds it once; the reaction on `j` is added atomically.
    /// Plain cutoff `rc2`; `lj` holds `[c6, c12]` per type pair (`ntypes * ntypes` entries).
    fn lj_pair_forces(
        x: *const Float3, types: *const u32, lj: *const [f32; 2], ntypes: u32,
        row_start: *const u32, cols: *const u32, rows: u32, f: *mut Float3,
        box_x: f32, box_y: f32, box_z: f32, rc2: f32,
    ) {
        let mut i = thread::index_1d();
        while i < rows {
            // SAFETY: the host builds the CSR over valid local atoms and sizes every array.
            unsafe {
                let xi = *x.add(i as usize);
                let ti = *types.add(i as usize);
                let (start, end) = (*row_start.add(i as usize), *row_start.add(i as usize + 1));
                let mut fi = Float3::default();
                for k in start..end {
                    let j = *cols.add(k as usize);
                    let xj = *x.add(j as usize);
                    let d = Float3::new(min_image(xj.x - xi.x, box_x), min_image(xj.y - xi.y, box_y), min_image(xj.z - xi.z, box_z));
                    let r2 = d.x * d.x + d.y * d.y + d.z * d.z;
                    if r2 < rc2 {
                        let c = *lj.add((ti * ntypes + *types.add(j as usize)) as usize);
                        let inv2 = 1.0 / r2;
                        let inv6 = inv2 * inv2 * inv2;
                        let s = (12.0 * c[1] * inv6 - 6.0 * c[0]) * inv6 * inv2;
                        fi = Float3::new(fi.x - s * d.x, fi.y - s * d.y, fi.z - s * d.z);
                        let fj = f.add(j as usize);
                        device::atomic_add_relaxed_gpu_f32(&raw mut (*fj).x, s * d.x);
                        device::atomic_add_relaxed_gpu_f32(&raw mut (*fj).y, s * d.y);
                        device::atomic_add_relaxed_gpu_f32(&raw mut (*fj).z, s * d.z);
                    }
                }
                if end > start {
                    let t = f.add(i as usize);
                    device::atomic_add_relaxed_gpu_f32(&raw mut (*t).x, fi.x);
                    device::atomic_add_relaxed_gpu_f32(&raw mut (*t).y, fi.y);
                    device::atomic_add_relaxed_gpu_f32(&raw mut (*t).z, fi.z);
                }
            }
            i += thread::grid_stride_x();
        }
    }
}

kernel! {
    /// Leapfrog: `v += f / m * dt; x += v * dt` for the first `n` (home) atoms.
    fn leapfrog(x: *mut Float3, v: *mut Float3, f: *const Float3, inv_mass: *const f32, n: u32, dt: f32) {
        let mut i = thread::index_1d();
        while i < n {
            // SAFETY: the host sizes x, v, f and inv_mass for n home atoms.
            unsafe {
                let a = *inv_mass.add(i as usize) * dt;
                let fi = *f.add(i as usize);
                let vi = *v.add(i as usize);
                let vn = Float3::new(vi.x + fi.x * a, vi.y + fi.y * a, vi.z + fi.z * a);
                *v.add(i as usize) = vn;
                let xi = *x.add(i as usize);
                *x.add(i as usize) = Float3::new(xi.x + vn.x * dt, xi.y + vn.y * dt, xi.z + vn.z * dt);
            }
            i += thread::grid_stride_x();
        }
    }
}
