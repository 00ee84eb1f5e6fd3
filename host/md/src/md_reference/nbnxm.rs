//! CPU references of the cluster-pair kernels, in `f64`: the atom pairs a list covers, the forces
//! and potential-shifted energy of a list (what `nbnxm_forces[_energy]` computes), and the pruned
//! list (what `nbnxm_prune` computes). They walk the lists exactly as the kernels do (mask bits,
//! padding slots, the `ti < tj` rule of the self cluster pair, the entry's shift on the i-atom),
//! with the arithmetic in `f64`.

use super::lj::{lj_force_over_r, lj_potential_shifted};
use crate::abi::{NBNXM_CENTRAL_SHIFT, NBNXM_CLUSTER_SIZE, NBNXM_CLUSTERS_PER_SUPER, NBNXM_FILLER, NBNXM_MASK_BITS};
use crate::nbnxm::{ClusterGrid, ClusterPairList};

const CL: usize = NBNXM_CLUSTER_SIZE as usize;
const SC: usize = NBNXM_CLUSTERS_PER_SUPER as usize;
const MASK: u32 = (1 << NBNXM_MASK_BITS) - 1;

/// One atom pair of a list: local atoms `i` (of the i-cluster) and `j`, the displacement
/// `d = x_j - (x_i + shift)` and `r2 = |d|²`, and where it sits in the list.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ListPair {
    /// Local atom of the i-cluster.
    pub i: u32,
    /// Local atom of the j-cluster.
    pub j: u32,
    /// Displacement (nm).
    pub d: [f64; 3],
    /// Squared distance (nm²).
    pub r2: f64,
    /// Index of the j-list word.
    pub word: usize,
    /// i-cluster within the supercluster (the mask bit).
    pub k: usize,
    /// Slot of the j-atom within its j-cluster (`0..NBNXM_CLUSTER_SIZE`).
    pub tj: usize,
}

fn shift_vector(shift: u32, box_size: [f32; 3]) -> [f64; 3] {
    let s = [shift % 3, (shift / 3) % 3, shift / 9];
    std::array::from_fn(|d| (f64::from(s[d]) - 1.0) * f64::from(box_size[d]))
}

/// Calls `f` for every atom pair `list` covers (set mask bits, real atoms only, `ti < tj` on the
/// self cluster pair), with coordinates `coords` (one per local atom, in the grid's frame).
pub fn list_atom_pairs(grid: &ClusterGrid, list: &ClusterPairList, coords: &[[f64; 3]], mut f: impl FnMut(ListPair)) {
    for e in &list.entries {
        let s = shift_vector(e.shift, grid.box_size);
        let central = e.shift == NBNXM_CENTRAL_SHIFT;
        for word in e.j_start as usize..e.j_end as usize {
            let w = list.j_list[word];
            let cj = (w >> NBNXM_MASK_BITS) as usize;
            for k in (0..SC).filter(|k| w & MASK & (1 << k) != 0) {
                let ci = e.sci as usize * SC + k;
                for ti in 0..CL {
                    let a = grid.atom_index[ci * CL + ti];
                    if a == NBNXM_FILLER {
                        continue;
                    }
                    let xi: [f64; 3] = std::array::from_fn(|d| coords[a as usize][d] + s[d]);
                    for tj in 0..CL {
                        let b = grid.atom_index[cj * CL + tj];
                        if b == NBNXM_FILLER || (central && ci == cj && ti >= tj) {
                            continue;
                        }
                        let d: [f64; 3] = std::array::from_fn(|c| coords[b as usize][c] - xi[c]);
                        f(ListPair { i: a, j: b, d, r2: d[0] * d[0] + d[1] * d[1] + d[2] * d[2], word, k, tj });
                    }
                }
            }
        }
    }
}

/// Forces on every local atom and the potential-shifted energy of the pairs of `list` closer than
/// `cutoff`, with `table[ti * ntypes + tj] = (c6, c12)` and the grid's slot types.
pub fn cluster_list_forces(
    grid: &ClusterGrid,
    list: &ClusterPairList,
    coords: &[[f64; 3]],
    table: &[(f64, f64)],
    cutoff: f64,
) -> (Vec<[f64; 3]>, f64) {
    let nt = (table.len() as f64).sqrt().round() as usize;
    let mut ty = vec![0usize; grid.atoms];
    for (slot, &a) in grid.atom_index.iter().enumerate() {
        if a != NBNXM_FILLER {
            ty[a as usize] = grid.atom_type[slot] as usize;
        }
    }
    let mut f = vec![[0.0; 3]; grid.atoms];
    let mut energy = 0.0;
    list_atom_pairs(grid, list, coords, |p| {
        if p.r2 < cutoff * cutoff {
            let (c6, c12) = table[ty[p.i as usize] * nt + ty[p.j as usize]];
            let s = lj_force_over_r(p.r2, c6, c12);
            for (c, &d) in p.d.iter().enumerate() {
                f[p.i as usize][c] -= s * d;
                f[p.j as usize][c] += s * d;
            }
            energy += lj_potential_shifted(p.r2, c6, c12, cutoff);
        }
    });
    (f, energy)
}

