//! The cluster grid built on the GPU (`DeviceGrid::build`, the `nbnxm_grid_*` kernels) against the
//! host's `ClusterGrid::build(&LocalAtoms::single_rank(..))`: equal slot for slot and box for box,
//! after poisoning every device buffer, for 0 to 180,000 atoms numbered in no spatial order, some
//! outside the box (negative, at and beyond the edge, far away: the GPU wraps them in place, bit
//! for bit as `decomp::wrap_position`), atoms exactly at 0 and just below the edge, a dense blob
//! that puts most atoms in one column, and non-finite coordinates (a clear error naming the first
//! bad atom, never a hang). Then the whole single-rank search step on the GPU
//! (`NbnxmGpu::update_resident`): lists equal to the host's `PairSearch::build` entry for entry and
//! word for word, also where the search was begun ahead behind the copy of its coordinates
//! (`NbnxmGpu::begin_resident`), for the same atoms or for others (then abandoned). `resident_search_times` prints the GPU grid and list times beside the host's
//! search: a benchmark (`#[ignore]`d, run by `gpu-suite.sh kernel-times` with `--ignored`). The forces on the resident lists are checked in
//! `tests/gpu_nbnxm.rs` (`resident_search_forces`).
//!
//! Any rank's grid (`DeviceGrid::build_local`, home atoms and halo zones) against
//! `ClusterGrid::build(&LocalAtoms::from_plan(..))` on every rank of 1x1x1 to 2x2x2 and 4x2x2 plans
//! (0 to 45,000 local atoms, ranks and zones without atoms, after poisoning), with the zone table
//! and column starts the search reads; then `NbnxmGpu::update_local`: lists equal to the host's
//! `PairSearch::build` entry for entry and word for word, on every rank; and `update_local_into`,
//! which also copies the home atoms' coordinates and types on the device for the MD step (and can
//! take the home coordinates from the device, as after a redecomposition on the GPU).

use halo::abi::Float3;
use halo::decomp::{HaloPlan, RankGrid, wrap_position};
use halo::gpu::{DeviceBuffer, DeviceMemory, Staging};
use halo::system::MolecularSystem;
use halo::testing::{GpuFixture as Gpu, gpu_or_skip as gpu};
use halo_md::nbnxm::{
    ClusterGrid, DEFAULT_DRIFT_TOLERANCE, DeviceGrid, ListKind, ListSetup, LocalAtoms, NbnxmGpu, PairSearch, SearchOptions, lj_table,
};
use rand::{Rng, SeedableRng};

const NTYPES: usize = 3;

/// Types of `n` atoms, all three used.
fn types(n: usize) -> Vec<u32> {
    (0..n).map(|i| (i * 7 % NTYPES) as u32).collect()
}

/// `n` atoms of a generated liquid (`seed`), shuffled, every 5th moved outside the box by a whole
/// number of box edges and a bit, a few put exactly at 0, at the edge, just below it, or far away.
fn scrambled(n: usize, seed: u64) -> (Vec<Float3>, [f32; 3]) {
    let s = MolecularSystem::generate(n.max(1), seed).unwrap();
    let b = s.box_size;
    let mut x = s.positions[..n].to_vec();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    for i in (1..x.len()).rev() {
        x.swap(i, rng.random_range(0..=i));
    }
    for (i, p) in x.iter_mut().enumerate() {
        match i % 5 {
            0 => p.x += b[0] * rng.random_range(-3..4) as f32 + 0.25,
            1 if i % 3 == 0 => p.y -= b[1] * 2.0,
            _ => {}
        }
    }
    let special = [
        Float3::new(0.0, 0.0, 0.0),
        Float3::new(b[0].next_down(), b[1].next_down(), b[2].next_down()),
        Float3::new(b[0], b[1], b[2]),
        Float3::new(-b[0], 2.0 * b[1], -0.0),
        Float3::new(-1e-7, b[1] + 1e-6, 0.5),
        Float3::new(1e6, -3e5, 7.5 * b[2]),
        Float3::new(-1e-30, 0.25, b[2].next_up()),
    ];
    for (k, p) in special.into_iter().enumerate() {
        if k * 13 < x.len() {
            x[k * 13] = p;
        }
    }
    (x, b)
}

/// Builds the grid of `x` on the GPU twice (the first build sizes the buffers, which are then
/// poisoned) and checks it, and the wrapped coordinates, against the host.
fn check_grid(test: &str, g: &Gpu, x: &[Float3], box_size: [f32; 3]) {
    let n = x.len();
    let ty = types(n);
    let host = ClusterGrid::build(&LocalAtoms::single_rank(x, &ty, NTYPES, box_size).unwrap()).unwrap();
    let td = DeviceBuffer::from_host(&g.ctx, &ty).unwrap();
    // Pageable uploads may land after a kernel on another stream starts: wait for them.
    g.ctx.synchronize().unwrap();
    let stream = g.ctx.new_stream().unwrap();
    let mut grid = DeviceGrid::new(&g.module).unwrap();
    let xd = DeviceBuffer::from_host(&g.ctx, x).unwrap();
    // Pageable uploads may land after a kernel on another stream starts: wait for them.
    g.ctx.synchronize().unwrap();
    grid.build(&g.module, &xd, &td, n, box_size, true, &stream).unwrap_or_else(|e| panic!("{test}: {e}"));
    grid.poison().unwrap();
    xd.copy_from_host(x).unwrap();
    // Pageable uploads may land after a kernel on another stream starts: wait for them.
    g.ctx.synchronize().unwrap();
    let t = std::time::Instant::now();
    let info = grid.build(&g.module, &xd, &td, n, box_size, true, &stream).unwrap_or_else(|e| panic!("{test}: {e}"));
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let wrapped = xd.to_host().unwrap();
    for (i, (p, q)) in x.iter().zip(&wrapped).enumerate() {
        let w = wrap_position(*p, box_size);
        let same = w.x.to_bits() == q.x.to_bits() && w.y.to_bits() == q.y.to_bits() && w.z.to_bits() == q.z.to_bits();
        assert!(same, "{test}: atom {i} at {p:?} wrapped to {q:?} on the GPU, {w:?} on the host");
    }
    assert_eq!(info.superclusters, host.superclusters(), "{test}: superclusters");
    assert_eq!(info.clusters, host.clusters(), "{test}");
    assert_eq!(info.max_type as usize, ty.iter().max().map_or(0, |&t| t as usize), "{test}: largest type");
    let got = grid.to_host(NTYPES).unwrap();
    if got != host {
        // Name the first difference before the (long) full comparison.
        if let Some(s) = (0..host.atom_index.len()).find(|&s| got.atom_index[s] != host.atom_index[s]) {
            panic!("{test}: slot {s} holds atom {} on the GPU, {} on the host", got.atom_index[s], host.atom_index[s]);
        }
        if let Some(c) = (0..host.clusters()).find(|&c| got.cluster_bbox[c] != host.cluster_bbox[c]) {
            panic!("{test}: cluster {c} box {:?} on the GPU, {:?} on the host", got.cluster_bbox[c], host.cluster_bbox[c]);
        }
        assert_eq!(got, host, "{test}");
    }
    // The zone the search reads, as the upload of the host grid would describe it.
    if let Some(z) = host.zones.first() {
        let zone = grid.zone().unwrap();
        assert_eq!(zone.extent.lo, z.extent.lo, "{test}");
        assert_eq!(zone.extent.hi, z.extent.hi, "{test}");
        assert_eq!((zone.cell, zone.columns), (z.cell, [z.columns[0] as u32, z.columns[1] as u32]), "{test}");
        assert_eq!((zone.column_base, zone.sc_end, zone.zone), (0, host.superclusters() as u32, 0), "{test}");
    }
    eprintln!("{test}: {n} atoms, {} superclusters, {:?} columns: GPU grid {ms:.3} ms", info.superclusters, info.columns);
}

