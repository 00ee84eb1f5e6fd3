//! Pieces shared by the halo kernels: packing a slice of an index map, bounded waits, last-block
//! election, the launch's step counter (read from and advanced in device memory), the ways of
//! delivering a pulse (direct stores, NVSHMEM put with a signal or a fenced put), and credits.

use crate::abi::{
    Direction, Float3, HaloElement, NVSHMEM_SIGNAL_SET, PackMode, ProtocolState, PulseMeta, SignalMode, SignalSlot, WaitKind, WaitStatus,
    pulse_flags, signal_index,
};
use crate::device::{self, nvshmem, thread};

/// An element type the halo kernels can move on the device: a [`HaloElement`] that can also be
/// accumulated atomically (the reverse exchange adds into targets several pulses may share).
pub trait DeviceElement: HaloElement {
    /// `*dst += v` with relaxed GPU-scope atomics, component by component.
    ///
    /// # Safety
    /// `dst` must be a valid, naturally aligned global address on this device.
    unsafe fn atomic_accumulate(dst: *mut Self, v: Self);
}

impl DeviceElement for Float3 {
    #[inline(always)]
    unsafe fn atomic_accumulate(dst: *mut Self, v: Self) {
        // SAFETY: the caller guarantees `dst`; each component is a valid f32 address.
        unsafe {
            device::atomic_add_relaxed_gpu_f32(&raw mut (*dst).x, v.x);
            device::atomic_add_relaxed_gpu_f32(&raw mut (*dst).y, v.y);
            device::atomic_add_relaxed_gpu_f32(&raw mut (*dst).z, v.z);
        }
    }
}

impl DeviceElement for f32 {
    #[inline(always)]
    unsafe fn atomic_accumulate(dst: *mut Self, v: Self) {
        // SAFETY: the caller guarantees `dst`.
        unsafe { device::atomic_add_relaxed_gpu_f32(dst, v) }
    }
}

impl DeviceElement for f64 {
    #[inline(always)]
    unsafe fn atomic_accumulate(dst: *mut Self, v: Self) {
        // SAFETY: the caller guarantees `dst`.
        unsafe { device::atomic_add_relaxed_gpu_f64(dst, v) }
    }
}

impl DeviceElement for [f32; 4] {
    #[inline(always)]
    unsafe fn atomic_accumulate(dst: *mut Self, v: Self) {
        let d = dst as *mut f32;
        // SAFETY: the caller guarantees `dst`; the four components are consecutive f32s.
        unsafe {
            for (k, c) in v.iter().enumerate() {
                device::atomic_add_relaxed_gpu_f32(d.add(k), *c);
            }
        }
    }
}

/// The periodic shift of a pulse, or `None` when it does not cross the boundary.
#[inline(always)]
pub fn shift_of(meta: &PulseMeta) -> Option<Float3> {
    (meta.use_shift != 0).then_some(meta.shift)
}

/// `x[atom] (+ shift)`. Without a shift the value is copied untouched (bit-exact, `-0.0` stays).
#[inline(always)]
pub fn shifted<T: HaloElement>(v: T, shift: Option<Float3>) -> T {
    match shift {
        Some(s) => v.shifted(s),
        None => v,
    }
}

/// Grid-stride gather over `map[0..n]`: `dest[i] = x[map[i]] (+ shift)` for every entry `mode`
/// selects against `threshold`; returns how many entries this thread skipped (deferred).
///
/// # Safety
/// `x`, `map[0..n]` and `dest[0..n]` valid; every `map[i]` in range of `x`; `dest` not aliasing
/// the selected sources.
#[inline(always)]
pub unsafe fn pack_subset<T: HaloElement>(
    x: *const T,
    map: *const u32,
    n: u32,
    dest: *mut T,
    shift: Option<Float3>,
    mode: PackMode,
    threshold: u32,
) -> u32 {
    let mut deferred = 0;
    let mut i = thread::index_1d();
    while i < n {
        // SAFETY: i < n and the caller's contract on map, x and dest.
        unsafe {
            let atom = *map.add(i as usize);
            if mode.selects(atom, threshold) {
                *dest.add(i as usize) = shifted(*x.add(atom as usize), shift);
            } else {
                deferred += 1;
            }
        }
        i += thread::grid_stride_x();
    }
    deferred
}

