//! A directory of suite files: its files are read and parsed ahead on other threads and
//! decoded in order (`parse/include.rs`). Whatever each file holds (a small one, one too
//! large to be parsed ahead, a syntax error, nesting past the limit), the project and the
//! diagnostics are those of loading the files one at a time, in file order.

use trellis_dsl::*;

const AGENT: &str = "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n";

fn scenarios(prefix: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("scenario \"{prefix}-{i}\" {{\n    user \"hi {i}\"\n}}\n"))
        .collect()
}

fn load_dir(files: &[(&str, String)]) -> Result<Project, Diagnostics> {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    load(&[dir.path()], &trellis_engine::protocol::registry::specs())
}

#[test]
fn a_directorys_files_decode_in_file_order_with_their_own_spans() {
    let large = scenarios("large", 2_000);
    assert!(large.len() > 64 * 1024, "parsed by the loader, not ahead");
    let files = [
        ("a.kdl", format!("{AGENT}{}", scenarios("a", 3))),
        ("b.kdl", large),
        ("c.kdl", scenarios("c", 2)),
        (
            "d.kdl",
            format!("// comment first\n\n{}", scenarios("d", 1)),
        ),
        ("e.kdl", scenarios("e", 4)),
    ];
    let project = load_dir(&files).unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let suites: Vec<(&str, usize)> = project
        .suites
        .iter()
        .map(|s| (s.name.as_str(), s.scenarios.len()))
        .collect();
    assert_eq!(
        suites,
        [("a", 3), ("b", 2_000), ("c", 2), ("d", 1), ("e", 4)]
    );
    // Every scenario's span points at its own `scenario` node in its own file.
    for suite in &project.suites {
        let file = &project.files[suite.file];
        assert!(file.path.ends_with(format!("{}.kdl", suite.name)));
        for scenario in &suite.scenarios {
            let at = scenario.id.span.span.offset();
            assert_eq!(scenario.id.span.file, suite.file);
            assert_eq!(
                &file.text[at..at + scenario.id.value.len() + 2],
                format!("\"{}\"", scenario.id.value),
                "{}",
                scenario.id.value
            );
        }
    }
    let (line, col) = project.files[project.suites[3].file]
        .line_col(project.suites[3].scenarios[0].id.span.span.offset());
    assert_eq!((line, col), (3, 10));
}

#[test]
fn every_files_errors_are_reported_in_file_order() {
    let mut deep = String::from("scenario \"deep\" {\n");
    for _ in 0..200 {
        deep.push_str("branch \"b\" {\n");
    }
    let files = [
        ("a.kdl", format!("{AGENT}{}", scenarios("a", 1))),
        (
            "b.kdl",
            "scenario \"b\" {\n    user \"hi\"\n}}\n".to_owned(),
        ),
        ("c.kdl", deep),
        ("d.kdl", scenarios("d", 1)),
        ("e.kdl", "scenaro \"e\" {\n    user \"hi\"\n}\n".to_owned()),
        ("f.kdl", format!("{}}}\n", scenarios("f", 2_000))),
    ];
    let text = load_dir(&files)
        .expect_err("four broken files")
        .render_plain();
    let at = |needle: &str| {
        text.find(needle)
            .unwrap_or_else(|| panic!("no `{needle}` in:\n{text}"))
    };
    let (b, c, e, f) = (at("b.kdl:3"), at("c.kdl:"), at("e.kdl:1:1"), at("f.kdl:"));
    assert!(b < c && c < e && e < f, "{text}");
    assert!(text.contains("trellis::too_deep"), "{text}");
    assert!(text.contains("unknown node `scenaro`"), "{text}");
}

#[test]
fn many_files_of_uneven_sizes_decode_in_file_order() {
    // More files than the threads may take ahead of the decoder, large and small mixed so
    // that they finish out of order.
    let files: Vec<(String, String)> = (0..40)
        .map(|i| {
            let n = if i % 7 == 0 { 300 } else { 1 + i % 3 };
            let text = scenarios(&format!("f{i:02}"), n);
            let text = if i == 0 {
                format!("{AGENT}{text}")
            } else {
                text
            };
            (format!("f{i:02}.kdl"), text)
        })
        .collect();
    let files: Vec<(&str, String)> = files.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let project = load_dir(&files).unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let names: Vec<String> = project.suites.iter().map(|s| s.name.clone()).collect();
    let expected: Vec<String> = (0..40).map(|i| format!("f{i:02}")).collect();
    assert_eq!(names, expected);
    for (i, suite) in project.suites.iter().enumerate() {
        let n = if i % 7 == 0 { 300 } else { 1 + i % 3 };
        assert_eq!(suite.scenarios.len(), n, "{}", suite.name);
        assert_eq!(suite.scenarios[0].id.value, format!("f{i:02}-0"));
    }
}
