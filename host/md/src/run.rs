//! Running the MD loop: all ranks in one process, or one rank per NVSHMEM PE, through one driver
//! over [`Exchange`]; optionally checking steps against the CPU references and recording energies.
//!
//! [`MdRun`] holds a run between calls, so a benchmark can time stretches of steps
//! ([`MdRun::run_steps`], [`MdRun::synchronize`]); [`run`] runs a whole configuration.
//!
//! With routed paths (the default policy) the run keeps a [`Routing`] with agreed failover: safe
//! points at every search step, every checked step and the end of each [`MdRun::run_steps`]; a
//! failure found at one rolls every PE back to the last search step (positions, velocities,
//! outcome and energies as they were there), resets and drops the exchange together, and runs
//! the steps again on the agreed paths with a new exchange (whose counters start from zero on
//! every PE).

use super::gather::{HomeArrays, HomeGather};
use super::phases::{Mark, PhaseSummary};
use super::rank::{IntegrationStream, MdRank, StepWork};
use super::search::{self, SearchTimes};
use crate::abi::Float3;
use crate::decomp::{Decomposition, GpuRank, HaloPlan, HomeDevice, MergedHome, PlanRider, RankGrid, RankPlan, Redecomposed};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::exchange::pe::PathPolicy;
use crate::exchange::{Exchange, Placement, RankExchange, RankHalo, ReplanFence, Routing, Transport, reference};
use crate::gpu::KernelModule;
use crate::integrity::{self, RankChecksums};
use crate::md_reference;
use crate::nbnxm::{DEFAULT_DRIFT_TOLERANCE, ListKind, ListSetup, lj_table};
use crate::session::PeSession;
use crate::system::MolecularSystem;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs started in this process: every PE starts the same runs in the same order, so the count
/// names a run's all-gathers alike on every PE (the launcher's rendezvous takes each tag once).
static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Fraction of extra room in the exchange's buffers, so that later decompositions (atoms migrate
/// between searches) fit and the buffers are kept ([`Exchange::replan`]).
pub const EXCHANGE_HEADROOM: f64 = 0.25;

/// Bytes per PE of the search steps' all-gather buffers at first (grown when a message is longer):
/// room for a plan of about 50,000 local atoms per rank.
const KEPT_GATHER_BYTES: usize = 1 << 18;

/// Added to the system's seed for the order of a shuffled system ([`MdConfig::shuffle_atoms`]).
const SHUFFLE_SEED: u64 = 0x5eed_0fa7;

/// What to simulate and how.
#[derive(Clone, Debug)]
pub struct MdConfig {
    /// Atoms in the synthetic liquid.
    pub atoms: usize,
    /// Rank grid.
    pub grid: RankGrid,
    /// Interaction cutoff (nm); the LJ potential is shifted to zero there.
    pub cutoff: f32,
    /// Verlet buffer of the outer list beyond the cutoff (nm); `None`: the buffer rule for
    /// `nstlist` ([`ListSetup::for_system`]).
    pub buffer: Option<f32>,
    /// Verlet buffer of the inner (pruned) list beyond the cutoff (nm); `None`: the buffer rule
    /// for `nstprune`, at most the outer buffer. The rule's buffers bound the energy drift, not
    /// single pairs: a pair that enters the cutoff unlisted is missed with its full force, about
    /// 1e-2 kJ/mol/nm at a 0.7 nm cutoff (above the checks' tolerance), under 1e-3 at 1 nm. Checked
    /// runs at short cutoffs therefore give both buffers explicitly, wide enough for the motion.
    pub inner_buffer: Option<f32>,
    /// Tolerance of the buffer rule: the energy drift (kJ/mol/ps per atom) that the pairs a list
    /// misses may cause ([`ListSetup::for_system`]; [`DEFAULT_DRIFT_TOLERANCE`] by default).
    pub buffer_tolerance: f64,
    /// Steps between searches (re-decomposition and new lists).
    pub nstlist: u64,
    /// Steps between GPU prunes of the inner lists (the first at the search step).
    pub nstprune: u64,
    /// Time step (ps).
    pub dt: f32,
    /// Steps to run ([`run`]).
    pub steps: u64,
    /// Seed of the system.
    pub seed: u64,
    /// Atoms in an order drawn from the seed ([`MolecularSystem::shuffle`]) instead of lattice
    /// order: global ids without spatial locality, as after a long run (the ranks keep their home
    /// atoms in id order, and the kernels read coordinates in that order).
    pub shuffle_atoms: bool,
    /// Exchange transport.
    pub transport: Transport,
    /// Check every `check_every` steps against the CPU references (0: never).
    pub check_every: u64,
    /// Record the energies every `energy_every` steps (0: never; checked steps always).
    pub energy_every: u64,
    /// Deadline of every device wait.
    pub wait_timeout: Duration,
    /// How pulses reach their peers: the router's paths with agreed failover (`Routed`, the
    /// default), or without a router (`Auto`: stores wherever mapped; `ForcePut` across PEs).
    pub path_policy: PathPolicy,
    /// Host threads of the pair search, shared by this process's ranks (0: the default,
    /// [`search::search_threads`]: one per PE, four for a process that drives every rank).
    pub search_threads: usize,
    /// Search the cluster-pair lists on the GPU (the host sorts the atoms into the grid); false:
    /// on host threads. Both give the same lists.
    pub gpu_search: bool,
    /// With `gpu_search`: the cluster grid sorted on the GPU too, and no process sees the whole
    /// system after the first search. A single rank searches entirely on the GPU (coordinates
    /// wrapped in place, cluster grid and lists there; nothing crosses to the host, the atoms keep
    /// their order). Several ranks plan from their own atoms: `decomp::redecompose` (or, with
    /// `gpu_redecompose`, its per-atom passes on the GPUs) moves the leavers and builds the pulses
    /// with small all-gathers; the host lays out the local atoms and the GPU sorts them. False: every
    /// process gathers the whole system, plans it and sorts the grids on the host at every search.
    pub resident_search: bool,
    /// With `resident_search` and several ranks, where the redecomposition's per-atom passes run
    /// ([`Redecompose`]); every choice gives the same plan.
    pub redecompose: Redecompose,
    /// Which of a rank's streams integrates a step with halo work ([`IntegrationStream`]);
    /// `None`: [`IntegrationStream::for_ranks`] chooses by how the ranks are driven.
    pub integrate_on: Option<IntegrationStream>,
    /// Replay steps without energy or check as CUDA graphs, one per rank and kind of step (plain,
    /// and with the prune), each captured at its first use after a search (GPU-initiated
    /// transports; others launch as usual).
    pub graph: bool,
    /// Test only: a fault every exchange of this run carries (a negative control:
    /// [`Fault::CorruptAtom`](crate::exchange::perturb::Fault::CorruptAtom) and `DropAtom` change
    /// one received atom on the GPU, and the checked steps must fail naming it). `None`: only the
    /// process's own `HALO_FAULT`, if any.
    pub fault: Option<Arc<crate::exchange::perturb::Perturbation>>,
}

/// Where a redecomposition's per-atom passes run (wrap, owners, the merge of stayers and
/// arrivals, the first pulses' selection of the home atoms).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Redecompose {
    /// On the GPUs from [`GPU_REDECOMPOSE_MIN_HOME`] home atoms per rank on average, else on the
    /// host: the faster of the two at both sizes measured.
    #[default]
    Auto,
    /// On each rank's GPU (`decomp::redecompose_on_devices` over `decomp::GpuHome`): only the
    /// leavers, the selections and the new home atoms' ids and positions cross to the host; the
    /// velocities stay on the GPU.
    Gpu,
    /// On the host (`decomp::redecompose`): every home atom's position and velocity read back.
    Host,
}

/// Home atoms per rank from which [`Redecompose::Auto`] runs the passes on the GPUs. Two PEs
/// sharing one H200 (docs/nbnxm.md, "The redecomposition on the GPUs"): with 22,500 home atoms a rank the
/// GPUs' passes saved 0.1–0.3 ms of a search and with 12,000 up to 0.1, with 6,000 they were even
/// with the host's (0.68–0.71 against 0.62–0.71 ms) and with 3,000 cost 0.05–0.15 ms more (two
/// waits for the GPU against the host's passes over few atoms): the crossover lies between 6,000
/// and 12,000.
pub const GPU_REDECOMPOSE_MIN_HOME: usize = 10_000;

impl Redecompose {
    /// Whether `atoms` atoms on `ranks` ranks redecompose on the GPUs.
    pub fn on_gpus(self, atoms: usize, ranks: usize) -> bool {
        match self {
            Self::Gpu => true,
            Self::Host => false,
            Self::Auto => atoms / ranks.max(1) >= GPU_REDECOMPOSE_MIN_HOME,
        }
    }

    /// The choice named `auto`, `gpu` or `host`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "gpu" => Ok(Self::Gpu),
            "host" => Ok(Self::Host),
            other => Err(HaloError::InvalidInput(format!("redecompose on `{other}`: choose auto, gpu or host"))),
        }
    }

    /// The name [`Self::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Gpu => "gpu",
            Self::Host => "host",
        }
    }
}

impl MdConfig {
    /// `atoms` atoms on `grid` with the defaults: cutoff 1 nm, nstlist 100 with the buffer rule
    /// (drift tolerance [`DEFAULT_DRIFT_TOLERANCE`]), inner lists pruned every 50 steps, lists searched
    /// on the GPU (entirely, on one rank), 2 fs, fused transport, every step checked, no energy
    /// records.
    pub fn new(atoms: usize, grid: RankGrid) -> Self {
        Self {
            atoms,
            grid,
            cutoff: 1.0,
            buffer: None,
            inner_buffer: None,
            buffer_tolerance: DEFAULT_DRIFT_TOLERANCE,
            nstlist: 100,
            nstprune: 50,
            dt: 0.002,
            steps: 100,
            seed: 1,
            shuffle_atoms: false,
            transport: Transport::Fused,
            check_every: 1,
            energy_every: 0,
            wait_timeout: Duration::from_secs(5),
            path_policy: PathPolicy::default(),
            search_threads: 0,
            gpu_search: true,
            resident_search: true,
            redecompose: Redecompose::Auto,
            integrate_on: None,
            graph: false,
            fault: None,
        }
    }

    /// The cutoffs and list lifetimes for `system`: the buffer rule for each list, or the explicit
    /// buffers (the rule's inner buffer is at most the outer one; an explicit inner buffer above
    /// the outer one is an error).
    pub fn list_setup(&self, system: &MolecularSystem) -> Result<ListSetup> {
        let bad = |e: crate::nbnxm::NbnxmError| HaloError::InvalidInput(e.to_string());
        let nstlist = u32::try_from(self.nstlist).ok().filter(|&n| n >= 1);
        let nstprune = u32::try_from(self.nstprune).ok().filter(|&n| n >= 1);
        let (Some(nstlist), Some(nstprune)) = (nstlist, nstprune) else {
            return Err(HaloError::InvalidInput(format!("nstlist ({}) and nstprune ({}) must be between 1 and 2^32", self.nstlist, self.nstprune)));
        };
        let rule = ListSetup::for_system(system, self.cutoff, self.dt, nstlist, nstprune.min(nstlist), self.buffer_tolerance).map_err(bad)?;
        if self.buffer.is_none() && self.inner_buffer.is_none() {
            return Ok(rule);
        }
        let rlist = self.buffer.map_or(rule.rlist, |b| self.cutoff + b);
        let inner = self.inner_buffer.map_or(rule.rlist_inner.min(rlist), |b| self.cutoff + b);
        ListSetup::new(self.cutoff, nstlist, rlist, nstprune.min(nstlist), inner).map_err(bad)
    }

    fn checks_step(&self, step: u64) -> bool {
        self.check_every > 0 && step.is_multiple_of(self.check_every)
    }

    fn energy_step(&self, step: u64) -> bool {
        (self.energy_every > 0 && step.is_multiple_of(self.energy_every)) || self.checks_step(step)
    }
}

/// Errors of one checked step, per quantity (largest over ranks and atoms), and what the checks
/// covered and found; over several steps ([`MdOutcome::worst`]) the largest errors and the summed
/// counts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepCheck {
    /// Largest absolute coordinate difference after the coordinate halo from the halo's CPU
    /// reference ([`coordinate_errors`]; 0: bit-exact; infinite where a value is not finite).
    pub coord_max_abs: f64,
    /// Local atoms whose coordinates after the halo differ in any bit from the reference (a `-0.0`
    /// for a `0.0` counts, though its difference is 0).
    pub coord_mismatches: u64,
    /// Halo (received) atoms whose coordinates were compared: what the coordinate check covered.
    pub halo_atoms_checked: u64,
    /// Largest force-component difference after the force halo, against the undecomposed system,
    /// relative to the atom's force scale ([`force_allowance`]): max(|F| of that atom, RMS force
    /// of the system), widened by what the rounding of `f32` coordinates can do to its pairs. Not
    /// relative to the component alone: a small net force is the sum of large pair forces, and
    /// f32 coordinates and sums err in proportion to those, not to what is left after they cancel.
    /// Above [`FORCE_TOLERANCE`] a component is a mismatch.
    pub force_max_rel: f64,
    /// Largest absolute force difference (kJ/mol/nm).
    pub force_max_abs: f64,
    /// Home force components beyond [`FORCE_TOLERANCE`] (or not finite).
    pub force_mismatches: u64,
    /// Relative difference of the GPU's potential energy (summed over ranks) from the
    /// undecomposed `f64` reference.
    pub energy_rel: f64,
    /// Pulse receive ranges whose coordinate checksum differs from what their sender sent
    /// (`integrity::halo_mismatches`, compared across every rank).
    pub halo_mismatches: u64,
    /// Pulse receive ranges compared across ranks.
    pub pulses_checked: u64,
}

