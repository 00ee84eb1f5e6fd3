//! Failures fed back into the router and agreed across PEs, on the CPU with simulated PEs: a
//! failure seen by one end moves both ends of the pair to the same transport at the same safe
//! point; the transport returns on both ends at the same round after its recheck; the agreement
//! is a pure, order-independent function that refuses inconsistent inputs; the glue runs over the
//! real `halo launch` rendezvous all-gather (threads as PEs); `HALO_INJECT_FAILURE` parses.

use halo::exchange::RankHalo;
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::launch::{Rendezvous, RendezvousDir};
use halo::route::{
    FailureInjection, FailureReport, Feedback, ManualClock, Outcome, RouteConfig, RouteError, RoutedPaths, Router, SafePointRecord, Transport, agree,
    agree_local, agree_via, safe_point_local, safe_point_via, single_node,
};
use std::sync::Arc;
use std::time::Duration;

fn halos() -> Vec<RankHalo> {
    synthetic::halos(SyntheticShape { grid: [2, 2, 1], pulses_per_dim: 1, home_atoms: 400, send_fraction: 0.3, box_len: 5.0 }, 11)
}

/// Four PEs on one node of four NVLink GPUs, each with its own router and clock (half-life 8 s:
/// a failure is held 2 s), in the given feedback mode.
fn routers(feedback: Feedback, clocks: &[ManualClock]) -> Vec<Router> {
    let topo = Arc::new(single_node(4).expect("topology"));
    let mut cfg = RouteConfig::default();
    cfg.half_life_s.value = 8.0;
    clocks
        .iter()
        .enumerate()
        .map(|(pe, c)| {
            let mut r = Router::new(pe, Arc::clone(&topo), cfg.clone()).expect("router").with_clock(Arc::new(c.clone()));
            r.set_feedback(feedback);
            r
        })
        .collect()
}

fn plans(routers: &mut [Router], h: &[RankHalo]) -> Vec<RoutedPaths> {
    routers.iter_mut().map(|r| RoutedPaths::plan(r, h).expect("plan")).collect()
}

fn clocks(n: usize) -> Vec<ManualClock> {
    (0..n).map(|_| ManualClock::new()).collect()
}

/// Without agreement, a failure seen by one end moves that end alone: the pair breaks. This is
/// what the agreement exists for.
#[test]
fn local_failover_on_one_end_breaks_the_pair() {
    let h = halos();
    let mut rs = routers(Feedback::Local, &clocks(4));
    let before = plans(&mut rs, &h);
    RoutedPaths::check_symmetric(&before).expect("symmetric to start with");
    let failed = before[0].transport(1).expect("PE 0 exchanges with PE 1");
    rs[0].record(1, failed, Outcome::Failure);
    let after = plans(&mut rs, &h);
    assert_ne!(after[0].transport(1), Some(failed));
    assert!(RoutedPaths::check_symmetric(&after).is_err(), "one-sided failover must break symmetry here");
}

#[test]
fn one_sided_failure_moves_both_ends_together() {
    let h = halos();
    let cs = clocks(4);
    let mut rs = routers(Feedback::Agreed, &cs);
    let before = plans(&mut rs, &h);
    let failed = before[0].transport(1).expect("PE 0 exchanges with PE 1");
    // PE 0's launch failed; PE 1 saw nothing (its wait would time out later, or not at all).
    cs[0].advance(Duration::from_millis(5));
    rs[0].record(1, failed, Outcome::Failure);
    assert_eq!(rs[0].pending_failures().len(), 1);
    let unchanged = plans(&mut rs, &h);
    assert_eq!(unchanged, before, "nothing moves before the safe point");

    let changes = agree_local(&mut rs).expect("agreement");
    assert!(changes.iter().all(|c| c.reported == 1), "every PE learns that one failure was reported");
    assert_eq!(changes[0].rechecked, vec![1]);
    assert_eq!(changes[1].rechecked, vec![0]);
    assert!(changes[2].rechecked.is_empty() && changes[3].rechecked.is_empty());
    let after = plans(&mut rs, &h);
    RoutedPaths::check_symmetric(&after).expect("both ends agree after the safe point");
    // The local mirror check replays each peer with the same agreed record.
    for (pe, plan) in after.iter().enumerate() {
        plan.mirror_check(&rs[pe], &h).expect("mirror agrees");
    }
    let new = after[0].transport(1).expect("still routed");
    assert_ne!(new, failed);
    assert_eq!(after[1].transport(0), Some(new), "PE 1 moved with PE 0");
    for (pe, peer) in [(2, 3), (3, 2), (0, 2), (2, 0)] {
        assert_eq!(after[pe].transport(peer), before[pe].transport(peer), "PE {pe} -> {peer} untouched");
    }
    // Both ends report the pair's failure epoch in their summaries.
    let (s0, s1) = (after[0].summary().expect("summary"), after[1].summary().expect("summary"));
    let epoch = |s: &halo::route::RoutedSummary, peer| s.peers.iter().find(|p| p.peer == peer).map(|p| p.failure_epoch);
    assert_eq!((epoch(&s0, 1), epoch(&s1, 0)), (Some(1), Some(1)));
    assert_eq!(epoch(&s0, 2), Some(0));
    assert!(s0.to_string().contains("failure epoch 1"), "{s0}");
}

