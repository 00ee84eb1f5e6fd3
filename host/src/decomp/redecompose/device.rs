//! A redecomposition whose per-atom passes run where each rank's home atoms are (its GPU): the
//! same plan as [`super::redecompose_with`], bit for bit, with the host doing only what is
//! O(leavers + halo): the migration's collective, the selection of atoms received along earlier
//! dimensions, the later pulses and the plan's collective.
//!
//! A rank's device ([`HomeDevice`]) does the two per-atom phases:
//! 1. [`HomeDevice::migrate`]: wrap every home atom, find its owner, keep the stayers (in input
//!    order) on the device and hand back only the leavers (`Leaving::sort_out`'s work);
//! 2. [`HomeDevice::merge_and_select`]: merge the arrivals (sorted by id) into the stayers by
//!    global id (`Working::new`'s work), select every decomposed dimension's first pulse over the
//!    new home atoms (`select_wrapped_into` over the home part of the frame), and hand back the
//!    new home atoms' ids and wrapped positions and the selections.
//!
//! The velocities never come back: they stay on the device, merged in the order of the ids
//! (the [`super::Redecomposed`] of this path has empty `velocities`).

use super::{FromDevices, Leaving, RedecomposeScratch, Redecomposed, Spare, Working, local_index, migrate, plan_pulses};
use crate::decomp::grid::{Decomposition, RankGrid};
use crate::decomp::home_check::HomeIdFacts;
use crate::decomp::{PlanError, PulsePlan, Scan};
use crate::error::{HaloError, Result};
use crate::workers::Workers;
use kernels_gpu::abi::{Float3, MigrateLeaver};

/// A rank's new home atoms as its device leaves them after [`HomeDevice::merge_and_select`]:
/// global ids ascending and, where asked for, wrapped positions (read back into the arrays handed
/// in), and per decomposed dimension (ascending) the home indices its first pulse sends,
/// ascending, with their wrapped positions.
#[derive(Debug, Default)]
pub struct MergedHome {
    /// Global ids of the new home atoms, ascending.
    pub ids: Vec<u32>,
    /// Their positions wrapped into the box, where the merge was asked for them; else empty
    /// (they stay on the device: [`HomeDevice::read_home_positions`] reads them).
    pub wrapped: Vec<Float3>,
    /// Per decomposed dimension, the home atoms its first pulse sends (indices into `ids`).
    pub first_pulse: Vec<Vec<u32>>,
    /// Per decomposed dimension, the wrapped positions of the atoms of `first_pulse` (in its
    /// order): what the pulse sends of the home atoms.
    pub first_pulse_x: Vec<Vec<Float3>>,
    /// [`crate::decomp::scan`] of `wrapped` against `[0, edge)` along every dimension, when the
    /// device made it (on the GPU: [`crate::decomp::GpuExtent`]); handed on in
    /// [`super::Redecomposed::home_scans`].
    pub home_scan: Option<Scan>,
    /// The home check's facts of `ids` ([`HomeIdFacts`]), when the device made them (on the GPU:
    /// kernel `home_id_facts`, with the merge); the host then passes over the ids only to name a
    /// bad one.
    pub id_facts: Option<HomeIdFacts>,
}

/// Where one rank's home atoms are held between searches (its GPU, or a CPU model of it): the
/// two per-atom phases of a redecomposition. Both are the host's own arithmetic bit for bit:
/// the wrap and owner of `wrap_position` and `CellEdges::rank_of`, and the selection of
/// `select_for_pulse_into`.
/// A process's devices run each phase side by side on its search threads
/// ([`redecompose_on_devices`]), hence `Send`.
pub trait HomeDevice: Send {
    /// The rank (global index in the grid).
    fn rank(&self) -> usize;

