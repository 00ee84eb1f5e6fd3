//! A rank's home atoms redecomposed on its GPU: the [`HomeDevice`] of
//! [`super::redecompose_on_devices`] made of [`GpuMigrate`], [`GpuMerge`] and [`GpuSelect`].
//!
//! Per search, on the rank's stream: the last plan's home ids are staged up (4 bytes an atom);
//! the migration wraps the home atoms, finds their owners and keeps the stayers on the device
//! (one wait, the leavers come back). A caller that knows the search is next may enqueue the
//! migration before it waits for the steps before it ([`GpuRank::begin_ahead`]): the passes then
//! run right behind the last step, while the host still waits for it. After the migration's
//! collective the arrivals are merged into the stayers by id and every decomposed dimension's
//! first pulse is selected over the new home atoms (one wait for the counts, the selections come
//! back); then the new home atoms' ids are read back (4 bytes an atom, and their wrapped positions
//! only where the caller asks for them: a GPU grid copies them on the device), with the selected
//! atoms packed (indices, ids and positions: what the first pulses send), their extent and their
//! ids' home check facts, both made on the GPU after the merge ([`super::GpuExtent`],
//! [`super::GpuIdFacts`]). The velocities, and the positions not asked for, stay on the device
//! ([`GpuHome::velocities`], [`GpuHome::positions`]), merged in the new order.
//!
//! | item | what it is |
//! |---|---|
//! | [`GpuHome`] | one rank's passes and device arrays, kept between searches |
//! | [`GpuRank`] | a [`GpuHome`] with its rank's inputs for one search: the [`HomeDevice`] |

use super::grid::{Decomposition, RankGrid};
use super::{GpuExtent, GpuIdFacts, GpuMerge, GpuMigrate, GpuSelect, HomeDevice, MergeArrays, MergedHome, MigrateArrays, fold_extent, fold_id_facts};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaStream, DeviceBuffer, DeviceMemory, KernelModule, Staging, grown_capacity};
use cudarc::driver::{CudaContext, PinnedHostSlice};
use kernels_gpu::abi::{EXTENT_PARTS, ExtentPart, Float3, ID_FACTS_PARTS, IdFactsPart, MigrateLeaver, SelectedAtom};
use std::sync::Arc;
use std::time::Duration;

/// The geometry a [`GpuHome`]'s passes were made for.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Made {
    grid: RankGrid,
    box_size: [f32; 3],
    cutoff: f32,
}

impl Made {
    /// The geometry of `geo`.
    fn of(geo: &Decomposition) -> Self {
        Self { grid: geo.grid, box_size: geo.box_size, cutoff: geo.cutoff }
    }
}

/// What a migration begun ahead of its search ([`GpuRank::begin_ahead`]) was enqueued for: the
/// geometry, the home atoms' coordinates and velocities (device addresses), their ids (the host
/// array's address and length) and the stream. The search's own begin finds it begun only when
/// all of these are the same.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ahead {
    made: Made,
    x: u64,
    v: u64,
    ids: (usize, usize),
    stream: usize,
}

/// The passes of one geometry.
struct Passes {
    made: Made,
    migrate: GpuMigrate,
    select: GpuSelect,
}

/// One rank's home atoms on its GPU between searches: the passes (made for the decomposition of
/// the first search, again when it changes) and their device arrays (grown, never shrunk).
pub struct GpuHome {
    rank: usize,
    ctx: Arc<CudaContext>,
    passes: Option<Passes>,
    merge: GpuMerge,
    /// The last plan's home ids, staged up at each search.
    ids: DeviceBuffer<u32>,
    ids_staging: Staging<u32>,
    /// The stayers (the migration's outputs, the merge's inputs).
    stay_ids: DeviceBuffer<u32>,
    stay_x: DeviceBuffer<Float3>,
    stay_v: DeviceBuffer<Float3>,
    /// The new home atoms (the merge's outputs).
    new_ids: DeviceBuffer<u32>,
    new_x: DeviceBuffer<Float3>,
    new_v: DeviceBuffer<Float3>,
    /// The new home atoms' extent, made on the GPU after the merge.
    extent: GpuExtent,
    /// The home check's facts of the new home ids, made on the GPU after the merge.
    id_facts: GpuIdFacts,
    /// Page-locked room for what comes back after the merge, in one wait: the facts' parts, the
    /// extent's parts, the new home atoms' ids (and positions where asked for), the selection's
    /// counts and its selected atoms (indices and packed atoms) (`u32` words).
    host: Option<PinnedHostSlice<u32>>,
    /// Atoms the last merge's first pulses selected (all dimensions), which sizes the next
    /// read-back's room.
    last_selected: Option<usize>,
    /// Stayers of the last migration.
    stayers: usize,
    /// New home atoms of the last merge.
    home: usize,
    /// A migration enqueued ahead of its search and not yet taken up by it.
    ahead: Option<Ahead>,
    /// Searches whose migration was taken up from one begun ahead.
    ahead_taken: u64,
}

