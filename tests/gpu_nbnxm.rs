//! The cluster-pair (nbnxm) kernels against the `f64` CPU reference of the same lists
//! (`md_reference::cluster_list_forces`): forces and potential-shifted energy, with and without the
//! GPU prune, at 6,000 and 45,000 atoms, on one rank and on ranks with a halo (from the existing
//! decomposition), with two and five atom types, entries of 1, 5, 32 and up to 100 words, plus
//! edge inputs (no list, one padded cluster, atoms exactly at the cutoff). Every kernel design
//! ([`NbnxmKernel::ALL`]) runs every check with every warp count of [`warp_counts`] (1 to 16 warps
//! per entry, 3 among them, and the host's rule), also on lists from the GPU search, which must
//! first equal the host's word for word; so the interleaved share of each warp is checked
//! with more warps than words, with one word per warp and with several rounds of 32 words per warp.
//! Every list's launch order on the GPU (longest entry first) must equal the host's `entry_order`
//! of its entries; the GPU's order kernels are also checked alone on random entry lists.
//! Outputs are poisoned: forces start from known nonzero values with NaN guards after the array,
//! the energy accumulator starts at 1000, the inner list at all ones. `kernel_times` prints every
//! design's and warp count's GPU times as a table and `entry_shape_times` the force kernel's time
//! per entry shape and launch order: benchmarks, not tests (`#[ignore]`d: they check no result
//! against a reference), run by `gpu-suite.sh kernel-times` with `--ignored`.

use halo::abi::Float3;
use halo::decomp::{HaloPlan, RankGrid};
use halo::gpu::{DeviceBuffer, DeviceMemory};
use halo::system::{AtomType, MolecularSystem};
use halo::testing::{GpuFixture as Gpu, gpu_or_skip as gpu};
use halo_md::md_reference::{cluster_list_forces, exchange_coordinates_f64, prune_reference};
use halo_md::nbnxm::{
    DEFAULT_DRIFT_TOLERANCE, EnergySlot, Launch, ListKind, ListSetup, LocalAtoms, NbnxmGpu, NbnxmKernel, PairSearch, SearchOptions, WarpsPerEntry,
    entry_order, lj_table,
};
use std::sync::Arc;

/// Relative force tolerance, as `halo verify`: of max(|F| of the atom, RMS force).
const FORCE_TOL: f64 = 1e-4;
/// Relative energy tolerance (f32 pair energies summed per lane, then per warp in f64).
const ENERGY_TOL: f64 = 2e-5;
const GUARD: usize = 8;
const ENERGY_POISON: f64 = 1000.0;
const MASK: u32 = 0xff;

/// Every warp count the checks run: the host's rule, and fixed counts from 1 to the most a launch
/// takes, with 3 (not a power of two) among them.
fn warp_counts() -> Vec<WarpsPerEntry> {
    let mut v = vec![WarpsPerEntry::Auto];
    v.extend([1, 2, 3, 4, 8, 16].map(WarpsPerEntry::Fixed));
    v
}

fn table_f64(sys: &MolecularSystem) -> Vec<(f64, f64)> {
    let n = sys.atom_types.len();
    (0..n * n).map(|k| sys.lj_pair(k / n, k % n)).map(|p| (p.c6, p.c12)).collect()
}

/// Runs both lists of one rank on the GPU with every kernel design and warp count (optionally
/// pruning first) and compares forces, energy and (when pruned) the inner lists with the references.
#[allow(clippy::too_many_arguments)]
fn check(test: &str, g: &Gpu, sys: &MolecularSystem, atoms: &LocalAtoms, coords: &[[f64; 3]], setup: &ListSetup, prune: bool, max_j: usize) {
    check_with(test, g, sys, atoms, coords, setup, prune, max_j, Lists::Host)
}

/// Where the lists on the GPU come from.
#[derive(Clone, Copy)]
enum Lists<'a> {
    /// The host's search, uploaded.
    Host,
    /// The host's grid, uploaded, and the GPU search.
    GpuSearch,
    /// The whole search step on the GPU (`update_resident`) from these coordinates (one rank;
    /// `atoms` must be their `LocalAtoms::single_rank`): wrapped in place, the grid built on the
    /// GPU, the GPU search.
    Resident(&'a [Float3]),
}

