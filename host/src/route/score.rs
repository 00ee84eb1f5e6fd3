//! The scoring pass: every transport against one (distance, operation, size).
//!
//! `score = (w1·latency + w2·bandwidth + w3·topology + w4·capability + w5·reliability) / Σw`,
//! each factor normalised to 0..1 against the candidates that remain (the best candidate on a
//! factor gets 1): latency as `min / own`, the others as `own / max`. A transport that lacks the
//! operation's capability, does not reach the distance, or failed recently for this peer is
//! excluded with score 0 and the reason. When every reachable, capable transport failed
//! recently, they are all let back in (scored with their low reliability) rather than failing
//! the run.
//!
//! Two more exclusions keep the choice honest:
//!
//! - **Not usable by this caller**: the caller passes the set of transports it implements
//!   ([`score_candidates_among`]); the others are never scored, so they can neither win nor shift
//!   the normalisation of the ones that can be used.
//! - **Default, not measured**: when some usable candidate has numbers measured by
//!   `halo calibrate` at this level, a candidate that has only built-in defaults there is excluded.
//!   Defaults are order-of-magnitude guesses, and measured one-way times include everything a real
//!   step pays (launch, synchronisation), so comparing the two lets the guess win unfairly; on two
//!   H200s the default NCCL (12 µs) beat every measured transport (~24 µs) that way. An unmeasured
//!   transport is still used when no measured one can serve the pair.

use super::config::EffectiveWeights;
use super::transport::{PerfSource, TRANSPORTS};
use super::{Caps, DistanceLevel, Op, PerfTable, Transport, TransportSet};
use std::fmt;

/// Normalised factors of one candidate, each 0..1.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Factors {
    /// Lower latency is better.
    pub latency: f64,
    /// Higher bandwidth is better.
    pub bandwidth: f64,
    /// Fit of the transport to the distance ([`Transport::affinity`]).
    pub topology: f64,
    /// 1 when the GPU initiates the operation itself, less when the host drives it.
    pub capability: f64,
    /// Fewer recent failures is better.
    pub reliability: f64,
}

/// Why a transport was not a candidate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Exclusion {
    /// The operation needs capabilities the transport lacks.
    MissingCapability {
        /// What is missing.
        missing: Caps,
    },
    /// The peer is farther than the transport reaches.
    Unreachable {
        /// The farthest level it reaches.
        max: DistanceLevel,
    },
    /// No performance numbers exist for this transport at this distance.
    NoPerfData,
    /// Failed or timed out for this peer recently; skipped until the count decays.
    RecentlyFailed {
        /// Decayed failure count.
        count: f64,
    },
    /// The caller does not implement this transport (outside the set it passed).
    NotUsable,
    /// Only built-in default numbers exist for this transport at this level, while another
    /// usable candidate there was measured by `halo calibrate`.
    NotMeasured,
}

impl fmt::Display for Exclusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exclusion::MissingCapability { missing } => write!(f, "lacks {missing}"),
            Exclusion::Unreachable { max } => write!(f, "does not reach beyond {max}"),
            Exclusion::NoPerfData => f.write_str("no performance data at this distance"),
            Exclusion::RecentlyFailed { count } => {
                write!(f, "recently failed (decayed count {count:.2})")
            }
            Exclusion::NotUsable => f.write_str("not usable by this caller"),
            Exclusion::NotMeasured => {
                f.write_str("default, not measured, while measured transports can serve this pair (calibrate it to let it compete)")
            }
        }
    }
}

/// Reliability of one transport towards the peer being scored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReliabilityState {
    /// `1 / (1 + count)`.
    pub factor: f64,
    /// Decayed failure count.
    pub count: f64,
    /// Whether the count reached the skip threshold.
    pub skipped: bool,
}

impl Default for ReliabilityState {
    fn default() -> Self {
        Self { factor: 1.0, count: 0.0, skipped: false }
    }
}

