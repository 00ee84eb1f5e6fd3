//! The mini-MD step on the GPU (nbnxm cluster-pair forces, both halos, leapfrog): the decomposed
//! forces and potential energy must equal those of the undecomposed system computed on the CPU,
//! every checked step, on 1-D, 2-D and 3-D rank grids with one and two pulses per dimension, at
//! 6,000 and 45,000 atoms, with searches (re-decomposition, new lists, the exchange replanned in its
//! buffers) every `nstlist` steps. Coordinates after the halo are bit-exact. Also: the leapfrog
//! kernels against their CPU reference, energy conservation of an NVE run on one and two ranks, the
//! page-locked staging that a search step uploads through, and the home coordinates and types that
//! a search with the grid sorted on the GPU copies on the device.
//!
//! The long cases (45,000 atoms, the NVE drift, the 1-D and 2-D grids of the redecomposition) run
//! in the long tier only (`HALO_TEST_TIER=long`); the default tier says `SKIPPED (long tier)` for
//! each, by name.

use halo::abi::{self, Float3};
use halo::decomp::RankGrid;
use halo::exchange::Transport;
use halo::gpu::{DeviceBuffer, DeviceMemory, LaunchShape, Staging};
use halo::kernel_args;
use halo::testing::{gpu_or_skip, long_tier};
use halo_md::{self as md, MdConfig, MdOutcome, Redecompose};
use rand::{Rng, SeedableRng};

/// The negative control (a corrupted and a dropped halo atom, which every check must catch): its own
/// file, this binary. Run it alone with the filter `negative_control::`.
#[path = "gpu_negative_control.rs"]
mod negative_control;

/// A checked run's configuration. Pruned every 10 steps (the default is 50): the short runs here
/// then prune between searches too, so the prune kernels' inner lists are checked at every size.
fn config(atoms: usize, grid: [usize; 3], transport: Transport, steps: u64, nstlist: u64) -> MdConfig {
    MdConfig { steps, nstlist, nstprune: 10, seed: 5, transport, ..MdConfig::new(atoms, RankGrid::new(grid).unwrap()) }
}

fn run(test: &str, cfg: MdConfig) -> Option<MdOutcome> {
    let g = gpu_or_skip(test)?;
    let out = md::run_local(&cfg, std::slice::from_ref(&g.module), |_, _| {}).unwrap_or_else(|e| panic!("{test}: {e}"));
    let checks = if cfg.check_every == 0 { 0 } else { cfg.steps.div_ceil(cfg.check_every) };
    assert_eq!(out.checked_steps, checks, "{test}");
    assert_eq!(out.searches, cfg.steps.div_ceil(cfg.nstlist), "{test}");
    assert_eq!(out.exchange_builds, 1, "{test}: later searches replan the exchange in its buffers");
    // One rank searches on the GPU alone after its first search; several never do.
    let resident = cfg.resident_search && cfg.gpu_search && cfg.grid.num_ranks() == 1;
    assert_eq!(out.resident_searches, if resident { out.searches - 1 } else { 0 }, "{test}: searches on the GPU alone");
    // Several ranks plan from their own atoms after the first search (no rollback happens here).
    let redecomposed = cfg.resident_search && cfg.gpu_search && cfg.grid.num_ranks() > 1;
    assert_eq!(out.redecompositions, if redecomposed { out.searches - 1 } else { 0 }, "{test}: searches planned from the ranks");
    // Each of those, searched on the GPU or redecomposed there, began its first GPU passes behind
    // the steps before it and took them up.
    let ahead = resident || (redecomposed && cfg.redecompose.on_gpus(cfg.atoms, cfg.grid.num_ranks()));
    assert_eq!(out.searches_begun_ahead, if ahead { out.searches - 1 } else { 0 }, "{test}: searches begun ahead");
    // Every later search that does not stay on the GPU replans; ranks in one process need no
    // barrier for it, whichever fence the search asked for.
    assert_eq!(out.replans, out.searches.saturating_sub(1 + out.resident_searches), "{test}: replans");
    assert_eq!(out.replan_barriers, 0, "{test}: replan barriers in one process");
    // One rank steps on its local stream alone (no halo work); several never do.
    let alone = if cfg.grid.num_ranks() == 1 { out.steps - out.graph_steps } else { 0 };
    assert_eq!(out.alone_steps, alone, "{test}: steps without halo work");
    if checks > 0 {
        // Measured over every local atom of every rank (a run ends at a check that differs, so
        // these hold for any run that got here; what makes them meaningful is the coverage below).
        assert_eq!((out.worst.coord_max_abs, out.worst.coord_mismatches), (0.0, 0), "{test}: coordinates after the halo bit-exact");
        assert_eq!((out.worst.mismatches(), out.failed_checks), (0, 0), "{test}: {:?}", out.worst);
        let ranks = cfg.grid.num_ranks() as u64;
        if ranks > 1 {
            // Every checked step compared halo atoms, and both ends of every rank's pulses.
            assert!(out.worst.halo_atoms_checked >= checks * ranks, "{test}: {:?}", out.worst);
            assert!(out.worst.pulses_checked >= checks * ranks, "{test}: {:?}", out.worst);
        } else {
            assert_eq!((out.worst.halo_atoms_checked, out.worst.pulses_checked), (0, 0), "{test}: one rank has no halo");
        }
        assert!(out.worst.force_max_rel <= md::run::FORCE_TOLERANCE, "{test}: {:?}", out.worst);
        assert!(out.worst.energy_rel <= md::run::ENERGY_TOLERANCE, "{test}: {:?}", out.worst);
        assert_eq!(out.energies.len() as u64, checks, "{test}: every checked step records its energy");
    }
    eprintln!("{test}: {:?} over {} steps, {} searches, lists {:?}", out.worst, out.steps, out.searches, out.lists);
    Some(out)
}

#[test]
fn one_rank_matches_the_undecomposed_forces() {
    run("md_1x1x1", config(6000, [1, 1, 1], Transport::Fused, 60, 25));
}

