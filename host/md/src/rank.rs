//! One rank's MD work on its GPU: pair forces (local and non-local), the leapfrog update, and the
//! streams and events that order them around the halo exchange without host synchronisation.

use super::domain::RankDomain;
use crate::abi::{self, Float3};
use crate::error::{CudaContextExt, Result};
use crate::exchange::RankExchange;
use crate::gpu::{CudaEvent, CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape};
use crate::kernel_args;
use crate::kernels::MAX_GATHER_BLOCKS;
use std::sync::Arc;

/// Constants of the force field and integrator the kernels need.
#[derive(Clone, Copy, Debug)]
pub struct Physics {
    /// Box edges (nm).
    pub box_size: [f32; 3],
    /// Interaction cutoff squared (nm²).
    pub rc2: f32,
    /// Time step (ps).
    pub dt: f32,
    /// Number of atom types.
    pub ntypes: u32,
}

/// One rank's MD buffers, stream and events.
pub struct MdRank {
    module: Arc<KernelModule>,
    /// Velocities of the home atoms.
    pub v: DeviceBuffer<Float3>,
    types: DeviceBuffer<u32>,
    inv_mass: DeviceBuffer<f32>,
    lj: DeviceBuffer<[f32; 2]>,
    local_rows: DeviceBuffer<u32>,
    local_cols: DeviceBuffer<u32>,
    nonlocal_rows: DeviceBuffer<u32>,
    nonlocal_cols: DeviceBuffer<u32>,
    home: usize,
    total: usize,
    /// The local stream (home–home forces, integration), normal priority.
    pub local: Arc<CudaStream>,
    home_forces_zeroed: CudaEvent,
    forces_done: CudaEvent,
    coordinates_ready: CudaEvent,
    window_start: CudaEvent,
    window_end: CudaEvent,
}

