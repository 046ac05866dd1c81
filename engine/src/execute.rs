//! Execution: runs a [`Plan`] concurrently and streams [`Event`]s as work finishes.
//!
//! Each unit (scenario × agent × repetition) walks its execution tree: a node's steps run
//! in order on one conversation; at a fork the conversation is copied and every child
//! continues concurrently, so a shared prefix calls the agent once per repetition. Limits
//! apply at two levels: `--jobs` bounds agent calls in flight across the run, and each
//! agent's `concurrency` bounds calls to that agent. A fault ends the trajectories below
//! the node where it happened and nothing else. Scenarios wait for the scenarios they
//! `need` and are skipped, with the reason, when one of those failed.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use trellis_dsl::{CaptureSource, Endpoint, Outcome};

use crate::builtin::{self, BuiltinServer};
use crate::criteria::{self, Scope};
use crate::event::{Event, EventSender};
use crate::plan::{ExecNode, Plan, PlannedScenario, PlannedStep};
use crate::protocol::connexity::ConnexityClient;
use crate::protocol::http::{CallLimits, HttpTransport};
use crate::protocol::{CallContext, ChatMessage};
use crate::record::{
    CriterionRecord, CriterionStatus, Fault, FaultCategory, NodeRecord, RunInfo, RunSummary,
    TrajectoryRecord, TrajectoryStatus, TurnRecord,
};
use crate::render::ScenarioScope;

/// Upper bound of `--jobs`: far beyond what one process can keep in flight, and well inside
/// what a tokio semaphore can count.
pub const MAX_JOBS: usize = 1 << 20;

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub run_id: String,
    /// Agent calls in flight across the whole run.
    pub jobs: usize,
    /// Cancelled to stop the run gracefully (Ctrl-C, SIGTERM): no new agent call starts,
    /// calls in flight finish, and [`run`] returns once they have. Trajectories that had
    /// not finished are not recorded.
    pub stop: CancellationToken,
    /// A skipped check or a skipped trajectory makes the trajectory failed (`--strict`).
    pub strict: bool,
}

/// Runs the plan to completion, sending every event to `events`. Never fails because of an
/// agent: agent problems become faults in the records.
pub async fn run(plan: Plan, options: RunOptions, events: EventSender) -> RunSummary {
    let started = Instant::now();
    let started_at = rfc3339(SystemTime::now());
    let plan = Arc::new(plan);
    let _ = events
        .send(Event::RunStarted(RunInfo {
            run_id: options.run_id.clone(),
            started_at,
            trellis_version: env!("CARGO_PKG_VERSION").to_string(),
            suites: plan.suites.clone(),
            jobs: options.jobs,
            planned_trajectories: plan.trajectory_count(),
        }))
        .await;

    let (agents, _servers) = start_agents(&plan).await;
    let jobs = options.jobs.clamp(1, MAX_JOBS);
    let shared = Arc::new(Shared {
        plan: plan.clone(),
        agents,
        calls: Arc::new(Semaphore::new(jobs)),
        // Units hold little while waiting for a call permit; allowing a few per job keeps
        // the call pipeline full at forks without letting a huge `repeat` spawn everything.
        units: Arc::new(Semaphore::new(unit_capacity(jobs) as usize)),
        units_capacity: unit_capacity(jobs),
        paths: Semaphore::new(jobs.saturating_mul(2)),
        events: events.clone(),
        run_start: started,
        totals: Totals::default(),
        stop: options.stop.clone(),
    });

    let (senders, receivers): (Vec<_>, Vec<_>) = plan
        .scenarios
        .iter()
        .map(|_| watch::channel(None::<bool>))
        .unzip();
    let mut scenario_tasks = JoinSet::new();
    for (index, done) in senders.into_iter().enumerate() {
        let needs: Vec<(usize, watch::Receiver<Option<bool>>)> = plan.scenarios[index]
            .needs
            .iter()
            .map(|&n| (n, receivers[n].clone()))
            .collect();
        let shared = shared.clone();
        scenario_tasks.spawn(async move {
            let ok = run_scenario(&shared, index, needs).await;
            let _ = done.send(Some(ok));
        });
    }
    while scenario_tasks.join_next().await.is_some() {}

    let t = &shared.totals;
    let summary = RunSummary {
        run_id: options.run_id,
        finished_at: rfc3339(SystemTime::now()),
        duration_ms: ms(started.elapsed()),
        trajectories: t.trajectories.load(Ordering::Relaxed),
        passed: t.passed.load(Ordering::Relaxed),
        failed: t.failed.load(Ordering::Relaxed),
        errors: t.errors.load(Ordering::Relaxed),
        skipped: t.skipped.load(Ordering::Relaxed),
        turns: t.turns.load(Ordering::Relaxed),
    };
    let _ = events.send(Event::RunFinished(summary.clone())).await;
    summary
}

