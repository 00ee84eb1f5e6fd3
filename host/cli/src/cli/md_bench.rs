//! `halo md-bench`: ns/day of the whole MD step per transport and system size, every step counted
//! (search steps included). In one process on the visible GPUs (one rank per GPU), or under
//! `halo launch -n N -- md-bench` with one PE per GPU (rank 0 prints; every rank gets the same
//! options). Every row runs checked steps outside its timed ones; a row that fails them or does not
//! complete makes the command fail, naming the row, after the table and the JSON are written.

use crate::bench::md::{self, MdBenchConfig, MdBenchDoc, MdBenchRow, Target};
use crate::machine::MachineInfo;
use anyhow::{Context, Result, bail};
use halo::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use halo::decomp::RankGrid;
use halo::exchange::{Placement, Transport};
use halo::gpu::{self, KernelModule};
use halo::launch::RankEnv;
use halo::session::PeSession;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args, Clone, Debug)]
pub struct MdBenchArgs {
    /// The step's options.
    #[command(flatten)]
    pub step: super::verify::StepArgs,
    /// System sizes in atoms, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "6000,45000,180000")]
    pub atoms: Vec<usize>,
    /// Transports, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "fused,staged", value_parser = super::transport_parser())]
    pub transport: Vec<Transport>,
    /// Rank grid (default: one rank per GPU along x, e.g. 2x1x1; under `halo launch -n N`, Nx1x1).
    #[arg(long)]
    pub ranks: Option<RankGrid>,
    /// GPUs to use in one process (default: all visible).
    #[arg(long)]
    pub gpus: Option<usize>,
    /// Timed steps per repeat, a multiple of --nstlist (search steps included).
    #[arg(long, default_value_t = 1000)]
    pub steps: u64,
    /// Timed repeats (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Untimed warm-up steps (rounded up to a multiple of --nstlist).
    #[arg(long, default_value_t = 200)]
    pub warmup: u64,
    /// Also run every GPU-initiated transport with its steps replayed as CUDA graphs (all but those
    /// that sum energies or are checked: plain and prune steps, one graph each per search interval).
    #[arg(long)]
    pub graph: bool,
    /// After each row's timed steps (without graphs), time the phases of two list lifetimes' steps
    /// on the GPU with events on every rank's streams, and print where a step's time goes (local
    /// and non-local forces, coordinate and force halo, integration, the GPU's idle time between
    /// steps); in the JSON as each row's `phases`. Not timed: the events end the overlap of
    /// consecutive kernels.
    #[arg(long)]
    pub phases: bool,
    /// Record where each search step's host time goes during the timed repeats, part by part (the
    /// library's `search.*` spans: the redecomposition and its collectives, local atoms, the GPU
    /// grid and lists, the replan, the uploads), and print the medians per process; in the JSON
    /// as each row's `search_parts`. Costs a clock read per part.
    #[arg(long)]
    pub search_parts: bool,
    /// Write the rows to this file (JSON: `schema_version` and `rows`, a list of objects).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// NVSHMEM host library to use (default: discovered).
    #[arg(long)]
    pub nvshmem_lib: Option<PathBuf>,
}

impl MdBenchArgs {
    /// Checks the step counts (as `halo md-bench` does before it starts).
    pub(super) fn validate(&self) -> Result<()> {
        Ok(self.config().validate()?)
    }

    fn config(&self) -> MdBenchConfig {
        MdBenchConfig {
            steps: self.steps,
            repeats: self.repeats,
            warmup: self.warmup,
            step: self.step.clone(),
            graph: false,
            phases: self.phases,
            search_parts: self.search_parts,
        }
    }
}

