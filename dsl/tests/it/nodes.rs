//! The agent and scenario settings added for the protocol layer decode to the model, with
//! their defaults when not written.

use trellis_dsl::*;

fn load_text(text: &str) -> Result<Project, Diagnostics> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kdl");
    std::fs::write(&path, text).unwrap();
    load(&[&path])
}

#[test]
fn history_retry_after_send_and_first_turn() {
    let p = load_text(
        r#"
agent "full" protocol="connexity" builtin="booking" history="full" retry-after-send=#true
agent "plain" protocol="connexity" url="http://127.0.0.1:9/agent/respond"
agent "weather" protocol="agentscope" builtin="weather" { retry-after-send #true; }
agent "numbers" protocol="fixie" builtin="numbers"
scenario "greeted" {
    agent "full"
    first-turn "agent"
    expect reply contains="Hi"
    user "hello"
}
scenario "plain" { agent "plain"; user "hi"; }
scenario "sum" { agent "numbers"; call "add" "1 2"; expect reply equals="3"; }
"#,
    )
    .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let full = p.agent("full").unwrap();
    assert_eq!(full.history, History::Full);
    assert!(full.retry_after_send);
    let plain = p.agent("plain").unwrap();
    assert_eq!(plain.history, History::Messages);
    assert!(!plain.retry_after_send);
    assert!(p.agent("weather").unwrap().retry_after_send);
    assert!(matches!(
        &p.agent("numbers").unwrap().endpoint,
        Endpoint::Builtin(name) if name.value == "numbers"
    ));
    let scenario = |id: &str| p.scenarios().find(|(_, s)| s.id.value == id).unwrap().1;
    // An `expect` before any user step is fine when the agent speaks first.
    assert_eq!(scenario("greeted").first_turn, FirstTurn::Agent);
    assert_eq!(scenario("plain").first_turn, FirstTurn::User);
}

#[test]
fn an_expect_before_any_turn_is_still_an_error_when_the_user_speaks_first() {
    let diags = load_text(
        r#"
agent "a" protocol="connexity" builtin="booking"
scenario "s" { first-turn "user"; expect no-error; user "hi"; }
"#,
    )
    .expect_err("no turn before the expect");
    assert_eq!(
        diags.iter().next().unwrap().code_str(),
        "trellis::no_turn_yet"
    );
}
