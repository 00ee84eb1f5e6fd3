//! The hardware floor: what the GPUs and links allow, measured in the same run as the exchange,
//! and the floor each variant's bytes and signal chain imply.
//!
//! # Measured quantities
//! - `L`, one-way signal latency: [`abi::SIGNAL_PING_PONG`], one thread per side, a
//!   `st.release.sys` store into the peer's flag answered by the peer; `elapsed / (2 * rounds)`.
//! - `BW_peer`, peer bandwidth: one large `cuMemcpyAsync` from one GPU (or PE) to the other,
//!   `bytes / time` (bytes crossing the link once).
//! - `BW_dev`, device copy bandwidth: one large device-to-device copy on one GPU,
//!   `2 * bytes / time` (every byte is read once and written once).
//! - `T_launch`, kernel-launch overhead: back-to-back launches of `pack_coords` with `n = 0` on one
//!   stream, GPU time between events / launches (the rate the stream can start kernels); the host
//!   time per launch call is reported beside it.
//! - `T_graph`, graph-launch overhead: the same empty launch captured as a one-node graph,
//!   replayed back to back, GPU time / replays.
//! - `T_sync`, host synchronisation: an empty launch followed by `cuStreamSynchronize`, host wall
//!   time per round (what each host sync of the staged path costs at least).
//!
//! # Floor of one direction (coordinates or forces) of one step
//! With `B` the bytes a rank sends in that direction per step (the largest over ranks), `P` the
//! pulses (each pulse's signal can only leave after the previous pulse's data arrived, so the
//! signal chain is `P` hops long), and `T(B)` the time to move `B` bytes
//! (`B / BW_peer` between GPUs, `2 B / BW_dev` between ranks sharing a GPU):
//!
//! | variant | floor |
//! |---|---|
//! | `fused`, `fused-tma` | `T_launch + max(T(B), P * L)` |
//! | `per-pulse`, `per-pulse-direct` | `P * T_launch + max(T(B), P * L)` |
//! | `nccl` | `2 P * T_launch + max(T(B), P * L)` (a pack or unpack kernel and an NCCL kernel per pulse) |
//! | `staged` | `P * (T_launch + 2 * T_sync) + T(B)` (two host syncs per pulse) |
//! | `+graph` | as without, `T_launch` replaced by `T_graph / K` (K steps per replay; the bench captures one step, K = 1) |
//!
//! The step floor is the sum of both directions. These are lower bounds: they assume the data
//! moves at full link speed from the first byte and that nothing else runs.

use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaContext, CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape};
use crate::kernel_args;
use kernels_gpu::abi::{self, WaitStatus};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Instant;

use super::Method;
use super::stats::Summary;

/// The measured floor, in seconds and bytes per second (medians over repeats are used in the
/// formulas; the summaries are reported).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FloorInputs {
    /// One-way signal latency `L` (s).
    pub one_way_latency_s: f64,
    /// Peer bandwidth `BW_peer` (B/s); `None` when all ranks share one GPU.
    pub peer_bw: Option<f64>,
    /// Device copy bandwidth `BW_dev` (B/s, bytes read plus bytes written).
    pub device_bw: f64,
    /// Kernel-launch overhead `T_launch` (s, GPU timeline).
    pub launch_s: f64,
    /// Graph-launch overhead `T_graph` (s, GPU timeline).
    pub graph_launch_s: f64,
    /// Host synchronisation round trip `T_sync` (s).
    pub host_sync_s: f64,
}

/// Where a rank's halo partners are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Link {
    /// Every rank pair shares one GPU: halo bytes are device-local copies.
    SameGpu,
    /// Ranks on different GPUs: halo bytes cross NVLink (or PCIe).
    Peer,
}

/// What a variant moves per step, the input of the floor formulas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HaloShape {
    /// Coordinate bytes a rank sends per step (largest over ranks).
    pub bytes_x: u64,
    /// Force bytes a rank sends per step (largest over ranks).
    pub bytes_f: u64,
    /// Pulses per step (the signal chain length).
    pub pulses: usize,
    /// Where the partners are.
    pub link: Link,
    /// Steps per captured graph (for `+graph` variants).
    pub steps_per_graph: usize,
}

/// The floor of one variant: coordinates, forces and the whole step (s).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantFloor {
    /// Coordinate halo floor (s).
    pub coords_s: f64,
    /// Force halo floor (s).
    pub forces_s: f64,
    /// Step floor: both directions (s).
    pub step_s: f64,
}

