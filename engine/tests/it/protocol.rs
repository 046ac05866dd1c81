//! The HTTP transport and the Connexity client against misbehaving servers on real sockets.

use std::time::Duration;

use tokio::time::Instant;
use trellis_engine::protocol::connexity::{ConnexityClient, ConnexityError, HistoryMode};
use trellis_engine::protocol::{CallContext, ChatMessage};
use trellis_engine::record::FaultCategory;
use trellis_engine::transport::http::{CallLimits, HttpTransport};
use trellis_engine::transport::http::{HeaderError, RetryPolicy};

use crate::support::{
    Behavior, CallOutcome, MisbehavingServer, OK_BODY, client, client_with, closed_port, ctx,
    limits, respond,
};

const SHORT: Duration = Duration::from_secs(5);

fn history() -> Vec<ChatMessage> {
    vec![ChatMessage::user("Hi, I'd like to book a duct cleaning.")]
}

async fn call(url: &str, retries: u32, limits: CallLimits) -> CallOutcome {
    respond(&client(url, retries, limits), &history(), &ctx(0)).await
}

#[track_caller]
fn fault_of(outcome: &CallOutcome, category: FaultCategory) -> String {
    match &outcome.result {
        Err(fault) => {
            assert_eq!(fault.category, category, "unexpected fault: {fault:?}");
            fault.message.clone()
        }
        Ok(turn) => panic!("expected a {category:?} fault, got {turn:?}"),
    }
}

#[tokio::test]
async fn success_parses_the_reply() {
    let server = MisbehavingServer::respond(200, OK_BODY).await;
    let outcome = call(&server.url(), 2, limits(SHORT)).await;
    let turn = outcome.result.unwrap();
    assert_eq!(turn.reply.as_deref(), Some("Hello there."));
    assert_eq!(turn.model.as_deref(), Some("m"));
    assert_eq!(turn.provider.as_deref(), Some("p"));
    assert_eq!(outcome.attempts, 1);
    assert_eq!(server.requests(), 1);
}

/// A byte order mark before the JSON (some Windows and .NET servers write one) is no part of
/// the answer, which RFC 8259 lets a parser ignore; without the mark the body must still be
/// JSON.
#[tokio::test]
async fn a_byte_order_mark_before_the_json_is_ignored() {
    let server = MisbehavingServer::respond(200, &format!("\u{feff}{OK_BODY}")).await;
    let outcome = call(&server.url(), 0, limits(SHORT)).await;
    let turn = outcome.result.unwrap();
    assert_eq!(turn.reply.as_deref(), Some("Hello there."));
    let server = MisbehavingServer::respond(200, "\u{feff}").await;
    let outcome = call(&server.url(), 0, limits(SHORT)).await;
    fault_of(&outcome, FaultCategory::InvalidJson);
}

/// Until a server has kept a connection open past the pool's grace after an answer, a
/// connection is reused only once it has been idle that long (a server may close each
/// connection just after its answer): what the tests of reuse wait for after their first
/// answer.
async fn past_close_grace() {
    tokio::time::sleep(Duration::from_millis(15)).await;
}

/// Kept alive once the server is seen to keep them: the first reuse waits for a connection
/// idle past the grace, the rest reuse at once.
#[tokio::test]
async fn connections_are_kept_alive() {
    let server = MisbehavingServer::respond(200, OK_BODY).await;
    let client = client(&server.url(), 0, limits(SHORT));
    for turn_index in 0..3 {
        respond(&client, &history(), &ctx(turn_index))
            .await
            .result
            .unwrap();
        if turn_index == 0 {
            past_close_grace().await;
        }
    }
    assert_eq!(server.requests(), 3);
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn request_has_the_connexity_shape() {
    let server = MisbehavingServer::respond(200, OK_BODY).await;
    let history = vec![
        ChatMessage::user("Hi"),
        ChatMessage::assistant("What is your postal code?"),
        ChatMessage::user("V4T 0A7"),
    ];
    let client = ConnexityClient::new(
        &server.url(),
        vec![
            ("Authorization".into(), "Bearer s3cret".into()),
            ("X-Trace".into(), "a".into()),
        ],
        limits(SHORT),
        RetryPolicy::default(),
        HistoryMode::Messages,
        HttpTransport::new(),
    )
    .unwrap();
    let ctx = CallContext {
        test_case_id: "book-duct-cleaning",
        turn_index: 2,
        deadline: None,
        turn_headers: None,
        system_prompt: None,
        llm_meter: None,
    };
    respond(&client, &history, &ctx).await.result.unwrap();

    let recorded = server.recorded();
    assert_eq!(recorded.len(), 1);
    let request = &recorded[0];
    assert!(
        request.head.starts_with("POST /agent/respond HTTP/1.1"),
        "{}",
        request.head
    );
    assert_eq!(
        request.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(
        request.header("authorization").as_deref(),
        Some("Bearer s3cret")
    );
    assert_eq!(request.header("x-trace").as_deref(), Some("a"));
    assert_eq!(
        request.json(),
        serde_json::json!({
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "What is your postal code?"},
                {"role": "user", "content": "V4T 0A7"},
            ],
            "metadata": {"test_case_id": "book-duct-cleaning", "turn_index": 2},
        })
    );
}

#[test]
fn invalid_headers_are_rejected_without_leaking_the_value() {
    let transport = HttpTransport::new();
    let bad_name = ConnexityClient::new(
        "http://127.0.0.1:1/agent/respond",
        vec![("Bad Header".into(), "x".into())],
        CallLimits::default(),
        RetryPolicy::default(),
        HistoryMode::Messages,
        transport.clone(),
    );
    assert!(matches!(
        bad_name,
        Err(ConnexityError::Header(HeaderError::InvalidName(_)))
    ));

    let bad_value = ConnexityClient::new(
        "http://127.0.0.1:1/agent/respond",
        vec![("Authorization".into(), "Bearer top\nsecret".into())],
        CallLimits::default(),
        RetryPolicy::default(),
        HistoryMode::Messages,
        transport.clone(),
    );
    let err = bad_value.unwrap_err();
    assert!(matches!(
        err,
        ConnexityError::Header(HeaderError::InvalidValue(_))
    ));
    assert!(!err.to_string().contains("secret"), "{err}");

    let bad_url = ConnexityClient::new(
        "not a url",
        vec![],
        CallLimits::default(),
        RetryPolicy::default(),
        HistoryMode::Messages,
        transport,
    );
    assert!(matches!(bad_url, Err(ConnexityError::InvalidUrl { .. })));
}

