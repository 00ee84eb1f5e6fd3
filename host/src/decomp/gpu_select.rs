//! The home atoms' first-pulse selection on the GPU: for each decomposed dimension, the home atoms
//! that pulse 0 along it sends ([`super::redecompose_with`]'s step 2, `select_wrapped_into`, for
//! the atoms that crossed nothing), for one rank's home atoms held on the device, by the
//! `select_*` kernels (`kernels-gpu/src/kernels/select.rs`). Each atom's test is the host's exact
//! one (`sent` over `excess2` in `decomp/plan.rs`) in the same `f64` operations; the selected
//! atoms of each dimension are compacted in index order, and one wait reads the counts, then
//! exactly the selected indices, ids and wrapped positions come back. The indices also stay on
//! the device ([`GpuSelect::device_maps`]).
//!
//! Why the home atoms alone: pulse 0 along a dimension scans the home atoms (first, in their
//! order), then the atoms received along earlier dimensions. Home atoms crossed no periodic
//! boundary, so their test reads only their wrapped positions, and the home part of every
//! dimension's first map is known before any pulse: all of them in one pass over the home atoms.
//! The host keeps selecting the received atoms (few), and later pulses.
//!
//! This is the third block of the GPU redecomposition (docs/nbnxm.md, "Search step cost"), which
//! [`super::GpuHome`] runs for the MD step. `tests/gpu_select.rs` checks it against
//! [`select_reference`], which the unit tests tie to the maps of [`super::redecompose`].
//!
//! | item | what it is |
//! |---|---|
//! | [`GpuSelect`] | the device buffers of one rank's selection; [`GpuSelect::run`] enqueues and reads back |
//! | [`select_geometry`] | the kernels' [`SelectGeometry`] for a decomposition and a rank |
//! | [`select_reference`] | the same selection on the CPU, with the host's own functions |
//! | [`selected_in`] | the kernels' rule on a [`SelectGeometry`], on the CPU (for tests of the geometry) |

use super::PlanError;
use super::gpu_checks::{check_lengths, overlap};
use super::grid::Decomposition;
use super::plan::{excess2, pulse_bounds, send_range2};
use super::redecompose::Frame;
#[cfg(any(test, feature = "test-support"))]
use super::select::Ranges;
use super::select::select_wrapped_into;
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaStream, DeviceBuffer, DeviceMemory, KernelModule, LaunchShape, grown_capacity};
use cudarc::driver::CudaContext;
use kernels_gpu::abi::{self, Float3, SELECT_SLOTS, SelectGeometry, SelectedAtom};
use std::ops::Range;
use std::sync::Arc;

/// The kernels' geometry for `geo` and `rank`: the decomposed dimensions, and per decomposed
/// dimension `d` (slot `s`, in the order of [`super::RankGrid::decomposed_dims`]) the bounds
/// `pulse_bounds(geo, rank, d, e)` along every decomposed `e`, with `rc2 = send_range2(cutoff)`:
/// the numbers the host's selection compares with. A grid of one rank has no slot. Errors: a rank
/// outside the grid.
pub fn select_geometry(geo: &Decomposition, rank: usize) -> std::result::Result<SelectGeometry, PlanError> {
    let ranks = geo.grid.num_ranks();
    if rank >= ranks {
        return Err(PlanError::LocalRanks { ranks: vec![rank], reason: format!("the {} grid has ranks 0..{ranks}", geo.grid) });
    }
    let decomposed = geo.grid.decomposed_dims();
    let mut g = SelectGeometry { n_dims: decomposed.len() as u32, rc2: send_range2(geo.cutoff), ..SelectGeometry::default() };
    for (i, &e) in decomposed.iter().enumerate() {
        g.dims[i] = e as u32;
    }
    for (s, &d) in decomposed.iter().enumerate() {
        for (i, &e) in decomposed.iter().enumerate() {
            (g.lo[s][i], g.hi[s][i]) = pulse_bounds(geo, rank, d, e);
        }
    }
    Ok(g)
}