/// One transport's evaluation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// The transport.
    pub transport: Transport,
    /// Latency looked up for this distance and size (0 when excluded before lookup).
    pub latency_us: f64,
    /// Bandwidth looked up for this distance and size.
    pub bandwidth_gbs: f64,
    /// Whether the numbers were measured by `halo calibrate` (false: built-in defaults).
    pub calibrated: bool,
    /// Normalised factors (zero when excluded).
    pub factors: Factors,
    /// The weighted score, 0..1 (zero when excluded).
    pub score: f64,
    /// Why it is not a candidate, if it is not.
    pub excluded: Option<Exclusion>,
}

/// The result of a scoring pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scoring {
    /// Every transport, in [`Transport::ALL`] order.
    pub candidates: [Candidate; TRANSPORTS],
    /// The highest score (ties go to the earlier transport); `None` when every transport is excluded.
    pub best: Option<Transport>,
    /// Every usable transport had failed recently, so they were scored anyway.
    pub all_failed: bool,
}

impl Scoring {
    /// The evaluation of one transport.
    pub fn candidate(&self, t: Transport) -> &Candidate {
        &self.candidates[t.index()]
    }

    /// The reasons of all excluded transports, `name: reason; ...`.
    pub fn exclusion_reasons(&self) -> String {
        self.candidates.iter().filter_map(|c| c.excluded.map(|e| format!("{}: {e}", c.transport))).collect::<Vec<_>>().join("; ")
    }
}

/// Scores every transport for a peer at `level`, for `op` on `bytes`-byte messages.
pub fn score_candidates(
    level: DistanceLevel,
    op: Op,
    bytes: u64,
    weights: &EffectiveWeights,
    perf: &PerfTable,
    reliability: &[ReliabilityState; TRANSPORTS],
) -> Scoring {
    score_candidates_among(level, op, bytes, weights, perf, reliability, TransportSet::ALL)
}

