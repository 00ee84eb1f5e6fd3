//! Building the halo plan: home atoms per rank, then every pulse of every decomposed dimension,
//! simulated on all ranks in lockstep exactly as the exchange will run it.

use super::grid::{Decomposition, wrap_position};
use super::{PlanError, RankGrid};
use crate::desc::{PulseSpec, RankHalo};
use crate::system::MolecularSystem;
use crate::workers::Workers;
use kernels_gpu::abi::Float3;
use serde::{Deserialize, Serialize};

/// Relative slack on the squared cutoff when selecting atoms to send. It only ever adds atoms a
/// hair beyond the cutoff, so that rounding in the plan's arithmetic can never drop an atom that
/// the pair search (which uses differently ordered arithmetic) finds inside it.
pub const SEND_MARGIN: f64 = 1e-6;

/// The whole halo plan: one [`RankPlan`] per rank, all with the same pulses in the same order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HaloPlan {
    /// The rank grid.
    pub grid: RankGrid,
    /// Box edges (nm).
    pub box_size: [f32; 3],
    /// Interaction cutoff the halo covers (nm).
    pub cutoff: f32,
    /// Per-rank plans, indexed by rank.
    pub ranks: Vec<RankPlan>,
}

/// One rank's local atom layout and pulses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankPlan {
    /// This rank.
    pub rank: usize,
    /// Atoms whose wrapped position lies in this rank's cell; they come first locally, sorted by
    /// global id. Also the dependency offset: map entries at or above it were received earlier.
    pub home_atoms: usize,
    /// Home atoms plus every atom received in any pulse.
    pub total_atoms: usize,
    /// Global atom id of each local atom (`total_atoms` entries); none (empty) for a rank that
    /// another process drives in a plan from a redecomposition ([`super::Redecomposed::plan`]),
    /// where no process receives another's ids.
    pub global_ids: Vec<u32>,
    /// Pulses flattened dim-major (x pulses, then y, then z).
    pub pulses: Vec<PulsePlan>,
}

/// One pulse on one rank: where it sits in the decomposition, and what the exchange moves.
///
/// In `spec`, coordinates go to `send_rank` (one step down along `dim`) and come from `recv_rank`
/// (one step up); forces travel the other way; `index_map` is ascending; `shift` is the box row
/// along `dim` when this rank is first along `dim` (its atoms cross the periodic boundary on the
/// way down), else `None`; received forces are always accumulated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PulsePlan {
    /// Dimension (0 = x, 1 = y, 2 = z).
    pub dim: usize,
    /// Index of this pulse within its dimension.
    pub pulse_in_dim: usize,
    /// The pulse as the exchange consumes it.
    #[serde(flatten)]
    pub spec: PulseSpec,
}

impl PulsePlan {
    /// Atoms sent (coordinates) and received back (forces).
    pub fn send_size(&self) -> usize {
        self.spec.index_map.len()
    }

    /// The periodic shift along `dim` (zero when the pulse does not cross the boundary).
    pub fn shift_along_dim(&self) -> f32 {
        self.spec.shift.map_or(0.0, |s| [s.x, s.y, s.z][self.dim])
    }
}

/// Every rank's local atoms while the plan is built: global ids, and positions in the rank's
/// frame (wrapped, plus the box edge along a dimension where the atom came around the periodic
/// boundary), in `f64`. Ids and positions apart, so that the selection reads only positions and
/// the plan's ids are one copy.
#[derive(Debug, Default)]
struct RankAtoms {
    ids: Vec<u32>,
    pos: Vec<[f64; 3]>,
}

impl RankAtoms {
    fn clear(&mut self) {
        self.ids.clear();
        self.pos.clear();
    }

    fn len(&self) -> usize {
        self.ids.len()
    }
}

/// Working arrays of a plan build, kept by a caller that plans again and again so that their
/// allocations are reused (the plan does not depend on them).
#[derive(Debug, Default)]
pub struct PlanScratch {
    /// Owner rank of every atom.
    owner: Vec<u32>,
    /// Every rank's local atoms while the plan is built.
    local: Vec<RankAtoms>,
    /// What each rank receives in the current pulse.
    received: Vec<RankAtoms>,
}

/// The position of an atom in `f64`, wrapped into the box.
#[inline]
fn wrapped(p: Float3, box_size: [f32; 3]) -> [f64; 3] {
    let w = wrap_position(p, box_size);
    [f64::from(w.x), f64::from(w.y), f64::from(w.z)]
}

/// The wrapped position of atom `atom` at `p` and the rank owning it: the cell of the wrapped
/// position (only decomposed dimensions have a cell index other than 0). Errors on a non-finite
/// coordinate, naming the atom. The one owner rule of every builder of a plan.
#[inline]
pub(super) fn home_of(p: Float3, geo: &Decomposition, atom: usize) -> Result<(Float3, usize), PlanError> {
    if !(p.x.is_finite() && p.y.is_finite() && p.z.is_finite()) {
        return Err(PlanError::NonFinitePosition { atom, position: [p.x, p.y, p.z] });
    }
    let w = wrap_position(p, geo.box_size);
    let x = [f64::from(w.x), f64::from(w.y), f64::from(w.z)];
    let dims = geo.grid.dims;
    // `rank_of(cell)` as a sum of strides; a dimension of one rank adds nothing.
    let stride = [1, dims[0], dims[0] * dims[1]];
    let mut rank = 0;
    for d in 0..3 {
        if dims[d] > 1 {
            rank += stride[d] * geo.cell_index(d, x[d]);
        }
    }
    Ok((w, rank))
}