/// The inner list: `list`'s words with mask bit `k` kept only where some covered atom pair of
/// i-cluster `k` is closer than `rlist_inner` at `coords`.
pub fn prune_reference(grid: &ClusterGrid, list: &ClusterPairList, coords: &[[f64; 3]], rlist_inner: f64) -> Vec<u32> {
    let mut kept: Vec<u32> = list.j_list.iter().map(|w| w & !MASK).collect();
    list_atom_pairs(grid, list, coords, |p| {
        if p.r2 < rlist_inner * rlist_inner {
            kept[p.word] |= 1 << p.k;
        }
    });
    kept
}

#[cfg(test)]
mod tests {
    use super::super::lj::{for_each_pair, pair_table, wrapped_positions};
    use super::*;
    use crate::decomp::{HaloPlan, RankGrid};
    use crate::md_reference::{
        exchange_coordinates_f64, exchange_forces_f64, lj_energy, lj_force_over_r, lj_forces, lj_potential_shifted, min_image,
    };
    use crate::nbnxm::{BufferModel, DEFAULT_DRIFT_TOLERANCE, LocalAtoms, PairSearch, SearchOptions};
    use crate::system::MolecularSystem;

    struct Rank {
        search: PairSearch,
        coords: Vec<[f64; 3]>,
        global: Vec<u32>,
    }

    fn ranks(sys: &MolecularSystem, dims: [usize; 3], rlist: f32, threads: usize) -> (HaloPlan, Vec<Rank>) {
        let plan = HaloPlan::build(sys, RankGrid::new(dims).unwrap(), rlist).unwrap();
        let coords = exchange_coordinates_f64(&plan, sys).unwrap();
        let opts = SearchOptions { threads, ..SearchOptions::new(rlist) };
        let out = plan
            .ranks
            .iter()
            .zip(coords)
            .map(|(r, coords)| {
                let atoms = LocalAtoms::from_plan(&plan, r.rank, &sys.positions, &sys.types).unwrap();
                Rank { search: PairSearch::build(&atoms, &opts).unwrap(), coords, global: r.global_ids.clone() }
            })
            .collect();
        (plan, out)
    }

    #[test]
    fn decomposed_cluster_forces_and_energy_equal_the_undecomposed_ones() {
        for (dims, cutoff, threads) in [([1, 1, 1], 0.9, 1), ([2, 1, 1], 0.9, 2), ([2, 2, 1], 0.9, 3), ([2, 2, 2], 0.7, 2), ([3, 3, 2], 1.0, 1)] {
            let sys = MolecularSystem::generate(1500, 4).unwrap();
            let (plan, ranks) = ranks(&sys, dims, cutoff + 0.1, threads);
            let table = pair_table(&sys);
            let mut energy = 0.0;
            let per_rank: Vec<Vec<[f64; 3]>> = ranks
                .iter()
                .map(|r| {
                    let (mut f, el) = cluster_list_forces(&r.search.grid, &r.search.local, &r.coords, &table, f64::from(cutoff));
                    let (fnl, enl) = cluster_list_forces(&r.search.grid, &r.search.nonlocal, &r.coords, &table, f64::from(cutoff));
                    for (a, b) in f.iter_mut().zip(&fnl) {
                        for c in 0..3 {
                            a[c] += b[c];
                        }
                    }
                    energy += el + enl;
                    f
                })
                .collect();
            let total = exchange_forces_f64(&plan, &per_rank).unwrap();
            let want = lj_forces(&sys, cutoff).unwrap();
            for (r, f) in plan.ranks.iter().zip(&total) {
                for (k, &g) in r.global_ids[..r.home_atoms].iter().enumerate() {
                    let w = want[g as usize];
                    let tol = 1e-9 * (w[0].abs() + w[1].abs() + w[2].abs()).max(1.0);
                    assert!((0..3).all(|c| (f[k][c] - w[c]).abs() <= tol), "{dims:?} atom {g}: {:?} vs {w:?}", f[k]);
                }
            }
            let want_e = lj_energy(&sys, cutoff).unwrap();
            assert!((energy - want_e).abs() <= 1e-9 * want_e.abs(), "{dims:?}: energy {energy} vs {want_e}");
        }
    }

