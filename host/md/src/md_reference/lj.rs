//! Lennard-Jones forces (plain cutoff, minimum image) of the undecomposed system, found with a
//! cell list, and the per-rank forces of assigned pairs.

use super::{PairAssignment, ReferenceError};
use crate::decomp::{Decomposition, HaloPlan, RankGrid, wrap_position};
use crate::system::MolecularSystem;
use crate::workers::Workers;

/// `d` folded to its minimum image for a periodic length `l`. Identity for `|d| < l / 2`.
pub fn min_image(d: f64, l: f64) -> f64 {
    d - l * image_fold(d, l)
}

/// How many box lengths [`min_image`] removes from `d`. Kept as one function so that the pair
/// assignment's check of which local images form the minimum-image pair uses exactly the fold
/// the distance was computed with.
pub(super) fn image_fold(d: f64, l: f64) -> f64 {
    (d / l).round()
}

/// The one definition of "within the cutoff" that every pair search here uses: for `xi`, `xj`
/// wrapped into the box (see [`wrapped_positions`]), the minimum-image displacement
/// `d = x_j - x_i` (difference in `f64`, then folded per dimension) and `r2 = |d|^2` when
/// `r2 < cutoff^2`, else `None`.
///
/// A pair at the cutoff is decided differently by a different arithmetic (for example a
/// difference taken in `f32` first, or unwrapped positions): callers that compare pair sets
/// must all go through this function, or they disagree on such pairs.
pub fn pair_within_cutoff(xi: &[f64; 3], xj: &[f64; 3], box_size: [f64; 3], cutoff: f64) -> Option<([f64; 3], f64)> {
    let d: [f64; 3] = std::array::from_fn(|k| min_image(xj[k] - xi[k], box_size[k]));
    let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
    (r2 < cutoff * cutoff).then_some((d, r2))
}

/// `F / r` of the LJ pair force at squared distance `r2`: the force on `j` is this times
/// `x_j - x_i`, the force on `i` its negative.
pub fn lj_force_over_r(r2: f64, c6: f64, c12: f64) -> f64 {
    let inv2 = 1.0 / r2;
    let inv6 = inv2 * inv2 * inv2;
    (12.0 * c12 * inv6 - 6.0 * c6) * inv6 * inv2
}

/// How fast the pair force changes with the displacement at squared distance `r2`: the spectral
/// norm of the Jacobian of `F = -s d` with respect to `d` (`s` = [`lj_force_over_r`]), whose
/// eigenvalues are `-s` across the pair and `dF/dr` along it. A displacement off by `e` moves the
/// pair force by at most this times `|e|`.
pub fn lj_force_gradient_norm(r2: f64, c6: f64, c12: f64) -> f64 {
    let inv2 = 1.0 / r2;
    let inv6 = inv2 * inv2 * inv2;
    let across = lj_force_over_r(r2, c6, c12);
    let along = (42.0 * c6 - 156.0 * c12 * inv6) * inv6 * inv2;
    across.abs().max(along.abs())
}

/// A bound on how far `f32` coordinates put a pair's displacement from the exact one in a box of
/// `box_size` (nm): each end of a pair may be rounded once after a periodic shift (a halo pulse's
/// across a periodic boundary, the pair kernel's shift vectors), to a value below twice the
/// longest edge, so each component is off by at most one `f32` ulp there, the vector by `sqrt(3)`
/// of it. The coordinates themselves are what the reference gets, so nothing else differs.
pub fn displacement_rounding(box_size: [f32; 3]) -> f64 {
    let top = 2.0 * box_size.iter().fold(0.0f32, |m, &l| m.max(l.abs()));
    let ulp = f32::from_bits(top.to_bits() + 1) - top;
    3f64.sqrt() * f64::from(ulp)
}

/// The LJ potential with GROMACS's potential-shift modifier: `V(r) - V(rc)` for `r < rc`, so the
/// energy is continuous at the cutoff (the force is unchanged: [`lj_force_over_r`]).
pub fn lj_potential_shifted(r2: f64, c6: f64, c12: f64, cutoff: f64) -> f64 {
    let v = |inv6: f64| (c12 * inv6 - c6) * inv6;
    v((1.0 / r2).powi(3)) - v(cutoff.powi(-6))
}

