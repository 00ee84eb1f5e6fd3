//! One neighbour-search interval: the decomposition of the current positions, its halo plan, the
//! pairs each rank computes, and everything the GPU needs per rank (types, masses, pair lists).
//! Rebuilt every `nstlist` steps, like GROMACS's domain decomposition and pair search.

use crate::abi::Float3;
use crate::decomp::{HaloPlan, RankGrid, wrap_position};
use crate::error::{HaloError, Result};
use crate::exchange::RankHalo;
use crate::md_reference::{self, PairAssignment};
use crate::system::MolecularSystem;

/// A pair list in compressed rows: row `i` holds `cols[row_start[i]..row_start[i + 1]]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Csr {
    /// `rows + 1` offsets.
    pub row_start: Vec<u32>,
    /// Partner of each pair.
    pub cols: Vec<u32>,
}

impl Csr {
    /// Rows `0..rows` from pairs `[i, j]` (stored under `i`).
    pub fn from_pairs(rows: usize, pairs: &[[u32; 2]]) -> Self {
        let mut row_start = vec![0u32; rows + 1];
        for &[i, _] in pairs {
            row_start[i as usize + 1] += 1;
        }
        for r in 0..rows {
            row_start[r + 1] += row_start[r];
        }
        let mut fill = row_start.clone();
        let mut cols = vec![0u32; pairs.len()];
        for &[i, j] in pairs {
            cols[fill[i as usize] as usize] = j;
            fill[i as usize] += 1;
        }
        Self { row_start, cols }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.row_start.len().saturating_sub(1)
    }
}

/// Per-rank data of one search interval.
#[derive(Clone, Debug)]
pub struct RankDomain {
    /// Global id of every local atom (home atoms first).
    pub global_ids: Vec<u32>,
    /// Atom type of every local atom.
    pub types: Vec<u32>,
    /// `1 / mass` of every home atom.
    pub inv_mass: Vec<f32>,
    /// Home–home pairs, rows over home atoms (the local kernel).
    pub local_pairs: Csr,
    /// Pairs with a halo atom, rows over all local atoms (the non-local kernel).
    pub nonlocal_pairs: Csr,
}

/// The whole decomposition of one search interval.
pub struct Domain {
    /// The halo plan.
    pub plan: HaloPlan,
    /// Each rank's halo, as the exchange consumes it.
    pub halos: Vec<RankHalo>,
    /// Each rank's atoms and pairs.
    pub ranks: Vec<RankDomain>,
    /// Pairs within the list cutoff in the whole system.
    pub total_pairs: usize,
}

impl Domain {
    /// Decomposes `system` (positions are wrapped into the box first) over `grid`, with halos and
    /// pair lists for `list_cutoff` (the interaction cutoff plus a buffer for the atoms' motion
    /// until the next rebuild). Checks that every pair is computed exactly once.
    pub fn build(system: &mut MolecularSystem, grid: RankGrid, list_cutoff: f32) -> Result<Self> {
        for p in &mut system.positions {
            *p = wrap_position(*p, system.box_size);
        }
        let plan = HaloPlan::build(system, grid, list_cutoff).map_err(|e| HaloError::InvalidInput(e.to_string()))?;
        let pairs: PairAssignment =
            md_reference::assign_pairs(&plan, system, list_cutoff).map_err(|e| HaloError::InvalidInput(format!("pair assignment: {e}")))?;
        let halos = plan.rank_halos();
        let ranks = plan
            .ranks
            .iter()
            .zip(&pairs.ranks)
            .map(|(r, p)| RankDomain {
                types: r.global_ids.iter().map(|&g| u32::from(system.types[g as usize])).collect(),
                inv_mass: r.global_ids[..r.home_atoms].iter().map(|&g| (1.0 / system.mass(g as usize)) as f32).collect(),
                local_pairs: Csr::from_pairs(r.home_atoms, &p.local),
                nonlocal_pairs: Csr::from_pairs(r.total_atoms, &p.nonlocal),
                global_ids: r.global_ids.clone(),
            })
            .collect();
        Ok(Self { plan, halos, ranks, total_pairs: pairs.total_pairs })
    }

    /// Home coordinates of every rank, taken from the system's positions.
    pub fn home_values(&self, values: &[Float3]) -> Vec<Vec<Float3>> {
        self.plan.ranks.iter().map(|r| r.global_ids[..r.home_atoms].iter().map(|&g| values[g as usize]).collect()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csr_keeps_every_pair_under_its_row() {
        let c = Csr::from_pairs(4, &[[2, 0], [0, 3], [2, 1], [0, 1]]);
        assert_eq!(c.row_start, vec![0, 2, 2, 4, 4]);
        assert_eq!(&c.cols[0..2], &[3, 1]);
        assert_eq!(&c.cols[2..4], &[0, 1]);
        assert_eq!(Csr::from_pairs(0, &[]).rows(), 0);
    }

    #[test]
    fn a_domain_covers_every_pair_and_its_halos_validate() {
        let mut s = MolecularSystem::generate(1500, 3).unwrap();
        let d = Domain::build(&mut s, RankGrid { dims: [2, 2, 1] }, 1.0).unwrap();
        crate::exchange::spec::validate(&d.halos).unwrap();
        let listed: usize = d.ranks.iter().map(|r| r.local_pairs.cols.len() + r.nonlocal_pairs.cols.len()).sum();
        assert_eq!(listed, d.total_pairs);
        assert!(d.total_pairs > 0);
    }
}
