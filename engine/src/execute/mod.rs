//! Execution: runs a [`Plan`] concurrently and streams [`Event`]s as work finishes.
//!
//! Split by job: this module schedules scenarios (in `needs` order) and their units
//! (scenario × agent × repetition) within the run's limits; [`agents`] sets each agent up
//! when first needed (builtin agents started through the run's [`Launcher`], headers, the protocol client); [`walk`] walks a
//! unit's execution tree (steps in order, forks copied or replayed as the protocol decides);
//! [`turn`] drives one turn of a session; [`verdict`] checks a finished trajectory and builds
//! its record.
//!
//! Limits apply at two levels: `--jobs` bounds agent calls in flight across the run, and
//! each agent's `concurrency` bounds calls to that agent. A fault ends the trajectories
//! below the node where it happened and nothing else. Scenarios wait for the scenarios they
//! `need` and are skipped, with the reason, when one of those failed.

mod agents;
mod attack;
mod history;
pub mod launch;
pub mod replay_users;
pub mod resume;
mod reuse;
mod turn;
mod verdict;
mod walk;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt;
use tokio::sync::{Semaphore, TryAcquireError, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::event::{Event, EventSender};
use crate::plan::{Plan, PlannedScenario};
use crate::protocol::AgentProtocol;
use crate::record::{
    Fault, FaultCategory, RunInfo, RunSummary, TrajectoryRecord, TrajectoryStatus,
};
use agents::{AgentRuntime, Agents};
use verdict::skip_trajectory;
use walk::Unit;

pub use launch::{BuiltinEndpoint, LaunchError, LaunchRequest, Launched, Launcher};
pub use replay_users::{Replayed, UserReplay};
pub use resume::{Finished, FinishedTotals, Forks, planned_key};
pub use reuse::{ReuseCounts, TurnMemo, unreachable};
/// The status a trajectory gets from its fault and checks (`strict`: a skipped check or
/// trajectory fails), for tools that re-check recorded trajectories (`trellis rejudge`).
pub fn trajectory_status(
    faulted: bool,
    criteria: &[crate::record::CriterionRecord],
    strict: bool,
) -> (TrajectoryStatus, Option<String>) {
    verdict::status_of(faulted, criteria, strict)
}

/// Upper bound of `--jobs`: far beyond what one process can keep in flight, and well inside
/// what a tokio semaphore can count.
pub const MAX_JOBS: usize = 1 << 20;

/// When the grace period of a stop ends ([`RunOptions::grace_end`]); unset, a stop lets
/// calls in flight finish.
#[derive(Clone, Debug)]
pub struct GraceEnd(Arc<watch::Sender<Option<tokio::time::Instant>>>);

impl Default for GraceEnd {
    fn default() -> Self {
        GraceEnd(Arc::new(watch::Sender::new(None)))
    }
}

impl GraceEnd {
    /// The stop about to come drops the calls still in flight at `at`.
    pub fn set(&self, at: tokio::time::Instant) {
        self.0.send_replace(Some(at));
    }
}

impl crate::transport::http::RunStop for Shared {
    fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    fn grace_end(&self) -> &watch::Sender<Option<tokio::time::Instant>> {
        &self.grace_end.0
    }
}

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub run_id: String,
    /// Agent calls in flight across the whole run.
    pub jobs: usize,
    /// Cancelled to stop the run gracefully (Ctrl-C, SIGTERM): no new agent call starts,
    /// calls in flight finish, and the run's task ([`spawn`]) ends once they have.
    /// Trajectories that had not finished are not recorded.
    pub stop: CancellationToken,
    /// Cancelled after `stop` when the calls still in flight are not waited for any longer
    /// (the grace period ran out, or a second signal): they are dropped with their
    /// trajectories, which are not recorded, and the run ends at once with what finished,
    /// its `run_finished` entry included (`interrupted`).
    pub abandon: CancellationToken,
    /// When a stop's grace period ends and `abandon` follows: set before `stop` is
    /// cancelled by a stop that has one (a signal's). A call waiting out a rate limit past
    /// it is dropped at the stop, not at the grace's end.
    pub grace_end: GraceEnd,
    /// `--strict`: a skipped check or a skipped trajectory is a failure.
    pub strict: bool,
    /// Turns recorded by earlier runs to answer from where a conversation repeats one
    /// (`trellis watch`); `None` calls the agent for every turn.
    pub reuse: Option<Arc<TurnMemo>>,
    /// The HTTP connection pool to use; `None` builds one for this run. A watch session
    /// keeps one across reruns (building a client loads the CA bundle).
    pub transport: Option<crate::transport::http::HttpTransport>,
    /// `--llm-cache DIR` / `--llm-cache-mode`: the response cache of judge (and simulator)
    /// calls; [`crate::llm::LlmCache::disabled`] for none.
    pub llm_cache: crate::llm::LlmCache,
    /// Starts the builtin agents (`builtin="…"`) the plan names; `None` makes each of them
    /// a setup fault on its trajectories.
    pub launcher: Option<Arc<dyn Launcher>>,
    /// `trellis run --resume`: the trajectories an earlier attempt of this run finished,
    /// which are neither run nor recorded again ([`resume`]); `None` runs everything.
    pub resume: Option<Arc<Finished>>,
    /// `--max-llm-calls` / `--max-llm-cost`: reaching either stops the run as `stop` does
    /// ([`crate::llm::meter`]); the summary says why (`stopped_by`).
    pub llm_budget: crate::llm::meter::Budget,
    /// OpenTelemetry: the receiver of the agents' spans and how long to wait for them.
    pub telemetry: crate::otel::Telemetry,
    /// `--replay-users RUN`: the recorded run whose simulated users are replayed
    /// ([`replay_users`]); `None` simulates every turn.
    pub replay_users: Option<Arc<UserReplay>>,
    /// Plan indices of scenarios to start before the others, in this order; the rest follow
    /// in the plan's. `trellis watch` starts what a save changed first, so that its results
    /// come before those of the thousands of scenarios answered from recorded turns. What
    /// orders the reports (JUnit, the statistics, the page) is the plan, not this.
    pub first: Vec<usize>,
}

