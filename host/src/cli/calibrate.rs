//! `halo calibrate`: measures each transport per distance level and message size on the GPUs
//! present and writes the router's calibration file.
//!
//! Every point is a synthetic two-rank halo whose pulse carries the message size, timed with CUDA
//! events around one exchange step (coordinates out, forces back: two one-way messages), after a
//! warm-up, as the median of the repeats. In one process: `nvlink-store` (fused kernel, direct
//! stores), `nvlink-tma` (fused TMA kernel) and `staged` at same-GPU (both ranks on GPU 0) and at
//! the discovered level of GPUs 0 and 1. Under `halo launch -n 2`: the same three plus
//! `nvshmem-put` (fused kernel, puts forced) between the two PEs; PE 0 writes the file.

use anyhow::{Context, Result, bail};
use halo::exchange::pe::{PathPolicy, PeExchange};
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{LocalRanks, RankHalo, Transport as X};
use halo::gpu::{self, CudaStream, DeviceMemory, KernelModule};
use halo::route::calibrate::{self, DEFAULT_SIZES, Measurer, Planned, Sample};
use halo::route::{DistanceLevel, Transport, gpu_facts, topology_from_facts};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct CalibrateArgs {
    /// Where to write the calibration file (load it with HALO_ROUTE_CALIBRATION=FILE).
    #[arg(long, default_value = "calibration.json")]
    out: PathBuf,
    /// Message sizes (bytes, comma-separated; KiB/MiB accepted) [default: 64,1024,16384,262144,4194304].
    #[arg(long, value_delimiter = ',', value_parser = parse_size_arg)]
    sizes: Vec<u64>,
    /// Timed repetitions per point (the median is kept).
    #[arg(long, default_value_t = 50)]
    repeats: usize,
    /// Untimed repetitions first.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// NVSHMEM host library to use (default: discovered).
    #[arg(long)]
    nvshmem_lib: Option<PathBuf>,
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    halo::route::parse_size(s.trim()).map_err(|e| e.to_string())
}

/// Why NCCL is not measured (no NCCL driver in the exchange or the benchmarks yet).
const NCCL_SKIP: &str = "no NCCL driver in this code base yet (host/src/bench/ has no NCCL baseline); the router keeps its defaults";

/// A two-rank halo whose single pulse per direction carries about `bytes` (12-byte atoms).
fn halo_for(bytes: u64) -> Vec<RankHalo> {
    let atoms = bytes.div_ceil(12).max(1) as usize;
    synthetic::halos(SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: atoms, send_fraction: 1.0, box_len: 7.7 }, 1)
}

fn kernel_of(t: Transport) -> Option<X> {
    match t {
        Transport::NvlinkStore | Transport::NvshmemPut => Some(X::Fused),
        Transport::NvlinkTma => Some(X::FusedTma),
        Transport::Staged => Some(X::Staged),
        Transport::Nccl => None,
    }
}

/// Times `step` with CUDA events on `stream`: warm-up, then the median one-way time.
fn time_steps(stream: &CudaStream, warmup: usize, repeats: usize, mut step: impl FnMut(bool) -> Result<()>) -> Result<Sample> {
    for _ in 0..warmup {
        step(false)?;
    }
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut ms = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let start = stream.record_event(flags)?;
        step(true)?;
        let end = stream.record_event(flags)?;
        ms.push(f64::from(start.elapsed_ms(&end)?));
    }
    let median = calibrate::median(&ms).context("no repeats")?;
    // One step is two one-way messages back to back (coordinates, then forces).
    Ok(Sample { one_way_us: median * 1000.0 / 2.0, samples: repeats as u64 })
}

/// Ranks in this process.
struct LocalMeasurer {
    modules: Vec<Arc<KernelModule>>,
    names: Vec<String>,
    pair_level: Option<DistanceLevel>,
    warmup: usize,
    repeats: usize,
}

impl Measurer for LocalMeasurer {
    fn gpu_names(&self) -> Vec<String> {
        self.names.clone()
    }
    fn plan(&self) -> Vec<Planned> {
        let mut levels = vec![DistanceLevel::SameGpu];
        levels.extend(self.pair_level);
        let mut p = Vec::new();
        for level in levels {
            for transport in [Transport::NvlinkStore, Transport::NvlinkTma, Transport::Staged] {
                p.push(Planned::Measure { transport, level });
            }
        }
        p.push(Planned::Skip { transport: Transport::NvshmemPut, reason: "needs one process per GPU: run under `halo launch -n 2 -- calibrate`".into() });
        p.push(Planned::Skip { transport: Transport::Nccl, reason: NCCL_SKIP.into() });
        p
    }
    fn measure(&mut self, t: Transport, level: DistanceLevel, bytes: u64) -> Result<Sample, String> {
        let run = || -> Result<Sample> {
            let kernel = kernel_of(t).context("not an exchange transport")?;
            let mods = if level == DistanceLevel::SameGpu { &self.modules[..1] } else { &self.modules[..2] };
            let halos = halo_for(bytes);
            let mut ranks = LocalRanks::new(halos.clone(), mods)?;
            let home = synthetic::random_values(&halos, 1, true);
            for (r, rank) in ranks.ranks().iter().enumerate() {
                rank.upload_coordinates(&home[r])?;
                rank.f.fill_bytes(0)?;
            }
            let stream = ranks.stream(0).clone();
            time_steps(&stream, self.warmup, self.repeats, |_| {
                ranks.launch_coordinates(kernel)?;
                ranks.launch_forces(kernel)?;
                ranks.finish()?;
                Ok(())
            })
        };
        run().map_err(|e| format!("{e:#}"))
    }
}

