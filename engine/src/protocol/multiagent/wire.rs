//! The MultiAgentEval wire format: the request the harness sends and the action the agent
//! answers, in both generations real agents speak (specs/multiagent-eval-agent-api.txt and
//! the MultiAgentEval part of FIELD-NOTES.md). Pure: no I/O, so the HTTP, process and
//! socket transports all share it.
//!
//! **Requests.** [`Dialogue`] keeps what a conversation has said and encodes the next
//! request as compact JSON, either the spec's `{task_description, turn,
//! conversation_history}` or, as newer harnesses send, `{task_description}` alone
//! ([`RequestForm`]). History entries are what real harnesses send: `{"role":"agent",
//! "content":<the reply object>}`, `{"role":"environment","content":<tool result>}`,
//! `{"role":"user",…}` and `{"role":"human",…}`, in the order things happened. `content` is
//! never `null` (one sample agent answers HTTP 500 on that). Sample agents decide by
//! searching the history for the tools they already called, so agent entries carry the
//! whole reply object.
//!
//! **Tool results** are worded by the sandbox, not here: [`Dialogue::continue_with`] takes
//! the tool results (environment entries) and the feedback text that becomes the next
//! `task_description`.
//!
//! **Replies.** [`decode_reply`] reads one reply into a typed [`Action`], keys in any
//! order, both generations: `call_tool`, `call_multiple_tools` (`tool_names` +
//! `tool_outputs`, or `tool_calls`), `final_answer`, `completed`, `processing`,
//! `provide_instructions`, `hitl_pause` (`prompt` or `reason`), `branch` and `error`. The
//! reply object is kept as received ([`Reply::raw`]) for the records. A reply that is not
//! JSON is an `invalid_json` fault naming the offending line (agents that print logs on
//! stdout); an unknown action or a known one missing what it needs is a `protocol` fault
//! that says what is wrong and quotes the start of the reply. Nothing an agent sends can
//! panic the decoder.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

use crate::protocol::quote::{error_text, kind_of, preview};
use crate::record::{Fault, FaultCategory};

/// Which request body an agent gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RequestForm {
    /// `{task_description, turn, conversation_history}`: the spec, and what older
    /// harnesses send.
    #[default]
    Full,
    /// `{task_description}` alone, as newer (AgentV) harnesses send.
    TaskOnly,
}

/// One entry of `conversation_history`.
#[derive(Clone, Debug, PartialEq)]
pub enum HistoryEntry {
    /// A user message the agent answered.
    User(String),
    /// A human's answer to a `hitl_pause`.
    Human(String),
    /// The agent's reply object, as received.
    Agent(Map<String, Value>),
    /// What the harness's environment answered: a tool result or a governance verdict.
    /// `null` is sent as `""`.
    Environment(Value),
}

impl HistoryEntry {
    pub fn role(&self) -> &'static str {
        match self {
            HistoryEntry::User(_) => "user",
            HistoryEntry::Human(_) => "human",
            HistoryEntry::Agent(_) => "agent",
            HistoryEntry::Environment(_) => "environment",
        }
    }
}

impl Serialize for HistoryEntry {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("role", self.role())?;
        match self {
            HistoryEntry::User(text) | HistoryEntry::Human(text) => {
                map.serialize_entry("content", text)?
            }
            HistoryEntry::Agent(reply) => map.serialize_entry("content", reply)?,
            HistoryEntry::Environment(Value::Null) => map.serialize_entry("content", "")?,
            HistoryEntry::Environment(result) => map.serialize_entry("content", result)?,
        }
        map.end()
    }
}

/// Where the current `task_description` came from, so it enters the history (in order,
/// just before the agent's answer to it) once the agent has answered.
#[derive(Clone, Debug, Default, PartialEq)]
enum Pending {
    #[default]
    Nothing,
    User(String),
    Human(String),
}

