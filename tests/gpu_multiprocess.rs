//! The multi-process paths on real GPUs, through the built `halo` binary: two NVSHMEM PEs under
//! `halo launch -n 2` (one per GPU, or both on GPU 0 when only one is present), every transport
//! — GPU-initiated, forced put with both signalling modes, `staged`, `direct-copy`, `nccl` — and
//! their captured graphs, each step checked against the CPU reference by `halo exchange-check`;
//! the benchmark's PE runner, whose every variant ends with a checked step; the mini-MD step
//! over PEs; and `halo md-bench`, whose every row runs checked steps. A test passes only when
//! every expected line says OK on both PEs (or every row says checked) and `halo` exits 0.
//!
//! The binary is `$HALO_BIN` (the bundle's `run-gpu-tests.sh` sets it), else the one Cargo built
//! for these tests, else `../halo` beside the test executable (the bundle's layout). Without a GPU
//! each test says `SKIPPED`; `HALO_REQUIRE_GPUS=N` turns that into a failure for tests (and the nccl
//! parts) that need at most N GPUs.

use halo::testing::{Captured, gpus_or_skip, run_captured};

/// The measuring commands' checks in one process: their own file, this binary (one fewer test
/// binary in the GPU bundle). Run them alone with the filter `cli_checks::`.
#[path = "gpu_cli_checks.rs"]
mod cli_checks;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

fn halo_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("HALO_BIN") {
        return p.into();
    }
    let built = PathBuf::from(env!("CARGO_BIN_EXE_halo"));
    if built.is_file() {
        return built;
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.parent().and_then(|d| d.parent()).map(|d| d.join("halo")).filter(|p| p.is_file()).unwrap_or(built)
}

/// Runs `halo args...` with the site's environment plus `env`, killed after `limit`.
fn halo(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Captured {
    let mut cmd = Command::new(halo_bin());
    cmd.args(args).env("NVSHMEM_DISABLE_NVLS", "1").env("NCCL_NVLS_ENABLE", "0");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_captured(cmd, limit).unwrap_or_else(|e| panic!("starting {}: {e}", halo_bin().display()))
}

/// `halo launch -n 2 [--gpus 0] -- ` for `gpus` GPUs.
fn launch(gpus: usize) -> Vec<&'static str> {
    if gpus >= 2 { vec!["launch", "-n", "2", "--"] } else { vec!["launch", "-n", "2", "--gpus", "0", "--"] }
}

/// Asserts `halo` succeeded and that each of `names` printed an OK line on both PEs.
fn assert_ok_on_both_pes(test: &str, run: &Captured, names: &[String]) {
    let all = format!("--- stdout\n{}\n--- stderr\n{}", run.stdout, run.stderr);
    assert_eq!(run.code, Some(0), "{test}: halo failed or timed out\n{all}");
    for name in names {
        for rank in 0..2 {
            let ok = run
                .stdout
                .lines()
                .any(|l| l.starts_with(&format!("[rank {rank}]")) && l.contains(&format!(" {name}: ")) && l.contains("OK on this PE"));
            assert!(ok, "{test}: no OK line for {name} on rank {rank}\n{all}");
        }
    }
}

/// The variant names `exchange-check --graph` prints for `methods` (capturable ones twice).
fn names(methods: &[&str], graph: bool) -> Vec<String> {
    let capturable = |m: &str| !matches!(m, "staged" | "direct-copy");
    methods.iter().flat_map(|m| if graph && capturable(m) { vec![m.to_string(), format!("{m}+graph")] } else { vec![m.to_string()] }).collect()
}

/// Steps and check interval: spinning kernels of two processes on one GPU progress only by
/// time-slicing, so one GPU runs fewer steps.
fn steps(gpus: usize) -> (&'static str, &'static str) {
    if gpus >= 2 { ("400", "10") } else { ("40", "4") }
}

#[test]
fn two_pes_every_transport_and_its_graph_match_the_cpu_reference() {
    let test = "two_pes_every_transport_and_its_graph_match_the_cpu_reference";
    let Some(gpus) = gpus_or_skip(test, 1) else { return };
    // NCCL allows one rank per GPU: on one GPU it cannot run two PEs.
    let mut methods = vec!["staged", "direct-copy", "per-pulse", "per-pulse-direct", "fused", "fused-tma"];
    if gpus_or_skip(&format!("{test}: nccl (NCCL runs one rank per GPU)"), 2).is_some() {
        methods.push("nccl");
    }
    let (steps, every) = steps(gpus);
    let list = methods.join(",");
    for pulses in ["1", "2"] {
        let mut args = launch(gpus);
        args.extend([
            "exchange-check",
            "--grid",
            "2x1x1",
            "--pulses",
            pulses,
            "--transport",
            &list,
            "--graph",
            "--steps",
            steps,
            "--check-every",
            every,
        ]);
        let run = halo(&args, &[], Duration::from_secs(420));
        assert_ok_on_both_pes(&format!("{test}, {pulses} pulse(s)"), &run, &names(&methods, true));
    }
}

