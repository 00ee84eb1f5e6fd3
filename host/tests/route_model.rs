//! The transport router on synthetic topologies: levels, symmetry, cache epochs, weights,
//! capabilities, overrides, failover, configuration precedence, the caller's transport set and
//! unmeasured defaults against a real calibration file. No GPU needed.

use halo::route::{
    DistanceLevel, EXCHANGE_TRANSPORTS, Exclusion, IntraNodeLink, ManualClock, Op, Outcome, Placement, RouteConfig, RouteError, RouteReason, Router,
    Topology, TopologyFile, Transport, TransportSet, WeightSource, single_node, synthetic_facts, topology_from_facts,
};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KIB: u64 = 1024;

/// 64 nodes x 8 GPUs: 2 clusters x 2 spines x 2 leaves x 2 racks x 4 nodes. Node `n` is in rack
/// `n / 4`, leaf `n / 8`, spine `n / 16`, cluster `n / 32`.
fn cluster_toml(link: &str) -> String {
    let mut s = format!("[node]\ngpus = 8\npes_per_gpu = 1\nlink = \"{link}\"\n");
    for spine in 0..4 {
        s += &format!("\n[[spine]]\nname = \"s{spine}\"\ncluster = \"c{}\"\n", spine / 2);
        for leaf in 0..2 {
            s += &format!("[[spine.leaf]]\nname = \"l{leaf}\"\n");
            for rack in 0..2 {
                let first = ((spine * 2 + leaf) * 2 + rack) * 4 + 1;
                s += &format!("[[spine.leaf.rack]]\nname = \"r{rack}\"\nnodes = [\"gpu[{:03}-{:03}]\"]\n", first, first + 3);
            }
        }
    }
    s
}

fn cluster_topology() -> Topology {
    let path = Path::new("cluster.toml");
    let file = TopologyFile::parse(&cluster_toml("nvlink"), path).expect("valid topology file");
    let fabric = file.fabric(path).expect("valid fabric");
    assert_eq!(fabric.hosts().len(), 64);
    topology_from_facts(&file.synthetic_facts(&fabric), Some(&fabric)).expect("valid topology")
}

fn config_with(vars: &[(&str, &str)]) -> RouteConfig {
    let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    RouteConfig::load(None, &move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())).expect("valid config")
}

fn router(topo: Topology, self_pe: usize, config: RouteConfig) -> Router {
    Router::new(self_pe, Arc::new(topo), config).expect("valid router")
}

/// A `Write` that keeps what it gets, for debug blocks and log lines.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn cluster_levels() {
    let t = cluster_topology();
    assert_eq!(t.n_pes(), 512);
    let d = |a, b| t.distance(a, b).expect("in range");
    assert_eq!(d(0, 0), DistanceLevel::SameGpu);
    assert_eq!(d(0, 7), DistanceLevel::NvLink);
    assert_eq!(d(0, 8), DistanceLevel::Rack, "node 1, same rack");
    assert_eq!(d(0, 4 * 8), DistanceLevel::Leaf, "node 4, next rack under the same leaf");
    assert_eq!(d(0, 8 * 8), DistanceLevel::Spine, "node 8, next leaf under the same spine");
    assert_eq!(d(0, 16 * 8), DistanceLevel::Spine, "node 16, another spine of the same cluster");
    assert_eq!(d(0, 32 * 8), DistanceLevel::CrossCluster, "node 32, another cluster");
    for (a, b) in [(3, 300), (17, 100), (511, 0)] {
        assert_eq!(d(a, b), d(b, a), "distance is symmetric for consistent views");
    }
    // The router picks GPU-initiated stores inside a node and NVSHMEM across the network.
    let mut r = router(t, 0, RouteConfig::default());
    assert_eq!(r.route(7, Op::Put, KIB).map(|x| x.transport).ok(), Some(Transport::NvlinkStore));
    assert_eq!(r.route(7, Op::Put, 1 << 20).map(|x| x.transport).ok(), Some(Transport::NvlinkTma));
    for peer in [8, 32, 64, 128, 256] {
        let route = r.route(peer, Op::Signal, 64 * KIB).expect("routable");
        assert_eq!(route.transport, Transport::NvshmemPut, "peer {peer}");
    }
}