impl StepCheck {
    /// Largest errors, summed counts.
    fn merge(&mut self, o: StepCheck) {
        self.coord_max_abs = self.coord_max_abs.max(o.coord_max_abs);
        self.force_max_rel = self.force_max_rel.max(o.force_max_rel);
        self.force_max_abs = self.force_max_abs.max(o.force_max_abs);
        self.energy_rel = if self.energy_rel.is_nan() || o.energy_rel.is_nan() { f64::NAN } else { self.energy_rel.max(o.energy_rel) };
        self.coord_mismatches += o.coord_mismatches;
        self.halo_atoms_checked += o.halo_atoms_checked;
        self.force_mismatches += o.force_mismatches;
        self.halo_mismatches += o.halo_mismatches;
        self.pulses_checked += o.pulses_checked;
    }

    /// Everything compared that differed: coordinates not bit-exact (atoms), force components
    /// beyond tolerance, pulse ranges whose two ends disagree, and the energy when beyond its
    /// tolerance (1).
    pub fn mismatches(&self) -> u64 {
        let energy = !self.energy_passed();
        self.coord_mismatches + self.force_mismatches + self.halo_mismatches + u64::from(energy)
    }

    /// Whether the potential energy is within [`ENERGY_TOLERANCE`] of the reference (false for NaN).
    pub fn energy_passed(&self) -> bool {
        self.energy_rel <= ENERGY_TOLERANCE
    }

    /// Whether nothing differed ([`Self::mismatches`] is 0).
    pub fn passed(&self) -> bool {
        self.mismatches() == 0
    }
}

/// The coordinate errors of one rank after the coordinate halo: `x` against the CPU reference
/// `want` (all local atoms; the first `home` are the rank's own). `first`: the first local atom
/// that differs in any bit.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CoordinateErrors {
    /// Largest |x - want| over every component (infinite where either is not finite and they differ).
    pub max_abs: f64,
    /// Atoms that differ in any bit.
    pub mismatches: u64,
    /// Atoms past `home` compared.
    pub halo_atoms: u64,
    /// The first atom that differs.
    pub first: Option<usize>,
}

/// Compares the coordinates after the halo with their reference, bit for bit (the halo moves bits;
/// nothing is computed on the way but the periodic shift, added in f32 by both).
pub fn coordinate_errors(x: &[Float3], want: &[Float3], home: usize) -> CoordinateErrors {
    let mut e = CoordinateErrors { halo_atoms: x.len().min(want.len()).saturating_sub(home) as u64, ..CoordinateErrors::default() };
    for (i, (a, b)) in x.iter().zip(want).enumerate() {
        let Some(d) = halo::exchange::reference::atom_difference(*a, *b) else { continue };
        e.mismatches += 1;
        e.first.get_or_insert(i);
        e.max_abs = e.max_abs.max(d);
    }
    e
}

/// The energies of one step, summed over every rank (kJ/mol).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct EnergyPoint {
    /// The step.
    pub step: u64,
    /// Potential-shifted LJ energy (GPU force kernels).
    pub potential: f64,
    /// Kinetic energy at the force's time (leapfrog average of the half steps, GPU).
    pub kinetic: f64,
}

impl EnergyPoint {
    /// Potential plus kinetic.
    pub fn total(&self) -> f64 {
        self.potential + self.kinetic
    }
}

/// Drift of the total energy over a run: least-squares slope.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Drift {
    /// Slope per atom (kJ/mol/ns per atom).
    pub per_atom_kj_mol_ns: f64,
    /// Slope of the whole system (kJ/mol/ns).
    pub total_kj_mol_ns: f64,
    /// Standard deviation of the total energy about the fitted line (kJ/mol).
    pub fluctuation: f64,
    /// Mean total energy (kJ/mol).
    pub mean: f64,
    /// Energy points fitted.
    pub points: usize,
    /// Simulated time covered (ps).
    pub span_ps: f64,
}

/// Sizes of the lists of this process's ranks at the last search.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct ListSizes {
    /// Home atoms.
    pub home_atoms: usize,
    /// Local (home + halo) atoms.
    pub local_atoms: usize,
    /// Entries (warps) of the home–home lists.
    pub local_entries: usize,
    /// Entries of the lists with halo atoms.
    pub nonlocal_entries: usize,
    /// j-cluster words (each up to 8 cluster pairs) of the outer home–home lists.
    pub local_words: usize,
    /// j-cluster words of the outer lists with halo atoms.
    pub nonlocal_words: usize,
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct MdOutcome {
    /// Steps run.
    pub steps: u64,
    /// Steps checked against the references (a failed one included).
    pub checked_steps: u64,
    /// Worst errors and summed mismatch counts over the checked steps (a failed one included).
    pub worst: StepCheck,
    /// Checked steps that found a difference ([`StepCheck::passed`] false): the run ends with
    /// [`HaloError::Verification`] at the first, so 0 or 1; [`MdRun::outcome`] still holds it.
    pub failed_checks: u64,
    /// Search steps (re-decompositions and new lists).
    pub searches: u64,
    /// Of which searched entirely on the GPU ([`MdConfig::resident_search`]).
    pub resident_searches: u64,
    /// Of which decomposed from each process's own ranks rather than from the gathered system
    /// (several ranks, [`MdConfig::resident_search`]).
    pub redecompositions: u64,
    /// Of the searches on the GPU alone and the redecompositions on the GPUs, those whose first
    /// GPU passes (the grid and the lists' first passes; every rank's migration) were enqueued
    /// behind the steps before them, before the host waited for those steps, and taken up by
    /// the search: every such search but the first, and one after a rollback.
    pub searches_begun_ahead: u64,
    /// Times the exchange was built (the first search, and any search whose decomposition did not
    /// fit the buffers).
    pub exchange_builds: u64,
    /// Searches that moved the exchange to the new decomposition in its buffers
    /// ([`Exchange::replan_fenced`]).
    pub replans: u64,
    /// Of the replans' fences, the host barriers across PEs (0 in one process; none where a
    /// search planned from the ranks' own atoms after all-gathers that fence it already and every
    /// PE maps every other: [`ReplanFence::AfterCollective`]).
    pub replan_barriers: u64,
    /// Host time of the steps from the first to the end ([`MdRun::finish`]), checks included.
    pub wall: Duration,
    /// Where the search steps' time went.
    pub search: SearchTimes,
    /// List sizes at the last search.
    pub lists: ListSizes,
    /// The cutoffs and lifetimes used.
    pub setup: Option<ListSetup>,
    /// Energies of the energy steps, whole system.
    pub energies: Vec<EnergyPoint>,
    /// Host synchronisations of the exchange (GPU-initiated transports: one per search step after
    /// the first, one per checked step, one at the end; none inside a step).
    pub host_syncs: u64,
    /// Steps replayed as CUDA graphs.
    pub graph_steps: u64,
    /// Host time spent capturing them (once per search interval and rank).
    pub graph_capture: Duration,
    /// Steps of a rank alone (one rank in all) that ran on its local stream only, with no halo
    /// stream and no event between its kernels (`MdRank::begin_step_alone`).
    pub alone_steps: u64,
    /// What the router chose for the ranks of this process at the last search (empty when no
    /// router decided).
    pub routes: Vec<crate::route::RoutedSummary>,
    /// Stretches of steps run again after a safe point found a failure (routing only).
    pub reruns: u64,
}

impl MdOutcome {
    /// Drift of the total energy of [`Self::energies`] from step `from` on (a least-squares line
    /// over time), per atom of a system of `atoms` atoms at time step `dt` (ps). `None` with fewer
    /// than two points.
    pub fn drift(&self, atoms: usize, dt: f64, from: u64) -> Option<Drift> {
        let pts: Vec<(f64, f64)> = self.energies.iter().filter(|e| e.step >= from).map(|e| (e.step as f64 * dt * 1e-3, e.total())).collect();
        if pts.len() < 2 {
            return None;
        }
        let n = pts.len() as f64;
        let (mt, me) = (pts.iter().map(|p| p.0).sum::<f64>() / n, pts.iter().map(|p| p.1).sum::<f64>() / n);
        let stt: f64 = pts.iter().map(|p| (p.0 - mt).powi(2)).sum();
        if stt.is_nan() || stt <= 0.0 {
            return None;
        }
        let slope = pts.iter().map(|p| (p.0 - mt) * (p.1 - me)).sum::<f64>() / stt;
        let resid = (pts.iter().map(|p| (p.1 - me - slope * (p.0 - mt)).powi(2)).sum::<f64>() / n).sqrt();
        let span = (pts[pts.len() - 1].0 - pts[0].0) * 1e3;
        Some(Drift {
            per_atom_kj_mol_ns: slope / atoms.max(1) as f64,
            total_kj_mol_ns: slope,
            fluctuation: resid,
            mean: me,
            points: pts.len(),
            span_ps: span,
        })
    }

    /// Host time per step over the whole run (search steps and any checks included), µs.
    pub fn step_us(&self) -> Option<f64> {
        (self.steps > 0).then(|| self.wall.as_secs_f64() * 1e6 / self.steps as f64)
    }

    /// Share of the wall time spent in search steps' host work (0..1).
    pub fn search_share(&self) -> f64 {
        let w = self.wall.as_secs_f64();
        if w > 0.0 { self.search.total.as_secs_f64() / w } else { 0.0 }
    }
}

/// A rank's GPU in a redecomposition, the spans of its calls (its per-atom passes) added to
/// `spans`. The ranks of one process run them on threads side by side: [`busy_time`] of the spans
/// is the wall time spent in them.
struct Timed<'a, 'b> {
    inner: &'a mut GpuRank<'b>,
    spans: &'a std::sync::Mutex<Vec<(Instant, Instant)>>,
}

impl Timed<'_, '_> {
    fn time<T>(&mut self, f: impl FnOnce(&mut GpuRank<'_>) -> T) -> T {
        let t = Instant::now();
        let out = f(self.inner);
        if let Ok(mut spans) = self.spans.lock() {
            spans.push((t, Instant::now()));
        }
        out
    }
}

/// The time covered by at least one of `spans` (start, end): the union's length.
fn busy_time(spans: &mut [(Instant, Instant)]) -> Duration {
    spans.sort_unstable_by_key(|s| s.0);
    let mut total = Duration::ZERO;
    let mut open: Option<(Instant, Instant)> = None;
    for &(a, b) in spans.iter() {
        open = match open {
            Some((s, e)) if a <= e => Some((s, e.max(b))),
            Some((s, e)) => {
                total += e - s;
                Some((a, b))
            }
            None => Some((a, b)),
        };
    }
    total + open.map_or(Duration::ZERO, |(s, e)| e.saturating_duration_since(s))
}

impl HomeDevice for Timed<'_, '_> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn begin_migrate(&mut self, geo: &crate::decomp::Decomposition) -> Result<()> {
        self.time(|d| d.begin_migrate(geo))
    }

    fn migrate(&mut self, geo: &crate::decomp::Decomposition) -> Result<(usize, Vec<crate::abi::MigrateLeaver>)> {
        self.time(|d| d.migrate(geo))
    }

    fn begin_merge_and_select(&mut self, geo: &crate::decomp::Decomposition, arrivals: &[(u32, Float3, Float3)], positions: bool) -> Result<()> {
        self.time(|d| d.begin_merge_and_select(geo, arrivals, positions))
    }

    fn merge_and_select(
        &mut self,
        geo: &crate::decomp::Decomposition,
        arrivals: &[(u32, Float3, Float3)],
        positions: bool,
        into: MergedHome,
    ) -> Result<MergedHome> {
        self.time(|d| d.merge_and_select(geo, arrivals, positions, into))
    }

    fn read_home_positions(&mut self, into: &mut Vec<Float3>) -> Result<()> {
        self.time(|d| d.read_home_positions(into))
    }
}

/// Under routing across PEs, what a redecomposition's plans carry for the router
/// (`decomp::PlanRider`): each local rank's paths for its new halo, made from its own plan, so
/// that [`Routing::plan_gathered`] takes every PE's from the plans' all-gather instead of an
/// all-gather of its own. None without routing or for ranks of one process (their router plans
/// them all at once, with no collective).
fn route_rider(routing: &mut Option<Routing>, nranks: usize) -> Option<impl FnMut(&RankPlan) -> Result<Vec<u8>> + '_> {
    let routing = routing.as_mut().filter(|r| r.across_pes())?;
    Some(move |p: &RankPlan| routing.own_paths::<Float3>(&p.halo(), nranks))
}

/// The all-gather of a redecomposition's collectives across the processes
/// ([`Placement::all_gather_kept`], each tagged with the run's `tag` and the `step`), its time
/// added to `spent`.
fn redecompose_gather<'a>(
    placement: &'a Placement,
    kept: &'a mut Option<crate::nvshmem::KeptGather>,
    tag: &'a str,
    step: u64,
    spent: &'a mut Duration,
) -> impl FnMut(&str, Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> + 'a {
    move |what, mine| {
        let t = Instant::now();
        let all = placement.all_gather_kept(&format!("{tag}{what}-{step}"), mine, kept, KEPT_GATHER_BYTES);
        *spent += t.elapsed();
        all
    }
}

/// Whether a step has no halo work at all: one rank in the grid, driven by this process (`pulses`:
/// each local rank's pulse count), with no pulse.
fn alone(grid: RankGrid, mut pulses: impl ExactSizeIterator<Item = usize>) -> bool {
    grid.num_ranks() == 1 && pulses.len() == 1 && pulses.all(|p| p == 0)
}

/// Whether every rank's plan in `a` chose the same transport for every peer as in `b` (message
/// sizes may differ: the exchange lays the same paths over new halos).
fn same_transports(a: &[crate::route::RoutedPaths], b: &[crate::route::RoutedPaths]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.self_pe == y.self_pe && x.peers == y.peers)
}

/// The state at the last search step (positions, velocities, outcome so far, this process's
/// energy points): what a safe point that found a failure rolls back to, on every PE alike.
#[derive(Default)]
struct Rollback {
    saved: Option<Saved>,
    /// Rollbacks to the saved step so far.
    attempts: u32,
}

struct Saved {
    positions: Vec<Float3>,
    velocities: Vec<Float3>,
    out: MdOutcome,
    energy_points: usize,
    step: u64,
}

