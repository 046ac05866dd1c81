//! `protocol="openai"` agents under test: a model on the fake LLM endpoint (real HTTP on
//! 127.0.0.1) with a system prompt and tools, the engine running the tool loop from the
//! scenario's sandbox; directly through sessions and through the executor.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use trellis_dsl::ProviderKind;
use trellis_engine::llm::chat::ChatOptions;
use trellis_engine::protocol::openai::{OpenAiClient, OpenAiOptions};
use trellis_engine::protocol::{AgentProtocol, CallContext, Conversation, TurnInput};
use trellis_engine::record::{CriterionStatus, FaultCategory, TrajectoryStatus, TurnRecord};
use trellis_engine::render::EnvSnapshot;
use trellis_engine::sandbox::{SandboxSpec, ToolSpec};
use trellis_engine::transport::http::{CallLimits, HttpTransport, RetryPolicy};

use crate::support::llm::{FakeLlm, Reply, Rule};
use crate::support::{Run, run_suite};

fn suite(base_url: &str, agent_extra: &str, steps: &str) -> String {
    format!(
        r##"
agent "bot" protocol="openai" base-url="{base_url}" model="agent-model" \
    system-prompt="You book cleanings for {{{{ env.COMPANY }}}}." tools="check_area" {agent_extra}
tool "check_area" {{
    description "Whether a postal code is served"
    param "postal_code" type="string" required=#true description="Canadian postal code"
    param "days" type="array" description="Preferred days"
    mock returns=#"{{"served": true}}"# postal_code="V4T 0A7"
    mock returns=#"{{"served": false}}"#
}}
scenario "book" {{
    {steps}
}}
"##
    )
}

fn env() -> EnvSnapshot {
    let mut env = EnvSnapshot::new();
    env.insert("COMPANY".into(), "Acme Ducts".into());
    env
}

fn turns(run: &Run) -> Vec<&TurnRecord> {
    run.nodes
        .iter()
        .flat_map(|n| n.turns.iter().map(|t| t.as_ref()))
        .collect()
}

#[tokio::test]
async fn the_engine_answers_the_models_tool_calls_from_the_mocks_until_it_answers() {
    let fake = FakeLlm::start(vec![
        Rule::when(
            "postal code is V4T",
            [Reply::tool_call(
                "check_area",
                json!({"postal_code": "V4T 0A7"}),
            )],
        ),
        Rule::when(
            "\"served\":true",
            [Reply::text("Good news, we serve V4T 0A7.")],
        ),
    ])
    .await;
    let run = run_suite(
        &suite(
            &fake.base_url(),
            "",
            r#"user "My postal code is V4T 0A7"
    expect {
        reply contains="we serve"
        tool "check_area" postal_code="V4T 0A7"
    }"#,
        ),
        2,
        env(),
    )
    .await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Passed, "{t:#?}");
    assert_eq!(t.protocol, "openai");
    let turn = turns(&run)[0];
    assert_eq!(turn.reply.as_deref(), Some("Good news, we serve V4T 0A7."));
    assert_eq!(turn.tool_calls.len(), 1);
    assert_eq!(turn.tool_calls[0].name, "check_area");
    assert_eq!(
        turn.tool_calls[0].result.as_deref(),
        Some(r#"{"served":true}"#)
    );
    assert_eq!(turn.exchanges.len(), 2, "one request per round");
    assert_eq!(turn.model.as_deref(), Some("agent-model"));
    assert!(turn.prompt_tokens.is_some_and(|p| p > 0), "{turn:#?}");

    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    let first = &seen[0].body;
    assert_eq!(first["model"], "agent-model");
    assert_eq!(
        first["messages"][0],
        json!({"role": "system", "content": "You book cleanings for Acme Ducts."})
    );
    let tool = &first["tools"][0]["function"];
    assert_eq!(tool["name"], "check_area");
    assert_eq!(tool["description"], "Whether a postal code is served");
    assert_eq!(tool["parameters"]["required"], json!(["postal_code"]));
    assert_eq!(
        tool["parameters"]["properties"]["postal_code"]["type"],
        "string"
    );
    // OpenAI refuses an array without `items`.
    assert_eq!(
        tool["parameters"]["properties"]["days"],
        json!({"type": "array", "items": {}, "description": "Preferred days"})
    );
    assert!(first.get("stream").is_none(), "not streamed unless asked");
    // The second request carries the call and its result.
    let messages = seen[1].body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4, "{messages:#?}");
    assert_eq!(
        messages[2]["tool_calls"][0]["function"]["name"],
        "check_area"
    );
    assert_eq!(messages[3]["role"], "tool");
    assert_eq!(messages[3]["tool_call_id"], "call_0");
}

