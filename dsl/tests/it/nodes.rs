//! The agent and scenario settings added for the protocol layer decode to the model, with
//! their defaults when not written.

use trellis_dsl::*;
use trellis_engine::protocol::multiagent::session::DEFAULT_MAX_ACTIONS;
use trellis_engine::protocol::multiagent::{Feedback, MultiAgentRequest, MultiAgentSettings};

fn load_text(text: &str) -> Result<Project, Diagnostics> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kdl");
    std::fs::write(&path, text).unwrap();
    load(&[&path], &trellis_engine::protocol::registry::specs())
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
    assert_eq!(
        full.settings.get("history"),
        Some(&serde_json::json!("full"))
    );
    assert!(full.retry_after_send);
    let plain = p.agent("plain").unwrap();
    assert_eq!(plain.settings.get("history"), None);
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

#[test]
fn multiagent_settings_and_both_socket_spellings() {
    let p = load_text(
        r#"
agent "http" protocol="multiagent" url="http://127.0.0.1:9/execute_task" {
    request "task-only"
    feedback "harness"
    max-actions 8
}
agent "proc" protocol="multiagent" command="python3 agent.py" process="long-lived" cwd="agents" {
    env { AGENT_MODE "strict"; LEVEL "2" }
}
agent "t1" protocol="multiagent" socket="tcp://127.0.0.1:9000" keep-open=#true
agent "t2" protocol="multiagent" socket="tcp:localhost:9001"
agent "u1" protocol="multiagent" socket="unix:///tmp/a.sock"
agent "u2" protocol="multiagent" socket="unix:/tmp/b.sock"
scenario "s" { agent "http"; user "hi"; }
"#,
    )
    .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    // The settings as written, decoded by the protocol's module as the planner does.
    let settings = |id: &str| -> MultiAgentSettings {
        p.agent(id)
            .unwrap()
            .settings
            .decode()
            .unwrap_or_else(|e| panic!("{id}: {e}"))
    };
    let http = &settings("http");
    assert_eq!(http.request, MultiAgentRequest::TaskOnly);
    assert_eq!(http.feedback, Feedback::Harness);
    assert_eq!(http.max_actions, 8);
    let proc = &settings("proc");
    assert_eq!(proc.process, ProcessMode::LongLived);
    assert_eq!(
        proc.env,
        vec![
            ("AGENT_MODE".to_string(), "strict".to_string()),
            ("LEVEL".to_string(), "2".to_string())
        ]
    );
    assert!(proc.cwd.as_ref().unwrap().ends_with("agents"));
    assert!(proc.cwd.as_ref().unwrap().is_absolute());
    let t1 = settings("t1");
    assert!(t1.keep_open);
    assert_eq!(t1.max_actions, DEFAULT_MAX_ACTIONS);
    assert_eq!(t1.process, ProcessMode::PerCall);
    let socket = |id: &str| match &p.agent(id).unwrap().endpoint {
        Endpoint::Socket(address) => address.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        socket("t1"),
        SocketAddress::Tcp {
            host: "127.0.0.1".into(),
            port: 9000
        }
    );
    assert_eq!(
        socket("t2"),
        SocketAddress::Tcp {
            host: "localhost".into(),
            port: 9001
        }
    );
    assert_eq!(socket("u1"), SocketAddress::Unix("/tmp/a.sock".into()));
    assert_eq!(socket("u2"), SocketAddress::Unix("/tmp/b.sock".into()));
    assert!(!settings("u2").keep_open);
}

