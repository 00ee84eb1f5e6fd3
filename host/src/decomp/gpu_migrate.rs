//! The home atoms' migration on the GPU: the first phase of a redecomposition
//! ([`super::redecompose_with`]'s `Leaving::sort_out`) for one rank's home atoms held on the
//! device, by the `migrate_*` kernels (`kernels-gpu/src/kernels/migrate.rs`). Each atom's position
//! is wrapped into the box and its owner found, bit for bit as the host does
//! ([`super::wrap_position`], `CellEdges::rank_of`); the stayers (owner == this rank) are written,
//! in input order, to device arrays that stay on the device, and the leavers, in input order, to a
//! device buffer of which only the used part is read back, with the counts.
//!
//! This is the first block of the GPU redecomposition (docs/nbnxm.md, "Search step cost"), which
//! [`super::GpuHome`] runs for the MD step: the merge of arrivals into the stayers follows it
//! ([`super::GpuMerge`]), then the first pulses' selection ([`super::GpuSelect`]).
//! `tests/gpu_migrate.rs` checks it against [`migrate_reference`] and the host's own phase.
//!
//! | item | what it is |
//! |---|---|
//! | [`GpuMigrate`] | the device buffers of one rank's migration; [`GpuMigrate::run`] enqueues and reads back |
//! | [`migrate_geometry`] | the kernels' [`MigrateGeometry`] for a decomposition and a rank |
//! | [`migrate_reference`] | the same migration on the CPU, with the host's own functions |

use super::PlanError;
use super::gpu_checks::{check_disjoint, check_lengths};
use super::grid::{DIM_NAMES, Decomposition, wrap_position};
use super::plan::CellEdges;
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape, grown_capacity};
use cudarc::driver::{CudaContext, PinnedHostSlice};
use kernels_gpu::abi::{self, Float3, MIGRATE_MAX_EDGES, MigrateGeometry, MigrateLeaver};
use std::sync::Arc;

/// The kernels' geometry for `geo` and `rank`: the box, the rank, the strides, and per decomposed
/// dimension the cell thresholds `geo.cell_threshold(d, 1..n)`, those `CellEdges::rank_of`
/// compares with. Errors: a rank outside the grid, or more than `MIGRATE_MAX_EDGES + 1` ranks along
/// a dimension.
pub fn migrate_geometry(geo: &Decomposition, rank: usize) -> std::result::Result<MigrateGeometry, PlanError> {
    let n = geo.grid.dims;
    let ranks = geo.grid.num_ranks();
    if rank >= ranks {
        return Err(PlanError::LocalRanks { ranks: vec![rank], reason: format!("the {} grid has ranks 0..{ranks}", geo.grid) });
    }
    let mut g =
        MigrateGeometry { box_size: geo.box_size, rank: rank as u32, stride: [1, n[0] as u32, (n[0] * n[1]) as u32], ..MigrateGeometry::default() };
    for d in 0..3 {
        if n[d] > MIGRATE_MAX_EDGES + 1 {
            return Err(PlanError::GpuMigrateGrid { dim: DIM_NAMES[d], ranks: n[d], max: MIGRATE_MAX_EDGES + 1 });
        }
        // A dimension of one rank has no threshold (it adds nothing to the owner).
        for i in 1..n[d] {
            g.edges[d][i - 1] = geo.cell_threshold(d, i);
        }
        g.n_edges[d] = (n[d] - 1) as u32;
    }
    Ok(g)
}

/// The owner of a wrapped position as the kernels find it from `g` (a CPU model of their rule,
/// for tests of [`migrate_geometry`]): per dimension the thresholds at or below the coordinate,
/// times the stride.
pub fn owner_in(g: &MigrateGeometry, w: Float3) -> u32 {
    let c = [w.x, w.y, w.z];
    (0..3).map(|d| g.stride[d] * g.edges[d][..g.n_edges[d] as usize].iter().filter(|&&e| c[d] >= e).count() as u32).sum()
}

/// One rank's home atoms sorted out: the stayers (input order) and the leavers (input order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MigrateReference {
    /// The stayers' ids.
    pub ids: Vec<u32>,
    /// The stayers' wrapped positions.
    pub positions: Vec<Float3>,
    /// The stayers' velocities.
    pub velocities: Vec<Float3>,
    /// The leavers, with their wrapped positions and new owners.
    pub leavers: Vec<MigrateLeaver>,
}

