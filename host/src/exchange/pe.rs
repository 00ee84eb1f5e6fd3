//! One rank per process (an NVSHMEM PE): buffers on the symmetric heap, peers reached by
//! `nvshmem_ptr` where NVLink allows loads and stores, by NVSHMEM puts otherwise (or when forced).

use super::caller::CallerBuffers;
use super::host_driven::{Direction, HostDriven};
use super::interface::ReplanFence;
use super::memory::MemoryKind;
use super::pe_links::PeLinks;
use super::rank::{PeerView, RankExchange, SharedSizes};
use super::reset::ResetStep;
use super::spec::validate;
use crate::desc::RankHalo;
use crate::desc::{Element, Transport};
use crate::error::{HaloError, Result};
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
    /// through the peer's `nvshmem_ptr` view, `staged` uses the view too (falling back to puts at
    /// both ends of the pair, with a warning, where NVSHMEM maps no address at either end),
    /// `nvshmem-put` uses puts. A `'static`
    /// reference ([`crate::route::RoutedPaths::leak`], made once per plan) keeps the policy `Copy`.
    Planned(&'static crate::route::RoutedPaths),
    /// Direct loads/stores wherever `nvshmem_ptr` maps the pair both ways, puts elsewhere (no
    /// router).
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
            other => Err(HaloError::InvalidInput(format!(
                "--paths {other:?}: use routed (the router decides, the default), auto (stores wherever mapped) or force-put"
            ))),
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

/// How pulses on the NVSHMEM put path signal their peer. Only pulses whose peer is
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
            other => {
                Err(HaloError::InvalidInput(format!("{}={other:?} is not a put signalling mode: use put-signal, fenced-put or auto", Self::ENV)))
            }
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

/// One PE's halo as [`PeExchange::with_buffers`] gathers it, with why its buffers cannot be used.
#[derive(serde::Serialize, serde::Deserialize)]
struct GatheredHalo {
    halo: RankHalo,
    refusal: Option<String>,
}

/// This PE's exchange of values of type `T`.
pub struct PeExchange<T: Element = kernels_gpu::abi::Float3> {
    rank: RankExchange<T>,
    nvshmem: Arc<Nvshmem>,
    halos: Vec<RankHalo>,
    stream: Arc<CudaStream>,
    host_syncs: u64,
    /// Host barriers of the replans so far ([`Self::replan_barriers`]).
    replan_barriers: u64,
    /// `NVSHMEM_REMOTE_TRANSPORT` when the exchange was built (for messages).
    remote_transport: Option<String>,
    /// Why the exchange cannot be trusted any more (a wait that expired, a stuck stream), until a
    /// successful [`Self::reset_protocol`]. Dropped in that state, it gives up NVSHMEM's
    /// collective teardown ([`crate::nvshmem::abandon_collectives`]; see
    /// [`crate::nvshmem::set_abandon_after_failure`]): the peers may be gone.
    failed: Option<String>,
    /// How pulses reach their peers (kept for [`Self::replan`]); never `Routed` (the constructor
    /// turns it into this PE's `Planned`).
    policy: PathPolicy,
    /// The put path's signalling (kept for [`Self::replan`]).
    mode: SignalMode,
    /// `mapped[pe]`: this PE reaches `pe` by loads and stores, as both ends of the pair agreed when
    /// the exchange was built (`peer_map`; the buffers and the policy stay across replans).
    mapped: Vec<bool>,
    routes: Option<crate::route::RoutedSummary>,
    /// The host-driven transports' step state (staged, direct-copy).
    host: HostDriven,
    /// The host-driven transports' links, or why they cannot run here (the same on every PE).
    links: std::result::Result<PeLinks, String>,
    /// Atoms every PE's `x` and `f` hold (`capacities[pe]`), known alike on every PE: the shared
    /// sizes' for the exchange's own buffers, each PE's own for the caller's.
    capacities: Vec<usize>,
}

impl<T: Element> PeExchange<T> {
    /// Sets up this PE's side of `halos` (every PE passes the same, complete list; allocation is
    /// collective). Ends with the collective protocol reset (`reset`): no PE launches
    /// before every PE zeroed its slots, and nothing an earlier exchange left in reused symmetric
    /// memory, or still had in flight, can satisfy a wait of this one.
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
        let sizes = SharedSizes::of(&halos);
        Self::with_sizes(nvshmem, module, halos, policy, signaling, sizes)
    }

    /// [`Self::with_put_signaling`] with buffers of `sizes` (at least [`SharedSizes::of`]`(&halos)`,
    /// the same on every PE; larger sizes let [`Self::replan`] keep the buffers when a later
    /// decomposition grows).
    pub fn with_sizes(
        nvshmem: Arc<Nvshmem>,
        module: Arc<KernelModule>,
        halos: Vec<RankHalo>,
        policy: PathPolicy,
        signaling: PutSignaling,
        sizes: SharedSizes,
    ) -> Result<Self> {
        Self::built(nvshmem, module, halos, policy, signaling, sizes, None)
    }

    /// This PE's side of the exchange on the caller's coordinates and forces (`buffers`, see
    /// [`super::caller`]), from this PE's own halo: every PE's halo is all-gathered here (the
    /// caller need not know its peers'), then the exchange is built as [`Self::new`] builds it.
    /// Only the protocol state is allocated.
    ///
    /// Peers store into and put to these buffers, so across PEs they must be on NVSHMEM's
    /// symmetric heap at the same offset on every PE: allocate them with `nvshmem_malloc` (or
    /// [`Nvshmem::alloc`]) in the same order on every PE, as GROMACS allocates its coordinates
    /// for its NVSHMEM halo exchange. Every PE must call this (not [`Self::new`]) for the same
    /// exchange; a PE whose buffers do not qualify makes every PE return the same error, naming it.
    pub fn with_buffers(
        nvshmem: Arc<Nvshmem>,
        module: Arc<KernelModule>,
        mine: RankHalo,
        policy: PathPolicy,
        buffers: CallerBuffers<T>,
    ) -> Result<Self> {
        Self::with_buffers_or_refusal(nvshmem, module, mine, policy, Ok(buffers))
    }

    /// [`Self::with_buffers`] for a PE that may have failed to describe its buffers (a
    /// [`CallerSlice::from_raw`](super::CallerSlice::from_raw) that refused them): its error is
    /// handed to every PE through the same all-gather, so that every PE returns it instead of the
    /// others waiting in the gather for this one until the collective deadline. Collective.
    pub fn with_buffers_or_refusal(
        nvshmem: Arc<Nvshmem>,
        module: Arc<KernelModule>,
        mine: RankHalo,
        policy: PathPolicy,
        buffers: Result<CallerBuffers<T>>,
    ) -> Result<Self> {
        let me = nvshmem.my_pe();
        let symmetric = |p: u64| nvshmem.peer_ptr(p, me) == Some(p);
        // This PE's own settings too, before the first collective, so that a bad value stops
        // every PE alike instead of this one alone.
        let signaling = PutSignaling::from_env();
        let refusal = match (&buffers, &signaling) {
            (_, Err(e)) | (Err(e), _) => Some(format!("PE {me}: {e}")),
            (Ok(b), Ok(_)) => match b.check(me, mine.total_atoms, module.context().ordinal()) {
                Err(e) => Some(e.to_string()),
                Ok(()) => (!symmetric(b.x.device_ptr()) || !symmetric(b.f.device_ptr())).then(|| {
                    format!(
                        "PE {me}: the caller's `x` ({:#x}) or `f` ({:#x}) is not on NVSHMEM's symmetric heap: peers store into them, so allocate them \
                         with nvshmem_malloc (or halo's Nvshmem::alloc) on every PE in the same order",
                        b.x.device_ptr(),
                        b.f.device_ptr()
                    )
                }),
            },
        };
        let ours = GatheredHalo { halo: mine, refusal };
        let bytes = serde_json::to_vec(&ours).map_err(|e| HaloError::InvalidInput(format!("encoding PE {me}'s halo: {e}")))?;
        let all = nvshmem.all_gather_bytes(&bytes)?;
        let mut halos = Vec::with_capacity(all.len());
        for (pe, b) in all.iter().enumerate() {
            let theirs: GatheredHalo = serde_json::from_slice(b).map_err(|e| HaloError::InvalidInput(format!("decoding PE {pe}'s halo: {e}")))?;
            if let Some(why) = theirs.refusal {
                return Err(HaloError::InvalidInput(format!("the caller's buffers cannot be used (every PE stops here): {why}")));
            }
            halos.push(theirs.halo);
        }
        // No PE refused, this one included: its buffers and settings are there.
        let (buffers, signaling) = (buffers?, signaling?);
        let sizes = SharedSizes::of(&halos);
        let mut this = Self::built(nvshmem, module, halos, policy, signaling, sizes, Some(buffers))?;
        // Same heap offset on every PE: each buffer's distance from this exchange's own
        // (symmetric) signal slots must agree, or a peer's store would land elsewhere. Every
        // PE's capacity travels with them, for replans (`replan_fenced`).
        let view = this.rank.local_view();
        let distance = |p: u64| p.wrapping_sub(view.signals);
        let mine = [distance(this.rank.x.device_ptr()), distance(this.rank.f.device_ptr()), this.rank.capacity() as u64];
        let all = this.nvshmem.all_gather_bytes(bytemuck::cast_slice(&mine))?;
        let mut capacities = Vec::with_capacity(all.len());
        for (pe, bytes) in all.iter().enumerate() {
            let theirs: [u64; 3] = bytemuck::pod_read_unaligned(
                bytes.get(..24).ok_or_else(|| HaloError::InvalidInput(format!("PE {pe} sent {} bytes of buffer facts, 24 expected", bytes.len())))?,
            );
            if theirs[..2] != mine[..2] {
                return Err(HaloError::InvalidInput(format!(
                    "the caller's `x`/`f` of PE {pe} sit at another symmetric-heap offset than PE {me}'s: allocate them in the same order and sizes on every PE"
                )));
            }
            capacities.push(theirs[2] as usize);
        }
        this.capacities = capacities;
        Ok(this)
    }

    fn built(
        nvshmem: Arc<Nvshmem>,
        module: Arc<KernelModule>,
        halos: Vec<RankHalo>,
        policy: PathPolicy,
        signaling: PutSignaling,
        sizes: SharedSizes,
        buffers: Option<CallerBuffers<T>>,
    ) -> Result<Self> {
        validate(&halos)?;
        if halos.len() != nvshmem.n_pes() {
            return Err(HaloError::InvalidInput(format!("the decomposition has {} ranks but {} PEs are running", halos.len(), nvshmem.n_pes())));
        }
        if !sizes.holds(&SharedSizes::of(&halos)) {
            return Err(HaloError::InvalidInput(format!("buffer sizes {sizes:?} cannot hold these halos ({:?})", SharedSizes::of(&halos))));
        }
        let me = nvshmem.my_pe();
        // The footprint of `sizes`, headroom included: what `RankExchange::new` allocates.
        // every PE fails alike, before any collective
        super::heap::precheck_pe::<T>(module.context(), &halos, me, sizes, buffers.is_some())?;
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
        let kind = MemoryKind::Symmetric(nvshmem.clone());
        let rank = match buffers {
            Some(b) => RankExchange::with_buffers(me, halos[me].clone(), module.clone(), &kind, sizes, b)?,
            None => RankExchange::new(me, halos[me].clone(), module.clone(), &kind, sizes)?,
        };
        let remote_transport = std::env::var("NVSHMEM_REMOTE_TRANSPORT").ok();
        let mode = signaling.resolve(remote_transport.as_deref());
        let stream = super::rank::halo_stream(module.context())?;
        // Collective, as the allocations: the host-driven transports' events and mailbox.
        let links = PeLinks::setup(&nvshmem, &rank, &halos)?;
        let host = HostDriven::new(&halos);
        // Collective: both ends of every pair agree whether it is mapped, so that no pulse is
        // stored as words at one end and awaited as a put's signal at the other.
        let local = rank.local_view();
        let own: Vec<bool> = (0..halos.len()).map(|peer| own_view(&policy, &nvshmem, &local, peer).is_some()).collect();
        let mapped = super::peer_map::agree(&nvshmem, &own)?;
        let capacities = vec![sizes.atoms; halos.len()];
        let mut this = Self {
            rank,
            nvshmem,
            halos,
            stream,
            host_syncs: 0,
            replan_barriers: 0,
            remote_transport,
            failed: None,
            policy,
            mode,
            mapped,
            routes: None,
            host,
            links,
            capacities,
        };
        this.install()?;
        this.reset_protocol()?;
        Ok(this)
    }

    /// Writes this PE's metadata for its current halo (`self.halos`): peers by `nvshmem_ptr` as
    /// the policy allows, puts elsewhere, bulk copies where the plan chose `nvlink-tma`, uploaded
    /// in one copy enqueued on the exchange stream (the kernels that read it launch there, after
    /// it); caps the grids for residency.
    fn install(&mut self) -> Result<()> {
        let (me, policy, nvshmem) = (self.nvshmem.my_pe(), self.policy, self.nvshmem.clone());
        let local = self.rank.local_view();
        // Only the pairs both ends map (`peer_map`); puts for the others.
        let mapped = &self.mapped;
        let view = |peer: usize| -> Option<PeerView> {
            if mapped.get(peer).copied().unwrap_or(false) { own_view(&policy, &nvshmem, &local, peer) } else { None }
        };
        self.rank.install_deferred(&view, &super::credits::flags(&self.halos)[me], self.mode)?;
        if let PathPolicy::Planned(paths) = policy {
            // Bulk copies where the pair chose nvlink-tma and NVSHMEM maps the peer; the others as
            // installed (stores where mapped, puts elsewhere).
            // The plan is symmetric per pair: a pulse's sender copies it in bulk exactly when the
            // receiver's plan names nvlink-tma for that sender (and both are mapped).
            let mapped: Vec<bool> = self.rank.coord_paths().iter().map(|p| *p != kernels_gpu::abi::CoordPath::Put).collect();
            let bulk: Vec<bool> = paths.bulk_pulses(&self.halos[me]).iter().zip(&mapped).map(|(b, m)| *b && *m).collect();
            // A receiver expects a bulk copy only from a pair that stayed mapped (agreed at both ends).
            let recv_bulk: Vec<bool> =
                paths.bulk_receives(&self.halos[me]).iter().zip(&self.halos[me].pulses).map(|(b, spec)| *b && self.mapped[spec.recv_rank]).collect();
            self.rank.set_bulk_pulses_deferred(&bulk, &recv_bulk)?;
            self.routes = Some(paths.summary()?);
        }
        self.rank.upload_metadata(&self.stream)?;
        if self.rank.any_put() && !self.rank.module().nvshmem_registered() {
            return Err(HaloError::InvalidInput("the put path needs the kernel module registered with NVSHMEM".into()));
        }
        let (sms, per_sm) = self.rank.residency()?;
        let fit = blocks_per_pulse(sms, per_sm, self.halos[me].pulses.len(), crate::launch::env::pes_per_gpu())?;
        self.rank.fit_grids(fit);
        Ok(())
    }

    /// What the router chose for this PE (routed and planned policies), for run outputs.
    pub fn routes(&self) -> Option<&crate::route::RoutedSummary> {
        self.routes.as_ref()
    }

    /// Moves this PE to `halos` (a new decomposition on the same rank grid, the same complete list
    /// on every PE) in the existing symmetric buffers: `Ok(false)`, changing nothing, when they do
    /// not fit (every PE decides alike from the same halos; build a new exchange then). Signals
    /// and step counters continue: unlike [`Self::reset_protocol`] nothing is zeroed, so every PE
    /// must replan at the same step (or all reset). Each pair keeps the path of the plan the
    /// exchange was built with, laid over the new pulses (a driver whose router now plans other
    /// transports builds a new exchange). Collective, fenced like the reset's first half: a
    /// bounded wait until this PE's stream is idle, then a barrier, so no PE changes its layout
    /// while a peer may still run a step of the old one; after it, peers may write into this PE's
    /// new halo region at once, so this PE must not read its old layout any more (upload the home
    /// values for the new one). Refused on an exchange that failed until it is reset.
    pub fn replan(&mut self, halos: Vec<RankHalo>) -> Result<bool> {
        self.replan_fenced(halos, ReplanFence::Barrier)
    }

    /// Whether [`Self::replan`] would move the exchange to `halos` in its buffers (`false`: it
    /// would return `Ok(false)`, a new exchange is needed): decided from every PE's capacity (the
    /// caller's buffers may differ per PE and hold less than the shared sizes), so every PE
    /// decides alike. A halo list of another length than the PEs' does not fit.
    pub fn fits(&self, halos: &[RankHalo]) -> bool {
        super::rank::halos_fit(&self.rank.sizes(), &self.capacities, halos)
    }

    /// [`Self::replan`] fenced as `fence` says. [`ReplanFence::Barrier`] is [`Self::replan`].
    /// [`ReplanFence::AfterCollective`] (the caller meets its contract, on every PE at this
    /// replan) keeps the bounded wait for this PE's stream and leaves the barrier out when
    /// [`Self::every_pe_maps_every_pe`]; otherwise the barrier stays, to complete what a remote
    /// transport may still carry ([`replan_needs_barrier`]). Either way every PE decides alike.
    /// After the fence (the barrier; for a collective fence, once a peer has left the collective
    /// and replanned) peers may write into this PE's new halo region, so this PE must not read
    /// its old layout after it entered the collective.
    pub fn replan_fenced(&mut self, halos: Vec<RankHalo>, fence: ReplanFence) -> Result<bool> {
        validate(&halos)?;
        // Every PE decides alike, before any of them waits or fences.
        if !self.fits(&halos) {
            return Ok(false);
        }
        if let Some(why) = &self.failed {
            return Err(HaloError::InvalidInput(format!(
                "rank {}: cannot replan an exchange that failed ({why}): reset its protocol on every PE first, or build a new one",
                self.rank.rank()
            )));
        }
        let _span = tracing::debug_span!("search.replan").entered();
        self.wait_idle("waiting for the halo stream before a replan")?;
        if replan_needs_barrier(fence, self.every_pe_maps_every_pe()) {
            self.nvshmem.barrier_all()?;
            self.replan_barriers += 1;
        }
        let me = self.nvshmem.my_pe();
        // The new maps and metadata are enqueued on the exchange stream, idle since the wait above:
        // this PE's next launches (there, after the copies) are the first to read them, and no
        // peer reads them (peers reach only `x`, the signals and the receive slots). What peers
        // may write from here on, this PE's new halo region, no copy of the replan touches.
        tracing::debug_span!("search.replan.set_halo").in_scope(|| self.rank.set_halo(halos[me].clone(), &self.stream))?;
        // The host-driven transports: their IPC events and mailbox serve the same pulses and
        // neighbours (kept, the step counters going on), or are set up again for the new ones
        // (collective; every PE decides alike from the same halos).
        if super::pe_links::same_links(&self.halos, &halos) {
            self.host.replan(&halos);
        } else {
            self.links = Err("setting the links up again for a replan failed".into()); // the old ones go first
            self.links = PeLinks::setup(&self.nvshmem, &self.rank, &halos)?;
            self.host = HostDriven::new(&halos);
        }
        self.halos = halos;
        tracing::debug_span!("search.replan.install").in_scope(|| self.install())?;
        Ok(true)
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

    /// Enqueues on `stream` from now on (the caller's: see [`super::Exchange::use_streams`]); the
    /// first work there runs after everything already enqueued on the old stream.
    pub fn use_stream(&mut self, stream: Arc<CudaStream>) -> Result<()> {
        super::rank::switch_stream(self.rank.rank(), self.rank.context().ordinal(), &self.stream, &stream)?;
        self.stream = stream;
        Ok(())
    }

    /// Every rank's halo.
    pub fn halos(&self) -> &[RankHalo] {
        &self.halos
    }

    /// Host synchronisations so far.
    pub fn host_syncs(&self) -> u64 {
        self.host_syncs
    }

    /// Host barriers the replans ran so far (one per [`Self::replan`]; none for a
    /// [`ReplanFence::AfterCollective`] where [`Self::every_pe_maps_every_pe`]).
    pub fn replan_barriers(&self) -> u64 {
        self.replan_barriers
    }

    /// Whether every PE maps every other PE's symmetric memory (`nvshmem_ptr`), so that every
    /// write a step makes into a peer, NVSHMEM puts and credits included, is a store of the
    /// kernel that makes it (NVSHMEM's P2P transport) and has landed once that kernel is done:
    /// none can still be in flight through a remote transport after the PEs' streams went idle.
    /// Taken from the host-driven links' set-up, which succeeds only where every PE mapped every
    /// PE (and all run on one machine), and whose outcome every PE takes from every PE's
    /// verdict: the same answer on every PE (false also where the links failed for another
    /// reason, which only keeps a barrier).
    pub fn every_pe_maps_every_pe(&self) -> bool {
        self.links.is_ok()
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

    /// Runs one direction of a host-driven transport. A failure (a host wait for the stream that
    /// saw no progress, a peer that never posted) marks the exchange failed like a device wait.
    fn host_driven(&mut self, transport: Transport, direction: Direction) -> Result<()> {
        let links =
            self.links.as_mut().map_err(|why| HaloError::InvalidInput(format!("the {} transport cannot run here: {why}", transport.name())))?;
        let ran = self.host.run(transport, direction, std::slice::from_mut(&mut self.rank), std::slice::from_ref(&self.stream), links);
        match ran {
            Ok(syncs) => {
                self.host_syncs += syncs;
                Ok(())
            }
            Err(e) => {
                let why = e.to_string();
                if matches!(e, HaloError::StreamStuck(_)) {
                    crate::nvshmem::abandon_collectives(&why);
                }
                self.failed = Some(why);
                Err(e)
            }
        }
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

    /// Waits for the stream (bounded: [`RankExchange::wait_idle`]) and reports a device wait
    /// timeout as an error.
    pub fn finish(&mut self) -> Result<()> {
        self.wait_idle("waiting for the halo stream")?;
        self.host_syncs += 1;
        let status = self.rank.check_status();
        if let Err(e) = &status {
            self.failed = Some(e.to_string());
        }
        status
    }

    /// The bounded wait for this PE's stream. A stream that is stuck marks the exchange failed
    /// and gives up NVSHMEM's collective teardown at once (no collective can complete with it).
    fn wait_idle(&mut self, what: &str) -> Result<()> {
        let nv = &self.nvshmem;
        let state = || Some(format!("NVSHMEM {:?}, init status {}", nv.version(), nv.init_status()));
        let waited = self.rank.wait_idle(&self.stream, what, self.remote_transport.as_deref(), state);
        if let Err(e) = &waited {
            let why = e.to_string();
            if matches!(e, HaloError::StreamStuck(_)) {
                crate::nvshmem::abandon_collectives(&why);
            }
            self.failed = Some(why);
        }
        waited
    }

    /// Host barrier across PEs (used between checked steps in tests and benchmarks).
    pub fn barrier(&self) -> Result<()> {
        self.nvshmem.barrier_all()
    }

    /// Resets this PE's device-side protocol so the exchange can run again from step 0: the
    /// collective reset of `reset` (bounded wait, barrier, zero, bounded wait, barrier).
    /// Every PE must call it; the exchange's constructor does. After a wait timed out it is
    /// required before the exchange runs again: until then the PE that timed out sends no halo
    /// data a peer would take as a step's, and its launches leave block counters mid-count.
    pub fn reset_protocol(&mut self) -> Result<()> {
        super::reset::run(|step| match step {
            ResetStep::WaitIdle => self.wait_idle("waiting for the halo stream before a protocol reset"),
            ResetStep::Barrier => self.nvshmem.barrier_all(),
            ResetStep::Zero => {
                // Between the barriers no PE runs the exchange: the host-driven transports'
                // counters and this PE's inbox start from step 0 again too.
                self.host.reset();
                if let Ok(links) = &mut self.links {
                    links.reset();
                }
                self.rank.zero_protocol(&self.stream)
            }
        })?;
        self.failed = None;
        Ok(())
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

impl<T: Element> Drop for PeExchange<T> {
    fn drop(&mut self) {
        // Free the symmetric buffers (collectively, after this struct) only when no kernel can
        // still use them and the peers can be expected at the free.
        if self.failed.is_none() {
            let _ = self.wait_idle("waiting for the halo stream before freeing the exchange");
        }
        if let Some(why) = self.failed.as_ref().filter(|_| crate::nvshmem::abandon_after_failure()) {
            crate::nvshmem::abandon_collectives(&format!("rank {}'s exchange was dropped after a failure: {why}", self.rank.rank()));
        }
    }
}

/// How this PE (`nvshmem.my_pe()`, buffers `local`) would reach `peer` by itself under `policy`:
/// its buffers through `nvshmem_ptr` where the policy allows loads and stores, `None` for puts.
/// The two ends of a pair may see it differently; `peer_map` makes them agree.
fn own_view(policy: &PathPolicy, nvshmem: &Nvshmem, local: &PeerView, peer: usize) -> Option<PeerView> {
    let me = nvshmem.my_pe();
    match policy {
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
    let mapped = local.translated(|addr| nvshmem.peer_ptr(addr, peer));
    if let (None, PathPolicy::Planned(paths)) = (&mapped, policy) {
        tracing::warn!(
            "route: PE {me} -> PE {peer}: the router chose {} but NVSHMEM maps no address for the peer; using puts",
            paths.transport(peer).map_or("-", |t| t.name())
        );
    }
    mapped
}

/// Whether a replan fenced as `fence` runs the host barrier across PEs: always for
/// [`ReplanFence::Barrier`]; for [`ReplanFence::AfterCollective`] only when some PE does not map
/// every other (`every_pe_mapped` false), as then a finished step's NVSHMEM operations may still
/// be in flight through a remote transport, and the barrier (NVSHMEM's completes them) is what
/// lands them before any PE replans. Both inputs are the same on every PE, so every PE enters
/// the barrier or none does.
pub fn replan_needs_barrier(fence: ReplanFence, every_pe_mapped: bool) -> bool {
    match fence {
        ReplanFence::Barrier => true,
        ReplanFence::AfterCollective => !every_pe_mapped,
    }
}

/// Blocks per pulse for this PE's spinning kernels, and whether its fused kernels overlap the
/// kernel before them: every spinning block of every PE on the GPU must fit at once
/// (`sms * per_sm` resident blocks) when the PEs' kernels run concurrently, as under MPS, so the
/// capacity is shared by `pes_per_gpu` PEs of `pulses` pulses each, two grids per PE where its
/// launches overlap ([`super::residency::fit`]). Without MPS the PEs of a GPU are time-sliced and
/// one PE's kernels never wait for another's to be resident, but the cap costs little and keeps
/// MPS safe.
pub fn blocks_per_pulse(sms: u32, per_sm: u32, pulses: usize, pes_per_gpu: usize) -> Result<super::residency::ResidentGrids> {
    super::residency::fit(sms * per_sm, 0, pes_per_gpu.max(1) as u32, pulses).ok_or_else(|| {
        HaloError::InvalidInput(format!(
            "{pes_per_gpu} PEs per GPU x {pulses} pulses of spinning blocks cannot all be resident on one GPU \
             ({sms} SMs x {per_sm} blocks): this could deadlock under MPS. Use fewer PEs per GPU or more GPUs"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_pes_per_gpu_share_the_resident_blocks() {
        // Two grids per PE (the running one and its overlapped successor).
        let overlapped = |per_pulse| super::super::residency::ResidentGrids { per_pulse, overlapped: true };
        assert_eq!(blocks_per_pulse(132, 2, 3, 1).unwrap(), overlapped(44));
        assert_eq!(blocks_per_pulse(132, 2, 3, 2).unwrap(), overlapped(22));
        assert_eq!(blocks_per_pulse(132, 2, 1, 4).unwrap(), overlapped(33));
        // Every PE's every pulse keeps at least one block, without overlap where two grids per PE
        // do not fit, or the layout is refused.
        assert_eq!(blocks_per_pulse(132, 1, 6, 11).unwrap(), overlapped(1));
        let alone = blocks_per_pulse(132, 1, 6, 22).unwrap();
        assert_eq!((alone.per_pulse, alone.overlapped), (1, false));
        let e = blocks_per_pulse(132, 1, 6, 23).unwrap_err().to_string();
        assert!(e.contains("23 PEs per GPU x 6 pulses") && e.contains("MPS"), "{e}");
    }

    #[test]
    fn only_a_collective_fence_between_mapped_pes_leaves_the_replan_barrier_out() {
        // The default keeps the barrier whatever the mapping.
        assert!(replan_needs_barrier(ReplanFence::Barrier, true));
        assert!(replan_needs_barrier(ReplanFence::Barrier, false));
        assert_eq!(ReplanFence::default(), ReplanFence::Barrier);
        // A collective the caller vouches for replaces it only where no remote transport can
        // still carry a finished step's writes (a credit put to an unmapped peer).
        assert!(!replan_needs_barrier(ReplanFence::AfterCollective, true));
        assert!(replan_needs_barrier(ReplanFence::AfterCollective, false));
    }

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
