//! The `mpi` feature's collectives under a real MPI, no GPU needed: MPICH's `mpiexec -n 2` (the
//! pinned wheel `cargo xtask fetch-mpi --only mpich` unpacks into `target/mpi/mpich`, or
//! `HALO_MPIEXEC`) starts this test binary twice as the two ranks of
//! `each_rank_of_an_mpi_job` (run only that way). Each rank checks:
//! - the unique-id broadcast: rank 0's id (made from its process id, which rank 1 cannot guess;
//!   then a real one from NVSHMEM's host library, whose `nvshmemx_get_uniqueid` needs no GPU)
//!   arrives byte for byte on every rank, and a failure to make it on rank 0 becomes an error on
//!   every rank instead of a hang;
//! - the halo all-gather: each rank passes only its own `RankHalo` and gets every rank's, equal to
//!   the whole plan (serde JSON over `MPI_Allgatherv`, lengths differing by rank, one empty);
//! - the node-local rank (`MPI_Comm_split_type`), and `all_ready` stopping every rank when one failed.
//!
//! Every rank prints one line per check; the parent test requires both ranks' lines and exit code 0.
//! Without an `mpiexec` the parent says it skipped, and fails instead under `HALO_REQUIRE_MPI=1`.

use halo::exchange::synthetic::{self, SyntheticShape};
use halo::nvshmem::UniqueId;
use halo::nvshmem::mpi::{all_gather_bytes, all_gather_halos, all_ready, broadcast_unique_id, local_rank, rsmpi};
use rsmpi::traits::Communicator;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Set in the ranks' environment by the parent test.
const CHILD: &str = "HALO_TEST_MPI_RANK_CHILD";
/// The whole job, MPI's start-up included, must be over within this.
const BOUND: Duration = Duration::from_secs(60);

/// `HALO_MPIEXEC`, else the fetched wheel's `mpiexec`.
fn mpiexec() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HALO_MPIEXEC") {
        return Some(PathBuf::from(p));
    }
    let fetched = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/mpi/mpich/bin/mpiexec");
    fetched.is_file().then_some(fetched)
}

#[test]
fn mpiexec_two_ranks_broadcast_the_unique_id_and_gather_the_halos() {
    let Some(mpiexec) = mpiexec() else {
        assert!(
            std::env::var_os("HALO_REQUIRE_MPI").is_none(),
            "HALO_REQUIRE_MPI is set but no mpiexec was found: run `cargo xtask fetch-mpi --only mpich` or set HALO_MPIEXEC"
        );
        eprintln!("SKIPPED: no mpiexec (run `cargo xtask fetch-mpi --only mpich`, or set HALO_MPIEXEC)");
        return;
    };
    let me = std::env::current_exe().expect("this test binary");
    let mut cmd = Command::new(&mpiexec);
    cmd.args(["-n", "2"]).arg(me).args(["--ignored", "--exact", "each_rank_of_an_mpi_job", "--nocapture", "--test-threads", "1"]).env(CHILD, "1");
    for v in ["HALO_DEVICE", "PMI_RANK", "PMI_FD", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"] {
        cmd.env_remove(v);
    }
    let c = halo::testing::run_captured(cmd, BOUND).expect("start mpiexec");
    assert!(!c.timed_out, "mpiexec did not finish within {BOUND:?}\nstdout:\n{}\nstderr:\n{}", c.stdout, c.stderr);
    assert_eq!(c.code, Some(0), "mpiexec failed\nstdout:\n{}\nstderr:\n{}", c.stdout, c.stderr);
    let real_id = halo::testing::nvshmem_host_library().is_some();
    if !real_id {
        eprintln!("SKIPPED the broadcast of NVSHMEM's own unique id: no NVSHMEM host library here (build halo, or set HALO_NVSHMEM_LIB)");
    }
    for rank in 0..2 {
        for check in [
            "unique id from rank 0",
            if real_id { "NVSHMEM's unique id from rank 0" } else { "unique id from rank 0" },
            "failed unique id stops every rank",
            "gathered 2 halos equal to the plan",
            "bytes of every length",
            "local rank",
            "all_ready",
        ] {
            let line = format!("rank {rank} of 2: ok: {check}");
            assert!(c.stdout.contains(&line), "missing `{line}`\nstdout:\n{}\nstderr:\n{}", c.stdout, c.stderr);
        }
    }
    assert_eq!(c.stdout.matches(": ok: ").count(), 2 * if real_id { 7 } else { 6 }, "{}", c.stdout);
}

