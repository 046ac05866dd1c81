//! `needs` references resolve one way everywhere: `ID` in the same suite, `SUITE/ID` in
//! another, and scenario ids cannot hold the `/` that would make that ambiguous.

use trellis_dsl::graph::{NeedError, NeedResolver, NeedsGraph};
use trellis_dsl::*;

/// Writes `files` (name, text) into a temporary directory and loads it.
fn load_files(files: &[(&str, &str)]) -> (tempfile::TempDir, Result<Project, Diagnostics>) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let result = load(&[dir.path()], &trellis_engine::protocol::registry::specs());
    (dir, result)
}

fn index(p: &Project, suite: &str, id: &str) -> (usize, usize) {
    let si = p.suites.iter().position(|s| s.name == suite).unwrap();
    let ci = p.suites[si]
        .scenarios
        .iter()
        .position(|s| s.id.value == id)
        .unwrap();
    (si, ci)
}

const X: &str = r#"
agent "demo" protocol="connexity" builtin="booking"
scenario "y" { user "hi"; }
"#;

#[test]
fn a_scenario_id_with_a_slash_is_an_error_not_a_run_that_waits_on_itself() {
    // Used to validate, then hang: validation read `x/y` as suite `x`'s `y`, execution as
    // the scenario itself.
    let z = r#"scenario "x/y" { needs "x/y"; user "hi"; }"#;
    let (_dir, result) = load_files(&[("x.kdl", X), ("z.kdl", z)]);
    let diags = result.expect_err("a `/` in a scenario id must be rejected");
    let messages: Vec<&str> = diags.iter().map(|d| d.message.as_str()).collect();
    assert_eq!(
        messages,
        ["invalid scenario id `x/y`"],
        "{}",
        diags.render_plain()
    );
    let d = diags.iter().next().unwrap();
    assert_eq!(d.code_str(), "trellis::invalid_value");
    assert!(
        d.help_text().unwrap().contains("x-y"),
        "{:?}",
        d.help_text()
    );
}

#[test]
fn cross_suite_and_same_suite_needs_resolve_the_same_way_everywhere() {
    let z = r#"
scenario "setup" { user "hi"; }
scenario "y" { needs "x/y" "setup"; user "hi"; }
"#;
    let (_dir, result) = load_files(&[("x.kdl", X), ("z.kdl", z)]);
    let p = result.unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let zi = index(&p, "z", "y").0;
    let needs = NeedResolver::of(&p);
    let resolve_need = |from, reference| needs.resolve(from, reference);
    assert_eq!(resolve_need(zi, "x/y"), Ok(index(&p, "x", "y")));
    // `y` alone is the same suite's `y`, even though suite `x` has one too.
    assert_eq!(resolve_need(zi, "y"), Ok(index(&p, "z", "y")));
    assert_eq!(resolve_need(zi, "setup"), Ok(index(&p, "z", "setup")));
    assert_eq!(
        resolve_need(zi, "nope/y"),
        Err(NeedError::UnknownSuite {
            suite: "nope".into()
        })
    );
    assert_eq!(
        resolve_need(index(&p, "x", "y").0, "setup"),
        Err(NeedError::UnknownScenario {
            suite: index(&p, "x", "y").0,
            id: "setup".into()
        })
    );

    // The needs graph holds exactly the two edges validation accepted.
    let graph = NeedsGraph::build(&p);
    let mut edges: Vec<((usize, usize), (usize, usize))> = graph
        .graph
        .edge_indices()
        .filter_map(|e| graph.graph.edge_endpoints(e))
        .map(|(a, b)| (graph.graph[a], graph.graph[b]))
        .collect();
    edges.sort();
    let mut expected = vec![
        (index(&p, "x", "y"), index(&p, "z", "y")),
        (index(&p, "z", "setup"), index(&p, "z", "y")),
    ];
    expected.sort();
    assert_eq!(edges, expected);
}

#[test]
fn a_bare_id_never_reaches_into_another_suite() {
    let z = r#"scenario "w" { needs "y"; user "hi"; }"#;
    let (_dir, result) = load_files(&[("x.kdl", X), ("z.kdl", z)]);
    let diags = result.expect_err("`y` is not a scenario of suite `z`");
    let d = diags.iter().next().unwrap();
    assert_eq!(d.message, "undefined scenario `y` in `needs`");
    assert_eq!(
        d.help_text(),
        Some("`y` is a scenario of suite `x`; write `needs \"x/y\"`")
    );
    assert!(d.file.is_some(), "the diagnostic points into z.kdl");
}

/// `needs "m[model=a]"` waits for that one instance of a `matrix` (or `for-each`) scenario,
/// in the same suite or another (whose instance ids may hold `/`); an instance the scenario
/// does not expand into, and `[…]` on a scenario without instances, are errors at the
/// reference that say what there is.
#[test]
fn a_need_may_name_one_instance_and_a_missing_one_is_an_error() {
    let m = r#"
agent "demo" protocol="connexity" builtin="booking"
scenario "m" {
    matrix { model "a" "openai/gpt-4o-mini"; }
    user "hi {{ vars.model }}"
}
scenario "after" { needs "m[model=openai/gpt-4o-mini]"; user "hi"; }
"#;
    let z = r#"scenario "later" { needs "m/m[model=a]"; user "hi"; }"#;
    let (_dir, result) = load_files(&[("m.kdl", m), ("z.kdl", z)]);
    let p = result.unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let graph = NeedsGraph::build(&p);
    let mut edges: Vec<((usize, usize), (usize, usize))> = graph
        .graph
        .edge_indices()
        .filter_map(|e| graph.graph.edge_endpoints(e))
        .map(|(a, b)| (graph.graph[a], graph.graph[b]))
        .collect();
    edges.sort();
    let mut expected = vec![
        (
            index(&p, "m", "m[model=openai/gpt-4o-mini]"),
            index(&p, "m", "after"),
        ),
        (index(&p, "m", "m[model=a]"), index(&p, "z", "later")),
    ];
    expected.sort();
    assert_eq!(edges, expected);

    let z = r#"
scenario "later" { needs "m/m[model=b]"; user "hi"; }
scenario "plain" { user "hi"; }
scenario "other" { needs "plain[x]"; user "hi"; }
"#;
    let (_dir, result) = load_files(&[("m.kdl", m), ("z.kdl", z)]);
    let diags = result.expect_err("no such instances");
    let said: Vec<(String, Option<String>)> = diags
        .iter()
        .map(|d| (d.message.clone(), d.help_text().map(str::to_owned)))
        .collect();
    assert!(
        said.iter()
            .any(|(m, h)| m == "undefined scenario `plain[x]` in `needs`"
                && h.as_deref()
                    .is_some_and(|h| h.contains("write `needs \"plain\"`"))),
        "{said:?}"
    );
    // Named from the suite the reference reads, as it is to be written there.
    assert!(
        said.iter()
            .any(|(m, h)| m == "scenario `m` has no instance `m[model=b]`"
                && h.as_deref() == Some("did you mean `m/m[model=a]`?")),
        "{said:?}"
    );
}
