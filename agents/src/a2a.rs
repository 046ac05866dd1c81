//! `builtin="travel"`: a deterministic flight-booking agent speaking Agent2Agent (JSON-RPC
//! 2.0 over HTTP), for the example suites and tests.
//!
//! It behaves like an `a2a-sdk` server on the wire: the agent card at
//! `/.well-known/agent-card.json` (and the older `/.well-known/agent.json`) names the
//! JSON-RPC endpoint `/rpc` (an absolute URL built from the request's `Host`) and says it
//! streams; `message/send` answers one Task or Message, `message/stream` answers server-sent
//! events, each a JSON-RPC response: the Task (`submitted`), a `working` status update,
//! artifact updates (the itinerary's text in two chunks, `append` then `lastChunk`), and a
//! final status update.
//!
//! The conversation lives on the server, keyed by `contextId` (the agent makes one up when a
//! message has none), so replaying a prefix in a fresh context is observable.
//!
//! What it answers:
//! - `fly to CITY` / `flight to CITY` / `book … to CITY`: a task in `input-required` asking
//!   for the date ("What date would you like to fly to Paris?");
//! - the next message on that task (its `taskId`): the date; the task completes with the
//!   status message `Booked: Paris on March 3, confirmation TRV-…` and an `itinerary`
//!   artifact: a text part and a data part `{"destination", "date", "price", "currency",
//!   "confirmation"}`;
//! - a destination of `Atlantis`: the task fails with the status message `No flights to
//!   Atlantis: there is no such airport`;
//! - `my bookings` / `what did I book`: a Message listing the bookings of this context;
//! - anything else: a Message greeting.
//!
//! Input errors are JSON-RPC errors, as an `a2a-sdk` server answers them: a body that is
//! not JSON `-32700`, a request without a message `-32602`, an unknown method `-32601`, a
//! `taskId` the server does not know `-32001` (task not found).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, HOST};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use regex::Regex;
use serde_json::{Value, json};

/// Where the agent's JSON-RPC endpoint is.
pub const RPC_PATH: &str = "/rpc";
/// The destination that makes a booking fail.
pub const FAIL_DESTINATION: &str = "Atlantis";
/// Pause between streamed events, so time to first token and latency differ.
const EVENT_GAP: Duration = Duration::from_millis(1);
/// Contexts kept; past this the server forgets them all (a long run opens many).
const MAX_CONTEXTS: usize = 10_000;

static DESTINATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:fly|flight|flights|book|trip|travel)\b.*?\bto\s+([a-z][a-z'\-]*(?:\s+[a-z][a-z'\-]*)?)")
        .expect("the destination pattern is a valid regex")
});

/// Numbers ids across the server.
static IDS: AtomicU64 = AtomicU64::new(0);

#[derive(Default)]
struct Context {
    /// `taskId` → destination of a booking waiting for its date.
    pending: HashMap<String, String>,
    /// Bookings made, as "CITY on DATE".
    bookings: Vec<String>,
}

type Shared = Arc<Mutex<HashMap<String, Context>>>;

pub fn router() -> Router {
    Router::new()
        .route("/.well-known/agent-card.json", get(card))
        .route("/.well-known/agent.json", get(card))
        .route(RPC_PATH, post(rpc))
        .with_state(Shared::default())
}

async fn card(headers: HeaderMap) -> Response {
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    let card = json!({
        "name": "Travel desk",
        "description": "Books flights: asks for the date, answers with an itinerary.",
        "url": format!("http://{host}{RPC_PATH}"),
        "version": "1.0.0",
        "protocolVersion": "0.3.0",
        "preferredTransport": "JSONRPC",
        "capabilities": {"streaming": true},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": [{"id": "book-flight", "name": "Book a flight",
                     "description": "Books a flight to a city on a date", "tags": ["travel"]}],
    });
    ([(CONTENT_TYPE, "application/json")], card.to_string()).into_response()
}

fn next_id(prefix: &str) -> String {
    format!("{prefix}-{}", IDS.fetch_add(1, Ordering::Relaxed) + 1)
}

fn json_response(value: &Value) -> Response {
    ([(CONTENT_TYPE, "application/json")], value.to_string()).into_response()
}