/// The system's positions wrapped into the box (by [`wrap_position`], in `f32`) and widened to
/// `f64` (exactly): the numbers every pair search uses, with [`pair_within_cutoff`].
pub fn wrapped_positions(system: &MolecularSystem) -> Vec<[f64; 3]> {
    system
        .positions
        .iter()
        .map(|&p| {
            let w = wrap_position(p, system.box_size);
            [f64::from(w.x), f64::from(w.y), f64::from(w.z)]
        })
        .collect()
}

/// Checks `cutoff` against the box: positive, finite, below half of every edge.
pub(super) fn check_cutoff(system: &MolecularSystem, cutoff: f32) -> Result<(), ReferenceError> {
    let one = RankGrid { dims: [1, 1, 1] };
    Decomposition::new(one, system.box_size, cutoff)?;
    Ok(())
}

/// Calls `f(i, j, d, r2)` once for every pair `i < j` that [`pair_within_cutoff`] accepts, with
/// its `d` and `r2`. `pos` must be wrapped into the box and the cutoff below half of every edge.
pub(super) fn for_each_pair(pos: &[[f64; 3]], box_size: [f64; 3], cutoff: f64, mut f: impl FnMut(usize, usize, [f64; 3], f64)) {
    let cells = CellList::new(pos, box_size, cutoff);
    for i in 0..pos.len() {
        cells.for_each_neighbour(pos, i, |j, d, r2| {
            if j > i {
                f(i, j, d, r2);
            }
        });
    }
}

/// The atoms sorted into cells at least a cutoff wide, so that a pair within the cutoff lies in
/// the same or adjacent cells (periodic).
struct CellList {
    /// Cells per dimension.
    m: [usize; 3],
    box_size: [f64; 3],
    cutoff: f64,
    /// The atoms of cell `c`: `sorted[start[c]..start[c + 1]]`, in index order.
    start: Vec<usize>,
    sorted: Vec<usize>,
    /// Distinct neighbour offsets per dimension: with fewer than 3 cells, -1 and +1 coincide.
    offsets: [Vec<usize>; 3],
}

impl CellList {
    fn new(pos: &[[f64; 3]], box_size: [f64; 3], cutoff: f64) -> Self {
        let m: [usize; 3] = box_size.map(|l| ((l / cutoff).floor() as usize).max(1));
        let offsets = m.map(|n| match n {
            1 => vec![0],
            2 => vec![0, 1],
            _ => vec![n - 1, 0, 1],
        });
        let mut c = Self { m, box_size, cutoff, start: Vec::new(), sorted: vec![0; pos.len()], offsets };
        let ncells = m[0] * m[1] * m[2];
        let cells: Vec<usize> = pos.iter().map(|p| c.flat(c.cell_of(p))).collect();
        let mut start = vec![0usize; ncells + 1];
        for &k in &cells {
            start[k + 1] += 1;
        }
        for k in 0..ncells {
            start[k + 1] += start[k];
        }
        let mut fill = start.clone();
        for (i, &k) in cells.iter().enumerate() {
            c.sorted[fill[k]] = i;
            fill[k] += 1;
        }
        c.start = start;
        c
    }

    fn cell_of(&self, p: &[f64; 3]) -> [usize; 3] {
        std::array::from_fn(|d| {
            let k = (p[d] * self.m[d] as f64 / self.box_size[d]).floor();
            if k <= 0.0 { 0 } else { (k as usize).min(self.m[d] - 1) }
        })
    }

    fn flat(&self, c: [usize; 3]) -> usize {
        c[0] + self.m[0] * (c[1] + self.m[1] * c[2])
    }

