//! `halo calibrate`: measures each transport per distance level and message size on the GPUs
//! present and writes the router's calibration file.
//!
//! Every point is a synthetic two-rank halo whose pulse carries the message size, timed with CUDA
//! events around one exchange step (coordinates out, forces back: two one-way messages), after a
//! warm-up, as the median of the repeats. In one process: `nvlink-store` (fused kernel, direct
//! stores), `nvlink-tma` (fused TMA kernel) and `staged` at same-GPU (both ranks on GPU 0) and at
//! the discovered level of GPUs 0 and 1, plus `nccl` between GPUs 0 and 1 (NCCL allows one rank
//! per GPU, so not at same-GPU). Under `halo launch -n 2`: the same plus `nvshmem-put` (fused
//! kernel, puts forced) between the two PEs; PE 0 writes the file.
//!
//! `nccl` is the benchmark's baseline (`bench::nccl`: pack, `ncclSend`/`ncclRecv` in a group,
//! unpack-accumulate for forces) on the same synthetic halo, so its numbers are comparable with
//! the others'. When NCCL cannot be loaded or initialised it is skipped with NCCL's reason, and
//! the router does not let its default numbers compete with the measured transports.
//!
//! Every point is checked: before its warm-up and after its timed steps, one step of the same
//! transport on fresh random data is compared with the CPU reference (coordinates bit-exact,
//! forces within 1e-5), agreed by both PEs under a launcher. A point that fails has no number, and
//! the command then writes no file and fails.

use crate::bench::nccl::{self, Nccl, NcclComm};
use crate::bench::step;
use crate::machine::MachineInfo;
use anyhow::{Context, Result, bail};
use halo::abi::Float3;
use halo::exchange::pe::PathPolicy;
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{Exchange, Placement, RankHalo, Transport as X};
use halo::gpu::{self, CudaStream, KernelModule};
use halo::route::calibrate::{self, DEFAULT_SIZES, Measurer, NotMeasured, Planned, Sample};
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

/// What the skip reason adds: the consequence for the router.
const NCCL_SKIP_EFFECT: &str = "the router keeps its default numbers, which do not compete with measured transports";

/// NCCL, ready to measure, or why not (recorded as the skip reason).
type NcclSetup<C> = std::result::Result<(Arc<Nccl>, C), String>;

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
    // Checked by the caller, before and after.
    Ok(Sample { one_way_us: median * 1000.0 / 2.0, samples: repeats as u64, checked: true })
}

/// Measures on two ranks: in this process (both on GPU 0 for same-GPU, on GPUs 0 and 1 for their
/// level) or as the two PEs of a `halo launch -n 2`. Every PE runs the same sequence
/// (allocations are collective).
struct ExchangeMeasurer {
    names: Vec<String>,
    /// What is measured and what is skipped (and why).
    plan: Vec<Planned>,
    /// Where the two ranks run at each measured level.
    placements: Vec<(DistanceLevel, Placement)>,
    /// One communicator per local rank of the level NCCL is measured at (both PEs agree on
    /// success: see [`pe_nccl`]).
    nccl: NcclSetup<Vec<NcclComm>>,
    warmup: usize,
    repeats: usize,
}

impl Measurer for ExchangeMeasurer {
    fn gpu_names(&self) -> Vec<String> {
        self.names.clone()
    }
    fn plan(&self) -> Vec<Planned> {
        self.plan.clone()
    }
    fn measure(&mut self, t: Transport, level: DistanceLevel, bytes: u64) -> Result<Sample, NotMeasured> {
        let run = || -> Result<Checked<Sample>> {
            let placement = self.placements.iter().find(|(l, _)| *l == level).map(|(_, p)| p).context("no ranks placed at that level")?;
            if t == Transport::Nccl {
                let (api, comms) = self.nccl.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
                return self.time_exchange(placement, None, bytes, |x| {
                    let io: Vec<_> = x.local_ranks().iter().zip(comms).zip(x.streams()).map(|((rank, c), s)| (rank, c, s)).collect();
                    nccl::coordinates(api, &io)?;
                    nccl::forces(api, &io)
                });
            }
            let kernel = kernel_of(t).context("not an exchange transport")?;
            let placement = placement.with_policy(if t == Transport::NvshmemPut { PathPolicy::ForcePut } else { PathPolicy::Auto });
            self.time_exchange(&placement, Some(kernel), bytes, |x| {
                x.exchange_forward(kernel)?;
                x.exchange_reverse_accumulate(kernel)
            })
        };
        match run() {
            Ok(Ok(sample)) => Ok(sample),
            Ok(Err(why)) => Err(NotMeasured::CheckFailed(why)),
            Err(e) => Err(NotMeasured::Skipped(format!("{e:#}"))),
        }
    }
}

/// A measurement, or what its check found wrong.
type Checked<T> = std::result::Result<T, String>;