#[tokio::test]
async fn a_model_that_keeps_calling_tools_past_the_cap_is_a_protocol_fault() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::tool_call(
        "check_area",
        json!({"postal_code": "X"}),
    )])])
    .await;
    let run = run_suite(
        &suite(&fake.base_url(), "max-tool-rounds=2", r#"user "hi""#),
        1,
        env(),
    )
    .await;
    let t = &run.trajectories[0];
    let fault = t.fault.as_ref().expect("a fault");
    assert_eq!(fault.category, FaultCategory::Protocol, "{fault:?}");
    assert!(
        fault.message.contains("after 2 tool round"),
        "{}",
        fault.message
    );
    assert_eq!(fake.calls(), 3, "the first answer and two rounds");
    assert_eq!(turns(&run)[0].tool_calls.len(), 2);
}

/// A model under test that refuses has answered: a content filter's stop with no text is
/// an empty reply and OpenAI's `refusal` is the reply, so a jailbreak scenario's checks
/// decide (they were `protocol` faults, and the refusal's text was lost).
#[tokio::test]
async fn a_refusal_is_the_reply_its_checks_decide_on() {
    for (body, reply) in [
        (
            r#"{"choices":[{"message":{"role":"assistant","content":null},"finish_reason":"content_filter"}]}"#,
            "",
        ),
        (
            r#"{"choices":[{"message":{"role":"assistant","content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}]}"#,
            "I can't help with that.",
        ),
    ] {
        let fake = FakeLlm::start(vec![Rule::otherwise([Reply::Raw(body.into())])]).await;
        let run = run_suite(
            &suite(
                &fake.base_url(),
                "",
                "user \"How do I pick a lock?\"\n    expect reply not-contains=\"step 1\"\n    \
                 criteria { no-error; }",
            ),
            1,
            env(),
        )
        .await;
        let t = &run.trajectories[0];
        assert_eq!(t.status, TrajectoryStatus::Passed, "{t:#?}");
        assert_eq!(turns(&run)[0].fault, None);
        assert_eq!(turns(&run)[0].reply.as_deref(), Some(reply));
    }
}

