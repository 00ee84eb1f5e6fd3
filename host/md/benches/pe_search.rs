//! Host cost of ONE PE's redecomposing search step (`MdRun::redecompose` and the rank search that
//! follows it, `--resident-search` with several ranks): rank 0 of a 2x1x1 grid at 45,000 atoms of
//! the synthetic liquid, one search thread (the PE default). `cargo bench -p halo-md --bench pe_search`.
//! No GPU.
//!
//! The atoms moved since the last plan (a search interval's displacement, some across the cell
//! boundary). The other PE (rank 1) is emulated: its blobs of every collective are recorded once
//! from a run of both processes in two threads, and the bench's collective hands them back beside
//! rank 0's own (a copy, as a real all-gather makes one), so every iteration does the same work.
//!
//! Before the criterion runs it prints a breakdown per phase (median of 101 runs, buffers reused as
//! an MD run reuses them): the home arrays filled (what the read-back writes), the redecomposition
//! (and of it the emulated collectives), then the rank's local atoms and home arrays, both the way
//! the gathered path builds them (the local positions scattered into a whole-system copy, gathered
//! back by id) and directly from the redecomposition. Then the same for the GPU passes' path
//! (`--redecompose gpu`): the passes' results (computed once with the host's references, what the
//! GPU gives bit for bit) handed back as the GPU's read-back is, so that only the host's part of
//! that path is timed, the part a search step spends after the merge's read-back. That last
//! breakdown runs twice, with the host's caches warm and cold (64 MiB written before each search,
//! as an MD run's steps leave them for a search every 100 steps), each followed by the library's
//! `search.*` spans' medians part by part.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use halo::abi::Float3;
use halo::abi::MigrateLeaver;
use halo::decomp::{
    Decomposition, HaloPlan, HomeAtoms, HomeDevice, HomeIdFacts, MergedHome, MigrateReference, RankGrid, Redecomposed, Scan, merge_reference,
    migrate_reference, redecompose, scan, select_reference,
};
use halo::error::{HaloError, Result};
use halo::system::MolecularSystem;
use halo::workers::Workers;
use halo_md::nbnxm::{DEFAULT_DRIFT_TOLERANCE, ListSetup, LocalAtoms};
use halo_md::search::{HostSearch, ListsOn, RankLists, RankSearch};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

const ATOMS: usize = 45_000;
const DIMS: [usize; 3] = [2, 1, 1];

/// Everything one PE's search starts from.
struct Case {
    /// The system as the PE holds it (positions and velocities as of the last search).
    sys: MolecularSystem,
    setup: ListSetup,
    grid: RankGrid,
    /// Rank 0's home atoms as its GPU holds them now (ids of the last plan, moved positions).
    home: HomeAtoms,
    /// Rank 1's blob of each collective, by tag.
    others: HashMap<String, Vec<u8>>,
    /// The plan the global builder makes from the moved positions, as rank 0's process holds it
    /// (the other ranks' plans without their global ids).
    want: HaloPlan,
}

fn case() -> Case {
    let mut sys = MolecularSystem::generate(ATOMS, 13).expect("system");
    halo::decomp::wrap_positions(&mut sys.positions, sys.box_size);
    let setup = ListSetup::for_system(&sys, 1.0, 0.002, 100, 10, DEFAULT_DRIFT_TOLERANCE).expect("setup");
    let grid = RankGrid::new(DIMS).expect("grid");
    let before = HaloPlan::from_positions(&sys.positions, sys.box_size, grid, setup.rlist).expect("plan");
    // A search interval's motion (100 steps of 2 fs at ~0.5 nm/ps: up to about a tenth of a nm),
    // some atoms across the periodic boundary (left unwrapped, as the GPU leaves them).
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let moved: Vec<Float3> = sys
        .positions
        .iter()
        .map(|p| Float3::new(p.x + rng.random_range(-0.1..0.1), p.y + rng.random_range(-0.1..0.1), p.z + rng.random_range(-0.1..0.1)))
        .collect();
    let velocities: Vec<Float3> = sys.velocities.iter().map(|v| Float3::new(v.x + rng.random_range(-0.1..0.1), v.y, v.z)).collect();
    let homes: Vec<HomeAtoms> = before
        .ranks
        .iter()
        .map(|r| {
            let ids = r.global_ids[..r.home_atoms].to_vec();
            HomeAtoms {
                positions: ids.iter().map(|&i| moved[i as usize]).collect(),
                velocities: ids.iter().map(|&i| velocities[i as usize]).collect(),
                ids,
            }
        })
        .collect();
    let mut want = HaloPlan::from_positions(&moved, sys.box_size, grid, setup.rlist).expect("plan");
    // A process holds only its own ranks' global ids: the plans of the others carry none.
    for r in want.ranks.iter_mut().filter(|r| r.rank != 0) {
        r.global_ids.clear();
    }
    let others = record_rank1(grid, sys.box_size, setup.rlist, &homes);
    let home = homes.into_iter().next().expect("rank 0");
    Case { sys, setup, grid, home, others, want }
}

