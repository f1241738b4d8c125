//! The documents say what is: the crate map in `src/lib.rs` names every module and no other, and
//! every file the documents and the code's comments point at exists.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_crate_map_names_every_module_and_no_other() {
    let lib = read(&root().join("src/lib.rs"));
    let mut mapped: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//! | [`"))
        .filter_map(|l| l.split('`').next())
        .collect();
    let mut declared: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    mapped.sort_unstable();
    declared.sort_unstable();
    assert!(declared.len() > 10, "{declared:?}");
    assert_eq!(mapped, declared, "the map in src/lib.rs and its `pub mod`s");
}

/// The markdown files of the repository's documentation.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![
        root().join("README.md"),
        root().join("migrations/README.md"),
    ];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            docs.push(path);
        }
    }
    docs
}

/// The relative targets of a markdown text's `[text](target)` links, anchors cut off.
fn link_targets(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|t| t.split('#').next().unwrap_or_default().trim().to_owned())
        .filter(|t| !t.is_empty() && !t.contains("://") && !t.starts_with("mailto:"))
        .collect()
}

/// Every file under the docs folder a text mentions, by its path from the repository root.
fn docs_mentions(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("docs/") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || "/._-".contains(c)))
            .unwrap_or(tail.len());
        let path = tail[..end].trim_end_matches('.');
        // A file, not a folder (`docs/grafana/`) nor a sentence's full stop, and not a URL's
        // path (`/docs/swagger-ui.css` is served, not a file here).
        let in_url = rest[..at].ends_with(|c: char| c == '/' || c.is_ascii_alphanumeric());
        if !in_url && path.rsplit('/').next().is_some_and(|f| f.contains('.')) {
            found.push(path.to_owned());
        }
        rest = &tail[end..];
    }
    found
}

#[test]
fn every_link_of_the_documents_resolves_to_a_file() {
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        let dir = doc.parent().unwrap();
        for target in link_targets(&text) {
            checked += 1;
            assert!(
                dir.join(&target).exists(),
                "{} links to {target}, which does not exist",
                doc.display()
            );
        }
    }
    assert!(checked > 10, "{checked} links");
}

#[test]
fn every_docs_file_the_documents_and_the_code_name_exists() {
    let mut sources = documents();
    let mut dirs = vec![root().join("src"), root().join("tests")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                sources.push(path);
            }
        }
    }
    let mut named = 0;
    for source in sources {
        for mention in docs_mentions(&read(&source)) {
            named += 1;
            assert!(
                root().join(&mention).exists(),
                "{} names {mention}, which does not exist",
                source.display()
            );
        }
    }
    assert!(named > 5, "{named} mentions");
}
