//! The mini-MD step on one GPU: decomposed forces (pair forces + both halos) must equal the forces
//! of the undecomposed system computed on the CPU, every step, for 1 to 16 ranks and 1 or 2 pulses
//! per dimension, with re-decomposition every 10 steps. Coordinates after the halo are bit-exact.

use halo::decomp::RankGrid;
use halo::exchange::Transport;
use halo::exchange::pe::PathPolicy;
use halo_md::{self as md, MdConfig};
use halo::testing::gpu_or_skip;
use std::sync::Arc;
use std::time::Duration;

fn config(atoms: usize, grid: [usize; 3], cutoff: f32, transport: Transport, steps: u64) -> MdConfig {
    MdConfig {
        atoms,
        grid: RankGrid { dims: grid },
        cutoff,
        buffer: 0.1,
        nstlist: 10,
        dt: 0.002,
        steps,
        seed: 5,
        transport,
        check_every: 1,
        wait_timeout: Duration::from_secs(5),
        path_policy: PathPolicy::Auto,
    }
}

fn run(test: &str, cfg: MdConfig) {
    let Some(g) = gpu_or_skip(test) else { return };
    let out = md::run_local(&cfg, &[Arc::new(g.module)], |_, _| {}).unwrap_or_else(|e| panic!("{test}: {e}"));
    assert_eq!(out.checked_steps, cfg.steps, "{test}");
    assert_eq!(out.rebuilds, cfg.steps.div_ceil(cfg.nstlist), "{test}");
    assert_eq!(out.worst.coord_max_abs, 0.0, "{test}");
    assert!(out.worst.force_max_rel <= md::run::FORCE_TOLERANCE, "{test}: {:?}", out.worst);
    eprintln!("{test}: {:?} over {} steps, {} pairs", out.worst, out.steps, out.pairs);
}

#[test]
fn one_rank_matches_the_undecomposed_forces() {
    run("md_1x1x1", config(3000, [1, 1, 1], 1.0, Transport::Fused, 100));
}

#[test]
fn two_ranks_one_pulse() {
    run("md_2x1x1", config(3000, [2, 1, 1], 1.0, Transport::Fused, 100));
}

#[test]
fn four_ranks_2x2x1() {
    run("md_2x2x1", config(3000, [2, 2, 1], 1.0, Transport::Fused, 100));
}

#[test]
fn eight_ranks_2x2x2_forwarding_chain() {
    for t in [Transport::Fused, Transport::FusedTma, Transport::PerPulseDirect, Transport::Staged, Transport::DirectCopy] {
        run("md_2x2x2", config(3000, [2, 2, 2], 1.0, t, if t == Transport::Fused { 100 } else { 30 }));
    }
}

#[test]
fn two_pulses_per_dimension() {
    // Cells of 0.78 nm and a 1.1 nm list cutoff: two pulses along x.
    run("md_4x1x1_two_pulses", config(3000, [4, 1, 1], 1.0, Transport::Fused, 100));
    // 0.62 nm cells in x, 1.23 nm in y and z, 0.8 nm list cutoff: two pulses in x, one in y and z.
    run("md_4x2x2_mixed_pulses", config(1500, [4, 2, 2], 0.7, Transport::Fused, 50));
}
