//! Issue 18 on the GPU, in one process: the jitter's delay kernel, rings of three and four ranks
//! under jitter in every phase (the GPU test of the signal-reuse defect fixed by protocol v4:
//! monotonic waits and credits), and the memory checks that run before an exchange allocates.
//! The multi-process faults (a PE killed mid-step, a heap too small, a GPU out of memory across
//! PEs) are commands of the `faults` GPU suite (`gpu-suite.sh faults` in the bundle).

use halo::abi::Float3;
use halo::exchange::heap::{self, Footprint};
use halo::exchange::perturb::{Jitter, JitterSide, Perturbation, Perturbed};
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{Exchange, LocalRanks, Placement, RankHalo, SharedSizes, Transport, reference};
use halo::gpu::{self, DeviceBuffer, DeviceMemory, KernelModule};
use halo::testing::{gpu_or_skip, gpus_or_skip};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One test at a time: one of them fills the GPU's memory.
static GPU: Mutex<()> = Mutex::new(());

fn shape(grid: [usize; 3], home: usize) -> SyntheticShape {
    SyntheticShape { grid, pulses_per_dim: 1, home_atoms: home, send_fraction: 0.35, box_len: 7.7 }
}

#[test]
fn the_delay_kernel_holds_its_stream_for_the_time_asked() {
    let _one = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(g) = gpu_or_skip("the_delay_kernel_holds_its_stream_for_the_time_asked") else { return };
    let stream = g.ctx.new_stream().unwrap();
    let time = |ns: u64| {
        let t = Instant::now();
        halo::kernels::spin_delay(&g.module, &stream, ns).unwrap();
        stream.synchronize().unwrap();
        t.elapsed()
    };
    time(0); // warm-up (module load, first launch)
    for ms in [2u64, 20] {
        let took = time(ms * 1_000_000);
        assert!(took >= Duration::from_millis(ms), "{ms} ms asked, the stream was free after {took:?}");
        assert!(took < Duration::from_millis(ms + 200), "{ms} ms asked, took {took:?}");
    }
    assert!(time(0) < Duration::from_millis(50));
    // Bounded whatever is asked: capped at Jitter::MAX_US.
    let took = time(u64::MAX);
    let cap = Duration::from_micros(u64::from(Jitter::MAX_US));
    assert!(took >= cap && took < cap + Duration::from_millis(500), "u64::MAX ns took {took:?}");
}

/// `steps` steps of `phase` (x, f or both) under `jitter`, with fresh data and a comparison with
/// the CPU reference every `check_every` steps (between them the exchange runs back to back).
fn jittered_run(test: &str, halos: &[RankHalo], placement: &Placement, jitter: Jitter, phase: (bool, bool), steps: u64, check_every: u64) {
    let p = Perturbation::new(Some(jitter), None).unwrap();
    let inner = placement.exchange::<Float3>(halos.to_vec()).unwrap();
    let mut x = Perturbed::new(inner, p.clone()).unwrap();
    x.set_wait_timeout(Duration::from_secs(5));
    let transport = Transport::Fused;
    for step in 0..steps {
        let check = step % check_every == 0;
        let (mut home, mut forces) = (Vec::new(), Vec::new());
        if check {
            x.finish().unwrap_or_else(|e| panic!("{test} before step {step}: {e}"));
            home = synthetic::random_values(halos, 100 + step, true);
            forces = synthetic::random_values(halos, 900 + step, false);
            for rank in x.local_ranks() {
                rank.x.fill_bytes(0xFF).unwrap();
                rank.upload_coordinates(&home[rank.rank()]).unwrap();
                rank.f.copy_from_host(&forces[rank.rank()]).unwrap();
            }
        }
        if phase.0 {
            x.exchange_forward(transport).unwrap();
        }
        if phase.1 {
            x.exchange_reverse_accumulate(transport).unwrap();
        }
        if !check {
            continue;
        }
        x.finish().unwrap_or_else(|e| panic!("{test} step {step}: {e}"));
        if phase.0 {
            let want = reference::coordinates(halos, &home);
            for (r, got) in x.read_forward().unwrap().iter().enumerate() {
                let bits = |v: &[Float3]| v.iter().map(|f| [f.x.to_bits(), f.y.to_bits(), f.z.to_bits()]).collect::<Vec<_>>();
                assert_eq!(bits(got), bits(&want[r]), "{test}: coordinates of rank {r} at step {step}");
            }
        }
        if phase.1 {
            let want = reference::forces(halos, &forces);
            for (r, got) in x.read_reverse().unwrap().iter().enumerate() {
                for (i, (a, b)) in got.iter().zip(&want[r]).enumerate() {
                    for (u, v) in [(a.x, b.x), (a.y, b.y), (a.z, b.z)] {
                        assert!(((u - v).abs() / v.abs().max(1.0)) < 1e-5, "{test}: force {i} of rank {r} at step {step}: {u} vs {v}");
                    }
                }
            }
        }
    }
    x.finish().unwrap_or_else(|e| panic!("{test} at the end: {e}"));
    let s = p.stats();
    let directions = u64::from(phase.0) + u64::from(phase.1);
    assert_eq!(s.launches, steps * directions * halos.len() as u64, "{test}: {s}");
    // About half of the launches were held back on the GPU: the jitter really ran.
    assert!(s.gpu_delays * 3 > s.launches && s.gpu_delays * 3 < 2 * s.launches, "{test}: {s}");
}

