//! Request and response bodies of OpenAI-compatible chat completions and Anthropic Messages.
//!
//! Pure functions: no I/O, no panics on what a server sends. Decoding is lenient where real
//! servers differ (a `content` that is an array of parts, missing `usage`, extra fields such as
//! llama.cpp's `timings`) and strict where it matters (no text at all is an error, not an
//! empty answer).

use serde_json::{Map, Value, json};
use trellis_dsl::ProviderKind;

use super::{Completion, LlmMessage, Role};

/// The parameters of one request, resolved against the provider's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct WireRequest<'a> {
    pub model: &'a str,
    pub messages: &'a [LlmMessage],
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    pub json_schema: Option<&'a Value>,
}

/// Anthropic requires `max_tokens`; this is sent when neither the call nor the provider sets it.
pub const ANTHROPIC_DEFAULT_MAX_TOKENS: u32 = 1024;

/// The `anthropic-version` header value the Messages API is spoken in.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The JSON body of a request.
pub fn encode(kind: ProviderKind, request: &WireRequest<'_>) -> Value {
    match kind {
        ProviderKind::OpenAi => encode_openai(request),
        ProviderKind::Anthropic => encode_anthropic(request),
    }
}

fn encode_openai(request: &WireRequest<'_>) -> Value {
    let messages: Vec<Value> = alternating(request.messages)
        .into_iter()
        .map(|(role, content)| json!({"role": role_name(role), "content": content}))
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("stream".into(), json!(false));
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(n) = request.max_tokens {
        body.insert("max_tokens".into(), json!(n));
    }
    if let Some(schema) = request.json_schema {
        // Structured output: the hosted API, vLLM and llama.cpp constrain generation to the
        // schema; servers that ignore it still get the schema in the prompt from the caller.
        body.insert(
            "response_format".into(),
            json!({
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema, "strict": true}
            }),
        );
    }
    Value::Object(body)
}

fn encode_anthropic(request: &WireRequest<'_>) -> Value {
    // System messages go in `system`; the rest must alternate user/assistant and start with
    // a user message, so consecutive messages of one role are merged.
    let system: Vec<&str> = request
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(|m| m.content.as_str())
        .collect();
    let mut turns: Vec<(Role, String)> = Vec::new();
    for m in request.messages.iter().filter(|m| m.role != Role::System) {
        match turns.last_mut() {
            Some((role, text)) if *role == m.role => {
                text.push_str("\n\n");
                text.push_str(&m.content);
            }
            _ => turns.push((m.role, m.content.clone())),
        }
    }
    if turns.first().is_none_or(|(role, _)| *role != Role::User) {
        turns.insert(0, (Role::User, "(The conversation starts.)".to_owned()));
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, content)| json!({"role": role_name(role), "content": content}))
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert(
        "max_tokens".into(),
        json!(request.max_tokens.unwrap_or(ANTHROPIC_DEFAULT_MAX_TOKENS)),
    );
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    body.insert("messages".into(), Value::Array(messages));
    if let Some(t) = request.temperature {
        // Anthropic accepts 0–1.
        body.insert("temperature".into(), json!(t.clamp(0.0, 1.0)));
    }
    Value::Object(body)
}

/// The messages as strict chat templates take them (the ones llama.cpp applies for Mistral or
/// Gemma models fail the request otherwise): system messages first, then user and assistant
/// alternating from a user message. Consecutive messages of one role are joined, and a
/// conversation whose first turn is the assistant's (a simulated user speaking first, seen
/// from its side) gets an opening user line.
fn alternating(messages: &[LlmMessage]) -> Vec<(Role, String)> {
    let mut out: Vec<(Role, String)> = Vec::with_capacity(messages.len() + 1);
    for m in messages.iter().filter(|m| m.role == Role::System) {
        match out.last_mut() {
            Some((_, text)) => {
                text.push_str("\n\n");
                text.push_str(&m.content);
            }
            None => out.push((Role::System, m.content.clone())),
        }
    }
    let system = out.len();
    for m in messages.iter().filter(|m| m.role != Role::System) {
        let after_system = out.len() > system;
        match out.last_mut() {
            Some((role, text)) if after_system && *role == m.role => {
                text.push_str("\n\n");
                text.push_str(&m.content);
            }
            _ => out.push((m.role, m.content.clone())),
        }
    }
    if out
        .get(system)
        .is_some_and(|(role, _)| *role == Role::Assistant)
    {
        out.insert(
            system,
            (Role::User, "(The conversation starts.)".to_owned()),
        );
    }
    out
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

/// Why a response body could not be read as an answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{0}")]
    Malformed(String),
    /// The server put an error object in a 2xx body.
    #[error("{0}")]
    Provider(String),
}

/// Reads a 2xx response body.
pub fn decode(kind: ProviderKind, body: &[u8]) -> Result<Completion, DecodeError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| DecodeError::Malformed(format!("not JSON ({e}): {}", preview(body))))?;
    if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
        let detail = error
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| error.to_string(), str::to_owned);
        return Err(DecodeError::Provider(detail));
    }
    match kind {
        ProviderKind::OpenAi => decode_openai(&value),
        ProviderKind::Anthropic => decode_anthropic(&value),
    }
}

