//! `protocol="http"` over real sockets: misbehaving servers (testkit's, and raw-TCP ones
//! written here for streams) each give a fault of their category on the turn; the request
//! template, session capture (header and `{{ session }}`, fork by replay) and tool calls
//! against servers that record what they were sent.

use std::time::Duration;

use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use trellis_engine::protocol::jsonhttp::codec;
use trellis_engine::record::{FaultCategory, TrajectoryRecord, TrajectoryStatus};
use trellis_engine::render::EnvSnapshot;
use trellis_engine::transport::sse::SseEvent;

use crate::support::{Behavior, MisbehavingServer, Run, run_suite};

/// An `http` agent at `url`, one user turn, with `extra` settings in its block.
fn suite(url: &str, extra: &str) -> String {
    format!(
        r##"
agent "bot" protocol="http" url="{url}" {{
    timeout "1s"
    request #"{{"q": {{{{ user | tojson }}}}, "history": {{{{ messages | tojson }}}}}}"#
    {extra}
}}
scenario "one" {{
    user "hello"
}}
"##
    )
}

async fn only(text: &str) -> TrajectoryRecord {
    let run: Run = run_suite(text, 2, EnvSnapshot::new()).await;
    assert_eq!(run.trajectories.len(), 1, "{:?}", run.trajectories);
    run.trajectories.into_iter().next().unwrap()
}

async fn fault_of(server: &MisbehavingServer, extra: &str) -> (FaultCategory, String) {
    let t = only(&suite(&server.url(), extra)).await;
    assert_eq!(t.status, TrajectoryStatus::Error, "{t:?}");
    let fault = t.fault.expect("a faulted trajectory has its fault");
    (fault.category, fault.message)
}

const REPLY: &str = r#"reply json-path="$.answer""#;

#[tokio::test]
async fn every_misbehaviour_is_a_fault_of_its_category() {
    let cases = [
        (
            Behavior::Respond {
                status: 503,
                body: "down".into(),
            },
            FaultCategory::Http5xx,
        ),
        (
            Behavior::Respond {
                status: 200,
                body: "<html>not json".into(),
            },
            FaultCategory::InvalidJson,
        ),
        (Behavior::Reset, FaultCategory::Transport),
        (Behavior::Truncated, FaultCategory::Transport),
        (
            Behavior::Huge {
                bytes: 64 * 1024,
                content_length: false,
            },
            FaultCategory::TooLarge,
        ),
        (
            Behavior::SlowDrip {
                interval: Duration::from_millis(200),
            },
            FaultCategory::Timeout,
        ),
    ];
    for (behavior, category) in cases {
        let server = MisbehavingServer::start(behavior.clone()).await;
        let extra = match behavior {
            Behavior::Huge { .. } => format!("{REPLY}\n    max-response-size \"16KiB\""),
            _ => REPLY.to_owned(),
        };
        let (got, message) = fault_of(&server, &extra).await;
        assert_eq!(got, category, "{behavior:?}: {message}");
    }
}

