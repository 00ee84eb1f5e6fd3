//! The README's "library in ten lines", compiled with the library's examples so that the snippet
//! stays true (`host/cli/tests/user_text.rs` checks that every line of the README's block is here).
//! Eight ranks of a synthetic 2x2x2 halo on GPU 0; needs a GPU to run.

// Kept as the README prints it (its lines are checked against the README), not as rustfmt folds it.
#[rustfmt::skip]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use halo::exchange::{LocalRanks, Transport, reference, synthetic::{self, SyntheticShape}};
    use halo::{artifacts::{DEFAULT_ARCH, KernelArtifacts}, gpu::{self, DeviceMemory, KernelModule}};

    let module = std::sync::Arc::new(KernelModule::load(&gpu::open_device(0)?, &KernelArtifacts::locate(DEFAULT_ARCH)?)?);
    let halos = synthetic::halos(SyntheticShape { grid: [2, 2, 2], pulses_per_dim: 1, home_atoms: 2000, send_fraction: 0.3, box_len: 5.0 }, 7);
    let (home, forces) = (synthetic::random_values(&halos, 11, true), synthetic::random_values(&halos, 13, false));
    let mut ranks = LocalRanks::<halo::abi::Float3>::new(halos.clone(), &[module])?;
    for (r, rank) in ranks.ranks().iter().enumerate() { rank.upload_coordinates(&home[r])?; rank.f.copy_from_host(&forces[r])?; }
    ranks.exchange_forward(Transport::Fused)?;               // coordinates to the neighbours
    ranks.exchange_reverse_accumulate(Transport::Fused)?;    // forces back, added into the owners
    ranks.finish()?;
    assert_eq!(ranks.coordinates()?, reference::coordinates(&halos, &home));   // bit-exact
    println!("readme: 8 ranks exchanged, coordinates bit-exact against the CPU reference");
    Ok(())
}