/// [`home_of`] without a division per atom: for each decomposed dimension the smallest
/// coordinate of every cell but the first ([`Decomposition::cell_index`] is monotone in the
/// coordinate, so a wrapped coordinate's cell is the number of these edges at or below it). The
/// same answer as [`home_of`] for every position, bit for bit (a wrapped coordinate is an `f32`,
/// and each edge is found among the `f32`s by bisection on `cell_index` itself).
#[derive(Debug)]
pub(super) struct CellEdges {
    box_size: [f32; 3],
    /// Per decomposed dimension: its rank stride and its cells' lower edges from the second on.
    dims: Vec<(usize, usize, Vec<f32>)>,
}

impl CellEdges {
    pub(super) fn new(geo: &Decomposition) -> Self {
        let n = geo.grid.dims;
        let stride = [1, n[0], n[0] * n[1]];
        let dims = (0..3).filter(|&d| n[d] > 1).map(|d| (d, stride[d], (1..n[d]).map(|i| geo.cell_threshold(d, i)).collect())).collect();
        Self { box_size: geo.box_size, dims }
    }

    /// [`home_of`]`(p, geo, atom)`.
    #[cfg(test)]
    #[inline]
    pub(super) fn home_of(&self, p: Float3, atom: usize) -> Result<(Float3, usize), PlanError> {
        if !(p.x.is_finite() && p.y.is_finite() && p.z.is_finite()) {
            return Err(PlanError::NonFinitePosition { atom, position: [p.x, p.y, p.z] });
        }
        let w = wrap_position(p, self.box_size);
        Ok((w, self.rank_of(w)))
    }

    /// The rank owning the wrapped position `w` (of [`wrap_position`]).
    #[inline]
    pub(super) fn rank_of(&self, w: Float3) -> usize {
        let x = [w.x, w.y, w.z];
        let mut rank = 0;
        for (d, stride, edges) in &self.dims {
            rank += stride * edges.iter().filter(|&&e| x[*d] >= e).count();
        }
        rank
    }

    pub(super) fn box_size(&self) -> [f32; 3] {
        self.box_size
    }

    /// The bits of the coordinates a wrapped position owned by `rank` may have, per dimension:
    /// `(lo, width)` with `x.to_bits() - lo < width` (wrapping) exactly for the `f32`s `x` of the
    /// rank's cell in the box (non-negative floats order as their bits; -0.0, a negative or a
    /// non-finite coordinate falls outside). A rank's atoms are then told from the rest with
    /// integer comparisons only, which the compiler vectorizes.
    pub(super) fn cell_bits(&self, rank: usize) -> ([u32; 3], [u32; 3]) {
        let (mut lo, mut hi) = ([0u32; 3], self.box_size.map(f32::to_bits));
        for (d, stride, edges) in &self.dims {
            let c = (rank / stride) % (edges.len() + 1);
            if c > 0 {
                lo[*d] = edges[c - 1].to_bits();
            }
            if c < edges.len() {
                hi[*d] = edges[c].to_bits();
            }
        }
        (lo, std::array::from_fn(|d| hi[d].saturating_sub(lo[d])))
    }
}

/// Writes into `owner` the rank owning each atom ([`home_of`]), in `parts` contiguous chunks on
/// `workers`; returns the atoms each rank owns. Errors on the first atom with a non-finite
/// coordinate, whatever the chunking.
fn owners(positions: &[Float3], geo: &Decomposition, workers: &Workers, parts: usize, owner: &mut Vec<u32>) -> Result<Vec<usize>, PlanError> {
    let chunk = positions.len().div_ceil(parts).max(1);
    let nranks = geo.grid.num_ranks();
    // Counted here, where the increments hide behind each atom's arithmetic (a separate pass
    // waits on one increment after another).
    let own = |(c, (part, out)): (usize, (&[Float3], &mut [u32]))| -> Result<Vec<usize>, PlanError> {
        let first = c * chunk;
        let mut counts = vec![0usize; nranks];
        for (k, (&p, o)) in part.iter().zip(out).enumerate() {
            let rank = home_of(p, geo, first + k)?.1;
            *o = rank as u32;
            counts[rank] += 1;
        }
        Ok(counts)
    };
    owner.clear();
    owner.resize(positions.len(), 0);
    let work: Vec<_> = positions.chunks(chunk).zip(owner.chunks_mut(chunk)).enumerate().collect();
    let mut counts = vec![0usize; nranks];
    // The first chunk's error first: the error a single thread meets.
    for part in workers.map(work, own) {
        counts.iter_mut().zip(part?).for_each(|(n, k)| *n += k);
    }
    Ok(counts)
}

/// Atoms per block of [`select`].
pub(super) const SELECT_BLOCK: usize = 64;

/// The larger of `a` and `b`, `b` when they are equal or either is NaN (one `maxsd`, where
/// `f64::max` adds NaN handling). In [`select`] it gives the squared excess `f64::max` gives for
/// every input: the two can differ only in the sign of a zero, which squaring drops, or where
/// exactly one operand is NaN, which finite cell bounds rule out (`lo - v` and `v - hi` are NaN
/// together, when `v` is, and both maxima then give `0.0` against the final `0.0`).
#[inline(always)]
pub(super) fn max_or_second(a: f64, b: f64) -> f64 {
    if a > b { a } else { b }
}

/// Positions a pulse's selection reads: local atoms in the rank's frame, in `f64`, handed out a
/// block at a time (a builder may hold them in another form and convert each block as it goes).
pub(super) trait RankFrame {
    /// Atoms held.
    fn len(&self) -> usize;
    /// Coordinates `dims` of atoms `at..at + out.len()` into `out`.
    fn block<const N: usize>(&self, at: usize, dims: [usize; N], out: &mut [[f64; N]]);
}

