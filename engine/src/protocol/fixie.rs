//! The Fixie agent protocol (docs/wire.md, "Fixie"): a handshake `GET {url}/` that
//! returns the agent's `base_prompt` and `few_shots`, and one `POST {url}/FUNC` per function
//! call with `{"message":{"text":…}}` in and out.
//!
//! The handshake is made once per run ([`AgentProtocol::prepare`]) and recorded. Real agents
//! answer it in JSON (the spec) or YAML (later SDKs, with extra fields); both are read.
//! Function calls are stateless; a session holds the client and the conversation so far, and
//! forks copy both.
//!
//! A `user` step is answered as Fixie's platform did, by an LLM in a few-shot loop
//! ([`few_shot_loop`](FixieSession::few_shot_loop)): the model playing Fixie's LLM (the
//! simulator's provider, else the project's only provider: [`LlmRuntime`]) gets the
//! handshake's `base_prompt` and `few_shots` and the conversation so far, and answers with
//! one line. `Ask Func[NAME]: ARGS` becomes a real `POST {url}/NAME` (an exchange and a tool
//! call of the same turn) whose result goes back as `Func[NAME] says: RESULT`; `A: ANSWER`
//! is the turn's reply. Anything else, a function the few-shots never use, or more than
//! [`MAX_ROUNDS`] function calls ends the turn with a `protocol` fault naming the line.
//!
//! Faults always name the function: a missing one (404), a request the agent rejected
//! (422, with its validation detail) and a function that raised (a plain-text 500).
//! Function names become one URL path segment, so they are validated first and a call can
//! never reach another path of the agent.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde::Serialize;
use serde_json::{Map, Value};

use super::{
    AgentProtocol, CallContext, ChatMessage, Conversation, Exchange, Session, ToolCall,
    ToolCallFunction, Turn, TurnInput,
};
use crate::llm::{LlmCall, LlmError, LlmMessage, LlmRuntime};
use crate::record::{Fault, FaultCategory, ToolCallRecord};
use crate::transport::http::{
    CallLimits, EndpointError, HttpTransport, RetryPolicy, agent_url, with_agent_headers,
    with_retries,
};
use crate::transport::quote::{error_text, kind_of, preview};

/// A Fixie agent could not be configured.
pub type FixieError = EndpointError;

pub use trellis_dsl::names::{FunctionNameError, validate_function_name};

/// A client for one Fixie agent: its base URL (with a trailing slash), headers and limits.
#[derive(Clone, Debug)]
pub struct FixieClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    base: Url,
    /// Sent with function calls (JSON in and out).
    call_headers: HeaderMap,
    /// Sent with the handshake (JSON or YAML out).
    handshake_headers: HeaderMap,
    limits: CallLimits,
    retry: RetryPolicy,
    /// `provider=`: the provider whose model plays the agent's LLM (else the simulator's,
    /// else the project's only provider).
    llm_provider: Option<String>,
    transport: HttpTransport,
    /// The handshake, once [`AgentProtocol::prepare`] made it: the few-shot loop's prompt.
    handshake: std::sync::OnceLock<Arc<Handshake>>,
}

