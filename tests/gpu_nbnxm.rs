//! The cluster-pair (nbnxm) kernels against the `f64` CPU reference of the same lists
//! (`md_reference::cluster_list_forces`): forces and potential-shifted energy, with and without the
//! GPU prune, at 6,000 and 45,000 atoms, on one rank and on ranks with a halo (from the existing
//! decomposition), plus edge inputs (no list, one padded cluster, atoms exactly at the cutoff).
//! Outputs are poisoned: forces start from known nonzero values with NaN guards after the array,
//! the energy accumulator starts at 1000. Also prints the kernels' GPU times (no assertion on them).

use halo::abi::Float3;
use halo::decomp::{HaloPlan, RankGrid};
use halo::gpu::{CudaContext, DeviceBuffer, DeviceMemory, KernelModule};
use halo_md::nbnxm::{ListKind, ListSetup, LocalAtoms, NbnxmGpu, PairSearch, SearchOptions, lj_table};
use halo_md::md_reference::{cluster_list_forces, exchange_coordinates_f64, prune_reference};
use halo::system::MolecularSystem;
use halo::testing::gpu_or_skip;
use std::sync::Arc;

/// Relative force tolerance, as `halo verify`: of max(|F| of the atom, RMS force).
const FORCE_TOL: f64 = 1e-4;
/// Relative energy tolerance (f32 pair energies summed per lane, then per warp in f64).
const ENERGY_TOL: f64 = 2e-5;
const GUARD: usize = 8;
const ENERGY_POISON: f64 = 1000.0;

struct Gpu {
    ctx: Arc<CudaContext>,
    module: Arc<KernelModule>,
}

fn gpu(test: &str) -> Option<Gpu> {
    let g = gpu_or_skip(test)?;
    Some(Gpu { ctx: g.ctx, module: Arc::new(g.module) })
}

fn table_f64(sys: &MolecularSystem) -> Vec<(f64, f64)> {
    let n = sys.atom_types.len();
    (0..n * n).map(|k| sys.lj_pair(k / n, k % n)).map(|p| (p.c6, p.c12)).collect()
}

/// Runs both lists of one rank on the GPU (optionally pruning first) and compares forces, energy
/// and (when pruned) the inner lists with the references. Returns (worst force error, energy error).
fn check(test: &str, g: &Gpu, sys: &MolecularSystem, atoms: &LocalAtoms, coords: &[[f64; 3]], setup: &ListSetup, prune: bool) -> (f64, f64) {
    check_with(test, g, sys, atoms, coords, setup, prune, false)
}

