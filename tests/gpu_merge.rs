//! The merge of a rank's arrivals into its stayers on the GPU (`decomp::GpuMerge`, the
//! `migrate_merge` kernel) against the host (`decomp::merge_reference`, which the unit tests tie to
//! the redecomposition's own `Working::new`), bit for bit: the merged ids, wrapped positions and
//! velocities in id order. No stayers, no arrivals, neither; arrivals before every stayer, after
//! every one, among them, in one narrow run; 0 to 600,000 atoms across block boundaries, arrivals
//! given in any order (the host sorts them); positions with -0.0, subnormals and NaN payloads (a
//! merge copies bits); every output poisoned, with slack after it; one `GpuMerge` reused from larger
//! merges to smaller ones. Order violations (stayers out of order or repeated, an arrival repeated,
//! an arrival that is a stayer) reported as the host reports them, and the object usable after.
//! Then the chain: `GpuMigrate` on every rank of 2x2x1, 2x2x2 and 3x1x1 grids, the leavers routed
//! to their owners rank by rank as the host's migration collective delivers them, `GpuMerge` on
//! every rank, against `decomp::redecompose` (its home ids and velocities, and its local positions'
//! home part). The MD step runs it inside `decomp::GpuHome` (`tests/gpu_redecompose.rs`).

use halo::HaloError;
use halo::abi::{Float3, MigrateLeaver};
use halo::decomp::{
    Decomposition, GpuMerge, GpuMigrate, HaloPlan, HomeAtoms, MergeArrays, MergeReference, MigrateArrays, PlanError, RankGrid, merge_reference,
    redecompose,
};
use halo::gpu::{CudaStream, DeviceBuffer, DeviceMemory};
use halo::system::MolecularSystem;
use halo::testing::{GpuFixture as Gpu, gpu_or_skip as gpu, homes_of, moved_positions};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Extra poisoned elements after the `n` of every output: nothing may be written there.
const SLACK: usize = 37;

fn bits(v: &[Float3]) -> Vec<[u32; 3]> {
    v.iter().map(|p| [p.x.to_bits(), p.y.to_bits(), p.z.to_bits()]).collect()
}

/// Where the arrivals' ids fall among the stayers'.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Below every stayer.
    Before,
    /// Above every stayer.
    After,
    /// Spread among them.
    Among,
    /// Among them, in one narrow run of ids.
    Run,
}

/// A value with hard bits now and then: -0.0, a subnormal, a NaN with a payload, the largest float.
fn value(rng: &mut ChaCha8Rng) -> f32 {
    match rng.random_range(0..50) {
        0 => -0.0,
        1 => f32::from_bits(0x0000_0123),
        2 => f32::from_bits(0x7fc0_1234),
        3 => f32::MAX,
        _ => rng.random_range(-10.0..10.0),
    }
}

fn float3(rng: &mut ChaCha8Rng) -> Float3 {
    Float3::new(value(rng), value(rng), value(rng))
}

/// `ns` stayers (ids ascending, positions, velocities) and `na` arrivals laid out as `layout`,
/// shuffled unless `sorted` (their owner a marker the merge must not read).
#[allow(clippy::type_complexity)]
fn case(ns: usize, na: usize, layout: Layout, sorted: bool, seed: u64) -> (Vec<u32>, Vec<Float3>, Vec<Float3>, Vec<MigrateLeaver>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = ns + na;
    // Distinct ids with gaps; then which are arrivals.
    let mut ids: Vec<u32> = Vec::with_capacity(n);
    let mut id = rng.random_range(0..3u32);
    for _ in 0..n {
        ids.push(id);
        id += rng.random_range(1..4);
    }
    let arriving: Vec<bool> = match layout {
        Layout::Before => (0..n).map(|k| k < na).collect(),
        Layout::After => (0..n).map(|k| k >= ns).collect(),
        Layout::Among => {
            let mut a: Vec<bool> = (0..n).map(|k| k < na).collect();
            a.shuffle(&mut rng);
            a
        }
        Layout::Run => {
            let start = rng.random_range(0..=ns);
            (0..n).map(|k| (start..start + na).contains(&k)).collect()
        }
    };
    let (mut stay_ids, mut x, mut v, mut arrivals) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (k, &id) in ids.iter().enumerate() {
        if arriving[k] {
            arrivals.push(MigrateLeaver { id, x: float3(&mut rng), v: float3(&mut rng), owner: 0xDEAD });
        } else {
            stay_ids.push(id);
            x.push(float3(&mut rng));
            v.push(float3(&mut rng));
        }
    }
    if !sorted {
        arrivals.shuffle(&mut rng);
    }
    (stay_ids, x, v, arrivals)
}