impl ExchangeMeasurer {
    /// One message of `bytes` each way per step on a fresh two-rank exchange: `step` on every
    /// local rank, each step started together (barrier across PEs) and finished (every local
    /// stream), timed on the first local rank's stream.
    fn time_exchange(
        &self,
        placement: &Placement,
        kernel: Option<X>,
        bytes: u64,
        mut step: impl FnMut(&mut dyn Exchange) -> halo::Result<()>,
    ) -> Result<Checked<Sample>> {
        let halos = halo_for(bytes);
        let mut x = placement.exchange::<Float3>(halos.clone())?;
        if let Some(kernel) = kernel {
            // Both PEs reach the same verdict (same peers, same rules), so neither waits alone.
            x.check_transport(kernel)?;
        }
        if let Err(why) = check_point(x.as_mut(), &halos, placement, 11, "before", &mut step)? {
            return Ok(Err(why));
        }
        // The timed steps run on the random data the check left.
        let stream = x.streams()[0].clone();
        let sample = time_steps(&stream, self.warmup, self.repeats, |_| {
            x.barrier()?; // every PE starts the step together
            step(x.as_mut())?;
            x.finish()?;
            Ok(())
        })?;
        Ok(check_point(x.as_mut(), &halos, placement, 12, "after", &mut step)?.map(|()| sample))
    }
}

/// One step of `step` on fresh random data from `seed`, compared with the CPU reference, the
/// verdict agreed by every PE (collective).
fn check_point(
    x: &mut dyn Exchange,
    halos: &[RankHalo],
    placement: &Placement,
    seed: u64,
    when: &str,
    step: &mut dyn FnMut(&mut dyn Exchange) -> halo::Result<()>,
) -> Result<Checked<()>> {
    let mine = step::checked_step_with(x, halos, seed, step)?;
    let agreed = step::agree(placement, &format!("calibrate-check-{when}"), &mine)?;
    Ok(agreed.map(|_| ()).map_err(|why| format!("the step {when} timing does not match the CPU reference: {why}")))
}

/// NCCL communicators for GPUs 0 and 1 of this process, made once for every size.
fn local_nccl(modules: &[Arc<KernelModule>]) -> NcclSetup<Vec<NcclComm>> {
    let ordinals: Vec<usize> = modules.iter().take(2).map(|m| m.context().ordinal()).collect();
    if ordinals.len() < 2 {
        return Err("NCCL needs two GPUs (one rank per GPU)".into());
    }
    let api = Nccl::load().map_err(|e| e.to_string())?;
    let comms = api.comm_init_all(&ordinals).map_err(|e| e.to_string())?;
    Ok((api, comms))
}