    /// Phase 1: sorts out the home atoms, keeps the stayers, returns how many atoms the rank
    /// held and the leavers (input order). Errors: [`PlanError::NonFinitePosition`] for the
    /// first non-finite position in input order (it travels to every process), or a failure of
    /// the device (which does not).
    fn migrate(&mut self, geo: &Decomposition) -> Result<(usize, Vec<MigrateLeaver>)>;

    /// Phase 1's start, where the device runs it in the background: enqueues its per-atom passes
    /// and returns without waiting, so that the devices of one process run them side by side
    /// ([`redecompose_on_devices`] begins every device's phase 1 before it finishes any).
    /// [`Self::migrate`] with the same `geo` then finishes what was begun (and runs all of it when
    /// nothing was). The default begins nothing.
    fn begin_migrate(&mut self, _geo: &Decomposition) -> Result<()> {
        Ok(())
    }

    /// Phase 2: merges `arrivals` (sorted by id, unique, none a stayer's) into the stayers by
    /// id, selects the first pulses over the result, and returns them in `into`'s arrays
    /// (cleared first; their allocations reused): the new home atoms' ids, their positions only
    /// where `positions` asks for them, the first pulses' indices and the positions they send.
    fn merge_and_select(&mut self, geo: &Decomposition, arrivals: &[(u32, Float3, Float3)], positions: bool, into: MergedHome) -> Result<MergedHome>;

    /// Phase 2's start, as [`Self::begin_migrate`] is phase 1's: enqueues the merge of `arrivals`
    /// (sorted by id, as for [`Self::merge_and_select`]), the selection and their read-back, and
    /// returns without waiting. [`Self::merge_and_select`] with the same `geo`, `arrivals` and
    /// `positions` then finishes what was begun. The default begins nothing.
    fn begin_merge_and_select(&mut self, _geo: &Decomposition, _arrivals: &[(u32, Float3, Float3)], _positions: bool) -> Result<()> {
        Ok(())
    }

    /// The wrapped positions of the home atoms of the last [`Self::merge_and_select`], in their
    /// order, into `into` (cleared first): for a merge that left them on the device where the
    /// host needs them after all ([`redecompose_on_devices`]: their extent not exact).
    fn read_home_positions(&mut self, into: &mut Vec<Float3>) -> Result<()>;
}