/// What a MultiAgentEval conversation has said so far, and the next request.
///
/// A conversation is a sequence of requests: a user step begins one loop
/// ([`Dialogue::begin_user`]), each reply is recorded ([`Dialogue::record_reply`]), tool
/// results continue the loop ([`Dialogue::continue_with`]), `processing` resends
/// ([`Dialogue::resend`]). `turn` counts requests from 1 over the whole conversation.
/// Cloning is forking: the history is owned, so a copy continues independently.
#[derive(Clone, Debug, PartialEq)]
pub struct Dialogue {
    form: RequestForm,
    task_description: String,
    turn: u32,
    history: Vec<HistoryEntry>,
    pending: Pending,
}

#[derive(serde::Serialize)]
struct FullRequest<'a> {
    task_description: &'a str,
    turn: u32,
    conversation_history: &'a [HistoryEntry],
}

#[derive(serde::Serialize)]
struct TaskOnlyRequest<'a> {
    task_description: &'a str,
}

impl Dialogue {
    pub fn new(form: RequestForm) -> Self {
        Dialogue {
            form,
            task_description: String::new(),
            turn: 0,
            history: Vec::new(),
            pending: Pending::Nothing,
        }
    }

    /// A user step: `text` is the next `task_description`.
    pub fn begin_user(&mut self, text: impl Into<String>) {
        let text = text.into();
        self.next_task(text.clone(), Pending::User(text));
    }

    /// A human's answer to a `hitl_pause`: `text` is the next `task_description`.
    pub fn begin_human(&mut self, text: impl Into<String>) {
        let text = text.into();
        self.next_task(text.clone(), Pending::Human(text));
    }

    /// The seam with the tool sandbox: after a `call_tool` or `call_multiple_tools`, the
    /// tool results enter the history (one environment entry each, in call order) and
    /// `feedback` (the sandbox's wording of them) is the next `task_description`.
    pub fn continue_with(
        &mut self,
        results: impl IntoIterator<Item = Value>,
        feedback: impl Into<String>,
    ) {
        self.history
            .extend(results.into_iter().map(HistoryEntry::Environment));
        self.next_task(feedback.into(), Pending::Nothing);
    }

    /// `processing`: the same request again, one turn later.
    pub fn resend(&mut self) {
        self.turn = self.turn.saturating_add(1);
    }

    /// Records the agent's answer to the current request. A `processing` reply is not
    /// history: the agent asked for the same request again.
    pub fn record_reply(&mut self, reply: &Reply) {
        if reply.action == Action::Processing {
            return;
        }
        match std::mem::take(&mut self.pending) {
            Pending::Nothing => {}
            Pending::User(text) => self.history.push(HistoryEntry::User(text)),
            Pending::Human(text) => self.history.push(HistoryEntry::Human(text)),
        }
        self.history.push(HistoryEntry::Agent(reply.raw.clone()));
    }

    /// The next request body: compact JSON, without a line ending (transports frame it).
    pub fn request(&self) -> Result<Vec<u8>, Fault> {
        let encoded = match self.form {
            RequestForm::Full => serde_json::to_vec(&FullRequest {
                task_description: &self.task_description,
                turn: self.turn.max(1),
                conversation_history: &self.history,
            }),
            RequestForm::TaskOnly => serde_json::to_vec(&TaskOnlyRequest {
                task_description: &self.task_description,
            }),
        };
        encoded.map_err(|e| {
            Fault::new(
                FaultCategory::Internal,
                format!("could not encode the MultiAgentEval request: {e}"),
            )
        })
    }

    pub fn task_description(&self) -> &str {
        &self.task_description
    }

    /// The `turn` of the next request (1 before anything was sent).
    pub fn turn(&self) -> u32 {
        self.turn.max(1)
    }

    pub fn history(&self) -> &[HistoryEntry] {
        &self.history
    }

    fn next_task(&mut self, task_description: String, pending: Pending) {
        // A step whose request was never answered leaves nothing in the history: the
        // agent never saw it.
        self.task_description = task_description;
        self.pending = pending;
        self.turn = self.turn.saturating_add(1);
    }
}

