//! Host worker threads that outlive one phase: a search step's phases (halo plan, local atoms,
//! cluster grids, pair lists, ranks) hand their parts to one pool started once per run, so its
//! threads stay warm between phases and searches instead of being spawned for each phase.
//!
//! One worker means no pool at all: every part runs on the calling thread and no thread is
//! started. Results never depend on the number of workers: [`Workers::map`] returns results in
//! the order of the parts, whichever thread computed them.
//!
//! The caller works too. A search hands the pool a few parts at a time (one per rank, a handful of
//! chunks), about ten times per search, each part tens of microseconds; a pool whose caller only
//! waits (as with `rayon`'s `install`) pays two thread wake-ups per call, the
//! helper's and then the caller's, which can cost more than the parts. Here the caller takes
//! parts from the same counter as the helpers it hands the call to, so a helper that wakes late
//! finds the parts taken, and the caller never waits for one that took none (it closes the call:
//! `Ticket`). A helper stays awake a little after each call (300 us), so that only the
//! first call of a search wakes it. On the 2-core build machine a call of two 5 us parts cost
//! 57–90 us more than its parts after 7 ms idle and 34–35 us within a burst of calls 60 us apart
//! with `rayon` (two runs), and 7 and 5 us this way (`workers_handoff` below prints this
//! machine's figures).
//!
//! The tests below ran clean under Miri (nightly, two schedules each, `workers_handoff` skipped),
//! which reports a data race on the results if the caller returns without waiting for the helpers
//! inside its call. CI does not run Miri.

use crate::error::{HaloError, Result};
use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long a caller whose parts are done spins while helpers finish theirs, before it sleeps:
/// about a thread wake-up, so that a helper finishing a short part costs the caller none.
const CALLER_SPIN: Duration = Duration::from_micros(20);

/// How long a helper stays awake after a call (yielding the core to any other thread): longer
/// than the host work between two calls of a search, so that only a search's first call wakes
/// the helpers.
const HELPER_AWAKE: Duration = Duration::from_micros(300);

/// A pool of host worker threads, or none (see the module docs).
#[derive(Debug, Default)]
pub struct Workers {
    /// The helper threads (the caller is the other worker); empty for one worker.
    helpers: Vec<Helper>,
}

impl Workers {
    /// The calling thread only: no thread is started.
    pub fn serial() -> Self {
        Self { helpers: Vec::new() }
    }

    /// `threads` workers, the caller and `threads - 1` helper threads started now and kept until
    /// dropped (0 or 1: [`Self::serial`]).
    pub fn new(threads: usize) -> Result<Self> {
        let mut helpers = Vec::with_capacity(threads.saturating_sub(1));
        for i in 1..threads {
            // A failed start drops the helpers started so far, which stops them.
            helpers.push(
                Helper::start(i).map_err(|e| HaloError::InvalidInput(format!("cannot start {threads} host worker threads ({e}): ask for fewer")))?,
            );
        }
        Ok(Self { helpers })
    }

