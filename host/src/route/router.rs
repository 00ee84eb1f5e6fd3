//! The router: per-peer cached decisions, failover, overrides, debug blocks and the summary.
//!
//! One `Router` serves one PE. The hot path, [`Router::route`] (or [`Router::route_among`] for a
//! caller that implements only some transports), is a scan of a handful of cache entries for the
//! peer, keyed by operation, size class and the caller's transport set; a miss (first use, new topology epoch, a recorded failure, or a decaying
//! failure count due for a recheck) runs the full scoring pass and, with `HALO_ROUTE_DEBUG=1`,
//! writes one block describing it.

use super::config::{EffectiveWeights, RouteConfig, WeightSource};
use super::feedback::{Agreement, AgreementChange, FailureReport, Feedback, SafePointRecord};
use super::reliability::Reliability;
use super::score::{ReliabilityState, Scoring, score_candidates_among};
use super::size::{class_bytes, size_class};
use super::transport::TRANSPORTS;
use super::{Clock, DistanceInfo, DistanceLevel, Exclusion, Op, Outcome, PerfTable, RouteError, SystemClock, Topology, Transport, TransportSet};
use std::fmt;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

/// Why a route was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteReason {
    /// Highest score.
    Scored,
    /// Forced by `HALO_FORCE_TRANSPORT` or a per-pair override.
    Forced,
    /// Every usable transport had failed recently; the best of them anyway.
    AllFailed,
}

/// The answer to "which transport for this peer, operation and size".
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Route {
    /// The transport to use.
    pub transport: Transport,
    /// The distance to the peer.
    pub level: DistanceLevel,
    /// The transport's score, 0..1.
    pub score: f64,
    /// Why this transport.
    pub reason: RouteReason,
}

/// A full decision with everything that went into it (what `HALO_ROUTE_DEBUG` prints).
#[derive(Clone, Debug)]
pub struct Decision {
    /// The deciding PE.
    pub self_pe: usize,
    /// The destination PE.
    pub peer: usize,
    /// The operation.
    pub op: Op,
    /// The message size asked about.
    pub bytes: u64,
    /// The transports the caller can use (the others are excluded as not usable).
    pub allowed: TransportSet,
    /// The size the decision was made for (the size class's upper bound).
    pub class_bytes: u64,
    /// The distance and which bitmap level matched.
    pub distance: DistanceInfo,
    /// The topology's epoch and hash.
    pub epoch: u64,
    /// The topology hash, hex.
    pub topology_hash: String,
    /// The weights at `class_bytes`.
    pub weights: EffectiveWeights,
    /// Every candidate.
    pub scoring: Scoring,
    /// What forced the transport, if something did.
    pub forced_by: Option<WeightSource>,
    /// The outcome.
    pub route: Route,
}

/// Per-pair route switches and the topology hash, for the end of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSummary {
    /// The PE this router serves.
    pub self_pe: usize,
    /// Topology epoch at the end.
    pub epoch: u64,
    /// Topology hash at the end.
    pub topology_hash: String,
    /// Lookups answered.
    pub lookups: u64,
    /// Lookups that ran the scoring pass.
    pub computed: u64,
    /// `(peer, switches)` for every peer whose chosen transport changed at least once.
    pub switches: Vec<(usize, u32)>,
}

impl fmt::Display for RouteSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "route summary: PE {} topology epoch {} hash {}, {} lookups ({} computed), route switches: ",
            self.self_pe, self.epoch, self.topology_hash, self.lookups, self.computed
        )?;
        if self.switches.is_empty() {
            return f.write_str("none");
        }
        let pairs: Vec<String> = self.switches.iter().map(|(p, n)| format!("{}-{p}: {n}", self.self_pe)).collect();
        f.write_str(&pairs.join(", "))
    }
}

#[derive(Clone, Copy, Debug)]
struct CacheEntry {
    op: Op,
    class: u8,
    allowed: TransportSet,
    epoch: u64,
    generation: u32,
    recheck_at: Option<Duration>,
    route: Route,
}