#[test]
fn held_until_the_recheck_on_the_agreed_clock_then_back_on_both_ends() {
    let h = halos();
    let cs = clocks(4);
    let mut rs = routers(Feedback::Agreed, &cs);
    let failed = plans(&mut rs, &h)[0].transport(1).expect("routed");
    rs[1].record(0, failed, Outcome::Failure);
    agree_local(&mut rs).expect("round 1");
    // The clocks differ (PE 3 runs ahead); the agreement uses the latest. The hold is 2 s.
    for (i, c) in cs.iter().enumerate() {
        c.advance(Duration::from_millis(1500 + 100 * i as u64));
    }
    agree_local(&mut rs).expect("round 2: 1.8 s on the agreed clock");
    let p = plans(&mut rs, &h);
    assert!(p[0].transport(1) != Some(failed) && p[1].transport(0) != Some(failed), "still held at 1.8 s");
    cs[3].advance(Duration::from_millis(300));
    agree_local(&mut rs).expect("round 3: 2.1 s on the agreed clock");
    // Released on both ends at the same round: a candidate again, with a lower reliability factor.
    for (pe, peer) in [(0, 1), (1, 0)] {
        let d = rs[pe].decide_among(peer, halo::route::Op::Put, 1024, halo::route::EXCHANGE_TRANSPORTS).expect("decide");
        assert_eq!(d.scoring.candidate(failed).excluded, None, "PE {pe}:\n{d}");
        assert!(d.scoring.candidate(failed).factors.reliability < 1.0, "PE {pe}:\n{d}");
    }
    RoutedPaths::check_symmetric(&plans(&mut rs, &h)).expect("symmetric");
    // Once the count has decayed, the first choice wins again, on both ends at the same round.
    cs[0].advance(Duration::from_secs(60));
    agree_local(&mut rs).expect("round 4");
    let p = plans(&mut rs, &h);
    RoutedPaths::check_symmetric(&p).expect("symmetric");
    assert_eq!((p[0].transport(1), p[1].transport(0)), (Some(failed), Some(failed)), "back on both ends at the same round");
    assert_eq!(rs[0].agreement().round, 4);
}

#[test]
fn wait_timeouts_on_both_ends_count_as_one_failure() {
    let h = halos();
    let mut rs = routers(Feedback::Agreed, &clocks(4));
    let t = plans(&mut rs, &h)[0].transport(1).expect("routed");
    // One end timing out is half a failure: not enough to move the pair.
    rs[0].record(1, t, Outcome::Timeout);
    rs[0].record(1, t, Outcome::Timeout);
    agree_local(&mut rs).expect("round 1");
    assert_eq!(plans(&mut rs, &h)[0].transport(1), Some(t));
    // Both ends timing out in one round: moved.
    rs[0].record(1, t, Outcome::Timeout);
    rs[1].record(0, t, Outcome::Timeout);
    agree_local(&mut rs).expect("round 2");
    let p = plans(&mut rs, &h);
    assert!(p[0].transport(1) != Some(t));
    RoutedPaths::check_symmetric(&p).expect("symmetric");
}

fn record(pe: usize, round: u64, reports: Vec<FailureReport>) -> SafePointRecord {
    SafePointRecord { pe, round, clock: Duration::from_secs(1), topology: "00000000000000aa".into(), half_life_s: 30.0, skip_threshold: 1.0, reports }
}

fn fail(peer: usize, transport: Transport, outcome: Outcome) -> FailureReport {
    FailureReport { peer, transport, outcome }
}