#[tokio::test]
async fn http_4xx_is_not_retried() {
    let server = MisbehavingServer::respond(404, r#"{"detail":"no such agent"}"#).await;
    let outcome = call(&server.url(), 2, limits(SHORT)).await;
    let message = fault_of(&outcome, FaultCategory::Http4xx);
    assert!(message.contains("HTTP 404"), "{message}");
    assert!(message.contains("no such agent"), "{message}");
    assert_eq!(outcome.attempts, 1);
    assert_eq!(server.requests(), 1);
}

#[tokio::test]
async fn http_5xx_is_retried() {
    let long_body = format!("{{\"error\":\"{}\"}}", "x".repeat(1000));
    let server = MisbehavingServer::respond(500, long_body).await;
    let outcome = call(&server.url(), 2, limits(SHORT)).await;
    let message = fault_of(&outcome, FaultCategory::Http5xx);
    assert!(message.contains("500 Internal Server Error"), "{message}");
    // The body is quoted, but only its start.
    assert!(message.contains("xxxx"), "{message}");
    assert!(message.len() < 400, "{message}");
    assert_eq!(outcome.attempts, 3);
    assert_eq!(server.requests(), 3);
}

#[tokio::test]
async fn unavailable_then_ok_succeeds_on_the_third_attempt() {
    let server = MisbehavingServer::start(Behavior::Sequence(vec![
        (503, "busy".into()),
        (503, "busy".into()),
        (200, OK_BODY.into()),
    ]))
    .await;
    let outcome = call(&server.url(), 2, limits(SHORT)).await;
    let turn = outcome.result.unwrap();
    assert_eq!(turn.reply.as_deref(), Some("Hello there."));
    assert_eq!(outcome.attempts, 3);
    assert_eq!(server.requests(), 3);
}

#[tokio::test]
async fn a_rate_limited_agent_is_waited_out_without_spending_a_retry() {
    // A gateway's HTML page, as Cloudflare and nginx's limit_req send them.
    let server = MisbehavingServer::start(Behavior::RateLimited {
        times: 2,
        retry_after: Some("0".into()),
        body: "<html><title>429 Too Many Requests</title></html>".into(),
    })
    .await;
    let started = Instant::now();
    let outcome = call(&server.url(), 0, limits(SHORT)).await;
    let turn = outcome.result.expect("the answer after the waits");
    assert_eq!(turn.reply.as_deref(), Some("Hello there."));
    assert_eq!(server.requests(), 3);
    assert_eq!(outcome.attempts, 3, "each 429 is an attempt on the record");
    assert!(
        outcome
            .faults
            .iter()
            .all(|f| f.category == FaultCategory::Http4xx
                && f.message.contains("429")
                && f.message.contains("an HTML page")),
        "{:?}",
        outcome.faults
    );
    // `Retry-After: 0` must not make a tight loop.
    assert!(started.elapsed() >= Duration::from_millis(400));
}

/// A 503 that says when the server is back (`Retry-After`) is retried then, not at the
/// backoff's 0.1 s, which would spend the retry inside the outage.
#[tokio::test]
async fn a_retry_of_a_503_waits_for_its_retry_after() {
    let server = MisbehavingServer::start(Behavior::Unavailable {
        times: 1,
        retry_after: "1".into(),
    })
    .await;
    let started = Instant::now();
    let outcome = call(&server.url(), 1, limits(SHORT)).await;
    let turn = outcome.result.expect("the answer after the wait");
    assert_eq!(turn.reply.as_deref(), Some("Hello there."));
    assert_eq!(outcome.attempts, 2);
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "retried after {:?}",
        started.elapsed()
    );
    // A wait past the trajectory's deadline is not made, and the fault says whose wait.
    let server = MisbehavingServer::start(Behavior::Unavailable {
        times: 100,
        retry_after: "30".into(),
    })
    .await;
    let client = client(&server.url(), 2, limits(SHORT));
    let ctx = CallContext {
        deadline: Some(Instant::now() + Duration::from_secs(5)),
        ..ctx(0)
    };
    let outcome = respond(&client, &history(), &ctx).await;
    let message = fault_of(&outcome, FaultCategory::Http5xx);
    assert!(
        message.contains(
            "not retried: the trajectory timeout would pass before the 30s its \
             Retry-After asked for"
        ),
        "{message}"
    );
    assert_eq!(server.requests(), 1);
}

#[tokio::test]
async fn a_rate_limit_past_the_trajectory_deadline_is_the_agents_429() {
    let server = MisbehavingServer::start(Behavior::RateLimited {
        times: 100,
        retry_after: Some("30".into()),
        body: r#"{"detail":"slow down"}"#.into(),
    })
    .await;
    let client = client(&server.url(), 2, limits(SHORT));
    let ctx = CallContext {
        deadline: Some(Instant::now() + Duration::from_secs(2)),
        ..ctx(0)
    };
    let started = Instant::now();
    let outcome = respond(&client, &history(), &ctx).await;
    assert!(started.elapsed() < Duration::from_secs(1), "no 30 s wait");
    let message = fault_of(&outcome, FaultCategory::Http4xx);
    assert!(
        message.contains("still rate limited after 1 answer and 0 s")
            && message.contains("would pass the trajectory's timeout"),
        "{message}"
    );
    assert_eq!(server.requests(), 1, "neither waited nor retried");
    assert!(outcome.faults[0].message.contains("slow down"));
}

