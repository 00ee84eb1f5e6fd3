//! The host's bounded waits on an exchange's streams: progress from the rank's step
//! counters, read on a side stream so that a stuck halo stream cannot block the read, and the
//! error that names what was stuck.
//!
//! A stream that is stuck makes its exchange unusable ([`StateWatch::usable`]: every later wait
//! or launch fails at once with [`HaloError::ExchangeStuck`]) and its GPU context *stuck*
//! (`gpu::stuck`) for as long as the work it had then has not ended: device memory and modules
//! on it are leaked instead of freed when dropped meanwhile, because freeing waits for the kernel.
//! The process goes on; the program decides whether to end (the `halo` command does, with exit
//! code 86).

use super::Transport;
pub use crate::desc::wait::{DeviceSnapshot, StuckStream};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::wait::{WaitOutcome, poll_until_done, stream_idle};
use crate::gpu::{CudaContext, CudaStream};
use crate::watchdog::{self, steps};
use cudarc::driver::sys;
use kernels_gpu::abi::{ProtocolState, WaitStatus};
use std::sync::Arc;
use std::time::Duration;

/// The variable that overrides the budget of a host wait (seconds without progress).
pub const HOST_WAIT_ENV: &str = "HALO_HOST_WAIT_TIMEOUT_S";

/// How much longer than the device wait deadline a host wait waits without progress by default:
/// a healthy kernel ends (or gives up) within the device deadline.
pub const HOST_WAIT_MARGIN: Duration = Duration::from_secs(3);

/// How much longer the watchdog gives a host wait than its own budget: it only fires when a driver
/// call inside the wait's loop blocks.
pub const BACKSTOP_MARGIN: Duration = Duration::from_secs(2);

/// The budget of a host wait: [`HOST_WAIT_ENV`] seconds when set (and valid), else the device wait
/// deadline plus [`HOST_WAIT_MARGIN`].
pub fn host_wait_budget(device_wait: Duration, env_value: Option<&str>) -> Duration {
    env_value
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= 1e6)
        .map_or(device_wait + HOST_WAIT_MARGIN, Duration::from_secs_f64)
}

const STATE_BYTES: usize = size_of::<ProtocolState>();
const STATUS_OFFSET: usize = STATE_BYTES.next_multiple_of(16);
const SNAPSHOT_BYTES: usize = STATUS_OFFSET + size_of::<WaitStatus>();

/// Reads a rank's protocol state and wait status into pinned host memory on a stream of its own
/// (non-blocking, so it runs beside a halo stream that is stuck), without ever blocking the host.
pub struct StateWatch {
    stream: Arc<CudaStream>,
    host: *mut u8,
    pending: bool,
    /// Set when a wait found the exchange's stream stuck: the rank and the error's text.
    stuck: Option<(usize, String)>,
}

// SAFETY: the pinned buffer is owned by this value and only touched through `&mut self`.
unsafe impl Send for StateWatch {}
// SAFETY: `&StateWatch` exposes nothing.
unsafe impl Sync for StateWatch {}

impl StateWatch {
    /// A side stream and a pinned buffer on `ctx`.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        let stream = ctx.new_stream().during("creating the progress stream")?;
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        ctx.bind_to_thread().during("binding the context")?;
        // SAFETY: allocates SNAPSHOT_BYTES of page-locked host memory.
        unsafe { sys::cuMemAllocHost_v2(&mut host, SNAPSHOT_BYTES) }.result().during("allocating pinned memory")?;
        Ok(Self { stream, host: host.cast(), pending: false, stuck: None })
    }

    /// `Ok` unless a wait found this exchange's stream stuck: then [`HaloError::ExchangeStuck`]
    /// (its kernels never end, so no later launch or wait can succeed).
    pub fn usable(&self) -> Result<()> {
        match &self.stuck {
            None => Ok(()),
            Some((rank, why)) => Err(HaloError::ExchangeStuck { rank: *rank, why: why.clone() }),
        }
    }

    /// The snapshot of the copy started by the previous call, if it has landed; otherwise starts
    /// one (from `state` and `status`, device addresses) and returns `None`. Never blocks.
    pub fn sample(&mut self, state: u64, status: u64) -> Option<DeviceSnapshot> {
        if self.pending {
            if !stream_idle(&self.stream).ok()? {
                return None;
            }
            self.pending = false;
            return Some(self.read());
        }
        let s = self.stream.cu_stream();
        // SAFETY: both copies write inside the pinned buffer from live device buffers of the
        // given sizes; the buffer is read only after the stream reports them done.
        let started = unsafe {
            sys::cuMemcpyDtoHAsync_v2(self.host.cast(), state, STATE_BYTES, s).result().is_ok()
                && sys::cuMemcpyDtoHAsync_v2(self.host.add(STATUS_OFFSET).cast(), status, size_of::<WaitStatus>(), s).result().is_ok()
        };
        self.pending = started;
        None
    }

    /// Samples until a snapshot lands or `within` passes (for error messages).
    pub fn snapshot(&mut self, state: u64, status: u64, within: Duration) -> Option<DeviceSnapshot> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(s) = self.sample(state, status) {
                return Some(s);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn read(&self) -> DeviceSnapshot {
        // SAFETY: the copies into these bytes completed (the stream is idle); the buffer is
        // aligned (page-locked allocations are page aligned) and the types are plain data.
        let (state, status) = unsafe {
            (std::ptr::read_volatile(self.host.cast::<ProtocolState>()), std::ptr::read_volatile(self.host.add(STATUS_OFFSET).cast::<WaitStatus>()))
        };
        DeviceSnapshot { x_epoch: state.x_epoch, f_epoch: state.f_epoch, x_finished: state.x_finished, status }
    }
}