#[derive(Clone, Debug, Default)]
struct PeerState {
    /// The topology epoch whose one-sided-claim warning was logged for this peer (0: none yet),
    /// so the warning is not repeated per message.
    warned_epoch: u64,
    generation: u32,
    switches: u32,
    entries: Vec<CacheEntry>,
}

/// Chooses transports for one PE.
pub struct Router {
    self_pe: usize,
    topo: Arc<Topology>,
    config: Arc<RouteConfig>,
    perf: Arc<PerfTable>,
    reliability: Reliability,
    clock: Arc<dyn Clock>,
    peers: Vec<PeerState>,
    debug: Option<Box<dyn Write + Send>>,
    lookups: u64,
    computed: u64,
    feedback: Feedback,
    /// Failures recorded in [`Feedback::Agreed`] mode, for the next safe point.
    pending: Vec<FailureReport>,
    /// The last agreement applied.
    agreement: Agreement,
}

impl fmt::Debug for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Router").field("self_pe", &self.self_pe).field("topology", &self.topo.to_string()).finish()
    }
}

impl Router {
    /// A router for `self_pe`, loading the calibration file the config names (if any).
    ///
    /// Logs the topology (epoch, hash) and every setting with its source at info level, and
    /// writes the same to stderr when debug output is on.
    pub fn new(self_pe: usize, topo: Arc<Topology>, config: RouteConfig) -> Result<Self, RouteError> {
        let perf = match &config.calibration {
            Some(c) => PerfTable::load_calibration(&c.value)?,
            None => PerfTable::defaults(),
        };
        Self::with_perf(self_pe, topo, config, Arc::new(perf))
    }

    /// A router with an already loaded performance table (shared between routers of one process).
    pub fn with_perf(self_pe: usize, topo: Arc<Topology>, config: RouteConfig, perf: Arc<PerfTable>) -> Result<Self, RouteError> {
        config.validate()?;
        let n = topo.n_pes();
        if self_pe >= n {
            return Err(RouteError::PeOutOfRange { pe: self_pe, n_pes: n });
        }
        let debug: Option<Box<dyn Write + Send>> = config.debug.value.then(|| Box::new(std::io::stderr()) as _);
        let mut r = Self::quiet(self_pe, topo, Arc::new(config), perf, Arc::new(SystemClock::new()));
        r.debug = debug;
        r.announce();
        Ok(r)
    }

    /// A router of `self_pe` (in range, `config` validated) that has announced nothing and
    /// writes no debug blocks.
    fn quiet(self_pe: usize, topo: Arc<Topology>, config: Arc<RouteConfig>, perf: Arc<PerfTable>, clock: Arc<dyn Clock>) -> Self {
        let n = topo.n_pes();
        let half_life = Duration::from_secs_f64(config.half_life_s.value);
        Self {
            self_pe,
            reliability: Reliability::new(n, half_life, config.skip_threshold.value),
            topo,
            config,
            perf,
            clock,
            peers: vec![PeerState::default(); n],
            debug: None,
            lookups: 0,
            computed: 0,
            feedback: Feedback::Local,
            pending: Vec::new(),
            agreement: Agreement::default(),
        }
    }

    /// The router `peer` runs, as far as this PE can know it: the same topology, settings,
    /// performance numbers, clock, feedback mode and agreed failure record, none of them copied
    /// (shared with this router), and no failure recorded locally. Its decisions are `peer`'s as
    /// every PE replays them ([`super::RoutedPaths::mirror_check`]), so it announces nothing and
    /// writes no debug blocks even where this router does: this PE's log holds its own decisions.
    /// A search step builds one per peer, so it costs no formatting of the settings (which,
    /// cold, cost more than the plan it checks).
    pub(crate) fn mirror(&self, peer: usize) -> Result<Self, RouteError> {
        if peer >= self.topo.n_pes() {
            return Err(RouteError::PeOutOfRange { pe: peer, n_pes: self.topo.n_pes() });
        }
        let mut r = Self::quiet(peer, Arc::clone(&self.topo), Arc::clone(&self.config), Arc::clone(&self.perf), Arc::clone(&self.clock));
        r.adopt_agreement(self);
        Ok(r)
    }

