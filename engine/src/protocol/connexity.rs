//! The Connexity agent contract: `POST /agent/respond`, OpenAI chat history in, the turn's
//! messages out (docs/wire.md, "Connexity").
//!
//! The request is serialised straight from the borrowed history, since this runs once per
//! turn. The response is parsed leniently where real agents differ from the spec (tool-call
//! arguments as an object instead of a JSON string, missing usage fields) and strictly where
//! a guess would hide a broken agent (no `messages`, a message without a role, content that
//! is neither text nor null, no assistant message at all).

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde::Serialize;
use serde_json::{Map, Value};

use super::{
    AgentProtocol, CallContext, ChatMessage, Conversation, Exchange, Session, ToolCall,
    ToolCallFunction, Turn, TurnInput, Usage,
};
use crate::record::{Fault, FaultCategory, ToolCallRecord};
use crate::transport::http::{
    CallLimits, EndpointError, HttpTransport, RetryPolicy, agent_url, with_agent_headers,
    with_retries,
};
use crate::transport::quote::{kind_of, preview};

/// A Connexity agent could not be configured.
pub type ConnexityError = EndpointError;

/// What a request's `messages` carry of the earlier turns (`history`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HistoryMode {
    /// User messages and the agent's final replies (the contract's form).
    #[default]
    Messages,
    /// The whole transcript: the agent's earlier tool calls and tool messages too (what the
    /// platform's own runner sends).
    Full,
}

/// A client for one Connexity agent. Cheap to clone: every session holds one.
#[derive(Clone, Debug)]
pub struct ConnexityClient {
    inner: Arc<ClientConfig>,
}

#[derive(Debug)]
struct ClientConfig {
    url: Url,
    headers: HeaderMap,
    limits: CallLimits,
    retry: RetryPolicy,
    history: HistoryMode,
    transport: HttpTransport,
    /// `POST /agent/respond`, the label of every exchange.
    label: Arc<str>,
}

#[derive(Serialize)]
struct Request<'a> {
    messages: &'a [ChatMessage],
    metadata: RequestMetadata<'a>,
}

#[derive(Serialize)]
struct RequestMetadata<'a> {
    test_case_id: &'a str,
    turn_index: u32,
}

impl ConnexityClient {
    /// `headers` are the agent's rendered `header` nodes; they override the JSON content
    /// type and accept headers the client sends by default.
    pub fn new(
        url: &str,
        headers: Vec<(String, String)>,
        limits: CallLimits,
        retry: RetryPolicy,
        history: HistoryMode,
        transport: HttpTransport,
    ) -> Result<Self, ConnexityError> {
        let parsed = agent_url(url)?;
        let mut defaults = HeaderMap::with_capacity(headers.len() + 2);
        defaults.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        defaults.insert(ACCEPT, HeaderValue::from_static("application/json"));
        let map = with_agent_headers(defaults, &headers)?;
        let label = Arc::from(format!("POST {}", parsed.path()));
        Ok(ConnexityClient {
            inner: Arc::new(ClientConfig {
                url: parsed,
                headers: map,
                limits,
                retry,
                history,
                transport,
                label,
            }),
        })
    }

    pub fn url(&self) -> &Url {
        &self.inner.url
    }

    /// Sends `history` as one request (after retries) and returns the exchange with the
    /// turn it describes.
    pub async fn respond(
        &self,
        history: &[ChatMessage],
        ctx: &CallContext<'_>,
    ) -> (Exchange, Result<ParsedReply, Fault>) {
        let mut exchange = Exchange {
            label: self.inner.label.clone(),
            ..Default::default()
        };
        let turn_index = u32::try_from(history.len().saturating_sub(1)).unwrap_or(u32::MAX);
        let body = match encode_request(history, ctx.test_case_id, turn_index) {
            Ok(body) => body,
            Err(fault) => return (exchange, Err(fault)),
        };
        let config = &*self.inner;
        let headers = ctx.headers(&config.headers);
        let headers = &*headers;
        let attempted = with_retries(
            config.retry,
            config.limits.timeout,
            ctx.deadline,
            |timeout| {
                let body = body.clone();
                async move {
                    let response = self
                        .inner
                        .transport
                        .post_json(
                            &config.url,
                            headers,
                            body,
                            config.limits.max_response_size,
                            timeout,
                        )
                        .await?;
                    parse_response(&response.body)
                }
            },
        )
        .await;
        exchange.attempts = attempted.attempts;
        if let Ok(reply) = &attempted.result {
            exchange.usage = reply.usage;
        }
        (exchange, attempted.result)
    }
}