impl Drop for StateWatch {
    fn drop(&mut self) {
        if self.stuck.is_some() || (self.pending && !stream_idle(&self.stream).unwrap_or(false)) {
            return; // a copy may still land: leak the 64 bytes rather than free them under it
        }
        if crate::gpu::stuck::context_stuck(self.stream.context()) {
            return; // another rank's stream is stuck: cuMemFreeHost would wait for the whole device
        }
        // SAFETY: allocated by cuMemAllocHost and not in use.
        let _ = unsafe { sys::cuMemFreeHost(self.host.cast()) };
    }
}

/// A short name of a launch for [`StuckStream::last_launch`].
pub fn launch_name(transport: Transport, forces: bool) -> String {
    format!("{} halo ({})", if forces { "force" } else { "coordinate" }, transport.name())
}

/// The parts of a rank a bounded wait needs.
pub struct WaitTarget<'a> {
    /// Its protocol state and wait status (device addresses).
    pub state: u64,
    /// See `state`.
    pub status: u64,
    /// Its side-stream reader.
    pub watch: &'a mut StateWatch,
    /// The budget without progress.
    pub budget: Duration,
}

/// Waits for `stream` with [`poll_until_done`], progress from the rank's counters, and a watchdog
/// backstop (a driver call inside the loop that blocks is reported: [`watchdog::arm`]). On expiry
/// returns [`HaloError::StreamStuck`] (built by `describe`) and marks the exchange
/// ([`StateWatch::usable`]) and the stream's context (`gpu::stuck`) stuck. An exchange
/// already stuck fails at once.
pub fn wait_stream(
    stream: &CudaStream,
    target: WaitTarget<'_>,
    describe: impl FnOnce(Duration, Duration, Option<DeviceSnapshot>) -> StuckStream,
) -> Result<()> {
    target.watch.usable()?;
    stream.context().bind_to_thread().during("binding the context")?;
    let backstop = target.budget + BACKSTOP_MARGIN;
    let guard = watchdog::arm(steps::HOST_WAIT, backstop);
    let (state, status, watch) = (target.state, target.status, target.watch);
    let outcome =
        poll_until_done(|| stream_idle(stream), || watch.sample(state, status).map(|s| s.progress()), target.budget, Some((&guard, backstop)))?;
    match outcome {
        WaitOutcome::Done(_) => Ok(()),
        WaitOutcome::Expired { waited, since_progress } => {
            let device = watch.snapshot(state, status, Duration::from_millis(200));
            let stuck = describe(waited, since_progress, device);
            drop(guard);
            watch.stuck = Some((stuck.rank, stuck.to_string()));
            crate::gpu::stuck::mark(stream);
            Err(HaloError::StreamStuck(Box::new(stuck)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels_gpu::abi::WaitKind;

    #[test]
    fn the_budget_is_the_device_deadline_plus_a_margin_unless_set() {
        let five = Duration::from_secs(5);
        assert_eq!(host_wait_budget(five, None), Duration::from_secs(8));
        assert_eq!(host_wait_budget(five, Some("2.5")), Duration::from_millis(2500));
        assert_eq!(host_wait_budget(five, Some("zero")), Duration::from_secs(8));
        assert_eq!(host_wait_budget(five, Some("-1")), Duration::from_secs(8));
    }

    #[test]
    fn a_stuck_stream_names_the_rank_the_launch_the_path_and_what_the_gpu_holds() {
        let mut status = WaitStatus::default();
        let mut stuck = StuckStream {
            rank: 1,
            what: "waiting for the halo stream".into(),
            waited: Duration::from_secs(12),
            since_progress: Duration::from_secs(10),
            last_launch: Some(launch_name(Transport::Fused, false)),
            path: "NVSHMEM puts for 1 of 1 pulses through NVSHMEM's proxy thread and remote transport `ucx` (put-signal signalling)".into(),
            device: Some(DeviceSnapshot { x_epoch: 3, f_epoch: 2, x_finished: 0, status }),
            nvshmem: Some("NVSHMEM init status 2".into()),
        };
        let m = stuck.to_string();
        for part in [
            "rank 1: nothing moved for 10.0 s",
            "coordinate halo (fused)",
            "`ucx`",
            "put-signal",
            "3 coordinate and 2 force",
            "no halo wait has expired",
            "proxy.cpp",
            "NVSHMEM init status 2",
        ] {
            assert!(m.contains(part), "missing {part:?} in {m}");
        }
        status.timed_out = 1;
        status.peer = 0;
        status.expected = 4;
        status.kind = WaitKind::CoordSignal as u32;
        stuck.device = Some(DeviceSnapshot { x_epoch: 3, f_epoch: 3, x_finished: 0, status });
        let m = stuck.to_string();
        assert!(m.contains("a device wait expired: rank 1 waited") && m.contains("from rank 0 at step 4"), "{m}");
        stuck.device = None;
        assert!(stuck.to_string().contains("could not be read"));
    }

    #[test]
    fn progress_changes_with_every_counter() {
        let s = DeviceSnapshot { x_epoch: 1, f_epoch: 1, x_finished: 0, status: WaitStatus::default() };
        let moved = [DeviceSnapshot { x_epoch: 2, ..s }, DeviceSnapshot { f_epoch: 2, ..s }, DeviceSnapshot { x_finished: 1, ..s }];
        for m in moved {
            assert_ne!(m.progress(), s.progress(), "{m:?}");
        }
    }
}
