//! `simulate` steps: the LLM simulator (the fake LLM endpoint over real sockets) plays the
//! persona against the builtin booking agent.

use trellis_engine::record::{FaultCategory, TrajectoryStatus};
use trellis_engine::render::EnvSnapshot;

use crate::support::llm::{FakeLlm, Reply, Rule};
use crate::support::run_suite;

fn suite(base_url: &str, steps: &str) -> String {
    format!(
        r#"
agent "demo" protocol="connexity" builtin="booking"
provider "fake" kind="openai" base-url="{base_url}" model="sim-model"
simulator provider="fake" temperature=0.9 instructions="Your name is {{{{ user_context.name }}}}."
persona "p" type="busy-parent" {{
    description "Homeowner in Metro Vancouver"
    instructions "Give your postal code when asked"
}}
scenario "book" {{
    persona "p"
    user-context {{
        name "Ada"
        postal_code "V4T 0A7"
    }}
    max-turns 6
    {steps}
}}
"#
    )
}

/// [`suite`] without the fidelity checks: for tests of the simulator's own mechanics, which
/// count its calls exactly (the lone provider would also judge fidelity) and script users
/// that repeat themselves on purpose.
fn plain_suite(base_url: &str, steps: &str) -> String {
    suite(base_url, steps).replace("temperature=0.9", "temperature=0.9 fidelity=#false")
}

/// A user who asks, gives the postal code when asked, then picks a day and ends.
fn customer() -> Vec<Rule> {
    vec![
        Rule::when(
            "conversation starts",
            [Reply::text("Hi, I'd like to book a duct cleaning.")],
        ),
        Rule::when("postal code", [Reply::text("User: It's V4T 0A7.")]),
        Rule::otherwise([Reply::text("Tuesday works, thanks! [END]")]),
    ]
}

#[tokio::test]
async fn the_simulated_user_plays_the_persona_until_it_ends_the_conversation() {
    let fake = FakeLlm::start(customer()).await;
    let text = plain_suite(
        &fake.base_url(),
        r#"simulate until-done
    criteria { tool "create_booking"; }"#,
    );
    let run = run_suite(&text, 4, EnvSnapshot::new()).await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Passed, "{t:#?}");
    let turns: Vec<_> = run.nodes.iter().flat_map(|n| &n.turns).collect();
    let said: Vec<&str> = turns.iter().map(|t| t.user_message.as_str()).collect();
    assert_eq!(
        said,
        [
            "Hi, I'd like to book a duct cleaning.",
            "It's V4T 0A7.",
            "Tuesday works, thanks!"
        ]
    );
    // Every simulated turn records the call that wrote it.
    for turn in &turns {
        let call = &turn.simulator[0];
        assert_eq!(
            (call.provider.as_str(), call.model.as_str()),
            ("fake", "sim-model")
        );
        assert!(call.output_tokens.is_some());
    }
    assert_eq!(fake.calls(), 3);
    assert_eq!(t.llm.as_deref().map(|u| u.calls), Some(3));

    // The simulator was told who it is, what it knows, and saw the conversation with the
    // roles turned around.
    let third = &fake.seen()[2].body;
    let system = third["messages"][0]["content"].as_str().unwrap();
    for needle in [
        "busy-parent",
        "Give your postal code when asked",
        "\"postal_code\": \"V4T 0A7\"",
        "Your name is Ada.",
        "[END]",
    ] {
        assert!(system.contains(needle), "{needle} missing from:\n{system}");
    }
    assert_eq!(third["temperature"], 0.9);
    let roles: Vec<&str> = third["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    // The simulator's own messages are `assistant`, the agent's `user`; its first message
    // gets an opening user line so strict chat templates (llama.cpp's Mistral, Gemma) accept
    // the conversation.
    assert_eq!(
        roles,
        ["system", "user", "assistant", "user", "assistant", "user"]
    );
}