impl Rollback {
    fn save(&mut self, system: &MolecularSystem, out: &MdOutcome, partial: &[EnergyPoint], step: u64) {
        if self.saved.as_ref().is_some_and(|s| s.step != step) {
            self.attempts = 0; // a new stretch of steps
        }
        self.saved = Some(Saved {
            positions: system.positions.clone(),
            velocities: system.velocities.clone(),
            out: out.clone(),
            energy_points: partial.len(),
            step,
        });
    }

    /// Puts `system`, `out` and `partial` back to the saved search step and returns it; an error
    /// after [`crate::exchange::routing::MAX_RERUNS`] rollbacks to the same step in a row.
    fn restore(&mut self, now: u64, system: &mut MolecularSystem, out: &mut MdOutcome, partial: &mut Vec<EnergyPoint>) -> Result<u64> {
        let s = self.saved.as_ref().ok_or_else(|| HaloError::InvalidInput("a safe point before any state was saved".into()))?;
        self.attempts += 1;
        if self.attempts > crate::exchange::routing::MAX_RERUNS {
            return Err(HaloError::InvalidInput(format!(
                "steps {}..{now} failed {} times in a row after agreed failovers; giving up",
                s.step, self.attempts
            )));
        }
        system.positions.clone_from(&s.positions);
        system.velocities.clone_from(&s.velocities);
        *out = MdOutcome { reruns: out.reruns + 1, ..s.out.clone() };
        partial.truncate(s.energy_points);
        Ok(s.step)
    }
}

/// Relative force tolerance against the undecomposed CPU forces (float accumulation order differs),
/// of the scale [`force_allowance`] gives each atom.
pub const FORCE_TOLERANCE: f64 = 1e-4;

/// The force scale of one atom that [`FORCE_TOLERANCE`] is relative to, kJ/mol/nm: max(`|F|` of
/// its reference force, `rms` of the system's), plus `stiffness * rounding /`
/// [`FORCE_TOLERANCE`], where `stiffness` is the atom's
/// [`md_reference::ReferenceForces::stiffness`] and `rounding` the reference's
/// [`md_reference::displacement_rounding`] of the box. The second term is what `f32` coordinates
/// alone can do: a halo atom shifted across a periodic boundary, or a pair kernel's shift vector,
/// rounds a coordinate to the `f32` grid of twice the box, and a close pair turns that into a
/// force error beyond 1e-4 of the atom's force when its pairs nearly cancel (at 180,000 atoms, a
/// 12.2 nm box, a step on an H100 with every coordinate bit-exact had an atom 1.03e-4 off).
pub fn force_allowance(reference: &[f64; 3], rms: f64, stiffness: f64, rounding: f64) -> f64 {
    let magnitude = reference.iter().map(|c| c * c).sum::<f64>().sqrt();
    magnitude.max(rms).max(1e-12) + stiffness * rounding / FORCE_TOLERANCE
}

/// Relative tolerance of the GPU potential energy against the undecomposed `f64` reference (pair
/// energies summed in `f32` per lane, then per warp in `f64`).
pub const ENERGY_TOLERANCE: f64 = 1e-4;

/// Compares one rank's coordinates (all local atoms, [`coordinate_errors`]) and home forces with
/// the references: the errors, and the first difference described (`None`: the rank passed).
/// Nothing returns early, so that every PE reaches the check's all-gathers.
fn check_rank(
    plan: &HaloPlan,
    halo: &RankHalo,
    r: usize,
    x: &[Float3],
    want_x: &[Float3],
    f: &[Float3],
    reference: &md_reference::ReferenceForces,
) -> (StepCheck, Option<String>) {
    let rounding = reference.rounding;
    let ref_f = &reference.forces;
    let ids = &plan.ranks[r].global_ids;
    let id = |i: usize| ids.get(i).map_or_else(|| "?".into(), u32::to_string);
    let home = plan.ranks[r].home_atoms;
    let mut first = None;
    let e = coordinate_errors(x, want_x, home);
    let mut c = StepCheck { coord_max_abs: e.max_abs, coord_mismatches: e.mismatches, halo_atoms_checked: e.halo_atoms, ..StepCheck::default() };
    if x.len() != want_x.len() {
        c.coord_mismatches += x.len().abs_diff(want_x.len()) as u64;
        c.coord_max_abs = f64::INFINITY;
        first = Some(format!("rank {r} holds {} atoms after the halo, the reference {}", x.len(), want_x.len()));
    }
    if let Some(i) = e.first {
        first.get_or_insert_with(|| {
            format!(
                "rank {r}: {} atom(s) differ from the reference, the first is {} (global {}: {:?} after the halo, the reference {:?}); \
                 max abs coordinate error {:.3e} nm",
                e.mismatches,
                halo.place_of(i),
                id(i),
                x[i],
                want_x[i],
                e.max_abs
            )
        });
    }
    let rms = reference.rms();
    if f.len() < home || ids.len() < home {
        c.force_mismatches += 1;
        first.get_or_insert_with(|| format!("rank {r} has {} forces and {} ids for its {home} home atoms", f.len(), ids.len()));
    }
    for (a, &g) in f.iter().zip(ids).take(home) {
        let Some(want) = ref_f.get(g as usize) else {
            c.force_mismatches += 1;
            first.get_or_insert_with(|| format!("rank {r} holds atom {g}, which the system of {} atoms does not have", ref_f.len()));
            continue;
        };
        // A reference without the atom's stiffness allows it no rounding: never a wider check.
        let stiffness = reference.stiffness.get(g as usize).copied().unwrap_or(0.0);
        let norm = force_allowance(want, rms, stiffness, rounding);
        for (u, v) in [(a.x, want[0]), (a.y, want[1]), (a.z, want[2])] {
            let abs = (f64::from(u) - v).abs();
            let (abs, rel) = if abs.is_finite() { (abs, abs / norm) } else { (f64::INFINITY, f64::INFINITY) };
            if rel > FORCE_TOLERANCE {
                c.force_mismatches += 1;
                first.get_or_insert_with(|| {
                    format!(
                        "rank {r} atom {g} has force {a:?}, the undecomposed reference {want:?} (error {abs:.2e} kJ/mol/nm, {rel:.2e} of its scale \
                         {norm:.1}: max(|F|, RMS force {rms:.1}) plus {:.1} for the rounding of f32 coordinates)",
                        stiffness * rounding / FORCE_TOLERANCE
                    )
                });
            }
            c.force_max_abs = c.force_max_abs.max(abs);
            c.force_max_rel = c.force_max_rel.max(rel);
        }
    }
    (c, first)
}

/// One rank's check as it crosses PEs ([`decode_rank_check`]): its errors and counts, its
/// potential energy, and the first difference it found.
fn encode_rank_check(c: &StepCheck, energy: f64, first: Option<&str>) -> Vec<u8> {
    let words = [
        c.coord_max_abs.to_bits(),
        c.coord_mismatches,
        c.halo_atoms_checked,
        c.force_max_rel.to_bits(),
        c.force_max_abs.to_bits(),
        c.force_mismatches,
        energy.to_bits(),
    ];
    let mut b: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    b.extend_from_slice(first.unwrap_or_default().as_bytes());
    b
}

/// The inverse of [`encode_rank_check`] (the energy and the cross-rank counts are the caller's).
fn decode_rank_check(b: &[u8]) -> Result<(StepCheck, f64, Option<String>)> {
    const WORDS: usize = 7;
    let (head, text) = b
        .split_at_checked(8 * WORDS)
        .ok_or_else(|| HaloError::InvalidInput(format!("a PE sent a check of {} bytes, expected at least {}", b.len(), 8 * WORDS)))?;
    let w: Vec<u64> = head.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())).collect();
    let c = StepCheck {
        coord_max_abs: f64::from_bits(w[0]),
        coord_mismatches: w[1],
        halo_atoms_checked: w[2],
        force_max_rel: f64::from_bits(w[3]),
        force_max_abs: f64::from_bits(w[4]),
        force_mismatches: w[5],
        ..StepCheck::default()
    };
    let first = (!text.is_empty()).then(|| String::from_utf8_lossy(text).into_owned());
    Ok((c, f64::from_bits(w[6]), first))
}

/// All ranks in this process, rank `r` on GPU `r % modules.len()`, routed or storing directly as
/// `cfg.path_policy` says ([`Placement::with_policy`]).
pub fn run_local(cfg: &MdConfig, modules: &[Arc<KernelModule>], progress: impl FnMut(u64, &StepCheck)) -> Result<MdOutcome> {
    run(cfg, &Placement::Local(modules.to_vec()).with_policy(cfg.path_policy), progress)
}

/// One rank per NVSHMEM PE (started by `halo launch`, mpirun or srun), reaching peers as
/// `cfg.path_policy` says.
pub fn run_pe(cfg: &MdConfig, session: &PeSession, progress: impl FnMut(u64, &StepCheck)) -> Result<MdOutcome> {
    run(cfg, &Placement::pe(session, cfg.path_policy), progress)
}

/// The MD loop on the ranks `placement` puts in this process, `cfg.steps` steps. Across PEs every
/// PE runs it with the same configuration: each builds the same decomposition and runs its rank.
pub fn run(cfg: &MdConfig, placement: &Placement, mut progress: impl FnMut(u64, &StepCheck)) -> Result<MdOutcome> {
    let mut md = MdRun::new(cfg.clone(), placement.clone())?;
    md.run_steps(cfg.steps, &mut progress)?;
    md.finish()
}

/// A run in progress (see the module docs).
pub struct MdRun {
    cfg: MdConfig,
    placement: Placement,
    system: MolecularSystem,
    setup: ListSetup,
    lj: Vec<[f32; 2]>,
    /// `1 / m` per atom type (`search::inverse_masses_by_type`), for each rank's GPU.
    inv_by_type: Vec<f32>,
    /// The global ranks this process drives, in the exchange's order.
    ids: Vec<usize>,
    /// Field order is drop order, the same on every PE (symmetric buffers are freed collectively):
    /// the exchange, then the gather buffers.
    exchange: Option<Box<dyn Exchange>>,
    gather: HomeGather,
    ranks: Vec<MdRank>,
    /// Each local rank's captured steps of this search interval: `[plain, prune]` (empty until
    /// captured).
    graphs: [Vec<cudarc::driver::CudaGraph>; 2],
    plan: Option<HaloPlan>,
    step: u64,
    started: Option<Instant>,
    out: MdOutcome,
    /// Energy steps since the last search: (step, record).
    pending: Vec<(u64, usize)>,
    /// This process's energy sums of every energy step so far.
    partial: Vec<EnergyPoint>,
    /// Prefix of this run's all-gather tags (`md<run>-`), unique in the process.
    tag: String,
    /// The router with agreed failover (routed placements), and the plans the exchange follows.
    routing: Option<Routing>,
    exchange_plans: Vec<crate::route::RoutedPaths>,
    /// Exchange launches since the exchange last finished (nothing to settle when false).
    unsettled: bool,
    /// The state at the last search step, for a safe point that finds a failure.
    rollback: Rollback,
    /// The search steps' host threads and working arrays, kept for the whole run.
    host_search: search::HostSearch,
    /// The symmetric buffers of the search steps' all-gathers across PEs (made at the first).
    kept_gather: Option<crate::nvshmem::KeptGather>,
    /// The host threads of the checked steps' CPU reference ([`reference_threads`]), started at
    /// the first checked step.
    reference_workers: Option<crate::workers::Workers>,
}

/// Threads for the checked steps' CPU reference: the host's cores, shared by the PEs of the run
/// (each PE computes the whole reference; the PEs are taken to share one node), at most 32.
fn reference_threads(pes: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    (cores / pes.max(1)).clamp(1, 32)
}

