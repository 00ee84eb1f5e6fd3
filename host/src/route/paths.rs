//! The halo exchange's path to each peer, decided by the router pulse by pulse.
//!
//! For every pulse of this PE, two messages cross a pair: the coordinates it sends to the
//! pulse's `send_rank` (`send_size` atoms) and the forces it returns to the pulse's `recv_rank`
//! (`recv_size` atoms). Each is asked of the router as
//! `route_among(peer, Op::Put, bytes, EXCHANGE_TRANSPORTS)`: only the transports the exchange
//! implements are candidates, so the router never picks one it cannot run. The kernels
//! take one path per peer, so the per-peer path is the decision of that peer's largest message
//! (ties broken by transport order). The peer sees the same messages from its side, with the
//! same byte counts, and the router is symmetric, so both ends choose alike; [`RoutedPaths::mirror_check`]
//! and [`RoutedPaths::check_symmetric`] verify it rather than trust it.
//!
//! | router's transport | exchange path |
//! |---|---|
//! | `nvlink-store`, `nvlink-tma` | direct loads/stores into the peer's memory (`nvshmem_ptr` / peer access) |
//! | `nvshmem-put` | NVSHMEM put + signal (the kernel's put path) |
//! | `staged` | host-driven copies into the peer's mapped memory (the view must be direct) |
//! | `nccl` | none in the exchange yet: not a candidate (`EXCHANGE_TRANSPORTS`); forcing it is an error naming the override |

use super::{DistanceLevel, Op, Route, RouteConfig, RouteError, Router, Transport, TransportSet};
use crate::desc::RankHalo;
pub use crate::desc::route::PathError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// The transports the halo exchange implements: the only candidates [`RoutedPaths::plan`] asks
/// the router about. NCCL is left out because the exchange has no NCCL path (only the benchmark
/// baseline in `bench::nccl` uses it).
pub const EXCHANGE_TRANSPORTS: TransportSet =
    TransportSet::of(&[Transport::NvlinkStore, Transport::NvlinkTma, Transport::NvshmemPut, Transport::Staged]);

/// The transports ranks sharing one process can run (the exchange's `LocalRanks`): direct
/// stores, bulk copies and host-staged copies through peer mappings. No NVSHMEM runs there, so
/// `nvshmem-put` is not a candidate ([`plan_local_ranks`] asks among these).
pub const LOCAL_EXCHANGE_TRANSPORTS: TransportSet = TransportSet::of(&[Transport::NvlinkStore, Transport::NvlinkTma, Transport::Staged]);

/// What [`RoutedPaths`] needs of a router (a seam for tests).
pub trait RouteSource {
    /// The PE deciding.
    fn self_pe(&self) -> usize;
    /// The route for one message, chosen among `allowed` only.
    fn route_among(&mut self, peer: usize, op: Op, bytes: u64, allowed: TransportSet) -> Result<Route, RouteError>;
    /// The topology decided over (epoch and hash), when the source has one.
    fn topology_stamp(&self) -> Option<TopologyStamp> {
        None
    }
    /// How many agreed failure rounds changed the pair with `peer` (see
    /// [`super::feedback`]); 0 when none did.
    fn failure_epoch(&self, _peer: usize) -> u32 {
        0
    }
}

impl RouteSource for Router {
    fn self_pe(&self) -> usize {
        Router::self_pe(self)
    }
    fn topology_stamp(&self) -> Option<TopologyStamp> {
        Some(TopologyStamp { epoch: self.topology().epoch(), hash: self.topology().hash_hex() })
    }
    fn failure_epoch(&self, peer: usize) -> u32 {
        Router::failure_epoch(self, peer)
    }

    fn route_among(&mut self, peer: usize, op: Op, bytes: u64, allowed: TransportSet) -> Result<Route, RouteError> {
        Router::route_among(self, peer, op, bytes, allowed)
    }
}

/// Which topology a plan was decided over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyStamp {
    /// The topology's epoch.
    pub epoch: u64,
    /// Its content hash, 16 hex digits.
    pub hash: String,
}

/// How the exchange kernel moves one pulse's message, from the router's transport for the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PulsePath {
    /// The kernel's threads store into the peer's mapped memory (`nvlink-store`).
    DirectStore,
    /// The kernel issues bulk (TMA) copies into the peer's mapped memory (`nvlink-tma`).
    BulkCopy,
    /// NVSHMEM put + signal from the kernel (`nvshmem-put`).
    Put,
    /// The host copies into the peer's mapped memory (`staged`).
    HostStaged,
}

impl PulsePath {
    /// The path that carries `transport` in the exchange; `None` for a transport it has no path for (`nccl`).
    pub fn of(transport: Transport) -> Option<Self> {
        match transport {
            Transport::NvlinkStore => Some(PulsePath::DirectStore),
            Transport::NvlinkTma => Some(PulsePath::BulkCopy),
            Transport::NvshmemPut => Some(PulsePath::Put),
            Transport::Staged => Some(PulsePath::HostStaged),
            Transport::Nccl => None,
        }
    }

    /// The name used in logs and files.
    pub fn name(self) -> &'static str {
        match self {
            PulsePath::DirectStore => "direct-store",
            PulsePath::BulkCopy => "bulk-copy",
            PulsePath::Put => "put",
            PulsePath::HostStaged => "host-staged",
        }
    }

    /// Whether the path writes through the peer's mapped address (needs a direct peer view).
    pub fn direct(self) -> bool {
        self != PulsePath::Put
    }
}