#[test]
fn gpu_grid_equals_the_host_grid() {
    let Some(g) = gpu("gpu_grid_equals_host") else { return };
    for (n, seed) in [(0, 1), (1, 2), (63, 3), (64, 4), (65, 5), (1000, 6), (6000, 7), (45_000, 8), (180_000, 9)] {
        let (x, b) = scrambled(n, seed);
        check_grid(&format!("grid {n} atoms"), &g, &x, b);
    }
    // One atom per box corner and edge midpoint, many equal coordinates.
    let b = [3.0f32, 2.5, 4.0];
    let lattice: Vec<Float3> = (0..729)
        .map(|i| {
            let e = |d: usize, k: usize| [0.0, b[d].next_down(), 0.5 * b[d], b[d], -b[d]][k % 5];
            Float3::new(e(0, i), e(1, i / 5), e(2, i / 25))
        })
        .collect();
    check_grid("grid lattice", &g, &lattice, b);
}

#[test]
fn a_dense_blob_fills_one_huge_column() {
    let Some(g) = gpu("gpu_grid_blob") else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let b = [6.0f32, 6.0, 6.0];
    // 20,000 atoms in a thin rod along z (one column) and 2,000 spread over the box.
    let mut x: Vec<Float3> =
        (0..20_000).map(|_| Float3::new(rng.random_range(2.0..2.02), rng.random_range(3.0..3.02), rng.random_range(0.0..b[2]))).collect();
    x.extend((0..2_000).map(|_| Float3::new(rng.random::<f32>() * b[0], rng.random::<f32>() * b[1], rng.random::<f32>() * b[2])));
    for i in (1..x.len()).rev() {
        x.swap(i, rng.random_range(0..=i));
    }
    check_grid("grid blob", &g, &x, b);
}

#[test]
fn non_finite_coordinates_are_named() {
    let Some(g) = gpu("gpu_grid_non_finite") else { return };
    let (mut x, b) = scrambled(5000, 21);
    x[4321].z = f32::INFINITY;
    x[1234].y = f32::NAN;
    x[3000].x = f32::NEG_INFINITY;
    let td = DeviceBuffer::from_host(&g.ctx, &types(x.len())).unwrap();
    // Pageable uploads may land after a kernel on another stream starts: wait for them.
    g.ctx.synchronize().unwrap();
    let xd = DeviceBuffer::from_host(&g.ctx, &x).unwrap();
    // Pageable uploads may land after a kernel on another stream starts: wait for them.
    g.ctx.synchronize().unwrap();
    let stream = g.ctx.new_stream().unwrap();
    let mut grid = DeviceGrid::new(&g.module).unwrap();
    let e = grid.build(&g.module, &xd, &td, x.len(), b, true, &stream).unwrap_err().to_string();
    assert!(e.contains("atom 1234 has a non-finite coordinate NaN along y"), "{e}");
    assert!(grid.to_host(NTYPES).is_err(), "a failed build leaves no grid");
    // The lists of a failed resident search are empty, and the same object searches again.
    let s = ListSetup::new(1.0, 100, 1.1, 10, 1.05).unwrap();
    let sys = MolecularSystem::generate(10, 1).unwrap();
    let mut lj = lj_table(&sys);
    lj.resize(NTYPES * NTYPES, [0.0; 2]);
    let mut nb = NbnxmGpu::new_resident(g.module.clone(), &lj, &s, b).unwrap();
    let e = nb.update_resident(&xd, &td, x.len(), b, &stream).unwrap_err().to_string();
    assert!(e.contains("atom 1234"), "{e}");
    assert_eq!((nb.entries(ListKind::Local), nb.atoms()), (0, 0));
    // The search ran its first passes on the grid before its one read-back found the bad atom: no
    // grid is recorded, no list written.
    assert!(nb.read_grid().is_err(), "a failed resident search leaves no grid");
    assert!(nb.read_entries(ListKind::Local).unwrap().is_empty());
    x[1234].y = 1.0;
    x[3000].x = 1.0;
    x[4321].z = 1.0;
    xd.copy_from_host(&x).unwrap();
    // Pageable uploads may land after a kernel on another stream starts: wait for them.
    g.ctx.synchronize().unwrap();
    nb.update_resident(&xd, &td, x.len(), b, &stream).unwrap();
    assert!(nb.entries(ListKind::Local) > 0);
    // Types beyond the LJ table, and arrays shorter than the atoms, are refused.
    let bad = DeviceBuffer::from_host(&g.ctx, &vec![NTYPES as u32; x.len()]).unwrap();
    // Pageable uploads may land after a kernel on another stream starts: wait for them.
    g.ctx.synchronize().unwrap();
    let e = nb.update_resident(&xd, &bad, x.len(), b, &stream).unwrap_err().to_string();
    assert!(e.contains("atom types up to 3"), "{e}");
    assert!(nb.update_resident(&xd, &td, x.len() + 1, b, &stream).is_err());
}

/// Whether a resident search is begun before `update_resident` (`NbnxmGpu::begin_resident`),
/// behind the copy of its coordinates and without a wait, as the MD step begins it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ahead {
    /// Not begun: `update_resident` runs all of it.
    No,
    /// Begun for the very same atoms: `update_resident` finishes it.
    Same,
    /// Begun for the first half of the atoms: `update_resident` abandons it and runs its own.
    Other,
}