/// [`check`], with the lists searched on the GPU (which splits entries at the default 32 words)
/// instead of uploaded from the host: then the GPU's lists (and, for [`Lists::Resident`], the
/// wrapped coordinates and the grid) must first equal the host's word for word and entry for entry.
#[allow(clippy::too_many_arguments)]
fn check_with(
    test: &str,
    g: &Gpu,
    sys: &MolecularSystem,
    atoms: &LocalAtoms,
    coords: &[[f64; 3]],
    setup: &ListSetup,
    prune: bool,
    max_j: usize,
    lists: Lists<'_>,
) {
    let opts = SearchOptions { max_j_per_entry: max_j, ..SearchOptions::new(setup.rlist) };
    let search = PairSearch::build(atoms, &opts).unwrap_or_else(|e| panic!("{test}: {e}"));
    let mut nb = if let Lists::GpuSearch | Lists::Resident(_) = lists {
        assert_eq!(max_j, SearchOptions::new(setup.rlist).max_j_per_entry, "{test}: the GPU search splits entries at the default length");
        let stream = g.ctx.new_stream().unwrap();
        let nb = match lists {
            Lists::Resident(raw) => {
                let mut nb = NbnxmGpu::new_resident(g.module.clone(), &lj_table(sys), setup, atoms.box_size).unwrap();
                let xd = DeviceBuffer::from_host(&g.ctx, raw).unwrap();
                let td = DeviceBuffer::from_host(&g.ctx, &atoms.types).unwrap();
                nb.update_resident(&xd, &td, raw.len(), atoms.box_size, &stream).unwrap_or_else(|e| panic!("{test}: {e}"));
                let wrapped = xd.to_host().unwrap();
                let bits = |p: &Float3| [p.x, p.y, p.z].map(f32::to_bits);
                assert!(wrapped.iter().zip(&atoms.positions).all(|(p, q)| bits(p) == bits(q)), "{test}: coordinates wrapped on the GPU");
                assert_eq!(nb.read_grid().unwrap(), search.grid, "{test}: the GPU grid");
                nb
            }
            _ => NbnxmGpu::new_on_gpu(g.module.clone(), &search.grid, &lj_table(sys), setup, atoms.box_size, &stream)
                .unwrap_or_else(|e| panic!("{test}: {e}")),
        };
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
    // The launch order, sorted on the GPU or on the host: longest entry first, stable.
    for (kind, list) in [(ListKind::Local, &search.local), (ListKind::NonLocal, &search.nonlocal)] {
        assert_eq!(nb.read_order(kind).unwrap(), entry_order(&list.entries), "{test} {kind:?}: launch order");
    }
    let n = atoms.len();
    let x = DeviceBuffer::from_host(&g.ctx, &atoms.positions).unwrap();

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
    let ri = f64::from(setup.rlist_inner);
    let inner_bounds =
        |list| (prune_reference(&search.grid, list, coords, ri * (1.0 - 1e-5)), prune_reference(&search.grid, list, coords, ri * (1.0 + 1e-5)));
    let bounds = [inner_bounds(&search.local), inner_bounds(&search.nonlocal)];
    let outer = [&search.local.j_list, &search.nonlocal.j_list];

    for (kernel, warps) in NbnxmKernel::ALL.into_iter().flat_map(|k| warp_counts().into_iter().map(move |w| (k, w))) {
        nb.set_kernel(kernel);
        nb.set_warps(warps).unwrap();
        let used = nb.warps_per_entry();
        let test = format!("{test} [{kernel}, {warps} warps: {used:?}]");
        // Forces start at known values; the guard entries after the array are NaN and must stay so.
        let start: Vec<Float3> = (0..n + GUARD)
            .map(|i| if i < n { Float3::new(0.5 * (i % 7) as f32, -0.25 * (i % 5) as f32, 1.0) } else { Float3::new(f32::NAN, f32::NAN, f32::NAN) })
            .collect();
        let f = DeviceBuffer::from_host(&g.ctx, &start).unwrap();
        let stream = g.ctx.new_stream().unwrap();
        // Every kernel launched to overlap the one before it, as the MD step's local stream
        // launches them: the forces read the inner list the prune just wrote (poisoned before),
        // and the next list's prune follows the forces, so a kernel that did not wait would show
        // here.
        let acc = DeviceBuffer::from_host(&g.ctx, &[ENERGY_POISON]).unwrap();
        let slot = EnergySlot::new(&acc, 0).unwrap();
        for kind in [ListKind::Local, ListKind::NonLocal] {
            if prune {
                nb.poison_inner(kind).unwrap();
                nb.prune(kind, &x, &stream, Launch::AfterKernel).unwrap();
            }
            nb.forces_into(kind, &x, &f, &stream, Some(slot), Launch::AfterKernel).unwrap();
        }
        stream.synchronize().unwrap();
        let got = f.to_host().unwrap();
        let energy = acc.to_host().unwrap()[0] - ENERGY_POISON;
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
            // Inner lists: every bit the f64 reference keeps a hair inside rlist_inner, and none it
            // drops a hair outside; the cluster index of every word as in the outer list.
            for (k, kind) in [ListKind::Local, ListKind::NonLocal].into_iter().enumerate() {
                let inner = nb.read_j_list(kind, true).unwrap();
                let (lo, hi) = &bounds[k];
                assert_eq!(inner.len(), outer[k].len());
                for (w, (((g0, l0), h0), o)) in inner.iter().zip(lo).zip(hi).zip(outer[k]).enumerate() {
                    assert_eq!(g0 & !MASK, o & !MASK, "{test}: inner word {w} not written (or the wrong cluster)");
                    assert!(g0 & l0 == *l0 && g0 & !h0 == 0, "{test}: inner word {w}: GPU {g0:#x}, reference between {l0:#x} and {h0:#x}");
                }
            }
        }
        eprintln!("{test}: {n} atoms ({} home), worst force error {worst:.2e}, energy {energy:.3} vs {want_e:.3}", atoms.home);
    }
}

fn setup(cutoff: f32, buffer: f32) -> ListSetup {
    ListSetup::new(cutoff, 100, cutoff + buffer, 10, cutoff + buffer.min(0.05)).unwrap()
}

/// Every rank of a decomposition of `sys`, with and without pruning.
fn decomposed_system(test: &str, sys: &MolecularSystem, dims: [usize; 3], ranks: &[usize], max_j: usize) {
    let Some(g) = gpu(test) else { return };
    let s = setup(1.0, 0.2);
    let plan = HaloPlan::build(sys, RankGrid::new(dims).unwrap(), s.rlist).unwrap();
    let coords = exchange_coordinates_f64(&plan, sys).unwrap();
    for &r in ranks {
        let local = LocalAtoms::from_plan(&plan, r, &sys.positions, &sys.types).unwrap();
        for prune in [false, true] {
            check(&format!("{test} rank {r} prune {prune}"), &g, sys, &local, &coords[r], &s, prune, max_j);
        }
        if max_j == SearchOptions::new(s.rlist).max_j_per_entry {
            check_with(&format!("{test} rank {r} GPU search"), &g, sys, &local, &coords[r], &s, true, max_j, Lists::GpuSearch);
        }
    }
}

