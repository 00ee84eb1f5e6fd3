//! `halo plan`: build the synthetic system, decompose it and print the halo plan (no GPU needed).

use anyhow::{Context, Result};
use halo::decomp::{DIM_NAMES, HaloPlan, RankGrid};
use halo::system::MolecularSystem;
use serde::Serialize;
use std::fmt::Write as _;
use std::io::Write as _;

#[derive(clap::Args)]
pub struct PlanArgs {
    /// Atoms in the synthetic box (about 100 atoms/nm³: 45000 atoms make a 7.66 nm cube).
    #[arg(long, default_value_t = 45_000)]
    atoms: usize,
    /// Rank grid AxBxC, for example 2x2x1.
    #[arg(long, default_value = "2x2x1")]
    ranks: String,
    /// Interaction cutoff in nm (below half the box edge).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    cutoff: f32,
    /// Seed of the synthetic system.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the whole plan (index maps included) as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// What `--json` prints.
#[derive(Serialize)]
struct Report<'a> {
    atoms: usize,
    seed: u64,
    density: f64,
    pulses_per_dim: [usize; 3],
    max_atoms: usize,
    max_pulse_extent: usize,
    plan: &'a HaloPlan,
}

pub fn run(args: PlanArgs) -> Result<()> {
    let grid = RankGrid::parse(&args.ranks).context("reading --ranks")?;
    let system = MolecularSystem::generate(args.atoms, args.seed).context("generating the system (--atoms)")?;
    let plan = HaloPlan::build(&system, grid, args.cutoff).with_context(|| {
        format!("planning the halo of {} atoms ({:.3} nm box) on {grid} ranks with a {} nm cutoff", args.atoms, system.box_size[0], args.cutoff)
    })?;
    plan.validate().context("validating the plan")?;
    plan.validate_atoms(system.len()).context("validating the plan against the system")?;
    let geo = plan.decomposition()?;
    let text = if args.json {
        let report = Report {
            atoms: system.len(),
            seed: args.seed,
            density: system.density(),
            pulses_per_dim: geo.pulses,
            max_atoms: plan.max_atoms(),
            max_pulse_extent: plan.max_pulse_extent(),
            plan: &plan,
        };
        let mut s = serde_json::to_string_pretty(&report).context("encoding the plan as JSON")?;
        s.push('\n');
        s
    } else {
        table(&system, &plan, geo.pulses)
    };
    // Written, not println!'d, so a closed pipe (`| head`) ends quietly instead of panicking.
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing the plan to stdout"),
    }
}

fn table(system: &MolecularSystem, plan: &HaloPlan, pulses: [usize; 3]) -> String {
    let b = plan.box_size;
    let g = plan.grid;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "system: {} atoms, box {:.3} x {:.3} x {:.3} nm, {:.1} atoms/nm^3, seed {}",
        system.len(),
        b[0],
        b[1],
        b[2],
        system.density(),
        system.seed
    );
    let _ = writeln!(
        s,
        "grid {g} ({} ranks), cutoff {} nm, cells {:.3} x {:.3} x {:.3} nm, pulses x:{} y:{} z:{}",
        g.num_ranks(),
        plan.cutoff,
        b[0] / g.dims[0] as f32,
        b[1] / g.dims[1] as f32,
        b[2] / g.dims[2] as f32,
        pulses[0],
        pulses[1],
        pulses[2]
    );
    let _ = writeln!(s, "buffers: max atoms per rank {}, max pulse extent {}", plan.max_atoms(), plan.max_pulse_extent());
    for r in &plan.ranks {
        let c = g.coords_of(r.rank);
        let _ = writeln!(
            s,
            "\nrank {} (cell {},{},{}): {} home atoms (dependency offset), {} local atoms",
            r.rank, c[0], c[1], c[2], r.home_atoms, r.total_atoms
        );
        if r.pulses.is_empty() {
            let _ = writeln!(s, "  no pulses (nothing is decomposed)");
            continue;
        }
        let _ = writeln!(
            s,
            "  {:>5} {:>3} {:>2} {:>6} {:>6} {:>8} {:>8} {:>8} {:>11}  shift",
            "pulse", "dim", "p", "to", "from", "send", "recv", "offset", "peer-offset"
        );
        for (k, p) in r.pulses.iter().enumerate() {
            let shift = if p.spec.shift.is_some() { format!("+{:.3} {}", p.shift_along_dim(), DIM_NAMES[p.dim]) } else { "-".into() };
            let _ = writeln!(
                s,
                "  {:>5} {:>3} {:>2} {:>6} {:>6} {:>8} {:>8} {:>8} {:>11}  {}",
                k,
                DIM_NAMES[p.dim],
                p.pulse_in_dim,
                p.spec.send_rank,
                p.spec.recv_rank,
                p.send_size(),
                p.spec.recv_size,
                p.spec.atom_offset,
                p.spec.peer_atom_offset,
                shift
            );
        }
    }
    s
}
