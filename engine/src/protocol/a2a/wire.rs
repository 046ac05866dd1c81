//! The pure codec of the Agent2Agent protocol (docs/language.md, "A2A agents"): the agent
//! card, the JSON-RPC request of one user message, and the assembly of the answer from the
//! results a server sends (one result for `message/send`, one per event for
//! `message/stream`). No I/O here, so every input can be fed to it directly (the property
//! tests in `engine/tests/it/a2a_props.rs` do).
//!
//! Both wire generations real servers emit are read: parts tagged `kind` (v0.2.x/0.3) or
//! `type` (older), results tagged `kind`, and the v1.0 shapes (a result wrapped as `{"task":
//! …}` / `{"message": …}` / `{"statusUpdate": …}` / `{"artifactUpdate": …}`, states written
//! `TASK_STATE_COMPLETED`, roles `ROLE_AGENT`, parts known only by their `text` / `data` /
//! `raw` / `url` field, a file's type and name in the part's `mediaType` and `filename`).
//! The turn's structured data is written in the v0.3 shape whichever generation the server
//! speaks, as the `a2a-sdk`'s own v0.3 compatibility layer converts it
//! (`a2a.compat.v0_3.conversions`), so one `json-path` reads both.

use indexmap::IndexMap;
use serde_json::{Map, Value, json};

use crate::record::{Fault, FaultCategory};
use crate::transport::quote::{error_text, kind_of, preview};

/// What the client takes from an agent card.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentCard {
    /// Where JSON-RPC requests go: the card's `url` (or its JSON-RPC interface), if any.
    pub url: Option<String>,
    /// `capabilities.streaming`.
    pub streaming: bool,
    /// The protocol version of that endpoint: v1.0 servers take other method names and
    /// message shapes.
    pub version: Version,
    /// The card as the server sent it, for the run's records.
    pub raw: Value,
}

/// Reads an agent card: a JSON object; everything but its endpoint and streaming capability
/// is only recorded.
pub fn parse_card(body: &[u8]) -> Result<AgentCard, Fault> {
    let raw: Value = serde_json::from_slice(body).map_err(|e| {
        Fault::new(
            FaultCategory::InvalidJson,
            format!("the agent card is not JSON ({e}): {}", preview(body)),
        )
    })?;
    let Some(card) = raw.as_object() else {
        return Err(Fault::new(
            FaultCategory::Protocol,
            format!("the agent card is {}, expected an object", kind_of(&raw)),
        ));
    };
    let (url, version) = match jsonrpc_url(card) {
        Some((url, version)) => (Some(url), version),
        None => {
            // A card that names its transports, none of them JSON-RPC (a v1.0 server
            // serving only HTTP+JSON): the agent url is no endpoint for it either.
            let offered = other_transports(card);
            if !offered.is_empty() {
                return Err(Fault::new(
                    FaultCategory::Setup,
                    format!(
                        "the agent card offers no JSON-RPC interface, which is the binding \
                         Trellis speaks: it offers {}; serve the agent over JSON-RPC too \
                         (a2a-sdk: a JSON-RPC app beside the REST one, listed in \
                         `supportedInterfaces`)",
                        offered.join(", ")
                    ),
                ));
            }
            (None, Version::V03)
        }
    };
    let streaming = card
        .get("capabilities")
        .and_then(|c| c.get("streaming"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(AgentCard {
        url,
        streaming,
        version,
        raw: raw.clone(),
    })
}

/// The card's JSON-RPC endpoint: its `url` when its preferred transport is JSON-RPC (the
/// default), else the JSON-RPC entry of `additionalInterfaces` (v0.3) or
/// `supportedInterfaces` (v1.0, which has no top-level `url`).
fn jsonrpc_url(card: &Map<String, Value>) -> Option<(String, Version)> {
    let is_jsonrpc = |t: Option<&str>| t.is_none_or(|t| t.eq_ignore_ascii_case("JSONRPC"));
    let version_of =
        |object: &Value| Version::of(object.get("protocolVersion").and_then(Value::as_str));
    let card_version = version_of(&Value::Object(card.clone()));
    let preferred = card.get("preferredTransport").and_then(Value::as_str);
    if let Some(url) = card.get("url").and_then(Value::as_str)
        && is_jsonrpc(preferred)
    {
        return Some((url.to_owned(), card_version));
    }
    for key in ["additionalInterfaces", "supportedInterfaces"] {
        let Some(Value::Array(interfaces)) = card.get(key) else {
            continue;
        };
        for interface in interfaces {
            let transport = interface
                .get("transport")
                .or_else(|| interface.get("protocolBinding"))
                .and_then(Value::as_str);
            if transport.is_some_and(|t| t.eq_ignore_ascii_case("JSONRPC"))
                && let Some(url) = interface.get("url").and_then(Value::as_str)
            {
                let version = if interface.get("protocolVersion").is_some() {
                    version_of(interface)
                } else if key == "supportedInterfaces" {
                    Version::V1
                } else {
                    card_version
                };
                return Some((url.to_owned(), version));
            }
        }
    }
    // A `url` whose transport is said to be another is not JSON-RPC's.
    None
}

/// The transports other than JSON-RPC a card names, each as `TRANSPORT at URL`: its
/// `preferredTransport` (at its `url`) and its interfaces'.
fn other_transports(card: &Map<String, Value>) -> Vec<String> {
    let mut offered = Vec::new();
    let mut add = |transport: Option<&str>, url: Option<&str>| {
        if let Some(t) = transport.filter(|t| !t.eq_ignore_ascii_case("JSONRPC")) {
            offered.push(format!("{t} at {}", url.unwrap_or("its url")));
        }
    };
    add(
        card.get("preferredTransport").and_then(Value::as_str),
        card.get("url").and_then(Value::as_str),
    );
    for key in ["additionalInterfaces", "supportedInterfaces"] {
        if let Some(Value::Array(interfaces)) = card.get(key) {
            for interface in interfaces {
                add(
                    interface
                        .get("transport")
                        .or_else(|| interface.get("protocolBinding"))
                        .and_then(Value::as_str),
                    interface.get("url").and_then(Value::as_str),
                );
            }
        }
    }
    offered
}

/// The generation of the protocol an endpoint speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// v0.2/v0.3: `message/send`, `message/stream`, parts tagged `kind`.
    V03,
    /// v1.0: `SendMessage`, `SendStreamingMessage`, `ROLE_USER`, parts known by their field,
    /// the `A2A-Version: 1.0` header.
    V1,
}

impl Version {
    /// From a `protocolVersion` (`"0.3.0"`, `"1.0"`); absent or unreadable is v0.3.
    pub fn of(text: Option<&str>) -> Version {
        let major = text
            .and_then(|t| t.trim().split('.').next())
            .and_then(|m| m.parse::<u32>().ok());
        match major {
            Some(m) if m >= 1 => Version::V1,
            _ => Version::V03,
        }
    }
}

/// The JSON-RPC method of one user message.
pub fn method(version: Version, stream: bool) -> &'static str {
    match (version, stream) {
        (Version::V03, true) => "message/stream",
        (Version::V03, false) => "message/send",
        (Version::V1, true) => "SendStreamingMessage",
        (Version::V1, false) => "SendMessage",
    }
}

