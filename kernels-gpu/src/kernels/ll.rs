//! Low-latency words in the halo kernels ([`crate::abi::ll`]): an element stored into a peer's
//! receive slot as 8-byte words that carry the step's flag, and the bounded poll that takes it
//! back. No fence, no signal, no acquire: the flag travels in the same single-copy-atomic store as
//! the value it vouches for.

use super::common::{Step, WaitClock, WaitSite, spin, timed_out};
use crate::abi::{HaloElement, PulseMeta, WaitKind, WaitStatus, ll, pulse_flags};
use crate::device;

/// 4-byte words of one element (every [`HaloElement`] is a whole number of them, at most
/// [`MAX_WORDS`]).
#[inline(always)]
const fn words<T>() -> usize {
    size_of::<T>() / 4
}

/// Words of the largest element (`[f32; 4]`).
const MAX_WORDS: usize = 4;

/// The flag of `step`'s words.
#[inline(always)]
pub fn flag_of(step: Step) -> u32 {
    ll::flag(step.epoch)
}

/// Where the slot of step parity `parity` of the receive pair at `pair` starts.
#[inline(always)]
pub fn slot(pair: u64, parity: u64, recv_slot_bytes: u32) -> *mut u64 {
    (pair + parity * recv_slot_bytes as u64) as *mut u64
}

/// Stores `v` as element `i` of the low-latency slot `slot` (a peer's, or local): one
/// `st.relaxed.sys.u64` per 4-byte word, flag `flag` beside each.
///
/// # Safety
/// `slot` 8-byte aligned with room for element `i` (`2 * size_of::<T>()` bytes each).
#[inline(always)]
pub unsafe fn store<T: HaloElement>(slot: *mut u64, i: u32, v: T, flag: u32) {
    const { assert!(size_of::<T>() % 4 == 0 && size_of::<T>() <= 4 * MAX_WORDS) };
    // SAFETY: the caller guarantees the slot.
    unsafe {
        let dst = slot.add(i as usize * words::<T>());
        let mut k = 0;
        while k < words::<T>() {
            device::store_relaxed_sys_u64(dst.add(k), ll::word(v.word(k), flag));
            k += 1;
        }
    }
}

/// Element `i` of the low-latency slot `slot` for step `epoch`: every word read once with
/// `ld.relaxed.sys`, back to back (independent loads in flight together), then each word that did
/// not carry the step's flag yet polled until it does ([`poll_word`]), all against one deadline,
/// `clock`'s (the caller's wait: pass the same clock for every element a thread takes in one
/// wait). `None` on a timeout (recorded in `status` for `site`, with `epoch` as the step expected
/// and the step of the flag last seen): the element is incomplete, and the caller must neither
/// use it nor send on anything made from it.
///
/// # Safety
/// `slot` 8-byte aligned with room for element `i`; `status` valid.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn load<T: HaloElement>(
    slot: *const u64,
    i: u32,
    epoch: u64,
    clock: &mut WaitClock,
    timeout_ns: u64,
    status: *mut WaitStatus,
    site: WaitSite,
) -> Option<T> {
    const { assert!(size_of::<T>() % 4 == 0 && size_of::<T>() <= 4 * MAX_WORDS) };
    let flag = ll::flag(epoch);
    let mut out = T::default();
    let mut got = [0u64; MAX_WORDS];
    // SAFETY: the caller guarantees the slot and `status`.
    unsafe {
        let src = slot.add(i as usize * words::<T>());
        let mut k = 0;
        while k < words::<T>() {
            got[k] = device::load_word_relaxed_sys_u64(src.add(k));
            k += 1;
        }
        let mut k = 0;
        while k < words::<T>() {
            if ll::value(got[k], flag).is_none() {
                got[k] = poll_word(src.add(k), epoch, clock, timeout_ns, status, site)?;
            }
            out = out.with_word(k, got[k] as u32);
            k += 1;
        }
    }
    Some(out)
}

/// Polls the word at `word` until it carries step `epoch`'s flag, bounded like every wait
/// ([`spin`]: the clock and the timeout flag every [`super::common::WAIT_CHECK_INTERVAL`] polls,
/// the deadline `clock`'s); `None` on a timeout, which reports `epoch` as expected and the step of
/// the flag last seen ([`ll::step_of_flag`], 0 for a word never stored).
///
/// # Safety
/// `word` valid and 8-byte aligned; `status` valid.
#[inline(always)]
unsafe fn poll_word(word: *const u64, epoch: u64, clock: &mut WaitClock, timeout_ns: u64, status: *mut WaitStatus, site: WaitSite) -> Option<u64> {
    let flag = ll::flag(epoch);
    let mut last = 0;
    // SAFETY: the caller's contract.
    let seen = unsafe {
        spin(clock, epoch, timeout_ns, status, site, || {
            last = device::load_word_relaxed_sys_u64(word);
            if ll::value(last, flag).is_some() { Ok(()) } else { Err(ll::step_of_flag((last >> 32) as u32, epoch)) }
        })
    };
    seen.then_some(last)
}

/// Whether the pulse of `meta` arrives as low-latency words (fused coordinate kernel).
#[inline(always)]
pub fn arrives_as_words(meta: &PulseMeta) -> bool {
    meta.has(pulse_flags::RECV_X_LL)
}

/// Whether all of `pulses[0..n]` arrive as low-latency words.
///
/// # Safety
/// `pulses[0..n]` valid.
#[inline(always)]
pub unsafe fn all_arrive_as_words(pulses: *const PulseMeta, n: u32) -> bool {
    // SAFETY: the caller's contract.
    (0..n).all(|q| arrives_as_words(unsafe { &*pulses.add(q as usize) }))
}

/// The received coordinate of `atom` (at or past the home atoms), to forward in a pulse after
/// `earlier` pulses: taken from the low-latency slot of the earlier pulse that brought it when
/// that pulse came as words ([`arrives_as_words`]; `clock` is the caller's wait, as in [`load`]),
/// else read from `x`, where a put or a bulk copy left it (the caller has waited for those pulses'
/// signals). `None` when the words did not come in time or a wait of this launch has timed out
/// ([`timed_out`]: `x` may hold an older step's value): the caller forwards nothing then.
///
/// # Safety
/// `pulses[0..earlier]` valid; `atom` inside `x` and received in one of them (the plan's rule,
/// checked by `spec::validate`); `status` valid; the waits for the signalled pulses ordered before
/// this thread (a barrier after them).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn received<T: HaloElement>(
    pulses: *const PulseMeta,
    earlier: u32,
    atom: u32,
    x: *const T,
    step: Step,
    clock: &mut WaitClock,
    timeout_ns: u64,
    status: *mut WaitStatus,
) -> Option<T> {
    for q in 0..earlier {
        // SAFETY: the caller's contract.
        let m = unsafe { &*pulses.add(q as usize) };
        if atom >= m.atom_offset && atom - m.atom_offset < m.recv_size {
            if arrives_as_words(m) {
                let site = WaitSite { pulse: q, kind: WaitKind::CoordSignal, peer: m.recv_pe };
                let slot = slot(m.x_recv_slots, step.parity(), m.recv_slot_bytes);
                // SAFETY: the pulse's own receive pair; element `atom - atom_offset` < recv_size.
                return unsafe { load(slot, atom - m.atom_offset, step.epoch, clock, timeout_ns, status, site) };
            }
            break;
        }
    }
    // SAFETY: the caller's contract.
    unsafe { if timed_out(status) { None } else { Some(*x.add(atom as usize)) } }
}
