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
//! - `T_overlap`, the same with overlapping launches (programmatic dependent launch, how the
//!   `fused` kernels are launched): each may start while the one before it ends.
//! - `T_graph`, graph-launch overhead: the same empty launch captured as a one-node graph,
//!   replayed back to back, GPU time / replays.
//! - `T_sync`, host synchronisation: an empty launch followed by `cuStreamSynchronize`, host wall
//!   time per round (what each host sync of the staged path costs at least).
//!
//! # Floor of one direction (coordinates or forces) of one step
//! With `B` the bytes a rank sends in that direction per step (the largest over ranks), `P` the
//! pulses (each pulse's signal can only leave after the previous pulse's data arrived, so the
//! signal chain is `P` hops long), and `T(B)` the time to move `B` bytes
//! (`B / BW_peer` between GPUs, `2 B / BW_dev` between ranks sharing a GPU). Steps run back to
//! back on a stream, so a kernel's launch overlaps the previous kernel's execution: the launch
//! rate and the transfer bound a step each on their own, and only their maximum bounds it.
//!
//! | variant | launches `k` per direction | floor |
//! |---|---|---|
//! | `fused` | 1 | `max(k T_overlap, max(T(B), P L))` |
//! | `fused-tma` | 1 | `max(k T_launch, max(T(B), P L))` |
//! | `per-pulse`, `per-pulse-direct` | `P` | `max(k T_launch, max(T(B), P L))` |
//! | `direct-copy` | `P` (pack or unpack kernels; the copies and event waits come on top) | `max(k T_launch, max(T(B), P L))` |
//! | `nccl` | `2 P` (a pack or unpack kernel and an NCCL kernel per pulse) | `max(k T_launch, max(T(B), P L))` |
//! | `staged` | host rounds: `P` pack + sync rounds for coordinates (the copies' waits are not bounded by a probe) | coordinates `P T_sync + max(T(B), P L)`, forces `max(T(B), P L)` |
//! | `+graph` | one replay per phase (the step phase replays one graph of both directions) | `T_launch` replaced by `T_graph` for the whole replay |
//!
//! The step floor is `max(launches of both directions, T_X + T_F)` for the GPU-timed methods
//! (one graph for `+graph`) and the sum of both directions for `staged`. These are meant as lower
//! bounds: full link speed from the first byte, nothing else running. Whether they are is checked
//! against every measurement ([`FloorCheck`]): a row whose fastest repeat beat its floor shows the
//! floor as a model, flagged, and no ratio (a "ratio" below 1 would mean the floor was wrong).

use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaContext, CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape};
use crate::kernel_args;
use kernels_gpu::abi::{self, WaitStatus};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Instant;

use super::Method;
use super::stats::Summary;

/// The measured floor, in seconds and bytes per second (the fastest repeat of each is used in the
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
    /// Overlapping-launch overhead `T_overlap` (s per launch).
    pub overlapping_launch_s: f64,
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

    /// Seconds of launch overhead per launch of `method`'s kernels.
    fn per_launch_s(&self, method: Method) -> f64 {
        if method == Method::Fused { self.overlapping_launch_s } else { self.launch_s }
    }

    /// Kernel launches of one direction of `method` with `pulses` pulses.
    fn launches(method: Method, pulses: f64) -> f64 {
        match method {
            Method::Fused | Method::FusedTma => 1.0,
            Method::PerPulse | Method::PerPulseDirect | Method::DirectCopy => pulses,
            Method::Nccl => 2.0 * pulses,
            Method::Staged => 0.0,
        }
    }

    /// The transfer part of one direction: the bytes over the link or the signal chain.
    fn transfer(&self, bytes: u64, shape: &HaloShape) -> f64 {
        self.transfer_s(bytes, shape.link).max(shape.pulses.max(1) as f64 * self.one_way_latency_s)
    }

    /// The floor of one direction (`forward`: coordinates) moving `bytes` in `shape.pulses`
    /// pulses (see the module docs).
    pub fn direction_s(&self, method: Method, graph: bool, forward: bool, bytes: u64, shape: &HaloShape) -> f64 {
        let p = shape.pulses.max(1) as f64;
        if method == Method::Staged {
            // A kernel launch and a host sync per coordinate pulse (the pack round: at least the
            // probe's empty launch + sync), then the copies, which at least move the bytes or
            // carry one hop each. The copies' own host waits and the force round's syncs are not
            // counted: no probe bounds a copy's submission and wait from below.
            let packs = if forward { p * self.host_sync_s } else { 0.0 };
            return packs + self.transfer(bytes, shape);
        }
        let launch =
            if graph { self.graph_launch_s / shape.steps_per_graph.max(1) as f64 } else { Self::launches(method, p) * self.per_launch_s(method) };
        launch.max(self.transfer(bytes, shape))
    }

    /// The floor of a variant on `shape`.
    pub fn variant(&self, method: Method, graph: bool, shape: &HaloShape) -> VariantFloor {
        let coords_s = self.direction_s(method, graph, true, shape.bytes_x, shape);
        let forces_s = self.direction_s(method, graph, false, shape.bytes_f, shape);
        if method == Method::Staged {
            return VariantFloor { coords_s, forces_s, step_s: coords_s + forces_s };
        }
        let p = shape.pulses.max(1) as f64;
        let launches = if graph {
            self.graph_launch_s / shape.steps_per_graph.max(1) as f64
        } else {
            2.0 * Self::launches(method, p) * self.per_launch_s(method)
        };
        let step_s = launches.max(self.transfer(shape.bytes_x, shape) + self.transfer(shape.bytes_f, shape));
        VariantFloor { coords_s, forces_s, step_s }
    }
}

