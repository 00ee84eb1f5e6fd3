//! `halo info`: what this process can use.

use anyhow::Result;
use halo::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use halo::gpu;

#[derive(clap::Args)]
pub struct InfoArgs {
    /// Architecture whose kernel artifacts to report.
    #[arg(long, default_value = DEFAULT_ARCH)]
    arch: String,
}

pub fn run(args: InfoArgs) -> Result<()> {
    match KernelArtifacts::locate(&args.arch) {
        Ok(a) => println!(
            "kernels: {} (ABI {}, {}, NVSHMEM {} linked in)",
            a.dir.display(),
            a.manifest.abi_version,
            a.manifest.arch,
            a.manifest.nvshmem_version
        ),
        Err(e) => println!("kernels: {e}"),
    }
    if let Some(reason) = gpu::gpu_unavailable_reason() {
        println!("GPUs: none ({reason})");
        return Ok(());
    }
    let n = gpu::device_count();
    println!("GPUs: {n}");
    for i in 0..n {
        let ctx = gpu::open_device(i)?;
        let (free, total) = ctx.mem_get_info()?;
        println!(
            "  {i}: {} ({}), {:.1} GiB free of {:.1} GiB",
            ctx.name()?,
            gpu::arch_of(&ctx)?,
            free as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64
        );
    }
    Ok(())
}