#[tokio::test]
async fn a_path_that_matches_nothing_is_a_fault_naming_it_and_quoting_the_body() {
    let server = MisbehavingServer::respond(200, r#"{"output": "hi"}"#).await;
    let (category, message) = fault_of(&server, REPLY).await;
    assert_eq!(category, FaultCategory::Protocol);
    assert!(message.contains("`$.answer`"), "{message}");
    assert!(message.contains(r#"{"output": "hi"}"#), "{message}");
}

#[tokio::test]
async fn a_request_that_renders_to_something_else_than_json_is_a_template_fault() {
    let server = MisbehavingServer::respond(200, r#"{"answer": "hi"}"#).await;
    let text = suite(&server.url(), REPLY).replace(
        r##"request #"{"q": {{ user | tojson }}"##,
        r##"request #"{"q": {{ user }}"##,
    );
    let t = only(&text).await;
    let fault = t.fault.expect("faulted");
    assert_eq!(fault.category, FaultCategory::Template, "{fault:?}");
    assert!(
        fault.message.contains(r#"{"q": hello,"#),
        "{}",
        fault.message
    );
    assert_eq!(server.requests(), 0, "nothing is sent");
}

#[tokio::test]
async fn the_template_sends_the_conversation_and_the_session_comes_back() {
    let server =
        MisbehavingServer::respond(200, r#"{"answer": "ok", "sid": "abc-1", "calls": null}"#).await;
    let text = format!(
        r##"
agent "bot" protocol="http" url="{}" {{
    request #"{{"q": {{{{ user | tojson }}}}, "s": {{{{ session | tojson }}}}, "n": {{{{ messages | length }}}}, "day": {{{{ user_context.day | tojson }}}}}}"#
    reply json-path="$.answer"
    tool-calls json-path="$.calls"
    session json-path="$.sid" header="X-Session-Id"
}}
scenario "s" {{
    user-context {{ day "Tuesday" }}
    user "first"
    branch "a" {{ user "second"; }}
    branch "b" {{ user "third"; }}
    criteria {{ no-error }}
}}
"##,
        server.url()
    );
    let run = run_suite(&text, 1, EnvSnapshot::new()).await;
    assert!(
        run.trajectories
            .iter()
            .all(|t| t.status == TrajectoryStatus::Passed),
        "{:?}",
        run.trajectories
    );
    let sent = server.recorded();
    // Session-bound: the prefix is replayed in a fresh session for the second branch.
    assert_eq!(sent.len(), 4, "{sent:?}");
    let first = sent[0].json();
    assert_eq!(first["s"], serde_json::Value::Null);
    assert_eq!(first["n"], 1);
    assert_eq!(first["day"], "Tuesday");
    assert_eq!(sent[0].header("x-session-id"), None);
    let later = sent[1].json();
    assert_eq!(later["s"], "abc-1");
    assert_eq!(later["n"], 3, "user, assistant, user");
    assert_eq!(sent[1].header("x-session-id").as_deref(), Some("abc-1"));
}

/// The agent ran its own tools: the next requests' `messages` carry its answer's text, not
/// its `tool_calls` (whose results Trellis never saw, and which an OpenAI-compatible model
/// refuses without them); the turn's record keeps the calls.
#[tokio::test]
async fn the_agents_own_tool_calls_are_not_replayed_in_the_history() {
    let server = MisbehavingServer::respond(
        200,
        r#"{"answer": "Booked.", "calls": [{"id": "c1", "type": "function", "function": {"name": "book", "arguments": "{}"}}]}"#,
    )
    .await;
    let text = format!(
        r##"
agent "bot" protocol="http" url="{}" {{
    request #"{{"history": {{{{ messages | tojson }}}}, "lc": {{{{ langchain_messages | tojson }}}}}}"#
    reply json-path="$.answer"
    tool-calls json-path="$.calls"
}}
scenario "s" {{
    user "book it"
    expect tool "book"
    user "thanks"
}}
"##,
        server.url()
    );
    let run = run_suite(&text, 1, EnvSnapshot::new()).await;
    assert_eq!(
        run.trajectories[0].status,
        TrajectoryStatus::Passed,
        "{run:?}"
    );
    let sent = server.recorded();
    let later = sent[1].json();
    let history = later["history"].as_array().unwrap();
    assert_eq!(history.len(), 3, "{history:?}");
    assert_eq!(history[1]["role"], "assistant");
    assert_eq!(history[1]["content"], "Booked.");
    assert!(
        history[1]["tool_calls"]
            .as_array()
            .is_none_or(|calls| calls.is_empty()),
        "{history:?}"
    );
    let lc = later["lc"].as_array().unwrap();
    assert!(
        lc[1]["tool_calls"]
            .as_array()
            .is_none_or(|calls| calls.is_empty()),
        "{lc:?}"
    );
}

#[tokio::test]
async fn the_answer_body_is_the_turns_structured_data_for_checks_and_captures() {
    let server = MisbehavingServer::respond(
        200,
        r#"{"output": {"content": "", "type": "ai", "tool_calls": [{"name": "book_flight",
            "args": {"destination": "Rome", "passengers": 2}, "id": "call_1", "type": "tool_call"}]},
            "metadata": {"run_id": "run-42", "feedback_tokens": []}}"#,
    )
    .await;
    let text = format!(
        r##"
agent "bot" protocol="http" url="{}" {{
    request #"{{"q": {{{{ user | tojson }}}}}}"#
    reply json-path="$.output.content"
    tool-calls json-path="$.output.tool_calls"
}}
scenario "s" {{
    user "fly to Rome"
    expect reply json-path="$.output.tool_calls[0].args.destination" equals="Rome"
    expect reply json-path="$.output.tool_calls[0].args.passengers" equals=2
    capture "run" json-path="$.metadata.run_id"
    user "run {{{{ vars.run }}}}"
}}
"##,
        server.url()
    );
    let t = only(&text).await;
    assert_eq!(t.status, TrajectoryStatus::Passed, "{t:?}");
    let sent = server.recorded();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[1].json()["q"], "run run-42");
}

#[tokio::test]
async fn a_session_missing_from_the_first_answer_is_a_protocol_fault() {
    let server = MisbehavingServer::respond(200, r#"{"answer": "ok"}"#).await;
    let (category, message) = fault_of(
        &server,
        &format!("{REPLY}\n    session json-path=\"$.sid\""),
    )
    .await;
    assert_eq!(category, FaultCategory::Protocol);
    assert!(message.contains("`$.sid`"), "{message}");
}

/// A server that answers every request with `head` and `body`, then closes (or, with
/// `hang`, keeps the connection open without a word).
async fn raw_server(body: impl Into<String>, hang: bool) -> String {
    let body: std::sync::Arc<str> = body.into().into();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/stream", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = stream.read(&mut buf).await;
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(body.as_bytes()).await;
                if hang {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
            });
        }
    });
    url
}

