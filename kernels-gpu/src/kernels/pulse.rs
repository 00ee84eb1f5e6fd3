//! The seed's first design: one kernel per coordinate pulse that packs, meets at a device-wide
//! barrier, delivers the pulse to its peer and waits for its own incoming pulse before it ends.
//! Launched pulse after pulse in stream order, so later pulses see earlier pulses' atoms without
//! any dependency wait inside the kernel.

use super::common::{WaitSite, arrive_is_last_block, deliver, pack_subset, shift_of, wait_signal};
use crate::abi::{HaloElement, PackMode, PulseMeta, WaitKind, WaitStatus};
use crate::device::thread;

/// Pulse `pulse` of the forward (coordinate) halo. `direct`: pack straight into the peer's array
/// (`remote_x`, reachable by stores over NVLink or on the same GPU), then one `st.release.sys` of
/// `counter` into the peer's slot. Otherwise pack into the local symmetric staging slot and the
/// last block puts it (`putmem_signal_nbi_block`) into the peer's `x` at `peer_atom_offset`,
/// signal SET to `counter`. The kernel ends once this rank's own slot `signals[pulse]` holds
/// `counter`, i.e. its incoming halo has landed. `arrive` is a per-pulse zeroed counter that
/// wraps back to 0 by itself.
///
/// # Safety
/// Metadata from a validated plan; direct: peer addresses mapped; put: NVSHMEM initialised and
/// the module registered, `x` and `signals` symmetric.
#[inline(always)]
pub unsafe fn pulse_exchange<T: HaloElement>(
    pulses: *const PulseMeta,
    pulse: u32,
    x: *mut T,
    signals: *mut u64,
    counter: u64,
    arrive: *mut u32,
    timeout_ns: u64,
    status: *mut WaitStatus,
    direct: bool,
) {
    // SAFETY: the host passes a valid metadata array with at least `pulse + 1` entries.
    let meta = unsafe { &*pulses.add(pulse as usize) };
    let dest = if direct { meta.remote_x } else { meta.send_buf } as *mut T;
    let map = meta.index_map as *const u32;
    // SAFETY: map/x/dest valid per the plan the host validated.
    unsafe { pack_subset(x, map, meta.send_size, dest, shift_of(meta), PackMode::All, 0) };
    // SAFETY: all threads call it; `arrive` is this pulse's zeroed device counter.
    if unsafe { arrive_is_last_block(arrive) } {
        let own_slot = unsafe { signals.add(pulse as usize) };
        // SAFETY: all threads of the last block call it; pointers from the validated plan.
        unsafe {
            deliver(
                meta.remote_x_signal as *mut u64,
                direct,
                x.add(meta.peer_atom_offset as usize),
                dest,
                meta.send_size,
                own_slot,
                counter,
                meta.send_pe,
            )
        };
        if thread::thread_idx_x() == 0 {
            let site = WaitSite { pulse, kind: WaitKind::CoordSignal, peer: meta.recv_pe };
            // SAFETY: own_slot is this rank's receive-X slot for the pulse.
            unsafe { wait_signal(own_slot, counter, timeout_ns, status, site) };
        }
    }
}