/// Where a wait came from, for the timeout report.
#[derive(Clone, Copy)]
pub struct WaitSite {
    pub pulse: u32,
    pub kind: WaitKind,
    pub peer: i32,
}

/// Polls of a bounded wait between two looks at `%globaltimer` and the timeout flag. The H200
/// probes (docs/protocol.md, "The wait") measured a relaxed spin that looks at the clock and the
/// flag on every poll at 1.86 µs one way, and one that looks every 256 polls at 1.21 µs, the same
/// as an unbounded acquire spin: the bound costs nothing on the fast path.
pub const WAIT_CHECK_INTERVAL: u32 = 256;

/// The clock of one wait: started the first time the wait looks at `%globaltimer` (after
/// [`WAIT_CHECK_INTERVAL`] polls without success, so a wait that succeeds sooner never reads the
/// clock) and never restarted. A wait made of several spins (a thread polling the words of every
/// element it owns) passes the same clock to each, so it gives up `timeout_ns` after its first
/// slow poll, not `timeout_ns` after each spin's.
#[derive(Clone, Copy)]
pub struct WaitClock {
    started: Option<u64>,
}

impl WaitClock {
    /// A clock not started yet.
    #[inline(always)]
    pub const fn new() -> Self {
        Self { started: None }
    }

    /// Starts the clock at `now` unless it runs already; returns the nanoseconds since it started.
    #[inline(always)]
    fn waited(&mut self, now: u64) -> u64 {
        let start = *self.started.get_or_insert(now);
        now.wrapping_sub(start)
    }
}

/// The slow path of a bounded wait, entered every [`WAIT_CHECK_INTERVAL`] polls: starts `clock`
/// on its first call ([`WaitClock`]) and says whether to give up (deadline passed, or another
/// waiter already timed out), recording the failure in `status` when it does.
///
/// # Safety
/// `status` valid.
#[inline(always)]
unsafe fn wait_expired(clock: &mut WaitClock, timeout_ns: u64, status: *mut WaitStatus, site: WaitSite, expected: u64, seen: u64) -> bool {
    let waited = clock.waited(device::global_timer_ns());
    // SAFETY: `status` valid; another waiter's CAS on the flag is a GPU-scope atomic.
    let other_failed = unsafe { device::load_relaxed_gpu_u32(&raw const (*status).timed_out) } != 0;
    if waited > timeout_ns || other_failed {
        // SAFETY: `status` valid.
        unsafe { report_timeout(status, site, expected, seen, waited) };
        return true;
    }
    false
}

/// The bounded spin of every wait: `poll()` until it returns `Ok`, the clock and the timeout flag
/// only every [`WAIT_CHECK_INTERVAL`] polls, the deadline `clock`'s ([`WaitClock`]: one per wait,
/// however many spins it takes). `poll` returns `Err(seen)` while not ready (`seen`, with
/// `expected`, goes into the timeout report).
///
/// # Safety
/// `status` valid; `poll` reads valid locations.
#[inline(always)]
pub unsafe fn spin(
    clock: &mut WaitClock,
    expected: u64,
    timeout_ns: u64,
    status: *mut WaitStatus,
    site: WaitSite,
    mut poll: impl FnMut() -> Result<(), u64>,
) -> bool {
    loop {
        let mut polls = WAIT_CHECK_INTERVAL;
        let mut seen = 0;
        while polls > 0 {
            match poll() {
                Ok(()) => return true,
                Err(s) => seen = s,
            }
            polls -= 1;
        }
        // SAFETY: `status` valid.
        if unsafe { wait_expired(clock, timeout_ns, status, site, expected, seen) } {
            return false;
        }
    }
}

/// The bounded spin of the counter waits: `relaxed()` until it returns at least `expected`, then
/// one `acquire()` ([`spin`], against `clock`'s deadline).
///
/// # Safety
/// `status` valid; `relaxed` and `acquire` read a valid location.
#[inline(always)]
unsafe fn spin_until(
    clock: &mut WaitClock,
    expected: u64,
    timeout_ns: u64,
    status: *mut WaitStatus,
    site: WaitSite,
    relaxed: impl Fn() -> u64,
    acquire: impl Fn(),
) -> bool {
    // SAFETY: forwarded.
    unsafe {
        spin(clock, expected, timeout_ns, status, site, || {
            let seen = relaxed();
            if seen >= expected {
                acquire();
                Ok(())
            } else {
                Err(seen)
            }
        })
    }
}

