//! `builtin="concierge"`: the order-desk model of [`crate::model`] behind Anthropic Messages,
//! for `protocol="anthropic"` suites and tests.
//!
//! `POST /v1/messages` (the agent's `base-url` is `http://127.0.0.1:PORT/v1`) takes
//! `{model, max_tokens, system?, messages, tools?, stream?, …}` with an `anthropic-version`
//! header, as the hosted API does: `system` is read past, message `content` is a text or
//! blocks (`text`; the assistant's `tool_use`; `tool_result` blocks of a user message
//! answering them by `tool_use_id`). It answers a `message` (`content` blocks: `text`, then
//! `tool_use` with its `input` object; `stop_reason` `end_turn` or `tool_use`; `usage`) or,
//! with `"stream": true`, typed events: `message_start`, a `ping`, per content block
//! `content_block_start`, its deltas (`text_delta` per word, `input_json_delta` in two
//! pieces) and `content_block_stop`, then `message_delta` (stop reason, output tokens) and
//! `message_stop`. A request without the version header, `model`, a positive `max_tokens`
//! or a non-empty `messages` array starting with a user message is a 400 with the API's
//! `error` object. The `model` asked for is echoed back (`concierge-1` when it is empty).

use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use crate::model::{self, Message, Reply};

/// The API root clients are given (`/messages` is appended by them).
pub const PATH: &str = "/v1";
/// The model named in answers when the request's is empty.
pub const MODEL: &str = "concierge-1";

static MESSAGES: AtomicU64 = AtomicU64::new(0);

pub fn router() -> Router {
    Router::new().route("/v1/messages", post(messages))
}

struct Request {
    model: String,
    messages: Vec<Message>,
    offered: Vec<String>,
    /// `tool_use` blocks earlier in the conversation, so new ids never repeat.
    calls_so_far: usize,
    stream: bool,
    input_tokens: u64,
}

async fn messages(headers: HeaderMap, body: Bytes) -> Response {
    if !headers.contains_key("anthropic-version") {
        return error(
            StatusCode::BAD_REQUEST,
            "anthropic-version: header is required",
        );
    }
    let request = match decode(&body) {
        Ok(request) => request,
        Err(message) => return error(StatusCode::BAD_REQUEST, &message),
    };
    let reply = model::answer(&request.messages, &request.offered);
    let id = format!(
        "msg_concierge_{}",
        MESSAGES.fetch_add(1, Ordering::Relaxed) + 1
    );
    if request.stream {
        stream(&request, &reply, &id)
    } else {
        let body = json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": request.model,
            "content": blocks(&request, &reply),
            "stop_reason": stop_reason(&reply),
            "stop_sequence": null,
            "usage": {"input_tokens": request.input_tokens, "output_tokens": output_tokens(&reply)},
        });
        (StatusCode::OK, axum::Json(body)).into_response()
    }
}

fn decode(body: &[u8]) -> Result<Request, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("invalid request body: {e}"))?;
    let Value::Object(object) = value else {
        return Err("invalid request body: expected an object".to_owned());
    };
    let model = match object.get("model") {
        Some(Value::String(model)) if model.is_empty() => MODEL.to_owned(),
        Some(Value::String(model)) => model.clone(),
        _ => return Err("model: Field required".to_owned()),
    };
    if object
        .get("max_tokens")
        .and_then(Value::as_u64)
        .is_none_or(|n| n == 0)
    {
        return Err("max_tokens: Field required (an integer of at least 1)".to_owned());
    }
    let Some(Value::Array(items)) = object.get("messages") else {
        return Err("messages: Field required".to_owned());
    };
    if items
        .first()
        .and_then(|m| m.get("role"))
        .and_then(Value::as_str)
        != Some("user")
    {
        return Err("messages: the first message must use the \"user\" role".to_owned());
    }
    let mut uses: Vec<(String, String)> = Vec::new();
    let mut messages = Vec::with_capacity(items.len());
    let mut input_tokens = text_of(object.get("system")).map_or(0, |s| model::tokens(&s));
    for (i, item) in items.iter().enumerate() {
        let role = item.get("role").and_then(Value::as_str);
        let content = item.get("content");
        let blocks: &[Value] = match content {
            Some(Value::Array(blocks)) => blocks,
            _ => &[],
        };
        match role {
            Some("user") => {
                for block in blocks
                    .iter()
                    .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
                {
                    let id = block
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    let name = uses
                        .iter()
                        .find(|(use_id, _)| use_id == id)
                        .map(|(_, name)| name.clone())
                        .ok_or_else(|| {
                            format!(
                                "messages.{i}: tool_result block for `{id}`, which no earlier \
                                 tool_use block has"
                            )
                        })?;
                    let result = text_of(block.get("content")).unwrap_or_default();
                    input_tokens += model::tokens(&result);
                    messages.push(Message::ToolResult {
                        name: Some(name),
                        content: result,
                    });
                }
                if let Some(text) = text_of(content).filter(|t| !t.is_empty()) {
                    input_tokens += model::tokens(&text);
                    messages.push(Message::User(text));
                }
            }
            Some("assistant") => {
                for block in blocks
                    .iter()
                    .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
                {
                    let field = |name: &str| {
                        block
                            .get(name)
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned()
                    };
                    uses.push((field("id"), field("name")));
                }
                input_tokens += text_of(content).map_or(0, |t| model::tokens(&t));
                messages.push(Message::Assistant);
            }
            _ => {
                return Err(format!(
                    "messages.{i}.role: Input should be 'user' or 'assistant'"
                ));
            }
        }
    }
    let offered = object
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|tool| tool.get("name")?.as_str())
        .map(str::to_owned)
        .collect();
    Ok(Request {
        model,
        messages,
        offered,
        calls_so_far: uses.len(),
        stream: object.get("stream").and_then(Value::as_bool) == Some(true),
        input_tokens,
    })
}

