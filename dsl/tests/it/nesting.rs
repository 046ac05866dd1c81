//! Deeply nested blocks: the decoder descends per block (branches hold branches), bounded by
//! the nesting limit `depth.rs` applies before parsing; a suite just under it decodes, one
//! over it is a `too_deep` diagnostic, never a crash.

use trellis_dsl::*;

fn nested_branches(depth: usize) -> String {
    let mut text = String::from("agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n");
    text.push_str("scenario \"deep\" {\n    user \"hi\"\n");
    for i in 0..depth {
        text.push_str(&format!("branch \"b{i}\" {{ user \"more\"\n"));
    }
    text.push_str("expect reply contains=\"x\"\n");
    for _ in 0..depth {
        text.push_str("}\n");
    }
    text.push_str("}\n");
    text
}

fn load_text(text: &str) -> Result<Project, Diagnostics> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deep.kdl");
    std::fs::write(&path, text).unwrap();
    load(&[&path], &trellis_engine::protocol::registry::specs())
}

#[test]
fn branches_nested_just_under_the_limit_decode_into_nested_forks() {
    // The scenario's block is one level; 127 branches make 128.
    let project =
        load_text(&nested_branches(127)).unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let mut steps: &[Step] = &project.suites[0].scenarios[0].steps;
    let mut forks = 0;
    while let Some(Step {
        kind: StepKind::Fork(branches),
        ..
    }) = steps.last()
    {
        forks += 1;
        steps = &branches[0].steps;
    }
    assert_eq!(forks, 127);
}

#[test]
fn branches_nested_past_the_limit_are_too_deep_not_a_crash() {
    let err = load_text(&nested_branches(128)).expect_err("129 levels are refused");
    let text = err.render_plain();
    assert!(text.contains("trellis::too_deep"), "{text}");
}
