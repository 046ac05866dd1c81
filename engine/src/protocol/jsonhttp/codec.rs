//! The pure half of `protocol="http"`: checking a rendered request, and reading the reply,
//! tool calls and session value out of an answer (one JSON body, or server-sent events one
//! at a time) through the agent's JSON paths. No I/O; every input an agent controls ends
//! in a value or a [`Fault`], never a panic (a property test feeds it garbage).
//!
//! What an answer may hold at a path (docs/language.md, "HTTP agents"):
//! - reply: a string; `null` or `""` (no text, e.g. a tool-calling turn); a list of content
//!   blocks (`[{"type": "text", "text": …}]` or strings), whose texts are joined; a number
//!   or boolean as its JSON text. An object, or no match at all, is a `protocol` fault
//!   naming the path and quoting the body, since a guess would hide a wrong path.
//! - tool calls: OpenAI `[{id, type, function: {name, arguments}}]` (arguments a JSON
//!   string, or the object itself) and LangChain `[{name, args, id, type: "tool_call"}]`;
//!   one call object alone counts as a list of one; no match or `null` means no calls
//!   (APIs leave the field out when there are none).
//! - session: a string or number; looked for until found.

use super::settings::{HttpSettings, JsonPathSetting, StreamSettings};
use bytes::Bytes;
use serde_json::Value;

use crate::protocol::{ToolCall, ToolCallFunction};
use crate::record::{Fault, FaultCategory};
use crate::transport::quote::{error_text, kind_of, preview};
use crate::transport::sse::SseEvent;

/// The conversation as LangChain message dicts (`{"type": "human"|"ai"|"system"|"tool",
/// "content", …}`), the `langchain_messages` of the `request` template: LangServe validates
/// its input as LangChain messages and rejects OpenAI-style ones (no `type`). An AI
/// message's tool calls go as `{name, args, id, type: "tool_call"}`, arguments decoded.
pub fn langchain_messages(history: &[crate::protocol::ChatMessage]) -> Value {
    let messages = history.iter().map(|m| {
        let kind = match m.role.as_str() {
            "user" => "human",
            "assistant" => "ai",
            other => other,
        };
        let mut message = serde_json::json!({
            "type": kind,
            "content": m.content.as_deref().unwrap_or_default(),
        });
        if !m.tool_calls.is_empty() {
            message["tool_calls"] = m
                .tool_calls
                .iter()
                .map(|c| {
                    serde_json::json!({
                        "name": c.function.name,
                        "args": serde_json::from_str::<Value>(&c.function.arguments)
                            .ok()
                            .filter(Value::is_object)
                            .unwrap_or_else(|| serde_json::json!({})),
                        "id": c.id,
                        "type": "tool_call",
                    })
                })
                .collect();
        }
        if let Some(id) = &m.tool_call_id {
            message["tool_call_id"] = Value::from(id.as_str());
        }
        message
    });
    Value::Array(messages.collect())
}

/// What one answer said.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    pub reply: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// The `session` value, when the agent has one and this answer holds it.
    pub session: Option<String>,
}

/// The rendered `request` as the body to send: it must be JSON (a template that forgot
/// `tojson` around a text with quotes is caught here, quoted, instead of by the agent).
pub fn check_request(rendered: String) -> Result<Bytes, Fault> {
    match serde_json::from_str::<serde::de::IgnoredAny>(&rendered) {
        Ok(_) => Ok(Bytes::from(rendered)),
        Err(e) => Err(Fault::new(
            FaultCategory::Template,
            format!(
                "the rendered `request` is not JSON ({e}; render values with `| tojson`): {}",
                preview(rendered.as_bytes())
            ),
        )),
    }
}

/// Reads a whole JSON answer. `reply` is where its text is (the stream's event path when
/// a streaming agent answered with one body instead).
pub fn decode_answer(
    body: &[u8],
    reply: &JsonPathSetting,
    settings: &HttpSettings,
) -> Result<Answer, Fault> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        Fault::new(
            FaultCategory::InvalidJson,
            format!("the answer is not JSON ({e}): {}", preview(body)),
        )
    })?;
    let reply = match text_at(&value, reply)? {
        Found::Text(text) => text,
        Found::Nothing => {
            return Err(Fault::new(
                FaultCategory::Protocol,
                format!(
                    "`reply` json-path `{}` matched nothing in the answer: {}",
                    reply.source,
                    preview(body)
                ),
            ));
        }
    };
    let tool_calls = match &settings.tool_calls {
        Some(path) => tool_calls_at(&value, path)?,
        None => Vec::new(),
    };
    let session = settings
        .session
        .as_ref()
        .and_then(|s| session_at(&value, &s.json_path));
    Ok(Answer {
        reply,
        tool_calls,
        session,
    })
}

