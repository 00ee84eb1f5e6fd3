//! The router wired into a driver (`exchange::Routing`), on the CPU: ranks of one process with
//! routers over a synthetic NVLink node, an injected failure, a device wait timeout, and the
//! safe points that agree on them. What `halo exchange-check` and `halo verify` do around their
//! steps, without the GPU work.

use halo::HaloError;
use halo::abi::{Float3, WaitKind};
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{Routing, Transport as Kernel, WaitTimeout};
use halo::route::{
    DistanceLevel, FailureInjection, IntraNodeLink, ManualClock, PerfPoint, PerfSource, PerfTable, RouteConfig, Router, Transport, local_routers,
    synthetic_facts, topology_from_facts,
};
use std::sync::Arc;
use std::time::Duration;

fn halos() -> Vec<halo::exchange::RankHalo> {
    synthetic::halos(SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: 3000, send_fraction: 0.35, box_len: 7.7 }, 1)
}

fn routing(injection: &str) -> Routing {
    let facts = synthetic_facts(&["n0".into()], 2, 1, IntraNodeLink::Nvlink);
    let routers = local_routers(&facts, &RouteConfig::default()).unwrap();
    let mut r = Routing::with_routers(routers, Some(FailureInjection::parse(injection).unwrap())).unwrap();
    r.plan::<Float3>(&halos()).unwrap();
    r
}

/// Rank `rank`'s wait for `peer` timed out.
fn timeout(rank: usize, peer: i32) -> HaloError {
    HaloError::WaitTimeout(WaitTimeout { rank, peer, pulse: 0, kind: Some(WaitKind::CoordSignal), step_counter: 4, seen: 3, waited_ns: 500_000_000 })
}

#[test]
fn a_one_sided_injected_failure_moves_both_ends_at_the_next_safe_point() {
    let mut r = routing("nvlink-store:3@0");
    // 12.6 KB messages on NVLink: stores, both ends.
    assert_eq!((r.plans()[0].transport(1), r.plans()[1].transport(0)), (Some(Transport::NvlinkStore), Some(Transport::NvlinkStore)));
    assert_eq!(r.transport().unwrap(), Kernel::Fused);
    for step in 0..3 {
        assert!(r.injected(step).is_empty());
        // Quiet safe points: no agreement round runs.
        let sp = r.safe_point().unwrap();
        assert!(!sp.rerun && sp.round.is_none() && sp.switched.is_empty(), "{sp:?}");
    }
    // Step 3: rank 0's launch fails by injection; rank 1's wait for rank 0 times out.
    assert_eq!(r.injected(3), vec![(0, vec![1])]);
    r.record_launch_failure(0, &[1]);
    assert!(r.record_error(&timeout(1, 0)));
    assert!(r.failed_here());
    // Any other error is not a failure to fail over from.
    assert!(!r.record_error(&HaloError::InvalidInput("bad".into())));
    let sp = r.safe_point().unwrap();
    assert!(sp.rerun, "{sp:?}");
    assert_eq!(sp.reported, 2);
    assert_eq!(sp.round, Some(1));
    assert_eq!(sp.switched, vec![(0, 1, Some(Transport::NvlinkStore), Some(Transport::NvlinkTma))]);
    // Both ends moved together, and say so.
    assert_eq!((r.plans()[0].transport(1), r.plans()[1].transport(0)), (Some(Transport::NvlinkTma), Some(Transport::NvlinkTma)));
    assert_eq!(r.transport().unwrap(), Kernel::FusedTma);
    for line in r.describe().unwrap() {
        assert!(line.contains("=nvlink-tma (bulk-copy, nvlink, ") && line.contains("failure epoch 1"), "{line}");
    }
    assert!(!r.failed_here());
    // The re-run of step 3 uses the new transport: the injection no longer fires.
    assert!(r.injected(3).is_empty());
    let sp = r.safe_point().unwrap();
    assert!(!sp.rerun && sp.round.is_none(), "{sp:?}");
    assert_eq!(r.counts(), (5, 1));
}