/// Spin until `*slot >= expected`, then acquire. Slots hold step counters that only grow (each
/// SET by one peer to its counter, or by the host to [`crate::abi::SIGNAL_UNSET`] while idle), so
/// a value above `expected` means step `expected` arrived too (docs/protocol.md, "Monotonic
/// signals").
///
/// The spin is `ld.relaxed.sys`; the clock and the timeout flag are looked at only every
/// [`WAIT_CHECK_INTERVAL`] polls; the wait ends with one `ld.acquire.sys` re-read of the slot,
/// which reads the value the spin saw or a later one (coherence), each written by a release, so
/// the data behind it is visible to every later read of this thread. No fence on the fast path.
/// Bounded: after `timeout_ns` of `%globaltimer` (plus at most one interval of polls), or as soon
/// as another waiter has timed out, it records the failure in `status` (first reporter wins) and
/// returns `false`, so the kernel ends instead of hanging. Callers carry on to their barriers
/// either way; the host discards the step's data when `status.timed_out` is set.
///
/// This is the only signal wait: the exchange kernels and the latency probe call it alike.
///
/// # Safety
/// `slot` valid and 8-byte aligned (local or a peer's); `status` valid. One thread per wait.
#[inline(always)]
pub unsafe fn wait_signal(slot: *const u64, expected: u64, timeout_ns: u64, status: *mut WaitStatus, site: WaitSite) -> bool {
    // SAFETY: forwarded.
    unsafe { wait_signal_on(&mut WaitClock::new(), slot, expected, timeout_ns, status, site) }
}

/// [`wait_signal`] as one of several signals a thread awaits in one wait (the signals of the
/// earlier pulses a pulse forwards from): against `clock`'s deadline, shared by all of them.
///
/// # Safety
/// As [`wait_signal`].
#[inline(always)]
pub unsafe fn wait_signal_on(
    clock: &mut WaitClock,
    slot: *const u64,
    expected: u64,
    timeout_ns: u64,
    status: *mut WaitStatus,
    site: WaitSite,
) -> bool {
    // SAFETY: the caller guarantees `slot` and `status`; the acquire's value is not needed.
    unsafe {
        spin_until(
            clock,
            expected,
            timeout_ns,
            status,
            site,
            || device::load_relaxed_sys_u64(slot),
            || {
                device::load_acquire_sys_u64(slot);
            },
        )
    }
}

/// Spin until the u32 counter at `ptr` reaches `expected` (arrivals of blocks of this launch,
/// each an acq-rel atomic), then acquire at GPU scope; bounded like [`wait_signal`]: a relaxed
/// GPU-scope spin, the clock every [`WAIT_CHECK_INTERVAL`] polls (`clock`'s deadline: one for
/// all the counters a thread awaits in one wait), one `ld.acquire.gpu` at the end.
///
/// # Safety
/// `ptr` valid and on this device; `status` valid.
#[inline(always)]
pub unsafe fn wait_local_counter(
    clock: &mut WaitClock,
    ptr: *const u32,
    expected: u32,
    timeout_ns: u64,
    status: *mut WaitStatus,
    pulse: u32,
) -> bool {
    let site = WaitSite { pulse, kind: WaitKind::LocalBlocks, peer: -1 };
    // SAFETY: the caller guarantees `ptr` and `status`.
    unsafe {
        spin_until(
            clock,
            expected as u64,
            timeout_ns,
            status,
            site,
            || device::load_relaxed_gpu_u32(ptr) as u64,
            || {
                device::load_acquire_gpu_u32(ptr);
            },
        )
    }
}

