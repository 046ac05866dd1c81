//! Setting agents up for a run: start builtin agents through the run's launcher, render headers, build each agent's
//! protocol client and run its one-time `prepare` step, when the agent is first needed. A
//! problem becomes a fault on that agent's trajectories; the other agents still run.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OnceCell, Semaphore};
use trellis_dsl::Endpoint;

use super::launch::{BuiltinEndpoint, LaunchError, LaunchRequest, Launcher};
use crate::event::{Event, EventSender};
use crate::plan::{Plan, PlannedAgent};
use crate::protocol::{self, AgentProtocol, AgentSetup};
use crate::record::{AgentRecord, Fault, FaultCategory};
use crate::render::ScenarioScope;
use crate::transport::http::{CallLimits, HttpTransport, RetryPolicy};

/// An agent as the executor sees it.
pub(super) enum AgentRuntime {
    Ready {
        client: Arc<dyn AgentProtocol>,
        /// The agent's `concurrency`.
        limit: Option<Arc<Semaphore>>,
        /// `provider=` on an agent that runs its own model on that provider's server
        /// (connexity, agentscope, multiagent): each turn holds one of its slots.
        model_server: Option<Arc<crate::llm::ProviderClient>>,
    },
    /// The agent's trajectories are recorded as skipped with this reason.
    Unsupported(String),
    /// The agent could not be set up; its trajectories end with this fault.
    Broken(Fault),
}

/// Every agent of the plan, each set up when its first unit needs it: a slow or dead
/// agent (a Fixie handshake waiting out its timeout) holds up its own trajectories only,
/// never the other agents' (setting all of them up before the run made every trajectory
/// wait for the slowest).
pub(super) struct Agents {
    slots: Vec<OnceCell<AgentRuntime>>,
    transport: HttpTransport,
    /// Starts builtin agents; `None` when the run was given none.
    launcher: Option<Arc<dyn Launcher>>,
    /// What keeps the builtin agents started so far running; dropped with the run.
    servers: Mutex<Vec<Box<dyn std::any::Any + Send + Sync>>>,
    /// The run's providers: a model under test reached through `provider=` shares its
    /// client (endpoint, key, limits) with the judges and the simulator.
    llm: Arc<crate::llm::LlmRuntime>,
    /// What an agent's handshake may echo of its headers.
    secrets: crate::secrets::Secrets,
    /// The run's OTLP receiver, handed to builtin agents so they can send their spans.
    otlp_endpoint: Option<String>,
}

impl Agents {
    pub(super) fn new(
        plan: &Plan,
        transport: HttpTransport,
        llm: Arc<crate::llm::LlmRuntime>,
        launcher: Option<Arc<dyn Launcher>>,
        otlp_endpoint: Option<String>,
    ) -> Self {
        Agents {
            slots: plan.agents.iter().map(|_| OnceCell::new()).collect(),
            transport,
            launcher,
            servers: Mutex::new(Vec::new()),
            llm,
            secrets: crate::secrets::Secrets::of_plan(plan),
            otlp_endpoint,
        }
    }

    /// Agent `index` of the plan, set up on the first call (once, however many units ask
    /// at the same time).
    pub(super) async fn get(
        &self,
        plan: &Plan,
        index: usize,
        events: &EventSender,
    ) -> &AgentRuntime {
        self.slots[index]
            .get_or_init(|| self.set_up(plan, &plan.agents[index], events))
            .await
    }

    /// Ends what the agents' clients keep running (long-lived processes, kept-open
    /// sockets) and waits for them.
    pub(super) async fn close(&self) {
        let clients = self.slots.iter().filter_map(|slot| match slot.get() {
            Some(AgentRuntime::Ready { client, .. }) => Some(client.close()),
            _ => None,
        });
        futures::future::join_all(clients).await;
    }

    /// Agent `index` if it has been set up.
    pub(super) fn ready(&self, index: usize) -> Option<&AgentRuntime> {
        self.slots.get(index).and_then(OnceCell::get)
    }