/// One tool call the agent asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// Empty when the agent sent none (`tool_names` without params run with `{}`).
    pub params: Map<String, Value>,
    /// The output the agent claims the tool returned (`tool_output`): recorded, never
    /// used; the sandbox answers calls.
    pub claimed_output: Option<Value>,
}

/// What the agent did, as its reply's `action` says.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    CallTool(ToolCall),
    /// At least one call, in the order the agent listed them.
    CallMultipleTools(Vec<ToolCall>),
    FinalAnswer {
        summary: Option<String>,
    },
    /// Newer agents: the task succeeded.
    Completed {
        text: Option<String>,
    },
    /// Newer agents: still working; the harness resends the same request.
    Processing,
    ProvideInstructions {
        instructions: Option<String>,
        summary: Option<String>,
    },
    /// The agent waits for a human (`prompt` in older agents and every harness, `reason`
    /// in the spec).
    HitlPause {
        prompt: Option<String>,
    },
    /// The agent asks for the conversation to fork here (`metadata.reason` in the spec).
    Branch {
        reason: Option<String>,
        metadata: Map<String, Value>,
    },
    /// The agent reports it cannot do the task (HTTP 200 with `action: "error"`).
    Error {
        message: Option<String>,
    },
}

/// Every action this decoder knows, as named on the wire.
pub const ACTIONS: [&str; 9] = [
    "call_tool",
    "call_multiple_tools",
    "final_answer",
    "completed",
    "processing",
    "provide_instructions",
    "hitl_pause",
    "branch",
    "error",
];

impl Action {
    /// The action's name on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            Action::CallTool(_) => "call_tool",
            Action::CallMultipleTools(_) => "call_multiple_tools",
            Action::FinalAnswer { .. } => "final_answer",
            Action::Completed { .. } => "completed",
            Action::Processing => "processing",
            Action::ProvideInstructions { .. } => "provide_instructions",
            Action::HitlPause { .. } => "hitl_pause",
            Action::Branch { .. } => "branch",
            Action::Error { .. } => "error",
        }
    }

    /// Whether the action ends the loop of a user step (the spec's list, plus `completed`).
    pub fn ends_loop(&self) -> bool {
        matches!(
            self,
            Action::FinalAnswer { .. }
                | Action::Completed { .. }
                | Action::ProvideInstructions { .. }
                | Action::Error { .. }
        )
    }

    /// The text of a loop-ending action, the turn's reply for criteria: the final
    /// answer's `summary`, the instructions given (else their summary), what `completed`
    /// said, the error's message. `None` for the other actions.
    pub fn final_text(&self) -> Option<&str> {
        match self {
            Action::FinalAnswer { summary } => summary.as_deref(),
            Action::Completed { text } => text.as_deref(),
            Action::ProvideInstructions {
                instructions,
                summary,
            } => instructions.as_deref().or(summary.as_deref()),
            Action::Error { message } => message.as_deref(),
            _ => None,
        }
    }
}

/// One decoded reply.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub action: Action,
    /// The reply object as received (keys sorted), for the records and the history.
    pub raw: Map<String, Value>,
    /// The agent's name, if the reply says it ([`agent_name`]).
    pub agent_name: Option<String>,
}

impl Reply {
    /// The `summary` most actions carry (a call's "Identified customer…"), for the records.
    pub fn summary(&self) -> Option<&str> {
        self.raw.get("summary").and_then(Value::as_str)
    }
}

/// The agent's name, in the harness's order: top-level `name` / `agent_name`, then
/// `metadata.name` / `metadata.agent_name`, then `metadata.model`. Blank and non-string
/// values are skipped.
pub fn agent_name(reply: &Map<String, Value>) -> Option<String> {
    let named = |map: &Map<String, Value>, key: &str| {
        map.get(key)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
    };
    let metadata = reply.get("metadata").and_then(Value::as_object);
    named(reply, "name")
        .or_else(|| named(reply, "agent_name"))
        .or_else(|| metadata.and_then(|m| named(m, "name")))
        .or_else(|| metadata.and_then(|m| named(m, "agent_name")))
        .or_else(|| metadata.and_then(|m| named(m, "model")))
}

