//! cudarc's `is_culib_present` opens and closes the CUDA driver library, after a search over up to
//! 17 names, every time it is asked. halo asks it once per process
//! (`halo::gpu::driver_library_present`); no other source of the workspace may call it, or a path
//! taken at every step (every C API call restores the caller's context) pays the probe again.

use std::path::{Path, PathBuf};

/// The sources that run in a user's process.
const SOURCES: [&str; 4] = ["host/src", "host/md/src", "host/cli/src", "host/capi/src"];

/// The one place allowed to ask.
const CACHED: &str = "host/src/gpu/mod.rs";

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn only_the_cached_probe_asks_cudarc_whether_libcuda_is_present() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (mut calls, mut cached) = (Vec::new(), 0);
    for dir in SOURCES {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files);
        assert!(!files.is_empty() || dir == "host/capi/src", "no sources under {dir}");
        for file in files {
            let text = std::fs::read_to_string(&file).expect("reading a source");
            let rel = file.strip_prefix(&root).unwrap_or(&file).to_string_lossy().replace('\\', "/");
            for (n, line) in text.lines().enumerate() {
                let code = line.find("//").map_or(line, |at| &line[..at]);
                if code.contains("is_culib_present") {
                    if rel == CACHED {
                        cached += 1;
                    } else {
                        calls.push(format!("{rel}:{}", n + 1));
                    }
                }
            }
        }
    }
    assert!(calls.is_empty(), "call `halo::gpu::driver_library_present()` instead of cudarc's probe at: {calls:?}");
    assert_eq!(cached, 1, "{CACHED} asks cudarc once, inside `driver_library_present`");
    // The cached answer is the probe's, and stays the same.
    assert_eq!(halo::gpu::driver_library_present(), halo::gpu::driver_library_present());
}
