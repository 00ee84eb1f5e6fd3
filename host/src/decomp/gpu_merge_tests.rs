//! The GPU merge's host side without a GPU: the CPU reference against the host's own merge of a
//! redecomposition (`Working::new` after `Leaving::sort_out`), the kernel's placing rule replayed
//! thread by thread, the order checks, and the whole chain (migration, leavers routed to their
//! owners, merge) on every rank of a grid against [`redecompose`].

use super::gpu_merge::{below, merge_reference, order_flags};
use super::gpu_migrate::migrate_reference;
use super::redecompose::merge_home;
use super::*;
use crate::system::MolecularSystem;
use crate::testing::{homes_of, migration_atoms, moved_positions};
use kernels_gpu::abi::{Float3, MigrateLeaver};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn geometry_of(dims: [usize; 3]) -> Decomposition {
    Decomposition::new(RankGrid::new(dims).unwrap(), [7.3, 6.1, 5.7], 0.9).unwrap()
}

fn bits(v: &[Float3]) -> Vec<[u32; 3]> {
    v.iter().map(|p| [p.x.to_bits(), p.y.to_bits(), p.z.to_bits()]).collect()
}

/// A rank's home atoms in id order (as the last plan leaves them): `n` atoms of
/// `testing::migration_atoms` (ids `3 i + 1`), sorted by id.
fn homes_in_order(geo: &Decomposition, n: usize, seed: u64) -> HomeAtoms {
    let (x, v, ids) = migration_atoms(geo, n, seed);
    let mut all: Vec<_> = ids.into_iter().zip(x).zip(v).collect();
    all.sort_by_key(|((i, _), _)| *i);
    HomeAtoms {
        ids: all.iter().map(|a| a.0.0).collect(),
        positions: all.iter().map(|a| a.0.1).collect(),
        velocities: all.iter().map(|a| a.1).collect(),
    }
}

/// `n` arrivals in random order with ids no home atom of [`homes_in_order`] has (`3 i`, `3 i + 2`),
/// drawn from `lo..hi` (in units of three ids), wrapped positions in the box.
fn arrivals(geo: &Decomposition, n: usize, (lo, hi): (u32, u32), seed: u64) -> Vec<MigrateLeaver> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let b = geo.box_size;
    let mut ids: Vec<u32> = (lo..hi).flat_map(|i| [3 * i, 3 * i + 2]).collect();
    ids.shuffle(&mut rng);
    ids.truncate(n);
    ids.into_iter()
        .map(|id| MigrateLeaver {
            id,
            x: Float3::new(rng.random_range(0.0..b[0]), rng.random_range(0.0..b[1]), rng.random_range(0.0..b[2])),
            v: Float3::new(rng.random_range(-2.0..2.0), rng.random_range(-2.0..2.0), rng.random_range(-2.0..2.0)),
            owner: 0,
        })
        .collect()
}

#[test]
fn the_reference_is_the_hosts_merge() {
    for dims in [[1, 1, 1], [2, 1, 1], [2, 2, 1], [2, 2, 2], [3, 1, 1]] {
        let geo = geometry_of(dims);
        for rank in 0..geo.grid.num_ranks() {
            // Homes of 0 to 2,000 atoms (ids 1 to 6,000), arrivals none, before all, after all, among them.
            for (k, (n, na, range)) in [
                (0, 0, (0, 1)),
                (0, 40, (0, 100)),
                (700, 0, (0, 1)),
                (700, 1, (0, 1)),
                (700, 30, (700, 900)),
                (2000, 300, (0, 2000)),
                (257, 255, (0, 400)),
            ]
            .into_iter()
            .enumerate()
            {
                let seed = 10 * rank as u64 + k as u64;
                let h = homes_in_order(&geo, n, seed);
                let arrivals: Vec<MigrateLeaver> =
                    arrivals(&geo, na, range, seed).into_iter().map(|a| MigrateLeaver { owner: rank as u32, ..a }).collect();
                let moving = arrivals.iter().map(|a| (a.id, a.x, a.v)).collect();
                let (ids, wrapped, velocities) = merge_home(&geo, rank, &h, moving).unwrap();
                let stay = migrate_reference(&h.positions, &h.velocities, &h.ids, &geo, rank).unwrap();
                let got = merge_reference(&stay.ids, &stay.positions, &stay.velocities, &arrivals, rank).unwrap();
                let test = format!("{dims:?} rank {rank}, {n} atoms, {na} arrivals");
                assert_eq!(got.ids, ids, "{test}: ids");
                assert_eq!(bits(&got.positions), bits(&wrapped), "{test}: positions");
                assert_eq!(bits(&got.velocities), bits(&velocities), "{test}: velocities");
                assert!(got.ids.windows(2).all(|w| w[0] < w[1]), "{test}: id order");
                assert_eq!(got.ids.len(), stay.ids.len() + na, "{test}");
            }
        }
    }
}

