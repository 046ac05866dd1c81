//! The A2A client over real sockets: the builtin `travel` agent, raw-TCP servers written
//! here that each break the protocol one way, and `trellis-testkit`'s misbehaving servers
//! named as the JSON-RPC endpoint by a card served here.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use trellis_agents as builtin;
use trellis_engine::protocol::a2a::A2aClient;
use trellis_engine::protocol::a2a::A2aSettings;
use trellis_engine::protocol::{
    AgentProtocol, CallContext, Conversation, Session, Turn, TurnInput,
};
use trellis_engine::record::FaultCategory;
use trellis_engine::transport::http::{CallLimits, HttpTransport, RetryPolicy};
use trellis_testkit::{Behavior, MisbehavingServer};

const SHORT: Duration = Duration::from_secs(5);

/// A request as received: its head and its body.
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
}

type Script = Arc<dyn Fn(&Request, &str) -> Vec<u8> + Send + Sync>;

/// An HTTP/1.1 server on 127.0.0.1 that answers each request with the bytes its script
/// returns (given the request and the server's own base URL), then closes the connection.
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
    async fn start(script: impl Fn(&Request, &str) -> Vec<u8> + Send + Sync + 'static) -> Self {
        let script: Script = Arc::new(script);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen: Arc<Mutex<Vec<Request>>> = Arc::default();
        let recorded = Arc::clone(&seen);
        let base = url.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let script = Arc::clone(&script);
                let seen = Arc::clone(&recorded);
                let base = base.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, script, seen, base).await;
                });
            }
        });
        ScriptedServer { url, seen, task }
    }

    fn requests(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }

    /// The JSON-RPC requests received (the card requests left out).
    fn calls(&self) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r.head.starts_with("POST"))
            .map(|r| r.body)
            .collect()
    }
}

async fn serve(
    mut stream: TcpStream,
    script: Script,
    seen: Arc<Mutex<Vec<Request>>>,
    base: String,
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
    let mut answer = script(&request, &base);
    if let Some(id) = request.body.get("id") {
        answer = answer_to(answer, id);
    }
    seen.lock().unwrap().push(request);
    stream.write_all(&answer).await?;
    stream.shutdown().await
}

/// `answer` with the JSON-RPC id the scripts write (`1`) made the request's own, as a server
/// echoes it (the client numbers its requests across the process), and its
/// `Content-Length` made to fit. Scripts that answer another request on purpose use an id
/// other than `1`.
fn answer_to(answer: Vec<u8>, id: &Value) -> Vec<u8> {
    let text = String::from_utf8_lossy(&answer);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return answer;
    };
    let own = format!("\"id\":{id}");
    let body = body
        .replace("\"id\":1,", &format!("{own},"))
        .replace("\"id\":1}", &format!("{own}}}"));
    let head: Vec<String> = head
        .split("\r\n")
        .map(|line| match line.split_once(':') {
            Some((name, _)) if name.eq_ignore_ascii_case("content-length") => {
                format!("{name}: {}", body.len())
            }
            _ => line.to_owned(),
        })
        .collect();
    format!("{}\r\n\r\n{body}", head.join("\r\n")).into_bytes()
}

fn http(status: u16, content_type: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} X\r\nConnection: close\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn json_body(value: &Value) -> Vec<u8> {
    http(200, "application/json", &value.to_string())
}

/// A stream of server-sent events, each a JSON-RPC response carrying one result; closed
/// after the last.
fn events(results: &[Value]) -> Vec<u8> {
    let mut out =
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/event-stream\r\n\r\n".to_vec();
    for result in results {
        let envelope = json!({"jsonrpc": "2.0", "id": 1, "result": result});
        out.extend_from_slice(format!("data: {envelope}\n\n").as_bytes());
    }
    out
}

fn card(url: &str, streaming: bool) -> Value {
    json!({"name": "t", "url": url, "version": "1", "capabilities": {"streaming": streaming},
           "skills": []})
}

fn message(text: &str) -> Value {
    json!({"kind": "message", "role": "agent", "messageId": "m", "contextId": "ctx-9",
           "parts": [{"kind": "text", "text": text}]})
}

/// A server whose card names `{base}/rpc` and whose endpoint answers with `rpc`.
async fn agent(
    streaming: bool,
    rpc: impl Fn(&Request) -> Vec<u8> + Send + Sync + 'static,
) -> ScriptedServer {
    ScriptedServer::start(move |request, base| {
        if request.path() == "/.well-known/agent-card.json" {
            json_body(&card(&format!("{base}/rpc"), streaming))
        } else {
            rpc(request)
        }
    })
    .await
}