/// Decodes one reply: a line from a process or socket, or an HTTP body.
pub fn decode_reply(body: &[u8]) -> Result<Reply, Fault> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(Fault::new(
            FaultCategory::Protocol,
            "the agent sent an empty reply, expected a JSON object with an `action`",
        ));
    }
    let value: Value = serde_json::from_slice(body).map_err(|e| not_json(body, &e))?;
    let Value::Object(raw) = value else {
        return Err(protocol(
            body,
            format!(
                "the agent answered with {}, expected a JSON object with an `action`",
                kind_of(&value)
            ),
        ));
    };
    let action = match raw.get("action") {
        None | Some(Value::Null) => {
            return Err(protocol(body, "the reply has no `action`".to_owned()));
        }
        Some(Value::String(action)) => action.as_str(),
        Some(other) => {
            return Err(protocol(
                body,
                format!("the reply's `action` is {}, expected a string", kind_of(other)),
            ));
        }
    };
    let fields = Fields {
        raw: &raw,
        action,
        body,
    };
    let action = match action {
        "call_tool" => Action::CallTool(fields.tool_call()?),
        "call_multiple_tools" => Action::CallMultipleTools(fields.tool_calls()?),
        "final_answer" => Action::FinalAnswer {
            summary: fields.first_text(&["summary", "answer", "final_answer", "content"])?,
        },
        "completed" => Action::Completed {
            text: fields.first_text(&["summary", "result", "answer", "message", "content"])?,
        },
        "processing" => Action::Processing,
        "provide_instructions" => {
            let instructions = fields.text("instructions")?;
            let summary = fields.text("summary")?;
            if instructions.is_none() && summary.is_none() {
                return Err(fields.malformed("has neither `instructions` nor `summary`"));
            }
            Action::ProvideInstructions {
                instructions,
                summary,
            }
        }
        "hitl_pause" => Action::HitlPause {
            prompt: fields.first_text(&["prompt", "reason", "message"])?,
        },
        "branch" => {
            let metadata = match raw.get("metadata") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(metadata)) => metadata.clone(),
                Some(other) => {
                    return Err(fields.malformed(&format!(
                        "has a `metadata` that is {}, expected an object",
                        kind_of(other)
                    )));
                }
            };
            let reason = match metadata.get("reason") {
                Some(Value::String(reason)) => Some(reason.clone()),
                _ => fields.text("reason")?,
            };
            Action::Branch { reason, metadata }
        }
        "error" => Action::Error {
            message: fields.error_message()?,
        },
        unknown => {
            return Err(protocol(
                body,
                format!(
                    "unknown action `{}` (expected one of {})",
                    preview(unknown.as_bytes()),
                    ACTIONS.join(", ")
                ),
            ));
        }
    };
    let agent_name = agent_name(&raw);
    Ok(Reply {
        action,
        raw,
        agent_name,
    })
}

