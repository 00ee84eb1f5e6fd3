//! Host cost of a search step of the nbnxm path at 45,000 atoms: the re-decomposition (halo plan),
//! each rank's local atoms, cluster grid and both cluster-pair lists, on 1 and 2 ranks, with the
//! buffer the rule picks for nstlist = 100. `cargo bench -p halo --bench nbnxm_search`. No GPU.
//!
//! Before the criterion runs it prints one breakdown per configuration (median of 11 runs).

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use halo::decomp::{HaloPlan, RankGrid, wrap_position};
use halo_md::nbnxm::{DEFAULT_DRIFT_TOLERANCE, ListSetup, LocalAtoms, PairSearch, SearchOptions};
use halo::system::MolecularSystem;
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

fn breakdown(sys: &MolecularSystem, setup: &ListSetup, dims: [usize; 3], threads: usize) {
    let grid = RankGrid::new(dims).expect("grid");
    let opts = SearchOptions { threads, ..SearchOptions::new(setup.rlist) };
    let (mut plan_t, mut local_t, mut grid_t, mut list_t) = (vec![], vec![], vec![], vec![]);
    let mut stats = String::new();
    for _ in 0..11 {
        let t = Instant::now();
        let plan = HaloPlan::build_on(sys, grid, setup.rlist, threads).expect("plan");
        plan_t.push(t.elapsed());
        let t = Instant::now();
        let atoms = LocalAtoms::from_plan_on(&plan, 0, &sys.positions, &sys.types, threads).expect("atoms");
        local_t.push(t.elapsed());
        let s = PairSearch::build(&atoms, &opts).expect("search");
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
    println!(
        "{dims:?}, {threads} threads, rlist {:.3} nm: halo plan (all ranks) {:.2} ms, rank 0 local atoms {:.2} ms, grid {:.2} ms, lists {:.2} ms; {stats}",
        setup.rlist,
        median(plan_t),
        median(local_t),
        median(grid_t),
        median(list_t)
    );
}

fn bench(c: &mut Criterion) {
    let (sys, setup) = system();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
    for dims in [[1, 1, 1], [2, 1, 1]] {
        for t in [1, threads] {
            breakdown(&sys, &setup, dims, t);
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