/// The text of a content value: a string, or its `text` blocks joined (`None` for neither).
fn text_of(content: Option<&Value>) -> Option<String> {
    match content {
        Some(Value::String(text)) => Some(text.clone()),
        Some(Value::Array(blocks)) => Some(
            blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect(),
        ),
        _ => None,
    }
}

fn use_id(request: &Request, n: usize) -> String {
    format!("toolu_{:02}", request.calls_so_far + n + 1)
}

fn stop_reason(reply: &Reply) -> &'static str {
    if reply.tool_calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    }
}

fn output_tokens(reply: &Reply) -> u64 {
    let calls: u64 = reply
        .tool_calls
        .iter()
        .map(|c| model::tokens(&c.arguments.to_string()) + 1)
        .sum();
    reply.text.as_deref().map_or(0, model::tokens) + calls
}

/// The answer's content blocks: its text, then its tool calls.
fn blocks(request: &Request, reply: &Reply) -> Vec<Value> {
    let mut blocks = Vec::new();
    if let Some(text) = &reply.text {
        blocks.push(json!({"type": "text", "text": text}));
    }
    for (n, call) in reply.tool_calls.iter().enumerate() {
        blocks.push(json!({
            "type": "tool_use",
            "id": use_id(request, n),
            "name": call.name,
            "input": call.arguments,
        }));
    }
    blocks
}

fn stream(request: &Request, reply: &Reply, id: &str) -> Response {
    let mut events: Vec<(&str, Value)> = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {
                "id": id,
                "type": "message",
                "role": "assistant",
                "model": request.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {"input_tokens": request.input_tokens, "output_tokens": 1},
            }}),
        ),
        ("ping", json!({"type": "ping"})),
    ];
    let mut index = 0;
    if let Some(text) = &reply.text {
        events.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "text", "text": ""}}),
        ));
        for piece in model::pieces(text) {
            events.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "text_delta", "text": piece}}),
            ));
        }
        events.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    for (n, call) in reply.tool_calls.iter().enumerate() {
        events.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": use_id(request, n), "name": call.name, "input": {},
            }}),
        ));
        let (head, tail) = model::argument_pieces(&call.arguments);
        for piece in [head, tail] {
            events.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "input_json_delta", "partial_json": piece}}),
            ));
        }
        events.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    events.push((
        "message_delta",
        json!({"type": "message_delta",
               "delta": {"stop_reason": stop_reason(reply), "stop_sequence": null},
               "usage": {"output_tokens": output_tokens(reply)}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    let frames = events
        .into_iter()
        .map(|(event, data)| format!("event: {event}\ndata: {data}\n\n"))
        .collect();
    crate::sse(frames)
}

/// The API's error object.
fn error(status: StatusCode, message: &str) -> Response {
    let body =
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}});
    (status, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_results_are_named_by_the_tool_use_they_answer() {
        let body = json!({
            "model": "m",
            "max_tokens": 100,
            "system": "be brief",
            "messages": [
                {"role": "user", "content": "Where is A-1?"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_01", "name": "get_order", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": "{\"status\": \"lost\"}"}
                ]},
            ],
        });
        let request = decode(body.to_string().as_bytes()).unwrap();
        assert_eq!(
            request.messages,
            [
                Message::User("Where is A-1?".into()),
                Message::Assistant,
                Message::ToolResult {
                    name: Some("get_order".into()),
                    content: "{\"status\": \"lost\"}".into()
                },
            ]
        );
        assert_eq!(use_id(&request, 0), "toolu_02");
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let user = r#"[{"role": "user", "content": "hi"}]"#;
        for (body, says) in [
            ("nope".to_owned(), "invalid request body"),
            (
                format!(r#"{{"max_tokens": 5, "messages": {user}}}"#),
                "model",
            ),
            (format!(r#"{{"model": "m", "messages": {user}}}"#), "max_tokens"),
            (
                r#"{"model": "m", "max_tokens": 5, "messages": [{"role": "assistant", "content": "x"}]}"#
                    .to_owned(),
                "first message",
            ),
            (
                r#"{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}"#
                    .to_owned(),
                "no earlier",
            ),
        ] {
            match decode(body.as_bytes()) {
                Err(message) => assert!(message.contains(says), "{body}: {message}"),
                Ok(_) => panic!("{body} was accepted"),
            }
        }
    }
}