#[test]
fn intra_node_links() {
    let hosts = vec!["a".to_owned(), "b".to_owned()];
    let pcie = topology_from_facts(&synthetic_facts(&hosts, 4, 2, IntraNodeLink::PcieP2p), None).expect("valid");
    assert_eq!(pcie.distance(0, 1).ok(), Some(DistanceLevel::SameGpu), "two PEs per GPU");
    assert_eq!(pcie.distance(0, 2).ok(), Some(DistanceLevel::Pcie));
    assert_eq!(pcie.distance(0, 8).ok(), Some(DistanceLevel::Spine), "no fabric: one spine for the job");
    let none = topology_from_facts(&synthetic_facts(&hosts, 4, 1, IntraNodeLink::NoP2p), None).expect("valid");
    assert_eq!(none.distance(0, 1).ok(), Some(DistanceLevel::SameNodeNoP2p));
    let mut r = router(none, 0, RouteConfig::default());
    let d = r.decide(1, Op::Put, KIB).expect("routable");
    assert!(matches!(d.scoring.candidate(Transport::NvlinkStore).excluded, Some(Exclusion::Unreachable { .. })));
    assert!(d.scoring.candidate(Transport::Staged).excluded.is_none(), "staged serves a node without P2P");
    assert!(r.route(5, Op::Put, KIB).is_ok());
    let d = r.decide(5, Op::Put, KIB).expect("routable");
    assert!(matches!(d.scoring.candidate(Transport::Staged).excluded, Some(Exclusion::Unreachable { .. })));
}

#[test]
fn topology_of_4096_pes_is_small_and_routes_every_peer() {
    let started = Instant::now();
    let hosts: Vec<String> = (0..512).map(|n| format!("n{n:04}")).collect();
    let mut facts = synthetic_facts(&hosts, 8, 1, IntraNodeLink::Nvlink);
    for (pe, f) in facts.iter_mut().enumerate() {
        let node = pe / 8;
        f.placement = Some(Placement {
            cluster: "big".into(),
            spine: Some(format!("s{}", node / 128)),
            leaf: Some(format!("l{}", node / 32)),
            rack: Some(format!("r{}", node / 8)),
        });
    }
    let t = topology_from_facts(&facts, None).expect("valid");
    assert_eq!(t.n_pes(), 4096);
    // Linear in the PEs: a coordinate table, not 4096 bitmaps per level (16 MiB); the allocator's
    // count is in route_memory.rs.
    assert!(t.heap_bytes() <= 1 << 20, "{} B", t.heap_bytes());
    assert_eq!(t.bitmap(0, DistanceLevel::Rack).expect("in range").count(), 64);
    assert_eq!(t.distance(0, 4095).ok(), Some(DistanceLevel::Spine), "another spine, one cluster");
    assert_eq!(t.distance(0, 1023).ok(), Some(DistanceLevel::Spine));
    let mut r = router(t, 0, RouteConfig::default());
    for peer in 0..4096 {
        r.route(peer, Op::Put, 4 * KIB).expect("routable");
    }
    let elapsed = started.elapsed();
    // Its time is printed, not bounded (a loaded machine would fail a bound): the size above is
    // what keeps it linear in the PEs.
    eprintln!("4096 PEs: topology + 4096 decisions in {elapsed:?}");
}

#[test]
fn one_sided_claim_falls_to_next_level_with_warning() {
    let hosts = vec!["a".to_owned()];
    let mut facts = synthetic_facts(&hosts, 2, 1, IntraNodeLink::PcieP2p);
    // PE 0 claims NVLink to PE 1's GPU; PE 1 does not claim it back.
    facts[0].nvlink_peers = vec![facts[1].gpu_uuid.clone()];
    let t = topology_from_facts(&facts, None).expect("valid");
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || sink.clone()).with_ansi(false).finish();
    let (level, info) =
        tracing::subscriber::with_default(subscriber, || (t.distance(0, 1).expect("in range"), t.distance_info(1, 0).expect("in range")));
    assert_eq!(level, DistanceLevel::Pcie);
    assert_eq!(info.one_sided, Some((DistanceLevel::NvLink, 0)));
    assert_eq!(info.hit, Some(DistanceLevel::Pcie));
    let text = logs.text();
    assert!(text.contains("WARN") && text.contains("does not agree"), "{text}");

    let debug = Captured::default();
    let mut r = router(t, 1, RouteConfig::default()).with_debug_writer(Box::new(debug.clone()));
    r.route(0, Op::Put, KIB).expect("routable");
    let block = debug.text();
    assert!(block.contains("level=pcie (bitmap hit at level 2: pcie); PE 0 alone claims nvlink, not trusted"), "{block}");
}