impl GpuHome {
    /// Rank `rank`'s home atoms on `ctx`'s GPU (the passes are made at the first search).
    pub fn new(ctx: &Arc<CudaContext>, rank: usize) -> Result<Self> {
        let f3 = || DeviceBuffer::<Float3>::uninit(ctx, 0);
        let u = || DeviceBuffer::<u32>::uninit(ctx, 0);
        Ok(Self {
            rank,
            ctx: ctx.clone(),
            passes: None,
            merge: GpuMerge::new(ctx, rank)?,
            ids: u()?,
            ids_staging: Staging::new(),
            stay_ids: u()?,
            stay_x: f3()?,
            stay_v: f3()?,
            new_ids: u()?,
            new_x: f3()?,
            new_v: f3()?,
            extent: GpuExtent::new(ctx)?,
            id_facts: GpuIdFacts::new(ctx)?,
            host: None,
            last_selected: None,
            stayers: 0,
            home: 0,
            ahead: None,
            ahead_taken: 0,
        })
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The new home atoms' velocities after the last redecomposition (`0..`[`Self::home_atoms`]),
    /// in the order of its plan's home atoms; valid until the next one.
    pub fn velocities(&self) -> &DeviceBuffer<Float3> {
        &self.new_v
    }

    /// The new home atoms' wrapped positions after the last redecomposition
    /// (`0..`[`Self::home_atoms`]), in the order of its plan's home atoms: bit for bit what it read
    /// back (`MergedHome::wrapped`), and so the plan's home local positions; valid until the next
    /// one.
    pub fn positions(&self) -> &DeviceBuffer<Float3> {
        &self.new_x
    }

    /// The new home atoms' global ids after the last redecomposition
    /// (`0..`[`Self::home_atoms`]), ascending: bit for bit what it read back, and so its plan's
    /// home ids; valid until the next one.
    pub fn home_ids(&self) -> &DeviceBuffer<u32> {
        &self.new_ids
    }

    /// Home atoms after the last redecomposition.
    pub fn home_atoms(&self) -> usize {
        self.home
    }

    /// This rank's inputs for one search: its home atoms' positions `x` as the steps leave them
    /// and velocities `v` (device, at least `ids.len()` each), their global ids `ids` (the last
    /// plan's home ids, host), and the module and stream of its GPU to run on.
    pub fn with<'a>(
        &'a mut self,
        module: &'a KernelModule,
        stream: &'a CudaStream,
        x: &'a (dyn DeviceMemory<Float3> + Sync),
        v: &'a (dyn DeviceMemory<Float3> + Sync),
        ids: &'a [u32],
    ) -> GpuRank<'a> {
        GpuRank { home: self, module, stream, x, v, ids, begun: false, merging: None }
    }

    /// How many searches took their migration up from one begun ahead ([`GpuRank::begin_ahead`])
    /// instead of enqueueing it themselves.
    pub fn ahead_taken(&self) -> u64 {
        self.ahead_taken
    }

    /// Forgets a migration begun ahead ([`GpuRank::begin_ahead`]) that no search took up: the
    /// next search's migration is enqueued again. Its passes stay enqueued on their stream and
    /// write this home's arrays: a next search on the same stream runs after them (as the MD
    /// step's do, on each rank's local stream); one on another stream must synchronise theirs
    /// first.
    pub fn discard_ahead(&mut self) {
        self.ahead = None;
    }

    /// Sizes the next merge's read-back room of selected atoms as if the last merge had selected
    /// `selected` (a quarter more and 256; a selection that outgrows it is read again after the
    /// wait): for tests of that second read.
    #[cfg(any(test, feature = "test-support"))]
    pub fn set_selected_room_hint(&mut self, selected: usize) {
        self.last_selected = Some(selected);
    }

    /// Makes the passes for `geo` when there are none or they were made for another geometry.
    fn make_passes(&mut self, geo: &Decomposition) -> Result<()> {
        let made = Made::of(geo);
        if self.passes.as_ref().is_none_or(|p| p.made != made) {
            self.passes = None;
            let (migrate, select) = (GpuMigrate::new(&self.ctx, geo, self.rank)?, GpuSelect::new(&self.ctx, geo, self.rank)?);
            self.passes = Some(Passes { made, migrate, select });
        }
        Ok(())
    }
}