/// The device arrays of one merge: stayers uploaded, outputs `n + SLACK` long, poisoned.
struct Arrays {
    ids: DeviceBuffer<u32>,
    x: DeviceBuffer<Float3>,
    v: DeviceBuffer<Float3>,
    ids_out: DeviceBuffer<u32>,
    x_out: DeviceBuffer<Float3>,
    v_out: DeviceBuffer<Float3>,
}

impl Arrays {
    fn new(g: &Gpu, ids: &[u32], x: &[Float3], v: &[Float3], n: usize) -> Self {
        let a = Self {
            ids: DeviceBuffer::from_host(&g.ctx, ids).unwrap(),
            x: DeviceBuffer::from_host(&g.ctx, x).unwrap(),
            v: DeviceBuffer::from_host(&g.ctx, v).unwrap(),
            ids_out: DeviceBuffer::uninit(&g.ctx, n + SLACK).unwrap(),
            x_out: DeviceBuffer::uninit(&g.ctx, n + SLACK).unwrap(),
            v_out: DeviceBuffer::uninit(&g.ctx, n + SLACK).unwrap(),
        };
        poison(&a.ids_out, &a.x_out, &a.v_out);
        // Pageable uploads may land after a kernel on another stream starts: wait for them.
        g.ctx.synchronize().unwrap();
        a
    }

    fn view(&self) -> MergeArrays<'_> {
        MergeArrays { ids: &self.ids, x: &self.x, v: &self.v, ids_out: &self.ids_out, x_out: &self.x_out, v_out: &self.v_out }
    }
}

fn poison(ids: &DeviceBuffer<u32>, x: &DeviceBuffer<Float3>, v: &DeviceBuffer<Float3>) {
    ids.fill_bytes(0xFF).unwrap();
    x.fill_bytes(0xFF).unwrap();
    v.fill_bytes(0xFF).unwrap();
}

/// The merged outputs against `want`, bit for bit, and nothing written past them.
fn compare(test: &str, ids_out: &DeviceBuffer<u32>, x_out: &DeviceBuffer<Float3>, v_out: &DeviceBuffer<Float3>, want: &MergeReference) {
    let n = want.ids.len();
    let (io, xo, vo) = (ids_out.to_host().unwrap(), x_out.to_host().unwrap(), v_out.to_host().unwrap());
    if let Some(k) = (0..n).find(|&k| io[k] != want.ids[k]) {
        panic!("{test}: merged atom {k} has id {} on the GPU, {} on the host", io[k], want.ids[k]);
    }
    if let Some(k) = (0..n).find(|&k| bits(&xo[k..=k]) != bits(&want.positions[k..=k])) {
        panic!("{test}: atom {k} (id {}) at {:?} on the GPU, {:?} on the host", io[k], xo[k], want.positions[k]);
    }
    assert_eq!(bits(&vo[..n]), bits(&want.velocities), "{test}: the velocities");
    assert!(io[n..].iter().all(|&i| i == u32::MAX), "{test}: ids written past the merged atoms");
    assert!(bits(&xo[n..]).iter().chain(&bits(&vo[n..])).all(|b| *b == [u32::MAX; 3]), "{test}: written past the merged atoms");
}

/// Merges `arrivals` into the stayers on `rank` and checks it against the host, bit for bit.
#[allow(clippy::too_many_arguments)]
fn check(
    test: &str,
    g: &Gpu,
    stream: &CudaStream,
    merge: &mut GpuMerge,
    rank: usize,
    ids: &[u32],
    x: &[Float3],
    v: &[Float3],
    arrivals: &[MigrateLeaver],
) {
    let want = merge_reference(ids, x, v, arrivals, rank).unwrap_or_else(|e| panic!("{test}: the host: {e}"));
    let n = ids.len() + arrivals.len();
    let d = Arrays::new(g, ids, x, v, n);
    let got = merge.run(&g.module, stream, &d.view(), ids.len(), arrivals).unwrap_or_else(|e| panic!("{test}: {e}"));
    assert_eq!(got, n, "{test}: the merged count");
    compare(test, &d.ids_out, &d.x_out, &d.v_out, &want);
    // The stayers untouched.
    assert_eq!(d.ids.to_host().unwrap(), ids, "{test}: the stayers' ids changed");
    assert_eq!(bits(&d.x.to_host().unwrap()), bits(x), "{test}: the stayers' positions changed");
}

