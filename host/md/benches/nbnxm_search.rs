//! Host cost of a search step of the nbnxm path at 45,000 atoms: the re-decomposition (halo plan),
//! each rank's local atoms, cluster grid and both cluster-pair lists, on 1 and 2 ranks, with the
//! buffer the rule picks for nstlist = 100. `cargo bench -p halo --bench nbnxm_search`. No GPU.
//!
//! Before the criterion runs it prints one breakdown per configuration (median of 11 runs on a
//! pool started once, buffers reused), and the whole host path of an MD search step.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use halo::decomp::{HaloPlan, PlanScratch, RankGrid, wrap_position};
use halo::system::MolecularSystem;
use halo_md::nbnxm::{DEFAULT_DRIFT_TOLERANCE, ListSetup, LocalAtoms, PairSearch, SearchOptions, ZoneScratch};
use halo_md::search::HostSearch;
use std::time::{Duration, Instant};

fn system() -> (MolecularSystem, ListSetup) {
    let mut sys = MolecularSystem::generate(45_000, 13).expect("system");
    for p in &mut sys.positions {
        *p = wrap_position(*p, sys.box_size);
    }
    let setup = ListSetup::for_system(&sys, 1.0, 0.002, 100, 10, DEFAULT_DRIFT_TOLERANCE).expect("setup");
    (sys, setup)
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

/// Per-phase medians of 11 searches on one [`HostSearch`] of `threads` threads (started once,
/// buffers reused, as an MD run keeps them), then the whole host path of an MD search step with
/// GPU lists (plan of all ranks, then rank 0's local atoms, grid and home arrays).
fn breakdown(sys: &mut MolecularSystem, setup: &ListSetup, dims: [usize; 3], threads: usize) {
    let grid = RankGrid::new(dims).expect("grid");
    let mut host = HostSearch::new(threads).expect("workers");
    let opts = SearchOptions::new(setup.rlist);
    let (mut atoms, mut scratch, mut plan_scratch) = (LocalAtoms::default(), ZoneScratch::default(), PlanScratch::default());
    let mut fresh_t = vec![];
    let (mut plan_t, mut local_t, mut grid_t, mut list_t, mut path_t) = (vec![], vec![], vec![], vec![], vec![]);
    let mut stats = String::new();
    for _ in 0..11 {
        let t = Instant::now();
        black_box(HaloPlan::build(sys, grid, setup.rlist).expect("plan"));
        fresh_t.push(t.elapsed());
        let t = Instant::now();
        let plan = HaloPlan::build_with(sys, grid, setup.rlist, host.workers(), &mut plan_scratch).expect("plan");
        plan_t.push(t.elapsed());
        let t = Instant::now();
        LocalAtoms::from_plan_into(&plan, 0, &sys.positions, &sys.types, host.workers(), &mut atoms).expect("atoms");
        local_t.push(t.elapsed());
        let s = PairSearch::build_into(&atoms, &opts, host.workers(), &mut scratch).expect("search");
        grid_t.push(s.timing.grid);
        list_t.push(s.timing.lists);
        stats = format!(
            "{} local atoms ({} home), {} superclusters, local list {} entries / {} cluster pairs, non-local {} / {}",
            atoms.len(),
            atoms.home,
            s.grid.superclusters(),
            s.local.entries.len(),
            s.local.cluster_pairs(),
            s.nonlocal.entries.len(),
            s.nonlocal.cluster_pairs()
        );
    }
    for _ in 0..11 {
        let t = Instant::now();
        let plan = host.plan(sys, grid, setup).expect("plan");
        black_box(host.rank_searches(&plan, sys, &[0], setup, halo_md::search::ListsOn::Gpu).expect("searches"));
        path_t.push(t.elapsed());
    }
    println!(
        "{dims:?}, {threads} threads, rlist {:.3} nm: halo plan (all ranks) {:.2} ms (fresh, 1 thread: {:.2}), rank 0 local atoms {:.2} ms, grid {:.2} ms, lists {:.2} ms; \
         host path with GPU lists (plan + rank 0's atoms, grid, home arrays) {:.2} ms; {stats}",
        setup.rlist,
        median(plan_t),
        median(fresh_t),
        median(local_t),
        median(grid_t),
        median(list_t),
        median(path_t)
    );
}

fn bench(c: &mut Criterion) {
    let (mut sys, setup) = system();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
    for dims in [[1, 1, 1], [2, 1, 1]] {
        for t in [1, threads] {
            breakdown(&mut sys, &setup, dims, t);
        }
    }
    let mut g = c.benchmark_group("nbnxm search 45k");
    g.sample_size(10);
    for dims in [[1, 1, 1], [2, 1, 1]] {
        let grid = RankGrid::new(dims).expect("grid");
        let plan = HaloPlan::build(&sys, grid, setup.rlist).expect("plan");
        let atoms = LocalAtoms::from_plan(&plan, 0, &sys.positions, &sys.types).expect("atoms");
        let opts = SearchOptions::new(setup.rlist);
        g.bench_function(format!("{dims:?} rank 0: grid + lists"), |b| b.iter(|| PairSearch::build(black_box(&atoms), &opts).expect("search")));
        g.bench_function(format!("{dims:?}: halo plan"), |b| b.iter(|| HaloPlan::build(black_box(&sys), grid, setup.rlist).expect("plan")));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
