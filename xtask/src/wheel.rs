//! Pinned PyPI wheels: fetched once with `pip download --no-deps --only-binary=:all:` for the GPU
//! machines' platform into a cache folder, checked against their SHA-256 before anything is
//! unpacked, and unpacked with their file modes (the MPI process managers and libclang, the C API
//! check's CUDA runtime and CMake).

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The wheel `project==version` in `cache`, downloaded there with pip unless it already is, whose
/// SHA-256 must be `sha256`. `what` says in pip's error what the wheel is for.
pub fn download(cache: &Path, project: &str, version: &str, sha256: &str, what: &str) -> Result<PathBuf> {
    fs::create_dir_all(cache)?;
    let wheel = match find(cache, project, version) {
        Some(found) => found,
        None => {
            eprintln!("xtask: fetching {project}=={version} with pip (once)");
            let status = Command::new("python3")
                .args(["-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps", "--only-binary=:all:"])
                .args(["--python-version", "3.12", "--implementation", "cp"])
                .args(["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux_2_17_x86_64"])
                .args(["--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64", "-d"])
                .arg(cache)
                .arg(format!("{project}=={version}"))
                .status()
                .with_context(|| format!("starting python3 -m pip ({what})"))?;
            if !status.success() {
                bail!("pip download {project}=={version} failed ({status}); it needs network access to PyPI the first time");
            }
            find(cache, project, version).with_context(|| format!("pip left no {project}-{version} wheel in {}", cache.display()))?
        }
    };
    let got = sha256_of(&wheel)?;
    if got != sha256 {
        bail!("{} has SHA-256 {got}, but {project}=={version} is pinned to {sha256}: refusing to unpack it", wheel.display());
    }
    Ok(wheel)
}

/// The downloaded wheel of `project==version` in `dir` (its file name spells `-` as `_`).
fn find(dir: &Path, project: &str, version: &str) -> Option<PathBuf> {
    let prefix = format!("{}-{version}-", project.replace('-', "_"));
    fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".whl")))
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
