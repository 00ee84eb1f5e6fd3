//! Cluster-pair non-bonded interactions (GROMACS's nbnxm scheme): one rank's local atoms sorted into
//! spatial clusters of 8, a cluster-pair list with a Verlet buffer split into a home–home list and
//! a list of pairs involving halo atoms, a GPU prune kernel that keeps a tighter inner list up to
//! date between searches, and the GPU force kernels. See `docs/nbnxm.md`.
//!
//! | item | what it is |
//! |---|---|
//! | [`LocalAtoms`] | one rank's atoms as the search sees them: positions in the rank's frame, types, zones |
//! | [`ClusterGrid`] | the atoms sorted into columns, superclusters of 64 and clusters of 8 (padded) |
//! | [`PairSearch`] | grid + the two cluster-pair lists of one rank, with the time each part took |
//! | [`ListSetup`], [`BufferModel`] | cutoff, list lifetimes and the buffers chosen for them |
//! | [`NbnxmGpu`] | the lists on the GPU and the launches of one step (prune, forces, energy) |
//! | [`DeviceGrid`] | the cluster grid in device memory; on one rank built there from the device coordinates |
//! | [`NbnxmKernel`], [`WarpsPerEntry`] | which kernel design the launches use, and how many warps share a list entry |
//! | [`entry_order`], [`DeviceOrder`] | the launch order of a list's entries (longest first), on the host and on the GPU |
//!
//! Use at a search step, per rank (see [`NbnxmGpu`] for the per-step calls):
//! ```no_run
//! # use halo_md::nbnxm::*;
//! # fn demo(plan: &halo::decomp::HaloPlan, system: &halo::system::MolecularSystem,
//! #         module: std::sync::Arc<halo::gpu::KernelModule>, rank: usize) -> Result<(), Box<dyn std::error::Error>> {
//! let setup = ListSetup::for_system(system, 1.0, 0.002, 100, 10, DEFAULT_DRIFT_TOLERANCE)?;
//! let atoms = LocalAtoms::from_plan(plan, rank, &system.positions, &system.types)?;
//! let search = PairSearch::build(&atoms, &SearchOptions::new(setup.rlist))?;
//! let gpu = NbnxmGpu::new(module, &search, &lj_table(system), &setup, system.box_size)?;
//! # let _ = gpu; Ok(()) }
//! ```

mod buffer;
mod gpu;
mod gpu_grid;
pub mod gpu_search;
mod grid;
mod kernel;
mod local;
mod order;
mod pairlist;

pub(crate) use crate::desc::first_at_or_above;
pub use buffer::{BufferModel, BufferType, DEFAULT_DRIFT_TOLERANCE, ListSetup, lj_taylor_coefficients};
pub use gpu::{EnergySlot, HomeCopies, HomeOnDevice, Launch, ListKind, NbnxmGpu, ResidentSearch, TypesById, lj_table};
pub use gpu_grid::{DeviceGrid, GridInfo};
pub use gpu_search::fit;
pub use grid::{BBox, ClusterGrid, ZoneGrid, ZoneScratch};
pub use kernel::{EntryWords, NbnxmKernel, WarpsPerEntry};
pub(crate) use local::HomeChecked;
pub use local::LocalAtoms;
pub use order::{DeviceOrder, entry_order, order_max_j};
pub use pairlist::{ClusterPairList, PairSearch, SearchOptions, SearchTiming};

use crate::decomp::PlanError;

/// Why a cluster grid, pair list or list setup cannot be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NbnxmError {
    /// The halo plan is invalid or does not fit the system.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A rank that the plan does not have.
    #[error("rank {rank} is not in the plan ({ranks} ranks)")]
    NoSuchRank {
        /// Rank asked for.
        rank: usize,
        /// Ranks in the plan.
        ranks: usize,
    },
    /// Per-atom arrays of different lengths, or a home count beyond them.
    #[error("{what}: {found} entries where {expected} are needed")]
    Length {
        /// Which array.
        what: &'static str,
        /// Entries given.
        found: usize,
        /// Entries needed.
        expected: usize,
    },
    /// A coordinate that is not a finite number.
    #[error("atom {atom} has a non-finite coordinate {value} along {dim}")]
    NonFinite {
        /// Local atom.
        atom: usize,
        /// Dimension name.
        dim: &'static str,
        /// The value.
        value: f32,
    },
    /// An atom outside the box along a periodic (not decomposed) dimension.
    #[error(
        "atom {atom} is at {dim} = {value} nm, outside the periodic box [0, {edge}): wrap positions into the box \
         (decomp::wrap_position) before a pair search"
    )]
    OutsideBox {
        /// Local atom.
        atom: usize,
        /// Dimension name.
        dim: &'static str,
        /// The coordinate.
        value: f32,
        /// Box edge.
        edge: f32,
    },
    /// Home atoms must be in zone 0 and halo atoms in another zone.
    #[error("atom {atom} is in zone {zone}, but atoms below {home} are home atoms (zone 0) and the others halo atoms (zone > 0)")]
    Zone {
        /// Local atom.
        atom: usize,
        /// Its zone.
        zone: u8,
        /// Home atoms.
        home: usize,
    },
    /// An atom type at or above the number of types.
    #[error("atom {atom} has type {ty}, but there are {ntypes} types")]
    Type {
        /// Local atom.
        atom: usize,
        /// Its type.
        ty: u32,
        /// Number of types.
        ntypes: usize,
    },
    /// Local atoms whose home atoms' types were left to the GPU, given to a build that reads
    /// every type on the host.
    #[error(
        "the local atoms hold no types below atom {from} (their home atoms' types are made on the GPU): \
         build them with their types for a host grid or pair search"
    )]
    TypesOnGpu {
        /// The first atom whose type is held.
        from: usize,
    },
    /// The local atoms hold no positions of the home atoms (they stayed on the GPU) where a
    /// build or check needs them.
    #[error(
        "the local atoms hold no positions below atom {from} (their home atoms' positions stayed on the GPU): \
         redecompose with the home positions for a host grid or pair search"
    )]
    PositionsOnGpu {
        /// The first atom whose position is held.
        from: usize,
    },
    /// More clusters than a j-list word can address.
    #[error("{clusters} clusters exceed the {max} a j-list word can address: use more ranks")]
    TooManyClusters {
        /// Clusters needed.
        clusters: usize,
        /// The limit.
        max: usize,
    },
    /// A list with more j-list words than its `u32` word offsets address.
    #[error("the {list} list has {words} j-list words, more than the {max} a u32 offset addresses: use more ranks")]
    TooManyWords {
        /// Which list (home–home or non-local).
        list: &'static str,
        /// Words found.
        words: u64,
        /// The limit.
        max: u64,
    },
    /// Entries longer than the GPU's launch order sorts.
    #[error("entries of up to {max_j} words, but the GPU's launch order sorts entries of at most {most} words")]
    EntryTooLong {
        /// The longest entry the search makes.
        max_j: usize,
        /// The most the order kernels take ([`crate::abi::NBNXM_ORDER_MAX_J`]).
        most: u32,
    },
    /// Inconsistent cutoffs, lifetimes or physical inputs.
    #[error("invalid list setup: {0}")]
    Setup(String),
}

/// Dimension names for messages.
pub(crate) const DIMS: [&str; 3] = ["x", "y", "z"];
