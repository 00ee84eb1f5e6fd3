//! The measurement loops. One process drives every rank (`LocalRanks`, over the visible GPUs),
//! or each process drives its own rank (`PeExchange` under `halo launch` / mpirun / srun); both
//! go through the library's [`Exchange`](crate::exchange::Exchange) interface, so the variant loop and the timing code are
//! written once (`run_variants`); only the floor probes differ.
//!
//! Per variant and size, each repeat times three loops of `steps` steps: coordinates only, forces
//! only, and the full exchange, each between two events on every rank stream (the slowest rank
//! counts). Host CPU time (of the launching thread) and host syncs (per rank) are counted over
//! the full-exchange loop, excluding the final wait. The timed loops run on random coordinates and
//! forces; before them and after them every variant runs a checked step against the CPU reference
//! ([`super::step`]), and the coordinates the timed steps left are compared with the reference too.
//! A row whose checks all passed carries its times and `checked: true`; a failed row carries the
//! reason and no times, and fails the command. Under a launcher every rank runs the same list (checked at
//! start-up), every skip is decided collectively, and rank 0 gathers the slowest rank's numbers.

use super::floor::{self, EmptyLaunch, FloorReport, Link};
use super::graph::{Phase, PhaseGraphs};
use super::nccl;
use super::pecomm::PeComm;
use super::report::{BenchReport, SizeRoutes, VariantResult};
use super::stats::{Summary, ns_per_day};
use super::step::{self, Checked, Stepper};
use super::{HaloSizes, HaloSource, Method, TIME_STEP_FS, Variant, build_halos};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::exchange::pe::PathPolicy;
use crate::exchange::{Placement, RankHalo};
use crate::gpu::{self, DeviceBuffer, DeviceMemory, KernelModule};
use crate::launch::RankEnv;
use crate::machine::MachineInfo;
use crate::session::PeSession;
use kernels_gpu::abi::WaitStatus;
use std::sync::Arc;
use std::time::Duration;

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// System sizes (atoms).
    pub atoms: Vec<usize>,
    /// Rank grid.
    pub grid: [usize; 3],
    /// Methods to run.
    pub methods: Vec<Method>,
    /// Also run every GPU-initiated method captured as CUDA graphs.
    pub graph: bool,
    /// Timed repeats per variant and size.
    pub repeats: usize,
    /// Untimed warm-up repeats.
    pub warmup: usize,
    /// Steps per timed loop (and per captured graph).
    pub steps: usize,
    /// Where the halos come from.
    pub halos: HaloSource,
    /// Cutoff of the decomposition (nm).
    pub cutoff: f32,
    /// Seed of the system or synthetic halos.
    pub seed: u64,
    /// GPUs to spread the ranks over in one process (0: as many as useful).
    pub gpus: usize,
    /// Deadline of every device wait.
    pub wait_timeout: Duration,
    /// Show a progress bar (rank 0).
    pub progress: bool,
    /// The command line, for the report.
    pub command: String,
    /// NVSHMEM host library (default: discovered).
    pub nvshmem_lib: Option<std::path::PathBuf>,
    /// How pulses reach their peers across PEs (the router's choice by default; ranks of one
    /// process always follow the router).
    pub paths: PathPolicy,
}

impl BenchConfig {
    /// A fingerprint every rank must share (what to run, in which order).
    fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&self.atoms, self.grid, &self.methods, self.graph, self.repeats, self.warmup, self.steps, self.halos, self.cutoff.to_bits(), self.seed)
            .hash(&mut h);
        h.finish()
    }

    /// Measurements (warm-up included) the progress bar counts.
    fn total_work(&self) -> u64 {
        (self.atoms.len() * Variant::list(&self.methods, self.graph).len() * (self.warmup + self.repeats)) as u64
    }
}

/// Runs the benchmark; the report on rank 0 (and in one process), `None` on other ranks.
pub fn run(config: &BenchConfig) -> Result<Option<BenchReport>> {
    if config.repeats == 0 || config.steps == 0 || config.atoms.is_empty() {
        return Err(HaloError::InvalidInput("need at least one size, one repeat and one step".into()));
    }
    match RankEnv::from_env() {
        Some(env) if env.nranks > 1 => run_pes(config, env),
        _ => run_local(config).map(Some),
    }
}

// ----------------------------------------------------------------------------------------------
// The common measurement code.

/// Per-step numbers of one timed loop.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    gpu_s: f64,
    cpu_s: f64,
    syncs: f64,
}

