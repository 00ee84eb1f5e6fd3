//! `halo verify`: the mini-MD step on the GPUs, checked against the undecomposed CPU reference, with
//! the total energy from the GPU and (with `--nve-steps`) the energy drift of an NVE run beside the
//! same run on one rank.

use crate::machine::MachineInfo;
use anyhow::{Context, Result, bail};
use halo::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use halo::decomp::RankGrid;
use halo::exchange::pe::PathPolicy;
use halo::exchange::{Placement, Transport};
use halo::gpu::{self, KernelModule};
use halo::launch::RankEnv;
use halo::session::PeSession;
use halo_md::nbnxm::DEFAULT_DRIFT_TOLERANCE;
use halo_md::{self as md, IntegrationStream, MdConfig, MdOutcome, MdRun, Redecompose};
use std::sync::Arc;
use std::time::Duration;

/// The MD step's options that `halo verify` and `halo md-bench` share.
#[derive(clap::Args, Clone, Debug)]
pub struct StepArgs {
    /// Interaction cutoff (nm); the LJ potential is shifted to zero there.
    #[arg(long, default_value_t = 1.0)]
    pub cutoff: f32,
    /// Tolerance of the buffer rule: the energy drift (kJ/mol/ps per atom) that the pairs a list
    /// misses may cause (GROMACS's verlet-buffer-tolerance).
    #[arg(long, default_value_t = DEFAULT_DRIFT_TOLERANCE)]
    pub buffer_tolerance: f64,
    /// Steps between searches (re-decomposition and new cluster-pair lists).
    #[arg(long, default_value_t = 100)]
    pub nstlist: u64,
    /// Steps between GPU prunes of the inner lists (the buffer rule sizes the inner list for it;
    /// 50 was fastest on an H200 at 6,000 to 180,000 atoms: docs/benchmarks.md).
    #[arg(long, default_value_t = 50)]
    pub nstprune: u64,
    /// Time step (ps).
    #[arg(long, default_value_t = 0.002)]
    pub dt: f32,
    /// Host threads of the pair search (0: the default: one per PE, four when one process drives every rank; measured on the H200 host).
    #[arg(long, default_value_t = 0)]
    pub search_threads: usize,
    /// Search the cluster-pair lists on host threads instead of the GPU (the same lists).
    #[arg(long)]
    pub host_search: bool,
    /// On one rank, sort the cluster grid on the host at every search (gather, wrap, plan, grid,
    /// upload) instead of searching entirely on the GPU (the same grid and lists).
    #[arg(long)]
    pub host_grid: bool,
    /// With several ranks, where a search's redecomposition runs its per-atom passes (wrap,
    /// owners, merge, first-pulse selection): `gpu` (only leavers, selections, ids and positions
    /// cross to the host), `host` (every home atom read back) or `auto` (the GPUs from 10,000 home
    /// atoms per rank). The same plan either way.
    #[arg(long, default_value = "auto", value_parser = |s: &str| Redecompose::parse(s).map_err(|e| e.to_string()))]
    pub redecompose: Redecompose,
    /// Which of a rank's two streams integrates a step with halo work: `halo` (the force halo, the
    /// integration and the next coordinate halo follow one another there; the faster as 2 PEs
    /// sharing one GPU), `local` (the home–home forces and the integration follow one another
    /// there; the faster with two ranks in one process on one GPU) or `auto` (`halo` for one PE
    /// per process, `local` for one process driving several ranks). docs/benchmarks.md has the
    /// numbers.
    #[arg(long, default_value = "auto", value_parser = |s: &str| IntegrationStream::parse_choice(s).map(IntegrateOn).map_err(|e| e.to_string()))]
    pub integrate_on: IntegrateOn,
    /// Deadline of every device wait, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub wait_timeout_ms: u64,
    /// How pulses reach their peers: `routed` (the router decides; failures are agreed at safe
    /// points, every search and checked step, and the steps since the last search step run
    /// again), `auto` (stores wherever mapped, puts elsewhere), `force-put`. Per-pair overrides:
    /// HALO_ROUTE_OVERRIDE, HALO_FORCE_TRANSPORT; HALO_INJECT_FAILURE makes a transport fail.
    #[arg(long, default_value = "routed", value_parser = |s: &str| PathPolicy::parse(s).map_err(|e| e.to_string()))]
    pub paths: PathPolicy,
    /// Put the atoms in an order drawn from the seed instead of lattice order: global ids then
    /// carry no spatial locality, as after a long run in which the atoms diffused (the kernels
    /// read coordinates in the ranks' id order). The same system otherwise.
    #[arg(long)]
    pub shuffle_atoms: bool,
}

