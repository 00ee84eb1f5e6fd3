//! The halo exchange: every transport, for ranks in one process or across NVSHMEM PEs.
//!
//! - [`spec`]: what a rank sends and receives per pulse ([`RankHalo`]), and the cross-rank check.
//! - [`rank`]: one rank's buffers, metadata and launches ([`RankExchange`]).
//! - [`local`]: several ranks in one process, on one or more GPUs ([`LocalRanks`]).
//! - [`pe`]: one rank per NVSHMEM PE ([`PeExchange`]).
//! - [`interface`]: the one interface over both ([`Exchange`]), built from a [`Placement`], so a
//!   per-step driver is written once.
//! - [`synthetic`]: random halos for tests and benchmarks; [`mod@reference`]: their CPU result.
//! - [`reset`]: the collective reset every exchange runs when built and after a failure;
//!   [`watch`]: the bounded host waits on its streams.
//! - [`perturb`]: jitter and injected faults around any exchange, for the reliability tests;
//!   [`heap`]: the memory an exchange needs, checked on every rank before anything is allocated.
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

pub mod credits;
pub mod heap;
pub mod host_driven;
pub mod interface;
pub mod local;
pub mod mailbox;
pub mod memory;
pub mod pe;
pub mod pe_links;
pub mod peer_map;
pub mod perturb;
pub mod proxy;
pub mod rank;
pub mod reference;
pub mod reset;
pub mod residency;
pub mod routing;
pub mod spec;
pub mod synthetic;
pub mod watch;

pub use interface::{Exchange, Placement, ReplanFence};
pub use local::LocalRanks;
pub use pe::{PathPolicy, PeExchange};
pub use rank::{PeerView, RankExchange, SharedSizes};
pub use routing::{Routing, SafeOutcome};
pub use spec::{AtomPlace, PulseSpec, RankHalo, ReceivedAt};
pub use watch::StuckStream;

use kernels_gpu::abi::{HaloElement, WaitKind};

/// A value the exchange can move: a [`HaloElement`] (coordinates and forces as `Float3`, or
/// `f32`, `f64`, `[f32; 4]` for other fields) that can be copied to the GPU as bytes.
pub trait Element: HaloElement + bytemuck::Pod {}
impl<T: HaloElement + bytemuck::Pod> Element for T {}

/// How a halo moves between ranks. Parsed from and printed as its command-line name
/// ([`Transport::name`]: `staged`, `direct-copy`, `per-pulse`, `per-pulse-direct`, `fused`,
/// `fused-tma`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Transport {
    /// Host-orchestrated, GPU-aware transfers: GROMACS's GPU-aware MPI path. Per pulse a pack
    /// kernel, one host sync of the halo stream, a copy into the peer whose completion the host
    /// waits for, completion told point to point; forces unpacked without a trailing sync
    /// ([`host_driven`]).
    Staged,
    /// GROMACS's direct GPU communication (thread-MPI): pack kernel, stream-ordered peer copy, an
    /// event after the copy waited on by the receiver's stream; no host sync ([`host_driven`]).
    DirectCopy,
    /// One NVSHMEM pack + put_signal + wait kernel per pulse (the seed's first design).
    PerPulse,
    /// One pack + direct-store + signal + wait kernel per pulse (peers reachable by stores).
    PerPulseDirect,
    /// One kernel for all coordinate pulses (dependency-aware, last-block signalling); direct
    /// stores where the peer is reachable, NVSHMEM put otherwise.
    Fused,
    /// Like `Fused`, with per-warp bulk copies (`cp.async.bulk`); direct peers only.
    FusedTma,
}

impl Transport {
    /// Every transport, in the order reports list them.
    pub const ALL: [Transport; 6] =
        [Transport::Staged, Transport::DirectCopy, Transport::PerPulse, Transport::PerPulseDirect, Transport::Fused, Transport::FusedTma];

    /// Whether the GPU drives the exchange: kernels pack, send and signal (no host work inside a
    /// step beyond the launches, and a step can be captured as a CUDA graph).
    pub fn gpu_initiated(self) -> bool {
        !self.host_driven()
    }

    /// Whether the host orchestrates each pulse (copies, events, messages): `staged`, `direct-copy`.
    pub fn host_driven(self) -> bool {
        matches!(self, Transport::Staged | Transport::DirectCopy)
    }

    /// Whether the host waits for the GPU inside a step (`staged` only).
    pub fn host_syncs_in_step(self) -> bool {
        self == Transport::Staged
    }

    /// Whether the transport needs every peer reachable by loads, stores or copies (peer access,
    /// or an `nvshmem_ptr` mapping between PEs).
    pub fn needs_direct_peers(self) -> bool {
        matches!(self, Transport::PerPulseDirect | Transport::FusedTma | Transport::Staged | Transport::DirectCopy)
    }

    /// Whether the transport needs NVSHMEM (the put path).
    pub fn needs_nvshmem(self) -> bool {
        self == Transport::PerPulse
    }

