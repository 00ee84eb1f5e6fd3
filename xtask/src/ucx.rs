//! `cargo xtask fetch-ucx` (and `bundle --with-ucx`): the UCX libraries NVSHMEM's UCX transport
//! loads, for running the put path through NVSHMEM's proxy on one node (issue 19; see
//! `halo::launch::ucx` and docs/running.md, "Several nodes, emulated on one").
//!
//! pip installs the pinned wheel `libucx-cu13==1.22.0` (its sha256 checked by pip's hash mode)
//! into a scratch folder; only what NVSHMEM needs is kept in `target/ucx/`: `libucx/lib/*.so.0`,
//! `libucx/lib/ucx/*.so.0` without the perftest module, and `libucx_cu13.libs/`, with debug
//! information stripped when `strip` exists (about 7 MB instead of 147).

use anyhow::{Context, Result, bail};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned wheel.
pub const WHEEL: &str = "libucx-cu13==1.22.0";
/// Its sha256 (`libucx_cu13-1.22.0-py3-none-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl`).
pub const WHEEL_SHA256: &str = "c6e0aaa82dc6e49dc3ddaac465b530e014f48b6c1c6b5ae74fbdd199d824351b";

/// Whether a path inside the wheel is kept.
pub fn wanted(relative: &str) -> bool {
    let parts: Vec<&str> = relative.split('/').collect();
    match parts.as_slice() {
        ["libucx", "lib", file] => file.ends_with(".so.0"),
        ["libucx", "lib", "ucx", file] => file.ends_with(".so.0") && !file.contains("perftest"),
        ["libucx_cu13.libs", file] => !file.is_empty(),
        _ => false,
    }
}

/// `target/ucx/` with the libraries, fetched once (a stamp names the wheel and its hash).
pub fn fetch(root: &Path) -> Result<PathBuf> {
    let out = root.join("target/ucx");
    let stamp = out.join(".fetched");
    let want = format!("{WHEEL} sha256:{WHEEL_SHA256}");
    if fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(out);
    }
    let scratch = root.join("target/toolchains/ucx-wheel");
    let _ = fs::remove_dir_all(&scratch);
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&scratch)?;
    let requirements = scratch.join("requirements.txt");
    fs::write(&requirements, format!("{WHEEL} --hash=sha256:{WHEEL_SHA256}\n"))?;
    let install = scratch.join("site");
    eprintln!("xtask: fetching {WHEEL} with pip");
    // The target platform is spelled out, so the libraries are fetched for the GPU machines
    // (x86_64 Linux, glibc 2.28+) whatever this machine is.
    let status = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check", "--require-hashes", "--only-binary=:all:"])
        .args(["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "--target"])
        .arg(&install)
        .arg("-r")
        .arg(&requirements)
        .status()
        .context("running python3 -m pip")?;
    if !status.success() {
        bail!("pip could not install {WHEEL} (network access and python3 with pip are needed once)");
    }
    let mut kept = 0u64;
    for rel in files_under(&install)? {
        let text = rel.to_string_lossy().replace('\\', "/");
        if !wanted(&text) {
            continue;
        }
        let to = out.join(&rel);
        fs::create_dir_all(to.parent().unwrap_or(&out))?;
        let stripped = Command::new("strip").arg("--strip-debug").arg("-o").arg(&to).arg(install.join(&rel)).status().is_ok_and(|s| s.success());
        if !stripped {
            fs::copy(install.join(&rel), &to).with_context(|| format!("copying {text}"))?;
        }
        kept += fs::metadata(&to)?.len();
    }
    if !out.join("libucx/lib/libucp.so.0").exists() {
        bail!("{WHEEL} did not contain libucx/lib/libucp.so.0: is the pin right?");
    }
    fs::write(&stamp, want)?;
    let _ = fs::remove_dir_all(&scratch);
    eprintln!("xtask: UCX libraries in {} ({:.1} MiB)", out.display(), kept as f64 / (1 << 20) as f64);
    Ok(out)
}

/// Every file under `dir`, relative to it.
fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in fs::read_dir(dir.join(&rel)).with_context(|| format!("reading {}", dir.join(&rel).display()))? {
            let entry = entry?;
            let path = rel.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_libraries_nvshmem_loads_are_kept() {
        for keep in ["libucx/lib/libucp.so.0", "libucx/lib/ucx/libuct_cuda.so.0", "libucx_cu13.libs/libcudart-9f92e4c3.so.13.3.29"] {
            assert!(wanted(keep), "{keep}");
        }
        for drop in [
            "libucx/lib/libucp.so",
            "libucx/lib/libucp.so.0.0.0",
            "libucx/lib/ucx/libucx_perftest_cuda.so.0",
            "libucx/lib/ucx/libuct_cuda.so",
            "libucx/bin/ucx_info",
            "libucx_cu13-1.22.0.dist-info/RECORD",
            "libucx/include/ucp/api/ucp.h",
        ] {
            assert!(!wanted(drop), "{drop}");
        }
    }
}
