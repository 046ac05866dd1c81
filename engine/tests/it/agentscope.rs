//! The AgentScope client and the SSE transport against servers on real sockets: raw-TCP
//! servers written here that misbehave in one precise way each, the builtin `weather` agent,
//! and the executor replaying a fork's prefix in a fresh session per branch.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use trellis_agents as builtin;
use trellis_engine::render::EnvSnapshot;

use crate::support::run_suite;
use trellis_engine::protocol::agentscope::AgentScopeClient;
use trellis_engine::protocol::{AgentProtocol, CallContext, Conversation, Turn, TurnInput};
use trellis_engine::record::{FaultCategory, TrajectoryStatus};
use trellis_engine::transport::http::{CallLimits, HttpTransport, RetryPolicy};

const SHORT: Duration = Duration::from_secs(5);

/// One thing a scripted server does on a connection.
#[derive(Clone, Debug)]
enum Step {
    Write(Vec<u8>),
    Sleep(Duration),
}

/// A request as received: its head and its JSON body.
#[derive(Clone, Debug)]
struct Request {
    head: String,
    body: Value,
}

impl Request {
    fn path(&self) -> &str {
        self.head.split_whitespace().nth(1).unwrap_or("")
    }

    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }

    fn session(&self) -> String {
        self.body["session_id"].as_str().unwrap_or("").to_owned()
    }

    /// The text of the (only) input message.
    fn text(&self) -> String {
        self.body["input"][0]["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }
}

type Script = Arc<dyn Fn(&Request) -> Vec<Step> + Send + Sync>;

/// An HTTP/1.1 server on 127.0.0.1 that answers each request with the steps its script
/// returns, then closes the connection.
struct ScriptedServer {
    url: String,
    seen: Arc<Mutex<Vec<Request>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedServer {
    async fn start(script: impl Fn(&Request) -> Vec<Step> + Send + Sync + 'static) -> Self {
        let script: Script = Arc::new(script);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/process", listener.local_addr().unwrap());
        let seen: Arc<Mutex<Vec<Request>>> = Arc::default();
        let recorded = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let script = Arc::clone(&script);
                let seen = Arc::clone(&recorded);
                tokio::spawn(async move {
                    let _ = serve(stream, script, seen).await;
                });
            }
        });
        ScriptedServer { url, seen, task }
    }

    /// A server that sends `steps` to every request.
    async fn steps(steps: Vec<Step>) -> Self {
        Self::start(move |_| steps.clone()).await
    }

    fn requests(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(
    mut stream: TcpStream,
    script: Script,
    seen: Arc<Mutex<Vec<Request>>>,
) -> io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buf[head_end..]).unwrap_or(Value::Null);
    let request = Request { head, body };
    let steps = script(&request);
    seen.lock().unwrap().push(request);
    for step in steps {
        match step {
            Step::Write(bytes) => stream.write_all(&bytes).await?,
            Step::Sleep(d) => tokio::time::sleep(d).await,
        }
    }
    stream.shutdown().await
}

/// Response headers: a 200 (or `status`) with this content type, the body ending at close.
fn head(status: u16, content_type: Option<&str>) -> Step {
    let mut head = format!("HTTP/1.1 {status} X\r\nConnection: close\r\n");
    if let Some(ct) = content_type {
        head.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    head.push_str("\r\n");
    Step::Write(head.into_bytes())
}

fn sse_head() -> Step {
    head(200, Some("text/event-stream"))
}

fn event(value: Value) -> Step {
    Step::Write(format!("data: {value}\n\n").into_bytes())
}

fn raw(text: &str) -> Step {
    Step::Write(text.as_bytes().to_vec())
}

/// The start of an answer: response created and in progress, then `text` as deltas of a
/// message known only by its `msg_id` (the text-only shape).
fn opening(text: &str) -> Vec<Step> {
    let mut steps = vec![
        sse_head(),
        event(json!({"sequence_number": 0, "object": "response", "id": "r1", "status": "created"})),
        event(
            json!({"sequence_number": 1, "object": "response", "id": "r1", "status": "in_progress"}),
        ),
    ];
    for piece in text.split_inclusive(' ') {
        steps.push(event(
            json!({"object": "content", "type": "text", "delta": true,
            "msg_id": "m1", "index": 0, "status": "in_progress", "text": piece}),
        ));
    }
    steps
}

fn completed(session: &str) -> Step {
    event(
        json!({"object": "response", "id": "r1", "status": "completed",
        "session_id": session, "usage": {"input_tokens": 5, "output_tokens": 2}}),
    )
}

fn client(url: &str, timeout: Duration, retry: RetryPolicy, stream: bool) -> AgentScopeClient {
    AgentScopeClient::new(
        url,
        vec![("X-Api-Key".into(), "secret".into())],
        CallLimits {
            timeout,
            max_response_size: 8 * 1024 * 1024,
        },
        retry,
        stream,
        HttpTransport::new(),
    )
    .unwrap()
}

fn conversation() -> Conversation<'static> {
    Conversation {
        run_id: "run1",
        suite: "s",
        scenario: "sc",
        repetition: 0,
        node: "start",
        sandbox: None,
        llm: None,
    }
}