/// [`check`], with the lists searched on the GPU (`gpu_search`) instead of uploaded from the host:
/// then the GPU's lists must first equal the host's word for word and entry for entry.
#[allow(clippy::too_many_arguments)]
fn check_with(
    test: &str, g: &Gpu, sys: &MolecularSystem, atoms: &LocalAtoms, coords: &[[f64; 3]], setup: &ListSetup, prune: bool, gpu_search: bool,
) -> (f64, f64) {
    let search = PairSearch::build(atoms, &SearchOptions::new(setup.rlist)).unwrap_or_else(|e| panic!("{test}: {e}"));
    let mut nb = if gpu_search {
        let stream = g.ctx.new_stream().unwrap();
        let nb = NbnxmGpu::new_on_gpu(g.module.clone(), &search.grid, &lj_table(sys), setup, atoms.box_size, &stream)
            .unwrap_or_else(|e| panic!("{test}: {e}"));
        for (kind, list) in [(ListKind::Local, &search.local), (ListKind::NonLocal, &search.nonlocal)] {
            let (entries, words) = (nb.read_entries(kind).unwrap(), nb.read_j_list(kind, false).unwrap());
            assert_eq!(entries.len(), list.entries.len(), "{test} {kind:?}: GPU search entries");
            assert_eq!(words.len(), list.j_list.len(), "{test} {kind:?}: GPU search words");
            if let Some(w) = (0..words.len()).find(|&w| words[w] != list.j_list[w]) {
                panic!("{test} {kind:?}: GPU search word {w} is {:#x}, the host's {:#x}", words[w], list.j_list[w]);
            }
            assert_eq!(entries, list.entries, "{test} {kind:?}: GPU search entries");
        }
        nb
    } else {
        NbnxmGpu::new(g.module.clone(), &search, &lj_table(sys), setup, atoms.box_size).unwrap_or_else(|e| panic!("{test}: {e}"))
    };
    let n = atoms.len();
    let x = DeviceBuffer::from_host(&g.ctx, &atoms.positions).unwrap();
    // Forces start at known values; the guard entries after the array are NaN and must stay so.
    let start: Vec<Float3> = (0..n + GUARD)
        .map(|i| if i < n { Float3::new(0.5 * (i % 7) as f32, -0.25 * (i % 5) as f32, 1.0) } else { Float3::new(f32::NAN, f32::NAN, f32::NAN) })
        .collect();
    let f = DeviceBuffer::from_host(&g.ctx, &start).unwrap();
    nb.energy_buffer().copy_from_host(&[ENERGY_POISON]).unwrap();
    let stream = g.ctx.new_stream().unwrap();
    for kind in [ListKind::Local, ListKind::NonLocal] {
        if prune {
            nb.prune(kind, &x, &stream).unwrap();
        }
        nb.forces(kind, &x, &f, &stream, true).unwrap();
    }
    stream.synchronize().unwrap();
    let got = f.to_host().unwrap();
    let energy = nb.energy().unwrap() - ENERGY_POISON;

    let table = table_f64(sys);
    let rc = f64::from(setup.cutoff);
    let (mut want, mut want_e) = cluster_list_forces(&search.grid, &search.local, coords, &table, rc);
    let (fnl, enl) = cluster_list_forces(&search.grid, &search.nonlocal, coords, &table, rc);
    for (a, b) in want.iter_mut().zip(&fnl) {
        for c in 0..3 {
            a[c] += b[c];
        }
    }
    want_e += enl;
    let rms = (want.iter().map(|v| v.iter().map(|c| c * c).sum::<f64>()).sum::<f64>() / n.max(1) as f64).sqrt();
    let mut worst = 0.0f64;
    for i in 0..n {
        let norm = want[i].iter().map(|c| c * c).sum::<f64>().sqrt().max(rms).max(1e-6);
        let (s, v) = (start[i], got[i]);
        for (c, (g0, s0)) in [(v.x, s.x), (v.y, s.y), (v.z, s.z)].into_iter().enumerate() {
            let err = (f64::from(g0) - f64::from(s0) - want[i][c]).abs() / norm;
            assert!(err <= FORCE_TOL, "{test}: atom {i} component {c}: GPU {} (from {s0}), reference {} (error {err:.2e})", g0 - s0, want[i][c]);
            worst = worst.max(err);
        }
    }
    assert!(got[n..].iter().all(|v| v.x.is_nan() && v.y.is_nan() && v.z.is_nan()), "{test}: a write past the force array");
    let e_err = (energy - want_e).abs() / want_e.abs().max(1.0);
    assert!(e_err <= ENERGY_TOL, "{test}: GPU energy {energy}, reference {want_e}");
    if prune {
        // Inner lists: every bit the f64 reference keeps a hair inside rlist_inner, and none it drops a hair outside.
        let ri = f64::from(setup.rlist_inner);
        for (kind, list) in [(ListKind::Local, &search.local), (ListKind::NonLocal, &search.nonlocal)] {
            let inner = nb.read_j_list(kind, true).unwrap();
            let lo = prune_reference(&search.grid, list, coords, ri * (1.0 - 1e-5));
            let hi = prune_reference(&search.grid, list, coords, ri * (1.0 + 1e-5));
            for (w, ((g0, l0), h0)) in inner.iter().zip(&lo).zip(&hi).enumerate() {
                assert!(g0 & l0 == *l0 && g0 & !h0 == 0, "{test}: inner word {w}: GPU {g0:#x}, reference between {l0:#x} and {h0:#x}");
            }
        }
    }
    eprintln!("{test}: {n} atoms ({} home), worst force error {worst:.2e}, energy {energy:.3} vs {want_e:.3}", atoms.home);
    (worst, e_err)
}

