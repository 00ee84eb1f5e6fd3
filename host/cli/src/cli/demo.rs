//! `halo demo`: the default run on whatever GPUs are present.

use anyhow::{Result, bail};
use halo::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use halo::gpu::{self, DeviceBuffer, DeviceMemory, KernelModule};
use halo::kernels::{IndexMap, pack_coords};
use halo::{abi::Float3, reference};
use rand::{Rng, SeedableRng};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Atoms in the demo's first check, a gather.
    #[arg(long, default_value_t = 1_000_000)]
    atoms: usize,
}

pub fn run(args: DemoArgs) -> Result<()> {
    if let Some(reason) = gpu::gpu_unavailable_reason() {
        bail!("halo demo needs an NVIDIA GPU (compute capability 7.0 or newer, driver 580 or newer), but {reason}");
    }
    let artifacts = KernelArtifacts::locate(DEFAULT_ARCH)?;
    let ctx = gpu::open_device(0)?;
    let module = KernelModule::load(&ctx, &artifacts)?;
    let stream = ctx.default_stream();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let x: Vec<Float3> = (0..args.atoms * 4).map(|_| Float3::new(rng.random(), rng.random(), rng.random())).collect();
    let map: Vec<u32> = (0..args.atoms).map(|_| rng.random_range(0..x.len() as u32)).collect();
    let xd = DeviceBuffer::from_host(&ctx, &x)?;
    let md = IndexMap::new(&ctx, &map)?;
    let out = DeviceBuffer::<Float3>::uninit(&ctx, map.len())?;
    pack_coords(&module, &stream, &xd, &md, &out, None)?;
    stream.synchronize()?;
    let ok = out.to_host()? == reference::pack(&x, &map, None);
    println!("pack of {} atoms on {} from {}: {}", args.atoms, ctx.name()?, module.path().display(), if ok { "matches the CPU reference" } else { "MISMATCH" });
    if !ok {
        bail!("the GPU gather differs from the CPU reference");
    }
    // The default run: the mini-MD step, 2x2x2 ranks spread over every visible GPU, the fused
    // GPU-initiated exchange, checked against the undecomposed CPU reference every step.
    let ranks = "2x2x2".parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    let step = super::verify::StepArgs { nstlist: 50, ..super::verify::StepArgs::default() };
    let verify = super::verify::VerifyArgs { step, steps: 100, ..super::verify::VerifyArgs::new(6000, ranks) };
    super::verify::run(verify)
}
