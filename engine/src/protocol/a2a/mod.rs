//! The Agent2Agent protocol (`protocol="a2a"`, docs/language.md "A2A agents"): JSON-RPC 2.0
//! over HTTP, the agent described by its agent card.
//!
//! `prepare` reads the card once per run (`{url}/.well-known/agent-card.json`, then the
//! older `agent.json`; a `url` ending in `.json` is the card itself) and records it as the
//! agent's journal entry. Requests go to the card's JSON-RPC URL (else the agent `url`):
//! `message/stream` when the card says it streams (`stream` overrides), else
//! `message/send` (`SendStreamingMessage` / `SendMessage` with `A2A-Version: 1.0` when the
//! endpoint speaks v1.0); a streamed answer is read through [`sse`], so time to first token, the
//! idle timeout, size bounds and `incomplete` streams behave as for every streaming agent,
//! and a server that answers a stream request with one JSON body is read as such.
//!
//! The conversation lives on the server, keyed by the `contextId` it returns; a task left
//! waiting (`input-required`) is continued with its `taskId`, so the next user step answers
//! the agent's question. Neither can be copied, so a session does not fork: the executor
//! replays the prefix in a fresh session per branch, as for AgentScope.
//!
//! The pure codec is [`wire`]; this module does the I/O and the session state.

pub mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::future::BoxFuture;
use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use super::{
    AgentProtocol, CallContext, ChatMessage, Conversation, Exchange, Session, Turn, TurnInput,
};
use crate::record::{Fault, FaultCategory};
use crate::transport::http::{
    CallLimits, EndpointError, HttpTransport, RetryPolicy, agent_url, rate_limited_fault,
    with_agent_headers, with_retries,
};
use crate::transport::quote::preview;
use crate::transport::sse::{self, Opened, StreamLimits};
use wire::{AgentCard, Assembly};

/// Where agent cards are published, newest first.
pub const CARD_PATHS: [&str; 2] = [".well-known/agent-card.json", ".well-known/agent.json"];

/// Numbers JSON-RPC requests and message ids across the process.
static REQUESTS: AtomicU64 = AtomicU64::new(0);

/// An A2A agent could not be configured.
pub type A2aError = EndpointError;

/// A client for one A2A agent.
#[derive(Debug)]
pub struct A2aClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The agent `url`: where the card is looked for, and the fallback endpoint.
    base: Url,
    headers: HeaderMap,
    limits: CallLimits,
    retry: RetryPolicy,
    options: A2aSettings,
    transport: HttpTransport,
    /// The card's endpoint and capabilities, read once per run.
    resolved: OnceCell<Result<Arc<Resolved>, Fault>>,
}

/// Where and how to send messages, from the card.
#[derive(Debug)]
struct Resolved {
    rpc: Url,
    stream: bool,
    version: wire::Version,
    label: Arc<str>,
    /// What `prepare` records.
    record: Value,
}

impl A2aClient {
    /// `headers` are the agent's rendered `header` nodes, sent with the card request and
    /// every call.
    pub fn new(
        url: &str,
        headers: Vec<(String, String)>,
        limits: CallLimits,
        retry: RetryPolicy,
        options: A2aSettings,
        transport: HttpTransport,
    ) -> Result<Self, A2aError> {
        let base = agent_url(url)?;
        let mut map = HeaderMap::with_capacity(headers.len() + 1);
        map.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let headers = with_agent_headers(map, &headers)?;
        Ok(A2aClient {
            inner: Arc::new(Inner {
                base,
                headers,
                limits,
                retry,
                options,
                transport,
                resolved: OnceCell::new(),
            }),
        })
    }
}

impl Inner {
    async fn resolved(&self) -> Result<Arc<Resolved>, Fault> {
        self.resolved
            .get_or_init(|| async { self.read_card().await.map(Arc::new) })
            .await
            .clone()
    }

    /// The card URLs to try, in order.
    fn card_urls(&self) -> Vec<Url> {
        if self.base.path().ends_with(".json") {
            return vec![self.base.clone()];
        }
        let mut base = self.base.clone();
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        CARD_PATHS
            .iter()
            .filter_map(|path| base.join(path).ok())
            .collect()
    }