#[tokio::test]
async fn retries_run_out() {
    let server = MisbehavingServer::start(Behavior::Sequence(vec![
        (503, "busy".into()),
        (503, "busy".into()),
        (200, OK_BODY.into()),
    ]))
    .await;
    let outcome = call(&server.url(), 1, limits(SHORT)).await;
    let message = fault_of(&outcome, FaultCategory::Http5xx);
    assert!(message.contains("HTTP 503"), "{message}");
    assert_eq!(outcome.attempts, 2);
    assert_eq!(server.requests(), 2);
}

#[tokio::test]
async fn connection_refused_is_connect_and_retried() {
    let addr = closed_port().await;
    let outcome = call(&format!("http://{addr}/agent/respond"), 2, limits(SHORT)).await;
    let message = fault_of(&outcome, FaultCategory::Connect);
    assert!(message.contains("connection refused"), "{message}");
    assert!(message.contains(&addr.port().to_string()), "{message}");
    assert_eq!(outcome.attempts, 3);
}

#[tokio::test]
async fn non_json_body_is_invalid_json() {
    let server = MisbehavingServer::respond(200, "<html>oops</html>").await;
    let outcome = call(&server.url(), 2, limits(SHORT)).await;
    let message = fault_of(&outcome, FaultCategory::InvalidJson);
    assert!(message.contains("<html>oops"), "{message}");
    assert_eq!(outcome.attempts, 1, "a malformed answer is not retried");
    assert_eq!(server.requests(), 1);
}

/// Servers and gateways that compress unasked: gzip and deflate answers are read, a bomb
/// stops at the agent's response limit, and a coding Trellis does not read is named.
#[tokio::test]
async fn compressed_answers_are_decoded_or_named() {
    use std::io::Write as _;
    let gzip = |text: &[u8]| {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(text).unwrap();
        encoder.finish().unwrap()
    };
    let server = MisbehavingServer::start(Behavior::Encoded {
        coding: "gzip".into(),
        body: gzip(OK_BODY.as_bytes()),
    })
    .await;
    let outcome = call(&server.url(), 0, limits(SHORT)).await;
    assert_eq!(
        outcome.result.unwrap().reply.as_deref(),
        Some("Hello there.")
    );

    let bomb = MisbehavingServer::start(Behavior::Encoded {
        coding: "gzip".into(),
        body: gzip(&vec![b' '; 4 << 20]),
    })
    .await;
    let mut small = limits(SHORT);
    small.max_response_size = 1 << 20;
    let outcome = call(&bomb.url(), 0, small).await;
    let message = fault_of(&outcome, FaultCategory::TooLarge);
    assert!(message.contains("decodes to more"), "{message}");

    let brotli = MisbehavingServer::start(Behavior::Encoded {
        coding: "br".into(),
        body: b"\x1b\x00".to_vec(),
    })
    .await;
    let outcome = call(&brotli.url(), 0, limits(SHORT)).await;
    let message = fault_of(&outcome, FaultCategory::Protocol);
    assert!(message.contains("`br`"), "{message}");
}

/// `localhost` is this machine whatever `/etc/hosts` says: an agent listening on `::1`
/// alone is reached through it (this project's machines map `localhost` to 127.0.0.1 only).
#[tokio::test]
async fn localhost_reaches_an_agent_on_the_ipv6_loopback() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = match tokio::net::TcpListener::bind("[::1]:0").await {
        Ok(listener) => listener,
        Err(e) => {
            // No IPv6 loopback here: `localhost` must still reach 127.0.0.1.
            eprintln!("no IPv6 loopback ({e}): checking the IPv4 one only");
            let server = MisbehavingServer::respond(200, OK_BODY).await;
            let url = server.url().replace("127.0.0.1", "localhost");
            let outcome = call(&url, 0, limits(SHORT)).await;
            assert!(outcome.result.is_ok(), "{outcome:?}");
            return;
        }
    };
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut seen = Vec::new();
                loop {
                    let Ok(n) = stream.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&seen);
                    if let Some(head_end) = text.find("\r\n\r\n") {
                        let length: usize = text[..head_end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .and_then(|v| v.trim().parse().ok())
                            })
                            .unwrap_or(0);
                        if seen.len() >= head_end + 4 + length {
                            break;
                        }
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: \
                     {}\r\n\r\n{OK_BODY}",
                    OK_BODY.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    let outcome = call(
        &format!("http://localhost:{port}/agent/respond"),
        0,
        limits(SHORT),
    )
    .await;
    let turn = outcome.result.expect("localhost reached ::1");
    assert_eq!(turn.reply.as_deref(), Some("Hello there."));
}

/// A proxy's HTML error page is named by its title, not quoted tag by tag; a multi-line
/// body is quoted on one line.
#[tokio::test]
async fn an_html_error_page_is_named_by_its_title() {
    let page = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n\
                <center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n\
                </body>\r\n</html>\r\n";
    let server = MisbehavingServer::respond(502, page).await;
    let outcome = call(&server.url(), 0, limits(SHORT)).await;
    let message = fault_of(&outcome, FaultCategory::Http5xx);
    assert_eq!(
        message,
        "HTTP 502 Bad Gateway: an HTML page (502 Bad Gateway)"
    );
    let bare = MisbehavingServer::respond(
        401,
        "<html><head><style>b { color: red }</style></head><body>Invalid <b>API</b> key</body></html>",
    )
    .await;
    let outcome = call(&bare.url(), 0, limits(SHORT)).await;
    let message = fault_of(&outcome, FaultCategory::Http4xx);
    assert_eq!(
        message,
        "HTTP 401 Unauthorized: an HTML page: Invalid API key"
    );
    let trace = MisbehavingServer::respond(500, "Traceback:\r\n  File \"x\"\r\n    boom\r\n").await;
    let outcome = call(&trace.url(), 0, limits(SHORT)).await;
    let message = fault_of(&outcome, FaultCategory::Http5xx);
    assert!(message.ends_with("Traceback: File \"x\" boom"), "{message}");
}

