//! Redecomposition from each process's own ranks: the [`HaloPlan`] of a search step built from
//! only the home atoms this process's ranks hold, with a few small collectives, instead of
//! gathering every atom to every process and planning the whole system there.
//!
//! 1. Each rank wraps its home atoms and finds their owners ([`CellEdges`]: the global builder's
//!    rule); the atoms that leave (to any rank) go out in one collective, and each rank keeps its
//!    stayers, adds its arrivals and sorts them by global id: the global builder's home atoms.
//! 2. Each pulse is simulated as [`HaloPlan::from_positions`] simulates it (the same selection,
//!    [`select_for_pulse`], on the same `f64` positions), with one collective per pulse carrying
//!    each rank's selection and local length (its receiver's `peer_atom_offset`).
//! 3. A last collective carries every rank's [`RankPlan`] but its global ids, so every process
//!    holds every rank's counts, pulses and maps, and with each plan what the caller's
//!    [`PlanRider`] made of it: a caller whose own decisions follow from each rank's plan (the
//!    router's paths for its halo) gathers them here instead of in a collective of its own. Each
//!    rank's home ids are checked where they are, and only a count and a checksum of them travel
//!    with its plan ([`home_check`](super::home_check)): no process receives another's ids.
//!
//! The collectives carry plain arrays in native byte order (little-endian on every target halo
//! runs on): a process's share of the data is its ranks' atoms, never the whole system. An error
//! in a rank's input (a non-finite position, arrays of different lengths) travels in the first
//! collective, so that every process reports it, the same, instead of some waiting for others.

use super::grid::{DIM_NAMES, Decomposition, wrap_position};
use super::home_check::{self, BadHome, HomeIdFacts, IdSums, RankHomes};
use super::plan::{CellEdges, RankFrame, crossing_shift, pulse_plan, send_range2};
use super::select::select_wrapped_into;
use super::{HaloPlan, PlanError, PulsePlan, RankGrid, RankPlan};
use crate::error::Result;
use crate::workers::Workers;
use bytemuck::Pod;
use kernels_gpu::abi::Float3;

mod device;
pub use device::{HomeDevice, MergedHome, redecompose_on_devices};

/// One rank's home atoms as its GPU holds them between searches: global ids, positions (in the
/// box or not) and velocities, one of each per atom, in any order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HomeAtoms {
    /// Global atom ids.
    pub ids: Vec<u32>,
    /// Positions (nm).
    pub positions: Vec<Float3>,
    /// Velocities (nm/ps).
    pub velocities: Vec<Float3>,
}

/// The outcome of [`redecompose`] on one process.
#[derive(Clone, Debug, PartialEq)]
pub struct Redecomposed {
    /// Every rank's plan: the plan [`HaloPlan::from_positions`] builds from all atoms' positions,
    /// except that a rank another process drives has no global ids here (its `global_ids` is
    /// empty; its counts, pulses and maps are all there).
    pub plan: HaloPlan,
    /// This process's ranks' new home atoms (in the order of `ranks`): ids ascending, equal to
    /// `plan.ranks[r].global_ids[..home_atoms]`, and velocities following their atoms. Their
    /// `positions` are left empty (no caller needs a second copy): the home atoms' wrapped
    /// positions are `local_positions[i][..ids.len()]` where `local_positions_from[i]` is 0.
    pub homes: Vec<HomeAtoms>,
    /// This process's ranks' local atoms (in the order of `ranks`): the wrapped position (global
    /// frame, no periodic shift) of every home and halo atom from `local_positions_from[i]` on,
    /// aligned with `plan.ranks[r].global_ids[local_positions_from[i]..]`.
    pub local_positions: Vec<Vec<Float3>>,
    /// Per rank of `ranks`, the first local atom whose position `local_positions` holds: 0, or its
    /// home atom count where the home atoms' positions stayed on their device
    /// ([`redecompose_on_devices`] without `home_positions`; then the scan of them in
    /// `home_scans` is exact along the decomposed dimensions, [`super::Scan::exact_along`]).
    pub local_positions_from: Vec<usize>,
    /// Per rank of `ranks`, where its home atoms were merged on a device that found their extent
    /// ([`MergedHome::home_scan`]): [`super::scan`] of the home positions (on the device, and in
    /// `local_positions[i][..ids.len()]` where `local_positions_from[i]` is 0) against
    /// `[0, edge)` along every dimension, so that the pair search need not pass over them again.
    /// Empty, or `None` for a rank, where nothing scanned them.
    pub home_scans: Vec<Option<super::Scan>>,
    /// Per rank of the grid, the bytes the redecomposition's [`PlanRider`] made of that rank's
    /// plan, where it was given one (on every process alike: they travel with the plans); empty
    /// without a rider.
    pub riders: Vec<Vec<u8>>,
}

/// What a caller of a redecomposition makes of each of its own ranks' new plans, to travel with
/// that plan in the plans' collective ([`TAG_PLAN`]) to every process
/// ([`Redecomposed::riders`]): the caller then needs no collective of its own for it. Called once
/// per local rank after the pulses, before the plans' collective. An error there is returned
/// before that collective, as a rank's own failure to encode its plan would be.
pub type PlanRider<'a> = dyn FnMut(&RankPlan) -> Result<Vec<u8>> + 'a;

/// Working arrays of a redecomposition, kept by a caller that redecomposes again and again so
/// that their allocations are reused (the result does not depend on them).
///
/// The arrays of the input home atoms go into it, and so do those of a result handed back with
/// [`Self::recycle`] (or [`Self::recycle_plan`] and [`Self::recycle_atoms`]): the next call
/// refills them instead of allocating (first touches of fresh memory are what a call costs most
/// on some hosts).
#[derive(Debug, Default)]
pub struct RedecomposeScratch {
    /// Per local rank.
    ranks: Vec<RankScratch>,
    /// Spare arrays for the outputs and blobs.
    spare: Spare,
    /// One flag per atom: whether it is some rank's home atom (naming a repeated atom).
    seen: Vec<bool>,
    /// The home check's sums over every atom, and the atom count they are for.
    all_ids: Option<(usize, IdSums)>,
}

impl RedecomposeScratch {
    /// Takes back the arrays of a result (its plan's and its atoms') for the next call to refill.
    pub fn recycle(&mut self, done: Redecomposed) {
        self.recycle_plan(done.plan);
        self.recycle_atoms(done.homes, done.local_positions);
    }

    /// Takes back a plan's arrays (global ids, index maps, pulse lists) for the next call to refill.
    pub fn recycle_plan(&mut self, plan: HaloPlan) {
        for r in plan.ranks {
            self.spare.give_ids(r.global_ids);
            let mut pulses = r.pulses;
            for p in pulses.drain(..) {
                Spare::give(&mut self.spare.maps, p.spec.index_map, SPARE_SMALL);
            }
            Spare::give(&mut self.spare.pulses, pulses, SPARE_SMALL);
        }
    }

    /// Empty home atom arrays with room for `n` atoms (spare ones where the scratch has them), for
    /// a caller to fill as the next call's input.
    pub fn home_arrays(&mut self, n: usize) -> HomeAtoms {
        let s = &mut self.spare;
        HomeAtoms { ids: Spare::take(&mut s.ids, n), positions: Spare::take(&mut s.float3, n), velocities: Spare::take(&mut s.float3, n) }
    }

