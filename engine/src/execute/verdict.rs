//! Building trajectory records: the trajectory-level checks, and the status that follows
//! from every check and fault on the path.
//!
//! The rule: a fault makes the trajectory `error`; a failed check makes it `failed`; it
//! passes only when at least one check was evaluated and none failed. A trajectory whose
//! every declared check was skipped, or that declares no check at all, is `skipped`, never
//! passed: nothing counts as passed that was not checked (an author who only wants "the
//! agent answered without a fault" says so with `expect no-error`). With `--strict`, a
//! skipped check or a skipped trajectory is a failure.
//!
//! Fidelity checks (`kind = "fidelity"`, on the simulated user, not the agent) stand apart:
//! a failed one makes the trajectory `invalid` (only a fault of the agent ranks above it),
//! and a passed one never makes a trajectory pass.

use trellis_dsl::CriterionKind;

use super::walk::{PathState, Unit};
use super::{Shared, ms};
use crate::criteria::{self, Scope};
use crate::llm::LlmRuntime;
use crate::llm::runtime::JudgeTask;
use crate::plan::{PlannedCriterion, PlannedScenario};
use crate::protocol::Session;
use crate::record::{
    CriterionRecord, CriterionStatus, FIDELITY_KIND, Fault, TrajectoryRecord, TrajectoryStatus,
};

/// Judges one criterion, unless the run is stopped first: a stop (Ctrl-C, SIGTERM) while a
/// judge is still thinking records the check as not run, so the trajectory, whose
/// conversation is complete, is kept instead of lost with the abandoned call. Judges on a
/// slow local model take long enough for this to matter.
pub(super) async fn judge_unless_stopped<T: AsRef<crate::record::TurnRecord>>(
    shared: &super::Shared,
    task: JudgeTask<'_, T>,
) -> CriterionRecord {
    // A check no judge would answer is skipped for that reason, stopped or not: "stopped
    // before the judge answered" said of it was false, and `--resume` ran it again for
    // nothing.
    if !shared.llm.would_ask_a_judge(task.kind) {
        return shared.llm.judge(task).await;
    }
    let (criterion, kind, turn_index) = (
        task.criterion_text.to_owned(),
        task.kind.name().to_string(),
        task.turn_index,
    );
    // A run already stopping (a signal, an LLM budget) starts no judge call; one under way
    // is abandoned for a signal only.
    tokio::select! {
        biased;
        () = shared.abandon_judging() => {
            shared.note_cut_short();
            CriterionRecord {
                turn_index,
                criterion,
                kind,
                status: CriterionStatus::Skipped,
                detail: Some(crate::record::CUT_BY_STOP.into()),
                judge: None,
            }
        },
        // Boxed: the judge call is most of this future's size, and the verdicts and checks
        // that await this one were that large for every trajectory, judged or not.
        record = Box::pin(shared.llm.judge(task)) => record,
    }
}

/// An `expect` check a stop left unreached.
pub(super) struct Unreached<'a> {
    pub criterion: &'a PlannedCriterion,
    /// How many turns after the one the stop took (or failed to take) its `expect` comes:
    /// 0 for a check of that turn; `None` past a step that takes a number of turns only
    /// its run knows (`simulate`, `attack`, `hitl`).
    pub turns_later: Option<u32>,
}

/// Why a path stopped before its last step.
#[derive(Clone)]
pub(super) enum Stop {
    Fault(Fault),
    Failed(CriterionRecord),
    /// The run is stopping: nothing below this node is recorded.
    Interrupted,
    /// The node ends with an `attack`: the search continues the path (`attack.rs`).
    Attack(std::sync::Arc<trellis_dsl::Attack>),
    /// The agent asked to fork the conversation here (not an end: each alternative
    /// continues the path).
    Branch(crate::protocol::BranchRequest),
}