#[test]
fn builtin_multiagent_agents_choose_their_transport() {
    let p = load_text(
        r#"
agent "http" protocol="multiagent" builtin="support"
agent "proc" protocol="multiagent" builtin="support" transport="process" process="long-lived"
agent "per-call" protocol="multiagent" builtin="support" transport="process"
agent "tcp" protocol="multiagent" builtin="support" { transport "tcp"; keep-open #true; }
agent "unix" protocol="multiagent" builtin="support" transport="unix" request="task-only"
scenario "s" { agent "http"; user "hi"; }
"#,
    )
    .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let settings = |id: &str| -> MultiAgentSettings {
        p.agent(id)
            .unwrap()
            .settings
            .decode()
            .unwrap_or_else(|e| panic!("{id}: {e}"))
    };
    assert_eq!(settings("http").transport, BuiltinTransport::Http);
    assert_eq!(settings("proc").transport, BuiltinTransport::Process);
    assert_eq!(settings("proc").process, ProcessMode::LongLived);
    assert_eq!(settings("per-call").process, ProcessMode::PerCall);
    assert_eq!(settings("tcp").transport, BuiltinTransport::Tcp);
    assert!(settings("tcp").keep_open);
    assert_eq!(settings("unix").transport, BuiltinTransport::Unix);
    assert_eq!(settings("unix").request, MultiAgentRequest::TaskOnly);
    assert!(matches!(
        &p.agent("unix").unwrap().endpoint,
        Endpoint::Builtin(name) if name.value == "support"
    ));
}

#[test]
fn sandbox_nodes_and_state_criteria() {
    let p = load_text(
        r##"
agent "a" protocol="multiagent" url="http://127.0.0.1:9/execute_task"
tool "refund" {
    state path="audit.count" value=1
    mock returns=#"{"status": "success"}"# order_id="A1" {
        state path="orders.0.status" value="refunded"
        state path="/orders/0/meta" json=#"{"by": "agent"}"#
    }
    policy "quantity" max=3
    policy "currency" allowed="EUR" "USD"
    policy max-limit=50
    policy param="total" max-limit=500
}
tool "poll" {
    sequence when-exhausted="error" {
        output #"{"status": "pending"}"#
        output "done"
    }
}
scenario "s" {
    initial-state {
        account { tier "vip"; }
        balance 100
    }
    undeclared-tools "error"
    user "refund A1"
    expect state path="orders.0.status" equals="refunded"
    criteria {
        state path="balance" near=99.5 tolerance=1
        state path="orders.0.status" contains="fund"
        state path="orders.0.status" matches=#"(?i)REFUND"#
        state path="audit" exists=#true
        state path="audit.gone" absent=#true
        state path="audit.other" exists=#false
        violations max=0
        state path="orders.0" equals-json=#"{"id": "A1"}"#
        state path="tags" contains-json=#"["a", "b"]"#
    }
}
scenario "j" {
    initial-state json=#"{"orders": [{"id": "A1", "status": "open"}]}"#
    user "hi"
}
"##,
    )
    .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let refund = p.tool("refund").unwrap();
    assert_eq!(refund.state_changes.len(), 1);
    assert_eq!(refund.state_changes[0].value, serde_json::json!(1));
    let mock = &refund.mocks[0];
    assert_eq!(mock.when["order_id"], "A1");
    assert_eq!(mock.state_changes[0].path, "orders.0.status");
    assert_eq!(
        mock.state_changes[1].value,
        serde_json::json!({"by": "agent"})
    );
    let rules: Vec<(&str, &PolicyRule)> = refund
        .policies
        .iter()
        .map(|p| (p.param.as_str(), &p.rule))
        .collect();
    assert_eq!(
        rules,
        vec![
            ("quantity", &PolicyRule::Maximum(3.0)),
            (
                "currency",
                &PolicyRule::Allowed(vec!["EUR".into(), "USD".into()])
            ),
            ("amount", &PolicyRule::Maximum(50.0)),
            ("total", &PolicyRule::Maximum(500.0)),
        ]
    );
    let poll = p.tool("poll").unwrap().sequence.as_ref().unwrap();
    assert_eq!(poll.when_exhausted, WhenExhausted::Error);
    assert_eq!(
        poll.outputs
            .iter()
            .map(|o| o.value.clone())
            .collect::<Vec<_>>(),
        vec![serde_json::json!({"status": "pending"}), "done".into()]
    );
    assert!(poll.outputs.iter().all(|o| o.when.is_empty()));
    let (_, sc) = p.scenarios().next().unwrap();
    assert_eq!(
        serde_json::Value::Object(sc.initial_state.clone()),
        serde_json::json!({"account": {"tier": "vip"}, "balance": 100})
    );
    let (_, json_form) = p.scenarios().nth(1).unwrap();
    assert_eq!(
        serde_json::Value::Object(json_form.initial_state.clone()),
        serde_json::json!({"orders": [{"id": "A1", "status": "open"}]})
    );
    assert_eq!(json_form.undeclared_tools, UndeclaredTools::Default);
    assert_eq!(sc.undeclared_tools, UndeclaredTools::Error);
    let kinds: Vec<&str> = sc.criteria.iter().map(|c| c.kind.name()).collect();
    assert_eq!(
        kinds,
        ["state"; 6]
            .iter()
            .copied()
            .chain(["violations", "state", "state"])
            .collect::<Vec<_>>()
    );
    let checks: Vec<String> = sc
        .criteria
        .iter()
        .filter_map(|c| match &c.kind {
            CriterionKind::State { check, .. } => Some(format!("{check:?}")),
            _ => None,
        })
        .collect();
    assert!(checks[0].starts_with("Near { value: 99.5, tolerance: 1.0"));
    assert_eq!(checks[3], "Exists");
    assert_eq!(checks[4], "Absent");
    assert_eq!(checks[5], "Absent");
    assert!(matches!(
        sc.criteria[6].kind,
        CriterionKind::Violations { max: 0 }
    ));
    // JSON text for what a KDL value cannot write.
    match &sc.criteria[7].kind {
        CriterionKind::State {
            check: trellis_dsl::StateCheck::Equals(v),
            ..
        } => assert_eq!(v, &serde_json::json!({"id": "A1"})),
        other => panic!("{other:?}"),
    }
    match &sc.criteria[8].kind {
        CriterionKind::State {
            check: trellis_dsl::StateCheck::Contains(v),
            ..
        } => assert_eq!(v, &serde_json::json!(["a", "b"])),
        other => panic!("{other:?}"),
    }
    let broken = load_text(
        r#"
agent "a" protocol="multiagent" builtin="support"
scenario "s" {
    user "hi"
    expect state path="x" equals-json="{not json"
}
"#,
    )
    .unwrap_err()
    .render_plain();
    assert!(broken.contains("invalid JSON"), "{broken}");
}