fn decode_openai(value: &Value) -> Result<Completion, DecodeError> {
    let choice = value
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| {
            DecodeError::Malformed(format!("no `choices[0]` in {}", preview_value(value)))
        })?;
    let message = choice.get("message").unwrap_or(&Value::Null);
    let text = match message.get("content") {
        Some(Value::String(s)) => Some(s.clone()),
        // Some servers send content parts: keep the text ones.
        Some(Value::Array(parts)) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            (!texts.is_empty()).then(|| texts.concat())
        }
        _ => None,
    };
    let text = text.filter(|t| !t.trim().is_empty()).ok_or_else(|| {
        DecodeError::Malformed(format!(
            "the model returned no text (finish_reason {})",
            choice
                .get("finish_reason")
                .map_or_else(|| "missing".to_owned(), Value::to_string)
        ))
    })?;
    Ok(completion(
        value,
        text,
        ("prompt_tokens", "completion_tokens"),
        choice.get("finish_reason"),
    ))
}

fn decode_anthropic(value: &Value) -> Result<Completion, DecodeError> {
    let blocks = value
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            DecodeError::Malformed(format!("no `content` in {}", preview_value(value)))
        })?;
    let text: String = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    if text.trim().is_empty() {
        return Err(DecodeError::Malformed(format!(
            "the model returned no text (stop_reason {})",
            value
                .get("stop_reason")
                .map_or_else(|| "missing".to_owned(), Value::to_string)
        )));
    }
    Ok(completion(
        value,
        text,
        ("input_tokens", "output_tokens"),
        value.get("stop_reason"),
    ))
}

/// The completion of an answer `value` whose text is `text`: its model, the usage under the
/// API's `(input, output)` token names, and why it stopped.
fn completion(
    value: &Value,
    text: String,
    (input, output): (&str, &str),
    finish_reason: Option<&Value>,
) -> Completion {
    let usage = value.get("usage");
    let tokens = |name: &str| usage.and_then(|u| u.get(name)).and_then(Value::as_u64);
    Completion {
        text,
        model: value
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned),
        input_tokens: tokens(input),
        output_tokens: tokens(output),
        finish_reason: finish_reason.and_then(Value::as_str).map(str::to_owned),
    }
}

const PREVIEW_CHARS: usize = 200;

fn preview(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "empty body".to_owned();
    }
    let mut chars = text.chars();
    let mut out: String = chars.by_ref().take(PREVIEW_CHARS).collect();
    if chars.next().is_some() {
        out.push('…');
    }
    format!("{out:?}")
}

fn preview_value(value: &Value) -> String {
    preview(value.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_messages_alternate_from_a_user_message() {
        let messages = [
            LlmMessage::system("You play a customer."),
            LlmMessage::assistant("Hi, I need a cleaning."),
            LlmMessage::user("Sure, where?"),
            LlmMessage::user("(Your previous answer was empty.)"),
        ];
        let request = WireRequest {
            model: "m",
            messages: &messages,
            temperature: None,
            max_tokens: None,
            json_schema: None,
        };
        let body = encode(ProviderKind::OpenAi, &request);
        let roles: Vec<&str> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert_eq!(
            body["messages"][3]["content"],
            "Sure, where?\n\n(Your previous answer was empty.)"
        );
    }

    fn request<'a>(messages: &'a [LlmMessage]) -> WireRequest<'a> {
        WireRequest {
            model: "m",
            messages,
            temperature: Some(1.5),
            max_tokens: None,
            json_schema: None,
        }
    }

    #[test]
    fn anthropic_takes_system_apart_merges_roles_and_starts_with_user() {
        let messages = [
            LlmMessage::system("be brief"),
            LlmMessage::assistant("Hi, how can I help?"),
            LlmMessage::user("a"),
            LlmMessage::user("b"),
        ];
        let body = encode(ProviderKind::Anthropic, &request(&messages));
        assert_eq!(body["system"], "be brief");
        assert_eq!(body["max_tokens"], ANTHROPIC_DEFAULT_MAX_TOKENS);
        assert_eq!(body["temperature"], 1.0);
        let sent = body["messages"].as_array().unwrap();
        let roles: Vec<&str> = sent.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "assistant", "user"]);
        assert_eq!(sent[2]["content"], "a\n\nb");
    }

    #[test]
    fn openai_answers_in_every_shape_seen() {
        let plain = br#"{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],
            "usage":{"prompt_tokens":5,"completion_tokens":2},"model":"x","timings":{}}"#;
        let c = decode(ProviderKind::OpenAi, plain).unwrap();
        assert_eq!(
            (c.text.as_str(), c.input_tokens, c.output_tokens),
            ("hi", Some(5), Some(2))
        );
        let parts = br#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}"#;
        assert_eq!(decode(ProviderKind::OpenAi, parts).unwrap().text, "ab");
        let empty = br#"{"choices":[{"message":{"content":""},"finish_reason":"length"}]}"#;
        assert!(matches!(
            decode(ProviderKind::OpenAi, empty),
            Err(DecodeError::Malformed(m)) if m.contains("no text")
        ));
        let error = br#"{"error":{"message":"model not loaded"}}"#;
        assert_eq!(
            decode(ProviderKind::OpenAi, error),
            Err(DecodeError::Provider("model not loaded".into()))
        );
        assert!(matches!(
            decode(ProviderKind::OpenAi, b"<html>"),
            Err(DecodeError::Malformed(m)) if m.contains("not JSON")
        ));
    }

    #[test]
    fn anthropic_text_blocks_are_joined() {
        let body =
            br#"{"content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"ok"}],
            "stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}"#;
        let c = decode(ProviderKind::Anthropic, body).unwrap();
        assert_eq!(c.text, "ok");
        assert_eq!(c.finish_reason.as_deref(), Some("end_turn"));
        assert_eq!(c.input_tokens, Some(3));
    }
}
