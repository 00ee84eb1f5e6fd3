//! The GPU-initiated step captured as CUDA graphs.
//!
//! The exchange's launches carry no step counter: each kernel reads the rank's counters from
//! device memory and its last block advances them (docs/protocol.md, "Graphs"). So one step of a
//! phase is captured once and the graph is replayed back to back, any number of times, with no
//! host work and no protocol reset between replays; a timed loop of `K` steps is `K` replays.

use crate::error::{CudaContextExt, HaloError, Result};
use crate::exchange::{RankExchange, Transport};
use crate::gpu::CudaStream;
use cudarc::driver::CudaGraph;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use std::sync::Arc;

/// What a timed loop runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The coordinate halo only.
    Coordinates,
    /// The force halo only.
    Forces,
    /// Both: the full exchange of a step.
    Step,
}

impl Phase {
    /// All three, in the order they are measured.
    pub const ALL: [Phase; 3] = [Phase::Coordinates, Phase::Forces, Phase::Step];

    /// Enqueues `steps` steps of this phase: `direction(false)` is one coordinate halo,
    /// `direction(true)` one force halo, in step order.
    pub fn repeat<E>(self, steps: usize, mut direction: impl FnMut(bool) -> Result<(), E>) -> Result<(), E> {
        for _ in 0..steps {
            if self != Phase::Forces {
                direction(false)?;
            }
            if self != Phase::Coordinates {
                direction(true)?;
            }
        }
        Ok(())
    }
}

/// Enqueues `steps` steps of `phase` for one rank on `stream` (no host sync).
pub fn enqueue(rank: &mut RankExchange, stream: &CudaStream, transport: Transport, phase: Phase, steps: usize) -> Result<()> {
    phase.repeat(steps, |forces| if forces { rank.launch_forces(stream) } else { rank.launch_coordinates(transport, stream) })
}

/// Captures `steps` steps of `phase` of one rank into a graph. Replays need no reset: every rank
/// must only replay the same graphs in the same order, as it would launch the same steps.
pub fn capture(rank: &mut RankExchange, stream: &Arc<CudaStream>, transport: Transport, phase: Phase, steps: usize) -> Result<CudaGraph> {
    if !transport.gpu_initiated() {
        return Err(HaloError::InvalidInput(format!("the {} transport is host-driven and cannot be captured", transport.name())));
    }
    capture_with(stream, || enqueue(rank, stream, transport, phase, steps))
}

/// Captures what `enqueue` puts on `stream` into an uploaded graph.
pub fn capture_with(stream: &Arc<CudaStream>, enqueue: impl FnOnce() -> Result<()>) -> Result<CudaGraph> {
    // Thread-local mode: other threads' CUDA calls stay legal during the capture.
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).during("starting a graph capture")?;
    let queued = enqueue();
    // Always end the capture, or the stream stays in capture mode.
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).during("ending a graph capture")?;
    queued?;
    let graph = graph.ok_or_else(|| HaloError::InvalidInput("the captured step is empty (no pulses?)".into()))?;
    graph.upload().during("uploading a graph")?;
    Ok(graph)
}

/// One graph per phase for one rank, each holding one step.
pub struct PhaseGraphs {
    /// Indexed like [`Phase::ALL`].
    pub graphs: Vec<CudaGraph>,
}

impl PhaseGraphs {
    /// Captures one step of each of the three phases for one rank.
    pub fn capture(rank: &mut RankExchange, stream: &Arc<CudaStream>, transport: Transport) -> Result<Self> {
        let graphs = Phase::ALL.iter().map(|&ph| capture(rank, stream, transport, ph, 1)).collect::<Result<_>>()?;
        Ok(Self { graphs })
    }

    /// The graph of `phase`.
    pub fn get(&self, phase: Phase) -> &CudaGraph {
        let i = Phase::ALL.iter().position(|&p| p == phase).unwrap_or(0);
        &self.graphs[i]
    }
}
