//! The cluster-pair search on the GPU (`nbnxm_search_count`, `nbnxm_search_write`) on a grid in
//! device memory ([`super::DeviceGrid`]: uploaded from the host's sort, or built on the GPU): the GPU
//! counts the j-cluster words of every (i-supercluster, shift) item, lays the lists out from the
//! counts ([`DeviceLayout`], the `nbnxm_layout_*` kernels: word offsets and entries, exactly
//! [`layout`]'s), writes the words there, and sorts each list's launch order from its entries
//! ([`DeviceOrder`], the `nbnxm_order_*` kernels: exactly [`super::entry_order`]'s). Only the
//! lists' totals cross to the host, with a GPU build's three info words beside them (one
//! synchronisation, to make room for the lists and check the grid; the count pass runs over the
//! grid's bound on its superclusters, the kernels reading the count on the device). The lists equal
//! [`super::PairSearch`]'s word for word (same rule, same `f32` arithmetic, same order), which
//! `tests/gpu_nbnxm.rs` and `tests/gpu_grid.rs` check; `tests/gpu_nbnxm.rs` checks the GPU layout
//! against [`layout`] and the GPU order against [`super::entry_order`].

use super::NbnxmError;
use super::gpu_grid::SearchGrid;
use super::order::{DeviceOrder, order_max_j};
use super::pairlist::{list_cutoff2, shifts_of, split_entries};
use crate::abi::{self, NbnxmEntry, NbnxmShift};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape};
use crate::kernel_args;
use bytemuck::Pod;
use cudarc::driver::PinnedHostSlice;
use std::time::{Duration, Instant};

/// Where each list's words go and its entries, from the per-item counts: the host's layout, the
/// reference of the GPU's ([`DeviceLayout`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// `2 item + kind`: the first word of the item's words in list `kind` (0: home–home).
    pub offsets: Vec<u32>,
    /// The entries of each list.
    pub entries: [Vec<NbnxmEntry>; 2],
    /// Words of each list.
    pub words: [usize; 2],
}

/// The lists' layout from `counts` (`2 item + kind`, items `sci * n_shifts + s`): items in order,
/// each item's words split into entries of at most `max_j` words, as the host search lays them out.
pub fn layout(counts: &[u32], shift_index: &[u32], max_j: usize) -> Layout {
    let n_shifts = shift_index.len().max(1);
    let mut out = Layout { offsets: vec![0; counts.len()], ..Layout::default() };
    for (item, pair) in counts.chunks_exact(2).enumerate() {
        let (sci, shift) = ((item / n_shifts) as u32, shift_index.get(item % n_shifts).copied().unwrap_or(abi::NBNXM_CENTRAL_SHIFT));
        for (kind, &count) in pair.iter().enumerate() {
            let start = out.words[kind] as u32;
            out.offsets[2 * item + kind] = start;
            out.entries[kind].extend(split_entries(sci, shift, start, count, max_j));
            out.words[kind] += count as usize;
        }
    }
    out
}

/// Copies `data` into `buf`, reallocating (with 25% headroom) when it does not fit.
pub fn fit<T: Pod>(module: &KernelModule, buf: &mut DeviceBuffer<T>, data: &[T]) -> Result<()> {
    grow(module, buf, data.len())?;
    buf.copy_from_host(data)
}

/// Makes `buf` hold at least `len` elements (reallocating with 25% headroom; contents lost then).
pub(crate) fn grow<T: Pod>(module: &KernelModule, buf: &mut DeviceBuffer<T>, len: usize) -> Result<()> {
    if buf.len() < len {
        *buf = DeviceBuffer::uninit(module.context(), len + len / 4)?;
    }
    Ok(())
}

/// The sizes of the two lists a GPU layout found (what the host reads back of it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayoutTotals {
    /// j-list words of the home–home list and of the list with halo clusters.
    pub words: [usize; 2],
    /// Entries of the two lists.
    pub entries: [usize; 2],
}

impl LayoutTotals {
    /// The totals from the layout scan's sums (`[words 0, words 1, entries 0, entries 1]`); an
    /// error when a list has more words than its `u32` offsets address.
    pub fn from_sums(sums: [u64; abi::NBNXM_LAYOUT_SUMS]) -> Result<Self> {
        let max = u64::from(u32::MAX);
        for (kind, list) in ["home–home", "non-local"].into_iter().enumerate() {
            // Every entry has a word, so the words bound the entries too.
            if sums[kind] > max {
                return Err(HaloError::InvalidInput(NbnxmError::TooManyWords { list, words: sums[kind], max }.to_string()));
            }
        }
        Ok(Self { words: [sums[0] as usize, sums[1] as usize], entries: [sums[2] as usize, sums[3] as usize] })
    }
}

/// `u64`s of the buffer the host reads back after the layout's scan: the totals, then the grid's
/// info words ([`abi::NBNXM_GRID_INFO_WORDS`] `u32`s, two per `u64`).
const READ_BACK: usize = abi::NBNXM_LAYOUT_SUMS + abi::NBNXM_GRID_INFO_WORDS.div_ceil(2);

/// The totals and the info words of the buffer read back (`READ_BACK` `u64`s, or fewer: zeros).
fn split_read_back(back: &[u64]) -> ([u64; abi::NBNXM_LAYOUT_SUMS], [u32; abi::NBNXM_GRID_INFO_WORDS]) {
    let sums = std::array::from_fn(|v| back.get(v).copied().unwrap_or(0));
    let rest: &[u32] = bytemuck::cast_slice(back.get(abi::NBNXM_LAYOUT_SUMS..).unwrap_or(&[]));
    (sums, std::array::from_fn(|w| rest.get(w).copied().unwrap_or(0)))
}