impl fmt::Display for PulsePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One pulse of the deciding PE: the path of its coordinates (to `send_peer`) and of its forces
/// (to `recv_peer`). Within one fused launch, pulses whose peers differ can take different paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PulseChoice {
    /// Pulse index on the deciding PE.
    pub pulse: usize,
    /// The peer that receives this pulse's coordinates.
    pub send_peer: usize,
    /// How the coordinates get there.
    pub send: PulsePath,
    /// The peer that sent this pulse's coordinates and receives its forces.
    pub recv_peer: usize,
    /// How the forces get there.
    pub recv: PulsePath,
}

/// One peer in a [`RoutedSummary`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerRoute {
    /// The peer.
    pub peer: usize,
    /// The transport both ends use.
    pub transport: Transport,
    /// The exchange path that carries it.
    pub path: PulsePath,
    /// The distance to the peer.
    pub level: DistanceLevel,
    /// The largest message to the peer (it decided the transport), bytes.
    pub bytes: u64,
    /// Agreed failure rounds that changed this pair so far (0: none); equal on both ends.
    pub failure_epoch: u32,
}

/// A compact, serialisable description of what one PE's plan chose, for run outputs and result
/// files: per peer the transport, its path, the level and the deciding size; per pulse the two
/// paths; the topology it was decided over. [`RoutedPaths::summary`] makes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoutedSummary {
    /// The deciding PE.
    pub pe: usize,
    /// The topology decided over, when known.
    pub topology: Option<TopologyStamp>,
    /// Bytes of one exchanged value.
    pub element_bytes: usize,
    /// The transports the plan was chosen among.
    pub allowed: TransportSet,
    /// Every peer a pulse involves, ascending.
    pub peers: Vec<PeerRoute>,
    /// Every pulse, in order.
    pub pulses: Vec<PulseChoice>,
}

impl fmt::Display for RoutedSummary {
    /// One line: `PE 0: 1=nvlink-tma (bulk-copy, nvlink, 16 KiB), 2=nvshmem-put (put, spine, 16 KiB)`
    /// followed by the topology and, when a pair has failed over, its failure epoch.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PE {}:", self.pe)?;
        for (i, p) in self.peers.iter().enumerate() {
            write!(
                f,
                "{} {}={} ({}, {}, {}{})",
                if i == 0 { "" } else { "," },
                p.peer,
                p.transport,
                p.path,
                p.level,
                super::format_size(p.bytes),
                if p.failure_epoch > 0 { format!(", failure epoch {}", p.failure_epoch) } else { String::new() }
            )?;
        }
        if self.peers.is_empty() {
            f.write_str(" no peers")?;
        }
        if let Some(t) = &self.topology {
            write!(f, "; topology epoch {} hash {}", t.epoch, t.hash)?;
        }
        Ok(())
    }
}

/// Which message of a pulse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Message {
    /// Coordinates to the pulse's `send_rank`.
    Coordinates,
    /// Forces back to the pulse's `recv_rank`.
    Forces,
}

/// One routed message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PulseRoute {
    /// Pulse index on the deciding PE.
    pub pulse: usize,
    /// Which message.
    pub message: Message,
    /// The peer.
    pub peer: usize,
    /// Its size in bytes.
    pub bytes: u64,
    /// The router's choice.
    pub transport: Transport,
    /// The distance to the peer.
    pub level: DistanceLevel,
}

/// Per-peer paths of one PE, from the router.
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RoutedPaths {
    /// The deciding PE.
    pub self_pe: usize,
    /// Per peer, the transport of its largest message; `None` when no pulse involves the peer.
    pub peers: Vec<Option<Transport>>,
    /// Every message's decision, in pulse order.
    pub pulses: Vec<PulseRoute>,
    /// Bytes of one exchanged value (12 for coordinates), by which messages were sized.
    pub element_bytes: usize,
    /// The transports the plan was chosen among (the caller's capabilities).
    pub allowed: TransportSet,
    /// The topology the router decided over, when it said.
    pub topology: Option<TopologyStamp>,
    /// `(peer, epoch)` for the routed peers whose pair had an agreed failure when planned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failure_epochs: Vec<(usize, u32)>,
}

impl fmt::Debug for RoutedPaths {
    // Compact: exchange-check prints the policy on one line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Routed(PE {}:", self.self_pe)?;
        for (peer, t) in self.peers.iter().enumerate() {
            if let Some(t) = t {
                write!(f, " {peer}={t}")?;
            }
        }
        f.write_str(")")
    }
}

impl RoutedPaths {
    /// [`Self::plan_for`] for coordinates and forces (`Float3`, the MD exchange).
    pub fn plan(router: &mut dyn RouteSource, halos: &[RankHalo]) -> Result<Self, PathError> {
        Self::plan_for::<kernels_gpu::abi::Float3>(router, halos)
    }

    /// Asks `router` about every message of its PE's pulses (`halos` is every rank's halo), each
    /// sized as `T` values (`f32` fields move a third of the bytes of coordinates), among
    /// [`EXCHANGE_TRANSPORTS`] (one PE per process).
    pub fn plan_for<T: crate::desc::Element>(router: &mut dyn RouteSource, halos: &[RankHalo]) -> Result<Self, PathError> {
        Self::plan_among::<T>(router, halos, EXCHANGE_TRANSPORTS)
    }

    /// [`Self::plan_for`] among the transports the caller can run: [`EXCHANGE_TRANSPORTS`] for one
    /// PE per process, [`LOCAL_EXCHANGE_TRANSPORTS`] for ranks sharing a process.
    pub fn plan_among<T: crate::desc::Element>(router: &mut dyn RouteSource, halos: &[RankHalo], allowed: TransportSet) -> Result<Self, PathError> {
        Self::plan_sized(router, halos, size_of::<T>(), allowed)
    }

