//! `halo demo`: what halo does on the GPUs present, in about 20 s on one GPU. The machine in three
//! lines; a few MD steps whose halos are checked against the CPU reference every step; `fused`
//! timed beside the baselines on a small system (every row checked before and after its timing,
//! as `halo bench` does); then the commands of the full benchmarks. Each phase says how long it
//! took; a spinner shows progress on a terminal.

use super::verify::{StepArgs, VerifyArgs};
use crate::bench::runner::{self, BenchConfig};
use crate::bench::{HaloSource, Method, report::BenchReport};
use crate::machine::MachineInfo;
use anyhow::{Context, Result, bail};
use halo::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use halo::decomp::RankGrid;
use halo::exchange::Placement;
use halo::exchange::pe::PathPolicy;
use halo::gpu::{self, KernelModule};
use halo_md::MdConfig;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Atoms of the checked MD steps.
    #[arg(long, default_value_t = 6000)]
    pub md_atoms: usize,
    /// MD steps, every one checked against the CPU reference (coordinates bit-exact, forces
    /// against the undecomposed system).
    #[arg(long, default_value_t = 10)]
    pub md_steps: u64,
    /// Atoms of the system whose halos are timed with each transport.
    #[arg(long, default_value_t = 45_000)]
    pub atoms: usize,
    /// Timed repeats per transport (median and range shown).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Steps per timed loop.
    #[arg(long, default_value_t = 100)]
    pub steps: usize,
}

/// The transports the demo times: the GPU-initiated `fused` and the baselines a one-process run
/// can use (NCCL only where it initialises: one rank per GPU).
pub const DEMO_METHODS: [Method; 4] = [Method::Fused, Method::DirectCopy, Method::Staged, Method::Nccl];

/// Everything the demo runs.
#[derive(Clone, Debug)]
pub struct DemoPlan {
    /// The checked MD steps.
    pub md: MdConfig,
    /// The timed exchange.
    pub bench: BenchConfig,
}

impl DemoArgs {
    /// The demo's runs: two ranks (2x1x1) over the GPUs present, in this process.
    pub fn plan(&self) -> DemoPlan {
        let grid = RankGrid { dims: [2, 1, 1] };
        // `halo verify`'s defaults, with fewer steps and a search every 5 (so one runs within them).
        let v = VerifyArgs {
            step: StepArgs { nstlist: 5, nstprune: 5, ..StepArgs::default() },
            steps: self.md_steps,
            ..VerifyArgs::new(self.md_atoms, grid)
        };
        let md = v.step.apply(MdConfig {
            steps: v.steps,
            seed: v.seed,
            transport: v.transport,
            check_every: v.check_every,
            ..MdConfig::new(v.atoms, v.ranks)
        });
        let bench = BenchConfig {
            atoms: vec![self.atoms],
            grid: grid.dims,
            methods: DEMO_METHODS.to_vec(),
            graph: false,
            repeats: self.repeats.max(1),
            warmup: 1,
            steps: self.steps.max(1),
            halos: HaloSource::Md,
            cutoff: 1.0,
            seed: 1,
            gpus: 0,
            wait_timeout: Duration::from_secs(5),
            progress: false,
            command: std::env::args().collect::<Vec<_>>().join(" "),
            nvshmem_lib: None,
            paths: PathPolicy::Routed,
        };
        DemoPlan { md, bench }
    }
}

/// `nvidia-smi topo -m` in a few words: the link between each pair of GPUs, counted by kind
/// (`NV18 x 28`), or why there is none to show.
pub fn topology_summary(topo: &str, gpus: usize) -> String {
    if topo.starts_with("absent") {
        return format!("topology {topo}");
    }
    if gpus < 2 {
        return "one GPU, no links between GPUs".into();
    }
    let mut header: Vec<&str> = Vec::new();
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for line in topo.lines() {
        let cells: Vec<&str> = line.split_whitespace().collect();
        if header.is_empty() {
            if cells.first().is_some_and(|c| c.starts_with("GPU")) && !line.starts_with("GPU") {
                header = cells;
            }
            continue;
        }
        let Some(row) = cells.first().and_then(|c| c.strip_prefix("GPU")).and_then(|n| n.parse::<usize>().ok()) else { continue };
        for (col, cell) in cells.iter().skip(1).enumerate() {
            let Some(other) = header.get(col).and_then(|h| h.strip_prefix("GPU")).and_then(|n| n.parse::<usize>().ok()) else { break };
            if other > row {
                match kinds.iter_mut().find(|(k, _)| k == cell) {
                    Some((_, n)) => *n += 1,
                    None => kinds.push(((*cell).to_string(), 1)),
                }
            }
        }
    }
    if kinds.is_empty() {
        return "links between GPUs not found in `nvidia-smi topo -m`".into();
    }
    let pairs: Vec<String> = kinds.iter().map(|(k, n)| if *n == 1 { k.clone() } else { format!("{k} x {n}") }).collect();
    format!("GPU-GPU links: {}", pairs.join(", "))
}