/// The migration on the CPU with the host's own functions ([`wrap_position`] and
/// `CellEdges::rank_of`, as `Leaving::sort_out` applies them): what [`GpuMigrate::run`] must give
/// bit for bit. Errors as the host: arrays of different lengths, or the first atom (input order)
/// with a non-finite coordinate, named by its id.
pub fn migrate_reference(
    x: &[Float3],
    v: &[Float3],
    ids: &[u32],
    geo: &Decomposition,
    rank: usize,
) -> std::result::Result<MigrateReference, PlanError> {
    if x.len() != ids.len() || v.len() != ids.len() {
        return Err(PlanError::HomeArrays { rank, ids: ids.len(), positions: x.len(), velocities: v.len() });
    }
    migrate_geometry(geo, rank)?;
    let edges = CellEdges::new(geo);
    let mut out = MigrateReference::default();
    for ((&p, &vel), &id) in x.iter().zip(v).zip(ids) {
        if !(p.x.is_finite() && p.y.is_finite() && p.z.is_finite()) {
            return Err(PlanError::NonFinitePosition { atom: id as usize, position: [p.x, p.y, p.z] });
        }
        let w = wrap_position(p, geo.box_size);
        let owner = edges.rank_of(w);
        if owner == rank {
            out.ids.push(id);
            out.positions.push(w);
            out.velocities.push(vel);
        } else {
            out.leavers.push(MigrateLeaver { id, x: w, v: vel, owner: owner as u32 });
        }
    }
    Ok(out)
}

/// What [`GpuMigrate::run`] reads back: the stayer count (the stayers themselves are on the
/// device, in the output arrays) and the leavers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Migrated {
    /// Stayers written to the output arrays (`0..stayers`).
    pub stayers: usize,
    /// The leavers in input order: id, wrapped position, velocity, new owner.
    pub leavers: Vec<MigrateLeaver>,
}

/// The pass's name in errors.
const PASS: &str = "GPU migration";

/// The device arrays of one migration: the home atoms (`x` unwrapped as the MD step leaves them,
/// `v`, `ids`) and where the stayers go (`x_out` wrapped, `v_out`, `ids_out`). Each holds at least
/// the `n` atoms of the call; no output may overlap an input or another output (checked).
pub struct MigrateArrays<'a> {
    /// Positions.
    pub x: &'a dyn DeviceMemory<Float3>,
    /// Velocities.
    pub v: &'a dyn DeviceMemory<Float3>,
    /// Global ids.
    pub ids: &'a dyn DeviceMemory<u32>,
    /// The stayers' wrapped positions.
    pub x_out: &'a dyn DeviceMemory<Float3>,
    /// The stayers' velocities.
    pub v_out: &'a dyn DeviceMemory<Float3>,
    /// The stayers' ids.
    pub ids_out: &'a dyn DeviceMemory<u32>,
}

impl MigrateArrays<'_> {
    /// An error unless every array holds `n` atoms.
    fn check(&self, n: usize) -> Result<()> {
        let lens = [
            ("x", self.x.len()),
            ("v", self.v.len()),
            ("ids", self.ids.len()),
            ("x_out", self.x_out.len()),
            ("v_out", self.v_out.len()),
            ("ids_out", self.ids_out.len()),
        ];
        check_lengths(PASS, n, &lens)?;
        let input = |b: &dyn DeviceMemory<Float3>| (b.device_ptr(), (n * size_of::<Float3>()) as u64);
        let inputs = [("x", input(self.x)), ("v", input(self.v)), ("ids", (self.ids.device_ptr(), (n * 4) as u64))];
        let outputs = [("x_out", input(self.x_out)), ("v_out", input(self.v_out)), ("ids_out", (self.ids_out.device_ptr(), (n * 4) as u64))];
        check_disjoint(PASS, "the stayers", &inputs, &outputs)
    }
}

/// The launch shapes of the three passes for `n` atoms.
fn shapes(n: u32) -> [LaunchShape; 3] {
    let per_atom = LaunchShape { grid: (abi::migrate_blocks(n), 1), block: abi::MIGRATE_THREADS, shared_bytes: abi::MIGRATE_SHARED_BYTES };
    let scan = LaunchShape { grid: (1, 1), block: abi::MIGRATE_SCAN_THREADS, shared_bytes: abi::MIGRATE_SCAN_SHARED_BYTES };
    [per_atom, scan, per_atom]
}

