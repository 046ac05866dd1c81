//! Models under test reached through a `provider` node (`provider=` on `openai` agents and
//! on Fixie agents): the provider's endpoint, key, model and prices, its limits shared with
//! the judges and the simulator, a llama.cpp server's slot count honoured, 429s waited out.
//! Real HTTP against the fake LLM endpoint, through the executor.

use std::time::Duration;

use serde_json::json;
use trellis_engine::record::{TrajectoryStatus, TurnRecord};
use trellis_engine::render::EnvSnapshot;

use crate::support::llm::{FakeLlm, Reply, Rule};
use crate::support::{Run, run_suite};

fn turns(run: &Run) -> Vec<&TurnRecord> {
    run.nodes
        .iter()
        .flat_map(|n| n.turns.iter().map(|t| t.as_ref()))
        .collect()
}

fn env() -> EnvSnapshot {
    let mut env = EnvSnapshot::new();
    env.insert("LOCAL_KEY".into(), "sk-local-123".into());
    env
}

/// `scenarios` one-turn scenarios against an `openai` agent reached through provider
/// `local`, each also judged by the same provider.
fn judged_suite(base_url: &str, provider_extra: &str, scenarios: usize) -> String {
    judged_suite_with(
        base_url,
        provider_extra,
        r#"agent "bot" protocol="openai" provider="local" system-prompt="You are terse.""#,
        scenarios,
    )
}

fn judged_suite_with(
    base_url: &str,
    provider_extra: &str,
    agent: &str,
    scenarios: usize,
) -> String {
    let mut text = format!(
        r#"
provider "local" kind="openai" base-url="{base_url}" model="small-model" {provider_extra}
judge "j" provider="local"
{agent}
"#
    );
    for i in 0..scenarios {
        text.push_str(&format!(
            "scenario \"s{i}\" {{\n    user \"Question {i}\"\n    criteria {{\n        judge \"The agent answers\"\n    }}\n}}\n"
        ));
    }
    text
}

fn slow_answers() -> Vec<Rule> {
    vec![
        Rule::when(
            "The agent answers",
            [Reply::slow(
                Duration::from_millis(40),
                Reply::text(r#"{"score": 1, "label": "pass", "justification": "it answered"}"#),
            )],
        ),
        Rule::otherwise([Reply::slow(
            Duration::from_millis(40),
            Reply::text("An answer."),
        )]),
    ]
}

#[tokio::test]
async fn a_model_reached_through_a_provider_takes_its_endpoint_key_model_and_prices() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::text("Hello there, friend.")])]).await;
    let suite = format!(
        r#"
provider "local" kind="openai" base-url="{}" model="small-model" api-key-env="LOCAL_KEY" \
    temperature=0.25 max-tokens=300 input-price=1000 output-price=2000
agent "bot" protocol="openai" provider="local" system-prompt="You are terse."
scenario "hello" {{
    user "Hi"
    expect {{ reply contains="Hello" }}
}}
"#,
        fake.base_url()
    );
    let run = run_suite(&suite, 2, env()).await;
    assert_eq!(run.trajectories[0].status, TrajectoryStatus::Passed);
    let seen = fake.seen();
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(request.body["model"], "small-model");
    assert_eq!(request.body["temperature"], json!(0.25));
    assert_eq!(request.body["max_tokens"], json!(300));
    assert_eq!(
        request.headers["authorization"].to_str().unwrap(),
        "Bearer sk-local-123"
    );
    let turn = turns(&run)[0];
    let (input, output) = (
        turn.prompt_tokens.unwrap() as f64,
        turn.completion_tokens.unwrap() as f64,
    );
    let expected = (input * 1000.0 + output * 2000.0) / 1_000_000.0;
    let cost = turn
        .cost_usd
        .expect("a priced provider prices the agent's turn");
    assert!((cost - expected).abs() < 1e-12, "{cost} vs {expected}");
}