/// One rank with its searches on the GPU alone beside the same run with the grid sorted on the
/// host at every search: both checked against the undecomposed forces and energy at every third
/// step across 9 searches, at 6,000 and 45,000 atoms.
#[test]
fn one_rank_searching_on_the_gpu_alone_or_through_the_host() {
    for (atoms, every) in [(6000, 3), (45_000, 10)] {
        if atoms > 6000 && !long_tier("md_1x1x1_45000 (gpu_resident, host_grid)") {
            continue;
        }
        for resident in [true, false] {
            let mut c = config(atoms, [1, 1, 1], Transport::Fused, 90, 10);
            c.check_every = every;
            c.resident_search = resident;
            run(&format!("md_1x1x1_{atoms}_{}", if resident { "gpu_resident" } else { "host_grid" }), c);
        }
    }
}

/// Several ranks planning from their own atoms (the GPU sorting every rank's grid) beside the same
/// runs gathering the whole system and sorting on the host: both checked against the undecomposed
/// forces and energy every fifth step across 12 searches (atoms leave their ranks between them),
/// on 1-D, 2-D and 3-D grids and two pulses along x.
#[test]
fn several_ranks_planning_from_their_own_atoms_or_from_the_whole_system() {
    // Redecomposed with the per-atom passes on the GPU and on the host, and gathered. The default
    // tier runs the 3-D grid (forwarding in every dimension); the long tier the 1-D, 2-D and
    // two-pulse grids too.
    let long = long_tier("md_2x1x1, md_2x2x1, md_4x1x1 (redecomposed_gpu, redecomposed_host, gathered)");
    for grid in [[2, 1, 1], [2, 2, 1], [2, 2, 2], [4, 1, 1]] {
        if grid != [2, 2, 2] && !long {
            continue;
        }
        for (resident, on) in [(true, Redecompose::Gpu), (true, Redecompose::Host), (false, Redecompose::Auto)] {
            let mut c = config(6000, grid, Transport::Fused, 120, 10);
            c.check_every = 5;
            c.resident_search = resident;
            c.redecompose = on;
            let how = if resident { format!("redecomposed_{}", on.name()) } else { "gathered".into() };
            run(&format!("md_{}x{}x{}_{how}", grid[0], grid[1], grid[2]), c);
        }
    }
}

/// Atoms whose global ids carry no spatial locality (`shuffle_atoms`, as after a long run in which
/// they diffused): one rank (its later searches on the GPU alone) and 2x2x1 (planned from the
/// ranks, the redecomposition's passes on the GPUs) match the undecomposed reference as the
/// lattice order does.
#[test]
fn atoms_in_a_shuffled_order_match_the_undecomposed_forces() {
    for grid in [[1, 1, 1], [2, 2, 1]] {
        let mut c = config(6000, grid, Transport::Fused, 60, 20);
        c.shuffle_atoms = true;
        c.redecompose = Redecompose::Gpu;
        run(&format!("md_{}x{}x{}_shuffled", grid[0], grid[1], grid[2]), c);
    }
}

#[test]
fn two_ranks_one_pulse() {
    run("md_2x1x1", config(6000, [2, 1, 1], Transport::Fused, 60, 25));
}

#[test]
fn four_ranks_2x2x1() {
    run("md_2x2x1", config(6000, [2, 2, 1], Transport::Fused, 60, 25));
}

#[test]
fn eight_ranks_2x2x2_forwarding_chain_every_transport() {
    for t in [Transport::Fused, Transport::FusedTma, Transport::PerPulseDirect, Transport::Staged, Transport::DirectCopy] {
        run(&format!("md_2x2x2_{t}"), config(6000, [2, 2, 2], t, if t == Transport::Fused { 60 } else { 30 }, 20));
    }
}

#[test]
fn two_pulses_per_dimension() {
    // 0.98 nm cells along x and a 1.13 nm list cutoff (nstlist 25): two pulses along x.
    run("md_4x1x1_two_pulses", config(6000, [4, 1, 1], Transport::Fused, 60, 25));
    run("md_4x2x2_mixed_pulses", mixed_pulses());
}

/// 0.62 nm cells in x, 1.23 nm in y and z, a 0.7 nm cutoff and a 0.9 nm list cutoff: two pulses in
/// x, one in y and z. Explicit buffers: at 0.7 nm a pair that enters the cutoff unlisted misses a
/// force of about 1e-2 kJ/mol/nm, 1.3e-4 of the RMS force (above [`md::run::FORCE_TOLERANCE`]); the
/// buffer rule (0.008 nm for 20 steps, none for 10) lets such pairs in (GPU run 4: atom 832 at
/// step 2, pairs 671–832 and 832–926 at 0.7016 and 0.7005 nm at the prune, inside by step 2). In
/// f64 dynamics the 40 steps need 0.080 nm (outer) and 0.035 nm (inner):
/// [`mixed_pulse_lists_miss_no_pair_on_the_cpu`] checks these buffers cover them.
fn mixed_pulses() -> MdConfig {
    let mut c = config(1500, [4, 2, 2], Transport::Fused, 40, 20);
    c.cutoff = 0.7;
    c.buffer = Some(0.2);
    c.inner_buffer = Some(0.1);
    c
}

