//! `halo exchange-check`: runs the halo exchange alone on synthetic halos and checks every step
//! against the CPU reference. In one process (several ranks over the visible GPUs) or, under
//! `halo launch`/mpirun/srun, one rank per process over NVSHMEM.

use super::perturb::PerturbArgs;
use crate::bench::graph::Phase;
use anyhow::{Context, Result, bail};
use halo::abi::Float3;
use halo::exchange::pe::PathPolicy;
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::perturb::{self, JitterStats};
use halo::exchange::{Placement, RankHalo, Transport, heap, reference};
use halo::gpu::{self, DeviceMemory, KernelModule};
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
    /// What each step exchanges: x (coordinates only), f (forces only) or xf (both, a full
    /// step). Checked steps compare what was exchanged.
    #[arg(long, default_value = "xf", value_parser = parse_phase)]
    phase: Phase,
    /// Check every N steps (fresh data, then compare); the steps between only exchange, so a long
    /// run (a soak) exercises the protocol at full speed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    check_every: u64,
    /// Transports to check (comma-separated); default: all that can run here.
    #[arg(long, value_delimiter = ',', value_parser = super::transport_parser())]
    transport: Vec<Transport>,
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
    #[command(flatten)]
    perturb: PerturbArgs,
}

/// `x`, `f` or `xf` -> the phase (the benchmark's phases: coordinates, forces, the full step).
pub fn parse_phase(s: &str) -> Result<Phase, String> {
    match s.trim() {
        "x" => Ok(Phase::Coordinates),
        "f" => Ok(Phase::Forces),
        "xf" => Ok(Phase::Step),
        other => Err(format!("`{other}` is not a phase: x (coordinates only), f (forces only) or xf (both)")),
    }
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Coordinates => "x",
        Phase::Forces => "f",
        Phase::Step => "xf",
    }
}

/// The router's per-rank plans, the exchange transport they imply, and the routers (for the summary).
struct Routing {
    plans: Vec<halo::route::RoutedPaths>,
    transport: Transport,
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
    if let Some(j) = args.perturb.install()?.and_then(|p| p.jitter()) {
        if u64::from(j.max_us) >= args.wait_timeout_ms.saturating_mul(1000) {
            bail!(
                "the jitter (up to {} µs) is not shorter than the device wait deadline (--wait-timeout-ms {}): a delayed rank would look dead; \
                 use less jitter or a longer deadline",
                j.max_us,
                args.wait_timeout_ms
            );
        }
    }
    let shape = SyntheticShape { grid: args.grid, pulses_per_dim: args.pulses, home_atoms: args.home_atoms, send_fraction: args.fraction, box_len: 7.7 };
    let halos = synthetic::halos(shape, args.seed);
    let env = RankEnv::from_env();
    match env {
        Some(env) if env.nranks > 1 => run_pes(&args, halos, env),
        _ => run_local(&args, halos),
    }
}

fn transports(args: &ExchangeCheckArgs, nvshmem: bool) -> Vec<Transport> {
    if !args.transport.is_empty() {
        return args.transport.clone();
    }
    Transport::ALL.into_iter().filter(|t| nvshmem || !t.needs_nvshmem()).filter(|t| !(args.force_put && t.needs_direct_peers())).collect()
}

/// Largest force error (relative to max(|reference|, 1): accumulated sums of O(1) terms may
/// cancel, so their rounding is measured against the terms' scale), or an error naming the first
/// coordinate mismatch.
fn compare(rank: usize, step: u64, x: &[Float3], want_x: Option<&[Float3]>, f: &[Float3], want_f: Option<&[Float3]>) -> Result<f64> {
    for (what, got, want) in [("coordinates", x.len(), want_x.map(<[_]>::len)), ("forces", f.len(), want_f.map(<[_]>::len))] {
        if want.is_some_and(|n| n != got) {
            bail!("rank {rank} step {step}: {got} {what} read back, the CPU reference has {}", want.unwrap_or(0));
        }
    }
    let (want_x, want_f) = (want_x.unwrap_or_default(), want_f.unwrap_or_default());
    if let Some(i) = (0..want_x.len()).find(|&i| x[i].x.to_bits() != want_x[i].x.to_bits() || x[i].y.to_bits() != want_x[i].y.to_bits() || x[i].z.to_bits() != want_x[i].z.to_bits()) {
        bail!("rank {rank} step {step}: coordinate of atom {i} is {:?}, the CPU reference says {:?}", x[i], want_x[i]);
    }
    let mut worst = 0.0f64;
    for (i, (a, b)) in f.iter().zip(want_f).enumerate() {
        for (u, v) in [(a.x, b.x), (a.y, b.y), (a.z, b.z)] {
            let err = ((u - v).abs() as f64) / (v.abs() as f64).max(1.0);
            if !err.is_finite() || err > 1e-5 {
                bail!("rank {rank} step {step}: force of atom {i} is {a:?}, the CPU reference says {b:?}");
            }
            worst = worst.max(err);
        }
    }
    Ok(worst)
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
    // Test only (HALO_TEST_RESERVE_GIB=G[:R]): hold device memory first; in one process R names the GPU.
    let _held = modules.iter().enumerate().map(|(g, m)| heap::reserve_for_test(m.context(), g)).collect::<halo::Result<Vec<_>>>()?;
    println!("{} ranks in one process on {} GPU(s), {} pulses per rank", halos.len(), modules.len(), halos[0].pulses.len());
    let routing = if args.route || !args.route_override.is_empty() { Some(route_local(args, &halos, modules.len())?) } else { None };
    check(args, &halos, &Placement::Local(modules), routing, false)
}