#[tokio::test]
async fn a_one_slot_llama_cpp_server_is_sent_one_request_at_a_time() {
    // Control: without the slot count, the run's calls overlap on the server (this is what
    // would queue on a one-slot server and eat every request's timeout).
    let unlimited = FakeLlm::start(slow_answers()).await;
    let run = run_suite(&judged_suite(&unlimited.base_url(), "", 6), 8, env()).await;
    assert!(
        run.trajectories
            .iter()
            .all(|t| t.status == TrajectoryStatus::Passed)
    );
    assert!(
        unlimited.max_in_flight() > 1,
        "the control run should overlap calls"
    );

    // The server says it has one slot: agent turns and judge calls take turns.
    let llama = FakeLlm::with_slots(slow_answers(), 1).await;
    let run = run_suite(&judged_suite(&llama.base_url(), "", 6), 8, env()).await;
    assert_eq!(run.trajectories.len(), 6);
    assert!(
        run.trajectories
            .iter()
            .all(|t| t.status == TrajectoryStatus::Passed),
        "{:?}",
        run.trajectories
            .iter()
            .map(|t| t.status)
            .collect::<Vec<_>>()
    );
    assert_eq!(llama.calls(), 12, "six agent turns and six judge calls");
    assert_eq!(llama.max_in_flight(), 1);

    // A model agent with its own `base-url` on the same server queues for the same slot.
    let shared = FakeLlm::with_slots(slow_answers(), 1).await;
    let agent = format!(
        r#"agent "bot" protocol="openai" base-url="{}" model="m""#,
        shared.base_url()
    );
    let run = run_suite(
        &judged_suite_with(&shared.base_url(), "", &agent, 6),
        8,
        env(),
    )
    .await;
    assert!(
        run.trajectories
            .iter()
            .all(|t| t.status == TrajectoryStatus::Passed)
    );
    assert_eq!(shared.calls(), 12);
    assert_eq!(shared.max_in_flight(), 1);

    // `concurrency` written on the provider wins over what the server says.
    let two = FakeLlm::with_slots(slow_answers(), 1).await;
    let run = run_suite(&judged_suite(&two.base_url(), "concurrency=2", 6), 8, env()).await;
    assert!(
        run.trajectories
            .iter()
            .all(|t| t.status == TrajectoryStatus::Passed)
    );
    assert_eq!(two.max_in_flight(), 2);
}

#[tokio::test]
async fn a_rate_limited_model_under_test_waits_and_is_not_failed() {
    for through_provider in [true, false] {
        let fake = FakeLlm::start(vec![Rule::otherwise([
            Reply::rate_limited("1"),
            Reply::text("Fine, here it is."),
        ])])
        .await;
        let agent = if through_provider {
            r#"agent "bot" protocol="openai" provider="local""#.to_owned()
        } else {
            format!(
                r#"agent "bot" protocol="openai" base-url="{}" model="m""#,
                fake.base_url()
            )
        };
        let suite = format!(
            r#"
provider "local" kind="openai" base-url="{}" model="small-model"
{agent}
scenario "patient" {{
    user "Please"
    expect {{ reply contains="here it is" }}
}}
"#,
            fake.base_url()
        );
        let started = std::time::Instant::now();
        let run = run_suite(&suite, 1, env()).await;
        let t = &run.trajectories[0];
        assert_eq!(t.status, TrajectoryStatus::Passed, "{t:?}");
        assert!(turns(&run)[0].fault.is_none());
        assert_eq!(fake.calls(), 2, "one 429, then the answer");
        assert!(started.elapsed() >= Duration::from_millis(900));
    }
}

#[tokio::test]
async fn a_fixie_agent_names_the_provider_that_plays_its_llm() {
    let wrong = FakeLlm::always("A: from the wrong provider").await;
    let right = FakeLlm::always("A: 42 is the answer").await;
    let suite = format!(
        r#"
provider "sim" kind="openai" base-url="{}" model="sim-model"
provider "fixie-llm" kind="openai" base-url="{}" model="fixie-model"
simulator provider="sim"
agent "numbers" protocol="fixie" builtin="numbers" provider="fixie-llm"
scenario "ask" {{
    user "What is six times seven?"
    expect {{ reply contains="42" }}
}}
"#,
        wrong.base_url(),
        right.base_url()
    );
    let run = run_suite(&suite, 1, env()).await;
    assert_eq!(run.trajectories[0].status, TrajectoryStatus::Passed);
    assert_eq!(wrong.calls(), 0);
    assert_eq!(right.calls(), 1);
    assert_eq!(right.seen()[0].body["model"], "fixie-model");
}

