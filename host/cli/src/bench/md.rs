//! `halo md-bench`: ns/day of the whole MD step per transport. Every step is counted, search steps
//! included: each repeat is `steps` consecutive steps (a whole number of list lifetimes) timed by
//! the host clock from an idle GPU to an idle GPU; the median over repeats after a warm-up is
//! reported, with the share of the time the search steps' host work took.
//!
//! Every row is checked outside its timed steps: [`CHECKED_BEFORE`] steps after the warm-up and
//! [`CHECKED_AFTER`] after the last repeat run checked (coordinates after the halo bit-exact
//! against the CPU reference of the halo, forces and potential energy against the undecomposed
//! CPU reference, both ends of every pulse agreeing: `MdRun::run_checked_steps`). A row carries
//! its times and `checked: true` only when all of them passed.

use super::search_parts::{self, SearchPartsSummary};
use super::stats::{Summary, ns_per_day};
use crate::decomp::RankGrid;
use crate::error::{HaloError, Result};
use crate::exchange::{Placement, Transport};
use crate::machine::MachineInfo;
use halo_md::{MdConfig, MdOutcome, MdRun};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Checked steps of every row after its warm-up, before the timed repeats (not timed).
pub const CHECKED_BEFORE: u64 = 2;
/// Checked steps of every row after its timed repeats (not timed).
pub const CHECKED_AFTER: u64 = 1;

/// What to measure.
#[derive(Clone, Debug)]
pub struct MdBenchConfig {
    /// Timed steps per repeat (a multiple of `step.nstlist`).
    pub steps: u64,
    /// Timed repeats.
    pub repeats: usize,
    /// Untimed steps first (rounded up to a multiple of `step.nstlist`).
    pub warmup: u64,
    /// The step's options (lists, cutoff, time step, search).
    pub step: crate::cli::StepArgs,
    /// Plain steps replayed as CUDA graphs.
    pub graph: bool,
    /// After the timed repeats of a row without graphs, profile [`PHASE_LISTS`] list lifetimes'
    /// steps ([`MdRun::profile_phases`]) into the row's `phases`.
    pub phases: bool,
    /// Record the timed repeats' search parts ([`crate::bench::search_parts`]) into the row's
    /// `search_parts`.
    pub search_parts: bool,
}

/// List lifetimes (`nstlist` steps each) of steps profiled by `--phases`.
pub const PHASE_LISTS: u64 = 2;

impl MdBenchConfig {
    /// Checks the step counts: `steps` a positive multiple of `nstlist`, at least one repeat.
    pub fn validate(&self) -> Result<()> {
        let nstlist = self.step.nstlist;
        if nstlist == 0 || self.steps == 0 || !self.steps.is_multiple_of(nstlist) {
            return Err(HaloError::InvalidInput(format!(
                "--steps {} must be a positive multiple of --nstlist {nstlist} (so every repeat holds the same number of search steps)",
                self.steps
            )));
        }
        if self.repeats == 0 {
            return Err(HaloError::InvalidInput("--repeats must be at least 1".into()));
        }
        Ok(())
    }

    fn md(&self, atoms: usize, grid: RankGrid, transport: Transport) -> MdConfig {
        self.step.apply(MdConfig { transport, check_every: 0, energy_every: 0, graph: self.graph, ..MdConfig::new(atoms, grid) })
    }
}

/// The version of [`MdBenchDoc`]'s format (a bare list of rows, with no version, came before it).
pub const MD_BENCH_SCHEMA_VERSION: u32 = 1;

/// What `halo md-bench --json` writes: the format's version and the rows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MdBenchDoc {
    /// [`MD_BENCH_SCHEMA_VERSION`] when written.
    pub schema_version: u32,
    /// One per transport and size, in the order run.
    pub rows: Vec<MdBenchRow>,
}

impl MdBenchDoc {
    /// The document of `rows`, at this version.
    pub fn new(rows: Vec<MdBenchRow>) -> Self {
        Self { schema_version: MD_BENCH_SCHEMA_VERSION, rows }
    }

    /// The rows of `text`, a document of this version (or the problem, naming the version found).
    pub fn rows_of(text: &str) -> Result<Vec<MdBenchRow>, String> {
        let doc: MdBenchDoc = serde_json::from_str(text).map_err(|e| format!("not an md-bench document: {e}"))?;
        if doc.schema_version != MD_BENCH_SCHEMA_VERSION {
            return Err(format!("md-bench document version {}, this halo reads version {MD_BENCH_SCHEMA_VERSION}", doc.schema_version));
        }
        Ok(doc.rows)
    }
}