/// The `run_started` entry a run of `plan` begins with, started now (a resumed run's
/// journal keeps the first attempt's start, and lists when it was resumed).
pub fn run_info(plan: &Plan, run_id: &str, jobs: usize, strict: bool) -> RunInfo {
    RunInfo {
        run_id: run_id.to_owned(),
        started_at: rfc3339(SystemTime::now()),
        trellis_version: env!("CARGO_PKG_VERSION").to_string(),
        suites: plan.suites.clone(),
        jobs,
        planned_trajectories: plan.trajectory_count(),
        scenarios: plan
            .scenarios
            .iter()
            .map(|s| plan.scenario_info(s))
            .collect(),
        rejudged_from: None,
        strict,
        resumed_at: Vec::new(),
    }
}

/// Runs the plan as a task on the current tokio runtime (it panics outside one, as
/// `tokio::spawn` does), sending every event to `events`, for a caller that waits for it
/// beside other work (signals, file changes). Never fails because of an agent: agent
/// problems become faults in the records.
///
/// Why a function rather than `tokio::spawn(run(…))` at the call site: an `async fn`'s body
/// is compiled in the crate that first polls its future, with everything it awaits and
/// spawns. Spawned here, the run's loop, the turn, the verdict and the HTTP exchange are
/// compiled with the engine, at the engine's optimization, rather than again in each crate
/// that starts a run (docs/performance.md, "The cold build: where its CPU goes").
pub fn spawn(
    plan: Plan,
    options: RunOptions,
    events: EventSender,
) -> tokio::task::JoinHandle<RunSummary> {
    tokio::spawn(run(plan, options, events))
}