/// The CPU twin of `md_4x2x2_mixed_pulses` (no GPU): the search path of the MD step (plan, local
/// atoms, host lists at every search, lists pruned at every prune step) and leapfrog dynamics in
/// f64 (positions kept in f32, as on the GPU); at every step the forces of the lists (f64 cluster-pair
/// reference, summed over ranks by the force halo) must equal the undecomposed forces within the
/// GPU test's tolerance. With the buffer rule (`buffer`, `inner_buffer` None) it fails at step 2
/// exactly as the GPU did (atom 832, error 9.3e-3 kJ/mol/nm): the lists miss pairs, not the kernels.
#[test]
fn mixed_pulse_lists_miss_no_pair_on_the_cpu() {
    use halo::decomp::{HaloPlan, wrap_position};
    use md::md_reference::{cluster_list_forces, exchange_coordinates_f64, exchange_forces_f64, lj_forces, prune_reference};
    use md::nbnxm::{ClusterPairList, LocalAtoms, PairSearch, SearchOptions};
    let cfg = mixed_pulses();
    let mut sys = halo::system::MolecularSystem::generate(cfg.atoms, cfg.seed).unwrap();
    let setup = cfg.list_setup(&sys).unwrap();
    let n = sys.atom_types.len();
    let table: Vec<(f64, f64)> = (0..n * n).map(|k| sys.lj_pair(k / n, k % n)).map(|p| (p.c6, p.c12)).collect();
    let (rc, dt) = (f64::from(setup.cutoff), f64::from(cfg.dt));
    let mut v: Vec<[f64; 3]> = sys.velocities.iter().map(|v| [v.x, v.y, v.z].map(f64::from)).collect();
    let mut lists = None;
    for step in 0..cfg.steps {
        if step % cfg.nstlist == 0 {
            for p in &mut sys.positions {
                *p = wrap_position(*p, sys.box_size);
            }
            let plan = HaloPlan::build(&sys, cfg.grid, setup.rlist).unwrap();
            let opts = SearchOptions { threads: 2, ..SearchOptions::new(setup.rlist) };
            let searches: Vec<PairSearch> = plan
                .ranks
                .iter()
                .map(|r| PairSearch::build(&LocalAtoms::from_plan(&plan, r.rank, &sys.positions, &sys.types).unwrap(), &opts).unwrap())
                .collect();
            let x0 = exchange_coordinates_f64(&plan, &sys).unwrap();
            lists = Some((plan, searches, x0, sys.positions.clone(), Vec::new()));
        }
        let (plan, searches, x0, at_search, inner) = lists.as_mut().unwrap();
        // Local coordinates: those of the search moved by each atom's (unwrapped) displacement.
        let coords: Vec<Vec<[f64; 3]>> = plan
            .ranks
            .iter()
            .zip(x0.iter())
            .map(|(r, c0)| {
                let moved = |g: u32, p: &[f64; 3]| -> [f64; 3] {
                    let (a, b) = (sys.positions[g as usize], at_search[g as usize]);
                    [p[0] + (f64::from(a.x) - f64::from(b.x)), p[1] + (f64::from(a.y) - f64::from(b.y)), p[2] + (f64::from(a.z) - f64::from(b.z))]
                };
                c0.iter().zip(&r.global_ids).map(|(p, &g)| moved(g, p)).collect()
            })
            .collect();
        // Pruned at the search and every nstprune steps after it, as the MD step does.
        if (step % cfg.nstlist).is_multiple_of(u64::from(setup.nstprune)) {
            *inner = searches
                .iter()
                .zip(&coords)
                .map(|(s, c)| {
                    let prune = |l: &ClusterPairList| ClusterPairList {
                        entries: l.entries.clone(),
                        j_list: prune_reference(&s.grid, l, c, f64::from(setup.rlist_inner)),
                    };
                    (prune(&s.local), prune(&s.nonlocal))
                })
                .collect();
        }
        let per_rank: Vec<Vec<[f64; 3]>> = searches
            .iter()
            .zip(inner.iter())
            .zip(&coords)
            .map(|((s, (l, nl)), c)| {
                let (mut f, _) = cluster_list_forces(&s.grid, l, c, &table, rc);
                for (a, b) in f.iter_mut().zip(cluster_list_forces(&s.grid, nl, c, &table, rc).0) {
                    (0..3).for_each(|k| a[k] += b[k]);
                }
                f
            })
            .collect();
        let total = exchange_forces_f64(plan, &per_rank).unwrap();
        let want = lj_forces(&sys, cfg.cutoff).unwrap();
        let rms = (want.iter().map(|f| f.iter().map(|c| c * c).sum::<f64>()).sum::<f64>() / want.len() as f64).sqrt();
        let mut f = vec![[0.0; 3]; sys.len()];
        for (r, fr) in plan.ranks.iter().zip(&total) {
            for (k, &g) in r.global_ids[..r.home_atoms].iter().enumerate() {
                let (got, w) = (fr[k], want[g as usize]);
                let norm = w.iter().map(|c| c * c).sum::<f64>().sqrt().max(rms);
                let err = (0..3).map(|c| (got[c] - w[c]).abs()).fold(0.0, f64::max);
                assert!(
                    err <= md::run::FORCE_TOLERANCE * norm,
                    "step {step}: atom {g} has force {got:?} from the lists, {w:?} undecomposed (error {err:.2e}, {:.2e} of {norm:.1})",
                    err / norm
                );
                f[g as usize] = got;
            }
        }
        // Leapfrog (velocities in f64, positions stored in f32 like the GPU's).
        let inv_mass: Vec<f64> = (0..sys.len()).map(|i| 1.0 / sys.mass(i)).collect();
        for (((p, vi), fi), im) in sys.positions.iter_mut().zip(v.iter_mut()).zip(&f).zip(inv_mass) {
            (0..3).for_each(|c| vi[c] += dt * fi[c] * im);
            *p = Float3::new((f64::from(p.x) + dt * vi[0]) as f32, (f64::from(p.y) + dt * vi[1]) as f32, (f64::from(p.z) + dt * vi[2]) as f32);
        }
    }
}

#[test]
fn forty_five_thousand_atoms_1d_2d_3d() {
    if !long_tier("forty_five_thousand_atoms_1d_2d_3d") {
        return;
    }
    for grid in [[2, 1, 1], [2, 2, 1], [2, 2, 2]] {
        let mut c = config(45_000, grid, Transport::Fused, 30, 15);
        c.check_every = 10;
        run(&format!("md_45000_{}x{}x{}", grid[0], grid[1], grid[2]), c);
    }
    let mut c = config(45_000, [4, 1, 1], Transport::Fused, 20, 10);
    c.check_every = 10;
    c.buffer = Some(0.2); // 1.91 nm cells, a 1.2 nm list cutoff: one pulse; 8x1x1 below has two
    run("md_45000_4x1x1", c);
    let mut c = config(45_000, [8, 1, 1], Transport::Fused, 20, 10);
    c.check_every = 10;
    run("md_45000_8x1x1_two_pulses", c);
}

