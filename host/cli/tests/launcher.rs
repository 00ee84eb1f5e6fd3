//! `halo launch` driven through the built binary with `halo selftest-child` ranks (no GPU needed):
//! exit codes, stopping the other ranks, signals, output prefixing, environment, rendezvous, and
//! that no rank process survives.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const HALO: &str = env!("CARGO_BIN_EXE_halo");

/// The bound: a failed job is over within 10 s.
const STOP_BOUND: Duration = Duration::from_secs(10);

fn halo(args: &[&str]) -> Command {
    let mut cmd = Command::new(HALO);
    cmd.args(args).stdin(Stdio::null());
    // The launcher decides these unless they are inherited; start from a known state.
    cmd.env_remove("NVSHMEM_DISABLE_NVLS").env_remove("NCCL_NVLS_ENABLE");
    cmd
}

/// Runs to completion, asserting it took less than `bound`.
fn run_within(mut cmd: Command, bound: Duration) -> (Output, Duration) {
    let start = Instant::now();
    let out = cmd.output().expect("run halo");
    let took = start.elapsed();
    assert!(took < bound, "took {took:?}, more than {bound:?}");
    (out, took)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Pids from `[rank N] selftest-child pid P rank N` lines.
fn pids(stdout: &str) -> Vec<i32> {
    stdout
        .lines()
        .filter_map(|l| l.split_once("selftest-child pid ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Whether `pid` is a live process (a zombie counts as dead: in a container nobody may reap it).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) != Some("Z"),
        Err(_) => false,
    }
}

/// Every rank is gone (an orphan would live on forever: `within` only bounds the wait for the
/// kernel to show it, not a speed).
fn assert_all_dead(pids: &[i32], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let live: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if live.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "rank processes still alive: {live:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn exit_code_propagates_and_ranks_are_named() {
    let (out, _) = run_within(halo(&["launch", "-n", "3", "--", "selftest-child", "--exit-code", "3"]), STOP_BOUND);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "stderr: {stderr}");
    // Whichever rank the launcher saw first is named as the cause; the others may be named as stopped.
    assert!((0..3).any(|r| stderr.contains(&format!("halo launch: rank {r} exited with code 3"))), "stderr: {stderr}");
}

#[test]
fn another_programs_ranks_run_under_exe() {
    // An application built on the halo library (stencil3d) is launched the same way.
    let (out, _) = run_within(halo(&["launch", "-n", "2", "--exe", "/bin/sh", "--", "-c", "echo rank $HALO_RANK of $HALO_NRANKS"]), STOP_BOUND);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    for r in 0..2 {
        assert!(stdout.contains(&format!("[rank {r}] rank {r} of 2")), "{stdout}");
    }
}

#[test]
fn success_is_zero_and_quiet() {
    let (out, _) = run_within(halo(&["launch", "-n", "2", "--", "selftest-child"]), STOP_BOUND);
    assert_eq!(out.status.code(), Some(0));
    assert!(!text(&out.stderr).contains("halo launch"), "{}", text(&out.stderr));
}

#[test]
fn one_failing_rank_stops_the_others() {
    let args =
        ["launch", "-n", "3", "--", "selftest-child", "--print-pid", "--sleep-ms", "300", "--only-rank", "1", "--exit-code", "1", "--others-hang"];
    let (out, _) = run_within(halo(&args), STOP_BOUND);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains("rank 1 exited with code 1; stopped ranks 0, 2"), "stderr: {stderr}");
    // The hanging ranks die of SIGTERM: none needed the SIGKILL that ends the 5 s grace period
    // (the launcher names every rank it had to kill).
    assert!(!stderr.contains("got SIGKILL"), "stderr: {stderr}");
    let pids = pids(&stdout);
    assert_eq!(pids.len(), 3, "stdout: {stdout}");
    assert_all_dead(&pids, STOP_BOUND);
}

#[test]
fn a_rank_killed_by_sigkill_is_named() {
    let args = [
        "launch",
        "-n",
        "3",
        "--",
        "selftest-child",
        "--print-pid",
        "--sleep-ms",
        "300",
        "--only-rank",
        "2",
        "--signal-self",
        "KILL",
        "--others-hang",
    ];
    let (out, _) = run_within(halo(&args), STOP_BOUND);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 9), "stderr: {stderr}");
    assert!(stderr.contains("rank 2 was killed by signal 9 (SIGKILL); stopped ranks 0, 1"), "stderr: {stderr}");
    assert_all_dead(&pids(&text(&out.stdout)), STOP_BOUND);
}