fn rpc_error(id: &Value, code: i64, message: &str) -> Response {
    json_response(&json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}))
}

async fn rpc(State(contexts): State<Shared>, body: Bytes) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return rpc_error(&Value::Null, -32700, &format!("Parse error: {e}")),
    };
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let stream = match request.get("method").and_then(Value::as_str) {
        Some("message/send") => false,
        Some("message/stream") => true,
        _ => return rpc_error(&id, -32601, "Method not found"),
    };
    let Some(message) = request.get("params").and_then(|p| p.get("message")) else {
        return rpc_error(&id, -32602, "Invalid params: no message");
    };
    let text: String = message
        .get("parts")
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter(|p| {
                    p.get("kind")
                        .or_else(|| p.get("type"))
                        .and_then(Value::as_str)
                        == Some("text")
                })
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let context_id = message
        .get("contextId")
        .and_then(Value::as_str)
        .map_or_else(|| next_id("ctx"), str::to_owned);
    let task_id = message.get("taskId").and_then(Value::as_str);
    let answer = {
        let mut all = contexts.lock().unwrap_or_else(PoisonError::into_inner);
        if !all.contains_key(&context_id) && all.len() >= MAX_CONTEXTS {
            all.clear();
        }
        let context = all.entry(context_id.clone()).or_default();
        match decide(&text, task_id, context) {
            Ok(answer) => answer,
            Err(task) => return rpc_error(&id, -32001, &format!("Task not found: {task}")),
        }
    };
    let events = answer.events(&context_id);
    if !stream {
        let result = answer.snapshot(&context_id);
        return json_response(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }
    let frames = futures::stream::unfold(
        (events.into_iter(), id, true),
        |(mut events, id, first)| async move {
            let result = events.next()?;
            if !first {
                tokio::time::sleep(EVENT_GAP).await;
            }
            let envelope = json!({"jsonrpc": "2.0", "id": id, "result": result});
            let frame = Bytes::from(format!("data: {envelope}\n\n"));
            Some((Ok::<_, Infallible>(frame), (events, id, false)))
        },
    );
    Response::builder()
        .header(CONTENT_TYPE, "text/event-stream")
        .header(CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(frames))
        .unwrap_or_else(|_| json_response(&Value::Null))
}

/// What the agent does with one message.
enum Answer {
    /// A plain Message.
    Say(String),
    /// A task asking the user for something.
    Ask {
        task: String,
        question: String,
    },
    /// A booking made: the status message and the itinerary's text and data.
    Booked {
        task: String,
        status: String,
        itinerary: Vec<String>,
        data: Value,
    },
    Failed {
        task: String,
        status: String,
    },
}

fn decide(text: &str, task_id: Option<&str>, context: &mut Context) -> Result<Answer, String> {
    if let Some(task) = task_id {
        let Some(destination) = context.pending.remove(task) else {
            return Err(task.to_owned());
        };
        let date = text.trim().trim_end_matches(['.', '!']).to_owned();
        let price = 180 + destination.len() as u64 * 30;
        let confirmation = format!("TRV-{}", 1000 + context.bookings.len());
        context.bookings.push(format!("{destination} on {date}"));
        return Ok(Answer::Booked {
            task: task.to_owned(),
            status: format!("Booked: {destination} on {date}, confirmation {confirmation}"),
            itinerary: vec![
                format!("Flight to {destination} on {date}. "),
                format!("Price: {price} EUR."),
            ],
            data: json!({"destination": destination, "date": date, "price": price,
                         "currency": "EUR", "confirmation": confirmation}),
        });
    }
    let lower = text.to_lowercase();
    if lower.contains("my bookings") || lower.contains("what did i book") {
        return Ok(Answer::Say(if context.bookings.is_empty() {
            "You have no bookings yet.".to_owned()
        } else {
            format!("Your bookings: {}.", context.bookings.join("; "))
        }));
    }
    if let Some(caps) = DESTINATION.captures(text) {
        let destination = title_case(caps.get(1).map_or("", |m| m.as_str()));
        let task = next_id("task");
        if destination.eq_ignore_ascii_case(FAIL_DESTINATION) {
            return Ok(Answer::Failed {
                task,
                status: format!("No flights to {destination}: there is no such airport"),
            });
        }
        context.pending.insert(task.clone(), destination.clone());
        return Ok(Answer::Ask {
            task,
            question: format!("What date would you like to fly to {destination}?"),
        });
    }
    Ok(Answer::Say(
        "Hello! I book flights: tell me where you want to fly to.".to_owned(),
    ))
}

