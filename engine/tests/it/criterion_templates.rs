//! Criterion values written as templates are rendered with the scope of a user message
//! (user context, captures, env) and checked against the builtin booking agent, served for
//! real on loopback.

use trellis_engine::record::{CriterionRecord, CriterionStatus, TrajectoryRecord};
use trellis_engine::render::EnvSnapshot;

/// Loads `text` as a suite file, runs it with `env` as the template environment, and returns
/// the finished trajectories.
async fn run(text: &str, env: EnvSnapshot) -> Vec<TrajectoryRecord> {
    crate::support::run_suite(text, 4, env).await.trajectories
}

fn criterion<'a>(t: &'a TrajectoryRecord, text: &str) -> &'a CriterionRecord {
    t.criteria
        .iter()
        .find(|c| c.criterion == text)
        .unwrap_or_else(|| panic!("no criterion `{text}` in {:#?}", t.criteria))
}

const SUITE: &str = r##"
agent "demo" protocol="connexity" builtin="booking"
scenario "templated" {
    user-context {
        postal_code "V4T 0A7"
        zone "V4T0A7"
        day "Tuesday"
        wrong_zone "X1X1X1"
    }
    user "Hi, my postal code is {{ user_context.postal_code }}."
    expect tool "check_service_area" zone="{{ user_context.zone }}"
    capture "price" regex=#"\$(\d+)"#
    user "{{ user_context.day }} works."
    capture "booking" regex=#"confirmation (BK-[0-9A-F]+)"#
    expect reply contains="{{ vars.booking }}" not-contains="{{ env.NOT_IN_THE_REPLY }}"
    user "Please cancel it."
    expect tool "cancel_booking" booking_id="{{ vars.booking }}"
    criteria {
        reply contains="${{ vars.price }}"
        tool "quote_price" zone="{{ user_context.zone }}" service="duct_cleaning"
        tool "check_service_area" zone="{{ user_context.wrong_zone }}"
    }
    expect-tool "create_booking" day="{{ user_context.day }}"
}
"##;

#[tokio::test]
async fn criterion_values_render_from_user_context_captures_and_env() {
    let env = EnvSnapshot::from([("NOT_IN_THE_REPLY".to_string(), "refund".to_string())]);
    let trajectories = run(SUITE, env).await;
    let [t] = trajectories.as_slice() else {
        panic!("one trajectory expected: {trajectories:#?}");
    };
    let passed = |text: &str| {
        let c = criterion(t, text);
        assert_eq!(c.status, CriterionStatus::Passed, "{c:#?}");
    };
    passed(r#"tool "check_service_area" zone="{{ user_context.zone }}""#);
    passed(r#"reply contains="{{ vars.booking }}" not-contains="{{ env.NOT_IN_THE_REPLY }}""#);
    passed(r#"tool "cancel_booking" booking_id="{{ vars.booking }}""#);
    passed(r#"reply contains="${{ vars.price }}""#);
    passed(r#"tool "quote_price" zone="{{ user_context.zone }}" service="duct_cleaning""#);
    passed(r#"expect-tool "create_booking" day="{{ user_context.day }}""#);

    // Rendered, not compared as written: the wrong zone fails and names the rendered value.
    let wrong = criterion(
        t,
        r#"tool "check_service_area" zone="{{ user_context.wrong_zone }}""#,
    );
    assert_eq!(wrong.status, CriterionStatus::Failed, "{wrong:#?}");
    let detail = wrong.detail.as_deref().unwrap_or("");
    assert!(detail.contains(r#"zone="X1X1X1""#), "{detail}");
}

#[tokio::test]
async fn a_criterion_value_that_does_not_render_fails_the_criterion() {
    let suite = r#"
agent "demo" protocol="connexity" builtin="booking"
scenario "unset-env" {
    user "Hi there"
    expect reply contains="{{ env.TRELLIS_TEST_NEVER_SET }}"
}
"#;
    let trajectories = run(suite, EnvSnapshot::new()).await;
    let [t] = trajectories.as_slice() else {
        panic!("one trajectory expected: {trajectories:#?}");
    };
    let c = criterion(t, r#"reply contains="{{ env.TRELLIS_TEST_NEVER_SET }}""#);
    assert_eq!(c.status, CriterionStatus::Failed, "{c:#?}");
    let detail = c.detail.as_deref().unwrap_or("");
    assert!(detail.contains("`TRELLIS_TEST_NEVER_SET`"), "{detail}");
}

/// `reply json-path=… equals="TEMPLATE"` is rendered like `reply equals=`, then compared as a
/// written value: a rendered or literal "300" equals the number 300 of the A2A task's data.
#[tokio::test]
async fn json_path_equals_renders_its_template_whose_text_reads_numbers_and_keeps_literals_json() {
    let suite = r#"
agent "travel" protocol="a2a" builtin="travel"
scenario "task" {
    user-context { wrong "301" }
    user "Book a flight to Rome"
    capture "task" json-path="$.id"
    expect reply json-path="$.id" equals="{{ vars.task }}"
    user "May 1"
    capture "price" json-path="$.artifacts[0].parts[?@.kind == 'data'].data.price"
    expect {
        reply json-path="$.artifacts[0].parts[?@.kind == 'data'].data.price" equals="{{ vars.price }}"
        reply json-path="$.artifacts[0].parts[?@.kind == 'data'].data.price" equals=300
        reply json-path="$.artifacts[0].parts[?@.kind == 'data'].data.price" equals="300"
        reply json-path="$.artifacts[0].parts[?@.kind == 'data'].data.price" equals="{{ user_context.wrong }}"
        reply json-path="$.status.state" equals="{{ 'complete' ~ 'd' }}"
    }
}
"#;
    let trajectories = run(suite, EnvSnapshot::new()).await;
    let [t] = trajectories.as_slice() else {
        panic!("one trajectory expected: {trajectories:#?}");
    };
    let price = "$.artifacts[0].parts[?@.kind == 'data'].data.price";
    let passed = |text: &str| {
        let c = criterion(t, text);
        assert_eq!(c.status, CriterionStatus::Passed, "{c:#?}");
    };
    passed(r#"reply json-path="$.id" equals="{{ vars.task }}""#);
    passed(&format!(
        r#"reply json-path="{price}" equals="{{{{ vars.price }}}}""#
    ));
    passed(&format!(r#"reply json-path="{price}" equals=300"#));
    // A literal string is JSON: "300" is not the number the agent sent.
    let literal = criterion(t, &format!(r#"reply json-path="{price}" equals="300""#));
    assert_eq!(literal.status, CriterionStatus::Failed, "{literal:#?}");
    passed(r#"reply json-path="$.status.state" equals="{{ 'complete' ~ 'd' }}""#);
    let wrong = criterion(
        t,
        &format!(r#"reply json-path="{price}" equals="{{{{ user_context.wrong }}}}""#),
    );
    assert_eq!(wrong.status, CriterionStatus::Failed, "{wrong:#?}");
    let detail = wrong.detail.as_deref().unwrap_or("");
    assert!(detail.ends_with(r#"is 300, expected "301""#), "{detail}");
}
