//! The multi-pulse protocol on one GPU: several ranks in one process exchange through peer
//! pointers and device signals, every transport, checked against the CPU reference every step.
//! Halo regions are poisoned (NaN) before every step, so a pulse that did not land fails.


use halo::abi::Float3;
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{Element, LocalRanks, RankHalo, Transport, reference};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use halo::gpu::DeviceMemory;
use halo::testing::gpu_or_skip;
use halo::HaloError;
use std::sync::Arc;
use std::time::Duration;

fn bits(v: &[Float3]) -> Vec<[u32; 3]> {
    v.iter().map(|f| [f.x.to_bits(), f.y.to_bits(), f.z.to_bits()]).collect()
}

fn shape(grid: [usize; 3], pulses: usize, home: usize) -> SyntheticShape {
    SyntheticShape { grid, pulses_per_dim: pulses, home_atoms: home, send_fraction: 0.35, box_len: 7.7 }
}

/// Runs `steps` coordinate + force exchanges with fresh random data each step and checks both.
fn run_protocol(test: &str, halos: Vec<RankHalo>, transport: Transport, steps: u64) {
    let Some(g) = gpu_or_skip(test) else { return };
    let module = Arc::new(g.module);
    let mut ranks = LocalRanks::new(halos.clone(), &[module]).unwrap();
    for step in 0..steps {
        let home = synthetic::random_values(&halos, 1000 + step, true);
        let forces = synthetic::random_values(&halos, 5000 + step, false);
        for (r, rank) in ranks.ranks().iter().enumerate() {
            rank.x.fill_bytes(0xFF).unwrap();
            rank.upload_coordinates(&home[r]).unwrap();
            rank.f.fill_bytes(0xFF).unwrap();
            rank.f.copy_from_host(&forces[r]).unwrap();
        }
        ranks.launch_coordinates(transport).unwrap();
        ranks.launch_forces(transport).unwrap();
        ranks.finish().unwrap_or_else(|e| panic!("{test} step {step}: {e}"));
        let want_x = reference::coordinates(&halos, &home);
        for (r, got) in ranks.coordinates().unwrap().iter().enumerate() {
            assert_eq!(bits(got), bits(&want_x[r]), "{test} {transport:?}: coordinates of rank {r} at step {step}");
        }
        let want_f = reference::forces(&halos, &forces);
        for (r, got) in ranks.forces().unwrap().iter().enumerate() {
            for (i, (a, b)) in got.iter().zip(&want_f[r]).enumerate() {
                for (u, v) in [(a.x, b.x), (a.y, b.y), (a.z, b.z)] {
                    assert!(
                        approx::relative_eq!(u, v, epsilon = 1e-5, max_relative = 1e-5),
                        "{test} {transport:?}: force {i} of rank {r} at step {step}: {u} vs {v}"
                    );
                }
            }
        }
    }
    if !transport.host_syncs_in_step() {
        // One host wait per step, at the end, for the check: none inside the exchange.
        assert_eq!(ranks.host_syncs(), steps, "{test}: {transport:?} steps synchronised with the host");
    } else {
        // Staged, GROMACS's GPU-aware MPI path: per pulse and rank, coordinates wait once after the
        // pack and once for the copy; forces once before the copy and once for it (a pulse with
        // nothing to move skips what it does not need). Plus the check's wait per step.
        let per_step: u64 = halos
            .iter()
            .flat_map(|h| &h.pulses)
            .map(|p| {
                let (send, recv) = (!p.index_map.is_empty(), p.recv_size > 0);
                2 * (send || recv) as u64 + send as u64 + recv as u64
            })
            .sum();
        assert_eq!(ranks.host_syncs(), steps * (1 + per_step), "{test}: staged host syncs");
    }
}

const TRANSPORTS: [Transport; 5] = [Transport::Fused, Transport::FusedTma, Transport::PerPulseDirect, Transport::Staged, Transport::DirectCopy];

#[test]
fn two_ranks_one_pulse_1000_steps() {
    let h = synthetic::halos(shape([2, 1, 1], 1, 3000), 1);
    run_protocol("two_ranks_one_pulse", h.clone(), Transport::Fused, 1000);
    for t in TRANSPORTS {
        run_protocol("two_ranks_one_pulse", h.clone(), t, 20);
    }
}