#[tokio::test]
async fn simulated_turns_mix_with_scripted_steps_and_stop_at_max_turns() {
    let fake = FakeLlm::start(customer()).await;
    // Two simulated turns, a scripted one, then until-done capped by max-turns 4.
    let text = suite(
        &fake.base_url(),
        r#"simulate turns=2
    user "Is Tuesday free?"
    expect reply contains="booked"
    simulate until-done
    "#,
    )
    .replace("max-turns 6", "max-turns 4");
    let run = run_suite(&text, 4, EnvSnapshot::new()).await;
    let turns: Vec<_> = run.nodes.iter().flat_map(|n| &n.turns).collect();
    assert_eq!(turns.len(), 4, "{turns:#?}");
    assert_eq!(turns[2].user_message, "Is Tuesday free?");
    assert!(
        turns[2].simulator.is_empty(),
        "a scripted turn has no simulator call"
    );
    assert_eq!(turns[3].user_message, "Tuesday works, thanks!");
}

#[tokio::test]
async fn an_unusable_simulator_is_retried_then_the_trajectory_is_invalid() {
    let fake = FakeLlm::start(vec![Rule::otherwise([
        Reply::Empty,
        Reply::text("User:"),
        Reply::text("\"\""),
    ])])
    .await;
    let text = suite(&fake.base_url(), "simulate turns=3");
    let run = run_suite(&text, 4, EnvSnapshot::new()).await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Invalid, "{t:#?}");
    assert!(t.fault.is_none());
    let reason = t.invalid_reason().unwrap_or_default();
    assert!(
        reason.starts_with("empty message (turn 0)") && reason.contains("3 attempts"),
        "{reason}"
    );
    assert_eq!(fake.calls(), 3);
    assert_eq!(t.llm.as_deref().map(|u| u.calls), Some(3));
}

#[tokio::test]
async fn with_fidelity_off_an_unusable_simulator_is_a_simulator_fault() {
    let fake = FakeLlm::start(vec![Rule::otherwise([
        Reply::Empty,
        Reply::text("User:"),
        Reply::text("\"\""),
    ])])
    .await;
    let text = suite(&fake.base_url(), "simulate turns=3")
        .replace("temperature=0.9", "temperature=0.9 fidelity=#false");
    let run = run_suite(&text, 4, EnvSnapshot::new()).await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Error);
    let fault = t.fault.as_ref().unwrap();
    assert_eq!(fault.category, FaultCategory::Simulator);
    assert!(fault.message.contains("3 attempts"), "{}", fault.message);
    assert_eq!(fake.calls(), 3);
    // No turn carries them, and they still count (and cost) in the trajectory's usage.
    assert_eq!(t.llm.as_deref().map(|u| u.calls), Some(3));
}

#[tokio::test]
async fn a_simulator_that_ends_at_once_still_counts_its_call() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text("[END]")])]).await;
    let text = suite(&fake.base_url(), "simulate until-done");
    let run = run_suite(&text, 4, EnvSnapshot::new()).await;
    let t = &run.trajectories[0];
    assert_eq!(fake.calls(), 1);
    assert!(run.nodes.iter().all(|n| n.turns.is_empty()));
    assert_eq!(t.llm.as_deref().map(|u| u.calls), Some(1));
}

#[tokio::test]
async fn without_a_simulator_simulate_is_skipped_with_how_to_configure_one() {
    let text = r#"
agent "demo" protocol="connexity" builtin="booking"
scenario "book" { simulate turns=2; }
"#;
    let run = run_suite(text, 4, EnvSnapshot::new()).await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Skipped);
    assert!(
        t.skip_reason
            .as_deref()
            .unwrap()
            .contains("simulator provider="),
        "{:?}",
        t.skip_reason
    );
}