fn decomposed(test: &str, atoms: usize, dims: [usize; 3], ranks: &[usize]) {
    decomposed_system(test, &MolecularSystem::generate(atoms, 13).unwrap(), dims, ranks, 32);
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

/// Entries of up to 100 words (a warp of one or two walks several rounds of 32), of 5 words and of
/// one word (most warps of a block get none).
#[test]
fn long_and_short_entries() {
    let sys = MolecularSystem::generate(6000, 17).unwrap();
    let s = setup(1.0, 0.2);
    let plan = HaloPlan::build(&sys, RankGrid::new([2, 1, 1]).unwrap(), s.rlist).unwrap();
    let local = LocalAtoms::from_plan(&plan, 0, &sys.positions, &sys.types).unwrap();
    // The lists must hold what the test is about: entries longer than 64 words (three rounds with
    // one warp, two with two), and of exactly one word.
    let longest = |max_j: usize| {
        let search = PairSearch::build(&local, &SearchOptions { max_j_per_entry: max_j, ..SearchOptions::new(s.rlist) }).unwrap();
        search.local.entries.iter().chain(&search.nonlocal.entries).map(|e| e.j_end - e.j_start).max().unwrap_or(0)
    };
    assert!(longest(100) > 64, "no entry of more than 64 words: {}", longest(100));
    assert_eq!(longest(1), 1);
    decomposed_system("nbnxm_6000_long_entries", &sys, [2, 1, 1], &[0], 100);
    decomposed_system("nbnxm_6000_short_entries", &sys, [1, 1, 1], &[0], 5);
    decomposed_system("nbnxm_6000_one_word_entries", &sys, [2, 1, 1], &[0], 1);
}

/// A 6,000-atom system with `ntypes` atom types of random σ and ε, the atoms' types random.
fn random_types(ntypes: u8, seed: u64) -> MolecularSystem {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut sys = MolecularSystem::generate(6000, 23).unwrap();
    sys.atom_types = (0..ntypes)
        .map(|k| AtomType {
            name: format!("T{k}"),
            mass: 12.0 + 4.0 * rng.random::<f64>(),
            sigma: 0.17 + 0.03 * rng.random::<f64>(),
            epsilon: 0.3 + 0.6 * rng.random::<f64>(),
        })
        .collect();
    for t in &mut sys.types {
        *t = rng.random_range(0..ntypes);
    }
    sys
}

/// Five atom types (the table lookup by type pair, rows of 5), and the most the shared-memory
/// table takes, 32 (the partials of 16 warps then start after an 8 KiB table).
#[test]
fn random_atom_types() {
    decomposed_system("nbnxm_6000_five_types", &random_types(5, 99), [2, 1, 1], &[0, 1], 32);
    decomposed_system("nbnxm_6000_32_types", &random_types(32, 7), [2, 1, 1], &[0], 32);
}

#[test]
fn eight_ranks_45000_atoms_2x2x2() {
    decomposed("nbnxm_45000_2x2x2", 45_000, [2, 2, 2], &[0, 7]);
}

/// The GPU search (both passes) against the host search at the MD step's list cutoffs (the drift
/// buffer of nstlist 100 and 50 at the default tolerance), on one rank and on ranks with halos, and
/// its time beside the host's (printed, not asserted).
#[test]
fn gpu_search_equals_the_host_search() {
    let Some(g) = gpu("nbnxm_gpu_search") else { return };
    // gpu_md's mixed-pulse case (1500 atoms, seed 5, 4x2x2, cutoff 0.7: two pulses in x, one in y
    // and z) at the rule's list cutoff and at its explicit 0.9 nm, rank 15 (GPU run 4's failure).
    let mixed = MolecularSystem::generate(1500, 5).unwrap();
    let rule = ListSetup::for_system(&mixed, 0.7, 0.002, 20, 10, DEFAULT_DRIFT_TOLERANCE).unwrap();
    let cases = [(6000, 21, 1.0), (45_000, 21, 1.0), (1500, 5, 0.7)];
    for (atoms, seed, cutoff) in cases {
        let sys = if atoms == 1500 { mixed.clone() } else { MolecularSystem::generate(atoms, seed).unwrap() };
        for nstlist in [100, 50] {
            let s = match cutoff < 1.0 {
                false => ListSetup::for_system(&sys, cutoff, 0.002, nstlist, 10, DEFAULT_DRIFT_TOLERANCE).unwrap(),
                true if nstlist == 100 => rule,
                true => ListSetup::new(0.7, 20, 0.9, 10, 0.8).unwrap(),
            };
            let grids: &[[usize; 3]] = if cutoff < 1.0 { &[[4, 2, 2]] } else { &[[1, 1, 1], [2, 1, 1], [2, 2, 1]] };
            for &dims in grids {
                let plan = HaloPlan::build(&sys, RankGrid::new(dims).unwrap(), s.rlist).unwrap();
                let r = plan.ranks.len() - 1;
                let local = LocalAtoms::from_plan(&plan, r, &sys.positions, &sys.types).unwrap();
                let search = PairSearch::build(&local, &SearchOptions::new(s.rlist)).unwrap();
                let stream = g.ctx.new_stream().unwrap();
                let mut nb = NbnxmGpu::new_on_gpu(g.module.clone(), &search.grid, &lj_table(&sys), &s, sys.box_size, &stream).unwrap();
                let t = std::time::Instant::now();
                nb.update_on_gpu(&search.grid, sys.box_size, &stream).unwrap();
                let gpu_ms = t.elapsed().as_secs_f64() * 1e3;
                let test = format!("gpu search {atoms} atoms rlist {} {dims:?} rank {r}", s.rlist);
                for (kind, list) in [(ListKind::Local, &search.local), (ListKind::NonLocal, &search.nonlocal)] {
                    assert_eq!(nb.read_entries(kind).unwrap(), list.entries, "{test} {kind:?}");
                    assert_eq!(nb.read_j_list(kind, false).unwrap(), list.j_list, "{test} {kind:?}");
                    assert_eq!(nb.read_order(kind).unwrap(), entry_order(&list.entries), "{test} {kind:?}: the GPU's launch order");
                }
                eprintln!(
                    "{test}: {} + {} words; GPU search {gpu_ms:.2} ms (upload, both passes, GPU layout), host lists {:.2} ms",
                    search.local.j_list.len(),
                    search.nonlocal.j_list.len(),
                    search.timing.lists.as_secs_f64() * 1e3
                );
            }
        }
    }
}

/// Counts of `items` items (2 each) for the layout check: `pick(rng)` per count.
fn layout_counts(items: usize, rng: &mut rand_chacha::ChaCha8Rng, pick: &dyn Fn(&mut rand_chacha::ChaCha8Rng) -> u32) -> Vec<u32> {
    (0..2 * items).map(|_| pick(rng)).collect()
}

/// The lists' layout on the GPU (`DeviceLayout::lay_out`, the `nbnxm_layout_*` kernels) against
/// the host's `layout` of the same counts: every word offset and entry, after poisoning the outputs
/// (and a guard after each, which must stay poisoned), for one item, item counts on and off the
/// tile size, counts of 0, 1, `max_j` - 1, `max_j`, `max_j` + 1, `2 max_j`, `2 max_j` + 1 and
/// random ones, `max_j` of 0 (read as 1), 1, 5, 32 and more than any count, 1, 9 and 27 shifts,
/// 20,000 to 1,000,000 items; the layout's scan buffers are reused from case to case (largest
/// first, so stale sums sit beyond the smaller cases' tiles). Then the errors: outputs too small
/// (nothing written) and a list of more words than a `u32` addresses.
#[test]
fn gpu_layout_equals_the_host_layout() {
    use halo::abi::{NBNXM_LAYOUT_TILE, NbnxmEntry, NbnxmShift};
    use halo_md::nbnxm::gpu_search::{DeviceLayout, layout};
    use rand::{Rng, SeedableRng};
    let Some(g) = gpu("nbnxm_gpu_layout") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let mut dl = DeviceLayout::new(&g.module).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x1a70);
    let tile = NBNXM_LAYOUT_TILE as usize;
    let all_shifts: Vec<u32> = (0..27).collect();
    let edges = |m: u32| {
        move |r: &mut rand_chacha::ChaCha8Rng| {
            let e = [0, 1, m.saturating_sub(1), m, m + 1, 2 * m, 2 * m + 1, r.random_range(0..200)];
            e[r.random_range(0..e.len())]
        }
    };
    // (name, counts, shift indices, max_j)
    let mut cases: Vec<(String, Vec<u32>, Vec<u32>, usize)> = vec![
        ("1e6 items, small counts".into(), layout_counts(1_000_000, &mut rng, &|r| r.random_range(0..6)), vec![13], 32),
        ("80k items (180k atoms)".into(), layout_counts(80_000, &mut rng, &|r| r.random_range(0..120)), all_shifts.clone(), 32),
        (
            "20k items, mostly empty".into(),
            layout_counts(20_007, &mut rng, &|r| if r.random_range(0..10) == 0 { r.random_range(1..300) } else { 0 }),
            vec![4, 13, 22],
            32,
        ),
        ("one item".into(), vec![5, 0], vec![13], 32),
        ("one empty item".into(), vec![0, 0], vec![13], 32),
        ("one item, both lists long".into(), vec![65, 64], vec![7], 32),
    ];
    for (max_j, items) in [(32, 3 * tile + 17), (32, tile), (5, tile - 1), (1, 2 * tile + 1), (0, 700), (1 << 20, 5000)] {
        let m = (max_j as u32).clamp(1, 1000);
        // Items need not be a whole number of superclusters' shifts: the last supercluster's are cut.
        let shifts = if items % 2 == 0 { all_shifts[..9].to_vec() } else { all_shifts.clone() };
        cases.push((format!("edges, {items} items, max_j {max_j}"), layout_counts(items, &mut rng, &edges(m)), shifts, max_j));
    }
    const GUARD: usize = 8;
    let poisoned_u32 = |n: usize| {
        let b = DeviceBuffer::<u32>::uninit(&g.ctx, n + GUARD).unwrap();
        b.fill_bytes(0xff).unwrap();
        b
    };
    let poisoned_entries = |n: usize| {
        let b = DeviceBuffer::<NbnxmEntry>::uninit(&g.ctx, n + GUARD).unwrap();
        b.fill_bytes(0xff).unwrap();
        b
    };
    let poison = NbnxmEntry { sci: u32::MAX, shift: u32::MAX, j_start: u32::MAX, j_end: u32::MAX };
    for (name, counts, shift_index, max_j) in &cases {
        let items = counts.len() / 2;
        let want = layout(counts, shift_index, *max_j);
        let d_counts = DeviceBuffer::from_host(&g.ctx, counts).unwrap();
        let d_shifts =
            DeviceBuffer::from_host(&g.ctx, &shift_index.iter().map(|&index| NbnxmShift { v: [0.0; 3], index }).collect::<Vec<_>>()).unwrap();
        let offsets = poisoned_u32(2 * items);
        let entries = [poisoned_entries(want.entries[0].len()), poisoned_entries(want.entries[1].len())];
        // The uploads and poisoning above are synchronous copies and memsets that may still be in
        // flight: order them before the layout's stream.
        g.ctx.synchronize().unwrap();
        let t = std::time::Instant::now();
        let totals = dl
            .lay_out(&g.module, &d_counts, items, &d_shifts, shift_index.len(), *max_j, &offsets, [&entries[0], &entries[1]], &stream)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let ms = t.elapsed().as_secs_f64() * 1e3;
        assert_eq!(totals.words, want.words, "{name}: words");
        assert_eq!(totals.entries, [want.entries[0].len(), want.entries[1].len()], "{name}: entries");
        let got = offsets.to_host().unwrap();
        if let Some(i) = (0..2 * items).find(|&i| got[i] != want.offsets[i]) {
            panic!("{name}: offset {i} (item {}, list {}) is {}, the host's {}", i / 2, i % 2, got[i], want.offsets[i]);
        }
        assert!(got[2 * items..].iter().all(|&w| w == u32::MAX), "{name}: an offset written past the items");
        for (kind, buf) in entries.iter().enumerate() {
            let got = buf.to_host().unwrap();
            let n = want.entries[kind].len();
            if let Some(i) = (0..n).find(|&i| got[i] != want.entries[kind][i]) {
                panic!("{name}: list {kind} entry {i} is {:?}, the host's {:?}", got[i], want.entries[kind][i]);
            }
            assert!(got[n..].iter().all(|e| *e == poison), "{name}: list {kind}: an entry written past the {n}");
        }
        eprintln!("gpu layout {name}: {items} items, {:?} words, {:?} entries, {ms:.3} ms", totals.words, totals.entries);
    }

    // Outputs too small: an error, nothing written.
    let counts = layout_counts(3000, &mut rng, &|r| r.random_range(0..100));
    let want = layout(&counts, &[13], 32);
    let d_counts = DeviceBuffer::from_host(&g.ctx, &counts).unwrap();
    let d_shifts = DeviceBuffer::from_host(&g.ctx, &[NbnxmShift { v: [0.0; 3], index: 13 }]).unwrap();
    let offsets = poisoned_u32(2 * 3000);
    let short = DeviceBuffer::<NbnxmEntry>::uninit(&g.ctx, want.entries[0].len() - 1).unwrap();
    short.fill_bytes(0xff).unwrap();
    let fine = poisoned_entries(want.entries[1].len());
    let small_offsets = poisoned_u32(10);
    g.ctx.synchronize().unwrap();
    let e = dl.lay_out(&g.module, &d_counts, 3000, &d_shifts, 1, 32, &offsets, [&short, &fine], &stream).unwrap_err().to_string();
    assert!(e.contains("room"), "{e}");
    assert!(short.to_host().unwrap().iter().all(|x| *x == poison) && offsets.to_host().unwrap().iter().all(|&w| w == u32::MAX), "written: {e}");
    let e = dl.lay_out(&g.module, &d_counts, 3000, &d_shifts, 1, 32, &small_offsets, [&fine, &fine], &stream).unwrap_err().to_string();
    assert!(e.contains("offsets"), "{e}");

    // More words than a u32 addresses: a clear error from the totals.
    let huge = DeviceBuffer::from_host(&g.ctx, &[u32::MAX, 0, 0, 0, 1, 0]).unwrap();
    g.ctx.synchronize().unwrap();
    let e = dl.lay_out(&g.module, &huge, 3, &d_shifts, 1, 32, &offsets, [&fine, &fine], &stream).unwrap_err().to_string();
    assert!(e.contains("4294967296") && e.contains("u32"), "{e}");
}

