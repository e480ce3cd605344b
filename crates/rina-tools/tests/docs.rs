//! The documentation as an mdBook (`book.toml`, `docs/SUMMARY.md`): every
//! page in `docs/` is in the summary and every page the summary links to
//! exists, so `mdbook build` neither drops a page nor fails (CI does not
//! need mdbook for this).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The targets of the Markdown links `[text](target)` in `text`.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(j) = rest.find(')') {
            out.push(rest[..j].to_string());
            rest = &rest[j..];
        }
    }
    out
}

#[test]
fn summary_lists_every_docs_page_and_only_existing_ones() {
    let docs = root().join("docs");
    let book = std::fs::read_to_string(root().join("book.toml")).expect("book.toml");
    assert!(book.contains("src = \"docs\""), "{book}");
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).expect("docs/SUMMARY.md");
    let listed: BTreeSet<String> = link_targets(&summary).into_iter().collect();
    let pages: BTreeSet<String> = std::fs::read_dir(&docs)
        .expect("docs/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md") && n != "SUMMARY.md")
        .collect();
    let unlisted: Vec<&String> = pages.difference(&listed).collect();
    assert!(unlisted.is_empty(), "not in docs/SUMMARY.md: {unlisted:?}");
    let dangling: Vec<&String> = listed.difference(&pages).collect();
    assert!(
        dangling.is_empty(),
        "docs/SUMMARY.md links to missing pages: {dangling:?}"
    );
}

#[test]
fn link_targets_are_found() {
    assert_eq!(
        link_targets("- [A](a.md)\n  - [B](sub/b.md) [c](c.md)"),
        vec!["a.md", "sub/b.md", "c.md"]
    );
    assert!(link_targets("no links (here)").is_empty());
}
