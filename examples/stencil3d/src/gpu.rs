//! The stencil on GPUs, through halo's public exchange API.
//!
//! # Buffers: two exchanges, ping-pong
//!
//! Each rank's field lives in the exchange's own forward buffer `x` (an `f32` array: interior
//! cells, then ghost cells), so the exchange reads the current values with no copy. The result of
//! a step cannot go to the same array (the stencil reads neighbours while others are written), so
//! there are **two** exchanges over the same halos, `A` and `B`, and the steps alternate:
//!
//! ```text
//! step k even:  exchange_forward(A) ; jacobi7(A.x -> B.x interior)   on A's stream of the rank
//! step k odd:   exchange_forward(B) ; jacobi7(B.x -> A.x interior)   on B's stream of the rank
//! ```
//!
//! A rank's two streams are ordered by one event per step (recorded after `jacobi7`, waited on by
//! the other stream before its exchange): no host synchronisation, no copy of the field.
//! The cost is memory: twice the exchange's buffers (two `x`, two `f`, two sets of signals and
//! staging slots), and no device copy per step (the alternative, one exchange plus an async copy
//! of the interior back into `x`, moves `8 n` bytes per step: about as much traffic as the
//! stencil's own writes).
//!
//! Why a peer never overwrites ghost cells that are still being read: rank `A` writes rank `B`'s
//! ghosts of buffer `X` in step `k + 2` only after its exchange of step `k + 1` completed, which
//! needs `B`'s signal of step `k + 1`, which `B` sends only after its `jacobi7` of step `k` (the
//! last reader of `X`'s ghosts) finished in stream order. This needs every neighbour relation to
//! be symmetric (whom I send to, I also receive from), which a face halo is. The staged transport
//! synchronises the host around every pulse anyway.
//!
//! # Verification and timing
//!
//! After `iterations` steps every rank's interior is compared with the undecomposed CPU grid
//! after the same steps ([`crate::reference::run_global`]). Both evaluate each cell with the same
//! binary32 operations in the same order, without fused multiply-adds (the kernel's PTX uses
//! `add.rn.f32`/`mul.rn.f32`, which ptxas must not contract; x86-64 Rust does not contract), and
//! neither flushes subnormals, so the expected result is **bit-exact**; `tolerance` (absolute,
//! default 0) relaxes it. Time per step: CUDA events around `iterations` further steps on every
//! rank's streams, the slowest rank, the median of `repeats` windows.

use crate::decomp::Decomposition;
use crate::reference::{self, InitialField};
use halo::abi::{self, BLOCK_SIZE};
use halo::exchange::pe::{PathPolicy, PeExchange};
use halo::exchange::{LocalRanks, Transport};
use halo::gpu::{CudaEvent, CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape};
use halo::kernels::MAX_GATHER_BLOCKS;
use halo::{HaloError, Result};
use std::sync::Arc;

/// What to run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Global cells along x, y, z.
    pub grid: [usize; 3],
    /// Ranks along x, y, z.
    pub ranks: [usize; 3],
    /// Steps before the check, and steps per timing window.
    pub iterations: usize,
    /// Diffusion number (stable for `alpha <= 1/6`).
    pub alpha: f32,
    /// The initial field.
    pub init: InitialField,
    /// Timing windows per transport (0: verify only).
    pub repeats: usize,
    /// Largest accepted absolute difference from the CPU (0: bit-exact).
    pub tolerance: f32,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self { grid: [64, 64, 64], ranks: [2, 2, 2], iterations: 100, alpha: 0.1, init: InitialField::Random(1), repeats: 5, tolerance: 0.0 }
    }
}

/// One transport's result on the ranks this process drives.
#[derive(Clone, Debug)]
pub struct TransportReport {
    /// The transport.
    pub transport: Transport,
    /// Per rank driven here: (global rank, largest absolute difference from the CPU, cells that
    /// differ in any bit).
    pub errors: Vec<(usize, f32, usize)>,
    /// Milliseconds per step of each timing window (slowest rank of this process).
    pub ms_per_step: Vec<f64>,
}