/// Where the GPU writes one list: its entries, its words and its launch order (device
/// addresses), and how many of each the memory there holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ListRoom {
    /// Entries' address (16-byte aligned).
    pub(crate) entries: u64,
    /// Entries it holds.
    pub(crate) entry_room: usize,
    /// Words' address.
    pub(crate) words: u64,
    /// Words it holds.
    pub(crate) word_room: usize,
    /// The launch order's address (one `u32` per entry).
    pub(crate) order: u64,
    /// Places it holds.
    pub(crate) order_room: usize,
}

impl ListRoom {
    /// Room for a list in `entries`, `words` and `order`.
    pub(crate) fn of(entries: &DeviceBuffer<NbnxmEntry>, words: &DeviceBuffer<u32>, order: &DeviceBuffer<u32>) -> Self {
        Self {
            entries: entries.device_ptr(),
            entry_room: entries.len(),
            words: words.device_ptr(),
            word_room: words.len(),
            order: order.device_ptr(),
            order_room: order.len(),
        }
    }
}

/// The lists' layout on the GPU (the `nbnxm_layout_*` kernels, `kernels-gpu/src/kernels/nbnxm_layout.rs`):
/// from the items' word counts, each item's word offsets and the lists' entries, equal to
/// [`layout`]'s. Holds the scan's buffers (per-tile sums, the totals), reused from one search to
/// the next.
pub struct DeviceLayout {
    /// [`abi::NBNXM_LAYOUT_SUMS`] sums per tile of [`abi::NBNXM_LAYOUT_TILE`] items, then the
    /// sums of the tiles before each.
    tiles: DeviceBuffer<u64>,
    /// The lists' totals ([`abi::NBNXM_LAYOUT_SUMS`]), then room for a grid's info words, copied
    /// there on the stream so that one read-back takes both.
    totals: DeviceBuffer<u64>,
    /// Page-locked memory the totals (and words) are read back into, enqueued before the wait:
    /// no synchronous copy from the device after it.
    back: PinnedHostSlice<u64>,
    /// How long the host last waited in [`Self::wait_read_back`]'s synchronisation (the GPU work
    /// before the read-back that no host work hid).
    waited: Duration,
}

impl DeviceLayout {
    /// Empty buffers, grown by the first layout.
    pub fn new(module: &KernelModule) -> Result<Self> {
        let ctx = module.context();
        // SAFETY: the contents are written by a read-back before the host reads them (after the
        // stream's synchronisation).
        let back = unsafe { ctx.alloc_pinned_with_flags::<u64>(READ_BACK, 0) }.during("allocating the list layout's read-back")?;
        Ok(Self { tiles: DeviceBuffer::uninit(ctx, 1)?, totals: DeviceBuffer::uninit(ctx, READ_BACK)?, back, waited: Duration::ZERO })
    }

    /// Enqueues the read-back of the totals (and words) into the page-locked memory, runs
    /// `before_wait` (host work that overlaps the GPU's), synchronises `stream` (also after a
    /// failure: nothing may still copy into the memory when this returns), and returns what came
    /// back.
    fn read_back(&mut self, stream: &CudaStream, before_wait: &mut dyn FnMut() -> Result<()>) -> Result<[u64; READ_BACK]> {
        let enqueued = self.enqueue_read_back(stream);
        self.wait_read_back(enqueued, stream, before_wait)
    }

    /// Enqueues the read-back of the totals (and words) into the page-locked memory on `stream`.
    /// [`Self::wait_read_back`] must follow before the memory is read, freed or written again
    /// (whether this succeeded or not).
    fn enqueue_read_back(&mut self, stream: &CudaStream) -> Result<()> {
        let back = &mut self.back.as_mut_slice().during("reaching the list layout's read-back")?[..READ_BACK];
        // SAFETY: the memory is `self`'s and is neither read nor freed before the stream is
        // synchronised: by `wait_read_back`, which the callers run next on this object (or, for
        // a search begun and never finished, the context's synchronisation that drops it,
        // `NbnxmGpu::abandon`).
        unsafe { self.totals.enqueue_read(0, back, stream) }
    }

    /// After [`Self::enqueue_read_back`] (`enqueued`: its result) on `stream`: runs `before_wait`
    /// (not after a failed enqueue), synchronises `stream` (always) and returns what came back.
    fn wait_read_back(&mut self, enqueued: Result<()>, stream: &CudaStream, before_wait: &mut dyn FnMut() -> Result<()>) -> Result<[u64; READ_BACK]> {
        let hooked = enqueued.and_then(|()| before_wait());
        let t = Instant::now();
        let waited = stream.synchronize().during("waiting for the GPU grid and the list layout's totals");
        self.waited = t.elapsed();
        hooked.and(waited)?;
        let back = self.back.as_slice().during("reaching the list layout's read-back")?;
        let mut out = [0u64; READ_BACK];
        out.copy_from_slice(&back[..READ_BACK]);
        Ok(out)
    }

    /// `max_j` as the kernels take it (at least 1; `split_entries` reads a larger one as `u32::MAX`).
    fn max_j(max_j: usize) -> u32 {
        u32::try_from(max_j).unwrap_or(u32::MAX).max(1)
    }

    /// One block per tile of items.
    fn per_tile(items: usize) -> LaunchShape {
        let tiles = items.div_ceil(abi::NBNXM_LAYOUT_TILE as usize).max(1) as u32;
        LaunchShape { grid: (tiles, 1), block: abi::NBNXM_LAYOUT_THREADS, shared_bytes: abi::NBNXM_LAYOUT_SHARED_BYTES }
    }