/// Runs both processes (one rank each) in two threads over a shared-memory collective and keeps
/// rank 1's blob of every collective.
fn record_rank1(grid: RankGrid, box_size: [f32; 3], cutoff: f32, homes: &[HomeAtoms]) -> HashMap<String, Vec<u8>> {
    let slots: Mutex<[Vec<u8>; 2]> = Mutex::new([Vec::new(), Vec::new()]);
    let recorded = Mutex::new(HashMap::new());
    let barrier = Barrier::new(2);
    std::thread::scope(|scope| {
        for (rank, home) in homes.iter().enumerate() {
            let (slots, recorded, barrier) = (&slots, &recorded, &barrier);
            let mine = vec![home.clone()];
            scope.spawn(move || {
                let bad = |e: String| HaloError::InvalidInput(e);
                let mut gather = |tag: &str, blobs: Vec<Vec<u8>>| -> Result<Vec<Vec<u8>>> {
                    let blob = blobs.into_iter().next().ok_or_else(|| bad("no blob".into()))?;
                    if rank == 1 {
                        recorded.lock().map_err(|e| bad(e.to_string()))?.insert(tag.to_string(), blob.clone());
                    }
                    slots.lock().map_err(|e| bad(e.to_string()))?[rank] = blob;
                    barrier.wait();
                    let all = slots.lock().map_err(|e| bad(e.to_string()))?.to_vec();
                    barrier.wait();
                    Ok(all)
                };
                redecompose(grid, box_size, cutoff, ATOMS, &[rank], mine, &mut gather).expect("redecompose");
            });
        }
    });
    recorded.into_inner().expect("recorded")
}

/// The collective of rank 0's process: its blob and rank 1's recorded one (`others`, by tag),
/// the time in it added to `gathers`.
fn emulated_gather<'a>(
    others: &'a HashMap<String, Vec<u8>>,
    gathers: &'a mut Duration,
) -> impl FnMut(&str, Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> + 'a {
    move |tag, mine| {
        let t = Instant::now();
        let other = others.get(tag).ok_or_else(|| HaloError::InvalidInput(format!("no recorded blob for {tag}")))?.clone();
        let mut all = mine;
        all.push(other);
        *gathers += t.elapsed();
        Ok(all)
    }
}

/// One PE's search state across searches: the host search (one thread) and the collective's time.
struct Pe<'a> {
    case: &'a Case,
    host: HostSearch,
    /// The system copy the gathered path scatters into and gathers from.
    sys: MolecularSystem,
    gathers: Duration,
}

impl<'a> Pe<'a> {
    fn new(case: &'a Case) -> Self {
        Self { case, host: HostSearch::new(1).expect("workers"), sys: case.sys.clone(), gathers: Duration::ZERO }
    }

    /// The read-back: rank 0's home atoms into the host search's spare arrays.
    fn homes(&mut self) -> Vec<HomeAtoms> {
        let h = &self.case.home;
        let mut s = self.host.home_arrays(h.ids.len());
        s.ids.extend_from_slice(&h.ids);
        s.positions.extend_from_slice(&h.positions);
        s.velocities.extend_from_slice(&h.velocities);
        vec![s]
    }

