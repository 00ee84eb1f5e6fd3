//! Several ranks in one process: each rank has its own buffers and stream, peers are plain device
//! pointers (same GPU, or another GPU with peer access), and the kernels are the same as with
//! NVSHMEM. This is how a 2x2x2 decomposition runs on one GPU.
//!
//! The spinning kernels of all ranks on a GPU must be resident at once, or a waiting block can
//! starve the block it waits for: [`LocalRanks::new`] sizes the grids to fit and refuses a
//! configuration that cannot.

use super::caller::CallerBuffers;
use super::host_driven::{Direction, HostDriven, LocalLinks};
use super::memory::MemoryKind;
use super::rank::{PeerView, RankExchange, SharedSizes, enable_peer_access};
use super::reset::ResetStep;
use super::spec::{RankHalo, validate};
use super::{Element, Transport};
use crate::error::{HaloError, Result};
use crate::gpu::{CudaContext, CudaStream, DeviceMemory, KernelModule};
use kernels_gpu::abi::SignalMode;
use std::sync::Arc;

/// All ranks of a decomposition, in this process, exchanging values of type `T`.
pub struct LocalRanks<T: Element = kernels_gpu::abi::Float3> {
    ranks: Vec<RankExchange<T>>,
    streams: Vec<Arc<CudaStream>>,
    host_syncs: u64,
    /// GPUs the ranks are spread over (for the residency cap).
    gpus: usize,
    /// Every rank's plan when a router chose the paths (`plans[r]` is rank `r`'s; kept so that
    /// [`Self::replan`] lays the same paths over the new halos), empty for [`Self::direct`].
    plans: Vec<crate::route::RoutedPaths>,
    routes: Vec<crate::route::RoutedSummary>,
    /// The host-driven transports' step state (staged, direct-copy).
    host: HostDriven,
    /// Their events and peer views (valid across a replan: the buffers and pulse count stay).
    links: LocalLinks,
}

impl<T: Element> LocalRanks<T> {
    /// Builds the ranks' exchanges, rank `r` on GPU `r % modules.len()` (one loaded module per GPU),
    /// with the paths the router chooses ([`crate::route::plan_local_ranks`]'s planning: the GPUs'
    /// facts, each rank's router, both ends of every pair agreeing): pulses whose pair chose
    /// `nvlink-tma` copy in bulk inside the fused kernel, the others store. [`Self::direct`] stores
    /// everywhere without asking the router.
    pub fn new(halos: Vec<RankHalo>, modules: &[Arc<KernelModule>]) -> Result<Self> {
        let sizes = SharedSizes::of(&halos);
        Self::with_sizes(halos, modules, sizes)
    }

    /// [`Self::new`] with buffers of `sizes` (at least [`SharedSizes::of`]`(&halos)`; larger sizes
    /// let [`Self::replan`] keep the buffers when a later decomposition grows).
    pub fn with_sizes(halos: Vec<RankHalo>, modules: &[Arc<KernelModule>], sizes: SharedSizes) -> Result<Self> {
        Self::routed(halos, modules, sizes, None)
    }