/// The kernel replayed on the CPU, one thread per output atom: stayer `i` to `i` plus the arrivals
/// of smaller id, arrival `j` to `j` plus the stayers of smaller id (the kernel's halving search).
/// Every place must be written once. Returns the merged (id, position, velocity).
fn replay(ids: &[u32], x: &[Float3], v: &[Float3], arrivals: &[MigrateLeaver]) -> Vec<(u32, Float3, Float3)> {
    let (ns, na) = (ids.len(), arrivals.len());
    let mut out = vec![None; ns + na];
    for t in 0..ns + na {
        let (at, atom) = if t < ns {
            (t + below(na, ids[t], |k| arrivals[k].id), (ids[t], x[t], v[t]))
        } else {
            let a = &arrivals[t - ns];
            (t - ns + below(ns, a.id, |k| ids[k]), (a.id, a.x, a.v))
        };
        assert!(out[at].replace(atom).is_none(), "place {at} written twice");
    }
    out.into_iter().map(|a| a.expect("every place written")).collect()
}

#[test]
fn the_kernels_places_are_the_reference() {
    let geo = geometry_of([2, 2, 1]);
    for (k, (n, na, range)) in
        [(0, 0, (0, 1)), (0, 5, (0, 9)), (600, 0, (0, 1)), (600, 200, (0, 300)), (600, 50, (0, 10)), (600, 50, (590, 700)), (5000, 999, (0, 5000))]
            .into_iter()
            .enumerate()
    {
        let h = homes_in_order(&geo, n, k as u64);
        let mut a = arrivals(&geo, na, range, k as u64);
        a.sort_by_key(|a| a.id);
        let want = merge_reference(&h.ids, &h.positions, &h.velocities, &a, 0).unwrap();
        let got = replay(&h.ids, &h.positions, &h.velocities, &a);
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), want.ids, "{n} stayers, {na} arrivals");
        assert_eq!(bits(&got.iter().map(|g| g.1).collect::<Vec<_>>()), bits(&want.positions));
        assert_eq!(bits(&got.iter().map(|g| g.2).collect::<Vec<_>>()), bits(&want.velocities));
    }
    // The search: the ids below the key, for every key around every id.
    let ids = [2u32, 5, 9, 10, 40];
    for key in 0..45 {
        assert_eq!(below(ids.len(), key, |k| ids[k]), ids.iter().filter(|&&i| i < key).count(), "key {key}");
    }
    assert_eq!(below(0, 7, |_| unreachable!()), 0);
    assert_eq!(below(3, u32::MAX, |k| [0, 1, u32::MAX][k]), 2);
}

