//! The GPU migration's host side without a GPU: the kernels' geometry against the host's
//! `CellEdges` (every rank, positions on and beside every threshold), the CPU reference against
//! the host's own first phase of a redecomposition (`Leaving::sort_out`), and the error paths.

use super::gpu_checks::{check_disjoint, check_lengths};
use super::gpu_migrate::{migrate_geometry, migrate_reference, owner_in};
use super::plan::CellEdges;
use super::redecompose::sort_out_home;
use super::*;
use crate::testing::migration_atoms;
use kernels_gpu::abi::{self, Float3, MIGRATE_MAX_EDGES, MigrateGeometry, MigrateLeaver};

/// The grids the GPU tests use, and a larger one.
const GRIDS: [[usize; 3]; 7] = [[1, 1, 1], [2, 1, 1], [2, 2, 1], [2, 2, 2], [3, 1, 1], [1, 3, 2], [4, 3, 2]];

fn geometry_of(dims: [usize; 3]) -> Decomposition {
    Decomposition::new(RankGrid::new(dims).unwrap(), [7.3, 6.1, 5.7], 0.9).unwrap()
}

#[test]
fn the_geometry_holds_the_hosts_thresholds_and_strides() {
    for dims in GRIDS {
        let geo = geometry_of(dims);
        for rank in 0..geo.grid.num_ranks() {
            let g = migrate_geometry(&geo, rank).unwrap();
            assert_eq!((g.rank, g.box_size), (rank as u32, geo.box_size));
            assert_eq!(g.stride, [1, dims[0] as u32, (dims[0] * dims[1]) as u32]);
            for d in 0..3 {
                assert_eq!(g.n_edges[d] as usize, dims[d] - 1, "{dims:?}");
                let want: Vec<u32> = (1..dims[d]).map(|i| geo.cell_threshold(d, i).to_bits()).collect();
                let got: Vec<u32> = g.edges[d][..dims[d] - 1].iter().map(|e| e.to_bits()).collect();
                assert_eq!(got, want, "{dims:?} dimension {d}");
                assert!(g.edges[d][dims[d] - 1..].iter().all(|&e| e == 0.0), "unused thresholds are zero");
            }
        }
    }
}

#[test]
fn the_kernels_owner_rule_on_the_geometry_is_the_hosts_rank_of() {
    for dims in GRIDS {
        let geo = geometry_of(dims);
        let edges = CellEdges::new(&geo);
        let g = migrate_geometry(&geo, 0).unwrap();
        let (x, _, _) = migration_atoms(&geo, 3000, 11);
        for p in x {
            let w = wrap_position(p, geo.box_size);
            assert_eq!(owner_in(&g, w) as usize, edges.rank_of(w), "{dims:?}: {p:?} wrapped to {w:?}");
        }
    }
}

#[test]
fn the_reference_is_the_hosts_first_phase_of_a_redecomposition() {
    for dims in GRIDS {
        let geo = geometry_of(dims);
        for rank in 0..geo.grid.num_ranks() {
            for (n, seed) in [(0, 1), (1, 2), (255, 3), (256, 4), (257, 5), (2000, 6)] {
                let (x, v, ids) = migration_atoms(&geo, n, seed + rank as u64);
                let want = sort_out_home(&geo, rank, &HomeAtoms { ids: ids.clone(), positions: x.clone(), velocities: v.clone() }).unwrap();
                let got = migrate_reference(&x, &v, &ids, &geo, rank).unwrap();
                let bits = |p: &Float3| [p.x.to_bits(), p.y.to_bits(), p.z.to_bits()];
                let stayers: Vec<_> = got.ids.iter().zip(&got.positions).zip(&got.velocities).map(|((&i, p), v)| (i, bits(p), bits(v))).collect();
                let host: Vec<_> = want.0.iter().map(|(i, p, v)| (*i, bits(p), bits(v))).collect();
                assert_eq!(stayers, host, "{dims:?} rank {rank}, {n} atoms: stayers");
                let leavers: Vec<_> = got.leavers.iter().map(|l| (l.owner, l.id, bits(&l.x), bits(&l.v))).collect();
                let host: Vec<_> = want.1.iter().map(|(o, i, p, v)| (*o, *i, bits(p), bits(v))).collect();
                assert_eq!(leavers, host, "{dims:?} rank {rank}, {n} atoms: leavers");
                // The stayers are the input's atoms of this rank, in input order.
                let order: Vec<u32> = ids.iter().copied().filter(|i| !got.leavers.iter().any(|l| l.id == *i)).collect();
                assert_eq!(got.ids, order);
            }
        }
    }
}

