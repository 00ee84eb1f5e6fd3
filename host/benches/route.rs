//! Decision cost of the transport router: a cached lookup (the hot path) and a full scoring pass.
//!
//! `cargo bench -p halo --bench route`. No GPU needed.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use halo::route::{
    DistanceLevel, IntraNodeLink, Op, PerfTable, ReliabilityState, RouteConfig, Router, Transport, score_candidates, synthetic_facts,
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
}

criterion_group!(benches, bench);
criterion_main!(benches);