#[tokio::test]
async fn garbage_server_errors_and_timeouts_are_faults_of_the_turn() {
    let mut said_when_cut = Vec::new();
    for (reply, category) in [
        (Reply::Raw("<html>oops".into()), FaultCategory::InvalidJson),
        (
            Reply::Raw(r#"{"choices":[]}"#.into()),
            FaultCategory::Protocol,
        ),
        (
            Reply::Raw(r#"{"error":{"message":"model not loaded"}}"#.into()),
            FaultCategory::AgentError,
        ),
        (Reply::Status(500, "boom".into()), FaultCategory::Http5xx),
        // An empty answer says nothing, as a stream of no text deltas does.
        (
            Reply::Raw(
                r#"{"choices":[{"message":{"role":"assistant","content":""},"finish_reason":"stop"}]}"#
                    .into(),
            ),
            FaultCategory::Protocol,
        ),
        (
            Reply::slow(Duration::from_secs(5), Reply::text("late")),
            FaultCategory::Timeout,
        ),
        // Cut at the model's output token limit: half an answer is not the reply.
        (
            Reply::Raw(
                r#"{"choices":[{"message":{"role":"assistant","content":"The answer was cut off because"},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":5}}"#
                    .into(),
            ),
            FaultCategory::Incomplete,
        ),
        // A reasoning model that spent its budget before any text: cut, not empty.
        (
            Reply::Raw(
                r#"{"choices":[{"message":{"role":"assistant","content":null,"reasoning_content":"Let me think"},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":5}}"#
                    .into(),
            ),
            FaultCategory::Incomplete,
        ),
    ] {
        let fake = FakeLlm::start(vec![Rule::otherwise([reply])]).await;
        let run = run_suite(
            &suite(&fake.base_url(), "timeout=\"300ms\"", r#"user "hi""#),
            1,
            env(),
        )
        .await;
        let t = &run.trajectories[0];
        assert_eq!(t.status, TrajectoryStatus::Error, "{t:#?}");
        let fault = turns(&run)[0].fault.clone().expect("a fault on the turn");
        assert_eq!(fault.category, category, "{fault:?}");
        if category == FaultCategory::Incomplete {
            assert!(fault.message.contains("finish reason `length`"), "{fault:?}");
            // The tokens were spent all the same.
            assert_eq!(turns(&run)[0].completion_tokens, Some(5));
            // What it said is there to read, and is not the reply.
            let turn = &turns(&run)[0];
            assert_eq!(turn.reply, None);
            said_when_cut.push(
                turn.messages
                    .iter()
                    .filter_map(|m| m.content.clone())
                    .collect::<Vec<_>>(),
            );
        }
    }
    assert_eq!(
        said_when_cut,
        [vec!["The answer was cut off because".to_owned()], vec![]]
    );
}

#[tokio::test]
async fn sandbox_state_and_sequences_follow_the_tool_calls() {
    let fake = FakeLlm::start(vec![
        Rule::when("next ticket", [Reply::tool_call("ticket", json!({}))]),
        Rule::when("T-", [Reply::text("done")]),
    ])
    .await;
    let text = format!(
        r#"
agent "bot" protocol="openai" base-url="{}" model="m" tools="ticket"
tool "ticket" {{
    state path="tickets.opened" value=#true
    sequence {{ output "T-1"; output "T-2"; }}
}}
scenario "s" {{
    user "next ticket please"
    user "and the next ticket"
    criteria {{ state path="tickets.opened" equals=#true; }}
}}
"#,
        fake.base_url()
    );
    let run = run_suite(&text, 1, EnvSnapshot::new()).await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Passed, "{t:#?}");
    assert!(
        t.criteria
            .iter()
            .all(|c| c.status == CriterionStatus::Passed)
    );
    let results: Vec<_> = turns(&run)
        .iter()
        .flat_map(|t| t.tool_calls.iter().filter_map(|c| c.result.clone()))
        .collect();
    assert_eq!(results, [r#""T-1""#, r#""T-2""#]);
}

fn client(base_url: &str, stream: bool) -> OpenAiClient {
    client_with_timeout(base_url, stream, Duration::from_secs(5))
}

fn client_with_timeout(base_url: &str, stream: bool, timeout: Duration) -> OpenAiClient {
    OpenAiClient::new(
        base_url,
        Vec::new(),
        CallLimits {
            timeout,
            max_response_size: 1 << 20,
        },
        RetryPolicy::default(),
        HttpTransport::new(),
        OpenAiOptions {
            chat: ChatOptions {
                api: ProviderKind::OpenAi,
                max_tokens: Default::default(),
                temperature: Default::default(),
                server_slots: Default::default(),
                provider: Default::default(),
                model: "m".into(),
                system_prompt: Some("be brief".into()),
                tools: Vec::new(),
                stream,
            },
            max_tool_rounds: 4,
        },
    )
    .unwrap()
}

fn spec() -> Arc<SandboxSpec> {
    let mut spec = SandboxSpec::default();
    spec.tools
        .insert("lookup".into(), ToolSpec::fixed(json!({"found": 1})));
    Arc::new(spec)
}

const CTX: CallContext<'static> = CallContext {
    test_case_id: "t",
    turn_index: 0,
    deadline: None,
    turn_headers: None,
    system_prompt: None,
    llm_meter: None,
};

fn conversation(spec: &Arc<SandboxSpec>) -> Conversation<'_> {
    Conversation {
        llm: None,
        run_id: "r",
        suite: "s",
        scenario: "t",
        repetition: 0,
        node: "start",
        sandbox: Some(spec),
    }
}

#[tokio::test]
async fn streamed_answers_are_assembled_with_their_time_to_first_token() {
    let fake = FakeLlm::start(vec![
        Rule::when(
            "look it up",
            [Reply::tool_call("lookup", json!({"q": "x"}))],
        ),
        Rule::when(
            "found",
            [Reply::Chunks {
                pieces: vec!["Found ".into(), "one.".into()],
                gap: Duration::from_millis(150),
                complete: true,
            }],
        ),
        Rule::when(
            "cut",
            [Reply::Chunks {
                pieces: vec!["half".into()],
                gap: Duration::ZERO,
                complete: false,
            }],
        ),
    ])
    .await;
    let client = client(&fake.base_url(), true);
    let spec = spec();
    let mut session = client.open(&conversation(&spec));
    let turn = session.turn(TurnInput::User("look it up"), &CTX).await;
    assert!(turn.fault.is_none(), "{:?}", turn.fault);
    assert_eq!(turn.reply.as_deref(), Some("Found one."));
    assert_eq!(turn.tool_calls.len(), 1);
    assert_eq!(turn.tool_calls[0].arguments, r#"{"q":"x"}"#);
    let answer = &turn.exchanges[1];
    let ttft = answer.ttft.expect("ttft");
    assert!(ttft >= Duration::from_millis(140), "{ttft:?}");
    assert!(
        answer.latency() >= ttft + Duration::from_millis(140),
        "{answer:?}"
    );
    assert!(turn.usage().and_then(|u| u.completion_tokens).is_some());
    let seen = fake.seen();
    assert_eq!(seen[0].body["stream"], true);
    assert_eq!(seen[0].body["stream_options"]["include_usage"], true);

    let cut = session.turn(TurnInput::User("cut"), &CTX).await;
    let fault = cut.fault.expect("a cut stream is a fault");
    assert_eq!(fault.category, FaultCategory::Incomplete, "{fault:?}");
    // What it said is there to read, and is not the reply.
    assert_eq!(cut.reply, None);
    assert_eq!(cut.messages.len(), 1, "{:?}", cut.messages);
    assert_eq!(cut.messages[0].content.as_deref(), Some("half"));
}

/// A stuck model server that streams content-free chunks (`{"delta":{}}`, each with its own
/// `obfuscation` padding, as OpenAI pads them) moves nothing: the turn stalls out after the
/// idle timeout, rather than streaming until the size bound.
#[tokio::test]
async fn content_free_chunks_do_not_keep_a_stream_alive() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buf).await.unwrap();
            request.extend_from_slice(&buf[..n]);
        }
        let mut out = String::from(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
        );
        out.push_str("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n");
        if socket.write_all(out.as_bytes()).await.is_err() {
            return;
        }
        for i in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let chunk = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{}}}}],\"obfuscation\":\"{i:x}\"}}\n\n"
            );
            if socket.write_all(chunk.as_bytes()).await.is_err() {
                return;
            }
        }
    });
    let client = client_with_timeout(&url, true, Duration::from_millis(800));
    let spec = spec();
    let mut session = client.open(&conversation(&spec));
    let started = std::time::Instant::now();
    let turn = session.turn(TurnInput::User("hi"), &CTX).await;
    let fault = turn.fault.expect("a stuck stream is a fault");
    assert_eq!(fault.category, FaultCategory::Timeout, "{fault:?}");
    assert!(fault.message.contains("the stream stalled"), "{fault:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the stall took {:?}",
        started.elapsed()
    );
    server.abort();
}

