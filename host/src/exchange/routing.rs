//! The router wired into the exchange: the plans of every rank this process drives, exchanges
//! built from them, failures fed back, and the safe points at which every PE agrees on them
//! (docs/routing.md, "Both ends switch together").
//!
//! A driver keeps one [`Routing`] for the run:
//!
//! 1. [`Routing::new`] gathers the facts of every rank (ranks of one process: their GPUs; PEs:
//!    each PE discovers its GPU and the facts are all-gathered through NVSHMEM, which works under
//!    every launcher and across nodes) and builds one router per local rank in agreed mode.
//! 2. [`Routing::plan`] plans the halo: every rank's [`RoutedPaths`], checked symmetric. The
//!    exchange is built from them ([`Placement::exchange_planned`]); pulses take the path of
//!    their peer's transport inside one fused launch.
//! 3. Each step, [`Routing::injected`] says whether `HALO_INJECT_FAILURE` makes this step fail
//!    here (the driver then skips the launch and [`Routing::record_launch_failure`]s it), and a
//!    failed finish goes to [`Routing::record_error`] (a device wait timeout is recorded against
//!    the peer that never signalled).
//! 4. Every N steps, at the same steps on every PE, [`Routing::safe_point`]: one small all-gather
//!    says whether any PE has something to report; only then does the full agreement run
//!    (records, agreement, new plans all-gathered and checked). When some PE's step failed or a
//!    pair switched, the driver rebuilds the exchange from [`Routing::plans`] and runs the steps
//!    since its last good state again.

use super::interface::Placement;
use crate::desc::{Element, RankHalo, Transport};
use crate::error::{HaloError, Result};
use crate::nvshmem::{KeptGather, Nvshmem};
use crate::route::{FailureInjection, Feedback, Outcome, PathError, PeFacts, RouteError, RoutedPaths, RoutedSummary, Router, gpu_facts, paths};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The environment variable that sets the safe-point interval of drivers that take no flag for it.
pub const SAFE_POINT_ENV: &str = "HALO_SAFE_POINT_EVERY";

/// How often a step may fail and run again before the driver gives up.
pub const MAX_RERUNS: u32 = 4;

/// What a safe point decided, the same on every PE.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SafeOutcome {
    /// Some PE saw a step fail since the last safe point (or a pair switched): rebuild the
    /// exchange from [`Routing::plans`] and run the steps since the last good state again.
    pub rerun: bool,
    /// `(a, b, before, after)` for every pair `a < b` whose transport changed.
    pub switched: Vec<(usize, usize, Option<crate::route::Transport>, Option<crate::route::Transport>)>,
    /// Failures all PEs reported this round (0 for a quiet safe point).
    pub reported: usize,
    /// The agreement round applied, when the full agreement ran.
    pub round: Option<u64>,
}

/// The router state of the ranks this process drives, for one run.
pub struct Routing {
    /// One router per local rank (a PE: its own).
    routers: Vec<Router>,
    /// NVSHMEM, when this process is one PE of several.
    nvshmem: Option<Arc<Nvshmem>>,
    /// The halos planned last.
    halos: Vec<RankHalo>,
    /// Every rank's plan for them.
    plans: Vec<RoutedPaths>,
    injection: Option<FailureInjection>,
    /// A step failed here since the last safe point.
    failed: bool,
    safe_points: u64,
    reruns: u64,
    /// The symmetric buffers of the safe points' and plans' all-gathers across PEs, kept from one
    /// to the next (made at the first; [`Nvshmem::all_gather_bytes`] allocates and frees
    /// symmetric memory, a collective each, every call).
    kept: Option<KeptGather>,
}

impl std::fmt::Debug for Routing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routing").field("ranks", &self.routers.len()).field("pe", &self.nvshmem.as_ref().map(|n| n.my_pe())).finish()
    }
}