    /// Calls `f(j, d, r2)` for every atom `j != i` that [`pair_within_cutoff`] accepts with atom
    /// `i` (`d = x_j - x_i` folded), cell by cell in a fixed order.
    fn for_each_neighbour(&self, pos: &[[f64; 3]], i: usize, mut f: impl FnMut(usize, [f64; 3], f64)) {
        let (m, pi) = (self.m, &pos[i]);
        let ci = self.cell_of(pi);
        for &ox in &self.offsets[0] {
            for &oy in &self.offsets[1] {
                for &oz in &self.offsets[2] {
                    let fc = self.flat([(ci[0] + ox) % m[0], (ci[1] + oy) % m[1], (ci[2] + oz) % m[2]]);
                    for &j in &self.sorted[self.start[fc]..self.start[fc + 1]] {
                        if j == i {
                            continue;
                        }
                        if let Some((d, r2)) = pair_within_cutoff(pi, &pos[j], self.box_size, self.cutoff) {
                            f(j, d, r2);
                        }
                    }
                }
            }
        }
    }
}

/// Atoms per part of [`lj_forces_and_energy`]: fixed, so that its sums do not depend on the
/// number of workers.
const REFERENCE_CHUNK: usize = 1024;

/// The undecomposed reference of a checked step ([`lj_forces_and_energy`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceForces {
    /// The force on every atom (kJ/mol/nm), in `f64`.
    pub forces: Vec<[f64; 3]>,
    /// Per atom, the sum over its pairs of [`lj_force_gradient_norm`] (kJ/mol/nm²): times
    /// [`displacement_rounding`], a bound on how far `f32` coordinates move its force.
    pub stiffness: Vec<f64>,
    /// The potential-shifted LJ energy (kJ/mol).
    pub energy: f64,
    /// [`displacement_rounding`] of the system's box (nm).
    pub rounding: f64,
}

impl ReferenceForces {
    /// The root mean square of the forces' magnitudes (kJ/mol/nm; 0 without atoms).
    pub fn rms(&self) -> f64 {
        (self.forces.iter().map(|v| v.iter().map(|c| c * c).sum::<f64>()).sum::<f64>() / self.forces.len().max(1) as f64).sqrt()
    }
}

/// [`lj_forces`] and [`lj_energy`] in one pass over the same pairs ([`pair_within_cutoff`]), with
/// each atom's stiffness ([`ReferenceForces::stiffness`]), the atoms shared among `workers` in
/// fixed parts: each atom's force is summed over its own neighbours (every pair is evaluated from
/// both ends, so no two parts write one atom), the energy over the pairs `i < j` of each part, the
/// parts' energies in order. The results are the same for any number of workers, bit for bit,
/// and agree with [`lj_forces`] and [`lj_energy`] to rounding (the terms are the same, summed in
/// another order). What a checked MD step uses: at 45,000 atoms the two serial passes took about
/// 3 s on the H200 host.
pub fn lj_forces_and_energy(system: &MolecularSystem, cutoff: f32, workers: &Workers) -> Result<ReferenceForces, ReferenceError> {
    check_cutoff(system, cutoff)?;
    let pos = wrapped_positions(system);
    let (box_size, rc) = (system.box_size.map(f64::from), f64::from(cutoff));
    let cells = CellList::new(&pos, box_size, rc);
    let table = pair_table(system);
    let nt = system.atom_types.len();
    let parts: Vec<std::ops::Range<usize>> = (0..pos.len()).step_by(REFERENCE_CHUNK).map(|a| a..(a + REFERENCE_CHUNK).min(pos.len())).collect();
    let done = workers.map(parts, |atoms| {
        let mut e = 0.0;
        let f: Vec<([f64; 3], f64)> = atoms
            .map(|i| {
                let (mut fi, mut stiff) = ([0.0; 3], 0.0);
                let ti = usize::from(system.types[i]) * nt;
                cells.for_each_neighbour(&pos, i, |j, d, r2| {
                    let (c6, c12) = table[ti + usize::from(system.types[j])];
                    let s = lj_force_over_r(r2, c6, c12);
                    for k in 0..3 {
                        fi[k] -= s * d[k];
                    }
                    stiff += lj_force_gradient_norm(r2, c6, c12);
                    if j > i {
                        e += lj_potential_shifted(r2, c6, c12, rc);
                    }
                });
                (fi, stiff)
            })
            .collect();
        (f, e)
    });
    let mut out = ReferenceForces {
        forces: Vec::with_capacity(pos.len()),
        stiffness: Vec::with_capacity(pos.len()),
        energy: 0.0,
        rounding: displacement_rounding(system.box_size),
    };
    for (f, e) in done {
        for (fi, stiff) in f {
            out.forces.push(fi);
            out.stiffness.push(stiff);
        }
        out.energy += e;
    }
    Ok(out)
}

