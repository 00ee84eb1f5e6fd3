//! Finding `libnvshmem_host.so.3`, in a fixed order:
//! 1. an explicit path (a flag, or `HALO_NVSHMEM_LIB`);
//! 2. `$NVSHMEM_HOME/lib`;
//! 3. the `nvidia-nvshmem-cu13` package of the `python3` on `PATH`;
//! 4. the system loader (`LD_LIBRARY_PATH`, ld.so.cache).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The library's file name (SONAME).
pub const LIBRARY_NAME: &str = "libnvshmem_host.so.3";

/// One place the library may be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Where this candidate came from, for messages.
    pub source: &'static str,
    /// The path to try (a bare file name means "ask the system loader").
    pub path: PathBuf,
}

/// The places to look, in order, given the inputs of each rule (pure, so it can be tested).
pub fn candidates(explicit: Option<&Path>, env_lib: Option<&Path>, nvshmem_home: Option<&Path>, python_pkg_dir: Option<&Path>) -> Vec<Candidate> {
    let mut out = Vec::new();
    if let Some(p) = explicit {
        out.push(Candidate { source: "--nvshmem-lib", path: p.to_path_buf() });
    }
    if let Some(p) = env_lib {
        out.push(Candidate { source: "HALO_NVSHMEM_LIB", path: p.to_path_buf() });
    }
    if let Some(home) = nvshmem_home {
        out.push(Candidate { source: "NVSHMEM_HOME", path: home.join("lib").join(LIBRARY_NAME) });
    }
    if let Some(pkg) = python_pkg_dir {
        out.push(Candidate { source: "python3 package nvidia-nvshmem-cu13", path: pkg.join("lib").join(LIBRARY_NAME) });
    }
    out.push(Candidate { source: "system loader", path: PathBuf::from(LIBRARY_NAME) });
    out
}

/// The `nvidia/nvshmem` folder of the `python3` on `PATH`, if that package is installed.
pub fn python_package_dir() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import nvidia.nvshmem as m; print(list(m.__path__)[0])"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())).filter(|p| p.is_dir())
}

/// The candidates for this process (reads the environment and asks python3).
pub fn candidates_from_env(explicit: Option<&Path>) -> Vec<Candidate> {
    let env_lib = std::env::var_os("HALO_NVSHMEM_LIB").map(PathBuf::from);
    let home = std::env::var_os("NVSHMEM_HOME").map(PathBuf::from);
    candidates(explicit, env_lib.as_deref(), home.as_deref(), python_package_dir().as_deref())
}

/// Opens the first candidate that loads; the error lists every place tried and how to install it.
/// An explicit choice (argument or `HALO_NVSHMEM_LIB`) is the only one tried: a library the user
/// named must not be silently replaced by another.
pub fn load(explicit: Option<&Path>) -> Result<crate::NvshmemLib, String> {
    let mut tried = Vec::new();
    let mut all = candidates_from_env(explicit);
    if matches!(all.first(), Some(c) if c.source == "--nvshmem-lib" || c.source == "HALO_NVSHMEM_LIB") {
        all.truncate(1);
    }
    for c in all {
        let is_bare = c.path.components().count() == 1;
        if !is_bare && !c.path.exists() {
            tried.push(format!("  {} ({}): not found", c.path.display(), c.source));
            continue;
        }
        match crate::NvshmemLib::load(&c.path) {
            Ok(lib) => return Ok(lib),
            Err(e) => tried.push(format!("  {} ({}): {e}", c.path.display(), c.source)),
        }
    }
    Err(format!(
        "NVSHMEM's host library ({LIBRARY_NAME}) was not found. Looked in:\n{}\n\
         Install it with `python3 -m pip install nvidia-nvshmem-cu13==3.4.5`, or set NVSHMEM_HOME to an \
         NVSHMEM installation, or HALO_NVSHMEM_LIB to the library file.",
        tried.join("\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_explicit_env_home_python_system() {
        let c = candidates(Some(Path::new("/x/lib.so")), Some(Path::new("/env/lib.so")), Some(Path::new("/home")), Some(Path::new("/py")));
        let sources: Vec<_> = c.iter().map(|c| c.source).collect();
        assert_eq!(sources, ["--nvshmem-lib", "HALO_NVSHMEM_LIB", "NVSHMEM_HOME", "python3 package nvidia-nvshmem-cu13", "system loader"]);
        assert_eq!(c[2].path, Path::new("/home/lib/libnvshmem_host.so.3"));
        assert_eq!(c[3].path, Path::new("/py/lib/libnvshmem_host.so.3"));
    }

    #[test]
    fn only_the_system_loader_when_nothing_is_configured() {
        assert_eq!(candidates(None, None, None, None), vec![Candidate { source: "system loader", path: PathBuf::from(LIBRARY_NAME) }]);
    }

    #[test]
    fn a_fake_library_is_reported_with_every_place_tried() {
        let dir = std::env::temp_dir().join(format!("halo-nvshmem-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("lib")).unwrap();
        let fake = dir.join("lib").join(LIBRARY_NAME);
        std::fs::write(&fake, b"not an ELF file").unwrap();
        let err = load(Some(&fake)).err().expect("a fake library must not load");
        assert!(err.contains(&fake.display().to_string()), "{err}");
        assert!(err.contains("pip install nvidia-nvshmem-cu13"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
