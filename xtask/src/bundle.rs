//! `cargo xtask bundle`: everything a GPU machine without Rust or network needs to run halo and its
//! GPU tests, in `target/bundle/`: `halo`, `stencil3d`, the downstream fixture `halo-downstream`,
//! the GPU test binaries in `tests/`, the kernels in `ptx/` (the binaries embed the same ones),
//! `run-gpu-tests.sh`, with `--with-ucx` the UCX libraries in `ucx/`, and with `--mpi` MPICH's and
//! Open MPI's launchers in `mpi/` (outside the bundle's own budget, inside what travels). With
//! `--archive` it also writes `target/bundle.tar.xz` (the system `tar -cJf`), which is what travels
//! when the folder itself is too large: unpack it there with `tar -xJf bundle.tar.xz`.

use crate::PtxArgs;
use anyhow::{Context, Result, bail};
use halo_builder::{Artifacts, run};
use std::fs;
use std::path::{Path, PathBuf};

/// The bundle's own budget when the folder travels as it is. Every binary embeds the kernels (PTX
/// and cubin), so the folder is about 65 MiB now; the GPU machines' copy limit is 64 MiB, working
/// tree included, so a folder this large travels compressed (`--archive`: `tar -cJf`, about 6 MB).
const MAX_BUNDLE_BYTES: u64 = 64 << 20;
/// With `--mpi`, the MPI launchers' own budget on top (MPICH's launcher is 2 MiB, Open MPI's
/// launcher, libraries and data about 17 MiB); the whole must still travel.
const MAX_MPI_BYTES: u64 = 22 << 20;
/// The copy limit of the GPU machines, working tree included: what travels (the folder, or with
/// `--archive` the compressed archive) must stay under it.
const MAX_CARRIED_BYTES: u64 = 62 << 20;
/// Where `--archive` writes the compressed bundle (relative to the workspace root).
pub const ARCHIVE: &str = "target/bundle.tar.xz";
/// Integration tests that need a GPU (each skips loudly without one, and fails instead when
/// `HALO_REQUIRE_GPU=1`, as run-gpu-tests.sh sets).
const GPU_TESTS: &[&str] = &[
    "gpu_kernels",
    "gpu_exchange",
    "gpu_faults",
    "gpu_md",
    "gpu_nbnxm",
    "gpu_grid",
    "gpu_migrate",
    "gpu_merge",
    "gpu_redecompose",
    "gpu_select",
    "stencil3d_gpu",
    "gpu_pes",
    "gpu_multiprocess",
];
/// The packages those tests belong to.
const GPU_TEST_PACKAGES: &[&str] = &["halo", "halo-md", "stencil3d", "halo-cli"];

pub fn assemble(ptx: &PtxArgs, artifacts: &Artifacts, ucx: Option<&Path>, with_mpi: bool, archive: bool) -> Result<()> {
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
    if let Some(ucx) = ucx {
        copy_tree(ucx, &bundle.join("ucx"))?;
    }
    let script = bundle.join("run-gpu-tests.sh");
    fs::write(&script, RUN_GPU_TESTS)?;
    set_executable(&script)?;

    // The folder's own budget matters where the folder itself travels; an archive is held to the
    // copy limit by its compressed size below.
    let size = dir_size(&bundle)?;
    if size > MAX_BUNDLE_BYTES && !archive {
        bail!("the bundle is {} MiB, over the {} MiB budget: build it with `cargo xtask bundle --archive`", size >> 20, MAX_BUNDLE_BYTES >> 20);
    }
    let mut total = size;
    if with_mpi {
        let mpi = crate::mpi::copy_for_bundle(&bundle.join("mpi"))?;
        if mpi > MAX_MPI_BYTES {
            bail!("the MPI launchers take {} MiB, over their {} MiB budget", mpi >> 20, MAX_MPI_BYTES >> 20);
        }
        total += mpi;
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    if archive {
        let out = root.join(ARCHIVE);
        let packed = write_archive(&bundle, &out)?;
        if packed > MAX_CARRIED_BYTES {
            bail!("{} is {:.1} MiB: over the {} MiB that travel", out.display(), mib(packed), MAX_CARRIED_BYTES >> 20);
        }
        eprintln!("xtask: bundle ready in {} ({:.1} MiB), compressed in {} ({:.1} MiB)", bundle.display(), mib(total), out.display(), mib(packed));
    } else {
        if total > MAX_CARRIED_BYTES {
            bail!(
                "the bundle is {:.1} MiB in all, over the {} MiB that travel uncompressed: build it with `cargo xtask bundle --archive` and carry {ARCHIVE}",
                mib(total),
                MAX_CARRIED_BYTES >> 20
            );
        }
        eprintln!("xtask: bundle ready in {} ({:.1} MiB)", bundle.display(), mib(total));
    }
    Ok(())
}

/// Writes `bundle` (the folder) as an xz-compressed tar at `out` with the system `tar -cJf`, the
/// folder named `bundle` inside; returns the archive's size.
fn write_archive(bundle: &Path, out: &Path) -> Result<u64> {
    let (parent, name) = match (bundle.parent(), bundle.file_name()) {
        (Some(p), Some(n)) => (p, n),
        _ => bail!("{} has no parent folder to archive it from", bundle.display()),
    };
    if out.exists() {
        fs::remove_file(out).with_context(|| format!("removing the old {}", out.display()))?;
    }
    let mut tar = std::process::Command::new("tar");
    tar.arg("-cJf").arg(out).arg("-C").arg(parent).arg(name);
    let status = tar.status().context("running `tar` (install tar and xz, or build without --archive)")?;
    if !status.success() {
        bail!("`tar -cJf {}` failed ({status}): is xz installed?", out.display());
    }
    Ok(fs::metadata(out).with_context(|| format!("reading {}", out.display()))?.len())
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
        if msg["reason"] == "compiler-artifact"
            && GPU_TESTS.contains(&name)
            && let Some(exe) = msg["executable"].as_str()
        {
            found.push((name.to_string(), PathBuf::from(exe)));
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

/// Copies a file, or the files under a folder (not its dot-files: fetch stamps), to `to`, following
/// symbolic links and keeping modes; returns the bytes copied.
pub(crate) fn copy_tree(from: &Path, to: &Path) -> Result<u64> {
    let meta = fs::metadata(from).with_context(|| format!("reading {}", from.display()))?;
    if !meta.is_dir() {
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent)?;
        }
        return fs::copy(from, to).with_context(|| format!("copying {}", from.display()));
    }
    fs::create_dir_all(to)?;
    let mut total = 0;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        total += copy_tree(&entry.path(), &to.join(&name))?;
    }
    Ok(total)
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
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0
# The tests that launch ranks (gpu_pes, gpu_multiprocess: halo launch -n 2 -- ...) run this
# bundle's halo; the UCX ones need ucx/ (--with-ucx).
export HALO_BIN="$here/halo"
if [ -d "$here/ucx" ]; then export HALO_UCX_DIR="$here/ucx"; fi
status=0
echo "== halo-downstream (a crate outside the workspace: plain cargo build, embedded kernels)"
"$here/halo-downstream" || status=1
for t in "$here"/tests/*; do
    echo "== $(basename "$t")"
    "$t" --test-threads=1 "$@" || status=1
done
exit $status
"#;