impl MdRun {
    /// Generates the system and prepares the run (collective across PEs: the gather buffers). The
    /// first search happens at the first step.
    pub fn new(cfg: MdConfig, placement: Placement) -> Result<Self> {
        let mut system = MolecularSystem::generate(cfg.atoms, cfg.seed).map_err(|e| HaloError::InvalidInput(e.to_string()))?;
        if cfg.shuffle_atoms {
            system.shuffle(cfg.seed.wrapping_add(SHUFFLE_SEED));
        }
        let setup = cfg.list_setup(&system)?;
        crate::decomp::Decomposition::new(cfg.grid, system.box_size, setup.rlist).map_err(|e| HaloError::InvalidInput(e.to_string()))?;
        let ids = match &placement {
            Placement::Local(modules) | Placement::LocalDirect(modules) => {
                if modules.is_empty() {
                    return Err(HaloError::InvalidInput("no GPU module to run the ranks on".into()));
                }
                (0..cfg.grid.num_ranks()).collect()
            }
            Placement::Pe { nvshmem, .. } => {
                if nvshmem.n_pes() != cfg.grid.num_ranks() {
                    return Err(HaloError::InvalidInput(format!(
                        "the rank grid {} has {} ranks but {} PEs are running: one rank per PE",
                        cfg.grid,
                        cfg.grid.num_ranks(),
                        nvshmem.n_pes()
                    )));
                }
                vec![nvshmem.my_pe()]
            }
        };
        let search_threads = search::search_threads(cfg.search_threads, matches!(placement, Placement::Pe { .. }));
        // Started before anything collective, so that a PE that cannot start them fails alone.
        let host_search = search::HostSearch::new(search_threads)?;
        let tag = format!("md{}-", RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        // Routed paths: a router with agreed failover (collective across PEs: the facts).
        let routing = match placement.policy() {
            PathPolicy::Routed => Some(Routing::new(&placement, cfg.grid.num_ranks(), &[])?),
            _ => None,
        };
        let gather = HomeGather::new(&placement, system.len(), &tag)?;
        let lj = lj_table(&system);
        let inv_by_type = search::inverse_masses_by_type(&system);
        Ok(Self {
            out: MdOutcome { setup: Some(setup), ..MdOutcome::default() },
            cfg,
            placement,
            system,
            setup,
            lj,
            inv_by_type,
            ids,
            exchange: None,
            gather,
            ranks: Vec::new(),
            graphs: [Vec::new(), Vec::new()],
            plan: None,
            step: 0,
            started: None,
            pending: Vec::new(),
            partial: Vec::new(),
            tag,
            routing,
            exchange_plans: Vec::new(),
            unsettled: false,
            rollback: Rollback::default(),
            host_search,
            kept_gather: None,
            reference_workers: None,
        })
    }

    /// The cutoffs and list lifetimes.
    pub fn setup(&self) -> &ListSetup {
        &self.setup
    }

    /// The stream that integrates this run's steps with halo work: the configuration's, else the
    /// default for how its ranks are driven ([`IntegrationStream::for_ranks`]).
    pub fn integration_stream(&self) -> IntegrationStream {
        self.cfg.integrate_on.unwrap_or_else(|| IntegrationStream::for_ranks(matches!(self.placement, Placement::Pe { .. })))
    }

    /// Steps run so far.
    pub fn steps_done(&self) -> u64 {
        self.step
    }

    /// The outcome so far (times and counts; energies only after [`Self::finish`]).
    pub fn outcome(&self) -> &MdOutcome {
        &self.out
    }

    /// Runs `n` more steps; `progress` is called after each checked step. Without routing it
    /// returns with the last steps possibly still running on the GPUs ([`Self::synchronize`]
    /// waits); with routing it ends at a safe point (every step settled, the GPUs idle), running
    /// steps again after a failure until the `n` steps have run without one.
    pub fn run_steps(&mut self, n: u64, progress: &mut dyn FnMut(u64, &StepCheck)) -> Result<()> {
        self.started.get_or_insert_with(Instant::now);
        let end = self.step + n;
        loop {
            while self.step < end {
                self.one_step(progress)?;
            }
            if self.routing.is_none() || self.exchange.is_none() || self.safe_point()? {
                return Ok(());
            }
        }
    }

    /// Runs `n` more steps ([`Self::run_steps`]) with every step's phases timed on the GPU by events
    /// on each rank's streams ([`crate::phases`]), none of them replayed as a graph, and returns
    /// the medians of each of this process's ranks (in the order of its ranks) over the steps that
    /// are neither search nor checked steps. The events end the overlap of consecutive kernels
    /// on a stream, so these steps are no timing of the run: time steps without them.
    pub fn profile_phases(&mut self, n: u64) -> Result<Vec<PhaseSummary>> {
        for m in &mut self.ranks {
            m.profile(true)?;
        }
        let graph = std::mem::replace(&mut self.cfg.graph, false);
        let ran = self.run_steps(n, &mut |_, _| {});
        self.cfg.graph = graph;
        if let Err(e) = ran {
            // The steps' error, not a later one of reading their events.
            self.ranks.iter_mut().for_each(MdRank::discard_profile);
            return Err(e);
        }
        let mut out = Vec::new();
        for (i, m) in self.ranks.iter_mut().enumerate() {
            let probe = m.profile(false)?;
            let rank = self.exchange.as_ref().and_then(|ex| ex.local_ranks().get(i).map(|r| r.rank())).unwrap_or(i);
            if let Some(s) = probe.and_then(|p| PhaseSummary::of(rank, p.steps())) {
                out.push(s);
            }
        }
        Ok(out)
    }

    /// Runs `n` more steps ([`Self::run_steps`]), every one of them checked against the references
    /// whatever [`MdConfig::check_every`] says (collective across PEs, like every step). Returns
    /// the worst errors and the counts over these steps; the first step that differs ends the run
    /// with [`HaloError::Verification`] ([`Self::outcome`] then holds its errors). A benchmark
    /// checks its steps with this outside its timed stretches.
    pub fn run_checked_steps(&mut self, n: u64, progress: &mut dyn FnMut(u64, &StepCheck)) -> Result<StepCheck> {
        let every = std::mem::replace(&mut self.cfg.check_every, 1);
        let mut worst = StepCheck::default();
        let ran = self.run_steps(n, &mut |s, c| {
            worst.merge(*c);
            progress(s, c);
        });
        self.cfg.check_every = every;
        ran.map(|()| worst)
    }

    /// Waits for every step enqueued so far, reports a device wait timeout, and (across PEs) meets
    /// the other PEs at a barrier: a timing boundary.
    pub fn synchronize(&mut self) -> Result<()> {
        // Local streams first: captured steps run there, halo work included.
        for m in &self.ranks {
            m.synchronize()?;
        }
        if let Some(ex) = self.exchange.as_mut() {
            // An exchange settled at a safe point has nothing to wait for (no second host sync).
            if std::mem::take(&mut self.unsettled) {
                ex.finish()?;
            }
            ex.barrier()?;
        }
        Ok(())
    }

    /// Waits for the exchange and every local stream; under routing a device wait timeout is
    /// recorded for the safe point that follows instead of ending the run.
    fn settle(&mut self) -> Result<()> {
        for m in &self.ranks {
            m.synchronize()?;
        }
        let Some(ex) = self.exchange.as_mut() else { return Ok(()) };
        let finished = ex.finish();
        self.unsettled = false;
        match (finished, self.routing.as_mut()) {
            (Err(e), Some(r)) => {
                if r.record_error(&e) {
                    Ok(())
                } else {
                    Err(e)
                }
            }
            (result, _) => result,
        }
    }

    /// A safe point (routing only; collective, at the same step on every PE): settles the steps
    /// so far, and when any PE found a failure rolls back to the last search step. `Ok(true)`:
    /// the steps stand; `Ok(false)`: rolled back, run them again.
    fn safe_point(&mut self) -> Result<bool> {
        self.settle()?;
        let Some(r) = self.routing.as_mut() else { return Ok(true) };
        if !r.safe_point()?.rerun {
            return Ok(true);
        }
        self.roll_back()?;
        Ok(false)
    }

    /// Puts the run back to the last search step, on every PE alike (after an agreed rerun): the
    /// failed exchange is reset together (every PE is alive and idle at a safe point) and dropped
    /// as a healthy one, so its symmetric buffers are freed in the same order everywhere; the
    /// next step searches again and builds an exchange on the agreed paths, from step zero.
    fn roll_back(&mut self) -> Result<()> {
        let at = self.rollback.restore(self.step, &mut self.system, &mut self.out, &mut self.partial)?;
        eprintln!("route: a safe point before step {} found a failure; running again from step {at} with the agreed paths", self.step);
        self.graphs.iter_mut().for_each(Vec::clear);
        // Profiled steps since that search run again: they count once.
        self.ranks.iter_mut().for_each(MdRank::restart_profile);
        if let Some(mut ex) = self.exchange.take() {
            ex.reset_protocol()?;
        }
        self.exchange_plans.clear();
        // The home atoms come from the saved system, not from the GPUs.
        self.plan = None;
        self.pending.clear();
        self.unsettled = false;
        self.step = at;
        Ok(())
    }

    /// An exchange launch's result: under routing a failed launch is recorded for the next safe
    /// point (the steps then run again on the agreed paths); without routing it ends the run.
    fn launched(&mut self, result: Result<()>) -> Result<()> {
        self.unsettled = true;
        match (result, self.routing.as_mut()) {
            (Err(e), Some(r)) => {
                r.record_failed_launch(&e);
                Ok(())
            }
            (result, _) => result,
        }
    }

    /// Ends the run: waits for the GPUs, collects the energies (summed over every rank), and
    /// returns what the run did.
    pub fn finish(mut self) -> Result<MdOutcome> {
        self.synchronize()?;
        self.out.wall = self.started.map_or(Duration::ZERO, |t| t.elapsed());
        self.out.host_syncs = self.exchange.as_ref().map_or(0, |ex| ex.host_syncs());
        self.collect_energies()?;
        self.out.energies = self.total_energies()?;
        Ok(std::mem::take(&mut self.out))
    }

    fn one_step(&mut self, progress: &mut dyn FnMut(u64, &StepCheck)) -> Result<()> {
        let s = self.step;
        let since = s % self.cfg.nstlist;
        if since == 0 && !self.search()? {
            return Ok(()); // rolled back: the run goes on from the last search step
        }
        let energy = self.cfg.energy_step(s);
        let work = StepWork { prune: since.is_multiple_of(self.cfg.nstprune), energy: energy.then_some(since as usize) };
        if energy {
            self.pending.push((s, since as usize));
        }
        // An injected failure (HALO_INJECT_FAILURE) skips this step's halo launches here.
        let injected = self.routing.as_ref().map_or_else(Vec::new, |r| r.injected(s));
        let transport = self.cfg.transport;
        let ex = self.exchange.as_mut().ok_or_else(|| HaloError::InvalidInput("no exchange after the search".into()))?;
        if self.cfg.graph && transport.gpu_initiated() && work.energy.is_none() && !self.cfg.checks_step(s) && injected.is_empty() {
            let graphs = &mut self.graphs[usize::from(work.prune)];
            if graphs.is_empty() {
                let t = Instant::now();
                for (i, m) in self.ranks.iter_mut().enumerate() {
                    let halo = ex.streams()[i].clone();
                    graphs.push(m.capture_step(&mut ex.local_ranks_mut()[i], &halo, transport, self.cfg.dt, work)?);
                }
                self.out.graph_capture += t.elapsed();
            }
            for (m, g) in self.ranks.iter_mut().zip(graphs.iter()) {
                m.launch_graph(g)?;
            }
            self.unsettled = true;
            self.out.graph_steps += 1;
            self.step += 1;
            self.out.steps += 1;
            return Ok(());
        }
        // A rank alone (one rank in all: no pulse, no halo atom) has no halo work: its local
        // stream runs the whole step, each kernel overlapping the end of the one before.
        let alone = alone(self.cfg.grid, ex.local_ranks().iter().map(|r| r.halo().pulses.len()));
        if alone {
            for (i, m) in self.ranks.iter_mut().enumerate() {
                m.begin_step_alone(&ex.local_ranks()[i], work)?;
            }
            self.unsettled = true;
            self.out.alone_steps += 1;
        } else {
            for (i, m) in self.ranks.iter_mut().enumerate() {
                m.begin_step(&ex.local_ranks()[i], &ex.streams()[i], work)?;
            }
            if injected.is_empty() {
                let r = ex.exchange_forward(transport);
                self.launched(r)?;
            }
            let ex = self.exchange.as_mut().ok_or_else(|| HaloError::InvalidInput("no exchange".into()))?;
            for (i, m) in self.ranks.iter_mut().enumerate() {
                m.mark(Mark::CoordHalo, &ex.streams()[i])?;
                m.nonlocal_forces(&ex.local_ranks()[i], &ex.streams()[i], work)?;
            }
            if injected.is_empty() {
                let r = ex.exchange_reverse_accumulate(transport);
                self.launched(r)?;
            }
            let ex = self.exchange.as_ref().ok_or_else(|| HaloError::InvalidInput("no exchange".into()))?;
            for (i, m) in self.ranks.iter().enumerate() {
                m.mark(Mark::ForceHalo, &ex.streams()[i])?;
            }
        }
        if let Some(r) = self.routing.as_mut() {
            for (rank, peers) in &injected {
                eprintln!("route: injected failure: rank {rank} skips step {s}'s halo towards {peers:?}");
                r.record_launch_failure(*rank, peers);
            }
        }
        if self.cfg.checks_step(s) {
            // Under routing a safe point before the check: a failure anywhere means the steps since
            // the last search run again.
            if self.routing.is_some() {
                if !self.safe_point()? {
                    return Ok(());
                }
            } else {
                self.settle()?;
            }
            let (c, failure) = self.check_step(s, since as usize)?;
            self.out.worst.merge(c);
            self.out.checked_steps += 1;
            // Every PE found the same (the check gathers every rank's result), so all end here alike.
            if !c.passed() {
                self.out.failed_checks += 1;
                let detail = failure.unwrap_or_else(|| format!("{} mismatches", c.mismatches()));
                return Err(HaloError::Verification { step: s, detail });
            }
            progress(s, &c);
            // No PE overwrites a halo that another is still checking.
            self.exchange.as_ref().map_or(Ok(()), |ex| ex.barrier())?;
        }
        let ex = self.exchange.as_ref().ok_or_else(|| HaloError::InvalidInput("no exchange".into()))?;
        for (i, m) in self.ranks.iter_mut().enumerate() {
            if alone {
                m.integrate_alone(&ex.local_ranks()[i], transport, self.cfg.dt, work)?;
            } else {
                m.integrate(&ex.local_ranks()[i], &ex.streams()[i], transport, self.cfg.dt, work)?;
            }
        }
        // A profiled step counts unless a search or a check's host work lies inside it. After
        // every rank's integration: a chunk's read-back (a host wait) lies inside no rank's step.
        let keep = since != 0 && !self.cfg.checks_step(s);
        for m in &mut self.ranks {
            m.end_profiled_step(keep)?;
        }
        self.step += 1;
        self.out.steps += 1;
        Ok(())
    }

    /// A search step's host part: wait for the GPUs (under routing: a safe point), gather the home
    /// atoms, decompose again, build the lists, move the exchange to the new layout (or build one
    /// on the router's paths) and upload. `Ok(false)`: the safe point rolled back instead.
    fn search(&mut self) -> Result<bool> {
        let searched = self.begin_search_ahead().and_then(|()| self.search_behind());
        // A migration begun ahead is taken up by the search or, where it failed first, dropped.
        self.ranks.iter_mut().for_each(MdRank::discard_redecompose_ahead);
        searched
    }

    /// Before a search waits for the steps before it, its first GPU passes enqueued on the local
    /// streams behind those steps: on one rank searching on the GPU alone ([`Self::resident`])
    /// the coordinates' wrap, the grid and the lists' first passes
    /// ([`MdRank::begin_search_resident_ahead`]); where the ranks redecompose on the GPUs each
    /// rank's migration ([`MdRank::begin_redecompose_ahead`]). They then run right after the last
    /// step, while the host waits for it, and their host part (staging, launches) is done while
    /// the GPUs are still busy, where it costs the step nothing. Under routing too: where the safe
    /// point rolls the steps back, the passes' results are never read (`search` forgets a begun
    /// migration, and the search from the saved system abandons a begun grid), and the exchange
    /// whose coordinates they read is freed only after them.
    fn begin_search_ahead(&mut self) -> Result<()> {
        if self.resident() {
            let (Some(ex), Some(m)) = (self.exchange.as_ref(), self.ranks.first_mut()) else { return Ok(()) };
            let Some(rank) = ex.local_ranks().first() else { return Ok(()) };
            let _span = tracing::debug_span!("search.ahead").entered();
            return m.begin_search_resident_ahead(&rank.x, self.system.box_size);
        }
        if !self.redecomposes() || !self.redecomposes_on_gpus() {
            return Ok(());
        }
        let (Some(ex), Some(plan)) = (self.exchange.as_ref(), self.plan.as_ref()) else { return Ok(()) };
        let geo = Decomposition::new(self.cfg.grid, self.system.box_size, self.setup.rlist)?;
        let _span = tracing::debug_span!("search.ahead").entered();
        for (r, m) in ex.local_ranks().iter().zip(self.ranks.iter_mut()) {
            let ids = last_home_ids(plan, r.rank(), m.home_atoms());
            m.begin_redecompose_ahead(r.rank(), &r.x, ids, &geo)?;
        }
        Ok(())
    }

    /// [`Self::search`] after its migration was begun ahead, where it was.
    fn search_behind(&mut self) -> Result<bool> {
        let mut t = SearchTimes { count: 1, ..SearchTimes::default() };
        // Under routing a safe point first: the steps since the last search are settled before
        // anything of them leaves the GPUs, and a failure anywhere rolls back to that search.
        if self.routing.is_some() && self.exchange.is_some() {
            if !self.safe_point()? {
                return Ok(false);
            }
        } else {
            self.settle()?;
        }
        // New lists and launch shapes: the captured steps are stale.
        self.graphs.iter_mut().for_each(Vec::clear);
        // The GPUs are idle from here until the first launch of this step: all of it is the search's
        // (the span of the whole search step, whose parts are `search.*` spans).
        let start = Instant::now();
        let _span = tracing::debug_span!("search", step = self.step).entered();
        self.collect_energies()?;
        if self.resident() {
            return self.search_resident(start);
        }
        let path = if self.redecomposes() { SearchPath::Redecomposed } else { SearchPath::Gathered };
        // Under routing across PEs a redecomposition's plans carried every PE's paths (`route_rider`).
        let mut carried_paths = None;
        let (plan, found) = if path == SearchPath::Redecomposed {
            let on_gpus = self.redecomposes_on_gpus();
            let mut done = if on_gpus { self.redecompose_on_gpus(&mut t, start)? } else { self.redecompose(&mut t, start)? };
            if self.routing.as_ref().is_some_and(Routing::across_pes) {
                carried_paths = Some(std::mem::take(&mut done.riders));
            }
            let t2 = Instant::now();
            let searched = tracing::debug_span!("search.local_atoms")
                .in_scope(|| self.host_search.rank_searches_redecomposed(done, &self.system, &self.ids, &self.setup, self.lists_on(), on_gpus))?;
            t.lists = t2.elapsed();
            searched
        } else {
            let plan = self.gather_and_plan(&mut t, start)?;
            let t2 = Instant::now();
            let found = self.host_search.rank_searches(&plan, &self.system, &self.ids, &self.setup, self.lists_on())?;
            t.lists = t2.elapsed();
            (plan, found)
        };
        for r in &found {
            t.atoms = t.atoms.max(r.atoms_time);
            t.grid = t.grid.max(r.grid_time);
            t.pairs = t.pairs.max(r.lists_time);
        }
        let mut gpu_search = std::time::Duration::ZERO;
        let t3 = Instant::now();
        // The GPU grids' and lists' first passes, enqueued now on each rank's local stream (grids
        // built on the GPU; nothing for other lists): they need nothing of the exchange, so the
        // router's collective and the replan below run on the host while the GPUs run them, and
        // each rank's `update` finishes its search after them.
        // Each rank's on its own host thread when this process drives several: their host parts
        // (the zones' checks, the staged copies, the launches) run side by side.
        // (Their wall time counts as the lists', not the sum of each rank's.)
        let (box_size, t_begin) = (self.system.box_size, Instant::now());
        let begun = self
            .host_search
            .workers()
            .map(self.ranks.iter_mut().zip(&found).collect(), |(m, r)| tracing::debug_span!("search.begin").in_scope(|| m.begin_search(r, box_size)));
        begun.into_iter().collect::<Result<Vec<_>>>()?;
        gpu_search += t_begin.elapsed();
        let halos = plan.rank_halos();
        // Under routing every rank's paths for the new halos (the same plans on every PE: across PEs
        // carried by the redecomposition's plans where it ran, else gathered by the router's own
        // collective). The exchange keeps its buffers only while every pair keeps its transport.
        let plans = match (self.routing.as_mut(), &carried_paths) {
            (Some(r), Some(gathered)) => {
                Some(tracing::debug_span!("search.route").in_scope(|| r.plan_gathered(&halos, gathered).map(<[_]>::to_vec))?)
            }
            (Some(r), None) => Some(tracing::debug_span!("search.route").in_scope(|| r.plan::<Float3>(&halos).map(<[_]>::to_vec))?),
            (None, _) => None,
        };
        let same_paths = plans.as_ref().is_none_or(|p| same_transports(p, &self.exchange_plans));
        // How the replan is fenced across PEs (`replan_fence`): on the redecomposed path every PE
        // settled its streams above (`settle`, or the safe point's) before it entered the
        // redecomposition's all-gathers (`TAG_MIGRATE` always runs across PEs, then one per pulse
        // and `TAG_PLAN`; under routing the plans' all-gather follows), a PE leaves an all-gather
        // only after every PE entered it, and nothing since launched a step or wrote into a peer
        // (the home read-back came before the gathers; the grids' and lists' first passes, begun
        // above, touch only each rank's own search buffers; the lists' writes and the uploads come
        // after the replan): the contract of `ReplanFence::AfterCollective`. The gathered path
        // keeps the barrier: its gather buffers are written by peers at the next search, and that
        // reuse is fenced by this barrier (`HomeGather::gather`). Ranks in one process have no
        // barrier.
        let fence = replan_fence(path);
        let exchange_span = tracing::debug_span!("search.exchange").entered();
        // The halos go to the replan where they fit the buffers, else to a new exchange: asked
        // first, so that neither gets a copy (a copy of every rank's maps, cold at a search, is
        // tens of microseconds).
        let rebuild_from = match self.exchange.as_mut() {
            Some(ex) if same_paths && ex.fits(&halos) => {
                let barriers = ex.replan_barriers();
                let replanned = ex.replan_fenced(halos, fence)?;
                if !replanned {
                    return Err(HaloError::InvalidInput("the exchange refused a replan onto halos it said fit its buffers".into()));
                }
                self.out.replans += 1;
                self.out.replan_barriers += ex.replan_barriers().saturating_sub(barriers);
                None
            }
            _ => Some(halos),
        };
        let replanned = rebuild_from.is_none();
        if let Some(halos) = rebuild_from {
            // Free the old buffers first (collective, like the allocation that follows).
            self.exchange = None;
            let mut ex = match &plans {
                Some(p) => self.placement.exchange_planned_with_headroom::<Float3>(halos, p, EXCHANGE_HEADROOM)?,
                None => self.placement.exchange_with_headroom::<Float3>(halos, EXCHANGE_HEADROOM)?,
            };
            if let Some(p) = &self.cfg.fault {
                ex = Box::new(crate::exchange::perturb::Perturbed::new(ex, p.clone())?);
            }
            ex.set_wait_timeout(self.cfg.wait_timeout);
            ex.check_transport(self.cfg.transport)?;
            self.exchange = Some(ex);
            self.exchange_plans = plans.unwrap_or_default();
            self.out.exchange_builds += 1;
        }
        drop(exchange_span);
        let ex = self.exchange.as_ref().ok_or_else(|| HaloError::InvalidInput("no exchange".into()))?;
        self.out.routes = tracing::debug_span!("search.routes").in_scope(|| match &self.routing {
            Some(r) => r.local_summaries(),
            None => Ok(ex.routes()),
        })?;
        let records = self.cfg.nstlist as usize;
        // Whether this search left a synchronous copy from pageable memory that the steps'
        // (non-blocking) streams do not follow ([`uploads_need_context_sync`]).
        let mut facts = SearchSyncFacts { new_exchange: !replanned, new_rank: false, pageable_lists: false };
        let mut sides = Vec::with_capacity(found.len());
        for (i, r) in found.iter().enumerate() {
            let rank = ex.local_ranks().get(i).ok_or_else(|| HaloError::InvalidInput(format!("the exchange drives no local rank {i}")))?;
            if rank.rank() != r.rank {
                return Err(HaloError::InvalidInput(format!("the exchange drives rank {} where the search built rank {}", rank.rank(), r.rank)));
            }
            // The rank's exchange stream: the replan enqueued the rank's maps and metadata there,
            // and the rank's staged home arrays follow them on it (`MdRank::update`).
            let halo = ex.streams().get(i).ok_or_else(|| HaloError::InvalidInput(format!("no exchange stream for local rank {i}")))?;
            facts.pageable_lists |= !matches!(r.lists, search::RankLists::GpuGrid(_));
            sides.push((r, rank, halo));
        }
        // The ranks of the last search finish theirs, each on a host thread of its own when this
        // process drives several (as their begins above); new ones are made here.
        let (box_size, t_update) = (self.system.box_size, Instant::now());
        let kept = self.ranks.len().min(sides.len());
        let updated = self.host_search.workers().map(self.ranks.iter_mut().zip(&sides[..kept]).collect(), |(m, &(r, rank, halo))| {
            tracing::debug_span!("search.update").in_scope(|| m.update(r, box_size, rank, halo))
        });
        updated.into_iter().collect::<Result<Vec<_>>>()?;
        gpu_search += t_update.elapsed();
        t.pairs_wait += self.ranks.iter().map(MdRank::search_wait).sum::<Duration>();
        // With the redecomposition on the GPUs, a rank makes its home atoms' types there from
        // their ids at every later search: it keeps the types by global id for that.
        let types_on_gpus = self.redecomposes_on_gpus();
        for &(r, rank, halo) in &sides[kept..] {
            facts.new_rank = true;
            let (lj, inv, setup) = (&self.lj, &self.inv_by_type, &self.setup);
            let mut m = MdRank::new(rank.module().clone(), r, lj, inv, setup, box_size, records, rank, halo)?;
            m.set_integration_stream(self.integration_stream());
            if types_on_gpus {
                m.set_types_by_id(&self.system.types)?;
            }
            self.ranks.push(m);
        }
        // The uploads' ordering. Each rank's home arrays staged from the host (velocities and
        // masses; with host lists or a host grid also the coordinates and types) were enqueued
        // from page-locked staging on its exchange stream, after the replan's maps and metadata
        // (same stream), and its local stream waits for an event recorded after all of them
        // (`MdRank::update`). With the grid built on the GPU the home coordinates (into the
        // exchange's `x[..home]`) and types were copied on the local stream instead, from the
        // grid's own upload of the local atoms, before that wait. So every consumer is ordered
        // after every upload it reads without a host wait: the local stream's force, prune and
        // update kernels by stream order and that wait; the exchange's launches and the halo
        // stream's force kernels by stream order (what was staged there) and by their wait for
        // `coordinates_ready` (`MdRank::begin_step`), recorded on the local stream after both;
        // a captured step, launched on the local stream, by the same order (its halo branch forks
        // from the local stream inside the graph); the next search's read-back and the checks by
        // the local stream's synchronisation (`settle`); no peer reads this rank's home arrays or
        // maps (peers store into its halo region, signals and receive slots only). What stream
        // order cannot cover is a synchronous copy from pageable memory on the legacy default
        // stream, which may return before its DMA lands and which the non-blocking streams do not
        // follow: the lists a host search uploads, a host grid, a new rank's or a new exchange's
        // set-up. (A replan enqueues all of its copies on the exchange's streams, in one process
        // as across PEs: maps and metadata through staging; a new set-up of the host-driven links
        // writes only a record that the hosts read.) Only then wait for every stream of each GPU
        // once, here.
        if uploads_need_context_sync(&facts) {
            let _span = tracing::debug_span!("search.context_sync").entered();
            let mut synced: Vec<usize> = Vec::new();
            for r in ex.local_ranks() {
                if !synced.contains(&r.context().ordinal()) {
                    r.context().synchronize().during("waiting for the search step's uploads")?;
                    synced.push(r.context().ordinal());
                }
            }
        }
        // The GPU searches ran one rank after another inside the uploads: count them as the lists'.
        t.pairs += gpu_search;
        t.upload = t3.elapsed().saturating_sub(gpu_search);
        t.total = start.elapsed();
        self.out.search.add(&t);
        self.out.searches += 1;
        let _finish = tracing::debug_span!("search.finish").entered();
        self.out.lists = list_sizes(&found, &self.ranks);
        self.host_search.recycle(found);
        if let Some(old) = self.plan.replace(plan) {
            self.host_search.recycle_plan(old);
        }
        Ok(true)
    }

    /// The whole system's plan from the host: every rank's home atoms gathered into the system on
    /// every process (unless there is no previous search: the system holds them), wrapped and
    /// planned. Under routing the gathered state is saved for a rollback.
    fn gather_and_plan(&mut self, t: &mut SearchTimes, start: Instant) -> Result<HaloPlan> {
        if let (Some(ex), Some(plan)) = (self.exchange.as_ref(), self.plan.as_ref()) {
            let mine: Vec<HomeArrays<'_>> = ex
                .local_ranks()
                .iter()
                .zip(&self.ranks)
                .map(|(r, m)| HomeArrays { rank: r.rank(), home: m.home_atoms(), x: &r.x, v: m.velocity_buffer(), stream: &m.local })
                .collect();
            let tag = format!("{}homes-{}", self.tag, self.step);
            self.gather.gather(&self.placement, plan, &mine, &mut self.system, &tag)?;
        }
        if self.routing.is_some() {
            self.rollback.save(&self.system, &self.out, &self.partial, self.step);
        }
        t.gather = start.elapsed();
        let t1 = Instant::now();
        let plan = self.host_search.plan(&mut self.system, self.cfg.grid, &self.setup)?;
        t.plan = t1.elapsed();
        Ok(plan)
    }

    /// Whether this search decomposes from each process's own ranks ([`Self::redecompose`]):
    /// [`MdConfig::resident_search`] with GPU lists, several ranks, and a previous search whose
    /// plan says which atoms each local rank's GPU holds.
    fn redecomposes(&self) -> bool {
        self.cfg.resident_search
            && self.cfg.gpu_search
            && self.cfg.grid.num_ranks() > 1
            && self.plan.is_some()
            && self.exchange.as_ref().is_some_and(|ex| ex.local_ranks().len() == self.ranks.len())
    }

    /// Whether a redecomposition runs its per-atom passes on the ranks' GPUs
    /// ([`MdConfig::redecompose`] for this system and grid).
    fn redecomposes_on_gpus(&self) -> bool {
        self.cfg.redecompose.on_gpus(self.system.len(), self.cfg.grid.num_ranks())
    }

    /// The new plan from this process's ranks alone: each reads its home coordinates and
    /// velocities back from its GPU (ids from the last plan), and `decomp::redecompose` moves the atoms
    /// that left a rank's cell to their new owners and builds every pulse, with small all-gathers
    /// between the processes (`KeptGather` buffers across PEs). The plan equals the one the host
    /// would build from the whole system; the ranks' local atoms and home arrays are built from the
    /// result itself ([`search::HostSearch::rank_searches_redecomposed`]). The system's positions
    /// and velocities are not updated (nothing on this path reads them: a checked step gathers
    /// every home coordinate first, and a search through the host gathers every home atom or
    /// restores a saved state); under routing the state saved for a rollback stays the last
    /// gathered one (a rollback runs again from there, through the host).
    fn redecompose(&mut self, t: &mut SearchTimes, start: Instant) -> Result<Redecomposed> {
        let (Some(ex), Some(plan)) = (self.exchange.as_ref(), self.plan.as_ref()) else {
            return Err(HaloError::InvalidInput("a decomposition from the ranks needs a previous search".into()));
        };
        let (gather, host_search) = (&mut self.gather, &mut self.host_search);
        let homes = ex
            .local_ranks()
            .iter()
            .zip(&self.ranks)
            .map(|(r, m)| {
                let home = m.home_atoms();
                let ids = last_home_ids(plan, r.rank(), home);
                if ids.len() != home {
                    return Err(HaloError::InvalidInput(format!("rank {}: the plan holds {} home atoms, its GPU {home}", r.rank(), ids.len())));
                }
                let mut h = host_search.home_arrays(home);
                h.ids.extend_from_slice(ids);
                // One wait for both copies, on the rank's local stream (idle since the settle above).
                gather.read_home_into(&r.x, m.velocity_buffer(), home, &m.local, &mut h.positions, &mut h.velocities)?;
                Ok(h)
            })
            .collect::<Result<Vec<_>>>()?;
        t.gather = start.elapsed();
        let t1 = Instant::now();
        let mut gathers = Duration::ZERO;
        let (box_size, atoms) = (self.system.box_size, self.system.len());
        let done = {
            let mut all_gather = redecompose_gather(&self.placement, &mut self.kept_gather, &self.tag, self.step, &mut gathers);
            let mut rider = route_rider(&mut self.routing, self.cfg.grid.num_ranks());
            let rider = rider.as_mut().map(|r| r as &mut PlanRider<'_>);
            self.host_search.redecompose(self.cfg.grid, box_size, &self.setup, atoms, &self.ids, homes, &mut all_gather, rider)?
        };
        t.plan_gathers = gathers;
        t.plan = t1.elapsed();
        self.out.redecompositions += 1;
        Ok(done)
    }

    /// [`Self::redecompose`] with the per-atom passes on the ranks' GPUs
    /// ([`MdConfig::redecompose`]): each rank's home coordinates are read on its GPU (the
    /// exchange's `x`) with its velocities and the last plan's home ids; the leavers, the first
    /// pulses' selections and the new home atoms' ids and positions come back; the velocities
    /// stay there for the rank's update. The same plan and the same collectives as the host's.
    fn redecompose_on_gpus(&mut self, t: &mut SearchTimes, start: Instant) -> Result<Redecomposed> {
        let (Some(ex), Some(plan)) = (self.exchange.as_ref(), self.plan.as_ref()) else {
            return Err(HaloError::InvalidInput("a decomposition from the ranks needs a previous search".into()));
        };
        let taken_before: Vec<u64> = self.ranks.iter().map(MdRank::redecompose_ahead_taken).collect();
        // Where the GPU builds the grid, the home atoms' positions stay there (the host's local
        // atoms hold the halo atoms' only).
        let home_positions = self.lists_on() != search::ListsOn::GpuGrid;
        let mut devices = Vec::with_capacity(self.ranks.len());
        let _span = tracing::debug_span!("search.redecompose").entered();
        for (r, m) in ex.local_ranks().iter().zip(self.ranks.iter_mut()) {
            let ids = last_home_ids(plan, r.rank(), m.home_atoms());
            devices.push(m.home_device(r.rank(), &r.x, ids)?);
        }
        let spans = std::sync::Mutex::new(Vec::new());
        let mut timed: Vec<Timed<'_, '_>> = devices.iter_mut().map(|d| Timed { inner: d, spans: &spans }).collect();
        let mut dyns: Vec<&mut dyn HomeDevice> = timed.iter_mut().map(|d| d as &mut dyn HomeDevice).collect();
        t.gather = start.elapsed();
        let t1 = Instant::now();
        let mut gathers = Duration::ZERO;
        let (box_size, atoms) = (self.system.box_size, self.system.len());
        let done = {
            let mut all_gather = redecompose_gather(&self.placement, &mut self.kept_gather, &self.tag, self.step, &mut gathers);
            let mut rider = route_rider(&mut self.routing, self.cfg.grid.num_ranks());
            let rider = rider.as_mut().map(|r| r as &mut PlanRider<'_>);
            self.host_search.redecompose_on_devices(
                self.cfg.grid,
                box_size,
                &self.setup,
                atoms,
                &self.ids,
                &mut dyns,
                home_positions,
                &mut all_gather,
                rider,
            )?
        };
        t.plan_gathers = gathers;
        t.plan = t1.elapsed();
        t.plan_device = spans.lock().map(|mut s| busy_time(&mut s)).unwrap_or_default();
        drop(dyns);
        drop(timed);
        drop(devices);
        self.out.redecompositions += 1;
        let taken = self.ranks.iter().zip(&taken_before).all(|(m, &before)| m.redecompose_ahead_taken() > before);
        self.out.searches_begun_ahead += u64::from(taken && !self.ranks.is_empty());
        Ok(done)
    }

    /// Where a rank search builds the grid and lists: with [`MdConfig::resident_search`] both on
    /// the GPU from the local atoms, else the grid on the host and the lists where
    /// [`MdConfig::gpu_search`] says.
    fn lists_on(&self) -> search::ListsOn {
        match (self.cfg.gpu_search, self.cfg.resident_search) {
            (false, _) => search::ListsOn::Host,
            (true, false) => search::ListsOn::Gpu,
            (true, true) => search::ListsOn::GpuGrid,
        }
    }

    /// Whether this search runs entirely on the GPU: [`MdConfig::resident_search`] with lists
    /// searched on the GPU, one rank in all, and a previous search (its plan, exchange and rank
    /// state) to keep. A single rank has no halo, so its atoms never need to move between ranks
    /// or be reordered: only their grid and lists change.
    fn resident(&self) -> bool {
        self.cfg.resident_search
            && self.cfg.gpu_search
            && self.cfg.grid.num_ranks() == 1
            && self.ranks.len() == 1
            && self.plan.is_some()
            && self.exchange.as_ref().is_some_and(|ex| ex.local_ranks().len() == 1)
    }

    /// A search step on the GPU alone ([`Self::resident`]), `start` being when the GPUs went idle:
    /// wraps the rank's coordinates in place, sorts its grid and searches its lists there. The host
    /// copy of the system, the plan and the exchange stay as they were (the exchange has no pulse;
    /// checked steps read the coordinates back through the same plan). Under routing the state
    /// saved for a rollback stays the one of the last search through the host: a rollback (which
    /// one rank without peers has no cause for) would run again from there.
    fn search_resident(&mut self, start: Instant) -> Result<bool> {
        let ex = self.exchange.as_ref().ok_or_else(|| HaloError::InvalidInput("no exchange before a search on the GPU".into()))?;
        let (rank, m) = match (ex.local_ranks().first(), self.ranks.first_mut()) {
            (Some(r), Some(m)) => (r, m),
            _ => return Err(HaloError::InvalidInput("a search on the GPU needs the rank of a previous search".into())),
        };
        let found = m.search_resident(&rank.x, self.system.box_size)?;
        self.out.searches_begun_ahead += u64::from(found.begun_ahead);
        let t = SearchTimes {
            count: 1,
            total: start.elapsed(),
            lists: found.grid_time,
            grid: found.grid_time,
            pairs: found.lists_time,
            pairs_wait: found.wait_time,
            ..SearchTimes::default()
        };
        self.out.search.add(&t);
        self.out.searches += 1;
        self.out.resident_searches += 1;
        let nb = m.nbnxm();
        self.out.lists = ListSizes {
            home_atoms: m.home_atoms(),
            local_atoms: m.home_atoms(),
            local_entries: nb.entries(ListKind::Local),
            nonlocal_entries: nb.entries(ListKind::NonLocal),
            local_words: nb.words(ListKind::Local),
            nonlocal_words: nb.words(ListKind::NonLocal),
        };
        Ok(true)
    }

    /// Reads the energy records of the steps since the last search (the GPUs are idle) into this
    /// process's sums.
    fn collect_energies(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let n = self.pending.iter().map(|p| p.1 + 1).max().unwrap_or(0);
        let records = self.ranks.iter().map(|m| m.read_energies(n)).collect::<Result<Vec<_>>>()?;
        for &(step, rec) in &self.pending {
            let mut p = EnergyPoint { step, ..EnergyPoint::default() };
            for r in &records {
                p.potential += r[rec].potential;
                p.kinetic += r[rec].kinetic;
            }
            self.partial.push(p);
        }
        self.pending.clear();
        Ok(())
    }

    /// The energy points summed over every rank (an all-gather of this process's sums across PEs).
    fn total_energies(&self) -> Result<Vec<EnergyPoint>> {
        if self.placement.local_modules().is_some() || self.partial.is_empty() {
            return Ok(self.partial.clone());
        }
        let mine: Vec<f64> = self.partial.iter().flat_map(|p| [p.potential, p.kinetic]).collect();
        let all = self.placement.all_gather(&format!("{}energies", self.tag), vec![bytemuck::cast_slice(&mine).to_vec()])?;
        let mut out = self.partial.clone();
        for p in &mut out {
            (p.potential, p.kinetic) = (0.0, 0.0);
        }
        for b in &all {
            let v: Vec<f64> = bytemuck::pod_collect_to_vec(b);
            if v.len() != 2 * out.len() {
                return Err(HaloError::InvalidInput(format!("a PE recorded {} energy values, this one {}", v.len(), 2 * out.len())));
            }
            for (p, c) in out.iter_mut().zip(v.chunks_exact(2)) {
                p.potential += c[0];
                p.kinetic += c[1];
            }
        }
        Ok(out)
    }

    /// A checked step, after the exchange finished: every rank's coordinates against the
    /// exchange's reference, its home forces and the total potential energy against the
    /// undecomposed system, and the cross-rank integrity checksums (only checksum words, a few
    /// numbers and the first difference's text cross between PEs). Every PE gets the same result:
    /// the errors and counts over every rank, and the first difference (in rank order:
    /// coordinates, forces, then the energy and the pulses' checksums), `None` when nothing
    /// differed. `Err` only when the check itself cannot run.
    fn check_step(&mut self, step: u64, record: usize) -> Result<(StepCheck, Option<String>)> {
        let (Some(ex), Some(plan)) = (self.exchange.as_ref(), self.plan.as_ref()) else {
            return Err(HaloError::InvalidInput("a checked step before the first search".into()));
        };
        let halos = plan.rank_halos();
        let ids: Vec<usize> = ex.local_ranks().iter().map(RankExchange::rank).collect();
        let (xs, fs) = (ex.read_forward()?, ex.read_reverse()?);
        let mine = xs.iter().zip(&ids).map(|(v, &r)| vec![v[..halos[r].home_atoms].to_vec()]).collect();
        let homes: Vec<Vec<Float3>> =
            gather(&self.placement, &format!("{}check-{step}", self.tag), mine)?.into_iter().map(|mut p| p.swap_remove(0)).collect();
        let want = reference::coordinates(&halos, &homes);
        // Every rank's home ids too: after a redecomposition a process holds only its own ranks'.
        let mine = ids.iter().map(|&r| vec![plan.ranks[r].global_ids[..halos[r].home_atoms].to_vec()]).collect();
        let home_ids: Vec<Vec<u32>> =
            gather(&self.placement, &format!("{}check-ids-{step}", self.tag), mine)?.into_iter().map(|mut p| p.swap_remove(0)).collect();
        for (r, (h, g)) in homes.iter().zip(&home_ids).enumerate() {
            if g.len() != h.len() {
                return Err(HaloError::InvalidInput(format!("rank {r} gave {} ids for {} home atoms", g.len(), h.len())));
            }
            for (v, &id) in h.iter().zip(g) {
                let id = id as usize;
                let slot = self
                    .system
                    .positions
                    .get_mut(id)
                    .ok_or_else(|| HaloError::InvalidInput(format!("rank {r} holds atom {id}, beyond the system")))?;
                *slot = *v;
            }
        }
        // The undecomposed reference: forces and potential energy in one pass on the host's threads.
        if self.reference_workers.is_none() {
            let pes = if matches!(self.placement, Placement::Pe { .. }) { self.cfg.grid.num_ranks() } else { 1 };
            self.reference_workers = Some(crate::workers::Workers::new(reference_threads(pes))?);
        }
        let workers = self.reference_workers.as_ref().ok_or_else(|| HaloError::InvalidInput("no reference threads".into()))?;
        let reference =
            md_reference::lj_forces_and_energy(&self.system, self.cfg.cutoff, workers).map_err(|e| HaloError::InvalidInput(e.to_string()))?;
        let want_e = reference.energy;
        // Each local rank's coordinates, forces and potential energy; then every rank's, on every PE.
        let energies: Vec<f64> = self.ranks.iter().map(|m| m.read_energies(record + 1).map(|e| e[record].potential)).collect::<Result<_>>()?;
        let mine = ids
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                let (c, first) = check_rank(plan, &halos[r], r, &xs[i], &want[r], &fs[i], &reference);
                encode_rank_check(&c, energies.get(i).copied().unwrap_or(f64::NAN), first.as_deref())
            })
            .collect();
        let all = self.placement.all_gather(&format!("{}check-errors-{step}", self.tag), mine)?;
        let mut c = StepCheck::default();
        // The first difference named is a rank's wrong coordinate where there is one (the cause),
        // before any rank's force error (its effect on the neighbours' pairs).
        let (mut first, mut first_coordinate) = (None, None);
        let mut gpu = 0.0;
        for b in &all {
            let (rc, e, why) = decode_rank_check(b)?;
            if rc.coord_mismatches > 0 {
                first_coordinate = first_coordinate.or_else(|| why.clone());
            }
            c.merge(rc);
            gpu += e;
            first = first.or(why);
        }
        let mut first = first_coordinate.or(first);
        // The potential energy of every rank's pairs against the undecomposed system.
        c.energy_rel = (gpu - want_e).abs() / want_e.abs().max(1e-9);
        if !c.energy_passed() {
            first.get_or_insert_with(|| {
                format!("the GPU potential energy is {gpu:.4} kJ/mol, the undecomposed reference {want_e:.4} (relative error {:.2e})", c.energy_rel)
            });
        }
        // Cross-rank integrity: both ends of every pulse agree on what moved.
        let words = ids
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                let sums = RankChecksums::compute(r, &halos[r], &plan.ranks[r].global_ids, &xs[i], &fs[i])?;
                Ok(sums.to_words().iter().flat_map(|w| w.to_le_bytes()).collect())
            })
            .collect::<Result<Vec<Vec<u8>>, integrity::IntegrityError>>()
            .map_err(|e| HaloError::InvalidInput(format!("step {step}: {e}")))?;
        let all = self.placement.all_gather(&format!("{}integrity-{step}", self.tag), words)?;
        let found = all
            .iter()
            .enumerate()
            .map(|(r, b)| {
                RankChecksums::from_words(r, &b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())).collect::<Vec<_>>())
            })
            .collect::<Result<Vec<_>, _>>()
            .and_then(|sums| integrity::halo_mismatches(&halos, &sums))
            .map_err(|e| HaloError::InvalidInput(format!("step {step}: {e}")))?;
        c.halo_mismatches = found.len() as u64;
        c.pulses_checked = halos.iter().map(|h| h.pulses.len() as u64).sum();
        if let Some(m) = found.first() {
            first.get_or_insert_with(|| m.to_string());
        }
        let failure = first.map(|f| {
            format!(
                "{f}; in all {} atom(s) with coordinates not bit-exact after the halo (max abs err {:.2e} nm), {} force component(s) beyond \
                 {FORCE_TOLERANCE:.0e} of their scale, {} of {} pulse range(s) whose checksums differ from what was sent",
                c.coord_mismatches, c.coord_max_abs, c.force_mismatches, c.halo_mismatches, c.pulses_checked
            )
        });
        Ok((c, failure))
    }
}

