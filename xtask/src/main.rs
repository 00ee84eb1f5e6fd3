//! `cargo xtask <task>`: the build steps cargo alone cannot express.
//!
//! - `build-ptx`: Rust kernels -> LLVM bitcode -> linked with NVSHMEM's device bitcode -> PTX and a
//!   cubin, incrementally (see `docs/toolchain.md`).
//! - `test`: everything CI runs (the PTX build, then the workspace tests).
//! - `demo`: builds what is stale and runs the default halo run on the GPUs present.
//! - `bundle`: a folder that runs the GPU tests on a machine with no Rust toolchain and no network.

mod bundle;
mod ptx;
mod tools;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "halo's build tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Compile kernels-gpu to PTX (linked with NVSHMEM's device bitcode) and a cubin.
    BuildPtx(ptx::PtxOptions),
    /// Build the PTX, then run every workspace test (what CI runs).
    Test {
        #[command(flatten)]
        ptx: ptx::PtxOptions,
    },
    /// Build what is stale and run the default halo run on the available GPUs.
    Demo {
        #[command(flatten)]
        ptx: ptx::PtxOptions,
    },
    /// Assemble target/bundle/: release `halo`, PTX/cubin, GPU test binaries, run-gpu-tests.sh.
    Bundle {
        #[command(flatten)]
        ptx: ptx::PtxOptions,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::BuildPtx(opts) => {
            ptx::build(&opts)?;
        }
        Task::Test { ptx: opts } => {
            let artifacts = ptx::build(&opts)?;
            tools::run(
                tools::cargo().args(["test", "--workspace", "--locked"]).env("HALO_PTX_DIR", &artifacts.dir),
                "cargo test --workspace",
            )?;
            tools::run(
                tools::cargo()
                    .args(["doc", "--workspace", "--no-deps", "--locked"])
                    .env("RUSTDOCFLAGS", "-D warnings"),
                "cargo doc (warnings are errors)",
            )?;
        }
        Task::Demo { ptx: opts } => {
            let artifacts = ptx::build(&opts)?;
            tools::run(tools::cargo().args(["build", "--release", "--locked", "-p", "halo"]), "cargo build --release")?;
            let halo = workspace_root().join("target/release/halo");
            tools::run(
                std::process::Command::new(halo).arg("demo").env("HALO_PTX_DIR", &artifacts.dir),
                "halo demo",
            )?;
        }
        Task::Bundle { ptx: opts } => {
            let artifacts = ptx::build(&opts)?;
            bundle::assemble(&artifacts)?;
        }
    }
    Ok(())
}

/// The workspace root (the xtask crate lives one level below it).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits inside the workspace").to_path_buf()
}
