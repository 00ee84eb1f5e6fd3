//! The cluster grid on the GPU: the device buffers the force, prune and search kernels read (slots,
//! types, boxes, zones, column starts), filled either by uploading a host [`ClusterGrid`] or by
//! building it on the GPU (the `nbnxm_grid_*` kernels, `kernels-gpu/src/kernels/nbnxm_grid.rs`):
//! [`DeviceGrid::build`] for one undecomposed rank from device coordinates (wrapped in place),
//! [`DeviceGrid::build_local`] for any rank's [`LocalAtoms`] (home atoms and halo zones, periodic
//! only along undecomposed dimensions). Either gives exactly the grid `ClusterGrid::build` gives
//! on the host, slot for slot and box for box, zone by zone (`tests/gpu_grid.rs` checks it).
//!
//! Both take one path: the host describes the zones with atoms ([`ZonePlan`]: each zone's extent,
//! the whole box along periodic dimensions and the bounding box of its atoms along the others,
//! and its column shape, `column_shape` as the host grid takes it), the five passes sort the atoms
//! of all zones as one column array (each zone's columns numbered after those of the zones before
//! it, plus one empty column that closes the zone), so superclusters are numbered zone by zone,
//! home first, as on the host. A build enqueues a copy of the zone table and the five passes on the
//! caller's stream; three words tell the host what they found: the superclusters, the first atom
//! with a non-finite coordinate, the largest atom type. [`DeviceGrid::build`] and
//! [`DeviceGrid::build_local`] synchronise the stream to read them back; the search step
//! (`NbnxmGpu::update_resident`, `update_local`) does not: it enqueues the search's count pass on
//! the grid at once, sized by the plan's bound on the superclusters (`ZonePlan::most`; the kernels
//! read the count from the device's word), and reads the three words back together with the
//! lists' totals, in the search's one synchronisation, then checks them ([`DeviceGrid::settle`])
//! before any list is written. The buffers are reused from one build to the next, grown with
//! headroom when a build needs more.

use super::gpu::HomeOnDevice;
use super::gpu_search::{fit, grow};
use super::grid::{BBox, ClusterGrid, ZoneGrid, column_shape};
use super::local::{HomeChecked, ZoneFacts};
use super::{LocalAtoms, NbnxmError};
use crate::abi::{self, Float3, NBNXM_MASK_BITS, NbnxmBox, NbnxmZone};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape, StagedPart, Staging};
use crate::kernel_args;
use crate::lookup::{TypesByIdKernel, enqueue_lookup};
use bytemuck::Pod;

const SS: usize = abi::NBNXM_SUPER_SIZE as usize;
const SC: usize = abi::NBNXM_CLUSTERS_PER_SUPER as usize;

/// What a GPU build produced: the grid's size and the shape of its first zone.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GridInfo {
    /// Atoms in the grid (home and halo).
    pub atoms: usize,
    /// Home atoms (`[0, home_atoms)`).
    pub home_atoms: usize,
    /// Superclusters (64 slots each).
    pub superclusters: usize,
    /// Clusters (8 per supercluster, empty ones included).
    pub clusters: usize,
    /// Zones with atoms (each has its own column grid; [`DeviceGrid::to_host`] reads them all).
    pub zones: usize,
    /// Columns along x and y of the first zone (the home zone when it has atoms; none without atoms).
    pub columns: [usize; 2],
    /// Column widths along x and y of the first zone (nm).
    pub cell: [f32; 2],
    /// The first zone's extent ([`BBox::EMPTY`] without atoms); `[0, box)` along every dimension
    /// for [`DeviceGrid::build`].
    pub extent: BBox,
    /// Box edges (nm).
    pub box_size: [f32; 3],
    /// Dimensions searched through periodic images (all for [`DeviceGrid::build`]).
    pub periodic: [bool; 3],
    /// The largest atom type among the atoms (0 without atoms).
    pub max_type: u32,
}

/// What the search kernels need to know of the grid the buffers hold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Held {
    /// At most this many superclusters: the count of an uploaded or checked grid, the plan's bound
    /// (`ZonePlan::most`) of a build whose words were not read yet ([`PendingGrid`]). The device's
    /// info word holds the count either way (the search kernels read it there).
    pub(crate) superclusters: usize,
    /// Zones with atoms (entries of `zones`).
    pub(crate) zones: usize,
    /// Dimensions searched through periodic images.
    pub(crate) periodic: [bool; 3],
    /// Box edges (nm).
    pub(crate) box_size: [f32; 3],
    /// Whether the search buffers were copied from pageable host memory ([`DeviceGrid::upload_boxes`]:
    /// the copies may still be in flight) rather than built on the GPU (complete when the build returns).
    pub(crate) uploaded: bool,
}

/// The zones of a GPU build, as the host describes them before the passes: the zone table the
/// passes read and complete, and the sizes of the column array and of the grid's buffers.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ZonePlan {
    /// Every zone with atoms, ascending (home first): extent, column shape, `column_base` (zone
    /// by zone, its columns and one empty column each); `sc_end` is the passes' to fill.
    pub(crate) table: Vec<NbnxmZone>,
    /// Bit `z` set for every zone `z` in the table.
    pub(crate) mask: u32,
    /// Columns of all zones, each zone's empty closing column included.
    pub(crate) columns: usize,
    /// At most this many superclusters (each column adds `ceil(count / 64)`, at most one more than
    /// its share of the zone's `atoms / 64`).
    pub(crate) most: usize,
}

impl ZonePlan {
    /// The plan of zones `(zone, atoms, extent)`, ascending, each with atoms.
    fn new(zones: impl IntoIterator<Item = (u8, usize, BBox)>) -> Self {
        let mut plan = Self { table: Vec::new(), mask: 0, columns: 0, most: 0 };
        for (zone, atoms, extent) in zones {
            let (columns, cell) = column_shape(&extent, atoms);
            let ncol = columns[0] * columns[1];
            plan.table.push(NbnxmZone {
                extent: NbnxmBox { lo: extent.lo, hi: extent.hi },
                cell,
                columns: [columns[0] as u32, columns[1] as u32],
                column_base: plan.columns as u32,
                sc_end: 0,
                zone: u32::from(zone),
                reserved: 0,
            });
            plan.mask |= 1 << zone;
            plan.columns += ncol + 1;
            plan.most += atoms.div_ceil(SS) + ncol;
        }
        plan
    }

    /// `n` atoms of one undecomposed rank: one zone (none without atoms), the whole box.
    pub(crate) fn single(n: usize, box_size: [f32; 3]) -> Self {
        Self::new((n > 0).then_some((0, n, BBox { lo: [0.0; 3], hi: box_size })))
    }

    /// The zones of valid atoms with these facts ([`LocalAtoms::zone_facts`]): every zone with
    /// atoms, with the extent the host grid gives it (the whole box along periodic dimensions, the
    /// bounding box of its atoms along the others).
    fn of(facts: &ZoneFacts) -> Self {
        Self::new((0..8u8).filter(|&z| facts.count[usize::from(z)] > 0).map(|z| (z, facts.count[usize::from(z)], facts.extent[usize::from(z)])))
    }

    /// The zones of `atoms` (validated: every zone below 8), atom by atom in ascending order: the
    /// reference of [`Self::checked`] ([`LocalAtoms::zone_facts_by_atom`], the `f32::min`/`max` fold
    /// the host grid takes its extents from).
    #[cfg(test)]
    pub(crate) fn local(atoms: &LocalAtoms) -> Self {
        Self::of(&atoms.zone_facts_by_atom())
    }