/// Steps without energy or check replayed as CUDA graphs (plain and prune steps, each captured
/// again after every search) between checked steps: the checks after graph steps see the same
/// bit-exact coordinates and forces, and every step that is neither checked nor sums energies
/// (search and prune steps included) ran from a graph.
#[test]
fn graph_replay_between_checks() {
    for (grid, t) in
        [([2, 2, 2], Transport::Fused), ([2, 1, 1], Transport::FusedTma), ([2, 2, 1], Transport::PerPulseDirect), ([1, 1, 1], Transport::Fused)]
    {
        let mut c = config(6000, grid, t, 100, 25);
        c.check_every = 7;
        c.nstprune = 5;
        c.graph = true;
        let test = format!("md_graph_{}x{}x{}_{t}", grid[0], grid[1], grid[2]);
        let launched = (0..c.steps).filter(|&s| s % c.check_every != 0 && (c.energy_every == 0 || s % c.energy_every != 0)).count() as u64;
        let Some(out) = run(&test, c) else { return };
        assert_eq!(out.graph_steps, launched, "{test}: steps replayed as graphs");
    }
}

/// The integration on either of a rank's streams (`MdConfig::integrate_on`): launched steps and
/// steps replayed as graphs, on a GPU-initiated and a host-driven transport, all checked against
/// the undecomposed reference (the checks read what the integration wrote, and the next steps'
/// halos and forces follow it on both streams).
#[test]
fn integration_on_either_stream() {
    for on in [md::IntegrationStream::Halo, md::IntegrationStream::Local] {
        for (grid, t, graph) in [([2, 1, 1], Transport::Fused, false), ([2, 2, 2], Transport::Fused, true), ([2, 1, 1], Transport::Staged, false)] {
            let mut c = config(6000, grid, t, 60, 20);
            (c.check_every, c.graph, c.integrate_on) = (7, graph, Some(on));
            let test = format!("md_integrate_on_{}_{}x{}x{}_{t}{}", on.name(), grid[0], grid[1], grid[2], if graph { "_graph" } else { "" });
            let Some(out) = run(&test, c) else { return };
            if graph {
                assert!(out.graph_steps > 0, "{test}: steps replayed as graphs");
            }
        }
    }
}

/// What `halo md-bench` does to every row: a run with `check_every` 0 (plain steps replayed as
/// graphs or launched) checks stretches of steps on demand (`MdRun::run_checked_steps`) between
/// unchecked ones, on every transport kind it benchmarks by default; each stretch measures the
/// halo atoms and pulses of every rank, bit-exact.
#[test]
fn checked_stretches_between_unchecked_steps() {
    let Some(g) = gpu_or_skip("md_checked_stretches") else { return };
    for (t, graph) in [(Transport::Fused, false), (Transport::Fused, true), (Transport::Staged, false)] {
        let test = format!("md_checked_stretches_{t}{}", if graph { "_graph" } else { "" });
        let mut c = config(6000, [2, 1, 1], t, 0, 20);
        (c.check_every, c.graph) = (0, graph);
        let placement = halo::exchange::Placement::Local(vec![g.module.clone()]).with_policy(c.path_policy);
        let mut run = md::MdRun::new(c, placement).unwrap_or_else(|e| panic!("{test}: {e}"));
        let mut none = |_: u64, _: &md::StepCheck| {};
        run.run_steps(20, &mut none).unwrap_or_else(|e| panic!("{test}: {e}"));
        assert_eq!(run.outcome().checked_steps, 0, "{test}: check_every 0 checks nothing by itself");
        let before = run.run_checked_steps(2, &mut none).unwrap_or_else(|e| panic!("{test}: {e}"));
        run.run_steps(40, &mut none).unwrap_or_else(|e| panic!("{test}: {e}"));
        let after = run.run_checked_steps(1, &mut none).unwrap_or_else(|e| panic!("{test}: {e}"));
        for (c, steps) in [(before, 2), (after, 1)] {
            assert!(c.passed() && c.coord_max_abs == 0.0 && c.coord_mismatches == 0, "{test}: {c:?}");
            assert!(c.halo_atoms_checked >= 2 * steps && c.pulses_checked >= 2 * steps, "{test}: both ranks' halos compared: {c:?}");
            assert!(c.force_max_rel > 0.0 && c.force_max_rel <= md::run::FORCE_TOLERANCE, "{test}: forces compared: {c:?}");
        }
        let out = run.finish().unwrap_or_else(|e| panic!("{test}: {e}"));
        assert_eq!((out.steps, out.checked_steps, out.failed_checks), (63, 3, 0), "{test}");
        if graph {
            assert!(out.graph_steps > 0, "{test}: the unchecked steps ran as graphs");
        }
        eprintln!("{test}: {before:?} then {after:?}");
    }
}

/// The step's phases timed by events (`MdRun::profile_phases`, what `halo md-bench --phases`
/// prints): one summary per rank over the steps that are neither search nor checked steps, every
/// phase a finite time, the two chains inside the step, the halo phases present only with a halo;
/// graphs are off while profiling and on again after it, and the run stays right (checked after).
#[test]
fn profiled_phases_of_one_and_two_ranks() {
    let Some(g) = gpu_or_skip("md_profiled_phases") else { return };
    for grid in [[1, 1, 1], [2, 1, 1]] {
        let test = format!("md_profiled_phases_{}x{}x{}", grid[0], grid[1], grid[2]);
        let mut c = config(6000, grid, Transport::Fused, 0, 20);
        (c.check_every, c.graph) = (0, true);
        let placement = halo::exchange::Placement::Local(vec![g.module.clone()]).with_policy(c.path_policy);
        let mut run = md::MdRun::new(c, placement).unwrap_or_else(|e| panic!("{test}: {e}"));
        let mut none = |_: u64, _: &md::StepCheck| {};
        run.run_steps(20, &mut none).unwrap_or_else(|e| panic!("{test}: {e}"));
        let graphs = run.outcome().graph_steps;
        // 60 steps: three searches (left out), 57 kept across two chunks of events.
        let phases = run.profile_phases(60).unwrap_or_else(|e| panic!("{test}: {e}"));
        assert_eq!(run.outcome().graph_steps, graphs, "{test}: no profiled step is replayed as a graph");
        assert_eq!(phases.len(), grid.iter().product::<usize>(), "{test}: one summary per rank");
        for s in &phases {
            assert_eq!(s.steps, 57, "{test}: the search steps are left out: {s:?}");
            let p = &s.medians;
            let parts = [p.local_prune, p.local_forces, p.coord_halo, p.nonlocal_prune, p.nonlocal_forces, p.force_halo, p.join, p.integrate];
            assert!(parts.iter().all(|v| v.is_finite() && *v >= -1.0), "{test}: {p:?}");
            assert!(p.local_forces > 0.5 && p.integrate > 0.0 && p.step > 0.0, "{test}: {p:?}");
            assert!(p.local_prune + p.local_forces <= p.step + 1.0, "{test}: the local chain lies inside the step: {p:?}");
            assert!(p.idle_before.is_some_and(|v| v >= 0.0), "{test}: {p:?}");
            if grid[0] > 1 {
                assert!(p.coord_halo > 0.0 && p.force_halo > 0.0 && p.nonlocal_forces > 0.0, "{test}: a rank with a halo: {p:?}");
            }
            for line in s.lines() {
                eprintln!("{test}: {line}");
            }
        }
        run.run_steps(20, &mut none).unwrap_or_else(|e| panic!("{test}: {e}"));
        assert!(run.outcome().graph_steps > graphs, "{test}: graphs again after the profile");
        let c = run.run_checked_steps(1, &mut none).unwrap_or_else(|e| panic!("{test}: {e}"));
        assert!(c.passed(), "{test}: {c:?}");
    }
}

