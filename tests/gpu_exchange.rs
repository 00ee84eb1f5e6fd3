//! The multi-pulse protocol on one GPU: several ranks in one process exchange through peer
//! pointers and device signals, every transport, checked against the CPU reference every step.
//! Halo regions are poisoned (NaN) before every step, so a pulse that did not land fails.

use halo::HaloError;
use halo::abi::Float3;
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{Element, Exchange, LocalRanks, RankHalo, Transport, reference};
use halo::gpu::DeviceMemory;
use halo::testing::gpu_or_skip;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

/// The timeline probe's GPU tests (issue 15): their own file, this binary (one fewer test binary in
/// the size-limited GPU bundle). Run them alone with the filter `timeline::`.
#[path = "gpu_timeline.rs"]
mod timeline;

/// The exchange on the caller's own buffers and streams: this binary too; filter `caller::`.
#[path = "gpu_caller.rs"]
mod caller;

/// A kernel that holds a stream until the host opens it: its own file, shared with `gpu_pes`.
#[path = "gpu_gate.rs"]
mod gate;
use gate::Gate;

fn bits(v: &[Float3]) -> Vec<[u32; 3]> {
    v.iter().map(|f| [f.x.to_bits(), f.y.to_bits(), f.z.to_bits()]).collect()
}

fn shape(grid: [usize; 3], pulses: usize, home: usize) -> SyntheticShape {
    SyntheticShape { grid, pulses_per_dim: pulses, home_atoms: home, send_fraction: 0.35, box_len: 7.7 }
}

/// One step on `ranks`: poisoned outputs, fresh random values (from `seed`), coordinates and
/// forces exchanged with `transport`, checked against the CPU reference (coordinates bit-exact).
fn exchange_and_check(test: &str, ranks: &mut LocalRanks, halos: &[RankHalo], transport: Transport, step: u64, seed: u64) {
    let home = synthetic::random_values(halos, seed, true);
    let forces = synthetic::random_values(halos, seed + 4000, false);
    upload_poisoned(ranks.ranks(), &home, &forces);
    ranks.launch_coordinates(transport).unwrap();
    ranks.launch_forces(transport).unwrap();
    ranks.finish().unwrap_or_else(|e| panic!("{test} step {step}: {e}"));
    let want_x = reference::coordinates(halos, &home);
    for (r, got) in ranks.coordinates().unwrap().iter().enumerate() {
        assert_eq!(bits(got), bits(&want_x[r]), "{test}: coordinates of rank {r} at step {step}");
    }
    let want_f = reference::forces(halos, &forces);
    for (r, got) in ranks.forces().unwrap().iter().enumerate() {
        for (i, (a, b)) in got.iter().zip(&want_f[r]).enumerate() {
            for (u, v) in [(a.x, b.x), (a.y, b.y), (a.z, b.z)] {
                assert!(approx::relative_eq!(u, v, epsilon = 1e-5, max_relative = 1e-5), "{test}: force {i} of rank {r} at step {step}: {u} vs {v}");
            }
        }
    }
}