impl FloorInputs {
    /// Time to move `bytes` over `link` (s).
    pub fn transfer_s(&self, bytes: u64, link: Link) -> f64 {
        let b = bytes as f64;
        match (link, self.peer_bw) {
            (Link::Peer, Some(bw)) if bw > 0.0 => b / bw,
            // Ranks sharing a GPU (or no peer measurement): a device copy reads and writes each byte.
            _ => 2.0 * b / self.device_bw,
        }
    }

    /// The floor of one direction moving `bytes` in `shape.pulses` pulses (see the module docs).
    pub fn direction_s(&self, method: Method, graph: bool, bytes: u64, shape: &HaloShape) -> f64 {
        let p = shape.pulses.max(1) as f64;
        let launch = if graph { self.graph_launch_s / shape.steps_per_graph.max(1) as f64 } else { self.launch_s };
        let data = self.transfer_s(bytes, shape.link);
        let chain = p * self.one_way_latency_s;
        match method {
            Method::Fused | Method::FusedTma => launch + data.max(chain),
            Method::PerPulse | Method::PerPulseDirect => p * launch + data.max(chain),
            Method::Nccl => 2.0 * p * launch + data.max(chain),
            Method::Staged => p * (launch + 2.0 * self.host_sync_s) + data,
        }
    }

    /// The floor of a variant on `shape`.
    pub fn variant(&self, method: Method, graph: bool, shape: &HaloShape) -> VariantFloor {
        let coords_s = self.direction_s(method, graph, shape.bytes_x, shape);
        let forces_s = self.direction_s(method, graph, shape.bytes_f, shape);
        VariantFloor { coords_s, forces_s, step_s: coords_s + forces_s }
    }
}

/// A timing event (cudarc's default events have timing switched off).
pub fn timing_event(stream: &CudaStream) -> Result<cudarc::driver::CudaEvent> {
    stream.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).during("recording a timing event")
}

/// Seconds between two events recorded on `stream` around the work `f` enqueues.
pub fn time_on_stream(stream: &CudaStream, f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let start = timing_event(stream)?;
    f()?;
    let end = timing_event(stream)?;
    Ok(start.elapsed_ms(&end).during("reading a timing event")? as f64 * 1e-3)
}

/// A launch of `pack_coords` that packs nothing: the cheapest real kernel of the module.
pub struct EmptyLaunch {
    module: Arc<KernelModule>,
    scratch: DeviceBuffer<u32>,
}

impl EmptyLaunch {
    /// Prepares the launch on `module`'s GPU.
    pub fn new(module: Arc<KernelModule>) -> Result<Self> {
        let scratch = DeviceBuffer::zeroed(module.context(), 16)?;
        Ok(Self { module, scratch })
    }

    /// Enqueues one empty launch on `stream`.
    pub fn launch(&self, stream: &CudaStream) -> Result<()> {
        let p = self.scratch.device_ptr();
        let (mut x, mut map, mut n, mut out) = (p, p, 0u32, p);
        let (mut sx, mut sy, mut sz, mut use_shift) = (0.0f32, 0.0f32, 0.0f32, 0u32);
        let mut args = kernel_args![x, map, n, out, sx, sy, sz, use_shift];
        // SAFETY: arguments match `pack_coords(x, map, n, out, sx, sy, sz, use_shift)`; with n = 0
        // no thread reads or writes, and every pointer is a live allocation anyway.
        unsafe { self.module.launch(abi::PACK_COORDS, LaunchShape::for_items(0, 1), stream, &mut args) }
    }
}

/// `T_launch`: (GPU seconds per launch, host seconds per launch call) over `count` launches.
pub fn measure_launch(empty: &EmptyLaunch, stream: &CudaStream, count: usize) -> Result<(f64, f64)> {
    let mut host = 0.0;
    let gpu = time_on_stream(stream, || {
        let t = Instant::now();
        for _ in 0..count {
            empty.launch(stream)?;
        }
        host = t.elapsed().as_secs_f64();
        Ok(())
    })?;
    Ok((gpu / count as f64, host / count as f64))
}

