//! What a halo wait that gave up reports: a device spin-wait that expired ([`WaitTimeout`]), a
//! host wait on a stream that saw no progress ([`StuckStream`], with the [`DeviceSnapshot`] it
//! read), and the bounds the waits and delays around them keep.

use kernels_gpu::abi::{WaitKind, WaitStatus};
use std::time::Duration;

/// The longest jitter delay accepted, in microseconds (1 s): a longer one would look like a dead
/// peer to a device wait with the default 5 s deadline after a few delayed steps in a row. The
/// exchange's jitter and the GPU delay kernel are both capped at it.
pub const JITTER_MAX_US: u32 = 1_000_000;

/// What the GPU holds for one rank, read while its kernels may still run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSnapshot {
    /// Coordinate halos completed.
    pub x_epoch: u64,
    /// Force halos completed.
    pub f_epoch: u64,
    /// Pulses of the running coordinate launch delivered (per-pulse launches move it).
    pub x_finished: u32,
    /// The first expired device wait, if any.
    pub status: WaitStatus,
}

impl DeviceSnapshot {
    /// A number that changes whenever a launch of this rank completes a pulse or a direction.
    pub fn progress(&self) -> u64 {
        self.x_epoch.wrapping_mul(1_000_003).wrapping_add(self.f_epoch.wrapping_mul(7)).wrapping_add(u64::from(self.x_finished))
    }
}

/// A device spin-wait that expired: which rank waited for what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitTimeout {
    /// The rank whose kernel gave up.
    pub rank: usize,
    /// The rank whose signal never came (-1: blocks of the same launch).
    pub peer: i32,
    /// Flat pulse index.
    pub pulse: u32,
    /// What was awaited.
    pub kind: Option<WaitKind>,
    /// The signal value the step needed (the step counter).
    pub step_counter: u64,
    /// The value last seen.
    pub seen: u64,
    /// How long it waited.
    pub waited_ns: u64,
}

impl std::fmt::Display for WaitTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let waited = self.waited_ns as f64 * 1e-9;
        let seen = if self.seen == kernels_gpu::abi::SIGNAL_UNSET { "never set".to_string() } else { self.seen.to_string() };
        let (rank, peer, pulse, counter) = (self.rank, self.peer, self.pulse, self.step_counter);
        match self.kind {
            Some(WaitKind::CoordCredit) | Some(WaitKind::ForceCredit) => {
                let what = if self.kind == Some(WaitKind::CoordCredit) { "read the coordinates" } else { "accumulate the forces" };
                // Which step the sender was about to send depends on the pulse's slots (the next
                // one, or the one after for low-latency words, which alternate two): not said.
                write!(
                    f,
                    "rank {rank} waited {waited:.1} s for rank {peer} to {what} of pulse {pulse} of step {counter}, whose memory its next send \
                     reuses (credit {seen}, expected {counter})"
                )
            }
            kind => {
                let what = match kind {
                    Some(WaitKind::CoordSignal) => "the coordinate halo",
                    Some(WaitKind::ForceSignal) => "the force halo",
                    _ => "other blocks of the force halo",
                };
                write!(
                    f,
                    "rank {rank} waited {waited:.1} s for pulse {pulse} of {what} from rank {peer} at step {counter} (signal {seen}, expected {counter})"
                )
            }
        }
    }
}

/// A host wait on a rank's stream that saw no progress for its whole budget: the stream is stuck
/// where no halo deadline reaches (most likely inside NVSHMEM, when its proxy thread died).
#[derive(Clone, Debug)]
pub struct StuckStream {
    /// The rank whose stream is stuck.
    pub rank: usize,
    /// What the host was waiting for.
    pub what: String,
    /// How long it waited in all.
    pub waited: Duration,
    /// How long nothing moved.
    pub since_progress: Duration,
    /// The last launch on the stream, e.g. `coordinate halo (fused)`.
    pub last_launch: Option<String>,
    /// How the rank's pulses reach their peers (see `RankExchange::path_description`).
    pub path: String,
    /// What the GPU held when the wait gave up (`None`: the side read did not land either).
    pub device: Option<DeviceSnapshot>,
    /// NVSHMEM's state, when the rank is a PE.
    pub nvshmem: Option<String>,
}

impl std::fmt::Display for StuckStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {}: nothing moved for {:.1} s while {}", self.rank, self.since_progress.as_secs_f64(), self.what)?;
        write!(f, " (waited {:.1} s; last launch: {}", self.waited.as_secs_f64(), self.last_launch.as_deref().unwrap_or("none"))?;
        write!(f, "; path: {}", self.path)?;
        match &self.device {
            Some(d) => {
                write!(f, "; step counters on the GPU: {} coordinate and {} force halos completed", d.x_epoch, d.f_epoch)?;
                if d.status.timed_out != 0 {
                    let t = WaitTimeout {
                        rank: self.rank,
                        peer: d.status.peer,
                        pulse: d.status.pulse,
                        kind: WaitKind::from_u32(d.status.kind),
                        step_counter: d.status.expected,
                        seen: d.status.seen,
                        waited_ns: d.status.waited_ns,
                    };
                    write!(f, "; a device wait expired: {t}")?;
                } else {
                    write!(f, "; no halo wait has expired on the GPU")?;
                }
            }
            None => write!(f, "; the GPU's counters could not be read either")?,
        }
        if let Some(n) = &self.nvshmem {
            write!(f, "; {n}")?;
        }
        write!(
            f,
            "). A kernel is stuck where no halo deadline reaches it, most likely inside NVSHMEM (a proxy thread or \
             remote transport that died: look above for NVSHMEM's own messages, e.g. `proxy.cpp ... aborting`). \
             The exchange cannot be used again, and its GPU memory stays allocated until the process ends"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credit_timeout_names_the_step_read_and_no_step_it_cannot_know() {
        let t = WaitTimeout {
            rank: 0,
            peer: 2,
            pulse: 1,
            kind: Some(WaitKind::CoordCredit),
            step_counter: 5,
            seen: kernels_gpu::abi::SIGNAL_UNSET,
            waited_ns: 1_500_000_000,
        };
        let m = t.to_string();
        assert!(m.contains("rank 0 waited 1.5 s for rank 2 to read the coordinates of pulse 1 of step 5,"), "{m}");
        assert!(m.contains("credit never set, expected 5") && !m.contains("step 6"), "a word pulse's sender is two steps on, not one: {m}");
        let f = WaitTimeout { kind: Some(WaitKind::ForceCredit), seen: 4, ..t };
        assert!(f.to_string().contains("to accumulate the forces of pulse 1 of step 5") && f.to_string().contains("credit 4"), "{f}");
    }
}
