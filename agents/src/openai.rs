//! `builtin="clerk"`: the order-desk model of [`crate::model`] behind an OpenAI-compatible
//! chat completions API, for `protocol="openai"` suites and tests.
//!
//! `POST /v1/chat/completions` (the agent's `base-url` is `http://127.0.0.1:PORT/v1`) takes
//! `{model, messages, tools?, stream?, stream_options?, …}` as the hosted API does: `system`
//! and `developer` messages are read past, `user` content is a text or text parts, `tool`
//! messages answer the assistant's earlier `tool_calls` (by `tool_call_id`). It answers a
//! `chat.completion` (`choices[0].message` with `content` and `tool_calls`, each call's
//! `arguments` a JSON string, `finish_reason` `stop` or `tool_calls`, `usage`) or, with
//! `stream: true`, `chat.completion.chunk` events: the role, the words of the text, each
//! tool call's id and name then its arguments in two pieces, the finish reason, a usage chunk
//! when `stream_options.include_usage` asks for one, then `data: [DONE]`. A body that is not
//! a JSON object or has no non-empty `messages` array is a 400 with the API's `error` object.
//! The `model` asked for is echoed back (`clerk-1` when none is).

use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Map, Value, json};

use crate::model::{self, Message, Reply};

/// The API root clients are given (`/chat/completions` is appended by them).
pub const PATH: &str = "/v1";
/// The model named in answers when the request names none.
pub const MODEL: &str = "clerk-1";

static COMPLETIONS: AtomicU64 = AtomicU64::new(0);

pub fn router() -> Router {
    Router::new().route("/v1/chat/completions", post(complete))
}

/// What a request asks for, decoded.
struct Request {
    model: String,
    messages: Vec<Message>,
    offered: Vec<String>,
    /// Tool calls the assistant made earlier in the conversation, to name a tool result.
    calls_so_far: usize,
    stream: bool,
    include_usage: bool,
    prompt_tokens: u64,
}

async fn complete(body: Bytes) -> Response {
    let request = match decode(&body) {
        Ok(request) => request,
        Err(message) => return error(StatusCode::BAD_REQUEST, &message),
    };
    let reply = model::answer(&request.messages, &request.offered);
    let id = format!(
        "chatcmpl-clerk-{}",
        COMPLETIONS.fetch_add(1, Ordering::Relaxed) + 1
    );
    if request.stream {
        stream(&request, &reply, &id)
    } else {
        whole(&request, &reply, &id)
    }
}

fn decode(body: &[u8]) -> Result<Request, String> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| format!("We could not parse the JSON body of your request: {e}"))?;
    let Value::Object(object) = value else {
        return Err("The request body must be a JSON object.".to_owned());
    };
    let Some(Value::Array(items)) = object.get("messages") else {
        return Err("'messages' is a required property and must be an array.".to_owned());
    };
    if items.is_empty() {
        return Err("'messages' must contain at least one message.".to_owned());
    }
    // Tool names by call id, from the assistant's calls, to name each tool result.
    let mut call_names: Vec<(String, String)> = Vec::new();
    let mut messages = Vec::with_capacity(items.len());
    let mut prompt_tokens = 0;
    for (i, item) in items.iter().enumerate() {
        let role = item.get("role").and_then(Value::as_str).ok_or_else(|| {
            format!("messages[{i}] has no 'role': each message needs one (user, assistant, …).")
        })?;
        let content = text_of(item.get("content"));
        prompt_tokens += model::tokens(&content);
        match role {
            "system" | "developer" => {}
            "user" => messages.push(Message::User(content)),
            "assistant" => {
                for call in item
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
                    let name = call
                        .get("function")
                        .and_then(|f| f.get("name"))
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    call_names.push((id.to_owned(), name.to_owned()));
                }
                messages.push(Message::Assistant);
            }
            "tool" => {
                let id = item
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        format!("messages[{i}] is a 'tool' message without 'tool_call_id'.")
                    })?;
                let name = call_names
                    .iter()
                    .find(|(call, _)| call == id)
                    .map(|(_, name)| name.clone())
                    .ok_or_else(|| {
                        format!(
                            "messages[{i}] answers tool call '{id}', which no earlier \
                             assistant message made."
                        )
                    })?;
                messages.push(Message::ToolResult {
                    name: Some(name),
                    content,
                });
            }
            other => {
                return Err(format!(
                    "messages[{i}].role '{other}' is not one of system, developer, user, \
                     assistant, tool."
                ));
            }
        }
    }
    let offered = object
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|tool| tool.get("function")?.get("name")?.as_str())
        .map(str::to_owned)
        .collect();
    let model = object
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .unwrap_or(MODEL)
        .to_owned();
    Ok(Request {
        model,
        messages,
        offered,
        calls_so_far: call_names.len(),
        stream: object.get("stream").and_then(Value::as_bool) == Some(true),
        include_usage: object
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            == Some(true),
        prompt_tokens,
    })
}

