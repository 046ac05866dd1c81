//! `protocol="openai"` and `protocol="anthropic"`: the agent under test is a model behind an
//! OpenAI-compatible chat completions API (the hosted API, llama.cpp, vLLM, Ollama) or
//! Anthropic Messages, given a system prompt and tools, and the engine runs its tool loop.
//! Both APIs share the loop; only the request and answer codecs differ (Anthropic: the
//! system prompt apart, `tool_use` and `tool_result` blocks, its own stream events).
//!
//! Each turn sends the whole conversation (system prompt, then every earlier message,
//! including tool calls and tool results) with the offered tools as JSON-schema function
//! definitions. When the model answers with tool calls, the scenario's sandbox answers them
//! (the `tool` nodes' mocks: static, matched on parameters, or in sequence), the results are
//! sent back as `tool` messages, and the model is asked again, until it answers with text.
//! A model still calling tools after `max-tool-rounds` rounds ends the turn with a `protocol`
//! fault. Because the history lives here, [`Session::fork`] copies the session (with its
//! sandbox), and a recorded prefix can be restored without calling the model.
//!
//! With `stream #true` the request asks for server-sent events (`stream: true`), read over
//! the shared [`sse`] transport: chat-completion chunks (usage in the last chunk, asked for
//! with `stream_options`) ending in `[DONE]`, or Anthropic's typed events (`message_start`,
//! `content_block_start`/`_delta`/`_stop` per content block, `message_delta`,
//! `message_stop`; `ping` is a heartbeat). The time to the first event carrying text or a
//! tool call is the exchange's time to first token. A server that answers a streamed
//! request with one JSON body is accepted. Error bodies (`{"error": …}`) and Anthropic
//! `error` events, bodies or events that are not JSON, answers without a choice, streamed
//! tool input that is not JSON, and streams cut before `[DONE]`, a finish reason or
//! `message_stop` are faults of the turn, never panics.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::{Map, Value, json};
use trellis_dsl::{Agent, Project};

use super::http::{
    CallLimits, EndpointError, HttpTransport, RateLimitWaits, RetryPolicy, agent_url,
    answer_or_fault, retry_after, with_agent_headers, with_retries,
};
use super::quote::{error_text, kind_of, preview};
use super::sse::{self, Opened, StreamLimits};
use super::{
    AgentProtocol, CallContext, ChatMessage, Conversation, Exchange, Session, ToolCall,
    ToolCallFunction, Turn, TurnInput, Usage,
};
use crate::llm::ProviderClient;
// The `anthropic-version` sent unless the agent's headers set one, and the `max_tokens`
// Anthropic requires: the same as the providers'.
use crate::llm::slots::ServerSlots;
use crate::llm::wire::{ANTHROPIC_DEFAULT_MAX_TOKENS, ANTHROPIC_VERSION};
use crate::record::{Fault, FaultCategory, ToolCallRecord};
use crate::render::{CompiledTemplate, RenderError, Templates};
use crate::sandbox::{Sandbox, SandboxSpec};

/// What the plan keeps of an `openai` agent's definition.
#[derive(Clone, Debug, Default)]
pub struct OpenAiSettings {
    pub model: Option<String>,
    /// The agent's own `temperature` and `max-tokens` (they win over a provider's).
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    /// `system-prompt`, rendered once per run with `env` in scope.
    pub system_prompt: Option<CompiledTemplate>,
    /// The `tools` offered, as chat-completions function definitions.
    pub tools: Vec<Value>,
    pub max_tool_rounds: u32,
}

impl OpenAiSettings {
    /// The settings of `agent` (empty for agents of other protocols).
    pub fn plan(
        project: &Project,
        agent: &Agent,
        templates: &mut Templates,
    ) -> Result<Self, RenderError> {
        if !agent.protocol.is_model() {
            return Ok(OpenAiSettings::default());
        }
        let system_prompt = agent
            .system_prompt
            .as_ref()
            .map(|t| templates.compile(t))
            .transpose()?;
        let tools = agent
            .tools
            .iter()
            .map(|name| {
                let tool = project.tools.iter().find(|t| t.name.value == name.value);
                function_definition(&name.value, tool)
            })
            .collect();
        Ok(OpenAiSettings {
            model: agent.model.clone(),
            temperature: agent.temperature,
            max_tokens: agent.max_tokens,
            system_prompt,
            tools,
            max_tool_rounds: agent.max_tool_rounds,
        })
    }
}

/// `{"type":"function","function":{name, description, parameters}}` from a `tool` node: each
/// `param` a property of its JSON-schema type, `required` ones listed.
fn function_definition(name: &str, tool: Option<&trellis_dsl::Tool>) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for param in tool.map(|t| t.params.as_slice()).unwrap_or_default() {
        let mut property = Map::new();
        property.insert("type".into(), Value::String(param.ty.clone()));
        if let Some(description) = &param.description {
            property.insert("description".into(), Value::String(description.clone()));
        }
        properties.insert(param.name.clone(), Value::Object(property));
        if param.required {
            required.push(Value::String(param.name.clone()));
        }
    }
    let mut function = Map::new();
    function.insert("name".into(), Value::String(name.to_owned()));
    if let Some(description) = tool.and_then(|t| t.description.as_ref()) {
        function.insert("description".into(), Value::String(description.clone()));
    }
    function.insert(
        "parameters".into(),
        json!({"type": "object", "properties": properties, "required": required}),
    );
    json!({"type": "function", "function": function})
}

