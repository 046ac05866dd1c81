//! LLM provider client and response cache against the fake LLM endpoint over real sockets.

use std::sync::Arc;
use std::time::{Duration, Instant};

use trellis_dsl::Provider;
use trellis_engine::llm::meter::{LlmMeter, Role};
use trellis_engine::llm::slots::ServerRegistry;
use trellis_engine::llm::{
    CacheMode, CacheUse, LlmCache, LlmError, LlmMessage, LlmRequest, ProviderClient,
    ProviderSetupError,
};
use trellis_engine::record::FaultCategory;
use trellis_engine::render::EnvSnapshot;
use trellis_engine::transport::http::HttpTransport;

use crate::support::llm::{FakeLlm, Reply, Rule};

const KEY: &str = "sk-test-5ec7e7-do-not-print";

/// The one `provider` of a suite text, as the DSL decodes it.
fn provider(kdl: &str) -> Provider {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("providers.kdl");
    std::fs::write(&path, kdl).unwrap();
    let project = trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs())
        .unwrap_or_else(|d| panic!("{d:?}"));
    project.providers.into_iter().next().unwrap()
}

fn env() -> EnvSnapshot {
    EnvSnapshot::from([("FAKE_LLM_KEY".to_owned(), KEY.to_owned())])
}

fn client(kdl: &str) -> ProviderClient {
    ProviderClient::new(
        &provider(kdl),
        &env(),
        HttpTransport::new(),
        &ServerRegistry::default(),
    )
    .unwrap()
}

fn ask(text: &str) -> LlmRequest {
    LlmRequest {
        messages: vec![LlmMessage::system("You are terse."), LlmMessage::user(text)],
        ..LlmRequest::default()
    }
}

#[tokio::test]
async fn openai_call_sends_parameters_and_records_usage_and_cost() {
    let fake = FakeLlm::always("hello there world").await;
    let client = client(&format!(
        r#"provider "local" kind="openai" base-url="{}" model="tiny" api-key-env="FAKE_LLM_KEY" \
            temperature=0.2 max-tokens=64 input-price=2.0 output-price=10.0 {{
            header "X-Team" "evals"
        }}"#,
        fake.base_url()
    ));
    let outcome = client.complete(&ask("Say hi"), None).await;
    let completion = outcome.result.unwrap();
    assert_eq!(completion.text, "hello there world");
    let seen = &fake.seen()[0];
    assert_eq!(seen.api, "openai");
    assert_eq!(seen.body["model"], "tiny");
    assert_eq!(seen.body["temperature"], 0.2);
    assert_eq!(seen.body["max_tokens"], 64);
    assert_eq!(seen.body["messages"][1]["content"], "Say hi");
    assert_eq!(
        seen.headers["authorization"],
        format!("Bearer {KEY}").as_str()
    );
    assert_eq!(seen.headers["x-team"], "evals");

    let call = outcome.call;
    assert_eq!(
        (call.provider.as_str(), call.model.as_str()),
        ("local", "tiny")
    );
    let (input, output) = (call.input_tokens.unwrap(), call.output_tokens.unwrap());
    assert_eq!(output, 3);
    assert!(input > 0);
    let expected = input as f64 * 2.0 / 1e6 + output as f64 * 10.0 / 1e6;
    assert!((call.cost.unwrap() - expected).abs() < 1e-12, "{call:?}");
    assert_eq!(
        (call.attempts, call.rate_limited, call.cache),
        (1, 0, CacheUse::Off)
    );
    assert_eq!(call.error, None);
}

/// An answer with no text is no answer, but the provider billed it and said so in its
/// usage: the call's tokens and cost are kept (they were dropped, so the judge's spend was
/// missing from every table).
#[tokio::test]
async fn an_empty_answer_keeps_the_usage_it_reports() {
    let fake = FakeLlm::always("").await;
    let client = client(&format!(
        r#"provider "local" kind="openai" base-url="{}" model="tiny" api-key-env="FAKE_LLM_KEY" \
            input-price=2.0 output-price=10.0"#,
        fake.base_url()
    ));
    let outcome = client.complete(&ask("Say hi"), None).await;
    assert!(outcome.result.is_err(), "an empty answer was taken");
    let call = outcome.call;
    assert!(call.error.is_some(), "{call:?}");
    let input = call.input_tokens.expect("the reported usage was dropped");
    assert!(input > 0, "{call:?}");
    let expected = input as f64 * 2.0 / 1e6;
    assert!((call.cost.unwrap() - expected).abs() < 1e-12, "{call:?}");
}