/// The run's task ([`spawn`]); private so that every run's loop is compiled here.
async fn run(plan: Plan, options: RunOptions, events: EventSender) -> RunSummary {
    // A resumed run's clock goes on from where the earlier attempts' records end, so turn
    // times and the run's duration read as one run.
    let earlier = options
        .resume
        .as_ref()
        .map_or(Duration::ZERO, |f| f.elapsed());
    let started = Instant::now()
        .checked_sub(earlier)
        .unwrap_or_else(Instant::now);
    let mut plan = plan;
    let _ = events
        .send(Event::RunStarted(Arc::new(run_info(
            &plan,
            &options.run_id,
            options.jobs,
            options.strict,
        ))))
        .await;

    let transport = options.transport.clone().unwrap_or_default();
    // A watch session's transport outlives its runs: each run reports what grew during it.
    let redone = transport.connections_redone();
    let redone_before = redone.snapshot();
    let resent = transport.requests_resent();
    let resent_before = resent.snapshot();
    let secrets = crate::secrets::Secrets::of_plan(&plan);
    let llm_cache = if secrets.is_empty() {
        options.llm_cache.clone()
    } else {
        let secrets = secrets.clone();
        options
            .llm_cache
            .clone()
            .redacting(Arc::new(move |text: &str| secrets.redact(text)))
    };
    let llm = crate::llm::LlmRuntime::new(
        plan.llm.clone(),
        plan.templates.env(),
        &transport,
        llm_cache,
    );
    llm.meter().arm(options.llm_budget, options.stop.clone());
    // Every turn's requests carry a `traceparent` of this trace (continuing the caller's
    // `TRACEPARENT`, if any); the receiver takes only spans of it.
    let trace = options
        .telemetry
        .trace
        .clone()
        .unwrap_or_else(crate::transport::trace::RunTrace::from_env);
    let trace_hex: Arc<str> = Arc::from(trace.trace_id.hex());
    let receiver = options.telemetry.receiver.clone();
    if let Some(receiver) = &receiver {
        receiver.store().begin(trace_hex.to_string());
    }
    let agents = Agents::new(
        &plan,
        transport,
        llm.clone(),
        options.launcher.clone(),
        receiver.as_ref().map(|r| r.endpoint()),
    );
    let jobs = options.jobs.clamp(1, MAX_JOBS);
    let window = scenario_window(&plan, jobs);
    // Each scenario's plan goes to its task, which frees it when the scenario ends: a run of
    // tens of thousands of scenarios does not hold every plan until its last one ends,
    // beside the results the reports keep of each (docs/performance.md, "Many scenarios").
    let mut scenarios: Vec<Option<Arc<PlannedScenario>>> = std::mem::take(&mut plan.scenarios)
        .into_iter()
        .map(|planned| Some(Arc::new(planned)))
        .collect();
    let plan = Arc::new(plan);
    let shared = Arc::new(Shared {
        plan: plan.clone(),
        agents,
        llm,
        calls: Arc::new(Semaphore::new(jobs)),
        // Units hold little while waiting for a call permit; allowing a few per job keeps
        // the call pipeline full at forks without letting a huge `repeat` spawn everything.
        units: Arc::new(Semaphore::new(unit_capacity(jobs) as usize)),
        units_capacity: unit_capacity(jobs),
        paths: Semaphore::new(jobs.saturating_mul(2)),
        events: events.clone(),
        run_start: started,
        totals: Totals::of(options.resume.as_deref()),
        stop: options.stop.clone(),
        abandon: options.abandon.clone(),
        grace_end: options.grace_end.clone(),
        cut_short: std::sync::atomic::AtomicBool::new(false),
        abandoned: Default::default(),
        strict: options.strict,
        run_id: options.run_id.clone(),
        reuse: options.reuse.clone(),
        secrets,
        resume: options.resume.clone(),
        trace,
        trace_hex,
        spans: receiver.as_ref().map(|r| r.store().clone()),
        spans_wait: options.telemetry.spans_wait,
        spans_notices: options.telemetry.notices.clone(),
        agents_with_spans: Default::default(),
        spans_from_every_agent: options.telemetry.receiver_given,
        replay_users: options.replay_users.clone(),
    });

    // Whether each scenario passed, for the scenarios that need it: only those that some
    // scenario needs have a channel (each is a few hundred bytes, and a generated suite or a
    // dataset has tens of thousands of scenarios and usually no `needs`), and their ids, for
    // the reason a scenario that needs one is skipped.
    let mut needed: Vec<Option<(Arc<str>, String)>> = vec![None; scenarios.len()];
    for planned in scenarios.iter().flatten() {
        for &need in &planned.needs {
            if let Some(slot) = needed.get_mut(need) {
                *slot = scenarios
                    .get(need)
                    .and_then(Option::as_ref)
                    .map(|n| (n.suite.clone(), n.scenario.id.value.clone()));
            }
        }
    }
    let (mut senders, receivers): (Vec<_>, Vec<_>) = needed
        .into_iter()
        .map(|id| match id {
            Some(id) => {
                let (sender, receiver) = watch::channel(None::<bool>);
                (Some(sender), Some((id, receiver)))
            }
            None => (None, None),
        })
        .unzip();
    let mut scenario_tasks = JoinSet::new();
    let mut order = start_order(scenarios.len(), &options.first).into_iter();
    // Spawns the next scenarios in `order` until `window` of them are in flight.
    let mut spawn_next = |tasks: &mut JoinSet<()>| {
        while tasks.len() < window {
            let Some(index) = order.next() else {
                return;
            };
            let Some(planned) = scenarios.get_mut(index).and_then(Option::take) else {
                continue;
            };
            let done = senders.get_mut(index).and_then(Option::take);
            let needs: Vec<Need> = planned
                .needs
                .iter()
                .filter_map(|&n| receivers.get(n)?.clone())
                .collect();
            let shared = shared.clone();
            tasks.spawn(async move {
                let ok = run_scenario(&shared, planned, needs).await;
                if let Some(done) = done {
                    let _ = done.send(Some(ok));
                }
            });
        }
    };
    spawn_next(&mut scenario_tasks);
    let all_done = async {
        while scenario_tasks.join_next().await.is_some() {
            spawn_next(&mut scenario_tasks);
        }
    };
    let abandoned = tokio::select! {
        biased;
        () = all_done => false,
        () = options.abandon.cancelled() => true,
    };
    if abandoned {
        // Dropping a scenario's task drops its units' set, which aborts them.
        shared.note_cut_short();
        scenario_tasks.abort_all();
        while scenario_tasks.join_next().await.is_some() {}
    }
    // Stopped while work remained: what was cut off is missing from the records. (A stop
    // that came once every call had answered, or while the late spans below were awaited,
    // cut nothing off.)
    // A call the budget refused is work not done too, wherever it was turned into a record
    // (a judge's "not checked", a simulator fault).
    let interrupted = shared.cut_short.load(Ordering::Relaxed) || shared.llm.meter().refused_any();
    // Long-lived agent processes (and their process trees) end with the run, waited for.
    shared.agents.close().await;
    // Spans that came after their turn was recorded (batch exporters), or of agents whose
    // turns do not wait for them, after a bounded grace period for the missing ones.
    if let Some(store) = &shared.spans {
        let grace = options.telemetry.spans_grace;
        let wait = async {
            // A wait of moments is not worth a line (late spans usually come at once), and
            // by then the last results are on the console.
            let turns = store.settle(grace.min(GRACE_NOTICE_AFTER)).await;
            if let Some(notices) = options
                .telemetry
                .notices
                .as_ref()
                .filter(|_| turns > 0 && !grace.is_zero())
            {
                (notices.0)(crate::otel::SpansNotice::EndWaits { turns, grace });
            }
            store.settle(grace.saturating_sub(GRACE_NOTICE_AFTER)).await;
        };
        // A stopped run waits for no more spans: what has arrived is kept.
        tokio::select! {
            biased;
            () = shared.stop.cancelled() => {}
            () = wait => {}
        }
        let (batches, _) = store.finish();
        // Checks that found "no spans" were told nothing of these: said, per agent, so that
        // a right endpoint is not taken for a wrong one.
        if let Some(notices) = &options.telemetry.notices {
            let mut late: std::collections::BTreeMap<&str, u64> = Default::default();
            for batch in &batches {
                *late.entry(batch.agent.as_str()).or_default() += batch.spans.len() as u64;
            }
            for (agent, spans) in late {
                (notices.0)(crate::otel::SpansNotice::Late {
                    agent,
                    spans,
                    wait: options.telemetry.spans_wait,
                });
            }
        }
        for batch in batches {
            let event = shared.secrets.redact_event(Event::Spans(Box::new(batch)));
            let _ = events.send(event).await;
        }
    }

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
        invalid: t.invalid.load(Ordering::Relaxed),
        turns: t.turns.load(Ordering::Relaxed),
        llm_roles: {
            // A resumed run's calls add to those its earlier attempts recorded.
            let mut roles = options
                .resume
                .as_ref()
                .map(|f| f.llm_roles().clone())
                .unwrap_or_default();
            for (role, usage) in shared.llm.meter().by_role() {
                roles.entry(role).or_default().merge(&usage);
            }
            roles
        },
        // A budget reached with the last call cut nothing: the run did not stop early.
        stopped_by: shared.llm.meter().tripped().filter(|_| interrupted),
        interrupted,
        connections_redone: redone
            .since(&redone_before)
            .into_iter()
            .map(|(address, n)| (address.to_string(), n))
            .collect(),
        requests_resent: resent.since(&resent_before),
        abandoned: {
            let mut calls = shared
                .abandoned
                .lock()
                .map(|mut calls| std::mem::take(&mut *calls))
                .unwrap_or_default();
            calls.sort_by(|a, b| b.waited_ms.total_cmp(&a.waited_ms));
            calls
        },
    };
    let _ = events.send(Event::RunFinished(summary.clone())).await;
    drop_aside(shared);
    summary
}