/// Every PE joins one NCCL communicator (rank = PE). Collective: the PEs exchange whether NCCL
/// loaded and PE 0's unique id through `halo launch`'s rendezvous, so either every PE measures
/// NCCL or none does (a PE measuring alone would wait for its peer forever).
fn pe_nccl(session: &halo::session::PeSession) -> Result<NcclSetup<Vec<NcclComm>>> {
    let me = session.nvshmem.my_pe();
    let loaded = Nccl::load().map_err(|e| e.to_string());
    let id = match (&loaded, me) {
        (Ok(api), 0) => api.unique_id().map(|id| id.0.to_vec()).map_err(|e| e.to_string()),
        (Ok(_), _) => Ok(Vec::new()),
        (Err(e), _) => Err(e.clone()),
    };
    let all = gpu_facts::gather_json("calibrate-nccl-id", &id)?;
    if let Some((pe, Err(why))) = all.iter().enumerate().find(|(_, r)| r.is_err()) {
        return Ok(Err(format!("PE {pe}: {why}")));
    }
    let bytes = all.first().and_then(|r| r.as_ref().ok()).context("no NCCL id from PE 0")?;
    let id = nccl::UniqueId(bytes.as_slice().try_into().context("PE 0's NCCL id is not 128 bytes")?);
    let api = loaded.map_err(|e| anyhow::anyhow!("{e}"))?;
    // NCCL initialises on the calling thread's current device: this PE's.
    session.ctx.bind_to_thread()?;
    let comm = api.comm_init_rank(session.nvshmem.n_pes(), id, me).map_err(|e| e.to_string());
    // Init is collective, so both PEs normally agree; gather anyway so neither measures alone.
    let ok = gpu_facts::gather_json("calibrate-nccl-init", &comm.as_ref().map(|_| ()).map_err(Clone::clone))?;
    if let Some((pe, Err(why))) = ok.iter().enumerate().find(|(_, r)| r.is_err()) {
        return Ok(Err(format!("PE {pe}: {why}")));
    }
    Ok(comm.map(|c| (api, vec![c])))
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
    let (report, writer, machine) = match env {
        Some(env) if env.nranks > 1 => {
            anyhow::ensure!(env.nranks == 2, "calibrate measures pairs: run it with `halo launch -n 2`");
            let found = gpu_facts::discover(env.device)?;
            let facts = gpu_facts::gather("route-facts", &found.facts)?;
            let level = topology_from_facts(&facts, None)?.distance(0, 1)?;
            let names = gpu_facts::gather_json("calibrate-gpus", &found.name)?;
            let session = halo::session::PeSession::start(env.clone(), args.nvshmem_lib.as_deref()).context("starting NVSHMEM")?;
            let machine = (env.rank == 0).then(|| MachineInfo::collect(Some(&session.nvshmem)));
            if let Some(m) = &machine {
                print!("{}", m.text());
            }
            println!("PE {} on GPU {} ({}), level to the other PE: {level}", env.rank, env.device, found.name);
            let nccl = pe_nccl(&session)?;
            let mut plan: Vec<Planned> = [Transport::NvlinkStore, Transport::NvlinkTma, Transport::NvshmemPut, Transport::Staged]
                .into_iter()
                .map(|transport| Planned::Measure { transport, level })
                .collect();
            plan.push(match &nccl {
                Ok(_) => Planned::Measure { transport: Transport::Nccl, level },
                Err(why) => Planned::Skip { transport: Transport::Nccl, reason: format!("{why}; {NCCL_SKIP_EFFECT}") },
            });
            let placements = vec![(level, Placement::pe(&session, PathPolicy::Auto))];
            let mut m = ExchangeMeasurer { names, plan, placements, nccl, warmup: args.warmup, repeats: args.repeats };
            (calibrate::calibrate(&mut m, &sizes, &host, &created), env.rank == 0, machine)
        }
        _ => {
            let n = gpu::device_count();
            let modules = (0..n.min(2))
                .map(|i| {
                    Ok(Arc::new(KernelModule::load(
                        &gpu::open_device(i)?,
                        &halo::artifacts::KernelArtifacts::locate(halo::artifacts::DEFAULT_ARCH)?,
                    )?))
                })
                .collect::<Result<Vec<_>>>()?;
            let (facts, found) = gpu_facts::local_rank_facts(modules.len(), modules.len())?;
            let pair_level = if modules.len() >= 2 { Some(topology_from_facts(&facts, None)?.distance(0, 1)?) } else { None };
            let names = found.iter().map(|f| f.name.clone()).collect();
            let machine = MachineInfo::collect(None);
            print!("{}", machine.text());
            println!("{} GPU(s) in one process; GPU 0 - GPU 1: {}", modules.len(), pair_level.map_or("-".into(), |l| l.to_string()));
            let nccl = local_nccl(&modules);
            let mut placements = vec![(DistanceLevel::SameGpu, Placement::Local(modules[..1].to_vec()))];
            placements.extend(pair_level.map(|level| (level, Placement::Local(modules[..2].to_vec()))));
            let mut plan = Vec::new();
            for (level, _) in &placements {
                for transport in [Transport::NvlinkStore, Transport::NvlinkTma, Transport::Staged] {
                    plan.push(Planned::Measure { transport, level: *level });
                }
            }
            plan.push(Planned::Skip {
                transport: Transport::NvshmemPut,
                reason: "needs one process per GPU: run under `halo launch -n 2 -- calibrate`".into(),
            });
            // NCCL allows one rank per GPU: measured between GPUs 0 and 1 only.
            plan.push(match (&nccl, pair_level) {
                (Ok(_), Some(level)) => Planned::Measure { transport: Transport::Nccl, level },
                (Err(why), _) => Planned::Skip { transport: Transport::Nccl, reason: format!("{why}; {NCCL_SKIP_EFFECT}") },
                (Ok(_), None) => {
                    Planned::Skip { transport: Transport::Nccl, reason: format!("NCCL needs two GPUs (one rank per GPU); {NCCL_SKIP_EFFECT}") }
                }
            });
            let mut m = ExchangeMeasurer { names, plan, placements, nccl, warmup: args.warmup, repeats: args.repeats };
            (calibrate::calibrate(&mut m, &sizes, &host, &created), true, Some(machine))
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
    for (t, level, bytes, why) in &report.failed {
        println!("{:>12} at {level} {}: check FAILED: {why}", t.name(), halo::route::format_size(*bytes));
    }
    if !report.failed.is_empty() {
        bail!(
            "{} point(s) failed their check against the CPU reference: no calibration file written (their times are not results)",
            report.failed.len()
        );
    }
    if writer {
        calibrate::write_calibration(&args.out, &report.file).with_context(|| format!("writing {}", args.out.display()))?;
        println!("wrote {} ({} points); use it with HALO_ROUTE_CALIBRATION={}", args.out.display(), report.file.entries.len(), args.out.display());
        // The machine beside the calibration (its format belongs to the router).
        if let Some(m) = machine {
            let path = machine_path(&args.out);
            std::fs::write(&path, serde_json::to_string_pretty(&m)?).with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {} (the machine it was measured on)", path.display());
        }
    }
    Ok(())
}

/// `calibration.json` -> `calibration.machine.json`.
fn machine_path(out: &std::path::Path) -> PathBuf {
    let stem = out.file_stem().map_or_else(|| "calibration".into(), |s| s.to_string_lossy().into_owned());
    out.with_file_name(format!("{stem}.machine.json"))
}

#[cfg(test)]
mod machine_tests {
    #[test]
    fn the_machine_goes_beside_the_calibration() {
        assert_eq!(super::machine_path(std::path::Path::new("/t/calibration.json")), std::path::Path::new("/t/calibration.machine.json"));
        assert_eq!(super::machine_path(std::path::Path::new("cal")), std::path::Path::new("cal.machine.json"));
    }
}
