//! `halo exchange-check`: runs the halo exchange alone on synthetic halos and checks every step
//! against the CPU reference, for every transport (and the NCCL baseline), optionally with the
//! step captured as a CUDA graph and replayed. In one process (several ranks over the visible
//! GPUs) or, under `halo launch`/mpirun/srun, one rank per process over NVSHMEM.

use crate::bench::graph::PhaseGraphs;
use crate::bench::pecomm::PeComm;
use crate::bench::runner::NcclSetup;
use crate::bench::step::Stepper;
use crate::bench::{Method, Variant, graph::Phase, nccl};
use anyhow::{Context, Result, bail};
use halo::exchange::pe::PathPolicy;
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{Placement, RankHalo};
use halo::gpu::{self, KernelModule};
use halo::launch::RankEnv;
use halo::session::PeSession;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ExchangeCheckArgs {
    /// Rank grid, e.g. 2x1x1 or 2x2x2.
    #[arg(long, default_value = "2x1x1", value_parser = parse_grid)]
    grid: [usize; 3],
    /// Pulses per decomposed dimension.
    #[arg(long, default_value_t = 1)]
    pulses: usize,
    /// Home atoms per rank.
    #[arg(long, default_value_t = 3000)]
    home_atoms: usize,
    /// Fraction of candidate atoms each pulse sends.
    #[arg(long, default_value_t = 0.35)]
    fraction: f64,
    /// Checked steps per transport.
    #[arg(long, default_value_t = 100)]
    steps: u64,
    /// Check every N steps (fresh data, then compare); the steps between only exchange, so a long
    /// run (a soak) exercises the protocol at full speed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    check_every: u64,
    /// Transports to check, comma-separated (staged, direct-copy, nccl, per-pulse,
    /// per-pulse-direct, fused, fused-tma) or all; default: all that can run here.
    #[arg(long, value_parser = super::bench::parse_method_list)]
    transport: Option<super::bench::MethodList>,
    /// Also check every capturable transport (GPU-initiated ones and nccl) with the step captured
    /// once as a CUDA graph and replayed every step.
    #[arg(long)]
    graph: bool,
    /// Use NVSHMEM put + signal for every pulse, even between NVLink peers.
    #[arg(long)]
    force_put: bool,
    /// Seed of the synthetic halo and data.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Deadline of every device wait, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    wait_timeout_ms: u64,
    /// Test only: this rank never launches its coordinate halo (a missing signal), so the others
    /// must time out with a clear error.
    #[arg(long, hide = true)]
    inject_skip_rank: Option<usize>,
    /// NVSHMEM host library to use (default: discovered).
    #[arg(long)]
    nvshmem_lib: Option<std::path::PathBuf>,
    /// Let the transport router choose each peer's path from each pulse's size (topology from the
    /// discovered GPUs; HALO_FORCE_TRANSPORT honoured; HALO_ROUTE_DEBUG=1 prints the decisions).
    /// Without --transport, the exchange kernel follows from the router's choices.
    #[arg(long)]
    route: bool,
    /// Force a transport for one pair, both directions: 0-1=nvshmem-put (repeatable; implies --route).
    #[arg(long = "route-override", value_name = "A-B=TRANSPORT")]
    route_override: Vec<String>,
}

/// The router's per-rank plans, the exchange transport they imply, and the routers (for the summary).
struct Routing {
    plans: Vec<halo::route::RoutedPaths>,
    transport: halo::exchange::Transport,
    routers: Vec<halo::route::Router>,
}

/// Prints the plan's decisions when HALO_ROUTE_DEBUG is on.
fn print_plan(router: &halo::route::Router, plan: &halo::route::RoutedPaths) {
    if router.config().debug.value {
        for line in plan.describe() {
            println!("{line}");
        }
    }
}

/// Plans every rank of this process (rank r on GPU r % gpus) with its own router.
fn route_local(args: &ExchangeCheckArgs, halos: &[RankHalo], gpus: usize) -> Result<Routing> {
    use halo::route::{gpu_facts, paths};
    let (facts, _) = gpu_facts::local_rank_facts(halos.len(), gpus).context("discovering the GPUs")?;
    let local = paths::plan_local_ranks::<halo::abi::Float3>(&facts, halos, &paths::route_config(&args.route_override)?)?;
    for (router, plan) in local.routers.iter().zip(&local.plans) {
        print_plan(router, plan);
    }
    println!("route: topology {}, exchange kernel from the router's choices: {}", local.routers[0].topology(), local.transport.name());
    Ok(Routing { plans: local.plans, transport: local.transport, routers: local.routers })
}