/// LJ force on every atom of the undecomposed system (kJ/mol/nm), plain cutoff at `cutoff`
/// (nm), minimum image, in `f64`.
pub fn lj_forces(system: &MolecularSystem, cutoff: f32) -> Result<Vec<[f64; 3]>, ReferenceError> {
    check_cutoff(system, cutoff)?;
    let pos = wrapped_positions(system);
    let box_size = system.box_size.map(f64::from);
    let table = pair_table(system);
    let nt = system.atom_types.len();
    let mut f = vec![[0.0; 3]; pos.len()];
    for_each_pair(&pos, box_size, f64::from(cutoff), |i, j, d, r2| {
        let (c6, c12) = table[usize::from(system.types[i]) * nt + usize::from(system.types[j])];
        let s = lj_force_over_r(r2, c6, c12);
        for k in 0..3 {
            f[i][k] -= s * d[k];
            f[j][k] += s * d[k];
        }
    });
    Ok(f)
}

/// Total potential-shifted LJ energy of the undecomposed system (kJ/mol), pairs within `cutoff`
/// (nm), minimum image, in `f64` ([`lj_potential_shifted`]).
pub fn lj_energy(system: &MolecularSystem, cutoff: f32) -> Result<f64, ReferenceError> {
    check_cutoff(system, cutoff)?;
    let pos = wrapped_positions(system);
    let table = pair_table(system);
    let nt = system.atom_types.len();
    let mut e = 0.0;
    for_each_pair(&pos, system.box_size.map(f64::from), f64::from(cutoff), |i, j, _, r2| {
        let (c6, c12) = table[usize::from(system.types[i]) * nt + usize::from(system.types[j])];
        e += lj_potential_shifted(r2, c6, c12, f64::from(cutoff));
    });
    Ok(e)
}

pub(super) fn pair_table(system: &MolecularSystem) -> Vec<(f64, f64)> {
    let n = system.atom_types.len();
    (0..n * n)
        .map(|k| {
            let p = system.lj_pair(k / n, k % n);
            (p.c6, p.c12)
        })
        .collect()
}

