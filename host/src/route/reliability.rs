//! Failures and timeouts per (peer, transport), decaying exponentially with a half-life.
//!
//! Each event adds a weight (failure 1, timeout 0.5) to a per-(peer, transport) count that halves
//! every `half_life`. The reliability factor is `1 / (1 + count)`; a count at or above the skip
//! threshold takes the transport out of the candidates for that peer until it decays, so the next
//! best transport serves the peer meanwhile (failover) and the first one comes back on its own.

use super::Transport;
use super::transport::TRANSPORTS;
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
        Self {
            origin: Instant::now(),
        }
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
        self.nanos.fetch_add(
            by.as_nanos().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }
}

/// What happened to an attempt on a transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It worked: nothing is recorded (successes do not erase failures; time does).
    Success,
    /// It failed (error returned, connection lost).
    Failure,
    /// It did not complete in time; counts half a failure, since a slow peer is not a broken path.
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

#[derive(Clone, Copy, Debug, Default)]
struct Count {
    value: f64,
    at: Duration,
}

/// Decayed failure counts for every (peer, transport) of one PE.
#[derive(Clone, Debug)]
pub struct Reliability {
    half_life: Duration,
    skip_threshold: f64,
    counts: Vec<[Count; TRANSPORTS]>,
}

impl Reliability {
    /// Counts for `n_peers` peers, all clean.
    pub fn new(n_peers: usize, half_life: Duration, skip_threshold: f64) -> Self {
        Self {
            half_life,
            skip_threshold,
            counts: vec![[Count::default(); TRANSPORTS]; n_peers],
        }
    }

    /// Resizes for a topology with `n_peers` PEs, keeping the counts of the PEs that remain.
    pub fn resize(&mut self, n_peers: usize) {
        self.counts.resize(n_peers, [Count::default(); TRANSPORTS]);
    }

    /// Records an outcome at time `now`.
    pub fn record(&mut self, peer: usize, transport: Transport, outcome: Outcome, now: Duration) {
        let Some(slot) = self.counts.get_mut(peer).map(|c| &mut c[transport.index()]) else {
            return;
        };
        if outcome.weight() > 0.0 {
            let decayed = decay(slot.value, now.saturating_sub(slot.at), self.half_life);
            *slot = Count {
                value: decayed + outcome.weight(),
                at: now,
            };
        }
    }

    /// The decayed failure count at `now`.
    pub fn count(&self, peer: usize, transport: Transport, now: Duration) -> f64 {
        self.counts
            .get(peer)
            .map(|c| c[transport.index()])
            .map_or(0.0, |c| {
                decay(c.value, now.saturating_sub(c.at), self.half_life)
            })
    }

    /// The reliability factor before normalisation, `1 / (1 + count)`.
    pub fn factor(&self, peer: usize, transport: Transport, now: Duration) -> f64 {
        1.0 / (1.0 + self.count(peer, transport, now))
    }

    /// Whether the transport is to be skipped for this peer now.
    pub fn skipped(&self, peer: usize, transport: Transport, now: Duration) -> bool {
        self.count(peer, transport, now) >= self.skip_threshold
    }

    /// Whether any transport towards this peer has a count worth recomputing for as it decays.
    pub fn has_history(&self, peer: usize, now: Duration) -> bool {
        Transport::ALL
            .into_iter()
            .any(|t| self.count(peer, t, now) > 1e-3)
    }

    /// How long a decision made now stays representative: a quarter of the half-life, so that a
    /// skipped transport returns within about that long after its count crosses the threshold.
    pub fn recheck_after(&self) -> Duration {
        self.half_life / 4
    }
}

fn decay(value: f64, elapsed: Duration, half_life: Duration) -> f64 {
    if value == 0.0 {
        return 0.0;
    }
    value * 0.5f64.powf(elapsed.as_secs_f64() / half_life.as_secs_f64())
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
        assert!(
            !r.skipped(0, Transport::NvlinkStore, clock.now()),
            "other peers are unaffected"
        );
        clock.advance(Duration::from_secs(10));
        assert!((r.count(1, Transport::NvlinkStore, clock.now()) - 0.5).abs() < 1e-9);
        assert!(!r.skipped(1, Transport::NvlinkStore, clock.now()));
        assert!((r.factor(1, Transport::NvlinkStore, clock.now()) - 1.0 / 1.5).abs() < 1e-9);
        r.record(1, Transport::NvlinkStore, Outcome::Timeout, clock.now());
        assert!(
            r.skipped(1, Transport::NvlinkStore, clock.now()),
            "0.5 + 0.5 reaches the threshold"
        );
        r.record(1, Transport::NvlinkStore, Outcome::Success, clock.now());
        assert!(
            r.skipped(1, Transport::NvlinkStore, clock.now()),
            "success does not erase failures"
        );
        r.record(7, Transport::Nccl, Outcome::Failure, clock.now());
    }
}
