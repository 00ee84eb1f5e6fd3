//! The home atoms' first-pulse selection on the GPU (`decomp::GpuSelect`, the `select_*` kernels)
//! against the host (`decomp::select_reference`: the redecomposition's own `select_wrapped_into`
//! over the home atoms, which the unit tests tie to the maps `redecompose` builds), bit for bit:
//! per decomposed dimension the count, the selected indices (ascending), ids and wrapped
//! positions read back, and the indices left on the device. On 2x1x1, 1x2x1, 2x2x1, 2x2x2, 3x1x1
//! and 4x1x1 grids with cutoffs of one and two pulses, every rank, 0 to 600,000 atoms (block and
//! scan-run boundaries), atoms anywhere in the box, in the rank's cell, near its faces, and with
//! coordinates exactly where the host's test changes and one float either side
//! (`testing::selection_atoms`), after poisoning the selection's outputs; one `GpuSelect` per rank
//! reused from larger runs to smaller ones. The MD step runs it inside `decomp::GpuHome`
//! (`tests/gpu_redecompose.rs`).

use halo::abi::Float3;
use halo::decomp::{Decomposition, GpuSelect, RankGrid, Selected, select_reference};
use halo::gpu::{CudaContext, CudaStream, DeviceBuffer, DeviceMemory};
use halo::testing::{GpuFixture as Gpu, gpu_or_skip as gpu, selection_atoms};
use std::sync::Arc;

/// Extra poisoned elements after the `n` of every input: nothing may be read there to any effect
/// (the outputs are the selection's own, poisoned before each run through a raw view).
const SLACK: usize = 37;

/// The grids and cutoffs: one pulse along every dimension, and two (3x1x1 at 2.5, 4x1x1 at 2.0).
const CASES: [([usize; 3], f32); 8] =
    [([2, 1, 1], 0.9), ([1, 2, 1], 0.9), ([2, 2, 1], 0.9), ([2, 2, 2], 0.9), ([3, 1, 1], 0.9), ([3, 1, 1], 2.5), ([4, 1, 1], 0.9), ([4, 1, 1], 2.0)];

fn geometry(dims: [usize; 3], cutoff: f32) -> Decomposition {
    Decomposition::new(RankGrid::new(dims).unwrap(), [7.3, 6.1, 5.7], cutoff).unwrap()
}

fn bits(v: &[Float3]) -> Vec<[u32; 3]> {
    v.iter().map(|p| [p.x.to_bits(), p.y.to_bits(), p.z.to_bits()]).collect()
}

/// A view of another buffer's memory (`len` elements from `ptr`): the selection's own outputs,
/// to poison them, and an input aliasing them, to be refused.
struct Raw<T> {
    ptr: u64,
    len: usize,
    ctx: Arc<CudaContext>,
    _t: std::marker::PhantomData<T>,
}

