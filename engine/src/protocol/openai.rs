//! `protocol="openai"`: the agent under test is a model behind an OpenAI-compatible chat
//! completions API (the hosted API, llama.cpp, vLLM, Ollama), given a system prompt and
//! tools, and the engine runs its tool loop. `protocol="anthropic"` ([`super::anthropic`])
//! is the same loop over Anthropic Messages. The wire formats, the provider's limits, a
//! server's slots, retries and 429 waits are the LLM client's ([`crate::llm::chat`]); this
//! module is the session.
//!
//! Each turn sends the whole conversation (system prompt, then every earlier message,
//! including tool calls and tool results) with the offered tools as JSON-schema function
//! definitions. When the model answers with tool calls, the scenario's sandbox answers them
//! (the `tool` nodes' mocks: static, matched on parameters, or in sequence), the results are
//! sent back as `tool` messages, and the model is asked again, until it answers with text.
//! A model still calling tools after `max-tool-rounds` rounds ends the turn with a `protocol`
//! fault. Because the history lives here, [`Session::fork`] copies the session (with its
//! sandbox), and a recorded prefix can be restored without calling the model.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use trellis_dsl::{Agent, Project, ProviderKind, Template};

use super::{AgentProtocol, CallContext, ChatMessage, Conversation, Session, Turn, TurnInput};
use crate::llm::chat::{ChatClient, ChatOptions, NoAnswer};
use crate::llm::codec::arguments_value;
use crate::record::{Fault, FaultCategory, ToolCallRecord};
use crate::render::{CompiledTemplate, RenderError, Templates};
use crate::sandbox::{Sandbox, SandboxSpec};
use crate::transport::http::{CallLimits, EndpointError, HttpTransport, RetryPolicy};

/// What the plan keeps of an `openai` agent's definition.
#[derive(Clone, Debug, Default)]
pub struct OpenAiSettings {
    pub model: Option<String>,
    /// The agent's own `temperature` and `max-tokens` (they win over a provider's).
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    /// `system-prompt`: rendered once per run with `env` in scope, or for each turn when it
    /// reads the turn's variables (`PlannedAgent::system_prompt_per_turn`).
    pub system_prompt: Option<CompiledTemplate>,
    /// The `tools` offered, as chat-completions function definitions.
    pub tools: Vec<Value>,
    pub max_tool_rounds: u32,
}

impl OpenAiSettings {
    /// The settings of `agent` (empty for agents of other protocols), from its protocol
    /// settings as the loader checked them against [`MODEL_SETTINGS`].
    pub fn plan(
        project: &Project,
        agent: &Agent,
        templates: &mut Templates,
    ) -> Result<Self, RenderError> {
        if !agent.protocol.capabilities().model_api {
            return Ok(OpenAiSettings::default());
        }
        let written = &agent.settings;
        let system_prompt = written
            .spanned("system-prompt")
            .and_then(|v| {
                Some(Template {
                    source: v.value.as_str()?.to_owned(),
                    span: v.span,
                })
            })
            .map(|t| templates.compile(&t))
            .transpose()?;
        let tools = written
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|name| {
                let tool = project.tools.iter().find(|t| t.name.value == name);
                function_definition(name, tool)
            })
            .collect();
        let count = |name: &str| {
            written
                .get(name)
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
        };
        Ok(OpenAiSettings {
            model: agent.model.clone(),
            temperature: written.get("temperature").and_then(Value::as_f64),
            max_tokens: count("max-tokens"),
            system_prompt,
            tools,
            max_tool_rounds: count("max-tool-rounds").unwrap_or(DEFAULT_MAX_TOOL_ROUNDS),
        })
    }
}

/// Tool rounds a model agent may take in one turn when `max-tool-rounds` is not written.
pub const DEFAULT_MAX_TOOL_ROUNDS: u32 = 8;