/// [`super::redecompose_with`] for the ranks whose home atoms `devices` hold (one per entry of
/// `ranks`, in that order): the same plan and local positions, with the home atoms' velocities
/// left on the devices (`Redecomposed::homes[i].velocities` is empty; its ids are the new home
/// atoms'). Collective across processes as `redecompose_with` is, with the same collectives;
/// `rider` as there.
#[allow(clippy::too_many_arguments)]
pub fn redecompose_on_devices(
    grid: RankGrid,
    box_size: [f32; 3],
    cutoff: f32,
    atoms: usize,
    ranks: &[usize],
    devices: &mut [&mut dyn HomeDevice],
    home_positions: bool,
    all_gather: &mut super::Collective<'_>,
    rider: Option<&mut super::PlanRider<'_>>,
    workers: &Workers,
    scratch: &mut RedecomposeScratch,
) -> Result<Redecomposed> {
    let geo = Decomposition::new(grid, box_size, cutoff)?;
    if atoms > (u32::MAX / 2) as usize {
        return Err(PlanError::TooManyAtoms { atoms }.into());
    }
    let nranks = grid.num_ranks();
    let local_index = local_index(ranks, devices.len(), nranks)?;
    if let Some((&r, d)) = ranks.iter().zip(devices.iter()).find(|(r, d)| **r != d.rank()) {
        return Err(HaloError::InvalidInput(format!("the device given for rank {r} holds rank {}", d.rank())));
    }
    scratch.ranks.resize_with(ranks.len(), Default::default);
    scratch.spare.large = 4 * ranks.len() + 2 + (nranks - ranks.len().min(nranks));

    // 1. Owners on the devices; leavers out, arrivals in. Every device's passes are enqueued
    // before any is waited for: the devices of one process (ranks sharing a GPU, or several GPUs
    // in one process) run them side by side instead of one after the other, and each device's
    // host part (the enqueues, the wait, the read-back's copy) runs on a search thread of its own.
    let span = tracing::debug_span!("search.migrate").entered();
    workers.map(devices.iter_mut().map(|d| &mut **d).collect(), |d| d.begin_migrate(&geo)).into_iter().collect::<Result<Vec<_>>>()?;
    let mut leaving = Vec::with_capacity(devices.len());
    for migrated in workers.map(devices.iter_mut().map(|d| &mut **d).collect(), |d| d.migrate(&geo)) {
        leaving.push(match migrated {
            Ok((count, leavers)) => Leaving::from_leavers(count, &leavers),
            Err(HaloError::Plan(e @ PlanError::NonFinitePosition { .. })) => Leaving::failed(e),
            Err(e) => return Err(e),
        });
    }
    drop(span);
    let mut arrivals = migrate(&leaving, &local_index, atoms, all_gather, &mut scratch.spare)?;

    // The new home atoms in id order, merged and selected on the devices: again every device's
    // work begun before any is waited for.
    let span = tracing::debug_span!("search.merge").entered();
    for a in &mut arrivals {
        a.sort_unstable_by_key(|m| m.0);
    }
    let begun = tracing::debug_span!("search.merge.begin").in_scope(|| {
        workers.map(devices.iter_mut().map(|d| &mut **d).zip(&arrivals).collect(), |(d, a)| d.begin_merge_and_select(&geo, a, home_positions))
    });
    begun.into_iter().collect::<Result<Vec<_>>>()?;
    let intos: Vec<MergedHome> = (0..devices.len())
        .map(|_| {
            let spare = &mut scratch.spare;
            MergedHome {
                ids: Spare::any(&mut spare.ids),
                wrapped: Spare::any(&mut spare.float3),
                first_pulse: geo.grid.decomposed_dims().iter().map(|_| Spare::any(&mut spare.maps)).collect(),
                first_pulse_x: geo.grid.decomposed_dims().iter().map(|_| Spare::any(&mut spare.float3)).collect(),
                home_scan: None,
                id_facts: None,
            }
        })
        .collect();
    let parts = devices.iter_mut().map(|d| &mut **d).zip(&arrivals).zip(intos).map(|((d, a), into)| (d, a, into)).collect();
    let merges = workers.map(parts, |(d, a, into)| d.merge_and_select(&geo, a, home_positions, into));
    let mut work = Vec::with_capacity(devices.len());
    let mut home_maps = Vec::with_capacity(devices.len());
    let mut home_x = Vec::with_capacity(devices.len());
    let mut home_scans = Vec::with_capacity(devices.len());
    let mut home_facts = Vec::with_capacity(devices.len());
    // Along the decomposed dimensions a home scan must be exact for the pair search's zone
    // checks to take it instead of the positions (`Scan::exact_along`).
    let decomposed = std::array::from_fn(|d| geo.grid.dims[d] > 1);
    let working = tracing::debug_span!("search.merge.working").entered();
    for (d, merged) in devices.iter_mut().zip(merges) {
        let mut merged = merged?;
        let spare = &mut scratch.spare;
        let n = merged.ids.len();
        let facts_of = merged.id_facts.map_or(n, |f| f.count);
        let dims = geo.grid.decomposed_dims().len();
        let positions_ok = merged.wrapped.len() == n || (!home_positions && merged.wrapped.is_empty());
        let sent_ok = merged.first_pulse_x.len() == dims && merged.first_pulse.iter().zip(&merged.first_pulse_x).all(|(m, x)| m.len() == x.len());
        if !positions_ok || merged.first_pulse.len() != dims || !sent_ok || facts_of != n {
            return Err(HaloError::InvalidInput(format!(
                "rank {}: the device merged {n} ids, {} positions (asked for: {home_positions}) and {} first pulses with {} position arrays for {dims} \
                 decomposed dimensions, with the facts of {facts_of} ids",
                d.rank(),
                merged.wrapped.len(),
                merged.first_pulse.len(),
                merged.first_pulse_x.len(),
            )));
        }
        // The home positions stay on the device unless the host needs them after all: where no
        // exact scan of them came back, the zone checks pass over them (rare: a home atom at a
        // zero coordinate along a decomposed dimension, or one outside the box).
        let scanned = merged.home_scan.is_some_and(|s| s.in_range && s.exact_along(decomposed));
        if merged.wrapped.is_empty() && n > 0 && !scanned {
            let _span = tracing::debug_span!("search.merge.positions").entered();
            d.read_home_positions(&mut merged.wrapped)?;
            if merged.wrapped.len() != n {
                return Err(HaloError::InvalidInput(format!(
                    "rank {}: the device read back {} home positions of {n}",
                    d.rank(),
                    merged.wrapped.len()
                )));
            }
        }
        home_scans.push(merged.home_scan);
        home_facts.push(merged.id_facts);
        let (w, maps, xs) = Working::from_merged(d.rank(), merged, Spare::any(&mut spare.pulses), box_size);
        work.push(w);
        home_maps.push(maps);
        home_x.push(xs);
    }
    drop(working);
    drop(span);
    let found = FromDevices { maps: &home_maps, x: &home_x, facts: &home_facts };
    let done = plan_pulses(&geo, atoms, ranks, work, found, all_gather, rider, workers, scratch);
    for maps in home_maps {
        for m in maps {
            Spare::give(&mut scratch.spare.maps, m, super::SPARE_SMALL);
        }
    }
    for xs in home_x {
        for x in xs {
            scratch.spare.give_float3(x);
        }
    }
    done.map(|d| Redecomposed { home_scans, ..d })
}