#[tokio::test]
async fn an_agents_own_sampling_settings_win_over_its_providers() {
    let fake = FakeLlm::always("Hello.").await;
    let suite = format!(
        r#"
provider "local" kind="openai" base-url="{}" model="small-model" temperature=0.25 max-tokens=300
agent "bot" protocol="openai" provider="local" model="other-model" temperature=0.5 max-tokens=64
scenario "hello" {{
    user "Hi"
    expect no-error
}}
"#,
        fake.base_url()
    );
    let run = run_suite(&suite, 1, env()).await;
    assert_eq!(run.trajectories[0].status, TrajectoryStatus::Passed);
    let body = &fake.seen()[0].body;
    assert_eq!(body["model"], "other-model");
    assert_eq!(body["temperature"], json!(0.5));
    assert_eq!(body["max_tokens"], json!(64));
}

#[tokio::test]
async fn a_server_loading_its_model_is_asked_for_its_slots_again() {
    use trellis_engine::llm::slots::ServerRegistry;
    use trellis_engine::transport::http::HttpTransport;
    let fake = FakeLlm::with_slots_after(vec![], 1, 1).await;
    let url: reqwest::Url = format!("{}/chat/completions", fake.base_url())
        .parse()
        .unwrap();
    let registry = ServerRegistry::default();
    let slots = registry
        .for_url(
            &url,
            &reqwest::header::HeaderMap::new(),
            &HttpTransport::new(),
        )
        .expect("plain http servers are asked");
    // 503 while loading: no limit for now, and not settled.
    assert!(slots.acquire().await.is_none());
    // Within the retry pause nothing is asked again.
    assert!(slots.acquire().await.is_none());
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let first = slots
        .acquire()
        .await
        .expect("one slot, once the model is loaded");
    // The only slot is taken: a second request waits.
    let second = tokio::time::timeout(Duration::from_millis(200), slots.acquire()).await;
    assert!(
        second.is_err(),
        "a one-slot server takes one request at a time"
    );
    drop(first);
    assert!(slots.acquire().await.is_some());
}

#[tokio::test]
async fn an_absurd_slot_count_is_no_limit_and_no_panic() {
    let fake = FakeLlm::with_slots(slow_answers(), usize::MAX).await;
    let run = run_suite(&judged_suite(&fake.base_url(), "", 3), 4, env()).await;
    assert!(
        run.trajectories
            .iter()
            .all(|t| t.status == TrajectoryStatus::Passed)
    );
}

#[tokio::test]
async fn a_key_echoed_by_a_failing_server_is_in_no_record() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::EchoHeaders(500)])]).await;
    let suite = format!(
        r#"
provider "local" kind="openai" base-url="{}" model="small-model" api-key-env="LOCAL_KEY" retries=2
agent "bot" protocol="openai" provider="local"
scenario "leak" {{
    user "Hi"
}}
"#,
        fake.base_url()
    );
    let run = run_suite(&suite, 1, env()).await;
    assert_eq!(fake.calls(), 3, "the 5xx is retried twice");
    let turn = turns(&run)[0];
    assert_eq!(turn.exchanges[0].attempts.len(), 3);
    let recorded = serde_json::to_string(&run.nodes).unwrap()
        + &serde_json::to_string(&run.trajectories).unwrap();
    assert!(
        recorded.contains("[redacted]"),
        "the echoed header is in the records, redacted"
    );
    assert!(!recorded.contains("sk-local-123"));
}

#[tokio::test]
async fn a_streamed_request_answered_429_waits_and_gets_its_answer() {
    let fake = FakeLlm::start(vec![Rule::otherwise([
        Reply::rate_limited("0"),
        Reply::text("Streamed after the wait."),
    ])])
    .await;
    let suite = format!(
        r#"
agent "bot" protocol="openai" base-url="{}" model="m" stream=#true
scenario "patient" {{
    user "Please"
    expect {{ reply contains="after the wait" }}
}}
"#,
        fake.base_url()
    );
    let run = run_suite(&suite, 1, env()).await;
    assert_eq!(run.trajectories[0].status, TrajectoryStatus::Passed);
    assert_eq!(fake.calls(), 2);
    let attempts = &turns(&run)[0].exchanges[0].attempts;
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert!(attempts[0].fault.as_ref().unwrap().message.contains("429"));
    assert!(attempts[1].fault.is_none());
}