impl Drop for MdRun {
    /// Waits (best effort) for queued work before the buffers it uses (and the graphs) are freed.
    fn drop(&mut self) {
        for m in &self.ranks {
            let _ = m.synchronize();
        }
        if let Some(ex) = self.exchange.as_mut() {
            let _ = ex.finish();
        }
    }
}

/// Rank `rank`'s home atoms' global ids in the last `plan` (at most `home` of them; none where the
/// plan has no such rank): the ids of the home coordinates its GPU holds.
fn last_home_ids(plan: &HaloPlan, rank: usize, home: usize) -> &[u32] {
    plan.ranks.get(rank).map(|p| &p.global_ids[..home.min(p.global_ids.len())]).unwrap_or_default()
}

/// How a search step built its new plan, which decides how its replan is fenced
/// ([`replan_fence`]). (A search on the GPU alone keeps its exchange and does not replan.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SearchPath {
    /// From each process's own ranks (`MdRun::redecompose`): all-gathers across the PEs after
    /// every PE settled its streams.
    Redecomposed,
    /// From the whole system gathered on every process (`MdRun::gather_and_plan`).
    Gathered,
}

/// The fence of a search step's replan on `path`:
/// - [`SearchPath::Redecomposed`]: [`ReplanFence::AfterCollective`]. Every PE waited for its
///   streams at the start of the search (`MdRun::settle`, or the safe point's) and then entered
///   the redecomposition's all-gathers, of which `decomp::TAG_MIGRATE` runs across the PEs at
///   every call (one per pulse and `TAG_PLAN` follow; only a process that drives every rank
///   skips the last, and it has no peer process); a PE leaves one only after every PE entered
///   it, and none launches anything of the exchange or writes a peer before its replan.
/// - [`SearchPath::Gathered`]: [`ReplanFence::Barrier`]. Its gather is collective too (a barrier
///   after the device copies into every PE's gather buffers), but those buffers are written
///   again by peers at the next search, and what keeps that write after this PE's read of them
///   is this replan's barrier, which the PE enters only after reading (`HomeGather::gather`).
fn replan_fence(path: SearchPath) -> ReplanFence {
    match path {
        SearchPath::Redecomposed => ReplanFence::AfterCollective,
        SearchPath::Gathered => ReplanFence::Barrier,
    }
}

