//! The timeline probe on the GPU: the stamped fused kernels (`fused_coords_timeline`,
//! `fused_forces_timeline`) must exchange exactly like the plain ones (checked against the CPU
//! reference every step, with poisoned halos, mixed with plain launches, in X-only loops and in
//! replayed graphs), and must leave one complete, ordered record per launch. All ranks share GPU
//! 0, so every stamp is read from one clock and cross-rank order can be checked too.
//!
//! A module of the `gpu_exchange` test binary (`gpu_exchange timeline::`), not a binary of its own.

use halo::abi::Float3;
use halo::abi::timeline::{self as layout, coords as xp, forces as fp, pulse_slot};
use halo::exchange::rank::timeline::{Record, TimelineRing, globaltimer_resolution};
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{LocalRanks, RankHalo, Transport, reference};
use halo::gpu::DeviceMemory;
use halo::testing::gpu_or_skip;

fn shape(grid: [usize; 3], pulses: usize, home: usize) -> SyntheticShape {
    SyntheticShape { grid, pulses_per_dim: pulses, home_atoms: home, send_fraction: 0.35, box_len: 7.7 }
}

fn bits(v: &[Float3]) -> Vec<[u32; 3]> {
    v.iter().map(|f| [f.x.to_bits(), f.y.to_bits(), f.z.to_bits()]).collect()
}

/// Fresh random data for step `seed` on every rank, halos poisoned (NaN); returns (home, forces).
fn fill(ranks: &LocalRanks, halos: &[RankHalo], seed: u64) -> (Vec<Vec<Float3>>, Vec<Vec<Float3>>) {
    let home = synthetic::random_values(halos, 1000 + seed, true);
    let forces = synthetic::random_values(halos, 5000 + seed, false);
    for (r, rank) in ranks.ranks().iter().enumerate() {
        rank.x.fill_bytes(0xFF).unwrap();
        rank.upload_coordinates(&home[r]).unwrap();
        rank.f.fill_bytes(0xFF).unwrap();
        rank.f.copy_from_host(&forces[r]).unwrap();
    }
    // The fills run on the legacy stream, which the exchange streams do not wait for.
    ranks.ranks()[0].context().synchronize().unwrap();
    (home, forces)
}

/// Compares what was exchanged with the CPU reference (coordinates bit-exact, forces to 1e-5).
fn check(test: &str, ranks: &mut LocalRanks, halos: &[RankHalo], home: &[Vec<Float3>], forces: Option<&[Vec<Float3>]>) {
    ranks.finish().unwrap_or_else(|e| panic!("{test}: {e}"));
    let want_x = reference::coordinates(halos, home);
    for (r, got) in ranks.coordinates().unwrap().iter().enumerate() {
        assert_eq!(bits(got), bits(&want_x[r]), "{test}: coordinates of rank {r}");
    }
    let Some(forces) = forces else { return };
    let want_f = reference::forces(halos, forces);
    for (r, got) in ranks.forces().unwrap().iter().enumerate() {
        for (i, (a, b)) in got.iter().zip(&want_f[r]).enumerate() {
            for (u, v) in [(a.x, b.x), (a.y, b.y), (a.z, b.z)] {
                assert!(approx::relative_eq!(u, v, epsilon = 1e-5, max_relative = 1e-5), "{test}: force {i} of rank {r}: {u} vs {v}");
            }
        }
    }
}

/// The stamp of `point` of pulse `p`, asserting it was written.
#[track_caller]
fn at(r: &Record, p: u32, point: usize, what: &str) -> u64 {
    let v = r[pulse_slot(p, point).unwrap()];
    assert!(v != 0, "{what}: pulse {p} point {point} never stamped: {r:?}");
    v
}