    /// An error unless `items` items fit the kernels' `u32` item indices and `counts` holds theirs.
    fn check_items(counts: &DeviceBuffer<u32>, items: usize) -> Result<()> {
        if items > (u32::MAX - abi::NBNXM_LAYOUT_TILE) as usize {
            return Err(HaloError::InvalidInput(format!("GPU list layout: {items} items, more than a u32 index holds")));
        }
        if counts.len() < 2 * items {
            return Err(HaloError::InvalidInput(format!("GPU list layout: {items} items but {} counts (2 per item)", counts.len())));
        }
        Ok(())
    }

    /// Enqueues the scan of the first `items` items' counts (`counts[2 item + kind]`) on
    /// `stream` (after what `stream` already holds, the count pass), synchronises it and reads
    /// back the lists' totals. An error when a list has more words than a `u32` addresses.
    pub(crate) fn totals(
        &mut self,
        module: &KernelModule,
        counts: &DeviceBuffer<u32>,
        items: usize,
        max_j: usize,
        stream: &CudaStream,
    ) -> Result<LayoutTotals> {
        Self::check_items(counts, items)?;
        if items == 0 {
            return Ok(LayoutTotals::default());
        }
        self.enqueue_scan(module, counts, items, max_j, stream)?;
        LayoutTotals::from_sums(split_read_back(&self.read_back(stream, &mut || Ok(()))?).0)
    }

