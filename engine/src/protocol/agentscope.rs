//! The AgentScope runtime protocol: `POST {url}` with the turn's new input and a
//! `session_id`, answered with server-sent events
//! (docs/wire.md, "AgentScope").
//!
//! The conversation lives on the server, keyed by `session_id`: each request carries only the
//! new user message, every session gets an id of its own (`trellis-{run}-{n}`, so concurrent
//! conversations and branches never collide), and a session cannot be forked (the executor
//! replays the prefix in a fresh session per branch).
//!
//! The answer is assembled by [`Assembler`] from events of either shape real servers send
//! (with or without message `in_progress` and content `completed`): text deltas are appended
//! by `msg_id` and `index`, everything else (data, images, non-delta text) is a snapshot that
//! replaces what the slot held (a data content marked `delta: true` extends it key by key, as
//! the runtime's own message model does), and the completed response's `output[]` is merged
//! last as the authoritative snapshot. Usage comes from the completed response, else from the
//! messages that report it. `plugin_call` / `function_call` / `mcp_call` / `component_call`
//! messages and their `*_output` become tool calls paired with their results (arguments kept
//! as the JSON string sent; results as the output string sent, a JSON list of blocks).
//! Heartbeats and unknown events are ignored.
//!
//! Faults: an error frame (`data: {"error": …}`, including the session collision `Task … is
//! already in RUNNING state.`) and a response that ends `failed` / `rejected` / `canceled`
//! are `agent_error`; a stream that closes (or sends `[DONE]`) before the completed
//! response ends the answer when every message it started has completed (real servers end
//! by closing the connection too), else it is `incomplete`;
//! an event that is not JSON is `invalid_json`; JSON of the wrong shape is `protocol`. The
//! client calls the configured URL and nothing else (no `/health`, never `/shutdown`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use indexmap::IndexMap;
use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde::Serialize;
use serde_json::{Map, Value};

use super::pairing::{ToolResult, pair};
use super::{
    AgentProtocol, CallContext, ChatMessage, Conversation, Exchange, Session, ToolCall,
    ToolCallFunction, Turn, TurnInput, Usage,
};
use crate::record::{Fault, FaultCategory, ToolCallRecord};
use crate::transport::http::{
    CallLimits, EndpointError, HttpTransport, RetryPolicy, agent_url, with_agent_headers,
    with_retries,
};
use crate::transport::quote::{error_text, kind_of, preview};
use crate::transport::sse::{self, Opened, StreamLimits};

/// What a real server answers when a session already has a request in flight.
const COLLISION: &str = "is already in RUNNING state";

/// Numbers the sessions of the process: two agents of a run may point at one server, and
/// their sessions must not meet there.
static SESSIONS: AtomicU64 = AtomicU64::new(0);

/// What tells this process's sessions from those of an earlier process of the same run: a
/// `--resume` keeps the run id and numbers its sessions from 1 again, and the server still
/// holds the killed attempt's conversations under those ids.
fn process_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        format!("{:x}{:x}", std::process::id(), nanos)
    })
}

/// An AgentScope agent could not be configured.
pub type AgentScopeError = EndpointError;

/// A client for one AgentScope agent: opens a server session per conversation.
#[derive(Debug)]
pub struct AgentScopeClient {
    endpoint: Arc<Endpoint>,
}

/// Where and how to call the agent; shared by every session.
#[derive(Debug)]
struct Endpoint {
    url: Url,
    headers: HeaderMap,
    limits: CallLimits,
    retry: RetryPolicy,
    /// `stream`: ask for server-sent events (else one JSON body).
    stream: bool,
    transport: HttpTransport,
}

impl AgentScopeClient {
    /// `headers` are the agent's rendered `header` nodes; they override the content type and
    /// accept headers the client sends by default.
    pub fn new(
        url: &str,
        headers: Vec<(String, String)>,
        limits: CallLimits,
        retry: RetryPolicy,
        stream: bool,
        transport: HttpTransport,
    ) -> Result<Self, AgentScopeError> {
        let parsed = agent_url(url)?;
        let mut map = HeaderMap::with_capacity(headers.len() + 2);
        map.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        map.insert(
            ACCEPT,
            HeaderValue::from_static(if stream {
                "text/event-stream"
            } else {
                "application/json"
            }),
        );
        let map = with_agent_headers(map, &headers)?;
        Ok(AgentScopeClient {
            endpoint: Arc::new(Endpoint {
                url: parsed,
                headers: map,
                limits,
                retry,
                stream,
                transport,
            }),
        })
    }

    pub fn url(&self) -> &Url {
        &self.endpoint.url
    }
}

