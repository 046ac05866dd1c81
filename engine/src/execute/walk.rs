//! Walking one unit's execution tree: a node's steps run in order on one conversation; at a
//! fork every child continues from the same point, concurrently.
//!
//! How a child continues is the protocol's call ([`Session::fork`]): a session that resends
//! its history copies itself, so the shared prefix was called once; a session bound to
//! server state cannot be copied, so the first child continues it and every other child
//! replays the prefix's steps in a fresh session (templates rendered with the values that
//! session captures). Replayed turns are recorded on the child's node with `replay: true`;
//! the prefix's `expect`s were judged once, on the original turns, and a replayed one is
//! recorded only when it fails there.
//!
//! A resumed run (`--resume`, [`super::resume`]) walks past the nodes an earlier attempt
//! recorded on a finished trajectory's path without running them; an unfinished branch
//! below them replays the prefix in a fresh session the same way, and since nothing judged
//! that prefix for it, every one of the prefix's `expect`s is recorded on the replay.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use trellis_dsl::CaptureSource;

use super::Shared;
use super::verdict::{Stop, Unreached};
use crate::criteria::{self, Scope};
use crate::event::Event;
use crate::plan::{ExecNode, PlannedCriterion, PlannedScenario, PlannedStep};
use crate::protocol::{BranchRequest, Conversation, Session, TurnInput};
use crate::record::{
    AgentBranchRecord, CriterionRecord, CriterionStatus, Fault, FaultCategory, NodeRecord,
    TurnRecord,
};

/// One scenario × agent × repetition being executed.
pub(super) struct Unit<'a> {
    pub(super) shared: &'a Arc<Shared>,
    pub(super) scenario: &'a PlannedScenario,
    pub(super) agent: usize,
    pub(super) repetition: u32,
    /// Which trajectories have been recorded, so a panic can record the rest.
    recorded: Mutex<Vec<bool>>,
    /// Per trajectory: finished in an earlier attempt of the run (`--resume`), and whether
    /// it passed. Those are kept as recorded and not run.
    finished: Vec<Option<bool>>,
    /// The attempt (`simulator retries-invalid`): 0, then 1, 2… for the reruns of the
    /// trajectories that came out `invalid`. Part of the simulator's cache keys, and of the
    /// names of what a rerun records (`@retryN`).
    pub(super) attempt: u32,
    /// On a rerun, the trajectories it runs again (the others are not walked).
    only: Option<Vec<bool>>,
    /// Each trajectory's status as recorded by this walk.
    outcomes: Mutex<Vec<Option<crate::record::TrajectoryStatus>>>,
}

/// What one path of the conversation has accumulated so far, except the session; copied
/// at forks.
#[derive(Clone)]
pub(super) struct PathState {
    pub(super) vars: BTreeMap<String, String>,
    pub(super) turns: Vec<Arc<TurnRecord>>,
    /// How many of `turns`, from the first, replay the scenario's `history` into a session
    /// bound to server state: they did not happen in this run, so `max-turns`, `turns max`
    /// and the other checks see only the turns after them, as on a protocol that resends
    /// the history with its first request.
    pub(super) history_turns: usize,
    pub(super) criteria: Vec<CriterionRecord>,
    pub(super) nodes: Vec<Arc<str>>,
    /// Time this path's own steps took (agent calls with their retries), excluding waits
    /// for a `--jobs` or `concurrency` slot: what the scenario's `timeout` budgets.
    pub(super) active: Duration,
    /// `~LABEL…` of the continuations of agent-initiated forks this path is in: appended
    /// to the names of its nodes and of its trajectory.
    pub(super) suffix: Arc<str>,
    /// Those continuations, outermost first.
    pub(super) agent_branches: Vec<AgentBranchRecord>,
    /// Simulator calls not yet on a turn: recorded on the next one, and counted in the
    /// trajectory's LLM usage even when no turn follows (the simulator ended the
    /// conversation, or failed).
    pub(super) pending_simulator: Vec<crate::llm::LlmCall>,
    /// LLM calls this path went through that a sibling path's turn records (an attack
    /// search's proposal call, one for a batch of siblings): counted in this trajectory's
    /// LLM usage, as a shared prefix's calls are, and recorded on no turn of its own, so
    /// that the turns' columns count each call once.
    pub(super) shared_calls: Vec<crate::llm::LlmCall>,
    /// `--replay-users`: where the next turn's simulated user message came from.
    pub(super) pending_user_source: Option<crate::record::UserSource>,
    /// The nodes on this path so far were recorded by an earlier attempt of the run and
    /// not run in this one (`--resume`): no session holds their conversation yet.
    pub(super) prefix_not_sent: bool,
    /// Who the simulated user plays (the last `simulate` step's), for the fidelity judge.
    pub(super) sim_brief: Option<Arc<str>>,
    /// The last `simulate` step's layered `fidelity` setting.
    pub(super) fidelity: Option<bool>,
    /// On a path of an `attack` search, how far it got.
    pub(super) attack: Option<crate::record::AttackRecord>,
}

impl PathState {
    pub(super) fn empty() -> Self {
        PathState {
            vars: BTreeMap::new(),
            turns: Vec::new(),
            history_turns: 0,
            criteria: Vec::new(),
            nodes: Vec::new(),
            active: Duration::ZERO,
            suffix: Arc::from(""),
            agent_branches: Vec::new(),
            pending_simulator: Vec::new(),
            shared_calls: Vec::new(),
            pending_user_source: None,
            prefix_not_sent: false,
            sim_brief: None,
            fidelity: None,
            attack: None,
        }
    }

    /// The turns this run took on this path: `turns` without the history's replay.
    pub(super) fn taken(&self) -> &[Arc<TurnRecord>] {
        self.turns.get(self.history_turns..).unwrap_or_default()
    }

    /// The name node `id` is recorded under on this path.
    pub(super) fn node_name(&self, id: &Arc<str>) -> Arc<str> {
        if self.suffix.is_empty() {
            id.clone()
        } else {
            Arc::from(format!("{id}{}", self.suffix))
        }
    }
}

/// Where a path resumes in a node: from which step, and whether it first takes the turn
/// that puts the agent on one of the alternatives it asked to fork into.
struct Resume {
    from_step: usize,
    branch: Option<BranchEntry>,
    /// The recorded name of the node above (a continuation's parent is the node where the
    /// agent branched).
    parent: Option<Arc<str>>,
}

struct BranchEntry {
    index: usize,
    count: usize,
    option: String,
}

/// A node's conversation as its children find it. Sessions are handed out lazily, when a
/// child holds a path slot, so a wide fork waits as one conversation, not one copy per
/// branch.
struct ForkPoint {
    session: Mutex<ForkSession>,
}

struct ForkSession {
    /// The node's own session, until the child that continues it takes it.
    original: Option<Box<dyn Session>>,
    /// Children that have not taken their session yet.
    remaining: usize,
    /// Learned from the first `fork()`: whether the protocol copies sessions.
    copies: Option<bool>,
}

impl ForkPoint {
    fn new(session: Option<Box<dyn Session>>, children: usize) -> Self {
        ForkPoint {
            session: Mutex::new(ForkSession {
                original: session,
                remaining: children,
                copies: None,
            }),
        }
    }

