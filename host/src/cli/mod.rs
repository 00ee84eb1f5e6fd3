//! Command-line front end: one module per subcommand, errors reported with `anyhow` context.

mod demo;
mod info;

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
    /// The default run on the GPUs present (what `cargo xtask demo` starts).
    Demo(demo::DemoArgs),
}

pub fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("HALO_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info(args) => info::run(args),
        Command::Demo(args) => demo::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("halo: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