/// Leavers read back with the counts, before their number is known (32 bytes each): a search's
/// leavers are far fewer (hundreds at 45,000 atoms on two ranks); more take a second read.
const LEAVERS_READ_AHEAD: usize = 2048;

/// One rank's migration on the GPU: its geometry on the device and the passes' scratch (the
/// blocks' counts, the counts and first bad atom, the leavers), kept and grown between calls.
pub struct GpuMigrate {
    geometry: MigrateGeometry,
    geometry_dev: DeviceBuffer<MigrateGeometry>,
    block_counts: DeviceBuffer<u32>,
    info: DeviceBuffer<u32>,
    leavers: DeviceBuffer<MigrateLeaver>,
    /// Page-locked room for what comes back in the one wait: the counts' words, then the first
    /// [`LEAVERS_READ_AHEAD`] leavers (allocated by the first run).
    back: Option<PinnedHostSlice<u32>>,
}

/// `u32` words of [`GpuMigrate`]'s read-back room: the counts' words, then the read-ahead leavers.
const BACK_WORDS: usize = abi::MIGRATE_INFO_WORDS + LEAVERS_READ_AHEAD * size_of::<MigrateLeaver>() / 4;

impl GpuMigrate {
    /// The migration of `rank`'s home atoms in `geo` on `ctx`'s GPU (the geometry uploaded once).
    pub fn new(ctx: &Arc<CudaContext>, geo: &Decomposition, rank: usize) -> Result<Self> {
        let geometry = migrate_geometry(geo, rank)?;
        let geometry_dev = DeviceBuffer::from_host(ctx, &[geometry])?;
        // A pageable upload may land after a kernel on another stream starts: wait for it once.
        ctx.synchronize().during("uploading the migration's geometry")?;
        Ok(Self {
            geometry,
            geometry_dev,
            block_counts: DeviceBuffer::uninit(ctx, 2)?,
            info: DeviceBuffer::uninit(ctx, abi::MIGRATE_INFO_WORDS)?,
            leavers: DeviceBuffer::uninit(ctx, 0)?,
            back: None,
        })
    }

    /// The geometry the kernels read.
    pub fn geometry(&self) -> &MigrateGeometry {
        &self.geometry
    }

    /// Sorts out the `n` home atoms of `a` on `stream`: enqueues the three passes, waits once
    /// for them (the counts), then reads back exactly the leavers. The stayers are at
    /// `a.x_out[..stayers]` (and `v_out`, `ids_out`) in input order. Errors: arrays shorter than
    /// `n`, a CUDA failure, or [`PlanError::NonFinitePosition`] naming the first atom (input
    /// order) with a non-finite coordinate by its id, as the host does (then the outputs are
    /// unspecified).
    pub fn run(&mut self, module: &KernelModule, stream: &CudaStream, a: &MigrateArrays<'_>, n: usize) -> Result<Migrated> {
        self.enqueue(module, stream, a, n)?;
        self.finish(stream, a, n)
    }

