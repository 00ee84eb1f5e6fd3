//! The GPU selection's host side without a GPU: the kernels' geometry against the host's
//! `pulse_bounds` and `send_range2`, the kernels' rule on it against the host's exact selection
//! (every rank, coordinates on and beside every threshold), the CPU reference against the maps a
//! one-process [`redecompose`] builds, and the error paths.

use super::gpu_select::{check_disjoint, select_geometry, select_reference, selected_in, selection_edges};
use super::plan::{pulse_bounds, select_for_pulse_into, send_range2};
use super::redecompose::Frame;
use super::*;
use crate::error::HaloError;
use crate::system::MolecularSystem;
use crate::testing::selection_atoms;
use kernels_gpu::abi::{Float3, SelectGeometry};

/// The grids and cutoffs of the GPU tests (one and two pulses along a dimension), and more.
const CASES: [([usize; 3], f32); 11] = [
    ([1, 1, 1], 0.9),
    ([2, 1, 1], 0.9),
    ([1, 2, 1], 0.9),
    ([2, 2, 1], 0.9),
    ([2, 2, 2], 0.9),
    ([3, 1, 1], 0.9),
    ([3, 1, 1], 2.5),
    ([4, 1, 1], 0.9),
    ([4, 1, 1], 2.0),
    ([1, 3, 2], 1.2),
    ([2, 2, 3], 1.2),
];

fn geometry_of(dims: [usize; 3], cutoff: f32) -> Decomposition {
    Decomposition::new(RankGrid::new(dims).unwrap(), [7.3, 6.1, 5.7], cutoff).unwrap()
}

#[test]
fn the_cases_have_one_and_two_pulses() {
    let pulses: Vec<usize> = CASES.iter().map(|&(dims, cutoff)| geometry_of(dims, cutoff).pulses.into_iter().max().unwrap()).collect();
    assert!(pulses.contains(&1) && pulses.contains(&2), "{pulses:?}");
}

#[test]
fn the_geometry_holds_the_hosts_bounds_and_range() {
    for (dims, cutoff) in CASES {
        let geo = geometry_of(dims, cutoff);
        let decomposed = geo.grid.decomposed_dims();
        for rank in 0..geo.grid.num_ranks() {
            let g = select_geometry(&geo, rank).unwrap();
            assert_eq!(g.n_dims as usize, decomposed.len(), "{dims:?}");
            assert_eq!(g.rc2.to_bits(), send_range2(cutoff).to_bits());
            for s in 0..3 {
                for i in 0..3 {
                    let want = match (decomposed.get(s), decomposed.get(i)) {
                        (Some(&d), Some(&e)) => pulse_bounds(&geo, rank, d, e),
                        _ => (0.0, 0.0),
                    };
                    assert_eq!((g.lo[s][i].to_bits(), g.hi[s][i].to_bits()), (want.0.to_bits(), want.1.to_bits()), "{dims:?} rank {rank} {s} {i}");
                }
                let want = decomposed.get(s).map_or(0, |&d| d as u32);
                assert_eq!(g.dims[s], want);
            }
        }
    }
}

/// Per slot, whether each atom is selected, from the per-dimension maps.
fn membership(sel: &Selected, n: usize) -> Vec<u32> {
    let mut bits = vec![0u32; n];
    for (s, d) in sel.per_dim.iter().enumerate() {
        for &i in &d.map {
            bits[i as usize] |= 1 << s;
        }
    }
    bits
}

