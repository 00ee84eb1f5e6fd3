//! What the router's topology state costs per process, measured by the allocator (issue 17: every
//! PE kept every PE's bitmaps, n² bits, 16 MiB per process at 4,096 PEs; the bound is 1 MiB).
//!
//! This test binary installs a counting global allocator. The counters are per thread, so tests
//! running in parallel do not see each other's allocations; everything measured is built and
//! dropped on the measuring thread.

use halo::route::{DistanceLevel, IntraNodeLink, Op, PeFacts, Placement, RouteConfig, Router, Topology, synthetic_facts, topology_from_facts};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(delta: isize) {
    // `try_with`: the allocator is also called while a thread's locals are being torn down.
    let _ = LIVE.try_with(|l| {
        let v = l.get() + delta;
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

// SAFETY: every call is forwarded to the system allocator unchanged; the bookkeeping only reads
// the layout's size and touches thread-local integers (no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout, which the caller guarantees is valid.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc`/`realloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) };
        add(-(layout.size() as isize));
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` and `layout` are the caller's, from this allocator; `new_size` is valid.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            add(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.with(Cell::get)
}

/// Runs `f` and returns what it returned, the bytes it left allocated, and its peak above the start.
fn measure<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    let before = live();
    PEAK.with(|p| p.set(before));
    let out = f();
    let retained = (live() - before).max(0) as usize;
    let peak = (PEAK.with(Cell::get) - before).max(0) as usize;
    (out, retained, peak)
}

const MIB: usize = 1 << 20;

/// 4,096 PEs: 512 nodes of 8 NVLink GPUs, 8 nodes a rack, 4 racks a leaf, 4 leaves a spine, two
/// clusters.
fn facts_4096() -> Vec<PeFacts> {
    let hosts: Vec<String> = (0..512).map(|n| format!("n{n:04}")).collect();
    let mut facts = synthetic_facts(&hosts, 8, 1, IntraNodeLink::Nvlink);
    for (pe, f) in facts.iter_mut().enumerate() {
        let node = pe / 8;
        f.placement = Some(Placement {
            cluster: format!("c{}", node / 256),
            spine: Some(format!("s{}", node / 128)),
            leaf: Some(format!("l{}", node / 32)),
            rack: Some(format!("r{}", node / 8)),
        });
    }
    facts
}

#[test]
fn topology_of_4096_pes_fits_in_one_mib_per_process() {
    let facts = facts_4096();
    let (topo, retained, peak) = measure(|| topology_from_facts(&facts, None).expect("valid"));
    let topo: Topology = topo;
    eprintln!(
        "4096 PEs: topology keeps {retained} B ({:.1} KiB), reports {} B, peak while building {peak} B",
        retained as f64 / 1024.0,
        topo.heap_bytes()
    );
    assert!(retained <= MIB, "topology keeps {retained} B at 4096 PEs, over 1 MiB");
    // The structure's own accounting agrees with the allocator (within a little bookkeeping).
    assert!(
        topo.heap_bytes() <= retained && retained - topo.heap_bytes() <= retained / 8 + 4096,
        "heap_bytes {} vs allocator {retained}",
        topo.heap_bytes()
    );
    // It still answers every level.
    assert_eq!(topo.distance(0, 7).ok(), Some(DistanceLevel::NvLink));
    assert_eq!(topo.distance(0, 8).ok(), Some(DistanceLevel::Rack));
    assert_eq!(topo.distance(0, 64).ok(), Some(DistanceLevel::Leaf));
    assert_eq!(topo.distance(0, 1024).ok(), Some(DistanceLevel::Spine));
    assert_eq!(topo.distance(0, 4095).ok(), Some(DistanceLevel::CrossCluster));
}

/// The router of one PE that has routed to every other PE: topology plus per-peer cache.
#[test]
fn router_of_4096_pes_that_routed_every_peer_fits_in_one_mib() {
    let facts = facts_4096();
    let (router, retained, _) = measure(|| {
        let topo = Arc::new(topology_from_facts(&facts, None).expect("valid"));
        let mut r = Router::new(17, topo, RouteConfig::default()).expect("router");
        for peer in 0..4096 {
            r.route(peer, Op::Put, 16 * 1024).expect("routable");
        }
        r
    });
    eprintln!("4096 PEs: router after 4096 routes keeps {retained} B ({:.1} KiB)", retained as f64 / 1024.0);
    assert!(retained <= MIB, "the router keeps {retained} B at 4096 PEs, over 1 MiB");
    drop(router);
}

/// Doubling the PEs about doubles the state: linear, not quadratic.
#[test]
fn topology_state_grows_linearly() {
    let bytes = |nodes: usize| {
        let hosts: Vec<String> = (0..nodes).map(|n| format!("n{n:05}")).collect();
        let facts = synthetic_facts(&hosts, 8, 1, IntraNodeLink::Nvlink);
        let (t, retained, _) = measure(|| topology_from_facts(&facts, None).expect("valid"));
        drop(t);
        retained
    };
    let (a, b) = (bytes(256), bytes(512));
    eprintln!("2048 PEs: {a} B, 4096 PEs: {b} B");
    assert!(b as f64 <= 2.3 * a as f64, "2048 PEs: {a} B, 4096 PEs: {b} B: not linear");
}
