//! The exchange on the caller's memory and streams (`halo::exchange::caller`, `Exchange::use_streams`),
//! as a simulation code that owns its coordinates and forces runs it: the buffers are the test's
//! own allocations, poisoned, written and read by the test directly, never through the exchange.
//! Part of the `gpu_exchange` binary; run alone with the filter `caller::`.

use super::bits;
use halo::abi::Float3;
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{CallerBuffers, CallerSlice, Exchange, LocalRanks, RankHalo, Transport, reference};
use halo::gpu::{self, CudaContext, CudaStream, DeviceBuffer, DeviceMemory};
use halo::testing::gpu_or_skip;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The application's own x and f per rank, exactly `total_atoms` long (no headroom: halo must
/// not touch past them).
struct Owned {
    x: Vec<DeviceBuffer<Float3>>,
    f: Vec<DeviceBuffer<Float3>>,
}

impl Owned {
    fn new(ctx: &Arc<CudaContext>, halos: &[RankHalo]) -> Self {
        let alloc = || halos.iter().map(|h| DeviceBuffer::<Float3>::uninit(ctx, h.total_atoms).unwrap()).collect();
        Self { x: alloc(), f: alloc() }
    }

    fn lend(&self, ctx: &Arc<CudaContext>) -> Vec<CallerBuffers<Float3>> {
        self.x
            .iter()
            .zip(&self.f)
            // SAFETY: `self` outlives every exchange these build (each test drops the exchange first).
            .map(|(x, f)| unsafe { CallerBuffers::from_raw(ctx, x.device_ptr(), f.device_ptr(), x.len()).unwrap() })
            .collect()
    }

    /// Poisoned (NaN) buffers with the owned coordinates and the initial forces in place, written
    /// by the application, not by the exchange. The writes go through the legacy stream, which the
    /// application's non-blocking streams do not wait for: the device is synchronised after them.
    fn fill(&self, ctx: &CudaContext, home: &[Vec<Float3>], forces: &[Vec<Float3>]) {
        for r in 0..self.x.len() {
            self.x[r].fill_bytes(0xFF).unwrap();
            self.x[r].copy_from_host(&home[r]).unwrap();
            self.f[r].copy_from_host(&forces[r]).unwrap();
        }
        ctx.synchronize().unwrap();
    }
}

/// The application's streams, one per rank, handed over as raw `CUstream`s (what a C++ code holds).
fn app_streams(ctx: &Arc<CudaContext>, n: usize) -> (Vec<Arc<CudaStream>>, Vec<Arc<CudaStream>>) {
    let owned: Vec<Arc<CudaStream>> = (0..n).map(|_| ctx.new_stream().unwrap()).collect();
    // SAFETY: `owned` keeps the streams alive for as long as the borrowed handles are used.
    let borrowed = owned.iter().map(|s| unsafe { gpu::borrow_stream(ctx, s.cu_stream()) }.unwrap()).collect();
    (owned, borrowed)
}

fn check(test: &str, owned: &Owned, halos: &[RankHalo], home: &[Vec<Float3>], forces: &[Vec<Float3>]) {
    let want_x = reference::coordinates(halos, home);
    let want_f = reference::forces(halos, forces);
    for r in 0..halos.len() {
        assert_eq!(bits(&owned.x[r].to_host().unwrap()), bits(&want_x[r]), "{test}: the application's coordinates of rank {r}");
        for (i, (a, b)) in owned.f[r].to_host().unwrap().iter().zip(&want_f[r]).enumerate() {
            for (u, v) in [(a.x, b.x), (a.y, b.y), (a.z, b.z)] {
                assert!(approx::relative_eq!(u, v, epsilon = 1e-5, max_relative = 1e-5), "{test}: force {i} of rank {r}: {u} vs {v}");
            }
        }
    }
}