/// Which API the model is behind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Api {
    /// OpenAI-compatible chat completions (`protocol="openai"`).
    #[default]
    OpenAi,
    /// Anthropic Messages (`protocol="anthropic"`).
    Anthropic,
}

/// The assistant message of one request and its usage, or the fault.
type Answer = Result<(ChatMessage, Option<Usage>), Fault>;

/// A round of attempts: the answer, and `Some(Retry-After)` when it was a 429 to wait out.
type Round = (Answer, Option<Option<Duration>>);

/// What an attempt holds while it runs: a provider's limits or a server's slot.
enum Held {
    Provider(#[allow(dead_code)] crate::llm::provider::Admitted),
    Server(#[allow(dead_code)] Option<tokio::sync::OwnedSemaphorePermit>),
    Nothing,
}

/// The fault of a 429 answer on its attempt; the call waits and asks again, or gives up
/// with [`RateLimitWaits::gave_up`].
fn rate_limited() -> Fault {
    Fault::new(FaultCategory::Http4xx, "HTTP 429 Too Many Requests")
}

/// `{base}/chat/completions` (or `/messages`), unless the base already ends with it.
fn completions_url(base: &str, api: Api) -> Result<Url, EndpointError> {
    let path = match api {
        Api::OpenAi => "/chat/completions",
        Api::Anthropic => "/messages",
    };
    let base = base.trim_end_matches('/');
    if base.ends_with(path) {
        agent_url(base)
    } else {
        agent_url(&format!("{base}{path}"))
    }
}

/// A client for one `openai` agent. Cheap to clone: every session holds one.
#[derive(Clone, Debug)]
pub struct OpenAiClient {
    inner: Arc<ClientConfig>,
}

#[derive(Debug)]
struct ClientConfig {
    url: Url,
    headers: HeaderMap,
    limits: CallLimits,
    retry: RetryPolicy,
    transport: HttpTransport,
    label: Arc<str>,
    model: String,
    system_prompt: Option<String>,
    tools: Vec<Value>,
    max_tool_rounds: u32,
    stream: bool,
    api: Api,
    temperature: Option<f64>,
    max_tokens: Option<u32>,
    /// `provider=`: every request passes the provider's limits, and its usage is priced.
    provider: Option<Arc<ProviderClient>>,
    /// Without a provider: the slots of a plain-`http` server (llama.cpp), shared with the
    /// providers on the same server.
    server_slots: Option<Arc<ServerSlots>>,
}

/// Everything an `openai` client is built from.
pub struct OpenAiOptions {
    pub model: String,
    pub system_prompt: Option<String>,
    pub tools: Vec<Value>,
    pub max_tool_rounds: u32,
    /// Ask for server-sent events (`stream #true`).
    pub stream: bool,
    pub api: Api,
    /// `provider=`: the endpoint, key, headers, model, temperature, max tokens, retries,
    /// limits and prices come from this provider (the agent's `header`s are added).
    pub provider: Option<Arc<ProviderClient>>,
    /// The agent's own `temperature` and `max-tokens`, over the provider's.
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    /// The slots of the server behind `base-url` when it reports them (llama.cpp's
    /// `/props`): requests wait here for a free slot instead of in the server's queue.
    pub server_slots: Option<Arc<ServerSlots>>,
}

impl OpenAiClient {
    /// `base_url` is the API root (`…/v1`; `/chat/completions` is appended unless already
    /// there). `headers` are the agent's rendered `header` nodes (an `Authorization` header
    /// carries a key).
    pub fn new(
        base_url: &str,
        headers: Vec<(String, String)>,
        limits: CallLimits,
        retry: RetryPolicy,
        transport: HttpTransport,
        options: OpenAiOptions,
    ) -> Result<Self, EndpointError> {
        let (url, mut defaults, model, temperature, max_tokens, retry) = match &options.provider {
            Some(provider) => {
                let (model, temperature, max_tokens) = provider.defaults();
                let model = Some(options.model.clone())
                    .filter(|m| !m.is_empty())
                    .or(model.map(str::to_owned))
                    .unwrap_or_default();
                (
                    provider.url().clone(),
                    provider.headers().clone(),
                    model,
                    temperature,
                    max_tokens,
                    provider.retry(),
                )
            }
            // Asking a model again has no side effect: a broken connection or a timeout is
            // retried within `retries`, as a provider's calls are.
            None => (
                completions_url(base_url, options.api)?,
                HeaderMap::with_capacity(headers.len() + 2),
                options.model,
                None,
                None,
                RetryPolicy {
                    after_send: true,
                    ..retry
                },
            ),
        };
        let stream = options.stream;
        defaults.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        defaults.insert(
            ACCEPT,
            HeaderValue::from_static(if stream {
                "text/event-stream, application/json"
            } else {
                "application/json"
            }),
        );
        if options.api == Api::Anthropic {
            defaults.insert(
                "anthropic-version",
                HeaderValue::from_static(ANTHROPIC_VERSION),
            );
        }
        let headers = with_agent_headers(defaults, &headers)?;
        let label = Arc::from(format!("POST {}", url.path()));
        Ok(OpenAiClient {
            inner: Arc::new(ClientConfig {
                url,
                headers,
                limits,
                retry,
                transport,
                label,
                model,
                system_prompt: options.system_prompt,
                tools: options.tools,
                max_tool_rounds: options.max_tool_rounds,
                stream,
                api: options.api,
                temperature: options.temperature.or(temperature),
                max_tokens: options.max_tokens.or(max_tokens),
                provider: options.provider,
                server_slots: options.server_slots,
            }),
        })
    }

    /// The request body for `history`.
    fn request_body(&self, history: &[ChatMessage]) -> Result<Bytes, serde_json::Error> {
        let config = &self.inner;
        if config.api == Api::Anthropic {
            let mut body = anthropic_request(config, history);
            if let (true, Value::Object(body)) = (config.stream, &mut body) {
                body.insert("stream".into(), Value::Bool(true));
            }
            return serde_json::to_vec(&body).map(Bytes::from);
        }
        let mut messages = Vec::with_capacity(history.len() + 1);
        if let Some(prompt) = &config.system_prompt {
            messages.push(json!({"role": "system", "content": prompt}));
        }
        for message in history {
            messages.push(wire_message(message)?);
        }
        let mut body = Map::new();
        body.insert("model".into(), Value::String(config.model.clone()));
        body.insert("messages".into(), Value::Array(messages));
        if !config.tools.is_empty() {
            body.insert("tools".into(), Value::Array(config.tools.clone()));
        }
        if let Some(t) = config.temperature {
            body.insert("temperature".into(), json!(t));
        }
        if let Some(n) = config.max_tokens {
            body.insert("max_tokens".into(), json!(n));
        }
        if config.stream {
            body.insert("stream".into(), Value::Bool(true));
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
        serde_json::to_vec(&Value::Object(body)).map(Bytes::from)
    }

    /// One request for `history` (after retries): the exchange and the assistant message.
    async fn complete(
        &self,
        history: &[ChatMessage],
        deadline: Option<tokio::time::Instant>,
    ) -> (Exchange, Result<ChatMessage, Fault>) {
        let config = &self.inner;
        let mut exchange = Exchange {
            label: config.label.clone(),
            ..Default::default()
        };
        let body = match self.request_body(history) {
            Ok(body) => body,
            Err(e) => {
                let fault = Fault::new(
                    FaultCategory::Internal,
                    format!("could not encode the request: {e}"),
                );
                return (exchange, Err(fault));
            }
        };
        // Charged against a provider's token limit, as the provider's own calls are.
        let estimate = crate::llm::provider::token_estimate(body.len(), config.max_tokens);
        let mut rate_limits = RateLimitWaits::default();
        let outcome = loop {
            let (outcome, rate_limited) =
                self.attempt(&body, estimate, deadline, &mut exchange).await;
            let Some(asked) = rate_limited else {
                break outcome;
            };
            match rate_limits.next(asked, deadline) {
                Some(wait) => tokio::time::sleep(wait).await,
                None => break Err(rate_limits.gave_up()),
            }
        };
        // A fault in the answer the last attempt received is that attempt's own.
        if let (Err(fault), Some(last)) = (&outcome, exchange.attempts.last_mut())
            && last.fault.is_none()
        {
            last.fault = Some(fault.clone());
        }
        match outcome {
            Ok((message, mut usage)) => {
                if let (Some(provider), Some(usage)) = (&config.provider, usage.as_mut()) {
                    usage.cost = provider.cost(usage.prompt_tokens, usage.completion_tokens);
                }
                exchange.usage = usage;
                (exchange, Ok(message))
            }
            Err(fault) => (exchange, Err(fault)),
        }
    }

    /// One round of attempts (with retries) through the provider's limits, if any. A 429
    /// answer is `Some(Retry-After)` in the second value: the caller waits and asks again.
    async fn attempt(
        &self,
        body: &Bytes,
        estimate: u32,
        deadline: Option<tokio::time::Instant>,
        exchange: &mut Exchange,
    ) -> Round {
        let config = &self.inner;
        // Held for the whole request (a streamed answer included).
        // Time queued for a provider's limits or a server's slot, per attempt: not the
        // agent's latency, and not spent from the trajectory's time budget.
        let queued = std::sync::Mutex::new(Vec::new());
        let admit = || async {
            let started = tokio::time::Instant::now();
            let held = match (&config.provider, &config.server_slots) {
                (Some(provider), _) => Held::Provider(provider.admit(estimate).await),
                (None, Some(server)) => Held::Server(server.acquire().await),
                (None, None) => Held::Nothing,
            };
            if let Ok(mut queued) = queued.lock() {
                queued.push(started.elapsed());
            }
            held
        };
        let (outcome, asked) = if config.stream {
            let limits = StreamLimits::from(config.limits);
            let attempted = with_retries(config.retry, config.limits.timeout, deadline, |budget| {
                let body = body.clone();
                async move {
                    let held = admit().await;
                    sse::open(
                        &config.transport,
                        &config.url,
                        &config.headers,
                        body,
                        limits,
                        budget,
                    )
                    .await
                    .map(|opened| (opened, held))
                    .map_err(|f| self.redact(f))
                }
            })
            .await;
            exchange.attempts.extend(attempted.attempts);
            let outcome = match attempted.result {
                Err(fault) => Err(fault),
                Ok((Opened::RateLimited(asked), _)) => {
                    return self.round_done(exchange, &queued, Err(rate_limited()), Some(asked));
                }
                Ok((Opened::Json(body), _)) => decode(config.api, &body),
                // The provider's slot stays taken while the stream is read.
                Ok((Opened::Events(mut stream), _held)) => {
                    stream.set_deadline(deadline);
                    let mut first_content = None;
                    let outcome = match config.api {
                        Api::OpenAi => read_chunks(&mut stream, &mut first_content).await,
                        Api::Anthropic => {
                            read_anthropic_events(&mut stream, &mut first_content).await
                        }
                    };
                    exchange.ttft = first_content.or(stream.ttft());
                    // From the request to the end of the stream (the stream started after the
                    // queue, which is taken off below: added here so it comes out even).
                    let queue = queued
                        .lock()
                        .ok()
                        .and_then(|q| q.last().copied())
                        .unwrap_or_default();
                    if let Some(last) = exchange.attempts.last_mut() {
                        last.latency = stream.started().elapsed() + queue;
                    }
                    outcome
                }
            };
            (outcome.map_err(|f| self.redact(f)), None)
        } else {
            let attempted = with_retries(config.retry, config.limits.timeout, deadline, |budget| {
                let body = body.clone();
                async move {
                    let _held = admit().await;
                    config
                        .transport
                        .post_json_raw(
                            &config.url,
                            &config.headers,
                            body,
                            config.limits.max_response_size,
                            budget,
                        )
                        .await
                        .and_then(answer_or_fault)
                        .map_err(|f| self.redact(f))
                }
            })
            .await;
            exchange.attempts.extend(attempted.attempts);
            match attempted.result {
                Err(fault) => (Err(fault), None),
                Ok(response) if response.status == reqwest::StatusCode::TOO_MANY_REQUESTS => {
                    let asked = retry_after(&response.headers, std::time::SystemTime::now());
                    (Err(rate_limited()), Some(asked))
                }
                Ok(response) => (
                    decode(config.api, &response.body).map_err(|f| self.redact(f)),
                    None,
                ),
            }
        };
        self.round_done(exchange, &queued, outcome, asked)
    }

    /// Ends a round of attempts: each attempt's queue time is taken off its latency (the
    /// round's attempts are the last ones recorded), and a 429 answer is its attempt's fault.
    fn round_done(
        &self,
        exchange: &mut Exchange,
        queued: &std::sync::Mutex<Vec<Duration>>,
        outcome: Answer,
        asked: Option<Option<Duration>>,
    ) -> Round {
        let queued = queued.lock().map(|q| q.clone()).unwrap_or_default();
        exchange.queued += queued.iter().sum::<Duration>();
        let round = exchange.attempts.len().saturating_sub(queued.len());
        for (attempt, wait) in exchange.attempts.iter_mut().skip(round).zip(queued) {
            attempt.latency = attempt.latency.saturating_sub(wait);
        }
        if asked.is_some()
            && let Some(last) = exchange.attempts.last_mut()
        {
            last.fault = Some(rate_limited());
        }
        (outcome, asked)
    }

    /// `fault` without the provider's key, which servers sometimes echo in error bodies.
    fn redact(&self, mut fault: Fault) -> Fault {
        if let Some(provider) = &self.inner.provider {
            fault.message = provider.redact(&fault.message);
        }
        fault
    }
}

impl AgentProtocol for OpenAiClient {
    fn open(&self, conversation: &Conversation<'_>) -> Box<dyn Session> {
        let spec = conversation
            .sandbox
            .cloned()
            .unwrap_or_else(|| Arc::new(SandboxSpec::default()));
        Box::new(OpenAiSession {
            client: self.clone(),
            history: Vec::new(),
            sandbox: Sandbox::new(spec),
        })
    }
}

/// One conversation: the history resent on every request, and the trajectory's sandbox.
#[derive(Clone)]
struct OpenAiSession {
    client: OpenAiClient,
    history: Vec<ChatMessage>,
    sandbox: Sandbox,
}

impl Session for OpenAiSession {
    fn turn<'a>(
        &'a mut self,
        input: TurnInput<'a>,
        ctx: &'a CallContext<'a>,
    ) -> BoxFuture<'a, Turn> {
        Box::pin(self.take_turn(input, ctx))
    }

    fn fork(&self) -> Option<Box<dyn Session>> {
        Some(Box::new(self.clone()))
    }

    fn sandbox(&self) -> Option<&Sandbox> {
        Some(&self.sandbox)
    }

    /// Appends `history` to the conversation: the executor restores a reused prefix turn
    /// by turn, so each call continues from the turns restored before it.
    fn restore(&mut self, history: &[(TurnInput<'_>, &Turn)]) -> bool {
        let mut rebuilt = Vec::new();
        let mut sandbox = self.sandbox.clone();
        for (input, turn) in history {
            match input {
                TurnInput::User(text) => rebuilt.push(ChatMessage::user(*text)),
                TurnInput::Opening => {}
                _ => return false,
            }
            rebuilt.extend(turn.messages.iter().cloned());
            // The recorded calls move the sandbox (sequences, state) as they did then.
            for call in &turn.tool_calls {
                sandbox.call(&call.name, &arguments_value(&call.arguments));
            }
        }
        self.history.extend(rebuilt);
        self.sandbox = sandbox;
        true
    }
}

impl OpenAiSession {
    async fn take_turn(&mut self, input: TurnInput<'_>, ctx: &CallContext<'_>) -> Turn {
        match input {
            TurnInput::User(text) => self.history.push(ChatMessage::user(text)),
            TurnInput::Opening => {}
            other => {
                return Turn::failed(Fault::new(
                    FaultCategory::Protocol,
                    format!(
                        "an `openai` agent takes user messages; a `{}` step cannot be sent to it",
                        other.kind()
                    ),
                ));
            }
        }
        let max_rounds = self.client.inner.max_tool_rounds;
        let mut turn = Turn {
            model: Some(self.client.inner.model.clone()),
            ..Default::default()
        };
        let mut rounds = 0u32;
        loop {
            // Time queued for a shared server's slot is not the trajectory's: its deadline
            // moves by it.
            let queued: Duration = turn.exchanges.iter().map(|e| e.queued).sum();
            let deadline = ctx.deadline.map(|d| d + queued);
            let (exchange, outcome) = self.client.complete(&self.history, deadline).await;
            turn.exchanges.push(exchange);
            let message = match outcome {
                Ok(message) => message,
                Err(fault) => {
                    turn.fault = Some(fault);
                    return turn;
                }
            };
            self.history.push(message.clone());
            turn.messages.push(message.clone());
            if message.tool_calls.is_empty() {
                turn.reply = Some(message.content.unwrap_or_default());
                return turn;
            }
            if rounds >= max_rounds {
                turn.fault = Some(Fault::new(
                    FaultCategory::Protocol,
                    format!(
                        "the model still asked for tools ({}) after {max_rounds} tool round(s) \
                         (`max-tool-rounds`)",
                        message
                            .tool_calls
                            .iter()
                            .map(|c| c.function.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
                return turn;
            }
            rounds += 1;
            for call in &message.tool_calls {
                let result = match serde_json::from_str::<Value>(&call.function.arguments) {
                    Ok(params) => self
                        .sandbox
                        .call(&call.function.name, &params)
                        .result_object(),
                    // Sent back to the model, as a real tool runtime would, so it can retry.
                    Err(e) => json!({
                        "status": "error",
                        "message": format!("the arguments are not valid JSON: {e}"),
                    }),
                };
                let content = result.to_string();
                let tool_message = ChatMessage {
                    role: "tool".into(),
                    content: Some(content.clone()),
                    tool_call_id: Some(call.id.clone()),
                    name: Some(call.function.name.clone()),
                    ..Default::default()
                };
                self.history.push(tool_message.clone());
                turn.messages.push(tool_message);
                turn.tool_calls.push(ToolCallRecord {
                    call_id: call.id.clone(),
                    name: call.function.name.clone(),
                    arguments: call.function.arguments.clone(),
                    result: Some(content),
                });
            }
        }
    }
}

/// Recorded arguments as the sandbox takes them (not JSON: no parameters).
fn arguments_value(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::Object(Map::new()))
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

/// An Anthropic Messages request: the system prompt apart, tool calls as `tool_use` blocks,
/// the results of one round as `tool_result` blocks of one user message.
fn anthropic_request(config: &ClientConfig, history: &[ChatMessage]) -> Value {
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
                        "input": arguments_value(&call.function.arguments),
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
    body.insert("model".into(), Value::String(config.model.clone()));
    body.insert(
        "max_tokens".into(),
        json!(config.max_tokens.unwrap_or(ANTHROPIC_DEFAULT_MAX_TOKENS)),
    );
    if let Some(t) = config.temperature {
        body.insert("temperature".into(), json!(t.clamp(0.0, 1.0)));
    }
    if let Some(prompt) = &config.system_prompt {
        body.insert("system".into(), Value::String(prompt.clone()));
    }
    body.insert("messages".into(), Value::Array(messages));
    if !config.tools.is_empty() {
        let tools = config
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
    Value::Object(body)
}

/// A whole (non-streamed) answer of `api`.
fn decode(api: Api, body: &[u8]) -> Answer {
    match api {
        Api::OpenAi => decode_body(body),
        Api::Anthropic => decode_anthropic(body),
    }
}

/// A whole answer's JSON, when it is JSON and not an `{"error": …}` body (both APIs).
fn answer_json(body: &[u8]) -> Result<Value, Fault> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        Fault::new(
            FaultCategory::InvalidJson,
            format!("the response body is not JSON ({e}): {}", preview(body)),
        )
    })?;
    if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
        return Err(Fault::new(
            FaultCategory::Protocol,
            format!("the model answered with an error: {}", error_text(error)),
        ));
    }
    Ok(value)
}

/// An Anthropic Messages answer: its text blocks joined, its `tool_use` blocks as tool calls.
fn decode_anthropic(body: &[u8]) -> Answer {
    let value = answer_json(body)?;
    let blocks = value
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            Fault::new(
                FaultCategory::Protocol,
                format!("the answer has no `content` array: {}", preview(body)),
            )
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
                        Fault::new(
                            FaultCategory::Protocol,
                            format!("`tool_use` block {index} has no `name`"),
                        )
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
    if text.is_none() && tool_calls.is_empty() {
        return Err(Fault::new(
            FaultCategory::Protocol,
            "the model answered with neither text nor tool calls",
        ));
    }
    let usage = value.get("usage").filter(|u| u.is_object()).map(|u| {
        let input = u.get("input_tokens").and_then(Value::as_u64);
        let output = u.get("output_tokens").and_then(Value::as_u64);
        Usage {
            cost: Default::default(),
            prompt_tokens: input,
            completion_tokens: output,
            total_tokens: input.zip(output).map(|(i, o)| i.saturating_add(o)),
        }
    });
    Ok((
        ChatMessage {
            role: "assistant".into(),
            content: text,
            tool_calls,
            ..Default::default()
        },
        usage,
    ))
}

/// A whole (non-streamed) chat completion: the first choice's message and the usage.
fn decode_body(body: &[u8]) -> Answer {
    let value = answer_json(body)?;
    let message = value
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|choices| choices.first())
        .and_then(|choice| choice.get("message"))
        .ok_or_else(|| {
            Fault::new(
                FaultCategory::Protocol,
                format!("the answer has no `choices[0].message`: {}", preview(body)),
            )
        })?;
    let content = match message.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        // Content parts: their text, joined.
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<String>(),
        ),
        Some(other) => {
            return Err(Fault::new(
                FaultCategory::Protocol,
                format!(
                    "`choices[0].message.content` is {}, not text",
                    kind_of(other)
                ),
            ));
        }
    };
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        for (index, call) in calls.iter().enumerate() {
            tool_calls.push(decode_tool_call(call, index)?);
        }
    }
    if content.is_none() && tool_calls.is_empty() {
        return Err(Fault::new(
            FaultCategory::Protocol,
            "the model answered with neither text nor tool calls",
        ));
    }
    let message = ChatMessage {
        role: "assistant".into(),
        content,
        tool_calls,
        ..Default::default()
    };
    Ok((message, decode_usage(value.get("usage"))))
}