/// Energy conservation: 2,000 steps of NVE at 6,000 atoms on one rank and on two, energy every
/// 20 steps. The drift must stay far below GROMACS's default tolerance (0.005 kJ/mol/ps per atom =
/// 5 kJ/mol/ns per atom); both numbers are printed.
#[test]
fn nve_drift_is_small_on_one_and_two_ranks() {
    if !long_tier("nve_drift_is_small_on_one_and_two_ranks") {
        return;
    }
    // Two ranks with the plain steps as CUDA graphs (the energy steps between them are not).
    for (grid, graph) in [([1, 1, 1], false), ([2, 1, 1], true)] {
        let mut c = config(6000, grid, Transport::Fused, 2000, 100);
        c.check_every = 0;
        c.energy_every = 20;
        c.graph = graph;
        let test = format!("md_nve_{}x{}x{}{}", grid[0], grid[1], grid[2], if graph { "_graph" } else { "" });
        let Some(out) = run(&test, c) else { return };
        assert_eq!(out.energies.len(), 100, "{test}");
        // The exchange waited for the host only at search steps (after the first) and at the end.
        assert_eq!(out.host_syncs, out.searches, "{test}: host syncs inside steps");
        let d = out.drift(6000, 0.002, 0).expect("a drift");
        eprintln!("{test}: {d:?}; first {:?}, last {:?}", out.energies[0], out.energies[99]);
        assert!(d.per_atom_kj_mol_ns.abs() < 0.5, "{test}: drift {d:?}");
        assert!(out.energies.iter().all(|e| e.kinetic > 0.0 && e.potential.is_finite()), "{test}");
    }
}

/// The page-locked staging of a search's uploads (`halo::gpu::Staging`): a copy enqueued behind
/// long work on its stream lands in stream order, and the next upload through the same staging
/// (other data, another buffer) waits for that copy before it overwrites the memory. Three rounds
/// with different data and sizes (the third grows the staging while the second's copies may
/// still be queued); each buffer's bytes must be exactly its own round's data, and the elements
/// past a shorter upload keep what the buffer held. Were the staging reused too early, the first
/// buffer would hold the second upload's data (the stream is still busy with 8 GiB of memsets
/// when the host writes it). Then an upload at an offset (`Staging::upload_at`) writes exactly
/// its range, and uploads past the buffer are refused.
#[test]
fn staged_uploads_land_in_stream_order_and_the_staging_is_not_reused_early() {
    let Some(g) = gpu_or_skip("staged_uploads_land_in_stream_order_and_the_staging_is_not_reused_early") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let busy = DeviceBuffer::<u8>::uninit(&g.ctx, 1 << 30).unwrap();
    let n = 300_000usize;
    let a = DeviceBuffer::<Float3>::uninit(&g.ctx, 2 * n).unwrap();
    let b = DeviceBuffer::<Float3>::uninit(&g.ctx, 2 * n).unwrap();
    // Poison on the legacy default stream, then wait for it (the new stream does not follow it).
    a.fill_bytes(0xFF).unwrap();
    b.fill_bytes(0xFF).unwrap();
    g.ctx.synchronize().unwrap();
    let bits = |v: &[Float3]| bytemuck::cast_slice::<Float3, u32>(v).to_vec();
    let mut staging = Staging::<Float3>::new();
    let (mut held_a, mut held_b) = (a.to_host().unwrap(), b.to_host().unwrap());
    for (round, len) in [(0u32, n), (1, n - 1234), (2, 2 * n)] {
        let value = |i: usize, which: f32| Float3::new(i as f32 + 0.5, round as f32 * 10.0 + which, -(i as f32));
        let da: Vec<Float3> = (0..len).map(|i| value(i, 1.0)).collect();
        let db: Vec<Float3> = (0..len.min(n) - 17).map(|i| value(i, 2.0)).collect();
        // About 8 GiB of memsets first: the copies below start milliseconds after they are enqueued.
        for _ in 0..8 {
            busy.fill_bytes_async(round as u8, &stream).unwrap();
        }
        staging.upload(&da, &a, &stream).unwrap();
        staging.upload(&db, &b, &stream).unwrap();
        assert!(staging.capacity() >= len, "round {round}: capacity {} for {len}", staging.capacity());
        stream.synchronize().unwrap();
        held_a[..len].copy_from_slice(&da);
        held_b[..db.len()].copy_from_slice(&db);
        assert_eq!(bits(&a.to_host().unwrap()), bits(&held_a), "round {round}: the first upload's buffer");
        assert_eq!(bits(&b.to_host().unwrap()), bits(&held_b), "round {round}: the second upload's buffer");
    }
    // An upload at an offset writes exactly its range: the elements before and after keep what
    // the buffer held.
    let mid: Vec<Float3> = (0..1000).map(|i| Float3::new(-1.0 - i as f32, 7.0, 8.0)).collect();
    staging.upload_at(&mid, &a, 4321, &stream).unwrap();
    stream.synchronize().unwrap();
    held_a[4321..5321].copy_from_slice(&mid);
    assert_eq!(bits(&a.to_host().unwrap()), bits(&held_a), "an upload at element 4321");
    // An upload past its buffer's end is refused before anything is enqueued.
    let too_many = vec![Float3::default(); 2 * n + 1];
    let e = staging.upload(&too_many, &a, &stream).unwrap_err().to_string();
    assert!(e.contains("600001 elements at element 0 of a buffer of 600000"), "{e}");
    let e = staging.upload_at(&mid, &a, 2 * n - 999, &stream).unwrap_err().to_string();
    assert!(e.contains("1000 elements at element 599001 of a buffer of 600000"), "{e}");
    let e = staging.upload_at(&mid, &a, usize::MAX, &stream).unwrap_err().to_string();
    assert!(e.contains("1000 elements at element"), "{e}");
    stream.synchronize().unwrap();
    assert_eq!(bits(&a.to_host().unwrap()), bits(&held_a), "refused uploads write nothing");
}