async fn say(client: &AgentScopeClient, text: &str) -> Turn {
    let mut session = client.open(&conversation());
    let ctx = CallContext {
        test_case_id: "sc",
        turn_index: 0,
        deadline: None,
        turn_headers: None,
        system_prompt: None,
        llm_meter: None,
    };
    session.turn(TurnInput::User(text), &ctx).await
}

async fn say_to(url: &str, text: &str) -> Turn {
    say(&client_for(url), text).await
}

fn client_for(url: &str) -> AgentScopeClient {
    client(url, SHORT, RetryPolicy::default(), true)
}

#[track_caller]
fn fault(turn: &Turn, category: FaultCategory) -> String {
    match &turn.fault {
        Some(f) => {
            assert_eq!(f.category, category, "unexpected fault: {f:?}");
            f.message.clone()
        }
        None => panic!("expected a {category:?} fault, got {turn:?}"),
    }
}

/// A server that compresses its event stream unasked (aiohttp's `enable_compression(force
/// =True)`, gateways): the stream is decoded as it arrives, pieces split anywhere.
#[tokio::test]
async fn a_gzip_compressed_stream_is_read_as_it_arrives() {
    use std::io::Write as _;
    let server = ScriptedServer::start(|r| {
        let mut plain = Vec::new();
        let mut steps = opening("Hello there.");
        steps.push(completed(&r.session()));
        for step in steps.drain(1..) {
            if let Step::Write(bytes) = step {
                plain.extend_from_slice(&bytes);
            }
        }
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(&plain).unwrap();
        let compressed = encoder.finish().unwrap();
        let mut out = vec![raw(
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/event-stream\r\n\
             Content-Encoding: gzip\r\n\r\n",
        )];
        for piece in compressed.chunks(9) {
            out.push(Step::Write(piece.to_vec()));
            out.push(Step::Sleep(Duration::from_millis(1)));
        }
        out
    })
    .await;
    let turn = say_to(&server.url, "Hi").await;
    assert_eq!(turn.fault, None, "{turn:?}");
    assert_eq!(turn.reply.as_deref(), Some("Hello there."));

    let brotli = ScriptedServer::steps(vec![
        raw(
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/event-stream\r\n\
             Content-Encoding: br\r\n\r\n",
        ),
        raw("\u{1b}"),
    ])
    .await;
    let turn = say_to(&brotli.url, "Hi").await;
    let message = fault(&turn, FaultCategory::Protocol);
    assert!(message.contains("`br`"), "{message}");

    // A bomb: 5 MiB of one event's data in a few KiB of gzip stops at the event's limit,
    // and the fault says the size is the decoded one.
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(b"data: ").unwrap();
    encoder.write_all(&vec![b'x'; 5 << 20]).unwrap();
    let bomb = encoder.finish().unwrap();
    assert!(bomb.len() < 64 * 1024);
    let bomb = ScriptedServer::steps(vec![
        raw(
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/event-stream\r\n\
             Content-Encoding: gzip\r\n\r\n",
        ),
        Step::Write(bomb),
    ])
    .await;
    let turn = say_to(&bomb.url, "Hi").await;
    let message = fault(&turn, FaultCategory::TooLarge);
    assert!(
        message.contains("decoded from its gzip-compressed body"),
        "{message}"
    );
}

#[tokio::test]
async fn a_streamed_answer_is_assembled_and_the_request_has_the_runtime_shape() {
    let server = ScriptedServer::start(|r| {
        let mut steps = opening("Hello there.");
        // Heartbeats and comment lines carry nothing for the answer.
        steps.push(event(
            json!({"object": "message", "type": "heartbeat", "status": "in_progress"}),
        ));
        steps.push(raw(": keep-alive\n\n"));
        steps.push(completed(&r.session()));
        steps
    })
    .await;
    let client = client(&server.url, SHORT, RetryPolicy::default(), true);
    let mut session = client.open(&conversation());
    let mut other = client.open(&conversation());
    let ctx = CallContext {
        test_case_id: "sc",
        turn_index: 0,
        deadline: None,
        turn_headers: None,
        system_prompt: None,
        llm_meter: None,
    };
    let turn = session.turn(TurnInput::User("Hi"), &ctx).await;
    assert_eq!(turn.fault, None);
    assert_eq!(turn.reply.as_deref(), Some("Hello there."));
    assert_eq!(turn.messages.len(), 1);
    assert_eq!(turn.exchanges.len(), 1);
    let exchange = &turn.exchanges[0];
    assert_eq!(&*exchange.label, "POST /process");
    assert_eq!(exchange.attempts.len(), 1);
    let ttft = exchange.ttft.expect("time to first event");
    assert!(
        ttft <= exchange.latency(),
        "{ttft:?} > {:?}",
        exchange.latency()
    );
    assert_eq!(turn.usage().and_then(|u| u.completion_tokens), Some(2));

    session.turn(TurnInput::User("Again"), &ctx).await;
    other.turn(TurnInput::User("Other"), &ctx).await;
    // Another agent of the run on the same server: its sessions are apart too.
    let second_agent = client_for(&server.url);
    say(&second_agent, "Third").await;
    let requests = server.requests();
    assert_eq!(requests.len(), 4);
    let first = &requests[0];
    assert_ne!(requests[3].session(), first.session());
    assert_ne!(requests[3].session(), requests[2].session());
    assert!(requests.iter().all(|r| r.path() == "/process"));
    assert_eq!(first.path(), "/process");
    assert_eq!(first.header("accept").as_deref(), Some("text/event-stream"));
    assert_eq!(first.header("x-api-key").as_deref(), Some("secret"));
    assert_eq!(
        first.body["input"],
        json!([{"role": "user", "type": "message", "content": [{"type": "text", "text": "Hi"}]}])
    );
    assert_eq!(first.body["stream"], true);
    // The server keeps the history: the second request carries only the new message, on the
    // same session; another conversation gets a session of its own.
    assert_eq!(requests[1].body["input"].as_array().map(Vec::len), Some(1));
    assert_eq!(requests[1].text(), "Again");
    assert_eq!(requests[1].session(), first.session());
    assert_ne!(requests[2].session(), first.session());
    assert!(
        first.session().starts_with("trellis-run1-"),
        "{}",
        first.session()
    );
}

