//! `halo verify`: the mini-MD step on the GPUs, checked against the undecomposed CPU reference.

use anyhow::{Context, Result, bail};
use halo::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use halo::decomp::RankGrid;
use halo::exchange::Transport;
use halo::exchange::pe::PathPolicy;
use halo::gpu::{self, KernelModule};
use halo::launch::RankEnv;
use halo_md::{self as md, MdConfig, MdOutcome};
use halo::session::PeSession;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Clone)]
pub struct VerifyArgs {
    /// Atoms in the synthetic liquid (about 100 per nm³).
    #[arg(long, default_value_t = 6000)]
    pub atoms: usize,
    /// Rank grid, e.g. 2x1x1 or 2x2x2. Under `halo launch -n N` it must have N ranks.
    #[arg(long, default_value = "2x1x1")]
    pub ranks: RankGrid,
    /// Interaction cutoff (nm).
    #[arg(long, default_value_t = 1.0)]
    pub cutoff: f32,
    /// Pair-list buffer beyond the cutoff (nm).
    #[arg(long, default_value_t = 0.1)]
    pub buffer: f32,
    /// Steps between re-decompositions.
    #[arg(long, default_value_t = 10)]
    pub nstlist: u64,
    /// Steps to run.
    #[arg(long, default_value_t = 100)]
    pub steps: u64,
    /// Time step (ps).
    #[arg(long, default_value_t = 0.002)]
    pub dt: f32,
    /// Halo transport.
    #[arg(long, default_value = "fused", value_parser = super::transport_parser())]
    pub transport: Transport,
    /// Check every N steps (1: every step; 0: never, and time the steps instead).
    #[arg(long, default_value_t = 1)]
    pub check_every: u64,
    /// Seed of the system.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Deadline of every device wait, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub wait_timeout_ms: u64,
    /// NVSHMEM put + signal for every pulse, even between NVLink peers (several processes only;
    /// the same as `--paths force-put`).
    #[arg(long)]
    pub force_put: bool,
    /// How pulses reach their peers: `routed` (the router decides; failures are agreed at safe
    /// points, every search and checked step, and the window since the last search step runs
    /// again), `auto` (stores wherever mapped, puts elsewhere), `force-put`. Per-pair overrides:
    /// HALO_ROUTE_OVERRIDE, HALO_FORCE_TRANSPORT; HALO_INJECT_FAILURE makes a transport fail.
    #[arg(long, default_value = "routed", value_parser = |s: &str| PathPolicy::parse(s).map_err(|e| e.to_string()))]
    pub paths: PathPolicy,
    /// GPUs to spread the ranks over in one process (default: all visible).
    #[arg(long)]
    pub gpus: Option<usize>,
}

impl VerifyArgs {
    fn config(&self) -> MdConfig {
        MdConfig {
            atoms: self.atoms,
            grid: self.ranks,
            cutoff: self.cutoff,
            buffer: self.buffer,
            nstlist: self.nstlist,
            dt: self.dt,
            steps: self.steps,
            seed: self.seed,
            transport: self.transport,
            check_every: self.check_every,
            wait_timeout: Duration::from_millis(self.wait_timeout_ms),
            path_policy: if self.force_put { PathPolicy::ForcePut } else { self.paths },
        }
    }
}

fn report(args: &VerifyArgs, who: &str, o: &MdOutcome) {
    for r in &o.routes {
        println!("route: {r}");
    }
    if o.reruns > 0 {
        println!("{who}: {} window(s) of steps ran again after agreed failures", o.reruns);
    }
    if let Some(us) = o.median_step_us() {
        let mut v = o.window_step_us.clone();
        v.sort_by(f64::total_cmp);
        println!(
            "{who}: MD step time {us:.1} µs median [{:.1}-{:.1}] over {} windows of steps between searches \
             (GPU timeline of rank 0; search steps excluded): {:.0} ns/day at {} fs",
            v[0],
            v[v.len() - 1],
            v.len(),
            86_400.0 * 1e6 / us * f64::from(args.dt) * 1e-3,
            args.dt * 1000.0
        );
    }
    println!(
        "{who}: {} atoms, {} ranks ({}), {}: {} steps, {} checked against the CPU reference, {} re-decompositions, {} pairs; \
         coordinates after the halo: max abs err {:.1e} (bit-exact: {}); forces vs undecomposed: max rel err {:.2e}, max abs err {:.2e} kJ/mol/nm; {:.2} s",
        args.atoms,
        args.ranks.num_ranks(),
        args.ranks,
        args.transport.name(),
        o.steps,
        o.checked_steps,
        o.rebuilds,
        o.pairs,
        o.worst.coord_max_abs,
        o.worst.coord_max_abs == 0.0,
        o.worst.force_max_rel,
        o.worst.force_max_abs,
        o.wall.as_secs_f64()
    );
}

pub fn run(args: VerifyArgs) -> Result<()> {
    let cfg = args.config();
    if let Some(env) = RankEnv::from_env().filter(|e| e.nranks > 1) {
        if env.nranks != args.ranks.num_ranks() {
            bail!(
                "--ranks {} has {} ranks but {} processes were started: start {} (`halo launch -n {}`, `mpiexec -n {}`)",
                args.ranks,
                args.ranks.num_ranks(),
                env.nranks,
                args.ranks.num_ranks(),
                args.ranks.num_ranks(),
                args.ranks.num_ranks()
            );
        }
        let rank = env.rank;
        println!("PE {rank} of {} started by {} ({} bootstrap), paths: {}", env.nranks, env.source, env.bootstrap.describe(), cfg.path_policy.name());
        let session = PeSession::start(env, None).context("starting NVSHMEM")?;
        let outcome = md::run_pe(&cfg, &session, |_, _| {}).with_context(|| format!("rank {rank}"))?;
        report(&args, &format!("PE {rank}"), &outcome);
        return Ok(());
    }
    if let Some(reason) = gpu::gpu_unavailable_reason() {
        bail!("halo verify needs an NVIDIA GPU: {reason}");
    }
    let artifacts = KernelArtifacts::locate(DEFAULT_ARCH)?;
    let n = args.gpus.unwrap_or_else(gpu::device_count).clamp(1, gpu::device_count());
    let modules = (0..n).map(|i| Ok(Arc::new(KernelModule::load(&gpu::open_device(i)?, &artifacts)?))).collect::<Result<Vec<_>>>()?;
    let outcome = md::run_local(&cfg, &modules, |_, _| {})?;
    report(&args, &format!("one process on {n} GPU(s)"), &outcome);
    Ok(())
}