    /// Takes back home atoms' and local positions' arrays for the next call to refill.
    pub fn recycle_atoms(&mut self, homes: Vec<HomeAtoms>, local_positions: Vec<Vec<Float3>>) {
        for h in homes {
            self.spare.give_home(h);
        }
        for p in local_positions {
            self.spare.give_float3(p);
        }
    }
}

/// Most spare small arrays (index maps, pulse lists, blobs) kept.
const SPARE_SMALL: usize = 64;

/// Spare arrays, empty, with their allocations: taken to be filled, given back when done with.
/// Large arrays are kept only as many as a call of the last one's ranks takes (`large`), so that
/// the scratch never holds more than a few copies of the system's atoms.
#[derive(Debug, Default)]
struct Spare {
    /// Id arrays (global ids, home ids).
    ids: Vec<Vec<u32>>,
    /// Position and velocity arrays.
    float3: Vec<Vec<Float3>>,
    /// Index maps.
    maps: Vec<Vec<u32>>,
    /// Pulse lists.
    pulses: Vec<Vec<PulsePlan>>,
    /// Blobs.
    bytes: Vec<Vec<u8>>,
    /// Most spare id arrays, and most position arrays, kept.
    large: usize,
}

impl Spare {
    /// An empty array with room for `need` items: the smallest spare one that has it, else a new one.
    fn take<T>(pool: &mut Vec<Vec<T>>, need: usize) -> Vec<T> {
        let fits = pool.iter().enumerate().filter(|(_, v)| v.capacity() >= need).min_by_key(|(_, v)| v.capacity()).map(|(i, _)| i);
        match fits {
            Some(i) => pool.swap_remove(i),
            None => Vec::with_capacity(need),
        }
    }

    /// Any spare array (the last given), else a new one.
    fn any<T>(pool: &mut Vec<Vec<T>>) -> Vec<T> {
        pool.pop().unwrap_or_default()
    }

    /// `v` emptied back to `pool`, unless it holds nothing or the pool holds `limit` already.
    fn give<T>(pool: &mut Vec<Vec<T>>, mut v: Vec<T>, limit: usize) {
        if v.capacity() > 0 && pool.len() < limit {
            v.clear();
            pool.push(v);
        }
    }

    fn give_ids(&mut self, v: Vec<u32>) {
        Self::give(&mut self.ids, v, self.large);
    }

    fn give_float3(&mut self, v: Vec<Float3>) {
        Self::give(&mut self.float3, v, self.large);
    }

    fn give_home(&mut self, h: HomeAtoms) {
        self.give_ids(h.ids);
        self.give_float3(h.positions);
        self.give_float3(h.velocities);
    }

    fn give_blobs(&mut self, blobs: Vec<Vec<u8>>) {
        for b in blobs {
            Self::give(&mut self.bytes, b, SPARE_SMALL);
        }
    }
}

/// One local rank's working arrays.
#[derive(Debug, Default)]
struct RankScratch {
    /// The input atoms that are not stayers as they are, in input order: input index, and the
    /// wrapped position of a stayer outside the box (`None`: a leaver).
    special: Vec<Special>,
    /// Whether the input's ids ascend (the stayers are then merged straight from it), else the
    /// stayers in id order: ids, wrapped positions and velocities.
    in_order: bool,
    /// How many stay.
    stayers: usize,
    ids: Vec<u32>,
    wrapped: Vec<Float3>,
    velocities: Vec<Float3>,
    /// Per local atom: the dimensions along which it came around the periodic boundary.
    crossed: Vec<u8>,
}

impl RankScratch {
    /// The stayers of `h` (`self.special` applied) in id order, into `self`'s arrays (an input
    /// not in the order of the last plan: rare).
    fn sort_stayers(&mut self, h: &HomeAtoms) {
        let mut all: Vec<Moving> = Vec::with_capacity(h.ids.len());
        let mut at = 0;
        for &(e, fix) in self.special.iter().chain([&(h.ids.len() as u32, None)]) {
            let e = e as usize;
            all.extend((at..e).map(|k| (h.ids[k], h.positions[k], h.velocities[k])));
            if let Some(w) = fix {
                all.push((h.ids[e], w, h.velocities[e]));
            }
            at = e + 1;
        }
        all.sort_unstable_by_key(|a| a.0);
        self.ids.clear();
        self.wrapped.clear();
        self.velocities.clear();
        for (i, p, v) in all {
            self.ids.push(i);
            self.wrapped.push(p);
            self.velocities.push(v);
        }
    }
}

/// The collective a redecomposition runs on: `(tag, mine)` to every rank's blob, indexed by rank,
/// where `mine` holds one blob per local rank ([`crate::exchange::Placement::all_gather`]).
pub type Collective<'a> = dyn FnMut(&str, Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> + 'a;

/// An atom on its way to a new owner: global id, wrapped position, velocity.
type Moving = (u32, Float3, Float3);

/// An input atom that is not a stayer as it is: its index, and its wrapped position if it stays.
type Special = (u32, Option<Float3>);

/// Tag of the collective that moves atoms to their new owners.
pub const TAG_MIGRATE: &str = "redecompose/migrate";
/// Tag of the collective that gathers every rank's plan.
pub const TAG_PLAN: &str = "redecompose/plan";
/// Tag of the collective that gathers every rank's home ids, only where the plans' checksums
/// show an atom on two ranks (on every process alike), to name it.
pub const TAG_HOMES: &str = "redecompose/homes";

/// Tag of the collective of pulse `p` along `d`.
fn pulse_tag(d: usize, p: usize) -> String {
    format!("redecompose/pulse {}{p}", DIM_NAMES[d])
}

/// The plan of `atoms` atoms on `grid` for a box of `box_size` and `cutoff`, built on each
/// process from its own `ranks`' `homes` (one [`HomeAtoms`] per entry of `ranks`).
///
/// `all_gather(tag, mine)` is the collective ([`crate::exchange::Placement::all_gather`]'s
/// contract): `mine` holds one blob per local rank, in the order of `ranks`, and it returns every
/// rank's blob, indexed by rank. Every process calls it the same number of times with the same
/// tags (distinct within one call: [`TAG_MIGRATE`], one per pulse, [`TAG_PLAN`], and
/// [`TAG_HOMES`] where the home check fails); a collective that needs tags unique over a run
/// adds its step to them.
///
/// Errors: the geometry as [`Decomposition::new`] reports it; a non-finite position
/// ([`PlanError::NonFinitePosition`], naming the global atom id) or arrays of different lengths on
/// any rank (every process reports the first rank's); home atoms over all ranks that are not
/// `0..atoms` once each ([`PlanError::HomeTotal`], [`PlanError::GlobalId`],
/// [`PlanError::HomeCount`], [`PlanError::HomeOrder`]); `ranks` outside the grid or repeated;
/// malformed blobs; and whatever `all_gather` returns.
pub fn redecompose(
    grid: RankGrid,
    box_size: [f32; 3],
    cutoff: f32,
    atoms: usize,
    ranks: &[usize],
    homes: Vec<HomeAtoms>,
    all_gather: &mut Collective<'_>,
) -> Result<Redecomposed> {
    redecompose_with(grid, box_size, cutoff, atoms, ranks, homes, all_gather, None, &Workers::serial(), &mut RedecomposeScratch::default())
}

