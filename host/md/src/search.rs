//! The host part of a search step: the new decomposition of the whole system (the same on every
//! process), and for each rank this process drives its local atoms, cluster grid, cluster-pair
//! lists and home arrays, on host threads that live as long as the run ([`HostSearch`]). The
//! time of each part is kept.

use crate::abi::Float3;
use crate::decomp::{
    Collective, HaloPlan, HomeAtoms, HomeDevice, PlanRider, PlanScratch, RankGrid, RedecomposeScratch, Redecomposed, Scan, redecompose_with,
    wrap_positions,
};
use crate::error::{HaloError, Result};
use crate::nbnxm::{ClusterGrid, HomeChecked, ListSetup, LocalAtoms, PairSearch, SearchOptions, ZoneScratch, first_at_or_above};
use crate::system::MolecularSystem;
use crate::workers::Workers;
use std::time::{Duration, Instant};

/// Where a rank's search builds its cluster grid and lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListsOn {
    /// Grid and lists on host threads.
    Host,
    /// The grid on the host, the lists on the GPU.
    Gpu,
    /// Both on the GPU, from the local atoms the host lays out.
    GpuGrid,
}

/// A rank's search as the host leaves it: grid and lists, the grid alone, or the local atoms for
/// the GPU to sort.
pub enum RankLists {
    /// Grid and both lists from the host search.
    Host(PairSearch),
    /// The grid only: the GPU searches the lists ([`crate::nbnxm::NbnxmGpu::update_on_gpu`]).
    Gpu(ClusterGrid),
    /// The local atoms: the GPU builds the grid and searches the lists
    /// ([`crate::nbnxm::NbnxmGpu::update_local`]).
    GpuGrid(LocalAtoms),
}

impl RankLists {
    /// Home atoms of the rank.
    pub fn home_atoms(&self) -> usize {
        match self {
            Self::Host(s) => s.grid.home_atoms,
            Self::Gpu(g) => g.home_atoms,
            Self::GpuGrid(a) => a.home,
        }
    }

    /// Local atoms (home and halo) of the rank.
    pub fn atoms(&self) -> usize {
        match self {
            Self::Host(s) => s.grid.atoms,
            Self::Gpu(g) => g.atoms,
            Self::GpuGrid(a) => a.len(),
        }
    }
}

/// What one rank needs from a search: its grid (and lists) and its home atoms' arrays.
pub struct RankSearch {
    /// Global rank.
    pub rank: usize,
    /// Grid, and lists when searched on the host.
    pub lists: RankLists,
    /// Home coordinates (wrapped: what the exchange expects in `x[0..home)`). Empty with
    /// [`RankLists::GpuGrid`]: the local atoms hold them (`positions[..home]`), and the GPU copies
    /// them from its grid's upload of those ([`crate::nbnxm::NbnxmGpu::update_local_into`]).
    pub home_x: Vec<Float3>,
    /// Home velocities. Empty when [`Self::home_on_device`].
    pub home_v: Vec<Float3>,
    /// The home atoms are on the rank's GPU already, merged there by its redecomposition
    /// (`halo::decomp::GpuHome`): their velocities, not in [`Self::home_v`], and their positions,
    /// bit for bit the local atoms' `positions[..home]` (with [`RankLists::GpuGrid`] the grid
    /// copies them on the device instead of uploading them).
    pub home_on_device: bool,
    /// `1 / m` of the home atoms. Empty with [`RankLists::GpuGrid`], as [`Self::home_x`]: the GPU
    /// makes them from the home types it copied ([`inverse_masses_by_type`], `MdRank::update`).
    pub inv_mass: Vec<f32>,
    /// Atom types of the home atoms. Empty with [`RankLists::GpuGrid`], as [`Self::home_x`].
    pub home_types: Vec<u32>,
    /// The home atoms' zone checks, done on the GPU by its redecomposition ([`RankLists::GpuGrid`]
    /// only): the GPU grid's checks then pass over the halo atoms alone.
    pub(crate) home_checked: Option<HomeChecked>,
    /// Time to build the local atoms.
    pub atoms_time: Duration,
    /// Time to build the grid.
    pub grid_time: Duration,
    /// Time of the host search (zero when the GPU searches).
    pub lists_time: Duration,
}