impl Endpoint {
    /// Sends one user message on `session_id` and assembles the answer.
    async fn process(&self, session_id: &str, text: &str, ctx: &CallContext<'_>) -> Turn {
        let mut exchange = Exchange {
            label: format!("POST {}", self.url.path()).into(),
            ..Default::default()
        };
        let request = Request {
            input: [InputMessage {
                role: "user",
                kind: "message",
                content: [TextContent { kind: "text", text }],
            }],
            stream: self.stream,
            session_id,
        };
        let body = match serde_json::to_vec(&request) {
            Ok(body) => Bytes::from(body),
            Err(e) => {
                return Turn::failed(Fault::new(
                    FaultCategory::Internal,
                    format!("could not encode the request: {e}"),
                ));
            }
        };
        let limits = StreamLimits::from(self.limits);
        let headers = ctx.headers(&self.headers);
        let headers = &*headers;
        let attempted = with_retries(self.retry, self.limits.timeout, ctx.deadline, |budget| {
            let body = body.clone();
            async move {
                sse::open(&self.transport, &self.url, headers, body, limits, budget)
                    .await
                    .and_then(Opened::or_rate_limited)
            }
        })
        .await;
        exchange.attempts = attempted.attempts;
        let mut assembler = Assembler::new(session_id);
        let outcome = match attempted.result {
            Err(fault) => Err(fault),
            // Waited out in the attempts; what is left of it is that fault.
            Ok(Opened::RateLimited(asked)) => {
                Err(crate::transport::http::rate_limited_fault(asked))
            }
            Ok(Opened::Json(body)) => match serde_json::from_slice::<Value>(&body) {
                Ok(value) => assembler.apply(value).and_then(|()| {
                    if assembler.is_done() {
                        Ok(())
                    } else {
                        Err(Fault::new(
                            FaultCategory::Protocol,
                            format!(
                                "the JSON answer is not a completed response (status {})",
                                assembler.status.as_deref().unwrap_or("missing")
                            ),
                        ))
                    }
                }),
                Err(e) => Err(Fault::new(
                    FaultCategory::InvalidJson,
                    format!("the response body is not JSON ({e}): {}", preview(&body)),
                )),
            },
            Ok(Opened::Events(mut stream)) => {
                stream.set_deadline(ctx.deadline);
                let mut first_content = None;
                let outcome = read_events(&mut stream, &mut assembler, &mut first_content).await;
                // An answer without content (an error frame, a failed run, only the
                // response's `created`) had no first token: no time to it, rather than the
                // time to its first event, which a `ttft` check would have passed.
                exchange.ttft = first_content;
                // The attempt lasted until the stream was over (it is never retried: the
                // agent was already at work).
                if let Some(last) = exchange.attempts.last_mut() {
                    last.latency = stream.started().elapsed();
                }
                outcome
            }
        };
        // A fault in the answer the last attempt received (a stream that broke, JSON the
        // client cannot use) is that attempt's own.
        if let (Err(fault), Some(last)) = (&outcome, exchange.attempts.last_mut())
            && last.fault.is_none()
        {
            last.fault = Some(fault.clone());
        }
        let assembled = assembler.finish();
        exchange.usage = assembled.usage;
        // A completed answer with nothing a check of the reply could read is the agent's
        // defect, not an answer (as on Connexity): the turn keeps its messages and calls.
        let outcome = outcome.and_then(|()| match unanswered(&assembled) {
            Some(why) => Err(Fault::new(FaultCategory::Protocol, why)),
            None => Ok(()),
        });
        Turn {
            exchanges: vec![exchange],
            messages: assembled.messages,
            reply: if outcome.is_ok() {
                assembled.reply
            } else {
                None
            },
            tool_calls: assembled.tool_calls,
            model: None,
            provider: None,
            fault: outcome.err(),
            branch: None,
            reused: false,
            spans_for_reuse: None,
            llm: Vec::new(),
            data: None,
            metadata: None,
            unsent: false,
        }
    }
}

/// Why a completed answer has no reply, if it has none: it ends with tool calls or their
/// results and no assistant text after them, or it has no assistant text at all.
fn unanswered(assembled: &Assembled) -> Option<&'static str> {
    if assembled.reply.is_some() {
        return None;
    }
    Some(if assembled.tool_calls.is_empty() {
        "the answer has no assistant message with text"
    } else {
        "the answer ends with tool calls or their results and no assistant text after them \
         (the text written before them is not the answer)"
    })
}

/// Reads events until the response is final. `first_content` is set to the time from the
/// request to the first content event (a text delta, a tool call's data): the agent's first
/// token, where the first event (response `created`) only says the server took the request.
async fn read_events(
    stream: &mut sse::EventStream,
    assembler: &mut Assembler,
    first_content: &mut Option<Duration>,
) -> Result<(), Fault> {
    while !assembler.is_done() {
        let Some(event) = stream.next().await? else {
            return match assembler.cut_short() {
                Some(awaited) => Err(stream.ended_early(&awaited)),
                None => Ok(()),
            };
        };
        let data = event.data.trim();
        if data.is_empty() {
            continue;
        }
        if data == "[DONE]" {
            return match assembler.cut_short() {
                Some(awaited) => {
                    Err(stream.ended_early(&format!("{awaited} (`[DONE]` came first)")))
                }
                None => Ok(()),
            };
        }
        let value: Value = serde_json::from_str(data).map_err(|e| {
            Fault::new(
                FaultCategory::InvalidJson,
                format!(
                    "event {} is not JSON ({e}): {}",
                    stream.count(),
                    preview(data.as_bytes())
                ),
            )
        })?;
        if value.get("type").and_then(Value::as_str) == Some("heartbeat")
            || assembler.repeats_its_status(&value)
        {
            stream.keepalive();
        }
        if first_content.is_none() && value.get("object").and_then(Value::as_str) == Some("content")
        {
            *first_content = Some(stream.started().elapsed());
        }
        assembler.apply(value)?;
    }
    Ok(())
}

#[derive(Serialize)]
struct Request<'a> {
    input: [InputMessage<'a>; 1],
    stream: bool,
    session_id: &'a str,
}

#[derive(Serialize)]
struct InputMessage<'a> {
    role: &'static str,
    #[serde(rename = "type")]
    kind: &'static str,
    content: [TextContent<'a>; 1],
}

#[derive(Serialize)]
struct TextContent<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

