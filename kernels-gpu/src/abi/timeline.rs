//! The timeline probe's record: where the instrumented fused kernels (`fused_coords_timeline`,
//! `fused_forces_timeline`) write `%globaltimer` stamps, one record per launch.
//!
//! A rank holds one ring of records per direction (a power of two of them, [`RECORD_WORDS`] `u64`
//! each); a launch writes the record of its step, `ring[epoch & (records - 1)]`, so a captured step
//! replays with no host work in between like the plain kernels. Every stamp keeps the latest (or,
//! for [`ENTRY_FIRST`], the earliest) time any writer stamped, so the host initialises a record
//! with [`initial_record`] and reads `0` (or `u64::MAX`) as "not reached".

/// `u64` words of one record: [`GLOBAL_WORDS`], then [`PULSE_WORDS`] for each of the first
/// [`MAX_PULSES`] pulses (later pulses are not stamped).
pub const RECORD_WORDS: usize = 32;
/// Launch-wide words at the start of a record.
pub const GLOBAL_WORDS: usize = 8;
/// Words per stamped pulse.
pub const PULSE_WORDS: usize = 8;
/// Pulses a record has room for (2x1x1 has one, 2x2x2 three).
pub const MAX_PULSES: u32 = 3;

/// Earliest entry of any block of the launch (kept with `min`).
pub const ENTRY_FIRST: usize = 0;
/// Latest entry of any block of the launch.
pub const ENTRY_LAST: usize = 1;
/// Latest end of any block (thread 0 returning from the kernel body).
pub const END: usize = 2;

/// Per-pulse points of the coordinate kernel, in the order a pulse passes them.
pub mod coords {
    /// After the coordinate-credit wait (stamped even where no credit is awaited), latest block.
    pub const CREDIT: usize = 0;
    /// After pass 1 (independent atoms) of every thread of the block, latest block.
    pub const PACKED: usize = 1;
    /// After the dependency wait (thread 0 of a block holding dependent atoms), latest block; 0
    /// where no block waited (pulse 0, or no forwarded atom).
    pub const DEPS: usize = 2;
    /// Put path: the pulse's last block elected, every block packed (pass 2 included). Not
    /// stamped where the pulse goes as low-latency words (no election).
    pub const ELECTED: usize = 3;
    /// When the elected block entered the kernel (put path only).
    pub const ELECTED_ENTRY: usize = 4;
    /// The pulse delivered: words, the block's last word stored (latest block); put, the put
    /// returned; bulk, not stamped.
    pub const DELIVERED: usize = 5;
    /// This rank's own incoming pulse in: words, the block's share unpacked into `x` (latest
    /// block); otherwise the wait on its receive slot returned.
    pub const RECEIVED: usize = 6;
}

/// Per-pulse points of the force kernel, in the order a pulse passes them.
pub mod forces {
    /// After the force-credit wait and the wait for every later pulse's accumulation (the reverse
    /// chain), latest block.
    pub const CHAIN: usize = 0;
    /// The push done: words, the block's last word stored (latest block); put, the last block
    /// elected once every block staged its part.
    pub const PUSHED: usize = 1;
    /// When the push's elected block entered the kernel (put path only).
    pub const ELECTED_ENTRY: usize = 2;
    /// The push delivered: words, as [`PUSHED`] (no signal); put, the put returned.
    pub const SIGNALLED: usize = 3;
    /// `send_pe`'s push in: words, the block's share polled and accumulated (latest block);
    /// put, the wait on the receive slot returned (latest block).
    pub const RECEIVED: usize = 4;
    /// Accumulation done (after the block barrier), latest block.
    pub const ACCUMULATED: usize = 5;
    /// The row's last block counted itself done: earlier pulses may push (the chain moves on).
    pub const ROW_DONE: usize = 6;
}

/// The word of `point` of `pulse`, or `None` for a pulse past [`MAX_PULSES`].
#[inline(always)]
pub const fn pulse_slot(pulse: u32, point: usize) -> Option<usize> {
    if pulse < MAX_PULSES { Some(GLOBAL_WORDS + pulse as usize * PULSE_WORDS + point) } else { None }
}

/// A record before any stamp: [`ENTRY_FIRST`] at `u64::MAX` (stamps keep the minimum there), every
/// other word 0 (they keep the maximum).
pub const fn initial_record() -> [u64; RECORD_WORDS] {
    let mut r = [0u64; RECORD_WORDS];
    r[ENTRY_FIRST] = u64::MAX;
    r
}

/// `fused_coords_timeline(pulses, num_pulses, x, signals, state, counters, dep_offset, timeout_ns,
/// status, ring, records)`: `fused_coords` (`Float3`) with stamps into `ring` (`records` records, a
/// power of two).
pub const FUSED_COORDS_TIMELINE: &str = "fused_coords_timeline";
/// `fused_forces_timeline(pulses, num_pulses, f, signals, state, counters, timeout_ns, status,
/// ring, records)`: `fused_forces` (`Float3`) with stamps.
pub const FUSED_FORCES_TIMELINE: &str = "fused_forces_timeline";
/// `globaltimer_resolution(out, polls)`, one thread: reads `%globaltimer` `polls` times back to
/// back and writes [`RESOLUTION_WORDS`] words: the smallest nonzero step, the largest step, the
/// number of changes seen and the time from the first read to the last (ns).
pub const GLOBALTIMER_RESOLUTION: &str = "globaltimer_resolution";
/// Words `globaltimer_resolution` writes.
pub const RESOLUTION_WORDS: usize = 4;

const _: () = {
    assert!(GLOBAL_WORDS + MAX_PULSES as usize * PULSE_WORDS <= RECORD_WORDS);
    assert!(coords::RECEIVED < PULSE_WORDS && forces::ROW_DONE < PULSE_WORDS);
    assert!(END < GLOBAL_WORDS);
};
