//! Failures fed back into the router, and the agreement that makes both ends of a pair switch
//! transport together.
//!
//! A halo exchange pair must use one path at both ends: if PE 0 moved its pulses to PE 1 onto
//! puts while PE 1 kept storing into PE 0's memory, neither would find its data. A failure is
//! usually seen by one end only (PE 0's launch failed; PE 1 just waits), so failing over on
//! local knowledge breaks the exchange. The protocol:
//!
//! 1. A router in [`Feedback::Agreed`] mode only *queues* what [`super::Router::record`] is told
//!    (a failed launch: [`Outcome::Failure`]; a device wait timeout: [`Outcome::Timeout`]); its
//!    choices do not move.
//! 2. At a safe point (every PE between two exchange steps, the exchange idle) every PE calls
//!    [`safe_point_via`] (or [`safe_point_through_bootstrap`], or [`safe_point_local`] for ranks
//!    of one process), which runs [`agree_via`] / [`agree_through_bootstrap`] / [`agree_local`]:
//!    it drains the queue into a [`SafePointRecord`], all-gathers the records through the
//!    bootstrap, and computes the next [`Agreement`] with [`agree`], a pure function of the
//!    previous agreement and the gathered records.
//! 3. Every PE applies the same agreement, the union of all reports: a (pair, transport) reported
//!    by either end counts for both ends (each end adds its heaviest outcome of the round), and
//!    a failure that reaches the skip threshold holds the transport out of that pair until its
//!    recheck, on the *agreed* clock (the latest router clock any PE reported). Both ends score
//!    the pair with the same reliability state, so they compute the same choice.
//! 4. The safe point then plans again and all-gathers the plans, so every PE knows which pairs
//!    switched ([`SafePoint::switched`]) and which exchange kernel the new plans need, and can
//!    rebuild the exchange together. Each pair has a **failure epoch**, the number of rounds
//!    that added a failure to it, which both ends report ([`super::RoutedSummary`]).
//!
//! The agreement checks that every PE routes over the same topology (hash) with the same decay
//! settings, and that the records belong to this round, and refuses to guess otherwise.
//!
//! [`FailureInjection`] (`HALO_INJECT_FAILURE=transport[:step][@pe,...]`) lets drivers make a
//! transport fail on purpose, to exercise all of this on real GPUs.

use super::paths::PathError;
use super::reliability::{Count, Decay};
use super::transport::TRANSPORTS;
use super::{Outcome, RouteError, RoutedPaths, Router, Transport};
use crate::desc::RankHalo;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// How a router treats recorded failures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Feedback {
    /// Act on them at once, on this PE alone (callers whose two ends need not agree).
    #[default]
    Local,
    /// Queue them for the next agreement; choices change only when an [`Agreement`] is applied.
    Agreed,
}

/// One failure one PE saw on one transport towards one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FailureReport {
    /// The peer.
    pub peer: usize,
    /// The transport that failed.
    pub transport: Transport,
    /// A failed launch ([`Outcome::Failure`]) or a device wait timeout ([`Outcome::Timeout`]).
    pub outcome: Outcome,
}

/// What one PE contributes at a safe point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SafePointRecord {
    /// The contributing PE.
    pub pe: usize,
    /// The round this record is for (the previous agreement's round + 1).
    pub round: u64,
    /// The PE's router clock now.
    pub clock: Duration,
    /// The PE's topology hash (every PE must route over the same topology).
    pub topology: String,
    /// The PE's failure half-life, seconds.
    pub half_life_s: f64,
    /// The PE's skip threshold.
    pub skip_threshold: f64,
    /// Failures seen since the last safe point.
    pub reports: Vec<FailureReport>,
}

/// The agreed failure record of one unordered pair of PEs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairRecord {
    /// The lower PE.
    pub a: usize,
    /// The higher PE.
    pub b: usize,
    /// Rounds that added a failure to this pair.
    pub epoch: u32,
    /// Per transport ([`Transport::ALL`] order): count and hold, on the agreed clock.
    pub counts: [Count; TRANSPORTS],
}