    /// Number of workers: the caller and its helpers (1 without a pool).
    pub fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Every part through `f`, results in the order of `parts`. With helpers and more than one
    /// part, the caller hands the call to up to one idle helper per further part and all of them
    /// take parts in turn until none is left; else every part runs on the calling thread. A call
    /// from inside one of the parts (nested parallelism) recruits the helpers idle then, and its
    /// caller works through its parts whether any helper is free or not. A part that panics makes
    /// the call panic (with its payload) once every part begun has ended.
    pub fn map<T: Send, R: Send>(&self, parts: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
        let n = parts.len();
        if self.helpers.is_empty() || n <= 1 {
            return parts.into_iter().map(f).collect();
        }
        let slots: Vec<Mutex<Option<T>>> = parts.into_iter().map(|p| Mutex::new(Some(p))).collect();
        let results: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        let work = || {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(slot) = slots.get(i) else { break };
                // Each index is taken once, so the slot still holds its part.
                if let Some(part) = lock(slot).take() {
                    let r = f(part);
                    *lock(&results[i]) = Some(r);
                }
            }
        };
        let work: &(dyn Fn() + Sync) = &work;
        // Only the pointer's lifetime bound changes: see `Ticket::work` for when it is called.
        // SAFETY: a transmute between two raw pointers of the same layout; nothing is dereferenced.
        let shared = unsafe { std::mem::transmute::<*const (dyn Fn() + Sync + '_), *const (dyn Fn() + Sync + 'static)>(work) };
        let ticket = Arc::new(Ticket { state: AtomicUsize::new(0), work: shared, caller: std::thread::current(), panic: Mutex::new(None) });
        let mut wanted = n - 1;
        for h in &self.helpers {
            if wanted == 0 || next.load(Ordering::Relaxed) >= n {
                break;
            }
            if h.recruit(&ticket) {
                wanted -= 1;
            }
        }
        let own = catch_unwind(AssertUnwindSafe(work));
        ticket.close();
        if let Err(payload) = own {
            resume_unwind(payload);
        }
        if let Some(payload) = lock(&ticket.panic).take() {
            resume_unwind(payload);
        }
        results.into_iter().map(|r| r.into_inner().unwrap_or_else(|e| e.into_inner()).expect("every part ran once")).collect()
    }
}

/// A mutex's guard, whether or not a panicking part poisoned it (the data is a plain slot; a
/// panic is reported by [`Workers::map`] itself).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Set in [`Ticket::state`] once the caller's parts are done: helpers that come later leave
/// without touching the call.
const CLOSED: usize = 1 << (usize::BITS - 1);

/// One call of [`Workers::map`] as its helpers see it. It outlives the call (helpers hold it),
/// but `work` may be called only while the ticket is open.
struct Ticket {
    /// [`CLOSED`], and the number of helpers inside the call.
    state: AtomicUsize,
    /// Takes parts until none is left. It borrows the caller's frame, so it is called only by a
    /// helper that entered the ticket while it was open ([`Ticket::run`]); the caller closes it
    /// and returns (or unwinds) only once every helper that entered has left ([`Ticket::close`]).
    /// Once closed it may dangle, hence a raw pointer.
    work: *const (dyn Fn() + Sync),
    /// The calling thread, woken by the last helper to leave a closed call.
    caller: Thread,
    /// The payload of a helper's panic.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `work` is a `Sync` closure called only under the open ticket's rule (see `work`); the
// other fields are `Send` and `Sync` themselves.
unsafe impl Send for Ticket {}
// SAFETY: as for `Send`.
unsafe impl Sync for Ticket {}

impl Ticket {
    /// Runs on a helper: enters the call unless it is closed, takes parts, marks the helper
    /// `idle` again (before the caller may return, so that its next call finds the helper free)
    /// and leaves.
    fn run(&self, idle: &AtomicBool) {
        let entered = self.state.fetch_add(1, Ordering::AcqRel) & CLOSED == 0;
        if entered {
            // SAFETY: entered while open, so the caller's frame that `work` borrows lives until
            // this helper leaves below (see `work`).
            let work = unsafe { &*self.work };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(work)) {
                lock(&self.panic).get_or_insert(payload);
            }
        }
        idle.store(true, Ordering::Release);
        if self.state.fetch_sub(1, Ordering::AcqRel) == CLOSED | 1 {
            self.caller.unpark();
        }
    }

    /// Runs on the caller once its parts are done: closes the call and returns when no helper
    /// is inside it, spinning a little before it sleeps (woken by the last helper to leave; a
    /// stray wake-up only loops).
    fn close(&self) {
        if self.state.fetch_or(CLOSED, Ordering::AcqRel) & !CLOSED == 0 {
            return;
        }
        let start = Instant::now();
        while self.state.load(Ordering::Acquire) != CLOSED {
            if start.elapsed() < CALLER_SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::park_timeout(Duration::from_millis(1));
            }
        }
    }
}