fn discovery(e: gpu_facts::DiscoveryError) -> HaloError {
    HaloError::InvalidInput(format!("routing: {e}"))
}

/// Facts of every PE, gathered once per process through NVSHMEM (collective; every PE gathers
/// at the same point, so every PE has them cached from then on).
fn pe_facts(nvshmem: &Arc<Nvshmem>, ordinal: usize) -> Result<Vec<PeFacts>> {
    static CACHE: OnceLock<Mutex<Option<Vec<PeFacts>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(None));
    let mut held = cache.lock().map_err(|_| HaloError::InvalidInput("routing: the facts cache was poisoned".into()))?;
    if let Some(f) = held.as_ref().filter(|f| f.len() == nvshmem.n_pes()) {
        return Ok(f.clone());
    }
    let mine = gpu_facts::discover(ordinal).map_err(discovery)?.facts;
    let bytes = serde_json::to_vec(&mine).map_err(|e| HaloError::InvalidInput(format!("routing: encoding this PE's facts: {e}")))?;
    let all = nvshmem
        .all_gather_bytes(&bytes)?
        .iter()
        .enumerate()
        .map(|(pe, b)| {
            serde_json::from_slice::<PeFacts>(b).map_err(|e| HaloError::InvalidInput(format!("routing: PE {pe}'s facts do not parse: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    *held = Some(all.clone());
    Ok(all)
}

/// Facts of `n_ranks` ranks of this process, rank `r` on GPU `ordinals[r % ordinals.len()]`,
/// probed once per set of GPUs.
fn local_facts(ordinals: &[usize], n_ranks: usize) -> Result<Vec<PeFacts>> {
    static CACHE: OnceLock<Mutex<HashMap<Vec<usize>, Vec<PeFacts>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut held = cache.lock().map_err(|_| HaloError::InvalidInput("routing: the facts cache was poisoned".into()))?;
    let per_gpu = match held.get(ordinals) {
        Some(f) => f.clone(),
        None => {
            let f = gpu_facts::gpu_facts_of(ordinals).map_err(discovery)?;
            held.insert(ordinals.to_vec(), f.clone());
            f
        }
    };
    if per_gpu.is_empty() {
        return Err(HaloError::NoGpu("no GPU to place the ranks on".into()));
    }
    Ok((0..n_ranks).map(|r| per_gpu[r % per_gpu.len()].clone()).collect())
}

impl Routing {
    /// Routers for the ranks `placement` puts in this process, configured from the environment
    /// (`HALO_ROUTE_*`, `HALO_FORCE_TRANSPORT`, `HALO_INJECT_FAILURE`) plus `overrides`
    /// (`--route-override` values), in agreed mode. `n_ranks` is the decomposition's rank count.
    /// Collective across PEs (the facts are all-gathered).
    pub fn new(placement: &Placement, n_ranks: usize, overrides: &[String]) -> Result<Self> {
        let config = paths::route_config(overrides).map_err(PathError::from)?;
        let (mut routers, nvshmem) = match placement {
            Placement::Local(modules) | Placement::LocalDirect(modules) => {
                let ordinals: Vec<usize> = modules.iter().map(|m| m.context().ordinal()).collect();
                (paths::local_routers(&local_facts(&ordinals, n_ranks)?, &config)?, None)
            }
            Placement::Pe { nvshmem, module, .. } => {
                if n_ranks != nvshmem.n_pes() {
                    return Err(HaloError::InvalidInput(format!("the decomposition has {n_ranks} ranks but {} PEs are running", nvshmem.n_pes())));
                }
                let facts = pe_facts(nvshmem, module.context().ordinal())?;
                let topo = crate::route::topology_from_facts(&facts, config.fabric().map_err(PathError::from)?.as_ref()).map_err(PathError::from)?;
                (vec![Router::new(nvshmem.my_pe(), Arc::new(topo), config).map_err(PathError::from)?], Some(nvshmem.clone()))
            }
        };
        for r in &mut routers {
            r.set_feedback(Feedback::Agreed);
        }
        let injection = FailureInjection::from_env(&|k| std::env::var(k).ok()).map_err(PathError::from)?;
        if let Some(i) = &injection {
            tracing::warn!("route: injecting failures: {i} ({})", crate::route::feedback::INJECT_ENV);
        }
        Ok(Self { routers, nvshmem, halos: Vec::new(), plans: Vec::new(), injection, failed: false, safe_points: 0, reruns: 0, kept: None })
    }

    /// Routing for ranks of one process with routers the caller built (`routers[r]` serves rank
    /// `r`, over one topology: [`crate::route::local_routers`]), put in agreed mode; `injection`
    /// as `HALO_INJECT_FAILURE` would give it. What [`Self::new`] makes for a local placement,
    /// without probing GPUs (tests drive the whole failover on the CPU this way).
    pub fn with_routers(mut routers: Vec<Router>, injection: Option<FailureInjection>) -> Result<Self> {
        if routers.iter().enumerate().any(|(r, x)| x.self_pe() != r) || routers.is_empty() {
            return Err(HaloError::InvalidInput("routers must serve ranks 0, 1, ... in order".into()));
        }
        for r in &mut routers {
            r.set_feedback(Feedback::Agreed);
        }
        Ok(Self { routers, nvshmem: None, halos: Vec::new(), plans: Vec::new(), injection, failed: false, safe_points: 0, reruns: 0, kept: None })
    }

    /// Plans `halos` (every rank's) with values of type `T`: every rank's paths, checked
    /// symmetric (across PEs: replayed for each peer, then all-gathered and compared).
    /// Collective across PEs.
    pub fn plan<T: Element>(&mut self, halos: &[RankHalo]) -> Result<&[RoutedPaths]> {
        let plans = match &self.nvshmem {
            None => paths::plan_local_with::<T>(&mut self.routers, halos)?,
            Some(nv) => {
                let router = &mut self.routers[0];
                let plan = RoutedPaths::plan_for::<T>(router, halos)?;
                plan.mirror_check(router, halos)?;
                describe_if_debug(router, &plan);
                let all = gather_plans(nv, &mut self.kept, &plan)?;
                RoutedPaths::check_symmetric(&all)?;
                all
            }
        };
        self.halos = halos.to_vec();
        self.plans = plans;
        Ok(&self.plans)
    }

    /// Whether [`Self::plan`] all-gathers the plans across PEs (one PE per process), so that a
    /// caller with a collective of its own can carry them instead ([`Self::own_paths`],
    /// [`Self::plan_gathered`]).
    pub fn across_pes(&self) -> bool {
        self.nvshmem.is_some()
    }

    /// This PE's paths for its own new halo `halo` (of `n_pes` PEs), encoded to travel in a
    /// collective the caller runs anyway (a redecomposition's plans carry them:
    /// `decomp::PlanRider`), instead of in [`Self::plan`]'s all-gather. [`Self::plan_gathered`]
    /// then takes every PE's back. Across PEs only ([`Self::across_pes`]).
    pub fn own_paths<T: Element>(&mut self, halo: &RankHalo, n_pes: usize) -> Result<Vec<u8>> {
        if self.nvshmem.is_none() {
            return Err(HaloError::InvalidInput("ranks of one process plan their paths together (Routing::plan), not one by one".into()));
        }
        let plan = RoutedPaths::plan_own_for::<T>(&mut self.routers[0], halo, n_pes)?;
        encode_plan(&plan)
    }

    /// [`Self::plan`] from every PE's [`Self::own_paths`], gathered by the caller (`gathered[pe]`):
    /// the same plans and the same checks (this PE's plan replayed for each peer against every
    /// halo, then all compared), without a collective of its own.
    pub fn plan_gathered(&mut self, halos: &[RankHalo], gathered: &[Vec<u8>]) -> Result<&[RoutedPaths]> {
        if self.nvshmem.is_none() {
            return Err(HaloError::InvalidInput("ranks of one process plan their paths together (Routing::plan), not from gathered plans".into()));
        }
        let all = adopt_gathered(&self.routers[0], halos, gathered)?;
        describe_if_debug(&self.routers[0], &all[self.routers[0].self_pe()]);
        let _span = tracing::debug_span!("search.route.keep").entered();
        self.halos = halos.to_vec();
        self.plans = all;
        Ok(&self.plans)
    }

    /// Every rank's current plan (`plans()[r]` is rank `r`'s).
    pub fn plans(&self) -> &[RoutedPaths] {
        &self.plans
    }

    /// The halos planned last.
    pub fn halos(&self) -> &[RankHalo] {
        &self.halos
    }

    /// The exchange kernel the current plans imply ([`RoutedPaths::exchange_transport`]).
    pub fn transport(&self) -> Result<Transport> {
        Ok(RoutedPaths::exchange_transport(&self.plans, self.nvshmem.is_some())?)
    }

    /// The ranks this process drives.
    pub fn local_ranks(&self) -> Vec<usize> {
        self.routers.iter().map(Router::self_pe).collect()
    }

    /// The summaries of the ranks this process drives (one per local rank).
    pub fn local_summaries(&self) -> Result<Vec<RoutedSummary>> {
        self.local_ranks().into_iter().map(|r| self.summary_of(r)).collect()
    }

    /// The summaries of every rank (the plans of every PE are gathered at each plan).
    pub fn summaries(&self) -> Result<Vec<RoutedSummary>> {
        (0..self.plans.len()).map(|r| self.summary_of(r)).collect()
    }

    fn summary_of(&self, rank: usize) -> Result<RoutedSummary> {
        let plan = self.plans.get(rank).ok_or(PathError::Empty)?;
        Ok(plan.summary()?)
    }

    /// One line per local rank: `route: PE 0: 1=nvlink-store (direct-store, nvlink, 12.3 KiB); topology ...`.
    pub fn describe(&self) -> Result<Vec<String>> {
        Ok(self.local_summaries()?.iter().map(|s| format!("route: {s}")).collect())
    }

    /// The router of local rank `rank`, if this process drives it.
    pub fn router(&self, rank: usize) -> Option<&Router> {
        self.routers.iter().find(|r| r.self_pe() == rank)
    }

    fn router_mut(&mut self, rank: usize) -> Option<&mut Router> {
        self.routers.iter_mut().find(|r| r.self_pe() == rank)
    }

    /// The injected failure (`HALO_INJECT_FAILURE`), if any.
    pub fn injection(&self) -> Option<&FailureInjection> {
        self.injection.as_ref()
    }

    /// For each local rank whose step `step` fails by injection: `(rank, peers)`, the peers whose
    /// path is the failing transport. The driver skips the step's launches (of every local rank,
    /// when any fails: ranks of one process launch together) and records the failures with
    /// [`Self::record_launch_failure`].
    pub fn injected(&self, step: u64) -> Vec<(usize, Vec<usize>)> {
        let Some(inj) = &self.injection else { return Vec::new() };
        self.local_ranks()
            .into_iter()
            .filter_map(|r| {
                let failing = inj.failing_peers(self.plans.get(r)?, step);
                (!failing.is_empty()).then_some((r, failing))
            })
            .collect()
    }

    /// Records that local rank `rank`'s launch towards `peers` failed (an injected or a real
    /// launch failure): queued for the next safe point, and the step marked failed.
    pub fn record_launch_failure(&mut self, rank: usize, peers: &[usize]) {
        self.failed = true;
        for &peer in peers {
            let t = self.plans.get(rank).and_then(|p| p.transport(peer));
            if let (Some(t), Some(router)) = (t, self.router_mut(rank)) {
                router.record(peer, t, Outcome::Failure);
            }
        }
    }

    /// A launch of the exchange failed with `e` (a CUDA error on enqueue): recorded as a failed
    /// launch of every local rank towards every peer of its plan (one launch serves all of a
    /// rank's pulses), the step marked failed. A driver with failover carries on to the safe
    /// point, where the pairs move on together; an error that persists fails the rebuild.
    pub fn record_failed_launch(&mut self, e: &HaloError) {
        tracing::warn!("route: a launch of the exchange failed: {e}");
        for rank in self.local_ranks() {
            let peers: Vec<usize> =
                self.plans.get(rank).map_or_else(Vec::new, |p| (0..p.peers.len()).filter(|&q| p.transport(q).is_some() && q != rank).collect());
            self.record_launch_failure(rank, &peers);
        }
        self.failed = true;
    }

    /// Takes a failed step's error: a device wait timeout is recorded against the peer that never
    /// signalled (the transport of that pair) and the step is marked failed; returns whether the
    /// error was such a failure (the driver then carries on to the safe point), false for any
    /// other error (the driver stops).
    pub fn record_error(&mut self, e: &HaloError) -> bool {
        let HaloError::WaitTimeout(t) = e else { return false };
        self.failed = true;
        let (rank, peer) = (t.rank, t.peer);
        if let Ok(peer) = usize::try_from(peer) {
            let transport = self.plans.get(rank).and_then(|p| p.transport(peer));
            if let (Some(tr), Some(router)) = (transport, self.router_mut(rank)) {
                router.record(peer, tr, Outcome::Timeout);
            }
        }
        tracing::warn!("route: {t}; the step runs again after the next safe point");
        true
    }

    /// Whether a step failed here since the last safe point (this process's knowledge only: a
    /// peer's failure shows at the safe point).
    pub fn failed_here(&self) -> bool {
        self.failed
    }

    /// Safe points run and steps run again so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.safe_points, self.reruns)
    }

    /// A safe point: collective, at the same step on every PE, with the exchange idle (finished).
    /// One small all-gather tells every PE whether any has queued failure reports, a failed step,
    /// or an agreed hold to release; when none has, that is all (the fast path). Otherwise the
    /// full agreement runs ([`crate::route::safe_point_via`] / [`crate::route::safe_point_local`]):
    /// the reports are agreed, every rank plans again, the plans are gathered and checked, and
    /// [`Self::plans`] holds the new plans. `rerun` is the same on every PE.
    pub fn safe_point(&mut self) -> Result<SafeOutcome> {
        self.safe_points += 1;
        let reports: usize = self.routers.iter().map(|r| r.pending_failures().len()).sum();
        let due = self.routers.iter().any(Router::agreement_due);
        // Bit 0: this PE's step failed; bit 1: an agreement is due; the rest: queued reports.
        let word = u64::from(self.failed) | (u64::from(due) << 1) | ((reports as u64) << 2);
        let words = match &self.nvshmem {
            Some(nv) => kept_gather(nv, &mut self.kept, &word.to_le_bytes())?
                .iter()
                .map(|b| b.get(..8).and_then(|w| w.try_into().ok()).map(u64::from_le_bytes))
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| HaloError::Nvshmem("a safe point's all-gather returned a short word".into()))?,
            None => vec![word],
        };
        self.failed = false;
        let any_failed = words.iter().any(|w| w & 1 != 0);
        if !words.iter().any(|w| w >> 1 != 0) {
            if any_failed {
                self.reruns += 1;
            }
            return Ok(SafeOutcome { rerun: any_failed, ..SafeOutcome::default() });
        }
        let sp = match &self.nvshmem {
            Some(nv) => {
                let nv = nv.clone();
                let mut gather = |_tag: &str, bytes: &[u8]| nv.all_gather_bytes(bytes).map_err(|e| e.to_string());
                crate::route::safe_point_via(&mut self.routers[0], &self.halos, &self.plans, &mut gather)?
            }
            None => crate::route::safe_point_local(&mut self.routers, &self.halos, &self.plans)?,
        };
        self.plans = sp.plans;
        let rerun = any_failed || sp.change.reported > 0 || !sp.switched.is_empty();
        if rerun {
            self.reruns += 1;
        }
        for (a, b, before, after) in &sp.switched {
            tracing::warn!(
                "route: pair {a}-{b} switched {} -> {} at agreement round {}",
                before.map_or("none", |t| t.name()),
                after.map_or("none", |t| t.name()),
                sp.change.round
            );
        }
        Ok(SafeOutcome { rerun, switched: sp.switched, reported: sp.change.reported, round: Some(sp.change.round) })
    }

    /// `route summary` lines of the local routers (lookups, switches, topology), for the end of a run.
    pub fn finish_lines(&self) -> Vec<String> {
        let (sp, reruns) = self.counts();
        self.routers.iter().map(|r| format!("{}; {sp} safe points, {reruns} re-runs, agreement round {}", r.summary(), r.agreement().round)).collect()
    }
}

/// Every PE's `mine` through `kept`'s buffers (made now, collectively, at the first call).
fn kept_gather(nv: &Arc<Nvshmem>, kept: &mut Option<KeptGather>, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
    let gather = match kept {
        Some(g) => g,
        None => kept.insert(KeptGather::new(nv, KEPT_GATHER_BYTES)?),
    };
    gather.all_gather(mine)
}

/// Bytes per PE of a routing's kept all-gather buffers at first (a plan's JSON is a few KiB; longer
/// messages grow them).
const KEPT_GATHER_BYTES: usize = 16 << 10;

/// Every PE's plan, all-gathered through NVSHMEM as JSON (indexed by PE).
fn gather_plans(nv: &Arc<Nvshmem>, kept: &mut Option<KeptGather>, plan: &RoutedPaths) -> Result<Vec<RoutedPaths>> {
    decode_plans(&kept_gather(nv, kept, &encode_plan(plan)?)?)
}

/// `router`'s PE's own `plan`, a line per path, on standard error when its route configuration
/// asks for the router's debug output (`HALO_ROUTE_DEBUG`), as the router writes its decisions.
fn describe_if_debug(router: &Router, plan: &RoutedPaths) {
    if router.config().debug.value {
        for line in plan.describe() {
            eprintln!("{line}");
        }
    }
}

/// Every PE's plan from `gathered` (what [`encode_plan`] made of each, indexed by PE), checked as
/// [`Routing::plan`] checks them: `router`'s PE's own plan replayed for each of its peers against
/// `halos` (the mirror check), then every pair compared.
fn adopt_gathered(router: &Router, halos: &[RankHalo], gathered: &[Vec<u8>]) -> Result<Vec<RoutedPaths>> {
    let all = tracing::debug_span!("search.route.decode").in_scope(|| decode_plans(gathered))?;
    let me = router.self_pe();
    let plan = all.get(me).ok_or(PathError::from(RouteError::PeOutOfRange { pe: me, n_pes: all.len() }))?;
    tracing::debug_span!("search.route.mirror").in_scope(|| plan.mirror_check(router, halos))?;
    RoutedPaths::check_symmetric(&all)?;
    Ok(all)
}

/// A PE's plan as it travels between PEs (JSON).
fn encode_plan(plan: &RoutedPaths) -> Result<Vec<u8>> {
    serde_json::to_vec(plan).map_err(|e| PathError::from(RouteError::Agreement(format!("encoding this PE's plan: {e}"))).into())
}

/// Every PE's plan from what [`encode_plan`] made of it (indexed by PE).
fn decode_plans(gathered: &[Vec<u8>]) -> Result<Vec<RoutedPaths>> {
    gathered
        .iter()
        .enumerate()
        .map(|(pe, b)| {
            serde_json::from_slice::<RoutedPaths>(b)
                .map_err(|e| HaloError::from(PathError::from(RouteError::Agreement(format!("PE {pe}'s plan does not parse: {e}")))))
        })
        .collect()
}

/// The safe-point interval `HALO_SAFE_POINT_EVERY` asks for (steps, at least 1), or `default`.
pub fn safe_point_every_from_env(default: u64) -> Result<u64> {
    match std::env::var(SAFE_POINT_ENV) {
        Err(_) => Ok(default.max(1)),
        Ok(v) => v.trim().parse::<u64>().ok().filter(|&n| n >= 1).ok_or_else(|| {
            HaloError::InvalidInput(format!("{SAFE_POINT_ENV}={v:?} is not a step count: set it to a whole number of steps, at least 1 (e.g. 10)"))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::synthetic::{self, SyntheticShape};
    use crate::route::{IntraNodeLink, RouteConfig, synthetic_facts, topology_from_facts};
    use kernels_gpu::abi::Float3;

    /// Four PEs on one node, PEs 0 and 1 forced to puts: each PE's router, and every PE's halo.
    fn four_pes() -> (Vec<Router>, Vec<RankHalo>) {
        let halos = synthetic::halos(SyntheticShape { grid: [2, 2, 1], pulses_per_dim: 2, home_atoms: 200, send_fraction: 0.3, box_len: 5.0 }, 7);
        let facts = synthetic_facts(&["n0".into()], 4, 1, IntraNodeLink::Nvlink);
        let topo = Arc::new(topology_from_facts(&facts, None).expect("topology"));
        let mut config = RouteConfig::default();
        config.add_cli_overrides("--route-override", &["0-1=nvshmem-put".into()]).expect("override");
        let routers = (0..4).map(|r| Router::new(r, Arc::clone(&topo), config.clone()).expect("router")).collect();
        (routers, halos)
    }

    /// Each PE's paths made from its own halo alone and gathered by a caller are the plans
    /// `Routing::plan` gathers itself (each PE's `plan_for` over every halo), checked alike: a PE
    /// whose gathered plan disagrees with its peer, or does not parse, is an error on every PE.
    #[test]
    fn paths_gathered_by_the_caller_are_the_plans_gathered_here() {
        let (mut routers, halos) = four_pes();
        let n = halos.len();
        let want: Vec<RoutedPaths> = routers.iter_mut().map(|r| RoutedPaths::plan_for::<Float3>(r, &halos).expect("plan")).collect();
        let gathered: Vec<Vec<u8>> = routers
            .iter_mut()
            .zip(&halos)
            .map(|(r, h)| encode_plan(&RoutedPaths::plan_own_for::<Float3>(r, h, n).expect("own plan")).expect("encode"))
            .collect();
        for r in &routers {
            let got = adopt_gathered(r, &halos, &gathered).expect("adopted");
            assert_eq!(serde_json::to_string(&got).ok(), serde_json::to_string(&want).ok(), "PE {}", r.self_pe());
        }
        assert!(!want[0].direct(1), "the override must take effect for the checks below to mean anything");
        // PE 1 claims stores towards PE 0, which both ends were told to reach by puts.
        let mut lying = gathered.clone();
        let mut pe1 = want[1].clone();
        pe1.peers[0] = Some(crate::route::Transport::NvlinkStore);
        lying[1] = encode_plan(&pe1).expect("encode");
        for r in &routers {
            let e = adopt_gathered(r, &halos, &lying).expect_err("asymmetric plans");
            assert!(e.to_string().contains("PE 0"), "PE {}: {e}", r.self_pe());
        }
        let mut garbled = gathered;
        garbled[2].truncate(3);
        for r in &routers {
            let e = adopt_gathered(r, &halos, &garbled).expect_err("a plan that does not parse");
            assert!(e.to_string().contains("PE 2's plan does not parse"), "{e}");
        }
    }
}