    fn redecompose(&mut self, homes: Vec<HomeAtoms>) -> Redecomposed {
        let mut all_gather = emulated_gather(&self.case.others, &mut self.gathers);
        let c = self.case;
        self.host.redecompose(c.grid, c.sys.box_size, &c.setup, ATOMS, &[0], homes, &mut all_gather, None).expect("redecompose")
    }

    /// The gathered path of `MdRun::redecompose` and `HostSearch::rank_searches`: the local
    /// positions and home velocities scattered into the system, the local atoms gathered back.
    fn gathered(&mut self, done: Redecomposed) -> (HaloPlan, Vec<RankSearch>) {
        for (home, local) in done.homes.iter().zip(&done.local_positions) {
            for (&id, &p) in done.plan.ranks[0].global_ids.iter().zip(local) {
                self.sys.positions[id as usize] = p;
            }
            for (&id, &v) in home.ids.iter().zip(&home.velocities) {
                self.sys.velocities[id as usize] = v;
            }
        }
        let Redecomposed { plan, homes, local_positions, .. } = done;
        self.host.recycle_atoms(homes, local_positions);
        let found = self.host.rank_searches(&plan, &self.sys, &[0], &self.case.setup, ListsOn::GpuGrid).expect("search");
        (plan, found)
    }

    /// The path `MdRun::search` takes: the local atoms and home arrays straight from the
    /// redecomposition ([`HostSearch::rank_searches_redecomposed`]).
    fn direct(&mut self, done: Redecomposed) -> (HaloPlan, Vec<RankSearch>) {
        self.host.rank_searches_redecomposed(done, &self.case.sys, &[0], &self.case.setup, ListsOn::GpuGrid, false).expect("search")
    }

    /// What a search leaves for the next: the plan and the rank searches' arrays back.
    fn recycle(&mut self, plan: HaloPlan, found: Vec<RankSearch>) {
        self.host.recycle(found);
        self.host.recycle_plan(plan);
    }
}

/// Rank 0's GPU after its passes: the migration's leavers and the merged, selected home atoms,
/// computed at the first search with the host's references and handed back at every search the
/// way the GPU's read-back is (copied into the search's arrays).
struct PassesDone {
    count: usize,
    stayers: MigrateReference,
    merged: Option<Merged>,
}

/// The merged home atoms' ids and positions, each decomposed dimension's first pulse, and the
/// home check's facts of the ids and the positions' extent (the GPU makes both with the merge).
struct Merged {
    ids: Vec<u32>,
    x: Vec<Float3>,
    first_pulse: Vec<Vec<u32>>,
    first_pulse_x: Vec<Vec<Float3>>,
    facts: HomeIdFacts,
    scan: Scan,
}

impl PassesDone {
    fn new(case: &Case) -> Self {
        let geo = Decomposition::new(case.grid, case.sys.box_size, case.setup.rlist).expect("geometry");
        let h = &case.home;
        let stayers = migrate_reference(&h.positions, &h.velocities, &h.ids, &geo, 0).expect("migration");
        Self { count: h.ids.len(), stayers, merged: None }
    }
}

impl HomeDevice for PassesDone {
    fn rank(&self) -> usize {
        0
    }

    fn migrate(&mut self, _geo: &Decomposition) -> Result<(usize, Vec<MigrateLeaver>)> {
        Ok((self.count, self.stayers.leavers.clone()))
    }