fn title_case(text: &str) -> String {
    text.split_whitespace()
        .map(|word| {
            let mut chars = word.chars();
            match chars.next() {
                Some(first) => first
                    .to_uppercase()
                    .chain(chars.flat_map(char::to_lowercase))
                    .collect(),
                None => String::new(),
            }
        })
        .collect::<Vec<String>>()
        .join(" ")
}

fn agent_message(context_id: &str, task: Option<&str>, text: &str) -> Value {
    let mut message = json!({"kind": "message", "role": "agent", "messageId": next_id("msg"),
        "contextId": context_id, "parts": [{"kind": "text", "text": text}]});
    if let Some(task) = task {
        message["taskId"] = json!(task);
    }
    message
}

impl Answer {
    /// The one result `message/send` answers with.
    fn snapshot(&self, context_id: &str) -> Value {
        match self {
            Answer::Say(text) => agent_message(context_id, None, text),
            Answer::Ask { task, question } => task_object(
                task,
                context_id,
                "input-required",
                Some(agent_message(context_id, Some(task), question)),
                Vec::new(),
            ),
            Answer::Failed { task, status } => task_object(
                task,
                context_id,
                "failed",
                Some(agent_message(context_id, Some(task), status)),
                Vec::new(),
            ),
            Answer::Booked {
                task,
                status,
                itinerary,
                data,
            } => task_object(
                task,
                context_id,
                "completed",
                Some(agent_message(context_id, Some(task), status)),
                vec![
                    json!({"artifactId": format!("{task}-itinerary"), "name": "itinerary",
                    "parts": [{"kind": "text", "text": itinerary.concat()},
                              {"kind": "data", "data": data}]}),
                ],
            ),
        }
    }

    /// The results `message/stream` sends, in order.
    fn events(&self, context_id: &str) -> Vec<Value> {
        let (task, state, status, chunks) = match self {
            Answer::Say(text) => return vec![agent_message(context_id, None, text)],
            Answer::Ask { task, question } => (task, "input-required", question, Vec::new()),
            Answer::Failed { task, status } => (task, "failed", status, Vec::new()),
            Answer::Booked {
                task,
                status,
                itinerary,
                data,
            } => {
                let id = format!("{task}-itinerary");
                let mut chunks: Vec<Value> = itinerary
                    .iter()
                    .enumerate()
                    .map(|(i, text)| {
                        json!({"kind": "artifact-update", "taskId": task, "contextId": context_id,
                            "append": i > 0, "lastChunk": false,
                            "artifact": {"artifactId": id, "name": "itinerary",
                                         "parts": [{"kind": "text", "text": text}]}})
                    })
                    .collect();
                chunks.push(json!({"kind": "artifact-update", "taskId": task,
                    "contextId": context_id, "append": true, "lastChunk": true,
                    "artifact": {"artifactId": id, "parts": [{"kind": "data", "data": data}]}}));
                (task, "completed", status, chunks)
            }
        };
        let mut events = vec![
            task_object(task, context_id, "submitted", None, Vec::new()),
            json!({"kind": "status-update", "taskId": task, "contextId": context_id,
                   "final": false, "status": {"state": "working"}}),
        ];
        events.extend(chunks);
        events.push(
            json!({"kind": "status-update", "taskId": task, "contextId": context_id,
            "final": true, "status": {"state": state,
            "message": agent_message(context_id, Some(task), status)}}),
        );
        events
    }
}

fn task_object(
    task: &str,
    context_id: &str,
    state: &str,
    message: Option<Value>,
    artifacts: Vec<Value>,
) -> Value {
    let mut status = json!({"state": state});
    if let Some(message) = message {
        status["message"] = message;
    }
    let mut object = json!({"kind": "task", "id": task, "contextId": context_id,
        "status": status});
    if !artifacts.is_empty() {
        object["artifacts"] = Value::Array(artifacts);
    }
    object
}