/// `--integrate-on`: a stream, or `None` for `auto` ([`IntegrationStream::for_ranks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntegrateOn(pub Option<IntegrationStream>);

impl Default for StepArgs {
    /// The command-line defaults.
    fn default() -> Self {
        Self {
            cutoff: 1.0,
            buffer_tolerance: DEFAULT_DRIFT_TOLERANCE,
            nstlist: 100,
            nstprune: 50,
            dt: 0.002,
            search_threads: 0,
            host_search: false,
            host_grid: false,
            redecompose: Redecompose::Auto,
            integrate_on: IntegrateOn(None),
            wait_timeout_ms: 5000,
            paths: PathPolicy::Routed,
            shuffle_atoms: false,
        }
    }
}

impl StepArgs {
    /// These options applied to `cfg`.
    pub fn apply(&self, cfg: MdConfig) -> MdConfig {
        MdConfig {
            cutoff: self.cutoff,
            buffer_tolerance: self.buffer_tolerance,
            nstlist: self.nstlist,
            nstprune: self.nstprune,
            dt: self.dt,
            search_threads: self.search_threads,
            gpu_search: !self.host_search,
            resident_search: !self.host_grid,
            redecompose: self.redecompose,
            integrate_on: self.integrate_on.0,
            wait_timeout: Duration::from_millis(self.wait_timeout_ms),
            path_policy: self.paths,
            shuffle_atoms: self.shuffle_atoms,
            ..cfg
        }
    }
}

#[derive(clap::Args, Clone)]
pub struct VerifyArgs {
    /// The step's options.
    #[command(flatten)]
    pub step: StepArgs,
    /// Atoms in the synthetic liquid (about 100 per nm³).
    #[arg(long, default_value_t = 6000)]
    pub atoms: usize,
    /// Rank grid, e.g. 2x1x1 or 2x2x2. Under `halo launch -n N` it must have N ranks.
    #[arg(long, default_value = "2x1x1")]
    pub ranks: RankGrid,
    /// Verlet buffer of the outer list beyond the cutoff (nm). Default: the buffer rule for
    /// nstlist (see --buffer-tolerance).
    #[arg(long)]
    pub buffer: Option<f32>,
    /// Steps to run.
    #[arg(long, default_value_t = 100)]
    pub steps: u64,
    /// Halo transport.
    #[arg(long, default_value = "fused", value_parser = super::transport_parser())]
    pub transport: Transport,
    /// Check every N steps (1: every step; 0: never, and time the steps instead).
    #[arg(long, default_value_t = 1)]
    pub check_every: u64,
    /// Record the GPU's potential and kinetic energy every N steps (0: only on checked steps).
    #[arg(long, default_value_t = 0)]
    pub energy_every: u64,
    /// After the checked run, an NVE run of this many steps (no checks, energy every
    /// --energy-every steps, 100 if 0) on the same decomposition and on one rank: the drift of
    /// the total energy of both.
    #[arg(long)]
    pub nve_steps: Option<u64>,
    /// Seed of the system.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// NVSHMEM put + signal for every pulse, even between NVLink peers (several processes only;
    /// the same as `--paths force-put`).
    #[arg(long)]
    pub force_put: bool,
    /// GPUs to spread the ranks over in one process (default: all visible).
    #[arg(long)]
    pub gpus: Option<usize>,
    /// Replay the steps that neither sum energies nor are checked (plain and prune steps) as CUDA
    /// graphs (GPU-initiated transports).
    #[arg(long)]
    pub graph: bool,
    /// Write the outcome and the machine as JSON (PE 0 under a launcher).
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Test only: jitter and faults (`--fault corrupt-atom:...` and `drop-atom:...` are negative
    /// controls: the checked steps must fail and name the atom).
    #[command(flatten)]
    pub perturb: super::perturb::PerturbArgs,
}

impl VerifyArgs {
    /// The command's defaults for `atoms` atoms on `ranks`.
    pub fn new(atoms: usize, ranks: RankGrid) -> Self {
        Self {
            step: StepArgs::default(),
            atoms,
            ranks,
            buffer: None,
            steps: 100,
            transport: Transport::Fused,
            check_every: 1,
            energy_every: 0,
            nve_steps: None,
            seed: 1,
            force_put: false,
            gpus: None,
            graph: false,
            json: None,
            perturb: super::perturb::PerturbArgs::default(),
        }
    }