    fn merge_and_select(
        &mut self,
        geo: &Decomposition,
        arrivals: &[(u32, Float3, Float3)],
        positions: bool,
        mut into: MergedHome,
    ) -> Result<MergedHome> {
        if self.merged.is_none() {
            let arrivals: Vec<MigrateLeaver> = arrivals.iter().map(|&(id, x, v)| MigrateLeaver { id, x, v, owner: 0 }).collect();
            let s = &self.stayers;
            let m = merge_reference(&s.ids, &s.positions, &s.velocities, &arrivals, 0)?;
            let selected = select_reference(&m.positions, &m.ids, geo, 0)?;
            let (facts, scan) = (HomeIdFacts::of(&m.ids), scan(&m.positions, [0.0; 3], geo.box_size));
            let (first_pulse, first_pulse_x) = selected.per_dim.into_iter().map(|d| (d.map, d.positions)).unzip();
            self.merged = Some(Merged { ids: m.ids, x: m.positions, first_pulse, first_pulse_x, facts, scan });
        }
        let m = self.merged.as_ref().ok_or_else(|| HaloError::InvalidInput("no merge".into()))?;
        into.ids.clear();
        into.ids.extend_from_slice(&m.ids);
        into.wrapped.clear();
        if positions {
            into.wrapped.extend_from_slice(&m.x);
        }
        for (to, from) in into.first_pulse.iter_mut().zip(&m.first_pulse) {
            to.clear();
            to.extend_from_slice(from);
        }
        for (to, from) in into.first_pulse_x.iter_mut().zip(&m.first_pulse_x) {
            to.clear();
            to.extend_from_slice(from);
        }
        into.id_facts = Some(m.facts);
        into.home_scan = Some(m.scan);
        Ok(into)
    }

    fn read_home_positions(&mut self, into: &mut Vec<Float3>) -> Result<()> {
        let m = self.merged.as_ref().ok_or_else(|| HaloError::InvalidInput("no merge".into()))?;
        into.clear();
        into.extend_from_slice(&m.x);
        Ok(())
    }
}

impl Pe<'_> {
    /// [`Pe::redecompose`] through the GPU passes' path, the passes already done (`device`), the
    /// home positions read back where `home_positions` says (a GPU grid needs none).
    fn redecompose_after_passes(&mut self, device: &mut PassesDone, home_positions: bool) -> Redecomposed {
        let mut all_gather = emulated_gather(&self.case.others, &mut self.gathers);
        let c = self.case;
        let mut devices: [&mut dyn HomeDevice; 1] = [device];
        self.host
            .redecompose_on_devices(c.grid, c.sys.box_size, &c.setup, ATOMS, &[0], &mut devices, home_positions, &mut all_gather, None)
            .expect("redecompose")
    }

    /// [`Pe::direct`] with the velocities on the GPU.
    fn direct_velocities_on_gpu(&mut self, done: Redecomposed) -> (HaloPlan, Vec<RankSearch>) {
        self.host.rank_searches_redecomposed(done, &self.case.sys, &[0], &self.case.setup, ListsOn::GpuGrid, true).expect("search")
    }
}

/// [`breakdown`] of the GPU passes' path: the host's part after the passes (the collectives, the
/// pulses, the plan and its checks, then the local atoms and home arrays).
///
/// With `cold`, every search starts after 64 MiB were written (not timed), as a search meets the
/// host's caches in an MD run: every 100 steps, after the steps' own work went through them.
/// With `home_positions` the home atoms' positions come back from the GPU (as for a grid built
/// on the host); without, they stay there and the pulses take the positions they send from the
/// selection (as for a GPU grid, what `halo md-bench` runs).
fn breakdown_after_passes(case: &Case, cold: bool, home_positions: bool) {
    let (mut pe, mut device) = (Pe::new(case), PassesDone::new(case));
    let (mut plan_t, mut gathers, mut atoms_t, mut local_t, mut total) = (vec![], vec![], vec![], vec![], vec![]);
    let mut evict = if cold { vec![0u64; (64 << 20) / 8] } else { Vec::new() };
    for i in 0..111 {
        evict.iter_mut().enumerate().for_each(|(k, w)| *w = w.wrapping_add(k as u64 ^ i));
        let t1 = Instant::now();
        pe.gathers = Duration::ZERO;
        let done = pe.redecompose_after_passes(&mut device, home_positions);
        let t2 = Instant::now();
        let (plan, found) = pe.direct_velocities_on_gpu(done);
        let t3 = Instant::now();
        if i == 0 {
            assert_eq!(plan, case.want, "the plan after the GPU passes is the global builder's");
            let held = if home_positions { 0 } else { plan.ranks[0].home_atoms };
            assert!(
                found.iter().all(|f| matches!(&f.lists, RankLists::GpuGrid(a) if a.positions_from == held)),
                "home positions held from atom {held}"
            );
        }
        let local = found.iter().map(|f| f.atoms_time).max().unwrap_or_default();
        pe.recycle(plan, found);
        if i >= 10 {
            local_t.push(local);
            plan_t.push(t2 - t1);
            gathers.push(pe.gathers);
            atoms_t.push(t3 - t2);
            total.push(t3 - t1);
        }
    }
    let (g, p) = (median(gathers), median(plan_t));
    println!(
        "pe search, 45,000 atoms, {DIMS:?} rank 0, 1 thread, after the GPU passes{}{}, medians in us: redecompose {p:.0} (of it emulated collectives {g:.0}, \
         own arithmetic {:.0}), local atoms + home arrays {:.0} (of it the local atoms {:.0}); total {:.0}",
        if cold { ", cold caches" } else { "" },
        if home_positions { ", home positions read back" } else { ", home positions left on the GPU" },
        p - g,
        median(atoms_t),
        median(local_t),
        median(total),
    );
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e6
}