/// The slots that select an atom at wrapped position `w` by the kernels' rule on `g` (bit `s`:
/// slot `s`), on the CPU: for a test of [`select_geometry`] against the host's selection.
pub fn selected_in(g: &SelectGeometry, w: Float3) -> u32 {
    let c = [w.x, w.y, w.z];
    let n = (g.n_dims as usize).min(SELECT_SLOTS);
    (0..n)
        .filter(|&s| {
            let mut dist2 = 0.0;
            for e in 0..n {
                dist2 += excess2(f64::from(c[g.dims[e] as usize]), g.lo[s][e], g.hi[s][e]);
            }
            dist2 < g.rc2
        })
        .fold(0, |bits, s| bits | (1 << s))
}

/// One decomposed dimension's selection over the home atoms: what pulse 0 along it sends of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SelectedDim {
    /// The dimension (0 = x, 1 = y, 2 = z).
    pub dim: usize,
    /// The indices (into the home atoms) of the atoms sent, ascending.
    pub map: Vec<u32>,
    /// Their ids.
    pub ids: Vec<u32>,
    /// Their wrapped positions, as given.
    pub positions: Vec<Float3>,
}

/// The home part of every decomposed dimension's first pulse, in the order of the decomposed
/// dimensions (none for a grid of one rank).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selected {
    /// One per decomposed dimension.
    pub per_dim: Vec<SelectedDim>,
}

/// The selection on the CPU with the host's own functions: `select_wrapped_into` (what
/// [`super::redecompose_with`] runs, the exact `select_for_pulse_into` by bit ranges) over a frame
/// of the home atoms `x` (wrapped positions, crossed nowhere), indices from 0: what
/// [`GpuSelect::run`] must give bit for bit. Errors: `x` and `ids` of different lengths, a rank
/// outside the grid, more home atoms than a `u32` index holds.
pub fn select_reference(x: &[Float3], ids: &[u32], geo: &Decomposition, rank: usize) -> Result<Selected> {
    if x.len() != ids.len() {
        return Err(HaloError::InvalidInput(format!("GPU selection: {} positions and {} ids; give one of each per atom", x.len(), ids.len())));
    }
    if u32::try_from(x.len()).is_err() {
        return Err(PlanError::TooManyAtoms { atoms: x.len() }.into());
    }
    select_geometry(geo, rank)?;
    let decomposed = geo.grid.decomposed_dims();
    let crossed = vec![0u8; x.len()];
    let frame = Frame { wrapped: x, crossed: &crossed, edge: geo.box_size.map(f64::from) };
    let rc2 = send_range2(geo.cutoff);
    let per_dim = decomposed
        .iter()
        .map(|&d| {
            let mut map = Vec::new();
            select_wrapped_into(geo, &decomposed, rank, d, &frame, 0, rc2, &mut map);
            let ids = map.iter().map(|&i| ids[i as usize]).collect();
            let positions = map.iter().map(|&i| x[i as usize]).collect();
            SelectedDim { dim: d, map, ids, positions }
        })
        .collect();
    Ok(Selected { per_dim })
}

/// Coordinates worth testing a selection at, per dimension: for every decomposed dimension's
/// first pulse of `rank`, along every decomposed dimension, the wrapped coordinates where the
/// term of the host's test reaches `rc2` and where it leaves 0 (the bit ranges of
/// `decomp/select.rs`, found on the exact arithmetic), with the two floats either side of each;
/// and 0, the box's last float. Coordinates in `[0, box)`; empty along a dimension not decomposed.
#[cfg(any(test, feature = "test-support"))]
pub(crate) fn selection_edges(geo: &Decomposition, rank: usize) -> [Vec<f32>; 3] {
    let mut out: [Vec<f32>; 3] = Default::default();
    let Ok(g) = select_geometry(geo, rank) else { return out };
    let edge = geo.box_size.map(f64::from);
    let n = g.n_dims as usize;
    for s in 0..n {
        for i in 0..n {
            let e = g.dims[i] as usize;
            let r = Ranges::new(edge, [e], [g.lo[s][i]], [g.hi[s][i]], g.rc2);
            // Crossing 0: home atoms crossed nothing.
            for (start, width) in [r.near[0][0], r.inside[0][0]] {
                for b in [start, start.wrapping_add(width)] {
                    let near = (0..5u32).map(|k| f32::from_bits(b.wrapping_add(k).wrapping_sub(2)));
                    out[e].extend(near.filter(|c| (0.0..geo.box_size[e]).contains(c)));
                }
            }
        }
    }
    for &e in &geo.grid.decomposed_dims() {
        out[e].extend([0.0, geo.box_size[e].next_down()]);
        out[e].sort_by(f32::total_cmp);
        out[e].dedup_by(|a, b| a.to_bits() == b.to_bits());
    }
    out
}