#[test]
fn scenarios_declare_their_own_tools_and_may_reuse_a_name_across_scenarios() {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one.kdl");
    let two = dir.path().join("two.kdl");
    std::fs::write(
        &one,
        r#"
agent "a" protocol="multiagent" builtin="support"
scenario "one" {
    tool "process_refund" { mock returns="1"; policy max-limit=50; }
    user "refund"
}
"#,
    )
    .unwrap();
    std::fs::write(
        &two,
        r#"
scenario "two" {
    agent "a"
    tool "process_refund" { mock returns="2"; }
    user "refund"
}
"#,
    )
    .unwrap();
    let p = load(&[&one, &two], &trellis_engine::protocol::registry::specs())
        .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    assert!(p.tools.is_empty(), "scenario tools are not project tools");
    let tools: Vec<(String, usize)> = p
        .scenarios()
        .map(|(_, s)| (s.tools[0].name.value.clone(), s.tools[0].policies.len()))
        .collect();
    assert_eq!(
        tools,
        [
            ("process_refund".to_string(), 1),
            ("process_refund".to_string(), 0)
        ]
    );

    let diags = load_text(
        r#"
agent "a" protocol="multiagent" builtin="support"
scenario "s" { tool "t"; tool "t"; user "hi"; }
"#,
    )
    .expect_err("a tool declared twice in one scenario");
    let first = diags.iter().next().unwrap();
    assert_eq!(first.code_str(), "trellis::duplicate_id");
    assert!(
        first
            .to_string()
            .contains("tool `t` is declared twice in scenario `s`"),
        "{first}"
    );
}