/// The launch order on the GPU (`DeviceOrder::build`, the `nbnxm_order_*` kernels) against the
/// host's `entry_order` of the same entries, the output poisoned (with a guard after it, which must
/// stay poisoned): 0 and 1 entries, entry counts on and off the tile size, up to 100,000 entries,
/// random lengths `1..=max_j` for `max_j` 1, 5, 32 and 64 (the most the kernels sort), all of one
/// length (the identity), lengths 1 and `max_j` only, runs of one length (whole warps of one key);
/// the count buffer is reused from case to case. Then the errors: `max_j` beyond 64, buffers
/// shorter than the entries.
#[test]
fn gpu_order_equals_the_host_order() {
    use halo::abi::{NBNXM_ORDER_MAX_J, NBNXM_ORDER_TILE, NbnxmEntry};
    use halo_md::nbnxm::DeviceOrder;
    use rand::{Rng, SeedableRng};
    let Some(g) = gpu("nbnxm_gpu_order") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let mut order = DeviceOrder::new(&g.module).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x0de7);
    let tile = NBNXM_ORDER_TILE as usize;
    // Entries of the given lengths, at random places of a list (the order reads only the lengths).
    let entries_of = |lengths: Vec<u32>, rng: &mut rand_chacha::ChaCha8Rng| -> Vec<NbnxmEntry> {
        lengths
            .into_iter()
            .map(|len| {
                let start = rng.random_range(0..1_000_000u32);
                NbnxmEntry { sci: rng.random_range(0..5000), shift: rng.random_range(0..27), j_start: start, j_end: start + len }
            })
            .collect()
    };
    let max = NBNXM_ORDER_MAX_J;
    // (name, lengths, max_j)
    let mut cases: Vec<(String, Vec<u32>, u32)> = vec![
        ("no entries".into(), vec![], 32),
        ("one entry".into(), vec![7], 32),
        ("one entry of max_j".into(), vec![max], max),
        ("all of one length".into(), vec![32; 3 * tile + 5], 32),
        ("lengths 1 and max_j".into(), (0..5000).map(|_| if rng.random_bool(0.5) { 1 } else { 32 }).collect(), 32),
        ("runs of one length".into(), (0..4000u32).map(|i| if (i / 96) % 2 == 0 { 32 } else { 1 + i % 4 }).collect(), 32),
    ];
    for (n, max_j) in [(100_000, 32), (3 * tile + 17, 32), (tile + 1, max), (tile, 5), (tile - 1, 32), (31, 1), (33, 64), (20_000, 64), (4321, 2)] {
        cases.push((format!("random, {n} entries, max_j {max_j}"), (0..n).map(|_| rng.random_range(1..=max_j)).collect(), max_j));
    }
    const GUARD: usize = 8;
    for (name, lengths, max_j) in cases {
        let entries = entries_of(lengths, &mut rng);
        let n = entries.len();
        let want = entry_order(&entries);
        let d_entries = DeviceBuffer::from_host(&g.ctx, &entries).unwrap();
        let out = DeviceBuffer::<u32>::uninit(&g.ctx, n + GUARD).unwrap();
        out.fill_bytes(0xff).unwrap();
        // The upload and the poisoning are synchronous copies that may still be in flight: order
        // them before the stream's passes.
        g.ctx.synchronize().unwrap();
        let t = std::time::Instant::now();
        order.build(&g.module, &d_entries, n, max_j as usize, &out, &stream).unwrap_or_else(|e| panic!("{name}: {e}"));
        stream.synchronize().unwrap();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let got = out.to_host().unwrap();
        if let Some(b) = (0..n).find(|&b| got[b] != want[b]) {
            let len = |i: u32| entries[i as usize].j_end - entries[i as usize].j_start;
            panic!(
                "{name}: block {b} runs entry {} (length {}), the host's order {} (length {})",
                got[b],
                len(got[b].min(n as u32 - 1)),
                want[b],
                len(want[b])
            );
        }
        assert!(got[n..].iter().all(|&v| v == u32::MAX), "{name}: a place written past the {n} entries");
        eprintln!("gpu order {name}: {n} entries, {ms:.3} ms");
    }

    // Entries longer than the kernels sort, and buffers too short: errors, nothing written.
    let entries = entries_of(vec![3; 100], &mut rng);
    let d_entries = DeviceBuffer::from_host(&g.ctx, &entries).unwrap();
    let out = DeviceBuffer::<u32>::uninit(&g.ctx, 100).unwrap();
    out.fill_bytes(0xff).unwrap();
    let short = DeviceBuffer::<u32>::uninit(&g.ctx, 99).unwrap();
    g.ctx.synchronize().unwrap();
    let e = order.build(&g.module, &d_entries, 100, max as usize + 1, &out, &stream).unwrap_err().to_string();
    assert!(e.contains("at most 64 words"), "{e}");
    let e = order.build(&g.module, &d_entries, 100, 32, &short, &stream).unwrap_err().to_string();
    assert!(e.contains("room for 99"), "{e}");
    let e = order.build(&g.module, &d_entries, 101, 32, &out, &stream).unwrap_err().to_string();
    assert!(e.contains("100 entries"), "{e}");
    stream.synchronize().unwrap();
    assert!(out.to_host().unwrap().iter().all(|&v| v == u32::MAX), "written after an error");
}