/// How long the end of the run waits for missing spans before saying so
/// ([`crate::otel::SpansNotice::EndWaits`]).
const GRACE_NOTICE_AFTER: Duration = Duration::from_millis(250);

/// How many scenarios' tasks are in flight at once: every scenario's when any has `needs`
/// (a scenario waits in its task for those it needs, which may come after it in the
/// order), otherwise three per job. A scenario's task waits for units' permits
/// ([`unit_capacity`], two per job) in the order it was spawned, so a third per job keeps
/// scenarios queued for every permit that frees, while a run of tens of thousands of
/// scenarios does not hold a task and its first poll for each of them from the start
/// (docs/performance.md, "Many scenarios").
fn scenario_window(plan: &Plan, jobs: usize) -> usize {
    if plan.scenarios.iter().any(|s| !s.needs.is_empty()) {
        return usize::MAX;
    }
    jobs.saturating_mul(3)
}

/// The order the scenarios' tasks are spawned in, which is the order they take their
/// units' permits: `first` (each once), then the others in the plan's order.
fn start_order(scenarios: usize, first: &[usize]) -> Vec<usize> {
    if first.is_empty() {
        return (0..scenarios).collect();
    }
    let mut placed = vec![false; scenarios];
    let mut order = Vec::with_capacity(scenarios);
    for &index in first {
        if let Some(seen) = placed.get_mut(index)
            && !*seen
        {
            *seen = true;
            order.push(index);
        }
    }
    order.extend((0..scenarios).filter(|&index| !placed[index]));
    order
}