#[test]
fn a_scenario_tool_without_a_multiagent_agent_is_an_error_not_a_silent_no_op() {
    let diags = load_text(
        r#"
agent "a" protocol="connexity" builtin="booking"
scenario "s" {
    user "book it"
    tool "create_booking"
}
"#,
    )
    .expect_err("a forgotten `expect` before a tool check");
    let first = diags.iter().next().unwrap();
    assert_eq!(first.code_str(), "trellis::invalid_value");
    let text = diags.render_plain();
    assert!(text.contains("expect tool \"create_booking\""), "{text}");
}

#[test]
fn provider_limits_prices_and_headers() {
    let p = load_text(
        r#"
provider "local" kind="openai" base-url="http://127.0.0.1:8080/v1" model="m" \
    api-key-env="LOCAL_KEY" temperature=0.3 max-tokens=256 timeout="90s" retries=3 \
    concurrency=1 requests-per-minute=60 tokens-per-minute=20000 \
    input-price=0.15 output-price=0.6 {
    header "X-Team" "evals"
    header "X-Other" "1"
}
provider "bare" kind="anthropic"
"#,
    )
    .unwrap();
    let local = p.provider("local").unwrap();
    assert_eq!(local.temperature, Some(0.3));
    assert_eq!(local.max_tokens, Some(256));
    assert_eq!(local.timeout, Some(std::time::Duration::from_secs(90)));
    assert_eq!(local.retries, Some(3));
    assert_eq!(local.concurrency, Some(1));
    assert_eq!(local.requests_per_minute, Some(60));
    assert_eq!(local.tokens_per_minute, Some(20000));
    assert_eq!(
        (local.input_price, local.output_price),
        (Some(0.15), Some(0.6))
    );
    assert_eq!(
        local.headers,
        [
            ("X-Team".to_string(), "evals".to_string()),
            ("X-Other".to_string(), "1".to_string())
        ]
    );
    let bare = p.provider("bare").unwrap();
    assert_eq!(bare.kind, ProviderKind::Anthropic);
    assert_eq!(
        (bare.timeout, bare.retries, bare.concurrency),
        (None, None, None)
    );
    assert!(bare.headers.is_empty());
}

#[test]
fn openai_agents_take_max_tool_rounds_and_stream_only_when_asked() {
    let p = load_text(
        r#"
agent "plain" protocol="openai" base-url="http://127.0.0.1:9/v1" model="m"
agent "capped" protocol="openai" base-url="http://127.0.0.1:9/v1" model="m" max-tool-rounds=2 stream=#true
agent "weather" protocol="agentscope" builtin="weather"
scenario "s" { agent "plain"; user "hi"; }
"#,
    )
    .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let plain = p.agent("plain").unwrap();
    // Defaults (whether an agent streams, how many tool rounds it takes) when a setting is
    // not written are its protocol module's call.
    assert_eq!(
        (
            plain.settings.get("max-tool-rounds"),
            plain.settings.get("stream")
        ),
        (None, None)
    );
    let capped = p.agent("capped").unwrap();
    assert_eq!(
        (
            capped.settings.get("max-tool-rounds"),
            capped.settings.get("stream")
        ),
        (Some(&serde_json::json!(2)), Some(&serde_json::json!(true)))
    );
    assert_eq!(p.agent("weather").unwrap().settings.get("stream"), None);
}

#[test]
fn max_tool_rounds_is_an_error_on_other_protocols_and_below_one() {
    for (agent, needle) in [
        (
            r#"agent "a" protocol="connexity" builtin="booking" max-tool-rounds=3"#,
            "`max-tool-rounds` is a setting of",
        ),
        (
            r#"agent "a" protocol="openai" base-url="http://127.0.0.1:9/v1" model="m" max-tool-rounds=0"#,
            "max-tool-rounds",
        ),
    ] {
        let diags = load_text(&format!("{agent}\nscenario \"s\" {{ user \"hi\"; }}\n"))
            .expect_err("an invalid max-tool-rounds");
        let text = diags.render_plain();
        assert!(text.contains(needle), "{text}");
    }
}