/// A [`GpuHome`] with its rank's inputs of one search ([`GpuHome::with`]).
pub struct GpuRank<'a> {
    home: &'a mut GpuHome,
    module: &'a KernelModule,
    stream: &'a CudaStream,
    x: &'a (dyn DeviceMemory<Float3> + Sync),
    v: &'a (dyn DeviceMemory<Float3> + Sync),
    ids: &'a [u32],
    /// The migration's passes are enqueued ([`HomeDevice::begin_migrate`]) and not yet finished.
    begun: bool,
    /// The merge, the selection and their read-backs are enqueued
    /// ([`HomeDevice::begin_merge_and_select`]) and not yet waited for.
    merging: Option<Merging>,
}

/// What a begun merge reads back into the page-locked room: `n` new home atoms' ids (and their
/// positions where `positions`), then the selection's info words and the first `room` selected
/// atoms (indices and packed atoms).
#[derive(Clone, Copy)]
struct Merging {
    n: usize,
    positions: bool,
    info_words: usize,
    room: usize,
}

/// The room of one begun merge, split by [`Merging::split`].
struct Room<'w> {
    /// The home id facts' parts.
    facts: &'w mut [IdFactsPart],
    /// The extent's parts.
    extent: &'w mut [ExtentPart],
    /// The new home atoms' ids.
    ids: &'w mut [u32],
    /// Their positions (empty unless asked for).
    x: &'w mut [Float3],
    /// The selection's counts.
    info: &'w mut [u32],
    /// The selected atoms' indices (the room's first ones).
    maps: &'w mut [u32],
    /// The selected atoms, packed (ids and wrapped positions).
    atoms: &'w mut [SelectedAtom],
}

impl Merging {
    /// Words of the home id facts' parts (first in the room: the page-locked room's start is
    /// aligned for their 64-bit sums, and they are a whole number of those).
    const FACTS_WORDS: usize = ID_FACTS_PARTS * size_of::<IdFactsPart>() / 4;
    /// Words of the extent's parts.
    const EXTENT_WORDS: usize = EXTENT_PARTS * size_of::<ExtentPart>() / 4;

    /// Words of one packed selected atom.
    const ATOM_WORDS: usize = size_of::<SelectedAtom>() / 4;

    /// The room's words this merge uses.
    fn words(&self) -> usize {
        let x = if self.positions { 3 * self.n } else { 0 };
        Self::FACTS_WORDS + Self::EXTENT_WORDS + self.n + x + self.info_words + (1 + Self::ATOM_WORDS) * self.room
    }

    /// The room's first [`Self::words`] split into the facts' parts, the extent's parts, the ids,
    /// the positions (none unless asked for), the selection's info, its indices and its packed
    /// atoms.
    fn split<'w>(&self, room: &'w mut [u32]) -> Result<Room<'w>> {
        let (facts, rest) = room[..self.words()].split_at_mut(Self::FACTS_WORDS);
        let (extent, rest) = rest.split_at_mut(Self::EXTENT_WORDS);
        let (ids, rest) = rest.split_at_mut(self.n);
        let (x, rest) = rest.split_at_mut(if self.positions { 3 * self.n } else { 0 });
        let (info, rest) = rest.split_at_mut(self.info_words);
        let (maps, atoms) = rest.split_at_mut(self.room);
        // Page-locked memory starts on a page: the facts' 64-bit sums are aligned (refused, not
        // a panic, should an allocation ever give less).
        let facts = bytemuck::try_cast_slice_mut(facts)
            .map_err(|e| HaloError::InvalidInput(format!("the GPU redecomposition's read-back room is not aligned for the id facts: {e}")))?;
        Ok(Room {
            facts,
            extent: bytemuck::cast_slice_mut(extent),
            ids,
            x: bytemuck::cast_slice_mut(x),
            info,
            maps,
            atoms: bytemuck::cast_slice_mut(atoms),
        })
    }
}

