//! `halo exchange-check`: runs the halo exchange alone on synthetic halos and checks every step
//! against the CPU reference, for every transport (and the NCCL baseline), optionally with the
//! step captured as a CUDA graph and replayed. In one process (several ranks over the visible
//! GPUs) or, under `halo launch`/mpirun/srun, one rank per process over NVSHMEM. Paths are the
//! router's by default, with failures fed back and agreed at safe points (`HALO_INJECT_FAILURE`
//! makes one on purpose). The log starts with the machine ([`crate::machine::MachineInfo`]).

use super::perturb::PerturbArgs;
use crate::bench::graph::{Phase, PhaseGraphs};
use crate::bench::pecomm::PeComm;
use crate::bench::runner::NcclSetup;
use crate::bench::step::{self, Stepper};
use crate::bench::{Method, Variant, nccl};
use anyhow::{Context, Result, bail};
use halo::abi::Float3;
use halo::exchange::pe::PathPolicy;
use halo::exchange::perturb::{self, JitterStats};
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{Placement, RankHalo, Routing, heap, reference};
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
    /// What each step exchanges: x (coordinates only), f (forces only) or xf (both, a full
    /// step). Checked steps compare what was exchanged.
    #[arg(long, default_value = "xf", value_parser = parse_phase)]
    phase: Phase,
    /// Check every N steps (fresh data, then compare); the steps between only exchange, so a long
    /// run (a soak) exercises the protocol at full speed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    check_every: u64,
    /// Transports to check, comma-separated (staged, direct-copy, nccl, per-pulse,
    /// per-pulse-direct, fused, fused-tma) or all; default: all that can run here (with routed
    /// paths: the exchange kernel the router's choices imply).
    #[arg(long, value_parser = super::bench::parse_method_list)]
    transport: Option<super::bench::MethodList>,
    /// Also check every capturable transport (GPU-initiated ones and nccl) with the step captured
    /// once as a CUDA graph and replayed every step.
    #[arg(long)]
    graph: bool,
    /// Use NVSHMEM put + signal for every pulse, even between NVLink peers (the same as `--paths force-put`).
    #[arg(long)]
    force_put: bool,
    /// How pulses reach their peers: `routed` (the router decides per peer and pulse; failures
    /// are fed back and agreed at safe points), `auto` (stores wherever mapped, puts elsewhere),
    /// `force-put`.
    #[arg(long, default_value = "routed", value_parser = parse_paths)]
    paths: PathPolicy,
    /// Seed of the synthetic halo and data.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Deadline of every device wait, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    wait_timeout_ms: u64,
    /// Test only: this rank never launches its coordinate halo (a missing signal), so the others
    /// must time out with a clear error (failures then end the run instead of failing over).
    #[arg(long, hide = true)]
    inject_skip_rank: Option<usize>,
    /// NVSHMEM host library to use (default: discovered).
    #[arg(long)]
    nvshmem_lib: Option<std::path::PathBuf>,
    /// Kept for scripts: routing is the default (`--paths routed`). HALO_FORCE_TRANSPORT is
    /// honoured, HALO_ROUTE_DEBUG=1 prints the decisions; without --transport the exchange kernel
    /// follows from the router's choices.
    #[arg(long)]
    route: bool,
    /// Force a transport for one pair, both directions: 0-1=nvshmem-put (repeatable).
    #[arg(long = "route-override", value_name = "A-B=TRANSPORT")]
    route_override: Vec<String>,
    /// Routed paths: a safe point (every PE agrees on the failures seen; pairs switch together)
    /// after every N steps (default: --check-every, or HALO_SAFE_POINT_EVERY). A quiet safe point
    /// costs one small all-gather.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    safe_point_every: Option<u64>,
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

fn parse_paths(s: &str) -> Result<PathPolicy, String> {
    PathPolicy::parse(s).map_err(|e| e.to_string())
}

impl ExchangeCheckArgs {
    /// The path policy the flags ask for (`--force-put` wins over `--paths`).
    fn policy(&self) -> PathPolicy {
        if self.force_put { PathPolicy::ForcePut } else { self.paths }
    }
}

/// The router of this run (routed paths) and its first plans, printed (one line per local rank).
fn start_routing(args: &ExchangeCheckArgs, halos: &[RankHalo], placement: &Placement) -> Result<Routing> {
    let mut routing = Routing::new(placement, halos.len(), &args.route_override).context("starting the router")?;
    routing.plan::<Float3>(halos).context("planning the paths")?;
    for line in routing.describe()? {
        println!("{line}");
    }
    println!("route: exchange kernel from the router's choices: {}", routing.transport()?.name());
    Ok(routing)
}