impl AgentProtocol for AgentScopeClient {
    fn open(&self, conversation: &Conversation<'_>) -> Box<dyn Session> {
        let n = SESSIONS.fetch_add(1, Ordering::Relaxed) + 1;
        Box::new(AgentScopeSession {
            endpoint: Arc::clone(&self.endpoint),
            session_id: format!("trellis-{}-{}-{n}", conversation.run_id, process_tag()),
        })
    }
}

/// One AgentScope conversation: a session on the server.
struct AgentScopeSession {
    endpoint: Arc<Endpoint>,
    session_id: String,
}

impl Session for AgentScopeSession {
    fn turn<'a>(
        &'a mut self,
        input: TurnInput<'a>,
        ctx: &'a CallContext<'a>,
    ) -> BoxFuture<'a, Turn> {
        Box::pin(async move {
            match input {
                TurnInput::User(text) => self.endpoint.process(&self.session_id, text, ctx).await,
                TurnInput::Opening
                | TurnInput::Call { .. }
                | TurnInput::Human { .. }
                | TurnInput::Branch { .. } => {
                    let what = match input {
                        TurnInput::Opening => "speak first (`first-turn \"agent\"`)",
                        TurnInput::Call { .. } => "take a function `call`",
                        TurnInput::Branch { .. } => "continue a branch it asked for",
                        _ => "take a human's answer",
                    };
                    Turn::failed(Fault::new(
                        FaultCategory::Protocol,
                        format!("an AgentScope agent answers user messages; it cannot {what}"),
                    ))
                }
            }
        })
    }

    /// The conversation is server state: it cannot be copied.
    fn fork(&self) -> Option<Box<dyn Session>> {
        None
    }
}

/// What one answer amounted to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Assembled {
    /// The agent's messages, in the order they started.
    pub messages: Vec<ChatMessage>,
    /// The text of the last assistant `message` with text, if no tool call or result came
    /// after it.
    pub reply: Option<String>,
    pub tool_calls: Vec<ToolCallRecord>,
    pub usage: Option<Usage>,
}

/// Builds one answer from its events, in either shape real servers send.
#[derive(Debug)]
pub struct Assembler {
    session_id: String,
    /// By message id, in the order they started.
    messages: IndexMap<String, PendingMessage>,
    /// The response's last status.
    status: Option<String>,
    usage: Option<Usage>,
    done: bool,
}

#[derive(Debug, Default)]
struct PendingMessage {
    kind: String,
    role: Option<String>,
    /// Content slots by `index`.
    contents: BTreeMap<u64, Part>,
    /// Tokens the message reports, for responses that report none themselves.
    usage: Option<Usage>,
    /// A message event said `completed`: its content is whole.
    completed: bool,
}

#[derive(Debug)]
enum Part {
    Text(String),
    /// Data and image contents, and kinds this client does not know, kept as sent.
    Other(Value),
}

impl Assembler {
    pub fn new(session_id: &str) -> Self {
        Assembler {
            session_id: session_id.to_owned(),
            messages: IndexMap::new(),
            status: None,
            usage: None,
            done: false,
        }
    }

    /// Whether the response reached its final status.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Why an answer whose stream closed here, without the completed response, was cut
    /// short; `None` when it can end here. Real servers end with the completed response
    /// *or by closing the connection* (docs/wire.md, "AgentScope"), so a close after every
    /// message completed is the end; one with nothing received, or a message still being
    /// written, is a stream cut short.
    fn cut_short(&self) -> Option<String> {
        if self.messages.is_empty() {
            return Some("the response completed".to_owned());
        }
        self.messages
            .iter()
            .find(|(_, m)| !m.completed)
            .map(|(id, _)| match id.as_str() {
                "" => "the message in progress completed".to_owned(),
                id => format!("message `{id}` completed"),
            })
    }

    /// Whether `event` is a response event that says only the status the response already
    /// has (`in_progress` again): it moves nothing, so a stuck server sending it every
    /// second does not hold the idle timeout off.
    pub fn repeats_its_status(&self, event: &Value) -> bool {
        event.get("object").and_then(Value::as_str) == Some("response")
            && self.status.is_some()
            && event.get("status").and_then(Value::as_str) == self.status.as_deref()
            && event.get("output").is_none_or(Value::is_null)
            && event.get("error").is_none_or(Value::is_null)
    }

    /// Applies one event. A fault means the answer is over: the agent reported an error,
    /// or the event breaks the protocol.
    pub fn apply(&mut self, event: Value) -> Result<(), Fault> {
        let Value::Object(mut event) = event else {
            return Err(Fault::new(
                FaultCategory::Protocol,
                format!("an event is {}, expected an object", kind_of(&event)),
            ));
        };
        if !event.contains_key("object")
            && let Some(error) = event.get("error").filter(|e| !e.is_null())
        {
            return Err(self.error_frame(error));
        }
        match event.get("object").and_then(Value::as_str) {
            Some("response") => self.apply_response(&mut event),
            Some("message") => {
                self.apply_message(&mut event);
                Ok(())
            }
            Some("content") => {
                let id = str_field(&event, "msg_id").unwrap_or_default().to_owned();
                let slot = self.message(&id);
                slot.apply_content(&mut event, None);
                Ok(())
            }
            // Heartbeats and whatever a newer server adds.
            _ => Ok(()),
        }
    }

    fn error_frame(&self, error: &Value) -> Fault {
        let text = error_text(error);
        let message = if text.contains(COLLISION) {
            format!(
                "session `{}` collided with a request still running on it: {text} (each \
                 conversation needs its own session_id)",
                self.session_id
            )
        } else {
            format!("the agent answered with an error: {text}")
        };
        Fault::new(FaultCategory::AgentError, message)
    }