fn decode_tool_call(call: &Value, index: usize) -> Result<ToolCall, Fault> {
    let function = call.get("function");
    let name = function
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            Fault::new(
                FaultCategory::Protocol,
                format!("tool call {index} has no `function.name`"),
            )
        })?;
    let arguments = match function.and_then(|f| f.get("arguments")) {
        None | Some(Value::Null) => "{}".to_owned(),
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

fn decode_usage(usage: Option<&Value>) -> Option<Usage> {
    let usage = usage.filter(|u| u.is_object())?;
    let field = |name: &str| usage.get(name).and_then(Value::as_u64);
    Some(Usage {
        cost: Default::default(),
        prompt_tokens: field("prompt_tokens"),
        completion_tokens: field("completion_tokens"),
        total_tokens: field("total_tokens"),
    })
}

/// A tool call being assembled from stream deltas.
#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Reads chat-completion chunks until `[DONE]` (or the end of a stream that saw a finish
/// reason) and assembles the message. `first_content` is the time to the first chunk with
/// content or a tool call (a role-only first chunk is not a token).
async fn read_chunks(
    stream: &mut sse::EventStream,
    first_content: &mut Option<Duration>,
) -> Answer {
    let mut text: Option<String> = None;
    let mut calls: Vec<PartialCall> = Vec::new();
    let mut usage = None;
    let mut finished = false;
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
        let chunk = event_json(stream, "chunk", data)?;
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            return Err(Fault::new(
                FaultCategory::Protocol,
                format!("the model streamed an error: {}", error_text(error)),
            ));
        }
        if let Some(u) = decode_usage(chunk.get("usage")) {
            usage = Some(u);
        }
        let Some(choice) = chunk
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        else {
            continue;
        };
        if choice
            .get("finish_reason")
            .is_some_and(|reason| !reason.is_null())
        {
            finished = true;
        }
        let Some(delta) = choice.get("delta") else {
            continue;
        };
        if let Some(piece) = delta.get("content").and_then(Value::as_str)
            && !piece.is_empty()
        {
            first_content.get_or_insert_with(|| stream.started().elapsed());
            text.get_or_insert_with(String::new).push_str(piece);
        }
        for (position, call) in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            first_content.get_or_insert_with(|| stream.started().elapsed());
            let index = call
                .get("index")
                .and_then(Value::as_u64)
                .and_then(|i| usize::try_from(i).ok())
                .unwrap_or(position);
            // Indices come in order; one far past the calls seen is a broken stream, not a
            // reason to allocate.
            if index > calls.len() {
                return Err(Fault::new(
                    FaultCategory::Protocol,
                    format!(
                        "chunk {} continues tool call {index}, but only {} began",
                        stream.count(),
                        calls.len()
                    ),
                ));
            }
            if index == calls.len() {
                calls.push(PartialCall::default());
            }
            let Some(partial) = calls.get_mut(index) else {
                continue;
            };
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                partial.id = id.to_owned();
            }
            if let Some(function) = call.get("function") {
                if let Some(name) = function.get("name").and_then(Value::as_str) {
                    partial.name.push_str(name);
                }
                if let Some(arguments) = function.get("arguments").and_then(Value::as_str) {
                    partial.arguments.push_str(arguments);
                }
            }
        }
    }
    let mut tool_calls = Vec::with_capacity(calls.len());
    for (index, call) in calls.into_iter().enumerate() {
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
    streamed_message(text, tool_calls, usage)
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

/// Reads Anthropic Messages stream events until `message_stop` and assembles the message:
/// text deltas joined, each `tool_use` block's `input_json_delta` fragments joined and parsed
/// when the block stops. `first_content` is the time to the first event carrying text or
/// starting a `tool_use` block (`message_start` and `ping` are not tokens). Usage:
/// `input_tokens` from `message_start`, `output_tokens` from the last `message_delta`.
async fn read_anthropic_events(
    stream: &mut sse::EventStream,
    first_content: &mut Option<Duration>,
) -> Answer {
    let mut text: Option<String> = None;
    let mut blocks: Vec<StreamedBlock> = Vec::new();
    let mut input_tokens = None;
    let mut output_tokens = None;
    loop {
        let Some(event) = stream.next().await? else {
            return Err(stream.ended_early("`message_stop`"));
        };
        let data = event.data.trim();
        if data.is_empty() {
            continue;
        }
        let value = event_json(stream, "event", data)?;
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
                let usage = value.get("message").and_then(|m| m.get("usage"));
                let field = |name: &str| usage.and_then(|u| u.get(name)).and_then(Value::as_u64);
                input_tokens = field("input_tokens").or(input_tokens);
                output_tokens = field("output_tokens").or(output_tokens);
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
                        text.get_or_insert_with(String::new).push_str(piece);
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
                            text.get_or_insert_with(String::new).push_str(piece);
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
                if let Some(tokens) = value
                    .get("usage")
                    .and_then(|u| u.get("output_tokens"))
                    .and_then(Value::as_u64)
                {
                    output_tokens = Some(tokens);
                }
            }
            "message_stop" => break,
            // Event types added later are skipped, as the API asks of clients.
            _ => {}
        }
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
    let usage = (input_tokens.is_some() || output_tokens.is_some()).then(|| Usage {
        cost: Default::default(),
        prompt_tokens: input_tokens,
        completion_tokens: output_tokens,
        total_tokens: input_tokens
            .zip(output_tokens)
            .map(|(i, o)| i.saturating_add(o)),
    });
    streamed_message(text, tool_calls, usage)
}