    /// The zones of `atoms`, checked as [`LocalAtoms::validate`] checks them (the same error for
    /// invalid atoms), in one pass over the atoms ([`LocalAtoms::zone_facts`]): the plan of
    /// [`LocalAtoms::zone_facts_by_atom`] for valid atoms.
    #[cfg(test)]
    pub(crate) fn checked(atoms: &LocalAtoms) -> std::result::Result<Self, NbnxmError> {
        Self::checked_with(atoms, None)
    }

    /// [`Self::checked`], with the home atoms' part from `home` when given for these atoms
    /// ([`LocalAtoms::zone_facts_with`]): the same plan and errors.
    pub(crate) fn checked_with(atoms: &LocalAtoms, home: Option<HomeChecked>) -> std::result::Result<Self, NbnxmError> {
        Ok(Self::of(&atoms.zone_facts_with(home)?))
    }
}

/// A GPU build enqueued on a stream and not yet checked ([`DeviceGrid::settle`] does, from the
/// info words read back after the stream): what the host knew before the passes.
#[derive(Clone, Debug)]
pub(crate) struct PendingGrid {
    plan: ZonePlan,
    /// Atoms (home and halo), home atoms.
    n: usize,
    home: usize,
    box_size: [f32; 3],
    periodic: [bool; 3],
    /// The passes ran (atoms to sort): the info words are on the device. Without atoms the words
    /// are their defaults and nothing was enqueued.
    launched: bool,
    /// The one-rank build from device coordinates: no extent without atoms, but `[0, box)`.
    resident: bool,
}

impl PendingGrid {
    /// Atoms (home and halo) and home atoms of the build.
    pub(crate) fn sizes(&self) -> (usize, usize) {
        (self.n, self.home)
    }

    /// Whether `atoms` have this build's sizes and box.
    pub(crate) fn fits(&self, atoms: &LocalAtoms) -> bool {
        (self.n, self.home, self.box_size) == (atoms.len(), atoms.home, atoms.box_size)
    }

    /// What the search kernels need of the pending grid: the plan's bound on its superclusters.
    pub(crate) fn held(&self) -> Held {
        Held { superclusters: self.plan.most, zones: self.plan.table.len(), periodic: self.periodic, box_size: self.box_size, uploaded: false }
    }
}

/// Where the search kernels find a grid (device addresses into a [`DeviceGrid`]'s buffers) and
/// what they need to know of it, so that a search can run while the grid's record is updated
/// ([`DeviceGrid::settle`] touches no buffer). Valid while the [`DeviceGrid`] lives and until its
/// next build or upload (which may reallocate the buffers): the search that takes it runs between.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SearchGrid {
    pub(crate) super_bbox: u64,
    pub(crate) cluster_bbox: u64,
    pub(crate) super_zone: u64,
    pub(crate) zones: u64,
    pub(crate) column_start: u64,
    /// The info words ([`abi::NBNXM_GRID_INFO_WORDS`]); the search kernels read the count there.
    pub(crate) info: u64,
    pub(crate) held: Held,
}

/// The working arrays of a GPU build.
struct Scratch {
    /// Column of every atom.
    atom_column: DeviceBuffer<u32>,
    /// Atoms per column.
    counts: DeviceBuffer<u32>,
    /// First place of every column, and the total.
    atom_start: DeviceBuffer<u32>,
    /// Next free place of every column while scattering.
    cursor: DeviceBuffer<u32>,
    /// Keys `(z, atom)` by column, unordered within a column.
    keys: DeviceBuffer<u64>,
    /// The same keys sorted within each column.
    sorted: DeviceBuffer<u64>,
    /// The three words read back ([`abi::NBNXM_GRID_INFO_WORDS`]).
    info: DeviceBuffer<u32>,
    /// Coordinates of the local atoms of [`DeviceGrid::build_local`] (the grid's slots index them).
    x: DeviceBuffer<Float3>,
    /// Their atom types.
    types: DeviceBuffer<u32>,
    /// Their zones.
    zone_ids: DeviceBuffer<u8>,
    /// Page-locked staging of the uploads of [`DeviceGrid::enqueue_build_local`] (coordinates,
    /// types and zones: one batch, one wait and one event).
    staging: Staging<u8>,
}

/// One rank's cluster grid in device memory (see the module docs).
pub struct DeviceGrid {
    /// Local atom of every slot, `NBNXM_FILLER` for padding.
    pub(crate) atom_index: DeviceBuffer<u32>,
    /// Atom type of every slot (0 for padding).
    pub(crate) atom_type: DeviceBuffer<u32>,
    /// Box of every cluster.
    pub(crate) cluster_bbox: DeviceBuffer<NbnxmBox>,
    /// Box of every supercluster.
    pub(crate) super_bbox: DeviceBuffer<NbnxmBox>,
    /// Zone of every supercluster.
    pub(crate) super_zone: DeviceBuffer<u32>,
    /// The column grid of every zone.
    pub(crate) zones: DeviceBuffer<NbnxmZone>,
    /// Every zone's column starts, one after the other (`NbnxmZone::column_base`).
    pub(crate) column_start: DeviceBuffer<u32>,
    scratch: Scratch,
    /// The grid the search buffers hold (`None` after an upload of the slots alone, or a failed build).
    held: Option<Held>,
    /// The last GPU build, while its grid is held.
    built: Option<GridInfo>,
}

/// Copies `data` into the front of `buf` on `stream`, in stream order.
fn upload_async<T: Pod>(buf: &DeviceBuffer<T>, data: &[T], stream: &CudaStream) -> Result<()> {
    if data.len() > buf.len() {
        return Err(HaloError::InvalidInput(format!("copy of {} elements into a buffer of {}", data.len(), buf.len())));
    }
    if data.is_empty() {
        return Ok(());
    }
    buf.context().bind_to_thread().during("binding the context")?;
    // SAFETY: the range is inside the allocation (checked above). From pageable memory the driver
    // copies `data` to a staging buffer before returning (CUDA's "API synchronization behavior"
    // of `cuMemcpyHtoDAsync`), so `data` may go away afterwards; the copy into `buf` runs in
    // `stream`'s order, and `buf` is reallocated (freed) only by a later build, after this build's
    // search is complete (`build_local` synchronises the stream; a search waits for the last
    // one's lists, `NbnxmGpu::lists_complete`, before it builds again).
    unsafe { cudarc::driver::result::memcpy_htod_async(buf.device_ptr(), bytemuck::cast_slice::<T, u8>(data), stream.cu_stream()) }
        .during("copying to the GPU")
}

impl DeviceGrid {
    /// Empty buffers (one element each), grown by the first build or upload.
    pub fn new(module: &KernelModule) -> Result<Self> {
        let ctx = module.context();
        Ok(Self {
            atom_index: DeviceBuffer::uninit(ctx, 1)?,
            atom_type: DeviceBuffer::uninit(ctx, 1)?,
            cluster_bbox: DeviceBuffer::uninit(ctx, 1)?,
            super_bbox: DeviceBuffer::uninit(ctx, 1)?,
            super_zone: DeviceBuffer::uninit(ctx, 1)?,
            zones: DeviceBuffer::uninit(ctx, 1)?,
            column_start: DeviceBuffer::uninit(ctx, 1)?,
            scratch: Scratch {
                atom_column: DeviceBuffer::uninit(ctx, 1)?,
                counts: DeviceBuffer::uninit(ctx, 1)?,
                atom_start: DeviceBuffer::uninit(ctx, 1)?,
                cursor: DeviceBuffer::uninit(ctx, 1)?,
                keys: DeviceBuffer::uninit(ctx, 1)?,
                sorted: DeviceBuffer::uninit(ctx, 1)?,
                info: DeviceBuffer::uninit(ctx, abi::NBNXM_GRID_INFO_WORDS)?,
                x: DeviceBuffer::uninit(ctx, 1)?,
                types: DeviceBuffer::uninit(ctx, 1)?,
                zone_ids: DeviceBuffer::uninit(ctx, 1)?,
                staging: Staging::new(),
            },
            held: None,
            built: None,
        })
    }