#[test]
fn epoch_change_invalidates_cache() {
    let t = cluster_topology();
    let (epoch, hash) = (t.epoch(), t.hash());
    let mut r = router(t.clone(), 0, RouteConfig::default());
    assert_eq!(r.route(8, Op::Put, KIB).map(|x| x.level).ok(), Some(DistanceLevel::Rack));
    r.route(8, Op::Put, KIB).expect("cached");
    assert_eq!((r.summary().lookups, r.summary().computed), (2, 1));

    // The same content again: no new epoch, the cache stays.
    r.set_topology(t.clone()).expect("valid");
    assert_eq!(r.topology().epoch(), epoch);
    r.route(8, Op::Put, KIB).expect("cached");
    assert_eq!(r.summary().computed, 1);

    // PE 0 and PE 8 now both see each other as NVLink peers (a node merge, say).
    let path = Path::new("cluster.toml");
    let file = TopologyFile::parse(&cluster_toml("nvlink"), path).expect("valid topology file");
    let fabric = file.fabric(path).expect("valid fabric");
    let mut facts = file.synthetic_facts(&fabric);
    let (g0, g8) = (facts[0].gpu_uuid.clone(), facts[8].gpu_uuid.clone());
    facts[0].nvlink_peers.push(g8);
    facts[8].nvlink_peers.push(g0);
    let changed = topology_from_facts(&facts, Some(&fabric)).expect("valid");
    r.set_topology(changed).expect("valid");
    assert!(r.topology().epoch() > epoch);
    assert_ne!(r.topology().hash(), hash);
    assert_eq!(r.route(8, Op::Put, KIB).map(|x| x.level).ok(), Some(DistanceLevel::NvLink));
    let s = r.summary();
    assert_eq!(s.computed, 2);
    assert_eq!(s.switches, vec![(8, 1)], "nvshmem-put -> nvlink-store is one switch");
    assert_eq!(s.topology_hash, r.topology().hash_hex());
    assert!(s.to_string().contains("0-8: 1"), "{s}");
}

#[test]
fn weights_interpolate_with_size() {
    let w = RouteConfig::default().weights;
    let at = |b: u64| {
        let e = w.at(b);
        (e.latency, e.bandwidth)
    };
    assert_eq!(at(KIB), (3.0, 1.0), "1 KiB: latency 3x bandwidth");
    assert_eq!(at(2 * KIB), (3.0, 1.0), "2 KiB: still latency 3x");
    let t = (16.0 * 1024.0 - 2048.0) / (65536.0 - 2048.0);
    let (l, b) = at(16 * KIB);
    assert!((l - (3.0 - 2.0 * t)).abs() < 1e-12 && (b - (1.0 + 2.0 * t)).abs() < 1e-12, "16 KiB: ({l}, {b})");
    assert!(l > b, "16 KiB is nearer the small end");
    assert_eq!(at(64 * KIB), (1.0, 3.0), "64 KiB: bandwidth 3x latency");
    assert_eq!(at(1 << 20), (1.0, 3.0), "1 MiB: bandwidth 3x");
    // The handover shows up in the choice over NVLink.
    let mut r = router(cluster_topology(), 0, RouteConfig::default());
    let pick = |r: &mut Router, b| r.route(1, Op::Put, b).map(|x| x.transport).ok();
    assert_eq!(pick(&mut r, KIB), Some(Transport::NvlinkStore));
    assert_eq!(pick(&mut r, 1 << 20), Some(Transport::NvlinkTma));
}

#[test]
fn capabilities_exclude_transports() {
    let r = router(cluster_topology(), 0, RouteConfig::default());
    let d = r.decide(1, Op::Amo, 8).expect("routable");
    assert!(matches!(d.scoring.candidate(Transport::NvlinkTma).excluded, Some(Exclusion::MissingCapability { .. })));
    assert!(matches!(d.scoring.candidate(Transport::Staged).excluded, Some(Exclusion::MissingCapability { .. })));
    assert_eq!(d.scoring.candidate(Transport::NvlinkTma).score, 0.0);
    assert_eq!(d.route.transport, Transport::NvlinkStore);
    let d = r.decide(8, Op::Get, 8).expect("routable");
    assert!(matches!(d.scoring.candidate(Transport::Nccl).excluded, Some(Exclusion::MissingCapability { .. })));
    assert_eq!(d.route.transport, Transport::NvshmemPut);
    let d = r.decide(8, Op::Amo, 8).expect("routable");
    let usable: Vec<_> = d.scoring.candidates.iter().filter(|c| c.excluded.is_none()).map(|c| c.transport).collect();
    assert_eq!(usable, vec![Transport::NvshmemPut], "only NVSHMEM does remote atomics across nodes");
    assert!(d.to_string().contains("candidate=staged       score=0.000 excluded: lacks atomics"), "{d}");
}