    /// [`Self::plan_for`] from this PE's own halo alone (`halo`, of `n_pes` PEs): the same plan, for a
    /// PE that knows no other halo yet (each PE's paths follow from its own halo; only the mirror
    /// check needs the others').
    pub fn plan_own_for<T: crate::desc::Element>(router: &mut dyn RouteSource, halo: &RankHalo, n_pes: usize) -> Result<Self, PathError> {
        Self::plan_halo(router, halo, n_pes, size_of::<T>(), EXCHANGE_TRANSPORTS)
    }

    fn plan_sized(router: &mut dyn RouteSource, halos: &[RankHalo], element_bytes: usize, allowed: TransportSet) -> Result<Self, PathError> {
        let me = router.self_pe();
        let halo = halos.get(me).ok_or(RouteError::PeOutOfRange { pe: me, n_pes: halos.len() })?;
        Self::plan_halo(router, halo, halos.len(), element_bytes, allowed)
    }

    fn plan_halo(
        router: &mut dyn RouteSource,
        halo: &RankHalo,
        n_pes: usize,
        element_bytes: usize,
        allowed: TransportSet,
    ) -> Result<Self, PathError> {
        let me = router.self_pe();
        if me >= n_pes {
            return Err(RouteError::PeOutOfRange { pe: me, n_pes }.into());
        }
        let mut pulses = Vec::with_capacity(2 * halo.pulses.len());
        for (p, spec) in halo.pulses.iter().enumerate() {
            for (message, peer, atoms) in
                [(Message::Coordinates, spec.send_rank, spec.index_map.len()), (Message::Forces, spec.recv_rank, spec.recv_size)]
            {
                if peer >= n_pes {
                    return Err(RouteError::PeOutOfRange { pe: peer, n_pes }.into());
                }
                let bytes = (atoms * element_bytes) as u64;
                let route = router.route_among(peer, Op::Put, bytes, allowed)?;
                // The router honours the set; this guards other sources of routes (the trait is open).
                if !allowed.contains(route.transport) {
                    return Err(PathError::Unsupported {
                        self_pe: me,
                        peer,
                        transport: route.transport,
                        why: format!("this exchange runs only {allowed}"),
                    });
                }
                pulses.push(PulseRoute { pulse: p, message, peer, bytes, transport: route.transport, level: route.level });
            }
        }
        let mut peers: Vec<Option<(u64, Transport)>> = vec![None; n_pes];
        for m in &pulses {
            let slot = &mut peers[m.peer];
            // Largest message wins; the tie-break must not depend on pulse numbering, which differs
            // between the two ends.
            if slot.is_none_or(|(b, t)| (m.bytes, m.transport) > (b, t)) {
                *slot = Some((m.bytes, m.transport));
            }
        }
        for (peer, chosen) in peers.iter().enumerate() {
            if let Some((_, t)) = chosen
                && pulses.iter().any(|m| m.peer == peer && m.transport != *t)
            {
                tracing::info!("route: PE {me} -> PE {peer}: messages of different sizes prefer different transports; the largest decides: {t}");
            }
        }
        let failure_epochs = (0..peers.len()).filter(|&q| peers[q].is_some()).map(|q| (q, router.failure_epoch(q))).filter(|&(_, e)| e > 0).collect();
        Ok(Self {
            self_pe: me,
            peers: peers.into_iter().map(|s| s.map(|(_, t)| t)).collect(),
            pulses,
            element_bytes,
            allowed,
            topology: router.topology_stamp(),
            failure_epochs,
        })
    }

    /// This PE's plan made again by `router` (after an agreement), with the same element size and
    /// transport set.
    pub fn replan(&self, router: &mut dyn RouteSource, halos: &[RankHalo]) -> Result<Self, PathError> {
        Self::plan_sized(router, halos, self.element_bytes, self.allowed)
    }