/// What a search step did that decides whether its uploads need a host wait
/// ([`uploads_need_context_sync`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SearchSyncFacts {
    /// The exchange was built at this search (its set-up copies synchronously from pageable
    /// memory), not replanned.
    new_exchange: bool,
    /// Some rank's GPU state was made at this search (`MdRank::new`: the LJ table and the first
    /// buffers, synchronous copies).
    new_rank: bool,
    /// Some rank's lists or grid came from the host (`NbnxmGpu::update`, `update_on_gpu`:
    /// synchronous copies from pageable memory), not from its local atoms on the GPU.
    pageable_lists: bool,
}

/// Whether the search step must synchronise the contexts before its first step: whenever
/// anything of it crossed in a synchronous copy from pageable memory (the legacy default stream,
/// which the steps' non-blocking streams do not follow, and whose DMA may land after the call
/// returned). Otherwise every upload is ordered before its readers on the GPU (see the call).
fn uploads_need_context_sync(f: &SearchSyncFacts) -> bool {
    f.new_exchange || f.new_rank || f.pageable_lists
}

/// Sizes of this process's grids and lists at the search just done.
fn list_sizes(found: &[search::RankSearch], ranks: &[MdRank]) -> ListSizes {
    let mut s = ListSizes::default();
    for (r, m) in found.iter().zip(ranks) {
        s.home_atoms += r.lists.home_atoms();
        s.local_atoms += r.lists.atoms();
        s.local_entries += m.nbnxm().entries(ListKind::Local);
        s.nonlocal_entries += m.nbnxm().entries(ListKind::NonLocal);
        s.local_words += m.nbnxm().words(ListKind::Local);
        s.nonlocal_words += m.nbnxm().words(ListKind::NonLocal);
    }
    s
}