/// A helper thread and what it shares with its pool.
#[derive(Debug)]
struct Helper {
    shared: Arc<Mailbox>,
    thread: Option<JoinHandle<()>>,
}

/// A helper's state as the callers see it.
#[derive(Default)]
struct Mailbox {
    /// Not running a call: free to be recruited.
    idle: AtomicBool,
    /// Asleep (or about to be): a recruiter must wake it.
    parked: AtomicBool,
    /// The call handed over, taken by the helper.
    job: Mutex<Option<Arc<Ticket>>>,
    /// The pool is being dropped.
    stop: AtomicBool,
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox").field("idle", &self.idle).field("parked", &self.parked).field("stop", &self.stop).finish_non_exhaustive()
    }
}

impl Helper {
    /// Starts helper `i` (named `halo-search-{i}`). After each call it stays awake for
    /// [`HELPER_AWAKE`], yielding, so that the next call of a burst finds it without a wake-up.
    fn start(i: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Mailbox { idle: AtomicBool::new(true), ..Default::default() });
        let mine = shared.clone();
        let thread = std::thread::Builder::new().name(format!("halo-search-{i}")).spawn(move || {
            let mut last = Instant::now();
            loop {
                let job = lock(&mine.job).take();
                if let Some(ticket) = job {
                    ticket.run(&mine.idle);
                    last = Instant::now();
                } else if mine.stop.load(Ordering::Acquire) {
                    return;
                } else if last.elapsed() < HELPER_AWAKE {
                    std::thread::yield_now();
                } else {
                    // Announced before the last look, so that a recruiter that handed a call
                    // over after that look sees the flag and wakes this thread.
                    mine.parked.store(true, Ordering::SeqCst);
                    if lock(&mine.job).is_none() && !mine.stop.load(Ordering::SeqCst) {
                        std::thread::park();
                    }
                    mine.parked.store(false, Ordering::SeqCst);
                    last = Instant::now();
                }
            }
        })?;
        Ok(Self { shared, thread: Some(thread) })
    }

    /// Hands `ticket` to this helper if it is idle, and wakes it if it sleeps.
    fn recruit(&self, ticket: &Arc<Ticket>) -> bool {
        if self.shared.idle.compare_exchange(true, false, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return false;
        }
        *lock(&self.shared.job) = Some(ticket.clone());
        if self.shared.parked.load(Ordering::SeqCst)
            && let Some(t) = &self.thread
        {
            t.thread().unpark();
        }
        true
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            // A helper never panics outside a call's parts, whose panics it catches.
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_keep_the_order_of_the_parts_on_any_count() {
        let want: Vec<u64> = (0..1000u64).map(|i| i * i).collect();
        for t in [0, 1, 2, 3, 8] {
            let w = Workers::new(t).unwrap();
            assert_eq!(w.threads(), t.max(1));
            assert_eq!(w.map((0..1000u64).collect(), |i| i * i), want, "{t} workers");
            // Nested: each part maps again on the same workers.
            let nested = w.map((0..10u64).collect(), |i| w.map((0..100u64).collect(), |j| (100 * i + j) * (100 * i + j)).into_iter().sum::<u64>());
            let flat: Vec<u64> = (0..10).map(|i| want[100 * i..100 * (i + 1)].iter().sum()).collect();
            assert_eq!(nested, flat);
        }
    }

    #[test]
    fn parts_run_on_the_caller_and_the_pools_own_threads_only() {
        let w = Workers::new(3).unwrap();
        let me = std::thread::current().id();
        for _ in 0..20 {
            // Parts long enough that the helpers join in.
            let ran = w.map((0..12).collect(), |_: i32| {
                std::thread::sleep(Duration::from_millis(2));
                let t = std::thread::current();
                (t.id(), t.name().map(str::to_owned))
            });
            assert!(ran.iter().all(|(id, name)| *id == me || name.as_deref().is_some_and(|n| n.starts_with("halo-search-"))), "{ran:?}");
        }
        // One worker runs on the caller.
        let one = Workers::serial();
        assert!(one.map((0..4).collect(), |_: i32| std::thread::current().id()).iter().all(|&id| id == me));
    }

    #[test]
    fn helpers_share_the_parts_with_the_caller() {
        // Four parts that each wait for all four to have begun: they end only if four threads
        // run them at once, the caller and three helpers (a caller that only waited, or helpers
        // that never woke, would time the barrier out).
        let w = Workers::new(4).unwrap();
        for _ in 0..5 {
            let begun = AtomicUsize::new(0);
            let met = w.map((0..4).collect(), |_: i32| {
                begun.fetch_add(1, Ordering::SeqCst);
                let t = Instant::now();
                while begun.load(Ordering::SeqCst) < 4 && t.elapsed() < Duration::from_secs(10) {
                    std::thread::yield_now();
                }
                begun.load(Ordering::SeqCst) >= 4
            });
            assert_eq!(met, vec![true; 4]);
        }
    }

    #[test]
    fn calls_from_several_threads_at_once_share_the_helpers() {
        // Callers outside the pool race for the same helpers: each call still gets every result,
        // in order, whichever helpers it won.
        let w = Workers::new(3).unwrap();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let w = &w;
                s.spawn(move || {
                    for k in 0..200u64 {
                        let parts: Vec<u64> = (0..7).map(|i| 1000 * t + 10 * k + i).collect();
                        let want: Vec<u64> = parts.iter().map(|p| p * 3).collect();
                        assert_eq!(w.map(parts, |p| p * 3), want, "caller {t}, call {k}");
                    }
                });
            }
        });
    }

    #[test]
    fn a_panicking_part_panics_the_call_after_the_others_end_and_the_pool_lives_on() {
        let w = Workers::new(3).unwrap();
        for bad in [0, 5] {
            let ended = AtomicUsize::new(0);
            let r = catch_unwind(AssertUnwindSafe(|| {
                w.map((0..6).collect(), |i: usize| {
                    std::thread::sleep(Duration::from_millis(1));
                    if i == bad {
                        panic!("part {i} failed");
                    }
                    ended.fetch_add(1, Ordering::SeqCst);
                })
            }));
            let payload = r.expect_err("the call panics");
            assert_eq!(payload.downcast_ref::<String>().map(String::as_str), Some(format!("part {bad} failed").as_str()));
            // No part was left running past the call (the parts after a panicking one on the
            // same thread are taken by the others or skipped; none is still running).
            let seen = ended.load(Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(ended.load(Ordering::SeqCst), seen);
        }
        assert_eq!(w.map((0..100u32).collect(), |i| i + 1), (1..=100).collect::<Vec<_>>());
    }

    #[test]
    fn workers_handoff() {
        // Not a check: the cost of a call of two short parts beyond the parts, after an idle
        // spell and within a burst, on this machine (`cargo test -p halo --lib workers_handoff
        // -- --nocapture`). The figures in the module docs come from it.
        fn busy(d: Duration) {
            let t = Instant::now();
            while t.elapsed() < d {
                std::hint::spin_loop();
            }
        }
        let w = Workers::new(2).unwrap();
        let part = Duration::from_micros(5);
        let (mut first, mut later) = (Vec::new(), Vec::new());
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(7));
            for k in 0..10 {
                let t = Instant::now();
                assert_eq!(
                    w.map(vec![1u32, 2], |i| {
                        busy(part);
                        i
                    }),
                    vec![1, 2]
                );
                let over = t.elapsed().saturating_sub(part).as_secs_f64() * 1e6;
                if k == 0 {
                    first.push(over)
                } else {
                    later.push(over)
                }
                busy(Duration::from_micros(60));
            }
        }
        first.sort_by(f64::total_cmp);
        later.sort_by(f64::total_cmp);
        println!(
            "workers: two 5 us parts cost {:.1} us more after 7 ms idle, {:.1} us within a burst (medians)",
            first[first.len() / 2],
            later[later.len() / 2]
        );
    }
}
