//! Reusing turns recorded by an earlier run (`trellis watch`): a conversation whose inputs
//! so far are exactly those of a recorded one gets the recorded answers instead of calling
//! the agent, and the agent is called only from the first input that differs.
//!
//! Turns are keyed by the unit (scenario × agent × repetition, salted by the caller: a new
//! salt, for instance after the agent's definition changed, reuses nothing) and by a hash
//! of every input of the conversation up to and including the turn. Every input that
//! reaches the agent is a [`TurnInput`]: a `capture` only matters through the messages it
//! renders and an `expect` never reaches the agent, so an edit to checks alone reuses every
//! turn and only re-checks.
//!
//! A turn that called tools is reused only while each of those tools answers as it did:
//! the salt leaves out what a tool answers (its mocks, state changes and policies, which
//! the agent is never told of: `trellis_engine::fingerprint`'s `salt`), and each kept
//! turn carries a digest of how the tools it called were defined ([`tools_digest`]), so
//! an edited mock makes only the turns that called that tool talk afresh.
//!
//! When the conversation first differs, the real session must be brought to where the
//! reused turns left it: a protocol that resends its history rebuilds it from the recorded
//! turns ([`Session::restore`]: Connexity, Fixie); a session bound to the agent's state
//! (AgentScope) has the reused prefix sent to the agent again first. A session that
//! can be rebuilt is rebuilt turn by turn as turns are reused, not only when the
//! conversation first differs: what it holds besides the conversation (a MultiAgentEval
//! session's tool sandbox and a pending pause or fork, rebuilt by acting on the recorded
//! replies again) is what criteria and the executor read after each turn.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;

use crate::protocol::{CallContext, Session, Turn, TurnInput};
use crate::record::Fault;
use crate::sandbox::SandboxSpec;

/// Agent calls made and turns reused for one scenario (`suite/scenario`) in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReuseCounts {
    /// Turns that called the agent (including a reused prefix sent again to a
    /// session-bound agent).
    pub called: u64,
    /// Turns answered from the records of an earlier run.
    pub reused: u64,
}

/// The recorded turns of earlier runs, shared by the runs of one `trellis watch` session.
/// Give it to a run through [`super::RunOptions::reuse`].
#[derive(Default)]
pub struct TurnMemo {
    state: Mutex<MemoState>,
}

#[derive(Default)]
struct MemoState {
    /// Per `suite/scenario`; a scenario without one reuses nothing.
    salts: HashMap<String, u64>,
    /// Each turn with the run that recorded it, and its scenario (`suite/scenario`) with the
    /// salt it was recorded under.
    turns: HashMap<(u64, u64), Recorded>,
    /// Scenarios a unit of the current run was started for.
    ran: HashSet<Arc<str>>,
    /// Counts [`TurnMemo::begin_run`]s: only turns of earlier runs are reused, so within a
    /// run every conversation goes to the agent as in `trellis run` (a session-bound
    /// protocol's replayed prefix included).
    run: u64,
    /// Entries used or stored by the current run: what the next run may still need.
    touched: HashSet<(u64, u64)>,
    counts: HashMap<String, ReuseCounts>,
}

/// A turn kept for later runs.
struct Recorded {
    run: u64,
    turn: Arc<Turn>,
    /// [`tools_digest`] of the turn's calls when it was recorded.
    tools: u64,
    scenario: Arc<str>,
    salt: Option<u64>,
}

impl std::fmt::Debug for TurnMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("TurnMemo")
            .field("turns", &state.turns.len())
            .field("scenarios", &state.salts.len())
            .finish()
    }
}

impl TurnMemo {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a run: `salts` maps each `suite/scenario` to the salt of its recorded turns
    /// (the same salt as before reuses them; a new one starts afresh).
    pub fn begin_run(&self, salts: HashMap<String, u64>) {
        let mut state = self.lock();
        state.salts = salts;
        state.run += 1;
        state.touched.clear();
        state.ran.clear();
        state.counts.clear();
    }

    /// Ends a run. A run that finished keeps what it used or recorded, and the turns of
    /// scenarios it did not run that are still as they were recorded (an unchanged scenario
    /// is not rerun, and a later edit of what it `needs` may want its turns again); the
    /// rest belongs to versions of the suite that no longer exist. A cancelled run keeps
    /// everything, since the next run may still need what it did not reach.
    pub fn finish_run(&self, finished: bool) {
        let mut state = self.lock();
        if finished {
            let touched = std::mem::take(&mut state.touched);
            let ran = std::mem::take(&mut state.ran);
            let salts = std::mem::take(&mut state.salts);
            state.turns.retain(|key, kept| {
                touched.contains(key)
                    || (!ran.contains(&kept.scenario)
                        && kept.salt.is_some()
                        && salts.get(&*kept.scenario) == kept.salt.as_ref())
            });
            state.salts = salts;
        }
    }