/// Permits of [`Shared::units`]: two trajectories in flight per job keep every call slot
/// busy while the next turn is prepared.
fn unit_capacity(jobs: usize) -> u32 {
    u32::try_from(jobs.saturating_mul(2)).unwrap_or(u32::MAX)
}

struct Shared {
    plan: Arc<Plan>,
    agents: Vec<AgentRuntime>,
    calls: Arc<Semaphore>,
    /// Trajectories in flight, counted per unit: a unit takes as many permits as it has
    /// trajectories (up to all of them), so a scenario that forks into hundreds of branches
    /// runs few units at once while a linear one runs many.
    units: Arc<Semaphore>,
    units_capacity: u32,
    /// Execution nodes running their steps at once. A node copies its parent's conversation
    /// only once it holds a slot, so a wide fork waits as one shared copy instead of one
    /// copy per branch.
    paths: Semaphore,
    events: EventSender,
    run_start: Instant,
    totals: Totals,
    stop: CancellationToken,
}

#[derive(Default)]
struct Totals {
    trajectories: AtomicU64,
    passed: AtomicU64,
    failed: AtomicU64,
    errors: AtomicU64,
    skipped: AtomicU64,
    turns: AtomicU64,
}

enum AgentRuntime {
    Ready {
        client: Box<ConnexityClient>,
        limit: Option<Arc<Semaphore>>,
    },
    /// The agent's trajectories are recorded as skipped with this reason.
    Unsupported(String),
    /// The agent could not be set up; its trajectories end with this fault.
    Broken(Fault),
}

/// Starts builtin agents and builds a client per agent. Problems become per-agent faults so
/// the other agents still run.
async fn start_agents(plan: &Plan) -> (Vec<AgentRuntime>, Vec<BuiltinServer>) {
    let mut servers = Vec::new();
    let mut runtimes = Vec::new();
    let transport = HttpTransport::new();
    let header_scope = ScenarioScope::env_only().with_vars(&BTreeMap::new());
    for agent in &plan.agents {
        if let Some(reason) = &agent.unsupported {
            runtimes.push(AgentRuntime::Unsupported(reason.clone()));
            continue;
        }
        let url = match &agent.endpoint {
            Endpoint::Url(url) => url.clone(),
            Endpoint::Builtin(name) => match builtin::serve(&name.value).await {
                Ok(server) => {
                    let url = server.url();
                    servers.push(server);
                    url
                }
                Err(e) => {
                    runtimes.push(AgentRuntime::Broken(Fault::new(
                        FaultCategory::Setup,
                        format!("builtin agent `{}` did not start: {e}", name.value),
                    )));
                    continue;
                }
            },
            Endpoint::Command(_) | Endpoint::Socket(_) => {
                runtimes.push(AgentRuntime::Unsupported(format!(
                    "agent `{}`: command and socket endpoints are not supported yet",
                    agent.id
                )));
                continue;
            }
        };
        let mut headers = Vec::new();
        let mut broken = None;
        for (name, template) in &agent.headers {
            match plan.templates.render(template, || header_scope.clone()) {
                Ok(value) => headers.push((name.clone(), value)),
                Err(e) => {
                    broken = Some(Fault::new(
                        FaultCategory::Setup,
                        format!("agent `{}` header `{name}`: {e}", agent.id),
                    ));
                    break;
                }
            }
        }
        if let Some(fault) = broken {
            runtimes.push(AgentRuntime::Broken(fault));
            continue;
        }
        let limits = CallLimits {
            timeout: agent.timeout,
            max_response_size: agent.max_response_size,
        };
        match ConnexityClient::new(&url, headers, limits, agent.retries, transport.clone()) {
            Ok(client) => runtimes.push(AgentRuntime::Ready {
                client: Box::new(client),
                limit: agent
                    .concurrency
                    .map(|n| Arc::new(Semaphore::new(n.max(1)))),
            }),
            Err(e) => runtimes.push(AgentRuntime::Broken(Fault::new(
                FaultCategory::Setup,
                format!("agent `{}`: {e}", agent.id),
            ))),
        }
    }
    (runtimes, servers)
}