/// Eight ranks (2x2x2, two pulses per dimension) on the application's buffers and streams, every
/// transport, three steps each with fresh values: the ghosts land in the application's `x`, the
/// halo forces are added into its `f`, bit-exact / to rounding against the CPU reference; and
/// halo allocated no coordinate or force buffer of its own.
#[test]
fn an_exchange_on_the_callers_buffers_and_streams_matches_the_reference() {
    let test = "an_exchange_on_the_callers_buffers_and_streams_matches_the_reference";
    let Some(g) = gpu_or_skip(test) else { return };
    let halos = synthetic::halos(SyntheticShape { grid: [2, 2, 2], pulses_per_dim: 2, home_atoms: 900, send_fraction: 0.3, box_len: 6.0 }, 3);
    let owned = Owned::new(&g.ctx, &halos);
    let before = halo::exchange::memory::allocated_on_this_thread();
    let mut ranks = LocalRanks::<Float3>::with_buffers(halos.clone(), std::slice::from_ref(&g.module), owned.lend(&g.ctx)).unwrap();
    let with_buffers = halo::exchange::memory::allocated_on_this_thread() - before;
    let before = halo::exchange::memory::allocated_on_this_thread();
    drop(LocalRanks::<Float3>::new(halos.clone(), std::slice::from_ref(&g.module)).unwrap());
    let owning = halo::exchange::memory::allocated_on_this_thread() - before;
    let xf = 2 * halos.len() as u64 * (ranks.ranks()[0].sizes().atoms * size_of::<Float3>()) as u64;
    assert_eq!(owning - with_buffers, xf, "{test}: halo still allocated coordinates or forces of its own");
    let (_owned_streams, streams) = app_streams(&g.ctx, halos.len());
    ranks.use_streams(&streams).unwrap();
    for (t, transport) in
        [Transport::Fused, Transport::FusedTma, Transport::PerPulseDirect, Transport::Staged, Transport::DirectCopy].into_iter().enumerate()
    {
        for step in 0..3u64 {
            let seed = 100 * t as u64 + step;
            let (home, forces) = (synthetic::random_values(&halos, seed, true), synthetic::random_values(&halos, seed + 50, false));
            owned.fill(&g.ctx, &home, &forces);
            ranks.exchange_forward(transport).unwrap();
            ranks.exchange_reverse_accumulate(transport).unwrap();
            Exchange::finish(&mut ranks).unwrap_or_else(|e| panic!("{test} {transport:?} step {step}: {e}"));
            check(&format!("{test} {transport:?} step {step}"), &owned, &halos, &home, &forces);
        }
    }
    drop(ranks);
}

/// The exchange runs on the application's stream in its order: work the application enqueued on
/// that stream before the halo (here: the upload of the owned coordinates, asynchronous) is seen
/// by the halo, and work enqueued after it (the read-back) sees the ghosts, with no host wait in
/// between.
#[test]
fn the_exchange_falls_into_the_callers_stream_order() {
    let test = "the_exchange_falls_into_the_callers_stream_order";
    let Some(g) = gpu_or_skip(test) else { return };
    let halos = synthetic::halos(SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: 4000, send_fraction: 0.3, box_len: 6.0 }, 5);
    let owned = Owned::new(&g.ctx, &halos);
    let mut ranks = LocalRanks::<Float3>::with_buffers(halos.clone(), std::slice::from_ref(&g.module), owned.lend(&g.ctx)).unwrap();
    let (_owned_streams, streams) = app_streams(&g.ctx, halos.len());
    ranks.use_streams(&streams).unwrap();
    let home = synthetic::random_values(&halos, 9, true);
    for r in 0..halos.len() {
        owned.x[r].fill_bytes(0xFF).unwrap();
    }
    g.ctx.synchronize().unwrap(); // the poison, on the legacy stream, lands before the streams' work
    let mut staging: Vec<halo::gpu::Staging<Float3>> = (0..halos.len()).map(|_| halo::gpu::Staging::new()).collect();
    for (r, rank) in ranks.ranks().iter().enumerate() {
        rank.upload_coordinates_async(&home[r], &mut staging[r], &streams[r]).unwrap();
    }
    ranks.exchange_forward(Transport::Fused).unwrap();
    let got: Vec<Vec<Float3>> = (0..halos.len()).map(|r| owned.x[r].read_range(0, halos[r].total_atoms, &streams[r]).unwrap()).collect();
    let want = reference::coordinates(&halos, &home);
    for r in 0..halos.len() {
        assert_eq!(bits(&got[r]), bits(&want[r]), "{test}: rank {r}'s coordinates read in the application's stream order");
    }
    Exchange::finish(&mut ranks).unwrap();
    // The exchange goes before the streams it was lent (its drop waits on them).
    drop(ranks);
}

