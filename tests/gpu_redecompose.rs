//! The redecomposition on the GPUs (`decomp::redecompose_on_devices` over `decomp::GpuHome`:
//! migration, merge and first-pulse selection on each rank's GPU) against the host's
//! (`decomp::redecompose`), bit for bit: the same plan (every rank's ids, pulses and index
//! maps), the same local positions, the same home ids, and each rank's velocities on its GPU in
//! the new order, and each rank's extent of its home atoms (made on the GPU) the host's scan of
//! the home positions; the extent kernel alone against the host's scan, and the home id facts
//! kernel alone and after a merge against the host's facts of the ids. Every rank of 1-D, 2-D and 3-D grids with one and two pulses driven from one
//! process on one GPU, through several searches in a row (each from the last one's plan, the
//! atoms moved in between, some across the box and whole boxes away), one `GpuHome` per rank
//! reused throughout, each on a stream of its own; a migration begun ahead of its search, behind
//! the copy that writes its coordinates, is taken up only by the search it was begun for; a
//! non-finite position is named as the host names it.

use halo::HaloError;
use halo::abi::Float3;
use halo::decomp::{
    Decomposition, GpuExtent, GpuHome, GpuIdFacts, HaloPlan, HomeAtoms, HomeDevice, HomeIdFacts, MergedHome, PlanError, RankGrid, RedecomposeScratch,
    Redecomposed, redecompose, redecompose_on_devices, scan,
};
use halo::gpu::{CudaStream, DeviceBuffer, DeviceMemory, Staging};
use halo::system::MolecularSystem;
use halo::testing::{GpuFixture as Gpu, gpu_or_skip as gpu, homes_of, moved_atoms as moved};
use halo::workers::Workers;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

fn bits(v: &[Float3]) -> Vec<[u32; 3]> {
    v.iter().map(|p| [p.x.to_bits(), p.y.to_bits(), p.z.to_bits()]).collect()
}

fn identity(_tag: &str, mine: Vec<Vec<u8>>) -> halo::Result<Vec<Vec<u8>>> {
    Ok(mine)
}

/// One rank's home atoms on the GPU as the MD step leaves them (positions unwrapped), with slack
/// after them that the passes must not read.
struct RankArrays {
    x: DeviceBuffer<Float3>,
    v: DeviceBuffer<Float3>,
}

impl RankArrays {
    fn new(g: &Gpu, h: &HomeAtoms) -> Self {
        let pad = |a: &[Float3]| a.iter().copied().chain(std::iter::repeat_n(Float3::new(f32::NAN, f32::NAN, f32::NAN), 29)).collect::<Vec<_>>();
        let a = Self {
            x: DeviceBuffer::from_host(&g.ctx, &pad(&h.positions)).unwrap(),
            v: DeviceBuffer::from_host(&g.ctx, &pad(&h.velocities)).unwrap(),
        };
        g.ctx.synchronize().unwrap();
        a
    }
}

/// Every rank's inputs of one search on the GPU: rank `i`'s atoms `arrays[i]` (ids `homes[i].ids`)
/// on `streams[i]`.
struct OnGpus<'a> {
    g: &'a Gpu,
    streams: &'a [Arc<CudaStream>],
    arrays: &'a [RankArrays],
    homes: &'a [HomeAtoms],
}

impl OnGpus<'_> {
    /// `redecompose_on_devices` over every rank of `geo`'s grid, rank `i`'s home on the GPU
    /// `homes_gpu[i]`, the home positions read back where `home_positions` says.
    fn redecompose(
        &self,
        homes_gpu: &mut [GpuHome],
        geo: &Decomposition,
        atoms: usize,
        home_positions: bool,
        workers: &Workers,
        scratch: &mut RedecomposeScratch,
    ) -> Redecomposed {
        let ranks: Vec<usize> = (0..geo.grid.num_ranks()).collect();
        let mut devices: Vec<_> = homes_gpu
            .iter_mut()
            .zip(self.arrays)
            .zip(self.homes)
            .zip(self.streams)
            .map(|(((d, a), h), stream)| d.with(&self.g.module, stream, &a.x, &a.v, &h.ids))
            .collect();
        let mut dyns: Vec<&mut dyn HomeDevice> = devices.iter_mut().map(|d| d as &mut dyn HomeDevice).collect();
        redecompose_on_devices(geo.grid, geo.box_size, geo.cutoff, atoms, &ranks, &mut dyns, home_positions, &mut identity, None, workers, scratch)
            .unwrap()
    }
}

