//! Where the compiled kernels are, and whether they belong to this build.
//!
//! The library's build script compiles the kernels with `halo-builder` and embeds
//! `halo_kernels.<arch>.{ptx,cubin,ptxas.txt,manifest.json}` ([`EMBEDDED`]), so a program that
//! depends on `halo` finds them with no setup. `HALO_PTX_DIR` overrides them with a folder (what
//! `cargo xtask build-ptx` writes to `target/ptx/`, or a bundle's `ptx/`). The manifest records the
//! ABI version, the architecture and the NVSHMEM version linked in, so a stale or foreign module
//! is rejected with an error before any launch.

use crate::error::{HaloError, Result};
use kernels_gpu::abi;
use serde::Deserialize;
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// Kernels compiled into the library by its build script.
#[derive(Clone, Copy, Debug)]
pub struct Embedded {
    /// The architecture they were built for.
    pub arch: &'static str,
    /// `halo_kernels.<arch>.manifest.json`.
    pub manifest: &'static str,
    /// The PTX.
    pub ptx: &'static [u8],
    /// The cubin.
    pub cubin: &'static [u8],
    /// ptxas's register/spill report.
    pub ptxas_report: &'static str,
}

mod embedded {
    use super::Embedded;
    include!(concat!(env!("OUT_DIR"), "/embedded.rs"));
}

/// The kernels embedded in this build of the library; `None` when it was built with
/// `HALO_SKIP_KERNEL_BUILD=1`.
pub const EMBEDDED: Option<Embedded> = embedded::KERNELS;

/// The default architecture (H100/H200).
pub const DEFAULT_ARCH: &str = "sm_90";

/// The variable naming a folder of kernels to load instead of the embedded ones.
pub const PTX_DIR_ENV: &str = "HALO_PTX_DIR";

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

/// Where a set of kernel artifacts lives.
#[derive(Debug, Clone)]
pub enum Origin {
    /// In this library ([`EMBEDDED`]).
    Embedded(Embedded),
    /// In a folder (`HALO_PTX_DIR`, a bundle's `ptx/`, `target/ptx/`).
    Dir(PathBuf),
}

/// A located, checked set of kernel artifacts.
#[derive(Debug, Clone)]
pub struct KernelArtifacts {
    /// Where they are.
    pub origin: Origin,
    /// Their manifest.
    pub manifest: Manifest,
}

impl KernelArtifacts {
    /// Finds the artifacts for `arch`: in `HALO_PTX_DIR` when set, else the ones embedded in the
    /// library. A library built without them (`HALO_SKIP_KERNEL_BUILD=1`) looks in `ptx/` next to
    /// the executable (a bundle) and in the workspace's `target/ptx/`, and otherwise says how to
    /// provide them.
    pub fn locate(arch: &str) -> Result<Self> {
        let ptx_dir = std::env::var_os(PTX_DIR_ENV).map(PathBuf::from);
        Self::locate_in(arch, ptx_dir.as_deref(), EMBEDDED, || search_dirs(arch))
    }

    /// [`Self::locate`] with its inputs explicit: the `HALO_PTX_DIR` folder, the embedded kernels,
    /// and the folders to search when there are none.
    fn locate_in(arch: &str, ptx_dir: Option<&Path>, embedded: Option<Embedded>, search: impl FnOnce() -> Vec<PathBuf>) -> Result<Self> {
        if let Some(dir) = ptx_dir {
            return Self::load(dir, arch);
        }
        match embedded {
            Some(e) if e.arch == arch => return Self::embedded(e),
            Some(e) => {
                return Err(HaloError::MissingPtx {
                    dir: PathBuf::from(format!("this halo library (it embeds {})", e.arch)),
                    missing: format!("halo_kernels.{arch}.manifest.json"),
                });
            }
            None => {}
        }
        match search().into_iter().next() {
            Some(dir) => Self::load(&dir, arch),
            None => Err(HaloError::NoKernels { arch: arch.to_string() }),
        }
    }

    /// Checks the kernels embedded in the library.
    pub fn embedded(e: Embedded) -> Result<Self> {
        let manifest = Self::check(e.manifest, Path::new(&format!("embedded:halo_kernels.{}.manifest.json", e.arch)))?;
        Ok(Self { origin: Origin::Embedded(e), manifest })
    }

    /// Reads and checks the manifest in `dir` for `arch`.
    pub fn load(dir: &Path, arch: &str) -> Result<Self> {
        let name = format!("halo_kernels.{arch}.manifest.json");
        let path = dir.join(&name);
        let text = std::fs::read_to_string(&path).map_err(|_| HaloError::MissingPtx { dir: dir.to_path_buf(), missing: name })?;
        let manifest = Self::check(&text, &path)?;
        Ok(Self { origin: Origin::Dir(dir.to_path_buf()), manifest })
    }

    /// Parses a manifest and checks it belongs to this build (ABI version, every entry).
    fn check(text: &str, path: &Path) -> Result<Manifest> {
        let path = path.to_path_buf();
        let manifest: Manifest =
            serde_json::from_str(text).map_err(|e| HaloError::StalePtx { path: path.clone(), detail: format!("unreadable manifest ({e})") })?;
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
        Ok(manifest)
    }