    /// [`Self::totals`]' scan, with a grid's [`abi::NBNXM_GRID_INFO_WORDS`] info words at device
    /// address `words` copied beside the totals after it on `stream` (a device-to-device copy in
    /// stream order, after the passes that wrote them), and the read-back of both enqueued, in
    /// page-locked memory: [`Self::wait_sums_and_words`] must follow on this object before
    /// anything else of it runs (after an error here, the caller's synchronisation of `stream`).
    /// `items` must be above 0.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enqueue_sums_and_words(
        &mut self,
        module: &KernelModule,
        counts: &DeviceBuffer<u32>,
        items: usize,
        max_j: usize,
        words: u64,
        stream: &CudaStream,
    ) -> Result<()> {
        Self::check_items(counts, items)?;
        if items == 0 {
            return Err(HaloError::InvalidInput("GPU list layout: no item to scan".into()));
        }
        self.enqueue_scan(module, counts, items, max_j, stream)?;
        let bytes = abi::NBNXM_GRID_INFO_WORDS * size_of::<u32>();
        self.totals.context().bind_to_thread().during("binding the context")?;
        // SAFETY: the destination is inside `totals` (`READ_BACK` u64s: the sums, then room for the
        // words); the source is the caller's `NBNXM_GRID_INFO_WORDS` words, alive (a grid's scratch,
        // never freed while the grid lives) until the stream's synchronisation in
        // `wait_sums_and_words`; in `stream`'s order.
        unsafe { cudarc::driver::result::memcpy_dtod_async(self.totals.device_ptr_at(abi::NBNXM_LAYOUT_SUMS), words, bytes, stream.cu_stream()) }
            .during("copying the grid's info words")?;
        self.enqueue_read_back(stream)
    }

    /// After [`Self::enqueue_sums_and_words`] succeeded on `stream`: `before_wait` (host work of
    /// the caller's that overlaps the passes; its error is returned after the wait), one
    /// synchronisation of `stream` and what came back: the raw sums (for
    /// [`LayoutTotals::from_sums`], which the caller applies after checking the grid) and the
    /// words.
    pub(crate) fn wait_sums_and_words(
        &mut self,
        stream: &CudaStream,
        before_wait: &mut dyn FnMut() -> Result<()>,
    ) -> Result<([u64; abi::NBNXM_LAYOUT_SUMS], [u32; abi::NBNXM_GRID_INFO_WORDS])> {
        Ok(split_read_back(&self.wait_read_back(Ok(()), stream, before_wait)?))
    }

    /// Enqueues the layout's first two passes (tiles, scan) on `stream`: the tile starts and the
    /// totals of the first `items` (at least one, checked) items' counts.
    fn enqueue_scan(&mut self, module: &KernelModule, counts: &DeviceBuffer<u32>, items: usize, max_j: usize, stream: &CudaStream) -> Result<()> {
        let shape = Self::per_tile(items);
        grow(module, &mut self.tiles, abi::NBNXM_LAYOUT_SUMS * shape.grid.0 as usize)?;
        let (mut c, mut n, mut mj, mut tiles, mut nt, mut tot) =
            (counts.device_ptr(), items as u32, Self::max_j(max_j), self.tiles.device_ptr(), shape.grid.0, self.totals.device_ptr());
        let mut args = kernel_args![c, n, mj, tiles];
        // SAFETY: arguments match `nbnxm_layout_tiles`: `counts` holds `2 items` counts (the
        // callers' `check_items`), `tiles` 4 sums per block, blocks and shared memory as the ABI says.
        unsafe { module.launch(abi::NBNXM_LAYOUT_TILES, shape, stream, &mut args)? };
        let one = LaunchShape { grid: (1, 1), ..shape };
        let mut args = kernel_args![tiles, nt, tot];
        // SAFETY: arguments match `nbnxm_layout_scan`: the sums of `nt` tiles, 4 totals (the
        // buffer holds `READ_BACK >= 4`), one block.
        unsafe { module.launch(abi::NBNXM_LAYOUT_SCAN, one, stream, &mut args) }
    }

    /// Enqueues on `stream` the writing of the first `items` items' word offsets
    /// (`offsets[2 item + kind]`) and the lists' entries into `rooms`, after [`Self::totals`] on the
    /// same counts (unchanged since) returned `totals`. Item `i`'s supercluster is
    /// `i / n_shifts`, its shift index `shifts[i % n_shifts].index`. An error, before anything is
    /// enqueued, when a buffer is too small for what `totals` announced.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write(
        &self,
        module: &KernelModule,
        counts: &DeviceBuffer<u32>,
        items: usize,
        max_j: usize,
        shifts: &DeviceBuffer<NbnxmShift>,
        n_shifts: usize,
        totals: &LayoutTotals,
        offsets: &DeviceBuffer<u32>,
        rooms: [ListRoom; 2],
        stream: &CudaStream,
    ) -> Result<()> {
        Self::check_items(counts, items)?;
        if items == 0 {
            return Ok(());
        }
        let bad = |m: String| Err(HaloError::InvalidInput(format!("GPU list layout: {m}")));
        if n_shifts == 0 || shifts.len() < n_shifts || offsets.len() < 2 * items {
            return bad(format!("{n_shifts} shifts ({} given) and {} offsets for {items} items", shifts.len(), offsets.len()));
        }
        for (kind, room) in rooms.iter().enumerate() {
            if room.entry_room < totals.entries[kind] || room.word_room < totals.words[kind] || room.entries % 16 != 0 {
                return bad(format!("list {kind} has room for {} entries and {} words, needs {totals:?}", room.entry_room, room.word_room));
            }
        }
        let (mut c, mut n, mut mj, mut sp, mut ns) = (counts.device_ptr(), items as u32, Self::max_j(max_j), shifts.device_ptr(), n_shifts as u32);
        let (mut tiles, mut off, mut el, mut en) = (self.tiles.device_ptr(), offsets.device_ptr(), rooms[0].entries, rooms[1].entries);
        let mut args = kernel_args![c, n, mj, sp, ns, tiles, off, el, en];
        // SAFETY: arguments match `nbnxm_layout_write`: the tile starts of these counts (the
        // caller's `totals` call), `n_shifts` shifts, `2 items` offsets, and room for every entry
        // the totals announced (checked; 16-byte aligned), which fit a u32 (`from_sums`).
        unsafe { module.launch(abi::NBNXM_LAYOUT_WRITE, Self::per_tile(items), stream, &mut args) }
    }

    /// The whole layout of `items` items' counts (`counts[2 item + kind]`) on `stream`: the
    /// totals, then each item's word offsets to `offsets` and the lists' entries to `entries`
    /// (home–home, then with halo clusters), item `i` being supercluster `i / n_shifts` under
    /// shift `shifts[i % n_shifts].index`; synchronises `stream`. Exactly [`layout`] of the
    /// counts. An error when an output is too small for the totals (nothing is written then).
    /// `counts` and `shifts` must be complete before `stream`'s work: after synchronous copies
    /// from pageable memory, synchronise the context first.
    #[allow(clippy::too_many_arguments)]
    pub fn lay_out(
        &mut self,
        module: &KernelModule,
        counts: &DeviceBuffer<u32>,
        items: usize,
        shifts: &DeviceBuffer<NbnxmShift>,
        n_shifts: usize,
        max_j: usize,
        offsets: &DeviceBuffer<u32>,
        entries: [&DeviceBuffer<NbnxmEntry>; 2],
        stream: &CudaStream,
    ) -> Result<LayoutTotals> {
        let totals = self.totals(module, counts, items, max_j, stream)?;
        // The words are not written here: room for them is not needed.
        let room = |e: &DeviceBuffer<NbnxmEntry>| ListRoom {
            entries: e.device_ptr(),
            entry_room: e.len(),
            words: 0,
            word_room: usize::MAX,
            order: 0,
            order_room: 0,
        };
        self.write(module, counts, items, max_j, shifts, n_shifts, &totals, offsets, [room(entries[0]), room(entries[1])], stream)?;
        stream.synchronize().during("waiting for the GPU list layout")?;
        Ok(totals)
    }
}

/// The search's own buffers (the grid's are a [`DeviceGrid`]'s): the shifts, the items' counts
/// and word offsets, the layout's and the launch order's.
pub(crate) struct GpuSearch {
    shifts: DeviceBuffer<NbnxmShift>,
    /// The shifts `shifts` holds (uploaded again only when they change).
    uploaded: Vec<(u32, [f32; 3])>,
    counts: DeviceBuffer<u32>,
    offsets: DeviceBuffer<u32>,
    layout: DeviceLayout,
    order: DeviceOrder,
}

impl GpuSearch {
    pub(crate) fn new(module: &KernelModule) -> Result<Self> {
        let ctx = module.context();
        Ok(Self {
            shifts: DeviceBuffer::uninit(ctx, 1)?,
            uploaded: Vec::new(),
            counts: DeviceBuffer::uninit(ctx, 1)?,
            offsets: DeviceBuffer::uninit(ctx, 1)?,
            layout: DeviceLayout::new(module)?,
            order: DeviceOrder::new(module)?,
        })
    }

    /// How long the host waited for the GPU in the last [`Self::finish`]'s one synchronisation
    /// (zero without items: nothing was waited for).
    pub(crate) fn waited(&self) -> Duration {
        self.layout.waited
    }

