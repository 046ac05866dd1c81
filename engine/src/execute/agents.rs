//! Setting agents up for a run: serve builtin agents, render headers, build each agent's
//! protocol client and run its one-time `prepare` step. A problem becomes a fault on that
//! agent's trajectories; the other agents still run.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use trellis_dsl::Endpoint;

use crate::builtin::{self, BuiltinServer};
use crate::event::{Event, EventSender};
use crate::plan::{Plan, PlannedAgent};
use crate::protocol::http::{CallLimits, HttpTransport, RetryPolicy};
use crate::protocol::{self, AgentProtocol, AgentSetup};
use crate::record::{AgentRecord, Fault, FaultCategory};
use crate::render::ScenarioScope;

/// An agent as the executor sees it.
pub(super) enum AgentRuntime {
    Ready {
        client: Arc<dyn AgentProtocol>,
        /// The agent's `concurrency`.
        limit: Option<Arc<Semaphore>>,
    },
    /// The agent's trajectories are recorded as skipped with this reason.
    Unsupported(String),
    /// The agent could not be set up; its trajectories end with this fault.
    Broken(Fault),
}

/// Sets up every agent of the plan, concurrently (one agent's slow handshake does not
/// delay the others). The builtin servers returned must live as long as the run. When the
/// run is stopped during setup, agents not ready yet are recorded as not set up.
pub(super) async fn start(
    plan: &Plan,
    events: &EventSender,
    stop: &CancellationToken,
) -> (Vec<AgentRuntime>, Vec<BuiltinServer>) {
    let transport = HttpTransport::new();
    let setups = plan
        .agents
        .iter()
        .map(|agent| set_up(plan, agent, &transport, events));
    let all = futures::future::join_all(setups);
    let results = tokio::select! {
        results = all => results,
        () = stop.cancelled() => {
            let fault = Fault::new(FaultCategory::Setup, "the run was stopped during agent setup");
            let runtimes = plan
                .agents
                .iter()
                .map(|_| AgentRuntime::Broken(fault.clone()))
                .collect();
            return (runtimes, Vec::new());
        }
    };
    let mut servers = Vec::new();
    let mut runtimes = Vec::with_capacity(results.len());
    for (runtime, server) in results {
        runtimes.push(runtime);
        servers.extend(server);
    }
    (runtimes, servers)
}

async fn set_up(
    plan: &Plan,
    agent: &PlannedAgent,
    transport: &HttpTransport,
    events: &EventSender,
) -> (AgentRuntime, Option<BuiltinServer>) {
    let mut server = None;
    let runtime = match start_one(plan, agent, transport, &mut server).await {
        Ok(client) => match client.prepare().await {
            Ok(info) => {
                if let Some(info) = info {
                    let _ = events
                        .send(Event::Agent(AgentRecord {
                            agent: agent.id.to_string(),
                            protocol: agent.protocol.as_str().to_string(),
                            info,
                        }))
                        .await;
                }
                AgentRuntime::Ready {
                    client,
                    limit: agent
                        .concurrency
                        .map(|n| Arc::new(Semaphore::new(n.max(1)))),
                }
            }
            Err(mut fault) => {
                fault.category = FaultCategory::Setup;
                AgentRuntime::Broken(fault)
            }
        },
        Err(Setup::Unsupported(reason)) => AgentRuntime::Unsupported(reason),
        Err(Setup::Broken(fault)) => AgentRuntime::Broken(fault),
    };
    (runtime, server)
}

enum Setup {
    Unsupported(String),
    Broken(Fault),
}

async fn start_one(
    plan: &Plan,
    agent: &PlannedAgent,
    transport: &HttpTransport,
    server: &mut Option<BuiltinServer>,
) -> Result<Arc<dyn AgentProtocol>, Setup> {
    if let Some(reason) = &agent.unsupported {
        return Err(Setup::Unsupported(reason.clone()));
    }
    let url = match &agent.endpoint {
        Endpoint::Url(url) => url.clone(),
        Endpoint::Builtin(name) => match builtin::serve(&name.value).await {
            Ok(started) => {
                let url = started.url();
                *server = Some(started);
                url
            }
            Err(e) => {
                return Err(Setup::Broken(Fault::new(
                    FaultCategory::Setup,
                    format!("builtin agent `{}` did not start: {e}", name.value),
                )));
            }
        },
        Endpoint::Command(_) | Endpoint::Socket(_) => {
            return Err(Setup::Unsupported(format!(
                "agent `{}`: command and socket endpoints are not supported yet",
                agent.id
            )));
        }
    };
    // Headers see only `env`: they are rendered once per run, not per scenario.
    let header_scope = ScenarioScope::env_only(plan.templates.env()).with_vars(&BTreeMap::new());
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
    transport.warm(&url);
    protocol::build(AgentSetup {
        agent,
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
        transport: transport.clone(),
    })
    .map_err(Setup::Broken)
}