    fn apply_response(&mut self, event: &mut Map<String, Value>) -> Result<(), Fault> {
        let status = str_field(event, "status").map(str::to_owned);
        if let Some(usage) = event.get("usage").and_then(parse_usage) {
            self.usage = Some(usage);
        }
        match status.as_deref() {
            Some("completed") => {
                if let Some(Value::Array(output)) = event.remove("output") {
                    // Messages without an `id` (the runtime's model fills one in; agents
                    // that write the response by hand leave it out) all merged into one, and
                    // a `plugin_call` before the reply was lost: `no-tool` passed. Such an
                    // `output[]` cannot be matched to the streamed messages, and it is the
                    // whole answer: it replaces them, each message by its place. Unless it
                    // holds fewer messages than were streamed: then it is a summary (the reply
                    // alone, after a streamed tool call and its output), and what was
                    // streamed, each message with its id, is the answer.
                    let anonymous = output.iter().any(|m| {
                        m.get("id")
                            .and_then(Value::as_str)
                            .is_none_or(str::is_empty)
                    });
                    let summary = anonymous && output.len() < self.messages.len();
                    if anonymous && !summary {
                        self.messages.clear();
                    }
                    let merged = if summary { Vec::new() } else { output };
                    for (place, message) in merged.into_iter().enumerate() {
                        if let Value::Object(mut message) = message {
                            if anonymous {
                                message.insert(
                                    "id".to_owned(),
                                    Value::String(format!("\u{1}output-{place}")),
                                );
                            }
                            self.apply_message(&mut message);
                        }
                    }
                }
                self.done = true;
            }
            Some(end @ ("failed" | "rejected" | "canceled" | "cancelled" | "incomplete")) => {
                self.done = true;
                let (category, what) = match end {
                    "failed" => (FaultCategory::AgentError, "the agent's run failed"),
                    "rejected" => (FaultCategory::AgentError, "the agent rejected the run"),
                    "incomplete" => (
                        FaultCategory::Incomplete,
                        "the agent ended its run incomplete",
                    ),
                    _ => (FaultCategory::AgentError, "the agent's run was canceled"),
                };
                let mut detail = match event.get("error").filter(|e| !e.is_null()) {
                    Some(error) => format!(": {}", error_text(error)),
                    None => String::new(),
                };
                // The run's own error messages (`type: "error"`, their `code` and
                // `message`) say what failed inside it: a tool, a model call.
                let inner: Vec<String> = self
                    .messages
                    .values()
                    .filter(|m| m.kind == "error")
                    .filter_map(PendingMessage::text)
                    .filter(|t| !t.trim().is_empty() && !detail.contains(t.as_str()))
                    .collect();
                if !inner.is_empty() {
                    detail.push_str(&format!(" (its error messages: {})", inner.join("; ")));
                }
                return Err(Fault::new(category, format!("{what}{detail}")));
            }
            _ => {}
        }
        self.status = status;
        Ok(())
    }

    fn apply_message(&mut self, event: &mut Map<String, Value>) {
        let kind = str_field(event, "type").unwrap_or("message").to_owned();
        if kind == "heartbeat" {
            return;
        }
        let id = str_field(event, "id").unwrap_or_default().to_owned();
        let role = str_field(event, "role").map(str::to_owned);
        let error = ["code", "message"]
            .iter()
            .filter_map(|k| str_field(event, k))
            .collect::<Vec<_>>()
            .join(": ");
        let usage = event.get("usage").and_then(parse_usage);
        let completed = str_field(event, "status") == Some("completed");
        let message = self.message(&id);
        message.kind = kind;
        message.completed |= completed;
        if role.is_some() {
            message.role = role;
        }
        if usage.is_some() {
            message.usage = usage;
        }
        if let Some(Value::Array(content)) = event.remove("content") {
            // A message carrying content is a snapshot of it.
            for (position, content) in content.into_iter().enumerate() {
                if let Value::Object(mut content) = content {
                    message.apply_content(&mut content, Some(position as u64));
                }
            }
        }
        if !error.is_empty() && message.contents.is_empty() {
            message.contents.insert(0, Part::Text(error));
        }
    }

    /// The message with `id`, created on first sight (a text-only agent's first event of a
    /// message can be a delta known only by its `msg_id`).
    fn message(&mut self, id: &str) -> &mut PendingMessage {
        self.messages
            .entry(id.to_owned())
            .or_insert_with(|| PendingMessage {
                kind: "message".to_owned(),
                ..Default::default()
            })
    }