    /// Replaces the clock (tests step a [`super::ManualClock`]).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sends debug blocks to `w` (and turns them on) instead of stderr.
    pub fn with_debug_writer(mut self, w: Box<dyn Write + Send>) -> Self {
        self.debug = Some(w);
        self
    }

    /// The PE this router serves.
    pub fn self_pe(&self) -> usize {
        self.self_pe
    }

    /// The topology in use.
    pub fn topology(&self) -> &Arc<Topology> {
        &self.topo
    }

    /// The configuration in use.
    pub fn config(&self) -> &RouteConfig {
        &self.config
    }

    /// The performance table in use.
    pub fn perf(&self) -> &PerfTable {
        &self.perf
    }

    /// Which transport to use for `op` on a `bytes`-byte message to `peer`, among every transport.
    ///
    /// A cache lookup unless the topology, the peer's failure record or the decay clock says the
    /// cached answer may be stale; then the full pass of [`Router::decide`] runs.
    #[inline]
    pub fn route(&mut self, peer: usize, op: Op, bytes: u64) -> Result<Route, RouteError> {
        self.route_among(peer, op, bytes, TransportSet::ALL)
    }

    /// Which transport of `allowed` to use for `op` on a `bytes`-byte message to `peer`.
    ///
    /// For callers that implement only some transports (the halo exchange has no NCCL path): the
    /// others are excluded as not usable, so they can neither be chosen nor outscore the usable
    /// ones. A transport forced outside `allowed` is [`RouteError::ForcedUnusable`]. Cached like
    /// [`Router::route`], with `allowed` part of the key.
    #[inline]
    pub fn route_among(&mut self, peer: usize, op: Op, bytes: u64, allowed: TransportSet) -> Result<Route, RouteError> {
        self.lookups += 1;
        let class = size_class(bytes);
        let epoch = self.topo.epoch();
        if let Some(st) = self.peers.get(peer)
            && let Some(e) = st.entries.iter().find(|e| e.op == op && e.class == class && e.allowed == allowed)
            && e.epoch == epoch
            && e.generation == st.generation
            && e.recheck_at.is_none_or(|t| self.clock.now() < t)
        {
            return Ok(e.route);
        }
        self.route_slow(peer, op, bytes, allowed)
    }