/// A message's content as text: a string, or the text of its parts.
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// The id of the `n`th tool call of the reply: numbered after the conversation's earlier
/// calls, so ids never repeat within a conversation (and a fork numbers alike).
fn call_id(request: &Request, n: usize) -> String {
    format!("call_{}", request.calls_so_far + n + 1)
}

fn finish_reason(reply: &Reply) -> &'static str {
    if reply.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

fn usage(request: &Request, reply: &Reply) -> Value {
    let completion = completion_tokens(reply);
    json!({
        "prompt_tokens": request.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": request.prompt_tokens + completion,
    })
}

fn completion_tokens(reply: &Reply) -> u64 {
    let calls: u64 = reply
        .tool_calls
        .iter()
        .map(|c| model::tokens(&c.arguments.to_string()) + 1)
        .sum();
    reply.text.as_deref().map_or(0, model::tokens) + calls
}

fn created() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn whole(request: &Request, reply: &Reply, id: &str) -> Response {
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    message.insert("content".into(), json!(reply.text));
    if !reply.tool_calls.is_empty() {
        let calls: Vec<Value> = reply
            .tool_calls
            .iter()
            .enumerate()
            .map(|(n, call)| {
                json!({
                    "id": call_id(request, n),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments.to_string()},
                })
            })
            .collect();
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    let body = json!({
        "id": id,
        "object": "chat.completion",
        "created": created(),
        "model": request.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_reason(reply),
        }],
        "usage": usage(request, reply),
    });
    (StatusCode::OK, axum::Json(body)).into_response()
}

fn stream(request: &Request, reply: &Reply, id: &str) -> Response {
    let created = created();
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": request.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
    };
    // The role comes first with empty content, as the hosted API streams it.
    let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    for piece in model::pieces(reply.text.as_deref().unwrap_or_default()) {
        events.push(chunk(json!({ "content": piece }), None));
    }
    for (n, call) in reply.tool_calls.iter().enumerate() {
        events.push(chunk(
            json!({"tool_calls": [{
                "index": n,
                "id": call_id(request, n),
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }]}),
            None,
        ));
        let (head, tail) = model::argument_pieces(&call.arguments);
        for piece in [head, tail] {
            events.push(chunk(
                json!({"tool_calls": [{"index": n, "function": {"arguments": piece}}]}),
                None,
            ));
        }
    }
    events.push(chunk(json!({}), Some(finish_reason(reply))));
    if request.include_usage {
        events.push(json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": request.model,
            "choices": [],
            "usage": usage(request, reply),
        }));
    }
    let mut frames: Vec<String> = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    frames.push("data: [DONE]\n\n".to_owned());
    crate::sse(frames)
}

/// The API's error object.
fn error(status: StatusCode, message: &str) -> Response {
    let body = json!({"error": {
        "message": message,
        "type": "invalid_request_error",
        "param": null,
        "code": null,
    }});
    (status, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_results_are_named_by_the_call_they_answer() {
        let body = json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "Where is A-1?"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_order", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"status\": \"lost\"}"},
            ],
        });
        let request = decode(body.to_string().as_bytes()).unwrap();
        assert_eq!(request.calls_so_far, 1);
        assert_eq!(
            request.messages[2],
            Message::ToolResult {
                name: Some("get_order".into()),
                content: "{\"status\": \"lost\"}".into()
            }
        );
        assert_eq!(call_id(&request, 0), "call_2");
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        for (body, says) in [
            ("not json", "could not parse"),
            ("[]", "JSON object"),
            (r#"{"messages": []}"#, "at least one"),
            (r#"{"messages": [{"content": "hi"}]}"#, "no 'role'"),
            (
                r#"{"messages": [{"role": "tool", "tool_call_id": "x", "content": "1"}]}"#,
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
