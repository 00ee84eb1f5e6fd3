//! One rank's side of the exchange: its device buffers, its per-pulse metadata, and the launches
//! of every transport. The same code runs whether the peers live in this process (plain device
//! pointers) or in other processes (NVSHMEM symmetric memory and `nvshmem_ptr`).
//!
//! Launch arguments hold only pointers and sizes: the step counters that signals carry live in
//! the rank's [`ProtocolState`] on the GPU and advance inside each launch, so one captured step
//! replays any number of times (docs/protocol.md, "Graphs").

use super::Element;
use super::caller::CallerBuffers;
use super::memory::{Mem, MemoryKind};
use super::spec::RankHalo;
use super::watch::{self, StateWatch, StuckStream, WaitTarget};
use super::{Transport, WaitTimeout};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaContext, CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape, Staging};
use crate::kernel_args;
use kernels_gpu::abi::{
    self, COUNTERS_PER_PULSE, CoordPath, Float3, ProtocolState, PulseMeta, SIGNAL_SLOTS_PER_PULSE, SignalMode, SignalSlot, WaitKind, WaitStatus,
    pulse_flags, signal_index,
};
use std::sync::Arc;
use std::time::Duration;

// The timeline probe (`halo timeline`, its GPU test): feature `diagnostics`.
#[cfg(feature = "diagnostics")]
pub mod timeline;

/// A receive slot holds a pulse as low-latency words: this many times its plain bytes.
pub(crate) const RECV_SLOT_FACTOR: usize = abi::ll::bytes(1);

/// Atoms per pulse slot of the staging buffers are rounded up to this (768 bytes: a multiple of
/// both 12 and 256, so every slot starts 256-byte aligned, like GROMACS's unified buffers).
const SLOT_ATOMS: usize = 64;

/// How this rank reaches one peer: plain device addresses of the peer's arrays, valid in this
/// rank's context (same GPU, peer access, or `nvshmem_ptr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerView {
    /// The peer's coordinate array.
    pub x: u64,
    /// The peer's signal slots (`4 * pulses` of them, [`SignalSlot`] order).
    pub signals: u64,
    /// The peer's force receive slots (forces are pushed there); symmetric, so the same offset as
    /// this rank's own.
    pub recv_buf: u64,
    /// The peer's coordinate receive slots (the fused kernel stores low-latency words there).
    pub x_recv_buf: u64,
}

impl PeerView {
    /// The same buffers as another process sees them: every address through `map` (`nvshmem_ptr`
    /// for one peer), `None` when any of them is not mapped.
    pub fn translated(&self, map: impl Fn(u64) -> Option<u64>) -> Option<PeerView> {
        Some(PeerView { x: map(self.x)?, signals: map(self.signals)?, recv_buf: map(self.recv_buf)?, x_recv_buf: map(self.x_recv_buf)? })
    }
}

/// Which of one rank's pulse's transfers are low-latency words, from whether the rank maps the
/// pulse's `send_rank` and its `recv_rank` (the rule of [`RankExchange::install_deferred`]; the others go by
/// NVSHMEM puts and signals). Coordinates go to `send_rank` and forces come back from it; forces
/// go to `recv_rank` and coordinates come from it. An end decides from its own view only, so the
/// two ends of a pulse agree only where each maps the other (`peer_map`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WordPaths {
    /// Coordinates stored into `send_rank`'s receive slot as words.
    pub sends_x_words: bool,
    /// Coordinates from `recv_rank` polled as words (unless it copies them in bulk).
    pub receives_x_words: bool,
    /// Forces pushed into `recv_rank`'s receive slot as words.
    pub sends_f_words: bool,
    /// Forces from `send_rank` polled as words.
    pub receives_f_words: bool,
}

impl WordPaths {
    /// The paths of a pulse whose `send_rank` this rank maps or not (`maps_send_rank`), and whose
    /// `recv_rank` likewise.
    pub fn of(maps_send_rank: bool, maps_recv_rank: bool) -> Self {
        Self { sends_x_words: maps_send_rank, receives_x_words: maps_recv_rank, sends_f_words: maps_recv_rank, receives_f_words: maps_send_rank }
    }
}

/// `flags` with [`pulse_flags::RECV_X_LL`] set exactly when the pulse's coordinates arrive as
/// low-latency words: `recv_pe` is mapped (`remote_recv_slots`, where this rank pushes its forces;
/// both ends of a pair decide alike) and does not copy the pulse in bulk (`recv_bulk`).
fn with_receive_words(meta: &PulseMeta, recv_bulk: bool) -> u32 {
    let words = meta.remote_recv_slots != 0 && !recv_bulk;
    (meta.flags & !pulse_flags::RECV_X_LL) | if words { pulse_flags::RECV_X_LL } else { 0 }
}

/// Sizes every rank must allocate identically (symmetric allocations are collective and must
/// agree): the maximum over all ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedSizes {
    /// Atoms in `x` and `f`.
    pub atoms: usize,
    /// Pulses.
    pub pulses: usize,
    /// Atoms per pulse slot of the staging buffers.
    pub slot_atoms: usize,
}

impl SharedSizes {
    /// The maxima over `halos`.
    pub fn of(halos: &[RankHalo]) -> Self {
        let atoms = halos.iter().map(|h| h.total_atoms).max().unwrap_or(0).max(1);
        let extent = halos.iter().map(|h| h.max_send().max(h.max_recv())).max().unwrap_or(0);
        Self { atoms, pulses: halos.first().map_or(0, |h| h.pulses.len()), slot_atoms: extent.div_ceil(SLOT_ATOMS).max(1) * SLOT_ATOMS }
    }

    /// The same sizes with `fraction` more atoms and slot space (rounded up), so that later halos
    /// of a changing decomposition (atoms migrate between searches) still fit and the buffers can
    /// be kept ([`super::Exchange::replan`]).
    pub fn with_headroom(self, fraction: f64) -> Self {
        let grow = |n: usize| n + (n as f64 * fraction.max(0.0)).ceil() as usize;
        Self { atoms: grow(self.atoms), pulses: self.pulses, slot_atoms: grow(self.slot_atoms).div_ceil(SLOT_ATOMS) * SLOT_ATOMS }
    }

    /// Whether buffers of these sizes can hold halos of sizes `need` (same pulse count, no more
    /// atoms, no larger slots).
    pub fn holds(&self, need: &SharedSizes) -> bool {
        self.pulses == need.pulses && need.atoms <= self.atoms && need.slot_atoms <= self.slot_atoms
    }
}

/// Whether a replan to `halos` keeps buffers of `sizes` whose `x` and `f` hold `capacities[r]`
/// atoms for rank `r` ([`RankExchange::capacity`]: the caller's buffers may hold less than the
/// shared sizes): the same pulse count, slots and sizes large enough, and every rank's
/// `total_atoms` within its own capacity. Decided alike wherever the same arguments are known.
pub fn halos_fit(sizes: &SharedSizes, capacities: &[usize], halos: &[RankHalo]) -> bool {
    sizes.holds(&SharedSizes::of(halos)) && capacities.len() == halos.len() && halos.iter().zip(capacities).all(|(h, &held)| h.total_atoms <= held)
}

/// The entry name of generic kernel `base` for element type `T` (`fused_coords_f32`, ...).
pub fn entry<T: Element>(base: &str) -> String {
    format!("{base}{}", T::SUFFIX)
}