/// One PE of a `halo launch`; every PE runs the same sequence (allocations are collective).
struct PeMeasurer {
    session: halo::session::PeSession,
    names: Vec<String>,
    level: DistanceLevel,
    warmup: usize,
    repeats: usize,
}

impl Measurer for PeMeasurer {
    fn gpu_names(&self) -> Vec<String> {
        self.names.clone()
    }
    fn plan(&self) -> Vec<Planned> {
        let mut p: Vec<Planned> = [Transport::NvlinkStore, Transport::NvlinkTma, Transport::NvshmemPut, Transport::Staged]
            .into_iter()
            .map(|transport| Planned::Measure { transport, level: self.level })
            .collect();
        p.push(Planned::Skip { transport: Transport::Nccl, reason: NCCL_SKIP.into() });
        p
    }
    fn measure(&mut self, t: Transport, _level: DistanceLevel, bytes: u64) -> Result<Sample, String> {
        let run = || -> Result<Sample> {
            let kernel = kernel_of(t).context("not an exchange transport")?;
            let policy = if t == Transport::NvshmemPut { PathPolicy::ForcePut } else { PathPolicy::Auto };
            let halos = halo_for(bytes);
            let mut pe = PeExchange::new(self.session.nvshmem.clone(), self.session.module.clone(), halos.clone(), policy)?;
            let me = self.session.nvshmem.my_pe();
            // Both PEs reach the same verdict (same peers, same rules), so neither waits alone.
            pe.check_transport(kernel)?;
            let home = synthetic::random_values(&halos, 1, true);
            pe.rank().upload_coordinates(&home[me])?;
            pe.rank().f.fill_bytes(0)?;
            let stream = pe.stream().clone();
            time_steps(&stream, self.warmup, self.repeats, |_| {
                pe.barrier()?; // both PEs start the step together
                pe.launch_coordinates(kernel)?;
                pe.launch_forces(kernel)?;
                pe.finish()?;
                Ok(())
            })
        };
        run().map_err(|e| format!("{e:#}"))
    }
}

pub fn run(args: CalibrateArgs) -> Result<()> {
    if let Some(reason) = gpu::gpu_unavailable_reason() {
        bail!("halo calibrate measures on GPUs: {reason}");
    }
    anyhow::ensure!(args.repeats >= 1, "--repeats must be at least 1");
    let sizes = if args.sizes.is_empty() { DEFAULT_SIZES.to_vec() } else { args.sizes.clone() };
    let host = gpu_facts::hostname();
    let created = calibrate::now_rfc3339();
    let env = halo::launch::RankEnv::from_env();
    let (report, writer) = match env {
        Some(env) if env.nranks > 1 => {
            anyhow::ensure!(env.nranks == 2, "calibrate measures pairs: run it with `halo launch -n 2`");
            let found = gpu_facts::discover(env.device)?;
            let facts = gpu_facts::gather("route-facts", &found.facts)?;
            let level = topology_from_facts(&facts, None)?.distance(0, 1)?;
            let names = gpu_facts::gather_json("calibrate-gpus", &found.name)?;
            let session = halo::session::PeSession::start(env.clone(), args.nvshmem_lib.as_deref()).context("starting NVSHMEM")?;
            println!("PE {} on GPU {} ({}), level to the other PE: {level}", env.rank, env.device, found.name);
            let mut m = PeMeasurer { session, names, level, warmup: args.warmup, repeats: args.repeats };
            (calibrate::calibrate(&mut m, &sizes, &host, &created), env.rank == 0)
        }
        _ => {
            let n = gpu::device_count();
            let modules = (0..n.min(2))
                .map(|i| Ok(Arc::new(KernelModule::load(&gpu::open_device(i)?, &halo::artifacts::KernelArtifacts::locate(halo::artifacts::DEFAULT_ARCH)?)?)))
                .collect::<Result<Vec<_>>>()?;
            let (facts, found) = gpu_facts::local_rank_facts(modules.len(), modules.len())?;
            let pair_level = if modules.len() >= 2 { Some(topology_from_facts(&facts, None)?.distance(0, 1)?) } else { None };
            let names = found.iter().map(|f| f.name.clone()).collect();
            println!("{} GPU(s) in one process; GPU 0 - GPU 1: {}", modules.len(), pair_level.map_or("-".into(), |l| l.to_string()));
            let mut m = LocalMeasurer { modules, names, pair_level, warmup: args.warmup, repeats: args.repeats };
            (calibrate::calibrate(&mut m, &sizes, &host, &created), true)
        }
    };
    for e in &report.file.entries {
        println!(
            "{:>12} {:>16} {:>9}: {:>9.2} µs one-way, {:>8.2} GB/s ({} samples)",
            e.transport.name(),
            e.level.name(),
            halo::route::format_size(e.bytes),
            e.latency_us,
            e.bandwidth_gbs,
            e.samples
        );
    }
    for (t, level, bytes, why) in &report.skipped {
        let at = match (level, bytes) {
            (Some(l), Some(b)) => format!(" at {l} {}", halo::route::format_size(*b)),
            (Some(l), None) => format!(" at {l}"),
            _ => String::new(),
        };
        println!("{:>12}{at}: not measured: {why}", t.name());
    }
    if writer {
        calibrate::write_calibration(&args.out, &report.file).with_context(|| format!("writing {}", args.out.display()))?;
        println!(
            "wrote {} ({} points); use it with HALO_ROUTE_CALIBRATION={}",
            args.out.display(),
            report.file.entries.len(),
            args.out.display()
        );
    }
    Ok(())
}