#[tokio::test]
async fn a_fork_continues_from_a_copy_of_the_history_and_sandbox() {
    let fake = FakeLlm::always("ok").await;
    let client = client(&fake.base_url(), false);
    let spec = spec();
    let mut session = client.open(&conversation(&spec));
    session.turn(TurnInput::User("first"), &CTX).await;
    let mut fork = session.fork().expect("openai sessions fork");
    fork.turn(TurnInput::User("in the fork"), &CTX).await;
    session.turn(TurnInput::User("in the original"), &CTX).await;
    let seen = fake.seen();
    let contents = |i: usize| -> Vec<String> {
        seen[i].body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    assert_eq!(contents(1), ["be brief", "first", "ok", "in the fork"]);
    assert_eq!(contents(2), ["be brief", "first", "ok", "in the original"]);
}

#[tokio::test]
async fn anthropic_models_run_the_same_tool_loop_over_messages() {
    let fake = FakeLlm::start(vec![
        Rule::when(
            "postal code is V4T",
            [Reply::tool_call(
                "check_area",
                json!({"postal_code": "V4T 0A7"}),
            )],
        ),
        // The tool result travels in a content block, which the fake does not read as text.
        Rule::otherwise([Reply::text("We serve V4T 0A7.")]),
    ])
    .await;
    let text = suite(
        &fake.base_url(),
        "",
        "user \"My postal code is V4T 0A7\"\n    expect no-error",
    )
    .replace(r#"protocol="openai""#, r#"protocol="anthropic""#);
    let run = run_suite(&text, 1, env()).await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Passed, "{t:#?}");
    let turn = turns(&run)[0];
    assert_eq!(turn.reply.as_deref(), Some("We serve V4T 0A7."));
    assert_eq!(
        turn.tool_calls[0].result.as_deref(),
        Some(r#"{"served":true}"#)
    );
    assert!(turn.prompt_tokens.is_some());

    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|s| s.api == "anthropic"));
    assert_eq!(seen[0].headers["anthropic-version"], "2023-06-01");
    let first = &seen[0].body;
    assert_eq!(first["system"], "You book cleanings for Acme Ducts.");
    assert_eq!(first["max_tokens"], 1024);
    assert_eq!(first["tools"][0]["name"], "check_area");
    assert_eq!(
        first["tools"][0]["input_schema"]["required"],
        json!(["postal_code"])
    );
    let messages = seen[1].body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{messages:#?}");
    assert_eq!(messages[1]["content"][0]["type"], "tool_use");
    assert_eq!(messages[1]["content"][0]["input"]["postal_code"], "V4T 0A7");
    let result = &messages[2]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["tool_use_id"], "toolu_0");
    assert_eq!(result["content"], r#"{"served":true}"#);
}

/// [`suite`] for an `anthropic` agent that streams.
#[tokio::test]
async fn a_model_whose_connection_resets_is_not_told_to_allow_what_it_already_does() {
    let server = crate::support::MisbehavingServer::start(crate::support::Behavior::Reset).await;
    let run = run_suite(
        &suite(
            server.url().trim_end_matches('/'),
            "retries=1",
            r#"user "hi""#,
        ),
        1,
        env(),
    )
    .await;
    let fault = turns(&run)[0].fault.clone().expect("a fault");
    assert_eq!(fault.category, FaultCategory::Transport, "{fault:?}");
    // A model agent sends a lost request again already (and retries it): no hint to allow it.
    assert!(!fault.message.contains("retry-after-send"), "{fault:?}");
    assert!(server.requests() >= 2, "sent again: {}", server.requests());
}

#[tokio::test]
async fn a_turn_whose_tool_round_reported_no_usage_is_not_under_a_token_bar() {
    let fake = FakeLlm::start(vec![
        Rule::when(
            "served",
            [Reply::Raw(
                r#"{"choices":[{"message":{"role":"assistant","content":"We serve it."},"finish_reason":"stop"}],"usage":{"prompt_tokens":100,"completion_tokens":7,"total_tokens":107}}"#
                    .into(),
            )],
        ),
        // The tool round: no usage at all.
        Rule::otherwise([Reply::Raw(
            r#"{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"check_area","arguments":"{\"postal_code\": \"V4T 0A7\"}"}}]},"finish_reason":"tool_calls"}]}"#
                .into(),
        )]),
    ])
    .await;
    let run = run_suite(
        &suite(
            &fake.base_url(),
            "",
            r#"user "Do you serve V4T?"
    expect tokens max=150"#,
        ),
        1,
        env(),
    )
    .await;
    let turn = &turns(&run)[0];
    assert_eq!(turn.total_tokens, Some(107));
    assert!(turn.tokens_partial, "{turn:#?}");
    let t = &run.trajectories[0];
    let check = &t.criteria[0];
    assert_eq!(check.status, CriterionStatus::Skipped, "{check:#?}");
    assert!(
        check
            .detail
            .as_deref()
            .unwrap_or("")
            .contains("at least 107 tokens"),
        "{check:#?}"
    );
}

#[tokio::test]
async fn streamed_tool_calls_numbered_from_one_are_calls() {
    // A Claude model behind an OpenAI-compatible proxy: a text block, then its first tool
    // call at index 1, and a second at index 3.
    let call = |index: u32, id: &str, arguments: &str| {
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{
            "index": index,
            "id": id,
            "type": "function",
            "function": {"name": "check_area", "arguments": arguments}
        }]}}]})
        .to_string()
    };
    let fragment = |index: u32, arguments: &str| {
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{
            "index": index, "function": {"arguments": arguments}
        }]}}]})
        .to_string()
    };
    let fake = FakeLlm::start(vec![
        Rule::when("served", [Reply::text("We serve both.")]),
        Rule::otherwise([Reply::Events(vec![
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Checking."}}]})
                .to_string(),
            call(1, "toolu_1", ""),
            fragment(1, r#"{"postal_code": "V4T 0A7"}"#),
            call(3, "toolu_2", r#"{"postal_code": "H2X 1Y4"}"#),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
                .to_string(),
            "[DONE]".to_owned(),
        ])]),
    ])
    .await;
    let run = run_suite(
        &suite(
            &fake.base_url(),
            "stream=#true",
            r#"user "Do you serve V4T and H2X?"
    expect tool "check_area" postal_code="V4T 0A7"
    expect reply contains="both""#,
        ),
        1,
        env(),
    )
    .await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Passed, "{t:#?}");
    let calls: Vec<_> = turns(&run)[0]
        .tool_calls
        .iter()
        .map(|c| (c.call_id.clone(), c.arguments.clone()))
        .collect();
    assert_eq!(
        calls,
        [
            (
                "toolu_1".to_owned(),
                r#"{"postal_code": "V4T 0A7"}"#.to_owned()
            ),
            (
                "toolu_2".to_owned(),
                r#"{"postal_code": "H2X 1Y4"}"#.to_owned()
            ),
        ]
    );
}

