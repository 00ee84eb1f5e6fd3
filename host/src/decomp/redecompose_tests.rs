//! [`redecompose`] against the global builder: the same plan, bit for bit, from each process's
//! own ranks' atoms after they moved, on one process and on several emulated ones.

use super::home_check::{BadHome, IdSums, RankHomes};
use super::plan::send_range2;
use super::redecompose::Frame;
use super::select::select_wrapped_into;
use super::*;
use crate::error::{HaloError, Result};
use crate::system::MolecularSystem;
use crate::testing::{homes_of, moved_atoms as moved};
use kernels_gpu::abi::Float3;
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::sync::{Barrier, Mutex};

/// The collective of one process driving every rank: its blobs are everyone's.
fn identity(_tag: &str, mine: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
    Ok(mine)
}

/// `positions` moved as in a search interval: a few hundredths of a nm each (seed 4).
fn interval_motion(positions: &[Float3]) -> Vec<Float3> {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    positions
        .iter()
        .map(|p| Float3::new(p.x + rng.random_range(-0.03..0.03), p.y + rng.random_range(-0.03..0.03), p.z + rng.random_range(-0.03..0.03)))
        .collect()
}

fn push(h: &mut HomeAtoms, (id, p, v): (u32, Float3, Float3)) {
    h.ids.push(id);
    h.positions.push(p);
    h.velocities.push(v);
}

fn bits(v: &[Float3]) -> Vec<[u32; 3]> {
    v.iter().map(|p| [p.x.to_bits(), p.y.to_bits(), p.z.to_bits()]).collect()
}

/// `got` (for `ranks`) is the global builder's plan at `positions` (without the global ids of the
/// ranks another process drives), with the homes and local positions that follow from it.
fn check(got: &Redecomposed, ranks: &[usize], positions: &[Float3], velocities: &[Float3], want: &HaloPlan) {
    assert_eq!(got.plan, without_others_ids(want, ranks));
    assert_eq!((got.homes.len(), got.local_positions.len(), got.local_positions_from.len()), (ranks.len(), ranks.len(), ranks.len()));
    let wrapped = |i: u32| wrap_position(positions[i as usize], want.box_size);
    for (((&r, home), local), &from) in ranks.iter().zip(&got.homes).zip(&got.local_positions).zip(&got.local_positions_from) {
        let plan = &want.ranks[r];
        assert_eq!(home.ids, plan.global_ids[..plan.home_atoms], "rank {r}");
        assert!(home.positions.is_empty(), "rank {r}: the home positions are the local ones");
        assert!(from == 0 || from == plan.home_atoms, "rank {r}: local positions from atom {from} of {} home atoms", plan.home_atoms);
        assert_eq!(bits(&home.velocities), bits(&home.ids.iter().map(|&i| velocities[i as usize]).collect::<Vec<_>>()), "rank {r}");
        assert_eq!(bits(local), bits(&plan.global_ids[from..].iter().map(|&i| wrapped(i)).collect::<Vec<_>>()), "rank {r}");
    }
}

/// `plan` as a process that drives `ranks` holds it after a redecomposition: the other ranks'
/// global ids are not there.
fn without_others_ids(plan: &HaloPlan, ranks: &[usize]) -> HaloPlan {
    let mut plan = plan.clone();
    plan.ranks.iter_mut().filter(|r| !ranks.contains(&r.rank)).for_each(|r| r.global_ids.clear());
    plan
}

/// The home atoms of a result as input again: ids, wrapped positions (from the local ones) and
/// velocities.
fn homes_again(got: &Redecomposed) -> Vec<HomeAtoms> {
    got.homes
        .iter()
        .zip(&got.local_positions)
        .map(|(h, local)| HomeAtoms { ids: h.ids.clone(), positions: local[..h.ids.len()].to_vec(), velocities: h.velocities.clone() })
        .collect()
}

/// Runs [`redecompose`] on one emulated process per entry of `processes` (the ranks it drives),
/// each in its own thread, with a collective over shared memory that also checks that every
/// process names the same collective at the same time.
fn on_processes(
    processes: &[Vec<usize>],
    grid: RankGrid,
    box_size: [f32; 3],
    cutoff: f32,
    atoms: usize,
    homes: &[HomeAtoms],
) -> Vec<Result<Redecomposed>> {
    run_processes(&SharedCollective::new(grid, processes.len(), false), processes, grid, box_size, cutoff, atoms, homes, None)
}

