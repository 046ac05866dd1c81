//! The session half of `protocol="http"` (see the module docs of `jsonhttp`): the client
//! built once per agent, and one conversation per trajectory.

use std::sync::Arc;

use super::settings::{HttpMethod, HttpSettings};
use futures::future::BoxFuture;
use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use trellis_dsl::Endpoint;

use super::codec::{self, Answer, Progress, StreamDecoder};
use crate::protocol::{
    AgentProtocol, AgentSetup, CallContext, ChatMessage, Conversation, Exchange, Session, Turn,
    TurnInput,
};
use crate::record::{Fault, FaultCategory, ToolCallRecord};
use crate::render::{CompiledTemplate, RenderError, Templates};
use crate::transport::http::{
    CallLimits, EndpointError, HttpTransport, RetryPolicy, agent_url, rate_limited_fault,
    with_agent_headers, with_retries,
};
use crate::transport::sse::{self, Opened, StreamLimits};

/// An `http` agent could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum JsonHttpError {
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error("agent `{0}` has no `http` settings")]
    NoSettings(String),
    #[error("`request` template: {0}")]
    Template(#[from] RenderError),
}

/// A client for one `http` agent. Cheap to clone: every session holds one.
#[derive(Clone)]
pub struct JsonHttpClient {
    inner: Arc<Config>,
}

struct Config {
    url: Url,
    method: reqwest::Method,
    headers: HeaderMap,
    limits: CallLimits,
    retry: RetryPolicy,
    transport: HttpTransport,
    settings: HttpSettings,
    /// The `request` template, compiled in an environment of its own (the plan's is not
    /// reachable from a session).
    templates: Templates,
    request: CompiledTemplate,
    /// `METHOD /path`, the label of every exchange.
    label: Arc<str>,
}

impl JsonHttpClient {
    /// The client of the agent `setup` describes. A `builtin="langserve"` agent with
    /// `stream` is sent to the builtin's `/stream` route, which sits next to `/invoke` as
    /// on a LangServe server.
    pub fn new(
        setup: &AgentSetup<'_>,
        settings: Option<&HttpSettings>,
    ) -> Result<Self, JsonHttpError> {
        let settings = settings
            .cloned()
            .ok_or_else(|| JsonHttpError::NoSettings(setup.id.to_owned()))?;
        let mut url = setup.url.to_owned();
        if matches!(setup.endpoint, Endpoint::Builtin(_))
            && settings.stream.is_some()
            && let Some(base) = url.strip_suffix("/invoke")
        {
            url = format!("{base}/stream");
        }
        let url = agent_url(&url)?;
        let mut defaults = HeaderMap::with_capacity(setup.headers.len() + 2);
        defaults.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        defaults.insert(
            ACCEPT,
            HeaderValue::from_static(if settings.stream.is_some() {
                "text/event-stream"
            } else {
                "application/json"
            }),
        );
        let headers = with_agent_headers(defaults, &setup.headers).map_err(EndpointError::from)?;
        let method = match settings.method {
            HttpMethod::Post => reqwest::Method::POST,
            HttpMethod::Put => reqwest::Method::PUT,
            HttpMethod::Patch => reqwest::Method::PATCH,
        };
        let mut templates = Templates::default();
        let request = templates.compile(&settings.request)?;
        let label = Arc::from(format!("{method} {}", url.path()));
        Ok(JsonHttpClient {
            inner: Arc::new(Config {
                url,
                method,
                headers,
                limits: setup.limits,
                retry: setup.retry,
                transport: setup.transport.clone(),
                settings,
                templates,
                request,
                label,
            }),
        })
    }
}

impl AgentProtocol for JsonHttpClient {
    fn open(&self, _conversation: &Conversation<'_>) -> Box<dyn Session> {
        Box::new(JsonHttpSession {
            client: self.clone(),
            history: Vec::new(),
            session: None,
            scope: minijinja::Value::from(std::collections::BTreeMap::<String, ()>::new()),
        })
    }
}

/// One conversation: the history the template can resend, the agent's session value once
/// it handed one out, and the trajectory's template variables for the next turn.
#[derive(Clone)]
struct JsonHttpSession {
    client: JsonHttpClient,
    history: Vec<ChatMessage>,
    session: Option<String>,
    scope: minijinja::Value,
}