/// Every record complete and in the order the kernel passes its points (the timer is the same on
/// every SM, so later points never read earlier times).
fn check_records(test: &str, halos: &[RankHalo], xs: &[Vec<Record>], fs: &[Vec<Record>]) {
    let pulses = halos[0].pulses.len().min(layout::MAX_PULSES as usize) as u32;
    for (r, recs) in xs.iter().enumerate() {
        for rec in recs {
            let what = format!("{test}: rank {r} coordinates");
            let (first, last, end) = (rec[layout::ENTRY_FIRST], rec[layout::ENTRY_LAST], rec[layout::END]);
            assert!(first <= last && last <= end, "{what}: entries {first}..{last}, end {end}");
            for p in 0..pulses {
                let credit = at(rec, p, xp::CREDIT, &what);
                let packed = at(rec, p, xp::PACKED, &what);
                let delivered = at(rec, p, xp::DELIVERED, &what);
                let received = at(rec, p, xp::RECEIVED, &what);
                // Ranks in one process reach each other by stores: every pulse goes as
                // low-latency words, so no block is elected.
                let (elected, entry) = (rec[pulse_slot(p, xp::ELECTED).unwrap()], rec[pulse_slot(p, xp::ELECTED_ENTRY).unwrap()]);
                assert_eq!((elected, entry), (0, 0), "{what} p{p}: an election on the words path");
                let chain = [first, credit, packed, delivered, received, end];
                assert!(chain.windows(2).all(|w| w[0] <= w[1]), "{what} p{p}: out of order {chain:?}");
                assert!(last <= end, "{what}");
            }
        }
    }
    for (r, recs) in fs.iter().enumerate() {
        for rec in recs {
            let what = format!("{test}: rank {r} forces");
            let (first, end) = (rec[layout::ENTRY_FIRST], rec[layout::END]);
            for p in 0..pulses {
                let chain = [first, at(rec, p, fp::CHAIN, &what), at(rec, p, fp::PUSHED, &what), at(rec, p, fp::SIGNALLED, &what)];
                assert!(chain.windows(2).all(|w| w[0] <= w[1]), "{what} p{p}: push out of order {chain:?}");
                let recv = [at(rec, p, fp::RECEIVED, &what), at(rec, p, fp::ACCUMULATED, &what), end];
                assert!(recv.windows(2).all(|w| w[0] <= w[1]), "{what} p{p}: receive out of order {recv:?}");
                // Rows after the first count themselves done (the chain); the first row does not.
                if p > 0 {
                    let done = at(rec, p, fp::ROW_DONE, &what);
                    assert!(recv[1] <= done && done <= end, "{what} p{p}: row done at {done}, outside {recv:?}");
                } else {
                    assert_eq!(rec[pulse_slot(p, fp::ROW_DONE).unwrap()], 0, "{what}: pulse 0 counted itself done");
                }
                // The reverse chain: pulse p pushes only once every block of pulse p + 1 has accumulated.
                if p + 1 < pulses {
                    let (later, released) = (at(rec, p + 1, fp::ACCUMULATED, &what), at(rec, p, fp::CHAIN, &what));
                    assert!(later <= released, "{what}: pulse {p} released at {released}, before pulse {} accumulated at {later}", p + 1);
                }
            }
        }
    }
    // One clock: a pulse of step k is taken in only after its sender's launch of step k began
    // (same step = same position). The sender's own "delivered" stamps cannot bound it: they are
    // read after the stores or the put that the receiver may already have seen, so on a fast
    // receiver (or across a tick of a coarse timer) they can be later than its "received" with
    // nothing wrong; the launch's first entry precedes every store of that step.
    for p in 0..pulses {
        for (r, h) in halos.iter().enumerate() {
            let (from_x, from_f) = (h.pulses[p as usize].recv_rank, h.pulses[p as usize].send_rank);
            for (k, rec) in xs[r].iter().enumerate() {
                let began = xs[from_x][k][layout::ENTRY_FIRST];
                assert!(
                    began <= at(rec, p, xp::RECEIVED, test),
                    "{test}: rank {r} took in pulse {p} of step {k} before rank {from_x}'s launch of that step began"
                );
            }
            for (k, rec) in fs[r].iter().enumerate() {
                let began = fs[from_f][k][layout::ENTRY_FIRST];
                assert!(
                    began <= at(rec, p, fp::RECEIVED, test),
                    "{test}: rank {r} took in the forces of pulse {p} of step {k} before rank {from_f}'s launch of that step began"
                );
            }
        }
    }
}

/// Each rank's records in time order.
fn read(rings: &[TimelineRing], launches: usize, test: &str) -> Vec<Vec<Record>> {
    rings
        .iter()
        .enumerate()
        .map(|(r, ring)| {
            let mut v = ring.read().unwrap();
            assert_eq!(v.len(), launches, "{test}: rank {r} has {} records for {launches} launches", v.len());
            v.sort_by_key(|rec| rec[layout::ENTRY_FIRST]);
            v
        })
        .collect()
}

