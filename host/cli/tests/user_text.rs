//! User-facing text states what is true now. README.md, every page under docs/ (except
//! docs/results/, the record of measurements, whose logs name their runs), the `--help` of every
//! `halo` subcommand, the doc comments `cargo doc` renders for the published crates and the reasons
//! the GPU test runner prints for ignored tests must not tell the project's history: no run numbers
//! (`run 12`, `runs 75–79`), no issue numbers (`issue 6`) and no `GPU run`. History belongs in the
//! git log.

use std::path::{Path, PathBuf};

/// Every line of `text` (matched case-insensitively) where history shows: `run N`, `runs N`,
/// `issue N`, `issues N` (a word, a space, a digit) and `GPU run` as words. `GPU runs` on its own
/// ("the GPU runs the passes") is ordinary English and not matched; `GPU runs 7` is, by `runs N`.
fn history_hits(text: &str) -> Vec<String> {
    let lower = text.to_ascii_lowercase(); // byte positions stay those of `text`
    let bytes = lower.as_bytes();
    let word_start = |i: usize| i == 0 || !bytes[i - 1].is_ascii_alphanumeric();
    let mut hits = Vec::new();
    for (i, _) in lower.char_indices() {
        if !word_start(i) {
            continue;
        }
        let rest = &lower[i..];
        let numbered = ["run ", "runs ", "issue ", "issues "]
            .iter()
            .any(|w| rest.strip_prefix(w).is_some_and(|after| after.as_bytes().first().is_some_and(u8::is_ascii_digit)));
        let gpu_run = rest.strip_prefix("gpu run").is_some_and(|after| after.as_bytes().first().is_none_or(|b| !b.is_ascii_alphanumeric()));
        if numbered || gpu_run {
            let line_start = lower[..i].rfind('\n').map_or(0, |p| p + 1);
            let line_end = lower[i..].find('\n').map_or(lower.len(), |p| i + p);
            let line_no = lower[..i].matches('\n').count() + 1;
            let hit = format!("line {line_no}: {}", text[line_start..line_end].trim());
            if hits.last() != Some(&hit) {
                hits.push(hit);
            }
        }
    }
    hits
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn markdown_under(dir: &Path, skip: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path == skip {
            continue;
        }
        if path.is_dir() {
            markdown_under(&path, skip, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

#[test]
fn the_matcher_finds_history_and_leaves_plain_words() {
    for bad in ["GPU run 20", "in run 45 the step", "(issue 6)", "Issues 13 and 14", "runs 75–79", "a GPU run, then", "GPU RUN", "since gpu run."] {
        assert_eq!(history_hits(bad).len(), 1, "{bad:?} should be one hit");
    }
    for good in [
        "the GPU runs the grid's passes",
        "`halo launch -n 2 -- verify`",
        "mpirun -np 8",
        "srun -N2",
        "each run takes 2 s",
        "rerun the test",
        "an issue with 2 PEs",
        "truncated 4 bytes",
        "prune 10",
    ] {
        assert!(history_hits(good).is_empty(), "{good:?} is not history: {:?}", history_hits(good));
    }
}

#[test]
fn readme_and_docs_tell_no_history() {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    markdown_under(&root.join("docs"), &root.join("docs/results"), &mut files);
    assert!(files.len() > 5, "expected README.md and the docs/ pages, found {files:?}");
    let mut problems = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        for hit in history_hits(&text) {
            problems.push(format!("{}: {hit}", file.strip_prefix(&root).unwrap_or(file).display()));
        }
    }
    assert!(
        problems.is_empty(),
        "user-facing text names runs or issues; say what is true now (the git log keeps the history):\n{}",
        problems.join("\n")
    );
}

#[test]
fn help_text_tells_no_history() {
    fn walk(cmd: &mut clap::Command, path: &str, problems: &mut Vec<String>, seen: &mut usize) {
        *seen += 1;
        let help = cmd.render_long_help().to_string();
        for hit in history_hits(&help) {
            problems.push(format!("`{path} --help`: {hit}"));
        }
        for sub in cmd.get_subcommands_mut() {
            let name = format!("{path} {}", sub.get_name());
            walk(sub, &name, problems, seen);
        }
    }
    let mut root = halo_cli::cli::command();
    root.build();
    let (mut problems, mut seen) = (Vec::new(), 0);
    walk(&mut root, "halo", &mut problems, &mut seen);
    assert!(seen > 10, "expected every subcommand of `halo`, rendered {seen}");
    assert!(problems.is_empty(), "help text names runs or issues; say what is true now:\n{}", problems.join("\n"));
}

fn rust_files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files_under(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The doc comments (`///`, `//!`) of the crates users read on docs.rs and in `cargo doc`, and the
/// `#[ignore = "..."]` reasons of the GPU tests (the runner prints them).
#[test]
fn doc_comments_and_ignore_reasons_tell_no_history() {
    let root = repo_root();
    let (mut sources, mut tests) = (Vec::new(), Vec::new());
    for dir in ["host/src", "host/md/src", "host/capi/src", "host/cli/src", "kernels-gpu/src"] {
        rust_files_under(&root.join(dir), &mut sources);
    }
    rust_files_under(&root.join("tests"), &mut tests);
    assert!(sources.len() > 50 && tests.len() > 5, "expected the crates' sources and the GPU tests, found {} and {}", sources.len(), tests.len());
    let mut problems = Vec::new();
    for (file, is_test) in sources.iter().map(|f| (f, false)).chain(tests.iter().map(|f| (f, true))) {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let shown: String = text
            .lines()
            .map(|l| l.trim_start())
            .filter(|l| if is_test { l.starts_with("#[ignore") } else { l.starts_with("///") || l.starts_with("//!") })
            .collect::<Vec<_>>()
            .join("\n");
        for hit in history_hits(&shown) {
            // `history_hits` numbers the lines of the doc text alone; name the hit by its text.
            let what = hit.split_once(": ").map_or(hit.as_str(), |(_, t)| t);
            problems.push(format!("{}: {what}", file.strip_prefix(&root).unwrap_or(file).display()));
        }
    }
    assert!(problems.is_empty(), "doc comments or ignore reasons name runs or issues; say what is true now:\n{}", problems.join("\n"));
}

/// The relative link targets of a markdown text (`[text](target)`), without their `#fragment`;
/// web addresses and in-page anchors are left out.
fn relative_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = text;
    while let Some(p) = rest.find("](") {
        rest = &rest[p + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or("");
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            links.push(target.to_string());
        }
        rest = &rest[end..];
    }
    links
}

/// `path` with its `.` and `..` components resolved by name (the file need not exist).
fn normalized(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// docs/cli.md and docs/environment.md are generated from the code by their own step; until they
/// exist a link to them is the one kind of link allowed to point nowhere.
const GENERATED: [&str; 2] = ["docs/cli.md", "docs/environment.md"];

#[test]
fn every_link_in_readme_and_docs_resolves() {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    markdown_under(&root.join("docs"), Path::new(""), &mut files);
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let dir = file.parent().expect("a file has a folder");
        for link in relative_links(&text) {
            let target = dir.join(&link);
            let generated = GENERATED.iter().any(|g| normalized(&target) == normalized(&root.join(g)));
            if !target.exists() && !generated {
                broken.push(format!("{}: {link}", file.strip_prefix(&root).unwrap_or(file).display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to files that do not exist:\n{}", broken.join("\n"));
}

#[test]
fn every_result_file_is_listed_in_the_results_index() {
    fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() { files_under(&path, out) } else { out.push(path) }
        }
    }
    let results = repo_root().join("docs/results");
    let index = results.join("index.md");
    let text = std::fs::read_to_string(&index).unwrap_or_else(|e| panic!("reading {}: {e}", index.display()));
    let linked: Vec<PathBuf> = relative_links(&text).iter().filter_map(|l| results.join(l).canonicalize().ok()).collect();
    let mut files = Vec::new();
    files_under(&results, &mut files);
    let unlisted: Vec<String> = files
        .iter()
        .filter(|f| **f != index && !f.canonicalize().is_ok_and(|c| linked.contains(&c)))
        .map(|f| f.strip_prefix(&results).unwrap_or(f).display().to_string())
        .collect();
    assert!(
        unlisted.is_empty(),
        "docs/results/index.md must link every result file (date, commit, machine, command); not linked:\n{}",
        unlisted.join("\n")
    );
}

#[test]
fn the_readme_library_snippet_is_the_compiled_example() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("reading README.md");
    let example = std::fs::read_to_string(root.join("host/examples/readme.rs")).expect("reading host/examples/readme.rs");
    let start = readme.find("```rust\n").expect("README.md has a ```rust block (the library in ten lines)") + "```rust\n".len();
    let block = &readme[start..start + readme[start..].find("```").expect("the ```rust block ends")];
    let compiled: Vec<&str> = example.lines().map(str::trim).collect();
    let missing: Vec<&str> = block.lines().map(str::trim).filter(|l| !l.is_empty() && !compiled.contains(l)).collect();
    assert!(block.lines().count() >= 5, "the README's rust block is too short to be the snippet: {block:?}");
    assert!(missing.is_empty(), "README.md's rust block has lines that host/examples/readme.rs (compiled in CI) lacks:\n{}", missing.join("\n"));
}
