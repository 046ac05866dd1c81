//! What both model APIs' codecs share, and the one place that picks a codec by API.
//!
//! The wire formats themselves are [`super::openai`] (chat completions) and
//! [`super::anthropic`] (Messages). Each builds two kinds of request, the engine's own
//! (judges, the simulated user, Fixie's LLM: plain text messages, [`WireRequest`]) and an
//! agent's under test (its history with tool calls and results, the offered tools,
//! [`ChatRequest`]), and reads every answer, whole or streamed, into one [`Answer`]: the
//! assistant message with its tool calls, the usage, the model and why it stopped.
//!
//! Pure functions apart from reading a stream: no panics on what a server sends. A body that
//! is not JSON, an `{"error": …}` body and a body of the wrong shape are [`DecodeError`]s,
//! which the engine's calls turn into [`LlmError`](super::LlmError)s and agents under test into
//! faults of the turn.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value};
use trellis_dsl::ProviderKind;

use super::{Completion, LlmMessage, anthropic, openai};
use crate::record::{ChatMessage, ToolCall};
use crate::record::{Fault, FaultCategory};
use crate::transport::Usage;
use crate::transport::quote::{error_text, preview};
use crate::transport::sse;

/// The parameters of one engine request, resolved against the provider's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct WireRequest<'a> {
    pub model: &'a str,
    pub messages: &'a [LlmMessage],
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    pub json_schema: Option<&'a Value>,
}

/// What an agent under test is asked with, besides its history.
#[derive(Clone, Copy, Debug)]
pub struct ChatRequest<'a> {
    pub model: &'a str,
    /// Sent first (chat completions) or apart (`system`, Anthropic).
    pub system_prompt: Option<&'a str>,
    /// The offered tools as chat-completions function definitions
    /// (`{"type":"function","function":{name, description, parameters}}`).
    pub tools: &'a [Value],
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    /// Ask for server-sent events.
    pub stream: bool,
}

/// What a model answered, whole or streamed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    /// The assistant message: its text (`None` when it only called tools) and tool calls.
    pub message: ChatMessage,
    pub usage: Option<Usage>,
    /// The model as the server reported it.
    pub model: Option<String>,
    /// `stop`, `length`, `tool_calls`, `end_turn`, `max_tokens`, …
    pub finish_reason: Option<String>,
}

impl Answer {
    /// The answer as the engine's own calls take it: text is required (a model that wrote
    /// nothing, or only called tools, did not answer the judge or play the user).
    pub fn into_completion(self) -> Result<Completion, DecodeError> {
        let Answer {
            message,
            usage,
            model,
            finish_reason,
        } = self;
        let Some(text) = message.content.filter(|t| !t.trim().is_empty()) else {
            return Err(DecodeError::Malformed(format!(
                "the model returned no text (finish reason {})",
                finish_reason.as_deref().unwrap_or("missing")
            )));
        };
        Ok(Completion {
            text,
            model,
            input_tokens: usage.and_then(|u| u.prompt_tokens),
            output_tokens: usage.and_then(|u| u.completion_tokens),
            finish_reason,
            priced_input_tokens: usage.and_then(|u| u.priced_prompt_tokens),
        })
    }
}

/// Why a whole answer could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("the response body is not JSON ({error}): {preview}")]
    NotJson { error: String, preview: String },
    /// The server put an error object in a 2xx body.
    #[error("{0}")]
    Provider(String),
    /// JSON of the wrong shape.
    #[error("{0}")]
    Malformed(String),
}

impl DecodeError {
    /// The fault of an agent under test that answered this.
    pub fn into_fault(self) -> Fault {
        match self {
            DecodeError::NotJson { .. } => Fault::new(FaultCategory::InvalidJson, self.to_string()),
            // The server reporting its own failure, as every protocol's agent error is.
            DecodeError::Provider(detail) => Fault::new(
                FaultCategory::AgentError,
                format!("the model answered with an error: {detail}"),
            ),
            DecodeError::Malformed(detail) => Fault::new(FaultCategory::Protocol, detail),
        }
    }
}

/// The path appended to a base URL: `/chat/completions` or `/messages`.
pub fn path(api: ProviderKind) -> &'static str {
    match api {
        ProviderKind::OpenAi => openai::PATH,
        ProviderKind::Anthropic => anthropic::PATH,
    }
}

/// The API root used when a provider sets no `base-url`.
pub fn default_base(api: ProviderKind) -> &'static str {
    match api {
        ProviderKind::OpenAi => openai::DEFAULT_BASE,
        ProviderKind::Anthropic => anthropic::DEFAULT_BASE,
    }
}