    #[cold]
    fn route_slow(&mut self, peer: usize, op: Op, bytes: u64, allowed: TransportSet) -> Result<Route, RouteError> {
        let n = self.topo.n_pes();
        if peer >= n {
            return Err(RouteError::PeOutOfRange { pe: peer, n_pes: n });
        }
        self.computed += 1;
        let epoch = self.topo.epoch();
        let distance = self.topo.distance_info(self.self_pe, peer)?;
        // Once per peer and epoch, so the one-sided warning is not repeated per message.
        if self.peers[peer].warned_epoch != epoch {
            self.topo.warn_one_sided(self.self_pe, peer, &distance);
            self.peers[peer].warned_epoch = epoch;
        }
        let decision = self.decide_with(peer, op, bytes, allowed, distance)?;
        if let Some(w) = self.debug.as_mut() {
            // Debug output must never fail the run; a closed stderr only loses the log.
            let _ = write!(w, "{decision}");
        }
        let now = self.clock.now();
        // Recheck while failures decay, and exactly when a hold ends so that the transport comes
        // back on time rather than up to a recheck interval late.
        let periodic = self.reliability.has_history(peer, now).then(|| now + self.reliability.recheck_after());
        let recheck_at = match (periodic, self.reliability.next_release(peer, now)) {
            // Agreed choices change only when an agreement is applied, never by the local clock.
            _ if self.feedback == Feedback::Agreed => None,
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let class = size_class(bytes);
        let st = &mut self.peers[peer];
        let entry = CacheEntry { op, class, allowed, epoch, generation: st.generation, recheck_at, route: decision.route };
        match st.entries.iter_mut().find(|e| e.op == op && e.class == class && e.allowed == allowed) {
            Some(old) => {
                if old.route.transport != decision.route.transport {
                    st.switches += 1;
                    tracing::info!(
                        "route: PE {} -> PE {peer} {op} {}: switched {} -> {}",
                        self.self_pe,
                        super::size::format_size(class_bytes(class)),
                        old.route.transport,
                        decision.route.transport
                    );
                }
                *old = entry;
            }
            None => {
                // Exact growth: a peer has a handful of entries, and the default growth (room for
                // four) would be most of the router's memory at thousands of peers.
                st.entries.reserve_exact(1);
                st.entries.push(entry);
            }
        }
        Ok(decision.route)
    }

    /// The full decision for `peer`, `op`, `bytes`, without touching the cache or logging.
    pub fn decide(&self, peer: usize, op: Op, bytes: u64) -> Result<Decision, RouteError> {
        self.decide_among(peer, op, bytes, TransportSet::ALL)
    }

    /// [`Router::decide`] among the transports of `allowed` (what [`Router::route_among`] runs).
    pub fn decide_among(&self, peer: usize, op: Op, bytes: u64, allowed: TransportSet) -> Result<Decision, RouteError> {
        let distance = self.topo.distance_info(self.self_pe, peer)?;
        self.decide_with(peer, op, bytes, allowed, distance)
    }

    fn decide_with(&self, peer: usize, op: Op, bytes: u64, allowed: TransportSet, distance: DistanceInfo) -> Result<Decision, RouteError> {
        let class_bytes = class_bytes(size_class(bytes));
        let weights = self.config.weights.at(class_bytes);
        let now = self.clock.now();
        let rel: [ReliabilityState; TRANSPORTS] = match self.feedback {
            Feedback::Local => std::array::from_fn(|i| self.reliability.state(peer, Transport::ALL[i], now)),
            // The same state on both ends of the pair: the agreed record at the agreed time.
            Feedback::Agreed => {
                let pair = self.agreement.pair(self.self_pe, peer);
                let decay = self.reliability.decay();
                std::array::from_fn(|i| pair.map_or_else(ReliabilityState::default, |p| p.counts[i].state(self.agreement.now, decay)))
            }
        };
        let level = distance.level;
        let scoring = score_candidates_among(level, op, class_bytes, &weights, &self.perf, &rel, allowed);
        let forced = self.config.overrides.forced(self.self_pe, peer);
        let route = match forced {
            Some((t, by)) => {
                let c = scoring.candidate(t);
                match c.excluded {
                    // A user's order is followed even after failures, and without measurements:
                    // they asked for this transport.
                    None | Some(Exclusion::RecentlyFailed { .. } | Exclusion::NotMeasured) => {
                        Route { transport: t, level, score: c.score, reason: RouteReason::Forced }
                    }
                    Some(e) => {
                        return Err(RouteError::ForcedUnusable {
                            transport: t,
                            by: by.to_string(),
                            self_pe: self.self_pe,
                            peer,
                            op,
                            reason: match e {
                                Exclusion::NotUsable => format!("{e} (it uses {allowed})"),
                                _ => e.to_string(),
                            },
                        });
                    }
                }
            }
            None => {
                let t = scoring.best.ok_or_else(|| RouteError::NoRoute {
                    self_pe: self.self_pe,
                    peer,
                    op,
                    level,
                    reasons: scoring.exclusion_reasons(),
                })?;
                let reason = if scoring.all_failed { RouteReason::AllFailed } else { RouteReason::Scored };
                Route { transport: t, level, score: scoring.candidate(t).score, reason }
            }
        };
        Ok(Decision {
            self_pe: self.self_pe,
            peer,
            op,
            bytes,
            allowed,
            class_bytes,
            distance,
            epoch: self.topo.epoch(),
            topology_hash: self.topo.hash_hex(),
            weights,
            scoring,
            forced_by: forced.map(|(_, by)| by.clone()),
            route,
        })
    }

    /// Records what happened on `transport` towards `peer`: [`Outcome::Failure`] for a failed
    /// launch, [`Outcome::Timeout`] for a device wait that timed out.
    ///
    /// In [`Feedback::Local`] mode (the default) the next [`Router::route`] for that peer
    /// recomputes at once and skips the transport until its recheck. In [`Feedback::Agreed`] mode
    /// the failure is queued for the next safe point ([`super::feedback::agree_via`]) and nothing
    /// changes until the agreement is applied, so both ends of the pair switch together.
    pub fn record(&mut self, peer: usize, transport: Transport, outcome: Outcome) {
        if outcome.weight() == 0.0 || peer >= self.topo.n_pes() {
            return;
        }
        if self.feedback == Feedback::Agreed {
            let report = FailureReport { peer, transport, outcome };
            // Bounded however often a step fails between two safe points.
            if !self.pending.contains(&report) {
                self.pending.push(report);
            }
            tracing::warn!(
                "route: PE {} -> PE {peer}: {transport} {outcome:?}, queued for agreement round {}",
                self.self_pe,
                self.agreement.round + 1
            );
            return;
        }
        let now = self.clock.now();
        self.reliability.record(peer, transport, outcome, now);
        self.peers[peer].generation = self.peers[peer].generation.wrapping_add(1);
        tracing::warn!(
            "route: PE {} -> PE {peer}: {transport} {:?} (decayed count {:.2})",
            self.self_pe,
            outcome,
            self.reliability.count(peer, transport, now)
        );
    }

    /// Switches between acting on failures locally and agreeing on them first (see [`Feedback`]).
    pub fn set_feedback(&mut self, feedback: Feedback) {
        if feedback != self.feedback {
            self.feedback = feedback;
            for p in &mut self.peers {
                p.generation = p.generation.wrapping_add(1);
            }
        }
    }

    /// How recorded failures are treated.
    pub fn feedback(&self) -> Feedback {
        self.feedback
    }

    /// Failures queued for the next safe point.
    pub fn pending_failures(&self) -> &[FailureReport] {
        &self.pending
    }

    /// This PE's contribution to the next safe point: its queued failures (drained), its clock,
    /// topology hash and decay settings.
    pub fn safe_point_record(&mut self) -> SafePointRecord {
        let mut reports = std::mem::take(&mut self.pending);
        reports.sort_unstable();
        SafePointRecord {
            pe: self.self_pe,
            round: self.agreement.round + 1,
            clock: self.clock.now(),
            topology: self.topo.hash_hex(),
            half_life_s: self.config.half_life_s.value,
            skip_threshold: self.config.skip_threshold.value,
            reports,
        }
    }

    /// Whether a full safe point is due although nothing new was reported: an agreed hold on a
    /// pair of this PE has ended by this router's clock, or a pair's agreed count still decays
    /// and a recheck interval has passed since the agreement. Drivers gather this flag with the
    /// number of queued reports and run the full agreement only when some PE says yes, so a
    /// quiet safe point costs one small all-gather.
    pub fn agreement_due(&self) -> bool {
        let now = self.clock.now();
        let agreed = self.agreement.now;
        let decay = self.reliability.decay();
        let me = self.self_pe;
        self.agreement.pairs.iter().filter(|p| p.a == me || p.b == me).any(|p| {
            p.counts.iter().any(|c| {
                (c.held(agreed) && !c.held(now)) || (c.value_at(agreed, decay) > 1e-3 && now >= agreed.saturating_add(decay.recheck_after()))
            })
        })
    }

    /// The last agreement applied (the default before the first).
    pub fn agreement(&self) -> &Agreement {
        &self.agreement
    }

    /// Applies the next agreement ([`super::feedback::agree`] over every PE's record) and puts the
    /// router in [`Feedback::Agreed`] mode (`reported` in the answer is left 0: the callers that
    /// saw the records fill it in). Drops the cached decisions of every peer whose pair
    /// record changed or still has failures decaying, so the next plan sees the agreed state.
    pub fn apply_agreement(&mut self, next: Agreement) -> Result<AgreementChange, RouteError> {
        if next.round != self.agreement.round + 1 {
            return Err(RouteError::Agreement(format!(
                "PE {} is at round {} and cannot apply round {}: every PE must apply every round once",
                self.self_pe, self.agreement.round, next.round
            )));
        }
        if let Some(p) = next.pairs.iter().find(|p| p.b >= self.topo.n_pes()) {
            return Err(RouteError::Agreement(format!("the agreement names PE {}, outside the topology of {} PEs", p.b, self.topo.n_pes())));
        }
        let me = self.self_pe;
        let decay = *self.reliability.decay();
        let mut rechecked: Vec<usize> = Vec::new();
        for p in next.pairs.iter().chain(&self.agreement.pairs).filter(|p| p.a == me || p.b == me) {
            let peer = if p.a == me { p.b } else { p.a };
            let changed = self.agreement.pair(p.a, p.b) != next.pair(p.a, p.b);
            let live = p.counts.iter().any(|c| c.held(next.now) || c.value_at(next.now, &decay) > 1e-3);
            if (changed || live) && !rechecked.contains(&peer) {
                rechecked.push(peer);
            }
        }
        rechecked.sort_unstable();
        self.set_feedback(Feedback::Agreed);
        for &peer in &rechecked {
            self.peers[peer].generation = self.peers[peer].generation.wrapping_add(1);
        }
        let round = next.round;
        self.agreement = next;
        if !rechecked.is_empty() {
            tracing::info!("route: PE {me} applied agreement round {round}; rechecking PEs {rechecked:?}");
        }
        Ok(AgreementChange { round, rechecked, reported: 0 })
    }

    /// Takes `other`'s feedback mode and agreement as they are (a mirror of a peer's router scores
    /// its pairs with the same agreed record).
    pub(crate) fn adopt_agreement(&mut self, other: &Router) {
        self.set_feedback(other.feedback);
        self.agreement = other.agreement.clone();
    }

    /// The agreed failure epoch of the pair with `peer`: how many rounds added a failure to it.
    pub fn failure_epoch(&self, peer: usize) -> u32 {
        self.agreement.epoch(self.self_pe, peer)
    }

    /// Installs a new topology. When its content differs from the current one it gets the next
    /// epoch, which invalidates every cached decision; an identical one changes nothing.
    pub fn set_topology(&mut self, mut topo: Topology) -> Result<(), RouteError> {
        if topo.hash() == self.topo.hash() && topo.n_pes() == self.topo.n_pes() {
            return Ok(());
        }
        if self.self_pe >= topo.n_pes() {
            return Err(RouteError::PeOutOfRange { pe: self.self_pe, n_pes: topo.n_pes() });
        }
        topo.set_epoch(self.topo.epoch().max(topo.epoch()) + 1);
        self.peers.resize(topo.n_pes(), PeerState::default());
        self.reliability.resize(topo.n_pes());
        self.topo = Arc::new(topo);
        self.announce();
        Ok(())
    }

    /// Per-pair route switches and the topology hash; also logged at info level.
    pub fn summary(&self) -> RouteSummary {
        let s = RouteSummary {
            self_pe: self.self_pe,
            epoch: self.topo.epoch(),
            topology_hash: self.topo.hash_hex(),
            lookups: self.lookups,
            computed: self.computed,
            switches: self.peers.iter().enumerate().filter(|(_, p)| p.switches > 0).map(|(i, p)| (i, p.switches)).collect(),
        };
        tracing::info!("{s}");
        s
    }

    fn announce(&mut self) {
        tracing::info!("route: PE {} topology {}", self.self_pe, self.topo);
        let calibrated = self.perf.calibrated_pairs();
        tracing::info!(
            "route: performance numbers: {}",
            if calibrated == 0 { "default, not measured".to_owned() } else { format!("{calibrated} transport/level pairs calibrated") }
        );
        self.config.log();
        if let Some(w) = self.debug.as_mut() {
            let _ = writeln!(w, "[route] PE {} topology {}", self.self_pe, self.topo);
            for line in self.config.describe() {
                let _ = writeln!(w, "[route] config {line}");
            }
        }
    }
}
