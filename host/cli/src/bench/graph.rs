//! The GPU-initiated step captured as CUDA graphs.
//!
//! Every launch of the exchange bakes its step counter (the signal value peers wait for) into
//! its arguments, so a graph replayed as is would wait for signal values that were already used.
//! The scheme here: capture `K` consecutive steps in one graph (counters `1..=K`, from a freshly
//! reset rank), and before every replay reset the protocol state on every rank
//! ([`RankExchange::reset_protocol`]: signals to unset, block and done counters to zero), with
//! every GPU idle and (across processes) a barrier on both sides of the reset, so no rank can
//! send step 1 of the next replay into a slot that is still being reset. One replay is `K` steps;
//! the reset sits outside the timed region.

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

/// Captures `steps` steps of `phase` of one rank into a graph. The rank's step counters are
/// reset first, so the graph holds counters `1..=steps`: replay it only right after a protocol
/// reset of every rank.
pub fn capture(rank: &mut RankExchange, stream: &Arc<CudaStream>, transport: Transport, phase: Phase, steps: usize) -> Result<CudaGraph> {
    if !transport.gpu_initiated() {
        return Err(HaloError::InvalidInput(format!("the {} transport is host-driven and cannot be captured", transport.name())));
    }
    rank.reset_protocol()?;
    // Thread-local mode: other threads' CUDA calls stay legal during the capture.
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).during("starting a graph capture")?;
    let queued = enqueue(rank, stream, transport, phase, steps);
    // Always end the capture, or the stream stays in capture mode.
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).during("ending a graph capture")?;
    queued?;
    let graph = graph.ok_or_else(|| HaloError::InvalidInput("the captured step is empty (no pulses?)".into()))?;
    graph.upload().during("uploading a graph")?;
    Ok(graph)
}

/// One graph per phase for one rank.
pub struct PhaseGraphs {
    /// Indexed like [`Phase::ALL`].
    pub graphs: Vec<CudaGraph>,
    /// Steps per graph (`K`).
    pub steps: usize,
}

impl PhaseGraphs {
    /// Captures all three phases for one rank.
    pub fn capture(rank: &mut RankExchange, stream: &Arc<CudaStream>, transport: Transport, steps: usize) -> Result<Self> {
        let graphs = Phase::ALL.iter().map(|&ph| capture(rank, stream, transport, ph, steps)).collect::<Result<_>>()?;
        Ok(Self { graphs, steps })
    }

    /// The graph of `phase`.
    pub fn get(&self, phase: Phase) -> &CudaGraph {
        let i = Phase::ALL.iter().position(|&p| p == phase).unwrap_or(0);
        &self.graphs[i]
    }
}
