//! Failures and timeouts per (peer, transport), decaying exponentially with a half-life.
//!
//! Each event adds a weight (failure 1, timeout 0.5) to a per-(peer, transport) count that halves
//! every `half_life`. The reliability factor is `1 / (1 + count)`; a count at or above the skip
//! threshold takes the transport out of the candidates for that peer until it decays, so the next
//! best transport serves the peer meanwhile (failover) and the first one comes back on its own.

use super::Transport;
use super::transport::TRANSPORTS;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A source of monotonic time (injectable so that tests can step it).
pub trait Clock: Send + Sync {
    /// Time since an arbitrary fixed origin.
    fn now(&self) -> Duration;
}

/// The real monotonic clock.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self { origin: Instant::now() }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock that moves only when told; clones share the same time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward.
    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(by.as_nanos().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }
}

/// What happened to an attempt on a transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// It worked: nothing is recorded (successes do not erase failures; time does).
    Success,
    /// It failed (a launch failed, an error returned, a connection lost).
    Failure,
    /// It did not complete in time (a device wait timed out); counts half a failure, since a slow
    /// peer is not a broken path.
    Timeout,
}

impl Outcome {
    /// The weight this outcome adds to the failure count.
    pub fn weight(self) -> f64 {
        match self {
            Outcome::Success => 0.0,
            Outcome::Failure => 1.0,
            Outcome::Timeout => 0.5,
        }
    }
}

/// How failure counts decay and when a transport is held out (from [`super::RouteConfig`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decay {
    /// A count halves every `half_life`.
    pub half_life: Duration,
    /// A failure that brings the count to this or above holds the transport out.
    pub skip_threshold: f64,
}

impl Decay {
    /// How long a decision made now stays representative, and the shortest hold: a quarter of
    /// the half-life.
    pub fn recheck_after(&self) -> Duration {
        self.half_life / 4
    }

    /// `value` decayed over `elapsed`.
    pub fn decayed(&self, value: f64, elapsed: Duration) -> f64 {
        if value == 0.0 {
            return 0.0;
        }
        value * 0.5f64.powf(elapsed.as_secs_f64() / self.half_life.as_secs_f64())
    }

    /// How long `value` takes to decay to the skip threshold (zero when it is already below).
    fn time_to_threshold(&self, value: f64) -> Duration {
        if value <= self.skip_threshold {
            return Duration::ZERO;
        }
        // Both inputs are validated (half-life up to a year, threshold from 0.001), so this is
        // finite and small enough for a Duration; the min is a second guard.
        let secs = self.half_life.as_secs_f64() * (value / self.skip_threshold).log2();
        Duration::from_secs_f64(secs.clamp(0.0, 1e12))
    }
}

/// One (peer, transport): the failure count when last changed, and until when it is held out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Count {
    /// The count at `at`.
    pub value: f64,
    /// When it was last changed.
    pub at: Duration,
    /// The transport is held out (skipped) while the time is before this.
    pub hold_until: Duration,
}

impl Count {
    /// Adds an outcome's weight at `now`. When that brings the count to the skip threshold or
    /// above, the transport is held out until the later of its recheck (a quarter half-life from
    /// now) and the time the count takes to decay below the threshold again.
    ///
    /// The hold is what makes one failure count on a clock that moves: a count of exactly the
    /// threshold decays below it within a nanosecond, so comparing the decayed count with the
    /// threshold at look-up time would let the failed transport straight back.
    pub fn add(&mut self, weight: f64, now: Duration, decay: &Decay) {
        if weight <= 0.0 {
            return;
        }
        let value = self.value_at(now, decay) + weight;
        let mut hold_until = self.hold_until;
        if value >= decay.skip_threshold {
            let hold = decay.recheck_after().max(decay.time_to_threshold(value));
            hold_until = hold_until.max(now.saturating_add(hold));
        }
        *self = Count { value, at: now.max(self.at), hold_until };
    }

    /// The decayed count at `now`.
    pub fn value_at(&self, now: Duration, decay: &Decay) -> f64 {
        decay.decayed(self.value, now.saturating_sub(self.at))
    }

    /// Whether the transport is held out at `now`.
    pub fn held(&self, now: Duration) -> bool {
        now < self.hold_until
    }

    /// What the scoring pass needs at `now`.
    pub fn state(&self, now: Duration, decay: &Decay) -> super::ReliabilityState {
        let count = self.value_at(now, decay);
        super::ReliabilityState { factor: 1.0 / (1.0 + count), count, skipped: self.held(now) }
    }
}

/// Decayed failure counts for the (peer, transport) pairs of one PE that have failed; peers
/// that never failed take no memory.
#[derive(Clone, Debug)]
pub struct Reliability {
    decay: Decay,
    n_peers: usize,
    counts: HashMap<usize, [Count; TRANSPORTS]>,
}

impl Reliability {
    /// Counts for `n_peers` peers, all clean.
    pub fn new(n_peers: usize, half_life: Duration, skip_threshold: f64) -> Self {
        Self { decay: Decay { half_life, skip_threshold }, n_peers, counts: HashMap::new() }
    }

    /// The decay parameters.
    pub fn decay(&self) -> &Decay {
        &self.decay
    }

