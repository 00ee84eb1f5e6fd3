//! The cluster lists on the GPU and the launches of one MD step.
//!
//! Per rank and step (the MD step's two streams, see `docs/architecture.md`):
//! - local stream, after zeroing the home forces (and, on energy steps, [`NbnxmGpu::zero_energy`]):
//!   on prune steps [`NbnxmGpu::prune`]`(Local)`, then [`NbnxmGpu::forces`]`(Local)`;
//! - halo stream, after the coordinate halo has landed and the halo forces are zeroed (and after the
//!   local stream's zeroing event): on prune steps [`NbnxmGpu::prune`]`(NonLocal)`, then
//!   [`NbnxmGpu::forces`]`(NonLocal)`; then the force halo.
//!
//! Prune steps are the search step and every `nstprune` steps after it. The kernels read the
//! exchange's coordinate array (home atoms, then the halo) through the grid's slot → atom index,
//! and add forces into the exchange's force array, so nothing is scattered after them. Each launch
//! runs one block of `32 W` threads per list entry, `W` from [`WarpsPerEntry`] (by default its rule
//! for the list's length), in the list's launch order (longest entries first,
//! [`super::entry_order`]: computed on the host for lists searched there, on the GPU for lists
//! searched there). At a search step, [`NbnxmGpu::update`] uploads the new grid and lists
//! (synchronously: no launch of this object may still be running); [`NbnxmGpu::update_on_gpu`]
//! uploads a host-sorted grid and searches on the GPU; on one rank, [`NbnxmGpu::update_resident`]
//! does the whole search step on the GPU (wrap, grid, lists) from the device coordinates, and on
//! any rank [`NbnxmGpu::update_local`] builds the grid (every zone) and lists on the GPU from the
//! rank's [`LocalAtoms`].

use super::gpu_grid::{DeviceGrid, GridInfo, PendingGrid};
use super::gpu_search::{BegunLists, GpuSearch, ListRoom, grow};
use super::grid::ClusterGrid;
use super::order::entry_order;
use super::pairlist::{ClusterPairList, PairSearch};
use super::{EntryWords, HomeChecked, ListSetup, LocalAtoms, NbnxmError, NbnxmKernel, WarpsPerEntry};
use crate::abi::{self, Float3, NbnxmEntry};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaEvent, CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape};
use crate::kernel_args;
use crate::system::MolecularSystem;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The coordinate of a local atom, for the error that names an atom with a non-finite one.
type Coordinate<'a> = &'a dyn Fn(usize) -> Result<Float3>;

/// Which of a rank's two lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListKind {
    /// Home–home pairs: the local stream, before the coordinate halo.
    Local = 0,
    /// Pairs with a halo atom: the halo stream, after the coordinate halo.
    NonLocal = 1,
}

/// How [`NbnxmGpu::prune`] and [`NbnxmGpu::forces_into`] launch their kernel on the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// After whatever the stream holds, as any launch.
    Plain,
    /// To overlap the end of the kernel just before it on the stream (programmatic dependent
    /// launch, `KernelModule::launch_overlapping`): its blocks start as that kernel's last blocks
    /// leave, and wait for that kernel's completion before they touch memory
    /// (`griddepcontrol.wait`, the first thing every nbnxm kernel does), so the launch's gap
    /// overlaps the end of the kernel before. For a stream whose last kernel lets no dependent
    /// start early (the MD step's local stream, whose kernels are these and the integrator), not
    /// after the exchange's fused kernels, which let theirs start once all their blocks are
    /// resident: blocks started that early would sit waiting on multiprocessors the other
    /// stream's forces need. After anything but a kernel it is a plain launch.
    AfterKernel,
}

impl Launch {
    /// Launches kernel `name` this way.
    ///
    /// # Safety
    /// As [`KernelModule::launch`]; with [`Launch::AfterKernel`] the kernel waits for the
    /// kernel before it before it touches memory (as every nbnxm kernel does).
    pub(crate) unsafe fn launch(
        self,
        module: &KernelModule,
        name: &str,
        shape: LaunchShape,
        stream: &CudaStream,
        args: &mut [*mut std::ffi::c_void],
    ) -> Result<()> {
        // SAFETY: forwarded to the caller's contract.
        unsafe {
            match self {
                Self::Plain => module.launch(name, shape, stream, args),
                Self::AfterKernel => module.launch_overlapping(name, shape, stream, args),
            }
        }
    }
}

/// The nbnxm kernels' LJ table of `system`: `[6 c6, 12 c12]` per type pair, row-major.
pub fn lj_table(system: &MolecularSystem) -> Vec<[f32; 2]> {
    let n = system.atom_types.len();
    (0..n * n)
        .map(|k| {
            let p = system.lj_pair(k / n, k % n);
            [(6.0 * p.c6) as f32, (12.0 * p.c12) as f32]
        })
        .collect()
}

/// Where an energy launch adds its energy: element `index` of a device `f64` array.
#[derive(Clone, Copy)]
pub struct EnergySlot<'a> {
    buffer: &'a DeviceBuffer<f64>,
    index: usize,
}

impl<'a> EnergySlot<'a> {
    /// Element `index` of `buffer`; an error when it is outside.
    pub fn new(buffer: &'a DeviceBuffer<f64>, index: usize) -> Result<Self> {
        if index >= buffer.len() {
            return Err(HaloError::InvalidInput(format!("energy slot {index} of a buffer of {}", buffer.len())));
        }
        Ok(Self { buffer, index })
    }

    /// The device address of the accumulator.
    pub fn ptr(&self) -> u64 {
        self.buffer.device_ptr_at(self.index)
    }
}

struct GpuList {
    entries: DeviceBuffer<NbnxmEntry>,
    /// The launch order: block `b` runs entry `order[b]`.
    order: DeviceBuffer<u32>,
    outer: DeviceBuffer<u32>,
    inner: DeviceBuffer<u32>,
    n_entries: usize,
    n_words: usize,
    pruned: bool,
}

impl GpuList {
    fn empty(module: &KernelModule) -> Result<Self> {
        let ctx = module.context();
        Ok(Self {
            entries: DeviceBuffer::uninit(ctx, 1)?,
            order: DeviceBuffer::uninit(ctx, 1)?,
            outer: DeviceBuffer::uninit(ctx, 1)?,
            inner: DeviceBuffer::uninit(ctx, 1)?,
            n_entries: 0,
            n_words: 0,
            pruned: false,
        })
    }