impl Session for JsonHttpSession {
    fn turn<'a>(
        &'a mut self,
        input: TurnInput<'a>,
        ctx: &'a CallContext<'a>,
    ) -> BoxFuture<'a, Turn> {
        Box::pin(self.take_turn(input, ctx))
    }

    fn fork(&self) -> Option<Box<dyn Session>> {
        if self.client.inner.settings.session_bound() {
            return None;
        }
        Some(Box::new(self.clone()))
    }

    /// Without `session` the history is all the state there is; with it, the conversation
    /// is on the agent's side and cannot be rebuilt here.
    fn restore(&mut self, history: &[(TurnInput<'_>, &Turn)]) -> bool {
        let supported = history
            .iter()
            .all(|(input, _)| matches!(input, TurnInput::User(_) | TurnInput::Opening));
        if self.client.inner.settings.session_bound() || !supported {
            return false;
        }
        for (input, turn) in history {
            if let TurnInput::User(text) = input {
                self.history.push(ChatMessage::user(*text));
            }
            self.history
                .extend(turn.messages.iter().map(replayed_in_history));
        }
        true
    }

    fn set_template_scope(&mut self, scope: &dyn Fn() -> minijinja::Value) {
        self.scope = scope();
    }
}

impl JsonHttpSession {
    async fn take_turn(&mut self, input: TurnInput<'_>, ctx: &CallContext<'_>) -> Turn {
        let user = match input {
            TurnInput::User(text) => Some(text),
            // The agent speaks first: the template renders with no user message.
            TurnInput::Opening => None,
            TurnInput::Call { .. } | TurnInput::Human { .. } | TurnInput::Branch { .. } => {
                return Turn::failed(Fault::new(
                    FaultCategory::Protocol,
                    format!(
                        "an `http` agent answers user messages; it cannot take a `{}` step",
                        input.kind()
                    ),
                ));
            }
        };
        if let Some(text) = user {
            self.history.push(ChatMessage::user(text));
        }
        let config = &*self.client.inner;
        let body = match self.render(user) {
            Ok(body) => body,
            Err(fault) => return Turn::failed(fault),
        };
        let headers = match self.headers(ctx) {
            Ok(headers) => headers,
            Err(fault) => return Turn::failed(fault),
        };
        let mut exchange = Exchange {
            label: config.label.clone(),
            ..Default::default()
        };
        let (result, partial) = match &config.settings.stream {
            None => {
                let attempted = with_retries(config.retry, config.limits.timeout, ctx.deadline, {
                    let headers = &headers;
                    move |budget| {
                        let body = body.clone();
                        async move {
                            let response = config
                                .transport
                                .send_json(
                                    config.method.clone(),
                                    &config.url,
                                    headers,
                                    body,
                                    config.limits.max_response_size,
                                    budget,
                                )
                                .await?;
                            match &config.settings.reply {
                                Some(reply) => {
                                    codec::decode_answer(&response.body, reply, &config.settings)
                                }
                                None => Err(internal_no_reply()),
                            }
                        }
                    }
                })
                .await;
                exchange.attempts = attempted.attempts;
                (attempted.result, None)
            }
            Some(_) => self.stream(body, &headers, ctx, &mut exchange).await,
        };
        let mut turn = Turn {
            exchanges: vec![exchange],
            ..Default::default()
        };
        match result {
            Ok(answer) => self.accept(answer, &mut turn),
            Err(fault) => {
                if let Some(text) = partial {
                    turn.messages = vec![ChatMessage::assistant(text)];
                }
                turn.fault = Some(fault);
            }
        }
        turn
    }

    /// The `request` template rendered for this turn, checked to be JSON.
    fn render(&self, user: Option<&str>) -> Result<bytes::Bytes, Fault> {
        let config = &*self.client.inner;
        let rendered = config
            .templates
            .render(&config.request, || {
                minijinja::context! {
                    messages => minijinja::Value::from(minijinja::value::Serde(&self.history)),
                    langchain_messages => minijinja::Value::from(minijinja::value::Serde(
                        codec::langchain_messages(&self.history)
                    )),
                    user => user,
                    session => self.session.as_deref(),
                    ..self.scope.clone()
                }
            })
            .map_err(|e| {
                Fault::new(
                    FaultCategory::Template,
                    format!("the `request` template could not be rendered: {e}"),
                )
            })?;
        codec::check_request(rendered)
    }

    /// The agent's headers with the turn's own over them, and the session header once the
    /// session value is known.
    fn headers(&self, ctx: &CallContext<'_>) -> Result<HeaderMap, Fault> {
        let config = &*self.client.inner;
        let header = config
            .settings
            .session
            .as_ref()
            .and_then(|s| s.header.as_deref());
        let (Some(name), Some(value)) = (header, self.session.as_deref()) else {
            return Ok(ctx.headers(&config.headers).into_owned());
        };
        let mut headers = ctx.headers(&config.headers).into_owned();
        let name = HeaderName::from_bytes(name.as_bytes());
        let value = HeaderValue::from_str(value);
        match (name, value) {
            (Ok(name), Ok(value)) => {
                headers.insert(name, value);
                Ok(headers)
            }
            _ => Err(Fault::new(
                FaultCategory::Protocol,
                format!(
                    "the session value the agent sent cannot be sent back in header `{}` \
                     (control characters or line breaks): {}",
                    header.unwrap_or_default(),
                    crate::transport::quote::preview(
                        self.session.as_deref().unwrap_or("").as_bytes()
                    )
                ),
            )),
        }
    }

    /// Sends the request for server-sent events and assembles the answer; also returns the
    /// text received before a fault.
    async fn stream(
        &self,
        body: bytes::Bytes,
        headers: &HeaderMap,
        ctx: &CallContext<'_>,
        exchange: &mut Exchange,
    ) -> (Result<Answer, Fault>, Option<String>) {
        let config = &*self.client.inner;
        let Some(stream_settings) = &config.settings.stream else {
            return (Err(internal_no_reply()), None);
        };
        let limits = StreamLimits::from(config.limits);
        let attempted = with_retries(
            config.retry,
            config.limits.timeout,
            ctx.deadline,
            |budget| {
                let body = body.clone();
                async move {
                    sse::open(
                        &config.transport,
                        &config.url,
                        headers,
                        body,
                        limits,
                        budget,
                    )
                    .await
                    .and_then(Opened::or_rate_limited)
                }
            },
        )
        .await;
        exchange.attempts = attempted.attempts;
        let mut partial = None;
        let outcome = match attempted.result {
            Err(fault) => Err(fault),
            // Waited out in the attempts; what is left of it is that fault.
            Ok(Opened::RateLimited(asked)) => Err(rate_limited_fault(asked)),
            // A server that answers one JSON body although asked for a stream.
            Ok(Opened::Json(body)) => {
                let reply = config
                    .settings
                    .reply
                    .as_ref()
                    .unwrap_or(&stream_settings.json_path);
                codec::decode_answer(&body, reply, &config.settings)
            }
            Ok(Opened::Events(mut events)) => {
                events.set_deadline(ctx.deadline);
                let mut decoder = StreamDecoder::new(stream_settings, &config.settings);
                let mut first_text = None;
                let read = loop {
                    let event = match events.next().await {
                        Ok(Some(event)) => event,
                        Ok(None) => {
                            break Err(events.ended_early(&format!(
                                "the `{}` event (or `data: [DONE]`)",
                                stream_settings.end_event
                            )));
                        }
                        Err(fault) => break Err(fault),
                    };
                    match decoder.apply(&event) {
                        Ok(Progress::Done) => break Ok(()),
                        Ok(Progress::Data { text: true }) if first_text.is_none() => {
                            first_text = Some(events.started().elapsed());
                        }
                        Ok(_) => {}
                        Err(fault) => break Err(fault),
                    }
                };
                // Time to the first text, where the first event may only be metadata.
                exchange.ttft = first_text.or(events.ttft());
                if let Some(last) = exchange.attempts.last_mut() {
                    last.latency = events.started().elapsed();
                }
                match read {
                    Ok(()) => decoder.finish(),
                    Err(fault) => {
                        partial = decoder.partial();
                        Err(fault)
                    }
                }
            }
        };
        // A fault in the answer the last attempt received is that attempt's own.
        if let (Err(fault), Some(last)) = (&outcome, exchange.attempts.last_mut())
            && last.fault.is_none()
        {
            last.fault = Some(fault.clone());
        }
        (outcome, partial)
    }

    /// Records the answer on the turn and in the conversation; keeps the session value.
    fn accept(&mut self, answer: Answer, turn: &mut Turn) {
        let config = &*self.client.inner;
        if self.session.is_none() {
            match (&config.settings.session, answer.session) {
                (Some(_), Some(value)) => self.session = Some(value),
                (Some(capture), None) => {
                    turn.fault = Some(Fault::new(
                        FaultCategory::Protocol,
                        format!(
                            "`session` json-path `{}` matched nothing in the agent's first \
                             answer (a string or number is expected there)",
                            capture.json_path.source
                        ),
                    ));
                }
                (None, _) => {}
            }
        }
        let message = ChatMessage {
            role: "assistant".into(),
            content: answer.reply.clone(),
            tool_calls: answer.tool_calls,
            ..Default::default()
        };
        turn.tool_calls = message
            .tool_calls
            .iter()
            .map(|call| ToolCallRecord {
                call_id: call.id.clone(),
                name: call.function.name.clone(),
                arguments: call.function.arguments.clone(),
                result: None,
            })
            .collect();
        turn.reply = answer.reply;
        turn.data = answer.data;
        self.history.push(replayed_in_history(&message));
        turn.messages = vec![message];
    }
}

/// An answer as the next requests' `messages` carry it: its text, without the tool calls
/// the agent made and answered itself. Their results never reached Trellis, and an
/// assistant message with `tool_calls` not followed by their `tool` results is refused by
/// OpenAI-compatible models (and the LangChain chains in front of them) on the next turn.
/// The turn's record keeps the calls.
fn replayed_in_history(message: &ChatMessage) -> ChatMessage {
    if message.tool_calls.is_empty() {
        return message.clone();
    }
    ChatMessage {
        content: Some(message.content.clone().unwrap_or_default()),
        tool_calls: Vec::new(),
        ..message.clone()
    }
}

/// Parsing guarantees `reply` when there is no `stream`; reaching this is a bug.
fn internal_no_reply() -> Fault {
    Fault::new(
        FaultCategory::Internal,
        "an `http` agent without `reply` or `stream` settings",
    )
}
