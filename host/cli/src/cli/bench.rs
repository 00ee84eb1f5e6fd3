//! `halo bench` and `halo bench-kernels`: the transports side by side with the hardware floor,
//! and the pack/unpack kernels alone. In one process, or under `halo launch -n 2 -- bench`
//! (rank 0 prints; every rank must get the same options).

use crate::bench::runner::{self, BenchConfig};
use crate::bench::{self, HaloSource, Method, kernels, plot, report};
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::Duration;

/// The parsed `--transport` list (one value holding many, so clap does not split it itself).
#[derive(Clone, Debug, PartialEq)]
pub struct MethodList(pub Vec<Method>);

pub fn parse_method_list(s: &str) -> Result<MethodList, String> {
    bench::parse_methods(s).map(MethodList)
}

/// The options `halo bench` and `halo timeline` share: which halos, on which GPUs, how long a
/// device wait may take.
#[derive(clap::Args, Debug)]
pub struct HaloArgs {
    /// Halos from the real decomposition (md) or random ones sized like it (synthetic).
    #[arg(long, value_enum, default_value = "md")]
    pub halos: HaloSource,
    /// Cutoff of the decomposition (nm).
    #[arg(long, default_value_t = 1.0)]
    pub cutoff: f32,
    /// Seed of the system or synthetic halos.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// GPUs to spread the ranks over in one process (0: one per rank, as many as visible).
    #[arg(long, default_value_t = 0)]
    pub gpus: usize,
    /// Deadline of every device wait, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub wait_timeout_ms: u64,
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// System sizes in atoms, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "6000,45000,180000,1500000")]
    pub atoms: Vec<usize>,
    /// Rank grid: 2x1x1 (two GPUs) or 2x2x2 (eight ranks, e.g. on one GPU), or any AxBxC.
    #[arg(long, default_value = "2x1x1", value_parser = super::exchange_check::parse_grid)]
    pub ranks: [usize; 3],
    /// Transports, comma-separated (staged, direct-copy, nccl, per-pulse, per-pulse-direct, fused, fused-tma) or all.
    #[arg(long, default_value = "all", value_parser = parse_method_list)]
    pub transport: MethodList,
    /// Timed repeats (the table shows median and min-max; at least 5 recommended).
    #[arg(long, default_value_t = 7)]
    pub repeats: usize,
    /// Untimed warm-up repeats.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Steps per timed loop (graph variants: replays of the one captured step).
    #[arg(long, default_value_t = 200)]
    pub steps: usize,
    /// Also run every capturable transport (GPU-initiated ones and nccl) with the step captured as CUDA graphs.
    #[arg(long)]
    pub graph: bool,
    /// The halos, their placement on GPUs and the wait deadline.
    #[command(flatten)]
    pub halo: HaloArgs,
    /// Write the report as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the results as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write a PNG plot of step and coordinate-halo time against atom count.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// NVSHMEM host library to use (default: discovered).
    #[arg(long)]
    pub nvshmem_lib: Option<PathBuf>,
    /// Jitter and faults (tests only: they distort the times).
    #[command(flatten)]
    pub perturb: super::perturb::PerturbArgs,
    /// How pulses reach their peers across PEs: `routed` (the router's choice per peer and pulse,
    /// printed and written to the JSON's `routes`), `auto` (stores wherever mapped), `force-put`.
    /// In one process `auto` and `force-put` store directly to every peer.
    #[arg(long, default_value = "routed", value_parser = |s: &str| halo::exchange::PathPolicy::parse(s).map_err(|e| e.to_string()))]
    pub paths: halo::exchange::PathPolicy,
}

impl BenchArgs {
    fn config(&self) -> BenchConfig {
        BenchConfig {
            atoms: self.atoms.clone(),
            grid: self.ranks,
            methods: self.transport.0.clone(),
            graph: self.graph,
            repeats: self.repeats,
            warmup: self.warmup,
            steps: self.steps,
            halos: self.halo.halos,
            cutoff: self.halo.cutoff,
            seed: self.halo.seed,
            gpus: self.halo.gpus,
            wait_timeout: Duration::from_millis(self.halo.wait_timeout_ms),
            progress: !self.quiet,
            command: std::env::args().collect::<Vec<_>>().join(" "),
            nvshmem_lib: self.nvshmem_lib.clone(),
            paths: self.paths,
        }
    }
}

/// NCCL reads its settings when it initialises: NVLink multicast (NVLS) stays off on these
/// shared machines unless the user chose otherwise.
pub(super) fn nccl_defaults() {
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // SAFETY: called first thing in the subcommand, before this process starts any thread
        // (no CUDA, NVSHMEM or NCCL yet), so nothing reads the environment concurrently.
        unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    }
}