#[test]
fn anthropic_agents_are_models_and_may_stream() {
    let p = load_text(
        r#"
agent "claude" protocol="anthropic" base-url="https://api.anthropic.com/v1" model="m" max-tool-rounds=3
scenario "s" { user "hi"; }
"#,
    )
    .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let claude = p.agent("claude").unwrap();
    assert_eq!(claude.protocol.as_str(), "anthropic");
    assert_eq!(
        (
            claude.settings.get("max-tool-rounds"),
            claude.settings.get("stream")
        ),
        (Some(&serde_json::json!(3)), None)
    );

    let streamed = load_text(
        r#"
agent "claude" protocol="anthropic" base-url="https://api.anthropic.com/v1" model="m" stream=#true
scenario "s" { user "hi"; }
"#,
    )
    .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    assert_eq!(
        streamed.agent("claude").unwrap().settings.get("stream"),
        Some(&serde_json::json!(true))
    );
}

/// `user-context json=…` holds what the block cannot write (one-element arrays, arrays of
/// objects); `no-tool` alone is "no tool call at all".
#[test]
fn user_context_json_and_no_tool_alone() {
    let p = load_text(
        r##"
agent "a" protocol="connexity" builtin="booking"
scenario "s" {
    user-context json=#"{"items": ["filter"], "orders": [{"id": 1}]}"#
    user "Order {{ user_context.items }}"
    criteria { no-tool; no-tool "cancel_booking"; }
}
"##,
    )
    .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let s = &p.suites[0].scenarios[0];
    assert_eq!(
        serde_json::Value::Object(s.user_context.clone()),
        serde_json::json!({"items": ["filter"], "orders": [{"id": 1}]})
    );
    let kinds: Vec<&CriterionKind> = s.criteria.iter().map(|c| &c.kind).collect();
    assert!(matches!(kinds[0], CriterionKind::NoTool { name: None }));
    assert!(matches!(kinds[1], CriterionKind::NoTool { name: Some(n) } if n == "cancel_booking"));

    let bad = load_text(
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\nscenario \"s\" {\n    user-context json=\"[1]\"\n    user \"hi\"\n}\n",
    );
    let text = bad.err().map(|d| d.render_plain()).unwrap_or_default();
    assert!(
        text.contains("the user context must be a JSON object, not an array"),
        "{text}"
    );
}

/// `simulator` inside a scenario or a branch: the innermost one reaches each `simulate`
/// step; an unknown provider is an error.
#[test]
fn scenario_and_branch_simulators_reach_their_steps() {
    let p = load_text(
        r#"
agent "a" protocol="connexity" builtin="booking"
provider "p" kind="openai" base-url="http://127.0.0.1:9" model="m"
provider "q" kind="openai" base-url="http://127.0.0.1:9" model="m"
scenario "s" {
    simulator provider="p"
    simulate turns=1
    branch "one" { simulator provider="q" model="x"; simulate turns=1; }
    branch "two" { simulate turns=1; }
}
"#,
    )
    .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let steps = &p.suites[0].scenarios[0].steps;
    let provider = |step: &Step| match &step.kind {
        StepKind::Simulate { simulator, .. } => simulator
            .as_ref()
            .and_then(|s| s.provider.as_ref())
            .map(|p| p.value.clone()),
        other => panic!("{other:?}"),
    };
    assert_eq!(provider(&steps[0]).as_deref(), Some("p"));
    let StepKind::Fork(branches) = &steps[1].kind else {
        panic!("{:?}", steps[1].kind)
    };
    assert_eq!(provider(&branches[0].steps[0]).as_deref(), Some("q"));
    assert_eq!(provider(&branches[1].steps[0]).as_deref(), Some("p"));

    let text = load_text(
        r#"
agent "a" protocol="connexity" builtin="booking"
provider "p" kind="openai" base-url="http://127.0.0.1:9" model="m"
scenario "s" {
    simulator provider="nope"
    simulate turns=1
    branch "b" { simulator provider="p" instructions="hi"; simulate turns=1; }
}
"#,
    )
    .err()
    .map(|d| d.render_plain())
    .unwrap_or_default();
    assert!(text.contains("nope"), "{text}");
    assert!(!text.contains("instructions"), "{text}");
}