#[tokio::test]
async fn an_azure_style_provider_keeps_its_query_and_sends_the_key_in_its_header() {
    let fake = FakeLlm::always("hello").await;
    let client = client(&format!(
        r#"provider "azure" kind="openai" base-url="{}?api-version=2024-06-01" model="m" \
            api-key-env="FAKE_LLM_KEY" api-key-header="api-key""#,
        fake.base_url()
    ));
    let outcome = client.complete(&ask("hi"), None).await;
    assert_eq!(outcome.result.unwrap().text, "hello");
    let seen = &fake.seen()[0];
    assert_eq!(seen.headers["api-key"], KEY);
    assert!(seen.headers.get("authorization").is_none());
    assert!(
        client
            .url()
            .as_str()
            .ends_with("/v1/chat/completions?api-version=2024-06-01"),
        "{}",
        client.url()
    );
}

#[tokio::test]
async fn anthropic_messages_use_their_own_headers_and_shape() {
    let fake = FakeLlm::always("bonjour").await;
    let client = client(&format!(
        r#"provider "claude" kind="anthropic" base-url="{}" model="claude-x" api-key-env="FAKE_LLM_KEY""#,
        fake.base_url()
    ));
    let outcome = client.complete(&ask("Greet me"), None).await;
    assert_eq!(outcome.result.unwrap().text, "bonjour");
    let seen = &fake.seen()[0];
    assert_eq!(seen.api, "anthropic");
    assert_eq!(seen.headers["x-api-key"], KEY);
    assert_eq!(seen.headers["anthropic-version"], "2023-06-01");
    assert!(seen.headers.get("authorization").is_none());
    assert_eq!(seen.body["system"], "You are terse.");
    assert_eq!(seen.body["messages"].as_array().unwrap().len(), 1);
    assert_eq!(seen.body["max_tokens"], 1024);
    assert_eq!(outcome.call.output_tokens, Some(1));
    assert_eq!(outcome.call.cost, None, "no price configured");
}

/// A proxy in front of Claude that passes OpenAI's refusal of `max_tokens` on: Anthropic
/// requires `max_tokens`, so the request is not changed, not now and not later.
#[tokio::test]
async fn an_anthropic_request_keeps_max_tokens_whatever_a_400_says() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::ReasoningModel(Box::new(
        Reply::text("never"),
    ))])])
    .await;
    let client = client(&format!(
        r#"provider "claude" kind="anthropic" base-url="{}" model="claude-behind-proxy" api-key-env="FAKE_LLM_KEY" retries=0"#,
        fake.base_url()
    ));
    for _ in 0..2 {
        let outcome = client.complete(&ask("Greet me"), None).await;
        assert!(outcome.result.is_err());
    }
    let seen = fake.seen();
    assert_eq!(seen.len(), 2, "sent again changed");
    for request in seen {
        assert_eq!(request.body["max_tokens"], 1024, "{}", request.body);
        assert!(request.body.get("max_completion_tokens").is_none());
    }
}

#[tokio::test]
async fn a_429_is_waited_out_for_its_retry_after_and_is_not_a_failure() {
    let fake = FakeLlm::start(vec![Rule::otherwise([
        Reply::rate_limited("1"),
        Reply::text("finally"),
    ])])
    .await;
    // No retries at all: a 429 is not a failed attempt.
    let client = client(&format!(
        r#"provider "p" kind="openai" base-url="{}" model="m" retries=0"#,
        fake.base_url()
    ));
    let started = Instant::now();
    let outcome = client.complete(&ask("hi"), None).await;
    assert_eq!(outcome.result.unwrap().text, "finally");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After honoured"
    );
    assert_eq!(fake.calls(), 2);
    assert_eq!(outcome.call.rate_limited, 1);
    assert!(outcome.call.waited_ms >= 1000.0);
    assert_eq!(outcome.call.error, None);
}