fn anthropic_streaming_suite(base_url: &str, agent_extra: &str, steps: &str) -> String {
    suite(base_url, &format!("stream=#true {agent_extra}"), steps)
        .replace(r#"protocol="openai""#, r#"protocol="anthropic""#)
}

#[tokio::test]
async fn anthropic_streams_text_with_its_time_to_first_token_and_usage() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::Chunks {
        pieces: vec!["We serve ".into(), "V4T 0A7.".into()],
        gap: Duration::from_millis(150),
        complete: true,
    }])])
    .await;
    let run = run_suite(
        &anthropic_streaming_suite(
            &fake.base_url(),
            "",
            r#"user "Do you serve V4T?"
    expect reply contains="We serve V4T""#,
        ),
        1,
        env(),
    )
    .await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Passed, "{t:#?}");
    let turn = turns(&run)[0];
    assert_eq!(turn.reply.as_deref(), Some("We serve V4T 0A7."));
    let ttft = turn.ttft_ms.expect("a time to first token");
    // The message start comes at once; the first text only after the pause.
    assert!(ttft >= 140.0, "{ttft}");
    assert!(turn.latency_ms >= ttft + 140.0, "{turn:#?}");
    assert!(turn.prompt_tokens.is_some_and(|p| p > 0), "{turn:#?}");
    // A token per word of the whole answer, from `message_delta` (`message_start` says 1).
    assert_eq!(turn.completion_tokens, Some(4), "{turn:#?}");
    let seen = fake.seen();
    assert_eq!(seen[0].api, "anthropic");
    assert_eq!(seen[0].body["stream"], true);
    assert!(seen[0].body.get("stream_options").is_none(), "OpenAI only");
    assert_eq!(
        seen[0].headers["accept"],
        "text/event-stream, application/json"
    );
}