impl Unit<'_> {
    /// Records trajectory `t` of this unit; returns whether it passed.
    pub(super) async fn finish_trajectory(
        &self,
        t: usize,
        state: &PathState,
        stop: Option<Stop>,
        unreached: Vec<Unreached<'_>>,
        session: Option<&dyn Session>,
    ) -> bool {
        let sc = &self.scenario.scenario;
        let sandbox = session.and_then(|s| s.sandbox());
        let mut criteria = state.criteria.clone();
        let mut fault = None;
        // Why the trajectory-level checks were not run, when it stopped early.
        let not_checked = match stop {
            Some(Stop::Fault(f)) => {
                let why = format!(
                    "not checked: the trajectory ended with its fault ({})",
                    f.category.as_str()
                );
                fault = Some(f);
                Some(why)
            }
            Some(Stop::Failed(c)) => {
                let why = if c.kind == FIDELITY_KIND {
                    "not checked: the simulated user broke character".to_owned()
                } else {
                    crate::record::stopped_at_detail(&c.criterion)
                };
                criteria.push(c);
                Some(why)
            }
            Some(Stop::Interrupted) => {
                self.shared.note_cut_short();
                Some(crate::record::CUT_MID_WALK.to_string())
            }
            // Never an end (a fork or an attack continues the path); checked as if it were
            // not there.
            Some(Stop::Branch(_) | Stop::Attack(_)) | None => None,
        };
        // The fidelity judge reads a finished conversation with simulated turns first: when
        // the simulated user broke character, the agent's checks are not worth a judge call.
        let mut not_checked = not_checked;
        if not_checked.is_none()
            && let Some(mut record) = self.judge_fidelity(t, state).await
        {
            // The judge reads the simulated turns as a whole: the break is placed at the
            // first of them, so a check that failed on a scripted turn before it stays the
            // agent's failure (`status_of`).
            if record.turn_index.is_none() {
                record.turn_index = state
                    .turns
                    .iter()
                    .find(|turn| written_by_simulator(turn))
                    .map(|turn| turn.turn_index);
            }
            if record.status == CriterionStatus::Failed {
                not_checked = Some("not checked: the simulated user broke character".to_owned());
            }
            criteria.push(record);
        }
        // The agent's checks of the turns from the break on answered a user who was not the
        // scenario's: they are not about the agent, whichever way they went.
        if let Some(at) = criteria
            .iter()
            .find(|c| c.kind == FIDELITY_KIND && c.status == CriterionStatus::Failed)
            .map(|c| c.turn_index)
        {
            for c in criteria.iter_mut().filter(|c| {
                c.kind != FIDELITY_KIND
                    && c.status != CriterionStatus::Skipped
                    && at.is_none_or(|at| c.turn_index.is_none_or(|i| i >= at))
            }) {
                c.status = CriterionStatus::Skipped;
                c.detail = Some("not checked: the simulated user broke character".to_owned());
            }
        }
        // The `expect`s of the steps the stop left unreached. An `expect no-error` of the
        // turn a fault stopped is answered by that fault, as in `criteria { }` below.
        let faulted_turn = state.turns.iter().find(|t| t.fault.is_some()).map(|t| &**t);
        if let Some(why) = &not_checked {
            criteria.extend(unreached.into_iter().map(|u| {
                let c = &u.criterion.criterion;
                let on_stopped_turn = u.turns_later == Some(0);
                match &fault {
                    Some(f) if on_stopped_turn && matches!(c.kind, CriterionKind::NoError) => {
                        CriterionRecord {
                            turn_index: faulted_turn.map(|t| t.turn_index),
                            criterion: c.text.clone(),
                            kind: c.kind.name().to_string(),
                            status: CriterionStatus::Failed,
                            detail: Some(fault_detail(faulted_turn, f)),
                            judge: None,
                        }
                    }
                    // A check of the turn the stop took names that turn, whose row is in
                    // the tables; one of a later step the turn it would have checked (no
                    // row has it), so a check keeps one key from run to run whether it was
                    // reached or not, apart from a trajectory-level check of the same text.
                    _ => CriterionRecord {
                        turn_index: u.turns_later.and_then(|later| {
                            let stopped =
                                state.turns.last().map_or(-1, |t| i64::from(t.turn_index));
                            u32::try_from(stopped + i64::from(later)).ok()
                        }),
                        criterion: c.text.clone(),
                        kind: c.kind.name().to_string(),
                        status: CriterionStatus::Skipped,
                        detail: Some(why.clone()),
                        judge: None,
                    },
                }
            }));
        }
        for c in self.scenario.criteria.iter() {
            criteria.push(match (&not_checked, &fault) {
                // The fault that stopped the trajectory is exactly what `no-error` looks
                // for: its answer is known, so it fails rather than going unchecked.
                (Some(_), Some(f)) if matches!(c.criterion.kind, CriterionKind::NoError) => {
                    CriterionRecord {
                        turn_index: None,
                        criterion: c.criterion.text.clone(),
                        kind: c.criterion.kind.name().to_string(),
                        status: CriterionStatus::Failed,
                        detail: Some(fault_detail(faulted_turn, f)),
                        judge: None,
                    }
                }
                (None, _) if LlmRuntime::is_judged(&c.criterion.kind) => {
                    match criteria::judged_kind(c, &self.shared.plan.templates, || {
                        self.scenario.scope.with_vars(&state.vars)
                    }) {
                        Err(e) => criteria::unrendered_statement(&c.criterion, None, &e),
                        Ok(kind) => {
                            judge_unless_stopped(
                                self.shared,
                                JudgeTask {
                                    draw: 0,
                                    criterion_text: &c.criterion.text,
                                    kind: &kind,
                                    scenario: sc,
                                    turns: &state.turns,
                                    turn_index: None,
                                    repetition: self.repetition,
                                    call_name: self.judge_call_name(t, state, &c.criterion.text),
                                    expected_tools: self.expected_tools(state),
                                },
                            )
                            .await
                        }
                    }
                }
                (None, _) => criteria::check_planned(
                    c,
                    &self.shared.plan.templates,
                    || self.scenario.scope.with_vars(&state.vars),
                    Scope::Trajectory,
                    state.taken(),
                    None,
                    criteria::Evidence {
                        sandbox,
                        tools_from_spans: self.agent_spans(),
                    },
                ),
                // Recorded anyway, so every trajectory lists the same checks and a
                // criterion's pass rate counts the trajectories that never got to it.
                (Some(why), _) => CriterionRecord {
                    turn_index: None,
                    criterion: c.criterion.text.clone(),
                    kind: c.criterion.kind.name().to_string(),
                    status: CriterionStatus::Skipped,
                    detail: Some(why.clone()),
                    judge: None,
                },
            });
        }
        for outcome in &sc.outcomes {
            let text = crate::llm::judge::outcome_text(&outcome.value);
            criteria.push(match &not_checked {
                None => {
                    // A statement written as a template is read by the judge rendered, in
                    // the trajectory's scope at its end.
                    let kind = CriterionKind::Outcome(outcome.value.clone());
                    let rendered = crate::render::statement_rendered(&kind, |statement| {
                        self.shared
                            .plan
                            .templates
                            .render_source(statement, || self.scenario.scope.with_vars(&state.vars))
                    });
                    match rendered {
                        Err(e) => CriterionRecord {
                            turn_index: None,
                            criterion: text,
                            kind: "outcome".into(),
                            status: CriterionStatus::Error,
                            detail: Some(crate::render::unrendered_detail(&e)),
                            judge: None,
                        },
                        Ok(kind) => {
                            judge_unless_stopped(
                                self.shared,
                                JudgeTask {
                                    draw: 0,
                                    criterion_text: &text,
                                    kind: &kind,
                                    scenario: sc,
                                    turns: &state.turns,
                                    turn_index: None,
                                    repetition: self.repetition,
                                    call_name: self.judge_call_name(t, state, &text),
                                    expected_tools: self.expected_tools(state),
                                },
                            )
                            .await
                        }
                    }
                }
                Some(why) => CriterionRecord {
                    turn_index: None,
                    criterion: text,
                    kind: "outcome".into(),
                    status: CriterionStatus::Skipped,
                    detail: Some(why.clone()),
                    judge: None,
                },
            });
        }
        let strict = self.shared.strict;
        let (status, skip_reason) = status_of(fault.is_some(), &criteria, strict);
        let llm = crate::llm::LlmUsage::of(
            state
                .turns
                .iter()
                .flat_map(|t| t.simulator.iter().chain(&t.llm))
                .chain(&state.pending_simulator)
                .chain(&state.shared_calls),
            &criteria,
        )
        .map(Box::new);
        let record = TrajectoryRecord {
            suite: String::from(&*self.scenario.suite),
            scenario: sc.id.value.clone(),
            trajectory: [&*self.scenario.trajectories[t].name, &*state.suffix].concat(),
            agent: self.agent_id().to_string(),
            protocol: self.shared.plan.agents[self.agent]
                .protocol
                .as_str()
                .to_string(),
            repetition: self.repetition,
            nodes: state.nodes.iter().map(|n| String::from(&**n)).collect(),
            status,
            turns: u32::try_from(state.taken().len()).unwrap_or(u32::MAX),
            duration_ms: ms(state.active),
            fault,
            skip_reason,
            criteria,
            tags: self.scenario.tags.clone(),
            agent_branches: state.agent_branches.clone(),
            awaiting_human: session.and_then(|s| s.paused()).map(str::to_owned),
            sandbox_state: sandbox.map(|s| s.state().clone()),
            captures: state.vars.clone(),
            llm,
            attack: state.attack.clone().map(Box::new),
        };
        self.mark_recorded(t);
        self.set_outcome(t, status);
        self.shared.record(record).await;
        status == TrajectoryStatus::Passed
    }

    /// The fidelity judge on trajectory `t`'s simulated turns; `None` when it has none,
    /// fidelity is off, or no judge exists and fidelity was not asked for.
    async fn judge_fidelity(&self, t: usize, state: &PathState) -> Option<CriterionRecord> {
        // An attack path's user is the attacker, with no persona to stay in.
        if state.fidelity == Some(false) || state.attack.is_some() {
            return None;
        }
        let messages: Vec<&str> = state
            .turns
            .iter()
            .filter(|turn| written_by_simulator(turn))
            .map(|turn| turn.user_message.as_str())
            .collect();
        if messages.is_empty() {
            return None;
        }
        let brief = state.sim_brief.as_deref().unwrap_or("");
        let name = self.judge_call_name(t, state, crate::llm::fidelity::CRITERION);
        // Boxed: the judge call is most of this future's size, which every trajectory's
        // verdict carried whether or not it had a simulated user.
        let judging = Box::pin(self.shared.llm.judge_fidelity(
            brief,
            &messages,
            state.fidelity == Some(true),
            self.repetition,
            &name,
        ));
        tokio::select! {
            biased;
            // Recorded as not judged: the trajectory has no verdict until it is run again.
            () = self.shared.abandon_judging() => {
                self.shared.note_cut_short();
                Some(CriterionRecord {
                    turn_index: None,
                    criterion: crate::llm::fidelity::CRITERION.to_owned(),
                    kind: FIDELITY_KIND.to_owned(),
                    status: CriterionStatus::Skipped,
                    detail: Some(crate::record::CUT_BY_STOP.into()),
                    judge: None,
                })
            }
            record = judging => record,
        }
    }

    /// The scenario's `expect-tool` calls as a judge asked on `state`'s path is shown them:
    /// rendered in the path's scope, captures included, as their checks are.
    pub(super) fn expected_tools(
        &self,
        state: &PathState,
    ) -> Vec<(String, serde_json::Map<String, serde_json::Value>)> {
        crate::render::expected_tools_rendered(&self.scenario.scenario, |text| {
            self.shared
                .plan
                .templates
                .render_source(text, || self.scenario.scope.with_vars(&state.vars))
                .ok()
        })
    }

    /// How a judge call of trajectory `t` is named in a replay-only cache miss.
    fn judge_call_name(&self, t: usize, state: &PathState, criterion: &str) -> String {
        format!(
            "judge of `{criterion}` on {}/{} trajectory `{}{}` repetition {} (agent `{}`)",
            self.scenario.suite,
            self.scenario.scenario.id.value,
            self.scenario.trajectories[t].name,
            state.suffix,
            self.repetition,
            self.agent_id()
        )
    }

    /// Ends every trajectory of the unit not recorded yet with `fault`, before any turn
    /// (an agent that could not be set up, a bug that stopped the walk).
    pub(super) async fn fault_unrecorded(&self, fault: &Fault) {
        let root = &self.scenario.nodes[self.scenario.root()];
        for t in 0..self.scenario.trajectories.len() {
            if !self.is_recorded(t) {
                let unreached = self.expects_after(root, 0, t, false);
                let stop = Some(Stop::Fault(fault.clone()));
                self.finish_trajectory(t, &PathState::empty(), stop, unreached, None)
                    .await;
            }
        }
    }

    pub(super) async fn skip(&self, t: usize, reason: &str) {
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
}