/// CPU time of the calling thread (s).
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes one timespec; CLOCK_THREAD_CPUTIME_ID is always available on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn measure(b: &mut Stepper, variant: Variant, graphs: &[PhaseGraphs], phase: Phase, steps: usize) -> Result<Sample> {
    b.x.barrier()?;
    let streams = b.x.streams().to_vec();
    let syncs0 = b.x.host_syncs();
    let cpu0 = thread_cpu_s();
    let starts = streams.iter().map(|s| floor::timing_event(s)).collect::<Result<Vec<_>>>()?;
    if variant.graph {
        // One captured step per replay, back to back: no host work between replays.
        Stepper::replay(graphs, phase, steps)?;
    } else {
        b.enqueue(variant.method, phase, steps)?;
    }
    let ends = streams.iter().map(|s| floor::timing_event(s)).collect::<Result<Vec<_>>>()?;
    let cpu = thread_cpu_s() - cpu0;
    let syncs = b.x.host_syncs() - syncs0;
    b.x.finish()?;
    let mut gpu = 0.0f64;
    for (a, b) in starts.iter().zip(&ends) {
        gpu = gpu.max(a.elapsed_ms(b).during("reading a timing event")? as f64 * 1e-3);
    }
    let n = steps as f64;
    // Host syncs per step and rank: in one process the thread waits for every rank's stream.
    let ranks = b.x.local_ranks().len().max(1) as f64;
    Ok(Sample { gpu_s: gpu / n, cpu_s: cpu / n, syncs: syncs as f64 / n / ranks })
}

/// What one variant gave when every check passed: `samples[phase][repeat]` on this process's
/// ranks and the largest force error of its checked steps; or what failed (agreed by every process).
type Measured = std::result::Result<(Vec<Vec<Sample>>, f64), String>;

/// One check's outcome on every process: this process's, unless another process failed.
fn agreed(group: &Group, mine: Checked, when: &str) -> Result<Checked> {
    let all_ok = group.all(mine.is_ok())?;
    Ok(match (mine, all_ok) {
        (Ok(worst), true) => Ok(worst),
        (Err(why), _) => Err(format!("{when}: {why}")),
        (Ok(_), false) => Err(format!("{when}: failed on another rank (see its message)")),
    })
}

/// One variant: a checked step, the warm-up and timed repeats on non-trivial data (the same
/// random values as the checked steps, not zeros), the coordinates those timed steps left checked,
/// and a checked step again (the same graphs replayed for `+graph` variants). Every check outside
/// the timed loops; a failed check before them skips the loops. Collective (`group`).
fn bench_variant(
    b: &mut Stepper,
    variant: Variant,
    graphs: &[PhaseGraphs],
    halos: &[RankHalo],
    cfg: &BenchConfig,
    group: &Group,
    bar: &indicatif::ProgressBar,
) -> Result<Measured> {
    let replayed = variant.graph.then_some(graphs);
    let seed = cfg.seed.wrapping_add(77);
    let before = b.checked_step(variant.method, replayed, halos, seed)?;
    let before = match agreed(group, before, "checked step before the timed loops")? {
        Ok(w) => w,
        Err(why) => {
            bar.inc((cfg.warmup + cfg.repeats) as u64);
            return Ok(Err(why));
        }
    };
    let (home, forces) = step::check_inputs(halos, seed.wrapping_add(1));
    b.fill(&home, &forces)?;
    let mut samples = vec![Vec::with_capacity(cfg.repeats); Phase::ALL.len()];
    for rep in 0..cfg.warmup + cfg.repeats {
        for (i, &phase) in Phase::ALL.iter().enumerate() {
            let s = measure(b, variant, graphs, phase, cfg.steps)?;
            if rep >= cfg.warmup {
                samples[i].push(s);
            }
        }
        bar.inc(1);
    }
    let timed = step::compare_coordinates(b.x.as_mut(), halos, &home)?;
    let timed = agreed(group, timed, "coordinates after the timed loops")?;
    let after = b.checked_step(variant.method, replayed, halos, seed.wrapping_add(2))?;
    let after = agreed(group, after, "checked step after the timed loops")?;
    Ok(timed.and(after).map(|worst| (samples, worst.max(before))))
}

/// The text of a row whose checks passed.
fn check_ok_text(worst: f64) -> String {
    format!("ok: coordinates bit-exact, forces max rel err {worst:.1e} (a step before and after timing, and the timed steps' coordinates)")
}

/// Flattens samples for a gather: phase-major, then repeat, then (gpu, cpu, syncs).
fn flatten(samples: &[Vec<Sample>]) -> Vec<f64> {
    samples.iter().flat_map(|ph| ph.iter().flat_map(|s| [s.gpu_s, s.cpu_s, s.syncs])).collect()
}

/// The inverse of [`flatten`] for `repeats` repeats.
fn unflatten(v: &[f64], repeats: usize) -> Vec<Vec<Sample>> {
    (0..Phase::ALL.len())
        .map(|p| {
            (0..repeats)
                .map(|r| {
                    let i = 3 * (p * repeats + r);
                    Sample { gpu_s: v[i], cpu_s: v[i + 1], syncs: v[i + 2] }
                })
                .collect()
        })
        .collect()
}