impl TransportReport {
    /// The median of [`Self::ms_per_step`], if any window was timed.
    pub fn median_ms(&self) -> Option<f64> {
        let mut v = self.ms_per_step.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    }

    /// The largest absolute difference over the ranks driven here.
    pub fn max_abs_err(&self) -> f32 {
        self.errors.iter().map(|e| e.1).fold(0.0, f32::max)
    }

    /// Whether every checked cell matched bit for bit.
    pub fn bit_exact(&self) -> bool {
        self.errors.iter().all(|e| e.2 == 0)
    }
}

/// Two exchanges over the same halos (see the module docs), in one process or one PE.
trait PairedExchange {
    /// Ranks this process drives.
    fn local_ranks(&self) -> Vec<usize>;
    /// The module rank `r` runs on.
    fn module(&self, r: usize) -> &Arc<KernelModule>;
    /// Rank `r`'s stream of exchange `e`.
    fn stream(&self, e: usize, r: usize) -> &Arc<CudaStream>;
    /// Rank `r`'s field array of exchange `e`.
    fn field(&self, e: usize, r: usize) -> &dyn DeviceMemory<f32>;
    /// Enqueues (GPU-initiated) or runs (staged) exchange `e`'s forward halo.
    fn exchange_forward(&mut self, e: usize, transport: Transport) -> Result<()>;
    /// Waits for both exchanges and reports a device wait timeout.
    fn finish(&mut self) -> Result<()>;
    /// A host barrier over the processes (a no-op in one process).
    fn barrier(&self) -> Result<()>;
}

struct Local {
    ex: [LocalRanks<f32>; 2],
    modules: Vec<Arc<KernelModule>>,
}

impl PairedExchange for Local {
    fn local_ranks(&self) -> Vec<usize> {
        (0..self.ex[0].ranks().len()).collect()
    }
    fn module(&self, r: usize) -> &Arc<KernelModule> {
        &self.modules[r % self.modules.len()]
    }
    fn stream(&self, e: usize, r: usize) -> &Arc<CudaStream> {
        self.ex[e].stream(r)
    }
    fn field(&self, e: usize, r: usize) -> &dyn DeviceMemory<f32> {
        &self.ex[e].ranks()[r].x
    }
    fn exchange_forward(&mut self, e: usize, transport: Transport) -> Result<()> {
        self.ex[e].exchange_forward(transport)
    }
    fn finish(&mut self) -> Result<()> {
        self.ex[0].finish()?;
        self.ex[1].finish()
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}

struct Pe {
    ex: [PeExchange<f32>; 2],
    module: Arc<KernelModule>,
    me: usize,
}

impl PairedExchange for Pe {
    fn local_ranks(&self) -> Vec<usize> {
        vec![self.me]
    }
    fn module(&self, _: usize) -> &Arc<KernelModule> {
        &self.module
    }
    fn stream(&self, e: usize, _: usize) -> &Arc<CudaStream> {
        self.ex[e].stream()
    }
    fn field(&self, e: usize, _: usize) -> &dyn DeviceMemory<f32> {
        &self.ex[e].rank().x
    }
    fn exchange_forward(&mut self, e: usize, transport: Transport) -> Result<()> {
        self.ex[e].exchange_forward(transport)
    }
    fn finish(&mut self) -> Result<()> {
        self.ex[0].finish()?;
        self.ex[1].finish()
    }
    fn barrier(&self) -> Result<()> {
        self.ex[0].barrier()
    }
}

/// Per rank driven here: its neighbour table on the GPU and the events ordering its two streams.
struct RankState {
    rank: usize,
    interior: u32,
    neighbours: DeviceBuffer<[u32; 6]>,
    /// `done[e]`: this rank's `jacobi7` of the last step that ran on exchange `e`'s stream.
    done: [CudaEvent; 2],
    start: CudaEvent,
    end: CudaEvent,
}

/// The iteration loop over any [`PairedExchange`].
struct Stencil<'a, E: PairedExchange> {
    ex: E,
    decomp: &'a Decomposition,
    ranks: Vec<RankState>,
    alpha: f32,
    step: usize,
}

