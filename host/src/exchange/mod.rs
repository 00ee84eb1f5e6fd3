//! The halo exchange: every transport, for ranks in one process or across NVSHMEM PEs.
//!
//! - [`spec`]: what a rank sends and receives per pulse ([`RankHalo`]), and the cross-rank check.
//! - [`rank`]: one rank's buffers, metadata and launches ([`RankExchange`]).
//! - [`local`]: several ranks in one process, on one or more GPUs ([`LocalRanks`]).
//! - [`pe`]: one rank per NVSHMEM PE ([`PeExchange`]).
//! - [`caller`]: the caller's own coordinate and force memory ([`CallerBuffers`]), for a code that
//!   already holds them on the GPU; with [`Exchange::use_streams`], its own streams too.
//! - [`interface`]: the one interface over both ([`Exchange`]), built from a [`Placement`], so a
//!   per-step driver is written once.
//! - [`synthetic`]: random halos for tests and benchmarks; [`mod@reference`]: their CPU result.
//! - Every exchange bounds its host waits on its streams (a stuck one is a [`StuckStream`]) and
//!   runs a collective reset when built and after a failure.
//! - `perturb` (feature `diagnostics`): jitter and injected faults around any exchange, for the
//!   reliability tests; [`heap`]: the memory an exchange needs, checked on every rank before anything is allocated.
//!
//! Adopting it (see docs/library.md): describe each rank's halo as pulses, build the exchange,
//! fill the owned values, then exchange forward (gather chain) and reverse (accumulate chain):
//!
//! ```no_run
//! use halo::exchange::{LocalRanks, Transport, synthetic};
//! use halo::gpu::{self, DeviceMemory, KernelModule};
//! use std::sync::Arc;
//!
//! # fn main() -> halo::Result<()> {
//! let artifacts = halo::artifacts::KernelArtifacts::locate("sm_90")?;
//! let module = Arc::new(KernelModule::load(&gpu::open_device(0)?, &artifacts)?);
//! // Eight ranks in a 2x2x2 grid, one pulse per dimension, all on GPU 0.
//! let halos = synthetic::halos(
//!     synthetic::SyntheticShape { grid: [2, 2, 2], pulses_per_dim: 1, home_atoms: 1000, send_fraction: 0.3, box_len: 5.0 },
//!     1,
//! );
//! let mut ranks = LocalRanks::<f32>::new(halos.clone(), &[module])?;
//! for (r, rank) in ranks.ranks().iter().enumerate() {
//!     rank.upload_coordinates(&vec![r as f32; halos[r].home_atoms])?; // owned values
//! }
//! ranks.exchange_forward(Transport::Fused)?; // ghosts filled on the GPU, no host wait
//! ranks.finish()?; // wait only because the host reads next
//! let ghosts = ranks.coordinates()?;
//! # let _ = ghosts;
//! # Ok(())
//! # }
//! ```

pub mod caller;
pub(crate) mod credits;
pub mod heap;
pub(crate) mod host_driven;
pub mod interface;
pub mod local;
pub(crate) mod mailbox;
pub mod memory;
// An exchange with no GPU rank, for the perturbations' tests and `halo selftest` (`diagnostics`).
#[cfg(any(test, feature = "diagnostics"))]
pub mod null;
pub mod pe;
pub(crate) mod pe_links;
pub(crate) mod peer_map;
// The API of the fault injection is public with feature `diagnostics`; without it the exchanges
// still honour `HALO_FAULT`/`HALO_JITTER_US` (through `Placement::build`).
#[cfg(feature = "diagnostics")]
pub mod perturb;
#[cfg(not(feature = "diagnostics"))]
#[allow(dead_code)]
pub(crate) mod perturb;
pub(crate) mod proxy;
pub mod rank;
pub mod reference;
pub(crate) mod reset;
pub mod residency;
pub mod routing;
pub mod spec;
pub mod synthetic;
pub(crate) mod watch;

pub use caller::{CallerBuffers, CallerSlice};
pub use interface::{Exchange, Placement, ReplanFence};
pub use local::LocalRanks;
pub use pe::{PathPolicy, PeExchange};
pub use rank::{PeerView, RankExchange, SharedSizes};
pub use routing::{Routing, SafeOutcome};
pub use spec::{AtomPlace, PulseSpec, RankHalo, ReceivedAt};
pub use watch::StuckStream;

pub use crate::desc::transport::{Element, Transport, UnknownTransport};
pub use crate::desc::wait::WaitTimeout;
