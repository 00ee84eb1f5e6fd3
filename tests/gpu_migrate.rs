//! The home atoms' migration on the GPU (`decomp::GpuMigrate`, the `migrate_*` kernels) against the
//! host (`decomp::migrate_reference`: `wrap_position` and `CellEdges::rank_of`, which the unit
//! tests tie to the redecomposition's own `Leaving::sort_out`), bit for bit: the stayers' wrapped
//! positions, velocities and ids in input order on the device, the leavers (id, wrapped position,
//! velocity, owner) in input order, and the counts. On 1x1x1, 2x1x1, 2x2x1, 2x2x2 and 3x1x1 grids,
//! every rank, 0 to 262,145 atoms (block and scan-run boundaries), atoms whole boxes outside the
//! box, exactly on every cell threshold and one float either side, at 0, -0.0, the box's last
//! float and its edge (`testing::migration_atoms`), after poisoning every output; one
//! `GpuMigrate` per rank reused from larger runs to smaller ones. Non-finite positions: the first
//! in input order named by its id and position, as the host names it. The MD step runs it inside
//! `decomp::GpuHome` (`tests/gpu_redecompose.rs`).

use halo::HaloError;
use halo::abi::{Float3, MigrateLeaver};
use halo::decomp::{Decomposition, GpuMigrate, MigrateArrays, PlanError, RankGrid, migrate_reference};
use halo::gpu::{CudaStream, DeviceBuffer, DeviceMemory};
use halo::testing::{GpuFixture as Gpu, gpu_or_skip as gpu, migration_atoms};

/// Extra poisoned elements after the `n` of every output: nothing may be written there.
const SLACK: usize = 37;

fn geometry(dims: [usize; 3]) -> Decomposition {
    Decomposition::new(RankGrid::new(dims).unwrap(), [7.3, 6.1, 5.7], 0.9).unwrap()
}

fn bits(v: &[Float3]) -> Vec<[u32; 3]> {
    v.iter().map(|p| [p.x.to_bits(), p.y.to_bits(), p.z.to_bits()]).collect()
}

fn leaver_bits(v: &[MigrateLeaver]) -> Vec<u32> {
    bytemuck::cast_slice(v).to_vec()
}

/// The device arrays of one run: inputs uploaded, outputs `n + SLACK` long, poisoned.
struct Arrays {
    x: DeviceBuffer<Float3>,
    v: DeviceBuffer<Float3>,
    ids: DeviceBuffer<u32>,
    x_out: DeviceBuffer<Float3>,
    v_out: DeviceBuffer<Float3>,
    ids_out: DeviceBuffer<u32>,
}

impl Arrays {
    fn new(g: &Gpu, x: &[Float3], v: &[Float3], ids: &[u32]) -> Self {
        let n = x.len();
        let a = Self {
            x: DeviceBuffer::from_host(&g.ctx, x).unwrap(),
            v: DeviceBuffer::from_host(&g.ctx, v).unwrap(),
            ids: DeviceBuffer::from_host(&g.ctx, ids).unwrap(),
            x_out: DeviceBuffer::uninit(&g.ctx, n + SLACK).unwrap(),
            v_out: DeviceBuffer::uninit(&g.ctx, n + SLACK).unwrap(),
            ids_out: DeviceBuffer::uninit(&g.ctx, n + SLACK).unwrap(),
        };
        for b in [&a.x_out as &dyn DeviceMemory<Float3>, &a.v_out] {
            b.fill_bytes(0xFF).unwrap();
        }
        a.ids_out.fill_bytes(0xFF).unwrap();
        // Pageable uploads may land after a kernel on another stream starts: wait for them.
        g.ctx.synchronize().unwrap();
        a
    }

    fn view(&self) -> MigrateArrays<'_> {
        MigrateArrays { x: &self.x, v: &self.v, ids: &self.ids, x_out: &self.x_out, v_out: &self.v_out, ids_out: &self.ids_out }
    }
}