/// Runs every unit of one scenario; returns whether all its trajectories passed.
async fn run_scenario(
    shared: &Arc<Shared>,
    index: usize,
    needs: Vec<(usize, watch::Receiver<Option<bool>>)>,
) -> bool {
    let planned = &shared.plan.scenarios[index];
    let mut failed_needs = Vec::new();
    for (need, mut rx) in needs {
        let ok = match rx.wait_for(Option::is_some).await {
            Ok(v) => v.unwrap_or(false),
            Err(_) => false,
        };
        if !ok {
            failed_needs.push(shared.plan.scenarios[need].scenario.id.value.clone());
        }
    }
    if !failed_needs.is_empty() {
        let reason = format!(
            "needs {}, which did not pass",
            failed_needs
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for &agent in &planned.agents {
            for repetition in 0..planned.repeat {
                for t in 0..planned.trajectories.len() {
                    skip_trajectory(shared, planned, agent, repetition, t, &reason).await;
                }
            }
        }
        // A skipped scenario does not satisfy the scenarios that need it.
        return false;
    }

    let weight = u32::try_from(planned.trajectories.len())
        .unwrap_or(u32::MAX)
        .clamp(1, shared.units_capacity);
    let mut units = JoinSet::new();
    let mut all_ok = true;
    for &agent in &planned.agents {
        for repetition in 0..planned.repeat {
            let permit = tokio::select! {
                permit = shared.units.clone().acquire_many_owned(weight) => permit,
                () = shared.stop.cancelled() => break,
            };
            let Ok(permit) = permit else {
                break;
            };
            while let Some(done) = units.try_join_next() {
                all_ok &= done.unwrap_or(false);
            }
            let shared = shared.clone();
            units.spawn(async move {
                let ok = run_unit(&shared, index, agent, repetition).await;
                drop(permit);
                ok
            });
        }
    }
    while let Some(done) = units.join_next().await {
        all_ok &= done.unwrap_or(false);
    }
    all_ok
}

/// What one path of the conversation has accumulated so far; copied at forks.
#[derive(Clone)]
struct PathState {
    history: Vec<ChatMessage>,
    vars: BTreeMap<String, String>,
    turns: Vec<Arc<TurnRecord>>,
    criteria: Vec<CriterionRecord>,
    nodes: Vec<Arc<str>>,
    /// Time this path's own steps took (agent calls with their retries), excluding waits
    /// for a `--jobs` or `concurrency` slot: what the scenario's `timeout` budgets.
    active: Duration,
}

/// Why a path stopped before its last step.
#[derive(Clone)]
enum Stop {
    Fault(Fault),
    Failed(CriterionRecord),
    /// The run is stopping: nothing below this node is recorded.
    Interrupted,
}

struct Unit<'a> {
    shared: &'a Arc<Shared>,
    scenario: &'a PlannedScenario,
    agent: usize,
    repetition: u32,
    /// Which trajectories have been recorded, so a panic can record the rest.
    recorded: std::sync::Mutex<Vec<bool>>,
}