/// Where the time of search steps went (host clock, summed over search steps; the GPU is idle
/// during all of it).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct SearchTimes {
    /// Search steps.
    pub count: u64,
    /// Everything from the end of the previous step's GPU work to the first launch of the search
    /// step (includes the parts below).
    pub total: Duration,
    /// Home atoms back into the system (device copies, barrier, host copies).
    pub gather: Duration,
    /// The halo plan of all ranks.
    pub plan: Duration,
    /// Local atoms, cluster grids and lists of this process's ranks (wall time; ranks in parallel).
    pub lists: Duration,
    /// Of which: local atoms, grid, lists (the slowest rank's).
    pub atoms: Duration,
    /// Cluster grid (slowest rank).
    pub grid: Duration,
    /// Cluster-pair lists: the slowest rank's host search, or the GPU searches (both passes, the
    /// grid's upload and the host's layout between them; with the grid sorted on the GPU also the
    /// staging or copy of the home velocities and the launch that makes their masses, which
    /// overlap the passes).
    pub pairs: Duration,
    /// Of `pairs`, with lists searched on the GPU: the host's waits for the grid's and the lists'
    /// first passes (their GPU time that no host work hid; every local rank's).
    pub pairs_wait: Duration,
    /// Exchange replan (or rebuild) and the other uploads.
    pub upload: Duration,
    /// Of `plan`, when planned from the ranks' own atoms: the time inside the all-gathers between
    /// processes (their waits for the slowest process included).
    pub plan_gathers: Duration,
    /// Of `plan`, when the per-atom passes ran on the GPUs: the host's time in them (enqueues,
    /// the waits for the GPUs and the read-backs). With several local ranks their calls of a
    /// phase run side by side on the search threads, and every rank's passes are enqueued before
    /// any is waited for: this is the wall time covered by at least one rank's call, not the sum
    /// of each rank's.
    pub plan_device: Duration,
}

impl SearchTimes {
    /// Adds another search's times.
    pub fn add(&mut self, o: &SearchTimes) {
        self.count += o.count;
        self.total += o.total;
        self.gather += o.gather;
        self.plan += o.plan;
        self.lists += o.lists;
        self.atoms += o.atoms;
        self.grid += o.grid;
        self.pairs += o.pairs;
        self.pairs_wait += o.pairs_wait;
        self.upload += o.upload;
        self.plan_gathers += o.plan_gathers;
        self.plan_device += o.plan_device;
    }
}

/// What the host part of search steps keeps from one search to the next: its worker threads
/// (started once) and the big working arrays of the plan and of each rank's local atoms and grid
/// (their allocations reused). Nothing in it changes a search's result.
#[derive(Debug, Default)]
pub struct HostSearch {
    /// The search's host threads, shared by every phase and rank.
    workers: Workers,
    /// The plan's working arrays.
    plan: PlanScratch,
    /// The working arrays of a plan from the ranks' own atoms.
    redecompose: RedecomposeScratch,
    /// Each local rank's buffers, in the order of the ranks searched.
    ranks: Vec<RankBuffers>,
}

/// One rank's working arrays kept across searches.
#[derive(Debug, Default)]
struct RankBuffers {
    /// Local atoms.
    atoms: LocalAtoms,
    /// The cluster grid's working arrays.
    grid: ZoneScratch,
    /// The home arrays of the last search, back from [`HostSearch::recycle`] (emptied).
    home: HomeArrays,
}

/// A rank's home arrays ([`RankSearch`]'s), kept between searches for their allocations.
#[derive(Debug, Default)]
struct HomeArrays {
    x: Vec<Float3>,
    v: Vec<Float3>,
    inv_mass: Vec<f32>,
    types: Vec<u32>,
}

impl HostSearch {
    /// Searches on `threads` host threads, started now (1: on the calling thread only).
    pub fn new(threads: usize) -> Result<Self> {
        Ok(Self { workers: Workers::new(threads)?, ..Self::default() })
    }

    /// The host threads.
    pub fn workers(&self) -> &Workers {
        &self.workers
    }

    /// Wraps the system's positions into the box and builds the plan of `grid` for `setup.rlist`.
    pub fn plan(&mut self, system: &mut MolecularSystem, grid: RankGrid, setup: &ListSetup) -> Result<HaloPlan> {
        wrap_positions(&mut system.positions, system.box_size);
        HaloPlan::build_with(system, grid, setup.rlist, &self.workers, &mut self.plan).map_err(|e| HaloError::InvalidInput(e.to_string()))
    }