#[test]
fn the_kernels_rule_on_the_geometry_is_the_hosts_exact_selection() {
    let mut partial = false;
    for (dims, cutoff) in CASES {
        let geo = geometry_of(dims, cutoff);
        let decomposed = geo.grid.decomposed_dims();
        let rc2 = send_range2(cutoff);
        for rank in 0..geo.grid.num_ranks() {
            let g = select_geometry(&geo, rank).unwrap();
            let (x, ids) = selection_atoms(&geo, rank, 3000, 11 + rank as u64);
            let got: Vec<u32> = x.iter().map(|&w| selected_in(&g, w)).collect();
            // The exact selection (`select_for_pulse_into`) over the same frame.
            let crossed = vec![0u8; x.len()];
            let frame = Frame { wrapped: &x, crossed: &crossed, edge: geo.box_size.map(f64::from) };
            let mut exact = vec![0u32; x.len()];
            for (s, &d) in decomposed.iter().enumerate() {
                let mut map = Vec::new();
                select_for_pulse_into(&geo, &decomposed, rank, d, &frame, 0, rc2, &mut map);
                map.iter().for_each(|&i| exact[i as usize] |= 1 << s);
            }
            assert_eq!(got, exact, "{dims:?} rank {rank}");
            // The reference (by bit ranges) is the same selection.
            let reference = select_reference(&x, &ids, &geo, rank).unwrap();
            assert_eq!(membership(&reference, x.len()), exact, "{dims:?} rank {rank}");
            assert_eq!(reference.per_dim.len(), decomposed.len());
            // Something sent in every slot; something not, but where the range spans the box
            // (3x1x1 with a cutoff of 2.5: the receiver's cell and 2.5 either side are 7.43 nm).
            for s in 0..decomposed.len() {
                let sent = exact.iter().filter(|&&b| b & (1 << s) != 0).count();
                assert!(sent > 0, "{dims:?} rank {rank} slot {s}: nothing sent");
                partial |= sent < x.len();
            }
        }
    }
    assert!(partial, "atoms not sent");
}

#[test]
fn the_test_atoms_sit_on_the_thresholds_and_either_side() {
    let geo = geometry_of([2, 2, 1], 0.9);
    let edges = selection_edges(&geo, 1);
    assert!(edges[2].is_empty() && edges[0].len() > 10 && edges[1].len() > 10, "{edges:?}");
    let g = select_geometry(&geo, 1).unwrap();
    // Along x, rank 1 sends to cell 0 (slot 0): its term reaches rc2 between two adjacent floats.
    let term = |v: f32| {
        let x = (f64::from(v) - g.hi[0][0]).max(0.0);
        x * x
    };
    assert!(edges[0].windows(2).any(|w| w[1] == w[0].next_up() && term(w[0]) < g.rc2 && term(w[1]) >= g.rc2), "{edges:?}");
    let (x, ids) = selection_atoms(&geo, 1, 4000, 3);
    assert_eq!(x.len(), 4000);
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, (0..4000).map(|i| 3 * i + 1).collect::<Vec<u32>>());
    assert!(x.iter().all(|p| [p.x, p.y, p.z].iter().zip(geo.box_size).all(|(&c, l)| (0.0..l).contains(&c))));
    assert!(x.iter().any(|p| p.x.to_bits() == (-0.0f32).to_bits()), "a -0.0 coordinate");
    let on_edges = x.iter().filter(|p| edges[0].iter().any(|e| e.to_bits() == p.x.to_bits())).count();
    assert!(on_edges > 500, "{on_edges} atoms on the thresholds along x");
}

/// The collective of one process driving every rank: its blobs are everyone's.
fn identity(_tag: &str, mine: Vec<Vec<u8>>) -> crate::error::Result<Vec<Vec<u8>>> {
    Ok(mine)
}

/// Home atoms dealt to the ranks by id, wherever they are: `redecompose` migrates them.
fn dealt(positions: &[Float3], velocities: &[Float3], ranks: usize) -> Vec<HomeAtoms> {
    (0..ranks)
        .map(|r| {
            let ids: Vec<u32> = (r..positions.len()).step_by(ranks).map(|i| i as u32).collect();
            HomeAtoms {
                positions: ids.iter().map(|&i| positions[i as usize]).collect(),
                velocities: ids.iter().map(|&i| velocities[i as usize]).collect(),
                ids,
            }
        })
        .collect()
}

