//! A kernel that only waits: the GPU side of the exchange's jitter (`halo::exchange::perturb`).
//! Enqueued on a rank's stream just before one of its exchange launches, it holds that stream for
//! a given time, so the rank's kernels start late on the GPU while its peers run on: the skew a
//! slow or preempted rank causes, which a host-side delay alone cannot produce once the host has
//! queued many steps ahead.

use crate::device;

kernel! {
    /// Holds the stream for `ns` nanoseconds of `%globaltimer` (which ticks about every
    /// microsecond, so shorter delays round up to the next tick). Launch with one thread: every
    /// thread would wait alike. Bounded by its argument, which the host caps
    /// (`halo::exchange::perturb::Jitter::MAX_US`); touches no memory.
    fn spin_delay(ns: u64) {
        let start = device::global_timer_ns();
        while device::global_timer_ns().wrapping_sub(start) < ns {}
    }
}