impl<'a, E: PairedExchange> Stencil<'a, E> {
    fn new(ex: E, decomp: &'a Decomposition, alpha: f32) -> Result<Self> {
        let mut ranks = Vec::new();
        for r in ex.local_ranks() {
            let ctx = ex.module(r).context().clone();
            let ev = |timing: bool| {
                let flags = timing.then_some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
                ctx.new_event(flags).map_err(|source| HaloError::Cuda { what: "creating an event".into(), source })
            };
            ranks.push(RankState {
                rank: r,
                interior: decomp.blocks[r].cells() as u32,
                neighbours: DeviceBuffer::from_host(&ctx, &decomp.neighbours[r])?,
                done: [ev(false)?, ev(false)?],
                start: ev(true)?,
                end: ev(true)?,
            });
        }
        Ok(Self { ex, decomp, ranks, alpha, step: 0 })
    }

    /// Uploads every driven rank's interior of `u0` into the buffer step 0 reads.
    fn upload(&mut self, u0: &[f32]) -> Result<()> {
        let parts = self.decomp.scatter(u0);
        for s in &self.ranks {
            self.ex.field(0, s.rank).copy_from_host(&parts[s.rank])?;
        }
        self.step = 0;
        Ok(())
    }

    /// Enqueues one step on every driven rank (staged: runs the host-driven exchange first).
    fn step(&mut self, transport: Transport) -> Result<()> {
        let (e, o) = (self.step % 2, (self.step + 1) % 2);
        if self.step > 0 {
            for s in &self.ranks {
                let stream = self.ex.stream(e, s.rank);
                stream.wait(&s.done[o]).map_err(|source| HaloError::Cuda { what: "ordering the two exchange streams".into(), source })?;
            }
        }
        self.ex.exchange_forward(e, transport)?;
        for s in &self.ranks {
            let stream = self.ex.stream(e, s.rank);
            let (mut u_in, mut u_out, mut nb, mut n, mut alpha) =
                (self.ex.field(e, s.rank).device_ptr(), self.ex.field(o, s.rank).device_ptr(), s.neighbours.device_ptr(), s.interior, self.alpha);
            let mut args = halo::kernel_args![u_in, u_out, nb, n, alpha];
            let shape = LaunchShape::for_items(s.interior as usize, MAX_GATHER_BLOCKS);
            let module = self.ex.module(s.rank);
            // Ranks may sit on different GPUs: launch in this rank's context.
            module.context().bind_to_thread().map_err(|source| HaloError::Cuda { what: "binding the context".into(), source })?;
            debug_assert_eq!(shape.block, BLOCK_SIZE);
            // SAFETY: the arguments match `jacobi7(u_in: *const f32, u_out: *mut f32,
            // neighbours: *const [u32; 6], n: u32, alpha: f32)`. Every neighbour index is below the
            // rank's `total_atoms` (built by `Decomposition`, whose halos passed
            // `spec::validate`), and both field arrays hold at least that many values (the
            // exchange sizes `x` by the largest `total_atoms`). `u_out` is the other exchange's
            // array, so it aliases nothing `u_in` provides. The buffers outlive the launch: they
            // are dropped after `finish` synchronised the streams (on an error path, `cuMemFree`
            // waits for the device before releasing memory).
            unsafe { module.launch(abi::JACOBI7, shape, stream, &mut args)? };
            s.done[e].record(stream).map_err(|source| HaloError::Cuda { what: "recording an event".into(), source })?;
        }
        self.step += 1;
        Ok(())
    }

