//! The descriptions the layers share, below all of them: what a rank's halo is ([`halo`]), how a
//! halo moves ([`transport`]), what a halo wait that gave up reports ([`wait`]), and the router's
//! vocabulary with the errors routing raises ([`route`]).
//!
//! The layers point one way: the GPU layer ([`crate::gpu`], [`crate::kernels`], [`crate::nvshmem`]
//! and the machine's facts in `node`) and the error type ([`crate::error`]) never name the
//! exchange or the router and take what they share with them from here; the router (`halo::route`) never names the exchange; the exchange is built on
//! all of them. The exchange and the router re-export what moved here at their old paths
//! (`halo::exchange::RankHalo`, `halo::exchange::Transport`, `halo::exchange::WaitTimeout`,
//! `halo::route::Transport`, `halo::route::PathError`, ...). A test scans the sources to keep it
//! that way.

pub mod halo;
pub mod route;
pub mod transport;
pub mod wait;

pub use halo::{AtomPlace, PulseSpec, RankHalo, ReceivedAt, first_at_or_above};
pub use transport::{Element, Transport, UnknownTransport};
pub use wait::{DeviceSnapshot, JITTER_MAX_US, StuckStream, WaitTimeout};

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// Each upper layer, and the files below it (under `host/src/`) that may never name it.
    const LAYERS: &[(&str, &[&str])] = &[
        ("exchange", &["gpu", "kernels.rs", "error.rs", "nvshmem", "node.rs", "route", "desc"]),
        ("route", &["gpu", "kernels.rs", "error.rs", "nvshmem", "node.rs", "desc"]),
    ];

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
    /// that name the module `upper` of this crate: in code any path to it, in comments an
    /// intra-doc link to it.
    fn upward_references(text: &str, upper: &str) -> Vec<(usize, String)> {
        let code_end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
        let in_crate = format!("crate::{upper}");
        let paths = [in_crate.clone(), format!("super::super::{upper}"), format!("halo::{upper}")];
        let mut found = Vec::new();
        for (i, line) in text[..code_end].lines().enumerate() {
            let names = if line.trim_start().starts_with("//") {
                line.contains(&in_crate)
            } else {
                let code = line.split("//").next().unwrap_or_default();
                paths.iter().any(|p| code.contains(p.as_str())) || (code.contains("crate::{") && code.contains(upper))
            };
            if names {
                found.push((i + 1, line.trim().to_owned()));
            }
        }
        found
    }

    #[test]
    fn the_layers_below_the_exchange_and_the_router_never_name_them() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut wrong = Vec::new();
        for (upper, below) in LAYERS {
            let mut files = Vec::new();
            for part in *below {
                rust_files(&src.join(part), &mut files);
            }
            assert!(files.len() >= 12, "found only {} files below {upper} under {}", files.len(), src.display());
            for file in &files {
                let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
                for (line, what) in upward_references(&text, upper) {
                    wrong.push(format!("{}:{line} names {upper}: {what}", file.strip_prefix(&src).unwrap_or(file).display()));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "these lines point up a layer (the GPU layer and the error type use only crate::desc; the router uses \
             crate::desc and the GPU layer, never the exchange; move what they need into crate::desc):\n{}",
            wrong.join("\n")
        );
    }

    #[test]
    fn the_scan_sees_every_way_of_naming_an_upper_layer() {
        let named = [
            "use crate::exchange::RankHalo;",
            "fn f<T: crate::exchange::Element>() {}",
            "use crate::{error::Result, exchange::Transport};",
            "use super::super::exchange::spec;",
            "/// Placed as [`crate::exchange::LocalRanks`] does.",
        ];
        for line in named {
            assert_eq!(upward_references(line, "exchange").len(), 1, "missed {line:?}");
        }
        assert_eq!(upward_references("    Route(#[from] crate::route::PathError),", "route").len(), 1);
        let fine = ["use crate::desc::RankHalo;", "/// As the exchange's `LocalRanks` places them.", "let x = 1; // see crate::exchange"];
        for line in fine {
            assert!(upward_references(line, "exchange").is_empty(), "flagged {line:?}");
        }
        let with_tests = "use crate::desc::RankHalo;\n#[cfg(test)]\nmod tests {\n    use crate::exchange::synthetic;\n}\n";
        assert!(upward_references(with_tests, "exchange").is_empty(), "a unit test may use the exchange's fixtures");
    }
}