/// Claims `status` (0 -> 1) and fills in the details; later reporters leave it alone.
///
/// # Safety
/// `status` valid.
unsafe fn report_timeout(status: *mut WaitStatus, site: WaitSite, expected: u64, seen: u64, waited: u64) {
    // SAFETY: `status` valid; the CAS makes exactly one thread the writer.
    unsafe {
        if device::atomic_cas_relaxed_gpu_u32(&raw mut (*status).timed_out, 0, 1) == 0 {
            (*status).pulse = site.pulse;
            (*status).kind = site.kind as u32;
            (*status).peer = site.peer;
            (*status).expected = expected;
            (*status).seen = seen;
            (*status).waited_ns = waited;
        }
    }
}

/// Whether a wait of this launch (or of an earlier launch the host has not reset) has timed out:
/// one relaxed GPU-scope load of `status.timed_out`. Two uses:
/// - A thread that sends data which depends on a wait (forwarded atoms, accumulated forces, a
///   signal that vouches for them) checks it after an acquire that follows the waits (its own, or
///   its block's through a barrier and an acq-rel arrival), and sends nothing when it is set: a
///   timed-out wait never makes its zeros or stale values look valid downstream, whose own wait
///   then times out and reports too.
/// - A launch that starts with it set (an earlier launch of this rank gave up on a wait) writes
///   nothing into a peer's memory and signals nothing: the earlier waits that ordered its writes
///   after the peer's reads of the last step are gone, so the peer may still be reading what it
///   would overwrite, and a signal of any pulse, even one that forwards nothing, could be taken
///   for the step the peer waits for. Forces go nowhere either: they were computed from a halo
///   that may be stale. Coordinates sent as low-latency words need no gate (each word carries its
///   step, and the home atoms of pulse 0 are right whatever the waits did). The fused coordinate
///   kernel's put path looks at it once per pulse, in the block that puts.
///
/// # Safety
/// `status` valid.
#[inline(always)]
pub unsafe fn timed_out(status: *const WaitStatus) -> bool {
    // SAFETY: `status` valid; the reporters' CAS is a GPU-scope atomic.
    unsafe { device::load_relaxed_gpu_u32(&raw const (*status).timed_out) != 0 }
}

/// Whether coordinate pulse `pulse` sends anything that depends on a wait of this step: the atoms
/// it forwards (every pulse after the first may) or a slot it may write only after the credit
/// ([`pulse_flags::WAIT_COORD_CREDIT`] in a repeated direction). On the bulk-copy path only such
/// a pulse looks at the timeout flag ([`timed_out`]) before its signal; pulse 0 of a fresh
/// direction never pays it (an earlier launch's timeout is caught at the launch's start).
#[inline(always)]
pub fn coord_pulse_depends_on_waits(pulse: u32, meta: &PulseMeta, step: Step) -> bool {
    pulse > 0 || (step.repeat && meta.has(pulse_flags::WAIT_COORD_CREDIT))
}

/// Device-wide arrival: thread 0 of each block increments `counter` (acq-rel, wrapping after
/// `gridDim.x` arrivals); returns, to every thread of the block, whether this block arrived last
/// and so sees all the other blocks' writes (and reads: the release orders both).
///
/// # Safety
/// All threads of the block call it together (it contains block barriers); `counter` valid, on
/// this device, 0 when the launch starts (it wraps back to 0 by itself).
#[inline(always)]
pub unsafe fn arrive_is_last_block(counter: *mut u32) -> bool {
    // SAFETY: all threads call this; the barrier orders the block's accesses before thread 0's release.
    unsafe {
        device::sync_threads();
        let mut last = false;
        if thread::thread_idx_x() == 0 {
            let limit = thread::grid_dim_x() - 1;
            last = device::atomic_inc_acq_rel_gpu(counter, limit) == limit;
        }
        device::sync_threads_or(last)
    }
}

/// This launch's step counter in one direction, read from the rank's device-resident
/// [`ProtocolState`] at the start of the kernel: the signals of this launch carry `epoch`, and
/// `repeat` says the previous launch of this exchange was the same direction (so the
/// consumption credits of the pulses that need them must be awaited).
#[derive(Clone, Copy)]
pub struct Step {
    /// The counter this launch signals and waits for (`completed + 1`).
    pub epoch: u64,
    /// The previous launch was the same direction (no opposite halo in between).
    pub repeat: bool,
}

