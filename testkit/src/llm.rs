//! A fake LLM endpoint over real HTTP on 127.0.0.1: OpenAI chat completions
//! (`POST /v1/chat/completions`) and Anthropic Messages (`POST /v1/messages`), answering in
//! each API's own shape, scripted per test.
//!
//! A script is a list of [`Rule`]s: the first rule whose `contains` text appears in the last
//! message of the request (and whose `system` text, if set, in its system prompt) answers it, with its replies consumed in order (the last one
//! repeats). A reply can be text, a 429 with or without `Retry-After`, an error status, a raw
//! (garbage) body, an empty answer, an echo of the request headers, or any of these after a
//! delay. Every request is recorded and counted, so tests can assert "zero calls".
//!
//! Requests may also be answered with tool calls ([`Reply::ToolCalls`]). A request with
//! `"stream": true` gets text and tool calls as server-sent events in its API's shape:
//! chat-completion chunks ending in `[DONE]`, or Anthropic's `message_start`,
//! `content_block_*` (tool input in two `input_json_delta` fragments), `message_delta` and
//! `message_stop`, with a `ping` among them. [`Reply::Chunks`] streams text piece by piece
//! with a pause before each piece (time to first token), optionally cut before the end;
//! [`Reply::StreamError`] streams a piece and then an error (an Anthropic `error` event, an
//! `{"error": …}` chunk for OpenAI); [`Reply::Events`] sends raw `data` lines.
//!
//! A scripted simulated user ([`Rule::simulator`]) answers by the conversation's turn
//! instead of by order of arrival: its Nth reply answers every request in which the
//! simulator has already written N messages (its own, sent back as `assistant` messages),
//! so concurrent trajectories, retries and cache misses all see the same script. Scripts
//! that break character in known ways (empty answers, the agent's voice, repeats, loops)
//! exercise the fidelity guards.
//!
//! [`FakeLlm::with_slots`] also answers llama.cpp's `GET /props` with `total_slots`, and
//! [`FakeLlm::max_in_flight`] tells how many requests were ever answered at the same time.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// HTTP 200 with this text as the model's answer, in the API's shape, with usage.
    Text(String),
    /// HTTP 429, with this `Retry-After` value if given.
    RateLimited { retry_after: Option<String> },
    /// This status and body.
    Status(u16, String),
    /// HTTP 200 with this body as is (garbage, truncated JSON, an error object).
    Raw(String),
    /// HTTP 200 in the API's shape with empty content.
    Empty,
    /// This status with every request header echoed in the body (a server that leaks them).
    EchoHeaders(u16),
    /// The reply after a delay.
    Slow(Duration, Box<Reply>),
    /// HTTP 400 to a request asking for structured output (`response_format`), as servers
    /// without it answer; the reply to a request without it.
    NoStructuredOutput(Box<Reply>),
    /// Like `NoStructuredOutput`, answering a request with `response_format` with this
    /// status (llama.cpp: 500 for a schema its grammar converter does not take).
    SchemaRejected(u16, Box<Reply>),
    /// As api.openai.com answers for its reasoning models (o-series, gpt-5): a request with
    /// `max_tokens`, or a `temperature` other than 1, gets the 400 that names the parameter;
    /// any other gets the reply.
    ReasoningModel(Box<Reply>),
    /// The model calls these tools (name, arguments object), in order: OpenAI `tool_calls`,
    /// Anthropic `tool_use` blocks.
    ToolCalls(Vec<(String, Value)>),
    /// Streaming: these text pieces as chunks (OpenAI) or `text_delta` events (Anthropic),
    /// each after `gap`; with `complete` false the stream closes after the last piece
    /// without a finish reason or `[DONE]` (OpenAI), or without closing the block and the
    /// message (Anthropic).
    Chunks {
        pieces: Vec<String>,
        gap: Duration,
        complete: bool,
    },
    /// Streaming: one text piece, then an error with this message (`overloaded_error` for
    /// Anthropic), and the stream closes.
    StreamError(String),
    /// Streaming: these `data` payloads as events, as given (garbage, broken tool input),
    /// each named by its JSON `type` when it has one.
    Events(Vec<String>),
    /// The reply as one JSON body even to a request asking for a stream (a server that
    /// does not stream).
    Unstreamed(Box<Reply>),
}