impl RankFrame for [[f64; 3]] {
    fn len(&self) -> usize {
        <[[f64; 3]]>::len(self)
    }

    #[inline]
    fn block<const N: usize>(&self, at: usize, dims: [usize; N], out: &mut [[f64; N]]) {
        for (o, x) in out.iter_mut().zip(&self[at..]) {
            *o = dims.map(|e| x[e]);
        }
    }
}

/// Local atoms of `pos` within `rc2` (squared) of the box `lo..hi` over the `N` decomposed
/// dimensions `dims`, their indices counted from `first`: the squared excesses summed in the order
/// of `dims`.
///
/// In blocks of [`SELECT_BLOCK`] atoms: first whether each is sent (no branch; the compiler
/// vectorizes it), then the block's sent indices written without a branch per atom to a buffer
/// that grows by one only when an atom is sent, appended to the map at once.
pub(super) fn select<const N: usize, P: RankFrame + ?Sized>(
    pos: &P,
    first: usize,
    dims: [usize; N],
    lo: [f64; N],
    hi: [f64; N],
    rc2: f64,
    map: &mut Vec<u32>,
) {
    let mut buf = [0u32; SELECT_BLOCK];
    let mut x = [[0.0f64; N]; SELECT_BLOCK];
    for at in (0..pos.len()).step_by(SELECT_BLOCK) {
        let block = &mut x[..SELECT_BLOCK.min(pos.len() - at)];
        pos.block(at, dims, block);
        let mut keep = [false; SELECT_BLOCK];
        for (keep, x) in keep.iter_mut().zip(&*block) {
            *keep = sent(x, lo, hi, rc2);
        }
        append_kept(&keep[..block.len()], (first + at) as u32, &mut buf, map);
    }
}

/// Whether an atom at `x` (over the `N` dimensions of `lo..hi`) is within `rc2` (squared) of the
/// box `lo..hi`: its squared excesses summed from 0 in the order of the dimensions, below `rc2`.
/// The one rule of every selection.
#[inline(always)]
pub(super) fn sent<const N: usize>(x: &[f64; N], lo: [f64; N], hi: [f64; N], rc2: f64) -> bool {
    let mut dist2 = 0.0;
    for i in 0..N {
        dist2 += excess2(x[i], lo[i], hi[i]);
    }
    dist2 < rc2
}

/// The squared excess of `v` over `lo..hi` (0 inside), as [`sent`] sums it.
#[inline(always)]
pub(super) fn excess2(v: f64, lo: f64, hi: f64) -> f64 {
    let excess = max_or_second(max_or_second(lo - v, v - hi), 0.0);
    excess * excess
}

/// The indices `base + k` of the `keep` flags set appended to `map`, written without a branch per
/// atom to `buf`, which grows by one only where an atom is kept.
#[inline(always)]
pub(super) fn append_kept(keep: &[bool], base: u32, buf: &mut [u32; SELECT_BLOCK], map: &mut Vec<u32>) {
    let mut n = 0;
    for (k, &keep) in keep.iter().enumerate() {
        // `n <= k < SELECT_BLOCK` here: the mask only tells the compiler so.
        buf[n & (SELECT_BLOCK - 1)] = base + k as u32;
        n += usize::from(keep);
    }
    map.extend_from_slice(&buf[..n]);
}

/// The squared distance below which an atom is sent: the squared cutoff with [`SEND_MARGIN`].
pub(super) fn send_range2(cutoff: f32) -> f64 {
    f64::from(cutoff).powi(2) * (1.0 + SEND_MARGIN)
}

/// What rank `rank` sends in a pulse along `d`: the indices (from `first`, the index of `pos[0]`)
/// of its atoms at `pos` (in its frame) within `rc2` of the receiver's cell, which in this rank's
/// frame is its own cell one step down along `d`, over the `decomposed` dimensions in order.
pub(super) fn select_for_pulse(
    geo: &Decomposition,
    decomposed: &[usize],
    rank: usize,
    d: usize,
    pos: &[[f64; 3]],
    first: usize,
    rc2: f64,
) -> Vec<u32> {
    let mut map = Vec::new();
    select_for_pulse_into(geo, decomposed, rank, d, pos, first, rc2, &mut map);
    map
}

/// [`select_for_pulse`] appending to `map` (whose allocation a caller may reuse).
#[allow(clippy::too_many_arguments)]
pub(super) fn select_for_pulse_into(
    geo: &Decomposition,
    decomposed: &[usize],
    rank: usize,
    d: usize,
    pos: &(impl RankFrame + ?Sized),
    first: usize,
    rc2: f64,
    map: &mut Vec<u32>,
) {
    let bounds = |e: usize| pulse_bounds(geo, rank, d, e);
    match *decomposed {
        [a] => select(pos, first, [a], [bounds(a).0], [bounds(a).1], rc2, map),
        [a, b] => select(pos, first, [a, b], [bounds(a).0, bounds(b).0], [bounds(a).1, bounds(b).1], rc2, map),
        [a, b, e] => select(pos, first, [a, b, e], [bounds(a).0, bounds(b).0, bounds(e).0], [bounds(a).1, bounds(b).1, bounds(e).1], rc2, map),
        _ => unreachable!("a pulse runs along a decomposed dimension, and there are at most three"),
    }
}

/// The bounds along `e` of the cell a pulse of rank `rank` along `d` sends to, in `rank`'s frame:
/// its own cell one step down along `d`.
#[inline]
pub(super) fn pulse_bounds(geo: &Decomposition, rank: usize, d: usize, e: usize) -> (f64, f64) {
    let c = geo.grid.coords_of(rank);
    if e == d { (geo.lower(e, c[e]) - geo.cell_width(d), geo.lower(e, c[e])) } else { (geo.lower(e, c[e]), geo.upper(e, c[e])) }
}