/// Drops the run's agents (and with them its connection pool) on a thread of its own, so
/// that the reports written after the run do not wait for them: closing a pooled connection
/// is a FIN exchange with the agent that the kernel handles in the closing call (on loopback
/// about 50 µs apiece, so 10-15 ms at `--jobs 256`). The event sender is dropped here: the
/// reporters' stream ends with the run, not with the last connection. A process that exits
/// first leaves the rest to the kernel, which closes them the same way.
fn drop_aside(shared: Arc<Shared>) {
    let aside: Box<dyn std::any::Any + Send> = match Arc::try_unwrap(shared) {
        Ok(Shared { agents, llm, .. }) => Box::new((agents, llm)),
        // Still shared by a task that outlived the run (none is expected to): all of it
        // goes, the event sender included, once that task lets go.
        Err(shared) => Box::new(shared),
    };
    // A thread that cannot start drops its closure, and the rest with it, right here.
    let _ = std::thread::Builder::new()
        .name("trellis-close".into())
        .spawn(move || drop(aside));
}

/// Permits of [`Shared::units`]: two trajectories in flight per job keep every call slot
/// busy while the next turn is prepared.
fn unit_capacity(jobs: usize) -> u32 {
    u32::try_from(jobs.saturating_mul(2)).unwrap_or(u32::MAX)
}

struct Shared {
    /// The plan without its scenarios: each scenario's task owns its own and frees it as it
    /// ends ([`run_scenario`]), so `plan.scenarios` is empty here.
    plan: Arc<Plan>,
    agents: Agents,
    /// Providers, judges and the response cache.
    llm: Arc<crate::llm::LlmRuntime>,
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
    /// [`RunOptions::abandon`]: a trajectory finished after it is not recorded.
    abandon: CancellationToken,
    grace_end: GraceEnd,
    /// The stop cut some work off: a unit not started, a turn or simulator call not made,
    /// a check not judged. What `run_finished.interrupted` says; a stop that came when
    /// everything was done (calls in flight all answered) cut nothing.
    cut_short: std::sync::atomic::AtomicBool,
    /// Agent calls dropped unanswered at [`RunOptions::abandon`] (`turn::InFlight`).
    abandoned: std::sync::Mutex<Vec<crate::record::AbandonedCall>>,
    strict: bool,
    run_id: String,
    reuse: Option<Arc<TurnMemo>>,
    /// Header secrets, replaced in every record before it is sent.
    secrets: crate::secrets::Secrets,
    /// What an earlier attempt of this run finished (`--resume`).
    resume: Option<Arc<Finished>>,
    /// The run's trace: every turn's requests carry a span of it in `traceparent`.
    trace: crate::transport::trace::RunTrace,
    /// Its id as hex, as each turn records it.
    trace_hex: Arc<str>,
    /// The agents' spans, when the run has a receiver.
    spans: Option<Arc<crate::otel::SpanStore>>,
    /// How long a `spans #true` agent's turn waits for its spans.
    spans_wait: Duration,
    /// Every agent may send spans (`Telemetry::receiver_given`), not only `spans #true` ones.
    spans_from_every_agent: bool,
    /// `Telemetry::notices`.
    spans_notices: Option<crate::otel::SpansNotices>,
    /// Agents a turn of which got its spans: a later turn of one that gets none is a turn
    /// without spans, not an agent whose spans do not reach the receiver.
    agents_with_spans: std::sync::Mutex<std::collections::HashSet<String>>,
    /// `--replay-users`: the recorded simulated users.
    replay_users: Option<Arc<UserReplay>>,
}

