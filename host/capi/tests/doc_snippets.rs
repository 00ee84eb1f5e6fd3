//! Every C block of docs/library.md is verbatim in `tests/snippets/two_ranks.c`, the program the
//! capi check of `cargo xtask test` compiles and links against the installed package: the guide
//! shows only C that builds.

use std::path::Path;

/// The bodies of the fenced blocks of `lang` in `markdown`.
fn blocks<'a>(markdown: &'a str, lang: &str) -> Vec<&'a str> {
    let open = format!("```{lang}\n");
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

#[test]
fn every_c_block_of_the_library_guide_is_in_the_compiled_snippet() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(root.join("../../docs/library.md")).expect("docs/library.md");
    let compiled = std::fs::read_to_string(root.join("tests/snippets/two_ranks.c")).expect("the snippet");
    let c = blocks(&guide, "c");
    assert!(c.len() >= 3, "docs/library.md shows {} C blocks; its C section lost them", c.len());
    for block in c {
        assert!(
            compiled.contains(block),
            "this C block of docs/library.md is not in host/capi/tests/snippets/two_ranks.c (copy it from there):\n{block}"
        );
    }
}

#[test]
fn blocks_are_found_whole() {
    let md = "a\n```c\nint x;\n```\n```rust\nlet y;\n```\n```c\nint z;\n```\n";
    assert_eq!(blocks(md, "c"), ["int x;", "int z;"]);
}