/// The JSON-RPC request carrying one user message; `context_id` continues a conversation
/// and `task_id` answers a task still open (one that asked for input).
pub fn request(
    version: Version,
    id: u64,
    stream: bool,
    message_id: &str,
    text: &str,
    context_id: Option<&str>,
    task_id: Option<&str>,
) -> Value {
    let mut message = match version {
        Version::V03 => json!({
            "kind": "message",
            "role": "user",
            "messageId": message_id,
            "parts": [{"kind": "text", "text": text}],
        }),
        Version::V1 => json!({
            "role": "ROLE_USER",
            "messageId": message_id,
            "parts": [{"text": text}],
        }),
    };
    if let Some(context_id) = context_id {
        message["contextId"] = json!(context_id);
    }
    if let Some(task_id) = task_id {
        message["taskId"] = json!(task_id);
    }
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": method(version, stream),
        "params": {"message": message},
    })
}

/// The `result` of one JSON-RPC response to request `id` (a whole body, or one streamed
/// event), or the fault it amounts to: a JSON-RPC error is the agent's (`agent_error`, with
/// its code and message), an envelope without `result`, or answering another request,
/// breaks the protocol.
pub fn response_result(body: &[u8], id: u64) -> Result<Value, Fault> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        Fault::new(
            FaultCategory::InvalidJson,
            format!("the response is not JSON ({e}): {}", preview(body)),
        )
    })?;
    envelope_result(value, id)
}

