//! docs/library.md shows only code that CI compiles. Its `rust` blocks are doctests of the halo
//! crate (compiled, and run where they need no GPU); its `rust,ignore` blocks are excerpts of
//! files CI builds, each naming its file on its first line: `// from PATH` (verbatim, checked here
//! line for line, leading indentation aside) or `// simplified from PATH` (the file must exist).
//! Its C blocks are verbatim in the C API's snippet, which the capi check of `cargo xtask test`
//! compiles and links against the installed package; its CMake block's commands are those of
//! `examples/capi-cpp/CMakeLists.txt`, which that check configures and builds against the package.

use std::path::Path;

/// The bodies of the fenced blocks opened by exactly `fence` (e.g. "```rust,ignore").
fn blocks<'a>(markdown: &'a str, fence: &str) -> Vec<&'a str> {
    let open = format!("{fence}\n");
    let mut out = Vec::new();
    let mut rest = markdown;
    while let Some(at) = rest.find(&open) {
        let body = &rest[at + open.len()..];
        let end = body.find("\n```").expect("an unclosed code block");
        out.push(&body[..end]);
        rest = &body[end + 4..];
    }
    out
}

/// Whether `excerpt`'s lines appear consecutively in `file`, each compared without its leading
/// blanks (an excerpt is shown dedented).
fn contains_lines(file: &str, excerpt: &str) -> bool {
    let want: Vec<&str> = excerpt.lines().map(str::trim_start).collect();
    let have: Vec<&str> = file.lines().map(str::trim_start).collect();
    !want.is_empty() && have.windows(want.len()).any(|w| w == want.as_slice())
}

#[test]
fn every_ignored_rust_block_of_the_library_guide_is_an_excerpt_of_a_built_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let guide = std::fs::read_to_string(root.join("docs/library.md")).expect("docs/library.md");
    let ignored = blocks(&guide, "```rust,ignore");
    assert!(!ignored.is_empty(), "docs/library.md has no excerpt any more: drop this test or the blocks' convention");
    for block in ignored {
        let (first, rest) = block.split_once('\n').unwrap_or((block, ""));
        let (verbatim, path) = if let Some(p) = first.strip_prefix("// from ") {
            (true, p)
        } else if let Some(p) = first.strip_prefix("// simplified from ") {
            (false, p.split(':').next().unwrap_or(p))
        } else {
            panic!("a rust,ignore block of docs/library.md does not say where it is from (`// from PATH` or `// simplified from PATH`):\n{block}");
        };
        let text =
            std::fs::read_to_string(root.join(path.trim())).unwrap_or_else(|e| panic!("docs/library.md quotes {path}, which cannot be read: {e}"));
        assert!(!verbatim || contains_lines(&text, rest), "this block of docs/library.md is not verbatim in {path} (copy it again):\n{rest}");
    }
}

#[test]
fn every_c_block_of_the_library_guide_is_in_the_compiled_snippet() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let guide = std::fs::read_to_string(root.join("docs/library.md")).expect("docs/library.md");
    let compiled = std::fs::read_to_string(root.join("host/capi/tests/snippets/two_ranks.c")).expect("the C snippet");
    let c = blocks(&guide, "```c");
    assert!(c.len() >= 3, "docs/library.md shows {} C blocks; its C section lost them", c.len());
    for block in c {
        assert!(
            compiled.contains(block),
            "this C block of docs/library.md is not in host/capi/tests/snippets/two_ranks.c (copy it from there):\n{block}"
        );
    }
}

/// The commands of a CMake block, comments and blank lines dropped, with the target `app` named
/// `target` (the guide calls the reader's program `app`).
fn cmake_commands(block: &str, target: &str) -> Vec<String> {
    block
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(|l| l.replace("(app ", &format!("({target} ")))
        .collect()
}

#[test]
fn the_cmake_block_of_the_library_guide_is_what_the_example_builds_with() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let guide = std::fs::read_to_string(root.join("docs/library.md")).expect("docs/library.md");
    let example = std::fs::read_to_string(root.join("examples/capi-cpp/CMakeLists.txt")).expect("the C++ example's CMakeLists.txt");
    let built: Vec<String> = cmake_commands(&example, "capi-cpp");
    let cmake = blocks(&guide, "```cmake");
    assert!(!cmake.is_empty(), "docs/library.md shows no CMake block; its C section lost it");
    for block in cmake {
        for command in cmake_commands(block, "capi-cpp") {
            assert!(
                built.iter().any(|b| b == &command),
                "docs/library.md's CMake line `{command}` (app = capi-cpp) is not in examples/capi-cpp/CMakeLists.txt, which CI builds"
            );
        }
    }
}

#[test]
fn excerpts_match_line_for_line_only() {
    let file = "fn f() {\n    let a = 1;\n    let b = 2;\n}\n";
    assert!(contains_lines(file, "let a = 1;\nlet b = 2;"));
    assert!(!contains_lines(file, "let a = 1;\nlet b = 3;"));
    assert!(!contains_lines(file, "let b = 2;\nlet a = 1;"));
    assert_eq!(blocks("```rust,ignore\nx\n```\n```rust\ny\n```\n", "```rust,ignore"), ["x"]);
    assert_eq!(blocks("```c\nint x;\n```\n```cmake\nfoo\n```\n```c\nint z;\n```\n", "```c"), ["int x;", "int z;"]);
    assert_eq!(
        cmake_commands("# a\nfind_package(h)  # why\n\ntarget_link_libraries(app PRIVATE h::h)\n", "t"),
        ["find_package(h)", "target_link_libraries(t PRIVATE h::h)"]
    );
}