#[tokio::test]
async fn wrong_shapes_are_protocol_faults() {
    let cases = [
        (r#"{"reply":"hi"}"#, "no `messages` array"),
        (r#"[1,2]"#, "an array"),
        (r#"{"messages":"hi"}"#, "`messages` is a string"),
        (
            r#"{"messages":[{"content":"hi"}]}"#,
            "messages[0] has no `role`",
        ),
        (
            r#"{"messages":[{"role":1,"content":"hi"}]}"#,
            "messages[0].role is a number",
        ),
        (
            r#"{"messages":[{"role":"assistant","content":{"text":"hi"}}]}"#,
            "messages[0].content is an object",
        ),
        (r#"{"messages":[]}"#, "no assistant message"),
        (
            r#"{"messages":[{"role":"tool","content":"x"}]}"#,
            "no assistant message",
        ),
        (
            r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"c","function":{"arguments":"{}"}}]}]}"#,
            "messages[0].tool_calls[0].function.name",
        ),
    ];
    for (body, expected) in cases {
        let server = MisbehavingServer::respond(200, body).await;
        let outcome = call(&server.url(), 2, limits(SHORT)).await;
        let message = fault_of(&outcome, FaultCategory::Protocol);
        assert!(message.contains(expected), "{body}: {message}");
        assert_eq!(server.requests(), 1, "{body}: not retried");
    }
    // A body that is no turn is quoted: what the agent said is in the fault.
    let server = MisbehavingServer::respond(200, r#"{"reply":"hi"}"#).await;
    let outcome = call(&server.url(), 0, limits(SHORT)).await;
    let message = fault_of(&outcome, FaultCategory::Protocol);
    assert_eq!(
        message,
        r#"response has no `messages` array: {"reply":"hi"}"#
    );
}

/// The failure envelopes services answer with status 200 (FastAPI's `{"detail": …}`,
/// `{"status": "error", "message": …}`) are the agent's error in its words: they were a
/// protocol fault ("no `messages` array") that showed none of the body, kept nowhere.
#[tokio::test]
async fn a_200_failure_envelope_is_the_agents_error_in_its_words() {
    for (body, said) in [
        (
            r#"{"status":"error","message":"upstream LLM timeout"}"#,
            "the agent answered with an error: upstream LLM timeout",
        ),
        (
            r#"{"detail":"Rate limit exceeded for tenant"}"#,
            "the agent answered with an error: Rate limit exceeded for tenant",
        ),
        (
            r#"{"detail":[{"loc":["body","messages"],"msg":"field required"}]}"#,
            r#"the agent answered with an error: [{"loc":["body","messages"],"msg":"field required"}]"#,
        ),
    ] {
        let server = MisbehavingServer::respond(200, body).await;
        let outcome = call(&server.url(), 0, limits(SHORT)).await;
        assert_eq!(
            fault_of(&outcome, FaultCategory::AgentError),
            said,
            "{body}"
        );
    }
}

/// A reply that ends with a `tool` message (a reference agent's tool-round cap hit) has no
/// answer: the text written before the tool calls is not one (the session makes the turn a
/// protocol fault: `tests/cli/faults.rs`).
#[tokio::test]
async fn a_reply_ending_with_a_tool_message_has_no_answer() {
    let body = serde_json::json!({
        "messages": [
            {"role": "assistant", "content": "Let me check if we service your area.", "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "check_service_area", "arguments": "{}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_a", "content": "{\"serviced\":true}"},
        ],
    })
    .to_string();
    let server = MisbehavingServer::respond(200, body).await;
    let turn = call(&server.url(), 0, limits(SHORT)).await.result.unwrap();
    assert_eq!(turn.reply, None);
    assert_eq!(turn.tool_calls.len(), 1);
}

#[tokio::test]
async fn tool_calls_pair_with_their_results() {
    let body = serde_json::json!({
        "messages": [
            {"role": "assistant", "content": "Let me check.", "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "check_service_area", "arguments": "{\"zone\": \"V4T0A7\"}"}},
                {"id": "call_b", "type": "function",
                 "function": {"name": "quote_price", "arguments": {"zone": "V4T0A7", "service": "duct_cleaning"}}},
            ]},
            // Results out of order: pairing goes by id.
            {"role": "tool", "tool_call_id": "call_b", "name": "quote_price", "content": "{\"price\":249}"},
            {"role": "tool", "tool_call_id": "call_a", "name": "check_service_area", "content": "{\"serviced\":true}"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "", "function": {"name": "create_booking", "arguments": "{\"day\":\"Tuesday\"}"}},
            ]},
            // No id: paired by name.
            {"role": "tool", "name": "create_booking", "content": "{\"booking_id\":\"BK-1\"}"},
            {"role": "assistant", "content": "Booked for Tuesday."},
            {"role": "assistant", "content": "  "},
        ],
        "model": "gpt-4o",
        "provider": "openai",
        "usage": {"prompt_tokens": 245, "completion_tokens": 82},
        "metadata": {},
    })
    .to_string();
    let server = MisbehavingServer::respond(200, body).await;
    let turn = call(&server.url(), 0, limits(SHORT)).await.result.unwrap();

    assert_eq!(turn.messages.len(), 7);
    assert_eq!(turn.reply.as_deref(), Some("Booked for Tuesday."));
    assert_eq!(turn.model.as_deref(), Some("gpt-4o"));
    let usage = turn.usage.unwrap();
    assert_eq!(usage.prompt_tokens, Some(245));
    assert_eq!(usage.completion_tokens, Some(82));
    assert_eq!(usage.total_tokens, None);

    let calls: Vec<_> = turn
        .tool_calls
        .iter()
        .map(|c| (c.call_id.as_str(), c.name.as_str(), c.result.as_deref()))
        .collect();
    assert_eq!(
        calls,
        [
            ("call_a", "check_service_area", Some("{\"serviced\":true}")),
            ("call_b", "quote_price", Some("{\"price\":249}")),
            ("", "create_booking", Some("{\"booking_id\":\"BK-1\"}")),
        ]
    );
    // String arguments are kept as sent; object arguments become their JSON text.
    assert_eq!(turn.tool_calls[0].arguments, "{\"zone\": \"V4T0A7\"}");
    let args: serde_json::Value = serde_json::from_str(&turn.tool_calls[1].arguments).unwrap();
    assert_eq!(
        args,
        serde_json::json!({"zone": "V4T0A7", "service": "duct_cleaning"})
    );
    assert_eq!(
        turn.messages[0].tool_calls[1].function.arguments,
        turn.tool_calls[1].arguments
    );
}