#[tokio::test]
async fn a_response_without_the_event_stream_content_type_is_a_protocol_fault() {
    let mut steps = vec![head(200, None)];
    steps.extend(opening("Hello").into_iter().skip(1));
    let server = ScriptedServer::steps(steps).await;
    let turn = say_to(&server.url, "Hi").await;
    let message = fault(&turn, FaultCategory::Protocol);
    assert!(message.contains("no Content-Type"), "{message}");

    let server = ScriptedServer::steps(vec![
        head(200, Some("text/html")),
        raw("<html>Welcome to nginx</html>"),
    ])
    .await;
    let turn = say_to(&server.url, "Hi").await;
    let message = fault(&turn, FaultCategory::Protocol);
    assert!(message.contains("Content-Type: text/html"), "{message}");
    assert!(message.contains("Welcome to nginx"), "{message}");

    // A value with bytes outside ASCII (Latin-1 `é`) is there, and said as it reads.
    let server = ScriptedServer::steps(vec![
        Step::Write(
            b"HTTP/1.1 200 X\r\nConnection: close\r\nContent-Type: text/plain; charset=caf\xe9\r\n\r\n"
                .to_vec(),
        ),
        raw("not events"),
    ])
    .await;
    let turn = say_to(&server.url, "Hi").await;
    let message = fault(&turn, FaultCategory::Protocol);
    assert!(
        message.contains("got Content-Type: text/plain; charset=caf\u{fffd}"),
        "{message}"
    );
}

#[tokio::test]
async fn http_errors_quote_the_body_and_only_5xx_is_retried() {
    let server = ScriptedServer::steps(vec![
        head(422, Some("application/json")),
        raw(r#"{"detail":"input: Input should be a valid list"}"#),
    ])
    .await;
    let retry = RetryPolicy {
        retries: 2,
        after_send: false,
    };
    let turn = say(&client(&server.url, SHORT, retry, true), "Hi").await;
    let message = fault(&turn, FaultCategory::Http4xx);
    assert!(message.contains("valid list"), "{message}");
    assert_eq!(server.requests().len(), 1);

    let server =
        ScriptedServer::steps(vec![head(503, Some("text/plain")), raw("overloaded")]).await;
    let turn = say(&client(&server.url, SHORT, retry, true), "Hi").await;
    let message = fault(&turn, FaultCategory::Http5xx);
    assert!(message.contains("overloaded"), "{message}");
    assert_eq!(server.requests().len(), 3);
    assert_eq!(turn.exchanges[0].attempts.len(), 3);
}

/// Heartbeats keep a connection open, not a run alive: a server that sends nothing else
/// stalls out after the idle timeout instead of streaming until the size bound.
#[tokio::test]
async fn heartbeats_alone_do_not_keep_a_stream_alive() {
    let message = stalls_out(json!({"object": "message", "type": "heartbeat"})).await;
    assert!(message.contains("heartbeats do not count"), "{message}");
}

/// The timeout fault of a turn whose stream, after its opening, sends only `event`, every
/// 100 ms: it must come after the idle timeout (800 ms), not when the stream ends.
async fn stalls_out(event_sent: Value) -> String {
    let mut steps = opening("Thinking");
    for _ in 0..100 {
        steps.push(Step::Sleep(Duration::from_millis(100)));
        steps.push(event(event_sent.clone()));
    }
    let server = ScriptedServer::steps(steps).await;
    let started = std::time::Instant::now();
    let turn = say(
        &client(
            &server.url,
            Duration::from_millis(800),
            RetryPolicy::default(),
            true,
        ),
        "Hi",
    )
    .await;
    let message = fault(&turn, FaultCategory::Timeout);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the stall took {:?}",
        started.elapsed()
    );
    message
}

/// A stuck server repeating one event (its response `in_progress`, every 100 ms) moves
/// nothing: it stalls out after the idle timeout, as heartbeats do, rather than stream on.
#[tokio::test]
async fn an_event_repeated_over_and_over_does_not_keep_a_stream_alive() {
    let message =
        stalls_out(json!({"id": "r", "object": "response", "status": "in_progress"})).await;
    assert!(message.contains("the stream stalled"), "{message}");
}