    /// The answer: messages, tool calls with their results, the reply and usage.
    pub fn finish(self) -> Assembled {
        let usage = self
            .usage
            .or_else(|| sum_usage(self.messages.values().filter_map(|m| m.usage)));
        let mut calls: Vec<ToolCallRecord> = Vec::new();
        let mut inline_results: Vec<(usize, String)> = Vec::new();
        let mut results: Vec<(Option<String>, Option<String>, Option<String>)> = Vec::new();
        let mut messages = Vec::with_capacity(self.messages.len());
        let mut reply = None;
        for message in self.messages.into_values() {
            let text = message.text();
            let data: Vec<&Value> = message
                .contents
                .values()
                .filter_map(|p| match p {
                    Part::Other(v) if v.get("type").and_then(Value::as_str) == Some("data") => {
                        v.get("data")
                    }
                    _ => None,
                })
                .collect();
            let parts: Vec<Value> = message
                .contents
                .values()
                .filter_map(|p| match p {
                    Part::Other(v) => Some(v.clone()),
                    Part::Text(_) => None,
                })
                .collect();
            let kind = message.kind.as_str();
            // The reply is the text written after the last tool call or result: text written
            // before them is not the answer (as on Connexity, docs/wire.md).
            if is_call(kind) || is_call_output(kind) {
                reply = None;
            }
            let chat = if is_call(kind) {
                let mut tool_calls = Vec::new();
                for d in &data {
                    let call_id = d.get("call_id").and_then(Value::as_str).unwrap_or_default();
                    let name = d.get("name").and_then(Value::as_str).unwrap_or_default();
                    let arguments = arguments_text(d.get("arguments"));
                    if let Some(output) = d.get("output").filter(|o| !o.is_null()) {
                        inline_results.push((calls.len(), value_text(output)));
                    }
                    calls.push(ToolCallRecord {
                        call_id: call_id.to_owned(),
                        name: name.to_owned(),
                        arguments: arguments.clone(),
                        result: None,
                    });
                    tool_calls.push(ToolCall {
                        id: call_id.to_owned(),
                        kind: "function".to_owned(),
                        function: ToolCallFunction {
                            name: name.to_owned(),
                            arguments,
                        },
                    });
                }
                ChatMessage {
                    role: message.role.unwrap_or_else(|| "assistant".to_owned()),
                    content: text,
                    tool_calls,
                    tool_call_id: None,
                    name: Some(message.kind),
                    parts,
                }
            } else if is_call_output(kind) {
                let first = data.first();
                let field = |k: &str| {
                    first
                        .and_then(|d| d.get(k))
                        .filter(|v| !v.is_null())
                        .map(value_text)
                };
                let call_id = field("call_id");
                let name = field("name");
                let output = field("output").or(text);
                for d in &data {
                    let field = |k: &str| d.get(k).filter(|v| !v.is_null()).map(value_text);
                    results.push((field("call_id"), field("name"), field("output")));
                }
                ChatMessage {
                    role: "tool".to_owned(),
                    content: output,
                    tool_calls: Vec::new(),
                    tool_call_id: call_id,
                    name,
                    parts,
                }
            } else {
                let role = message.role.unwrap_or_else(|| "assistant".to_owned());
                if kind == "message"
                    && role == "assistant"
                    && let Some(text) = text.as_deref().filter(|t| !t.trim().is_empty())
                {
                    reply = Some(text.to_owned());
                }
                ChatMessage {
                    role,
                    content: text,
                    tool_calls: Vec::new(),
                    tool_call_id: None,
                    name: (kind != "message").then(|| message.kind.clone()),
                    parts,
                }
            };
            messages.push(chat);
        }
        for (at, output) in inline_results {
            if let Some(call) = calls.get_mut(at) {
                call.result = Some(output);
            }
        }
        // Output messages answer the calls that have no inline output yet: a call answered
        // in place must not take a later output meant for another call.
        let open: Vec<usize> = (0..calls.len())
            .filter(|&i| calls.get(i).is_some_and(|c| c.result.is_none()))
            .collect();
        let mut pending: Vec<ToolCallRecord> =
            open.iter().filter_map(|&i| calls.get(i).cloned()).collect();
        pair(
            &mut pending,
            results.iter().map(|(call_id, name, output)| ToolResult {
                call_id: call_id.as_deref(),
                name: name.as_deref(),
                content: output.as_deref(),
            }),
        );
        for (i, call) in open.into_iter().zip(pending) {
            if let Some(slot) = calls.get_mut(i) {
                *slot = call;
            }
        }
        Assembled {
            messages,
            reply,
            tool_calls: calls,
            usage,
        }
    }
}

impl PendingMessage {
    /// Applies a content event or a content of a message snapshot (`position`: its place in
    /// the message's list, used when it has no `index`).
    fn apply_content(&mut self, content: &mut Map<String, Value>, position: Option<u64>) {
        let index = content
            .get("index")
            .and_then(Value::as_u64)
            .or(position)
            .unwrap_or(0);
        let delta = content.get("delta").and_then(Value::as_bool) == Some(true);
        match str_field(content, "type") {
            Some("text") => {
                let Some(text) = str_field(content, "text") else {
                    return;
                };
                match self.contents.get_mut(&index) {
                    Some(Part::Text(existing)) if delta => existing.push_str(text),
                    _ => {
                        self.contents.insert(index, Part::Text(text.to_owned()));
                    }
                }
            }
            Some("data") if content.get("data").is_none_or(Value::is_null) => {}
            // Data deltas extend what the slot holds key by key, as the runtime's own
            // `add_delta_content` does (strings appended, lists extended); data without
            // `delta: true` is a snapshot (the form real agents send) and replaces it.
            Some("data") if delta => {
                if let (Some(Part::Other(existing)), Some(Value::Object(update))) =
                    (self.contents.get_mut(&index), content.get_mut("data"))
                    && let Some(Value::Object(data)) = existing.get_mut("data")
                {
                    for (key, value) in std::mem::take(update) {
                        match (data.get_mut(&key), value) {
                            (Some(Value::String(old)), Value::String(more)) => old.push_str(&more),
                            (Some(Value::Array(old)), Value::Array(more)) => old.extend(more),
                            (_, value) => {
                                data.insert(key, value);
                            }
                        }
                    }
                    return;
                }
                self.insert_snapshot(index, content);
            }
            _ => self.insert_snapshot(index, content),
        }
    }

    /// Puts a non-text content in its slot as sent, less the streaming bookkeeping.
    fn insert_snapshot(&mut self, index: u64, content: &mut Map<String, Value>) {
        for bookkeeping in [
            "object",
            "index",
            "delta",
            "msg_id",
            "status",
            "sequence_number",
        ] {
            content.remove(bookkeeping);
        }
        self.contents
            .insert(index, Part::Other(Value::Object(std::mem::take(content))));
    }