/// Every size and transport on `target`; returns the rows (printing progress when `print`).
fn measure_all(args: &MdBenchArgs, target: &Target<'_>, grid: RankGrid, print: bool) -> Vec<MdBenchRow> {
    let cfg = args.config();
    let mut rows = Vec::new();
    for &atoms in &args.atoms {
        let variants = args.transport.iter().flat_map(|&t| {
            let graph = (args.graph && t.gpu_initiated()).then_some((t, true));
            [(t, false)].into_iter().chain(graph)
        });
        for (t, graph) in variants {
            let row = md::measure(&MdBenchConfig { graph, ..cfg.clone() }, target, grid, atoms, t);
            if print {
                let name = if graph { format!("{t}+graph") } else { t.to_string() };
                match (&row.skipped, &row.check_failure, row.step_us_median) {
                    (Some(why), _, _) => eprintln!("md-bench: {atoms} atoms, {name}: skipped: {why}"),
                    (None, Some(why), _) => eprintln!("md-bench: {atoms} atoms, {name}: FAILED check: {why}"),
                    (None, None, Some(us)) if row.checked => eprintln!("md-bench: {atoms} atoms, {name}: {us:.1} us per step, checked"),
                    _ => {}
                }
            }
            rows.push(row);
        }
    }
    rows
}

fn write(args: &MdBenchArgs, rows: &[MdBenchRow]) -> Result<()> {
    if let Some(r) = rows.first() {
        print!("{}", r.machine.text());
    }
    print!("{}", md::table(rows));
    if let Some(path) = &args.json {
        let doc = MdBenchDoc::new(rows.to_vec());
        let text = serde_json::to_string_pretty(&doc)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

pub fn run(args: MdBenchArgs) -> Result<()> {
    args.config().validate()?;
    if args.atoms.is_empty() || args.transport.is_empty() {
        bail!("give at least one size (--atoms) and one transport (--transport)");
    }
    if let Some(env) = RankEnv::from_env().filter(|e| e.nranks > 1) {
        let (rank, n) = (env.rank, env.nranks);
        let grid = args.ranks.unwrap_or(RankGrid { dims: [n, 1, 1] });
        if grid.num_ranks() != n {
            bail!("--ranks {grid} has {} ranks but {n} processes were started: use `halo launch -n {}`", grid.num_ranks(), grid.num_ranks());
        }
        let device = env.device;
        let session = PeSession::start(env, args.nvshmem_lib.as_deref()).context("starting NVSHMEM")?;
        let placement = Placement::pe(&session, args.step.paths);
        let devices = placement.all_gather("md-bench-devices", vec![(device as u64).to_le_bytes().to_vec()])?;
        let mut distinct: Vec<&Vec<u8>> = devices.iter().collect();
        distinct.sort();
        distinct.dedup();
        let machine = MachineInfo::collect(Some(&session.nvshmem));
        let mode =
            if distinct.len() == n { format!("{n} PEs (NVSHMEM), one per GPU") } else { format!("{n} PEs (NVSHMEM) on {} GPU(s)", distinct.len()) };
        let target = Target { placement: &placement, gpus: distinct.len(), mode, machine: &machine };
        let rows = measure_all(&args, &target, grid, rank == 0);
        if rank == 0 {
            write(&args, &rows)?;
        }
        return passed(&rows).with_context(|| format!("rank {rank}"));
    }
    let rows = local_rows(&args)?;
    write(&args, &rows)?;
    passed(&rows)
}

/// Every row of `args` in this process on its GPUs (printing progress), without writing them.
pub(super) fn local_rows(args: &MdBenchArgs) -> Result<Vec<MdBenchRow>> {
    if let Some(reason) = gpu::gpu_unavailable_reason() {
        bail!("halo md-bench needs an NVIDIA GPU: {reason}");
    }
    let artifacts = KernelArtifacts::locate(DEFAULT_ARCH)?;
    let n = args.gpus.unwrap_or_else(gpu::device_count).clamp(1, gpu::device_count());
    let modules = (0..n).map(|i| Ok(Arc::new(KernelModule::load(&gpu::open_device(i)?, &artifacts)?))).collect::<Result<Vec<_>>>()?;
    let grid = args.ranks.unwrap_or(RankGrid { dims: [n, 1, 1] });
    let placement = Placement::Local(modules).with_policy(args.step.paths);
    let machine = MachineInfo::collect(None);
    let target = Target { placement: &placement, gpus: n.min(grid.num_ranks()), mode: "one process".into(), machine: &machine };
    Ok(measure_all(args, &target, grid, true))
}

/// An error naming every row that failed its checks or did not complete.
fn passed(rows: &[MdBenchRow]) -> Result<()> {
    match md::failures(rows) {
        Some(why) => bail!("md-bench: {why}"),
        None => Ok(()),
    }
}