#[test]
fn agreement_is_pure_and_refuses_inconsistent_records() {
    let reports = vec![
        fail(1, Transport::NvlinkStore, Outcome::Timeout),
        fail(2, Transport::NvshmemPut, Outcome::Failure),
        fail(1, Transport::NvlinkStore, Outcome::Failure),
    ];
    let mut reversed = reports.clone();
    reversed.reverse();
    let prev = Default::default();
    let a = agree(&prev, &[record(0, 1, reports), record(1, 1, vec![]), record(2, 1, vec![])]).expect("agree");
    let b = agree(&prev, &[record(0, 1, reversed), record(1, 1, vec![]), record(2, 1, vec![])]).expect("agree");
    assert_eq!(a, b, "order of reports does not matter");
    assert_eq!((a.round, a.epoch(0, 1), a.epoch(1, 0), a.epoch(0, 2), a.epoch(1, 2)), (1, 1, 1, 1, 0));
    let json = serde_json::to_string(&a).expect("serialise");
    assert_eq!(serde_json::from_str::<halo::route::Agreement>(&json).expect("parse"), a);

    let ok = || vec![record(0, 1, vec![]), record(1, 1, vec![])];
    let expect_err = |records: Vec<SafePointRecord>, needle: &str| {
        let e = agree(&prev, &records).expect_err(needle);
        assert!(matches!(e, RouteError::Agreement(_)) || matches!(e, RouteError::Config { .. }), "{e:?}");
        assert!(e.to_string().contains(needle), "{needle}: {e}");
    };
    assert!(agree(&prev, &ok()).is_ok());
    expect_err(vec![], "no PE");
    let mut r = ok();
    r.swap(0, 1);
    expect_err(r, "indexed by PE");
    let mut r = ok();
    r[1].round = 2;
    expect_err(r, "same number of times");
    let mut r = ok();
    r[1].topology = "00000000000000bb".into();
    expect_err(r, "same topology");
    let mut r = ok();
    r[1].half_life_s = 10.0;
    expect_err(r, "HALO_ROUTE_HALF_LIFE_S");
    let mut r = ok();
    r[0].reports.push(fail(5, Transport::Staged, Outcome::Failure));
    expect_err(r, "not another PE");
    let mut r = ok();
    r[0].reports.push(fail(0, Transport::Staged, Outcome::Failure));
    expect_err(r, "not another PE");
    let mut r = ok();
    r[0].half_life_s = 1e300;
    r[1].half_life_s = 1e300;
    expect_err(r, "HALO_ROUTE_HALF_LIFE_S");
    // A router refuses to skip a round or apply one twice.
    let mut rs = routers(Feedback::Agreed, &clocks(4));
    let records: Vec<SafePointRecord> = rs.iter_mut().map(Router::safe_point_record).collect();
    let next = agree(rs[0].agreement(), &records).expect("agree");
    rs[0].apply_agreement(next.clone()).expect("round 1");
    assert!(rs[0].apply_agreement(next).is_err(), "applied twice");
}

/// The glue over the real rendezvous of `halo launch`: two threads act as two PEs, each with its
/// own router, and meet in a private directory exactly as two launched processes would.
#[test]
fn agreement_over_the_launch_rendezvous_moves_both_pes() {
    let dir = RendezvousDir::create().expect("rendezvous directory");
    let path = dir.path().to_owned();
    let h = synthetic::halos(SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: 400, send_fraction: 0.3, box_len: 5.0 }, 5);
    let topo = Arc::new(single_node(2).expect("topology"));
    let run = |pe: usize| {
        let (path, h, topo) = (path.clone(), h.clone(), Arc::clone(&topo));
        std::thread::spawn(move || -> Result<(Transport, Transport, u32), String> {
            let mut r = Router::new(pe, topo, RouteConfig::default()).map_err(|e| e.to_string())?;
            r.set_feedback(Feedback::Agreed);
            let first = RoutedPaths::plan(&mut r, &h).map_err(|e| e.to_string())?.transport(1 - pe).ok_or("unrouted")?;
            if pe == 0 {
                r.record(1, first, Outcome::Failure); // one-sided: only PE 0 saw it
            }
            let rv = Rendezvous::new(&path, pe, 2);
            let mut gather = |tag: &str, bytes: &[u8]| rv.all_gather(tag, bytes, Duration::from_secs(20)).map_err(|e| e.to_string());
            // Every PE's first plan, all-gathered as a driver does before the first step.
            let plan = RoutedPaths::plan(&mut r, &h).map_err(|e| e.to_string())?;
            let current = gather("route-paths-start", &serde_json::to_vec(&plan).map_err(|e| e.to_string())?)?
                .iter()
                .map(|b| serde_json::from_slice::<RoutedPaths>(b).map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, _>>()?;
            // Round 1 agrees the failure, plans again and all-gathers the new plans.
            let sp = safe_point_via(&mut r, &h, &current, &mut gather).map_err(|e| e.to_string())?;
            if sp.switched.len() != 1 || sp.switched[0].2 != Some(first) || sp.change.reported != 1 {
                return Err(format!("expected the one pair to switch off {first} after one report, got {:?} {:?}", sp.switched, sp.change));
            }
            // Round 2 with nothing to report changes nothing.
            let sp2 = safe_point_via(&mut r, &h, &sp.plans, &mut gather).map_err(|e| e.to_string())?;
            if !sp2.switched.is_empty() {
                return Err(format!("round 2 switched {:?}", sp2.switched));
            }
            let plan = &sp2.plans[pe];
            agree_via(&mut r, &mut gather).map_err(|e| e.to_string())?; // round 3: the bare agreement
            Ok((first, plan.transport(1 - pe).ok_or("unrouted")?, r.failure_epoch(1 - pe)))
        })
    };
    let (a, b) = (run(0), run(1));
    let (a, b) = (a.join().expect("PE 0 thread").expect("PE 0"), b.join().expect("PE 1 thread").expect("PE 1"));
    assert_eq!(a.0, b.0, "same start");
    assert_ne!(a.1, a.0, "PE 0 moved off the failed transport");
    assert_eq!(a.1, b.1, "PE 1 moved with it");
    assert_eq!((a.2, b.2), (1, 1), "both see failure epoch 1");
}

