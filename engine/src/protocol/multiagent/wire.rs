//! The MultiAgentEval wire format: the request the harness sends and the action the agent
//! answers, in both generations real agents speak (docs/wire.md, "MultiAgentEval").
//! Pure: no I/O, so the HTTP, process and
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
//! stdout); a known action missing what it needs is a `protocol` fault (an unknown one is
//! the agent's error, `agent_error`, as the harness counts it) that says what is wrong and
//! quotes the start of the reply. Nothing an agent sends can
//! panic the decoder.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

use crate::record::{Fault, FaultCategory};
use crate::transport::quote::{error_text, kind_of, preview};

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

    /// Continuation `index` (0-based) of `count` after a `branch` action: an environment
    /// entry `{"branch": {index, count, option, reason}}` (1-based index) enters the history
    /// and `Continue on branch K of N: OPTION.` is the next `task_description`.
    pub fn continue_branch(
        &mut self,
        index: usize,
        count: usize,
        option: &str,
        reason: Option<&str>,
    ) {
        let number = index.saturating_add(1);
        let mut branch = Map::new();
        branch.insert("index".into(), Value::from(number));
        branch.insert("count".into(), Value::from(count));
        branch.insert("option".into(), Value::from(option));
        if let Some(reason) = reason {
            branch.insert("reason".into(), Value::from(reason));
        }
        let mut entry = Map::new();
        entry.insert("branch".into(), Value::Object(branch));
        self.history
            .push(HistoryEntry::Environment(Value::Object(entry)));
        let task = if option.trim().is_empty() {
            format!("Continue on branch {number} of {count}.")
        } else {
            format!(
                "Continue on branch {number} of {count}: {}.",
                option.trim().trim_end_matches('.')
            )
        };
        self.next_task(task, Pending::Nothing);
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
    /// The agent asks for the conversation to fork here (`metadata.reason` in the spec),
    /// listing the alternatives to explore (see [`branch_options`]; none: one continuation,
    /// described by the reason).
    Branch {
        reason: Option<String>,
        options: Vec<String>,
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

/// `body` as strict JSON, when it is JSON as Python writes it by default: `NaN`,
/// `Infinity` and `-Infinity` as values (become `null`), and a `\\uD83D` escape without its
/// other half (becomes U+FFFD). `None` when there is none of them to rewrite.
fn python_json(body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len());
    let mut changed = false;
    let mut i = 0;
    let mut in_string = false;
    let hex = |at: usize| -> Option<u16> {
        let digits = body.get(at..at + 4)?;
        u16::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    };
    while let Some(&b) = body.get(i) {
        if in_string {
            match b {
                b'"' => in_string = false,
                b'\\' if body.get(i + 1) == Some(&b'u') => {
                    if let Some(unit) = hex(i + 2) {
                        let high = (0xD800..0xDC00).contains(&unit);
                        let low = (0xDC00..0xE000).contains(&unit);
                        let paired = high
                            && body.get(i + 6..i + 8) == Some(b"\\u")
                            && hex(i + 8).is_some_and(|next| (0xDC00..0xE000).contains(&next));
                        if (high && !paired) || low {
                            out.extend_from_slice(b"\\ufffd");
                            changed = true;
                            i += 6;
                            continue;
                        }
                        if paired {
                            out.extend_from_slice(&body[i..i + 12]);
                            i += 12;
                            continue;
                        }
                    }
                }
                b'\\' => {
                    // An escape's second byte is never the string's end.
                    out.extend_from_slice(body.get(i..i + 2).unwrap_or(&body[i..]));
                    i += 2;
                    continue;
                }
                _ => {}
            }
            out.push(b);
            i += 1;
            continue;
        }
        if b == b'"' {
            in_string = true;
        } else {
            let word = [&b"-Infinity"[..], b"Infinity", b"NaN"]
                .into_iter()
                .find(|w| body[i..].starts_with(w));
            if let Some(word) = word {
                out.extend_from_slice(b"null");
                changed = true;
                i += word.len();
                continue;
            }
        }
        out.push(b);
        i += 1;
    }
    changed.then_some(out)
}

/// Decodes one reply: an HTTP body (or a message's text).
pub fn decode_reply(body: &[u8]) -> Result<Reply, Fault> {
    decode(body, false)
}

/// Decodes one reply read from a process's stdout or a socket: output there that is not JSON
/// and starts no object is a log line or a banner, the agent breaking the protocol.
pub fn decode_line_reply(body: &[u8]) -> Result<Reply, Fault> {
    decode(body, true)
}

fn decode(body: &[u8], from_line: bool) -> Result<Reply, Fault> {
    // A byte order mark before the JSON (a Windows agent's stdout) is no part of it.
    let body = body
        .strip_prefix(crate::transport::http::BOM)
        .unwrap_or(body);
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(Fault::new(
            FaultCategory::Protocol,
            "the agent sent an empty reply, expected a JSON object with an `action`",
        ));
    }
    let value: Value = match serde_json::from_slice(body) {
        Ok(value) => value,
        // What Python's `json.dumps` writes by default and the harness's `json.loads` reads
        // back: tried only once the strict parse failed.
        Err(e) => python_json(body)
            .and_then(|compat| serde_json::from_slice(&compat).ok())
            .ok_or_else(|| not_json(body, &e, from_line))?,
    };
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
                format!(
                    "the reply's `action` is {}, expected a string",
                    kind_of(other)
                ),
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
        // `message` too, as on `completed`: agents answer `{"action": "final_answer",
        // "message": "…"}`, and the scenario files' `target: message` reads it.
        "final_answer" => Action::FinalAnswer {
            summary: fields.first_text(&[
                "summary",
                "answer",
                "final_answer",
                "message",
                "content",
            ])?,
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
            let options = branch_options(&metadata)
                .or_else(|| branch_options(&raw))
                .unwrap_or_default();
            Action::Branch {
                reason,
                options,
                metadata,
            }
        }
        "error" => Action::Error {
            message: fields.error_message()?,
        },
        // The harness counts an action it does not know as the agent's error, as it does
        // `action: "error"` (docs/wire.md).
        unknown => {
            let mut fault = protocol(
                body,
                format!(
                    "unknown action `{}` (expected one of {})",
                    preview(unknown.as_bytes()),
                    ACTIONS.join(", ")
                ),
            );
            fault.category = FaultCategory::AgentError;
            return Err(fault);
        }
    };
    let agent_name = agent_name(&raw);
    Ok(Reply {
        action,
        raw,
        agent_name,
    })
}