    /// The session child `index` continues in; `None` means a fresh session that must
    /// replay the prefix (or, before any turn, simply a fresh session).
    fn take(&self, index: usize) -> Option<Box<dyn Session>> {
        let Ok(mut fork) = self.session.lock() else {
            return None;
        };
        fork.remaining = fork.remaining.saturating_sub(1);
        let original = fork.original.as_ref()?;
        match fork.copies {
            Some(true) if fork.remaining == 0 => fork.original.take(),
            Some(true) => original.fork(),
            // Session-bound: the first child continues the original, deterministically.
            Some(false) => (index == 0).then(|| fork.original.take()).flatten(),
            None => match original.fork() {
                Some(copy) => {
                    fork.copies = Some(true);
                    if fork.remaining == 0 {
                        fork.original.take()
                    } else {
                        Some(copy)
                    }
                }
                None => {
                    fork.copies = Some(false);
                    (index == 0).then(|| fork.original.take()).flatten()
                }
            },
        }
    }
}

impl<'a> Unit<'a> {
    pub(super) fn new(
        shared: &'a Arc<Shared>,
        scenario: &'a PlannedScenario,
        agent: usize,
        repetition: u32,
    ) -> Self {
        let finished: Vec<Option<bool>> = (0..scenario.trajectories.len())
            .map(|t| shared.finished(scenario, agent, repetition, t))
            .collect();
        Unit {
            shared,
            scenario,
            agent,
            repetition,
            // A trajectory an earlier attempt finished is recorded already.
            recorded: Mutex::new(finished.iter().map(Option::is_some).collect()),
            finished,
            attempt: 0,
            only: None,
            outcomes: Mutex::new(vec![None; scenario.trajectories.len()]),
        }
    }

    /// Whether trajectory `t` finished in an earlier attempt of the run (`--resume`), and
    /// if so whether it passed.
    pub(super) fn finished(&self, t: usize) -> Option<bool> {
        self.finished.get(t).copied().flatten()
    }

    /// The rerun `attempt` of this unit for the trajectories in `only`: the others count
    /// as recorded already, so nothing of theirs is walked or recorded again.
    pub(super) fn retry(&self, attempt: u32, only: Vec<bool>) -> Self {
        let recorded = only.iter().map(|rerun| !rerun).collect();
        Unit {
            shared: self.shared,
            scenario: self.scenario,
            agent: self.agent,
            repetition: self.repetition,
            recorded: Mutex::new(recorded),
            finished: self.finished.clone(),
            attempt,
            only: Some(only),
            outcomes: Mutex::new(vec![None; self.scenario.trajectories.len()]),
        }
    }

    /// What a rerun adds to the names of its nodes and trajectories: `@retryN`.
    pub(super) fn attempt_suffix(&self) -> String {
        if self.attempt == 0 {
            String::new()
        } else {
            format!("@retry{}", self.attempt)
        }
    }

    /// `, attempt N` in the names of a rerun's LLM calls.
    fn attempt_note(&self) -> String {
        if self.attempt == 0 {
            String::new()
        } else {
            format!(", attempt {}", self.attempt + 1)
        }
    }

    pub(super) fn set_outcome(&self, t: usize, status: crate::record::TrajectoryStatus) {
        if let Ok(mut outcomes) = self.outcomes.lock()
            && let Some(slot) = outcomes.get_mut(t)
        {
            *slot = Some(status);
        }
    }

    /// Each trajectory's status as this walk recorded it (`None`: not recorded by it).
    pub(super) fn outcomes(&self) -> Vec<Option<crate::record::TrajectoryStatus>> {
        self.outcomes.lock().map(|o| o.clone()).unwrap_or_default()
    }

    pub(super) fn mark_recorded(&self, t: usize) {
        if let Ok(mut recorded) = self.recorded.lock()
            && let Some(slot) = recorded.get_mut(t)
        {
            *slot = true;
        }
    }

    pub(super) fn is_recorded(&self, t: usize) -> bool {
        self.recorded
            .lock()
            .map(|r| r.get(t).copied().unwrap_or(true))
            .unwrap_or(true)
    }

    /// Whether trajectory `t` runs on this unit's agent (the others were recorded as
    /// skipped).
    fn runs(&self, t: usize) -> bool {
        if let Some(only) = &self.only
            && !only.get(t).copied().unwrap_or(false)
        {
            return false;
        }
        self.scenario.trajectories[t]
            .unsupported_for(&self.shared.plan.agents[self.agent])
            .is_none()
    }

    pub(super) fn agent_id(&self) -> &str {
        &self.shared.plan.agents[self.agent].id
    }

    /// Whether the agent's spans are collected for its turns (`spans #true`).
    pub(super) fn agent_spans(&self) -> bool {
        self.shared.plan.agents[self.agent].spans
    }

    /// Walks the tree from its root; returns whether every trajectory passed.
    pub(super) async fn run_root(&'a self) -> bool {
        let root = ForkPoint::new(None, 1);
        let mut state = PathState::empty();
        state.suffix = Arc::from(self.attempt_suffix());
        self.run_node(self.scenario.root(), Arc::new(state), Arc::new(root), 0)
            .await
    }