fn client(url: &str, stream: Option<bool>, timeout: Duration, max: u64) -> A2aClient {
    A2aClient::new(
        url,
        vec![("Authorization".into(), "Bearer secret".into())],
        CallLimits {
            timeout,
            max_response_size: max,
        },
        RetryPolicy::default(),
        A2aSettings { stream },
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

fn ctx() -> CallContext<'static> {
    CallContext {
        test_case_id: "sc",
        turn_index: 0,
        deadline: None,
        turn_headers: None,
        system_prompt: None,
        llm_meter: None,
    }
}

async fn say(session: &mut Box<dyn Session>, text: &str) -> Turn {
    session.turn(TurnInput::User(text), &ctx()).await
}

async fn say_once(url: &str, stream: Option<bool>, text: &str) -> Turn {
    let client = client(url, stream, SHORT, 1024 * 1024);
    let mut session = client.open(&conversation());
    say(&mut session, text).await
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

#[tokio::test]
async fn builtin_travel_books_over_send_and_stream() {
    let server = builtin::serve("travel").await.unwrap();
    for stream in [None, Some(false)] {
        let client = client(&server.url(), stream, SHORT, 1024 * 1024);
        let card = client.prepare().await.unwrap().unwrap();
        assert_eq!(card["card"]["name"], "Travel desk");
        assert_eq!(card["stream"], stream.is_none());
        let mut session = client.open(&conversation());
        let ask = say(&mut session, "I want to fly to Paris").await;
        assert!(ask.fault.is_none(), "{ask:?}");
        assert_eq!(
            ask.reply.as_deref(),
            Some("What date would you like to fly to Paris?")
        );
        assert_eq!(
            ask.data.as_ref().unwrap()["status"]["state"],
            "input-required"
        );
        // The streamed answer has its first token timed; one JSON body has none.
        assert_eq!(ask.exchanges[0].ttft.is_some(), stream.is_none());
        let booked = say(&mut session, "March 3").await;
        assert!(booked.fault.is_none(), "{booked:?}");
        let reply = booked.reply.unwrap();
        assert!(reply.starts_with("Booked: Paris on March 3"), "{reply}");
        assert!(reply.contains("Price: 330 EUR"), "{reply}");
        let data = booked.data.unwrap();
        let artifact = &data["artifacts"][0];
        assert_eq!(artifact["name"], "itinerary");
        let parts = artifact["parts"].as_array().unwrap();
        let data_part = parts.iter().find(|p| p["kind"] == "data").unwrap();
        assert_eq!(data_part["data"]["price"], 330);
        // The booking is kept in the context the session continues.
        let recall = say(&mut session, "What did I book?").await;
        assert_eq!(
            recall.reply.as_deref(),
            Some("Your bookings: Paris on March 3.")
        );
        let failed = say(&mut session, "Fly me to Atlantis").await;
        let why = fault(&failed, FaultCategory::AgentError);
        assert!(
            why.contains("\"No flights to Atlantis: there is no such airport\""),
            "{why}"
        );
        assert!(session.fork().is_none(), "the context lives on the server");
    }
}

#[tokio::test]
async fn context_and_open_task_ids_continue_the_conversation() {
    let server = agent(false, |request| {
        let message = &request.body["params"]["message"];
        let result = if message["taskId"].is_string() {
            json!({"kind": "task", "id": "t1", "contextId": "ctx-9",
                   "status": {"state": "completed", "message": message_text("done")}})
        } else if message["contextId"].is_string() {
            json!({"kind": "task", "id": "t1", "contextId": "ctx-9",
                   "status": {"state": "input-required", "message": message_text("which?")}})
        } else {
            message_text("hi")
        };
        json_body(&json!({"jsonrpc": "2.0", "id": request.body["id"], "result": result}))
    })
    .await;
    let client = client(&server.url, None, SHORT, 1024 * 1024);
    let mut session = client.open(&conversation());
    assert_eq!(say(&mut session, "a").await.reply.as_deref(), Some("hi"));
    assert_eq!(
        say(&mut session, "b").await.reply.as_deref(),
        Some("which?")
    );
    assert_eq!(say(&mut session, "c").await.reply.as_deref(), Some("done"));
    assert_eq!(
        say(&mut session, "d").await.reply.as_deref(),
        Some("which?")
    );
    let calls = server.calls();
    let ids: Vec<(Value, Value)> = calls
        .iter()
        .map(|c| {
            let m = &c["params"]["message"];
            (m["contextId"].clone(), m["taskId"].clone())
        })
        .collect();
    assert_eq!(
        ids,
        vec![
            (Value::Null, Value::Null),
            (json!("ctx-9"), Value::Null),
            (json!("ctx-9"), json!("t1")),
            // The task completed: the next message starts a new one in the same context.
            (json!("ctx-9"), Value::Null),
        ]
    );
    assert!(
        calls
            .iter()
            .all(|c| c["method"] == "message/send" && c["jsonrpc"] == "2.0")
    );
    // The card and every call carry the agent's headers.
    for request in server.requests() {
        assert_eq!(
            request.header("authorization").as_deref(),
            Some("Bearer secret")
        );
    }
}

fn message_text(text: &str) -> Value {
    message(text)
}

#[tokio::test]
async fn an_older_server_publishes_agent_json_and_older_parts() {
    let server = ScriptedServer::start(|request, base| match request.path() {
        "/.well-known/agent-card.json" => http(404, "text/plain", "not found"),
        // No `url`: the agent URL is the endpoint.
        "/.well-known/agent.json" => json_body(&json!({"name": "old", "capabilities": {}})),
        _ => json_body(&json!({"jsonrpc": "2.0", "id": 1, "result": {
            "type": "message", "role": "agent", "messageId": "m",
            "parts": [{"type": "text", "text": format!("old server at {base}")}]}})),
    })
    .await;
    let turn = say_once(&server.url, None, "hi").await;
    assert!(turn.fault.is_none(), "{turn:?}");
    assert_eq!(turn.reply, Some(format!("old server at {}", server.url)));
    let paths: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.path().to_owned())
        .collect();
    assert_eq!(
        paths,
        [
            "/.well-known/agent-card.json",
            "/.well-known/agent.json",
            "/"
        ]
    );
}

#[tokio::test]
async fn stream_setting_overrides_the_card() {
    let server = agent(false, |request| {
        assert_eq!(request.body["method"], "message/stream");
        events(&[
            json!({"kind": "task", "id": "t", "contextId": "c", "status": {"state": "submitted"}}),
            json!({"kind": "status-update", "taskId": "t", "contextId": "c", "final": true,
                   "status": {"state": "completed", "message": message("streamed")}}),
        ])
    })
    .await;
    let turn = say_once(&server.url, Some(true), "hi").await;
    assert!(turn.fault.is_none(), "{turn:?}");
    assert_eq!(turn.reply.as_deref(), Some("streamed"));
    assert!(turn.exchanges[0].ttft.is_some());
}

#[tokio::test]
async fn a_stream_that_ends_before_its_final_update_is_incomplete() {
    let server = agent(true, |_| {
        events(&[
            json!({"kind": "task", "id": "t", "contextId": "c", "status": {"state": "submitted"}}),
            json!({"kind": "artifact-update", "taskId": "t", "contextId": "c",
                   "artifact": {"artifactId": "a", "parts": [{"kind": "text", "text": "half"}]}}),
        ])
    })
    .await;
    let turn = say_once(&server.url, None, "hi").await;
    fault(&turn, FaultCategory::Incomplete);
    assert!(turn.reply.is_none());
    // What arrived is kept.
    assert_eq!(
        turn.data.unwrap()["artifacts"][0]["parts"][0]["text"],
        "half"
    );
}

/// A terminal status marked `"final": false` says more events follow (an artifact's last
/// chunk after `completed`, as some servers stream them): the reply is everything up to the
/// `final` event, or the stream's end, not the text before the status.
#[tokio::test]
async fn a_terminal_status_not_marked_final_reads_on_to_the_final_event() {
    let task = |state: &str| json!({"kind": "task", "id": "t", "contextId": "c", "status": {"state": state}});
    let chunk = |text: &str, append: bool| {
        json!({"kind": "artifact-update", "taskId": "t", "contextId": "c", "append": append,
               "artifact": {"artifactId": "a1", "parts": [{"kind": "text", "text": text}]}})
    };
    let status = |last: bool| {
        json!({"kind": "status-update", "taskId": "t", "contextId": "c", "final": last,
               "status": {"state": "completed"}})
    };
    // Up to a `final` update, and up to the stream's end without one.
    for with_final in [true, false] {
        let server = agent(true, move |_| {
            let mut results = vec![
                task("submitted"),
                task("working"),
                chunk("History: o", false),
                status(false),
                chunk("ne", true),
            ];
            if with_final {
                results.push(status(true));
            }
            events(&results)
        })
        .await;
        let turn = say_once(&server.url, None, "hi").await;
        assert!(turn.fault.is_none(), "{with_final}: {:?}", turn.fault);
        // Appended parts are parts of their own, one per line (docs/wire.md).
        assert_eq!(
            turn.reply.as_deref(),
            Some("History: o\nne"),
            "{with_final}"
        );
    }
}

#[tokio::test]
async fn malformed_answers_are_faults_with_their_category() {
    let cases: Vec<(Vec<u8>, FaultCategory, &str)> = vec![
        (http(200, "application/json", "{not json"), FaultCategory::InvalidJson, "not JSON"),
        (
            json_body(&json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32001, "message": "Task not found"}})),
            FaultCategory::AgentError,
            "-32001",
        ),
        (json_body(&json!({"jsonrpc": "2.0", "id": 1})), FaultCategory::Protocol, "neither"),
        (
            json_body(&json!({"jsonrpc": "2.0", "id": 1, "result": {"kind": "task", "id": "t"}})),
            FaultCategory::Protocol,
            "status",
        ),
        (
            json_body(&json!({"jsonrpc": "2.0", "id": 1, "result": {"kind": "task", "id": "t",
                "status": {"state": "auth-required"}}})),
            FaultCategory::AgentError,
            "auth-required",
        ),
        (
            json_body(&json!({"jsonrpc": "2.0", "id": 1, "result": {"kind": "task", "id": "t",
                "status": {"state": "working"}}})),
            FaultCategory::Incomplete,
            "not finished",
        ),
        (
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/event-stream\r\n\r\ndata: {oops\n\n".to_vec(),
            FaultCategory::InvalidJson,
            "event 1",
        ),
        (http(503, "text/plain", "down"), FaultCategory::Http5xx, "503"),
        (
            json_body(&json!({"jsonrpc": "2.0", "id": "another-request", "result": message("not yours")})),
            FaultCategory::Protocol,
            "answers request id \"another-request\"",
        ),
    ];
    for (answer, category, needle) in cases {
        let streamed = answer.windows(17).any(|w| w == b"text/event-stream");
        let server = agent(streamed, move |_| answer.clone()).await;
        let turn = say_once(&server.url, None, "hi").await;
        let why = fault(&turn, category);
        assert!(why.contains(needle), "{category:?}: {why}");
    }
}