/// One transport at one size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MdBenchRow {
    /// Transport name.
    pub transport: String,
    /// Atoms in the system.
    pub atoms: usize,
    /// GPUs the ranks ran on.
    pub gpus: usize,
    /// Rank grid.
    pub ranks: String,
    /// `one process`, `N PEs (NVSHMEM), one per GPU` or `N PEs (NVSHMEM) on M GPU(s)`.
    pub mode: String,
    /// Median time per step over the repeats (µs, every step counted).
    pub step_us_median: Option<f64>,
    /// Fastest repeat (µs per step).
    pub step_us_min: Option<f64>,
    /// Slowest repeat (µs per step).
    pub step_us_max: Option<f64>,
    /// ns/day at the median step time.
    pub ns_per_day: Option<f64>,
    /// Timed steps per repeat.
    pub steps: u64,
    /// Timed repeats.
    pub repeats: usize,
    /// Untimed steps before.
    pub warmup_steps: u64,
    /// Always true: search steps are inside the timed steps.
    pub search_included: bool,
    /// Search steps per repeat.
    pub searches_per_repeat: u64,
    /// Median share of a repeat's time spent in the search steps' host work (0..1).
    pub search_share: Option<f64>,
    /// Host time of one search step (ms, mean over the timed ones), from the host's wait for the
    /// steps before it on. A search's first GPU passes begun ahead (`searches_begun_ahead`) ran
    /// before that: their GPU time is in the step time, not here.
    pub search_ms: Option<f64>,
    /// Of which: gather, plan, local atoms + grid (+ host lists), GPU lists, upload (ms, mean).
    pub search_parts_ms: Option<[f64; 5]>,
    /// Of the plan, when planned from the ranks' own atoms: the time inside the all-gathers between
    /// processes (ms, mean).
    pub plan_gathers_ms: Option<f64>,
    /// Of the plan, when its per-atom passes ran on the GPUs: the time in them (ms, mean).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_device_ms: Option<f64>,
    /// Of the GPU lists, when searched on the GPU: the host's wait for the grid's and the lists'
    /// first passes (their GPU time that no host work hid; ms, mean).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lists_wait_ms: Option<f64>,
    /// Where the cluster-pair lists were searched: `gpu` (the grid sorted on the host),
    /// `gpu-resident` (grid and lists on the GPU, nothing through the host: one rank),
    /// `gpu-redecomposed` (several ranks: each process plans from its own ranks' atoms, the GPU
    /// sorts the grid and searches the lists) or `host`.
    pub list_search: String,
    /// With `gpu-redecomposed`: where the per-atom passes of the redecomposition ran, `gpu`
    /// (wrap, owners, merge and first-pulse selection on each rank's GPU, the velocities left
    /// there) or `host` (every home atom read back), as `--redecompose` chose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redecompose: Option<String>,
    /// Of the timed repeats' searches, those whose first GPU passes (a GPU-resident search's
    /// grid and lists' first passes, every rank's migration on the GPUs) were enqueued behind
    /// the steps before them, before the host waited for those steps.
    #[serde(default)]
    pub searches_begun_ahead: u64,
    /// Whether steps (all but energy and checked ones) were replayed as CUDA graphs.
    pub graph: bool,
    /// Which stream integrated the steps with halo work (`--integrate-on`): `halo` or `local`
    /// (rows written before the choice existed have none: up to `1bd2501` the local stream, from
    /// `7e7e9c8` the halo stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrate_on: Option<String>,
    /// The atoms' order: `lattice` (global ids follow the lattice, neighbours in neighbouring
    /// memory) or `shuffled` (`--shuffle-atoms`: ids drawn at random, as after a long run).
    #[serde(default = "lattice_order")]
    pub atom_order: String,
    /// The non-bonded kernel design the row ran (`halo_md::nbnxm::NbnxmKernel`'s name: `pf`,
    /// `pfw`, `ind`; set by `HALO_NBNXM_KERNEL`).
    #[serde(default)]
    pub nbnxm_kernel: String,
    /// Steps between searches.
    pub nstlist: u64,
    /// Steps between prunes.
    pub nstprune: u64,
    /// Outer list cutoff (nm).
    pub rlist: f32,
    /// Inner list cutoff (nm).
    pub rlist_inner: f32,
    /// Interaction cutoff (nm).
    pub cutoff: f32,
    /// Time step (fs).
    pub dt_fs: f64,
    /// Home atoms of this process's ranks at the last search (rank 0's process).
    pub home_atoms: usize,
    /// Local atoms (home + halo), likewise.
    pub local_atoms: usize,
    /// Why it did not run, when it did not.
    pub skipped: Option<String>,
    /// Whether every checked step of the row ([`CHECKED_BEFORE`] before its timed steps,
    /// [`CHECKED_AFTER`] after them) ran and passed; only then does the row carry times.
    #[serde(default)]
    pub checked: bool,
    /// Why `checked` is false: the check that failed, or why the row did not complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_failure: Option<String>,
    /// What the checked steps measured (also those of a failed check); absent when none ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<MdBenchCheck>,
    /// With `--phases`: where one step's time went on the GPU, per rank of this process (medians
    /// of the profiled steps, µs; timing events between the phases, so not the row's step time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases: Option<Vec<halo_md::phases::PhaseSummary>>,
    /// With `--search-parts`: where a search step's host time went, part by part, per process
    /// (the library's search spans over the timed repeats).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search_parts: Option<Vec<SearchPartsSummary>>,
    /// Where it ran.
    pub machine: MachineInfo,
}

/// What a row's checked steps measured, over all of them (every rank, every PE).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MdBenchCheck {
    /// Steps checked (before and after the timed ones; more when routed paths ran steps again).
    pub steps: u64,
    /// Largest |coordinate after the halo - CPU reference| (nm; 0: bit-exact).
    pub coord_max_abs_err: f64,
    /// Atoms whose coordinates after the halo differ in any bit from the reference.
    pub coord_mismatches: u64,
    /// Halo atoms compared.
    pub halo_atoms_checked: u64,
    /// Largest force error against the undecomposed CPU reference, relative to the atom's scale
    /// (`halo_md::run::force_allowance`; tolerance `halo_md::run::FORCE_TOLERANCE`).
    pub force_max_rel_err: f64,
    /// Largest absolute force error (kJ/mol/nm).
    pub force_max_abs_err: f64,
    /// Largest relative error of the potential energy against the undecomposed reference.
    pub energy_max_rel_err: f64,
    /// Pulse receive ranges whose checksum differs from what their sender sent.
    pub integrity_mismatches: u64,
    /// Pulse receive ranges compared across ranks.
    pub pulses_checked: u64,
    /// Everything compared that differed (0 for a passed row).
    pub mismatches: u64,
}