#[test]
fn the_gpu_redecomposition_gives_the_hosts_plan_search_after_search() {
    let Some(g) = gpu("the_gpu_redecomposition_gives_the_hosts_plan_search_after_search") else { return };
    let sys = MolecularSystem::generate(45_000, 21).unwrap();
    let cases: [([usize; 3], f32); 8] = [
        ([2, 1, 1], 1.2),
        ([1, 2, 1], 1.0),
        ([4, 1, 1], 1.2),
        ([8, 1, 1], 1.1),
        ([2, 2, 1], 1.1),
        ([2, 2, 2], 1.2),
        ([3, 3, 1], 1.2),
        ([6, 2, 1], 1.4),
    ];
    let workers = Workers::serial();
    let mut two_pulses = false;
    for (dims, cutoff) in cases {
        let grid = RankGrid::new(dims).unwrap();
        let geo = Decomposition::new(grid, sys.box_size, cutoff).unwrap();
        two_pulses |= geo.pulses.contains(&2);
        let ranks: Vec<usize> = (0..grid.num_ranks()).collect();
        let mut homes_gpu: Vec<GpuHome> = ranks.iter().map(|&r| GpuHome::new(&g.ctx, r).unwrap()).collect();
        // One stream per rank, as an MD run gives each rank its own: every rank's passes are
        // enqueued before any is waited for, so they run side by side.
        let streams: Vec<_> = ranks.iter().map(|_| g.ctx.new_stream().unwrap()).collect();
        let mut scratch = RedecomposeScratch::default();
        let mut positions = sys.positions.clone();
        let mut plan = HaloPlan::from_positions(&positions, sys.box_size, grid, cutoff).unwrap();
        for search in 0..3u64 {
            let (moved_to, velocities) = moved(&positions, sys.box_size, search + 10 * dims.iter().sum::<usize>() as u64);
            positions = moved_to;
            let homes = homes_of(&plan, &positions, &velocities);
            let want = redecompose(grid, sys.box_size, cutoff, positions.len(), &ranks, homes.clone(), &mut identity).unwrap();
            let arrays: Vec<RankArrays> = homes.iter().map(|h| RankArrays::new(&g, h)).collect();
            let on = OnGpus { g: &g, streams: &streams, arrays: &arrays, homes: &homes };
            // The first search reads the home positions back; the next two leave them on the GPUs
            // (the pulses then take the positions they send from the selection's read-back, sized
            // by the search before).
            let home_positions = search == 0;
            let got = on.redecompose(&mut homes_gpu, &geo, positions.len(), home_positions, &workers, &mut scratch);
            let test = format!("{dims:?} cutoff {cutoff}, search {search}");
            assert_eq!(got.plan, want.plan, "{test}: the plan");
            for (r, ((gh, wh), d)) in got.homes.iter().zip(&want.homes).zip(&homes_gpu).enumerate() {
                assert_eq!(gh.ids, wh.ids, "{test} rank {r}: the home ids");
                assert!(gh.velocities.is_empty(), "{test} rank {r}: the velocities stay on the GPU");
                assert_eq!(d.home_atoms(), wh.ids.len(), "{test} rank {r}: home atoms on the GPU");
                let v = d.velocities().to_host().unwrap();
                assert_eq!(bits(&v[..wh.ids.len()]), bits(&wh.velocities), "{test} rank {r}: the velocities on the GPU");
            }
            for (r, ((gl, wl), &from)) in got.local_positions.iter().zip(&want.local_positions).zip(&got.local_positions_from).enumerate() {
                let home = want.homes[r].ids.len();
                // Left on the GPU unless asked for, or unless its scan was not exact.
                let exact = got.home_scans[r].is_some_and(|s| s.in_range && s.exact_along(std::array::from_fn(|d| dims[d] > 1)));
                assert_eq!(from, if !home_positions && exact && home > 0 { home } else { 0 }, "{test} rank {r}: local positions from");
                assert_eq!(bits(gl), bits(&wl[from..]), "{test} rank {r}: the local positions");
                let on_gpu = homes_gpu[r].positions().to_host().unwrap();
                assert_eq!(bits(&on_gpu[..home]), bits(&wl[..home]), "{test} rank {r}: the home positions on the GPU");
            }
            // Each GPU's extent of its home atoms: the host's scan of the home positions.
            assert_eq!(got.home_scans.len(), want.homes.len(), "{test}: a scan per rank");
            for (r, (found, wh)) in got.home_scans.iter().zip(&want.homes).enumerate() {
                let home = &want.local_positions[r][..wh.ids.len()];
                assert_eq!(*found, Some(scan(home, [0.0; 3], sys.box_size)), "{test} rank {r}: the home atoms' scan");
            }
            plan = got.plan;
        }
        eprintln!("{dims:?} cutoff {cutoff} (pulses {:?}): three searches equal the host's", geo.pulses);
    }
    assert!(two_pulses, "a case with two pulses");
}