    /// [`Self::new`] on the caller's coordinates and forces: `buffers[r]` is rank `r`'s (on rank
    /// `r`'s GPU, `modules[r % modules.len()]`'s, at least its `total_atoms` long; see
    /// [`super::caller`]). Only the protocol state is allocated. The exchange writes the ghosts
    /// into `x` and accumulates received forces into `f` in place; run it on the caller's streams
    /// with [`super::Exchange::use_streams`].
    ///
    /// ```no_run
    /// use halo::exchange::{CallerBuffers, Exchange, LocalRanks, Transport, synthetic};
    /// use halo::gpu::{self, DeviceBuffer, DeviceMemory, KernelModule};
    /// use halo::abi::Float3;
    /// use std::sync::Arc;
    ///
    /// # fn main() -> halo::Result<()> {
    /// let ctx = gpu::open_device(0)?;
    /// let module = Arc::new(KernelModule::load(&ctx, &halo::artifacts::KernelArtifacts::locate("sm_90")?)?);
    /// let halos = synthetic::halos(
    ///     synthetic::SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: 1000, send_fraction: 0.3, box_len: 5.0 },
    ///     1,
    /// );
    /// // The application's own memory (any allocator: cudaMalloc, cudarc, ...).
    /// let mine: Vec<(DeviceBuffer<Float3>, DeviceBuffer<Float3>)> = halos
    ///     .iter()
    ///     .map(|h| Ok((DeviceBuffer::zeroed(&ctx, h.total_atoms)?, DeviceBuffer::zeroed(&ctx, h.total_atoms)?)))
    ///     .collect::<halo::Result<_>>()?;
    /// let buffers = mine
    ///     .iter()
    ///     // SAFETY: `mine` outlives the exchange below.
    ///     .map(|(x, f)| unsafe { CallerBuffers::from_raw(&ctx, x.device_ptr(), f.device_ptr(), x.len()) })
    ///     .collect::<halo::Result<Vec<_>>>()?;
    /// let mut ranks = LocalRanks::<Float3>::with_buffers(halos, &[module], buffers)?;
    /// // The application's streams, one per rank.
    /// let streams = [ctx.new_stream(), ctx.new_stream()].map(|s| s.map_err(|e| halo::HaloError::Cuda { what: "a stream".into(), source: e }));
    /// let [a, b] = streams;
    /// ranks.use_streams(&[a?, b?])?;
    /// ranks.exchange_forward(Transport::Fused)?; // ghosts land in the application's x
    /// ranks.exchange_reverse_accumulate(Transport::Fused)?; // halo forces added into its f
    /// Exchange::finish(&mut ranks)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_buffers(halos: Vec<RankHalo>, modules: &[Arc<KernelModule>], buffers: Vec<CallerBuffers<T>>) -> Result<Self> {
        if buffers.len() != halos.len() {
            return Err(HaloError::InvalidInput(format!(
                "caller buffers for {} ranks, but the decomposition has {} ranks",
                buffers.len(),
                halos.len()
            )));
        }
        let sizes = SharedSizes::of(&halos);
        Self::routed(halos, modules, sizes, Some(buffers))
    }

    /// The router's paths for `halos`, on `buffers` when the caller gives them.
    fn routed(halos: Vec<RankHalo>, modules: &[Arc<KernelModule>], sizes: SharedSizes, buffers: Option<Vec<CallerBuffers<T>>>) -> Result<Self> {
        let placement = super::Placement::Local(modules.to_vec());
        let mut routing = super::routing::Routing::new(&placement, halos.len(), &[])?;
        let plans = routing.plan::<T>(&halos)?.to_vec();
        Self::planned(halos, modules, &plans, sizes, buffers)
    }

    /// [`Self::new`] with every rank's plan given (`plans[r]` is rank `r`'s, from a
    /// [`super::routing::Routing`] that feeds failures back).
    pub fn with_plans(halos: Vec<RankHalo>, modules: &[Arc<KernelModule>], plans: &[crate::route::RoutedPaths]) -> Result<Self> {
        let sizes = SharedSizes::of(&halos);
        Self::with_plans_and_sizes(halos, modules, plans, sizes)
    }

    /// [`Self::with_plans`] with buffers of `sizes` (see [`Self::with_sizes`]).
    pub fn with_plans_and_sizes(
        halos: Vec<RankHalo>,
        modules: &[Arc<KernelModule>],
        plans: &[crate::route::RoutedPaths],
        sizes: SharedSizes,
    ) -> Result<Self> {
        Self::planned(halos, modules, plans, sizes, None)
    }

    fn planned(
        halos: Vec<RankHalo>,
        modules: &[Arc<KernelModule>],
        plans: &[crate::route::RoutedPaths],
        sizes: SharedSizes,
        buffers: Option<Vec<CallerBuffers<T>>>,
    ) -> Result<Self> {
        if plans.len() != halos.len() || plans.iter().enumerate().any(|(r, p)| p.self_pe != r) {
            return Err(HaloError::InvalidInput(format!("{} plans for {} ranks (plan r must be rank r's)", plans.len(), halos.len())));
        }
        if let Some(plan) = plans.iter().find(|p| p.peers.iter().flatten().any(|t| *t == crate::route::Transport::NvshmemPut)) {
            return Err(HaloError::InvalidInput(format!("rank {}: ranks in one process have no NVSHMEM, but the plan puts", plan.self_pe)));
        }
        let mut this = Self::built(halos, modules, sizes, buffers)?;
        this.plans = plans.to_vec();
        this.apply_plans()?;
        this.routes = plans.iter().map(|p| p.summary()).collect::<std::result::Result<_, _>>()?;
        Ok(this)
    }

    /// The ranks' exchanges with direct stores to every peer (no router), rank `r` on GPU
    /// `r % modules.len()`.
    pub fn direct(halos: Vec<RankHalo>, modules: &[Arc<KernelModule>]) -> Result<Self> {
        let sizes = SharedSizes::of(&halos);
        Self::direct_with_sizes(halos, modules, sizes)
    }

    /// [`Self::direct`] with buffers of `sizes` (see [`Self::with_sizes`]).
    pub fn direct_with_sizes(halos: Vec<RankHalo>, modules: &[Arc<KernelModule>], sizes: SharedSizes) -> Result<Self> {
        Self::built(halos, modules, sizes, None)
    }

    /// Every rank with direct stores (the router's plans are laid over by the callers), on the
    /// caller's `buffers` when given.
    fn built(halos: Vec<RankHalo>, modules: &[Arc<KernelModule>], sizes: SharedSizes, buffers: Option<Vec<CallerBuffers<T>>>) -> Result<Self> {
        validate(&halos)?;
        if modules.is_empty() {
            return Err(HaloError::InvalidInput("no GPU module to run the ranks on".into()));
        }
        if !sizes.holds(&SharedSizes::of(&halos)) {
            return Err(HaloError::InvalidInput(format!("buffer sizes {sizes:?} cannot hold these halos ({:?})", SharedSizes::of(&halos))));
        }
        for a in modules {
            for b in modules {
                if !enable_peer_access(a.context(), b.context())? {
                    return Err(HaloError::InvalidInput(format!(
                        "GPU {} cannot access GPU {} (no peer access): run one rank per GPU with `halo launch`, or use one GPU",
                        a.context().ordinal(),
                        b.context().ordinal()
                    )));
                }
            }
        }
        // The footprint of `sizes`, headroom included: what the ranks below allocate.
        super::heap::precheck_local::<T>(modules, &halos, sizes, buffers.is_some())?;
        let mut ranks = Vec::with_capacity(halos.len());
        let mut streams = Vec::with_capacity(halos.len());
        let mut buffers = buffers.map(Vec::into_iter);
        for (r, halo) in halos.iter().cloned().enumerate() {
            let module = modules[r % modules.len()].clone();
            let ctx: Arc<CudaContext> = module.context().clone();
            streams.push(super::rank::halo_stream(&ctx)?);
            ranks.push(match buffers.as_mut().and_then(Iterator::next) {
                Some(mine) => RankExchange::with_buffers(r, halo, module, &MemoryKind::Plain, sizes, mine)?,
                None => RankExchange::new(r, halo, module, &MemoryKind::Plain, sizes)?,
            });
        }
        let links = LocalLinks::new(&ranks)?;
        let host = HostDriven::new(&halos);
        let mut this = Self { ranks, streams, host_syncs: 0, gpus: modules.len(), plans: Vec::new(), routes: Vec::new(), host, links };
        this.install(&halos)?;
        // Plain allocations may reuse memory of an earlier exchange: start from zeroed slots.
        this.reset_protocol()?;
        Ok(this)
    }

    /// Writes every rank's metadata for `halos` (the ranks' current halos), lays the routed paths
    /// over them (bulk copies where a pair chose `nvlink-tma`), uploads it (enqueued on each
    /// rank's stream: the rank's launches there are the first to read it) and caps the grids.
    fn install(&mut self, halos: &[RankHalo]) -> Result<()> {
        let views: Vec<PeerView> = self.ranks.iter().map(RankExchange::<T>::local_view).collect();
        let flags = super::credits::flags(halos);
        for (rank, flags) in self.ranks.iter_mut().zip(&flags) {
            // Every peer is reachable by stores here: the put path (and its signal mode) is unused.
            rank.install_deferred(&|peer| Some(views[peer]), flags, SignalMode::PutSignal)?;
        }
        self.plans_deferred()?;
        self.upload_metadata()?;
        self.fit_residency(self.gpus)
    }

    /// Bulk copies for the pulses whose pair chose `nvlink-tma` in the ranks' plans (after
    /// `install`, which sets stores; nothing without plans), uploaded.
    fn apply_plans(&mut self) -> Result<()> {
        self.plans_deferred()?;
        self.upload_metadata()
    }

    /// [`Self::apply_plans`] on the host only.
    fn plans_deferred(&mut self) -> Result<()> {
        if self.plans.is_empty() {
            return Ok(());
        }
        let bulk: Vec<Vec<bool>> = self.ranks.iter().zip(&self.plans).map(|(rank, plan)| plan.bulk_pulses(rank.halo())).collect();
        self.set_bulk_pulses_deferred(&bulk)
    }

    /// Every rank's metadata, enqueued on the rank's stream.
    fn upload_metadata(&mut self) -> Result<()> {
        for (rank, stream) in self.ranks.iter_mut().zip(&self.streams) {
            rank.upload_metadata(stream)?;
        }
        Ok(())
    }

    /// Moves rank `r`'s pulse `p` with bulk copies in the fused kernel where `bulk[r][p]`, the
    /// others with low-latency words (every peer is mapped here), and tells each receiver how its
    /// pulses arrive (pulse `p` of rank `r` comes from its `recv_rank`'s pulse `p`). Between steps;
    /// the metadata is uploaded on the ranks' streams, where their next launches read it.
    pub fn set_bulk_pulses(&mut self, bulk: &[Vec<bool>]) -> Result<()> {
        self.set_bulk_pulses_deferred(bulk)?;
        self.upload_metadata()
    }

    /// [`Self::set_bulk_pulses`] on the host only (the caller uploads).
    fn set_bulk_pulses_deferred(&mut self, bulk: &[Vec<bool>]) -> Result<()> {
        if bulk.len() != self.ranks.len() {
            return Err(HaloError::InvalidInput(format!("bulk flags for {} ranks, but there are {}", bulk.len(), self.ranks.len())));
        }
        for (r, rank) in self.ranks.iter_mut().enumerate() {
            let recv: Vec<bool> =
                rank.halo().pulses.iter().enumerate().map(|(p, spec)| bulk[spec.recv_rank].get(p).copied().unwrap_or(false)).collect();
            rank.set_bulk_pulses_deferred(&bulk[r], &recv)?;
        }
        Ok(())
    }

    /// Whether [`Self::replan`] would move the exchange to `halos` in its buffers (`false`: it
    /// would return `Ok(false)`, a new exchange is needed). The caller's buffers may hold fewer
    /// atoms than the shared sizes: each rank's own capacity counts. A halo list of another length
    /// than the ranks' does not fit.
    pub fn fits(&self, halos: &[RankHalo]) -> bool {
        let capacities: Vec<usize> = self.ranks.iter().map(RankExchange::<T>::capacity).collect();
        self.ranks.first().is_some_and(|r| super::rank::halos_fit(&r.sizes(), &capacities, halos))
    }

    /// Moves every rank to `halos` (a new decomposition on the same rank grid) in the existing
    /// buffers: `Ok(false)`, changing nothing, when they do not fit (build a new exchange then).
    /// Signals and step counters continue, so peers keep agreeing on the protocol, and each pair
    /// keeps the path its plan chose (laid over the new pulses). Every rank must be idle (the
    /// caller synchronised the streams), and the ranks' home values must be uploaded again for the
    /// new layout.
    pub fn replan(&mut self, halos: Vec<RankHalo>) -> Result<bool> {
        validate(&halos)?;
        if !self.fits(&halos) {
            return Ok(false);
        }
        // As the protocol reset's first step: no launch of the old layout may still run (bounded;
        // the caller synchronised already, so this is not counted as another host sync).
        for (rank, stream) in self.ranks.iter_mut().zip(&self.streams) {
            rank.wait_idle(stream, "waiting for a rank's stream before a replan", None, || None)?;
        }
        // Each rank's new maps are enqueued on its stream (idle since the wait above), where its
        // launches run after them.
        for ((rank, halo), stream) in self.ranks.iter_mut().zip(halos.iter().cloned()).zip(&self.streams) {
            rank.set_halo(halo, stream)?;
        }
        self.install(&halos)?;
        // The host-driven transports' waits follow the new pulses; their events and views stay
        // valid (the same buffers and pulse count).
        self.host.replan(&halos);
        Ok(true)
    }

    /// Caps the blocks per pulse so every rank's spinning blocks fit on its GPU together.
    fn fit_residency(&mut self, gpus: usize) -> Result<()> {
        let Some(first) = self.ranks.first() else { return Ok(()) };
        let (sms, per_sm) = first.residency()?;
        let ranks_per_gpu = self.ranks.len().div_ceil(gpus) as u32;
        let pulses = first.halo().pulses.len().max(1);
        // Two grids per rank where the fused launches overlap (see `residency`).
        let Some(fit) = super::residency::fit(sms * per_sm, 0, ranks_per_gpu, pulses) else {
            return Err(HaloError::InvalidInput(format!(
                "{ranks_per_gpu} ranks x {pulses} pulses of spinning blocks cannot all be resident on one GPU \
                 ({sms} SMs x {per_sm} blocks): this could deadlock. Use fewer ranks per GPU or more GPUs"
            )));
        };
        for r in &mut self.ranks {
            r.fit_grids(fit);
        }
        Ok(())
    }

    /// What the router chose for every rank (empty for [`Self::direct`]).
    pub fn routes(&self) -> &[crate::route::RoutedSummary] {
        &self.routes
    }

    /// The ranks.
    pub fn ranks(&self) -> &[RankExchange<T>] {
        &self.ranks
    }

    /// Mutable access to the ranks.
    pub fn ranks_mut(&mut self) -> &mut [RankExchange<T>] {
        &mut self.ranks
    }

    /// Rank `r`'s stream.
    pub fn stream(&self, r: usize) -> &Arc<CudaStream> {
        &self.streams[r]
    }

    /// Every rank's stream, by rank.
    pub fn streams(&self) -> &[Arc<CudaStream>] {
        &self.streams
    }

    /// Rank `r` enqueues on `streams[r]` from now on (the caller's streams: see
    /// [`super::Exchange::use_streams`]). Each rank needs a stream of its own: the GPU-initiated
    /// kernels of one rank spin until their peers' kernels run, which could never start behind
    /// them on a shared stream, so a stream given twice is refused.
    pub fn use_streams(&mut self, streams: &[Arc<CudaStream>]) -> Result<()> {
        if streams.len() != self.ranks.len() {
            return Err(HaloError::InvalidInput(format!(
                "{} streams for {} ranks in this process: pass one per rank",
                streams.len(),
                self.ranks.len()
            )));
        }
        for (i, a) in streams.iter().enumerate() {
            if let Some(j) = streams[..i].iter().position(|b| b.cu_stream() == a.cu_stream()) {
                return Err(HaloError::InvalidInput(format!(
                    "ranks {j} and {i} were given the same stream: each rank needs its own (the GPU-initiated kernels of one rank wait for its peers' kernels, \
                     which could never start behind them on one stream)"
                )));
            }
        }
        for (r, (old, new)) in self.streams.iter().zip(streams).enumerate() {
            super::rank::switch_stream(r, self.ranks[r].context().ordinal(), old, new)?;
        }
        self.streams = streams.to_vec();
        Ok(())
    }

    /// Whether `transport` runs with ranks in one process: every transport but the NVSHMEM put
    /// path.
    pub fn check_transport(&self, transport: Transport) -> Result<()> {
        if transport.needs_nvshmem() {
            return Err(HaloError::InvalidInput(format!(
                "the {} transport needs NVSHMEM (one process per GPU under `halo launch`); in one process use per-pulse-direct",
                transport.name()
            )));
        }
        Ok(())
    }

    /// Resets every rank's device-side protocol so the exchange can run again from step 0: the
    /// reset of `reset`, each step applied to every rank before the next (every stream
    /// idle, then every rank's slots zeroed on its stream, then every stream idle again). After a
    /// wait timed out it is required before the exchange runs again: until then the rank that timed
    /// out sends no halo data a peer would take as a step's, and its launches leave block counters
    /// mid-count.
    pub fn reset_protocol(&mut self) -> Result<()> {
        let (ranks, streams) = (&mut self.ranks, &self.streams);
        super::reset::run(|step| {
            for (rank, stream) in ranks.iter_mut().zip(streams) {
                match step {
                    ResetStep::WaitIdle => rank.wait_idle(stream, "waiting for a rank's stream around a protocol reset", None, || None)?,
                    ResetStep::Barrier => {} // one thread drives every rank
                    ResetStep::Zero => rank.zero_protocol(stream)?,
                }
            }
            Ok(())
        })?;
        // The host-driven transports start from step 0 again too.
        self.host.reset();
        Ok(())
    }

    /// Host synchronisations performed so far: every wait of the host for one rank's stream
    /// inside the staged transport counts once, and every [`Self::finish`] once (zero inside the
    /// steps of every other transport).
    pub fn host_syncs(&self) -> u64 {
        self.host_syncs
    }

    /// Runs one direction of a host-driven transport on every rank.
    fn host_driven(&mut self, transport: Transport, direction: Direction) -> Result<()> {
        self.host_syncs += self.host.run(transport, direction, &mut self.ranks, &self.streams, &mut self.links)?;
        Ok(())
    }

    /// Launches one step's coordinate halo on every rank without waiting (GPU-initiated and
    /// direct-copy transports; staged: runs it).
    pub fn launch_coordinates(&mut self, transport: Transport) -> Result<()> {
        self.check_transport(transport)?;
        if transport.host_driven() {
            return self.host_driven(transport, Direction::Forward);
        }
        self.host.note(Direction::Forward);
        if matches!(transport, Transport::PerPulse | Transport::PerPulseDirect) {
            // Pulse-major: pulse `p` on every rank before pulse `p + 1` on any. A pulse's launch
            // waits in its stream for the rank's previous pulse, whose kernel waits for its peer's
            // launch of the same pulse; enqueued rank after rank, rank 0's pulse 1 would come
            // before rank 1's pulse 0, and where the driver serves both streams from one hardware
            // queue (more streams than queues), that queue would hold rank 1's pulse 0 behind a
            // launch that cannot start before it: a cycle only the device deadline breaks. In this
            // order every launch that waits, in a stream or in a kernel, waits only for launches
            // enqueued before it.
            let pulses = self.ranks.iter().map(|r| r.halo().pulses.len()).max().unwrap_or(0);
            for p in 0..pulses {
                for (r, rank) in self.ranks.iter_mut().enumerate() {
                    rank.launch_coordinate_pulse(transport, p, &self.streams[r])?;
                }
            }
            return Ok(());
        }
        for (r, rank) in self.ranks.iter_mut().enumerate() {
            rank.launch_coordinates(transport, &self.streams[r])?;
        }
        Ok(())
    }

    /// Launches one step's force halo on every rank without waiting (staged: runs it).
    pub fn launch_forces(&mut self, transport: Transport) -> Result<()> {
        if transport.host_driven() {
            return self.host_driven(transport, Direction::Reverse);
        }
        self.host.note(Direction::Reverse);
        for (r, rank) in self.ranks.iter_mut().enumerate() {
            rank.launch_forces(&self.streams[r])?;
        }
        Ok(())
    }

    /// Waits for every rank's stream and turns a device wait timeout into an error.
    pub fn finish(&mut self) -> Result<()> {
        self.sync_all()?;
        for r in &self.ranks {
            r.check_status()?;
        }
        Ok(())
    }

    /// Waits for every rank's stream, each bounded ([`RankExchange::wait_idle`]).
    fn sync_all(&mut self) -> Result<()> {
        for (rank, stream) in self.ranks.iter_mut().zip(&self.streams) {
            rank.wait_idle(stream, "waiting for a rank's stream", None, || None)?;
        }
        self.host_syncs += 1;
        Ok(())
    }

    /// Forward exchange (gather chain: coordinates, ghost cells) of one step on every rank,
    /// without waiting; the same as [`Self::launch_coordinates`].
    pub fn exchange_forward(&mut self, transport: Transport) -> Result<()> {
        self.launch_coordinates(transport)
    }

    /// Reverse exchange with accumulation (scatter chain: forces) of one step on every rank,
    /// without waiting; the same as [`Self::launch_forces`].
    pub fn exchange_reverse_accumulate(&mut self, transport: Transport) -> Result<()> {
        self.launch_forces(transport)
    }

    /// Reads back every rank's first `total_atoms` coordinates.
    pub fn coordinates(&self) -> Result<Vec<Vec<T>>> {
        self.ranks.iter().map(|r| Ok(r.x.to_host()?[..r.halo().total_atoms].to_vec())).collect()
    }

    /// Reads back every rank's first `total_atoms` forces.
    pub fn forces(&self) -> Result<Vec<Vec<T>>> {
        self.ranks.iter().map(|r| Ok(r.f.to_host()?[..r.halo().total_atoms].to_vec())).collect()
    }
}

impl<T: Element> Drop for LocalRanks<T> {
    /// Waits for every rank's stream before the buffers its kernels use are freed: launches may
    /// still run there (on the caller's streams, [`Self::use_streams`], also work enqueued after
    /// them), for example when an error left a step without [`Self::finish`]. Each wait is bounded
    /// as `finish`'s; a stream found stuck marks its GPU context, whose memory is then leaked
    /// rather than freed under a kernel, so a rank whose context is stuck (an exchange found stuck,
    /// or a rank before it on the same GPU) does not wait.
    fn drop(&mut self) {
        for (rank, stream) in self.ranks.iter_mut().zip(&self.streams) {
            if !crate::gpu::stuck::context_stuck(rank.context()) {
                let _ = rank.wait_idle(stream, "waiting for a rank's stream before freeing the exchange", None, || None);
            }
        }
    }
}