/// A turn whose user message the simulated user wrote (or a `--replay-users` replay of one):
/// what the fidelity judge reads.
fn written_by_simulator(turn: &crate::record::TurnRecord) -> bool {
    !turn.simulator.is_empty() || turn.user_source.is_some()
}

/// What `no-error` says of the fault that stopped a trajectory (on `turn`, when a turn took
/// it).
fn fault_detail(turn: Option<&crate::record::TurnRecord>, f: &Fault) -> String {
    match turn {
        Some(t) => format!(
            "turn {}: {} fault: {}",
            t.turn_index,
            f.category.as_str(),
            f.message
        ),
        None => format!("{} fault: {}", f.category.as_str(), f.message),
    }
}

/// The status a trajectory gets from its fault and checks, and why it was skipped when it
/// was.
pub(super) fn status_of(
    faulted: bool,
    criteria: &[CriterionRecord],
    strict: bool,
) -> (TrajectoryStatus, Option<String>) {
    if faulted {
        return (TrajectoryStatus::Error, None);
    }
    // The simulated user broke character: the conversation says nothing about the agent.
    let (fidelity, criteria): (Vec<&CriterionRecord>, Vec<&CriterionRecord>) =
        criteria.iter().partition(|c| c.kind == FIDELITY_KIND);
    if let Some(broken) = fidelity
        .iter()
        .find(|c| c.status == CriterionStatus::Failed)
    {
        // Unless the agent had already failed a check on a turn before the break (a
        // scripted turn, or one a guard found in character): that failure is the agent's,
        // whatever the simulated user did after it. So is a check there whose judge
        // failed: left out with the invalid trajectory, a broken judge went unseen.
        let decided_before = broken.turn_index.is_some_and(|at| {
            criteria.iter().any(|c| {
                matches!(c.status, CriterionStatus::Failed | CriterionStatus::Error)
                    && c.turn_index.is_some_and(|i| i < at)
            })
        });
        if !decided_before {
            return (TrajectoryStatus::Invalid, None);
        }
    }
    // A check whose evaluator failed (a judge; the fidelity judge missing from a replay-only
    // cache) leaves the trajectory undecided: an error, never a pass.
    if fidelity
        .iter()
        .chain(&criteria)
        .any(|c| c.status == CriterionStatus::Error)
    {
        return (TrajectoryStatus::Error, None);
    }
    let failed = criteria.iter().any(|c| c.status == CriterionStatus::Failed);
    if failed {
        return (TrajectoryStatus::Failed, None);
    }
    // A stop left a check unjudged: nothing failed, but not everything was checked, so
    // not a pass either (`trellis run --resume` runs it again).
    if fidelity.iter().chain(&criteria).any(|c| c.cut_by_stop()) {
        return (
            TrajectoryStatus::Skipped,
            Some(
                "the run was stopped before all its checks were judged (`trellis run \
                 --resume` runs it again)"
                    .to_owned(),
            ),
        );
    }
    if criteria.is_empty() {
        let status = if strict {
            TrajectoryStatus::Failed
        } else {
            TrajectoryStatus::Skipped
        };
        return (status, Some(NO_CHECKS.to_string()));
    }
    let skipped = criteria
        .iter()
        .filter(|c| c.status == CriterionStatus::Skipped)
        .count();
    // Under --strict a check that did not run fails, the simulated user's fidelity check
    // too: whether the conversation says anything about the agent is then unknown.
    let fidelity_unknown = fidelity
        .iter()
        .any(|c| c.status == CriterionStatus::Skipped);
    if (skipped > 0 || fidelity_unknown) && strict {
        return (TrajectoryStatus::Failed, None);
    }
    if skipped > 0 && skipped == criteria.len() {
        // Why, as the first check says it ("not judged: no judge configured"): the count
        // alone left the reader to open the report to learn what to fix.
        let why = criteria
            .iter()
            .find_map(|c| c.detail.as_deref())
            .map(|d| {
                let first = d.lines().next().unwrap_or(d);
                match first.char_indices().nth(160) {
                    Some((at, _)) => format!(" ({}…)", &first[..at]),
                    None => format!(" ({first})"),
                }
            })
            .unwrap_or_default();
        let reason = format!(
            "none of its {skipped} check{} could be evaluated{why}",
            if skipped == 1 { "" } else { "s" }
        );
        return (TrajectoryStatus::Skipped, Some(reason));
    }
    (TrajectoryStatus::Passed, None)
}

