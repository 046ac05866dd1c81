//! The complete example of the suite language contract (kept as `tests/ok/booking.kdl`, plus a
//! suite using shared definitions through `include`) loads without errors and decodes to the
//! expected model.

use std::time::Duration;

use serde_json::json;
use trellis_dsl::*;

fn load_ok() -> Project {
    match load(&["tests/ok"], &trellis_engine::protocol::registry::specs()) {
        Ok(p) => p,
        Err(d) => panic!("unexpected errors:\n{}", d.render_plain()),
    }
}

/// The source text a span points at.
fn text(p: &Project, span: Span) -> &str {
    let f = p.file(span.file);
    &f.text[span.span.offset()..span.span.offset() + span.span.len()]
}

fn suite<'a>(p: &'a Project, name: &str) -> &'a Suite {
    p.suites.iter().find(|s| s.name == name).unwrap()
}

fn scenario<'a>(p: &'a Project, suite_name: &str, id: &str) -> &'a Scenario {
    suite(p, suite_name)
        .scenarios
        .iter()
        .find(|s| s.id.value == id)
        .unwrap()
}

fn user_text(step: &Step) -> &str {
    match &step.kind {
        StepKind::User(t) => &t.source,
        other => panic!("expected a user step, got {other:?}"),
    }
}

#[test]
fn files_and_suites() {
    let p = load_ok();
    let names: Vec<&str> = p.files.iter().map(|f| f.name.as_str()).collect();
    // The shared file is reached both through the directory and the include: loaded once.
    assert_eq!(
        names,
        [
            "tests/ok/booking.kdl",
            "tests/ok/refunds.kdl",
            "tests/ok/shared/definitions.kdl"
        ]
    );
    let suites: Vec<&str> = p.suites.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(suites, ["booking", "refunds"]);
    let booking = suite(&p, "booking");
    assert_eq!(
        booking.description.as_deref(),
        Some("Duct-cleaning booking agent")
    );
    assert_eq!(booking.tags, ["smoke"]);
    assert_eq!(booking.scenarios.len(), 1);
}

#[test]
fn agents_and_endpoints() {
    let p = load_ok();
    let ids: Vec<&str> = p.agents.iter().map(|a| a.id.value.as_str()).collect();
    assert_eq!(
        ids,
        ["demo", "staging", "llm", "multi", "sock", "scope", "fx"]
    );

    let demo = p.agent("demo").unwrap();
    assert_eq!(demo.protocol.as_str(), "connexity");
    assert!(matches!(&demo.endpoint, Endpoint::Builtin(b) if b.value == "booking"));
    assert_eq!(text(&p, demo.id.span), "\"demo\"");
    assert_eq!(demo.max_response_size, DEFAULT_MAX_RESPONSE_SIZE);

    let staging = p.agent("staging").unwrap();
    assert!(
        matches!(&staging.endpoint, Endpoint::Url(u) if u.source == "https://staging.example.com/agent/respond")
    );
    // Written as before URLs were templates: the scenario fingerprints hash this text.
    assert_eq!(
        format!("{:?}", staging.endpoint),
        r#"Url("https://staging.example.com/agent/respond")"#
    );
    assert_eq!(staging.headers.len(), 1);
    assert_eq!(staging.headers[0].0, "Authorization");
    assert_eq!(
        staging.headers[0].1.source,
        "Bearer {{ env.BOOKING_TOKEN }}"
    );
    assert_eq!(staging.timeout, Some(Duration::from_secs(30)));
    assert_eq!(staging.retries, 2);
    assert_eq!(staging.concurrency, Some(16));

    let llm = p.agent("llm").unwrap();
    assert_eq!(llm.protocol.as_str(), "openai");
    assert!(matches!(&llm.endpoint, Endpoint::Url(u) if u.source == "http://127.0.0.1:9/v1"));
    assert_eq!(llm.model.as_deref(), Some("gpt-4o-mini"));
    assert_eq!(llm.max_response_size, 512 * 1024);
    assert_eq!(llm.timeout, Some(Duration::from_secs(10)));
    assert_eq!(
        llm.settings.get("system-prompt"),
        Some(&serde_json::json!(
            "You are a support agent for {{ scenario.name }}."
        ))
    );
    assert_eq!(
        llm.settings.get("tools"),
        Some(&serde_json::json!(["refund"]))
    );

    let multi = p.agent("multi").unwrap();
    assert!(matches!(&multi.endpoint, Endpoint::Command(c) if c == "python3 agent.py"));
    assert_eq!(multi.concurrency, Some(4));
    let sock = p.agent("sock").unwrap();
    assert!(
        matches!(&sock.endpoint, Endpoint::Socket(SocketAddress::Tcp { host, port: 9000 }) if host == "127.0.0.1")
    );
    let scope = p.agent("scope").unwrap();
    assert_eq!(scope.protocol.as_str(), "agentscope");
    assert_eq!(scope.settings.get("stream"), Some(&json!(false)));
    let fx = p.agent("fx").unwrap();
    assert_eq!(fx.protocol.as_str(), "fixie");
    assert_eq!(fx.max_response_size, 1024);
}

