//! A halo exchange started entirely from MPI (feature `mpi`): run it with `mpiexec -n 2`.
//!
//! ```text
//! cargo build --release -p halo --features mpi --example mpi_exchange
//! mpiexec -n 2 target/release/examples/mpi_exchange
//! ```
//!
//! 1. MPI is initialised by the program (the `mpi` crate); halo reads no launcher variable.
//! 2. `PeSession::init_with_mpi`: the GPU from the rank's node-local rank, NVSHMEM bootstrapped
//!    by the unique id broadcast over `MPI_COMM_WORLD`, the kernels registered.
//! 3. Each rank knows only its own halo (a synthetic 2x1x1 decomposition); every rank's is
//!    all-gathered over MPI (`all_gather_halos`) for the CPU reference.
//! 4. The program owns its coordinates and forces (two allocations on NVSHMEM's symmetric heap,
//!    the same sizes in the same order on every rank, handed to `PeExchange::with_buffers`) and
//!    the stream the exchange runs on (`PeExchange::use_stream`).
//! 5. Coordinates forward, forces back (accumulated), checked against the CPU reference
//!    (`halo::exchange::reference`): coordinates bit for bit, forces to 1e-5 relative.
//!
//! Prints one `mpi_exchange: rank R of N ... matches the CPU reference` line per rank and exits 0;
//! any mismatch or error prints `mpi_exchange: rank R: error: ...` and exits 1.

use halo::abi::Float3;
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{CallerBuffers, PathPolicy, PeExchange, Transport, reference};
use halo::gpu::DeviceMemory;
use halo::nvshmem::mpi::{all_gather_halos, rsmpi};
use halo::session::PeSession;
use rsmpi::traits::{Communicator, CommunicatorCollectives};
use std::process::ExitCode;

fn main() -> ExitCode {
    // NVLink multicast stays off on shared machines (NVSHMEM reads this at init). Set before MPI
    // starts any thread; a value in the environment wins.
    if std::env::var_os("NVSHMEM_DISABLE_NVLS").is_none() {
        // SAFETY: no other thread exists yet.
        unsafe { std::env::set_var("NVSHMEM_DISABLE_NVLS", "1") };
    }
    let Some(universe) = rsmpi::initialize() else {
        eprintln!("mpi_exchange: error: MPI was already initialised");
        return ExitCode::FAILURE;
    };
    let world = universe.world();
    let rank = world.rank();
    let outcome = run(&world);
    if let Err(e) = &outcome {
        eprintln!("mpi_exchange: rank {rank}: error: {e}");
    }
    // Every rank's verdict, so that each exits with the job's outcome.
    let mut all_ok = 0u8;
    world.all_reduce_into(&u8::from(outcome.is_ok()), &mut all_ok, rsmpi::collective::SystemOperation::min());
    // `universe` finalises MPI when it goes, after `run` dropped NVSHMEM.
    if all_ok == 1 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn run(world: &rsmpi::topology::SimpleCommunicator) -> Result<(), Box<dyn std::error::Error>> {
    let session = PeSession::init_with_mpi(world, None)?;
    let (me, n) = (session.env.rank, session.env.nranks);
    if n != 2 {
        return Err(format!("run with `mpiexec -n 2` ({n} ranks started)").into());
    }
    // The whole plan exists only to make this rank's part here; the exchange is given only its own.
    let shape = SyntheticShape { grid: [2, 1, 1], pulses_per_dim: 1, home_atoms: 20_000, send_fraction: 0.3, box_len: 5.0 };
    let mine = synthetic::halos(shape, 7).swap_remove(me);
    let halos = all_gather_halos(world, &mine)?;
    let home = synthetic::random_values(&halos, 11, true);
    let forces = synthetic::random_values(&halos, 13, false);

    // The program's own buffers: symmetric, the same size and order on every rank.
    let len = halos.iter().map(|h| h.total_atoms).max().unwrap_or(0);
    let x = session.nvshmem.alloc::<Float3>(len)?;
    let f = session.nvshmem.alloc::<Float3>(len)?;
    x.fill_bytes(0xFF)?; // poison: every ghost the exchange misses stays NaN
    x.copy_from_host(&home[me])?;
    f.copy_from_host(&forces[me])?;
    let ctx = &session.ctx;
    let stream = ctx.new_stream()?;
    let atoms = halos[me].total_atoms;
    // SAFETY: `x` and `f` outlive the exchange (dropped after it below) and nothing else writes them meanwhile.
    let buffers = unsafe { CallerBuffers::from_raw(ctx, x.device_ptr(), f.device_ptr(), atoms) };
    // A rank whose buffers were refused tells every rank through the exchange's first all-gather.
    let mut exchange =
        PeExchange::<Float3>::with_buffers_or_refusal(session.nvshmem.clone(), session.module.clone(), mine, PathPolicy::Routed, buffers)?;
    // The program's own stream: the exchange's launches and its finish go there.
    exchange.use_stream(stream.clone())?;
    exchange.exchange_forward(Transport::Fused)?;
    exchange.exchange_reverse_accumulate(Transport::Fused)?;
    exchange.finish()?;
    drop(exchange); // before the buffers it uses: collective frees in the same order on every rank

    let total = halos[me].total_atoms;
    let (got_x, got_f) = (x.to_host()?, f.to_host()?);
    let (want_x, want_f) = (reference::coordinates(&halos, &home).swap_remove(me), reference::forces(&halos, &forces).swap_remove(me));
    let bits = |v: &Float3| [v.x.to_bits(), v.y.to_bits(), v.z.to_bits()];
    if let Some(i) = (0..total).find(|&i| bits(&got_x[i]) != bits(&want_x[i])) {
        return Err(format!("coordinate {i} is {:?}, the CPU reference says {:?}", got_x[i], want_x[i]).into());
    }
    let mut worst = 0.0f64;
    for (i, (a, b)) in got_f[..total].iter().zip(&want_f).enumerate() {
        for (u, v) in [(a.x, b.x), (a.y, b.y), (a.z, b.z)] {
            // Accumulation order differs from the CPU's: relative to the terms' scale.
            let err = f64::from((u - v).abs()) / f64::from(v.abs()).max(1.0);
            if err.is_nan() || err > 1e-5 {
                return Err(format!("force {i} is {a:?}, the CPU reference says {b:?}").into());
            }
            worst = worst.max(err);
        }
    }
    println!(
        "mpi_exchange: rank {me} of {n} (GPU {}, NVSHMEM PE {} of {}, {}): {} home + {} received atoms in the program's own symmetric buffers \
         match the CPU reference (coordinates bit-exact, forces max rel err {worst:.1e})",
        session.env.device,
        session.nvshmem.my_pe(),
        session.nvshmem.n_pes(),
        session.env.source,
        halos[me].home_atoms,
        total - halos[me].home_atoms,
    );
    drop((f, x));
    Ok(())
}