#[tokio::test]
async fn slow_drip_times_out() {
    let server = MisbehavingServer::start(Behavior::SlowDrip {
        interval: Duration::from_millis(200),
    })
    .await;
    let outcome = call(&server.url(), 0, limits(Duration::from_millis(700))).await;
    let message = fault_of(&outcome, FaultCategory::Timeout);
    assert!(message.contains("700ms"), "{message}");
    assert!(message.contains("HTTP 200 received"), "{message}");
    assert_eq!(outcome.attempts, 1);
}

/// A timed-out request may have reached the agent (and booked something): it is retried
/// only when the suite says so, and every attempt is recorded either way.
#[tokio::test]
async fn timeouts_are_retried_only_when_the_suite_allows_it() {
    let server = MisbehavingServer::start(Behavior::SlowDrip {
        interval: Duration::from_millis(200),
    })
    .await;
    let outcome = call(&server.url(), 2, limits(Duration::from_millis(300))).await;
    let message = fault_of(&outcome, FaultCategory::Timeout);
    assert!(message.contains("retry-after-send"), "{message}");
    assert_eq!(outcome.attempts, 1);
    assert_eq!(server.requests(), 1);

    let allowed = RetryPolicy {
        retries: 2,
        after_send: true,
    };
    let client = client_with(&server.url(), allowed, limits(Duration::from_millis(300)));
    let outcome = respond(&client, &history(), &ctx(0)).await;
    fault_of(&outcome, FaultCategory::Timeout);
    assert_eq!(outcome.attempts, 3);
    assert_eq!(outcome.faults.len(), 3, "every attempt keeps its fault");
    assert!(
        outcome
            .faults
            .iter()
            .all(|f| f.category == FaultCategory::Timeout)
    );
    assert_eq!(server.requests(), 4);
}

#[tokio::test]
async fn the_trajectory_deadline_caps_the_call() {
    let server = MisbehavingServer::start(Behavior::SlowDrip {
        interval: Duration::from_millis(200),
    })
    .await;
    let client = client(&server.url(), 5, limits(Duration::from_secs(60)));
    let ctx = CallContext {
        test_case_id: "case",
        turn_index: 0,
        deadline: Some(Instant::now() + Duration::from_millis(500)),
        turn_headers: None,
        system_prompt: None,
        llm_meter: None,
    };
    let outcome = respond(&client, &history(), &ctx).await;
    let message = fault_of(&outcome, FaultCategory::Timeout);
    assert!(message.contains("trajectory timeout"), "{message}");
    assert_eq!(outcome.attempts, 1, "no retry past the deadline");

    let past = CallContext {
        deadline: Some(Instant::now()),
        ..ctx
    };
    let outcome = respond(&client, &history(), &past).await;
    let message = fault_of(&outcome, FaultCategory::Timeout);
    assert!(message.contains("trajectory timeout"), "{message}");
    assert_eq!(outcome.attempts, 0);
}

#[tokio::test]
async fn connection_reset_is_transport_and_retried_only_when_allowed() {
    let server = MisbehavingServer::start(Behavior::Reset).await;
    let outcome = call(&server.url(), 2, limits(SHORT)).await;
    let message = fault_of(&outcome, FaultCategory::Transport);
    assert!(message.contains("reset"), "{message}");
    assert!(message.contains("before the response headers"), "{message}");
    // What to do about it, once (a restarting worker resets fresh connections too).
    assert!(message.contains("before any answer"), "{message}");
    assert_eq!(message.matches("retry-after-send").count(), 1, "{message}");
    assert_eq!(
        outcome.attempts, 1,
        "the request was sent: not retried by default"
    );
    assert_eq!(server.requests(), 1);

    let allowed = RetryPolicy {
        retries: 2,
        after_send: true,
    };
    let outcome = respond(
        &client_with(&server.url(), allowed, limits(SHORT)),
        &history(),
        &ctx(0),
    )
    .await;
    fault_of(&outcome, FaultCategory::Transport);
    assert_eq!(outcome.attempts, 3);
    assert_eq!(server.requests(), 4);
}

#[tokio::test]
async fn truncated_body_is_transport() {
    let server = MisbehavingServer::start(Behavior::Truncated).await;
    let outcome = call(&server.url(), 0, limits(SHORT)).await;
    let message = fault_of(&outcome, FaultCategory::Transport);
    assert!(message.contains("closed"), "{message}");
    assert!(message.contains("truncated"), "{message}");
    assert!(message.contains("11 bytes"), "{message}");
}

#[tokio::test]
async fn too_large_content_length_is_rejected_early() {
    let server = MisbehavingServer::start(Behavior::Huge {
        bytes: 20 * 1024 * 1024,
        content_length: true,
    })
    .await;
    let outcome = call(&server.url(), 2, limits(SHORT)).await;
    let message = fault_of(&outcome, FaultCategory::TooLarge);
    assert!(
        message.contains("response exceeded 8388608 bytes (max-response-size)"),
        "{message}"
    );
    assert!(message.contains("Content-Length is 20971520"), "{message}");
    assert_eq!(outcome.attempts, 1, "too_large is not retried");
}

#[tokio::test]
async fn too_large_body_stops_reading_early() {
    let server = MisbehavingServer::start(Behavior::Huge {
        bytes: 20 * 1024 * 1024,
        content_length: false,
    })
    .await;
    let limits = CallLimits {
        timeout: Duration::from_secs(30),
        max_response_size: 1024 * 1024,
    };
    let outcome = call(&server.url(), 0, limits).await;
    let message = fault_of(&outcome, FaultCategory::TooLarge);
    assert!(
        message.contains("response exceeded 1048576 bytes (max-response-size)"),
        "{message}"
    );
    // The server stops when the client hangs up; it must not have sent the whole body.
    tokio::time::timeout(
        Duration::from_secs(10),
        server.stats.connection_done.notified(),
    )
    .await
    .expect("the server noticed the client closing");
    let written = server
        .stats
        .body_bytes_written
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(written < 4 * 1024 * 1024, "server wrote {written} bytes");
}

