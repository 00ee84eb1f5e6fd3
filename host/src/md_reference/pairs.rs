//! Which rank computes which pair. Rule: the rank owning the componentwise-lowest cell of the
//! pair, i.e. along every decomposed dimension, the cell of whichever atom of the pair is lower
//! there (in the minimum image). That rank holds both atoms: the halo brings it every atom within
//! the cutoff of its cell from above, and the higher atom of the pair is within the cutoff of the
//! lower one's cell along every dimension and in distance (see `docs/decomposition.md`).
//!
//! The rule is evaluated the way a rank would, on each rank's local copies, and the host then
//! checks that the ranks' choices partition the undecomposed system's pairs.

use super::lj::{check_cutoff, for_each_pair, wrapped_positions};
use super::ReferenceError;
use crate::decomp::HaloPlan;
use crate::system::MolecularSystem;
use serde::{Deserialize, Serialize};

/// The pairs one rank computes, as local indices `[i, j]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankPairs {
    /// Pairs of two home atoms: computable before the coordinate halo arrives (local kernel).
    pub local: Vec<[u32; 2]>,
    /// Pairs with at least one halo atom: computable after the halo (non-local kernel).
    pub nonlocal: Vec<[u32; 2]>,
}

/// Every rank's pairs; together they hold each pair within the cutoff exactly once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairAssignment {
    /// Per rank, indexed by rank.
    pub ranks: Vec<RankPairs>,
    /// Pairs within the cutoff in the undecomposed system (= the sum over ranks).
    pub total_pairs: usize,
}