#[tokio::test]
async fn a_429_past_the_deadline_gives_up_as_rate_limited() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::rate_limited("30")])]).await;
    let client = client(&format!(
        r#"provider "p" kind="openai" base-url="{}" model="m""#,
        fake.base_url()
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let started = Instant::now();
    let outcome = client.complete(&ask("hi"), Some(deadline)).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        matches!(outcome.result, Err(LlmError::RateLimited { .. })),
        "{:?}",
        outcome.result
    );
    assert_eq!(fake.calls(), 1);
}

#[tokio::test]
async fn server_errors_are_retried_with_backoff_and_client_errors_are_not() {
    let fake = FakeLlm::start(vec![
        Rule::when(
            "flaky",
            [Reply::Status(503, "busy".into()), Reply::text("ok")],
        ),
        Rule::when("bad", [Reply::Status(400, "bad request".into())]),
    ])
    .await;
    let client = client(&format!(
        r#"provider "p" kind="openai" base-url="{}" model="m" retries=2"#,
        fake.base_url()
    ));
    let outcome = client.complete(&ask("flaky"), None).await;
    assert_eq!(outcome.result.unwrap().text, "ok");
    assert_eq!(outcome.call.attempts, 2);

    let outcome = client.complete(&ask("bad"), None).await;
    match outcome.result {
        Err(LlmError::Http {
            category, message, ..
        }) => {
            assert_eq!(category, FaultCategory::Http4xx);
            assert!(message.contains("bad request"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(outcome.call.attempts, 1);
    assert_eq!(fake.calls(), 3);
}

#[tokio::test]
async fn garbage_empty_and_error_bodies_are_errors_never_answers() {
    let fake = FakeLlm::start(vec![
        Rule::when("garbage", [Reply::Raw("{\"choices\": [".into())]),
        Rule::when("empty", [Reply::Empty]),
        Rule::when(
            "oops",
            [Reply::Raw(
                r#"{"error":{"message":"model not loaded"}}"#.into(),
            )],
        ),
    ])
    .await;
    let client = client(&format!(
        r#"provider "p" kind="openai" base-url="{}" model="m""#,
        fake.base_url()
    ));
    let garbage = client.complete(&ask("garbage"), None).await;
    // A body that is not JSON is `invalid_json`, as an agent's is; `protocol` is JSON of
    // the wrong shape.
    assert!(
        matches!(&garbage.result, Err(e @ LlmError::NotJson { detail, .. }) if detail.contains("not JSON") && e.category() == "invalid_json"),
        "{:?}",
        garbage.result
    );
    assert!(garbage.call.error.is_some());
    let empty = client.complete(&ask("empty"), None).await;
    assert!(
        matches!(&empty.result, Err(LlmError::Malformed { detail, .. }) if detail.contains("no text")),
        "{:?}",
        empty.result
    );
    let oops = client.complete(&ask("oops"), None).await;
    assert!(
        matches!(&oops.result, Err(LlmError::Provider { detail, .. }) if detail == "model not loaded"),
        "{:?}",
        oops.result
    );
}

#[tokio::test]
async fn a_slow_answer_times_out_per_attempt() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::slow(
        Duration::from_secs(3),
        Reply::text("late"),
    )])])
    .await;
    let client = client(&format!(
        r#"provider "p" kind="openai" base-url="{}" model="m" timeout="300ms" retries=1"#,
        fake.base_url()
    ));
    let started = Instant::now();
    let outcome = client.complete(&ask("hi"), None).await;
    assert!(
        matches!(
            outcome.result,
            Err(LlmError::Http {
                category: FaultCategory::Timeout,
                ..
            })
        ),
        "{:?}",
        outcome.result
    );
    // Asking a model again has no side effect: timeouts are retried.
    assert_eq!(outcome.call.attempts, 2);
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn the_api_key_never_appears_in_errors_records_or_debug_output() {
    // A server that echoes the request headers, key included, in its error body.
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::EchoHeaders(401)])]).await;
    let client = client(&format!(
        r#"provider "p" kind="openai" base-url="{}" model="m" api-key-env="FAKE_LLM_KEY""#,
        fake.base_url()
    ));
    let outcome = client.complete(&ask("hi"), None).await;
    let error = outcome.result.unwrap_err();
    let text = error.to_string();
    assert!(text.contains("[redacted]"), "the echo was quoted: {text}");
    assert!(!text.contains(KEY), "{text}");
    assert!(!format!("{error:?}").contains(KEY));
    assert!(!serde_json::to_string(&outcome.call).unwrap().contains(KEY));
    assert!(!format!("{client:?}").contains(KEY));

    let missing = ProviderClient::new(
        &provider(r#"provider "p" kind="openai" model="m" api-key-env="NOT_SET_ANYWHERE""#),
        &env(),
        HttpTransport::new(),
        &ServerRegistry::default(),
    )
    .unwrap_err();
    assert!(matches!(missing, ProviderSetupError::MissingKey { .. }));
    assert!(missing.to_string().contains("NOT_SET_ANYWHERE"));
}