impl MdRank {
    /// Uploads a rank's search interval: velocities of its home atoms, types, masses, pair lists.
    pub fn new(module: Arc<KernelModule>, domain: &RankDomain, home_atoms: usize, velocities: &[Float3], lj: &[[f32; 2]]) -> Result<Self> {
        let ctx = module.context().clone();
        let local = ctx.new_stream().during("creating the local stream")?;
        let event = || ctx.new_event(None).during("creating an event");
        let timing_event = || ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).during("creating an event");
        Ok(Self {
            v: DeviceBuffer::from_host(&ctx, velocities)?,
            types: DeviceBuffer::from_host(&ctx, &domain.types)?,
            inv_mass: DeviceBuffer::from_host(&ctx, &domain.inv_mass)?,
            lj: DeviceBuffer::from_host(&ctx, lj)?,
            local_rows: DeviceBuffer::from_host(&ctx, &domain.local_pairs.row_start)?,
            local_cols: DeviceBuffer::from_host(&ctx, &domain.local_pairs.cols)?,
            nonlocal_rows: DeviceBuffer::from_host(&ctx, &domain.nonlocal_pairs.row_start)?,
            nonlocal_cols: DeviceBuffer::from_host(&ctx, &domain.nonlocal_pairs.cols)?,
            home: home_atoms,
            total: domain.types.len(),
            home_forces_zeroed: event()?,
            forces_done: event()?,
            coordinates_ready: event()?,
            window_start: timing_event()?,
            window_end: timing_event()?,
            local,
            module,
        })
    }

    /// First half of a step, before the coordinate halo: on the local stream, zero the home forces
    /// and compute home–home pairs; the halo stream waits for the previous step's integration.
    pub fn begin_step(&self, ex: &RankExchange, halo: &CudaStream, phys: &Physics) -> Result<()> {
        ex.f.zero_range_async(0, self.home, &self.local)?;
        self.home_forces_zeroed.record(&self.local).during("recording an event")?;
        self.pair_forces(ex, &self.local_rows, &self.local_cols, self.home, phys, &self.local)?;
        halo.wait(&self.coordinates_ready).during("ordering the halo after integration")
    }

    /// After the coordinate halo, on the halo stream: zero the halo forces (a peer may read them
    /// until it has sent us this step's coordinates), then the pairs involving halo atoms.
    pub fn nonlocal_forces(&self, ex: &RankExchange, halo: &CudaStream, phys: &Physics) -> Result<()> {
        ex.f.zero_range_async(self.home, self.total - self.home, halo)?;
        halo.wait(&self.home_forces_zeroed).during("ordering non-local forces after the zeroing")?;
        self.pair_forces(ex, &self.nonlocal_rows, &self.nonlocal_cols, self.total, phys, halo)
    }

    /// After the force halo: the local stream waits for it and integrates the home atoms; the next
    /// step's halo work waits for that.
    pub fn integrate(&self, ex: &RankExchange, halo: &CudaStream, phys: &Physics) -> Result<()> {
        self.forces_done.record(halo).during("recording an event")?;
        self.local.wait(&self.forces_done).during("ordering integration after the force halo")?;
        let (mut x, mut v, mut f, mut m, mut n, mut dt) =
            (ex.x.device_ptr(), self.v.device_ptr(), ex.f.device_ptr(), self.inv_mass.device_ptr(), self.home as u32, phys.dt);
        let mut args = kernel_args![x, v, f, m, n, dt];
        // SAFETY: arguments match `leapfrog`; every buffer holds at least `home` elements.
        unsafe { self.module.launch(abi::LEAPFROG, LaunchShape::for_items(self.home, MAX_GATHER_BLOCKS), &self.local, &mut args)? };
        self.coordinates_ready.record(&self.local).during("recording an event")
    }

    fn pair_forces(&self, ex: &RankExchange, rows: &DeviceBuffer<u32>, cols: &DeviceBuffer<u32>, nrows: usize, phys: &Physics, stream: &CudaStream) -> Result<()> {
        if nrows == 0 {
            return Ok(());
        }
        let (mut x, mut t, mut lj, mut nt) = (ex.x.device_ptr(), self.types.device_ptr(), self.lj.device_ptr(), phys.ntypes);
        let (mut rs, mut cs, mut n, mut f) = (rows.device_ptr(), cols.device_ptr(), nrows as u32, ex.f.device_ptr());
        let [mut bx, mut by, mut bz] = phys.box_size;
        let mut rc2 = phys.rc2;
        let mut args = kernel_args![x, t, lj, nt, rs, cs, n, f, bx, by, bz, rc2];
        // SAFETY: arguments match `lj_pair_forces`; the CSR indexes only local atoms of this rank.
        unsafe { self.module.launch(abi::LJ_PAIR_FORCES, LaunchShape::for_items(nrows, MAX_GATHER_BLOCKS), stream, &mut args) }
    }

    /// Marks the start of a timed window of steps on the local stream (before `begin_step`).
    pub fn mark_window_start(&self) -> Result<()> {
        self.window_start.record(&self.local).during("recording a timing event")
    }

    /// Marks the end of a timed window (after `integrate`).
    pub fn mark_window_end(&self) -> Result<()> {
        self.window_end.record(&self.local).during("recording a timing event")
    }

    /// GPU time between the window marks, in milliseconds (waits for the end mark).
    pub fn window_ms(&self) -> Result<f32> {
        self.window_end.synchronize().during("waiting for a timing event")?;
        self.window_start.elapsed_ms(&self.window_end).during("reading a timing event")
    }

    /// Velocities of the home atoms (synchronous; for rebuilds and checks).
    pub fn velocities(&self) -> Result<Vec<Float3>> {
        self.local.synchronize().during("waiting for the local stream")?;
        self.v.to_host()
    }

    /// Waits for the local stream.
    pub fn synchronize(&self) -> Result<()> {
        self.local.synchronize().during("waiting for the local stream")
    }
}