/// Forces each rank computes from its assigned pairs (local and non-local), on its local atoms,
/// before the force halo: `coords` are the local coordinates (for example from
/// [`super::exchange_coordinates_f64`]); the displacement is folded to the minimum image, which
/// changes nothing along decomposed dimensions (the halo already holds the right images).
pub fn rank_pair_forces(
    plan: &HaloPlan,
    system: &MolecularSystem,
    pairs: &PairAssignment,
    coords: &[Vec<[f64; 3]>],
) -> Result<Vec<Vec<[f64; 3]>>, ReferenceError> {
    if coords.len() != plan.ranks.len() || pairs.ranks.len() != plan.ranks.len() {
        return Err(ReferenceError::RankCount { found: coords.len().min(pairs.ranks.len()), expected: plan.ranks.len() });
    }
    let box_size = plan.box_size.map(f64::from);
    let table = pair_table(system);
    let nt = system.atom_types.len();
    let mut out = Vec::with_capacity(plan.ranks.len());
    for ((r, x), rp) in plan.ranks.iter().zip(coords).zip(&pairs.ranks) {
        if x.len() != r.total_atoms {
            return Err(ReferenceError::Length { rank: r.rank, found: x.len(), expected: r.total_atoms });
        }
        let type_of = |local: u32| -> Result<usize, ReferenceError> {
            let id = *r.global_ids.get(local as usize).ok_or(ReferenceError::Length {
                rank: r.rank,
                found: local as usize + 1,
                expected: r.total_atoms,
            })?;
            system.types.get(id as usize).map(|&t| usize::from(t)).ok_or(ReferenceError::Plan(crate::decomp::PlanError::GlobalId {
                rank: r.rank,
                local: local as usize,
                id,
                atoms: system.types.len(),
            }))
        };
        let mut f = vec![[0.0; 3]; r.total_atoms];
        for &[i, j] in rp.local.iter().chain(&rp.nonlocal) {
            let (ti, tj) = (type_of(i)?, type_of(j)?);
            let (xi, xj) = (x[i as usize], x[j as usize]);
            let d: [f64; 3] = std::array::from_fn(|k| min_image(xj[k] - xi[k], box_size[k]));
            let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
            let (c6, c12) = table[ti * nt + tj];
            let s = lj_force_over_r(r2, c6, c12);
            for k in 0..3 {
                f[i as usize][k] -= s * d[k];
                f[j as usize][k] += s * d[k];
            }
        }
        out.push(f);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_list_finds_the_same_pairs_as_brute_force() {
        for (atoms, rc) in [(300, 0.3), (300, 0.6), (700, 0.85), (27, 0.1)] {
            let s = MolecularSystem::generate(atoms, 9).unwrap();
            let pos = wrapped_positions(&s);
            let b = s.box_size.map(f64::from);
            let mut found = Vec::new();
            for_each_pair(&pos, b, rc, |i, j, _, _| found.push((i, j)));
            found.sort_unstable();
            let mut brute = Vec::new();
            for i in 0..pos.len() {
                for j in i + 1..pos.len() {
                    let r2: f64 = (0..3).map(|k| min_image(pos[j][k] - pos[i][k], b[k]).powi(2)).sum();
                    if r2 < rc * rc {
                        brute.push((i, j));
                    }
                }
            }
            assert_eq!(found, brute, "{atoms} atoms, cutoff {rc}");
        }
    }

    #[test]
    fn forces_obey_newtons_third_law_and_match_the_derivative() {
        let s = MolecularSystem::generate(500, 1).unwrap();
        let f = lj_forces(&s, 0.8).unwrap();
        let total: [f64; 3] = std::array::from_fn(|k| f.iter().map(|v| v[k]).sum());
        let scale = f.iter().map(|v| v[0].abs()).fold(0.0, f64::max);
        assert!(total.iter().all(|t| t.abs() < 1e-9 * scale * 500.0), "{total:?}");
        // F/r against a finite difference of V = c12/r^12 - c6/r^6.
        let (c6, c12) = (1e-3, 1e-6);
        let v = |r: f64| c12 / r.powi(12) - c6 / r.powi(6);
        let r = 0.35;
        let h = 1e-6;
        let fd = -(v(r + h) - v(r - h)) / (2.0 * h);
        assert!((lj_force_over_r(r * r, c6, c12) * r - fd).abs() < 1e-6 * fd.abs().max(1.0));
    }

    #[test]
    fn the_shifted_potential_vanishes_at_the_cutoff_and_keeps_the_force() {
        let (c6, c12, rc) = (1e-3, 1e-6, 0.9);
        assert!(lj_potential_shifted(rc * rc, c6, c12, rc).abs() < 1e-15);
        let h = 1e-6;
        let r = 0.31;
        let fd = -(lj_potential_shifted((r + h) * (r + h), c6, c12, rc) - lj_potential_shifted((r - h) * (r - h), c6, c12, rc)) / (2.0 * h);
        assert!((lj_force_over_r(r * r, c6, c12) * r - fd).abs() < 1e-6 * fd.abs().max(1.0));
        // The system's energy is the sum over the same pairs as the forces.
        let s = MolecularSystem::generate(300, 4).unwrap();
        let e = lj_energy(&s, 0.6).unwrap();
        let (pos, b, rc) = (wrapped_positions(&s), s.box_size.map(f64::from), f64::from(0.6f32));
        let mut brute = 0.0;
        for i in 0..pos.len() {
            for j in i + 1..pos.len() {
                if let Some((_, r2)) = pair_within_cutoff(&pos[i], &pos[j], b, rc) {
                    let p = s.lj_pair(usize::from(s.types[i]), usize::from(s.types[j]));
                    brute += lj_potential_shifted(r2, p.c6, p.c12, rc);
                }
            }
        }
        assert!((e - brute).abs() < 1e-9 * brute.abs() && e != 0.0, "{e} vs {brute}");
    }

    #[test]
    fn the_force_gradient_norm_bounds_what_a_displacement_error_does_and_is_reached() {
        let (c6, c12) = (1.435e-4, 7.93e-9);
        let force = |d: [f64; 3]| {
            let s = lj_force_over_r(d.iter().map(|c| c * c).sum(), c6, c12);
            d.map(|c| -s * c)
        };
        let dist = |a: [f64; 3], b: [f64; 3]| (0..3).map(|k| (a[k] - b[k]).powi(2)).sum::<f64>().sqrt();
        for r in [0.17, 0.2, 0.25, 0.5, 0.9] {
            let d = [r * 0.6, r * 0.8, 0.0];
            let g = lj_force_gradient_norm(r * r, c6, c12);
            let e = 1e-7;
            let mut largest = 0.0f64;
            for dir in [[0.6, 0.8, 0.0], [-0.8, 0.6, 0.0], [0.0, 0.0, 1.0], [0.36, 0.48, 0.8]] {
                let moved = std::array::from_fn(|k| d[k] + e * dir[k]);
                let change = dist(force(moved), force(d));
                assert!(change <= g * e * (1.0 + 1e-5), "r {r}: {change:e} against {:e}", g * e);
                largest = largest.max(change);
            }
            // Along the pair or across it, one direction reaches the bound.
            assert!(largest >= g * e * (1.0 - 1e-5), "r {r}: {largest:e} against {:e}", g * e);
        }
        // The f32 grid below twice the box: 24.3 nm has a spacing of 2^-19 nm.
        assert_eq!(displacement_rounding([12.1644, 6.0, 3.0]), 3f64.sqrt() * 2f64.powi(-19));
        assert_eq!(displacement_rounding([3.0, 4.5, 1.0]), 3f64.sqrt() * 2f64.powi(-20));
    }

    #[test]
    fn one_parallel_pass_gives_the_forces_and_energy_of_the_two_serial_ones_for_any_worker_count() {
        // 2,600 atoms: three parts of `REFERENCE_CHUNK`, the last one short.
        let s = MolecularSystem::generate(2600, 7).unwrap();
        let (want_f, want_e) = (lj_forces(&s, 0.9).unwrap(), lj_energy(&s, 0.9).unwrap());
        let scale = want_f.iter().flat_map(|v| v.iter()).fold(0.0f64, |m, c| m.max(c.abs()));
        let ReferenceForces { forces: f1, stiffness: k1, energy: e1, .. } = lj_forces_and_energy(&s, 0.9, &Workers::serial()).unwrap();
        assert_eq!(f1.len(), want_f.len());
        for (i, (a, b)) in f1.iter().zip(&want_f).enumerate() {
            for k in 0..3 {
                assert!((a[k] - b[k]).abs() <= 1e-12 * scale, "atom {i} component {k}: {} vs {}", a[k], b[k]);
            }
        }
        assert!((e1 - want_e).abs() <= 1e-12 * want_e.abs() && e1 != 0.0, "{e1} vs {want_e}");
        for threads in [2, 3] {
            let r = lj_forces_and_energy(&s, 0.9, &Workers::new(threads).unwrap()).unwrap();
            assert!(r.forces == f1 && r.stiffness == k1 && r.energy.to_bits() == e1.to_bits(), "{threads} workers changed the result");
        }
        // A wrong pair term shows: one atom moved changes both.
        let mut moved = s.clone();
        moved.positions[5].x += 0.01;
        let r2 = lj_forces_and_energy(&moved, 0.9, &Workers::serial()).unwrap();
        assert!(r2.forces[5] != f1[5] && r2.stiffness[5] != k1[5] && r2.energy != e1);
        assert!(lj_forces_and_energy(&s, 5.0, &Workers::serial()).is_err());
    }

    #[test]
    fn bad_cutoffs_are_errors() {
        let s = MolecularSystem::generate(200, 1).unwrap();
        assert!(matches!(lj_forces(&s, 5.0), Err(ReferenceError::Plan(crate::decomp::PlanError::CutoffTooLarge { .. }))));
        assert!(lj_forces(&s, -1.0).is_err());
    }
}