#[tokio::test]
async fn concurrency_and_request_rate_limits_hold_across_concurrent_calls() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::slow(
        Duration::from_millis(300),
        Reply::text("ok"),
    )])])
    .await;
    let client = Arc::new(client(&format!(
        r#"provider "p" kind="openai" base-url="{}" model="m" concurrency=1"#,
        fake.base_url()
    )));
    let started = Instant::now();
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.complete(&ask(&format!("q{i}")), None).await })
        })
        .collect();
    let mut waited = 0.0;
    for call in calls {
        let outcome = call.await.unwrap();
        assert!(outcome.result.is_ok());
        waited += outcome.call.waited_ms;
    }
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "one at a time"
    );
    assert!(waited >= 800.0, "queueing is recorded: {waited}");

    let fast = FakeLlm::always("ok").await;
    let client = Arc::new(self::client(&format!(
        r#"provider "p" kind="openai" base-url="{}" model="m" requests-per-minute=600"#,
        fast.base_url()
    )));
    let started = Instant::now();
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.complete(&ask("x"), None).await })
        })
        .collect();
    for call in calls {
        assert!(call.await.unwrap().result.is_ok());
    }
    // 600 a minute: one every 100ms, so the fourth starts 300ms after the first.
    assert!(started.elapsed() >= Duration::from_millis(290));
    assert_eq!(fast.calls(), 4);
}

#[tokio::test]
async fn the_cache_reuses_answers_per_repetition_and_replay_only_never_calls() {
    let fake = FakeLlm::start(vec![Rule::otherwise([
        Reply::text("first"),
        Reply::text("second"),
        Reply::text("third"),
    ])])
    .await;
    let client = client(&format!(
        r#"provider "p" kind="openai" base-url="{}" model="m" input-price=1.0"#,
        fake.base_url()
    ));
    let dir = tempfile::tempdir().unwrap();
    let cache = LlmCache::new(dir.path(), CacheMode::ReadWrite);
    let a = cache
        .complete(
            &client,
            &ask("q"),
            0,
            "test call",
            None,
            (&LlmMeter::default(), Role::Judge),
        )
        .await;
    assert_eq!(
        (a.result.unwrap().text, a.call.cache),
        ("first".into(), CacheUse::Miss)
    );
    let b = cache
        .complete(
            &client,
            &ask("q"),
            0,
            "test call",
            None,
            (&LlmMeter::default(), Role::Judge),
        )
        .await;
    assert_eq!(
        (b.result.unwrap().text, b.call.cache),
        ("first".into(), CacheUse::Hit)
    );
    assert_eq!((b.call.attempts, b.call.cost), (0, Some(0.0)));
    // Another repetition is another sample.
    let c = cache
        .complete(
            &client,
            &ask("q"),
            1,
            "test call",
            None,
            (&LlmMeter::default(), Role::Judge),
        )
        .await;
    assert_eq!(
        (c.result.unwrap().text, c.call.cache),
        ("second".into(), CacheUse::Miss)
    );
    // Another temperature is another request.
    let mut hotter = ask("q");
    hotter.temperature = Some(1.0);
    let d = cache
        .complete(
            &client,
            &hotter,
            0,
            "test call",
            None,
            (&LlmMeter::default(), Role::Judge),
        )
        .await;
    assert_eq!(d.result.unwrap().text, "third");
    assert_eq!(fake.calls(), 3);

    // Replay-only: hits are served, a miss names the call, and nothing is sent.
    let replay = LlmCache::new(dir.path(), CacheMode::ReplayOnly);
    let hit = replay
        .complete(
            &client,
            &ask("q"),
            1,
            "test call",
            None,
            (&LlmMeter::default(), Role::Judge),
        )
        .await;
    assert_eq!(hit.result.unwrap().text, "second");
    let miss = replay
        .complete(
            &client,
            &ask("never asked"),
            0,
            "judge `tone` on s/x#0",
            None,
            (&LlmMeter::default(), Role::Judge),
        )
        .await;
    match miss.result {
        Err(LlmError::CacheMiss { call, .. }) => assert_eq!(call, "judge `tone` on s/x#0"),
        other => panic!("{other:?}"),
    }
    assert_eq!(fake.calls(), 3);

    // Off: straight to the provider.
    let off = LlmCache::new(dir.path(), CacheMode::Off);
    let e = off
        .complete(
            &client,
            &ask("q"),
            0,
            "test call",
            None,
            (&LlmMeter::default(), Role::Judge),
        )
        .await;
    assert_eq!(e.call.cache, CacheUse::Off);
    assert_eq!(fake.calls(), 4);
}