impl Step {
    /// Reads the state for `direction` ([`Direction::Coordinates`] or [`Direction::Forces`]).
    /// Every block reads it before it arrives anywhere; the launch's last arrival advances it
    /// ([`record_launch`]), so all blocks of a launch agree.
    ///
    /// # Safety
    /// `state` valid; written only by [`record_launch`] of an earlier launch (kernel boundaries
    /// order it) or by the host while the rank is idle.
    #[inline(always)]
    pub unsafe fn read(state: *const ProtocolState, direction: Direction) -> Self {
        // SAFETY: the caller's contract; plain loads, ordered by the launch boundary.
        let (completed, last) = unsafe {
            let s = &*state;
            (if direction == Direction::Forces { s.f_epoch } else { s.x_epoch }, s.last_direction)
        };
        Self { epoch: completed + 1, repeat: last == direction as u32 }
    }

    /// Slot parity of this step: which slot of a pair it writes or reads.
    #[inline(always)]
    pub fn parity(self) -> u64 {
        self.epoch & 1
    }
}

/// Arrival of one coordinate pulse's last block (thread 0), once the pulse is packed and
/// delivered, on the launch-wide counter `state.x_finished` (acq-rel, wrapping after
/// `num_pulses` arrivals), in the kernels that end each pulse in its last block (TMA, per pulse).
/// Call it before the pulse's own receive wait, so it overlaps the hop. The last arrival sees
/// every read of received coordinates this launch made (all packing is done); it sends the
/// coordinate credits of the pulses marked
/// [`pulse_flags::SEND_COORD_CREDIT`] to their `recv_pe` ("I have finished reading what you sent
/// me") and records the launch ([`record_launch`]). `puts`: whether credits may go by NVSHMEM
/// (false in the kernels that require every peer mapped, which then contain no NVSHMEM call).
///
/// # Safety
/// One thread per pulse calls it; `state` on this device (`x_finished` 0 at launch start, and
/// every block of the launch read the state before arriving anywhere), `pulses[0..num_pulses]` and
/// `signals` valid; the put path as in [`send_credit`].
#[inline(always)]
pub unsafe fn finish_coordinates(pulses: *const PulseMeta, num_pulses: u32, signals: *mut u64, state: *mut ProtocolState, step: Step, puts: bool) {
    let limit = num_pulses - 1;
    // SAFETY: the caller's contract.
    if unsafe { device::atomic_inc_acq_rel_gpu(&raw mut (*state).x_finished, limit) } != limit {
        return;
    }
    for q in 0..num_pulses {
        // SAFETY: `num_pulses` valid entries.
        let meta = unsafe { &*pulses.add(q as usize) };
        if meta.has(pulse_flags::SEND_COORD_CREDIT) {
            // SAFETY: the credit slot of pulse `q` is symmetric; `recv_pe` holds it at the same offset.
            unsafe {
                let slot = signals.add(signal_index(SignalSlot::CoordCredit, q, num_pulses));
                send_credit(meta.remote_x_credit, slot, step.epoch, meta.recv_pe, puts)
            };
        }
    }
    // SAFETY: as above.
    unsafe { record_launch(state, step, Direction::Coordinates) };
}

/// Records a finished launch in `state`: the step counter of `direction` becomes `step.epoch`, and
/// `direction` the last direction. Plain stores: nothing in this launch reads them again, and the
/// next launch reads them after the kernel boundary.
///
/// # Safety
/// One thread of the launch calls it, after every block of the launch has read the state (an
/// acq-rel arrival of every block precedes it); `state` on this device.
#[inline(always)]
pub unsafe fn record_launch(state: *mut ProtocolState, step: Step, direction: Direction) {
    // SAFETY: the caller's contract.
    unsafe {
        if direction == Direction::Forces {
            (*state).f_epoch = step.epoch;
        } else {
            (*state).x_epoch = step.epoch;
        }
        (*state).last_direction = direction as u32;
    }
}

