//! Bounded host waits: instead of an unbounded `cuStreamSynchronize`, the host polls
//! (`cuStreamQuery`) until the work is done, and gives up when the work has made **no progress**
//! for a whole budget.
//!
//! Progress, not elapsed time, decides: a queue of thousands of healthy steps may take long (ranks
//! that share a GPU are time-sliced), but each of them ends within the device wait deadline, so a
//! wait only expires when nothing moved for longer than any healthy kernel can take (a kernel
//! stuck where no halo deadline reaches it: inside NVSHMEM when its proxy thread died). Progress
//! is sampled by the caller's cheap probe (the exchange reads its step counters on a side stream).
//!
//! The fast path costs one query: work that is already done returns at once. Then the loop spins
//! for 1 ms, yields until 20 ms, and sleeps with a growing pause (100 µs to 2 ms) after that.

use crate::error::{CudaContextExt, Result};
use crate::gpu::CudaStream;
use crate::watchdog::Guard;
use cudarc::driver::sys;
use std::time::{Duration, Instant};

/// How a bounded wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The work completed after this long.
    Done(Duration),
    /// Nothing moved for `since_progress` (at least the budget), `waited` in all.
    Expired {
        /// Time since the wait began.
        waited: Duration,
        /// Time since the probe last saw progress (or since the wait began).
        since_progress: Duration,
    },
}

/// Polls `done` until it says the work is complete, or until `progress` (sampled at most every
/// quarter budget, and at most every 250 ms) has shown no change for `budget`. `progress` returns
/// `None` while it knows nothing new. `guard`, when given, is a watchdog backstop moved forward
/// whenever progress is seen (for a driver call that blocks inside `done`).
pub fn poll_until_done(
    mut done: impl FnMut() -> Result<bool>,
    mut progress: impl FnMut() -> Option<u64>,
    budget: Duration,
    guard: Option<(&Guard, Duration)>,
) -> Result<WaitOutcome> {
    let start = Instant::now();
    if done()? {
        return Ok(WaitOutcome::Done(start.elapsed()));
    }
    let sample_every = (budget / 4).clamp(Duration::from_millis(1), Duration::from_millis(250));
    let mut next_sample = start + sample_every;
    let mut last_change = start;
    let mut last_seen: Option<u64> = None;
    let mut pause = Duration::from_micros(100);
    loop {
        let now = Instant::now();
        if now >= next_sample {
            if let Some(p) = progress() {
                if last_seen.is_some_and(|seen| seen != p) {
                    last_change = now;
                    if let Some((g, backstop)) = guard {
                        g.extend(backstop);
                    }
                }
                last_seen = Some(p);
            }
            next_sample = now + sample_every;
        }
        if now.duration_since(last_change) >= budget {
            return Ok(WaitOutcome::Expired { waited: now - start, since_progress: now - last_change });
        }
        let elapsed = now - start;
        if elapsed < Duration::from_millis(1) {
            std::hint::spin_loop();
        } else if elapsed < Duration::from_millis(20) {
            std::thread::yield_now();
        } else {
            let left = (last_change + budget).saturating_duration_since(now);
            std::thread::sleep(pause.min(left).min(next_sample.saturating_duration_since(now).max(Duration::from_micros(50))));
            pause = (pause * 2).min(Duration::from_millis(2));
        }
        if done()? {
            return Ok(WaitOutcome::Done(start.elapsed()));
        }
    }
}

/// Whether all work queued on `stream` is complete (`cuStreamQuery`), without waiting.
pub fn stream_idle(stream: &CudaStream) -> Result<bool> {
    // SAFETY: a query on a live stream handle.
    match unsafe { sys::cuStreamQuery(stream.cu_stream()) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        e => Err::<bool, _>(cudarc::driver::DriverError(e)).during("querying a stream"),
    }
}

/// Whether the legacy default stream (where the driver's synchronous-looking memsets and copies
/// run) has no work left, without waiting.
pub fn legacy_stream_idle() -> Result<bool> {
    // SAFETY: the null stream handle names the current context's legacy default stream.
    match unsafe { sys::cuStreamQuery(std::ptr::null_mut()) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        e => Err::<bool, _>(cudarc::driver::DriverError(e)).during("querying the default stream"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn finished_work_returns_at_once_and_pending_work_when_done() {
        // At once: one query, no progress sample, no pause.
        let (queries, samples) = (Cell::new(0), Cell::new(0));
        let out = poll_until_done(
            || {
                queries.set(queries.get() + 1);
                Ok(true)
            },
            || {
                samples.set(samples.get() + 1);
                None
            },
            Duration::from_secs(10),
            None,
        )
        .unwrap();
        assert!(matches!(out, WaitOutcome::Done(_)), "{out:?}");
        assert_eq!((queries.get(), samples.get()), (1, 0));
        let calls = Cell::new(0);
        let out = poll_until_done(
            || {
                calls.set(calls.get() + 1);
                Ok(calls.get() > 100)
            },
            || None,
            Duration::from_secs(10),
            None,
        )
        .unwrap();
        assert!(matches!(out, WaitOutcome::Done(_)), "{out:?}");
        assert_eq!(calls.get(), 101);
    }

    #[test]
    fn work_without_progress_expires_after_the_budget() {
        // Progress is sampled every quarter budget (20 ms): the wait ends at its first look after
        // the budget, so it takes at most 4 samples whatever the machine's load (a late sample
        // only means fewer). A wait that outlived its budget (ran on to a second one, say) would
        // take more; a wall-clock bound would measure the load instead.
        let budget = Duration::from_millis(80);
        let samples = Cell::new(0);
        let probe = || {
            samples.set(samples.get() + 1);
            Some(7)
        };
        let out = poll_until_done(|| Ok(false), probe, budget, None).unwrap();
        let WaitOutcome::Expired { waited, since_progress } = out else { panic!("{out:?}") };
        assert!(waited >= budget && since_progress >= budget, "{out:?}");
        assert!((1..=4).contains(&samples.get()), "{} progress samples for a budget of 4 sample periods: {out:?}", samples.get());
    }

    #[test]
    fn progress_moves_the_deadline() {
        // The work advances at each of the first 10 samples (one every 25 ms, a quarter budget),
        // then stops: the wait must outlive the progress (its 10th sample comes 250 ms or more
        // after the start, and a budget after that) and then end within the 4 samples of one
        // budget, not 100 ms after the start (4 samples in all) nor never.
        let budget = Duration::from_millis(100);
        let samples = Cell::new(0u64);
        let probe = || {
            samples.set(samples.get() + 1);
            Some(samples.get().min(10))
        };
        let out = poll_until_done(|| Ok(false), probe, budget, None).unwrap();
        let WaitOutcome::Expired { waited, since_progress } = out else { panic!("{out:?}") };
        assert!(waited >= Duration::from_millis(350), "expired before the progress stopped: {out:?}");
        assert!(since_progress >= budget, "{out:?}");
        assert!((11..=14).contains(&samples.get()), "{} samples: 10 with progress, then at most 4: {out:?}", samples.get());
    }

    #[test]
    fn query_errors_end_the_wait() {
        let err = poll_until_done(|| Err(crate::HaloError::InvalidInput("broken".into())), || None, Duration::from_secs(1), None);
        assert!(err.is_err());
    }
}
