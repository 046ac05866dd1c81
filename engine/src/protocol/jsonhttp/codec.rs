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
//!   (APIs leave the field out when there are none). In a stream the entries are fragments
//!   of calls (LangChain's `tool_call_chunks`, OpenAI's deltas), merged as
//!   [`crate::llm::fragments`] does by their `index`; an entry without one is a whole call
//!   (resent with the same id: it replaces the call), or, without a name and id (LangChain's
//!   partial `tool_calls`), more of the latest call. Where the path finds a LangChain
//!   message's `tool_calls` next to its `tool_call_chunks`, the chunks are read instead: each
//!   chunk's `tool_calls` are parsed from that chunk's fragment alone, so they lose the
//!   arguments of every fragment that is not JSON by itself. A call is complete when the
//!   stream ends: a name, and argument text that is JSON.
//! - session: a string or number; looked for until found.
//!
//! The answer's JSON is also the turn's structured data, what `reply json-path=…` and
//! `capture … json-path=…` read (as an A2A turn's task): the whole body, or for a stream
//! the last data event (LangServe's last AIMessageChunk, where a chat model puts
//! `response_metadata` and `usage_metadata`), since the joined text and merged tool calls
//! are the turn's reply and calls already.

use super::settings::{HttpSettings, JsonPathSetting, StreamSettings};
use bytes::Bytes;
use serde_json::{Value, json};
use serde_json_path::NormalizedPath;

use crate::llm::fragments::{Fragment, StreamedCall, StreamedCalls};
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
    /// The answer as JSON, the turn's structured data (`reply json-path=…`, `capture …
    /// json-path=…`): the whole body, or a stream's last data event.
    pub data: Option<Value>,
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
        data: Some(value),
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
    call_values(path.path.query(value).all())
        .into_iter()
        .enumerate()
        .map(|(i, call)| tool_call(&path.source, i, call))
        .collect()
}

/// The entries of the lists (or single calls) the path found; `null` is none.
fn call_values<'v>(nodes: impl IntoIterator<Item = &'v Value>) -> Vec<&'v Value> {
    nodes
        .into_iter()
        .flat_map(|v| match v {
            Value::Array(items) => items.iter().collect::<Vec<_>>(),
            Value::Null => Vec::new(),
            one => vec![one],
        })
        .collect()
}

/// The tool-call entries of one streamed event at `path`, with a LangChain message's
/// `tool_call_chunks` in place of its `tool_calls` (see the module docs).
fn stream_call_values<'v>(value: &'v Value, path: &JsonPathSetting) -> Vec<&'v Value> {
    let found = path.path.query_located(value);
    call_values(found.iter().map(|node| {
        let location = node.location();
        let chunks = (location.last().and_then(|e| e.as_name()) == Some("tool_calls"))
            .then(|| parent(value, location))
            .flatten()
            .and_then(|message| message.get("tool_call_chunks"))
            .filter(|chunks| chunks.as_array().is_some_and(|c| !c.is_empty()));
        chunks.unwrap_or(node.node())
    }))
}

/// The value holding the one at `location`.
fn parent<'v>(root: &'v Value, location: &NormalizedPath<'_>) -> Option<&'v Value> {
    let mut value = root;
    for element in location.iter().take(location.len().checked_sub(1)?) {
        value = match element.as_name() {
            Some(name) => value.get(name)?,
            None => value.get(element.as_index()?)?,
        };
    }
    Some(value)
}

/// One entry of a tool-call list, in either shape, before anything is required of it.
struct CallEntry<'v> {
    /// The `index` of a streamed fragment.
    index: Option<u64>,
    id: Option<String>,
    name: Option<&'v str>,
    /// `None` for a missing or `null` one.
    arguments: Option<&'v Value>,
}

fn call_entry<'v>(source: &str, i: usize, call: &'v Value) -> Result<CallEntry<'v>, Fault> {
    let Value::Object(call_map) = call else {
        return Err(wrong_call(
            source,
            i,
            call,
            &format!("is {}, expected an object", kind_of(call)),
        ));
    };
    let id = match call_map.get("id") {
        Some(Value::String(id)) => Some(id.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
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
            return Err(wrong_call(
                source,
                i,
                call,
                "is neither an OpenAI call ({id, function: {name, arguments}}) nor a LangChain \
                 one ({name, args, id})",
            ));
        }
    };
    Ok(CallEntry {
        index: call_map.get("index").and_then(Value::as_u64),
        id,
        name: name.and_then(Value::as_str),
        arguments: arguments.filter(|a| !a.is_null()),
    })
}

fn wrong_call(source: &str, i: usize, call: &Value, what: &str) -> Fault {
    Fault::new(
        FaultCategory::Protocol,
        format!(
            "tool call {i} at `{source}` {what}: {}",
            preview(call.to_string().as_bytes())
        ),
    )
}