    /// Runs one execution node and, concurrently, everything below it. Returns whether every
    /// trajectory through it passed.
    fn run_node(
        &'a self,
        index: usize,
        parent: Arc<PathState>,
        fork: Arc<ForkPoint>,
        child: usize,
    ) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            let node: &ExecNode = &self.scenario.nodes[index];
            let runnable = node
                .trajectories
                .iter()
                .any(|&t| self.runs(t) && self.finished(t).is_none());
            if !runnable {
                // Its trajectories were recorded as skipped (they did not pass), or by an
                // earlier attempt of the run (as they did).
                return node
                    .trajectories
                    .iter()
                    .all(|&t| self.finished(t) == Some(true));
            }
            if node
                .trajectories
                .iter()
                .any(|&t| self.finished(t).is_some())
            {
                // On a finished trajectory's path: recorded by an earlier attempt already.
                return Box::pin(self.pass_recorded(node, parent)).await;
            }
            let slot = self.shared.paths.acquire().await.ok();
            // Boxed only now: a node's running state (request and response futures included)
            // is large, and a wide fork has many children waiting for a slot.
            Box::pin(self.execute_node(node, parent, fork, child, slot)).await
        })
    }

    /// Goes past a node an earlier attempt of the run recorded (`--resume`) to its children,
    /// which find no session: an unfinished one replays the prefix in a fresh session.
    async fn pass_recorded(&'a self, node: &'a ExecNode, parent: Arc<PathState>) -> bool {
        let mut state = Arc::unwrap_or_clone(parent);
        state.nodes.push(state.node_name(&node.id));
        state.prefix_not_sent = true;
        self.run_children(node, state, None).await
    }

    /// Runs a node's children concurrently, each continuing `session` (copied or replayed
    /// as the protocol allows). Returns whether every trajectory below passed.
    async fn run_children(
        &'a self,
        node: &'a ExecNode,
        state: PathState,
        session: Option<Box<dyn Session>>,
    ) -> bool {
        let point = Arc::new(ForkPoint::new(session, node.children.len()));
        let state = Arc::new(state);
        let children: Vec<_> = node
            .children
            .iter()
            .enumerate()
            .map(|(i, &c)| self.run_node(c, state.clone(), point.clone(), i))
            .collect();
        drop(state);
        drop(point);
        all_pass(children).await
    }

    /// Runs a node's steps while holding a path slot, records them, then runs its children.
    async fn execute_node(
        &'a self,
        node: &'a ExecNode,
        parent: Arc<PathState>,
        fork: Arc<ForkPoint>,
        child: usize,
        slot: Option<tokio::sync::SemaphorePermit<'a>>,
    ) -> bool {
        // The last branch to start takes the parent's path without copying it.
        let mut state = Arc::unwrap_or_clone(parent);
        let session = fork.take(child);
        drop(fork);
        let parent_name = node
            .parent
            .and_then(|p| self.scenario.nodes.get(p))
            .map(|p| state.node_name(&p.id));
        let mut recorded: Vec<Arc<TurnRecord>> = Vec::new();
        let (session, stop) = match session {
            Some(session) => (Some(session), None),
            None => self.open_session(node, &mut state, &mut recorded).await,
        };
        let resume = Resume {
            from_step: 0,
            branch: None,
            parent: parent_name,
        };
        self.run_path(node, state, session, stop, recorded, resume, slot)
            .await
    }

    /// Runs a node's steps from `resume` on (unless `stop` already ended the path), records
    /// the node, then runs its children, or explores the alternatives the agent asked to
    /// fork into. Returns whether every trajectory through it passed.
    #[allow(clippy::too_many_arguments)]
    async fn run_path(
        &'a self,
        node: &'a ExecNode,
        mut state: PathState,
        mut session: Option<Box<dyn Session>>,
        stop: Option<Stop>,
        mut recorded: Vec<Arc<TurnRecord>>,
        resume: Resume,
        slot: Option<tokio::sync::SemaphorePermit<'a>>,
    ) -> bool {
        let name = state.node_name(&node.id);
        state.nodes.push(name.clone());
        // The first step of this node not run yet, for the checks a stop leaves unreached.
        let mut next_step = resume.from_step;
        let stop = match (stop, session.as_mut()) {
            (Some(stop), _) => Some(stop),
            (None, None) => None,
            (None, Some(session)) => {
                let entered = match &resume.branch {
                    Some(entry) => {
                        let input = TurnInput::Branch {
                            index: entry.index,
                            count: entry.count,
                            option: &entry.option,
                        };
                        self.turn(session.as_mut(), input, false, &mut state, &mut recorded)
                            .await
                    }
                    None => None,
                };
                match entered {
                    Some(stop) => Some(stop),
                    None => {
                        self.run_steps(
                            node,
                            session.as_mut(),
                            &mut state,
                            &mut recorded,
                            &mut next_step,
                        )
                        .await
                    }
                }
            }
        };
        drop(slot);

        if let Some(store) = &self.shared.spans {
            // Spans of these turns that arrive later are recorded under their node.
            for turn in &recorded {
                if let Some(span) = &turn.span_id {
                    store.name_turn(
                        span,
                        crate::otel::TurnKey {
                            suite: String::from(&*self.scenario.suite),
                            scenario: self.scenario.scenario.id.value.clone(),
                            agent: self.agent_id().to_string(),
                            repetition: self.repetition,
                            node: String::from(&*name),
                            turn_index: turn.turn_index,
                        },
                    );
                }
            }
        }
        if !recorded.is_empty() || !matches!(stop, Some(Stop::Interrupted)) {
            let event = self.shared.secrets.redact_event(Event::Node(NodeRecord {
                suite: String::from(&*self.scenario.suite),
                scenario: self.scenario.scenario.id.value.clone(),
                agent: self.agent_id().to_string(),
                repetition: self.repetition,
                node: String::from(&*name),
                parent: resume.parent.map(|p| String::from(&*p)),
                turns: recorded,
            }));
            let _ = self.shared.events.send(event).await;
        }

        match stop {
            None => {}
            Some(Stop::Interrupted) => {
                self.shared.note_cut_short();
                return false;
            }
            Some(Stop::Branch(request)) => {
                return self
                    .explore(node, next_step, state, session, request, name)
                    .await;
            }
            Some(Stop::Attack(attack)) => {
                // Boxed: an attack search is the largest state of a path, and rare.
                return Box::pin(self.attack(node, &attack, state, session, name)).await;
            }
            Some(stop) => {
                // Every trajectory below this node ends here.
                let untaken = matches!(&stop, Stop::Failed(c) if c.kind == "max-turns");
                for &t in &node.trajectories {
                    if self.runs(t) {
                        let unreached = self.expects_after(node, next_step, t, untaken);
                        self.finish_trajectory(
                            t,
                            &state,
                            Some(stop.clone()),
                            unreached,
                            session.as_deref(),
                        )
                        .await;
                    }
                }
                return false;
            }
        }
        if let Some(t) = node.ends {
            return self
                .finish_trajectory(t, &state, None, Vec::new(), session.as_deref())
                .await;
        }
        self.run_children(node, state, session).await
    }

    /// The agent asked to fork at step `next_step` of `node`: every alternative (within
    /// the scenario's `agent-branches` limits) continues in its own copy of the session,
    /// concurrently, from the same point, as its own trajectory.
    async fn explore(
        &'a self,
        node: &'a ExecNode,
        next_step: usize,
        state: PathState,
        session: Option<Box<dyn Session>>,
        request: BranchRequest,
        at: Arc<str>,
    ) -> bool {
        let alternatives = request.alternatives();
        let limits = self.scenario.agent_branches;
        let depth = u32::try_from(state.agent_branches.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1);
        let breadth = usize::try_from(limits.breadth.max(1)).unwrap_or(usize::MAX);
        let (explored, limited_by) = if depth > limits.depth {
            (
                1,
                Some(format!(
                    "depth: agent branches nest at most {} deep (`agent-branches depth=`); \
                     only the first alternative was continued",
                    limits.depth
                )),
            )
        } else if alternatives.len() > breadth {
            (
                breadth,
                Some(format!(
                    "breadth: at most {breadth} alternatives are explored per branch action \
                     (`agent-branches breadth=`)"
                )),
            )
        } else {
            (alternatives.len(), None)
        };
        let (chosen, rest) = alternatives.split_at(explored.min(alternatives.len()));
        let labels = branch_labels(chosen);
        let count = alternatives.len();
        let mut original = session;
        let mut continuations = Vec::with_capacity(chosen.len());
        for (index, (option, label)) in chosen.iter().zip(labels).enumerate() {
            let last = index + 1 == chosen.len();
            let session = if last {
                original.take()
            } else {
                original.as_ref().and_then(|s| s.fork())
            };
            let mut path = state.clone();
            path.suffix = Arc::from(format!("{}~{label}", state.suffix));
            path.agent_branches.push(AgentBranchRecord {
                label,
                option: option.clone(),
                reason: request.reason.clone(),
                index: u32::try_from(index + 1).unwrap_or(u32::MAX),
                count: u32::try_from(count).unwrap_or(u32::MAX),
                depth,
                unexplored: rest.to_vec(),
                limited_by: limited_by.clone(),
            });
            let entry = BranchEntry {
                index,
                count,
                option: option.clone(),
            };
            continuations.push(self.continue_branch(
                node,
                next_step,
                path,
                session,
                entry,
                at.clone(),
            ));
        }
        drop(state);
        all_pass(continuations).await
    }

    /// One continuation of an agent-initiated fork, run when it gets a path slot.
    fn continue_branch(
        &'a self,
        node: &'a ExecNode,
        from_step: usize,
        state: PathState,
        session: Option<Box<dyn Session>>,
        entry: BranchEntry,
        at: Arc<str>,
    ) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            let slot = self.shared.paths.acquire().await.ok();
            let stop = session.is_none().then(|| {
                Stop::Fault(Fault::new(
                    FaultCategory::Protocol,
                    "the agent asked to branch, but its conversation cannot be copied to \
                     continue each alternative",
                ))
            });
            let resume = Resume {
                from_step,
                branch: Some(entry),
                parent: Some(at),
            };
            self.run_path(node, state, session, stop, Vec::new(), resume, slot)
                .await
        })
    }

    /// The `expect` checks trajectory `t` would have run from step `from` of `node` on: what
    /// a stop there leaves unchecked, recorded as skipped so no check silently vanishes.
    /// `untaken`: the step before `from` stopped the path without taking its turn
    /// (`max-turns`): the checks after it would have checked that turn or a later one.
    pub(super) fn expects_after(
        &self,
        node: &'a ExecNode,
        from: usize,
        t: usize,
        untaken: bool,
    ) -> Vec<Unreached<'a>> {
        let mut unreached = Vec::new();
        let mut current = node;
        let mut steps = current.steps.get(from..).unwrap_or_default();
        // Turns the steps since the stop would have taken: an `expect` checks the last of
        // them (none: the turn the stop took). Unknown past a step that takes a number of
        // turns only its run knows.
        let mut turns_later = Some(u32::from(untaken));
        loop {
            for step in steps {
                match step {
                    PlannedStep::Expect(checks) => {
                        unreached.extend(checks.iter().map(|criterion| Unreached {
                            criterion,
                            turns_later,
                        }));
                    }
                    PlannedStep::Opening | PlannedStep::User(_) | PlannedStep::Call { .. } => {
                        turns_later = turns_later.map(|n| n.saturating_add(1));
                    }
                    PlannedStep::Capture { .. } => {}
                    PlannedStep::Simulate { .. }
                    | PlannedStep::Attack(_)
                    | PlannedStep::Hitl { .. } => turns_later = None,
                }
            }
            let below = current
                .children
                .iter()
                .filter_map(|&c| self.scenario.nodes.get(c))
                .find(|n| n.trajectories.contains(&t));
            match below {
                Some(next) => {
                    current = next;
                    steps = &next.steps;
                }
                None => return unreached,
            }
        }
    }

    /// A fresh session for this node; when the path already has turns (a session-bound
    /// protocol at a fork), they are replayed into it first and replace the path's turns.
    async fn open_session(
        &self,
        node: &ExecNode,
        state: &mut PathState,
        recorded: &mut Vec<Arc<TurnRecord>>,
    ) -> (Option<Box<dyn Session>>, Option<Stop>) {
        let Some(client) = self.client() else {
            let fault = Fault::new(FaultCategory::Setup, "agent is not available");
            return (None, Some(Stop::Fault(fault)));
        };
        let mut session = client.open(&Conversation {
            run_id: &self.shared.run_id,
            suite: &self.scenario.suite,
            scenario: &self.scenario.scenario.id.value,
            repetition: self.repetition,
            node: &node.id,
            sandbox: Some(&self.scenario.sandbox),
            llm: Some(&self.shared.llm),
        });
        if let Some(reuse) = &self.shared.reuse {
            session = reuse.wrap(
                session,
                &self.scenario.suite,
                &self.scenario.scenario.id.value,
                self.agent_id(),
                self.repetition,
                &self.scenario.sandbox,
            );
        }
        if state.turns.is_empty() && !state.prefix_not_sent {
            // The root's session starts from the scenario's recorded history, if any.
            let stop = match node.parent {
                // Boxed here and below: a history replayed or restored is most of opening
                // a session's size, and only scenarios with a history or a fork have one.
                None => Box::pin(self.open_history(session.as_mut(), false, state, recorded)).await,
                Some(_) => None,
            };
            return (Some(session), stop);
        }
        // The replay redoes the whole path so far in this branch's session: its time
        // replaces the original prefix's in the branch's budget instead of adding to it.
        state.active = Duration::ZERO;
        let stop = Box::pin(self.replay_prefix(node, session.as_mut(), state, recorded)).await;
        (Some(session), stop)
    }

    /// Opens the conversation with the scenario's `history`: restored into a session that
    /// holds its conversation, or its user messages replayed (recorded with `replay: true`)
    /// into one bound to server state. A last user message the history has no answer to is
    /// sent as the trajectory's first real turn (`in_replay`: a replay of it too).
    async fn open_history(
        &self,
        session: &mut dyn Session,
        in_replay: bool,
        state: &mut PathState,
        recorded: &mut Vec<Arc<TurnRecord>>,
    ) -> Option<Stop> {
        let messages = self
            .scenario
            .scenario
            .history
            .as_ref()
            .and_then(|h| h.messages.as_ref())?;
        let mut turns = super::history::turns(messages);
        let pending = match turns.last() {
            Some((Some(_), last)) if last.messages.is_empty() => turns.pop().and_then(|t| t.0),
            _ => None,
        };
        if !super::history::restore(session, &turns) {
            let before = state.turns.len();
            for (input, _) in &turns {
                // The agent's own opening cannot be asked for again; the user turns can.
                let Some(text) = input else { continue };
                let stop = self
                    .turn(session, TurnInput::User(text), true, state, recorded)
                    .await;
                state.history_turns = state.turns.len() - before;
                if let Some(stop) = stop {
                    return Some(match stop {
                        Stop::Fault(fault) => Stop::Fault(Fault::new(
                            fault.category,
                            format!("replaying the history: {}", fault.message),
                        )),
                        Stop::Branch(_) => Stop::Fault(branch_on_replay()),
                        other => other,
                    });
                }
            }
        }
        let text = pending?;
        self.turn(session, TurnInput::User(&text), in_replay, state, recorded)
            .await
    }

    /// Replays the steps of the nodes above `node` in a fresh session: templates render
    /// with the values this session captures (an agent that hands out a new id per session
    /// gets its own id back, not the original session's), captures run on the replayed
    /// replies, and the prefix's `expect`s are checked again. Those were judged on the
    /// original turns already: a replayed check is recorded only when it fails, as the
    /// branch's failure, since its conversation then differs from the one judged. On a
    /// resumed run's prefix that this attempt did not run (`prefix_not_sent`), nothing
    /// judged it for this branch: every check is recorded.
    async fn replay_prefix(
        &self,
        node: &ExecNode,
        session: &mut dyn Session,
        state: &mut PathState,
        recorded: &mut Vec<Arc<TurnRecord>>,
    ) -> Option<Stop> {
        let mut prefix: Vec<&ExecNode> = Vec::new();
        let mut above = node.parent;
        while let Some(index) = above {
            let Some(n) = self.scenario.nodes.get(index) else {
                break;
            };
            prefix.push(n);
            above = n.parent;
        }
        prefix.reverse();
        let judge_all = std::mem::take(&mut state.prefix_not_sent);
        state.turns.clear();
        state.history_turns = 0;
        state.vars.clear();
        // A session bound to server state: the history is replayed first, as in the root.
        if let Some(stop) = self.open_history(session, true, state, recorded).await {
            return Some(stop);
        }
        let scope = &self.scenario.scope;
        let templates = &self.shared.plan.templates;
        let replay_fault = |fault: Fault| {
            Stop::Fault(Fault::new(
                fault.category,
                format!("replaying the shared prefix: {}", fault.message),
            ))
        };
        let steps: Vec<(&ExecNode, &PlannedStep)> = prefix
            .iter()
            .flat_map(|&n| n.steps.iter().map(move |s| (n, s)))
            .collect();
        for (prefix_node, step) in steps {
            match step {
                // The last step of its node, which has no children: never in a prefix.
                PlannedStep::Attack(_) => {}
                PlannedStep::Opening | PlannedStep::User(_) | PlannedStep::Call { .. } => {
                    let text = match step {
                        PlannedStep::User(template)
                        | PlannedStep::Call {
                            input: template, ..
                        } => {
                            let vars = &state.vars;
                            match templates.render(template, || scope.with_vars(vars)) {
                                Ok(text) => Some(text),
                                Err(e) => {
                                    return Some(replay_fault(Fault::new(
                                        FaultCategory::Template,
                                        e.to_string(),
                                    )));
                                }
                            }
                        }
                        _ => None,
                    };
                    let input = match (step, text.as_deref()) {
                        (PlannedStep::Call { function, .. }, Some(text)) => TurnInput::Call {
                            function,
                            input: text,
                        },
                        (_, Some(text)) => TurnInput::User(text),
                        (_, None) => TurnInput::Opening,
                    };
                    match self.turn(session, input, true, state, recorded).await {
                        Some(Stop::Fault(fault)) => return Some(replay_fault(fault)),
                        Some(Stop::Branch(_)) => return Some(replay_fault(branch_on_replay())),
                        Some(stop) => return Some(stop),
                        None => {}
                    }
                }
                PlannedStep::Simulate {
                    turns,
                    simulator,
                    persona,
                } => {
                    let by = (simulator.as_deref(), persona.as_deref());
                    // Boxed here and below: a simulated user's LLM calls are most of a step's
                    // size, and every step's future was that large.
                    match Box::pin(self.simulate(session, *turns, by, true, state, recorded)).await
                    {
                        Some(Stop::Fault(fault)) => return Some(replay_fault(fault)),
                        Some(Stop::Branch(_)) => return Some(replay_fault(branch_on_replay())),
                        Some(stop) => return Some(stop),
                        None => {}
                    }
                }
                PlannedStep::Capture { name, source } => {
                    if let Err(mut stop) = capture_into(state, name, source) {
                        if let Some(detail) = &mut stop.detail {
                            detail.insert_str(0, "replaying the shared prefix: ");
                        }
                        return Some(Stop::Failed(stop));
                    }
                }
                PlannedStep::Expect(checks) if judge_all => {
                    let before = state.criteria.len();
                    for c in checks {
                        let record = self.check_expect(c, prefix_node, session, state).await;
                        state.criteria.push(record);
                    }
                    if let Some(stop) = stop_on_failure(&self.scenario.scenario, state, before) {
                        return Some(stop);
                    }
                }
                PlannedStep::Expect(checks) => {
                    let before = state.criteria.len();
                    let turn_index = state.turns.last().map(|t| t.turn_index);
                    let vars = &state.vars;
                    for c in checks {
                        let mut record = criteria::check_planned(
                            c,
                            templates,
                            || scope.with_vars(vars),
                            Scope::Turn,
                            &state.turns,
                            turn_index,
                            criteria::Evidence {
                                sandbox: session.sandbox(),
                                tools_from_spans: self.agent_spans(),
                            },
                        );
                        if record.status == CriterionStatus::Failed {
                            record.detail = Some(format!(
                                "on the replay of the shared prefix in this branch's session: {}",
                                record.detail.unwrap_or_default()
                            ));
                            state.criteria.push(record);
                        }
                    }
                    if let Some(stop) = stop_on_failure(&self.scenario.scenario, state, before) {
                        return Some(stop);
                    }
                }
                PlannedStep::Hitl { approve, message } => {
                    match self
                        .answer_human(session, *approve, message.as_ref(), true, state, recorded)
                        .await
                    {
                        Some(Stop::Fault(fault)) => return Some(replay_fault(fault)),
                        Some(Stop::Branch(_)) => return Some(replay_fault(branch_on_replay())),
                        Some(stop) => return Some(stop),
                        None => {}
                    }
                }
            }
        }
        None
    }

    async fn run_steps(
        &self,
        node: &ExecNode,
        session: &mut dyn Session,
        state: &mut PathState,
        recorded: &mut Vec<Arc<TurnRecord>>,
        next_step: &mut usize,
    ) -> Option<Stop> {
        let sc = &self.scenario.scenario;
        // `stop-on-failure`: where in `state.criteria` the first failed check of the turn is.
        // The turn's other checks are still made; the path stops before it sends anything
        // more.
        let mut failed_here: Option<usize> = None;
        for (i, step) in node.steps.iter().enumerate().skip(*next_step) {
            *next_step = i + 1;
            if let Some(at) = failed_here
                && !matches!(step, PlannedStep::Expect(_) | PlannedStep::Capture { .. })
            {
                return Some(Stop::Failed(state.criteria.remove(at)));
            }
            if matches!(
                step,
                PlannedStep::User(_) | PlannedStep::Call { .. } | PlannedStep::Simulate { .. }
            ) && let Some(prompt) = session.paused()
            {
                return Some(Stop::Failed(CriterionRecord {
                    turn_index: state.turns.last().map(|t| t.turn_index),
                    criterion: "hitl".into(),
                    kind: "hitl".into(),
                    status: CriterionStatus::Failed,
                    detail: Some(format!(
                        "the agent paused for a human (`hitl_pause`: {}) and the next step is \
                         a user message, not a `hitl approve|reject` answer",
                        excerpt(prompt)
                    )),
                    judge: None,
                }));
            }
            match step {
                PlannedStep::Attack(attack) => return Some(Stop::Attack(attack.clone())),
                PlannedStep::Opening => {
                    let opening = TurnInput::Opening;
                    if let Some(stop) = self.turn(session, opening, false, state, recorded).await {
                        return Some(stop);
                    }
                }
                PlannedStep::User(template)
                | PlannedStep::Call {
                    input: template, ..
                } => {
                    if let Some(max) = sc.max_turns
                        && state.taken().len() as u64 >= u64::from(max)
                    {
                        return Some(Stop::Failed(CriterionRecord {
                            turn_index: None,
                            criterion: format!("max-turns {max}"),
                            kind: "max-turns".into(),
                            status: CriterionStatus::Failed,
                            detail: Some(format!(
                                "the trajectory reached max-turns ({max}) with scripted steps left"
                            )),
                            judge: None,
                        }));
                    }
                    let scope = &self.scenario.scope;
                    let vars = &state.vars;
                    let text = match self
                        .shared
                        .plan
                        .templates
                        .render(template, || scope.with_vars(vars))
                    {
                        Ok(text) => text,
                        Err(e) => {
                            let what = match step {
                                PlannedStep::Call { function, .. } => format!("call {function}"),
                                _ => "user message".to_owned(),
                            };
                            return Some(Stop::Fault(Fault::new(
                                FaultCategory::Template,
                                format!("{what}: {e}"),
                            )));
                        }
                    };
                    let input = match step {
                        PlannedStep::Call { function, .. } => TurnInput::Call {
                            function,
                            input: &text,
                        },
                        _ => TurnInput::User(&text),
                    };
                    if let Some(stop) = self.turn(session, input, false, state, recorded).await {
                        return Some(stop);
                    }
                }
                PlannedStep::Expect(checks) => {
                    for c in checks {
                        let record = self.check_expect(c, node, &*session, state).await;
                        if sc.stop_on_failure
                            && failed_here.is_none()
                            && record.status == CriterionStatus::Failed
                        {
                            failed_here = Some(state.criteria.len());
                        }
                        state.criteria.push(record);
                    }
                }
                PlannedStep::Capture { name, source } => {
                    if let Err(failed) = capture_into(state, name, source) {
                        return Some(Stop::Failed(failed));
                    }
                }
                PlannedStep::Simulate {
                    turns,
                    simulator,
                    persona,
                } => {
                    let by = (simulator.as_deref(), persona.as_deref());
                    if let Some(stop) =
                        Box::pin(self.simulate(session, *turns, by, false, state, recorded)).await
                    {
                        return Some(stop);
                    }
                }
                PlannedStep::Hitl { approve, message } => {
                    if let Some(stop) = self
                        .answer_human(session, *approve, message.as_ref(), false, state, recorded)
                        .await
                    {
                        return Some(stop);
                    }
                }
            }
        }
        // Nor do the nodes below it run. At the end of the path nothing more would be sent:
        // the trajectory ends as any other, its own checks made.
        if node.children.is_empty() {
            return None;
        }
        failed_here.map(|at| Stop::Failed(state.criteria.remove(at)))
    }

    /// One check of an `expect` step of `node`, on the path's last turn.
    async fn check_expect(
        &self,
        c: &PlannedCriterion,
        node: &ExecNode,
        session: &dyn Session,
        state: &PathState,
    ) -> CriterionRecord {
        let sc = &self.scenario.scenario;
        let turn_index = state.turns.last().map(|t| t.turn_index);
        let scope = &self.scenario.scope;
        let vars = &state.vars;
        match turn_index {
            Some(i) if crate::llm::LlmRuntime::is_judged(&c.criterion.kind) => {
                let kind = match criteria::judged_kind(c, &self.shared.plan.templates, || {
                    scope.with_vars(vars)
                }) {
                    Ok(kind) => kind,
                    Err(e) => return criteria::unrendered_statement(&c.criterion, Some(i), &e),
                };
                super::verdict::judge_unless_stopped(
                    self.shared,
                    crate::llm::runtime::JudgeTask {
                        draw: 0,
                        criterion_text: &c.criterion.text,
                        kind: &kind,
                        scenario: sc,
                        turns: &state.turns,
                        turn_index: Some(i),
                        repetition: self.repetition,
                        call_name: format!(
                            "judge of `{}` on {}/{} node `{}{}` turn {i} repetition {} \
                             (agent `{}`)",
                            c.criterion.text,
                            self.scenario.suite,
                            sc.id.value,
                            node.id,
                            state.suffix,
                            self.repetition,
                            self.agent_id()
                        ),
                        expected_tools: self.expected_tools(state),
                    },
                )
                .await
            }
            Some(_) => criteria::check_planned(
                c,
                &self.shared.plan.templates,
                || scope.with_vars(vars),
                Scope::Turn,
                &state.turns,
                turn_index,
                criteria::Evidence {
                    sandbox: session.sandbox(),
                    tools_from_spans: self.agent_spans(),
                },
            ),
            // Validation rejects this; a plan built another way still must not pass a
            // check that looked at nothing.
            None => CriterionRecord {
                turn_index: None,
                criterion: c.criterion.text.clone(),
                kind: c.criterion.kind.name().to_string(),
                status: CriterionStatus::Failed,
                detail: Some("no agent turn before this `expect`".into()),
                judge: None,
            },
        }
    }

    /// A `hitl` step: the human's answer to an agent waiting for one. An agent that can
    /// pause (MultiAgentEval) and did not is a failed step; on other protocols there is
    /// nothing to answer.
    async fn answer_human(
        &self,
        session: &mut dyn Session,
        approve: bool,
        message: Option<&crate::render::CompiledTemplate>,
        replay: bool,
        state: &mut PathState,
        recorded: &mut Vec<Arc<TurnRecord>>,
    ) -> Option<Stop> {
        let verdict = if approve { "approve" } else { "reject" };
        if session.paused().is_none() {
            // Only an agent that can pause makes a `hitl` step without a pause a failure.
            if !self.shared.plan.agents[self.agent]
                .protocol
                .capabilities()
                .pauses
            {
                return None;
            }
            let last = state.turns.last();
            return Some(Stop::Failed(CriterionRecord {
                turn_index: last.map(|t| t.turn_index),
                criterion: format!("hitl {verdict}"),
                kind: "hitl".into(),
                status: CriterionStatus::Failed,
                detail: Some(match last.and_then(|t| t.reply.as_deref()) {
                    Some(reply) => format!(
                        "the agent did not pause for a human before this step; it answered: {}",
                        excerpt(reply)
                    ),
                    None => "the agent did not pause for a human before this step".to_string(),
                }),
                judge: None,
            }));
        }
        let text = match message {
            Some(template) => {
                let scope = &self.scenario.scope;
                let vars = &state.vars;
                match self
                    .shared
                    .plan
                    .templates
                    .render(template, || scope.with_vars(vars))
                {
                    Ok(text) => Some(text),
                    Err(e) => {
                        return Some(Stop::Fault(Fault::new(
                            FaultCategory::Template,
                            format!("hitl {verdict} message: {e}"),
                        )));
                    }
                }
            }
            None => None,
        };
        let input = TurnInput::Human {
            approve,
            message: text.as_deref(),
        };
        self.turn(session, input, replay, state, recorded).await
    }

    /// A `simulate` step: up to `turns` simulated user turns (`None`: until the simulator
    /// ends the conversation), never past the scenario's `max-turns` (or
    /// [`UNTIL_DONE_CAP`](crate::llm::simulator::UNTIL_DONE_CAP) turns without one).
    async fn simulate(
        &self,
        session: &mut dyn Session,
        turns: Option<u32>,
        (simulator, persona): (
            Option<&trellis_dsl::Simulator>,
            Option<&trellis_dsl::PersonaRef>,
        ),
        replay: bool,
        state: &mut PathState,
        recorded: &mut Vec<Arc<TurnRecord>>,
    ) -> Option<Stop> {
        use super::replay_users::Replayed;
        use crate::llm::runtime::{SimulateTask, Simulated};
        use crate::llm::simulator::{Said, UNTIL_DONE_CAP};
        let sc = &self.scenario.scenario;
        let limit = turns.unwrap_or_else(|| sc.max_turns.unwrap_or(UNTIL_DONE_CAP));
        for _ in 0..limit {
            if let Some(max) = sc.max_turns
                && state.taken().len() as u64 >= u64::from(max)
            {
                break;
            }
            // A stopping run (a signal, an LLM budget) starts no new simulator call.
            if self.shared.stop.is_cancelled() {
                return Some(Stop::Interrupted);
            }
            let task = SimulateTask {
                scenario: sc,
                turns: &state.turns,
                repetition: self.repetition,
                simulator,
                persona,
                templates: &self.shared.plan.templates,
                scope: &self.scenario.scope,
                vars: &state.vars,
                call_name: format!(
                    "simulated user turn {} on {}/{} (agent `{}`, repetition {}{})",
                    state.turns.len(),
                    self.scenario.suite,
                    sc.id.value,
                    self.agent_id(),
                    self.repetition,
                    self.attempt_note()
                ),
                attempt: self.attempt,
                // The scenario's `timeout` is the whole trajectory's: the simulated user's
                // time counts in it as the agent's does.
                deadline: sc.timeout.and_then(|t| {
                    tokio::time::Instant::now().checked_add(t.saturating_sub(state.active))
                }),
            };
            let turn_index = state.turns.len();
            // `--replay-users`: the recorded user's message while the agent answers as it
            // did in the recording; a fresh one from the first divergence on.
            let mut from_record = None;
            if let Some(replay) = self.shared.replay_users.as_deref() {
                let replayed = replay.next(
                    (&self.scenario.suite, &sc.id.value, self.agent_id()),
                    self.repetition,
                    &state.turns,
                );
                state.pending_user_source = Some(super::replay_users::source_of(&replayed));
                match replayed {
                    Replayed::Message(text) => {
                        let (brief, fidelity) = self.shared.llm.simulated_brief(&task);
                        if state.sim_brief.as_deref() != Some(brief.as_str()) {
                            state.sim_brief = Some(Arc::from(brief));
                        }
                        state.fidelity = fidelity;
                        from_record = Some(text);
                    }
                    Replayed::End => break,
                    Replayed::Fresh => {}
                }
            }
            let replayed = from_record.is_some();
            let simulated = match from_record {
                Some(text) => Ok(Simulated {
                    said: Said::Message(text),
                    calls: Vec::new(),
                    brief: String::new(),
                    fidelity: state.fidelity,
                    note: None,
                }),
                None => {
                    let asked = std::time::Instant::now();
                    let simulated = self.shared.llm.simulate(task).await;
                    // As for the agent's turns, time queued for the provider (its limits, a
                    // one-slot server busy with other trajectories) is not the trajectory's.
                    let calls = match &simulated {
                        Ok(s) => &s.calls,
                        Err((_, calls)) => calls,
                    };
                    let queued: f64 = calls.iter().map(|c| c.waited_ms).sum();
                    let queued = Duration::try_from_secs_f64(queued / 1000.0).unwrap_or_default();
                    state.active += asked.elapsed().saturating_sub(queued);
                    simulated
                }
            };
            let (text, last) = match simulated {
                Ok(Simulated {
                    said,
                    calls,
                    brief,
                    fidelity,
                    note,
                }) => {
                    state.pending_simulator.extend(calls);
                    if !replayed && state.sim_brief.as_deref() != Some(brief.as_str()) {
                        state.sim_brief = Some(Arc::from(brief));
                    }
                    state.fidelity = fidelity;
                    match said {
                        Said::Message(text) => (text, false),
                        Said::Last(text) => (text, true),
                        // Ended before any turn at all: no conversation for the checks to
                        // judge the agent on. The user ended without cause (breaking
                        // character, docs/simulator.md), or, with the guards off, the
                        // simulator failed; never a pass or a failure of the agent.
                        Said::End if state.turns.is_empty() => {
                            let why = "the simulated user ended the conversation before \
                                       saying anything";
                            if state.fidelity == Some(false) {
                                return Some(Stop::Fault(Fault::new(
                                    FaultCategory::Simulator,
                                    why,
                                )));
                            }
                            return Some(invalid(None, format!("{why} (turn {turn_index})")));
                        }
                        // The simulator ended the conversation: no turn to record the call
                        // on; it still counts in the trajectory's LLM usage.
                        Said::End => break,
                        // Every retry was empty: the simulator broke character.
                        Said::Unusable => {
                            let why = note.unwrap_or_default();
                            return Some(invalid(
                                u32::try_from(turn_index).ok(),
                                format!("empty message (turn {turn_index}): {why}"),
                            ));
                        }
                    }
                }
                Err((fault, calls)) => {
                    state.pending_simulator.extend(calls);
                    // The run stopped while the simulator was asked (a signal, or the LLM
                    // budget refusing this very call): as for a call not started, nothing
                    // below is recorded, rather than an `error` the agent never caused.
                    if self.shared.stop.is_cancelled() {
                        return Some(Stop::Interrupted);
                    }
                    return Some(Stop::Fault(fault));
                }
            };
            // The deterministic guards, before the message reaches the agent (a replayed
            // message passed them when it was written).
            if !replayed && state.fidelity != Some(false) {
                let previous = state.turns.last().map(|t| t.user_message.as_str());
                let replies = state.turns.iter().filter_map(|t| t.reply.as_deref());
                if let Some(why) = crate::llm::fidelity::guard(&text, previous, replies) {
                    return Some(invalid(
                        u32::try_from(turn_index).ok(),
                        format!("{why} (turn {turn_index})"),
                    ));
                }
            }
            if let Some(stop) = self
                .turn(session, TurnInput::User(&text), replay, state, recorded)
                .await
            {
                return Some(stop);
            }
            // A conversation going round in circles stops at its second cycle.
            if state.fidelity != Some(false)
                && let Some((period, first)) = crate::llm::fidelity::cycle(&state.turns)
            {
                let detail = crate::llm::fidelity::cycle_detail(period, first);
                let last = state.turns.last().map(|t| t.turn_index);
                return Some(invalid(last, detail));
            }
            // The agent can hang up too (`end_call`), as the simulator can with its marker.
            if last
                || state
                    .turns
                    .last()
                    .is_some_and(|t| crate::llm::simulator::agent_ended(t))
            {
                break;
            }
        }
        // A fresh mark left by a step the simulator ended belongs to no turn.
        state.pending_user_source = None;
        None
    }

    /// One turn on the path: `None` input is the agent's opening turn; otherwise a user
    /// message, or a function call when a function is named.
    /// One turn on the path, recorded on this node (`replay`: a replay of the prefix).
    pub(super) async fn turn(
        &self,
        session: &mut dyn Session,
        input: TurnInput<'_>,
        replay: bool,
        state: &mut PathState,
        recorded: &mut Vec<Arc<TurnRecord>>,
    ) -> Option<Stop> {
        let turn_index = u32::try_from(state.turns.len()).unwrap_or(u32::MAX);
        let Some((turn, branch)) = self
            .take_turn(session, input, turn_index, replay, state)
            .await
        else {
            return Some(Stop::Interrupted);
        };
        self.shared.totals.turns.fetch_add(1, Ordering::Relaxed);
        // The agent's own model, as the agent reports it (Fixie's LLM calls are counted
        // where they are made, and a model API under test request by request as it is
        // called: `CallContext::llm_meter`); a reused turn made no call.
        let model_api = self.shared.plan.agents[self.agent]
            .protocol
            .capabilities()
            .model_api;
        if !turn.reused
            && !model_api
            && turn.llm.is_empty()
            && (turn.prompt_tokens.is_some()
                || turn.completion_tokens.is_some()
                || turn.cost_usd.is_some())
        {
            self.shared.llm.meter().record_agent_turn(
                turn.prompt_tokens,
                turn.completion_tokens,
                turn.cost_usd,
            );
        }
        let fault = turn.fault.clone();
        let mut turn = turn;
        turn.simulator = std::mem::take(&mut state.pending_simulator);
        turn.user_source = state.pending_user_source.take();
        let turn = Arc::new(turn);
        recorded.push(turn.clone());
        state.turns.push(turn);
        match (fault, branch) {
            (Some(fault), _) => Some(Stop::Fault(fault)),
            (None, Some(branch)) => Some(Stop::Branch(branch)),
            (None, None) => None,
        }
    }
}