    /// Calls and reuses per `suite/scenario` since [`TurnMemo::begin_run`].
    pub fn counts(&self) -> HashMap<String, ReuseCounts> {
        self.lock().counts.clone()
    }

    /// Total agent calls since [`TurnMemo::begin_run`].
    pub fn calls(&self) -> u64 {
        self.lock().counts.values().map(|c| c.called).sum()
    }

    /// Of the scenarios of `now` (`suite/scenario` → the salt its turns are kept under and
    /// its sandbox as defined now), those a rerun after an edit to what tools answer could
    /// call the agent for: with a kept turn that called a tool the sandbox now defines
    /// differently, or with no turn kept at all. One pass over the kept turns, whatever the
    /// number of scenarios (a dataset's thousands after an edit of a shared tool's mock).
    pub fn calls_changed_tools(&self, now: &HashMap<&str, (u64, &SandboxSpec)>) -> HashSet<String> {
        let kept: Vec<(Arc<str>, Arc<Turn>, u64)> = {
            let state = self.lock();
            state
                .turns
                .values()
                .filter(|k| {
                    now.get(&*k.scenario)
                        .is_some_and(|(salt, _)| k.salt == Some(*salt))
                })
                .map(|k| (k.scenario.clone(), k.turn.clone(), k.tools))
                .collect()
        };
        // The tools' definitions are printed for their digests outside the lock.
        let mut with_turns: HashSet<&str> = HashSet::new();
        let mut changed: HashSet<String> = HashSet::new();
        for (scenario, turn, tools) in &kept {
            with_turns.insert(scenario);
            if changed.contains(&**scenario) || turn.tool_calls.is_empty() {
                continue;
            }
            if let Some((_, sandbox)) = now.get(&**scenario)
                && *tools != tools_digest(turn, sandbox)
            {
                changed.insert(scenario.to_string());
            }
        }
        changed.extend(
            now.keys()
                .filter(|s| !with_turns.contains(*s))
                .map(|s| (*s).to_owned()),
        );
        changed
    }

