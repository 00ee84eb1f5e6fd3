//! Every route setting, from the environment or a config file, with any value (and
//! `HALO_INJECT_FAILURE`): a clear error that
//! names the variable (or the file and key) and the fix, or a router that routes. Never a panic
//! (issue 17: `HALO_ROUTE_HALF_LIFE_S=1e300` made `halo route` exit 101).
//!
//! The proptest runs from a fixed seed (or `PROPTEST_RNG_SEED`) with no failure files, so CI
//! runs the same cases every time; `PROPTEST_CASES` raises the count for a longer local run.

use halo::route::{FailureInjection, ManualClock, Op, Outcome, RouteConfig, RouteError, Router, Transport, single_node};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The RNG seed every property here runs with, unless `PROPTEST_RNG_SEED` overrides it.
const DEFAULT_SEED: u64 = 0x524f_5554; // "ROUT"

fn config(cases: u32) -> ProptestConfig {
    let mut c = ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() };
    if let Ok(n) = std::env::var("PROPTEST_CASES").map(|v| v.parse::<u32>()) {
        c.cases = n.unwrap_or(cases);
    }
    if c.rng_seed == RngSeed::Random {
        c.rng_seed = RngSeed::Fixed(DEFAULT_SEED);
    }
    c
}

/// The numeric settings: (environment variable, config-file section, key).
const NUMERIC: [(&str, &str, &str); 10] = [
    ("HALO_ROUTE_W_LATENCY", "weights", "latency"),
    ("HALO_ROUTE_W_BANDWIDTH", "weights", "bandwidth"),
    ("HALO_ROUTE_W_TOPOLOGY", "weights", "topology"),
    ("HALO_ROUTE_W_CAPABILITY", "weights", "capability"),
    ("HALO_ROUTE_W_RELIABILITY", "weights", "reliability"),
    ("HALO_ROUTE_SIZE_RATIO", "weights", "ratio"),
    ("HALO_ROUTE_SMALL_BYTES", "weights", "small_bytes"),
    ("HALO_ROUTE_LARGE_BYTES", "weights", "large_bytes"),
    ("HALO_ROUTE_HALF_LIFE_S", "reliability", "half_life_s"),
    ("HALO_ROUTE_SKIP_THRESHOLD", "reliability", "skip_threshold"),
];

/// Loads `vars` as the environment, builds a router on 4 NVLink PEs and exercises it: routes,
/// a failure, a step of the clock, routes again. Returns the error if loading or building failed.
fn exercise(vars: &[(String, String)]) -> Result<(), RouteError> {
    let cfg = RouteConfig::load(None, &|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))?;
    drive(cfg)
}

fn drive(cfg: RouteConfig) -> Result<(), RouteError> {
    let clock = ManualClock::new();
    let topo = Arc::new(single_node(4)?);
    let mut r = Router::new(0, topo, cfg)?.with_clock(Arc::new(clock.clone()));
    for bytes in [0, 8, 4096, 1 << 20, u64::MAX] {
        let route = r.route(1, Op::Put, bytes)?;
        assert!(route.score.is_finite() && (0.0..=1.0).contains(&route.score), "score {}", route.score);
    }
    r.record(1, Transport::NvlinkStore, Outcome::Failure);
    r.record(1, Transport::NvlinkTma, Outcome::Timeout);
    r.route(1, Op::Signal, 4096)?;
    clock.advance(Duration::from_secs(1_000_000));
    r.route(1, Op::Signal, 4096)?;
    let _ = r.summary();
    Ok(())
}

/// Values that break arithmetic, values at the edges of each range, and ordinary ones.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("1e300".to_owned()),
        Just("-1e300".to_owned()),
        Just("1e-300".to_owned()),
        Just("5e-324".to_owned()),
        Just("1.7976931348623157e308".to_owned()),
        Just("inf".to_owned()),
        Just("-inf".to_owned()),
        Just("NaN".to_owned()),
        Just("0".to_owned()),
        Just("-0".to_owned()),
        Just("18446744073709551615".to_owned()),
        Just("16GiB".to_owned()),
        Just("1TiB".to_owned()),
        Just("0.001".to_owned()),
        Just("1e6".to_owned()),
        Just("1e7".to_owned()),
        Just("31536000".to_owned()),
        Just("31536001".to_owned()),
        Just("".to_owned()),
        any::<f64>().prop_map(|v| v.to_string()),
        (0.0f64..100.0).prop_map(|v| format!("{v}")),
        any::<u64>().prop_map(|v| v.to_string()),
        "[ -~]{0,12}",
    ]
}