    fn shape(items: usize) -> LaunchShape {
        let blocks = items.div_ceil(abi::NBNXM_SEARCH_WARPS_PER_BLOCK as usize).max(1) as u32;
        LaunchShape { grid: (blocks, 1), block: abi::NBNXM_SEARCH_WARPS_PER_BLOCK * 32, shared_bytes: abi::NBNXM_SEARCH_SHARED_BYTES }
    }

    /// The search's first half, on `stream` without a host wait: the count pass over
    /// `grid.held.superclusters` (a bound: the kernels take the grid's count from its device info
    /// words, and items beyond it count 0), the layout's scan, the info words copied beside the
    /// totals, and the read-back of both enqueued. [`Self::finish`] on the same `grid` and
    /// `stream` must come next on this object (it waits for the read-back). When the grid or the
    /// shifts were just uploaded from pageable host memory, the context is synchronised before
    /// the count pass. An error, before anything runs, when `max_j` is beyond what the launch
    /// order sorts or the items overflow a `u32`; an error after something was enqueued
    /// synchronises `stream` first, so nothing is left in flight.
    pub(crate) fn begin(&mut self, module: &KernelModule, grid: SearchGrid, rl: f32, max_j: usize, stream: &CudaStream) -> Result<BegunLists> {
        let held = grid.held;
        let order_j = order_max_j(max_j)?;
        let shifts = shifts_of(held.periodic, held.box_size);
        let items = held.superclusters * shifts.len();
        let begun = BegunLists { items, n_shifts: shifts.len(), max_j, order_j, rl };
        if items == 0 {
            return Ok(begun);
        }
        // The kernels index items with a u32 (`n_super * n_shifts`), the layout's tiles too.
        if items > (u32::MAX - abi::NBNXM_LAYOUT_TILE) as usize {
            let n_super = held.superclusters;
            return Err(HaloError::InvalidInput(format!("GPU search: {items} items ({n_super} superclusters at most), more than a u32 index holds")));
        }
        let mut pageable = held.uploaded;
        if self.uploaded != shifts {
            fit(module, &mut self.shifts, &shifts.iter().map(|&(index, v)| NbnxmShift { v, index }).collect::<Vec<_>>())?;
            self.uploaded = shifts;
            pageable = true;
        }
        // Sized for the bound; the last search is complete (the owner waits for it before the next,
        // `NbnxmGpu::lists_complete`), so these may move.
        grow(module, &mut self.counts, 2 * items)?;
        grow(module, &mut self.offsets, 2 * items)?;
        if pageable {
            // Synchronous copies from pageable memory (the grid's, the shifts) may still be in
            // flight: order them first. A grid built on the GPU is on `stream` (its passes come
            // before the count pass in stream order), so the resident search skips this.
            module.context().synchronize().during("waiting for the grid's upload")?;
        }
        let enqueued = self.enqueue_count(module, grid, &begun, stream);
        match enqueued.and_then(|()| self.layout.enqueue_sums_and_words(module, &self.counts, items, max_j, grid.info, stream)) {
            Ok(()) => Ok(begun),
            Err(e) => {
                // Whatever was enqueued (the read-back into page-locked memory among it) completes
                // before the error returns.
                let _ = stream.synchronize();
                Err(e)
            }
        }
    }

    /// Enqueues the count pass of `begun` on `grid` (see [`Self::begin`]).
    fn enqueue_count(&self, module: &KernelModule, grid: SearchGrid, begun: &BegunLists, stream: &CudaStream) -> Result<()> {
        let (mut sb, mut cb, mut sz, mut zp) = (grid.super_bbox, grid.cluster_bbox, grid.super_zone, grid.zones);
        let (mut nz, mut cs, mut sp, mut ns) = (grid.held.zones as u32, grid.column_start, self.shifts.device_ptr(), begun.n_shifts as u32);
        let (mut nsc, mut info, mut rlv, mut rl2) = (grid.held.superclusters as u32, grid.info, begun.rl, list_cutoff2(begun.rl));
        let mut counts = self.counts.device_ptr();
        let mut args = kernel_args![sb, cb, sz, zp, nz, cs, sp, ns, nsc, info, rlv, rl2, counts];
        // SAFETY: arguments match `nbnxm_search_count`; `info` holds the grid's count, at most
        // `n_super` (a GPU build's plan bound, `ZonePlan::most`, or an upload's exact count), and the
        // grid's arrays describe that many superclusters in `nz` zones (every column range and
        // supercluster index inside them; a GPU build's passes come first on `stream`, and a bad
        // atom leaves them consistent, without it); `counts` holds 2 per item of the bound (`begin`
        // grew it), and the items fit a u32 (checked there).
        unsafe { module.launch(abi::NBNXM_SEARCH_COUNT, Self::shape(begun.items), stream, &mut args) }
    }