    /// A `'static` reference for the exchange's `PathPolicy::Routed`, which stays `Copy`.
    /// The plan is made once per run and lives as long as the process; it is a few bytes per peer.
    pub fn leak(self) -> &'static RoutedPaths {
        Box::leak(Box::new(self))
    }

    /// Per pulse of `halo` (this PE's), whether the fused kernel moves its coordinates with bulk
    /// copies: the pair with the pulse's `send_rank` chose `nvlink-tma`. Pulses to other peers
    /// take stores or puts, so one launch mixes the paths.
    pub fn bulk_pulses(&self, halo: &RankHalo) -> Vec<bool> {
        halo.pulses.iter().map(|p| self.transport(p.send_rank) == Some(Transport::NvlinkTma)).collect()
    }

    /// For each pulse of `halo` (this PE's), whether its sender (`recv_rank`) copies it here in
    /// bulk: the pair chose `nvlink-tma` (plans are symmetric per pair).
    pub fn bulk_receives(&self, halo: &RankHalo) -> Vec<bool> {
        halo.pulses.iter().map(|p| self.transport(p.recv_rank) == Some(Transport::NvlinkTma)).collect()
    }

    /// The agreed failure epoch of the pair with `peer` when this plan was made (0: none).
    pub fn failure_epoch(&self, peer: usize) -> u32 {
        self.failure_epochs.iter().find(|(q, _)| *q == peer).map_or(0, |&(_, e)| e)
    }

    /// The transport chosen for `peer`, if any pulse involves it.
    pub fn transport(&self, peer: usize) -> Option<Transport> {
        self.peers.get(peer).copied().flatten()
    }

    /// Whether the exchange should reach `peer` by loads/stores into its mapped memory (`true`) or
    /// by NVSHMEM puts (`false`). Peers no pulse involves get the direct view (it is never used).
    pub fn direct(&self, peer: usize) -> bool {
        self.transport(peer) != Some(Transport::NvshmemPut)
    }

    /// The exchange path to `peer`: its transport's [`PulsePath`].
    fn peer_path(&self, peer: usize) -> Result<(Transport, PulsePath), PathError> {
        let t = self.transport(peer).ok_or_else(|| PathError::Asymmetric(format!("PE {}: no path to PE {peer}", self.self_pe)))?;
        let path = PulsePath::of(t).ok_or_else(|| PathError::Unsupported {
            self_pe: self.self_pe,
            peer,
            transport: t,
            why: "the exchange has no path for it".into(),
        })?;
        Ok((t, path))
    }

    /// The path of every pulse: its coordinates to `send_rank` and its forces to `recv_rank`, each
    /// by the path of that peer's transport (the one both ends agreed on, which the largest
    /// message decided). Pulses whose peers differ take different paths in one launch.
    pub fn pulse_paths(&self) -> Result<Vec<PulseChoice>, PathError> {
        let path = |peer: usize| self.peer_path(peer).map(|(_, p)| p);
        let mut out: Vec<PulseChoice> = Vec::new();
        for m in &self.pulses {
            match m.message {
                Message::Coordinates => {
                    out.push(PulseChoice { pulse: m.pulse, send_peer: m.peer, send: path(m.peer)?, recv_peer: m.peer, recv: path(m.peer)? })
                }
                Message::Forces => {
                    if let Some(c) = out.iter_mut().rev().find(|c| c.pulse == m.pulse) {
                        c.recv_peer = m.peer;
                        c.recv = path(m.peer)?;
                    }
                }
            }
        }
        Ok(out)
    }

    /// The compact, serialisable description of this plan (see [`RoutedSummary`]).
    pub fn summary(&self) -> Result<RoutedSummary, PathError> {
        let mut peers = Vec::new();
        for peer in (0..self.peers.len()).filter(|&q| self.transport(q).is_some()) {
            let (transport, path) = self.peer_path(peer)?;
            let msgs = self.pulses.iter().filter(|m| m.peer == peer);
            let (bytes, level) = msgs.map(|m| (m.bytes, m.level)).max().unwrap_or((0, DistanceLevel::SameGpu));
            peers.push(PeerRoute { peer, transport, path, level, bytes, failure_epoch: self.failure_epoch(peer) });
        }
        Ok(RoutedSummary {
            pe: self.self_pe,
            topology: self.topology.clone(),
            element_bytes: self.element_bytes,
            allowed: self.allowed,
            peers,
            pulses: self.pulse_paths()?,
        })
    }

    /// Human-readable lines, one per message (what `HALO_ROUTE_DEBUG` adds to the router's blocks).
    pub fn describe(&self) -> Vec<String> {
        self.pulses
            .iter()
            .map(|m| {
                format!(
                    "route: PE {} -> PE {} pulse {} {:?} {}: {} (peer path: {})",
                    self.self_pe,
                    m.peer,
                    m.pulse,
                    m.message,
                    super::format_size(m.bytes),
                    m.transport,
                    self.transport(m.peer).map_or("-", |t| t.name())
                )
            })
            .collect()
    }

    /// Checks that for every pair both PEs chose the same path (`all[i]` is PE `i`'s plan).
    pub fn check_symmetric(all: &[RoutedPaths]) -> Result<(), PathError> {
        for (i, a) in all.iter().enumerate() {
            if a.self_pe != i {
                return Err(PathError::Asymmetric(format!("plan {i} belongs to PE {}", a.self_pe)));
            }
            for (j, b) in all.iter().enumerate().skip(i + 1) {
                if a.transport(j) != b.transport(i) {
                    return Err(PathError::Asymmetric(format!(
                        "PE {i} -> PE {j}: {}, PE {j} -> PE {i}: {}",
                        a.transport(j).map_or("none", |t| t.name()),
                        b.transport(i).map_or("none", |t| t.name())
                    )));
                }
            }
        }
        Ok(())
    }

    /// Recomputes the plan of every peer of `router`'s PE with a router of the same topology,
    /// configuration, performance table and agreed failure record, and checks that each agrees
    /// with this plan about their pair. Needs no communication; costs one scoring pass per peer
    /// message. (Failures recorded locally in [`super::Feedback::Local`] mode are this PE's alone
    /// and are not replayed: that mode makes no promise that both ends agree.)
    pub fn mirror_check(&self, router: &Router, halos: &[RankHalo]) -> Result<(), PathError> {
        for (peer, mine) in self.peers.iter().enumerate() {
            let Some(mine) = mine else { continue };
            if peer == self.self_pe {
                continue;
            }
            // The peer's router as this PE knows it: the same settings and numbers, the same
            // agreed failure record; it logs nothing (its decisions are not this PE's).
            let mut mirror = router.mirror(peer)?;
            let theirs = RoutedPaths::plan_sized(&mut mirror, halos, self.element_bytes, self.allowed)?;
            if theirs.transport(self.self_pe) != Some(*mine) {
                return Err(PathError::Asymmetric(format!(
                    "PE {} -> PE {peer}: {mine}, but PE {peer} would choose {} towards PE {}",
                    self.self_pe,
                    theirs.transport(self.self_pe).map_or("none", |t| t.name()),
                    self.self_pe
                )));
            }
        }
        Ok(())
    }

    /// The exchange kernel every PE must run for these plans (`all`: every PE's plan):
    /// `staged` everywhere → the staged transport; `nvlink-tma` everywhere → the fused TMA
    /// kernel (direct peers only); otherwise the fused kernel, which stores directly where the
    /// path is direct and puts elsewhere. `puts_possible` is false for ranks in one process.
    pub fn exchange_transport(all: &[RoutedPaths], puts_possible: bool) -> Result<crate::desc::Transport, PathError> {
        use crate::desc::Transport as X;
        let chosen: Vec<(usize, usize, Transport)> =
            all.iter().flat_map(|p| p.peers.iter().enumerate().filter_map(move |(q, t)| t.map(|t| (p.self_pe, q, t)))).collect();
        if all.is_empty() {
            return Err(PathError::Empty);
        }
        if !puts_possible && let Some(&(a, b, t)) = chosen.iter().find(|(_, _, t)| *t == Transport::NvshmemPut) {
            return Err(PathError::Unsupported {
                self_pe: a,
                peer: b,
                transport: t,
                why: "ranks in one process have no NVSHMEM; run one rank per GPU with `halo launch`".into(),
            });
        }
        let every = |t: Transport| !chosen.is_empty() && chosen.iter().all(|c| c.2 == t);
        if every(Transport::Staged) {
            return Ok(X::Staged);
        }
        if let Some(&(a, b, t)) = chosen.iter().find(|(_, _, t)| *t == Transport::Staged) {
            return Err(PathError::Unsupported {
                self_pe: a,
                peer: b,
                transport: t,
                why: "staged is host-driven for the whole step and cannot mix with GPU-initiated paths of other pairs".into(),
            });
        }
        Ok(if every(Transport::NvlinkTma) { X::FusedTma } else { X::Fused })
    }
}