/// Pulse `pulse_in_dim` along `dim` of rank `rank` sending the atoms `index_map`, receiving at
/// `atom_offset` and landing at `peer_atom_offset` on the receiver; `recv_size` is left 0 for the
/// caller (it is the sender's selection, known once every rank has selected).
pub(super) fn pulse_plan(
    geo: &Decomposition,
    rank: usize,
    (dim, pulse_in_dim): (usize, usize),
    index_map: Vec<u32>,
    atom_offset: usize,
    peer_atom_offset: usize,
) -> PulsePlan {
    let grid = geo.grid;
    let shift = crossing_shift(geo, rank, dim);
    PulsePlan {
        dim,
        pulse_in_dim,
        spec: PulseSpec {
            send_rank: grid.neighbour(rank, dim, -1),
            recv_rank: grid.neighbour(rank, dim, 1),
            index_map,
            recv_size: 0,
            atom_offset,
            peer_atom_offset,
            shift: (grid.coords_of(rank)[dim] == 0).then(|| {
                let mut s = [0.0f32; 3];
                s[dim] = shift;
                Float3::new(s[0], s[1], s[2])
            }),
            accumulate_forces: true,
        },
    }
}

/// What rank `rank` adds along `dim` to the coordinates it sends: the box edge when it is first
/// along `dim` (its atoms cross the periodic boundary on the way down), else 0.
#[inline]
pub(super) fn crossing_shift(geo: &Decomposition, rank: usize, dim: usize) -> f32 {
    if geo.grid.coords_of(rank)[dim] == 0 { geo.box_size[dim] } else { 0.0 }
}

impl RankPlan {
    /// This rank's part of [`HaloPlan::rank_halos`]: its halo as the exchange consumes it.
    pub fn halo(&self) -> RankHalo {
        RankHalo { home_atoms: self.home_atoms, total_atoms: self.total_atoms, pulses: self.pulses.iter().map(|p| p.spec.clone()).collect() }
    }
}

impl HaloPlan {
    /// The plan as the exchange consumes it, one [`RankHalo`] per rank. Every received force is
    /// added (`accumulate_forces`): the MD step zeroes forces before computing them.
    pub fn rank_halos(&self) -> Vec<RankHalo> {
        self.ranks.iter().map(RankPlan::halo).collect()
    }

    /// The plan for `system` on `grid` with `cutoff` (nm).
    pub fn build(system: &MolecularSystem, grid: RankGrid, cutoff: f32) -> Result<Self, PlanError> {
        Self::from_positions(&system.positions, system.box_size, grid, cutoff)
    }

    /// The plan for atoms at `positions` (wrapped into the box first) in a periodic box.
    ///
    /// An atom is sent in a pulse when its distance to the receiving rank's cell, over the
    /// dimensions communicated so far, is below the cutoff. Pulse 0 of a dimension scans the home
    /// atoms and everything received along earlier dimensions; pulse `p > 0` scans only what
    /// pulse `p - 1` received. So an atom `k` cells up reaches a rank after exactly `k` hops
    /// along that dimension, once, and only if the rank needs it.
    pub fn from_positions(positions: &[Float3], box_size: [f32; 3], grid: RankGrid, cutoff: f32) -> Result<Self, PlanError> {
        Self::from_positions_with(positions, box_size, grid, cutoff, &Workers::serial(), &mut PlanScratch::default())
    }

    /// [`Self::build`] on `workers`, reusing `scratch` (the same plan for any workers and scratch).
    pub fn build_with(
        system: &MolecularSystem,
        grid: RankGrid,
        cutoff: f32,
        workers: &Workers,
        scratch: &mut PlanScratch,
    ) -> Result<Self, PlanError> {
        Self::from_positions_with(&system.positions, system.box_size, grid, cutoff, workers, scratch)
    }

