//! Decision cost of the transport router: a cached lookup (the hot path), a full scoring pass, and
//! the plan a PE's search step asks of it.
//!
//! `cargo bench -p halo --bench route`. No GPU needed.

use criterion::{BatchSize, Criterion, black_box, criterion_group, criterion_main};
use halo::route::{
    DistanceLevel, IntraNodeLink, Op, PerfTable, ReliabilityState, RouteConfig, RoutedPaths, Router, Transport, score_candidates, synthetic_facts,
    topology_from_facts,
};
use std::sync::Arc;

fn router() -> Router {
    let hosts: Vec<String> = (0..64).map(|n| format!("n{n:02}")).collect();
    let topo = topology_from_facts(&synthetic_facts(&hosts, 8, 1, IntraNodeLink::Nvlink), None).expect("synthetic topology is valid");
    Router::new(0, Arc::new(topo), RouteConfig::default()).expect("default config is valid")
}

fn bench(c: &mut Criterion) {
    let mut r = router();
    for peer in [1, 9, 300] {
        r.route(peer, Op::Signal, 16 * 1024).expect("routable");
    }
    c.bench_function("route: cached lookup", |b| b.iter(|| r.route(black_box(9), black_box(Op::Signal), black_box(16 * 1024)).expect("routable")));

    let r = router();
    c.bench_function("route: full decision (distance + scoring pass)", |b| {
        b.iter(|| r.decide(black_box(300), black_box(Op::Signal), black_box(16 * 1024)).expect("routable"))
    });

    let perf = PerfTable::defaults();
    let weights = RouteConfig::default().weights.at(16 * 1024);
    let rel = [ReliabilityState::default(); Transport::ALL.len()];
    c.bench_function("route: scoring pass alone", |b| {
        b.iter(|| score_candidates(black_box(DistanceLevel::NvLink), black_box(Op::Put), black_box(16 * 1024), &weights, &perf, &rel))
    });

    // What a PE's search step asks of its router (`Routing::plan` on one PE of two on one node,
    // 45,000 atoms on 2x1x1): the plan of its pulses, the mirror check of each peer's choice, and
    // the JSON round trip of the plans' all-gather (the collective itself not included).
    let mut sys = halo::system::MolecularSystem::generate(45_000, 13).expect("system");
    halo::decomp::wrap_positions(&mut sys.positions, sys.box_size);
    let plan = halo::decomp::HaloPlan::build(&sys, halo::decomp::RankGrid::new([2, 1, 1]).expect("grid"), 1.063).expect("plan");
    let halos = plan.rank_halos();
    let topo = Arc::new(topology_from_facts(&synthetic_facts(&["n00".to_string()], 2, 1, IntraNodeLink::Nvlink), None).expect("topology"));
    let mut pe0 = Router::new(0, topo, RouteConfig::default()).expect("router");
    c.bench_function("route: a search's plan on one PE of 2 (plan, mirror check, JSON round trip)", |b| {
        b.iter(|| {
            let p = RoutedPaths::plan_for::<halo::abi::Float3>(&mut pe0, black_box(&halos)).expect("plan");
            p.mirror_check(&pe0, &halos).expect("mirror");
            let bytes = serde_json::to_vec(&p).expect("encode");
            serde_json::from_slice::<RoutedPaths>(&bytes).expect("decode")
        })
    });
}

/// What the search's route part costs as a search meets it: every 100 steps or so, with the
/// host's caches holding the steps' data instead of the router's code and tables. Each sample
/// first writes 64 MiB (not timed), then times what PE 0 of 2 does with the gathered plans:
/// the mirror check of its peer's choice and the decode of both plans.
fn bench_cold(c: &mut Criterion) {
    let mut sys = halo::system::MolecularSystem::generate(45_000, 13).expect("system");
    halo::decomp::wrap_positions(&mut sys.positions, sys.box_size);
    let plan = halo::decomp::HaloPlan::build(&sys, halo::decomp::RankGrid::new([2, 1, 1]).expect("grid"), 1.063).expect("plan");
    let halos = plan.rank_halos();
    let topo = Arc::new(topology_from_facts(&synthetic_facts(&["n00".to_string()], 2, 1, IntraNodeLink::Nvlink), None).expect("topology"));
    let mut pe0 = Router::new(0, Arc::clone(&topo), RouteConfig::default()).expect("router");
    let mut pe1 = Router::new(1, topo, RouteConfig::default()).expect("router");
    let mine = RoutedPaths::plan_for::<halo::abi::Float3>(&mut pe0, &halos).expect("plan");
    let theirs = RoutedPaths::plan_for::<halo::abi::Float3>(&mut pe1, &halos).expect("plan");
    let gathered = [serde_json::to_vec(&mine).expect("encode"), serde_json::to_vec(&theirs).expect("encode")];
    let mut evict = vec![0u64; (64 << 20) / 8];
    let mut round = 0u64;
    c.bench_function("route: a search's checks of the gathered plans on one PE of 2, cold caches (mirror check, decode)", |b| {
        b.iter_batched(
            || {
                round += 1;
                evict.iter_mut().enumerate().for_each(|(i, w)| *w = w.wrapping_add(i as u64 ^ round));
            },
            |()| {
                let all: Vec<RoutedPaths> = gathered.iter().map(|g| serde_json::from_slice(g).expect("decode")).collect();
                all[0].mirror_check(&pe0, black_box(&halos)).expect("mirror");
                all
            },
            BatchSize::PerIteration,
        )
    });
}

criterion_group!(benches, bench, bench_cold);
criterion_main!(benches);