/// What a path found where text is expected.
#[derive(Debug, PartialEq)]
enum Found {
    /// The text (`None`: `null`, empty, or blocks without text).
    Text(Option<String>),
    Nothing,
}

fn text_at(value: &Value, path: &JsonPathSetting) -> Result<Found, Fault> {
    let Some(node) = path.path.query(value).first() else {
        return Ok(Found::Nothing);
    };
    let text = match node {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Number(_) | Value::Bool(_) => node.to_string(),
        Value::Array(blocks) => {
            let mut text = String::new();
            for block in blocks {
                match block {
                    Value::String(s) => text.push_str(s),
                    Value::Object(b) => {
                        // Content blocks of another kind (images, tool use) carry no text.
                        if let Some(Value::String(s)) = b.get("text") {
                            text.push_str(s);
                        }
                    }
                    other => {
                        return Err(Fault::new(
                            FaultCategory::Protocol,
                            format!(
                                "json-path `{}` found a list holding {}, expected text or \
                                 content blocks",
                                path.source,
                                kind_of(other)
                            ),
                        ));
                    }
                }
            }
            text
        }
        Value::Object(_) => {
            return Err(Fault::new(
                FaultCategory::Protocol,
                format!(
                    "json-path `{}` found an object, expected text (point the path at the \
                     text inside it): {}",
                    path.source,
                    preview(node.to_string().as_bytes())
                ),
            ));
        }
    };
    Ok(Found::Text((!text.is_empty()).then_some(text)))
}

/// The tool calls at `path`, in either shape (see the module docs).
pub fn tool_calls_at(value: &Value, path: &JsonPathSetting) -> Result<Vec<ToolCall>, Fault> {
    let nodes = path.path.query(value).all();
    let calls: Vec<&Value> = match nodes.as_slice() {
        [] | [Value::Null] => return Ok(Vec::new()),
        [Value::Array(items)] => items.iter().collect(),
        several => several
            .iter()
            .flat_map(|v| match v {
                Value::Array(items) => items.iter().collect::<Vec<_>>(),
                Value::Null => Vec::new(),
                one => vec![*one],
            })
            .collect(),
    };
    calls
        .into_iter()
        .enumerate()
        .map(|(i, call)| tool_call(&path.source, i, call))
        .collect()
}

fn tool_call(source: &str, i: usize, call: &Value) -> Result<ToolCall, Fault> {
    let wrong = |what: String| {
        Fault::new(
            FaultCategory::Protocol,
            format!(
                "tool call {i} at `{source}` {what}: {}",
                preview(call.to_string().as_bytes())
            ),
        )
    };
    let Value::Object(call_map) = call else {
        return Err(wrong(format!("is {}, expected an object", kind_of(call))));
    };
    let id = match call_map.get("id") {
        Some(Value::String(id)) => id.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    };
    let (name, arguments) = match (call_map.get("function"), call_map.get("name")) {
        // OpenAI: the name and arguments inside `function`.
        (Some(Value::Object(function)), _) => (function.get("name"), function.get("arguments")),
        // LangChain: `name` and `args` at the top.
        (_, Some(name)) => (
            Some(name),
            call_map.get("args").or_else(|| call_map.get("arguments")),
        ),
        _ => {
            return Err(wrong(
                "is neither an OpenAI call ({id, function: {name, arguments}}) nor a LangChain \
                 one ({name, args, id})"
                    .to_owned(),
            ));
        }
    };
    let name = match name {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => return Err(wrong("has no function name".to_owned())),
    };
    let arguments = match arguments {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    };
    Ok(ToolCall {
        id,
        kind: "function".to_owned(),
        function: ToolCallFunction { name, arguments },
    })
}

/// The session value at `path`, if the answer holds one.
pub fn session_at(value: &Value, path: &JsonPathSetting) -> Option<String> {
    match path.path.query(value).first()? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// What one event did to a streamed answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Not an event carrying the answer (metadata, a heartbeat, a comment).
    Ignored,
    /// A data event, with or without text.
    Data { text: bool },
    /// The answer is complete.
    Done,
}