/// `2x2x1` -> `[2, 2, 1]`.
pub fn parse_grid(s: &str) -> Result<[usize; 3], String> {
    let parts: Vec<usize> =
        s.split('x').map(|p| p.trim().parse::<usize>()).collect::<Result<_, _>>().map_err(|_| format!("`{s}` is not a rank grid like 2x2x1"))?;
    match parts.as_slice() {
        [a, b, c] if *a > 0 && *b > 0 && *c > 0 => Ok([*a, *b, *c]),
        _ => Err(format!("`{s}` is not a rank grid like 2x2x1 (three positive counts)")),
    }
}

pub fn run(args: ExchangeCheckArgs) -> Result<()> {
    if let Some(j) = args.perturb.install()?.and_then(|p| p.jitter())
        && u64::from(j.max_us) >= args.wait_timeout_ms.saturating_mul(1000)
    {
        bail!(
            "the jitter (up to {} µs) is not shorter than the device wait deadline (--wait-timeout-ms {}): a delayed rank would look dead; \
             use less jitter or a longer deadline",
            j.max_us,
            args.wait_timeout_ms
        );
    }
    let shape =
        SyntheticShape { grid: args.grid, pulses_per_dim: args.pulses, home_atoms: args.home_atoms, send_fraction: args.fraction, box_len: 7.7 };
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
    let force_put = args.policy() == PathPolicy::ForcePut;
    Method::ALL.into_iter().filter(|m| nvshmem || !m.needs_nvshmem()).filter(|m| !(force_put && m.needs_direct_peers())).collect()
}

fn run_local(args: &ExchangeCheckArgs, halos: Vec<RankHalo>) -> Result<()> {
    if let Some(reason) = gpu::gpu_unavailable_reason() {
        bail!("halo exchange-check needs a GPU: {reason}");
    }
    if args.inject_skip_rank.is_some() {
        bail!(
            "--inject-skip-rank needs one process per rank (`halo launch -n N -- exchange-check ...`): in one process every rank launches together"
        );
    }
    if args.policy() == PathPolicy::ForcePut {
        bail!("--paths force-put needs NVSHMEM: run one rank per GPU (`halo launch -n N -- exchange-check --paths force-put`)");
    }
    let artifacts = halo::artifacts::KernelArtifacts::locate(halo::artifacts::DEFAULT_ARCH)?;
    let modules =
        (0..gpu::device_count()).map(|i| Ok(Arc::new(KernelModule::load(&gpu::open_device(i)?, &artifacts)?))).collect::<Result<Vec<_>>>()?;
    // Test only (HALO_TEST_RESERVE_GIB=G[:R]): hold device memory first; in one process R names the GPU.
    let _held = modules.iter().enumerate().map(|(g, m)| heap::reserve_for_test(m.context(), g)).collect::<halo::Result<Vec<_>>>()?;
    print!("{}", crate::machine::MachineInfo::collect(None).text());
    println!(
        "{} ranks in one process on {} GPU(s), {} pulses per rank, paths: {}",
        halos.len(),
        modules.len(),
        halos[0].pulses.len(),
        args.policy().name()
    );
    let placement = Placement::Local(modules.clone()).with_policy(args.policy());
    let routing = if args.policy() == PathPolicy::Routed { Some(start_routing(args, &halos, &placement)?) } else { None };
    let nranks = halos.len();
    let mut setup = NcclSetup::default();
    check(args, &halos, &placement, routing, false, &mut || setup.get(|| nccl::setup_local(&modules, nranks)))
}