#[test]
fn two_ranks_two_pulses_1000_steps() {
    let h = synthetic::halos(shape([2, 1, 1], 2, 2500), 2);
    run_protocol("two_ranks_two_pulses", h.clone(), Transport::Fused, 1000);
    for t in TRANSPORTS {
        run_protocol("two_ranks_two_pulses", h.clone(), t, 20);
    }
}

#[test]
fn eight_ranks_2x2x2_forwarding_chain_1000_steps() {
    let h = synthetic::halos(shape([2, 2, 2], 1, 1500), 3);
    run_protocol("eight_ranks_2x2x2", h.clone(), Transport::Fused, 1000);
    for t in TRANSPORTS {
        run_protocol("eight_ranks_2x2x2", h.clone(), t, 20);
    }
}

#[test]
fn eight_ranks_2x2x2_two_pulses_per_dim() {
    let h = synthetic::halos(shape([2, 2, 2], 2, 1200), 4);
    for t in TRANSPORTS {
        run_protocol("eight_ranks_2x2x2_two_pulses", h.clone(), t, 50);
    }
}

#[test]
fn edge_shapes_empty_pulses_and_tiny_ranks() {
    // Nothing sent at all, one atom per rank, and a ring of four with three pulses.
    let mut empty = shape([2, 1, 1], 2, 50);
    empty.send_fraction = 0.0;
    let mut tiny = shape([2, 2, 1], 1, 1);
    tiny.send_fraction = 1.0;
    for (name, s) in [("empty", empty), ("tiny", tiny), ("ring4x3", shape([4, 1, 1], 3, 333))] {
        for t in TRANSPORTS {
            run_protocol(name, synthetic::halos(s, 5), t, 10);
        }
    }
}