/// Runs `steps` coordinate + force exchanges with fresh random data each step and checks both.
fn run_protocol(test: &str, halos: Vec<RankHalo>, transport: Transport, steps: u64) {
    let Some(g) = gpu_or_skip(test) else { return };
    let module = g.module.clone();
    let mut ranks = LocalRanks::new(halos.clone(), &[module]).unwrap();
    for step in 0..steps {
        exchange_and_check(&format!("{test} {transport:?}"), &mut ranks, &halos, transport, step, 1000 + step);
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
    let mut ranks = LocalRanks::<Float3>::new(halos, std::slice::from_ref(&g.module)).unwrap();
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
fn stale_larger_signals_cannot_satisfy_a_new_phase() {
    let test = "stale_larger_signals_cannot_satisfy_a_new_phase";
    let Some(g) = gpu_or_skip(test) else { return };
    let halos = synthetic::halos(shape([2, 1, 1], 1, 100), 6);
    let mut ranks = LocalRanks::<Float3>::new(halos, std::slice::from_ref(&g.module)).unwrap();
    ranks.set_wait_timeout(Duration::from_millis(300));
    let stream0 = ranks.stream(0).clone();
    // Low-latency words carry their step in every word: a stale signal value does not make rank 0
    // take coordinates rank 1 never sent. It waits, and times out.
    ranks.ranks()[0].fill_signals_for_tests(2000).unwrap();
    ranks.ranks_mut()[0].launch_coordinates(Transport::Fused, &stream0).unwrap();
    match ranks.finish() {
        Err(HaloError::WaitTimeout(t)) => assert_eq!((t.rank, t.peer, t.step_counter), (0, 1, 1), "{test}: words"),
        other => panic!("{test}: words: expected a wait timeout, got {other:?}"),
    }
    ranks.reset_protocol().unwrap();
    // Bulk copies land in `x` behind a signal. The hazard there: signals are compared with `>=`,
    // so a value an earlier phase left in a slot (a later step of 2000) lets rank 0 finish step 1
    // although rank 1 never launched.
    ranks.set_bulk_pulses(&[vec![true], vec![true]]).unwrap();
    ranks.ranks()[0].fill_signals_for_tests(2000).unwrap();
    ranks.ranks_mut()[0].launch_coordinates(Transport::Fused, &stream0).unwrap();
    ranks.finish().unwrap_or_else(|e| panic!("{test}: the stale value was expected to pass silently: {e}"));
    // The collective reset (which every exchange also runs when it is built) clears such values:
    // now the same launch must wait for rank 1 and time out, the slot never set.
    ranks.ranks()[0].fill_signals_for_tests(2000).unwrap();
    ranks.reset_protocol().unwrap();
    ranks.ranks_mut()[0].launch_coordinates(Transport::Fused, &stream0).unwrap();
    match ranks.finish() {
        Err(HaloError::WaitTimeout(t)) => assert_eq!((t.rank, t.peer, t.step_counter, t.seen), (0, 1, 1, 0), "{test}"),
        other => panic!("{test}: expected a wait timeout after the reset, got {other:?}"),
    }
    // And after another reset both ranks run checked steps again.
    ranks.reset_protocol().unwrap();
    ranks.launch_coordinates(Transport::Fused).unwrap();
    ranks.launch_forces(Transport::Fused).unwrap();
    ranks.finish().unwrap();
}

#[test]
fn per_pulse_put_needs_nvshmem() {
    let Some(g) = gpu_or_skip("per_pulse_put_needs_nvshmem") else { return };
    let mut ranks = LocalRanks::<Float3>::new(synthetic::halos(shape([2, 1, 1], 1, 10), 7), std::slice::from_ref(&g.module)).unwrap();
    let err = ranks.launch_coordinates(Transport::PerPulse).unwrap_err();
    assert!(err.to_string().contains("needs NVSHMEM"), "{err}");
}

/// Random values of any element type, for every local element of each rank (or home ones only).
fn random_elements<T: Element>(halos: &[RankHalo], seed: u64, home_only: bool, make: impl Fn(&mut ChaCha8Rng) -> T) -> Vec<Vec<T>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    halos.iter().map(|h| (0..if home_only { h.home_atoms } else { h.total_atoms }).map(|_| make(&mut rng)).collect()).collect()
}

/// The generic kernels for `T`: forward exchange bit-exact, reverse accumulation within rounding.
fn run_element<T: Element>(
    test: &str,
    halos: Vec<RankHalo>,
    transport: Transport,
    steps: u64,
    make: impl Fn(&mut ChaCha8Rng) -> T,
    close: impl Fn(T, T) -> bool,
) {
    let Some(g) = gpu_or_skip(test) else { return };
    let mut ranks = LocalRanks::<T>::new(halos.clone(), std::slice::from_ref(&g.module)).unwrap();
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
            assert_eq!(
                bytemuck::cast_slice::<T, u8>(x),
                bytemuck::cast_slice::<T, u8>(&want_x[r]),
                "{test} {transport:?}: values of rank {r} at step {step}"
            );
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
            run_element(
                &format!("f64 {name}"),
                halos.clone(),
                t,
                20,
                |r| r.random_range(-5.0f64..5.0),
                |a: f64, b: f64| (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
            );
            run_element(
                &format!("f32x4 {name}"),
                halos.clone(),
                t,
                20,
                |r| [r.random_range(-5.0f32..5.0), r.random(), r.random(), -1.0],
                |a: [f32; 4], b: [f32; 4]| (0..4).all(|k| near(a[k], b[k])),
            );
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

/// Each rank's "+1 on every home coordinate": a buffer of ones and the identity map over its home
/// atoms, for [`bump_home`].
type Bump = (halo::gpu::DeviceBuffer<Float3>, halo::kernels::IndexMap);

/// Poisons every rank's coordinates, uploads its `home` coordinates (and `f0` as its forces when
/// given), and returns each rank's [`Bump`].
fn upload_with_bumps(ranks: &LocalRanks, halos: &[RankHalo], home: &[Vec<Float3>], f0: Option<&[Vec<Float3>]>) -> Vec<Bump> {
    let mut bumps = Vec::new();
    for (r, rank) in ranks.ranks().iter().enumerate() {
        rank.x.fill_bytes(0xFF).unwrap();
        rank.upload_coordinates(&home[r]).unwrap();
        if let Some(f0) = f0 {
            rank.f.copy_from_host(&f0[r]).unwrap();
        }
        let n = halos[r].home_atoms;
        let ones = halo::gpu::DeviceBuffer::from_host(rank.context(), &vec![Float3::new(1.0, 1.0, 1.0); n]).unwrap();
        let map = halo::kernels::IndexMap::new(rank.context(), &(0..n as u32).collect::<Vec<_>>()).unwrap();
        bumps.push((ones, map));
    }
    bumps
}

/// Adds 1 to every home coordinate of every rank, on the rank's stream (no host work between).
fn bump_home(module: &halo::gpu::KernelModule, ranks: &LocalRanks, bumps: &[Bump]) {
    for (r, (ones, map)) in bumps.iter().enumerate() {
        halo::kernels::unpack(module, ranks.stream(r), ones, map, &ranks.ranks()[r].x, true).unwrap();
    }
}

fn check_coordinates(test: &str, ranks: &LocalRanks, halos: &[RankHalo], home: &[Vec<Float3>]) {
    let want = reference::coordinates(halos, home);
    for (r, got) in ranks.coordinates().unwrap().iter().enumerate() {
        assert_eq!(bits(got), bits(&want[r]), "{test}: coordinates of rank {r}");
    }
}

/// Poisons every rank's coordinates and forces, then uploads its `home` coordinates and the
/// starting forces `f0`.
fn upload_poisoned(ranks: &[halo::exchange::RankExchange], home: &[Vec<Float3>], f0: &[Vec<Float3>]) {
    for (r, rank) in ranks.iter().enumerate() {
        rank.x.fill_bytes(0xFF).unwrap();
        rank.upload_coordinates(&home[r]).unwrap();
        rank.f.fill_bytes(0xFF).unwrap();
        rank.f.copy_from_host(&f0[r]).unwrap();
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
    let module = g.module.clone();
    for pulses in [1, 2] {
        let halos = synthetic::halos(shape([3, 1, 1], pulses, 700), 21);
        // Not staged: it waits on the host for every stream, rank 2's included, inside the step.
        for transport in [Transport::Fused, Transport::FusedTma, Transport::PerPulseDirect, Transport::DirectCopy] {
            let test = format!("ring of 3, {pulses} pulse(s), {transport:?}");
            let mut ranks = LocalRanks::<Float3>::new(halos.clone(), std::slice::from_ref(&module)).unwrap();
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

/// Words defect 1: rank 0 sends 1100 atoms to rank 1, whose pulse back is empty, so no word of
/// rank 1's ever reaches rank 0. Coordinate-only loop with rank 1 held back: before the fix
/// nothing held rank 0 (the credit rule took the empty pulse for a synchronisation), it ran its
/// launches ahead and overwrote the slot of the pair that rank 1 was about to poll, and rank 1
/// timed out. Force-only loop with rank 0 held back: the mirror image (rank 1 pushes, hears
/// nothing back). Now the writer waits for the reader's credit; checked against the CPU reference.
#[test]
fn empty_reverse_pulse() {
    const STEPS: usize = 6;
    let Some(g) = gpu_or_skip("empty_reverse_pulse") else { return };
    let module = g.module.clone();
    let halos = synthetic::one_way_pair(3000, 1100);
    for transport in [Transport::Fused, Transport::FusedTma, Transport::PerPulseDirect, Transport::DirectCopy] {
        let test = format!("empty_reverse_pulse, {transport:?}");
        // Stores to every peer: the fused kernel moves the pulse as low-latency words.
        let mut ranks = LocalRanks::<Float3>::direct(halos.clone(), std::slice::from_ref(&module)).unwrap();
        assert_eq!(ranks.ranks()[1].receives_words(), vec![true], "{test}: rank 1 should poll words");
        for r in ranks.ranks_mut() {
            r.set_wait_timeout(Duration::from_secs(3));
        }
        let home = integer_values(&halos, 7, true);
        let f0 = integer_values(&halos, 8, false);
        for (r, rank) in ranks.ranks().iter().enumerate() {
            rank.x.fill_bytes(0xFF).unwrap();
            rank.upload_coordinates(&home[r]).unwrap();
            rank.f.copy_from_host(&f0[r]).unwrap();
        }
        // `late` starts late; the other queues STEPS launches of one direction and runs ahead as
        // far as the protocol lets it.
        let mut held_back = |late: usize, forces: bool| {
            let gate = Gate::close(&module, ranks.stream(late));
            for _ in 0..STEPS {
                if forces { ranks.launch_forces(transport) } else { ranks.launch_coordinates(transport) }.unwrap();
            }
            std::thread::sleep(Duration::from_millis(300));
            gate.open();
            ranks.finish().unwrap_or_else(|e| panic!("{test}, rank {late} late, forces only {forces}: {e}"));
            gate.check();
        };
        held_back(1, false);
        held_back(0, true);
        check_coordinates(&test, &ranks, &halos, &home);
        check_forces(&test, &ranks, &forces_after(&halos, &f0, STEPS));
    }
}

/// A coordinate credit whose wait expired writes nothing into its receiver's `x`: on a ring of
/// three (where the senders need credits in a loop of one direction), rank 2 is held behind a
/// gate past rank 0's 300 ms wait timeout while rank 0 runs two coordinate steps, each on home
/// coordinates bumped by 1 first. Rank 0's second step finds no credit (rank 2 has not read the
/// first) and must leave rank 2's `x` as the first step wrote it; rank 2, released, takes the
/// first step's values under the first step's signal. Before the fix the per-pulse and bulk-copy
/// kernels wrote the second step's values anyway, and rank 2 read them as the first step's.
#[test]
fn an_expired_credit_writes_nothing_into_the_peer() {
    let Some(g) = gpu_or_skip("an_expired_credit_writes_nothing_into_the_peer") else { return };
    let module = g.module.clone();
    let halos = synthetic::halos(shape([3, 1, 1], 1, 1200), 71);
    // Rank 0 sends to rank 2, which sends to rank 1, not back: rank 0 needs rank 2's credit.
    assert_eq!((halos[0].pulses[0].send_rank, halos[2].pulses[0].send_rank), (2, 1), "the ring's direction");
    for transport in [Transport::PerPulseDirect, Transport::FusedTma] {
        let test = format!("an_expired_credit_writes_nothing_into_the_peer, {transport:?}");
        let mut ranks = LocalRanks::<Float3>::direct(halos.clone(), std::slice::from_ref(&module)).unwrap();
        for r in ranks.ranks_mut() {
            r.set_wait_timeout(Duration::from_millis(300));
        }
        let home0 = integer_values(&halos, 73, true);
        let bumps = upload_with_bumps(&ranks, &halos, &home0, None);
        let gate = Gate::close(&module, ranks.stream(2));
        for _ in 0..2 {
            bump_home(&module, &ranks, &bumps);
            ranks.launch_coordinates(transport).unwrap();
        }
        std::thread::sleep(Duration::from_millis(1500));
        gate.open();
        let e = ranks.finish().err().unwrap_or_else(|| panic!("{test}: waits expired, yet finish passed"));
        assert!(e.to_string().contains("waited"), "{test}: {e}");
        gate.check();
        // Rank 2's halo from rank 0 holds rank 0's home coordinates after one bump.
        let once: Vec<Vec<Float3>> = home0.iter().map(|h| h.iter().map(|v| *v + Float3::new(1.0, 1.0, 1.0)).collect()).collect();
        let want = reference::coordinates(&halos, &once);
        let got = ranks.coordinates().unwrap();
        let p = &halos[2].pulses[0];
        let range = p.atom_offset..p.atom_offset + p.recv_size;
        assert_eq!(p.recv_rank, 0, "{test}: rank 2 receives from rank 0");
        assert_eq!(bits(&got[2][range.clone()]), bits(&want[2][range]), "{test}: rank 2's halo from rank 0 is not the first step's");
    }
}

/// A rank whose wait timed out writes nothing more into its peer, and pushes no forces: two ranks
/// (a pair, which needs no credits: each step's own waits order them), rank 1 held behind a gate
/// past rank 0's 300 ms wait timeout while rank 0 runs two coordinate steps, each on home
/// coordinates bumped by 1 first, then a force step. Rank 0's first step gives up on rank 1's
/// pulse; its second must leave rank 1's `x` as the first wrote it (rank 1, released, takes the
/// first step's values under the first step's signal), and its force step must push nothing
/// (its halo may be stale), so rank 1's forces stay as they were and its own waits time out.
/// Before the fix rank 0's second launch wrote the second step's values into rank 1's `x` and
/// signalled them (per-pulse, TMA and bulk-copy pulses), and rank 1 took them as the first step's,
/// then added rank 0's forces (every transport).
#[test]
fn a_timed_out_rank_writes_nothing_into_its_peer_later() {
    let Some(g) = gpu_or_skip("a_timed_out_rank_writes_nothing_into_its_peer_later") else { return };
    let module = g.module.clone();
    let halos = synthetic::halos(shape([2, 1, 1], 1, 1200), 81);
    // `Fused` twice: its pulses as low-latency words, then as bulk copies (the path that writes
    // into the peer's `x`).
    for (transport, bulk) in [(Transport::PerPulseDirect, false), (Transport::FusedTma, false), (Transport::Fused, false), (Transport::Fused, true)] {
        let test = format!("a_timed_out_rank_writes_nothing_into_its_peer_later, {transport:?}{}", if bulk { " (bulk copies)" } else { "" });
        let mut ranks = LocalRanks::<Float3>::direct(halos.clone(), std::slice::from_ref(&module)).unwrap();
        for r in ranks.ranks_mut() {
            r.set_wait_timeout(Duration::from_millis(300));
        }
        if bulk {
            ranks.set_bulk_pulses(&[vec![true], vec![true]]).unwrap();
        }
        let home0 = integer_values(&halos, 83, true);
        let f0 = integer_values(&halos, 84, false);
        let bumps = upload_with_bumps(&ranks, &halos, &home0, Some(&f0));
        let gate = Gate::close(&module, ranks.stream(1));
        for _ in 0..2 {
            bump_home(&module, &ranks, &bumps);
            ranks.launch_coordinates(transport).unwrap();
        }
        ranks.launch_forces(transport).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        gate.open();
        let e = ranks.finish().err().unwrap_or_else(|| panic!("{test}: waits expired, yet finish passed"));
        assert!(e.to_string().contains("waited"), "{test}: {e}");
        gate.check();
        // Rank 1's halo from rank 0 holds rank 0's home coordinates after one bump. Over
        // low-latency words (`Fused` without bulk copies) each word carries its step, so rank 0's
        // second step may also have reached rank 1's second step, with that step's values: one
        // or two bumps.
        let bumped = |k: f32| -> Vec<Vec<Float3>> {
            let home: Vec<Vec<Float3>> = home0.iter().map(|h| h.iter().map(|v| *v + Float3::new(k, k, k)).collect()).collect();
            reference::coordinates(&halos, &home)
        };
        let got = ranks.coordinates().unwrap();
        let p = &halos[1].pulses[0];
        let range = p.atom_offset..p.atom_offset + p.recv_size;
        assert_eq!(p.recv_rank, 0, "{test}: rank 1 receives from rank 0");
        let halo_bits = bits(&got[1][range.clone()]);
        let once = halo_bits == bits(&bumped(1.0)[1][range.clone()]);
        let twice = transport == Transport::Fused && !bulk && halo_bits == bits(&bumped(2.0)[1][range]);
        assert!(once || twice, "{test}: rank 1's halo from rank 0 is not the first step's");
        assert_eq!(bits(&ranks.forces().unwrap()[1]), bits(&f0[1]), "{test}: rank 1 added forces that rank 0 pushed after its timeout");
    }
}

/// The fused kernels launched after the kernel before them instead of overlapping it (what the
/// residency cap chooses where two grids per rank do not fit on the GPU, `residency::fit`), at one
/// block per pulse: every step still checks against the CPU reference.
#[test]
fn fused_kernels_without_overlap_exchange_alike() {
    let test = "fused_kernels_without_overlap_exchange_alike";
    let Some(g) = gpu_or_skip(test) else { return };
    let halos = synthetic::halos(shape([2, 2, 2], 1, 800), 41);
    let mut ranks = LocalRanks::<Float3>::new(halos.clone(), std::slice::from_ref(&g.module)).unwrap();
    for r in ranks.ranks_mut() {
        assert!(r.overlapped_launches(), "one GPU holds two grids of eight small ranks");
        r.fit_grids(halo::exchange::residency::ResidentGrids { per_pulse: 1, overlapped: false });
        assert!(!r.overlapped_launches());
    }
    for step in 0..50 {
        exchange_and_check(test, &mut ranks, &halos, Transport::Fused, step, 7000 + step);
    }
}

/// One direction at a time for many steps, the home values changing every step on the GPU (no
/// host work in between): rings of three and 2x2x2, where credits bound the fast senders, and two
/// ranks, where the step's own signals do. Checked at the end against the CPU reference.
#[test]
fn one_direction_loops_with_changing_data_end_right() {
    const STEPS: usize = 200;
    let Some(g) = gpu_or_skip("one_direction_loops_with_changing_data_end_right") else { return };
    let module = g.module.clone();
    for (name, halos) in [
        ("ring of 3 x 2 pulses", synthetic::halos(shape([3, 1, 1], 2, 900), 31)),
        ("2x2x2", synthetic::halos(shape([2, 2, 2], 1, 600), 32)),
        ("2 ranks x 2 pulses", synthetic::halos(shape([2, 1, 1], 2, 900), 33)),
    ] {
        for transport in [Transport::Fused, Transport::FusedTma, Transport::PerPulseDirect, Transport::DirectCopy, Transport::Staged] {
            let test = format!("{name}, {transport:?}");
            let mut ranks = LocalRanks::<Float3>::new(halos.clone(), std::slice::from_ref(&module)).unwrap();
            let home0 = integer_values(&halos, 5, true);
            let f0 = integer_values(&halos, 6, false);
            let bumps = upload_with_bumps(&ranks, &halos, &home0, Some(&f0));
            for _ in 0..STEPS {
                // Every home coordinate += 1 on the rank's stream, then the coordinate halo.
                bump_home(&module, &ranks, &bumps);
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
    let module = g.module.clone();
    for (name, halos) in
        [("2 ranks", synthetic::halos(shape([2, 1, 1], 2, 20_000), 41)), ("2x2x1", synthetic::halos(shape([2, 2, 1], 1, 12_000), 42))]
    {
        let mut ranks = LocalRanks::<Float3>::new(halos.clone(), std::slice::from_ref(&module)).unwrap();
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
    let module = g.module.clone();
    for transport in [Transport::Fused, Transport::FusedTma, Transport::PerPulseDirect] {
        let halos = synthetic::halos(shape([2, 2, 2], 1, 1500), 71);
        let test = format!("2x2x2 graph, {transport:?}");
        let mut ranks = LocalRanks::<Float3>::new(halos.clone(), std::slice::from_ref(&module)).unwrap();
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

/// A new decomposition in the old buffers (`replan`, what the MD step does at a search step): the
/// exchange keeps its signals and step counters, the next steps deliver the new halos exactly, and
/// a decomposition that does not fit is refused without changing anything. Home counts, maps and
/// offsets all change between the layouts (other seeds, other home sizes, other send fractions).
/// The host-driven transports keep their events and plan who waits for whom again.
#[test]
fn replanning_between_steps_keeps_the_protocol_in_step() {
    let Some(g) = gpu_or_skip("replanning_between_steps_keeps_the_protocol_in_step") else { return };
    let module = g.module.clone();
    for (grid, pulses, transport) in [
        ([2, 1, 1], 1, Transport::Fused),
        ([2, 2, 2], 1, Transport::Fused),
        ([4, 1, 1], 2, Transport::Fused),
        ([2, 2, 2], 1, Transport::Staged),
        ([4, 1, 1], 2, Transport::Staged),
        ([2, 2, 2], 1, Transport::DirectCopy),
        ([4, 1, 1], 2, Transport::DirectCopy),
    ] {
        let first = synthetic::halos(shape(grid, pulses, 1200), 90);
        let sizes = halo::exchange::SharedSizes::of(&first).with_headroom(0.5);
        let mut ranks = LocalRanks::<Float3>::with_sizes(first.clone(), std::slice::from_ref(&module), sizes).unwrap();
        let mut layouts = vec![first];
        for (k, (home, fraction)) in [(1000, 0.3), (1300, 0.35), (800, 0.25)].into_iter().enumerate() {
            let mut s = shape(grid, pulses, home);
            s.send_fraction = fraction;
            layouts.push(synthetic::halos(s, 91 + k as u64));
        }
        let mut steps = 0u64;
        for (k, halos) in layouts.iter().enumerate() {
            let test = format!("replan {grid:?} x{pulses} {transport}, layout {k}");
            if k > 0 {
                assert!(ranks.replan(halos.clone()).unwrap(), "{test}: fits the headroom");
            }
            for _ in 0..5 {
                let home = integer_values(halos, 300 + steps, true);
                let f0 = integer_values(halos, 700 + steps, false);
                upload_poisoned(ranks.ranks(), &home, &f0);
                ranks.launch_coordinates(transport).unwrap();
                ranks.launch_forces(transport).unwrap();
                ranks.finish().unwrap_or_else(|e| panic!("{test}: {e}"));
                steps += 1;
                check_coordinates(&test, &ranks, halos, &home);
                check_forces(&test, &ranks, &reference::forces(halos, &f0));
            }
            // The device counters belong to the GPU-initiated kernels.
            for r in ranks.ranks().iter().filter(|_| transport.gpu_initiated()) {
                let s = r.protocol_state().unwrap();
                assert_eq!((s.x_epoch, s.f_epoch), (steps, steps), "{test}: rank {} counters continue", r.rank());
            }
        }
        // Twice the atoms: does not fit, nothing changes, the last layout still runs.
        let big = synthetic::halos(shape(grid, pulses, 4000), 99);
        assert!(!ranks.replan(big).unwrap(), "{grid:?}: a layout beyond the headroom is refused");
        let halos = layouts.last().unwrap();
        let home = integer_values(halos, 1, true);
        for (r, rank) in ranks.ranks().iter().enumerate() {
            rank.upload_coordinates(&home[r]).unwrap();
        }
        ranks.launch_coordinates(transport).unwrap();
        ranks.launch_forces(transport).unwrap();
        ranks.finish().unwrap();
        check_coordinates("replan refused", &ranks, halos, &home);
    }
}

/// What a driver does around a failure and the next search (the MD step under routing failover):
/// a collective reset zeroes every rank's counters, then a replan moves the exchange to a new
/// layout in the same buffers, and the steps after it run from step 1 on every rank. Driven
/// through the `Exchange` trait on the jitter wrapper with GPU delays (`Perturbed` forwards the
/// replan, and the grids keep the cap that leaves room for the delay kernels).
#[test]
fn a_replan_after_a_reset_under_gpu_jitter_restarts_every_rank_from_step_one() {
    use halo::exchange::perturb::{Jitter, JitterSide, Perturbation, Perturbed};
    let Some(g) = gpu_or_skip("a_replan_after_a_reset_under_gpu_jitter_restarts_every_rank_from_step_one") else { return };
    let module = g.module.clone();
    let first = synthetic::halos(shape([4, 1, 1], 1, 1200), 50);
    let mut s = shape([4, 1, 1], 1, 1000);
    s.send_fraction = 0.3;
    let second = synthetic::halos(s, 51);
    let sizes = halo::exchange::SharedSizes::of(&first).with_headroom(0.5);
    let jitter = Jitter { max_us: 40, seed: 9, side: JitterSide::Gpu };
    let inner = LocalRanks::<Float3>::with_sizes(first.clone(), &[module], sizes).unwrap();
    let mut x: Box<dyn Exchange> = Box::new(Perturbed::new(inner, Perturbation::new(Some(jitter), None).unwrap()).unwrap());
    let step = |x: &mut Box<dyn Exchange>, halos: &[RankHalo], seed: u64, test: &str| {
        let home = integer_values(halos, seed, true);
        let f0 = integer_values(halos, seed + 1000, false);
        upload_poisoned(x.local_ranks(), &home, &f0);
        x.exchange_forward(Transport::Fused).unwrap();
        x.exchange_reverse_accumulate(Transport::Fused).unwrap();
        x.finish().unwrap_or_else(|e| panic!("{test}: {e}"));
        let (want_x, want_f) = (reference::coordinates(halos, &home), reference::forces(halos, &f0));
        for (r, (got_x, got_f)) in x.read_forward().unwrap().iter().zip(x.read_reverse().unwrap()).enumerate() {
            assert_eq!(bits(got_x), bits(&want_x[r]), "{test}: coordinates of rank {r}");
            assert_eq!(bits(&got_f), bits(&want_f[r]), "{test}: forces of rank {r}");
        }
    };
    let epochs = |x: &dyn Exchange| x.local_ranks().iter().map(|r| r.protocol_state().map(|s| (s.x_epoch, s.f_epoch)).unwrap()).collect::<Vec<_>>();
    for k in 0..4 {
        step(&mut x, &first, 10 + k, &format!("first layout, step {k}"));
    }
    assert_eq!(epochs(&x), vec![(4, 4); 4]);
    x.reset_protocol().unwrap();
    assert_eq!(epochs(&x), vec![(0, 0); 4], "the reset zeroes every rank's counters");
    assert!(x.replan(second.clone()).unwrap(), "the second layout fits the headroom");
    for k in 0..4 {
        step(&mut x, &second, 20 + k, &format!("after the reset and the replan, step {k}"));
    }
    assert_eq!(epochs(&x), vec![(4, 4); 4], "every rank counted from step 1 again");
}

// ------------------------------------------------------------------------------------------------
// Issue 17: per-pulse paths inside one fused launch.

/// Every pattern of bulk copies and stores over a rank's pulses (one fused launch mixing them),
/// each rank its own pattern, poisoned outputs, random data, every element type, forwarding
/// chains (2x2x2: later pulses carry atoms received in earlier ones, so bulk pulses wait for store
/// pulses and the reverse), empty and one-atom pulses. Checked against the CPU reference.
#[test]
fn pulses_of_one_rank_take_different_paths_in_one_fused_launch() {
    use kernels_gpu::abi::CoordPath;
    let Some(g) = gpu_or_skip("pulses_of_one_rank_take_different_paths_in_one_fused_launch") else { return };
    let module = g.module.clone();
    let mut empty = shape([2, 2, 1], 2, 40);
    empty.send_fraction = 0.0;
    let mut tiny = shape([2, 2, 1], 1, 1);
    tiny.send_fraction = 1.0;
    let cases = [
        ("2x2x2", synthetic::halos(shape([2, 2, 2], 1, 1500), 81)),
        ("2x2x2 two pulses", synthetic::halos(shape([2, 2, 2], 2, 900), 82)),
        ("ring of 3 x 3 pulses", synthetic::halos(shape([3, 1, 1], 3, 2000), 83)),
        ("empty", synthetic::halos(empty, 84)),
        ("tiny", synthetic::halos(tiny, 85)),
    ];
    for (name, halos) in cases {
        let pulses = halos[0].pulses.len();
        // Rank r's pulse p copies in bulk when bit p of (pattern + r) is set: every pattern on
        // rank 0, shifted ones on the others, so ranks mix differently.
        for pattern in 0..(1u32 << pulses) {
            let test = format!("{name}, pattern {pattern:b}");
            let mut ranks = LocalRanks::<Float3>::direct(halos.clone(), std::slice::from_ref(&module)).unwrap();
            let bulk: Vec<Vec<bool>> = (0..halos.len())
                .map(|r| {
                    let bits = pattern.wrapping_add(r as u32);
                    (0..pulses).map(|p| bits >> p & 1 == 1).collect()
                })
                .collect();
            ranks.set_bulk_pulses(&bulk).unwrap();
            for (r, rank) in ranks.ranks().iter().enumerate() {
                let want: Vec<CoordPath> = bulk[r].iter().map(|&b| if b { CoordPath::Bulk } else { CoordPath::Store }).collect();
                assert_eq!(rank.coord_paths(), want, "{test}: rank {r}");
                assert_eq!(rank.any_bulk(), bulk[r].contains(&true));
                // Each pulse arrives as words exactly when its sender stores it.
                let words: Vec<bool> = halos[r].pulses.iter().enumerate().map(|(p, s)| !bulk[s.recv_rank][p]).collect();
                assert_eq!(rank.receives_words(), words, "{test}: rank {r}");
            }
            for step in 0..6u64 {
                exchange_and_check(&test, &mut ranks, &halos, Transport::Fused, step, 7000 + step);
            }
        }
    }
}

/// The generic instantiations mix paths too (bulk chunks of 12 `f32`, 6 `f64`, 3 `[f32; 4]` per
/// lane): rank 0 copies its first pulse in bulk and stores the second, rank 1 the reverse.
#[test]
fn mixed_paths_for_every_element_type() {
    let near = |a: f32, b: f32| approx::relative_eq!(a, b, epsilon = 1e-5, max_relative = 1e-5);
    let halos = synthetic::halos(shape([2, 1, 1], 2, 3001), 86);
    fn mixed<T: Element>(test: &str, halos: &[RankHalo], make: impl Fn(&mut ChaCha8Rng) -> T, close: impl Fn(T, T) -> bool) {
        let Some(g) = gpu_or_skip(test) else { return };
        let mut ranks = LocalRanks::<T>::direct(halos.to_vec(), std::slice::from_ref(&g.module)).unwrap();
        let bulk: Vec<Vec<bool>> = (0..halos.len()).map(|r| vec![r == 0, r == 1]).collect();
        ranks.set_bulk_pulses(&bulk).unwrap();
        for step in 0..10 {
            let home = random_elements(halos, 300 + step, true, &make);
            let forces = random_elements(halos, 600 + step, false, &make);
            for (r, rank) in ranks.ranks().iter().enumerate() {
                rank.x.fill_bytes(0xFF).unwrap();
                rank.upload_coordinates(&home[r]).unwrap();
                rank.f.copy_from_host(&forces[r]).unwrap();
            }
            ranks.exchange_forward(Transport::Fused).unwrap();
            ranks.exchange_reverse_accumulate(Transport::Fused).unwrap();
            ranks.finish().unwrap_or_else(|e| panic!("{test} step {step}: {e}"));
            let (want_x, want_f) = (reference::coordinates(halos, &home), reference::forces(halos, &forces));
            for (r, (x, f)) in ranks.coordinates().unwrap().iter().zip(ranks.forces().unwrap()).enumerate() {
                assert_eq!(bytemuck::cast_slice::<T, u8>(x), bytemuck::cast_slice::<T, u8>(&want_x[r]), "{test}: rank {r} step {step}");
                assert!(f.iter().zip(&want_f[r]).all(|(a, b)| close(*a, *b)), "{test}: accumulated values of rank {r} at step {step}");
            }
        }
    }
    mixed("mixed f32", &halos, |r| r.random_range(-5.0f32..5.0), near);
    mixed("mixed f64", &halos, |r| r.random_range(-5.0f64..5.0), |a: f64, b: f64| (a - b).abs() <= 1e-12 * (1.0 + b.abs()));
    mixed(
        "mixed f32x4",
        &halos,
        |r| [r.random_range(-5.0f32..5.0), r.random(), r.random(), -1.0],
        |a: [f32; 4], b: [f32; 4]| (0..4).all(|k| near(a[k], b[k])),
    );
}

/// The router's plans drive the per-pulse paths of ranks in one process: with pair 0-1 forced to
/// `nvlink-tma` and the rest to `nvlink-store`, rank 0 of a 2x2x1 grid copies the pulses to rank 1
/// in bulk and stores the others, in one launch; the plans and the installed paths agree, and the
/// exchange is checked. A bulk copy towards a peer reached by puts is refused.
#[test]
fn routed_plans_mix_paths_per_pulse_in_one_process() {
    use halo::route::{RouteConfig, Transport as T};
    use kernels_gpu::abi::CoordPath;
    let Some(g) = gpu_or_skip("routed_plans_mix_paths_per_pulse_in_one_process") else { return };
    let module = g.module.clone();
    let halos = synthetic::halos(shape([2, 2, 1], 2, 2000), 87);
    let facts = halo::route::gpu_facts::gpu_facts_of(&[module.context().ordinal()]).unwrap();
    let facts: Vec<_> = (0..halos.len()).map(|_| facts[0].clone()).collect();
    let mut config = RouteConfig::default();
    config
        .add_cli_overrides(
            "--route-override",
            &["0-1=nvlink-tma".into(), "0-2=nvlink-store".into(), "1-3=nvlink-store".into(), "2-3=nvlink-store".into()],
        )
        .unwrap();
    let mut routers = halo::route::local_routers(&facts, &config).unwrap();
    let plans = halo::route::plan_local_with::<Float3>(&mut routers, &halos).unwrap();
    assert_eq!((plans[0].transport(1), plans[0].transport(2)), (Some(T::NvlinkTma), Some(T::NvlinkStore)));
    let mut ranks = LocalRanks::<Float3>::with_plans(halos.clone(), std::slice::from_ref(&module), &plans).unwrap();
    let paths = ranks.ranks()[0].coord_paths();
    for (p, spec) in halos[0].pulses.iter().enumerate() {
        let want = if spec.send_rank == 1 { CoordPath::Bulk } else { CoordPath::Store };
        assert_eq!(paths[p], want, "rank 0 pulse {p} to rank {}", spec.send_rank);
    }
    assert!(paths.contains(&CoordPath::Bulk) && paths.contains(&CoordPath::Store), "{paths:?}");
    assert_eq!(ranks.routes().len(), 4);
    for step in 0..20 {
        exchange_and_check("routed mix", &mut ranks, &halos, Transport::Fused, step, 50 + step);
    }
    // The library default plans too (LocalRanks::new), and reports what it chose.
    let routed = LocalRanks::<Float3>::new(halos.clone(), &[module]).unwrap();
    assert_eq!(routed.routes().len(), halos.len());
    assert!(routed.routes().iter().all(|s| s.peers.iter().all(|p| p.transport != T::NvshmemPut)));
}

/// Each rank's own verdict on the step (its device wait status), after `finish`.
fn verdicts(ranks: &LocalRanks<Float3>) -> Vec<Result<(), HaloError>> {
    ranks.ranks().iter().map(|r| r.check_status()).collect()
}

/// The timeout a rank reported, or a panic naming what it reported instead.
#[track_caller]
fn timeout_of(test: &str, rank: usize, verdict: &Result<(), HaloError>) -> halo::exchange::WaitTimeout {
    match verdict {
        Err(HaloError::WaitTimeout(t)) => t.clone(),
        Ok(()) => panic!("{test}: rank {rank} reported Ok; it was expected to time out"),
        Err(e) => panic!("{test}: rank {rank}: expected a wait timeout, got {e}"),
    }
}

/// Issue 39, defect 2 (`timed_out_word`): a rank whose word wait timed out must not hand what it
/// has on as valid. On a 2x2 grid, rank A forwards in pulse 1 (to C) atoms it receives in pulse 0
/// (from B). B is held back on the GPU past A's short timeout (C and the others wait longer, and B
/// then runs): before the fix A stored zeros for the atoms it never got, with the step's flag, so
/// C finished Ok holding wrong coordinates. Now A sends nothing of them and C times out too. The
/// same for forces: A's pulse-1 forces come from C' (held back), and A pushes its pulse-0 halo
/// forces, which they feed, to B'; before the fix B' accumulated the incomplete push and said Ok.
/// Every rank that reports Ok must hold exact values; the ranks downstream of the timeout report.
#[test]
fn timed_out_word() {
    let test = "timed_out_word";
    let Some(g) = gpu_or_skip(test) else { return };
    let module = g.module.clone();
    let halos = synthetic::halos(shape([2, 2, 1], 1, 400), 39);
    let a = 0;
    let (p0, p1) = (&halos[a].pulses[0], &halos[a].pulses[1]);
    assert!(
        p1.index_map.iter().any(|&i| (i as usize) >= p0.atom_offset && (i as usize) < p0.atom_offset + p0.recv_size),
        "{test}: the layout must forward pulse 0's atoms in pulse 1"
    );
    let mut ranks = LocalRanks::<Float3>::new(halos.clone(), std::slice::from_ref(&module)).unwrap();
    let timeouts = |ranks: &mut LocalRanks<Float3>| {
        ranks.set_wait_timeout(Duration::from_secs(2));
        ranks.ranks_mut()[a].set_wait_timeout(Duration::from_millis(200));
    };

    // Coordinates: B is late, A times out, C must not take A's forwarded atoms: as words (fused),
    // behind a withheld signal (the TMA kernel's bulk copies, the per-pulse kernels' stores).
    let (b, c) = (p0.recv_rank, p1.send_rank);
    assert_ne!(b, c, "{test}: B and C must differ");
    let home = integer_values(&halos, 5, true);
    let f0 = integer_values(&halos, 6, false);
    for transport in [Transport::Fused, Transport::FusedTma, Transport::PerPulseDirect] {
        let test = format!("{test}, coordinates, {transport:?}");
        timeouts(&mut ranks);
        upload_poisoned(ranks.ranks(), &home, &f0);
        let gate = Gate::close(&module, ranks.stream(b));
        ranks.launch_coordinates(transport).unwrap();
        std::thread::sleep(Duration::from_millis(700));
        gate.open();
        let _ = ranks.finish();
        gate.check();
        let verdict = verdicts(&ranks);
        let want = reference::coordinates(&halos, &home);
        for (r, got) in ranks.coordinates().unwrap().iter().enumerate() {
            if verdict[r].is_ok() {
                assert_eq!(bits(got), bits(&want[r]), "{test}: rank {r} reported Ok holding wrong coordinates");
            }
        }
        let t = timeout_of(&test, a, &verdict[a]);
        assert_eq!((t.peer, t.pulse), (b as i32, 0), "{test}: rank {a}: {t}");
        let t = timeout_of(&test, c, &verdict[c]);
        assert_eq!((t.peer, t.pulse), (a as i32, 1), "{test}: rank {c}: {t}");
        ranks.reset_protocol().unwrap();
        ranks.set_wait_timeout(Duration::from_secs(3));
        exchange_and_check(&test, &mut ranks, &halos, transport, 0, 77);
        ranks.reset_protocol().unwrap();
    }

    // Forces: C' is late, A's pulse-1 receive times out, B' must not take A's pulse-0 push.
    let (c2, b2) = (p1.send_rank, p0.recv_rank);
    ranks.launch_coordinates(Transport::Fused).unwrap();
    ranks.finish().unwrap();
    timeouts(&mut ranks);
    upload_poisoned(ranks.ranks(), &home, &f0);
    let gate = Gate::close(&module, ranks.stream(c2));
    ranks.launch_forces(Transport::Fused).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    gate.open();
    let _ = ranks.finish();
    gate.check();
    let verdict = verdicts(&ranks);
    let want = forces_after(&halos, &f0, 1);
    for (r, got) in ranks.forces().unwrap().iter().enumerate() {
        if verdict[r].is_ok() {
            assert_eq!(bits(got), bits(&want[r]), "{test}: rank {r} reported Ok holding wrong forces");
        }
    }
    // A's pulse-1 receive, or its pulse-0 row's wait for that receive (the same deadline), reports.
    let t = timeout_of(test, a, &verdict[a]);
    assert!(t.pulse == 1 && (t.peer == c2 as i32 || t.kind == Some(halo::abi::WaitKind::LocalBlocks)), "{test}: rank {a}: {t}");
    let t = timeout_of(test, b2, &verdict[b2]);
    assert_eq!((t.peer, t.pulse), (a as i32, 0), "{test}: rank {b2}: {t}");
    ranks.reset_protocol().unwrap();
    ranks.set_wait_timeout(Duration::from_secs(3));
    exchange_and_check(test, &mut ranks, &halos, Transport::Fused, 1, 78);
}

/// Issue 39, defect 5 (`word_timeout_reports_step`): a word wait that times out names the step it
/// waited for and the step the slot still held, not their flags (`step | 1`: step 2 read as 3, 4
/// as 5). Two ranks, coordinates as words; rank 1 skips one launch.
#[test]
fn word_timeout_reports_step() {
    let test = "word_timeout_reports_step";
    let Some(g) = gpu_or_skip(test) else { return };
    let halos = synthetic::halos(shape([2, 1, 1], 1, 100), 6);
    let mut ranks = LocalRanks::<Float3>::new(halos, std::slice::from_ref(&g.module)).unwrap();
    ranks.set_wait_timeout(Duration::from_millis(200));
    assert!(ranks.ranks()[0].receives_words().iter().all(|&w| w), "{test}: the pulse must arrive as words");
    let stream0 = ranks.stream(0).clone();
    // (clean steps before it, the step rank 0 then waits for alone, the step its slot holds:
    // the one two back, or none).
    for (clean, want_step, want_seen) in [(3u64, 4u64, 2u64), (1, 2, 0)] {
        for _ in 0..clean {
            ranks.launch_coordinates(Transport::Fused).unwrap();
            ranks.finish().unwrap_or_else(|e| panic!("{test}: clean step: {e}"));
        }
        ranks.ranks_mut()[0].launch_coordinates(Transport::Fused, &stream0).unwrap();
        let result = ranks.finish();
        let t = timeout_of(test, 0, &result);
        let msg = t.to_string();
        assert_eq!(
            (t.rank, t.peer, t.kind, t.step_counter, t.seen),
            (0, 1, Some(halo::abi::WaitKind::CoordSignal), want_step, want_seen),
            "{test}: {msg}"
        );
        assert!(msg.contains(&format!("at step {want_step}")), "{test}: {msg}");
        ranks.reset_protocol().unwrap();
    }
}

/// Issue 39, defect 6 (`one_deadline_per_wait`): a thread that takes several elements in one wait
/// gives up one timeout after it started waiting, not one timeout per element. Two ranks, forces
/// as words, one block per pulse: thread 0 of rank 0 takes elements 0, S, 2S, ... (S the block
/// size). Rank 1 never launches; the test writes every word of the push itself, all at once except
/// thread 0's first four elements, which arrive one by one, 0.45 timeouts apart. Before the fix
/// every element restarted the clock, so rank 0 finished Ok after 1.8 timeouts; now it times out
/// once, after about one timeout.
#[test]
fn one_deadline_per_wait() {
    let test = "one_deadline_per_wait";
    let Some(g) = gpu_or_skip(test) else { return };
    let halos = synthetic::halos(shape([2, 1, 1], 1, 12_000), 8);
    // Stores to every peer, not the router's paths: a pulse of this size (about 50 KB) may be
    // copied in bulk by the router's choice, and its coordinates then arrive behind a signal
    // instead of as words (the precondition below). The forces this test is about are words either way.
    let mut ranks = LocalRanks::<Float3>::direct(halos.clone(), std::slice::from_ref(&g.module)).unwrap();
    ranks.set_wait_timeout(Duration::from_secs(3));
    // One clean step of each direction (the protocol's state as any later step finds it).
    ranks.launch_coordinates(Transport::Fused).unwrap();
    ranks.launch_forces(Transport::Fused).unwrap();
    ranks.finish().unwrap();
    let timeout = Duration::from_millis(500);
    let stride = halo::abi::BLOCK_SIZE as usize;
    let count = halos[0].pulses[0].index_map.len();
    assert!(count > 4 * stride, "{test}: {count} elements: thread 0 needs more than four");
    let rank0 = &mut ranks.ranks_mut()[0];
    rank0.cap_grids(1);
    rank0.set_wait_timeout(timeout);
    assert!(rank0.all_direct() && rank0.receives_words().iter().all(|&w| w), "{test}: the peers must be mapped (forces then arrive as words)");
    let epoch = rank0.protocol_state().unwrap().f_epoch + 1;
    let flag = halo::abi::ll::flag(epoch);
    let slot = rank0.recv_slot_at(0, (epoch & 1) as usize);
    let ctx = rank0.context().clone();
    // Element i as words: 3 u64 per Float3, value and flag.
    let words = |i: usize| -> Vec<u64> {
        let v = (i as f32).to_bits();
        (0..3).map(|_| halo::abi::ll::word(v, flag)).collect()
    };
    let write = |first: usize, elems: &[u64]| {
        ctx.bind_to_thread().unwrap();
        // SAFETY: inside rank 0's receive slot of this parity (room for a pulse as words).
        unsafe { cudarc::driver::result::memcpy_htod_sync(slot + (first * 3 * 8) as u64, bytemuck::cast_slice::<u64, u8>(elems)) }.unwrap();
    };
    let late = [0, stride, 2 * stride, 3 * stride];
    let early: Vec<u64> = (0..count).flat_map(|i| if late.contains(&i) { vec![0; 3] } else { words(i) }).collect();
    write(0, &early);
    let stream0 = ranks.stream(0).clone();
    let started = std::time::Instant::now();
    ranks.ranks_mut()[0].launch_forces(&stream0).unwrap();
    for &i in &late {
        std::thread::sleep(timeout.mul_f64(0.45));
        write(i, &words(i));
    }
    let result = ranks.finish();
    let took = started.elapsed();
    let t = timeout_of(test, 0, &result);
    assert_eq!((t.peer, t.kind), (1, Some(halo::abi::WaitKind::ForceSignal)), "{test}: {t}");
    // One timeout (plus a check interval's polls), not one per element.
    assert!(
        t.waited_ns >= timeout.as_nanos() as u64 && t.waited_ns < timeout.mul_f64(1.4).as_nanos() as u64,
        "{test}: waited {} ms: {t}",
        t.waited_ns / 1_000_000
    );
    assert!(took >= timeout, "{test}: finished after {took:?}");
}