    async fn read_card(&self) -> Result<Resolved, Fault> {
        let urls = self.card_urls();
        // The first path that was not there, when a later one is tried.
        let mut missing: Option<String> = None;
        for (i, url) in urls.iter().enumerate() {
            let attempted = with_retries(self.retry, self.limits.timeout, None, |timeout| {
                self.transport
                    .get(url, &self.headers, self.limits.max_response_size, timeout)
            })
            .await;
            let fault = match attempted.result {
                Ok(response) => {
                    let card = wire::parse_card(&response.body)
                        .map_err(|f| Fault::new(f.category, format!("GET {url}: {}", f.message)))?;
                    return self.resolve(url, card);
                }
                Err(fault) => fault,
            };
            // An older server publishes only `agent.json`: only a card that is not there
            // sends us to the next path. Any other answer (401 for a wrong token, 429, a
            // 5xx) is the agent's answer, said as it is, not hidden behind the next path's
            // 404 nor waited out twice.
            if not_there(&fault) && i + 1 < urls.len() {
                missing.get_or_insert_with(|| format!("GET {url}: {}", fault.message));
                continue;
            }
            let message = match &missing {
                Some(first) => format!("{first}; then GET {url}: {}", fault.message),
                None if fault.category == FaultCategory::Http4xx => {
                    format!("GET {url}: {}", fault.message)
                }
                None => format!("could not read the agent card at {url}: {}", fault.message),
            };
            return Err(Fault::new(fault.category, message));
        }
        Err(Fault::new(
            FaultCategory::Setup,
            "no agent card URL could be formed",
        ))
    }

    fn resolve(&self, card_url: &Url, card: AgentCard) -> Result<Resolved, Fault> {
        let rpc = match card.url.as_deref() {
            Some(url) => card_url.join(url).map_err(|e| {
                Fault::new(
                    FaultCategory::Protocol,
                    format!("the agent card's url `{url}` is not a URL: {e}"),
                )
            })?,
            None => self.base.clone(),
        };
        if !matches!(rpc.scheme(), "http" | "https") {
            return Err(Fault::new(
                FaultCategory::Protocol,
                format!("the agent card's url `{rpc}` is not http or https"),
            ));
        }
        let stream = self.options.stream.unwrap_or(card.streaming);
        let label = format!("POST {} {}", rpc.path(), wire::method(card.version, stream)).into();
        let record = json!({
            "card_url": card_url.as_str(),
            "endpoint": rpc.as_str(),
            "streaming": card.streaming,
            "stream": stream,
            "protocol_version": match card.version {
                wire::Version::V03 => "0.3",
                wire::Version::V1 => "1.0",
            },
            "card": card.raw,
        });
        Ok(Resolved {
            rpc,
            stream,
            version: card.version,
            label,
            record,
        })
    }