impl Reply {
    pub fn text(text: impl Into<String>) -> Self {
        Reply::Text(text.into())
    }
    pub fn slow(delay: Duration, then: Reply) -> Self {
        Reply::Slow(delay, Box::new(then))
    }
    /// One tool call (OpenAI).
    pub fn tool_call(name: &str, arguments: Value) -> Self {
        Reply::ToolCalls(vec![(name.to_owned(), arguments)])
    }
    pub fn rate_limited(retry_after: &str) -> Self {
        Reply::RateLimited {
            retry_after: Some(retry_after.to_owned()),
        }
    }
}

/// Replies for requests whose last message contains `contains` (any request when `None`)
/// and, when `model` is set, that ask for that model, and when `system` is set, whose system
/// prompt contains it.
#[derive(Clone, Debug)]
pub struct Rule {
    pub contains: Option<String>,
    pub model: Option<String>,
    pub system: Option<String>,
    pub replies: Vec<Reply>,
    /// Answer with the reply at the number of `assistant` messages in the request (the
    /// simulated user's own messages so far), not the next one in order.
    pub by_turn: bool,
}

impl Rule {
    pub fn when(contains: impl Into<String>, replies: impl IntoIterator<Item = Reply>) -> Self {
        Rule {
            contains: Some(contains.into()),
            model: None,
            system: None,
            replies: replies.into_iter().collect(),
            by_turn: false,
        }
    }
    pub fn otherwise(replies: impl IntoIterator<Item = Reply>) -> Self {
        Rule {
            contains: None,
            model: None,
            system: None,
            replies: replies.into_iter().collect(),
            by_turn: false,
        }
    }
    /// Replies for every request asking for `model`.
    pub fn for_model(model: impl Into<String>, replies: impl IntoIterator<Item = Reply>) -> Self {
        Rule {
            contains: None,
            model: Some(model.into()),
            system: None,
            replies: replies.into_iter().collect(),
            by_turn: false,
        }
    }
    /// A simulated user's script for requests whose system prompt contains `system` (the
    /// scenario's description, say): reply N answers its Nth message (from 0), the last one
    /// repeating.
    pub fn simulator(system: impl Into<String>, replies: impl IntoIterator<Item = Reply>) -> Self {
        Rule {
            contains: None,
            model: None,
            system: Some(system.into()),
            replies: replies.into_iter().collect(),
            by_turn: true,
        }
    }
    /// This rule, for requests whose system prompt contains `text` only (the simulator's
    /// prompt differs per persona or instructions, while the last message may not).
    pub fn in_system(mut self, text: impl Into<String>) -> Self {
        self.system = Some(text.into());
        self
    }
}

/// A request as the fake saw it.
#[derive(Clone, Debug)]
pub struct LlmRequestSeen {
    /// `openai` or `anthropic`, by the path called.
    pub api: &'static str,
    pub headers: HeaderMap,
    pub body: Value,
}

impl LlmRequestSeen {
    /// The text of the last message sent.
    pub fn last_message(&self) -> String {
        last_message(&self.body)
    }
}

struct Script {
    rules: Vec<Rule>,
    /// Replies used so far, per rule.
    used: Vec<usize>,
}

struct Shared {
    script: Mutex<Script>,
    calls: AtomicUsize,
    seen: Mutex<Vec<LlmRequestSeen>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// `GET /props` answers `{"total_slots": N}` (llama.cpp) when set.
    slots: Option<usize>,
    /// `GET /props` answers 503 (a server still loading its model) this many times first.
    props_failures: AtomicUsize,
}

/// Counts a request as in flight while alive.
/// A request counts until its whole body is sent (a streamed answer included).
struct InFlight(Arc<Shared>);

impl InFlight {
    fn enter(shared: Arc<Shared>) -> Self {
        let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(shared)
    }