/// A branch's `persona` reaches its `simulate` steps; a named one must exist.
#[test]
fn a_branch_persona_reaches_its_steps_and_must_exist() {
    let text = load_text(
        r#"
agent "a" protocol="connexity" builtin="booking"
provider "p" kind="openai" base-url="http://127.0.0.1:9" model="m"
scenario "s" {
    user "hi"
    branch "b" { persona "ghost"; simulate turns=1; }
    branch "c" { simulate turns=1; }
}
"#,
    )
    .err()
    .map(|d| d.render_plain())
    .unwrap_or_default();
    assert!(text.contains("ghost"), "{text}");
}

#[test]
fn a_connexity_scenario_accepts_tools_with_answers_but_not_bare_ones() {
    // Imported Connexity cases carry mock answers for an engine-run agent under test; a
    // Connexity agent runs its own tools and ignores them.
    let p = load_text(
        r##"
agent "c" protocol="connexity" builtin="booking"
scenario "s" {
    agent "c"
    tool "lookup_order" {
        sequence when-exhausted="error" {
            output #"{"status": "shipped"}"# order_id="ORD-1" note=#null
            output "any"
        }
    }
    user "hi"
}
"##,
    )
    .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let (_, scenario) = p.scenarios().next().unwrap();
    let sequence = scenario.tools[0].sequence.as_ref().unwrap();
    assert_eq!(
        sequence.outputs[0],
        SequenceOutput {
            value: serde_json::json!({"status": "shipped"}),
            when: serde_json::json!({"order_id": "ORD-1", "note": null})
                .as_object()
                .cloned()
                .unwrap(),
        }
    );
    assert!(sequence.outputs[1].when.is_empty());

    let diags = load_text(
        r#"
agent "c" protocol="connexity" builtin="booking"
scenario "s" { agent "c"; tool "lookup_order"; user "hi"; }
"#,
    )
    .expect_err("a bare scenario tool on a connexity agent is most likely a missing `expect`");
    assert!(
        diags
            .render_plain()
            .contains("none of its agents speaks `multiagent`")
    );
}

/// A scenario's or branch's `simulator` may leave out `provider`: it is a layer over the
/// enclosing simulator (here: instructions and a prompt only). The project's needs one.
#[test]
fn a_nested_simulator_is_a_layer_and_the_project_one_needs_a_provider() {
    let p = load_text(
        r#"
agent "a" protocol="connexity" builtin="booking"
provider "p" kind="openai" base-url="http://127.0.0.1:9" model="m"
scenario "s" {
    simulator temperature=0.2
    simulate turns=1
    branch "hurry" {
        simulator instructions="Be quick." {
            system-prompt "{{ instructions }} {{ end_marker }}"
        }
        simulate turns=1
    }
    branch "calm" { simulate turns=1; }
}
"#,
    )
    .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let steps = &p.suites[0].scenarios[0].steps;
    let StepKind::Fork(branches) = &steps[1].kind else {
        panic!("{:?}", steps[1].kind)
    };
    let StepKind::Simulate {
        simulator: Some(hurry),
        ..
    } = &branches[0].steps[0].kind
    else {
        panic!("{:?}", branches[0].steps[0].kind)
    };
    let layers: Vec<_> = hurry
        .layers()
        .map(|l| {
            (
                l.instructions.as_ref().map(|t| t.source.as_str()),
                l.temperature,
                l.system_prompt.is_some(),
            )
        })
        .collect();
    assert_eq!(
        layers,
        [(Some("Be quick."), None, true), (None, Some(0.2), false)]
    );

    let text = load_text(
        r#"
agent "a" protocol="connexity" builtin="booking"
provider "p" kind="openai" base-url="http://127.0.0.1:9" model="m"
simulator instructions="hi"
scenario "s" { simulate turns=1; }
"#,
    )
    .err()
    .map(|d| d.render_plain())
    .unwrap_or_default();
    assert!(text.contains("provider="), "{text}");
}