/// One rank of the job above (`mpiexec` runs it; alone it has nothing to check).
#[test]
#[ignore = "a rank of the MPI job that mpiexec_two_ranks_broadcast_the_unique_id_and_gather_the_halos starts"]
fn each_rank_of_an_mpi_job() {
    assert!(std::env::var_os(CHILD).is_some(), "run by mpiexec_two_ranks_broadcast_the_unique_id_and_gather_the_halos only");
    let universe = rsmpi::initialize().expect("MPI_Init");
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    assert_eq!(size, 2, "the parent starts two ranks");
    let ok = |check: &str| println!("rank {rank} of {size}: ok: {check}");

    // The unique id: made on rank 0 only, from something rank 1 cannot know.
    let made_by_0 = |pid: u32| {
        let mut id = [0u8; 128];
        for (i, b) in id.iter_mut().enumerate() {
            *b = (pid.rotate_left(i as u32 % 32) as u8) ^ (i as u8);
        }
        UniqueId(id)
    };
    let pid = std::process::id();
    let id = broadcast_unique_id(&world, || {
        assert_eq!(rank, 0, "only rank 0 makes the id");
        Ok(made_by_0(pid))
    })
    .expect("broadcast");
    let pids = all_gather_bytes(&world, &pid.to_ne_bytes()).expect("gather pids");
    let pid_of_0 = u32::from_ne_bytes(pids[0].as_slice().try_into().expect("4 bytes"));
    assert_ne!(pids[0], pids[1], "two processes");
    assert_eq!(id, made_by_0(pid_of_0), "rank {rank} holds rank 0's id");
    ok("unique id from rank 0");

    // NVSHMEM's own unique id (the call needs no GPU), as `Nvshmem::init_with_mpi` makes and sends it.
    match halo::testing::nvshmem_host_library() {
        Some(path) => {
            let id = broadcast_unique_id(&world, || {
                let lib = nvshmem_sys::NvshmemLib::load(&path).map_err(halo::HaloError::Nvshmem)?;
                halo::nvshmem::unique_id(&lib)
            })
            .expect("broadcast of NVSHMEM's unique id");
            let all = all_gather_bytes(&world, &id.0).expect("gather the ids");
            assert_eq!(all[0], all[1], "both ranks hold rank 0's id");
            assert_eq!(all[0][..4], nvshmem_sys::NVSHMEMX_UNIQUEID_VERSION.to_ne_bytes(), "an NVSHMEM unique id starts with its version");
            assert!(all[0][4..].iter().any(|&b| b != 0), "NVSHMEM filled the id in");
            ok("NVSHMEM's unique id from rank 0");
        }
        None => {
            assert!(std::env::var_os("HALO_REQUIRE_NVSHMEM_LIB").is_none(), "HALO_REQUIRE_NVSHMEM_LIB is set but no NVSHMEM host library was found");
            println!("rank {rank} of {size}: SKIPPED: no NVSHMEM host library here (build halo, or set HALO_NVSHMEM_LIB)");
        }
    }

    // Rank 0 fails to make it: rank 0 returns its own error, every other rank one naming rank 0.
    let failed = broadcast_unique_id(&world, || Err(halo::HaloError::Nvshmem("no NVSHMEM on rank 0".into()))).expect_err("must fail everywhere");
    let text = failed.to_string();
    if rank == 0 {
        assert!(text.contains("no NVSHMEM on rank 0"), "{text}");
    } else {
        assert!(text.contains("rank 0 of the communicator could not make NVSHMEM's unique id"), "{text}");
    }
    ok("failed unique id stops every rank");

    // The halo plan: every rank knows only its own.
    let plan = synthetic::halos(SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: 300, send_fraction: 0.3, box_len: 5.0 }, 5);
    assert_ne!(plan[0], plan[1], "the ranks' halos differ, so a swapped order would show");
    let gathered = all_gather_halos(&world, &plan[rank]).expect("gather halos");
    assert_eq!(gathered, plan);
    ok("gathered 2 halos equal to the plan");

    // Bytes of different lengths, one rank's empty.
    let mine: Vec<u8> = (0..rank * 1000).map(|i| (i * 7 + rank) as u8).collect();
    let all = all_gather_bytes(&world, &mine).expect("gather bytes");
    assert_eq!(all.len(), size);
    for (r, got) in all.iter().enumerate() {
        let want: Vec<u8> = (0..r * 1000).map(|i| (i * 7 + r) as u8).collect();
        assert_eq!(got, &want, "rank {r}'s bytes");
    }
    ok("bytes of every length");

    // One node: the node-local rank is the rank.
    assert_eq!(local_rank(&world), rank);
    ok("local rank");

    // all_ready: rank 1 fails its preparation; both stop, rank 0 with an error naming rank 1.
    let prepared: halo::Result<u32> = if rank == 1 { Err(halo::HaloError::InvalidInput("rank 1 has no GPU".into())) } else { Ok(7) };
    let agreed = all_ready(&world, "to prepare", prepared);
    match (rank, agreed) {
        (0, Err(e)) => assert!(e.to_string().contains("rank(s) 1 of the communicator failed to prepare"), "{e}"),
        (1, Err(e)) => assert!(e.to_string().contains("rank 1 has no GPU"), "{e}"),
        (r, other) => panic!("rank {r}: expected an error, got {other:?}"),
    }
    assert_eq!(all_ready(&world, "to prepare", Ok::<_, halo::HaloError>(rank)).expect("all ready"), rank);
    ok("all_ready");
}