/// Whether a variant's floor is below every repeat of every phase (then it is a lower bound and
/// the ratios are shown), or a model that a measurement beat (then it is flagged).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FloorCheck {
    /// Every repeat of every phase took at least its floor.
    Bound,
    /// Some repeat was faster than its floor: the model was wrong there.
    Model,
}

impl FloorCheck {
    /// Compares the floor with the fastest repeat of each phase (seconds; `None`: not measured).
    pub fn of(floor: &VariantFloor, fastest: [Option<f64>; 3]) -> Self {
        let pairs = [(floor.coords_s, fastest[0]), (floor.forces_s, fastest[1]), (floor.step_s, fastest[2])];
        if pairs.iter().all(|&(f, m)| m.is_none_or(|m| m >= f)) { FloorCheck::Bound } else { FloorCheck::Model }
    }
}

/// `measured / floor`, only when the floor is a bound (so never below 1).
pub fn ratio(measured: f64, floor: f64, check: FloorCheck) -> Option<f64> {
    (check == FloorCheck::Bound && floor > 0.0 && measured >= floor).then(|| measured / floor)
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
        self.launch_as(stream, false)
    }

    /// Enqueues one empty launch on `stream`, overlapping the previous kernel when `overlapping`
    /// (it reads and writes nothing, so it needs no wait for that kernel).
    pub fn launch_as(&self, stream: &CudaStream, overlapping: bool) -> Result<()> {
        let p = self.scratch.device_ptr();
        let (mut x, mut map, mut n, mut out) = (p, p, 0u32, p);
        let (mut sx, mut sy, mut sz, mut use_shift) = (0.0f32, 0.0f32, 0.0f32, 0u32);
        let mut args = kernel_args![x, map, n, out, sx, sy, sz, use_shift];
        let shape = LaunchShape::for_items(0, 1);
        // SAFETY: arguments match `pack_coords(x, map, n, out, sx, sy, sz, use_shift)`; with n = 0
        // no thread reads or writes (so nothing to wait for before), and every pointer is a live
        // allocation anyway.
        unsafe {
            if overlapping {
                self.module.launch_overlapping(abi::PACK_COORDS, shape, stream, &mut args)
            } else {
                self.module.launch(abi::PACK_COORDS, shape, stream, &mut args)
            }
        }
    }
}

