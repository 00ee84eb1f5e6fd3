//! The external tools the build drives, and where they come from when they are missing:
//! the pinned nightly (rustup), its LLVM tools, NVSHMEM's device bitcode and `ptxas` (pinned
//! PyPI wheels installed under `target/toolchains/`).

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The nightly that compiles the kernels (LLVM 22; has `gpu_launch_sized_workgroup_mem` and the
/// GPU jump-threading fix). Host crates use stable.
pub const NIGHTLY: &str = "nightly-2026-05-20";
/// NVSHMEM release whose device bitcode is linked in; must match the host library at run time
/// (same major, device minor <= host minor). 3.4.5 is what the H200 machines run.
pub const NVSHMEM_VERSION: &str = "3.4.5";
/// The PyPI wheel carrying `ptxas` when no CUDA toolkit is installed (same build as the GPU
/// machines' nvcc 13.0.88).
pub const CUDA_NVCC_WHEEL: &str = "nvidia-cuda-nvcc==13.0.88";

/// `cargo` for host builds: the same cargo (and toolchain) that runs the xtask. The
/// `RUSTUP_TOOLCHAIN` that rustup set for us is kept on purpose: without it, rustc invoked inside a
/// dependency's folder obeys that crate's own `rust-toolchain` file (jpeg-decoder ships one
/// pinning 1.61.0) and fails on machines that lack that toolchain.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(crate::workspace_root());
    cmd
}

/// Runs `cmd`, failing with `what` and the exit status when it fails.
pub fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("could not start {what}: {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout, failing with stderr when it fails.
pub fn output(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().with_context(|| format!("could not start {what}: {cmd:?}"))?;
    if !out.status.success() {
        bail!("{what} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Makes sure the pinned nightly with `rust-src` and `llvm-tools` is installed (rustup's
/// auto-install is off on some machines) and returns its sysroot.
pub fn ensure_nightly() -> Result<PathBuf> {
    let sysroot = |quiet: bool| -> Result<PathBuf> {
        let mut cmd = Command::new("rustc");
        cmd.args([&format!("+{NIGHTLY}"), "--print", "sysroot"]).env("RUSTUP_AUTO_INSTALL", "0");
        if quiet {
            cmd.stderr(std::process::Stdio::null());
        }
        Ok(PathBuf::from(output(&mut cmd, "rustc --print sysroot")?.trim()))
    };
    let complete = |root: &Path| llvm_bin(root).join("llc").exists() && root.join("lib/rustlib/src/rust/library/core").exists();
    if let Ok(root) = sysroot(true) {
        if complete(&root) {
            return Ok(root);
        }
    }
    eprintln!("xtask: installing {NIGHTLY} with rust-src and llvm-tools (once)");
    run(
        Command::new("rustup").args(["toolchain", "install", NIGHTLY, "--profile", "minimal", "-c", "rust-src", "-c", "llvm-tools"]),
        "rustup toolchain install",
    )
    .context("the PTX build needs rustup (https://rustup.rs) and network access to the Rust release server")?;
    let root = sysroot(false)?;
    if !complete(&root) {
        bail!("{NIGHTLY} is installed but lacks llc or rust-src under {}", root.display());
    }
    Ok(root)
}

/// Where rustup's `llvm-tools` component puts `llvm-link`, `opt` and `llc`.
pub fn llvm_bin(sysroot: &Path) -> PathBuf {
    sysroot.join("lib/rustlib/x86_64-unknown-linux-gnu/bin")
}

/// Installs a pinned wheel with pip into `target/toolchains/<name>` once and returns that folder.
pub fn pip_install(requirement: &str) -> Result<PathBuf> {
    let dir = crate::workspace_root().join("target/toolchains").join(requirement.replace("==", "-"));
    let marker = dir.join(".installed");
    if marker.exists() {
        return Ok(dir);
    }
    eprintln!("xtask: fetching {requirement} with pip (once)");
    std::fs::create_dir_all(&dir)?;
    run(
        Command::new("python3").args(["-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check", "--target"]).arg(&dir).arg(requirement),
        &format!("pip install {requirement}"),
    )
    .context("the PTX build needs python3 with pip to fetch NVSHMEM's bitcode and ptxas (or set NVSHMEM_HOME / put ptxas on PATH)")?;
    std::fs::write(&marker, requirement)?;
    Ok(dir)
}

/// `ptxas`: from `PTXAS`, `CUDA_HOME`/`CUDA_PATH`, the PATH, or the pinned nvcc wheel.
pub fn ptxas() -> Result<PathBuf> {
    if let Ok(p) = std::env::var("PTXAS") {
        return Ok(PathBuf::from(p));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(home) = std::env::var(var) {
            let p = Path::new(&home).join("bin/ptxas");
            if p.exists() {
                return Ok(p);
            }
        }
    }
    if let Ok(path) = std::env::var("PATH") {
        if let Some(p) = std::env::split_paths(&path).map(|d| d.join("ptxas")).find(|p| p.exists()) {
            return Ok(p);
        }
    }
    Ok(pip_install(CUDA_NVCC_WHEEL)?.join("nvidia/cu13/bin/ptxas"))
}