impl Shared {
    /// Completes when a judge call must not go on: at once when a signal has stopped the run
    /// (no judge call starts then), and for a call under way when one comes. A stop at the
    /// LLM budget never completes it: a call admitted before the budget ran out was paid
    /// for, and finishes (README, exit code 4); a call not sent yet is refused by the budget
    /// itself, after the cache, whose answers cost nothing, was asked.
    async fn abandon_judging(&self) {
        self.stop.cancelled().await;
        // After the budget's stop too: the meter itself refuses a call that would be sent,
        // and an answer the cache holds costs nothing ("cache hits do not count").
        if self.llm.meter().tripped().is_some() {
            std::future::pending::<()>().await;
        }
    }

    /// Notes that a turn of `agent` got spans (`got`), and says whether one had so far.
    fn agent_got_spans(&self, agent: &str, got: bool) -> bool {
        let mut agents = self
            .agents_with_spans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if got && !agents.contains(agent) {
            agents.insert(agent.to_owned());
        }
        agents.contains(agent)
    }

    /// The run's stop cut some work off ([`Shared::cut_short`]).
    fn note_cut_short(&self) {
        self.cut_short.store(true, Ordering::Relaxed);
    }

    /// Whether trajectory `t` of the unit finished in an earlier attempt of the run, and if
    /// so whether it passed.
    fn finished(
        &self,
        planned: &PlannedScenario,
        agent: usize,
        repetition: u32,
        t: usize,
    ) -> Option<bool> {
        let finished = self.resume.as_deref()?;
        finished.status(
            &planned.suite,
            &planned.scenario.id.value,
            &self.plan.agents[agent].id,
            repetition,
            &planned.trajectories.get(t)?.name,
        )
    }

    /// When every trajectory of the unit finished in an earlier attempt: whether they all
    /// passed.
    fn unit_finished(
        &self,
        planned: &PlannedScenario,
        agent: usize,
        repetition: u32,
    ) -> Option<bool> {
        let mut all_passed = true;
        for t in 0..planned.trajectories.len() {
            all_passed &= self.finished(planned, agent, repetition, t)?;
        }
        Some(all_passed)
    }
}

#[derive(Default)]
struct Totals {
    trajectories: AtomicU64,
    passed: AtomicU64,
    failed: AtomicU64,
    errors: AtomicU64,
    skipped: AtomicU64,
    invalid: AtomicU64,
    turns: AtomicU64,
}

impl Totals {
    /// Totals that start from what an earlier attempt of the run recorded.
    fn of(finished: Option<&Finished>) -> Self {
        let kept = finished.map(Finished::totals).unwrap_or_default();
        Totals {
            trajectories: AtomicU64::new(kept.trajectories),
            passed: AtomicU64::new(kept.passed),
            failed: AtomicU64::new(kept.failed),
            errors: AtomicU64::new(kept.errors),
            skipped: AtomicU64::new(kept.skipped),
            invalid: AtomicU64::new(kept.invalid),
            turns: AtomicU64::new(kept.turns),
        }
    }
}

/// A scenario another needs: its suite and id, and whether it passed once it has ended.
type Need = ((Arc<str>, String), watch::Receiver<Option<bool>>);