/// Every block's arrival on the launch-wide counter of `direction` (`state.x_finished` or
/// `state.f_finished`, acq-rel, wrapping to 0 after `blocks` arrivals): a barrier, then thread 0.
/// The last arrival records the launch ([`record_launch`]): every thread read the state before
/// the barrier. Called once each block has issued its sends, so it overlaps the hop.
///
/// # Safety
/// All threads of every one of the launch's `blocks` blocks call it once; `state` on this device,
/// its counter 0 at launch start.
#[inline(always)]
pub unsafe fn arrive_launch(state: *mut ProtocolState, step: Step, direction: Direction, blocks: u32) {
    // SAFETY: the caller's contract; the barrier orders the block's reads of the state before
    // thread 0's release.
    unsafe {
        device::sync_threads();
        if thread::thread_idx_x() == 0 {
            let counter = if direction == Direction::Forces { &raw mut (*state).f_finished } else { &raw mut (*state).x_finished };
            if device::atomic_inc_acq_rel_gpu(counter, blocks - 1) == blocks - 1 {
                record_launch(state, step, direction);
            }
        }
    }
}

/// At the start of a launch, the last thread of pulse `pulse`'s row (idle in the fused kernels,
/// whose grid holds one thread more than a pulse has atoms, so its fence delays no store) gives
/// the credit of the previous launch of this direction: "I have finished reading what you sent me
/// up to step `step.epoch - 1`" (the launch boundary completed those reads), when the pulse sends one
/// ([`pulse_flags::SEND_COORD_CREDIT`] to `recv_pe`, or [`pulse_flags::SEND_FORCE_CREDIT`] to
/// `send_pe`). Sent here, not at the end of the launch that read, so no release waits on the
/// launch's own stores; a sender waits for it only `lag` launches later ([`Step::repeat`]).
/// `puts` as in [`send_credit`].
///
/// # Safety
/// As [`send_credit`] for the pulse's peer; `signals` this rank's slots.
#[inline(always)]
pub unsafe fn send_previous_credit(meta: &PulseMeta, pulse: u32, num_pulses: u32, signals: *mut u64, step: Step, direction: Direction, puts: bool) {
    if thread::block_idx_x() + 1 != thread::grid_dim_x() || thread::thread_idx_x() + 1 != thread::block_dim_x() || step.epoch < 2 {
        return;
    }
    let (flag, kind, remote, pe) = if direction == Direction::Forces {
        (pulse_flags::SEND_FORCE_CREDIT, SignalSlot::ForceCredit, meta.remote_f_credit, meta.send_pe)
    } else {
        (pulse_flags::SEND_COORD_CREDIT, SignalSlot::CoordCredit, meta.remote_x_credit, meta.recv_pe)
    };
    if meta.has(flag) {
        // SAFETY: the caller's contract; the slot is symmetric.
        unsafe { send_credit(remote, signals.add(signal_index(kind, pulse, num_pulses)), step.epoch - 1, pe, puts) };
    }
}

/// One thread tells a peer that this rank has finished with what it sent (a credit SET to the
/// step counter): a `st.release.sys` into the peer's slot when it is mapped (`remote != 0`, always
/// the case when `puts` is false); otherwise a `fence.acq_rel.sys` ([`device::fence_acq_rel_sys`]:
/// with the put after it, a release of every earlier access of this thread and of what it observed,
/// the reads of the data the credit frees included, which `nvshmem_fence` alone does not promise:
/// it orders puts to one PE), an `nvshmem_fence` (puts to `pe` before it land first) and an 8-byte
/// put of the counter into the symmetric `slot` on `pe` (no remote atomic needed).
///
/// # Safety
/// `remote` mapped and valid when nonzero or `puts` is false; otherwise NVSHMEM initialised, this
/// module registered, `slot` a symmetric address valid on `pe`.
#[inline(always)]
pub unsafe fn send_credit(remote: u64, slot: *mut u64, value: u64, pe: i32, puts: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        if remote != 0 || !puts {
            device::store_release_sys_u64(remote as *mut u64, value);
        } else {
            device::fence_acq_rel_sys();
            nvshmem::nvshmem_fence();
            nvshmem::nvshmem_uint64_p(slot, value, pe);
        }
    }
}