fn run_pes(args: &ExchangeCheckArgs, halos: Vec<RankHalo>, env: RankEnv) -> Result<()> {
    let launcher = env.source;
    let session = PeSession::start(env, args.nvshmem_lib.as_deref()).context("starting NVSHMEM")?;
    let me = session.nvshmem.my_pe();
    let _held = heap::reserve_for_test(&session.ctx, me)?; // test only: HALO_TEST_RESERVE_GIB
    if me == 0 {
        print!("{}", crate::machine::MachineInfo::collect(Some(&session.nvshmem)).text());
    }
    println!(
        "PE {me} of {} (pid {}) on GPU {} ({}), started by {launcher}, NVSHMEM {:?} from {}, paths: {}, host data gathered by {}",
        session.nvshmem.n_pes(),
        std::process::id(),
        session.ctx.ordinal(),
        session.ctx.name()?,
        session.nvshmem.version(),
        session.nvshmem.library_path().display(),
        args.policy().name(),
        session.nvshmem.gather_path().describe()
    );
    let placement = Placement::pe(&session, args.policy());
    let routing = if args.policy() == PathPolicy::Routed { Some(start_routing(args, &halos, &placement)?) } else { None };
    let wants_nccl = methods(args, true).contains(&Method::Nccl) && (args.transport.is_some() || routing.is_none());
    // NCCL's unique id travels over the symmetric heap (collective: every PE has the same list).
    let comm = if wants_nccl { Some(PeComm::new(session.nvshmem.clone(), 64)?) } else { None };
    let mut setup = NcclSetup::default();
    let mut nccl = || match &comm {
        Some(c) => setup.get(|| nccl::setup_pe(&session, c)),
        None => Err("NCCL was not asked for".into()),
    };
    check(args, &halos, &placement, routing, true, &mut nccl)
}

/// NCCL for the NCCL method, set up once per run (or why it cannot run).
type NcclSource<'a> = dyn FnMut() -> std::result::Result<nccl::NcclComms, String> + 'a;

/// One exchange of the run (from the router's plans when routing), the method it runs and, for a
/// `+graph` variant, the step captured once (dropped before the exchange whose buffers it uses).
struct Run {
    graphs: Vec<PhaseGraphs>,
    s: Stepper,
    variant: Variant,
}

impl Run {
    /// `Ok(Err(why))` when the variant cannot run here (the same verdict on every PE).
    fn build(
        args: &ExchangeCheckArgs,
        halos: &[RankHalo],
        placement: &Placement,
        routing: Option<&Routing>,
        variant: Variant,
        nccl: &mut NcclSource<'_>,
    ) -> Result<std::result::Result<Self, String>> {
        let mut x = match routing {
            Some(r) => placement.exchange_planned::<Float3>(halos.to_vec(), r.plans())?,
            None => placement.exchange::<Float3>(halos.to_vec())?,
        };
        x.set_wait_timeout(Duration::from_millis(args.wait_timeout_ms));
        if let Some(Err(e)) = variant.method.transport().map(|t| x.check_transport(t)) {
            return Ok(Err(e.to_string()));
        }
        let comms = match variant.method {
            Method::Nccl => match nccl() {
                Ok(c) => Some(c),
                Err(why) => return Ok(Err(why)),
            },
            _ => None,
        };
        let mut s = Stepper::new(x, comms);
        let graphs = if variant.graph { s.capture(variant.method).with_context(|| format!("capturing {}", variant.name()))? } else { Vec::new() };
        Ok(Ok(Self { graphs, s, variant }))
    }

    /// One step of `phase`: enqueued (or run, for the host-driven transports), or one replay.
    fn launch(&mut self, phase: Phase) -> halo::Result<()> {
        if self.variant.graph { Stepper::replay(&self.graphs, phase, 1) } else { self.s.enqueue(self.variant.method, phase, 1) }
    }
}

/// Checked-step counters: largest force error, checked steps, host syncs in the exchange.
#[derive(Clone, Copy, Default)]
struct Tally {
    worst: f64,
    checked: u64,
    syncs: u64,
}

impl Tally {
    fn add(&mut self, o: Tally) {
        *self = Tally { worst: self.worst.max(o.worst), checked: self.checked + o.checked, syncs: self.syncs + o.syncs };
    }
}

/// A failed finish: with failover, a failure to agree on at the next safe point; otherwise (or
/// for any error that is not a device wait timeout) the end of the run.
fn settle(e: halo::HaloError, routing: &mut Option<Routing>, failover: bool, what: String) -> Result<()> {
    let recorded = failover && routing.as_mut().is_some_and(|r| r.record_error(&e));
    if recorded { Ok(()) } else { Err(anyhow::Error::new(e).context(what)) }
}