    /// Makes room for `entries` entries (and their launch order) and `words` outer and inner words
    /// (reusing the allocations that fit; the contents are the caller's to fill) and takes those
    /// sizes; returns where the entries, the outer words and the order go (for the GPU search to
    /// fill).
    fn reserve(&mut self, module: &KernelModule, entries: usize, words: usize) -> Result<ListRoom> {
        grow(module, &mut self.entries, entries)?;
        grow(module, &mut self.order, entries)?;
        grow(module, &mut self.outer, words)?;
        grow(module, &mut self.inner, words)?;
        self.n_entries = entries;
        self.n_words = words;
        self.pruned = false;
        Ok(ListRoom::of(&self.entries, &self.outer, &self.order))
    }

    /// A host search's list, with its launch order from [`entry_order`].
    fn update(&mut self, module: &KernelModule, l: &ClusterPairList) -> Result<()> {
        self.reserve(module, l.entries.len(), l.j_list.len())?;
        self.entries.copy_from_host(&l.entries)?;
        self.order.copy_from_host(&entry_order(&l.entries))?;
        self.outer.copy_from_host(&l.j_list)
    }

    /// One block of `warps` warps per entry.
    fn shape(&self, warps: u32, shared_bytes: u32) -> LaunchShape {
        LaunchShape { grid: (self.n_entries as u32, 1), block: warps * 32, shared_bytes }
    }
}

/// What [`NbnxmGpu::update_resident`] or [`NbnxmGpu::update_local`] did: the grid it built, the
/// lists' sizes, and the time of each part (host wall clock; the grid's GPU work is waited for in
/// the lists' part, the search step's one synchronisation before the lists are written).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResidentSearch {
    /// The grid built on the GPU.
    pub grid: GridInfo,
    /// Enqueueing the grid: the host's checks and zone plan, the copies of the local atoms
    /// (`update_local`), the zone table and the five passes' launches (wrapping on one rank). No
    /// wait for the GPU: the passes run while the host enqueues the lists' first passes.
    pub grid_time: Duration,
    /// Everything after: the count pass, the lists' layout scan, one synchronisation (waiting for
    /// the grid's passes too) reading back the lists' sizes and the grid's three words, the grid's
    /// checks, the entries, the launch order, the write pass and the final synchronisation (which
    /// [`NbnxmGpu::finish_local`] leaves out: its time stops at the write pass's launch); with
    /// [`NbnxmGpu::update_local_into`] or `finish_local` also the caller's host work before that
    /// first wait.
    pub lists_time: Duration,
    /// Of `lists_time`: the host's wait in the one synchronisation before the lists are written,
    /// for the grid's and the lists' first passes (their GPU time that no host work hid).
    pub wait_time: Duration,
    /// j-list words of the home–home and the non-local list (the latter empty on one rank).
    pub words: [usize; 2],
    /// Entries of the two lists.
    pub entries: [usize; 2],
    /// Whether its first half ran ahead of it ([`NbnxmGpu::begin_resident`]): this search only
    /// finished it.
    pub begun_ahead: bool,
}

/// Where [`NbnxmGpu::update_local_into`] copies the home atoms' coordinates and types on the
/// device (the MD step: the exchange's coordinate array and the rank's types), and where the home
/// coordinates may come from. Only elements `0..home` of `x` and `types` are written, so peers may
/// store into the rest (an exchange's halo region) meanwhile.
#[derive(Clone, Copy)]
pub struct HomeCopies<'a> {
    /// Coordinates, `Float3` as the local atoms hold them.
    pub x: &'a dyn DeviceMemory<Float3>,
    /// Atom types (`u32`, as the local atoms and the grid's copies hold them).
    pub types: &'a dyn DeviceMemory<u32>,
    /// The home atoms' arrays on this GPU already (what a redecomposition on the GPU leaves):
    /// the grid takes them there instead of uploading them. `None`: uploaded.
    pub from: Option<HomeOnDevice<'a>>,
}

/// A rank's home atoms where a redecomposition on the GPU merged them
/// (`halo::decomp::GpuHome`): a grid built from local atoms with these copies their coordinates
/// on the device and makes their types there when `types` is given; of the home atoms it uploads
/// only their zones (a byte each), and the halo atoms' arrays.
#[derive(Clone, Copy)]
pub struct HomeOnDevice<'a> {
    /// The home atoms' coordinates, bit for bit `atoms.positions[..home]`
    /// (`halo::decomp::GpuHome::positions`).
    pub x: &'a dyn DeviceMemory<Float3>,
    /// Their types as `by_id[ids[i]]`, bit for bit `atoms.types[..home]`; `None`: uploaded.
    pub types: Option<TypesById<'a>>,
}

/// The home atoms' types on the device as their global ids and a table by global id (kernel
/// `types_by_id`, `abi::TYPES_BY_ID`).
#[derive(Clone, Copy)]
pub struct TypesById<'a> {
    /// The home atoms' global ids, in order (`halo::decomp::GpuHome::home_ids`).
    pub ids: &'a dyn DeviceMemory<u32>,
    /// Every atom's type by global id, each below the local atoms' `ntypes` (the caller's
    /// contract: the grid does not check these on the host). An id at or past its end gives
    /// `u32::MAX` on the device, which no grid may hold: a redecomposition refuses such an id
    /// before any grid is built from its home atoms.
    pub by_id: &'a dyn DeviceMemory<u32>,
}

/// One rank's cluster grid and lists on its GPU (see the module docs for the per-step calls).
pub struct NbnxmGpu {
    module: Arc<KernelModule>,
    /// The grid: slots and types (the force and prune kernels), boxes and columns (the search).
    grid: DeviceGrid,
    lj: DeviceBuffer<[f32; 2]>,
    ntypes: u32,
    lists: [GpuList; 2],
    energy: DeviceBuffer<f64>,
    /// The GPU search's buffers, once it ran.
    search: Option<GpuSearch>,
    setup: ListSetup,
    box_size: [f32; 3],
    atoms: usize,
    kernel: NbnxmKernel,
    warps: WarpsPerEntry,
    /// The GPU searches' entry length: at construction [`EntryWords::ENV`]'s, else
    /// [`EntryWords::DEFAULT`] (32 words, the host search's).
    entry_words: EntryWords,
    /// Multiprocessors of the GPU (for [`WarpsPerEntry::Auto`]).
    sms: u32,
    /// A search [`Self::begin_local`] enqueued and [`Self::finish_local`] has not yet waited for.
    begun: Option<BegunLocal>,
    /// Recorded on a GPU search's stream after its write pass and launch orders
    /// ([`Self::finish_local`] returns without waiting for them): this object's synchronous
    /// readers and its next search wait for it ([`Self::lists_complete`]).
    written: CudaEvent,
}