/// A migration begun ahead (`GpuRank::begin_ahead`), enqueued behind a copy that writes its
/// coordinates and not waited for, as an MD run begins it behind its last step: the search that
/// follows takes it up when it is for the same geometry and inputs and gives the host's plan;
/// one begun for another cutoff, or for another array of the same ids, is not taken up (the
/// search enqueues its own migration) and the plan is the host's all the same.
#[test]
fn a_migration_begun_ahead_is_taken_up_only_by_its_own_search() {
    let Some(g) = gpu("a_migration_begun_ahead_is_taken_up_only_by_its_own_search") else { return };
    let sys = MolecularSystem::generate(45_000, 5).unwrap();
    let (grid, cutoff) = (RankGrid::new([2, 2, 1]).unwrap(), 1.1);
    let geo = Decomposition::new(grid, sys.box_size, cutoff).unwrap();
    let other_geo = Decomposition::new(grid, sys.box_size, 1.3).unwrap();
    let ranks: Vec<usize> = (0..grid.num_ranks()).collect();
    let mut homes_gpu: Vec<GpuHome> = ranks.iter().map(|&r| GpuHome::new(&g.ctx, r).unwrap()).collect();
    let streams: Vec<_> = ranks.iter().map(|_| g.ctx.new_stream().unwrap()).collect();
    let mut staging: Vec<Staging<Float3>> = ranks.iter().map(|_| Staging::new()).collect();
    let (workers, mut scratch) = (Workers::serial(), RedecomposeScratch::default());
    let mut positions = sys.positions.clone();
    let mut plan = HaloPlan::from_positions(&positions, sys.box_size, grid, cutoff).unwrap();
    // Per search: begun ahead for this search, for another cutoff, for a copy of the ids.
    let cases = [("this search's", true), ("another cutoff's", false), ("another ids array's", false), ("this search's again", true)];
    for (search, (what, taken)) in cases.into_iter().enumerate() {
        let (moved_to, velocities) = moved(&positions, sys.box_size, 700 + search as u64);
        positions = moved_to;
        let homes = homes_of(&plan, &positions, &velocities);
        let want = redecompose(grid, sys.box_size, cutoff, positions.len(), &ranks, homes.clone(), &mut identity).unwrap();
        // The last search's (stale) coordinates in place, the new ones still in flight on each
        // rank's stream when the migration is begun behind them.
        let old = homes_of(&plan, &sys.positions, &velocities);
        let arrays: Vec<RankArrays> = old.iter().map(|h| RankArrays::new(&g, h)).collect();
        let copies: Vec<Vec<u32>> = homes.iter().map(|h| h.ids.clone()).collect();
        for (i, ((d, a), h)) in homes_gpu.iter_mut().zip(&arrays).zip(&homes).enumerate() {
            staging[i].upload(&h.positions, &a.x, &streams[i]).unwrap();
            let (ahead_geo, ids) = match search {
                1 => (&other_geo, &h.ids),
                2 => (&geo, &copies[i]),
                _ => (&geo, &h.ids),
            };
            d.with(&g.module, &streams[i], &a.x, &a.v, ids).begin_ahead(ahead_geo).unwrap();
        }
        let before: Vec<u64> = homes_gpu.iter().map(GpuHome::ahead_taken).collect();
        let on = OnGpus { g: &g, streams: &streams, arrays: &arrays, homes: &homes };
        let got = on.redecompose(&mut homes_gpu, &geo, positions.len(), false, &workers, &mut scratch);
        let test = format!("search {search}, begun ahead as {what}");
        for (r, d) in homes_gpu.iter().enumerate() {
            assert_eq!(d.ahead_taken() - before[r], u64::from(taken), "{test}: rank {r} took the migration up");
        }
        assert_eq!(got.plan, want.plan, "{test}: the plan");
        // The home positions left on the GPUs: the local positions from where each rank holds them.
        for (r, ((gl, wl), &from)) in got.local_positions.iter().zip(&want.local_positions).zip(&got.local_positions_from).enumerate() {
            assert_eq!(bits(gl), bits(&wl[from..]), "{test} rank {r}: the local positions");
        }
        for (r, (d, wh)) in homes_gpu.iter().zip(&want.homes).enumerate() {
            let v = d.velocities().to_host().unwrap();
            assert_eq!(bits(&v[..wh.ids.len()]), bits(&wh.velocities), "{test} rank {r}: the velocities on the GPU");
        }
        plan = got.plan;
    }
}

