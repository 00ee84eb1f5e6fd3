//! cudarc's `is_culib_present` opens and closes the CUDA driver library, after a search over up to
//! 17 names, every time it is asked. halo asks it once per process
//! (`halo::gpu::driver_library_present`); no other source of the workspace may call it, or a path
//! taken at every step (every C API call restores the caller's context) pays the probe again.

mod common;

use common::{code_part, rust_files};
use std::path::Path;

/// The sources that run in a user's process.
const SOURCES: [&str; 4] = ["host/src", "host/md/src", "host/cli/src", "host/capi/src"];

/// The one place allowed to ask.
const CACHED: &str = "host/src/gpu/mod.rs";

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
                if code_part(line).contains("is_culib_present") {
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