#[test]
fn gpu_merge_equals_the_host() {
    let Some(g) = gpu("gpu_merge_equals_the_host") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let mut merge = GpuMerge::new(&g.ctx, 3).unwrap();
    // Larger merges first, so later ones reuse grown buffers holding stale arrivals and flags.
    let sizes = [
        (45_000, 400),
        (6000, 6000),
        (0, 2000),
        (2000, 0),
        (513, 1),
        (511, 1),
        (256, 1),
        (255, 1),
        (256, 0),
        (1, 255),
        (0, 256),
        (0, 257),
        (128, 128),
        (33, 3),
        (1, 1),
        (1, 0),
        (0, 1),
        (0, 0),
    ];
    for (k, &(ns, na)) in sizes.iter().enumerate() {
        for (l, layout) in [Layout::Before, Layout::After, Layout::Among, Layout::Run].into_iter().enumerate() {
            let sorted = (k + l) % 2 == 0;
            let (ids, x, v, arrivals) = case(ns, na, layout, sorted, (10 * k + l) as u64);
            let test = format!("{ns} stayers, {na} arrivals {layout:?} (sorted: {sorted})");
            check(&test, &g, &stream, &mut merge, 3, &ids, &x, &v, &arrivals);
        }
    }
}

#[test]
fn gpu_merge_of_many_blocks_and_random_inputs() {
    let Some(g) = gpu("gpu_merge_of_many_blocks_and_random_inputs") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let mut merge = GpuMerge::new(&g.ctx, 0).unwrap();
    for (ns, na, layout) in [
        (600_000, 300, Layout::Among),
        (599_999, 1, Layout::Run),
        (300, 600_000, Layout::Among),
        (262_144, 262_145, Layout::Among),
        (600_000, 20_000, Layout::Run),
        (600_000, 0, Layout::Among),
    ] {
        let (ids, x, v, arrivals) = case(ns, na, layout, false, (ns ^ na) as u64);
        let t = std::time::Instant::now();
        check(&format!("{ns} stayers, {na} arrivals {layout:?}"), &g, &stream, &mut merge, 0, &ids, &x, &v, &arrivals);
        eprintln!("{ns} stayers, {na} arrivals {layout:?}: checked in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    }
    // Random sizes and layouts, one object.
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    for k in 0..40 {
        let (ns, na) = (rng.random_range(0..20_000), rng.random_range(0..3000));
        let layout = [Layout::Before, Layout::After, Layout::Among, Layout::Run][k % 4];
        let (ids, x, v, arrivals) = case(ns, na, layout, k % 3 == 0, 1000 + k as u64);
        check(&format!("random {k}: {ns} stayers, {na} arrivals {layout:?}"), &g, &stream, &mut merge, 0, &ids, &x, &v, &arrivals);
    }
}

#[test]
fn order_violations_are_reported_like_the_host_reports_them() {
    let Some(g) = gpu("order_violations_are_reported_like_the_host_reports_them") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let mut merge = GpuMerge::new(&g.ctx, 5).unwrap();
    let (ids, x, v, arrivals) = case(5000, 200, Layout::Among, false, 7);
    let mut swapped = ids.clone();
    swapped.swap(255, 256);
    let mut repeated = ids.clone();
    repeated[4000] = repeated[3999];
    let mut twice = arrivals.clone();
    twice.push(arrivals[17]);
    let is_stayer = |s: usize| {
        let mut a = arrivals.clone();
        a.push(MigrateLeaver { id: ids[s], ..arrivals[0] });
        a
    };
    let cases = [
        ("stayers swapped across a block boundary", swapped.clone(), arrivals.clone(), (true, false, false)),
        ("a stayer repeated", repeated, arrivals.clone(), (true, false, false)),
        ("an arrival repeated", ids.clone(), twice.clone(), (false, true, false)),
        ("an arrival is the first stayer", ids.clone(), is_stayer(0), (false, false, true)),
        ("an arrival is stayer 2,500", ids.clone(), is_stayer(2500), (false, false, true)),
        ("an arrival is the last stayer", ids.clone(), is_stayer(4999), (false, false, true)),
        ("stayers and arrivals out of order", swapped, twice, (true, true, false)),
    ];
    for (test, stay_ids, a, flags) in cases {
        let want = merge_reference(&stay_ids, &x, &v, &a, 5).unwrap_err();
        let d = Arrays::new(&g, &stay_ids, &x, &v, stay_ids.len() + a.len());
        let got = merge.run(&g.module, &stream, &d.view(), stay_ids.len(), &a).unwrap_err();
        match &got {
            HaloError::Plan(e @ PlanError::GpuMergeOrder { rank: 5, stayers_unordered, arrivals_unordered, repeated, .. }) => {
                assert_eq!((*stayers_unordered, *arrivals_unordered, *repeated), flags, "{test}: {e}");
                assert_eq!(e, &want, "{test}: as the host reports it");
                assert!(e.to_string().contains("redecompose this step on the host"), "{test}: {e}");
            }
            other => panic!("{test}: {other:?}"),
        }
        // Nothing written past the outputs, whatever the order.
        let n = stay_ids.len() + a.len();
        assert!(d.ids_out.to_host().unwrap()[n..].iter().all(|&i| i == u32::MAX), "{test}: written past the outputs");
        // The same object merges again.
        check(&format!("after {test}"), &g, &stream, &mut merge, 5, &ids, &x, &v, &arrivals);
    }
    // An arrival repeated and another that is a stayer: both flags, told apart.
    let mut both = is_stayer(100);
    both.push(arrivals[3]);
    let want = merge_reference(&ids, &x, &v, &both, 5).unwrap_err();
    let d = Arrays::new(&g, &ids, &x, &v, ids.len() + both.len());
    match merge.run(&g.module, &stream, &d.view(), ids.len(), &both).unwrap_err() {
        HaloError::Plan(e @ PlanError::GpuMergeOrder { stayers_unordered: false, arrivals_unordered: true, repeated: true, .. }) => {
            assert_eq!(e, want)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_arrays_are_refused_and_a_merge_is_checked_later() {
    let Some(g) = gpu("bad_arrays_are_refused_and_a_merge_is_checked_later") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let mut merge = GpuMerge::new(&g.ctx, 1).unwrap();
    let (ids, x, v, arrivals) = case(1000, 50, Layout::Among, false, 3);
    let d = Arrays::new(&g, &ids, &x, &v, 1050);
    let e = merge.run(&g.module, &stream, &d.view(), 1001, &arrivals).unwrap_err().to_string();
    assert!(e.contains("of 1001 atoms: `ids` holds 1000"), "{e}");
    let e = merge.run(&g.module, &stream, &d.view(), 1000, &[arrivals.clone(), arrivals[..SLACK + 1].to_vec()].concat()).unwrap_err().to_string();
    assert!(e.contains("`ids_out` holds 1087"), "{e}");
    // Outputs over an input or over each other (no arrivals, so the stayers' arrays are long enough).
    let e = merge.run(&g.module, &stream, &MergeArrays { x_out: &d.x, ..d.view() }, 1000, &[]).unwrap_err().to_string();
    assert!(e.contains("`x_out` overlaps `x`"), "{e}");
    let e = merge.run(&g.module, &stream, &MergeArrays { v_out: &d.x_out, ..d.view() }, 1000, &arrivals).unwrap_err().to_string();
    assert!(e.contains("`v_out` overlaps `x_out`"), "{e}");
    let e = merge.check().unwrap_err().to_string();
    assert!(e.contains("no merge enqueued"), "{e}");
    // Nothing ran: the outputs are still poisoned.
    assert!(d.ids_out.to_host().unwrap().iter().all(|&i| i == u32::MAX));
    // Enqueued, more work on the stream reading the outputs, then checked.
    let want = merge_reference(&ids, &x, &v, &arrivals, 1).unwrap();
    assert_eq!(merge.enqueue(&g.module, &stream, &d.view(), 1000, &arrivals).unwrap(), 1050);
    let copy = DeviceBuffer::<u32>::uninit(&g.ctx, 1050).unwrap();
    copy.copy_prefix_from_async(&d.ids_out, 1050, &stream).unwrap();
    assert_eq!(merge.check().unwrap(), 1050);
    assert!(merge.check().is_err(), "checked once");
    stream.synchronize().unwrap();
    assert_eq!(copy.to_host().unwrap(), want.ids);
    compare("enqueued and checked", &d.ids_out, &d.x_out, &d.v_out, &want);
}

#[test]
fn gpu_migration_and_merge_on_every_rank_equal_redecompose() {
    let Some(g) = gpu("gpu_migration_and_merge_on_every_rank_equal_redecompose") else { return };
    let stream = g.ctx.new_stream().unwrap();
    for (k, (dims, atoms)) in [([2, 2, 1], 6000), ([2, 2, 2], 6000), ([3, 1, 1], 6000), ([2, 2, 1], 45_000)].into_iter().enumerate() {
        let sys = MolecularSystem::generate(atoms, 7 + k as u64).unwrap();
        let (grid, cutoff) = (RankGrid::new(dims).unwrap(), 0.9);
        let geo = Decomposition::new(grid, sys.box_size, cutoff).unwrap();
        let before = HaloPlan::from_positions(&sys.positions, sys.box_size, grid, cutoff).unwrap();
        let x = moved_positions(&sys.positions, sys.box_size, k as u64);
        let mut rng = ChaCha8Rng::seed_from_u64(k as u64);
        let v: Vec<Float3> = x.iter().map(|_| Float3::new(rng.random_range(-2.0..2.0), rng.random(), rng.random())).collect();
        // Every rank's home atoms as the last plan left them (id order), moved since.
        let homes: Vec<HomeAtoms> = homes_of(&before, &x, &v);
        let ranks: Vec<usize> = (0..grid.num_ranks()).collect();
        let want = redecompose(grid, sys.box_size, cutoff, atoms, &ranks, homes.clone(), &mut |_, mine| Ok(mine)).unwrap();
        // Each rank's migration on the GPU: the stayers stay on the device, the leavers come back.
        let mut stayers = Vec::new();
        let mut arrivals = vec![Vec::new(); ranks.len()];
        for (r, h) in homes.iter().enumerate() {
            let n = h.ids.len();
            let (xd, vd, idd) = (
                DeviceBuffer::from_host(&g.ctx, &h.positions).unwrap(),
                DeviceBuffer::from_host(&g.ctx, &h.velocities).unwrap(),
                DeviceBuffer::from_host(&g.ctx, &h.ids).unwrap(),
            );
            let (xo, vo, io) = (
                DeviceBuffer::<Float3>::uninit(&g.ctx, n).unwrap(),
                DeviceBuffer::<Float3>::uninit(&g.ctx, n).unwrap(),
                DeviceBuffer::<u32>::uninit(&g.ctx, n).unwrap(),
            );
            g.ctx.synchronize().unwrap();
            let mut mig = GpuMigrate::new(&g.ctx, &geo, r).unwrap();
            let m = mig.run(&g.module, &stream, &MigrateArrays { x: &xd, v: &vd, ids: &idd, x_out: &xo, v_out: &vo, ids_out: &io }, n).unwrap();
            // The leavers to their owners, rank by rank, as the migration's collective delivers them.
            for l in m.leavers {
                arrivals[l.owner as usize].push(l);
            }
            stayers.push((m.stayers, io, xo, vo));
        }
        let moving: usize = arrivals.iter().map(Vec::len).sum();
        assert!(moving > atoms / 100, "{dims:?}: only {moving} atoms moved between ranks");
        // Each rank's merge on the GPU, against the host's new home atoms.
        for (r, (ns, io, xo, vo)) in stayers.into_iter().enumerate() {
            let test = format!("{dims:?}, {atoms} atoms, rank {r}: {ns} stayers, {} arrivals", arrivals[r].len());
            let n = ns + arrivals[r].len();
            let (ids_out, x_out, v_out) = (
                DeviceBuffer::<u32>::uninit(&g.ctx, n + SLACK).unwrap(),
                DeviceBuffer::<Float3>::uninit(&g.ctx, n + SLACK).unwrap(),
                DeviceBuffer::<Float3>::uninit(&g.ctx, n + SLACK).unwrap(),
            );
            poison(&ids_out, &x_out, &v_out);
            let mut merge = GpuMerge::new(&g.ctx, r).unwrap();
            let a = MergeArrays { ids: &io, x: &xo, v: &vo, ids_out: &ids_out, x_out: &x_out, v_out: &v_out };
            assert_eq!(merge.run(&g.module, &stream, &a, ns, &arrivals[r]).unwrap_or_else(|e| panic!("{test}: {e}")), n);
            let home = want.homes[r].ids.len();
            assert_eq!(n, home, "{test}: the home atoms");
            let host = MergeReference {
                ids: want.homes[r].ids.clone(),
                positions: want.local_positions[r][..home].to_vec(),
                velocities: want.homes[r].velocities.clone(),
            };
            compare(&test, &ids_out, &x_out, &v_out, &host);
        }
        eprintln!("{dims:?}, {atoms} atoms: every rank's GPU migration and merge equal redecompose ({moving} atoms moved)");
    }
}
