//! The CPU side: the undecomposed reference, a scalar simulation of the forward exchange, and the
//! decomposed iteration on the CPU (which must match the reference bit for bit).

use crate::decomp::{DIRECTIONS, Decomposition};
use halo::exchange::RankHalo;
use rand::{Rng, SeedableRng};

/// One cell's update, in exactly the order the `jacobi7` kernel evaluates it:
/// `u + alpha * (((((n0 + n1) + n2) + n3) + n4) + n5 - 6 u)`, every operation rounded separately
/// (Rust does not contract `a * b + c` into a fused multiply-add, and the kernel's PTX uses
/// `add.rn`/`mul.rn`, which ptxas may not contract either).
///
/// ```
/// // A uniform field is a fixed point.
/// assert_eq!(stencil3d::reference::jacobi_point(2.0, [2.0; 6], 0.1), 2.0);
/// ```
#[inline]
pub fn jacobi_point(u: f32, nb: [f32; 6], alpha: f32) -> f32 {
    let s = ((((nb[0] + nb[1]) + nb[2]) + nb[3]) + nb[4]) + nb[5];
    u + alpha * (s - 6.0 * u)
}

/// One Jacobi step on the whole periodic grid (x fastest).
///
/// ```
/// let mut u = vec![0.0f32; 27];
/// u[13] = 1.0; // the centre of a 3x3x3 grid
/// let v = stencil3d::reference::step_global([3, 3, 3], &u, 0.1);
/// assert!((v[13] - 0.4).abs() < 1e-6);
/// assert!((v[12] - 0.1).abs() < 1e-6);
/// ```
pub fn step_global(grid: [usize; 3], u: &[f32], alpha: f32) -> Vec<f32> {
    let [nx, ny, nz] = grid;
    let idx = |x: usize, y: usize, z: usize| x + nx * (y + ny * z);
    let mut out = vec![0.0; u.len()];
    for z in 0..nz {
        for y in 0..ny {
            for x in 0..nx {
                let c = [x, y, z];
                let nb = DIRECTIONS.map(|(d, step)| {
                    let mut m = c;
                    m[d] = (c[d] as i64 + step).rem_euclid(grid[d] as i64) as usize;
                    u[idx(m[0], m[1], m[2])]
                });
                out[idx(x, y, z)] = jacobi_point(u[idx(x, y, z)], nb, alpha);
            }
        }
    }
    out
}

/// `iterations` Jacobi steps on the undecomposed grid: what every decomposition must reproduce.
pub fn run_global(grid: [usize; 3], u0: &[f32], alpha: f32, iterations: usize) -> Vec<f32> {
    let mut u = u0.to_vec();
    for _ in 0..iterations {
        u = step_global(grid, &u, alpha);
    }
    u
}

/// What the forward exchange does, on the CPU, for values of any type: pulses in order, each
/// rank's mapped values copied into `send_rank`'s array at `peer_atom_offset`. `fields[r]` must
/// hold `halos[r].total_atoms` values. Returns how many times each local entry was written.
///
/// ```
/// use stencil3d::{decomp::Decomposition, reference::exchange_forward};
/// let d = Decomposition::new([4, 1, 1], [2, 1, 1]).unwrap();
/// let mut f: Vec<Vec<u32>> = d.halos.iter().map(|h| vec![0; h.total_atoms]).collect();
/// f[0][..2].copy_from_slice(&[10, 11]);
/// f[1][..2].copy_from_slice(&[12, 13]);
/// exchange_forward(&d.halos, &mut f);
/// assert_eq!(f[0], [10, 11, 12, 13]); // upper ghost (from rank 1's lower face), lower ghost (its upper face)
/// ```
pub fn exchange_forward<T: Copy>(halos: &[RankHalo], fields: &mut [Vec<T>]) -> Vec<Vec<u32>> {
    let mut writes: Vec<Vec<u32>> = halos.iter().map(|h| vec![0; h.total_atoms]).collect();
    let pulses = halos.first().map_or(0, |h| h.pulses.len());
    for p in 0..pulses {
        for r in 0..halos.len() {
            let spec = &halos[r].pulses[p];
            let packed: Vec<T> = spec.index_map.iter().map(|&i| fields[r][i as usize]).collect();
            for (k, v) in packed.into_iter().enumerate() {
                fields[spec.send_rank][spec.peer_atom_offset + k] = v;
                writes[spec.send_rank][spec.peer_atom_offset + k] += 1;
            }
        }
    }
    writes
}

/// `iterations` Jacobi steps on the decomposed grid, on the CPU: exchange, then every rank's
/// interior through its neighbour table. Returns each rank's interior values.
pub fn run_decomposed(decomp: &Decomposition, u0: &[f32], alpha: f32, iterations: usize) -> Vec<Vec<f32>> {
    let mut fields: Vec<Vec<f32>> = decomp
        .scatter(u0)
        .into_iter()
        .zip(&decomp.halos)
        .map(|(mut v, h)| {
            v.resize(h.total_atoms, f32::NAN);
            v
        })
        .collect();
    for _ in 0..iterations {
        exchange_forward(&decomp.halos, &mut fields);
        for (u, nb) in fields.iter_mut().zip(&decomp.neighbours) {
            let next: Vec<f32> = nb.iter().enumerate().map(|(i, n)| jacobi_point(u[i], n.map(|j| u[j as usize]), alpha)).collect();
            u[..next.len()].copy_from_slice(&next);
        }
    }
    fields
        .into_iter()
        .zip(&decomp.blocks)
        .map(|(mut v, b)| {
            v.truncate(b.cells());
            v
        })
        .collect()
}

/// The initial field.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum InitialField {
    /// Uniform random values in `[0, 1)` from a ChaCha8 stream with this seed.
    Random(u64),
    /// Zero everywhere except 1000 in the cell at the grid's centre.
    HotSpot,
}

impl InitialField {
    /// The field on `grid` (x fastest).
    ///
    /// ```
    /// use stencil3d::reference::InitialField;
    /// let u = InitialField::HotSpot.values([3, 3, 3]);
    /// assert_eq!(u.iter().filter(|&&v| v != 0.0).count(), 1);
    /// assert_eq!(InitialField::Random(7).values([4, 4, 4]), InitialField::Random(7).values([4, 4, 4]));
    /// ```
    pub fn values(self, grid: [usize; 3]) -> Vec<f32> {
        let n = grid.iter().product::<usize>();
        match self {
            InitialField::Random(seed) => {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
                (0..n).map(|_| rng.random::<f32>()).collect()
            }
            InitialField::HotSpot => {
                let mut u = vec![0.0; n];
                let c = [grid[0] / 2, grid[1] / 2, grid[2] / 2];
                u[c[0] + grid[0] * (c[1] + grid[1] * c[2])] = 1000.0;
                u
            }
        }
    }
}