/// `update_resident` against the host search of the wrapped atoms: the wrapped coordinates, the
/// grid and both lists.
fn check_resident(test: &str, g: &Gpu, nb: &mut NbnxmGpu, sys: &MolecularSystem, x: &[Float3], setup: &ListSetup, ahead: Ahead) {
    let n = x.len();
    let ty: Vec<u32> = sys.types[..n].iter().map(|&t| u32::from(t)).collect();
    let atoms = LocalAtoms::single_rank(x, &ty, sys.atom_types.len(), sys.box_size).unwrap();
    let search = PairSearch::build(&atoms, &SearchOptions::new(setup.rlist)).unwrap();
    let stream = g.ctx.new_stream().unwrap();
    let (xd, td) = if ahead == Ahead::No {
        let d = (DeviceBuffer::from_host(&g.ctx, x).unwrap(), DeviceBuffer::from_host(&g.ctx, &ty).unwrap());
        // Pageable uploads may land after a kernel on another stream starts: wait for them.
        g.ctx.synchronize().unwrap();
        d
    } else {
        // The coordinates still in flight on the stream when the search is begun behind them.
        let (xd, td) = (DeviceBuffer::<Float3>::uninit(&g.ctx, n).unwrap(), DeviceBuffer::from_host(&g.ctx, &ty).unwrap());
        g.ctx.synchronize().unwrap();
        Staging::new().upload(x, &xd, &stream).unwrap();
        let begun_atoms = if ahead == Ahead::Same { n } else { n / 2 };
        nb.begin_resident(&xd, &td, begun_atoms, sys.box_size, &stream).unwrap_or_else(|e| panic!("{test}: begun ahead: {e}"));
        assert!(nb.begun(), "{test}: a search is begun");
        (xd, td)
    };
    let r = nb.update_resident(&xd, &td, n, sys.box_size, &stream).unwrap_or_else(|e| panic!("{test}: {e}"));
    assert!(!nb.begun(), "{test}: no search is left begun");
    let wrapped = xd.to_host().unwrap();
    assert!(
        wrapped.iter().zip(&atoms.positions).all(|(p, q)| [p.x, p.y, p.z].map(f32::to_bits) == [q.x, q.y, q.z].map(f32::to_bits)),
        "{test}: wrap"
    );
    assert_eq!(nb.read_grid().unwrap(), search.grid, "{test}: grid");
    assert_eq!(nb.atoms(), n);
    // The search step's grid facts (checked after its one read-back) are those of a synchronous
    // build of the same (now wrapped) coordinates.
    let mut alone = DeviceGrid::new(&g.module).unwrap();
    let built = alone.build(&g.module, &xd, &td, n, sys.box_size, true, &stream).unwrap_or_else(|e| panic!("{test}: {e}"));
    assert_eq!(r.grid, built, "{test}: grid info");
    for (kind, list) in [(ListKind::Local, &search.local), (ListKind::NonLocal, &search.nonlocal)] {
        let (entries, words) = (nb.read_entries(kind).unwrap(), nb.read_j_list(kind, false).unwrap());
        assert_eq!(words.len(), list.j_list.len(), "{test} {kind:?}: words");
        if let Some(w) = (0..words.len()).find(|&w| words[w] != list.j_list[w]) {
            panic!("{test} {kind:?}: word {w} is {:#x}, the host's {:#x}", words[w], list.j_list[w]);
        }
        assert_eq!(entries, list.entries, "{test} {kind:?}: entries");
        assert_eq!(nb.read_order(kind).unwrap(), halo_md::nbnxm::entry_order(&list.entries), "{test} {kind:?}: launch order");
    }
    assert!(search.nonlocal.is_empty() && r.words[1] == 0 && r.entries[1] == 0, "{test}: one rank has no halo");
    assert_eq!((r.words[0], r.entries[0]), (search.local.j_list.len(), search.local.entries.len()));
    eprintln!(
        "{test}: {n} atoms, {} words; GPU grid {:.3} ms + lists {:.3} ms; host grid {:.3} ms + lists {:.3} ms",
        r.words[0],
        r.grid_time.as_secs_f64() * 1e3,
        r.lists_time.as_secs_f64() * 1e3,
        search.timing.grid.as_secs_f64() * 1e3,
        search.timing.lists.as_secs_f64() * 1e3
    );
}

#[test]
fn resident_search_equals_the_host_search() {
    let Some(g) = gpu("gpu_resident_search") else { return };
    // One object through systems of growing and shrinking size (buffers reused and grown), at the
    // MD step's list cutoffs for nstlist 100 and 50.
    for (n, seed, nstlist) in [(6000, 31, 100), (45_000, 32, 100), (1000, 33, 50), (45_000, 34, 50), (65, 35, 100), (0, 36, 100)] {
        let sys = MolecularSystem::generate(n.max(1), seed).unwrap();
        // Small boxes cannot take the MD cutoff (the list cutoff must stay below half the box).
        let s = ListSetup::for_system(&sys, 1.0, 0.002, nstlist, 10, DEFAULT_DRIFT_TOLERANCE)
            .unwrap_or_else(|_| ListSetup::new(0.3, nstlist, 0.4, 10, 0.35).unwrap());
        let (x, _) = scrambled(n, seed);
        let mut nb = NbnxmGpu::new_resident(g.module.clone(), &lj_table(&sys), &s, sys.box_size).unwrap();
        check_resident(&format!("resident {n} atoms nstlist {nstlist}"), &g, &mut nb, &sys, &x, &s, Ahead::No);
        // The same object again, on other atoms of the same system (moved by a fraction of a box),
        // begun ahead of the search for them, then for only some of them.
        let moved: Vec<Float3> = x.iter().map(|p| Float3::new(p.x + 0.3, p.y - 0.7, p.z + 1.9)).collect();
        check_resident(&format!("resident {n} atoms moved, begun ahead"), &g, &mut nb, &sys, &moved, &s, Ahead::Same);
        let again: Vec<Float3> = x.iter().map(|p| Float3::new(p.x - 1.1, p.y + 0.2, p.z + 0.6)).collect();
        check_resident(&format!("resident {n} atoms moved, begun for half"), &g, &mut nb, &sys, &again, &s, Ahead::Other);
    }
}

