//! Anthropic Messages: request bodies, whole answers, streamed events, tool use and usage.
//!
//! The API differs from chat completions in ways the engine's messages must be folded into:
//! the system prompt goes apart (`system`), `max_tokens` is required, temperatures stop at 1,
//! messages alternate strictly from a user message, tool calls are `tool_use` blocks of the
//! assistant message and their results `tool_result` blocks of one user message per round.
//! A stream is typed events (`message_start`, `content_block_start`/`_delta`/`_stop` per
//! content block, `message_delta`, `message_stop`; `ping` is a heartbeat) rather than chunks.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::Role;
use super::codec::{self, Answer, ChatRequest, DecodeError, WireRequest};
use crate::record::{ChatMessage, ToolCall, ToolCallFunction};
use crate::record::{Fault, FaultCategory};
use crate::transport::Usage;
use crate::transport::quote::{error_text, preview};
use crate::transport::sse;

/// Appended to the API root.
pub const PATH: &str = "/messages";
/// The API root of a provider without `base-url`.
pub const DEFAULT_BASE: &str = "https://api.anthropic.com/v1";
/// The `anthropic-version` header value the API is spoken in (an agent's own `header`
/// overrides it).
pub const VERSION: &str = "2023-06-01";
/// Sent when neither the call, the agent nor the provider sets `max_tokens`, which the API
/// requires.
pub const DEFAULT_MAX_TOKENS: u32 = 1024;

/// The body of an engine request (judge, simulated user, Fixie's LLM). No structured output
/// here: the caller's prompt asks for JSON.
pub fn encode(request: &WireRequest<'_>) -> Value {
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
        .map(|(role, content)| json!({"role": super::openai::role_name(role), "content": content}))
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert(
        "max_tokens".into(),
        json!(request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
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

/// An Anthropic Messages request: the system prompt apart, tool calls as `tool_use` blocks,
/// the results of one round as `tool_result` blocks of one user message.
pub fn chat_body(request: &ChatRequest<'_>, history: &[ChatMessage]) -> Value {
    let mut messages: Vec<Value> = Vec::with_capacity(history.len());
    for message in history {
        match message.role.as_str() {
            "assistant" => {
                let mut blocks = Vec::new();
                if let Some(text) = message.content.as_deref().filter(|t| !t.is_empty()) {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                for call in &message.tool_calls {
                    blocks.push(json!({
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.function.name,
                        "input": codec::arguments_value(&call.function.arguments),
                    }));
                }
                messages.push(json!({"role": "assistant", "content": blocks}));
            }
            "tool" => {
                let block = json!({
                    "type": "tool_result",
                    "tool_use_id": message.tool_call_id.clone().unwrap_or_default(),
                    "content": message.content.clone().unwrap_or_default(),
                });
                // Consecutive results answer one round: one user message.
                let round = messages.last_mut().and_then(|last| {
                    let is_results = last["role"] == "user"
                        && last["content"]
                            .as_array()
                            .and_then(|blocks| blocks.first())
                            .is_some_and(|b| b["type"] == "tool_result");
                    if is_results {
                        last["content"].as_array_mut()
                    } else {
                        None
                    }
                });
                match round {
                    Some(blocks) => blocks.push(block),
                    None => messages.push(json!({"role": "user", "content": [block]})),
                }
            }
            _ => messages.push(json!({
                "role": "user",
                "content": message.content.clone().unwrap_or_default(),
            })),
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), Value::String(request.model.to_owned()));
    body.insert(
        "max_tokens".into(),
        json!(request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
    );
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t.clamp(0.0, 1.0)));
    }
    if let Some(prompt) = request.system_prompt {
        body.insert("system".into(), Value::String(prompt.to_owned()));
    }
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|tool| {
                let function = &tool["function"];
                let mut out = Map::new();
                out.insert("name".into(), function["name"].clone());
                if let Some(description) = function.get("description") {
                    out.insert("description".into(), description.clone());
                }
                out.insert("input_schema".into(), function["parameters"].clone());
                Value::Object(out)
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if request.stream {
        body.insert("stream".into(), Value::Bool(true));
    }
    Value::Object(body)
}

/// An Anthropic Messages answer: its text blocks joined, its `tool_use` blocks as tool calls.
pub fn decode(value: &Value, body: &[u8]) -> Result<Answer, DecodeError> {
    let blocks = value
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            DecodeError::Malformed(format!(
                "the answer has no `content` array: {}",
                preview(body)
            ))
        })?;
    let mut text: Option<String> = None;
    let mut tool_calls = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                if let Some(piece) = block.get("text").and_then(Value::as_str) {
                    text.get_or_insert_with(String::new).push_str(piece);
                }
            }
            Some("tool_use") => {
                let name = block
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| {
                        DecodeError::Malformed(format!("`tool_use` block {index} has no `name`"))
                    })?;
                let id = block
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|id| !id.is_empty())
                    .map_or_else(|| format!("toolu_{index}"), str::to_owned);
                let input = block.get("input").cloned().unwrap_or(json!({}));
                tool_calls.push(ToolCall {
                    id,
                    kind: "function".into(),
                    function: ToolCallFunction {
                        name: name.to_owned(),
                        arguments: input.to_string(),
                    },
                });
            }
            // Thinking and other blocks are not part of the answer.
            _ => {}
        }
    }
    let stop_reason = value
        .get("stop_reason")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if text.is_none() && tool_calls.is_empty() && !codec::cut_at_token_limit(stop_reason.as_deref())
    {
        if !codec::refused(stop_reason.as_deref()) {
            return Err(DecodeError::Malformed(format!(
                "the model answered with neither text nor tool calls (stop reason {})",
                stop_reason.as_deref().unwrap_or("missing")
            )));
        }
        // Refused without a word: an answer, and its reply is empty.
        text = Some(String::new());
    }
    let usage = usage_of(value);
    Ok(Answer {
        message: codec::assistant(text, tool_calls),
        usage,
        model: codec::model_of(value),
        finish_reason: stop_reason,
    })
}