/// What [`NbnxmGpu::begin_local`] enqueued, for [`NbnxmGpu::finish_local`].
struct BegunLocal {
    grid: PendingGrid,
    lists: BegunLists,
    /// Whose atoms the grid is built from (the same atoms must finish it; the grid holds their
    /// sizes and box).
    source: BegunOn,
    box_size: [f32; 3],
    /// The stream it was enqueued on (`CUstream` as an address; the same stream must finish it).
    stream: usize,
    grid_time: Duration,
    /// The host time of the lists' part so far (the count pass and the scan enqueued).
    lists_time: Duration,
}

/// Whose atoms a begun search builds its grid from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BegunOn {
    /// Local atoms on the host ([`NbnxmGpu::begin_local`]): the address of their positions.
    Local(usize),
    /// Coordinates and types on the device ([`NbnxmGpu::begin_resident`]): their addresses and
    /// the atom count.
    Resident { x: u64, types: u64, atoms: usize },
}

impl NbnxmGpu {
    /// Uploads `search`'s grid and lists and the LJ table ([`lj_table`]: `[6 c6, 12 c12]`, one
    /// row per type, `ntypes²` entries).
    pub fn new(module: Arc<KernelModule>, search: &PairSearch, lj: &[[f32; 2]], setup: &ListSetup, box_size: [f32; 3]) -> Result<Self> {
        let mut me = Self::empty(module, lj, setup, box_size)?;
        me.update(search, box_size)?;
        Ok(me)
    }