/// Runs the migration of `x, v, ids` on `rank` and checks it against the host, bit for bit.
#[allow(clippy::too_many_arguments)]
fn check(test: &str, g: &Gpu, stream: &CudaStream, mig: &mut GpuMigrate, geo: &Decomposition, rank: usize, x: &[Float3], v: &[Float3], ids: &[u32]) {
    let n = x.len();
    let want = migrate_reference(x, v, ids, geo, rank).unwrap();
    let d = Arrays::new(g, x, v, ids);
    let got = mig.run(&g.module, stream, &d.view(), n).unwrap_or_else(|e| panic!("{test}: {e}"));
    assert_eq!((got.stayers, got.leavers.len()), (want.ids.len(), want.leavers.len()), "{test}: stayers and leavers");
    assert_eq!(got.stayers + got.leavers.len(), n, "{test}: every atom stays or leaves");
    if let Some(k) = (0..got.leavers.len()).find(|&k| leaver_bits(&got.leavers[k..=k]) != leaver_bits(&want.leavers[k..=k])) {
        panic!("{test}: leaver {k} is {:?} on the GPU, {:?} on the host", got.leavers[k], want.leavers[k]);
    }
    let s = got.stayers;
    let (xo, vo, io) = (d.x_out.to_host().unwrap(), d.v_out.to_host().unwrap(), d.ids_out.to_host().unwrap());
    assert_eq!(io[..s], want.ids[..], "{test}: the stayers' ids (input order)");
    if let Some(k) = (0..s).find(|&k| bits(&xo[k..=k]) != bits(&want.positions[k..=k])) {
        panic!("{test}: stayer {k} (id {}) wrapped to {:?} on the GPU, {:?} on the host", io[k], xo[k], want.positions[k]);
    }
    assert_eq!(bits(&vo[..s]), bits(&want.velocities), "{test}: the stayers' velocities");
    // Nothing written past the stayers; the inputs untouched.
    assert!(bits(&xo[s..]).iter().chain(&bits(&vo[s..])).all(|b| *b == [u32::MAX; 3]), "{test}: written past the stayers");
    assert!(io[s..].iter().all(|&i| i == u32::MAX), "{test}: ids written past the stayers");
    assert_eq!(bits(&d.x.to_host().unwrap()), bits(x), "{test}: the input positions changed");
    // The stayers are the input filtered, in its order.
    let leaving: std::collections::HashSet<u32> = got.leavers.iter().map(|l| l.id).collect();
    let kept: Vec<u32> = ids.iter().copied().filter(|i| !leaving.contains(i)).collect();
    assert_eq!(io[..s], kept[..], "{test}: the stayers are the input's other atoms in its order");
    assert!(got.leavers.iter().all(|l| l.owner as usize != rank && (l.owner as usize) < geo.grid.num_ranks()), "{test}: owners");
}

#[test]
fn gpu_migration_equals_the_host_on_every_rank() {
    let Some(g) = gpu("gpu_migration_equals_the_host_on_every_rank") else { return };
    let stream = g.ctx.new_stream().unwrap();
    for dims in [[1, 1, 1], [2, 1, 1], [2, 2, 1], [2, 2, 2], [3, 1, 1]] {
        let geo = geometry(dims);
        for rank in 0..geo.grid.num_ranks() {
            let mut mig = GpuMigrate::new(&g.ctx, &geo, rank).unwrap();
            // Larger runs first, so later ones reuse grown buffers holding stale counts and leavers.
            for (n, seed) in [(45_000, 1), (6000, 2), (513, 3), (512, 4), (511, 5), (257, 6), (256, 7), (255, 8), (33, 9), (32, 10), (1, 11), (0, 12)]
            {
                let (x, v, ids) = migration_atoms(&geo, n, seed + 100 * rank as u64);
                check(&format!("{dims:?} rank {rank}, {n} atoms"), &g, &stream, &mut mig, &geo, rank, &x, &v, &ids);
            }
        }
        eprintln!("{dims:?}: every rank equals the host");
    }
}