#[test]
fn a_non_finite_position_fails_the_gpu_redecomposition_as_it_fails_the_hosts() {
    let Some(g) = gpu("a_non_finite_position_fails_the_gpu_redecomposition_as_it_fails_the_hosts") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let sys = MolecularSystem::generate(6000, 3).unwrap();
    let grid = RankGrid::new([2, 2, 1]).unwrap();
    let plan = HaloPlan::from_positions(&sys.positions, sys.box_size, grid, 1.0).unwrap();
    let mut homes = homes_of(&plan, &sys.positions, &sys.velocities);
    homes[3].positions[17].x = f32::NAN;
    let atom = homes[3].ids[17] as usize;
    let ranks: Vec<usize> = (0..4).collect();
    let mut homes_gpu: Vec<GpuHome> = ranks.iter().map(|&r| GpuHome::new(&g.ctx, r).unwrap()).collect();
    let arrays: Vec<RankArrays> = homes.iter().map(|h| RankArrays::new(&g, h)).collect();
    let mut devices: Vec<_> =
        homes_gpu.iter_mut().zip(&arrays).zip(&homes).map(|((d, a), h)| d.with(&g.module, &stream, &a.x, &a.v, &h.ids)).collect();
    let mut dyns: Vec<&mut dyn HomeDevice> = devices.iter_mut().map(|d| d as &mut dyn HomeDevice).collect();
    let e = redecompose_on_devices(
        grid,
        sys.box_size,
        1.0,
        sys.positions.len(),
        &ranks,
        &mut dyns,
        false,
        &mut identity,
        None,
        &Workers::serial(),
        &mut RedecomposeScratch::default(),
    )
    .map(|_| ())
    .unwrap_err();
    assert!(matches!(e, HaloError::Plan(PlanError::NonFinitePosition { atom: a, .. }) if a == atom), "{e}");
}

/// The extent kernel against the host's scan: positions in a box and outside it, with NaN and
/// infinities, signed zeros, from no position to several per thread; every part written (a short
/// run after a long one sees none of the long one's parts).
#[test]
fn the_gpu_extent_is_the_host_scan() {
    let Some(g) = gpu("the_gpu_extent_is_the_host_scan") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let extent = GpuExtent::new(&g.ctx).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let (lo, hi) = ([0.0f32; 3], [7.0f32, 8.0, 9.0]);
    let mut cases = 0;
    for n in [0usize, 1, 2, 31, 32, 33, 255, 256, 257, 4095, 4096, 4097, 100_000, 3, 1] {
        for bad in [None, Some(f32::NAN), Some(f32::INFINITY), Some(-1e-6), Some(7.0), Some(-0.0)] {
            let mut x: Vec<Float3> =
                (0..n).map(|_| Float3::new(rng.random_range(0.0..7.0), rng.random_range(0.0..8.0), rng.random_range(0.0..9.0))).collect();
            if let (Some(v), true) = (bad, n > 0) {
                let k = rng.random_range(0..n);
                match rng.random_range(0..3) {
                    0 => x[k].x = v,
                    1 => x[k].y = v,
                    _ => x[k].z = v,
                }
            }
            let xd = DeviceBuffer::from_host(&g.ctx, &x).unwrap();
            let got = extent.run(&g.module, &stream, &xd, n, lo, hi).unwrap();
            let want = scan(&x, lo, hi);
            let what = format!("{n} positions, bad {bad:?}");
            assert_eq!(got.in_range, want.in_range, "{what}: in range");
            // The extent of the rest; a NaN is kept by neither. `==`: which zero the fold keeps depends
            // on the order, on the host as on the GPU.
            assert_eq!((got.lo, got.hi), (want.lo, want.hi), "{what}: extent");
            cases += 1;
        }
    }
    eprintln!("the GPU extent equals the host scan in {cases} cases");
}