    /// The text contents, in index order, joined by newlines.
    fn text(&self) -> Option<String> {
        let texts: Vec<&str> = self
            .contents
            .values()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                Part::Other(_) => None,
            })
            .collect();
        (!texts.is_empty()).then(|| texts.join("\n"))
    }
}

fn is_call(kind: &str) -> bool {
    matches!(
        kind,
        "plugin_call" | "function_call" | "mcp_call" | "component_call"
    )
}

fn is_call_output(kind: &str) -> bool {
    matches!(
        kind,
        "plugin_call_output" | "function_call_output" | "mcp_call_output" | "component_call_output"
    )
}

/// Arguments as the JSON string criteria parse: the string sent, or an object serialised;
/// `{}` when there are none (the first snapshot of a call has `""`).
fn arguments_text(arguments: Option<&Value>) -> String {
    match arguments {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        None | Some(Value::Null) | Some(Value::String(_)) => "{}".to_owned(),
        Some(other) => other.to_string(),
    }
}

fn value_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn str_field<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    map.get(key).and_then(Value::as_str)
}

/// Usage in either naming: `prompt_tokens`/`completion_tokens` or
/// `input_tokens`/`output_tokens`.
fn parse_usage(usage: &Value) -> Option<Usage> {
    let usage = usage.as_object()?;
    let field = |a: &str, b: &str| {
        usage
            .get(a)
            .and_then(Value::as_u64)
            .or_else(|| usage.get(b).and_then(Value::as_u64))
    };
    let parsed = Usage {
        cost: Default::default(),
        prompt_tokens: field("prompt_tokens", "input_tokens"),
        completion_tokens: field("completion_tokens", "output_tokens"),
        total_tokens: field("total_tokens", "total_tokens"),
        priced_prompt_tokens: None,
    };
    (parsed != Usage::default()).then_some(parsed)
}

fn sum_usage(usages: impl Iterator<Item = Usage>) -> Option<Usage> {
    let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, b) => a.or(b),
    };
    usages.reduce(|total, u| Usage {
        cost: Default::default(),
        prompt_tokens: add(total.prompt_tokens, u.prompt_tokens),
        completion_tokens: add(total.completion_tokens, u.completion_tokens),
        total_tokens: add(total.total_tokens, u.total_tokens),
        priced_prompt_tokens: None,
    })
}

// ----- registry glue (`super::registry`)

use trellis_dsl::lang::{ArgSpec, Capabilities, EndpointKind, NodeSpec, ProtocolSpec, ValueType};

/// `protocol="agentscope"`.
pub const SPEC: ProtocolSpec = ProtocolSpec {
    name: "agentscope",
    help: "AgentScope's runtime: input messages in, server-sent events out, the conversation on the server (`session_id`)",
    endpoints: &[EndpointKind::Url, EndpointKind::Builtin],
    settings: &[NodeSpec::setting(
        "stream",
        &[ArgSpec::value(ValueType::Boolean)],
        "server-sent events (`#true`, the default) or one JSON body",
    )],
    capabilities: Capabilities {
        streams: true,
        measures_ttft: true,
        session_bound: true,
        ..super::connexity::NO_CAPABILITIES
    },
    builtins: &["weather"],

    check: None,
};

/// An AgentScope agent's own settings.
#[derive(Clone, Copy, Debug)]
pub struct AgentScopeSettings {
    /// Ask for server-sent events (else one JSON body).
    pub stream: bool,
}

impl super::registry::PlannedSettings for AgentScopeSettings {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// `stream`: server-sent events unless the agent says `stream=#false`.
fn streams(agent: &trellis_dsl::Agent) -> bool {
    agent
        .settings
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(true)
}

pub struct Module;

impl super::registry::ProtocolModule for Module {
    fn spec(&self) -> &'static ProtocolSpec {
        &SPEC
    }

    fn plan(
        &self,
        _project: &trellis_dsl::Project,
        agent: &trellis_dsl::Agent,
        _templates: &mut crate::render::Templates,
    ) -> Result<Arc<dyn super::registry::PlannedSettings>, crate::render::RenderError> {
        Ok(Arc::new(AgentScopeSettings {
            stream: streams(agent),
        }))
    }

    fn build(
        &self,
        setup: &super::AgentSetup<'_>,
    ) -> Result<Arc<dyn AgentProtocol>, super::registry::BuildError> {
        let settings = super::registry::settings::<AgentScopeSettings>(setup)?;
        Ok(Arc::new(AgentScopeClient::new(
            setup.url,
            setup.headers.clone(),
            setup.limits,
            setup.retry,
            settings.stream,
            setup.transport.clone(),
        )?))
    }