#[tokio::test]
async fn an_anthropic_model_through_an_anthropic_provider() {
    let fake = FakeLlm::always("Bonjour.").await;
    let suite = format!(
        r#"
provider "claude" kind="anthropic" base-url="{}" model="claude-small" api-key-env="LOCAL_KEY" \
    temperature=1.5
agent "bot" protocol="anthropic" provider="claude" system-prompt="Be brief."
scenario "hello" {{
    user "Hi"
    expect {{ reply contains="Bonjour" }}
}}
"#,
        fake.base_url()
    );
    let run = run_suite(&suite, 1, env()).await;
    assert_eq!(run.trajectories[0].status, TrajectoryStatus::Passed);
    let seen = &fake.seen()[0];
    assert_eq!(seen.api, "anthropic");
    assert_eq!(seen.headers["x-api-key"].to_str().unwrap(), "sk-local-123");
    assert!(seen.headers.get("anthropic-version").is_some());
    assert_eq!(seen.body["model"], "claude-small");
    assert_eq!(seen.body["max_tokens"], json!(1024));
    assert_eq!(
        seen.body["temperature"],
        json!(1.0),
        "Anthropic's range is 0–1"
    );
    assert_eq!(seen.body["system"], "Be brief.");
}

#[tokio::test]
async fn a_streamed_answer_keeps_the_servers_only_slot_until_it_is_read() {
    // Streams that take 150 ms each, and judge answers, on a one-slot server.
    let rules = vec![
        Rule::when(
            "The agent answers",
            [Reply::text(
                r#"{"score": 1, "label": "pass", "justification": "it answered"}"#,
            )],
        ),
        Rule::otherwise([Reply::Chunks {
            pieces: vec!["An ".into(), "answer ".into(), "streamed.".into()],
            gap: Duration::from_millis(50),
            complete: true,
        }]),
    ];
    let fake = FakeLlm::with_slots(rules, 1).await;
    let agent = r#"agent "bot" protocol="openai" provider="local" stream=#true"#;
    let run = run_suite(&judged_suite_with(&fake.base_url(), "", agent, 4), 8, env()).await;
    assert!(
        run.trajectories
            .iter()
            .all(|t| t.status == TrajectoryStatus::Passed)
    );
    assert_eq!(fake.calls(), 8);
    assert_eq!(fake.max_in_flight(), 1);
}

#[tokio::test]
async fn waiting_for_the_servers_slot_is_not_spent_from_the_trajectorys_timeout() {
    // Four two-turn trajectories of 1.5 s each on a one-slot server answering in 300 ms: a
    // trajectory waits up to 2 s in all for the slot, which is not its own time.
    let fake = FakeLlm::with_slots(
        vec![Rule::otherwise([Reply::slow(
            Duration::from_millis(300),
            Reply::text("Done."),
        )])],
        1,
    )
    .await;
    let mut suite = format!(
        "provider \"local\" kind=\"openai\" base-url=\"{}\" model=\"m\"\nagent \"bot\" protocol=\"openai\" provider=\"local\"\n",
        fake.base_url()
    );
    for i in 0..4 {
        suite.push_str(&format!(
            "scenario \"s{i}\" {{\n    timeout \"1500ms\"\n    user \"Go {i}\"\n    user \"And again\"\n    expect no-error\n}}\n"
        ));
    }
    let run = run_suite(&suite, 8, env()).await;
    assert_eq!(fake.max_in_flight(), 1);
    for t in &run.trajectories {
        assert_eq!(t.status, TrajectoryStatus::Passed, "{t:?}");
    }
    // Each turn's latency is its own answer, not the queue before it.
    for turn in turns(&run) {
        assert!(turn.latency_ms < 900.0, "{}", turn.latency_ms);
    }
}