fn setup(cutoff: f32, buffer: f32) -> ListSetup {
    ListSetup::new(cutoff, 100, cutoff + buffer, 10, cutoff + buffer.min(0.05)).unwrap()
}

/// Every rank of a decomposition of `atoms` atoms, with and without pruning.
fn decomposed(test: &str, atoms: usize, dims: [usize; 3], ranks: &[usize]) {
    let Some(g) = gpu(test) else { return };
    let sys = MolecularSystem::generate(atoms, 13).unwrap();
    let s = setup(1.0, 0.2);
    let plan = HaloPlan::build(&sys, RankGrid::new(dims).unwrap(), s.rlist).unwrap();
    let coords = exchange_coordinates_f64(&plan, &sys).unwrap();
    for &r in ranks {
        let local = LocalAtoms::from_plan(&plan, r, &sys.positions, &sys.types).unwrap();
        for prune in [false, true] {
            check(&format!("{test} rank {r} prune {prune}"), &g, &sys, &local, &coords[r], &s, prune);
        }
        check_with(&format!("{test} rank {r} GPU search"), &g, &sys, &local, &coords[r], &s, true, true);
    }
}

#[test]
fn one_rank_6000_atoms() {
    decomposed("nbnxm_6000_1x1x1", 6000, [1, 1, 1], &[0]);
}

#[test]
fn two_ranks_6000_atoms_with_a_halo() {
    decomposed("nbnxm_6000_2x1x1", 6000, [2, 1, 1], &[0, 1]);
}

#[test]
fn four_ranks_6000_atoms_2x2x1() {
    decomposed("nbnxm_6000_2x2x1", 6000, [2, 2, 1], &[0, 3]);
}

#[test]
fn one_rank_45000_atoms() {
    decomposed("nbnxm_45000_1x1x1", 45_000, [1, 1, 1], &[0]);
}

#[test]
fn two_ranks_45000_atoms_with_a_halo() {
    decomposed("nbnxm_45000_2x1x1", 45_000, [2, 1, 1], &[0, 1]);
}

#[test]
fn eight_ranks_45000_atoms_2x2x2() {
    decomposed("nbnxm_45000_2x2x2", 45_000, [2, 2, 2], &[0, 7]);
}

/// The GPU search (both passes) against the host search at the MD step's list cutoffs (nstlist
/// 100 and 50: rlist 1.48 and 1.23 nm), on one rank and on ranks with halos, and its time beside
/// the host's (printed, not asserted).
#[test]
fn gpu_search_equals_the_host_search() {
    let Some(g) = gpu("nbnxm_gpu_search") else { return };
    for atoms in [6000, 45_000] {
        let sys = MolecularSystem::generate(atoms, 21).unwrap();
        for nstlist in [100, 50] {
            let s = ListSetup::for_system(&sys, 1.0, 0.002, nstlist, 10, 1e-3).unwrap();
            for dims in [[1, 1, 1], [2, 1, 1], [2, 2, 1]] {
                let plan = HaloPlan::build(&sys, RankGrid::new(dims).unwrap(), s.rlist).unwrap();
                let r = plan.ranks.len() - 1;
                let local = LocalAtoms::from_plan(&plan, r, &sys.positions, &sys.types).unwrap();
                let search = PairSearch::build(&local, &SearchOptions::new(s.rlist)).unwrap();
                let stream = g.ctx.new_stream().unwrap();
                let mut nb = NbnxmGpu::new_on_gpu(g.module.clone(), &search.grid, &lj_table(&sys), &s, sys.box_size, &stream).unwrap();
                let t = std::time::Instant::now();
                nb.update_on_gpu(&search.grid, sys.box_size, &stream).unwrap();
                let gpu_ms = t.elapsed().as_secs_f64() * 1e3;
                let test = format!("gpu search {atoms} atoms nstlist {nstlist} {dims:?} rank {r}");
                for (kind, list) in [(ListKind::Local, &search.local), (ListKind::NonLocal, &search.nonlocal)] {
                    assert_eq!(nb.read_entries(kind).unwrap(), list.entries, "{test} {kind:?}");
                    assert_eq!(nb.read_j_list(kind, false).unwrap(), list.j_list, "{test} {kind:?}");
                }
                eprintln!(
                    "{test}: {} + {} words; GPU search {gpu_ms:.2} ms (upload, both passes, host layout), host lists {:.2} ms",
                    search.local.j_list.len(),
                    search.nonlocal.j_list.len(),
                    search.timing.lists.as_secs_f64() * 1e3
                );
            }
        }
    }
}