impl AgentProtocol for ConnexityClient {
    fn open(&self, _conversation: &Conversation<'_>) -> Box<dyn Session> {
        Box::new(ConnexitySession {
            client: self.clone(),
            history: Vec::new(),
        })
    }
}

/// A Connexity conversation: the history the next request resends. Forks copy it.
#[derive(Clone)]
struct ConnexitySession {
    client: ConnexityClient,
    history: Vec<ChatMessage>,
}

impl Session for ConnexitySession {
    fn turn<'a>(
        &'a mut self,
        input: TurnInput<'a>,
        ctx: &'a CallContext<'a>,
    ) -> BoxFuture<'a, Turn> {
        Box::pin(async move {
            match input {
                TurnInput::User(text) => self.history.push(ChatMessage::user(text)),
                // The agent speaks first: it is called with the history as it is (empty).
                TurnInput::Opening => {}
                TurnInput::Call { .. } | TurnInput::Human { .. } | TurnInput::Branch { .. } => {
                    return Turn::failed(Fault::new(
                        FaultCategory::Protocol,
                        format!(
                            "a Connexity agent cannot take a `{}` step (it only answers user \
                             messages)",
                            input.kind()
                        ),
                    ));
                }
            }
            let (exchange, result) = self.client.respond(&self.history, ctx).await;
            let mut turn = Turn {
                exchanges: vec![exchange],
                ..Default::default()
            };
            match result {
                Ok(reply) => {
                    self.remember(reply.reply.as_deref(), &reply.messages);
                    turn.fault = unanswered(&reply.messages).or_else(|| {
                        // As for a model agent: nothing a check of the reply could read.
                        reply.reply.is_none().then(|| {
                            Fault::new(
                                FaultCategory::Protocol,
                                "the answer has no text and no tool call (its last assistant \
                                 message is empty)",
                            )
                        })
                    });
                    turn.messages = reply.messages;
                    turn.reply = reply.reply;
                    turn.tool_calls = reply.tool_calls;
                    turn.model = reply.model;
                    turn.provider = reply.provider;
                    turn.metadata = reply.metadata;
                }
                Err(fault) => turn.fault = Some(fault),
            }
            turn
        })
    }

    fn fork(&self) -> Option<Box<dyn Session>> {
        Some(Box::new(self.clone()))
    }

    /// The history is all the state there is: rebuilt from the inputs and answers.
    fn restore(&mut self, history: &[(TurnInput<'_>, &Turn)]) -> bool {
        let supported = history
            .iter()
            .all(|(input, _)| matches!(input, TurnInput::User(_) | TurnInput::Opening));
        if !supported {
            return false;
        }
        for (input, turn) in history {
            if let TurnInput::User(text) = input {
                self.history.push(ChatMessage::user(*text));
            }
            self.remember(turn.reply.as_deref(), &turn.messages);
        }
        true
    }
}

impl ConnexitySession {
    /// Adds the agent's answer to the history the next request resends.
    fn remember(&mut self, reply: Option<&str>, messages: &[ChatMessage]) {
        match self.client.inner.history {
            HistoryMode::Messages => self
                .history
                .push(ChatMessage::assistant(reply.unwrap_or_default())),
            HistoryMode::Full => self.history.extend(
                messages
                    .iter()
                    .filter(|m| m.role == "assistant" || m.role == "tool")
                    .cloned(),
            ),
        }
    }
}

/// The fault of a reply that ends before the agent answered: with a `tool` message (a
/// reference agent's tool-round cap ends a reply this way) or with tool calls that have no
/// results. Its messages and tool calls are kept on the turn; as for a model agent that hits
/// `max-tool-rounds`, the turn is a protocol fault, not an answer that checks could pass.
fn unanswered(messages: &[ChatMessage]) -> Option<Fault> {
    let last = messages.last()?;
    let why = if last.role == "tool" {
        "the reply ends with a `tool` message and no assistant answer after it (the agent's \
         tool-round cap?)"
    } else if last.role == "assistant" && !last.tool_calls.is_empty() {
        "the reply ends with tool calls that have no results and no answer after them"
    } else {
        return None;
    };
    Some(Fault::new(FaultCategory::Protocol, why))
}

/// One decoded `AgentResponse`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParsedReply {
    pub messages: Vec<ChatMessage>,
    /// The last assistant message with text.
    pub reply: Option<String>,
    pub tool_calls: Vec<ToolCallRecord>,
    pub usage: Option<Usage>,
    pub model: Option<String>,
    pub provider: Option<String>,
    /// The answer's `metadata` (the agent's trace URL, prompt version, …) when it says
    /// anything: recorded with the turn as sent, read by no check.
    pub metadata: Option<Value>,
}

