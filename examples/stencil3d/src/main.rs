//! `stencil3d`: a 3-D Jacobi heat-diffusion stencil whose face halos go through halo's exchange,
//! verified against the undecomposed grid on the CPU and timed per step for every transport.
//!
//! ```text
//! stencil3d --grid 64x64x64 --ranks 2x2x2 --iterations 100 --transport fused,staged [--gpus N]
//! halo launch -n 2 --exe stencil3d -- --grid 64x64x64 --ranks 2x1x1 --transport fused,per-pulse,staged
//! ```
//!
//! Without a launcher's environment every rank runs in this process (on `--gpus` GPUs); under
//! `halo launch --exe` (or mpirun/srun) each process is one rank over NVSHMEM.

use anyhow::{Context, Result, bail};
use clap::Parser;
use halo::exchange::Transport;
use halo::launch::RankEnv;
use std::process::ExitCode;
use std::sync::Arc;
use stencil3d::gpu::{RunConfig, TransportReport};
use stencil3d::reference::InitialField;

#[derive(Parser, Debug)]
#[command(name = "stencil3d", about = "3-D Jacobi stencil over halo's exchange, checked against the CPU")]
struct Args {
    /// Global grid, NXxNYxNZ.
    #[arg(long, default_value = "64x64x64", value_parser = parse_triple)]
    grid: [usize; 3],
    /// Rank grid, AxBxC (1-D to 3-D; sizes need not divide the grid).
    #[arg(long, default_value = "2x2x2", value_parser = parse_triple)]
    ranks: [usize; 3],
    /// Steps before the check, and steps per timing window.
    #[arg(long, default_value_t = 100)]
    iterations: usize,
    /// Transports (comma-separated): staged, direct-copy, per-pulse, per-pulse-direct, fused, fused-tma.
    /// Default: every one that can run here.
    #[arg(long, value_delimiter = ',')]
    transport: Vec<Transport>,
    /// GPUs to spread the ranks over when they all run in this process (rank r on GPU r % N).
    #[arg(long, default_value_t = 1)]
    gpus: usize,
    /// Diffusion number (stable up to 1/6).
    #[arg(long, default_value_t = 0.1)]
    alpha: f32,
    /// Initial field: `random` (seeded by --seed) or `hotspot`.
    #[arg(long, default_value = "random")]
    init: String,
    /// Seed of the random initial field.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Timing windows per transport (median reported; 0: verify only).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Accepted absolute difference from the CPU (default 0: bit-exact, which is what the kernel
    /// guarantees; see `stencil3d::gpu`).
    #[arg(long, default_value_t = 0.0)]
    tolerance: f32,
}