fn tool_call(source: &str, i: usize, call: &Value) -> Result<ToolCall, Fault> {
    let entry = call_entry(source, i, call)?;
    let name = match entry.name {
        Some(name) if !name.is_empty() => name.to_owned(),
        _ => return Err(wrong_call(source, i, call, "has no function name")),
    };
    let arguments = match entry.arguments {
        None => "{}".to_owned(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    };
    Ok(ToolCall {
        id: entry.id.unwrap_or_default(),
        kind: "function".to_owned(),
        function: ToolCallFunction { name, arguments },
    })
}

/// A stream's tool calls as their fragments arrive (see the module docs).
#[derive(Debug, Default)]
struct StreamedToolCalls {
    calls: StreamedCalls,
    /// Arguments given as JSON values rather than text, by the call's position (LangChain's
    /// partial `tool_calls`: later ones add their keys).
    values: Vec<Option<Value>>,
}

impl StreamedToolCalls {
    fn add(&mut self, entry: CallEntry<'_>) {
        let fragment = Fragment {
            id: entry.id.as_deref(),
            name: entry.name,
            arguments: entry.arguments.and_then(Value::as_str),
        };
        let value = entry.arguments.filter(|a| !a.is_string());
        let resent = entry
            .id
            .as_deref()
            .filter(|id| !id.is_empty())
            .and_then(|id| self.calls.position_of_id(id));
        let more =
            entry.id.as_deref().is_none_or(str::is_empty) && entry.name.is_none_or(str::is_empty);
        let position = match (entry.index, resent) {
            (Some(index), _) => self.calls.add(index, fragment),
            // A call resent whole (a growing snapshot) replaces what it said before.
            (None, Some(position)) => {
                if let Some(call) = self.calls.get_mut(position) {
                    let mut again = StreamedCall::new(call.index, fragment);
                    if again.name.is_empty() {
                        again.name = std::mem::take(&mut call.name);
                    }
                    *call = again;
                }
                if let Some(earlier) = self.values.get_mut(position) {
                    *earlier = None;
                }
                position
            }
            (None, None) if more && !self.calls.is_empty() => {
                let position = self.calls.len() - 1;
                if let Some(call) = self.calls.get_mut(position) {
                    call.add(fragment);
                }
                position
            }
            (None, None) => self.calls.push(StreamedCall::new(None, fragment)),
        };
        self.values.resize(self.calls.len(), None);
        if let (Some(value), Some(slot)) = (value, self.values.get_mut(position)) {
            match (slot.as_mut(), value) {
                (Some(Value::Object(have)), Value::Object(more)) => {
                    have.extend(more.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
                _ => *slot = Some(value.clone()),
            }
        }
    }

    /// The calls once the stream has ended: each needs a name, and its argument text, if
    /// any, must be JSON.
    fn finish(self, source: &str) -> Result<Vec<ToolCall>, Fault> {
        let values = self.values.into_iter().chain(std::iter::repeat(None));
        let mut calls = Vec::with_capacity(self.calls.len());
        for (i, (call, value)) in self.calls.into_calls().into_iter().zip(values).enumerate() {
            let seen = || {
                let arguments = match &value {
                    Some(value) if call.arguments.is_empty() => value.clone(),
                    _ => Value::from(call.arguments.as_str()),
                };
                let seen = json!({"index": call.index, "id": call.id, "name": call.name, "args": arguments});
                preview(seen.to_string().as_bytes())
            };
            if call.name.is_empty() {
                return Err(Fault::new(
                    FaultCategory::Protocol,
                    format!(
                        "streamed tool call {i} at `{source}` has no function name in any of \
                         its fragments; they made: {}",
                        seen()
                    ),
                ));
            }
            let arguments = if !call.arguments.trim().is_empty() {
                if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&call.arguments) {
                    return Err(Fault::new(
                        FaultCategory::Protocol,
                        format!(
                            "streamed tool call {i} (`{}`) at `{source}`: its arguments, \
                             joined from its fragments, are not JSON ({e}): {}",
                            call.name,
                            seen()
                        ),
                    ));
                }
                call.arguments
            } else {
                value.map_or_else(|| "{}".to_owned(), |v| v.to_string())
            };
            calls.push(ToolCall {
                id: call.id,
                kind: "function".to_owned(),
                function: ToolCallFunction {
                    name: call.name,
                    arguments,
                },
            });
        }
        Ok(calls)
    }
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

/// Builds one streamed answer from its events: text deltas appended in order, tool-call
/// fragments merged (see the module docs), the session value taken from the first event
/// holding it, the last data event kept as the answer's data (one event, within the
/// per-event size bound).
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    stream: &'a StreamSettings,
    settings: &'a HttpSettings,
    answer: Answer,
    text: String,
    calls: StreamedToolCalls,
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
            calls: StreamedToolCalls::default(),
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
            // The session id may come only in an event that carries no text: LangGraph's
            // and LangServe's `metadata` (`run_id`, `thread_id`) opens the stream with it.
            if !data.is_empty()
                && self.answer.session.is_none()
                && let Some(session) = &self.settings.session
                && let Ok(value) = serde_json::from_str::<Value>(data)
            {
                self.answer.session = session_at(&value, &session.json_path);
            }
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
            for (i, call) in stream_call_values(&value, path).into_iter().enumerate() {
                self.matched = true;
                self.calls.add(call_entry(&path.source, i, call)?);
            }
        }
        if self.answer.session.is_none()
            && let Some(session) = &self.settings.session
        {
            self.answer.session = session_at(&value, &session.json_path);
        }
        self.answer.data = Some(value);
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
        if let Some(path) = &self.settings.tool_calls {
            self.answer.tool_calls = self.calls.finish(&path.source)?;
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
        assert_eq!(
            answer.data.as_ref().unwrap()["session"],
            7,
            "the body is the data"
        );
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

    /// LangGraph's and LangServe's streams name the run's thread in their opening
    /// `metadata` event only: the session is found there, and the event adds no text.
    #[test]
    fn a_session_id_in_a_metadata_event_is_found() {
        let s = settings("$.x", None, Some("$.content"));
        let stream = s.stream.as_ref().unwrap();
        let mut decoder = StreamDecoder::new(stream, &s);
        let event = |name: &str, data: &str| SseEvent {
            event: Some(name.to_owned()),
            data: data.to_owned(),
        };
        let opening = event("metadata", r#"{"run_id": "r", "session": "thread-9"}"#);
        assert_eq!(decoder.apply(&opening).unwrap(), Progress::Ignored);
        // A later one does not replace it.
        let later = event("data", r#"{"content": "Hi", "session": "other"}"#);
        assert_eq!(
            decoder.apply(&later).unwrap(),
            Progress::Data { text: true }
        );
        assert_eq!(decoder.apply(&event("end", "")).unwrap(), Progress::Done);
        let answer = decoder.finish().unwrap();
        assert_eq!(answer.session.as_deref(), Some("thread-9"));
        assert_eq!(answer.reply.as_deref(), Some("Hi"));
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
        assert_eq!(
            answer.data.unwrap()["tool_calls"][0]["args"]["a"],
            1,
            "the last data event is the data, not the end event"
        );
        assert_eq!(answer.tool_calls.len(), 1);
        assert_eq!(answer.tool_calls[0].function.arguments, r#"{"a":1}"#);
    }

    /// The data events LangServe 0.3 streams for a chat model's tool call (langchain-core
    /// 1.x): each AIMessageChunk with its `tool_call_chunks` fragment and the partial
    /// `tool_calls` LangChain parsed from that fragment alone.
    const LANGSERVE_CHUNKS: [&str; 3] = [
        r#"{"content":"","type":"AIMessageChunk","id":null,"tool_calls":[{"name":"book_flight","args":{},"id":"call_1","type":"tool_call"}],"invalid_tool_calls":[],"tool_call_chunks":[{"name":"book_flight","args":"","id":"call_1","index":0,"type":"tool_call_chunk"}]}"#,
        r#"{"content":"","type":"AIMessageChunk","id":null,"tool_calls":[{"name":"","args":{"destination":"Oslo"},"id":null,"type":"tool_call"}],"invalid_tool_calls":[],"tool_call_chunks":[{"name":null,"args":"{\"destination\": \"Oslo\", \"pas","id":null,"index":0,"type":"tool_call_chunk"}]}"#,
        r#"{"content":"","type":"AIMessageChunk","id":null,"tool_calls":[],"invalid_tool_calls":[{"name":null,"args":"sengers\": 2, \"date\": \"May 2\"}","id":null,"error":null,"type":"invalid_tool_call"}],"tool_call_chunks":[{"name":null,"args":"sengers\": 2, \"date\": \"May 2\"}","id":null,"index":0,"type":"tool_call_chunk"}]}"#,
    ];

    fn streamed(s: &HttpSettings, events: &[&str]) -> Result<Answer, Fault> {
        let mut decoder = StreamDecoder::new(s.stream.as_ref().unwrap(), s);
        for data in events {
            decoder.apply(&SseEvent {
                event: Some("data".into()),
                data: (*data).to_owned(),
            })?;
        }
        decoder.finish()
    }

    #[test]
    fn langchain_tool_call_chunks_are_merged_by_index_at_either_path() {
        for tools in ["$.tool_call_chunks", "$.tool_calls"] {
            let s = settings("$.x", Some(tools), Some("$.content"));
            let answer = streamed(&s, &LANGSERVE_CHUNKS).unwrap();
            assert_eq!(answer.tool_calls.len(), 1, "{tools}: {answer:?}");
            let call = &answer.tool_calls[0];
            assert_eq!(call.id, "call_1");
            assert_eq!(call.function.name, "book_flight");
            let arguments: Value = serde_json::from_str(&call.function.arguments).unwrap();
            assert_eq!(
                arguments,
                json!({"destination": "Oslo", "passengers": 2, "date": "May 2"}),
                "{tools}"
            );
        }
    }

    #[test]
    fn two_streamed_calls_keep_their_order_and_arguments() {
        let chunk = |index: u64, name: Option<&str>, id: Option<&str>, args: &str| {
            json!({"content": "", "tool_calls": [], "tool_call_chunks": [
                {"name": name, "args": args, "id": id, "index": index, "type": "tool_call_chunk"}]})
            .to_string()
        };
        let events = [
            chunk(0, Some("search_flights"), Some("call_a"), ""),
            chunk(0, None, None, r#"{"destination": "Paris"}"#),
            chunk(1, Some("book_flight"), Some("call_b"), r#"{"destination""#),
            chunk(1, None, None, r#": "Paris", "passengers": 1}"#),
        ];
        let events: Vec<&str> = events.iter().map(String::as_str).collect();
        let s = settings("$.x", Some("$.tool_calls"), Some("$.content"));
        let answer = streamed(&s, &events).unwrap();
        let calls: Vec<(&str, &str, &str)> = answer
            .tool_calls
            .iter()
            .map(|c| {
                (
                    c.id.as_str(),
                    c.function.name.as_str(),
                    c.function.arguments.as_str(),
                )
            })
            .collect();
        assert_eq!(
            calls,
            [
                ("call_a", "search_flights", r#"{"destination": "Paris"}"#),
                (
                    "call_b",
                    "book_flight",
                    r#"{"destination": "Paris", "passengers": 1}"#
                ),
            ]
        );
    }

    #[test]
    fn partial_tool_calls_without_chunks_continue_the_latest_call() {
        let s = settings("$.x", Some("$.message.tool_calls"), Some("$.content"));
        let events = [
            r#"{"content": "", "message": {"tool_calls": [{"name": "book_flight", "args": {}, "id": "call_1"}]}}"#,
            r#"{"content": "", "message": {"tool_calls": [{"name": "", "args": {"destination": "Oslo"}, "id": null}]}}"#,
            r#"{"content": "", "message": {"tool_calls": [{"name": "", "args": {"passengers": 2}, "id": null}]}}"#,
        ];
        let answer = streamed(&s, &events).unwrap();
        assert_eq!(answer.tool_calls.len(), 1, "{answer:?}");
        let arguments: Value =
            serde_json::from_str(&answer.tool_calls[0].function.arguments).unwrap();
        assert_eq!(arguments, json!({"destination": "Oslo", "passengers": 2}));
        assert_eq!(answer.tool_calls[0].id, "call_1");
    }

    #[test]
    fn openai_deltas_at_a_path_are_merged_too() {
        let s = settings(
            "$.x",
            Some("$.choices[0].delta.tool_calls"),
            Some("$.choices[0].delta.content"),
        );
        let events = [
            r#"{"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}]}}]}"#,
            r#"{"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]}}]}"#,
            r#"{"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}]}"#,
        ];
        let answer = streamed(&s, &events).unwrap();
        assert_eq!(answer.tool_calls[0].function.name, "f");
        assert_eq!(answer.tool_calls[0].function.arguments, r#"{"a":1}"#);
    }

    #[test]
    fn a_streamed_call_never_named_or_with_broken_arguments_is_a_fault_quoting_it() {
        let s = settings("$.x", Some("$.tool_call_chunks"), Some("$.content"));
        let fault = streamed(&s, &LANGSERVE_CHUNKS[1..]).unwrap_err();
        assert_eq!(fault.category, FaultCategory::Protocol);
        assert!(
            fault
                .message
                .contains("tool call 0 at `$.tool_call_chunks` has no function name"),
            "{}",
            fault.message
        );
        assert!(fault.message.contains("May 2"), "{}", fault.message);
        let fault = streamed(&s, &LANGSERVE_CHUNKS[..2]).unwrap_err();
        assert!(
            fault
                .message
                .contains("(`book_flight`) at `$.tool_call_chunks`")
                && fault.message.contains("not JSON"),
            "{}",
            fault.message
        );
        assert!(fault.message.contains(r#"\"pas"#), "{}", fault.message);
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