/// [`on_processes`] over `collective`, each process's plans carrying what `rider` makes of them
/// when given.
#[allow(clippy::too_many_arguments)]
fn run_processes(
    collective: &SharedCollective,
    processes: &[Vec<usize>],
    grid: RankGrid,
    box_size: [f32; 3],
    cutoff: f32,
    atoms: usize,
    homes: &[HomeAtoms],
    rider: Option<fn(&RankPlan) -> Vec<u8>>,
) -> Vec<Result<Redecomposed>> {
    std::thread::scope(|scope| {
        let threads: Vec<_> = processes
            .iter()
            .map(|ranks| {
                let mine = ranks.iter().map(|&r| homes[r].clone()).collect();
                scope.spawn(move || {
                    let mut gather = |tag: &str, blobs: Vec<Vec<u8>>| collective.gather(ranks, tag, blobs);
                    let Some(make) = rider else { return redecompose(grid, box_size, cutoff, atoms, ranks, mine, &mut gather) };
                    let mut rider = |p: &RankPlan| Ok(make(p));
                    let (w, mut sc) = (crate::workers::Workers::serial(), RedecomposeScratch::default());
                    redecompose_with(grid, box_size, cutoff, atoms, ranks, mine, &mut gather, Some(&mut rider), &w, &mut sc)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("a process panicked")).collect()
    })
}

/// The all-gather of processes emulated by threads, over shared memory: every rank's blob, once
/// every process has given its own, with a check that every process names the same collective at
/// the same time; with `record`, every collective's blobs kept by tag.
struct SharedCollective {
    slots: Mutex<(Vec<Vec<u8>>, Vec<String>)>,
    barrier: Barrier,
    record: Option<Mutex<HashMap<String, Vec<Vec<u8>>>>>,
}

impl SharedCollective {
    fn new(grid: RankGrid, processes: usize, record: bool) -> Self {
        Self {
            slots: Mutex::new((vec![Vec::new(); grid.num_ranks()], Vec::new())),
            barrier: Barrier::new(processes),
            record: record.then(|| Mutex::new(HashMap::new())),
        }
    }

    /// The collective `tag` of a process driving `ranks`, which gives `blobs` (one per rank).
    fn gather(&self, ranks: &[usize], tag: &str, blobs: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
        {
            let mut s = self.slots.lock().map_err(|e| HaloError::InvalidInput(e.to_string()))?;
            ranks.iter().zip(blobs).for_each(|(&r, b)| s.0[r] = b);
            s.1.push(tag.to_string());
        }
        self.barrier.wait();
        let all = {
            let s = self.slots.lock().map_err(|e| HaloError::InvalidInput(e.to_string()))?;
            assert!(s.1.iter().all(|t| t == tag), "collectives out of step: {:?}", s.1);
            s.0.clone()
        };
        if self.barrier.wait().is_leader() {
            self.slots.lock().map_err(|e| HaloError::InvalidInput(e.to_string()))?.1.clear();
            if let Some(record) = &self.record {
                record.lock().map_err(|e| HaloError::InvalidInput(e.to_string()))?.insert(tag.to_string(), all.clone());
            }
        }
        self.barrier.wait();
        Ok(all)
    }
}

/// What the rider test makes of a rank's plan: bytes that differ from rank to rank and from
/// plan to plan (none for rank 1, whose plan then carries an empty rider).
fn rider_of(p: &RankPlan) -> Vec<u8> {
    if p.rank == 1 {
        return Vec::new();
    }
    let maps: usize = p.pulses.iter().flat_map(|q| &q.spec.index_map).map(|&m| m as usize).sum();
    let words = [p.rank, p.home_atoms, p.total_atoms, p.pulses.len(), maps];
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Each rank's rider travels with its plan: every process, whatever ranks it drives, gets every
/// rank's rider of the plan it got; without a rider every entry is empty.
#[test]
fn riders_travel_with_the_plans_to_every_process() {
    let sys = MolecularSystem::generate(3000, 5).unwrap();
    let (grid, cutoff) = (RankGrid::new([2, 2, 1]).unwrap(), 1.1);
    let before = HaloPlan::from_positions(&sys.positions, sys.box_size, grid, cutoff).unwrap();
    let (positions, velocities) = moved(&sys.positions, sys.box_size, 3);
    let homes = homes_of(&before, &positions, &velocities);
    for processes in [vec![vec![0, 1, 2, 3]], vec![vec![0], vec![1], vec![2], vec![3]], vec![vec![2, 0], vec![3, 1]]] {
        let collective = SharedCollective::new(grid, processes.len(), false);
        let results = run_processes(&collective, &processes, grid, sys.box_size, cutoff, positions.len(), &homes, Some(rider_of));
        for (ranks, got) in processes.iter().zip(results) {
            let got = got.unwrap();
            let want: Vec<Vec<u8>> = got.plan.ranks.iter().map(rider_of).collect();
            assert!(want.iter().filter(|w| !w.is_empty()).count() == 3, "the riders must be there to check");
            assert_eq!(got.riders, want, "process of ranks {ranks:?}");
        }
    }
    let ranks: Vec<usize> = (0..4).collect();
    let got = redecompose(grid, sys.box_size, cutoff, positions.len(), &ranks, homes, &mut identity).unwrap();
    assert_eq!(got.riders, vec![Vec::<u8>::new(); 4]);
}

/// Grids and cutoffs: one to three decomposed dimensions, one pulse and two.
const CASES: [([usize; 3], f32); 8] =
    [([2, 1, 1], 1.2), ([3, 1, 1], 1.0), ([2, 2, 1], 1.1), ([2, 2, 2], 1.2), ([1, 2, 1], 1.0), ([3, 1, 1], 1.2), ([4, 1, 1], 1.2), ([3, 3, 1], 1.2)];

#[test]
fn one_process_gets_the_global_plan_after_the_atoms_moved() {
    let sys = MolecularSystem::generate(4000, 11).unwrap();
    let mut two_pulses = false;
    // One scratch through every grid (more ranks and fewer), on one worker and on three: the
    // result of a fresh scratch on the calling thread.
    let mut scratch = RedecomposeScratch::default();
    let three = crate::workers::Workers::new(3).unwrap();
    for (k, (dims, cutoff)) in CASES.into_iter().enumerate() {
        let grid = RankGrid::new(dims).unwrap();
        two_pulses |= Decomposition::new(grid, sys.box_size, cutoff).unwrap().pulses.contains(&2);
        let before = HaloPlan::from_positions(&sys.positions, sys.box_size, grid, cutoff).unwrap();
        let (positions, velocities) = moved(&sys.positions, sys.box_size, k as u64);
        let want = HaloPlan::from_positions(&positions, sys.box_size, grid, cutoff).unwrap();
        let ranks: Vec<usize> = (0..grid.num_ranks()).collect();
        let homes = homes_of(&before, &positions, &velocities);
        let got = redecompose(grid, sys.box_size, cutoff, positions.len(), &ranks, homes, &mut identity).unwrap();
        check(&got, &ranks, &positions, &velocities, &want);
        // Again from there: homes that came from a plan, sorted, wrapped.
        let again = homes_again(&got);
        let got = redecompose_with(grid, sys.box_size, cutoff, positions.len(), &ranks, again, &mut identity, None, &three, &mut scratch).unwrap();
        check(&got, &ranks, &positions, &velocities, &want);
        // And again with the result's arrays handed back, the input in the scratch's arrays.
        let again = homes_again(&got);
        scratch.recycle(got);
        let spared = again
            .iter()
            .map(|h| {
                let mut s = scratch.home_arrays(h.ids.len());
                s.ids.extend_from_slice(&h.ids);
                s.positions.extend_from_slice(&h.positions);
                s.velocities.extend_from_slice(&h.velocities);
                s
            })
            .collect();
        let w = if k % 2 == 0 { &three } else { &crate::workers::Workers::serial() };
        let got = redecompose_with(grid, sys.box_size, cutoff, positions.len(), &ranks, spared, &mut identity, None, w, &mut scratch).unwrap();
        check(&got, &ranks, &positions, &velocities, &want);
        scratch.recycle(got);
    }
    assert!(two_pulses, "a case with two pulses along a dimension");
}

#[test]
fn every_process_gets_the_same_plan() {
    let sys = MolecularSystem::generate(3000, 5).unwrap();
    let splits: [([usize; 3], f32, Vec<Vec<usize>>); 5] = [
        ([2, 1, 1], 1.2, vec![vec![0], vec![1]]),
        ([2, 2, 1], 1.1, vec![vec![0, 3], vec![1, 2]]),
        ([2, 2, 1], 1.1, vec![vec![0], vec![1], vec![2], vec![3]]),
        ([2, 2, 2], 1.2, vec![vec![7, 1, 2], vec![0], vec![3, 4, 5, 6]]),
        ([3, 1, 1], 1.2, vec![vec![2, 0], vec![1]]),
    ];
    for (k, (dims, cutoff, processes)) in splits.into_iter().enumerate() {
        let grid = RankGrid::new(dims).unwrap();
        let before = HaloPlan::from_positions(&sys.positions, sys.box_size, grid, cutoff).unwrap();
        let (positions, velocities) = moved(&sys.positions, sys.box_size, 100 + k as u64);
        let want = HaloPlan::from_positions(&positions, sys.box_size, grid, cutoff).unwrap();
        let homes = homes_of(&before, &positions, &velocities);
        for (ranks, got) in processes.iter().zip(on_processes(&processes, grid, sys.box_size, cutoff, positions.len(), &homes)) {
            check(&got.unwrap(), ranks, &positions, &velocities, &want);
        }
    }
}

#[test]
fn the_order_of_the_home_atoms_does_not_matter() {
    let sys = MolecularSystem::generate(3000, 8).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let grid = RankGrid::new([2, 2, 1]).unwrap();
    let before = HaloPlan::from_positions(&sys.positions, sys.box_size, grid, 1.1).unwrap();
    let (positions, velocities) = moved(&sys.positions, sys.box_size, 9);
    let want = HaloPlan::from_positions(&positions, sys.box_size, grid, 1.1).unwrap();
    let homes: Vec<HomeAtoms> = homes_of(&before, &positions, &velocities)
        .into_iter()
        .map(|h| {
            let mut order: Vec<usize> = (0..h.ids.len()).collect();
            order.shuffle(&mut rng);
            HomeAtoms {
                ids: order.iter().map(|&k| h.ids[k]).collect(),
                positions: order.iter().map(|&k| h.positions[k]).collect(),
                velocities: order.iter().map(|&k| h.velocities[k]).collect(),
            }
        })
        .collect();
    let ranks = [0, 1, 2, 3];
    check(
        &redecompose(grid, sys.box_size, 1.1, positions.len(), &ranks, homes.clone(), &mut identity).unwrap(),
        &ranks,
        &positions,
        &velocities,
        &want,
    );
    // Atoms dealt to the wrong ranks altogether: still the same plan.
    let all: Vec<(u32, Float3, Float3)> = homes.iter().flat_map(|h| (0..h.ids.len()).map(|k| (h.ids[k], h.positions[k], h.velocities[k]))).collect();
    let mut dealt = vec![HomeAtoms::default(); 4];
    for (k, &(id, p, v)) in all.iter().enumerate() {
        let h = &mut dealt[k * 7 % 4];
        push(h, (id, p, v));
    }
    check(&redecompose(grid, sys.box_size, 1.1, positions.len(), &ranks, dealt, &mut identity).unwrap(), &ranks, &positions, &velocities, &want);
}

#[test]
fn bad_inputs_are_errors_on_every_process() {
    let sys = MolecularSystem::generate(2000, 2).unwrap();
    let grid = RankGrid::new([2, 2, 1]).unwrap();
    let plan = HaloPlan::build(&sys, grid, 1.0).unwrap();
    let homes = homes_of(&plan, &sys.positions, &sys.velocities);
    let n = sys.positions.len();
    let processes = vec![vec![0, 3], vec![1], vec![2]];
    let on_all = |homes: &[HomeAtoms], atoms: usize| -> Vec<String> {
        on_processes(&processes, grid, sys.box_size, 1.0, atoms, homes).into_iter().map(|r| r.map(|_| ()).unwrap_err().to_string()).collect()
    };

    // A non-finite position on rank 2: every process names the atom.
    let mut bad = homes.clone();
    bad[2].positions[5].y = f32::NAN;
    let atom = bad[2].ids[5];
    for e in on_all(&bad, n) {
        assert!(e.contains(&format!("atom {atom} has a non-finite position")), "{e}");
    }
    let e = redecompose(grid, sys.box_size, 1.0, n, &[0, 1, 2, 3], bad, &mut identity).unwrap_err();
    assert!(matches!(e, HaloError::Plan(PlanError::NonFinitePosition { atom: a, .. }) if a == atom as usize), "{e}");

    // Arrays of different lengths.
    let mut bad = homes.clone();
    bad[1].velocities.pop();
    for e in on_all(&bad, n) {
        assert!(e.contains("rank 1: its home atoms have"), "{e}");
    }

    // An atom lost, an atom twice, an id beyond the system.
    let mut lost = homes.clone();
    lost[3].ids.pop();
    lost[3].positions.pop();
    lost[3].velocities.pop();
    for e in on_all(&lost, n) {
        assert!(e.contains(&format!("hold {} home atoms together, but the system has {n}", n - 1)), "{e}");
    }
    let mut twice = homes.clone();
    let (id, p, v) = (twice[0].ids[0], twice[0].positions[0], twice[0].velocities[0]);
    push(&mut twice[1], (id, p, v));
    for e in on_all(&twice, n + 1) {
        assert!(e.contains(&format!("atom {id} is a home atom on 2 ranks")), "{e}");
    }
    // The same in one process, which checks every id with a flag instead of the sums.
    let e = redecompose(grid, sys.box_size, 1.0, n + 1, &[0, 1, 2, 3], twice.clone(), &mut identity).unwrap_err();
    assert!(matches!(e, HaloError::Plan(PlanError::HomeCount { atom, count: 2 }) if atom == id as usize), "{e}");
    let mut beyond = homes.clone();
    beyond[1].ids[0] = n as u32 + 5;
    for e in on_all(&beyond, n) {
        assert!(e.contains(&format!("global id {}", n + 5)), "{e}");
    }

    // The geometry, and ranks that do not fit.
    let e = redecompose(grid, sys.box_size, 1.5, n, &[0, 1, 2, 3], homes.clone(), &mut identity).unwrap_err();
    assert!(matches!(e, HaloError::Plan(PlanError::CutoffTooLarge { .. })), "{e}");
    for (ranks, why) in [(vec![0, 1, 2, 4], "outside the grid"), (vec![0, 1, 1, 2], "listed twice"), (vec![0, 1, 2], "sets of home atoms")] {
        let e = redecompose(grid, sys.box_size, 1.0, n, &ranks, homes.clone(), &mut identity).unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
    }
}

#[test]
fn malformed_blobs_are_errors() {
    let sys = MolecularSystem::generate(2000, 2).unwrap();
    let grid = RankGrid::new([2, 1, 1]).unwrap();
    let plan = HaloPlan::build(&sys, grid, 1.0).unwrap();
    let homes = homes_of(&plan, &sys.positions, &sys.velocities);
    let n = sys.positions.len();
    // Rank 1's blob cut short (one process reads both ranks' blobs of these two).
    for (tag, cut) in [(TAG_MIGRATE, 3), ("redecompose/pulse x0", 9)] {
        let mut gather = |t: &str, mut mine: Vec<Vec<u8>>| -> Result<Vec<Vec<u8>>> {
            if t == tag {
                let keep = mine[1].len() - cut;
                mine[1].truncate(keep);
            }
            Ok(mine)
        };
        let e = redecompose(grid, sys.box_size, 1.0, n, &[0, 1], homes.clone(), &mut gather).unwrap_err();
        assert!(matches!(&e, HaloError::Plan(PlanError::Blob { tag: t, rank: 1, .. }) if t == tag), "{tag}: {e}");
    }
    let mut short = |_: &str, mut mine: Vec<Vec<u8>>| -> Result<Vec<Vec<u8>>> {
        mine.pop();
        Ok(mine)
    };
    let e = redecompose(grid, sys.box_size, 1.0, n, &[0, 1], homes, &mut short).unwrap_err();
    assert!(matches!(&e, HaloError::Plan(PlanError::GatherCount { found: 1, expected: 2, .. })), "{e}");

    // A rank's plan (read only by the processes that do not drive it) round-trips, and any cut or
    // extra byte is an error.
    let grid = RankGrid::new([3, 2, 1]).unwrap();
    let plan = HaloPlan::build(&sys, grid, 1.0).unwrap();
    let geo = plan.decomposition().unwrap();
    let layout = geo.pulse_layout();
    let checked = [
        RankHomes { count: 0, sums: IdSums { first: 0x0123_4567_89ab_cdef, second: 7 }, bad: None },
        RankHomes { count: 0, sums: IdSums { first: 5, second: u64::MAX }, bad: Some(BadHome { local: 3, id: 9, previous: 11 }) },
    ];
    for ((r, rider), homes) in plan.ranks.iter().zip([&b""[..], b"x", b"a rider of some bytes"].into_iter().cycle()).zip(checked.into_iter().cycle())
    {
        let homes = RankHomes { count: r.home_atoms, ..homes };
        let blob = redecompose::plan_blob(r, &homes, rider).unwrap();
        // Everything but the global ids, which no other process needs.
        let want = (RankPlan { global_ids: Vec::new(), ..r.clone() }, homes, rider.to_vec());
        assert_eq!(redecompose::read_plan(&blob, r.rank, &geo, &layout).unwrap(), want);
        let maps: usize = r.pulses.iter().map(|p| 4 + p.spec.index_map.len()).sum();
        assert_eq!(blob.len(), 4 * (3 + 8 + maps + 1) + rider.len(), "rank {}: counts, checksums, pulses and rider only", r.rank);
        // Read from bytes not aligned for its words, too (copied through zeroed room).
        let odd = [&[0u8][..], &blob].concat();
        assert_eq!(redecompose::read_plan(&odd[1..], r.rank, &geo, &layout).unwrap(), want);
        // A bad id's flag other than 0 or 1 is malformed.
        let mut flag = blob.clone();
        flag[28..32].copy_from_slice(&2u32.to_ne_bytes());
        assert!(redecompose::read_plan(&flag, r.rank, &geo, &layout).unwrap_err().to_string().contains("bad home id's flag"));
        for cut in [1, 4, blob.len() / 2, blob.len()] {
            let e = redecompose::read_plan(&blob[..blob.len() - cut], r.rank, &geo, &layout).unwrap_err();
            assert!(matches!(&e, PlanError::Blob { tag, rank, .. } if tag == TAG_PLAN && *rank == r.rank), "{e}");
        }
        // A rider length beyond the blob is an error, not an allocation of that length.
        let mut huge = blob.clone();
        let at = huge.len() - rider.len() - 4;
        huge[at..at + 4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(matches!(redecompose::read_plan(&huge, r.rank, &geo, &layout), Err(PlanError::Blob { .. })));
        let mut long = blob.clone();
        long.push(0);
        assert!(redecompose::read_plan(&long, r.rank, &geo, &layout).unwrap_err().to_string().contains("1 bytes left over"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Small random systems on any grid, moved anywhere: the global builder's plan (or its error),
    /// on one process and on one process per rank.
    #[test]
    fn small_systems_get_the_global_plan(
        dims in (1usize..4, 1usize..4, 1usize..3),
        edge in (3.0f32..6.0, 3.0f32..6.0, 3.0f32..6.0),
        cutoff_frac in 0.05f32..0.45,
        raw in proptest::collection::vec(((-1.5f32..2.5, -1.5f32..2.5, -1.5f32..2.5), (-1.5f32..2.5, -1.5f32..2.5, -1.5f32..2.5)), 0..300),
    ) {
        let box_size = [edge.0, edge.1, edge.2];
        let grid = RankGrid::new([dims.0, dims.1, dims.2]).unwrap();
        let cutoff = cutoff_frac * box_size.iter().copied().fold(f32::INFINITY, f32::min);
        let at = |(a, b, c): (f32, f32, f32)| Float3::new(a * box_size[0], b * box_size[1], c * box_size[2]);
        let p0: Vec<Float3> = raw.iter().map(|&(a, _)| at(a)).collect();
        let p1: Vec<Float3> = raw.iter().map(|&(_, b)| at(b)).collect();
        let velocities: Vec<Float3> = raw.iter().map(|&(a, _)| Float3::new(a.2, a.0, a.1)).collect();
        let before = HaloPlan::from_positions(&p0, box_size, grid, cutoff);
        let want = HaloPlan::from_positions(&p1, box_size, grid, cutoff);
        let ranks: Vec<usize> = (0..grid.num_ranks()).collect();
        match (before, want) {
            (Ok(before), Ok(want)) => {
                let homes = homes_of(&before, &p1, &velocities);
                let got = redecompose(grid, box_size, cutoff, p1.len(), &ranks, homes.clone(), &mut identity).unwrap();
                check(&got, &ranks, &p1, &velocities, &want);
                let processes: Vec<Vec<usize>> = ranks.iter().map(|&r| vec![r]).collect();
                for (ranks, got) in processes.iter().zip(on_processes(&processes, grid, box_size, cutoff, p1.len(), &homes)) {
                    check(&got.unwrap(), ranks, &p1, &velocities, &want);
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                let homes = vec![HomeAtoms::default(); ranks.len()];
                let got = redecompose(grid, box_size, cutoff, 0, &ranks, homes, &mut identity).unwrap_err();
                prop_assert_eq!(got.to_string(), e.to_string());
            }
        }
    }
}

/// Host time of a redecomposition of 45,000 atoms on 2x1x1 with both ranks in this process,
/// against the global plan. `cargo test -p halo --release --lib redecompose_timing -- --ignored --nocapture`.
#[test]
#[ignore = "a timing: run it in release"]
fn redecompose_timing() {
    let sys = MolecularSystem::generate(45_000, 1).unwrap();
    let grid = RankGrid::new([2, 1, 1]).unwrap();
    let cutoff = 1.2;
    let before = HaloPlan::from_positions(&sys.positions, sys.box_size, grid, cutoff).unwrap();
    let positions = interval_motion(&sys.positions);
    let homes = homes_of(&before, &positions, &sys.velocities);
    let moved = MolecularSystem { positions: positions.clone(), ..sys.clone() };
    let median = |mut t: Vec<f64>| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    let time = |f: &mut dyn FnMut()| {
        median(
            (0..60)
                .map(|_| {
                    let t = std::time::Instant::now();
                    f();
                    t.elapsed().as_secs_f64() * 1e6
                })
                .collect(),
        )
    };
    let want = HaloPlan::from_positions(&positions, sys.box_size, grid, cutoff).unwrap();
    let got = redecompose(grid, sys.box_size, cutoff, positions.len(), &[0, 1], homes.clone(), &mut identity).unwrap();
    assert_eq!(got.plan, want);
    let (serial, two) = (crate::workers::Workers::serial(), crate::workers::Workers::new(2).unwrap());
    let fresh = time(&mut || drop(redecompose(grid, sys.box_size, cutoff, positions.len(), &[0, 1], homes.clone(), &mut identity).unwrap()));
    let mut rs = RedecomposeScratch::default();
    let mut with = |w: &crate::workers::Workers| {
        time(&mut || {
            drop(redecompose_with(grid, sys.box_size, cutoff, positions.len(), &[0, 1], homes.clone(), &mut identity, None, w, &mut rs).unwrap())
        })
    };
    let (local, two) = (with(&serial), with(&two));
    // The steady state: the result handed back, the input filled into the scratch's arrays.
    let steady = |w: &crate::workers::Workers| {
        let mut rs = RedecomposeScratch::default();
        time(&mut || {
            let input = homes
                .iter()
                .map(|h| {
                    let mut s = rs.home_arrays(h.ids.len());
                    s.ids.extend_from_slice(&h.ids);
                    s.positions.extend_from_slice(&h.positions);
                    s.velocities.extend_from_slice(&h.velocities);
                    s
                })
                .collect();
            let got = redecompose_with(grid, sys.box_size, cutoff, positions.len(), &[0, 1], input, &mut identity, None, w, &mut rs).unwrap();
            rs.recycle(got);
        })
    };
    let (steady_one, steady_two) = (steady(&serial), steady(&crate::workers::Workers::new(2).unwrap()));
    let clone = time(&mut || drop(std::hint::black_box(homes.clone())));
    let mut scratch = PlanScratch::default();
    let serial = time(&mut || drop(HaloPlan::build_with(&moved, grid, cutoff, &serial, &mut scratch).unwrap()));
    let w = crate::workers::Workers::new(4).unwrap();
    let four = time(&mut || drop(HaloPlan::build_with(&moved, grid, cutoff, &w, &mut scratch).unwrap()));
    println!(
        "45,000 atoms, 2x1x1, cutoff {cutoff} (median of 60): redecompose_with {local:.0} us (2 workers {two:.0} us, fresh scratch {fresh:.0} us; {clone:.0} us of either \
         cloning the input); steady state (result recycled, input copied into spare arrays) {steady_one:.0} us, 2 workers {steady_two:.0} us; \
         build_with serial {serial:.0} us, 4 threads {four:.0} us"
    );
}

/// Every collective of a redecomposition on one emulated process per rank of `grid` (threads over
/// shared memory, as [`on_processes`]): per tag, every rank's blob.
fn record_collectives(grid: RankGrid, box_size: [f32; 3], cutoff: f32, atoms: usize, homes: &[HomeAtoms]) -> HashMap<String, Vec<Vec<u8>>> {
    let n = grid.num_ranks();
    let collective = SharedCollective::new(grid, n, true);
    let processes: Vec<Vec<usize>> = (0..n).map(|r| vec![r]).collect();
    for got in run_processes(&collective, &processes, grid, box_size, cutoff, atoms, homes, None) {
        got.unwrap();
    }
    collective.record.unwrap().into_inner().unwrap()
}

/// Host time of one PE's redecomposition: rank 0 driven alone by its process, one worker, in the
/// steady state (the result recycled, the input filled into the scratch's spare arrays), the
/// other ranks' blobs replayed from a run of one emulated process per rank (so the time is this
/// PE's own work, not the other processes' or a wait for them). Medians of 201 calls, with the
/// replayed collectives' time (a clone of the recorded blobs) apart.
/// `cargo test -p halo --release --lib redecompose_pe_timing -- --ignored --nocapture`.
#[test]
#[ignore = "a timing: run it in release"]
fn redecompose_pe_timing() {
    use std::time::{Duration, Instant};
    let cutoff = 1.06;
    for (atoms, dims) in [(45_000, [2, 1, 1]), (45_000, [2, 2, 2]), (6_000, [2, 1, 1]), (6_000, [2, 2, 2])] {
        let sys = MolecularSystem::generate(atoms, 1).unwrap();
        let grid = RankGrid::new(dims).unwrap();
        let before = HaloPlan::from_positions(&sys.positions, sys.box_size, grid, cutoff).unwrap();
        let positions = interval_motion(&sys.positions);
        let homes = homes_of(&before, &positions, &sys.velocities);
        let want = HaloPlan::from_positions(&positions, sys.box_size, grid, cutoff).unwrap();
        let recorded = record_collectives(grid, sys.box_size, cutoff, atoms, &homes);
        let (serial, mut rs) = (crate::workers::Workers::serial(), RedecomposeScratch::default());
        let (mut total, mut collectives) = (vec![], vec![]);
        for i in 0..211 {
            let input = vec![{
                let mut s = rs.home_arrays(homes[0].ids.len());
                s.ids.extend_from_slice(&homes[0].ids);
                s.positions.extend_from_slice(&homes[0].positions);
                s.velocities.extend_from_slice(&homes[0].velocities);
                s
            }];
            let mut in_gather = Duration::ZERO;
            let mut replay = |tag: &str, mine: Vec<Vec<u8>>| -> Result<Vec<Vec<u8>>> {
                let t = Instant::now();
                let all = recorded[tag].clone();
                if i == 0 {
                    assert_eq!(mine[0], all[0], "{tag}: rank 0 sends what it sent among the other processes");
                }
                in_gather += t.elapsed();
                Ok(all)
            };
            let t = Instant::now();
            let got = redecompose_with(grid, sys.box_size, cutoff, atoms, &[0], input, &mut replay, None, &serial, &mut rs).unwrap();
            let elapsed = t.elapsed();
            if i == 0 {
                assert_eq!(got.plan, without_others_ids(&want, &[0]));
            }
            rs.recycle(got);
            if i >= 10 {
                total.push(elapsed);
                collectives.push(in_gather);
            }
        }
        let median = |mut v: Vec<Duration>| {
            v.sort();
            v[v.len() / 2].as_secs_f64() * 1e6
        };
        let own: Vec<Duration> = total.iter().zip(&collectives).map(|(t, c)| *t - *c).collect();
        println!(
            "pe redecompose, {atoms} atoms, {dims:?} rank 0 of {} (one per process), cutoff {cutoff}, 1 worker, medians of 201 in us: \
             own work {:.0}, replayed collectives {:.0}, total {:.0}",
            grid.num_ranks(),
            median(own),
            median(collectives),
            median(total),
        );
    }
}

/// The selection over a rank's wrapped positions and crossings ([`redecompose::Frame`], made to
/// `f64` block by block) sends what it sends over the rank-frame positions the global builder
/// holds: on and next to every cell edge and box edge, zeros of both signs (crossed or not),
/// random coordinates, lengths around the selection's block, every rank and pulse direction; the
/// same by the coordinates' bits ([`super::select`], whose own tests try its ranges' ends).
#[test]
fn the_selection_over_wrapped_positions_is_the_one_over_rank_frame_positions() {
    use super::plan::{select_for_pulse, select_for_pulse_into, send_range2};
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let cases = [([2, 2, 2], [4.3f32, 3.7, 6.1], 1.1f32), ([3, 1, 1], [5.1, 4.7, 3.3], 1.4), ([1, 2, 3], [3.0, 5.03, 7.77], 0.9)];
    for (dims, box_size, cutoff) in cases {
        let grid = RankGrid::new(dims).unwrap();
        let geo = Decomposition::new(grid, box_size, cutoff).unwrap();
        let decomposed = grid.decomposed_dims();
        let mut special: Vec<Vec<f32>> = (0..3).map(|_| vec![0.0, -0.0]).collect();
        for d in 0..3 {
            let l = box_size[d];
            for i in 0..=dims[d] {
                let e = i as f32 * l / dims[d] as f32;
                for x in [e, e - cutoff, e + cutoff] {
                    special[d].extend([x, x.next_down(), x.next_up()].into_iter().filter(|v| (0.0..l).contains(v)));
                }
            }
            special[d].push(l.next_down());
        }
        for len in [0, 1, 63, 64, 65, 200] {
            let wrapped: Vec<Float3> = (0..len)
                .map(|_| {
                    let c: [f32; 3] = std::array::from_fn(|d| {
                        let pick = rng.random_range(0..2 * special[d].len());
                        special[d].get(pick).copied().unwrap_or_else(|| rng.random_range(0.0..box_size[d]))
                    });
                    Float3::new(c[0], c[1], c[2])
                })
                .collect();
            let crossed: Vec<u8> = (0..len).map(|_| rng.random_range(0..8u8)).collect();
            let edge = box_size.map(f64::from);
            // The rank-frame positions as the global builder holds them (the edge added only where crossed).
            let pos: Vec<[f64; 3]> = wrapped
                .iter()
                .zip(&crossed)
                .map(|(w, &c)| {
                    let x = [f64::from(w.x), f64::from(w.y), f64::from(w.z)];
                    std::array::from_fn(|e| if c >> e & 1 == 1 { x[e] + edge[e] } else { x[e] })
                })
                .collect();
            let frame = redecompose::Frame { wrapped: &wrapped, crossed: &crossed, edge };
            for rank in 0..grid.num_ranks() {
                for &d in &decomposed {
                    let want = select_for_pulse(&geo, &decomposed, rank, d, &pos[..], 5, send_range2(cutoff));
                    let mut got = vec![];
                    select_for_pulse_into(&geo, &decomposed, rank, d, &frame, 5, send_range2(cutoff), &mut got);
                    assert_eq!(got, want, "{dims:?} rank {rank} along {d}, {len} atoms");
                    // And by the coordinates' bits, as the redecomposition selects.
                    got.clear();
                    super::select::select_wrapped_into(&geo, &decomposed, rank, d, &frame, 5, send_range2(cutoff), &mut got);
                    assert_eq!(got, want, "{dims:?} rank {rank} along {d}, {len} atoms, by ranges");
                }
            }
        }
    }
}

/// A rank's home atoms on a model device: the per-atom phases of [`redecompose_on_devices`] with
/// the host's own functions ([`migrate_reference`], a merge by id, [`select_wrapped_into`] over
/// the home atoms), so that the device path's plumbing is checked against [`redecompose`] here
/// and the GPU's phases against these in `tests/gpu_redecompose.rs`.
struct CpuHome {
    rank: usize,
    home: HomeAtoms,
    stayers: MigrateReference,
    /// The merged home atoms' velocities (what stays on a device).
    velocities: Vec<Float3>,
    /// The merged home atoms' positions (on a device, read back only where asked for).
    positions: Vec<Float3>,
    /// What the device tells of its merged ids' home check facts.
    facts: Facts,
    /// Whether the device hands back the scan of the merged positions (as the GPU's extent).
    scans: bool,
}

/// The home id facts a [`CpuHome`] hands back with its merge.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Facts {
    /// None: the host passes over the ids.
    None,
    /// Those of its ids ([`HomeIdFacts::of`], what the GPU's parts fold to).
    Own,
    /// Its ids' with the first sum off by one: a device whose sums are wrong.
    Wrong,
}

impl CpuHome {
    /// Rank `rank`'s model device; even ranks hand back their ids' facts and odd ones none, so
    /// that a process of several ranks takes both paths of the home check at once.
    fn new(rank: usize, home: HomeAtoms) -> Self {
        let facts = if rank.is_multiple_of(2) { Facts::Own } else { Facts::None };
        // Every third rank makes no scan: its positions come back however the merge was asked.
        let scans = rank % 3 != 1;
        Self { rank, home, stayers: MigrateReference::default(), velocities: Vec::new(), positions: Vec::new(), facts, scans }
    }
}

impl HomeDevice for CpuHome {
    fn rank(&self) -> usize {
        self.rank
    }

    fn migrate(&mut self, geo: &Decomposition) -> Result<(usize, Vec<kernels_gpu::abi::MigrateLeaver>)> {
        let h = &self.home;
        self.stayers = migrate_reference(&h.positions, &h.velocities, &h.ids, geo, self.rank)?;
        Ok((h.ids.len(), std::mem::take(&mut self.stayers.leavers)))
    }

    fn merge_and_select(
        &mut self,
        geo: &Decomposition,
        arrivals: &[(u32, Float3, Float3)],
        positions: bool,
        mut into: MergedHome,
    ) -> Result<MergedHome> {
        let s = &self.stayers;
        let mut all: Vec<(u32, Float3, Float3)> =
            s.ids.iter().zip(&s.positions).zip(&s.velocities).map(|((&i, &p), &v)| (i, p, v)).chain(arrivals.iter().copied()).collect();
        all.sort_by_key(|a| a.0);
        into.ids.clear();
        into.wrapped.clear();
        self.velocities.clear();
        self.positions.clear();
        for (i, p, v) in all {
            into.ids.push(i);
            self.positions.push(p);
            self.velocities.push(v);
        }
        let crossed = vec![0u8; into.ids.len()];
        let frame = Frame { wrapped: &self.positions, crossed: &crossed, edge: geo.box_size.map(f64::from) };
        let decomposed = geo.grid.decomposed_dims();
        into.first_pulse.resize_with(decomposed.len(), Vec::new);
        into.first_pulse_x.resize_with(decomposed.len(), Vec::new);
        for ((map, x), &d) in into.first_pulse.iter_mut().zip(&mut into.first_pulse_x).zip(&decomposed) {
            map.clear();
            select_wrapped_into(geo, &decomposed, self.rank, d, &frame, 0, send_range2(geo.cutoff), map);
            x.clear();
            x.extend(map.iter().map(|&k| self.positions[k as usize]));
        }
        if positions {
            into.wrapped.extend_from_slice(&self.positions);
        }
        into.home_scan = self.scans.then(|| crate::decomp::scan(&self.positions, [0.0; 3], geo.box_size));
        into.id_facts = match self.facts {
            Facts::None => None,
            Facts::Own => Some(HomeIdFacts::of(&into.ids)),
            Facts::Wrong => Some(HomeIdFacts { first: HomeIdFacts::of(&into.ids).first.wrapping_add(1), ..HomeIdFacts::of(&into.ids) }),
        };
        Ok(into)
    }

    fn read_home_positions(&mut self, into: &mut Vec<Float3>) -> Result<()> {
        into.clear();
        into.extend_from_slice(&self.positions);
        Ok(())
    }
}

/// [`redecompose_on_devices`] over model devices, one emulated process per entry of `processes`.
fn on_devices(
    processes: &[Vec<usize>],
    grid: RankGrid,
    box_size: [f32; 3],
    cutoff: f32,
    atoms: usize,
    homes: &[HomeAtoms],
) -> Vec<Result<(Redecomposed, Vec<Vec<Float3>>)>> {
    on_devices_with(processes, grid, box_size, cutoff, atoms, homes, false, |_| None)
}

/// [`on_devices`] with the home positions read back where `home_positions` says, and where
/// `facts(rank)`, when given, sets what rank `rank`'s device tells of its ids' facts.
#[allow(clippy::too_many_arguments)]
fn on_devices_with(
    processes: &[Vec<usize>],
    grid: RankGrid,
    box_size: [f32; 3],
    cutoff: f32,
    atoms: usize,
    homes: &[HomeAtoms],
    home_positions: bool,
    facts: impl Fn(usize) -> Option<Facts> + Sync,
) -> Vec<Result<(Redecomposed, Vec<Vec<Float3>>)>> {
    let collective = SharedCollective::new(grid, processes.len(), false);
    let collective = &collective;
    std::thread::scope(|scope| {
        let threads: Vec<_> = processes
            .iter()
            .map(|ranks| {
                let mut devices: Vec<CpuHome> = ranks
                    .iter()
                    .map(|&r| {
                        let d = CpuHome::new(r, homes[r].clone());
                        CpuHome { facts: facts(r).unwrap_or(d.facts), ..d }
                    })
                    .collect();
                scope.spawn(move || {
                    let mut gather = |tag: &str, blobs: Vec<Vec<u8>>| collective.gather(ranks, tag, blobs);
                    let mut dyns: Vec<&mut dyn HomeDevice> = devices.iter_mut().map(|d| d as &mut dyn HomeDevice).collect();
                    let (w, mut s) = (crate::workers::Workers::serial(), RedecomposeScratch::default());
                    let got = redecompose_on_devices(grid, box_size, cutoff, atoms, ranks, &mut dyns, home_positions, &mut gather, None, &w, &mut s)?;
                    Ok((got, devices.into_iter().map(|d| d.velocities).collect()))
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("a process panicked")).collect()
    })
}

/// [`check`] of one process's result of [`on_devices_with`]: the velocities that stayed on its
/// model devices put back into its homes first (the host path's velocities are the devices').
fn check_on_devices(got: (Redecomposed, Vec<Vec<Float3>>), ranks: &[usize], positions: &[Float3], velocities: &[Float3], want: &HaloPlan) {
    let (mut got, device_velocities) = got;
    for (h, v) in got.homes.iter_mut().zip(device_velocities) {
        h.velocities = v;
    }
    check(&got, ranks, positions, velocities, want);
}

#[test]
fn the_device_path_gives_the_hosts_plan() {
    let sys = MolecularSystem::generate(4000, 13).unwrap();
    for (k, (dims, cutoff)) in CASES.into_iter().enumerate() {
        let grid = RankGrid::new(dims).unwrap();
        let before = HaloPlan::from_positions(&sys.positions, sys.box_size, grid, cutoff).unwrap();
        let (positions, velocities) = moved(&sys.positions, sys.box_size, 50 + k as u64);
        let want = HaloPlan::from_positions(&positions, sys.box_size, grid, cutoff).unwrap();
        let homes = homes_of(&before, &positions, &velocities);
        let n = grid.num_ranks();
        // One process, and the ranks split over two (odd and even ranks).
        let splits = [vec![(0..n).collect::<Vec<_>>()], vec![(0..n).step_by(2).collect(), (1..n).step_by(2).collect()]];
        for processes in splits.iter().filter(|p| p.iter().all(|r| !r.is_empty())) {
            // The home positions read back, or left on the devices (the pulses then take what
            // they send from the selection, and only the halo atoms' positions come out).
            for home_positions in [true, false] {
                let all = on_devices_with(processes, grid, sys.box_size, cutoff, positions.len(), &homes, home_positions, |_| None);
                for (ranks, got) in processes.iter().zip(all) {
                    let got = got.unwrap();
                    assert!(got.0.homes.iter().all(|h| h.velocities.is_empty()), "the velocities stay on the devices");
                    // Left on a device where it scanned them exactly, else read back after all.
                    for (&r, &from) in ranks.iter().zip(&got.0.local_positions_from) {
                        let home = want.ranks[r].home_atoms;
                        let scan = crate::decomp::scan(&positions_of(&want, r, &positions), [0.0; 3], sys.box_size);
                        let exact = scan.in_range && scan.exact_along(std::array::from_fn(|d| grid.dims[d] > 1));
                        let held = !home_positions && CpuHome::new(r, HomeAtoms::default()).scans && exact && home > 0;
                        assert_eq!(from, if held { home } else { 0 }, "{dims:?} rank {r}, home positions asked for: {home_positions}");
                    }
                    // With the devices' velocities the result is the host's.
                    check_on_devices(got, ranks, &positions, &velocities, &want);
                }
            }
        }
    }
}

/// Rank `r`'s home atoms' wrapped positions in `plan`, from every atom's `positions`.
fn positions_of(plan: &HaloPlan, r: usize, positions: &[Float3]) -> Vec<Float3> {
    let p = &plan.ranks[r];
    p.global_ids[..p.home_atoms].iter().map(|&i| wrap_position(positions[i as usize], plan.box_size)).collect()
}

/// A home atom exactly on a decomposed dimension's lower edge makes its device's scan inexact
/// (a zero bound): the redecomposition then reads that rank's home positions back although it
/// was asked to leave them on the device (**negative control** of the scan's exactness: the
/// ranks whose scans are exact keep theirs on the devices), and the plan is still the host's.
#[test]
fn an_inexact_home_scan_reads_the_home_positions_back() {
    let sys = MolecularSystem::generate(3000, 21).unwrap();
    let grid = RankGrid::new([2, 1, 1]).unwrap();
    let before = HaloPlan::from_positions(&sys.positions, sys.box_size, grid, 1.0).unwrap();
    let (mut positions, velocities) = moved(&sys.positions, sys.box_size, 3);
    // Rank 0's home atom nearest the lower x edge moved onto it (rank 0 scans: 0 % 3 != 1).
    let edge =
        (0..positions.len()).filter(|&i| positions[i].x < sys.box_size[0] / 4.0).min_by(|&a, &b| positions[a].x.total_cmp(&positions[b].x)).unwrap();
    positions[edge].x = 0.0;
    let want = HaloPlan::from_positions(&positions, sys.box_size, grid, 1.0).unwrap();
    let homes = homes_of(&before, &positions, &velocities);
    let processes = [vec![0, 1]];
    let got = on_devices_with(&processes, grid, sys.box_size, 1.0, positions.len(), &homes, false, |_| None).remove(0).unwrap();
    assert!(want.ranks[0].global_ids[..want.ranks[0].home_atoms].contains(&(edge as u32)), "the atom is rank 0's");
    assert_eq!(got.0.local_positions_from, vec![0, 0], "rank 0 read back (inexact scan), rank 1 (no scan)");
    check_on_devices(got, &processes[0], &positions, &velocities, &want);
    // Without the atom on the edge, rank 0 keeps its home positions on its device.
    let (positions, velocities) = moved(&sys.positions, sys.box_size, 3);
    let want = HaloPlan::from_positions(&positions, sys.box_size, grid, 1.0).unwrap();
    let homes = homes_of(&before, &positions, &velocities);
    let got = on_devices_with(&processes, grid, sys.box_size, 1.0, positions.len(), &homes, false, |_| None).remove(0).unwrap();
    assert_eq!(got.0.local_positions_from, vec![want.ranks[0].home_atoms, 0]);
    check_on_devices(got, &processes[0], &positions, &velocities, &want);
}

/// The home check takes a device's facts of its ids across processes: with every rank's own
/// facts (or none) the plan is the host's, and with one rank's sums wrong every process refuses
/// the set of home atoms, as the ids alone would not have it (**negative control**: the facts are
/// the numbers checked, not a pass over the ids).
#[test]
fn the_home_check_takes_the_devices_id_facts_across_processes() {
    let sys = MolecularSystem::generate(3000, 17).unwrap();
    let grid = RankGrid::new([2, 2, 1]).unwrap();
    let plan = HaloPlan::build(&sys, grid, 1.0).unwrap();
    let (positions, velocities) = moved(&sys.positions, sys.box_size, 9);
    let want = HaloPlan::from_positions(&positions, sys.box_size, grid, 1.0).unwrap();
    let homes = homes_of(&plan, &positions, &velocities);
    let processes = [vec![0, 3], vec![1], vec![2]];
    for every in [Facts::Own, Facts::None] {
        for (ranks, got) in
            processes.iter().zip(on_devices_with(&processes, grid, sys.box_size, 1.0, positions.len(), &homes, false, |_| Some(every)))
        {
            check_on_devices(got.unwrap(), ranks, &positions, &velocities, &want);
        }
    }
    let wrong = |r: usize| Some(if r == 3 { Facts::Wrong } else { Facts::Own });
    for got in on_devices_with(&processes, grid, sys.box_size, 1.0, positions.len(), &homes, false, wrong) {
        let e = got.map(|_| ()).unwrap_err();
        assert!(matches!(e, HaloError::Plan(PlanError::HomeSet { .. })), "{e}");
    }
}

/// A process that drives every rank and has every rank's facts from its devices takes their sums
/// first: with every rank's own facts the plan is the host's; with one rank's sums wrong the ids
/// are checked exactly and, being right, pass (the sums only spare the pass over the ids, they
/// never refuse ids that hold every atom once); an atom on two ranks is named as the exact check
/// names it, whether the sums come from the devices or not.
#[test]
fn one_process_takes_the_devices_id_sums_and_checks_the_ids_where_they_differ() {
    let sys = MolecularSystem::generate(3000, 19).unwrap();
    let grid = RankGrid::new([2, 2, 1]).unwrap();
    let plan = HaloPlan::build(&sys, grid, 1.0).unwrap();
    let (positions, velocities) = moved(&sys.positions, sys.box_size, 11);
    let want = HaloPlan::from_positions(&positions, sys.box_size, grid, 1.0).unwrap();
    let homes = homes_of(&plan, &positions, &velocities);
    let one = [vec![0, 1, 2, 3]];
    let n = positions.len();
    for facts in [|_: usize| Some(Facts::Own), |r: usize| Some(if r == 2 { Facts::Wrong } else { Facts::Own })] {
        let got = on_devices_with(&one, grid, sys.box_size, 1.0, n, &homes, false, facts).remove(0).unwrap();
        check_on_devices(got, &one[0], &positions, &velocities, &want);
    }
    let mut twice = homes.clone();
    let (id, p, v) = (twice[0].ids[0], twice[0].positions[0], twice[0].velocities[0]);
    push(&mut twice[1], (id, p, v));
    for every in [Facts::Own, Facts::None] {
        let e = on_devices_with(&one, grid, sys.box_size, 1.0, n + 1, &twice, false, |_| Some(every)).remove(0).map(|_| ()).unwrap_err();
        assert!(matches!(e, HaloError::Plan(PlanError::HomeCount { atom, count: 2 }) if atom == id as usize), "{every:?}: {e}");
    }
}

/// A model device that logs its calls, to see the order the redecomposition makes them.
struct Logged<'a> {
    inner: &'a mut CpuHome,
    log: &'a std::sync::Mutex<Vec<(&'static str, usize)>>,
}

impl HomeDevice for Logged<'_> {
    fn rank(&self) -> usize {
        self.inner.rank
    }

    fn begin_migrate(&mut self, geo: &Decomposition) -> Result<()> {
        self.log.lock().unwrap().push(("begin", self.inner.rank));
        self.inner.begin_migrate(geo)
    }

    fn migrate(&mut self, geo: &Decomposition) -> Result<(usize, Vec<kernels_gpu::abi::MigrateLeaver>)> {
        self.log.lock().unwrap().push(("migrate", self.inner.rank));
        self.inner.migrate(geo)
    }

    fn begin_merge_and_select(&mut self, geo: &Decomposition, arrivals: &[(u32, Float3, Float3)], positions: bool) -> Result<()> {
        self.log.lock().unwrap().push(("begin merge", self.inner.rank));
        self.inner.begin_merge_and_select(geo, arrivals, positions)
    }

    fn merge_and_select(&mut self, geo: &Decomposition, arrivals: &[(u32, Float3, Float3)], positions: bool, into: MergedHome) -> Result<MergedHome> {
        self.log.lock().unwrap().push(("merge", self.inner.rank));
        self.inner.merge_and_select(geo, arrivals, positions, into)
    }

    fn read_home_positions(&mut self, into: &mut Vec<Float3>) -> Result<()> {
        self.log.lock().unwrap().push(("positions", self.inner.rank));
        self.inner.read_home_positions(into)
    }
}

/// The devices of one process start each phase together: every device's work is begun before any
/// is waited for, so ranks sharing a GPU (or several GPUs in one process) run it side by side
/// rather than one after another; with search threads each device's calls of a phase run on
/// threads side by side, in any order within the phase, and the plan is the same.
#[test]
fn every_device_begins_each_phase_before_any_is_finished() {
    let sys = MolecularSystem::generate(2000, 5).unwrap();
    let grid = RankGrid::new([2, 2, 1]).unwrap();
    let plan = HaloPlan::build(&sys, grid, 1.0).unwrap();
    let (positions, velocities) = moved(&sys.positions, sys.box_size, 7);
    let homes = homes_of(&plan, &positions, &velocities);
    let ranks: Vec<usize> = (0..grid.num_ranks()).collect();
    let mut plans = Vec::new();
    for threads in [1, 3] {
        let mut devices: Vec<CpuHome> = ranks.iter().map(|&r| CpuHome::new(r, homes[r].clone())).collect();
        let log = std::sync::Mutex::new(Vec::new());
        let mut logged: Vec<Logged<'_>> = devices.iter_mut().map(|d| Logged { inner: d, log: &log }).collect();
        let mut dyns: Vec<&mut dyn HomeDevice> = logged.iter_mut().map(|d| d as &mut dyn HomeDevice).collect();
        let collective = SharedCollective::new(grid, 1, false);
        let mut gather = |tag: &str, blobs: Vec<Vec<u8>>| collective.gather(&ranks, tag, blobs);
        let (w, mut scratch) = (crate::workers::Workers::new(threads).unwrap(), RedecomposeScratch::default());
        // Home positions read back: no device reads them again.
        let done =
            redecompose_on_devices(grid, sys.box_size, 1.0, positions.len(), &ranks, &mut dyns, true, &mut gather, None, &w, &mut scratch).unwrap();
        plans.push(done.plan);
        let log = log.into_inner().unwrap();
        let phases = ["begin", "migrate", "begin merge", "merge"];
        let want: Vec<(&str, usize)> = phases.into_iter().flat_map(|call| ranks.iter().map(move |&r| (call, r))).collect();
        if threads == 1 {
            assert_eq!(log, want, "the phases' calls, in order");
        } else {
            // Phase by phase; within a phase every rank once, in any order.
            let phase_of = |call: &str| phases.iter().position(|p| *p == call).unwrap();
            assert!(log.windows(2).all(|p| phase_of(p[0].0) <= phase_of(p[1].0)), "{log:?}");
            let mut sorted = log.clone();
            sorted.sort_by_key(|&(call, r)| (phase_of(call), r));
            assert_eq!(sorted, want, "every rank's every call once");
        }
    }
    assert_eq!(plans[0], plans[1], "the same plan on one thread and on three");
}

#[test]
fn the_device_path_reports_a_non_finite_position_on_every_process() {
    let sys = MolecularSystem::generate(2000, 2).unwrap();
    let grid = RankGrid::new([2, 2, 1]).unwrap();
    let plan = HaloPlan::build(&sys, grid, 1.0).unwrap();
    let mut homes = homes_of(&plan, &sys.positions, &sys.velocities);
    homes[2].positions[5].z = f32::INFINITY;
    let atom = homes[2].ids[5];
    for got in on_devices(&[vec![0, 3], vec![1], vec![2]], grid, sys.box_size, 1.0, sys.positions.len(), &homes) {
        let e = got.map(|_| ()).unwrap_err();
        assert!(matches!(e, HaloError::Plan(PlanError::NonFinitePosition { atom: a, .. }) if a == atom as usize), "{e}");
    }
}