/// Builds one streamed answer from its events: text deltas appended in order, tool calls
/// collected (a call whose id was seen before replaces it: servers resend growing
/// snapshots), the session value taken from the first event holding it.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    stream: &'a StreamSettings,
    settings: &'a HttpSettings,
    answer: Answer,
    text: String,
    /// Events that carried data (for the fault of a stream whose path never matched).
    data_events: u64,
    matched: bool,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(stream: &'a StreamSettings, settings: &'a HttpSettings) -> Self {
        StreamDecoder {
            stream,
            settings,
            answer: Answer::default(),
            text: String::new(),
            data_events: 0,
            matched: false,
        }
    }

    /// Applies one event; a fault ends the answer (an `error` event, data that is not JSON
    /// or holds the wrong type at a path).
    pub fn apply(&mut self, event: &SseEvent) -> Result<Progress, Fault> {
        let name = event.event.as_deref().unwrap_or("");
        let data = event.data.trim();
        if name == self.stream.end_event || data == "[DONE]" {
            return Ok(Progress::Done);
        }
        if name == "error" {
            let said = serde_json::from_str::<Value>(data)
                .map(|v| error_text(&v))
                .unwrap_or_else(|_| preview(data.as_bytes()));
            return Err(Fault::new(
                FaultCategory::AgentError,
                format!("the agent sent an error event: {said}"),
            ));
        }
        let carries_data = match &self.stream.event {
            Some(wanted) => name == wanted,
            None => matches!(name, "" | "data" | "message"),
        };
        if !carries_data || data.is_empty() {
            return Ok(Progress::Ignored);
        }
        self.data_events += 1;
        let value: Value = serde_json::from_str(data).map_err(|e| {
            Fault::new(
                FaultCategory::InvalidJson,
                format!(
                    "event {} is not JSON ({e}): {}",
                    self.data_events,
                    preview(data.as_bytes())
                ),
            )
        })?;
        let mut text = false;
        if let Found::Text(delta) = text_at(&value, &self.stream.json_path)? {
            self.matched = true;
            if let Some(delta) = delta {
                self.text.push_str(&delta);
                text = true;
            }
        }
        if let Some(path) = &self.settings.tool_calls {
            for call in tool_calls_at(&value, path)? {
                self.matched = true;
                let seen = self
                    .answer
                    .tool_calls
                    .iter_mut()
                    .find(|c| !call.id.is_empty() && c.id == call.id);
                match seen {
                    Some(earlier) => *earlier = call,
                    None => self.answer.tool_calls.push(call),
                }
            }
        }
        if self.answer.session.is_none()
            && let Some(session) = &self.settings.session
        {
            self.answer.session = session_at(&value, &session.json_path);
        }
        Ok(Progress::Data { text })
    }

    /// The answer once the stream is done: a fault when no event held anything at the
    /// paths (a wrong path would otherwise pass as an empty reply).
    pub fn finish(mut self) -> Result<Answer, Fault> {
        if self.data_events > 0 && !self.matched {
            return Err(Fault::new(
                FaultCategory::Protocol,
                format!(
                    "stream json-path `{}` matched nothing in any of the {} data events",
                    self.stream.json_path.source, self.data_events
                ),
            ));
        }
        self.answer.reply = (!self.text.is_empty()).then_some(self.text);
        Ok(self.answer)
    }

    /// What was received so far, for a turn that ended in a fault.
    pub fn partial(&self) -> Option<String> {
        (!self.text.is_empty()).then(|| self.text.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::jsonhttp::settings::{HttpMethod, SessionCapture};
    use trellis_dsl::{Span, Template};

    fn path(source: &str) -> JsonPathSetting {
        JsonPathSetting {
            path: serde_json_path::JsonPath::parse(source).expect("test paths are valid"),
            source: source.to_owned(),
        }
    }

    pub(crate) fn settings(reply: &str, tools: Option<&str>, stream: Option<&str>) -> HttpSettings {
        HttpSettings {
            method: HttpMethod::Post,
            request: Template {
                source: "{}".into(),
                span: Span::new(0, (0..0).into()),
            },
            reply: Some(path(reply)),
            tool_calls: tools.map(path),
            session: Some(SessionCapture {
                json_path: path("$.session"),
                header: None,
            }),
            stream: stream.map(|p| StreamSettings {
                json_path: path(p),
                event: None,
                end_event: "end".into(),
            }),
        }
    }

    #[test]
    fn reads_a_langserve_answer_with_langchain_tool_calls() {
        let s = settings("$.output.content", Some("$.output.tool_calls"), None);
        let body = br#"{"output": {"content": "", "type": "ai", "tool_calls": [
            {"name": "get_weather", "args": {"city": "Paris"}, "id": "c1", "type": "tool_call"}]},
            "session": 7}"#;
        let answer = decode_answer(body, s.reply.as_ref().unwrap(), &s).unwrap();
        assert_eq!(answer.reply, None);
        assert_eq!(answer.session.as_deref(), Some("7"));
        assert_eq!(answer.tool_calls[0].function.name, "get_weather");
        assert_eq!(
            answer.tool_calls[0].function.arguments,
            r#"{"city":"Paris"}"#
        );
        assert_eq!(answer.tool_calls[0].id, "c1");
    }

    #[test]
    fn reads_openai_tool_calls_and_content_blocks() {
        let s = settings("$.content", Some("$.additional_kwargs.tool_calls"), None);
        let body = br#"{"content": [{"type": "text", "text": "a"}, "b", {"type": "image"}],
            "additional_kwargs": {"tool_calls": [{"id": "x", "type": "function",
            "function": {"name": "f", "arguments": "{\"a\":1}"}}]}}"#;
        let answer = decode_answer(body, s.reply.as_ref().unwrap(), &s).unwrap();
        assert_eq!(answer.reply.as_deref(), Some("ab"));
        assert_eq!(answer.tool_calls[0].function.arguments, r#"{"a":1}"#);
    }

    #[test]
    fn a_wrong_path_or_shape_is_a_fault_naming_the_path_and_quoting_the_body() {
        let s = settings("$.answer", Some("$.calls"), None);
        let reply = s.reply.as_ref().unwrap();
        let fault = decode_answer(br#"{"output": "hi"}"#, reply, &s).unwrap_err();
        assert_eq!(fault.category, FaultCategory::Protocol);
        assert!(fault.message.contains("`$.answer`"), "{}", fault.message);
        assert!(
            fault.message.contains(r#"{"output": "hi"}"#),
            "{}",
            fault.message
        );
        let fault = decode_answer(br#"{"answer": {"text": "x"}}"#, reply, &s).unwrap_err();
        assert!(
            fault.message.contains("found an object"),
            "{}",
            fault.message
        );
        let fault = decode_answer(b"<html>oops", reply, &s).unwrap_err();
        assert_eq!(fault.category, FaultCategory::InvalidJson);
        assert!(fault.message.contains("<html>oops"), "{}", fault.message);
        let fault =
            decode_answer(br#"{"answer": "x", "calls": [{"args": {}}]}"#, reply, &s).unwrap_err();
        assert!(
            fault.message.contains("neither an OpenAI call"),
            "{}",
            fault.message
        );
    }

    #[test]
    fn a_request_that_is_not_json_is_a_template_fault_quoting_it() {
        let fault = check_request(r#"{"input": "say "hi""}"#.to_owned()).unwrap_err();
        assert_eq!(fault.category, FaultCategory::Template);
        assert!(fault.message.contains(r#"say "hi""#), "{}", fault.message);
        assert!(check_request(r#"{"input": 1}"#.to_owned()).is_ok());
    }

    #[test]
    fn a_stream_joins_deltas_until_its_end_event() {
        let s = settings("$.x", Some("$.tool_calls"), Some("$.content"));
        let stream = s.stream.as_ref().unwrap();
        let mut decoder = StreamDecoder::new(stream, &s);
        let event = |name: &str, data: &str| SseEvent {
            event: Some(name.to_owned()),
            data: data.to_owned(),
        };
        let steps = [
            event("metadata", r#"{"run_id": "r"}"#),
            event("data", r#"{"content": "Hel", "session": "s1"}"#),
            event(
                "data",
                r#"{"content": "lo", "tool_calls": [{"name": "f", "args": {}, "id": "1"}]}"#,
            ),
            event(
                "data",
                r#"{"content": "", "tool_calls": [{"name": "f", "args": {"a": 1}, "id": "1"}]}"#,
            ),
        ];
        let progress: Vec<Progress> = steps.iter().map(|e| decoder.apply(e).unwrap()).collect();
        assert_eq!(progress[0], Progress::Ignored);
        assert_eq!(progress[1], Progress::Data { text: true });
        assert_eq!(decoder.apply(&event("end", "")).unwrap(), Progress::Done);
        let answer = decoder.finish().unwrap();
        assert_eq!(answer.reply.as_deref(), Some("Hello"));
        assert_eq!(answer.session.as_deref(), Some("s1"));
        assert_eq!(answer.tool_calls.len(), 1);
        assert_eq!(answer.tool_calls[0].function.arguments, r#"{"a":1}"#);
    }

    #[test]
    fn stream_errors_are_faults() {
        let s = settings("$.x", None, Some("$.content"));
        let stream = s.stream.as_ref().unwrap();
        let mut decoder = StreamDecoder::new(stream, &s);
        let fault = decoder
            .apply(&SseEvent {
                event: Some("error".into()),
                data: r#"{"status_code": 500, "message": "Internal Server Error"}"#.into(),
            })
            .unwrap_err();
        assert_eq!(fault.category, FaultCategory::AgentError);
        assert!(
            fault.message.contains("Internal Server Error"),
            "{}",
            fault.message
        );
        let mut decoder = StreamDecoder::new(stream, &s);
        decoder
            .apply(&SseEvent {
                event: None,
                data: r#"{"other": 1}"#.into(),
            })
            .unwrap();
        let fault = decoder.finish().unwrap_err();
        assert!(
            fault.message.contains("`$.content` matched nothing"),
            "{}",
            fault.message
        );
    }
}