#[test]
fn shared_definitions() {
    let p = load_ok();
    let persona = p.persona("polite-customer").unwrap();
    assert_eq!(persona.kind, "polite-customer");
    assert_eq!(
        persona.instructions.as_deref(),
        Some("Answer briefly. Give your postal code when asked.")
    );

    let provider = p.provider("oai").unwrap();
    assert_eq!(provider.kind, ProviderKind::OpenAi);
    assert_eq!(
        provider.api_key_env.as_ref().map(|v| v.value.as_str()),
        Some("OPENAI_API_KEY")
    );

    let sim = p.simulator.as_ref().unwrap();
    assert_eq!(sim.provider.as_ref().map(|p| p.value.as_str()), Some("oai"));
    assert_eq!(sim.temperature, Some(0.3));
    assert!(sim.instructions.is_some());

    let judge = p.judge("strict").unwrap();
    assert_eq!(judge.provider.value, "oai");
    assert_eq!(judge.threshold, Some(0.8));
    assert_eq!(judge.temperature, Some(0.0));
    assert_eq!(judge.rubric.as_deref(), Some("Be strict."));

    let tool = p.tool("refund").unwrap();
    assert_eq!(tool.description.as_deref(), Some("Refund a customer"));
    assert_eq!(tool.params.len(), 2);
    assert_eq!(tool.params[0].name, "amount");
    assert_eq!(tool.params[0].ty, "number");
    assert!(tool.params[0].required);
    assert_eq!(tool.params[1].ty, "string");
    assert!(!tool.params[1].required);
    assert_eq!(tool.mocks.len(), 2);
    assert_eq!(tool.mocks[0].returns, json!({"status": "ok", "id": 7}));
    assert_eq!(
        serde_json::Value::Object(tool.mocks[0].when.clone()),
        json!({"amount": 20})
    );
    assert_eq!(tool.mocks[1].returns, json!("declined"));
    assert!(tool.mocks[1].when.is_empty());
    assert_eq!(tool.policies.len(), 1);
    assert_eq!(tool.policies[0].param, "amount");
    assert_eq!(tool.policies[0].rule, PolicyRule::Maximum(50.0));
}