#[tokio::test]
async fn a_stall_mid_stream_is_an_idle_timeout_never_retried() {
    let mut steps = opening("Thinking about it");
    steps.push(Step::Sleep(Duration::from_secs(30)));
    let server = ScriptedServer::steps(steps).await;
    let retry = RetryPolicy {
        retries: 2,
        after_send: true,
    };
    let started = std::time::Instant::now();
    let turn = say(
        &client(&server.url, Duration::from_secs(1), retry, true),
        "Hi",
    )
    .await;
    let message = fault(&turn, FaultCategory::Timeout);
    assert!(message.contains("stalled"), "{message}");
    assert!(message.contains("5 events"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The stream had started: the agent was at work, so nothing is sent again.
    assert_eq!(server.requests().len(), 1);
    let exchange = &turn.exchanges[0];
    assert_eq!(exchange.attempts.len(), 1, "{:?}", exchange.attempts);
    assert!(exchange.attempts[0].fault.is_some());
    assert!(exchange.ttft.is_some());
    assert!(exchange.latency() >= Duration::from_secs(1));
    // What arrived before the stall is kept.
    assert_eq!(
        turn.messages[0].content.as_deref(),
        Some("Thinking about it")
    );
    assert_eq!(turn.reply, None);
}

#[tokio::test]
async fn no_first_event_in_time_is_a_timeout() {
    let server =
        ScriptedServer::steps(vec![sse_head(), Step::Sleep(Duration::from_secs(30))]).await;
    let turn = say(
        &client(
            &server.url,
            Duration::from_secs(1),
            RetryPolicy::default(),
            true,
        ),
        "Hi",
    )
    .await;
    let message = fault(&turn, FaultCategory::Timeout);
    assert!(message.contains("no event within 1s"), "{message}");
    assert_eq!(turn.exchanges[0].ttft, None);
}

/// A stream that closes while a message is still being written was cut short:
/// `incomplete`, the text so far kept. So is one that closes before any message.
#[tokio::test]
async fn a_stream_that_closes_mid_message_is_incomplete() {
    let server = ScriptedServer::steps(opening("Half an ans")).await;
    let turn = say_to(&server.url, "Hi").await;
    let message = fault(&turn, FaultCategory::Incomplete);
    assert!(
        message.contains("ended before message `m1` completed"),
        "{message}"
    );
    assert!(message.contains("5 events"), "{message}");
    assert_eq!(turn.messages[0].content.as_deref(), Some("Half an ans"));
    let server = ScriptedServer::steps(opening("")).await;
    let turn = say_to(&server.url, "Hi").await;
    let message = fault(&turn, FaultCategory::Incomplete);
    assert!(
        message.contains("ended before the response completed"),
        "{message}"
    );
}

/// Real servers end an answer with the completed response or by closing the connection
/// (docs/wire.md, "AgentScope"): a close, or a `[DONE]`, after every message it started
/// completed is the answer's end, not a fault.
#[tokio::test]
async fn a_stream_that_closes_after_its_messages_completed_is_the_answer() {
    for end in [None, Some(raw("data: [DONE]\n\n"))] {
        let mut steps = opening("It is 9 degrees.");
        steps.push(event(
            json!({"object": "message", "id": "m1", "type": "message",
            "role": "assistant", "status": "completed",
            "content": [{"type": "text", "text": "It is 9 degrees.", "delta": null}]}),
        ));
        steps.extend(end);
        let server = ScriptedServer::steps(steps).await;
        let turn = say_to(&server.url, "Hi").await;
        assert_eq!(turn.fault, None);
        assert_eq!(turn.reply.as_deref(), Some("It is 9 degrees."));
    }
}

/// A chunked stream cut mid-body (the server died, or its handler raised after a few
/// events) is the stream ending early, as a clean close is: `incomplete`, the text so far
/// kept.
#[tokio::test]
async fn a_chunked_stream_cut_mid_body_is_incomplete() {
    let mut body = Vec::new();
    for step in opening("Half an ans").into_iter().skip(1) {
        if let Step::Write(bytes) = step {
            body.extend_from_slice(&bytes);
        }
    }
    let chunk = format!("{:x}\r\n", body.len());
    let server = ScriptedServer::steps(vec![
        raw("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
             Transfer-Encoding: chunked\r\n\r\n"),
        Step::Write([chunk.into_bytes(), body, b"\r\n".to_vec()].concat()),
        // The next chunk announced, never sent: the connection closes.
        raw("40\r\ndata: {"),
    ])
    .await;
    let turn = say_to(&server.url, "Hi").await;
    let message = fault(&turn, FaultCategory::Incomplete);
    assert!(message.contains("broke off before its end"), "{message}");
    assert_eq!(turn.messages[0].content.as_deref(), Some("Half an ans"));
}

#[tokio::test]
async fn invalid_json_in_one_event_is_invalid_json() {
    let mut steps = opening("Hello");
    steps.push(raw(
        "data: {\"object\": \"content\", \"text\": \"unterminated\n\n",
    ));
    steps.push(completed("s"));
    let server = ScriptedServer::steps(steps).await;
    let turn = say_to(&server.url, "Hi").await;
    let message = fault(&turn, FaultCategory::InvalidJson);
    assert!(message.contains("event 4 is not JSON"), "{message}");
    assert!(message.contains("unterminated"), "{message}");
}

#[tokio::test]
async fn one_enormous_event_is_too_large_before_it_is_whole() {
    let mut steps = opening("Hello");
    let mut huge = String::from("data: {\"object\": \"content\", \"text\": \"");
    huge.push_str(&"x".repeat(6 * 1024 * 1024));
    steps.push(raw(&huge));
    steps.push(raw("\"}\n\n"));
    steps.push(completed("s"));
    let server = ScriptedServer::steps(steps).await;
    let turn = say_to(&server.url, "Hi").await;
    let message = fault(&turn, FaultCategory::TooLarge);
    assert!(
        message.contains("one event exceeded 4194304 bytes"),
        "{message}"
    );

    // Many small events add up to the stream's bound, max-response-size.
    let mut steps = opening("Hello");
    for _ in 0..2000 {
        steps.push(event(json!({"object": "message", "type": "heartbeat"})));
    }
    let server = ScriptedServer::steps(steps).await;
    let small = AgentScopeClient::new(
        &server.url,
        Vec::new(),
        CallLimits {
            timeout: SHORT,
            max_response_size: 16 * 1024,
        },
        RetryPolicy::default(),
        true,
        HttpTransport::new(),
    )
    .unwrap();
    let turn = say(&small, "Hi").await;
    let message = fault(&turn, FaultCategory::TooLarge);
    assert!(message.contains("exceeded 16384 bytes"), "{message}");
}

#[tokio::test]
async fn an_error_frame_is_an_agent_error() {
    let server = ScriptedServer::steps(vec![
        sse_head(),
        event(json!({"error": "input.content: Input should be a valid list"})),
    ])
    .await;
    let turn = say_to(&server.url, "Hi").await;
    let message = fault(&turn, FaultCategory::AgentError);
    assert!(
        message.contains("Input should be a valid list"),
        "{message}"
    );
    // No first token came: no time to it (a `ttft` check then has nothing to pass).
    assert_eq!(turn.exchanges[0].ttft, None);
}

/// A response that is `created` and then fails had no first token either: its `ttft` is
/// not the time to its `created` event.
#[tokio::test]
async fn a_response_that_fails_before_any_content_has_no_ttft() {
    let server = ScriptedServer::steps(vec![
        sse_head(),
        event(json!({"sequence_number": 0, "object": "response", "status": "created", "id": "r1"})),
        event(json!({"object": "response", "status": "failed",
            "error": {"code": "X", "message": "boom"}})),
    ])
    .await;
    let turn = say_to(&server.url, "Hi").await;
    fault(&turn, FaultCategory::AgentError);
    assert_eq!(turn.exchanges[0].ttft, None);
}

#[tokio::test]
async fn a_session_collision_names_the_session() {
    let server = ScriptedServer::start(|r| {
        vec![
            sse_head(),
            event(json!({"error": format!("Task {} is already in RUNNING state.", r.session())})),
        ]
    })
    .await;
    let turn = say_to(&server.url, "Hi").await;
    let message = fault(&turn, FaultCategory::AgentError);
    assert!(message.contains("collided"), "{message}");
    let session = server.requests()[0].session();
    assert!(
        message.contains(&format!("session `{session}`")),
        "{message}"
    );
}

#[tokio::test]
async fn a_failed_response_is_an_agent_error_with_code_and_message() {
    let mut steps = opening("Let me check");
    steps.push(event(
        json!({"object": "response", "id": "r1", "status": "failed",
        "error": {"code": "AGENT_UNKNOWN_ERROR", "message": "model quota exceeded"}}),
    ));
    let server = ScriptedServer::steps(steps.clone()).await;
    let turn = say_to(&server.url, "Hi").await;
    let message = fault(&turn, FaultCategory::AgentError);
    assert!(message.contains("run failed"), "{message}");
    assert!(
        message.contains("AGENT_UNKNOWN_ERROR: model quota exceeded"),
        "{message}"
    );

    steps.pop();
    steps.push(event(json!({"object": "response", "status": "rejected",
        "error": {"code": "RATE_LIMITED", "message": "slow down"}})));
    let server = ScriptedServer::steps(steps).await;
    let turn = say_to(&server.url, "Hi").await;
    let message = fault(&turn, FaultCategory::AgentError);
    assert!(message.contains("rejected"), "{message}");
}

#[tokio::test]
async fn a_json_answer_to_a_streaming_request_is_accepted() {
    let server = ScriptedServer::steps(vec![
        head(200, Some("application/json")),
        raw(
            &json!({"object": "response", "status": "completed", "output": [
            {"id": "m", "type": "message", "role": "assistant",
             "content": [{"type": "text", "text": "All in one."}]}]})
            .to_string(),
        ),
    ])
    .await;
    let turn = say_to(&server.url, "Hi").await;
    assert_eq!(turn.fault, None);
    assert_eq!(turn.reply.as_deref(), Some("All in one."));
    assert_eq!(turn.exchanges[0].ttft, None);
}

#[tokio::test]
async fn a_json_answer_that_breaks_the_protocol_is_the_attempts_fault_too() {
    // Every attempt is recorded with its fault: a JSON answer the client cannot use is the
    // fault of the attempt that received it, as it is for a streamed one.
    for body in [
        "not json",
        r#"{"object": "response", "status": "in_progress"}"#,
    ] {
        let server =
            ScriptedServer::steps(vec![head(200, Some("application/json")), raw(body)]).await;
        let turn = say_to(&server.url, "Hi").await;
        let turn_fault = turn.fault.clone();
        assert!(turn_fault.is_some(), "{body}: {turn:?}");
        let attempt = turn.exchanges[0].attempts.last().cloned();
        assert_eq!(
            attempt.and_then(|a| a.fault),
            turn_fault,
            "{body}: the attempt lost its fault"
        );
    }
}

// The builtin weather agent.

/// A tool call and its result after the agent's only text: that text was written before the
/// tools ran and is not the answer. The turn keeps its messages and the call, has no reply,
/// and is a protocol fault; so is a completed answer with no assistant text at all.
#[tokio::test]
async fn an_answer_that_ends_with_tool_calls_or_has_no_text_is_a_protocol_fault() {
    let call = |status: &str, arguments: &str| {
        json!({"object": "message", "id": "mc", "type": "plugin_call", "role": "tool",
            "status": status, "content": [{"type": "data", "data":
            {"call_id": "c1", "name": "get_weather", "arguments": arguments}}]})
    };
    let output = json!({"object": "message", "id": "mo", "type": "plugin_call_output",
        "role": "tool", "status": "completed", "content": [{"type": "data", "data":
        {"call_id": "c1", "name": "get_weather",
        "output": "[{\"type\": \"text\", \"text\": \"2\"}]"}}]});
    let pretext = ScriptedServer::start(move |r| {
        let mut steps = opening("Let me check that for you.");
        steps.push(event(call("in_progress", "")));
        steps.push(event(call("completed", r#"{"city": "Oslo"}"#)));
        steps.push(event(output.clone()));
        steps.push(completed(&r.session()));
        steps
    })
    .await;
    let turn = say_to(&pretext.url, "Weather in Oslo?").await;
    let message = fault(&turn, FaultCategory::Protocol);
    assert!(message.contains("not the answer"), "{message}");
    assert_eq!(turn.reply, None);
    assert_eq!(turn.tool_calls.len(), 1);
    assert_eq!(turn.tool_calls[0].name, "get_weather");
    assert_eq!(
        turn.tool_calls[0].result.as_deref(),
        Some("[{\"type\": \"text\", \"text\": \"2\"}]")
    );
    let roles: Vec<_> = turn.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["assistant", "tool", "tool"]);
    // The attempt itself answered as the protocol asks: the fault is the turn's.
    assert_eq!(turn.exchanges[0].attempts[0].fault, None);

    let empty = ScriptedServer::steps(vec![
        sse_head(),
        event(json!({"sequence_number": 0, "object": "response", "id": "r1", "status": "created"})),
        event(json!({"object": "response", "id": "r1", "status": "completed", "output": []})),
    ])
    .await;
    let turn = say_to(&empty.url, "Hi").await;
    let message = fault(&turn, FaultCategory::Protocol);
    assert!(
        message.contains("no assistant message with text"),
        "{message}"
    );
    assert_eq!(turn.reply, None);

    // Text after the tools ran is the answer, as before.
    let answered = ScriptedServer::start(move |r| {
        let mut steps = opening("Let me check.");
        steps.push(event(call("completed", r#"{"city": "Oslo"}"#)));
        steps.push(event(
            json!({"object": "content", "type": "text", "delta": true, "msg_id": "m2",
            "index": 0, "status": "in_progress", "text": "It is 2°C in Oslo."}),
        ));
        steps.push(completed(&r.session()));
        steps
    })
    .await;
    let turn = say_to(&answered.url, "Weather in Oslo?").await;
    assert_eq!(turn.fault, None);
    assert_eq!(turn.reply.as_deref(), Some("It is 2°C in Oslo."));
}

#[tokio::test]
async fn the_builtin_calls_get_weather_and_streams_its_answer() {
    let server = builtin::serve("weather").await.unwrap();
    assert!(server.url().ends_with("/process"), "{}", server.url());
    let client = client(&server.url(), SHORT, RetryPolicy::default(), true);
    let turn = say(&client, "What's the weather in Paris?").await;
    assert_eq!(turn.fault, None);
    assert_eq!(
        turn.reply.as_deref(),
        Some("It is 18°C and sunny in Paris.")
    );
    assert_eq!(turn.tool_calls.len(), 1);
    let call = &turn.tool_calls[0];
    assert_eq!(call.name, "get_weather");
    let arguments: Value = serde_json::from_str(&call.arguments).unwrap();
    assert_eq!(arguments, json!({"city": "Paris"}));
    let result: Value = serde_json::from_str(call.result.as_deref().unwrap()).unwrap();
    assert_eq!(result[0]["text"], "Paris: 18°C, sunny");
    let roles: Vec<_> = turn.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["assistant", "tool", "assistant"]);
    let exchange = &turn.exchanges[0];
    let ttft = exchange.ttft.unwrap();
    assert!(
        ttft < exchange.latency(),
        "{ttft:?} vs {:?}",
        exchange.latency()
    );
    assert!(turn.usage().and_then(|u| u.total_tokens).unwrap() > 0);
}

#[tokio::test]
async fn the_builtin_keeps_each_session_apart() {
    let server = builtin::serve("weather").await.unwrap();
    let client = client(&server.url(), SHORT, RetryPolicy::default(), true);
    let ctx = CallContext {
        test_case_id: "sc",
        turn_index: 0,
        deadline: None,
        turn_headers: None,
        system_prompt: None,
        llm_meter: None,
    };
    let mut one = client.open(&conversation());
    let mut two = client.open(&conversation());
    one.turn(TurnInput::User("weather in Tokyo?"), &ctx).await;
    two.turn(TurnInput::User("weather in Lima?"), &ctx).await;
    let turn = one.turn(TurnInput::User("What did I ask?"), &ctx).await;
    assert_eq!(
        turn.reply.as_deref(),
        Some("So far you asked me about Tokyo.")
    );
    assert!(
        one.fork().is_none(),
        "a server-side session cannot be copied"
    );
}

#[tokio::test]
async fn the_builtins_failing_run_is_recorded_as_an_agent_error() {
    let server = builtin::serve("weather").await.unwrap();
    let turn = say_to(&server.url(), "Any tornado near Kansas?").await;
    let message = fault(&turn, FaultCategory::AgentError);
    assert!(message.contains("AGENT_UNKNOWN_ERROR"), "{message}");
    assert_eq!(turn.reply, None);
    assert!(!turn.messages.is_empty(), "the partial answer is kept");
}

#[tokio::test]
async fn the_builtin_answers_one_json_body_when_not_streaming() {
    let server = builtin::serve("weather").await.unwrap();
    let client = client(&server.url(), SHORT, RetryPolicy::default(), false);
    let turn = say(&client, "Is it cold in Berlin?").await;
    assert_eq!(turn.fault, None);
    assert_eq!(
        turn.reply.as_deref(),
        Some("It is 9°C and overcast in Berlin.")
    );
    assert_eq!(turn.tool_calls.len(), 1);
    assert_eq!(turn.exchanges[0].ttft, None);
}

// Branches: a fresh session per branch, the prefix replayed in it.

const FORKS: &str = r#"
agent "scope" protocol="agentscope" url="URL"
scenario "fork" {
    repeat 2
    user "a"
    user "b"
    branch "x" { user "x1" }
    branch "y" {
        user "y1"
        branch "deep1" { user "d1" }
        branch "deep2" { user "d2" }
    }
    user "tail"
    criteria { no-error }
}
"#;

#[tokio::test]
async fn each_branch_gets_a_fresh_session_with_the_prefix_replayed() {
    let server = ScriptedServer::start(|r| {
        let mut steps = opening(&format!("echo {}", r.text()));
        steps.push(completed(&r.session()));
        steps
    })
    .await;
    let run = run_suite(&FORKS.replace("URL", &server.url), 8, EnvSnapshot::new()).await;
    let (nodes, trajectories) = (run.nodes, run.trajectories);
    assert_eq!(trajectories.len(), 6);
    assert!(
        trajectories
            .iter()
            .all(|t| t.status == TrajectoryStatus::Passed),
        "{trajectories:?}"
    );

    // Every session holds exactly one trajectory's conversation, from its first message.
    let mut sessions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for request in server.requests() {
        assert_eq!(request.body["input"].as_array().map(Vec::len), Some(1));
        sessions
            .entry(request.session())
            .or_default()
            .push(request.text());
    }
    let mut conversations: Vec<Vec<String>> = sessions.into_values().collect();
    conversations.sort();
    let expected = |m: &[&str]| m.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut want = vec![
        expected(&["a", "b", "x1", "tail"]),
        expected(&["a", "b", "y1", "d1", "tail"]),
        expected(&["a", "b", "y1", "d2", "tail"]),
    ];
    want.extend(want.clone());
    want.sort();
    assert_eq!(conversations, want);

    // Records: each node's turns once, plus the replays that rebuilt the sessions.
    let turns: Vec<_> = nodes.iter().flat_map(|n| &n.turns).collect();
    let replays = turns.iter().filter(|t| t.replay).count();
    assert_eq!(turns.len() - replays, 18, "the original turns");
    assert_eq!(turns.len(), 28, "every request is recorded");
    assert!(turns.iter().all(|t| t.fault.is_none()));
    assert!(turns.iter().all(|t| t.ttft_ms.is_some()));
}

#[tokio::test]
async fn the_builtin_answers_a_second_request_on_a_busy_session_with_a_collision() {
    let server = builtin::serve("weather").await.unwrap();
    let http = trellis_engine::transport::tls::client_builder()
        .unwrap()
        .build()
        .unwrap();
    let body = json!({"input": [{"role": "user", "type": "message",
        "content": [{"type": "text", "text": "weather in Paris?"}]}],
        "stream": true, "session_id": "shared"})
    .to_string();
    let post = || {
        http.post(server.url())
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
    };
    // Headers in hand means the first answer is under way on the server.
    let first = post().await.unwrap();
    let second = post().await.unwrap();
    let second = second.text().await.unwrap();
    assert!(
        second.contains("Task shared is already in RUNNING state."),
        "{second}"
    );
    let first = first.text().await.unwrap();
    assert!(first.contains("\"status\":\"completed\""), "{first}");
    // Once the first answer is over, the session takes requests again.
    let third = post().await.unwrap();
    assert!(!third.text().await.unwrap().contains("RUNNING"));
}

#[tokio::test]
async fn a_stream_recorded_from_agentscope_runtime_is_assembled() {
    let recorded = include_str!("fixtures/agentscope-runtime-tool-call.sse");
    let server = ScriptedServer::start(move |r| {
        vec![sse_head(), raw(&recorded.replace("SESSION", &r.session()))]
    })
    .await;
    let turn = say_to(&server.url, "weather in Paris?").await;
    assert_eq!(turn.fault, None);
    assert_eq!(turn.reply.as_deref(), Some("It is 18C and sunny."));
    assert_eq!(turn.tool_calls.len(), 1);
    let call = &turn.tool_calls[0];
    assert_eq!(call.call_id, "call_1");
    let arguments: Value = serde_json::from_str(&call.arguments).unwrap();
    assert_eq!(arguments, json!({"city": "Paris"}));
    assert_eq!(
        call.result.as_deref(),
        Some(r#"[{"type": "text", "text": "18C sunny"}]"#)
    );
    let shape: Vec<_> = turn
        .messages
        .iter()
        .map(|m| (m.role.as_str(), m.content.as_deref()))
        .collect();
    assert_eq!(
        shape,
        [
            ("assistant", Some("Let me check.")),
            ("assistant", None),
            ("tool", Some(r#"[{"type": "text", "text": "18C sunny"}]"#)),
            ("assistant", Some("It is 18C and sunny.")),
        ]
    );
}

#[tokio::test]
async fn ttft_is_the_time_to_the_first_content_not_to_the_first_event() {
    let server = ScriptedServer::start(|r| {
        let mut steps = opening("");
        steps.truncate(3);
        steps.push(Step::Sleep(Duration::from_millis(300)));
        steps.extend(opening("Late answer").into_iter().skip(3));
        steps.push(completed(&r.session()));
        steps
    })
    .await;
    let turn = say_to(&server.url, "Hi").await;
    assert_eq!(turn.fault, None);
    let ttft = turn.exchanges[0].ttft.unwrap();
    assert!(ttft >= Duration::from_millis(300), "{ttft:?}");
}

// A branch's time budget: the replayed prefix replaces the original prefix, it does not add
// to it, so a replayed branch has the same `timeout` budget as the branch that continues.

const SLOW_FORK: &str = r#"
agent "scope" protocol="agentscope" url="URL"
scenario "slow-fork" {
    timeout "2200ms"
    user "a"
    user "b"
    user "c"
    branch "continues" { user "x1" }
    branch "replays" { user "y1" }
    criteria { no-error }
}
"#;

#[tokio::test]
async fn a_replayed_prefix_does_not_count_twice_against_the_trajectory_timeout() {
    // Every answer takes 400ms: a branch's conversation is 4 turns, 1.6s, inside 2.2s. Counted
    // twice, the replaying branch's prefix would be 2.4s and time out during the replay.
    let server = ScriptedServer::start(|r| {
        let mut steps = vec![Step::Sleep(Duration::from_millis(400))];
        steps.extend(opening(&format!("echo {}", r.text())));
        steps.push(completed(&r.session()));
        steps
    })
    .await;
    let trajectories = run_suite(
        &SLOW_FORK.replace("URL", &server.url),
        8,
        EnvSnapshot::new(),
    )
    .await
    .trajectories;
    assert_eq!(trajectories.len(), 2);
    for t in &trajectories {
        assert_eq!(t.status, TrajectoryStatus::Passed, "{t:?}");
        assert!(
            t.duration_ms < 2200.0,
            "{}: {} ms counted against the timeout",
            t.trajectory,
            t.duration_ms
        );
    }
}

/// A replayed prefix is replayed step by step in the branch's own session: a value the
/// prefix captured is captured again from that session's answers, so an agent that hands
/// out an id per session gets its own id back in every branch.
#[tokio::test]
async fn a_replayed_prefix_captures_its_own_values() {
    let server = ScriptedServer::start(|r| {
        let session = r.session();
        let text = r.text();
        let answer = match text.strip_prefix("check ") {
            None => format!("token {session}"),
            Some(token) if token == session => "MATCH".to_owned(),
            Some(_) => "MISMATCH".to_owned(),
        };
        let mut steps = opening(&answer);
        steps.push(completed(&session));
        steps
    })
    .await;
    let suite = r##"
agent "scope" protocol="agentscope" url="URL"
scenario "tokens" {
    user "whoami"
    capture "tok" regex=#"token (\S+)"#
    user "check {{ vars.tok }}"
    expect reply equals="MATCH"
    branch "a" {
        user "check {{ vars.tok }}"
        expect reply equals="MATCH"
    }
    branch "b" {
        user "check {{ vars.tok }}"
        expect reply equals="MATCH"
    }
}
"##;
    let trajectories = run_suite(&suite.replace("URL", &server.url), 8, EnvSnapshot::new())
        .await
        .trajectories;
    assert_eq!(trajectories.len(), 2);
    for t in &trajectories {
        assert_eq!(t.status, TrajectoryStatus::Passed, "{t:?}");
    }
    // Every `check` carried the token of the session it was sent in.
    for request in server.requests() {
        if let Some(token) = request.text().strip_prefix("check ") {
            assert_eq!(token, request.session(), "a token from another session");
        }
    }
}