impl FixieClient {
    /// `url` is the agent's base URL (`GET {url}/` is the handshake); `headers` are the
    /// agent's rendered `header` nodes and override the default content type and accept
    /// headers.
    pub fn new(
        url: &str,
        headers: Vec<(String, String)>,
        limits: CallLimits,
        retry: RetryPolicy,
        transport: HttpTransport,
    ) -> Result<Self, FixieError> {
        let mut base = agent_url(url)?;
        base.set_fragment(None);
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let mut call_headers = HeaderMap::with_capacity(headers.len() + 2);
        call_headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        call_headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        let mut handshake_headers = HeaderMap::with_capacity(headers.len() + 1);
        handshake_headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, application/yaml;q=0.9, */*;q=0.5"),
        );
        let call_headers = with_agent_headers(call_headers, &headers)?;
        let handshake_headers = with_agent_headers(handshake_headers, &headers)?;
        Ok(FixieClient {
            inner: Arc::new(Inner {
                base,
                call_headers,
                handshake_headers,
                limits,
                retry,
                transport,
                llm_provider: None,
                handshake: std::sync::OnceLock::new(),
            }),
        })
    }

    /// The client with `provider` playing the agent's LLM (`provider=` on the agent).
    pub fn with_llm_provider(mut self, provider: Option<String>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.llm_provider = provider;
        }
        self
    }

    /// The base URL, ending in `/`: the handshake URL.
    pub fn base_url(&self) -> &Url {
        &self.inner.base
    }

    /// `GET {url}/`, read as JSON or YAML (with the agent's retry policy).
    pub async fn handshake(&self) -> Result<Handshake, Fault> {
        let inner = &*self.inner;
        let attempted = with_retries(
            inner.retry,
            inner.limits.timeout,
            None,
            |timeout| async move {
                inner
                    .transport
                    .get(
                        &inner.base,
                        &inner.handshake_headers,
                        inner.limits.max_response_size,
                        timeout,
                    )
                    .await
            },
        )
        .await;
        let response = attempted.result.map_err(|mut fault| {
            let hint = if matches!(http_status(&fault), Some(401 | 403)) {
                " (the agent wants credentials: give the agent a `header \"Authorization\" …`)"
            } else {
                ""
            };
            fault.message = format!(
                "Fixie handshake `GET {}` failed: {}{hint}",
                inner.base.path(),
                fault.message
            );
            fault
        })?;
        Handshake::parse(&response.body).map_err(|e| {
            // A page (a proxy's, a framework's index) parses as a YAML string: said as the
            // page it is, not as "a string, expected a mapping".
            let what = crate::transport::http::html_page(None, &response.body).map_or_else(
                || e.to_string(),
                |page| format!("the answer is {page}, not the agent's base prompt and few-shots"),
            );
            Fault::new(
                FaultCategory::Protocol,
                format!("Fixie handshake `GET {}`: {what}", inner.base.path()),
            )
        })
    }

    /// The URL of function `name`, or why it cannot be called.
    pub fn function_url(&self, name: &str) -> Result<Url, FunctionNameError> {
        validate_function_name(name)?;
        let mut url = self.inner.base.clone();
        // http(s) URLs always have path segments; the error case is a `data:`-style URL,
        // which `new` rejected.
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().push(name);
        }
        Ok(url)
    }

    /// Calls function `function` with `text` (after retries): the exchange and the reply.
    pub async fn call(
        &self,
        function: &str,
        text: &str,
        ctx: &CallContext<'_>,
    ) -> (Exchange, Result<FunctionReply, Fault>) {
        let inner = &*self.inner;
        let mut exchange = Exchange {
            label: "POST (not sent: invalid function name)".into(),
            ..Default::default()
        };
        let url = match self.function_url(function) {
            Ok(url) => url,
            Err(e) => {
                return (
                    exchange,
                    Err(Fault::new(
                        FaultCategory::Protocol,
                        format!("cannot call Func[{function}]: {e}"),
                    )),
                );
            }
        };
        exchange.label = format!("POST {}", url.path()).into();
        let body = match encode_call(text) {
            Ok(body) => body,
            Err(fault) => return (exchange, Err(fault)),
        };
        let headers = ctx.headers(&inner.call_headers);
        let headers = &*headers;
        let attempted = with_retries(inner.retry, inner.limits.timeout, ctx.deadline, |timeout| {
            let body = body.clone();
            let url = &url;
            async move {
                inner
                    .transport
                    .post_json(url, headers, body, inner.limits.max_response_size, timeout)
                    .await
                    .map_err(|fault| name_function(fault, function))
                    .and_then(|response| parse_reply(&response.body, function))
            }
        })
        .await;
        exchange.attempts = attempted.attempts;
        (exchange, attempted.result)
    }
}

impl AgentProtocol for FixieClient {
    fn prepare(&self) -> BoxFuture<'_, Result<Option<Value>, Fault>> {
        Box::pin(async move {
            let handshake = self.handshake().await?;
            let record = handshake.to_record(self.inner.base.path());
            // A second `prepare` would fetch the same handshake; the first one stays.
            let _ = self.inner.handshake.set(Arc::new(handshake));
            Ok(Some(record))
        })
    }

    fn open(&self, conversation: &Conversation<'_>) -> Box<dyn Session> {
        Box::new(FixieSession {
            client: self.clone(),
            llm: conversation.llm.cloned(),
            scenario: conversation.scenario.to_owned(),
            repetition: conversation.repetition,
            history: Vec::new(),
        })
    }
}

/// The most function calls one `user` turn may make before the model must answer.
pub const MAX_ROUNDS: usize = 8;

/// A conversation with a Fixie agent: function calls carry no state; `user` turns keep the
/// few-shot transcript the model sees. Forks are plain copies.
#[derive(Clone)]
struct FixieSession {
    client: FixieClient,
    llm: Option<Arc<LlmRuntime>>,
    scenario: String,
    repetition: u32,
    /// Earlier `user` turns as the model saw and wrote them (`Q:` as a user message, its
    /// lines as assistant messages, function results as user messages).
    history: Vec<LlmMessage>,
}

impl Session for FixieSession {
    fn turn<'a>(
        &'a mut self,
        input: TurnInput<'a>,
        ctx: &'a CallContext<'a>,
    ) -> BoxFuture<'a, Turn> {
        Box::pin(async move {
            let (function, text) = match input {
                TurnInput::Call { function, input } => (function, input),
                TurnInput::User(text) => return self.few_shot_loop(text, ctx).await,
                TurnInput::Opening => {
                    return Turn::failed(Fault::new(
                        FaultCategory::Protocol,
                        "a Fixie agent answers queries and never speaks first, so \
                         `first-turn \"agent\"` has nothing to ask it",
                    ));
                }
                TurnInput::Human { .. } | TurnInput::Branch { .. } => {
                    return Turn::failed(Fault::new(
                        FaultCategory::Protocol,
                        "a Fixie agent never pauses for a human nor asks to branch, so a `hitl` answer or a \
                         branch continuation has no place to go",
                    ));
                }
            };
            let (exchange, result) = self.client.call(function, text, ctx).await;
            let mut turn = Turn {
                exchanges: vec![exchange],
                ..Default::default()
            };
            match result {
                Ok(reply) => {
                    let mut message = ChatMessage::assistant(reply.text.clone());
                    message.name = Some(function.to_owned());
                    message.parts = reply.embed_parts();
                    turn.messages = vec![message];
                    turn.reply = Some(reply.text);
                    // The function itself reported that it failed: the agent's error,
                    // not a broken answer.
                    turn.fault = reply.error.map(|error| {
                        Fault::new(
                            FaultCategory::AgentError,
                            format!("Func[{function}] answered with an error: {error}"),
                        )
                    });
                }
                Err(fault) => turn.fault = Some(fault),
            }
            turn
        })
    }

    fn fork(&self) -> Option<Box<dyn Session>> {
        Some(Box::new(self.clone()))
    }

    /// The transcript is all the state there is: rebuilt from the recorded queries, their
    /// function calls (arguments `{"text":…}`) and answers, as the loop wrote it.
    fn restore(&mut self, history: &[(TurnInput<'_>, &Turn)]) -> bool {
        let supported = history
            .iter()
            .all(|(input, _)| matches!(input, TurnInput::User(_) | TurnInput::Call { .. }));
        if !supported {
            return false;
        }
        for (input, turn) in history {
            let (TurnInput::User(query), None, Some(reply)) = (input, &turn.fault, &turn.reply)
            else {
                // Direct calls and unanswered queries never reach the transcript.
                continue;
            };
            self.history.push(LlmMessage::user(format!("Q: {query}")));
            for call in &turn.tool_calls {
                let input = serde_json::from_str::<Value>(&call.arguments)
                    .ok()
                    .and_then(|v| v.get("text").and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or_default();
                self.history.push(LlmMessage::assistant(format!(
                    "Ask Func[{}]: {input}",
                    call.name
                )));
                self.history.push(LlmMessage::user(format!(
                    "Func[{}] says: {}",
                    call.name,
                    call.result.as_deref().unwrap_or_default()
                )));
            }
            self.history
                .push(LlmMessage::assistant(format!("A: {reply}")));
        }
        true
    }
}

impl FixieSession {
    /// Answers a user query as Fixie's platform did: the model writes one line per round,
    /// `Ask Func[…]` lines are called for real, until an `A:` line.
    async fn few_shot_loop(&mut self, query: &str, ctx: &CallContext<'_>) -> Turn {
        let mut turn = Turn::default();
        let Some(llm) = self.llm.clone() else {
            turn.fault = Some(Fault::new(
                FaultCategory::Setup,
                "a `user` step on a Fixie agent needs a provider playing Fixie's LLM, and \
                 this run has none",
            ));
            return turn;
        };
        let Some(handshake) = self.client.inner.handshake.get().cloned() else {
            turn.fault = Some(Fault::new(
                FaultCategory::Internal,
                "the Fixie handshake was not made before the first turn",
            ));
            return turn;
        };
        let prompt = system_prompt(&handshake);
        let known = handshake.functions();
        let mut lines = vec![LlmMessage::user(format!("Q: {query}"))];
        for round in 0..=MAX_ROUNDS {
            let mut messages = Vec::with_capacity(1 + self.history.len() + lines.len());
            messages.push(LlmMessage::system(prompt.clone()));
            messages.extend(self.history.iter().cloned());
            messages.extend(lines.iter().cloned());
            let call_name = format!(
                "Fixie LLM, scenario `{}` turn {} round {round}",
                self.scenario, ctx.turn_index
            );
            let asked = llm
                .complete_for_agent(
                    self.client.inner.llm_provider.as_deref(),
                    messages,
                    self.repetition,
                    &call_name,
                    ctx.deadline,
                )
                .await;
            let completion = match asked {
                Ok(completion) => completion,
                Err(why) => {
                    turn.fault = Some(Fault::new(FaultCategory::Setup, why));
                    return turn;
                }
            };
            record_model(&mut turn, &completion.call);
            let text = match completion.result {
                Ok(text) => text,
                Err(e) => {
                    turn.fault = Some(llm_fault(&e));
                    return turn;
                }
            };
            match next_step(&text, &known) {
                Err(message) => {
                    turn.fault = Some(Fault::new(FaultCategory::Protocol, message));
                    return turn;
                }
                Ok(Step::Answer(answer)) => {
                    lines.push(LlmMessage::assistant(format!("A: {answer}")));
                    turn.messages.push(ChatMessage::assistant(answer.clone()));
                    turn.reply = Some(answer);
                    self.history.append(&mut lines);
                    return turn;
                }
                Ok(Step::Ask { function, input }) => {
                    if round == MAX_ROUNDS {
                        turn.fault = Some(Fault::new(
                            FaultCategory::Protocol,
                            format!(
                                "Fixie's LLM called functions {MAX_ROUNDS} times without \
                                 answering (`A:`); its next line was `Ask Func[{function}]: \
                                 {input}`"
                            ),
                        ));
                        return turn;
                    }
                    lines.push(LlmMessage::assistant(format!(
                        "Ask Func[{function}]: {input}"
                    )));
                    let result = self.call_function(&mut turn, round, &function, &input, ctx);
                    match result.await {
                        Ok(result) => {
                            lines
                                .push(LlmMessage::user(format!("Func[{function}] says: {result}")));
                        }
                        Err(fault) => {
                            turn.fault = Some(fault);
                            return turn;
                        }
                    }
                }
            }
        }
        // The last round either answered or faulted above.
        turn.fault = Some(Fault::new(
            FaultCategory::Internal,
            "the Fixie few-shot loop ended without an answer",
        ));
        turn
    }

    /// One `Ask Func[…]` line called for real: recorded as an exchange, a tool call with its
    /// result, and the assistant/tool messages; the result text, or the fault ending the turn.
    async fn call_function(
        &self,
        turn: &mut Turn,
        round: usize,
        function: &str,
        input: &str,
        ctx: &CallContext<'_>,
    ) -> Result<String, Fault> {
        let call_id = format!("fixie-{}-{round}", ctx.turn_index);
        // The arguments as the wire's `message` object, so `tool` criteria can match `text`.
        let arguments = serde_json::json!({ "text": input }).to_string();
        let mut asking = ChatMessage::assistant(String::new());
        asking.content = None;
        asking.tool_calls = vec![ToolCall {
            id: call_id.clone(),
            kind: "function".into(),
            function: ToolCallFunction {
                name: function.to_owned(),
                arguments: arguments.clone(),
            },
        }];
        turn.messages.push(asking);
        let (exchange, result) = self.client.call(function, input, ctx).await;
        turn.exchanges.push(exchange);
        let mut record = ToolCallRecord {
            call_id: call_id.clone(),
            name: function.to_owned(),
            arguments,
            result: None,
        };
        let outcome = match result {
            Ok(reply) => {
                record.result = Some(reply.text.clone());
                let mut answer = ChatMessage {
                    role: "tool".into(),
                    content: Some(reply.text.clone()),
                    tool_call_id: Some(call_id),
                    name: Some(function.to_owned()),
                    ..ChatMessage::default()
                };
                answer.parts = reply.embed_parts();
                turn.messages.push(answer);
                match reply.error {
                    None => Ok(reply.text),
                    Some(error) => Err(Fault::new(
                        FaultCategory::AgentError,
                        format!("Func[{function}] answered with an error: {error}"),
                    )),
                }
            }
            Err(fault) => Err(fault),
        };
        turn.tool_calls.push(record);
        outcome
    }
}

/// What the model playing Fixie's LLM is told: the agent's base prompt, the rules of the
/// few-shot format, and the few-shots.
fn system_prompt(handshake: &Handshake) -> String {
    let mut prompt = String::new();
    if let Some(base) = handshake
        .base_prompt
        .as_deref()
        .filter(|b| !b.trim().is_empty())
    {
        prompt.push_str(base.trim());
        prompt.push_str("\n\n");
    }
    prompt.push_str(
        "Answer the user's query (`Q:`) the way the examples below do, writing exactly one \
         line each time. To call a function write `Ask Func[NAME]: INPUT` and stop: its result \
         comes back as `Func[NAME] says: RESULT`. When you can answer, write `A: ANSWER`.",
    );
    for shot in &handshake.few_shots {
        prompt.push_str("\n\n");
        prompt.push_str(shot.trim());
    }
    prompt
}

/// What the model's line asks for.
#[derive(Debug, PartialEq)]
enum Step {
    Ask { function: String, input: String },
    Answer(String),
}

/// Reads the model's answer: its first line that is not an echo of the query. Lines after an
/// `Ask Func[…]` line are the model guessing the result and are ignored. `Err` names the
/// line that breaks the format.
fn next_step(text: &str, known: &[String]) -> Result<Step, String> {
    let mut lines = parse_few_shot(text).into_iter();
    let first = lines.find(|line| !matches!(line, FewShotLine::Query(_)));
    let shown = |line: &str| -> String { line.chars().take(200).collect() };
    match first {
        None => Err(format!(
            "Fixie's LLM wrote no `Ask Func[…]` or `A:` line: {:?}",
            shown(text.trim())
        )),
        Some(FewShotLine::Answer(answer)) => Ok(Step::Answer(answer)),
        Some(FewShotLine::AskFunc { function, input }) => {
            if known.is_empty() || known.contains(&function) {
                Ok(Step::Ask { function, input })
            } else {
                Err(format!(
                    "Fixie's LLM asked for a function the agent's few-shots never use: \
                     `Ask Func[{function}]: {}` (known: {})",
                    shown(&input),
                    known.join(", ")
                ))
            }
        }
        Some(FewShotLine::AskAgent { agent, input }) => Err(format!(
            "Fixie's LLM asked another agent (`Ask Agent[{agent}]: {}`), which trellis does \
             not route",
            shown(&input)
        )),
        Some(FewShotLine::FuncSays { function, result }) => Err(format!(
            "Fixie's LLM wrote a function result itself instead of asking for it: \
             `Func[{function}] says: {}`",
            shown(&result)
        )),
        Some(FewShotLine::AgentSays { agent, result }) => Err(format!(
            "Fixie's LLM wrote an agent's answer itself: `Agent[{agent}] says: {}`",
            shown(&result)
        )),
        Some(FewShotLine::Other(line) | FewShotLine::Query(line)) => Err(format!(
            "Fixie's LLM wrote a line that is neither `Ask Func[NAME]: INPUT` nor `A: ANSWER`: \
             {:?}",
            shown(&line)
        )),
    }
}

/// Keeps the model and provider that answered on the turn, and the call with its usage.
fn record_model(turn: &mut Turn, call: &LlmCall) {
    if !call.model.is_empty() {
        turn.model = Some(call.model.clone());
    }
    turn.provider = Some(call.provider.clone());
    turn.llm.push(call.clone());
}

/// The fault of a failed call to the model playing Fixie's LLM.
fn llm_fault(error: &LlmError) -> Fault {
    let category = match error {
        LlmError::Http { category, .. } => *category,
        LlmError::RateLimited { .. } => FaultCategory::Timeout,
        LlmError::NotJson { .. } => FaultCategory::InvalidJson,
        LlmError::Malformed { .. } | LlmError::Provider { .. } => FaultCategory::Protocol,
        LlmError::NoModel { .. } | LlmError::CacheMiss { .. } | LlmError::Cache(_) => {
            FaultCategory::Setup
        }
        // Only seen by a turn the stopping run no longer records.
        LlmError::Budget(_) => FaultCategory::Internal,
    };
    Fault::new(category, format!("Fixie's LLM: {error}"))
}

/// What a function answered.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FunctionReply {
    /// `message.text`.
    pub text: String,
    /// `message.embeds`, by name, as sent.
    pub embeds: Map<String, Value>,
    /// A non-null top-level `error` (SDK 1.x `{code, message, details}`), as text.
    pub error: Option<String>,
}

impl FunctionReply {
    /// The embeds as message parts: `{"type":"embed","name":…,"embed":…}` each.
    pub fn embed_parts(&self) -> Vec<Value> {
        self.embeds
            .iter()
            .map(|(name, embed)| {
                serde_json::json!({ "type": "embed", "name": name, "embed": embed })
            })
            .collect()
    }
}

/// The request body `{"message":{"text":…}}`.
pub fn encode_call(text: &str) -> Result<Bytes, Fault> {
    #[derive(Serialize)]
    struct Request<'a> {
        message: Message<'a>,
    }
    #[derive(Serialize)]
    struct Message<'a> {
        text: &'a str,
    }
    serde_json::to_vec(&Request {
        message: Message { text },
    })
    .map(Bytes::from)
    .map_err(|e| {
        Fault::new(
            FaultCategory::Protocol,
            format!("could not encode the request: {e}"),
        )
    })
}

/// Reads `{"message":{"text":…,"embeds":{…}}}`; other fields are tolerated.
pub fn parse_reply(body: &[u8], function: &str) -> Result<FunctionReply, Fault> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        Fault::new(
            FaultCategory::InvalidJson,
            format!(
                "Func[{function}] answered with a body that is not JSON ({e}): {}",
                preview(body)
            ),
        )
    })?;
    let protocol =
        |what: String| Fault::new(FaultCategory::Protocol, format!("Func[{function}] {what}"));
    let Value::Object(mut root) = value else {
        return Err(protocol(format!(
            "answered with {}, expected an object with a `message`",
            kind_of(&value)
        )));
    };
    let error = match root.remove("error") {
        None | Some(Value::Null) => None,
        Some(error @ Value::Object(_)) => Some(error_text(&error)),
        Some(other) => Some(other.to_string()),
    };
    let mut message = match root.remove("message") {
        Some(Value::Object(message)) => message,
        // An error and nothing else: the function's failure, said in its words (it was
        // `protocol`, "answered without a `message` object", which hid why).
        None | Some(Value::Null) if error.is_some() => {
            return Err(Fault::new(
                FaultCategory::AgentError,
                format!(
                    "Func[{function}] answered with an error: {}",
                    error.unwrap_or_default()
                ),
            ));
        }
        None | Some(Value::Null) => {
            return Err(protocol("answered without a `message` object".to_owned()));
        }
        Some(other) => {
            return Err(protocol(format!(
                "answered with `message` as {}, expected an object",
                kind_of(&other)
            )));
        }
    };
    let text = match message.remove("text") {
        Some(Value::String(text)) => text,
        None | Some(Value::Null) => {
            return Err(protocol("answered without `message.text`".to_owned()));
        }
        Some(other) => {
            return Err(protocol(format!(
                "answered with `message.text` as {}, expected a string",
                kind_of(&other)
            )));
        }
    };
    let embeds = match message.remove("embeds") {
        Some(Value::Object(embeds)) => embeds,
        // Anything else carries nothing to keep apart; a broken embed is not worth failing
        // a call whose text arrived.
        _ => Map::new(),
    };
    Ok(FunctionReply {
        text,
        embeds,
        error,
    })
}

/// Says which function a transport fault is about, and what the usual statuses mean.
fn name_function(mut fault: Fault, function: &str) -> Fault {
    let meaning = match (fault.category, http_status(&fault)) {
        (FaultCategory::Http4xx, Some(404)) => "does not exist on the agent",
        (FaultCategory::Http4xx, Some(405)) => "does not accept POST",
        (FaultCategory::Http4xx, Some(422)) => "rejected the request body",
        (FaultCategory::Http4xx, Some(401 | 403)) => {
            "was refused: the agent wants credentials (add a `header \"Authorization\" …`)"
        }
        (FaultCategory::Http5xx, Some(500)) => "failed inside the agent (it raised)",
        _ => "",
    };
    fault.message = if meaning.is_empty() {
        format!("Func[{function}]: {}", fault.message)
    } else {
        format!("Func[{function}] {meaning}: {}", fault.message)
    };
    fault
}

/// The status of a fault [`HttpTransport`] made from an error answer, which it writes as
/// `HTTP {code} {reason}: {body}`.
fn http_status(fault: &Fault) -> Option<u16> {
    if !matches!(
        fault.category,
        FaultCategory::Http4xx | FaultCategory::Http5xx
    ) {
        return None;
    }
    fault
        .message
        .strip_prefix("HTTP ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse::<u16>().ok())
}

/// The agent's handshake: its prompt and few-shots, plus whatever else it sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Handshake {
    pub base_prompt: Option<String>,
    /// One string per few-shot, lines separated by `\n`.
    pub few_shots: Vec<String>,
    pub format: HandshakeFormat,
    /// Every other top-level field, as JSON.
    pub extra: Map<String, Value>,
}

/// The handshake's encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HandshakeFormat {
    Json,
    Yaml,
}

/// Why a handshake body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("the answer is empty; expected JSON or YAML with `base_prompt` and `few_shots`")]
    Empty,
    #[error("the answer is neither JSON ({json}) nor YAML ({yaml}): {preview}")]
    Unreadable {
        json: String,
        yaml: String,
        preview: String,
    },
    #[error("the answer is {found}, expected a mapping with `base_prompt` and `few_shots`")]
    NotAMapping { found: &'static str },
    #[error("the answer has no `few_shots` (fields: {fields})")]
    MissingFewShots { fields: String },
    #[error("`few_shots` is {found}, expected a list of strings")]
    FewShotsType { found: &'static str },
    #[error("`few_shots[{index}]` is {found}, expected a string")]
    FewShotType { index: usize, found: &'static str },
    #[error("`base_prompt` is {found}, expected a string")]
    BasePromptType { found: &'static str },
}

/// Deepest `[`/`{` nesting a handshake body is read as YAML with. The YAML parser's time
/// grows with the square of the nesting (a body of 50,000 unclosed `[`s took minutes), and
/// JSON stops at 128 levels anyway.
const MAX_YAML_DEPTH: usize = 128;

/// The deepest nesting of `[`/`{` in `body`, brackets in strings included (an
/// approximation that errs on the side of refusing: a string cannot hide brackets from it).
fn flow_depth(body: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    for &byte in body {
        match byte {
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

impl Handshake {
    /// Reads a handshake body: JSON (the spec) or YAML (later SDKs).
    pub fn parse(body: &[u8]) -> Result<Handshake, HandshakeError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(HandshakeError::Empty);
        }
        let (value, format) = match serde_json::from_slice::<Value>(body) {
            Ok(value) => (value, HandshakeFormat::Json),
            Err(json) if flow_depth(body) > MAX_YAML_DEPTH => {
                return Err(HandshakeError::Unreadable {
                    json: json.to_string(),
                    yaml: format!(
                        "brackets nested more than {MAX_YAML_DEPTH} deep (not read as YAML)"
                    ),
                    preview: preview(body),
                });
            }
            Err(json) => match serde_yaml_ng::from_slice::<Value>(body) {
                Ok(value) => (value, HandshakeFormat::Yaml),
                Err(yaml) => {
                    return Err(HandshakeError::Unreadable {
                        json: json.to_string(),
                        yaml: yaml.to_string(),
                        preview: preview(body),
                    });
                }
            },
        };
        Self::from_value(value, format)
    }

    fn from_value(value: Value, format: HandshakeFormat) -> Result<Handshake, HandshakeError> {
        let Value::Object(mut root) = value else {
            return Err(HandshakeError::NotAMapping {
                found: kind_of(&value),
            });
        };
        let base_prompt = match root.remove("base_prompt") {
            None | Some(Value::Null) => None,
            Some(Value::String(prompt)) => Some(prompt),
            Some(other) => {
                return Err(HandshakeError::BasePromptType {
                    found: kind_of(&other),
                });
            }
        };
        let few_shots = match root.remove("few_shots") {
            Some(Value::Array(shots)) => shots
                .into_iter()
                .enumerate()
                .map(|(index, shot)| match shot {
                    Value::String(shot) => Ok(shot),
                    other => Err(HandshakeError::FewShotType {
                        index,
                        found: kind_of(&other),
                    }),
                })
                .collect::<Result<Vec<_>, _>>()?,
            // The SDK takes few-shots as one string with blank lines between them.
            Some(Value::String(all)) => split_few_shots(&all),
            Some(Value::Null) => Vec::new(),
            Some(other) => {
                return Err(HandshakeError::FewShotsType {
                    found: kind_of(&other),
                });
            }
            None => {
                // `base_prompt` was taken out above; it is still one of the answer's fields.
                let fields: Vec<&str> = base_prompt
                    .as_ref()
                    .map(|_| "base_prompt")
                    .into_iter()
                    .chain(root.keys().map(String::as_str))
                    .collect();
                return Err(HandshakeError::MissingFewShots {
                    fields: if fields.is_empty() {
                        "none".to_owned()
                    } else {
                        fields.join(", ")
                    },
                });
            }
        };
        Ok(Handshake {
            base_prompt,
            few_shots,
            format,
            extra: root,
        })
    }

    /// The functions the few-shots call (`Ask Func[NAME]`), in order of first use.
    pub fn functions(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for shot in &self.few_shots {
            for line in parse_few_shot(shot) {
                if let FewShotLine::AskFunc { function, .. } = line
                    && !names.contains(&function)
                {
                    names.push(function);
                }
            }
        }
        names
    }

    /// What the run records about the agent (`agent` journal entry).
    pub fn to_record(&self, path: &str) -> Value {
        serde_json::json!({
            "handshake": format!("GET {path}"),
            "format": self.format,
            "base_prompt": self.base_prompt,
            "few_shots": self.few_shots,
            "extra": self.extra,
        })
    }
}

/// Splits one few-shot string at blank lines, as the Fixie SDK does.
pub fn split_few_shots(all: &str) -> Vec<String> {
    let mut shots = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for line in all.lines() {
        let line = line.trim();
        if line.is_empty() {
            if !current.is_empty() {
                shots.push(current.join("\n"));
                current.clear();
            }
        } else {
            current.push(line);
        }
    }
    if !current.is_empty() {
        shots.push(current.join("\n"));
    }
    shots
}

/// One line of a few-shot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FewShotLine {
    /// `Q: …`
    Query(String),
    /// `Ask Func[NAME]: ARGS`
    AskFunc { function: String, input: String },
    /// `Func[NAME] says: RESULT`
    FuncSays { function: String, result: String },
    /// `Ask Agent[ID]: …`
    AskAgent { agent: String, input: String },
    /// `Agent[ID] says: …`
    AgentSays { agent: String, result: String },
    /// `A: …`
    Answer(String),
    /// Anything else (before any recognised line).
    Other(String),
}

/// Splits a few-shot into its lines. A line that starts with none of the known prefixes
/// continues the line before it (multi-line answers and function results).
pub fn parse_few_shot(text: &str) -> Vec<FewShotLine> {
    let mut lines: Vec<FewShotLine> = Vec::new();
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(parsed) = parse_line(line) {
            lines.push(parsed);
            continue;
        }
        match lines.last_mut() {
            Some(
                FewShotLine::Query(text)
                | FewShotLine::Answer(text)
                | FewShotLine::Other(text)
                | FewShotLine::AskFunc { input: text, .. }
                | FewShotLine::AskAgent { input: text, .. }
                | FewShotLine::FuncSays { result: text, .. }
                | FewShotLine::AgentSays { result: text, .. },
            ) => {
                text.push('\n');
                text.push_str(line);
            }
            None => lines.push(FewShotLine::Other(line.to_owned())),
        }
    }
    lines
}

fn parse_line(line: &str) -> Option<FewShotLine> {
    if let Some(rest) = line.strip_prefix("Q:") {
        return Some(FewShotLine::Query(rest.trim().to_owned()));
    }
    if let Some(rest) = line.strip_prefix("A:") {
        return Some(FewShotLine::Answer(rest.trim().to_owned()));
    }
    if let Some(rest) = line.strip_prefix("Ask ") {
        let (kind, name, rest) = bracketed(rest)?;
        let input = rest.strip_prefix(':')?.trim().to_owned();
        return match kind {
            "Func" => Some(FewShotLine::AskFunc {
                function: name.to_owned(),
                input,
            }),
            "Agent" => Some(FewShotLine::AskAgent {
                agent: name.to_owned(),
                input,
            }),
            _ => None,
        };
    }
    let (kind, name, rest) = bracketed(line)?;
    let result = rest.trim_start().strip_prefix("says:")?.trim().to_owned();
    match kind {
        "Func" => Some(FewShotLine::FuncSays {
            function: name.to_owned(),
            result,
        }),
        "Agent" => Some(FewShotLine::AgentSays {
            agent: name.to_owned(),
            result,
        }),
        _ => None,
    }
}

/// `Func[name]rest` → (`Func`, `name`, `rest`).
fn bracketed(text: &str) -> Option<(&str, &str, &str)> {
    let (kind, rest) = text.split_once('[')?;
    let (name, rest) = rest.split_once(']')?;
    matches!(kind, "Func" | "Agent").then_some((kind, name.trim(), rest))
}

// ----- registry glue (`super::registry`)

use trellis_dsl::lang::{Capabilities, EndpointKind, ProtocolSpec};

/// `protocol="fixie"`.
pub const SPEC: ProtocolSpec = ProtocolSpec {
    name: "fixie",
    help: "Fixie agents: a handshake, then functions that `call` steps invoke; a provider plays the agent's LLM for `user` steps",
    endpoints: &[EndpointKind::Url, EndpointKind::Builtin],
    settings: &[],
    capabilities: Capabilities {
        forks: true,
        function_calls: true,
        provider_plays_llm: true,
        ..super::connexity::NO_CAPABILITIES
    },
    builtins: &["numbers"],

    check: None,
};

/// A Fixie agent has no settings of its own (`provider=`, common to every agent, names the
/// provider playing its LLM).
#[derive(Clone, Copy, Debug)]
pub struct FixieSettings;

impl super::registry::PlannedSettings for FixieSettings {
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
        _agent: &trellis_dsl::Agent,
        _templates: &mut crate::render::Templates,
    ) -> Result<Arc<dyn super::registry::PlannedSettings>, crate::render::RenderError> {
        Ok(Arc::new(FixieSettings))
    }

    fn build(
        &self,
        setup: &super::AgentSetup<'_>,
    ) -> Result<Arc<dyn AgentProtocol>, super::registry::BuildError> {
        let client = FixieClient::new(
            setup.url,
            setup.headers.clone(),
            setup.limits,
            setup.retry,
            setup.transport.clone(),
        )?;
        let provider = setup.provider_name.map(str::to_owned);
        Ok(Arc::new(client.with_llm_provider(provider)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_names_stay_one_path_segment() {
        let client = FixieClient::new(
            "http://127.0.0.1:9/agents/numbers",
            Vec::new(),
            CallLimits::default(),
            RetryPolicy::default(),
            HttpTransport::new(),
        )
        .map_err(|e| e.to_string());
        let Ok(client) = client else {
            panic!("client: {client:?}");
        };
        assert_eq!(client.base_url().path(), "/agents/numbers/");
        let url = client.function_url("genrand").map(|u| u.to_string());
        assert_eq!(
            url.as_deref(),
            Ok("http://127.0.0.1:9/agents/numbers/genrand")
        );
        let url = client.function_url("zählen").map(|u| u.path().to_owned());
        assert_eq!(url.as_deref(), Ok("/agents/numbers/z%C3%A4hlen"));
        for bad in [
            "", ".", "..", "../admin", "a/b", "a?b", "a#b", "a%2Fb", "a b", "a\\b",
        ] {
            assert!(client.function_url(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn few_shot_lines() {
        let lines = parse_few_shot(
            "Q: Roll a die.\nAsk Func[genrand]: 1, 6\nFunc[genrand] says: 4\n\
             Ask Agent[weather]: Paris?\nAgent[weather] says: Sunny\nA: You rolled 4.\nIt is sunny.",
        );
        assert_eq!(
            lines,
            vec![
                FewShotLine::Query("Roll a die.".into()),
                FewShotLine::AskFunc {
                    function: "genrand".into(),
                    input: "1, 6".into()
                },
                FewShotLine::FuncSays {
                    function: "genrand".into(),
                    result: "4".into()
                },
                FewShotLine::AskAgent {
                    agent: "weather".into(),
                    input: "Paris?".into()
                },
                FewShotLine::AgentSays {
                    agent: "weather".into(),
                    result: "Sunny".into()
                },
                FewShotLine::Answer("You rolled 4.\nIt is sunny.".into()),
            ]
        );
    }

    #[test]
    fn deeply_nested_bodies_are_refused_before_the_yaml_parser() {
        // 50,000 unclosed `[`s (1.8 MB) kept the YAML parser busy for minutes.
        let body = "{\"action\":\"call_tool\",\"tool_calls\":[".repeat(50_000);
        let started = std::time::Instant::now();
        let parsed = Handshake::parse(body.as_bytes());
        assert!(
            matches!(&parsed, Err(HandshakeError::Unreadable { yaml, .. }) if yaml.contains("nested")),
            "{parsed:?}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // Nesting a handshake really has is still read as YAML.
        let yaml = format!(
            "base_prompt: x\nfew_shots: []\nextra: {}x{}\n",
            "[".repeat(20),
            "]".repeat(20)
        );
        let parsed = Handshake::parse(yaml.as_bytes());
        assert!(
            matches!(&parsed, Ok(h) if h.format == HandshakeFormat::Yaml),
            "{parsed:?}"
        );
    }

    #[test]
    fn yaml_alias_bombs_are_refused_not_expanded() {
        let mut bomb = String::from(
            "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        let mut previous = 'a';
        for name in 'b'..='j' {
            let refs = vec![format!("*{previous}"); 9].join(",");
            bomb.push_str(&format!("{name}: &{name} [{refs}]\n"));
            previous = name;
        }
        bomb.push_str("few_shots: *j\n");
        assert!(matches!(
            Handshake::parse(bomb.as_bytes()),
            Err(HandshakeError::Unreadable { .. })
        ));
    }

    #[test]
    fn handshake_json_yaml_and_neither() {
        let json = br#"{"base_prompt":"p","few_shots":["Q: a\nA: b"],"agent_id":"x"}"#;
        let parsed = Handshake::parse(json);
        assert_eq!(parsed.as_ref().map(|h| h.format), Ok(HandshakeFormat::Json));
        assert_eq!(
            parsed.as_ref().map(|h| h.extra.get("agent_id").cloned()),
            Ok(Some(Value::from("x")))
        );
        let yaml = b"base_prompt: p\nconversational: false\nfew_shots:\n- \"Q: a\\nA: b\"\n";
        let parsed = Handshake::parse(yaml);
        assert_eq!(
            parsed.as_ref().map(|h| h.few_shots.clone()),
            Ok(vec!["Q: a\nA: b".to_owned()])
        );
        assert_eq!(parsed.map(|h| h.format), Ok(HandshakeFormat::Yaml));
        assert!(matches!(
            Handshake::parse(b"{ not: [valid"),
            Err(HandshakeError::Unreadable { .. })
        ));
        assert!(matches!(
            Handshake::parse(b"<html>hello</html>"),
            Err(HandshakeError::NotAMapping { found: "a string" })
        ));
    }
}
