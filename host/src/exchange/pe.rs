//! One rank per process (an NVSHMEM PE): buffers on the symmetric heap, peers reached by
//! `nvshmem_ptr` where NVLink allows loads and stores, by NVSHMEM puts otherwise (or when forced).

use super::memory::MemoryKind;
use super::rank::{PeerView, RankExchange, SharedSizes};
use super::spec::{RankHalo, validate};
use super::{Element, Transport};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaStream, DeviceMemory, KernelModule};
use crate::nvshmem::Nvshmem;
use kernels_gpu::abi::SignalMode;
use std::sync::Arc;

/// How pulses reach their peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PathPolicy {
    /// The router decides (the default): when the exchange is built, every PE's facts are
    /// all-gathered through NVSHMEM (once per process), the router plans this PE's pulses from
    /// their sizes, the plans are all-gathered and checked symmetric, and the exchange follows
    /// the plan as [`PathPolicy::Planned`] does. Drivers that feed failures back keep their own
    /// router ([`super::routing::Routing`]) and pass its plans as `Planned`.
    #[default]
    Routed,
    /// Per peer as a router decided from each pulse's size ([`crate::route::RoutedPaths::plan`]):
    /// `nvlink-store` stores and `nvlink-tma` copies in bulk (per pulse, inside one fused launch)
    /// through the peer's `nvshmem_ptr` view, `staged` uses the view too (falling back to puts,
    /// with a warning, where NVSHMEM maps no address), `nvshmem-put` uses puts. A `'static`
    /// reference ([`crate::route::RoutedPaths::leak`], made once per plan) keeps the policy `Copy`.
    Planned(&'static crate::route::RoutedPaths),
    /// Direct loads/stores wherever `nvshmem_ptr` maps the peer, puts elsewhere (no router).
    Auto,
    /// NVSHMEM put + signal for every pulse, even between NVLink peers (exercises the network path).
    ForcePut,
}

impl PathPolicy {
    /// Parses a policy name as the commands' `--paths` takes it: `routed`, `auto` or `force-put`
    /// (a plan cannot be named).
    pub fn parse(name: &str) -> Result<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "routed" | "" => Ok(Self::Routed),
            "auto" => Ok(Self::Auto),
            "force-put" => Ok(Self::ForcePut),
            other => Err(HaloError::InvalidInput(format!("--paths {other:?}: use routed (the router decides, the default), auto (stores wherever mapped) or force-put"))),
        }
    }

    /// The name [`Self::parse`] takes (`planned` for a plan).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Routed => "routed",
            Self::Planned(_) => "planned",
            Self::Auto => "auto",
            Self::ForcePut => "force-put",
        }
    }
}

/// How pulses on the NVSHMEM put path signal their peer (issue 19). Only pulses whose peer is
/// not mapped (or every pulse under [`PathPolicy::ForcePut`]) use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PutSignaling {
    /// `FencedPut` when NVSHMEM's remote transport is UCX, `PutSignal` otherwise (see
    /// [`Self::resolve`]).
    #[default]
    Auto,
    /// `putmem_signal_nbi_block` with `NVSHMEM_SIGNAL_SET`: the signal is a remote atomic on a
    /// proxy transport (IBRC, and UCX only with GDRCopy).
    PutSignal,
    /// Data put, `nvshmem_fence`, then an 8-byte put of the step counter into the slot: no remote
    /// atomic, so it works on every transport.
    FencedPut,
}

impl PutSignaling {
    /// The environment variable that forces a mode: `put-signal`, `fenced-put` or `auto`.
    pub const ENV: &'static str = "HALO_PUT_SIGNAL";