    #[test]
    fn every_pair_within_the_cutoff_is_listed_once_across_lists_and_ranks() {
        let sys = MolecularSystem::generate(2000, 6).unwrap();
        let cutoff = 0.85f64;
        let pos = wrapped_positions(&sys);
        let mut truth = Vec::new();
        for_each_pair(&pos, sys.box_size.map(f64::from), cutoff, |i, j, _, _| truth.push((i as u32, j as u32)));
        truth.sort_unstable();
        for dims in [[1, 1, 1], [2, 1, 1], [1, 2, 2], [2, 2, 2], [3, 1, 1]] {
            let (plan, ranks) = ranks(&sys, dims, 0.95, 2);
            let mut union = Vec::new();
            for (r, rank) in plan.ranks.iter().zip(&ranks) {
                let g = &rank.search.grid;
                for (which, list) in [(0, &rank.search.local), (1, &rank.search.nonlocal)] {
                    list_atom_pairs(g, list, &rank.coords, |p| {
                        let home = (p.i as usize) < r.home_atoms && (p.j as usize) < r.home_atoms;
                        assert_eq!(home, which == 0, "{dims:?}: home pairs in the local list, halo pairs in the other");
                        if p.r2 < cutoff * cutoff {
                            let (a, b) = (rank.global[p.i as usize], rank.global[p.j as usize]);
                            union.push((a.min(b), a.max(b)));
                        }
                    });
                }
            }
            union.sort_unstable();
            assert_eq!(union.len(), truth.len(), "{dims:?}: pairs counted");
            assert!(union == truth, "{dims:?}: every pair within the cutoff exactly once");
        }
    }

    #[test]
    fn a_list_holds_every_pair_within_rlist() {
        // One rank, small box: shifts in every dimension, the self cluster pair, padding.
        for (atoms, rlist) in [(40, 0.35), (700, 0.9), (3000, 1.2)] {
            let sys = MolecularSystem::generate(atoms, 3).unwrap();
            let (_, ranks) = ranks(&sys, [1, 1, 1], rlist, 2);
            let r = &ranks[0];
            assert!(r.search.nonlocal.is_empty());
            let b = sys.box_size.map(f64::from);
            let mut listed = Vec::new();
            list_atom_pairs(&r.search.grid, &r.search.local, &r.coords, |p| {
                // The listed displacement is a minimum image when it is within the cutoff.
                if p.r2 < f64::from(rlist).powi(2) {
                    assert!((0..3).all(|c| (min_image(p.d[c], b[c]) - p.d[c]).abs() < 1e-9));
                    listed.push((p.i.min(p.j), p.i.max(p.j)));
                }
            });
            listed.sort_unstable();
            let mut truth = Vec::new();
            for_each_pair(&r.coords, b, f64::from(rlist), |i, j, _, _| truth.push((i as u32, j as u32)));
            truth.sort_unstable();
            assert!(listed == truth, "{atoms} atoms: {} listed, {} within rlist", listed.len(), truth.len());
        }
    }

    #[test]
    fn pruning_keeps_exactly_what_the_forces_need() {
        let sys = MolecularSystem::generate(3000, 11).unwrap();
        let (_, ranks) = ranks(&sys, [2, 1, 1], 1.3, 2);
        let table = pair_table(&sys);
        for r in &ranks {
            for list in [&r.search.local, &r.search.nonlocal] {
                let inner = ClusterPairList { entries: list.entries.clone(), j_list: prune_reference(&r.search.grid, list, &r.coords, 1.0) };
                assert!(inner.cluster_pairs() < list.cluster_pairs() * 3 / 4, "{} of {}", inner.cluster_pairs(), list.cluster_pairs());
                let (f_outer, e_outer) = cluster_list_forces(&r.search.grid, list, &r.coords, &table, 1.0);
                let (f_inner, e_inner) = cluster_list_forces(&r.search.grid, &inner, &r.coords, &table, 1.0);
                assert_eq!(f_outer, f_inner);
                assert_eq!(e_outer, e_inner);
                // Pruning at a smaller radius than the cutoff does lose forces.
                let short = ClusterPairList { entries: list.entries.clone(), j_list: prune_reference(&r.search.grid, list, &r.coords, 0.5) };
                assert_ne!(cluster_list_forces(&r.search.grid, &short, &r.coords, &table, 1.0).0, f_outer);
            }
        }
    }