#[test]
fn a_timeout_on_one_end_alone_reruns_the_window_without_switching() {
    let mut r = routing("nvlink-store:99");
    assert!(r.record_error(&timeout(1, 0)));
    let sp = r.safe_point().unwrap();
    // Half a failure holds nothing out (it may still lower the store's score), and the step
    // failed: every PE runs it again, both ends on the same transport.
    assert!(sp.rerun && sp.reported == 1 && sp.round == Some(1), "{sp:?}");
    assert_eq!(r.plans()[0].transport(1), r.plans()[1].transport(0));
    // A failed step with nothing to blame (a wait on the launch's own blocks) still re-runs.
    assert!(r.record_error(&timeout(0, -1)));
    let sp = r.safe_point().unwrap();
    assert!(sp.rerun && sp.round.is_none(), "{sp:?}");
}

/// Agreed holds and decaying counts are rechecked at safe points once due on some router's
/// clock (a quiet safe point runs no round before that), and the store comes back on both ends
/// once its count has decayed enough.
#[test]
fn the_held_transport_comes_back_when_its_hold_ends() {
    let facts = synthetic_facts(&["n0".into()], 2, 1, IntraNodeLink::Nvlink);
    let topo = Arc::new(topology_from_facts(&facts, None).unwrap());
    let clock = ManualClock::new();
    // Pinned to a table where the stores lead by a small margin (the defaults before the stores
    // sent low-latency words), so that the decaying count below decides, not the defaults.
    let mut table = PerfTable::defaults();
    let store = PerfPoint { min_bytes: 0, latency_us: 1.0, bandwidth_gbs: 250.0, source: PerfSource::Default };
    table.insert(Transport::NvlinkStore, DistanceLevel::NvLink, store);
    let perf = Arc::new(table);
    let routers: Vec<Router> = (0..2)
        .map(|pe| Router::with_perf(pe, topo.clone(), RouteConfig::default(), perf.clone()).unwrap().with_clock(Arc::new(clock.clone())))
        .collect();
    let mut r = Routing::with_routers(routers, Some(FailureInjection::parse("nvlink-store:0").unwrap())).unwrap();
    r.plan::<Float3>(&halos()).unwrap();
    r.record_launch_failure(0, &[1]);
    assert!(r.safe_point().unwrap().switched.len() == 1);
    assert!(!r.router(0).unwrap().agreement_due());
    // Within the hold (a quarter of the 30 s half-life), nothing is due.
    clock.advance(Duration::from_secs(5));
    assert!(!r.router(0).unwrap().agreement_due());
    assert!(r.safe_point().unwrap().round.is_none());
    // The hold ended: a round runs; the count (0.79) still keeps the store behind.
    clock.advance(Duration::from_secs(5));
    assert!(r.router(0).unwrap().agreement_due() && r.router(1).unwrap().agreement_due());
    let sp = r.safe_point().unwrap();
    assert_eq!((sp.round, sp.switched.len()), (Some(2), 0), "{sp:?}");
    assert!(!r.router(0).unwrap().agreement_due());
    // A minute later the count has decayed below what the store needs to win again.
    clock.advance(Duration::from_secs(60));
    let sp = r.safe_point().unwrap();
    assert_eq!(sp.round, Some(3), "{sp:?}");
    assert_eq!(sp.switched, vec![(0, 1, Some(Transport::NvlinkTma), Some(Transport::NvlinkStore))]);
    assert_eq!((r.plans()[0].transport(1), r.plans()[1].transport(0)), (Some(Transport::NvlinkStore), Some(Transport::NvlinkStore)));
}

/// A launch that fails with an error (not injected) counts as a failed launch of every local rank
/// towards every peer of its plan: both ends move at the safe point.
#[test]
fn a_failed_launch_moves_the_pairs_of_the_failing_ranks() {
    let mut r = routing("staged:99");
    r.record_failed_launch(&HaloError::InvalidInput("launch refused".into()));
    assert!(r.failed_here());
    let sp = r.safe_point().unwrap();
    assert!(sp.rerun && sp.reported == 2, "{sp:?}");
    assert_eq!(sp.switched, vec![(0, 1, Some(Transport::NvlinkStore), Some(Transport::NvlinkTma))]);
}