#[test]
fn a_reused_call_id_pairs_results_by_function_name() {
    let body = br#"{"messages": [
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
            {"id": "c1", "type": "function", "function": {"name": "b", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "name": "b", "content": "from b"},
        {"role": "tool", "tool_call_id": "c1", "name": "a", "content": "from a"},
        {"role": "assistant", "content": "done"}
    ]}"#;
    let turn = trellis_engine::protocol::connexity::parse_response(body).unwrap();
    let result = |name: &str| {
        turn.tool_calls
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.result.clone())
    };
    assert_eq!(result("a").as_deref(), Some("from a"));
    assert_eq!(result("b").as_deref(), Some("from b"));
}

/// A 200 whose body is an error and no turn is the agent's failure, quoted: Connexity's
/// `{"error": …}` (alone, or beside an empty `messages`) and Fixie's `{"error": …}` without a
/// `message` were `protocol` faults that did not say why.
#[test]
fn an_error_body_is_an_agent_error_in_its_words() {
    use trellis_engine::record::FaultCategory;
    for body in [
        r#"{"error": {"message": "quota exceeded", "code": 429}}"#,
        r#"{"messages": [], "error": "quota exceeded"}"#,
    ] {
        let fault =
            trellis_engine::protocol::connexity::parse_response(body.as_bytes()).expect_err(body);
        assert_eq!(fault.category, FaultCategory::AgentError, "{body}");
        assert!(
            fault.message.contains("quota exceeded"),
            "{body}: {fault:?}"
        );
    }
    // Without an error, the same shape stays a protocol fault.
    let fault = trellis_engine::protocol::connexity::parse_response(br#"{"messages": []}"#)
        .expect_err("no turn");
    assert_eq!(fault.category, FaultCategory::Protocol);
    let fault =
        trellis_engine::protocol::fixie::parse_reply(br#"{"error": "quota exceeded"}"#, "ask")
            .expect_err("an error");
    assert_eq!(fault.category, FaultCategory::AgentError);
    assert!(fault.message.contains("Func[ask]") && fault.message.contains("quota exceeded"));
}

/// OpenAI's legacy function calling, which agents on older SDKs send: the assistant's
/// `function_call` and the `function` message answering it are a tool call with its result,
/// whichever way the body is parsed (string arguments take the fast path, object arguments
/// the lenient one). Ignored, the call was not seen and `no-tool` passed.
#[test]
fn legacy_function_calls_are_tool_calls() {
    for arguments in [r#""{\"city\": \"Paris\"}""#, r#"{"city": "Paris"}"#] {
        let body = format!(
            r#"{{"messages": [
                {{"role": "assistant", "content": null, "function_call":
                    {{"name": "get_weather", "arguments": {arguments}}}}},
                {{"role": "function", "name": "get_weather", "content": "sunny"}},
                {{"role": "assistant", "content": "It is sunny."}}
            ]}}"#
        );
        let turn = trellis_engine::protocol::connexity::parse_response(body.as_bytes())
            .unwrap_or_else(|f| panic!("{arguments}: {f:?}"));
        assert_eq!(
            turn.tool_calls.len(),
            1,
            "{arguments}: {:?}",
            turn.tool_calls
        );
        assert_eq!(turn.tool_calls[0].name, "get_weather");
        assert!(turn.tool_calls[0].arguments.contains("Paris"));
        assert_eq!(turn.tool_calls[0].result.as_deref(), Some("sunny"));
        assert_eq!(turn.reply.as_deref(), Some("It is sunny."));
    }
}

/// A server that closes a kept-alive connection as a request arrives on it (as one that
/// times out idle connections just then, or an agent that read the request and crashed):
/// for an agent that tolerates a second sending (`retry-after-send`), the request goes
/// again on a fresh connection, inside the same attempt.
#[tokio::test]
async fn a_request_lost_by_a_reused_connection_is_sent_again_when_the_agent_allows_it() {
    let server = MisbehavingServer::start(Behavior::CloseReused {
        body: OK_BODY.to_owned(),
        delay: Duration::ZERO,
    })
    .await;
    let retry = RetryPolicy {
        retries: 0,
        after_send: true,
    };
    let client = client_with(&server.url(), retry, limits(SHORT));
    for turn_index in 0..3 {
        let outcome = respond(&client, &history(), &ctx(turn_index)).await;
        assert!(outcome.result.is_ok(), "turn {turn_index}: {outcome:?}");
        assert_eq!(outcome.attempts, 1);
        // Past the grace: the next turn reuses the connection, and the server closes it.
        past_close_grace().await;
    }
    assert_eq!(server.requests(), 3);
    // The first connection answered the first turn and lost the second, which went again
    // on a second; a server that lost a reused connection's request at once is taken for
    // one that keeps none, so the third turn went on a third.
    assert_eq!(server.connections(), 3);
    assert_eq!(server.closed_unanswered(), 1);
}

/// The same server, for an agent that does not say a second sending is harmless: the
/// request it lost was written, and may have been read and acted on (a booking made twice),
/// so it is a `transport` fault of that turn, not sent again; the next turn goes out on a
/// fresh connection.
#[tokio::test]
async fn a_request_lost_after_it_was_written_is_not_sent_twice_by_default() {
    let server = MisbehavingServer::start(Behavior::CloseReused {
        body: OK_BODY.to_owned(),
        delay: Duration::ZERO,
    })
    .await;
    let client = client(&server.url(), 2, limits(SHORT));
    let first = respond(&client, &history(), &ctx(0)).await;
    assert!(first.result.is_ok(), "{first:?}");
    past_close_grace().await;
    let lost = respond(&client, &history(), &ctx(1)).await;
    let why = fault_of(&lost, FaultCategory::Transport);
    // Why it happened and what to do, said once.
    assert!(
        why.contains("on a kept-alive connection the agent closed as the request went out"),
        "{why}"
    );
    assert_eq!(why.matches("retry-after-send").count(), 1, "{why}");
    assert_eq!(lost.attempts, 1, "{lost:?}");
    let next = respond(&client, &history(), &ctx(2)).await;
    assert!(next.result.is_ok(), "{next:?}");
    // One connection per answered request; the lost one was sent once, on the first.
    assert_eq!(server.requests(), 2);
    assert_eq!(server.connections(), 2);
}