    /// The plan of `grid` for `setup.rlist` from this process's ranks `ranks` and their home atoms
    /// `homes` alone, with `all_gather` between processes ([`redecompose_with`]), for a system of
    /// `atoms` atoms in a box of `box_size`; `rider` as there.
    #[allow(clippy::too_many_arguments)]
    pub fn redecompose(
        &mut self,
        grid: RankGrid,
        box_size: [f32; 3],
        setup: &ListSetup,
        atoms: usize,
        ranks: &[usize],
        homes: Vec<HomeAtoms>,
        all_gather: &mut Collective<'_>,
        rider: Option<&mut PlanRider<'_>>,
    ) -> Result<Redecomposed> {
        redecompose_with(grid, box_size, setup.rlist, atoms, ranks, homes, all_gather, rider, &self.workers, &mut self.redecompose)
    }

    /// [`Self::redecompose`] with the per-atom phases on the ranks' GPUs (`devices`, one per
    /// entry of `ranks`): the same plan; the home velocities stay on the GPUs, and so do the home
    /// positions unless `home_positions` asks for them (a GPU grid needs none: its local atoms
    /// hold the halo atoms' positions only, [`LocalAtoms::positions_from`]).
    #[allow(clippy::too_many_arguments)]
    pub fn redecompose_on_devices(
        &mut self,
        grid: RankGrid,
        box_size: [f32; 3],
        setup: &ListSetup,
        atoms: usize,
        ranks: &[usize],
        devices: &mut [&mut dyn HomeDevice],
        home_positions: bool,
        all_gather: &mut Collective<'_>,
        rider: Option<&mut PlanRider<'_>>,
    ) -> Result<Redecomposed> {
        crate::decomp::redecompose_on_devices(
            grid,
            box_size,
            setup.rlist,
            atoms,
            ranks,
            devices,
            home_positions,
            all_gather,
            rider,
            &self.workers,
            &mut self.redecompose,
        )
    }

    /// Empty home atom arrays with room for `n` atoms, for the next [`Self::redecompose`]'s input
    /// (spare arrays of earlier ones where there are: their allocations are reused).
    pub fn home_arrays(&mut self, n: usize) -> HomeAtoms {
        self.redecompose.home_arrays(n)
    }

    /// Takes back the arrays of a [`Self::redecompose`]'s home atoms and local positions once
    /// they are used, for the next one to refill.
    pub fn recycle_atoms(&mut self, homes: Vec<HomeAtoms>, local_positions: Vec<Vec<Float3>>) {
        self.redecompose.recycle_atoms(homes, local_positions);
    }

    /// Takes back the arrays of a plan no longer used (global ids, index maps) for the next
    /// [`Self::redecompose`] to refill; kept only while searches redecompose.
    pub fn recycle_plan(&mut self, plan: HaloPlan) {
        self.redecompose.recycle_plan(plan);
    }

    /// Takes back the local atoms' arrays of a search's results (handed out with
    /// [`ListsOn::GpuGrid`]) and every result's home arrays for the next search to reuse; `found`
    /// in the order it was returned.
    pub fn recycle(&mut self, found: Vec<RankSearch>) {
        for (buf, r) in self.ranks.iter_mut().zip(found) {
            if let RankLists::GpuGrid(atoms) = r.lists {
                buf.atoms = atoms;
            }
            let mut home = HomeArrays { x: r.home_x, v: r.home_v, inv_mass: r.inv_mass, types: r.home_types };
            home.x.clear();
            home.v.clear();
            home.inv_mass.clear();
            home.types.clear();
            buf.home = home;
        }
    }

    /// Local atoms, the grid and lists where `on` says, and home arrays of each rank in `ranks`,
    /// the ranks and each rank's phases sharing the workers.
    pub fn rank_searches(
        &mut self,
        plan: &HaloPlan,
        system: &MolecularSystem,
        ranks: &[usize],
        setup: &ListSetup,
        on: ListsOn,
    ) -> Result<Vec<RankSearch>> {
        self.ranks.resize_with(ranks.len(), RankBuffers::default);
        let workers = &self.workers;
        let one = |(&rank, buf): (&usize, &mut RankBuffers)| {
            let t = Instant::now();
            // Unvalidated: every grid build below validates the atoms itself.
            LocalAtoms::from_plan_unvalidated_into(plan, rank, &system.positions, &system.types, workers, &mut buf.atoms).map_err(bad)?;
            let atoms_time = t.elapsed();
            let home = &plan.ranks[rank].global_ids[..buf.atoms.home];
            buf.home.v.clear();
            buf.home.v.extend(home.iter().map(|&g| system.velocities[g as usize]));
            rank_search(rank, system, setup, on, workers, buf, atoms_time)
        };
        workers.map(ranks.iter().zip(self.ranks.iter_mut()).collect(), one).into_iter().collect()
    }

