//! The timeline probe (where do the microseconds of a halo go?): the fused coordinate
//! and force kernels instrumented with `%globaltimer` stamps, and a kernel that measures the
//! timer's resolution.
//!
//! The instrumented kernels are the exchange's own generic functions instantiated a second time,
//! with [`On`] instead of [`Off`]. With `Off` every stamp is an empty inline function and the clock
//! is never read, so the exchange's kernels compile exactly as without the probe (the PTX tests
//! check that no stamp reaches them). Every stamp goes through [`device::stamp_time`]; the record
//! layout is [`crate::abi::timeline`].

use crate::abi::timeline::{self as layout, RESOLUTION_WORDS};
use crate::abi::{Float3, ProtocolState, PulseMeta, WaitStatus};
use crate::device::{self, thread};

/// Where a launch records when its blocks reach each point: a ring of records ([`On`]), or
/// nowhere ([`Off`], the exchange's kernels).
pub trait Timeline: Copy {
    /// Whether this timeline stamps. The helpers below test it before anything else, so that with
    /// [`Off`] not even the thread index they look at is read (a read left in the kernel would let
    /// the compiler move the kernel's own reads of it, changing its code).
    const ON: bool;

    /// `%globaltimer` when stamping; 0, without reading the clock, when not.
    fn now(self) -> u64;

    /// The same timeline, writing the record of step `epoch`.
    fn for_step(self, epoch: u64) -> Self;

    /// Keeps `t` in word `slot` of the record: the latest time of every writer, or the earliest
    /// when `earliest`. `None` (a pulse past the record's room) stamps nothing.
    fn keep(self, slot: Option<usize>, t: u64, earliest: bool);

    /// Thread 0 of the block keeps `t` in `slot` (the latest).
    #[inline(always)]
    fn keep0(self, slot: Option<usize>, t: u64) {
        if Self::ON && thread::thread_idx_x() == 0 {
            self.keep(slot, t, false);
        }
    }

    /// Stamps `slot` now (the calling thread).
    #[inline(always)]
    fn mark(self, slot: Option<usize>) {
        self.keep(slot, self.now(), false);
    }

    /// Thread 0 of the block stamps `slot` now.
    #[inline(always)]
    fn mark0(self, slot: Option<usize>) {
        self.keep0(slot, self.now());
    }

    /// The timeline of step `epoch`, with this block's entry time `entered` (read by [`Self::now`]
    /// first thing in the kernel) kept as the launch's earliest and latest block entry.
    #[inline(always)]
    fn entered(self, epoch: u64, entered: u64) -> Self {
        let tl = self.for_step(epoch);
        if Self::ON && thread::thread_idx_x() == 0 {
            tl.keep(Some(layout::ENTRY_FIRST), entered, true);
            tl.keep(Some(layout::ENTRY_LAST), entered, false);
        }
        tl
    }
}

/// No stamps: the exchange's kernels.
#[derive(Clone, Copy)]
pub struct Off;

impl Timeline for Off {
    const ON: bool = false;
    #[inline(always)]
    fn now(self) -> u64 {
        0
    }
    #[inline(always)]
    fn for_step(self, _: u64) -> Self {
        self
    }
    #[inline(always)]
    fn keep(self, _: Option<usize>, _: u64, _: bool) {}
}

/// Stamps into a ring of records in device memory, one per step.
#[derive(Clone, Copy)]
pub struct On {
    ring: *mut u64,
    mask: u64,
    record: *mut u64,
}

impl On {
    /// `records` records of [`layout::RECORD_WORDS`] words at `ring`; `records` should be a power of
    /// two (a ring of another size is used up to the largest power of two below it).
    ///
    /// # Safety
    /// `ring` holds `records * RECORD_WORDS` `u64`s of this device's global memory, 8-byte aligned,
    /// for as long as the timeline is used; nothing else writes them meanwhile.
    #[inline(always)]
    pub unsafe fn new(ring: *mut u64, records: u32) -> Self {
        // The largest power of two not above `records`, minus one: a mask that never leaves the ring.
        let mask = if records == 0 { 0 } else { (1u64 << (31 - records.leading_zeros())) - 1 };
        Self { ring, mask, record: ring }
    }
}

impl Timeline for On {
    const ON: bool = true;
    #[inline(always)]
    fn now(self) -> u64 {
        device::global_timer_ns()
    }
    #[inline(always)]
    fn for_step(self, epoch: u64) -> Self {
        // Pointer arithmetic only (wrapping), checked against the ring by the mask.
        let record = self.ring.wrapping_add((epoch & self.mask) as usize * layout::RECORD_WORDS);
        Self { record, ..self }
    }
    #[inline(always)]
    fn keep(self, slot: Option<usize>, t: u64, earliest: bool) {
        if let Some(s) = slot.filter(|&s| s < layout::RECORD_WORDS) {
            // SAFETY: `record` is one of the ring's records (`for_step` masks the index; `new`'s
            // contract) and `s` a word inside it.
            unsafe { device::stamp_time(self.record.add(s), t, earliest) };
        }
    }
}

kernel! {
    /// `fused_coords` for `Float3`, stamping into `ring` (`records` records, a power of two; the
    /// step's record must hold [`layout::initial_record`] when the launch starts).
    fn fused_coords_timeline(pulses: *const PulseMeta, num_pulses: u32, x: *mut Float3, signals: *mut u64, state: *mut ProtocolState, counters: *mut u32, dep_offset: u32, timeout_ns: u64, status: *mut WaitStatus, ring: *mut u64, records: u32) {
        // SAFETY: forwarded (see `fused_coords`); the host passes a ring of `records` records.
        unsafe { super::fused_coords::fused_coords::<Float3, On>(pulses, num_pulses, x, signals, state, counters, dep_offset, timeout_ns, status, On::new(ring, records)) }
    }
}

kernel! {
    /// `fused_forces` for `Float3`, stamping into `ring` like `fused_coords_timeline`.
    fn fused_forces_timeline(pulses: *const PulseMeta, num_pulses: u32, f: *mut Float3, signals: *mut u64, state: *mut ProtocolState, counters: *mut u32, timeout_ns: u64, status: *mut WaitStatus, ring: *mut u64, records: u32) {
        // SAFETY: forwarded (see `fused_forces`); the host passes a ring of `records` records.
        unsafe { super::fused_forces::fused_forces::<Float3, On>(pulses, num_pulses, f, signals, state, counters, timeout_ns, status, On::new(ring, records)) }
    }
}

kernel! {
    /// The resolution of `%globaltimer`: one thread reads it `polls` times back to back and writes
    /// `out[0..4]` = the smallest nonzero step, the largest step, the number of changes and the
    /// time from the first read to the last (ns; `out[0]` is `u64::MAX` when it never changed).
    /// Bounded by `polls`. Launch with one thread.
    fn globaltimer_resolution(out: *mut u64, polls: u32) {
        let first = device::global_timer_ns();
        let (mut prev, mut smallest, mut largest, mut changes) = (first, u64::MAX, 0u64, 0u64);
        for _ in 0..polls {
            let t = device::global_timer_ns();
            if t != prev {
                let step = t.wrapping_sub(prev);
                smallest = smallest.min(step);
                largest = largest.max(step);
                changes += 1;
                prev = t;
            }
        }
        let words: [u64; RESOLUTION_WORDS] = [smallest, largest, changes, prev.wrapping_sub(first)];
        for (i, w) in words.iter().enumerate() {
            // SAFETY: the host passes RESOLUTION_WORDS words.
            unsafe { *out.add(i) = *w };
        }
    }
}