/// The home id facts kernel against the host's facts of the same ids ([`HomeIdFacts::of`]): ids
/// ascending with gaps, up to the largest 31-bit id, then with two neighbours swapped, an id
/// repeated or one id below its predecessor at a thread's or a warp's first id (where the id
/// before it is another thread's), from no id to many per thread; every part written (a short run
/// after a long one sees none of the long one's parts). Then a rank's merge on the GPU hands back
/// the facts of its merged ids.
#[test]
fn the_gpu_id_facts_are_the_hosts() {
    let Some(g) = gpu("the_gpu_id_facts_are_the_hosts") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let facts = GpuIdFacts::new(&g.ctx).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
    let (mut cases, mut unordered) = (0, 0);
    for n in [0usize, 1, 2, 31, 32, 33, 255, 256, 257, 4095, 4096, 4097, 4098, 100_000, 3, 1] {
        // Ascending ids with random gaps, the last ones near 2^31.
        let mut ids: Vec<u32> = Vec::with_capacity(n);
        let mut id = rng.random_range(0..1000u32);
        for k in 0..n {
            ids.push(id);
            id += if k + 3 >= n { rng.random_range(1..(1u32 << 29)) } else { rng.random_range(1..40) };
        }
        for bad in ["none", "swap", "repeat", "drop at a thread's first id", "drop at a warp's first id"] {
            let mut ids = ids.clone();
            if n >= 2 {
                let k = match bad {
                    "drop at a thread's first id" => 4096.min(n - 1),
                    "drop at a warp's first id" => 32.min(n - 1),
                    _ => rng.random_range(1..n),
                };
                match bad {
                    "swap" => ids.swap(k - 1, k),
                    "repeat" => ids[k] = ids[k - 1],
                    "none" => {}
                    _ => ids[k] = ids[k - 1].saturating_sub(1),
                }
            }
            let want = HomeIdFacts::of(&ids);
            let got = facts.run(&g.module, &stream, &DeviceBuffer::from_host(&g.ctx, &ids).unwrap(), n).unwrap();
            assert_eq!(got, want, "{n} ids, {bad}");
            unordered += usize::from(!want.ascending);
            cases += 1;
        }
    }
    assert!(unordered > 30, "cases out of order: {unordered}");

    // A merge on the GPU: its facts are those of the ids it merged.
    let sys = MolecularSystem::generate(20_000, 31).unwrap();
    let grid = RankGrid::new([2, 1, 1]).unwrap();
    let geo = Decomposition::new(grid, sys.box_size, 1.1).unwrap();
    let plan = HaloPlan::from_positions(&sys.positions, sys.box_size, grid, geo.cutoff).unwrap();
    let (positions, velocities) = moved(&sys.positions, sys.box_size, 5);
    let homes = homes_of(&plan, &positions, &velocities);
    let arrays = RankArrays::new(&g, &homes[0]);
    let mut home = GpuHome::new(&g.ctx, 0).unwrap();
    let mut rank = home.with(&g.module, &stream, &arrays.x, &arrays.v, &homes[0].ids);
    let (_, leavers) = rank.migrate(&geo).unwrap();
    // The leavers of rank 0 come back to it (no other rank's atoms arrive): every id once.
    let mut back: Vec<(u32, Float3, Float3)> = leavers.iter().map(|l| (l.id, l.x, l.v)).collect();
    back.sort_unstable_by_key(|a| a.0);
    let merged = rank.merge_and_select(&geo, &back, true, MergedHome::default()).unwrap();
    assert_eq!(merged.ids.len(), homes[0].ids.len());
    assert_eq!(merged.id_facts, Some(HomeIdFacts::of(&merged.ids)), "the merge's facts");
    // The same merge with the positions left on the GPU: the same ids and first pulses, the
    // positions those send (from the selection's packed read-back) and none else, with the room
    // the last merge sized and with one too small (read again after the wait); then the
    // positions read back on demand.
    for hint in [None, Some(0)] {
        drop(rank);
        if let Some(selected) = hint {
            home.set_selected_room_hint(selected);
        }
        rank = home.with(&g.module, &stream, &arrays.x, &arrays.v, &homes[0].ids);
        let left = rank.merge_and_select(&geo, &back, false, MergedHome::default()).unwrap();
        let what = format!("room hint {hint:?}");
        assert_eq!(
            (&left.ids, &left.first_pulse, left.id_facts),
            (&merged.ids, &merged.first_pulse, merged.id_facts),
            "{what}: the merge without its positions"
        );
        assert!(left.wrapped.is_empty(), "{what}: no home positions read back");
        assert!(left.first_pulse.iter().map(Vec::len).sum::<usize>() > 320, "{what}: more selected than the smallest room holds");
        for (map, x) in left.first_pulse.iter().zip(&left.first_pulse_x) {
            let want: Vec<Float3> = map.iter().map(|&k| merged.wrapped[k as usize]).collect();
            assert_eq!(bits(x), bits(&want), "{what}: the positions a first pulse sends");
        }
    }
    let mut read = Vec::new();
    rank.read_home_positions(&mut read).unwrap();
    assert_eq!(bits(&read), bits(&merged.wrapped), "the home positions read back on demand");
    eprintln!("the GPU id facts equal the host's in {cases} cases ({unordered} out of order) and after a merge");
}