/// Plans this PE with a router over the facts gathered from every PE, and checks both ends agree.
fn route_pe(args: &ExchangeCheckArgs, halos: &[RankHalo], me: usize, ordinal: usize) -> Result<Routing> {
    use halo::route::{RoutedPaths, gpu_facts, paths};
    let found = gpu_facts::discover(ordinal).with_context(|| format!("discovering GPU {ordinal}"))?;
    let facts = gpu_facts::gather("route-facts", &found.facts)?;
    let mut router = paths::router_from_facts(me, &facts, &args.route_override)?;
    let plan = RoutedPaths::plan(&mut router, halos)?;
    print_plan(&router, &plan);
    plan.mirror_check(&router, halos)?;
    let all = gpu_facts::gather_json("route-paths", &plan)?;
    RoutedPaths::check_symmetric(&all)?;
    let transport = RoutedPaths::exchange_transport(&all, true)?;
    println!("route: PE {me} topology {}, paths {plan:?}, exchange kernel: {}", router.topology(), transport.name());
    Ok(Routing { plans: vec![plan], transport, routers: vec![router] })
}

/// `2x2x1` -> `[2, 2, 1]`.
pub fn parse_grid(s: &str) -> Result<[usize; 3], String> {
    let parts: Vec<usize> = s.split('x').map(|p| p.trim().parse::<usize>()).collect::<Result<_, _>>().map_err(|_| format!("`{s}` is not a rank grid like 2x2x1"))?;
    match parts.as_slice() {
        [a, b, c] if *a > 0 && *b > 0 && *c > 0 => Ok([*a, *b, *c]),
        _ => Err(format!("`{s}` is not a rank grid like 2x2x1 (three positive counts)")),
    }
}

pub fn run(args: ExchangeCheckArgs) -> Result<()> {
    let shape = SyntheticShape { grid: args.grid, pulses_per_dim: args.pulses, home_atoms: args.home_atoms, send_fraction: args.fraction, box_len: 7.7 };
    let halos = synthetic::halos(shape, args.seed);
    let env = RankEnv::from_env();
    match env {
        Some(env) if env.nranks > 1 => run_pes(&args, halos, env),
        _ => run_local(&args, halos),
    }
}

fn methods(args: &ExchangeCheckArgs, nvshmem: bool) -> Vec<Method> {
    if let Some(list) = &args.transport {
        return list.0.clone();
    }
    Method::ALL.into_iter().filter(|m| nvshmem || !m.needs_nvshmem()).filter(|m| !(args.force_put && m.needs_direct_peers())).collect()
}

fn run_local(args: &ExchangeCheckArgs, halos: Vec<RankHalo>) -> Result<()> {
    if let Some(reason) = gpu::gpu_unavailable_reason() {
        bail!("halo exchange-check needs a GPU: {reason}");
    }
    if args.inject_skip_rank.is_some() {
        bail!("--inject-skip-rank needs one process per rank (`halo launch -n N -- exchange-check ...`): in one process every rank launches together");
    }
    let artifacts = halo::artifacts::KernelArtifacts::locate(halo::artifacts::DEFAULT_ARCH)?;
    let modules = (0..gpu::device_count())
        .map(|i| Ok(Arc::new(KernelModule::load(&gpu::open_device(i)?, &artifacts)?)))
        .collect::<Result<Vec<_>>>()?;
    print!("{}", crate::machine::MachineInfo::collect(None).text());
    println!("{} ranks in one process on {} GPU(s), {} pulses per rank", halos.len(), modules.len(), halos[0].pulses.len());
    let routing = if args.route || !args.route_override.is_empty() { Some(route_local(args, &halos, modules.len())?) } else { None };
    let nranks = halos.len();
    let mut setup = NcclSetup::default();
    let placement = Placement::Local(modules.clone());
    check(args, &halos, &placement, routing, false, &mut || setup.get(|| nccl::setup_local(&modules, nranks)))
}