/// Runs one unit; returns whether every one of its trajectories passed (a skipped
/// trajectory did not pass: it cannot satisfy a `needs`).
async fn run_unit(
    shared: &Arc<Shared>,
    scenario_index: usize,
    agent: usize,
    repetition: u32,
) -> bool {
    let scenario = &shared.plan.scenarios[scenario_index];
    let unit = Unit::new(shared, scenario_index, agent, repetition);
    match &shared.agents[agent] {
        AgentRuntime::Unsupported(reason) => {
            for t in 0..scenario.trajectories.len() {
                unit.skip(t, reason).await;
            }
            return false;
        }
        AgentRuntime::Broken(fault) => {
            for t in 0..scenario.trajectories.len() {
                let state = PathState::empty();
                unit.finish_trajectory(t, &state, Some(Stop::Fault(fault.clone())))
                    .await;
            }
            return false;
        }
        AgentRuntime::Ready { .. } => {}
    }
    let mut all_supported = true;
    for (t, trajectory) in scenario.trajectories.iter().enumerate() {
        if let Some(reason) = &trajectory.unsupported {
            unit.skip(t, reason).await;
            all_supported = false;
        }
    }
    let walk = AssertUnwindSafe(unit.run_node(scenario.root(), Arc::new(PathState::empty())));
    match walk.catch_unwind().await {
        Ok(passed) => passed && all_supported,
        Err(panic) => {
            // A bug in trellis must not lose the unit silently: every trajectory it had not
            // recorded yet is recorded as an error saying what happened.
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            let fault = Fault::new(
                FaultCategory::Internal,
                format!("trellis failed while running this trajectory (a bug): {message}"),
            );
            for t in 0..scenario.trajectories.len() {
                if !unit.is_recorded(t) {
                    let state = PathState::empty();
                    unit.finish_trajectory(t, &state, Some(Stop::Fault(fault.clone())))
                        .await;
                }
            }
            false
        }
    }
}

impl PathState {
    fn empty() -> Self {
        PathState {
            history: Vec::new(),
            vars: BTreeMap::new(),
            turns: Vec::new(),
            criteria: Vec::new(),
            nodes: Vec::new(),
            active: Duration::ZERO,
        }
    }
}

impl<'a> Unit<'a> {
    fn new(shared: &'a Arc<Shared>, scenario_index: usize, agent: usize, repetition: u32) -> Self {
        let scenario = &shared.plan.scenarios[scenario_index];
        Unit {
            shared,
            scenario,
            agent,
            repetition,
            recorded: std::sync::Mutex::new(vec![false; scenario.trajectories.len()]),
        }
    }

    fn mark_recorded(&self, t: usize) {
        if let Ok(mut recorded) = self.recorded.lock()
            && let Some(slot) = recorded.get_mut(t)
        {
            *slot = true;
        }
    }

    fn is_recorded(&self, t: usize) -> bool {
        self.recorded
            .lock()
            .map(|r| r.get(t).copied().unwrap_or(true))
            .unwrap_or(true)
    }