/// Per-phase medians (µs) of 101 searches on one PE state, after a few to warm its buffers, on
/// the gathered (`direct == false`) or the direct path.
fn breakdown(case: &Case, direct: bool) {
    let mut pe = Pe::new(case);
    let (mut read, mut plan_t, mut gathers, mut atoms_t, mut local_t, mut total) = (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut check = None;
    for i in 0..111 {
        let t0 = Instant::now();
        let homes = pe.homes();
        let t1 = Instant::now();
        pe.gathers = Duration::ZERO;
        let done = pe.redecompose(homes);
        let t2 = Instant::now();
        let (plan, found) = if direct { pe.direct(done) } else { pe.gathered(done) };
        let t3 = Instant::now();
        if i == 0 {
            assert_eq!(plan, case.want, "the redecomposed plan is the global builder's");
            check = Some(found.iter().map(|f| (f.lists.home_atoms(), f.lists.atoms())).collect::<Vec<_>>());
        }
        let local = found.iter().map(|f| f.atoms_time).max().unwrap_or_default();
        pe.recycle(plan, found);
        if i >= 10 {
            local_t.push(local);
            read.push(t1 - t0);
            plan_t.push(t2 - t1);
            gathers.push(pe.gathers);
            atoms_t.push(t3 - t2);
            total.push(t3 - t0);
        }
    }
    let (g, p) = (median(gathers), median(plan_t));
    let path = if direct { "direct (local atoms + home arrays from the redecomposition)" } else { "gathered (scatter + local atoms + home arrays)" };
    println!(
        "pe search, 45,000 atoms, {DIMS:?} rank 0, 1 thread, rlist {:.3} nm ({:?} home/local atoms), medians in us: home arrays filled {:.0}, \
         redecompose {p:.0} (of it emulated collectives {g:.0}, own arithmetic {:.0}), {path} {:.0} (of it the local atoms {:.0}); total {:.0}",
        case.setup.rlist,
        check.unwrap_or_default(),
        median(read),
        p - g,
        median(atoms_t),
        median(local_t),
        median(total),
    );
}

fn bench(c: &mut Criterion) {
    let case = case();
    breakdown(&case, false);
    breakdown(&case, true);
    // The library's search spans, part by part, as each breakdown after the passes saw them.
    spans::install();
    for cold in [false, true] {
        for home_positions in [true, false, true, false] {
            spans::start();
            breakdown_after_passes(&case, cold, home_positions);
            spans::print(if cold { "cold caches" } else { "warm caches" });
        }
    }
    let mut g = c.benchmark_group("pe search 45k 2x1x1 rank 0");
    g.sample_size(30);
    let mut pe = Pe::new(&case);
    g.bench_function("redecompose", |b| {
        b.iter(|| {
            let homes = pe.homes();
            let done = pe.redecompose(homes);
            let Redecomposed { plan, homes, local_positions, .. } = done;
            pe.host.recycle_atoms(homes, local_positions);
            pe.host.recycle_plan(black_box(plan));
        })
    });
    g.bench_function("redecompose + gathered local atoms", |b| {
        b.iter(|| {
            let homes = pe.homes();
            let done = pe.redecompose(homes);
            let (plan, found) = pe.gathered(done);
            pe.recycle(plan, black_box(found));
        })
    });
    g.bench_function("redecompose + direct local atoms", |b| {
        b.iter(|| {
            let homes = pe.homes();
            let done = pe.redecompose(homes);
            let (plan, found) = pe.direct(done);
            pe.recycle(plan, black_box(found));
        })
    });
    let mut device = PassesDone::new(&case);
    g.bench_function("after the GPU passes: redecompose + local atoms", |b| {
        b.iter(|| {
            let done = pe.redecompose_after_passes(&mut device, false);
            let (plan, found) = pe.direct_velocities_on_gpu(done);
            pe.recycle(plan, black_box(found));
        })
    });
    // The local atoms alone, from one redecomposition: gathered from a system copy by id, or
    // from the rank's own local positions.
    let homes = pe.homes();
    let done = pe.redecompose(homes);
    let (plan, local) = (&done.plan, &done.local_positions[0]);
    let mut sys = case.sys.clone();
    for (&id, &p) in plan.ranks[0].global_ids.iter().zip(local) {
        sys.positions[id as usize] = p;
    }
    let (workers, mut out, mut spare) = (Workers::serial(), LocalAtoms::default(), local.clone());
    g.bench_function("local atoms: from_plan_into", |b| {
        b.iter(|| LocalAtoms::from_plan_into(plan, 0, &sys.positions, &sys.types, &workers, &mut out).expect("atoms"))
    });
    g.bench_function("local atoms: from_local_into", |b| {
        b.iter(|| {
            // The copy stands for the redecomposition's fresh local positions.
            spare.clear();
            spare.extend_from_slice(local);
            LocalAtoms::from_local_into(plan, 0, &mut spare, &sys.types, &workers, &mut out).expect("atoms")
        })
    });
    LocalAtoms::from_plan_into(plan, 0, &sys.positions, &sys.types, &workers, &mut out).expect("atoms");
    g.bench_function("local atoms: validate alone", |b| b.iter(|| black_box(&out).validate().expect("valid")));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

/// The library's `search.*` spans (`tracing`, debug level) timed per name while recording: the
/// medians of each part of the searches [`breakdown_after_passes`] runs.
mod spans {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::time::Instant;
    use tracing::span;
    use tracing_subscriber::layer::{Context, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;

    /// Each span name's lifetimes (µs) since [`start`].
    static TIMES: Mutex<BTreeMap<&'static str, Vec<f64>>> = Mutex::new(BTreeMap::new());

    /// When a span was made.
    struct Born(Instant);

    /// Records every span's lifetime by name.
    struct Lifetimes;

    impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Lifetimes {
        fn on_new_span(&self, _: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
            if let Some(s) = ctx.span(id) {
                s.extensions_mut().insert(Born(Instant::now()));
            }
        }

        fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
            let Some(s) = ctx.span(&id) else { return };
            let Some(born) = s.extensions().get::<Born>().map(|b| b.0) else { return };
            TIMES.lock().expect("span times").entry(s.name()).or_default().push(born.elapsed().as_secs_f64() * 1e6);
        }
    }

    /// Makes the recorder the process's subscriber.
    pub fn install() {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Lifetimes)).expect("the bench's only subscriber");
    }

    /// Forgets what was recorded.
    pub fn start() {
        TIMES.lock().expect("span times").clear();
    }

    /// Prints each search span's median since [`start`].
    pub fn print(what: &str) {
        for (name, times) in TIMES.lock().expect("span times").iter_mut().filter(|(n, _)| n.starts_with("search")) {
            times.sort_by(f64::total_cmp);
            println!("  {what}: {name} median {:.1} us ({} spans)", times[times.len() / 2], times.len());
        }
    }
}
