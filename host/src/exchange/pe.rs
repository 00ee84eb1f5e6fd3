//! One rank per process (an NVSHMEM PE): buffers on the symmetric heap, peers reached by
//! `nvshmem_ptr` where NVLink allows loads and stores, by NVSHMEM puts otherwise (or when forced).

use super::host_driven::{Direction, HostDriven};
use super::memory::MemoryKind;
use super::pe_links::PeLinks;
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
    /// Direct loads/stores wherever `nvshmem_ptr` maps the peer, puts elsewhere.
    #[default]
    Auto,
    /// NVSHMEM put + signal for every pulse, even between NVLink peers (exercises the network path).
    ForcePut,
    /// Per peer as the router decided from each pulse's size ([`crate::route::RoutedPaths::plan`]):
    /// `nvlink-store`, `nvlink-tma` and `staged` use the peer's `nvshmem_ptr` view (falling back to
    /// puts, with a warning, where NVSHMEM maps no address), `nvshmem-put` uses puts. A `'static`
    /// reference ([`crate::route::RoutedPaths::leak`], made once per run) keeps the policy `Copy`.
    Routed(&'static crate::route::RoutedPaths),
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
    host: HostDriven,
    /// The host-driven transports' links, or why they cannot run here (the same on every PE).
    links: std::result::Result<PeLinks, String>,
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
    /// let mut pe = PeExchange::<f64>::new(s.nvshmem.clone(), s.module.clone(), halos, PathPolicy::Auto)?;
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
        let sizes = SharedSizes::of(&halos);
        let mut rank = RankExchange::new(me, halos[me].clone(), module.clone(), &MemoryKind::Symmetric(nvshmem.clone()), sizes)?;
        let local = rank.local_view();
        let view = |peer: usize| -> Option<PeerView> {
            match &policy {
                PathPolicy::ForcePut => return None,
                PathPolicy::Routed(paths) => {
                    // A plan made for another PE would pair the wrong peers: a caller bug.
                    debug_assert_eq!(paths.self_pe, me, "routed paths planned for another PE");
                    if !paths.direct(peer) {
                        return None;
                    }
                }
                PathPolicy::Auto => {}
            }
            let mapped = (|| {
                Some(PeerView {
                    x: nvshmem.peer_ptr(local.x, peer)?,
                    signals: nvshmem.peer_ptr(local.signals, peer)?,
                    recv_buf: nvshmem.peer_ptr(local.recv_buf, peer)?,
                })
            })();
            if let (None, PathPolicy::Routed(paths)) = (&mapped, &policy) {
                tracing::warn!(
                    "route: PE {me} -> PE {peer}: the router chose {} but NVSHMEM maps no address for the peer; using puts",
                    paths.transport(peer).map_or("-", |t| t.name())
                );
            }
            mapped
        };
        let mode = signaling.resolve(std::env::var("NVSHMEM_REMOTE_TRANSPORT").ok().as_deref());
        rank.install(&view, &super::credits::flags(&halos)[me], mode)?;
        if rank.any_put() && !module.nvshmem_registered() {
            return Err(HaloError::InvalidInput("the put path needs the kernel module registered with NVSHMEM".into()));
        }
        let (sms, per_sm) = rank.residency()?;
        rank.cap_grids(sms * per_sm / halos[me].pulses.len().max(1) as u32);
        let stream = super::rank::halo_stream(module.context())?;
        let links = PeLinks::setup(&nvshmem, &rank, &halos)?;
        nvshmem.barrier_all()?;
        Ok(Self { rank, nvshmem, host: HostDriven::new(&halos), halos, stream, host_syncs: 0, links })
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
        if let (true, Err(why)) = (transport.host_driven(), &self.links) {
            return Err(HaloError::InvalidInput(format!("the {} transport cannot run between these PEs: {why}", transport.name())));
        }
        Ok(())
    }

    /// Runs one direction of a host-driven transport.
    fn host_driven(&mut self, transport: Transport, direction: Direction) -> Result<()> {
        let links = self.links.as_mut().map_err(|why| HaloError::InvalidInput(format!("the {} transport cannot run here: {why}", transport.name())))?;
        self.host_syncs += self.host.run(transport, direction, std::slice::from_ref(&self.rank), std::slice::from_ref(&self.stream), links)?;
        Ok(())
    }

    /// Launches (GPU-initiated, direct-copy) or runs (staged) one step's coordinate halo.
    pub fn launch_coordinates(&mut self, transport: Transport) -> Result<()> {
        self.check_transport(transport)?;
        if transport.host_driven() {
            return self.host_driven(transport, Direction::Forward);
        }
        self.host.note(Direction::Forward);
        self.rank.launch_coordinates(transport, &self.stream)
    }

    /// Launches (GPU-initiated, direct-copy) or runs (staged) one step's force halo.
    pub fn launch_forces(&mut self, transport: Transport) -> Result<()> {
        if transport.host_driven() {
            return self.host_driven(transport, Direction::Reverse);
        }
        self.host.note(Direction::Reverse);
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
        self.host.reset();
        if let Ok(links) = &mut self.links {
            links.reset();
        }
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