/// A version string without its library path: `2.28.9 (libnccl.so.2)` -> `2.28.9`.
fn short(v: &str) -> &str {
    if v.starts_with("absent") { v } else { v.split(" (").next().unwrap_or(v) }
}

/// The machine in three lines: GPUs, driver and CUDA, NCCL / NVSHMEM and the links.
pub fn machine_lines(m: &MachineInfo) -> [String; 3] {
    let mut names: Vec<(String, usize, f64)> = Vec::new();
    for g in &m.gpus {
        match names.iter_mut().find(|(n, ..)| *n == g.name) {
            Some((_, count, _)) => *count += 1,
            None => names.push((g.name.clone(), 1, g.memory_gib)),
        }
    }
    let gpus = if names.is_empty() {
        "no GPU".into()
    } else {
        names.iter().map(|(n, c, mem)| format!("{c} x {n} ({mem:.0} GiB)")).collect::<Vec<_>>().join(", ")
    };
    [
        format!("machine: {} on {}", gpus, m.hostname),
        format!("software: NVIDIA driver {}, CUDA {}, {}", m.nvidia_driver, m.cuda_driver, m.halo),
        format!("NCCL {}; NVSHMEM {}; {}", short(&m.nccl), short(&m.nvshmem), topology_summary(&m.topology, m.gpus.len())),
    ]
}

/// The timed rows as a short table: transport, step time, coordinate halo, and the check (or why a
/// transport did not run).
pub fn demo_table(r: &BenchReport) -> String {
    let mut lines = vec![format!("{:<12} {:>22} {:>22}  {}", "transport", "step us (med [min-max])", "coords us", "check")];
    for v in &r.results {
        let cells = if let Some(why) = &v.skipped {
            format!("{:>22} {:>22}  skipped: {why}", "-", "-")
        } else if v.is_result() {
            let cell = |s: &Option<crate::bench::stats::Summary>| s.as_ref().map_or_else(|| "-".into(), |s| s.cell(1));
            format!("{:>22} {:>22}  ok", cell(&v.step_us), cell(&v.coords_us))
        } else {
            format!("{:>22} {:>22}  {}", "-", "-", v.check.as_deref().unwrap_or("FAILED: not checked"))
        };
        lines.push(format!("{:<12} {cells}", v.variant));
    }
    lines.join("\n") + "\n"
}

fn spinner() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {elapsed:>3} {msg}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