#[test]
fn two_pes_forced_put_in_both_signalling_modes_matches_the_cpu_reference() {
    let test = "two_pes_forced_put_in_both_signalling_modes_matches_the_cpu_reference";
    let Some(gpus) = gpus_or_skip(test, 1) else { return };
    let (steps, every) = steps(gpus);
    for mode in ["put-signal", "fenced-put"] {
        let mut args = launch(gpus);
        args.extend([
            "exchange-check",
            "--grid",
            "2x1x1",
            "--pulses",
            "2",
            "--transport",
            "fused,per-pulse",
            "--force-put",
            "--graph",
            "--steps",
            steps,
            "--check-every",
            every,
        ]);
        let run = halo(&args, &[("HALO_PUT_SIGNAL", mode)], Duration::from_secs(300));
        assert_ok_on_both_pes(&format!("{test}, {mode}"), &run, &names(&["fused", "per-pulse"], true));
    }
}

#[test]
fn the_bench_pe_runner_checks_every_variant_after_timing_it() {
    let test = "the_bench_pe_runner_checks_every_variant_after_timing_it";
    let Some(gpus) = gpus_or_skip(test, 1) else { return };
    // NCCL runs one rank per GPU: on one GPU bench reports its rows skipped.
    let nccl = gpus_or_skip(&format!("{test}: nccl rows (NCCL runs one rank per GPU)"), 2).is_some();
    let dir = tempfile::tempdir().expect("a temporary folder");
    let json = dir.path().join("bench.json");
    let json_arg = json.to_string_lossy().into_owned();
    let mut args = launch(gpus);
    // Coordinate-only and force-only loops (one direction, many steps) run before each check.
    args.extend([
        "bench",
        "--ranks",
        "2x1x1",
        "--atoms",
        "6000",
        "--transport",
        "staged,direct-copy,nccl,fused",
        "--graph",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--steps",
        "30",
        "--quiet",
        "--json",
        &json_arg,
    ]);
    let run = halo(&args, &[], Duration::from_secs(420));
    let all = format!("--- stdout\n{}\n--- stderr\n{}", run.stdout, run.stderr);
    assert_eq!(run.code, Some(0), "{test}: halo bench failed\n{all}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default()).unwrap_or_else(|e| panic!("{test}: {e}\n{all}"));
    let rows = report["results"].as_array().cloned().unwrap_or_default();
    for want in ["staged", "direct-copy", "nccl", "nccl+graph", "fused", "fused+graph"] {
        let row = rows.iter().find(|r| r["variant"] == want).unwrap_or_else(|| panic!("{test}: no row {want}\n{all}"));
        if want.starts_with("nccl") && !nccl {
            assert!(row["skipped"].is_string(), "{test}: {want} on one GPU should be skipped: {row}");
            continue;
        }
        assert!(row["skipped"].is_null(), "{test}: {want} skipped: {row}");
        assert!(row["check"].as_str().is_some_and(|c| c.starts_with("ok")) && row["checked"] == true, "{test}: {want} check: {row}");
        assert!(row["step_us"]["median"].as_f64().is_some_and(|t| t > 0.0), "{test}: {want}: {row}");
    }
    assert!(report["machine"]["topology"].is_string() && report["machine"]["nccl"].is_string(), "{test}: machine info missing");
}

#[test]
fn the_md_step_over_two_pes_matches_the_undecomposed_forces_with_host_driven_transports() {
    let test = "the_md_step_over_two_pes_matches_the_undecomposed_forces_with_host_driven_transports";
    let Some(gpus) = gpus_or_skip(test, 1) else { return };
    let dir = tempfile::tempdir().expect("a temporary folder");
    for transport in ["staged", "direct-copy", "fused"] {
        let json = dir.path().join(format!("verify-{transport}.json"));
        let json_arg = json.to_string_lossy().into_owned();
        let mut args = launch(gpus);
        args.extend([
            "verify",
            "--ranks",
            "2x1x1",
            "--atoms",
            "6000",
            "--steps",
            "30",
            "--nstlist",
            "10",
            "--transport",
            transport,
            "--json",
            &json_arg,
        ]);
        let run = halo(&args, &[], Duration::from_secs(300));
        let all = format!("--- stdout\n{}\n--- stderr\n{}", run.stdout, run.stderr);
        assert_eq!(run.code, Some(0), "{test} {transport}\n{all}");
        // PE 0 reports what every rank's checks measured (gathered from both PEs): every step
        // checked, two searches after the first (a replan of the host-driven links each).
        let ok = run.stdout.lines().any(|l| {
            l.starts_with("[rank 0]")
                && l.contains("PE 0: 30 steps checked against the CPU reference: coordinates after the halo bit-exact (max abs err 0.0e0, ")
        });
        assert!(ok, "{test} {transport}: PE 0 did not report 30 steps checked bit-exact\n{all}");
        assert!(
            run.stdout.lines().any(|l| l.starts_with("[rank 0]") && l.contains(&format!(", {transport}: 30 steps, 3 searches"))),
            "{test} {transport}: searches\n{all}"
        );
        assert!(
            run.stdout
                .lines()
                .any(|l| l.starts_with("[rank 0]") && l.contains("(60 pulse ranges) and results against the CPU references: 0 mismatches")),
            "{test} {transport}: integrity\n{all}"
        );
        // The measured values: bit-exact over halo atoms of both ranks at every step, every pulse
        // range compared, nothing differing.
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default()).unwrap_or_else(|e| panic!("{test} {transport}: {e}\n{all}"));
        assert_eq!(
            (j["checked"].as_bool(), j["checked_steps"].as_u64(), j["failed_checks"].as_u64()),
            (Some(true), Some(30), Some(0)),
            "{test} {transport}: {j}"
        );
        assert_eq!(
            (j["coord_max_abs_err"].as_f64(), j["coord_mismatches"].as_u64(), j["mismatches"].as_u64()),
            (Some(0.0), Some(0), Some(0)),
            "{test} {transport}: {j}"
        );
        assert_eq!(
            (j["integrity_mismatches"].as_u64(), j["pulses_checked"].as_u64()),
            (Some(0), Some(60)),
            "{test} {transport}: one pulse a rank, two ranks, 30 steps: {j}"
        );
        assert!(j["halo_atoms_checked"].as_u64().is_some_and(|n| n >= 60), "{test} {transport}: halo atoms of both ranks compared: {j}");
    }
}