/// The report row of a variant from its samples (and its check's text).
fn result_row(
    atoms: usize,
    variant: Variant,
    sizes: &HaloSizes,
    samples: &[Vec<Sample>],
    floor: &floor::FloorInputs,
    link: Link,
    worst: f64,
) -> VariantResult {
    let us = |p: usize| Summary::of(&samples[p].iter().map(|s| s.gpu_s).collect::<Vec<_>>()).map(|s| s.scaled(1e6));
    let (coords, forces, step) = (us(0), us(1), us(2));
    let median = |f: fn(&Sample) -> f64| Summary::of(&samples[2].iter().map(f).collect::<Vec<_>>()).map(|s| s.median);
    // A graph holds one step and is replayed once per step.
    let vf = floor.variant(variant.method, variant.graph, &sizes.shape(link, 1));
    let fastest = [coords, forces, step].map(|s| s.map(|s| s.min * 1e-6));
    let kind = floor::FloorCheck::of(&vf, fastest);
    VariantResult {
        atoms,
        variant: variant.name(),
        transport: variant.method.name().into(),
        graph: variant.graph,
        pulses: sizes.pulses,
        halo_atoms: sizes.atoms_x,
        coords_us: coords,
        forces_us: forces,
        step_us: step,
        host_cpu_us: median(|s| s.cpu_s).map(|v| v * 1e6),
        host_syncs_per_step: median(|s| s.syncs),
        ns_per_day_exchange_only: step.map(|s| ns_per_day(s.median * 1e-6, TIME_STEP_FS)),
        floor_coords_us: Some(vf.coords_s * 1e6),
        floor_forces_us: Some(vf.forces_s * 1e6),
        floor_step_us: Some(vf.step_s * 1e6),
        floor: Some(kind),
        coords_per_floor: coords.and_then(|c| floor::ratio(c.median * 1e-6, vf.coords_s, kind)),
        step_per_floor: step.and_then(|c| floor::ratio(c.median * 1e-6, vf.step_s, kind)),
        checked: true,
        check: Some(check_ok_text(worst)),
        skipped: None,
    }
}