/// Delivers a packed pulse once all its data is written: on the direct path one `st.release.sys`
/// of `counter` into the peer's slot (thread 0); on the put path every thread of the block copies
/// `src[0..n]` into the symmetric `dest_symmetric` on `pe` and signals the symmetric
/// `signal_symmetric` there as `mode` says ([`put_and_signal`]).
///
/// # Safety
/// All threads of the block call it together. Direct path: `remote_signal` mapped and valid. Put
/// path: NVSHMEM initialised and this module registered; `dest_symmetric`, `src[0..n]` and
/// `signal_symmetric` symmetric addresses valid on `pe`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn deliver<T: HaloElement>(
    remote_signal: *mut u64,
    direct: bool,
    dest_symmetric: *mut T,
    src: *const T,
    n: u32,
    signal_symmetric: *mut u64,
    counter: u64,
    pe: i32,
    mode: SignalMode,
) {
    if direct {
        if thread::thread_idx_x() == 0 {
            // SAFETY: caller's contract; the block's writes were published to thread 0 by the
            // election (acq-rel) and a barrier, and release.sys is cumulative.
            unsafe { device::store_release_sys_u64(remote_signal, counter) };
        }
    } else {
        // SAFETY: caller's contract.
        unsafe { put_and_signal(dest_symmetric.cast(), src.cast(), n as usize * size_of::<T>(), signal_symmetric, counter, pe, mode) };
    }
}

/// The put path's data and signal, as `mode` says. `PutSignal`: one
/// `putmem_signal_nbi_block(..., NVSHMEM_SIGNAL_SET, counter)`. `FencedPut`: the block's
/// `putmem_nbi_block`, a barrier, then thread 0's `nvshmem_fence` (puts to `pe` before it are
/// delivered before puts after it) and `nvshmem_uint64_p(signal, counter)`. Both deliver the
/// signal after the data; the fenced form needs no remote atomic, and a plain put suffices
/// because the slot only grows and the receiver compares `>=`.
///
/// # Safety
/// All threads of the block call it together; NVSHMEM initialised and this module registered;
/// `dest`, `src[0..bytes]` and `signal` symmetric addresses valid on `pe`.
#[inline(always)]
pub unsafe fn put_and_signal(dest: *mut u8, src: *const u8, bytes: usize, signal: *mut u64, counter: u64, pe: i32, mode: SignalMode) {
    // SAFETY: the caller's contract.
    unsafe {
        match mode {
            SignalMode::PutSignal => {
                nvshmem::nvshmemx_putmem_signal_nbi_block(dest.cast(), src.cast(), bytes, signal, counter, NVSHMEM_SIGNAL_SET, pe)
            }
            SignalMode::FencedPut => {
                nvshmem::nvshmemx_putmem_nbi_block(dest.cast(), src.cast(), bytes, pe);
                device::sync_threads();
                if thread::thread_idx_x() == 0 {
                    nvshmem::nvshmem_fence();
                    nvshmem::nvshmem_uint64_p(signal, counter, pe);
                }
            }
        }
    }
}

/// Grid-stride copy of `bytes` (a multiple of 4) from `src` (4-byte aligned) to `dst` (16-byte
/// aligned, local or a peer's), by the threads `first .. first + stride` of this launch's rows:
/// 16-byte vector stores for the whole chunks, then single words for the rest. Consecutive threads
/// store consecutive 16-byte chunks, so a warp writes 512 contiguous bytes per instruction.
///
/// # Safety
/// Both ranges valid and not overlapping; the alignments above.
#[inline(always)]
pub unsafe fn copy_words(dst: *mut u8, src: *const u8, bytes: u32, first: u32, stride: u32) {
    let (src_words, dst_words) = (src as *const u32, dst as *mut u32);
    let chunks = bytes / 16;
    let mut c = first;
    while c < chunks {
        // SAFETY: chunk `c` lies inside both ranges; `dst` chunks are 16-byte aligned.
        unsafe {
            let w = src_words.add(4 * c as usize);
            let v = [*w, *w.add(1), *w.add(2), *w.add(3)];
            device::store_global_v4_b32(dst_words.add(4 * c as usize) as *mut [u32; 4], v);
        }
        c += stride;
    }
    let tail = (bytes % 16) / 4;
    if first < tail {
        let i = (4 * chunks + first) as usize;
        // SAFETY: word `i` lies inside both ranges.
        unsafe { *dst_words.add(i) = *src_words.add(i) };
    }
}