/// A reply that is not JSON. An agent that logs on stdout sends lines that are not JSON
/// before (or instead of) its answer: name the first such line, not just a byte offset.
fn not_json(body: &[u8], error: &serde_json::Error) -> Fault {
    let lines: Vec<&[u8]> = body
        .split(|&b| b == b'\n')
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
        .collect();
    let offending = body
        .split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.iter().all(u8::is_ascii_whitespace))
        .find(|(_, line)| serde_json::from_slice::<Value>(line).is_err());
    let message = match offending {
        Some((index, line)) if lines.len() > 1 => {
            // A line that does not even start like JSON is output that is not the answer:
            // logs. Say so, since that is what the agent's author has to fix.
            let starts_like_json = line
                .iter()
                .find(|b| !b.is_ascii_whitespace())
                .is_some_and(|b| matches!(b, b'{' | b'[' | b'"'));
            format!(
                "the agent's reply is not JSON: line {} is not JSON{}: {}",
                index + 1,
                if starts_like_json {
                    ""
                } else {
                    " (an agent must print only its answer on stdout, logs go to stderr)"
                },
                preview(line)
            )
        }
        Some(_) | None if lines.len() > 1 => format!(
            "the agent's reply is not one JSON document ({} lines, {error}): {}",
            lines.len(),
            preview(body)
        ),
        _ => format!(
            "the agent's reply is not JSON ({error}): {}",
            preview(body)
        ),
    };
    Fault::new(FaultCategory::InvalidJson, message)
}

fn protocol(body: &[u8], what: String) -> Fault {
    Fault::new(FaultCategory::Protocol, format!("{what}: {}", preview(body)))
}

/// The fields of one reply object, read with faults that name the action and the field.
struct Fields<'a> {
    raw: &'a Map<String, Value>,
    action: &'a str,
    body: &'a [u8],
}

