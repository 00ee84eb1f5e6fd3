//! Where the host time of a search step goes (no GPU): `cargo run --release -p halo-md --example
//! search_profile -- ATOMS AxBxC THREADS`. Prints the median of 21 runs of each part;
//! `PROFILE=plan|atoms|grid|lists` repeats that part 200 times instead (for `perf record`);
//! `SHUFFLE=1` numbers the atoms in an order unrelated to their positions (as after a long run).
use halo::decomp::RankGrid;
use halo::system::MolecularSystem;
use halo_md::nbnxm::{ClusterGrid, ListSetup, LocalAtoms, PairSearch, SearchOptions, ZoneScratch};
use halo_md::search;
use std::time::{Duration, Instant};

/// CPU time of the whole process (ms): on a loaded machine it inflates much less than wall time.
fn cpu_ms() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 * 1e-6
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let atoms: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(45_000);
    let grid: RankGrid = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(RankGrid { dims: [2, 1, 1] });
    let threads: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut sys = MolecularSystem::generate(atoms, 13).expect("system");
    if std::env::var("SHUFFLE").is_ok() {
        // Atom order unrelated to position, as after a long run's diffusion (a fixed seed).
        sys.shuffle(13);
    }
    let setup = ListSetup::for_system(&sys, 1.0, 0.002, 100, 10, 1e-3).expect("setup");
    // One pool and one set of buffers for every run, as an MD run keeps them.
    let mut host = search::HostSearch::new(threads).expect("workers");
    let mut scratch = ZoneScratch::default();
    let opts = SearchOptions::new(setup.rlist);
    if let Ok(part) = std::env::var("PROFILE") {
        let plan = host.plan(&mut sys, grid, &setup).expect("plan");
        let a = LocalAtoms::from_plan(&plan, 0, &sys.positions, &sys.types).expect("atoms");
        let g = ClusterGrid::build_into(&a, host.workers(), &mut scratch).expect("grid");
        let t = Instant::now();
        let cpu0 = cpu_ms();
        for _ in 0..200 {
            match part.as_str() {
                "plan" => drop(host.plan(&mut sys, grid, &setup).expect("plan")),
                "atoms" => drop(LocalAtoms::from_plan(&plan, 0, &sys.positions, &sys.types).expect("atoms")),
                "grid" => drop(ClusterGrid::build_into(&a, host.workers(), &mut scratch).expect("grid")),
                _ => drop(PairSearch::build_into(&a, &opts, host.workers(), &mut scratch).expect("search")),
            }
        }
        drop(g);
        println!("{part}: {:.3} ms each, {:.3} ms CPU", t.elapsed().as_secs_f64() * 1e3 / 200.0, (cpu_ms() - cpu0) / 200.0);
        return;
    }
    let (mut plan_t, mut atoms_t, mut grid_t, mut list_t, mut all_t) = (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..21 {
        let t = Instant::now();
        let plan = host.plan(&mut sys, grid, &setup).expect("plan");
        plan_t.push(t.elapsed());
        let t = Instant::now();
        let a = LocalAtoms::from_plan(&plan, 0, &sys.positions, &sys.types).expect("atoms");
        atoms_t.push(t.elapsed());
        let t = Instant::now();
        let g = ClusterGrid::build_into(&a, host.workers(), &mut scratch).expect("grid");
        grid_t.push(t.elapsed());
        drop(g);
        let s = PairSearch::build_into(&a, &opts, host.workers(), &mut scratch).expect("search");
        list_t.push(s.timing.lists);
        let t = Instant::now();
        let _ = host.rank_searches(&plan, &sys, &[0], &setup, halo_md::search::ListsOn::Host).expect("searches");
        all_t.push(t.elapsed());
    }
    println!(
        "{atoms} atoms, {grid}, {threads} threads, rlist {:.3}: plan {:.2} ms, rank 0: local atoms {:.2}, grid {:.2}, lists {:.2}; rank_searches {:.2} ms",
        setup.rlist,
        median(plan_t),
        median(atoms_t),
        median(grid_t),
        median(list_t),
        median(all_t)
    );
}