/// `{base}{path}`, unless the base already ends with the path. A query stays at the end
/// (Azure OpenAI's `?api-version=…`).
pub fn endpoint_text(api: ProviderKind, base: &str) -> String {
    let path = path(api);
    let (base, query) = base.split_at(base.find(['?', '#']).unwrap_or(base.len()));
    let base = base.trim_end_matches('/');
    if base.ends_with(path) {
        format!("{base}{query}")
    } else {
        format!("{base}{path}{query}")
    }
}

/// The headers the API itself needs (Anthropic's `anthropic-version`), added to `headers`.
pub fn api_headers(api: ProviderKind, headers: &mut HeaderMap) {
    if api == ProviderKind::Anthropic {
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(anthropic::VERSION),
        );
    }
}

/// The header an API key is sent in, and its value (`Bearer KEY` or the bare key).
pub fn key_header(api: ProviderKind, key: &str) -> (HeaderName, String) {
    match api {
        ProviderKind::OpenAi => (AUTHORIZATION, format!("Bearer {key}")),
        ProviderKind::Anthropic => (HeaderName::from_static("x-api-key"), key.to_owned()),
    }
}

/// The JSON body of an engine request.
pub fn encode(api: ProviderKind, request: &WireRequest<'_>) -> Value {
    match api {
        ProviderKind::OpenAi => openai::encode(request),
        ProviderKind::Anthropic => anthropic::encode(request),
    }
}

/// The JSON body of an agent's request for `history`.
pub fn chat_body(
    api: ProviderKind,
    request: &ChatRequest<'_>,
    history: &[ChatMessage],
) -> Result<Value, serde_json::Error> {
    match api {
        ProviderKind::OpenAi => openai::chat_body(request, history),
        ProviderKind::Anthropic => Ok(anthropic::chat_body(request, history)),
    }
}

/// Reads a whole 2xx answer.
pub fn decode(api: ProviderKind, body: &[u8]) -> Result<Answer, DecodeError> {
    let value = answer_json(body)?;
    match api {
        ProviderKind::OpenAi => openai::decode(&value, body),
        ProviderKind::Anthropic => anthropic::decode(&value, body),
    }
}

/// What a stream said as it went, kept when it ends in a fault: the text so far (shown on
/// the turn) and the usage reported so far (spent all the same).
#[derive(Debug, Default)]
pub struct Heard {
    pub text: Option<String>,
    pub usage: Option<Usage>,
}

/// The usage a whole answer reports, read apart from the answer: an answer that is not one
/// (no choices, no text) may still report what it spent.
pub fn usage_in(api: ProviderKind, body: &[u8]) -> Option<Usage> {
    let value: Value = serde_json::from_slice(body).ok()?;
    match api {
        ProviderKind::OpenAi => openai::decode_usage(value.get("usage")),
        ProviderKind::Anthropic => anthropic::usage_of(&value),
    }
}

/// Reads a streamed answer to its end. `first_content` is set to the time to the first
/// event that carries text or a tool call: the time to first token.
pub async fn read_stream(
    api: ProviderKind,
    stream: &mut sse::EventStream,
    first_content: &mut Option<Duration>,
    heard: &mut Heard,
) -> Result<Answer, Fault> {
    match api {
        ProviderKind::OpenAi => openai::read_chunks(stream, first_content, heard).await,
        ProviderKind::Anthropic => anthropic::read_events(stream, first_content, heard).await,
    }
}

/// A whole answer's JSON, when it is JSON and not an `{"error": …}` body (both APIs).
fn answer_json(body: &[u8]) -> Result<Value, DecodeError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| DecodeError::NotJson {
        error: e.to_string(),
        preview: preview(body),
    })?;
    if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
        return Err(DecodeError::Provider(error_text(error)));
    }
    Ok(value)
}

/// One streamed event's data as JSON (`what` names it in the fault: a chunk, an event).
pub(super) fn event_json(
    stream: &sse::EventStream,
    what: &str,
    data: &str,
) -> Result<Value, Fault> {
    serde_json::from_str(data).map_err(|e| {
        Fault::new(
            FaultCategory::InvalidJson,
            format!(
                "{what} {} is not JSON ({e}): {}",
                stream.count(),
                preview(data.as_bytes())
            ),
        )
    })
}