    /// Parses a mode name as [`Self::ENV`] takes it.
    pub fn parse(name: &str) -> Result<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(Self::Auto),
            "put-signal" => Ok(Self::PutSignal),
            "fenced-put" => Ok(Self::FencedPut),
            other => Err(HaloError::InvalidInput(format!(
                "{}={other:?} is not a put signalling mode: use put-signal, fenced-put or auto",
                Self::ENV
            ))),
        }
    }

    /// The mode [`Self::ENV`] asks for (`Auto` when it is unset).
    pub fn from_env() -> Result<Self> {
        std::env::var(Self::ENV).map_or(Ok(Self::Auto), |v| Self::parse(&v))
    }

    /// The device mode. `Auto` decides from `remote_transport` (the value of
    /// `NVSHMEM_REMOTE_TRANSPORT`): NVSHMEM 3.4.5 offers no query for whether its transport can do
    /// remote atomics, and UCX cannot without GDRCopy (the proxy aborts on the signal's atomic),
    /// so UCX gets `FencedPut`; IBRC (the default), IBGDA and libfabric keep `PutSignal`.
    /// `NVSHMEM_DISABLE_P2P=1` does not change the mode: it only sends every pulse through the
    /// remote transport, whose capabilities decide.
    pub fn resolve(self, remote_transport: Option<&str>) -> SignalMode {
        match self {
            Self::PutSignal => SignalMode::PutSignal,
            Self::FencedPut => SignalMode::FencedPut,
            Self::Auto if remote_transport.is_some_and(|t| t.trim().eq_ignore_ascii_case("ucx")) => SignalMode::FencedPut,
            Self::Auto => SignalMode::PutSignal,
        }
    }
}

/// This PE's exchange of values of type `T`.
pub struct PeExchange<T: Element = kernels_gpu::abi::Float3> {
    rank: RankExchange<T>,
    nvshmem: Arc<Nvshmem>,
    halos: Vec<RankHalo>,
    stream: Arc<CudaStream>,
    host_syncs: u64,
    routes: Option<crate::route::RoutedSummary>,
}