/// The stop of a path whose simulated user broke character at turn `turn` (a message a
/// guard refused is the turn it would have been): a failed fidelity check, which makes the
/// trajectory `invalid` unless a check failed on a turn before it (`verdict::status_of`).
fn invalid(turn: Option<u32>, detail: String) -> Stop {
    Stop::Failed(CriterionRecord {
        turn_index: turn,
        criterion: crate::llm::fidelity::CRITERION.to_owned(),
        kind: crate::llm::fidelity::FIDELITY_KIND.to_owned(),
        status: CriterionStatus::Failed,
        detail: Some(detail),
        judge: None,
    })
}

/// `stop-on-failure` on a replayed prefix: the first check recorded since `before` that
/// failed ends the path there, before the replay sends the rest of the prefix.
fn stop_on_failure(
    sc: &trellis_dsl::Scenario,
    state: &mut PathState,
    before: usize,
) -> Option<Stop> {
    if !sc.stop_on_failure {
        return None;
    }
    let at = before
        + state
            .criteria
            .get(before..)?
            .iter()
            .position(|c| c.status == CriterionStatus::Failed)?;
    Some(Stop::Failed(state.criteria.remove(at)))
}

fn branch_on_replay() -> Fault {
    Fault::new(
        FaultCategory::Protocol,
        "the agent asked to branch, but its conversation cannot be copied",
    )
}