    /// The search's second half after [`Self::begin`] (`begun`, on the same `grid` and `stream`):
    /// `before_wait` (host work of the caller's that overlaps the grid's and the count pass's GPU
    /// time; its error ends the search after the wait), one synchronisation of `stream` and the
    /// read-back; then `settle(words)` checks the grid (`None`: nothing ran, no item), the totals
    /// are checked, and `out(totals)` makes room for the two lists (home–home, with halo) and says
    /// where they go, and the layout's entries, the write pass and each list's launch order (from
    /// its entries) fill them, enqueued on `stream` without a second wait. Returns the totals; the
    /// lists are complete once `stream` is: work on `stream` is ordered after them, anything else
    /// (another stream, a synchronous copy, this object's next search, which may reallocate the
    /// counts and offsets) must wait for it first. An error from `settle`, the totals or `out`
    /// leaves the lists unwritten (nothing after the read-back is enqueued).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn finish(
        &mut self,
        module: &KernelModule,
        grid: SearchGrid,
        begun: BegunLists,
        stream: &CudaStream,
        before_wait: &mut dyn FnMut() -> Result<()>,
        settle: &mut dyn FnMut(Option<[u32; abi::NBNXM_GRID_INFO_WORDS]>) -> Result<()>,
        out: &mut dyn FnMut(&LayoutTotals) -> Result<[ListRoom; 2]>,
    ) -> Result<LayoutTotals> {
        let BegunLists { items, n_shifts, max_j, order_j, rl } = begun;
        self.layout.waited = Duration::ZERO;
        if items == 0 {
            before_wait()?;
            settle(None)?;
            let totals = LayoutTotals::default();
            out(&totals)?;
            return Ok(totals);
        }
        // The one synchronisation: the grid's words and the lists' totals together.
        let (sums, words) = tracing::debug_span!("search.lists_wait").in_scope(|| self.layout.wait_sums_and_words(stream, before_wait))?;
        settle(Some(words))?;
        let totals = LayoutTotals::from_sums(sums)?;
        let rooms = out(&totals)?;
        if rooms.iter().zip(totals.words).zip(totals.entries).any(|((r, w), e)| r.word_room < w || r.order_room < e) {
            return Err(HaloError::InvalidInput(format!("GPU search: the lists have room for {rooms:?}, the totals are {totals:?}")));
        }
        // The last search is complete and this one's stream was just synchronised: the order's
        // counts may move.
        self.order.reserve(module, totals.entries[0].max(totals.entries[1]), order_j)?;
        self.layout.write(module, &self.counts, items, max_j, &self.shifts, n_shifts, &totals, &self.offsets, rooms, stream)?;
        for (room, n) in rooms.iter().zip(totals.entries) {
            // SAFETY: the layout just wrote the list's `n` entries there (same stream, so before),
            // and its order has room for `n` places (checked); both outlive the order's kernels (the
            // owner waits for the lists, `NbnxmGpu::lists_complete`, before it reallocates them).
            // The two lists' orders share the counts one after the other on the stream.
            unsafe { self.order.enqueue(module, room.entries, n, order_j, room.order, stream)? };
        }
        let (mut sb, mut cb, mut sz, mut zp) = (grid.super_bbox, grid.cluster_bbox, grid.super_zone, grid.zones);
        let (mut nz, mut cs, mut sp, mut ns) = (grid.held.zones as u32, grid.column_start, self.shifts.device_ptr(), n_shifts as u32);
        let (mut nsc, mut info, mut rlv, mut rl2) = (grid.held.superclusters as u32, grid.info, rl, list_cutoff2(rl));
        let (mut offsets, mut jl, mut jn) = (self.offsets.device_ptr(), rooms[0].words, rooms[1].words);
        let mut args = kernel_args![sb, cb, sz, zp, nz, cs, sp, ns, nsc, info, rlv, rl2, offsets, jl, jn];
        // SAFETY: arguments match `nbnxm_search_write`; as for the count pass (same grid, same
        // bound, same device count), `offsets` from the layout of this grid's counts (same stream,
        // so after it), and room for every word (checked).
        unsafe { module.launch(abi::NBNXM_SEARCH_WRITE, Self::shape(items), stream, &mut args)? };
        Ok(totals)
    }
}