/// [`response_result`] of an already parsed envelope.
pub fn envelope_result(value: Value, id: u64) -> Result<Value, Fault> {
    let Value::Object(mut envelope) = value else {
        return Err(Fault::new(
            FaultCategory::Protocol,
            format!(
                "the response is {}, expected a JSON-RPC object",
                kind_of(&value)
            ),
        ));
    };
    // An answer to another request (a proxy or a server mixing up its connections) is not
    // this turn's, however well formed. A missing or null id is let through: JSON-RPC
    // gives an error the server could not tie to a request a null id, and some servers
    // leave the id out of streamed events.
    if let Some(answered) = envelope.get("id").filter(|v| !v.is_null())
        && !same_id(answered, id)
    {
        return Err(Fault::new(
            FaultCategory::Protocol,
            format!(
                "the JSON-RPC response answers request id {}, but this turn's request was id {id}",
                preview(answered.to_string().as_bytes())
            ),
        ));
    }
    if let Some(error) = envelope.get("error").filter(|e| !e.is_null()) {
        let code = error
            .get("code")
            .and_then(Value::as_i64)
            .map(|c| format!(" {c}"))
            .unwrap_or_default();
        return Err(Fault::new(
            FaultCategory::AgentError,
            format!(
                "the agent answered with JSON-RPC error{code}: {}",
                error_text(error)
            ),
        ));
    }
    match envelope.remove("result") {
        Some(Value::Object(result)) => Ok(Value::Object(result)),
        Some(other) => Err(Fault::new(
            FaultCategory::Protocol,
            format!(
                "the JSON-RPC `result` is {}, expected a Task or Message object",
                kind_of(&other)
            ),
        )),
        None => Err(Fault::new(
            FaultCategory::Protocol,
            "the JSON-RPC response has neither `result` nor `error`",
        )),
    }
}

/// Whether a response's `id` is `sent`: the number itself, or its decimal string (some
/// servers echo ids as strings).
fn same_id(answered: &Value, sent: u64) -> bool {
    match answered {
        Value::Number(n) => n.as_u64() == Some(sent),
        Value::String(s) => s.parse::<u64>().ok() == Some(sent),
        _ => false,
    }
}

/// Task states, normalised across generations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskState {
    Submitted,
    Working,
    InputRequired,
    AuthRequired,
    Completed,
    Failed,
    Rejected,
    Canceled,
    Unknown,
}

impl TaskState {
    /// `input-required`, `INPUT_REQUIRED` and `TASK_STATE_INPUT_REQUIRED` alike.
    pub fn parse(text: &str) -> TaskState {
        let name = text
            .trim_start_matches("TASK_STATE_")
            .to_ascii_lowercase()
            .replace('_', "-");
        match name.as_str() {
            "submitted" => TaskState::Submitted,
            "working" => TaskState::Working,
            "input-required" => TaskState::InputRequired,
            "auth-required" => TaskState::AuthRequired,
            "completed" => TaskState::Completed,
            "failed" => TaskState::Failed,
            "rejected" => TaskState::Rejected,
            "canceled" | "cancelled" => TaskState::Canceled,
            _ => TaskState::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Submitted => "submitted",
            TaskState::Working => "working",
            TaskState::InputRequired => "input-required",
            TaskState::AuthRequired => "auth-required",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Rejected => "rejected",
            TaskState::Canceled => "canceled",
            TaskState::Unknown => "unknown",
        }
    }

    /// The task is over: a later message starts a new one.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Rejected | TaskState::Canceled
        )
    }

    /// The agent waits for the client: the answer is complete for this turn.
    pub fn is_interrupted(self) -> bool {
        matches!(self, TaskState::InputRequired | TaskState::AuthRequired)
    }
}

/// One artifact, assembled from its chunks.
#[derive(Clone, Debug, Default, PartialEq)]
struct Artifact {
    fields: Map<String, Value>,
    parts: Vec<Value>,
}

/// Builds one turn's answer from the results the server sent, in order.
#[derive(Debug, Default)]
pub struct Assembly {
    context_id: Option<String>,
    task_id: Option<String>,
    state: Option<TaskState>,
    /// The agent's messages of this turn (a Message result, status messages), parts
    /// normalised; a status message replaces the previous status message.
    messages: Vec<Value>,
    status_message: Option<Value>,
    artifacts: IndexMap<String, Artifact>,
    /// A Message result or a final status update arrived: the answer is complete.
    done: bool,
    /// The task reached a terminal or interrupted state in a status update marked
    /// `"final": false`: more events follow (artifacts streamed after the status), and the
    /// stream may end without a `final` one.
    settled: bool,
    /// Whether the answer was a Task (else a direct Message).
    task: bool,
}

/// What one answer amounted to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    pub context_id: Option<String>,
    /// The task, when the answer was one.
    pub task_id: Option<String>,
    pub state: Option<TaskState>,
    /// The text parts of the agent's message, then of the artifacts, one per line.
    pub reply: Option<String>,
    /// The Task or Message the turn ended with, artifacts assembled, in the v0.3 shape
    /// whichever generation the server speaks (see the module docs; the turn's structured
    /// data: `expect reply json-path=…`, `capture json-path=…`).
    pub data: Option<Value>,
    /// A task that ended badly, or one that needs authentication.
    pub fault: Option<Fault>,
}

