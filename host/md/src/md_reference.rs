//! CPU references for the decomposed MD step: the coordinate and force halo exchanges simulated
//! pulse by pulse, Lennard-Jones forces of the undecomposed system, and the assignment of every
//! pair within the cutoff to exactly one rank. Written for clarity; the tests compare the
//! decomposed path against the undecomposed one through these.
//!
//! (The per-kernel references live in [`mod@crate::reference`].)

mod halo;
mod lj;
mod nbnxm;
mod pairs;

pub use halo::{exchange_coordinates, exchange_coordinates_f64, exchange_forces, exchange_forces_f64};
pub use lj::{
    ReferenceForces, displacement_rounding, lj_energy, lj_force_gradient_norm, lj_force_over_r, lj_forces, lj_forces_and_energy,
    lj_potential_shifted, min_image, pair_within_cutoff, rank_pair_forces, wrapped_positions,
};
pub use nbnxm::{ListPair, cluster_list_forces, list_atom_pairs, prune_reference};
pub use pairs::{PairAssignment, RankPairs, assign_pairs};

use crate::decomp::PlanError;

/// Why a reference computation could not run, or found the decomposition wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReferenceError {
    /// The plan is invalid or does not fit the system.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Per-rank arrays for a different number of ranks.
    #[error("got arrays for {found} ranks, but the plan has {expected}")]
    RankCount {
        /// Arrays given.
        found: usize,
        /// Ranks in the plan.
        expected: usize,
    },
    /// A per-rank array has the wrong length.
    #[error("rank {rank}: got {found} values for {expected} local atoms")]
    Length {
        /// The rank.
        rank: usize,
        /// Values given.
        found: usize,
        /// Local atoms in the plan.
        expected: usize,
    },
    /// The pair cutoff exceeds what the plan's halo covers.
    #[error("pair cutoff {cutoff} nm exceeds the plan's halo cutoff {plan_cutoff} nm: build the plan with the larger cutoff")]
    CutoffAbovePlan {
        /// Pair cutoff asked for.
        cutoff: f32,
        /// The plan's cutoff.
        plan_cutoff: f32,
    },
    /// A pair within the cutoff that no rank computes.
    #[error("atoms {i} and {j} are within the cutoff but no rank computes their pair")]
    PairMissing {
        /// Global id.
        i: u32,
        /// Global id.
        j: u32,
    },
    /// A pair that several ranks compute.
    #[error("atoms {i} and {j} form a pair computed by ranks {ranks:?}, not by exactly one")]
    PairDuplicated {
        /// Global id.
        i: u32,
        /// Global id.
        j: u32,
        /// The ranks computing it.
        ranks: Vec<usize>,
    },
}