#[test]
fn a_non_finite_atom_is_named_by_its_id_as_the_host_names_it() {
    let geo = geometry_of([2, 2, 1]);
    let (mut x, v, ids) = migration_atoms(&geo, 600, 9);
    x[417].z = f32::NAN;
    x[500].x = f32::INFINITY;
    let want = sort_out_home(&geo, 1, &HomeAtoms { ids: ids.clone(), positions: x.clone(), velocities: v.clone() }).unwrap_err();
    let got = migrate_reference(&x, &v, &ids, &geo, 1).unwrap_err();
    match (&got, &want) {
        (PlanError::NonFinitePosition { atom, position }, PlanError::NonFinitePosition { atom: a, position: p }) => {
            assert_eq!((*atom, *a), (ids[417] as usize, ids[417] as usize));
            assert_eq!(position.map(f32::to_bits), p.map(f32::to_bits));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_inputs_are_refused_with_what_to_change() {
    let geo = geometry_of([2, 1, 1]);
    match migrate_geometry(&geo, 2) {
        Err(PlanError::LocalRanks { ranks, reason }) => assert!(ranks == [2] && reason.contains("ranks 0..2"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let wide = Decomposition::new(RankGrid::new([1, MIGRATE_MAX_EDGES + 2, 1]).unwrap(), [4.0, 80.0, 4.0], 1.0).unwrap();
    let e = migrate_geometry(&wide, 0).unwrap_err();
    assert_eq!(e, PlanError::GpuMigrateGrid { dim: "y", ranks: MIGRATE_MAX_EDGES + 2, max: MIGRATE_MAX_EDGES + 1 });
    assert!(e.to_string().contains("at most 17 ranks along y"), "{e}");
    let most = Decomposition::new(RankGrid::new([1, MIGRATE_MAX_EDGES + 1, 1]).unwrap(), [4.0, 80.0, 4.0], 1.0).unwrap();
    assert_eq!(migrate_geometry(&most, 16).unwrap().n_edges, [0, MIGRATE_MAX_EDGES as u32, 0]);
    let one = [Float3::default()];
    let e = migrate_reference(&one, &[], &[7], &geo, 0).unwrap_err();
    assert_eq!(e, PlanError::HomeArrays { rank: 0, ids: 1, positions: 1, velocities: 0 });
}

#[test]
fn short_or_overlapping_arrays_are_refused() {
    let e = check_lengths("GPU migration", 100, &[("x", 100), ("v", 99), ("ids", 50)]).unwrap_err().to_string();
    assert!(e.contains("GPU migration of 100 atoms: `v` holds 99"), "{e}");
    assert!(check_lengths("GPU migration", 0, &[("x", 0)]).is_ok());
    let inputs = [("x", (1000, 120)), ("v", (2000, 120)), ("ids", (3000, 40))];
    assert!(
        check_disjoint("GPU migration", "the stayers", &inputs, &[("x_out", (4000, 120)), ("v_out", (5000, 120)), ("ids_out", (1120, 40))]).is_ok(),
        "touching is fine"
    );
    let e = check_disjoint("GPU migration", "the stayers", &inputs, &[("x_out", (1000, 120))]).unwrap_err().to_string();
    assert!(e.contains("`x_out` overlaps `x`"), "{e}");
    let e = check_disjoint("GPU migration", "the stayers", &inputs, &[("x_out", (4000, 120)), ("v_out", (4119, 120))]).unwrap_err().to_string();
    assert!(e.contains("`v_out` overlaps `x_out`"), "{e}");
    // No atoms: nothing is read or written.
    assert!(check_disjoint("GPU migration", "the stayers", &[("x", (1000, 0))], &[("x_out", (1000, 0))]).is_ok());
}

#[test]
fn the_launch_has_a_block_even_without_atoms() {
    assert_eq!([0, 1, 256, 257, 45_000].map(abi::migrate_blocks), [1, 1, 1, 2, 176]);
}

/// The three passes replayed on the CPU as the kernels run them, thread by thread: blocks of
/// `MIGRATE_THREADS`, warps of 32 with their ballots, the warps' counts, the one-block scan with
/// each thread's run of blocks, and the places; owners by the kernels' rule on the geometry. Each
/// place must be written once. Returns the stayers (id, wrapped position, velocity) and leavers.
#[allow(clippy::type_complexity)]
fn replay(g: &MigrateGeometry, x: &[Float3], v: &[Float3], ids: &[u32]) -> (Vec<(u32, Float3, Float3)>, Vec<MigrateLeaver>) {
    const T: usize = abi::MIGRATE_THREADS as usize;
    const S: usize = abi::MIGRATE_SCAN_THREADS as usize;
    let n = x.len();
    // 0: stays, 1: leaves, 2: neither (non-finite, or past the last atom).
    let sort = |i: usize| -> (usize, Float3, u32) {
        let Some(&p) = x.get(i) else { return (2, Float3::default(), 0) };
        if !(p.x.is_finite() && p.y.is_finite() && p.z.is_finite()) {
            return (2, p, 0);
        }
        let w = wrap_position(p, g.box_size);
        let owner = owner_in(g, w);
        (if owner == g.rank { 0 } else { 1 }, w, owner)
    };
    let blocks = abi::migrate_blocks(n as u32) as usize;
    // Per block, per warp: the two ballots.
    let ballots: Vec<Vec<[u32; 2]>> = (0..blocks)
        .map(|b| {
            (0..T / 32)
                .map(|w| {
                    let mut m = [0u32; 2];
                    for lane in 0..32 {
                        let (kind, _, _) = sort(b * T + w * 32 + lane);
                        if kind < 2 {
                            m[kind] |= 1 << lane;
                        }
                    }
                    m
                })
                .collect()
        })
        .collect();
    // Pass 1: the blocks' counts.
    let mut counts: Vec<[u32; 2]> =
        ballots.iter().map(|ws| ws.iter().fold([0, 0], |c, m| [c[0] + m[0].count_ones(), c[1] + m[1].count_ones()])).collect();
    // Pass 2: each scan thread a run of blocks, the runs scanned, each run written.
    let per = blocks.div_ceil(S);
    let runs: Vec<(usize, usize)> = (0..S).map(|t| ((t * per).min(blocks), (t * per + per).min(blocks))).collect();
    let mut at = [0u32; 2];
    for &(b0, b1) in &runs {
        for c in &mut counts[b0..b1] {
            let here = *c;
            *c = at;
            at = [at[0] + here[0], at[1] + here[1]];
        }
    }
    // Pass 3: the places.
    let mut stayers = vec![None; at[0] as usize];
    let mut leavers = vec![None; at[1] as usize];
    for (b, ws) in ballots.iter().enumerate() {
        for (w, _) in ws.iter().enumerate() {
            for lane in 0..32 {
                let i = b * T + w * 32 + lane;
                let (kind, p, owner) = sort(i);
                if kind == 2 {
                    continue;
                }
                let place = (ws[w][kind] & ((1u32 << lane) - 1)).count_ones() + ws[..w].iter().map(|m| m[kind].count_ones()).sum::<u32>();
                let slot = (counts[b][kind] + place) as usize;
                if kind == 0 {
                    assert!(stayers[slot].replace((ids[i], p, v[i])).is_none(), "stayer place {slot} written twice");
                } else {
                    assert!(leavers[slot].replace(MigrateLeaver { id: ids[i], x: p, v: v[i], owner }).is_none(), "leaver place {slot} twice");
                }
            }
        }
    }
    (stayers.into_iter().map(|s| s.expect("every stayer place written")).collect(), leavers.into_iter().map(|l| l.expect("written")).collect())
}

#[test]
fn the_passes_replayed_on_the_cpu_split_as_the_host_does() {
    for (dims, rank) in [([2, 2, 1], 0), ([3, 1, 1], 1), ([2, 2, 2], 7)] {
        let geo = geometry_of(dims);
        let g = migrate_geometry(&geo, rank).unwrap();
        for (n, seed) in [(0, 1), (1, 2), (31, 3), (32, 4), (33, 5), (255, 6), (256, 7), (257, 8), (513, 9), (262_145, 10)] {
            let (x, v, ids) = migration_atoms(&geo, n, seed);
            let want = migrate_reference(&x, &v, &ids, &geo, rank).unwrap();
            let (stayers, leavers) = replay(&g, &x, &v, &ids);
            let bits = |p: &Float3| [p.x.to_bits(), p.y.to_bits(), p.z.to_bits()];
            let got: Vec<_> = stayers.iter().map(|(i, p, v)| (*i, bits(p), bits(v))).collect();
            let host: Vec<_> = want.ids.iter().zip(&want.positions).zip(&want.velocities).map(|((&i, p), v)| (i, bits(p), bits(v))).collect();
            assert_eq!(got, host, "{dims:?} rank {rank}, {n} atoms");
            let cast = |l: &[MigrateLeaver]| bytemuck::cast_slice::<MigrateLeaver, u32>(l).to_vec();
            assert_eq!(cast(&leavers), cast(&want.leavers), "{dims:?} rank {rank}, {n} atoms");
        }
    }
    // Non-finite atoms are in neither list.
    let geo = geometry_of([2, 1, 1]);
    let (mut x, v, ids) = migration_atoms(&geo, 700, 5);
    x[300].y = f32::NAN;
    let (stayers, leavers) = replay(&migrate_geometry(&geo, 0).unwrap(), &x, &v, &ids);
    assert_eq!(stayers.len() + leavers.len(), 699);
    assert!(stayers.iter().all(|s| s.0 != ids[300]) && leavers.iter().all(|l| l.id != ids[300]));
}