    /// Sends one user message and assembles the answer.
    async fn send(
        &self,
        text: &str,
        context_id: Option<&str>,
        task_id: Option<&str>,
        ctx: &CallContext<'_>,
    ) -> (Turn, wire::Answer) {
        let resolved = match self.resolved().await {
            Ok(resolved) => resolved,
            Err(fault) => return (Turn::failed(fault), wire::Answer::default()),
        };
        let n = REQUESTS.fetch_add(1, Ordering::Relaxed) + 1;
        let message_id = format!("trellis-{}-{n}", std::process::id());
        let request = wire::request(
            resolved.version,
            n,
            resolved.stream,
            &message_id,
            text,
            context_id,
            task_id,
        );
        let body = Bytes::from(request.to_string());
        let mut headers = ctx.headers(&self.headers).into_owned();
        // A v1.0 server takes a request without it for v0.3 (and answers v0.3 methods only
        // when it was built to).
        if resolved.version == wire::Version::V1 && !headers.contains_key("a2a-version") {
            headers.insert("a2a-version", HeaderValue::from_static("1.0"));
        }
        if !headers.contains_key(ACCEPT) {
            headers.insert(
                ACCEPT,
                HeaderValue::from_static(if resolved.stream {
                    "text/event-stream"
                } else {
                    "application/json"
                }),
            );
        }
        let mut exchange = Exchange {
            label: Arc::clone(&resolved.label),
            ..Default::default()
        };
        let mut assembly = Assembly::new();
        let outcome = if resolved.stream {
            let limits = StreamLimits::from(self.limits);
            let attempted = with_retries(self.retry, self.limits.timeout, ctx.deadline, |budget| {
                let body = body.clone();
                let headers = &headers;
                let rpc = &resolved.rpc;
                async move {
                    sse::open(&self.transport, rpc, headers, body, limits, budget)
                        .await
                        .and_then(Opened::or_rate_limited)
                }
            })
            .await;
            exchange.attempts = attempted.attempts;
            match attempted.result {
                Err(fault) => Err(fault),
                // Waited out in the attempts; what is left of it is that fault.
                Ok(Opened::RateLimited(asked)) => Err(rate_limited_fault(asked)),
                Ok(Opened::Json(body)) => apply_body(&mut assembly, &body, n),
                Ok(Opened::Events(mut stream)) => {
                    stream.set_deadline(ctx.deadline);
                    let outcome = read_events(&mut stream, &mut assembly, n).await;
                    exchange.ttft = stream.ttft();
                    // The attempt lasted until the stream was over.
                    if let Some(last) = exchange.attempts.last_mut() {
                        last.latency = stream.started().elapsed();
                    }
                    outcome
                }
            }
        } else {
            let attempted = with_retries(self.retry, self.limits.timeout, ctx.deadline, |budget| {
                let body = body.clone();
                let headers = &headers;
                let rpc = &resolved.rpc;
                async move {
                    self.transport
                        .post_json(rpc, headers, body, self.limits.max_response_size, budget)
                        .await
                }
            })
            .await;
            exchange.attempts = attempted.attempts;
            attempted
                .result
                .and_then(|response| apply_body(&mut assembly, &response.body, n))
        };
        // A fault in the answer the last attempt received is that attempt's own.
        if let (Err(fault), Some(last)) = (&outcome, exchange.attempts.last_mut())
            && last.fault.is_none()
        {
            last.fault = Some(fault.clone());
        }
        let answer = assembly.finish();
        let mut turn = Turn {
            exchanges: vec![exchange],
            ..Default::default()
        };
        if let Some(reply) = &answer.reply {
            turn.messages.push(ChatMessage::assistant(reply.clone()));
        }
        turn.data = answer.data.clone();
        match outcome {
            Ok(()) => {
                turn.reply = answer.reply.clone();
                turn.fault = answer.fault.clone();
            }
            Err(fault) => turn.fault = Some(fault),
        }
        (turn, answer)
    }
}

/// Applies a whole JSON-RPC response body: the answer must be complete in it.
fn apply_body(assembly: &mut Assembly, body: &[u8], id: u64) -> Result<(), Fault> {
    let result = wire::response_result(body, id)?;
    assembly.apply(result)?;
    if assembly.is_done() {
        Ok(())
    } else {
        // `message/send` may return a task still working (the client would have to poll
        // `tasks/get`); the answer this turn received is not the agent's reply.
        Err(Fault::new(
            FaultCategory::Incomplete,
            "the agent answered with a task that is not finished (submitted or working); \
             polling `tasks/get` is not supported: give the agent `stream #true` or make it \
             answer when done",
        ))
    }
}

/// Reads events until the answer is complete (a Message, a final status update, or a task
/// in a terminal or interrupted state).
async fn read_events(
    stream: &mut sse::EventStream,
    assembly: &mut Assembly,
    id: u64,
) -> Result<(), Fault> {
    while !assembly.is_done() {
        let Some(event) = stream.next().await? else {
            if assembly.ends_with_the_stream() {
                break;
            }
            return Err(stream.ended_early("a final status update"));
        };
        let data = event.data.trim();
        if data.is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(data).map_err(|e| {
            Fault::new(
                FaultCategory::InvalidJson,
                format!(
                    "event {} is not JSON ({e}): {}",
                    stream.count(),
                    preview(data.as_bytes())
                ),
            )
        })?;
        assembly.apply(wire::envelope_result(value, id)?)?;
    }
    Ok(())
}