/// The loop the GPU drivers run, on the CPU: four ranks, `HALO_INJECT_FAILURE=<their first
/// transport>:2@0` (PE 0 alone fails its launch at step 2; its partners' waits time out), a safe
/// point after every step. Exactly PE 0's pairs switch, at step 2, on both ends.
#[test]
fn driver_loop_with_an_injected_one_sided_failure() {
    let h = halos();
    let mut rs = routers(Feedback::Agreed, &clocks(4));
    let mut current = plans(&mut rs, &h);
    RoutedPaths::check_symmetric(&current).expect("symmetric");
    let first = current[0].transport(1).expect("routed");
    let inject = FailureInjection::parse(&format!("{first}:2@0")).expect("valid");
    let mut switched = Vec::new();
    for step in 0..6 {
        for pe in 0..4 {
            for peer in inject.failing_peers(&current[pe], step) {
                let t = current[pe].transport(peer).expect("routed");
                rs[pe].record(peer, t, Outcome::Failure); // the skipped launch
                rs[peer].record(pe, t, Outcome::Timeout); // the partner's bounded wait
            }
        }
        let sp = safe_point_local(&mut rs, &h, &current).expect("safe point");
        if !sp.switched.is_empty() {
            switched.push((step, sp.switched.clone()));
        }
        current = sp.plans;
    }
    assert_eq!(switched.len(), 1, "{switched:?}");
    let (step, pairs) = &switched[0];
    assert_eq!(*step, 2);
    let peers_of_0: Vec<usize> = (1..4).filter(|&q| current[0].transport(q).is_some()).collect();
    assert_eq!(pairs.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>(), peers_of_0.iter().map(|&q| (0, q)).collect::<Vec<_>>());
    for &(a, b, before, after) in pairs {
        assert_eq!(before, Some(first));
        assert!(after.is_some() && after != Some(first), "{a}-{b}: {after:?}");
        assert_eq!(rs[a].failure_epoch(b), 1);
        assert_eq!(rs[b].failure_epoch(a), 1);
    }
}

#[test]
fn failure_injection_parses_and_fires() {
    let f = FailureInjection::parse("nvlink-store:3@0,2").expect("valid");
    assert_eq!((f.transport, f.step, f.pes.clone()), (Transport::NvlinkStore, Some(3), Some(vec![0, 2])));
    assert!(f.fires(0, Transport::NvlinkStore, 3) && f.fires(2, Transport::NvlinkStore, 3));
    assert!(!f.fires(1, Transport::NvlinkStore, 3), "other PEs");
    assert!(!f.fires(0, Transport::NvlinkStore, 4), "other steps");
    assert!(!f.fires(0, Transport::NvlinkTma, 3), "other transports");
    assert_eq!(f.to_string(), "nvlink-store:3@0,2");
    let every = FailureInjection::parse("NVSHMEM_PUT").expect("valid");
    assert!(every.fires(7, Transport::NvshmemPut, 0) && every.fires(1, Transport::NvshmemPut, 99));
    for bad in ["", "tcp", "staged:x", "staged:-1", "staged@", "staged@a", "staged:1@1,,2"] {
        let e = FailureInjection::parse(bad).expect_err(bad).to_string();
        assert!(e.contains("transport[:step][@pe,...]"), "{bad}: {e}");
    }
    let env = |k: &str| (k == "HALO_INJECT_FAILURE").then(|| "staged:oops".to_owned());
    let e = FailureInjection::from_env(&env).expect_err("malformed").to_string();
    assert!(e.contains("HALO_INJECT_FAILURE") && e.contains("staged:oops"), "{e}");
    assert_eq!(FailureInjection::from_env(&|_| None).ok(), Some(None));
}