impl MdBenchCheck {
    /// The checks of `o` (`None` when no step was checked).
    fn of(o: &MdOutcome) -> Option<Self> {
        let w = &o.worst;
        (o.checked_steps > 0).then(|| Self {
            steps: o.checked_steps,
            coord_max_abs_err: w.coord_max_abs,
            coord_mismatches: w.coord_mismatches,
            halo_atoms_checked: w.halo_atoms_checked,
            force_max_rel_err: w.force_max_rel,
            force_max_abs_err: w.force_max_abs,
            energy_max_rel_err: w.energy_rel,
            integrity_mismatches: w.halo_mismatches,
            pulses_checked: w.pulses_checked,
            mismatches: w.mismatches(),
        })
    }
}

/// Where the ranks run.
pub struct Target<'a> {
    /// The placement.
    pub placement: &'a Placement,
    /// GPUs in use.
    pub gpus: usize,
    /// How the ranks run: `one process`, `N PEs (NVSHMEM), one per GPU` or `N PEs (NVSHMEM) on M GPU(s)`.
    pub mode: String,
    /// The machine.
    pub machine: &'a MachineInfo,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The non-bonded kernel design the MD ranks will run: `HALO_NBNXM_KERNEL`'s, else the default
/// (a value that names no design is kept as given: the row's run then fails on it and says so).
fn nbnxm_design() -> String {
    use halo_md::nbnxm::NbnxmKernel;
    match NbnxmKernel::from_env() {
        Ok(k) => k.unwrap_or(NbnxmKernel::DEFAULT).name().into(),
        Err(_) => std::env::var(NbnxmKernel::ENV).unwrap_or_default(),
    }
}

