//! Property tests of the decomposition (no GPU): for random boxes, grids from 1x1x1 to 3x3x2 and
//! cutoffs needing one or several pulses per dimension (empty pulses included),
//! - every atom within the cutoff of a rank's cell (from above, as the halo is one-sided) reaches
//!   that rank exactly once, at the right periodic image, and nothing far beyond the cutoff does;
//! - neighbours agree on every size and offset (the plan validates);
//! - every pair within the cutoff is computed by exactly one rank, and the decomposed forces
//!   (per-rank pair forces, then the force halo) equal the undecomposed LJ forces;
//! - corrupted plans are rejected with a reason, never a panic.
//!
//! Determinism: proptest seeds its RNG randomly by default, so a rare boundary case could fail one
//! CI run in a thousand. [`config`] fixes the seed ([`DEFAULT_SEED`]) unless `PROPTEST_RNG_SEED` is
//! set, so CI runs the same cases every time and a longer hunt is
//! `PROPTEST_RNG_SEED=<n> PROPTEST_CASES=<m> cargo test -p halo-md --test plan_props`. Failure
//! persistence is off: with a fixed seed a failure reproduces anyway, and a failing case is kept as
//! a named regression test below (e.g. [`pair_at_the_cutoff_found_by_fuzzing`]), not as a
//! `proptest-regressions` file that only replays on machines that have it.

use halo::abi::Float3;
use halo::decomp::{HaloPlan, PlanError, RankGrid, wrap_position};
use halo::system::MolecularSystem;
use halo_md::md_reference::{
    ReferenceError, assign_pairs, exchange_coordinates, exchange_coordinates_f64, exchange_forces, exchange_forces_f64, lj_forces,
    pair_within_cutoff, rank_pair_forces, wrapped_positions,
};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

/// The RNG seed every property here runs with, unless `PROPTEST_RNG_SEED` overrides it.
const DEFAULT_SEED: u64 = 0x4841_4c4f; // "HALO"

/// `cases` cases (or `PROPTEST_CASES`), from a fixed seed (or `PROPTEST_RNG_SEED`), no failure
/// files: the same cases on every run, so CI cannot flake; see the module comment.
fn config(cases: u32) -> ProptestConfig {
    // `default()` has already read the PROPTEST_* variables; only fill in what they left unset.
    let mut c = ProptestConfig { failure_persistence: None, ..ProptestConfig::default() };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = cases;
    }
    if c.rng_seed == RngSeed::Random {
        c.rng_seed = RngSeed::Fixed(DEFAULT_SEED);
    }
    c
}

fn grids() -> impl Strategy<Value = [usize; 3]> {
    (1usize..=3, 1usize..=3, 1usize..=2).prop_map(|(a, b, c)| [a, b, c])
}

/// Checks which atoms each rank holds against the geometry, computed independently of the plan.
fn check_coverage(plan: &HaloPlan, positions: &[Float3]) -> Result<(), TestCaseError> {
    let geo = plan.decomposition().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let rc = f64::from(plan.cutoff);
    let x = exchange_coordinates(plan, &system_with(positions, plan.box_size)).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let wrapped: Vec<[f64; 3]> = positions
        .iter()
        .map(|&p| {
            let w = wrap_position(p, plan.box_size);
            [f64::from(w.x), f64::from(w.y), f64::from(w.z)]
        })
        .collect();
    for r in &plan.ranks {
        let c = plan.grid.coords_of(r.rank);
        let mut local_of = vec![None; positions.len()];
        for (k, &id) in r.global_ids.iter().enumerate() {
            prop_assert!(local_of[id as usize].is_none(), "rank {} holds atom {id} twice", r.rank);
            local_of[id as usize] = Some(k);
        }
        for (a, p) in wrapped.iter().enumerate() {
            let home = geo.cell_of(*p) == c;
            let mut dist2 = 0.0;
            let mut image = *p;
            for d in 0..3 {
                let n = plan.grid.dims[d];
                if n == 1 {
                    continue;
                }
                let l = f64::from(plan.box_size[d]);
                let lo = geo.lower(d, c[d]);
                let t = (p[d] - lo).rem_euclid(l);
                image[d] = lo + t;
                let excess = (t - l / n as f64).max(0.0);
                dist2 += excess * excess;
            }
            match local_of[a] {
                Some(k) => {
                    prop_assert_eq!(home, k < r.home_atoms, "rank {} atom {}: home {} but local {}", r.rank, a, home, k);
                    prop_assert!(dist2 <= rc * rc * (1.0 + 1e-5), "rank {} got atom {a} at distance {}", r.rank, dist2.sqrt());
                    let got = x[r.rank][k];
                    for (d, g) in [got.x, got.y, got.z].into_iter().enumerate() {
                        prop_assert!((f64::from(g) - image[d]).abs() < 1e-4, "rank {} atom {a} dim {d}: {g} vs {}", r.rank, image[d]);
                    }
                }
                None => {
                    prop_assert!(!home, "rank {} lacks its home atom {a}", r.rank);
                    prop_assert!(dist2 >= rc * rc, "rank {} lacks atom {a} at distance {} < cutoff", r.rank, dist2.sqrt());
                }
            }
        }
    }
    Ok(())
}