/// `T_graph`: GPU seconds per replay of a one-node graph holding an empty launch.
pub fn measure_graph_launch(empty: &EmptyLaunch, stream: &Arc<CudaStream>, count: usize) -> Result<f64> {
    stream.begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).during("starting a graph capture")?;
    let launched = empty.launch(stream);
    let graph = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0)).during("ending a graph capture")?;
    launched?;
    let graph = graph.ok_or_else(|| HaloError::InvalidInput("the captured graph is empty".into()))?;
    graph.upload().during("uploading a graph")?;
    graph.launch().during("launching a graph")?; // first replay pays one-time costs
    let gpu = time_on_stream(stream, || {
        for _ in 0..count {
            graph.launch().during("launching a graph")?;
        }
        Ok(())
    })?;
    stream.synchronize().during("waiting for graph replays")?;
    Ok(gpu / count as f64)
}

/// `T_sync`: host seconds per (empty launch + stream synchronize).
pub fn measure_host_sync(empty: &EmptyLaunch, stream: &CudaStream, count: usize) -> Result<f64> {
    let t = Instant::now();
    for _ in 0..count {
        empty.launch(stream)?;
        stream.synchronize().during("host sync probe")?;
    }
    Ok(t.elapsed().as_secs_f64() / count as f64)
}

/// Seconds for one `cuMemcpyAsync` of `bytes` from `src` to `dst` on `stream` (any two device
/// addresses this context can reach: same GPU, peer GPU or an `nvshmem_ptr` mapping).
///
/// # Safety
/// `src` and `dst` must each address at least `bytes` bytes of live device memory reachable from
/// `stream`'s context, and stay valid until the copy completes (this function waits for it).
pub unsafe fn time_copy(stream: &CudaStream, dst: u64, src: u64, bytes: usize) -> Result<f64> {
    time_on_stream(stream, || {
        // SAFETY: forwarded to the caller's contract.
        unsafe { cudarc::driver::sys::cuMemcpyAsync(dst, src, bytes, stream.cu_stream()) }.result().during("timed copy")
    })
}

/// `BW_dev`: bytes read plus written per second of a `bytes`-byte device-to-device copy.
pub fn measure_device_bw(ctx: &Arc<CudaContext>, stream: &CudaStream, bytes: usize) -> Result<f64> {
    let a = DeviceBuffer::<u8>::zeroed(ctx, bytes)?;
    let b = DeviceBuffer::<u8>::zeroed(ctx, bytes)?;
    // SAFETY: both buffers hold `bytes` bytes on this GPU and outlive the (waited-for) copy.
    unsafe { time_copy(stream, b.device_ptr(), a.device_ptr(), bytes) }?; // warm-up
    let t = unsafe { time_copy(stream, b.device_ptr(), a.device_ptr(), bytes) }?;
    Ok(2.0 * bytes as f64 / t)
}

/// Enqueues one side of the ping-pong on `stream`.
///
/// # Safety
/// `own_flag` and `peer_flag` must be live 8-byte device slots reachable from `stream`'s GPU,
/// zeroed before either side starts; `status` a live [`WaitStatus`] on this GPU. The other side
/// must be launched with the flags swapped and the opposite `initiator`, and must be able to run
/// at the same time (another GPU, or another SM of this one).
pub unsafe fn launch_ping_pong(
    module: &KernelModule,
    stream: &CudaStream,
    own_flag: u64,
    peer_flag: u64,
    rounds: u32,
    initiator: bool,
    status: &DeviceBuffer<WaitStatus>,
) -> Result<()> {
    let (mut own, mut peer, mut rounds, mut init) = (own_flag, peer_flag, rounds, initiator as u32);
    let (mut timeout, mut st) = (5_000_000_000u64, status.device_ptr());
    let mut args = kernel_args![own, peer, rounds, init, timeout, st];
    let shape = LaunchShape { grid: (1, 1), block: 1, shared_bytes: 0 };
    // SAFETY: arguments match `signal_ping_pong(own_flag, peer_flag, rounds, initiator,
    // timeout_ns, status)`; pointer validity is the caller's contract.
    unsafe { module.launch(abi::SIGNAL_PING_PONG, shape, stream, &mut args) }
}

/// Fails when a ping-pong side timed out (the peer never answered).
pub fn check_ping_pong(status: &DeviceBuffer<WaitStatus>) -> Result<()> {
    let s = status.to_host()?[0];
    if s.timed_out != 0 {
        return Err(HaloError::InvalidInput(format!(
            "the latency ping-pong timed out waiting for round {} (last seen {}): the other side never answered",
            s.expected, s.seen
        )));
    }
    Ok(())
}