    /// The pairs within `cutoff` at `after` (positions wrapped into the box): the squared
    /// minimum-image distance each had at `before`, and the magnitude of its shifted LJ energy at
    /// `after`, which a list that does not hold the pair misses.
    fn entered_pairs(sys: &MolecularSystem, before: &[[f64; 3]], after: &[[f64; 3]], cutoff: f64) -> Vec<(f64, f64)> {
        let b = sys.box_size.map(f64::from);
        let table = pair_table(sys);
        let nt = sys.atom_types.len();
        let mut out = Vec::new();
        for_each_pair(after, b, cutoff, |i, j, _, r2| {
            let r2_start: f64 = (0..3).map(|c| min_image(before[j][c] - before[i][c], b[c]).powi(2)).sum();
            let (c6, c12) = table[usize::from(sys.types[i]) * nt + usize::from(sys.types[j])];
            out.push((r2_start, lj_potential_shifted(r2, c6, c12, cutoff).abs()));
        });
        out
    }

    /// Drift (kJ/mol/ps per atom) that a list with cutoff `cutoff + buffer` would cause over
    /// `nstlist` steps of `dt`: the energy of the `pairs` (from [`entered_pairs`]) that were beyond
    /// `cutoff + buffer` at the search, per atom, over the list period; and how many they are.
    fn measured_drift(atoms: usize, pairs: &[(f64, f64)], cutoff: f64, buffer: f64, nstlist: u32, dt: f64) -> (f64, usize) {
        let missed = pairs.iter().filter(|p| p.0 >= (cutoff + buffer).powi(2));
        let (energy, n) = missed.fold((0.0, 0), |(e, n), p| (e + p.1, n + 1));
        (energy / atoms as f64 / (f64::from(nstlist) * dt), n)
    }

    /// A generated system, the model of its drift at cutoff 1 nm, nstlist 100 and dt 2 fs, the
    /// buffer for the default tolerance, and the box.
    fn drift_case(atoms: usize, seed: u64) -> (MolecularSystem, BufferModel, f64, [f64; 3]) {
        let sys = MolecularSystem::generate(atoms, seed).unwrap();
        let model = BufferModel::for_system(&sys, 0.002);
        let buffer = model.buffer_for(1.0, 100, DEFAULT_DRIFT_TOLERANCE);
        let b = sys.box_size.map(f64::from);
        (sys, model, buffer, b)
    }

    fn wrap(p: [f64; 3], b: [f64; 3]) -> [f64; 3] {
        std::array::from_fn(|c| p[c].rem_euclid(b[c]))
    }

    /// The drift estimate against the motion it models: atoms placed uniformly at random (pair
    /// density uniform at every distance, the model's assumption; the generated lattice is lumpy
    /// at 1 nm, by up to 30% depending on the atom count) and flown ballistically at their
    /// Maxwell–Boltzmann velocities for the list's lifetime (`nstlist - 1` steps). The energy of
    /// the pairs that entered the cutoff from beyond `rlist` must match the estimate (which also
    /// approximates the pair distance change by the radial displacement and the potential by
    /// its Taylor polynomial), with the chosen buffer and without one.
    #[test]
    fn the_drift_estimate_matches_ballistic_motion() {
        use rand::{Rng, SeedableRng};
        let (sys, model, buffer, b) = drift_case(4000, 21);
        let (cutoff, nstlist, dt) = (1.0, 100u32, 0.002);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let before: Vec<[f64; 3]> = (0..sys.len()).map(|_| std::array::from_fn(|c| rng.random::<f64>() * b[c])).collect();
        let t = f64::from(nstlist - 1) * dt;
        let after: Vec<[f64; 3]> = before
            .iter()
            .zip(&sys.velocities)
            .map(|(p, v)| wrap([p[0] + f64::from(v.x) * t, p[1] + f64::from(v.y) * t, p[2] + f64::from(v.z) * t], b))
            .collect();
        let entered = entered_pairs(&sys, &before, &after, cutoff);
        let n = sys.len();
        for buf in [buffer, 0.0] {
            let (got, pairs) = measured_drift(n, &entered, cutoff, buf, nstlist, dt);
            let want = model.drift(cutoff, buf, nstlist);
            eprintln!("ballistic, buffer {buf:.4} nm, {nstlist} steps: {pairs} pairs missed, drift {got:.3e} measured, {want:.3e} estimated");
            assert!(got <= 1.1 * want && got >= 0.7 * want, "buffer {buf}: measured drift {got:e}, estimate {want:e}");
        }
        let (got, _) = measured_drift(n, &entered, cutoff, buffer, nstlist, dt);
        assert!(got <= 1.1 * DEFAULT_DRIFT_TOLERANCE, "the chosen buffer {buffer} nm lets {got:e} kJ/mol/ps per atom drift");
        let (half, _) = measured_drift(n, &entered, cutoff, buffer / 2.0, nstlist, dt);
        assert!(half > DEFAULT_DRIFT_TOLERANCE, "half the buffer drifts only {half:e}");
    }