/// Why a trajectory without a single check is skipped.
pub(crate) const NO_CHECKS: &str = "no checks: nothing on its path is checked; add `expect no-error` if a fault-free run is \
     what it tests";

pub(super) async fn skip_trajectory(
    shared: &Shared,
    scenario: &PlannedScenario,
    agent: usize,
    repetition: u32,
    t: usize,
    reason: &str,
) {
    let record = TrajectoryRecord {
        suite: String::from(&*scenario.suite),
        scenario: scenario.scenario.id.value.clone(),
        trajectory: scenario.trajectories[t].name.clone(),
        agent: shared.plan.agents[agent].id.to_string(),
        protocol: shared.plan.agents[agent].protocol.as_str().to_string(),
        repetition,
        nodes: Vec::new(),
        // `--strict`: a trajectory that could not run is a failure, with the reason kept.
        status: if shared.strict {
            TrajectoryStatus::Failed
        } else {
            TrajectoryStatus::Skipped
        },
        turns: 0,
        duration_ms: 0.0,
        fault: None,
        skip_reason: Some(reason.to_string()),
        criteria: Vec::new(),
        tags: scenario.tags.clone(),
        agent_branches: Vec::new(),
        awaiting_human: None,
        sandbox_state: None,
        captures: Default::default(),
        llm: None,
        attack: None,
    };
    shared.record(record).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(status: CriterionStatus) -> CriterionRecord {
        CriterionRecord {
            turn_index: None,
            criterion: "c".into(),
            kind: "reply".into(),
            status,
            detail: None,
            judge: None,
        }
    }

    #[test]
    fn a_check_a_stop_left_unjudged_leaves_the_trajectory_without_a_verdict() {
        let check = |status, detail: &str| CriterionRecord {
            turn_index: None,
            criterion: "judge \"x\"".into(),
            kind: "judge".into(),
            status,
            detail: Some(detail.into()),
            judge: None,
        };
        let passed = check(CriterionStatus::Passed, "score 1.00");
        for cut in [
            crate::record::CUT_BY_STOP.to_owned(),
            crate::record::CUT_MID_WALK.to_owned(),
            "not checked: not sent: --max-llm-calls 10 reached (10 calls sent)".to_owned(),
        ] {
            let criteria = [passed.clone(), check(CriterionStatus::Skipped, &cut)];
            let (status, why) = status_of(false, &criteria, false);
            assert_eq!(status, TrajectoryStatus::Skipped, "{cut}");
            assert!(why.is_some_and(|w| w.contains("--resume")));
        }
        // A failure is a verdict, stop or not.
        let criteria = [
            check(CriterionStatus::Failed, "no"),
            check(CriterionStatus::Skipped, crate::record::CUT_BY_STOP),
        ];
        assert_eq!(
            status_of(false, &criteria, false).0,
            TrajectoryStatus::Failed
        );
        // A check skipped for another reason (no judge configured) does not.
        let criteria = [
            passed,
            check(CriterionStatus::Skipped, "no judge is configured"),
        ];
        assert_eq!(
            status_of(false, &criteria, false).0,
            TrajectoryStatus::Passed
        );
    }

    #[test]
    fn a_check_failed_before_the_simulated_user_broke_character_is_the_agents_failure() {
        let at = |kind: &str, status, turn: Option<u32>| CriterionRecord {
            turn_index: turn,
            kind: kind.into(),
            status,
            ..check(status)
        };
        let broken_at_2 = at(FIDELITY_KIND, CriterionStatus::Failed, Some(2));
        // A scripted turn 0 failed its `expect`: failed.
        let criteria = [
            at("reply", CriterionStatus::Failed, Some(0)),
            broken_at_2.clone(),
        ];
        assert_eq!(
            status_of(false, &criteria, false).0,
            TrajectoryStatus::Failed
        );
        // Its judge failed on a scripted turn 0: an error, not hidden in an invalid one.
        let criteria = [
            at("judge", CriterionStatus::Error, Some(0)),
            broken_at_2.clone(),
        ];
        assert_eq!(
            status_of(false, &criteria, false).0,
            TrajectoryStatus::Error
        );
        // Failed only at or after the break, or passed before it: invalid.
        for criteria in [
            [
                at("reply", CriterionStatus::Failed, Some(2)),
                broken_at_2.clone(),
            ],
            [
                at("reply", CriterionStatus::Passed, Some(0)),
                broken_at_2.clone(),
            ],
            [
                at("reply", CriterionStatus::Failed, Some(0)),
                at(FIDELITY_KIND, CriterionStatus::Failed, None),
            ],
        ] {
            assert_eq!(
                status_of(false, &criteria, false).0,
                TrajectoryStatus::Invalid,
                "{criteria:?}"
            );
        }
    }

    #[test]
    fn nothing_passes_that_was_not_checked() {
        use CriterionStatus::*;
        let only_skipped = [check(Skipped), check(Skipped)];
        assert_eq!(
            status_of(false, &only_skipped, false).0,
            TrajectoryStatus::Skipped
        );
        assert_eq!(
            status_of(false, &only_skipped, true).0,
            TrajectoryStatus::Failed
        );
        let mixed = [check(Passed), check(Skipped)];
        assert_eq!(status_of(false, &mixed, false).0, TrajectoryStatus::Passed);
        assert_eq!(status_of(false, &mixed, true).0, TrajectoryStatus::Failed);
        // No check at all: nothing was checked, so nothing passed.
        assert_eq!(
            status_of(false, &[], false),
            (TrajectoryStatus::Skipped, Some(NO_CHECKS.to_string()))
        );
        assert_eq!(status_of(false, &[], true).0, TrajectoryStatus::Failed);
        assert_eq!(status_of(true, &[], false).0, TrajectoryStatus::Error);
        assert_eq!(status_of(true, &mixed, false).0, TrajectoryStatus::Error);
        assert_eq!(
            status_of(false, &[check(Failed)], false).0,
            TrajectoryStatus::Failed
        );
    }

    /// The simulated user's fidelity check not run (an unusable answer) leaves the
    /// trajectory to its other checks, but under --strict it fails it, as any check that
    /// did not run; the fidelity judge missing from a replay-only cache is an error. Both
    /// passed.
    #[test]
    fn a_fidelity_check_not_run_fails_under_strict_and_a_replay_miss_is_an_error() {
        use CriterionStatus::*;
        let fidelity = |status| CriterionRecord {
            kind: FIDELITY_KIND.into(),
            ..check(status)
        };
        let unknown = [check(Passed), fidelity(Skipped)];
        assert_eq!(
            status_of(false, &unknown, false).0,
            TrajectoryStatus::Passed
        );
        assert_eq!(status_of(false, &unknown, true).0, TrajectoryStatus::Failed);
        let missed = [check(Passed), fidelity(Error)];
        assert_eq!(status_of(false, &missed, false).0, TrajectoryStatus::Error);
    }
}
