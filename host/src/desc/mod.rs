//! The descriptions the layers share, below all of them: what a rank's halo is ([`halo`]), how a
//! halo moves ([`transport`]), and what a halo wait that gave up reports ([`wait`]).
//!
//! The GPU layer ([`crate::gpu`], [`crate::kernels`], [`crate::error`]) and the router
//! ([`crate::route`]) take these from here, never from the exchange, which is built on top of
//! them; the exchange re-exports them at their old paths (`halo::exchange::RankHalo`,
//! `halo::exchange::Transport`, `halo::exchange::WaitTimeout`, ...). A test scans the sources to
//! keep it that way.

pub mod halo;
pub mod transport;
pub mod wait;

pub use halo::{AtomPlace, PulseSpec, RankHalo, ReceivedAt};
pub use transport::{Element, Transport, UnknownTransport};
pub use wait::{DeviceSnapshot, JITTER_MAX_US, STUCK_EXIT_GRACE, StuckStream, WaitTimeout};

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// The files below the exchange: the GPU layer, the error type, the router and these
    /// descriptions. None of them may name the exchange.
    const BELOW_THE_EXCHANGE: &[&str] = &["gpu", "kernels.rs", "error.rs", "route", "desc"];

    fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
        if path.is_file() {
            out.push(path.to_path_buf());
            return;
        }
        let entries = std::fs::read_dir(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let mut entries: Vec<PathBuf> = entries.map(|e| e.expect("a directory entry").path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() || p.extension().is_some_and(|x| x == "rs") {
                rust_files(&p, out);
            }
        }
    }

    /// The lines of `text` outside its unit tests (a test may build its fixtures from any layer)
    /// that name the exchange: in code any path to it, in comments an intra-doc link to it.
    fn upward_references(text: &str) -> Vec<(usize, String)> {
        let code_end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
        let mut found = Vec::new();
        for (i, line) in text[..code_end].lines().enumerate() {
            let trimmed = line.trim_start();
            let comment = trimmed.starts_with("//");
            let names = if comment {
                line.contains("crate::exchange")
            } else {
                let code = line.split("//").next().unwrap_or_default();
                ["crate::exchange", "super::super::exchange", "halo::exchange"].iter().any(|p| code.contains(p))
                    || (code.contains("crate::{") && code.contains("exchange"))
            };
            if names {
                found.push((i + 1, line.trim().to_owned()));
            }
        }
        found
    }

    #[test]
    fn the_layers_below_the_exchange_never_name_it() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        for part in BELOW_THE_EXCHANGE {
            rust_files(&src.join(part), &mut files);
        }
        assert!(files.len() >= 25, "found only {} files under {}", files.len(), src.display());
        let mut wrong = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
            for (line, what) in upward_references(&text) {
                wrong.push(format!("{}:{line}: {what}", file.strip_prefix(&src).unwrap_or(file).display()));
            }
        }
        assert!(
            wrong.is_empty(),
            "these lines below the exchange name it (the GPU layer, the error type and the router take the shared \
             descriptions from crate::desc, never from the exchange; move what they need into crate::desc):\n{}",
            wrong.join("\n")
        );
    }

    #[test]
    fn the_scan_sees_every_way_of_naming_the_exchange() {
        let named = [
            "use crate::exchange::RankHalo;",
            "fn f<T: crate::exchange::Element>() {}",
            "use crate::{error::Result, exchange::Transport};",
            "use super::super::exchange::spec;",
            "/// Placed as [`crate::exchange::LocalRanks`] does.",
        ];
        for line in named {
            assert_eq!(upward_references(line).len(), 1, "missed {line:?}");
        }
        let fine = ["use crate::desc::RankHalo;", "/// As the exchange's `LocalRanks` places them.", "let x = 1; // see crate::exchange"];
        for line in fine {
            assert!(upward_references(line).is_empty(), "flagged {line:?}");
        }
        let with_tests = "use crate::desc::RankHalo;\n#[cfg(test)]\nmod tests {\n    use crate::exchange::synthetic;\n}\n";
        assert!(upward_references(with_tests).is_empty(), "a unit test may use the exchange's fixtures");
    }
}
