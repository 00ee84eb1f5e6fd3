//! The `halo` command. See `halo --help` and docs/running.md.

fn main() -> std::process::ExitCode {
    halo_cli::cli::main()
}