/// Issue 18: `HALO_FAULT=kill@STEP:RANK` kills that rank in the middle of a step, through the same
/// wrapper every exchange gets (`halo::exchange::perturb`); the launcher names it within the bound.
#[test]
fn a_rank_killed_mid_step_by_halo_fault_is_named() {
    let args = ["launch", "-n", "3", "--", "selftest-child", "--print-pid", "--null-exchange-steps", "300"];
    let mut cmd = halo(&args);
    cmd.env("HALO_FAULT", "kill@20:1").env("HALO_JITTER_US", "200:3:host");
    let (out, _) = run_within(cmd, STOP_BOUND);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 9), "stderr: {stderr}");
    assert!(
        stderr.contains("[rank 1] halo: HALO_FAULT: rank 1 kills itself with SIGKILL right after enqueueing step 20's coordinate halo"),
        "stderr: {stderr}"
    );
    assert!(stderr.contains("rank 1 was killed by signal 9 (SIGKILL); stopped ranks 0, 2"), "stderr: {stderr}");
    assert!(!text(&out.stdout).contains("ran 300 steps"), "the others were stopped, not left to finish");
    // The others were stopped by the launcher at the kill, not ended by SIGKILL after the grace.
    assert!(!stderr.contains("got SIGKILL"), "stderr: {stderr}");
    assert_all_dead(&pids(&text(&out.stdout)), STOP_BOUND);
}

#[test]
fn a_fault_on_a_rank_that_is_not_running_changes_nothing() {
    let mut cmd = halo(&["launch", "-n", "2", "--", "selftest-child", "--null-exchange-steps", "5"]);
    cmd.env("HALO_FAULT", "kill@2:7");
    let (out, _) = run_within(cmd, STOP_BOUND);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("[rank 1] null exchange: rank 1 ran 5 steps"));
}

#[test]
fn ranks_ignoring_sigterm_get_sigkill_after_the_grace_period() {
    let args = [
        "launch",
        "-n",
        "2",
        "--kill-grace-secs",
        "1",
        "--",
        "selftest-child",
        "--print-pid",
        "--ignore-sigterm",
        "--sleep-ms",
        "300",
        "--only-rank",
        "0",
        "--exit-code",
        "2",
        "--others-hang",
    ];
    let (out, took) = run_within(halo(&args), STOP_BOUND);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(stderr.contains("rank 1 ignored SIGTERM and got SIGKILL"), "stderr: {stderr}");
    assert!(took >= Duration::from_secs(1), "SIGKILL came before the grace period ended: {took:?}");
    assert_all_dead(&pids(&text(&out.stdout)), STOP_BOUND);
}

#[test]
fn output_lines_are_prefixed_and_whole() {
    let long = "x".repeat(20_000);
    let args = ["launch", "-n", "4", "--", "selftest-child", "--print", "hello world", "--print", &long, "--eprint", "to stderr", "--repeat", "20"];
    let (out, _) = run_within(halo(&args), STOP_BOUND);
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    let mut counts = [0usize; 4];
    for line in stdout.lines() {
        let (rank, rest) = line.strip_prefix("[rank ").and_then(|l| l.split_once("] ")).unwrap_or_else(|| panic!("unprefixed line: {:.80}", line));
        let rank: usize = rank.parse().expect("rank number");
        assert!(rest == "hello world" || rest == long, "mixed line from rank {rank}: {:.80}…", rest);
        counts[rank] += 1;
    }
    assert_eq!(counts, [40; 4]);
    let stderr = text(&out.stderr);
    for rank in 0..4 {
        assert_eq!(stderr.matches(&format!("[rank {rank}] to stderr\n")).count(), 20, "stderr: {stderr}");
    }
}

#[test]
fn ranks_get_their_environment() {
    let mut cmd = halo(&[
        "launch",
        "-n",
        "4",
        "--gpus",
        "4,6",
        "--",
        "selftest-child",
        "--print-env",
        "HALO_RANK",
        "--print-env",
        "HALO_NRANKS",
        "--print-env",
        "HALO_LOCAL_RANK",
        "--print-env",
        "HALO_DEVICE",
        "--print-env",
        "NVSHMEM_DISABLE_NVLS",
        "--print-env",
        "NCCL_NVLS_ENABLE",
        "--print-env",
        "CUDA_VISIBLE_DEVICES",
        "--print-env",
        "HALO_PES_PER_GPU",
    ]);
    // A value the user set is kept; CUDA_VISIBLE_DEVICES passes through untouched.
    cmd.env("NCCL_NVLS_ENABLE", "7").env("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7");
    let (out, _) = run_within(cmd, STOP_BOUND);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let lines: BTreeSet<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    for (rank, device) in [(0, 4), (1, 6), (2, 4), (3, 6)] {
        for expected in [
            format!("[rank {rank}] env HALO_RANK={rank}"),
            format!("[rank {rank}] env HALO_NRANKS=4"),
            format!("[rank {rank}] env HALO_LOCAL_RANK={rank}"),
            format!("[rank {rank}] env HALO_DEVICE={device}"),
            format!("[rank {rank}] env NVSHMEM_DISABLE_NVLS=1"),
            format!("[rank {rank}] env NCCL_NVLS_ENABLE=7"),
            format!("[rank {rank}] env CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"),
            format!("[rank {rank}] env HALO_PES_PER_GPU=2"),
        ] {
            assert!(lines.contains(&expected), "missing {expected:?} in {lines:#?}");
        }
    }
}