    /// Runs one execution node and, concurrently, everything below it. Returns whether every
    /// trajectory through it passed.
    fn run_node(
        &'a self,
        index: usize,
        parent: Arc<PathState>,
    ) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            let node: &ExecNode = &self.scenario.nodes[index];
            let runnable = node
                .trajectories
                .iter()
                .any(|&t| self.scenario.trajectories[t].unsupported.is_none());
            if !runnable {
                // Its trajectories were recorded as skipped: they did not pass.
                return false;
            }
            let slot = self.shared.paths.acquire().await.ok();
            // Boxed only now: a node's running state (request and response futures included)
            // is large, and a wide fork has many children waiting for a slot.
            Box::pin(self.execute_node(node, parent, slot)).await
        })
    }

    /// Runs a node's steps while holding a path slot, records them, then runs its children.
    async fn execute_node(
        &'a self,
        node: &'a ExecNode,
        parent: Arc<PathState>,
        slot: Option<tokio::sync::SemaphorePermit<'a>>,
    ) -> bool {
        // The last branch to start takes the parent's conversation without copying it.
        let mut state = Arc::unwrap_or_clone(parent);
        state.nodes.push(node.id.clone());
        let first_turn = state.turns.len();
        let stop = self.run_steps(node, &mut state).await;
        drop(slot);
        let _ = self
            .shared
            .events
            .send(Event::Node(NodeRecord {
                suite: self.scenario.suite.to_string(),
                scenario: self.scenario.scenario.id.value.clone(),
                agent: self.agent_id().to_string(),
                repetition: self.repetition,
                node: node.id.to_string(),
                parent: node.parent.map(|p| self.scenario.nodes[p].id.to_string()),
                turns: state.turns[first_turn..]
                    .iter()
                    .map(|t| TurnRecord::clone(t))
                    .collect(),
            }))
            .await;

        if let Some(Stop::Interrupted) = stop {
            return false;
        }
        if let Some(stop) = stop {
            // Every trajectory below this node ends here.
            for &t in &node.trajectories {
                if self.scenario.trajectories[t].unsupported.is_none() {
                    self.finish_trajectory(t, &state, Some(stop.clone())).await;
                }
            }
            return false;
        }
        if let Some(t) = node.ends {
            return self.finish_trajectory(t, &state, None).await;
        }
        let state = Arc::new(state);
        let children: Vec<_> = node
            .children
            .iter()
            .map(|&child| self.run_node(child, state.clone()))
            .collect();
        drop(state);
        // Every child has finished once join_all returns; `all` only reads results.
        futures::future::join_all(children)
            .await
            .into_iter()
            .all(|ok| ok)
    }

    async fn run_steps(&self, node: &ExecNode, state: &mut PathState) -> Option<Stop> {
        let sc = &self.scenario.scenario;
        for step in &node.steps {
            match step {
                PlannedStep::User(template) => {
                    if let Some(max) = sc.max_turns
                        && state.turns.len() as u64 >= u64::from(max)
                    {
                        return Some(Stop::Failed(CriterionRecord {
                            turn_index: None,
                            criterion: format!("max-turns {max}"),
                            kind: "max-turns".into(),
                            status: CriterionStatus::Failed,
                            detail: Some(format!(
                                "the trajectory reached max-turns ({max}) with scripted steps left"
                            )),
                        }));
                    }
                    let scope = &self.scenario.scope;
                    let vars = &state.vars;
                    let message = match self
                        .shared
                        .plan
                        .templates
                        .render(template, || scope.with_vars(vars))
                    {
                        Ok(m) => m,
                        Err(e) => {
                            return Some(Stop::Fault(Fault::new(
                                FaultCategory::Template,
                                format!("user message: {e}"),
                            )));
                        }
                    };
                    let Some(turn) = self.take_turn(message, state).await else {
                        return Some(Stop::Interrupted);
                    };
                    let fault = turn.fault.clone();
                    state.turns.push(Arc::new(turn));
                    self.shared.totals.turns.fetch_add(1, Ordering::Relaxed);
                    if let Some(fault) = fault {
                        return Some(Stop::Fault(fault));
                    }
                }
                PlannedStep::Expect(checks) => {
                    let turn_index = state.turns.last().map(|t| t.turn_index);
                    for c in checks {
                        let record = match turn_index {
                            Some(_) => criteria::check(c, Scope::Turn, &state.turns, turn_index),
                            // Validation rejects this; a plan built another way still must
                            // not pass a check that looked at nothing.
                            None => CriterionRecord {
                                turn_index: None,
                                criterion: c.text.clone(),
                                kind: c.kind.name().to_string(),
                                status: CriterionStatus::Failed,
                                detail: Some("no agent turn before this `expect`".into()),
                            },
                        };
                        state.criteria.push(record);
                    }
                }
                PlannedStep::Capture { name, source } => {
                    let reply = state
                        .turns
                        .last()
                        .and_then(|t| t.reply.as_deref())
                        .unwrap_or("");
                    match capture(source, reply) {
                        Ok(value) => {
                            state.vars.insert(name.clone(), value);
                        }
                        Err(why) => {
                            return Some(Stop::Failed(CriterionRecord {
                                turn_index: state.turns.last().map(|t| t.turn_index),
                                criterion: format!("capture {name}"),
                                kind: "capture".into(),
                                status: CriterionStatus::Failed,
                                detail: Some(why),
                            }));
                        }
                    }
                }
                PlannedStep::Hitl => {}
            }
        }
        None
    }

    async fn take_turn(&self, message: String, state: &mut PathState) -> Option<TurnRecord> {
        if self.shared.stop.is_cancelled() {
            return None;
        }
        let turn_index = u32::try_from(state.turns.len()).unwrap_or(u32::MAX);
        state.history.push(ChatMessage::user(message.clone()));
        let AgentRuntime::Ready { client, limit } = &self.shared.agents[self.agent] else {
            // run_unit only walks nodes for ready agents.
            return Some(TurnRecord {
                turn_index,
                user_message: message,
                fault: Some(Fault::new(FaultCategory::Setup, "agent is not available")),
                ..Default::default()
            });
        };
        let stop = &self.shared.stop;
        let _agent_permit = match limit {
            Some(s) => tokio::select! {
                p = s.acquire() => p.ok(),
                () = stop.cancelled() => return None,
            },
            None => None,
        };
        let _call_permit = tokio::select! {
            p = self.shared.calls.acquire() => p.ok(),
            () = stop.cancelled() => return None,
        };
        let started = Instant::now();
        let started_ms = ms(started.duration_since(self.shared.run_start));
        // The trajectory's budget counts only its own steps, so how long it waited behind
        // sibling branches for a slot never decides whether it timed out.
        let deadline =
            self.scenario.scenario.timeout.and_then(|t| {
                tokio::time::Instant::now().checked_add(t.saturating_sub(state.active))
            });
        let ctx = CallContext {
            test_case_id: &self.scenario.scenario.id.value,
            turn_index: u32::try_from(state.history.len() - 1).unwrap_or(u32::MAX),
            deadline,
        };
        let outcome = client.respond(&state.history, &ctx).await;
        state.active += started.elapsed();
        let mut record = TurnRecord {
            turn_index,
            user_message: message,
            started_ms,
            latency_ms: ms(outcome.latency),
            attempts: outcome.attempts,
            ..Default::default()
        };
        match outcome.result {
            Ok(turn) => {
                // Connexity resends history: the agent's final reply is what the next
                // request carries; tool steps stay on the agent's side.
                state.history.push(ChatMessage::assistant(
                    turn.reply.clone().unwrap_or_default(),
                ));
                let usage = turn.usage.unwrap_or_default();
                record.reply = turn.reply;
                record.tool_calls = turn.tool_calls;
                record.messages = turn.messages;
                record.ttft_ms = turn.ttft.map(ms);
                record.prompt_tokens = usage.prompt_tokens;
                record.completion_tokens = usage.completion_tokens;
                record.total_tokens =
                    usage
                        .total_tokens
                        .or(match (usage.prompt_tokens, usage.completion_tokens) {
                            (Some(p), Some(c)) => Some(p.saturating_add(c)),
                            _ => None,
                        });
                record.model = turn.model;
                record.provider = turn.provider;
            }
            Err(fault) => record.fault = Some(fault),
        }
        Some(record)
    }

    async fn finish_trajectory(&self, t: usize, state: &PathState, stop: Option<Stop>) -> bool {
        let sc = &self.scenario.scenario;
        let mut criteria = state.criteria.clone();
        let mut fault = None;
        // Why the trajectory-level checks were not run, when it stopped early.
        let not_checked = match stop {
            Some(Stop::Fault(f)) => {
                let why = format!(
                    "not checked: the trajectory ended with a {} fault",
                    f.category.as_str()
                );
                fault = Some(f);
                Some(why)
            }
            Some(Stop::Failed(c)) => {
                let why = format!("not checked: the trajectory stopped at `{}`", c.criterion);
                criteria.push(c);
                Some(why)
            }
            Some(Stop::Interrupted) => Some("not checked: the run was stopped".to_string()),
            None => None,
        };
        for c in sc.criteria.iter().chain(&sc.expect_tools) {
            criteria.push(match &not_checked {
                None => criteria::check(c, Scope::Trajectory, &state.turns, None),
                // Recorded anyway, so every trajectory lists the same checks and a
                // criterion's pass rate counts the trajectories that never got to it.
                Some(why) => CriterionRecord {
                    turn_index: None,
                    criterion: c.text.clone(),
                    kind: c.kind.name().to_string(),
                    status: CriterionStatus::Skipped,
                    detail: Some(why.clone()),
                },
            });
        }
        for outcome in &sc.outcomes {
            criteria.push(CriterionRecord {
                turn_index: None,
                criterion: outcome_text(&outcome.value),
                kind: "outcome".into(),
                status: CriterionStatus::Skipped,
                detail: Some(
                    not_checked
                        .clone()
                        .unwrap_or_else(|| "no judge configured".into()),
                ),
            });
        }
        let failed = criteria.iter().any(|c| c.status == CriterionStatus::Failed);
        let status = if fault.is_some() {
            TrajectoryStatus::Error
        } else if failed {
            TrajectoryStatus::Failed
        } else {
            TrajectoryStatus::Passed
        };
        let record = TrajectoryRecord {
            suite: self.scenario.suite.to_string(),
            scenario: sc.id.value.clone(),
            trajectory: self.scenario.trajectories[t].name.clone(),
            agent: self.agent_id().to_string(),
            protocol: self.shared.plan.agents[self.agent]
                .protocol
                .as_str()
                .to_string(),
            repetition: self.repetition,
            nodes: state.nodes.iter().map(|n| n.to_string()).collect(),
            status,
            turns: u32::try_from(state.turns.len()).unwrap_or(u32::MAX),
            duration_ms: ms(state.active),
            fault,
            skip_reason: None,
            criteria,
            tags: self.scenario.tags.clone(),
        };
        self.mark_recorded(t);
        self.shared.record(record).await;
        status == TrajectoryStatus::Passed
    }

    async fn skip(&self, t: usize, reason: &str) {
        self.mark_recorded(t);
        skip_trajectory(
            self.shared,
            self.scenario,
            self.agent,
            self.repetition,
            t,
            reason,
        )
        .await;
    }

    fn agent_id(&self) -> &str {
        &self.shared.plan.agents[self.agent].id
    }
}