#[test]
fn booking_scenario() {
    let p = load_ok();
    let sc = scenario(&p, "booking", "book-duct-cleaning");
    assert_eq!(
        sc.name.as_deref(),
        Some("Booking — happy path with follow-ups")
    );
    assert_eq!(sc.difficulty, Difficulty::Normal);
    assert_eq!(sc.status, Status::Active);
    assert_eq!(sc.tags, ["happy-path", "booking"]);
    assert_eq!(
        sc.agents
            .iter()
            .map(|a| a.value.as_str())
            .collect::<Vec<_>>(),
        ["demo"]
    );
    // Spans are byte offsets, also after the non-ASCII dash above.
    assert_eq!(text(&p, sc.agents[0].span), "\"demo\"");
    assert!(matches!(&sc.persona, Some(PersonaRef::Named(n)) if n.value == "polite-customer"));
    assert_eq!(
        serde_json::Value::Object(sc.user_context.clone()),
        json!({"postal_code": "V4T 0A7", "preferred_day": "Tuesday"})
    );
    assert_eq!(sc.max_turns, Some(8));
    assert_eq!(sc.repeat, 3);
    assert!(sc.needs.is_empty());

    let steps = &sc.steps;
    assert_eq!(steps.len(), 7);
    assert_eq!(
        user_text(&steps[0]),
        "Hi, I'd like to book a duct cleaning."
    );
    match &steps[1].kind {
        StepKind::Expect(c) => {
            assert_eq!(c.len(), 1);
            assert_eq!(c[0].text, "reply contains=\"postal code\"");
            assert!(matches!(&c[0].kind, CriterionKind::Reply(r)
                if matches!(r.as_slice(), [ReplyCheck::Contains(s)] if s == "postal code")));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(user_text(&steps[2]), "It's {{ user_context.postal_code }}.");
    match &steps[3].kind {
        StepKind::Expect(c) => {
            assert_eq!(c[0].text, "tool \"check_service_area\" zone=\"V4T0A7\"");
            match &c[0].kind {
                CriterionKind::Tool {
                    name,
                    params,
                    count,
                    loose: false,
                } => {
                    assert_eq!(name, "check_service_area");
                    assert_eq!(
                        serde_json::Value::Object(params.clone()),
                        json!({"zone": "V4T0A7"})
                    );
                    assert_eq!(*count, None);
                }
                other => panic!("{other:?}"),
            }
        }
        other => panic!("{other:?}"),
    }
    match &steps[4].kind {
        StepKind::Capture {
            name,
            source: CaptureSource::Regex(re),
        } => {
            assert_eq!(name, "quote");
            assert_eq!(re.as_str(), r"\$(\d+)");
            assert_eq!(
                re.captures("It is $120.").unwrap().get(1).unwrap().as_str(),
                "120"
            );
        }
        other => panic!("{other:?}"),
    }
    match &steps[5].kind {
        StepKind::Fork(branches) => {
            assert_eq!(branches.len(), 2);
            assert_eq!(branches[0].name.value, "accepts");
            assert_eq!(branches[1].name.value, "asks-price");
            assert_eq!(
                user_text(&branches[0].steps[0]),
                "{{ user_context.preferred_day }} works."
            );
            match &branches[0].steps[1].kind {
                StepKind::Expect(c) => {
                    assert_eq!(c[0].text, "reply matches=#\"(?i)booked|confirmed\"#");
                    assert!(matches!(&c[0].kind, CriterionKind::Reply(r)
                        if matches!(r.as_slice(), [ReplyCheck::Matches(re)] if re.is_match("Booked!"))));
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(user_text(&branches[1].steps[0]), "How much is that?");
            match &branches[1].steps[1].kind {
                StepKind::Expect(c) => {
                    let kinds: Vec<&str> = c.iter().map(|c| c.kind.name()).collect();
                    assert_eq!(kinds, ["reply", "latency"]);
                    assert!(
                        matches!(c[1].kind, CriterionKind::Latency { max } if max == Duration::from_secs(2))
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        other => panic!("{other:?}"),
    }
    // The merge step runs after the fork group.
    assert_eq!(user_text(&steps[6]), "Thanks, bye.");
    assert_eq!(text(&p, steps[6].span), "user \"Thanks, bye.\"");

    let kinds: Vec<&str> = sc.criteria.iter().map(|c| c.kind.name()).collect();
    assert_eq!(
        kinds,
        ["tool", "no-tool", "no-error", "turns", "outcome", "judge"]
    );
    assert!(matches!(
        &sc.criteria[3].kind,
        CriterionKind::Turns { max: 8 }
    ));
    assert!(matches!(&sc.criteria[4].kind,
        CriterionKind::Outcome(Outcome::Statement(s)) if s.starts_with("Agent MUST confirm")));
    match &sc.criteria[5].kind {
        CriterionKind::Judge {
            criterion,
            threshold,
            judge,
            rubric,
        } => {
            assert!(criterion.starts_with("The agent never asks"));
            assert_eq!(*threshold, Some(0.7));
            assert!(judge.is_none() && rubric.is_none());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn refund_scenario() {
    let p = load_ok();
    let sc = scenario(&p, "refunds", "small-refund");
    assert_eq!(
        sc.agents
            .iter()
            .map(|a| a.value.as_str())
            .collect::<Vec<_>>(),
        ["llm", "multi"]
    );
    match &sc.persona {
        Some(PersonaRef::Inline(persona)) => {
            assert_eq!(persona.kind, "angry-customer");
            assert_eq!(persona.description.as_deref(), Some("Wants money back"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        serde_json::Value::Object(sc.user_context.clone()),
        json!({"order": {"id": "A-1", "total": 20.5}, "items": ["mug", "plate"], "vip": false})
    );
    assert_eq!(sc.outcomes.len(), 2);
    assert!(
        matches!(&sc.outcomes[0].value, Outcome::Statement(s) if s == "Agent MUST initiate the refund")
    );
    assert!(matches!(&sc.outcomes[1].value,
        Outcome::Labeled { label, value } if label == "refund_status" && value == "initiated"));
    assert_eq!(sc.expect_tools.len(), 1);
    assert_eq!(sc.expect_tools[0].text, "expect-tool \"refund\" amount=20");
    assert!(
        matches!(&sc.expect_tools[0].kind, CriterionKind::Tool { name, .. } if name == "refund")
    );
    assert_eq!(
        sc.criteria_override.as_ref().map(|s| s.value.as_str()),
        Some("Only judge the refund handling.")
    );
    assert_eq!(sc.difficulty, Difficulty::Hard);
    assert_eq!(sc.status, Status::Draft);
    assert_eq!(sc.timeout, Some(Duration::from_secs(120)));
    assert_eq!(sc.needs[0].value, "booking/book-duct-cleaning");
    assert_eq!(sc.repeat, 1);

    let kinds: Vec<String> = sc
        .steps
        .iter()
        .map(|s| match &s.kind {
            StepKind::User(_) => "user".to_string(),
            StepKind::Simulate { turns, .. } => format!("simulate {turns:?}"),
            StepKind::Call { .. } => "call".to_string(),
            StepKind::Expect(c) => format!("expect {}", c.len()),
            StepKind::Capture { .. } => "capture".to_string(),
            StepKind::Hitl { approve, .. } => format!("hitl {approve}"),
            StepKind::Fork(_) => "fork".to_string(),
            StepKind::Attack(_) => "attack".to_string(),
        })
        .collect();
    // `initial-message` is the first user step.
    assert_eq!(
        kinds,
        [
            "user",
            "expect 3",
            "capture",
            "simulate Some(2)",
            "user",
            "hitl true",
            "simulate None"
        ]
    );
    match &sc.steps[1].kind {
        StepKind::Expect(c) => {
            assert!(matches!(
                &c[0].kind,
                CriterionKind::Tool { count: Some(1), .. }
            ));
            assert!(
                matches!(&c[1].kind, CriterionKind::Ttft { max } if *max == Duration::from_secs(1))
            );
            assert!(matches!(&c[2].kind, CriterionKind::Tokens { max: 2000 }));
        }
        other => panic!("{other:?}"),
    }
    match &sc.steps[2].kind {
        StepKind::Capture {
            name,
            source: CaptureSource::JsonPath { source, path },
        } => {
            assert_eq!(name, "refund_id");
            assert_eq!(source, "$.id");
            let doc = json!({"id": 9});
            let found = path.query(&doc);
            assert_eq!(found.exactly_one().ok(), Some(&json!(9)));
        }
        other => panic!("{other:?}"),
    }
    let kinds: Vec<&str> = sc.criteria.iter().map(|c| c.kind.name()).collect();
    assert_eq!(kinds, ["tools-in-order", "judge", "outcome", "reply"]);
    match &sc.criteria[1].kind {
        CriterionKind::Judge {
            judge,
            rubric,
            threshold,
            ..
        } => {
            assert_eq!(judge.as_ref().map(|j| j.value.as_str()), Some("strict"));
            assert_eq!(rubric.as_deref(), Some("politeness"));
            assert_eq!(*threshold, Some(0.5));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(&sc.criteria[3].kind, CriterionKind::Reply(r) if r.len() == 2));

    let fixie = scenario(&p, "refunds", "fixie-call");
    assert!(matches!(&fixie.steps[0].kind,
        StepKind::Call { function, input } if function == "lookup" && input.source == "order {{ user_context.id }}"));
    assert_eq!(fixie.user_context.get("id"), Some(&json!(42)));
}

fn load_text(text: &str) -> Result<Project, Diagnostics> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("one.kdl");
    std::fs::write(&file, text).unwrap();
    load(&[&file], &trellis_engine::protocol::registry::specs())
}

#[test]
fn single_agent_projects_need_no_agent_node() {
    let p = load_text(
        "agent \"only\" protocol=\"connexity\" builtin=\"booking\"\nscenario \"s\" {\n    user \"hi\"\n}\n",
    )
    .unwrap();
    let (suite, sc) = p.scenarios().next().unwrap();
    assert_eq!(suite.name, "one");
    assert!(sc.agents.is_empty());
}

#[test]
fn captures_made_in_every_branch_are_usable_after_the_fork() {
    let ok = r##"
agent "a" protocol="connexity" builtin="booking"
scenario "s" {
    user "hi"
    branch "x" {
        user "x"
        capture "day" regex=#"(\w+day)"#
    }
    branch "y" {
        user "y"
        branch "y1" { capture "day" json-path="$.day"; }
        branch "y2" { user "y2"; capture "day" regex="day"; }
    }
    user "See you {{ vars.day }}"
}
"##;
    if let Err(d) = load_text(ok) {
        panic!("{}", d.render_plain());
    }
    let missing_in_one_branch = ok.replace(r#"capture "day" json-path="$.day";"#, r#"user "no";"#);
    let err = load_text(&missing_in_one_branch).unwrap_err();
    assert_eq!(err.len(), 1);
    let d = err.iter().next().unwrap();
    assert_eq!(d.message, "undefined template variable `vars.day`");
    assert_eq!(d.code_str(), "trellis::undefined_variable");
}