/// The whole search step on the GPU (`update_resident`: wrap in place, grid, lists) on one rank,
/// then the forces, energy and prune on its lists against the references, with every kernel design
/// and warp count; some atoms start outside the box.
#[test]
fn resident_search_forces() {
    let Some(g) = gpu("nbnxm_resident") else { return };
    for (atoms, seed) in [(6000, 51), (45_000, 52)] {
        let sys = MolecularSystem::generate(atoms, seed).unwrap();
        let s = setup(1.0, 0.2);
        let raw: Vec<Float3> = sys
            .positions
            .iter()
            .enumerate()
            .map(|(i, p)| if i % 4 == 0 { Float3::new(p.x - 2.0 * sys.box_size[0], p.y + sys.box_size[1], p.z + 0.5) } else { *p })
            .collect();
        let types: Vec<u32> = sys.types.iter().map(|&t| u32::from(t)).collect();
        let local = LocalAtoms::single_rank(&raw, &types, sys.atom_types.len(), sys.box_size).unwrap();
        let coords: Vec<[f64; 3]> = local.positions.iter().map(|p| [p.x, p.y, p.z].map(f64::from)).collect();
        check_with(&format!("nbnxm_{atoms}_resident"), &g, &sys, &local, &coords, &s, true, 32, Lists::Resident(&raw));
    }
}