/// One streamed event's data as JSON (`what` names it in the fault: a chunk, an event).
fn event_json(stream: &sse::EventStream, what: &str, data: &str) -> Result<Value, Fault> {
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
fn streamed_message(
    text: Option<String>,
    tool_calls: Vec<ToolCall>,
    usage: Option<Usage>,
) -> Answer {
    if text.is_none() && tool_calls.is_empty() {
        return Err(Fault::new(
            FaultCategory::Protocol,
            "the model streamed neither text nor tool calls",
        ));
    }
    Ok((
        ChatMessage {
            role: "assistant".into(),
            content: text,
            tool_calls,
            ..Default::default()
        },
        usage,
    ))
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

// ----- registry glue (`super::registry`): the `openai` and `anthropic` protocols' specs and
// modules, kept apart from the codecs above.

use trellis_dsl::lang::{ArgSpec, Capabilities, EndpointKind, NodeSpec, ProtocolSpec, ValueType};

/// The settings of a model under test, either API.
const MODEL_SETTINGS: &[NodeSpec] = &[
    NodeSpec::setting(
        "system-prompt",
        &[ArgSpec::value(ValueType::Template)],
        "the system prompt, rendered once per run with `env`",
    ),
    NodeSpec::setting(
        "tools",
        &[ArgSpec::values(ValueType::Ref("tool"))],
        "the `tool`s offered to the model as functions",
    ),
    NodeSpec::setting(
        "max-tool-rounds",
        &[ArgSpec::value(ValueType::Count)],
        "model answers with tool calls per turn before the turn is a `protocol` fault",
    ),
    NodeSpec::setting(
        "temperature",
        &[ArgSpec::value(ValueType::Number)],
        "sampling temperature sent with every request",
    ),
    NodeSpec::setting(
        "max-tokens",
        &[ArgSpec::value(ValueType::Count)],
        "cap on generated tokens per request",
    ),
    NodeSpec::setting(
        "stream",
        &[ArgSpec::value(ValueType::Boolean)],
        "ask the model for server-sent events (`#false` by default)",
    ),
];

const MODEL_CAPABILITIES: Capabilities = Capabilities {
    streams: true,
    forks: true,
    measures_ttft: true,
    engine_runs_tools: true,
    speaks_first: true,
    model_api: true,
    ..super::connexity::NO_CAPABILITIES
};

const MODEL_ENDPOINTS: &[EndpointKind] = &[
    EndpointKind::BaseUrl,
    EndpointKind::Builtin,
    EndpointKind::Provider,
];

/// `protocol="openai"`.
pub const OPENAI_SPEC: ProtocolSpec = ProtocolSpec {
    name: "openai",
    help: "A model behind an OpenAI-compatible chat completions API; the engine runs its tool loop against the suite's tools",
    endpoints: MODEL_ENDPOINTS,
    settings: MODEL_SETTINGS,
    capabilities: MODEL_CAPABILITIES,
    builtins: &[],
};

/// `protocol="anthropic"`.
pub const ANTHROPIC_SPEC: ProtocolSpec = ProtocolSpec {
    name: "anthropic",
    help: "A model behind Anthropic Messages, with the same tool loop as `openai`",
    endpoints: MODEL_ENDPOINTS,
    settings: MODEL_SETTINGS,
    capabilities: MODEL_CAPABILITIES,
    builtins: &[],
};

/// A model agent as planned: its settings, whether it streams and which API it speaks.
#[derive(Clone, Debug)]
pub struct PlannedModel {
    pub settings: OpenAiSettings,
    pub stream: bool,
    pub api: Api,
}

impl super::registry::PlannedSettings for PlannedModel {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn system_prompt(&self) -> Option<&CompiledTemplate> {
        self.settings.system_prompt.as_ref()
    }
}

pub struct OpenAiModule;
pub struct AnthropicModule;

impl super::registry::ProtocolModule for OpenAiModule {
    fn spec(&self) -> &'static ProtocolSpec {
        &OPENAI_SPEC
    }
    fn plan(
        &self,
        project: &Project,
        agent: &Agent,
        templates: &mut Templates,
    ) -> Result<Arc<dyn super::registry::PlannedSettings>, RenderError> {
        plan_model(project, agent, templates, Api::OpenAi)
    }
    fn build(
        &self,
        setup: &super::AgentSetup<'_>,
    ) -> Result<Arc<dyn AgentProtocol>, super::registry::BuildError> {
        build_model(setup)
    }
    fn untimed(&self, agent: &Agent) -> Option<String> {
        unstreamed_model(agent)
    }
}

impl super::registry::ProtocolModule for AnthropicModule {
    fn spec(&self) -> &'static ProtocolSpec {
        &ANTHROPIC_SPEC
    }
    fn plan(
        &self,
        project: &Project,
        agent: &Agent,
        templates: &mut Templates,
    ) -> Result<Arc<dyn super::registry::PlannedSettings>, RenderError> {
        plan_model(project, agent, templates, Api::Anthropic)
    }
    fn build(
        &self,
        setup: &super::AgentSetup<'_>,
    ) -> Result<Arc<dyn AgentProtocol>, super::registry::BuildError> {
        build_model(setup)
    }
    fn untimed(&self, agent: &Agent) -> Option<String> {
        unstreamed_model(agent)
    }
}

