//! `halo info`: what this process can use.

use anyhow::{Result, bail};
use halo::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use halo::gpu;
use halo::gpu::DeviceMemory;

#[derive(clap::Args)]
pub struct InfoArgs {
    /// Also initialise NVSHMEM (automatic when a launcher started several ranks) and check
    /// peer mappings and a symmetric buffer.
    #[arg(long)]
    nvshmem: bool,
    /// NVSHMEM host library to use (default: discovered).
    #[arg(long)]
    nvshmem_lib: Option<std::path::PathBuf>,
    /// Architecture whose kernel artifacts to report.
    #[arg(long, default_value = DEFAULT_ARCH)]
    arch: String,
}

pub fn run(args: InfoArgs) -> Result<()> {
    match KernelArtifacts::locate(&args.arch) {
        Ok(a) => println!(
            "kernels: {} (ABI {}, {}, NVSHMEM {} linked in)",
            a.describe(),
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
    let env = halo::launch::RankEnv::from_env();
    if args.nvshmem || env.as_ref().is_some_and(|e| e.nranks > 1) {
        return nvshmem_info(env.unwrap_or_else(halo::launch::RankEnv::single), args.nvshmem_lib.as_deref());
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
    // Peer access and link type of every pair (the same probe the router's discovery uses).
    if n > 1 {
        println!("peer access and links:");
        let probe = halo::route::gpu_facts::DriverProbe::new()?;
        for i in 0..n {
            for link in halo::route::gpu_facts::probe_links(&probe, i)? {
                println!("  GPU {i} -> {link}");
            }
        }
    }
    Ok(())
}

/// One PE's view: NVSHMEM version and library, peer mappings, and a symmetric-buffer round trip
/// (each PE writes its rank, then reads every peer's copy through its mapped address).
fn nvshmem_info(env: halo::launch::RankEnv, lib: Option<&std::path::Path>) -> Result<()> {
    let source = env.source;
    let s = halo::session::PeSession::start(env, lib)?;
    let (me, n) = (s.nvshmem.my_pe(), s.nvshmem.n_pes());
    let (a, b, c) = s.nvshmem.version();
    println!(
        "PE {me} of {n} (launcher: {source}) on GPU {} ({}), NVSHMEM {a}.{b}.{c} initialised from {}, kernels registered (NVSHMEM {:?} linked in)",
        s.ctx.ordinal(),
        s.ctx.name()?,
        s.nvshmem.library_path().display(),
        halo::nvshmem::module_nvshmem_version(&s.module)?
    );
    let buf = s.nvshmem.alloc::<u64>(1)?;
    buf.copy_from_host(&[1000 + me as u64])?;
    s.nvshmem.barrier_all()?;
    let mut bad = 0;
    for pe in 0..n {
        match buf.peer_ptr(pe) {
            Some(p) => {
                let mut v = [0u64];
                // SAFETY: `p` maps PE `pe`'s 8-byte symmetric buffer into this context.
                unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut v, p) }?;
                let ok = v[0] == 1000 + pe as u64;
                bad += usize::from(!ok);
                println!("  nvshmem_ptr(PE {pe}) = {p:#x}: reads {} ({})", v[0], if ok { "ok" } else { "WRONG" });
            }
            None => println!("  nvshmem_ptr(PE {pe}) = null: reachable by put/get only"),
        }
    }
    s.nvshmem.barrier_all()?;
    drop(buf);
    if bad > 0 {
        bail!("{bad} peer reads returned the wrong value");
    }
    Ok(())
}