impl Leaving {
    /// A rank's migration as its device sorted it out: `count` atoms held, `leavers` leaving.
    fn from_leavers(count: usize, leavers: &[MigrateLeaver]) -> Self {
        Self {
            dest: leavers.iter().map(|l| l.owner).collect(),
            ids: leavers.iter().map(|l| l.id).collect(),
            positions: leavers.iter().map(|l| l.x).collect(),
            velocities: leavers.iter().map(|l| l.v).collect(),
            count,
            error: None,
        }
    }

    /// A rank whose input failed with `e` (which travels in the migration's collective).
    fn failed(e: PlanError) -> Self {
        Self { dest: Vec::new(), ids: Vec::new(), positions: Vec::new(), velocities: Vec::new(), count: 0, error: Some(e) }
    }
}

impl Working {
    /// A rank's working state from its device's merged home atoms (no velocities: they stay on
    /// the device) and the home parts of its first pulses, handed back apart.
    /// The working arrays of a rank's merged home atoms, with its first pulses' home parts and
    /// the positions they send. Where the merge left the home positions on the device
    /// (`merged.wrapped` empty), the working positions start after the home atoms
    /// (`wrapped_from`): the pulses read the home atoms' positions from what they send.
    fn from_merged(rank: usize, merged: MergedHome, pulses: Vec<PulsePlan>, box_size: [f32; 3]) -> (Self, Vec<Vec<u32>>, Vec<Vec<Float3>>) {
        let MergedHome { mut ids, mut wrapped, first_pulse, first_pulse_x, .. } = merged;
        let n = ids.len();
        let wrapped_from = if wrapped.is_empty() { n } else { 0 };
        // Room for a halo, as `Working::new` makes.
        ids.reserve(n / 2);
        wrapped.reserve(n / 2);
        let mut crossed = Vec::with_capacity(n + n / 2);
        crossed.resize(n, 0);
        (Self { rank, home: n, ids, wrapped, wrapped_from, velocities: Vec::new(), crossed, pulses, box_size }, first_pulse, first_pulse_x)
    }
}
