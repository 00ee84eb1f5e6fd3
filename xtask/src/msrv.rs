//! The workspace's declared `rust-version`, checked with that toolchain (installed through rustup
//! when missing), so that the number in Cargo.toml stays true.

use anyhow::{Context, Result, bail};
use std::path::Path;
use std::process::Command;

/// `rust-version` of `[workspace.package]` in the workspace manifest's text.
pub fn declared(manifest: &str) -> Result<String> {
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[workspace.package]";
        } else if in_package
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == "rust-version"
        {
            let version = value.trim().trim_matches('"');
            if version.is_empty() || !version.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) {
                bail!("rust-version = {} in [workspace.package] is not a Rust version such as \"1.88\"", value.trim());
            }
            return Ok(version.to_owned());
        }
    }
    bail!("the workspace Cargo.toml declares no rust-version in [workspace.package]")
}

/// Installs the declared toolchain (minimal profile) and checks every workspace target with it.
/// The kernels are not built (`HALO_SKIP_KERNEL_BUILD`: they need the pinned nightly whatever the
/// host toolchain), and the build goes to `target/msrv` so that it leaves the main build alone.
pub fn check(root: &Path) -> Result<()> {
    let manifest = root.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).with_context(|| format!("reading {}", manifest.display()))?;
    let version = declared(&text)?;
    halo_builder::run(
        Command::new("rustup").args(["toolchain", "install", &version, "--profile", "minimal"]).env_remove("RUSTUP_TOOLCHAIN"),
        &format!("rustup toolchain install {version}"),
    )?;
    halo_builder::run(
        Command::new("rustup")
            .args(["run", &version, "cargo", "check", "--workspace", "--all-targets", "--locked"])
            .current_dir(root)
            .env("CARGO_TARGET_DIR", root.join("target/msrv"))
            .env("HALO_SKIP_KERNEL_BUILD", "1")
            .env_remove("RUSTC")
            .env_remove("RUSTUP_TOOLCHAIN"),
        &format!("cargo check with Rust {version}, the declared rust-version"),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_workspace_rust_version() {
        let text = std::fs::read_to_string(crate::workspace_root().join("Cargo.toml")).expect("the workspace manifest");
        let v = declared(&text).expect("declared");
        let minor: u32 = v.split('.').nth(1).and_then(|m| m.parse().ok()).expect("1.N");
        // let-chains (edition 2024) are stable from 1.88, and the code uses them.
        assert!(v.starts_with("1.") && minor >= 88, "{v}");
    }

    /// The members of the workspace manifest's `members = [...]` line.
    fn members(manifest: &str) -> Vec<String> {
        let line = manifest.lines().find(|l| l.trim_start().starts_with("members")).expect("a members line");
        line.split('"').skip(1).step_by(2).map(str::to_owned).collect()
    }

    #[test]
    fn every_member_declares_the_workspace_rust_version() {
        // A member without the key declares no MSRV at all: cargo would build it with any Rust,
        // and a user of `halo` would see none on crates.io-style metadata.
        let root = crate::workspace_root();
        let text = std::fs::read_to_string(root.join("Cargo.toml")).expect("the workspace manifest");
        let members = members(&text);
        assert!(members.len() >= 8, "{members:?}");
        for m in members {
            let manifest = std::fs::read_to_string(root.join(&m).join("Cargo.toml")).unwrap_or_else(|e| panic!("{m}/Cargo.toml: {e}"));
            assert!(
                manifest.lines().any(|l| l.trim() == "rust-version.workspace = true"),
                "{m}/Cargo.toml: add `rust-version.workspace = true` under [package]"
            );
        }
    }

    #[test]
    fn only_the_workspace_package_table_counts() {
        let text = "[package]\nrust-version = \"1.60\"\n[workspace.package]\nedition = \"2024\"\nrust-version = \"1.88\"\n[x]\n";
        assert_eq!(declared(text).unwrap(), "1.88");
        assert!(declared("[workspace.package]\nedition = \"2024\"\n").unwrap_err().to_string().contains("declares no rust-version"));
        assert!(declared("[workspace.package]\nrust-version = \"stable\"\n").unwrap_err().to_string().contains("not a Rust version"));
    }
}
