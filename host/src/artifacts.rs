//! Where the compiled kernels are, and whether they belong to this build.
//!
//! `cargo xtask build-ptx` writes `halo_kernels.<arch>.{ptx,cubin,ptxas.txt,manifest.json}` into
//! `target/ptx/`; `cargo xtask bundle` copies them next to the binary. The manifest records the ABI
//! version, the architecture and the NVSHMEM version linked in, so a stale or foreign module is
//! rejected with an error before any launch.

use crate::error::{HaloError, Result};
use kernels_gpu::abi;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The default architecture (H100/H200).
pub const DEFAULT_ARCH: &str = "sm_90";

/// What the PTX build recorded about a module.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    /// GPU architecture, e.g. `sm_90`.
    pub arch: String,
    /// [`abi::ABI_VERSION`] of the kernels crate the module was built from.
    pub abi_version: u32,
    /// NVSHMEM version whose device bitcode is linked in.
    pub nvshmem_version: String,
    /// Kernel entry points.
    pub entries: Vec<String>,
    /// PTX file name.
    pub ptx: String,
    /// cubin file name.
    pub cubin: String,
    /// ptxas report file name.
    pub ptxas_report: String,
}

/// A located, checked set of kernel artifacts.
#[derive(Debug, Clone)]
pub struct KernelArtifacts {
    /// The folder holding them.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

impl KernelArtifacts {
    /// Finds the artifacts for `arch`: in `HALO_PTX_DIR` when set, else in `ptx/` next to the
    /// executable (a bundle), else in the workspace's `target/ptx/`.
    pub fn locate(arch: &str) -> Result<Self> {
        let dir = search_dirs(arch).into_iter().next().unwrap_or_else(workspace_ptx_dir);
        Self::load(&dir, arch)
    }

    /// Reads and checks the manifest in `dir` for `arch`.
    pub fn load(dir: &Path, arch: &str) -> Result<Self> {
        let name = format!("halo_kernels.{arch}.manifest.json");
        let path = dir.join(&name);
        let text = std::fs::read_to_string(&path).map_err(|_| HaloError::MissingPtx { dir: dir.to_path_buf(), missing: name })?;
        let manifest: Manifest = serde_json::from_str(&text)
            .map_err(|e| HaloError::StalePtx { path: path.clone(), detail: format!("unreadable manifest ({e})") })?;
        if manifest.abi_version != abi::ABI_VERSION {
            return Err(HaloError::StalePtx {
                path,
                detail: format!("built for kernel ABI {}, this halo speaks ABI {}", manifest.abi_version, abi::ABI_VERSION),
            });
        }
        let missing: Vec<_> = abi::KERNEL_ENTRIES.iter().filter(|e| !manifest.entries.iter().any(|m| m == *e)).collect();
        if !missing.is_empty() {
            return Err(HaloError::StalePtx { path, detail: format!("kernels {missing:?} are missing") });
        }
        Ok(Self { dir: dir.to_path_buf(), manifest })
    }

    /// The PTX file.
    pub fn ptx_path(&self) -> PathBuf {
        self.dir.join(&self.manifest.ptx)
    }

    /// The cubin file.
    pub fn cubin_path(&self) -> PathBuf {
        self.dir.join(&self.manifest.cubin)
    }

    /// The ptxas register/spill report.
    pub fn ptxas_report_path(&self) -> PathBuf {
        self.dir.join(&self.manifest.ptxas_report)
    }
}

/// Candidate folders in priority order (only those that hold a manifest for `arch`, except an
/// explicit `HALO_PTX_DIR`, which is used even when empty so that its error names it).
fn search_dirs(arch: &str) -> Vec<PathBuf> {
    if let Some(dir) = std::env::var_os("HALO_PTX_DIR") {
        return vec![PathBuf::from(dir)];
    }
    let manifest = format!("halo_kernels.{arch}.manifest.json");
    let mut dirs = Vec::new();
    if let Some(exe_dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        dirs.push(exe_dir.join("ptx"));
        // Test binaries run from target/<profile>/deps/.
        dirs.extend(exe_dir.ancestors().map(|a| a.join("ptx")));
    }
    dirs.push(workspace_ptx_dir());
    dirs.into_iter().filter(|d| d.join(&manifest).exists()).collect()
}

/// `target/ptx` of the workspace this crate was built in.
pub fn workspace_ptx_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/ptx")
}