impl Shared {
    async fn record(&self, record: TrajectoryRecord) {
        let t = &self.totals;
        t.trajectories.fetch_add(1, Ordering::Relaxed);
        match record.status {
            TrajectoryStatus::Passed => &t.passed,
            TrajectoryStatus::Failed => &t.failed,
            TrajectoryStatus::Error => &t.errors,
            TrajectoryStatus::Skipped => &t.skipped,
        }
        .fetch_add(1, Ordering::Relaxed);
        let _ = self.events.send(Event::Trajectory(record)).await;
    }
}

async fn skip_trajectory(
    shared: &Arc<Shared>,
    scenario: &PlannedScenario,
    agent: usize,
    repetition: u32,
    t: usize,
    reason: &str,
) {
    let record = TrajectoryRecord {
        suite: scenario.suite.to_string(),
        scenario: scenario.scenario.id.value.clone(),
        trajectory: scenario.trajectories[t].name.clone(),
        agent: shared.plan.agents[agent].id.to_string(),
        protocol: shared.plan.agents[agent].protocol.as_str().to_string(),
        repetition,
        nodes: Vec::new(),
        status: TrajectoryStatus::Skipped,
        turns: 0,
        duration_ms: 0.0,
        fault: None,
        skip_reason: Some(reason.to_string()),
        criteria: Vec::new(),
        tags: scenario.tags.clone(),
    };
    shared.record(record).await;
}

/// Extracts a capture from the last reply.
fn capture(source: &CaptureSource, reply: &str) -> Result<String, String> {
    match source {
        CaptureSource::Regex(re) => {
            let caps = re.captures(reply).ok_or_else(|| {
                format!(
                    "/{}/ did not match the last reply: {:?}",
                    re.as_str(),
                    reply.chars().take(160).collect::<String>()
                )
            })?;
            let m = caps.get(1).or_else(|| caps.get(0));
            Ok(m.map(|m| m.as_str().to_string()).unwrap_or_default())
        }
        CaptureSource::JsonPath { path, source } => {
            let value: serde_json::Value = serde_json::from_str(reply)
                .map_err(|e| format!("json-path {source}: the last reply is not JSON ({e})"))?;
            let found = path.query(&value);
            let first = found
                .first()
                .ok_or_else(|| format!("json-path {source} found nothing in the last reply"))?;
            Ok(match first {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
        }
    }
}

fn outcome_text(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Statement(s) => format!("outcome {s:?}"),
        Outcome::Labeled { label, value } => format!("outcome {label}={value}"),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// RFC 3339 in UTC, second precision.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}