/// Assigns every pair of atoms closer than `cutoff` (nm, at most the plan's cutoff) to exactly
/// one rank, and checks it: each rank decides from its local copies which of the pairs it holds
/// within the cutoff it owns; any pair of the undecomposed system owned by no rank or by several
/// is an error ([`ReferenceError::PairMissing`], [`ReferenceError::PairDuplicated`]).
///
/// Force kernels must fold the displacement to the minimum image along dimensions that are not
/// decomposed (a rank spans the whole box there); along decomposed ones the local copies are
/// already the right images.
pub fn assign_pairs(plan: &HaloPlan, system: &MolecularSystem, cutoff: f32) -> Result<PairAssignment, ReferenceError> {
    plan.validate()?;
    let n = system.len();
    plan.validate_atoms(n)?;
    check_cutoff(system, cutoff)?;
    if cutoff > plan.cutoff {
        return Err(ReferenceError::CutoffAbovePlan { cutoff, plan_cutoff: plan.cutoff });
    }
    let geo = plan.decomposition()?;
    let grid = plan.grid;
    let decomposed = grid.decomposed_dims();
    let pos = wrapped_positions(system);
    let cells: Vec<[usize; 3]> = pos.iter().map(|&p| geo.cell_of(p)).collect();
    let box_size = plan.box_size.map(f64::from);

    // Image of each local copy: how many box lengths it was shifted along each dimension.
    let mut image: Vec<Vec<[i8; 3]>> = plan.ranks.iter().map(|r| vec![[0; 3]; r.total_atoms]).collect();
    for pulse in 0..plan.num_pulses() {
        for r in &plan.ranks {
            let p = &r.pulses[pulse];
            let to = p.send_rank;
            let off = plan.ranks[to].pulses[pulse].atom_offset;
            for (k, &i) in p.index_map.iter().enumerate() {
                let mut img = image[r.rank][i as usize];
                img[p.dim] += i8::from(p.use_shift);
                image[to][off + k] = img;
            }
        }
    }
    // Where each atom has copies: (rank, local index), compressed by atom.
    let mut start = vec![0usize; n + 1];
    for r in &plan.ranks {
        for &id in &r.global_ids {
            start[id as usize + 1] += 1;
        }
    }
    for a in 0..n {
        start[a + 1] += start[a];
    }
    let mut fill = start.clone();
    let mut copies = vec![(0u32, 0u32); start[n]];
    for r in &plan.ranks {
        for (local, &id) in r.global_ids.iter().enumerate() {
            copies[fill[id as usize]] = (r.rank as u32, local as u32);
            fill[id as usize] += 1;
        }
    }
    // Local index of each atom on each rank (u32::MAX: absent).
    let mut local_of: Vec<Vec<u32>> = vec![vec![u32::MAX; n]; plan.ranks.len()];
    for r in &plan.ranks {
        for (local, &id) in r.global_ids.iter().enumerate() {
            local_of[r.rank][id as usize] = local as u32;
        }
    }

    let rc2 = f64::from(cutoff).powi(2);
    let mut out = PairAssignment { ranks: vec![RankPairs::default(); plan.ranks.len()], total_pairs: 0 };
    let mut result = Ok(());
    for_each_pair(&pos, box_size, f64::from(cutoff), |i, j, _, _| {
        if result.is_err() {
            return;
        }
        out.total_pairs += 1;
        let mut owners = Vec::new();
        for &(rank, li) in &copies[start[i]..start[i + 1]] {
            let rank = rank as usize;
            let lj = local_of[rank][j];
            if lj == u32::MAX {
                continue;
            }
            let (ki, kj) = (image[rank][li as usize], image[rank][lj as usize]);
            // The displacement between the two local copies, with the same operations as the
            // undecomposed search so that a pair is inside the cutoff in both or in neither.
            let mut d = [0.0; 3];
            for k in 0..3 {
                let raw = pos[j][k] - pos[i][k];
                d[k] = if grid.dims[k] == 1 { super::min_image(raw, box_size[k]) } else { raw + f64::from(kj[k] - ki[k]) * box_size[k] };
            }
            if d[0] * d[0] + d[1] * d[1] + d[2] * d[2] >= rc2 {
                continue;
            }
            let coords = grid.coords_of(rank);
            let owns = decomposed.iter().all(|&e| {
                let (lower, img) = if d[e] >= 0.0 { (i, ki) } else { (j, kj) };
                cells[lower][e] == coords[e] && img[e] == 0
            });
            if owns {
                owners.push((rank, li, lj));
            }
        }
        match owners.as_slice() {
            [(rank, li, lj)] => {
                let home = plan.ranks[*rank].home_atoms as u32;
                let rp = &mut out.ranks[*rank];
                if *li < home && *lj < home { rp.local.push([*li, *lj]) } else { rp.nonlocal.push([*li, *lj]) }
            }
            [] => result = Err(ReferenceError::PairMissing { i: i as u32, j: j as u32 }),
            many => {
                result = Err(ReferenceError::PairDuplicated { i: i as u32, j: j as u32, ranks: many.iter().map(|o| o.0).collect() })
            }
        }
    });
    result.map(|()| out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decomp::RankGrid;
    use crate::md_reference::{exchange_coordinates_f64, exchange_forces_f64, lj_forces, rank_pair_forces};

    fn decomposed_forces(atoms: usize, grid: [usize; 3], cutoff: f32) -> (Vec<[f64; 3]>, Vec<[f64; 3]>) {
        let sys = MolecularSystem::generate(atoms, 4).unwrap();
        let plan = HaloPlan::build(&sys, RankGrid::new(grid).unwrap(), cutoff).unwrap();
        let pairs = assign_pairs(&plan, &sys, cutoff).unwrap();
        let x = exchange_coordinates_f64(&plan, &sys).unwrap();
        let f = exchange_forces_f64(&plan, &rank_pair_forces(&plan, &sys, &pairs, &x).unwrap()).unwrap();
        let mut total = vec![[f64::NAN; 3]; atoms];
        for r in &plan.ranks {
            for (k, &id) in r.global_ids[..r.home_atoms].iter().enumerate() {
                total[id as usize] = f[r.rank][k];
            }
        }
        (total, lj_forces(&sys, cutoff).unwrap())
    }

    #[test]
    fn decomposed_forces_equal_the_undecomposed_ones() {
        for (grid, cutoff) in [([1, 1, 1], 0.9), ([2, 1, 1], 0.9), ([2, 2, 1], 0.9), ([2, 2, 2], 0.7), ([3, 3, 2], 1.0)] {
            let (got, want) = decomposed_forces(1200, grid, cutoff);
            for (a, (g, w)) in got.iter().zip(&want).enumerate() {
                for k in 0..3 {
                    let tol = 1e-9 * (w[0].abs() + w[1].abs() + w[2].abs()).max(1.0);
                    assert!((g[k] - w[k]).abs() <= tol, "{grid:?} atom {a}: {g:?} vs {w:?}");
                }
            }
        }
    }

    #[test]
    fn home_pairs_go_to_the_local_kernel() {
        let sys = MolecularSystem::generate(800, 2).unwrap();
        let plan = HaloPlan::build(&sys, RankGrid::new([2, 1, 1]).unwrap(), 0.8).unwrap();
        let pairs = assign_pairs(&plan, &sys, 0.8).unwrap();
        let counted: usize = pairs.ranks.iter().map(|r| r.local.len() + r.nonlocal.len()).sum();
        assert_eq!(counted, pairs.total_pairs);
        for (r, rp) in plan.ranks.iter().zip(&pairs.ranks) {
            let h = r.home_atoms as u32;
            assert!(rp.local.iter().all(|p| p[0] < h && p[1] < h));
            assert!(rp.nonlocal.iter().all(|p| p[0] >= h || p[1] >= h));
            assert!(!rp.local.is_empty() && !rp.nonlocal.is_empty());
        }
        assert!(matches!(assign_pairs(&plan, &sys, 0.9), Err(ReferenceError::CutoffAbovePlan { .. })));
    }

    #[test]
    fn a_plan_missing_atoms_is_caught() {
        // Built with a smaller cutoff than the pairs need: some owners lack a partner.
        let sys = MolecularSystem::generate(800, 2).unwrap();
        let mut plan = HaloPlan::build(&sys, RankGrid::new([2, 2, 1]).unwrap(), 0.5).unwrap();
        plan.cutoff = 0.8;
        let e = assign_pairs(&plan, &sys, 0.8).unwrap_err();
        assert!(matches!(e, ReferenceError::PairMissing { .. }), "{e}");
    }
}