    /// The drift estimate against real dynamics: velocity Verlet with the system's LJ forces
    /// (cut at 0.6 nm for speed: the tail beyond adds under 0.03 kJ/mol/nm per pair) for the list's
    /// lifetime. Collisions slow atoms below ballistic flight, so the estimate must bound the
    /// measured drift, which must still be a visible fraction of it (the check is not vacuous).
    #[test]
    fn the_drift_estimate_bounds_lj_dynamics() {
        let (sys, model, buffer, b) = drift_case(2000, 22);
        let (cutoff, nstlist, dt) = (1.0, 100u32, 0.002);
        let table = pair_table(&sys);
        let nt = sys.atom_types.len();
        let mass: Vec<f64> = (0..sys.len()).map(|i| sys.mass(i)).collect();
        let before = wrapped_positions(&sys);
        let mut x = before.clone();
        let mut v: Vec<[f64; 3]> = sys.velocities.iter().map(|v| [v.x, v.y, v.z].map(f64::from)).collect();
        // Verlet list with a skin, rebuilt every 10 steps (atoms move far less than 0.1 nm in 10).
        let (rc_dyn, skin) = (0.6, 0.2);
        let mut list: Vec<(usize, usize)> = Vec::new();
        let forces = |x: &[[f64; 3]], list: &[(usize, usize)]| {
            let mut f = vec![[0.0; 3]; x.len()];
            for &(i, j) in list {
                let d: [f64; 3] = std::array::from_fn(|c| min_image(x[j][c] - x[i][c], b[c]));
                let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                if r2 < rc_dyn * rc_dyn {
                    let (c6, c12) = table[usize::from(sys.types[i]) * nt + usize::from(sys.types[j])];
                    let s = lj_force_over_r(r2, c6, c12);
                    for c in 0..3 {
                        f[i][c] -= s * d[c];
                        f[j][c] += s * d[c];
                    }
                }
            }
            f
        };
        let mut f = Vec::new();
        for step in 0..nstlist - 1 {
            if step % 10 == 0 {
                let wrapped: Vec<[f64; 3]> = x.iter().map(|p| wrap(*p, b)).collect();
                list.clear();
                for_each_pair(&wrapped, b, rc_dyn + skin, |i, j, _, _| list.push((i, j)));
                x = wrapped;
                if step == 0 {
                    f = forces(&x, &list);
                }
            }
            for i in 0..x.len() {
                for c in 0..3 {
                    v[i][c] += 0.5 * dt * f[i][c] / mass[i];
                    x[i][c] += dt * v[i][c];
                }
            }
            f = forces(&x, &list);
            for i in 0..x.len() {
                for c in 0..3 {
                    v[i][c] += 0.5 * dt * f[i][c] / mass[i];
                }
            }
        }
        let after: Vec<[f64; 3]> = x.iter().map(|p| wrap(*p, b)).collect();
        let entered = entered_pairs(&sys, &before, &after, cutoff);
        let (got, pairs) = measured_drift(sys.len(), &entered, cutoff, buffer, nstlist, dt);
        let want = model.drift(cutoff, buffer, nstlist);
        eprintln!("LJ dynamics, buffer {buffer:.4} nm, {nstlist} steps: {pairs} pairs missed, drift {got:.3e} measured, {want:.3e} estimated");
        assert!(got <= want && got <= DEFAULT_DRIFT_TOLERANCE, "measured drift {got:e} above the estimate {want:e}");
        let (unbuffered, _) = measured_drift(sys.len(), &entered, cutoff, 0.0, nstlist, dt);
        assert!(unbuffered > 0.05 * model.drift(cutoff, 0.0, nstlist), "without a buffer only {unbuffered:e}: the dynamics barely moved");
    }
}