/// Dropping an exchange whose launches (and the caller's work after them) still run on the
/// caller's streams waits for those streams before it frees the buffers the kernels use: a
/// 300 ms spin enqueued after a step's launches, with no `finish`, holds the drop that long. The
/// wait is bounded as `finish`'s: with a 200 ms device deadline (a 3.2 s host budget without
/// progress) and 5 s of work, the drop gives up within the budget and leaks the buffers instead
/// (freeing them would wait for the work: what the drop did before it waited itself).
#[test]
fn dropping_an_exchange_waits_for_the_work_on_its_streams() {
    let test = "dropping_an_exchange_waits_for_the_work_on_its_streams";
    let Some(g) = gpu_or_skip(test) else { return };
    let halos = synthetic::halos(SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: 2000, send_fraction: 0.3, box_len: 6.0 }, 3);
    let owned = Owned::new(&g.ctx, &halos);
    let (_owned_streams, streams) = app_streams(&g.ctx, halos.len());
    for (hold, wait_timeout) in [(Duration::from_millis(300), None), (Duration::from_secs(5), Some(Duration::from_millis(200)))] {
        let mut ranks = LocalRanks::<Float3>::with_buffers(halos.clone(), std::slice::from_ref(&g.module), owned.lend(&g.ctx)).unwrap();
        if let Some(t) = wait_timeout {
            ranks.set_wait_timeout(t);
        }
        ranks.use_streams(&streams).unwrap();
        ranks.exchange_forward(Transport::Fused).unwrap();
        ranks.exchange_reverse_accumulate(Transport::Fused).unwrap();
        halo::kernels::spin_delay(&g.module, &streams[1], hold.as_nanos() as u64).unwrap();
        let t = Instant::now();
        drop(ranks);
        let waited = t.elapsed();
        match wait_timeout {
            None => {
                assert!(halo::gpu::wait::stream_idle(&streams[1]).unwrap(), "{test}: the caller's stream still runs after the drop");
                assert!(waited >= hold * 9 / 10, "{test}: the drop returned after {waited:?}, before the {hold:?} of work on the stream");
            }
            Some(_) => {
                assert!(waited < Duration::from_millis(4500), "{test}: the drop waited {waited:?} for {hold:?} of work, past its 3.2 s budget");
                streams[1].synchronize().unwrap(); // the work ends; the context is usable again
            }
        }
    }
}

/// Buffers that cannot hold a rank's layout, a stream given to two ranks, and a pointer the
/// driver does not know are refused with errors that name the rank and the fix.
#[test]
fn unusable_caller_buffers_and_streams_are_refused_naming_the_fix() {
    let test = "unusable_caller_buffers_and_streams_are_refused_naming_the_fix";
    let Some(g) = gpu_or_skip(test) else { return };
    let halos = synthetic::halos(SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: 500, send_fraction: 0.3, box_len: 6.0 }, 7);
    let owned = Owned::new(&g.ctx, &halos);
    let mut short = owned.lend(&g.ctx);
    // SAFETY: a prefix of the owned buffer, which outlives the attempt.
    short[1].x = unsafe { CallerSlice::from_raw(&g.ctx, owned.x[1].device_ptr(), halos[1].home_atoms).unwrap() };
    let e = LocalRanks::<Float3>::with_buffers(halos.clone(), std::slice::from_ref(&g.module), short)
        .err()
        .expect("a short x must be refused")
        .to_string();
    assert!(e.contains("rank 1") && e.contains(&format!("needs {}", halos[1].total_atoms)), "{test}: {e}");
    let mut one = owned.lend(&g.ctx);
    one.truncate(1);
    let e = LocalRanks::<Float3>::with_buffers(halos.clone(), std::slice::from_ref(&g.module), one).err().unwrap().to_string();
    assert!(e.contains("caller buffers for 1 ranks"), "{test}: {e}");
    let host = [Float3::default(); 16];
    // SAFETY: refused before anything would use it.
    let e = unsafe { CallerSlice::<Float3>::from_raw(&g.ctx, host.as_ptr() as u64, 16) }.unwrap_err().to_string();
    assert!(e.contains("not memory the CUDA driver knows") || e.contains("not device memory"), "{test}: {e}");
    // SAFETY: as above; the allocation is 500+ elements, not a million.
    let e = unsafe { CallerSlice::<Float3>::from_raw(&g.ctx, owned.x[0].device_ptr(), 1_000_000) }.unwrap_err().to_string();
    assert!(e.contains("pass the length it really has"), "{test}: {e}");
    let mut ranks = LocalRanks::<Float3>::with_buffers(halos.clone(), std::slice::from_ref(&g.module), owned.lend(&g.ctx)).unwrap();
    let (_owned_streams, streams) = app_streams(&g.ctx, 1);
    let e = ranks.use_streams(&[streams[0].clone(), streams[0].clone()]).unwrap_err().to_string();
    assert!(e.contains("ranks 0 and 1 were given the same stream"), "{test}: {e}");
    let e = ranks.use_streams(&streams).unwrap_err().to_string();
    assert!(e.contains("1 streams for 2 ranks"), "{test}: {e}");
}
