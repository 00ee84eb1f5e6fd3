//! What the source-scanning tests of this folder share.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir` (recursively; nothing when it does not exist), appended to `out`.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
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

/// The line without its `//` comment (a `//` inside a string literal also cuts it: the scans then
/// err on the side of reporting nothing there).
pub fn code_part(line: &str) -> &str {
    line.find("//").map_or(line, |at| &line[..at])
}
