//! `halo` under a real process manager, no GPU needed: MPICH's Hydra `mpiexec -n 2` (from the
//! pinned `mpich` wheel that `cargo xtask fetch-mpi` unpacks into `target/mpi/mpich`, or
//! `HALO_MPIEXEC`) starts two ranks of `halo route --gather`. Each must detect its rank
//! environment from Hydra's variables, the two must all-gather their facts over PMI-1, and both
//! must build the same topology. Without an `mpiexec` the test says it skipped, and fails instead
//! under `HALO_REQUIRE_MPI=1` (what `cargo xtask test` sets).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const HALO: &str = env!("CARGO_BIN_EXE_halo");

/// The whole job, Hydra's start-up included, must be over within this.
const BOUND: Duration = Duration::from_secs(60);

/// `HALO_MPIEXEC`, else the fetched wheel's `mpiexec`.
fn mpiexec() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HALO_MPIEXEC") {
        return Some(PathBuf::from(p));
    }
    let fetched = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/mpi/mpich/bin/mpiexec");
    fetched.is_file().then_some(fetched)
}

/// Runs `cmd` with its output captured, killed (and the test failed) past [`BOUND`].
fn run_bounded(cmd: Command) -> (i32, String, String) {
    let c = halo::testing::run_captured(cmd, BOUND).expect("start mpiexec");
    assert!(!c.timed_out, "mpiexec did not finish within {BOUND:?}\nstdout:\n{}\nstderr:\n{}", c.stdout, c.stderr);
    (c.code.unwrap_or(-1), c.stdout, c.stderr)
}

#[test]
fn mpiexec_two_ranks_detect_their_environment_and_gather_facts_over_pmi() {
    let Some(mpiexec) = mpiexec() else {
        assert!(
            std::env::var_os("HALO_REQUIRE_MPI").is_none(),
            "HALO_REQUIRE_MPI is set but no mpiexec was found: run `cargo xtask fetch-mpi` or set HALO_MPIEXEC"
        );
        eprintln!("SKIPPED: no mpiexec (run `cargo xtask fetch-mpi`, or set HALO_MPIEXEC)");
        return;
    };
    let mut cmd = Command::new(&mpiexec);
    cmd.args(["-n", "2"]).arg(HALO).args(["route", "--gather", "--size", "16KiB"]);
    // Inherited launcher variables would describe the test runner, not the ranks.
    for v in [
        "HALO_RANK",
        "HALO_NRANKS",
        "HALO_LOCAL_RANK",
        "HALO_DEVICE",
        "HALO_RENDEZVOUS_DIR",
        "OMPI_COMM_WORLD_RANK",
        "SLURM_PROCID",
        "PMI_RANK",
        "PMI_FD",
    ] {
        cmd.env_remove(v);
    }
    let started = Instant::now();
    let (code, out, err) = run_bounded(cmd);
    let took = started.elapsed();
    assert_eq!(code, 0, "mpiexec failed ({code})\nstdout:\n{out}\nstderr:\n{err}");
    for rank in 0..2 {
        let line = format!("rank {rank} of 2 (local rank {rank}, device {rank}), started by PMI (MPICH Hydra), NVSHMEM bootstrap PMI");
        assert!(out.contains(&line), "missing `{line}`:\n{out}");
    }
    let hashes: Vec<&str> = out
        .lines()
        .filter(|l| l.contains(": gathered the facts of 2 ranks on 1 host(s): topology hash "))
        .filter_map(|l| l.rsplit(' ').next())
        .collect();
    assert_eq!(hashes.len(), 2, "both ranks report the gathered topology:\n{out}");
    assert_eq!(hashes[0], hashes[1], "the ranks built different topologies:\n{out}");
    // Rank 0 prints the table: two PEs on one host, distinct synthetic GPUs.
    assert!(out.contains("synthetic facts gathered from 2 ranks under PMI (MPICH Hydra)"), "{out}");
    assert!(out.contains("same-node-no-p2p"), "{out}");
    eprintln!("mpiexec -n 2 halo route --gather: {took:?}");
}