/// Measures `transport` at `atoms` on `grid`. A failure becomes a skipped row with the reason.
pub fn measure(cfg: &MdBenchConfig, target: &Target<'_>, grid: RankGrid, atoms: usize, transport: Transport) -> MdBenchRow {
    let md = cfg.md(atoms, grid, transport);
    let mut row = MdBenchRow {
        transport: transport.name().to_string(),
        atoms,
        gpus: target.gpus,
        ranks: grid.to_string(),
        mode: target.mode.clone(),
        step_us_median: None,
        step_us_min: None,
        step_us_max: None,
        ns_per_day: None,
        steps: cfg.steps,
        repeats: cfg.repeats,
        warmup_steps: cfg.warmup.div_ceil(cfg.step.nstlist) * cfg.step.nstlist,
        search_included: true,
        searches_per_repeat: cfg.steps / cfg.step.nstlist,
        search_share: None,
        search_ms: None,
        search_parts_ms: None,
        plan_gathers_ms: None,
        plan_device_ms: None,
        lists_wait_ms: None,
        list_search: if cfg.step.host_search { "host" } else { "gpu" }.into(),
        redecompose: None,
        searches_begun_ahead: 0,
        graph: cfg.graph,
        integrate_on: None,
        atom_order: if cfg.step.shuffle_atoms { "shuffled" } else { "lattice" }.into(),
        nbnxm_kernel: nbnxm_design(),
        nstlist: cfg.step.nstlist,
        nstprune: cfg.step.nstprune,
        rlist: 0.0,
        rlist_inner: 0.0,
        cutoff: cfg.step.cutoff,
        dt_fs: f64::from(cfg.step.dt) * 1e3,
        home_atoms: 0,
        local_atoms: 0,
        skipped: None,
        checked: false,
        check_failure: None,
        check: None,
        phases: None,
        search_parts: None,
        machine: target.machine.clone(),
    };
    // Every PE measures the same rows in the same order, so a count names each row's all-gather
    // alike everywhere (the rendezvous takes a tag once), even when a row fails.
    static ROWS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tag = format!("md-bench-times-{}", ROWS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let result = measure_into(cfg, target, md, &mut row, &tag);
    conclude(&mut row, result);
    row
}

/// Marks `row` by how its measurement ended: checked (its checks passed and its times are
/// written), failed its check, or skipped (it did not complete: no times, not checked).
fn conclude(row: &mut MdBenchRow, result: Result<()>) {
    row.checked = false;
    match result {
        Ok(()) if row.step_us_median.is_some() => row.checked = true,
        Ok(()) => row.check_failure = Some("no time was measured".into()),
        Err(e @ HaloError::Verification { .. }) => row.check_failure = Some(e.to_string()),
        Err(e) => {
            row.check_failure = Some(format!("the row did not complete: {e}"));
            row.skipped = Some(e.to_string());
        }
    }
}

/// Every process's `mine` (its ranks' summaries of `what`), through one all-gather as JSON: by
/// rank, each rank once.
fn gather_by_rank<T: Serialize + serde::de::DeserializeOwned>(
    target: &Target<'_>,
    tag: &str,
    what: &str,
    mine: Vec<T>,
    rank: impl Fn(&T) -> usize,
) -> Result<Vec<T>> {
    let blob = serde_json::to_vec(&mine).map_err(|e| HaloError::InvalidInput(format!("the {what} as JSON: {e}")))?;
    let mut all = Vec::new();
    for b in &target.placement.all_gather(tag, vec![blob])? {
        let theirs: Vec<T> = serde_json::from_slice(b).map_err(|e| HaloError::InvalidInput(format!("a PE's {what}: {e}")))?;
        all.extend(theirs);
    }
    all.sort_by_key(&rank);
    all.dedup_by_key(|p| rank(p));
    Ok(all)
}

/// This process's PE, or 0 when it drives every rank.
fn process_rank(placement: &Placement) -> usize {
    match placement {
        Placement::Pe { nvshmem, .. } => nvshmem.my_pe(),
        _ => 0,
    }
}

/// Measures the row; `Ok` only when every checked step passed (the times are written only then).
fn measure_into(cfg: &MdBenchConfig, target: &Target<'_>, md: MdConfig, row: &mut MdBenchRow, tag: &str) -> Result<()> {
    let md_ranks = md.grid.num_ranks();
    let mut run = MdRun::new(md, target.placement.clone())?;
    row.integrate_on = Some(run.integration_stream().name().into());
    let timed = timed_and_checked(cfg, &mut run, md_ranks, process_rank(target.placement), row);
    row.check = MdBenchCheck::of(run.outcome());
    let timed = timed?;
    let checked = run.outcome().checked_steps;
    let outcome = run.finish()?;
    if checked < CHECKED_BEFORE + CHECKED_AFTER || outcome.failed_checks > 0 || !outcome.worst.passed() {
        // run_checked_steps ends the run at a failed check; this guards the count, so that no
        // row is called checked with fewer checked steps than it claims.
        return Err(HaloError::Verification {
            step: outcome.steps,
            detail: format!("{checked} steps checked of {}", CHECKED_BEFORE + CHECKED_AFTER),
        });
    }
    record(target, timed, row, tag)
}

/// What the timed repeats measured, before the slowest PE's are taken.
struct Timed {
    times: Vec<f64>,
    shares: Vec<f64>,
    before: halo_md::SearchTimes,
    after: halo_md::SearchTimes,
    lists: halo_md::ListSizes,
}

/// The warm-up, [`CHECKED_BEFORE`] checked steps, the timed repeats (unchecked), then
/// [`CHECKED_AFTER`] checked steps.
/// `process` names this process in the search parts (its PE, or 0 for one process).
fn timed_and_checked(cfg: &MdBenchConfig, run: &mut MdRun, md_ranks: usize, process: usize, row: &mut MdBenchRow) -> Result<Timed> {
    row.rlist = run.setup().rlist;
    row.rlist_inner = run.setup().rlist_inner;
    let mut none = |_: u64, _: &halo_md::StepCheck| {};
    run.run_steps(row.warmup_steps, &mut none)?;
    // Outside the timed steps: a repeat is a whole number of list lifetimes wherever it starts.
    run.run_checked_steps(CHECKED_BEFORE, &mut none)?;
    run.synchronize()?;
    let mut times = Vec::with_capacity(cfg.repeats);
    let mut shares = Vec::with_capacity(cfg.repeats);
    let before = run.outcome().search;
    let (resident_before, redecomposed_before) = (run.outcome().resident_searches, run.outcome().redecompositions);
    let ahead_before = run.outcome().searches_begun_ahead;
    if cfg.search_parts {
        search_parts::start();
    }
    for _ in 0..cfg.repeats {
        let searched = run.outcome().search.total;
        let t = Instant::now();
        run.run_steps(cfg.steps, &mut none)?;
        run.synchronize()?;
        let wall = t.elapsed();
        times.push(wall.as_secs_f64() * 1e6 / cfg.steps as f64);
        shares.push((run.outcome().search.total - searched).as_secs_f64() / wall.as_secs_f64());
    }
    if cfg.search_parts {
        row.search_parts = Some(vec![search_parts::take(process)]);
    }
    let after = run.outcome().search;
    let lists = run.outcome().lists;
    row.searches_begun_ahead = run.outcome().searches_begun_ahead - ahead_before;
    if run.outcome().resident_searches - resident_before == after.count - before.count && after.count > before.count {
        row.list_search = "gpu-resident".into();
    } else if run.outcome().redecompositions - redecomposed_before == after.count - before.count && after.count > before.count {
        row.list_search = "gpu-redecomposed".into();
        row.redecompose = Some(if cfg.step.redecompose.on_gpus(row.atoms, md_ranks) { "gpu" } else { "host" }.into());
    }
    if cfg.phases && !cfg.graph {
        row.phases = Some(run.profile_phases(PHASE_LISTS * cfg.step.nstlist)?);
    }
    run.run_checked_steps(CHECKED_AFTER, &mut none)?;
    Ok(Timed { times, shares, before, after, lists })
}

/// Writes the timed repeats into `row`, each repeat as long as its slowest PE.
fn record(target: &Target<'_>, timed: Timed, row: &mut MdBenchRow, tag: &str) -> Result<()> {
    let Timed { mut times, mut shares, before, after, lists } = timed;
    // Across PEs: a repeat takes as long as its slowest PE.
    let mine: Vec<f64> = times.iter().chain(&shares).copied().collect();
    let all = target.placement.all_gather(tag, vec![bytemuck::cast_slice(&mine).to_vec()])?;
    for b in &all {
        let v: Vec<f64> = bytemuck::pod_collect_to_vec(b);
        if v.len() != mine.len() {
            return Err(HaloError::InvalidInput(format!("a PE reported {} timings, this one {}", v.len(), mine.len())));
        }
        for (k, t) in v[..times.len()].iter().enumerate() {
            times[k] = times[k].max(*t);
        }
        for (k, s) in v[times.len()..].iter().enumerate() {
            shares[k] = shares[k].max(*s);
        }
    }
    // Every rank's phases and search parts, not only this process's: PE 0 writes the row.
    if let Some(mine) = row.phases.take() {
        row.phases = Some(gather_by_rank(target, &format!("{tag}-phases"), "phases", mine, |p| p.rank)?);
    }
    if let Some(mine) = row.search_parts.take() {
        row.search_parts = Some(gather_by_rank(target, &format!("{tag}-search-parts"), "search parts", mine, |p| p.rank)?);
    }
    let s = Summary::of(&times).ok_or_else(|| HaloError::InvalidInput("no finite step time".into()))?;
    row.step_us_median = Some(s.median);
    row.step_us_min = Some(s.min);
    row.step_us_max = Some(s.max);
    row.ns_per_day = Some(ns_per_day(s.median * 1e-6, row.dt_fs));
    row.search_share = Summary::of(&shares).map(|s| s.median);
    let n = (after.count - before.count).max(1) as f64;
    row.search_ms = Some(ms(after.total - before.total) / n);
    let gpu_lists = if row.list_search == "host" { Duration::ZERO } else { after.pairs - before.pairs };
    row.search_parts_ms = Some([
        ms(after.gather - before.gather) / n,
        ms(after.plan - before.plan) / n,
        ms(after.lists - before.lists) / n,
        ms(gpu_lists) / n,
        ms(after.upload - before.upload) / n,
    ]);
    row.plan_gathers_ms = (row.list_search == "gpu-redecomposed").then(|| ms(after.plan_gathers - before.plan_gathers) / n);
    row.plan_device_ms = (row.redecompose.as_deref() == Some("gpu")).then(|| ms(after.plan_device - before.plan_device) / n);
    row.lists_wait_ms = (row.list_search != "host").then(|| ms(after.pairs_wait - before.pairs_wait) / n);
    row.home_atoms = lists.home_atoms;
    row.local_atoms = lists.local_atoms;
    Ok(())
}

/// ns/day of `row` over the best host-orchestrated transport's at the same size and GPU count.
pub fn speedup_over_host_orchestrated(rows: &[MdBenchRow], row: &MdBenchRow) -> Option<f64> {
    let best = rows
        .iter()
        .filter(|r| r.checked && r.atoms == row.atoms && r.gpus == row.gpus && r.ranks == row.ranks)
        .filter(|r| r.transport.parse::<Transport>().is_ok_and(|t| !t.gpu_initiated()))
        .filter_map(|r| r.ns_per_day)
        .fold(None, |a: Option<f64>, b| Some(a.map_or(b, |a| a.max(b))))?;
    Some(row.ns_per_day? / best)
}

/// The transport, `+graph` when its steps were replayed as CUDA graphs.
fn variant(r: &MdBenchRow) -> String {
    if r.graph { format!("{}+graph", r.transport) } else { r.transport.clone() }
}

/// The host's wait for the GPU's grid and list passes, as a search part's suffix (empty when
/// not measured).
fn waits(r: &MdBenchRow) -> String {
    r.lists_wait_ms.map(|w| format!(" (waits for the GPU {w:.2})")).unwrap_or_default()
}

/// A checked row's check column: `ok`, the steps checked and the worst force error.
fn check_cell(r: &MdBenchRow) -> String {
    match &r.check {
        Some(c) => format!("ok {} steps, F {:.1e}", c.steps, c.force_max_rel_err),
        None => "ok".into(),
    }
}

/// The rows that did not pass their checks (failed or skipped), each named with its reason; `None`
/// when every row passed.
pub fn failures(rows: &[MdBenchRow]) -> Option<String> {
    let bad: Vec<String> = rows
        .iter()
        .filter(|r| !r.checked)
        .map(|r| {
            let why = r.check_failure.as_deref().or(r.skipped.as_deref()).unwrap_or("not checked");
            format!("{} atoms, {}, {} ranks ({}): {why}", r.atoms, variant(r), r.ranks, r.mode)
        })
        .collect();
    (!bad.is_empty())
        .then(|| format!("{} of {} rows did not pass their checks, so they give no result:\n  {}", bad.len(), rows.len(), bad.join("\n  ")))
}

/// The atom order of rows written before md-bench recorded it.
fn lattice_order() -> String {
    "lattice".into()
}

/// The rows as an aligned table with a header.
pub fn table(rows: &[MdBenchRow]) -> String {
    let mut s = String::new();
    if let Some(r) = rows.first() {
        let m = &r.machine;
        let gpus: Vec<&str> = m.gpus.iter().map(|g| g.name.as_str()).collect();
        let _ = writeln!(s, "halo md-bench: {}, GPUs: {}; NVIDIA driver {}, CUDA driver {}", r.mode, gpus.join(", "), m.nvidia_driver, m.cuda_driver);
        let _ = writeln!(
            s,
            "LJ (cutoff {} nm, potential shift), nstlist {} with the buffer rule, GPU prune every {}, {} fs, nbnxm kernel `{}`, integration on the {} stream, atoms in {} order; {} steps x {} repeats after {} warm-up steps;",
            r.cutoff,
            r.nstlist,
            r.nstprune,
            r.dt_fs,
            r.nbnxm_kernel,
            r.integrate_on.as_deref().unwrap_or("unrecorded"),
            r.atom_order,
            r.steps,
            r.repeats,
            r.warmup_steps
        );
        let _ = writeln!(s, "every step timed, search steps included (host clock, idle GPU to idle GPU); median [min-max] over repeats");
        let _ = writeln!(
            s,
            "check: {CHECKED_BEFORE} steps before and {CHECKED_AFTER} after each row's timed steps (not timed): coordinates after the halo bit-exact, \
             forces vs the undecomposed CPU reference within {:.0e} of each atom's scale (max(|F|, RMS force) plus what f32 \
             coordinates' rounding allows), energy within {:.0e}, pulse checksums across ranks",
            halo_md::run::FORCE_TOLERANCE,
            halo_md::run::ENERGY_TOLERANCE
        );
    }
    let header = ["atoms", "transport", "gpus", "ranks", "rlist nm", "step us", "ns/day", "search %", "ms/search", "vs host-orch.", "check"];
    let mut table: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for r in rows {
        let failed = match (&r.skipped, &r.check_failure) {
            (Some(why), _) => Some(format!("skipped: {why}")),
            (None, Some(why)) => Some(format!("FAILED check: {why}")),
            (None, None) if !r.checked => Some("not checked".to_string()),
            (None, None) => None,
        };
        if let Some(why) = failed {
            table.push(vec![r.atoms.to_string(), variant(r), r.gpus.to_string(), r.ranks.clone(), why]);
            continue;
        }
        let cell = |v: Option<f64>, p: usize| v.map_or_else(|| "-".to_string(), |v| format!("{v:.p$}"));
        let step = match (r.step_us_median, r.step_us_min, r.step_us_max) {
            (Some(a), Some(b), Some(c)) => format!("{a:.1} [{b:.1}-{c:.1}]"),
            _ => "-".into(),
        };
        let vs = speedup_over_host_orchestrated(rows, r).filter(|_| r.transport.parse::<Transport>().is_ok_and(Transport::gpu_initiated));
        table.push(vec![
            r.atoms.to_string(),
            variant(r),
            r.gpus.to_string(),
            r.ranks.clone(),
            format!("{:.3}", r.rlist),
            step,
            cell(r.ns_per_day, 0),
            cell(r.search_share.map(|v| 100.0 * v), 1),
            cell(r.search_ms, 2),
            vs.map_or_else(|| "-".into(), |v| format!("{v:.2}x")),
            check_cell(r),
        ]);
    }
    let cols = header.len();
    let widths: Vec<usize> = (0..cols).map(|c| table.iter().filter(|r| r.len() == cols).map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    for row in &table {
        let line: Vec<String> = if row.len() == cols {
            row.iter()
                .enumerate()
                .map(|(c, cell)| if c == 1 || c == 3 { format!("{cell:<w$}", w = widths[c]) } else { format!("{cell:>w$}", w = widths[c]) })
                .collect()
        } else {
            // Skipped rows: size, transport, GPUs and ranks aligned, then the reason.
            row.iter().enumerate().map(|(c, cell)| if c < 4 { format!("{cell:<w$}", w = widths[c]) } else { cell.clone() }).collect()
        };
        let _ = writeln!(s, "{}", line.join("  ").trim_end());
    }
    let parts: Vec<String> = rows
        .iter()
        .filter(|r| r.checked)
        .filter_map(|r| {
            let [g, p, a, l, u] = r.search_parts_ms?;
            Some(if r.list_search == "gpu-resident" {
                format!(
                    "  {} atoms, {}: all on the GPU: grid enqueued {a:.2}, grid built + lists searched {l:.2}{} (nothing gathered, planned or uploaded)",
                    r.atoms,
                    variant(r),
                    waits(r)
                )
            } else if r.list_search == "gpu-redecomposed" {
                let on_gpus = r.redecompose.as_deref() == Some("gpu");
                format!(
                    "  {} atoms, {}: {} {g:.2}, plan from the ranks {p:.2} (all-gathers {:.2}{}), local atoms {a:.2}, GPU grid + lists {l:.2}{}, upload {u:.2}",
                    r.atoms,
                    variant(r),
                    if on_gpus { "inputs set up" } else { "home atoms read back" },
                    r.plan_gathers_ms.unwrap_or(0.0),
                    r.plan_device_ms.map(|d| format!(", passes on the GPUs {d:.2}")).unwrap_or_default(),
                    waits(r)
                )
            } else {
                format!(
                    "  {} atoms, {}: gather {g:.2}, plan {p:.2}, local atoms + grid{} {a:.2}, GPU lists {l:.2}, upload {u:.2}",
                    r.atoms,
                    variant(r),
                    if r.list_search == "host" { " + host lists" } else { "" }
                )
            })
        })
        .collect();
    if !parts.is_empty() {
        let _ = writeln!(s, "one search step's time (ms, mean; no step's work runs meanwhile):");
        for p in parts {
            let _ = writeln!(s, "{p}");
        }
    }
    let profiled: Vec<&MdBenchRow> = rows.iter().filter(|r| r.checked && r.phases.as_ref().is_some_and(|p| !p.is_empty())).collect();
    if !profiled.is_empty() {
        let _ = writeln!(
            s,
            "where one step's time goes on the GPU (us, medians of {} list lifetimes' steps after the timed ones, search steps left out; \
             timing events between the phases end the overlap of consecutive kernels, so the phases ran apart and their step is not the row's):",
            PHASE_LISTS
        );
        for r in profiled {
            let _ = writeln!(s, "  {} atoms, {}, {}:", r.atoms, variant(r), r.ranks);
            for line in r.phases.iter().flatten().flat_map(|p| p.lines()) {
                let _ = writeln!(s, "    {line}");
            }
        }
    }
    let parted: Vec<&MdBenchRow> = rows.iter().filter(|r| r.checked && r.search_parts.as_ref().is_some_and(|p| !p.is_empty())).collect();
    if !parted.is_empty() {
        let _ = writeln!(
            s,
            "where a search step's host time goes, part by part (the library's search spans over the timed repeats; a part's pieces \
             follow it by name and are inside it; `search` is the whole step from the GPUs' last step on):"
        );
        for r in parted {
            let _ = writeln!(s, "  {} atoms, {}, {}:", r.atoms, variant(r), r.ranks);
            for line in r.search_parts.iter().flatten().flat_map(|p| p.lines()) {
                let _ = writeln!(s, "    {line}");
            }
        }
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn row(transport: &str, atoms: usize, us: f64) -> MdBenchRow {
        MdBenchRow {
            transport: transport.into(),
            atoms,
            gpus: 2,
            ranks: "2x1x1".into(),
            mode: "2 PEs (NVSHMEM)".into(),
            step_us_median: Some(us),
            step_us_min: Some(us * 0.9),
            step_us_max: Some(us * 1.1),
            ns_per_day: Some(ns_per_day(us * 1e-6, 2.0)),
            steps: 1000,
            repeats: 5,
            warmup_steps: 200,
            search_included: true,
            searches_per_repeat: 10,
            search_share: Some(0.1),
            search_ms: Some(0.6),
            search_parts_ms: Some([0.1, 0.1, 0.2, 0.1, 0.1]),
            plan_gathers_ms: None,
            plan_device_ms: None,
            lists_wait_ms: None,
            list_search: "gpu".into(),
            redecompose: None,
            searches_begun_ahead: 0,
            graph: false,
            integrate_on: Some("halo".into()),
            atom_order: "lattice".into(),
            nbnxm_kernel: "pf".into(),
            nstlist: 100,
            nstprune: 10,
            rlist: 1.482,
            rlist_inner: 1.04,
            cutoff: 1.0,
            dt_fs: 2.0,
            home_atoms: 22_500,
            local_atoms: 31_000,
            skipped: None,
            checked: true,
            check_failure: None,
            check: Some(MdBenchCheck {
                steps: 3,
                halo_atoms_checked: 25_000,
                force_max_rel_err: 2.1e-6,
                pulses_checked: 6,
                ..MdBenchCheck::default()
            }),
            phases: None,
            search_parts: None,
            machine: crate::machine::tests::sample(),
        }
    }

    #[test]
    fn steps_must_hold_whole_list_lifetimes() {
        let cfg = MdBenchConfig {
            steps: 1000,
            repeats: 3,
            warmup: 150,
            step: crate::cli::StepArgs::default(),
            graph: false,
            phases: false,
            search_parts: false,
        };
        cfg.validate().unwrap();
        let e = MdBenchConfig { steps: 1050, ..cfg.clone() }.validate().unwrap_err().to_string();
        assert!(e.contains("multiple of --nstlist 100"), "{e}");
        assert!(MdBenchConfig { repeats: 0, ..cfg }.validate().is_err());
    }

    #[test]
    fn the_speedup_is_over_the_best_host_orchestrated_transport_at_the_same_size() {
        let mut skipped = row("fused", 45_000, 1.0);
        skipped.skipped = Some("no".into());
        skipped.checked = false;
        skipped.ns_per_day = None;
        let rows = vec![row("fused", 45_000, 50.0), row("staged", 45_000, 80.0), row("fused", 6000, 30.0), row("staged", 6000, 60.0)];
        assert!((speedup_over_host_orchestrated(&rows, &rows[0]).unwrap() - 1.6).abs() < 1e-9);
        assert!((speedup_over_host_orchestrated(&rows, &rows[2]).unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(speedup_over_host_orchestrated(&rows[..1], &rows[0]), None, "no baseline measured");
        let mut all = rows.clone();
        all.push(skipped);
        let t = table(&all);
        assert!(t.contains("1.60x") && t.contains("2.00x"), "{t}");
        assert!(t.contains("skipped: no"), "{t}");
        assert!(t.contains("search steps included"), "{t}");
        assert!(t.contains("integration on the halo stream"), "{t}");
        // 50 us per 2 fs step: 86400 / 50e-6 * 2e-6 = 3456 ns/day.
        assert!(t.lines().any(|l| l.starts_with("45000") && l.contains("fused") && l.contains("3456") && l.contains("10.0")), "{t}");
    }

    #[test]
    fn the_search_parts_name_the_wait_for_the_gpus_passes_where_measured() {
        let mut r = row("fused", 45_000, 50.0);
        r.list_search = "gpu-redecomposed".into();
        r.plan_gathers_ms = Some(0.05);
        let without = table(std::slice::from_ref(&r));
        assert!(without.contains("GPU grid + lists 0.10, upload") && !without.contains("waits"), "{without}");
        r.lists_wait_ms = Some(0.04);
        let with = table(std::slice::from_ref(&r));
        assert!(with.contains("GPU grid + lists 0.10 (waits for the GPU 0.04), upload 0.10"), "{with}");
        r.list_search = "gpu-resident".into();
        let resident = table(&[r]);
        assert!(resident.contains("grid built + lists searched 0.10 (waits for the GPU 0.04) (nothing gathered"), "{resident}");
    }

    #[test]
    fn profiled_rows_print_where_the_step_goes_and_keep_it_in_their_json() {
        let mut r = row("fused", 45_000, 50.0);
        assert!(!table(std::slice::from_ref(&r)).contains("where one step's time goes"), "no phases, no section");
        let at = [0.0, 1.0, 25.0, 0.2, 6.2, 6.5, 16.5, 22.5, 26.0, 29.0];
        let steps: Vec<_> = (0..4).map(|_| halo_md::phases::StepPhases::from_marks(&at, Some(2.5))).collect();
        r.phases = Some(vec![halo_md::phases::PhaseSummary::of(1, &steps).expect("steps")]);
        let t = table(std::slice::from_ref(&r));
        assert!(t.contains("where one step's time goes on the GPU"), "{t}");
        assert!(t.contains("rank 1: local stream: memset/prune 1.0, home-home forces 24.0; after both chains: join 1.0, integrate 3.0"), "{t}");
        assert!(t.contains("coordinate halo 6.0, memset/wait/prune 0.3, forces with halo atoms 10.0, force halo 6.0"), "{t}");
        assert!(t.contains("step on the GPU 29.0, GPU idle before it 2.5"), "{t}");
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["phases"][0]["medians"]["coord_halo"], 6.0);
        let back: MdBenchRow = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        // A row that failed its checks prints no phases.
        r.checked = false;
        assert!(!table(std::slice::from_ref(&r)).contains("where one step's time goes"));
    }

    #[test]
    fn rows_with_search_parts_print_them_and_keep_them_in_their_json() {
        let mut r = row("fused", 45_000, 50.0);
        assert!(!table(std::slice::from_ref(&r)).contains("where a search step's host time goes"), "no parts, no section");
        let times: std::collections::BTreeMap<&'static str, Vec<f64>> =
            [("search", vec![900.0, 1000.0, 1100.0]), ("search.merge", vec![100.0, 140.0, 130.0]), ("search.update", vec![50.0; 6])]
                .into_iter()
                .collect();
        r.search_parts = Some(vec![SearchPartsSummary::of(1, &times)]);
        let t = table(std::slice::from_ref(&r));
        assert!(t.contains("where a search step's host time goes"), "{t}");
        assert!(t.contains("rank 1: 3 search steps recorded"), "{t}");
        assert!(t.contains("search.merge                         130.0     123.3   1.0"), "{t}");
        assert!(t.contains("search.update                         50.0     100.0   2.0"), "{t}");
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["search_parts"][0]["parts"][0]["median_us"], 1000.0);
        let back: MdBenchRow = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        r.checked = false;
        assert!(!table(std::slice::from_ref(&r)).contains("where a search step's host time goes"), "a failed row prints no parts");
    }

    #[test]
    fn rows_serialise_with_the_fields_the_issue_names() {
        let v: serde_json::Value = serde_json::to_value(vec![row("fused", 45_000, 50.0)]).unwrap();
        let o = &v[0];
        for key in ["transport", "atoms", "gpus", "step_us_median", "ns_per_day", "steps", "search_included", "machine"] {
            assert!(o.get(key).is_some(), "missing {key}: {o}");
        }
        assert_eq!(o["search_included"], serde_json::Value::Bool(true));
        assert_eq!(o["checked"], serde_json::Value::Bool(true));
        assert_eq!((o["check"]["coord_max_abs_err"].as_f64(), o["check"]["mismatches"].as_u64()), (Some(0.0), Some(0)), "{o}");
        let back: Vec<MdBenchRow> = serde_json::from_value(v).unwrap();
        assert_eq!(back[0].atoms, 45_000);
        // A row written before rows were checked reads as not checked.
        let mut old = serde_json::to_value(row("fused", 6000, 30.0)).unwrap();
        for key in ["checked", "check", "check_failure"] {
            old.as_object_mut().unwrap().remove(key);
        }
        let old: MdBenchRow = serde_json::from_value(old).unwrap();
        assert!(!old.checked && old.check.is_none());
    }

    #[test]
    fn the_json_document_carries_its_version_and_a_reader_refuses_others() {
        let doc = MdBenchDoc::new(vec![row("fused", 45_000, 80.0), row("staged", 45_000, 90.0)]);
        let text = serde_json::to_string_pretty(&doc).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["schema_version"], 1);
        let back = MdBenchDoc::rows_of(&text).unwrap();
        // serde_json's float parsing may differ in the last bit of a derived value (min, max).
        let key = |r: &MdBenchRow| (r.transport.clone(), r.atoms, r.step_us_median, r.checked);
        assert_eq!(back.iter().map(key).collect::<Vec<_>>(), doc.rows.iter().map(key).collect::<Vec<_>>());
        let newer = text.replacen("\"schema_version\": 1", "\"schema_version\": 2", 1);
        assert!(MdBenchDoc::rows_of(&newer).unwrap_err().contains("version 2"));
        // The bare list of rows that came before the document is named as not one.
        let old = serde_json::to_string(&doc.rows).unwrap();
        assert!(MdBenchDoc::rows_of(&old).unwrap_err().contains("not an md-bench document"));
    }

    #[test]
    fn a_row_is_checked_only_when_its_checks_passed_and_a_failed_or_skipped_one_is_named() {
        let mut r = row("fused", 6000, 30.0);
        r.checked = false;
        conclude(&mut r, Ok(()));
        assert!(r.checked && r.check_failure.is_none());
        // A failed check: no times were written (measure_into returns before them).
        let mut failed = row("fused", 45_000, 50.0);
        (failed.checked, failed.step_us_median, failed.step_us_min, failed.step_us_max, failed.ns_per_day) = (false, None, None, None, None);
        failed.check =
            Some(MdBenchCheck { coord_max_abs_err: 0.125, coord_mismatches: 1, integrity_mismatches: 1, mismatches: 2, ..MdBenchCheck::default() });
        let detail = "rank 1 local atom 4000 (global 17, received in pulse 0 from rank 0) has coordinates".to_string();
        conclude(&mut failed, Err(HaloError::Verification { step: 201, detail }));
        assert!(!failed.checked && failed.skipped.is_none());
        assert!(
            failed.check_failure.as_deref().is_some_and(|f| f.starts_with("verification failed at step 201: rank 1 local atom 4000")),
            "{failed:?}"
        );
        let mut skipped = row("staged", 45_000, 80.0);
        skipped.step_us_median = None;
        conclude(&mut skipped, Err(HaloError::InvalidInput("no NCCL".into())));
        assert!(!skipped.checked && skipped.skipped.as_deref() == Some("invalid input: no NCCL"), "{skipped:?}");
        assert!(skipped.check_failure.as_deref().is_some_and(|f| f.contains("did not complete: invalid input: no NCCL")));
        // Times without a passed check are never called checked.
        let mut untimed = row("fused", 6000, 30.0);
        (untimed.checked, untimed.step_us_median) = (false, None);
        conclude(&mut untimed, Ok(()));
        assert!(!untimed.checked);

        let rows = vec![r.clone(), failed.clone(), skipped.clone()];
        let t = table(&rows);
        assert!(t.lines().any(|l| l.trim_start().starts_with("6000") && l.contains("ok 3 steps, F 2.1e-6")), "{t}");
        assert!(t.lines().any(|l| l.starts_with("45000") && l.contains("FAILED check: verification failed at step 201")), "{t}");
        assert!(t.contains("skipped: invalid input: no NCCL") && t.contains("check: 2 steps before and 1 after"), "{t}");
        assert!(t.contains("6000 atoms, fused: gather") && !t.contains("45000 atoms, fused: gather"), "no search times of a failed row: {t}");
        let why = failures(&rows).expect("two rows did not pass");
        assert!(why.starts_with("2 of 3 rows did not pass their checks"), "{why}");
        assert!(
            why.contains("45000 atoms, fused, 2x1x1 ranks") && why.contains("45000 atoms, staged, 2x1x1 ranks") && !why.contains("6000 atoms"),
            "{why}"
        );
        assert!(failures(std::slice::from_ref(&r)).is_none());
        let v = serde_json::to_value(&failed).unwrap();
        assert_eq!(
            (v["checked"].as_bool(), v["step_us_median"].is_null(), v["check"]["coord_max_abs_err"].as_f64()),
            (Some(false), true, Some(0.125)),
            "{v}"
        );
    }
}
