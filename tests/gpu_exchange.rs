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
    if transport.gpu_initiated() {
        // One host wait per step, at the end, for the check: none inside the exchange.
        assert_eq!(ranks.host_syncs(), steps, "{test}: GPU-initiated steps synchronised with the host");
    }
}

const TRANSPORTS: [Transport; 4] = [Transport::Fused, Transport::FusedTma, Transport::PerPulseDirect, Transport::Staged];

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