impl Assembly {
    pub fn new() -> Self {
        Assembly::default()
    }

    /// Whether the answer is complete: a Message, a task in a terminal or interrupted
    /// state, or a status update marked `final`.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Whether a stream that ends now ended with its answer: it is done, or the task
    /// reached its end in an update that said more would follow.
    pub fn ends_with_the_stream(&self) -> bool {
        self.done || self.settled
    }

    /// Applies one `result`. A fault means the result breaks the protocol.
    pub fn apply(&mut self, result: Value) -> Result<(), Fault> {
        let Value::Object(mut result) = result else {
            return Err(Fault::new(
                FaultCategory::Protocol,
                format!("a result is {}, expected an object", kind_of(&result)),
            ));
        };
        // v1.0 wraps the one object a result holds in a field named after its kind.
        for (wrapper, kind) in [
            ("task", "task"),
            ("message", "message"),
            ("statusUpdate", "status-update"),
            ("artifactUpdate", "artifact-update"),
        ] {
            if result.len() == 1
                && let Some(Value::Object(inner)) = result.get(wrapper)
            {
                let mut inner = inner.clone();
                inner.insert("kind".into(), json!(kind));
                result = inner;
                break;
            }
        }
        let kind = result
            .get("kind")
            .or_else(|| result.get("type"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| guess_kind(&result).map(str::to_owned));
        match kind.as_deref() {
            Some("task") => self.apply_task(result),
            Some("message") => {
                self.note_ids(&result, "taskId");
                self.messages.push(normalise_message(result));
                self.done = true;
                Ok(())
            }
            Some("status-update") => self.apply_status_update(result),
            Some("artifact-update") => self.apply_artifact_update(result),
            Some(other) => Err(Fault::new(
                FaultCategory::Protocol,
                format!(
                    "a result of kind `{other}`, expected a task, message, status-update or \
                     artifact-update"
                ),
            )),
            None => Err(Fault::new(
                FaultCategory::Protocol,
                "a result with no `kind`: not a task, message, status-update or artifact-update",
            )),
        }
    }

    fn note_ids(&mut self, object: &Map<String, Value>, task_key: &str) {
        if let Some(context) = object.get("contextId").and_then(Value::as_str) {
            self.context_id = Some(context.to_owned());
        }
        if let Some(task) = object.get(task_key).and_then(Value::as_str) {
            self.task_id = Some(task.to_owned());
        }
    }

    fn apply_task(&mut self, mut task: Map<String, Value>) -> Result<(), Fault> {
        self.task = true;
        self.note_ids(&task, "id");
        if let Some(Value::Array(artifacts)) = task.remove("artifacts") {
            for artifact in artifacts {
                if let Value::Object(artifact) = artifact {
                    self.put_artifact(artifact, false);
                }
            }
        }
        match task.remove("status") {
            Some(Value::Object(status)) => self.apply_status(status, None),
            Some(other) => Err(Fault::new(
                FaultCategory::Protocol,
                format!(
                    "a task's `status` is {}, expected an object",
                    kind_of(&other)
                ),
            )),
            None => Err(Fault::new(
                FaultCategory::Protocol,
                "a task has no `status`",
            )),
        }
    }

    fn apply_status_update(&mut self, mut update: Map<String, Value>) -> Result<(), Fault> {
        self.task = true;
        self.note_ids(&update, "taskId");
        let last = update.get("final").and_then(Value::as_bool);
        match update.remove("status") {
            Some(Value::Object(status)) => self.apply_status(status, last),
            _ => Err(Fault::new(
                FaultCategory::Protocol,
                "a status-update has no `status` object",
            )),
        }
    }

    /// `last`: the update's `final`, when it has one.
    fn apply_status(
        &mut self,
        mut status: Map<String, Value>,
        last: Option<bool>,
    ) -> Result<(), Fault> {
        let Some(state) = status.get("state").and_then(Value::as_str) else {
            return Err(Fault::new(
                FaultCategory::Protocol,
                "a task status has no `state`",
            ));
        };
        let parsed = TaskState::parse(state);
        if parsed == TaskState::Unknown {
            // Not a state to wait out or to end on: said as what it is, not as a task that
            // is still working.
            return Err(Fault::new(
                FaultCategory::Protocol,
                format!(
                    "the task's state `{state}` is not one A2A defines (submitted, working, \
                     input-required, auth-required, completed, failed, rejected, canceled)"
                ),
            ));
        }
        let state = parsed;
        self.state = Some(state);
        // The latest status speaks for the task: a final status without a message does not
        // leave a progress note ("working…") as the reply.
        self.status_message = match status.remove("message") {
            Some(Value::Object(message)) => Some(normalise_message(message)),
            _ => None,
        };
        // `final` says whether more events follow; without it, a task that reached its
        // end (or waits for the user) has said everything. An update that says more follow
        // a terminal state (artifacts after `completed`) is read on: stopping there judged
        // the reply on part of what the agent sent, and dropped the rest unsaid.
        let ended = state.is_terminal() || state.is_interrupted();
        match last {
            Some(true) => self.done = true,
            Some(false) => self.settled |= ended,
            None => self.done |= ended,
        }
        Ok(())
    }

    fn apply_artifact_update(&mut self, mut update: Map<String, Value>) -> Result<(), Fault> {
        self.task = true;
        self.note_ids(&update, "taskId");
        let append = update.get("append").and_then(Value::as_bool) == Some(true);
        match update.remove("artifact") {
            Some(Value::Object(artifact)) => {
                self.put_artifact(artifact, append);
                Ok(())
            }
            _ => Err(Fault::new(
                FaultCategory::Protocol,
                "an artifact-update has no `artifact` object",
            )),
        }
    }

    /// Adds an artifact, or with `append` extends the one of the same `artifactId` (a
    /// streamed chunk); without it a repeated id replaces the artifact.
    fn put_artifact(&mut self, mut artifact: Map<String, Value>, append: bool) {
        let id = artifact
            .get("artifactId")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| format!("#{}", self.artifacts.len()));
        let parts = match artifact.remove("parts") {
            Some(Value::Array(parts)) => parts.into_iter().map(normalise_part).collect(),
            _ => Vec::new(),
        };
        let slot = self.artifacts.entry(id).or_default();
        if !append {
            slot.parts.clear();
        }
        slot.parts.extend(parts);
        for (key, value) in artifact {
            slot.fields.insert(key, value);
        }
    }

