//! NVSHMEM's UCX transport on one node: the put path as it runs between nodes (NVSHMEM's proxy
//! thread and a remote transport), emulated over TCP loopback. One place builds the
//! environment a rank needs for it, for the tests, the scripts and the documentation
//! (docs/running.md, "Several nodes, emulated on one").
//!
//! The UCX libraries come from the pinned wheel `libucx-cu13==1.22.0` (`cargo xtask fetch-ucx`
//! unpacks the few files needed into `target/ucx/`; `cargo xtask bundle --with-ucx` ships them as
//! `ucx/` in the bundle). A folder holding them has `libucx/lib/*.so.0`, `libucx/lib/ucx/*.so.0`
//! (UCX's transport modules) and `libucx_cu13.libs/` (the wheel's bundled dependencies).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// The variable naming a folder with the UCX libraries (the bundle's runner sets it).
pub const ENV_UCX_DIR: &str = "HALO_UCX_DIR";

/// The variables of the emulated network, besides the library paths: NVSHMEM's UCX transport for
/// every peer (P2P off, so even NVLink peers go through the proxy), over TCP on the loopback
/// device, with CUDA copies for device memory.
pub const NETWORK_SETTINGS: [(&str, &str); 4] =
    [("NVSHMEM_REMOTE_TRANSPORT", "ucx"), ("NVSHMEM_DISABLE_P2P", "1"), ("UCX_TLS", "tcp,cuda_copy,self"), ("UCX_NET_DEVICES", "lo")];

/// The file whose presence marks a usable UCX folder.
const MARKER: &str = "libucx/lib/libucp.so.0";

/// Why `dir` does not hold the UCX libraries, or `None` when it does.
pub fn check_dir(dir: &Path) -> Option<String> {
    for (what, path) in [
        ("UCX's protocol library", dir.join(MARKER)),
        ("UCX's modules", dir.join("libucx/lib/ucx")),
        ("the wheel's bundled libraries", dir.join("libucx_cu13.libs")),
    ] {
        if !path.exists() {
            return Some(format!(
                "{} has no {what} ({} is missing): fetch them with `cargo xtask fetch-ucx` (target/ucx) or build the bundle with `cargo xtask bundle --with-ucx`",
                dir.display(),
                path.display()
            ));
        }
    }
    None
}

/// The UCX folder named by [`ENV_UCX_DIR`], when it is set and holds the libraries.
pub fn dir_from_env() -> Result<Option<PathBuf>, String> {
    let Some(dir) = std::env::var_os(ENV_UCX_DIR).filter(|d| !d.is_empty()).map(PathBuf::from) else { return Ok(None) };
    match check_dir(&dir) {
        None => Ok(Some(dir)),
        Some(why) => Err(format!("{ENV_UCX_DIR}: {why}")),
    }
}

/// The environment of a rank on the emulated network: `LD_LIBRARY_PATH` with UCX's libraries
/// first (then `inherited`, the caller's `LD_LIBRARY_PATH`), `UCX_MODULE_DIR`, and
/// [`NETWORK_SETTINGS`]. Pass them to `halo launch` (its ranks inherit them).
pub fn emulated_network_env(dir: &Path, inherited: Option<&OsStr>) -> Vec<(String, OsString)> {
    let mut paths = vec![dir.join("libucx/lib"), dir.join("libucx_cu13.libs")];
    if let Some(old) = inherited.filter(|o| !o.is_empty()) {
        paths.extend(std::env::split_paths(old));
    }
    let ld = std::env::join_paths(paths).unwrap_or_else(|_| dir.join("libucx/lib").into_os_string());
    let mut env = vec![("LD_LIBRARY_PATH".to_string(), ld), ("UCX_MODULE_DIR".to_string(), dir.join("libucx/lib/ucx").into_os_string())];
    env.extend(NETWORK_SETTINGS.iter().map(|(k, v)| (k.to_string(), OsString::from(v))));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_puts_ucx_first_and_selects_the_transport() {
        let env = emulated_network_env(Path::new("/opt/ucx"), Some(OsStr::new("/usr/lib:/x")));
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.to_string_lossy().into_owned());
        assert_eq!(get("LD_LIBRARY_PATH").as_deref(), Some("/opt/ucx/libucx/lib:/opt/ucx/libucx_cu13.libs:/usr/lib:/x"));
        assert_eq!(get("UCX_MODULE_DIR").as_deref(), Some("/opt/ucx/libucx/lib/ucx"));
        assert_eq!(get("NVSHMEM_REMOTE_TRANSPORT").as_deref(), Some("ucx"));
        assert_eq!(get("NVSHMEM_DISABLE_P2P").as_deref(), Some("1"));
        assert_eq!(get("UCX_TLS").as_deref(), Some("tcp,cuda_copy,self"));
        assert_eq!(get("UCX_NET_DEVICES").as_deref(), Some("lo"));
        let env = emulated_network_env(Path::new("/opt/ucx"), None);
        assert_eq!(env[0].1, OsString::from("/opt/ucx/libucx/lib:/opt/ucx/libucx_cu13.libs"));
    }

    #[test]
    fn a_folder_without_the_libraries_says_how_to_get_them() {
        let why = check_dir(Path::new("/nonexistent/ucx")).unwrap_or_default();
        assert!(why.contains("libucp.so.0") && why.contains("cargo xtask fetch-ucx"), "{why}");
    }
}