    /// Where file `name` of this set is: its path in a folder, `embedded:<name>` in the library.
    /// For messages.
    pub fn location(&self, name: &str) -> PathBuf {
        match &self.origin {
            Origin::Dir(dir) => dir.join(name),
            Origin::Embedded(_) => PathBuf::from(format!("embedded:{name}")),
        }
    }

    /// Where the PTX is (see [`Self::location`]).
    pub fn ptx_location(&self) -> PathBuf {
        self.location(&self.manifest.ptx)
    }

    /// Where the cubin is (see [`Self::location`]).
    pub fn cubin_location(&self) -> PathBuf {
        self.location(&self.manifest.cubin)
    }

    /// The PTX text.
    pub fn ptx(&self) -> Result<Cow<'static, [u8]>> {
        self.read(&self.manifest.ptx, |e| e.ptx)
    }

    /// The cubin.
    pub fn cubin(&self) -> Result<Cow<'static, [u8]>> {
        self.read(&self.manifest.cubin, |e| e.cubin)
    }

    /// The ptxas register/spill report.
    pub fn ptxas_report(&self) -> Result<String> {
        let bytes = self.read(&self.manifest.ptxas_report, |e| e.ptxas_report.as_bytes())?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// One sentence for `halo info` and logs: embedded, or which folder.
    pub fn describe(&self) -> String {
        match &self.origin {
            Origin::Embedded(e) => format!("embedded in the halo library ({})", e.arch),
            Origin::Dir(dir) => format!("from {} (HALO_PTX_DIR or a bundle)", dir.display()),
        }
    }

    fn read(&self, name: &str, embedded: impl Fn(&Embedded) -> &'static [u8]) -> Result<Cow<'static, [u8]>> {
        match &self.origin {
            Origin::Embedded(e) => Ok(Cow::Borrowed(embedded(e))),
            Origin::Dir(dir) => {
                let path = dir.join(name);
                std::fs::read(&path).map(Cow::Owned).map_err(|source| HaloError::Io { what: "reading kernel module", path, source })
            }
        }
    }
}

/// Folders that hold a manifest for `arch` when the library embeds no kernels, in priority order.
fn search_dirs(arch: &str) -> Vec<PathBuf> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn built() -> Embedded {
        EMBEDDED.expect("this library was built without HALO_SKIP_KERNEL_BUILD, so it embeds its kernels")
    }

    #[test]
    fn the_library_embeds_checked_kernels() {
        let a = KernelArtifacts::embedded(built()).expect("the embedded manifest matches this build");
        assert_eq!(a.manifest.arch, DEFAULT_ARCH);
        let ptx = String::from_utf8(a.ptx().expect("embedded").into_owned()).expect("PTX is text");
        for entry in abi::KERNEL_ENTRIES {
            assert!(ptx.contains(&format!(".entry {entry}(")), "{entry} missing from the embedded PTX");
        }
        assert!(!a.cubin().expect("embedded").is_empty());
        assert!(a.describe().starts_with("embedded in the halo library"));
        assert_eq!(a.ptx_location(), PathBuf::from("embedded:halo_kernels.sm_90.ptx"));
    }

    #[test]
    fn embedded_kernels_unless_a_folder_is_named() {
        let none = || -> Vec<PathBuf> { panic!("no search while kernels are embedded") };
        let a = KernelArtifacts::locate_in(DEFAULT_ARCH, None, Some(built()), none).expect("embedded");
        assert!(matches!(a.origin, Origin::Embedded(_)));
        // HALO_PTX_DIR wins, even over embedded kernels, and its error names it.
        let e = KernelArtifacts::locate_in(DEFAULT_ARCH, Some(Path::new("/nonexistent/ptx")), Some(built()), none).unwrap_err().to_string();
        assert!(e.contains("no compiled kernels in /nonexistent/ptx") && e.contains("HALO_PTX_DIR"), "{e}");
        // Another architecture than the embedded one is not silently replaced by it.
        let e = KernelArtifacts::locate_in("sm_100", None, Some(built()), none).unwrap_err().to_string();
        assert!(e.contains("it embeds sm_90") && e.contains("halo_kernels.sm_100.manifest.json is missing"), "{e}");
    }

    #[test]
    fn without_embedded_kernels_the_error_names_both_ways_out() {
        let e = KernelArtifacts::locate_in(DEFAULT_ARCH, None, None, Vec::new).unwrap_err().to_string();
        assert!(e.contains("built without its GPU kernels (HALO_SKIP_KERNEL_BUILD=1)"), "{e}");
        assert!(e.contains("HALO_PTX_DIR") && e.contains("halo_kernels.sm_90.{ptx,cubin,manifest.json}"), "{e}");
        // A folder found next to the executable or in target/ptx is used instead.
        let e = KernelArtifacts::locate_in(DEFAULT_ARCH, None, None, || vec![PathBuf::from("/nonexistent/found")]).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/found"), "{e}");
    }
}
