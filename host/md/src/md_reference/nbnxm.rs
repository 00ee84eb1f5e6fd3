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
                        f(ListPair { i: a, j: b, d, r2: d[0] * d[0] + d[1] * d[1] + d[2] * d[2], word, k });
                    }
                }
            }
        }
    }
}

/// Forces on every local atom and the potential-shifted energy of the pairs of `list` closer than
/// `cutoff`, with `table[ti * ntypes + tj] = (c6, c12)` and the grid's slot types.
pub fn cluster_list_forces(grid: &ClusterGrid, list: &ClusterPairList, coords: &[[f64; 3]], table: &[(f64, f64)], cutoff: f64) -> (Vec<[f64; 3]>, f64) {
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
            for c in 0..3 {
                f[p.i as usize][c] -= s * p.d[c];
                f[p.j as usize][c] += s * p.d[c];
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
    use crate::nbnxm::{BufferModel, LocalAtoms, PairSearch, SearchOptions};
    use crate::md_reference::{exchange_coordinates_f64, exchange_forces_f64, lj_energy, lj_forces, min_image};
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

    /// The buffer rule against the motion it models: atoms moved ballistically for the list's
    /// lifetime. Pairs that enter the cutoff from beyond `rlist` must stay near the rule's expected
    /// count, and a buffer half as large must miss far more.
    #[test]
    fn the_buffer_covers_ballistic_motion_over_the_list_lifetime() {
        let sys = MolecularSystem::generate(6000, 21).unwrap();
        let (cutoff, steps, dt, tol) = (1.0, 50u32, 0.002, 2e-3);
        let model = BufferModel::for_system(&sys, dt);
        let buffer = model.buffer_for(cutoff, steps, tol);
        let b = sys.box_size.map(f64::from);
        let before = wrapped_positions(&sys);
        let t = f64::from(steps) * dt;
        let mut moved = sys.clone();
        for (p, v) in moved.positions.iter_mut().zip(&sys.velocities) {
            *p = kernels_gpu::abi::Float3::new(p.x + v.x * t as f32, p.y + v.y * t as f32, p.z + v.z * t as f32);
        }
        let after = wrapped_positions(&moved);
        let missed = |buf: f64| {
            let mut n = 0usize;
            for_each_pair(&after, b, cutoff, |i, j, _, _| {
                let r2: f64 = (0..3).map(|c| min_image(before[j][c] - before[i][c], b[c]).powi(2)).sum();
                n += usize::from(r2 >= (cutoff + buf).powi(2));
            });
            n
        };
        let expected = tol * sys.len() as f64;
        let got = missed(buffer);
        assert!((got as f64) <= 4.0 * expected + 10.0, "buffer {buffer:.4} nm: {got} pairs entered from beyond rlist, expected about {expected}");
        let half = missed(buffer / 2.0);
        assert!(half as f64 > 20.0 * expected, "half the buffer misses only {half}");
        eprintln!("buffer {buffer:.4} nm for {steps} steps: {got} missed (expected {expected:.1}), half buffer {half}");
    }
}
