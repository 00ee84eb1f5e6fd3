//! What a project that adds `halo = { path = ... }` (or a git dependency) to its Cargo.toml gets:
//! the library with its GPU kernels embedded, so this runs an exchange with no environment
//! variable and no file next to it.
//!
//! Eight ranks of a synthetic 2x2x2 halo in one process on GPU 0: coordinates forward, forces back
//! (accumulated), checked against the library's CPU reference (`halo::exchange::reference`).
//! Without a GPU it says so and exits 0 (the build is what CI checks), unless GPUs were promised
//! (`HALO_REQUIRE_GPUS=N` with N >= 1, or `HALO_REQUIRE_GPU=1`).

use halo::abi::Float3;
use halo::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use halo::exchange::synthetic::{self, SyntheticShape};
use halo::exchange::{LocalRanks, Transport, reference};
use halo::gpu::{self, DeviceMemory, KernelModule};
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
    exchange(&artifacts).map_err(|e| e.to_string())
}

fn exchange(artifacts: &KernelArtifacts) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = gpu::open_device(0)?;
    let module = Arc::new(KernelModule::load(&ctx, artifacts)?);
    let shape = SyntheticShape { grid: [2, 2, 2], pulses_per_dim: 1, home_atoms: 2000, send_fraction: 0.3, box_len: 5.0 };
    let halos = synthetic::halos(shape, 7);
    let home = synthetic::random_values(&halos, 11, true);
    let forces = synthetic::random_values(&halos, 13, false);
    let mut ranks = LocalRanks::<Float3>::new(halos.clone(), &[module])?;
    for (r, rank) in ranks.ranks().iter().enumerate() {
        rank.x.fill_bytes(0xFF)?; // poison: every ghost the exchange misses stays NaN
        rank.upload_coordinates(&home[r])?;
        rank.f.copy_from_host(&forces[r])?;
    }
    ranks.exchange_forward(Transport::Fused)?;
    ranks.exchange_reverse_accumulate(Transport::Fused)?;
    ranks.finish()?;
    let (want_x, want_f) = (reference::coordinates(&halos, &home), reference::forces(&halos, &forces));
    let (xs, fs) = (ranks.coordinates()?, ranks.forces()?);
    let mut worst = 0.0f64;
    for r in 0..halos.len() {
        let bits = |v: &Float3| [v.x.to_bits(), v.y.to_bits(), v.z.to_bits()];
        if let Some(i) = (0..xs[r].len()).find(|&i| bits(&xs[r][i]) != bits(&want_x[r][i])) {
            return Err(format!("rank {r}: coordinate {i} is {:?}, the CPU reference says {:?}", xs[r][i], want_x[r][i]).into());
        }
        for (i, (a, b)) in fs[r].iter().zip(&want_f[r]).enumerate() {
            for (u, v) in [(a.x, b.x), (a.y, b.y), (a.z, b.z)] {
                // Accumulation order differs from the CPU's: relative to the terms' scale.
                let err = f64::from((u - v).abs()) / f64::from(v.abs()).max(1.0);
                if !(err <= 1e-5) {
                    return Err(format!("rank {r}: force {i} is {a:?}, the CPU reference says {b:?}").into());
                }
                worst = worst.max(err);
            }
        }
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