    fn config(&self) -> MdConfig {
        let cfg = self.step.apply(MdConfig {
            buffer: self.buffer,
            steps: self.steps,
            seed: self.seed,
            transport: self.transport,
            check_every: self.check_every,
            energy_every: self.energy_every,
            graph: self.graph,
            ..MdConfig::new(self.atoms, self.ranks)
        });
        if self.force_put { MdConfig { path_policy: PathPolicy::ForcePut, ..cfg } } else { cfg }
    }

    /// The NVE run: no checks, energies every `--energy-every` (100 when 0) steps.
    fn nve_config(&self, steps: u64, grid: RankGrid) -> MdConfig {
        MdConfig { steps, grid, check_every: 0, energy_every: if self.energy_every == 0 { 100 } else { self.energy_every }, ..self.config() }
    }
}

/// The report of one run: what was checked (or "not checked"), the energies, the time.
fn report(args: &VerifyArgs, who: &str, o: &MdOutcome) -> String {
    let setup = o.setup.map_or_else(String::new, |s| {
        format!(", rlist {:.3} nm (nstlist {}), inner {:.3} nm (prune every {})", s.rlist, s.nstlist, s.rlist_inner, s.nstprune)
    });
    let mut lines = vec![format!(
        "{who}: {} atoms, {} ranks ({}), {}: {} steps, {} searches ({} exchange builds, {} replans, {} replan barriers){setup}; lists of this process: {} + {} j-cluster words \
         (home-home + with halo, outer), {} + {} warps",
        args.atoms,
        args.ranks.num_ranks(),
        args.ranks,
        args.transport.name(),
        o.steps,
        o.searches,
        o.exchange_builds,
        o.replans,
        o.replan_barriers,
        o.lists.local_words,
        o.lists.nonlocal_words,
        o.lists.local_entries,
        o.lists.nonlocal_entries,
    )];
    if o.checked_steps == 0 {
        lines.push(format!("{who}: not checked (--check-every 0): no coordinate, force or energy was compared with a reference"));
    } else {
        let w = &o.worst;
        let exact = if w.coord_mismatches == 0 { "bit-exact".to_string() } else { format!("NOT bit-exact ({} atoms differ)", w.coord_mismatches) };
        lines.push(format!(
            "{who}: {} steps checked against the CPU reference: coordinates after the halo {exact} (max abs err {:.1e}, {} halo atoms compared); \
             forces vs undecomposed: max err {:.2e} of each atom's scale (tolerance {:.0e}), max abs err {:.2e} kJ/mol/nm; \
             potential energy vs undecomposed: max rel err {:.2e} (tolerance {:.0e})",
            o.checked_steps,
            w.coord_max_abs,
            w.halo_atoms_checked,
            o.worst.force_max_rel,
            md::run::FORCE_TOLERANCE,
            o.worst.force_max_abs,
            o.worst.energy_rel,
            md::run::ENERGY_TOLERANCE,
        ));
    }
    lines.push(format!("{who}: {}", integrity_summary(o)));
    if o.reruns > 0 {
        lines.push(format!("{who}: {} stretch(es) of steps ran again after agreed failures (routed paths)", o.reruns));
    }
    if let Some(e) = o.energies.last() {
        lines.push(format!(
            "{who}: total energy at step {} (GPU): potential {:.3} + kinetic {:.3} = {:.3} kJ/mol ({} energy steps recorded)",
            e.step,
            e.potential,
            e.kinetic,
            e.total(),
            o.energies.len()
        ));
    }
    if o.energies.len() >= 2 {
        lines.push(format!("{who}: {}", drift_line(args, "total energy", o)));
    }
    if let Some(us) = o.step_us().filter(|_| o.checked_steps == 0) {
        lines.push(format!(
            "{who}: {us:.1} µs per step over all {} steps, searches included (host clock); searches {:.1}% of the time \
             ({:.2} ms each: gather {:.2}, plan {:.2}, lists {:.2}, upload {:.2}): {:.0} ns/day at {} fs",
            o.steps,
            100.0 * o.search_share(),
            ms(o.search.total) / o.search.count.max(1) as f64,
            ms(o.search.gather) / o.search.count.max(1) as f64,
            ms(o.search.plan) / o.search.count.max(1) as f64,
            ms(o.search.lists) / o.search.count.max(1) as f64,
            ms(o.search.upload) / o.search.count.max(1) as f64,
            86_400.0 * 1e6 / us * f64::from(args.step.dt) * 1e-3,
            args.step.dt * 1000.0
        ));
    }
    if o.graph_steps > 0 {
        lines.push(format!("{who}: {} steps replayed as CUDA graphs ({:.2} ms capturing)", o.graph_steps, ms(o.graph_capture)));
    }
    if o.failed_checks == 0 {
        lines.push(format!("{who}: {:.2} s", o.wall.as_secs_f64()));
    }
    lines.join("\n")
}

/// The soak's summary line: every checked step compares the checksums of every pulse across ranks
/// (`halo::integrity`) and the coordinates, forces and energy with the CPU references; the count is
/// what those comparisons found ([`md::StepCheck::mismatches`]: a mismatch ends the run, after
/// this report).
fn integrity_summary(o: &MdOutcome) -> String {
    if o.checked_steps == 0 {
        return "integrity: not checked (--check-every 0)".into();
    }
    let w = &o.worst;
    let mut line = format!(
        "integrity: {} checked steps, pulse checksums compared across ranks ({} pulse ranges) and results against the CPU references: {} mismatches",
        o.checked_steps,
        w.pulses_checked,
        w.mismatches()
    );
    if !w.passed() {
        let energy = w.mismatches() - w.halo_mismatches - w.coord_mismatches - w.force_mismatches;
        line += &format!(
            " ({} pulse ranges, {} atoms' coordinates, {} force components, {energy} potential energy)",
            w.halo_mismatches, w.coord_mismatches, w.force_mismatches
        );
    }
    line
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The drift line of an NVE run.
fn drift_line(args: &VerifyArgs, what: &str, o: &MdOutcome) -> String {
    match o.drift(args.atoms, f64::from(args.step.dt), 0) {
        Some(d) => format!(
            "{what}: drift {:+.3e} kJ/mol/ns per atom ({:+.2} kJ/mol/ns total) over {:.1} ps, {} points; mean total energy {:.2} kJ/mol, \
             fluctuation {:.3} kJ/mol",
            d.per_atom_kj_mol_ns, d.total_kj_mol_ns, d.span_ps, d.points, d.mean, d.fluctuation
        ),
        None => format!("{what}: not measured (fewer than two energy points)"),
    }
}

/// `--json`: the run's configuration, outcome and machine. Nothing compared, nothing claimed:
/// the error fields are null when no step was checked; `checked` is true only when steps were
/// checked and none differed (a failed run writes its file too, with the failed step's errors).
fn json(args: &VerifyArgs, who: &str, o: &MdOutcome, machine: &MachineInfo) -> serde_json::Value {
    let ran = o.checked_steps > 0;
    let w = &o.worst;
    serde_json::json!({
        "machine": machine,
        "who": who,
        "atoms": args.atoms,
        "ranks": args.ranks.to_string(),
        "transport": args.transport.name(),
        "graph": args.graph,
        "steps": o.steps,
        "checked_steps": o.checked_steps,
        "checked": ran && o.failed_checks == 0 && w.passed(),
        "failed_checks": o.failed_checks,
        "coordinates_bit_exact": ran.then_some(w.coord_mismatches == 0),
        "coord_max_abs_err": ran.then_some(w.coord_max_abs),
        "coord_mismatches": ran.then_some(w.coord_mismatches),
        "halo_atoms_checked": ran.then_some(w.halo_atoms_checked),
        "force_max_rel_err": ran.then_some(w.force_max_rel),
        "force_max_abs_err": ran.then_some(w.force_max_abs),
        "force_mismatches": ran.then_some(w.force_mismatches),
        "energy_max_rel_err": ran.then_some(w.energy_rel),
        "integrity_mismatches": ran.then_some(w.halo_mismatches),
        "pulses_checked": ran.then_some(w.pulses_checked),
        "mismatches": ran.then_some(w.mismatches()),
        "searches": o.searches,
        "exchange_builds": o.exchange_builds,
        "replans": o.replans,
        "replan_barriers": o.replan_barriers,
        "step_us_host": o.step_us().filter(|_| !ran),
        "search_share": o.search_share(),
        "graph_steps": o.graph_steps,
        "reruns": o.reruns,
        "wall_s": o.wall.as_secs_f64(),
    })
}

fn write_json(path: &std::path::Path, v: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).context("serialising the outcome")?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// The checked run, then (with `--nve-steps`) the NVE runs on `placement` and on one rank (`single`).
/// `machine`: given on the process that reports (it prints the machine first, the outcome, and
/// writes `--json`).
fn verify(args: &VerifyArgs, who: &str, placement: &Placement, single: &Placement, machine: Option<&MachineInfo>) -> Result<()> {
    let print = machine.is_some();
    if let Some(m) = machine {
        print!("{}", m.text());
    }
    let cfg = args.config();
    let mut run = MdRun::new(cfg.clone(), placement.clone())?;
    if let Err(e) = run.run_steps(cfg.steps, &mut |_, _| {}) {
        // A failed check: what it measured (every PE holds every rank's), then the error.
        if run.outcome().failed_checks > 0 {
            if print {
                println!("{}", report(args, who, run.outcome()));
            }
            if let (Some(path), Some(m)) = (&args.json, machine) {
                write_json(path, &json(args, who, run.outcome(), m))?;
            }
        }
        return Err(e.into());
    }
    let outcome = run.finish()?;
    // Every PE: the paths of its own ranks.
    for r in &outcome.routes {
        println!("route: {r}");
    }
    if print {
        println!("{}", report(args, who, &outcome));
    }
    if let (Some(path), Some(m)) = (&args.json, machine) {
        write_json(path, &json(args, who, &outcome, m))?;
    }
    if let Some(steps) = args.nve_steps {
        let decomposed = md::run(&args.nve_config(steps, args.ranks), placement, |_, _| {}).context("the decomposed NVE run")?;
        let one = md::run(&args.nve_config(steps, RankGrid { dims: [1, 1, 1] }), single, |_, _| {}).context("the one-rank NVE run")?;
        if print {
            println!(
                "{who}: NVE, {steps} steps of {} fs, energies every {} steps (GPU potential + kinetic):",
                args.step.dt * 1000.0,
                args.nve_config(steps, args.ranks).energy_every
            );
            println!("  {}", drift_line(args, &format!("{} ranks ({}, {})", args.ranks.num_ranks(), args.ranks, args.transport.name()), &decomposed));
            println!("  {}", drift_line(args, "1 rank", &one));
        }
    }
    Ok(())
}

pub fn run(args: VerifyArgs) -> Result<()> {
    if args.perturb.jitter_us.is_some() || args.perturb.fault.is_some() {
        args.perturb.install()?;
    }
    if args.nve_steps == Some(0) {
        bail!("--nve-steps 0 runs nothing: give at least 2 energy intervals of steps, e.g. --nve-steps 10000");
    }
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
        let policy = args.config().path_policy;
        println!("PE {rank} of {} started by {} ({} bootstrap), paths: {}", env.nranks, env.source, env.bootstrap.describe(), policy.name());
        let session = PeSession::start(env, None).context("starting NVSHMEM")?;
        let placement = Placement::pe(&session, policy);
        // Each PE runs the one-rank comparison on its own GPU at once (no PE waits for another);
        // PE 0 reports, records the machine (and writes --json).
        let single = Placement::Local(vec![session.module.clone()]).with_policy(policy);
        let machine = (rank == 0).then(|| MachineInfo::collect(Some(&session.nvshmem)));
        return verify(&args, &format!("PE {rank}"), &placement, &single, machine.as_ref()).with_context(|| format!("rank {rank}"));
    }
    if let Some(reason) = gpu::gpu_unavailable_reason() {
        bail!("halo verify needs an NVIDIA GPU: {reason}");
    }
    let artifacts = KernelArtifacts::locate(DEFAULT_ARCH)?;
    let n = args.gpus.unwrap_or_else(gpu::device_count).clamp(1, gpu::device_count());
    let modules = (0..n).map(|i| Ok(Arc::new(KernelModule::load(&gpu::open_device(i)?, &artifacts)?))).collect::<Result<Vec<_>>>()?;
    let policy = args.config().path_policy;
    let single = Placement::Local(modules[..1].to_vec()).with_policy(policy);
    let machine = MachineInfo::collect(None);
    verify(&args, &format!("one process on {n} GPU(s)"), &Placement::Local(modules).with_policy(policy), &single, Some(&machine))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_defaults_are_the_command_line_defaults() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            step: StepArgs,
        }
        let parsed = <Cli as clap::Parser>::try_parse_from(["halo"]).unwrap().step;
        assert_eq!(format!("{parsed:?}"), format!("{:?}", StepArgs::default()));
        let cfg = StepArgs { host_search: true, nstlist: 40, ..StepArgs::default() }.apply(MdConfig::new(10, RankGrid { dims: [1, 1, 1] }));
        assert!(!cfg.gpu_search && cfg.nstlist == 40 && cfg.wait_timeout == Duration::from_secs(5));
        assert_eq!(cfg.path_policy, PathPolicy::Routed, "routed paths by default");
        // --force-put wins over --paths.
        let v = VerifyArgs { force_put: true, ..VerifyArgs::new(10, RankGrid { dims: [2, 1, 1] }) };
        assert_eq!(v.config().path_policy, PathPolicy::ForcePut);
        let v = VerifyArgs { step: StepArgs { paths: PathPolicy::Auto, ..StepArgs::default() }, ..VerifyArgs::new(10, RankGrid { dims: [2, 1, 1] }) };
        assert_eq!(v.config().path_policy, PathPolicy::Auto);
        // The integration's stream: chosen by how the ranks are driven unless asked.
        assert_eq!(StepArgs::default().apply(MdConfig::new(10, RankGrid { dims: [2, 1, 1] })).integrate_on, None);
        let local = <Cli as clap::Parser>::try_parse_from(["halo", "--integrate-on", "local"]).unwrap().step;
        assert_eq!(local.apply(MdConfig::new(10, RankGrid { dims: [2, 1, 1] })).integrate_on, Some(IntegrationStream::Local));
        let e = <Cli as clap::Parser>::try_parse_from(["halo", "--integrate-on", "update"]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("choose auto, halo or local"), "{e}");
    }

    #[test]
    fn an_unchecked_run_says_so_and_a_checked_one_gives_its_errors() {
        let args = VerifyArgs { check_every: 0, ..VerifyArgs::new(6000, RankGrid { dims: [2, 1, 1] }) };
        let mut o = MdOutcome { steps: 100, wall: Duration::from_millis(5), ..MdOutcome::default() };
        let text = report(&args, "test", &o);
        assert!(text.contains("not checked") && text.contains("integrity: not checked"), "{text}");
        assert!(!text.contains("bit-exact"), "{text}");
        assert!(text.contains("50.0 µs per step"), "{text}");
        o.checked_steps = 100;
        o.worst.force_max_rel = 3e-6;
        o.energies.push(md::EnergyPoint { step: 99, potential: -10.0, kinetic: 4.0 });
        let text = report(&args, "test", &o);
        assert!(!text.contains("not checked") && text.contains("100 steps checked") && text.contains("3.00e-6"), "{text}");
        assert!(text.contains("= -6.000 kJ/mol"), "{text}");
        assert!(text.contains("integrity: 100 checked steps") && !text.contains("drift") && !text.contains("ran again"), "{text}");
        assert!(!text.contains("per step over all"), "a checked run is not timed: {text}");
        assert!(drift_line(&args, "x", &o).contains("not measured"));
        o.energies.push(md::EnergyPoint { step: 199, potential: -10.5, kinetic: 4.0 });
        let text = report(&args, "test", &o);
        assert!(text.contains("test: total energy: drift"), "two energy points give a drift: {text}");
        o.reruns = 2;
        assert!(report(&args, "test", &o).contains("test: 2 stretch(es) of steps ran again after agreed failures"));
    }

    #[test]
    fn the_json_says_not_checked_and_carries_the_machine() {
        let args = VerifyArgs { check_every: 0, ..VerifyArgs::new(6000, RankGrid { dims: [2, 1, 1] }) };
        let mut o = MdOutcome { steps: 100, searches: 1, wall: Duration::from_millis(5), ..MdOutcome::default() };
        let j = json(&args, "x", &o, &crate::machine::tests::sample());
        assert_eq!(j["checked"], false);
        assert!(j["coordinates_bit_exact"].is_null() && j["force_max_rel_err"].is_null() && j["energy_max_rel_err"].is_null(), "{j}");
        assert_eq!(j["machine"]["nvidia_driver"], "580.159.04");
        assert_eq!(j["step_us_host"], 50.0);
        o.checked_steps = 100;
        o.worst.force_max_rel = 2e-6;
        let j = json(&args, "PE 0", &o, &crate::machine::tests::sample());
        assert_eq!((j["checked"].as_bool(), j["coordinates_bit_exact"].as_bool()), (Some(true), Some(true)));
        assert_eq!(j["force_max_rel_err"], 2e-6);
        assert!(j["step_us_host"].is_null(), "a checked run is not timed: {j}");
    }

    #[test]
    fn a_failed_check_reports_the_coordinate_error_and_the_mismatches_it_measured() {
        let args = VerifyArgs::new(6000, RankGrid { dims: [2, 1, 1] });
        let good = md::StepCheck { halo_atoms_checked: 3000, pulses_checked: 4, force_max_rel: 2e-6, ..md::StepCheck::default() };
        let mut o = MdOutcome { steps: 3, checked_steps: 3, worst: good, ..MdOutcome::default() };
        let text = report(&args, "PE 0", &o);
        assert!(text.contains("coordinates after the halo bit-exact (max abs err 0.0e0, 3000 halo atoms compared)"), "{text}");
        assert!(text.contains("(4 pulse ranges) and results against the CPU references: 0 mismatches"), "{text}");
        // The third step found one halo atom 0.125 nm off, and its pulse range's checksum differs.
        o.worst = md::StepCheck { coord_max_abs: 0.125, coord_mismatches: 1, halo_mismatches: 1, ..good };
        o.failed_checks = 1;
        let text = report(&args, "PE 0", &o);
        assert!(text.contains("coordinates after the halo NOT bit-exact (1 atoms differ) (max abs err 1.2e-1, 3000 halo atoms compared)"), "{text}");
        assert!(
            text.contains("against the CPU references: 2 mismatches (1 pulse ranges, 1 atoms' coordinates, 0 force components, 0 potential energy)"),
            "{text}"
        );
        assert!(!text.contains("0 mismatches") && !text.contains(" s\n") && !text.ends_with(" s"), "{text}");
        let j = json(&args, "PE 0", &o, &crate::machine::tests::sample());
        assert_eq!((j["checked"].as_bool(), j["coordinates_bit_exact"].as_bool()), (Some(false), Some(false)), "{j}");
        assert_eq!((j["coord_max_abs_err"].as_f64(), j["coord_mismatches"].as_u64()), (Some(0.125), Some(1)), "{j}");
        assert_eq!((j["integrity_mismatches"].as_u64(), j["mismatches"].as_u64(), j["failed_checks"].as_u64()), (Some(1), Some(2), Some(1)), "{j}");
    }
}
