//! The four files of a build in one folder: where they are, copying them, reading the manifest.

use crate::ptx::{Artifacts, Manifest};
use crate::{BuildError, IoContext, Result};
use std::fs;
use std::path::{Path, PathBuf};

impl Artifacts {
    /// The file names of a build for `arch` in `dir`.
    pub fn in_dir(dir: &Path, arch: &str) -> Self {
        let stem = format!("halo_kernels.{arch}");
        Artifacts {
            ptx: dir.join(format!("{stem}.ptx")),
            cubin: dir.join(format!("{stem}.cubin")),
            report: dir.join(format!("{stem}.ptxas.txt")),
            manifest: dir.join(format!("{stem}.manifest.json")),
            dir: dir.to_path_buf(),
        }
    }

    /// The four files.
    pub fn files(&self) -> [&PathBuf; 4] {
        [&self.ptx, &self.cubin, &self.report, &self.manifest]
    }

    /// Copies the four files into `dir` (created if needed) and returns the copies.
    pub fn copy_to(&self, dir: &Path) -> Result<Artifacts> {
        fs::create_dir_all(dir).at("creating", dir)?;
        for f in self.files() {
            let to = dir.join(f.file_name().unwrap_or_default());
            fs::copy(f, &to).at("copying to", &to)?;
        }
        let arch = self.manifest()?.arch;
        Ok(Artifacts::in_dir(dir, &arch))
    }

    /// The manifest.
    pub fn manifest(&self) -> Result<Manifest> {
        let text = fs::read_to_string(&self.manifest).at("reading", &self.manifest)?;
        serde_json::from_str(&text).map_err(|e| BuildError::Invalid(format!("{}: unreadable manifest ({e})", self.manifest.display())))
    }

    /// Whether all four files are there and the manifest carries `stamp`.
    pub(crate) fn complete(&self, stamp: &str) -> bool {
        self.files().iter().all(|f| f.exists()) && self.manifest().is_ok_and(|m| m.stamp == stamp)
    }
}