    /// Resizes for a topology with `n_peers` PEs, keeping the counts of the PEs that remain.
    pub fn resize(&mut self, n_peers: usize) {
        self.n_peers = n_peers;
        self.counts.retain(|&p, _| p < n_peers);
    }

    /// Records an outcome at time `now` (peers outside the topology are ignored).
    pub fn record(&mut self, peer: usize, transport: Transport, outcome: Outcome, now: Duration) {
        if peer >= self.n_peers || outcome.weight() <= 0.0 {
            return;
        }
        let slot = &mut self.counts.entry(peer).or_default()[transport.index()];
        slot.add(outcome.weight(), now, &self.decay);
    }

    fn slot(&self, peer: usize, transport: Transport) -> Count {
        self.counts.get(&peer).map(|c| c[transport.index()]).unwrap_or_default()
    }

    /// The decayed failure count at `now`.
    pub fn count(&self, peer: usize, transport: Transport, now: Duration) -> f64 {
        self.slot(peer, transport).value_at(now, &self.decay)
    }

    /// The reliability factor before normalisation, `1 / (1 + count)`.
    pub fn factor(&self, peer: usize, transport: Transport, now: Duration) -> f64 {
        1.0 / (1.0 + self.count(peer, transport, now))
    }

    /// Whether the transport is held out for this peer now (a failure brought its count to the
    /// skip threshold, and its recheck time has not come).
    pub fn skipped(&self, peer: usize, transport: Transport, now: Duration) -> bool {
        self.slot(peer, transport).held(now)
    }

    /// What the scoring pass needs for one transport towards `peer` at `now`.
    pub fn state(&self, peer: usize, transport: Transport, now: Duration) -> super::ReliabilityState {
        self.slot(peer, transport).state(now, &self.decay)
    }

    /// Whether any transport towards this peer has a count worth recomputing for as it decays.
    pub fn has_history(&self, peer: usize, now: Duration) -> bool {
        Transport::ALL.into_iter().any(|t| self.count(peer, t, now) > 1e-3)
    }

    /// The earliest time after `now` at which a hold towards `peer` ends, if any is running: a
    /// cached decision must be rechecked then, so that the transport returns on time.
    pub fn next_release(&self, peer: usize, now: Duration) -> Option<Duration> {
        self.counts.get(&peer)?.iter().map(|c| c.hold_until).filter(|&t| t > now).min()
    }

    /// How long a decision made now stays representative: a quarter of the half-life, so that a
    /// skipped transport returns within about that long after its count crosses the threshold.
    pub fn recheck_after(&self) -> Duration {
        self.decay.recheck_after()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decays_by_half_life() {
        let clock = ManualClock::new();
        let mut r = Reliability::new(2, Duration::from_secs(10), 1.0);
        r.record(1, Transport::NvlinkStore, Outcome::Failure, clock.now());
        assert!(r.skipped(1, Transport::NvlinkStore, clock.now()));
        assert!(!r.skipped(0, Transport::NvlinkStore, clock.now()), "other peers are unaffected");
        // Held until the recheck, a quarter half-life later, although the count decays at once.
        clock.advance(Duration::from_nanos(1));
        assert!(r.count(1, Transport::NvlinkStore, clock.now()) < 1.0);
        assert!(r.skipped(1, Transport::NvlinkStore, clock.now()));
        assert_eq!(r.next_release(1, clock.now()), Some(Duration::from_millis(2500)));
        clock.advance(Duration::from_millis(2500));
        assert!(!r.skipped(1, Transport::NvlinkStore, clock.now()));
        clock.advance(Duration::from_millis(7500) - Duration::from_nanos(1));
        assert!((r.count(1, Transport::NvlinkStore, clock.now()) - 0.5).abs() < 1e-9);
        assert!(!r.skipped(1, Transport::NvlinkStore, clock.now()));
        assert!((r.factor(1, Transport::NvlinkStore, clock.now()) - 1.0 / 1.5).abs() < 1e-9);
        r.record(1, Transport::NvlinkStore, Outcome::Timeout, clock.now());
        assert!(r.skipped(1, Transport::NvlinkStore, clock.now()), "0.5 + 0.5 reaches the threshold");
        r.record(1, Transport::NvlinkStore, Outcome::Success, clock.now());
        assert!(r.skipped(1, Transport::NvlinkStore, clock.now()), "success does not erase failures");
        r.record(7, Transport::Nccl, Outcome::Failure, clock.now());
        assert_eq!(r.count(7, Transport::Nccl, clock.now()), 0.0, "outside the topology: ignored");
    }

    #[test]
    fn hold_lasts_until_the_count_is_below_the_threshold() {
        let decay = Decay { half_life: Duration::from_secs(10), skip_threshold: 1.0 };
        let mut c = Count::default();
        let t0 = Duration::from_secs(100);
        for _ in 0..4 {
            c.add(1.0, t0, &decay);
        }
        // 4 failures: 2 half-lives to decay to 1, longer than the 2.5 s recheck.
        assert_eq!(c.hold_until, t0 + Duration::from_secs(20));
        assert!(c.held(t0 + Duration::from_secs(19)) && !c.held(t0 + Duration::from_secs(20)));
        // A timeout below the threshold holds nothing.
        let mut t = Count::default();
        t.add(0.5, t0, &decay);
        assert!(!t.held(t0));
    }
}