fn progress_bar(cfg: &BenchConfig, show: bool) -> indicatif::ProgressBar {
    if !show || !cfg.progress {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(cfg.total_work());
    if let Ok(style) = indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

fn summary_of(v: &[f64], scale: f64) -> Result<Summary> {
    Summary::of(v).map(|s| s.scaled(scale)).ok_or_else(|| HaloError::InvalidInput("a floor measurement gave no finite value".into()))
}

/// Launch, graph, host-sync and device-bandwidth probes on one GPU (`repeats` each).
struct LocalProbes {
    launch: Vec<f64>,
    launch_host: Vec<f64>,
    overlapping: Vec<f64>,
    graph: Vec<f64>,
    sync: Vec<f64>,
    device_bw: Vec<f64>,
}

/// Bytes of the bandwidth probes: large enough that setup costs vanish.
const BW_BYTES: usize = 256 << 20;
/// Launches per launch-overhead sample.
const LAUNCHES: usize = 2000;
/// Round trips per latency sample.
const PING_ROUNDS: u32 = 10_000;

fn local_probes(module: &Arc<KernelModule>, repeats: usize) -> Result<LocalProbes> {
    let ctx = module.context().clone();
    let stream = ctx.new_stream().during("creating a probe stream")?;
    let empty = EmptyLaunch::new(module.clone())?;
    floor::measure_launch(&empty, &stream, 100, false)?; // warm-up
    let mut p = LocalProbes { launch: vec![], launch_host: vec![], overlapping: vec![], graph: vec![], sync: vec![], device_bw: vec![] };
    for _ in 0..repeats {
        let (gpu, host) = floor::measure_launch(&empty, &stream, LAUNCHES, false)?;
        p.launch.push(gpu);
        p.launch_host.push(host);
        p.overlapping.push(floor::measure_launch(&empty, &stream, LAUNCHES, true)?.0);
        p.graph.push(floor::measure_graph_launch(&empty, &stream, LAUNCHES)?);
        p.sync.push(floor::measure_host_sync(&empty, &stream, 200)?);
        p.device_bw.push(floor::measure_device_bw(&ctx, &stream, BW_BYTES)?);
    }
    stream.synchronize().during("finishing the probes")?;
    Ok(p)
}

fn floor_report(between: String, latency_s: Option<&[f64]>, peer_bw: Option<&[f64]>, p: &LocalProbes) -> Result<FloorReport> {
    Ok(FloorReport {
        between,
        one_way_latency_us: latency_s.map(|v| summary_of(v, 1e6)).transpose()?,
        peer_bw_gbs: peer_bw.map(|v| summary_of(v, 1e-9)).transpose()?,
        device_bw_gbs: summary_of(&p.device_bw, 1e-9)?,
        launch_us: summary_of(&p.launch, 1e6)?,
        launch_host_us: summary_of(&p.launch_host, 1e6)?,
        graph_launch_us: summary_of(&p.graph, 1e6)?,
        overlapping_launch_us: summary_of(&p.overlapping, 1e6)?,
        host_sync_us: summary_of(&p.sync, 1e6)?,
    })
}

// ----------------------------------------------------------------------------------------------
// One process, every rank.

fn gpu_names(modules: &[Arc<KernelModule>]) -> Vec<String> {
    modules.iter().map(|m| m.context().name().unwrap_or_else(|_| format!("GPU {}", m.context().ordinal()))).collect()
}

/// Latency and peer bandwidth between the GPUs of `a` and `b` (the same GPU: two streams).
fn local_pair_probes(a: &Arc<KernelModule>, b: &Arc<KernelModule>, repeats: usize) -> Result<(Vec<f64>, Option<Vec<f64>>)> {
    let (ca, cb) = (a.context().clone(), b.context().clone());
    let two_gpus = ca.ordinal() != cb.ordinal();
    if two_gpus && !crate::exchange::rank::enable_peer_access(&ca, &cb)? | !crate::exchange::rank::enable_peer_access(&cb, &ca)? {
        return Err(HaloError::InvalidInput("the two GPUs have no peer access".into()));
    }
    let (sa, sb) = (ca.new_stream().during("probe stream")?, cb.new_stream().during("probe stream")?);
    let (fa, fb) = (DeviceBuffer::<u64>::zeroed(&ca, 1)?, DeviceBuffer::<u64>::zeroed(&cb, 1)?);
    let (sta, stb) = (DeviceBuffer::<WaitStatus>::zeroed(&ca, 1)?, DeviceBuffer::<WaitStatus>::zeroed(&cb, 1)?);
    let mut latency = Vec::with_capacity(repeats);
    for rep in 0..repeats + 1 {
        fa.fill_bytes(0)?;
        fb.fill_bytes(0)?;
        ca.synchronize().during("zeroing the flags")?;
        cb.synchronize().during("zeroing the flags")?;
        // SAFETY: both flags are live zeroed 8-byte slots reachable from both GPUs (same GPU or
        // peer access enabled above); the responder runs on the other GPU or another SM.
        unsafe { floor::launch_ping_pong(b, &sb, fb.device_ptr(), fa.device_ptr(), PING_ROUNDS, false, &stb)? };
        let t = floor::time_on_stream(&sa, || {
            // SAFETY: as above, flags swapped.
            unsafe { floor::launch_ping_pong(a, &sa, fa.device_ptr(), fb.device_ptr(), PING_ROUNDS, true, &sta) }
        })?;
        sb.synchronize().during("waiting for the ping-pong")?;
        floor::check_ping_pong(&sta)?;
        floor::check_ping_pong(&stb)?;
        if rep > 0 {
            latency.push(t / (2.0 * PING_ROUNDS as f64));
        }
    }
    let peer = if two_gpus {
        let (ba, bb) = (DeviceBuffer::<u8>::zeroed(&ca, BW_BYTES)?, DeviceBuffer::<u8>::zeroed(&cb, BW_BYTES)?);
        let mut v = Vec::with_capacity(repeats);
        for rep in 0..repeats + 1 {
            // SAFETY: both buffers hold BW_BYTES bytes and outlive the waited-for copy; UVA with
            // peer access lets GPU a's stream copy into GPU b.
            let t = unsafe { floor::time_copy(&sa, bb.device_ptr(), ba.device_ptr(), BW_BYTES)? };
            if rep > 0 {
                v.push(BW_BYTES as f64 / t);
            }
        }
        Some(v)
    } else {
        None
    };
    Ok((latency, peer))
}

fn run_local(cfg: &BenchConfig) -> Result<BenchReport> {
    if let Some(reason) = gpu::gpu_unavailable_reason() {
        return Err(HaloError::NoGpu(format!("halo bench needs a GPU: {reason}")));
    }
    let nranks: usize = cfg.grid.iter().product();
    let visible = gpu::device_count();
    let want = if cfg.gpus == 0 { nranks.min(visible) } else { cfg.gpus.min(visible) };
    let artifacts = crate::artifacts::KernelArtifacts::locate(crate::artifacts::DEFAULT_ARCH)?;
    let modules = (0..want.max(1)).map(|i| Ok(Arc::new(KernelModule::load(&gpu::open_device(i)?, &artifacts)?))).collect::<Result<Vec<_>>>()?;
    let link = if modules.len() > 1 { Link::Peer } else { Link::SameGpu };

    // The floor first, on idle GPUs.
    let probes = local_probes(&modules[0], cfg.repeats)?;
    let b = &modules[1 % modules.len()];
    let (latency, peer) = local_pair_probes(&modules[0], b, cfg.repeats)?;
    let between = if modules.len() > 1 { "GPU 0 and GPU 1, one process".to_string() } else { "two streams on GPU 0".to_string() };
    let floor = floor_report(between, Some(&latency), peer.as_deref(), &probes)?;
    let inputs = floor.inputs();

    let bar = progress_bar(cfg, true);
    let nranks: usize = cfg.grid.iter().product();
    let mut nccl = NcclSetup::default();
    let results = run_variants(cfg, &Placement::Local(modules.clone()).with_policy(cfg.paths), &Group::Local, &inputs, link, &bar, || {
        nccl.get(|| nccl::setup_local(&modules, nranks))
    })?;
    bar.finish_and_clear();
    Ok(report(cfg, "one process".into(), gpu_names(&modules), MachineInfo::collect(None), floor, results))
}

/// The report of a run: what ran where, the floor, every variant's row, the routes.
fn report(
    cfg: &BenchConfig,
    mode: String,
    gpus: Vec<String>,
    machine: MachineInfo,
    floor: FloorReport,
    (results, routes): (Vec<VariantResult>, Vec<SizeRoutes>),
) -> BenchReport {
    BenchReport {
        schema_version: super::report::SCHEMA_VERSION,
        machine,
        mode,
        ranks: grid_text(cfg.grid),
        gpus,
        halos: format!("{:?}", cfg.halos).to_lowercase(),
        steps: cfg.steps,
        repeats: cfg.repeats,
        warmup: cfg.warmup,
        command: cfg.command.clone(),
        floor,
        results,
        routes,
    }
}

/// NCCL is set up the first time a variant needs it, and its success or failure kept for the
/// rest of the run.
#[derive(Default)]
pub(crate) struct NcclSetup(Option<std::result::Result<nccl::NcclComms, String>>);

impl NcclSetup {
    /// NCCL, set up by `setup` the first time.
    pub(crate) fn get(&mut self, setup: impl FnOnce() -> Result<nccl::NcclComms>) -> std::result::Result<nccl::NcclComms, String> {
        self.0.get_or_insert_with(|| setup().map_err(|e| e.to_string())).clone()
    }
}

/// The processes taking part, for the decisions they must take together.
enum Group<'a> {
    /// This process alone.
    Local,
    /// Every PE, through small collectives on the symmetric heap.
    Pe(&'a PeComm),
}

impl Group<'_> {
    /// True when every process says true.
    fn all(&self, ok: bool) -> Result<bool> {
        match self {
            Group::Local => Ok(ok),
            Group::Pe(comm) => comm.all(ok),
        }
    }

    /// The slowest process's samples: elementwise max over processes.
    fn slowest(&self, samples: Vec<Vec<Sample>>, repeats: usize) -> Result<Vec<Vec<Sample>>> {
        let Group::Pe(comm) = self else { return Ok(samples) };
        let all = comm.all_gather(&flatten(&samples))?;
        let worst: Vec<f64> = (0..all[0].len()).map(|i| all.iter().map(|v| v[i]).fold(f64::NEG_INFINITY, f64::max)).collect();
        Ok(unflatten(&worst, repeats))
    }
}

/// Every size and variant on the ranks `placement` puts in this process: the same list in the
/// same order on every process, every skip decided together (`group`). `nccl` sets NCCL up (once)
/// when an NCCL variant comes.
fn run_variants(
    cfg: &BenchConfig,
    placement: &Placement,
    group: &Group,
    inputs: &floor::FloorInputs,
    link: Link,
    bar: &indicatif::ProgressBar,
    mut nccl: impl FnMut() -> std::result::Result<nccl::NcclComms, String>,
) -> Result<(Vec<VariantResult>, Vec<SizeRoutes>)> {
    let mut results = Vec::new();
    let mut routes = Vec::new();
    for &atoms in &cfg.atoms {
        bar.set_message(format!("{atoms} atoms: building halos"));
        let halos = build_halos(cfg.halos, atoms, cfg.grid, cfg.cutoff, cfg.seed)?;
        let sizes = HaloSizes::of(&halos);
        let mut routed = false;
        for variant in Variant::list(&cfg.methods, cfg.graph) {
            bar.set_message(format!("{atoms} atoms: {}", variant.name()));
            let skip = |why: String| {
                bar.inc((cfg.warmup + cfg.repeats) as u64);
                VariantResult::skipped(atoms, variant, why)
            };
            let mut x = placement.exchange(halos.clone())?;
            x.set_wait_timeout(cfg.wait_timeout);
            if !routed {
                // The plans depend on the halos only: once per size, every rank's (collective).
                routed = true;
                if let Some(size) = gather_routes(placement, atoms, x.routes())? {
                    routes.push(size);
                }
            }
            for rank in x.local_ranks() {
                // Defined values: NaNs would not change the timing, but keep the arrays sane.
                rank.x.fill_bytes(0)?;
                rank.f.fill_bytes(0)?;
            }
            let usable = variant.method.transport().and_then(|t| x.check_transport(t).err()).map(|e| e.to_string());
            if !group.all(usable.is_none())? {
                results.push(skip(usable.unwrap_or_else(|| "not possible on another rank".into())));
                continue;
            }
            let comms = if variant.method == Method::Nccl {
                match nccl() {
                    Ok(c) => Some(c),
                    Err(why) => {
                        results.push(skip(why));
                        continue;
                    }
                }
            } else {
                None
            };
            let mut b = Stepper::new(x, comms);
            // Capturing can fail (NCCL's capture across devices, say): a skip, decided together.
            let graphs = if variant.graph { b.capture(variant.method).map_err(|e| e.to_string()) } else { Ok(Vec::new()) };
            if !group.all(graphs.is_ok())? {
                results.push(skip(graphs.err().unwrap_or_else(|| "the capture failed on another rank".into())));
                continue;
            }
            let graphs = graphs.unwrap_or_default();
            match bench_variant(&mut b, variant, &graphs, &halos, cfg, group, bar)? {
                Ok((samples, worst)) => {
                    let samples = group.slowest(samples, cfg.repeats)?;
                    results.push(result_row(atoms, variant, &sizes, &samples, inputs, link, worst));
                }
                // Every process agreed on the failure: no times, on any of them.
                Err(why) => results.push(VariantResult::failed(atoms, variant, &sizes, why)),
            }
            drop(graphs);
            drop(b); // symmetric buffers are freed collectively, in the same order on every rank
        }
    }
    Ok((results, routes))
}

/// Every rank's route summary for one size, from each process's own (`mine`, its local ranks'):
/// all-gathered across PEs (collective). `None` when no router decided.
fn gather_routes(placement: &Placement, atoms: usize, mine: Vec<halo::route::RoutedSummary>) -> Result<Option<SizeRoutes>> {
    let bytes = serde_json::to_vec(&mine).map_err(|e| HaloError::InvalidInput(format!("encoding the routes: {e}")))?;
    let all = placement.all_gather(&format!("routes-{atoms}"), vec![bytes])?;
    let mut ranks = Vec::new();
    for b in &all {
        let part: Vec<halo::route::RoutedSummary> =
            serde_json::from_slice(b).map_err(|e| HaloError::InvalidInput(format!("a rank's routes do not parse: {e}")))?;
        ranks.extend(part);
    }
    Ok((!ranks.is_empty()).then_some(SizeRoutes { atoms, ranks }))
}

fn grid_text(g: [usize; 3]) -> String {
    format!("{}x{}x{}", g[0], g[1], g[2])
}

// ----------------------------------------------------------------------------------------------
// One rank per process.

/// Latency (rank 0 initiates, rank 1 answers) and rank 0 -> rank 1 bandwidth; only rank 0's
/// numbers are meaningful. `None` when the PEs cannot map each other (both probes need loads,
/// stores and peer copies): the put path through a remote transport.
fn pe_pair_probes(session: &PeSession, comm: &PeComm, repeats: usize) -> Result<Option<(Vec<f64>, Vec<f64>)>> {
    if !comm.mapped() {
        return Ok(None);
    }
    let nv = &session.nvshmem;
    let me = nv.my_pe();
    let ctx = &session.ctx;
    let stream = ctx.new_stream().during("probe stream")?;
    let flag = nv.alloc::<u64>(1)?;
    let status = DeviceBuffer::<WaitStatus>::zeroed(ctx, 1)?;
    let other = if me == 0 { 1 } else { 0 };
    let peer_flag = flag.peer_ptr(other).ok_or_else(|| HaloError::Nvshmem("PE 1 is not reachable by loads and stores from PE 0".into()));
    let mapped = comm.all(peer_flag.is_ok())?;
    let peer_flag =
        if mapped { peer_flag? } else { return Err(HaloError::Nvshmem("PEs 0 and 1 cannot map each other's memory: no latency probe".into())) };
    let mut latency = Vec::with_capacity(repeats);
    for rep in 0..repeats + 1 {
        flag.fill_bytes(0)?;
        ctx.synchronize().during("zeroing the flag")?;
        nv.barrier_all()?;
        if me <= 1 {
            let t = floor::time_on_stream(&stream, || {
                // SAFETY: both flags are live zeroed symmetric slots, the peer's mapped by
                // nvshmem_ptr; PE 1 runs the other side (flags swapped) at the same time.
                unsafe { floor::launch_ping_pong(&session.module, &stream, flag.device_ptr(), peer_flag, PING_ROUNDS, me == 0, &status) }
            })?;
            floor::check_ping_pong(&status)?;
            if rep > 0 {
                latency.push(t / (2.0 * PING_ROUNDS as f64));
            }
        }
        nv.barrier_all()?;
    }
    let big = nv.alloc::<u8>(BW_BYTES)?;
    let dst = big.peer_ptr(other);
    let mut bw = Vec::with_capacity(repeats);
    for rep in 0..repeats + 1 {
        nv.barrier_all()?;
        if let (0, Some(dst)) = (me, dst) {
            // SAFETY: both are BW_BYTES-byte symmetric buffers (local, and PE 1's mapping); PE 1
            // does not touch its copy during the probe (it waits at the barrier).
            let t = unsafe { floor::time_copy(&stream, dst, big.device_ptr(), BW_BYTES)? };
            if rep > 0 {
                bw.push(BW_BYTES as f64 / t);
            }
        }
        nv.barrier_all()?;
    }
    drop(big);
    drop(flag);
    Ok(Some((latency, bw)))
}

fn run_pes(cfg: &BenchConfig, env: RankEnv) -> Result<Option<BenchReport>> {
    let session = PeSession::start(env, cfg.nvshmem_lib.as_deref())?;
    let nv = session.nvshmem.clone();
    let (me, npes) = (nv.my_pe(), nv.n_pes());
    let nranks: usize = cfg.grid.iter().product();
    if nranks != npes {
        return Err(HaloError::InvalidInput(format!("--ranks {} has {nranks} ranks but {npes} processes run", grid_text(cfg.grid))));
    }
    let capacity = 3 * Phase::ALL.len() * cfg.repeats.max(1) + 64;
    let comm = PeComm::new(nv.clone(), capacity)?;
    // Every rank must run the same list in the same order, or the collectives would cross.
    let prints = comm.all_gather(&[f64::from_bits(cfg.fingerprint())])?;
    if prints.iter().any(|p| p[0].to_bits() != cfg.fingerprint()) {
        return Err(HaloError::InvalidInput("the ranks were started with different bench options".into()));
    }

    let probes = local_probes(&session.module, cfg.repeats)?;
    let pair = pe_pair_probes(&session, &comm, cfg.repeats)?;
    // `halo launch` puts PEs 0 and 1 on different GPUs (round robin), so partners are on another GPU.
    let link = Link::Peer;
    let floor = match (me, &pair) {
        (0, Some((latency, peer_bw))) => Some(floor_report("PE 0 and PE 1 (NVSHMEM)".into(), Some(latency), Some(peer_bw), &probes)?),
        (0, None) => Some(floor_report(
            format!(
                "PE 0 and PE 1 (NVSHMEM, not mapped into each other: remote transport {})",
                std::env::var("NVSHMEM_REMOTE_TRANSPORT").unwrap_or_else(|_| "?".into())
            ),
            None,
            None,
            &probes,
        )?),
        _ => None,
    };
    // Every rank uses rank 0's floor for the formulas (only rank 0 reports them).
    let floor_words = floor.as_ref().map(|f| {
        let i = f.inputs();
        [i.one_way_latency_s, i.peer_bw.unwrap_or(0.0), i.device_bw, i.launch_s, i.graph_launch_s, i.host_sync_s, i.overlapping_launch_s]
    });
    let shared = comm.all_gather(&floor_words.unwrap_or([0.0; 7]))?;
    let w = &shared[0];
    let inputs = floor::FloorInputs {
        one_way_latency_s: w[0],
        peer_bw: (w[1] > 0.0).then_some(w[1]),
        device_bw: w[2],
        launch_s: w[3],
        graph_launch_s: w[4],
        host_sync_s: w[5],
        overlapping_launch_s: w[6],
    };

    let bar = progress_bar(cfg, me == 0);
    let mut nccl = NcclSetup::default();
    let results = run_variants(cfg, &Placement::pe(&session, cfg.paths), &Group::Pe(&comm), &inputs, link, &bar, || {
        nccl.get(|| nccl::setup_pe(&session, &comm))
    })?;
    bar.finish_and_clear();
    drop(nccl);
    nv.barrier_all()?;
    let Some(floor) = floor else { return Ok(None) };
    let gpus = vec![session.ctx.name().unwrap_or_else(|_| "GPU".into()); npes];
    let machine = MachineInfo::collect(Some(&session.nvshmem));
    Ok(Some(report(cfg, format!("{npes} processes, one GPU each (NVSHMEM)"), gpus, machine, floor, results)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flatten_round_trips() {
        let s: Vec<Vec<Sample>> =
            (0..3).map(|p| (0..4).map(|r| Sample { gpu_s: (p * 10 + r) as f64, cpu_s: 0.5, syncs: p as f64 }).collect()).collect();
        let back = unflatten(&flatten(&s), 4);
        for p in 0..3 {
            for r in 0..4 {
                assert_eq!(back[p][r].gpu_s, s[p][r].gpu_s);
                assert_eq!(back[p][r].syncs, s[p][r].syncs);
            }
        }
    }

    #[test]
    fn rows_use_the_step_loop_for_host_numbers() {
        let mk = |g: f64, syncs: f64| Sample { gpu_s: g, cpu_s: 2e-6, syncs };
        let samples =
            vec![vec![mk(3e-6, 0.0); 5], vec![mk(4e-6, 0.0); 5], vec![mk(8e-6, 0.0), mk(9e-6, 0.0), mk(7e-6, 0.0), mk(8e-6, 0.0), mk(10e-6, 0.0)]];
        let sizes = HaloSizes { pulses: 1, atoms_x: 1500, atoms_f: 1500 };
        let f = floor::FloorInputs {
            one_way_latency_s: 1e-6,
            peer_bw: Some(4e11),
            device_bw: 4e12,
            launch_s: 2e-6,
            graph_launch_s: 2e-6,
            overlapping_launch_s: 2e-6,
            host_sync_s: 5e-6,
        };
        let r = result_row(6000, Variant { method: Method::Fused, graph: false }, &sizes, &samples, &f, Link::Peer, 1e-7);
        let step = r.step_us.unwrap();
        assert!((step.median - 8.0).abs() < 1e-9 && (step.min - 7.0).abs() < 1e-9 && (step.max - 10.0).abs() < 1e-9);
        assert!((r.coords_us.unwrap().median - 3.0).abs() < 1e-9);
        assert!((r.host_cpu_us.unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(r.host_syncs_per_step, Some(0.0));
        assert!((r.ns_per_day_exchange_only.unwrap() - 21_600.0).abs() < 1e-6);
        // 18 kB over 400 GB/s = 45 ns < 1 us latency < 2 us launch: floor 2 us each way, and the
        // step max(2 launches, 2 latencies) = 4 us.
        assert!((r.floor_step_us.unwrap() - 4.0).abs() < 1e-9, "{r:?}");
        assert!((r.floor_coords_us.unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(r.floor, Some(floor::FloorCheck::Bound));
        assert!((r.step_per_floor.unwrap() - 2.0).abs() < 1e-9 && (r.coords_per_floor.unwrap() - 1.5).abs() < 1e-9, "{r:?}");
        assert_eq!((r.transport.as_str(), r.graph), ("fused", false));
        assert!(r.check.as_deref().unwrap().starts_with("ok: coordinates bit-exact") && r.checked, "{r:?}");
        // A fastest repeat below the floor makes the floor a model: no ratio.
        let mut fast = samples.clone();
        fast[0][0].gpu_s = 1e-6;
        let r = result_row(6000, Variant { method: Method::Fused, graph: false }, &sizes, &fast, &f, Link::Peer, 0.0);
        assert_eq!(r.floor, Some(floor::FloorCheck::Model));
        assert_eq!((r.coords_per_floor, r.step_per_floor), (None, None));
    }

    /// An exchange with no rank that logs its calls where the test can read them after the
    /// runner owns it.
    struct Logged(std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>);

    impl Logged {
        fn log(&self, call: &'static str) {
            self.0.lock().unwrap().push(call);
        }
    }

    impl crate::exchange::Exchange for Logged {
        fn local_ranks(&self) -> &[crate::exchange::RankExchange] {
            &[]
        }
        fn local_ranks_mut(&mut self) -> &mut [crate::exchange::RankExchange] {
            &mut []
        }
        fn streams(&self) -> &[Arc<crate::gpu::CudaStream>] {
            &[]
        }
        fn check_transport(&self, _: crate::exchange::Transport) -> Result<()> {
            Ok(())
        }
        fn exchange_forward(&mut self, _: crate::exchange::Transport) -> Result<()> {
            self.log("x");
            Ok(())
        }
        fn exchange_reverse_accumulate(&mut self, _: crate::exchange::Transport) -> Result<()> {
            self.log("f");
            Ok(())
        }
        fn finish(&mut self) -> Result<()> {
            self.log("wait");
            Ok(())
        }
        fn use_streams(&mut self, _: &[Arc<crate::gpu::CudaStream>]) -> Result<()> {
            Ok(())
        }
        fn barrier(&self) -> Result<()> {
            Ok(())
        }
        fn host_syncs(&self) -> u64 {
            0
        }
        fn reset_protocol(&mut self) -> Result<()> {
            Ok(())
        }
        fn replan(&mut self, _: Vec<RankHalo>) -> Result<bool> {
            Ok(true)
        }
        fn fits(&self, _: &[RankHalo]) -> bool {
            true
        }
        fn routes(&self) -> Vec<halo::route::RoutedSummary> {
            Vec::new()
        }
    }

    /// A variant's checked steps come before and after its timed loops, never inside them: the
    /// first calls are a full step and its wait, and so are the last; between them the loops.
    #[test]
    fn every_variant_is_checked_before_and_after_its_timed_loops() {
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut b = Stepper::new(Box::new(Logged(log.clone())), None);
        let cfg = BenchConfig {
            atoms: vec![6000],
            grid: [2, 1, 1],
            methods: vec![Method::Fused],
            graph: false,
            repeats: 1,
            warmup: 0,
            steps: 2,
            halos: HaloSource::Synthetic,
            cutoff: 1.0,
            seed: 1,
            gpus: 0,
            wait_timeout: Duration::from_secs(1),
            progress: false,
            command: String::new(),
            nvshmem_lib: None,
            paths: PathPolicy::Routed,
        };
        let halos = build_halos(HaloSource::Synthetic, 600, [2, 1, 1], 1.0, 1).unwrap();
        let out = bench_variant(
            &mut b,
            Variant { method: Method::Fused, graph: false },
            &[],
            &halos,
            &cfg,
            &Group::Local,
            &indicatif::ProgressBar::hidden(),
        )
        .unwrap();
        let (samples, _) = out.expect("no rank, nothing to differ");
        assert_eq!(samples.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 1]);
        let calls = log.lock().unwrap().join(" ");
        // checked step | the timed data written | X loop | F loop | X+F loop | coordinates read | checked step
        assert_eq!(calls, "wait x f wait | wait | x x wait | f f wait | x f x f wait | wait | wait x f wait".replace("| ", ""), "{calls}");
    }

    #[test]
    fn a_failed_check_names_when_it_failed() {
        assert_eq!(
            agreed(&Group::Local, Err("rank 1: coordinate of atom 3".into()), "before").unwrap(),
            Err("before: rank 1: coordinate of atom 3".into())
        );
        assert_eq!(agreed(&Group::Local, Ok(2e-7), "after").unwrap(), Ok(2e-7));
    }
}
