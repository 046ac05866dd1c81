//! `builtin="langserve"`: a deterministic chat agent shaped like a LangServe app serving a
//! tool-calling chat runnable, for `protocol="http"` suites and tests.
//!
//! `POST /agent/invoke` takes LangServe's `{"input": …, "config": {…}, "kwargs": {…}}`
//! where `input` is the conversation (a list of LangChain messages, `{"type", "content"}`
//! each; one without `type` is a 422 as on LangServe), one message, or a text, and answers `{"output": AIMessage, "metadata": {run_id,
//! feedback_tokens}}` with the message serialised as LangServe does (`content`,
//! `additional_kwargs`, `type: "ai"`, `tool_calls: [{name, args, id, type: "tool_call"}]`,
//! …). `POST /agent/stream` takes the same body and answers server-sent events: `event:
//! metadata` with the run id, `event: data` per chunk (`AIMessageChunk`s: the words of the
//! answer, then each tool call as `tool_call_chunks` fragments, as a chat model streams
//! it), then `event: end`. A body that is not JSON, or
//! has no `input`, gets HTTP 422 as from FastAPI.
//!
//! What it answers (to the last human message):
//! - `weather in CITY`: a `get_weather` tool call with `{"city": CITY}` and a short text;
//! - `what did I ask`: the earlier human messages of the conversation it was sent (so a
//!   history the client did not resend is visible);
//! - anything else: `Echo: TEXT`.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use regex::Regex;
use serde_json::{Value, json};

/// Where the agent answers with one JSON body (the `/stream` route is next to it).
pub const PATH: &str = "/agent/invoke";
/// The tool the agent calls for weather questions.
pub const TOOL: &str = "get_weather";

static CITY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\bweather\s+(?:in|for)\s+([a-z][a-z' \-]*[a-z])")
        .expect("the city pattern is a valid regex")
});

static RUNS: AtomicU64 = AtomicU64::new(0);

pub fn router() -> Router {
    Router::new()
        .route(PATH, post(invoke))
        .route("/agent/stream", post(stream))
}

async fn invoke(body: Bytes) -> Response {
    let (run_id, message) = match answer_request(&body) {
        Ok(answer) => answer,
        Err(detail) => return unprocessable(detail),
    };
    let body = json!({
        "output": message,
        "metadata": {"run_id": run_id, "feedback_tokens": []},
    });
    (StatusCode::OK, axum::Json(body)).into_response()
}

async fn stream(body: Bytes) -> Response {
    let (run_id, message) = match answer_request(&body) {
        Ok(answer) => answer,
        Err(detail) => return unprocessable(detail),
    };
    let mut frames = vec![frame("metadata", &json!({"run_id": run_id}))];
    let content = message["content"].as_str().unwrap_or_default().to_owned();
    let words: Vec<String> = content
        .split_inclusive(' ')
        .map(str::to_owned)
        .collect::<Vec<_>>();
    for word in &words {
        frames.push(frame("data", &chunk(word, json!([]), json!([]), json!([]))));
    }
    // A chat model's tool call comes as `tool_call_chunks` fragments of one `index`: the
    // name and id with no arguments, then the argument text in pieces. Each chunk's
    // `tool_calls` is what LangChain parses from that chunk's fragment alone: `{` parses
    // (partially) to `{}`, with an empty name and no id; the rest does not parse by
    // itself and is an `invalid_tool_call`.
    let calls = message["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (index, call) in calls.iter().enumerate() {
        let (name, id) = (&call["name"], &call["id"]);
        let fragment = |name: &Value, id: &Value, args: &str| json!([{"name": name, "args": args, "id": id, "index": index, "type": "tool_call_chunk"}]);
        frames.push(frame(
            "data",
            &chunk(
                "",
                json!([{"name": name, "args": {}, "id": id, "type": "tool_call"}]),
                json!([]),
                fragment(name, id, ""),
            ),
        ));
        let args = call["args"].to_string();
        let (head, rest) = args.split_at_checked(1).unwrap_or((&args, ""));
        frames.push(frame(
            "data",
            &chunk(
                "",
                json!([{"name": "", "args": {}, "id": null, "type": "tool_call"}]),
                json!([]),
                fragment(&Value::Null, &Value::Null, head),
            ),
        ));
        frames.push(frame(
            "data",
            &chunk(
                "",
                json!([]),
                json!([{"name": null, "args": rest, "id": null, "error": null, "type": "invalid_tool_call"}]),
                fragment(&Value::Null, &Value::Null, rest),
            ),
        ));
    }
    if words.is_empty() && calls.is_empty() {
        frames.push(frame("data", &chunk("", json!([]), json!([]), json!([]))));
    }
    frames.push("event: end\r\n\r\n".to_owned());
    crate::sse(frames)
}

