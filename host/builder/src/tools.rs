//! The external tools the build drives, and where they come from when they are missing:
//! the pinned nightly (rustup), its LLVM tools, NVSHMEM's device bitcode and `ptxas` (pinned
//! PyPI wheels installed under the cache's `toolchains/`).

use crate::{BuildError, IoContext, Result};
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

/// Runs `cmd`, failing with `what` and the exit status when it fails.
pub fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().map_err(|source| BuildError::Start { what: format!("{what} ({cmd:?})"), source })?;
    if !status.success() {
        return Err(BuildError::Failed { what: what.into(), status, output: String::new() });
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout, failing with stderr when it fails.
pub fn output(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().map_err(|source| BuildError::Start { what: format!("{what} ({cmd:?})"), source })?;
    if !out.status.success() {
        return Err(BuildError::Failed { what: what.into(), status: out.status, output: String::from_utf8_lossy(&out.stderr).into_owned() });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The pinned nightly: its sysroot, with `cargo`, `rustc`, `rust-src` and the LLVM tools.
pub struct Nightly {
    /// `rustc --print sysroot` of the toolchain.
    pub sysroot: PathBuf,
    /// The target triple the toolchain runs on (`host:` of its `rustc -vV`), e.g.
    /// `x86_64-unknown-linux-gnu`, or `aarch64-unknown-linux-gnu` on a Grace Hopper node.
    pub host: String,
}

impl Nightly {
    /// The toolchain's own `cargo` (called directly, not through a rustup proxy, so that neither
    /// `RUSTUP_TOOLCHAIN` nor a `rust-toolchain` file can swap it).
    pub fn cargo(&self) -> PathBuf {
        self.sysroot.join("bin/cargo")
    }

    /// The toolchain's `rustc`.
    pub fn rustc(&self) -> PathBuf {
        self.sysroot.join("bin/rustc")
    }

    /// Where rustup's `llvm-tools` component puts `llvm-link`, `opt` and `llc`: under the host
    /// triple of the machine the toolchain runs on.
    pub fn llvm_bin(&self) -> PathBuf {
        self.sysroot.join("lib/rustlib").join(&self.host).join("bin")
    }

    fn complete(&self) -> bool {
        self.cargo().exists() && self.llvm_bin().join("llc").exists() && self.sysroot.join("lib/rustlib/src/rust/library/core").exists()
    }
}

/// The `host:` line of `rustc -vV`: the target triple the compiler runs on.
pub fn host_triple(verbose_version: &str) -> Option<&str> {
    verbose_version.lines().find_map(|l| l.strip_prefix("host:")).map(str::trim).filter(|h| !h.is_empty())
}

/// `rustup`: on the PATH, else in `CARGO_HOME/bin` or `~/.cargo/bin` (a build script may run with
/// a PATH that lacks it).
fn rustup() -> Result<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join("rustup")).find(|p| p.is_file()));
    let homes = [std::env::var_os("CARGO_HOME").map(PathBuf::from), std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo"))];
    on_path.or_else(|| homes.into_iter().flatten().map(|h| h.join("bin/rustup")).find(|p| p.is_file())).ok_or_else(|| BuildError::Missing {
        what: "rustup".into(),
        hint: format!(
            "the kernels need the pinned {NIGHTLY} with rust-src and llvm-tools, which the build installs through rustup (https://rustup.rs)"
        ),
    })
}

/// Makes sure the pinned nightly with `rust-src` and `llvm-tools` is installed (rustup's
/// auto-install is off on some machines) and returns it.
pub fn ensure_nightly() -> Result<Nightly> {
    let rustup = rustup()?;
    let sysroot = |quiet: bool| -> Result<Nightly> {
        let mut cmd = Command::new(&rustup);
        cmd.args(["run", NIGHTLY, "rustc", "--print", "sysroot"]).env("RUSTUP_AUTO_INSTALL", "0").env_remove("RUSTUP_TOOLCHAIN");
        if quiet {
            cmd.stderr(std::process::Stdio::null());
        }
        let sysroot = PathBuf::from(output(&mut cmd, "rustc --print sysroot")?.trim());
        let version = output(Command::new(sysroot.join("bin/rustc")).arg("-vV"), "rustc -vV")?;
        let host = host_triple(&version).ok_or_else(|| BuildError::Missing {
            what: format!("the host triple of {NIGHTLY}"),
            hint: format!("its `rustc -vV` printed no `host:` line:\n{version}"),
        })?;
        Ok(Nightly { sysroot, host: host.to_owned() })
    };
    if let Some(nightly) = sysroot(true).ok().filter(Nightly::complete) {
        return Ok(nightly);
    }
    eprintln!("halo-builder: installing {NIGHTLY} with rust-src and llvm-tools (once)");
    run(
        Command::new(&rustup)
            .args(["toolchain", "install", NIGHTLY, "--profile", "minimal", "-c", "rust-src", "-c", "llvm-tools"])
            .env_remove("RUSTUP_TOOLCHAIN"),
        "rustup toolchain install",
    )
    .map_err(|e| BuildError::Missing {
        what: format!("{NIGHTLY} (rust-src, llvm-tools)"),
        hint: format!("rustup could not install it ({e}); the first kernel build needs network access to the Rust release server"),
    })?;
    let nightly = sysroot(false)?;
    if !nightly.complete() {
        return Err(BuildError::Missing {
            what: format!("cargo, llc or rust-src of {NIGHTLY} under {}", nightly.sysroot.display()),
            hint: format!("run `rustup component add --toolchain {NIGHTLY} rust-src llvm-tools`"),
        });
    }
    Ok(nightly)
}

/// Installs a pinned wheel with pip into `<cache>/toolchains/<name>` once and returns that folder.
pub fn pip_install(cache: &Path, requirement: &str) -> Result<PathBuf> {
    let dir = cache.join("toolchains").join(requirement.replace("==", "-"));
    let marker = dir.join(".installed");
    if marker.exists() {
        return Ok(dir);
    }
    eprintln!("halo-builder: fetching {requirement} with pip (once)");
    std::fs::create_dir_all(&dir).at("creating", &dir)?;
    run(
        Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check", "--target"])
            .arg(&dir)
            .arg(requirement),
        &format!("pip install {requirement}"),
    )
    .map_err(|e| BuildError::Missing {
        what: requirement.into(),
        hint: format!(
            "{e}. The kernel build fetches it with python3's pip (network access the first time); \
             or set NVSHMEM_HOME to an NVSHMEM install / put ptxas on PATH"
        ),
    })?;
    std::fs::write(&marker, requirement).at("writing", &marker)?;
    Ok(dir)
}

/// `ptxas`: from `PTXAS`, `CUDA_HOME`/`CUDA_PATH`, the PATH, or the pinned nvcc wheel.
pub fn ptxas(cache: &Path) -> Result<PathBuf> {
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
    let on_path = std::env::var_os("PATH").and_then(|path| std::env::split_paths(&path).map(|d| d.join("ptxas")).find(|p| p.exists()));
    if let Some(p) = on_path {
        return Ok(p);
    }
    Ok(pip_install(cache, CUDA_NVCC_WHEEL)?.join("nvidia/cu13/bin/ptxas"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_llvm_tools_sit_under_the_toolchains_host_triple() {
        let vv = "rustc 1.97.0-nightly (abcdef 2026-05-19)\nbinary: rustc\ncommit-hash: abcdef\nhost: aarch64-unknown-linux-gnu\nrelease: 1.97.0-nightly\nLLVM version: 22.1.0\n";
        let host = host_triple(vv).expect("a host line");
        assert_eq!(host, "aarch64-unknown-linux-gnu");
        let nightly = Nightly { sysroot: PathBuf::from("/toolchains/nightly"), host: host.to_owned() };
        assert_eq!(nightly.llvm_bin(), Path::new("/toolchains/nightly/lib/rustlib/aarch64-unknown-linux-gnu/bin"));
        assert_eq!(host_triple("rustc 1.88.0\nhost:\n"), None);
        assert_eq!(host_triple("rustc 1.88.0\n"), None);
    }

    #[test]
    fn this_machines_rustc_reports_this_machines_architecture() {
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
        let vv = output(Command::new(rustc).arg("-vV"), "rustc -vV").expect("rustc -vV runs");
        let host = host_triple(&vv).expect("a host line");
        assert!(host.starts_with(std::env::consts::ARCH), "{host} on {}", std::env::consts::ARCH);
    }
}