#[tokio::test]
async fn runs_sharing_a_cache_directory_never_see_a_partial_entry() {
    let fake = FakeLlm::always(&"word ".repeat(2000)).await;
    let client = Arc::new(client(&format!(
        r#"provider "p" kind="openai" base-url="{}" model="m""#,
        fake.base_url()
    )));
    let dir = tempfile::tempdir().unwrap();
    // Two "runs" (two cache handles) write and read the same keys at once.
    let mut tasks = Vec::new();
    for run in 0..2 {
        for i in 0..8u32 {
            let client = client.clone();
            let cache = LlmCache::new(dir.path(), CacheMode::ReadWrite);
            tasks.push(tokio::spawn(async move {
                let _ = run;
                cache
                    .complete(
                        &client,
                        &ask("same"),
                        i % 4,
                        "shared",
                        None,
                        (&LlmMeter::default(), Role::Judge),
                    )
                    .await
            }));
        }
    }
    for task in tasks {
        let outcome = task.await.unwrap();
        assert_eq!(outcome.result.unwrap().text.len(), 10_000);
        assert_eq!(outcome.call.error, None);
    }
    // Every entry is whole, and no temporary file is left behind.
    let mut entries = 0;
    for shard in std::fs::read_dir(dir.path()).unwrap() {
        for file in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let path = file.unwrap().path();
            assert_eq!(
                path.extension().and_then(|e| e.to_str()),
                Some("json"),
                "{path:?}"
            );
            let entry: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            assert_eq!(entry["completion"]["text"].as_str().unwrap().len(), 10_000);
            entries += 1;
        }
    }
    assert_eq!(entries, 4);
    let replay = LlmCache::new(dir.path(), CacheMode::ReplayOnly);
    for i in 0..4 {
        let hit = replay
            .complete(
                &client,
                &ask("same"),
                i,
                "shared",
                None,
                (&LlmMeter::default(), Role::Judge),
            )
            .await;
        assert_eq!(hit.call.cache, CacheUse::Hit);
    }
}

#[tokio::test]
async fn the_token_rate_limit_holds_a_request_until_its_estimate_fits() {
    let fake = FakeLlm::always("ok").await;
    // 600 tokens a minute (10 a second); each request reserves about 315 (max-tokens plus
    // a few prompt tokens), so the second waits for the bucket to refill by the ~30 tokens
    // it lacks: about 3 s, far from anything the first call waits (the one-time slot probe
    // took up to 400 ms on a loaded 2-core machine) even when that call itself is slow.
    let client = client(&format!(
        r#"provider "p" kind="openai" base-url="{}" model="m" tokens-per-minute=600 max-tokens=312"#,
        fake.base_url()
    ));
    let started = Instant::now();
    let first = client.complete(&ask("x"), None).await;
    assert!(first.result.is_ok());
    // What the limiter made it wait, not the wall time (a loaded machine slows the call
    // itself, not the bucket). The first call's wait also holds the one-time slot probe.
    assert!(
        first.call.waited_ms < 1_000.0,
        "the first fits at once: {:?}",
        first.call
    );
    let second = client.complete(&ask("x"), None).await;
    assert!(second.result.is_ok());
    assert!(
        started.elapsed() >= Duration::from_millis(1_500),
        "{:?}",
        started.elapsed()
    );
    assert!(second.call.waited_ms >= 1_500.0, "{:?}", second.call);
}