/// Hand-placed atoms in a 4 nm box (all home, every dimension periodic).
fn custom(test: &str, g: &Gpu, positions: &[Float3], cutoff: f32, buffer: f32) {
    let sys = MolecularSystem::generate(positions.len().max(1), 2).unwrap();
    let types: Vec<u32> = (0..positions.len()).map(|i| (i % 2) as u32).collect();
    let atoms = LocalAtoms::single_rank(positions, &types, 2, [4.0; 3]).unwrap();
    let coords: Vec<[f64; 3]> = atoms.positions.iter().map(|p| [p.x, p.y, p.z].map(f64::from)).collect();
    let mut sys4 = sys.clone();
    sys4.box_size = [4.0; 3];
    check(test, g, &sys4, &atoms, &coords, &setup(cutoff, buffer), true, 32);
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
    custom("nbnxm_at_cutoff", &g, &edge, 1.0, 0.1);
    // No pair within the cutoff at all: forces unchanged, energy zero.
    let far = vec![Float3::new(0.5, 0.5, 0.5), Float3::new(2.5, 2.5, 2.5)];
    custom("nbnxm_no_pairs", &g, &far, 1.0, 0.1);
    // A rank without halo: the non-local list is empty and its launches do nothing.
    let sys = MolecularSystem::generate(6000, 3).unwrap();
    let types: Vec<u32> = sys.types.iter().map(|&t| u32::from(t)).collect();
    let atoms = LocalAtoms::single_rank(&sys.positions, &types, 2, sys.box_size).unwrap();
    let search = PairSearch::build(&atoms, &SearchOptions::new(1.1)).unwrap();
    assert!(search.nonlocal.is_empty());
    let mut nb = NbnxmGpu::new(g.module.clone(), &search, &lj_table(&sys), &setup(1.0, 0.1), sys.box_size).unwrap();
    let x = DeviceBuffer::from_host(&g.ctx, &atoms.positions).unwrap();
    let stream = g.ctx.new_stream().unwrap();
    for kernel in NbnxmKernel::ALL {
        nb.set_kernel(kernel);
        let f = DeviceBuffer::from_host(&g.ctx, &vec![Float3::new(1.0, 2.0, 3.0); atoms.len()]).unwrap();
        nb.forces(ListKind::NonLocal, &x, &f, &stream, true).unwrap();
        stream.synchronize().unwrap();
        assert!(f.to_host().unwrap().iter().all(|v| *v == Float3::new(1.0, 2.0, 3.0)), "{kernel}");
        assert_eq!(nb.energy().unwrap(), 0.0, "{kernel}");
        // Arrays shorter than the lists index are refused.
        let short = DeviceBuffer::<Float3>::zeroed(&g.ctx, 10).unwrap();
        assert!(nb.forces(ListKind::Local, &short, &f, &stream, false).is_err(), "{kernel}");
    }
    // Warp counts a launch cannot take are refused before any launch.
    for bad in [0, 17] {
        let e = nb.set_warps(WarpsPerEntry::Fixed(bad)).unwrap_err().to_string();
        assert!(e.contains("1 to 16"), "{e}");
    }
    // More atom types than the shared-memory table holds: a clear error, not a failed launch.
    let many = vec![[0.0f32; 2]; 33 * 33];
    let e = NbnxmGpu::new(g.module.clone(), &search, &many, &setup(1.0, 0.1), sys.box_size).err().expect("33 types accepted").to_string();
    assert!(e.contains("at most 32 atom types"), "{e}");
}

/// Median GPU time (µs) of `reps` launches of `body`, each between its own pair of CUDA events,
/// after 3 warm-up launches. When the kernel is shorter than the host's launch latency the GPU
/// waits for each launch, and the time includes that wait.
fn per_launch_us(g: &Gpu, stream: &Arc<cudarc::driver::CudaStream>, reps: usize, body: &mut dyn FnMut()) -> f64 {
    for _ in 0..3 {
        body();
    }
    let marks: Vec<_> = (0..reps)
        .map(|_| {
            let (a, b) = (event(g), event(g));
            a.record(stream).unwrap();
            body();
            b.record(stream).unwrap();
            (a, b)
        })
        .collect();
    stream.synchronize().unwrap();
    let mut t: Vec<f64> = marks.iter().map(|(a, b)| f64::from(a.elapsed_ms(b).unwrap()) * 1e3).collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn event(g: &Gpu) -> cudarc::driver::CudaEvent {
    g.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).unwrap()
}

/// How long the GPU is held before a back-to-back series, so that the host has queued the whole
/// series before the first launch runs.
const HOLD_NS: u64 = 3_000_000;

/// GPU time (µs) per launch of `reps` launches of `body` back to back between one pair of CUDA
/// events, queued behind a [`HOLD_NS`] spin on the same stream: the GPU runs them one after the
/// other without waiting for the host (as in the MD step, whose launches are queued ahead). The
/// flag is false when the host took longer to queue them than the spin lasted (then the time may
/// include host latency).
fn back_to_back_us(g: &Gpu, stream: &Arc<cudarc::driver::CudaStream>, reps: usize, body: &mut dyn FnMut()) -> (f64, bool) {
    body();
    let (a, b) = (event(g), event(g));
    halo::kernels::spin_delay(&g.module, stream, HOLD_NS).unwrap();
    let queued = std::time::Instant::now();
    a.record(stream).unwrap();
    for _ in 0..reps {
        body();
    }
    b.record(stream).unwrap();
    let hidden = queued.elapsed().as_nanos() < u128::from(HOLD_NS) * 8 / 10;
    stream.synchronize().unwrap();
    (f64::from(a.elapsed_ms(&b).unwrap()) * 1e3 / reps as f64, hidden)
}