/// Every transport of the list on the ranks `placement` puts here: fresh random data every
/// `--check-every` steps, exchanged both ways and compared with the CPU reference on every local
/// rank; the steps between only exchange. With routing, failures (an injected one, a launch that
/// fails, a device wait that times out) are recorded and agreed at safe points; when some PE's
/// step failed or a pair switched, every PE rebuilds the exchange from the new plans and runs the
/// steps since the last good safe point again.
fn check(
    args: &ExchangeCheckArgs,
    halos: &[RankHalo],
    placement: &Placement,
    mut routing: Option<Routing>,
    nvshmem: bool,
    nccl: &mut NcclSource<'_>,
) -> Result<()> {
    let list = match &routing {
        Some(r) if args.transport.is_none() => vec![Method::of(r.transport()?)],
        _ => methods(args, nvshmem),
    };
    let follow_router = routing.is_some() && args.transport.is_none();
    // The hidden skip test checks the timeout message: failures end the run there.
    let failover = routing.is_some() && args.inject_skip_rank.is_none();
    let every = match args.safe_point_every {
        Some(n) => n,
        None => halo::exchange::routing::safe_point_every_from_env(args.check_every)?,
    };
    let who = if nvshmem { "this PE".to_string() } else { format!("all {} ranks", halos.len()) };
    let mut jitter_before = JitterStats::default();
    for first in Variant::list(&list, args.graph) {
        let mut run = match Run::build(args, halos, placement, routing.as_ref(), first, nccl)? {
            Ok(run) => run,
            Err(why) => {
                println!("{:>16}: skipped here: {why}", first.name());
                continue;
            }
        };
        // Test only: the rank that never launches (its peers must time out with a clear error).
        let silent = run.s.x.local_ranks().iter().any(|r| Some(r.rank()) == args.inject_skip_rank);
        // `done`: steps up to the last good safe point; `window`: the steps since.
        let (mut done, mut window) = (Tally::default(), Tally::default());
        let (mut good, mut attempts, mut reruns) = (0u64, 0u32, 0u64);
        let mut mismatch: Option<anyhow::Error> = None;
        let mut kernels = vec![first.name()];
        let started = std::time::Instant::now();
        let mut step = 0u64;
        while step < args.steps {
            let v = run.variant; // its name only for messages
            let check = step.is_multiple_of(args.check_every);
            let (home, forces) = if check {
                // Between checks only the exchange runs; the X -> F chain of consecutive steps
                // orders the ranks without a host barrier.
                if let Err(e) = run.s.x.finish() {
                    settle(e, &mut routing, failover, format!("{} before step {step}", v.name()))?;
                }
                window.checked += 1;
                let home = synthetic::random_values(halos, args.seed * 1_000_003 + step, true);
                let forces = synthetic::random_values(halos, args.seed * 7_000_003 + step, false);
                run.s.upload(&home, &forces)?; // between barriers: every PE's inputs are in place
                (home, forces)
            } else {
                (Vec::new(), Vec::new())
            };
            // An injected failure skips this step's launches here (ranks of one process launch
            // together) and is recorded as a failed launch; the peers' waits then time out.
            let injected = routing.as_ref().map_or_else(Vec::new, |r| r.injected(step));
            let before = run.s.x.host_syncs();
            if injected.is_empty() && !silent {
                match (run.launch(args.phase), routing.as_mut()) {
                    (Ok(()), _) => {}
                    (Err(e), Some(r)) if failover => {
                        println!("route: step {step}'s launch failed: {e}; recorded for the safe point");
                        r.record_failed_launch(&e);
                    }
                    (Err(e), _) => return Err(anyhow::Error::new(e).context(format!("{} step {step}", v.name()))),
                }
            }
            if let Some(r) = routing.as_mut() {
                for (rank, peers) in &injected {
                    println!(
                        "route: injected failure: rank {rank} skips step {step}'s launch towards {peers:?} ({})",
                        halo::route::feedback::INJECT_ENV
                    );
                    r.record_launch_failure(*rank, peers);
                }
            }
            window.syncs += run.s.x.host_syncs() - before;
            if check {
                match run.s.x.finish() {
                    Ok(()) if routing.as_ref().is_some_and(Routing::failed_here) => {} // this window runs again
                    Ok(()) => {
                        // Only what this phase exchanged is compared.
                        let want_x = (args.phase != Phase::Forces).then(|| reference::coordinates(halos, &home));
                        let want_f = (args.phase != Phase::Coordinates).then(|| reference::forces(halos, &forces));
                        let (xs, fs) = (run.s.x.read_forward()?, run.s.x.read_reverse()?);
                        for (i, rank) in run.s.x.local_ranks().iter().enumerate() {
                            let r = rank.rank();
                            let (wx, wf) = (want_x.as_ref().map(|w| w[r].as_slice()), want_f.as_ref().map(|w| w[r].as_slice()));
                            // A wrong coordinate is named by its pulse and sender too.
                            let named = |why: String| match wx.map(|w| reference::coordinate_differences(&halos[r], &xs[i], w)) {
                                Some(d) if d.atoms > 0 => format!("{why}; rank {r}: {d}"),
                                _ => why,
                            };
                            match step::compare(r, &xs[i], wx, &fs[i], wf).map_err(|why| anyhow::anyhow!("{} step {step}: {}", v.name(), named(why)))
                            {
                                Ok(w) => window.worst = window.worst.max(w),
                                // With failover the safe point tells whether a failure on another
                                // PE explains the mismatch; without, it ends the run.
                                Err(e) if failover => {
                                    mismatch.get_or_insert(e);
                                }
                                Err(e) => return Err(e),
                            }
                        }
                    }
                    Err(e) => settle(e, &mut routing, failover, format!("{} step {step}", v.name()))?,
                }
                run.s.x.barrier()?; // nobody overwrites a peer's halo before it has been checked
            }
            let safe_point = failover && ((step + 1).is_multiple_of(every) || step + 1 == args.steps);
            if !safe_point {
                step += 1;
                continue;
            }
            // The exchange is idle at a safe point.
            if let Err(e) = run.s.x.finish() {
                settle(e, &mut routing, failover, format!("{} step {step}", v.name()))?;
            }
            let Some(r) = routing.as_mut() else { bail!("a safe point without a router") };
            let sp = r.safe_point()?;
            if sp.rerun {
                attempts += 1;
                reruns += 1;
                let switched: Vec<String> = sp
                    .switched
                    .iter()
                    .map(|(a, b, from, to)| format!("{a}-{b} {} -> {}", from.map_or("none", |t| t.name()), to.map_or("none", |t| t.name())))
                    .collect();
                println!(
                    "route: safe point after step {step}: {} failure report(s) agreed{}; rebuilding the exchange and running steps {good}..={step} again",
                    sp.reported,
                    if switched.is_empty() { String::new() } else { format!(", pairs switched: {}", switched.join(", ")) }
                );
                if attempts > halo::exchange::routing::MAX_RERUNS {
                    bail!("steps {good}..={step} failed {attempts} times in a row; giving up (see the failures above)");
                }
                for line in r.describe()? {
                    println!("{line}");
                }
                let method = if follow_router { Method::of(r.transport()?) } else { run.variant.method };
                let next = Variant { method, graph: run.variant.graph };
                // Every PE is alive and idle here: reset the failed exchange together (collective,
                // fenced by barriers), so it is dropped as a healthy one and its symmetric buffers
                // are freed collectively, in the same order on every PE.
                run.s.x.reset_protocol().context("resetting the failed exchange before the rebuild")?;
                drop(run);
                run = match Run::build(args, halos, placement, Some(r), next, nccl)? {
                    Ok(run) => run,
                    Err(why) => bail!("the new plans cannot run {}: {why}", next.name()),
                };
                if !kernels.contains(&next.name()) {
                    kernels.push(next.name());
                }
                window = Tally::default();
                mismatch = None;
                step = good;
                continue;
            }
            if let Some(m) = mismatch.take() {
                return Err(m.context("no PE reported a failure, so this is a wrong result"));
            }
            done.add(window);
            window = Tally::default();
            good = step + 1;
            attempts = 0;
            step += 1;
        }
        done.add(window);
        run.s.x.finish()?;
        let took = started.elapsed().as_secs_f64();
        let names: Vec<&str> = kernels.iter().map(String::as_str).collect();
        let compared = match args.phase {
            Phase::Coordinates => "coordinates bit-exact".to_string(),
            Phase::Forces => format!("forces max rel err {:.1e}", done.worst),
            Phase::Step => format!("coordinates bit-exact, forces max rel err {:.1e}", done.worst),
        };
        println!(
            "{:>16}: {} steps ({}) in {took:.2} s ({:.1} µs per step, checks included), {} checked, OK on {who} ({compared}), {} host syncs in the exchange{}",
            names.join(" -> "),
            args.steps,
            phase_name(args.phase),
            took * 1e6 / args.steps.max(1) as f64,
            done.checked,
            done.syncs,
            if reruns > 0 { format!(", {reruns} re-run(s) after agreed failures") } else { String::new() },
        );
        if let Some(p) = perturb::process()?.filter(|p| p.jitter().is_some()) {
            let now = p.stats();
            println!("{:>16}: {}", names.join(" -> "), now.since(&jitter_before));
            jitter_before = now;
        }
    }
    if let Some(r) = &routing {
        for line in r.describe()? {
            println!("{line}");
        }
        for line in r.finish_lines() {
            println!("{line}");
        }
    }
    Ok(())
}