/// `leapfrog` and `leapfrog_energy` against the CPU update and kinetic energy (`f64`), on random
/// inputs with counts that leave partial warps and blocks: the forces of the `n` atoms and of the
/// halo range after them come back cleared (poisoned before), atoms past the halo must stay
/// untouched. Halo ranges: none, fewer than the home atoms, more, and a halo without home atoms.
#[test]
fn leapfrog_kernels_match_the_cpu_reference() {
    let Some(g) = gpu_or_skip("leapfrog_kernels_match_the_cpu_reference") else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let extra = 5;
    let dt = 0.002f32;
    let stream = g.ctx.new_stream().unwrap();
    for (n, halo) in [(10_007usize, 0usize), (10_007, 3_001), (517, 10_007), (0, 777), (0, 0)] {
        let total = n + halo;
        let mut f3 = |s: f32| Float3::new(rng.random_range(-s..s), rng.random_range(-s..s), rng.random_range(-s..s));
        let x: Vec<Float3> = (0..total + extra).map(|_| f3(5.0)).collect();
        let v: Vec<Float3> = (0..total + extra).map(|_| f3(1.0)).collect();
        let f: Vec<Float3> = (0..total + extra).map(|_| f3(500.0)).collect();
        let inv_mass: Vec<f32> = (0..total + extra).map(|i| 1.0 / if i % 3 == 0 { 15.999 } else { 14.027 }).collect();
        for energy in [false, true] {
            let case = format!("n = {n}, halo {halo}, energy {energy}");
            let (xd, vd, fd) = (
                DeviceBuffer::from_host(&g.ctx, &x).unwrap(),
                DeviceBuffer::from_host(&g.ctx, &v).unwrap(),
                DeviceBuffer::from_host(&g.ctx, &f).unwrap(),
            );
            let md_ = DeviceBuffer::from_host(&g.ctx, &inv_mass).unwrap();
            let ke = DeviceBuffer::from_host(&g.ctx, &[1000.0f64]).unwrap();
            let (mut px, mut pv, mut pf, mut pm, mut pn, mut pdt, mut pke) =
                (xd.device_ptr(), vd.device_ptr(), fd.device_ptr(), md_.device_ptr(), n as u32, dt, ke.device_ptr());
            let (mut from, mut count) = (n as u32, halo as u32);
            // Fewer blocks than items: the grid-stride loop takes several atoms per thread.
            let shape = LaunchShape { grid: (7, 1), block: abi::BLOCK_SIZE, shared_bytes: 0 };
            // SAFETY: arguments match the kernels; every buffer holds `total + extra` elements; the
            // ranges `..n` and `n..total` do not overlap.
            unsafe {
                if energy {
                    let mut args = kernel_args![px, pv, pf, pm, pn, pdt, from, count, pke];
                    g.module.launch(abi::LEAPFROG_ENERGY, shape, &stream, &mut args).unwrap();
                } else {
                    let mut args = kernel_args![px, pv, pf, pm, pn, pdt, from, count];
                    g.module.launch(abi::LEAPFROG, shape, &stream, &mut args).unwrap();
                }
            }
            stream.synchronize().unwrap();
            let (gx, gv) = (xd.to_host().unwrap(), vd.to_host().unwrap());
            let mut want_ke = 0.0f64;
            for i in 0..n {
                let a = f64::from(inv_mass[i]) * f64::from(dt);
                let c = |v: f32, f: f32| f64::from(v) + f64::from(f) * a;
                let vn = [c(v[i].x, f[i].x), c(v[i].y, f[i].y), c(v[i].z, f[i].z)];
                let xn =
                    [f64::from(x[i].x) + vn[0] * f64::from(dt), f64::from(x[i].y) + vn[1] * f64::from(dt), f64::from(x[i].z) + vn[2] * f64::from(dt)];
                for (k, (got, want)) in [(gv[i].x, vn[0]), (gv[i].y, vn[1]), (gv[i].z, vn[2]), (gx[i].x, xn[0]), (gx[i].y, xn[1]), (gx[i].z, xn[2])]
                    .into_iter()
                    .enumerate()
                {
                    assert!((f64::from(got) - want).abs() <= 1e-6 * want.abs().max(1.0), "{case}: atom {i} value {k}: GPU {got}, CPU {want}");
                }
                let m = 1.0 / f64::from(inv_mass[i]);
                let vo = [v[i].x, v[i].y, v[i].z].map(f64::from);
                want_ke += 0.25 * m * (vo.iter().map(|c| c * c).sum::<f64>() + vn.iter().map(|c| c * c).sum::<f64>());
            }
            assert_eq!(&gx[n..], &x[n..], "{case}: atoms past n are not moved");
            assert_eq!(&gv[n..], &v[n..], "{case}");
            // The forces it used and the halo forces are cleared for the next step; the others kept.
            let gf = fd.to_host().unwrap();
            assert!(
                gf[..total].iter().all(|p| p.x.to_bits() == 0 && p.y.to_bits() == 0 && p.z.to_bits() == 0),
                "{case}: forces up to n and the halo cleared"
            );
            assert_eq!(&gf[total..], &f[total..], "{case}: forces past the halo kept");
            let got_ke = ke.to_host().unwrap()[0] - 1000.0;
            if energy {
                assert!((got_ke - want_ke).abs() <= 1e-5 * want_ke, "{case}: kinetic energy: GPU {got_ke}, CPU {want_ke}");
                eprintln!("leapfrog_energy, {case}: kinetic energy {got_ke:.4} vs {want_ke:.4} kJ/mol");
            } else {
                assert_eq!(got_ke, 0.0, "{case}: the plain leapfrog touches no energy");
            }
        }
    }
}