#[test]
fn forced_overrides_global_and_per_pair() {
    let cfg = config_with(&[("HALO_FORCE_TRANSPORT", "nccl"), ("HALO_ROUTE_OVERRIDE", "0-1=nvlink-tma,2-0=staged")]);
    assert_eq!(cfg.overrides.global.as_ref().map(|g| g.source.clone()), Some(WeightSource::Env("HALO_FORCE_TRANSPORT".into())));
    let mut r = router(cluster_topology(), 0, cfg.clone());
    let got = |r: &mut Router, peer| r.route(peer, Op::Put, KIB).expect("routable");
    assert_eq!((got(&mut r, 1).transport, got(&mut r, 1).reason), (Transport::NvlinkTma, RouteReason::Forced));
    assert_eq!(got(&mut r, 2).transport, Transport::Staged, "pairs are unordered");
    assert_eq!(got(&mut r, 3).transport, Transport::Nccl, "global force for the rest");
    assert_eq!(got(&mut r, 300).transport, Transport::Nccl);
    let d = r.decide(3, Op::Put, KIB).expect("routable");
    assert!(d.to_string().contains("(forced by env HALO_FORCE_TRANSPORT)"), "{d}");

    // Command line beats environment for the same pair.
    let mut cli = cfg.clone();
    cli.add_cli_overrides("--route-override", &["0-1=nvshmem-put".into()]).expect("valid");
    let mut r = router(cluster_topology(), 0, cli);
    assert_eq!(got(&mut r, 1).transport, Transport::NvshmemPut);

    // A forced transport that cannot serve the pair is an error naming the override, not a hang.
    let mut r = router(cluster_topology(), 0, config_with(&[("HALO_FORCE_TRANSPORT", "nvlink-store")]));
    assert_eq!(got(&mut r, 1).transport, Transport::NvlinkStore);
    match r.route(8, Op::Put, KIB) {
        Err(RouteError::ForcedUnusable { transport, by, .. }) => {
            assert_eq!(transport, Transport::NvlinkStore);
            assert!(by.contains("HALO_FORCE_TRANSPORT"));
        }
        other => panic!("expected ForcedUnusable, got {other:?}"),
    }
}

#[test]
fn failover_and_recovery_after_decay() {
    let clock = ManualClock::new();
    let cfg = config_with(&[("HALO_ROUTE_HALF_LIFE_S", "10")]);
    let debug = Captured::default();
    let mut r = router(cluster_topology(), 0, cfg).with_clock(Arc::new(clock.clone())).with_debug_writer(Box::new(debug.clone()));
    let pick = |r: &mut Router| r.route(1, Op::Put, KIB).expect("never aborts");
    assert_eq!(pick(&mut r).transport, Transport::NvlinkStore);

    r.record(1, Transport::NvlinkStore, Outcome::Failure);
    assert_eq!(pick(&mut r).transport, Transport::NvlinkTma, "next best after a failure");
    assert!(debug.text().contains("excluded: recently failed"), "{}", debug.text());
    assert_eq!(r.route(2, Op::Put, KIB).map(|x| x.transport).ok(), Some(Transport::NvlinkStore), "other peers unaffected");

    r.record(1, Transport::NvlinkTma, Outcome::Failure);
    r.record(1, Transport::NvshmemPut, Outcome::Timeout);
    r.record(1, Transport::NvshmemPut, Outcome::Timeout);
    let third = pick(&mut r).transport;
    assert!(matches!(third, Transport::Staged | Transport::Nccl), "got {third}");

    // Everything usable failed: still a route (the least-failed best), never an abort.
    r.record(1, Transport::Staged, Outcome::Failure);
    r.record(1, Transport::Nccl, Outcome::Failure);
    assert_eq!(pick(&mut r).reason, RouteReason::AllFailed);

    // Ten half-lives later the counts are ~0.001 and the first choice is back, via the recheck.
    clock.advance(Duration::from_secs(100));
    let back = pick(&mut r);
    assert_eq!((back.transport, back.reason), (Transport::NvlinkStore, RouteReason::Scored));
    let s = r.summary();
    assert_eq!(s.switches.first().map(|(p, _)| *p), Some(1));
    assert!(s.switches[0].1 >= 3, "{s}");
}

#[test]
fn cached_decision_is_rechecked_as_failures_decay() {
    let clock = ManualClock::new();
    let cfg = config_with(&[("HALO_ROUTE_HALF_LIFE_S", "8")]);
    let mut r = router(cluster_topology(), 0, cfg).with_clock(Arc::new(clock.clone()));
    r.record(1, Transport::NvlinkStore, Outcome::Failure);
    assert_eq!(r.route(1, Op::Put, KIB).map(|x| x.transport).ok(), Some(Transport::NvlinkTma));
    let computed = r.summary().computed;
    r.route(1, Op::Put, KIB).expect("cached");
    assert_eq!(r.summary().computed, computed, "a hit within the recheck interval");
    clock.advance(Duration::from_secs(3));
    r.route(1, Op::Put, KIB).expect("rechecked");
    assert_eq!(r.summary().computed, computed + 1, "recheck after a quarter half-life");
}