/// Blocks per pulse of the spinning kernels: what the halo's sizes ask for, capped so that every
/// spinning block of every rank sharing a GPU stays resident (a waiting block must never starve
/// the block it waits for). Every kernel's grid obeys the cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grids {
    coords: u32,
    tma: u32,
    cap: u32,
}

impl Grids {
    /// The uncapped grids for pulses of at most `max_extent` atoms each way (`max_send` sent) of
    /// `elem_bytes`-byte elements.
    pub fn for_halo(max_extent: usize, max_send: usize, elem_bytes: usize) -> Self {
        let per_block = abi::BLOCK_SIZE * abi::ATOMS_PER_THREAD;
        // GROMACS's shape: +1 so a pulse that sends nothing still has a block to wait and signal.
        let coords = (max_extent as u32 + 1).div_ceil(per_block).max(1);
        let tma_per_block = (abi::BLOCK_SIZE / 32) * abi::tma_chunk_atoms(elem_bytes as u32);
        let tma = (max_send as u32 + 4).div_ceil(tma_per_block).max(1);
        Self { coords, tma, cap: u32::MAX }
    }

    /// The same grids with at most `max_blocks_per_pulse` blocks per pulse (and at least one).
    pub fn capped(self, max_blocks_per_pulse: u32) -> Self {
        Self { cap: self.cap.min(max_blocks_per_pulse).max(1), ..self }
    }

    /// Blocks per pulse of the fused coordinate kernel.
    pub fn coords(&self) -> u32 {
        self.coords.min(self.cap)
    }

    /// Blocks per pulse of the force kernel (the same extent as the coordinates).
    pub fn forces(&self) -> u32 {
        self.coords.min(self.cap)
    }

    /// Blocks per pulse of the TMA coordinate kernel.
    pub fn tma(&self) -> u32 {
        self.tma.min(self.cap)
    }

    /// Blocks of one per-pulse kernel sending `send` atoms, with `pulses` pulses per step: these
    /// kernels run one at a time per rank, so a rank may use the whole step's budget.
    pub fn per_pulse(&self, send: usize, pulses: usize) -> u32 {
        (send as u32).div_ceil(abi::BLOCK_SIZE).max(1).min(self.cap.saturating_mul(pulses.max(1) as u32))
    }
}

/// One rank's exchange state on its GPU, for values of type `T` (coordinates and forces by
/// default; any [`Element`] for other fields).
pub struct RankExchange<T: Element = Float3> {
    rank: usize,
    halo: RankHalo,
    module: Arc<KernelModule>,
    /// Coordinates: home atoms, then every received pulse.
    pub x: Mem<T>,
    /// Forces, same layout as `x`.
    pub f: Mem<T>,
    signals: Mem<u64>,
    x_stage: Mem<T>,
    f_stage: Mem<T>,
    recv_buf: Mem<T>,
    x_recv_buf: Mem<T>,
    maps: DeviceBuffer<u32>,
    map_offsets: Vec<usize>,
    meta: DeviceBuffer<PulseMeta>,
    host_meta: Vec<PulseMeta>,
    /// Whether `host_meta` changed since it was last uploaded ([`Self::upload_metadata`]): a launch
    /// refuses to read stale metadata.
    meta_pending: bool,
    /// Page-locked staging of the index maps and the metadata a replan uploads on the exchange
    /// stream, kept between searches.
    map_staging: Staging<u32>,
    meta_staging: Staging<PulseMeta>,
    state: DeviceBuffer<ProtocolState>,
    counters: DeviceBuffer<u32>,
    status: DeviceBuffer<WaitStatus>,
    sizes: SharedSizes,
    timeout_ns: u64,
    grids: Grids,
    /// Whether the fused kernels are launched to overlap the previous kernel of the stream
    /// ([`Self::fit_grids`]; true until a residency cap says two grids per rank do not fit).
    overlapped: bool,
    /// The last launch (transport, forces?), for the message of a stuck wait.
    last_launch: Option<(Transport, bool)>,
    /// Reads the counters beside a stuck stream (made up front: allocating pinned memory later,
    /// while a kernel is stuck, could block).
    watch: StateWatch,
    /// [`Self::residency`], asked of the driver once: it depends on the module and the device
    /// alone, and every replan asks again.
    residency: std::sync::OnceLock<(u32, u32)>,
}

impl<T: Element> RankExchange<T> {
    /// Allocates this rank's buffers (collectively, for symmetric memory: every rank must call
    /// this with the same `sizes`) and uploads its index maps. Signals start at
    /// [`abi::SIGNAL_UNSET`], the protocol state and counters at zero.
    pub fn new(rank: usize, halo: RankHalo, module: Arc<KernelModule>, kind: &MemoryKind, sizes: SharedSizes) -> Result<Self> {
        Self::build(rank, halo, module, kind, sizes, None)
    }

    /// [`Self::new`] on the caller's coordinates and forces (`buffers`, at least the halo's
    /// `total_atoms` long, on the module's GPU): only the protocol state is allocated (from `kind`:
    /// every rank must make the same choice, as symmetric allocation is collective). Across PEs
    /// the caller's buffers must be symmetric too ([`super::PeExchange::with_buffers`] checks).
    pub fn with_buffers(
        rank: usize,
        halo: RankHalo,
        module: Arc<KernelModule>,
        kind: &MemoryKind,
        sizes: SharedSizes,
        buffers: CallerBuffers<T>,
    ) -> Result<Self> {
        buffers.check(rank, halo.total_atoms, module.context().ordinal())?;
        Self::build(rank, halo, module, kind, sizes, Some(buffers))
    }

    fn build(
        rank: usize,
        halo: RankHalo,
        module: Arc<KernelModule>,
        kind: &MemoryKind,
        sizes: SharedSizes,
        caller: Option<CallerBuffers<T>>,
    ) -> Result<Self> {
        let ctx = module.context().clone();
        let n = sizes.pulses.max(1);
        let alloc = |len| Mem::<T>::new(kind, &ctx, len);
        let (x, f) = match caller {
            Some(CallerBuffers { x, f }) => (Mem::Caller(x), Mem::Caller(f)),
            None => (alloc(sizes.atoms)?, alloc(sizes.atoms)?),
        };
        // A pair of slots per pulse (step parity) in every staging and receive buffer; receive
        // slots hold a pulse as low-latency words, twice its bytes.
        let x_stage = alloc(2 * n * sizes.slot_atoms)?;
        let f_stage = alloc(2 * n * sizes.slot_atoms)?;
        let recv_buf = alloc(2 * n * RECV_SLOT_FACTOR * sizes.slot_atoms)?;
        let x_recv_buf = alloc(2 * n * RECV_SLOT_FACTOR * sizes.slot_atoms)?;
        let signals = Mem::<u64>::new(kind, &ctx, SIGNAL_SLOTS_PER_PULSE * n)?;
        signals.fill_bytes(0)?;
        const _: () = assert!(abi::SIGNAL_UNSET == 0);
        let mut flat = Vec::new();
        let mut map_offsets = Vec::with_capacity(n);
        for p in &halo.pulses {
            map_offsets.push(flat.len());
            flat.extend_from_slice(&p.index_map);
        }
        let maps = DeviceBuffer::from_host(&ctx, &flat)?;
        let meta = DeviceBuffer::zeroed(&ctx, n)?;
        let state = DeviceBuffer::zeroed(&ctx, 1)?;
        let counters = DeviceBuffer::zeroed(&ctx, COUNTERS_PER_PULSE * n)?;
        let status = DeviceBuffer::zeroed(&ctx, 1)?;
        let grids = Grids::for_halo(halo.max_send().max(halo.max_recv()), halo.max_send(), size_of::<T>());
        let watch = StateWatch::new(&ctx)?;
        let this = Self {
            rank,
            module,
            x,
            f,
            signals,
            x_stage,
            f_stage,
            recv_buf,
            x_recv_buf,
            maps,
            map_offsets,
            meta,
            host_meta: Vec::new(),
            meta_pending: false,
            map_staging: Staging::new(),
            meta_staging: Staging::new(),
            state,
            counters,
            status,
            sizes,
            timeout_ns: 5_000_000_000,
            grids,
            overlapped: true,
            halo,
            last_launch: None,
            watch,
            residency: std::sync::OnceLock::new(),
        };
        // The zeroing above has landed: `fill_bytes` and `zeroed` wait for it.
        Ok(this)
    }