    /// [`Self::from_positions`] on `workers`: the atoms are shared out in chunks to find their
    /// owners, and the ranks to select what each pulse sends; `scratch`'s arrays are reused. The
    /// same plan for any number of workers and any scratch.
    pub fn from_positions_with(
        positions: &[Float3],
        box_size: [f32; 3],
        grid: RankGrid,
        cutoff: f32,
        workers: &Workers,
        scratch: &mut PlanScratch,
    ) -> Result<Self, PlanError> {
        let geo = Decomposition::new(grid, box_size, cutoff)?;
        if positions.len() > (u32::MAX / 2) as usize {
            return Err(PlanError::TooManyAtoms { atoms: positions.len() });
        }
        let nranks = grid.num_ranks();
        // Threads only pay for themselves with a few thousand atoms each.
        let parts = workers.threads().clamp(1, positions.len().div_ceil(4096).max(1));
        // Home atoms: every atom's owner (in parallel chunks), then each rank's atoms in id order,
        // in one array per rank (the scratch's, else allocated once with room for a halo).
        let PlanScratch { owner, local, received } = scratch;
        let counts = owners(positions, &geo, workers, parts, owner)?;
        local.resize_with(nranks, RankAtoms::default);
        received.resize_with(nranks, RankAtoms::default);
        for (l, &n) in local.iter_mut().zip(&counts) {
            l.clear();
            l.ids.reserve(n + n / 2);
            l.pos.reserve(n + n / 2);
            l.ids.resize(n, 0);
            l.pos.resize(n, [0.0; 3]);
        }
        if nranks == 1 {
            local[0].ids.iter_mut().enumerate().for_each(|(id, out)| *out = id as u32);
            local[0].pos.iter_mut().zip(positions).for_each(|(out, &p)| *out = wrapped(p, box_size));
        } else {
            // Each rank's atoms in id order: a counting sort by owner into the sized arrays.
            let mut next = vec![0usize; nranks];
            let mut out: Vec<(&mut [u32], &mut [[f64; 3]])> = local.iter_mut().map(|l| (&mut l.ids[..], &mut l.pos[..])).collect();
            for (id, (&p, &o)) in positions.iter().zip(owner.iter()).enumerate() {
                let (o, j) = (o as usize, next[o as usize]);
                next[o] = j + 1;
                out[o].0[j] = id as u32;
                out[o].1[j] = wrapped(p, box_size);
            }
        }
        let home: Vec<usize> = local.iter().map(RankAtoms::len).collect();
        let mut pulses: Vec<Vec<PulsePlan>> = vec![Vec::new(); nranks];
        let decomposed = grid.decomposed_dims();
        let rc2 = send_range2(cutoff);

        for d in decomposed.iter().copied() {
            // Pulse 0 of this dimension scans everything present when the dimension starts.
            let dim_start: Vec<usize> = local.iter().map(RankAtoms::len).collect();
            let mut prev: Vec<(usize, usize)> = vec![(0, 0); nranks];
            for p in 0..geo.pulses[d] {
                let offsets: Vec<usize> = local.iter().map(RankAtoms::len).collect();
                let local_ref = &*local;
                let select_rank = |s: usize| {
                    let range = if p == 0 { 0..dim_start[s] } else { prev[s].0..prev[s].0 + prev[s].1 };
                    select_for_pulse(&geo, &decomposed, s, d, &local_ref[s].pos[range.clone()], range.start, rc2)
                };
                // Every rank's selection is independent: ranks in parallel on the workers.
                let maps: Vec<Vec<u32>> = workers.map((0..nranks).collect(), select_rank);
                for (s, map) in maps.into_iter().enumerate() {
                    let to = grid.neighbour(s, d, -1);
                    let (from, into) = (&local[s], &mut received[to]);
                    into.clear();
                    into.ids.extend(map.iter().map(|&k| from.ids[k as usize]));
                    let add = f64::from(crossing_shift(&geo, s, d));
                    // Only coordinate d moves (`+ 0.0` included, as the exchange adds the shift).
                    into.pos.extend(map.iter().map(|&k| {
                        let x = from.pos[k as usize];
                        std::array::from_fn(|e| if e == d { x[e] + add } else { x[e] })
                    }));
                    pulses[s].push(pulse_plan(&geo, s, (d, p), map, offsets[s], offsets[to]));
                }
                for (r, atoms) in received.iter().enumerate() {
                    if let Some(last) = pulses[r].last_mut() {
                        last.spec.recv_size = atoms.len();
                    }
                    prev[r] = (offsets[r], atoms.len());
                    local[r].ids.extend_from_slice(&atoms.ids);
                    local[r].pos.extend_from_slice(&atoms.pos);
                }
            }
        }

        let ranks = local
            .iter()
            .zip(pulses)
            .enumerate()
            .map(|(rank, (atoms, pulses))| RankPlan { rank, home_atoms: home[rank], total_atoms: atoms.len(), global_ids: atoms.ids.clone(), pulses })
            .collect();
        Ok(Self { grid, box_size, cutoff, ranks })
    }

    /// The decomposition geometry this plan was built on.
    pub fn decomposition(&self) -> Result<Decomposition, PlanError> {
        Decomposition::new(self.grid, self.box_size, self.cutoff)
    }