pub fn run(args: DemoArgs) -> Result<()> {
    // First thing, before CUDA or the spinner start threads.
    super::bench::nccl_defaults();
    if let Some(reason) = gpu::gpu_unavailable_reason() {
        bail!(
            "halo demo needs an NVIDIA GPU of compute capability 9.0 (H100, H200; newer GPUs JIT the kernels) and a driver of R580 or newer, but {reason}"
        );
    }
    let start = Instant::now();
    let plan = args.plan();
    let bar = spinner();
    let say = |text: String| bar.suspend(|| println!("{text}"));

    bar.set_message("[1/3] the machine");
    let t = Instant::now();
    let machine = MachineInfo::collect(None);
    let artifacts = KernelArtifacts::locate(DEFAULT_ARCH)?;
    // The two ranks need at most two GPUs.
    let n = gpu::device_count().clamp(1, 2);
    let modules = (0..n).map(|i| Ok(Arc::new(KernelModule::load(&gpu::open_device(i)?, &artifacts)?))).collect::<Result<Vec<_>>>()?;
    for line in machine_lines(&machine) {
        say(line);
    }
    let t_machine = t.elapsed();

    let t = Instant::now();
    let (steps, atoms) = (plan.md.steps, plan.md.atoms);
    bar.set_message(format!("[2/3] {steps} MD steps of {atoms} atoms on 2 ranks, each checked against the CPU reference"));
    let placement = Placement::Local(modules.clone()).with_policy(plan.md.path_policy);
    let outcome = halo_md::run(&plan.md, &placement, |step, _| bar.set_message(format!("[2/3] MD step {}/{steps} checked", step + 1)))
        .context("the checked MD steps")?;
    if outcome.checked_steps == 0 {
        bail!("the MD steps ran but none was checked");
    }
    let t_md = t.elapsed();
    say(format!(
        "checked: {} MD steps of {atoms} atoms on 2 ranks ({}): coordinates after the halo bit-exact every step, forces off by at most {:.1e} of each atom's scale from the undecomposed CPU reference ({:.1} s)",
        outcome.checked_steps,
        plan.md.transport.name(),
        outcome.worst.force_max_rel,
        t_md.as_secs_f64()
    ));

    let t = Instant::now();
    bar.set_message(format!("[3/3] timing fused beside the baselines at {} atoms (2 ranks)", args.atoms));
    let report = runner::run(&plan.bench).context("timing the transports")?.context("no report in one process")?;
    let t_bench = t.elapsed();
    bar.finish_and_clear();
    println!(
        "halo exchange per step at {} atoms, 2 ranks on {} GPU(s), {} x {} steps, GPU timeline; every row checked before and after its timing ({:.1} s):",
        args.atoms,
        report.gpus.len(),
        report.repeats,
        report.steps,
        t_bench.as_secs_f64()
    );
    print!("{}", demo_table(&report));
    println!("full benchmark with the hardware floor, JSON, CSV and plot: halo bench --json bench.json --csv bench.csv --plot bench.png");
    println!("the whole MD step per transport: halo md-bench; one rank per GPU: halo launch -n 2 -- bench");
    println!(
        "demo: {:.1} s (machine and kernels {:.1} s, checked MD steps {:.1} s, timings {:.1} s)",
        start.elapsed().as_secs_f64(),
        t_machine.as_secs_f64(),
        t_md.as_secs_f64(),
        t_bench.as_secs_f64()
    );
    let failed = crate::bench::report::failures(&report);
    if !failed.is_empty() {
        bail!("{} row(s) failed their checks: {}", failed.len(), failed.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: DemoArgs,
    }

    /// The demo's plan stays small: a few checked MD steps on a small system and a short timing
    /// of fused beside the baselines, on two ranks.
    #[test]
    fn the_plan_is_small_and_every_md_step_is_checked() {
        let p = Cli::try_parse_from(["demo"]).unwrap().args.plan();
        assert!(p.md.steps <= 20 && p.md.atoms <= 10_000, "{:?}", p.md);
        assert_eq!(p.md.check_every, 1);
        assert_eq!(p.md.grid.dims, [2, 1, 1]);
        assert_eq!((p.md.nstlist, p.md.nstprune, p.md.transport), (5, 5, halo::exchange::Transport::Fused));
        assert_eq!(p.bench.atoms, vec![45_000]);
        assert_eq!(p.bench.methods, DEMO_METHODS.to_vec());
        assert_eq!(p.bench.methods[0], Method::Fused);
        assert!(!p.bench.graph);
        // Timed steps per transport: three loops (coordinates, forces, both) per repeat.
        let timed = 3 * (p.bench.warmup + p.bench.repeats) * p.bench.steps;
        assert!(timed <= 2000, "{timed} timed steps per transport");
        let p = Cli::try_parse_from(["demo", "--md-steps", "4", "--repeats", "0"]).unwrap().args.plan();
        assert_eq!((p.md.steps, p.bench.repeats), (4, 1));
    }

    #[test]
    fn the_machine_fits_in_three_lines() {
        let mut m = crate::machine::tests::sample();
        m.topology = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV18\t0-47\t0\nGPU1\tNV18\t X \t0-47\t0\n\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks".into();
        m.gpus.push(crate::machine::GpuInfo { ordinal: 1, ..m.gpus[0].clone() });
        let [a, b, c] = machine_lines(&m);
        assert_eq!(a, "machine: 2 x NVIDIA H200 (140 GiB) on h200-1");
        assert_eq!(b, "software: NVIDIA driver 580.159.04, CUDA 13.0, halo 0.1.0");
        assert_eq!(c, "NCCL 2.28.9; NVSHMEM 3.4.5; GPU-GPU links: NV18");
        for line in [&a, &b, &c] {
            assert!(!line.contains('\n') && !line.contains("Legend"), "{line}");
        }
        // One GPU: no links; no nvidia-smi: why.
        let one = crate::machine::tests::sample();
        assert!(machine_lines(&one)[2].ends_with("one GPU, no links between GPUs"), "{:?}", machine_lines(&one));
        assert_eq!(topology_summary("absent: nvidia-smi could not be started", 2), "topology absent: nvidia-smi could not be started");
    }

    #[test]
    fn links_are_counted_by_kind_over_pairs() {
        let topo = "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\nGPU0\t X \tNV18\tNV18\tSYS\t0-47\nGPU1\tNV18\t X \tNV18\tSYS\t0-47\nGPU2\tNV18\tNV18\t X \tSYS\t48-95\nGPU3\tSYS\tSYS\tSYS\t X \t48-95\n\nLegend:\n  X = Self";
        assert_eq!(topology_summary(topo, 4), "GPU-GPU links: NV18 x 3, SYS x 3");
    }

    #[test]
    fn the_table_shows_times_only_for_checked_rows() {
        let mut r = crate::bench::report::tests::sample_report();
        r.results.truncate(3);
        r.results[0].checked = false;
        r.results[0].check = Some("FAILED: checked step after the timed loops: rank 1: force of atom 4".into());
        let t = demo_table(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[1].starts_with("staged") && lines[1].contains("FAILED: checked step after") && !lines[1].contains("40.0"), "{t}");
        assert!(lines[2].starts_with("fused") && lines[2].contains("8.0 [7.2-9.6]") && lines[2].ends_with("ok"), "{t}");
    }

    /// The help says what the command does now, with no history in it.
    #[test]
    fn the_help_has_no_history() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        for bad in ["run 1", "run 2", "run 3", "run 4", "run 5", "run 6", "run 7", "run 8", "run 9", "issue ", "GPU run"] {
            assert!(!help.contains(bad), "{bad} in {help}");
        }
    }
}