    /// This rank's index.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// This rank's halo description.
    pub fn halo(&self) -> &RankHalo {
        &self.halo
    }

    /// The context of this rank's GPU.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.module.context()
    }

    /// The kernel module this rank launches from (its GPU's).
    pub fn module(&self) -> &Arc<KernelModule> {
        &self.module
    }

    /// The addresses peers use to reach this rank (valid in this process; other processes
    /// translate them with `nvshmem_ptr`).
    pub fn local_view(&self) -> PeerView {
        PeerView {
            x: self.x.device_ptr(),
            signals: self.signals.device_ptr(),
            recv_buf: self.recv_buf.device_ptr(),
            x_recv_buf: self.x_recv_buf.device_ptr(),
        }
    }

    /// The sizes this rank's buffers were allocated for.
    pub fn sizes(&self) -> SharedSizes {
        self.sizes
    }

    /// Atoms this rank's `x` and `f` hold: [`SharedSizes::atoms`] for the exchange's own buffers,
    /// the shorter of the caller's ([`super::caller`]), which may be less. A replan to a halo of
    /// more `total_atoms` does not fit.
    pub fn capacity(&self) -> usize {
        self.x.len().min(self.f.len())
    }

    /// Replaces this rank's halo with `halo` in the existing buffers (a new decomposition of the
    /// same grid, after atoms migrated): enqueues the upload of the new index maps on `stream`
    /// (through page-locked staging kept between calls; the allocation is reused when it is large
    /// enough) and recomputes the grids under the same residency cap. The metadata is stale until
    /// [`Self::install_deferred`] runs again; signals, step counters and credits are kept, so the protocol
    /// continues where it was (counters stay monotonic). The rank must be idle (`stream` and every
    /// other stream that launched its kernels). `stream` is the one its launches use: they run
    /// after the copy in its order; anything on another stream must be ordered after it by the
    /// caller. Errors when `halo` does not fit the buffers (see [`SharedSizes::holds`]).
    pub fn set_halo(&mut self, halo: RankHalo, stream: &CudaStream) -> Result<()> {
        let need = SharedSizes::of(std::slice::from_ref(&halo));
        let held = self.capacity();
        if halo.total_atoms > held {
            // The caller's buffers may be shorter than the shared sizes (they hold this rank's atoms only).
            return Err(HaloError::InvalidInput(format!(
                "rank {}: a halo of {} atoms does not fit the coordinate and force buffers of {held} atoms; build a new exchange with larger buffers",
                self.rank, halo.total_atoms
            )));
        }
        if !self.sizes.holds(&need) {
            return Err(HaloError::InvalidInput(format!(
                "rank {}: a halo of {} atoms, {} pulses and {}-atom slots does not fit buffers of {} atoms, {} pulses and {}-atom slots",
                self.rank,
                halo.total_atoms,
                halo.pulses.len(),
                need.slot_atoms,
                self.sizes.atoms,
                self.sizes.pulses,
                self.sizes.slot_atoms
            )));
        }
        let mut flat = Vec::with_capacity(halo.pulses.iter().map(|p| p.index_map.len()).sum());
        self.map_offsets.clear();
        for p in &halo.pulses {
            self.map_offsets.push(flat.len());
            flat.extend_from_slice(&p.index_map);
        }
        if self.maps.len() < flat.len() {
            // The old maps are no copy's target any more: the rank is idle (the last upload into
            // them ran on the idle stream).
            self.maps = DeviceBuffer::uninit(self.module.context(), flat.len() + flat.len() / 4)?;
        }
        // The kernels that read the maps (coordinate and force halos, the staged path's pack and
        // unpack) launch on `stream`, after this copy.
        self.map_staging.upload(&flat, &self.maps, stream)?;
        let cap = self.grids.cap;
        self.grids = Grids::for_halo(halo.max_send().max(halo.max_recv()), halo.max_send(), size_of::<T>()).capped(cap);
        self.halo = halo;
        Ok(())
    }

    /// Blocks per pulse of the fused coordinate and force kernels.
    pub fn grids(&self) -> (u32, u32) {
        (self.grids.coords(), self.grids.forces())
    }

    /// Caps the blocks per pulse of every kernel (the kernels are grid-stride, so any count is
    /// correct); used to keep every spinning block of every rank on a GPU co-resident. Safe at any
    /// time between steps: every device counter returns to zero by the end of each launch, so the
    /// next launch may use another grid.
    pub fn cap_grids(&mut self, max_blocks_per_pulse: u32) {
        self.grids = self.grids.capped(max_blocks_per_pulse);
    }

    /// Caps the grids as `fit` says ([`super::residency::fit`] for the ranks sharing this GPU) and
    /// launches the fused kernels to overlap the previous kernel only where `fit` counted two grids
    /// per rank (a parked successor holds blocks a peer's grid may need). Between steps.
    pub fn fit_grids(&mut self, fit: super::residency::ResidentGrids) {
        self.cap_grids(fit.per_pulse);
        self.overlapped = fit.overlapped;
    }

    /// Whether the fused kernels overlap the previous kernel of the stream ([`Self::fit_grids`]).
    pub fn overlapped_launches(&self) -> bool {
        self.overlapped
    }

    /// Launches fused kernel `name`, which waits for the previous kernel first thing: to overlap
    /// that kernel's end where [`Self::fit_grids`] allows it, after it otherwise.
    ///
    /// # Safety
    /// As [`KernelModule::launch`] for `name` and `args`.
    unsafe fn launch_fused(&self, name: &str, shape: LaunchShape, stream: &CudaStream, args: &mut [*mut std::ffi::c_void]) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            if self.overlapped { self.module.launch_overlapping(name, shape, stream, args) } else { self.module.launch(name, shape, stream, args) }
        }
    }

    /// Deadline of every device spin-wait (and of the host-driven transports' host waits).
    pub fn set_wait_timeout(&mut self, timeout: std::time::Duration) {
        self.timeout_ns = timeout.as_nanos().min(u64::MAX as u128) as u64;
    }

    /// The deadline of every device spin-wait.
    pub fn wait_timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns)
    }

    /// How long a host wait on this rank's stream may see no progress before it gives up: the
    /// device deadline plus a margin, or `HALO_HOST_WAIT_TIMEOUT_S` (`host_wait_budget`).
    pub fn host_wait_budget(&self) -> Duration {
        watch::host_wait_budget(self.wait_timeout(), std::env::var(watch::HOST_WAIT_ENV).ok().as_deref())
    }

    /// How this rank's pulses reach their peers, in words (for error messages): NVLink stores,
    /// or NVSHMEM puts through the proxy and `remote_transport` with the signalling mode.
    pub fn path_description(&self, remote_transport: Option<&str>) -> String {
        let n = self.host_meta.len();
        let puts = self.host_meta.iter().filter(|m| m.remote_x == 0 || m.remote_recv_slots == 0).count();
        if puts == 0 {
            return format!("all {n} pulses by direct loads/stores (NVLink or peer access)");
        }
        let mode = match self.host_meta.first().map(|m| SignalMode::from_u32(m.signal_mode)) {
            Some(SignalMode::FencedPut) => "fenced-put",
            _ => "put-signal",
        };
        let transport = match remote_transport.map(str::trim).filter(|t| !t.is_empty()) {
            Some(t) if !t.eq_ignore_ascii_case("none") => format!("NVSHMEM's proxy thread and remote transport `{t}`"),
            _ => "NVSHMEM (peers on this node)".to_string(),
        };
        format!("NVSHMEM puts for {puts} of {n} pulses through {transport} ({mode} signalling)")
    }

    /// Waits, bounded by [`Self::host_wait_budget`] without progress, until `stream` (this rank's
    /// exchange stream) is idle. On expiry: [`HaloError::StreamStuck`] naming this rank, `what`,
    /// the last launch, [`Self::path_description`] and `nvshmem()` (NVSHMEM's state, for a PE); the
    /// exchange is unusable from then on and its GPU memory is leaked, not freed (its GPU context is marked stuck).
    pub fn wait_idle(
        &mut self,
        stream: &CudaStream,
        what: &str,
        remote_transport: Option<&str>,
        nvshmem: impl FnOnce() -> Option<String>,
    ) -> Result<()> {
        self.context().bind_to_thread().during("binding the context")?;
        if crate::gpu::wait::stream_idle(stream)? {
            return Ok(()); // the fast path: one query
        }
        let budget = self.host_wait_budget();
        let path = self.path_description(remote_transport);
        let (rank, last_launch) = (self.rank, self.last_launch.map(|(t, f)| watch::launch_name(t, f)));
        let (state, status) = (self.state.device_ptr(), self.status.device_ptr());
        let target = WaitTarget { state, status, watch: &mut self.watch, budget };
        watch::wait_stream(stream, target, |waited, since_progress, device| StuckStream {
            rank,
            what: what.to_string(),
            waited,
            since_progress,
            last_launch,
            path,
            device,
            nvshmem: nvshmem(),
        })
    }

    /// Enqueues on `stream` the zeroing of this rank's protocol: its signal and credit slots, step
    /// counters, block counters and wait status (every value a peer or a launch may have left), and
    /// its receive slots (the step counters start again, so words of an old step 3 would pass for
    /// the new step 3's).
    /// Part of the collective reset (`reset`); the caller waits for the stream.
    pub fn zero_protocol(&self, stream: &CudaStream) -> Result<()> {
        // The stream's context must be current (ranks in one process may live on several GPUs).
        self.context().bind_to_thread().during("binding the context")?;
        self.signals.fill_bytes_async(0, stream)?;
        self.state.fill_bytes_async(0, stream)?;
        self.counters.fill_bytes_async(0, stream)?;
        self.recv_buf.fill_bytes_async(0, stream)?;
        self.x_recv_buf.fill_bytes_async(0, stream)?;
        self.status.fill_bytes_async(0, stream)
    }

    /// Writes the per-pulse metadata on the host. `peer(r)` gives rank `r`'s addresses when this
    /// rank may reach it with loads and stores, `None` for the NVSHMEM put path. Both ends of a
    /// pulse must decide alike (a direct pair in one direction is direct in the other). `flags`
    /// are this rank's `credits::flags`; `signal_mode` says how put-path pulses signal. The
    /// metadata reaches the GPU with the next [`Self::upload_metadata`] (launches refuse to run
    /// before it), so that one copy carries it with the changes of
    /// [`Self::set_bulk_pulses_deferred`].
    pub fn install_deferred(&mut self, peer: &dyn Fn(usize) -> Option<PeerView>, flags: &[u32], signal_mode: SignalMode) -> Result<()> {
        let size = size_of::<T>() as u64;
        let n = self.halo.pulses.len();
        if flags.len() != n {
            return Err(HaloError::InvalidInput(format!("{} credit flags for {n} pulses", flags.len())));
        }
        let slot_bytes = (self.sizes.slot_atoms * size_of::<T>()) as u64;
        let recv_slot_bytes = RECV_SLOT_FACTOR as u64 * slot_bytes;
        let pair = |base: u64, p: usize| base + 2 * p as u64 * slot_bytes;
        let recv_pair = |base: u64, p: usize| base + 2 * p as u64 * recv_slot_bytes;
        let slot = |kind, p: usize| 8 * signal_index(kind, p as u32, n as u32) as u64;
        let mut metas = Vec::with_capacity(n);
        for (p, spec) in self.halo.pulses.iter().enumerate() {
            let to = peer(spec.send_rank);
            let from = peer(spec.recv_rank);
            // The kernels take words where the peer's address is there: `remote_x_slots` (`to`)
            // for coordinates, `remote_recv_slots` (`from`) for forces and, through
            // `with_receive_words`, for the coordinates polled.
            let words = WordPaths::of(to.is_some(), from.is_some());
            let meta = PulseMeta {
                index_map: self.maps.device_ptr_at(self.map_offsets[p]),
                x_stage: pair(self.x_stage.device_ptr(), p),
                f_stage: pair(self.f_stage.device_ptr(), p),
                recv_slots: recv_pair(self.recv_buf.device_ptr(), p),
                remote_x: to.map_or(0, |v| v.x + spec.peer_atom_offset as u64 * size),
                remote_x_signal: to.map_or(0, |v| v.signals + slot(SignalSlot::CoordData, p)),
                remote_recv_slots: from.map_or(0, |v| recv_pair(v.recv_buf, p)),
                remote_f_signal: from.map_or(0, |v| v.signals + slot(SignalSlot::ForceData, p)),
                remote_x_credit: from.map_or(0, |v| v.signals + slot(SignalSlot::CoordCredit, p)),
                remote_f_credit: to.map_or(0, |v| v.signals + slot(SignalSlot::ForceCredit, p)),
                shift: spec.shift.unwrap_or_default(),
                send_size: spec.index_map.len() as u32,
                recv_size: spec.recv_size as u32,
                atom_offset: spec.atom_offset as u32,
                peer_atom_offset: spec.peer_atom_offset as u32,
                send_pe: spec.send_rank as i32,
                recv_pe: spec.recv_rank as i32,
                use_shift: spec.shift.is_some() as u32,
                slot_bytes: slot_bytes as u32,
                // Forces arrive as words where `send_pe` is mapped (it pushes them; both ends decide
                // alike); coordinates below.
                flags: flags[p] | if words.receives_f_words { pulse_flags::RECV_F_LL } else { 0 },
                signal_mode: signal_mode as u32,
                path: if words.sends_x_words { CoordPath::Store } else { CoordPath::Put } as u32,
                recv_slot_bytes: recv_slot_bytes as u32,
                reserved: 0,
                x_recv_slots: recv_pair(self.x_recv_buf.device_ptr(), p),
                remote_x_slots: to.map_or(0, |v| recv_pair(v.x_recv_buf, p)),
            };
            // Until `set_bulk_pulses` says otherwise, no pulse arrives in bulk.
            let meta = PulseMeta { flags: with_receive_words(&meta, false), ..meta };
            // Forces are copied into slots with 16-byte stores.
            for (what, addr) in [("receive slot", meta.recv_slots), ("staging slot", meta.f_stage), ("peer receive slot", meta.remote_recv_slots)] {
                if addr % 16 != 0 {
                    return Err(HaloError::InvalidInput(format!(
                        "rank {} pulse {p}: the force {what} at {addr:#x} is not 16-byte aligned (slot of {slot_bytes} bytes)",
                        self.rank
                    )));
                }
            }
            metas.push(meta);
        }
        self.host_meta = metas;
        self.meta_pending = true;
        Ok(())
    }

    /// Enqueues on `stream` the upload of the metadata that [`Self::install_deferred`] and
    /// [`Self::set_bulk_pulses_deferred`] wrote, through page-locked staging kept between calls.
    /// `stream` must be the one this rank's launches use (they run after the copy in its order;
    /// the kernels read the metadata at launch), and the rank idle on every other stream. The
    /// staging memory outlives the copy (see [`Staging::upload`]).
    pub fn upload_metadata(&mut self, stream: &CudaStream) -> Result<()> {
        if !self.host_meta.is_empty() {
            self.meta_staging.upload(&self.host_meta, &self.meta, stream)?;
        }
        self.meta_pending = false;
        Ok(())
    }

    /// An error when the metadata changed on the host since its last upload.
    fn check_metadata(&self) -> Result<()> {
        self.watch.usable()?; // a stuck stream never runs another launch
        if self.meta_pending {
            return Err(HaloError::InvalidInput(format!("rank {}: a launch before the new pulse metadata was uploaded", self.rank)));
        }
        Ok(())
    }

    /// Moves the coordinates of the pulses marked in `bulk` (one flag per pulse) with bulk copies
    /// (TMA) inside the fused kernel ([`Transport::Fused`]), the others as
    /// [`Self::install_deferred`] set them (low-latency words to mapped peers, puts elsewhere).
    /// `recv_bulk` says the same of the pulses this rank receives (`recv_bulk[p]`: `recv_pe`
    /// copies pulse `p` to this rank in bulk), so that this rank waits for a signal there instead
    /// of polling words: every rank's flags must mirror its senders' (the router's plans are
    /// symmetric per pair). A pulse can only copy in bulk to a mapped peer: asking for one whose
    /// peer is reached by puts is an error. Call it after `install_deferred`, between steps; on the
    /// host only, uploaded by the next [`Self::upload_metadata`] (the kernels read the metadata at
    /// launch).
    pub fn set_bulk_pulses_deferred(&mut self, bulk: &[bool], recv_bulk: &[bool]) -> Result<()> {
        let n = self.host_meta.len();
        if bulk.len() != n || recv_bulk.len() != n {
            return Err(HaloError::InvalidInput(format!("{} bulk and {} receive-bulk flags for {n} pulses", bulk.len(), recv_bulk.len())));
        }
        for (p, ((meta, &b), &rb)) in self.host_meta.iter_mut().zip(bulk).zip(recv_bulk).enumerate() {
            if b && meta.remote_x == 0 {
                return Err(HaloError::InvalidInput(format!(
                    "rank {} pulse {p}: a bulk copy needs rank {}'s memory mapped, but that peer is reached by puts",
                    self.rank, meta.send_pe
                )));
            }
            meta.path = if b {
                CoordPath::Bulk
            } else if meta.remote_x != 0 {
                CoordPath::Store
            } else {
                CoordPath::Put
            } as u32;
            meta.flags = with_receive_words(meta, rb);
        }
        self.meta_pending = true;
        Ok(())
    }

    /// Which pulses arrive as low-latency words in the fused kernel, as installed.
    pub fn receives_words(&self) -> Vec<bool> {
        self.host_meta.iter().map(|m| m.has(pulse_flags::RECV_X_LL)).collect()
    }

    /// Each pulse's coordinate path in the fused kernel, as installed.
    pub fn coord_paths(&self) -> Vec<CoordPath> {
        self.host_meta.iter().map(|m| CoordPath::from_u32(m.path)).collect()
    }

    /// Whether some pulse moves its coordinates with bulk copies in the fused kernel.
    pub fn any_bulk(&self) -> bool {
        self.host_meta.iter().any(|m| m.bulk())
    }

    /// Whether every pulse's coordinates go by direct stores (a requirement of [`Transport::FusedTma`]
    /// and [`Transport::PerPulseDirect`]).
    pub fn all_direct(&self) -> bool {
        self.host_meta.iter().all(|m| m.remote_x != 0 && m.remote_recv_slots != 0)
    }

    /// Whether any pulse uses the NVSHMEM put path (data or credits).
    pub fn any_put(&self) -> bool {
        self.host_meta.iter().any(|m| m.remote_x == 0 || m.remote_recv_slots == 0 || m.remote_x_credit == 0 || m.remote_f_credit == 0)
    }

    /// Launches the coordinate halo of one step on `stream` with a GPU-initiated `transport`. Every
    /// rank must call it every step (even with nothing to send): peers wait for this step's signal.
    pub fn launch_coordinates(&mut self, transport: Transport, stream: &CudaStream) -> Result<()> {
        let n = self.halo.pulses.len() as u32;
        if n == 0 {
            return Ok(());
        }
        self.check_metadata()?;
        let (mut meta, mut pulses, mut x, mut signals, mut state) =
            (self.meta.device_ptr(), n, self.x.device_ptr(), self.signals.device_ptr(), self.state.device_ptr());
        let (mut counters, mut dep, mut timeout, mut status) =
            (self.counters.device_ptr(), self.halo.home_atoms as u32, self.timeout_ns, self.status.device_ptr());
        self.last_launch = Some((transport, false));
        match transport {
            Transport::Fused | Transport::FusedTma => {
                let tma = transport == Transport::FusedTma;
                let (name, shape) =
                    if tma { (entry::<T>(abi::FUSED_COORDS_TMA), self.tma_shape()) } else { (entry::<T>(abi::FUSED_COORDS), self.coord_shape()) };
                let mut args = kernel_args![meta, pulses, x, signals, state, counters, dep, timeout, status];
                if tma {
                    // SAFETY: arguments match the fused coordinate kernels; the metadata was built by
                    // `install` from a validated plan and live buffers.
                    unsafe { self.module.launch(&name, shape, stream, &mut args) }
                } else {
                    // SAFETY: as above; `fused_coords` waits for the previous kernel first thing.
                    unsafe { self.launch_fused(&name, shape, stream, &mut args) }
                }
            }
            Transport::PerPulse | Transport::PerPulseDirect => {
                for p in 0..n {
                    self.launch_coordinate_pulse(transport, p as usize, stream)?;
                }
                Ok(())
            }
            Transport::Staged | Transport::DirectCopy => {
                Err(HaloError::InvalidInput(format!("the {} transport is host-driven: run it through LocalRanks or PeExchange", transport.name())))
            }
        }
    }

    /// Launches pulse `pulse` of one step's coordinate halo with a per-pulse `transport`
    /// ([`Transport::PerPulse`] or [`Transport::PerPulseDirect`]) on `stream`: the launches of a
    /// step go pulse after pulse, each after the previous one in stream order. Nothing for a pulse
    /// this rank does not have. [`Self::launch_coordinates`] launches every pulse; ranks that share
    /// a process enqueue pulse `p` on every rank before pulse `p + 1` on any
    /// ([`super::LocalRanks::launch_coordinates`]).
    pub fn launch_coordinate_pulse(&mut self, transport: Transport, pulse: usize, stream: &CudaStream) -> Result<()> {
        let name = match transport {
            Transport::PerPulseDirect => entry::<T>(abi::PULSE_PACK_STORE_SIGNAL),
            Transport::PerPulse => entry::<T>(abi::PULSE_PACK_PUT_SIGNAL),
            other => return Err(HaloError::InvalidInput(format!("the {} transport has no per-pulse launches", other.name()))),
        };
        let n = self.halo.pulses.len();
        let Some(spec) = self.halo.pulses.get(pulse) else { return Ok(()) };
        self.check_metadata()?;
        let shape = LaunchShape { grid: (self.grids.per_pulse(spec.index_map.len(), n), 1), block: abi::BLOCK_SIZE, shared_bytes: 0 };
        let (mut meta, mut p, mut pulses, mut x, mut signals, mut state) =
            (self.meta.device_ptr(), pulse as u32, n as u32, self.x.device_ptr(), self.signals.device_ptr(), self.state.device_ptr());
        let (mut counters, mut timeout, mut status) = (self.counters.device_ptr(), self.timeout_ns, self.status.device_ptr());
        self.last_launch = Some((transport, false));
        let mut args = kernel_args![meta, p, pulses, x, signals, state, counters, timeout, status];
        // SAFETY: arguments match the per-pulse kernels (`pulse_exchange`); the metadata was built
        // by `install` from a validated plan and live buffers; `pulse < n`.
        unsafe { self.module.launch(&name, shape, stream, &mut args) }
    }

    /// Launches the force halo of one step (reverse chain, pushed to the owners, accumulated) on
    /// `stream`. Every rank must call it every step.
    pub fn launch_forces(&mut self, stream: &CudaStream) -> Result<()> {
        let n = self.halo.pulses.len() as u32;
        if n == 0 {
            return Ok(());
        }
        self.check_metadata()?;
        let (mut meta, mut pulses, mut f, mut signals, mut state) =
            (self.meta.device_ptr(), n, self.f.device_ptr(), self.signals.device_ptr(), self.state.device_ptr());
        let (mut counters, mut timeout, mut status) = (self.counters.device_ptr(), self.timeout_ns, self.status.device_ptr());
        let mut args = kernel_args![meta, pulses, f, signals, state, counters, timeout, status];
        let shape = LaunchShape { grid: (self.grids.forces(), n), block: abi::BLOCK_SIZE, shared_bytes: 0 };
        // The force kernel is the same for every GPU-initiated transport; keep the coordinate one's name.
        self.last_launch = Some((self.last_launch.map_or(Transport::Fused, |(t, _)| t), true));
        // SAFETY: arguments match `fused_forces`; metadata from `install`; it waits for the
        // previous kernel first thing, so it may overlap that kernel's end.
        unsafe { self.launch_fused(&entry::<T>(abi::FUSED_FORCES), shape, stream, &mut args) }
    }

    /// The fused coordinate kernel's shape: with a bulk pulse in the launch, the TMA kernel's
    /// shared memory and enough blocks for both paths (both are grid-stride, so every pulse is
    /// served by any grid).
    fn coord_shape(&self) -> LaunchShape {
        let pulses = self.halo.pulses.len() as u32;
        if self.any_bulk() {
            let grid = self.grids.coords().max(self.grids.tma());
            return LaunchShape { grid: (grid, pulses), block: abi::BLOCK_SIZE, shared_bytes: abi::TMA_SHARED_BYTES };
        }
        LaunchShape { grid: (self.grids.coords(), pulses), block: abi::BLOCK_SIZE, shared_bytes: 0 }
    }

    fn tma_shape(&self) -> LaunchShape {
        LaunchShape { grid: (self.grids.tma(), self.halo.pulses.len() as u32), block: abi::BLOCK_SIZE, shared_bytes: abi::TMA_SHARED_BYTES }
    }

    /// Reads the wait status after the step's work completed: a timed-out device wait becomes an
    /// error naming the rank, peer, pulse, direction and signal values.
    pub fn check_status(&self) -> Result<()> {
        let s = self.status.to_host()?[0];
        if s.timed_out == 0 {
            return Ok(());
        }
        Err(HaloError::WaitTimeout(WaitTimeout {
            rank: self.rank,
            peer: s.peer,
            pulse: s.pulse,
            kind: WaitKind::from_u32(s.kind),
            step_counter: s.expected,
            seen: s.seen,
            waited_ns: s.waited_ns,
        }))
    }

    /// The rank's protocol state as the GPU holds it (steps completed per direction); reads device
    /// memory, so call it while the rank is idle.
    pub fn protocol_state(&self) -> Result<ProtocolState> {
        Ok(self.state.to_host()?[0])
    }

    /// Host-driven gather of pulse `p` into its send slot (staged path; also the first step of a
    /// host-driven transport of your own, such as the benchmarks' NCCL baseline).
    pub fn stage_pack(&self, p: usize, stream: &CudaStream) -> Result<()> {
        let spec = &self.halo.pulses[p];
        let (mut xp, mut mp, mut n, mut op) =
            (self.x.device_ptr(), self.maps.device_ptr_at(self.map_offsets[p]), spec.index_map.len() as u32, self.send_slot(p));
        let s = spec.shift.unwrap_or_default();
        let (mut sx, mut sy, mut sz, mut use_shift) = (s.x, s.y, s.z, spec.shift.is_some() as u32);
        let mut args = kernel_args![xp, mp, n, op, sx, sy, sz, use_shift];
        // SAFETY: arguments match `pack_coords`; map entries validated against the arrays.
        unsafe {
            self.module.launch(
                &entry::<T>(abi::PACK_COORDS),
                LaunchShape::for_items(n as usize, crate::kernels::MAX_GATHER_BLOCKS),
                stream,
                &mut args,
            )
        }
    }

    /// Host-driven copy of pulse `p`'s send slot into the peer's coordinates (staged path).
    pub(crate) fn stage_copy_to(&self, p: usize, peer: PeerView, stream: &CudaStream) -> Result<()> {
        let spec = &self.halo.pulses[p];
        let bytes = spec.index_map.len() * size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        let dst = peer.x + (spec.peer_atom_offset * size_of::<T>()) as u64;
        // SAFETY: both ranges lie inside live allocations (validated plan); UVA resolves the peer.
        unsafe { cudarc::driver::sys::cuMemcpyAsync(dst, self.send_slot(p), bytes, stream.cu_stream()) }.result().during("staged coordinate copy")
    }

    /// Host-driven copy of this rank's halo forces of pulse `p` into the owner's receive slot.
    pub(crate) fn stage_forces_to(&self, p: usize, owner_recv_slot: u64, stream: &CudaStream) -> Result<()> {
        let spec = &self.halo.pulses[p];
        let bytes = spec.recv_size * size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: as in stage_copy_to.
        unsafe { cudarc::driver::sys::cuMemcpyAsync(owner_recv_slot, self.f.device_ptr_at(spec.atom_offset), bytes, stream.cu_stream()) }
            .result()
            .during("staged force copy")
    }

    /// Address of this rank's (first) receive slot for pulse `p` (the staged force copy's target).
    pub fn recv_slot(&self, p: usize) -> u64 {
        self.recv_slot_at(p, 0)
    }

    /// Address of this rank's receive slot for pulse `p` and step parity `parity` (0 or 1).
    pub fn recv_slot_at(&self, p: usize, parity: usize) -> u64 {
        self.recv_buf.device_ptr() + self.recv_slot_offset(p, parity)
    }

    /// Byte offset of the receive slot of pulse `p`, parity `parity`, from the start of the
    /// receive buffer: the same on every rank (the sizes are shared), so a peer's slot is its
    /// [`PeerView::recv_buf`] plus this. Slots are [`PulseMeta::recv_slot_bytes`] apart, as the
    /// kernels lay them out (room for a pulse as low-latency words).
    pub fn recv_slot_offset(&self, p: usize, parity: usize) -> u64 {
        ((2 * p + (parity & 1)) * RECV_SLOT_FACTOR * self.sizes.slot_atoms * size_of::<T>()) as u64
    }

    /// Address of this rank's (first) send slot for pulse `p` (where `stage_pack` puts the packed pulse).
    pub fn send_slot(&self, p: usize) -> u64 {
        self.x_stage.device_ptr_at(2 * p * self.sizes.slot_atoms)
    }

    /// Host-driven accumulate of pulse `p`'s forces received into its (first) receive slot
    /// (staged path, NCCL).
    pub fn stage_unpack_forces(&self, p: usize, stream: &CudaStream) -> Result<()> {
        self.stage_unpack_forces_at(p, 0, stream)
    }

    /// Host-driven accumulate of pulse `p`'s forces received into its receive slot of parity
    /// `parity` (direct-copy alternates the two slots by step).
    pub fn stage_unpack_forces_at(&self, p: usize, parity: usize, stream: &CudaStream) -> Result<()> {
        let spec = &self.halo.pulses[p];
        let (mut bp, mut mp, mut n, mut dp) =
            (self.recv_slot_at(p, parity), self.maps.device_ptr_at(self.map_offsets[p]), spec.index_map.len() as u32, self.f.device_ptr());
        let mut args = kernel_args![bp, mp, n, dp];
        // Forces are always accumulated (`spec::validate` rejects storing).
        // SAFETY: arguments match `unpack_accumulate`; validated plan.
        unsafe {
            self.module.launch(
                &entry::<T>(abi::UNPACK_ACCUMULATE),
                LaunchShape::for_items(n as usize, crate::kernels::MAX_GATHER_BLOCKS),
                stream,
                &mut args,
            )
        }
    }

    /// Resets the device-side protocol state (signals, step counters, block counters, status) so
    /// the exchange can run again after a failure, and waits (bounded) until the zeroing is done.
    /// Every rank must reset, all of them idle, before any rank launches again: prefer
    /// [`super::Exchange::reset_protocol`], which fences the reset on every rank. Not needed
    /// between steps or graph replays.
    pub fn reset_protocol(&mut self) -> Result<()> {
        // Queued on the legacy default stream, then waited for with a bound: after a failure the
        // GPU may hold work that never ends (behind which a caller's blocking stream would hold
        // the memsets), and the reset must then return an error, not hang.
        self.signals.fill_bytes_queued(0)?;
        self.state.fill_bytes_queued(0)?;
        self.counters.fill_bytes_queued(0)?;
        self.status.fill_bytes_queued(0)?;
        self.wait_default_stream("the protocol reset")
    }

    /// Waits (bounded) for the legacy default stream, where [`DeviceMemory::fill_bytes_queued`]
    /// runs: the exchange's own streams are not ordered after it.
    fn wait_default_stream(&self, what: &str) -> Result<()> {
        self.context().bind_to_thread().during("binding the context")?;
        match crate::gpu::wait::poll_until_done(crate::gpu::wait::legacy_stream_idle, || None, self.host_wait_budget(), None)? {
            crate::gpu::wait::WaitOutcome::Done(_) => Ok(()),
            crate::gpu::wait::WaitOutcome::Expired { waited, .. } => Err(HaloError::InvalidInput(format!(
                "rank {}: {what} did not complete within {:.1} s (the GPU is busy with work that does not end)",
                self.rank,
                waited.as_secs_f64()
            ))),
        }
    }

    /// Test support: fills this rank's signal and credit slots with `value`, as an earlier phase on
    /// reused memory could have left them. Not part of the API.
    #[doc(hidden)]
    pub fn fill_signals_for_tests(&self, value: u64) -> Result<()> {
        self.signals.copy_from_host(&vec![value; self.signals.len()])
    }

    /// Copies `data` into the start of the coordinate array (home atoms), synchronously (set-up
    /// and tests; a search step enqueues it: [`Self::upload_coordinates_async`]).
    pub fn upload_coordinates(&self, data: &[T]) -> Result<()> {
        self.x.copy_from_host(data)
    }

    /// Enqueues on `stream` the copy of `data` into the start of the coordinate array (at most
    /// [`RankHalo::home_atoms`] values) through `staging` (page-locked, kept by the caller between
    /// searches) and returns without waiting. Only home elements are written: peers may already
    /// store into this rank's halo region (after a replan's fence) without conflict. Ordering is the
    /// caller's: the kernels that read home coordinates on another stream (the halo stream's
    /// coordinate halo) must wait for an event recorded on `stream` after this call, or for a
    /// synchronisation; the rank must not be replanned or dropped before `stream` ran the copy.
    pub fn upload_coordinates_async(&self, data: &[T], staging: &mut Staging<T>, stream: &CudaStream) -> Result<()> {
        if data.len() > self.halo.home_atoms {
            return Err(HaloError::InvalidInput(format!(
                "rank {}: {} home coordinates for a layout of {} home atoms",
                self.rank,
                data.len(),
                self.halo.home_atoms
            )));
        }
        staging.upload(data, &self.x, stream)
    }

    /// Number of SMs and the co-resident blocks per SM of the spinning kernels (asked of the
    /// driver at the first call, then kept: six queries a replan saved on a slow host).
    pub fn residency(&self) -> Result<(u32, u32)> {
        if let Some(&r) = self.residency.get() {
            return Ok(r);
        }
        let r = self.query_residency()?;
        Ok(*self.residency.get_or_init(|| r))
    }

    fn query_residency(&self) -> Result<(u32, u32)> {
        let ctx = self.context();
        let sms = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).during("reading SM count")? as u32;
        let per_sm = [abi::FUSED_COORDS, abi::FUSED_FORCES, abi::PULSE_PACK_STORE_SIGNAL]
            .iter()
            .map(|k| self.module.max_blocks_per_sm(&entry::<T>(k), abi::BLOCK_SIZE, 0))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .min()
            .unwrap_or(1);
        // The TMA kernel, and the fused kernel launched with its shared memory (bulk pulses).
        let tma = [abi::FUSED_COORDS_TMA, abi::FUSED_COORDS]
            .iter()
            .map(|k| self.module.max_blocks_per_sm(&entry::<T>(k), abi::BLOCK_SIZE, abi::TMA_SHARED_BYTES))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .min()
            .unwrap_or(1);
        Ok((sms, per_sm.min(tma)))
    }
}