    /// Where the search kernels find the grid the buffers hold, or the grid of `pending` (enqueued
    /// on the stream the search then uses, not yet checked); `None` without either.
    pub(crate) fn search_grid(&self, pending: Option<&PendingGrid>) -> Option<SearchGrid> {
        let held = pending.map(PendingGrid::held).or(self.held)?;
        Some(SearchGrid {
            super_bbox: self.super_bbox.device_ptr(),
            cluster_bbox: self.cluster_bbox.device_ptr(),
            super_zone: self.super_zone.device_ptr(),
            zones: self.zones.device_ptr(),
            column_start: self.column_start.device_ptr(),
            info: self.scratch.info.device_ptr(),
            held,
        })
    }

    /// The last GPU build's shape, while its grid is held.
    pub fn info(&self) -> Option<GridInfo> {
        self.built
    }

    /// Uploads `grid`'s slots and types (what the force and prune kernels read), synchronously;
    /// the search buffers no longer describe a grid until [`Self::upload_boxes`].
    pub(crate) fn upload_slots(&mut self, module: &KernelModule, grid: &ClusterGrid) -> Result<()> {
        self.held = None;
        self.built = None;
        fit(module, &mut self.atom_index, &grid.atom_index)?;
        fit(module, &mut self.atom_type, &grid.atom_type)
    }

    /// The zone table and column starts the search reads of `grid`: one [`NbnxmZone`] per zone,
    /// and every zone's column starts (its end included) one zone after the other.
    pub fn search_tables(grid: &ClusterGrid) -> (Vec<NbnxmZone>, Vec<u32>) {
        let mut flat = Vec::new();
        let zones = grid
            .zones
            .iter()
            .map(|z| {
                let base = flat.len() as u32;
                flat.extend_from_slice(&z.column_start);
                NbnxmZone {
                    extent: NbnxmBox { lo: z.extent.lo, hi: z.extent.hi },
                    cell: z.cell,
                    columns: [z.columns[0] as u32, z.columns[1] as u32],
                    column_base: base,
                    sc_end: z.superclusters().end as u32,
                    zone: u32::from(z.zone),
                    reserved: 0,
                }
            })
            .collect();
        (zones, flat)
    }

    /// The zone table and column starts the buffers hold after a GPU build, read back
    /// (synchronous; for checks: they equal [`Self::search_tables`] of the host's grid).
    pub fn read_search_tables(&self) -> Result<(Vec<NbnxmZone>, Vec<u32>)> {
        let held = self.held.ok_or_else(|| HaloError::InvalidInput("the device grid holds no grid".into()))?;
        let mut zones = self.zones.to_host()?;
        zones.truncate(held.zones);
        let len = zones.last().map_or(0, |z| (z.column_base + z.columns[0] * z.columns[1] + 1) as usize);
        let mut flat = self.column_start.to_host()?;
        flat.truncate(len);
        Ok((zones, flat))
    }

    /// Uploads what the search kernels read of `grid` (boxes, zones, column starts), synchronously
    /// from the host's side (the copies may still be in flight on the device: the caller orders
    /// them before a launch).
    pub(crate) fn upload_boxes(&mut self, module: &KernelModule, grid: &ClusterGrid) -> Result<()> {
        self.held = None;
        self.built = None;
        let to_box = |b: &BBox| NbnxmBox { lo: b.lo, hi: b.hi };
        fit(module, &mut self.super_bbox, &grid.super_bbox.iter().map(to_box).collect::<Vec<_>>())?;
        fit(module, &mut self.cluster_bbox, &grid.cluster_bbox.iter().map(to_box).collect::<Vec<_>>())?;
        fit(module, &mut self.super_zone, &grid.super_zone.iter().map(|&z| u32::from(z)).collect::<Vec<_>>())?;
        let (zones, flat) = Self::search_tables(grid);
        fit(module, &mut self.zones, &zones)?;
        fit(module, &mut self.column_start, &flat)?;
        // The search kernels read the count from the device's info words (a GPU build's, else these).
        let count = u32::try_from(grid.superclusters())
            .map_err(|_| HaloError::InvalidInput(format!("{} superclusters, more than a u32 counts", grid.superclusters())))?;
        let mut words = [0u32; abi::NBNXM_GRID_INFO_WORDS];
        words[abi::NBNXM_GRID_INFO_BAD_ATOM] = u32::MAX;
        words[abi::NBNXM_GRID_INFO_SUPERCLUSTERS] = count;
        self.scratch.info.copy_from_host(&words)?;
        self.held =
            Some(Held { superclusters: grid.superclusters(), zones: zones.len(), periodic: grid.periodic, box_size: grid.box_size, uploaded: true });
        Ok(())
    }

    /// Builds the cluster grid of `n` atoms at `x` (device coordinates; wrapped into the box in
    /// place first when `wrap`, exactly as `decomp::wrap_position` wraps them) with atom types
    /// `types` (one per atom), all home, every dimension periodic in a box of `box_size`: the grid
    /// of `ClusterGrid::build(&LocalAtoms::single_rank(..))`. Enqueues the passes on `stream` and
    /// synchronises it. An atom with a non-finite coordinate is an error naming the first such atom
    /// (the buffers then hold no grid; the finite atoms' coordinates may be wrapped already).
    #[allow(clippy::too_many_arguments)]
    pub fn build(
        &mut self,
        module: &KernelModule,
        x: &impl DeviceMemory<Float3>,
        types: &DeviceBuffer<u32>,
        n: usize,
        box_size: [f32; 3],
        wrap: bool,
        stream: &CudaStream,
    ) -> Result<GridInfo> {
        let pending = self.enqueue_build(module, x, types, n, box_size, wrap, stream)?;
        let words = self.read_words(&pending, stream)?;
        self.settle(&pending, words, |atom| Ok(x.to_host()?.get(atom).copied().unwrap_or_default()))
    }