/// `buf` grown to hold `n` (its contents are then lost).
fn fit<T: bytemuck::Pod>(ctx: &Arc<CudaContext>, buf: &mut DeviceBuffer<T>, n: usize) -> Result<()> {
    if let Some(cap) = grown_capacity(buf.len(), n) {
        *buf = DeviceBuffer::uninit(ctx, cap)?;
    }
    Ok(())
}

/// The longest a [`GpuRank`] dropped with work still enqueued waits for its stream (its passes
/// take far less; a GPU stuck longer is left to the caller's later frees, which wait anyway).
const DROP_WAIT: Duration = Duration::from_secs(5);

impl Drop for GpuRank<'_> {
    /// A search that failed between a begin and its finish (another device's error, a collective's)
    /// leaves this rank's passes and read-backs enqueued: they read the caller's `x` and `v` and
    /// write this home's arrays and read-back room. Wait for them here, bounded, so that neither a
    /// caller that frees its buffers next nor a next search on another stream races them.
    fn drop(&mut self) {
        if (self.begun || self.merging.is_some()) && !crate::gpu::stuck::context_stuck(self.stream.context()) {
            let stream = self.stream;
            let _ = crate::gpu::wait::poll_until_done(|| crate::gpu::wait::stream_idle(stream), || None, DROP_WAIT, None);
        }
    }
}

impl GpuRank<'_> {
    /// Phase 1 enqueued ahead of its search: [`HomeDevice::begin_migrate`] now, for a caller
    /// that has enqueued the last steps before the search on this stream and has not waited for
    /// them. The passes run right behind those steps, while the host waits for them; the search's
    /// own [`HomeDevice::begin_migrate`] (on a [`GpuRank`] of the same home, geometry, inputs and
    /// stream) then enqueues nothing again, and its [`HomeDevice::migrate`] only waits.
    ///
    /// The enqueued passes read `x`, `v` and the staged ids after the steps before them: the caller
    /// keeps `x` and `v` alive and unchanged, and the ids array as it is, until the search (or a
    /// synchronisation of the stream). A search that does not come ([`GpuHome::discard_ahead`])
    /// costs the passes' GPU time only.
    pub fn begin_ahead(mut self, geo: &Decomposition) -> Result<()> {
        self.begin_migrate(geo)?;
        self.home.ahead = Some(self.ahead_key(geo));
        // The passes stay enqueued on purpose: the search takes them up, so the drop must not
        // wait for them.
        self.begun = false;
        Ok(())
    }

    /// What this rank's migration for `geo` is enqueued for.
    fn ahead_key(&self, geo: &Decomposition) -> Ahead {
        Ahead {
            made: Made::of(geo),
            x: self.x.device_ptr(),
            v: self.v.device_ptr(),
            ids: (self.ids.as_ptr() as usize, self.ids.len()),
            stream: self.stream.cu_stream() as usize,
        }
    }
}