/// The floor summaries as reported (microseconds and GB/s).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FloorReport {
    /// What the latency and peer bandwidth were measured between.
    pub between: String,
    /// One-way signal latency (µs); `None` when the two PEs cannot map each other's memory (the
    /// put path through a remote transport, e.g. UCX emulating a network): the probe needs loads
    /// and stores, and the floor formulas then leave the signal chain out (a lower bound still).
    pub one_way_latency_us: Option<Summary>,
    /// Peer bandwidth (GB/s), when the ranks are on two GPUs.
    pub peer_bw_gbs: Option<Summary>,
    /// Device copy bandwidth (GB/s, read + write).
    pub device_bw_gbs: Summary,
    /// Kernel-launch overhead, GPU timeline (µs).
    pub launch_us: Summary,
    /// Host time per kernel-launch call (µs).
    pub launch_host_us: Summary,
    /// Graph-launch overhead, GPU timeline (µs).
    pub graph_launch_us: Summary,
    /// Host synchronisation round trip (µs).
    pub host_sync_us: Summary,
}

impl FloorReport {
    /// The medians in the formulas' units.
    pub fn inputs(&self) -> FloorInputs {
        FloorInputs {
            one_way_latency_s: self.one_way_latency_us.map_or(0.0, |s| s.median * 1e-6),
            peer_bw: self.peer_bw_gbs.map(|s| s.median * 1e9),
            device_bw: self.device_bw_gbs.median * 1e9,
            launch_s: self.launch_us.median * 1e-6,
            graph_launch_s: self.graph_launch_us.median * 1e-6,
            host_sync_s: self.host_sync_us.median * 1e-6,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> FloorInputs {
        FloorInputs {
            one_way_latency_s: 1e-6,
            peer_bw: Some(400e9),
            device_bw: 4000e9,
            launch_s: 2e-6,
            graph_launch_s: 3e-6,
            host_sync_s: 5e-6,
        }
    }

    fn shape(bytes: u64, pulses: usize, link: Link) -> HaloShape {
        HaloShape { bytes_x: bytes, bytes_f: bytes, pulses, link, steps_per_graph: 100 }
    }

    #[test]
    fn fused_is_latency_bound_when_small_and_bandwidth_bound_when_large() {
        let f = inputs();
        // 4 kB over 400 GB/s = 10 ns < 1 us of latency.
        let small = f.direction_s(Method::Fused, false, 4_000, &shape(4_000, 1, Link::Peer));
        assert!((small - 3e-6).abs() < 1e-12, "{small}");
        // 4 MB over 400 GB/s = 10 us > latency.
        let big = f.direction_s(Method::Fused, false, 4_000_000, &shape(4_000_000, 1, Link::Peer));
        assert!((big - 12e-6).abs() < 1e-12, "{big}");
        // Three pulses: a chain of three hops.
        let chain = f.direction_s(Method::FusedTma, false, 4_000, &shape(4_000, 3, Link::Peer));
        assert!((chain - 5e-6).abs() < 1e-12, "{chain}");
    }

    #[test]
    fn same_gpu_uses_device_bandwidth_counting_both_ways() {
        let f = inputs();
        assert!((f.transfer_s(4_000_000, Link::SameGpu) - 2e-6).abs() < 1e-15);
        assert!((f.transfer_s(4_000_000, Link::Peer) - 10e-6).abs() < 1e-15);
        let no_peer = FloorInputs { peer_bw: None, ..f };
        assert!((no_peer.transfer_s(4_000_000, Link::Peer) - 2e-6).abs() < 1e-15);
    }

    #[test]
    fn per_variant_launch_and_sync_terms() {
        let f = inputs();
        let s = shape(4_000, 2, Link::Peer);
        let chain = 2e-6;
        assert!((f.direction_s(Method::PerPulse, false, 4_000, &s) - (2.0 * 2e-6 + chain)).abs() < 1e-12);
        assert!((f.direction_s(Method::Nccl, false, 4_000, &s) - (4.0 * 2e-6 + chain)).abs() < 1e-12);
        let staged = f.direction_s(Method::Staged, false, 4_000, &s);
        assert!((staged - (2.0 * (2e-6 + 10e-6) + 1e-8)).abs() < 1e-12, "{staged}");
        // Graphs amortise the launch over the captured steps.
        let g = f.direction_s(Method::Fused, true, 4_000, &s);
        assert!((g - (3e-6 / 100.0 + chain)).abs() < 1e-12, "{g}");
        let v = f.variant(Method::Fused, false, &s);
        assert!((v.step_s - v.coords_s - v.forces_s).abs() < 1e-18);
    }
}