/// A server that closes each connection a millisecond after its answer, without
/// `Connection: close`: turns sent one after the other, faster than that, each go out on a
/// fresh connection, none into a closing one (each was lost, a `transport` fault, when the
/// connection was reused at once). Once a connection is seen closed the server's are no
/// longer kept.
#[tokio::test]
async fn a_server_that_closes_each_connection_after_its_answer_loses_no_turn() {
    let server = MisbehavingServer::start(Behavior::CloseAfterAnswer {
        after: Duration::from_millis(1),
    })
    .await;
    let client = client(&server.url(), 0, limits(SHORT));
    for turn_index in 0..8 {
        let outcome = respond(&client, &history(), &ctx(turn_index)).await;
        assert!(outcome.result.is_ok(), "turn {turn_index}: {outcome:?}");
        assert_eq!(outcome.attempts, 1);
    }
    // Past the grace: the oldest idle connection is looked at, found closed, and none is
    // kept from then on.
    tokio::time::sleep(Duration::from_millis(30)).await;
    for turn_index in 8..12 {
        let outcome = respond(&client, &history(), &ctx(turn_index)).await;
        assert!(outcome.result.is_ok(), "turn {turn_index}: {outcome:?}");
    }
    assert_eq!(server.requests(), 12);
    assert_eq!(server.connections(), 12);
}

/// A server that closed an idle kept-alive connection before it was reused: found closed
/// before anything is written, so the request goes on a fresh connection for every agent.
#[tokio::test]
async fn a_connection_closed_while_idle_is_not_used() {
    let server = MisbehavingServer::start(Behavior::RespondThenClose {
        status: 200,
        body: OK_BODY.to_owned(),
    })
    .await;
    let client = client(&server.url(), 0, limits(SHORT));
    for turn_index in 0..3 {
        let outcome = respond(&client, &history(), &ctx(turn_index)).await;
        assert!(outcome.result.is_ok(), "turn {turn_index}: {outcome:?}");
        assert_eq!(outcome.attempts, 1);
        // Past the server's close (20 ms after its answer).
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(server.requests(), 3);
    assert_eq!(server.connections(), 3);
}

/// An agent that answers and then closes the connection, without `Connection: close`: the
/// client keeps the connection as if it were alive, and the retry finds it closed. Each
/// retry goes out on a fresh connection and gets its answer, however the close and the
/// retry interleave (a retry sent on the closed connection used to wait, unanswered, until
/// the turn's timeout).
#[tokio::test]
async fn a_retry_after_an_answer_and_a_close_is_answered() {
    let server = MisbehavingServer::start(Behavior::RespondThenClose {
        status: 500,
        body: "{\"error\":\"boom\"}".to_owned(),
    })
    .await;
    // A retry can go out on the connection before the server's close: sent again on a
    // fresh one because this agent allows it (without, that retry is a `transport` fault).
    let retry = RetryPolicy {
        retries: 2,
        after_send: true,
    };
    let client = client_with(&server.url(), retry, limits(SHORT));
    let history = history();
    let contexts: Vec<_> = (0..8).map(ctx).collect();
    let started = Instant::now();
    let outcomes =
        futures::future::join_all(contexts.iter().map(|c| respond(&client, &history, c))).await;
    for outcome in &outcomes {
        let message = fault_of(outcome, FaultCategory::Http5xx);
        assert!(message.contains("500 Internal Server Error"), "{message}");
        assert_eq!(outcome.attempts, 3, "{outcome:?}");
    }
    assert_eq!(server.requests(), 24);
    assert!(started.elapsed() < SHORT, "{:?}", started.elapsed());
}

/// A fresh connection that closes before answering is the agent's doing: not sent again
/// (the request may have reached it).
#[tokio::test]
async fn a_fresh_connection_closed_before_answering_is_not_sent_again() {
    let server = MisbehavingServer::start(Behavior::Reset).await;
    let outcome = call(&server.url(), 0, limits(SHORT)).await;
    fault_of(&outcome, FaultCategory::Transport);
    assert_eq!(server.connections(), 1);
}

/// An agent with a body size limit that drops a large request unread: the fault says the
/// request's size and that the limit is the agent's (Trellis sets none).
#[tokio::test]
async fn a_request_over_the_agents_body_limit_says_so() {
    let server = MisbehavingServer::start(Behavior::RefuseLargeBody { limit: 1024 * 1024 }).await;
    let history = vec![ChatMessage::user("x".repeat(5 * 1024 * 1024))];
    let outcome = respond(&client(&server.url(), 0, limits(SHORT)), &history, &ctx(0)).await;
    let fault = outcome.result.expect_err("a fault");
    assert_eq!(fault.category, FaultCategory::Transport, "{fault:?}");
    assert!(
        fault.message.contains("while sending a 52429")
            && fault.message.contains("the agent's request size limit"),
        "{fault:?}"
    );
}

/// The ways an HTTP/1.1 server may frame an answer, on one kept-alive connection: an
/// interim `100 Continue` before the answer, a chunked body written in pieces, then an
/// answer delimited by closing the connection; the next request opens a new one. Each
/// request must arrive as a server expects it (origin-form target, `Host`, the length of
/// the body, a user agent).
#[tokio::test]
async fn every_http1_framing_is_read_and_the_connection_reused_only_when_it_can_be() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body =
        |text: &str| format!(r#"{{"messages":[{{"role":"assistant","content":"{text}"}}]}}"#);
    let (heads_tx, mut heads) = tokio::sync::mpsc::unbounded_channel::<(usize, String)>();
    let server_body = body;
    tokio::spawn(async move {
        let mut request = 0;
        for connection in 0.. {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let mut stream = BufReader::new(stream);
            loop {
                let mut head = String::new();
                loop {
                    let mut line = String::new();
                    if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                        break;
                    }
                    head.push_str(&line);
                    if line == "\r\n" {
                        break;
                    }
                }
                if head.is_empty() {
                    break;
                }
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                let mut sent = vec![0; length];
                stream.read_exact(&mut sent).await.unwrap();
                heads_tx.send((connection, head)).unwrap();
                let out = stream.get_mut();
                match request {
                    0 => {
                        let answer = server_body("after continue");
                        out.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                            .await
                            .unwrap();
                        out.write_all(
                            format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
                                answer.len()
                            )
                            .as_bytes(),
                        )
                        .await
                        .unwrap();
                    }
                    1 => {
                        let answer = server_body("chunked");
                        let (a, b) = answer.split_at(10);
                        out.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                            .await
                            .unwrap();
                        out.write_all(format!("{:x}\r\n{a}\r\n", a.len()).as_bytes())
                            .await
                            .unwrap();
                        out.flush().await.unwrap();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        out.write_all(format!("{:x}\r\n{b}\r\n0\r\n\r\n", b.len()).as_bytes())
                            .await
                            .unwrap();
                    }
                    _ => {
                        let answer = server_body("until close");
                        out.write_all(
                            format!("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{answer}")
                                .as_bytes(),
                        )
                        .await
                        .unwrap();
                        request += 1;
                        break;
                    }
                }
                request += 1;
            }
        }
    });

    let url = format!("http://{addr}/agent/respond?v=1");
    let client = client(&url, 0, limits(SHORT));
    let mut replies = Vec::new();
    for turn_index in 0..4 {
        let outcome = respond(&client, &history(), &ctx(turn_index)).await;
        let turn = outcome
            .result
            .unwrap_or_else(|f| panic!("turn {turn_index}: {f:?}"));
        replies.push(turn.reply.unwrap_or_default());
        past_close_grace().await;
    }
    assert_eq!(
        replies,
        ["after continue", "chunked", "until close", "until close"]
    );
    let mut seen = Vec::new();
    while let Ok((connection, head)) = heads.try_recv() {
        seen.push((connection, head));
    }
    let connections: Vec<usize> = seen.iter().map(|(c, _)| *c).collect();
    assert_eq!(
        connections,
        [0, 0, 0, 1],
        "reused until the server closed it"
    );
    for (_, head) in &seen {
        let lower = head.to_ascii_lowercase();
        assert!(
            head.starts_with("POST /agent/respond?v=1 HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(lower.contains(&format!("host: {addr}\r\n")), "{head}");
        assert!(lower.contains("content-length: "), "{head}");
        assert!(lower.contains("user-agent: trellis/"), "{head}");
        assert!(lower.contains("content-type: application/json"), "{head}");
    }
}

/// The plain HTTP path keeps what it works out per URL for a bounded number of URLs; an
/// agent whose URLs vary per call (a session id in the path) gets its connections reused
/// all the same, past that bound too.
#[tokio::test]
async fn connections_are_kept_alive_across_the_urls_of_one_address() {
    let server = MisbehavingServer::respond(200, OK_BODY).await;
    // An agent first called once the first one's URLs fill what the pool keeps.
    let later = MisbehavingServer::respond(200, OK_BODY).await;
    let transport = HttpTransport::new();
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::CONTENT_TYPE,
        reqwest::header::HeaderValue::from_static("application/json"),
    );
    for (session, server) in (0..100)
        .map(|s| (s, &server))
        .chain((0..5).map(|s| (s, &later)))
    {
        let url: reqwest::Url = format!("{}/sessions/{session}?turn=1", server.url())
            .parse()
            .unwrap();
        let answer = transport
            .post_json(
                &url,
                &headers,
                bytes::Bytes::from_static(b"{}"),
                1 << 20,
                SHORT,
            )
            .await
            .unwrap();
        assert_eq!(answer.status, 200);
        if session == 0 {
            past_close_grace().await;
        }
    }
    assert_eq!(server.requests(), 100);
    assert_eq!(server.connections(), 1);
    assert_eq!(later.requests(), 5);
    assert_eq!(later.connections(), 1);
}