/// The request body: `{"messages": [...], "metadata": {"test_case_id", "turn_index"}}`.
pub fn encode_request(
    history: &[ChatMessage],
    test_case_id: &str,
    turn_index: u32,
) -> Result<Bytes, Fault> {
    let request = Request {
        messages: history,
        metadata: RequestMetadata {
            test_case_id,
            turn_index,
        },
    };
    serde_json::to_vec(&request).map(Bytes::from).map_err(|e| {
        Fault::new(
            FaultCategory::Protocol,
            format!("could not encode the request: {e}"),
        )
    })
}

/// Parses an `AgentResponse` body into the turn it describes. A body that is no turn but
/// carries an `error` (`{"error": {…}}`, `{"messages": [], "error": "rate limited"}`) is the
/// agent's failure, said in its words: it was `protocol` ("no `messages` array"), which hid
/// why. Looked at only when the body is no turn, so a good turn costs nothing more.
pub fn parse_response(body: &[u8]) -> Result<ParsedReply, Fault> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(Fault::new(
            FaultCategory::InvalidJson,
            "empty response body (expected a JSON AgentResponse)",
        ));
    }
    if let Ok(wire) = serde_json::from_slice::<WireResponse>(body) {
        let messages = wire
            .messages
            .into_iter()
            .map(WireMessage::into_message)
            .collect();
        // Matched rather than mapped: the turn is returned in place, not moved through a
        // closure's result on every good answer.
        return match finish_turn(
            messages,
            wire.usage.as_ref(),
            optional_string(wire.model),
            optional_string(wire.provider),
            wire.metadata,
        ) {
            Err(fault) => Err(as_reported(body, fault)),
            turn => turn,
        };
    }
    match parse_lenient(body) {
        Err(fault) => Err(as_reported(body, fault)),
        turn => turn,
    }
}

/// `fault`, a protocol fault of a body that is no turn, as the agent's own error when the
/// body reports one.
fn as_reported(body: &[u8], fault: Fault) -> Fault {
    if fault.category != FaultCategory::Protocol {
        return fault;
    }
    match reported_error(body) {
        Some(error) => Fault::new(
            FaultCategory::AgentError,
            format!("the agent answered with an error: {error}"),
        ),
        None => fault,
    }
}

