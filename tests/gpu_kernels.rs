//! Gather/scatter kernels against their CPU references on a real GPU.
//! Outputs are poisoned (all bits set: NaN) before every launch, so an unwritten element fails.
//! Without a GPU each test says it skipped; `HALO_REQUIRE_GPUS=1` turns that into a failure.

use approx::assert_relative_eq;
use halo::abi::{Float3, PackMode};
use halo::gpu::{DeviceBuffer, DeviceMemory};
use halo::kernels::{self, IndexMap};
use halo::reference;
use halo::testing::{GpuFixture, gpu_or_skip};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const POISON: u8 = 0xFF;

fn random_coords(rng: &mut ChaCha8Rng, n: usize) -> Vec<Float3> {
    (0..n).map(|_| Float3::new(rng.random_range(-50.0..50.0), rng.random_range(-50.0..50.0), rng.random_range(-50.0..50.0))).collect()
}

fn bits(v: &[Float3]) -> Vec<[u32; 3]> {
    v.iter().map(|f| [f.x.to_bits(), f.y.to_bits(), f.z.to_bits()]).collect()
}

/// `n` distinct indices below `range`, sorted or shuffled.
fn distinct_map(rng: &mut ChaCha8Rng, n: usize, range: usize, sorted: bool) -> Vec<u32> {
    let mut all: Vec<u32> = rand::seq::index::sample(rng, range, n).into_iter().map(|i| i as u32).collect();
    if sorted {
        all.sort_unstable();
    } else {
        all.shuffle(rng);
    }
    all
}

fn run_pack(g: &GpuFixture, x: &[Float3], map: &[u32], shift: Option<Float3>) -> Vec<Float3> {
    let stream = g.ctx.default_stream();
    let xd = DeviceBuffer::from_host(&g.ctx, x).unwrap();
    let md = IndexMap::new(&g.ctx, map).unwrap();
    let out = DeviceBuffer::<Float3>::uninit(&g.ctx, map.len()).unwrap();
    out.fill_bytes(POISON).unwrap();
    kernels::pack_coords(&g.module, &stream, &xd, &md, &out, shift).unwrap();
    stream.synchronize().unwrap();
    out.to_host().unwrap()
}

#[test]
fn pack_matches_reference_for_edge_and_large_sizes() {
    let Some(g) = gpu_or_skip("pack_matches_reference_for_edge_and_large_sizes") else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for &n in &[0usize, 1, 3, 4, 5, 1000, 1_000_000] {
        let x = random_coords(&mut rng, (4 * n).max(1));
        for sorted in [true, false] {
            let map = distinct_map(&mut rng, n, x.len(), sorted);
            let got = run_pack(&g, &x, &map, None);
            assert_eq!(bits(&got), bits(&reference::pack(&x, &map, None)), "n = {n}, sorted = {sorted}");
        }
    }
}

#[test]
fn pack_adds_the_periodic_shift() {
    let Some(g) = gpu_or_skip("pack_adds_the_periodic_shift") else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let x = random_coords(&mut rng, 5000);
    let map: Vec<u32> = (0..3001).map(|_| rng.random_range(0..5000)).collect(); // repeats are fine for a gather
    let shift = Some(Float3::new(7.7, 0.0, -3.25));
    assert_eq!(bits(&run_pack(&g, &x, &map, shift)), bits(&reference::pack(&x, &map, shift)));
}