/// An error naming the first input whose bytes `(address, length)` overlap one of the
/// selection's own outputs: other blocks write those while the passes read the inputs.
pub(super) fn check_disjoint(inputs: &[(&str, (u64, u64))], outputs: &[(&str, (u64, u64))]) -> Result<()> {
    for (input, range) in inputs {
        if let Some((out, _)) = outputs.iter().find(|(_, r)| overlap(*range, *r)) {
            return Err(HaloError::InvalidInput(format!(
                "GPU selection: `{input}` overlaps the selection's own `{out}`, which the run writes; give the home atoms arrays of their own"
            )));
        }
    }
    Ok(())
}

/// The launch shapes of the three passes for `n` atoms.
fn shapes(n: u32) -> [LaunchShape; 3] {
    let per_atom = LaunchShape { grid: (abi::select_blocks(n), 1), block: abi::SELECT_THREADS, shared_bytes: abi::SELECT_SHARED_BYTES };
    let scan = LaunchShape { grid: (1, 1), block: abi::SELECT_SCAN_THREADS, shared_bytes: abi::SELECT_SCAN_SHARED_BYTES };
    [per_atom, scan, per_atom]
}

/// One rank's first-pulse selection on the GPU: its geometry on the device and the passes'
/// scratch and outputs (the blocks' counts, the counts, every slot's indices and packed atoms),
/// kept and grown between calls.
pub struct GpuSelect {
    geometry: SelectGeometry,
    geometry_dev: DeviceBuffer<SelectGeometry>,
    block_counts: DeviceBuffer<u32>,
    info: DeviceBuffer<u32>,
    maps: DeviceBuffer<u32>,
    atoms: DeviceBuffer<SelectedAtom>,
    /// Where each slot's atoms sit in `maps` and `atoms` after the last run.
    slots: Vec<Range<usize>>,
}

impl GpuSelect {
    /// The selection of `rank`'s home atoms in `geo` on `ctx`'s GPU (the geometry uploaded once).
    pub fn new(ctx: &Arc<CudaContext>, geo: &Decomposition, rank: usize) -> Result<Self> {
        let geometry = select_geometry(geo, rank)?;
        let geometry_dev = DeviceBuffer::from_host(ctx, &[geometry])?;
        // A pageable upload may land after a kernel on another stream starts: wait for it once.
        ctx.synchronize().during("uploading the selection's geometry")?;
        Ok(Self {
            geometry,
            geometry_dev,
            block_counts: DeviceBuffer::uninit(ctx, SELECT_SLOTS)?,
            info: DeviceBuffer::uninit(ctx, abi::SELECT_INFO_WORDS)?,
            maps: DeviceBuffer::uninit(ctx, 0)?,
            atoms: DeviceBuffer::uninit(ctx, 0)?,
            slots: Vec::new(),
        })
    }

    /// The geometry the kernels read.
    pub fn geometry(&self) -> &SelectGeometry {
        &self.geometry
    }

    /// The selected indices of the last [`Self::run`] on the device: slot `s` (the `s`-th
    /// decomposed dimension) at [`Self::slot_range`]`(s)`, the slots one after another. Valid until
    /// the next run.
    pub fn device_maps(&self) -> &DeviceBuffer<u32> {
        &self.maps
    }

    /// Where slot `s`'s indices sit in [`Self::device_maps`] after the last run (empty before the
    /// first, and for a slot past the decomposed dimensions).
    pub fn slot_range(&self, s: usize) -> Range<usize> {
        self.slots.get(s).cloned().unwrap_or(0..0)
    }