/// `n` indices into a table of `len` entries as the bounded gathers' tests draw them: mostly in
/// range, a tenth past it, and every 97th one of the edge values `len - 1`, `len`, `u32::MAX`.
fn gather_indices(rng: &mut impl Rng, len: usize, n: usize) -> Vec<u32> {
    let len = len as u32;
    let edges = [len - 1, len, u32::MAX];
    (0..n)
        .map(|i| {
            if i % 97 == 5 {
                edges[i % 3]
            } else if rng.random_bool(0.1) {
                rng.random_range(len..2 * len + 3)
            } else {
                rng.random_range(0..len)
            }
        })
        .collect()
}

/// The bounded gather `kernel` (`(index, n, table, len, out)`: `out[i] = table[index[i]]` for the
/// first `n` items, `missing` for an index at or past `len`) on every `(table, index)` case, with
/// one block, three and the host's launch shape: the host's lookup bit for bit, and nothing
/// written past `n` (poisoned outputs).
fn check_bounded_gather<T: bytemuck::Pod>(g: &halo::testing::GpuFixture, kernel: &str, cases: &[(Vec<T>, Vec<u32>)], missing: T) {
    let stream = g.ctx.default_stream();
    let poison: T = bytemuck::cast(0x7f7f_7f7fu32);
    let bits = |v: &[T]| bytemuck::cast_slice::<T, u32>(v).to_vec();
    for (table, index) in cases {
        let n = index.len();
        let want: Vec<T> = index.iter().map(|&k| table.get(k as usize).copied().unwrap_or(missing)).collect();
        for grid in [Some(1u32), Some(3), None] {
            let id = DeviceBuffer::from_host(&g.ctx, &[index.as_slice(), &[7, 7]].concat()).unwrap();
            let tab = DeviceBuffer::from_host(&g.ctx, table).unwrap();
            let out = DeviceBuffer::from_host(&g.ctx, &vec![poison; n + 9]).unwrap();
            let (mut ip, mut nn, mut tp, mut len, mut op) = (id.device_ptr(), n as u32, tab.device_ptr(), table.len() as u32, out.device_ptr());
            let mut args = kernel_args![ip, nn, tp, len, op];
            let shape = match grid {
                Some(blocks) => LaunchShape { grid: (blocks, 1), block: abi::BLOCK_SIZE, shared_bytes: 0 },
                None => LaunchShape::for_items(n, halo::kernels::MAX_GATHER_BLOCKS),
            };
            // SAFETY: arguments match `kernel(index, n, table, len, out)`; `index` holds n + 2
            // elements, the output n + 9, the table `len`; the buffers outlive the synchronised
            // launch.
            unsafe { g.module.launch(kernel, shape, &stream, &mut args) }.unwrap();
            stream.synchronize().unwrap();
            let got = bits(&out.to_host().unwrap());
            let case = format!("{kernel}: n = {n}, a table of {}, grid {grid:?}", table.len());
            assert_eq!(got[..n], bits(&want)[..], "{case}");
            assert!(got[n..].iter().all(|&b| b == 0x7f7f_7f7f), "{case}: written past n");
        }
    }
}

/// `inverse_masses`: `inv_mass[i] = inv_by_type[types[i]]` for the first `n` atoms, NaN for a type
/// at or past the table, and nothing written past `n` (poisoned outputs). The tables: the MD
/// step's own (`md::search::inverse_masses_by_type` of a generated system, whose lookups must
/// give `1 / mass(atom)`'s bits) and random ones of 1 to 40 types; the types random, in range or
/// out of it, and the edge values `ntypes - 1`, `ntypes`, `u32::MAX`.
#[test]
fn inverse_masses_match_the_host_table_lookup() {
    let Some(g) = gpu_or_skip("inverse_masses_match_the_host_table_lookup") else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(18);
    let sys = halo::system::MolecularSystem::generate(3000, 5).unwrap();
    let md_table = md::search::inverse_masses_by_type(&sys);
    let by_mass: Vec<u32> = (0..sys.len()).map(|i| ((1.0 / sys.mass(i)) as f32).to_bits()).collect();
    let by_table: Vec<u32> = sys.types.iter().map(|&t| md_table[usize::from(t)].to_bits()).collect();
    assert_eq!(by_table, by_mass, "the table gives the host's 1 / mass(atom)");
    let mut cases: Vec<(Vec<f32>, Vec<u32>)> = vec![(md_table.clone(), sys.types.iter().map(|&t| u32::from(t)).collect())];
    for &n in &[0usize, 1, 511, 512, 513, 5000, 200_000] {
        let ntypes = rng.random_range(1..=40usize);
        let table: Vec<f32> = (0..ntypes).map(|_| rng.random_range(0.01f32..1.0)).collect();
        cases.push((table, gather_indices(&mut rng, ntypes, n)));
    }
    check_bounded_gather(&g, abi::INVERSE_MASSES, &cases, f32::NAN);
}

/// `types_by_id`: `types[i] = by_id[ids[i]]` for the first `n` atoms, `u32::MAX` for an id at or
/// past the table, nothing written past `n` (poisoned outputs). The table: a generated system's
/// types by global id (what an MD rank uploads), with ascending home ids as a redecomposition
/// leaves them; and random tables of 1 to 300,000 atoms with random ids, in range or out of it,
/// and the edge values `atoms - 1`, `atoms`, `u32::MAX`.
#[test]
fn types_by_id_match_the_host_lookup() {
    let Some(g) = gpu_or_skip("types_by_id_match_the_host_lookup") else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(19);
    let sys = halo::system::MolecularSystem::generate(3000, 5).unwrap();
    let by_id: Vec<u32> = sys.types.iter().map(|&t| u32::from(t)).collect();
    let home: Vec<u32> = (0..3000u32).filter(|_| rng.random_bool(0.4)).collect();
    let mut cases: Vec<(Vec<u32>, Vec<u32>)> = vec![(by_id, home)];
    for &(atoms, n) in &[(1usize, 0usize), (1, 1), (7, 511), (3000, 512), (3000, 513), (45_000, 5000), (300_000, 200_000)] {
        let table: Vec<u32> = (0..atoms).map(|_| rng.random_range(0..32u32)).collect();
        cases.push((table, gather_indices(&mut rng, atoms, n)));
    }
    check_bounded_gather(&g, abi::TYPES_BY_ID, &cases, u32::MAX);
}