/// Hand-placed atoms in a 4 nm box (all home, every dimension periodic).
fn custom(test: &str, g: &Gpu, positions: &[Float3], cutoff: f32, buffer: f32) -> (f64, f64) {
    let sys = MolecularSystem::generate(positions.len().max(1), 2).unwrap();
    let types: Vec<u32> = (0..positions.len()).map(|i| (i % 2) as u32).collect();
    let atoms = LocalAtoms::single_rank(positions, &types, 2, [4.0; 3]).unwrap();
    let coords: Vec<[f64; 3]> = atoms.positions.iter().map(|p| [p.x, p.y, p.z].map(f64::from)).collect();
    let mut sys4 = sys.clone();
    sys4.box_size = [4.0; 3];
    check(test, g, &sys4, &atoms, &coords, &setup(cutoff, buffer), true)
}

#[test]
fn edge_inputs() {
    let Some(g) = gpu("nbnxm_edges") else { return };
    // One cluster of 5 atoms (3 padding slots): only the self cluster pair, ti < tj.
    let five: Vec<Float3> = (0..5).map(|i| Float3::new(1.0 + 0.25 * i as f32, 1.0, 1.0 + 0.05 * i as f32)).collect();
    custom("nbnxm_one_cluster", &g, &five, 1.0, 0.1);
    // Exactly at the cutoff (excluded, by f32 and f64 alike) and just inside; and across the
    // periodic boundary (0.2 and 3.8 are 0.4 apart).
    let edge = vec![
        Float3::new(1.0, 2.0, 2.0),
        Float3::new(2.0, 2.0, 2.0),
        Float3::new(1.0, 3.0, 2.0),
        Float3::new(1.0, 3.0, 2.999_999_8),
        Float3::new(0.2, 0.5, 0.5),
        Float3::new(3.8, 0.5, 0.5),
    ];
    let (_, e_err) = custom("nbnxm_at_cutoff", &g, &edge, 1.0, 0.1);
    assert!(e_err.is_finite());
    // No pair within the cutoff at all: forces unchanged, energy zero.
    let far = vec![Float3::new(0.5, 0.5, 0.5), Float3::new(2.5, 2.5, 2.5)];
    custom("nbnxm_no_pairs", &g, &far, 1.0, 0.1);
    // A rank without halo: the non-local list is empty and its launches do nothing.
    let sys = MolecularSystem::generate(6000, 3).unwrap();
    let types: Vec<u32> = sys.types.iter().map(|&t| u32::from(t)).collect();
    let atoms = LocalAtoms::single_rank(&sys.positions, &types, 2, sys.box_size).unwrap();
    let search = PairSearch::build(&atoms, &SearchOptions::new(1.1)).unwrap();
    assert!(search.nonlocal.is_empty());
    let nb = NbnxmGpu::new(g.module.clone(), &search, &lj_table(&sys), &setup(1.0, 0.1), sys.box_size).unwrap();
    let x = DeviceBuffer::from_host(&g.ctx, &atoms.positions).unwrap();
    let f = DeviceBuffer::from_host(&g.ctx, &vec![Float3::new(1.0, 2.0, 3.0); atoms.len()]).unwrap();
    let stream = g.ctx.new_stream().unwrap();
    nb.forces(ListKind::NonLocal, &x, &f, &stream, true).unwrap();
    stream.synchronize().unwrap();
    assert!(f.to_host().unwrap().iter().all(|v| *v == Float3::new(1.0, 2.0, 3.0)));
    assert_eq!(nb.energy().unwrap(), 0.0);
    // Arrays shorter than the lists index are refused.
    let short = DeviceBuffer::<Float3>::zeroed(&g.ctx, 10).unwrap();
    assert!(nb.forces(ListKind::Local, &short, &f, &stream, false).is_err());
}