    /// Selects among the `n` home atoms at `x` (wrapped positions) with ids `ids`, on `stream`:
    /// enqueues the three passes, waits once for them (the counts), then reads back exactly the
    /// selected indices and packed atoms (and waits for them). Errors: arrays shorter than `n`, an
    /// input overlapping the selection's own outputs, more atoms than the kernels index, or a
    /// CUDA failure.
    pub fn run(
        &mut self,
        module: &KernelModule,
        stream: &CudaStream,
        x: &dyn DeviceMemory<Float3>,
        ids: &dyn DeviceMemory<u32>,
        n: usize,
    ) -> Result<Selected> {
        self.enqueue(module, stream, x, ids, n)?;
        self.finish(stream, n)
    }

    /// Enqueues the passes (see [`Self::run`]) without waiting: for a caller that reads the
    /// selection back together with other arrays ([`Self::enqueue_read_selected`], one wait).
    pub fn enqueue(
        &mut self,
        module: &KernelModule,
        stream: &CudaStream,
        x: &dyn DeviceMemory<Float3>,
        ids: &dyn DeviceMemory<u32>,
        n: usize,
    ) -> Result<()> {
        self.slots.clear();
        check_lengths("GPU selection", n, &[("x", x.len()), ("ids", ids.len())])?;
        // Every slot's atoms share the outputs: `SELECT_SLOTS n` places must be `u32`s.
        let n32 = u32::try_from(n)
            .ok()
            .filter(|&m| m.checked_mul(SELECT_SLOTS as u32).is_some())
            .ok_or(HaloError::Plan(PlanError::TooManyAtoms { atoms: n }))?;
        let ctx = stream.context();
        ctx.bind_to_thread().during("binding the context")?;
        let blocks = abi::select_blocks(n32) as usize;
        let places = self.geometry.n_dims as usize * n;
        if let Some(cap) = grown_capacity(self.block_counts.len(), SELECT_SLOTS * blocks) {
            self.block_counts = DeviceBuffer::uninit(ctx, cap)?;
        }
        if let Some(cap) = grown_capacity(self.maps.len(), places) {
            self.maps = DeviceBuffer::uninit(ctx, cap)?;
        }
        if let Some(cap) = grown_capacity(self.atoms.len(), places) {
            self.atoms = DeviceBuffer::uninit(ctx, cap)?;
        }
        let inputs = [("x", (x.device_ptr(), (n * size_of::<Float3>()) as u64)), ("ids", (ids.device_ptr(), (n * 4) as u64))];
        let outputs = [
            ("maps", (self.maps.device_ptr(), (places * 4) as u64)),
            ("atoms", (self.atoms.device_ptr(), (places * size_of::<SelectedAtom>()) as u64)),
            ("block_counts", (self.block_counts.device_ptr(), (self.block_counts.len() * 4) as u64)),
            ("info", (self.info.device_ptr(), (abi::SELECT_INFO_WORDS * 4) as u64)),
        ];
        check_disjoint(&inputs, &outputs)?;
        // The counts are written by the scan: poisoned first, so that one not written is refused.
        self.info.fill_bytes_async(0xFF, stream)?;
        let [count, scan, scatter] = shapes(n32);
        let (mut xp, mut idp, mut geo) = (x.device_ptr(), ids.device_ptr(), self.geometry_dev.device_ptr());
        let (mut counts, mut info, mut nb, mut n) = (self.block_counts.device_ptr(), self.info.device_ptr(), blocks as u32, n32);
        let (mut map, mut atoms) = (self.maps.device_ptr(), self.atoms.device_ptr());
        // SAFETY: the arguments match the passes' parameters (abi::SELECT_*); `x` and `ids` hold
        // `n` atoms (checked) and overlap no output (checked), the counts `SELECT_SLOTS blocks`,
        // the maps and atoms `n_dims n` (every slot's at most `n`), the info its words; the buffers
        // outlive the launches (the caller's arrays by `run`'s wait, ours by `self`).
        unsafe {
            module.launch(abi::SELECT_COUNT, count, stream, &mut crate::kernel_args![xp, n, geo, counts])?;
            module.launch(abi::SELECT_SCAN, scan, stream, &mut crate::kernel_args![counts, nb, info])?;
            module.launch(abi::SELECT_SCATTER, scatter, stream, &mut crate::kernel_args![xp, idp, n, geo, counts, map, atoms])
        }
    }