#[test]
fn a_missing_signal_times_out_with_a_clear_error() {
    let Some(g) = gpu_or_skip("a_missing_signal_times_out_with_a_clear_error") else { return };
    let halos = synthetic::halos(shape([2, 1, 1], 1, 100), 6);
    let mut ranks = LocalRanks::<Float3>::new(halos, &[Arc::new(g.module)]).unwrap();
    for r in ranks.ranks_mut() {
        r.set_wait_timeout(Duration::from_millis(200));
    }
    // Rank 1 "skips" its launch: rank 0 must give up instead of spinning forever.
    let started = std::time::Instant::now();
    let stream0 = ranks.stream(0).clone();
    ranks.ranks_mut()[0].launch_coordinates(Transport::Fused, &stream0).unwrap();
    let err = ranks.finish().unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    match &err {
        HaloError::WaitTimeout(t) => {
            assert_eq!((t.rank, t.peer, t.pulse, t.step_counter), (0, 1, 0, 1), "{err}");
        }
        other => panic!("expected a wait timeout, got {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("rank 0 waited") && msg.contains("from rank 1") && msg.contains("never set"), "{msg}");
    // After a reset on every rank the exchange works again.
    for r in ranks.ranks_mut() {
        r.reset_protocol().unwrap();
    }
    ranks.launch_coordinates(Transport::Fused).unwrap();
    ranks.finish().unwrap();
}

#[test]
fn per_pulse_put_needs_nvshmem() {
    let Some(g) = gpu_or_skip("per_pulse_put_needs_nvshmem") else { return };
    let mut ranks = LocalRanks::<Float3>::new(synthetic::halos(shape([2, 1, 1], 1, 10), 7), &[Arc::new(g.module)]).unwrap();
    let err = ranks.launch_coordinates(Transport::PerPulse).unwrap_err();
    assert!(err.to_string().contains("needs NVSHMEM"), "{err}");
}


/// Random values of any element type, for every local element of each rank (or home ones only).
fn random_elements<T: Element>(halos: &[RankHalo], seed: u64, home_only: bool, make: impl Fn(&mut ChaCha8Rng) -> T) -> Vec<Vec<T>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    halos.iter().map(|h| (0..if home_only { h.home_atoms } else { h.total_atoms }).map(|_| make(&mut rng)).collect()).collect()
}

/// The generic kernels for `T`: forward exchange bit-exact, reverse accumulation within rounding.
fn run_element<T: Element>(test: &str, halos: Vec<RankHalo>, transport: Transport, steps: u64, make: impl Fn(&mut ChaCha8Rng) -> T, close: impl Fn(T, T) -> bool) {
    let Some(g) = gpu_or_skip(test) else { return };
    let mut ranks = LocalRanks::<T>::new(halos.clone(), &[Arc::new(g.module)]).unwrap();
    for step in 0..steps {
        let home = random_elements(&halos, 100 + step, true, &make);
        let forces = random_elements(&halos, 900 + step, false, &make);
        for (r, rank) in ranks.ranks().iter().enumerate() {
            rank.x.fill_bytes(0xFF).unwrap();
            rank.upload_coordinates(&home[r]).unwrap();
            rank.f.copy_from_host(&forces[r]).unwrap();
        }
        ranks.exchange_forward(transport).unwrap();
        ranks.exchange_reverse_accumulate(transport).unwrap();
        ranks.finish().unwrap_or_else(|e| panic!("{test} {transport:?} step {step}: {e}"));
        let want_x = reference::coordinates(&halos, &home);
        let want_f = reference::forces(&halos, &forces);
        for (r, (x, f)) in ranks.coordinates().unwrap().iter().zip(ranks.forces().unwrap()).enumerate() {
            assert_eq!(bytemuck::cast_slice::<T, u8>(x), bytemuck::cast_slice::<T, u8>(&want_x[r]), "{test} {transport:?}: values of rank {r} at step {step}");
            for (i, (a, b)) in f.iter().zip(&want_f[r]).enumerate() {
                assert!(close(*a, *b), "{test} {transport:?}: accumulated {i} of rank {r} at step {step}: {a:?} vs {b:?}");
            }
        }
    }
}

#[test]
fn generic_element_types_exchange_like_coordinates() {
    let near = |a: f32, b: f32| approx::relative_eq!(a, b, epsilon = 1e-5, max_relative = 1e-5);
    for (name, halos) in [("2x2x2", synthetic::halos(shape([2, 2, 2], 1, 700), 11)), ("2x1x1x2", synthetic::halos(shape([2, 1, 1], 2, 1001), 12))] {
        for t in TRANSPORTS {
            run_element(&format!("f32 {name}"), halos.clone(), t, 20, |r| r.random_range(-5.0f32..5.0), near);
            run_element(&format!("f64 {name}"), halos.clone(), t, 20, |r| r.random_range(-5.0f64..5.0), |a: f64, b: f64| (a - b).abs() <= 1e-12 * (1.0 + b.abs()));
            run_element(&format!("f32x4 {name}"), halos.clone(), t, 20, |r| [r.random_range(-5.0f32..5.0), r.random(), r.random(), -1.0], |a: [f32; 4], b: [f32; 4]| (0..4).all(|k| near(a[k], b[k])));
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Protocol v4 (issue 15): monotonic signals, credits, device-resident step counters, pushed forces.

/// Integer-valued values (sums are exact in any order, so accumulated forces compare bit for bit).
fn integer_values(halos: &[RankHalo], seed: u64, home_only: bool) -> Vec<Vec<Float3>> {
    random_elements(halos, seed, home_only, |r| {
        let mut c = || r.random_range(-8i32..=8) as f32;
        Float3::new(c(), c(), c())
    })
}

/// `k` force-only steps on the CPU: each step adds every rank's halo forces into their owners.
fn forces_after(halos: &[RankHalo], f0: &[Vec<Float3>], k: usize) -> Vec<Vec<Float3>> {
    (0..k).fold(f0.to_vec(), |f, _| reference::forces(halos, &f))
}

/// Holds a stream at a one-thread kernel spinning on a flag until the host opens it, so the
/// launches queued behind it start late (a slow rank, on purpose).
struct Gate {
    flag: halo::gpu::DeviceBuffer<u64>,
    _answer: halo::gpu::DeviceBuffer<u64>,
    status: halo::gpu::DeviceBuffer<halo::abi::WaitStatus>,
}

impl Gate {
    fn close(module: &halo::gpu::KernelModule, stream: &halo::gpu::CudaStream) -> Self {
        use halo::gpu::DeviceBuffer;
        let ctx = module.context();
        let (flag, answer, status) =
            (DeviceBuffer::<u64>::zeroed(ctx, 1).unwrap(), DeviceBuffer::<u64>::zeroed(ctx, 1).unwrap(), DeviceBuffer::zeroed(ctx, 1).unwrap());
        let (mut own, mut peer, mut rounds, mut initiator) = (flag.device_ptr(), answer.device_ptr(), 1u32, 0u32);
        let (mut timeout, mut st) = (20_000_000_000u64, status.device_ptr());
        let mut args = halo::kernel_args![own, peer, rounds, initiator, timeout, st];
        let shape = halo::gpu::LaunchShape { grid: (1, 1), block: 1, shared_bytes: 0 };
        // SAFETY: arguments match `signal_ping_pong`; the three buffers outlive the kernel (the
        // test waits for every stream before dropping the gate).
        unsafe { module.launch(halo::abi::SIGNAL_PING_PONG, shape, stream, &mut args) }.unwrap();
        Self { flag, _answer: answer, status }
    }

    fn open(&self) {
        self.flag.copy_from_host(&[1]).unwrap();
    }

    fn check(&self) {
        assert_eq!(self.status.to_host().unwrap()[0].timed_out, 0, "the gate kernel timed out");
    }
}

fn check_coordinates(test: &str, ranks: &LocalRanks, halos: &[RankHalo], home: &[Vec<Float3>]) {
    let want = reference::coordinates(halos, home);
    for (r, got) in ranks.coordinates().unwrap().iter().enumerate() {
        assert_eq!(bits(got), bits(&want[r]), "{test}: coordinates of rank {r}");
    }
}

fn check_forces(test: &str, ranks: &LocalRanks, want: &[Vec<Float3>]) {
    for (r, got) in ranks.forces().unwrap().iter().enumerate() {
        assert_eq!(bits(got), bits(&want[r]), "{test}: forces of rank {r}");
    }
}

/// Defect 1: on a ring of three, rank 2 starts late while ranks 0 and 1 run ahead. Before the
/// fix, rank 0's step 2 overwrote rank 2's slot (and pushed over its data) before rank 2 had seen
/// step 1, and rank 2's `==` wait timed out. Now slots compare `>=` and a fast sender waits for the
/// receiver's credit. Coordinate-only and force-only loops, one and two pulses, every transport.
#[test]
fn a_fast_neighbour_one_step_ahead_does_not_strand_a_late_rank() {
    const STEPS: usize = 6;
    let Some(g) = gpu_or_skip("a_fast_neighbour_one_step_ahead_does_not_strand_a_late_rank") else { return };
    let module = Arc::new(g.module);
    for pulses in [1, 2] {
        let halos = synthetic::halos(shape([3, 1, 1], pulses, 700), 21);
        // Not staged: it waits on the host for every stream, rank 2's included, inside the step.
        for transport in [Transport::Fused, Transport::FusedTma, Transport::PerPulseDirect, Transport::DirectCopy] {
            let test = format!("ring of 3, {pulses} pulse(s), {transport:?}");
            let mut ranks = LocalRanks::<Float3>::new(halos.clone(), &[module.clone()]).unwrap();
            for r in ranks.ranks_mut() {
                r.set_wait_timeout(Duration::from_secs(3));
            }
            let home = integer_values(&halos, 3, true);
            let f0 = integer_values(&halos, 4, false);
            for (r, rank) in ranks.ranks().iter().enumerate() {
                rank.x.fill_bytes(0xFF).unwrap();
                rank.upload_coordinates(&home[r]).unwrap();
                rank.f.copy_from_host(&f0[r]).unwrap();
            }
            // Rank 2 starts late; the others queue STEPS launches of one direction and run ahead.
            let mut late_rank_2 = |forces: bool| {
                let gate = Gate::close(&module, ranks.stream(2));
                for _ in 0..STEPS {
                    if forces { ranks.launch_forces(transport) } else { ranks.launch_coordinates(transport) }.unwrap();
                }
                std::thread::sleep(Duration::from_millis(300));
                gate.open();
                ranks.finish().unwrap_or_else(|e| panic!("{test}, forces only {forces}: {e}"));
                gate.check();
            };
            late_rank_2(false);
            late_rank_2(true);
            check_coordinates(&test, &ranks, &halos, &home);
            check_forces(&test, &ranks, &forces_after(&halos, &f0, STEPS));
        }
    }
}

/// One direction at a time for many steps, the home values changing every step on the GPU (no
/// host work in between): rings of three and 2x2x2, where credits bound the fast senders, and two
/// ranks, where the step's own signals do. Checked at the end against the CPU reference.
#[test]
fn one_direction_loops_with_changing_data_end_right() {
    const STEPS: usize = 200;
    let Some(g) = gpu_or_skip("one_direction_loops_with_changing_data_end_right") else { return };
    let module = Arc::new(g.module);
    for (name, halos) in [
        ("ring of 3 x 2 pulses", synthetic::halos(shape([3, 1, 1], 2, 900), 31)),
        ("2x2x2", synthetic::halos(shape([2, 2, 2], 1, 600), 32)),
        ("2 ranks x 2 pulses", synthetic::halos(shape([2, 1, 1], 2, 900), 33)),
    ] {
        for transport in [Transport::Fused, Transport::FusedTma, Transport::PerPulseDirect, Transport::DirectCopy, Transport::Staged] {
            let test = format!("{name}, {transport:?}");
            let mut ranks = LocalRanks::<Float3>::new(halos.clone(), &[module.clone()]).unwrap();
            let home0 = integer_values(&halos, 5, true);
            let f0 = integer_values(&halos, 6, false);
            let mut bumps = Vec::new();
            for (r, rank) in ranks.ranks().iter().enumerate() {
                rank.x.fill_bytes(0xFF).unwrap();
                rank.upload_coordinates(&home0[r]).unwrap();
                rank.f.copy_from_host(&f0[r]).unwrap();
                let n = halos[r].home_atoms;
                let ones = halo::gpu::DeviceBuffer::from_host(rank.context(), &vec![Float3::new(1.0, 1.0, 1.0); n]).unwrap();
                let map = halo::kernels::IndexMap::new(rank.context(), &(0..n as u32).collect::<Vec<_>>()).unwrap();
                bumps.push((ones, map));
            }
            for _ in 0..STEPS {
                // Every home coordinate += 1 on the rank's stream, then the coordinate halo.
                for (r, (ones, map)) in bumps.iter().enumerate() {
                    halo::kernels::unpack(&module, ranks.stream(r), ones, map, &ranks.ranks()[r].x, true).unwrap();
                }
                ranks.launch_coordinates(transport).unwrap();
            }
            for _ in 0..STEPS / 4 {
                ranks.launch_forces(transport).unwrap();
            }
            ranks.finish().unwrap_or_else(|e| panic!("{test}: {e}"));
            let home: Vec<Vec<Float3>> =
                home0.iter().map(|h| h.iter().map(|v| *v + Float3::new(STEPS as f32, STEPS as f32, STEPS as f32)).collect()).collect();
            check_coordinates(&test, &ranks, &halos, &home);
            check_forces(&test, &ranks, &forces_after(&halos, &f0, STEPS / 4));
            // The device counters belong to the GPU-initiated kernels; host-driven steps keep theirs on the host.
            for r in ranks.ranks().iter().filter(|_| transport.gpu_initiated()) {
                let s = r.protocol_state().unwrap();
                assert_eq!((s.x_epoch, s.f_epoch), (STEPS as u64, (STEPS / 4) as u64), "{test}: rank {} counters", r.rank());
            }
        }
    }
}

/// Defect 5: the force chain's completion counters must not depend on the grid staying the same.
/// Before the fix they reached `launch_seq * gridDim` only while the grid never changed, so the
/// first step after `cap_grids` waited for a count that never came.
#[test]
fn changing_the_grid_between_steps_keeps_the_force_chain_in_step() {
    let Some(g) = gpu_or_skip("changing_the_grid_between_steps_keeps_the_force_chain_in_step") else { return };
    let module = Arc::new(g.module);
    for (name, halos) in
        [("2 ranks", synthetic::halos(shape([2, 1, 1], 2, 20_000), 41)), ("2x2x1", synthetic::halos(shape([2, 2, 1], 1, 12_000), 42))]
    {
        let mut ranks = LocalRanks::<Float3>::new(halos.clone(), &[module.clone()]).unwrap();
        let start = ranks.ranks()[0].grids();
        assert!(start.1 > 2, "{name}: the test needs a force grid above 2 blocks, got {start:?}");
        for r in ranks.ranks_mut() {
            r.set_wait_timeout(Duration::from_secs(2));
        }
        for (step, cap) in [u32::MAX, u32::MAX, 2, 2, 1, 1].into_iter().enumerate() {
            for r in ranks.ranks_mut() {
                r.cap_grids(cap);
            }
            let home = integer_values(&halos, 50 + step as u64, true);
            let f0 = integer_values(&halos, 60 + step as u64, false);
            for (r, rank) in ranks.ranks().iter().enumerate() {
                rank.x.fill_bytes(0xFF).unwrap();
                rank.upload_coordinates(&home[r]).unwrap();
                rank.f.copy_from_host(&f0[r]).unwrap();
            }
            ranks.launch_coordinates(Transport::Fused).unwrap();
            ranks.launch_forces(Transport::Fused).unwrap();
            ranks.finish().unwrap_or_else(|e| panic!("{name} step {step} (cap {cap}): {e}"));
            check_coordinates(name, &ranks, &halos, &home);
            check_forces(name, &ranks, &reference::forces(&halos, &f0));
        }
    }
}

/// Item 3: one step (reset the forces, coordinate halo, force halo) captured once per rank as a
/// CUDA graph and replayed 1000 times back to back: no host work and no protocol reset between
/// replays. The outputs are poisoned before the checked replays; the step counters on the GPU must
/// have advanced once per replay.
#[test]
fn a_captured_step_replays_a_thousand_times_without_resets() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    const REPLAYS: usize = 1000;
    let Some(g) = gpu_or_skip("a_captured_step_replays_a_thousand_times_without_resets") else { return };
    let module = Arc::new(g.module);
    for transport in [Transport::Fused, Transport::FusedTma, Transport::PerPulseDirect] {
        let halos = synthetic::halos(shape([2, 2, 2], 1, 1500), 71);
        let test = format!("2x2x2 graph, {transport:?}");
        let mut ranks = LocalRanks::<Float3>::new(halos.clone(), &[module.clone()]).unwrap();
        let home = integer_values(&halos, 7, true);
        let f0 = integer_values(&halos, 8, false);
        let pristine: Vec<_> = ranks.ranks().iter().zip(&f0).map(|(r, f)| halo::gpu::DeviceBuffer::from_host(r.context(), f).unwrap()).collect();
        let mut graphs = Vec::new();
        for r in 0..halos.len() {
            let stream = ranks.stream(r).clone();
            let bytes = f0[r].len() * size_of::<Float3>();
            stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
            let rank = &mut ranks.ranks_mut()[r];
            // SAFETY: both ranges hold `bytes` bytes of live device memory on this GPU.
            unsafe { cudarc::driver::sys::cuMemcpyAsync(rank.f.device_ptr(), pristine[r].device_ptr(), bytes, stream.cu_stream()) }.result().unwrap();
            rank.launch_coordinates(transport, &stream).unwrap();
            rank.launch_forces(&stream).unwrap();
            let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("a captured step");
            graph.upload().unwrap();
            graphs.push(graph);
        }
        let poison = |ranks: &LocalRanks| {
            for (r, rank) in ranks.ranks().iter().enumerate() {
                rank.x.fill_bytes(0xFF).unwrap();
                rank.upload_coordinates(&home[r]).unwrap();
                rank.f.fill_bytes(0xFF).unwrap();
            }
        };
        let want_f = reference::forces(&halos, &f0);
        let mut done = 0;
        for checked in [1, 2, 3, REPLAYS] {
            poison(&ranks);
            while done < checked {
                for graph in &graphs {
                    graph.launch().unwrap();
                }
                done += 1;
            }
            ranks.finish().unwrap_or_else(|e| panic!("{test}, after replay {done}: {e}"));
            check_coordinates(&format!("{test}, replay {done}"), &ranks, &halos, &home);
            check_forces(&format!("{test}, replay {done}"), &ranks, &want_f);
        }
        for r in ranks.ranks() {
            let s = r.protocol_state().unwrap();
            assert_eq!((s.x_epoch, s.f_epoch), (REPLAYS as u64, REPLAYS as u64), "{test}: rank {} counters", r.rank());
        }
        drop(graphs);
    }
}