/// Scores the transports of `allowed` for a peer at `level`, for `op` on `bytes`-byte messages;
/// the rest are excluded as [`Exclusion::NotUsable`].
pub fn score_candidates_among(
    level: DistanceLevel,
    op: Op,
    bytes: u64,
    weights: &EffectiveWeights,
    perf: &PerfTable,
    reliability: &[ReliabilityState; TRANSPORTS],
    allowed: TransportSet,
) -> Scoring {
    let mut candidates = Transport::ALL.map(|transport| Candidate {
        transport,
        latency_us: 0.0,
        bandwidth_gbs: 0.0,
        calibrated: false,
        factors: Factors::default(),
        score: 0.0,
        excluded: None,
    });
    for c in &mut candidates {
        let t = c.transport;
        let missing = op.required().minus(t.caps());
        c.excluded = if !allowed.contains(t) {
            // First: the caller's limit is the most basic reason, and no numbers are looked up
            // for a transport it cannot use.
            Some(Exclusion::NotUsable)
        } else if missing != Caps::NONE {
            Some(Exclusion::MissingCapability { missing })
        } else if !t.reaches(level) {
            Some(Exclusion::Unreachable { max: t.max_level() })
        } else if let Some(p) = perf.lookup(t, level, bytes) {
            c.latency_us = p.latency_us;
            c.bandwidth_gbs = p.bandwidth_gbs;
            c.calibrated = matches!(p.source, PerfSource::Calibrated(_));
            let r = reliability[t.index()];
            r.skipped.then_some(Exclusion::RecentlyFailed { count: r.count })
        } else {
            Some(Exclusion::NoPerfData)
        };
    }
    let usable = |c: &Candidate| c.excluded.is_none();
    let all_failed = !candidates.iter().any(usable) && candidates.iter().any(|c| matches!(c.excluded, Some(Exclusion::RecentlyFailed { .. })));
    if all_failed {
        for c in &mut candidates {
            if matches!(c.excluded, Some(Exclusion::RecentlyFailed { .. })) {
                c.excluded = None;
            }
        }
    }
    // After the all-failed rule: when everything failed recently and was let back in, measured
    // numbers still beat guesses. When only the measured transports are out (failed, or not
    // capable), no measured candidate is usable, so an unmeasured one serves the pair: failover
    // on default numbers beats no route at all.
    if candidates.iter().any(|c| usable(c) && c.calibrated) {
        for c in candidates.iter_mut().filter(|c| c.excluded.is_none() && !c.calibrated) {
            c.excluded = Some(Exclusion::NotMeasured);
        }
    }

    // Raw "higher is better" values for the normalisation.
    let raw = |c: &Candidate| {
        let t = c.transport;
        let host_driven = t.caps().contains(Caps::HOST_COPY);
        [
            1.0 / c.latency_us.max(f64::MIN_POSITIVE),
            c.bandwidth_gbs,
            t.affinity(level),
            if host_driven { 0.5 } else { 1.0 },
            reliability[t.index()].factor,
        ]
    };
    let mut max = [0.0f64; 5];
    for c in candidates.iter().filter(|c| usable(c)) {
        for (m, v) in max.iter_mut().zip(raw(c)) {
            *m = m.max(v);
        }
    }
    let w = [weights.latency, weights.bandwidth, weights.topology, weights.capability, weights.reliability];
    let wsum = weights.sum().max(f64::MIN_POSITIVE);
    let mut best: Option<(Transport, f64)> = None;
    for c in candidates.iter_mut().filter(|c| c.excluded.is_none()) {
        let r = raw(c);
        let f: [f64; 5] = std::array::from_fn(|k| if max[k] > 0.0 { r[k] / max[k] } else { 0.0 });
        c.factors = Factors { latency: f[0], bandwidth: f[1], topology: f[2], capability: f[3], reliability: f[4] };
        c.score = f.iter().zip(w).map(|(f, w)| f * w).sum::<f64>() / wsum;
        if best.is_none_or(|(_, s)| c.score > s) {
            best = Some((c.transport, c.score));
        }
    }
    Scoring { candidates, best: best.map(|(t, _)| t), all_failed }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::Weights;

    fn run(level: DistanceLevel, op: Op, bytes: u64) -> Scoring {
        let w = Weights::default().at(bytes);
        score_candidates(level, op, bytes, &w, &PerfTable::defaults(), &[ReliabilityState::default(); TRANSPORTS])
    }

    #[test]
    fn small_prefers_latency_large_prefers_bandwidth() {
        assert_eq!(run(DistanceLevel::NvLink, Op::Put, 1024).best, Some(Transport::NvlinkStore));
        // Over PCIe the bulk copies' bandwidth wins for large messages.
        assert_eq!(run(DistanceLevel::Pcie, Op::Put, 1024).best, Some(Transport::NvlinkStore));
        let large = run(DistanceLevel::Pcie, Op::Put, 1 << 20);
        assert!(large.candidate(Transport::NvlinkTma).score > large.candidate(Transport::NvlinkStore).score, "{large:?}");
        // Over NVLink the stores of low-latency words keep up with them (GPU run 16: a 75 KB
        // coordinate halo in 6.0 µs per step by words, 8.6 µs by bulk copies).
        assert_eq!(run(DistanceLevel::NvLink, Op::Put, 75_000).best, Some(Transport::NvlinkStore));
        assert_eq!(run(DistanceLevel::Rack, Op::Put, 1024).best, Some(Transport::NvshmemPut));
    }

    #[test]
    fn scores_are_normalised_and_exclusions_score_zero() {
        let s = run(DistanceLevel::Pcie, Op::Amo, 8);
        for c in &s.candidates {
            assert!((0.0..=1.0).contains(&c.score), "{c:?}");
            if c.excluded.is_some() {
                assert_eq!(c.score, 0.0);
            }
        }
        assert!(matches!(s.candidate(Transport::NvlinkTma).excluded, Some(Exclusion::MissingCapability { .. })));
        assert!(s.exclusion_reasons().contains("nvlink-tma: lacks atomics"));
    }

    #[test]
    fn all_failed_lets_them_back_in() {
        let w = Weights::default().at(8);
        let mut rel = [ReliabilityState::default(); TRANSPORTS];
        rel[Transport::NvshmemPut.index()] = ReliabilityState { factor: 0.3, count: 2.0, skipped: true };
        let s = score_candidates(DistanceLevel::Rack, Op::Amo, 8, &w, &PerfTable::defaults(), &rel);
        assert!(s.all_failed);
        assert_eq!(s.best, Some(Transport::NvshmemPut));
    }
}