#[test]
fn a_local_providers_calls_get_more_time_than_a_hosted_ones() {
    let p = load_text(
        r#"
provider "local" kind="openai" base-url="http://127.0.0.1:8080/v1" model="m"
provider "hosted" kind="openai" model="m"
provider "set" kind="openai" base-url="http://127.0.0.1:8080/v1" model="m" timeout="45s"
"#,
    )
    .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let timeout = |id: &str| p.provider(id).unwrap().call_timeout().as_secs();
    assert_eq!(timeout("local"), 300);
    assert_eq!(timeout("hosted"), 120);
    assert_eq!(timeout("set"), 45);
}

/// The loader knows protocols only as the specs it is handed: a protocol that is nowhere in
/// the dsl crate (a test registry here) gets its name, endpoints, builtin agents and settings
/// checked like the engine's, and its settings are rejected on the other protocols.
#[test]
fn protocols_are_the_registry_the_loader_is_handed() {
    use trellis_dsl::lang::{
        ArgSpec, Capabilities, EndpointKind, NodeSpec, ProtocolSpec, ValueType,
    };
    const ECHO: ProtocolSpec = ProtocolSpec {
        name: "echo",
        help: "answers what it is sent",
        endpoints: &[EndpointKind::Url, EndpointKind::Builtin],
        settings: &[
            NodeSpec::setting(
                "voice",
                &[ArgSpec::value(ValueType::String)],
                "how it answers",
            ),
            NodeSpec {
                name: "echoes",
                form: trellis_dsl::lang::Form::Node,
                args: &[],
                props: &[],
                children: trellis_dsl::lang::Children::Data,
                repeatable: false,
                protocols: None,
                help: "a block of echo settings",
            },
        ],
        capabilities: Capabilities {
            streams: false,
            forks: true,
            measures_ttft: false,
            engine_runs_tools: false,
            session_bound: false,
            speaks_first: true,
            model_api: false,
            function_calls: false,
            pauses: false,
            agent_branches: false,
            provider_plays_llm: false,
            carries_tool_mocks: false,
        },
        builtins: &["parrot"],

        check: None,
    };
    let registry = || {
        let mut specs = trellis_engine::protocol::registry::specs();
        specs.push(&ECHO);
        specs
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("suite.kdl");
    let good = r#"agent "e" protocol="echo" builtin="parrot" voice="loud" {
    echoes { twice #true; words "a" }
}
scenario "s" { user "hi"; expect no-error }
"#;
    std::fs::write(&path, good).unwrap();
    let project = load(&[&path], &registry()).unwrap_or_else(|d| panic!("{}", d.render_plain()));
    assert_eq!(project.agents[0].protocol.as_str(), "echo");
    // Its settings reach its module as written: a value, and a data block as an object.
    let settings = &project.agents[0].settings;
    assert_eq!(settings.get("voice"), Some(&serde_json::json!("loud")));
    assert_eq!(
        settings.get("echoes"),
        Some(&serde_json::json!({"twice": true, "words": "a"}))
    );
    // Without the spec the protocol is unknown.
    let text = load(&[&path], &trellis_engine::protocol::registry::specs())
        .unwrap_err()
        .render_plain();
    assert!(text.contains("invalid protocol `echo`"), "{text}");

    let bad = r#"agent "c" protocol="connexity" url="http://127.0.0.1:1/agent/respond" voice="loud" {
    echoes { twice #true }
}
agent "e" protocol="echo" command="echo" builtin="parot"
scenario "s" { agent "c"; user "hi"; expect no-error }
"#;
    std::fs::write(&path, bad).unwrap();
    let text = load(&[&path], &registry()).unwrap_err().render_plain();
    assert!(
        text.contains("`voice` is an `echo` setting; agent `c` is `connexity`"),
        "{text}"
    );
    assert!(
        text.contains("`echoes` is an `echo` setting; agent `c` is `connexity`"),
        "{text}"
    );
    assert!(
        text.contains("`command` is not supported by protocol `echo`"),
        "{text}"
    );
    assert!(
        text.contains("`echo` agents use url=…, builtin=…"),
        "{text}"
    );
    assert!(text.contains("unknown builtin agent `parot`"), "{text}");
    assert!(text.contains("did you mean `parrot`?"), "{text}");
}

/// A matrix's instances carry their own values only: each cloned the whole matrix, so a
/// matrix of 4,000 values held 16 million of them (534 MB for `trellis check`). Values
/// written twice (in NFC, as ids are compared) are still one error each.
#[test]
fn matrix_instances_hold_their_own_values_not_the_matrix() {
    let values: Vec<String> = (0..300).map(|i| i.to_string()).collect();
    let p = load_text(&format!(
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"m\" {{\n    matrix {{\n        n {}\n    }}\n    user \"Hi {{{{ vars.n }}}}\"\n}}\n",
        values.join(" ")
    ))
    .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let instances = &p.suites[0].scenarios;
    assert_eq!(instances.len(), 300);
    for (i, sc) in instances.iter().enumerate() {
        assert!(sc.matrix.is_empty(), "{} holds the matrix", sc.id.value);
        let vars = &sc.instance.as_ref().unwrap().vars;
        assert_eq!(vars, &[("n".to_owned(), serde_json::json!(i))]);
    }

    let twice = load_text(
        "agent \"a\" protocol=\"connexity\" builtin=\"booking\"\n\
         scenario \"m\" {\n    matrix {\n        city \"caf\u{e9}\" \"x\" \"cafe\u{301}\" \"x\"\n    }\n    \
         user \"Hi {{ vars.city }}\"\n}\n",
    )
    .map(|_| ())
    .unwrap_err()
    .render_plain();
    assert_eq!(twice.matches("is given twice").count(), 2, "{twice}");
}

#[test]
fn params_json_adds_arguments_a_key_value_cannot_write() {
    let p = load_text(
        r##"
agent "a" protocol="multiagent" builtin="support"
tool "order" {
    mock returns="two" qty=1 params-json=#"{"returns": 2, "address": {"city": "Rome"}}"#
}
scenario "s" {
    user "order"
    capture "x" regex=#"(\w+)"#
    expect tool "order" count=1 params-json=#"{"count": 3, "tag": "{{ vars.x }}"}"#
}
"##,
    )
    .unwrap_or_else(|d| panic!("{}", d.render_plain()));
    let mock = &p.tools[0].mocks[0];
    assert_eq!(
        serde_json::Value::Object(mock.when.clone()),
        serde_json::json!({"qty": 1, "returns": 2, "address": {"city": "Rome"}})
    );
    assert_eq!(mock.returns, serde_json::json!("two"));
    let (_, sc) = p.scenarios().next().unwrap();
    let expects: Vec<&trellis_dsl::Criterion> = sc
        .steps
        .iter()
        .filter_map(|s| match &s.kind {
            trellis_dsl::StepKind::Expect(c) => Some(c.iter()),
            _ => None,
        })
        .flatten()
        .collect();
    match &expects[0].kind {
        CriterionKind::Tool { params, count, .. } => {
            assert_eq!(*count, Some(1));
            assert_eq!(
                serde_json::Value::Object(params.clone()),
                serde_json::json!({"count": 3, "tag": "{{ vars.x }}"})
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        expects[0].templates.len(),
        1,
        "the string member is a template"
    );
}

#[test]
fn the_checks_of_a_misspelt_criteria_block_are_checked_too() {
    let diags = load_text(
        r#"
agent "a" protocol="connexity" builtin="booking"
scenario "s" {
    user "book it"
    critera {
        reply contians="booked"
        no-eror
    }
}
"#,
    )
    .expect_err("a misspelt block");
    let text = diags.render_plain();
    assert!(text.contains("did you mean `criteria`?"), "{text}");
    assert!(text.contains("did you mean `contains`?"), "{text}");
    assert!(text.contains("did you mean `no-error`?"), "{text}");
    assert_eq!(diags.iter().count(), 3, "{text}");
}