/// The `error` a response body reports, as text: a string, an object's `message` (or
/// `detail`), else the object's JSON. Without `error` (and without `messages`), the two
/// envelopes services answer a failure with, with status 200 all the same: FastAPI's
/// `{"detail": …}` and `{"status": "error", "message": …}`.
fn reported_error(body: &[u8]) -> Option<String> {
    let Ok(Value::Object(mut root)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    if let Some(error) = root.remove("error") {
        return match error {
            Value::Null => None,
            Value::String(text) => Some(text),
            Value::Object(error) => Some(
                ["message", "detail"]
                    .iter()
                    .find_map(|k| error.get(*k).and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or_else(|| Value::Object(error).to_string()),
            ),
            other => Some(other.to_string()),
        };
    }
    if root.contains_key("messages") {
        return None;
    }
    match root.get("detail") {
        Some(Value::String(text)) => return Some(text.clone()),
        Some(Value::Null) | None => {}
        Some(other) => return Some(other.to_string()),
    }
    let failed = root
        .get("status")
        .and_then(Value::as_str)
        .is_some_and(|s| ["error", "failed", "failure"].contains(&s.to_ascii_lowercase().as_str()));
    if !failed {
        return None;
    }
    Some(match root.get("message").and_then(Value::as_str) {
        Some(message) => message.to_owned(),
        None => Value::Object(root).to_string(),
    })
}

/// The body read as a `Value` when the typed fast path refused it: lenient where real agents
/// differ from the spec, strict where a guess would hide a broken agent.
fn parse_lenient(body: &[u8]) -> Result<ParsedReply, Fault> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        Fault::new(
            FaultCategory::InvalidJson,
            format!("response is not JSON ({e}): {}", preview(body)),
        )
    })?;
    let Value::Object(mut root) = value else {
        return Err(protocol(format!(
            "response is {}, expected an AgentResponse object",
            kind_of(&value)
        )));
    };
    let messages = match root.remove("messages") {
        Some(Value::Array(messages)) => messages,
        None | Some(Value::Null) => {
            return Err(protocol(format!(
                "response has no `messages` array: {}",
                preview(body)
            )));
        }
        Some(other) => {
            return Err(protocol(format!(
                "response `messages` is {}, expected an array",
                kind_of(&other)
            )));
        }
    };

    let messages = messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| parse_message(i, message))
        .collect::<Result<Vec<_>, _>>()?;
    let usage = root.get("usage").cloned();
    finish_turn(
        messages,
        usage.as_ref(),
        optional_string(root.remove("model")),
        optional_string(root.remove("provider")),
        root.remove("metadata"),
    )
}

/// The checks and derived fields shared by both decoding paths.
fn finish_turn(
    messages: Vec<ChatMessage>,
    usage: Option<&Value>,
    model: Option<String>,
    provider: Option<String>,
    metadata: Option<Value>,
) -> Result<ParsedReply, Fault> {
    if !messages.iter().any(|m| m.role == "assistant") {
        return Err(protocol(
            "response has no assistant message (`messages` must end with the assistant's reply)"
                .to_owned(),
        ));
    }
    // The answer is the last assistant text after the last tool result. A reply that ends
    // with a `tool` message (the agent's tool-round cap hit) has no answer: the text written
    // before its tool calls ("Let me check…") is not one, and a check of the reply must see
    // it missing rather than pass on the preamble.
    let reply = messages
        .iter()
        .rev()
        .take_while(|m| m.role == "assistant")
        .find_map(|m| m.content.as_deref().filter(|c| !c.trim().is_empty()))
        .map(str::to_owned)
        // Ending with tool calls that have no results, it has not answered yet.
        .filter(|_| messages.last().is_none_or(|m| m.tool_calls.is_empty()));
    let tool_calls = pair_tool_calls(&messages);
    Ok(ParsedReply {
        messages,
        reply,
        tool_calls,
        usage: usage.and_then(parse_usage),
        model,
        provider,
        // `{}` and `null` (what most agents send) say nothing.
        metadata: metadata
            .filter(|m| !(m.is_null() || m.as_object().is_some_and(serde_json::Map::is_empty))),
    })
}

/// The response exactly as the contract writes it. Decoding straight into it avoids
/// building a JSON tree every turn; a response that does not fit (wrong types, object
/// arguments, …) goes through the tolerant tree walk, which also says what is wrong.
#[derive(serde::Deserialize)]
struct WireResponse {
    messages: Vec<WireMessage>,
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    model: Option<Value>,
    #[serde(default)]
    provider: Option<Value>,
    #[serde(default)]
    metadata: Option<Value>,
}

#[derive(serde::Deserialize)]
struct WireMessage {
    role: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
    /// OpenAI's legacy function calling ([`legacy_role`]). Boxed: rare, and every message
    /// of every answer carried its room.
    #[serde(default)]
    function_call: Option<Box<WireFunction>>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(serde::Deserialize)]
struct WireToolCall {
    #[serde(default)]
    id: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    function: WireFunction,
}

#[derive(serde::Deserialize)]
struct WireFunction {
    name: String,
    /// Only the string form takes the fast path.
    #[serde(default)]
    arguments: Option<String>,
}