/// A card served here names a misbehaving server as the JSON-RPC endpoint.
async fn misbehaving(behavior: Behavior) -> (ScriptedServer, MisbehavingServer) {
    let bad = MisbehavingServer::start(behavior).await;
    let rpc = bad.url();
    let card_server = ScriptedServer::start(move |_, _| json_body(&card(&rpc, false))).await;
    (card_server, bad)
}

#[tokio::test]
async fn transport_failures_of_the_endpoint_are_faults() {
    let cases = [
        (Behavior::Reset, FaultCategory::Transport, 16 * 1024),
        (Behavior::Truncated, FaultCategory::Transport, 16 * 1024),
        (
            Behavior::SlowDrip {
                interval: Duration::from_millis(200),
            },
            FaultCategory::Timeout,
            1024 * 1024,
        ),
        (
            Behavior::Huge {
                bytes: 64 * 1024,
                content_length: false,
            },
            FaultCategory::TooLarge,
            16 * 1024,
        ),
    ];
    for (behavior, category, max) in cases {
        let (cards, _bad) = misbehaving(behavior.clone()).await;
        let client = client(&cards.url, None, Duration::from_millis(600), max);
        let mut session = client.open(&conversation());
        let turn = say(&mut session, "hi").await;
        fault(&turn, category);
    }
}