/// The body of `decomposed_forces_equal_undecomposed_forces`, callable with fixed inputs: the
/// generated liquid of `atoms` atoms from `seed` on `grid` ranks, cutoff `frac` of half the box.
fn check_decomposed_forces(atoms: usize, seed: u64, grid: [usize; 3], frac: f64) -> Result<(), TestCaseError> {
    let sys = MolecularSystem::generate(atoms, seed).unwrap();
    let cutoff = (frac * f64::from(sys.box_size[0]) / 2.0) as f32;
    let plan = HaloPlan::build(&sys, RankGrid::new(grid).unwrap(), cutoff).unwrap();
    let pairs = assign_pairs(&plan, &sys, cutoff).unwrap();

    // Exactly once, checked independently: the union of the ranks' pairs, in global ids,
    // is the brute-force pair list without repeats.
    let mut union: Vec<(u32, u32)> = Vec::new();
    for (r, rp) in plan.ranks.iter().zip(&pairs.ranks) {
        for &[i, j] in rp.local.iter().chain(&rp.nonlocal) {
            let (a, b) = (r.global_ids[i as usize], r.global_ids[j as usize]);
            union.push((a.min(b), a.max(b)));
        }
    }
    union.sort_unstable();
    // The brute force is independent of the cell list and of the plan (all pairs, global ids),
    // but decides "within the cutoff" with the library's one predicate on the same wrapped `f64`
    // positions: any other arithmetic (it used to subtract `f32` positions first) disagrees on a
    // pair at r ~ cutoff, and the comparison then flakes (see pair_at_the_cutoff_found_by_fuzzing).
    let pos = wrapped_positions(&sys);
    let box_size = sys.box_size.map(f64::from);
    let rc = f64::from(cutoff);
    let mut brute = Vec::new();
    for a in 0..atoms {
        for b in a + 1..atoms {
            if pair_within_cutoff(&pos[a], &pos[b], box_size, rc).is_some() {
                brute.push((a as u32, b as u32));
            }
        }
    }
    prop_assert_eq!(union.len(), pairs.total_pairs);
    prop_assert!(union == brute, "pair sets differ: {} assigned, {} within the cutoff", union.len(), brute.len());

    let reference = lj_forces(&sys, cutoff).unwrap();
    let rms = (reference.iter().map(|f| f.iter().map(|v| v * v).sum::<f64>()).sum::<f64>() / atoms as f64).sqrt();

    // f64 path: relative 1e-9.
    let x = exchange_coordinates_f64(&plan, &sys).unwrap();
    let f = exchange_forces_f64(&plan, &rank_pair_forces(&plan, &sys, &pairs, &x).unwrap()).unwrap();
    // f32 path, as the GPU moves data: coordinates and force halo in f32.
    let x32: Vec<Vec<[f64; 3]>> = exchange_coordinates(&plan, &sys)
        .unwrap()
        .iter()
        .map(|v| v.iter().map(|p| [f64::from(p.x), f64::from(p.y), f64::from(p.z)]).collect())
        .collect();
    let f32_in: Vec<Vec<Float3>> = rank_pair_forces(&plan, &sys, &pairs, &x32)
        .unwrap()
        .iter()
        .map(|v| v.iter().map(|f| Float3::new(f[0] as f32, f[1] as f32, f[2] as f32)).collect())
        .collect();
    let f32_out = exchange_forces(&plan, &f32_in).unwrap();
    for r in &plan.ranks {
        for (k, &id) in r.global_ids[..r.home_atoms].iter().enumerate() {
            let want = reference[id as usize];
            let size = want.iter().map(|v| v.abs()).sum::<f64>();
            let g32 = f32_out[r.rank][k];
            for (d, got32) in [g32.x, g32.y, g32.z].into_iter().enumerate() {
                let got = f[r.rank][k][d];
                prop_assert!((got - want[d]).abs() <= 1e-9 * size.max(1.0), "atom {id} dim {d}: {got} vs {}", want[d]);
                prop_assert!((f64::from(got32) - want[d]).abs() <= 1e-4 * size.max(rms), "f32 atom {id} dim {d}: {got32} vs {}", want[d]);
            }
        }
    }
    Ok(())
}