    /// Each driven rank's interior after the steps so far (synchronises).
    fn interiors(&mut self) -> Result<Vec<(usize, Vec<f32>)>> {
        self.ex.finish()?;
        let e = self.step % 2;
        self.ranks.iter().map(|s| Ok((s.rank, self.ex.field(e, s.rank).to_host()?[..s.interior as usize].to_vec()))).collect()
    }

    /// Milliseconds per step over `steps` steps: the slowest driven rank's events.
    fn timed_window(&mut self, transport: Transport, steps: usize) -> Result<f64> {
        self.ex.finish()?;
        self.ex.barrier()?;
        fn cuda(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> HaloError {
            move |source| HaloError::Cuda { what: what.to_string(), source }
        }
        let first = self.step % 2;
        for s in &self.ranks {
            s.start.record(self.ex.stream(first, s.rank)).map_err(cuda("recording a timing event"))?;
        }
        for _ in 0..steps {
            self.step(transport)?;
        }
        let last = (self.step + 1) % 2; // the stream of the last step
        for s in &self.ranks {
            s.end.record(self.ex.stream(last, s.rank)).map_err(cuda("recording a timing event"))?;
        }
        let mut worst = 0.0f64;
        for s in &self.ranks {
            // The start event of a rank sits on one of its streams, the end on the other; the end
            // transitively follows the start through the per-step events.
            worst = worst.max(s.start.elapsed_ms(&s.end).map_err(cuda("reading a timing event"))? as f64);
        }
        self.ex.finish()?;
        Ok(worst / steps.max(1) as f64)
    }
}

/// Verifies and times one transport on any paired exchange.
fn run_transport<E: PairedExchange>(
    ex: E,
    decomp: &Decomposition,
    cfg: &RunConfig,
    u0: &[f32],
    want: &[Vec<f32>],
    transport: Transport,
) -> Result<TransportReport> {
    let mut st = Stencil::new(ex, decomp, cfg.alpha)?;
    st.upload(u0)?;
    // Every PE's initial field is in place before any exchange writes into a peer.
    st.ex.barrier()?;
    for _ in 0..cfg.iterations {
        st.step(transport)?;
    }
    let mut errors = Vec::new();
    for (r, got) in st.interiors()? {
        let (mut worst, mut differ) = (0.0f32, 0);
        for (a, b) in got.iter().zip(&want[r]) {
            if a.to_bits() != b.to_bits() {
                differ += 1;
                let d = (a - b).abs();
                worst = if d.is_nan() { f32::INFINITY } else { worst.max(d) };
            }
        }
        errors.push((r, worst, differ));
    }
    let report_err = errors.iter().find(|e| e.1 > cfg.tolerance);
    if let Some(&(r, worst, differ)) = report_err {
        return Err(HaloError::InvalidInput(format!(
            "{}: rank {r} differs from the CPU after {} steps in {differ} cells (max abs error {worst:e}, tolerance {:e})",
            transport.name(),
            cfg.iterations,
            cfg.tolerance
        )));
    }
    let mut ms_per_step = Vec::with_capacity(cfg.repeats);
    for _ in 0..cfg.repeats {
        ms_per_step.push(st.timed_window(transport, cfg.iterations.max(1))?);
    }
    st.ex.finish()?;
    Ok(TransportReport { transport, errors, ms_per_step })
}

/// Whether `transport` can run with every rank in one process (the NVSHMEM put path cannot).
pub fn runs_in_one_process(transport: Transport) -> bool {
    !transport.needs_nvshmem()
}

/// The CPU reference of `cfg`, cut into the ranks' interiors, and the initial field.
pub fn cpu_reference(decomp: &Decomposition, cfg: &RunConfig) -> (Vec<f32>, Vec<Vec<f32>>) {
    let u0 = cfg.init.values(cfg.grid);
    let want = reference::run_global(cfg.grid, &u0, cfg.alpha, cfg.iterations);
    (u0.clone(), decomp.scatter(&want))
}

/// Runs every rank in this process, rank `r` on `modules[r % modules.len()]`, once per transport.
///
/// ```no_run
/// use std::sync::Arc;
/// use stencil3d::gpu::{RunConfig, run_local};
/// let ctx = halo::gpu::open_device(0)?;
/// let artifacts = halo::artifacts::KernelArtifacts::locate(halo::artifacts::DEFAULT_ARCH)?;
/// let module = Arc::new(halo::gpu::KernelModule::load(&ctx, &artifacts)?);
/// let cfg = RunConfig { grid: [32, 32, 32], ranks: [2, 2, 2], iterations: 50, ..RunConfig::default() };
/// for report in run_local(&cfg, &[module], &[halo::exchange::Transport::Fused])? {
///     println!("{:?}: bit-exact {}, {:?} ms/step", report.transport, report.bit_exact(), report.median_ms());
/// }
/// # Ok::<(), halo::HaloError>(())
/// ```
pub fn run_local(cfg: &RunConfig, modules: &[Arc<KernelModule>], transports: &[Transport]) -> Result<Vec<TransportReport>> {
    let decomp = Decomposition::new(cfg.grid, cfg.ranks)?;
    let (u0, want) = cpu_reference(&decomp, cfg);
    let mut out = Vec::new();
    for &t in transports {
        if !runs_in_one_process(t) {
            return Err(HaloError::InvalidInput(format!(
                "the {} transport needs NVSHMEM: run one rank per GPU with `halo launch -n N --exe stencil3d -- ...`",
                t.name()
            )));
        }
        let mut ex = [LocalRanks::<f32>::new(decomp.halos.clone(), modules)?, LocalRanks::<f32>::new(decomp.halos.clone(), modules)?];
        if t == transports[0] {
            for r in ex[0].routes() {
                println!("route: {r}");
            }
        }
        // Both exchanges' spinning kernels may be resident at once (one rank a step ahead of its
        // neighbour): halve the blocks per pulse each may use, so the two together still fit.
        for x in &mut ex {
            for r in x.ranks_mut() {
                let (coord, force) = r.grids();
                r.cap_grids((coord.max(force) / 2).max(1));
            }
        }
        out.push(run_transport(Local { ex, modules: modules.to_vec() }, &decomp, cfg, &u0, &want, t)?);
    }
    Ok(out)
}

/// Runs this PE's rank (one process per rank, NVSHMEM), once per transport. Every PE must call
/// it with the same arguments. A transport this PE's peers cannot use (e.g. `fused-tma` without
/// NVLink loads and stores) is skipped on every PE with the reason in the report's place.
pub fn run_pe(
    cfg: &RunConfig,
    session: &halo::session::PeSession,
    transports: &[Transport],
) -> Result<Vec<std::result::Result<TransportReport, String>>> {
    let decomp = Decomposition::new(cfg.grid, cfg.ranks)?;
    let nvshmem = session.nvshmem.clone();
    if decomp.nranks() != nvshmem.n_pes() {
        return Err(HaloError::InvalidInput(format!(
            "the rank grid {:?} has {} ranks but {} processes run",
            cfg.ranks,
            decomp.nranks(),
            nvshmem.n_pes()
        )));
    }
    let (u0, want) = cpu_reference(&decomp, cfg);
    let mut out = Vec::new();
    for &t in transports {
        let new = || PeExchange::<f32>::new(nvshmem.clone(), session.module.clone(), decomp.halos.clone(), PathPolicy::Routed);
        let mut ex = [new()?, new()?];
        if let Some(r) = ex[0].routes() {
            println!("route: {r}");
        }
        for x in &mut ex {
            let (coord, force) = x.rank().grids();
            x.rank_mut().cap_grids((coord.max(force) / 2).max(1));
        }
        if let Err(e) = ex[0].check_transport(t) {
            out.push(Err(format!("{}: skipped: {e}", t.name())));
            continue;
        }
        let me = nvshmem.my_pe();
        out.push(Ok(run_transport(Pe { ex, module: session.module.clone(), me }, &decomp, cfg, &u0, &want, t)?));
    }
    Ok(out)
}