impl AgentProtocol for A2aClient {
    fn prepare(&self) -> BoxFuture<'_, Result<Option<Value>, Fault>> {
        Box::pin(async move {
            let resolved = self.inner.resolved().await?;
            Ok(Some(resolved.record.clone()))
        })
    }

    fn open(&self, _conversation: &Conversation<'_>) -> Box<dyn Session> {
        Box::new(A2aSession {
            inner: Arc::clone(&self.inner),
            context_id: None,
            task_id: None,
        })
    }
}

/// One A2A conversation: a context on the server, and the task it left open, if any.
struct A2aSession {
    inner: Arc<Inner>,
    context_id: Option<String>,
    task_id: Option<String>,
}

impl Session for A2aSession {
    fn turn<'a>(
        &'a mut self,
        input: TurnInput<'a>,
        ctx: &'a CallContext<'a>,
    ) -> BoxFuture<'a, Turn> {
        Box::pin(async move {
            let TurnInput::User(text) = input else {
                let what = match input {
                    TurnInput::Opening => "speak first (`first-turn \"agent\"`)",
                    TurnInput::Call { .. } => "take a function `call`",
                    TurnInput::Branch { .. } => "continue a branch it asked for",
                    _ => "take a human's answer",
                };
                return Turn::failed(Fault::new(
                    FaultCategory::Protocol,
                    format!("an A2A agent answers user messages; it cannot {what}"),
                ));
            };
            let (turn, answer) = self
                .inner
                .send(
                    text,
                    self.context_id.as_deref(),
                    self.task_id.as_deref(),
                    ctx,
                )
                .await;
            if answer.context_id.is_some() {
                self.context_id = answer.context_id;
            }
            // A task still waiting for the user is continued by the next message; a
            // finished one (or a plain message answer) is not.
            self.task_id = match answer.state {
                Some(state) if state.is_interrupted() => answer.task_id,
                _ => None,
            };
            turn
        })
    }

    /// The context is server state: it cannot be copied.
    fn fork(&self) -> Option<Box<dyn Session>> {
        None
    }
}

// ----- registry glue (`super::registry`)

use trellis_dsl::lang::{ArgSpec, Capabilities, EndpointKind, NodeSpec, ProtocolSpec, ValueType};

/// `protocol="a2a"`.
pub const SPEC: ProtocolSpec = ProtocolSpec {
    name: "a2a",
    help: "Agent2Agent: the agent card, then JSON-RPC `message/send` or `message/stream` on a server-side context",
    endpoints: &[EndpointKind::Url, EndpointKind::Builtin],
    settings: &[NodeSpec::setting(
        "stream",
        &[ArgSpec::value(ValueType::Boolean)],
        "`message/stream` (`#true`) or `message/send` (`#false`) whatever the card says",
    )],
    capabilities: Capabilities {
        streams: true,
        measures_ttft: true,
        session_bound: true,
        ..super::connexity::NO_CAPABILITIES
    },
    builtins: &["travel"],

    check: None,
};

/// The settings of an `a2a` agent (the card says the rest).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct A2aSettings {
    /// `stream`: `message/stream` (`#true`) or `message/send` (`#false`) whatever the card's
    /// `capabilities.streaming` says; `None` follows the card.
    pub stream: Option<bool>,
}

impl super::registry::PlannedSettings for A2aSettings {
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
        Ok(super::registry::decoded::<A2aSettings>(agent))
    }

    fn build(
        &self,
        setup: &super::AgentSetup<'_>,
    ) -> Result<Arc<dyn AgentProtocol>, super::registry::BuildError> {
        let settings = super::registry::settings::<A2aSettings>(setup)?;
        Ok(Arc::new(A2aClient::new(
            setup.url,
            setup.headers.clone(),
            setup.limits,
            setup.retry,
            settings.clone(),
            setup.transport.clone(),
        )?))
    }

    /// Whether an A2A agent streams is for its card to say, at run time.
    fn untimed(&self, _agent: &trellis_dsl::Agent) -> Option<String> {
        None
    }
}

/// A card path the server does not serve (404, 410, or 405 where GET is not routed).
fn not_there(fault: &Fault) -> bool {
    matches!(
        crate::transport::http::status_of(fault),
        Some(404 | 405 | 410)
    )
}
