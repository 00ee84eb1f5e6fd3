//! How a halo moves: the exchange's transports, and the values it can move.

use kernels_gpu::abi::HaloElement;

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
    /// (the exchange's `host_driven` module).
    Staged,
    /// GROMACS's direct GPU communication (thread-MPI): pack kernel, stream-ordered peer copy, an
    /// event after the copy waited on by the receiver's stream; no host sync (the exchange's `host_driven` module).
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
        assert!(
            e.contains("`carrier-pigeon`") && e.contains("possible values: staged, direct-copy, per-pulse, per-pulse-direct, fused, fused-tma"),
            "{e}"
        );
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