impl WireMessage {
    fn into_message(self) -> ChatMessage {
        let legacy = self.function_call.map(|f| *f).map(|f| ToolCall {
            id: String::new(),
            kind: "function".to_owned(),
            function: ToolCallFunction {
                name: f.name,
                arguments: f.arguments.unwrap_or_else(|| "{}".to_owned()),
            },
        });
        ChatMessage {
            role: legacy_role(self.role),
            content: self.content,
            tool_calls: self
                .tool_calls
                .unwrap_or_default()
                .into_iter()
                .map(|c| ToolCall {
                    id: c.id.unwrap_or_default(),
                    kind: c.kind.unwrap_or_else(|| "function".to_owned()),
                    function: ToolCallFunction {
                        name: c.function.name,
                        arguments: c.function.arguments.unwrap_or_else(|| "{}".to_owned()),
                    },
                })
                .chain(legacy)
                .collect(),
            tool_call_id: self.tool_call_id,
            name: self.name,
            parts: Vec::new(),
        }
    }
}

fn parse_message(i: usize, message: Value) -> Result<ChatMessage, Fault> {
    let Value::Object(mut m) = message else {
        return Err(protocol(format!(
            "messages[{i}] is {}, expected an object",
            kind_of(&message)
        )));
    };
    let role = match m.remove("role") {
        Some(Value::String(role)) => role,
        None | Some(Value::Null) => {
            return Err(protocol(format!("messages[{i}] has no `role`")));
        }
        Some(other) => {
            return Err(protocol(format!(
                "messages[{i}].role is {}, expected a string",
                kind_of(&other)
            )));
        }
    };
    let content = match m.remove("content") {
        Some(Value::String(content)) => Some(content),
        None | Some(Value::Null) => None,
        Some(other) => {
            return Err(protocol(format!(
                "messages[{i}].content is {}, expected a string or null",
                kind_of(&other)
            )));
        }
    };
    let mut tool_calls = match m.remove("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .into_iter()
            .enumerate()
            .map(|(j, call)| parse_tool_call(i, j, call))
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(protocol(format!(
                "messages[{i}].tool_calls is {}, expected an array",
                kind_of(&other)
            )));
        }
    };
    match m.remove("function_call") {
        None | Some(Value::Null) => {}
        Some(Value::Object(function)) => tool_calls.push(ToolCall {
            id: String::new(),
            kind: "function".to_owned(),
            function: parse_function(&format!("messages[{i}].function_call"), function)?,
        }),
        Some(other) => {
            return Err(protocol(format!(
                "messages[{i}].function_call is {}, expected an object",
                kind_of(&other)
            )));
        }
    }
    Ok(ChatMessage {
        role: legacy_role(role),
        content,
        tool_calls,
        tool_call_id: optional_string(m.remove("tool_call_id")),
        name: optional_string(m.remove("name")),
        parts: Vec::new(),
    })
}

/// OpenAI's legacy function calling, which agents on older SDKs still send: an assistant's
/// `function_call` (read as one more tool call, without an id) and the `function` message
/// answering it (a `tool` message, paired by name). Ignored, the call was not seen and
/// `no-tool` passed. With `history "full"`, they are sent back in the current form.
fn legacy_role(role: String) -> String {
    if role == "function" {
        "tool".to_owned()
    } else {
        role
    }
}

fn parse_tool_call(i: usize, j: usize, call: Value) -> Result<ToolCall, Fault> {
    let at = || format!("messages[{i}].tool_calls[{j}]");
    let Value::Object(mut call) = call else {
        return Err(protocol(format!(
            "{} is {}, expected an object",
            at(),
            kind_of(&call)
        )));
    };
    let Some(Value::Object(function)) = call.remove("function") else {
        return Err(protocol(format!("{} has no `function` object", at())));
    };
    Ok(ToolCall {
        function: parse_function(&format!("{}.function", at()), function)?,
        id: optional_string(call.remove("id")).unwrap_or_default(),
        kind: optional_string(call.remove("type")).unwrap_or_else(|| "function".to_owned()),
    })
}

