//! Host worker threads that outlive one phase: a search step's phases (halo plan, local atoms,
//! cluster grids, pair lists, ranks) hand their parts to one pool started once per run, so its
//! threads stay warm between phases and searches instead of being spawned for each phase.
//!
//! One worker means no pool at all: every part runs on the calling thread and no thread is
//! started. Results never depend on the number of workers: [`Workers::map`] returns results in
//! the order of the parts, whichever thread computed them.

use crate::error::{HaloError, Result};
use rayon::prelude::*;

/// A pool of host worker threads, or none (see the module docs).
#[derive(Debug)]
pub struct Workers {
    /// The pool; `None` for one worker (the calling thread).
    pool: Option<rayon::ThreadPool>,
}

impl Default for Workers {
    /// The calling thread only.
    fn default() -> Self {
        Self::serial()
    }
}

impl Workers {
    /// The calling thread only: no thread is started.
    pub fn serial() -> Self {
        Self { pool: None }
    }

    /// `threads` workers, started now and kept until dropped (0 or 1: [`Self::serial`]).
    pub fn new(threads: usize) -> Result<Self> {
        if threads <= 1 {
            return Ok(Self::serial());
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("halo-search-{i}"))
            .build()
            .map_err(|e| HaloError::InvalidInput(format!("cannot start {threads} host worker threads ({e}): ask for fewer")))?;
        Ok(Self { pool: Some(pool) })
    }

    /// Number of workers (1 without a pool).
    pub fn threads(&self) -> usize {
        self.pool.as_ref().map_or(1, rayon::ThreadPool::current_num_threads)
    }

    /// Every part through `f`, results in the order of `parts`. Parts run on the workers (the
    /// caller waits) when there is a pool and more than one part, else on the calling thread. A
    /// call from inside one of the parts (nested parallelism) shares the same workers.
    pub fn map<T: Send, R: Send>(&self, parts: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
        match &self.pool {
            Some(pool) if parts.len() > 1 => pool.install(|| parts.into_par_iter().map(&f).collect()),
            _ => parts.into_iter().map(f).collect(),
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
    fn the_pool_threads_stay_the_same_between_calls() {
        let w = Workers::new(2).unwrap();
        let names = |w: &Workers| {
            let mut v = w.map((0..64).collect(), |_: i32| std::thread::current().name().map(str::to_owned));
            v.sort();
            v.dedup();
            v
        };
        // Every part ran on a named worker of this pool, never on a fresh thread.
        for _ in 0..3 {
            assert!(names(&w).iter().all(|n| n.as_deref().is_some_and(|n| n.starts_with("halo-search-"))));
        }
        // One worker runs on the caller.
        let one = Workers::serial();
        assert_eq!(names(&one), vec![std::thread::current().name().map(str::to_owned)]);
    }
}