#[tokio::test]
async fn an_unreadable_card_fails_prepare() {
    let server = ScriptedServer::start(|_, _| http(200, "application/json", "[1, 2]")).await;
    let unreadable = client(&server.url, None, SHORT, 1024);
    let fault = unreadable.prepare().await.unwrap_err();
    assert_eq!(fault.category, FaultCategory::Protocol, "{fault:?}");
    let missing = ScriptedServer::start(|_, _| http(404, "text/plain", "no")).await;
    let fault = client(&missing.url, None, SHORT, 1024)
        .prepare()
        .await
        .unwrap_err();
    assert_eq!(fault.category, FaultCategory::Http4xx, "{fault:?}");
    assert!(fault.message.contains("agent.json"), "{}", fault.message);
    // Neither path there: both said, the current one first.
    assert!(
        fault.message.contains("agent-card.json: HTTP 404"),
        "{}",
        fault.message
    );
}

/// Only a card that is not there sends the client to the older `agent.json`: a 401 (a
/// wrong token) on `agent-card.json` is the fault, not hidden behind the older path's 404.
#[tokio::test]
async fn a_refused_card_is_the_fault_not_the_older_paths_404() {
    let server = ScriptedServer::start(|request, _| match request.path() {
        "/.well-known/agent-card.json" => http(401, "text/plain", "bad token"),
        _ => http(404, "text/plain", "not found"),
    })
    .await;
    let fault = client(&server.url, None, SHORT, 1024)
        .prepare()
        .await
        .unwrap_err();
    assert_eq!(fault.category, FaultCategory::Http4xx, "{fault:?}");
    assert!(fault.message.contains("HTTP 401"), "{}", fault.message);
    // Not "404" alone: the message names the URL, and its ephemeral port may hold those digits.
    assert!(!fault.message.contains("HTTP 404"), "{}", fault.message);
    assert!(!fault.message.contains("agent.json"), "{}", fault.message);
    let paths: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.path().to_owned())
        .collect();
    assert_eq!(paths, ["/.well-known/agent-card.json"]);
}