proptest! {
    #![proptest_config(config(256))]

    /// Any values for any subset of the variables: no panic; an error names one of the variables
    /// it was given; success means a router that routes with finite scores.
    #[test]
    fn any_environment_values_never_panic(
        picks in proptest::collection::vec((0..NUMERIC.len(), value()), 1..4),
    ) {
        let vars: Vec<(String, String)> = picks.iter().map(|(i, v)| (NUMERIC[*i].0.to_owned(), v.clone())).collect();
        let outcome = std::panic::catch_unwind(|| exercise(&vars));
        let Ok(result) = outcome else {
            return Err(TestCaseError::fail(format!("panicked on {vars:?}")));
        };
        if let Err(e) = result {
            let text = e.to_string();
            prop_assert!(
                vars.iter().any(|(k, v)| !v.trim().is_empty() && text.contains(k.as_str())),
                "the error does not name the variable: {text} (given {vars:?})"
            );
        }
    }

    /// The same values in a config file: no panic; an error names the file and the key.
    #[test]
    fn any_config_file_values_never_panic(i in 0..NUMERIC.len(), v in value()) {
        let (_, section, key) = NUMERIC[i];
        let text = format!("[{section}]\n{key} = {v}\n");
        let path = Path::new("route.toml");
        let outcome = std::panic::catch_unwind(|| {
            let mut cfg = RouteConfig::default();
            cfg.apply_file_text(&text, path)?;
            cfg.validate()?;
            drive(cfg)
        });
        let Ok(result) = outcome else {
            return Err(TestCaseError::fail(format!("panicked on {text:?}")));
        };
        if let Err(e) = result {
            let msg = e.to_string();
            prop_assert!(msg.contains("route.toml"), "the error does not name the file: {msg}");
            prop_assert!(msg.contains(key), "the error does not name the key {key}: {msg}");
        }
    }
}

proptest! {
    #![proptest_config(config(512))]

    /// `HALO_INJECT_FAILURE` with any value: parsed or refused with the variable named, never a panic.
    #[test]
    fn any_failure_injection_value_never_panics(v in prop_oneof![
        "[ -~]{0,24}",
        "(nvlink-store|staged|nvshmem-put|nccl|x)(:[0-9-]{0,22})?(@[0-9,]{0,12})?",
    ]) {
        let outcome = std::panic::catch_unwind(|| FailureInjection::from_env(&|k| (k == "HALO_INJECT_FAILURE").then(|| v.clone())));
        let Ok(result) = outcome else {
            return Err(TestCaseError::fail(format!("panicked on {v:?}")));
        };
        match result {
            Ok(Some(f)) => prop_assert_eq!(FailureInjection::parse(&f.to_string()).ok(), Some(f)),
            Ok(None) => prop_assert!(v.trim().is_empty()),
            Err(e) => prop_assert!(e.to_string().contains("HALO_INJECT_FAILURE"), "{}", e),
        }
    }
}

/// The reproduction from the issue: a half-life so long that `Duration` overflows.
#[test]
fn huge_half_life_is_an_error_naming_the_variable_and_the_fix() {
    let vars = [("HALO_ROUTE_HALF_LIFE_S".to_owned(), "1e300".to_owned())];
    let outcome = std::panic::catch_unwind(|| exercise(&vars));
    let result = outcome.expect("HALO_ROUTE_HALF_LIFE_S=1e300 must not panic");
    let e = result.expect_err("a half-life of 1e300 s is out of range");
    let text = e.to_string();
    assert!(text.contains("HALO_ROUTE_HALF_LIFE_S"), "{text}");
    assert!(text.contains("1e300"), "{text}");
    assert!(text.contains("HALO_ROUTE_HALF_LIFE_S=30"), "says how to fix it: {text}");
}

/// Each range's edges: the last good value is accepted, the first bad one refused.
#[test]
fn range_edges() {
    let ok = |k: &str, v: &str| exercise(&[(k.to_owned(), v.to_owned())]);
    for (k, good, bad) in [
        ("HALO_ROUTE_HALF_LIFE_S", "0.001", "0.0009"),
        ("HALO_ROUTE_HALF_LIFE_S", "31536000", "31536001"),
        ("HALO_ROUTE_SKIP_THRESHOLD", "1000", "1001"),
        ("HALO_ROUTE_SKIP_THRESHOLD", "0.001", "0"),
        ("HALO_ROUTE_W_TOPOLOGY", "1000000", "1000001"),
        ("HALO_ROUTE_W_TOPOLOGY", "0", "-0.5"),
        ("HALO_ROUTE_SIZE_RATIO", "1", "0.99"),
        ("HALO_ROUTE_LARGE_BYTES", "1TiB", "2TiB"),
    ] {
        assert!(ok(k, good).is_ok(), "{k}={good}: {:?}", ok(k, good).err());
        let e = ok(k, bad).expect_err(bad).to_string();
        assert!(e.contains(k), "{k}={bad}: {e}");
    }
}