fn run_pes(args: &ExchangeCheckArgs, halos: Vec<RankHalo>, env: RankEnv) -> Result<()> {
    let session = PeSession::start(env, args.nvshmem_lib.as_deref()).context("starting NVSHMEM")?;
    let me = session.nvshmem.my_pe();
    if me == 0 {
        print!("{}", crate::machine::MachineInfo::collect(Some(&session.nvshmem)).text());
    }
    let routing = if args.route || !args.route_override.is_empty() { Some(route_pe(args, &halos, me, session.ctx.ordinal())?) } else { None };
    let policy = match &routing {
        Some(r) => PathPolicy::Routed(r.plans[0].clone().leak()),
        None if args.force_put => PathPolicy::ForcePut,
        None => PathPolicy::Auto,
    };
    println!(
        "PE {me} of {} on GPU {} ({}), NVSHMEM {:?} from {}, paths: {policy:?}",
        session.nvshmem.n_pes(),
        session.ctx.ordinal(),
        session.ctx.name()?,
        session.nvshmem.version(),
        session.nvshmem.library_path().display()
    );
    let wants_nccl = methods(args, true).contains(&Method::Nccl) && (args.transport.is_some() || routing.is_none());
    // NCCL's unique id travels over the symmetric heap (collective: every PE has the same list).
    let comm = if wants_nccl { Some(PeComm::new(session.nvshmem.clone(), 64)?) } else { None };
    let mut setup = NcclSetup::default();
    let mut nccl = || match &comm {
        Some(c) => setup.get(|| nccl::setup_pe(&session, c)),
        None => Err("NCCL was not asked for".into()),
    };
    check(args, &halos, &Placement::pe(&session, policy), routing, true, &mut nccl)
}

/// Every method of the list (and its captured form with `--graph`) on the ranks `placement`
/// puts here: fresh random data every `--check-every` steps, exchanged both ways and compared
/// with the CPU reference on every local rank; the steps between only exchange.
fn check(
    args: &ExchangeCheckArgs,
    halos: &[RankHalo],
    placement: &Placement,
    routing: Option<Routing>,
    nvshmem: bool,
    nccl: &mut dyn FnMut() -> std::result::Result<nccl::NcclComms, String>,
) -> Result<()> {
    let list = match &routing {
        Some(r) if args.transport.is_none() => vec![Method::of(r.transport)],
        _ => methods(args, nvshmem),
    };
    let here = if nvshmem { "this PE".to_string() } else { format!("all {} ranks", halos.len()) };
    for variant in Variant::list(&list, args.graph) {
        let name = variant.name();
        let mut x = placement.exchange(halos.to_vec())?;
        x.set_wait_timeout(Duration::from_millis(args.wait_timeout_ms));
        if let Some(Err(e)) = variant.method.transport().map(|t| x.check_transport(t)) {
            println!("{name:>20}: skipped here: {e}");
            continue;
        }
        let comms = if variant.method == Method::Nccl {
            match nccl() {
                Ok(c) => Some(c),
                Err(why) => {
                    println!("{name:>20}: skipped here: {why}");
                    continue;
                }
            }
        } else {
            None
        };
        let mut stepper = Stepper::new(x, comms);
        let graphs: Vec<PhaseGraphs> = if variant.graph { stepper.capture(variant.method).with_context(|| format!("capturing {name}"))? } else { Vec::new() };
        // Test only: the rank that never launches (its peers must time out with a clear error).
        let silent = stepper.x.local_ranks().iter().any(|r| Some(r.rank()) == args.inject_skip_rank);
        let (mut worst, mut checked, mut exchange_syncs) = (0.0f64, 0u64, 0u64);
        for step in 0..args.steps {
            let check = step % args.check_every == 0;
            let data = if check {
                // Between checks only the exchange runs; the X -> F chain of consecutive steps
                // orders the ranks without a host barrier.
                let home = synthetic::random_values(halos, args.seed * 1_000_003 + step, true);
                let forces = synthetic::random_values(halos, args.seed * 7_000_003 + step, false);
                stepper.fill(&home, &forces).with_context(|| format!("{name} before step {step}"))?;
                checked += 1;
                Some((home, forces))
            } else {
                None
            };
            let before = stepper.x.host_syncs();
            if !silent {
                if variant.graph { Stepper::replay(&graphs, Phase::Step, 1) } else { stepper.enqueue(variant.method, Phase::Step, 1) }
                    .with_context(|| format!("{name} step {step}"))?;
            }
            exchange_syncs += stepper.x.host_syncs() - before;
            if let Some((home, forces)) = data {
                let err = stepper.compare_step(halos, &home, &forces).with_context(|| format!("{name} step {step}"))?;
                worst = worst.max(err.map_err(|why| anyhow::anyhow!("{name} step {step}: {why}"))?);
            }
        }
        stepper.x.finish()?;
        drop(graphs);
        println!(
            "{name:>20}: {} steps, {checked} checked, OK on {here} (coordinates bit-exact, forces max rel err {worst:.1e}), {exchange_syncs} host syncs in the exchange",
            args.steps,
        );
    }
    if let Some(r) = routing {
        debug_assert_eq!(r.plans.len(), r.routers.len());
        for router in &r.routers {
            println!("{}", router.summary());
        }
    }
    Ok(())
}