#[test]
fn the_reference_is_the_home_part_of_every_first_pulse_of_a_redecomposition() {
    let sys = MolecularSystem::generate(6000, 5).unwrap();
    let velocities = vec![Float3::default(); sys.positions.len()];
    for (dims, cutoff) in
        [([2, 1, 1], 1.2), ([1, 2, 1], 1.0), ([2, 2, 1], 1.1), ([2, 2, 2], 1.2), ([3, 1, 1], 1.2), ([4, 1, 1], 1.2), ([3, 3, 1], 1.2)]
    {
        let grid = RankGrid::new(dims).unwrap();
        let geo = Decomposition::new(grid, sys.box_size, cutoff).unwrap();
        let ranks: Vec<usize> = (0..grid.num_ranks()).collect();
        let homes = dealt(&sys.positions, &velocities, ranks.len());
        let got = redecompose(grid, sys.box_size, cutoff, sys.positions.len(), &ranks, homes, &mut identity).unwrap();
        for (r, plan) in got.plan.ranks.iter().enumerate() {
            let home = plan.home_atoms;
            let x = &got.local_positions[r][..home];
            let ids = &plan.global_ids[..home];
            let sel = select_reference(x, ids, &geo, r).unwrap();
            let decomposed = grid.decomposed_dims();
            assert_eq!(sel.per_dim.iter().map(|d| d.dim).collect::<Vec<_>>(), decomposed);
            for d in &sel.per_dim {
                let first = plan.pulses.iter().find(|p| p.dim == d.dim && p.pulse_in_dim == 0).expect("a first pulse per decomposed dimension");
                let host: Vec<u32> = first.spec.index_map.iter().copied().filter(|&i| (i as usize) < home).collect();
                assert_eq!(d.map, host, "{dims:?} rank {r} along {}", d.dim);
                assert!(!d.map.is_empty(), "{dims:?} rank {r} along {}: something sent", d.dim);
                assert_eq!(d.ids, d.map.iter().map(|&i| ids[i as usize]).collect::<Vec<_>>());
                let bits = |v: &[Float3]| v.iter().map(|p| [p.x, p.y, p.z].map(f32::to_bits)).collect::<Vec<_>>();
                assert_eq!(bits(&d.positions), bits(&d.map.iter().map(|&i| x[i as usize]).collect::<Vec<_>>()));
            }
        }
    }
}

#[test]
fn bad_inputs_are_refused_with_what_to_change() {
    let geo = geometry_of([2, 1, 1], 0.9);
    match select_geometry(&geo, 2) {
        Err(PlanError::LocalRanks { ranks, reason }) => assert!(ranks == [2] && reason.contains("ranks 0..2"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let one = [Float3::default()];
    let e = select_reference(&one, &[], &geo, 0).unwrap_err().to_string();
    assert!(e.contains("1 positions and 0 ids"), "{e}");
    assert!(matches!(select_reference(&one, &[3], &geo, 5), Err(HaloError::Plan(PlanError::LocalRanks { .. }))));
    // A grid of one rank selects nothing: no slot.
    let single = geometry_of([1, 1, 1], 0.9);
    assert_eq!(select_geometry(&single, 0).unwrap(), SelectGeometry { rc2: send_range2(0.9), ..SelectGeometry::default() });
    assert_eq!(select_reference(&one, &[3], &single, 0).unwrap(), Selected::default());
    assert_eq!(select_reference(&[], &[], &geo, 1).unwrap().per_dim.iter().map(|d| d.map.len()).collect::<Vec<_>>(), [0]);
}

#[test]
fn inputs_overlapping_the_outputs_are_refused() {
    let inputs = [("x", (1000, 120)), ("ids", (3000, 40))];
    assert!(check_disjoint(&inputs, &[("maps", (1120, 40)), ("atoms", (3040, 160))]).is_ok(), "touching is fine");
    let e = check_disjoint(&inputs, &[("maps", (4000, 40)), ("atoms", (3039, 16))]).unwrap_err().to_string();
    assert!(e.contains("`ids` overlaps the selection's own `atoms`"), "{e}");
    assert!(check_disjoint(&inputs, &[("maps", (1000, 0))]).is_ok(), "nothing overlaps an empty range");
}