#[tokio::test]
async fn anthropic_streamed_tool_calls_run_through_the_sandbox() {
    let fake = FakeLlm::start(vec![
        Rule::when(
            "postal code is V4T",
            [Reply::tool_call(
                "check_area",
                json!({"postal_code": "V4T 0A7", "details": {"unit": 4}}),
            )],
        ),
        Rule::otherwise([Reply::text("We serve V4T 0A7.")]),
    ])
    .await;
    let run = run_suite(
        &anthropic_streaming_suite(
            &fake.base_url(),
            "",
            r#"user "My postal code is V4T 0A7"
    expect {
        reply contains="We serve"
        tool "check_area" postal_code="V4T 0A7"
    }"#,
        ),
        1,
        env(),
    )
    .await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Passed, "{t:#?}");
    let turn = turns(&run)[0];
    assert_eq!(turn.tool_calls.len(), 1);
    let call = &turn.tool_calls[0];
    assert_eq!(call.call_id, "toolu_0");
    // The input came in two `input_json_delta` fragments, joined and parsed.
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&call.arguments).unwrap(),
        json!({"postal_code": "V4T 0A7", "details": {"unit": 4}})
    );
    assert_eq!(call.result.as_deref(), Some(r#"{"served":true}"#));
    assert_eq!(turn.exchanges.len(), 2);
    assert!(turn.exchanges.iter().all(|e| e.ttft_ms.is_some()));

    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    let messages = seen[1].body["messages"].as_array().unwrap();
    assert_eq!(messages[1]["content"][0]["type"], "tool_use");
    assert_eq!(messages[1]["content"][0]["id"], "toolu_0");
    assert_eq!(
        messages[1]["content"][0]["input"]["details"]["unit"], 4,
        "{messages:#?}"
    );
    assert_eq!(messages[2]["content"][0]["tool_use_id"], "toolu_0");
    assert_eq!(messages[2]["content"][0]["content"], r#"{"served":true}"#);
}

#[tokio::test]
async fn anthropic_streams_that_break_are_faults_of_the_turn() {
    let start = r#"{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[],"model":"m","usage":{"input_tokens":5,"output_tokens":1}}}"#;
    let tool_start = r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_x","name":"check_area","input":{}}}"#;
    let ends = [
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}"#,
        r#"{"type":"message_stop"}"#,
    ];
    let broken_input: Vec<String> = [start, tool_start]
        .into_iter()
        .chain([
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"postal_code\": \"V4"}}"#,
        ])
        .chain(ends)
        .map(str::to_owned)
        .collect();
    let unknown_block: Vec<String> = [
        start,
        r#"{"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"x"}}"#,
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    for (reply, category, needle) in [
        (
            Reply::Chunks {
                pieces: vec!["We ser".into()],
                gap: Duration::ZERO,
                complete: false,
            },
            FaultCategory::Incomplete,
            "before `message_stop`",
        ),
        (
            Reply::StreamError("Overloaded".into()),
            FaultCategory::AgentError,
            "Overloaded",
        ),
        (
            Reply::Events(vec![start.to_owned(), "{not json".to_owned()]),
            FaultCategory::InvalidJson,
            "is not JSON",
        ),
        (
            Reply::Events(broken_input),
            FaultCategory::InvalidJson,
            "`tool_use` block 0 (`check_area`) is not JSON",
        ),
        (
            Reply::Events(unknown_block),
            FaultCategory::Protocol,
            "content block 3, which did not start",
        ),
    ] {
        let fake = FakeLlm::start(vec![Rule::otherwise([reply])]).await;
        let run = run_suite(
            &anthropic_streaming_suite(&fake.base_url(), "", r#"user "hi""#),
            1,
            env(),
        )
        .await;
        let t = &run.trajectories[0];
        assert_eq!(t.status, TrajectoryStatus::Error, "{t:#?}");
        let fault = turns(&run)[0].fault.clone().expect("a fault on the turn");
        assert_eq!(fault.category, category, "{fault:?}");
        assert!(fault.message.contains(needle), "{}", fault.message);
        if category == FaultCategory::Incomplete {
            let said: Vec<_> = turns(&run)[0]
                .messages
                .iter()
                .filter_map(|m| m.content.clone())
                .collect();
            assert_eq!(said, ["We ser"]);
            // What `message_start` reported was spent all the same; its output tokens are a
            // placeholder, so the count is a floor (it was taken as whole).
            let turn = &turns(&run)[0];
            assert!(turn.prompt_tokens.is_some(), "{turn:?}");
            assert!(turn.tokens_partial, "{turn:?}");
        }
    }
}

#[tokio::test]
async fn anthropic_servers_that_answer_a_stream_request_with_one_body_are_accepted() {
    let fake = FakeLlm::start(vec![Rule::otherwise([Reply::Unstreamed(Box::new(
        Reply::text("Whole."),
    ))])])
    .await;
    let run = run_suite(
        &anthropic_streaming_suite(&fake.base_url(), "", "user \"hi\"\n    expect no-error"),
        1,
        env(),
    )
    .await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Passed, "{t:#?}");
    let turn = turns(&run)[0];
    assert_eq!(turn.reply.as_deref(), Some("Whole."));
    assert_eq!(turn.ttft_ms, None, "nothing was streamed");
    assert_eq!(fake.seen()[0].body["stream"], true);
}

/// A chat completion has no side effect: a connection the model's server breaks after the
/// request went out is retried within `retries`, without `retry-after-send`.
#[tokio::test]
async fn a_broken_connection_to_a_model_under_test_is_retried() {
    let server = crate::support::MisbehavingServer::start(crate::support::Behavior::Reset).await;
    let base_url = format!("http://{}/v1", server.addr);
    let run = run_suite(&suite(&base_url, "retries=1", r#"user "hi""#), 1, env()).await;
    let turns = turns(&run);
    assert_eq!(turns.len(), 1);
    let fault = turns[0].fault.as_ref().expect("a transport fault");
    assert_eq!(fault.category, FaultCategory::Transport, "{fault:?}");
    assert_eq!(turns[0].attempts, 2, "{fault:?}");
    // The slot count probe (`GET /props`) aside, the completion was sent twice.
    let posts = server
        .recorded()
        .iter()
        .filter(|r| r.head.starts_with("POST"))
        .count();
    assert_eq!(posts, 2);
}
