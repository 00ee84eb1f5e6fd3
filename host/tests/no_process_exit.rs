//! The library never ends the process: no `process::exit`, `_exit`, `abort(`, self-raised
//! SIGKILL or `libc::kill(` in the sources of the library crates (`halo`, `halo-md`,
//! `nvshmem-sys`, `kernels-gpu`, and `halo-capi` where it exists). Only the `halo` command
//! (host/cli) may turn an error into an exit code. Build scripts are not library code; comments
//! are skipped, so documentation may name the calls.

mod common;

use common::{code_part, rust_files};
use std::path::Path;

/// The library crates' source folders, relative to the workspace root.
const LIBRARY_SOURCES: [&str; 5] = ["host/src", "host/md/src", "host/nvshmem-sys/src", "kernels-gpu/src", "host/capi/src"];

/// The folders that must exist (`host/capi` may not, yet).
const REQUIRED: [&str; 4] = ["host/src", "host/md/src", "host/nvshmem-sys/src", "kernels-gpu/src"];

/// Why `code` (one line without its comment) may end the process, if it may.
fn ends_the_process(code: &str) -> Option<&'static str> {
    let called = |name: &str| {
        code.match_indices(name).any(|(at, _)| {
            let before = code[..at].chars().next_back();
            let after = code[at + name.len()..].trim_start();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && after.starts_with('(')
        })
    };
    if code.contains("process::exit") {
        return Some("process::exit");
    }
    if called("_exit") || called("_Exit") || code.contains("libc::exit") {
        return Some("_exit");
    }
    if called("abort") {
        return Some("abort(");
    }
    if code.contains("raise(") && code.contains("SIGKILL") {
        return Some("raise(SIGKILL)");
    }
    if code.contains("libc::kill(") {
        return Some("libc::kill(");
    }
    None
}

/// Every `path:line: what` in the library sources under `root`.
fn hits(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    for dir in LIBRARY_SOURCES {
        rust_files(&root.join(dir), &mut files);
    }
    // Build scripts are not library code.
    files.retain(|f| f.file_name().is_some_and(|n| n != "build.rs"));
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        for (n, line) in text.lines().enumerate() {
            if let Some(what) = ends_the_process(code_part(line)) {
                out.push(format!("{}:{}: {what}: {}", file.strip_prefix(root).unwrap_or(&file).display(), n + 1, line.trim()));
            }
        }
    }
    out
}

#[test]
fn the_library_crates_never_end_the_process() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root");
    for dir in REQUIRED {
        assert!(root.join(dir).is_dir(), "{dir} is missing: the scan would pass without looking");
    }
    let hits = hits(root);
    assert!(hits.is_empty(), "the library must return errors, not end the process (only host/cli may exit):\n{}", hits.join("\n"));
}

#[test]
fn the_scan_sees_each_way_to_end_the_process() {
    for line in [
        "    std::process::exit(1);",
        "unsafe { libc::_exit(86) }",
        "_exit (86);",
        "std::process::abort()",
        "unsafe { libc::abort() };",
        "unsafe { libc::raise(libc::SIGKILL) };",
        "unsafe { libc::kill(pid, libc::SIGTERM) };",
    ] {
        assert!(ends_the_process(code_part(line)).is_some(), "missed: {line}");
    }
    for line in [
        "// ends with `_exit(86)` in the CLI",
        "let code = peek_exit(pid);",
        "fn on_exit() {}",
        "let aborted = abort_requested;",
        "tracing::error!(\"proxy aborting\");",
        "halo::exit::EXIT_CODE",
    ] {
        assert_eq!(ends_the_process(code_part(line)), None, "false alarm: {line}");
    }
}