    /// Enqueues the passes and returns without waiting (see [`Self::run`]); [`Self::finish`]
    /// with the same arrays and `n` completes them. The arrays must outlive the passes.
    pub(crate) fn enqueue(&mut self, module: &KernelModule, stream: &CudaStream, a: &MigrateArrays<'_>, n: usize) -> Result<()> {
        a.check(n)?;
        let n32 = u32::try_from(n).map_err(|_| HaloError::Plan(PlanError::TooManyAtoms { atoms: n }))?;
        let ctx = stream.context();
        ctx.bind_to_thread().during("binding the context")?;
        let blocks = abi::migrate_blocks(n32) as usize;
        if let Some(cap) = grown_capacity(self.block_counts.len(), 2 * blocks) {
            self.block_counts = DeviceBuffer::uninit(ctx, cap)?;
        }
        if let Some(cap) = grown_capacity(self.leavers.len(), n) {
            self.leavers = DeviceBuffer::uninit(ctx, cap)?;
        }
        // The counts are written by the scan; the first bad atom starts at "none".
        self.info.fill_bytes_async(0xFF, stream)?;
        let [count, scan, scatter] = shapes(n32);
        let (mut x, mut v, mut ids, mut geo) = (a.x.device_ptr(), a.v.device_ptr(), a.ids.device_ptr(), self.geometry_dev.device_ptr());
        let (mut counts, mut info, mut nb, mut n) = (self.block_counts.device_ptr(), self.info.device_ptr(), blocks as u32, n32);
        let (mut xo, mut vo, mut io, mut lv) = (a.x_out.device_ptr(), a.v_out.device_ptr(), a.ids_out.device_ptr(), self.leavers.device_ptr());
        // SAFETY: the arguments match the passes' parameters (abi::MIGRATE_*); every array holds
        // `n` atoms (checked), the counts `2 blocks`, the leavers `n`, the info its words; the
        // buffers outlive the launches (the caller's arrays by `run`'s wait, ours by `self`).
        unsafe {
            module.launch(abi::MIGRATE_COUNT, count, stream, &mut crate::kernel_args![x, n, geo, counts, info])?;
            module.launch(abi::MIGRATE_SCAN, scan, stream, &mut crate::kernel_args![counts, nb, info])?;
            let mut args = crate::kernel_args![x, v, ids, n, geo, counts, xo, vo, io, lv];
            module.launch(abi::MIGRATE_SCATTER, scatter, stream, &mut args)
        }
    }

    /// Waits for the passes and reads back the counts, then the leavers (see [`Self::run`]).
    pub(crate) fn finish(&mut self, stream: &CudaStream, a: &MigrateArrays<'_>, n: usize) -> Result<Migrated> {
        // The counts and the first leavers in one wait, into page-locked memory (a copy into
        // pageable memory is staged by the driver and holds the host): a search's leavers are a
        // few hundred, so most migrations need no second round trip for them.
        let ctx = stream.context();
        if self.back.is_none() {
            // SAFETY: the contents are written by the copies below before they are read (after
            // the stream's synchronisation).
            self.back = Some(unsafe { ctx.alloc_pinned_with_flags::<u32>(BACK_WORDS, 0) }.during("allocating the GPU migration's read-back")?);
        }
        let back = self.back.as_mut().ok_or_else(|| HaloError::InvalidInput("no read-back room".into()))?;
        let words = &mut back.as_mut_slice().during("reaching the GPU migration's read-back")?[..BACK_WORDS];
        let (info, first) = words.split_at_mut(abi::MIGRATE_INFO_WORDS);
        let first: &mut [MigrateLeaver] =
            bytemuck::try_cast_slice_mut(first).map_err(|e| HaloError::InvalidInput(format!("the GPU migration's read-back room: {e}")))?;
        let first = &mut first[..n.min(LEAVERS_READ_AHEAD)];
        // SAFETY: the room is `self`'s and is neither read nor freed before the stream is
        // synchronised, just below, whether the copies were enqueued or not.
        let enqueued = unsafe { self.info.enqueue_read(0, info, stream).and_then(|()| self.leavers.enqueue_read(0, first, stream)) };
        let waited = stream.synchronize().during("waiting for the GPU migration");
        enqueued.and(waited)?;
        let bad = info[abi::MIGRATE_INFO_BAD_ATOM];
        if bad != u32::MAX {
            let p: Vec<Float3> = a.x.read_range(bad as usize, 1, stream)?;
            let id: Vec<u32> = a.ids.read_range(bad as usize, 1, stream)?;
            return Err(PlanError::NonFinitePosition { atom: id[0] as usize, position: [p[0].x, p[0].y, p[0].z] }.into());
        }
        let (stayers, leavers) = (info[abi::MIGRATE_INFO_STAYERS] as usize, info[abi::MIGRATE_INFO_LEAVERS] as usize);
        if stayers.checked_add(leavers) != Some(n) {
            return Err(HaloError::InvalidInput(format!("GPU migration of {n} atoms: the kernels counted {stayers} stayers and {leavers} leavers")));
        }
        let mut all = first[..leavers.min(first.len())].to_vec();
        if leavers > first.len() {
            all.extend_from_slice(&self.leavers.read_range(first.len(), leavers - first.len(), stream)?);
        }
        Ok(Migrated { stayers, leavers: all })
    }
}