    /// [`Self::build`]'s checks and passes, enqueued on `stream` without waiting for them: the
    /// grid to [`Self::settle`] once the info words are read back after `stream` (the buffers hold
    /// no grid until then; `x` and `types` must stay valid until the passes ran).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enqueue_build(
        &mut self,
        module: &KernelModule,
        x: &impl DeviceMemory<Float3>,
        types: &DeviceBuffer<u32>,
        n: usize,
        box_size: [f32; 3],
        wrap: bool,
        stream: &CudaStream,
    ) -> Result<PendingGrid> {
        self.held = None;
        self.built = None;
        let bad = |m: String| Err(HaloError::InvalidInput(format!("GPU cluster grid: {m}")));
        if x.len() < n || types.len() < n {
            return bad(format!("{n} atoms, but the coordinates hold {} and the types {}", x.len(), types.len()));
        }
        if !box_size.iter().all(|l| l.is_finite() && *l > 0.0) {
            return bad(format!("box {box_size:?} must have positive finite edges"));
        }
        if n >= u32::MAX as usize {
            return bad(format!("{n} atoms, more than a u32 index holds"));
        }
        let plan = ZonePlan::single(n, box_size);
        self.passes(module, Atoms { x: x.device_ptr(), types: types.device_ptr(), zone_ids: 0, n }, box_size, wrap, &plan, stream)?;
        Ok(PendingGrid { plan, n, home: n, box_size, periodic: [true; 3], launched: n > 0, resident: true })
    }

    /// Builds the cluster grid of `atoms` (any rank's local atoms: home atoms and halo zones,
    /// periodic only along undecomposed dimensions; positions as they are, never wrapped) on the
    /// GPU: the grid of `ClusterGrid::build(atoms)`, every zone's. Copies the coordinates, types and
    /// zones into device buffers of its own (which the grid's slots then index; reused from one
    /// build to the next) and enqueues the passes on `stream`, which it synchronises. Invalid
    /// atoms are refused as the host's build refuses them (`LocalAtoms::validate`), before any
    /// copy (the buffers then hold no grid).
    pub fn build_local(&mut self, module: &KernelModule, atoms: &LocalAtoms, stream: &CudaStream) -> Result<GridInfo> {
        self.build_local_with(module, atoms, None, stream)
    }

    /// [`Self::build_local`] with the home atoms' arrays taken on the device from `home_on`
    /// ([`HomeOnDevice`]: coordinates copied, types made from the ids where it has them): the
    /// same grid, with only the halo atoms' coordinates and types and every atom's zone uploaded. `home_on` must hold
    /// `atoms`' home part, bit for bit (checked only for its length).
    pub fn build_local_from(
        &mut self,
        module: &KernelModule,
        atoms: &LocalAtoms,
        home_on: HomeOnDevice<'_>,
        stream: &CudaStream,
    ) -> Result<GridInfo> {
        self.build_local_with(module, atoms, Some(home_on), stream)
    }

    fn build_local_with(
        &mut self,
        module: &KernelModule,
        atoms: &LocalAtoms,
        home_on: Option<HomeOnDevice<'_>>,
        stream: &CudaStream,
    ) -> Result<GridInfo> {
        let pending = self.enqueue_build_local(module, atoms, home_on, None, stream)?;
        let words = self.read_words(&pending, stream)?;
        self.settle(&pending, words, |atom| Ok(atoms.held_position(atom).unwrap_or(Float3::new(f32::NAN, f32::NAN, f32::NAN))))
    }

    /// [`Self::build_local`]'s checks, copies and passes, enqueued on `stream` without waiting for
    /// them: the grid to [`Self::settle`] once the info words are read back after `stream` (the
    /// buffers hold no grid until then). The copies go through page-locked staging kept with the
    /// grid (one host `memcpy` each, the DMA in `stream`'s order), so `atoms` may go away
    /// afterwards.
    ///
    /// `home_on`, when given, holds the home atoms' arrays on this GPU already ([`HomeOnDevice`]:
    /// a redecomposition on the GPU leaves them there): their coordinates are copied on the
    /// device and their types made there from their ids when it has them (kernel `types_by_id`),
    /// so that of the home atoms only their zones cross the bus (a byte each). Its buffers must not
    /// be written until `stream` has run these passes. The host's checks and the zones' shape
    /// read `atoms` whole, or only the halo atoms when `home` hands them the home atoms' part
    /// ([`ZonePlan::checked_with`]).
    pub(crate) fn enqueue_build_local(
        &mut self,
        module: &KernelModule,
        atoms: &LocalAtoms,
        home_on: Option<HomeOnDevice<'_>>,
        home: Option<HomeChecked>,
        stream: &CudaStream,
    ) -> Result<PendingGrid> {
        self.held = None;
        self.built = None;
        // The checks and the zones' shape in one pass over the atoms.
        let plan = tracing::debug_span!("search.grid.zone_plan")
            .in_scope(|| ZonePlan::checked_with(atoms, home))
            .map_err(|e| HaloError::InvalidInput(e.to_string()))?;
        let n = atoms.len();
        if n >= u32::MAX as usize {
            return Err(HaloError::InvalidInput(format!("GPU cluster grid: {n} atoms, more than a u32 index holds")));
        }
        if let Some(on) = home_on {
            check_home_on_device(on, atoms.home)?;
        }
        // Home atoms whose types were left to the GPU need its lookup, and those whose positions
        // stayed there its coordinates.
        if home_on.is_none_or(|on| on.types.is_none()) {
            atoms.check_types_held().map_err(|e| HaloError::InvalidInput(e.to_string()))?;
        }
        if home_on.is_none() {
            atoms.check_positions_held().map_err(|e| HaloError::InvalidInput(e.to_string()))?;
        }
        let s = &mut self.scratch;
        let span = tracing::debug_span!("search.grid.stage").entered();
        grow(module, &mut s.x, n)?;
        grow(module, &mut s.types, n)?;
        grow(module, &mut s.zone_ids, n)?;
        // What crosses from the host, in one staged batch: the halo atoms' coordinates (every
        // atom's without `home_on`), the types the GPU does not look up, and the zones whole (a
        // byte an atom: one copy costs less than a memset of the home atoms' part and a copy of
        // the rest).
        let x_from = if home_on.is_some() { atoms.home } else { 0 };
        let types_from = if home_on.is_some_and(|on| on.types.is_some()) { atoms.home } else { 0 };
        let parts = [
            StagedPart::new(&atoms.positions[x_from..], &s.x, x_from)?,
            StagedPart::new(&atoms.types[types_from..], &s.types, types_from)?,
            StagedPart::new(&atoms.zones, &s.zone_ids, 0)?,
        ];
        s.staging.upload_parts(&parts, stream)?;
        if let Some(on) = home_on {
            s.x.copy_prefix_from_async(on.x, atoms.home, stream)?;
            if let Some(t) = on.types {
                enqueue_lookup::<TypesByIdKernel>(module, t.ids, t.by_id, &s.types, atoms.home, stream)?;
            }
        }
        drop(span);
        let on = Atoms { x: s.x.device_ptr(), types: s.types.device_ptr(), zone_ids: s.zone_ids.device_ptr(), n };
        tracing::debug_span!("search.grid.passes").in_scope(|| self.passes(module, on, atoms.box_size, false, &plan, stream))?;
        Ok(PendingGrid { plan, n, home: atoms.home, box_size: atoms.box_size, periodic: atoms.periodic, launched: n > 0, resident: false })
    }

    /// Enqueues on `stream` device-to-device copies of the first `home` atoms' coordinates and
    /// types that the last [`Self::enqueue_build_local`] copied into this grid's own buffers
    /// (enqueued on the same `stream` before, so in its order after them) into elements `0..home`
    /// of `x` and `types`: bit for bit the local atoms' `positions[..home]` and `types[..home]`
    /// (the passes only read these buffers). Nothing past `home` is written. The source buffers
    /// are reallocated only by a later build, after this search is complete (`NbnxmGpu` waits
    /// for the last search's lists, `lists_complete`, before the next build).
    pub(crate) fn enqueue_home_copies(
        &self,
        home: usize,
        x: &dyn DeviceMemory<Float3>,
        types: &dyn DeviceMemory<u32>,
        stream: &CudaStream,
    ) -> Result<()> {
        x.copy_prefix_from_async(&self.scratch.x, home, stream)?;
        types.copy_prefix_from_async(&self.scratch.types, home, stream)
    }

    /// The info words of `pending`'s passes, read back after synchronising `stream` (the
    /// defaults without atoms, without waiting: nothing was enqueued).
    pub(crate) fn read_words(&self, pending: &PendingGrid, stream: &CudaStream) -> Result<[u32; abi::NBNXM_GRID_INFO_WORDS]> {
        if !pending.launched {
            return Ok(default_words());
        }
        stream.synchronize().during("waiting for the GPU cluster grid")?;
        let back = self.scratch.info.to_host()?;
        let mut words = [0u32; abi::NBNXM_GRID_INFO_WORDS];
        words.copy_from_slice(&back[..abi::NBNXM_GRID_INFO_WORDS]);
        Ok(words)
    }

    /// Checks the info words `words` of `pending`'s passes, read back after them, and records the
    /// grid (what [`Self::build`] or [`Self::build_local`] return): an atom with a non-finite
    /// coordinate is an error naming the first such atom and its coordinate (`coordinate(atom)`),
    /// as are more clusters than a list word addresses; the buffers then hold no grid. Touches no
    /// device buffer (a search may hold a [`SearchGrid`] of them).
    pub(crate) fn settle(
        &mut self,
        pending: &PendingGrid,
        words: [u32; abi::NBNXM_GRID_INFO_WORDS],
        coordinate: impl FnOnce(usize) -> Result<Float3>,
    ) -> Result<GridInfo> {
        self.held = None;
        self.built = None;
        let n = pending.n;
        if let Some(atom) = Some(words[abi::NBNXM_GRID_INFO_BAD_ATOM] as usize).filter(|&a| a < n) {
            let p = coordinate(atom)?;
            let (d, value) = [p.x, p.y, p.z].into_iter().enumerate().find(|(_, v)| !v.is_finite()).unwrap_or((0, p.x));
            let e = NbnxmError::NonFinite { atom, dim: super::DIMS[d], value };
            return Err(HaloError::InvalidInput(e.to_string()));
        }
        let mut info = self.finish(words, &pending.plan, n, pending.home, pending.box_size, pending.periodic)?;
        if n == 0 && pending.resident {
            info.extent = BBox { lo: [0.0; 3], hi: pending.box_size };
            self.built = Some(info);
        }
        Ok(info)
    }

    /// The coordinates the last [`Self::build_local`] copied (the atoms its grid's slots index):
    /// what the force and prune kernels read for a grid built from [`LocalAtoms`] when no other
    /// coordinate array holds them.
    pub fn local_coordinates(&self) -> &DeviceBuffer<Float3> {
        &self.scratch.x
    }

    /// Checks a build's words and records the grid: its [`GridInfo`] and what the search needs.
    /// The count never exceeds the plan's bound (`ZonePlan::most`, what the buffers and the search
    /// were sized for); a count above it would be a defect of the passes, refused here.
    fn finish(&mut self, words: [u32; 3], plan: &ZonePlan, n: usize, home: usize, box_size: [f32; 3], periodic: [bool; 3]) -> Result<GridInfo> {
        let superclusters = words[abi::NBNXM_GRID_INFO_SUPERCLUSTERS] as usize;
        if superclusters > plan.most {
            return Err(HaloError::InvalidInput(format!("GPU cluster grid: {superclusters} superclusters, above the bound {}", plan.most)));
        }
        let max_clusters = 1usize << (32 - NBNXM_MASK_BITS);
        if superclusters * SC > max_clusters {
            let e = NbnxmError::TooManyClusters { clusters: superclusters * SC, max: max_clusters };
            return Err(HaloError::InvalidInput(e.to_string()));
        }
        let first = plan.table.first();
        let info = GridInfo {
            atoms: n,
            home_atoms: home,
            superclusters,
            clusters: superclusters * SC,
            zones: plan.table.len(),
            columns: first.map_or([0; 2], |z| [z.columns[0] as usize, z.columns[1] as usize]),
            cell: first.map_or([0.0; 2], |z| z.cell),
            extent: first.map_or(BBox::EMPTY, |z| BBox { lo: z.extent.lo, hi: z.extent.hi }),
            box_size,
            periodic,
            max_type: words[abi::NBNXM_GRID_INFO_MAX_TYPE],
        };
        self.held = Some(Held { superclusters, zones: plan.table.len(), periodic, box_size, uploaded: false });
        self.built = Some(info);
        Ok(info)
    }

    /// Enqueues the five passes over `on`'s atoms in the zones of `plan` (see the module docs) on
    /// `stream`, with no wait: the info words are on the device when `stream` gets past them
    /// (nothing is enqueued without atoms: the words are then [`default_words`]). The buffers
    /// grown here may be freed (reallocated) only because the last build's or search's work on
    /// them is complete: a build alone synchronises its stream, and `NbnxmGpu` waits for the last
    /// search's lists (`lists_complete`) before it builds again.
    ///
    /// A bad atom (non-finite coordinate) leaves a consistent grid of the other atoms: it gets no
    /// column (`u32::MAX`), is not counted, scattered, sorted nor filled, so every pass and the
    /// search after them stay inside their buffers (sized for all `n` atoms and the plan's bound)
    /// until the host sees the error.
    fn passes(&mut self, module: &KernelModule, on: Atoms, box_size: [f32; 3], wrap: bool, plan: &ZonePlan, stream: &CudaStream) -> Result<()> {
        let n = on.n;
        if n == 0 {
            return Ok(());
        }
        let (ncol, most) = (plan.columns, plan.most);
        grow(module, &mut self.atom_index, most * SS)?;
        grow(module, &mut self.atom_type, most * SS)?;
        grow(module, &mut self.cluster_bbox, most * SC)?;
        grow(module, &mut self.super_bbox, most)?;
        grow(module, &mut self.super_zone, most)?;
        grow(module, &mut self.zones, plan.table.len())?;
        grow(module, &mut self.column_start, ncol + 1)?;
        let s = &mut self.scratch;
        grow(module, &mut s.atom_column, n)?;
        grow(module, &mut s.counts, ncol)?;
        grow(module, &mut s.atom_start, ncol + 1)?;
        grow(module, &mut s.cursor, ncol)?;
        grow(module, &mut s.keys, n)?;
        grow(module, &mut s.sorted, n)?;
        upload_async(&self.zones, &plan.table, stream)?;
        s.counts.zero_range_async(0, ncol, stream)?;
        s.info.fill_bytes_async(0xff, stream)?;
        s.info.zero_range_async(abi::NBNXM_GRID_INFO_MAX_TYPE, 1, stream)?;

        let (mut px, mut nn, [mut bx, mut by, mut bz], mut wr) = (on.x, n as u32, box_size, u32::from(wrap));
        let (mut zid, mut mask, mut zone, mut nz) = (on.zone_ids, plan.mask, self.zones.device_ptr(), plan.table.len() as u32);
        let (mut col, mut counts, mut info_p, mut ty) = (s.atom_column.device_ptr(), s.counts.device_ptr(), s.info.device_ptr(), on.types);
        let per_atom =
            LaunchShape { grid: (n.div_ceil(abi::NBNXM_GRID_THREADS as usize) as u32, 1), block: abi::NBNXM_GRID_THREADS, shared_bytes: 0 };
        let mut args = kernel_args![px, nn, bx, by, bz, wr, zid, mask, zone, col, counts, info_p, ty];
        // SAFETY: arguments match `nbnxm_grid_bin`; the atoms' coordinates, types and zones (when
        // given) hold `n` entries (the callers' checks), the column array `n`; the zone table (copied
        // above, in stream order) has an entry for every zone of the mask, which holds every atom's
        // zone (the plan counted them), with positive cells (`column_shape` of an extent at least
        // 1e-3 wide) and at least one column each way; the counts cover every zone's columns
        // (zeroed above), the info words 3.
        unsafe { module.launch(abi::NBNXM_GRID_BIN, per_atom, stream, &mut args)? };

        let (mut nc, mut start, mut cursor, mut cs) = (ncol as u32, s.atom_start.device_ptr(), s.cursor.device_ptr(), self.column_start.device_ptr());
        let one = LaunchShape { grid: (1, 1), block: abi::NBNXM_GRID_SCAN_THREADS, shared_bytes: abi::NBNXM_GRID_SCAN_SHARED_BYTES };
        let mut args = kernel_args![counts, nc, start, cursor, cs, zone, nz, info_p];
        // SAFETY: arguments match `nbnxm_grid_columns`: counts and cursor of `ncol` columns, starts
        // of `ncol + 1`, the plan's zones (at most 8) with their columns inside `ncol`, one block
        // with its shared sums.
        unsafe { module.launch(abi::NBNXM_GRID_COLUMNS, one, stream, &mut args)? };

        let mut keys = s.keys.device_ptr();
        let mut args = kernel_args![px, nn, col, cursor, keys];
        // SAFETY: arguments match `nbnxm_grid_scatter`: each column's cursor starts at its first
        // place and moves once per atom the first pass counted in it, so every key lands in `keys`.
        unsafe { module.launch(abi::NBNXM_GRID_SCATTER, per_atom, stream, &mut args)? };

        let mut sorted = s.sorted.device_ptr();
        let per_column = LaunchShape { grid: (ncol as u32, 1), block: abi::NBNXM_GRID_SORT_THREADS, shared_bytes: abi::NBNXM_GRID_SORT_SHARED_BYTES };
        let mut args = kernel_args![start, keys, sorted];
        // SAFETY: arguments match `nbnxm_grid_sort`: one block per column, its places inside `n`.
        unsafe { module.launch(abi::NBNXM_GRID_SORT, per_column, stream, &mut args)? };

        let (mut ai, mut at, mut cb, mut sb, mut sz) = (
            self.atom_index.device_ptr(),
            self.atom_type.device_ptr(),
            self.cluster_bbox.device_ptr(),
            self.super_bbox.device_ptr(),
            self.super_zone.device_ptr(),
        );
        let per_super = LaunchShape {
            grid: (most.div_ceil(abi::NBNXM_GRID_FILL_WARPS as usize) as u32, 1),
            block: abi::NBNXM_GRID_FILL_WARPS * 32,
            shared_bytes: abi::NBNXM_GRID_FILL_SHARED_BYTES,
        };
        let mut args = kernel_args![px, ty, zid, sorted, start, cs, nc, info_p, ai, at, cb, sb, sz];
        // SAFETY: arguments match `nbnxm_grid_fill`: warps for `most` superclusters, at least the
        // total the scan found (`ZonePlan::most`); the outputs hold `most` superclusters; the
        // zones' empty closing columns own no supercluster.
        unsafe { module.launch(abi::NBNXM_GRID_FILL, per_super, stream, &mut args) }
    }

    /// The grid of the last GPU build ([`Self::build`] or [`Self::build_local`]) read back, as the
    /// host's [`ClusterGrid`] with `ntypes` atom types, every zone's column grid (synchronous; for
    /// checks). An error when the buffers hold no GPU-built grid.
    pub fn to_host(&self, ntypes: usize) -> Result<ClusterGrid> {
        let info = self.built.ok_or_else(|| HaloError::InvalidInput("the device grid holds no GPU-built grid".into()))?;
        let s = info.superclusters;
        let read = |v: Vec<u32>, len: usize| v[..len].to_vec();
        let boxes = |v: Vec<NbnxmBox>, len: usize| v[..len].iter().map(|b| BBox { lo: b.lo, hi: b.hi }).collect::<Vec<_>>();
        let (table, flat) = self.read_search_tables()?;
        let zones = zone_grids(&table, &flat);
        Ok(ClusterGrid {
            atom_index: read(self.atom_index.to_host()?, s * SS),
            atom_type: read(self.atom_type.to_host()?, s * SS),
            cluster_bbox: boxes(self.cluster_bbox.to_host()?, s * SC),
            super_bbox: boxes(self.super_bbox.to_host()?, s),
            super_zone: self.super_zone.to_host()?[..s].iter().map(|&z| z as u8).collect(),
            zones,
            box_size: info.box_size,
            periodic: info.periodic,
            atoms: info.atoms,
            home_atoms: info.home_atoms,
            ntypes,
        })
    }

    /// Sets every byte of every buffer to 0xff, synchronously (for checks: poison before a build,
    /// which must write every element of the grid it reports).
    pub fn poison(&self) -> Result<()> {
        self.atom_index.fill_bytes(0xff)?;
        self.atom_type.fill_bytes(0xff)?;
        self.cluster_bbox.fill_bytes(0xff)?;
        self.super_bbox.fill_bytes(0xff)?;
        self.super_zone.fill_bytes(0xff)?;
        self.zones.fill_bytes(0xff)?;
        self.column_start.fill_bytes(0xff)?;
        let s = &self.scratch;
        for b in [&s.atom_column, &s.counts, &s.atom_start, &s.cursor, &s.info, &s.types] {
            b.fill_bytes(0xff)?;
        }
        s.x.fill_bytes(0xff)?;
        s.zone_ids.fill_bytes(0xff)?;
        s.keys.fill_bytes(0xff)?;
        s.sorted.fill_bytes(0xff)
    }

    /// The first zone the last build wrote, read back (for checks).
    pub fn zone(&self) -> Result<NbnxmZone> {
        Ok(self.zones.to_host()?[0])
    }
}