/// `T_launch` (or `T_overlap` when `overlapping`): (GPU seconds per launch, host seconds per
/// launch call) over `count` launches.
pub fn measure_launch(empty: &EmptyLaunch, stream: &CudaStream, count: usize, overlapping: bool) -> Result<(f64, f64)> {
    let mut host = 0.0;
    let gpu = time_on_stream(stream, || {
        let t = Instant::now();
        for _ in 0..count {
            empty.launch_as(stream, overlapping)?;
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
    /// Overlapping-launch overhead, GPU timeline (µs): the launch rate of the `fused` kernels.
    pub overlapping_launch_us: Summary,
    /// Host synchronisation round trip (µs).
    pub host_sync_us: Summary,
}

impl FloorReport {
    /// The fastest of each component's repeats in the formulas' units (smallest latency, launch
    /// and sync times, largest bandwidths): a floor built from medians could exceed a fast
    /// repeat of the exchange for no other reason than the probe's own spread.
    pub fn inputs(&self) -> FloorInputs {
        FloorInputs {
            one_way_latency_s: self.one_way_latency_us.map_or(0.0, |s| s.min * 1e-6),
            peer_bw: self.peer_bw_gbs.map(|s| s.max * 1e9),
            device_bw: self.device_bw_gbs.max * 1e9,
            launch_s: self.launch_us.min * 1e-6,
            graph_launch_s: self.graph_launch_us.min * 1e-6,
            overlapping_launch_s: self.overlapping_launch_us.min * 1e-6,
            host_sync_s: self.host_sync_us.min * 1e-6,
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
            overlapping_launch_s: 2e-6,
            host_sync_s: 5e-6,
        }
    }

    fn shape(bytes: u64, pulses: usize, link: Link) -> HaloShape {
        HaloShape { bytes_x: bytes, bytes_f: bytes, pulses, link, steps_per_graph: 100 }
    }

    #[test]
    fn fused_is_latency_bound_when_small_and_bandwidth_bound_when_large() {
        let f = inputs();
        // 4 kB over 400 GB/s = 10 ns < 1 us of latency < the 2 us launch: launch-bound.
        let small = f.direction_s(Method::Fused, false, true, 4_000, &shape(4_000, 1, Link::Peer));
        assert!((small - 2e-6).abs() < 1e-12, "{small}");
        // 4 MB over 400 GB/s = 10 us > launch and latency.
        let big = f.direction_s(Method::Fused, false, true, 4_000_000, &shape(4_000_000, 1, Link::Peer));
        assert!((big - 10e-6).abs() < 1e-12, "{big}");
        // Three pulses: a chain of three hops (3 us) outlasts the launch.
        let chain = f.direction_s(Method::FusedTma, false, true, 4_000, &shape(4_000, 3, Link::Peer));
        assert!((chain - 3e-6).abs() < 1e-12, "{chain}");
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
        // Launches and the chain each bound a step; only their maximum does.
        assert!((f.direction_s(Method::PerPulse, false, true, 4_000, &s) - (2.0 * 2e-6f64).max(chain)).abs() < 1e-12);
        assert!((f.direction_s(Method::DirectCopy, false, false, 4_000, &s) - (2.0 * 2e-6f64).max(chain)).abs() < 1e-12);
        assert!((f.direction_s(Method::Nccl, false, true, 4_000, &s) - 4.0 * 2e-6).abs() < 1e-12);
        // Staged: a pack + sync round per coordinate pulse, then the copies' chain.
        let x = f.direction_s(Method::Staged, false, true, 4_000, &s);
        assert!((x - (2.0 * 5e-6 + chain)).abs() < 1e-12, "{x}");
        let fx = f.direction_s(Method::Staged, false, false, 4_000, &s);
        assert!((fx - chain).abs() < 1e-12, "{fx}");
        let v = f.variant(Method::Staged, false, &s);
        assert!((v.step_s - v.coords_s - v.forces_s).abs() < 1e-18);
        // Graphs: one replay per phase.
        let g = f.direction_s(Method::Fused, true, true, 4_000, &s);
        assert!((g - (3e-6 / 100.0f64).max(chain)).abs() < 1e-12, "{g}");
        // The step: the launches of both directions, or both transfers, whichever is longer.
        let v = f.variant(Method::Fused, false, &s);
        assert!((v.step_s - (2.0 * 2e-6f64).max(2.0 * chain)).abs() < 1e-12, "{v:?}");
        assert!(v.step_s <= v.coords_s + v.forces_s, "the step floor never exceeds the directions' sum");
    }

    #[test]
    fn a_floor_beaten_by_a_measurement_is_a_model_and_gets_no_ratio() {
        let floor = VariantFloor { coords_s: 5e-6, forces_s: 6e-6, step_s: 10e-6 };
        assert_eq!(FloorCheck::of(&floor, [Some(5e-6), Some(7e-6), Some(12e-6)]), FloorCheck::Bound);
        assert_eq!(FloorCheck::of(&floor, [Some(5e-6), None, Some(12e-6)]), FloorCheck::Bound);
        // One repeat of the coordinate loop beat its floor: the whole row's floor is a model.
        assert_eq!(FloorCheck::of(&floor, [Some(4.9e-6), Some(7e-6), Some(12e-6)]), FloorCheck::Model);
        assert_eq!(ratio(12e-6, 10e-6, FloorCheck::Bound).map(|r| (r * 100.0).round()), Some(120.0));
        assert_eq!(ratio(12e-6, 10e-6, FloorCheck::Model), None);
        assert_eq!(ratio(9e-6, 10e-6, FloorCheck::Bound), None, "never a ratio below 1");
    }

    #[test]
    fn the_new_floors_stay_below_the_h200_measurements() {
        // docs/benchmarks.md, 2x1x1 over two PEs, 6000 atoms (1578 atoms per direction): the
        // measured floor inputs and every variant's fastest repeat must give a bound.
        let f = FloorInputs {
            one_way_latency_s: 1.95e-6,
            peer_bw: Some(388.7e9),
            device_bw: 3887e9,
            launch_s: 5.03e-6,
            graph_launch_s: 2.01e-6,
            overlapping_launch_s: 5.03e-6,
            host_sync_s: 10.41e-6,
        };
        let s = shape(1578 * 12, 1, Link::Peer);
        let s = HaloShape { steps_per_graph: 1, ..s };
        for (method, graph, fastest) in [
            (Method::Fused, false, [6.9e-6, 10.7e-6, 18.1e-6]),
            (Method::Fused, true, [5.2e-6, 8.9e-6, 14.7e-6]),
            (Method::FusedTma, true, [4.6e-6, 8.9e-6, 13.9e-6]),
            (Method::PerPulseDirect, false, [6.1e-6, 10.8e-6, 17.3e-6]),
            (Method::Nccl, false, [16.6e-6, 16.6e-6, 31.7e-6]),
            (Method::Staged, false, [35.6e-6, 35.7e-6, 73.3e-6]),
        ] {
            let v = f.variant(method, graph, &s);
            assert_eq!(FloorCheck::of(&v, fastest.map(Some)), FloorCheck::Bound, "{method:?} graph {graph}: {v:?}");
        }
    }
}