    /// How many turns are kept.
    pub fn len(&self) -> usize {
        self.lock().turns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `session`, served from the records of this unit while its inputs match them.
    pub(super) fn wrap(
        self: &Arc<Self>,
        session: Box<dyn Session>,
        suite: &str,
        scenario: &str,
        agent: &str,
        repetition: u32,
        sandbox: &Arc<SandboxSpec>,
    ) -> Box<dyn Session> {
        let name: Arc<str> = Arc::from(format!("{suite}/{scenario}"));
        let salt = {
            let mut state = self.lock();
            state.ran.insert(name.clone());
            state.salts.get(&*name).copied()
        };
        let unit = {
            let mut h = DefaultHasher::new();
            (salt, suite, scenario, agent, repetition).hash(&mut h);
            h.finish()
        };
        let reusable = salt.is_some();
        Box::new(ReusingSession {
            memo: self.clone(),
            name,
            unit,
            sandbox: sandbox.clone(),
            inner: session,
            pending: Vec::new(),
            prefix: 0,
            attached: !reusable,
            rebuilds: true,
        })
    }

    fn reused(
        &self,
        unit: u64,
        prefix: u64,
        name: &str,
        sandbox: &SandboxSpec,
    ) -> Option<Arc<Turn>> {
        let (turn, tools) = {
            let state = self.lock();
            match state.turns.get(&(unit, prefix)) {
                Some(kept) if kept.run < state.run => (kept.turn.clone(), kept.tools),
                _ => return None,
            }
        };
        // Outside the lock, which every unit of the run takes: a digest prints the
        // definitions of the tools the turn called.
        if tools != tools_digest(&turn, sandbox) {
            return None;
        }
        let mut state = self.lock();
        state.touched.insert((unit, prefix));
        state.counts.entry(name.to_owned()).or_default().reused += 1;
        Some(turn)
    }

    fn called(&self, name: &str) {
        self.lock()
            .counts
            .entry(name.to_owned())
            .or_default()
            .called += 1;
    }

    fn store(
        &self,
        unit: u64,
        prefix: u64,
        turn: Turn,
        scenario: &Arc<str>,
        sandbox: &SandboxSpec,
    ) {
        let tools = tools_digest(&turn, sandbox);
        let mut state = self.lock();
        state.touched.insert((unit, prefix));
        let recorded = Recorded {
            run: state.run,
            tools,
            turn: Arc::new(turn),
            scenario: scenario.clone(),
            salt: state.salts.get(&**scenario).copied(),
        };
        state.turns.insert((unit, prefix), recorded);
    }
}

/// How the tools `turn` called are defined now: their names with their answers, state
/// changes and policies (a tool the sandbox does not declare, by its name alone). A turn
/// without tool calls depends on no tool's definition.
fn tools_digest(turn: &Turn, sandbox: &SandboxSpec) -> u64 {
    if turn.tool_calls.is_empty() {
        return 0;
    }
    let mut names: Vec<&str> = turn.tool_calls.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let mut h = DefaultHasher::new();
    for name in names {
        let spec = sandbox
            .tools
            .get(name)
            .or_else(|| sandbox.shared_tools.get(name));
        (name, spec.map(|spec| format!("{spec:?}"))).hash(&mut h);
    }
    h.finish()
}

/// A [`TurnInput`] kept past the turn.
#[derive(Clone, Debug)]
enum OwnedInput {
    User(String),
    Opening,
    Call {
        function: String,
        input: String,
    },
    Human {
        approve: bool,
        message: Option<String>,
    },
    Branch {
        index: usize,
        count: usize,
        option: String,
    },
}

impl OwnedInput {
    fn of(input: TurnInput<'_>) -> Self {
        match input {
            TurnInput::User(text) => OwnedInput::User(text.to_owned()),
            TurnInput::Opening => OwnedInput::Opening,
            TurnInput::Call { function, input } => OwnedInput::Call {
                function: function.to_owned(),
                input: input.to_owned(),
            },
            TurnInput::Human { approve, message } => OwnedInput::Human {
                approve,
                message: message.map(str::to_owned),
            },
            TurnInput::Branch {
                index,
                count,
                option,
            } => OwnedInput::Branch {
                index,
                count,
                option: option.to_owned(),
            },
        }
    }

    fn as_input(&self) -> TurnInput<'_> {
        match self {
            OwnedInput::User(text) => TurnInput::User(text),
            OwnedInput::Opening => TurnInput::Opening,
            OwnedInput::Call { function, input } => TurnInput::Call { function, input },
            OwnedInput::Human { approve, message } => TurnInput::Human {
                approve: *approve,
                message: message.as_deref(),
            },
            OwnedInput::Branch {
                index,
                count,
                option,
            } => TurnInput::Branch {
                index: *index,
                count: *count,
                option,
            },
        }
    }
}

/// The hash of a conversation's inputs after `input`.
fn extend(prefix: u64, input: TurnInput<'_>) -> u64 {
    let mut h = DefaultHasher::new();
    prefix.hash(&mut h);
    match input {
        TurnInput::User(text) => (0u8, text).hash(&mut h),
        TurnInput::Opening => 1u8.hash(&mut h),
        TurnInput::Call { function, input } => (2u8, function, input).hash(&mut h),
        TurnInput::Human { approve, message } => (3u8, approve, message).hash(&mut h),
        TurnInput::Branch {
            index,
            count,
            option,
        } => (4u8, index, count, option).hash(&mut h),
    }
    h.finish()
}

struct ReusingSession {
    memo: Arc<TurnMemo>,
    /// `suite/scenario`, for the counts.
    name: Arc<str>,
    unit: u64,
    /// The scenario's tools as defined now, for [`tools_digest`].
    sandbox: Arc<SandboxSpec>,
    inner: Box<dyn Session>,
    /// Turns answered from records that `inner` has not taken.
    pending: Vec<(OwnedInput, Arc<Turn>)>,
    /// Hash of every input so far.
    prefix: u64,
    /// `inner` carries the conversation: every turn from now on calls the agent.
    attached: bool,
    /// `inner` has been rebuilt with every reused turn so far (it can be, and nothing is
    /// pending): later reused turns are rebuilt into it too.
    rebuilds: bool,
}