fn system_with(positions: &[Float3], box_size: [f32; 3]) -> MolecularSystem {
    let mut s = MolecularSystem::generate(1, 0).expect("one atom");
    s.box_size = box_size;
    s.positions = positions.to_vec();
    s.velocities = vec![Float3::default(); positions.len()];
    s.types = vec![0; positions.len()];
    s
}

proptest! {
    #![proptest_config(config(40))]

    /// Uniformly random atoms (some outside the box, so wrapping is exercised) in random
    /// rectangular boxes; as few as zero atoms, so many pulses are empty.
    #[test]
    fn halo_holds_exactly_the_atoms_within_the_cutoff(
        edges in prop::array::uniform3(1.5f32..4.0),
        grid in grids(),
        frac in 0.1f64..0.97,
        fracs in prop::collection::vec(prop::array::uniform3(-0.5f32..1.5), 0..400),
    ) {
        let min_edge = edges.iter().copied().fold(f32::INFINITY, f32::min);
        let cutoff = (frac * f64::from(min_edge) / 2.0) as f32;
        let positions: Vec<Float3> = fracs.iter().map(|u| Float3::new(u[0] * edges[0], u[1] * edges[1], u[2] * edges[2])).collect();
        let plan = HaloPlan::from_positions(&positions, edges, RankGrid::new(grid).unwrap(), cutoff).unwrap();
        plan.validate().unwrap();
        plan.validate_atoms(positions.len()).unwrap();
        prop_assert_eq!(plan.max_atoms(), plan.ranks.iter().map(|r| r.total_atoms).max().unwrap());
        check_coverage(&plan, &positions)?;
    }

    /// Generated liquids: pairs partitioned over ranks, decomposed forces equal undecomposed ones.
    #[test]
    fn decomposed_forces_equal_undecomposed_forces(
        atoms in 200usize..2000,
        seed in 0u64..1000,
        grid in grids(),
        frac in 0.3f64..0.97,
    ) {
        check_decomposed_forces(atoms, seed, grid, frac)?;
    }

    /// Corrupted plans: rejected with a reason by validation and by every consumer, no panic.
    #[test]
    fn corrupted_plans_are_rejected(
        atoms in 50usize..1200,
        grid in grids().prop_filter("needs pulses", |g| g.iter().any(|&n| n > 1)),
        frac in 0.3f64..0.97,
        kind in 0usize..8,
        pick in any::<prop::sample::Index>(),
        pick2 in any::<prop::sample::Index>(),
    ) {
        let sys = MolecularSystem::generate(atoms, 1).unwrap();
        let cutoff = (frac * f64::from(sys.box_size[0]) / 2.0) as f32;
        let mut plan = HaloPlan::build(&sys, RankGrid::new(grid).unwrap(), cutoff).unwrap();
        let nr = plan.ranks.len();
        let rank = pick.index(nr);
        let np = plan.ranks[rank].pulses.len();
        let pulse = pick2.index(np);
        let r = &mut plan.ranks[rank];
        let total = r.total_atoms as u32;
        let p = &mut r.pulses[pulse];
        match kind {
            // An index out of range (appended if the map is empty: the sizes then disagree too).
            0 => match p.spec.index_map.first_mut() {
                Some(i) => *i = total + 3,
                None => p.spec.index_map.push(total + 3),
            },
            1 => p.spec.recv_size += 1 + pulse,
            2 => { r.pulses.remove(pulse); }
            3 => p.spec.peer_atom_offset += 1,
            4 => p.spec.send_rank = rank,
            5 => { plan.ranks.pop(); }
            // A global id the system does not have (only the check against the system sees it).
            6 => match r.global_ids.first_mut() {
                Some(g) => *g = atoms as u32 + 1,
                None => r.global_ids.push(atoms as u32 + 1),
            },
            _ => p.spec.atom_offset += 1,
        }
        let structural = plan.validate();
        let against_system = structural.clone().and_then(|()| plan.validate_atoms(atoms));
        let err = against_system.expect_err("a corrupted plan must not validate");
        prop_assert!(!err.to_string().is_empty());
        // Every consumer refuses it too.
        prop_assert!(exchange_coordinates(&plan, &sys).is_err());
        prop_assert!(assign_pairs(&plan, &sys, cutoff).is_err());
        let zeros: Vec<Vec<Float3>> = plan.ranks.iter().map(|r| vec![Float3::default(); r.total_atoms]).collect();
        let f = exchange_forces(&plan, &zeros);
        if structural.is_err() {
            prop_assert!(matches!(f, Err(ReferenceError::Plan(_))), "{:?}", f.err());
        }
    }
}