/// Keys a branch action may list its alternatives under, first found wins.
pub const BRANCH_OPTION_KEYS: [&str; 4] = ["options", "branches", "alternatives", "paths"];

/// The alternatives a branch action lists under the first of [`BRANCH_OPTION_KEYS`] that is
/// an array in `object` (`metadata` first, then the reply itself): each a string, or an
/// object named by its first string `name`, `label`, `option`, `title` or `description`
/// (compact JSON otherwise). Blank items are dropped.
pub fn branch_options(object: &Map<String, Value>) -> Option<Vec<String>> {
    let items = BRANCH_OPTION_KEYS
        .iter()
        .find_map(|key| object.get(*key).and_then(Value::as_array))?;
    let options: Vec<String> = items
        .iter()
        .map(|item| match item {
            Value::String(text) => text.trim().to_owned(),
            Value::Object(fields) => ["name", "label", "option", "title", "description"]
                .iter()
                .find_map(|key| fields.get(*key).and_then(Value::as_str))
                .map(|text| text.trim().to_owned())
                .unwrap_or_else(|| item.to_string()),
            Value::Null => String::new(),
            other => other.to_string(),
        })
        .filter(|option| !option.is_empty())
        .collect();
    Some(options)
}

/// A reply that is not JSON. An agent that logs on stdout sends lines that are not JSON
/// before (or instead of) its answer: name the first such line, not just a byte offset.
fn not_json(body: &[u8], error: &serde_json::Error, from_line: bool) -> Fault {
    let lines: Vec<&[u8]> = body
        .split(|&b| b == b'\n')
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
        .collect();
    // The first line that is not JSON, and whether it is a syntax error (output that is
    // not the answer: logs) rather than the start of a document cut short.
    let offending = body
        .split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.iter().all(u8::is_ascii_whitespace))
        .find_map(|(index, line)| {
            serde_json::from_slice::<Value>(line).err().map(|e| {
                // Too deep for the parser is JSON all the same, not output of another kind.
                let garbled = !e.is_eof() && !e.to_string().contains("recursion limit");
                (index, line, garbled)
            })
        });
    // A line that is not JSON and does not start an object is output that is not an
    // answer at all (a log line, a banner): the agent broke the protocol, and that line is
    // named. One that starts an object and is cut or garbled is an answer that is not JSON.
    // An HTTP body is no stdout: what is not JSON there is only that (`invalid_json`).
    let logged = from_line
        && offending.is_some_and(|(_, line, garbled)| {
            garbled && !line.trim_ascii_start().starts_with(b"{")
        });
    // Said of a process's stdout and of a socket alike (the decoder is told neither).
    const LOGS: &str = " (an agent writes only its answers there: a process logs on stderr, \
                        a socket server in its own log)";
    // Every line JSON, more than one, on a process's stdout: answers written twice, as a
    // kept process or socket reports them (`protocol`, naming the line); it was
    // `invalid_json` for a process per call.
    let answered_twice = from_line && offending.is_none() && lines.len() > 1;
    let message = match offending {
        None if answered_twice => format!(
            "the agent wrote {} JSON lines where one answer was due (line 2: {}); an agent \
             answers each message with one line",
            lines.len(),
            preview(lines.get(1).copied().unwrap_or_default())
        ),
        Some((index, line, garbled)) if lines.len() > 1 => format!(
            "the agent's reply is not JSON: line {} is not JSON{}: {}",
            index + 1,
            if garbled && from_line { LOGS } else { "" },
            preview(line)
        ),
        None if lines.len() > 1 => format!(
            "the agent's reply is not one JSON document ({} lines, {error}): {}",
            lines.len(),
            preview(body)
        ),
        _ if logged => format!(
            "the agent wrote a line that is not JSON where its answer was due{LOGS}: {}",
            preview(body)
        ),
        _ => format!("the agent's reply is not JSON ({error}): {}", preview(body)),
    };
    let category = if logged || answered_twice {
        FaultCategory::Protocol
    } else {
        FaultCategory::InvalidJson
    };
    Fault::new(category, message)
}