fn stamped_steps_match_the_reference(test: &str, halos: Vec<RankHalo>) {
    let Some(g) = gpu_or_skip(test) else { return };
    let mut ranks = LocalRanks::<Float3>::new(halos.clone(), std::slice::from_ref(&g.module)).unwrap();
    const STEPS: u64 = 60;
    let ring = |_| TimelineRing::new(&g.ctx, STEPS as usize).unwrap();
    let (xr, fr): (Vec<_>, Vec<_>) = (ranks.ranks().iter().map(ring).collect(), ranks.ranks().iter().map(ring).collect());
    let streams = ranks.streams().to_vec();
    let stamped = |ranks: &mut LocalRanks, forces: bool| {
        for (r, rank) in ranks.ranks_mut().iter_mut().enumerate() {
            let done = if forces { rank.launch_forces_timeline(&streams[r], &fr[r]) } else { rank.launch_coordinates_timeline(&streams[r], &xr[r]) };
            done.unwrap_or_else(|e| panic!("{test}: {e}"));
        }
    };
    let (mut x_launches, mut f_launches) = (0, 0);
    for step in 0..STEPS {
        let (home, forces) = fill(&ranks, &halos, step);
        // Every third step plain, to show the two instantiations run one protocol; steps 20..30
        // exchange coordinates only (consecutive coordinate halos wait for credits).
        let plain = step % 3 == 2;
        let x_only = (20..30).contains(&step);
        if plain {
            ranks.launch_coordinates(Transport::Fused).unwrap();
        } else {
            stamped(&mut ranks, false);
            x_launches += 1;
        }
        if !x_only {
            if plain {
                ranks.launch_forces(Transport::Fused).unwrap();
            } else {
                stamped(&mut ranks, true);
                f_launches += 1;
            }
        }
        check(&format!("{test} step {step}"), &mut ranks, &halos, &home, (!x_only).then_some(forces.as_slice()));
    }
    let (xs, fs) = (read(&xr, x_launches, test), read(&fr, f_launches, test));
    check_records(test, &halos, &xs, &fs);
}

#[test]
fn stamped_kernels_exchange_like_the_plain_ones_two_ranks_two_pulses() {
    // Two pulses each way: pulse 1 forwards atoms received in pulse 0 (the dependency wait).
    stamped_steps_match_the_reference("timeline 2x1x1, 2 pulses", synthetic::halos(shape([2, 1, 1], 2, 2500), 2));
}

#[test]
fn stamped_kernels_exchange_like_the_plain_ones_2x2x2() {
    // Three pulses, all stamped (the record's room), forwarding along y and z.
    stamped_steps_match_the_reference("timeline 2x2x2", synthetic::halos(shape([2, 2, 2], 1, 1500), 3));
}

#[test]
fn replayed_stamped_steps_write_one_record_per_replay() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let test = "timeline graph replays";
    let Some(g) = gpu_or_skip(test) else { return };
    let halos = synthetic::halos(shape([2, 1, 1], 1, 3000), 4);
    let mut ranks = LocalRanks::<Float3>::new(halos.clone(), std::slice::from_ref(&g.module)).unwrap();
    const REPLAYS: usize = 40;
    let ring = |_| TimelineRing::new(&g.ctx, REPLAYS).unwrap();
    let (xr, fr): (Vec<_>, Vec<_>) = (ranks.ranks().iter().map(ring).collect(), ranks.ranks().iter().map(ring).collect());
    let mut graphs = Vec::new();
    for r in 0..halos.len() {
        let stream = ranks.stream(r).clone();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
        let rank = &mut ranks.ranks_mut()[r];
        rank.launch_coordinates_timeline(&stream, &xr[r]).unwrap();
        rank.launch_forces_timeline(&stream, &fr[r]).unwrap();
        let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("a captured step");
        graph.upload().unwrap();
        graphs.push(graph);
    }
    for replay in 0..REPLAYS as u64 {
        let (home, forces) = fill(&ranks, &halos, replay);
        for graph in &graphs {
            graph.launch().unwrap();
        }
        check(&format!("{test}, replay {replay}"), &mut ranks, &halos, &home, Some(&forces));
    }
    let (xs, fs) = (read(&xr, REPLAYS, test), read(&fr, REPLAYS, test));
    check_records(test, &halos, &xs, &fs);
    // A ring cleared between loops starts empty again.
    xr[0].clear().unwrap();
    assert!(xr[0].read().unwrap().is_empty(), "{test}: a cleared ring still holds records");
    drop(graphs);
}

#[test]
fn the_global_timer_resolution_is_measured() {
    let test = "globaltimer resolution";
    let Some(g) = gpu_or_skip(test) else { return };
    let stream = g.ctx.new_stream().unwrap();
    let r = globaltimer_resolution(&g.module, &stream, 1 << 16).unwrap();
    println!("{test}: {r:?}, mean step {:?} ns", r.mean_step_ns());
    let smallest = r.smallest_step_ns.unwrap_or_else(|| panic!("{test}: %globaltimer never moved in 65536 reads: {r:?}"));
    assert!(smallest > 0 && smallest <= r.largest_step_ns, "{r:?}");
    assert!(r.changes > 0 && r.span_ns >= r.largest_step_ns, "{r:?}");
    // The timer moves at least every 10 µs (documented: about every microsecond or better).
    assert!(r.mean_step_ns().is_some_and(|m| m < 10_000.0), "{r:?}");
}