/// Runs every unit of one scenario; returns whether all its trajectories passed. The
/// scenario's plan is freed when this and its units are done with it.
async fn run_scenario(
    shared: &Arc<Shared>,
    planned: Arc<PlannedScenario>,
    needs: Vec<Need>,
) -> bool {
    let mut failed_needs = Vec::new();
    for (need, mut rx) in needs {
        let ok = match rx.wait_for(Option::is_some).await {
            Ok(v) => v.unwrap_or(false),
            Err(_) => false,
        };
        if !ok {
            failed_needs.push(need);
        }
    }
    // A need that did not pass in a run being stopped may only have been cut short: this
    // scenario is then left unrecorded, as the stop leaves it, and `--resume` (or the next
    // rerun of `trellis watch`) decides it once its needs have ended. Recorded skipped, it
    // would stay skipped for a reason that may be false.
    if !failed_needs.is_empty() && shared.stop.is_cancelled() {
        shared.note_cut_short();
        planned.scope.release();
        return false;
    }
    if !failed_needs.is_empty() || !planned.inactive_needs.is_empty() {
        let mut reasons = Vec::new();
        if !failed_needs.is_empty() {
            // Named as the `needs` that reaches it is written: by suite when in another.
            let listed: Vec<String> = failed_needs
                .iter()
                .map(|(suite, id)| {
                    if *suite == planned.suite {
                        format!("`{id}`")
                    } else {
                        format!("`{suite}/{id}`")
                    }
                })
                .collect();
            reasons.push(format!("needs {}, which did not pass", listed.join(", ")));
        }
        for (id, status) in &planned.inactive_needs {
            reasons.push(format!(
                "needs `{id}`, which is {status} and does not run (`--include-inactive` runs it)"
            ));
        }
        let reason = reasons.join("; ");
        for &agent in &planned.agents {
            for repetition in 0..planned.repeat {
                for t in 0..planned.trajectories.len() {
                    if shared.finished(&planned, agent, repetition, t).is_none() {
                        skip_trajectory(shared, &planned, agent, repetition, t, &reason).await;
                    }
                }
            }
        }
        planned.scope.release();
        // A skipped scenario does not satisfy the scenarios that need it.
        return false;
    }

    let weight = u32::try_from(planned.trajectories.len())
        .unwrap_or(u32::MAX)
        .clamp(1, shared.units_capacity);
    let mut units = JoinSet::new();
    let mut all_ok = true;
    // Until the units' permits first run out: the run's first wave.
    let mut ramping = true;
    let mut spawned: u32 = 0;
    for &agent in &planned.agents {
        for repetition in 0..planned.repeat {
            // Finished in an earlier attempt: kept as recorded, nothing to run.
            if let Some(passed) = shared.unit_finished(&planned, agent, repetition) {
                all_ok &= passed;
                continue;
            }
            if shared.stop.is_cancelled() {
                shared.note_cut_short();
                break;
            }
            let permit = match shared.units.clone().try_acquire_many_owned(weight) {
                Ok(permit) => permit,
                Err(TryAcquireError::Closed) => {
                    shared.note_cut_short();
                    break;
                }
                Err(TryAcquireError::NoPermits) => {
                    ramping = false;
                    let permit = tokio::select! {
                        permit = shared.units.clone().acquire_many_owned(weight) => permit,
                        () = shared.stop.cancelled() => {
                            shared.note_cut_short();
                            break;
                        }
                    };
                    let Ok(permit) = permit else {
                        shared.note_cut_short();
                        break;
                    };
                    permit
                }
            };
            while let Some(done) = units.try_join_next() {
                all_ok &= done.unwrap_or(false);
            }
            let shared = shared.clone();
            let planned = planned.clone();
            // Boxed before it is spawned: tokio moves a task's future into its cell and
            // writes the task's stage (future or output) whole, so an inline 1.3 KB unit
            // was copied about four times per unit (1,800 instructions); boxed, it is
            // copied once and the task moves a pointer.
            units.spawn(Box::pin(async move {
                let ok = run_unit(&shared, &planned, agent, repetition).await;
                drop(permit);
                ok
            }));
            spawned = spawned.wrapping_add(1);
            if ramping && spawned.is_multiple_of(RAMP_BATCH) {
                tokio::task::yield_now().await;
            }
        }
    }
    while let Some(done) = units.join_next().await {
        all_ok &= done.unwrap_or(false);
    }
    // Every trajectory is recorded: nothing renders in its scope any more.
    planned.scope.release();
    all_ok
}

/// While a scenario's first units start (until the units' permits first run out), its loop
/// yields after spawning this many. Without it the loop spawns a coop budget's worth of units
/// (128) in one poll; each of them connects, and their requests go out only once all 128
/// have connected (the runtime runs woken tasks after those already queued): against a
/// 50 ms agent at `--jobs 256` the first wave's requests left 15-45 ms after their units
/// started. A yield after every unit spreads them best, but a fast agent's answers then
/// come back one at a time, and the run stays in that rhythm: an `epoll_wait` per turn
/// instead of one per batch, 10% fewer turns per second against nginx (docs/performance.md).
const RAMP_BATCH: u32 = 16;

