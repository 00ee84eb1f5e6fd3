//! Several ranks in one process: each rank has its own buffers and stream, peers are plain device
//! pointers (same GPU, or another GPU with peer access), and the kernels are the same as with
//! NVSHMEM. This is how a 2x2x2 decomposition runs on one GPU.
//!
//! The spinning kernels of all ranks on a GPU must be resident at once, or a waiting block can
//! starve the block it waits for: [`LocalRanks::new`] sizes the grids to fit and refuses a
//! configuration that cannot.

use super::host_driven::{Direction, HostDriven, LocalLinks};
use super::memory::MemoryKind;
use super::rank::{PeerView, RankExchange, SharedSizes, enable_peer_access};
use super::spec::{RankHalo, validate};
use super::{Element, Transport};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaContext, CudaStream, DeviceMemory, KernelModule};
use kernels_gpu::abi::SignalMode;
use std::sync::Arc;

/// All ranks of a decomposition, in this process, exchanging values of type `T`.
pub struct LocalRanks<T: Element = kernels_gpu::abi::Float3> {
    ranks: Vec<RankExchange<T>>,
    streams: Vec<Arc<CudaStream>>,
    host_syncs: u64,
    host: HostDriven,
    links: LocalLinks,
}

impl<T: Element> LocalRanks<T> {
    /// Builds the ranks' exchanges, rank `r` on GPU `r % modules.len()` (one loaded module per GPU).
    pub fn new(halos: Vec<RankHalo>, modules: &[Arc<KernelModule>]) -> Result<Self> {
        validate(&halos)?;
        if modules.is_empty() {
            return Err(HaloError::InvalidInput("no GPU module to run the ranks on".into()));
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
        let sizes = SharedSizes::of(&halos);
        let mut ranks = Vec::with_capacity(halos.len());
        let mut streams = Vec::with_capacity(halos.len());
        for (r, halo) in halos.iter().cloned().enumerate() {
            let module = modules[r % modules.len()].clone();
            let ctx: Arc<CudaContext> = module.context().clone();
            streams.push(super::rank::halo_stream(&ctx)?);
            ranks.push(RankExchange::new(r, halo, module, &MemoryKind::Plain, sizes)?);
        }
        let views: Vec<PeerView> = ranks.iter().map(RankExchange::<T>::local_view).collect();
        let flags = super::credits::flags(&halos);
        for (rank, flags) in ranks.iter_mut().zip(&flags) {
            // Every peer is reachable by stores here: the put path (and its signal mode) is unused.
            rank.install(&|peer| Some(views[peer]), flags, SignalMode::PutSignal)?;
        }
        let links = LocalLinks::new(&ranks)?;
        let mut this = Self { ranks, streams, host_syncs: 0, host: HostDriven::new(&halos), links };
        this.fit_residency(modules.len())?;
        Ok(this)
    }

    /// Caps the blocks per pulse so every rank's spinning blocks fit on its GPU together.
    fn fit_residency(&mut self, gpus: usize) -> Result<()> {
        let Some(first) = self.ranks.first() else { return Ok(()) };
        let (sms, per_sm) = first.residency()?;
        let capacity = sms * per_sm;
        let ranks_per_gpu = self.ranks.len().div_ceil(gpus) as u32;
        let pulses = first.halo().pulses.len().max(1) as u32;
        let per_pulse = capacity / (ranks_per_gpu * pulses);
        if per_pulse == 0 {
            return Err(HaloError::InvalidInput(format!(
                "{ranks_per_gpu} ranks x {pulses} pulses of spinning blocks cannot all be resident on one GPU \
                 ({sms} SMs x {per_sm} blocks): this could deadlock. Use fewer ranks per GPU or more GPUs"
            )));
        }
        for r in &mut self.ranks {
            r.cap_grids(per_pulse);
        }
        Ok(())
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

    /// Resets every rank's device-side protocol and waits for it (the resets are memsets outside
    /// the rank streams), so the exchange can run again from step 0.
    pub fn reset_protocol(&mut self) -> Result<()> {
        for r in &mut self.ranks {
            r.reset_protocol()?;
        }
        self.host.reset();
        let mut synced: Vec<usize> = Vec::new();
        for r in &self.ranks {
            let ctx = r.context();
            if !synced.contains(&ctx.ordinal()) {
                ctx.synchronize().during("waiting for the protocol reset")?;
                synced.push(ctx.ordinal());
            }
        }
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
        self.host_syncs += self.host.run(transport, direction, &self.ranks, &self.streams, &mut self.links)?;
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

    fn sync_all(&mut self) -> Result<()> {
        for s in &self.streams {
            s.synchronize().during("waiting for a rank's stream")?;
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
