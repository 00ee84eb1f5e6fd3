//! The `halo` command. See `halo --help` and docs/running.md.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