/// Rings of three and four ranks, coordinates only, forces only and full steps, with up to 50 µs
/// of jitter on the host and the GPU before about half of every rank's launches: no timeout, and
/// every checked step bit-exact (coordinates) or within rounding (forces). On one GPU, and over
/// two GPUs when there are two.
#[test]
fn jittered_rings_of_three_and_four_stay_exact_in_every_phase() {
    let _one = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(n) = gpus_or_skip("jittered_rings_of_three_and_four_stay_exact_in_every_phase", 1) else { return };
    let artifacts = halo::artifacts::KernelArtifacts::locate(halo::artifacts::DEFAULT_ARCH).unwrap();
    let modules: Vec<Arc<KernelModule>> =
        (0..n.min(2)).map(|i| Arc::new(KernelModule::load(&gpu::open_device(i).unwrap(), &artifacts).unwrap())).collect();
    let mut placements = vec![("one GPU", Placement::Local(modules[..1].to_vec()))];
    if gpus_or_skip("jittered_rings_of_three_and_four_stay_exact_in_every_phase: the rings over two GPUs", 2).is_some() {
        placements.push(("two GPUs", Placement::Local(modules.clone())));
    }
    for (where_, placement) in &placements {
        for ranks in [3, 4] {
            let halos = synthetic::halos(shape([ranks, 1, 1], 1500), 40 + ranks as u64);
            for (name, phase) in [("x", (true, false)), ("f", (false, true)), ("xf", (true, true))] {
                let jitter = Jitter { max_us: 50, seed: 7 + ranks as u64, side: JitterSide::Both };
                let test = format!("ring of {ranks} on {where_}, phase {name}");
                jittered_run(&test, &halos, placement, jitter, phase, 2000, 250);
            }
        }
    }
}

/// The footprint the memory checks use is what an exchange really allocates.
#[test]
fn the_footprint_is_what_an_exchange_allocates() {
    let _one = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(g) = gpu_or_skip("the_footprint_is_what_an_exchange_allocates") else { return };
    let halos = synthetic::halos(shape([2, 1, 1], 20_000), 3);
    let sizes = SharedSizes::of(&halos);
    let before = halo::exchange::memory::allocated_on_this_thread();
    let module = g.module.clone();
    let ranks = LocalRanks::<Float3>::new(halos.clone(), std::slice::from_ref(&module)).unwrap();
    let allocated = halo::exchange::memory::allocated_on_this_thread() - before;
    let footprint: u64 = halos.iter().map(|h| Footprint::of::<Float3>(sizes, h).symmetric_requested()).sum();
    assert_eq!(allocated, footprint, "LocalRanks allocated {allocated} bytes of exchange buffers, the footprint says {footprint}");
    drop(ranks);
    // With the MD step's headroom (`Placement::exchange_with_headroom`): the footprint of the grown
    // sizes, which is what the prechecks are given.
    let grown = sizes.with_headroom(0.25);
    let before = halo::exchange::memory::allocated_on_this_thread();
    let ranks = LocalRanks::<Float3>::with_sizes(halos.clone(), &[module], grown).unwrap();
    let allocated = halo::exchange::memory::allocated_on_this_thread() - before;
    let footprint: u64 = halos.iter().map(|h| Footprint::of::<Float3>(grown, h).symmetric_requested()).sum();
    assert_eq!(allocated, footprint, "with headroom: LocalRanks allocated {allocated} bytes, the footprint says {footprint}");
    assert!(grown.atoms > sizes.atoms);
    drop(ranks);
}

/// A GPU without room for the exchange: refused before anything is allocated, naming the GPU, the
/// ranks, the need, what is free and the fix; and the exchange builds again once memory is free.
#[test]
fn a_full_gpu_refuses_the_exchange_with_the_need_and_the_fix() {
    let _one = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let Some(g) = gpu_or_skip("a_full_gpu_refuses_the_exchange_with_the_need_and_the_fix") else { return };
    let module = g.module.clone();
    let halos = synthetic::halos(shape([2, 1, 1], 2_000_000), 5);
    let need: u64 = halos.iter().map(|h| Footprint::of::<Float3>(SharedSizes::of(&halos), h)).map(|f| f.symmetric_bytes() + f.plain_bytes()).sum();
    // Leave about half of what the exchange needs (the driver may keep a little of what it calls
    // free, so back off in 64 MiB steps if the first size is refused).
    let (free, _) = g.ctx.mem_get_info().unwrap();
    let hog = (0..16)
        .find_map(|k| DeviceBuffer::<u8>::uninit(&g.ctx, free.saturating_sub((need / 2) as usize + (k << 26))).ok())
        .expect("could not fill the GPU");
    let (left, _) = g.ctx.mem_get_info().unwrap();
    assert!((left as u64) < need, "the GPU still has {left} bytes free, the exchange needs {need}: the test cannot fill it");
    let e = LocalRanks::<Float3>::new(halos.clone(), std::slice::from_ref(&module)).err().expect("the exchange must not fit").to_string();
    for part in ["GPU 0 is out of memory for the halo exchange of ranks 0, 1: it needs", "each rank: coordinates", "fewer atoms on each rank"] {
        assert!(e.contains(part), "missing `{part}`: {e}");
    }
    assert!(e.contains(&heap::human(need)), "names the need ({}): {e}", heap::human(need));
    drop(hog);
    LocalRanks::<Float3>::new(halos, &[module]).unwrap();
}