/// A stream of the highest priority the device offers, for the halo: its short, latency-bound
/// kernels should not queue behind the bulk force work on the local stream (GROMACS does the same).
pub fn halo_stream(ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
    ctx.bind_to_thread().during("binding the context")?;
    let (_least, greatest) = cudarc::driver::result::stream::get_priority_range().during("reading stream priorities")?;
    ctx.new_stream_with_priority(greatest).during("creating the halo stream")
}

/// Moves a rank's work from stream `old` to `new` (the caller's, [`super::Exchange::use_streams`]):
/// whatever is enqueued on `new` from now on runs after everything already enqueued on `old` (an
/// event recorded there, waited on by `new`; nothing when they are the same stream). `new` must
/// belong to the rank's GPU (`ordinal`), since its kernels launch there.
pub fn switch_stream(rank: usize, ordinal: usize, old: &CudaStream, new: &CudaStream) -> Result<()> {
    if new.context().ordinal() != ordinal {
        return Err(HaloError::InvalidInput(format!(
            "rank {rank} runs on GPU {ordinal} but the stream given for it belongs to GPU {}; pass a stream of the rank's GPU",
            new.context().ordinal()
        )));
    }
    if old.cu_stream() == new.cu_stream() {
        return Ok(());
    }
    old.context().bind_to_thread().during("binding the context")?;
    let done = old.record_event(None).during("recording the end of the old stream's work")?;
    new.wait(&done).during("ordering the new stream after the old one")
}

