//! The timeline probe's launches (where do the microseconds of a halo go?): the fused
//! coordinate and force kernels instantiated with `%globaltimer` stamps (`fused_coords_timeline`,
//! `fused_forces_timeline`, `Float3` only), which run the same protocol as the exchange's own and
//! interoperate with it step for step, and the timer's resolution. Record layout:
//! [`kernels_gpu::abi::timeline`]; the analysis is `halo timeline` (halo-cli's `bench::timeline`).

use super::RankExchange;
use crate::error::{CudaContextExt, HaloError, Result};
use crate::exchange::Transport;
use crate::gpu::{CudaContext, CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape};
use crate::kernel_args;
use kernels_gpu::abi::Float3;
use kernels_gpu::abi::timeline::{self as layout, RECORD_WORDS, RESOLUTION_WORDS};
use std::sync::Arc;

/// One stamped launch: [`RECORD_WORDS`] times in ns of `%globaltimer` (layout in
/// [`kernels_gpu::abi::timeline`]).
pub type Record = [u64; RECORD_WORDS];

/// Most records a ring holds (64 Ki records of 256 bytes: 16 MiB).
pub const MAX_RECORDS: usize = 1 << 16;

/// A ring of records on one rank's GPU, one per step of one direction: launch `n` writes record
/// `epoch % records`, so a run of at most `records` launches leaves one record per launch.
pub struct TimelineRing {
    buf: DeviceBuffer<u64>,
    records: u32,
}

impl TimelineRing {
    /// Room for at least `launches` launches (rounded up to a power of two, at most [`MAX_RECORDS`]),
    /// cleared.
    pub fn new(ctx: &Arc<CudaContext>, launches: usize) -> Result<Self> {
        if launches == 0 || launches > MAX_RECORDS {
            return Err(HaloError::InvalidInput(format!("a timeline ring holds 1 to {MAX_RECORDS} launches, {launches} asked for: run fewer steps")));
        }
        let records = launches.next_power_of_two();
        let ring = Self { buf: DeviceBuffer::uninit(ctx, records * RECORD_WORDS)?, records: records as u32 };
        ring.clear()?;
        Ok(ring)
    }

    /// Records in the ring.
    pub fn records(&self) -> usize {
        self.records as usize
    }

    /// Resets every record to "nothing stamped" ([`layout::initial_record`]) and waits until the
    /// reset has landed. Call it while the rank's stream is idle.
    pub fn clear(&self) -> Result<()> {
        let fresh: Vec<u64> = (0..self.records()).flat_map(|_| layout::initial_record()).collect();
        self.buf.copy_from_host(&fresh)?;
        // A copy from pageable memory may return before it reached the GPU; the exchange's streams
        // are not ordered after it, so wait for the whole context.
        self.buf.context().synchronize().during("clearing a timeline ring")
    }

    /// The records launches wrote since the last [`Self::clear`], in ring order (not time order).
    /// Call it after the rank's stream is idle.
    pub fn read(&self) -> Result<Vec<Record>> {
        let words = self.buf.to_host()?;
        Ok(words
            .chunks_exact(RECORD_WORDS)
            .filter(|r| r[layout::ENTRY_FIRST] != u64::MAX)
            .map(|r| r.try_into().unwrap_or([0; RECORD_WORDS]))
            .collect())
    }
}

impl RankExchange<Float3> {
    /// [`Self::launch_coordinates`] with the fused transport, stamped into `ring` (on this rank's
    /// GPU). The same protocol: steps may mix stamped and plain launches.
    pub fn launch_coordinates_timeline(&mut self, stream: &CudaStream, ring: &TimelineRing) -> Result<()> {
        let n = self.halo.pulses.len() as u32;
        if n == 0 {
            return Ok(());
        }
        self.check_metadata()?;
        let (mut meta, mut pulses, mut x, mut signals, mut state) =
            (self.meta.device_ptr(), n, self.x.device_ptr(), self.signals.device_ptr(), self.state.device_ptr());
        let (mut counters, mut dep, mut timeout, mut status) =
            (self.counters.device_ptr(), self.halo.home_atoms as u32, self.timeout_ns, self.status.device_ptr());
        let (mut ring_ptr, mut records) = (ring.buf.device_ptr(), ring.records);
        self.last_launch = Some((Transport::Fused, false));
        let mut args = kernel_args![meta, pulses, x, signals, state, counters, dep, timeout, status, ring_ptr, records];
        // SAFETY: arguments match `fused_coords_timeline` (`fused_coords` plus the ring); metadata
        // from `install`; the ring holds `records` records. Launched as the exchange launches
        // `fused_coords`: overlapping the previous kernel, which it waits for first thing.
        unsafe { self.launch_fused(layout::FUSED_COORDS_TIMELINE, self.coord_shape(), stream, &mut args) }
    }