/// The failure state every PE agreed on after some rounds: a pure function of the records
/// gathered at each safe point, so every PE holds the same one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Agreement {
    /// Rounds applied so far (0: none).
    pub round: u64,
    /// The agreed clock: the latest router clock any PE has reported.
    pub now: Duration,
    /// Every pair that ever failed, ordered by (a, b).
    pub pairs: Vec<PairRecord>,
}

impl Agreement {
    /// The record of the pair (`x`, `y`) in either order, if it ever failed.
    pub fn pair(&self, x: usize, y: usize) -> Option<&PairRecord> {
        let key = (x.min(y), x.max(y));
        self.pairs.binary_search_by(|p| (p.a, p.b).cmp(&key)).ok().map(|i| &self.pairs[i])
    }

    /// The failure epoch of the pair (0 when it never failed).
    pub fn epoch(&self, x: usize, y: usize) -> u32 {
        self.pair(x, y).map_or(0, |p| p.epoch)
    }
}

/// What applying an agreement changed for one router.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgreementChange {
    /// The round applied.
    pub round: u64,
    /// Peers whose cached decisions were dropped (their pair changed, or its counts decay): plan
    /// again, and compare, to find which paths switch.
    pub rechecked: Vec<usize>,
    /// Failures reported this round by all PEs together: the same on every PE, so a driver can
    /// decide together to rebuild an exchange that some PE saw fail, even when no pair switched.
    pub reported: usize,
}

/// The next agreement from the previous one and every PE's record of this round (`records[i]`
/// from PE `i`). Deterministic: the order of reports within a record does not matter.
///
/// In one round, each end of a pair adds the weight of its heaviest report about a transport
/// (however often the step failed since the last safe point): a failed launch on one end and a
/// wait timeout on the other add 1.5, timeouts on both ends 1. Events are dated by the agreed
/// clock: the latest clock of any record or of the previous agreement.
pub fn agree(prev: &Agreement, records: &[SafePointRecord]) -> Result<Agreement, RouteError> {
    let bad = |reason: String| Err(RouteError::Agreement(reason));
    let Some(first) = records.first() else {
        return bad("no PE contributed a record".into());
    };
    let n = records.len();
    let round = prev.round + 1;
    for (i, r) in records.iter().enumerate() {
        if r.pe != i {
            return bad(format!("record {i} came from PE {}: records must be indexed by PE", r.pe));
        }
        if r.round != round {
            return bad(format!(
                "PE {i} contributed round {} but the agreement is at round {round}: every PE must call the safe point the same number of times",
                r.round
            ));
        }
        if r.topology != first.topology {
            return bad(format!(
                "PE {i} routes over topology {} but PE 0 over {}: every PE must build the same topology",
                r.topology, first.topology
            ));
        }
        if r.half_life_s.to_bits() != first.half_life_s.to_bits() || r.skip_threshold.to_bits() != first.skip_threshold.to_bits() {
            return bad(format!(
                "PE {i} has half-life {} s and skip threshold {}, PE 0 {} s and {}: set HALO_ROUTE_HALF_LIFE_S and HALO_ROUTE_SKIP_THRESHOLD alike on every PE",
                r.half_life_s, r.skip_threshold, first.half_life_s, first.skip_threshold
            ));
        }
        if let Some(f) = r.reports.iter().find(|f| f.peer >= n || f.peer == i) {
            return bad(format!("PE {i} reported a failure towards PE {}, which is not another PE of the {n}", f.peer));
        }
    }
    if let Some(p) = prev.pairs.iter().find(|p| p.b >= n) {
        return bad(format!("the previous agreement names PE {} but only {n} PEs contributed", p.b));
    }
    let decay = decay_of(first)?;
    let now = records.iter().map(|r| r.clock).fold(prev.now, Duration::max);
    // Each end's heaviest outcome per (pair, transport) this round, summed over the two ends, in
    // a deterministic order.
    let mut heaviest: BTreeMap<(usize, usize, usize, usize), f64> = BTreeMap::new();
    for r in records {
        for f in &r.reports {
            let w = heaviest.entry((r.pe.min(f.peer), r.pe.max(f.peer), f.transport.index(), r.pe)).or_insert(0.0);
            *w = w.max(f.outcome.weight());
        }
    }
    let mut events: BTreeMap<(usize, usize, usize), f64> = BTreeMap::new();
    for ((a, b, t, _), w) in heaviest {
        *events.entry((a, b, t)).or_insert(0.0) += w;
    }
    let mut pairs: BTreeMap<(usize, usize), PairRecord> = prev.pairs.iter().map(|p| ((p.a, p.b), p.clone())).collect();
    let mut touched: Vec<(usize, usize)> = Vec::new();
    for ((a, b, t), w) in events {
        if w <= 0.0 {
            continue;
        }
        let rec = pairs.entry((a, b)).or_insert_with(|| PairRecord { a, b, epoch: 0, counts: Default::default() });
        rec.counts[t].add(w, now, &decay);
        if touched.last() != Some(&(a, b)) {
            touched.push((a, b));
            rec.epoch = rec.epoch.saturating_add(1);
        }
    }
    Ok(Agreement { round, now, pairs: pairs.into_values().collect() })
}