/// A server that answers the first request on its connection, and on the second reads it,
/// works on it for 200 ms and dies: it closes the connection and stops listening.
async fn dies_while_working() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/agent/respond", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let mut buf = vec![0u8; 64 * 1024];
        let mut seen = 0;
        for request in 0..2 {
            // One request: headers and a body of Content-Length bytes.
            let mut have = Vec::new();
            loop {
                let n = stream.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                have.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&have).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let length: usize = text
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if have.len() >= end + 4 + length {
                        break;
                    }
                }
            }
            seen += 1;
            if request == 0 {
                let body = OK_BODY;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(answer.as_bytes()).await.unwrap();
            } else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                drop(listener);
                drop(stream);
                assert_eq!(seen, 2);
                return;
            }
        }
    });
    url
}

/// An agent that dies while it works on a request (not an idle close racing the request):
/// the fault says how long after the request it closed, not "as the request went out"; and
/// with `retry-after-send`, the attempt is the lost request (`transport`, it may have been
/// acted on), not the refused connect of the retry that followed.
#[tokio::test]
async fn an_agent_that_dies_while_working_is_told_apart_from_an_idle_close() {
    let url = dies_while_working().await;
    let client = client(&url, 0, limits(SHORT));
    respond(&client, &history(), &ctx(0)).await.result.unwrap();
    past_close_grace().await;
    let lost = respond(&client, &history(), &ctx(1)).await;
    let why = fault_of(&lost, FaultCategory::Transport);
    assert!(!why.contains("as the request went out"), "{why}");
    assert!(
        why.contains("after the request went out, before any answer"),
        "{why}"
    );

    let url = dies_while_working().await;
    let retrying = client_with(
        &url,
        RetryPolicy {
            retries: 0,
            after_send: true,
        },
        limits(SHORT),
    );
    respond(&retrying, &history(), &ctx(0))
        .await
        .result
        .unwrap();
    past_close_grace().await;
    let lost = respond(&retrying, &history(), &ctx(1)).await;
    let why = fault_of(&lost, FaultCategory::Transport);
    assert!(why.contains("after the request went out"), "{why}");
}
