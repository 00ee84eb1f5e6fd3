//! `cargo xtask bundle`: everything a GPU machine without Rust or network needs to run halo and its
//! GPU tests, in `target/bundle/`: `halo`, `stencil3d`, the downstream fixture `halo-downstream`,
//! the GPU test binaries in `tests/`, the kernels in `ptx/` (the binaries embed the same ones), and
//! `run-gpu-tests.sh`.

use crate::PtxArgs;
use anyhow::{Context, Result, bail};
use halo_builder::{Artifacts, run};
use std::fs;
use std::path::{Path, PathBuf};

/// The bundle travels to the GPU machines, whose copy limit is 64 MiB; stay well under it.
const MAX_BUNDLE_BYTES: u64 = 48 << 20;
/// Integration tests that need a GPU (each skips loudly without one, and fails instead when
/// `HALO_REQUIRE_GPU=1`, as run-gpu-tests.sh sets).
const GPU_TESTS: &[&str] = &["gpu_kernels", "gpu_exchange", "gpu_md", "gpu_nbnxm", "stencil3d_gpu", "gpu_multiprocess"];
/// The packages those tests belong to.
const GPU_TEST_PACKAGES: &[&str] = &["halo", "halo-md", "stencil3d", "halo-cli"];

pub fn assemble(ptx: &PtxArgs, artifacts: &Artifacts) -> Result<()> {
    let root = crate::workspace_root();
    let bundle = root.join("target/bundle");
    if bundle.exists() {
        fs::remove_dir_all(&bundle)?;
    }
    fs::create_dir_all(bundle.join("tests"))?;

    run(ptx.cargo().args(["build", "--release", "--locked", "-p", "halo-cli", "-p", "stencil3d"]), "cargo build --release")?;
    for bin in ["halo", "stencil3d"] {
        copy_stripped(&root.join("target/release").join(bin), &bundle.join(bin))?;
    }
    copy_stripped(&crate::build_downstream(ptx, true)?, &bundle.join("halo-downstream"))?;
    artifacts.copy_to(&bundle.join("ptx"))?;
    for (name, exe) in test_executables(ptx, &root)? {
        copy_stripped(&exe, &bundle.join("tests").join(&name))?;
    }
    let script = bundle.join("run-gpu-tests.sh");
    fs::write(&script, RUN_GPU_TESTS)?;
    set_executable(&script)?;

    let size = dir_size(&bundle)?;
    if size > MAX_BUNDLE_BYTES {
        bail!("the bundle is {} MiB, over the {} MiB budget", size >> 20, MAX_BUNDLE_BYTES >> 20);
    }
    eprintln!("xtask: bundle ready in {} ({:.1} MiB)", bundle.display(), size as f64 / (1 << 20) as f64);
    Ok(())
}

/// Builds the GPU test binaries in release mode and returns (test name, executable).
fn test_executables(ptx: &PtxArgs, root: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut cmd = ptx.cargo();
    cmd.args(["test", "--release", "--locked", "--no-run", "--message-format=json-render-diagnostics"]);
    for p in GPU_TEST_PACKAGES {
        cmd.args(["-p", p]);
    }
    for t in GPU_TESTS {
        cmd.args(["--test", t]);
    }
    let out = cmd.stderr(std::process::Stdio::inherit()).output().context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the GPU tests failed");
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let name = msg["target"]["name"].as_str().unwrap_or_default();
        if msg["reason"] == "compiler-artifact" && GPU_TESTS.contains(&name) {
            if let Some(exe) = msg["executable"].as_str() {
                found.push((name.to_string(), PathBuf::from(exe)));
            }
        }
    }
    if found.len() != GPU_TESTS.len() {
        bail!("expected test executables {GPU_TESTS:?} under {}, found {found:?}", root.display());
    }
    Ok(found)
}

/// Copies a binary without its debug sections (`strip` when available, a plain copy otherwise).
fn copy_stripped(from: &Path, to: &Path) -> Result<()> {
    let stripped = std::process::Command::new("strip").arg("-o").arg(to).arg(from).status().map(|s| s.success()).unwrap_or(false);
    if !stripped {
        fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    }
    set_executable(to)
}

fn set_executable(p: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        total += if entry.file_type()?.is_dir() { dir_size(&entry.path())? } else { entry.metadata()?.len() };
    }
    Ok(total)
}

const RUN_GPU_TESTS: &str = r#"#!/usr/bin/env bash
# Runs halo's GPU tests from this bundle: no Rust toolchain or network needed, only the NVIDIA driver.
# A GPU test that finds no GPU fails here (HALO_REQUIRE_GPU=1) instead of skipping. Every binary
# uses the kernels embedded in it: HALO_PTX_DIR is unset (ptx/ holds the same kernels, for
# `HALO_PTX_DIR=ptx ./halo ...` and for reading).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
unset HALO_PTX_DIR
export HALO_REQUIRE_GPU=1
# The multi-process tests start this bundle's `halo` (halo launch -n 2 -- exchange-check ...).
export HALO_BIN="$here/halo"
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
status=0
echo "== halo-downstream (a crate outside the workspace: plain cargo build, embedded kernels)"
"$here/halo-downstream" || status=1
for t in "$here"/tests/*; do
    echo "== $(basename "$t")"
    "$t" --test-threads=1 "$@" || status=1
done
exit $status
"#;