    /// [`Self::rank_searches`] for this process's ranks `ranks` (those `done` was built for, in
    /// its order) straight from a [`Self::redecompose`]: the same searches, with each rank's
    /// local atoms built from its own local positions ([`LocalAtoms::from_local_into`]) and its
    /// home velocities taken from `done`, where the gathered path scatters both into a whole
    /// system copy and gathers them back by id. `system` gives the atoms' types and masses only
    /// (its positions and velocities are not read). `done`'s arrays go back to the scratch for
    /// the next redecomposition; its plan is returned with the searches.
    pub fn rank_searches_redecomposed(
        &mut self,
        done: Redecomposed,
        system: &MolecularSystem,
        ranks: &[usize],
        setup: &ListSetup,
        on: ListsOn,
        v_on_device: bool,
    ) -> Result<(HaloPlan, Vec<RankSearch>)> {
        let Redecomposed { plan, mut homes, mut local_positions, local_positions_from, home_scans, .. } = done;
        if homes.len() != ranks.len() || local_positions.len() != ranks.len() || local_positions_from.len() != ranks.len() {
            return Err(HaloError::InvalidInput(format!(
                "a redecomposition of {} ranks ({} local position arrays, {} starts) for {} ranks",
                homes.len(),
                local_positions.len(),
                local_positions_from.len(),
                ranks.len()
            )));
        }
        self.ranks.resize_with(ranks.len(), RankBuffers::default);
        let workers = &self.workers;
        let plan_ref = &plan;
        let one = |RankPart { rank, buf, home, local, from, scan }: RankPart<'_>| {
            let t = Instant::now();
            // Unvalidated: every grid build below validates the atoms itself (a GPU grid's only
            // the halo atoms where the redecomposition found the home atoms' extent on the GPU).
            // Where the home atoms were merged on the GPU and it builds the grid, it makes their
            // types there from their ids (`MdRank::set_types_by_id`): none gathered here.
            let home_types_on_gpu = v_on_device && on == ListsOn::GpuGrid;
            let checked = tracing::debug_span!("search.local_atoms.atoms")
                .in_scope(|| {
                    LocalAtoms::from_local_scanned_into(plan_ref, rank, local, scan, &system.types, home_types_on_gpu, workers, &mut buf.atoms)
                })
                .map_err(bad)?;
            if buf.atoms.positions_from != from {
                return Err(HaloError::InvalidInput(format!(
                    "rank {rank}: the redecomposition held local positions from atom {from}, the local atoms from {}",
                    buf.atoms.positions_from
                )));
            }
            let atoms_time = t.elapsed();
            let want = if v_on_device { 0 } else { buf.atoms.home };
            if home.velocities.len() != want {
                return Err(HaloError::InvalidInput(format!(
                    "rank {rank}: {} home velocities on the host for {} home atoms",
                    home.velocities.len(),
                    buf.atoms.home
                )));
            }
            // The redecomposition's velocities are the home atoms' in order: swapped in, the spare
            // array out to the scratch.
            std::mem::swap(&mut buf.home.v, &mut home.velocities);
            let mut found =
                tracing::debug_span!("search.local_atoms.rank_search").in_scope(|| rank_search(rank, system, setup, on, workers, buf, atoms_time))?;
            found.home_on_device = v_on_device;
            found.home_checked = checked.filter(|_| matches!(found.lists, RankLists::GpuGrid(_)));
            Ok(found)
        };
        let scans = (0..ranks.len()).map(|i| home_scans.get(i).copied().flatten());
        let parts = ranks
            .iter()
            .zip(self.ranks.iter_mut())
            .zip(homes.iter_mut())
            .zip(local_positions.iter_mut())
            .zip(&local_positions_from)
            .zip(scans)
            .map(|(((((&rank, buf), home), local), &from), scan)| RankPart { rank, buf, home, local, from, scan })
            .collect();
        let found = workers.map(parts, one).into_iter().collect::<Result<Vec<_>>>();
        self.redecompose.recycle_atoms(homes, local_positions);
        Ok((plan, found?))
    }
}

/// One local rank's share of a redecomposed search ([`HostSearch::rank_searches_redecomposed`]):
/// its buffers, its new home atoms and local positions, and its home atoms' scan when the
/// redecomposition made one.
struct RankPart<'a> {
    rank: usize,
    buf: &'a mut RankBuffers,
    home: &'a mut HomeAtoms,
    local: &'a mut Vec<Float3>,
    /// The first local atom whose position `local` holds (`Redecomposed::local_positions_from`).
    from: usize,
    scan: Option<Scan>,
}