impl ReusingSession {
    /// Brings `inner` to where the reused turns left the conversation; a fault when the
    /// agent, asked again for the prefix, failed.
    async fn attach(&mut self, ctx: &CallContext<'_>) -> Option<Fault> {
        self.attached = true;
        let pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            return None;
        }
        let history: Vec<(TurnInput<'_>, &Turn)> = pending
            .iter()
            .map(|(input, turn)| (input.as_input(), turn.as_ref()))
            .collect();
        if self.inner.restore(&history) {
            return None;
        }
        // Session-bound: the agent must hear the prefix again to hold the same state.
        for (index, (input, _)) in pending.iter().enumerate() {
            let ctx = CallContext {
                test_case_id: ctx.test_case_id,
                turn_index: u32::try_from(index).unwrap_or(u32::MAX),
                deadline: ctx.deadline,
                turn_headers: ctx.turn_headers,
                system_prompt: ctx.system_prompt,
                llm_meter: ctx.llm_meter,
            };
            let turn = self.inner.turn(input.as_input(), &ctx).await;
            self.memo.called(&self.name);
            if let Some(fault) = turn.fault {
                return Some(Fault::new(
                    fault.category,
                    format!(
                        "sending the unchanged prefix again to this session-bound agent: {}",
                        fault.message
                    ),
                ));
            }
        }
        None
    }
}

impl Session for ReusingSession {
    fn turn<'a>(
        &'a mut self,
        input: TurnInput<'a>,
        ctx: &'a CallContext<'a>,
    ) -> BoxFuture<'a, Turn> {
        Box::pin(async move {
            let prefix = extend(self.prefix, input);
            if !self.attached
                && let Some(turn) = self
                    .memo
                    .reused(self.unit, prefix, &self.name, &self.sandbox)
            {
                self.prefix = prefix;
                let mut answer = (*turn).clone();
                answer.reused = true;
                self.rebuilds = self.rebuilds && self.inner.restore(&[(input, turn.as_ref())]);
                if !self.rebuilds {
                    self.pending.push((OwnedInput::of(input), turn));
                }
                return answer;
            }
            if !self.attached
                && let Some(fault) = self.attach(ctx).await
            {
                return Turn::failed(fault);
            }
            // Counted as it is made: a call a newer save cut off reached the agent all the
            // same ("stopped by a newer save (0 agent calls made)" after one was sent).
            self.memo.called(&self.name);
            let mut turn = self.inner.turn(input, ctx).await;
            self.prefix = prefix;
            // The agent's spans come after the answer: the executor puts them here, and the
            // turn answered again from the records carries them.
            turn.spans_for_reuse = Some(Default::default());
            // A fault is kept too: the same conversation is answered the same way until
            // its steps change (an edit to checks alone never calls the agent). Not one of
            // reaching the agent: an agent that was down answers nothing of the
            // conversation, and replaying its "connection refused" once it is back up
            // reported an agent that works as refusing connections until a step changed.
            if !turn.fault.as_ref().is_some_and(unreachable) {
                self.memo
                    .store(self.unit, prefix, turn.clone(), &self.name, &self.sandbox);
            }
            turn
        })
    }

    fn fork(&self) -> Option<Box<dyn Session>> {
        let inner = self.inner.fork()?;
        Some(Box::new(ReusingSession {
            memo: self.memo.clone(),
            name: self.name.clone(),
            unit: self.unit,
            sandbox: self.sandbox.clone(),
            inner,
            pending: self.pending.clone(),
            prefix: self.prefix,
            attached: self.attached,
            rebuilds: self.rebuilds,
        }))
    }

    fn sandbox(&self) -> Option<&crate::sandbox::Sandbox> {
        self.inner.sandbox()
    }

    fn paused(&self) -> Option<&str> {
        self.inner.paused()
    }

    fn restore(&mut self, history: &[(TurnInput<'_>, &Turn)]) -> bool {
        self.inner.restore(history)
    }

    fn set_template_scope(&mut self, scope: &dyn Fn() -> minijinja::Value) {
        self.inner.set_template_scope(scope);
    }
}

/// Whether `fault` says the agent could not be reached at all (down, not started, rate
/// limited past waiting) rather than how it answered this conversation: such a turn is
/// asked again by the next rerun instead of being replayed. A 5xx, a timeout or a reset
/// mid-answer may be how the agent takes this very conversation, and stay kept.
pub fn unreachable(fault: &crate::record::Fault) -> bool {
    use crate::record::FaultCategory as C;
    matches!(fault.category, C::Connect | C::Setup) || fault.rate_limited.is_some()
}