/// The route configuration from the environment (`HALO_ROUTE_*`, `HALO_FORCE_TRANSPORT`) plus
/// `--route-override` values.
pub fn route_config(overrides: &[String]) -> Result<RouteConfig, RouteError> {
    let mut config = RouteConfig::from_env()?;
    config.add_cli_overrides("--route-override", overrides)?;
    config.validate()?;
    Ok(config)
}

/// A router for `self_pe` over a topology built from discovered `facts`, configured from the
/// environment (`HALO_ROUTE_*`, `HALO_FORCE_TRANSPORT`) plus `--route-override` values.
/// The node placements come from `HALO_ROUTE_TOPOLOGY` when set, else from each PE's facts (Slurm's
/// address).
pub fn router_from_facts(self_pe: usize, facts: &[super::PeFacts], overrides: &[String]) -> Result<Router, RouteError> {
    let config = route_config(overrides)?;
    let topo = super::topology_from_facts(facts, config.fabric()?.as_ref())?;
    Router::new(self_pe, Arc::new(topo), config)
}

/// Every rank of one process, planned: each rank's paths, the exchange kernel they imply, and
/// the routers (for their summaries).
#[derive(Debug)]
pub struct LocalPlan {
    /// Rank `r`'s paths.
    pub plans: Vec<RoutedPaths>,
    /// The exchange kernel every rank runs.
    pub transport: crate::desc::Transport,
    /// Rank `r`'s router.
    pub routers: Vec<Router>,
}

/// Plans every rank of one process (`facts[r]` is rank `r`, `halos` every rank's halo), each
/// with its own router over one topology, messages sized as `T` values, among the transports
/// one process can run ([`LOCAL_EXCHANGE_TRANSPORTS`]: no `nvshmem-put`), and checks that both
/// ends of every pair agree. Ranks on GPUs without peer access to each other cannot exchange in
/// one process at all: that is an error naming the pair and the fix (one rank per GPU).
pub fn plan_local_ranks<T: crate::desc::Element>(facts: &[super::PeFacts], halos: &[RankHalo], config: &RouteConfig) -> Result<LocalPlan, PathError> {
    let mut routers = local_routers(facts, config)?;
    let plans = plan_local_with::<T>(&mut routers, halos)?;
    let transport = RoutedPaths::exchange_transport(&plans, false)?;
    Ok(LocalPlan { plans, transport, routers })
}

/// One router per rank of one process (`facts[r]` is rank `r`), over one topology and one
/// performance table: what [`plan_local_ranks`] plans with, kept by drivers that plan again
/// (after an agreement, or for new halos).
pub fn local_routers(facts: &[super::PeFacts], config: &RouteConfig) -> Result<Vec<Router>, PathError> {
    let topo = Arc::new(super::topology_from_facts(facts, config.fabric()?.as_ref())?);
    let perf = Arc::new(match &config.calibration {
        Some(c) => super::PerfTable::load_calibration(&c.value)?,
        None => super::PerfTable::defaults(),
    });
    (0..facts.len()).map(|r| Ok(Router::with_perf(r, Arc::clone(&topo), config.clone(), Arc::clone(&perf))?)).collect()
}