fn parse_triple(s: &str) -> Result<[usize; 3], String> {
    let parts: Vec<usize> =
        s.split('x').map(|p| p.trim().parse::<usize>()).collect::<Result<_, _>>().map_err(|_| format!("`{s}` is not like 64x64x64"))?;
    match parts.as_slice() {
        [a, b, c] if *a > 0 && *b > 0 && *c > 0 => Ok([*a, *b, *c]),
        _ => Err(format!("`{s}` is not three positive sizes like 64x64x64")),
    }
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stencil3d: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn config(args: &Args) -> Result<RunConfig> {
    let init = match args.init.as_str() {
        "random" => InitialField::Random(args.seed),
        "hotspot" => InitialField::HotSpot,
        other => bail!("--init {other}: expected `random` or `hotspot`"),
    };
    if !(args.alpha.is_finite() && args.alpha > 0.0) {
        bail!("--alpha must be a positive number, not {}", args.alpha);
    }
    if !(args.tolerance.is_finite() && args.tolerance >= 0.0) {
        bail!("--tolerance must be a non-negative number, not {}", args.tolerance);
    }
    Ok(RunConfig {
        grid: args.grid,
        ranks: args.ranks,
        iterations: args.iterations,
        alpha: args.alpha,
        init,
        repeats: args.repeats,
        tolerance: args.tolerance,
    })
}

fn run(args: Args) -> Result<()> {
    let cfg = config(&args)?;
    // Check the decomposition before touching a GPU: a bad shape is reported the same everywhere.
    let decomp = stencil3d::decomp::Decomposition::new(cfg.grid, cfg.ranks)?;
    if let Some(reason) = halo::gpu::gpu_unavailable_reason() {
        bail!("stencil3d needs a GPU: {reason}");
    }
    match RankEnv::from_env() {
        Some(env) if env.nranks > 1 => run_pes(&args, &cfg, env),
        _ => run_local(&args, &cfg, decomp.nranks()),
    }
}

fn transports(args: &Args, nvshmem: bool) -> Vec<Transport> {
    if !args.transport.is_empty() {
        return args.transport.clone();
    }
    Transport::ALL.into_iter().filter(|t| nvshmem || !t.needs_nvshmem()).collect()
}

fn run_local(args: &Args, cfg: &RunConfig, nranks: usize) -> Result<()> {
    let present = halo::gpu::device_count();
    if args.gpus == 0 || args.gpus > present {
        bail!("--gpus {}: {present} GPU(s) present", args.gpus);
    }
    let artifacts = halo::artifacts::KernelArtifacts::locate(halo::artifacts::DEFAULT_ARCH)?;
    let modules =
        (0..args.gpus).map(|i| Ok(Arc::new(halo::gpu::KernelModule::load(&halo::gpu::open_device(i)?, &artifacts)?))).collect::<Result<Vec<_>>>()?;
    println!(
        "stencil3d: grid {:?}, {nranks} ranks {:?} in one process on {} GPU(s), {} steps, alpha {}, {:?}",
        cfg.grid, cfg.ranks, args.gpus, cfg.iterations, cfg.alpha, cfg.init
    );
    let reports = stencil3d::gpu::run_local(cfg, &modules, &transports(args, false)).context("stencil run")?;
    print_reports(&reports, cfg);
    Ok(())
}

fn run_pes(args: &Args, cfg: &RunConfig, env: RankEnv) -> Result<()> {
    let session = halo::session::PeSession::start(env, None).context("starting NVSHMEM")?;
    let me = session.nvshmem.my_pe();
    println!(
        "stencil3d: PE {me} of {} on GPU {}, grid {:?}, ranks {:?}, {} steps",
        session.nvshmem.n_pes(),
        session.ctx.ordinal(),
        cfg.grid,
        cfg.ranks,
        cfg.iterations
    );
    let results = stencil3d::gpu::run_pe(cfg, &session, &transports(args, true)).context("stencil run")?;
    let mut ok = Vec::new();
    for r in results {
        match r {
            Ok(rep) => ok.push(rep),
            Err(skipped) => println!("{skipped}"),
        }
    }
    print_reports(&ok, cfg);
    Ok(())
}

fn print_reports(reports: &[TransportReport], cfg: &RunConfig) {
    let staged = reports.iter().find(|r| r.transport == Transport::Staged).and_then(TransportReport::median_ms);
    for r in reports {
        let check =
            if r.bit_exact() { "bit-exact".to_string() } else { format!("max abs err {:e} (tolerance {:e})", r.max_abs_err(), cfg.tolerance) };
        let time = match (r.median_ms(), staged) {
            (Some(t), Some(s)) if r.transport != Transport::Staged => {
                format!("{:.4} ms/step (median of {}), {:.2}x faster than staged", t, r.ms_per_step.len(), s / t)
            }
            (Some(t), _) => format!("{:.4} ms/step (median of {})", t, r.ms_per_step.len()),
            (None, _) => "not timed".into(),
        };
        println!("{:>16}: OK on {} rank(s) after {} steps, {check}; {time}", r.transport.name(), r.errors.len(), cfg.iterations);
    }
}