const STREAM: &str = r#"stream json-path="$.content""#;

#[tokio::test]
async fn a_stream_without_its_end_event_is_incomplete_and_a_silent_one_times_out() {
    let events =
        "event: data\ndata: {\"content\": \"Hel\"}\n\nevent: data\ndata: {\"content\": \"lo\"}\n\n";
    let url = raw_server(events, false).await;
    let t = only(&suite(&url, STREAM)).await;
    assert_eq!(
        t.fault.as_ref().map(|f| f.category),
        Some(FaultCategory::Incomplete),
        "{t:?}"
    );
    let url = raw_server(events, true).await;
    let t = only(&suite(&url, STREAM)).await;
    assert_eq!(
        t.fault.as_ref().map(|f| f.category),
        Some(FaultCategory::Timeout),
        "{t:?}"
    );
    let url = raw_server("event: data\ndata: {not json\n\n", false).await;
    let t = only(&suite(&url, STREAM)).await;
    assert_eq!(
        t.fault.as_ref().map(|f| f.category),
        Some(FaultCategory::InvalidJson),
        "{t:?}"
    );
}

#[tokio::test]
async fn a_redirect_is_a_fault_streamed_or_not_and_is_never_followed() {
    // Where the redirect points: an agent that would answer, and counts what reaches it.
    let elsewhere = MisbehavingServer::respond(
        200,
        "event: data\ndata: {\"content\": \"from elsewhere\"}\n\nevent: end\n\n",
    )
    .await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/stream", listener.local_addr().unwrap());
    let location = format!("{}/shutdown", elsewhere.url().trim_end_matches('/'));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let location = location.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = stream.read(&mut buf).await;
                let head = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nlocation: {location}\r\n\
                     content-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = stream.write_all(head.as_bytes()).await;
            });
        }
    });
    for extra in [STREAM, r#"reply json-path="$.content""#] {
        let text = suite(&url, extra).replace(
            "user \"hello\"",
            "user \"hello\"\n    expect reply contains=\"elsewhere\"",
        );
        let t = only(&text).await;
        assert_eq!(t.status, TrajectoryStatus::Error, "{extra}: {t:?}");
        let fault = t.fault.as_ref().expect("a fault");
        assert_eq!(
            fault.category,
            FaultCategory::Protocol,
            "{extra}: {fault:?}"
        );
        assert!(fault.message.contains("HTTP 307"), "{extra}: {fault:?}");
        // Where it points, so the user can put that in `url=`.
        assert!(
            fault
                .message
                .contains("/shutdown: Trellis does not follow redirects"),
            "{extra}: {fault:?}"
        );
    }
    assert_eq!(elsewhere.requests(), 0, "a redirect was followed");
}