/// A call's `{name, arguments}` (a tool call's `function`, or a legacy `function_call`),
/// `at` saying where it is.
fn parse_function(at: &str, mut function: Map<String, Value>) -> Result<ToolCallFunction, Fault> {
    let name = match function.remove("name") {
        Some(Value::String(name)) => name,
        _ => return Err(protocol(format!("{at}.name is not a string"))),
    };
    // The spec says a JSON string; agents built on some frameworks send the object itself.
    let arguments = match function.remove("arguments") {
        Some(Value::String(arguments)) => arguments,
        None | Some(Value::Null) => "{}".to_owned(),
        Some(other) => other.to_string(),
    };
    Ok(ToolCallFunction { name, arguments })
}

/// Pairs each assistant tool call with the `tool` message answering it
/// ([`super::pairing`]).
fn pair_tool_calls(messages: &[ChatMessage]) -> Vec<ToolCallRecord> {
    let mut records: Vec<ToolCallRecord> = messages
        .iter()
        .filter(|m| m.role == "assistant")
        .flat_map(|m| &m.tool_calls)
        .map(|call| ToolCallRecord {
            call_id: call.id.clone(),
            name: call.function.name.clone(),
            arguments: call.function.arguments.clone(),
            result: None,
        })
        .collect();
    super::pairing::pair(
        &mut records,
        messages
            .iter()
            .filter(|m| m.role == "tool")
            .map(|m| super::pairing::ToolResult {
                call_id: m.tool_call_id.as_deref(),
                name: m.name.as_deref(),
                content: m.content.as_deref(),
            }),
    );
    records
}

fn parse_usage(usage: &Value) -> Option<Usage> {
    let usage = usage.as_object()?;
    let field = |key: &str| usage.get(key).and_then(Value::as_u64);
    let parsed = Usage {
        cost: Default::default(),
        prompt_tokens: field("prompt_tokens"),
        completion_tokens: field("completion_tokens"),
        total_tokens: field("total_tokens"),
        priced_prompt_tokens: None,
    };
    (parsed != Usage::default()).then_some(parsed)
}

fn optional_string(value: Option<Value>) -> Option<String> {
    match value {
        Some(Value::String(s)) => Some(s),
        _ => None,
    }
}

fn protocol(message: String) -> Fault {
    Fault::new(FaultCategory::Protocol, message)
}

// ----- registry glue (`super::registry`)

use trellis_dsl::lang::{ArgSpec, Capabilities, EndpointKind, NodeSpec, ProtocolSpec, ValueType};

/// `protocol="connexity"`.
pub const SPEC: ProtocolSpec = ProtocolSpec {
    name: "connexity",
    help: "Connexity's contract: the conversation so far POSTed as `messages`, one JSON answer",
    endpoints: &[EndpointKind::Url, EndpointKind::Builtin],
    settings: &[NodeSpec::setting(
        "history",
        &[ArgSpec::value(ValueType::OneOf(&["messages", "full"]))],
        "what each request carries of earlier turns: the replies, or the whole transcript",
    )],
    capabilities: Capabilities {
        forks: true,
        speaks_first: true,
        carries_tool_mocks: true,
        ..NO_CAPABILITIES
    },
    builtins: &["booking"],

    check: None,
};

/// Nothing: a base the specs fill.
pub(super) const NO_CAPABILITIES: Capabilities = Capabilities::NONE;

/// A Connexity agent's own settings.
#[derive(Clone, Copy, Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct ConnexitySettings {
    pub history: HistoryMode,
}

impl super::registry::PlannedSettings for ConnexitySettings {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

pub struct Module;

impl super::registry::ProtocolModule for Module {
    fn spec(&self) -> &'static ProtocolSpec {
        &SPEC
    }

    fn plan(
        &self,
        _project: &trellis_dsl::Project,
        agent: &trellis_dsl::Agent,
        _templates: &mut crate::render::Templates,
    ) -> Result<Arc<dyn super::registry::PlannedSettings>, crate::render::RenderError> {
        Ok(super::registry::decoded::<ConnexitySettings>(agent))
    }

    fn build(
        &self,
        setup: &super::AgentSetup<'_>,
    ) -> Result<Arc<dyn AgentProtocol>, super::registry::BuildError> {
        let settings = super::registry::settings::<ConnexitySettings>(setup)?;
        Ok(Arc::new(ConnexityClient::new(
            setup.url,
            setup.headers.clone(),
            setup.limits,
            setup.retry,
            settings.history,
            setup.transport.clone(),
        )?))
    }
}