/// A search [`GpuSearch::begin`] enqueued up to its read-back, for [`GpuSearch::finish`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct BegunLists {
    /// `(i-supercluster, shift)` items of the grid's bound; 0: nothing was enqueued.
    items: usize,
    n_shifts: usize,
    max_j: usize,
    /// `max_j` as the launch order takes it.
    order_j: u32,
    /// The list cutoff.
    rl: f32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nbnxm::pairlist::shifts;
    use crate::nbnxm::{ClusterPairList, LocalAtoms, PairSearch, SearchOptions};
    use crate::system::MolecularSystem;

    #[test]
    fn the_layout_of_the_counts_is_the_host_lists_layout() {
        // The host search's own word counts per item, laid out again: the same entries.
        let s = MolecularSystem::generate(3000, 4).unwrap();
        let types: Vec<u32> = s.types.iter().map(|&t| u32::from(t)).collect();
        let one = LocalAtoms::single_rank(&s.positions, &types, 2, s.box_size).unwrap();
        let plan = crate::decomp::HaloPlan::build(&s, crate::decomp::RankGrid::new([2, 2, 1]).unwrap(), 1.2).unwrap();
        let corner = LocalAtoms::from_plan(&plan, 3, &s.positions, &s.types).unwrap();
        for (a, max_j) in [(&one, 32), (&one, 7), (&corner, 32), (&corner, 5)] {
            let search = PairSearch::build(a, &SearchOptions { max_j_per_entry: max_j, ..SearchOptions::new(1.2) }).unwrap();
            let sh: Vec<u32> = shifts(&search.grid).iter().map(|s| s.0).collect();
            let items = search.grid.superclusters() * sh.len();
            let mut counts = vec![0u32; 2 * items];
            for (kind, list) in [&search.local, &search.nonlocal].into_iter().enumerate() {
                for e in &list.entries {
                    let s_slot = sh.iter().position(|&i| i == e.shift).unwrap();
                    counts[2 * (e.sci as usize * sh.len() + s_slot) + kind] += e.j_end - e.j_start;
                }
            }
            let l = layout(&counts, &sh, max_j);
            let check = |kind: usize, list: &ClusterPairList| {
                assert_eq!(l.entries[kind], list.entries, "max_j {max_j}, list {kind}");
                assert_eq!(l.words[kind], list.j_list.len());
            };
            check(0, &search.local);
            check(1, &search.nonlocal);
            assert!(!search.local.is_empty());
            // Every item's offset is where its first entry starts.
            for e in &search.local.entries {
                let s_slot = sh.iter().position(|&i| i == e.shift).unwrap();
                assert!(l.offsets[2 * (e.sci as usize * sh.len() + s_slot)] <= e.j_start);
            }
        }
        assert_eq!(layout(&[], &[13], 32), Layout::default());
    }

    /// The `nbnxm_layout_*` passes on the CPU: tiles of `NBNXM_LAYOUT_TILE` items, threads of
    /// `NBNXM_LAYOUT_ITEMS_PER_THREAD` consecutive items, sums per tile, their exclusive scan, then
    /// each thread's items from its tile's start plus the sums of the tile's threads before it.
    fn passes(counts: &[u32], shift_index: &[u32], max_j: usize) -> Layout {
        let (tile, per) = (abi::NBNXM_LAYOUT_TILE as usize, abi::NBNXM_LAYOUT_ITEMS_PER_THREAD as usize);
        let mj = DeviceLayout::max_j(max_j);
        let items = counts.len() / 2;
        let sums = |range: std::ops::Range<usize>| {
            let mut s = [0u64; 4];
            for i in range.start..range.end.min(items) {
                for kind in 0..2 {
                    s[kind] += u64::from(counts[2 * i + kind]);
                    s[2 + kind] += u64::from(abi::nbnxm_entry_split(counts[2 * i + kind], mj)[0]);
                }
            }
            s
        };
        let tiles: Vec<[u64; 4]> = (0..items.div_ceil(tile)).map(|t| sums(t * tile..(t + 1) * tile)).collect();
        let mut starts = vec![[0u64; 4]; tiles.len()];
        for t in 1..tiles.len() {
            starts[t] = std::array::from_fn(|v| starts[t - 1][v] + tiles[t - 1][v]);
        }
        let total: [u64; 4] = std::array::from_fn(|v| tiles.iter().map(|s| s[v]).sum());
        let mut out =
            Layout { offsets: vec![u32::MAX; counts.len()], entries: [Vec::new(), Vec::new()], words: [total[0] as usize, total[1] as usize] };
        let mut entries = [vec![NbnxmEntry::default(); total[2] as usize], vec![NbnxmEntry::default(); total[3] as usize]];
        let n_shifts = shift_index.len().max(1);
        for (t, start) in starts.iter().enumerate() {
            for th in 0..abi::NBNXM_LAYOUT_THREADS as usize {
                let first = t * tile + th * per;
                let before = sums(t * tile..first);
                let mut at: [u64; 4] = std::array::from_fn(|v| start[v] + before[v]);
                for i in first..(first + per).min(items) {
                    let (sci, shift) = ((i / n_shifts) as u32, shift_index[i % n_shifts]);
                    for kind in 0..2 {
                        let c = counts[2 * i + kind];
                        out.offsets[2 * i + kind] = at[kind] as u32;
                        let [n, size] = abi::nbnxm_entry_split(c, mj);
                        for j in 0..n {
                            let w = at[kind] as u32 + j * size;
                            entries[kind][at[2 + kind] as usize + j as usize] =
                                NbnxmEntry { sci, shift, j_start: w, j_end: w + size.min(c - j * size) };
                        }
                        at[kind] += u64::from(c);
                        at[2 + kind] += u64::from(n);
                    }
                }
            }
        }
        out.entries = entries;
        out
    }

    #[test]
    fn the_gpu_layout_passes_give_the_host_layout() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let tile = abi::NBNXM_LAYOUT_TILE as usize;
        for (items, max_j, top) in [(1, 32, 70), (tile - 1, 32, 70), (tile, 5, 12), (3 * tile + 17, 1, 4), (700, 0, 3), (2500, usize::MAX, 300)] {
            let counts: Vec<u32> = (0..2 * items).map(|_| if rng.random_range(0..4) == 0 { 0 } else { rng.random_range(0..top) }).collect();
            let shifts: Vec<u32> = (0..27).collect();
            assert_eq!(passes(&counts, &shifts, max_j), layout(&counts, &shifts, max_j), "{items} items, max_j {max_j}");
        }
    }

    /// The count pass over a bound of `bound` superclusters (`n_shifts` items each) on a grid of
    /// `exact`'s (`2 items` counts of the grid's own items), the device's count word saying
    /// `device_count`: the kernels' rule, item `i` of supercluster `i / n_shifts` counts its words
    /// below [`abi::nbnxm_search_superclusters`] of both and none from there on.
    fn counts_over_bound(exact: &[u32], n_shifts: usize, bound: usize, device_count: u32) -> Vec<u32> {
        let g = abi::nbnxm_search_superclusters(bound as u32, device_count) as usize;
        (0..2 * bound * n_shifts).map(|k| if k / 2 / n_shifts < g { exact[k] } else { 0 }).collect()
    }

    #[test]
    fn items_beyond_the_grids_count_add_nothing_to_the_lists() {
        use crate::nbnxm::gpu_grid::ZonePlan;
        let s = MolecularSystem::generate(3000, 9).unwrap();
        let types: Vec<u32> = s.types.iter().map(|&t| u32::from(t)).collect();
        let one = LocalAtoms::single_rank(&s.positions, &types, 2, s.box_size).unwrap();
        let plan = crate::decomp::HaloPlan::build(&s, crate::decomp::RankGrid::new([2, 2, 1]).unwrap(), 1.2).unwrap();
        let corner = LocalAtoms::from_plan(&plan, 3, &s.positions, &s.types).unwrap();
        for (a, max_j) in [(&one, 32), (&corner, 5)] {
            let search = PairSearch::build(a, &SearchOptions { max_j_per_entry: max_j, ..SearchOptions::new(1.2) }).unwrap();
            let sh: Vec<u32> = shifts(&search.grid).iter().map(|s| s.0).collect();
            let supers = search.grid.superclusters();
            let mut counts = vec![0u32; 2 * supers * sh.len()];
            for (kind, list) in [&search.local, &search.nonlocal].into_iter().enumerate() {
                for e in &list.entries {
                    let s_slot = sh.iter().position(|&i| i == e.shift).unwrap();
                    counts[2 * (e.sci as usize * sh.len() + s_slot) + kind] += e.j_end - e.j_start;
                }
            }
            // The bound the search step launches over: the grid build's plan.
            let bound = ZonePlan::local(a).most;
            assert!(bound > supers, "the bound ({bound}) is above the count ({supers}): items beyond it exist");
            let over = counts_over_bound(&counts, sh.len(), bound, supers as u32);
            let (want, got) = (layout(&counts, &sh, max_j), layout(&over, &sh, max_j));
            assert_eq!(got.entries, want.entries, "max_j {max_j}: entries");
            assert_eq!(got.words, want.words, "max_j {max_j}: words");
            assert_eq!(got.offsets[..counts.len()], want.offsets[..], "max_j {max_j}: offsets of the grid's items");
            assert!(got.offsets[counts.len()..].chunks_exact(2).all(|o| o == want.words.map(|w| w as u32)), "beyond: at the lists' ends");
            // The GPU's layout passes on the bound's counts, as the search step runs them.
            assert_eq!(passes(&over, &sh, max_j), got, "max_j {max_j}: GPU layout over the bound");
        }
        // The device's count, never above the bound whatever the word says.
        for (bound, word, want) in [(10, 7, 7), (10, 10, 10), (10, 11, 10), (10, u32::MAX, 10), (0, 5, 0), (5, 0, 0)] {
            assert_eq!(abi::nbnxm_search_superclusters(bound, word), want, "bound {bound}, word {word}");
        }
        // A corrupted word above the bound still reads only the bound's items.
        assert_eq!(counts_over_bound(&[1; 8], 2, 2, u32::MAX), vec![1; 8]);
    }

    #[test]
    fn the_read_back_holds_the_totals_then_the_grids_words() {
        let mut back = [0u64; READ_BACK];
        back[..4].copy_from_slice(&[11, 12, 13, 14]);
        bytemuck::cast_slice_mut::<u64, u32>(&mut back[4..])[..3].copy_from_slice(&[u32::MAX, 77, 5]);
        assert_eq!(split_read_back(&back), ([11, 12, 13, 14], [u32::MAX, 77, 5]));
        assert_eq!(abi::NBNXM_GRID_INFO_BAD_ATOM, 0);
        assert_eq!(split_read_back(&back[..4]).1, [0; 3], "a short read-back has no words");
    }

    #[test]
    fn entries_split_evenly_into_at_most_max_j_words() {
        // The split the host always made (before `abi::nbnxm_entry_split` was shared with the GPU).
        let old = |count: u32, max_j: usize| {
            let parts = count.div_ceil(max_j.max(1) as u32).max(1);
            let size = count.div_ceil(parts).max(1);
            (0..count.div_ceil(size)).map(|k| (k * size, ((k + 1) * size).min(count))).collect::<Vec<_>>()
        };
        for max_j in [0, 1, 2, 5, 7, 31, 32, 33, 100] {
            for count in 0..=300u32 {
                let got: Vec<_> = split_entries(3, 13, 1000, count, max_j).collect();
                assert_eq!(got.iter().map(|e| (e.j_start - 1000, e.j_end - 1000)).collect::<Vec<_>>(), old(count, max_j), "{count} {max_j}");
                assert_eq!(got.len() as u32, abi::nbnxm_entry_split(count, max_j as u32)[0]);
                assert!(got.iter().all(|e| e.sci == 3 && e.shift == 13 && e.j_end > e.j_start && (e.j_end - e.j_start) as usize <= max_j.max(1)));
                assert!(got.windows(2).all(|w| w[0].j_end == w[1].j_start));
                if count > 0 {
                    assert_eq!(got.len(), (count as usize).div_ceil(max_j.max(1)), "{count} {max_j}: one entry per max_j words");
                }
            }
        }
        // A count of exactly max_j is one entry, 2 max_j + 1 three.
        assert_eq!(abi::nbnxm_entry_split(32, 32), [1, 32]);
        assert_eq!(abi::nbnxm_entry_split(65, 32), [3, 22]);
        assert_eq!(abi::nbnxm_entry_split(0, 32)[0], 0);
        assert_eq!(abi::nbnxm_entry_split(u32::MAX, u32::MAX), [1, u32::MAX]);
    }

    #[test]
    fn totals_beyond_a_u32_are_refused() {
        let max = u64::from(u32::MAX);
        assert_eq!(LayoutTotals::from_sums([max, 3, 7, 1]).unwrap(), LayoutTotals { words: [max as usize, 3], entries: [7, 1] });
        for sums in [[max + 1, 0, 1, 0], [0, max + 1, 0, 1]] {
            let e = LayoutTotals::from_sums(sums).unwrap_err().to_string();
            assert!(e.contains("4294967296") && e.contains("u32"), "{e}");
        }
    }
}