/// `{"type":"function","function":{name, description, parameters}}` from a `tool` node: each
/// `param` a property of its JSON-schema type, `required` ones listed.
fn function_definition(name: &str, tool: Option<&trellis_dsl::Tool>) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for param in tool.map(|t| t.params.as_slice()).unwrap_or_default() {
        let mut property = Map::new();
        property.insert("type".into(), Value::String(param.ty.clone()));
        // OpenAI refuses an array schema without `items` ("array schema missing items");
        // a `param` does not say what the elements are, so any element is allowed.
        if param.ty == "array" {
            property.insert("items".into(), json!({}));
        }
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

/// A model agent as configured for a run (either API). Cheap to clone: every session holds
/// one.
#[derive(Clone, Debug)]
pub struct OpenAiClient {
    chat: ChatClient,
    max_tool_rounds: u32,
    /// `openai` or `anthropic`, for faults that name the protocol.
    protocol: &'static str,
}

/// Everything a model agent's client is built from: the chat client's options (whose `api`
/// the constructor sets) and the tool loop's bound.
pub struct OpenAiOptions {
    pub chat: ChatOptions,
    pub max_tool_rounds: u32,
}

impl OpenAiClient {
    /// A model behind chat completions. `base_url` is the API root (`…/v1`;
    /// `/chat/completions` is appended unless already there). `headers` are the agent's
    /// rendered `header` nodes (an `Authorization` header carries a key).
    pub fn new(
        base_url: &str,
        headers: Vec<(String, String)>,
        limits: CallLimits,
        retry: RetryPolicy,
        transport: HttpTransport,
        options: OpenAiOptions,
    ) -> Result<Self, EndpointError> {
        Self::for_api(
            ProviderKind::OpenAi,
            base_url,
            headers,
            limits,
            retry,
            transport,
            options,
        )
    }

    /// A model behind `api`: the session and tool loop are the same for both APIs.
    pub(super) fn for_api(
        api: ProviderKind,
        base_url: &str,
        headers: Vec<(String, String)>,
        limits: CallLimits,
        retry: RetryPolicy,
        transport: HttpTransport,
        options: OpenAiOptions,
    ) -> Result<Self, EndpointError> {
        let chat = ChatClient::new(
            base_url,
            headers,
            limits,
            retry,
            transport,
            ChatOptions {
                api,
                ..options.chat
            },
        )?;
        Ok(OpenAiClient {
            chat,
            max_tool_rounds: options.max_tool_rounds,
            protocol: api.as_str(),
        })
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
                        "an `{}` agent takes user messages; a `{}` step cannot be sent to it",
                        self.client.protocol,
                        other.kind()
                    ),
                ));
            }
        }
        let max_rounds = self.client.max_tool_rounds;
        let mut turn = Turn {
            model: Some(self.client.chat.model().to_owned()),
            provider: self.client.chat.provider_id().map(str::to_owned),
            ..Default::default()
        };
        let mut rounds = 0u32;
        loop {
            // Time queued for a shared server's slot is not the trajectory's: its deadline
            // moves by it.
            let queued: Duration = turn.exchanges.iter().map(|e| e.queued).sum();
            let deadline = ctx.deadline.map(|d| d + queued);
            // A tool round continues a turn in flight: a stop lets it finish, as it does the
            // turn's first request once sent.
            let tab = ctx.llm_meter.map(|meter| {
                if turn.exchanges.is_empty() {
                    meter.tab()
                } else {
                    meter.tab_continuing()
                }
            });
            let (exchange, outcome) = self
                .client
                .chat
                .complete(
                    &self.history,
                    deadline,
                    ctx.turn_headers,
                    ctx.system_prompt,
                    tab.as_ref(),
                )
                .await;
            let refused = matches!(&outcome, Err(NoAnswer { refused: true, .. }));
            if let (Some(meter), Some(tab)) = (ctx.llm_meter, tab) {
                let attempts = exchange.attempts.len();
                meter.record_model_request(exchange.usage, attempts, refused, tab);
            }
            if refused {
                // A retry refused is as a first request refused: the turn is not recorded.
                turn.unsent = true;
                return turn;
            }
            turn.exchanges.push(exchange);
            let message = match outcome {
                Ok(message) => message,
                Err(NoAnswer { fault, said, .. }) => {
                    // What the model said before it was cut is there to read; it is not the
                    // reply (nothing checks it).
                    if let Some(text) = said {
                        turn.messages.push(ChatMessage::assistant(text));
                    }
                    turn.fault = Some(fault);
                    return turn;
                }
            };
            self.history.push(message.clone());
            turn.messages.push(message.clone());
            if message.tool_calls.is_empty() {
                // The codecs let through an answer without text only when the model refused
                // (`codec::refused`): its reply is empty, and its checks decide.
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
// ----- registry glue (`super::registry`): the `openai` protocol's spec and module (the
// `anthropic` one, in `super::anthropic`, shares the settings, planning and building).

use trellis_dsl::lang::{ArgSpec, Capabilities, EndpointKind, NodeSpec, ProtocolSpec, ValueType};

/// The settings of a model under test, either API.
pub(super) const MODEL_SETTINGS: &[NodeSpec] = &[
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
        &[ArgSpec::value(ValueType::Positive)],
        "the most model answers with tool calls in one turn; one more is a `protocol` fault",
    ),
    NodeSpec::setting(
        "temperature",
        &[ArgSpec::value(ValueType::Between(0, 2))],
        "the sampling temperature sent with every request",
    ),
    NodeSpec::setting(
        "max-tokens",
        &[ArgSpec::value(ValueType::Positive)],
        "the cap on generated tokens per request",
    ),
    NodeSpec::setting(
        "stream",
        &[ArgSpec::value(ValueType::Boolean)],
        "ask the model for server-sent events (`#false` by default)",
    ),
];

pub(super) const MODEL_CAPABILITIES: Capabilities = Capabilities {
    streams: true,
    forks: true,
    measures_ttft: true,
    engine_runs_tools: true,
    speaks_first: true,
    model_api: true,
    ..super::connexity::NO_CAPABILITIES
};

pub(super) const MODEL_ENDPOINTS: &[EndpointKind] = &[
    EndpointKind::BaseUrl,
    EndpointKind::Builtin,
    EndpointKind::Provider,
];

/// `protocol="openai"`.
pub const SPEC: ProtocolSpec = ProtocolSpec {
    name: "openai",
    help: "A model behind an OpenAI-compatible chat completions API; the engine runs its tool loop against the suite's tools",
    endpoints: MODEL_ENDPOINTS,
    settings: MODEL_SETTINGS,
    capabilities: MODEL_CAPABILITIES,
    // `trellis-agents`' deterministic order-desk model behind chat completions.
    builtins: &["clerk"],

    check: None,
};

/// A model agent as planned: its settings, whether it streams and which API it speaks.
#[derive(Clone, Debug)]
pub struct PlannedModel {
    pub settings: OpenAiSettings,
    pub stream: bool,
    pub api: ProviderKind,
}

impl super::registry::PlannedSettings for PlannedModel {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn system_prompt(&self) -> Option<&CompiledTemplate> {
        self.settings.system_prompt.as_ref()
    }
}

pub struct Module;

impl super::registry::ProtocolModule for Module {
    fn spec(&self) -> &'static ProtocolSpec {
        &SPEC
    }
    fn plan(
        &self,
        project: &Project,
        agent: &Agent,
        templates: &mut Templates,
    ) -> Result<Arc<dyn super::registry::PlannedSettings>, RenderError> {
        plan_model(project, agent, templates, ProviderKind::OpenAi)
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

pub(super) fn plan_model(
    project: &Project,
    agent: &Agent,
    templates: &mut Templates,
    api: ProviderKind,
) -> Result<Arc<dyn super::registry::PlannedSettings>, RenderError> {
    Ok(Arc::new(PlannedModel {
        settings: OpenAiSettings::plan(project, agent, templates)?,
        stream: streams(agent),
        api,
    }))
}

pub(super) fn build_model(
    setup: &super::AgentSetup<'_>,
) -> Result<Arc<dyn AgentProtocol>, super::registry::BuildError> {
    let planned = super::registry::settings::<PlannedModel>(setup)?;
    let settings = &planned.settings;
    let options = OpenAiOptions {
        chat: ChatOptions {
            // Set by the constructor from `planned.api`.
            api: planned.api,
            model: settings.model.clone().unwrap_or_default(),
            system_prompt: setup.system_prompt.clone(),
            tools: settings.tools.clone(),
            stream: planned.stream,
            provider: setup.provider.clone(),
            server_slots: setup.server_slots.clone(),
            temperature: settings.temperature,
            max_tokens: settings.max_tokens,
        },
        max_tool_rounds: settings.max_tool_rounds,
    };
    Ok(Arc::new(OpenAiClient::for_api(
        planned.api,
        setup.url,
        setup.headers.clone(),
        setup.limits,
        setup.retry,
        setup.transport.clone(),
        options,
    )?))
}

pub(super) fn unstreamed_model(agent: &Agent) -> Option<String> {
    (!streams(agent)).then(|| {
        format!(
            "agent `{}` does not have `stream #true`: the model is asked for one JSON body, so \
             no first token is timed",
            agent.id.value
        )
    })
}