    /// The answer so far. An unfinished answer keeps what arrived (the caller reports why
    /// it is unfinished).
    pub fn finish(self) -> Answer {
        let mut messages = self.messages;
        if let Some(status) = self.status_message {
            messages.push(status);
        }
        let mut lines: Vec<String> = messages.iter().flat_map(text_of).collect();
        let artifacts: Vec<Value> = self
            .artifacts
            .into_iter()
            .map(|(_, artifact)| {
                lines.extend(text_of_parts(&artifact.parts));
                let mut object = artifact.fields;
                object.insert("parts".into(), Value::Array(artifact.parts));
                Value::Object(object)
            })
            .collect();
        let reply = (!lines.is_empty()).then(|| lines.join("\n"));
        let data = if self.task {
            let mut task = Map::new();
            task.insert("kind".into(), json!("task"));
            if let Some(id) = &self.task_id {
                task.insert("id".into(), json!(id));
            }
            if let Some(context) = &self.context_id {
                task.insert("contextId".into(), json!(context));
            }
            let mut status = Map::new();
            if let Some(state) = self.state {
                status.insert("state".into(), json!(state.as_str()));
            }
            if let Some(message) = messages.last() {
                status.insert("message".into(), message.clone());
            }
            task.insert("status".into(), Value::Object(status));
            task.insert("artifacts".into(), Value::Array(artifacts));
            Some(Value::Object(task))
        } else {
            messages.last().cloned()
        };
        let fault = self.state.and_then(|state| {
            let said = reply
                .as_deref()
                .map(|text| format!(": {}", quoted(text)))
                .unwrap_or_default();
            let (category, what) = match state {
                TaskState::Failed => (FaultCategory::AgentError, "the agent's task failed"),
                TaskState::Rejected => (FaultCategory::AgentError, "the agent rejected the task"),
                TaskState::Canceled => (FaultCategory::AgentError, "the task was canceled"),
                TaskState::AuthRequired => (
                    FaultCategory::AgentError,
                    "the agent needs authentication (auth-required); set its `header`s",
                ),
                TaskState::Unknown => (FaultCategory::Protocol, "the task is in an unknown state"),
                _ => return None,
            };
            Some(Fault::new(category, format!("{what}{said}")))
        });
        Answer {
            context_id: self.context_id,
            task_id: self.task_id,
            state: self.state,
            reply,
            data,
            fault,
        }
    }
}

/// The agent's words in a fault message, quoted and clipped.
fn quoted(text: &str) -> String {
    let clipped: String = text.chars().take(300).collect();
    if clipped.len() < text.len() {
        format!("{clipped:?}…")
    } else {
        format!("{clipped:?}")
    }
}