#[tokio::test]
async fn a_complete_stream_joins_its_deltas() {
    let url = raw_server(
        "event: metadata\ndata: {\"run_id\": \"r\"}\n\nevent: data\ndata: {\"content\": \"Hel\"}\n\nevent: data\ndata: {\"content\": \"lo\"}\n\nevent: end\n\n",
        true,
    )
    .await;
    let text = suite(&url, STREAM).replace(
        "user \"hello\"",
        "user \"hello\"\n    expect reply equals=\"Hello\"",
    );
    let t = only(&text).await;
    assert_eq!(t.status, TrajectoryStatus::Passed, "{t:?}");
}

#[tokio::test]
async fn a_rate_limited_stream_is_waited_out_and_then_read() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/stream", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut served = 0;
        while let Ok((mut stream, _)) = listener.accept().await {
            served += 1;
            let limited = served == 1;
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = stream.read(&mut buf).await;
                let answer = if limited {
                    "HTTP/1.1 429 Too Many Requests\r\nretry-after: 0\r\ncontent-length: 0\r\n\
                     connection: close\r\n\r\n"
                } else {
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n\
                     event: data\ndata: {\"content\": \"Hello\"}\n\nevent: end\n\n"
                };
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    let text = suite(&url, STREAM).replace(
        "user \"hello\"",
        "user \"hello\"\n    expect reply equals=\"Hello\"",
    );
    let run: Run = run_suite(&text, 2, EnvSnapshot::new()).await;
    let t = &run.trajectories[0];
    assert_eq!(t.status, TrajectoryStatus::Passed, "{t:?}");
    let turn = &run.nodes[0].turns[0];
    assert_eq!(turn.attempts, 2, "{turn:?}");
    let first = turn.exchanges[0].attempts[0]
        .fault
        .as_ref()
        .expect("the 429");
    assert!(first.message.contains("HTTP 429"), "{first:?}");
}

/// What LangServe's `/stream` sends for a chat model that says a few words and calls a
/// tool (langserve 0.3, langchain-core 1.x): AIMessageChunks whose `tool_call_chunks` are
/// fragments merged by `index`, next to the partial `tool_calls` LangChain parsed from each
/// fragment alone (the last fragment, not JSON by itself, is only an `invalid_tool_call`).
fn langserve_tool_call_stream(first_fragment_named: bool) -> String {
    let chunk = |content: &str, calls: serde_json::Value, chunks: serde_json::Value| {
        let data = serde_json::json!({
            "content": content, "additional_kwargs": {}, "response_metadata": {},
            "type": "AIMessageChunk", "name": null, "id": null, "tool_calls": calls,
            "invalid_tool_calls": [], "usage_metadata": null, "tool_call_chunks": chunks,
            "chunk_position": null,
        });
        format!("event: data\ndata: {data}\n\n")
    };
    let fragment = |name: Option<&str>, id: Option<&str>, args: &str| serde_json::json!([{"name": name, "args": args, "id": id, "index": 0, "type": "tool_call_chunk"}]);
    let (name, id) = if first_fragment_named {
        (Some("book_flight"), Some("call_1"))
    } else {
        (None, None)
    };
    [
        "event: metadata\ndata: {\"run_id\": \"9468d5a9\"}\n\n".to_owned(),
        chunk("Booking ", serde_json::json!([]), serde_json::json!([])),
        chunk("now.", serde_json::json!([]), serde_json::json!([])),
        chunk(
            "",
            serde_json::json!([{"name": name.unwrap_or(""), "args": {}, "id": id, "type": "tool_call"}]),
            fragment(name, id, ""),
        ),
        chunk(
            "",
            serde_json::json!([{"name": "", "args": {"destination": "Oslo"}, "id": null, "type": "tool_call"}]),
            fragment(None, None, "{\"destination\": \"Oslo\", \"pas"),
        ),
        chunk(
            "",
            serde_json::json!([]),
            fragment(None, None, "sengers\": 2, \"date\": \"May 2\"}"),
        ),
        "event: end\n\n".to_owned(),
    ]
    .concat()
}

#[tokio::test]
async fn langserve_streamed_tool_call_chunks_are_merged_into_one_call_at_either_path() {
    let url = raw_server(langserve_tool_call_stream(true), false).await;
    for tools in ["$.tool_calls", "$.tool_call_chunks"] {
        let text = suite(
            &url,
            &format!("{STREAM}\n    tool-calls json-path=\"{tools}\""),
        )
        .replace(
            "user \"hello\"",
            "user \"hello\"\n    expect {\n        reply equals=\"Booking now.\"\n        \
             tool \"book_flight\" destination=\"Oslo\" date=\"May 2\" passengers=2 count=1\n    }",
        );
        let t = only(&text).await;
        assert_eq!(t.status, TrajectoryStatus::Passed, "{tools}: {t:?}");
    }
}

#[tokio::test]
async fn a_streams_structured_data_is_its_last_data_event() {
    let url = raw_server(
        "event: metadata\ndata: {\"run_id\": \"r\"}\n\nevent: data\ndata: {\"content\": \"Hi\"}\n\nevent: data\ndata: {\"content\": \"\", \"response_metadata\": {\"finish_reason\": \"stop\"}}\n\nevent: end\n\n",
        false,
    )
    .await;
    let text = suite(&url, STREAM).replace(
        "user \"hello\"",
        "user \"hello\"\n    expect reply equals=\"Hi\"\n    \
         expect reply json-path=\"$.response_metadata.finish_reason\" equals=\"stop\"",
    );
    let t = only(&text).await;
    assert_eq!(t.status, TrajectoryStatus::Passed, "{t:?}");
}

#[tokio::test]
async fn streamed_fragments_that_never_name_their_call_are_a_protocol_fault_quoting_them() {
    let url = raw_server(langserve_tool_call_stream(false), false).await;
    let (category, message) = {
        let t = only(&suite(
            &url,
            &format!("{STREAM}\n    tool-calls json-path=\"$.tool_call_chunks\""),
        ))
        .await;
        let fault = t.fault.expect("faulted");
        (fault.category, fault.message)
    };
    assert_eq!(category, FaultCategory::Protocol);
    assert!(
        message.contains("tool call 0 at `$.tool_call_chunks` has no function name"),
        "{message}"
    );
    assert!(message.contains("May 2"), "{message}");
}

fn settings() -> trellis_engine::protocol::jsonhttp::HttpSettings {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("agent.kdl");
    let text = r##"agent "a" protocol="http" url="http://127.0.0.1:1/" {
            request "{}"
            reply json-path="$.output.content"
            tool-calls json-path="$.output.tool_calls"
            session json-path="$.metadata.sid"
            stream json-path="$.content"
        }"##;
    std::fs::write(&path, text).expect("the suite is written");
    let project = trellis_dsl::load(&[&path], &trellis_engine::protocol::registry::specs())
        .expect("the settings parse");
    project
        .agents
        .into_iter()
        .next()
        .and_then(|a| trellis_engine::protocol::jsonhttp::HttpSettings::of(&a))
        .expect("the settings parse")
}