/// Plans every rank of one process with its router (`routers[r]` serves rank `r`) among
/// [`LOCAL_EXCHANGE_TRANSPORTS`] and checks both ends of every pair agree. Ranks on GPUs without
/// peer access to each other are an error.
pub fn plan_local_with<T: crate::desc::Element>(routers: &mut [Router], halos: &[RankHalo]) -> Result<Vec<RoutedPaths>, PathError> {
    if routers.len() != halos.len() {
        return Err(PathError::Asymmetric(format!("{} routers for {} ranks", routers.len(), halos.len())));
    }
    let topo = Arc::clone(routers.first().ok_or(PathError::Empty)?.topology());
    for (r, h) in halos.iter().enumerate() {
        for peer in h.pulses.iter().flat_map(|p| [p.send_rank, p.recv_rank]) {
            let level = topo.distance(r, peer)?;
            if level > super::DistanceLevel::Pcie {
                return Err(PathError::Unsupported {
                    self_pe: r,
                    peer,
                    transport: Transport::Staged,
                    why: format!(
                        "ranks {r} and {peer} are {level} apart: ranks in one process reach each other only through peer access, which their GPUs lack; run one rank per GPU with `halo launch`"
                    ),
                });
            }
        }
    }
    let plans =
        routers.iter_mut().map(|router| RoutedPaths::plan_among::<T>(router, halos, LOCAL_EXCHANGE_TRANSPORTS)).collect::<Result<Vec<_>, _>>()?;
    RoutedPaths::check_symmetric(&plans)?;
    Ok(plans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::synthetic::{self, SyntheticShape};
    use crate::route::RouteReason;
    use kernels_gpu::abi::Float3;

    /// Answers from a table: (peer, bytes) → transport by a threshold, recording what was asked.
    struct FakeRouter {
        me: usize,
        small: Transport,
        large: Transport,
        threshold: u64,
        asked: Vec<(usize, u64)>,
    }

    impl RouteSource for FakeRouter {
        fn self_pe(&self) -> usize {
            self.me
        }
        fn route_among(&mut self, peer: usize, _op: Op, bytes: u64, allowed: TransportSet) -> Result<Route, RouteError> {
            assert_eq!(allowed, EXCHANGE_TRANSPORTS, "the exchange asks among its own transports");
            self.asked.push((peer, bytes));
            let transport = if bytes < self.threshold { self.small } else { self.large };
            Ok(Route { transport, level: DistanceLevel::NvLink, score: 1.0, reason: RouteReason::Scored })
        }
    }

    fn fake(me: usize, small: Transport, large: Transport, threshold: u64) -> FakeRouter {
        FakeRouter { me, small, large, threshold, asked: Vec::new() }
    }

    fn halos(grid: [usize; 3]) -> Vec<RankHalo> {
        synthetic::halos(SyntheticShape { grid, pulses_per_dim: 2, home_atoms: 200, send_fraction: 0.3, box_len: 5.0 }, 7)
    }

    #[test]
    fn messages_are_sized_by_the_element_type() {
        let h = halos([2, 1, 1]);
        let mut r = fake(0, Transport::NvlinkStore, Transport::NvlinkStore, 0);
        let plan = RoutedPaths::plan_for::<f32>(&mut r, &h).expect("plan");
        let want: Vec<(usize, u64)> =
            h[0].pulses.iter().flat_map(|p| [(p.send_rank, 4 * p.index_map.len() as u64), (p.recv_rank, 4 * p.recv_size as u64)]).collect();
        assert_eq!(r.asked, want);
        assert_eq!(plan.element_bytes, 4);
    }

    /// A PE's plan from its own halo alone is its plan from every halo; a pulse whose peer is
    /// beyond the PEs named is an error, not a panic.
    #[test]
    fn a_plan_from_the_own_halo_alone_is_the_plan_from_every_halo() {
        let h = halos([2, 2, 1]);
        for r in 0..h.len() {
            let want = RoutedPaths::plan(&mut fake(r, Transport::NvshmemPut, Transport::NvlinkStore, 3000), &h).expect("plan");
            let got = RoutedPaths::plan_own_for::<Float3>(&mut fake(r, Transport::NvshmemPut, Transport::NvlinkStore, 3000), &h[r], h.len())
                .expect("own plan");
            assert_eq!(serde_json::to_string(&got).ok(), serde_json::to_string(&want).ok(), "PE {r}");
        }
        assert!(matches!(
            RoutedPaths::plan_own_for::<Float3>(&mut fake(0, Transport::NvlinkStore, Transport::NvlinkStore, 0), &h[0], 1),
            Err(PathError::Route(_))
        ));
        assert!(matches!(
            RoutedPaths::plan_own_for::<Float3>(&mut fake(4, Transport::NvlinkStore, Transport::NvlinkStore, 0), &h[0], 4),
            Err(PathError::Route(_))
        ));
    }

    #[test]
    fn every_message_is_asked_with_its_bytes() {
        let h = halos([2, 1, 1]);
        let mut r = fake(0, Transport::NvlinkStore, Transport::NvlinkStore, 0);
        let plan = RoutedPaths::plan(&mut r, &h).expect("plan");
        let want: Vec<(usize, u64)> =
            h[0].pulses.iter().flat_map(|p| [(p.send_rank, 12 * p.index_map.len() as u64), (p.recv_rank, 12 * p.recv_size as u64)]).collect();
        assert_eq!(r.asked, want);
        assert_eq!(plan.pulses.len(), 2 * h[0].pulses.len());
        assert_eq!(plan.transport(1), Some(Transport::NvlinkStore));
        assert!(plan.direct(1));
        assert_eq!(plan.transport(0), None);
    }

    #[test]
    fn per_peer_mapping_direct_put_and_largest_message_decides() {
        let h = halos([2, 1, 1]);
        for (t, direct) in [(Transport::NvlinkStore, true), (Transport::NvlinkTma, true), (Transport::Staged, true), (Transport::NvshmemPut, false)] {
            let plan = RoutedPaths::plan(&mut fake(1, t, t, 0), &h).expect("plan");
            assert_eq!(plan.direct(0), direct, "{t}");
        }
        // Small messages put, large ones store: the largest message of the pair decides.
        let sizes: Vec<u64> = RoutedPaths::plan(&mut fake(0, Transport::NvlinkStore, Transport::NvlinkStore, 0), &h)
            .expect("plan")
            .pulses
            .iter()
            .map(|m| m.bytes)
            .collect();
        let (lo, hi) = (sizes.iter().min().copied().unwrap_or(0), sizes.iter().max().copied().unwrap_or(0));
        assert!(lo < hi, "the synthetic pulses should differ in size: {sizes:?}");
        let plan = RoutedPaths::plan(&mut fake(0, Transport::NvshmemPut, Transport::NvlinkTma, hi), &h).expect("plan");
        assert_eq!(plan.transport(1), Some(Transport::NvlinkTma));
        assert!(plan.pulses.iter().any(|m| m.transport == Transport::NvshmemPut));
        // NCCL has no exchange path: a source that ignores the set is still caught.
        assert!(matches!(RoutedPaths::plan(&mut fake(0, Transport::Nccl, Transport::Nccl, 0), &h), Err(PathError::Unsupported { .. })));
    }

    #[test]
    fn symmetry_and_exchange_transport() {
        let h = halos([2, 2, 1]);
        let plans = |t: Transport| -> Vec<RoutedPaths> { (0..4).map(|r| RoutedPaths::plan(&mut fake(r, t, t, 0), &h).expect("plan")).collect() };
        use crate::desc::Transport as X;
        assert!(RoutedPaths::check_symmetric(&plans(Transport::NvlinkStore)).is_ok());
        assert_eq!(RoutedPaths::exchange_transport(&plans(Transport::NvlinkStore), false).ok(), Some(X::Fused));
        assert_eq!(RoutedPaths::exchange_transport(&plans(Transport::NvlinkTma), false).ok(), Some(X::FusedTma));
        assert_eq!(RoutedPaths::exchange_transport(&plans(Transport::Staged), false).ok(), Some(X::Staged));
        assert_eq!(RoutedPaths::exchange_transport(&plans(Transport::NvshmemPut), true).ok(), Some(X::Fused));
        assert!(RoutedPaths::exchange_transport(&plans(Transport::NvshmemPut), false).is_err());
        let mut mixed = plans(Transport::NvlinkStore);
        mixed[2] = RoutedPaths::plan(&mut fake(2, Transport::NvshmemPut, Transport::NvshmemPut, 0), &h).expect("plan");
        assert!(matches!(RoutedPaths::check_symmetric(&mixed), Err(PathError::Asymmetric(_))));
    }

    #[test]
    fn real_router_is_symmetric_with_overrides() {
        let h = halos([2, 2, 1]);
        let facts = crate::route::synthetic_facts(&["n0".into()], 4, 1, crate::route::IntraNodeLink::Nvlink);
        let topo = Arc::new(crate::route::topology_from_facts(&facts, None).expect("topology"));
        let mut config = RouteConfig::default();
        config.add_cli_overrides("--route-override", &["0-1=nvshmem-put".into()]).expect("override");
        let plans: Vec<RoutedPaths> = (0..4)
            .map(|r| {
                let mut router = Router::new(r, Arc::clone(&topo), config.clone()).expect("router");
                let plan = RoutedPaths::plan(&mut router, &h).expect("plan");
                plan.mirror_check(&router, &h).expect("mirror agrees");
                plan
            })
            .collect();
        RoutedPaths::check_symmetric(&plans).expect("symmetric");
        assert!(!plans[0].direct(1) && !plans[1].direct(0));
        assert!(plans[0].transport(2).is_some_and(|t| t != Transport::NvshmemPut) || plans[0].transport(2).is_none());
        assert_eq!(format!("{:?}", plans[0]).split_whitespace().next(), Some("Routed(PE"));
    }

    /// PE 0's pulses reach an NVLink peer on its node and a peer on another node: one fused
    /// launch with stores for some pulses and puts for others, the same on both ends, and a
    /// compact summary that serialises.
    #[test]
    fn pulses_whose_peers_differ_take_different_paths_and_summarise() {
        let h = halos([2, 2, 1]);
        let facts = crate::route::synthetic_facts(&["n0".into(), "n1".into()], 2, 1, crate::route::IntraNodeLink::Nvlink);
        let topo = Arc::new(crate::route::topology_from_facts(&facts, None).expect("topology"));
        let plans: Vec<RoutedPaths> = (0..4)
            .map(|r| RoutedPaths::plan(&mut Router::new(r, Arc::clone(&topo), RouteConfig::default()).expect("router"), &h).expect("plan"))
            .collect();
        RoutedPaths::check_symmetric(&plans).expect("both ends agree");
        let mut seen = std::collections::BTreeSet::new();
        for plan in &plans {
            let paths = plan.pulse_paths().expect("paths");
            assert_eq!(paths.len(), h[plan.self_pe].pulses.len());
            for (c, spec) in paths.iter().zip(&h[plan.self_pe].pulses) {
                assert_eq!((c.send_peer, c.recv_peer), (spec.send_rank, spec.recv_rank));
                for (peer, path) in [(c.send_peer, c.send), (c.recv_peer, c.recv)] {
                    let level = topo.distance(plan.self_pe, peer).expect("in range");
                    // Inside the node the kernel writes peer memory; across nodes it puts.
                    assert_eq!(path.direct(), level <= DistanceLevel::NvLink, "PE {} -> {peer} at {level}: {path}", plan.self_pe);
                    seen.insert(path);
                }
            }
        }
        assert!(seen.contains(&PulsePath::Put) && seen.iter().any(|p| p.direct()), "{seen:?}");
        assert_eq!(RoutedPaths::exchange_transport(&plans, true).ok(), Some(crate::desc::Transport::Fused));

        let summary = plans[0].summary().expect("summary");
        assert_eq!(summary.topology.as_ref().map(|t| t.hash.clone()), Some(topo.hash_hex()));
        assert!(summary.peers.iter().any(|p| p.path == PulsePath::Put && p.level == DistanceLevel::Spine), "{summary}");
        let json = serde_json::to_string(&summary).expect("serialise");
        assert!(json.len() < 2048, "compact: {json}");
        assert_eq!(serde_json::from_str::<RoutedSummary>(&json).expect("parse"), summary);
        let line = summary.to_string();
        assert!(line.starts_with("PE 0: ") && line.contains("=nvshmem-put (put, spine, ") && line.contains(&topo.hash_hex()), "{line}");
    }

    /// Ranks in one process have no NVSHMEM, but the one-process planner asked among
    /// the exchange's transports including `nvshmem-put`, which wins on PCIe P2P GPUs with large
    /// halos (and between GPUs without P2P), so the run stopped with an error. The caller's
    /// capabilities must restrict the candidates.
    #[test]
    fn one_process_never_plans_nvshmem_put() {
        let big = synthetic::halos(SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: 40_000, send_fraction: 0.3, box_len: 5.0 }, 3);
        assert!(big[0].pulses.iter().all(|p| p.index_map.len() * 12 >= 64 * 1024), "large messages");
        let facts = crate::route::synthetic_facts(&["n0".into()], 2, 1, crate::route::IntraNodeLink::PcieP2p);
        let local = plan_local_ranks::<kernels_gpu::abi::Float3>(&facts, &big, &RouteConfig::default()).expect("one process on PCIe P2P GPUs");
        for plan in &local.plans {
            for t in plan.peers.iter().flatten() {
                assert_ne!(*t, Transport::NvshmemPut, "{plan:?}");
            }
        }
        assert_ne!(local.transport, crate::desc::Transport::Staged, "GPU-initiated over PCIe P2P");
        // Without peer access no transport works in one process: a clear error, not a put.
        let none = crate::route::synthetic_facts(&["n0".into()], 2, 1, crate::route::IntraNodeLink::NoP2p);
        let e = plan_local_ranks::<kernels_gpu::abi::Float3>(&none, &big, &RouteConfig::default()).expect_err("no P2P");
        let text = e.to_string();
        assert!(text.contains("peer access") && text.contains("halo launch"), "{text}");
        // A forced put is refused for the same reason, naming the override.
        let mut forced = RouteConfig::default();
        forced.add_cli_overrides("--route-override", &["0-1=nvshmem-put".into()]).expect("override");
        let e = plan_local_ranks::<kernels_gpu::abi::Float3>(&facts, &big, &forced).expect_err("forced put in one process");
        assert!(e.to_string().contains("--route-override"), "{e}");
    }

    /// A PE's mirror of a peer's router decides what a router built for that peer from the same
    /// settings, numbers and feedback mode decides, for every size and operation, and writes
    /// nothing into the PE's own debug output (its decisions are not this PE's).
    #[test]
    fn a_mirror_decides_as_the_peers_router_and_writes_nothing() {
        #[derive(Clone, Default)]
        struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Captured {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().expect("the capture is not poisoned").extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let facts = crate::route::synthetic_facts(&["n0".into(), "n1".into()], 2, 1, crate::route::IntraNodeLink::Nvlink);
        let topo = Arc::new(crate::route::topology_from_facts(&facts, None).expect("topology"));
        let mut config = RouteConfig::default();
        config.add_cli_overrides("--route-override", &["1-2=nvshmem-put".into()]).expect("override");
        let perf = Arc::new(crate::route::PerfTable::defaults());
        let log = Captured::default();
        for feedback in [crate::route::Feedback::Local, crate::route::Feedback::Agreed] {
            let mut mine =
                Router::with_perf(0, Arc::clone(&topo), config.clone(), Arc::clone(&perf)).expect("router").with_debug_writer(Box::new(log.clone()));
            mine.set_feedback(feedback);
            mine.route(1, Op::Put, 4096).expect("this PE's own decision is logged");
            let logged = log.0.lock().expect("capture").len();
            assert!(logged > 0, "the PE's own router writes its decisions");
            for peer in 1..4 {
                let mut mirror = mine.mirror(peer).expect("a peer in range");
                let mut theirs = Router::with_perf(peer, Arc::clone(&topo), config.clone(), Arc::clone(&perf)).expect("router");
                theirs.set_feedback(feedback);
                assert_eq!((mirror.self_pe(), mirror.feedback()), (peer, feedback));
                for other in (0..4).filter(|&q| q != peer) {
                    for op in [Op::Put, Op::Signal] {
                        for bytes in [8, 4096, 1 << 20, 64 << 20] {
                            // The same route, or the same refusal.
                            let want = theirs.route(other, op, bytes).map_err(|e| e.to_string());
                            assert_eq!(mirror.route(other, op, bytes).map_err(|e| e.to_string()), want, "{feedback:?} {peer}->{other} {op} {bytes}");
                        }
                    }
                }
            }
            assert_eq!(log.0.lock().expect("capture").len(), logged, "a mirror wrote into this PE's debug output");
        }
        assert!(matches!(Router::with_perf(0, topo, config, perf).expect("router").mirror(4), Err(RouteError::PeOutOfRange { pe: 4, n_pes: 4 })));
    }

    /// The run on two H200s: with only NCCL unmeasured, the real router must never hand the
    /// exchange NCCL, and forcing it is an error that names the override.
    #[test]
    fn real_router_never_hands_the_exchange_nccl() {
        let h = halos([2, 1, 1]);
        let topo = Arc::new(crate::route::single_node(2).expect("topology"));
        let cal = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/results/routing/calibration-2xH200.json");
        let perf = Arc::new(crate::route::PerfTable::load_calibration(std::path::Path::new(cal)).expect("the real calibration file loads"));
        for r in 0..2 {
            let mut router = Router::with_perf(r, Arc::clone(&topo), RouteConfig::default(), Arc::clone(&perf)).expect("router");
            let plan = RoutedPaths::plan(&mut router, &h).expect("plan");
            let t = plan.transport(1 - r).expect("the pair is routed");
            assert!(EXCHANGE_TRANSPORTS.contains(t), "{t}");
            plan.mirror_check(&router, &h).expect("mirror agrees");
        }
        let mut config = RouteConfig::default();
        config.add_cli_overrides("--route-override", &["0-1=nccl".into()]).expect("override");
        let mut router = Router::with_perf(0, Arc::clone(&topo), config, perf).expect("router");
        let e = RoutedPaths::plan(&mut router, &h).expect_err("nccl is not an exchange transport");
        let text = e.to_string();
        assert!(matches!(e, PathError::Route(RouteError::ForcedUnusable { transport: Transport::Nccl, .. })), "{text}");
        assert!(text.contains("not usable by this caller") && text.contains("--route-override"), "{text}");
    }
}