/// A Connexity agent on a real socket that hangs up (`end_call`) on its second turn.
async fn hanging_up_agent() -> (String, tokio::task::JoinHandle<()>) {
    use axum::routing::post;
    async fn respond(body: axum::body::Bytes) -> axum::response::Response {
        use axum::response::IntoResponse;
        let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let users = request["messages"]
            .as_array()
            .map_or(0, |m| m.iter().filter(|m| m["role"] == "user").count());
        let messages = if users >= 2 {
            serde_json::json!([
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "end_call", "arguments": "{\"reason\":\"done\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "{\"ended\": true}"},
                {"role": "assistant", "content": "Goodbye!"}
            ])
        } else {
            serde_json::json!([{"role": "assistant", "content": "What is your postal code?"}])
        };
        axum::Json(serde_json::json!({"messages": messages})).into_response()
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/agent/respond", post(respond));
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{address}/agent/respond"), server)
}

#[tokio::test]
async fn the_agent_ends_the_simulated_conversation_with_end_call() {
    let fake = FakeLlm::start(vec![Rule::otherwise([
        Reply::text("Hi, I'd like to book a duct cleaning."),
        Reply::text("It's V4T 0A7."),
        Reply::text("Are you still there?"),
    ])])
    .await;
    let (url, server) = hanging_up_agent().await;
    let text = plain_suite(&fake.base_url(), "simulate until-done\n    expect no-error").replace(
        r#"agent "demo" protocol="connexity" builtin="booking""#,
        &format!(r#"agent "demo" protocol="connexity" url="{url}""#),
    );
    let run = run_suite(&text, 4, EnvSnapshot::new()).await;
    server.abort();
    let turns: Vec<_> = run.nodes.iter().flat_map(|n| &n.turns).collect();
    let said: Vec<&str> = turns.iter().map(|t| t.user_message.as_str()).collect();
    // The simulator would have gone on; the agent's `end_call` ended the step.
    assert_eq!(
        said,
        ["Hi, I'd like to book a duct cleaning.", "It's V4T 0A7."]
    );
    assert_eq!(fake.calls(), 2);
    assert_eq!(run.trajectories[0].status, TrajectoryStatus::Passed);
}

/// A scenario's `simulator` replaces the project's for its `simulate` steps, and a branch's
/// replaces the scenario's inside that branch: one executed prefix continued by different
/// simulated users.
#[tokio::test]
async fn scenario_and_branch_simulators_override_the_default() {
    let project = FakeLlm::start(vec![Rule::otherwise([Reply::text("PROJECT [END]")])]).await;
    let scenario = FakeLlm::start(vec![Rule::otherwise([Reply::text(
        "Hi, I'd like to book a duct cleaning.",
    )])])
    .await;
    let branch = FakeLlm::start(vec![Rule::otherwise([Reply::text("It's V4T 0A7. [END]")])]).await;
    let text = format!(
        r#"
agent "demo" protocol="connexity" builtin="booking"
provider "project" kind="openai" base-url="{}" model="project-m"
provider "scenario" kind="openai" base-url="{}" model="scenario-m"
provider "branch" kind="openai" base-url="{}" model="branch-m"
simulator provider="project"
scenario "book" {{
    simulator provider="scenario" temperature=0.3
    simulate turns=1
    branch "gives-code" {{
        simulator provider="branch" model="branch-override"
        simulate turns=1
    }}
    branch "same-user" {{
        simulate turns=1
    }}
}}
"#,
        project.base_url(),
        scenario.base_url(),
        branch.base_url()
    );
    let run = run_suite(&text, 4, EnvSnapshot::new()).await;
    assert_eq!(run.trajectories.len(), 2);
    // The prefix and the `same-user` branch: the scenario's simulator; `gives-code`: the
    // branch's; the project's is never asked.
    assert_eq!(project.calls(), 0);
    assert_eq!(scenario.calls(), 2);
    assert_eq!(branch.calls(), 1);
    assert_eq!(scenario.seen()[0].body["temperature"], 0.3);
    assert_eq!(branch.seen()[0].body["model"], "branch-override");
    let said: Vec<&str> = run
        .nodes
        .iter()
        .flat_map(|n| &n.turns)
        .map(|t| t.user_message.as_str())
        .collect();
    assert!(said.contains(&"It's V4T 0A7."), "{said:?}");
    let by_branch: Vec<(&str, &str)> = run
        .nodes
        .iter()
        .flat_map(|n| &n.turns)
        .flat_map(|t| &t.simulator)
        .map(|c| (c.provider.as_str(), c.model.as_str()))
        .collect();
    assert!(
        by_branch.contains(&("branch", "branch-override")),
        "{by_branch:?}"
    );
}

/// A branch's `persona` is played by the simulator in that branch only: one executed prefix
/// continued by two different simulated users.
#[tokio::test]
async fn a_branch_persona_changes_who_the_simulator_plays() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text("Hello there.")])]).await;
    let text = suite(
        &fake.base_url(),
        r#"simulate turns=1
    branch "impatient" {
        persona type="impatient-caller" {
            instructions "Demand a booking today"
        }
        simulate turns=1
    }
    branch "same" {
        simulate turns=1
    }"#,
    );
    let run = run_suite(&text, 4, EnvSnapshot::new()).await;
    assert_eq!(run.trajectories.len(), 2);
    let systems: Vec<String> = fake
        .seen()
        .iter()
        .map(|r| {
            r.body["messages"][0]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(systems.len(), 3, "{systems:#?}");
    let impatient = systems
        .iter()
        .filter(|s| s.contains("impatient-caller") && s.contains("Demand a booking today"))
        .count();
    let parent = systems.iter().filter(|s| s.contains("busy-parent")).count();
    // The prefix and the `same` branch play the scenario's persona; `impatient` its own.
    assert_eq!((impatient, parent), (1, 2), "{systems:#?}");
}

/// The system prompt of every simulator request the fake saw, in order.
fn system_prompts(fake: &FakeLlm) -> Vec<String> {
    fake.seen()
        .iter()
        .map(|r| {
            r.body["messages"][0]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// A branch adds simulator `instructions` without redefining the persona or the simulator:
/// the shared prefix is simulated once, and each branch's continuation is asked with the
/// suite's instructions plus its own (the fake answers by what the system prompt says).
#[tokio::test]
async fn a_branch_adds_its_own_simulator_instructions() {
    let fake = FakeLlm::start(vec![
        Rule::otherwise([Reply::text("Book me in NOW. [END]")]).in_system("You are in a hurry"),
        Rule::otherwise([Reply::text("No rush, Tuesday is fine. [END]")])
            .in_system("Take your time"),
        Rule::otherwise([Reply::text("Hi, I'd like to book a duct cleaning.")]),
    ])
    .await;
    let text = plain_suite(
        &fake.base_url(),
        r#"simulate turns=1
    branch "impatient" {
        simulator instructions="You are in a hurry; push back on every question."
        simulate until-done
    }
    branch "calm" {
        simulator {
            instructions "Take your time, {{ user_context.name }}."
        }
        simulate until-done
    }"#,
    );
    let run = run_suite(&text, 4, EnvSnapshot::new()).await;
    assert_eq!(run.trajectories.len(), 2);
    // The prefix once, then one continuation per branch.
    assert_eq!(fake.calls(), 3);
    let systems = system_prompts(&fake);
    let with = |needle: &str| systems.iter().filter(|s| s.contains(needle)).count();
    assert_eq!(with("Your name is Ada."), 3, "{systems:#?}");
    assert_eq!(with("You are in a hurry"), 1, "{systems:#?}");
    assert_eq!(with("Take your time, Ada."), 1, "{systems:#?}");
    // The persona is still the scenario's, and the suite's instructions come first.
    assert_eq!(with("busy-parent"), 3, "{systems:#?}");
    assert!(
        systems
            .iter()
            .any(|s| s.contains("Your name is Ada.\n\nYou are in a hurry")),
        "{systems:#?}"
    );
    let said_in = |node: &str| -> Vec<String> {
        run.nodes
            .iter()
            .filter(|n| n.node == node)
            .flat_map(|n| &n.turns)
            .map(|t| t.user_message.clone())
            .collect()
    };
    assert_eq!(said_in("start"), ["Hi, I'd like to book a duct cleaning."]);
    assert_eq!(said_in("impatient"), ["Book me in NOW."]);
    assert_eq!(said_in("calm"), ["No rush, Tuesday is fine."]);
}

/// A suite's `system-prompt`, `opening-prompt` and `retry-prompt` replace the built-in ones:
/// the fake receives exactly what they render to.
#[tokio::test]
async fn overridden_prompt_templates_are_what_the_simulator_receives() {
    let fake = FakeLlm::start(vec![Rule::otherwise([
        Reply::Empty,
        Reply::text("Hi, it's Ada. [END]"),
    ])])
    .await;
    let text = suite(&fake.base_url(), "simulate turns=1\n    expect no-error").replace(
        r#"simulator provider="fake" temperature=0.9 instructions="Your name is {{ user_context.name }}.""#,
        r#"simulator provider="fake" fidelity=#false {
    instructions "Be {{ persona.type }}."
    system-prompt "Play {{ persona.type }} ({{ persona.instructions }}) in {{ scenario.id }}. {{ instructions }} Facts: {{ user_context_json }} End: {{ end_marker }}"
    opening-prompt "Start, {{ user_context.name }}."
    retry-prompt "Retry #{{ retry }}: say something or {{ end_marker }}."
}"#,
    );
    let run = run_suite(&text, 4, EnvSnapshot::new()).await;
    assert_eq!(run.trajectories[0].status, TrajectoryStatus::Passed);
    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    let facts = "{\n  \"name\": \"Ada\",\n  \"postal_code\": \"V4T 0A7\"\n}";
    let messages = |i: usize| -> Vec<(String, String)> {
        seen[i].body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap().to_owned(),
                    m["content"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let system = format!(
        "Play busy-parent (Give your postal code when asked) in book. Be busy-parent. Facts: \
         {facts} End: [END]"
    );
    assert_eq!(
        messages(0),
        [
            ("system".to_owned(), system.clone()),
            ("user".into(), "Start, Ada.".into())
        ]
    );
    assert_eq!(
        messages(1),
        [
            ("system".to_owned(), system),
            // Consecutive user messages are sent as one (strict chat templates).
            (
                "user".into(),
                "Start, Ada.\n\nRetry #1: say something or [END].".into()
            )
        ]
    );
}

/// A prompt that fails to render at run time (here an unset `env` variable) is a `simulator`
/// fault on that trajectory, naming the prompt; the simulator is never called.
#[tokio::test]
async fn a_prompt_that_fails_to_render_is_a_simulator_fault() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text("Hi")])]).await;
    let text = plain_suite(
        &fake.base_url(),
        r#"simulate turns=1
    branch "keyed" {
        simulator system-prompt="Your code is {{ env.SIMULATOR_CODE }}."
        simulate turns=1
    }
    branch "plain" { simulate turns=1; }
    expect no-error"#,
    );
    let run = run_suite(&text, 4, EnvSnapshot::new()).await;
    let by_name = |name: &str| {
        run.trajectories
            .iter()
            .find(|t| t.trajectory == name)
            .unwrap_or_else(|| panic!("no {name}: {:#?}", run.trajectories))
    };
    let keyed = by_name("keyed");
    assert_eq!(keyed.status, TrajectoryStatus::Error);
    let fault = keyed.fault.as_ref().unwrap();
    assert_eq!(fault.category, FaultCategory::Simulator);
    assert!(
        fault.message.contains("system-prompt") && fault.message.contains("SIMULATOR_CODE"),
        "{}",
        fault.message
    );
    assert_eq!(by_name("plain").status, TrajectoryStatus::Passed);
    // The prefix, and the `plain` branch: the `keyed` one never reached the simulator.
    assert_eq!(fake.calls(), 2);
}