    /// [`Self::launch_forces`], stamped into `ring`.
    pub fn launch_forces_timeline(&mut self, stream: &CudaStream, ring: &TimelineRing) -> Result<()> {
        let n = self.halo.pulses.len() as u32;
        if n == 0 {
            return Ok(());
        }
        self.check_metadata()?;
        let (mut meta, mut pulses, mut f, mut signals, mut state) =
            (self.meta.device_ptr(), n, self.f.device_ptr(), self.signals.device_ptr(), self.state.device_ptr());
        let (mut counters, mut timeout, mut status) = (self.counters.device_ptr(), self.timeout_ns, self.status.device_ptr());
        let (mut ring_ptr, mut records) = (ring.buf.device_ptr(), ring.records);
        self.last_launch = Some((self.last_launch.map_or(Transport::Fused, |(t, _)| t), true));
        let mut args = kernel_args![meta, pulses, f, signals, state, counters, timeout, status, ring_ptr, records];
        let shape = LaunchShape { grid: (self.grids.forces(), n), block: kernels_gpu::abi::BLOCK_SIZE, shared_bytes: 0 };
        // SAFETY: arguments match `fused_forces_timeline`; as above.
        unsafe { self.launch_fused(layout::FUSED_FORCES_TIMELINE, shape, stream, &mut args) }
    }
}

/// What `globaltimer_resolution` saw of `%globaltimer` on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerResolution {
    /// Smallest nonzero step between two consecutive reads (ns); `None` if the timer never moved.
    pub smallest_step_ns: Option<u64>,
    /// Largest step (ns).
    pub largest_step_ns: u64,
    /// Changes seen.
    pub changes: u64,
    /// Time from the first read to the last (ns).
    pub span_ns: u64,
}

impl TimerResolution {
    /// From the kernel's words.
    pub fn from_words(w: [u64; RESOLUTION_WORDS]) -> Self {
        Self { smallest_step_ns: (w[0] != u64::MAX).then_some(w[0]), largest_step_ns: w[1], changes: w[2], span_ns: w[3] }
    }

    /// Mean time between changes (ns): the timer's update period.
    pub fn mean_step_ns(&self) -> Option<f64> {
        (self.changes > 0).then(|| self.span_ns as f64 / self.changes as f64)
    }
}

/// Most polls [`globaltimer_resolution`] takes (about 10 ms of reads).
pub const MAX_RESOLUTION_POLLS: u32 = 1 << 20;

/// Reads `%globaltimer` `polls` times back to back in one GPU thread (capped at
/// [`MAX_RESOLUTION_POLLS`]) and reports its steps; waits for the result.
pub fn globaltimer_resolution(module: &KernelModule, stream: &CudaStream, polls: u32) -> Result<TimerResolution> {
    let out = DeviceBuffer::<u64>::zeroed(module.context(), RESOLUTION_WORDS)?;
    let (mut out_ptr, mut polls) = (out.device_ptr(), polls.min(MAX_RESOLUTION_POLLS));
    let mut args = kernel_args![out_ptr, polls];
    let shape = LaunchShape { grid: (1, 1), block: 1, shared_bytes: 0 };
    // SAFETY: `globaltimer_resolution(out, polls)` writes RESOLUTION_WORDS words of `out`.
    unsafe { module.launch(layout::GLOBALTIMER_RESOLUTION, shape, stream, &mut args)? };
    stream.synchronize().during("reading the timer's resolution")?;
    let w = out.to_host()?;
    Ok(TimerResolution::from_words([w[0], w[1], w[2], w[3]]))
}
