//! OpenAI-compatible chat completions (the hosted API, llama.cpp, vLLM, Ollama): request
//! bodies, whole answers, streamed chunks, tool calls and usage.
//!
//! Decoding is lenient where real servers differ (`content` as an array of parts, tool-call
//! `arguments` as an object instead of a JSON string, missing `usage`, extra fields such as
//! llama.cpp's `timings`, a streamed request answered with one JSON body) and strict where it
//! matters: an answer with neither text nor tool calls, a streamed tool call without a name,
//! and a stream cut before `[DONE]` or a finish reason are errors, never empty answers.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::codec::{self, Answer, ChatRequest, DecodeError, WireRequest};
use super::fragments::{Fragment, StreamedCalls};
use super::{LlmMessage, Role};
use crate::record::{ChatMessage, ToolCall, ToolCallFunction};
use crate::record::{Fault, FaultCategory};
use crate::transport::Usage;
use crate::transport::quote::{error_text, kind_of, preview};
use crate::transport::sse;

/// Appended to the API root.
pub const PATH: &str = "/chat/completions";
/// The API root of a provider without `base-url`.
pub const DEFAULT_BASE: &str = "https://api.openai.com/v1";

/// The body of an engine request (judge, simulated user, Fixie's LLM).
pub fn encode(request: &WireRequest<'_>) -> Value {
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

/// The body of an agent's request: the system prompt, then the history (tool calls and
/// results included), the offered tools, and `stream_options` asking for usage in the last
/// chunk of a stream.
pub fn chat_body(
    request: &ChatRequest<'_>,
    history: &[ChatMessage],
) -> Result<Value, serde_json::Error> {
    let mut messages = Vec::with_capacity(history.len() + 1);
    if let Some(prompt) = request.system_prompt {
        messages.push(json!({"role": "system", "content": prompt}));
    }
    for message in history {
        messages.push(wire_message(message)?);
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        body.insert("tools".into(), Value::Array(request.tools.to_vec()));
    }
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(n) = request.max_tokens {
        body.insert("max_tokens".into(), json!(n));
    }
    if request.stream {
        body.insert("stream".into(), Value::Bool(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok(Value::Object(body))
}

/// A history message as chat completions takes it: content `null` only beside tool calls.
fn wire_message(message: &ChatMessage) -> Result<Value, serde_json::Error> {
    let mut value = serde_json::to_value(message)?;
    if let Value::Object(object) = &mut value {
        object.remove("parts");
        if message.content.is_none() {
            object.insert("content".into(), Value::Null);
        }
        // `name` on a tool message is accepted by most servers but not required; keep it
        // only where the API defines it.
        if message.role != "tool" {
            object.remove("name");
        }
    }
    Ok(value)
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

pub(super) fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

/// A whole chat completion (`value`, parsed from `body`): the first choice's message, the
/// usage, the model and the finish reason.
pub fn decode(value: &Value, body: &[u8]) -> Result<Answer, DecodeError> {
    let choice = value
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|choices| choices.first());
    let message = choice
        .and_then(|choice| choice.get("message"))
        .ok_or_else(|| {
            DecodeError::Malformed(format!(
                "the answer has no `choices[0].message`: {}",
                preview(body)
            ))
        })?;
    let content = match message.get("content") {
        // A refusal OpenAI reports beside the content (`"content": null, "refusal": "…"`)
        // is what the model said.
        None | Some(Value::Null) => message
            .get("refusal")
            .and_then(Value::as_str)
            .map(str::to_owned),
        Some(Value::String(text)) => Some(text.clone()),
        // Content parts: their text, joined.
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<String>(),
        ),
        Some(other) => {
            return Err(DecodeError::Malformed(format!(
                "`choices[0].message.content` is {}, not text",
                kind_of(other)
            )));
        }
    };
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        for (index, call) in calls.iter().enumerate() {
            tool_calls.push(decode_tool_call(call, index)?);
        }
    }
    let finish_reason = choice
        .and_then(|c| c.get("finish_reason"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    if content.is_none()
        && tool_calls.is_empty()
        && !codec::cut_at_token_limit(finish_reason.as_deref())
    {
        if !codec::refused(finish_reason.as_deref()) {
            return Err(DecodeError::Malformed(format!(
                "the model answered with neither text nor tool calls (finish reason {})",
                finish_reason.as_deref().unwrap_or("missing")
            )));
        }
        // Refused without a word: an answer, and its reply is empty.
        return Ok(Answer {
            message: codec::assistant(Some(String::new()), tool_calls),
            usage: decode_usage(value.get("usage")),
            model: codec::model_of(value),
            finish_reason,
        });
    }
    Ok(Answer {
        message: codec::assistant(content, tool_calls),
        usage: decode_usage(value.get("usage")),
        model: codec::model_of(value),
        finish_reason,
    })
}

fn decode_tool_call(call: &Value, index: usize) -> Result<ToolCall, DecodeError> {
    let function = call.get("function");
    let name = function
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            DecodeError::Malformed(format!("tool call {index} has no `function.name`"))
        })?;
    let arguments = match function.and_then(|f| f.get("arguments")) {
        // No arguments, as a stream whose call got no argument fragments reads them.
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(text)) if text.trim().is_empty() => "{}".to_owned(),
        Some(Value::String(text)) => text.clone(),
        // Some servers send the arguments as an object instead of a JSON string.
        Some(other) => other.to_string(),
    };
    let id = call
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map_or_else(|| format!("call_{index}"), str::to_owned);
    Ok(ToolCall {
        id,
        kind: "function".into(),
        function: ToolCallFunction {
            name: name.to_owned(),
            arguments,
        },
    })
}

pub(super) fn decode_usage(usage: Option<&Value>) -> Option<Usage> {
    let usage = usage.filter(|u| u.is_object())?;
    let field = |name: &str| usage.get(name).and_then(Value::as_u64);
    Some(Usage {
        cost: Default::default(),
        prompt_tokens: field("prompt_tokens"),
        completion_tokens: field("completion_tokens"),
        total_tokens: field("total_tokens"),
        priced_prompt_tokens: None,
    })
}

/// Reads chat-completion chunks until `[DONE]` (or the end of a stream that saw a finish
/// reason) and assembles the message. `first_content` is the time to the first chunk with
/// content or a tool call (a role-only first chunk is not a token). `heard` collects the
/// text deltas and the usage, so a stream cut short leaves what it said there.
pub async fn read_chunks(
    stream: &mut sse::EventStream,
    first_content: &mut Option<Duration>,
    heard: &mut codec::Heard,
) -> Result<Answer, Fault> {
    let mut calls = StreamedCalls::default();
    let mut model = None;
    let mut finished = false;
    let mut finish_reason = None;
    loop {
        let Some(event) = stream.next().await? else {
            if finished {
                break;
            }
            return Err(stream.ended_early("`[DONE]` or a finish reason"));
        };
        let data = event.data.trim();
        if data.is_empty() {
            continue;
        }
        if data == "[DONE]" {
            break;
        }
        let chunk = codec::event_json(stream, "chunk", data)?;
        // Whether the chunk moved the answer on: a stuck server's content-free chunks
        // (`{"delta":{}}`, each with its own `obfuscation` padding) must not hold the idle
        // timeout off.
        let mut moved = false;
        'chunk: {
            if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
                return Err(Fault::new(
                    FaultCategory::AgentError,
                    format!("the model streamed an error: {}", error_text(error)),
                ));
            }
            model = codec::model_of(&chunk).or(model);
            if let Some(u) = decode_usage(chunk.get("usage")) {
                heard.usage = Some(u);
                moved = true;
            }
            let Some(choice) = chunk
                .get("choices")
                .and_then(Value::as_array)
                .and_then(|c| c.first())
            else {
                break 'chunk;
            };
            if let Some(reason) = choice.get("finish_reason").filter(|r| !r.is_null()) {
                finished = true;
                moved = true;
                finish_reason = reason.as_str().map(str::to_owned).or(finish_reason);
            }
            let Some(delta) = choice.get("delta") else {
                break 'chunk;
            };
            // A refusal streams in `refusal` deltas in place of `content` ones.
            if let Some(piece) = delta
                .get("content")
                .and_then(Value::as_str)
                .or_else(|| delta.get("refusal").and_then(Value::as_str))
                && !piece.is_empty()
            {
                first_content.get_or_insert_with(|| stream.started().elapsed());
                heard.text.get_or_insert_with(String::new).push_str(piece);
                moved = true;
            }
            // A reasoning model thinks aloud before it answers (llama.cpp, vLLM, DeepSeek):
            // not the answer, but the model is at work.
            moved |= ["reasoning_content", "reasoning"].iter().any(|field| {
                delta
                    .get(*field)
                    .and_then(Value::as_str)
                    .is_some_and(|t| !t.is_empty())
            });
            for (position, call) in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                first_content.get_or_insert_with(|| stream.started().elapsed());
                moved = true;
                let index = call
                    .get("index")
                    .and_then(Value::as_u64)
                    .unwrap_or(position as u64);
                // Indices need not start at 0 nor follow each other: proxies in front of Claude
                // number the first call 1 after a text block. Calls are merged by index and
                // kept in the order they began, whatever the numbers.
                let function = call.get("function");
                calls.add(
                    index,
                    Fragment {
                        id: call.get("id").and_then(Value::as_str),
                        name: function.and_then(|f| f.get("name")).and_then(Value::as_str),
                        arguments: function
                            .and_then(|f| f.get("arguments"))
                            .and_then(Value::as_str),
                    },
                );
            }
        }
        if !moved {
            stream.keepalive();
        }
    }
    let mut tool_calls = Vec::with_capacity(calls.len());
    for (index, call) in calls.into_calls().into_iter().enumerate() {
        if call.name.is_empty() {
            return Err(Fault::new(
                FaultCategory::Protocol,
                format!("streamed tool call {index} has no function name"),
            ));
        }
        tool_calls.push(ToolCall {
            id: if call.id.is_empty() {
                format!("call_{index}")
            } else {
                call.id
            },
            kind: "function".into(),
            function: ToolCallFunction {
                name: call.name,
                arguments: if call.arguments.is_empty() {
                    "{}".into()
                } else {
                    call.arguments
                },
            },
        });
    }
    codec::streamed_answer(
        heard.text.take(),
        tool_calls,
        heard.usage,
        model,
        finish_reason,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::codec::{self, DecodeError};
    use trellis_dsl::ProviderKind;

    fn request<'a>(messages: &'a [LlmMessage]) -> WireRequest<'a> {
        WireRequest {
            model: "m",
            messages,
            temperature: None,
            max_tokens: None,
            json_schema: None,
        }
    }

    fn decode(body: &[u8]) -> Result<Answer, DecodeError> {
        codec::decode(ProviderKind::OpenAi, body)
    }

    #[test]
    fn engine_messages_alternate_from_a_user_message() {
        let messages = [
            LlmMessage::system("You play a customer."),
            LlmMessage::assistant("Hi, I need a cleaning."),
            LlmMessage::user("Sure, where?"),
            LlmMessage::user("(Your previous answer was empty.)"),
        ];
        let body = encode(&request(&messages));
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

    #[test]
    fn an_agents_history_keeps_tool_calls_and_results() {
        let history = [
            ChatMessage::user("hi"),
            ChatMessage {
                role: "assistant".into(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    kind: "function".into(),
                    function: ToolCallFunction {
                        name: "lookup".into(),
                        arguments: "{}".into(),
                    },
                }],
                ..Default::default()
            },
            ChatMessage {
                role: "tool".into(),
                content: Some("{}".into()),
                tool_call_id: Some("c1".into()),
                name: Some("lookup".into()),
                ..Default::default()
            },
        ];
        let tools = [json!({"type": "function", "function": {"name": "lookup"}})];
        let request = ChatRequest {
            model: "m",
            system_prompt: Some("be brief"),
            tools: &tools,
            temperature: None,
            max_tokens: Some(5),
            stream: true,
        };
        let body = chat_body(&request, &history).unwrap();
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(
            messages[0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(messages[2]["content"], Value::Null);
        assert_eq!(messages[2]["tool_calls"][0]["function"]["name"], "lookup");
        assert_eq!(messages[3]["name"], "lookup");
        assert_eq!(body["tools"], json!(tools));
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn answers_in_every_shape_seen() {
        let plain = br#"{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],
            "usage":{"prompt_tokens":5,"completion_tokens":2},"model":"x","timings":{}}"#;
        let c = decode(plain).unwrap().into_completion().unwrap();
        assert_eq!(
            (c.text.as_str(), c.input_tokens, c.output_tokens),
            ("hi", Some(5), Some(2))
        );
        assert_eq!(c.model.as_deref(), Some("x"));
        let parts = br#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}"#;
        assert_eq!(
            decode(parts).unwrap().message.content.as_deref(),
            Some("ab")
        );
        let empty = br#"{"choices":[{"message":{"content":""},"finish_reason":"length"}]}"#;
        assert!(matches!(
            decode(empty).unwrap().into_completion(),
            Err(DecodeError::Malformed(m)) if m.contains("no text") && m.contains("length")
        ));
        let error = br#"{"error":{"message":"model not loaded"}}"#;
        assert_eq!(
            decode(error),
            Err(DecodeError::Provider("model not loaded".into()))
        );
        assert!(matches!(
            decode(b"<html>"),
            Err(DecodeError::NotJson { .. })
        ));
    }

    #[test]
    fn garbage_answers_are_faults_of_an_agent() {
        let fault = |body: &[u8]| decode(body).err().map(|e| e.into_fault().category);
        assert_eq!(fault(b"<html>"), Some(FaultCategory::InvalidJson));
        assert_eq!(fault(b"{}"), Some(FaultCategory::Protocol));
        // The server's own report of its failure, as on every protocol.
        assert_eq!(
            fault(br#"{"error":{"message":"bad model"}}"#),
            Some(FaultCategory::AgentError)
        );
        assert_eq!(
            fault(br#"{"choices":[{"message":{"role":"assistant","content":null}}]}"#),
            Some(FaultCategory::Protocol)
        );
        assert_eq!(
            fault(br#"{"choices":[{"message":{"tool_calls":[{"function":{}}]}}]}"#),
            Some(FaultCategory::Protocol)
        );
        assert_eq!(
            fault(br#"{"choices":[{"message":{"content":7}}]}"#),
            Some(FaultCategory::Protocol)
        );
    }

    #[test]
    fn tool_call_arguments_as_object_are_kept_as_json_text() {
        let body = br#"{"choices":[{"message":{"content":null,"tool_calls":[
            {"id":"c1","type":"function","function":{"name":"lookup","arguments":{"id":7}}}]}}],
            "usage":{"prompt_tokens":3,"completion_tokens":2}}"#;
        let answer = decode(body).expect("decodes");
        assert_eq!(
            answer.message.tool_calls[0].function.arguments,
            r#"{"id":7}"#
        );
        assert_eq!(answer.usage.and_then(|u| u.prompt_tokens), Some(3));
        assert!(matches!(
            answer.into_completion(),
            Err(DecodeError::Malformed(m)) if m.contains("no text")
        ));
    }
}