/// A local atoms error as the search reports it.
fn bad(e: crate::nbnxm::NbnxmError) -> HaloError {
    HaloError::InvalidInput(e.to_string())
}

/// Rank `rank`'s search (see [`HostSearch::rank_searches`]) on `workers`, once `buf` holds its
/// local atoms (built in `atoms_time`) and its home velocities: the grid and lists where `on`
/// says, and the other home arrays, in `buf`'s arrays: the coordinates, types and `1 / m` unless
/// the GPU builds the grid (it copies the first two from its own upload of the local atoms and
/// makes the masses from the types).
fn rank_search(
    rank: usize,
    system: &MolecularSystem,
    setup: &ListSetup,
    on: ListsOn,
    workers: &Workers,
    buf: &mut RankBuffers,
    atoms_time: Duration,
) -> Result<RankSearch> {
    let mut home = std::mem::take(&mut buf.home);
    let n = buf.atoms.home;
    let home_types = &buf.atoms.types[..n];
    if on != ListsOn::GpuGrid {
        // Only a GPU grid takes local atoms whose home positions stayed on the GPU.
        buf.atoms.check_positions_held().map_err(bad)?;
        home.x.extend_from_slice(&buf.atoms.positions[..n]);
        home.types.extend_from_slice(home_types);
        inverse_masses_into(rank, home_types, &inverse_masses_by_type(system), &mut home.inv_mass)?;
    }
    let atoms = &buf.atoms;
    let (lists, grid_time, lists_time) = match on {
        // The local atoms themselves (their arrays return through `HostSearch::recycle`).
        ListsOn::GpuGrid => (RankLists::GpuGrid(std::mem::take(&mut buf.atoms)), Duration::ZERO, Duration::ZERO),
        ListsOn::Gpu => {
            let t = Instant::now();
            let grid = ClusterGrid::build_into(atoms, workers, &mut buf.grid).map_err(bad)?;
            (RankLists::Gpu(grid), t.elapsed(), Duration::ZERO)
        }
        ListsOn::Host => {
            let search = PairSearch::build_into(atoms, &SearchOptions::new(setup.rlist), workers, &mut buf.grid).map_err(bad)?;
            let (g, l) = (search.timing.grid, search.timing.lists);
            (RankLists::Host(search), g, l)
        }
    };
    Ok(RankSearch {
        rank,
        home_x: home.x,
        home_on_device: false,
        home_v: home.v,
        inv_mass: home.inv_mass,
        home_types: home.types,
        lists,
        home_checked: None,
        atoms_time,
        grid_time,
        lists_time,
    })
}

/// `1 / m` per atom type, as `1 / system.mass(atom)` gives it per atom (the same bits): the table
/// the host's home arrays and the GPU's (`abi::INVERSE_MASSES`) both look the types up in.
pub fn inverse_masses_by_type(system: &MolecularSystem) -> Vec<f32> {
    system.atom_types.iter().map(|t| (1.0 / t.mass) as f32).collect()
}

/// Appends `inv[t]` for every type `t` of rank `rank`'s home atoms `types` to `out`: the types
/// checked at once, then a plain gather (a checked push per atom was most of the home arrays'
/// host time). A type beyond `inv` is an error naming the first such atom.
fn inverse_masses_into(rank: usize, types: &[u32], inv: &[f32], out: &mut Vec<f32>) -> Result<()> {
    if let Some((k, t)) = first_at_or_above(types, inv.len()) {
        return Err(HaloError::InvalidInput(format!("home atom {k} of rank {rank} has type {t} of {}", inv.len())));
    }
    out.extend(types.iter().map(|&t| inv[t as usize]));
    Ok(())
}

/// The default number of search threads of a process that runs one PE: one. On two H200s no count
/// beat one thread beyond the run-to-run spread (docs/results/nbnxm/search-threads.log, rows of a
/// build that did not check them), and in checked rows of two PEs sharing one H100 at 45,000 atoms
/// one thread gave 81.1–84.1 µs per step against 84.8–86.2 with four
/// (docs/results/nbnxm/search-choices-ab-h100.log). With the pool whose caller works, one, two and
/// four threads stayed within one H100 host's spread (docs/results/nbnxm/search-workers-threads-h100.log).
pub const DEFAULT_SEARCH_THREADS_PE: usize = 1;