impl<T: bytemuck::Pod> DeviceMemory<T> for Raw<T> {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

fn raw<T>(g: &Gpu, ptr: u64, len: usize) -> Raw<T> {
    Raw { ptr, len, ctx: g.ctx.clone(), _t: std::marker::PhantomData }
}

/// The inputs of one run on the device, `n + SLACK` long (the slack poisoned).
struct Inputs {
    x: DeviceBuffer<Float3>,
    ids: DeviceBuffer<u32>,
}

impl Inputs {
    fn new(g: &Gpu, x: &[Float3], ids: &[u32]) -> Self {
        let mut xs = x.to_vec();
        xs.extend(std::iter::repeat_n(Float3::new(f32::NAN, -1.0, 1e30), SLACK));
        let mut is = ids.to_vec();
        is.extend(std::iter::repeat_n(u32::MAX, SLACK));
        let a = Self { x: DeviceBuffer::from_host(&g.ctx, &xs).unwrap(), ids: DeviceBuffer::from_host(&g.ctx, &is).unwrap() };
        // Pageable uploads may land after a kernel on another stream starts: wait for them.
        g.ctx.synchronize().unwrap();
        a
    }
}

/// Poisons the selection's device maps (the capacity it holds now), so that a stale index of an
/// earlier run cannot pass for a new one.
fn poison(g: &Gpu, sel: &GpuSelect) {
    let m = sel.device_maps();
    raw::<u32>(g, m.device_ptr(), m.len()).fill_bytes(0xFF).unwrap();
    g.ctx.synchronize().unwrap();
}

/// Runs the selection of `x, ids` on `rank` and checks it against the host, bit for bit.
#[allow(clippy::too_many_arguments)]
fn check(test: &str, g: &Gpu, stream: &CudaStream, sel: &mut GpuSelect, geo: &Decomposition, rank: usize, x: &[Float3], ids: &[u32]) -> Selected {
    let n = x.len();
    let want = select_reference(x, ids, geo, rank).unwrap();
    let d = Inputs::new(g, x, ids);
    poison(g, sel);
    let capacity = sel.device_maps().len();
    let got = sel.run(&g.module, stream, &d.x, &d.ids, n).unwrap_or_else(|e| panic!("{test}: {e}"));
    let counts = |s: &Selected| s.per_dim.iter().map(|d| (d.dim, d.map.len())).collect::<Vec<_>>();
    assert_eq!(counts(&got), counts(&want), "{test}: (dimension, count) per decomposed dimension");
    let on_device = sel.device_maps().to_host().unwrap();
    for (s, (g_dim, w_dim)) in got.per_dim.iter().zip(&want.per_dim).enumerate() {
        let along = format!("{test}, along {}", g_dim.dim);
        if let Some(k) = (0..g_dim.map.len()).find(|&k| g_dim.map[k] != w_dim.map[k]) {
            panic!("{along}: entry {k} is atom {} on the GPU, {} on the host", g_dim.map[k], w_dim.map[k]);
        }
        assert!(g_dim.map.windows(2).all(|w| w[0] < w[1]) && g_dim.map.iter().all(|&i| (i as usize) < n), "{along}: ascending indices");
        assert_eq!(g_dim.ids, w_dim.ids, "{along}: ids");
        assert_eq!(bits(&g_dim.positions), bits(&w_dim.positions), "{along}: positions");
        // The indices left on the device are the ones read back.
        let range = sel.slot_range(s);
        assert_eq!(range.len(), g_dim.map.len(), "{along}");
        assert_eq!(on_device[range], g_dim.map[..], "{along}: the maps on the device");
    }
    // Nothing written past the used part of the maps (where the run did not grow them, which
    // would have dropped the poisoned ones).
    let used: usize = got.per_dim.iter().map(|d| d.map.len()).sum();
    if on_device.len() == capacity {
        assert!(on_device[used..].iter().all(|&i| i == u32::MAX), "{test}: written past the selected atoms");
    }
    assert_eq!(bits(&d.x.to_host().unwrap()[..n]), bits(x), "{test}: the input positions changed");
    got
}

#[test]
fn gpu_selection_equals_the_host_on_every_rank() {
    let Some(g) = gpu("gpu_selection_equals_the_host_on_every_rank") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let mut some_unsent = false;
    for (dims, cutoff) in CASES {
        let geo = geometry(dims, cutoff);
        for rank in 0..geo.grid.num_ranks() {
            let mut sel = GpuSelect::new(&g.ctx, &geo, rank).unwrap();
            // Larger runs first, so later ones reuse grown buffers holding stale counts and maps.
            for (n, seed) in [(45_000, 1), (6000, 2), (513, 3), (512, 4), (511, 5), (257, 6), (256, 7), (255, 8), (33, 9), (32, 10), (1, 11), (0, 12)]
            {
                let (x, ids) = selection_atoms(&geo, rank, n, seed + 100 * rank as u64);
                let got = check(&format!("{dims:?} cutoff {cutoff} rank {rank}, {n} atoms"), &g, &stream, &mut sel, &geo, rank, &x, &ids);
                some_unsent |= got.per_dim.iter().any(|d| d.map.len() < n);
            }
        }
        eprintln!("{dims:?} cutoff {cutoff} ({:?} pulses): every rank equals the host", geo.pulses);
    }
    assert!(some_unsent, "some atoms not selected");
}

#[test]
fn gpu_selection_scans_more_blocks_than_the_scan_has_threads() {
    let Some(g) = gpu("gpu_selection_scans_more_blocks_than_the_scan_has_threads") else { return };
    let stream = g.ctx.new_stream().unwrap();
    // 1,025 blocks and more: the scan's threads take runs of two blocks and more.
    for (dims, cutoff, n) in [([2, 2, 1], 0.9, 262_145), ([2, 2, 2], 0.9, 600_000), ([4, 1, 1], 2.0, 600_000)] {
        let geo = geometry(dims, cutoff);
        for rank in [0, geo.grid.num_ranks() - 1] {
            let mut sel = GpuSelect::new(&g.ctx, &geo, rank).unwrap();
            let (x, ids) = selection_atoms(&geo, rank, n, 7 + rank as u64);
            let t = std::time::Instant::now();
            check(&format!("{dims:?} rank {rank}, {n} atoms"), &g, &stream, &mut sel, &geo, rank, &x, &ids);
            eprintln!("{dims:?} rank {rank}, {n} atoms: checked in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
            // The same object again, smaller.
            let (x, ids) = selection_atoms(&geo, rank, 1000, 8 + rank as u64);
            check(&format!("{dims:?} rank {rank}, 1000 atoms after {n}"), &g, &stream, &mut sel, &geo, rank, &x, &ids);
        }
    }
}

#[test]
fn a_grid_of_one_rank_selects_nothing() {
    let Some(g) = gpu("a_grid_of_one_rank_selects_nothing") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let geo = geometry([1, 1, 1], 0.9);
    let mut sel = GpuSelect::new(&g.ctx, &geo, 0).unwrap();
    let (x, ids) = selection_atoms(&geo, 0, 3000, 5);
    let got = check("1x1x1", &g, &stream, &mut sel, &geo, 0, &x, &ids);
    assert_eq!(got, Selected::default());
}

#[test]
fn short_or_overlapping_arrays_are_refused_before_anything_runs() {
    let Some(g) = gpu("short_or_overlapping_arrays_are_refused_before_anything_runs") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let geo = geometry([2, 2, 1], 0.9);
    let mut sel = GpuSelect::new(&g.ctx, &geo, 3).unwrap();
    let (x, ids) = selection_atoms(&geo, 3, 100, 3);
    // A first run grows the outputs; the refusals below must leave them as it left them.
    let first = check("before refusals", &g, &stream, &mut sel, &geo, 3, &x, &ids);
    let d = Inputs::new(&g, &x, &ids);
    let e = sel.run(&g.module, &stream, &d.x, &d.ids, 100 + SLACK + 1).unwrap_err().to_string();
    assert!(e.contains(&format!("GPU selection of {} atoms: `x` holds {}", 100 + SLACK + 1, 100 + SLACK)), "{e}");
    let short = DeviceBuffer::<u32>::uninit(&g.ctx, 50).unwrap();
    let e = sel.run(&g.module, &stream, &d.x, &short, 100).unwrap_err().to_string();
    assert!(e.contains("`ids` holds 50"), "{e}");
    let maps = sel.device_maps();
    let alias = raw::<u32>(&g, maps.device_ptr(), maps.len());
    let e = sel.run(&g.module, &stream, &d.x, &alias, 100).unwrap_err().to_string();
    assert!(e.contains("`ids` overlaps the selection's own `maps`"), "{e}");
    assert!(GpuSelect::new(&g.ctx, &geo, 4).is_err(), "rank 4 of a 2x2x1 grid");
    // Nothing ran: the object selects as before.
    assert_eq!(check("after refusals", &g, &stream, &mut sel, &geo, 3, &x, &ids), first);
}
