//! What a project that adds `halo = { path = ... }` (or a git dependency) to its Cargo.toml gets:
//! the library with its GPU kernels embedded, so this runs an exchange with no environment
//! variable and no file next to it.
//!
//! Eight ranks of a synthetic 2x2x2 halo in one process on GPU 0: coordinates forward, forces back
//! (accumulated), checked against the library's CPU reference (`halo::exchange::reference`); once
//! in halo's own buffers, once as a simulation code that owns its memory and streams runs it (its
//! own x and f, its own streams, halo allocating only its protocol state).
//! Under `halo launch -n N --exe halo-downstream` each process is one PE and runs the second form:
//! its own symmetric x and f, its own stream, only its own rank's halo given to halo
//! (`-- --plain-buffers-on-pe R`: PE R lends non-symmetric memory, and every PE must refuse).
//! Without a GPU it says so and exits 0 (the build is what CI checks), unless GPUs were promised
//! (`HALO_REQUIRE_GPUS=N` with N >= 1, or `HALO_REQUIRE_GPU=1`).

use halo::abi::Float3;
use halo::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use halo::exchange::pe::{PathPolicy, PeExchange};
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{CallerBuffers, Exchange, LocalRanks, RankHalo, Transport, reference};
use halo::gpu::{self, DeviceBuffer, DeviceMemory, KernelModule};
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("halo-downstream: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let artifacts = KernelArtifacts::locate(DEFAULT_ARCH).map_err(|e| e.to_string())?;
    let ptx_dir = std::env::var("HALO_PTX_DIR").map_or_else(|_| "unset".to_string(), |d| format!("set to {d}"));
    println!("halo-downstream: kernels {} (HALO_PTX_DIR {ptx_dir})", artifacts.describe());
    if let Some(reason) = gpu::gpu_unavailable_reason() {
        // A machine promised GPUs (`HALO_REQUIRE_GPUS=N`, N >= 1, or `HALO_REQUIRE_GPU=1`, as the
        // bundle's runner sets) must not pass without one.
        let promised = std::env::var("HALO_REQUIRE_GPUS").ok().and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(0);
        if promised > 0 || std::env::var("HALO_REQUIRE_GPU").is_ok_and(|v| v == "1") {
            return Err(format!("this machine was promised GPUs (HALO_REQUIRE_GPUS / HALO_REQUIRE_GPU) but there is none: {reason}"));
        }
        println!("halo-downstream: no GPU: built OK, skipped the run ({reason})");
        return Ok(());
    }
    let env = halo::launch::RankEnv::from_env_or_single();
    if env.nranks > 1 {
        return pe_own_buffers(env).map_err(|e| e.to_string());
    }
    exchange(&artifacts).map_err(|e| e.to_string())?;
    own_buffers(&artifacts).map_err(|e| e.to_string())
}

/// The synthetic halo both forms exchange, and its values.
fn problem(ranks: [usize; 3]) -> (Vec<RankHalo>, Vec<Vec<Float3>>, Vec<Vec<Float3>>) {
    let shape = SyntheticShape { grid: ranks, pulses_per_dim: 1, home_atoms: 2000, send_fraction: 0.3, box_len: 5.0 };
    let halos = synthetic::halos(shape, 7);
    let home = synthetic::random_values(&halos, 11, true);
    let forces = synthetic::random_values(&halos, 13, false);
    (halos, home, forces)
}