    /// Waits for the passes and reads back the counts, then the used parts (see [`Self::run`]).
    fn finish(&mut self, stream: &CudaStream, n: usize) -> Result<Selected> {
        stream.context().bind_to_thread().during("binding the context")?;
        let mut info = [0u32; abi::SELECT_INFO_WORDS];
        // SAFETY: `info` lives until the wait, which follows whatever the enqueue gave.
        let enqueued = unsafe { self.info.enqueue_read(0, &mut info, stream) };
        let waited = stream.synchronize().during("waiting for the GPU selection");
        enqueued.and(waited)?;
        let counts = self.counts(&info, n)?;
        let total: usize = counts.iter().sum();
        let mut map = vec![0u32; total];
        let mut atoms = vec![SelectedAtom::default(); total];
        // SAFETY: `map` and `atoms` live until the wait, which follows whatever the enqueues gave.
        let enqueued = unsafe { self.maps.enqueue_read(0, &mut map, stream).and_then(|()| self.atoms.enqueue_read(0, &mut atoms, stream)) };
        let waited = stream.synchronize().during("reading the GPU selection back");
        enqueued.and(waited)?;
        let mut per_dim = Vec::with_capacity(counts.len());
        for (s, slot) in self.slots_of(&counts).into_iter().enumerate() {
            per_dim.push(SelectedDim {
                dim: self.geometry.dims[s] as usize,
                map: map[slot.clone()].to_vec(),
                ids: atoms[slot.clone()].iter().map(|a| a.id).collect(),
                positions: atoms[slot].iter().map(|a| a.x).collect(),
            });
        }
        Ok(Selected { per_dim })
    }

    /// Each slot's count from the counts' words `info` of a selection of `n` atoms; an error for
    /// a count the kernels cannot have made (or never wrote: they are poisoned first).
    fn counts(&self, info: &[u32], n: usize) -> Result<Vec<usize>> {
        let dims = self.geometry.n_dims as usize;
        let counts: Vec<usize> = info[..dims.min(info.len())].iter().map(|&c| c as usize).collect();
        match counts.iter().find(|&&c| c > n) {
            Some(c) => Err(HaloError::InvalidInput(format!("GPU selection of {n} atoms: the kernels counted {c} in one dimension"))),
            None => Ok(counts),
        }
    }

    /// Where each slot's indices sit for `counts` (one after another), recorded for
    /// [`Self::slot_range`].
    fn slots_of(&mut self, counts: &[usize]) -> Vec<Range<usize>> {
        self.slots.clear();
        let mut at = 0;
        for &c in counts {
            self.slots.push(at..at + c);
            at += c;
        }
        self.slots.clone()
    }

    /// Words of the counts, and the most selected atoms (indices and packed atoms) of all slots
    /// together that a selection of `n` atoms can give: the sizes [`Self::enqueue_read_selected`]
    /// takes at most.
    pub fn read_back_room(&self, n: usize) -> (usize, usize) {
        (abi::SELECT_INFO_WORDS, self.geometry.n_dims as usize * n)
    }