#[test]
#[ignore = "benchmark: prints GPU times and checks no result; the gpu-suite `kernel-times` suite runs it (--ignored)"]
fn resident_search_times() {
    let Some(g) = gpu("gpu_resident_times") else { return };
    for n in [6000, 45_000, 180_000] {
        let sys = MolecularSystem::generate(n, 41).unwrap();
        let s = ListSetup::for_system(&sys, 1.0, 0.002, 100, 10, DEFAULT_DRIFT_TOLERANCE).unwrap();
        let ty: Vec<u32> = sys.types.iter().map(|&t| u32::from(t)).collect();
        let (xd, td) = (DeviceBuffer::from_host(&g.ctx, &sys.positions).unwrap(), DeviceBuffer::from_host(&g.ctx, &ty).unwrap());
        // Pageable uploads may land after a kernel on another stream starts: wait for them.
        g.ctx.synchronize().unwrap();
        let stream = g.ctx.new_stream().unwrap();
        let mut nb = NbnxmGpu::new_resident(g.module.clone(), &lj_table(&sys), &s, sys.box_size).unwrap();
        let mut grid = Vec::new();
        let mut lists = Vec::new();
        for rep in 0..12 {
            let r = nb.update_resident(&xd, &td, n, sys.box_size, &stream).unwrap();
            if rep >= 2 {
                grid.push(r.grid_time.as_secs_f64() * 1e3);
                lists.push(r.lists_time.as_secs_f64() * 1e3);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let atoms = LocalAtoms::single_rank(&sys.positions, &ty, sys.atom_types.len(), sys.box_size).unwrap();
        let host = PairSearch::build(&atoms, &SearchOptions::new(s.rlist)).unwrap();
        eprintln!(
            "resident search {n} atoms (rlist {:.3}): GPU grid {:.3} ms + lists {:.3} ms (median of 10); host grid {:.3} ms + lists {:.3} ms",
            s.rlist,
            median(&mut grid),
            median(&mut lists),
            host.timing.grid.as_secs_f64() * 1e3,
            host.timing.lists.as_secs_f64() * 1e3
        );
    }
}

/// Every rank's local atoms of `sys` on a `dims` rank grid at cutoff `rc`.
fn ranks_of(sys: &MolecularSystem, dims: [usize; 3], rc: f32) -> Vec<LocalAtoms> {
    let plan = HaloPlan::build(sys, RankGrid::new(dims).unwrap(), rc).unwrap();
    (0..plan.ranks.len()).map(|r| LocalAtoms::from_plan(&plan, r, &sys.positions, &sys.types).unwrap()).collect()
}

/// Builds the grid of `atoms` on the GPU with `grid` twice (the first build sizes the buffers,
/// which are then poisoned) and checks it against the host's: slots, boxes, zones, and the zone
/// table and column starts the search reads.
fn check_local_grid(test: &str, g: &Gpu, grid: &mut DeviceGrid, atoms: &LocalAtoms) {
    check_local_grid_from(test, g, grid, atoms, None);
}

/// [`check_local_grid`] whose second build takes the home atoms from `from` on the device
/// (`DeviceGrid::build_local_from`) where it is given.
fn check_local_grid_from(test: &str, g: &Gpu, grid: &mut DeviceGrid, atoms: &LocalAtoms, from: Option<halo_md::nbnxm::HomeOnDevice<'_>>) {
    let host = ClusterGrid::build(atoms).unwrap();
    let stream = g.ctx.new_stream().unwrap();
    grid.build_local(&g.module, atoms, &stream).unwrap_or_else(|e| panic!("{test}: {e}"));
    grid.poison().unwrap();
    let t = std::time::Instant::now();
    let built = match from {
        Some(on) => grid.build_local_from(&g.module, atoms, on, &stream),
        None => grid.build_local(&g.module, atoms, &stream),
    };
    let info = built.unwrap_or_else(|e| panic!("{test}: {e}"));
    let ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(
        (info.atoms, info.home_atoms, info.superclusters, info.clusters),
        (atoms.len(), atoms.home, host.superclusters(), host.clusters()),
        "{test}"
    );
    assert_eq!((info.zones, info.periodic, info.box_size), (host.zones.len(), atoms.periodic, atoms.box_size), "{test}");
    assert_eq!(info.max_type as usize, atoms.types.iter().max().map_or(0, |&t| t as usize), "{test}: largest type");
    // The copied coordinates, which the slots index.
    let x = grid.local_coordinates().to_host().unwrap();
    assert!(
        atoms.positions.iter().zip(&x).all(|(p, q)| [p.x, p.y, p.z].map(f32::to_bits) == [q.x, q.y, q.z].map(f32::to_bits)),
        "{test}: coordinates"
    );
    let got = grid.to_host(atoms.ntypes).unwrap();
    if got != host {
        // Name the first difference before the (long) full comparison.
        assert_eq!(got.zones, host.zones, "{test}: zones");
        if let Some(s) = (0..host.atom_index.len()).find(|&s| got.atom_index[s] != host.atom_index[s]) {
            panic!("{test}: slot {s} holds atom {} on the GPU, {} on the host", got.atom_index[s], host.atom_index[s]);
        }
        if let Some(c) = (0..host.clusters()).find(|&c| got.cluster_bbox[c] != host.cluster_bbox[c]) {
            panic!("{test}: cluster {c} box {:?} on the GPU, {:?} on the host", got.cluster_bbox[c], host.cluster_bbox[c]);
        }
        assert_eq!(got, host, "{test}");
    }
    assert_eq!(grid.read_search_tables().unwrap(), DeviceGrid::search_tables(&host), "{test}: the search's zone table and column starts");
    eprintln!(
        "{test}: {} atoms ({} home), {} zones, {} superclusters: GPU grid {ms:.3} ms (copies, passes, one sync)",
        atoms.len(),
        atoms.home,
        info.zones,
        info.superclusters
    );
}

#[test]
fn gpu_local_grid_equals_the_host_grid() {
    let Some(g) = gpu("gpu_local_grid_equals_host") else { return };
    // One grid object through ranks of growing and shrinking size (buffers reused and grown).
    let mut grid = DeviceGrid::new(&g.module).unwrap();
    for (n, seed, dims) in [
        (6000, 51, [1, 1, 1]),
        (6000, 52, [2, 1, 1]),
        (45_000, 53, [2, 1, 1]),
        (6000, 54, [2, 2, 1]),
        (45_000, 55, [2, 2, 2]),
        (1500, 56, [2, 2, 2]),
        (45_000, 57, [1, 1, 1]),
        (1500, 5, [4, 2, 2]),
    ] {
        let sys = MolecularSystem::generate(n, seed).unwrap();
        let rc = if dims == [4, 2, 2] { 0.9 } else { 1.1 };
        for (r, atoms) in ranks_of(&sys, dims, rc).iter().enumerate() {
            check_local_grid(&format!("local grid {n} atoms {dims:?} rank {r}"), &g, &mut grid, atoms);
        }
    }
    // Atoms only in a slab x in [1.5, 2): ranks without any atom, ranks with zones missing.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(58);
    let b = [6.0f32, 5.0, 4.0];
    let x: Vec<Float3> = (0..2500).map(|_| Float3::new(rng.random_range(1.5..2.0), rng.random::<f32>() * b[1], rng.random::<f32>() * b[2])).collect();
    let ty: Vec<u8> = (0..x.len()).map(|i| (i % 2) as u8).collect();
    let mut empty = 0;
    for dims in [[2, 1, 1], [2, 2, 2]] {
        let plan = HaloPlan::from_positions(&x, b, RankGrid::new(dims).unwrap(), 0.9).unwrap();
        for r in 0..plan.ranks.len() {
            let atoms = LocalAtoms::from_plan(&plan, r, &x, &ty).unwrap();
            empty += usize::from(atoms.is_empty());
            check_local_grid(&format!("local grid slab {dims:?} rank {r}"), &g, &mut grid, &atoms);
        }
    }
    assert!(empty > 0, "some rank has no atom");
    // The undecomposed rank built from device coordinates (`build`) through the same object.
    let (x, b) = scrambled(6000, 59);
    let ty = types(x.len());
    let host = ClusterGrid::build(&LocalAtoms::single_rank(&x, &ty, NTYPES, b).unwrap()).unwrap();
    let (xd, td) = (DeviceBuffer::from_host(&g.ctx, &x).unwrap(), DeviceBuffer::from_host(&g.ctx, &ty).unwrap());
    // Pageable uploads may land after a kernel on another stream starts: wait for them.
    g.ctx.synchronize().unwrap();
    grid.poison().unwrap();
    grid.build(&g.module, &xd, &td, x.len(), b, true, &g.ctx.new_stream().unwrap()).unwrap();
    assert_eq!(grid.to_host(NTYPES).unwrap(), host, "build after build_local");
    // Invalid atoms are refused before any copy, and leave no grid.
    let mut bad = ranks_of(&MolecularSystem::generate(3000, 60).unwrap(), [2, 1, 1], 1.1).remove(0);
    bad.zones[0] = 1;
    let e = grid.build_local(&g.module, &bad, &g.ctx.new_stream().unwrap()).unwrap_err().to_string();
    assert!(e.contains("zone"), "{e}");
    assert!(grid.to_host(NTYPES).is_err(), "a refused build leaves no grid");
}

/// `update_local` against the host search of `atoms`: the grid and both lists, entry for entry and
/// word for word.
fn check_local_search(test: &str, g: &Gpu, nb: &mut NbnxmGpu, atoms: &LocalAtoms, setup: &ListSetup) {
    let search = PairSearch::build(atoms, &SearchOptions::new(setup.rlist)).unwrap();
    let stream = g.ctx.new_stream().unwrap();
    let r = nb.update_local(atoms, atoms.box_size, &stream).unwrap_or_else(|e| panic!("{test}: {e}"));
    // The read-back grid takes the LJ table's type count.
    assert_eq!(ClusterGrid { ntypes: search.grid.ntypes, ..nb.read_grid().unwrap() }, search.grid, "{test}: grid");
    assert_eq!(nb.atoms(), atoms.len());
    // The search step's grid facts are those of a synchronous build of the same atoms.
    let mut alone = DeviceGrid::new(&g.module).unwrap();
    assert_eq!(r.grid, alone.build_local(&g.module, atoms, &stream).unwrap_or_else(|e| panic!("{test}: {e}")), "{test}: grid info");
    for (k, (kind, list)) in [(ListKind::Local, &search.local), (ListKind::NonLocal, &search.nonlocal)].into_iter().enumerate() {
        let (entries, words) = (nb.read_entries(kind).unwrap(), nb.read_j_list(kind, false).unwrap());
        assert_eq!(words.len(), list.j_list.len(), "{test} {kind:?}: words");
        if let Some(w) = (0..words.len()).find(|&w| words[w] != list.j_list[w]) {
            panic!("{test} {kind:?}: word {w} is {:#x}, the host's {:#x}", words[w], list.j_list[w]);
        }
        assert_eq!(entries, list.entries, "{test} {kind:?}: entries");
        assert_eq!(nb.read_order(kind).unwrap(), halo_md::nbnxm::entry_order(&list.entries), "{test} {kind:?}: launch order");
        assert_eq!((r.words[k], r.entries[k]), (list.j_list.len(), list.entries.len()), "{test} {kind:?}");
    }
    eprintln!(
        "{test}: {} atoms, {} + {} words; GPU grid {:.3} ms + lists {:.3} ms; host grid {:.3} ms + lists {:.3} ms",
        atoms.len(),
        r.words[0],
        r.words[1],
        r.grid_time.as_secs_f64() * 1e3,
        r.lists_time.as_secs_f64() * 1e3,
        search.timing.grid.as_secs_f64() * 1e3,
        search.timing.lists.as_secs_f64() * 1e3
    );
}

#[test]
fn local_search_equals_the_host_search() {
    let Some(g) = gpu("gpu_local_search") else { return };
    // gpu_nbnxm's mixed-pulse case (1500 atoms, seed 5, 4x2x2, cutoff 0.7: two pulses in x, one in
    // y and z, halo zones interleaved) and liquids at the MD step's list cutoffs.
    let mixed = MolecularSystem::generate(1500, 5).unwrap();
    for (n, seed, nstlist, dims) in [
        (45_000, 61, 100, [2, 1, 1]),
        (45_000, 62, 50, [2, 2, 2]),
        (6000, 63, 100, [2, 2, 1]),
        (45_000, 64, 100, [1, 1, 1]),
        (1500, 5, 20, [4, 2, 2]),
    ] {
        let sys = if n == 1500 { mixed.clone() } else { MolecularSystem::generate(n, seed).unwrap() };
        let cutoff = if n == 1500 { 0.7 } else { 1.0 };
        let s = ListSetup::for_system(&sys, cutoff, 0.002, nstlist, 10, DEFAULT_DRIFT_TOLERANCE).unwrap();
        let ranks = ranks_of(&sys, dims, s.rlist);
        // One object through every rank (buffers reused, grown and shrunk), first from `new_local`.
        let mut nb = NbnxmGpu::new_local(g.module.clone(), &ranks[0], &lj_table(&sys), &s, sys.box_size, &g.ctx.new_stream().unwrap()).unwrap();
        for (r, atoms) in ranks.iter().enumerate() {
            check_local_search(&format!("local search {n} atoms {dims:?} rank {r} nstlist {nstlist}"), &g, &mut nb, atoms, &s);
        }
        // Invalid atoms: an error, and lists that index nothing until the next search.
        let mut bad = ranks[0].clone();
        bad.types[0] = 99;
        assert!(nb.update_local(&bad, sys.box_size, &g.ctx.new_stream().unwrap()).is_err());
        assert_eq!((nb.entries(ListKind::Local), nb.entries(ListKind::NonLocal), nb.atoms()), (0, 0, 0));
        check_local_search(&format!("local search {n} atoms {dims:?} rank 0 again"), &g, &mut nb, &ranks[0], &s);
    }
}

/// A 6,000-atom liquid (`seed`), its list setup, a stream, and two GPU searches on it: `nb` for
/// the path under test, `plain` for `update_local`'s lists to compare with.
struct Searches {
    sys: MolecularSystem,
    s: ListSetup,
    stream: std::sync::Arc<halo::gpu::CudaStream>,
    nb: NbnxmGpu,
    plain: NbnxmGpu,
}

fn two_searches(g: &Gpu, seed: u64) -> Searches {
    let sys = MolecularSystem::generate(6000, seed).unwrap();
    let s = ListSetup::for_system(&sys, 1.0, 0.002, 100, 10, DEFAULT_DRIFT_TOLERANCE).unwrap();
    let lj = lj_table(&sys);
    let stream = g.ctx.new_stream().unwrap();
    let nb = NbnxmGpu::new_resident(g.module.clone(), &lj, &s, sys.box_size).unwrap();
    let plain = NbnxmGpu::new_resident(g.module.clone(), &lj, &s, sys.box_size).unwrap();
    Searches { sys, s, stream, nb, plain }
}

/// The bits of coordinates, for exact comparisons.
fn bits(v: &[Float3]) -> Vec<u32> {
    bytemuck::cast_slice::<Float3, u32>(v).to_vec()
}

/// `update_local_into`: the lists of `update_local`, the home atoms' coordinates and types copied
/// on the device into the caller's buffers (poisoned first) bit for bit as `positions[..home]` and
/// `types[..home]`, nothing past `home` written, and the caller's hook run exactly once; a hook
/// that fails ends the search with its error and leaves no lists. Every rank of a 2x2x1 plan.
#[test]
fn local_search_into_copies_the_home_atoms_and_runs_the_hook_once() {
    use halo_md::nbnxm::HomeCopies;
    let Some(g) = gpu("gpu_local_search_into") else { return };
    let Searches { sys, s, stream, mut nb, mut plain } = two_searches(&g, 65);
    for (r, atoms) in ranks_of(&sys, [2, 2, 1], s.rlist).iter().enumerate() {
        let (home, extra) = (atoms.home, 7);
        assert!(home > 0 && atoms.len() > home, "rank {r}: {home} home of {} atoms", atoms.len());
        let x = DeviceBuffer::<Float3>::uninit(&g.ctx, atoms.len() + extra).unwrap();
        let ty = DeviceBuffer::<u32>::uninit(&g.ctx, atoms.len() + extra).unwrap();
        x.fill_bytes(0xFF).unwrap();
        ty.fill_bytes(0xFF).unwrap();
        g.ctx.synchronize().unwrap();
        let mut calls = 0;
        let got = nb
            .update_local_into(atoms, sys.box_size, &stream, HomeCopies { x: &x, types: &ty, from: None }, &mut || {
                calls += 1;
                Ok(())
            })
            .unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(calls, 1, "rank {r}: the hook runs once");
        let want = plain.update_local(atoms, sys.box_size, &stream).unwrap();
        assert_eq!((got.grid, got.words, got.entries), (want.grid, want.words, want.entries), "rank {r}");
        for kind in [ListKind::Local, ListKind::NonLocal] {
            assert_eq!(nb.read_entries(kind).unwrap(), plain.read_entries(kind).unwrap(), "rank {r} {kind:?}");
            assert_eq!(nb.read_j_list(kind, false).unwrap(), plain.read_j_list(kind, false).unwrap(), "rank {r} {kind:?}");
        }
        // Complete when the search returns (its stream was synchronised).
        let (gx, gt) = (x.to_host().unwrap(), ty.to_host().unwrap());
        assert_eq!(bits(&gx[..home]), bits(&atoms.positions[..home]), "rank {r}: home coordinates");
        assert_eq!(gt[..home], atoms.types[..home], "rank {r}: home types");
        assert!(bits(&gx[home..]).iter().all(|&b| b == u32::MAX), "rank {r}: coordinates past home written");
        assert!(gt[home..].iter().all(|&t| t == u32::MAX), "rank {r}: types past home written");
        // A failing hook: its error, and no lists.
        let e = nb
            .update_local_into(atoms, sys.box_size, &stream, HomeCopies { x: &x, types: &ty, from: None }, &mut || {
                Err(halo::error::HaloError::InvalidInput("staging failed".into()))
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("staging failed"), "rank {r}: {e}");
        assert_eq!((nb.entries(ListKind::Local), nb.entries(ListKind::NonLocal), nb.atoms()), (0, 0, 0), "rank {r}");
        // The work enqueued before the failure must finish before the buffers go.
        stream.synchronize().unwrap();
    }
    // Destinations too small for the home atoms are refused.
    let atoms = &ranks_of(&sys, [2, 1, 1], s.rlist)[0];
    let short = DeviceBuffer::<Float3>::uninit(&g.ctx, atoms.home - 1).unwrap();
    let ty = DeviceBuffer::<u32>::uninit(&g.ctx, atoms.len()).unwrap();
    let e =
        nb.update_local_into(atoms, sys.box_size, &stream, HomeCopies { x: &short, types: &ty, from: None }, &mut || Ok(())).unwrap_err().to_string();
    assert!(e.contains("device copy of"), "{e}");
    stream.synchronize().unwrap();
}

/// `update_local_into` with the home coordinates already on the GPU (`HomeCopies::from`, what a
/// redecomposition on the GPU leaves): the same grid and lists as the upload of every coordinate,
/// the home coordinates copied from that array on the device (with two home atoms' coordinates
/// swapped there, the copies into the MD's array hold the swapped ones, not the host's), and a
/// source shorter than the home atoms refused before anything is enqueued. Every rank of a 2x2x1
/// plan and of a 2x1x1 plan.
#[test]
fn local_search_into_takes_the_home_coordinates_from_the_device() {
    use halo_md::nbnxm::{HomeCopies, HomeOnDevice};
    let Some(g) = gpu("gpu_local_search_from_device") else { return };
    let Searches { sys, s, stream, mut nb, mut plain } = two_searches(&g, 66);
    for dims in [[2, 2, 1], [2, 1, 1]] {
        for (r, atoms) in ranks_of(&sys, dims, s.rlist).iter().enumerate() {
            let home = atoms.home;
            assert!(home > 1 && atoms.len() > home, "{dims:?} rank {r}: {home} home of {} atoms", atoms.len());
            let x = DeviceBuffer::<Float3>::uninit(&g.ctx, atoms.len()).unwrap();
            let ty = DeviceBuffer::<u32>::uninit(&g.ctx, atoms.len()).unwrap();
            x.fill_bytes(0xFF).unwrap();
            let src = DeviceBuffer::from_host(&g.ctx, &atoms.positions[..home]).unwrap();
            g.ctx.synchronize().unwrap();
            let copies = HomeCopies { x: &x, types: &ty, from: Some(HomeOnDevice { x: &src, types: None }) };
            let got = nb.update_local_into(atoms, sys.box_size, &stream, copies, &mut || Ok(())).unwrap_or_else(|e| panic!("{dims:?} rank {r}: {e}"));
            let want = plain.update_local(atoms, sys.box_size, &stream).unwrap();
            assert_eq!((got.grid, got.words, got.entries), (want.grid, want.words, want.entries), "{dims:?} rank {r}");
            for kind in [ListKind::Local, ListKind::NonLocal] {
                assert_eq!(nb.read_entries(kind).unwrap(), plain.read_entries(kind).unwrap(), "{dims:?} rank {r} {kind:?}");
                assert_eq!(nb.read_j_list(kind, false).unwrap(), plain.read_j_list(kind, false).unwrap(), "{dims:?} rank {r} {kind:?}");
            }
            let gx = x.to_host().unwrap();
            assert_eq!(bits(&gx[..home]), bits(&atoms.positions[..home]), "{dims:?} rank {r}: home coordinates");
            assert!(bits(&gx[home..]).iter().all(|&b| b == u32::MAX), "{dims:?} rank {r}: coordinates past home written");

            // The device's coordinates are the ones used: two of them swapped there show up in the
            // MD's array (the host's atoms are unchanged, so the zones' shape is the same).
            let mut swapped = atoms.positions[..home].to_vec();
            swapped.swap(0, home - 1);
            src.copy_from_host(&swapped).unwrap();
            let copies = HomeCopies { x: &x, types: &ty, from: Some(HomeOnDevice { x: &src, types: None }) };
            nb.update_local_into(atoms, sys.box_size, &stream, copies, &mut || Ok(())).unwrap_or_else(|e| panic!("{dims:?} rank {r}: {e}"));
            assert_eq!(bits(&x.to_host().unwrap()[..home]), bits(&swapped), "{dims:?} rank {r}: home coordinates from the device");

            // Too few coordinates on the device: refused, nothing enqueued, no lists.
            let short = DeviceBuffer::from_host(&g.ctx, &atoms.positions[..home - 1]).unwrap();
            let copies = HomeCopies { x: &x, types: &ty, from: Some(HomeOnDevice { x: &short, types: None }) };
            let e = nb.update_local_into(atoms, sys.box_size, &stream, copies, &mut || Ok(())).unwrap_err().to_string();
            assert!(e.contains(&format!("{} home coordinates on the GPU for {home} home atoms", home - 1)), "{dims:?} rank {r}: {e}");
            assert_eq!((nb.entries(ListKind::Local), nb.entries(ListKind::NonLocal), nb.atoms()), (0, 0, 0), "{dims:?} rank {r}");
            stream.synchronize().unwrap();
        }
    }
}

/// `DeviceGrid::build_local_from`: the home atoms' coordinates and types taken on the device
/// (coordinates copied, types made from the home ids and the system's types by id: kernel
/// `types_by_id`, or uploaded without the ids), the rest uploaded: the
/// host's grid slot for slot, type for type and zone for zone, with every buffer of the grid
/// poisoned before each build, on every rank of 2x1x1, 2x2x1 and 2x2x2. With two home atoms' types
/// changed in the table on the device, the grid holds the table's types (the device's are the ones
/// used). Too few ids on the device are refused before anything is enqueued.
#[test]
fn a_local_grid_takes_the_home_atoms_from_the_device() {
    use halo_md::nbnxm::{HomeOnDevice, TypesById};
    let Some(g) = gpu("gpu_grid_home_from_device") else { return };
    let sys = MolecularSystem::generate(6000, 12).unwrap();
    let by_id: Vec<u32> = sys.types.iter().map(|&t| u32::from(t)).collect();
    let ntypes = sys.atom_types.len() as u32;
    assert!(ntypes >= 2, "a system of one type cannot show a changed type");
    let table = DeviceBuffer::from_host(&g.ctx, &by_id).unwrap();
    let stream = g.ctx.new_stream().unwrap();
    let mut grid = DeviceGrid::new(&g.module).unwrap();
    for dims in [[2, 1, 1], [2, 2, 1], [2, 2, 2]] {
        let plan = HaloPlan::build(&sys, RankGrid::new(dims).unwrap(), 1.1).unwrap();
        for r in 0..plan.ranks.len() {
            let case = format!("{dims:?} rank {r}");
            let atoms = LocalAtoms::from_plan(&plan, r, &sys.positions, &sys.types).unwrap();
            let home = atoms.home;
            let home_ids = &plan.ranks[r].global_ids[..home];
            assert!(home > 1 && atoms.len() > home, "{case}: {home} home of {} atoms", atoms.len());
            let x = DeviceBuffer::from_host(&g.ctx, &atoms.positions[..home]).unwrap();
            let ids = DeviceBuffer::from_host(&g.ctx, home_ids).unwrap();
            g.ctx.synchronize().unwrap();
            for with_types in [false, true] {
                let on = HomeOnDevice { x: &x, types: with_types.then_some(TypesById { ids: &ids, by_id: &table }) };
                check_local_grid_from(&format!("{case}, types on the GPU {with_types}"), &g, &mut grid, &atoms, Some(on));
            }
            let host = ClusterGrid::build(&atoms).unwrap();
            // Two home atoms' types changed in the table on the device: the grid has them.
            let mut changed = by_id.clone();
            for &id in [home_ids[0], home_ids[home - 1]].iter() {
                changed[id as usize] = (changed[id as usize] + 1) % ntypes;
            }
            let table2 = DeviceBuffer::from_host(&g.ctx, &changed).unwrap();
            g.ctx.synchronize().unwrap();
            grid.poison().unwrap();
            let on = HomeOnDevice { x: &x, types: Some(TypesById { ids: &ids, by_id: &table2 }) };
            grid.build_local_from(&g.module, &atoms, on, &stream).unwrap_or_else(|e| panic!("{case}: {e}"));
            let got = grid.to_host(atoms.ntypes).unwrap();
            let mut seen = 0;
            for (slot, &atom) in host.atom_index.iter().enumerate() {
                let want = match atom as usize {
                    a if a == 0 || a == home - 1 => changed[home_ids[a] as usize],
                    _ => host.atom_type[slot],
                };
                seen += usize::from(atom == 0 || atom as usize == home - 1);
                assert_eq!(got.atom_type[slot], want, "{case}: slot {slot} (atom {atom}) with the changed table");
            }
            assert_eq!(seen, 2, "{case}: both changed atoms are in the grid");
            // Too few ids: refused, nothing enqueued.
            let short = DeviceBuffer::from_host(&g.ctx, &home_ids[..home - 1]).unwrap();
            g.ctx.synchronize().unwrap();
            let on = HomeOnDevice { x: &x, types: Some(TypesById { ids: &short, by_id: &table }) };
            let e = grid.build_local_from(&g.module, &atoms, on, &stream).unwrap_err().to_string();
            assert!(e.contains(&format!("{} home ids on the GPU for {home} home atoms", home - 1)), "{case}: {e}");
        }
    }
}

/// `begin_local` and `finish_local`, the two halves the MD step splits a search into (the host's
/// router and replan run between): every rank of a 2x2x1 plan begun on its own object and stream
/// before any is finished (all four searches' passes in flight together), then finished in
/// reverse order: the lists of `update_local`, the home copies bit for bit as
/// `update_local_into`'s (nothing past `home` written) and the hook run once. Misuse is refused
/// with the fix named and leaves the object usable: finishing with nothing begun, finishing on
/// other atoms (other sizes, or a copy of the same) or on another stream (the begun search waited
/// for and dropped, no lists), a second
/// begin over a begun search (the first abandoned, the second's lists kept), `update_local` over
/// a begun search, and dropping an object with a search begun.
#[test]
fn a_search_begun_and_finished_later_equals_update_local() {
    let Some(g) = gpu("gpu_local_search_halves") else { return };
    let Searches { sys, s, stream, mut nb, mut plain } = two_searches(&g, 67);
    let ranks = ranks_of(&sys, [2, 2, 1], s.rlist);
    let lj = lj_table(&sys);
    let mut objs: Vec<_> = ranks
        .iter()
        .map(|a| {
            let x = DeviceBuffer::<Float3>::uninit(&g.ctx, a.len() + 5).unwrap();
            let ty = DeviceBuffer::<u32>::uninit(&g.ctx, a.len() + 5).unwrap();
            x.fill_bytes(0xFF).unwrap();
            ty.fill_bytes(0xFF).unwrap();
            (NbnxmGpu::new_resident(g.module.clone(), &lj, &s, sys.box_size).unwrap(), g.ctx.new_stream().unwrap(), x, ty)
        })
        .collect();
    g.ctx.synchronize().unwrap();
    for (r, ((nb, st, _, _), atoms)) in objs.iter_mut().zip(&ranks).enumerate() {
        nb.begin_local(atoms, sys.box_size, st, None).unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert!(nb.begun(), "rank {r}");
    }
    for (r, ((nb, st, x, ty), atoms)) in objs.iter_mut().zip(&ranks).enumerate().rev() {
        let mut calls = 0;
        let got = nb
            .finish_local(atoms, st, Some((&*x, &*ty)), &mut || {
                calls += 1;
                Ok(())
            })
            .unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(calls, 1, "rank {r}: the hook runs once");
        assert!(!nb.begun(), "rank {r}");
        assert!(got.wait_time <= got.lists_time, "rank {r}: the wait is part of the lists' time: {got:?}");
        let want = plain.update_local(atoms, sys.box_size, &stream).unwrap();
        assert_eq!((got.grid, got.words, got.entries), (want.grid, want.words, want.entries), "rank {r}");
        for kind in [ListKind::Local, ListKind::NonLocal] {
            assert_eq!(nb.read_entries(kind).unwrap(), plain.read_entries(kind).unwrap(), "rank {r} {kind:?}");
            assert_eq!(nb.read_order(kind).unwrap(), plain.read_order(kind).unwrap(), "rank {r} {kind:?}");
            assert_eq!(nb.read_j_list(kind, false).unwrap(), plain.read_j_list(kind, false).unwrap(), "rank {r} {kind:?}");
        }
        let (home, gx, gt) = (atoms.home, x.to_host().unwrap(), ty.to_host().unwrap());
        assert_eq!(bits(&gx[..home]), bits(&atoms.positions[..home]), "rank {r}: home coordinates");
        assert_eq!(gt[..home], atoms.types[..home], "rank {r}: home types");
        assert!(bits(&gx[home..]).iter().all(|&b| b == u32::MAX), "rank {r}: coordinates past home written");
        assert!(gt[home..].iter().all(|&t| t == u32::MAX), "rank {r}: types past home written");
    }

    let (atoms, other) = (&ranks[0], &ranks[3]);
    assert_ne!((atoms.len(), atoms.home), (other.len(), other.home), "the misuse cases need ranks of different sizes");
    let none = |nb: &NbnxmGpu| (nb.entries(ListKind::Local), nb.entries(ListKind::NonLocal), nb.atoms(), nb.begun());
    let e = nb.finish_local(atoms, &stream, None, &mut || Ok(())).unwrap_err().to_string();
    assert!(e.contains("begin_local first"), "{e}");
    nb.begin_local(atoms, sys.box_size, &stream, None).unwrap();
    let e = nb.finish_local(other, &stream, None, &mut || Ok(())).unwrap_err().to_string();
    assert!(e.contains("begun on") && e.contains("not the atoms that began it") && e.contains("the same stream"), "{e}");
    assert_eq!(none(&nb), (0, 0, 0, false));
    // The same sizes in another array (a copy): not the atoms that began it either.
    nb.begin_local(atoms, sys.box_size, &stream, None).unwrap();
    let e = nb.finish_local(&atoms.clone(), &stream, None, &mut || Ok(())).unwrap_err().to_string();
    assert!(e.contains("not the atoms that began it") && e.contains("the same stream"), "{e}");
    assert_eq!(none(&nb), (0, 0, 0, false));
    nb.begin_local(atoms, sys.box_size, &stream, None).unwrap();
    let e = nb.finish_local(atoms, &g.ctx.new_stream().unwrap(), None, &mut || Ok(())).unwrap_err().to_string();
    assert!(e.contains("on another stream") && e.contains("the stream that began it"), "{e}");
    assert_eq!(none(&nb), (0, 0, 0, false));
    let check = |nb: &NbnxmGpu, plain: &mut NbnxmGpu, a: &LocalAtoms, what: &str| {
        plain.update_local(a, sys.box_size, &stream).unwrap();
        for kind in [ListKind::Local, ListKind::NonLocal] {
            assert_eq!(nb.read_entries(kind).unwrap(), plain.read_entries(kind).unwrap(), "{what} {kind:?}");
            assert_eq!(nb.read_j_list(kind, false).unwrap(), plain.read_j_list(kind, false).unwrap(), "{what} {kind:?}");
        }
    };
    nb.begin_local(other, sys.box_size, &stream, None).unwrap();
    nb.begin_local(atoms, sys.box_size, &stream, None).unwrap();
    nb.finish_local(atoms, &stream, None, &mut || Ok(())).unwrap();
    check(&nb, &mut plain, atoms, "begun twice");
    nb.begin_local(other, sys.box_size, &stream, None).unwrap();
    nb.update_local(atoms, sys.box_size, &stream).unwrap();
    assert!(!nb.begun());
    check(&nb, &mut plain, atoms, "update_local over a begun search");
    nb.begin_local(other, sys.box_size, &stream, None).unwrap();
    drop(nb);
    stream.synchronize().unwrap();
}