/// Checks rank `r`'s coordinates (bit-exact) and forces (to rounding) against the CPU reference;
/// returns the largest relative force error.
fn check_rank(r: usize, halos: &[RankHalo], home: &[Vec<Float3>], forces: &[Vec<Float3>], x: &[Float3], f: &[Float3]) -> Result<f64, String> {
    let (want_x, want_f) = (&reference::coordinates(halos, home)[r], &reference::forces(halos, forces)[r]);
    let bits = |v: &Float3| [v.x.to_bits(), v.y.to_bits(), v.z.to_bits()];
    if let Some(i) = (0..want_x.len()).find(|&i| x.get(i).map(bits) != Some(bits(&want_x[i]))) {
        return Err(format!("rank {r}: coordinate {i} is {:?}, the CPU reference says {:?}", x.get(i), want_x[i]));
    }
    let mut worst = 0.0f64;
    for (i, (a, b)) in f.iter().zip(want_f).enumerate() {
        for (u, v) in [(a.x, b.x), (a.y, b.y), (a.z, b.z)] {
            // Accumulation order differs from the CPU's: relative to the terms' scale.
            let err = f64::from((u - v).abs()) / f64::from(v.abs()).max(1.0);
            if err.is_nan() || err > 1e-5 {
                return Err(format!("rank {r}: force {i} is {a:?}, the CPU reference says {b:?}"));
            }
            worst = worst.max(err);
        }
    }
    Ok(worst)
}

/// The application's x and f (its own allocations) lent to halo for one rank.
fn lend(ctx: &Arc<gpu::CudaContext>, x: &impl DeviceMemory<Float3>, f: &impl DeviceMemory<Float3>) -> halo::Result<CallerBuffers<Float3>> {
    // SAFETY: the caller keeps `x` and `f` alive until the exchange built with them is dropped.
    unsafe { CallerBuffers::from_raw(ctx, x.device_ptr(), f.device_ptr(), x.len()) }
}

/// Every rank in this process on the application's own buffers and streams.
fn own_buffers(artifacts: &KernelArtifacts) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = gpu::open_device(0)?;
    let module = Arc::new(KernelModule::load(&ctx, artifacts)?);
    let (halos, home, forces) = problem([2, 2, 2]);
    // The application's memory: allocated, filled and read by it (NaN ghosts until the halo lands).
    let mut xs = Vec::new();
    let mut fs = Vec::new();
    for (r, h) in halos.iter().enumerate() {
        let x = DeviceBuffer::<Float3>::uninit(&ctx, h.total_atoms)?;
        x.fill_bytes(0xFF)?;
        x.copy_from_host(&home[r])?;
        xs.push(x);
        fs.push(DeviceBuffer::from_host(&ctx, &forces[r])?);
    }
    let streams = (0..halos.len()).map(|_| ctx.new_stream()).collect::<Result<Vec<_>, _>>()?;
    let lent = xs.iter().zip(&fs).map(|(x, f)| lend(&ctx, x, f)).collect::<halo::Result<Vec<_>>>()?;
    let mut ranks = LocalRanks::<Float3>::with_buffers(halos.clone(), &[module], lent)?;
    ranks.use_streams(&streams)?;
    ranks.exchange_forward(Transport::Fused)?;
    ranks.exchange_reverse_accumulate(Transport::Fused)?;
    Exchange::finish(&mut ranks)?;
    let mut worst = 0.0f64;
    for r in 0..halos.len() {
        worst = worst.max(check_rank(r, &halos, &home, &forces, &xs[r].to_host()?, &fs[r].to_host()?)?);
    }
    drop(ranks); // before the application frees its memory
    println!(
        "halo-downstream: {} ranks on the application's own buffers and streams: fused exchange matches the CPU reference \
         (coordinates bit-exact, forces max rel err {worst:.1e})",
        halos.len()
    );
    Ok(())
}