/// The info words of passes that did not run (no atoms): no bad atom, no supercluster, type 0.
fn default_words() -> [u32; abi::NBNXM_GRID_INFO_WORDS] {
    let mut words = [0u32; abi::NBNXM_GRID_INFO_WORDS];
    words[abi::NBNXM_GRID_INFO_BAD_ATOM] = u32::MAX;
    words
}

/// The atoms of a build, by device address: coordinates, types and zones (0: all home), `n` each.
#[derive(Clone, Copy)]
struct Atoms {
    x: u64,
    types: u64,
    zone_ids: u64,
    n: usize,
}

/// The host's column grids of the zones in `table`, each zone's column starts taken from `flat`
/// (every zone's, one after the other, at its `column_base`).
fn zone_grids(table: &[NbnxmZone], flat: &[u32]) -> Vec<ZoneGrid> {
    table
        .iter()
        .map(|z| {
            let base = z.column_base as usize;
            ZoneGrid {
                zone: z.zone as u8,
                extent: BBox { lo: z.extent.lo, hi: z.extent.hi },
                columns: z.columns.map(|c| c as usize),
                cell: z.cell,
                column_start: flat[base..=base + (z.columns[0] * z.columns[1]) as usize].to_vec(),
            }
        })
        .collect()
}

/// An error unless `on` holds the arrays of `home` home atoms: coordinates, and ids when it has
/// them (checked before anything is enqueued).
fn check_home_on_device(on: HomeOnDevice<'_>, home: usize) -> Result<()> {
    if on.x.len() < home {
        return Err(HaloError::InvalidInput(format!("GPU cluster grid: {} home coordinates on the GPU for {home} home atoms", on.x.len())));
    }
    if let Some(t) = on.types {
        if t.ids.len() < home {
            return Err(HaloError::InvalidInput(format!("GPU cluster grid: {} home ids on the GPU for {home} home atoms", t.ids.len())));
        }
        if t.by_id.len() >= u32::MAX as usize {
            return Err(HaloError::InvalidInput(format!("GPU cluster grid: a table of {} types by id, more than a u32 id reaches", t.by_id.len())));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decomp::wrap_position;
    use crate::nbnxm::LocalAtoms;
    use crate::nbnxm::grid::{column_of, key};
    use crate::system::MolecularSystem;
    use abi::{NBNXM_FILLER, nbnxm_cluster_atoms};
    use rand::{Rng, SeedableRng};

    /// The GPU passes run on the CPU, step for step as the kernels take them (the zone plan; columns
    /// counted in one array over all zones and scanned, each zone's end from its empty closing
    /// column; keys scattered in an order unrelated to the atoms', ranked within each column, each
    /// chunk's halves, quarters and clusters by rank): the grid of `atoms` as the passes leave it,
    /// and the zone table and column starts the search reads.
    fn passes(a: &LocalAtoms, plan: &ZonePlan) -> (ClusterGrid, Vec<NbnxmZone>, Vec<u32>) {
        let n = a.len();
        let ncol = plan.columns;
        let entry = |i: usize| &plan.table[(plan.mask & ((1u32 << a.zones[i]) - 1)).count_ones() as usize];
        let col: Vec<usize> = (0..n)
            .map(|i| {
                let (p, z) = (a.positions[i], entry(i));
                let [cx, cy] = z.columns.map(|c| c as usize);
                z.column_base as usize + column_of(p.x, z.extent.lo[0], z.cell[0], cx) + cx * column_of(p.y, z.extent.lo[1], z.cell[1], cy)
            })
            .collect();
        let mut counts = vec![0u32; ncol];
        col.iter().for_each(|&c| counts[c] += 1);
        let (mut atom_start, mut column_start) = (vec![0u32; ncol + 1], vec![0u32; ncol + 1]);
        for c in 0..ncol {
            atom_start[c + 1] = atom_start[c] + counts[c];
            column_start[c + 1] = column_start[c] + counts[c].div_ceil(SS as u32);
        }
        let mut table = plan.table.clone();
        for z in &mut table {
            z.sc_end = column_start[(z.column_base + z.columns[0] * z.columns[1]) as usize];
        }
        let mut cursor = atom_start.clone();
        let mut keys = vec![0u64; n];
        for i in (0..n).rev() {
            keys[cursor[col[i]] as usize] = key(a.positions[i].z, i as u32);
            cursor[col[i]] += 1;
        }
        let mut sorted = vec![0u64; n];
        for c in 0..ncol {
            let k = &keys[atom_start[c] as usize..atom_start[c + 1] as usize];
            for &mine in k {
                sorted[atom_start[c] as usize + k.iter().filter(|&&o| o < mine).count()] = mine;
            }
        }
        let total = column_start[ncol] as usize;
        let zones = zone_grids(&table, &column_start);
        let mut g = ClusterGrid {
            atom_index: vec![0xdead; total * SS],
            atom_type: vec![0xdead; total * SS],
            cluster_bbox: vec![BBox { lo: [f32::NAN; 3], hi: [f32::NAN; 3] }; total * SC],
            super_bbox: vec![BBox { lo: [f32::NAN; 3], hi: [f32::NAN; 3] }; total],
            super_zone: vec![0xee; total],
            zones,
            box_size: a.box_size,
            periodic: a.periodic,
            atoms: n,
            home_atoms: a.home,
            ntypes: a.ntypes,
        };
        for s in 0..total as u32 {
            // The fill's search over all columns, closing ones included.
            let c = column_start[..ncol].partition_point(|&v| v <= s) - 1;
            let first = atom_start[c] + SS as u32 * (s - column_start[c]);
            let len = (atom_start[c + 1] - first).min(SS as u32);
            assert!(len > 0, "supercluster {s} in column {c} has atoms");
            let atom = |t: u32| sorted[(first + t) as usize] as u32;
            let coords = |t: u32| a.positions[atom(t) as usize];
            let ky: Vec<u64> = (0..SS as u32).map(|t| if t < len { key(coords(t).y, atom(t)) } else { u64::MAX }).collect();
            let kx: Vec<u64> = (0..SS as u32).map(|t| if t < len { key(coords(t).x, atom(t)) } else { u64::MAX }).collect();
            let half = |t: usize| (t / 32) * 32..(t / 32) * 32 + 32;
            let upper: Vec<bool> = (0..SS).map(|t| half(t).filter(|&u| ky[u] < ky[t]).count() >= 16).collect();
            let mut pos = [[0.0f32; 3]; SS];
            let out = s as usize * SS;
            for t in 0..SS {
                if (t as u32) < len {
                    let rank = half(t).filter(|&u| upper[u] == upper[t] && kx[u] < kx[t]).count();
                    let xh = usize::from(rank >= CL_);
                    let slot = (4 * (t / 32) + 2 * usize::from(upper[t]) + xh) * CL_ + rank - CL_ * xh;
                    g.atom_index[out + slot] = atom(t as u32);
                    g.atom_type[out + slot] = a.types[atom(t as u32) as usize];
                    let p = coords(t as u32);
                    pos[slot] = [p.x, p.y, p.z];
                }
                if t as u32 % CL_ as u32 >= nbnxm_cluster_atoms(t as u32 / CL_ as u32, len) {
                    g.atom_index[out + t] = NBNXM_FILLER;
                    g.atom_type[out + t] = 0;
                }
            }
            let mut sb = BBox::EMPTY;
            for k in 0..SC {
                let mut b = BBox::EMPTY;
                (0..nbnxm_cluster_atoms(k as u32, len) as usize).for_each(|j| b.include(pos[k * CL_ + j]));
                g.cluster_bbox[s as usize * SC + k] = b;
                sb.union(&b);
            }
            g.super_bbox[s as usize] = sb;
            g.super_zone[s as usize] = a.zones[atom(0) as usize];
        }
        let flat = column_start[..table.last().map_or(0, |z| (z.column_base + z.columns[0] * z.columns[1] + 1) as usize)].to_vec();
        (g, table, flat)
    }

    const CL_: usize = abi::NBNXM_CLUSTER_SIZE as usize;

    /// The passes on `a` against the host's grid, and against what an upload of it gives the search.
    fn check_local(what: &str, a: &LocalAtoms) {
        let want = ClusterGrid::build(a).unwrap();
        let (got, table, flat) = passes(a, &ZonePlan::local(a));
        // The plan `build_local` makes in one pass is the atom-by-atom one.
        assert_eq!(ZonePlan::checked(a).unwrap(), ZonePlan::local(a), "{what}: one-pass plan");
        assert_eq!(got, want, "{what}");
        assert_eq!((table, flat), DeviceGrid::search_tables(&want), "{what}: search tables");
        // The bound the search step launches its passes over (and the fill over) holds the count.
        assert!(want.superclusters() <= ZonePlan::local(a).most, "{what}: {} superclusters, bound {}", want.superclusters(), ZonePlan::local(a).most);
    }

    fn check(what: &str, positions: &[Float3], box_size: [f32; 3]) {
        let types: Vec<u32> = (0..positions.len()).map(|i| (i * 7 % 3) as u32).collect();
        let a = LocalAtoms::single_rank(positions, &types, 3, box_size).unwrap();
        // One undecomposed rank's plan is `build`'s.
        assert_eq!(ZonePlan::local(&a), ZonePlan::single(a.len(), box_size), "{what}");
        check_local(what, &a);
    }

    #[test]
    fn the_passes_give_the_host_grid() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for (n, seed) in [(0, 1), (1, 1), (63, 2), (64, 3), (65, 4), (1000, 5), (6000, 6)] {
            let s = MolecularSystem::generate(n.max(1), seed).unwrap();
            let mut x = s.positions[..n].to_vec();
            // Shuffled, some moved outside the box by whole and odd amounts.
            for i in (1..x.len()).rev() {
                x.swap(i, rng.random_range(0..=i));
            }
            for p in x.iter_mut().step_by(7) {
                p.x += s.box_size[0] * rng.random_range(-3..4) as f32 + 0.37;
                p.z -= 2.5 * s.box_size[2];
            }
            check(&format!("{n} atoms"), &x, s.box_size);
        }
        // On the box's edges: 0 and just below the edge; many equal coordinates.
        let b = [3.0f32, 2.5, 4.0];
        let edges: Vec<Float3> = (0..500)
            .map(|i| {
                let e = |d: usize, k: usize| [0.0, b[d].next_down(), b[d] * 0.5][k % 3];
                Float3::new(e(0, i), e(1, i / 3), e(2, i / 9))
            })
            .collect();
        check("edges", &edges, b);
        // A dense blob: one column holds most atoms.
        let blob: Vec<Float3> =
            (0..3000).map(|_| Float3::new(rng.random_range(1.0..1.01), rng.random_range(1.0..1.01), rng.random::<f32>() * b[2])).collect();
        check("blob", &blob, b);
        // The wrap the passes read is the host's.
        let far = Float3::new(-1e7, 3.0, 7.0 * b[2]);
        assert_eq!(wrap_position(far, b), LocalAtoms::single_rank(&[far], &[0], 1, b).unwrap().positions[0]);
    }

    #[test]
    fn the_passes_give_every_ranks_host_grid() {
        use crate::decomp::{HaloPlan, RankGrid};
        let mut most_zones = 0;
        for (n, seed, dims) in [(3000, 11, [1, 1, 1]), (3000, 12, [2, 1, 1]), (6000, 13, [2, 2, 1]), (6000, 14, [2, 2, 2]), (1500, 15, [3, 1, 2])] {
            let s = MolecularSystem::generate(n, seed).unwrap();
            let plan = HaloPlan::build(&s, RankGrid::new(dims).unwrap(), 1.1).unwrap();
            for r in 0..plan.ranks.len() {
                let a = LocalAtoms::from_plan(&plan, r, &s.positions, &s.types).unwrap();
                check_local(&format!("{n} atoms {dims:?} rank {r}"), &a);
                most_zones = most_zones.max(ZonePlan::local(&a).table.len());
            }
        }
        assert_eq!(most_zones, 8, "a corner rank of 2x2x2 has every zone");
    }

    #[test]
    fn the_passes_give_the_host_grid_of_empty_ranks_and_zones() {
        use crate::decomp::{HaloPlan, RankGrid};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
        // Atoms only in a slab x in [1.5, 2): the ranks of the upper x half have no atom at all,
        // those of the lower half no halo from above in x.
        let b = [6.0f32, 5.0, 4.0];
        let x: Vec<Float3> =
            (0..2500).map(|_| Float3::new(rng.random_range(1.5..2.0), rng.random::<f32>() * b[1], rng.random::<f32>() * b[2])).collect();
        let types: Vec<u8> = (0..x.len()).map(|i| (i % 2) as u8).collect();
        let (mut empty, mut gaps) = (0, 0);
        for dims in [[2, 1, 1], [2, 2, 1], [2, 2, 2]] {
            let plan = HaloPlan::from_positions(&x, b, RankGrid::new(dims).unwrap(), 0.9).unwrap();
            for r in 0..plan.ranks.len() {
                let a = LocalAtoms::from_plan(&plan, r, &x, &types).unwrap();
                check_local(&format!("slab {dims:?} rank {r}"), &a);
                empty += usize::from(a.is_empty());
                let zones = ZonePlan::local(&a).table.len();
                gaps += usize::from(!a.is_empty() && zones < 1 << dims.iter().filter(|&&d| d > 1).count());
            }
        }
        assert!(empty > 0 && gaps > 0, "{empty} ranks without atoms, {gaps} with a zone missing");
        // Made-up ranks: no home atom, halo zones interleaved, open and periodic dimensions mixed,
        // atoms far outside the box along open ones, one atom alone in its zone.
        for (periodic, zones, n) in
            [([false, true, false], &[3u8, 5][..], 900), ([false; 3], &[1, 2, 3, 4, 5, 6, 7][..], 3000), ([true, false, true], &[2], 1)]
        {
            let positions: Vec<Float3> = (0..n)
                .map(|_| {
                    let v: [f32; 3] = std::array::from_fn(|d| {
                        let u = rng.random::<f32>() * b[d];
                        if periodic[d] { u } else { u * 3.0 - b[d] }
                    });
                    Float3::new(v[0], v[1], v[2])
                })
                .collect();
            let mut zs: Vec<u8> = (0..n).map(|_| zones[rng.random_range(0..zones.len())]).collect();
            zs[n - 1] = zones[zones.len() - 1];
            let a =
                LocalAtoms { positions, types: vec![1; n], zones: zs, home: 0, box_size: b, periodic, ntypes: 2, types_from: 0, positions_from: 0 };
            check_local(&format!("made-up zones {zones:?}"), &a);
        }
    }

    #[test]
    fn the_bound_holds_the_superclusters_without_bad_atoms() {
        // A resident build with bad atoms sorts the others in the plan of all `n` atoms (a bad atom
        // gets no column): the plan's bound, which sized the buffers and the search's items, still
        // holds their superclusters, however many atoms drop out and wherever the others crowd.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(23);
        let b = [3.0f32, 2.5, 4.0];
        for (n, blob) in [(1, false), (64, false), (65, true), (1000, false), (3000, true), (6000, false)] {
            let x: Vec<Float3> = (0..n)
                .map(|_| {
                    let s = if blob { 0.01 } else { 1.0 };
                    Float3::new(rng.random::<f32>() * b[0] * s, rng.random::<f32>() * b[1] * s, rng.random::<f32>() * b[2])
                })
                .collect();
            let plan = ZonePlan::single(n, b);
            for keep in [n, n - n / 3, n / 2, 1] {
                let good: Vec<Float3> = x.iter().copied().filter(|_| rng.random_range(0..n) < keep).collect();
                let a = LocalAtoms::single_rank(&good, &vec![0; good.len()], 1, b).unwrap();
                let (g, _, _) = passes(&a, &plan);
                assert!(g.superclusters() <= plan.most, "{n} atoms, {} good: {} superclusters, bound {}", good.len(), g.superclusters(), plan.most);
            }
        }
    }

    #[test]
    fn cluster_sizes_follow_the_halves_quarters_and_eighths() {
        for len in 0..=64u32 {
            let sizes: Vec<u32> = (0..8).map(|k| nbnxm_cluster_atoms(k, len)).collect();
            assert_eq!(sizes.iter().sum::<u32>(), len);
            let half = |zh: usize| sizes[4 * zh..4 * zh + 4].iter().sum::<u32>();
            assert_eq!(half(0), len.min(32));
            assert!(sizes.iter().all(|&s| s <= 8));
            // Lower pieces fill first.
            for k in [0usize, 2, 4, 6] {
                assert!(sizes[k + 1] == 0 || sizes[k] == 8);
            }
            assert!(sizes[2] + sizes[3] == 0 || sizes[0] + sizes[1] == 16);
        }
    }
}