/// `stream #true`: a model is asked for one JSON body unless the agent says so.
fn streams(agent: &Agent) -> bool {
    agent
        .settings
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

fn plan_model(
    project: &Project,
    agent: &Agent,
    templates: &mut Templates,
    api: Api,
) -> Result<Arc<dyn super::registry::PlannedSettings>, RenderError> {
    Ok(Arc::new(PlannedModel {
        settings: OpenAiSettings::plan(project, agent, templates)?,
        stream: streams(agent),
        api,
    }))
}

fn build_model(
    setup: &super::AgentSetup<'_>,
) -> Result<Arc<dyn AgentProtocol>, super::registry::BuildError> {
    let planned = super::registry::settings::<PlannedModel>(setup)?;
    let settings = &planned.settings;
    Ok(Arc::new(OpenAiClient::new(
        setup.url,
        setup.headers.clone(),
        setup.limits,
        setup.retry,
        setup.transport.clone(),
        OpenAiOptions {
            model: settings.model.clone().unwrap_or_default(),
            system_prompt: setup.system_prompt.clone(),
            tools: settings.tools.clone(),
            max_tool_rounds: settings.max_tool_rounds,
            stream: planned.stream,
            api: planned.api,
            provider: setup.provider.clone(),
            server_slots: setup.server_slots.clone(),
            temperature: settings.temperature,
            max_tokens: settings.max_tokens,
        },
    )?))
}

fn unstreamed_model(agent: &Agent) -> Option<String> {
    (!streams(agent)).then(|| {
        format!(
            "agent `{}` does not have `stream #true`: the model is asked for one JSON body, so \
             no first token is timed",
            agent.id.value
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_url_is_appended_once() {
        assert_eq!(
            completions_url("http://127.0.0.1:8080/v1/", Api::OpenAi)
                .map(|u| u.to_string())
                .ok(),
            Some("http://127.0.0.1:8080/v1/chat/completions".to_owned())
        );
        assert_eq!(
            completions_url("http://h/v1/chat/completions", Api::OpenAi)
                .map(|u| u.to_string())
                .ok(),
            Some("http://h/v1/chat/completions".to_owned())
        );
    }

    #[test]
    fn garbage_answers_are_faults() {
        let fault = |body: &[u8]| decode_body(body).err().map(|f| f.category);
        assert_eq!(fault(b"<html>"), Some(FaultCategory::InvalidJson));
        assert_eq!(fault(b"{}"), Some(FaultCategory::Protocol));
        assert_eq!(
            fault(br#"{"error":{"message":"bad model"}}"#),
            Some(FaultCategory::Protocol)
        );
        assert_eq!(
            fault(br#"{"choices":[{"message":{"role":"assistant","content":null}}]}"#),
            Some(FaultCategory::Protocol)
        );
        assert_eq!(
            fault(br#"{"choices":[{"message":{"tool_calls":[{"function":{}}]}}]}"#),
            Some(FaultCategory::Protocol)
        );
    }

    #[test]
    fn tool_call_arguments_as_object_are_kept_as_json_text() {
        let body = br#"{"choices":[{"message":{"content":null,"tool_calls":[
            {"id":"c1","type":"function","function":{"name":"lookup","arguments":{"id":7}}}]}}],
            "usage":{"prompt_tokens":3,"completion_tokens":2}}"#;
        let (message, usage) = decode_body(body).expect("decodes");
        assert_eq!(message.tool_calls[0].function.arguments, r#"{"id":7}"#);
        assert_eq!(usage.and_then(|u| u.prompt_tokens), Some(3));
    }
}