/// A result's kind from its fields, for servers that tag nothing (v1.0 inside a wrapper is
/// handled before; this covers a bare object).
fn guess_kind(result: &Map<String, Value>) -> Option<&'static str> {
    if result.contains_key("artifact") {
        Some("artifact-update")
    } else if result.contains_key("taskId") && result.contains_key("status") {
        Some("status-update")
    } else if result.contains_key("status") {
        Some("task")
    } else if result.contains_key("parts") && result.contains_key("role") {
        Some("message")
    } else {
        None
    }
}

/// A message as v0.3 writes it: tagged `kind`, its `role` `agent` or `user` (v1.0's
/// `ROLE_AGENT`, `ROLE_USER`), its parts normalised.
fn normalise_message(mut message: Map<String, Value>) -> Value {
    if let Some(Value::Array(parts)) = message.remove("parts") {
        message.insert(
            "parts".into(),
            Value::Array(parts.into_iter().map(normalise_part).collect()),
        );
    }
    if let Some(role) = message.get("role").and_then(Value::as_str).and_then(role) {
        message.insert("role".into(), json!(role));
    }
    message.insert("kind".into(), json!("message"));
    Value::Object(message)
}

/// A message's role as v0.3 spells it: `agent` and `user`, which v1.0 writes `ROLE_AGENT`
/// and `ROLE_USER`; `None` for any other value (`ROLE_UNSPECIFIED`), which is kept as sent.
fn role(text: &str) -> Option<&'static str> {
    let name = text.strip_prefix("ROLE_").unwrap_or(text);
    if name.eq_ignore_ascii_case("agent") {
        Some("agent")
    } else if name.eq_ignore_ascii_case("user") {
        Some("user")
    } else {
        None
    }
}

/// A part as v0.3 writes it: tagged `kind` (`text`, `data`, `file`), whichever way the server
/// tagged it, and a v1.0 file part (`raw` or `url`, with `mediaType` and `filename`) as
/// v0.3's `file` object (`{"bytes" | "uri", "mimeType", "name"}`). Other fields (`metadata`,
/// a text or data part's `mediaType`, which v0.3 has no place for) are kept as sent.
fn normalise_part(part: Value) -> Value {
    let Value::Object(mut part) = part else {
        return part;
    };
    let kind = match part.remove("type") {
        Some(Value::String(kind)) if !part.contains_key("kind") => Some(kind),
        _ => None,
    };
    if let Some(kind) = kind {
        part.insert("kind".into(), json!(kind));
    } else if !part.contains_key("kind") {
        let guessed = ["text", "data", "file", "raw", "url"]
            .into_iter()
            .find(|k| part.contains_key(*k));
        if let Some(guessed) = guessed {
            let kind = if matches!(guessed, "raw" | "url") {
                "file"
            } else {
                guessed
            };
            part.insert("kind".into(), json!(kind));
        }
    }
    if part.get("kind").and_then(Value::as_str) == Some("file") && !part.contains_key("file") {
        let content = match part.remove("raw") {
            Some(raw) => Some(("bytes", raw)),
            None => part.remove("url").map(|url| ("uri", url)),
        };
        if let Some((key, value)) = content {
            let mut file = Map::new();
            file.insert(key.into(), value);
            if let Some(media_type) = part.remove("mediaType") {
                file.insert("mimeType".into(), media_type);
            }
            if let Some(name) = part.remove("filename") {
                file.insert("name".into(), name);
            }
            part.insert("file".into(), Value::Object(file));
        }
    }
    Value::Object(part)
}

fn text_of(message: &Value) -> Vec<String> {
    match message.get("parts") {
        Some(Value::Array(parts)) => text_of_parts(parts),
        _ => Vec::new(),
    }
}

