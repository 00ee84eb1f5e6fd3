//! halo-builder: the one Rust -> PTX pipeline of halo.
//!
//! [`build`] compiles the `kernels-gpu` crate of the halo checkout this builder belongs to into
//! `halo_kernels.<arch>.{ptx,cubin,ptxas.txt,manifest.json}` (see `docs/toolchain.md`):
//!
//! 1. `cargo build --target nvptx64-nvidia-cuda -Zbuild-std=core` with the pinned nightly (installed
//!    through rustup when missing) and `--emit=llvm-bc` leaves one bitcode file per crate;
//! 2. `llvm-link` joins them with NVSHMEM's `libnvshmem_device.bc` (a pinned wheel, fetched once);
//! 3. `opt` internalizes everything except the kernel entries, the ABI-version global and NVSHMEM's
//!    two module globals, then optimises;
//! 4. `llc` lowers to PTX; `ptxas` assembles a cubin and reports registers and spills.
//!
//! Two callers share it: `cargo xtask build-ptx` and the `halo` library's build script, which
//! embeds the result. Both find finished artifacts in one cache ([`cache_dir`]) keyed by a SHA-256
//! stamp over every input, so the kernels are built once per change, not once per caller. The
//! nested cargo runs with its own target directory and without the variables an outer cargo sets
//! for a build script, so it is safe to call from `build.rs`.

#![warn(missing_docs)]

mod artifacts;
mod ptx;
mod stamp;
mod tools;

pub use ptx::{Artifacts, Manifest, PtxOptions, build};
pub use tools::{CUDA_NVCC_WHEEL, NIGHTLY, NVSHMEM_VERSION, run};

use std::path::{Path, PathBuf};

/// Everything that can stop the pipeline, each naming what is missing or what failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A tool the pipeline needs is not there and could not be fetched.
    #[error("{what} is missing: {hint}")]
    Missing {
        /// The tool.
        what: String,
        /// Where it comes from, or how to provide it.
        hint: String,
    },
    /// A program could not be started.
    #[error("could not start {what}: {source}")]
    Start {
        /// The program and what it was for.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A program ran and failed.
    #[error("{what} failed ({status}){}", if output.is_empty() { String::new() } else { format!(":\n{output}") })]
    Failed {
        /// The step.
        what: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr (empty when it went to the terminal).
        output: String,
    },
    /// Reading or writing a file failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An option or an intermediate result makes no sense.
    #[error("{0}")]
    Invalid(String),
}

/// Results of the builder.
pub type Result<T, E = BuildError> = std::result::Result<T, E>;

/// Attaches a path to an I/O error.
pub(crate) trait IoContext<T> {
    fn at(self, what: &'static str, path: &Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, what: &'static str, path: &Path) -> Result<T> {
        self.map_err(|source| BuildError::Io { what, path: path.to_path_buf(), source })
    }
}

/// The halo checkout (workspace root) whose `kernels-gpu/` this builder compiles: the folder two
/// levels above this crate, in a clone, a path dependency or cargo's git checkout alike.
pub fn source_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().and_then(Path::parent).map_or_else(|| here.to_path_buf(), Path::to_path_buf)
}

/// Where built kernels (`halo-ptx/`), the nested nvptx build (`nvptx/`) and the fetched wheels
/// (`toolchains/`) are kept, shared by every build that uses this checkout:
///
/// 1. `HALO_CACHE_DIR` when set;
/// 2. else `target/` of the halo checkout, unless the checkout is cargo's own copy under
///    `CARGO_HOME` (a git or registry dependency) or cannot be written;
/// 3. else `$CARGO_HOME/halo-cache`, else `~/.cache/halo`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HALO_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let root = source_root();
    let cargo_home = cargo_home();
    let managed_by_cargo = cargo_home.as_ref().is_some_and(|h| root.starts_with(h));
    let in_checkout = root.join("target");
    if !managed_by_cargo && std::fs::create_dir_all(in_checkout.join("halo-ptx")).is_ok() {
        return in_checkout;
    }
    match cargo_home {
        Some(home) => home.join("halo-cache"),
        None => home_dir().unwrap_or_else(std::env::temp_dir).join(".cache/halo"),
    }
}

fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from)
}

fn cargo_home() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME").filter(|h| !h.is_empty()).map(PathBuf::from).or_else(|| home_dir().map(|h| h.join(".cargo")))
}

/// The environment variables that tell a build script about the *outer* build (or steer a
/// toolchain) and must not reach the nested nvptx cargo. Cargo's registry, network and terminal
/// settings (`CARGO_HOME`, `CARGO_NET_*`, `CARGO_HTTP_*`, `CARGO_REGISTR*`, `CARGO_TERM_*`) and
/// the jobserver (`CARGO_MAKEFLAGS`, so the nested build shares the outer build's job slots) pass.
pub fn leaks_into_nested_cargo(name: &str) -> bool {
    const KEEP: [&str; 7] = ["CARGO_HOME", "CARGO_NET_", "CARGO_HTTP_", "CARGO_REGISTR", "CARGO_TERM_", "CARGO_MAKEFLAGS", "CARGO_LOG"];
    const DROP: [&str; 19] = [
        "RUSTFLAGS",
        "RUSTDOCFLAGS",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_LINKER",
        "RUSTC_BOOTSTRAP",
        "RUSTDOC",
        "RUSTUP_TOOLCHAIN",
        "RUSTUP_TOOLCHAIN_SOURCE",
        "TARGET",
        "HOST",
        "OUT_DIR",
        "OPT_LEVEL",
        "PROFILE",
        "DEBUG",
        "NUM_JOBS",
        "CARGO",
        "DOCS_RS",
    ];
    if DROP.contains(&name) || name.starts_with("__CARGO") {
        return true;
    }
    name.starts_with("CARGO_") && !KEEP.iter().any(|k| name.starts_with(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outer_build_does_not_leak_into_the_nested_one() {
        for leak in [
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTFLAGS",
            "RUSTC",
            "RUSTC_WRAPPER",
            "RUSTUP_TOOLCHAIN",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
            "CARGO_BUILD_RUSTFLAGS",
            "CARGO_PROFILE_RELEASE_LTO",
            "CARGO_CFG_TARGET_OS",
            "CARGO_FEATURE_STD",
            "CARGO_PKG_NAME",
            "CARGO_MANIFEST_DIR",
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER",
            "__CARGO_DEFAULT_LIB_METADATA",
            "OUT_DIR",
            "TARGET",
        ] {
            assert!(leaks_into_nested_cargo(leak), "{leak} must be cleared");
        }
        for keep in [
            "CARGO_HOME",
            "CARGO_NET_OFFLINE",
            "CARGO_HTTP_PROXY",
            "CARGO_REGISTRIES_CRATES_IO_PROTOCOL",
            "CARGO_MAKEFLAGS",
            "PATH",
            "HOME",
            "RUSTUP_HOME",
        ] {
            assert!(!leaks_into_nested_cargo(keep), "{keep} must pass");
        }
    }

    #[test]
    fn the_source_root_holds_the_kernels() {
        assert!(source_root().join("kernels-gpu/src/lib.rs").exists(), "{}", source_root().display());
    }
}