#[test]
fn uneven_gpu_layouts_are_refused_before_any_rank_starts() {
    // 3 ranks on 2 GPUs: NVSHMEM 3.4.5 would hang in its initialisation (issue 20).
    let (out, _) = run_within(halo(&["launch", "-n", "3", "--gpus", "0,1", "--", "selftest-child", "--print-pid"]), STOP_BOUND);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    for part in
        ["would put 2 on GPU 0, 1 on GPU 1", "cannot start an uneven number of PEs per GPU", "-n 2 or -n 4 with --gpus 0,1", "--allow-uneven-gpus"]
    {
        assert!(stderr.contains(part), "missing {part:?} in {stderr}");
    }
    assert!(pids(&text(&out.stdout)).is_empty(), "a rank was started: {}", text(&out.stdout));
    // The override starts it, and every rank knows how many share its GPU.
    let args = ["launch", "-n", "3", "--gpus", "0,1", "--allow-uneven-gpus", "--", "selftest-child", "--print-env", "HALO_PES_PER_GPU"];
    let (out, _) = run_within(halo(&args), STOP_BOUND);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for (rank, sharing) in [(0, 2), (1, 1), (2, 2)] {
        assert!(stdout.contains(&format!("[rank {rank}] env HALO_PES_PER_GPU={sharing}")), "{stdout}");
    }
}

#[test]
fn a_rank_stuck_in_startup_is_ended_by_the_watchdog() {
    let args = ["launch", "-n", "3", "--", "selftest-child", "--print-pid", "--only-rank", "1", "--stall-startup", "--others-hang"];
    let mut cmd = halo(&args);
    cmd.env("HALO_STARTUP_TIMEOUT_S", "1");
    let (out, took) = run_within(cmd, STOP_BOUND);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(86), "stderr: {stderr}");
    assert!(stderr.contains("[rank 1] halo: error: rank 1 of 3 (GPU 1): `NVSHMEM init` did not finish within 1.0 s"), "stderr: {stderr}");
    assert!(stderr.contains("uneven number of PEs per GPU") && stderr.contains("NVSHMEM_DEBUG=INFO"), "stderr: {stderr}");
    assert!(stderr.contains("rank 1 exited with code 86 (halo's watchdog"), "stderr: {stderr}");
    // Not before the watchdog's second (a lower bound: a loaded machine only makes it later); that
    // the watchdog, not the grace period's SIGKILL, ended it is in the messages above.
    assert!(took >= Duration::from_secs(1), "took {took:?}");
    assert!(!stderr.contains("got SIGKILL"), "stderr: {stderr}");
    assert_all_dead(&pids(&text(&out.stdout)), STOP_BOUND);
}

/// The rendezvous directory named in the children's output.
fn rendezvous_dir(stdout: &str) -> PathBuf {
    let line = stdout.lines().find_map(|l| l.split_once("rendezvous-dir ").map(|(_, r)| r)).expect("rendezvous-dir line");
    PathBuf::from(line.split(" mode ").next().expect("path"))
}

#[test]
fn rendezvous_round_trip_across_three_ranks() {
    let (out, _) = run_within(halo(&["launch", "-n", "3", "--", "selftest-child", "--rendezvous"]), STOP_BOUND);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    let ids: Vec<&str> = stdout.lines().filter_map(|l| l.split_once("unique-id 128 bytes ").map(|(_, id)| id)).collect();
    assert_eq!(ids.len(), 3, "stdout: {stdout}");
    assert!(ids.iter().all(|id| *id == ids[0] && id.len() == 256), "ids differ: {ids:?}");
    assert_eq!(stdout.matches("gathered rank-0,rank-1,rank-2\n").count(), 3, "stdout: {stdout}");
    assert_eq!(stdout.matches(" mode 700\n").count(), 3, "directory not private: {stdout}");
    assert!(stdout.contains("[rank 0] unique-id-file mode 600\n"), "stdout: {stdout}");
    let dir = rendezvous_dir(&stdout);
    assert!(!dir.exists(), "{} was left behind", dir.display());
}