    /// Whether another rank (or the host on its behalf) may read this rank's halo forces
    /// `f[home..total]` after the force halo's work on this rank's halo stream has completed. When
    /// `false`, the only readers are this rank's own stream-ordered work inside the force halo, so
    /// anything ordered after that work on the rank's streams (the MD's integration, which waits
    /// for the halo stream) may clear them for the next step; when `true`, the halo forces must
    /// stay until the peer is known to be done (the MD zeroes them after the next coordinate halo).
    ///
    /// Today every transport pushes: the holder of the halo forces sends them into the owner's
    /// receive slot (`PeerView` carries no force array, so no rank can address another's `f`):
    /// - `per-pulse`, `per-pulse-direct`, `fused`, `fused-tma`: all run `fused_forces`, whose blocks
    ///   read this rank's `f` (as low-latency words into the owner's slot, or copied into the
    ///   local `f_stage`, which the NVSHMEM put then reads), inside the launch;
    /// - `staged`: `cuMemcpyAsync` from this rank's `f` into the owner's slot on this rank's halo
    ///   stream (and a host wait for it before "done");
    /// - `direct-copy`: the same copy on this rank's halo stream, followed by the event the owner
    ///   waits for.
    ///
    /// (Before protocol v4 the owner read the halo forces straight from the holder's `f`; a
    /// transport that pulls again, or an NCCL path whose send could outlive its stream's order,
    /// must answer `true`.)
    pub fn halo_forces_read_by_peer(self) -> bool {
        match self {
            Transport::Staged | Transport::DirectCopy => false,
            Transport::PerPulse | Transport::PerPulseDirect | Transport::Fused | Transport::FusedTma => false,
        }
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Staged => "staged",
            Transport::DirectCopy => "direct-copy",
            Transport::PerPulse => "per-pulse",
            Transport::PerPulseDirect => "per-pulse-direct",
            Transport::Fused => "fused",
            Transport::FusedTma => "fused-tma",
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a [`Transport`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown transport `{0}` (possible values: {names})", names = Transport::ALL.map(Transport::name).join(", "))]
pub struct UnknownTransport(pub String);

impl std::str::FromStr for Transport {
    type Err = UnknownTransport;

    /// The command-line name, as [`Transport::name`] prints it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Transport::ALL.into_iter().find(|t| t.name() == s.trim()).ok_or_else(|| UnknownTransport(s.to_string()))
    }
}

/// A device spin-wait that expired: which rank waited for what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitTimeout {
    /// The rank whose kernel gave up.
    pub rank: usize,
    /// The rank whose signal never came (-1: blocks of the same launch).
    pub peer: i32,
    /// Flat pulse index.
    pub pulse: u32,
    /// What was awaited.
    pub kind: Option<WaitKind>,
    /// The signal value the step needed (the step counter).
    pub step_counter: u64,
    /// The value last seen.
    pub seen: u64,
    /// How long it waited.
    pub waited_ns: u64,
}

impl std::fmt::Display for WaitTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let waited = self.waited_ns as f64 * 1e-9;
        let seen = if self.seen == kernels_gpu::abi::SIGNAL_UNSET { "never set".to_string() } else { self.seen.to_string() };
        let (rank, peer, pulse, counter) = (self.rank, self.peer, self.pulse, self.step_counter);
        match self.kind {
            Some(WaitKind::CoordCredit) | Some(WaitKind::ForceCredit) => {
                let what = if self.kind == Some(WaitKind::CoordCredit) { "read the coordinates" } else { "accumulate the forces" };
                write!(
                    f,
                    "rank {rank} waited {waited:.1} s for rank {peer} to {what} of pulse {pulse} of step {counter} before sending step {} \
                     (credit {seen}, expected {counter})",
                    counter + 1
                )
            }
            kind => {
                let what = match kind {
                    Some(WaitKind::CoordSignal) => "the coordinate halo",
                    Some(WaitKind::ForceSignal) => "the force halo",
                    _ => "other blocks of the force halo",
                };
                write!(f, "rank {rank} waited {waited:.1} s for pulse {pulse} of {what} from rank {peer} at step {counter} (signal {seen}, expected {counter})")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_parse_from_and_print_as_their_names() {
        for t in Transport::ALL {
            assert_eq!(t.to_string().parse::<Transport>(), Ok(t));
        }
        assert_eq!(" fused-tma".parse::<Transport>(), Ok(Transport::FusedTma));
        assert_eq!("direct-copy".parse::<Transport>(), Ok(Transport::DirectCopy));
        assert!(Transport::ALL.iter().all(|t| t.gpu_initiated() != t.host_driven()));
        assert_eq!(Transport::ALL.iter().filter(|t| t.host_syncs_in_step()).count(), 1, "staged only");
        let e = "carrier-pigeon".parse::<Transport>().unwrap_err().to_string();
        assert!(e.contains("`carrier-pigeon`") && e.contains("possible values: staged, direct-copy, per-pulse, per-pulse-direct, fused, fused-tma"), "{e}");
    }

    /// Who reads a rank's halo forces after its force halo, per transport (see
    /// `Transport::halo_forces_read_by_peer`): listed one by one, so a new transport must be
    /// placed here too.
    #[test]
    fn every_transport_reads_its_halo_forces_only_in_its_own_force_halo() {
        let readers = [
            (Transport::Staged, false, "own halo stream: the copy into the owner's slot, waited for by the host"),
            (Transport::DirectCopy, false, "own halo stream: the copy into the owner's slot, then the owner's event"),
            (Transport::PerPulse, false, "own fused_forces: staged locally, the put reads the stage"),
            (Transport::PerPulseDirect, false, "own fused_forces: pushed into the owner's slot"),
            (Transport::Fused, false, "own fused_forces: pushed as words into the owner's slot"),
            (Transport::FusedTma, false, "own fused_forces: pushed into the owner's slot"),
        ];
        assert_eq!(readers.map(|r| r.0), Transport::ALL, "every transport, in order");
        for (t, by_peer, why) in readers {
            assert_eq!(t.halo_forces_read_by_peer(), by_peer, "{t}: {why}");
        }
    }
}
