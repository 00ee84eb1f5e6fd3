//! The measuring commands check what they measure, in one process on the GPUs present: `halo bench`
//! (every row checked before and after its timing, `"checked": true` in the JSON), `halo
//! bench-kernels` (pack and unpack-accumulate against the CPU reference), `halo calibrate` (each
//! point checked, the file written only then), `halo timeline` (plain and stamped steps checked),
//! and `halo demo` (its checked steps, its table, its phase times). A module of the
//! `gpu_multiprocess` test binary (`gpu_multiprocess cli_checks::`), not a binary of its own.

use super::halo;
use halo::testing::gpus_or_skip;
use std::time::Duration;

fn output(run: &halo::testing::Captured) -> String {
    format!("--- stdout\n{}\n--- stderr\n{}", run.stdout, run.stderr)
}

#[test]
fn bench_rows_in_one_process_are_checked_and_say_so() {
    let test = "bench_rows_in_one_process_are_checked_and_say_so";
    let Some(gpus) = gpus_or_skip(test, 1) else { return };
    let dir = tempfile::tempdir().expect("a temporary folder");
    let (json, csv) = (dir.path().join("bench.json"), dir.path().join("bench.csv"));
    let args = [
        "bench",
        "--ranks",
        "2x1x1",
        "--atoms",
        "6000",
        "--transport",
        "staged,direct-copy,nccl,fused",
        "--graph",
        "--repeats",
        "2",
        "--warmup",
        "1",
        "--steps",
        "50",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
    ];
    let run = halo(&args, &[], Duration::from_secs(300));
    let all = output(&run);
    assert_eq!(run.code, Some(0), "{test}: halo bench failed\n{all}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default()).unwrap_or_else(|e| panic!("{test}: {e}\n{all}"));
    assert_eq!(report["schema_version"], 2, "{test}");
    for row in report["results"].as_array().cloned().unwrap_or_default() {
        if row["skipped"].is_string() {
            assert!(row["variant"].as_str().is_some_and(|v| v.starts_with("nccl")) && gpus < 2, "{test}: skipped: {row}");
            assert!(row.get("step_us").is_none_or(|s| s.is_null()), "{test}: a skipped row has times: {row}");
            continue;
        }
        assert_eq!(row["checked"], true, "{test}: {row}");
        assert!(row["check"].as_str().is_some_and(|c| c.starts_with("ok") && c.contains("before and after timing")), "{test}: {row}");
        assert!(row["step_us"]["median"].as_f64().is_some_and(|t| t > 0.0), "{test}: {row}");
    }
    let csv = std::fs::read_to_string(&csv).unwrap_or_default();
    assert!(csv.lines().any(|l| l.starts_with("6000,fused,")), "{test}: {csv}");
}

#[test]
fn bench_kernels_match_the_cpu_reference_before_reporting() {
    let test = "bench_kernels_match_the_cpu_reference_before_reporting";
    let Some(_) = gpus_or_skip(test, 1) else { return };
    let dir = tempfile::tempdir().expect("a temporary folder");
    let json = dir.path().join("kernels.json");
    let run = halo(
        &["bench-kernels", "--atoms", "262144", "--array-atoms", "1048576", "--repeats", "5", "--json", json.to_str().unwrap()],
        &[],
        Duration::from_secs(120),
    );
    let all = output(&run);
    assert_eq!(run.code, Some(0), "{test}\n{all}");
    assert!(run.stdout.contains("every kernel matched the CPU reference before and after its timed launches"), "{test}\n{all}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default()).unwrap_or_else(|e| panic!("{test}: {e}\n{all}"));
    assert_eq!(report["schema_version"], 2);
    let rows = report["results"].as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 4, "{test}\n{all}");
    assert!(rows.iter().all(|r| r["checked"] == true), "{test}: {rows:?}");
}

#[test]
fn calibrate_checks_every_point_before_writing_the_file() {
    let test = "calibrate_checks_every_point_before_writing_the_file";
    let Some(_) = gpus_or_skip(test, 1) else { return };
    let dir = tempfile::tempdir().expect("a temporary folder");
    let out = dir.path().join("calibration.json");
    let run =
        halo(&["calibrate", "--sizes", "64,16384", "--repeats", "5", "--warmup", "1", "--out", out.to_str().unwrap()], &[], Duration::from_secs(180));
    let all = output(&run);
    assert_eq!(run.code, Some(0), "{test}\n{all}");
    assert!(!all.contains("check FAILED"), "{test}\n{all}");
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap_or_default()).unwrap_or_else(|e| panic!("{test}: {e}\n{all}"));
    assert!(file["entries"].as_array().is_some_and(|e| e.len() >= 2), "{test}: {file}");
}

#[test]
fn timeline_checks_its_kernels_and_reports() {
    let test = "timeline_checks_its_kernels_and_reports";
    let Some(_) = gpus_or_skip(test, 1) else { return };
    let run = halo(&["timeline", "--atoms", "6000", "--steps", "50", "--warmup", "5"], &[], Duration::from_secs(180));
    let all = output(&run);
    assert_eq!(run.code, Some(0), "{test}\n{all}");
    assert!(!all.contains("does not match the CPU reference"), "{test}\n{all}");
}

#[test]
fn the_demo_checks_times_and_points_to_the_full_benchmark() {
    let test = "the_demo_checks_times_and_points_to_the_full_benchmark";
    let Some(_) = gpus_or_skip(test, 1) else { return };
    let run = halo(&["demo"], &[], Duration::from_secs(120));
    let all = output(&run);
    assert_eq!(run.code, Some(0), "{test}\n{all}");
    let out = &run.stdout;
    assert!(out.lines().next().is_some_and(|l| l.starts_with("machine: ")), "{test}\n{all}");
    assert!(!out.contains("Legend"), "{test}: the topology legend is printed\n{all}");
    assert!(out.contains("checked: 10 MD steps of 6000 atoms on 2 ranks (fused): coordinates after the halo bit-exact every step"), "{test}\n{all}");
    let fused = out.lines().find(|l| l.starts_with("fused ")).unwrap_or_else(|| panic!("{test}: no fused row\n{all}"));
    assert!(fused.ends_with(" ok"), "{test}: {fused}");
    for baseline in ["direct-copy ", "staged ", "nccl "] {
        assert!(out.lines().any(|l| l.starts_with(baseline)), "{test}: no {baseline}row\n{all}");
    }
    assert!(out.contains("halo bench --json") && out.contains("halo md-bench"), "{test}\n{all}");
    assert!(out.lines().any(|l| l.starts_with("demo: ") && l.contains(" s (machine and kernels ")), "{test}\n{all}");
}