fn decay_of(r: &SafePointRecord) -> Result<Decay, RouteError> {
    // The same limits as the configuration, so a record cannot overflow a Duration.
    let limits = &super::LIMITS;
    limits.half_life_s.check(r.half_life_s, &super::WeightSource::Default)?;
    limits.skip_threshold.check(r.skip_threshold, &super::WeightSource::Default)?;
    Ok(Decay { half_life: Duration::from_secs_f64(r.half_life_s), skip_threshold: r.skip_threshold })
}

/// A bootstrap's all-gather: `(tag, my bytes)` → every PE's bytes, indexed by PE. `tag` is new for
/// every call of a run.
pub type AllGather<'a> = dyn FnMut(&str, &[u8]) -> Result<Vec<Vec<u8>>, String> + 'a;

/// One safe point for the routers of ranks that share a process (`routers[r]` serves rank `r`):
/// their records are gathered directly, and every router applies the same agreement.
pub fn agree_local(routers: &mut [Router]) -> Result<Vec<AgreementChange>, RouteError> {
    let records: Vec<SafePointRecord> = routers.iter_mut().map(Router::safe_point_record).collect();
    let prev = routers.first().map(|r| r.agreement().clone()).unwrap_or_default();
    let next = agree(&prev, &records)?;
    let reported = reports_in(&records);
    routers.iter_mut().map(|r| r.apply_agreement(next.clone()).map(|c| AgreementChange { reported, ..c })).collect()
}

fn reports_in(records: &[SafePointRecord]) -> usize {
    records.iter().map(|r| r.reports.len()).sum()
}