/// Every rank's arrays (the same count per rank, any lengths) from each local rank's `mine`:
/// serialised and gathered across PEs ([`Placement::all_gather`]), as they are in one process.
fn gather<T: bytemuck::Pod>(placement: &Placement, tag: &str, mine: Vec<Vec<Vec<T>>>) -> Result<Vec<Vec<Vec<T>>>> {
    let size = std::mem::size_of::<T>();
    let count = mine.first().map_or(0, Vec::len);
    let bytes = mine
        .iter()
        .map(|arrays| {
            let mut b = Vec::new();
            for a in arrays {
                b.extend_from_slice(&(a.len() as u64).to_le_bytes());
                b.extend_from_slice(bytemuck::cast_slice(a));
            }
            b
        })
        .collect();
    let all = placement.all_gather(tag, bytes)?;
    all.iter()
        .map(|b| {
            let mut arrays = Vec::with_capacity(count);
            let mut at = 0usize;
            for _ in 0..count {
                let len = b.get(at..at + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap_or_default()) as usize);
                let len = len.ok_or_else(|| HaloError::InvalidInput("truncated gather".into()))?;
                at += 8;
                let raw = b.get(at..at + size * len).ok_or_else(|| HaloError::InvalidInput("truncated gather".into()))?;
                arrays.push(bytemuck::pod_collect_to_vec::<u8, T>(raw));
                at += size * len;
            }
            Ok(arrays)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_counts_overlapping_spans_once() {
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        assert_eq!(busy_time(&mut []), Duration::ZERO);
        // Two ranks side by side (10-50 and 20-60), then one alone (100-130), given out of order.
        let mut spans = vec![(at(100), at(130)), (at(20), at(60)), (at(10), at(50))];
        assert_eq!(busy_time(&mut spans), Duration::from_micros(80));
        // Touching spans join; a span inside another adds nothing.
        let mut spans = vec![(at(0), at(10)), (at(10), at(20)), (at(2), at(5))];
        assert_eq!(busy_time(&mut spans), Duration::from_micros(20));
    }

    #[test]
    fn redecompose_auto_uses_the_gpus_from_ten_thousand_home_atoms_a_rank() {
        assert!(Redecompose::Auto.on_gpus(45_000, 2), "22,500 a rank: measured faster on the GPUs");
        assert!(!Redecompose::Auto.on_gpus(6000, 2), "3,000 a rank: measured faster on the host");
        assert!(!Redecompose::Auto.on_gpus(45_000, 8) && Redecompose::Auto.on_gpus(180_000, 8));
        assert!(Redecompose::Gpu.on_gpus(6000, 2) && !Redecompose::Host.on_gpus(180_000, 2));
        for r in [Redecompose::Auto, Redecompose::Gpu, Redecompose::Host] {
            assert_eq!(Redecompose::parse(r.name()).unwrap(), r);
        }
        let e = Redecompose::parse("cpu").unwrap_err().to_string();
        assert!(e.contains("`cpu`") && e.contains("auto, gpu or host"), "{e}");
    }

    #[test]
    fn drift_is_the_least_squares_slope_per_atom() {
        // Total energy 100 + 3 t (t in ns) with a wiggle that averages out: slope 3 kJ/mol/ns.
        let dt = 0.002;
        let mut o = MdOutcome::default();
        for k in 0..101u64 {
            let t_ns = k as f64 * 10.0 * dt * 1e-3;
            let wiggle = if k % 2 == 0 { 0.01 } else { -0.01 };
            o.energies.push(EnergyPoint { step: 10 * k, potential: 60.0 + 3.0 * t_ns + wiggle, kinetic: 40.0 });
        }
        let d = o.drift(1000, dt, 0).unwrap();
        assert!((d.total_kj_mol_ns - 3.0).abs() < 0.05, "{d:?}");
        assert!((d.per_atom_kj_mol_ns - 3e-3).abs() < 5e-5);
        assert!((d.fluctuation - 0.01).abs() < 1e-3 && (d.mean - 100.0).abs() < 0.01);
        assert!((d.span_ps - 2.0).abs() < 1e-9, "{}", d.span_ps);
        assert_eq!(d.points, 101);
        assert_eq!(o.drift(1000, dt, 995), None, "one point is not a line");
    }

    #[test]
    fn setups_follow_the_rule_or_the_explicit_buffer() {
        let sys = MolecularSystem::generate(6000, 1).unwrap();
        let mut cfg = MdConfig::new(6000, RankGrid::new([2, 1, 1]).unwrap());
        let rule = cfg.list_setup(&sys).unwrap();
        assert_eq!((rule.nstlist, rule.nstprune), (100, 50));
        // The drift-based buffer at DEFAULT_DRIFT_TOLERANCE (docs/nbnxm.md: 0.063 nm at nstlist
        // 100, none for the inner list at nstprune 50); a stricter tolerance buys a larger buffer.
        assert!(rule.rlist > 1.04 && rule.rlist < 1.09 && rule.rlist_inner == 1.0, "{rule:?}");
        let strict = MdConfig { buffer_tolerance: 1e-3, ..cfg.clone() }.list_setup(&sys).unwrap();
        assert!(strict.rlist > rule.rlist + 0.05, "{strict:?} vs {rule:?}");
        cfg.buffer = Some(0.02);
        let s = cfg.list_setup(&sys).unwrap();
        assert_eq!((s.rlist, s.rlist_inner), (1.02, 1.0));
        cfg.inner_buffer = Some(0.01);
        let s = cfg.list_setup(&sys).unwrap();
        assert_eq!((s.rlist, s.rlist_inner), (1.02, 1.01));
        cfg.inner_buffer = Some(0.03);
        assert!(cfg.list_setup(&sys).unwrap_err().to_string().contains("inner list cutoff"), "an inner buffer above the outer one");
        cfg.buffer = None;
        let s = cfg.list_setup(&sys).unwrap();
        assert_eq!((s.rlist, s.rlist_inner), (rule.rlist, 1.03), "the rule's outer list with an explicit inner buffer");
        cfg.inner_buffer = None;
        cfg.nstprune = 200;
        assert_eq!(cfg.list_setup(&sys).unwrap().nstprune, 100, "nstprune is capped at nstlist");
        cfg.nstlist = 0;
        assert!(cfg.list_setup(&sys).unwrap_err().to_string().contains("nstlist"));
    }

    #[test]
    fn only_a_search_with_pageable_copies_waits_for_its_uploads() {
        // The fast path: a replan (in one process or across PEs), the ranks kept, the lists searched
        // from the local atoms.
        let fast = SearchSyncFacts { new_exchange: false, new_rank: false, pageable_lists: false };
        assert!(!uploads_need_context_sync(&fast));
        for slow in [
            SearchSyncFacts { new_exchange: true, ..fast },
            SearchSyncFacts { new_rank: true, ..fast },
            SearchSyncFacts { pageable_lists: true, ..fast },
        ] {
            assert!(uploads_need_context_sync(&slow), "{slow:?}");
        }
        // The first search builds everything.
        assert!(uploads_need_context_sync(&SearchSyncFacts { new_exchange: true, new_rank: true, pageable_lists: false }));
    }

    #[test]
    fn only_a_search_planned_from_the_ranks_lets_its_all_gathers_fence_the_replan() {
        // The redecomposition's all-gathers follow every PE's settle: they are the fence.
        assert_eq!(replan_fence(SearchPath::Redecomposed), ReplanFence::AfterCollective);
        // The gathered path's buffers rely on the replan's barrier for their reuse: kept.
        assert_eq!(replan_fence(SearchPath::Gathered), ReplanFence::Barrier);
    }

    #[test]
    fn energy_steps_include_checked_steps() {
        let mut cfg = MdConfig::new(100, RankGrid::new([1, 1, 1]).unwrap());
        cfg.check_every = 0;
        assert!(!cfg.energy_step(0));
        cfg.energy_every = 50;
        assert!(cfg.energy_step(0) && cfg.energy_step(100) && !cfg.energy_step(75));
        cfg.check_every = 25;
        assert!(cfg.energy_step(75));
    }

    /// A decomposed system as a correct checked step sees it: the plan and halos, the coordinates
    /// the halo must deliver, the undecomposed forces, and each rank's forces rounded from them.
    type CheckedState = (HaloPlan, Vec<RankHalo>, Vec<Vec<Float3>>, md_reference::ReferenceForces, Vec<Vec<Float3>>);

    fn checked_state(grid: [usize; 3]) -> CheckedState {
        let sys = MolecularSystem::generate(3000, 3).unwrap();
        let plan = HaloPlan::build(&sys, RankGrid::new(grid).unwrap(), 1.0).unwrap();
        let halos = plan.rank_halos();
        let homes: Vec<Vec<Float3>> =
            plan.ranks.iter().map(|r| r.global_ids[..r.home_atoms].iter().map(|&g| sys.positions[g as usize]).collect()).collect();
        let x = reference::coordinates(&halos, &homes);
        let ref_f = md_reference::lj_forces_and_energy(&sys, 1.0, &crate::workers::Workers::serial()).unwrap();
        let f32s = |v: [f64; 3]| Float3::new(v[0] as f32, v[1] as f32, v[2] as f32);
        let f = plan.ranks.iter().map(|r| r.global_ids.iter().map(|&g| f32s(ref_f.forces[g as usize])).collect()).collect();
        (plan, halos, x, ref_f, f)
    }

    #[test]
    fn coordinate_errors_measure_every_differing_atom() {
        let want: Vec<Float3> = (0..10).map(|i| Float3::new(i as f32, 0.5, -1.0)).collect();
        let e = coordinate_errors(&want, &want, 4);
        assert_eq!(e, CoordinateErrors { max_abs: 0.0, mismatches: 0, halo_atoms: 6, first: None });
        let mut x = want.clone();
        x[6].y += 0.25;
        x[8].x = f32::from_bits(x[8].x.to_bits() ^ 1);
        let e = coordinate_errors(&x, &want, 4);
        assert_eq!((e.mismatches, e.first, e.max_abs), (2, Some(6), 0.25), "{e:?}");
        // A sign of zero is a different bit pattern with no distance; a NaN is infinitely wrong.
        let mut x = want.clone();
        x[5] = Float3::new(-0.0, 0.5, -1.0);
        let mut w = want.clone();
        w[5] = Float3::new(0.0, 0.5, -1.0);
        let e = coordinate_errors(&x, &w, 4);
        assert_eq!((e.mismatches, e.max_abs), (1, 0.0), "{e:?}");
        x[7].z = f32::NAN;
        let e = coordinate_errors(&x, &w, 4);
        assert_eq!((e.mismatches, e.first, e.max_abs), (2, Some(5), f64::INFINITY), "{e:?}");
    }

    /// The check's false alarm at 180,000 atoms, rebuilt: atom `i` at the top of a 12.2 nm box
    /// between two close partners (0.17 nm), one across the periodic boundary, so that its force
    /// nearly cancels; 72 lone atoms set the RMS force. Its force from `f32` coordinates, the
    /// partner's shifted across the boundary and rounded as a halo pulse or a shift vector rounds
    /// it, the pair terms then exact: beyond 1e-4 of max(|F|, RMS), so the check without the
    /// rounding term failed a correct force; within the allowance with it. A missing pair still
    /// fails by far.
    #[test]
    fn a_close_pair_across_a_periodic_boundary_is_allowed_its_f32_rounding_and_no_more() {
        use halo::system::default_atom_types;
        let l = 12.1644f32;
        let (a, r, dy) = (0.004f32, 0.17f32, 0.03f32);
        let dx = (r * r - dy * dy).sqrt();
        // `j` just above 0 whose shift by the box rounds the most in f32.
        let shift_error = |b: f32| (f64::from(b + l) - (f64::from(b) + f64::from(l))).abs();
        let b = (0..400).map(|k| dx - a + k as f32 * 1e-7).max_by(|&u, &v| shift_error(u).total_cmp(&shift_error(v))).unwrap();
        let (i, j, k) = (Float3::new(l - a, 6.0, 6.0), Float3::new(b, 6.0 + dy, 6.0), Float3::new(l - a - dx, 6.0 - dy, 6.0));
        let mut positions = vec![i, j, k];
        for x in [1.0f32, 3.0, 5.0, 7.0, 9.0, 11.0] {
            for y in [1.0f32, 3.0, 5.0, 7.0, 9.0, 11.0] {
                positions.extend([Float3::new(x, y, 1.5), Float3::new(x, y, 3.5)]);
            }
        }
        let n = positions.len();
        let sys = MolecularSystem {
            box_size: [l; 3],
            velocities: vec![Float3::new(0.0, 0.0, 0.0); n],
            types: vec![0; n],
            atom_types: default_atom_types(),
            seed: 0,
            positions,
        };
        let reference = md_reference::lj_forces_and_energy(&sys, 1.0, &crate::workers::Workers::serial()).unwrap();
        let want = reference.forces[0];
        let rms = reference.rms();
        // Atom i's force from f32 coordinates: j shifted by +L in f32, the differences and pair terms exact.
        let p = sys.lj_pair(0, 0);
        let pair = |d: [f64; 3]| md_reference::lj_force_over_r(d.iter().map(|c| c * c).sum(), p.c6, p.c12);
        let f64s = |v: Float3| [v.x, v.y, v.z].map(f64::from);
        let (xi, xj, xk) = (f64s(i), f64s(Float3::new(j.x + l, j.y, j.z)), f64s(k));
        let (dj, dk): ([f64; 3], [f64; 3]) = (std::array::from_fn(|c| xj[c] - xi[c]), std::array::from_fn(|c| xk[c] - xi[c]));
        let (sj, sk) = (pair(dj), pair(dk));
        let got: [f64; 3] = std::array::from_fn(|c| -sj * dj[c] - sk * dk[c]);
        let error = (0..3).map(|c| (got[c] - want[c]).abs()).fold(0.0, f64::max);
        let magnitude = want.iter().map(|c| c * c).sum::<f64>().sqrt();
        assert!(shift_error(b) > 4e-7 && magnitude < rms, "shift error {:e}, |F| {magnitude} against RMS {rms}", shift_error(b));
        assert!(error > FORCE_TOLERANCE * magnitude.max(rms), "error {error:e}, |F| {magnitude}, RMS {rms}");
        assert_eq!(reference.rounding, md_reference::displacement_rounding(sys.box_size));
        let allowance = FORCE_TOLERANCE * force_allowance(&want, rms, reference.stiffness[0], reference.rounding);
        assert!(error <= allowance, "error {error:e}, allowed {allowance:e}");
        // Without the pair with k the force is off by that pair's force, far beyond the allowance.
        let missing: [f64; 3] = std::array::from_fn(|c| -sj * dj[c]);
        assert!((0..3).any(|c| (missing[c] - want[c]).abs() > 100.0 * allowance), "{missing:?} {want:?} {allowance:e}");
    }

    #[test]
    fn a_corrupted_or_stale_halo_atom_fails_the_rank_check_with_its_error() {
        let (plan, halos, x, ref_f, f) = checked_state([2, 1, 1]);
        for r in 0..2 {
            let (c, first) = check_rank(&plan, &halos[r], r, &x[r], &x[r], &f[r], &ref_f);
            assert!(first.is_none() && c.passed(), "rank {r}: {c:?} {first:?}");
            assert_eq!((c.coord_max_abs, c.coord_mismatches), (0.0, 0));
            assert_eq!(c.halo_atoms_checked, (halos[r].total_atoms - halos[r].home_atoms) as u64);
            assert!(c.halo_atoms_checked > 0 && c.force_max_rel < 1e-6, "{c:?}");
        }
        // Rank 1's halo atom in the middle of pulse 0's receive range corrupted by 0.125 nm in y.
        let p = &halos[1].pulses[0];
        let k = p.atom_offset + p.recv_size / 2;
        let mut bad = x[1].clone();
        bad[k].y += 0.125;
        let (c, first) = check_rank(&plan, &halos[1], 1, &bad, &x[1], &f[1], &ref_f);
        assert_eq!(c.coord_mismatches, 1);
        assert!((c.coord_max_abs - 0.125).abs() < 1e-6, "{c:?}");
        assert!(!c.passed() && c.mismatches() == 1, "{c:?}");
        let first = first.expect("a difference is described");
        let g = plan.ranks[1].global_ids[k];
        let slot = k - p.atom_offset;
        let named = format!(
            "rank 1: 1 atom(s) differ from the reference, the first is local atom {k} (received in pulse 0 from rank {}, slot {slot} of that pulse) (global {g}",
            p.recv_rank
        );
        assert!(first.contains(&named) && first.contains("max abs coordinate error 1.250e-1 nm"), "{first}");
        // A dropped atom: the receive slot still holds last step's value (0.002 nm behind).
        let mut stale = x[1].clone();
        stale[p.atom_offset].x -= 0.002;
        let (c, _) = check_rank(&plan, &halos[1], 1, &stale, &x[1], &f[1], &ref_f);
        assert!(c.coord_mismatches == 1 && c.coord_max_abs > 1e-3 && c.coord_max_abs < 3e-3, "{c:?}");
        // A home force off by 1%: the force check counts it.
        let mut wrong = f[0].clone();
        wrong[0].x = wrong[0].x * 1.01 + 1.0;
        let (c, first) = check_rank(&plan, &halos[0], 0, &x[0], &x[0], &wrong, &ref_f);
        assert!(c.force_mismatches == 1 && c.force_max_rel > FORCE_TOLERANCE && c.coord_mismatches == 0, "{c:?}");
        assert!(first.is_some_and(|m| m.contains("has force")));
    }

    #[test]
    fn a_rank_check_crosses_pes_whole_and_merges_largest_errors_and_summed_counts() {
        let c = StepCheck {
            coord_max_abs: 0.5,
            coord_mismatches: 3,
            halo_atoms_checked: 700,
            force_max_rel: 2e-6,
            force_max_abs: 1e-3,
            force_mismatches: 1,
            ..StepCheck::default()
        };
        let b = encode_rank_check(&c, -1234.5, Some("rank 1 local atom 9"));
        let (back, e, first) = decode_rank_check(&b).unwrap();
        assert_eq!((back, e, first.as_deref()), (c, -1234.5, Some("rank 1 local atom 9")));
        assert_eq!(decode_rank_check(&encode_rank_check(&StepCheck::default(), 1.0, None)).unwrap().2, None);
        assert!(decode_rank_check(&b[..20]).is_err());
        let mut all = StepCheck { halo_mismatches: 2, pulses_checked: 4, energy_rel: 1e-6, ..StepCheck::default() };
        all.merge(c);
        all.merge(StepCheck { coord_max_abs: 0.1, coord_mismatches: 1, halo_atoms_checked: 300, ..StepCheck::default() });
        assert_eq!((all.coord_max_abs, all.coord_mismatches, all.halo_atoms_checked, all.halo_mismatches), (0.5, 4, 1000, 2));
        assert_eq!(all.mismatches(), 4 + 1 + 2, "coordinates, forces and pulse ranges");
        let mut energy = StepCheck { energy_rel: 2.0 * ENERGY_TOLERANCE, ..StepCheck::default() };
        assert_eq!(energy.mismatches(), 1);
        energy.merge(StepCheck { energy_rel: f64::NAN, ..StepCheck::default() });
        energy.merge(StepCheck::default());
        assert!(energy.energy_rel.is_nan() && !energy.passed(), "a NaN energy stays a failure");
        assert!(StepCheck::default().passed());
    }

    /// Only one rank in all, with no pulse, steps without halo work.
    #[test]
    fn a_step_has_no_halo_work_only_for_one_rank_without_pulses() {
        let one = RankGrid::new([1, 1, 1]).unwrap();
        assert!(alone(one, [0].into_iter()));
        assert!(!alone(one, [1].into_iter()), "a pulse");
        assert!(!alone(one, std::iter::empty()), "no local rank");
        assert!(!alone(RankGrid::new([2, 1, 1]).unwrap(), [0].into_iter()), "another rank in the grid");
        assert!(!alone(RankGrid::new([2, 1, 1]).unwrap(), [0, 0].into_iter()), "two ranks");
    }
}