fn run_pes(args: &ExchangeCheckArgs, halos: Vec<RankHalo>, env: RankEnv) -> Result<()> {
    let session = PeSession::start(env, args.nvshmem_lib.as_deref()).context("starting NVSHMEM")?;
    let me = session.nvshmem.my_pe();
    let _held = heap::reserve_for_test(&session.ctx, me)?; // test only: HALO_TEST_RESERVE_GIB
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
    check(args, &halos, &Placement::pe(&session, policy), routing, true)
}

/// Every transport of the list on the ranks `placement` puts here: fresh random data every
/// `--check-every` steps, exchanged both ways and compared with the CPU reference on every local
/// rank; the steps between only exchange.
fn check(args: &ExchangeCheckArgs, halos: &[RankHalo], placement: &Placement, routing: Option<Routing>, nvshmem: bool) -> Result<()> {
    let list = match &routing {
        Some(r) if args.transport.is_empty() => vec![r.transport],
        _ => transports(args, nvshmem),
    };
    let mut jitter_before = JitterStats::default();
    for transport in list {
        let mut x = placement.exchange::<Float3>(halos.to_vec())?;
        x.set_wait_timeout(Duration::from_millis(args.wait_timeout_ms));
        if let Err(e) = x.check_transport(transport) {
            println!("{:>16}: skipped here: {e}", transport.name());
            continue;
        }
        // Test only: the rank that never launches (its peers must time out with a clear error).
        let silent = x.local_ranks().iter().any(|r| Some(r.rank()) == args.inject_skip_rank);
        let (mut worst, mut checked, mut exchange_syncs) = (0.0f64, 0u64, 0u64);
        let started = std::time::Instant::now();
        for step in 0..args.steps {
            let check = step % args.check_every == 0;
            let (home, forces) = if check {
                // Between checks only the exchange runs; the X -> F chain of consecutive steps
                // orders the ranks without a host barrier.
                x.finish().with_context(|| format!("{} before step {step}", transport.name()))?;
                x.barrier()?;
                checked += 1;
                let home = synthetic::random_values(halos, args.seed * 1_000_003 + step, true);
                let forces = synthetic::random_values(halos, args.seed * 7_000_003 + step, false);
                for rank in x.local_ranks() {
                    rank.x.fill_bytes(0xFF)?;
                    rank.upload_coordinates(&home[rank.rank()])?;
                    rank.f.copy_from_host(&forces[rank.rank()])?;
                }
                x.barrier()?; // every PE's inputs are in place before anyone exchanges
                (home, forces)
            } else {
                (Vec::new(), Vec::new())
            };
            let before = x.host_syncs();
            if !silent {
                args.phase.repeat(1, |forces| if forces { x.exchange_reverse_accumulate(transport) } else { x.exchange_forward(transport) })?;
            }
            exchange_syncs += x.host_syncs() - before;
            if !check {
                continue;
            }
            x.finish().with_context(|| format!("{} step {step}", transport.name()))?;
            // Only what this phase exchanged is compared.
            let want_x = (args.phase != Phase::Forces).then(|| reference::coordinates(halos, &home));
            let want_f = (args.phase != Phase::Coordinates).then(|| reference::forces(halos, &forces));
            let (xs, fs) = (x.read_forward()?, x.read_reverse()?);
            for (i, rank) in x.local_ranks().iter().enumerate() {
                let r = rank.rank();
                let (wx, wf) = (want_x.as_ref().map(|w| w[r].as_slice()), want_f.as_ref().map(|w| w[r].as_slice()));
                worst = worst.max(compare(r, step, &xs[i], wx, &fs[i], wf)?);
            }
            x.barrier()?; // nobody overwrites a peer's halo before it has been checked
        }
        x.finish()?;
        let took = started.elapsed().as_secs_f64();
        let compared = match args.phase {
            Phase::Coordinates => "coordinates bit-exact".to_string(),
            Phase::Forces => format!("forces max rel err {worst:.1e}"),
            Phase::Step => format!("coordinates bit-exact, forces max rel err {worst:.1e}"),
        };
        println!(
            "{:>16}: {} steps ({}) in {took:.2} s ({:.1} µs per step, checks included), {checked} checked, OK on {} ({compared}), {exchange_syncs} host syncs in the exchange",
            transport.name(),
            args.steps,
            phase_name(args.phase),
            took * 1e6 / args.steps.max(1) as f64,
            if nvshmem { "this PE".to_string() } else { format!("all {} ranks", halos.len()) },
        );
        if let Some(p) = perturb::process()?.filter(|p| p.jitter().is_some()) {
            let now = p.stats();
            println!("{:>16}: {}", transport.name(), now.since(&jitter_before));
            jitter_before = now;
        }
    }
    if let Some(r) = routing {
        debug_assert_eq!(r.plans.len(), r.routers.len());
        for router in &r.routers {
            println!("{}", router.summary());
        }
    }
    Ok(())
}