impl HomeDevice for GpuRank<'_> {
    fn rank(&self) -> usize {
        self.home.rank
    }

    fn begin_migrate(&mut self, geo: &Decomposition) -> Result<()> {
        if let Some(ahead) = self.home.ahead.take() {
            if ahead == self.ahead_key(geo) {
                // Enqueued ahead for these very inputs: only its wait is left.
                self.begun = true;
                self.home.ahead_taken += 1;
                return Ok(());
            }
            // Begun for other inputs, perhaps on another stream: let it finish before its arrays
            // are refilled or regrown.
            self.stream.context().synchronize().during("waiting for a migration begun ahead for other inputs")?;
        }
        let n = self.ids.len();
        self.home.make_passes(geo)?;
        let h = &mut *self.home;
        let ctx = self.stream.context();
        ctx.bind_to_thread().during("binding the context")?;
        fit(ctx, &mut h.ids, n)?;
        fit(ctx, &mut h.stay_ids, n)?;
        fit(ctx, &mut h.stay_x, n)?;
        fit(ctx, &mut h.stay_v, n)?;
        // From the first enqueue on, a failure leaves work on the stream for the drop to wait for.
        self.begun = true;
        h.ids_staging.upload(self.ids, &h.ids, self.stream)?;
        let a = MigrateArrays { x: self.x, v: self.v, ids: &h.ids, x_out: &h.stay_x, v_out: &h.stay_v, ids_out: &h.stay_ids };
        let p = h.passes.as_mut().ok_or_else(|| HaloError::InvalidInput("the GPU redecomposition's passes were not made".into()))?;
        p.migrate.enqueue(self.module, self.stream, &a, n)?;
        Ok(())
    }

    fn migrate(&mut self, geo: &Decomposition) -> Result<(usize, Vec<MigrateLeaver>)> {
        // Each phase may run on another of the process's search threads.
        self.stream.context().bind_to_thread().during("binding the context")?;
        if !self.begun {
            self.begin_migrate(geo)?;
        }
        let n = self.ids.len();
        let h = &mut *self.home;
        let a = MigrateArrays { x: self.x, v: self.v, ids: &h.ids, x_out: &h.stay_x, v_out: &h.stay_v, ids_out: &h.stay_ids };
        let p = h.passes.as_mut().ok_or_else(|| HaloError::InvalidInput("the GPU redecomposition's passes were not made".into()))?;
        let migrated = tracing::debug_span!("search.migrate.wait").in_scope(|| p.migrate.finish(self.stream, &a, n))?;
        h.stayers = migrated.stayers;
        // Waited for by the finish: nothing is left for the drop to wait for.
        self.begun = false;
        Ok((n, migrated.leavers))
    }

    fn begin_merge_and_select(&mut self, geo: &Decomposition, arrivals: &[(u32, Float3, Float3)], positions: bool) -> Result<()> {
        let rank = self.home.rank as u32;
        let arrivals: Vec<MigrateLeaver> = arrivals.iter().map(|&(id, x, v)| MigrateLeaver { id, x, v, owner: rank }).collect();
        let h = &mut *self.home;
        let ctx = self.stream.context();
        ctx.bind_to_thread().during("binding the context")?;
        let total = h.stayers + arrivals.len();
        fit(ctx, &mut h.new_ids, total)?;
        fit(ctx, &mut h.new_x, total)?;
        fit(ctx, &mut h.new_v, total)?;
        let a = MergeArrays { ids: &h.stay_ids, x: &h.stay_x, v: &h.stay_v, ids_out: &h.new_ids, x_out: &h.new_x, v_out: &h.new_v };
        // The arrivals go up through the merge's own page-locked staging: nothing here is read
        // after this returns.
        let n = h.merge.enqueue(self.module, self.stream, &a, h.stayers, &arrivals)?;
        let made = Made::of(geo);
        let p = h
            .passes
            .as_mut()
            .filter(|p| p.made == made)
            .ok_or_else(|| HaloError::InvalidInput(format!("rank {}: a GPU merge for another decomposition than its migration's", h.rank)))?;
        p.select.enqueue(self.module, self.stream, &h.new_x, &h.new_ids, n)?;
        h.extent.enqueue(self.module, self.stream, &h.new_x, n)?;
        h.id_facts.enqueue(self.module, self.stream, &h.new_ids, n)?;
        // Everything that comes back, in one wait (in `merge_and_select`): the facts' and the
        // extent's parts, ids, positions where asked for, the selection's counts and its selected
        // atoms (indices and packed atoms: what the pulses send), into this rank's page-locked
        // room, which outlives the copies. The selected atoms' room is the last search's count
        // with a quarter more (every slot's whole room at the first search, or when that is
        // smaller); a selection that outgrows it is read again after the wait.
        let (info_words, most) = p.select.read_back_room(n);
        let room = h.last_selected.map_or(most, |c| most.min(c + c / 4 + 256));
        let merging = Merging { n, positions, info_words, room };
        let need = merging.words();
        if h.host.as_ref().is_none_or(|m| m.len() < need) {
            let cap = grown_capacity(0, need).unwrap_or(need);
            // SAFETY: the contents are written by the copies below before they are read (after
            // the stream's synchronisation).
            h.host = Some(unsafe { ctx.alloc_pinned_with_flags::<u32>(cap, 0) }.during("allocating the GPU redecomposition's read-back")?);
        }
        let host = h.host.as_mut().ok_or_else(|| HaloError::InvalidInput("no read-back room".into()))?;
        let room = merging.split(host.as_mut_slice().during("reaching the GPU redecomposition's read-back")?)?;
        // SAFETY: the room is `h`'s and is neither read nor freed nor replaced before the stream
        // is synchronised: in `merge_and_select`, or, for a merge a failed search left unfinished,
        // by the next search's migration on the same stream, which waits before any begin here
        // can replace the room.
        let enqueued = unsafe {
            h.id_facts
                .enqueue_read(room.facts, self.stream)
                .and_then(|()| h.extent.enqueue_read(room.extent, self.stream))
                .and_then(|()| h.new_ids.enqueue_read(0, room.ids, self.stream))
                .and_then(|()| if positions { h.new_x.enqueue_read(0, room.x, self.stream) } else { Ok(()) })
                .and_then(|()| p.select.enqueue_read_selected(n, room.info, room.maps, room.atoms, self.stream))
        };
        if let Err(e) = enqueued {
            // The copies that were enqueued land in the room before anything can replace it.
            let _ = self.stream.synchronize();
            return Err(e);
        }
        self.merging = Some(merging);
        Ok(())
    }

    fn merge_and_select(
        &mut self,
        geo: &Decomposition,
        arrivals: &[(u32, Float3, Float3)],
        positions: bool,
        mut into: MergedHome,
    ) -> Result<MergedHome> {
        self.stream.context().bind_to_thread().during("binding the context")?;
        if self.merging.is_some_and(|m| m.positions != positions) {
            // Begun for a read-back of another shape: its copies land before the room may be
            // replaced, then it is begun again.
            self.stream.synchronize().during("waiting for a GPU merge begun for another read-back")?;
            self.merging = None;
        }
        if self.merging.is_none() {
            self.begin_merge_and_select(geo, arrivals, positions)?;
        }
        let merging = self.merging.take().ok_or_else(|| HaloError::InvalidInput("the GPU merge was not begun".into()))?;
        tracing::debug_span!("search.merge.wait").in_scope(|| self.stream.synchronize()).during("waiting for the GPU redecomposition")?;
        let _span = tracing::debug_span!("search.merge.host").entered();
        let h = &mut *self.home;
        h.merge.check()?;
        let n = merging.n;
        h.home = n;
        let p = h.passes.as_mut().ok_or_else(|| HaloError::InvalidInput("the GPU redecomposition's passes were not made".into()))?;
        let host = h.host.as_mut().ok_or_else(|| HaloError::InvalidInput("no read-back room".into()))?;
        let room = merging.split(host.as_mut_slice().during("reaching the GPU redecomposition's read-back")?)?;
        into.ids.clear();
        into.ids.extend_from_slice(room.ids);
        into.wrapped.clear();
        into.wrapped.extend_from_slice(room.x);
        // The home atoms' extent, made on the GPU, for the pair search's zone checks, and their
        // ids' facts for the home check.
        into.home_scan = Some(fold_extent(room.extent, [0.0; 3], geo.box_size));
        into.id_facts = Some(fold_id_facts(room.facts, n));
        if !p.select.selected_from(room.info, (room.maps, room.atoms), n, &mut into.first_pulse, &mut into.first_pulse_x)? {
            // More selected than the room held: all of them again (the stream is idle).
            let _span = tracing::debug_span!("search.merge.reread").entered();
            p.select.read_selected(room.info, n, self.stream, &mut into.first_pulse, &mut into.first_pulse_x)?;
        }
        h.last_selected = Some(into.first_pulse.iter().map(Vec::len).sum());
        Ok(into)
    }

    fn read_home_positions(&mut self, into: &mut Vec<Float3>) -> Result<()> {
        let h = &*self.home;
        self.stream.context().bind_to_thread().during("binding the context")?;
        into.clear();
        into.resize(h.home, Float3::default());
        // SAFETY: `into` lives until the wait below, which follows the copy.
        let enqueued = unsafe { h.new_x.enqueue_read(0, into, self.stream) };
        let waited = self.stream.synchronize().during("reading the home atoms' positions back");
        enqueued.and(waited)
    }
}