/// A stream that makes no progress: the wait returns `StreamStuck`, the exchange refuses every later
/// call at once (`ExchangeStuck`), dropping it does not wait for the stuck work (its device memory
/// is leaked while that work runs, and freed normally again once it ended), and the process goes on:
/// the library never ends it. Rank 0's stream is held by delay kernels for 6 s, with a host wait
/// budget of 3.2 s (device deadline 200 ms + 3 s) and counters that never move.
#[test]
fn a_stuck_stream_is_an_error_and_the_process_goes_on() {
    let _one = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let test = "a_stuck_stream_is_an_error_and_the_process_goes_on";
    let Some(g) = gpu_or_skip(test) else { return };
    let halos = synthetic::halos(shape([2, 1, 1], 1000), 6);
    let mut ranks = LocalRanks::<Float3>::new(halos, std::slice::from_ref(&g.module)).unwrap();
    ranks.set_wait_timeout(Duration::from_millis(200));
    ranks.launch_coordinates(Transport::Fused).unwrap();
    ranks.finish().unwrap_or_else(|e| panic!("{test}: a clean step: {e}"));
    let stream0 = ranks.stream(0).clone();
    let started = Instant::now();
    for _ in 0..6 {
        halo::kernels::spin_delay(&g.module, &stream0, 1_000_000_000).unwrap();
    }
    let stuck = ranks.finish().err().unwrap_or_else(|| panic!("{test}: a stream held for 6 s passed a 3.2 s budget"));
    let at_error = Instant::now();
    assert!(matches!(stuck, halo::HaloError::StreamStuck(_)), "{test}: {stuck}");
    assert!(at_error - started < Duration::from_millis(5500), "{test}: the stuck wait took {:?}", at_error - started);
    // Every later call fails at once, naming the stuck stream.
    for (what, result) in [("finish", ranks.finish()), ("launch", ranks.launch_coordinates(Transport::Fused))] {
        let e = result.err().unwrap_or_else(|| panic!("{test}: {what} on a stuck exchange passed"));
        assert!(matches!(e, halo::HaloError::ExchangeStuck { rank: 0, .. }), "{test}: {what}: {e}");
        assert!(e.to_string().contains("stream is stuck"), "{test}: {what}: {e}");
    }
    assert!(at_error.elapsed() < Duration::from_millis(500), "{test}: the refusals waited {:?}", at_error.elapsed());
    // Device memory dropped while the stuck work runs is leaked (freeing would wait for it).
    let (free_before, _) = g.ctx.mem_get_info().unwrap();
    drop(DeviceBuffer::<u8>::uninit(&g.ctx, 2 << 30).unwrap());
    let (free_leaked, _) = g.ctx.mem_get_info().unwrap();
    assert!(free_leaked + (1 << 30) < free_before, "{test}: 2 GiB dropped while stuck came back ({free_before} -> {free_leaked} bytes free)");
    let dropping = Instant::now();
    drop(ranks);
    assert!(dropping.elapsed() < Duration::from_millis(500), "{test}: dropping the stuck exchange took {:?}", dropping.elapsed());
    assert!(started.elapsed() < Duration::from_secs(6), "{test}: the checks ran after the stuck work ended ({:?})", started.elapsed());
    // Once the work ended, memory is freed again; and the process is still here well past any
    // grace a library that ended the process would have given it.
    stream0.synchronize().unwrap();
    let (free_after, _) = g.ctx.mem_get_info().unwrap();
    drop(DeviceBuffer::<u8>::uninit(&g.ctx, 2 << 30).unwrap());
    let (free_freed, _) = g.ctx.mem_get_info().unwrap();
    assert!(free_freed + (1 << 30) >= free_after, "{test}: 2 GiB dropped after the stuck work ended was not freed ({free_after} -> {free_freed})");
    while at_error.elapsed() < Duration::from_secs(7) {
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "{test}: StreamStuck after {:.2} s, refusals and drop at once, process alive {:.1} s after the error",
        (at_error - started).as_secs_f64(),
        at_error.elapsed().as_secs_f64()
    );
}