/// `fill_bytes` and `copy_from_host` have landed when they return, also for a kernel on a
/// non-blocking stream (every stream halo makes): a check that poisons its output and then launches
/// must not see the poison land after its kernel. Work queued ahead on the legacy default stream
/// (a 50 ms spin) holds the fill back unless the call waits for it; before the fix, `cuMemsetD8`
/// returned at once and `halo bench-kernels` read NaN after a correct pack.
#[test]
fn synchronous_fill_and_copy_have_landed_when_they_return() {
    let Some(g) = gpu_or_skip("synchronous_fill_and_copy_have_landed_when_they_return") else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let n = 1 << 16;
    let (legacy, stream) = (g.ctx.default_stream(), g.ctx.new_stream().unwrap());
    let identity: Vec<u32> = (0..n as u32).collect();
    let map = IndexMap::new(&g.ctx, &identity).unwrap();
    let x = DeviceBuffer::from_host(&g.ctx, &random_coords(&mut rng, n)).unwrap();
    let out = DeviceBuffer::<Float3>::zeroed(&g.ctx, n).unwrap();
    for round in 0..3 {
        let host = random_coords(&mut rng, n);
        kernels::spin_delay(&g.module, &legacy, 50_000_000).unwrap();
        x.copy_from_host(&host).unwrap();
        kernels::spin_delay(&g.module, &legacy, 50_000_000).unwrap();
        out.fill_bytes(POISON).unwrap();
        kernels::pack_coords(&g.module, &stream, &x, &map, &out, None).unwrap();
        stream.synchronize().unwrap();
        legacy.synchronize().unwrap();
        assert_eq!(bits(&out.to_host().unwrap()), bits(&host), "round {round}: the pack behind a fill and a copy read or left stale data");
    }
}

#[test]
fn unpack_store_scatters_through_the_map() {
    let Some(g) = gpu_or_skip("unpack_store_scatters_through_the_map") else { return };
    let stream = g.ctx.default_stream();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for &n in &[0usize, 1, 5, 777, 1_000_000] {
        let dst_len = 2 * n + 3;
        let buf = random_coords(&mut rng, n);
        let map = distinct_map(&mut rng, n, dst_len, false);
        let mut expected = random_coords(&mut rng, dst_len);
        let dst = DeviceBuffer::from_host(&g.ctx, &expected).unwrap();
        reference::unpack_store(&buf, &map, &mut expected);
        let bd = DeviceBuffer::from_host(&g.ctx, &buf).unwrap();
        kernels::unpack(&g.module, &stream, &bd, &IndexMap::new(&g.ctx, &map).unwrap(), &dst, false).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(bits(&dst.to_host().unwrap()), bits(&expected), "n = {n}");
    }
}

#[test]
fn unpack_accumulate_adds_repeated_targets() {
    let Some(g) = gpu_or_skip("unpack_accumulate_adds_repeated_targets") else { return };
    let stream = g.ctx.default_stream();
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    for &(n, dst_len) in &[(0usize, 1usize), (1, 1), (5, 2), (10_000, 64), (1_000_000, 4_000_000)] {
        let buf = random_coords(&mut rng, n);
        let map: Vec<u32> = (0..n).map(|_| rng.random_range(0..dst_len as u32)).collect();
        let mut expected = random_coords(&mut rng, dst_len);
        let dst = DeviceBuffer::from_host(&g.ctx, &expected).unwrap();
        reference::unpack_accumulate(&buf, &map, &mut expected);
        let bd = DeviceBuffer::from_host(&g.ctx, &buf).unwrap();
        kernels::unpack(&g.module, &stream, &bd, &IndexMap::new(&g.ctx, &map).unwrap(), &dst, true).unwrap();
        stream.synchronize().unwrap();
        for (got, want) in dst.to_host().unwrap().iter().zip(&expected) {
            // Atomic accumulation order differs from the CPU's; the scale is the summed magnitude.
            for (a, b) in [(got.x, want.x), (got.y, want.y), (got.z, want.z)] {
                assert_relative_eq!(a, b, epsilon = 1e-3, max_relative = 1e-5);
            }
        }
    }
}