/// GPU time of the kernels at 45,000 atoms (1 rank, and rank 0 of 2x1x1): printed, not asserted.
#[test]
fn kernel_times_45000_atoms() {
    let Some(g) = gpu("nbnxm_times") else { return };
    let sys = MolecularSystem::generate(45_000, 13).unwrap();
    let s = ListSetup::for_system(&sys, 1.0, 0.002, 100, 10, 1e-3).unwrap();
    eprintln!("nbnxm_times: rlist {:.3} nm (nstlist 100), rlist_inner {:.3} nm (nstprune 10)", s.rlist, s.rlist_inner);
    for dims in [[1, 1, 1], [2, 1, 1]] {
        let plan = HaloPlan::build(&sys, RankGrid::new(dims).unwrap(), s.rlist).unwrap();
        let atoms = LocalAtoms::from_plan(&plan, 0, &sys.positions, &sys.types).unwrap();
        let search = PairSearch::build(&atoms, &SearchOptions::new(s.rlist)).unwrap();
        let mut nb = NbnxmGpu::new(g.module.clone(), &search, &lj_table(&sys), &s, sys.box_size).unwrap();
        let x = DeviceBuffer::from_host(&g.ctx, &atoms.positions).unwrap();
        let f = DeviceBuffer::<Float3>::zeroed(&g.ctx, atoms.len()).unwrap();
        let stream = g.ctx.new_stream().unwrap();
        let timed = |what: &str, reps: u32, body: &mut dyn FnMut()| {
            body();
            let timing = || g.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).unwrap();
            let (a, b) = (timing(), timing());
            a.record(&stream).unwrap();
            for _ in 0..reps {
                body();
            }
            b.record(&stream).unwrap();
            b.synchronize().unwrap();
            eprintln!("nbnxm_times {dims:?} {what}: {:.2} us", f64::from(a.elapsed_ms(&b).unwrap()) * 1e3 / f64::from(reps));
        };
        for kind in [ListKind::Local, ListKind::NonLocal] {
            if nb.entries(kind) == 0 {
                continue;
            }
            let pairs = match kind {
                ListKind::Local => search.local.cluster_pairs(),
                ListKind::NonLocal => search.nonlocal.cluster_pairs(),
            };
            eprintln!("nbnxm_times {dims:?} {kind:?}: {} entries, {pairs} cluster pairs (outer)", nb.entries(kind));
            timed(&format!("{kind:?} forces, outer list"), 50, &mut || nb.forces(kind, &x, &f, &stream, false).unwrap());
            timed(&format!("{kind:?} prune"), 20, &mut || nb.prune(kind, &x, &stream).unwrap());
            let kept = nb.read_j_list(kind, true).unwrap().iter().map(|w| (w & 0xff).count_ones() as usize).sum::<usize>();
            eprintln!("nbnxm_times {dims:?} {kind:?}: {kept} cluster pairs in the inner list");
            timed(&format!("{kind:?} forces, inner list"), 50, &mut || nb.forces(kind, &x, &f, &stream, false).unwrap());
            timed(&format!("{kind:?} forces+energy, inner list"), 50, &mut || nb.forces(kind, &x, &f, &stream, true).unwrap());
        }
        eprintln!(
            "nbnxm_times {dims:?}: host search {:.2} ms (grid {:.2}, lists {:.2}) on {} atoms",
            (search.timing.grid + search.timing.lists).as_secs_f64() * 1e3,
            search.timing.grid.as_secs_f64() * 1e3,
            search.timing.lists.as_secs_f64() * 1e3,
            atoms.len()
        );
    }
}
