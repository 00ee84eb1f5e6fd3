//! The collective reset of the exchange protocol: every exchange runs it when it is
//! built, and [`super::Exchange::reset_protocol`] runs it after a failure, so a new phase can
//! never start from values an earlier one left behind.
//!
//! Why it matters: signals are compared with `>=` and step counters start at 1, so a slot that
//! still holds a value from an earlier exchange on the same (reused) symmetric memory, or a write
//! of an earlier exchange that lands late, would satisfy a wait of the new one *silently*. The
//! reset therefore
//!
//! 1. waits (bounded) until this rank's exchange stream is idle: none of its launches can still
//!    write into a peer;
//! 2. barriers: every rank got there (NVSHMEM's barrier also completes every outstanding put), so
//!    nothing more lands in any slot;
//! 3. zeroes this rank's own signal and credit slots, step counters, block counters and wait
//!    status on its exchange stream (each slot has one writer, and every writer is now idle);
//! 4. waits until the zeroing is done (the driver's memsets may return before they ran);
//! 5. barriers again: no rank launches before every rank's slots are zero.
//!
//! For ranks in one process the barriers are trivial (one thread drives every rank) and each step
//! is applied to every rank before the next step. The order is the [`SEQUENCE`] constant, which the
//! model test below checks against a device that runs queued work as late as it may.

use crate::error::Result;

/// One step of the collective reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetStep {
    /// This rank's exchange stream is idle (a bounded host wait).
    WaitIdle,
    /// Every rank reached this point (and NVSHMEM completed every outstanding put).
    Barrier,
    /// This rank's slots, counters and status are zeroed on its exchange stream.
    Zero,
}

/// The reset, in order (see the module docs).
pub const SEQUENCE: [ResetStep; 5] = [ResetStep::WaitIdle, ResetStep::Barrier, ResetStep::Zero, ResetStep::WaitIdle, ResetStep::Barrier];

/// Runs [`SEQUENCE`] with `step` (for several ranks in one process, `step` applies a step to
/// every rank before returning).
pub fn run(mut step: impl FnMut(ResetStep) -> Result<()>) -> Result<()> {
    SEQUENCE.into_iter().try_for_each(&mut step)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work a rank's GPU still has queued: a write into a peer's slot, or zeroing its own.
    #[derive(Clone, Copy, Debug)]
    enum DeviceOp {
        Write { to: usize, value: u64 },
        Zero,
    }

    /// Ranks with one signal slot each and a queue of device work that runs as late as it may:
    /// only when its rank waits for it, or after the reset (an adversarial GPU).
    struct Model {
        slots: Vec<u64>,
        queues: Vec<Vec<DeviceOp>>,
    }

    impl Model {
        /// Every rank still has a launch of the previous phase queued that writes step `1000 + r`
        /// into its neighbour's slot, and every slot holds a stale value.
        fn after_a_phase(n: usize) -> Self {
            Model { slots: vec![500; n], queues: (0..n).map(|r| vec![DeviceOp::Write { to: (r + 1) % n, value: 1000 + r as u64 }]).collect() }
        }

        fn drain(&mut self, rank: usize) {
            for op in std::mem::take(&mut self.queues[rank]) {
                match op {
                    DeviceOp::Write { to, value } => self.slots[to] = value,
                    DeviceOp::Zero => self.slots[rank] = 0,
                }
            }
        }

        /// Runs `sequence` in lockstep over the ranks (ranks in `order` within each step).
        fn reset(&mut self, sequence: &[ResetStep], order: &[usize]) {
            for &step in sequence {
                for &r in order {
                    match step {
                        ResetStep::WaitIdle => self.drain(r),
                        ResetStep::Zero => self.queues[r].push(DeviceOp::Zero),
                        ResetStep::Barrier => {} // a host barrier: it does not run queued GPU work
                    }
                }
            }
        }

        /// What is wrong once every rank returned from the reset: work that can still land, or a
        /// slot that a wait for step 1 would wrongly accept.
        fn problems(&self) -> Vec<String> {
            let mut out = Vec::new();
            for (r, q) in self.queues.iter().enumerate() {
                if !q.is_empty() {
                    out.push(format!("rank {r} still has {q:?} queued"));
                }
            }
            for (r, &v) in self.slots.iter().enumerate() {
                if v != 0 {
                    out.push(format!("rank {r}'s slot holds {v}"));
                }
            }
            out
        }
    }

    fn problems_of(sequence: &[ResetStep]) -> Vec<String> {
        let mut all = Vec::new();
        for n in 2..=5 {
            let forward: Vec<usize> = (0..n).collect();
            let backward: Vec<usize> = (0..n).rev().collect();
            for order in [forward, backward] {
                let mut m = Model::after_a_phase(n);
                m.reset(sequence, &order);
                all.extend(m.problems().into_iter().map(|p| format!("{n} ranks, order {order:?}: {p}")));
            }
        }
        all
    }

    #[test]
    fn the_reset_leaves_nothing_stale_and_nothing_in_flight() {
        assert_eq!(problems_of(&SEQUENCE), Vec::<String>::new());
        let mut steps = Vec::new();
        run(|s| {
            steps.push(s);
            Ok(())
        })
        .unwrap();
        assert_eq!(steps, SEQUENCE);
    }

    #[test]
    fn the_construction_before_the_fix_let_stale_values_through() {
        // Before: `RankExchange::new` zeroed its signals with an asynchronous memset and the
        // exchange ended with a barrier; nothing waited for the previous phase or the memset.
        let before = [ResetStep::Zero, ResetStep::Barrier];
        assert!(!problems_of(&before).is_empty());
        // Waiting for the zeroing is not enough either: a peer's late write of the previous phase
        // lands after this rank zeroed its slot.
        let no_first_fence = [ResetStep::Zero, ResetStep::WaitIdle, ResetStep::Barrier];
        assert!(problems_of(&no_first_fence).iter().any(|p| p.contains("slot holds")), "{:?}", problems_of(&no_first_fence));
    }
}