#[test]
fn pack_subset_packs_the_selected_entries_and_counts_the_rest() {
    let Some(g) = gpu_or_skip("pack_subset_packs_the_selected_entries_and_counts_the_rest") else { return };
    let stream = g.ctx.default_stream();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let x = random_coords(&mut rng, 20_000);
    let threshold = 10_000;
    let cases: [(&str, Vec<u32>); 5] = [
        ("empty", vec![]),
        ("one independent", vec![3]),
        ("one dependent", vec![15_000]),
        ("independent only", (0..5000).map(|_| rng.random_range(0..threshold)).collect()),
        ("mixed", (0..12_345).map(|_| rng.random_range(0..20_000)).collect()),
    ];
    for (name, map) in &cases {
        for mode in [PackMode::All, PackMode::BelowThreshold, PackMode::AtOrAboveThreshold] {
            let xd = DeviceBuffer::from_host(&g.ctx, &x).unwrap();
            let out = DeviceBuffer::<Float3>::uninit(&g.ctx, map.len()).unwrap();
            out.fill_bytes(POISON).unwrap();
            let deferred = kernels::counter(&g.ctx).unwrap();
            let md = IndexMap::new(&g.ctx, map).unwrap();
            kernels::pack_subset(&g.module, &stream, &xd, &md, &out, None, mode, threshold, &deferred).unwrap();
            stream.synchronize().unwrap();
            let mut expected = out.to_host().unwrap(); // poison where nothing is packed
            expected.iter_mut().for_each(|v| *v = Float3::new(f32::from_bits(!0), f32::from_bits(!0), f32::from_bits(!0)));
            let want_deferred = reference::pack_subset(&x, map, &mut expected, None, mode, threshold);
            assert_eq!(bits(&out.to_host().unwrap()), bits(&expected), "{name} {mode:?}");
            assert_eq!(deferred.to_host().unwrap()[0], want_deferred, "{name} {mode:?}");
        }
    }
}

#[test]
fn bad_maps_are_rejected_before_launch() {
    let Some(g) = gpu_or_skip("bad_maps_are_rejected_before_launch") else { return };
    let stream = g.ctx.default_stream();
    let x = DeviceBuffer::<Float3>::zeroed(&g.ctx, 10).unwrap();
    let out = DeviceBuffer::<Float3>::zeroed(&g.ctx, 2).unwrap();
    let err = kernels::pack_coords(&g.module, &stream, &x, &IndexMap::new(&g.ctx, &[1, 10]).unwrap(), &out, None).unwrap_err();
    assert!(err.to_string().contains("entry 10 is out of range"), "{err}");
    let err = kernels::pack_coords(&g.module, &stream, &x, &IndexMap::new(&g.ctx, &[1, 2, 3]).unwrap(), &out, None).unwrap_err();
    assert!(err.to_string().contains("3 needed"), "{err}");
}

/// The leapfrog update `v += f / m * dt; x += v * dt; f = 0` on the first `n` atoms, and `f = 0` on
/// the `clear_n` forces from `clear_from` on (the halo forces), as the kernel does it: the same
/// binary32 operations in the same order (the kernel's PTX uses `mul.rn`/`add.rn`, which ptxas
/// does not contract, and Rust on x86-64 does not contract either), so bit-exact.
#[allow(clippy::too_many_arguments)]
fn leapfrog_reference(x: &mut [Float3], v: &mut [Float3], f: &mut [Float3], inv_mass: &[f32], n: usize, dt: f32, clear_from: usize, clear_n: usize) {
    for i in 0..n {
        let a = inv_mass[i] * dt;
        let vn = Float3::new(v[i].x + f[i].x * a, v[i].y + f[i].y * a, v[i].z + f[i].z * a);
        v[i] = vn;
        x[i] = Float3::new(x[i].x + vn.x * dt, x[i].y + vn.y * dt, x[i].z + vn.z * dt);
        f[i] = Float3::new(0.0, 0.0, 0.0);
    }
    f[clear_from..clear_from + clear_n].fill(Float3::new(0.0, 0.0, 0.0));
}