    /// Pulses per rank (the same on every rank of a valid plan).
    pub fn num_pulses(&self) -> usize {
        self.ranks.first().map_or(0, |r| r.pulses.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The plan the straightforward way (the builder before it was made fast): each atom pushed
    /// with its wrapped `f64` position into its owner's list, each pulse's selection a filter
    /// over the decomposed dimensions, each received atom copied with the shift added.
    fn reference_plan(positions: &[Float3], box_size: [f32; 3], grid: RankGrid, cutoff: f32) -> Result<HaloPlan, PlanError> {
        let geo = Decomposition::new(grid, box_size, cutoff)?;
        let nranks = grid.num_ranks();
        let decomposed = grid.decomposed_dims();
        let mut local: Vec<Vec<(u32, [f64; 3])>> = vec![Vec::new(); nranks];
        for (id, &p) in positions.iter().enumerate() {
            if !(p.x.is_finite() && p.y.is_finite() && p.z.is_finite()) {
                return Err(PlanError::NonFinitePosition { atom: id, position: [p.x, p.y, p.z] });
            }
            let w = wrapped(p, box_size);
            let mut cell = [0usize; 3];
            for &d in &decomposed {
                cell[d] = geo.cell_index(d, w[d]);
            }
            local[grid.rank_of(cell)].push((id as u32, w));
        }
        let home: Vec<usize> = local.iter().map(Vec::len).collect();
        let mut pulses: Vec<Vec<PulsePlan>> = vec![Vec::new(); nranks];
        let rc2 = f64::from(cutoff).powi(2) * (1.0 + SEND_MARGIN);
        for &d in &decomposed {
            let dim_start: Vec<usize> = local.iter().map(Vec::len).collect();
            let mut prev = vec![(0, 0); nranks];
            for p in 0..geo.pulses[d] {
                let offsets: Vec<usize> = local.iter().map(Vec::len).collect();
                let mut received: Vec<Vec<(u32, [f64; 3])>> = vec![Vec::new(); nranks];
                for s in 0..nranks {
                    let range = if p == 0 { 0..dim_start[s] } else { prev[s].0..prev[s].0 + prev[s].1 };
                    let c = grid.coords_of(s);
                    let (mut lo, mut hi) = ([0.0; 3], [0.0; 3]);
                    for e in 0..3 {
                        (lo[e], hi[e]) = (geo.lower(e, c[e]), geo.upper(e, c[e]));
                    }
                    hi[d] = lo[d];
                    lo[d] -= geo.cell_width(d);
                    let map: Vec<u32> = range
                        .filter(|&k| {
                            let x = local[s][k].1;
                            let dist2: f64 = decomposed.iter().map(|&e| (lo[e] - x[e]).max(x[e] - hi[e]).max(0.0).powi(2)).sum();
                            dist2 < rc2
                        })
                        .map(|k| k as u32)
                        .collect();
                    let to = grid.neighbour(s, d, -1);
                    let use_shift = c[d] == 0;
                    let mut shift = [0.0f32; 3];
                    if use_shift {
                        shift[d] = box_size[d];
                    }
                    received[to] = map
                        .iter()
                        .map(|&k| local[s][k as usize])
                        .map(|(id, mut x)| {
                            (id, {
                                x[d] += f64::from(shift[d]);
                                x
                            })
                        })
                        .collect();
                    pulses[s].push(PulsePlan {
                        dim: d,
                        pulse_in_dim: p,
                        spec: PulseSpec {
                            send_rank: to,
                            recv_rank: grid.neighbour(s, d, 1),
                            index_map: map,
                            recv_size: 0,
                            atom_offset: offsets[s],
                            peer_atom_offset: offsets[to],
                            shift: use_shift.then(|| Float3::new(shift[0], shift[1], shift[2])),
                            accumulate_forces: true,
                        },
                    });
                }
                for (r, atoms) in received.into_iter().enumerate() {
                    pulses[r].last_mut().expect("a pulse per rank").spec.recv_size = atoms.len();
                    prev[r] = (offsets[r], atoms.len());
                    local[r].extend(atoms);
                }
            }
        }
        let ranks = local
            .iter()
            .zip(pulses)
            .enumerate()
            .map(|(rank, (atoms, pulses))| RankPlan {
                rank,
                home_atoms: home[rank],
                total_atoms: atoms.len(),
                global_ids: atoms.iter().map(|a| a.0).collect(),
                pulses,
            })
            .collect();
        Ok(HaloPlan { grid, box_size, cutoff, ranks })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        /// The fast builder gives the straightforward plan, bit for bit, on any grid and on
        /// positions inside, outside and exactly on the edges of the box and its cells, on one and
        /// on several workers.
        #[test]
        fn the_plan_equals_the_straightforward_one(
            dims in (1usize..4, 1usize..4, 1usize..4),
            edge in (3.0f32..6.0, 3.0f32..6.0, 3.0f32..6.0),
            cutoff_frac in 0.05f32..0.45,
            raw in proptest::collection::vec((0u8..8, -1.5f32..2.5, -1.5f32..2.5, -1.5f32..2.5), 0..400),
            threads in 1usize..4,
        ) {
            let box_size = [edge.0, edge.1, edge.2];
            let grid = RankGrid::new([dims.0, dims.1, dims.2]).unwrap();
            let cutoff = cutoff_frac * box_size.iter().copied().fold(f32::INFINITY, f32::min);
            // Kind 0..5: anywhere in [-1.5, 2.5) boxes; 5: on a cell edge; 6: on the box edge; 7: -0.0.
            let positions: Vec<Float3> = raw
                .iter()
                .map(|&(kind, a, b, c)| {
                    let f = [a, b, c];
                    let v: [f32; 3] = std::array::from_fn(|d| match kind {
                        5 => (f[d].abs() * 4.0).floor() % grid.dims[d] as f32 * box_size[d] / grid.dims[d] as f32,
                        6 => box_size[d],
                        7 => -0.0,
                        _ => f[d] * box_size[d],
                    });
                    Float3::new(v[0], v[1], v[2])
                })
                .collect();
            let want = reference_plan(&positions, box_size, grid, cutoff);
            let got = HaloPlan::from_positions_with(&positions, box_size, grid, cutoff, &Workers::new(threads).unwrap(), &mut PlanScratch::default());
            prop_assert_eq!(got, want);
        }
    }

    /// [`select`] as it was written first: `f64::max`, a branch and a push per atom.
    fn select_reference<const N: usize>(pos: &[[f64; 3]], first: usize, dims: [usize; N], lo: [f64; N], hi: [f64; N], rc2: f64) -> Vec<u32> {
        let mut map = Vec::new();
        for (k, x) in pos.iter().enumerate() {
            let mut dist2 = 0.0;
            for i in 0..N {
                let v = x[dims[i]];
                let excess = (lo[i] - v).max(v - hi[i]).max(0.0);
                dist2 += excess * excess;
            }
            if dist2 < rc2 {
                map.push((first + k) as u32);
            }
        }
        map
    }

    #[test]
    fn the_block_selection_sends_what_the_atom_by_atom_one_sends() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
        let (lo, hi, rc) = ([1.0f64, 0.5, 2.0], [2.5f64, 3.0, 2.0], 0.75f64);
        let rc2 = rc * rc;
        // Coordinates on and next to the bounds and the cutoff (exactly at `rc2`: not sent), zeros
        // of both signs, NaN and the infinities, and random ones.
        let mut special = vec![0.0, -0.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY];
        for e in lo.iter().chain(&hi) {
            for x in [*e, e - rc, e + rc] {
                special.extend([x, x.next_down(), x.next_up()]);
            }
        }
        let coord = |rng: &mut rand_chacha::ChaCha8Rng| {
            if rng.random_range(0..3) == 0 { special[rng.random_range(0..special.len())] } else { rng.random_range(-1.0..4.0) }
        };
        // Lengths around the block size (and none at all).
        for len in [0, 1, 63, 64, 65, 128, 200] {
            let pos: Vec<[f64; 3]> = (0..len).map(|_| [coord(&mut rng), coord(&mut rng), coord(&mut rng)]).collect();
            for first in [0, 7] {
                let mut got = vec![99];
                select(&pos[..], first, [1], [lo[1]], [hi[1]], rc2, &mut got);
                assert_eq!(got[1..], select_reference(&pos, first, [1], [lo[1]], [hi[1]], rc2), "{len} atoms");
                got.clear();
                select(&pos[..], first, [2, 0], [lo[2], lo[0]], [hi[2], hi[0]], rc2, &mut got);
                assert_eq!(got, select_reference(&pos, first, [2, 0], [lo[2], lo[0]], [hi[2], hi[0]], rc2), "{len} atoms");
                got.clear();
                select(&pos[..], first, [0, 1, 2], lo, hi, rc2, &mut got);
                assert_eq!(got, select_reference(&pos, first, [0, 1, 2], lo, hi, rc2), "{len} atoms");
            }
        }
        // On the cutoff exactly: not sent; a hair inside: sent; on the bound, and -0.0 on a bound at 0.
        let pos = [[hi[0] + rc, 0.0, 0.0], [(hi[0] + rc).next_down(), 0.0, 0.0], [hi[0], 0.0, 0.0], [-0.0, 0.0, 0.0]];
        let mut got = Vec::new();
        select(&pos[..], 0, [0], [0.0], [hi[0]], rc2, &mut got);
        assert_eq!(got, [1, 2, 3]);
    }

    fn line(xs: &[f32]) -> Vec<Float3> {
        xs.iter().map(|&x| Float3::new(x, 0.5, 0.5)).collect()
    }

    #[test]
    fn cell_edges_give_the_owner_of_home_of() {
        // Boxes and grids whose edges are not exact in f32, positions on, just below and just
        // above every cell edge, the box edges, and outside the box.
        let cases = [
            ([2, 1, 1], [5.1f32, 4.7, 3.3]),
            ([3, 2, 2], [4.3, 3.7, 6.1]),
            ([4, 3, 1], [7.77, 5.03, 2.9]),
            ([1, 1, 3], [3.0, 3.0, 3.3]),
            ([2, 2, 2], [4.3, 3.7, 6.1]),
            ([1, 2, 1], [3.1, 5.3, 3.3]),
        ];
        for (dims, box_size) in cases {
            let geo = Decomposition::new(RankGrid::new(dims).unwrap(), box_size, 0.5).unwrap();
            let edges = CellEdges::new(&geo);
            let mut xs: Vec<[f32; 3]> = Vec::new();
            for d in 0..3 {
                for i in 0..=dims[d] {
                    let e = i as f32 * box_size[d] / dims[d] as f32;
                    for x in [e, e.next_down(), e.next_up(), -e, e + box_size[d], -0.0] {
                        let mut p = [0.3 * box_size[0], 0.6 * box_size[1], 0.9 * box_size[2]];
                        p[d] = x;
                        xs.push(p);
                        xs.push([x; 3]);
                    }
                }
            }
            for (k, p) in xs.into_iter().enumerate() {
                let p = Float3::new(p[0], p[1], p[2]);
                let (want, got) = (home_of(p, &geo, k).unwrap(), edges.home_of(p, k).unwrap());
                let bits = |(w, r): (Float3, usize)| (w.x.to_bits(), w.y.to_bits(), w.z.to_bits(), r);
                assert_eq!(bits(want), bits(got), "{p:?}");
                // The bit ranges of each rank's cell: exactly the positions it owns as they are (but -0.0).
                for r in 0..geo.grid.num_ranks() {
                    let (lo, width) = edges.cell_bits(r);
                    let fast = [p.x, p.y, p.z].iter().enumerate().all(|(d, c)| c.to_bits().wrapping_sub(lo[d]) < width[d]);
                    let exact = bits(got) == bits((p, r)) && ![p.x, p.y, p.z].iter().any(|c| c.to_bits() == (-0.0f32).to_bits());
                    assert_eq!(fast, exact, "{dims:?} rank {r} {p:?}");
                }
            }
            let bad = Float3::new(0.0, f32::NAN, 0.0);
            assert_eq!(format!("{:?}", home_of(bad, &geo, 3)), format!("{:?}", edges.home_of(bad, 3)));
        }
    }

    #[test]
    fn one_rank_has_no_pulses() {
        let plan = HaloPlan::from_positions(&line(&[0.1, 2.0, 1.0]), [3.0; 3], RankGrid::new([1, 1, 1]).unwrap(), 1.0).unwrap();
        assert_eq!(plan.ranks.len(), 1);
        let r = &plan.ranks[0];
        assert_eq!((r.home_atoms, r.total_atoms, r.pulses.len()), (3, 3, 0));
        assert_eq!(r.global_ids, vec![0, 1, 2]);
    }

    #[test]
    fn two_pulses_forward_along_a_line() {
        // Three ranks along x, cells of 1 nm, cutoff 1.4 nm: two pulses.
        let xs = [0.2, 0.9, 1.1, 1.6, 2.3, 2.8];
        let plan = HaloPlan::from_positions(&line(&xs), [3.0; 3], RankGrid::new([3, 1, 1]).unwrap(), 1.4).unwrap();
        let r0 = &plan.ranks[0];
        assert_eq!(r0.global_ids[..r0.home_atoms], [0, 1]);
        // Pulse 0: rank 1 sends all its home atoms (cell narrower than the cutoff) down to rank 0.
        assert_eq!((r0.pulses[0].spec.recv_rank, r0.pulses[0].spec.recv_size, r0.pulses[0].spec.atom_offset), (1, 2, 2));
        // Pulse 1: rank 1 forwards the rank-2 atoms it got that lie within 1.4 nm of x = 1 (x < 2.4).
        assert_eq!(r0.pulses[1].spec.recv_size, 1);
        assert_eq!(r0.global_ids, vec![0, 1, 2, 3, 4]);
        // Rank 0 sends to rank 2 across the boundary, with the box added.
        let p0 = &r0.pulses[0].spec;
        assert_eq!((p0.send_rank, p0.shift), (2, Some(Float3::new(3.0, 0.0, 0.0))));
        assert_eq!(p0.peer_atom_offset, plan.ranks[2].pulses[0].spec.atom_offset);
        let r2 = &plan.ranks[2];
        // Rank 2 (cell [2,3)) gets atoms 0 and 1 (x+3 = 3.2, 3.9 < 4.4), then atom 2 (4.1) forwarded.
        assert_eq!(r2.global_ids, vec![4, 5, 0, 1, 2]);
        assert_eq!(plan.num_pulses(), 2);
    }

    #[test]
    fn plans_round_trip_through_json_with_the_shift_as_an_array() {
        let plan = HaloPlan::from_positions(&line(&[0.2, 0.9, 1.1, 1.6, 2.3, 2.8]), [3.0; 3], RankGrid::new([3, 1, 1]).unwrap(), 1.4).unwrap();
        let text = serde_json::to_string(&plan).unwrap();
        assert!(text.contains(r#""shift":[3.0,0.0,0.0]"#) && text.contains(r#""shift":null"#), "{text}");
        assert!(text.contains(r#""dim":0,"pulse_in_dim":0,"send_rank":2"#), "the pulse's fields stay flat: {text}");
        assert_eq!(serde_json::from_str::<HaloPlan>(&text).unwrap(), plan);
        assert_eq!(plan.rank_halos()[0].pulses[0], plan.ranks[0].pulses[0].spec);
    }

    #[test]
    fn corner_atoms_beyond_the_cutoff_are_not_sent() {
        // 2x2x1: an atom near the far corner of the neighbour cell is within the cutoff along x and
        // along y separately but not in distance, so the diagonal neighbour never gets it.
        let pos = vec![Float3::new(2.7, 2.7, 0.5)];
        let plan = HaloPlan::from_positions(&pos, [4.0; 3], RankGrid::new([2, 2, 1]).unwrap(), 0.9).unwrap();
        assert_eq!(plan.ranks[3].home_atoms, 1);
        assert_eq!(plan.ranks[0].total_atoms, 0);
        assert_eq!(plan.ranks[2].total_atoms, 1);
        assert_eq!(plan.ranks[1].total_atoms, 1);
    }

    #[test]
    fn threads_do_not_change_the_plan() {
        let sys = MolecularSystem::generate(20_000, 3).unwrap();
        for dims in [[1, 1, 1], [2, 1, 1], [2, 2, 1], [2, 2, 2], [4, 1, 1], [3, 2, 1]] {
            let g = RankGrid::new(dims).unwrap();
            let one = HaloPlan::build(&sys, g, 1.2).unwrap();
            for t in [2, 3, 8] {
                let w = Workers::new(t).unwrap();
                assert_eq!(HaloPlan::build_with(&sys, g, 1.2, &w, &mut PlanScratch::default()).unwrap(), one, "{dims:?}, {t} threads");
            }
        }
        let mut pos = sys.positions.clone();
        pos[17_000].y = f32::NAN;
        pos[19_000].x = f32::INFINITY;
        let w = Workers::new(4).unwrap();
        let e =
            HaloPlan::from_positions_with(&pos, sys.box_size, RankGrid::new([2, 1, 1]).unwrap(), 1.2, &w, &mut PlanScratch::default()).unwrap_err();
        assert!(matches!(e, PlanError::NonFinitePosition { atom: 17_000, .. }), "{e}");
    }

    #[test]
    fn a_reused_scratch_gives_the_plan_of_a_fresh_one() {
        // Grids of more and fewer ranks, systems of more and fewer atoms, one after another
        // through one scratch (and an error in between), on one and on several workers.
        let big = MolecularSystem::generate(20_000, 3).unwrap();
        let small = MolecularSystem::generate(3_000, 4).unwrap();
        let mut bad = small.positions.clone();
        bad[5].z = f32::NAN;
        for w in [Workers::serial(), Workers::new(3).unwrap()] {
            let mut scratch = PlanScratch::default();
            for (sys, dims) in [(&big, [2, 2, 2]), (&small, [2, 1, 1]), (&big, [3, 1, 1]), (&small, [1, 1, 1]), (&big, [2, 2, 2])] {
                let g = RankGrid::new(dims).unwrap();
                let got = HaloPlan::build_with(sys, g, 1.2, &w, &mut scratch).unwrap();
                assert_eq!(got, HaloPlan::build(sys, g, 1.2).unwrap(), "{dims:?}");
                let e = HaloPlan::from_positions_with(&bad, small.box_size, g, 1.2, &w, &mut scratch).unwrap_err();
                assert!(matches!(e, PlanError::NonFinitePosition { atom: 5, .. }), "{e}");
            }
        }
    }

    #[test]
    fn bad_positions_are_errors() {
        let pos = vec![Float3::new(f32::NAN, 0.0, 0.0)];
        let e = HaloPlan::from_positions(&pos, [3.0; 3], RankGrid::new([1, 1, 1]).unwrap(), 1.0).unwrap_err();
        assert!(matches!(e, PlanError::NonFinitePosition { atom: 0, .. }));
    }
}