/// Makes this context able to access `peer`'s memory (no-op when already enabled or same device).
pub fn enable_peer_access(ctx: &CudaContext, peer: &CudaContext) -> Result<bool> {
    if ctx.ordinal() == peer.ordinal() {
        return Ok(true);
    }
    let mut can = 0;
    // SAFETY: plain queries and a context-scoped enable.
    unsafe {
        cudarc::driver::sys::cuDeviceCanAccessPeer(&mut can, ctx.cu_device(), peer.cu_device()).result().during("querying peer access")?;
        if can == 0 {
            return Ok(false);
        }
        ctx.bind_to_thread().during("binding the context")?;
        match cudarc::driver::sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) {
            cudarc::driver::sys::CUresult::CUDA_SUCCESS | cudarc::driver::sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(true),
            e => Err(HaloError::Cuda { what: "enabling peer access".into(), source: cudarc::driver::DriverError(e) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replan_fits_only_where_every_rank_holds_its_own_atoms() {
        let halos = crate::exchange::synthetic::halos(
            crate::exchange::synthetic::SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: 500, send_fraction: 0.3, box_len: 5.0 },
            3,
        );
        let sizes = SharedSizes::of(&halos).with_headroom(0.2);
        let owned = vec![sizes.atoms; 2];
        assert!(halos_fit(&sizes, &owned, &halos), "the exchange's own buffers hold the halos they were sized for");
        // The caller's buffers: rank 1's holds exactly its atoms, rank 0's one fewer than it needs.
        let exact: Vec<usize> = halos.iter().map(|h| h.total_atoms).collect();
        assert!(halos_fit(&sizes, &exact, &halos));
        let short = vec![halos[0].total_atoms - 1, halos[1].total_atoms];
        assert!(!halos_fit(&sizes, &short, &halos), "rank 0's buffers are one atom short: a replan must not keep them");
        assert!(!halos_fit(&sizes, &owned[..1], &halos), "a capacity per rank");
    }

    #[test]
    fn coordinates_arrive_as_words_only_from_a_mapped_sender_that_does_not_copy_in_bulk() {
        let credits = pulse_flags::WAIT_COORD_CREDIT | pulse_flags::SEND_FORCE_CREDIT | pulse_flags::RECV_F_LL;
        let mapped = PulseMeta { remote_recv_slots: 0x1000, flags: credits, ..PulseMeta::default() };
        assert_eq!(with_receive_words(&mapped, false), credits | pulse_flags::RECV_X_LL);
        let words = PulseMeta { flags: credits | pulse_flags::RECV_X_LL, ..mapped };
        assert_eq!(with_receive_words(&words, true), credits, "a bulk copy arrives behind a signal");
        let unmapped = PulseMeta { remote_recv_slots: 0, ..words };
        assert_eq!(with_receive_words(&unmapped, false), credits, "a put arrives behind a signal");
    }

    #[test]
    fn a_peer_view_is_mapped_whole_or_not_at_all() {
        let local = PeerView { x: 0x100, signals: 0x200, recv_buf: 0x300, x_recv_buf: 0x400 };
        assert_eq!(local.translated(|a| Some(a + 1)), Some(PeerView { x: 0x101, signals: 0x201, recv_buf: 0x301, x_recv_buf: 0x401 }));
        for missing in [0x100, 0x200, 0x300, 0x400] {
            assert_eq!(local.translated(|a| (a != missing).then_some(a)), None, "{missing:#x} unmapped");
        }
    }

    #[test]
    fn low_latency_flags_tell_every_step_from_the_one_that_last_used_its_slot() {
        use abi::ll;
        for epoch in (1u64..10_000).chain([u32::MAX as u64 - 3, u32::MAX as u64 + 7]) {
            let flag = ll::flag(epoch);
            assert_ne!(flag, 0, "step {epoch}: a zeroed slot would pass for it");
            // A slot of a pair is written every other step: e and e - 2 must differ.
            assert_ne!(flag, ll::flag(epoch.wrapping_sub(2)), "step {epoch}");
            for value in [0u32, 1, 0x7FC0_0000, f32::to_bits(-0.0), u32::MAX] {
                let word = ll::word(value, flag);
                assert_eq!(ll::value(word, flag), Some(value));
                assert_eq!(ll::value(word, ll::flag(epoch + 2)), None, "a later step does not take it");
                assert_eq!(ll::value(0, flag), None);
            }
        }
        assert_eq!(RECV_SLOT_FACTOR, 2, "a word carries 4 bytes of value in 8");
    }

    #[test]
    fn no_grid_exceeds_the_residency_cap() {
        // Eight ranks on one GPU with large pulses: the cap is small, the pulses want many blocks.
        for elem in [4, 8, 12, 16] {
            let g = Grids::for_halo(60_000, 60_000, elem).capped(3);
            assert!(g.coords() <= 3 && g.forces() <= 3 && g.tma() <= 3, "{elem}-byte elements: {g:?}");
            assert!(g.per_pulse(60_000, 2) <= 6, "{g:?}");
        }
    }

    #[test]
    fn headroom_grows_atoms_and_slots_and_holds_compares_all_three() {
        let s = SharedSizes { atoms: 1000, pulses: 2, slot_atoms: 128 };
        let h = s.with_headroom(0.25);
        assert_eq!((h.atoms, h.pulses, h.slot_atoms), (1250, 2, 192), "slots stay multiples of {SLOT_ATOMS}");
        assert_eq!(s.with_headroom(0.0), s);
        assert!(h.holds(&s) && h.holds(&h) && !s.holds(&h));
        assert!(!h.holds(&SharedSizes { pulses: 3, ..s }), "another pulse count never fits");
        assert!(!h.holds(&SharedSizes { atoms: 1251, ..s }));
        assert!(!h.holds(&SharedSizes { slot_atoms: 256, ..s }));
    }

    #[test]
    fn grids_follow_the_halo_size_below_the_cap() {
        let g = Grids::for_halo(0, 0, 12);
        assert_eq!((g.coords(), g.forces(), g.tma(), g.per_pulse(0, 1)), (1, 1, 1, 1));
        let g = Grids::for_halo(10_000, 10_000, 12);
        // 512 atoms per block (512 threads x 1 atom); TMA: 16 warps x 128 atoms.
        assert_eq!((g.coords(), g.tma()), (20, 5));
        assert_eq!(g.capped(100), g.capped(100).capped(200), "a higher cap never raises the grid");
        assert_eq!(g.capped(0).coords(), 1, "at least one block");
    }
}