/// Regression: the failure fuzzing found (atoms 1155, seed 315, one rank, frac 0.9162193768931469:
/// 257,540 pairs assigned vs 257,541 "within the cutoff"). Atoms 537 and 597 sit 1e-7 relative
/// outside the cutoff; the brute force measured them inside by subtracting in `f32`. Run on more
/// grids too, since the same pair crosses rank boundaries there.
#[test]
fn pair_at_the_cutoff_found_by_fuzzing() {
    for grid in [[1, 1, 1], [2, 1, 1], [3, 3, 2]] {
        if let Err(e) = check_decomposed_forces(1155, 315, grid, 0.9162193768931469) {
            panic!("{grid:?}: {e}");
        }
    }
}

#[test]
fn bad_inputs_have_clear_errors() {
    let sys = MolecularSystem::generate(300, 1).unwrap();
    let e = HaloPlan::build(&sys, RankGrid::new([2, 1, 1]).unwrap(), sys.box_size[0]).unwrap_err();
    assert!(matches!(e, PlanError::CutoffTooLarge { .. }), "{e}");
    assert!(e.to_string().contains("use a cutoff below"));
    let e = MolecularSystem::generate(0, 1).unwrap_err();
    assert!(e.to_string().contains("0 atoms"));
}

#[test]
fn several_pulses_and_empty_pulses_occur() {
    // 3x3x2 ranks on 5 atoms: most ranks own nothing, so most pulses are empty, yet the plan is valid.
    let sys = MolecularSystem::generate(5, 3).unwrap();
    let cutoff = sys.box_size[0] * 0.45;
    let plan = HaloPlan::build(&sys, RankGrid::new([3, 3, 2]).unwrap(), cutoff).unwrap();
    plan.validate().unwrap();
    assert_eq!(plan.decomposition().unwrap().pulses, [2, 2, 1]);
    let empty = plan.ranks.iter().flat_map(|r| &r.pulses).filter(|p| p.spec.index_map.is_empty()).count();
    assert!(empty > 0);
    check_coverage(&plan, &sys.positions).unwrap();
    assign_pairs(&plan, &sys, cutoff).unwrap();
}