    /// `response`, its body keeping this request in flight until it has been sent.
    fn until_sent(self, response: Response) -> Response {
        use futures::StreamExt as _;
        let (parts, body) = response.into_parts();
        let stream = body.into_data_stream().map(move |chunk| {
            let _in_flight = &self;
            chunk
        });
        Response::from_parts(parts, axum::body::Body::from_stream(stream))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The fake endpoint, stopped when dropped.
pub struct FakeLlm {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeLlm {
    pub async fn start(rules: Vec<Rule>) -> Self {
        Self::serve(rules, None, 0).await
    }

    /// Like [`FakeLlm::start`], also saying on `GET /props` that it has `slots` parallel
    /// slots, as a llama.cpp server does.
    pub async fn with_slots(rules: Vec<Rule>, slots: usize) -> Self {
        Self::serve(rules, Some(slots), 0).await
    }

    /// Like [`FakeLlm::with_slots`], answering `GET /props` with 503 (loading the model) the
    /// first `failures` times.
    pub async fn with_slots_after(rules: Vec<Rule>, slots: usize, failures: usize) -> Self {
        Self::serve(rules, Some(slots), failures).await
    }

    async fn serve(rules: Vec<Rule>, slots: Option<usize>, props_failures: usize) -> Self {
        let shared = Arc::new(Shared {
            script: Mutex::new(Script {
                used: vec![0; rules.len()],
                rules,
            }),
            calls: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            slots,
            props_failures: AtomicUsize::new(props_failures),
        });
        let router = Router::new()
            .route("/v1/chat/completions", post(openai))
            .route("/v1/messages", post(anthropic))
            .route("/props", get(props))
            .with_state(shared.clone());
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        FakeLlm { addr, shared, task }
    }

    /// Answers every request with `text`.
    pub async fn always(text: &str) -> Self {
        Self::start(vec![Rule::otherwise([Reply::text(text)])]).await
    }

    /// `base-url` of the endpoint: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The most requests ever being answered at the same time.
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }

    /// Requests received so far.
    pub fn calls(&self) -> usize {
        self.shared.calls.load(Ordering::SeqCst)
    }

    pub fn seen(&self) -> Vec<LlmRequestSeen> {
        self.shared.seen.lock().unwrap().clone()
    }
}

async fn openai(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let in_flight = InFlight::enter(shared.clone());
    in_flight.until_sent(answer(&shared, "openai", headers, &body).await)
}

async fn anthropic(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let in_flight = InFlight::enter(shared.clone());
    in_flight.until_sent(answer(&shared, "anthropic", headers, &body).await)
}

async fn props(State(shared): State<Arc<Shared>>) -> Response {
    let loading = shared
        .props_failures
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if loading {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":{"code":503,"message":"Loading model"}}"#,
        )
            .into_response();
    }
    match shared.slots {
        Some(n) => json_response(200, json!({"total_slots": n, "build_info": "fake"})),
        None => (StatusCode::NOT_FOUND, "File Not Found").into_response(),
    }
}

async fn answer(shared: &Shared, api: &'static str, headers: HeaderMap, body: &[u8]) -> Response {
    shared.calls.fetch_add(1, Ordering::SeqCst);
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let last = last_message(&body);
    let system = system_prompt(&body);
    let model = body["model"].as_str().unwrap_or("");
    let reply = {
        let mut script = shared.script.lock().unwrap();
        let Script { rules, used } = &mut *script;
        rules
            .iter()
            .zip(used.iter_mut())
            .find(|(rule, _)| {
                rule.contains.as_deref().is_none_or(|c| last.contains(c))
                    && rule.model.as_deref().is_none_or(|m| m == model)
                    && rule.system.as_deref().is_none_or(|t| system.contains(t))
            })
            .and_then(|(rule, used)| {
                let at = if rule.by_turn {
                    body["messages"]
                        .as_array()
                        .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count())
                } else {
                    *used
                };
                let reply = rule
                    .replies
                    .get(at)
                    .or_else(|| rule.replies.last())
                    .cloned();
                *used += 1;
                reply
            })
    };
    shared.seen.lock().unwrap().push(LlmRequestSeen {
        api,
        headers: headers.clone(),
        body: body.clone(),
    });
    let reply = reply.unwrap_or_else(|| Reply::Status(500, "no scripted reply".into()));
    render(reply, api, &headers, &body).await
}

