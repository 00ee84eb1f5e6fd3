//! `halo launch -n N [--gpus 0,1] [--kill-grace-secs S] [--exe PROGRAM] -- <subcommand and args>`:
//! N ranks on one node, of `halo` itself or of another program built on the halo library.

use crate::launch::{LaunchConfig, launch};
use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct LaunchArgs {
    /// Number of ranks (processes) to start, one per GPU.
    #[arg(short = 'n', long = "nranks", value_name = "N")]
    nranks: usize,
    /// GPU ordinals to use, assigned round-robin to the ranks [default: 0..N-1].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    gpus: Vec<usize>,
    /// Seconds a rank gets to exit after SIGTERM before SIGKILL, when the job is being stopped.
    #[arg(long, value_name = "S", default_value_t = 5.0)]
    kill_grace_secs: f64,
    /// Start even when the GPUs get different numbers of ranks (e.g. 3 ranks on 2 GPUs). NVSHMEM
    /// 3.4.5 never finishes its initialisation then, so this is refused by default.
    #[arg(long)]
    allow_uneven_gpus: bool,
    /// Run this program's ranks instead of `halo`'s: an application built on the halo library
    /// (e.g. `stencil3d`); it finds its rank with `halo::launch::RankEnv::from_env`.
    #[arg(long, value_name = "PROGRAM")]
    exe: Option<std::path::PathBuf>,
    /// The halo subcommand each rank runs, with its arguments (after `--`); with --exe, the
    /// program's arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required_unless_present = "exe", value_name = "COMMAND")]
    command: Vec<OsString>,
}

/// Runs the launch; the exit code is the worst rank's (see `LaunchReport::exit_code`).
pub fn main(args: LaunchArgs) -> ExitCode {
    if !(args.kill_grace_secs.is_finite() && (0.0..=3600.0).contains(&args.kill_grace_secs)) {
        eprintln!("halo launch: error: --kill-grace-secs must be between 0 and 3600, not {}", args.kill_grace_secs);
        return ExitCode::from(2);
    }
    let config = match args.exe {
        Some(program) => Ok(LaunchConfig::program(args.nranks, program, args.command)),
        None => LaunchConfig::this_executable(args.nranks, args.command),
    };
    let mut config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("halo launch: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    config.gpus = args.gpus;
    config.allow_uneven_gpus = args.allow_uneven_gpus;
    config.kill_grace = Duration::from_secs_f64(args.kill_grace_secs);
    match launch(&config) {
        Ok(report) => {
            if let Some(summary) = report.summary() {
                eprintln!("halo launch: {summary}");
            }
            ExitCode::from(report.exit_code())
        }
        Err(e) => {
            eprintln!("halo launch: error: {e}");
            ExitCode::FAILURE
        }
    }
}