#[test]
fn leapfrog_matches_its_cpu_reference_and_leaves_other_atoms_alone() {
    let Some(g) = gpu_or_skip("leapfrog_matches_its_cpu_reference_and_leaves_other_atoms_alone") else { return };
    let stream = g.ctx.default_stream();
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let dt = 0.002f32;
    // Sizes around a block (512 threads) and a large one; grids of 1 and 3 blocks make the
    // grid-stride loop run several rounds, `for_items` covers every item in one. Halo ranges to
    // clear: none, a few, more than the home atoms, and one that starts after a gap (as the MD
    // never does, but the kernel allows).
    for &n in &[0usize, 1, 511, 512, 513, 5000, 200_000] {
        for (gap, clear_n) in [(0usize, 0usize), (0, 37), (0, 2 * n + 3), (5, 600)] {
            let clear_from = n + gap;
            let total = clear_from + clear_n + 9; // atoms past the cleared range must not change
            let x0 = random_coords(&mut rng, total);
            let v0 = random_coords(&mut rng, total);
            // Poisoned forces everywhere: the cleared ones must come back as zero bits.
            let f: Vec<Float3> = random_coords(&mut rng, total).into_iter().map(|c| Float3::new(c.x * 100.0, c.y * 100.0, c.z * 100.0)).collect();
            let inv_mass: Vec<f32> = (0..total).map(|_| rng.random_range(0.01f32..1.0)).collect();
            let (mut want_x, mut want_v, mut want_f) = (x0.clone(), v0.clone(), f.clone());
            leapfrog_reference(&mut want_x, &mut want_v, &mut want_f, &inv_mass, n, dt, clear_from, clear_n);
            for grid in [Some(1u32), Some(3), None] {
                let (xd, vd) = (DeviceBuffer::from_host(&g.ctx, &x0).unwrap(), DeviceBuffer::from_host(&g.ctx, &v0).unwrap());
                let (fd, md) = (DeviceBuffer::from_host(&g.ctx, &f).unwrap(), DeviceBuffer::from_host(&g.ctx, &inv_mass).unwrap());
                let (mut xp, mut vp, mut fp, mut mp, mut nn, mut dtt) =
                    (xd.device_ptr(), vd.device_ptr(), fd.device_ptr(), md.device_ptr(), n as u32, dt);
                let (mut from, mut count) = (clear_from as u32, clear_n as u32);
                let mut args = halo::kernel_args![xp, vp, fp, mp, nn, dtt, from, count];
                let shape = match grid {
                    Some(blocks) => halo::gpu::LaunchShape { grid: (blocks, 1), block: halo::abi::BLOCK_SIZE, shared_bytes: 0 },
                    None => halo::gpu::LaunchShape::for_items(n + clear_n, halo::kernels::MAX_GATHER_BLOCKS),
                };
                // SAFETY: arguments match `leapfrog(x, v, f, inv_mass, n, dt, clear_from, clear_n)`;
                // every buffer holds `total` elements, past both ranges, which do not overlap; the
                // buffers outlive the synchronised launch.
                unsafe { g.module.launch(halo::abi::LEAPFROG, shape, &stream, &mut args) }.unwrap();
                stream.synchronize().unwrap();
                let case = format!("n = {n}, clear {clear_from}..{}, grid {grid:?}", clear_from + clear_n);
                assert_eq!(bits(&vd.to_host().unwrap()), bits(&want_v), "velocities, {case}");
                assert_eq!(bits(&xd.to_host().unwrap()), bits(&want_x), "coordinates, {case}");
                // The update clears the forces it used (the next step adds into zeros) and the
                // halo range, and no others.
                assert_eq!(bits(&fd.to_host().unwrap()), bits(&want_f), "forces cleared up to n and in the halo range, kept elsewhere, {case}");
            }
            if n > 0 {
                assert_ne!(bits(&want_x[..1]), bits(&x0[..1]), "the test must move atoms");
            }
            assert!(want_f[clear_from..clear_from + clear_n].iter().all(|c| c.x.to_bits() == 0 && c.y.to_bits() == 0 && c.z.to_bits() == 0));
            assert_eq!(bits(&want_f[clear_from + clear_n..]), bits(&f[clear_from + clear_n..]), "the reference keeps forces past the range");
        }
    }
}