/// Runs one unit; returns whether every one of its trajectories passed (a skipped
/// trajectory did not pass: it cannot satisfy a `needs`).
async fn run_unit(
    shared: &Arc<Shared>,
    scenario: &PlannedScenario,
    agent: usize,
    repetition: u32,
) -> bool {
    let unit = Unit::new(shared, scenario, agent, repetition);
    match shared.agents.get(&shared.plan, agent, &shared.events).await {
        AgentRuntime::Unsupported(reason) => {
            for t in 0..scenario.trajectories.len() {
                if unit.finished(t).is_none() {
                    unit.skip(t, reason).await;
                }
            }
            return false;
        }
        AgentRuntime::Broken(fault) => {
            // Boxed, as below: recording a trajectory is an 8 KB state machine, and every
            // unit's task was allocated at that size (9 KB instead of 1.3 KB) for two paths
            // almost no unit takes; a run keeps up to twice `--jobs` units in flight.
            Box::pin(unit.fault_unrecorded(fault)).await;
            return false;
        }
        AgentRuntime::Ready { .. } => {}
    }
    let mut all_supported = true;
    for (t, trajectory) in scenario.trajectories.iter().enumerate() {
        if let Some(reason) = trajectory.unsupported_for(&shared.plan.agents[agent]) {
            if unit.finished(t).is_none() {
                unit.skip(t, reason).await;
            }
            all_supported = false;
        }
    }
    let Some(passed) = walk_unit(&unit).await else {
        return false;
    };
    let retries = retries_invalid(shared, scenario);
    if retries == 0 {
        return passed && all_supported;
    }
    // `simulator retries-invalid=N`: the trajectories whose simulated user broke character
    // run again (a fresh draw: the attempt is in the simulator's cache keys), each attempt
    // recorded under its own name; what counts for `needs` is every trajectory's last.
    let mut last = unit.outcomes();
    for attempt in 1..=retries {
        let again: Vec<bool> = last
            .iter()
            .map(|s| *s == Some(TrajectoryStatus::Invalid))
            .collect();
        if !again.contains(&true) {
            break;
        }
        if shared.stop.is_cancelled() {
            shared.note_cut_short();
            break;
        }
        let rerun = unit.retry(attempt, again);
        if walk_unit(&rerun).await.is_none() {
            return false;
        }
        for (slot, status) in last.iter_mut().zip(rerun.outcomes()) {
            if status.is_some() {
                *slot = status;
            }
        }
    }
    all_supported
        && last
            .iter()
            .all(|s| s.is_none_or(|s| s == TrajectoryStatus::Passed))
}

/// How many times an `invalid` trajectory of `scenario` runs again: the largest
/// `retries-invalid` among its `simulate` steps' simulators.
fn retries_invalid(shared: &Shared, scenario: &crate::plan::PlannedScenario) -> u32 {
    let project = shared.llm.setup().simulator.as_ref();
    scenario
        .nodes
        .iter()
        .flat_map(|n| &n.steps)
        .filter_map(|step| match step {
            crate::plan::PlannedStep::Simulate { simulator, .. } => Some(
                crate::llm::simulator::Layered::new(simulator.as_deref(), project).retries_invalid,
            ),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Walks one unit's tree; `Some(whether every trajectory passed)`, or `None` after a panic
/// (its unrecorded trajectories are then recorded as errors).
async fn walk_unit(unit: &Unit<'_>) -> Option<bool> {
    let walk = AssertUnwindSafe(unit.run_root());
    match walk.catch_unwind().await {
        Ok(passed) => Some(passed),
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
            Box::pin(unit.fault_unrecorded(&fault)).await;
            None
        }
    }
}

impl Unit<'_> {
    fn client(&self) -> Option<&dyn AgentProtocol> {
        match self.shared.agents.ready(self.agent) {
            Some(AgentRuntime::Ready { client, .. }) => Some(client.as_ref()),
            _ => None,
        }
    }

    /// The provider whose server runs the agent's own model, when the suite says so.
    fn model_server(&self) -> Option<&crate::llm::ProviderClient> {
        match self.shared.agents.ready(self.agent) {
            Some(AgentRuntime::Ready { model_server, .. }) => model_server.as_deref(),
            _ => None,
        }
    }

    fn agent_limit(&self) -> Option<&Semaphore> {
        match self.shared.agents.ready(self.agent) {
            Some(AgentRuntime::Ready { limit, .. }) => limit.as_deref(),
            _ => None,
        }
    }
}

impl Shared {
    async fn record(&self, record: TrajectoryRecord) {
        // The room in the stream first, then the totals and the send with nothing awaited
        // between: a unit dropped while it waits for room (the run's calls abandoned) is
        // neither counted nor recorded, and one past this point is both.
        let status = record.status;
        let event = self
            .secrets
            .redact_event(Event::Trajectory(Box::new(record)));
        let Some(permit) = self.events.reserve(&event).await else {
            return;
        };
        if self.abandon.is_cancelled() {
            return;
        }
        let t = &self.totals;
        t.trajectories.fetch_add(1, Ordering::Relaxed);
        match status {
            TrajectoryStatus::Passed => &t.passed,
            TrajectoryStatus::Failed => &t.failed,
            TrajectoryStatus::Error => &t.errors,
            TrajectoryStatus::Skipped => &t.skipped,
            TrajectoryStatus::Invalid => &t.invalid,
        }
        .fetch_add(1, Ordering::Relaxed);
        permit.send(event);
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// [`crate::journal::rfc3339`], where the command line has long found it.
pub use crate::journal::rfc3339;