fn frame(event: &str, data: &Value) -> String {
    format!("event: {event}\r\ndata: {data}\r\n\r\n")
}

/// An `AIMessageChunk` as LangServe streams it.
fn chunk(content: &str, tool_calls: Value, invalid: Value, tool_call_chunks: Value) -> Value {
    json!({
        "content": content,
        "additional_kwargs": {},
        "response_metadata": {},
        "type": "AIMessageChunk",
        "name": null,
        "id": null,
        "tool_calls": tool_calls,
        "invalid_tool_calls": invalid,
        "usage_metadata": null,
        "tool_call_chunks": tool_call_chunks,
    })
}

/// A 422 with FastAPI's `detail`.
fn unprocessable(detail: Value) -> Response {
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        axum::Json(json!({ "detail": detail })),
    )
        .into_response()
}

/// The run id and the `AIMessage` answering the request, or the `detail` of the 422 a bad
/// one gets.
fn answer_request(body: &[u8]) -> Result<(String, Value), Value> {
    let request: Value = serde_json::from_slice(body).map_err(|_| json!(["Invalid JSON body"]))?;
    let input = request.get("input").ok_or_else(
        || json!([{"type": "missing", "loc": ["body", "input"], "msg": "Field required"}]),
    )?;
    // As LangServe validates a list of LangChain messages: each needs its `type`.
    if let Value::Array(items) = input
        && let Some(i) = items.iter().position(|m| m.get("type").is_none())
    {
        return Err(json!([{"type": "missing", "loc": [i, "type"],
            "msg": "Field required", "input": items[i]}]));
    }
    let humans = human_texts(input);
    let run = RUNS.fetch_add(1, Ordering::Relaxed) + 1;
    let run_id = format!("00000000-0000-4000-8000-{run:012}");
    let last = humans.last().map(String::as_str).unwrap_or_default();
    let (content, tool_calls) = if let Some(city) = CITY.captures(last).and_then(|c| c.get(1)) {
        let city = city.as_str().trim();
        (
            format!("Let me check the weather in {city}."),
            json!([{
                "name": TOOL,
                "args": {"city": city},
                "id": format!("call_{run}"),
                "type": "tool_call",
            }]),
        )
    } else if last.to_lowercase().contains("what did i ask") {
        let earlier = &humans[..humans.len().saturating_sub(1)];
        if earlier.is_empty() {
            ("You have not asked anything before.".to_owned(), json!([]))
        } else {
            (format!("You asked: {}", earlier.join(" | ")), json!([]))
        }
    } else {
        (format!("Echo: {last}"), json!([]))
    };
    let message = json!({
        "content": content,
        "additional_kwargs": {},
        "response_metadata": {},
        "type": "ai",
        "name": null,
        "id": null,
        "tool_calls": tool_calls,
        "invalid_tool_calls": [],
        "usage_metadata": null,
    });
    Ok((run_id, message))
}

/// The human messages' texts in `input`: a list of messages, `{"messages": […]}`, one
/// message, or a text.
fn human_texts(input: &Value) -> Vec<String> {
    let messages: Vec<&Value> = match input {
        Value::String(_) => return vec![input.as_str().unwrap_or_default().to_owned()],
        Value::Array(items) => items.iter().collect(),
        Value::Object(map) => match map.get("messages") {
            Some(Value::Array(items)) => items.iter().collect(),
            _ => vec![input],
        },
        _ => Vec::new(),
    };
    messages
        .into_iter()
        .filter(|m| {
            let role = m
                .get("role")
                .or_else(|| m.get("type"))
                .and_then(Value::as_str);
            matches!(role, Some("user" | "human"))
        })
        .filter_map(|m| m.get("content").and_then(Value::as_str).map(str::to_owned))
        .collect()
}