    /// Enqueues, after [`Self::enqueue`] on `stream`, the copies of the counts into `info` and of
    /// the first `maps.len()` selected atoms (every slot's, one after another) into `maps` (their
    /// indices) and `atoms` (packed: ids and wrapped positions). A room shorter than what the
    /// passes select is fine: once the stream is synchronised, [`Self::selected_from`] says so and
    /// [`Self::read_selected`] reads them all. Errors (nothing enqueued): `info` not of
    /// [`Self::read_back_room`]'s size, `maps` and `atoms` of different lengths or longer than its
    /// room.
    ///
    /// # Safety
    /// `info`, `maps` and `atoms` must stay alive and untouched until `stream` has been synchronised.
    pub unsafe fn enqueue_read_selected(
        &self,
        n: usize,
        info: &mut [u32],
        maps: &mut [u32],
        atoms: &mut [SelectedAtom],
        stream: &CudaStream,
    ) -> Result<()> {
        let (info_words, most) = self.read_back_room(n);
        if info.len() != info_words || maps.len() != atoms.len() || maps.len() > most {
            return Err(HaloError::InvalidInput(format!(
                "GPU selection of {n} atoms: read-back arrays of {} counts, {} indices and {} atoms for {info_words} counts and at most {most} atoms",
                info.len(),
                maps.len(),
                atoms.len()
            )));
        }
        // SAFETY: the caller's contract.
        unsafe {
            self.info.enqueue_read(0, info, stream)?;
            self.enqueue_read_atoms(maps, atoms, stream)
        }
    }

    /// Enqueues the copies of the first `maps.len()` selected atoms into `maps` (indices) and
    /// `atoms` (packed); `maps` and `atoms` of one length, at most the room's.
    ///
    /// # Safety
    /// As [`Self::enqueue_read_selected`].
    unsafe fn enqueue_read_atoms(&self, maps: &mut [u32], atoms: &mut [SelectedAtom], stream: &CudaStream) -> Result<()> {
        if maps.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe {
            self.maps.enqueue_read(0, maps, stream)?;
            self.atoms.enqueue_read(0, atoms, stream)
        }
    }

    /// Every decomposed dimension's selected home indices (in order) and their wrapped positions
    /// from what [`Self::enqueue_read_selected`] copied for `n` atoms, into `out` and `out_x` (one
    /// array per dimension, their allocations reused): `Ok(true)`; `Ok(false)`, `out` and `out_x`
    /// untouched, when the passes selected more atoms than `maps` holds (read them with
    /// [`Self::read_selected`] then).
    pub fn selected_from(
        &mut self,
        info: &[u32],
        (maps, atoms): (&[u32], &[SelectedAtom]),
        n: usize,
        out: &mut Vec<Vec<u32>>,
        out_x: &mut Vec<Vec<Float3>>,
    ) -> Result<bool> {
        let counts = self.counts(info, n)?;
        let slots = self.slots_of(&counts);
        if slots.last().is_some_and(|s| s.end > maps.len().min(atoms.len())) {
            return Ok(false);
        }
        out.resize_with(slots.len(), Vec::new);
        out_x.resize_with(slots.len(), Vec::new);
        for ((o, x), slot) in out.iter_mut().zip(out_x.iter_mut()).zip(slots) {
            o.clear();
            o.extend_from_slice(&maps[slot.clone()]);
            x.clear();
            x.extend(atoms[slot].iter().map(|a| a.x));
        }
        Ok(true)
    }

    /// The selected atoms of the last run (counts `info`, for `n` atoms), all of them, read back
    /// on `stream` and waited for: the second read of a room [`Self::selected_from`] found too
    /// short. Into `out` and `out_x` as there.
    pub fn read_selected(
        &mut self,
        info: &[u32],
        n: usize,
        stream: &CudaStream,
        out: &mut Vec<Vec<u32>>,
        out_x: &mut Vec<Vec<Float3>>,
    ) -> Result<()> {
        let total: usize = self.counts(info, n)?.iter().sum();
        let (mut maps, mut atoms) = (vec![0u32; total], vec![SelectedAtom::default(); total]);
        // The counts are `info` already: only the atoms are read again (each count is at most
        // `n`, so they fit the room).
        // SAFETY: the arrays live until the wait below, which follows whatever was enqueued.
        let enqueued = unsafe { self.enqueue_read_atoms(&mut maps, &mut atoms, stream) };
        let waited = stream.synchronize().during("reading the GPU selection back");
        enqueued.and(waited)?;
        if !self.selected_from(info, (&maps, &atoms), n, out, out_x)? {
            return Err(HaloError::InvalidInput(format!("GPU selection of {n} atoms: {total} selected atoms read back do not hold the selection")));
        }
        Ok(())
    }
}