pub fn run(args: BenchArgs) -> Result<()> {
    nccl_defaults();
    args.perturb.install()?;
    if args.repeats < 5 {
        eprintln!("halo bench: note: {} repeats; the targets call for at least 5", args.repeats);
    }
    let Some(report) = runner::run(&args.config()).context("running the benchmark")? else {
        return Ok(()); // not rank 0
    };
    print!("{}", report::table(&report));
    if let Some(path) = &args.json {
        let text = report::json(&report).context("serialising the report")?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.csv {
        std::fs::write(path, report::csv(&report)).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.plot {
        plot::write_png(&report, path).with_context(|| format!("plotting to {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    verdict(&report)
}

/// The command's exit: an error naming every row that ran but is not a checked result.
fn verdict(report: &report::BenchReport) -> Result<()> {
    let failed = report::failures(report);
    if !failed.is_empty() {
        anyhow::bail!("{} row(s) failed their checks, so they have no times: {}", failed.len(), failed.join("; "));
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct BenchKernelsArgs {
    /// Map entries (atoms packed and unpacked).
    #[arg(long, default_value_t = 1 << 20)]
    pub atoms: usize,
    /// Atoms in the array the maps index.
    #[arg(long, default_value_t = 4 << 20)]
    pub array_atoms: usize,
    /// Timed launches per kernel and map (median and min-max reported).
    #[arg(long, default_value_t = 50)]
    pub repeats: usize,
    /// GPU to run on.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Seed of the random map.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub fn run_kernels(args: BenchKernelsArgs) -> Result<()> {
    let cfg = kernels::KernelBenchConfig {
        map_len: args.atoms,
        array_len: args.array_atoms,
        repeats: args.repeats.max(1),
        device: args.device,
        seed: args.seed,
    };
    let report = kernels::run(&cfg).context("running the kernel benchmark")?;
    print!("{}{}", report.machine.text(), kernels::table(&report));
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).context("serialising the report")?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct BenchLatencyArgs {
    /// `halo bench --json` reports (the first one's floor gives `signal_one_way_us`).
    #[arg(required = true)]
    pub reports: Vec<PathBuf>,
    /// Where to write the summary (JSON).
    #[arg(long, short)]
    pub out: PathBuf,
}

pub fn run_latency(args: BenchLatencyArgs) -> Result<()> {
    let reports = args
        .reports
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_str::<report::BenchReport>(&text).with_context(|| format!("{} is not a `halo bench --json` report", p.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let summary = bench::latency::summarise(&reports);
    let text = serde_json::to_string_pretty(&summary).context("serialising the summary")?;
    std::fs::write(&args.out, text).with_context(|| format!("writing {}", args.out.display()))?;
    println!("wrote {} ({} rows)", args.out.display(), summary.rows.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: Cmd,
    }

    #[derive(clap::Subcommand)]
    enum Cmd {
        Bench(Box<BenchArgs>),
        BenchKernels(BenchKernelsArgs),
    }

    fn bench(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        let cli = Cli::try_parse_from(["halo", "bench"].iter().chain(args))?;
        match cli.cmd {
            Cmd::Bench(b) => Ok(*b),
            Cmd::BenchKernels(_) => unreachable!("parsed as bench"),
        }
    }

    #[test]
    fn defaults_follow_issue_6() {
        let b = bench(&[]).unwrap();
        assert_eq!(b.atoms, vec![6000, 45000, 180000, 1500000]);
        assert_eq!(b.ranks, [2, 1, 1]);
        assert_eq!(b.transport.0, Method::ALL.to_vec());
        assert_eq!((b.repeats, b.warmup, b.steps, b.graph), (7, 3, 200, false));
        assert_eq!(b.halo.halos, HaloSource::Md);
    }

    #[test]
    fn options_parse() {
        let b = bench(&[
            "--atoms",
            "6000,45000",
            "--ranks",
            "2x2x2",
            "--transport",
            "fused,nccl",
            "--graph",
            "--repeats",
            "5",
            "--halos",
            "synthetic",
            "--json",
            "r.json",
            "--csv",
            "r.csv",
            "--plot",
            "p.png",
        ])
        .unwrap();
        assert_eq!(b.atoms, vec![6000, 45000]);
        assert_eq!(b.ranks, [2, 2, 2]);
        assert_eq!(b.transport.0, vec![Method::Fused, Method::Nccl]);
        assert!(b.graph);
        assert_eq!(b.halo.halos, HaloSource::Synthetic);
        assert_eq!(b.plot.as_deref(), Some(std::path::Path::new("p.png")));
        let c = b.config();
        assert_eq!(c.methods, vec![Method::Fused, Method::Nccl]);
        assert_eq!(c.repeats, 5);
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(bench(&["--ranks", "2x1"]).is_err());
        assert!(bench(&["--transport", "warp"]).unwrap_err().to_string().contains("unknown transport"));
        assert!(bench(&["--atoms", "many"]).is_err());
    }

    #[test]
    fn a_failed_row_fails_the_command() {
        let mut r = report::tests::sample_report();
        verdict(&r).unwrap();
        r.results[1].checked = false;
        r.results[1].check = Some("FAILED: coordinates after the timed loops: rank 0: coordinate of atom 2".into());
        let e = verdict(&r).unwrap_err().to_string();
        assert!(e.contains("fused at 6000 atoms") && e.contains("atom 2"), "{e}");
        // A row that ran with no check at all fails it too.
        let mut r = report::tests::sample_report();
        r.results[0].check = None;
        assert!(verdict(&r).unwrap_err().to_string().contains("staged at 6000 atoms: FAILED: not checked"));
    }

    #[test]
    fn bench_kernels_defaults() {
        let cli = Cli::try_parse_from(["halo", "bench-kernels"]).unwrap();
        let Cmd::BenchKernels(k) = cli.cmd else { panic!("bench-kernels") };
        assert_eq!((k.atoms, k.array_atoms), (1 << 20, 4 << 20));
    }
}