/// [`redecompose`] with this process's ranks shared out to `workers` (each rank's owners, merge and
/// selections), reusing `scratch`'s arrays: the same result for any workers and scratch; `rider`,
/// when given, makes the bytes each local rank's plan carries to every process
/// ([`Redecomposed::riders`]).
#[allow(clippy::too_many_arguments)]
pub fn redecompose_with(
    grid: RankGrid,
    box_size: [f32; 3],
    cutoff: f32,
    atoms: usize,
    ranks: &[usize],
    homes: Vec<HomeAtoms>,
    all_gather: &mut Collective<'_>,
    rider: Option<&mut PlanRider<'_>>,
    workers: &Workers,
    scratch: &mut RedecomposeScratch,
) -> Result<Redecomposed> {
    let geo = Decomposition::new(grid, box_size, cutoff)?;
    if atoms > (u32::MAX / 2) as usize {
        return Err(PlanError::TooManyAtoms { atoms }.into());
    }
    let nranks = grid.num_ranks();
    let local_index = local_index(ranks, homes.len(), nranks)?;
    scratch.ranks.resize_with(ranks.len(), RankScratch::default);
    // Each local rank takes up to three id arrays and four position arrays, with its input and
    // its result, and each other rank's plan one id array (a caller that hands them all back
    // gives as many back).
    scratch.spare.large = 4 * ranks.len() + 2 + (nranks - ranks.len().min(nranks));

    // 1. Owners; leavers out, arrivals in; the new home atoms in id order.
    let edges = CellEdges::new(&geo);
    let parts = ranks.iter().zip(&homes).zip(&mut scratch.ranks).collect();
    let leaving: Vec<Leaving> = workers.map(parts, |((&s, h), sc)| Leaving::sort_out(&edges, s, h, sc));
    let arrivals = migrate(&leaving, &local_index, atoms, all_gather, &mut scratch.spare)?;
    // The arrays each rank fills, taken here (the workers share nothing).
    let spare = &mut scratch.spare;
    let arrays: Vec<Arrays> = scratch
        .ranks
        .iter()
        .zip(&arrivals)
        .map(|(sc, a)| {
            let n = sc.stayers + a.len();
            Arrays {
                ids: Spare::take(&mut spare.ids, n + n / 2),
                wrapped: Spare::take(&mut spare.float3, n + n / 2),
                velocities: Spare::take(&mut spare.float3, n),
                pulses: Spare::any(&mut spare.pulses),
            }
        })
        .collect();
    let parts = ranks.iter().zip(&homes).zip(&mut scratch.ranks).zip(arrivals).zip(arrays).collect();
    let work: Vec<Working> = workers.map(parts, |((((&s, h), sc), a), arrays)| Working::new(s, h, sc, a, arrays, box_size));
    homes.into_iter().for_each(|h| scratch.spare.give_home(h));
    plan_pulses(&geo, atoms, ranks, work, FromDevices::default(), all_gather, rider, workers, scratch)
}

/// The migration's collective: every local rank's `leaving` out, and per local rank (the order
/// of `local_index`'s ranks) the atoms that arrive, in the order the ranks sent them. Errors: a
/// rank's input error (every process reports the same), a malformed blob, or home atoms that do
/// not add up to `atoms`.
fn migrate(
    leaving: &[Leaving],
    local_index: &[Option<usize>],
    atoms: usize,
    all_gather: &mut Collective<'_>,
    spare: &mut Spare,
) -> Result<Vec<Vec<Moving>>> {
    let nranks = local_index.len();
    let blobs = leaving.iter().map(Leaving::blob).collect::<Result<Vec<_>, _>>()?;
    let gathered = gather(all_gather, TAG_MIGRATE, blobs, nranks)?;
    let mut arrivals: Vec<Vec<Moving>> = vec![Vec::new(); leaving.len()];
    let mut total = 0;
    for (r, blob) in gathered.iter().enumerate() {
        let (count, moving) = read_migration(blob, r, nranks)?;
        total += count;
        for (t, atom) in moving {
            if let Some(i) = local_index[t] {
                arrivals[i].push(atom);
            }
        }
    }
    spare.give_blobs(gathered);
    if total != atoms {
        return Err(PlanError::HomeTotal { found: total, expected: atoms }.into());
    }
    Ok(arrivals)
}

/// What the devices that hold the local ranks' home atoms found of them, per local rank (empty
/// where the host redecomposes): the home part of every decomposed dimension's first pulse's
/// selection (home indices, ascending), and the home check's facts of the home ids.
#[derive(Clone, Copy, Default)]
struct FromDevices<'a> {
    /// Per local rank and decomposed dimension, the home atoms the dimension's first pulse sends.
    maps: &'a [Vec<Vec<u32>>],
    /// Per local rank and decomposed dimension, their wrapped positions (in `maps`' order).
    x: &'a [Vec<Vec<Float3>>],
    /// Per local rank, the facts of its home ids ([`home_check::local_homes`] takes them).
    facts: &'a [Option<HomeIdFacts>],
}