/// A Connexity agent that asks the model server itself during each turn (as Connexity's
/// reference agents do), at `llm_url`; its reply is the model's answer.
async fn agent_on_the_same_server(llm_url: String) -> (String, tokio::task::JoinHandle<()>) {
    use axum::Json;
    use axum::routing::post;
    let client = trellis_engine::transport::tls::client_builder()
        .unwrap()
        .build()
        .unwrap();
    let app = axum::Router::new().route(
        "/agent/respond",
        post(move |Json(body): Json<serde_json::Value>| {
            let (client, llm_url) = (client.clone(), llm_url.clone());
            async move {
                let asked = body["messages"]
                    .as_array()
                    .and_then(|m| m.last())
                    .and_then(|m| m["content"].as_str())
                    .unwrap_or_default()
                    .to_owned();
                let request = json!({"model": "agent-model", "messages": [
                    {"role": "user", "content": asked}]});
                let bytes = client
                    .post(format!("{llm_url}/chat/completions"))
                    .header("content-type", "application/json")
                    .body(request.to_string())
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap();
                let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                let text = answer["choices"][0]["message"]["content"].clone();
                Json(json!({"messages": [{"role": "assistant", "content": text}]}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/agent/respond", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, task)
}

#[tokio::test]
async fn an_agent_whose_own_model_shares_the_server_takes_its_slot_for_each_turn() {
    for shared in [false, true] {
        let fake = FakeLlm::with_slots(slow_answers(), 1).await;
        let (agent_url, _agent) = agent_on_the_same_server(fake.base_url()).await;
        let provider = if shared { r#"provider="local""# } else { "" };
        let agent = format!(r#"agent "ref" protocol="connexity" url="{agent_url}" {provider}"#);
        let run = run_suite(
            &judged_suite_with(&fake.base_url(), "", &agent, 6),
            8,
            env(),
        )
        .await;
        assert!(
            run.trajectories
                .iter()
                .all(|t| t.status == TrajectoryStatus::Passed),
            "{:?}",
            run.trajectories
                .iter()
                .map(|t| &t.fault)
                .collect::<Vec<_>>()
        );
        assert_eq!(fake.calls(), 12);
        if shared {
            // The agent's own calls and the judge's took turns on the one slot.
            assert_eq!(fake.max_in_flight(), 1);
        } else {
            // Trellis cannot see the agent's calls: they meet the judge's at the server.
            assert!(fake.max_in_flight() > 1);
        }
    }
}

/// With Anthropic's prompt caching, `input_tokens` counts only the tokens after the last
/// cache breakpoint: the prompt is those plus the tokens written to and read from the cache.
/// The turn counts them all (a `tokens` budget passed on 14 of 5,014), and prices them as
/// billed: written at 1.25× the input price (2× for the one-hour cache), read at 0.1×.
#[tokio::test]
async fn an_anthropic_prompt_read_from_the_cache_is_counted_and_priced_as_billed() {
    let answer = json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [{"type": "text", "text": "Cached answer."}],
        "stop_reason": "end_turn",
        "usage": {
            "input_tokens": 4,
            "cache_creation_input_tokens": 300,
            "cache_creation": {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 200},
            "cache_read_input_tokens": 5000,
            "output_tokens": 10
        }
    });
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::Raw(answer.to_string())])]).await;
    let suite = format!(
        r#"
provider "claude" kind="anthropic" base-url="{}" model="claude-x" api-key-env="LOCAL_KEY" \
    input-price=3.0 output-price=15.0
agent "bot" protocol="anthropic" provider="claude"
scenario "hello" {{
    user "Hi"
    expect {{ reply contains="Cached" }}
    criteria {{ tokens max=100 }}
}}
"#,
        fake.base_url()
    );
    let run = run_suite(&suite, 1, env()).await;
    let turn = turns(&run)[0];
    assert_eq!(turn.prompt_tokens, Some(5304));
    assert_eq!(turn.completion_tokens, Some(10));
    assert_eq!(turn.total_tokens, Some(5314));
    // 4 + 100 × 1.25 + 200 × 2 + 5,000 × 0.1 = 1,029 input tokens as billed.
    let expected = (1029.0 * 3.0 + 10.0 * 15.0) / 1_000_000.0;
    let cost = turn.cost_usd.expect("priced");
    assert!((cost - expected).abs() < 1e-12, "{cost} vs {expected}");
    assert_eq!(run.trajectories[0].status, TrajectoryStatus::Failed);
}
