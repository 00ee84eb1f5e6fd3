//! Probes of what the hardware allows, for the benchmarks' floor: the one-way latency of a
//! release/acquire signal between two GPUs (or two ranks on one GPU).

use super::common::{WaitSite, wait_signal};
use crate::abi::{WaitKind, WaitStatus};
use crate::device;

kernel! {
    /// Ping-pong of `rounds` round trips, launched with one thread on each side. The initiator
    /// stores `i` into the peer's flag and waits until its own reaches `i`; the responder waits for
    /// `i` and answers with `i`. Both flags start below 1. One-way latency = elapsed / (2 * rounds).
    /// The waits are [`wait_signal`], the exchange's own wait, so the probe measures exactly the
    /// signal hop every pulse of the exchange pays.
    fn signal_ping_pong(own_flag: *mut u64, peer_flag: *mut u64, rounds: u32, initiator: u32, timeout_ns: u64, status: *mut WaitStatus) {
        let site = WaitSite { pulse: 0, kind: WaitKind::CoordSignal, peer: -1 };
        for i in 1..=rounds as u64 {
            // SAFETY: both flags are valid, mapped 8-byte slots (the host passes them).
            unsafe {
                if initiator != 0 {
                    device::store_release_sys_u64(peer_flag, i);
                    if !wait_signal(own_flag, i, timeout_ns, status, site) {
                        return;
                    }
                } else {
                    if !wait_signal(own_flag, i, timeout_ns, status, site) {
                        return;
                    }
                    device::store_release_sys_u64(peer_flag, i);
                }
            }
        }
    }
}
