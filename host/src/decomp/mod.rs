//! Domain decomposition and halo plans, after GROMACS's eighth-shell scheme.
//!
//! The box is cut into a uniform `A x B x C` grid of cells, one per rank. Each rank receives the
//! atoms within the cutoff *above* its cell (larger x, y, z), dimension by dimension in the order
//! x, y, z, so that every pair of atoms within the cutoff is present on the rank owning the
//! componentwise-lowest cell of the pair. See `docs/decomposition.md` for a worked example.
//!
//! | item | what it is |
//! |---|---|
//! | [`RankGrid`] | the grid of ranks, parsed from `"AxBxC"` |
//! | [`Decomposition`] | cell geometry and pulses per dimension for a box and cutoff |
//! | [`HaloPlan`] | per-rank local layout and per-pulse index maps, sizes and offsets |
//! | [`redecompose`] | the same plan built from each process's own ranks' atoms, with small collectives |
//! | [`redecompose_on_devices`] | the same plan with each rank's per-atom passes where its home atoms are ([`HomeDevice`]) |
//! | [`GpuHome`] | a rank's home atoms redecomposed on its GPU: the three blocks below, one wait after each collective |
//! | [`GpuMigrate`] | a rank's home atoms wrapped, assigned and split into stayers and leavers on the GPU |
//! | [`GpuMerge`] | a rank's arrivals merged into its stayers in id order on the GPU, after [`GpuMigrate`] |
//! | [`GpuSelect`] | the home part of each decomposed dimension's first pulse, selected on the GPU |
//! | [`scan`], [`GpuExtent`] | whether positions lie in bounds, and their extent: on the host in one vectorized pass, or on the GPU |
//! | [`WarpParts`] | per-warp facts of a device array ([`GpuExtent`], [`GpuIdFacts`]), folded on the host |
//! | [`PlanError`] | why a decomposition cannot be built or a plan is inconsistent |

mod bounds;
mod error;
mod gpu_checks;
mod gpu_extent;
mod gpu_home;
mod gpu_id_facts;
mod gpu_merge;
#[cfg(test)]
mod gpu_merge_tests;
mod gpu_migrate;
#[cfg(test)]
mod gpu_migrate_tests;
mod gpu_parts;
mod gpu_select;
#[cfg(test)]
mod gpu_select_tests;
mod grid;
mod home_check;
mod plan;
mod redecompose;
#[cfg(test)]
mod redecompose_tests;
mod select;
mod validate;

pub use bounds::{Scan, scan};
pub use error::PlanError;
pub use gpu_extent::{GpuExtent, fold_extent};
pub use gpu_home::{GpuHome, GpuRank};
pub use gpu_id_facts::GpuIdFacts;
pub use gpu_merge::{GpuMerge, MergeArrays, MergeReference, merge_reference};
pub use gpu_migrate::{GpuMigrate, MigrateArrays, MigrateReference, Migrated, migrate_geometry, migrate_reference, owner_in};
pub use gpu_parts::{HomeIdFactsKernel, PartsKernel, PositionExtent, WarpParts};
#[cfg(any(test, feature = "test-support"))]
pub(crate) use gpu_select::selection_edges;
pub use gpu_select::{GpuSelect, Selected, SelectedDim, select_geometry, select_reference, selected_in};
pub use grid::{DIM_NAMES, Decomposition, MAX_RANKS, RankGrid, pulses_needed, wrap_position, wrap_positions};
pub use home_check::{HomeIdFacts, fold_id_facts};
pub use plan::{HaloPlan, PlanScratch, PulsePlan, RankPlan, SEND_MARGIN};
pub use redecompose::{
    Collective, HomeAtoms, HomeDevice, MergedHome, PlanRider, RedecomposeScratch, Redecomposed, TAG_HOMES, TAG_MIGRATE, TAG_PLAN, redecompose,
    redecompose_on_devices, redecompose_with,
};