/// The assistant message a stream assembled; a stream with neither text nor tool calls
/// answered nothing.
pub(super) fn streamed_answer(
    text: Option<String>,
    tool_calls: Vec<ToolCall>,
    usage: Option<Usage>,
    model: Option<String>,
    finish_reason: Option<String>,
) -> Result<Answer, Fault> {
    if text.as_deref().is_none_or(str::is_empty)
        && tool_calls.is_empty()
        && !cut_at_token_limit(finish_reason.as_deref())
    {
        if refused(finish_reason.as_deref()) {
            return Ok(Answer {
                message: assistant(Some(String::new()), tool_calls),
                usage,
                model,
                finish_reason,
            });
        }
        return Err(Fault::new(
            FaultCategory::Protocol,
            format!(
                "the model streamed neither text nor tool calls (finish reason {})",
                finish_reason.as_deref().unwrap_or("missing")
            ),
        ));
    }
    Ok(Answer {
        message: assistant(text, tool_calls),
        usage,
        model,
        finish_reason,
    })
}

/// Whether a finish reason says the model refused or a content filter stopped it (OpenAI's
/// and Azure's `content_filter`, Anthropic's `refusal`): an answer, whatever text it has,
/// since refusing is what a jailbreak scenario checks for. With no text its reply is empty.
pub(crate) fn refused(reason: Option<&str>) -> bool {
    matches!(reason, Some("content_filter" | "refusal"))
}

/// Whether a finish reason says the model stopped at its output token limit (OpenAI's
/// `length`, Anthropic's `max_tokens` and `model_context_window_exceeded`): an answer then
/// is cut, perhaps before any text (a reasoning model that spent its budget thinking), and
/// is a fault of its own rather than an empty answer.
pub(crate) fn cut_at_token_limit(reason: Option<&str>) -> bool {
    matches!(
        reason,
        Some("length" | "max_tokens" | "model_context_window_exceeded")
    )
}

/// An assistant message with `text` and `tool_calls`.
pub(super) fn assistant(text: Option<String>, tool_calls: Vec<ToolCall>) -> ChatMessage {
    ChatMessage {
        role: "assistant".into(),
        content: text,
        tool_calls,
        ..Default::default()
    }
}

/// The model a whole answer names.
pub(super) fn model_of(value: &Value) -> Option<String> {
    value
        .get("model")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// Recorded tool-call arguments as a JSON value (not JSON: no parameters).
pub fn arguments_value(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::Object(Map::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model that refuses is answering (refusing is what a jailbreak scenario checks for),
    /// in each shape the APIs give it: Azure's content filter with no content, OpenAI's
    /// `refusal` beside a null content, Anthropic's `refusal` stop with no block, and a
    /// stream of no text that ends on `content_filter`. Any other answer of nothing is not
    /// one.
    #[test]
    fn a_refusal_is_an_answer_in_every_shape() {
        let text = |api, body: &[u8]| {
            decode(api, body)
                .map(|a| a.message.content)
                .map_err(|e| e.to_string())
        };
        let filtered = br#"{"choices":[{"message":{"role":"assistant","content":null},"finish_reason":"content_filter"}]}"#;
        assert_eq!(
            text(ProviderKind::OpenAi, filtered),
            Ok(Some(String::new()))
        );
        let refusal = br#"{"choices":[{"message":{"content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}]}"#;
        assert_eq!(
            text(ProviderKind::OpenAi, refusal),
            Ok(Some("I can't help with that.".to_owned()))
        );
        let anthropic = br#"{"content":[],"stop_reason":"refusal"}"#;
        assert_eq!(
            text(ProviderKind::Anthropic, anthropic),
            Ok(Some(String::new()))
        );
        let nothing = br#"{"choices":[{"message":{"content":null},"finish_reason":"stop"}]}"#;
        assert!(text(ProviderKind::OpenAi, nothing).is_err());
        let nothing = br#"{"content":[],"stop_reason":"end_turn"}"#;
        assert!(text(ProviderKind::Anthropic, nothing).is_err());
        let streamed = streamed_answer(None, Vec::new(), None, None, Some("content_filter".into()));
        assert_eq!(
            streamed.map(|a| a.message.content).ok(),
            Some(Some(String::new()))
        );
        let streamed = streamed_answer(None, Vec::new(), None, None, Some("stop".into()));
        assert!(streamed.is_err());
    }

    #[test]
    fn an_answer_that_is_not_one_still_reports_what_it_spent() {
        let body = br#"{"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107}}"#;
        assert!(decode(ProviderKind::OpenAi, body).is_err());
        let usage = usage_in(ProviderKind::OpenAi, body).unwrap();
        assert_eq!(usage.total_tokens, Some(107));
        let body = br#"{"content": [], "usage": {"input_tokens": 30, "output_tokens": 0}}"#;
        assert_eq!(
            usage_in(ProviderKind::Anthropic, body)
                .unwrap()
                .prompt_tokens,
            Some(30)
        );
    }
}
