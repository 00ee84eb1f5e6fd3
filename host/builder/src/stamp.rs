//! The input stamp: a SHA-256 digest of everything the PTX depends on, which names the artifacts'
//! folder in the cache.

use crate::ptx::file_name;
use crate::ptx::{PIPELINE_VERSION, PTX_ISA};
use crate::tools::NIGHTLY;
use crate::{BuildError, IoContext, Result};
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};

/// A digest of everything the PTX depends on: this pipeline, the toolchain, the architecture, the
/// NVSHMEM bitcode (version, name, size), the kernel crate's sources and manifest, the workspace's
/// `[workspace.package]` and `[profile]` tables, and the locked packages the kernel crate depends
/// on. Other crates' dependencies are left out, so adding one does not rebuild the kernels.
pub(crate) fn input_stamp(root: &Path, arch: &str, nvshmem_bc: &Path, nvshmem_version: &str) -> Result<String> {
    let mut h = Sha256::new();
    h.update(PIPELINE_VERSION);
    h.update(NIGHTLY);
    h.update(arch);
    h.update(PTX_ISA);
    let meta = fs::metadata(nvshmem_bc).at("reading", nvshmem_bc)?;
    h.update(nvshmem_version);
    h.update(file_name(nvshmem_bc));
    h.update(meta.len().to_le_bytes());
    let manifest = root.join("Cargo.toml");
    let workspace = read_toml(&manifest)?;
    for table in ["workspace.package", "profile"] {
        let value = table.split('.').try_fold(&workspace, |v, key| v.get(key));
        h.update(format!("{table}={}", value.map(toml::Value::to_string).unwrap_or_default()));
    }
    h.update(locked_dependencies(&read_toml(&root.join("Cargo.lock"))?, "kernels-gpu"));
    let mut files = vec![root.join("kernels-gpu/Cargo.toml")];
    collect_files(&root.join("kernels-gpu/src"), &mut files)?;
    files.sort();
    for f in files {
        h.update(f.strip_prefix(root).unwrap_or(&f).display().to_string());
        h.update(fs::read(&f).at("reading", &f)?);
    }
    Ok(format!("{:x}", h.finalize()))
}

fn read_toml(path: &Path) -> Result<toml::Value> {
    let text = fs::read_to_string(path).at("reading", path)?;
    text.parse().map_err(|e| BuildError::Invalid(format!("{}: {e}", path.display())))
}

/// `name version source checksum` of `package` and every package it depends on, transitively,
/// from a parsed `Cargo.lock`, one per line, sorted.
fn locked_dependencies(lock: &toml::Value, package: &str) -> String {
    let packages: Vec<&toml::Value> = lock.get("package").and_then(toml::Value::as_array).map(|a| a.iter().collect()).unwrap_or_default();
    let field = |p: &toml::Value, key: &str| p.get(key).and_then(toml::Value::as_str).unwrap_or_default().to_string();
    let mut seen: Vec<String> = Vec::new();
    let mut todo = vec![(package.to_string(), None::<String>)];
    while let Some((name, version)) = todo.pop() {
        for p in packages.iter().filter(|p| field(p, "name") == name && version.as_ref().is_none_or(|v| field(p, "version") == *v)) {
            let line = ["name", "version", "source", "checksum"].map(|k| field(p, k)).join(" ");
            if seen.contains(&line) {
                continue;
            }
            seen.push(line);
            // Each dependency is `name` or `name version` or `name version (source)`.
            for dep in p.get("dependencies").and_then(toml::Value::as_array).into_iter().flatten().filter_map(toml::Value::as_str) {
                let mut words = dep.split_whitespace();
                todo.push((words.next().unwrap_or_default().to_string(), words.next().map(str::to_string)));
            }
        }
    }
    seen.sort();
    seen.join("\n")
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).at("listing", dir)? {
        let path = entry.at("listing", dir)?.path();
        if path.is_dir() {
            collect_files(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_closure_follows_only_the_kernel_crates_dependencies() {
        let lock: toml::Value = r#"
            [[package]]
            name = "kernels-gpu"
            version = "0.1.0"
            dependencies = ["bytemuck"]

            [[package]]
            name = "bytemuck"
            version = "1.21.0"
            source = "registry+https://github.com/rust-lang/crates.io-index"
            checksum = "aa"
            dependencies = ["bytemuck_derive 1.8.0"]

            [[package]]
            name = "bytemuck_derive"
            version = "1.8.0"
            checksum = "bb"

            [[package]]
            name = "bytemuck_derive"
            version = "1.7.0"
            checksum = "cc"

            [[package]]
            name = "clap"
            version = "4.5.0"
            checksum = "dd"
        "#
        .parse()
        .unwrap();
        let closure = locked_dependencies(&lock, "kernels-gpu");
        assert!(closure.contains("bytemuck 1.21.0") && closure.contains("bytemuck_derive 1.8.0"), "{closure}");
        assert!(!closure.contains("1.7.0") && !closure.contains("clap"), "{closure}");
        assert_eq!(closure.lines().count(), 3);
    }

    #[test]
    fn the_stamp_of_this_checkout_is_stable() {
        let root = crate::source_root();
        let bc = root.join("kernels-gpu/Cargo.toml"); // any file stands in for the bitcode here
        let a = input_stamp(&root, "sm_90", &bc, "3.4.5").unwrap();
        assert_eq!(a, input_stamp(&root, "sm_90", &bc, "3.4.5").unwrap());
        assert_ne!(a, input_stamp(&root, "sm_100", &bc, "3.4.5").unwrap());
        assert_ne!(a, input_stamp(&root, "sm_90", &bc, "3.4.6").unwrap());
    }
}
