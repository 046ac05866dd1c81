//! Golden tests of the diagnostics: every `tests/golden/NAME.kdl` file or `NAME/` directory
//! is loaded and its rendered errors must equal `tests/golden/NAME.expected`.
//!
//! `TRELLIS_BLESS=1 cargo test -p trellis-dsl --test it` rewrites the expected files;
//! review the diff by eye, since these are the product's error messages.

use std::fs;
use std::path::{Path, PathBuf};

fn cases() -> Vec<(String, PathBuf)> {
    let dir = Path::new("tests/golden");
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).expect("tests/golden exists (run from the crate directory)") {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let is_case = path.is_dir() || path.extension().is_some_and(|e| e == "kdl");
        if is_case {
            // Relative path, so file names in the output are stable.
            out.push((name, dir.join(path.file_name().unwrap())));
        }
    }
    out.sort();
    out
}

fn render(path: &Path) -> String {
    match trellis_dsl::load(&[path], &trellis_engine::protocol::registry::specs()) {
        Ok(_) => "no errors\n".to_string(),
        Err(diags) => format!("{diags}\n\n{}", diags.render_plain()),
    }
}

#[test]
fn golden() {
    let bless = std::env::var_os("TRELLIS_BLESS").is_some_and(|v| v == "1");
    let cases = cases();
    assert!(!cases.is_empty(), "no golden cases found");
    let mut failures = Vec::new();
    for (name, path) in cases {
        let actual = render(&path);
        let expected_path = Path::new("tests/golden").join(format!("{name}.expected"));
        if bless {
            fs::write(&expected_path, &actual).unwrap();
            continue;
        }
        let expected = fs::read_to_string(&expected_path).unwrap_or_default();
        if actual != expected {
            failures.push(format!(
                "=== {name}: output differs from {}\n--- expected\n{expected}\n--- actual\n{actual}",
                expected_path.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n(rerun with TRELLIS_BLESS=1 to accept)",
        failures.join("\n")
    );
}

/// Every diagnostic class has a golden case whose output shows its code.
#[test]
fn every_code_is_covered() {
    let mut all = String::new();
    for (name, _) in cases() {
        all.push_str(
            &fs::read_to_string(format!("tests/golden/{name}.expected")).unwrap_or_default(),
        );
    }
    for code in [
        "trellis::kdl_syntax",
        "trellis::unknown_node",
        "trellis::unknown_property",
        "trellis::wrong_type",
        "trellis::missing",
        "trellis::duplicate_id",
        "trellis::undefined_reference",
        "trellis::invalid_regex",
        "trellis::invalid_duration",
        "trellis::undefined_variable",
        "trellis::template_syntax",
        "trellis::needs_cycle",
        "trellis::missing_include",
        "trellis::include_cycle",
        "trellis::no_turn_yet",
        "trellis::invalid_value",
        "trellis::invalid_endpoint",
        "trellis::out_of_range",
        "trellis::ambiguous_agent",
    ] {
        assert!(all.contains(code), "no golden case shows {code}");
    }
}

/// One miette report of the whole `Diagnostics` value shows every diagnostic of every file.
#[test]
fn one_report_shows_all_errors() {
    let diags = trellis_dsl::load(
        &["tests/golden/many_files"],
        &trellis_engine::protocol::registry::specs(),
    )
    .unwrap_err();
    assert!(diags.len() >= 5);
    let handler =
        miette::GraphicalReportHandler::new_themed(miette::GraphicalTheme::unicode_nocolor())
            .with_width(100);
    let mut out = String::new();
    handler.render_report(&mut out, &diags).unwrap();
    assert!(out.contains(&format!("{} errors in suite files", diags.len())));
    for d in &diags {
        assert!(
            out.contains(&d.message),
            "missing {:?} in\n{out}",
            d.message
        );
    }
    for file in ["agents.kdl", "booking.kdl", "other.kdl"] {
        assert!(out.contains(&format!("tests/golden/many_files/{file}")));
    }
}