#[test]
fn gpu_migration_scans_more_blocks_than_the_scan_has_threads() {
    let Some(g) = gpu("gpu_migration_scans_more_blocks_than_the_scan_has_threads") else { return };
    let stream = g.ctx.new_stream().unwrap();
    // 1,025 blocks and more: the scan's threads take runs of two blocks and more.
    for (dims, n) in [([2, 2, 1], 262_145), ([3, 1, 1], 600_000)] {
        let geo = geometry(dims);
        for rank in [0, geo.grid.num_ranks() - 1] {
            let mut mig = GpuMigrate::new(&g.ctx, &geo, rank).unwrap();
            let (x, v, ids) = migration_atoms(&geo, n, 7 + rank as u64);
            let t = std::time::Instant::now();
            check(&format!("{dims:?} rank {rank}, {n} atoms"), &g, &stream, &mut mig, &geo, rank, &x, &v, &ids);
            eprintln!("{dims:?} rank {rank}, {n} atoms: checked in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
        }
    }
}

#[test]
fn a_non_finite_atom_is_named_like_the_host_names_it() {
    let Some(g) = gpu("a_non_finite_atom_is_named_like_the_host_names_it") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let geo = geometry([2, 2, 1]);
    let mut mig = GpuMigrate::new(&g.ctx, &geo, 1).unwrap();
    for (n, bad) in [
        (1, vec![(0, 0, f32::NAN)]),
        (5000, vec![(4321, 2, f32::INFINITY), (1234, 1, f32::NAN), (3000, 0, f32::NEG_INFINITY)]),
        (600, vec![(599, 0, f32::NAN)]),
    ] {
        let (mut x, v, ids) = migration_atoms(&geo, n, 21);
        for &(i, d, val) in &bad {
            match d {
                0 => x[i].x = val,
                1 => x[i].y = val,
                _ => x[i].z = val,
            }
        }
        let first = bad.iter().map(|b| b.0).min().unwrap();
        let want = migrate_reference(&x, &v, &ids, &geo, 1).unwrap_err();
        let d = Arrays::new(&g, &x, &v, &ids);
        let got = mig.run(&g.module, &stream, &d.view(), n).unwrap_err();
        let p = x[first];
        match (&got, &want) {
            (HaloError::Plan(PlanError::NonFinitePosition { atom, position }), PlanError::NonFinitePosition { atom: a, position: q }) => {
                assert_eq!((*atom, *a), (ids[first] as usize, ids[first] as usize), "{n} atoms: the first bad atom, by id");
                assert_eq!(position.map(f32::to_bits), q.map(f32::to_bits));
                assert_eq!(position.map(f32::to_bits), [p.x, p.y, p.z].map(f32::to_bits));
            }
            other => panic!("{n} atoms: {other:?}"),
        }
        // The same object migrates again once the positions are finite.
        let (x, v, ids) = migration_atoms(&geo, n, 22);
        check(&format!("after a bad run, {n} atoms"), &g, &stream, &mut mig, &geo, 1, &x, &v, &ids);
    }
}

#[test]
fn short_or_overlapping_arrays_are_refused_before_anything_runs() {
    let Some(g) = gpu("short_or_overlapping_arrays_are_refused_before_anything_runs") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let geo = geometry([2, 1, 1]);
    let mut mig = GpuMigrate::new(&g.ctx, &geo, 0).unwrap();
    let (x, v, ids) = migration_atoms(&geo, 100, 3);
    let d = Arrays::new(&g, &x, &v, &ids);
    let e = mig.run(&g.module, &stream, &d.view(), 101).unwrap_err().to_string();
    assert!(e.contains("GPU migration of 101 atoms: `x` holds 100"), "{e}");
    let short = DeviceBuffer::<u32>::uninit(&g.ctx, 50).unwrap();
    let e = mig.run(&g.module, &stream, &MigrateArrays { ids_out: &short, ..d.view() }, 100).unwrap_err().to_string();
    assert!(e.contains("`ids_out` holds 50"), "{e}");
    let e = mig.run(&g.module, &stream, &MigrateArrays { x_out: &d.x, ..d.view() }, 100).unwrap_err().to_string();
    assert!(e.contains("`x_out` overlaps `x`"), "{e}");
    assert!(GpuMigrate::new(&g.ctx, &geo, 2).is_err(), "rank 2 of a 2x1x1 grid");
    // Nothing ran: the outputs are still poisoned, and the object migrates as before.
    assert!(d.ids_out.to_host().unwrap().iter().all(|&i| i == u32::MAX));
    check("after refusals", &g, &stream, &mut mig, &geo, 0, &x, &v, &ids);
}
