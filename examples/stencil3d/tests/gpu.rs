//! The stencil on a GPU: 2x2x2 ranks in one process, 50 steps, every transport that runs in one
//! process, compared bit for bit with the undecomposed grid on the CPU. Without a GPU it says
//! `SKIPPED` and passes (fails under HALO_REQUIRE_GPUS=1 or more, as the bundle's runner sets).

use halo::exchange::Transport;
use stencil3d::gpu::{RunConfig, run_local, runs_in_one_process};
use stencil3d::reference::InitialField;

#[test]
fn stencil_2x2x2_in_one_process_matches_the_cpu_bit_for_bit() {
    let Some(fx) = halo::testing::gpu_or_skip("stencil_2x2x2_in_one_process_matches_the_cpu_bit_for_bit") else {
        return;
    };
    let module = fx.module.clone();
    // Uneven blocks (13 = 6 + 7 along x) so ranks have different interiors and ghost offsets.
    for (grid, init) in [([13, 12, 10], InitialField::Random(5)), ([16, 16, 16], InitialField::HotSpot)] {
        let cfg = RunConfig { grid, ranks: [2, 2, 2], iterations: 50, alpha: 0.1, init, repeats: 1, tolerance: 0.0 };
        let transports: Vec<Transport> = Transport::ALL.into_iter().filter(|&t| runs_in_one_process(t)).collect();
        let reports = run_local(&cfg, std::slice::from_ref(&module), &transports).unwrap_or_else(|e| panic!("{grid:?}: {e}"));
        for r in &reports {
            assert_eq!(r.errors.len(), 8);
            assert!(r.bit_exact(), "{grid:?} {}: {:?}", r.transport.name(), r.errors);
            println!("{grid:?} {:>16}: bit-exact, {:.4} ms/step", r.transport.name(), r.median_ms().unwrap_or(f64::NAN));
        }
    }
}
