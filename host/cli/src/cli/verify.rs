//! `halo verify`: the mini-MD step on the GPUs, checked against the undecomposed CPU reference.

use anyhow::{Context, Result, bail};
use halo::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use halo::decomp::RankGrid;
use halo::exchange::Transport;
use halo::exchange::pe::PathPolicy;
use halo::gpu::{self, KernelModule};
use halo::launch::RankEnv;
use halo_md::{self as md, MdConfig, MdOutcome};
use halo::session::PeSession;
use crate::machine::MachineInfo;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Clone)]
pub struct VerifyArgs {
    /// Atoms in the synthetic liquid (about 100 per nm³).
    #[arg(long, default_value_t = 6000)]
    pub atoms: usize,
    /// Rank grid, e.g. 2x1x1 or 2x2x2. Under `halo launch -n N` it must have N ranks.
    #[arg(long, default_value = "2x1x1")]
    pub ranks: RankGrid,
    /// Interaction cutoff (nm).
    #[arg(long, default_value_t = 1.0)]
    pub cutoff: f32,
    /// Pair-list buffer beyond the cutoff (nm).
    #[arg(long, default_value_t = 0.1)]
    pub buffer: f32,
    /// Steps between re-decompositions.
    #[arg(long, default_value_t = 10)]
    pub nstlist: u64,
    /// Steps to run.
    #[arg(long, default_value_t = 100)]
    pub steps: u64,
    /// Time step (ps).
    #[arg(long, default_value_t = 0.002)]
    pub dt: f32,
    /// Halo transport.
    #[arg(long, default_value = "fused", value_parser = super::transport_parser())]
    pub transport: Transport,
    /// Check every N steps (1: every step; 0: never, and time the steps instead).
    #[arg(long, default_value_t = 1)]
    pub check_every: u64,
    /// Seed of the system.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Deadline of every device wait, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub wait_timeout_ms: u64,
    /// NVSHMEM put + signal for every pulse, even between NVLink peers (several processes only).
    #[arg(long)]
    pub force_put: bool,
    /// GPUs to spread the ranks over in one process (default: all visible).
    #[arg(long)]
    pub gpus: Option<usize>,
    /// Write the outcome and the machine as JSON (PE 0 under a launcher).
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

impl VerifyArgs {
    fn config(&self) -> MdConfig {
        MdConfig {
            atoms: self.atoms,
            grid: self.ranks,
            cutoff: self.cutoff,
            buffer: self.buffer,
            nstlist: self.nstlist,
            dt: self.dt,
            steps: self.steps,
            seed: self.seed,
            transport: self.transport,
            check_every: self.check_every,
            wait_timeout: Duration::from_millis(self.wait_timeout_ms),
            path_policy: if self.force_put { PathPolicy::ForcePut } else { PathPolicy::Auto },
        }
    }
}

/// What a run says about itself: the timing line (when steps were timed) and the outcome line.
/// With no step checked it says `not checked`: a run that compared nothing proves nothing.
fn report_lines(args: &VerifyArgs, who: &str, o: &MdOutcome) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(us) = o.median_step_us() {
        let mut v = o.window_step_us.clone();
        v.sort_by(f64::total_cmp);
        lines.push(format!(
            "{who}: MD step time {us:.1} µs median [{:.1}-{:.1}] over {} windows of steps between searches \
             (GPU timeline of rank 0; search steps excluded): {:.0} ns/day at {} fs",
            v[0],
            v[v.len() - 1],
            v.len(),
            86_400.0 * 1e6 / us * f64::from(args.dt) * 1e-3,
            args.dt * 1000.0
        ));
    }
    let verdict = if o.checked_steps == 0 {
        format!("not checked (--check-every {}: no step was compared with the CPU reference)", args.check_every)
    } else {
        format!(
            "coordinates after the halo: max abs err {:.1e} (bit-exact: {}); forces vs undecomposed: max rel err {:.2e}, max abs err {:.2e} kJ/mol/nm",
            o.worst.coord_max_abs,
            o.worst.coord_max_abs == 0.0,
            o.worst.force_max_rel,
            o.worst.force_max_abs
        )
    };
    lines.push(format!(
        "{who}: {} atoms, {} ranks ({}), {}: {} steps, {} checked against the CPU reference, {} re-decompositions, {} pairs; {verdict}; {:.2} s",
        args.atoms,
        args.ranks.num_ranks(),
        args.ranks,
        args.transport.name(),
        o.steps,
        o.checked_steps,
        o.rebuilds,
        o.pairs,
        o.wall.as_secs_f64()
    ));
    lines
}

fn report(args: &VerifyArgs, who: &str, o: &MdOutcome) {
    for line in report_lines(args, who, o) {
        println!("{line}");
    }
}