/// One safe point for this PE's router, with `all_gather(tag, bytes)` returning every PE's bytes
/// indexed by PE (the bootstrap's all-gather; `tag` differs per round). Collective: every PE must
/// call it at the same point of the run.
pub fn agree_via(router: &mut Router, all_gather: &mut AllGather<'_>) -> Result<AgreementChange, RouteError> {
    let mine = router.safe_point_record();
    let tag = format!("route-failures-{}", mine.round);
    let bytes = serde_json::to_vec(&mine).map_err(|e| RouteError::Agreement(format!("encoding this PE's record: {e}")))?;
    let gathered = all_gather(&tag, &bytes).map_err(|e| RouteError::Agreement(format!("all-gather `{tag}`: {e}")))?;
    let records = gathered
        .iter()
        .enumerate()
        .map(|(pe, b)| {
            serde_json::from_slice::<SafePointRecord>(b)
                .map_err(|e| RouteError::Agreement(format!("PE {pe}'s record for `{tag}` does not parse: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let next = agree(router.agreement(), &records)?;
    let reported = reports_in(&records);
    router.apply_agreement(next).map(|c| AgreementChange { reported, ..c })
}

/// [`agree_via`] over the bootstrap of this run: `halo launch`'s rendezvous all-gather (a run of
/// one PE agrees with itself). Other launchers are refused with a message, as for gathering facts.
pub fn agree_through_bootstrap(router: &mut Router) -> Result<AgreementChange, RouteError> {
    agree_via(router, &mut bootstrap_all_gather)
}

/// What a safe point decided: the agreement applied, every PE's new plan, and the pairs whose path
/// switched. Everything but `change` is the same on every PE, so every PE can tell whether the
/// exchange must be rebuilt (and with which kernel, [`RoutedPaths::exchange_transport`]) without
/// asking again.
#[derive(Clone, Debug)]
pub struct SafePoint {
    /// This PE's view of the agreement applied.
    pub change: AgreementChange,
    /// Every PE's plan after the agreement (`plans[i]` is PE `i`'s), checked symmetric.
    pub plans: Vec<RoutedPaths>,
    /// `(a, b, before, after)` for every pair `a < b` whose path changed.
    pub switched: Vec<(usize, usize, Option<Transport>, Option<Transport>)>,
}

/// Pairs `a < b` whose transport differs between two sets of plans (both indexed by PE).
fn switched_pairs(before: &[RoutedPaths], after: &[RoutedPaths]) -> Vec<(usize, usize, Option<Transport>, Option<Transport>)> {
    let mut out = Vec::new();
    for (a, (old, new)) in before.iter().zip(after).enumerate() {
        for b in a + 1..new.peers.len().max(old.peers.len()) {
            let (x, y) = (old.transport(b), new.transport(b));
            if x != y {
                out.push((a, b, x, y));
            }
        }
    }
    out
}

/// A full safe point for this PE (collective): [`agree_via`], then the PE plans again (same
/// element size and transport set as its current plan, `current[self]`), the plans are
/// all-gathered (tag `route-paths-<round>`) and checked symmetric, and the pairs that switched
/// are listed. `current` is every PE's plan before the safe point.
pub fn safe_point_via(
    router: &mut Router,
    halos: &[RankHalo],
    current: &[RoutedPaths],
    all_gather: &mut AllGather<'_>,
) -> Result<SafePoint, PathError> {
    let change = agree_via(router, all_gather)?;
    let me = router.self_pe();
    let mine = current.get(me).ok_or(PathError::Empty)?;
    let plan = mine.replan(router, halos)?;
    let tag = format!("route-paths-{}", change.round);
    let bytes = serde_json::to_vec(&plan).map_err(|e| RouteError::Agreement(format!("encoding this PE's plan: {e}")))?;
    let plans = all_gather(&tag, &bytes)
        .map_err(|e| RouteError::Agreement(format!("all-gather `{tag}`: {e}")))?
        .iter()
        .enumerate()
        .map(|(pe, b)| {
            serde_json::from_slice::<RoutedPaths>(b).map_err(|e| RouteError::Agreement(format!("PE {pe}'s plan for `{tag}` does not parse: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    RoutedPaths::check_symmetric(&plans)?;
    Ok(SafePoint { change, switched: switched_pairs(current, &plans), plans })
}

/// [`safe_point_via`] over the bootstrap of this run (`halo launch`'s rendezvous).
pub fn safe_point_through_bootstrap(router: &mut Router, halos: &[RankHalo], current: &[RoutedPaths]) -> Result<SafePoint, PathError> {
    safe_point_via(router, halos, current, &mut bootstrap_all_gather)
}

/// A full safe point for the routers of ranks that share a process: [`agree_local`], every rank
/// plans again, the plans are checked symmetric, and the pairs that switched are listed.
pub fn safe_point_local(routers: &mut [Router], halos: &[RankHalo], current: &[RoutedPaths]) -> Result<SafePoint, PathError> {
    let changes = agree_local(routers)?;
    let plans = routers.iter_mut().zip(current).map(|(r, p)| p.replan(r, halos)).collect::<Result<Vec<_>, _>>()?;
    RoutedPaths::check_symmetric(&plans)?;
    let change = changes.into_iter().next().unwrap_or_default();
    Ok(SafePoint { change, switched: switched_pairs(current, &plans), plans })
}

/// The `halo launch` rendezvous all-gather (a run of one PE gathers its own bytes).
fn bootstrap_all_gather(tag: &str, bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let all = super::gpu_facts::gather_json(tag, &value).map_err(|e| e.to_string())?;
    all.iter().map(|v| serde_json::to_vec(v).map_err(|e| e.to_string())).collect()
}

/// The environment variable that injects a failure.
pub const INJECT_ENV: &str = "HALO_INJECT_FAILURE";

/// A failure injected on purpose: `HALO_INJECT_FAILURE=transport[:step][@pe,pe...]`.
///
/// `nvlink-store` fails every step that uses it, on every PE; `nvlink-store:3` fails step 3 only;
/// `nvlink-store:3@0` fails step 3 on PE 0 only (a one-sided failure: PE 1 sees only that its
/// data never came). Drivers ask [`FailureInjection::fires`] before launching a step's exchange
/// and, when it fires, skip the launch and record [`Outcome::Failure`] for the peers that use the
/// transport, as they would for a real failed launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureInjection {
    /// The transport that fails.
    pub transport: Transport,
    /// The one step it fails at; `None`: every step.
    pub step: Option<u64>,
    /// The PEs it fails on; `None`: all.
    pub pes: Option<Vec<usize>>,
}

impl FailureInjection {
    /// Parses `transport[:step][@pe,pe...]`.
    pub fn parse(spec: &str) -> Result<Self, RouteError> {
        let bad = |reason: String| RouteError::Parse {
            what: "failure injection",
            value: spec.to_owned(),
            reason: format!("{reason}; write transport[:step][@pe,...], e.g. nvlink-store:3@0"),
        };
        let (rest, pes) = match spec.trim().split_once('@') {
            Some((r, list)) => {
                let pes =
                    list.split(',')
                        .map(|p| p.trim().parse::<usize>().map_err(|_| bad(format!("{p:?} is not a PE number"))))
                        .collect::<Result<Vec<_>, _>>()?;
                (r, Some(pes))
            }
            None => (spec.trim(), None),
        };
        let (name, step) = match rest.split_once(':') {
            Some((n, s)) => (n, Some(s.trim().parse::<u64>().map_err(|_| bad(format!("{s:?} is not a step number")))?)),
            None => (rest, None),
        };
        let transport = name.parse::<Transport>().map_err(|e| bad(e.to_string()))?;
        Ok(Self { transport, step, pes })
    }

    /// The injection `HALO_INJECT_FAILURE` asks for, if set (through `env`, so tests need not touch
    /// the process environment); a malformed value is an error naming the variable.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Self>, RouteError> {
        match env(INJECT_ENV).filter(|v| !v.trim().is_empty()) {
            None => Ok(None),
            Some(v) => Self::parse(&v).map(Some).map_err(|e| RouteError::Env { var: INJECT_ENV.into(), value: v, reason: e.to_string() }),
        }
    }

    /// Whether `transport` fails on `pe` at `step`.
    pub fn fires(&self, pe: usize, transport: Transport, step: u64) -> bool {
        transport == self.transport && self.step.is_none_or(|s| s == step) && self.pes.as_ref().is_none_or(|p| p.contains(&pe))
    }

    /// The peers of `plan`'s PE whose path is the failing transport at `step` (empty when the
    /// injection does not fire there): the driver skips the step's launch when this is not empty
    /// and records [`Outcome::Failure`] for each of them.
    pub fn failing_peers(&self, plan: &RoutedPaths, step: u64) -> Vec<usize> {
        plan.peers.iter().enumerate().filter(|&(_, t)| t.is_some_and(|t| self.fires(plan.self_pe, t, step))).map(|(peer, _)| peer).collect()
    }
}

impl fmt::Display for FailureInjection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.transport)?;
        if let Some(s) = self.step {
            write!(f, ":{s}")?;
        }
        if let Some(p) = &self.pes {
            let list: Vec<String> = p.iter().map(usize::to_string).collect();
            write!(f, "@{}", list.join(","))?;
        }
        Ok(())
    }
}