impl<T: Element> PeExchange<T> {
    /// Sets up this PE's side of `halos` (every PE passes the same, complete list; allocation is
    /// collective). Ends with a barrier, so no PE launches before every PE initialised its signals.
    ///
    /// ```no_run
    /// // Run as `halo launch -n 2 -- ...`-style ranks (or under mpirun/srun).
    /// use halo::exchange::{Transport, pe::{PathPolicy, PeExchange}, synthetic};
    /// use halo::launch::RankEnv;
    /// use halo::session::PeSession;
    ///
    /// # fn main() -> halo::Result<()> {
    /// let env = RankEnv::from_env_or_single();
    /// let s = PeSession::start(env, None)?; // GPU, NVSHMEM, registered kernels
    /// let halos = synthetic::halos(
    ///     synthetic::SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: 1000, send_fraction: 0.3, box_len: 5.0 },
    ///     1,
    /// );
    /// let mut pe = PeExchange::<f64>::new(s.nvshmem.clone(), s.module.clone(), halos, PathPolicy::Routed)?;
    /// pe.exchange_forward(Transport::Fused)?;
    /// pe.exchange_reverse_accumulate(Transport::Fused)?;
    /// pe.finish()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(nvshmem: Arc<Nvshmem>, module: Arc<KernelModule>, halos: Vec<RankHalo>, policy: PathPolicy) -> Result<Self> {
        Self::with_put_signaling(nvshmem, module, halos, policy, PutSignaling::from_env()?)
    }

    /// [`Self::new`] with the put path's signalling chosen by the caller instead of
    /// [`PutSignaling::ENV`].
    pub fn with_put_signaling(
        nvshmem: Arc<Nvshmem>,
        module: Arc<KernelModule>,
        halos: Vec<RankHalo>,
        policy: PathPolicy,
        signaling: PutSignaling,
    ) -> Result<Self> {
        validate(&halos)?;
        if halos.len() != nvshmem.n_pes() {
            return Err(HaloError::InvalidInput(format!("the decomposition has {} ranks but {} PEs are running", halos.len(), nvshmem.n_pes())));
        }
        let me = nvshmem.my_pe();
        let policy = match policy {
            PathPolicy::Routed => {
                // Collective like the rest of the constructor: facts (once), plans all-gathered.
                let placement = super::Placement::Pe { nvshmem: nvshmem.clone(), module: module.clone(), policy };
                let mut routing = super::routing::Routing::new(&placement, halos.len(), &[])?;
                let plan = routing.plan::<T>(&halos)?[me].clone();
                PathPolicy::Planned(plan.leak())
            }
            p => p,
        };
        let sizes = SharedSizes::of(&halos);
        let mut rank = RankExchange::new(me, halos[me].clone(), module.clone(), &MemoryKind::Symmetric(nvshmem.clone()), sizes)?;
        let local = rank.local_view();
        let view = |peer: usize| -> Option<PeerView> {
            match &policy {
                PathPolicy::ForcePut => return None,
                PathPolicy::Planned(paths) => {
                    // A plan made for another PE would pair the wrong peers: a caller bug.
                    debug_assert_eq!(paths.self_pe, me, "routed paths planned for another PE");
                    if !paths.direct(peer) {
                        return None;
                    }
                }
                PathPolicy::Auto | PathPolicy::Routed => {}
            }
            let mapped = (|| {
                Some(PeerView {
                    x: nvshmem.peer_ptr(local.x, peer)?,
                    signals: nvshmem.peer_ptr(local.signals, peer)?,
                    recv_buf: nvshmem.peer_ptr(local.recv_buf, peer)?,
                })
            })();
            if let (None, PathPolicy::Planned(paths)) = (&mapped, &policy) {
                tracing::warn!(
                    "route: PE {me} -> PE {peer}: the router chose {} but NVSHMEM maps no address for the peer; using puts",
                    paths.transport(peer).map_or("-", |t| t.name())
                );
            }
            mapped
        };
        let mode = signaling.resolve(std::env::var("NVSHMEM_REMOTE_TRANSPORT").ok().as_deref());
        rank.install(&view, &super::credits::flags(&halos)[me], mode)?;
        let mut routes = None;
        if let PathPolicy::Planned(paths) = policy {
            // Bulk copies where the pair chose nvlink-tma and NVSHMEM maps the peer; the others as
            // installed (stores where mapped, puts elsewhere).
            let mapped: Vec<bool> = rank.coord_paths().iter().map(|p| *p != kernels_gpu::abi::CoordPath::Put).collect();
            let bulk: Vec<bool> = paths.bulk_pulses(&halos[me]).iter().zip(&mapped).map(|(b, m)| *b && *m).collect();
            rank.set_bulk_pulses(&bulk)?;
            routes = Some(paths.summary()?);
        }
        if rank.any_put() && !module.nvshmem_registered() {
            return Err(HaloError::InvalidInput("the put path needs the kernel module registered with NVSHMEM".into()));
        }
        let (sms, per_sm) = rank.residency()?;
        rank.cap_grids(sms * per_sm / halos[me].pulses.len().max(1) as u32);
        let stream = super::rank::halo_stream(module.context())?;
        nvshmem.barrier_all()?;
        Ok(Self { rank, nvshmem, halos, stream, host_syncs: 0, routes })
    }

    /// What the router chose for this PE (routed and planned policies), for run outputs.
    pub fn routes(&self) -> Option<&crate::route::RoutedSummary> {
        self.routes.as_ref()
    }

    /// This PE's rank exchange (buffers, status).
    pub fn rank(&self) -> &RankExchange<T> {
        &self.rank
    }

    /// Mutable access (wait timeout, reset).
    pub fn rank_mut(&mut self) -> &mut RankExchange<T> {
        &mut self.rank
    }

    /// The stream the exchange runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Every rank's halo.
    pub fn halos(&self) -> &[RankHalo] {
        &self.halos
    }

    /// Host synchronisations so far.
    pub fn host_syncs(&self) -> u64 {
        self.host_syncs
    }

    /// Checks that `transport` can run with this PE's peers.
    pub fn check_transport(&self, transport: Transport) -> Result<()> {
        if transport.needs_direct_peers() && !self.rank.all_direct() {
            return Err(HaloError::InvalidInput(format!(
                "the {} transport needs every peer reachable by NVLink loads/stores (nvshmem_ptr), which some are not here",
                transport.name()
            )));
        }
        if (transport == Transport::Staged) && !self.rank.all_direct() {
            return Err(HaloError::InvalidInput("the staged transport copies into peer memory and needs P2P-reachable peers".into()));
        }
        Ok(())
    }

    /// Launches (GPU-initiated) or runs (staged) one step's coordinate halo.
    pub fn launch_coordinates(&mut self, transport: Transport) -> Result<()> {
        self.check_transport(transport)?;
        if transport == Transport::Staged {
            return self.staged(false);
        }
        self.rank.launch_coordinates(transport, &self.stream)
    }

    /// Launches (GPU-initiated) or runs (staged) one step's force halo.
    pub fn launch_forces(&mut self, transport: Transport) -> Result<()> {
        if transport == Transport::Staged {
            return self.staged(true);
        }
        self.rank.launch_forces(&self.stream)
    }

    /// Forward exchange of one step (the same as [`Self::launch_coordinates`]).
    pub fn exchange_forward(&mut self, transport: Transport) -> Result<()> {
        self.launch_coordinates(transport)
    }

    /// Reverse exchange with accumulation of one step (the same as [`Self::launch_forces`]).
    pub fn exchange_reverse_accumulate(&mut self, transport: Transport) -> Result<()> {
        self.launch_forces(transport)
    }

    /// Waits for the stream and reports a device wait timeout as an error.
    pub fn finish(&mut self) -> Result<()> {
        self.stream.synchronize().during("waiting for the halo stream")?;
        self.host_syncs += 1;
        self.rank.check_status()
    }

    /// GROMACS's host-driven path across processes: per pulse, pack (or nothing for forces), host
    /// sync, a copy into the peer's memory through its mapped address, host sync, and a host
    /// barrier so the peer knows its data arrived; forces are then accumulated.
    fn staged(&mut self, forces: bool) -> Result<()> {
        let me = self.nvshmem.my_pe();
        let local = self.rank.local_view();
        let n = self.halos[me].pulses.len();
        let order: Vec<usize> = if forces { (0..n).rev().collect() } else { (0..n).collect() };
        for p in order {
            let (owner, to) = (self.halos[me].pulses[p].recv_rank, self.halos[me].pulses[p].send_rank);
            if forces {
                let slot = self.nvshmem.peer_ptr(self.rank.recv_slot(p), owner).ok_or_else(|| HaloError::InvalidInput("peer not mapped".into()))?;
                self.rank.stage_forces_to(p, slot, &self.stream)?;
            } else {
                self.rank.stage_pack(p, &self.stream)?;
                self.sync()?;
                let view = PeerView {
                    x: self.nvshmem.peer_ptr(local.x, to).ok_or_else(|| HaloError::InvalidInput("peer not mapped".into()))?,
                    signals: 0,
                    recv_buf: 0,
                };
                self.rank.stage_copy_to(p, view, &self.stream)?;
            }
            self.sync()?;
            self.nvshmem.barrier_all()?;
            if forces {
                self.rank.stage_unpack_forces(p, &self.stream)?;
                self.sync()?;
            }
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        self.stream.synchronize().during("staged halo")?;
        self.host_syncs += 1;
        Ok(())
    }

    /// Host barrier across PEs (used between checked steps in tests and benchmarks).
    pub fn barrier(&self) -> Result<()> {
        self.nvshmem.barrier_all()
    }

    /// Resets this PE's device-side protocol so the exchange can run again from step 0.
    /// Collective: no PE may still be running the previous steps while a peer resets its slots,
    /// and none may start the next before every peer has reset, so barriers fence the reset.
    pub fn reset_protocol(&mut self) -> Result<()> {
        self.barrier()?;
        self.rank.reset_protocol()?;
        self.rank.context().synchronize().during("waiting for the protocol reset")?;
        self.barrier()
    }

    /// This PE's coordinates (`total_atoms` of them).
    pub fn coordinates(&self) -> Result<Vec<T>> {
        Ok(self.rank.x.to_host()?[..self.rank.halo().total_atoms].to_vec())
    }

    /// This PE's forces (`total_atoms` of them).
    pub fn forces(&self) -> Result<Vec<T>> {
        Ok(self.rank.f.to_host()?[..self.rank.halo().total_atoms].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_signaling_names_and_the_automatic_choice() {
        assert_eq!(PutSignaling::parse("fenced-put").unwrap(), PutSignaling::FencedPut);
        assert_eq!(PutSignaling::parse(" Put-Signal ").unwrap(), PutSignaling::PutSignal);
        assert_eq!(PutSignaling::parse("auto").unwrap(), PutSignaling::Auto);
        let err = PutSignaling::parse("atomic").unwrap_err().to_string();
        assert!(err.contains("HALO_PUT_SIGNAL") && err.contains("fenced-put"), "{err}");
        // UCX has no remote atomics without GDRCopy: fenced puts. Everything else keeps put-signal.
        assert_eq!(PutSignaling::Auto.resolve(Some("ucx")), SignalMode::FencedPut);
        assert_eq!(PutSignaling::Auto.resolve(Some("UCX")), SignalMode::FencedPut);
        for t in [None, Some("ibrc"), Some("none"), Some("libfabric")] {
            assert_eq!(PutSignaling::Auto.resolve(t), SignalMode::PutSignal, "{t:?}");
        }
        // A forced mode wins over the transport.
        assert_eq!(PutSignaling::PutSignal.resolve(Some("ucx")), SignalMode::PutSignal);
        assert_eq!(PutSignaling::FencedPut.resolve(None), SignalMode::FencedPut);
    }
}