/// `halo md-bench` in one process and over two PEs: every row runs checked steps outside its
/// timed ones and says so (`checked`, with what the checks measured), and the command exits 0
/// only because every row passed.
#[test]
fn md_bench_rows_are_checked_in_one_process_and_over_two_pes() {
    let test = "md_bench_rows_are_checked_in_one_process_and_over_two_pes";
    let Some(gpus) = gpus_or_skip(test, 1) else { return };
    let dir = tempfile::tempdir().expect("a temporary folder");
    let bench = [
        "md-bench",
        "--ranks",
        "2x1x1",
        "--atoms",
        "6000",
        "--transport",
        "fused,staged",
        "--nstlist",
        "20",
        "--steps",
        "40",
        "--repeats",
        "2",
        "--warmup",
        "20",
    ];
    for (how, mut args) in [("one process", vec!["--gpus", "1"]), ("two PEs", launch(gpus))] {
        let json = dir.path().join(format!("md-bench-{}.json", how.replace(' ', "-")));
        let json_arg = json.to_string_lossy().into_owned();
        if how == "one process" {
            args = bench.iter().copied().chain(args).collect();
        } else {
            args.extend(bench);
        }
        args.extend(["--json", &json_arg]);
        let run = halo(&args, &[], Duration::from_secs(300));
        let all = format!("--- stdout\n{}\n--- stderr\n{}", run.stdout, run.stderr);
        assert_eq!(run.code, Some(0), "{test}, {how}\n{all}");
        assert!(run.stdout.contains("check: 2 steps before and 1 after each row's timed steps"), "{test}, {how}\n{all}");
        let rows: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default()).unwrap_or_else(|e| panic!("{test}, {how}: {e}\n{all}"));
        assert_eq!(rows["schema_version"].as_u64(), Some(1), "{test}, {how}: {rows}");
        let rows = rows["rows"].as_array().cloned().unwrap_or_default();
        assert_eq!(rows.len(), 2, "{test}, {how}: {rows:?}");
        for r in &rows {
            let c = &r["check"];
            assert_eq!(r["checked"].as_bool(), Some(true), "{test}, {how}: {r}");
            assert!(
                r["check_failure"].is_null() && r["skipped"].is_null() && r["step_us_median"].as_f64().is_some_and(|t| t > 0.0),
                "{test}, {how}: {r}"
            );
            assert_eq!(
                (c["steps"].as_u64(), c["coord_max_abs_err"].as_f64(), c["mismatches"].as_u64()),
                (Some(3), Some(0.0), Some(0)),
                "{test}, {how}: {r}"
            );
            assert!(c["halo_atoms_checked"].as_u64().is_some_and(|n| n >= 6) && c["pulses_checked"].as_u64() == Some(6), "{test}, {how}: {r}");
            assert!(c["force_max_rel_err"].as_f64().is_some_and(|e| e > 0.0 && e <= 1e-4), "{test}, {how}: {r}");
        }
    }
}