/// A search of several ranks with the grid built on the GPU (`MdRank::new` at the first, then
/// `MdRank::update` after the atoms moved and the exchange was replanned in its buffers) fills
/// each rank's home coordinates (the exchange's `x[..home]`) and home types on the device by
/// copies from the grid's own upload of the local atoms: bit for bit the local atoms' home
/// positions and types, with `x` and the rank's buffers poisoned before every search (the first
/// search's rank buffers are new). The halo region of `x` stays as it was (only home elements are
/// written: peers may store there), velocities equal the host's arrays and `1 / m`, made on the
/// device from the types, the host's `1 / mass(atom)` by global id. 2x2x1 ranks
/// on one GPU, 6,000 atoms, three searches.
#[test]
fn a_gpu_grid_search_fills_the_home_coordinates_and_types_on_the_device() {
    use halo::exchange::{Exchange, Placement};
    use md::nbnxm::lj_table;
    use md::search::{HostSearch, ListsOn, RankLists};
    let test = "a_gpu_grid_search_fills_the_home_coordinates_and_types_on_the_device";
    let Some(g) = gpu_or_skip(test) else { return };
    let grid = RankGrid::new([2, 2, 1]).unwrap();
    let mut sys = halo::system::MolecularSystem::generate(6000, 31).unwrap();
    let setup = MdConfig::new(6000, grid).list_setup(&sys).unwrap();
    let lj = lj_table(&sys);
    let inv_by_type = md::search::inverse_masses_by_type(&sys);
    let ids: Vec<usize> = (0..grid.num_ranks()).collect();
    let mut host = HostSearch::new(2).unwrap();
    let mut plan = host.plan(&mut sys, grid, &setup).unwrap();
    let mut ex: Box<dyn Exchange> = Placement::Local(vec![g.module.clone()]).exchange_with_headroom::<Float3>(plan.rank_halos(), 0.5).unwrap();
    let mut ranks: Vec<md::MdRank> = Vec::new();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let bits = |v: &[Float3]| bytemuck::cast_slice::<Float3, u32>(v).to_vec();
    for search in 0..3 {
        if search > 0 {
            // A search interval's motion, some atoms across cell boundaries and the periodic box.
            for p in &mut sys.positions {
                *p = Float3::new(p.x + rng.random_range(-0.3..0.3), p.y + rng.random_range(-0.3..0.3), p.z + rng.random_range(-0.3..0.3));
            }
            plan = host.plan(&mut sys, grid, &setup).unwrap();
            // Replanned in its buffers as the MD step does (a new exchange where they do not fit).
            if !ex.replan(plan.rank_halos()).unwrap() {
                drop(ex);
                ex = Placement::Local(vec![g.module.clone()]).exchange_with_headroom::<Float3>(plan.rank_halos(), 0.5).unwrap();
            }
        }
        let found = host.rank_searches(&plan, &sys, &ids, &setup, ListsOn::GpuGrid).unwrap();
        for r in ex.local_ranks() {
            r.x.fill_bytes(0xFF).unwrap();
        }
        for m in &ranks {
            m.type_buffer().fill_bytes(0xFF).unwrap();
            m.velocity_buffer().fill_bytes(0xFF).unwrap();
            m.inv_mass_buffer().fill_bytes(0xFF).unwrap();
        }
        // The poison went on the legacy default stream, which the ranks' streams do not follow.
        g.ctx.synchronize().unwrap();
        for (i, r) in found.iter().enumerate() {
            let empty = r.home_x.is_empty() && r.home_types.is_empty() && r.inv_mass.is_empty();
            assert!(empty, "{test}: the host builds no home coordinates, types or masses");
            let (rank, halo) = (&ex.local_ranks()[i], &ex.streams()[i]);
            if search == 0 {
                let mut m = md::MdRank::new(g.module.clone(), r, &lj, &inv_by_type, &setup, sys.box_size, 1, rank, halo).unwrap();
                // Types by id beyond the LJ table are refused, naming the atom.
                let bad = [0u8, inv_by_type.len() as u8];
                let e = m.set_types_by_id(&bad).unwrap_err().to_string();
                assert!(e.contains(&format!("atom 1 has type {}", bad[1])), "{test}: {e}");
                ranks.push(m);
            } else {
                ranks[i].update(r, sys.box_size, rank, halo).unwrap();
            }
        }
        g.ctx.synchronize().unwrap();
        for ((r, m), rank) in found.iter().zip(&ranks).zip(ex.local_ranks()) {
            let case = format!("{test}: search {search}, rank {}", r.rank);
            let RankLists::GpuGrid(atoms) = &r.lists else { panic!("{case}: not a GPU grid search") };
            let home = atoms.home;
            assert!(home > 0 && atoms.len() > home, "{case}: {home} home of {} local atoms", atoms.len());
            assert_eq!(m.home_atoms(), home, "{case}");
            let x = rank.x.to_host().unwrap();
            assert_eq!(bits(&x[..home]), bits(&atoms.positions[..home]), "{case}: home coordinates");
            assert!(bits(&x[home..]).iter().all(|&b| b == u32::MAX), "{case}: the halo region of x was written");
            assert_eq!(m.type_buffer().to_host().unwrap()[..home], atoms.types[..home], "{case}: home types");
            assert_eq!(bits(&m.velocity_buffer().to_host().unwrap()[..home]), bits(&r.home_v), "{case}: velocities");
            // `1 / m` made on the device from the types: the host's `1 / mass(atom)` by global id.
            let inv: Vec<u32> = m.inv_mass_buffer().to_host().unwrap()[..home].iter().map(|v| v.to_bits()).collect();
            let want: Vec<u32> = plan.ranks[r.rank].global_ids[..home].iter().map(|&g| ((1.0 / sys.mass(g as usize)) as f32).to_bits()).collect();
            assert_eq!(inv, want, "{case}: 1 / m");
        }
        host.recycle(found);
    }
    // The ranks' streams are idle (synchronised above); the ranks go before the exchange.
    drop(ranks);
}