/// This process as one PE of `halo launch -n N`: its own symmetric x and f (allocated from the
/// NVSHMEM it runs, in the same order on every PE), its own stream, only its own halo given.
fn pe_own_buffers(env: halo::launch::RankEnv) -> Result<(), Box<dyn std::error::Error>> {
    let session = halo::session::PeSession::start(env.clone(), None)?;
    let (halos, home, forces) = problem([env.nranks, 1, 1]);
    let me = env.rank;
    let most = halos.iter().map(|h| h.total_atoms).max().unwrap_or(0);
    // Symmetric allocations are collective: every PE allocates the same sizes in the same order.
    let x = session.nvshmem.alloc::<Float3>(most)?;
    let f = session.nvshmem.alloc::<Float3>(most)?;
    x.fill_bytes(0xFF)?;
    x.copy_from_host(&home[me])?;
    f.fill_bytes(0)?;
    f.copy_from_host(&forces[me])?;
    let stream = session.ctx.new_stream()?;
    // `--plain-buffers-on-pe R`: PE R lends ordinary device memory instead (a user's mistake, for
    // the test that every PE then stops with the same error, naming it, instead of hanging).
    let plain_on = std::env::args().skip_while(|a| a != "--plain-buffers-on-pe").nth(1).and_then(|r| r.parse::<usize>().ok());
    let plain = (plain_on == Some(me)).then(|| DeviceBuffer::<Float3>::zeroed(&session.ctx, most)).transpose()?;
    let lent = match &plain {
        Some(p) => lend(&session.ctx, p, &f),
        None => lend(&session.ctx, &x, &f),
    };
    // A PE whose buffers could not even be described hands its error to the others through the
    // exchange's first all-gather (returning here would leave them waiting in it).
    // A refusal is printed here, before the teardown (collective frees, NVSHMEM's finalize): the
    // launcher ends the other PEs soon after the first one exits with an error.
    let mut pe = match PeExchange::<Float3>::with_buffers_or_refusal(
        session.nvshmem.clone(),
        session.module.clone(),
        halos[me].clone(),
        PathPolicy::Routed,
        lent,
    ) {
        Ok(pe) => pe,
        Err(e) => {
            eprintln!("halo-downstream: PE {me}: the exchange refused: {e}");
            return Err(e.into());
        }
    };
    pe.use_stream(stream)?;
    pe.exchange_forward(Transport::Fused)?;
    pe.exchange_reverse_accumulate(Transport::Fused)?;
    pe.finish()?;
    let total = halos[me].total_atoms;
    let worst = check_rank(me, &halos, &home, &forces, &x.to_host()?[..total], &f.to_host()?[..total])?;
    drop(pe); // before the symmetric buffers are freed (collectively)
    println!(
        "halo-downstream: PE {me} of {}: fused exchange on its own symmetric buffers and stream matches the CPU reference \
         (coordinates bit-exact, forces max rel err {worst:.1e})",
        env.nranks
    );
    Ok(())
}

fn exchange(artifacts: &KernelArtifacts) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = gpu::open_device(0)?;
    let module = Arc::new(KernelModule::load(&ctx, artifacts)?);
    let (halos, home, forces) = problem([2, 2, 2]);
    let mut ranks = LocalRanks::<Float3>::new(halos.clone(), &[module])?;
    for (r, rank) in ranks.ranks().iter().enumerate() {
        rank.x.fill_bytes(0xFF)?; // poison: every ghost the exchange misses stays NaN
        rank.upload_coordinates(&home[r])?;
        rank.f.copy_from_host(&forces[r])?;
    }
    ranks.exchange_forward(Transport::Fused)?;
    ranks.exchange_reverse_accumulate(Transport::Fused)?;
    ranks.finish()?;
    let (xs, fs) = (ranks.coordinates()?, ranks.forces()?);
    let mut worst = 0.0f64;
    for r in 0..halos.len() {
        worst = worst.max(check_rank(r, &halos, &home, &forces, &xs[r], &fs[r])?);
    }
    println!(
        "halo-downstream: {} ranks on {} ({}): fused exchange from the embedded kernels matches the CPU reference \
         (coordinates bit-exact, forces max rel err {worst:.1e})",
        halos.len(),
        ctx.name()?,
        module_origin(artifacts)
    );
    Ok(())
}

fn module_origin(artifacts: &KernelArtifacts) -> &'static str {
    match artifacts.origin {
        halo::artifacts::Origin::Embedded(_) => "kernels embedded in the library",
        halo::artifacts::Origin::Dir(_) => "kernels from HALO_PTX_DIR",
    }
}