/// Steps 2 and 3 of a redecomposition, once every local rank's new home atoms are in its
/// [`Working`]: the pulses, the homes and local positions out, every rank's plan to every
/// process. `devices.maps`, when not empty, holds per local rank and decomposed dimension the
/// home part of that dimension's first pulse's selection (the GPU's), which is then not selected
/// again: the host selects only the atoms received along earlier dimensions; `devices.facts` the
/// home ids' facts the home check takes instead of a pass over the ids. `rider` makes each local
/// rank's plan's [`Redecomposed::riders`] entry.
#[allow(clippy::too_many_arguments)]
fn plan_pulses(
    geo: &Decomposition,
    atoms: usize,
    ranks: &[usize],
    mut work: Vec<Working>,
    devices: FromDevices<'_>,
    all_gather: &mut Collective<'_>,
    mut rider: Option<&mut PlanRider<'_>>,
    workers: &Workers,
    scratch: &mut RedecomposeScratch,
) -> Result<Redecomposed> {
    let (grid, box_size, cutoff) = (geo.grid, geo.box_size, geo.cutoff);
    let nranks = grid.num_ranks();
    let spare = &mut scratch.spare;
    // 2. The pulses, dimension-major, as the global builder runs them.
    let decomposed = grid.decomposed_dims();
    let rc2 = send_range2(cutoff);
    for (k, &d) in decomposed.iter().enumerate() {
        // Pulse 0 scans everything present when the dimension starts; pulse p > 0 what p - 1 received.
        let dim_start: Vec<usize> = work.iter().map(Working::len).collect();
        let mut prev = vec![(0, 0); ranks.len()];
        for p in 0..geo.pulses[d] {
            let _span = tracing::debug_span!("search.pulse", dim = d, pulse = p).entered();
            let tag = pulse_tag(d, p);
            let offsets: Vec<usize> = work.iter().map(Working::len).collect();
            // A first pulse whose home part was selected already starts after the home atoms.
            let given = |i: usize| if p == 0 { devices.maps.get(i).map(|m| (m[k].as_slice(), work[i].home)) } else { None };
            // The positions of that home part, where the device sent them along.
            let given_x = |i: usize| if p == 0 { devices.x.get(i).map_or(&[][..], |x| x[k].as_slice()) } else { &[][..] };
            let ranges: Vec<_> = (0..ranks.len())
                .map(|i| match (p, given(i)) {
                    (0, Some((_, home))) => home..dim_start[i],
                    (0, None) => 0..dim_start[i],
                    _ => prev[i].0..prev[i].0 + prev[i].1,
                })
                .collect();
            let spares: Vec<_> = (0..ranks.len())
                .map(|i| {
                    let mut map = Spare::any(&mut spare.maps);
                    map.extend_from_slice(given(i).map_or(&[][..], |(m, _)| m));
                    (map, Spare::any(&mut spare.bytes))
                })
                .collect();
            let home_xs: Vec<&[Float3]> = (0..ranks.len()).map(given_x).collect();
            let sent = tracing::debug_span!("search.pulse.send").in_scope(|| {
                workers.map(work.iter().zip(ranges).zip(spares).zip(home_xs).collect(), |(((w, range), (mut map, blob)), home_x)| {
                    select_wrapped_into(geo, &decomposed, w.rank, d, &w.frame(range.clone())?, range.start, rc2, &mut map);
                    let blob = w.pulse_blob(&map, home_x, crossing_shift(geo, w.rank, d) != 0.0, d, blob)?;
                    Ok::<_, PlanError>((map, blob))
                })
            });
            let (maps, blobs): (Vec<_>, Vec<_>) = sent.into_iter().collect::<Result<Vec<_>, _>>()?.into_iter().unzip();
            let gathered = gather(all_gather, &tag, blobs, nranks)?;
            let received = tracing::debug_span!("search.pulse.receive")
                .in_scope(|| workers.map(work.iter_mut().zip(maps).collect(), |(w, map)| w.receive(geo, (d, p), map, &gathered, &tag)));
            spare.give_blobs(gathered);
            for (i, n) in received.into_iter().enumerate() {
                prev[i] = (offsets[i], n?);
            }
        }
    }

    // 3. Homes and local positions out, the working arrays back to the scratch; every rank's plan
    // but its ids to every process, with its home check's numbers.
    let _span = tracing::debug_span!("search.plan_out").entered();
    // Sums for other processes, and wherever the devices made them (then they cost nothing): a
    // process that drives every rank and has no such sums checks the ids exactly, and one that
    // has them tries them first ([`check_homes`]).
    let sums = ranks.len() < nranks || (!devices.facts.is_empty() && devices.facts.iter().all(Option::is_some));
    let local_homes = {
        let _span = tracing::debug_span!("search.plan_out.home_sums").entered();
        let ids: Vec<&[u32]> = work.iter().map(|w| &w.ids[..w.home]).collect();
        home_check::local_homes(&ids, devices.facts, atoms, sums, workers)
    };
    let mut homes = Vec::with_capacity(ranks.len());
    let mut local_positions = Vec::with_capacity(ranks.len());
    let mut local_positions_from = Vec::with_capacity(ranks.len());
    let mut mine = Vec::with_capacity(ranks.len());
    for ((&rank, w), sc) in ranks.iter().zip(work).zip(&mut scratch.ranks) {
        let home_atoms = w.home;
        let mut ids = Spare::take(&mut scratch.spare.ids, home_atoms);
        ids.extend_from_slice(&w.ids[..home_atoms]);
        homes.push(HomeAtoms { ids, positions: Vec::new(), velocities: w.velocities });
        local_positions.push(w.wrapped);
        local_positions_from.push(w.wrapped_from);
        sc.crossed = w.crossed;
        mine.push(RankPlan { rank, home_atoms, total_atoms: w.ids.len(), global_ids: w.ids, pulses: w.pulses });
    }
    let mut riders = vec![Vec::new(); nranks];
    let rider_span = tracing::debug_span!("search.plan_out.rider").entered();
    if let Some(make) = rider.as_mut() {
        for p in &mine {
            riders[p.rank] = make(p)?;
        }
    }
    drop(rider_span);
    // A process that drives every rank is the only one: it has nothing to learn or to tell.
    let gathered = if ranks.len() == nranks {
        vec![Vec::new(); nranks]
    } else {
        let blobs = tracing::debug_span!("search.plan_out.blobs").in_scope(|| {
            mine.iter()
                .zip(&local_homes)
                .map(|(p, h)| plan_blob_into(p, h, &riders[p.rank], Spare::any(&mut scratch.spare.bytes)))
                .collect::<Result<Vec<_>, _>>()
        })?;
        gather(all_gather, TAG_PLAN, blobs, nranks)?
    };
    let mut plans: Vec<Option<RankPlan>> = vec![None; nranks];
    let mut rank_homes = vec![RankHomes::default(); nranks];
    for (plan, h) in mine.into_iter().zip(local_homes) {
        let r = plan.rank;
        rank_homes[r] = h;
        plans[r] = Some(plan);
    }
    let layout = geo.pulse_layout();
    let read_span = tracing::debug_span!("search.plan_out.read").entered();
    let ranks_plans = plans
        .into_iter()
        .enumerate()
        .map(|(r, plan)| match plan {
            Some(plan) => Ok(plan),
            None => read_plan_with(&gathered[r], r, geo, &layout, &mut scratch.spare).map(|(plan, h, carried)| {
                rank_homes[r] = h;
                riders[r] = carried;
                plan
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    drop(read_span);
    let plan = HaloPlan { grid, box_size, cutoff, ranks: ranks_plans };
    scratch.spare.give_blobs(gathered);
    tracing::debug_span!("search.plan_out.check_homes")
        .in_scope(|| check_homes(&plan, &homes, &rank_homes, sums, atoms, all_gather, workers, scratch))?;
    Ok(Redecomposed { plan, homes, local_positions, local_positions_from, home_scans: Vec::new(), riders })
}

/// The home check ([`home_check`]) of every rank's [`RankHomes`] (indexed by rank), where this
/// process's ranks hold `homes` (their ids in `plan` too) and `sums` says whether `rank_homes`
/// carry their sums: the counts and each rank's first bad id; then the sums where there are any,
/// and where they show an atom on two ranks (every process sees it alike), or where a process
/// that drives every rank has none, the ids: on such a process every id exactly (one flag per
/// atom), else gathered ([`TAG_HOMES`]) to name it.
#[allow(clippy::too_many_arguments)]
fn check_homes(
    plan: &HaloPlan,
    homes: &[HomeAtoms],
    rank_homes: &[RankHomes],
    sums: bool,
    atoms: usize,
    all_gather: &mut Collective<'_>,
    workers: &Workers,
    scratch: &mut RedecomposeScratch,
) -> Result<()> {
    home_check::check_counts(rank_homes, atoms)?;
    let nranks = plan.ranks.len();
    if sums {
        let expected = match scratch.all_ids {
            Some((n, sum)) if n == atoms => sum,
            _ => {
                let sum = home_check::all_ids_sums(atoms, workers);
                scratch.all_ids = Some((atoms, sum));
                sum
            }
        };
        if home_check::sums_match(rank_homes, expected) {
            return Ok(());
        }
    }
    if homes.len() == nranks {
        let ids: Vec<&[u32]> = plan.ranks.iter().map(|p| &p.global_ids[..p.home_atoms]).collect();
        return home_check::name_repeated(&ids, atoms, workers, &mut scratch.seen).map_or(Ok(()), |e| Err(e.into()));
    }
    let blobs = homes.iter().map(|h| bytemuck::cast_slice::<u32, u8>(&h.ids).to_vec()).collect();
    let gathered = gather(all_gather, TAG_HOMES, blobs, nranks)?;
    let read = |(r, blob): (usize, &Vec<u8>)| {
        let mut rd = Reader::new(blob, TAG_HOMES, r);
        let ids = rd.take::<u32>(blob.len() / 4)?;
        rd.finish().map(|()| ids)
    };
    let ids = gathered.iter().enumerate().map(read).collect::<Result<Vec<_>, _>>()?;
    let ids: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
    // Ids that hold every atom once would have matched the sums: then some rank's numbers are not
    // its ids', and the set is still in doubt.
    Err(home_check::name_repeated(&ids, atoms, workers, &mut scratch.seen).unwrap_or(PlanError::HomeSet { atoms }).into())
}

/// For every rank of the grid, its index in `ranks` if this process drives it.
fn local_index(ranks: &[usize], homes: usize, nranks: usize) -> Result<Vec<Option<usize>>, PlanError> {
    let bad = |reason: String| PlanError::LocalRanks { ranks: ranks.to_vec(), reason };
    if homes != ranks.len() {
        return Err(bad(format!("{homes} sets of home atoms for {} ranks", ranks.len())));
    }
    let mut index = vec![None; nranks];
    for (i, &r) in ranks.iter().enumerate() {
        match index.get_mut(r) {
            None => return Err(bad(format!("rank {r} is outside the grid of {nranks} ranks"))),
            Some(Some(_)) => return Err(bad(format!("rank {r} is listed twice"))),
            Some(slot) => *slot = Some(i),
        }
    }
    Ok(index)
}

/// `all_gather(tag, mine)`, checked to give one blob per rank.
fn gather(all_gather: &mut Collective<'_>, tag: &str, mine: Vec<Vec<u8>>, nranks: usize) -> Result<Vec<Vec<u8>>> {
    let _span = tracing::debug_span!("search.all_gather", tag).entered();
    let all = all_gather(tag, mine)?;
    if all.len() != nranks {
        return Err(PlanError::GatherCount { tag: tag.to_string(), found: all.len(), expected: nranks }.into());
    }
    Ok(all)
}

/// First word of a migration blob: what follows.
const MIGRATION_OK: u32 = 0;
/// A non-finite position: the atom id and the position follow.
const MIGRATION_NON_FINITE: u32 = 1;
/// Home arrays of different lengths: the three lengths follow.
const MIGRATION_ARRAYS: u32 = 2;

/// One local rank's home atoms sorted out (the wrapped position of each and which stay go to its
/// [`RankScratch`]): which leave and where to; or why its input is unusable.
struct Leaving {
    /// Destination rank, id, wrapped position and velocity of the atoms that leave.
    dest: Vec<u32>,
    ids: Vec<u32>,
    positions: Vec<Float3>,
    velocities: Vec<Float3>,
    /// Atoms the rank held.
    count: usize,
    /// The first problem with the input.
    error: Option<PlanError>,
}

impl Leaving {
    fn sort_out(edges: &CellEdges, rank: usize, h: &HomeAtoms, sc: &mut RankScratch) -> Self {
        let n = h.ids.len();
        sc.special.clear();
        sc.stayers = 0;
        let mut out = Self { dest: Vec::new(), ids: Vec::new(), positions: Vec::new(), velocities: Vec::new(), count: n, error: None };
        if h.positions.len() != n || h.velocities.len() != n {
            out.error = Some(PlanError::HomeArrays { rank, ids: n, positions: h.positions.len(), velocities: h.velocities.len() });
            return out;
        }
        if let Err(e) = out.sort_with(h, rank, edges, sc) {
            out.error = Some(e);
        }
        out
    }

    /// Records in `sc.special`, in input order, the atoms of `h` that are not stayers as they
    /// are: the leavers (also into `self`, with their owners) and the stayers outside the box
    /// (with their wrapped positions). A read-only pass: a block of atoms all inside the rank's
    /// cell (the common case) is told by integer comparisons of the coordinates' bits
    /// ([`CellEdges::cell_bits`]), which the compiler vectorizes, and only a block with another
    /// atom is looked at atom by atom. The stayers themselves are copied in runs by the merge; an
    /// input not in id order has its stayers put in order in `sc`'s arrays instead. Errors on the
    /// first non-finite position (in input order), which the bit ranges never hold.
    fn sort_with(&mut self, h: &HomeAtoms, rank: usize, edges: &CellEdges, sc: &mut RankScratch) -> Result<(), PlanError> {
        /// Atoms per block.
        const BLOCK: usize = 16;
        sc.special.clear();
        let (lo, width) = edges.cell_bits(rank);
        // The ranges repeated along a block's coordinates (x, y, z, x, ...).
        let lo_block: [u32; 3 * BLOCK] = std::array::from_fn(|i| lo[i % 3]);
        let width_block: [u32; 3 * BLOCK] = std::array::from_fn(|i| width[i % 3]);
        let out_of_cell = |coords: &[u32], lo: &[u32], width: &[u32]| {
            coords.iter().zip(lo).zip(width).fold(false, |any, ((&c, &l), &w)| any | (c.wrapping_sub(l) >= w))
        };
        let coords: &[u32] = bytemuck::cast_slice(&h.positions);
        for (b, block) in coords.chunks(3 * BLOCK).enumerate() {
            if out_of_cell(block, &lo_block, &width_block) {
                for (i, c) in block.chunks_exact(3).enumerate() {
                    if out_of_cell(c, &lo, &width) {
                        self.special(h, b * BLOCK + i, rank, edges, sc)?;
                    }
                }
            }
        }
        sc.stayers = h.ids.len() - self.ids.len();
        // Folded over every pair without stopping early, which the compiler vectorizes (an input
        // is in order nearly always, so stopping early gains nothing).
        sc.in_order = h.ids.iter().zip(h.ids.iter().skip(1)).fold(true, |ok, (a, b)| ok & (a < b));
        if !sc.in_order {
            sc.sort_stayers(h);
        }
        Ok(())
    }

    /// Input atom `k` of `h`, not in the rank's cell as it is: wrapped, and recorded as a stayer
    /// outside the box or as a leaver.
    #[cold]
    #[inline(never)]
    fn special(&mut self, h: &HomeAtoms, k: usize, rank: usize, edges: &CellEdges, sc: &mut RankScratch) -> Result<(), PlanError> {
        let (id, p) = (h.ids[k], h.positions[k]);
        if !(p.x.is_finite() && p.y.is_finite() && p.z.is_finite()) {
            return Err(PlanError::NonFinitePosition { atom: id as usize, position: [p.x, p.y, p.z] });
        }
        let w = wrap_position(p, edges.box_size());
        let o = edges.rank_of(w);
        if o == rank {
            sc.special.push((k as u32, Some(w)));
        } else {
            sc.special.push((k as u32, None));
            self.dest.push(o as u32);
            self.ids.push(id);
            self.positions.push(w);
            self.velocities.push(h.velocities[k]);
        }
        Ok(())
    }

    /// The rank's blob of the migration: its error, or its atom count and its leavers.
    fn blob(&self) -> Result<Vec<u8>, PlanError> {
        let mut b = Blob::default();
        match &self.error {
            Some(PlanError::NonFinitePosition { atom, position }) => {
                b.word(MIGRATION_NON_FINITE as usize)?;
                b.word(*atom)?;
                b.put(position);
            }
            Some(PlanError::HomeArrays { ids, positions, velocities, .. }) => {
                b.word(MIGRATION_ARRAYS as usize)?;
                b.put(&[*ids as u64, *positions as u64, *velocities as u64]);
            }
            Some(other) => return Err(other.clone()),
            None => {
                b.word(MIGRATION_OK as usize)?;
                b.word(self.count)?;
                b.word(self.dest.len())?;
                b.put(&self.dest);
                b.put(&self.ids);
                b.put(&self.positions);
                b.put(&self.velocities);
            }
        }
        Ok(b.0)
    }
}

/// The first phase of a redecomposition on its own ([`Leaving::sort_out`]), for the tests of the
/// GPU migration: rank `rank`'s stayers in input order (id, wrapped position, velocity) and its
/// leavers in input order (owner, id, wrapped position, velocity), or the error in its input.
#[cfg(test)]
#[allow(clippy::type_complexity)]
pub(super) fn sort_out_home(
    geo: &Decomposition,
    rank: usize,
    h: &HomeAtoms,
) -> Result<(Vec<(u32, Float3, Float3)>, Vec<(u32, u32, Float3, Float3)>), PlanError> {
    let mut sc = RankScratch::default();
    let l = Leaving::sort_out(&CellEdges::new(geo), rank, h, &mut sc);
    if let Some(e) = l.error {
        return Err(e);
    }
    // The atoms the pass looked at (leavers, and stayers outside the box with their wrapped
    // positions); every other atom stays as it is.
    let special: std::collections::HashMap<u32, Option<Float3>> = sc.special.iter().copied().collect();
    let stayers = (0..h.ids.len())
        .filter_map(|k| match special.get(&(k as u32)) {
            Some(None) => None,
            Some(Some(w)) => Some((h.ids[k], *w, h.velocities[k])),
            None => Some((h.ids[k], h.positions[k], h.velocities[k])),
        })
        .collect();
    let leavers = (0..l.ids.len()).map(|k| (l.dest[k], l.ids[k], l.positions[k], l.velocities[k])).collect();
    Ok((stayers, leavers))
}

/// The first two phases of a redecomposition on their own ([`Leaving::sort_out`], then
/// [`Working::new`]), for the tests of the GPU merge: rank `rank`'s new home atoms (ids, wrapped
/// positions, velocities) from its input `h` and its `arrivals` (id, wrapped position, velocity,
/// any order), or the error in its input.
#[cfg(test)]
#[allow(clippy::type_complexity)]
pub(super) fn merge_home(
    geo: &Decomposition,
    rank: usize,
    h: &HomeAtoms,
    arrivals: Vec<(u32, Float3, Float3)>,
) -> Result<(Vec<u32>, Vec<Float3>, Vec<Float3>), PlanError> {
    let mut sc = RankScratch::default();
    let l = Leaving::sort_out(&CellEdges::new(geo), rank, h, &mut sc);
    if let Some(e) = l.error {
        return Err(e);
    }
    let arrays = Arrays { ids: Vec::new(), wrapped: Vec::new(), velocities: Vec::new(), pulses: Vec::new() };
    let w = Working::new(rank, h, &mut sc, arrivals, arrays, geo.box_size);
    Ok((w.ids, w.wrapped, w.velocities))
}

/// Rank `rank`'s migration blob: its atom count and its leavers with their destinations, or the
/// error in its input.
fn read_migration(blob: &[u8], rank: usize, nranks: usize) -> Result<(usize, Vec<(usize, Moving)>), PlanError> {
    let mut rd = Reader::new(blob, TAG_MIGRATE, rank);
    match rd.word()? as u32 {
        MIGRATION_OK => {}
        MIGRATION_NON_FINITE => {
            let atom = rd.word()?;
            let position: Vec<f32> = rd.take(3)?;
            return Err(PlanError::NonFinitePosition { atom, position: [position[0], position[1], position[2]] });
        }
        MIGRATION_ARRAYS => {
            let n: Vec<u64> = rd.take(3)?;
            return Err(PlanError::HomeArrays { rank, ids: n[0] as usize, positions: n[1] as usize, velocities: n[2] as usize });
        }
        other => return Err(rd.bad(format!("unknown status {other}"))),
    }
    let count = rd.word()?;
    let n = rd.word()?;
    let dest: Vec<u32> = rd.take(n)?;
    let ids: Vec<u32> = rd.take(n)?;
    let positions: Vec<Float3> = rd.take(n)?;
    let velocities: Vec<Float3> = rd.take(n)?;
    if let Some(&t) = dest.iter().find(|&&t| t as usize >= nranks) {
        return Err(rd.bad(format!("an atom goes to rank {t} of {nranks}")));
    }
    rd.finish()?;
    let moving = dest.iter().zip(ids).zip(positions).zip(velocities).map(|(((&t, id), p), v)| (t as usize, (id, p, v))).collect();
    Ok((count, moving))
}

/// The arrays a local rank's [`Working`] fills, taken from the spares.
struct Arrays {
    ids: Vec<u32>,
    wrapped: Vec<Float3>,
    velocities: Vec<Float3>,
    pulses: Vec<PulsePlan>,
}

/// One local rank while its pulses are simulated: its local atoms so far (home atoms first, in id
/// order) with their wrapped positions, the dimensions along which each came around the periodic
/// boundary (their positions in the rank's frame follow: [`Frame`]); the home atoms' velocities;
/// its pulses.
struct Working {
    rank: usize,
    /// Home atoms (the first local atoms).
    home: usize,
    ids: Vec<u32>,
    /// Wrapped positions of the local atoms from `wrapped_from` on.
    wrapped: Vec<Float3>,
    /// The first local atom whose position `wrapped` holds: 0, or `home` where the home atoms'
    /// positions stayed on their device (the first pulses carry those they send).
    wrapped_from: usize,
    velocities: Vec<Float3>,
    /// Bit `d` set: the atom's position in this rank's frame is the box edge above its wrapped one
    /// along `d` (an atom comes around the boundary along a dimension at most once).
    crossed: Vec<u8>,
    pulses: Vec<PulsePlan>,
    box_size: [f32; 3],
}

impl Working {
    /// The rank's new home atoms in id order: its stayers (`sc`'s arrays) and its arrivals, merged (the stayers of an input that came from the last
    /// plan are in order already, and arrivals are few), with room for a halo.
    fn new(rank: usize, h: &HomeAtoms, sc: &mut RankScratch, mut arrivals: Vec<Moving>, arrays: Arrays, box_size: [f32; 3]) -> Self {
        arrivals.sort_unstable_by_key(|a| a.0);
        let n = sc.stayers + arrivals.len();
        let mut w = Self {
            rank,
            home: n,
            ids: arrays.ids,
            wrapped: arrays.wrapped,
            wrapped_from: 0,
            velocities: arrays.velocities,
            crossed: std::mem::take(&mut sc.crossed),
            pulses: arrays.pulses,
            box_size,
        };
        // The stayers: the input but its special atoms (an input in id order), else sorted apart.
        let (ids, wrapped, velocities, special): (&[u32], &[Float3], &[Float3], &[Special]) =
            if sc.in_order { (&h.ids, &h.positions, &h.velocities, &sc.special) } else { (&sc.ids, &sc.wrapped, &sc.velocities, &[]) };
        // Runs of stayers (each copied whole, its rank-frame positions converted as they go: a
        // home atom has crossed no boundary) between the special atoms, an arrival after the
        // input atoms of ids up to its own.
        let mut special = special.iter().peekable();
        let mut at = 0;
        for a in arrivals.into_iter().map(Some).chain([None]) {
            let end = match a {
                Some((a, _, _)) => at + ids[at..].partition_point(|&k| k <= a),
                None => ids.len(),
            };
            while let Some(&&(e, fix)) = special.peek()
                && (e as usize) < end
            {
                let e = e as usize;
                w.push_run(&ids[at..e], &wrapped[at..e], &velocities[at..e]);
                if let Some(p) = fix {
                    w.push_run(&ids[e..=e], &[p], &velocities[e..=e]);
                }
                at = e + 1;
                special.next();
            }
            w.push_run(&ids[at..end], &wrapped[at..end], &velocities[at..end]);
            if let Some((a, p, v)) = a {
                w.push_run(&[a], &[p], &[v]);
            }
            at = end;
        }
        w.crossed.clear();
        w.crossed.reserve(n + n / 2);
        w.crossed.resize(n, 0);
        w
    }

    /// Home atoms appended: ids, wrapped positions (which are their rank-frame ones) and velocities.
    fn push_run(&mut self, ids: &[u32], wrapped: &[Float3], velocities: &[Float3]) {
        self.ids.extend_from_slice(ids);
        self.wrapped.extend_from_slice(wrapped);
        self.velocities.extend_from_slice(velocities);
    }

    fn len(&self) -> usize {
        self.ids.len()
    }

    /// Local atoms `range` in the rank's frame, as a pulse's selection reads them; an error for a
    /// range reaching below the positions held (`wrapped_from`: the pulses select only among
    /// atoms received after the home atoms there).
    fn frame(&self, range: std::ops::Range<usize>) -> Result<Frame<'_>, PlanError> {
        let held = range.start.checked_sub(self.wrapped_from).map(|s| s..range.end - self.wrapped_from);
        let wrapped = held.and_then(|r| self.wrapped.get(r)).ok_or_else(|| self.not_held(range.start))?;
        Ok(Frame { wrapped, crossed: &self.crossed[range], edge: self.box_size.map(f64::from) })
    }

    /// The error for local atom `k`, whose position the host does not hold.
    fn not_held(&self, k: usize) -> PlanError {
        PlanError::PositionNotHeld { rank: self.rank, local: k, from: self.wrapped_from, to: self.wrapped_from + self.wrapped.len() }
    }

    /// This rank's blob of a pulse along `d`: its local length before the pulse (its receiver's
    /// `peer_atom_offset`) and the atoms `map` (ids, wrapped positions, crossings, with `d` added
    /// when the pulse crosses the boundary). The positions of `map`'s first `home_x.len()` atoms
    /// are `home_x` (what the device's selection sent of the home atoms), the others' are read
    /// from the positions held. The blob is written into `spare`'s allocation.
    fn pulse_blob(&self, map: &[u32], home_x: &[Float3], crosses: bool, d: usize, mut spare: Vec<u8>) -> Result<Vec<u8>, PlanError> {
        spare.clear();
        let mut b = Blob(spare);
        b.0.reserve(8 + map.len() * 17);
        b.word(self.len())?;
        b.word(map.len())?;
        let bit = if crosses { 1u8 << d } else { 0 };
        let given = home_x.len();
        if given > map.len() {
            return Err(PlanError::AtomCount {
                rank: self.rank,
                what: "home positions sent with a pulse (at most its atoms)",
                found: given,
                expected: map.len(),
            });
        }
        // The three arrays sized at once, then filled atom by atom with plain stores (no
        // capacity check per atom).
        let at = b.0.len();
        b.0.resize(at + map.len() * 17, 0);
        let (ids, rest) = b.0[at..].split_at_mut(4 * map.len());
        let (wrapped, crossed) = rest.split_at_mut(12 * map.len());
        for (out, &k) in ids.chunks_exact_mut(4).zip(map) {
            out.copy_from_slice(&self.ids[k as usize].to_ne_bytes());
        }
        let (from_home, from_held) = wrapped.split_at_mut(12 * given);
        from_home.copy_from_slice(bytemuck::cast_slice(home_x));
        for (out, &k) in from_held.chunks_exact_mut(12).zip(&map[given..]) {
            let x = (k as usize).checked_sub(self.wrapped_from).and_then(|i| self.wrapped.get(i)).ok_or_else(|| self.not_held(k as usize))?;
            out.copy_from_slice(bytemuck::bytes_of(x));
        }
        for (out, &k) in crossed.iter_mut().zip(map) {
            *out = self.crossed[k as usize] | bit;
        }
        Ok(b.0)
    }

    /// Pulse `pulse_in_dim` along `dim`, this rank sending `map`, once every rank's blob of it is
    /// `gathered`: appends what the rank above sent and records the pulse; returns how many
    /// atoms arrived.
    fn receive(
        &mut self,
        geo: &Decomposition,
        (dim, pulse_in_dim): (usize, usize),
        map: Vec<u32>,
        gathered: &[Vec<u8>],
        tag: &str,
    ) -> Result<usize, PlanError> {
        let (to, from) = (geo.grid.neighbour(self.rank, dim, -1), geo.grid.neighbour(self.rank, dim, 1));
        let peer_atom_offset = Reader::new(&gathered[to], tag, to).word()?;
        let mut rd = Reader::new(&gathered[from], tag, from);
        let _senders_offset = rd.word()?;
        let n = rd.word()?;
        let start = self.len();
        rd.extend(n, &mut self.ids)?;
        rd.extend(n, &mut self.wrapped)?;
        rd.extend(n, &mut self.crossed)?;
        rd.finish()?;
        let mut pulse = pulse_plan(geo, self.rank, (dim, pulse_in_dim), map, start, peer_atom_offset);
        pulse.spec.recv_size = n;
        self.pulses.push(pulse);
        Ok(n)
    }
}

/// Local atoms of a [`Working`] as a pulse's selection reads them: their positions in the rank's
/// frame, which the global builder holds as they are, made block by block from the wrapped
/// positions (exact in `f64`) with the box edge added (in `f64`, as the global builder adds the
/// shift) along the dimensions where an atom crossed.
pub(super) struct Frame<'a> {
    pub(super) wrapped: &'a [Float3],
    pub(super) crossed: &'a [u8],
    pub(super) edge: [f64; 3],
}

impl RankFrame for Frame<'_> {
    fn len(&self) -> usize {
        self.wrapped.len()
    }

    #[inline]
    fn block<const N: usize>(&self, at: usize, dims: [usize; N], out: &mut [[f64; N]]) {
        let (bit, edge) = (dims.map(|e| 1u8 << e), dims.map(|e| self.edge[e]));
        let n = out.len();
        // The coordinates read straight from memory (a position copied out first and indexed by
        // dimension goes through the stack).
        let coords: &[f32] = bytemuck::cast_slice(&self.wrapped[at..at + n]);
        for ((o, w), &c) in out.iter_mut().zip(coords.chunks_exact(3)).zip(&self.crossed[at..at + n]) {
            *o = std::array::from_fn(|i| {
                // The edge or zero added: `x + 0.0` is `x` but for the sign of a zero, which the
                // selection cannot see (its excesses are squared), and no branch.
                let add = if c & bit[i] != 0 { edge[i] } else { 0.0 };
                f64::from(w[dims[i]]) + add
            });
        }
    }
}

/// A rank's plan as a blob, for the processes that do not drive it: home and total atoms, pulse
/// count, the home check's numbers ([`RankHomes`]: two sums of two words each, then whether an id
/// is bad and its index, id and previous id), then per pulse its atom offset, peer atom offset,
/// received atoms and index map (the rest of a pulse follows from the grid), then the rider's
/// length and bytes. No global ids: no process needs another's.
#[cfg(test)]
pub(super) fn plan_blob(plan: &RankPlan, homes: &RankHomes, rider: &[u8]) -> Result<Vec<u8>, PlanError> {
    plan_blob_into(plan, homes, rider, Vec::new())
}

/// [`plan_blob`] written into `spare`'s allocation.
fn plan_blob_into(plan: &RankPlan, homes: &RankHomes, rider: &[u8], mut spare: Vec<u8>) -> Result<Vec<u8>, PlanError> {
    spare.clear();
    let mut b = Blob(spare);
    b.0.reserve(4 * (10 + plan.pulses.iter().map(|p| 4 + p.spec.index_map.len()).sum::<usize>()) + rider.len());
    b.word(plan.home_atoms)?;
    b.word(plan.total_atoms)?;
    b.word(plan.pulses.len())?;
    let IdSums { first, second } = homes.sums;
    b.put(&[first as u32, (first >> 32) as u32, second as u32, (second >> 32) as u32]);
    let bad = homes.bad.map_or([0; 4], |h| [1, h.local, h.id, h.previous]);
    b.put(&bad);
    for p in &plan.pulses {
        b.word(p.spec.atom_offset)?;
        b.word(p.spec.peer_atom_offset)?;
        b.word(p.spec.recv_size)?;
        b.word(p.spec.index_map.len())?;
        b.put(&p.spec.index_map);
    }
    // The rider last: its length, then its bytes (none without a rider).
    b.word(rider.len())?;
    b.put(rider);
    Ok(b.0)
}

/// Rank `rank`'s plan from its blob ([`plan_blob`]): no global ids, its pulses filled in as the
/// builders fill them; its home check's numbers; the rider's bytes.
#[cfg(test)]
pub(super) fn read_plan(
    blob: &[u8],
    rank: usize,
    geo: &Decomposition,
    layout: &[(usize, usize)],
) -> Result<(RankPlan, RankHomes, Vec<u8>), PlanError> {
    read_plan_with(blob, rank, geo, layout, &mut Spare::default())
}

/// [`read_plan`] into spare arrays (index maps, the pulse list) where `spare` has them.
fn read_plan_with(
    blob: &[u8],
    rank: usize,
    geo: &Decomposition,
    layout: &[(usize, usize)],
    spare: &mut Spare,
) -> Result<(RankPlan, RankHomes, Vec<u8>), PlanError> {
    let mut rd = Reader::new(blob, TAG_PLAN, rank);
    let home_atoms = rd.word()?;
    let total_atoms = rd.word()?;
    let npulses = rd.word()?;
    if home_atoms > total_atoms || npulses != layout.len() {
        return Err(rd.bad(format!("{home_atoms} home atoms of {total_atoms}, {npulses} pulses where the grid has {}", layout.len())));
    }
    let sum = rd.take::<u32>(4)?;
    let bad = rd.take::<u32>(4)?;
    let bad = match bad[0] {
        0 => None,
        1 => Some(BadHome { local: bad[1], id: bad[2], previous: bad[3] }),
        f => return Err(rd.bad(format!("{f} where a bad home id's flag (0 or 1) belongs"))),
    };
    let word = |k: usize| u64::from(sum[k]) | (u64::from(sum[k + 1]) << 32);
    let homes = RankHomes { count: home_atoms, sums: IdSums { first: word(0), second: word(2) }, bad };
    let mut pulses = Spare::any(&mut spare.pulses);
    for &at in layout {
        let atom_offset = rd.word()?;
        let peer_atom_offset = rd.word()?;
        let recv_size = rd.word()?;
        let n = rd.word()?;
        let mut map = Spare::any(&mut spare.maps);
        rd.extend(n, &mut map)?;
        let mut pulse = pulse_plan(geo, rank, at, map, atom_offset, peer_atom_offset);
        pulse.spec.recv_size = recv_size;
        pulses.push(pulse);
    }
    let rider_len = rd.word()?;
    // Its bytes checked against what is left before anything is allocated for them.
    let rider = rd.next::<u8>(rider_len)?.to_vec();
    rd.finish()?;
    Ok((RankPlan { rank, home_atoms, total_atoms, global_ids: Vec::new(), pulses }, homes, rider))
}

/// A blob being written: words and arrays of plain data, back to back.
#[derive(Default)]
struct Blob(Vec<u8>);

impl Blob {
    /// A count or index as a 32-bit word (halo's atom indices are 32-bit).
    fn word(&mut self, v: usize) -> Result<(), PlanError> {
        let w = u32::try_from(v).map_err(|_| PlanError::TooManyAtoms { atoms: v })?;
        self.0.extend_from_slice(&w.to_ne_bytes());
        Ok(())
    }

    fn put<T: Pod>(&mut self, v: &[T]) {
        self.0.extend_from_slice(bytemuck::cast_slice(v));
    }
}

/// A blob being read, front to back; every read is checked against what is left, so a
/// malformed blob is an error naming the collective and the rank, never a panic.
struct Reader<'a> {
    bytes: &'a [u8],
    tag: &'a str,
    rank: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], tag: &'a str, rank: usize) -> Self {
        Self { bytes, tag, rank }
    }

    fn bad(&self, reason: String) -> PlanError {
        PlanError::Blob { tag: self.tag.to_string(), rank: self.rank, reason }
    }

    /// The next `n` items' bytes.
    fn next<T: Pod>(&mut self, n: usize) -> Result<&'a [u8], PlanError> {
        let size = std::mem::size_of::<T>();
        match n.checked_mul(size).filter(|&len| len <= self.bytes.len()) {
            Some(len) => {
                let (head, rest) = self.bytes.split_at(len);
                self.bytes = rest;
                Ok(head)
            }
            None => Err(self.bad(format!("{n} items of {size} bytes do not fit the {} bytes left", self.bytes.len()))),
        }
    }

    fn word(&mut self) -> Result<usize, PlanError> {
        let b = self.next::<u32>(1)?;
        Ok(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    fn take<T: Pod>(&mut self, n: usize) -> Result<Vec<T>, PlanError> {
        let mut out = Vec::with_capacity(n);
        self.extend(n, &mut out)?;
        Ok(out)
    }

    /// Appends the next `n` items to `out` (the blob need not be aligned for `T`): copied straight
    /// where the bytes are aligned for `T` (a blob's allocation is, and its arrays lie at multiples
    /// of 4 bytes), else through zeroed room.
    fn extend<T: Pod>(&mut self, n: usize, out: &mut Vec<T>) -> Result<(), PlanError> {
        let bytes = self.next::<T>(n)?;
        match bytemuck::try_cast_slice::<u8, T>(bytes) {
            Ok(items) => out.extend_from_slice(items),
            Err(_) => {
                let at = out.len();
                out.resize(at + n, T::zeroed());
                bytemuck::cast_slice_mut::<T, u8>(&mut out[at..]).copy_from_slice(bytes);
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<(), PlanError> {
        if self.bytes.is_empty() { Ok(()) } else { Err(self.bad(format!("{} bytes left over", self.bytes.len()))) }
    }
}