async fn render(mut reply: Reply, api: &str, headers: &HeaderMap, request: &Value) -> Response {
    let mut streamed = request["stream"].as_bool() == Some(true);
    loop {
        match reply {
            Reply::Slow(delay, then) => {
                tokio::time::sleep(delay).await;
                reply = *then;
            }
            Reply::NoStructuredOutput(_) if request.get("response_format").is_some() => {
                return (StatusCode::BAD_REQUEST, "response_format is not supported")
                    .into_response();
            }
            Reply::NoStructuredOutput(then) => reply = *then,
            Reply::SchemaRejected(status, _) if request.get("response_format").is_some() => {
                return (status_code(status), "JSON schema conversion failed").into_response();
            }
            Reply::SchemaRejected(_, then) => reply = *then,
            Reply::ReasoningModel(_) if request.get("max_tokens").is_some() => {
                return json_response(
                    400,
                    json!({"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.", "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}}),
                );
            }
            Reply::ReasoningModel(_)
                if request
                    .get("temperature")
                    .and_then(Value::as_f64)
                    .is_some_and(|t| t != 1.0) =>
            {
                return json_response(
                    400,
                    json!({"error": {"message": "Unsupported value: 'temperature' does not support 0 with this model. Only the default (1) value is supported.", "type": "invalid_request_error", "param": "temperature", "code": "unsupported_value"}}),
                );
            }
            Reply::ReasoningModel(then) => reply = *then,
            Reply::Unstreamed(then) => {
                streamed = false;
                reply = *then;
            }
            _ => break,
        }
    }
    let answer = matches!(
        reply,
        Reply::Text(_)
            | Reply::Empty
            | Reply::ToolCalls(_)
            | Reply::Chunks { .. }
            | Reply::StreamError(_)
            | Reply::Events(_)
    );
    if streamed && answer && api == "anthropic" {
        return anthropic_stream(reply, request);
    }
    match reply {
        Reply::Text(text) if streamed => sse_response(
            vec![text_chunk(&text), finish_chunk(request, &text)],
            Duration::ZERO,
            true,
        ),
        Reply::Text(text) => json_response(200, shaped(api, request, &text)),
        Reply::ToolCalls(calls) if streamed => {
            let mut chunks: Vec<Value> = Vec::new();
            for (index, (name, arguments)) in calls.iter().enumerate() {
                // The name and id first, then the arguments in two pieces, as servers do.
                let text = arguments.to_string();
                let (a, b) = text.split_at(text.len() / 2);
                chunks.push(tool_chunk(index, Some(name), a));
                chunks.push(tool_chunk(index, None, b));
            }
            chunks.push(finish_chunk(request, ""));
            sse_response(chunks, Duration::ZERO, true)
        }
        Reply::ToolCalls(calls) if api == "anthropic" => {
            let mut body = shaped(api, request, "");
            body["content"] = calls
                .iter()
                .enumerate()
                .map(|(i, (name, input))| {
                    json!({"type": "tool_use", "id": format!("toolu_{i}"), "name": name,
                           "input": input})
                })
                .collect();
            body["stop_reason"] = json!("tool_use");
            json_response(200, body)
        }
        Reply::ToolCalls(calls) => {
            let mut body = shaped(api, request, "");
            body["choices"][0]["message"]["content"] = Value::Null;
            body["choices"][0]["message"]["tool_calls"] = calls
                .iter()
                .enumerate()
                .map(|(i, (name, arguments))| {
                    json!({"id": format!("call_{i}"), "type": "function",
                           "function": {"name": name, "arguments": arguments.to_string()}})
                })
                .collect();
            body["choices"][0]["finish_reason"] = json!("tool_calls");
            json_response(200, body)
        }
        Reply::Chunks {
            pieces,
            gap,
            complete,
        } => {
            let whole = pieces.concat();
            let mut chunks: Vec<Value> = pieces.iter().map(|p| text_chunk(p)).collect();
            if complete {
                chunks.push(finish_chunk(request, &whole));
            }
            sse_response(chunks, gap, complete)
        }
        Reply::StreamError(message) => sse_response(
            vec![
                text_chunk("partial"),
                json!({"error": {"message": message, "type": "server_error"}}),
            ],
            Duration::ZERO,
            false,
        ),
        Reply::Events(payloads) => raw_sse(
            payloads.into_iter().map(|p| (None, p)).collect(),
            Duration::ZERO,
        ),
        Reply::Empty => json_response(200, shaped(api, request, "")),
        Reply::RateLimited { retry_after } => {
            let mut response = (
                StatusCode::TOO_MANY_REQUESTS,
                r#"{"error":{"message":"rate limited"}}"#,
            )
                .into_response();
            if let Some(value) = retry_after {
                response
                    .headers_mut()
                    .insert("retry-after", value.parse().unwrap());
            }
            response
        }
        Reply::Status(status, body) => (status_code(status), body).into_response(),
        Reply::Raw(body) => (StatusCode::OK, body).into_response(),
        Reply::EchoHeaders(status) => {
            let echoed: Vec<String> = headers
                .iter()
                .map(|(k, v)| format!("{k}: {}", String::from_utf8_lossy(v.as_bytes())))
                .collect();
            (status_code(status), echoed.join("\n")).into_response()
        }
        Reply::Slow(..)
        | Reply::NoStructuredOutput(_)
        | Reply::SchemaRejected(..)
        | Reply::ReasoningModel(_)
        | Reply::Unstreamed(_) => {
            unreachable!("unwrapped above")
        }
    }
}

fn text_chunk(text: &str) -> Value {
    json!({"object": "chat.completion.chunk",
           "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
}

fn tool_chunk(index: usize, name: Option<&str>, arguments: &str) -> Value {
    let mut call = json!({"index": index, "function": {"arguments": arguments}});
    if let Some(name) = name {
        call["id"] = json!(format!("call_{index}"));
        call["type"] = json!("function");
        call["function"]["name"] = json!(name);
    }
    json!({"object": "chat.completion.chunk",
           "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": null}]})
}

/// The last chunk: a finish reason and the usage of a whole answer `text`.
fn finish_chunk(request: &Value, text: &str) -> Value {
    let whole = shaped("openai", request, text);
    json!({"object": "chat.completion.chunk",
           "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
           "usage": whole["usage"]})
}

/// `chunks` as server-sent events, each after `gap`, then `[DONE]` when `done`.
fn sse_response(chunks: Vec<Value>, gap: Duration, done: bool) -> Response {
    let mut events: Vec<(Option<String>, String)> =
        chunks.iter().map(|c| (None, c.to_string())).collect();
    if done {
        events.push((None, "[DONE]".to_owned()));
    }
    raw_sse(events, gap)
}

/// `(event name, data)` pairs as server-sent events, each after `gap`.
fn raw_sse(events: Vec<(Option<String>, String)>, gap: Duration) -> Response {
    let events: Vec<String> = events
        .into_iter()
        .map(|(name, data)| match name {
            Some(name) => format!("event: {name}\ndata: {data}\n\n"),
            None => format!("data: {data}\n\n"),
        })
        .collect();
    let stream = futures::stream::unfold(events.into_iter(), move |mut events| async move {
        let event = events.next()?;
        tokio::time::sleep(gap).await;
        Some((Ok::<_, std::convert::Infallible>(event), events))
    });
    (
        StatusCode::OK,
        [("content-type", "text/event-stream")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

/// A streamed Anthropic answer to `request`: the events of the Messages API, each named by
/// its `type`. Replies that are not answers (statuses, raw bodies) are sent as they are.
fn anthropic_stream(reply: Reply, request: &Value) -> Response {
    let whole = |text: &str| shaped("anthropic", request, text);
    let start = |text: &str| {
        let mut message = whole(text);
        message["content"] = json!([]);
        message["stop_reason"] = Value::Null;
        message["usage"]["output_tokens"] = json!(1);
        json!({"type": "message_start", "message": message})
    };
    let end = |text: &str, stop_reason: &str| {
        [
            json!({"type": "message_delta",
                   "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                   "usage": {"output_tokens": whole(text)["usage"]["output_tokens"]}}),
            json!({"type": "message_stop"}),
        ]
    };
    let text_block = |index: usize| {
        json!({"type": "content_block_start", "index": index,
               "content_block": {"type": "text", "text": ""}})
    };
    let text_delta = |index: usize, piece: &str| {
        json!({"type": "content_block_delta", "index": index,
               "delta": {"type": "text_delta", "text": piece}})
    };
    let stop = |index: usize| json!({"type": "content_block_stop", "index": index});
    let events = match reply {
        Reply::Text(text) => {
            let mut events = vec![
                start(""),
                text_block(0),
                json!({"type": "ping"}),
                text_delta(0, &text),
                stop(0),
            ];
            events.extend(end(&text, "end_turn"));
            events
        }
        Reply::Empty => {
            let mut events = vec![start(""), text_block(0), stop(0)];
            events.extend(end("", "end_turn"));
            events
        }
        Reply::ToolCalls(calls) => {
            let mut events = vec![start("")];
            for (index, (name, input)) in calls.iter().enumerate() {
                events.push(json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": format!("toolu_{index}"),
                                      "name": name, "input": {}}}));
                // The input in two fragments, as the API sends it.
                let text = input.to_string();
                let (a, b) = text.split_at(text.len() / 2);
                for fragment in [a, b] {
                    events.push(json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": fragment}}));
                }
                events.push(stop(index));
            }
            events.extend(end("", "tool_use"));
            events
        }
        Reply::Chunks {
            pieces,
            gap,
            complete,
        } => {
            let whole_text = pieces.concat();
            let mut events = vec![start(""), text_block(0)];
            events.extend(pieces.iter().map(|p| text_delta(0, p)));
            if complete {
                events.push(stop(0));
                events.extend(end(&whole_text, "end_turn"));
            }
            // The message start comes at once; the pause is before each piece.
            let mut timed: Vec<(Duration, Value)> = Vec::new();
            for (i, event) in events.into_iter().enumerate() {
                let is_piece = i >= 2 && i < 2 + pieces.len();
                timed.push((if is_piece { gap } else { Duration::ZERO }, event));
            }
            return timed_sse(timed);
        }
        Reply::StreamError(message) => vec![
            start(""),
            text_block(0),
            text_delta(0, "partial"),
            json!({"type": "error",
                   "error": {"type": "overloaded_error", "message": message}}),
        ],
        Reply::Events(payloads) => {
            let named = payloads
                .into_iter()
                .map(|data| {
                    let name = serde_json::from_str::<Value>(&data)
                        .ok()
                        .and_then(|v| v["type"].as_str().map(str::to_owned));
                    (name, data)
                })
                .collect();
            return raw_sse(named, Duration::ZERO);
        }
        // Statuses and raw bodies are sent by `render` before a stream is considered.
        other => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("not a streamed reply: {other:?}"),
            )
                .into_response();
        }
    };
    timed_sse(events.into_iter().map(|e| (Duration::ZERO, e)).collect())
}

/// Events named by their `type`, each after its own pause.
fn timed_sse(events: Vec<(Duration, Value)>) -> Response {
    let stream = futures::stream::unfold(events.into_iter(), |mut events| async move {
        let (pause, event) = events.next()?;
        tokio::time::sleep(pause).await;
        let name = event["type"].as_str().unwrap_or("message").to_owned();
        Some((
            Ok::<_, std::convert::Infallible>(format!("event: {name}\ndata: {event}\n\n")),
            events,
        ))
    });
    (
        StatusCode::OK,
        [("content-type", "text/event-stream")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

fn status_code(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap()
}

fn json_response(status: u16, body: Value) -> Response {
    (
        status_code(status),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The answer in the API's shape, with deterministic usage: a token per four characters of
/// the request's messages, a token per word of the answer.
fn shaped(api: &str, request: &Value, text: &str) -> Value {
    let prompt_chars: usize = request["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|m| m["content"].as_str())
                .map(str::len)
                .sum()
        })
        .unwrap_or(0)
        + request["system"].as_str().map_or(0, str::len);
    let input = prompt_chars / 4;
    let output = text.split_whitespace().count();
    let model = request["model"].as_str().unwrap_or("fake");
    if api == "anthropic" {
        json!({
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": input, "output_tokens": output}
        })
    } else {
        json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "model": model,
            "system_fingerprint": "b0-unknown",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": input, "completion_tokens": output,
                      "total_tokens": input + output},
            "timings": {"predicted_per_second": 20.0}
        })
    }
}

/// The system prompt: Anthropic's `system` field, else OpenAI's first `system` message.
fn system_prompt(body: &Value) -> String {
    body["system"]
        .as_str()
        .or_else(|| {
            body["messages"]
                .as_array()?
                .iter()
                .find(|m| m["role"] == "system")?["content"]
                .as_str()
        })
        .unwrap_or("")
        .to_owned()
}

fn last_message(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_owned()
}