    async fn set_up(
        &self,
        plan: &Plan,
        agent: &PlannedAgent,
        events: &EventSender,
    ) -> AgentRuntime {
        let capabilities = agent.protocol.capabilities();
        let runs_own_model = !capabilities.model_api && !capabilities.provider_plays_llm;
        let model_server = match agent.provider.as_deref().filter(|_| runs_own_model) {
            None => None,
            Some(id) => match self.llm.client(id) {
                Ok(client) => Some(client),
                Err(why) => {
                    return AgentRuntime::Broken(Fault::new(
                        FaultCategory::Setup,
                        format!("agent `{}`: {why}", agent.id),
                    ));
                }
            },
        };
        match start_one(
            plan,
            agent,
            &self.transport,
            self.launcher.as_deref(),
            self.otlp_endpoint.as_deref(),
            &self.servers,
            &self.llm,
        )
        .await
        {
            Ok(client) => match client.prepare().await {
                Ok(info) => {
                    if let Some(info) = info {
                        let record = Event::Agent(AgentRecord {
                            agent: agent.id.to_string(),
                            protocol: agent.protocol.as_str().to_string(),
                            info,
                        });
                        let _ = events.send(self.secrets.redact_event(record)).await;
                    }
                    AgentRuntime::Ready {
                        client,
                        limit: agent
                            .concurrency
                            .map(|n| Arc::new(Semaphore::new(n.max(1)))),
                        model_server,
                    }
                }
                Err(mut fault) => {
                    fault.category = FaultCategory::Setup;
                    AgentRuntime::Broken(fault)
                }
            },
            Err(Setup::Unsupported(reason)) => AgentRuntime::Unsupported(reason),
            Err(Setup::Broken(fault)) => AgentRuntime::Broken(fault),
        }
    }
}

enum Setup {
    Unsupported(String),
    Broken(Fault),
}

/// The agent's URL as the run reaches it: a template (`{{ env.AGENT_PORT }}`) rendered, and
/// what it rendered to checked as `check` checks a URL written whole.
fn rendered_url(
    plan: &Plan,
    agent: &PlannedAgent,
    url: &trellis_dsl::Template,
    scope: &minijinja::Value,
) -> Result<String, Setup> {
    if !trellis_dsl::template::is_template(&url.source) {
        return Ok(url.source.clone());
    }
    let broken = |why: String| {
        Setup::Broken(Fault::new(
            FaultCategory::Setup,
            format!("agent `{}` url `{}`: {why}", agent.id, url.source),
        ))
    };
    let rendered = plan
        .templates
        .render_source(&url.source, || scope.clone())
        .map_err(|e| broken(e.to_string()))?;
    match trellis_dsl::url_problem(&rendered) {
        Some(why) => Err(broken(format!("renders to `{rendered}`: {why}"))),
        None => Ok(rendered),
    }
}