/// The first 160 characters of an agent's text, for failure details.
fn excerpt(text: &str) -> String {
    let mut out: String = text.chars().take(160).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// The labels of the continuations of one branch action: a slug of each alternative
/// (lowercase ASCII letters, digits and `-`, at most 32 characters), `bK` (its 1-based
/// position) when that is empty or already taken.
pub(super) fn branch_labels(options: &[String]) -> Vec<String> {
    let mut labels: Vec<String> = Vec::with_capacity(options.len());
    for (i, option) in options.iter().enumerate() {
        let mut slug = String::new();
        for c in option.chars() {
            if c.is_ascii_alphanumeric() {
                slug.push(c.to_ascii_lowercase());
            } else if !slug.is_empty() && !slug.ends_with('-') {
                slug.push('-');
            }
            if slug.len() >= 32 {
                break;
            }
        }
        let slug = slug.trim_end_matches('-').to_string();
        let label = if slug.is_empty() || labels.contains(&slug) {
            format!("b{}", i + 1)
        } else {
            slug
        };
        labels.push(label);
    }
    labels
}

/// Runs a `capture` step on the path's last reply: the value goes into the path's vars, or
/// the failed check is returned.
fn capture_into(
    state: &mut PathState,
    name: &str,
    source: &CaptureSource,
) -> Result<(), CriterionRecord> {
    let last = state.turns.last();
    let reply = last.and_then(|t| t.reply.as_deref()).unwrap_or("");
    match capture(source, reply, last.and_then(|t| t.data.as_ref())) {
        Ok(value) => {
            state.vars.insert(name.to_owned(), value);
            Ok(())
        }
        Err(why) => Err(CriterionRecord {
            turn_index: state.turns.last().map(|t| t.turn_index),
            criterion: format!("capture {name}"),
            kind: "capture".into(),
            status: CriterionStatus::Failed,
            detail: Some(why),
            judge: None,
        }),
    }
}

/// Extracts a capture from the last reply; a JSON path reads the turn's structured data
/// when the agent sent some ([`criteria::json_path_node`]).
fn capture(
    source: &CaptureSource,
    reply: &str,
    data: Option<&serde_json::Value>,
) -> Result<String, String> {
    match source {
        CaptureSource::Regex(re) => {
            let caps = re.captures(reply).ok_or_else(|| {
                format!(
                    "/{}/ did not match the last reply: {}",
                    re.as_str(),
                    crate::record::shown::quoted(&reply.chars().take(160).collect::<String>())
                )
            })?;
            // The first group when the regex has one: an optional group that took no part
            // in the match captured nothing (the whole match is not what was asked for).
            if re.captures_len() > 1 {
                return match caps.get(1) {
                    Some(m) => Ok(m.as_str().to_string()),
                    None => Err(format!(
                        "/{}/ matched the last reply, but its first group took no part: {}",
                        re.as_str(),
                        crate::record::shown::quoted(&reply.chars().take(160).collect::<String>())
                    )),
                };
            }
            Ok(caps
                .get(0)
                .map(|m| m.as_str().to_string())
                .unwrap_or_default())
        }
        CaptureSource::JsonPath { path, source } => {
            Ok(match criteria::json_path_node(data, reply, path, source)? {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            })
        }
    }
}

/// Runs `branches` to their ends, concurrently; whether every one passed.
///
/// Not `join_all`: below 30 futures it polls every unfinished one whenever any is woken, so
/// a wake deep in a tree of forks polled every waiting branch above and beside it. A
/// scenario of four forks of ten branches (10,000 trajectories) took 874 ms to run and
/// most of it was polling; `FuturesUnordered` polls only the woken branch. A node with one
/// child, the common case, is awaited as it is.
async fn all_pass<F: Future<Output = bool>>(branches: Vec<F>) -> bool {
    use futures::StreamExt as _;
    if branches.len() <= 1 {
        let mut all = true;
        for branch in branches {
            all &= branch.await;
        }
        return all;
    }
    let mut running: futures::stream::FuturesUnordered<F> = branches.into_iter().collect();
    let mut all = true;
    // Every branch runs to its end: a failed one does not stop its siblings.
    while let Some(passed) = running.next().await {
        all &= passed;
    }
    all
}