/// A v1.0 server (what `a2a-sdk` 1.x serves by default) answers only its own method names,
/// with the `A2A-Version` header, and sends results wrapped by kind; the turn's structured
/// data is written as a v0.3 server's would be (states, roles, parts tagged `kind`, file parts
/// with a `file` object).
#[tokio::test]
async fn a_v1_server_gets_v1_requests() {
    let server = ScriptedServer::start(|request, base| {
        if request.path() == "/.well-known/agent-card.json" {
            return json_body(&json!({"name": "v1", "capabilities": {"streaming": false},
                "supportedInterfaces": [{"url": format!("{base}/"), "protocolBinding": "JSONRPC",
                                         "protocolVersion": "1.0"}]}));
        }
        let body = &request.body;
        if body["method"] != "SendMessage"
            || request.header("a2a-version").as_deref() != Some("1.0")
        {
            return json_body(&json!({"jsonrpc": "2.0", "id": body["id"],
                "error": {"code": -32601, "message": "Method not found"}}));
        }
        let message = &body["params"]["message"];
        assert_eq!(message["role"], "ROLE_USER");
        let state = if message["taskId"].is_string() {
            "TASK_STATE_COMPLETED"
        } else {
            "TASK_STATE_INPUT_REQUIRED"
        };
        json_body(
            &json!({"jsonrpc": "2.0", "id": body["id"], "result": {"task": {
            "id": "t1", "contextId": "c1",
            "status": {"state": state, "message": {"messageId": "m", "role": "ROLE_AGENT",
                       "parts": [{"text": state}]}},
            "artifacts": [{"artifactId": "a", "parts": [{"data": {"price": 5}},
                {"url": "https://files/ticket.pdf", "mediaType": "application/pdf",
                 "filename": "ticket.pdf"}]}]}}}),
        )
    })
    .await;
    let client = client(&server.url, None, SHORT, 1024 * 1024);
    let card = client.prepare().await.unwrap().unwrap();
    assert_eq!(card["protocol_version"], "1.0");
    let mut session = client.open(&conversation());
    let ask = say(&mut session, "fly").await;
    assert!(ask.fault.is_none(), "{ask:?}");
    assert_eq!(
        ask.reply.as_deref(),
        Some("TASK_STATE_INPUT_REQUIRED"),
        "{ask:?}"
    );
    let done = say(&mut session, "May 1").await;
    assert!(done.fault.is_none(), "{done:?}");
    let data = done.data.unwrap();
    assert_eq!(data["status"]["state"], "completed");
    assert_eq!(data["artifacts"][0]["parts"][0]["kind"], "data");
    assert_eq!(data["artifacts"][0]["parts"][0]["data"]["price"], 5);
    assert_eq!(data["status"]["message"]["role"], "agent");
    assert_eq!(data["status"]["message"]["kind"], "message");
    assert_eq!(
        data["artifacts"][0]["parts"][1],
        json!({"kind": "file", "file": {"uri": "https://files/ticket.pdf",
            "mimeType": "application/pdf", "name": "ticket.pdf"}})
    );
}