impl Fields<'_> {
    fn malformed(&self, what: &str) -> Fault {
        protocol(self.body, format!("action `{}` {what}", self.action))
    }

    /// A text field: absent and `null` are `None`; numbers and booleans read as their
    /// JSON text (agents built on loosely typed models send `"summary": 42`); arrays and
    /// objects are a fault.
    fn text(&self, key: &str) -> Result<Option<String>, Fault> {
        self.text_in(self.raw, key, key)
    }

    fn text_in(
        &self,
        map: &Map<String, Value>,
        key: &str,
        shown: &str,
    ) -> Result<Option<String>, Fault> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(scalar @ (Value::Number(_) | Value::Bool(_))) => Ok(Some(scalar.to_string())),
            Some(other) => Err(self.malformed(&format!(
                "has a `{shown}` that is {}, expected a string",
                kind_of(other)
            ))),
        }
    }

    fn first_text(&self, keys: &[&str]) -> Result<Option<String>, Fault> {
        for key in keys {
            if let Some(text) = self.text(key)? {
                return Ok(Some(text));
            }
        }
        Ok(None)
    }

    /// The sample agents put the message in `summary`; others in `message`, or an
    /// `error` string or `{code, message}` object.
    fn error_message(&self) -> Result<Option<String>, Fault> {
        if let Some(text) = self.first_text(&["summary", "message", "reason"])? {
            return Ok(Some(text));
        }
        Ok(match self.raw.get("error") {
            None | Some(Value::Null) => None,
            Some(error) => Some(error_text(error)),
        })
    }

    /// `call_tool`: `tool_name` (or `tool`), `tool_params` (or `params`), `tool_output`.
    fn tool_call(&self) -> Result<ToolCall, Fault> {
        self.call_in(self.raw, "")
    }

    /// One call from `map`; `at` says where it is (`tool_calls[1]`) in faults.
    fn call_in(&self, map: &Map<String, Value>, at: &str) -> Result<ToolCall, Fault> {
        let key = |name: &str| format!("{at}{}{name}", if at.is_empty() { "" } else { "." });
        let name_key = if map.contains_key("tool_name") {
            "tool_name"
        } else {
            "tool"
        };
        let name = match map.get(name_key) {
            Some(Value::String(name)) if !name.trim().is_empty() => name.clone(),
            Some(Value::String(_)) => {
                return Err(self.malformed(&format!("has an empty `{}`", key(name_key))));
            }
            None | Some(Value::Null) => {
                return Err(self.malformed(&format!("has no `{}`", key("tool_name"))));
            }
            Some(other) => {
                return Err(self.malformed(&format!(
                    "has a `{}` that is {}, expected a string",
                    key(name_key),
                    kind_of(other)
                )));
            }
        };
        let params_key = if map.contains_key("tool_params") {
            "tool_params"
        } else {
            "params"
        };
        let params = self.params(map.get(params_key), &key(params_key))?;
        let claimed_output = map
            .get("tool_output")
            .or_else(|| map.get("output"))
            .filter(|output| !output.is_null())
            .cloned();
        Ok(ToolCall {
            name,
            params,
            claimed_output,
        })
    }

    /// Parameters: an object; absent or `null` is `{}`; a string holding a JSON object
    /// (OpenAI-style `arguments`) is read as that object.
    fn params(&self, value: Option<&Value>, shown: &str) -> Result<Map<String, Value>, Fault> {
        match value {
            None | Some(Value::Null) => Ok(Map::new()),
            Some(Value::Object(params)) => Ok(params.clone()),
            Some(Value::String(text)) => match serde_json::from_str::<Value>(text) {
                Ok(Value::Object(params)) => Ok(params),
                _ => Err(self.malformed(&format!(
                    "has a `{shown}` string that is not a JSON object"
                ))),
            },
            Some(other) => Err(self.malformed(&format!(
                "has a `{shown}` that is {}, expected an object",
                kind_of(other)
            ))),
        }
    }

    /// `call_multiple_tools`, newer shape first (`tool_calls: [{tool|tool_name,
    /// params|tool_params}]`), else the spec's `tool_names` (+ `tool_outputs`, and
    /// `tool_params` when an agent sends them aligned with the names).
    fn tool_calls(&self) -> Result<Vec<ToolCall>, Fault> {
        let calls = match self.raw.get("tool_calls").filter(|v| !v.is_null()) {
            Some(Value::Array(entries)) => entries
                .iter()
                .enumerate()
                .map(|(index, entry)| match entry {
                    Value::Object(call) => self.call_in(call, &format!("tool_calls[{index}]")),
                    other => Err(self.malformed(&format!(
                        "has a `tool_calls[{index}]` that is {}, expected an object",
                        kind_of(other)
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(self.malformed(&format!(
                    "has a `tool_calls` that is {}, expected an array",
                    kind_of(other)
                )));
            }
            None => self.named_calls()?,
        };
        if calls.is_empty() {
            return Err(self.malformed("names no tool"));
        }
        Ok(calls)
    }

    fn named_calls(&self) -> Result<Vec<ToolCall>, Fault> {
        let names = match self.raw.get("tool_names") {
            None | Some(Value::Null) => {
                return Err(self.malformed("has neither `tool_calls` nor `tool_names`"));
            }
            Some(Value::Array(names)) => names,
            Some(other) => {
                return Err(self.malformed(&format!(
                    "has a `tool_names` that is {}, expected an array of strings",
                    kind_of(other)
                )));
            }
        };
        let aligned = |key: &str| -> Result<&[Value], Fault> {
            match self.raw.get(key) {
                None | Some(Value::Null) => Ok(&[]),
                Some(Value::Array(values)) => Ok(values.as_slice()),
                Some(other) => Err(self.malformed(&format!(
                    "has a `{key}` that is {}, expected an array",
                    kind_of(other)
                ))),
            }
        };
        let outputs = aligned("tool_outputs")?;
        let params = aligned("tool_params")?;
        names
            .iter()
            .enumerate()
            .map(|(index, name)| {
                let name = match name {
                    Value::String(name) if !name.trim().is_empty() => name.clone(),
                    Value::String(_) => {
                        return Err(self.malformed(&format!("has an empty `tool_names[{index}]`")));
                    }
                    other => {
                        return Err(self.malformed(&format!(
                            "has a `tool_names[{index}]` that is {}, expected a string",
                            kind_of(other)
                        )));
                    }
                };
                Ok(ToolCall {
                    name,
                    params: self.params(params.get(index), &format!("tool_params[{index}]"))?,
                    claimed_output: outputs.get(index).filter(|o| !o.is_null()).cloned(),
                })
            })
            .collect()
    }
}