    fn untimed(&self, agent: &trellis_dsl::Agent) -> Option<String> {
        (!streams(agent)).then(|| {
            format!(
                "agent `{}` has `stream=#false`: it is asked for one JSON body, so no first \
                 token is timed (unless the server streams anyway)",
                agent.id.value
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn assemble(events: &[Value]) -> (Assembled, Option<Fault>) {
        let mut a = Assembler::new("s");
        let mut fault = None;
        for e in events {
            if let Err(f) = a.apply(e.clone()) {
                fault = Some(f);
                break;
            }
        }
        (a.finish(), fault)
    }

    #[test]
    fn text_only_shape_assembles_deltas_by_msg_id_and_index() {
        let (a, fault) = assemble(&[
            json!({"object": "response", "status": "created", "id": "r"}),
            json!({"object": "content", "type": "text", "delta": true, "msg_id": "m1", "index": 0, "text": "Hel"}),
            json!({"object": "content", "type": "text", "delta": true, "msg_id": "m2", "index": 0, "text": "Other"}),
            json!({"object": "content", "type": "text", "delta": true, "msg_id": "m1", "index": 0, "text": "lo"}),
            json!({"object": "content", "type": "text", "delta": true, "msg_id": "m1", "index": 1, "text": "second"}),
            json!({"object": "message", "id": "m1", "type": "message", "role": "assistant", "status": "completed"}),
            json!({"object": "response", "status": "completed", "usage": {"input_tokens": 3, "output_tokens": 4}}),
        ]);
        assert_eq!(fault, None);
        assert_eq!(a.messages.len(), 2);
        assert_eq!(a.messages[0].content.as_deref(), Some("Hello\nsecond"));
        assert_eq!(a.reply.as_deref(), Some("Other"));
        assert_eq!(a.usage.and_then(|u| u.completion_tokens), Some(4));
    }

    #[test]
    fn a_completed_text_content_replaces_the_deltas() {
        let (a, _) = assemble(&[
            json!({"object": "message", "id": "m", "type": "message", "role": "assistant", "status": "in_progress"}),
            json!({"object": "content", "type": "text", "delta": true, "msg_id": "m", "index": 0, "text": "Hello"}),
            json!({"object": "content", "type": "text", "delta": null, "msg_id": "m", "index": 0, "status": "completed", "text": "Hello, world!"}),
            json!({"object": "response", "status": "completed"}),
        ]);
        assert_eq!(a.reply.as_deref(), Some("Hello, world!"));
    }

    #[test]
    fn data_snapshots_replace_and_pair_calls_with_outputs() {
        let call = |args: &str| {
            json!({"object": "content", "type": "data", "delta": false, "msg_id": "c", "index": 0,
                   "data": {"call_id": "k1", "name": "add", "arguments": args}})
        };
        let (a, fault) = assemble(&[
            json!({"object": "message", "id": "c", "type": "plugin_call", "role": "assistant", "status": "in_progress"}),
            call(""),
            call("{\"a\": 4, \"b\": 5}"),
            json!({"object": "message", "id": "o", "type": "plugin_call_output", "role": "tool",
                   "content": [{"type": "data", "data": {"call_id": "k1", "name": "add", "output": "[{\"type\": \"text\", \"text\": \"9\"}]"}}]}),
            json!({"object": "content", "type": "text", "delta": true, "msg_id": "m", "index": 0, "text": "9"}),
            json!({"object": "response", "status": "completed"}),
        ]);
        assert_eq!(fault, None);
        assert_eq!(a.tool_calls.len(), 1);
        assert_eq!(a.tool_calls[0].name, "add");
        assert_eq!(a.tool_calls[0].arguments, "{\"a\": 4, \"b\": 5}");
        assert_eq!(
            a.tool_calls[0].result.as_deref(),
            Some("[{\"type\": \"text\", \"text\": \"9\"}]")
        );
        assert_eq!(a.messages[1].role, "tool");
        assert_eq!(a.messages[1].tool_call_id.as_deref(), Some("k1"));
        assert_eq!(a.reply.as_deref(), Some("9"));
    }

    #[test]
    fn a_call_answered_in_place_does_not_take_a_later_output() {
        let (a, fault) = assemble(&[
            json!({"object": "message", "id": "c1", "type": "mcp_call", "role": "assistant",
                   "content": [{"type": "data", "data": {"call_id": "x", "name": "first", "arguments": "{}", "output": "inline"}}]}),
            json!({"object": "message", "id": "c2", "type": "plugin_call", "role": "assistant",
                   "content": [{"type": "data", "data": {"call_id": "y", "name": "second", "arguments": "{}"}}]}),
            // No call id and no name: paired by order, with the first call still open.
            json!({"object": "message", "id": "o", "type": "plugin_call_output", "role": "tool",
                   "content": [{"type": "data", "data": {"output": "later"}}]}),
            json!({"object": "response", "status": "completed"}),
        ]);
        assert_eq!(fault, None);
        assert_eq!(a.tool_calls[0].result.as_deref(), Some("inline"));
        assert_eq!(a.tool_calls[1].result.as_deref(), Some("later"));
    }

    #[test]
    fn data_deltas_extend_the_slot_and_message_usage_counts_without_response_usage() {
        let delta = |data: Value| json!({"object": "content", "type": "data", "delta": true, "msg_id": "c", "index": 0, "data": data});
        let (a, fault) = assemble(&[
            json!({"object": "message", "id": "c", "type": "function_call", "role": "assistant"}),
            delta(json!({"call_id": "k", "name": "add", "arguments": "{\"a\": "})),
            delta(json!({"arguments": "4}"})),
            json!({"object": "message", "id": "c", "type": "function_call", "status": "completed",
                   "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
            json!({"object": "message", "id": "m", "type": "message", "role": "assistant",
                   "content": [{"type": "text", "text": "4"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}),
            json!({"object": "response", "status": "completed"}),
        ]);
        assert_eq!(fault, None);
        assert_eq!(a.tool_calls[0].arguments, "{\"a\": 4}");
        assert_eq!(a.usage.and_then(|u| u.prompt_tokens), Some(8));
    }

    #[test]
    fn an_incomplete_run_is_incomplete() {
        let (_, fault) = assemble(&[json!({"object": "response", "status": "incomplete"})]);
        assert_eq!(fault.map(|f| f.category), Some(FaultCategory::Incomplete));
    }

    #[test]
    fn the_completed_output_is_merged_as_a_snapshot() {
        let (a, _) = assemble(&[
            json!({"object": "content", "type": "text", "delta": true, "msg_id": "m", "index": 0, "text": "partial"}),
            json!({"object": "response", "status": "completed", "output": [
                {"id": "m", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "whole answer"}]},
                {"id": "i", "type": "message", "role": "assistant", "content": [
                    {"type": "image", "image_url": "http://x/y.png"},
                    {"type": "data", "data": {"k": 1}}]}
            ]}),
        ]);
        assert_eq!(a.messages[0].content.as_deref(), Some("whole answer"));
        assert_eq!(a.messages[1].parts.len(), 2);
        assert_eq!(a.messages[1].parts[0]["image_url"], "http://x/y.png");
        assert_eq!(a.messages[1].parts[1]["data"]["k"], 1);
    }

    /// An `output[]` written by hand, without message ids: each message is its own, and the
    /// tool call before the reply is read (all of them merged into one, and the call was
    /// lost: `no-tool` passed). It replaces what was streamed.
    #[test]
    fn a_completed_output_without_message_ids_keeps_every_message() {
        let (a, fault) = assemble(&[
            json!({"object": "content", "type": "text", "delta": true, "msg_id": "s", "index": 0, "text": "streamed"}),
            json!({"object": "response", "status": "completed", "output": [
                {"type": "plugin_call", "role": "assistant", "content": [{"type": "data",
                    "data": {"call_id": "k1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"type": "plugin_call_output", "role": "tool", "content": [{"type": "data",
                    "data": {"call_id": "k1", "name": "get_weather", "output": "sunny"}}]},
                {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "It is sunny."}]}
            ]}),
        ]);
        assert_eq!(fault, None);
        assert_eq!(a.tool_calls.len(), 1, "{:?}", a.tool_calls);
        assert_eq!(a.tool_calls[0].name, "get_weather");
        assert_eq!(a.tool_calls[0].arguments, "{\"city\": \"Paris\"}");
        assert_eq!(a.reply.as_deref(), Some("It is sunny."));
    }

    /// The same `output[]` after a stream that told more, with ids: a tool call, its output
    /// and the reply. A reply alone there is a summary, and the streamed call stays (it was
    /// dropped with everything streamed: `no-tool` passed on a tool the agent called).
    #[test]
    fn a_shorter_output_without_message_ids_leaves_the_streamed_messages() {
        let data = |kind: &str, id: &str, data: Value| {
            json!({"object": "message", "id": id, "type": kind,
            "role": if kind == "plugin_call_output" { "tool" } else { "assistant" }, "status": "completed",
            "content": [{"type": "data", "data": data}]})
        };
        let (a, fault) = assemble(&[
            data(
                "plugin_call",
                "c",
                json!({"call_id": "k1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}),
            ),
            data(
                "plugin_call_output",
                "o",
                json!({"call_id": "k1", "name": "get_weather", "output": "sunny"}),
            ),
            json!({"object": "content", "type": "text", "delta": true, "msg_id": "m", "index": 0, "text": "It is sunny."}),
            json!({"object": "response", "status": "completed", "output": [
                {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "It is sunny."}]}
            ]}),
        ]);
        assert_eq!(fault, None);
        assert_eq!(a.tool_calls.len(), 1, "{:?}", a.tool_calls);
        assert_eq!(a.tool_calls[0].result.as_deref(), Some("sunny"));
        assert_eq!(a.reply.as_deref(), Some("It is sunny."));
    }

    #[test]
    fn errors_are_agent_errors_with_their_reason() {
        let (_, fault) =
            assemble(&[json!({"error": "Task trellis-1 is already in RUNNING state."})]);
        let fault = fault.unwrap_or_else(|| Fault::new(FaultCategory::Internal, "none"));
        assert_eq!(fault.category, FaultCategory::AgentError);
        assert!(fault.message.contains("collided"), "{}", fault.message);

        let (a, fault) = assemble(&[
            json!({"object": "content", "type": "text", "delta": true, "msg_id": "m", "text": "Checking"}),
            json!({"object": "response", "status": "failed", "error": {"code": "AGENT_UNKNOWN_ERROR", "message": "boom"}}),
        ]);
        let fault = fault.unwrap_or_else(|| Fault::new(FaultCategory::Internal, "none"));
        assert_eq!(fault.category, FaultCategory::AgentError);
        assert!(
            fault.message.contains("AGENT_UNKNOWN_ERROR: boom"),
            "{}",
            fault.message
        );
        assert_eq!(a.messages[0].content.as_deref(), Some("Checking"));

        // The run's own error message (what failed inside it) is in the fault too.
        let (_, fault) = assemble(&[
            json!({"object": "message", "id": "e", "type": "error", "status": "failed", "code": "TOOL_ERR", "message": "tool blew up"}),
            json!({"object": "response", "status": "failed", "error": {"code": "AGENT_UNKNOWN_ERROR", "message": "x"}}),
        ]);
        let fault = fault.unwrap_or_else(|| Fault::new(FaultCategory::Internal, "none"));
        assert_eq!(
            fault.message,
            "the agent's run failed: AGENT_UNKNOWN_ERROR: x (its error messages: TOOL_ERR: tool \
             blew up)"
        );
    }

    #[test]
    fn heartbeats_and_unknown_events_are_ignored() {
        let (a, fault) = assemble(&[
            json!({"object": "message", "type": "heartbeat"}),
            json!({"object": "something_new", "x": 1}),
            json!({"sequence_number": 3}),
            json!({"object": "response", "status": "completed"}),
        ]);
        assert_eq!(fault, None);
        assert!(a.messages.is_empty());
    }
}