#[test]
fn rendezvous_dir_is_removed_after_a_failure() {
    let args = ["launch", "-n", "2", "--", "selftest-child", "--rendezvous", "--only-rank", "1", "--exit-code", "5", "--others-hang"];
    let (out, _) = run_within(halo(&args), STOP_BOUND);
    assert_eq!(out.status.code(), Some(5));
    let dir = rendezvous_dir(&text(&out.stdout));
    assert!(!dir.exists(), "{} was left behind", dir.display());
}

/// Starts a launcher of hanging ranks and returns it with the ranks' pids once all have printed them.
fn start_hanging(nranks: usize) -> (std::process::Child, Vec<i32>) {
    let n = nranks.to_string();
    let mut launcher = halo(&["launch", "-n", &n, "--", "selftest-child", "--print-pid", "--hang"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start halo launch");
    let stdout = launcher.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut pids = Vec::new();
    let deadline = Instant::now() + STOP_BOUND;
    while pids.len() < nranks {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => pids.extend(self::pids(&line)),
            Err(_) => {
                let _ = launcher.kill();
                panic!("the ranks did not all start: {pids:?}");
            }
        }
    }
    (launcher, pids)
}

fn wait_within(child: &mut std::process::Child, bound: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("the launcher did not exit within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_to_the_launcher_stops_all_ranks() {
    let (mut launcher, pids) = start_hanging(3);
    let launcher_pid = i32::try_from(launcher.id()).expect("pid");
    // SAFETY: kill with a valid pid of our own child.
    assert_eq!(unsafe { libc::kill(launcher_pid, libc::SIGTERM) }, 0);
    let status = wait_within(&mut launcher, STOP_BOUND);
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    let mut stderr = String::new();
    if let Some(mut e) = launcher.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut stderr).expect("stderr");
    }
    assert!(stderr.contains("interrupted by SIGTERM; stopped ranks 0, 1, 2"), "stderr: {stderr}");
    assert_all_dead(&pids, STOP_BOUND);
}

#[test]
fn ranks_die_with_a_killed_launcher() {
    let (mut launcher, pids) = start_hanging(2);
    // SIGKILL cannot be caught: only PR_SET_PDEATHSIG stands between the ranks and orphanhood.
    launcher.kill().expect("kill the launcher");
    let _ = launcher.wait();
    assert_all_dead(&pids, STOP_BOUND);
}

#[test]
fn bad_invocations_fail_cleanly() {
    let (out, _) = run_within(halo(&["launch", "-n", "0", "--", "selftest-child"]), STOP_BOUND);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("at least 1"), "{}", text(&out.stderr));
    let (out, _) = run_within(halo(&["launch", "-n", "2"]), STOP_BOUND);
    assert_ne!(out.status.code(), Some(0));
    let (out, _) = run_within(halo(&["launch", "-n", "1", "--kill-grace-secs", "-1", "--", "info"]), STOP_BOUND);
    assert_ne!(out.status.code(), Some(0));
}

#[test]
fn a_segfault_names_the_thread_and_the_rank_still_dies_of_it() {
    use std::os::unix::process::ExitStatusExt;
    // Alone: the crash report, then death by the same signal (not an exit code).
    let (out, _) = run_within(halo(&["selftest-child", "--signal-self", "SIGSEGV"]), STOP_BOUND);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "stderr: {stderr}");
    assert!(stderr.contains("halo: fatal signal 11 (SIGSEGV) in thread '"), "stderr: {stderr}");
    assert!(stderr.contains("the process's main thread") && stderr.contains("sent by another process (kill)"), "stderr: {stderr}");
    // glibc: the faulting thread's frames follow, one `object(+offset)[address]` line each.
    if cfg!(all(target_os = "linux", target_env = "gnu")) {
        assert!(stderr.lines().filter(|l| l.contains("+0x")).count() >= 3, "no frames: {stderr}");
    }
    // Under the launcher the report carries the rank prefix and the launcher names the signal.
    let (out, _) = run_within(halo(&["launch", "-n", "2", "--", "selftest-child", "--only-rank", "1", "--signal-self", "SIGSEGV"]), STOP_BOUND);
    let stderr = text(&out.stderr);
    assert!(stderr.contains("[rank 1] halo: fatal signal 11 (SIGSEGV)"), "stderr: {stderr}");
    assert!(stderr.contains("halo launch: rank 1 was killed by signal 11 (SIGSEGV)"), "stderr: {stderr}");
}