#[test]
fn order_problems_are_named_with_the_fix() {
    let geo = geometry_of([2, 1, 1]);
    let h = homes_in_order(&geo, 500, 3);
    let a = arrivals(&geo, 40, (0, 500), 3);
    let flags = |e: PlanError| match e {
        PlanError::GpuMergeOrder { rank: 1, stayers: 500, stayers_unordered, arrivals_unordered, repeated, .. } => {
            (stayers_unordered, arrivals_unordered, repeated)
        }
        other => panic!("{other:?}"),
    };
    let merge = |ids: &[u32], a: &[MigrateLeaver]| merge_reference(ids, &h.positions, &h.velocities, a, 1);
    assert!(merge(&h.ids, &a).is_ok());
    // Stayers out of order, or one held twice.
    let mut swapped = h.ids.clone();
    swapped.swap(100, 101);
    assert_eq!(flags(merge(&swapped, &a).unwrap_err()), (true, false, false));
    let mut twice = h.ids.clone();
    twice[300] = twice[299];
    assert_eq!(flags(merge(&twice, &a).unwrap_err()), (true, false, false));
    // An arrival twice, or an arrival that is a stayer (first, middle, last).
    let mut dup = a.clone();
    dup.push(a[7]);
    assert_eq!(flags(merge(&h.ids, &dup).unwrap_err()), (false, true, false));
    for s in [0, 250, 499] {
        let mut again = a.clone();
        again.push(MigrateLeaver { id: h.ids[s], ..a[0] });
        assert_eq!(flags(merge(&h.ids, &again).unwrap_err()), (false, false, true), "stayer {s}");
    }
    let e = merge(&swapped, &dup).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("rank 1: the GPU merge of 41 arrivals into 500 stayers"), "{text}");
    assert!(text.contains("the stayers' ids do not ascend strictly") && text.contains("an arrival's id repeats"), "{text}");
    assert!(text.contains("redecompose this step on the host (decomp::redecompose)"), "{text}");
    assert_eq!(flags(e), (true, true, false));
    // Different lengths.
    let e = merge_reference(&h.ids, &h.positions[1..], &h.velocities, &a, 1).unwrap_err();
    assert_eq!(e, PlanError::HomeArrays { rank: 1, ids: 500, positions: 499, velocities: 500 });
    // The flags are the kernel's rule: neighbours, and the stayer each arrival's search finds.
    assert_eq!(order_flags(&[1, 3, 5], &[MigrateLeaver { id: 3, ..a[0] }]), (false, false, true));
    assert_eq!(order_flags(&[], &[a[0], a[0]]), (false, true, false));
    // An input not in the last plan's order: the host merges it, the GPU merge refuses it.
    let (x, v, ids) = migration_atoms(&geo, 500, 4);
    let shuffled = HomeAtoms { ids: ids.clone(), positions: x.clone(), velocities: v.clone() };
    assert!(merge_home(&geo, 1, &shuffled, Vec::new()).is_ok());
    let stay = migrate_reference(&x, &v, &ids, &geo, 1).unwrap();
    match merge_reference(&stay.ids, &stay.positions, &stay.velocities, &[], 1) {
        Err(PlanError::GpuMergeOrder { stayers_unordered: true, .. }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn migration_routing_and_merge_on_every_rank_are_redecompose() {
    let sys = MolecularSystem::generate(3000, 7).unwrap();
    for (k, dims) in [[2, 1, 1], [2, 2, 1], [2, 2, 2], [3, 1, 1]].into_iter().enumerate() {
        let grid = RankGrid::new(dims).unwrap();
        let cutoff = 0.9;
        let geo = Decomposition::new(grid, sys.box_size, cutoff).unwrap();
        let before = HaloPlan::from_positions(&sys.positions, sys.box_size, grid, cutoff).unwrap();
        let x = moved_positions(&sys.positions, sys.box_size, k as u64);
        let mut rng = ChaCha8Rng::seed_from_u64(k as u64);
        let v: Vec<Float3> = x.iter().map(|_| Float3::new(rng.random_range(-2.0..2.0), rng.random(), rng.random())).collect();
        let homes: Vec<HomeAtoms> = homes_of(&before, &x, &v);
        let ranks: Vec<usize> = (0..grid.num_ranks()).collect();
        let want = redecompose(grid, sys.box_size, cutoff, x.len(), &ranks, homes.clone(), &mut |_, mine| Ok(mine)).unwrap();
        // Each rank's migration; the leavers to their owners, rank by rank in order; each merge.
        let migrated: Vec<_> =
            homes.iter().enumerate().map(|(r, h)| migrate_reference(&h.positions, &h.velocities, &h.ids, &geo, r).unwrap()).collect();
        let mut arrivals = vec![Vec::new(); ranks.len()];
        for m in &migrated {
            for l in &m.leavers {
                arrivals[l.owner as usize].push(*l);
            }
        }
        let mut moving = 0;
        for (r, m) in migrated.iter().enumerate() {
            moving += arrivals[r].len();
            let got = merge_reference(&m.ids, &m.positions, &m.velocities, &arrivals[r], r).unwrap();
            let home = want.homes[r].ids.len();
            assert_eq!(got.ids, want.homes[r].ids, "{dims:?} rank {r}: ids");
            assert_eq!(bits(&got.velocities), bits(&want.homes[r].velocities), "{dims:?} rank {r}: velocities");
            assert_eq!(bits(&got.positions), bits(&want.local_positions[r][..home]), "{dims:?} rank {r}: wrapped positions");
        }
        assert!(moving > 30, "{dims:?}: {moving} atoms moved between ranks");
    }
}