/// A content block of a streamed Anthropic answer, as its events arrive.
enum StreamedBlock {
    Text,
    ToolUse {
        id: String,
        name: String,
        /// The `input_json_delta` fragments so far.
        input: String,
        /// The parsed input, once the block stopped.
        parsed: Option<Value>,
    },
    /// Thinking and other blocks are not part of the answer.
    Other,
}

/// A whole answer's `usage`, when it has one.
pub(super) fn usage_of(value: &Value) -> Option<Usage> {
    value.get("usage").filter(|u| u.is_object()).map(|u| {
        let output = u.get("output_tokens").and_then(Value::as_u64);
        tokens(Prompt::of(u), output).unwrap_or_default()
    })
}

/// An answer's prompt tokens. With prompt caching, `input_tokens` counts only those after
/// the last cache breakpoint; the prompt is those plus the tokens written to the cache
/// (`cache_creation_input_tokens`) and read from it (`cache_read_input_tokens`), which are
/// billed at other rates: written at 1.25× the input price (2× for the one-hour cache,
/// `cache_creation.ephemeral_1h_input_tokens`), read at 0.1×.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Prompt {
    tokens: u64,
    /// In input tokens as billed; `None` when nothing was cached.
    priced: Option<f64>,
}

impl Prompt {
    fn of(usage: &Value) -> Option<Prompt> {
        let field = |name: &str| usage.get(name).and_then(Value::as_u64);
        let input = field("input_tokens");
        let written = field("cache_creation_input_tokens");
        let read = field("cache_read_input_tokens");
        if input.is_none() && written.is_none() && read.is_none() {
            return None;
        }
        let (written, read) = (written.unwrap_or(0), read.unwrap_or(0));
        let tokens = input
            .unwrap_or(0)
            .saturating_add(written)
            .saturating_add(read);
        if written == 0 && read == 0 {
            return Some(Prompt {
                tokens,
                priced: None,
            });
        }
        let hour = usage
            .get("cache_creation")
            .and_then(|c| c.get("ephemeral_1h_input_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
            .min(written);
        let priced = input.unwrap_or(0) as f64
            + (written - hour) as f64 * 1.25
            + hour as f64 * 2.0
            + read as f64 * 0.1;
        Some(Prompt {
            tokens,
            priced: Some(priced),
        })
    }
}

/// The usage of a prompt (a stream's from `message_start`) and `output_tokens` (the last
/// `message_delta`), when either was given.
fn tokens(prompt: Option<Prompt>, output_tokens: Option<u64>) -> Option<Usage> {
    let input_tokens = prompt.map(|p| p.tokens);
    (input_tokens.is_some() || output_tokens.is_some()).then(|| Usage {
        cost: Default::default(),
        prompt_tokens: input_tokens,
        completion_tokens: output_tokens,
        total_tokens: input_tokens
            .zip(output_tokens)
            .map(|(i, o)| i.saturating_add(o)),
        priced_prompt_tokens: prompt.and_then(|p| p.priced),
    })
}

/// Reads Anthropic Messages stream events until `message_stop` and assembles the message:
/// text deltas joined, each `tool_use` block's `input_json_delta` fragments joined and parsed
/// when the block stops. `first_content` is the time to the first event carrying text or
/// starting a `tool_use` block (`message_start` and `ping` are not tokens). Usage:
/// `input_tokens` from `message_start`, `output_tokens` from the last `message_delta`.
/// `text` collects the text deltas, so a stream cut short leaves what it said there.
pub async fn read_events(
    stream: &mut sse::EventStream,
    first_content: &mut Option<Duration>,
    heard: &mut codec::Heard,
) -> Result<Answer, Fault> {
    let mut blocks: Vec<StreamedBlock> = Vec::new();
    let mut input_tokens = None;
    let mut output_tokens = None;
    let mut start_output = None;
    let mut model = None;
    let mut stop_reason = None;
    loop {
        let Some(event) = stream.next().await? else {
            return Err(stream.ended_early("`message_stop`"));
        };
        let data = event.data.trim();
        if data.is_empty() {
            continue;
        }
        let value = codec::event_json(stream, "event", data)?;
        // The `type` in the data is the event; the `event:` line repeats it.
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .or(event.event.as_deref())
            .unwrap_or("");
        let index = || -> Result<usize, Fault> {
            value
                .get("index")
                .and_then(Value::as_u64)
                .and_then(|i| usize::try_from(i).ok())
                .ok_or_else(|| {
                    Fault::new(
                        FaultCategory::Protocol,
                        format!("`{kind}` event {} has no `index`", stream.count()),
                    )
                })
        };
        let unknown_block = |index: usize| {
            Fault::new(
                FaultCategory::Protocol,
                format!(
                    "`{kind}` event {} is for content block {index}, which did not start",
                    stream.count()
                ),
            )
        };
        match kind {
            "ping" => stream.keepalive(),
            "error" => {
                let error = value.get("error").unwrap_or(&value);
                return Err(Fault::new(
                    FaultCategory::AgentError,
                    format!("the model streamed an error: {}", error_text(error)),
                ));
            }
            "message_start" => {
                model = value.get("message").and_then(codec::model_of).or(model);
                let usage = value.get("message").and_then(|m| m.get("usage"));
                let field = |name: &str| usage.and_then(|u| u.get(name)).and_then(Value::as_u64);
                input_tokens = usage.and_then(Prompt::of).or(input_tokens);
                // Its `output_tokens` is a placeholder (1) until the closing `message_delta`
                // says how many: a stream cut before that reported its prompt tokens only,
                // which the turn marks partial (`tokens_partial`). Kept for a stream that
                // ends without saying.
                start_output = field("output_tokens").or(start_output);
                heard.usage = tokens(input_tokens, None);
            }
            "content_block_start" => {
                let index = index()?;
                // Blocks start in order; any other index is a broken stream, not a reason
                // to allocate.
                if index != blocks.len() {
                    return Err(Fault::new(
                        FaultCategory::Protocol,
                        format!(
                            "event {} starts content block {index}, but {} had started",
                            stream.count(),
                            blocks.len()
                        ),
                    ));
                }
                let block = value.get("content_block");
                let field = |name: &str| {
                    block
                        .and_then(|b| b.get(name))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                };
                blocks.push(match field("type") {
                    "text" => {
                        let piece = field("text");
                        if !piece.is_empty() {
                            first_content.get_or_insert_with(|| stream.started().elapsed());
                        }
                        heard.text.get_or_insert_with(String::new).push_str(piece);
                        StreamedBlock::Text
                    }
                    "tool_use" => {
                        first_content.get_or_insert_with(|| stream.started().elapsed());
                        if field("name").is_empty() {
                            return Err(Fault::new(
                                FaultCategory::Protocol,
                                format!("streamed `tool_use` block {index} has no `name`"),
                            ));
                        }
                        // An input given whole at the start (not `{}`) is its own first
                        // fragment.
                        let input = match block.and_then(|b| b.get("input")) {
                            Some(Value::Object(o)) if !o.is_empty() => {
                                Value::Object(o.clone()).to_string()
                            }
                            _ => String::new(),
                        };
                        StreamedBlock::ToolUse {
                            id: match field("id") {
                                "" => format!("toolu_{index}"),
                                id => id.to_owned(),
                            },
                            name: field("name").to_owned(),
                            input,
                            parsed: None,
                        }
                    }
                    _ => StreamedBlock::Other,
                });
            }
            "content_block_delta" => {
                let index = index()?;
                let block = blocks.get_mut(index).ok_or_else(|| unknown_block(index))?;
                let delta = value.get("delta");
                let field = |name: &str| {
                    delta
                        .and_then(|d| d.get(name))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                };
                match (block, field("type")) {
                    (StreamedBlock::Text, "text_delta") => {
                        let piece = field("text");
                        if !piece.is_empty() {
                            first_content.get_or_insert_with(|| stream.started().elapsed());
                            heard.text.get_or_insert_with(String::new).push_str(piece);
                        }
                    }
                    (StreamedBlock::ToolUse { input, .. }, "input_json_delta") => {
                        input.push_str(field("partial_json"));
                    }
                    // Thinking and signature deltas, or deltas of blocks not kept.
                    _ => {}
                }
            }
            "content_block_stop" => {
                let index = index()?;
                let block = blocks.get_mut(index).ok_or_else(|| unknown_block(index))?;
                if let StreamedBlock::ToolUse {
                    name,
                    input,
                    parsed,
                    ..
                } = block
                {
                    *parsed = Some(parse_tool_input(index, name, input)?);
                }
            }
            "message_delta" => {
                if let Some(reason) = value
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    stop_reason = Some(reason.to_owned());
                }
                // Its usage is cumulative: prompt counts it repeats are `message_start`'s,
                // or more complete (a server that fills them in only at the end); fewer
                // (a `0` placeholder) are not taken.
                let usage = value.get("usage");
                if let Some(prompt) = usage.and_then(Prompt::of)
                    && input_tokens.is_none_or(|p| prompt.tokens > p.tokens)
                {
                    input_tokens = Some(prompt);
                }
                if let Some(tokens) = usage
                    .and_then(|u| u.get("output_tokens"))
                    .and_then(Value::as_u64)
                {
                    output_tokens = Some(tokens);
                    heard.usage = self::tokens(input_tokens, output_tokens);
                }
            }
            "message_stop" => break,
            // Event types added later are skipped, as the API asks of clients.
            _ => {}
        }
    }
    // Ended as it should: a stream that never said its output tokens keeps the placeholder.
    if output_tokens.is_none() && start_output.is_some() {
        heard.usage = tokens(input_tokens, start_output);
    }
    let mut tool_calls = Vec::new();
    for (index, block) in blocks.into_iter().enumerate() {
        if let StreamedBlock::ToolUse {
            id,
            name,
            input,
            parsed,
        } = block
        {
            // A block the server never stopped is read as it stands.
            let input = match parsed {
                Some(parsed) => parsed,
                None => parse_tool_input(index, &name, &input)?,
            };
            tool_calls.push(ToolCall {
                id,
                kind: "function".into(),
                function: ToolCallFunction {
                    name,
                    arguments: input.to_string(),
                },
            });
        }
    }
    codec::streamed_answer(
        heard.text.take(),
        tool_calls,
        heard.usage,
        model,
        stop_reason,
    )
}

/// The joined `input_json_delta` fragments of a `tool_use` block (none: no input).
fn parse_tool_input(index: usize, name: &str, input: &str) -> Result<Value, Fault> {
    if input.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    serde_json::from_str(input).map_err(|e| {
        Fault::new(
            FaultCategory::InvalidJson,
            format!(
                "the streamed input of `tool_use` block {index} (`{name}`) is not JSON ({e}): {}",
                preview(input.as_bytes())
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::LlmMessage;
    use crate::llm::codec::{self, DecodeError};
    use trellis_dsl::ProviderKind;

    #[test]
    fn engine_requests_take_system_apart_merge_roles_and_start_with_user() {
        let messages = [
            LlmMessage::system("be brief"),
            LlmMessage::assistant("Hi, how can I help?"),
            LlmMessage::user("a"),
            LlmMessage::user("b"),
        ];
        let body = encode(&WireRequest {
            model: "m",
            messages: &messages,
            temperature: Some(1.5),
            max_tokens: None,
            json_schema: None,
        });
        assert_eq!(body["system"], "be brief");
        assert_eq!(body["max_tokens"], DEFAULT_MAX_TOKENS);
        assert_eq!(body["temperature"], 1.0);
        let sent = body["messages"].as_array().unwrap();
        let roles: Vec<&str> = sent.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "assistant", "user"]);
        assert_eq!(sent[2]["content"], "a\n\nb");
    }

    #[test]
    fn an_agents_tool_results_of_one_round_are_one_user_message() {
        let call = |id: &str| ToolCall {
            id: id.into(),
            kind: "function".into(),
            function: ToolCallFunction {
                name: "lookup".into(),
                arguments: r#"{"id":1}"#.into(),
            },
        };
        let result = |id: &str| ChatMessage {
            role: "tool".into(),
            content: Some("ok".into()),
            tool_call_id: Some(id.into()),
            ..Default::default()
        };
        let history = [
            ChatMessage::user("hi"),
            ChatMessage {
                role: "assistant".into(),
                tool_calls: vec![call("a"), call("b")],
                ..Default::default()
            },
            result("a"),
            result("b"),
        ];
        let tools = [json!({"type": "function", "function": {
            "name": "lookup", "description": "d", "parameters": {"type": "object"}}})];
        let body = chat_body(
            &ChatRequest {
                model: "m",
                system_prompt: Some("be brief"),
                tools: &tools,
                temperature: None,
                max_tokens: None,
                stream: false,
            },
            &history,
        );
        assert_eq!(body["system"], "be brief");
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[1]["content"][1]["input"], json!({"id": 1}));
        assert_eq!(messages[2]["content"][1]["tool_use_id"], "b");
        assert_eq!(
            body["tools"][0],
            json!({"name": "lookup", "description": "d", "input_schema": {"type": "object"}})
        );
        assert!(body.get("stream").is_none());
    }

    #[test]
    fn text_blocks_are_joined_and_tool_use_blocks_are_tool_calls() {
        let body =
            br#"{"content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"ok"},
            {"type":"tool_use","id":"t1","name":"lookup","input":{"id":2}}],
            "stop_reason":"tool_use","usage":{"input_tokens":3,"output_tokens":1}}"#;
        let answer = codec::decode(ProviderKind::Anthropic, body).unwrap();
        assert_eq!(
            answer.message.tool_calls[0].function.arguments,
            r#"{"id":2}"#
        );
        let c = answer.into_completion().unwrap();
        assert_eq!(c.text, "ok");
        assert_eq!(c.finish_reason.as_deref(), Some("tool_use"));
        assert_eq!(c.input_tokens, Some(3));
        let nameless = br#"{"content":[{"type":"tool_use","input":{}}]}"#;
        assert!(matches!(
            codec::decode(ProviderKind::Anthropic, nameless),
            Err(DecodeError::Malformed(m)) if m.contains("no `name`")
        ));
    }
}
