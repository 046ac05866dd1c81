//! `trellis fmt`'s layout (`trellis_dsl::format`): every suite of the repository and every
//! fixture formats, stays valid and is formatted once for all (formatting the output again
//! changes nothing); generated suites (real suites mutated, grammar-built trees) that parse
//! always format, never tripping the check that the layout changed nothing but layout.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use proptest::prelude::*;
use trellis_dsl::SourceFile;
use trellis_dsl::format::{FormatError, format_source};

use super::fuzz::{bounded, config, grammar_suite, mutated_suite};

fn source(text: &str) -> SourceFile {
    SourceFile::new(PathBuf::from("fmt.kdl"), "fmt.kdl".into(), Arc::from(text))
}

/// Formats `text`: `None` when it is not valid KDL; the formatted text, checked to be a fixed
/// point, otherwise.
fn format_once(text: &str) -> Option<String> {
    match format_source(&source(text)) {
        Ok((once, _)) => {
            let twice = match format_source(&source(&once)) {
                Ok((twice, _)) => twice,
                Err(e) => panic!("the formatted text does not format again: {e}\n{once}"),
            };
            assert_eq!(twice, once, "formatting twice changed the text of {text:?}");
            Some(once)
        }
        Err(FormatError::Invalid(_)) => None,
        Err(e @ FormatError::Changed { .. }) => panic!("{e}\n{text:?}"),
    }
}

fn kdl_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            kdl_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "kdl") {
            out.push(path);
        }
    }
}

#[test]
fn every_suite_and_fixture_formats_once_for_all() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["../suites", "tests"] {
        kdl_files(&root.join(dir), &mut files);
    }
    let mut formatted = 0;
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        if format_once(&text).is_some() {
            formatted += 1;
        } else {
            // Only golden fixtures whose expected diagnostics are syntax errors may fail to
            // parse (`golden/x.kdl`'s are in `golden/x.expected`, a directory's next to it).
            let golden = root.join("tests/golden");
            let expected = match path.parent() {
                Some(dir) if dir == golden => path.with_extension("expected"),
                Some(dir) => dir.with_extension("expected"),
                None => panic!("{} has no directory", path.display()),
            };
            let expected = std::fs::read_to_string(&expected).unwrap_or_default();
            assert!(
                path.starts_with(&golden)
                    && (expected.contains("trellis::kdl_syntax")
                        || expected.contains("trellis::too_deep")),
                "{} does not parse",
                path.display()
            );
        }
    }
    assert!(
        formatted >= 40,
        "only {formatted} of {} files formatted",
        files.len()
    );
}

#[test]
fn the_example_suites_still_load_the_same_once_formatted() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../suites");
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    kdl_files(&root, &mut files);
    for path in &files {
        let rel = path.strip_prefix(&root).unwrap();
        let out = dir.path().join(rel);
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        std::fs::write(&out, format_once(&text).unwrap()).unwrap();
    }
    let specs = trellis_engine::protocol::registry::specs();
    let before = trellis_dsl::load(&[&root], &specs).unwrap();
    let after = trellis_dsl::load(&[dir.path()], &specs).unwrap();
    // The fingerprints `trellis watch` compares: every scenario's resolved model, spans
    // left out, and each execution node's.
    let before = trellis_engine::fingerprint::project(&before);
    let after = trellis_engine::fingerprint::project(&after);
    assert!(before.len() >= 10, "{} scenarios", before.len());
    assert_eq!(before, after);
}

/// A slashdashed node ended by `;` is a node commented out, as KDL v2 has it (`node :=
/// base-node node-terminator`): the parser left its `;` to the next node and refused the
/// file. Formatting keeps it commented out.
#[test]
fn a_slashdashed_node_ended_by_a_semicolon_is_commented_out() {
    let text = "/-a \"x\"; agent \"a\" protocol=\"connexity\" builtin=\"booking\"\nscenario \"s\" {\n    user \"hi\"\n    /-user \"skipped\"; expect no-error\n    criteria { no-error; /-tool \"x\"; turns max=3 }\n}\n";
    let load = |text: &str| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.kdl");
        std::fs::write(&path, text).unwrap();
        trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs())
            .unwrap_or_else(|d| panic!("{}", d.render_plain()))
    };
    let project = load(text);
    let fingerprint = trellis_engine::fingerprint::project(&project);
    let scenario = &project.suites[0].scenarios[0];
    assert_eq!(scenario.criteria.len(), 2, "{:?}", scenario.criteria);
    let formatted = format_once(text).unwrap();
    assert!(formatted.contains("/-user \"skipped\""), "{formatted}");
    assert_eq!(
        trellis_engine::fingerprint::project(&load(&formatted)),
        fingerprint
    );
}

#[test]
fn comments_of_every_kind_are_kept() {
    let text = "// line\n/* block\n     inside */\nscenario \"s\" /-x=1 { // after the brace\n  user \"hi\" /* mid */\n  /-user \"off\"\n  /- branch \"b\" {\n      user \"deep\"\n  }\n} // after the block\n/-scenario \"t\"\n";
    let out = format_once(text).unwrap();
    for comment in [
        "// line",
        "/* block\n     inside */",
        "/-x=1",
        "// after the brace",
        "/* mid */",
        "/-user \"off\"",
        "/-branch \"b\" {\n        user \"deep\"\n    }",
        "} // after the block",
        "/-scenario \"t\"",
    ] {
        assert!(out.contains(comment), "{comment:?} lost:\n{out}");
    }
}

/// Found by `mutated_suites_that_parse_format_once_for_all`: the parser (kdl 6.7.1) reads
/// `/-scenario #true"s" { … }` as the slashdashed `scenario #true` and a node `"s" { … }`
/// (without the slashdash the text is an error), so the space the formatter put after
/// `#true` made them one commented-out node. Words written together stay together.
#[test]
fn words_written_together_stay_together() {
    let text = "include \"shared/agents.kdl\"\n/-\nscenario #true\"s\" {\n    user \"hi\"\n}\n";
    let out = format_once(text).expect("the text parses");
    assert_eq!(
        out,
        "include \"shared/agents.kdl\"\n/-scenario #true\"s\" {\n    user \"hi\"\n}\n"
    );
    // A type annotation after the keyword starts the node the same way.
    let text = "/-scenario #false(t)\"s\"   {\n  user \"hi\"\n}\n";
    let out = format_once(text).expect("the text parses");
    assert_eq!(out, "/-scenario #false(t)\"s\" {\n    user \"hi\"\n}\n");
}

#[test]
fn mutated_suites_that_parse_format_once_for_all() {
    proptest!(config(300), |(text in mutated_suite())| {
        bounded(&text, || format_once(&text));
    });
}

#[test]
fn generated_node_trees_format_once_for_all() {
    proptest!(config(300), |(text in grammar_suite())| {
        bounded(&text, || format_once(&text));
    });
}