    /// No grid and empty lists yet ([`Self::update`] or [`Self::update_on_gpu`] fill them).
    fn empty(module: Arc<KernelModule>, lj: &[[f32; 2]], setup: &ListSetup, box_size: [f32; 3]) -> Result<Self> {
        let ntypes = (lj.len() as f64).sqrt().round() as usize;
        if ntypes == 0 || ntypes * ntypes != lj.len() {
            return Err(HaloError::InvalidInput(format!("the LJ table has {} entries, not the square of a type count", lj.len())));
        }
        if ntypes > abi::NBNXM_MAX_TYPES as usize {
            return Err(HaloError::InvalidInput(format!(
                "the nbnxm kernels take at most {} atom types (their LJ table lives in shared memory), the system has {ntypes}",
                abi::NBNXM_MAX_TYPES
            )));
        }
        let ctx = module.context().clone();
        let sms = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).during("reading the SM count")?;
        Ok(Self {
            grid: DeviceGrid::new(&module)?,
            lj: DeviceBuffer::from_host(&ctx, lj)?,
            ntypes: ntypes as u32,
            lists: [GpuList::empty(&module)?, GpuList::empty(&module)?],
            energy: DeviceBuffer::zeroed(&ctx, 1)?,
            search: None,
            setup: *setup,
            box_size,
            atoms: 0,
            kernel: NbnxmKernel::from_env()?.unwrap_or(NbnxmKernel::DEFAULT),
            warps: WarpsPerEntry::from_env()?.unwrap_or(WarpsPerEntry::Auto),
            entry_words: EntryWords::from_env()?.unwrap_or(EntryWords::DEFAULT),
            sms: sms.max(1) as u32,
            begun: None,
            written: ctx.new_event(None).during("creating an event")?,
            module,
        })
    }

    /// The kernel design the launches use: at construction [`NbnxmKernel::ENV`]'s, else
    /// [`NbnxmKernel::DEFAULT`].
    pub fn kernel(&self) -> NbnxmKernel {
        self.kernel
    }

    /// Switches the kernel design.
    pub fn set_kernel(&mut self, kernel: NbnxmKernel) {
        self.kernel = kernel;
    }

    /// How many warps share a list entry: at construction [`WarpsPerEntry::ENV`]'s choice, else
    /// [`WarpsPerEntry::Auto`].
    pub fn warps(&self) -> WarpsPerEntry {
        self.warps
    }

    /// Sets how many warps share a list entry in the launches from now on; a fixed count outside
    /// 1 to [`abi::NBNXM_MAX_WARPS_PER_ENTRY`] is refused.
    pub fn set_warps(&mut self, warps: WarpsPerEntry) -> Result<()> {
        if let WarpsPerEntry::Fixed(w) = warps {
            WarpsPerEntry::fixed(w)?;
        }
        self.warps = warps;
        Ok(())
    }

    /// The most j-cluster words per list entry of the GPU searches from now on: at construction
    /// [`EntryWords::ENV`]'s, else [`EntryWords::DEFAULT`], the host search's 32 (with another
    /// length the GPU's lists hold the same pairs in other entries than the host's).
    pub fn entry_words(&self) -> EntryWords {
        self.entry_words
    }

    /// Sets the entry length of the GPU searches from the next one on.
    pub fn set_entry_words(&mut self, words: EntryWords) {
        self.entry_words = words;
    }

    /// Warps per entry of the next launches of both lists ([`WarpsPerEntry::for_lists`]: one
    /// count from their entries together, since a step runs them at once).
    pub fn warps_per_entry(&self) -> u32 {
        self.warps.for_lists(&self.lists.each_ref().map(|l| l.n_entries), self.sms)
    }

    /// A rank's lists searched on the GPU from `grid` (sorted on the host): the same lists as
    /// [`PairSearch::build`] with `setup.rlist` finds on the host (the same entries with the
    /// default [`Self::entry_words`]).
    pub fn new_on_gpu(
        module: Arc<KernelModule>,
        grid: &ClusterGrid,
        lj: &[[f32; 2]],
        setup: &ListSetup,
        box_size: [f32; 3],
        stream: &CudaStream,
    ) -> Result<Self> {
        let mut me = Self::empty(module, lj, setup, box_size)?;
        me.update_on_gpu(grid, box_size, stream)?;
        Ok(me)
    }

    fn set_grid(&mut self, grid: &ClusterGrid, box_size: [f32; 3]) -> Result<()> {
        lj_table_holds(grid.ntypes > self.ntypes as usize, grid.ntypes, self.ntypes)?;
        self.grid.upload_slots(&self.module, grid)?;
        self.box_size = box_size;
        self.atoms = grid.atoms;
        Ok(())
    }

    /// Replaces the grid and lists with those of a new search (reusing the allocations that fit).
    /// Synchronous: no launch of this object may still be running.
    pub fn update(&mut self, search: &PairSearch, box_size: [f32; 3]) -> Result<()> {
        self.before_search()?;
        check_setup(search.rlist, &self.setup)?;
        self.set_grid(&search.grid, box_size)?;
        self.lists[0].update(&self.module, &search.local)?;
        self.lists[1].update(&self.module, &search.nonlocal)
    }

    /// Replaces the grid with `grid` and searches both lists on the GPU (at `setup.rlist`, [`Self::entry_words`] words
    /// per entry), on `stream`, which is synchronised before returning. No launch of this object
    /// may still be running.
    pub fn update_on_gpu(&mut self, grid: &ClusterGrid, box_size: [f32; 3], stream: &CudaStream) -> Result<()> {
        self.before_search()?;
        self.set_grid(grid, box_size)?;
        self.grid.upload_boxes(&self.module, grid)?;
        self.search_lists(stream)
    }

    /// An object with no grid and empty lists, for [`Self::update_resident`] to fill; the LJ table
    /// as for [`Self::new`].
    pub fn new_resident(module: Arc<KernelModule>, lj: &[[f32; 2]], setup: &ListSetup, box_size: [f32; 3]) -> Result<Self> {
        Self::empty(module, lj, setup, box_size)
    }

    /// The whole search step of one undecomposed rank on the GPU, on `stream` (synchronised before
    /// returning; no launch of this object may still be running): wraps the first `atoms`
    /// coordinates of `x` into the box in place (as `decomp::wrap_position` does), builds their
    /// cluster grid with atom types `types` (one per atom, each below the LJ table's type count)
    /// on the GPU, and searches both lists there at `setup.rlist` (at most [`Self::entry_words`] words per entry): the grid
    /// and lists [`PairSearch::build`] finds on `LocalAtoms::single_rank` of the wrapped atoms.
    /// The force and prune kernels then read the new grid's slots. A non-finite coordinate is an
    /// error naming the first such atom (the lists are then empty).
    ///
    /// One host synchronisation of `stream` between the grid and the lists (the grid's three info
    /// words and the lists' totals read back together), and one at the end, after the write pass:
    /// the callers (`MdRank::search_resident`, the tests) rely on complete lists when this returns.
    /// ([`Self::finish_local`], the MD step's search of a decomposed rank, leaves out the last.)
    ///
    /// Where [`Self::begin_resident`] began this very search (the same `x`, `types`, `atoms`, box
    /// and stream), only its second half is left: the one wait, the grid's checks, the write pass
    /// and the final wait.
    pub fn update_resident(
        &mut self,
        x: &impl DeviceMemory<Float3>,
        types: &DeviceBuffer<u32>,
        atoms: usize,
        box_size: [f32; 3],
        stream: &CudaStream,
    ) -> Result<ResidentSearch> {
        let source = BegunOn::Resident { x: x.device_ptr(), types: types.device_ptr(), atoms };
        let begun_here = |b: &BegunLocal| b.source == source && b.stream == stream.cu_stream() as usize && b.box_size == box_size;
        let begun_ahead = self.begun.as_ref().is_some_and(begun_here);
        if !begun_ahead {
            // Nothing begun for these atoms: its first half now (a search begun for others is
            // abandoned first).
            self.begin_resident(x, types, atoms, box_size, stream)?;
        }
        let begun = self.begun.take().ok_or_else(|| HaloError::InvalidInput("nbnxm: the resident search was not begun".into()))?;
        let coordinate = |atom: usize| Ok(x.to_host()?.get(atom).copied().unwrap_or_default());
        let t1 = Instant::now();
        let grid = self.finish_lists(stream, begun.lists, Some((&begun.grid, &coordinate)), &mut || Ok(()))?;
        stream.synchronize().during("waiting for the search's lists")?;
        let grid = grid.ok_or_else(|| HaloError::InvalidInput("the GPU search did not check its grid".into()))?;
        self.box_size = box_size;
        self.atoms = grid.atoms;
        Ok(ResidentSearch { begun_ahead, ..self.searched(grid, begun.grid_time, begun.lists_time + t1.elapsed()) })
    }

    /// The first half of [`Self::update_resident`], on `stream` without a host wait: the lists
    /// emptied, the coordinates wrapped in place, their grid and the lists' first passes enqueued
    /// up to the search's one read-back. For a caller that has enqueued the steps before the
    /// search on `stream` and has not waited for them yet (the MD step's search of one rank): the
    /// passes run right behind those steps, and the host's enqueues are made while the GPU is
    /// still busy. [`Self::update_resident`] with the same arguments completes it; nothing else of
    /// this object may run before (any other search abandons it, the context synchronised), and
    /// `x` and `types` stay allocated and unwritten until then. An error (the lists then empty)
    /// leaves nothing of it in flight.
    pub fn begin_resident(
        &mut self,
        x: &impl DeviceMemory<Float3>,
        types: &DeviceBuffer<u32>,
        atoms: usize,
        box_size: [f32; 3],
        stream: &CudaStream,
    ) -> Result<()> {
        self.before_search()?;
        let t0 = Instant::now();
        self.forget_lists();
        let pending = self.grid.enqueue_build(&self.module, x, types, atoms, box_size, true, stream).inspect_err(|_| {
            let _ = stream.synchronize();
        })?;
        let t1 = Instant::now();
        let lists = self.begin_lists(stream, Some(&pending)).inspect_err(|_| {
            let _ = stream.synchronize();
        })?;
        self.begun = Some(BegunLocal {
            grid: pending,
            lists,
            source: BegunOn::Resident { x: x.device_ptr(), types: types.device_ptr(), atoms },
            box_size,
            stream: stream.cu_stream() as usize,
            grid_time: t1 - t0,
            lists_time: t1.elapsed(),
        });
        Ok(())
    }

    /// A rank's grid and lists built on the GPU from `atoms` ([`Self::update_local`]); the LJ
    /// table as for [`Self::new`].
    pub fn new_local(
        module: Arc<KernelModule>,
        atoms: &LocalAtoms,
        lj: &[[f32; 2]],
        setup: &ListSetup,
        box_size: [f32; 3],
        stream: &CudaStream,
    ) -> Result<Self> {
        let mut me = Self::empty(module, lj, setup, box_size)?;
        me.update_local(atoms, box_size, stream)?;
        Ok(me)
    }

    /// The search step of any rank on the GPU, on `stream` (synchronised before returning; no
    /// launch of this object may still be running): builds the cluster grid of `atoms` (home atoms
    /// and halo zones, as they are) there ([`DeviceGrid::build_local`]), then searches both lists
    /// there at `setup.rlist` (at most [`Self::entry_words`] words per entry): the grid and lists
    /// [`PairSearch::build`] finds on `atoms`. Only the atoms' coordinates, types and zones cross to the GPU. The force and
    /// prune kernels then read the new grid's slots, which index `atoms`' order (the exchange's
    /// coordinate array). Invalid atoms, or types beyond the LJ table, are an error (the lists are
    /// then empty).
    pub fn update_local(&mut self, atoms: &LocalAtoms, box_size: [f32; 3], stream: &CudaStream) -> Result<ResidentSearch> {
        self.local_search(atoms, box_size, stream, None, &mut || Ok(()))
    }

    /// [`Self::update_local`] that also fills `home` from the atoms' device copies the build makes
    /// (no second upload): device-to-device copies of the home atoms' coordinates and types
    /// (elements `0..atoms.home` of each, bit for bit `atoms.positions[..home]` and
    /// `atoms.types[..home]`), enqueued on `stream` after the build's own uploads and passes
    /// (which only read those copies), so they are complete when this returns (and, on the GPU,
    /// before any later work on `stream`). With `home.from` the build takes the home atoms'
    /// coordinates and (with [`HomeOnDevice::types`]) types on the device ([`HomeOnDevice`]).
    /// `before_wait` runs once on the host after the grid's passes and the lists' first passes are
    /// enqueued, before the search's first wait for `stream`: host work of the caller's (the MD
    /// step's other staged uploads) that then overlaps them. An error (of the build, of
    /// `before_wait`, of the search) may come before or after the copies or `before_wait`; the
    /// lists are then empty. [`Self::begin_local`] and [`Self::finish_local`] are its two halves,
    /// for callers with more host work to overlap.
    pub fn update_local_into(
        &mut self,
        atoms: &LocalAtoms,
        box_size: [f32; 3],
        stream: &CudaStream,
        home: HomeCopies<'_>,
        before_wait: &mut dyn FnMut() -> Result<()>,
    ) -> Result<ResidentSearch> {
        self.local_search(atoms, box_size, stream, Some(home), before_wait)
    }

    fn local_search(
        &mut self,
        atoms: &LocalAtoms,
        box_size: [f32; 3],
        stream: &CudaStream,
        home: Option<HomeCopies<'_>>,
        before_wait: &mut dyn FnMut() -> Result<()>,
    ) -> Result<ResidentSearch> {
        self.begin_local(atoms, box_size, stream, home.and_then(|h| h.from))?;
        let mut searched = self.finish_local(atoms, stream, home.map(|h| (h.x, h.types)), before_wait)?;
        // The final wait counts as the lists' time too (`ResidentSearch::lists_time`).
        let t = Instant::now();
        stream.synchronize().during("waiting for the search's lists")?;
        searched.lists_time += t.elapsed();
        Ok(searched)
    }

    /// The first half of [`Self::update_local_into`], on `stream` without a host wait: the lists
    /// emptied, the grid of `atoms` (home atoms' arrays from `from` on the device when given, as
    /// [`HomeCopies::from`]) and the lists' first passes enqueued, up to the search's one
    /// read-back. [`Self::finish_local`] with the same atoms and stream completes it; the host may
    /// do other work between while the GPU runs these passes (the MD step's search: its router
    /// and replan), but nothing of this object may run there. A search begun before and not
    /// finished is abandoned first (the context synchronised). An error (the lists then empty)
    /// leaves nothing of this search in flight.
    pub fn begin_local(&mut self, atoms: &LocalAtoms, box_size: [f32; 3], stream: &CudaStream, from: Option<HomeOnDevice<'_>>) -> Result<()> {
        self.begin_local_checked(atoms, box_size, stream, from, None)
    }

    /// [`Self::begin_local`] with the home atoms' zone checks done already (`home`, the token of
    /// the local atoms' build: `LocalAtoms::from_local_scanned_into`): the grid's zone checks pass
    /// over the halo atoms only.
    pub(crate) fn begin_local_checked(
        &mut self,
        atoms: &LocalAtoms,
        box_size: [f32; 3],
        stream: &CudaStream,
        from: Option<HomeOnDevice<'_>>,
        home: Option<HomeChecked>,
    ) -> Result<()> {
        self.before_search()?;
        let t0 = Instant::now();
        self.forget_lists();
        lj_table_holds(atoms.ntypes > self.ntypes as usize, atoms.ntypes, self.ntypes)?;
        let enqueued =
            tracing::debug_span!("search.grid_enqueue").in_scope(|| self.grid.enqueue_build_local(&self.module, atoms, from, home, stream));
        let pending = enqueued.inspect_err(|_| {
            // The build's copies may have been enqueued before its error.
            let _ = stream.synchronize();
        })?;
        let t1 = Instant::now();
        let lists = tracing::debug_span!("search.lists_begin").in_scope(|| self.begin_lists(stream, Some(&pending))).inspect_err(|_| {
            let _ = stream.synchronize();
        })?;
        self.begun = Some(BegunLocal {
            grid: pending,
            lists,
            source: BegunOn::Local(atoms.positions.as_ptr() as usize),
            box_size,
            stream: stream.cu_stream() as usize,
            grid_time: t1 - t0,
            lists_time: t1.elapsed(),
        });
        Ok(())
    }

    /// Completes the search [`Self::begin_local`] began on `atoms` and `stream`: the device copies
    /// of the home atoms' coordinates and types into `home` (`x`, `types`, as
    /// [`Self::update_local_into`] makes them) when given, `before_wait`, the one wait, the grid's
    /// checks, and the lists' write pass and launch orders, enqueued on `stream` without a second
    /// wait: later work on `stream` (the MD step's local stream) is ordered after them, work on
    /// another stream must wait for `stream` first (the MD step's halo stream does, through
    /// `coordinates_ready`), and this object's synchronous readers and next search wait for them
    /// themselves ([`Self::lists_complete`]). What [`Self::update_local_into`] returns (its times
    /// include the first half's). An error when no search was begun, or it was begun on other
    /// atoms or another stream (that search is then waited for and dropped).
    pub fn finish_local(
        &mut self,
        atoms: &LocalAtoms,
        stream: &CudaStream,
        home: Option<(&dyn DeviceMemory<Float3>, &dyn DeviceMemory<u32>)>,
        before_wait: &mut dyn FnMut() -> Result<()>,
    ) -> Result<ResidentSearch> {
        let t1 = Instant::now();
        let Some(begun) = self.begun.take() else {
            return Err(HaloError::InvalidInput("nbnxm: no GPU search was begun to finish (begin_local first)".into()));
        };
        let same_stream = begun.stream == stream.cu_stream() as usize;
        let same_atoms = begun.source == BegunOn::Local(atoms.positions.as_ptr() as usize) && begun.grid.fits(atoms);
        let same = same_atoms && same_stream;
        let (begun_atoms, begun_home) = begun.grid.sizes();
        let copied = match home {
            _ if !same => Err(HaloError::InvalidInput(format!(
                "nbnxm: a GPU search begun on {} atoms ({} home) is finished with {} atoms ({} home{}) on {} stream; \
                 finish it with the atoms and the stream that began it",
                begun_atoms,
                begun_home,
                atoms.len(),
                atoms.home,
                if same_atoms { "" } else { ", not the atoms that began it" },
                if same_stream { "the same" } else { "another" }
            ))),
            Some((x, types)) => self.grid.enqueue_home_copies(atoms.home, x, types, stream),
            None => Ok(()),
        };
        if let Err(e) = copied {
            // Nothing of the begun search may still copy into this object's memory.
            self.module.context().synchronize().during("abandoning a GPU search")?;
            self.forget_lists();
            return Err(e);
        }
        // (A home atom's position may be on the GPU only: not known here, named NaN.)
        let coordinate = |atom: usize| Ok(atoms.held_position(atom).unwrap_or(Float3::new(f32::NAN, f32::NAN, f32::NAN)));
        let grid = tracing::debug_span!("search.lists_finish")
            .in_scope(|| self.finish_lists(stream, begun.lists, Some((&begun.grid, &coordinate)), before_wait))?;
        let grid = grid.ok_or_else(|| HaloError::InvalidInput("the GPU search did not check its grid".into()))?;
        self.box_size = begun.box_size;
        self.atoms = grid.atoms;
        Ok(self.searched(grid, begun.grid_time, begun.lists_time + t1.elapsed()))
    }

    /// Whether a search [`Self::begin_local`] enqueued awaits [`Self::finish_local`].
    pub fn begun(&self) -> bool {
        self.begun.is_some()
    }

    /// Waits until the lists of the last GPU search are written (its write pass and launch orders,
    /// which [`Self::finish_local`] leaves running on its stream); at once otherwise.
    pub fn lists_complete(&self) -> Result<()> {
        self.written.synchronize().during("waiting for the search's lists")
    }

    /// Before a search replaces the lists: the last one complete ([`Self::lists_complete`]: its
    /// buffers may be reallocated), one begun and never finished abandoned.
    fn before_search(&mut self) -> Result<()> {
        self.lists_complete()?;
        self.abandon()
    }

    /// A search begun and never finished: waited for (the whole context: its stream is not
    /// held) and dropped, the lists empty.
    fn abandon(&mut self) -> Result<()> {
        if self.begun.take().is_some() {
            self.forget_lists();
            self.module.context().synchronize().during("abandoning a GPU search")?;
        }
        Ok(())
    }

    /// No lists and no atoms (before a search, and after a failed one).
    fn forget_lists(&mut self) {
        self.atoms = 0;
        for l in &mut self.lists {
            l.n_entries = 0;
            l.n_words = 0;
        }
    }

    fn searched(&self, grid: GridInfo, grid_time: Duration, lists_time: Duration) -> ResidentSearch {
        ResidentSearch {
            grid,
            grid_time,
            lists_time,
            wait_time: self.search.as_ref().map_or(Duration::ZERO, GpuSearch::waited),
            words: [self.lists[0].n_words, self.lists[1].n_words],
            entries: [self.lists[0].n_entries, self.lists[1].n_entries],
            begun_ahead: false,
        }
    }

    /// The GPU grid the last [`Self::update_resident`] or [`Self::update_local`] built, read back as
    /// the host's [`ClusterGrid`] (synchronous; for checks).
    pub fn read_grid(&self) -> Result<ClusterGrid> {
        self.grid.to_host(self.ntypes as usize)
    }

    /// Searches both lists on the GPU (at `setup.rlist`, at most [`Self::entry_words`] words per entry) on the grid the
    /// device buffers hold, on `stream`, which is synchronised before returning.
    fn search_lists(&mut self, stream: &CudaStream) -> Result<()> {
        let begun = self.begin_lists(stream, None)?;
        self.finish_lists(stream, begun, None, &mut || Ok(()))?;
        stream.synchronize().during("waiting for the search's lists")
    }

    /// The lists' first half on the grid the device buffers hold, or on `pending`'s, enqueued on
    /// `stream` after its passes (`GpuSearch::begin`: the count pass, the layout's scan and the
    /// read-back); at `setup.rlist`, entries of at most [`Self::entry_words`] words (the entry
    /// length alone: options would count the cores, which this search does not use).
    fn begin_lists(&mut self, stream: &CudaStream, pending: Option<&PendingGrid>) -> Result<BegunLists> {
        let grid = self.grid.search_grid(pending).ok_or_else(|| HaloError::InvalidInput("the GPU search needs a grid on the device".into()))?;
        let search = match self.search {
            Some(ref mut s) => s,
            None => self.search.insert(GpuSearch::new(&self.module)?),
        };
        search.begin(&self.module, grid, self.setup.rlist, self.entry_words.get(), stream)
    }

    /// The lists' second half after [`Self::begin_lists`] (`begun`) on the same grid and stream
    /// (`GpuSearch::finish`): `before_wait`, the one synchronisation; with `pending`, the grid's
    /// info words checked (`DeviceGrid::settle`, then the largest type against the LJ table) before
    /// any list is written, and its [`GridInfo`] returned; then the lists' writes enqueued and
    /// `written` recorded after them (no second wait). A failure leaves the lists empty
    /// (and records `written` too, after whatever was enqueued).
    fn finish_lists(
        &mut self,
        stream: &CudaStream,
        begun: BegunLists,
        pending: Option<(&PendingGrid, Coordinate<'_>)>,
        before_wait: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Option<GridInfo>> {
        let (module, lists, grid, ntypes, search) = (&self.module, &mut self.lists, &mut self.grid, self.ntypes, &mut self.search);
        let mut settled = None;
        let done = match (search.as_mut(), grid.search_grid(pending.map(|(p, _)| p))) {
            (Some(search), Some(on)) => search.finish(
                module,
                on,
                begun,
                stream,
                before_wait,
                &mut |words| {
                    let Some((p, coordinate)) = pending else { return Ok(()) };
                    // Without an item nothing ran, nor read back: the grid has no atom (its default
                    // words), or (never, `ZonePlan::most` is at least 1 with atoms) the words alone.
                    let words = match words {
                        Some(w) => w,
                        None => grid.read_words(p, stream)?,
                    };
                    let info = grid.settle(p, words, coordinate)?;
                    lj_table_holds(info.atoms > 0 && info.max_type >= ntypes, info.max_type as usize, ntypes)?;
                    settled = Some(info);
                    Ok(())
                },
                &mut |t| Ok([lists[0].reserve(module, t.entries[0], t.words[0])?, lists[1].reserve(module, t.entries[1], t.words[1])?]),
            ),
            _ => {
                // Never after a `begin_lists` (which made the buffers and had the grid): still,
                // nothing of it may be left in flight.
                let _ = stream.synchronize();
                Err(HaloError::InvalidInput("the GPU search needs a grid on the device".into()))
            }
        };
        match done {
            Ok(_) => match self.written.record(stream) {
                Ok(()) => Ok(settled),
                Err(e) => {
                    // Without the event nothing would order the next search after this one's
                    // writes: wait for them here, and keep no lists.
                    let _ = stream.synchronize();
                    self.forget_lists();
                    Err(e).during("recording the search's lists")
                }
            },
            Err(e) => {
                // The lists may have taken sizes whose entries and words were never written; a
                // failed launch may leave earlier ones running, which the next search waits for.
                let _ = self.written.record(stream);
                self.forget_lists();
                Err(e)
            }
        }
    }

    /// j-list words (j-clusters of the entries) of list `kind`.
    pub fn words(&self, kind: ListKind) -> usize {
        self.lists[kind as usize].n_words
    }

    /// The entries of list `kind` on the GPU, read synchronously (for checks).
    pub fn read_entries(&self, kind: ListKind) -> Result<Vec<NbnxmEntry>> {
        self.lists_complete()?;
        let l = &self.lists[kind as usize];
        let mut v = l.entries.to_host()?;
        v.truncate(l.n_entries);
        Ok(v)
    }

    /// The launch order of list `kind` on the GPU (block `b` runs entry `order[b]`), read
    /// synchronously (for checks): [`super::entry_order`] of [`Self::read_entries`], unless
    /// [`Self::set_order_identity`] replaced it.
    pub fn read_order(&self, kind: ListKind) -> Result<Vec<u32>> {
        self.lists_complete()?;
        let l = &self.lists[kind as usize];
        let mut v = l.order.to_host()?;
        v.truncate(l.n_entries);
        Ok(v)
    }

    /// Launches list `kind`'s entries in the search's order (block `b` runs entry `b`) until the
    /// next update, synchronously; for measurements against the launch order (longest first).
    /// No launch of this object may still be running.
    pub fn set_order_identity(&mut self, kind: ListKind) -> Result<()> {
        self.lists_complete()?;
        let l = &self.lists[kind as usize];
        l.order.copy_from_host(&(0..l.n_entries as u32).collect::<Vec<_>>())?;
        // A copy from pageable memory may still be in flight when it returns: complete it before
        // the next launch on any stream.
        self.module.context().synchronize().during("uploading the identity launch order")
    }

    /// Local atoms the lists index: `x` and `f` must hold at least this many.
    pub fn atoms(&self) -> usize {
        self.atoms
    }

    /// Entries of a list (blocks of its launches).
    pub fn entries(&self, kind: ListKind) -> usize {
        self.lists[kind as usize].n_entries
    }

    /// The cutoffs and lifetimes.
    pub fn setup(&self) -> &ListSetup {
        &self.setup
    }

    fn check_arrays(&self, x: &impl DeviceMemory<Float3>, f: Option<&dyn DeviceMemory<Float3>>) -> Result<()> {
        let short =
            |what: &str, n: usize| Err(HaloError::InvalidInput(format!("nbnxm: {what} holds {n} atoms, the lists index {} local atoms", self.atoms)));
        if x.len() < self.atoms {
            return short("the coordinate array", x.len());
        }
        match f {
            Some(f) if f.len() < self.atoms => short("the force array", f.len()),
            _ => Ok(()),
        }
    }

    /// Enqueues the prune kernel of list `kind` on `stream`, launched as `launch` says: the inner
    /// list (pairs within `rlist_inner` at the current coordinates `x`), used by [`Self::forces`]
    /// from now on.
    pub fn prune(&mut self, kind: ListKind, x: &impl DeviceMemory<Float3>, stream: &CudaStream, launch: Launch) -> Result<()> {
        self.check_arrays(x, None)?;
        let l = &self.lists[kind as usize];
        if l.n_entries > 0 {
            let mut px = x.device_ptr();
            let (mut idx, mut ent, mut ord) = (self.grid.atom_index.device_ptr(), l.entries.device_ptr(), l.order.device_ptr());
            let mut n = l.n_entries as u32;
            let (mut outer, mut inner) = (l.outer.device_ptr(), l.inner.device_ptr());
            let [mut bx, mut by, mut bz] = self.box_size;
            let mut rl2 = self.setup.rlist_inner * self.setup.rlist_inner;
            let mut args = kernel_args![px, idx, ent, ord, n, outer, inner, bx, by, bz, rl2];
            let shape = l.shape(self.warps_per_entry(), abi::NBNXM_PRUNE_SHARED_BYTES);
            // SAFETY: arguments match `nbnxm_prune_*`, launched as `abi::NBNXM_KERNELS` says; the
            // list indexes this grid's slots, whose atoms are inside `x` (checked above); `inner`
            // has as many words as `outer`; the order is a permutation of the entries (the host's
            // `entry_order`, the GPU's order of the same entries, or the identity); the kernel
            // waits for the kernel before it first, as `Launch::AfterKernel` needs.
            unsafe { launch.launch(&self.module, self.kernel.entries()[2], shape, stream, &mut args)? };
        }
        self.lists[kind as usize].pruned = true;
        Ok(())
    }

    /// Enqueues the force kernel of list `kind` on `stream`: adds the list's LJ forces (cutoff
    /// `setup.cutoff`) at coordinates `x` to `f` and, with `energy`, its potential-shifted LJ energy
    /// to the accumulator ([`Self::energy`]). Uses the inner list once [`Self::prune`] ran since the
    /// last update, else the outer one.
    pub fn forces(
        &self,
        kind: ListKind,
        x: &impl DeviceMemory<Float3>,
        f: &impl DeviceMemory<Float3>,
        stream: &CudaStream,
        energy: bool,
    ) -> Result<()> {
        let slot = EnergySlot { buffer: &self.energy, index: 0 };
        self.forces_into(kind, x, f, stream, energy.then_some(slot), Launch::Plain)
    }

    /// [`Self::forces`] adding the energy (when `energy` is given) to an accumulator of the
    /// caller's (the MD step keeps one per energy step, read back at the next search), the kernel
    /// launched as `launch` says.
    pub fn forces_into(
        &self,
        kind: ListKind,
        x: &impl DeviceMemory<Float3>,
        f: &impl DeviceMemory<Float3>,
        stream: &CudaStream,
        energy: Option<EnergySlot<'_>>,
        launch: Launch,
    ) -> Result<()> {
        self.check_arrays(x, Some(f))?;
        let l = &self.lists[kind as usize];
        if l.n_entries == 0 {
            return Ok(());
        }
        let words = if l.pruned { &l.inner } else { &l.outer };
        let mut px = x.device_ptr();
        let (mut idx, mut ty) = (self.grid.atom_index.device_ptr(), self.grid.atom_type.device_ptr());
        let (mut ent, mut ord, mut n) = (l.entries.device_ptr(), l.order.device_ptr(), l.n_entries as u32);
        let pe_ptr = energy.map_or(self.energy.device_ptr(), |e| e.ptr());
        let (mut jl, mut lj, mut nt, mut pf, mut pe) = (words.device_ptr(), self.lj.device_ptr(), self.ntypes, f.device_ptr(), pe_ptr);
        let [mut bx, mut by, mut bz] = self.box_size;
        let rc = f64::from(self.setup.cutoff);
        let (mut rc2, mut sh6, mut sh12) = (self.setup.cutoff * self.setup.cutoff, rc.powi(-6) as f32, rc.powi(-12) as f32);
        let mut args = kernel_args![px, idx, ty, ent, ord, n, jl, lj, nt, pf, pe, bx, by, bz, rc2, sh6, sh12];
        let name = self.kernel.entries()[usize::from(energy.is_some())];
        let warps = self.warps_per_entry();
        let shape = l.shape(warps, abi::nbnxm_force_shared_bytes(self.ntypes, warps));
        // SAFETY: arguments match `nbnxm_forces[_energy]_*`, launched as `abi::NBNXM_KERNELS` says
        // (1 to 16 warps: `WarpsPerEntry`); slots index atoms inside `x` and `f`
        // (checked above), types are below `ntypes` (checked at upload), the table has ntypes²;
        // the order is a permutation of the entries (as for the prune); the kernel waits for the
        // kernel before it first, as `Launch::AfterKernel` needs.
        unsafe { launch.launch(&self.module, name, shape, stream, &mut args) }
    }

    /// The j-list words of list `kind` on the GPU, the inner (pruned) list or the outer one, read
    /// synchronously (for checks).
    pub fn read_j_list(&self, kind: ListKind, inner: bool) -> Result<Vec<u32>> {
        self.lists_complete()?;
        let l = &self.lists[kind as usize];
        let mut v = if inner { &l.inner } else { &l.outer }.to_host()?;
        v.truncate(l.n_words);
        Ok(v)
    }

    /// Sets every word of list `kind`'s inner list to `u32::MAX`, synchronously (for checks:
    /// poison before a prune, which must write every word).
    pub fn poison_inner(&mut self, kind: ListKind) -> Result<()> {
        self.lists_complete()?;
        self.lists[kind as usize].inner.fill_bytes(0xff)
    }

    /// Zeroes the energy accumulator on `stream` (before the first force launch of an energy step).
    pub fn zero_energy(&self, stream: &CudaStream) -> Result<()> {
        self.energy.zero_range_async(0, 1, stream)
    }

    /// The accumulated energy (kJ/mol), read synchronously (the caller orders it after the
    /// kernels, for example by synchronising their streams).
    pub fn energy(&self) -> Result<f64> {
        Ok(self.energy.to_host()?[0])
    }

    /// The device accumulator (one `f64`), for a caller that reduces it on the GPU.
    pub fn energy_buffer(&self) -> &DeviceBuffer<f64> {
        &self.energy
    }
}

impl Drop for NbnxmGpu {
    /// A search begun and never finished still copies into this object's page-locked memory, and
    /// a finished one's write pass may still run: both complete first.
    fn drop(&mut self) {
        let _ = self.lists_complete();
        let _ = self.abandon();
    }
}

fn check_setup(rlist: f32, setup: &ListSetup) -> Result<()> {
    if rlist < setup.rlist {
        let e = NbnxmError::Setup(format!("lists searched with {rlist} nm but the setup needs {} nm", setup.rlist));
        return Err(HaloError::InvalidInput(e.to_string()));
    }
    Ok(())
}

/// The error when atom types go beyond the LJ table (`beyond`), naming the types found (`found`,
/// as the caller counts them) and the table's `ntypes`.
fn lj_table_holds(beyond: bool, found: usize, ntypes: u32) -> Result<()> {
    if beyond {
        return Err(HaloError::InvalidInput(format!(
            "atom types up to {found} but the LJ table has {ntypes} (it must hold every type of the atoms)"
        )));
    }
    Ok(())
}