/// `--json`: the run's configuration, outcome and machine.
fn json(args: &VerifyArgs, who: &str, o: &MdOutcome, machine: &MachineInfo) -> serde_json::Value {
    let checked = o.checked_steps > 0;
    serde_json::json!({
        "machine": machine,
        "who": who,
        "atoms": args.atoms,
        "ranks": args.ranks.to_string(),
        "transport": args.transport.name(),
        "steps": o.steps,
        "checked_steps": o.checked_steps,
        "checked": checked,
        "coordinates_bit_exact": checked.then_some(o.worst.coord_max_abs == 0.0),
        "force_max_rel_err": checked.then_some(o.worst.force_max_rel),
        "force_max_abs_err": checked.then_some(o.worst.force_max_abs),
        "rebuilds": o.rebuilds,
        "pairs": o.pairs,
        "md_step_us_median": o.median_step_us(),
        "md_step_us_windows": o.window_step_us,
        "wall_s": o.wall.as_secs_f64(),
    })
}

fn finish(args: &VerifyArgs, who: &str, o: &MdOutcome, machine: Option<&MachineInfo>) -> Result<()> {
    report(args, who, o);
    if let (Some(path), Some(m)) = (&args.json, machine) {
        let text = serde_json::to_string_pretty(&json(args, who, o, m)).context("serialising the outcome")?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

pub fn run(args: VerifyArgs) -> Result<()> {
    let cfg = args.config();
    if let Some(env) = RankEnv::from_env().filter(|e| e.nranks > 1) {
        if env.nranks != args.ranks.num_ranks() {
            bail!("--ranks {} has {} ranks but {} processes were started: use `halo launch -n {}`", args.ranks, args.ranks.num_ranks(), env.nranks, args.ranks.num_ranks());
        }
        let rank = env.rank;
        let session = PeSession::start(env, None).context("starting NVSHMEM")?;
        // PE 0 records the machine (and writes --json); every PE prints its outcome.
        let machine = (rank == 0).then(|| MachineInfo::collect(Some(&session.nvshmem)));
        if let Some(m) = &machine {
            print!("{}", m.text());
        }
        let outcome = md::run_pe(&cfg, &session, |_, _| {}).with_context(|| format!("rank {rank}"))?;
        return finish(&args, &format!("PE {rank}"), &outcome, machine.as_ref());
    }
    if let Some(reason) = gpu::gpu_unavailable_reason() {
        bail!("halo verify needs an NVIDIA GPU: {reason}");
    }
    let artifacts = KernelArtifacts::locate(DEFAULT_ARCH)?;
    let n = args.gpus.unwrap_or_else(gpu::device_count).clamp(1, gpu::device_count());
    let modules = (0..n).map(|i| Ok(Arc::new(KernelModule::load(&gpu::open_device(i)?, &artifacts)?))).collect::<Result<Vec<_>>>()?;
    let machine = MachineInfo::collect(None);
    print!("{}", machine.text());
    let outcome = md::run_local(&cfg, &modules, |_, _| {})?;
    finish(&args, &format!("one process on {n} GPU(s)"), &outcome, Some(&machine))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        verify: VerifyArgs,
    }

    fn args(extra: &[&str]) -> VerifyArgs {
        Cli::try_parse_from(["verify"].iter().chain(extra)).unwrap().verify
    }

    fn outcome(checked: u64) -> MdOutcome {
        let mut o = MdOutcome { steps: 100, checked_steps: checked, rebuilds: 10, pairs: 1234, ..Default::default() };
        o.window_step_us = vec![400.0, 410.0, 420.0];
        o
    }

    #[test]
    fn zero_checked_steps_say_not_checked_never_bit_exact() {
        let a = args(&["--check-every", "0"]);
        let lines = report_lines(&a, "one process on 1 GPU(s)", &outcome(0));
        let last = lines.last().unwrap();
        assert!(last.contains("0 checked") && last.contains("not checked (--check-every 0"), "{last}");
        assert!(!last.contains("bit-exact") && !last.contains("max rel err"), "{last}");
        assert!(lines[0].contains("MD step time 410.0 µs"), "{lines:?}");
        let j = json(&a, "x", &outcome(0), &crate::machine::tests::sample());
        assert_eq!(j["checked"], false);
        assert!(j["coordinates_bit_exact"].is_null() && j["force_max_rel_err"].is_null(), "{j}");
        assert_eq!(j["machine"]["nvidia_driver"], "580.159.04");
    }

    #[test]
    fn checked_steps_report_their_errors() {
        let a = args(&[]);
        let mut o = outcome(100);
        o.worst.force_max_rel = 2e-6;
        let last = report_lines(&a, "PE 0", &o).pop().unwrap();
        assert!(last.contains("100 checked") && last.contains("bit-exact: true") && last.contains("max rel err 2.00e-6"), "{last}");
        let j = json(&a, "PE 0", &o, &crate::machine::tests::sample());
        assert_eq!((j["checked"].as_bool(), j["coordinates_bit_exact"].as_bool()), (Some(true), Some(true)));
    }
}
