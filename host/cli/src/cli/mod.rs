//! Command-line front end: one module per subcommand, errors reported with `anyhow` context.

mod bench;
mod calibrate;
mod demo;
mod verify;

pub use verify::StepArgs;
mod exchange_check;
mod info;
mod launch;
mod logging;
mod md_bench;
mod md_scaling;
mod perturb;
mod plan;
mod route;
mod selftest;
mod timeline;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// GPU-initiated halo exchange, all in Rust.
#[derive(Parser)]
#[command(name = "halo", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// GPUs, peer access, kernel artifacts and NVSHMEM as this process sees them.
    Info(info::InfoArgs),
    /// What halo does on the GPUs present, in about 20 s: a few MD steps checked against the CPU
    /// reference, then `fused` timed beside the baselines (what `cargo xtask demo` starts).
    Demo(demo::DemoArgs),
    /// Run the halo exchange alone on synthetic halos, checking every step against the CPU reference.
    ExchangeCheck(exchange_check::ExchangeCheckArgs),
    /// The mini-MD step on the GPUs, checked against the undecomposed CPU reference every step.
    Verify(verify::VerifyArgs),
    /// Start N ranks of a halo subcommand on this node, one per GPU: `halo launch -n 2 -- info`.
    Launch(launch::LaunchArgs),
    /// The halo plan of a synthetic system: per rank and pulse, sizes, offsets, neighbours (no GPU).
    Plan(plan::PlanArgs),
    /// The transport the router picks for every PE pair, with distance levels and scores.
    Route(route::RouteArgs),
    /// Measure every transport per distance level and message size; write the router's calibration file.
    Calibrate(calibrate::CalibrateArgs),
    /// Every halo transport side by side with the hardware floor.
    Bench(bench::BenchArgs),
    /// The pack and unpack-accumulate kernels alone at 1M atoms, beside device copy bandwidth.
    BenchKernels(bench::BenchKernelsArgs),
    /// Signal latency and per-transport halo times of `halo bench --json` reports, as one JSON (no GPU).
    BenchLatency(bench::BenchLatencyArgs),
    /// Where the time of the fused halo goes: stamped kernels, per-phase intervals, launch gaps.
    Timeline(timeline::TimelineArgs),
    /// ns/day of the whole MD step per transport and size, every step counted (searches included);
    /// every row checked against the CPU references outside its timed steps.
    MdBench(md_bench::MdBenchArgs),
    /// The strong-scaling table of the MD step in one JSON file: md-bench rows of 1 rank, 2 ranks in one
    /// process and 2 PEs (`halo launch -n 2`) on the GPUs present, with each 2-rank step over the 1-rank one.
    MdScaling(md_scaling::MdScalingArgs),
    /// Test-only rank for the launcher's tests (no GPU needed).
    #[command(hide = true)]
    SelftestChild(selftest::SelftestArgs),
    /// Writes docs/cli.md and docs/environment.md into DIR (what `cargo xtask docs` runs).
    #[command(hide = true)]
    WriteReference {
        /// The docs folder.
        dir: std::path::PathBuf,
    },
}

/// The whole command line interface as a clap [`clap::Command`] (every subcommand with its help),
/// for tools and tests that read the help text without running `halo`.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// `--transport` values: the exchange's transport names, listed in `--help` and in the error for
/// an unknown one.
fn transport_parser() -> impl clap::builder::TypedValueParser<Value = halo::exchange::Transport> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(halo::exchange::Transport::ALL.map(halo::exchange::Transport::name))
        .try_map(|s| s.parse::<halo::exchange::Transport>())
}

pub fn main() -> ExitCode {
    logging::init();
    crate::exit::install_hooks();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info(args) => info::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Verify(args) => verify::run(args),
        Command::ExchangeCheck(args) => exchange_check::run(args),
        Command::Route(args) => route::run(args),
        Command::Calibrate(args) => calibrate::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Bench(args) => bench::run(args),
        Command::BenchKernels(args) => bench::run_kernels(args),
        Command::BenchLatency(args) => bench::run_latency(args),
        Command::Timeline(args) => timeline::run(args),
        Command::MdBench(args) => md_bench::run(args),
        Command::MdScaling(args) => md_scaling::run(args),
        Command::WriteReference { dir } => crate::reference::write(&dir).map_err(anyhow::Error::from),
        // Both decide their own exit code (the worst rank's, or the one asked for).
        Command::Launch(args) => return launch::main(args),
        Command::SelftestChild(args) => return selftest::main(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A rank whose peers or GPU failed may block on its way out (NVSHMEM's or the driver's
        // teardown, a call left stuck on its thread, or an NVSHMEM proxy thread that is already
        // exiting): it ends within 2 s whatever happens, so that `halo launch` can stop the others;
        // with 86 when a deadline or a stuck stream caused the error.
        Err(e) => crate::exit::after_error(&e),
    }
}
