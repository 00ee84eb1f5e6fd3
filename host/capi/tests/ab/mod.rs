//! The C API's cost beside the Rust API's: the same step through both, timed in alternating blocks
//! (which API goes first alternates too), so that drift of the machine over the run (clocks, other
//! tenants) falls on both alike.

use halo_capi::exchange::{CUstream, halo_exchange, halo_exchange_coordinates, halo_exchange_finish, halo_exchange_forces};
use std::time::Instant;

/// Warm-up steps of each API, blocks of each, and steps per block.
pub const WARMUP: usize = 100;
pub const BLOCKS: usize = 10;
pub const PER_BLOCK: usize = 100;

/// Each step's host time in µs of `a` and of `b` (`BLOCKS * PER_BLOCK` each), after `WARMUP` of
/// both. Every caller of a collective exchange runs the same schedule, so the steps pair up.
pub fn alternating_blocks(a: &mut dyn FnMut(), b: &mut dyn FnMut()) -> (Vec<f64>, Vec<f64>) {
    for _ in 0..WARMUP {
        a();
        b();
    }
    let timed = |step: &mut dyn FnMut(), times: &mut Vec<f64>| {
        for _ in 0..PER_BLOCK {
            let t = Instant::now();
            step();
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
    };
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for block in 0..BLOCKS {
        if block % 2 == 0 {
            timed(a, &mut ta);
            timed(b, &mut tb);
        } else {
            timed(b, &mut tb);
            timed(a, &mut ta);
        }
    }
    (ta, tb)
}

/// The median (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One step through the C API: the coordinate halo and the force halo on `streams` (one per local
/// rank of `ex`), then the finish, each asserted to return `HALO_OK` (with its last error).
///
/// # Safety
/// `ex` is a live exchange and `streams` are live streams of its ranks' GPUs, as
/// `halo_exchange_coordinates` requires.
pub unsafe fn c_step(ex: *mut halo_exchange, streams: &[CUstream]) {
    let n = i32::try_from(streams.len()).expect("a stream count that fits an int");
    // SAFETY: the caller's contract.
    unsafe {
        crate::common::ok(halo_exchange_coordinates(ex, streams.as_ptr(), n), "halo_exchange_coordinates");
        crate::common::ok(halo_exchange_forces(ex, streams.as_ptr(), n), "halo_exchange_forces");
        crate::common::ok(halo_exchange_finish(ex), "halo_exchange_finish");
    }
}