/// Near-valid answers: fragments of a LangServe answer, with random values spliced in.
fn near_valid() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        Just("null".to_owned()),
        Just("[]".to_owned()),
        Just("{}".to_owned()),
        Just("[{\"name\": 1}]".to_owned()),
        Just("[{\"function\": {\"name\": \"f\", \"arguments\": 3}}]".to_owned()),
        Just("[{\"type\": \"text\"}, 1]".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        ".{0,12}".prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
    ];
    (value.clone(), value.clone(), value, 0usize..80).prop_map(|(a, b, c, cut)| {
        let full = format!(
            r#"{{"output": {{"content": {a}, "tool_calls": {b}}}, "metadata": {{"sid": {c}}}, "content": {a}}}"#
        );
        let keep = full.len().saturating_sub(cut);
        full.get(..keep).unwrap_or(&full).to_owned()
    })
}

proptest! {
    #![proptest_config(crate::fuzz::config(256))]

    #[test]
    fn the_decoder_never_panics_on_random_answers(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let s = settings();
        let _ = codec::decode_answer(&body, s.reply.as_ref().unwrap(), &s);
        let mut decoder = codec::StreamDecoder::new(s.stream.as_ref().unwrap(), &s);
        let _ = decoder.apply(&SseEvent { event: None, data: String::from_utf8_lossy(&body).into_owned() });
        let _ = decoder.finish();
    }

    #[test]
    fn the_decoder_never_panics_on_near_valid_answers(body in near_valid(), name in prop_oneof![Just(None), Just(Some("data".to_owned())), Just(Some("error".to_owned())), "[a-z]{0,6}".prop_map(Some)]) {
        let s = settings();
        let _ = codec::decode_answer(body.as_bytes(), s.reply.as_ref().unwrap(), &s);
        let mut decoder = codec::StreamDecoder::new(s.stream.as_ref().unwrap(), &s);
        for _ in 0..2 {
            let _ = decoder.apply(&SseEvent { event: name.clone(), data: body.clone() });
        }
        let _ = decoder.finish();
    }
}