fn protocol(body: &[u8], what: String) -> Fault {
    Fault::new(
        FaultCategory::Protocol,
        format!("{what}: {}", preview(body)),
    )
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
            Some(Value::String(text)) => {
                match serde_json::from_str::<Value>(text) {
                    Ok(Value::Object(params)) => Ok(params),
                    _ => Err(self
                        .malformed(&format!("has a `{shown}` string that is not a JSON object"))),
                }
            }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::transport::line::{
        LineEndpoint, LineLimits, LineTransport, ProcessMode, ProcessSpec,
    };

    fn decode(body: &str) -> Reply {
        match decode_reply(body.as_bytes()) {
            Ok(reply) => reply,
            Err(fault) => panic!("{body} did not decode: {fault:?}"),
        }
    }

    fn fault(body: &[u8]) -> Fault {
        match decode_line_reply(body) {
            Ok(reply) => panic!("{body:?} decoded to {reply:?}"),
            Err(fault) => fault,
        }
    }

    /// A log line where an answer was due is the agent's protocol fault, and the message
    /// says where logs go for both kinds of line agent (it spoke of stdout to a socket's).
    #[test]
    fn a_log_line_where_an_answer_was_due_says_where_logs_go() {
        let fault = fault(b"# agent v1 ready");
        assert_eq!(fault.category, FaultCategory::Protocol);
        assert_eq!(
            fault.message,
            "the agent wrote a line that is not JSON where its answer was due (an agent writes \
             only its answers there: a process logs on stderr, a socket server in its own \
             log): # agent v1 ready"
        );
    }

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    fn request_text(dialogue: &Dialogue) -> String {
        match dialogue.request() {
            Ok(body) => String::from_utf8_lossy(&body).into_owned(),
            Err(fault) => panic!("request: {fault:?}"),
        }
    }

    fn call(name: &str, params: Value, claimed_output: Option<Value>) -> ToolCall {
        ToolCall {
            name: name.into(),
            params: object(params),
            claimed_output,
        }
    }

    // ---- replies: the spec's examples (older generation) ----

    #[test]
    fn call_tool_keeps_the_claimed_output_apart() {
        let reply = decode(
            r#"{"action":"call_tool","tool_name":"get_customer_details","tool_params":{"customer_id":"cust_123"},"tool_output":{"name":"Jane"},"summary":"Identified customer Jane Doe on 100 Mbps plan."}"#,
        );
        assert_eq!(
            reply.action,
            Action::CallTool(call(
                "get_customer_details",
                json!({"customer_id": "cust_123"}),
                Some(json!({"name": "Jane"}))
            ))
        );
        assert_eq!(
            reply.summary(),
            Some("Identified customer Jane Doe on 100 Mbps plan.")
        );
        assert!(!reply.action.ends_loop());
        assert_eq!(reply.action.final_text(), None);
        assert_eq!(reply.raw.get("tool_output"), Some(&json!({"name": "Jane"})));
    }

    #[test]
    fn call_tool_without_params_runs_with_none() {
        for body in [
            r#"{"action":"call_tool","tool_name":"ping"}"#,
            r#"{"action":"call_tool","tool_name":"ping","tool_params":null,"tool_output":null}"#,
        ] {
            assert_eq!(
                decode(body).action,
                Action::CallTool(call("ping", json!({}), None)),
                "{body}"
            );
        }
        // OpenAI-style arguments: a string holding the object.
        assert_eq!(
            decode(r#"{"action":"call_tool","tool_name":"refund","tool_params":"{\"amount\":5}"}"#)
                .action,
            Action::CallTool(call("refund", json!({"amount": 5}), None))
        );
    }

    #[test]
    fn call_multiple_tools_with_names_and_outputs_runs_each_without_params() {
        let reply = decode(
            r#"{"action":"call_multiple_tools","tool_names":["run_line_test","run_remote_speed_test"],"tool_outputs":[{"ok":true},{"mbps":100}],"summary":"Remote diagnostics complete."}"#,
        );
        assert_eq!(
            reply.action,
            Action::CallMultipleTools(vec![
                call("run_line_test", json!({}), Some(json!({"ok": true}))),
                call(
                    "run_remote_speed_test",
                    json!({}),
                    Some(json!({"mbps": 100}))
                ),
            ])
        );
        // Fewer outputs than names, and no outputs at all.
        let reply = decode(
            r#"{"tool_outputs":[{"ok":true}],"tool_names":["a","b"],"action":"call_multiple_tools"}"#,
        );
        assert_eq!(
            reply.action,
            Action::CallMultipleTools(vec![
                call("a", json!({}), Some(json!({"ok": true}))),
                call("b", json!({}), None),
            ])
        );
        // Params aligned with the names, when an agent sends them.
        let reply = decode(
            r#"{"action":"call_multiple_tools","tool_names":["a","b"],"tool_params":[{"x":1},null]}"#,
        );
        assert_eq!(
            reply.action,
            Action::CallMultipleTools(vec![
                call("a", json!({"x": 1}), None),
                call("b", json!({}), None),
            ])
        );
    }

    #[test]
    fn a_byte_order_mark_before_a_reply_is_ignored() {
        let reply =
            decode_line_reply(b"\xEF\xBB\xBF{\"action\":\"final_answer\",\"summary\":\"ok\"}");
        assert_eq!(
            reply.map(|r| r.action.final_text().map(str::to_owned)),
            Ok(Some("ok".to_owned()))
        );
        assert!(decode_line_reply(b"\xEF\xBB\xBF").is_err());
    }

    /// What Python's `json.dumps` writes by default (the harness reads it back): `NaN` and
    /// the infinities become `null`, a surrogate without its pair U+FFFD; a pair, and those
    /// words inside strings, stay as they are.
    #[test]
    fn json_as_python_writes_it_is_read() {
        let reply = decode(
            r#"{"action":"final_answer","summary":"NaN \ud83d\ude00 ok \ud83d","metadata":{"confidence":NaN,"hi":Infinity,"lo":-Infinity}}"#,
        );
        assert_eq!(reply.action.final_text(), Some("NaN \u{1F600} ok \u{FFFD}"));
        assert!(python_json(br#"{"a":1}"#).is_none());
        assert!(decode_reply(br#"{"action":"final_answer","summary":Nope}"#).is_err());
    }

    #[test]
    fn final_answer_ends_the_loop_with_its_summary() {
        let reply = decode(
            r#"{"action":"final_answer","summary":"The issue is resolved. Customer Wi-Fi was on a congested channel."}"#,
        );
        assert!(reply.action.ends_loop());
        assert_eq!(
            reply.action.final_text(),
            Some("The issue is resolved. Customer Wi-Fi was on a congested channel.")
        );
        // The text in `message`, as some agents write it.
        let reply = decode(r#"{"action":"final_answer","message":"done here"}"#);
        assert_eq!(reply.action.final_text(), Some("done here"));
        // No summary at all: the loop still ends, with no text.
        let reply = decode(r#"{"action":"final_answer"}"#);
        assert_eq!(reply.action, Action::FinalAnswer { summary: None });
        assert!(reply.action.ends_loop());
    }

    #[test]
    fn provide_instructions_gives_its_instructions_and_may_lack_a_summary() {
        let reply = decode(
            r#"{"action":"provide_instructions","instructions":"Please connect via Ethernet and run a speed test.","summary":"Guided customer to perform a local speed test."}"#,
        );
        assert_eq!(
            reply.action.final_text(),
            Some("Please connect via Ethernet and run a speed test.")
        );
        assert_eq!(
            reply.summary(),
            Some("Guided customer to perform a local speed test.")
        );
        let reply =
            decode(r#"{"instructions":"Reboot the router.","action":"provide_instructions"}"#);
        assert_eq!(
            reply.action,
            Action::ProvideInstructions {
                instructions: Some("Reboot the router.".into()),
                summary: None
            }
        );
        // Only a summary: that is the text.
        let reply = decode(r#"{"action":"provide_instructions","summary":"Told them."}"#);
        assert_eq!(reply.action.final_text(), Some("Told them."));
        assert!(reply.action.ends_loop());
    }

    #[test]
    fn hitl_pause_reads_prompt_or_reason() {
        let spec = decode(
            r#"{"action":"hitl_pause","reason":"Requesting manual credit override beyond $500 limit."}"#,
        );
        assert_eq!(
            spec.action,
            Action::HitlPause {
                prompt: Some("Requesting manual credit override beyond $500 limit.".into())
            }
        );
        let harness = decode(
            r#"{"action":"hitl_pause","message":"Waiting for human intervention.","prompt":"Approve the refund?"}"#,
        );
        assert_eq!(
            harness.action,
            Action::HitlPause {
                prompt: Some("Approve the refund?".into())
            }
        );
        let bare = decode(r#"{"action":"hitl_pause"}"#);
        assert_eq!(bare.action, Action::HitlPause { prompt: None });
        assert!(!bare.action.ends_loop());
    }

    #[test]
    fn branch_reads_its_reason_from_metadata() {
        let reply = decode(
            r#"{"action":"branch","metadata":{"reason":"Testing alternative resolution path A","path":"A"}}"#,
        );
        assert_eq!(
            reply.action,
            Action::Branch {
                reason: Some("Testing alternative resolution path A".into()),
                options: Vec::new(),
                metadata: object(
                    json!({"reason": "Testing alternative resolution path A", "path": "A"})
                ),
            }
        );
        assert!(!reply.action.ends_loop());
        // A top-level reason, and none at all.
        assert_eq!(
            decode(r#"{"action":"branch","reason":"try B"}"#).action,
            Action::Branch {
                reason: Some("try B".into()),
                options: Vec::new(),
                metadata: Map::new()
            }
        );
        assert_eq!(
            decode(r#"{"action":"branch","metadata":null}"#).action,
            Action::Branch {
                reason: None,
                options: Vec::new(),
                metadata: Map::new()
            }
        );
        // Alternatives: strings or named objects, in metadata or at top level.
        let listed = decode(
            r#"{"action":"branch","metadata":{"reason":"two ways","options":["refund",{"name":" replacement "},"  ",{"x":1}]}}"#,
        );
        match listed.action {
            Action::Branch { options, .. } => {
                assert_eq!(options, vec!["refund", "replacement", r#"{"x":1}"#])
            }
            other => panic!("{other:?}"),
        }
        let top = decode(r#"{"action":"branch","reason":"r","branches":[{"label":"a"},"b"]}"#);
        match top.action {
            Action::Branch { options, .. } => assert_eq!(options, vec!["a", "b"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_branch_continuation_is_announced_in_history_and_task() {
        let mut dialogue = Dialogue::new(RequestForm::Full);
        dialogue.begin_user("Resolve it");
        dialogue.continue_branch(1, 2, "replacement", Some("two ways"));
        assert_eq!(
            dialogue.task_description(),
            "Continue on branch 2 of 2: replacement."
        );
        let body: Value = serde_json::from_slice(&dialogue.request().unwrap()).unwrap();
        assert_eq!(
            body["conversation_history"][0],
            json!({"role":"environment","content":{"branch":{"index":2,"count":2,"option":"replacement","reason":"two ways"}}})
        );
        dialogue.continue_branch(0, 1, "", None);
        assert_eq!(dialogue.task_description(), "Continue on branch 1 of 1.");
    }

    #[test]
    fn error_ends_the_loop_with_its_message() {
        // The sample agent's shape: the message is in `summary`.
        let reply = decode(
            r#"{"action":"error","summary":"Unsupported task: fly me to the moon","name":"Luna-Sample-Agent"}"#,
        );
        assert!(reply.action.ends_loop());
        assert_eq!(
            reply.action.final_text(),
            Some("Unsupported task: fly me to the moon")
        );
        assert_eq!(
            decode(r#"{"action":"error","message":"boom"}"#)
                .action
                .final_text(),
            Some("boom")
        );
        assert_eq!(
            decode(r#"{"action":"error","error":{"code":"E42","message":"no tools"}}"#)
                .action
                .final_text(),
            Some("E42: no tools")
        );
        assert_eq!(
            decode(r#"{"action":"error"}"#).action,
            Action::Error { message: None }
        );
    }

    // ---- replies: the newer generation ----

    #[test]
    fn call_multiple_tools_with_tool_calls_in_both_spellings() {
        let reply = decode(
            r#"{"action":"call_multiple_tools","tool_calls":[{"tool":"ledger_read","params":{"account_id":"ACCT-90017"}},{"tool_name":"customer_read","tool_params":{"customer_id":"CUST-10042"},"tool_output":{"ok":1}},{"tool":"ping"}]}"#,
        );
        assert_eq!(
            reply.action,
            Action::CallMultipleTools(vec![
                call("ledger_read", json!({"account_id": "ACCT-90017"}), None),
                call(
                    "customer_read",
                    json!({"customer_id": "CUST-10042"}),
                    Some(json!({"ok": 1}))
                ),
                call("ping", json!({}), None),
            ])
        );
        // `tool_calls` wins over `tool_names` when an agent sends both.
        let both = decode(
            r#"{"action":"call_multiple_tools","tool_names":["old"],"tool_calls":[{"tool":"new"}]}"#,
        );
        assert_eq!(
            both.action,
            Action::CallMultipleTools(vec![call("new", json!({}), None)])
        );
    }

    #[test]
    fn completed_and_processing() {
        let done = decode(r#"{"action":"completed","summary":"RESERVED_5000"}"#);
        assert!(done.action.ends_loop());
        assert_eq!(done.action.final_text(), Some("RESERVED_5000"));
        assert_eq!(
            decode(r#"{"action":"completed","result":"ok"}"#)
                .action
                .final_text(),
            Some("ok")
        );
        assert_eq!(
            decode(r#"{"action":"completed"}"#).action,
            Action::Completed { text: None }
        );
        let busy = decode(r#"{"action":"processing","status":"working"}"#);
        assert_eq!(busy.action, Action::Processing);
        assert!(!busy.action.ends_loop());
        assert_eq!(busy.action.final_text(), None);
    }

    #[test]
    fn every_action_name_round_trips() {
        for name in ACTIONS {
            let body = match name {
                "call_tool" => json!({"action": name, "tool_name": "t"}),
                "call_multiple_tools" => json!({"action": name, "tool_names": ["t"]}),
                "provide_instructions" => json!({"action": name, "instructions": "i"}),
                _ => json!({"action": name}),
            };
            assert_eq!(decode(&body.to_string()).action.name(), name);
        }
    }

    #[test]
    fn keys_in_any_order_and_whitespace_decode_the_same() {
        let compact = decode(
            r#"{"action":"call_tool","tool_name":"apply_refund","tool_params":{"amount":50},"summary":"s"}"#,
        );
        let shuffled = decode(
            "{ \"summary\" : \"s\",\n  \"tool_params\": {\"amount\": 50},\r\n \"tool_name\": \"apply_refund\", \"action\": \"call_tool\" }\r\n",
        );
        assert_eq!(compact, shuffled);
    }

    // ---- replies: agent names ----

    #[test]
    fn agent_names_are_discovered_in_the_harness_order() {
        let name = |body: &str| decode(body).agent_name;
        assert_eq!(
            name(r#"{"action":"processing","agent_name":"B","name":"A","metadata":{"name":"C"}}"#),
            Some("A".into())
        );
        assert_eq!(
            name(r#"{"action":"processing","agent_name":"B","metadata":{"name":"C"}}"#),
            Some("B".into())
        );
        assert_eq!(
            name(r#"{"action":"processing","metadata":{"agent_name":"D","name":"C","model":"m"}}"#),
            Some("C".into())
        );
        assert_eq!(
            name(r#"{"action":"processing","metadata":{"agent_name":"D","model":"m"}}"#),
            Some("D".into())
        );
        assert_eq!(
            name(r#"{"action":"processing","metadata":{"model":"gpt-4o"}}"#),
            Some("gpt-4o".into())
        );
        // Blank, null and non-string names are skipped, not taken.
        assert_eq!(
            name(
                r#"{"action":"processing","name":"  ","agent_name":null,"metadata":{"name":7,"model":"m"}}"#
            ),
            Some("m".into())
        );
        assert_eq!(name(r#"{"action":"processing","metadata":"x"}"#), None);
        assert_eq!(name(r#"{"action":"processing"}"#), None);
    }

    // ---- replies: faults ----

    #[test]
    fn an_unknown_action_is_an_agent_error_quoting_the_reply() {
        let f = fault(br#"{"action":"dance","tempo":120}"#);
        assert_eq!(f.category, FaultCategory::AgentError);
        assert!(
            f.message.contains("unknown action `dance`"),
            "{}",
            f.message
        );
        assert!(f.message.contains("final_answer"), "{}", f.message);
        assert!(
            f.message.contains(r#"{"action":"dance","tempo":120}"#),
            "{}",
            f.message
        );
        // Names are case-sensitive on the wire, as in the harness.
        assert_eq!(
            fault(br#"{"action":"FINAL_ANSWER"}"#).category,
            FaultCategory::AgentError
        );
    }

    #[test]
    fn replies_without_a_usable_action_are_protocol_faults() {
        for (body, expected) in [
            (&br#"{"summary":"done"}"#[..], "has no `action`"),
            (br#"{"action":null}"#, "has no `action`"),
            (br#"{"action":3}"#, "`action` is a number"),
            (br#"{"action":["final_answer"]}"#, "`action` is an array"),
            (br#"[{"action":"final_answer"}]"#, "answered with an array"),
            (br#""final_answer""#, "answered with a string"),
            (b"null", "answered with null"),
            (b"", "empty reply"),
            (b" \r\n", "empty reply"),
        ] {
            let f = fault(body);
            assert_eq!(f.category, FaultCategory::Protocol, "{body:?}");
            assert!(f.message.contains(expected), "{body:?}: {}", f.message);
        }
    }

    #[test]
    fn a_malformed_known_action_names_the_field() {
        for (body, expected) in [
            (
                r#"{"action":"call_tool"}"#,
                "action `call_tool` has no `tool_name`",
            ),
            (
                r#"{"action":"call_tool","tool_name":null}"#,
                "has no `tool_name`",
            ),
            (
                r#"{"action":"call_tool","tool_name":"  "}"#,
                "has an empty `tool_name`",
            ),
            (
                r#"{"action":"call_tool","tool_name":5}"#,
                "`tool_name` that is a number",
            ),
            (
                r#"{"action":"call_tool","tool_name":"t","tool_params":[1]}"#,
                "`tool_params` that is an array, expected an object",
            ),
            (
                r#"{"action":"call_tool","tool_name":"t","tool_params":"amount=5"}"#,
                "`tool_params` string that is not a JSON object",
            ),
            (
                r#"{"action":"call_multiple_tools"}"#,
                "has neither `tool_calls` nor `tool_names`",
            ),
            (
                r#"{"action":"call_multiple_tools","tool_names":[]}"#,
                "names no tool",
            ),
            (
                r#"{"action":"call_multiple_tools","tool_calls":[]}"#,
                "names no tool",
            ),
            (
                r#"{"action":"call_multiple_tools","tool_names":"a,b"}"#,
                "`tool_names` that is a string",
            ),
            (
                r#"{"action":"call_multiple_tools","tool_names":["a",null]}"#,
                "`tool_names[1]` that is null",
            ),
            (
                r#"{"action":"call_multiple_tools","tool_names":["a"],"tool_outputs":{"a":1}}"#,
                "`tool_outputs` that is an object, expected an array",
            ),
            (
                r#"{"action":"call_multiple_tools","tool_calls":{"tool":"a"}}"#,
                "`tool_calls` that is an object, expected an array",
            ),
            (
                r#"{"action":"call_multiple_tools","tool_calls":[{"tool":"a"},"b"]}"#,
                "`tool_calls[1]` that is a string",
            ),
            (
                r#"{"action":"call_multiple_tools","tool_calls":[{"params":{}}]}"#,
                "has no `tool_calls[0].tool_name`",
            ),
            (
                r#"{"action":"call_multiple_tools","tool_calls":[{"tool":"a","params":7}]}"#,
                "`tool_calls[0].params` that is a number",
            ),
            (
                r#"{"action":"provide_instructions"}"#,
                "has neither `instructions` nor `summary`",
            ),
            (
                r#"{"action":"final_answer","summary":{"text":"x"}}"#,
                "`summary` that is an object, expected a string",
            ),
            (
                r#"{"action":"hitl_pause","prompt":["approve?"]}"#,
                "`prompt` that is an array",
            ),
            (
                r#"{"action":"branch","metadata":"A"}"#,
                "`metadata` that is a string",
            ),
        ] {
            let f = fault(body.as_bytes());
            assert_eq!(f.category, FaultCategory::Protocol, "{body}");
            assert!(f.message.contains(expected), "{body}: {}", f.message);
            // The start of the reply is quoted.
            assert!(f.message.contains(r#"{"action":"#), "{body}: {}", f.message);
        }
    }

    #[test]
    fn scalars_where_text_is_expected_read_as_text() {
        assert_eq!(
            decode(r#"{"action":"final_answer","summary":42}"#)
                .action
                .final_text(),
            Some("42")
        );
        assert_eq!(
            decode(r#"{"action":"completed","summary":true}"#)
                .action
                .final_text(),
            Some("true")
        );
    }

    /// docs/wire.md (MultiAgentEval): an agent that prints logs on stdout breaks the protocol,
    /// a protocol fault naming the line; an answer cut or garbled is one that is not JSON.
    #[test]
    fn a_log_line_on_stdout_is_a_protocol_fault_naming_the_line() {
        // A long-lived process: the line read is a log line.
        let f = fault(b"Loading model weights from /models/agent.bin");
        assert_eq!(f.category, FaultCategory::Protocol);
        assert!(f.message.contains("not JSON"), "{}", f.message);
        assert!(
            f.message.contains("a process logs on stderr"),
            "{}",
            f.message
        );
        assert!(
            f.message
                .contains("Loading model weights from /models/agent.bin"),
            "{}",
            f.message
        );
        // A process per call: stdout holds logs, then the answer. Line 2 is the culprit.
        let f = fault(b"\n[agent] ready\n{\"action\":\"final_answer\",\"summary\":\"Done\"}\n");
        assert_eq!(f.category, FaultCategory::Protocol);
        assert!(f.message.contains("line 2 is not JSON"), "{}", f.message);
        assert!(f.message.contains("[agent] ready"), "{}", f.message);
        assert!(
            f.message.contains("a process logs on stderr"),
            "{}",
            f.message
        );
        assert!(!f.message.contains("final_answer"), "{}", f.message);
        // JSON too deeply nested to read is an answer that is not JSON, not a log line.
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let f = fault(deep.as_bytes());
        assert_eq!(f.category, FaultCategory::InvalidJson, "{}", f.message);
        assert!(f.message.contains("recursion limit"), "{}", f.message);
        // Two answers on two lines: answered twice, as a kept process reports it.
        let f = fault(b"{\"action\":\"processing\"}\n{\"action\":\"final_answer\"}");
        assert_eq!(f.category, FaultCategory::Protocol);
        assert!(
            f.message
                .contains("wrote 2 JSON lines where one answer was due (line 2:"),
            "{}",
            f.message
        );
        // A truncated answer is not blamed on logs.
        let f = fault(b"{\"action\":\n\"final_answer\",");
        assert_eq!(f.category, FaultCategory::InvalidJson);
        assert!(!f.message.contains("logs"), "{}", f.message);
        // Bytes that are not UTF-8 are quoted, not refused.
        let f = fault(b"\xff\xfe garbage");
        assert_eq!(f.category, FaultCategory::Protocol);
        assert!(f.message.contains("garbage"), "{}", f.message);
        // An HTTP body is no stdout: a page where JSON was due is `invalid_json`, unhinted.
        let Err(f) = decode_reply(b"<html><title>Service warming up</title></html>") else {
            panic!("an HTML page decoded");
        };
        assert_eq!(f.category, FaultCategory::InvalidJson);
        assert!(!f.message.contains("stdout"), "{}", f.message);
    }

    #[test]
    fn huge_and_odd_replies_never_panic() {
        // A 5 MB summary is an answer like any other; the fault quote of a huge reply is
        // short.
        let summary = "é".repeat(5 * 1024 * 1024 / 2);
        let body = json!({"action": "final_answer", "summary": summary}).to_string();
        assert_eq!(decode(&body).action.final_text(), Some(summary.as_str()));
        let unknown = json!({"action": "x".repeat(100_000)}).to_string();
        let f = fault(unknown.as_bytes());
        assert!(f.message.len() < 2_000, "{} bytes", f.message.len());
        // Nesting deeper than the parser allows is a fault, not a stack overflow.
        let deep = format!(
            "{{\"action\":\"call_tool\",\"tool_name\":\"t\",\"tool_params\":{}1{}}}",
            "{\"a\":".repeat(10_000),
            "}".repeat(10_000)
        );
        assert_eq!(fault(deep.as_bytes()).category, FaultCategory::InvalidJson);
        // Numbers beyond f64, control characters, duplicate keys (the last one wins, as in
        // Python), emoji and escapes.
        assert_eq!(
            fault(br#"{"action":"call_tool","tool_name":"t","tool_params":{"amount":1e400}}"#)
                .category,
            FaultCategory::InvalidJson
        );
        let odd = decode(
            r#"{"action":"processing","action":"final_answer","summary":"\u0000 tab\t \ud83d\ude00 \"q\""}"#,
        );
        assert_eq!(odd.action.final_text(), Some("\0 tab\t 😀 \"q\""));
        let big = decode(
            r#"{"action":"call_tool","tool_name":"apply_refund","tool_params":{"amount":18446744073709551616,"n":-0.0}}"#,
        );
        let Action::CallTool(call) = big.action else {
            panic!("{:?}", big.action);
        };
        assert!(call.params.get("amount").is_some_and(Value::is_number));
    }

    // ---- requests ----

    #[test]
    fn the_first_request_has_an_empty_history() {
        let mut dialogue = Dialogue::new(RequestForm::Full);
        dialogue.begin_user("Identify the customer and their speed tier.");
        assert_eq!(
            request_text(&dialogue),
            r#"{"task_description":"Identify the customer and their speed tier.","turn":1,"conversation_history":[]}"#
        );
        let mut newer = Dialogue::new(RequestForm::TaskOnly);
        newer.begin_user("Identify the customer and their speed tier.");
        assert_eq!(
            request_text(&newer),
            r#"{"task_description":"Identify the customer and their speed tier."}"#
        );
    }

    #[test]
    fn a_tool_loop_sends_history_as_real_harnesses_do() {
        let mut dialogue = Dialogue::new(RequestForm::Full);
        dialogue.begin_user("Process a $100 refund.");
        let first = decode(
            r#"{"action":"call_tool","tool_name":"apply_refund","tool_params":{"amount":100}}"#,
        );
        dialogue.record_reply(&first);
        dialogue.continue_with(
            [json!({"status": "policy_violation", "violation": "Amount 100 exceeds limit of 50.0"})],
            "GOVERNANCE ERROR: Amount 100 exceeds limit of 50.0. Please adjust your action.",
        );
        assert_eq!(
            request_text(&dialogue),
            concat!(
                r#"{"task_description":"GOVERNANCE ERROR: Amount 100 exceeds limit of 50.0. Please adjust your action.","turn":2,"conversation_history":["#,
                r#"{"role":"user","content":"Process a $100 refund."},"#,
                r#"{"role":"agent","content":{"action":"call_tool","tool_name":"apply_refund","tool_params":{"amount":100}}},"#,
                r#"{"role":"environment","content":{"status":"policy_violation","violation":"Amount 100 exceeds limit of 50.0"}}"#,
                r#"]}"#
            )
        );
        // Two tools at once: one environment entry each, in call order.
        let second = decode(
            r#"{"action":"call_multiple_tools","tool_names":["a","b"],"tool_outputs":[{"fake":1},{"fake":2}]}"#,
        );
        dialogue.record_reply(&second);
        dialogue.continue_with(
            [
                json!({"status": "success", "message": "Executed a"}),
                Value::Null,
            ],
            "Tools ['a', 'b'] returned: [...]. Continue with the task.",
        );
        assert_eq!(dialogue.turn(), 3);
        let text = request_text(&dialogue);
        assert!(
            text.ends_with(concat!(
                r#"{"role":"agent","content":{"action":"call_multiple_tools","tool_names":["a","b"],"tool_outputs":[{"fake":1},{"fake":2}]}},"#,
                r#"{"role":"environment","content":{"message":"Executed a","status":"success"}},"#,
                r#"{"role":"environment","content":""}]}"#
            )),
            "{text}"
        );
        // Never a null content anywhere.
        assert!(!text.contains(r#""content":null"#), "{text}");
        // The newer form sends only the feedback.
        let mut newer = Dialogue::new(RequestForm::TaskOnly);
        newer.begin_user("Process a $100 refund.");
        newer.record_reply(&first);
        newer.continue_with([json!({"status": "success"})], "Executed apply_refund");
        assert_eq!(
            request_text(&newer),
            r#"{"task_description":"Executed apply_refund"}"#
        );
        assert_eq!(newer.history().len(), 3);
    }

    #[test]
    fn user_and_human_steps_enter_the_history_once_answered() {
        let mut dialogue = Dialogue::new(RequestForm::Full);
        dialogue.begin_user("Refund $600.");
        // `processing` resends the same request one turn later, and is not history.
        dialogue.record_reply(&decode(r#"{"action":"processing"}"#));
        dialogue.resend();
        assert_eq!(
            request_text(&dialogue),
            r#"{"task_description":"Refund $600.","turn":2,"conversation_history":[]}"#
        );
        dialogue.record_reply(&decode(
            r#"{"action":"hitl_pause","prompt":"Approve a $600 refund?"}"#,
        ));
        dialogue.begin_human("Approved: go ahead.");
        dialogue.record_reply(&decode(
            r#"{"action":"final_answer","summary":"Refunded."}"#,
        ));
        dialogue.begin_user("Thanks! Anything else?");
        assert_eq!(
            request_text(&dialogue),
            concat!(
                r#"{"task_description":"Thanks! Anything else?","turn":4,"conversation_history":["#,
                r#"{"role":"user","content":"Refund $600."},"#,
                r#"{"role":"agent","content":{"action":"hitl_pause","prompt":"Approve a $600 refund?"}},"#,
                r#"{"role":"human","content":"Approved: go ahead."},"#,
                r#"{"role":"agent","content":{"action":"final_answer","summary":"Refunded."}}"#,
                r#"]}"#
            )
        );
        let roles: Vec<&str> = dialogue.history().iter().map(HistoryEntry::role).collect();
        assert_eq!(roles, ["user", "agent", "human", "agent"]);
    }

    #[test]
    fn a_forked_dialogue_continues_independently() {
        let mut dialogue = Dialogue::new(RequestForm::Full);
        dialogue.begin_user("Resolve the ticket.");
        dialogue.record_reply(&decode(
            r#"{"action":"branch","metadata":{"reason":"path A"}}"#,
        ));
        let mut fork = dialogue.clone();
        dialogue.begin_user("Take path A.");
        fork.begin_user("Take path B.");
        assert!(request_text(&dialogue).starts_with(r#"{"task_description":"Take path A.""#));
        assert!(request_text(&fork).starts_with(r#"{"task_description":"Take path B.""#));
        assert_eq!(dialogue.history(), fork.history());
    }

    #[test]
    fn odd_texts_are_escaped_and_requests_stay_one_line() {
        let mut dialogue = Dialogue::new(RequestForm::Full);
        dialogue.begin_user("line one\nline \"two\"\t\u{1F600}\u{0}");
        dialogue.record_reply(&decode(
            r#"{"action":"final_answer","summary":"multi\nline"}"#,
        ));
        dialogue.begin_user("");
        let text = request_text(&dialogue);
        assert!(!text.contains('\n'), "{text}");
        assert_eq!(
            text,
            concat!(
                r#"{"task_description":"","turn":2,"conversation_history":["#,
                r#"{"role":"user","content":"line one\nline \"two\"\t😀\u0000"},"#,
                r#"{"role":"agent","content":{"action":"final_answer","summary":"multi\nline"}}]}"#
            )
        );
        // What was sent decodes back to the same history.
        let sent: Value = match serde_json::from_str(&text) {
            Ok(value) => value,
            Err(e) => panic!("{e}: {text}"),
        };
        assert_eq!(
            sent.pointer("/conversation_history/0/content"),
            Some(&json!("line one\nline \"two\"\t😀\u{0}"))
        );
    }

    // ---- with real agent processes, through the line transport ----

    fn process(command: &str, mode: ProcessMode) -> LineTransport {
        LineTransport::new(
            LineEndpoint::Process(ProcessSpec {
                command: command.into(),
                env: Vec::new(),
                cwd: None,
                mode,
            }),
            LineLimits {
                timeout: Duration::from_secs(10),
                max_line: 1024 * 1024,
            },
            false,
        )
    }

    async fn exchange(agent: &LineTransport, dialogue: &Dialogue) -> Result<Reply, Fault> {
        let request = dialogue.request()?;
        let answer = agent.call(&request, Duration::from_secs(10)).await?;
        decode_line_reply(&answer.line)
    }

    #[tokio::test]
    async fn a_spec_agent_process_runs_a_tool_loop() {
        // Written to the spec: one request line in, one answer line out. It calls the tool
        // until the history shows the environment answered, as the sample agents do.
        let agent = process(
            r#"while IFS= read -r line; do
                 case "$line" in
                   *'{"role":"environment","content":{"customer":"Jane Doe"}}'*)
                     printf '%s\n' '{"name":"sh-agent","summary":"Jane Doe, 100 Mbps","action":"final_answer"}' ;;
                   *'"turn":1,'*)
                     printf '%s\n' '{"action":"call_tool","tool_name":"get_customer_details","tool_params":{"customer_id":"cust_123"},"tool_output":{"customer":"made up"}}' ;;
                   *) printf '%s\n' '{"action":"error","summary":"unexpected request"}' ;;
                 esac
               done"#,
            ProcessMode::LongLived,
        );
        let mut dialogue = Dialogue::new(RequestForm::Full);
        dialogue.begin_user("Identify the customer and their speed tier.");
        let first = exchange(&agent, &dialogue).await;
        let Ok(first) = first else {
            panic!("{first:?}");
        };
        let Action::CallTool(call) = &first.action else {
            panic!("{:?}", first.action);
        };
        assert_eq!(call.name, "get_customer_details");
        assert_eq!(call.claimed_output, Some(json!({"customer": "made up"})));
        dialogue.record_reply(&first);
        // What the sandbox would answer, worded as the spec's harness words it.
        let result = json!({"customer": "Jane Doe"});
        dialogue.continue_with(
            [result.clone()],
            format!("Tool 'get_customer_details' returned: {result}. Continue with the task."),
        );
        let last = exchange(&agent, &dialogue).await;
        let Ok(last) = last else {
            panic!("{last:?}");
        };
        assert_eq!(last.action.final_text(), Some("Jane Doe, 100 Mbps"));
        assert_eq!(last.agent_name.as_deref(), Some("sh-agent"));
        agent.close().await;
    }

    #[tokio::test]
    async fn a_process_that_logs_on_stdout_is_named_by_its_log_line() {
        // A process per call (as the real harness runs them): the whole of stdout is the
        // answer, and this agent prints a log line before it.
        let agent = process(
            r#"cat >/dev/null; echo '[agent] loading model'; echo '{"action":"final_answer","summary":"Done"}'"#,
            ProcessMode::PerCall,
        );
        let mut dialogue = Dialogue::new(RequestForm::TaskOnly);
        dialogue.begin_user("Say done.");
        let outcome = exchange(&agent, &dialogue).await;
        let Err(fault) = outcome else {
            panic!("{outcome:?}");
        };
        assert_eq!(fault.category, FaultCategory::Protocol);
        assert!(
            fault.message.contains("line 1 is not JSON")
                && fault.message.contains("[agent] loading model"),
            "{}",
            fault.message
        );
        agent.close().await;
    }

    /// A long-lived process that prints a banner on stdout before reading requests: the
    /// banner is read where the first answer was due. It was `invalid_json`, without the
    /// hint a process per call got.
    #[tokio::test]
    async fn a_long_lived_process_that_logs_on_stdout_is_a_protocol_fault() {
        let agent = process(
            r#"echo 'INFO starting agent'; while read -r line; do echo '{"action":"final_answer","summary":"Done"}'; done"#,
            ProcessMode::LongLived,
        );
        let mut dialogue = Dialogue::new(RequestForm::TaskOnly);
        dialogue.begin_user("Say done.");
        // Decoded as the protocol does, in the call: the line is refused there, before the
        // transport looks for a line after it.
        let request = dialogue.request().expect("a request");
        let (_, outcome) = agent
            .call_decoded(&request, Duration::from_secs(10), decode_line_reply, |_| {
                false
            })
            .await;
        let Err(fault) = outcome else {
            panic!("{outcome:?}");
        };
        assert_eq!(fault.category, FaultCategory::Protocol, "{}", fault.message);
        assert!(
            fault.message.contains("INFO starting agent")
                && fault.message.contains("a process logs on stderr"),
            "{}",
            fault.message
        );
        agent.close().await;
    }
}