/// The default number of search threads of a process that runs every rank itself (one process,
/// one or several GPUs): four. Chosen on two H200s when the grid and the redecomposition's passes
/// ran on the host (the host's grid of 45,000 home atoms took a quarter less with four threads).
/// With those passes on the GPU, checked rows on one H100 favour one thread for two ranks at 45,000
/// atoms (median 82.6 against 85.8 µs, 7 of 8 pairs; docs/results/nbnxm/search-choices-ab-h100.log),
/// but once the ranks' GPU calls ran on threads of their own, one and four threads were even on
/// 2x1x1 and four ahead with more ranks: searches of 1.54–1.61 against 1.65–1.82 ms on 2x2x1 and
/// 2.71–2.92 against 3.54–3.76 ms on 2x2x2 at 45,000 atoms on one H100
/// (docs/results/nbnxm/search-threads-ranks-h100.log). With the pool whose caller works, two, four
/// and eight threads stayed within 1.5 µs of one another on 2x1x1 at 45,000 atoms
/// (docs/results/nbnxm/search-workers-threads-h100.log).
pub const DEFAULT_SEARCH_THREADS_ONE_PROCESS: usize = 4;

/// The search threads of a run: `asked`, or when it is 0 the default for how the ranks are driven
/// ([`DEFAULT_SEARCH_THREADS_PE`], [`DEFAULT_SEARCH_THREADS_ONE_PROCESS`]).
pub fn search_threads(asked: usize, one_pe_per_process: bool) -> usize {
    match (asked, one_pe_per_process) {
        (0, true) => DEFAULT_SEARCH_THREADS_PE,
        (0, false) => DEFAULT_SEARCH_THREADS_ONE_PROCESS,
        (n, _) => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nbnxm::DEFAULT_DRIFT_TOLERANCE;

    /// What a rank's search found, without its times.
    #[allow(clippy::type_complexity)]
    fn found(
        r: &RankSearch,
    ) -> (usize, Option<ClusterGrid>, Option<LocalAtoms>, Option<[crate::nbnxm::ClusterPairList; 2]>, Vec<Float3>, Vec<Float3>, Vec<f32>, Vec<u32>)
    {
        let (grid, atoms, lists) = match &r.lists {
            RankLists::Host(s) => (Some(s.grid.clone()), None, Some([s.local.clone(), s.nonlocal.clone()])),
            RankLists::Gpu(g) => (Some(g.clone()), None, None),
            RankLists::GpuGrid(a) => (None, Some(a.clone()), None),
        };
        (r.rank, grid, atoms, lists, r.home_x.clone(), r.home_v.clone(), r.inv_mass.clone(), r.home_types.clone())
    }

    #[test]
    fn inverse_masses_follow_the_types_and_a_type_beyond_the_table_names_its_atom() {
        let inv = [0.5f32, 0.25, 0.125];
        let mut out = vec![9.0];
        inverse_masses_into(3, &[2, 0, 1, 1, 0], &inv, &mut out).unwrap();
        assert_eq!(out, [9.0, 0.125, 0.5, 0.25, 0.25, 0.5], "appended, in the atoms' order");
        inverse_masses_into(3, &[], &[], &mut out).unwrap();
        assert_eq!(out.len(), 6, "no atoms, no table: nothing to do");
        let e = inverse_masses_into(3, &[1, 0, 7, 3], &inv, &mut out).unwrap_err().to_string();
        assert!(e.contains("home atom 2 of rank 3 has type 7 of 3"), "{e}");
        let e = inverse_masses_into(0, &[0], &[], &mut out).unwrap_err().to_string();
        assert!(e.contains("home atom 0 of rank 0 has type 0 of 0"), "{e}");
    }

    #[test]
    fn the_default_thread_count_depends_on_how_the_ranks_are_driven() {
        assert_eq!(search_threads(0, true), DEFAULT_SEARCH_THREADS_PE);
        assert_eq!(search_threads(0, false), DEFAULT_SEARCH_THREADS_ONE_PROCESS);
        assert_eq!(search_threads(3, true), 3);
        assert_eq!(search_threads(3, false), 3);
    }

    #[test]
    fn a_kept_host_search_finds_what_a_fresh_one_does_on_any_thread_count() {
        let big = MolecularSystem::generate(12_000, 21).unwrap();
        let small = MolecularSystem::generate(3_000, 22).unwrap();
        let cases = [
            (&big, [2, 2, 1], vec![0, 3], ListsOn::Gpu),
            (&small, [2, 1, 1], vec![1], ListsOn::Host),
            (&big, [1, 1, 1], vec![0], ListsOn::Gpu),
            (&big, [2, 2, 1], vec![2, 1], ListsOn::Host),
            (&small, [2, 2, 1], vec![3, 0], ListsOn::GpuGrid),
        ];
        for threads in [1, 2, 3] {
            let mut kept = HostSearch::new(threads).unwrap();
            assert_eq!(kept.workers().threads(), threads);
            for (sys, dims, ranks, on) in &cases {
                let setup = ListSetup::for_system(sys, 1.0, 0.002, 100, 10, DEFAULT_DRIFT_TOLERANCE).unwrap();
                let grid = RankGrid::new(*dims).unwrap();
                let (mut a, mut b) = ((*sys).clone(), (*sys).clone());
                let mut fresh = HostSearch::new(1).unwrap();
                let (pa, pb) = (kept.plan(&mut a, grid, &setup).unwrap(), fresh.plan(&mut b, grid, &setup).unwrap());
                assert_eq!(pa, pb);
                let got = kept.rank_searches(&pa, &a, ranks, &setup, *on).unwrap();
                let want = fresh.rank_searches(&pb, &b, ranks, &setup, *on).unwrap();
                assert_eq!(got.iter().map(found).collect::<Vec<_>>(), want.iter().map(found).collect::<Vec<_>>(), "{threads} threads, {dims:?}");
            }
        }
    }

    #[test]
    fn searches_from_a_redecomposition_equal_those_from_the_gathered_system() {
        use rand::{Rng, SeedableRng};
        let sys = MolecularSystem::generate(8_000, 23).unwrap();
        let setup = ListSetup::for_system(&sys, 1.0, 0.002, 100, 10, DEFAULT_DRIFT_TOLERANCE).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for threads in [1, 3] {
            // One kept host search through several searches (its buffers recycled in between).
            let (mut kept, mut gathered) = (HostSearch::new(threads).unwrap(), HostSearch::new(threads).unwrap());
            for (dims, ranks, on) in [
                ([2, 1, 1], vec![0, 1], ListsOn::GpuGrid),
                ([2, 2, 1], vec![3, 0, 2, 1], ListsOn::GpuGrid),
                ([2, 2, 2], (0..8).collect::<Vec<_>>(), ListsOn::Gpu),
                ([3, 1, 1], vec![1, 2, 0], ListsOn::Host),
                ([2, 1, 1], vec![1, 0], ListsOn::GpuGrid),
            ] {
                let grid = RankGrid::new(dims).unwrap();
                let before = HaloPlan::from_positions(&sys.positions, sys.box_size, grid, setup.rlist).unwrap();
                // The atoms moved (some across cells and the periodic boundary) with new velocities.
                let b = sys.box_size;
                let positions: Vec<Float3> = sys
                    .positions
                    .iter()
                    .map(|p| {
                        Float3::new(p.x + rng.random_range(-0.2..0.2) + b[0] * rng.random_range(-1..2) as f32, p.y + rng.random_range(-0.2..0.2), p.z)
                    })
                    .collect();
                let velocities: Vec<Float3> = sys.velocities.iter().map(|v| Float3::new(v.x, v.y + rng.random_range(-1.0..1.0), v.z)).collect();
                let homes = ranks
                    .iter()
                    .map(|&r| {
                        let ids = before.ranks[r].global_ids[..before.ranks[r].home_atoms].to_vec();
                        let mut h = kept.home_arrays(ids.len());
                        h.positions.extend(ids.iter().map(|&i| positions[i as usize]));
                        h.velocities.extend(ids.iter().map(|&i| velocities[i as usize]));
                        h.ids = ids;
                        h
                    })
                    .collect();
                // One process drives every rank: its blobs (in the order of `ranks`) are every rank's, by rank.
                let mut one_process = |_: &str, mine: Vec<Vec<u8>>| {
                    let mut all = vec![Vec::new(); ranks.len()];
                    ranks.iter().zip(mine).for_each(|(&r, b)| all[r] = b);
                    Ok(all)
                };
                let done = kept.redecompose(grid, sys.box_size, &setup, sys.len(), &ranks, homes, &mut one_process, None).unwrap();
                // `sys` keeps its old positions and velocities: the redecomposed path must not read them.
                let (plan, got) =
                    kept.rank_searches_redecomposed(done, &sys, &ranks, &setup, on, false).map_err(|e| format!("{dims:?} {threads}: {e}")).unwrap();
                let mut moved = MolecularSystem { positions, velocities, ..sys.clone() };
                let want_plan = gathered.plan(&mut moved, grid, &setup).unwrap();
                assert_eq!(plan, want_plan, "{dims:?}");
                let want = gathered.rank_searches(&want_plan, &moved, &ranks, &setup, on).unwrap();
                let bits =
                    |r: &RankSearch| r.home_x.iter().chain(&r.home_v).map(|p| [p.x.to_bits(), p.y.to_bits(), p.z.to_bits()]).collect::<Vec<_>>();
                assert_eq!(got.iter().map(bits).collect::<Vec<_>>(), want.iter().map(bits).collect::<Vec<_>>(), "{dims:?}, {threads} threads");
                assert_eq!(got.iter().map(found).collect::<Vec<_>>(), want.iter().map(found).collect::<Vec<_>>(), "{dims:?}, {threads} threads");
                kept.recycle(got);
                kept.recycle_plan(plan);
                gathered.recycle(want);
            }
        }
    }

    /// The home arrays each path hands the GPU: velocities always (those of the home atoms, by
    /// global id), coordinates, types and `1 / m` only where the GPU does not build the grid from
    /// the local atoms (it copies the first two from its own upload of those there and makes the
    /// masses from the types with [`inverse_masses_by_type`], which gives the host's bits).
    #[test]
    fn home_coordinates_and_types_come_from_the_host_unless_the_gpu_builds_the_grid() {
        let sys = MolecularSystem::generate(3_000, 25).unwrap();
        let setup = ListSetup::for_system(&sys, 1.0, 0.002, 100, 10, DEFAULT_DRIFT_TOLERANCE).unwrap();
        let mut host = HostSearch::new(2).unwrap();
        let mut moved = sys.clone();
        let plan = host.plan(&mut moved, RankGrid::new([2, 2, 1]).unwrap(), &setup).unwrap();
        for on in [ListsOn::GpuGrid, ListsOn::Gpu, ListsOn::Host, ListsOn::GpuGrid] {
            let found = host.rank_searches(&plan, &moved, &[2, 0], &setup, on).unwrap();
            for r in &found {
                let ids = &plan.ranks[r.rank].global_ids[..r.lists.home_atoms()];
                let atoms = LocalAtoms::from_plan(&plan, r.rank, &moved.positions, &moved.types).unwrap();
                assert!(!ids.is_empty());
                let want_v: Vec<Float3> = ids.iter().map(|&g| moved.velocities[g as usize]).collect();
                let want_m: Vec<u32> = ids.iter().map(|&g| ((1.0 / moved.mass(g as usize)) as f32).to_bits()).collect();
                assert_eq!(r.home_v, want_v, "{on:?}");
                let table = inverse_masses_by_type(&moved);
                let by_table: Vec<u32> = atoms.types[..atoms.home].iter().map(|&t| table[t as usize].to_bits()).collect();
                assert_eq!(by_table, want_m, "{on:?}: the table the GPU reads gives the host's bits");
                if on == ListsOn::GpuGrid {
                    assert!(r.home_x.is_empty() && r.home_types.is_empty() && r.inv_mass.is_empty(), "{on:?}: the GPU makes them");
                } else {
                    assert_eq!(r.inv_mass.iter().map(|m| m.to_bits()).collect::<Vec<_>>(), want_m, "{on:?}");
                    assert_eq!(r.home_x, atoms.positions[..atoms.home], "{on:?}");
                    assert_eq!(r.home_types, atoms.types[..atoms.home], "{on:?}");
                }
            }
            host.recycle(found);
        }
    }

    #[test]
    fn a_redecomposition_for_other_ranks_is_refused() {
        let sys = MolecularSystem::generate(3_000, 24).unwrap();
        let setup = ListSetup::for_system(&sys, 1.0, 0.002, 100, 10, DEFAULT_DRIFT_TOLERANCE).unwrap();
        let mut host = HostSearch::new(1).unwrap();
        let plan = HaloPlan::from_positions(&sys.positions, sys.box_size, RankGrid::new([2, 1, 1]).unwrap(), setup.rlist).unwrap();
        let done = Redecomposed {
            plan,
            homes: vec![HomeAtoms::default()],
            local_positions: vec![Vec::new()],
            local_positions_from: vec![0],
            home_scans: Vec::new(),
            riders: Vec::new(),
        };
        let e = host
            .rank_searches_redecomposed(done.clone(), &sys, &[0, 1], &setup, ListsOn::GpuGrid, false)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("for 2 ranks"), "{e}");
        let e = host.rank_searches_redecomposed(done, &sys, &[0], &setup, ListsOn::GpuGrid, false).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("local positions"), "{e}");
    }
}