/// One list's times for one design and warp count: `[prune, forces, forces + energy]`, per launch
/// between its own events and back to back.
struct Times {
    kernel: NbnxmKernel,
    warps: u32,
    per_launch: [f64; 3],
    back_to_back: [f64; 3],
    hidden: bool,
}

/// GPU times of every design at every warp count from 1 to 16 (powers of two): 6,000, 45,000 and
/// 180,000 atoms, one rank and rank 0 of 2x1x1, buffers from the drift estimate (nstlist 100,
/// nstprune 10, 0.005 kJ/mol/ps per atom). Per list: prune, forces on the inner list, forces and
/// energy, each timed two ways (see [`per_launch_us`] and [`back_to_back_us`]), 25 launches each.
/// Prints one table (a row per list, design, kernel and timing; a column per warp count, the
/// host rule's count marked `*`), then per list the fastest design and warp count of the forces
/// (back to back) beside the rule's.
#[test]
#[ignore = "benchmark: prints GPU times and checks no result; the gpu-suite `kernel-times` suite runs it (--ignored)"]
fn kernel_times() {
    let Some(g) = gpu("nbnxm_times") else { return };
    const WARPS: [u32; 5] = [1, 2, 4, 8, 16];
    const REPS: usize = 25;
    let mut table = Vec::new();
    let mut summary = Vec::new();
    for atoms in [6_000, 45_000, 180_000] {
        let sys = MolecularSystem::generate(atoms, 13).unwrap();
        let s = ListSetup::for_system(&sys, 1.0, 0.002, 100, 10, DEFAULT_DRIFT_TOLERANCE).unwrap();
        for dims in [[1, 1, 1], [2, 1, 1]] {
            let plan = HaloPlan::build(&sys, RankGrid::new(dims).unwrap(), s.rlist).unwrap();
            let atoms_local = LocalAtoms::from_plan(&plan, 0, &sys.positions, &sys.types).unwrap();
            let search = PairSearch::build(&atoms_local, &SearchOptions::new(s.rlist)).unwrap();
            let mut nb = NbnxmGpu::new(g.module.clone(), &search, &lj_table(&sys), &s, sys.box_size).unwrap();
            let x = DeviceBuffer::from_host(&g.ctx, &atoms_local.positions).unwrap();
            let f = DeviceBuffer::<Float3>::zeroed(&g.ctx, atoms_local.len()).unwrap();
            let stream = g.ctx.new_stream().unwrap();
            let dims_s = format!("{}x{}x{}", dims[0], dims[1], dims[2]);
            eprintln!(
                "nbnxm_times {atoms} atoms {dims_s}: rlist {:.3} nm, rlist_inner {:.3} nm, {} local atoms ({} home), host search {:.1} ms",
                s.rlist,
                s.rlist_inner,
                atoms_local.len(),
                atoms_local.home,
                (search.timing.grid + search.timing.lists).as_secs_f64() * 1e3
            );
            for (kind, list) in [(ListKind::Local, &search.local), (ListKind::NonLocal, &search.nonlocal)] {
                if list.is_empty() {
                    continue;
                }
                nb.set_warps(WarpsPerEntry::Auto).unwrap();
                let auto = nb.warps_per_entry();
                let mut inner = 0;
                let mut times = Vec::new();
                for kernel in NbnxmKernel::ALL {
                    nb.set_kernel(kernel);
                    for w in WARPS {
                        nb.set_warps(WarpsPerEntry::Fixed(w)).unwrap();
                        let mut t = Times { kernel, warps: w, per_launch: [0.0; 3], back_to_back: [0.0; 3], hidden: true };
                        for k in 0..3 {
                            // The prune first: the force kernels then run on the inner list.
                            let mut body = || match k {
                                0 => nb.prune(kind, &x, &stream, Launch::Plain).unwrap(),
                                _ => nb.forces(kind, &x, &f, &stream, k == 2).unwrap(),
                            };
                            t.per_launch[k] = per_launch_us(&g, &stream, REPS, &mut body);
                            let (b2b, hidden) = back_to_back_us(&g, &stream, REPS, &mut body);
                            t.back_to_back[k] = b2b;
                            t.hidden &= hidden;
                        }
                        inner = nb.read_j_list(kind, true).unwrap().iter().map(|w| (w & MASK).count_ones() as usize).sum::<usize>();
                        times.push(t);
                    }
                }
                let words = list.j_list.len();
                let head = format!("{atoms:>7} {dims_s:>5} {:>8} {:>6} {:>7}", format!("{kind:?}"), list.entries.len(), words);
                for kernel in NbnxmKernel::ALL {
                    let mine: Vec<&Times> = times.iter().filter(|t| t.kernel == kernel).collect();
                    for (k, what) in ["prune", "forces", "+energy"].into_iter().enumerate() {
                        for (timing, pick) in [("b2b", true), ("event", false)] {
                            let cells: String = mine
                                .iter()
                                .map(|t| {
                                    let v = if pick { t.back_to_back[k] } else { t.per_launch[k] };
                                    let mark = if t.warps == auto { "*" } else { " " };
                                    let flag = if pick && !t.hidden { "!" } else { " " };
                                    format!(" {v:>7.1}{mark}{flag}")
                                })
                                .collect();
                            table.push(format!("{head} {kernel:>4} {what:>8} {timing:>5}{cells}"));
                        }
                    }
                }
                let best = times.iter().min_by(|a, b| a.back_to_back[1].total_cmp(&b.back_to_back[1])).unwrap();
                let best_prune = times.iter().min_by(|a, b| a.back_to_back[0].total_cmp(&b.back_to_back[0])).unwrap();
                let at_auto =
                    |k: NbnxmKernel, i: usize| times.iter().find(|t| t.kernel == k && t.warps == auto).map_or(f64::NAN, |t| t.back_to_back[i]);
                let (auto_f, auto_p) = (at_auto(NbnxmKernel::DEFAULT, 1), at_auto(NbnxmKernel::DEFAULT, 0));
                summary.push(format!(
                    "nbnxm_times best {atoms} {dims_s} {kind:?} ({} entries, {inner} inner cluster pairs): forces {} W={} {:.1} us ({:.2} Tpair/s), prune {} W={} {:.1} us; \
                     the rule's W={auto} with the default {}: forces {auto_f:.1} us ({:+.0}%), prune {auto_p:.1} us ({:+.0}%)",
                    list.entries.len(),
                    best.kernel,
                    best.warps,
                    best.back_to_back[1],
                    (inner * 64) as f64 / (best.back_to_back[1] * 1e-6) / 1e12,
                    best_prune.kernel,
                    best_prune.warps,
                    best_prune.back_to_back[0],
                    NbnxmKernel::DEFAULT,
                    100.0 * (auto_f / best.back_to_back[1] - 1.0),
                    100.0 * (auto_p / best_prune.back_to_back[0] - 1.0),
                ));
            }
        }
    }
    eprintln!(
        "nbnxm_times: GPU time per launch (us), a column per warp count W (block = 32 W threads per list entry); * = the host rule's W for the list."
    );
    eprintln!(
        "  b2b: {REPS} launches back to back between ONE pair of events, queued behind a {} ms spin so that the host's launch latency is hidden (as in the MD step); total / {REPS}. `!`: the host took longer to queue them than the spin (latency not hidden).",
        HOLD_NS / 1_000_000
    );
    eprintln!(
        "  event: each launch between its own pair of events, median of {REPS}: includes the host's launch latency whenever the GPU waits for the launch."
    );
    let header: String = WARPS.iter().map(|w| format!(" {:>9}", format!("W={w}"))).collect();
    eprintln!("{:>7} {:>5} {:>8} {:>6} {:>7} {:>4} {:>8} {:>5}{header}", "atoms", "dims", "list", "blocks", "words", "kern", "kernel", "time");
    for r in &table {
        eprintln!("{r}");
    }
    for r in &summary {
        eprintln!("{r}");
    }
}