fn text_of_parts(parts: &[Value]) -> Vec<String> {
    parts
        .iter()
        .filter(|p| p.get("kind").and_then(Value::as_str) == Some("text"))
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_part_generations_form_the_reply() {
        let mut a = Assembly::new();
        a.apply(
            json!({"kind": "message", "role": "agent", "messageId": "m", "contextId": "c",
            "parts": [{"kind": "text", "text": "new"}, {"type": "text", "text": "old"},
                      {"kind": "data", "data": {"n": 1}}]}),
        )
        .unwrap();
        assert!(a.is_done());
        let answer = a.finish();
        assert_eq!(answer.reply.as_deref(), Some("new\nold"));
        assert_eq!(answer.context_id.as_deref(), Some("c"));
        assert_eq!(answer.data.unwrap()["parts"][2]["data"]["n"], 1);
    }

    #[test]
    fn a_state_a2a_does_not_define_is_named_as_a_protocol_fault() {
        let mut a = Assembly::new();
        let fault = a
            .apply(json!({"kind": "task", "id": "t", "contextId": "c",
                "status": {"state": "pondering"}}))
            .unwrap_err();
        assert_eq!(fault.category, FaultCategory::Protocol);
        assert!(fault.message.contains("`pondering`"), "{}", fault.message);
    }

    #[test]
    fn streamed_artifact_chunks_are_appended_by_id() {
        let mut a = Assembly::new();
        let events = [
            json!({"kind": "task", "id": "t", "contextId": "c", "status": {"state": "submitted"}}),
            json!({"kind": "artifact-update", "taskId": "t", "contextId": "c",
                "artifact": {"artifactId": "x", "name": "plan", "parts": [{"kind": "text", "text": "a"}]}}),
            json!({"kind": "artifact-update", "taskId": "t", "contextId": "c", "append": true,
                "lastChunk": true, "artifact": {"artifactId": "x", "parts": [{"kind": "text", "text": "b"}]}}),
            json!({"kind": "status-update", "taskId": "t", "contextId": "c", "final": true,
                "status": {"state": "completed"}}),
        ];
        for e in events {
            assert!(!a.is_done());
            a.apply(e).unwrap();
        }
        assert!(a.is_done());
        let answer = a.finish();
        assert_eq!(answer.reply.as_deref(), Some("a\nb"));
        let data = answer.data.unwrap();
        assert_eq!(data["artifacts"][0]["name"], "plan");
        assert_eq!(data["artifacts"][0]["parts"].as_array().unwrap().len(), 2);
        assert_eq!(answer.state, Some(TaskState::Completed));
        assert!(answer.fault.is_none());
    }

    #[test]
    fn v1_wrapped_results_and_states_are_read() {
        let mut a = Assembly::new();
        a.apply(
            json!({"task": {"id": "t", "contextId": "c", "status": {"state":
            "TASK_STATE_INPUT_REQUIRED", "message": {"role": "ROLE_AGENT", "messageId": "m",
            "parts": [{"text": "Which date?"}]}}}}),
        )
        .unwrap();
        assert!(a.is_done());
        let answer = a.finish();
        assert_eq!(answer.state, Some(TaskState::InputRequired));
        assert_eq!(answer.reply.as_deref(), Some("Which date?"));
    }

    #[test]
    fn v1_roles_and_file_parts_are_written_as_v03_writes_them() {
        let mut a = Assembly::new();
        a.apply(
            json!({"message": {"role": "ROLE_AGENT", "messageId": "m", "contextId": "c",
            "parts": [
                {"text": "see", "mediaType": "text/markdown"},
                {"url": "https://h/a.pdf", "mediaType": "application/pdf", "filename": "a.pdf"},
                {"raw": "aGk=", "mediaType": "text/plain", "metadata": {"n": 1}},
                {"data": [1, 2]}
            ]}}),
        )
        .unwrap();
        let data = a.finish().data.unwrap();
        assert_eq!(data["role"], "agent");
        assert_eq!(data["kind"], "message");
        let parts = &data["parts"];
        assert_eq!(
            parts[0],
            json!({"kind": "text", "text": "see", "mediaType": "text/markdown"})
        );
        assert_eq!(
            parts[1],
            json!({"kind": "file", "file": {"uri": "https://h/a.pdf",
                "mimeType": "application/pdf", "name": "a.pdf"}})
        );
        assert_eq!(
            parts[2],
            json!({"kind": "file", "file": {"bytes": "aGk=", "mimeType": "text/plain"},
                "metadata": {"n": 1}})
        );
        assert_eq!(parts[3], json!({"kind": "data", "data": [1, 2]}));

        // v0.3 and older parts and roles are left as they are.
        let older = json!({"kind": "message", "role": "agent", "messageId": "m", "parts": [
            {"kind": "file", "file": {"uri": "https://h/b", "mimeType": "image/png"}},
            {"type": "file", "file": {"bytes": "aGk=", "name": "b"}}]});
        let mut a = Assembly::new();
        a.apply(older).unwrap();
        let data = a.finish().data.unwrap();
        assert_eq!(data["role"], "agent");
        assert_eq!(
            data["parts"],
            json!([{"kind": "file", "file": {"uri": "https://h/b", "mimeType": "image/png"}},
                   {"kind": "file", "file": {"bytes": "aGk=", "name": "b"}}])
        );
        assert_eq!(role("ROLE_USER"), Some("user"));
        assert_eq!(role("user"), Some("user"));
        assert_eq!(role("ROLE_UNSPECIFIED"), None);
    }

    #[test]
    fn a_failed_task_is_an_agent_error_quoting_its_status() {
        let mut a = Assembly::new();
        a.apply(
            json!({"kind": "task", "id": "t", "contextId": "c", "status": {"state": "failed",
            "message": {"kind": "message", "role": "agent", "messageId": "m",
            "parts": [{"kind": "text", "text": "no such city"}]}}}),
        )
        .unwrap();
        let fault = a.finish().fault.unwrap();
        assert_eq!(fault.category, FaultCategory::AgentError);
        assert!(
            fault.message.contains("\"no such city\""),
            "{}",
            fault.message
        );
    }

    #[test]
    fn envelopes_map_to_faults() {
        let err = response_result(
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found"}}"#,
            1,
        )
        .unwrap_err();
        assert_eq!(err.category, FaultCategory::AgentError);
        assert!(err.message.contains("-32601"), "{}", err.message);
        assert_eq!(
            response_result(b"{\"jsonrpc\":\"2.0\",\"id\":1}", 1)
                .unwrap_err()
                .category,
            FaultCategory::Protocol
        );
        assert_eq!(
            response_result(b"{nope", 1).unwrap_err().category,
            FaultCategory::InvalidJson
        );
        assert_eq!(
            response_result(b"[1]", 1).unwrap_err().category,
            FaultCategory::Protocol
        );
    }

    #[test]
    fn an_answer_to_another_request_is_a_protocol_fault() {
        let result = br#"{"kind":"message","role":"agent","parts":[{"kind":"text","text":"hi"}]}"#;
        let envelope = |id: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{}}}"#,
                String::from_utf8_lossy(result)
            )
        };
        let fault = response_result(envelope("6").as_bytes(), 7).unwrap_err();
        assert_eq!(fault.category, FaultCategory::Protocol);
        assert!(
            fault.message.contains("request id 6") && fault.message.contains("id 7"),
            "{}",
            fault.message
        );
        assert!(response_result(envelope("\"req-1\"").as_bytes(), 1).is_err());
        // The same id, as a number or its string; no id; a null one.
        assert!(response_result(envelope("7").as_bytes(), 7).is_ok());
        assert!(response_result(envelope("\"7\"").as_bytes(), 7).is_ok());
        assert!(response_result(envelope("null").as_bytes(), 7).is_ok());
        let without = format!(
            r#"{{"jsonrpc":"2.0","result":{}}}"#,
            String::from_utf8_lossy(result)
        );
        assert!(response_result(without.as_bytes(), 7).is_ok());
    }

    #[test]
    fn card_endpoint_and_streaming() {
        let card =
            parse_card(br#"{"name":"x","url":"http://h/rpc","capabilities":{"streaming":true}}"#)
                .unwrap();
        assert_eq!(card.url.as_deref(), Some("http://h/rpc"));
        assert!(card.streaming);
        let v1 = parse_card(br#"{"name":"x","supportedInterfaces":[{"url":"http://h/v1","protocolBinding":"JSONRPC"}]}"#).unwrap();
        assert_eq!(v1.url.as_deref(), Some("http://h/v1"));
        assert_eq!(v1.version, Version::V1);
        assert!(!v1.streaming);
        assert_eq!(card.version, Version::V03);
        assert_eq!(
            parse_card(b"[]").unwrap_err().category,
            FaultCategory::Protocol
        );
        // No JSON-RPC interface (a v1.0 server serving only REST, a card whose `url` is
        // gRPC's): said, rather than JSON-RPC sent to the agent url as v0.3.
        for card in [
            &br#"{"name":"x","supportedInterfaces":[{"url":"http://h/api","protocolBinding":"HTTP+JSON","protocolVersion":"1.0"}]}"#[..],
            br#"{"name":"x","url":"http://h:50051","preferredTransport":"GRPC"}"#,
        ] {
            let fault = parse_card(card).unwrap_err();
            assert_eq!(fault.category, FaultCategory::Setup, "{fault:?}");
            assert!(fault.message.contains("no JSON-RPC interface"), "{fault:?}");
            assert!(!fault.message.contains("  "), "{fault:?}");
        }
        let fault = parse_card(br#"{"name":"x","supportedInterfaces":[{"url":"http://h/api","protocolBinding":"HTTP+JSON"}]}"#).unwrap_err();
        assert!(
            fault.message.contains("HTTP+JSON at http://h/api"),
            "{fault:?}"
        );
        // A card naming neither: the agent url, as before.
        assert_eq!(parse_card(br#"{"name":"x"}"#).unwrap().url, None);
    }
}