/// `params-json` matches what a `KEY=VALUE` cannot write: an argument named `count` (the
/// check's own number of calls) and arguments whose values are objects or lists, each
/// compared whole by JSON equality.
#[tokio::test]
async fn params_json_matches_an_argument_named_count_and_object_values() {
    let server = MisbehavingServer::respond(
        200,
        r#"{"answer": "Ordered.", "calls": [{"id": "c1", "type": "function", "function": {"name": "order",
            "arguments": "{\"count\": 3, \"address\": {\"city\": \"Rome\", \"zip\": \"00100\"}, \"items\": [\"a\", \"b\"], \"note\": \"Rome\"}"}}]}"#,
    )
    .await;
    let text = format!(
        r##"
agent "bot" protocol="http" url="{}" {{
    request #"{{"q": {{{{ user | tojson }}}}}}"#
    reply json-path="$.answer"
    tool-calls json-path="$.calls"
}}
scenario "s" {{
    user-context {{ city "Rome" }}
    user "order"
    expect tool "order" params-json=#"{{"count": 3}}"# count=1
    expect tool "order" params-json=#"{{"address": {{"city": "Rome", "zip": "00100"}}, "items": ["a", "b"]}}"#
    expect tool "order" note="Rome" params-json=#"{{"count": 3.0, "note2": null}}"#
    expect tool "order" params-json=#"{{"count": 2}}"#
    expect tool "order" params-json=#"{{"address": {{"city": "Rome"}}}}"#
    expect tool "order" params-json=#"{{"note": "{{{{ user_context.city }}}}"}}"#
}}
"##,
        server.url()
    );
    let t = only(&text).await;
    let statuses: Vec<(String, Option<String>)> = t
        .criteria
        .iter()
        .map(|c| (format!("{:?}", c.status), c.detail.clone()))
        .collect();
    let passed: Vec<bool> = t
        .criteria
        .iter()
        .map(|c| c.status == trellis_engine::record::CriterionStatus::Passed)
        .collect();
    // The third fails on `note2`, which the call does not have; the fourth on the count's
    // value; the fifth because an object is compared whole, not as a subset.
    assert_eq!(
        passed,
        [true, true, false, false, false, true],
        "{statuses:?}"
    );
}