/// How the list's entry shape and launch order change the force kernel's time (no assertion on the
/// times): the 45,000-atom lists (one rank, and rank 0 of 2x1x1) split at 8, 16, 32 (the default)
/// and 64 words per entry, each launched in the product's launch order (longest entry first,
/// `entry_order`: GPU run 40 measured it 5–7 % faster than the search's order at 32 words, when
/// it was still a sorted copy of the list) and in the search's order (`set_order_identity`: block
/// `b` runs entry `b`, so long entries that come late make a tail), the default design at the host
/// rule's warp count and at 1 to 8 warps; prune first, then forces back to back (see
/// [`back_to_back_us`]). The two orders are also checked to give the same forces (within the
/// tolerance: the atomics add in another order).
#[test]
#[ignore = "benchmark: prints GPU times and checks no result; the gpu-suite `kernel-times` suite runs it (--ignored)"]
fn entry_shape_times() {
    let Some(g) = gpu("nbnxm_entry_shapes") else { return };
    const REPS: usize = 25;
    let sys = MolecularSystem::generate(45_000, 13).unwrap();
    let s = ListSetup::for_system(&sys, 1.0, 0.002, 100, 10, DEFAULT_DRIFT_TOLERANCE).unwrap();
    for dims in [[1, 1, 1], [2, 1, 1]] {
        let plan = HaloPlan::build(&sys, RankGrid::new(dims).unwrap(), s.rlist).unwrap();
        let atoms = LocalAtoms::from_plan(&plan, 0, &sys.positions, &sys.types).unwrap();
        let x = DeviceBuffer::from_host(&g.ctx, &atoms.positions).unwrap();
        let f = DeviceBuffer::<Float3>::zeroed(&g.ctx, atoms.len()).unwrap();
        let stream = g.ctx.new_stream().unwrap();
        for max_j in [8, 16, 32, 64] {
            let opts = SearchOptions { max_j_per_entry: max_j, ..SearchOptions::new(s.rlist) };
            let search = PairSearch::build(&atoms, &opts).unwrap();
            let mut nb = NbnxmGpu::new(g.module.clone(), &search, &lj_table(&sys), &s, sys.box_size).unwrap();
            assert_eq!(nb.read_order(ListKind::Local).unwrap(), entry_order(&search.local.entries), "max_j {max_j}: the launch order");
            let mut forces = Vec::new();
            for order in ["longest-first", "search"] {
                if order == "search" {
                    nb.set_order_identity(ListKind::Local).unwrap();
                    assert_eq!(nb.read_order(ListKind::Local).unwrap(), (0..search.local.entries.len() as u32).collect::<Vec<_>>());
                }
                let mut cells = String::new();
                for w in [None, Some(1), Some(2), Some(4), Some(8)] {
                    nb.set_warps(w.map_or(WarpsPerEntry::Auto, WarpsPerEntry::Fixed)).unwrap();
                    let label = w.map_or_else(|| format!("rule W={}", nb.warps_per_entry()), |w| format!("W={w}"));
                    nb.prune(ListKind::Local, &x, &stream, Launch::Plain).unwrap();
                    let (t, hidden) = back_to_back_us(&g, &stream, REPS, &mut || nb.forces(ListKind::Local, &x, &f, &stream, false).unwrap());
                    cells.push_str(&format!("  {label} {t:6.1}{}", if hidden { "" } else { "!" }));
                }
                eprintln!(
                    "nbnxm_entry_shapes 45000 {}x{}x{} Local max_j {max_j:>2} {order:>13}: {} entries, {} words:{cells}",
                    dims[0],
                    dims[1],
                    dims[2],
                    search.local.entries.len(),
                    search.local.j_list.len()
                );
                // One clean launch for the comparison of the two orders.
                nb.set_warps(WarpsPerEntry::Auto).unwrap();
                let fd = DeviceBuffer::<Float3>::zeroed(&g.ctx, atoms.len()).unwrap();
                nb.forces(ListKind::Local, &x, &fd, &stream, false).unwrap();
                stream.synchronize().unwrap();
                forces.push(fd.to_host().unwrap());
            }
            let rms = (forces[0].iter().map(|p| f64::from(p.x * p.x + p.y * p.y + p.z * p.z)).sum::<f64>() / forces[0].len() as f64).sqrt();
            let worst = forces[0]
                .iter()
                .zip(&forces[1])
                .map(|(a, b)| f64::from((a.x - b.x).abs().max((a.y - b.y).abs()).max((a.z - b.z).abs())) / rms)
                .fold(0.0, f64::max);
            assert!(worst < FORCE_TOL, "max_j {max_j}: the launch order changes the forces by {worst:e} of the RMS force");
        }
    }
}