#[test]
fn config_file_env_precedence_with_sources() {
    let dir = std::env::temp_dir().join(format!("halo-route-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("route.toml");
    std::fs::write(
        &file,
        "force_transport = \"staged\"\noverrides = [\"0-1=nccl\"]\ncalibration = \"cal.json\"\n\
         [weights]\nlatency = 5.0\nbandwidth = 4.0\nsmall_bytes = 4096\n[reliability]\nhalf_life_s = 12.0\n",
    )
    .expect("write config");
    let env = |k: &str| match k {
        "HALO_ROUTE_W_LATENCY" => Some("6".to_owned()),
        "HALO_ROUTE_LARGE_BYTES" => Some("128KiB".to_owned()),
        "HALO_FORCE_TRANSPORT" => Some("nvshmem-put".to_owned()),
        _ => None,
    };
    let c = RouteConfig::load(Some(&file), &env).expect("valid");
    let w = &c.weights;
    assert_eq!((w.latency.value, &w.latency.source), (6.0, &WeightSource::Env("HALO_ROUTE_W_LATENCY".into())));
    assert_eq!((w.bandwidth.value, &w.bandwidth.source), (4.0, &WeightSource::File(file.clone())));
    assert_eq!((w.small_bytes.value, &w.small_bytes.source), (4096, &WeightSource::File(file.clone())));
    assert_eq!((w.large_bytes.value, &w.large_bytes.source), (131072, &WeightSource::Env("HALO_ROUTE_LARGE_BYTES".into())));
    assert_eq!((w.topology.value, &w.topology.source), (1.0, &WeightSource::Default));
    assert_eq!(c.half_life_s.source, WeightSource::File(file.clone()));
    assert_eq!(c.overrides.global.as_ref().map(|g| g.value), Some(Transport::NvshmemPut), "env beats file");
    assert_eq!(c.overrides.pairs.len(), 1);
    assert_eq!(c.calibration.as_ref().map(|p| p.value.clone()), Some(dir.join("cal.json")), "relative to the file");
    let lines = c.describe().join("\n");
    assert!(lines.contains("latency weight (small messages) = 6 (env HALO_ROUTE_W_LATENCY)"), "{lines}");
    assert!(lines.contains(&format!("bandwidth weight (large messages) = 4 (file {})", file.display())), "{lines}");
    assert!(lines.contains("topology weight = 1 (default)"), "{lines}");

    // HALO_ROUTE_CONFIG names the file when the caller passes none.
    let via_env = |k: &str| (k == "HALO_ROUTE_CONFIG").then(|| file.display().to_string());
    assert_eq!(RouteConfig::load(None, &via_env).expect("valid").weights.latency.value, 5.0);
    // The calibration file it names does not exist: the router says so instead of running on defaults.
    assert!(matches!(Router::new(0, Arc::new(cluster_topology()), c), Err(RouteError::Io { .. })));

    // Bad values are errors that name the variable.
    let bad = RouteConfig::load(None, &|k| (k == "HALO_ROUTE_W_TOPOLOGY").then(|| "-1".to_owned()));
    assert!(bad.is_err());
    let bad = RouteConfig::load(None, &|k| (k == "HALO_FORCE_TRANSPORT").then(|| "tcp".to_owned()));
    assert!(matches!(bad, Err(RouteError::Env { ref var, .. }) if var == "HALO_FORCE_TRANSPORT"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn calibration_file_changes_the_choice() {
    let dir = std::env::temp_dir().join(format!("halo-route-cal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cal = dir.join("calibration.json");
    // Measured: NVSHMEM over NVLink is much faster than the defaults say.
    std::fs::write(
        &cal,
        r#"{"format":"halo-calibration/1","host":"test","entries":[
            {"transport":"nvshmem-put","level":"nvlink","bytes":0,"latency_us":0.4,"bandwidth_gbs":500.0,"samples":10}]}"#,
    )
    .expect("write calibration");
    let cfg = config_with(&[("HALO_ROUTE_CALIBRATION", cal.to_str().expect("utf-8 temp path"))]);
    let mut r = router(cluster_topology(), 0, cfg);
    assert_eq!(r.route(1, Op::Put, 1 << 20).map(|x| x.transport).ok(), Some(Transport::NvshmemPut));
    let d = r.decide(1, Op::Put, 1 << 20).expect("routable");
    assert!(d.scoring.candidate(Transport::NvshmemPut).calibrated);
    assert!(!d.scoring.candidate(Transport::NvlinkTma).calibrated);
    assert!(d.to_string().contains("[calibrated]"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn topology_file_errors_are_specific() {
    let p = Path::new("t.toml");
    let e = TopologyFile::parse("[[spine]]\nname = \"s\"\n[[spine.leaf]]\nname = \"l\"\nnodez = []\n", p);
    assert!(matches!(e, Err(RouteError::BadFile { .. })), "unknown keys are errors");
    let dup = "[[spine]]\nname = \"s\"\n[[spine.leaf]]\nname = \"l\"\nnodes = [\"a\", \"a\"]\n";
    let f = TopologyFile::parse(dup, p).expect("parses");
    assert!(f.fabric(p).is_err(), "a node listed twice");
    let pcie = TopologyFile::parse(&cluster_toml("pcie-p2p"), p).expect("valid");
    let fabric = pcie.fabric(p).expect("valid");
    let t = topology_from_facts(&pcie.synthetic_facts(&fabric), Some(&fabric)).expect("valid");
    assert_eq!(t.distance(0, 1).ok(), Some(DistanceLevel::Pcie));
}

/// The calibration file `halo calibrate` wrote on two H200s (NVLink, 2026-11-30): four transports
/// measured at `nvlink`, NCCL not measured.
fn h200_calibration() -> RouteConfig {
    let cal = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/results/routing/calibration-2xH200.json");
    config_with(&[("HALO_ROUTE_CALIBRATION", cal)])
}

#[test]
fn real_h200_calibration_unmeasured_defaults_do_not_win() {
    let topo = single_node(2).expect("two NVLink GPUs");
    let mut r = router(topo.clone(), 0, h200_calibration());
    assert_eq!(r.perf().calibrated_pairs(), 4);
    for bytes in [64, KIB, 12_600, 16 * KIB, 256 * KIB, 4 << 20] {
        let d = r.decide(1, Op::Put, bytes).expect("routable");
        let nccl = d.scoring.candidate(Transport::Nccl);
        // Before the fix: nccl's defaults (12 µs, 300 GB/s) won against ~24 µs measured.
        assert_ne!(d.route.transport, Transport::Nccl, "{bytes} B:\n{d}");
        assert_eq!(nccl.excluded, Some(Exclusion::NotMeasured), "{bytes} B:\n{d}");
        assert!(!nccl.calibrated && nccl.score == 0.0);
        assert!(d.scoring.candidate(d.route.transport).calibrated);
        assert!(d.to_string().contains("candidate=nccl         score=0.000 excluded: default, not measured"), "{d}");
        assert_eq!(r.route(1, Op::Put, bytes).map(|x| x.transport).ok(), Some(d.route.transport));
    }
    // Nothing measured at the same GPU: the defaults compete there as before.
    let same = r.decide(0, Op::Put, KIB).expect("routable");
    assert_eq!(same.route.transport, Transport::NvlinkStore);
    assert!(same.scoring.candidates.iter().all(|c| c.excluded.is_none() && !c.calibrated));

    // An unmeasured transport still serves a pair no measured one can: here, a caller that has
    // only NCCL.
    let only = r.decide_among(1, Op::Put, KIB, TransportSet::of(&[Transport::Nccl])).expect("nccl alone can route");
    assert_eq!((only.route.transport, only.route.reason), (Transport::Nccl, RouteReason::Scored));
    // ... and is the failover when every measured transport failed recently.
    let mut f = router(topo.clone(), 0, h200_calibration());
    for t in [Transport::NvlinkStore, Transport::NvlinkTma, Transport::NvshmemPut, Transport::Staged] {
        // Once is enough on the system clock: the failure holds the transport out until its recheck.
        f.record(1, t, Outcome::Failure);
    }
    assert_eq!(f.route(1, Op::Put, KIB).map(|x| x.transport).ok(), Some(Transport::Nccl));
    // The exchange cannot fail over to NCCL: the failed ones are let back in instead.
    let back = f.route_among(1, Op::Put, KIB, EXCHANGE_TRANSPORTS).expect("all failed: best of them");
    assert_eq!(back.reason, RouteReason::AllFailed);
    assert!(EXCHANGE_TRANSPORTS.contains(back.transport));
}

#[test]
fn callers_restrict_the_candidates() {
    let topo = single_node(2).expect("two NVLink GPUs");
    let log = Captured::default();
    let mut r = router(topo.clone(), 0, h200_calibration()).with_debug_writer(Box::new(log.clone()));
    let all = r.route(1, Op::Put, 12_600).expect("routable");
    let exch = r.route_among(1, Op::Put, 12_600, EXCHANGE_TRANSPORTS).expect("routable");
    assert!(EXCHANGE_TRANSPORTS.contains(exch.transport));
    assert_eq!(all.transport, exch.transport, "nccl is out either way on this calibration");
    // The set is part of the cache key: each set computed once, then answered from the cache.
    r.route(1, Op::Put, 12_600).expect("cached");
    r.route_among(1, Op::Put, 12_600, EXCHANGE_TRANSPORTS).expect("cached");
    let s = r.summary();
    assert_eq!((s.lookups, s.computed), (4, 2));
    let text = log.text();
    assert!(text.contains("candidate=nccl         score=0.000 excluded: not usable by this caller"), "{text}");
    assert!(text.contains("allowed=nvlink-store,nvlink-tma,nvshmem-put,staged"), "{text}");

    // Without a calibration file the defaults decide, but the caller's set still binds: NCCL is
    // the best default for a cross-node 4 MiB put only when nothing else is allowed to compete.
    let mut d = router(topo.clone(), 0, RouteConfig::default());
    let only = TransportSet::of(&[Transport::Staged]);
    assert_eq!(d.route_among(1, Op::Put, 4 << 20, only).map(|x| x.transport).ok(), Some(Transport::Staged));
    let none = d.route_among(1, Op::Put, KIB, TransportSet::EMPTY);
    assert!(matches!(none, Err(RouteError::NoRoute { ref reasons, .. }) if reasons.contains("not usable by this caller")));

    // A forced transport outside the caller's set is an error naming the override; inside it,
    // or for a caller that takes every transport, the order is followed (even unmeasured).
    let forced = config_with(&[
        ("HALO_FORCE_TRANSPORT", "nccl"),
        ("HALO_ROUTE_CALIBRATION", concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/results/routing/calibration-2xH200.json")),
    ]);
    let mut f = router(topo, 0, forced);
    let ok = f.route(1, Op::Put, KIB).expect("forced");
    assert_eq!((ok.transport, ok.reason), (Transport::Nccl, RouteReason::Forced));
    let e = f.route_among(1, Op::Put, KIB, EXCHANGE_TRANSPORTS).expect_err("nccl is outside the set");
    let text = e.to_string();
    assert!(matches!(e, RouteError::ForcedUnusable { transport: Transport::Nccl, .. }), "{text}");
    assert!(text.contains("HALO_FORCE_TRANSPORT") && text.contains("not usable by this caller"), "{text}");
}

/// Issue 17: a three-tier fat-tree written as two `[[spine]]` entries of one cluster (no `cluster`
/// key). Nodes under different spines meet at the spine/core tier of that cluster; they are not
/// in different clusters, so they must not get the wide-area (`cross-cluster`) defaults.
#[test]
fn nodes_under_different_spines_of_one_cluster_are_spine_apart() {
    let text = "[node]\ngpus = 2\n\
        [[spine]]\nname = \"s0\"\n[[spine.leaf]]\nname = \"l0\"\nnodes = [\"a\"]\n\
        [[spine]]\nname = \"s1\"\n[[spine.leaf]]\nname = \"l0\"\nnodes = [\"b\"]\n\
        [[spine]]\nname = \"w0\"\ncluster = \"west\"\n[[spine.leaf]]\nname = \"l0\"\nnodes = [\"c\"]\n";
    let path = Path::new("fat-tree.toml");
    let file = TopologyFile::parse(text, path).expect("valid topology file");
    let fabric = file.fabric(path).expect("valid fabric");
    let t = topology_from_facts(&file.synthetic_facts(&fabric), Some(&fabric)).expect("valid");
    // PEs 0-1 on node a (spine s0), 2-3 on b (spine s1), 4-5 on c (cluster west).
    assert_eq!(t.distance(0, 2).ok(), Some(DistanceLevel::Spine), "different spines, one cluster");
    assert_eq!(t.distance(0, 4).ok(), Some(DistanceLevel::CrossCluster), "another cluster");
    // Leaves are named within their spine: l0 under s0 is not l0 under s1.
    assert_ne!(t.distance(0, 2).ok(), Some(DistanceLevel::Leaf));
    let mut r = router(t, 0, RouteConfig::default());
    let d = r.decide(2, Op::Put, 64 * KIB).expect("routable");
    assert_eq!(d.route.level, DistanceLevel::Spine);
    r.route(2, Op::Put, 64 * KIB).expect("routable");
}

/// Issue 17: one failure sets the count to 1.0, exactly the skip threshold; on any clock that
/// moves, it has decayed below 1.0 by the next look-up, so a failed transport that scores well
/// enough was chosen again at once. It must be avoided until its recheck time (a quarter
/// half-life), then compete again, and win again when it is still the best.
///
/// PE 8 is in PE 0's rack: NVSHMEM beats NCCL there by far, so only the exclusion keeps it out.
#[test]
fn a_failed_transport_is_avoided_until_its_recheck_on_a_moving_clock() {
    // An injected clock advanced by small real-sized steps after the failure.
    let clock = ManualClock::new();
    let cfg = config_with(&[("HALO_ROUTE_HALF_LIFE_S", "8")]);
    let mut r = router(cluster_topology(), 0, cfg).with_clock(Arc::new(clock.clone()));
    let pick = |r: &mut Router| r.route(8, Op::Put, KIB).map(|x| x.transport).expect("routable");
    assert_eq!(pick(&mut r), Transport::NvshmemPut);
    r.record(8, Transport::NvshmemPut, Outcome::Failure);
    let mut since = Duration::ZERO;
    for step in [1, 10, 1000, 100_000, 1_000_000, 898_000].map(Duration::from_micros) {
        clock.advance(step);
        since += step;
        assert_eq!(pick(&mut r), Transport::Nccl, "{since:?} after the failure");
        let d = r.decide(8, Op::Put, KIB).expect("routable");
        assert!(
            matches!(d.scoring.candidate(Transport::NvshmemPut).excluded, Some(Exclusion::RecentlyFailed { .. })),
            "{since:?} after the failure:\n{d}"
        );
    }
    // The recheck is a quarter half-life (2 s) after the failure: still avoided just before it
    // (1.999 s), back just after it, found by the cached entry's recheck.
    assert_eq!(since, Duration::from_micros(1_999_011));
    clock.advance(Duration::from_millis(2));
    let back = r.route(8, Op::Put, KIB).expect("routable");
    assert_eq!((back.transport, back.reason), (Transport::NvshmemPut, RouteReason::Scored));
    let d = r.decide(8, Op::Put, KIB).expect("routable");
    assert!(d.scoring.candidate(Transport::NvshmemPut).factors.reliability < 1.0, "{d}");
}

/// The same with the router's real monotonic clock: every look-up made before the recheck time
/// avoids the failed transport, and after it the transport is chosen again.
#[test]
fn a_failed_transport_is_avoided_until_its_recheck_on_the_real_clock() {
    // Half-life 2 s: the recheck comes 0.5 s after the failure.
    let cfg = config_with(&[("HALO_ROUTE_HALF_LIFE_S", "2")]);
    let mut r = router(cluster_topology(), 0, cfg);
    let pick = |r: &mut Router| r.route(8, Op::Put, KIB).map(|x| x.transport).expect("routable");
    assert_eq!(pick(&mut r), Transport::NvshmemPut);
    let failed = Instant::now();
    r.record(8, Transport::NvshmemPut, Outcome::Failure);
    let mut checked = 0;
    // Only look-ups that end well before the recheck are asserted, so a slow machine cannot make
    // this flaky: the router read its clock before `failed.elapsed()` is read here.
    while failed.elapsed() < Duration::from_millis(300) {
        let t = pick(&mut r);
        let after = failed.elapsed();
        if after < Duration::from_millis(450) {
            assert_eq!(t, Transport::Nccl, "nvshmem-put chosen again {after:?} after it failed");
            checked += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(checked > 0, "no look-up ran before the recheck");
    std::thread::sleep(Duration::from_millis(600).saturating_sub(failed.elapsed()));
    assert_eq!(pick(&mut r), Transport::NvshmemPut, "back after its recheck");
}

/// `HALO_ROUTE_TOPOLOGY` (or `topology =` in the route config) names where the nodes sit: a halo
/// TOML topology file or Slurm's topology text, told apart by content.
#[test]
fn topology_setting_loads_slurm_or_toml_placements() {
    // A private directory without extra dev-dependencies (as the other tests here make theirs).
    let dir = std::env::temp_dir().join(format!("halo-route-topology-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let slurm = dir.join("topology.conf");
    std::fs::write(&slurm, "SwitchName=l0 Nodes=n[1-2]\nSwitchName=l1 Nodes=n3\nSwitchName=top Switches=l[0-1]\n").expect("write");
    let toml = dir.join("topo.toml");
    std::fs::write(&toml, "[[spine]]\nname = \"s\"\n[[spine.leaf]]\nname = \"l\"\n[[spine.leaf.rack]]\nname = \"r\"\nnodes = [\"n[1-2]\"]\n[[spine.leaf]]\nname = \"m\"\nnodes = [\"n3\"]\n").expect("write");
    let hosts: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
    let facts = synthetic_facts(&hosts, 1, 1, IntraNodeLink::Nvlink);
    for (path, near) in [(&slurm, DistanceLevel::Leaf), (&toml, DistanceLevel::Rack)] {
        let cfg = config_with(&[("HALO_ROUTE_TOPOLOGY", path.to_str().expect("utf-8"))]);
        assert!(cfg.describe().iter().any(|l| l.contains("topology = ") && l.contains("env HALO_ROUTE_TOPOLOGY")));
        let fabric = cfg.fabric().expect("loads").expect("set");
        let t = topology_from_facts(&facts, Some(&fabric)).expect("topology");
        assert_eq!(t.distance(0, 1).ok(), Some(near), "{}", path.display());
        assert_eq!(t.distance(0, 2).ok(), Some(DistanceLevel::Spine), "{}", path.display());
    }
    let missing = config_with(&[("HALO_ROUTE_TOPOLOGY", "/nonexistent/topology.conf")]);
    assert!(matches!(missing.fabric(), Err(RouteError::Io { .. })));
    let _ = std::fs::remove_dir_all(&dir);
}