async fn start_one(
    plan: &Plan,
    agent: &PlannedAgent,
    transport: &HttpTransport,
    launcher: Option<&dyn Launcher>,
    otlp_endpoint: Option<&str>,
    servers: &Mutex<Vec<Box<dyn std::any::Any + Send + Sync>>>,
    llm: &crate::llm::LlmRuntime,
) -> Result<Arc<dyn AgentProtocol>, Setup> {
    if let Some(reason) = &agent.unsupported {
        return Err(Setup::Unsupported(reason.clone()));
    }
    let mut line = None;
    // Headers and the URL see only `env`: they are rendered once per run, not per scenario.
    let header_scope = ScenarioScope::env_only(plan.templates.env()).with_vars(&BTreeMap::new());
    let url = match &agent.endpoint {
        Endpoint::Url(url) => rendered_url(plan, agent, url, &header_scope)?,
        Endpoint::Builtin(name) => {
            // Served the way the agent's `transport` asks (HTTP unless a multiagent agent
            // says otherwise); a process is started by the client itself.
            let (transport, process) = agent.settings.builtin_serving();
            let request = LaunchRequest {
                protocol: agent.protocol.as_str(),
                name: &name.value,
                transport,
                process,
                otlp_endpoint: otlp_endpoint.filter(|_| agent.spans),
            };
            let launched = match launcher {
                Some(launcher) => launcher.launch(request).await,
                None => Err(LaunchError::NoLauncher),
            };
            match launched {
                Ok(served) => {
                    if let Some(guard) = served.guard {
                        servers
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(guard);
                    }
                    match served.endpoint {
                        BuiltinEndpoint::Url(url) => url,
                        BuiltinEndpoint::Socket(address) => {
                            line = Some(protocol::LineTarget::Socket(address));
                            String::new()
                        }
                        BuiltinEndpoint::Command(command) => {
                            line = Some(protocol::LineTarget::Command(command));
                            String::new()
                        }
                    }
                }
                Err(e) => {
                    return Err(Setup::Broken(Fault::new(
                        FaultCategory::Setup,
                        format!("builtin agent `{}` did not start: {e}", name.value),
                    )));
                }
            }
        }
        // Reached through the line transport, or the provider's client: no URL.
        Endpoint::Command(_) | Endpoint::Socket(_) | Endpoint::Provider(_) => String::new(),
    };
    let mut headers = Vec::with_capacity(agent.headers.len());
    for (name, template) in &agent.headers {
        match plan.templates.render(template, || header_scope.clone()) {
            Ok(value) => headers.push((name.clone(), value)),
            Err(e) => {
                return Err(Setup::Broken(Fault::new(
                    FaultCategory::Setup,
                    format!("agent `{}` header `{name}`: {e}", agent.id),
                )));
            }
        }
    }
    let system_prompt = match agent.settings.system_prompt() {
        // Rendered for each turn instead (`execute::turn`).
        Some(_) if agent.system_prompt_per_turn => None,
        Some(template) => match plan.templates.render(template, || header_scope.clone()) {
            Ok(prompt) => Some(prompt),
            Err(e) => {
                return Err(Setup::Broken(Fault::new(
                    FaultCategory::Setup,
                    format!("agent `{}` system-prompt: {e}", agent.id),
                )));
            }
        },
        None => None,
    };
    if !url.is_empty() {
        transport.warm(&url);
    }
    // A model on a plain-http server of its own (`base-url`) queues for that server's slots
    // like the providers on it do.
    // The probe carries the agent's headers: a server started with a key asks for it.
    let server_slots = match (&agent.endpoint, agent.protocol.capabilities().model_api) {
        (Endpoint::Url(_), true) => reqwest::Url::parse(&url).ok().and_then(|u| {
            let probe_headers =
                crate::transport::http::with_agent_headers(Default::default(), &headers)
                    .unwrap_or_default();
            llm.server_slots(&u, &probe_headers)
        }),
        _ => None,
    };
    let provider = match &agent.provider {
        None => None,
        Some(id) => match llm.client(id) {
            Ok(client) => Some(client),
            Err(why) => {
                return Err(Setup::Broken(Fault::new(
                    FaultCategory::Setup,
                    format!("agent `{}`: {why}", agent.id),
                )));
            }
        },
    };
    protocol::build(AgentSetup {
        id: &agent.id,
        protocol: agent.protocol,
        endpoint: &agent.endpoint,
        settings: agent.settings.as_ref(),
        provider_name: agent.provider.as_deref(),
        url: &url,
        headers,
        limits: CallLimits {
            timeout: agent.timeout,
            max_response_size: agent.max_response_size,
        },
        retry: RetryPolicy {
            retries: agent.retries,
            after_send: agent.retry_after_send,
        },
        // A request lost after it was written goes again only where a second sending is
        // harmless: a model API (asking again has no side effect) or an agent that says so.
        transport: transport
            .clone()
            .replaying_lost(agent.retry_after_send || agent.protocol.capabilities().model_api),
        line,
        system_prompt,
        provider,
        server_slots,
    })
    .map_err(Setup::Broken)
}
